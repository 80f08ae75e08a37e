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
import shutil
import tempfile

import pytest

import users
from slurm_cluster import cluster_sh
from test_slurm_runs import kernel, still_serves  # noqa: F401

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
