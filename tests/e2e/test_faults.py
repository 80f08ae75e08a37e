"""Fault injection, end to end: the faults of the issue's list that
test_distributed_failures.py does not already inject.

Injected here, through jupyter_client against the installed kernel:

- a rank killed by SIGSEGV (a NULL read through ctypes) and one killed by SIGABRT
  (os.abort()) while the other rank waits for it in a gloo all_reduce;
- a rank that exits inside torch.distributed.init_process_group("gloo"), where the
  gloo group is built, while the other rank waits for it in gloo's connect;
- a rank that exits during distkernel's own start-up, before it received the cell
  (a sitecustomize on the kernel's PYTHONPATH, armed by a file);
- ranks that ignore SIGINT and SIGTERM, then an interrupt_request, or timeout=;
- the MLflow tracking server vanishing while the ranks run: killed (connections
  refused) or frozen with SIGSTOP (connections accepted, never answered);
- a full disk under the rank logs: TMPDIR on a 256 KiB tmpfs (ENOSPC; needs root),
  or a file size limit on the kernel (RLIMIT_FSIZE: EFBIG; the kernel ignores
  SIGXFSZ, as CPython does).

Each must end with a message in the cell that names what happened (the rank and its
signal or exit code, or the log file and why it could not be written, or the
tracking server), leave nothing of the run behind (no descendant of the kernel, not
even a zombie, and no process anywhere with the run's TORCHELASTIC_RUN_ID), and leave
a kernel that runs a plain and a distributed cell. Times asserted: the issue's 10 s
for ending every rank, and test_mlflow.py's 15 s for a cell whose tracking server
misbehaves.

Already covered elsewhere, not repeated: a rank raising, os._exit, SIGKILL of a rank
in a collective, timeout, interrupt, shutdown and restart during a run, and the kernel
SIGKILLed during a run (test_sigkill_of_the_kernel_leaves_no_rank_behind in
test_distributed_failures.py). NCCL needs GPUs; its init is not injected here.

With DISTKERNEL_FIGURES_DIR set, faults.json there lists the fault kinds injected
and which of them passed.
"""
import errno
import json
import os
import pathlib
import resource
import signal
import subprocess
import sys
import time

import pytest

import support
from support import ANNOUNCE, NoReply, rank_lines
from test_distributed_failures import END_WITHIN, RUN, assert_kernel_recovered, traceback_text
from test_mlflow import BOUNDED, Tracked, mlflow_lines

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
from mlflow_server import MlflowTestServer  # noqa: E402

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%%distributed is distkernel's")

OK_CELL_RESULT = "rank 0: 0\nrank 1: 1"

# -- which faults were injected, for faults.json ----------------------------------------

_OUTCOMES = {}  # fault kind -> "passed" | "failed"


@pytest.fixture
def fault(request):
    """Call with the kind of fault the test injects; its outcome is recorded."""
    kinds = []
    failed_before = request.session.testsfailed
    yield kinds.append
    # The call phase has been reported by now: a failure there is already counted.
    outcome = "failed" if request.session.testsfailed > failed_before else "passed"
    for kind in kinds:
        _OUTCOMES[kind] = outcome


@pytest.fixture(scope="module", autouse=True)
def faults_json():
    yield
    out = os.environ.get("DISTKERNEL_FIGURES_DIR")
    if not out:
        return
    folder = pathlib.Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "faults.json").write_text(json.dumps({
        "faults_injected": sorted(_OUTCOMES),
        "count": len(_OUTCOMES),
        "passed": sorted(k for k, v in _OUTCOMES.items() if v == "passed"),
        "failed": sorted(k for k, v in _OUTCOMES.items() if v == "failed"),
    }, indent=2) + "\n")


# -- helpers -----------------------------------------------------------------------------

def fates(r):
    """{rank: its fate line} from the 'Ranks:' part of the cell's traceback."""
    out = {}
    for line in r.content.get("traceback", []):
        line = line.strip()
        for rank in (0, 1):
            if line.startswith(f"rank {rank}:"):
                out[rank] = line
    return out


