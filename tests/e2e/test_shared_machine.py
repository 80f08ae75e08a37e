"""
Safe on a shared machine (issue 11, findings 1, 2 and 4): what a distkernel kernel
writes can be neither read nor redirected by another user of the same /tmp, and
does not fill the disk.

The attacks run as `dkattacker` beside a kernel of `dkvictim` (tests/e2e/users.py;
root is needed to create them, so these tests are skipped otherwise):
  - a log root made in advance, 0777, under the name the kernel used to pick in /tmp;
  - DISTKERNEL_LOG_DIR pointing at a directory someone else can write: refused;
  - the kernel's folder a symlink the attacker planted, and the run folder swapped
    for one whose rank-0.log is a symlink to the victim's ~/.bashrc, as it appears;
  - old-looking run folders that are symlinks into the victim's files, for pruning;
  - the MLflow server's log name in /tmp, planted as a symlink to ~/.bashrc.
The disk: a rank's log past log_cap= keeps its head and tail with a marker and the
cell says so; the log root past DISTKERNEL_LOG_ROOT_CAP loses its oldest runs
first, never a running one. These last tests run as the test's own user.
"""
import fcntl
import os
import shutil
import subprocess
import sys
import time

import pytest

import support
import users

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%%distributed is distkernel's")

RUN = 120
CELL = ("%%distributed num_processes=2 tracking=False\n"
        "import os\nprint('secret output of rank', os.environ['RANK'])\n1")
BASHRC = "# the victim's own shell setup\nexport PS1='$ '\n"


@pytest.fixture
def pair():
    victim, attacker = users.pair()
    shutil.rmtree(f"/tmp/distkernel-logs-{victim.uid}", ignore_errors=True)
    # The victim's state folder from earlier runs: each test starts from none.
    shutil.rmtree(victim.home / ".local" / "state" / "distkernel", ignore_errors=True)
    rc = victim.home / ".bashrc"
    rc.write_text(BASHRC)
    os.chown(rc, victim.uid, victim.gid)
    rc.chmod(0o644)
    yield victim, attacker
    shutil.rmtree(f"/tmp/distkernel-logs-{victim.uid}", ignore_errors=True)


def as_attacker(attacker, script):
    """Run shell SCRIPT as the attacker; it must succeed (the attack is possible)."""
    r = users.run_as(attacker, ["sh", "-ec", script])
    assert r.returncode == 0, f"the attacker's setup failed: {r.stderr}"


def bashrc_intact(victim):
    return (victim.home / ".bashrc").read_text() == BASHRC


def run_cell(k, code=CELL):
    r = k.execute(code, timeout=RUN)
    return r


# -- finding 1: the log root -------------------------------------------------------

def test_a_log_root_another_user_made_in_tmp_is_not_used(pair):
    victim, attacker = pair
    shared = f"/tmp/distkernel-logs-{victim.uid}"
    as_attacker(attacker, f"mkdir -m 0777 {shared}; chmod 0777 {shared}")
    k = users.start_kernel(victim)
    try:
        r = run_cell(k)
        assert r.status == "ok", r.describe()
        logs = support.log_dir(r)
    finally:
        users.stop_kernel(k)
    assert logs is not None, r.describe()
    assert not str(logs).startswith(shared), f"the rank logs went to {logs}"
    assert str(logs).startswith(str(victim.home / ".local" / "state" / "distkernel" / "logs")), logs
    assert (logs / "rank-0.log").read_text().startswith("secret output of rank 0")
    assert os.listdir(shared) == [], "the kernel wrote into a directory of another user"
    assert users.run_as(attacker, ["cat", str(logs / "rank-0.log")]).returncode != 0
    assert users.run_as(attacker, ["ls", str(logs)]).returncode != 0


