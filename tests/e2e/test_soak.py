"""Soak: 10,000 executes and 200 `%%distributed num_processes=2` cells in one kernel.

What this proves, for one fresh kernel with a temporary directory of its own:

- every cell got the right answer: each plain execute (assignments, prints to
  stdout and stderr, expression results, an occasional ValueError, NameError or
  SyntaxError) and each distributed cell (results from both ranks, labelled output,
  a gloo all_reduce now and then, and a rank that raises, with the other rank either
  finished or still running and ended by distkernel) is checked for its status,
  output and result;
- the kernel does not leak: open descriptors at the end are those after warm-up
  (+2), threads are the same, RSS grows by less than RSS_BOUND_MIB, and the growth
  over the second half is not much more than over the first (no accelerating leak);
  against an AddressSanitizer build RSS is reported but not bounded, as it is then
  mostly the sanitizer's quarantine of freed memory;
- no process is left: after every distributed cell the kernel has no descendant,
  not even a zombie; no process that carries this kernel's TMPDIR or one of its
  runs' TORCHELASTIC_RUN_ID lives outside the kernel while it runs, and none at all
  once it has shut down (so no rank was orphaned to init);
- no file is left but the rank logs distkernel keeps: the last KEEP_RUNS run
  folders, each with rank-0.log and rank-1.log; no back-channel socket folder, job
  folder, torch or gloo temporary file, in the kernel's TMPDIR, while it runs and
  after a clean shutdown.

The figures are printed (run pytest with -s to see them) and, when
DISTKERNEL_FIGURES_DIR is set, written to soak.json there.

DISTKERNEL_SOAK_SCALE (default 1.0) scales both counts, e.g. 0.25 for the slower
sanitizer build; a floor keeps enough distributed cells to turn over the kept logs.
The test is marked `soak`: `-m "not soak"` leaves it out.
"""
import json
import os
import pathlib
import queue
import re
import subprocess
import time

import psutil
import pytest
from jupyter_client import KernelManager

import support

SCALE = float(os.environ.get("DISTKERNEL_SOAK_SCALE") or 1.0)
EXECUTES = max(500, round(10_000 * SCALE))
CELLS = max(30, round(200 * SCALE))
KEEP_RUNS = 20           # distkernel keeps the rank logs of a kernel's last 20 runs
# RSS grows with every cell because IPython keeps each cell's input (In, _iN, the
# history cache): about 1.3 KiB a plain execute, as much as under ipykernel. What
# distkernel adds was measured flat: +0.2 MiB over 300 distributed cells.
RSS_BOUND_MIB = 40.0     # over the whole soak, after warm-up (12.4 MiB measured)
FD_SLACK = 2
PLAIN_TIMEOUT = 60       # seconds for one plain execute (a busy machine, a sanitizer build)
DIST_TIMEOUT = 180       # seconds for one distributed cell

pytestmark = [
    pytest.mark.soak,
    # Not `alone`: it bounds descriptors, threads and RSS, which other tests
    # beside it do not move, and asserts no time (its ms-per-cell figures are
    # printed only; on a busy machine they are higher).
    pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                       reason="%%distributed is distkernel's"),
]


# -- the cells ----------------------------------------------------------------------

class Expect:
    """What a cell must produce: reply status, stdout and stderr (for distributed
    cells, {rank: [line, ...]} after the "[rank N] " labels), the text/plain result,
    and for an error the ename and a piece of the evalue."""

    def __init__(self, status="ok", stdout="", stderr="", result=None, ename=None,
                 evalue=None, ranks=False, traceback=None):
        self.status, self.stdout, self.stderr, self.result = status, stdout, stderr, result
        self.ename, self.evalue, self.ranks, self.traceback = ename, evalue, ranks, traceback


class State:
    """What the notebook holds, to know the answer of the cells that read it."""

    def __init__(self):
        self.n = 0
        self.last = None


