"""
What a run on the simulated Slurm cluster shows in the cell is what a local
run shows: srun's and slurmstepd's own lines ("srun: error: node2: task 0:
Exited with exit code 1", "slurmstepd-node1: error: couldn't chdir to ...")
go to the rank's log, never to the cell; a rank's own output from before its
channel is up (a traceback at start-up) still reaches the cell; a rank that
dies without an error of its own gets srun's telling line as the reason; and
a rank runs in the kernel's folder where its node has it, elsewhere without
a word where it does not (no shared filesystem is assumed). srun's lines are
about the node agents, and go to agents.log in the run's log folder.
"""
import sys

import pytest

import support

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
from test_slurm_runs import kernel, start, wait_clean  # noqa: E402,F401 - the fixture

LAUNCHER_PREFIXES = ("srun:", "slurmstepd")


def launcher_lines(text):
    """The lines of TEXT (labels removed) that srun or slurmstepd wrote."""
    lines = [line.split("] ", 1)[1] if line.startswith("[rank ") else line
             for line in text.splitlines()]
    return [line for line in lines if line.startswith(LAUNCHER_PREFIXES)]


def cell_text(r):
    """Everything the cell showed: its streams, and its error's words."""
    return r.stdout + r.stderr + "\n".join(r.content.get("traceback", []))


def logs(r):
    """{rank: text of rank-N.log} of the run of R."""
    folder = support.log_dir(r)
    assert folder, r.describe()
    return {int(p.name[5:-4]): p.read_text(errors="replace") for p in folder.glob("rank-*.log")}


@pytest.mark.timeout(300)
def test_a_killed_rank_shows_no_launcher_line_and_its_agent_says_how_it_ended(kernel):
    code = ("%%distributed num_processes=4 nodes=2\n"
            "import os, signal, time\n"
            "print('READY', flush=True)\n"
            "if os.environ['RANK'] == '3':\n"
            "    time.sleep(1)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(120)\n")
    r = kernel.execute(code, timeout=240)
    assert r.status == "error", r.describe()
    assert launcher_lines(r.stdout + r.stderr) == [], r.describe()
    # Its node agent is its parent and sees the signal, as a local run does;
    # srun's lines, about the agents, go to agents.log only.
    assert r.content["ename"] == "RankKilled", r.describe()
    assert r.content["evalue"] == ("rank 3: killed by signal 9 (SIGKILL), often the "
                                   "out-of-memory killer (see dmesg)"), r.describe()
    text = logs(r)
    assert all(launcher_lines(text[rank]) == [] for rank in range(4)), text
    for rank in (0, 1, 2):
        assert "READY\n" in text[rank], text


@pytest.mark.timeout(300)
def test_an_interrupted_cell_shows_no_launcher_line(kernel, slurm_cluster):
    code = ("%%distributed num_processes=4 nodes=2\n"
            "import time\nprint('READY', flush=True)\ntime.sleep(300)\n")
    msg_id = kernel.start_execute(code)
    kernel.wait_iopub(lambda m: m["msg_type"] == "stream" and
                      m["parent_header"].get("msg_id") == msg_id and
                      "[rank 3] READY" in m["content"]["text"], timeout=180)
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=60)
    assert r.status == "error" and r.content["ename"] == "KeyboardInterrupt", r.describe()
    assert launcher_lines(cell_text(r)) == [], r.describe()
    text = logs(r)
    # srun's lines are the agents', in agents.log
    assert all(launcher_lines(text[rank]) == [] for rank in range(4)), text
    assert wait_clean(slurm_cluster) == []


SITECUSTOMIZE = """\
import os, sys
node = os.environ.get("SLURMD_NODENAME")
if node and os.environ.get("RANK") == "1":
    # before the rank's channel is up: this goes out on srun's stderr
    try:
        raise RuntimeError("broken start on " + node)
    except RuntimeError:
        import traceback
        traceback.print_exc()
    print("starting anyway", file=sys.stderr, flush=True)
"""


@pytest.mark.timeout(300)
def test_a_kernel_folder_missing_on_the_nodes_gives_no_chdir_line_and_a_home(slurm_cluster,
                                                                            tmp_path):
    # The kernel runs in a mount namespace of its own, where its folder is on
    # a tmpfs: the nodes do not have it. A sitecustomize (on PYTHONPATH, which
    # the nodes share) prints a traceback in rank 1 before its channel is up:
    # that is the rank's own output, and reaches the cell. warm=False: a warm
    # rank is forked from its node's template and runs no sitecustomize of
    # its own (the template ran it once, before any rank existed).
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = f"mount -t tmpfs tmpfs {mnt} && mkdir {mnt}/nb && cd {mnt}/nb && exec \"$@\""
    k = start(tmp_path, slurm_cluster, PYTHONPATH=str(site),
              wrap=["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"])
    try:
        r = k.execute("%%distributed num_processes=2 nodes=2 warm=False\n"
                      "import os, sys\n"
                      "(os.getcwd() == os.path.expanduser('~'), '' in sys.path)\n", timeout=240)
        assert r.status == "ok", r.describe()
        assert r.result == "rank 0: (True, False)\nrank 1: (True, False)", r.describe()
        assert launcher_lines(cell_text(r)) == [], r.describe()
        assert "chdir" not in cell_text(r) + "".join(logs(r).values()), r.describe()
        lines = support.rank_lines(r.stderr)
        assert "Traceback (most recent call last):" in lines.get(1, []), r.describe()
        assert "RuntimeError: broken start on node2" in lines[1], r.describe()
        assert "starting anyway" in lines[1], r.describe()
        still = k.execute("1 + 1")
        assert still.status == "ok", still.describe()
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(300)
def test_a_rank_runs_in_the_kernels_folder_where_its_node_has_it(slurm_cluster, tmp_path):
    # tmp_path is on the filesystem the simulated nodes share
    folder = tmp_path / "nb"
    folder.mkdir()
    (folder / "data.txt").write_text("shared data\n")
    k = start(tmp_path, slurm_cluster)
    try:
        r = k.execute(f"import os\nos.chdir({str(folder)!r})\n")
        assert r.status == "ok", r.describe()
        r = k.execute("%%distributed num_processes=2 nodes=2\n"
                      f"import os\n(os.getcwd() == {str(folder)!r}, open('data.txt').read())\n",
                      timeout=240)
        assert r.status == "ok", r.describe()
        want = repr((True, "shared data\n"))
        assert r.result == f"rank 0: {want}\nrank 1: {want}", r.describe()
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []
