"""
A rank on another node runs and imports only from folders its node's other
users cannot change (issue 21, item 3), on the simulated Slurm cluster
(tests/slurm/, 2 nodes).

The nodes share this host's filesystem (each is a mount namespace that is a
slave of the host's). A folder private to node2 is a tmpfs mounted inside
node2's namespace only, 1777 as a node-local /tmp is: there the second user
of tests/e2e/users.py (dkattacker) makes the kernel's folder and a sys.path
entry of the kernel before the victim's run, with a torch.py and a
colorsys.py in them, as another user with a job on that node can (the
kernel's folder is in `squeue -o %Z`). On the kernel's host and on node1 the
same paths are the kernel user's own.
"""
import glob
import os
import pathlib
import re
import shutil
import tempfile

import pytest

import users
from slurm_cluster import cluster_sh
from test_slurm_runs import kernel, start, still_serves, wait_clean  # noqa: F401

PLANTED = "print('PLANTED', __name__, 'ran as uid', __import__('os').getuid(), flush=True)\n"

CELL = ("%%distributed num_processes=2 nodes=2 tracking=False\n"
        "import os, socket, torch, colorsys\n"
        "print('node', socket.gethostname(), 'cwd', os.getcwd(), 'torch', torch.__file__,\n"
        "      'colorsys', colorsys.__file__, flush=True)\n")


@pytest.fixture
def planted_on_node2(slurm_cluster):
    """(scratch, its `proj` and `lib`): the kernel user's on this host and on
    node1; on node2 a node-private tmpfs where dkattacker made both, with a
    torch.py and a colorsys.py."""
    _, attacker = users.pair()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="dk-folders-", dir="/tmp"))
    (scratch / "proj").mkdir(mode=0o700)
    (scratch / "lib").mkdir(mode=0o700)
    env = slurm_cluster.sh_env
    cluster_sh("exec", "node2", "mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs",
               str(scratch), env=env)
    try:
        cluster_sh("exec", "node2", "setpriv", f"--reuid={attacker.uid}",
                   f"--regid={attacker.gid}", "--clear-groups", "sh", "-c",
                   'mkdir -m 755 "$1/proj" "$1/lib" && printf "%s" "$2" > "$1/proj/torch.py" '
                   '&& printf "%s" "$2" > "$1/lib/colorsys.py"', "plant", str(scratch), PLANTED,
                   env=env)
        yield scratch
    finally:
        cluster_sh("exec", "node2", "umount", str(scratch), env=env)
        shutil.rmtree(scratch)


def rank_log(tmp_path, rank):
    logs = sorted(glob.glob(str(tmp_path / "logs" / "kernel-*" / "run-*" / f"rank-{rank}.log")),
                  key=os.path.getmtime)
    assert logs, f"no rank-{rank}.log under {tmp_path / 'logs'}"
    return pathlib.Path(logs[-1]).read_text(errors="replace")


@pytest.mark.timeout(300)
def test_a_rank_does_not_run_or_import_from_folders_another_user_made_on_its_node(
        kernel, planted_on_node2, tmp_path):
    proj, lib = planted_on_node2 / "proj", planted_on_node2 / "lib"
    r = kernel.execute(f"import os, sys\n_was = os.getcwd()\nos.chdir({str(proj)!r})\n"
                       f"sys.path.insert(0, {str(lib)!r})")
    assert r.status == "ok", r.describe()
    try:
        r = kernel.execute(CELL, timeout=240)
    finally:
        kernel.execute(f"os.chdir(_was)\nsys.path.remove({str(lib)!r})")
    assert r.status == "ok", r.describe()
    out = r.stdout + r.stderr
    assert "PLANTED" not in out, r.describe()
    lines = {line.split()[3]: line for line in r.stdout.splitlines() if " node node" in line}
    assert sorted(lines) == ["node1", "node2"], r.describe()
    # node1 has the kernel's folder as the kernel has it; node2 runs in the home
    assert f"cwd {proj} " in lines["node1"], lines
    assert f"cwd {os.path.expanduser('~')} " in lines["node2"], lines
    assert f"colorsys {lib}" not in lines["node2"] and "torch /usr/" in lines["node2"], lines
    # why, in rank 1's log only: one line per refused folder, and where it went
    log = rank_log(tmp_path, 1)
    why = [line for line in log.splitlines() if line.startswith("distkernel-rank on node2:")]
    assert any(f"refusing to use {proj} for code: it belongs to another user" in line
               for line in why), log
    assert any(f"refusing to use {lib} for code: it belongs to another user" in line
               for line in why), log
    assert any(f"running in {os.path.expanduser('~')}, not in the kernel's folder {proj}"
               in line for line in why), log
    assert len(why) == 3, log
    assert "refusing" not in out, r.describe()
    assert "refusing" not in rank_log(tmp_path, 0)
    still_serves(kernel)


# Issue 38, item 1: the kernel's PYTHONPATH, checked on another node before
# Python starts there (runtime/rank/dk_rankpyenv.h), in the template that
# forks a warm rank as in a cold rank. On node2, dkattacker made the folder
# PYTHONPATH names, with a sitecustomize.py (which Python runs as it starts,
# before any check of sys.path in distkernel._rankpath) and the module the cell
# imports. What they would run leaves a file in the node's tmpfs, so that a
# template's start, whose output no cell shows, is seen too.
PLANTED_SITE = ("import os\n"
                "open(os.path.join({scratch!r}, f'ran-{{os.getuid()}}-{{os.getpid()}}'), 'w')"
                ".close()\n" + PLANTED)
PROBE_OWN = "WHERE = __file__\n"
PROBE_PLANTED = PLANTED + "WHERE = 'PLANTED'\n"

PP_CELL = ("%%distributed num_processes=2 nodes=2 tracking=False{opts}\n"
           "import os, socket, sys\n"
           "try:\n"
           "    import dkpp_probe\n"
           "    PROBE = dkpp_probe.WHERE\n"
           "except ImportError:\n"
           "    PROBE = None\n"
           "with open(f'/proc/{{os.getppid()}}/comm') as f:\n"
           "    PARENT = f.read().strip()\n"
           "print('node', socket.gethostname(), 'on_path', {folder!r} in sys.path,\n"
           "      'probe', PROBE, 'parent', PARENT, flush=True)\n")

RANK_LINE = re.compile(r"^\[rank (\d)\] node (\S+) on_path (\S+) probe (\S+) parent (.+)$", re.M)


@pytest.fixture
def private_on_node2(slurm_cluster):
    """A scratch folder of the kernel user's (0700) on this host and node1; on
    node2 a node-private tmpfs (1777) in its place, where dkattacker makes
    what the test asks for (attacker_does)."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="dk-folders-", dir="/tmp"))
    env = slurm_cluster.sh_env
    cluster_sh("exec", "node2", "mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs",
               str(scratch), env=env)
    try:
        yield scratch
    finally:
        cluster_sh("exec", "node2", "umount", str(scratch), env=env)
        shutil.rmtree(scratch)


def attacker_does(cluster, script, *args):
    """sh -c SCRIPT ARGS on node2, as dkattacker."""
    _, attacker = users.pair()
    return cluster_sh("exec", "node2", "setpriv", f"--reuid={attacker.uid}",
                      f"--regid={attacker.gid}", "--clear-groups", "sh", "-c", script, "sh",
                      *args, env=cluster.sh_env)


def on_node2(cluster, *argv):
    return cluster_sh("exec", "node2", *argv, env=cluster.sh_env)


def all_logs(tmp_path):
    """Every log of the kernel's runs under tmp_path/logs, as one text."""
    return "".join(p.read_text(errors="replace")
                   for p in sorted((tmp_path / "logs").rglob("*")) if p.is_file())


def stop_clean(k, cluster):
    """Stop K as test_slurm_runs' `kernel` fixture does."""
    k.stop()
    assert wait_clean(cluster) == [], "left behind after the test"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["warm", "cold"])