def test_a_log_dir_others_can_write_is_refused_naming_DISTKERNEL_LOG_DIR(pair):
    victim, attacker = pair
    shared = f"/tmp/distkernel-logs-{victim.uid}"
    as_attacker(attacker, f"mkdir -m 0777 {shared}; chmod 0777 {shared}")
    k = users.start_kernel(victim, env={"DISTKERNEL_LOG_DIR": shared})
    try:
        r = run_cell(k)
        assert r.status == "error", r.describe()
        text = r.content["evalue"]
        assert "DISTKERNEL_LOG_DIR" in text and shared in text, text
        assert "secret output" not in r.stdout, "a rank ran"
        # The kernel keeps serving, and a safe directory works.
        ok = k.execute("import os; os.environ['DISTKERNEL_LOG_DIR'] = "
                       f"{str(victim.home / 'mylogs')!r}")
        assert ok.status == "ok", ok.describe()
        r2 = run_cell(k)
        assert r2.status == "ok", r2.describe()
        assert str(support.log_dir(r2)).startswith(str(victim.home / "mylogs")), r2.describe()
    finally:
        users.stop_kernel(k)
    assert os.listdir(shared) == []


def test_a_planted_kernel_folder_symlink_and_a_swapped_run_folder_redirect_nothing(pair):
    """The attacker knows the kernel's pid once it runs: it plants kernel-PID in the
    predictable root as a symlink to a folder of its own, and swaps every run folder
    that appears there for one whose rank logs are symlinks to the victim's ~/.bashrc
    (inotify, so it acts within microseconds of the mkdir)."""
    victim, attacker = pair
    shared = f"/tmp/distkernel-logs-{victim.uid}"
    trap = "/tmp/dk-attacker-trap"
    shutil.rmtree(trap, ignore_errors=True)
    as_attacker(attacker, f"mkdir -m 0777 {shared} {trap}; chmod 0777 {shared} {trap}")
    k = users.start_kernel(victim)
    swapper = None
    try:
        as_attacker(attacker, f"ln -s {trap} {shared}/kernel-{k.pid}")
        swapper = users.popen_as(attacker, [sys.executable, "-c", SWAPPER, trap,
                                            str(victim.home / ".bashrc")],
                                 stdout=subprocess.PIPE, text=True)
        assert swapper.stdout.readline().strip() == "watching"
        dirs = []
        for _ in range(5):
            r = run_cell(k)
            dirs.append(support.log_dir(r))
    finally:
        if swapper:
            swapper.kill()
            swapper.wait()
        users.stop_kernel(k)
        shutil.rmtree(trap, ignore_errors=True)
    assert bashrc_intact(victim), (victim.home / ".bashrc").read_text()[:300]
    assert not [d for d in dirs if str(d).startswith(shared)], dirs


# Runs as the attacker: every folder created in ARGV[1] is renamed away at once and
# replaced by one whose rank-0.log and rank-1.log are symlinks to ARGV[2].
SWAPPER = r"""
import ctypes, os, struct, sys
trap, target = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
libc.inotify_add_watch(fd, trap.encode(), 0x100 | 0x40000000)   # IN_CREATE | IN_ONLYDIR
print("watching", flush=True)
n = 0
while True:
    buf = os.read(fd, 65536)
    i = 0
    while i < len(buf):
        wd, mask, cookie, size = struct.unpack_from("iIII", buf, i)
        name = buf[i + 16:i + 16 + size].rstrip(b"\0").decode()
        i += 16 + size
        path = os.path.join(trap, name)
        try:
            os.rename(path, os.path.join(trap, f".moved-{n}"))
            n += 1
            os.mkdir(path, 0o777)
            for r in range(2):
                os.symlink(target, os.path.join(path, f"rank-{r}.log"))
        except OSError:
            pass
"""


