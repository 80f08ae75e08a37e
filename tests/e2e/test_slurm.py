"""
`%%distributed` and `@distributed(remote=True)` asking for a Slurm cluster.

A run that asks for Slurm (launcher=slurm, nodes > 1, remote=True) checks that
Slurm is reachable before anything starts, and says what is missing when it is
not: no rank, run folder or Slurm job is made, and the kernel keeps serving. The
options' own errors (an uneven split over the nodes) come before all of it.
`%distributed start` with nodes= is refused, before Slurm is asked. The runs
that do run on a cluster are test_slurm_runs.py's.
"""
import os
import pathlib
import time

import pytest

import support

CELL = "%%distributed nodes=2 num_processes=4\nimport os\nos.environ['RANK']\n"


def start(tmp_path, **env):
    """A kernel whose environment is ours less any Slurm setting, plus ENV; its
    rank logs go under tmp_path/logs, which a started run would fill."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "DISTKERNEL_SLURM_")) and
            k not in ("DISTKERNEL_NODES", "DISTKERNEL_LAUNCHER")}
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    base.update(DISTKERNEL_LOG_DIR=str(logs), MLFLOW_TRACKING_URI="", **env)
    return support.Kernel.start(env=base)


def nothing_started(tmp_path):
    runs = list((tmp_path / "logs").rglob("run-*"))
    assert runs == [], f"a run folder was made: {runs}"


def still_serves(k):
    r = k.execute("1 + 1")
    assert r.status == "ok" and "2" in str(r.of_type("execute_result")), r.describe()


@pytest.fixture
def kernel_without_slurm(tmp_path):
    if os.path.exists("/etc/slurm/slurm.conf"):
        pytest.skip("this machine has a Slurm configuration of its own in /etc/slurm")
    k = start(tmp_path)
    yield k
    k.stop()


def test_nodes_without_slurm_is_a_clear_error_before_anything_starts(kernel_without_slurm,
                                                                     tmp_path):
    r = kernel_without_slurm.execute(CELL)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "RuntimeError"
    evalue = r.content["evalue"]
    assert evalue.startswith("nodes=2 asks for a Slurm cluster, but Slurm is not reachable "
                             "from here: sinfo failed"), evalue
    assert "SLURM_CONF is not set" in evalue and "No rank was started" in evalue, evalue
    nothing_started(tmp_path)
    still_serves(kernel_without_slurm)


def test_remote_true_asks_for_slurm(kernel_without_slurm, tmp_path):
    code = ("from distkernel import distributed\n"
            "@distributed(num_processes=2, remote=True)\n"
            "def f():\n    return 1\n"
            "f.distributed()\n")
    r = kernel_without_slurm.execute(code)
    assert r.status == "error", r.describe()
    assert "launcher=slurm (or remote=True) asks for a Slurm cluster, but Slurm is not " \
           "reachable" in r.content["evalue"], r.content["evalue"]
    assert not r.of_type("stream") or "FutureWarning" not in r.stderr
    nothing_started(tmp_path)
    # remote=False is a local run, as before
    r = kernel_without_slurm.execute(code.replace("remote=True", "remote=False"), timeout=120)
    assert r.status == "ok", r.describe()


def test_missing_slurm_commands_are_named(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    k = start(tmp_path, PATH=str(empty))
    try:
        r = k.execute("%%distributed launcher=slurm num_processes=2\n1\n")
        assert r.status == "error", r.describe()
        evalue = r.content["evalue"]
        assert "its commands sinfo, salloc, srun, squeue, scancel are not on PATH" in evalue, \
            evalue
        nothing_started(tmp_path)
        still_serves(k)
    finally:
        k.stop()


def fake_slurm(tmp_path, sinfo):
    """A folder of Slurm's commands for PATH: sinfo runs SINFO (sh), the others fail."""
    bin_dir = tmp_path / "fake-slurm"
    bin_dir.mkdir()
    for name in ("sinfo", "salloc", "srun", "squeue", "scancel"):
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + (sinfo if name == "sinfo" else "exit 1") + "\n")
        path.chmod(0o755)
    return bin_dir


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cell", ["%%distributed nodes=2 num_processes=2\n1\n",
                                  "%%distributed launcher=slurm num_accelerators=2\n1\n"],
                         ids=["reachable", "gpus"])