def plain_cell(i, state):
    """The I-th plain execute: (code, Expect)."""
    if i % 100 == 99:
        kind = (i // 100) % 3
        if kind == 0:
            return (f"raise ValueError('soak {i}')",
                    Expect("error", ename="ValueError", evalue=f"soak {i}"))
        if kind == 1:
            return (f"print('never printed')\nundefined_soak_name_{i}",
                    Expect("error", stdout="never printed\n", ename="NameError",
                           evalue=f"undefined_soak_name_{i}"))
        return f"x = ({i}", Expect("error", ename="SyntaxError")
    k = i % 10
    if k == 0:
        state.n += 1
        return "n += 1", Expect()
    if k == 1:
        return f"print('soak', {i})", Expect(stdout=f"soak {i}\n")
    if k == 2:
        return "n * 3", Expect(result=str(state.n * 3))
    if k == 3:
        state.last = [i] * 3
        return f"last = [{i}] * 3", Expect()
    if k == 4:
        return "sum(last)", Expect(result=str(sum(state.last)))
    if k == 5:
        return (f"import sys\nprint('to stderr', {i}, file=sys.stderr)",
                Expect(stderr=f"to stderr {i}\n"))
    if k == 6:
        size = 1000 + i % 1000
        return f"s = 'x' * {size}\nlen(s)", Expect(result=str(size))
    if k == 7:
        return f"{{'i': {i}, 'sq': {i * i}}}", Expect(result=repr({"i": i, "sq": i * i}))
    if k == 8:
        return "for k in range(3):\n    print(k)", Expect(stdout="0\n1\n2\n")
    return "del s", Expect()


MAGIC = "%%distributed num_processes=2 tracking=False\n"
OUTPUT_CACHE_WARNING = re.compile(
    r"^\S*IPython/core/displayhook\.py:\d+: UserWarning: Output cache limit \(currently \d+ "
    r"entries\) hit\.\nFlushing oldest \d+ entries\.\n  warn\(.*\n", re.M)
RUN_ID_LINE = re.compile(r"^hello from (\d) run ([0-9a-f]{32})$")


def distributed_cell(j):
    """The J-th distributed cell: (code, Expect)."""
    if j % 10 == 9:
        # Rank 1 raises; rank 0 either ends on its own or sleeps and is ended.
        rest = "time.sleep(60)\n" if (j // 10) % 2 else ""
        return (MAGIC + "import os, time\n"
                f"if os.environ['RANK'] == '1':\n    raise ValueError('soak rank failure {j}')\n"
                + rest,
                Expect("error", ename="ValueError", evalue=f"soak rank failure {j}", ranks=True,
                       traceback=["root cause", "rank 1"]))
    if j % 25 == 12:
        return (MAGIC + "import torch, torch.distributed as dist\n"
                "dist.init_process_group('gloo')\n"
                f"t = torch.tensor([float(int(__import__('os').environ['RANK']) + {j})])\n"
                "dist.all_reduce(t)\n"
                "dist.destroy_process_group()\n"
                "int(t.item())",
                Expect(result=f"rank 0: {2 * j + 1}\nrank 1: {2 * j + 1}", ranks=True))
    if j % 3 == 1:
        # The run id is printed so that the test can look for that run's processes.
        return (MAGIC + "import os, sys\n"
                "print('hello from', os.environ['RANK'], 'run', os.environ['TORCHELASTIC_RUN_ID'])\n"
                f"print('cell {j} on stderr', file=sys.stderr)\n"
                f"int(os.environ['RANK']) * 10 + {j % 7}",
                Expect(stdout=None, stderr={0: [f"cell {j} on stderr"], 1: [f"cell {j} on stderr"]},
                       result=f"rank 0: {j % 7}\nrank 1: {10 + j % 7}", ranks=True))
    return (MAGIC + "import os\nint(os.environ['RANK'])",
            Expect(result="rank 0: 0\nrank 1: 1", ranks=True))


# -- the client ---------------------------------------------------------------------

class Client:
    """Runs one cell at a time on a BlockingKernelClient and checks what came back;
    messages for another request (other than status, and the replies to
    wait_for_ready's kernel_info_requests) are kept in `strays`."""

    def __init__(self, kc):
        self.kc = kc
        self.strays = []
        self.run_ids = set()
        self.cache_warnings = 0

    def run(self, code, expect, timeout):
        msg_id = self.kc.execute(code)
        deadline = time.monotonic() + timeout
        outputs = []
        while True:
            remaining = deadline - time.monotonic()
            try:
                msg = self.kc.get_iopub_msg(timeout=max(remaining, 0.001))
            except queue.Empty:
                raise support.NoReply(f"no status idle within {timeout} s for:\n{code}") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                if msg["msg_type"] != "status":
                    self.strays.append((msg["msg_type"], str(msg["content"])[:200]))
                continue
            if msg["msg_type"] == "status":
                if msg["content"]["execution_state"] == "idle":
                    break
            elif msg["msg_type"] != "execute_input":
                outputs.append(msg)
        while True:
            try:
                reply = self.kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 5))
            except queue.Empty:
                raise support.NoReply(f"no execute_reply within {timeout} s for:\n{code}") from None
            if reply["parent_header"].get("msg_id") == msg_id:
                break
            # wait_for_ready may have asked for kernel_info more than once.
            if reply["msg_type"] != "kernel_info_reply":
                self.strays.append((reply["msg_type"], str(reply["content"])[:200]))
        self.check(code, expect, reply["content"], outputs)

    def check(self, code, expect, content, outputs):
        def text(name):
            return "".join(m["content"]["text"] for m in outputs
                           if m["msg_type"] == "stream" and m["content"]["name"] == name)

        results = [m["content"]["data"].get("text/plain") for m in outputs
                   if m["msg_type"] == "execute_result"]
        errors = [m["content"] for m in outputs if m["msg_type"] == "error"]
        stdout, stderr = text("stdout"), text("stderr")
        if results and OUTPUT_CACHE_WARNING.search(stderr):
            # IPython's own note when its Out cache is full (once per kernel).
            stderr = OUTPUT_CACHE_WARNING.sub("", stderr)
            self.cache_warnings += 1
        what = (f"cell:\n{code}\nreply: {str(content)[:1500]}\n"
                f"stdout: {stdout!r}\nstderr: {stderr!r}\nresults: {results}")
        assert content["status"] == expect.status, f"wrong status\n{what}"
        assert results == ([] if expect.result is None else [expect.result]), f"wrong result\n{what}"
        if expect.ranks:
            out_lines, err_lines = support.rank_lines(stdout), support.rank_lines(stderr)
            unlabelled = [line for line in (stdout + stderr).splitlines()
                          if not support.RANK_LINE.match(line)]
            assert unlabelled == [], f"rank output without a [rank N] label\n{what}"
            if expect.stdout is None:   # the run-id greeting
                self.check_greeting(out_lines, what)
            else:
                assert out_lines == {}, f"unexpected stdout\n{what}"
            assert err_lines == (expect.stderr or {}), f"wrong stderr\n{what}"
            others = [m for m in outputs if m["msg_type"] not in
                      ("stream", "execute_result", "error", "display_data", "update_display_data")]
            displays = [m for m in outputs if m["msg_type"] in ("display_data", "update_display_data")]
            assert all(m["content"]["data"].get("text/plain", "").startswith("distributed:")
                       for m in displays), f"a display other than the run's status line\n{what}"
        else:
            assert stdout == expect.stdout, f"wrong stdout\n{what}"
            assert stderr == expect.stderr, f"wrong stderr\n{what}"
            others = [m for m in outputs if m["msg_type"] not in ("stream", "execute_result", "error")]
        assert others == [], f"unexpected iopub messages {[m['msg_type'] for m in others]}\n{what}"
        if expect.status == "error":
            assert content["ename"] == expect.ename, f"wrong exception\n{what}"
            if expect.evalue is not None:
                assert expect.evalue in content["evalue"], f"wrong exception value\n{what}"
            assert len(errors) == 1 and errors[0]["ename"] == expect.ename, (
                f"expected one error message on iopub, got {len(errors)}\n{what}")
            tb = "\n".join(content.get("traceback", [])).lower()
            for piece in expect.traceback or []:
                assert piece in tb, f"{piece!r} missing from the traceback\n{what}"
        else:
            assert errors == [], f"an error message for a cell that succeeded\n{what}"

    def check_greeting(self, out_lines, what):
        ids = set()
        for rank in (0, 1):
            lines = out_lines.get(rank, [])
            found = [RUN_ID_LINE.match(line) for line in lines]
            assert len(lines) == 1 and found[0] and found[0].group(1) == str(rank), (
                f"rank {rank} did not greet once with its run id\n{what}")
            ids.add(found[0].group(2))
        assert len(ids) == 1, f"the ranks of one run report different run ids {ids}\n{what}"
        self.run_ids |= ids