def line_seen(kernel, msg_id, text):
    """A predicate for kernel.wait_iopub: a stream of MSG_ID containing TEXT."""
    return lambda m: (m["msg_type"] == "stream" and m["parent_header"].get("msg_id") == msg_id
                      and text in m["content"]["text"])


def reply_within(kernel, msg_id, seconds, what):
    """The reply to MSG_ID within SECONDS, or a failed test (kernel restarted)."""
    try:
        return kernel.reply(msg_id, timeout=seconds)
    except NoReply:
        kernel.restart_now()
        pytest.fail(f"the cell still ran {seconds:.0f} s after {what}")


def assert_nothing_left(kernel, run_ids, pids):
    """No process of the runs RUN_IDS anywhere, none of PIDS alive, no descendant
    of the kernel; then the kernel runs a plain and a distributed cell."""
    for run_id in run_ids:
        alive = support.processes_with_env("TORCHELASTIC_RUN_ID", run_id)
        assert alive == [], f"processes of run {run_id} still alive: {alive}"
    assert_kernel_recovered(kernel, pids)


def announced_run(kernel, msg_id):
    """(run ids, pids) of the ranks of MSG_ID, from their READY lines (both ranks
    must have printed one)."""
    ranks = support.announced(kernel, msg_id)
    assert sorted(ranks) == [0, 1], f"READY lines seen: {ranks}"
    return {run for _, run in ranks.values()}, [pid for pid, _ in ranks.values()]


# -- a rank crashes in a collective ------------------------------------------------------

CRASH_IN_ALL_REDUCE = '''\
import os, resource, signal, time, torch, torch.distributed as dist
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file from the crash
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 1:
    time.sleep(1)  # rank 0 waits in all_reduce by now
    # The default action, as in any Python without faulthandler; an AddressSanitizer
    # build of the rank program would otherwise catch SIGSEGV and exit with a report.
    signal.signal(signal.SIG{sig}, signal.SIG_DFL)
    print("crashing now", flush=True)
    {crash}
    print("still alive after the crash", flush=True)
dist.all_reduce(torch.ones(1))
time.sleep(60)
'''

