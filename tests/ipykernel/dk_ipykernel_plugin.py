"""A pytest plugin that points ipykernel's own test modules at distkernel.

Debian's python3-ipykernel ships ipykernel/tests; its test_message_spec,
test_kernel and test_debugger start kernels through jupyter_client's
`manager.start_new_kernel` / `manager.run_kernel`, whose kernel_name defaults to
the Python kernel. This plugin gives them "distkernel" instead (JUPYTER_PATH
must find its kernelspec), and skips, with the reason, the few tests that
check ipykernel's own internals rather than what a kernel does.

    PYTHONPATH=tests/ipykernel python3 -m pytest -p dk_ipykernel_plugin \
        --pyargs ipykernel.tests.test_message_spec ...
"""
import functools
import os

import pytest
from jupyter_client import manager

KERNEL_NAME = os.environ.get("DISTKERNEL_IPYKERNEL_SUITE_KERNEL", "distkernel")

_start_new_kernel = manager.start_new_kernel


@functools.wraps(_start_new_kernel)
def _start_distkernel(*args, **kwargs):
    kwargs.setdefault("kernel_name", KERNEL_NAME)
    return _start_new_kernel(*args, **kwargs)


manager.start_new_kernel = _start_distkernel


def _accept_our_version():
    """test_message_spec checks every kernel_info_reply it sees (in any test,
    when it flushes the channels) against ipykernel's own version number,
    implementation_version >= 2.1. That one field is about ipykernel, not about
    a kernel: every other field is still checked."""
    from ipykernel.tests import test_message_spec
    test_message_spec.KernelInfoReply.implementation_version.min = None


if KERNEL_NAME == "distkernel":
    _accept_our_version()

# Tests about ipykernel itself, not about the behaviour of a Python kernel.
NOT_APPLICABLE = {
    # It starts the kernel with ipykernel's --profile-dir command-line option.
    "test_sys_path_profile_dir": "starts the kernel with ipykernel's --profile-dir argument",
}


def pytest_collection_modifyitems(config, items):
    if KERNEL_NAME != "distkernel":
        return
    for item in items:
        why = NOT_APPLICABLE.get(item.name) or NOT_APPLICABLE.get(item.originalname)
        if why:
            item.add_marker(pytest.mark.skip(reason=f"ipykernel internals: {why}"))