# -- what the kernel holds and leaves ---------------------------------------------------

def sample(proc, t0):
    return {"t_s": round(time.monotonic() - t0, 1),
            "rss_mib": round(proc.memory_info().rss / 2**20, 2),
            "fds": proc.num_fds(), "threads": proc.num_threads()}


def settled_sample(proc, t0, warm, wait=3.0):
    """A sample taken once descriptors and threads are back to WARM's (or after WAIT
    s): a thread or descriptor that ends just after the reply is not a leak."""
    deadline = time.monotonic() + wait
    while True:
        s = sample(proc, t0)
        if (s["fds"] <= warm["fds"] + FD_SLACK and s["threads"] == warm["threads"]) \
                or time.monotonic() >= deadline:
            return s
        time.sleep(0.1)


def ours(tmpdir, run_ids):
    """Living processes whose environment has this kernel's TMPDIR or one of its
    runs' TORCHELASTIC_RUN_ID: the kernel and anything it started (ranks inherit
    its environment). Zombies have no environment and are not found here."""
    return support.processes_with_any_env({"TMPDIR": [tmpdir],
                                           "TORCHELASTIC_RUN_ID": list(run_ids)})


def orphans(kernel_pid, tmpdir, run_ids):
    """Processes of this kernel's runs not under the kernel (every one of them
    once the kernel has ended), described. The warm-start template is under
    the kernel: it stays between runs by design, and ends with the kernel; so
    is its folder watcher (it has the kernel's environment, TMPDIR included)."""
    under = {p.pid for p in support.descendants(kernel_pid, template=True, tidy=True)}
    under.add(kernel_pid)
    return describe([pid for pid in ours(tmpdir, run_ids) if pid not in under])