CRASHES = [("SEGV", "import ctypes; ctypes.string_at(0)"), ("ABRT", "os.abort()")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("sig,crash", CRASHES, ids=["segfault", "abort"])
def test_rank_crashing_in_a_collective_is_named_with_its_signal(kernel, fault, sig, crash):
    fault(f"rank_sig{sig.lower()}_in_all_reduce")
    msg_id = kernel.start_execute("%%distributed num_processes=2\n" + ANNOUNCE +
                                  CRASH_IN_ALL_REDUCE.format(sig=sig, crash=crash))
    crashing = kernel.wait_iopub(line_seen(kernel, msg_id, "[rank 1] crashing now"), timeout=RUN)
    reply = reply_within(kernel, msg_id, END_WITHIN, f"rank 1 crashed with SIG{sig}")
    ended = time.monotonic() - crashing["received_at"]
    r = kernel.finish(msg_id, reply=reply)
    assert ended < END_WITHIN, f"the ranks ended {ended:.1f} s after the crash"
    assert r.status == "error", r.describe()
    assert "still alive after the crash" not in r.stdout, "the injected crash did not happen"
    assert r.content["ename"] == "RankKilled", r.describe()
    number = getattr(signal, f"SIG{sig}").value
    assert f"rank 1: killed by signal {number} (SIG{sig})" in r.content["evalue"], r.describe()
    fate = fates(r)
    assert "root cause" in fate.get(1, ""), f"rank 1 is not the root cause:\n{traceback_text(r)}"
    # Rank 0 waits in all_reduce: distkernel ends it, unless gloo sees the
    # dead peer's socket close first and raises; either way it is told as a
    # consequence, never as the root cause.
    zero = fate.get(0, "")
    assert (zero.startswith("rank 0: ended by distkernel after rank 1 failed") or
            (zero.startswith("rank 0: raised RuntimeError") and "Connection closed by peer" in zero)), (
        f"rank 0, waiting in all_reduce, was neither ended by distkernel nor told of its peer:\n"
        f"{traceback_text(r)}")
    assert "root cause" not in zero, traceback_text(r)
    assert_nothing_left(kernel, *announced_run(kernel, msg_id))


# -- a rank exits while the process group is being set up --------------------------------

EXIT_IN_GLOO_INIT = ANNOUNCE + '''\
import os, torch.distributed as dist, torch.distributed.distributed_c10d as c10d
if os.environ["RANK"] == "1":
    # Rank 1 dies where init_process_group builds the gloo group, past the store
    # rendezvous: rank 0 is then inside gloo's connect, waiting for rank 1.
    def dying_gloo(*args, **kwargs):
        print("exiting inside init_process_group", flush=True)
        os._exit(3)
    c10d.ProcessGroupGloo = dying_gloo
dist.init_process_group("gloo")
print("init_process_group returned", flush=True)
'''


@pytest.mark.timeout(240)
def test_rank_exiting_in_gloo_init_ends_the_rank_waiting_for_it(kernel, fault):
    fault("rank_exit_in_gloo_init")
    msg_id = kernel.start_execute("%%distributed num_processes=2\n" + EXIT_IN_GLOO_INIT)
    exiting = kernel.wait_iopub(line_seen(kernel, msg_id, "[rank 1] exiting inside init"),
                                timeout=RUN)
    reply = reply_within(kernel, msg_id, END_WITHIN, "rank 1 exited in init_process_group")
    ended = time.monotonic() - exiting["received_at"]
    r = kernel.finish(msg_id, reply=reply)
    assert ended < END_WITHIN, f"the ranks ended {ended:.1f} s after rank 1 exited"
    assert r.status == "error", r.describe()
    assert "init_process_group returned" not in r.stdout, (
        "a rank got past init_process_group: the fault was not injected\n" + r.describe())
    assert r.content["ename"] == "RankExited", r.describe()
    assert "rank 1: exited with code 3" in r.content["evalue"], r.describe()
    fate = fates(r)
    assert "root cause" in fate.get(1, ""), traceback_text(r)
    assert fate.get(0, "").startswith("rank 0: ended by distkernel after rank 1 failed"), (
        f"rank 0, waiting in gloo's rendezvous, was not ended by distkernel:\n"
        f"{traceback_text(r)}")
    assert_nothing_left(kernel, *announced_run(kernel, msg_id))


# A sitecustomize runs in every Python the kernel starts, ranks included, before
# distkernel's rank code. Armed (the file named by E2E_STARTUP_FAULT exists), it
# makes rank 1 exit at once, telling which run and process it was.
SITECUSTOMIZE = '''\
import os
if os.environ.get("RANK") == "1" and os.path.exists(os.environ["E2E_STARTUP_FAULT"]):
    os.write(2, ("STARTUP-EXIT pid=%d run=%s\\n"
                 % (os.getpid(), os.environ["TORCHELASTIC_RUN_ID"])).encode())
    os._exit(3)
'''


@pytest.mark.timeout(180)
def test_rank_exiting_during_start_up_is_named_as_such(kernelspec_installed, tmp_path, fault):
    fault("rank_exit_during_startup")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    armed = tmp_path / "armed"
    armed.touch()
    pythonpath = os.pathsep.join(p for p in [str(site), os.environ.get("PYTHONPATH")] if p)
    # Cold ranks: a warm rank is forked after the template's Python start-up,
    # so a sitecustomize runs once, in the template, not per rank.
    env = support.kernel_env(PYTHONPATH=pythonpath, E2E_STARTUP_FAULT=armed, DISTKERNEL_WARM="0")
    with Tracked(tmp_path, env) as k:
        with support.ChildWatcher(k.pid) as watcher:
            r = k.execute("%%distributed num_processes=2\n" + ANNOUNCE +
                          "import time\ntime.sleep(60)\n", timeout=RUN)
        assert r.status == "error", r.describe()
        started = [line for line in rank_lines(r.stderr).get(1, [])
                   if line.startswith("STARTUP-EXIT")]
        assert len(started) == 1, f"rank 1 did not exit from sitecustomize:\n{r.describe()}"
        pid, run_id = (part.split("=")[1] for part in started[0].split()[1:])
        assert r.content["ename"] == "RankExited", r.describe()
        assert r.content["evalue"] == (
            "rank 1: exited with code 3 during start-up, before it received the cell"), (
            r.describe())
        fate = fates(r)
        assert "root cause" in fate.get(1, ""), traceback_text(r)
        assert fate.get(0, "").startswith("rank 0: ended by distkernel after rank 1 failed"), (
            traceback_text(r))
        armed.unlink()  # the environment is sound again: the kernel must work in it
        assert_nothing_left(k, [run_id], [int(pid), *watcher.seen])


# -- ranks that ignore SIGINT and SIGTERM ------------------------------------------------

IGNORING = ANNOUNCE + '''\
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("ignoring SIGINT and SIGTERM", flush=True)
while True:
    time.sleep(1)
'''


def wait_both_ignoring(kernel, msg_id):
    for rank in (0, 1):
        kernel.wait_iopub(line_seen(kernel, msg_id, f"[rank {rank}] ignoring SIGINT"),
                          timeout=RUN)


def assert_killed_after_ignoring(r, why):
    for rank in (0, 1):
        assert fates(r).get(rank) == (
            f"rank {rank}: ended by distkernel ({why}); it outlived SIGINT and SIGTERM "
            f"and was killed with SIGKILL"), traceback_text(r)


@pytest.mark.timeout(180)
def test_ranks_ignoring_sigint_and_sigterm_end_on_interrupt(kernel, fault):
    fault("ranks_ignore_sigint_sigterm_then_interrupt")
    msg_id = kernel.start_execute("%%distributed num_processes=2\n" + IGNORING)
    wait_both_ignoring(kernel, msg_id)
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    reply = reply_within(kernel, msg_id, END_WITHIN, "the interrupt")
    elapsed = time.monotonic() - t0
    r = kernel.finish(msg_id, reply=reply)
    assert elapsed < END_WITHIN, f"the ranks ended {elapsed:.1f} s after the interrupt"
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "KeyboardInterrupt", r.describe()
    assert "interrupted" in r.content["evalue"], r.describe()
    assert_killed_after_ignoring(r, "interrupted")
    assert_nothing_left(kernel, *announced_run(kernel, msg_id))


@pytest.mark.timeout(180)
def test_ranks_ignoring_sigint_and_sigterm_end_on_timeout(kernel, fault):
    fault("ranks_ignore_sigint_sigterm_then_timeout")
    timeout = 5  # the ranks ignore both signals well before
    t0 = time.monotonic()
    msg_id = kernel.start_execute(f"%%distributed num_processes=2 timeout={timeout}\n" +
                                  IGNORING)
    wait_both_ignoring(kernel, msg_id)
    reply = reply_within(kernel, msg_id, timeout + END_WITHIN - (time.monotonic() - t0),
                         f"it was sent with timeout={timeout}")
    elapsed = time.monotonic() - t0
    r = kernel.finish(msg_id, reply=reply)
    assert elapsed < timeout + END_WITHIN, f"a timeout={timeout} cell took {elapsed:.1f} s"
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "TimeoutError", r.describe()
    assert_killed_after_ignoring(r, "timeout")
    assert_nothing_left(kernel, *announced_run(kernel, msg_id))


# -- the MLflow tracking server vanishes mid-run -----------------------------------------

def wait_for_file_cell(go):
    """A cell whose ranks run until the file GO exists, then return their rank."""
    return ("%%distributed num_processes=2\n" + ANNOUNCE +
            f"import time\nwhile not _os.path.exists({str(go)!r}):\n    time.sleep(0.05)\n"
            "int(_os.environ['RANK'])\n")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_tracking_server_vanishing_mid_run(kernelspec_installed, tmp_path, fault, how):
    fault(f"mlflow_server_{how}_mid_run")
    go = tmp_path / "server-gone"
    server = MlflowTestServer().start()
    try:
        env = support.kernel_env(MLFLOW_TRACKING_URI=server.url, DISTKERNEL_MLFLOW_TIMEOUT=1)
        with Tracked(tmp_path, env) as k:
            msg_id = k.start_execute(wait_for_file_cell(go))
            support.wait_announced(k, msg_id, timeout=RUN)
            (run,) = server.runs()
            assert run["info"]["status"] == "RUNNING", run["info"]
            server.proc.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
            if how == "killed":
                server.proc.wait(10)
            go.touch()
            t0 = time.monotonic()
            r = k.finish(msg_id, timeout=RUN)
            elapsed = time.monotonic() - t0
            assert r.status == "ok" and r.result == OK_CELL_RESULT, r.describe()
            warnings = mlflow_lines(r.stderr)
            assert len(warnings) == 1, f"expected one MLflow warning:\n{r.describe()}"
            for part in ("final status (FINISHED) was not recorded", server.url):
                assert part in warnings[0], f"{part!r} not in {warnings[0]!r}"
            assert elapsed < BOUNDED, f"the cell took {elapsed:.1f} s after the server went"

            # The next cell, with the server still gone: it runs, with one warning.
            t0 = time.monotonic()
            after = k.execute("%%distributed num_processes=2\nimport os\n"
                              "int(os.environ['RANK'])\n", timeout=RUN)
            elapsed = time.monotonic() - t0
            assert after.status == "ok" and after.result == OK_CELL_RESULT, after.describe()
            warnings = mlflow_lines(after.stderr)
            assert len(warnings) == 1, f"expected one MLflow warning:\n{after.describe()}"
            assert "could not record this run" in warnings[0], warnings[0]
            assert "the run goes on" in warnings[0], warnings[0]
            assert elapsed < BOUNDED, f"the next cell took {elapsed:.1f} s"
            assert_nothing_left(k, *announced_run(k, msg_id))
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()  # a stopped process dies of SIGKILL too
        server.stop()


# -- a full disk under the rank logs -----------------------------------------------------

LINES = 4000  # 97 bytes each: 388,000 bytes a rank, more than either limit below
TMPFS_SIZE = "256k"
FILE_SIZE_LIMIT = 128 * 1024


class LogDisk:
    """Where the kernel's TMPDIR and its log root (DISTKERNEL_LOG_DIR, TMPDIR/logs)
    go, how the disk is made full, and the reason the failing log writes must give."""

    def __init__(self, kind, tmpdir, reason, limit=None):
        self.kind, self.tmpdir, self.reason, self._limit = kind, tmpdir, reason, limit

    def apply(self, kernel):
        """Limit the started KERNEL where the limit is a process's (RLIMIT_FSIZE)."""
        if self._limit:
            resource.prlimit(kernel.pid, resource.RLIMIT_FSIZE, (self._limit, self._limit))


@pytest.fixture(params=["tmpfs", "file_size_limit"])
def log_disk(request, tmp_path):
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    if request.param == "file_size_limit":
        yield LogDisk("rank_log_over_file_size_limit", tmpdir, os.strerror(errno.EFBIG),
                      limit=FILE_SIZE_LIMIT)
        return
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the file_size_limit case still makes "
                    "the rank logs unwritable")
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700",
                            "tmpfs", str(tmpdir)], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mount.stderr.strip()}); the "
                    f"file_size_limit case still makes the rank logs unwritable")
    try:
        yield LogDisk("rank_log_disk_full", tmpdir, os.strerror(errno.ENOSPC))
    finally:
        if subprocess.run(["umount", str(tmpdir)]).returncode != 0:
            subprocess.run(["umount", "-l", str(tmpdir)])