def test_a_pythonpath_folder_another_user_made_on_a_node_is_not_imported_from(
        slurm_cluster, private_on_node2, tmp_path, how):
    scratch = private_on_node2
    folder = scratch / "pp"
    folder.mkdir(mode=0o700)
    (folder / "dkpp_probe.py").write_text(PROBE_OWN)
    attacker_does(slurm_cluster,
                  'mkdir -m 755 "$1" && printf "%s" "$2" > "$1/sitecustomize.py" '
                  '&& printf "%s" "$3" > "$1/dkpp_probe.py"',
                  str(folder), PLANTED_SITE.format(scratch=str(scratch)), PROBE_PLANTED)
    planted = on_node2(slurm_cluster, "ls", "-A", str(folder)).split()
    assert sorted(planted) == ["dkpp_probe.py", "sitecustomize.py"], planted
    k = start(tmp_path, slurm_cluster, PYTHONPATH=str(folder))
    try:
        opts = " warm=False" if how == "cold" else ""
        r = k.execute(PP_CELL.format(opts=opts, folder=str(folder)), timeout=240)
        assert r.status == "ok", r.describe()
        out = r.stdout + r.stderr
        assert "PLANTED" not in out, r.describe()
        # Nothing ran from it on node2, in a rank or in the template that
        # forks them: the planted sitecustomize left no file in the tmpfs.
        ran = on_node2(slurm_cluster, "ls", "-A", str(scratch)).split()
        assert ran == ["pp"], ran
        ranks = {int(m.group(1)): m.groups()[1:] for m in RANK_LINE.finditer(r.stdout)}
        assert sorted(ranks) == [0, 1], r.describe()
        # node1's folder is the kernel user's: on sys.path, and imported from
        assert ranks[0][:3] == ("node1", "True", str(folder / "dkpp_probe.py")), ranks
        # node2's is dkattacker's: left off, nothing imported from it
        assert ranks[1][:3] == ("node2", "False", "None"), ranks
        if how == "cold":
            assert ranks[1][3] != "distkernel-tmpl", ranks
        elif os.environ.get("DISTKERNEL_WARM") != "0":   # DISTKERNEL_E2E_COLD: all cold
            assert ranks[1][3] == "distkernel-tmpl", ranks
        # why, in rank 1's log only, once
        log = rank_log(tmp_path, 1)
        about = [line for line in log.splitlines() if str(folder) in line]
        assert len(about) == 1, log
        assert about[0].startswith("distkernel-rank on node2: left off PYTHONPATH: "), log
        assert f"refusing to use {folder} for code: it belongs to another user" in about[0], log
        assert "PLANTED" not in log, log
        log0 = rank_log(tmp_path, 0)
        assert "PLANTED" not in log0 and "refusing" not in log0, log0
        assert "PLANTED" not in all_logs(tmp_path)
        assert "refusing" not in out, r.describe()
        still_serves(k)
    finally:
        stop_clean(k, slurm_cluster)
    # Still nothing ran from it, and nothing was compiled into it (__pycache__).
    assert on_node2(slurm_cluster, "ls", "-A", str(scratch)).split() == ["pp"]
    assert sorted(on_node2(slurm_cluster, "ls", "-A", str(folder)).split()) == planted


# Issue 38, item 3: a TMPDIR that dkattacker made on node2 (1777, as a
# node-local /tmp is, but theirs) is refused for the agent's socket folders,
# which go to a fresh private folder under /tmp instead: the node's ranks run.
# Before, node2's agent had no socket folder: rank 1 there "exited with code
# 1 (warm; 2 cold) during start-up", and the cell failed.
TMP_CELL = ("%%distributed num_processes=2 nodes=2 tracking=False{opts}\n"
            "import os, socket\n"
            "print('node', socket.gethostname(), 'tmpdir', os.environ.get('TMPDIR'),\n"
            "      flush=True)\n")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("how", ["warm", "cold"])
def test_a_tmpdir_another_user_made_on_a_node_does_not_stop_its_ranks(
        slurm_cluster, private_on_node2, tmp_path, how):
    scratch = private_on_node2
    tmpdir = scratch / "tmp"
    tmpdir.mkdir(mode=0o700)
    attacker_does(slurm_cluster, 'mkdir -m 1777 "$1"', str(tmpdir))
    assert on_node2(slurm_cluster, "ls", "-A", str(tmpdir)) == ""
    k = start(tmp_path, slurm_cluster, TMPDIR=str(tmpdir))
    try:
        opts = " warm=False" if how == "cold" else ""
        r = k.execute(TMP_CELL.format(opts=opts), timeout=240)
        assert r.status == "ok", r.describe()
        # both ranks ran, with the kernel's TMPDIR (dkattacker's, on node2)
        assert f"[rank 0] node node1 tmpdir {tmpdir}\n" in r.stdout, r.describe()
        assert f"[rank 1] node node2 tmpdir {tmpdir}\n" in r.stdout, r.describe()
        assert "ended by distkernel" not in r.stdout + r.stderr, r.describe()
        still_serves(k)
    finally:
        stop_clean(k, slurm_cluster)
    # The victim made nothing in dkattacker's TMPDIR on node2.
    assert on_node2(slurm_cluster, "ls", "-A", str(tmpdir)) == ""