def describe(pids):
    """PID, parent, state and command line of each of PIDS still alive."""
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{pid} ppid {p.ppid()} {p.status()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            pass
    return out


def tmp_contents(tmpdir, kernel_pid, cell_files=None):
    """(run folders kept, paths that are not rank logs distkernel keeps) in TMPDIR,
    which also holds the kernel's XDG_STATE_HOME and so its default log root.
    With CELL_FILES (a list), the running kernel's private folder of cell files
    (one per distinct cell source, removed at shutdown) is expected too, and its
    files are appended there."""
    logs = tmpdir / "state" / "distkernel" / "logs"
    kernel_logs = logs / f"kernel-{kernel_pid}"
    allowed_dirs = {tmpdir / "state", logs.parent, logs, kernel_logs}
    runs, unexpected = [], []
    for path in sorted(tmpdir.rglob("*")):
        cells = cell_files is not None and re.fullmatch(
            rf"distkernel-cells-{kernel_pid}-\w+", path.parent.name if path.is_file() else path.name)
        if cells and path.is_dir() and not path.is_symlink() and path.parent == tmpdir:
            continue
        if (cells and path.is_file() and path.parent.parent == tmpdir
                and re.fullmatch(r"\d+\.py", path.name)):
            cell_files.append(path)
            continue
        # The running kernel's warm-start template: its private folder, socket
        # and owner file (dk_logdir.h), removed when the kernel ends, so not
        # allowed after shutdown.
        template_dir = re.compile(r"distkernel-warm-\w{6}")
        if cell_files is not None and (
                (path.parent == tmpdir and path.is_dir() and template_dir.fullmatch(path.name))
                or (path.name in ("template", ".owner") and path.parent.parent == tmpdir
                    and template_dir.fullmatch(path.parent.name))):
            continue
        if path.is_dir() and not path.is_symlink():
            if path in allowed_dirs:
                continue
            if path.parent == kernel_logs and re.fullmatch(r"run-\d{4,}-[0-9a-f]{16}", path.name):
                runs.append(path)
                continue
        elif (path.parent.parent == kernel_logs and path.is_file()
              and (path.name in ("rank-0.log", "rank-1.log")
                   # A failed run's stacks, its ranks by fate past what the error
                   # shows, and its error as the cell showed it.
                   or path.name in ("stacks.txt", "ranks.txt", "error.txt"))):
            continue
        unexpected.append(str(path.relative_to(tmpdir)))
    return runs, unexpected


def sanitized(pid):
    """Whether the process runs with AddressSanitizer (libasan mapped)."""
    with open(f"/proc/{pid}/maps") as f:
        return any("libasan" in line for line in f)


def run_number(folder):
    return int(folder.name.split("-")[1])


def incomplete_runs(runs):
    """Kept run folders that lack a rank's log, or hold more than the logs and the
    files a failed run keeps (its stacks, its ranks by fate, its error)."""
    extras = {"stacks.txt", "ranks.txt", "error.txt"}
    return [r.name for r in runs
            if sorted(p.name for p in r.iterdir() if p.name not in extras) != ["rank-0.log", "rank-1.log"]]


# -- the soak ----------------------------------------------------------------------------

@pytest.mark.timeout(int(900 + 3600 * SCALE))
def test_soak(kernelspec_installed, tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    # History of the 10,000 cells goes to a profile of its own, not the user's.
    env = support.kernel_env(TMPDIR=tmpdir, IPYTHONDIR=tmp_path / "ipython",
                             DISTKERNEL_LOG_DIR=None, XDG_STATE_HOME=tmpdir / "state")
    km = KernelManager(kernel_name=support.KERNEL_NAME)
    km.start_kernel(env=env)
    popen = km.provisioner.process
    kc = km.client()
    kc.start_channels()
    t0 = time.monotonic()
    state = State()
    client = Client(kc)
    samples = []
    timing = {"plain_s": 0.0, "distributed_s": 0.0}
    runs_started = 0
    max_fds = 0
    clean_exit = None
    try:
        kc.wait_for_ready(timeout=60)
        proc = psutil.Process(popen.pid)
        asan = sanitized(proc.pid)

        def plain(i):
            code, expect = plain_cell(i, state)
            start = time.monotonic()
            client.run(code, expect, PLAIN_TIMEOUT)
            timing["plain_s"] += time.monotonic() - start

        def distributed(j):
            nonlocal runs_started, max_fds
            code, expect = distributed_cell(j)
            start = time.monotonic()
            runs_started += 1
            client.run(code, expect, DIST_TIMEOUT)
            timing["distributed_s"] += time.monotonic() - start
            left = support.wait_no_descendants(proc.pid, timeout=5)
            assert left == [], f"processes under the kernel after distributed cell {j}: {left}"
            max_fds = max(max_fds, proc.num_fds())

        # Warm-up: every kind of cell once, so that what is allocated once (imports,
        # caches, the first run's machinery) is in the baseline.
        client.run("n = 0", Expect(), PLAIN_TIMEOUT)
        warm_executes = 300
        for i in range(warm_executes):
            plain(i)
        warm_cells = (0, 1, 9, 12, 19)
        for j in warm_cells:
            distributed(j)
        time.sleep(0.5)
        warm = sample(proc, t0)
        samples.append(("warm-up", warm))
        warm_runs = runs_started
        found = orphans(proc.pid, tmpdir, client.run_ids)
        assert found == [], f"processes of this kernel's runs outside it after warm-up: {found}"

        # The soak: the distributed cells spread evenly among the plain executes.
        total = EXECUTES + CELLS
        dist_at = {round((j + 1) * EXECUTES / CELLS) + j + 1 for j in range(CELLS)}
        checkpoints = {round(total * k / 10) for k in range(1, 11)}
        i, j = warm_executes, 0
        half = None
        for step in range(1, total + 1):
            if step in dist_at:
                distributed(j)
                j += 1
            else:
                plain(i)
                i += 1
            if step in checkpoints:
                s = sample(proc, t0)
                samples.append((f"{i - warm_executes} executes, {j} cells", s))
                if half is None and step >= total // 2:
                    half = s
                found = orphans(proc.pid, tmpdir, client.run_ids)
                assert found == [], f"processes of this kernel's runs outside it: {found}"
        assert (i - warm_executes, j) == (EXECUTES, CELLS)
        time.sleep(0.5)
        end = settled_sample(proc, t0, warm)
        samples.append(("end", end))
        left = support.describe_processes(support.descendants(proc.pid))
        zombies = [line for line in left if " zombie " in f" {line} "]
        orphans_running = orphans(proc.pid, tmpdir, client.run_ids)
        cell_files = []
        runs_running, unexpected_running = tmp_contents(tmpdir, proc.pid, cell_files)
        incomplete = incomplete_runs(runs_running)
        soak_s = time.monotonic() - t0

        # A clean shutdown: the kernel must exit by itself (code 0), not be killed.
        kc.shutdown()
        try:
            clean_exit = popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            clean_exit = None
    finally:
        kc.stop_channels()
        try:
            km.shutdown_kernel(now=True)
        except Exception:
            pass
    gone = support.wait_gone(ours(tmpdir, client.run_ids), timeout=5)
    orphans_after = describe(gone)
    runs_after, unexpected_after = tmp_contents(tmpdir, popen.pid)
    elapsed = time.monotonic() - t0

    growth = end["rss_mib"] - warm["rss_mib"]
    first, second = half["rss_mib"] - warm["rss_mib"], end["rss_mib"] - half["rss_mib"]
    figures = {
        "executes": EXECUTES, "cells": CELLS, "scale": SCALE, "asan": asan,
        "rss_bounds_checked": not asan,
        "warm_up": {"executes": warm_executes, "cells": len(warm_cells)},
        "rss_mib": {"warm_up": warm["rss_mib"], "half": half["rss_mib"], "end": end["rss_mib"],
                    "growth": round(growth, 2), "growth_first_half": round(first, 2),
                    "growth_second_half": round(second, 2)},
        "fds": {"warm_up": warm["fds"], "end": end["fds"], "max_after_a_cell": max_fds},
        "threads": {"warm_up": warm["threads"], "end": end["threads"]},
        "zombies": len(zombies), "orphans": len(orphans_running) + len(orphans_after),
        "log_folders_kept": len(runs_running), "log_folders_after_shutdown": len(runs_after),
        "files_after_shutdown": sum(1 for p in tmpdir.rglob("*") if p.is_file()),
        "cell_files_running": len(cell_files),
        "unexpected_files": unexpected_running + unexpected_after,
        "kernel_exit_code": clean_exit,
        "ipython_output_cache_warnings": client.cache_warnings,
        "ms_per_execute": round(1000 * timing["plain_s"] / (EXECUTES + warm_executes), 2),
        "ms_per_distributed_cell": round(1000 * timing["distributed_s"] / runs_started, 1),
        "soak_seconds": round(soak_s, 1), "elapsed_seconds": round(elapsed, 1),
        "samples": samples,
    }
    print(f"\nsoak: {EXECUTES} executes and {CELLS} distributed cells "
          f"(after {warm_executes} + {len(warm_cells)} of warm-up), scale {SCALE}")
    for label, s in samples:
        print(f"  {label:>28}: {s['t_s']:7.1f} s  rss {s['rss_mib']:7.1f} MiB  "
              f"fds {s['fds']:3d}  threads {s['threads']:2d}")
    print(f"  rss growth {growth:+.1f} MiB (first half {first:+.1f}, second {second:+.1f}); "
          f"fds {warm['fds']} -> {end['fds']} (max {max_fds}); threads {warm['threads']} -> "
          f"{end['threads']}; zombies {len(zombies)}; orphans {figures['orphans']}; "
          f"run log folders {len(runs_running)} kept, {len(runs_after)} after shutdown; "
          f"kernel exit code {clean_exit}; {figures['ms_per_execute']} ms/execute, "
          f"{figures['ms_per_distributed_cell']} ms/distributed cell; {elapsed:.0f} s")
    if asan:
        print("  AddressSanitizer build: RSS is its allocator's (a quarantine of up to 256 MiB "
              "of freed memory, redzones, shadow), so the RSS bounds are not checked here")
    print(f"  left in TMPDIR after shutdown: "
          f"{[str(p.relative_to(tmpdir)) for p in sorted(tmpdir.iterdir())]} holding "
          f"{len(runs_after)} run folders, {figures['files_after_shutdown']} files")
    if os.environ.get("DISTKERNEL_FIGURES_DIR"):
        out = pathlib.Path(os.environ["DISTKERNEL_FIGURES_DIR"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "soak.json").write_text(json.dumps(figures, indent=1) + "\n")

    assert client.strays == [], f"iopub messages that arrived after their cell was idle: {client.strays[:10]}"
    assert end["fds"] <= warm["fds"] + FD_SLACK, (
        f"open descriptors grew from {warm['fds']} after warm-up to {end['fds']}: "
        f"{(end['fds'] - warm['fds']) / (EXECUTES + CELLS):.4f} per cell")
    assert end["threads"] == warm["threads"], (
        f"threads went from {warm['threads']} after warm-up to {end['threads']}")
    if not asan:
        assert growth < RSS_BOUND_MIB, (
            f"RSS grew by {growth:.1f} MiB (bound {RSS_BOUND_MIB}): {samples}")
        assert second <= 1.5 * first + 4, (
            f"RSS grew faster in the second half ({second:+.1f} MiB) than in the first "
            f"({first:+.1f} MiB): an accelerating leak? {samples}")
    assert zombies == [] and left == [], f"left under the kernel: zombies {zombies}, {left}"
    assert orphans_running == [], f"processes of the kernel's runs outside it: {orphans_running}"
    assert unexpected_running == [], f"files in TMPDIR other than the kept rank logs: {unexpected_running}"
    # One file per distinct cell source at most (the soak's cells repeat).
    executed = EXECUTES + warm_executes + CELLS + len(warm_cells)
    assert 0 < len(cell_files) <= executed, (len(cell_files), executed)
    assert incomplete == [], f"kept run folders without both rank logs, or with files beyond them, stacks.txt, ranks.txt and error.txt: {incomplete}"
    expected_runs = list(range(runs_started - KEEP_RUNS + 1, runs_started + 1))
    assert sorted(map(run_number, runs_running)) == expected_runs, (
        f"the kept log folders are not those of the last {KEEP_RUNS} runs of "
        f"{runs_started} ({warm_runs} in warm-up): {[r.name for r in runs_running]}")
    assert clean_exit == 0, f"the kernel did not exit cleanly on shutdown_request: {clean_exit}"
    assert orphans_after == [], f"processes of the kernel's runs left after it exited: {orphans_after}"
    assert unexpected_after == [], (
        f"files in TMPDIR after shutdown other than the kept rank logs: {unexpected_after}")
    assert set(runs_after) <= set(runs_running), (
        f"run folders after shutdown that were not kept before: {runs_after}")