def test_pruning_never_follows_a_planted_symlink(pair):
    """Old-looking folders of exited kernels in the predictable root, whose runs are
    symlinks into a folder of the victim's holding rank-* files."""
    victim, attacker = pair
    shared = f"/tmp/distkernel-logs-{victim.uid}"
    keep = victim.home / "experiments"
    r = users.run_as(victim, ["sh", "-ec", f"mkdir -p {keep}; echo mine > {keep}/rank-0.log; "
                                           f"echo mine > {keep}/rank-notes.txt"])
    assert r.returncode == 0, r.stderr
    plant = [f"mkdir -m 0777 {shared}", f"chmod 0777 {shared}"]
    for i in range(12):
        d = f"{shared}/kernel-{4190000 + i}"
        plant += [f"mkdir {d}", f"ln -s {keep} {d}/run-0001-x", f"touch -d '3 days ago' {d}"]
    as_attacker(attacker, "; ".join(plant))
    k = users.start_kernel(victim)
    try:
        r = run_cell(k)
        assert r.status == "ok", r.describe()
    finally:
        users.stop_kernel(k)
    assert sorted(os.listdir(keep)) == ["rank-0.log", "rank-notes.txt"], os.listdir(keep)


# -- finding 2: the MLflow server's log --------------------------------------------

FAKE_MLFLOW = """\
#!/usr/bin/python3
import argparse, os, subprocess, sys
ap = argparse.ArgumentParser()
ap.add_argument("command")
ap.add_argument("--backend-store-uri", required=True)
ap.add_argument("--host", required=True)
ap.add_argument("--port", type=int, required=True)
ap.add_argument("--workers")
a = ap.parse_args()
print("mlflow stand-in listening on", a.port, flush=True)
sys.exit(subprocess.call(["/usr/bin/python3", {server!r}, "--port", str(a.port)],
                         stdout=subprocess.DEVNULL))
"""


def test_the_mlflow_server_log_cannot_be_redirected(pair):
    victim, attacker = pair
    bin_dir = users.private_dir(victim, prefix="dk-bin-")
    server = support.REPO_ROOT / "tests" / "mlflow_server.py"
    (bin_dir / "mlflow").write_text(FAKE_MLFLOW.format(server=str(server)))
    (bin_dir / "mlflow").chmod(0o755)
    os.chown(bin_dir / "mlflow", victim.uid, victim.gid)
    if users.run_as(victim, ["test", "-r", str(server)]).returncode:
        pytest.skip(f"{victim.name} cannot read {server}")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    for name in [n for n in os.environ if n.startswith("MLFLOW_")]:
        env[name] = None
    k = users.start_kernel(victim, env=env)
    planted = "/nonexistent"
    try:
        # The name the kernel used to give its server's log, planted before the
        # first tracked run starts the server.
        pid = k.pid
        planted = f"/tmp/distkernel-mlflow-{pid}.log"
        as_attacker(attacker, f"rm -f {planted}; ln -s {victim.home}/.bashrc {planted}")
        r = run_cell(k, CELL.replace(" tracking=False", ""))
        assert bashrc_intact(victim), (victim.home / ".bashrc").read_text()[:300]
        assert r.status == "ok", r.describe()
        assert "MLflow tracking is off" not in r.stderr, r.describe()
        log = victim.home / ".local/state/distkernel/logs" / f"kernel-{pid}" / "mlflow-server.log"
        assert "mlflow stand-in listening" in log.read_text(), "the server's log is elsewhere"
        assert log.stat().st_mode & 0o077 == 0 and log.stat().st_uid == victim.uid
    finally:
        users.stop_kernel(k)
        subprocess.run(["rm", "-f", planted])
        shutil.rmtree(bin_dir, ignore_errors=True)
    assert bashrc_intact(victim), (victim.home / ".bashrc").read_text()[:300]


# -- finding 4: bounds on disk -----------------------------------------------------

LOUD = ("%%distributed num_processes=1 tracking=False {opts}\n"
        "import sys\n"
        "line = 'x' * 90\n"
        "for i in range({lines}):\n"
        "    sys.stdout.write(f'line {{i:07d}} {{line}}\\n')\n"
        "sys.stdout.flush()\n"
        "print('the end')\n"
        "1")