@pytest.mark.timeout(180)
def test_full_log_disk_is_reported_and_the_output_still_reaches_the_cell(
        kernelspec_installed, tmp_path, fault, log_disk):
    fault(log_disk.kind)
    # IPYTHONDIR: IPython's history database, which the file size limit also
    # applies to, starts empty rather than being the user's.
    env = support.kernel_env(TMPDIR=log_disk.tmpdir, IPYTHONDIR=tmp_path / "ipython",
                             DISTKERNEL_LOG_DIR=log_disk.tmpdir / "logs")
    with Tracked(tmp_path, env) as k:
        log_disk.apply(k)
        r = k.execute("%%distributed num_processes=2 tracking=False\n" + ANNOUNCE +
                      f"for i in range({LINES}):\n"
                      "    print(f'line {i:05d} ' + 'x' * 90)\n"
                      "int(_os.environ['RANK'])\n", timeout=RUN)
        assert r.status == "ok" and r.result == OK_CELL_RESULT, r.describe()
        logs = support.log_dir(r)
        assert logs is not None and logs.is_relative_to(log_disk.tmpdir), r.describe()
        lines = [f"line {i:05d} " + "x" * 90 for i in range(LINES)]
        by_rank = rank_lines(r.stdout)
        run_ids, pids = announced_run(k, r.msg_id)
        for rank, (pid, run_id) in sorted(support.announced(k, r.msg_id).items()):
            assert by_rank.get(rank, [])[1:] == lines, (
                f"rank {rank}'s output did not all reach the cell: "
                f"{len(by_rank.get(rank, [])[1:])} of {LINES} lines")
            log = logs / f"rank-{rank}.log"
            warned = [line for line in r.stderr.splitlines()
                      if f"cannot write rank {rank}'s log file" in line]
            assert len(warned) == 1, f"expected one warning for rank {rank}:\n{r.stderr}"
            assert warned[0].startswith("[distkernel] "), warned[0]
            assert f"{log} ({log_disk.reason})" in warned[0], (
                f"the log's path or the reason is missing: {warned[0]!r}")
            # What did fit is the start of the rank's output, unmangled.
            output = "\n".join([f"READY pid={pid} run={run_id}"] + lines) + "\n"
            kept = log.read_text()
            assert len(kept) < len(output), f"{log} holds everything: no limit was hit"
            assert output.startswith(kept), f"{log} does not hold the start of the output"
        assert_nothing_left(k, run_ids, pids)