def test_an_interrupt_while_sinfo_is_slow_ends_the_cell_and_sinfo_at_once(tmp_path, cell):
    # A slow controller holds sinfo up to its 15 s deadline. For the GPU cell
    # the first question (is Slurm there) is answered and the second (the
    # nodes' GPUs) is the slow one.
    pid_file = tmp_path / "sinfo.pid"
    answered = tmp_path / "answered"
    # Written whole, then renamed: the test reads it as soon as it exists.
    slow = f"echo $$ > {pid_file}.part; mv {pid_file}.part {pid_file}; exec sleep 60"
    body = (f'if [ ! -e {answered} ]; then touch {answered}; echo "sim* up"; exit 0; fi\n{slow}'
            if "num_accelerators" in cell else slow)
    bin_dir = fake_slurm(tmp_path, body)
    k = start(tmp_path, PATH=f"{bin_dir}:{os.environ['PATH']}")
    try:
        msg_id = k.start_execute(cell)
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), "sinfo was not asked"
        pid = int(pid_file.read_text())
        assert support.alive(pid)
        t0 = time.monotonic()
        k.km.interrupt_kernel()
        r = k.finish(msg_id, timeout=30)
        took = time.monotonic() - t0
        assert r.status == "error", r.describe()
        assert r.content["ename"] == "KeyboardInterrupt", r.describe()
        evalue = r.content["evalue"]
        assert "interrupted while asking Slurm" in evalue and "(sinfo)" in evalue, evalue
        assert "No rank was started" in evalue, evalue
        assert took < 5, f"the interrupt took {took:.1f} s"
        assert support.wait_gone([pid], timeout=2) == [], "sinfo was left running"
        nothing_started(tmp_path)
        still_serves(k)
    finally:
        k.stop()


def test_an_uneven_split_over_nodes_is_refused_before_slurm_is_asked(kernel_without_slurm):
    r = kernel_without_slurm.execute("%%distributed nodes=3 num_processes=4\n1\n")
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "ValueError"
    assert "num_processes=4 cannot be split evenly over nodes=3" in r.content["evalue"]


def test_a_world_that_the_distkernel_nodes_default_does_not_split_names_the_variable(tmp_path):
    k = start(tmp_path, DISTKERNEL_NODES="2")
    try:
        r = k.execute("%%distributed num_processes=3\n1\n")
        assert r.status == "error", r.describe()
        assert r.content["ename"] == "ValueError", r.describe()
        evalue = r.content["evalue"]
        assert evalue.startswith("num_processes=3 cannot be split evenly over nodes=2 (the "
                                 "default from DISTKERNEL_NODES=2)"), evalue
        assert "(nodes=1 or nodes=3): give nodes= in the cell (it wins over DISTKERNEL_NODES)," \
               " or change DISTKERNEL_NODES" in evalue, evalue
        nothing_started(tmp_path)
        still_serves(k)
    finally:
        k.stop()


def test_site_defaults_from_the_kernel_environment(tmp_path):
    if os.path.exists("/etc/slurm/slurm.conf"):
        pytest.skip("this machine has a Slurm configuration of its own in /etc/slurm")
    k = start(tmp_path, DISTKERNEL_LAUNCHER="slurm")
    try:
        r = k.execute("%%distributed num_processes=2\n1\n")
        assert r.status == "error" and "asks for a Slurm cluster" in r.content["evalue"], \
            r.describe()
        r = k.execute("%%distributed launcher=local num_processes=2\n1\n", timeout=120)
        assert r.status == "ok", r.describe()
    finally:
        k.stop()