def check_capped(r, cap, lines):
    assert r.status == "ok", r.describe()
    log = support.log_dir(r) / "rank-0.log"
    text = log.read_text()
    assert len(text) <= cap + 1024, len(text)
    assert text.startswith("line 0000000 "), text[:100]
    head, marker, tail = text.partition("\n[distkernel] ")
    assert marker, "no marker where output was left out"
    assert "bytes of output left out here" in tail.splitlines()[0], tail.splitlines()[0]
    assert tail.splitlines()[1].startswith("line "), "the tail starts mid-line"
    assert tail.endswith(f"line {lines - 1:07d} {'x' * 90}\nthe end\n"), tail[-300:]
    assert len(head) >= cap // 2 - 200 and len(tail) >= cap // 4, (len(head), len(tail))
    assert not list(log.parent.glob("rank-0.log.tail-*")), "tail segments left behind"
    notice = [line for line in r.stderr.splitlines() if "passed its log cap" in line]
    assert len(notice) == 1 and "rank 0" in notice[0], r.stderr[-2000:]


def test_a_rank_log_past_log_cap_keeps_head_marker_and_tail(kernelspec_installed, tmp_path):
    env = support.kernel_env(DISTKERNEL_LOG_DIR=tmp_path / "logs")
    k = support.Kernel.start(env=env)
    try:
        lines = 40000   # ~4 MB, against a 1 MiB cap
        r = k.execute(LOUD.format(opts="log_cap=1M output=rank0", lines=lines), timeout=RUN)
        check_capped(r, 1 << 20, lines)
    finally:
        k.stop()


def test_a_failed_runs_error_names_the_logs_kept_to_head_and_tail(kernelspec_installed,
                                                                  tmp_path):
    env = support.kernel_env(DISTKERNEL_LOG_DIR=tmp_path / "logs")
    k = support.Kernel.start(env=env)
    try:
        # Rank 1 alone prints past the cap, then fails.
        code = ("%%distributed num_processes=2 tracking=False log_cap=64K\n"
                "import os\n"
                "if os.environ['RANK'] == '1':\n"
                "    for i in range(2000):\n"
                "        print(f'line {i:07d}', 'z' * 90)\n"
                "    raise ValueError('late')\n")
        r = k.execute(code, timeout=RUN)
        assert r.status == "error" and r.content["ename"] == "ValueError", r.describe()
        last = r.content["traceback"][-1]
        assert last.endswith("rank-N.log (head and tail only, past log_cap: rank 1)"), last
    finally:
        k.stop()


def test_DISTKERNEL_LOG_CAP_sets_the_default_cap(kernelspec_installed, tmp_path):
    env = support.kernel_env(DISTKERNEL_LOG_DIR=tmp_path / "logs", DISTKERNEL_LOG_CAP="512K")
    k = support.Kernel.start(env=env)
    try:
        lines = 20000
        r = k.execute(LOUD.format(opts="output=rank0", lines=lines), timeout=RUN)
        check_capped(r, 512 << 10, lines)
        bad = k.execute("import os; os.environ['DISTKERNEL_LOG_CAP'] = 'lots'\n")
        r = k.execute(LOUD.format(opts="", lines=1), timeout=RUN)
        assert r.status == "error" and "DISTKERNEL_LOG_CAP=lots" in r.content["evalue"], \
            r.describe()
    finally:
        k.stop()


