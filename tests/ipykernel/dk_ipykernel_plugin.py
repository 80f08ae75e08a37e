"""A pytest plugin that points ipykernel's own test modules at distkernel.

ipykernel's test_message_spec, test_kernel and test_debugger start kernels
through jupyter_client's `manager.start_new_kernel` (`manager.run_kernel` calls
it too), whose kernel_name defaults to the Python kernel. This plugin gives them
the kernel DISTKERNEL_IPYKERNEL_SUITE_KERNEL names ("distkernel" unless set;
JUPYTER_PATH must find its kernelspec) instead, and, when that kernel is a
distkernel, skips with the reason the few tests that check ipykernel's own
internals rather than what a kernel does (NOT_APPLICABLE), and those of what
ipykernel 7 does that distkernel does not do yet (NOT_YET). It serves two
suites:

- ipykernel 6.17's, which Debian's python3-ipykernel ships as ipykernel.tests:

    PYTHONPATH=tests/ipykernel python3 -m pytest -p dk_ipykernel_plugin \
        --pyargs ipykernel.tests.test_message_spec ...

- ipykernel 7's, from its source distribution (its wheel ships no tests),
  run in the test venv (scripts/venv.sh) against a distkernel installed for
  that venv (`distkernel install --python VENV/bin/python`), with the sdist's
  own pytest configuration:

    PYTHONPATH=tests/ipykernel DISTKERNEL_IPYKERNEL_SUITE_KERNEL=NAME \
        VENV/bin/python -m pytest -p dk_ipykernel_plugin \
        VENV/src/ipykernel-7.X/tests/test_message_spec.py ...

Naming a kernel that is not a distkernel (python3: ipykernel itself) runs the
suites unchanged, as the reference.
"""
import functools
import importlib
import os

import ipykernel
import pytest
from jupyter_client import manager
from jupyter_client.kernelspec import KernelSpecManager

KERNEL_NAME = os.environ.get("DISTKERNEL_IPYKERNEL_SUITE_KERNEL", "distkernel")
IS_DISTKERNEL = os.path.basename(
    KernelSpecManager().get_kernel_spec(KERNEL_NAME).argv[0]) == "distkernel"

_start_new_kernel = manager.start_new_kernel


@functools.wraps(_start_new_kernel)
def _start_named_kernel(*args, **kwargs):
    kwargs.setdefault("kernel_name", KERNEL_NAME)
    return _start_new_kernel(*args, **kwargs)


manager.start_new_kernel = _start_named_kernel


def _accept_our_version(module):
    """test_message_spec checks every kernel_info_reply it sees (in any test,
    when it flushes the channels) against ipykernel's own version number,
    implementation_version >= 2.1. That one field is about ipykernel, not about
    a kernel: every other field is still checked."""
    module.KernelInfoReply.implementation_version.min = None


# Tests about ipykernel itself, not about the behaviour of a Python kernel.
NOT_APPLICABLE = {
    "test_sys_path_profile_dir": "starts the kernel with ipykernel's --profile-dir argument",
    # Its first part, get_parent('shell'), is distkernel's too (tests/e2e/test_output_parents.py).
    "test_parent_header_and_ident":
        "reads Kernel._parent_ident, the ZeroMQ identities of ipykernel's last requests",
    "test_sequential_control_messages":
        "runs execute_request on the control channel, which the message spec does not define",
}

# What ipykernel 7 does and distkernel does not yet: behaviour a user can meet,
# kept visible here until the kernel has it. For 7's suite only (6.17's has a
# test_kernel_info_request of its own, which distkernel passes).
NOT_YET = {
    "test_kernel_info_request": "kernel subshells (JEP 91), which kernel_info must list",
    "test_subshell": "kernel subshells (JEP 91): create/list/delete_subshell_request",
    "test_async_cell_waiting_for_comm_reply":
        "a comm message is handled only between cells, not while an async cell awaits",
    "test_print_to_correct_cell_from_asyncio":
        "an asyncio task a cell starts runs only while a cell runs, not between cells",
}


def pytest_collection_modifyitems(config, items):
    if not IS_DISTKERNEL:
        return
    # ipykernel.tests.test_message_spec (6.17) or tests.test_message_spec (7's
    # sdist): the one beside the collected modules, which their helpers use.
    packages = {item.module.__name__.rpartition(".")[0] for item in items}
    for package in packages:
        _accept_our_version(importlib.import_module(f"{package}.test_message_spec"))
    tables = [(NOT_APPLICABLE, "ipykernel internals")]
    if ipykernel.version_info[0] >= 7:
        tables.append((NOT_YET, "not in distkernel yet"))
    for item in items:
        for table, prefix in tables:
            why = table.get(item.name) or table.get(item.originalname)
            if why:
                item.add_marker(pytest.mark.skip(reason=f"{prefix}: {why}"))
