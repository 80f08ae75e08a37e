"""The settings table (runtime/base/dk_setting_table.c) is the one list of distkernel's
DISTKERNEL_* variables: every name the code reads or sets is in it, every
name in it is in the code, `distkernel config` shows them with this
environment's values, and docs/configuration.md is what
`distkernel config --markdown` writes.
"""
import os
import re
import subprocess

import pytest

import support

ROOT = support.REPO_ROOT
DISTKERNEL = support.PREFIX / "bin" / "distkernel"
SOURCES = ("app", "kernel", "distributed", "runtime", "magics", "protocol", "python")
TABLE = ROOT / "runtime" / "base" / "dk_setting_table.c"
NAME = re.compile(r"DISTKERNEL_[A-Z0-9_]+")

pytestmark = pytest.mark.skipif(not DISTKERNEL.exists(),
                                reason=f"distkernel is not installed in {support.PREFIX}")


def config(*args, env=None):
    return subprocess.run([str(DISTKERNEL), "config", *args], capture_output=True, text=True,
                          timeout=30, env=env)


def names_in_code():
    found = set()
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".c", ".h", ".py") and path != TABLE:
                found |= set(NAME.findall(path.read_text(errors="replace")))
    # "DISTKERNEL_AGENT_" is a prefix the agent strips, not a variable
    return {n for n in found if not n.endswith("_")}


def test_every_name_in_the_code_is_in_the_table_and_every_name_in_the_table_in_the_code():
    table = set(config("--names").stdout.split())
    code = names_in_code()
    assert sorted(code - table) == [], "in the code, not in runtime/base/dk_setting_table.c's table"
    assert sorted(table - code) == [], "in the table, nowhere in the code"


def test_the_configuration_page_is_what_the_table_says():
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert page == config("--markdown").stdout, \
        "docs/configuration.md is stale: distkernel config --markdown > docs/configuration.md"


def test_config_shows_what_you_may_set_with_this_environments_values():
    env = dict(os.environ, DISTKERNEL_MLFLOW_START_TIMEOUT="17")
    env.pop("DISTKERNEL_WARM", None)
    r = config(env=env)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^DISTKERNEL_MLFLOW_START_TIMEOUT +user +17$", r.stdout, re.M), r.stdout
    assert re.search(r"^DISTKERNEL_WARM +user +\(unset\)$", r.stdout, re.M), r.stdout
    # the internal ones only with --all
    assert "DISTKERNEL_BC_KEY" not in r.stdout
    assert "DISTKERNEL_BC_KEY" in config("--all").stdout


def test_a_bad_number_is_one_line_in_the_kernels_log_and_its_default_is_used(
        kernelspec_installed, tmp_path):
    """DISTKERNEL_MAX_MESSAGE_MB (read as the kernel binds its sockets) and
    DISTKERNEL_STALL_EVERY (read by each run) given what they may not be: the kernel serves
    with the defaults, the cell shows nothing of it, and each is one line in
    the kernel's log, once however often it is read."""
    env = support.kernel_env(DISTKERNEL_MAX_MESSAGE_MB="lots", DISTKERNEL_STALL_EVERY="-3")
    log = tmp_path / "kernel-stderr.log"
    with open(log, "w") as err:
        k = support.Kernel.start(env=env, stderr=err)
    try:
        for _ in range(2):
            r = k.execute("%%distributed num_processes=1 tracking=False\nprint('ran')",
                          timeout=120)
            assert r.status == "ok" and "[rank 0] ran" in r.stdout, r.describe()
            assert "DISTKERNEL_" not in r.stderr, r.stderr
    finally:
        k.stop()
    text = log.read_text(errors="replace")
    said = [line for line in text.splitlines() if "which is not" in line]
    assert said == [
        "[distkernel] DISTKERNEL_MAX_MESSAGE_MB is 'lots', which is not a whole number from 1 "
        "to 2047: 256 is used (distkernel config lists the settings)",
        "[distkernel] DISTKERNEL_STALL_EVERY is '-3', which is not a number from 0.1 to 3600: "
        "5 is used (distkernel config lists the settings)"], text
    r = config(env=dict(os.environ, DISTKERNEL_MAX_MESSAGE_MB="lots"))
    assert re.search(r"^DISTKERNEL_MAX_MESSAGE_MB +user +lots +\(not allowed: the default is "
                     r"used\)$", r.stdout, re.M), r.stdout


def test_config_refuses_what_it_does_not_know():
    r = config("--json")
    assert r.returncode == 2
    assert "distkernel config: unknown argument '--json'" in r.stderr
    assert "usage: distkernel config" in r.stderr