def test_the_decorator_passes_log_cap(kernelspec_installed, tmp_path):
    env = support.kernel_env(DISTKERNEL_LOG_DIR=tmp_path / "logs")
    k = support.Kernel.start(env=env)
    try:
        r = k.execute("from distkernel import distributed\n"
                      "@distributed(num_processes=1, tracking=False, output='rank0', log_cap='256K')\n"
                      "def loud():\n"
                      "    for i in range(10000):\n"
                      "        print(f'line {i:07d}', 'y' * 90)\n"
                      "    return 7\n"
                      "res = loud.distributed()\n"
                      "print(list(res), res.log_dir)", timeout=RUN)
        assert r.status == "ok", r.describe()
        log_dir = r.stdout.strip().splitlines()[-1].split(" ", 1)[1]
        text = open(f"{log_dir}/rank-0.log").read()
        assert len(text) <= (256 << 10) + 1024 and "bytes of output left out here" in text
        assert "[7]" in r.stdout and "passed its log cap of 262144 bytes" in r.stderr, r.describe()
    finally:
        k.stop()


def make_old_run(root, kernel, run, mb, age_s):
    d = root / kernel / run
    d.mkdir(parents=True, mode=0o700)
    (d / "rank-0.log").write_bytes(b"x" * (mb << 20))
    t = time.time() - age_s
    os.utime(d, (t, t))
    return d


def test_the_log_root_cap_prunes_oldest_runs_first_never_a_running_one(kernelspec_installed,
                                                                       tmp_path):
    root = tmp_path / "logs"
    root.mkdir(mode=0o700)
    dead = "kernel-4194303"   # no such process
    oldest = make_old_run(root, dead, "run-0001-a", 2, 5000)
    running = make_old_run(root, dead, "run-0002-b", 2, 4000)
    older = make_old_run(root, dead, "run-0003-c", 2, 3000)
    newer = make_old_run(root, dead, "run-0004-d", 2, 2000)
    # Another kernel's run still running: it holds its folder (flock), as dk_job does.
    fd = os.open(running, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    env = support.kernel_env(DISTKERNEL_LOG_DIR=root, DISTKERNEL_LOG_ROOT_CAP="5M")
    k = support.Kernel.start(env=env)
    try:
        r = k.execute(CELL, timeout=RUN)
        assert r.status == "ok", r.describe()
        ours = support.log_dir(r)
        assert not oldest.exists() and not older.exists(), "the oldest runs stay"
        assert running.exists(), "a running run was removed"
        assert newer.exists(), "more was removed than the cap asks"
        assert (ours / "rank-0.log").exists()
    finally:
        os.close(fd)
        k.stop()


def test_a_pythonpath_folder_others_can_write_is_said_once_in_the_cell(kernelspec_installed,
                                                                        tmp_path):
    """The kernel's own node (issue 38, item 1): ranks on other nodes leave such
    an entry off (tests/unit/test_peer.c, test_slurm_folders.py); here the kernel
    imported from it already, so the cell says so once, naming it, and the
    ranks use it as the kernel does."""
    open_lib = tmp_path / "open-lib"
    open_lib.mkdir()
    open_lib.chmod(0o777)
    own = tmp_path / "lib"
    own.mkdir(mode=0o700)
    env = support.kernel_env(DISTKERNEL_LOG_DIR=tmp_path / "logs",
                             PYTHONPATH=f"{own}:{open_lib}")
    k = support.Kernel.start(env=env)
    cell = ("%%distributed num_processes=1 tracking=False\n"
            f"import sys\nprint('on sys.path:', {str(open_lib)!r} in sys.path)\n")
    try:
        r = k.execute(cell, timeout=RUN)
        assert r.status == "ok", r.describe()
        said = [line for line in r.stderr.splitlines() if "PYTHONPATH names" in line]
        assert len(said) == 1, r.describe()
        assert f"names {open_lib}, which another user" in said[0], said
        assert "writable by other users" in said[0] and f"{own}," not in said[0], said
        assert "on sys.path: True" in r.stdout, r.describe()
        r = k.execute(cell, timeout=RUN)
        assert r.status == "ok" and "PYTHONPATH" not in r.stderr, r.describe()
    finally:
        k.stop()