@pytest.mark.timeout(180)
def test_a_failed_run_says_which_logs_the_full_disk_cut_short(kernelspec_installed, tmp_path,
                                                              log_disk):
    """The error of a run whose logs could not all be written does not promise
    "full output" there: it names the ranks whose logs were cut short."""
    env = support.kernel_env(TMPDIR=log_disk.tmpdir, IPYTHONDIR=tmp_path / "ipython",
                             DISTKERNEL_LOG_DIR=log_disk.tmpdir / "logs")
    with Tracked(tmp_path, env) as k:
        log_disk.apply(k)
        r = k.execute("%%distributed num_processes=2 tracking=False\nimport os\n"
                      f"for i in range({LINES}):\n"
                      "    print(f'line {i:05d} ' + 'x' * 90)\n"
                      "if os.environ['RANK'] == '1':\n"
                      "    raise ValueError('after the output')\n", timeout=RUN)
        assert r.status == "error" and r.content["ename"] == "ValueError", r.describe()
        last = r.content["traceback"][-1]
        assert last.startswith("Full output of every rank: "), traceback_text(r)
        # Exactly the ranks warned about while the run went on (rank 0 may have been
        # ended by the failure before its own log ran out of room).
        warned = [rank for rank in (0, 1)
                  if f"cannot write rank {rank}'s log file" in r.stderr]
        assert 1 in warned, r.stderr
        named = ", ".join(map(str, warned))
        assert last.endswith(f"(cut short, the disk refused writes: rank {named})"), last
        r = k.execute("%%distributed num_processes=2 tracking=False\n"
                      "import os\nint(os.environ['RANK'])", timeout=RUN)
        assert r.status == "ok" and r.result == OK_CELL_RESULT, r.describe()
