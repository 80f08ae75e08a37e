"""Started ranks: `%distributed start|status|stop|restart`, and cells and
.distributed() calls that run on ranks kept between cells.

Each test starts its own ranks (gloo on CPU, num_processes=2) and stops them;
after each, no rank of the kernel may remain. Timing is asserted only as the
bounds the issue sets for ending ranks.
"""
import os
import re
import signal
import time

import pytest

import support
from support import NoReply

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%distributed is distkernel's")

RUN = 120        # seconds a cell that starts ranks may take on a busy machine
END_WITHIN = 10  # the bound for ending every rank

PIDS = "%%distributed\nimport os\nos.getpid()"


def tb(r):
    return "\n".join(r.content.get("traceback", []))


def rank_values(r):
    """{rank: text} from a cell's result "rank 0: ...\\nrank 1: ..."."""
    assert r.status == "ok", r.describe()
    return {int(m.group(1)): m.group(2) for m in re.finditer(r"^rank (\d+): (.*)$", r.result, re.M)}


def pids_of(kernel):
    r = kernel.execute(PIDS, timeout=RUN)
    pids = {rank: int(v) for rank, v in rank_values(r).items()}
    assert len(pids) == 2, r.describe()
    return pids


def pids_from_status(kernel):
    """The started ranks' PIDs as `%distributed status` lists them: no cell
    runs on them, so an idle timer is not reset."""
    r = kernel.execute("%distributed status")
    pids = {int(m.group(1)): int(m.group(2))
            for m in re.finditer(r"rank (\d+) pid (\d+)", r.stdout)}
    assert len(pids) == 2, r.describe()
    return pids


def start(kernel, options="num_processes=2"):
    r = kernel.execute(f"%distributed start {options}", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "started 2 CPU ranks" in r.stdout, r.describe()
    return r


@pytest.fixture(scope="module")
def kernel(kernelspec_installed):
    k = support.Kernel.start()
    yield k
    k.stop()


@pytest.fixture
def started(kernel):
    start(kernel)
    yield kernel
    kernel.execute("%distributed stop", timeout=RUN)
    assert support.wait_no_descendants(kernel.pid, timeout=END_WITHIN) == []


def assert_gone_then_fresh(kernel, pids):
    """The ranks are gone; the next cell says so and how to start them; the one
    after runs as a fresh run."""
    assert support.wait_gone(list(pids), timeout=END_WITHIN) == [], pids
    r = kernel.execute("%%distributed\n1", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "the started ranks are gone" in r.content["evalue"], r.describe()
    assert "%distributed start num_processes=2" in r.content["evalue"], r.describe()
    r = kernel.execute("%%distributed num_processes=2\nimport os\nint(os.environ['RANK'])",
                       timeout=RUN)
    assert r.result == "rank 0: 0\nrank 1: 1", r.describe()
    assert support.wait_no_descendants(kernel.pid, timeout=END_WITHIN) == []


# -- state ------------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_globals_and_process_group_are_kept_across_cells_on_the_same_pids(started):
    k = started
    pids = pids_of(k)
    r = k.execute("%%distributed\nimport torch, torch.distributed as dist\n"
                  "dist.init_process_group('gloo')\n"
                  "t = torch.ones(1) * (dist.get_rank() + 1)\nprint('made t', flush=True)",
                  timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "[rank 0] made t" in r.stdout and "[rank 1] made t" in r.stdout, r.describe()
    # Notebook names are still sent each time, next to what the ranks kept.
    k.execute("offset = 100")
    r = k.execute("%%distributed\ndist.all_reduce(t)\nint(t.item()) + offset", timeout=RUN)
    assert rank_values(r) == {0: "103", 1: "103"}, r.describe()
    assert pids_of(k) == pids
    # A cell has its own log folder and status display.
    r1 = k.execute("%%distributed\nprint('cell one')", timeout=RUN)
    r2 = k.execute("%%distributed\nprint('cell two')", timeout=RUN)
    d1, d2 = support.log_dir(r1), support.log_dir(r2)
    assert d1 != d2, (d1, d2)
    assert "cell one" in open(os.path.join(d1, "rank-0.log")).read()
    assert "cell two" in open(os.path.join(d2, "rank-1.log")).read()
    assert "cell one" not in open(os.path.join(d2, "rank-0.log")).read()


LATE = ("%%distributed\nimport threading, time\n"
        "def late():\n"
        "    end = time.time() + 3\n"
        "    i = 0\n"
        "    while time.time() < end:\n"
        "        print(f'late {i}', flush=True)\n"
        "        i += 1\n"
        "        time.sleep(0.001)\n"
        "threading.Thread(target=late, daemon=True).start()\n"
        "time.sleep(0.2)\nprint('last line', flush=True)\n'done'")


@pytest.mark.timeout(300)
def test_output_a_rank_thread_writes_after_the_cell_ends_is_not_shown_after_its_result(started):
    k = started
    for _ in range(3):
        r = k.execute(LATE, timeout=RUN)
        assert r.status == "ok", r.describe()
        assert "[rank 0] last line" in r.stdout, r.describe()
        at = next(i for i, m in enumerate(r.messages) if m["msg_type"] == "execute_result")
        after = [m["content"]["text"] for m in r.messages[at:] if m["msg_type"] == "stream"]
        assert not [t for t in after if "late" in t], r.describe()
        time.sleep(3.5)     # the thread ends; what it wrote between cells is in the logs
        r = k.execute("%%distributed\nprint('next cell')", timeout=RUN)
        assert r.status == "ok" and "late" not in r.stdout, r.describe()


@pytest.mark.timeout(300)
def test_another_thread_cannot_use_or_stop_the_ranks_while_a_cell_runs_on_them(started,
                                                                                 tmp_path):
    k = started
    pids = pids_of(k)
    marks = str(tmp_path)
    # A thread of the kernel waits until the cell below runs on the ranks, then
    # tries a .distributed() call, %distributed stop and restart, and says so.
    r = k.execute(
        "import os, threading, time\nfrom distkernel import distributed\n"
        "@distributed()\ndef other():\n    return 'other'\n"
        "tried = {}\n"
        "def meddle():\n"
        f"    while not os.path.exists({marks!r} + '/in'):\n"
        "        time.sleep(0.05)\n"
        "    for what, call in (('call', other.distributed),\n"
        "                       ('stop', lambda: get_ipython().run_line_magic('distributed', 'stop')),\n"
        "                       ('restart', lambda: get_ipython().run_line_magic('distributed', 'restart'))):\n"
        "        try:\n"
        "            tried[what] = repr(call())\n"
        "        except BaseException as e:\n"
        "            tried[what] = f'{type(e).__name__}: {e}'\n"
        f"    open({marks!r} + '/out', 'w').close()\n"
        "threading.Thread(target=meddle, daemon=True).start()")
    assert r.status == "ok", r.describe()
    r = k.execute(
        "%%distributed\nimport os, time\nprint('cell begins', flush=True)\n"
        f"if int(os.environ['RANK']) == 0:\n    open({marks!r} + '/in', 'w').close()\n"
        "deadline = time.time() + 60\n"
        f"while not os.path.exists({marks!r} + '/out') and time.time() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print('cell ends', flush=True)\nos.path.exists(" + repr(marks) + " + '/out')",
        timeout=RUN)
    assert rank_values(r) == {0: "True", 1: "True"}, r.describe()
    assert "[rank 0] cell begins" in r.stdout and "[rank 1] cell ends" in r.stdout, r.describe()
    r = k.execute("print(tried)")
    for what in ("call", "stop", "restart"):
        assert f"'{what}': 'RuntimeError: " in r.stdout, r.describe()
    assert r.stdout.count("a cell is running on the started ranks; wait for it or interrupt it") \
        == 3, r.describe()
    # The ranks are the same and still serve cells.
    assert pids_of(k) == pids


@pytest.mark.timeout(300)
def test_another_thread_cannot_start_stop_or_run_while_ranks_are_being_started(kernel):
    # A thread of the kernel waits until the start below has forked its ranks,
    # then tries what would race with it (a second pool, freeing one not yet set).
    r = kernel.execute(
        "import threading, time, psutil\nfrom distkernel import distributed\n"
        "@distributed(num_processes=2)\ndef other():\n    return 'other'\n"
        "tried = {}\n"
        "def meddle():\n"
        "    me = psutil.Process()\n"
        "    while not any('distkernel-rank' in ' '.join(c.cmdline()) for c in me.children()):\n"
        "        time.sleep(0.005)\n"
        "    magic = get_ipython().run_line_magic\n"
        "    for what, call in (('start', lambda: magic('distributed', 'start num_processes=2')),\n"
        "                       ('stop', lambda: magic('distributed', 'stop')),\n"
        "                       ('restart', lambda: magic('distributed', 'restart')),\n"
        "                       ('call', other.distributed)):\n"
        "        try:\n"
        "            tried[what] = repr(call())\n"
        "        except BaseException as e:\n"
        "            tried[what] = f'{type(e).__name__}: {e}'\n"
        "meddler = threading.Thread(target=meddle, daemon=True)\nmeddler.start()")
    assert r.status == "ok", r.describe()
    try:
        start(kernel)
        r = kernel.execute("meddler.join(60)\nprint(tried)")
        for what in ("start", "stop", "restart", "call"):
            assert f"'{what}': 'RuntimeError: " in r.stdout, r.describe()
        assert r.stdout.count("ranks are being started by `%distributed start`; wait for it") \
            == 4, r.describe()
        assert len(pids_from_status(kernel)) == 2
    finally:
        kernel.execute("%distributed stop", timeout=RUN)
    assert support.wait_no_descendants(kernel.pid, timeout=END_WITHIN) == []


@pytest.mark.timeout(300)
def test_a_distributed_function_runs_on_the_started_ranks(started):
    k = started
    pids = pids_of(k)
    r = k.execute("from distkernel import distributed\n"
                  "@distributed()\ndef pid():\n    import os\n    return os.getpid()\n"
                  "sorted(pid.distributed())", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert r.result == repr(sorted(pids.values())), r.describe()
    # It shares the ranks' globals with the cells.
    r = k.execute("%%distributed\nfrom_cell = 7", timeout=RUN)
    assert r.status == "ok", r.describe()
    r = k.execute("@distributed()\ndef bump(by):\n    global from_cell, from_call\n"
                  "    from_call = from_cell + by\n    return from_call\n"
                  "bump.distributed(3)", timeout=RUN)
    assert r.status == "ok" and "[10, 10]" in r.result, r.describe()
    r = k.execute("%%distributed\nfrom_call", timeout=RUN)
    assert rank_values(r) == {0: "10", 1: "10"}, r.describe()
    r = k.execute("pid2 = distributed(num_processes=3)(pid)\npid2.distributed()", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "%distributed stop" in r.content["evalue"], r.describe()


@pytest.mark.timeout(300)
def test_another_size_while_started_is_a_clear_error_and_changes_nothing(started):
    k = started
    pids = pids_of(k)
    r = k.execute("%%distributed num_processes=3\n1", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "%distributed stop" in r.content["evalue"], r.describe()
    assert "num_processes=3" in r.content["evalue"], r.describe()
    # The same size, said again, is fine.
    r = k.execute("%%distributed num_processes=2\nimport os\nos.getpid()", timeout=RUN)
    assert {int(v) for v in rank_values(r).values()} == set(pids.values()), r.describe()
    r = k.execute("%distributed start num_processes=2", timeout=RUN)
    assert r.status == "error" and "already started" in r.content["evalue"], r.describe()
    # Where the ranks run is part of their size: other nodes or another
    # launcher are refused too, not run here as if not given.
    for other in ("nodes=2", "launcher=slurm", "nodes=2 launcher=slurm"):
        r = k.execute(f"%%distributed {other}\n1", timeout=RUN)
        assert r.status == "error", r.describe()
        assert "another size" in r.content["evalue"], r.describe()
        assert other in r.content["evalue"] and "%distributed stop" in r.content["evalue"], \
            r.describe()
    r = k.execute("%%distributed nodes=1 launcher=local\nimport os\nos.getpid()", timeout=RUN)
    assert {int(v) for v in rank_values(r).values()} == set(pids.values()), r.describe()
    # The logs' cap is the start's: a cell's own is refused, not ignored.
    r = k.execute("%%distributed log_cap=1M\n1", timeout=RUN)
    assert r.status == "error" and "log_cap= is set when the ranks start" in r.content["evalue"], \
        r.describe()
    assert pids_of(k) == pids


@pytest.mark.timeout(300)
def test_restart_starts_the_ranks_with_every_start_option_however_long(kernel):
    # Over a kilobyte of options: restart and the messages keep all of them.
    options = ("num_processes=2 experiment=" + "e" * 200 + " run_name=" + "r" * 200 +
               " " * 700 + " result=kept_name")
    r = kernel.execute(f"%distributed start {options}", timeout=RUN)
    try:
        assert r.status == "ok" and "started 2 CPU ranks" in r.stdout, r.describe()
        for _ in range(2):
            kernel.execute("kept_name = None")
            r = kernel.execute("%%distributed\nimport os\nint(os.environ['RANK']) + 40",
                               timeout=RUN)
            assert r.status == "ok", r.describe()
            r = kernel.execute("print(kept_name)")
            assert r.stdout.strip() == "[40, 41]", r.describe()
            r = kernel.execute("%distributed restart", timeout=RUN)
            assert r.status == "ok" and "started 2 CPU ranks" in r.stdout, r.describe()
        # The message of ranks that are gone names them all too.
        pids = list(pids_from_status(kernel).values())
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass    # ended by distkernel already, after its peer's SIGKILL
        assert support.wait_gone(pids, timeout=END_WITHIN) == []
        r = kernel.execute("%%distributed\n1", timeout=RUN)
        assert r.status == "error" and "result=kept_name`" in r.content["evalue"], \
            r.describe()
    finally:
        kernel.execute("%distributed stop", timeout=RUN)
    assert support.wait_no_descendants(kernel.pid, timeout=END_WITHIN) == []


@pytest.mark.timeout(300)
def test_the_start_options_are_the_defaults_of_each_cell(kernel):
    start(kernel, "num_processes=2 output=rank0 timeout=15")
    try:
        r = kernel.execute("%%distributed\nimport os\nprint('from', os.environ['RANK'])",
                           timeout=RUN)
        assert "[rank 0] from 0" in r.stdout and "from 1" not in r.stdout, r.describe()
        r = kernel.execute("%%distributed output=all\nimport os\nprint('from', os.environ['RANK'])",
                           timeout=RUN)
        assert "[rank 1] from 1" in r.stdout, r.describe()
        r = kernel.execute("%%distributed\nimport time\ntime.sleep(60)", timeout=RUN)
        assert r.content.get("ename") == "TimeoutError", r.describe()
        assert "timeout=15 s" in r.content["evalue"], r.describe()
    finally:
        kernel.execute("%distributed stop", timeout=RUN)
    assert support.wait_no_descendants(kernel.pid, timeout=END_WITHIN) == []


@pytest.mark.timeout(300)
def test_a_cells_list_of_ranks_is_checked_against_the_started_ranks_which_stay(started):
    k = started
    pids = pids_of(k)
    r = k.execute("%%distributed output=1\nimport os\nprint('from', os.environ['RANK'])",
                  timeout=RUN)
    assert r.status == "ok", r.describe()
    assert support.rank_lines(r.stdout) == {1: ["from 1"]}, r.describe()
    r = k.execute("%%distributed output=0,2\n1", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "output=0,2: rank 2 is not in this run (its 2 ranks are 0-1)" in r.content["evalue"], \
        r.describe()
    assert pids_of(k) == pids


@pytest.mark.timeout(300)
def test_the_status_of_ten_started_ranks_counts_them_and_says_whose_output_is_shown(kernel):
    # Past 8 ranks the status counts them (at a thousand, a word per rank
    # would not read), within 12 lines; it says whose output a cell shows.
    r = kernel.execute("%distributed start num_processes=10 output=0,8-9", timeout=RUN)
    assert r.status == "ok" and "started 10 CPU ranks" in r.stdout, r.describe()
    try:
        r = kernel.execute("%distributed status")
        lines = r.stdout.rstrip("\n").splitlines()
        head = [i for i, line in enumerate(lines) if line.startswith("started ranks ")]
        assert len(head) == 1 and "10 CPU ranks" in lines[head[0]], r.stdout
        status = lines[head[0]:]
        assert len(status) <= 12, r.stdout
        assert status[1:] == ["  10 ranks: 10 idle",
                              "  output shown: ranks 0, 8\u20139 (all in the logs)"], r.stdout
        # A cell's own status says it too, and the cell shows those ranks only.
        r = kernel.execute("%%distributed\nimport os\nprint('from', os.environ['RANK'])",
                           timeout=RUN)
        assert sorted(support.rank_lines(r.stdout)) == [0, 8, 9], r.describe()
        last = support.status_displays(r)[-1]["content"]["data"]["text/plain"].splitlines()
        assert last[1:3] == ["  10 ranks: 10 done",
                             "  output shown: ranks 0, 8\u20139 (all in the logs)"], last
        # Past 8 ranks, ranks with the same value share its line; the list
        # keeps every value in rank order.
        r = kernel.execute("%%distributed result=mods\nimport os\nint(os.environ['RANK']) % 3",
                           timeout=RUN)
        assert r.result == ("ranks 0, 3, 6, 9 (4): 0\nranks 1, 4, 7 (3): 1\n"
                            "ranks 2, 5, 8 (3): 2"), r.describe()
        assert kernel.execute("mods").result == "[0, 1, 2, 0, 1, 2, 0, 1, 2, 0]"
    finally:
        kernel.execute("%distributed stop", timeout=RUN)
    assert support.wait_no_descendants(kernel.pid, timeout=END_WITHIN) == []


# -- failures -----------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_an_exception_shows_its_root_cause_and_keeps_the_ranks(started):
    k = started
    pids = pids_of(k)
    k.execute("%%distributed\nkept = 'still here'", timeout=RUN)
    r = k.execute("%%distributed\nimport os\nif os.environ['RANK'] == '1':\n"
                  "    raise ValueError('boom on rank one')\n", timeout=RUN)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "ValueError", r.describe()
    assert "[rank 1] boom on rank one" in r.content["evalue"], r.describe()
    assert "raise ValueError('boom on rank one')" in tb(r), tb(r)
    r = k.execute("%%distributed\nkept", timeout=RUN)
    assert rank_values(r) == {0: "'still here'", 1: "'still here'"}, r.describe()
    assert pids_of(k) == pids


@pytest.mark.timeout(300)
def test_a_rank_that_dies_ends_all_and_the_next_cell_says_so(kernel):
    start(kernel)
    pids = pids_of(kernel)
    r = kernel.execute("%%distributed\nimport os, time\nif os.environ['RANK'] == '1':\n"
                       "    os._exit(3)\ntime.sleep(60)\n", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "rank 1" in r.content["evalue"] and "code 3" in r.content["evalue"], r.describe()
    assert "The started ranks have ended" in tb(r), tb(r)
    assert_gone_then_fresh(kernel, pids.values())


@pytest.mark.timeout(300)
def status_once_recorded(kernel, text):
    """`%distributed status` once it says TEXT (or after END_WITHIN s). Ranks
    are gone as processes a moment before the kernel has collected them and
    recorded why: on a busy machine, long enough for a status to fall in
    between and still list them."""
    deadline = time.monotonic() + END_WITHIN
    while True:
        r = kernel.execute("%distributed status")
        if text in r.stdout or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def test_a_rank_killed_between_cells_is_reported_by_the_next_cell(kernel):
    start(kernel)
    pids = pids_of(kernel)
    os.kill(pids[0], signal.SIGKILL)
    assert support.wait_gone(list(pids.values()), timeout=END_WITHIN) == []
    r = status_once_recorded(kernel, "gone")
    assert "gone" in r.stdout and "rank 0 was killed by signal 9" in r.stdout, r.describe()
    assert_gone_then_fresh(kernel, pids.values())


def interrupt_after(kernel, code, marker):
    msg_id = kernel.start_execute(code)
    kernel.wait_iopub(lambda m: m["msg_type"] == "stream" and
                      m["parent_header"].get("msg_id") == msg_id and
                      marker in m["content"]["text"], timeout=RUN)
    time.sleep(0.3)
    kernel.km.interrupt_kernel()
    try:
        reply = kernel.reply(msg_id, timeout=END_WITHIN)
    except NoReply:
        kernel.restart_now()
        pytest.fail(f"the cell still ran {END_WITHIN} s after the interrupt")
    return kernel.finish(msg_id, reply=reply)


@pytest.mark.timeout(300)
def test_interrupt_raises_keyboardinterrupt_in_a_busy_loop_and_keeps_the_ranks(started):
    k = started
    pids = pids_of(k)
    r = interrupt_after(k, "%%distributed\nprint('spinning', flush=True)\nn = 0\n"
                           "while True:\n    n += 1\n", "[rank 1] spinning")
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "KeyboardInterrupt", r.describe()
    assert "still running" in r.content["evalue"], r.describe()
    # The loop's variable is there, and the ranks are the same.
    r = k.execute("%%distributed\nn > 0", timeout=RUN)
    assert rank_values(r) == {0: "True", 1: "True"}, r.describe()
    assert pids_of(k) == pids


@pytest.mark.timeout(300)
def test_interrupt_of_a_rank_stuck_in_a_collective_ends_all_with_a_message(kernel):
    start(kernel)
    pids = pids_of(kernel)
    r = kernel.execute("%%distributed\nimport torch, torch.distributed as dist\n"
                       "dist.init_process_group('gloo')", timeout=RUN)
    assert r.status == "ok", r.describe()
    r = interrupt_after(kernel, "%%distributed\nimport time\nprint('in', flush=True)\n"
                                "if dist.get_rank() == 0:\n    dist.all_reduce(torch.ones(1))\n"
                                "else:\n    time.sleep(120)\n", "[rank 0] in")
    assert r.status == "error", r.describe()
    assert "did not return to the prompt" in r.stderr, r.describe()
    assert "The started ranks have ended" in tb(r), tb(r)
    assert_gone_then_fresh(kernel, pids.values())


@pytest.mark.timeout(300)
def test_an_exception_while_a_peer_waits_in_a_collective_ends_all_with_the_root_cause(kernel):
    start(kernel)
    pids = pids_of(kernel)
    r = kernel.execute("%%distributed\nimport torch, torch.distributed as dist\n"
                       "dist.init_process_group('gloo')", timeout=RUN)
    assert r.status == "ok", r.describe()
    r = kernel.execute("%%distributed\nimport time\nif dist.get_rank() == 1:\n"
                       "    time.sleep(3)\n    raise ValueError('rank one gave up')\n"
                       "dist.all_reduce(torch.ones(1))\n", timeout=RUN)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "ValueError", r.describe()
    assert "[rank 1] rank one gave up" in r.content["evalue"], r.describe()
    assert "did not return to the prompt" in r.stderr, r.describe()
    assert "The started ranks have ended" in tb(r), tb(r)
    assert_gone_then_fresh(kernel, pids.values())


@pytest.mark.timeout(300)
def test_timeout_applies_per_cell_and_keeps_the_ranks(started):
    k = started
    pids = pids_of(k)
    r = k.execute("%%distributed timeout=2\nimport time\ntime.sleep(60)", timeout=RUN)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "TimeoutError", r.describe()
    assert pids_of(k) == pids


# -- lifetime -----------------------------------------------------------------------------

@pytest.mark.timeout(300)
def test_idle_ranks_end_after_idle_timeout(kernel):
    start(kernel, "num_processes=2 idle_timeout=5")
    pids = pids_from_status(kernel)
    assert support.wait_gone(list(pids.values()), timeout=5 + END_WITHIN) == []
    r = status_once_recorded(kernel, "idle_timeout=5")
    assert "idle_timeout=5" in r.stdout, r.describe()
    assert_gone_then_fresh(kernel, pids.values())


@pytest.mark.timeout(300)
def test_status_stop_and_restart(kernel):
    r = kernel.execute("%distributed status")
    assert "no ranks are started" in r.stdout, r.describe()
    start(kernel)
    pids = pids_of(kernel)
    r = kernel.execute("%distributed status")
    for rank, pid in pids.items():
        assert f"rank {rank} pid {pid}" in r.stdout, r.describe()
    assert "2 CPU ranks" in r.stdout and "idle" in r.stdout, r.describe()
    kernel.execute("%%distributed\nmarker = 1", timeout=RUN)
    r = kernel.execute("%distributed restart", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert support.wait_gone(list(pids.values()), timeout=END_WITHIN) == []
    new = pids_of(kernel)
    assert not set(new.values()) & set(pids.values())
    r = kernel.execute("%%distributed\n'marker' in globals()", timeout=RUN)
    assert rank_values(r) == {0: "False", 1: "False"}, r.describe()
    r = kernel.execute("%distributed stop", timeout=RUN)
    assert "stopped" in r.stdout, r.describe()
    assert support.wait_gone(list(new.values()), timeout=END_WITHIN) == []
    assert support.wait_no_descendants(kernel.pid, timeout=END_WITHIN) == []
    r = kernel.execute("%distributed bogus")
    assert r.status == "error" and "usage" in r.content["evalue"], r.describe()


@pytest.mark.timeout(300)
def test_sigkill_of_the_kernel_leaves_no_started_rank(fresh_kernel):
    k = fresh_kernel
    start(k)
    pids = pids_of(k)
    os.kill(k.pid, signal.SIGKILL)
    k.process.wait(timeout=10)
    assert support.wait_gone(list(pids.values()), timeout=5) == []


@pytest.mark.timeout(300)
def test_sigkill_of_the_kernel_ends_what_the_started_ranks_started(fresh_kernel):
    k = fresh_kernel
    start(k)
    pids = pids_of(k)
    # Each rank starts a child that stays after the cell, in the rank's group.
    r = k.execute("%%distributed\nimport subprocess\n"
                  "kept = subprocess.Popen(['sleep', '300'])\nkept.pid", timeout=RUN)
    sleeps = [int(v) for v in rank_values(r).values()]
    assert len(sleeps) == 2 and support.wait_gone(sleeps, timeout=0) == sleeps, r.describe()
    procs = support.descendants(k.pid)
    everything = [p.pid for p in procs]
    assert set(sleeps) | set(pids.values()) <= set(everything), everything
    os.kill(k.pid, signal.SIGKILL)
    k.process.wait(timeout=10)
    assert support.wait_gone(everything, timeout=END_WITHIN) == [], \
        support.describe_processes(procs)


@pytest.mark.timeout(300)
def test_shutdown_ends_the_started_ranks(fresh_kernel):
    k = fresh_kernel
    start(k)
    pids = pids_of(k)
    k.km.shutdown_kernel(now=False)
    assert support.wait_gone(list(pids.values()), timeout=END_WITHIN) == []


@pytest.mark.timeout(300)
def test_a_kernel_restart_ends_the_started_ranks(fresh_kernel):
    k = fresh_kernel
    start(k)
    pids = pids_of(k)
    k.km.restart_kernel(now=False)     # a graceful restart; SIGKILL is tested above
    k.kc.wait_for_ready(timeout=30)
    assert support.wait_gone(list(pids.values()), timeout=END_WITHIN) == []
    r = k.execute("%distributed status")
    assert "no ranks are started" in r.stdout, r.describe()


@pytest.mark.timeout(300)
def test_distkernel_idle_timeout_sets_the_default_and_a_bad_value_is_an_error(kernelspec_installed):
    k = support.Kernel.start(env=support.kernel_env(DISTKERNEL_IDLE_TIMEOUT="5"))
    try:
        start(k)
        pids = pids_from_status(k)
        assert support.wait_gone(list(pids.values()), timeout=5 + END_WITHIN) == []
        k.execute("%distributed stop")
        start(k, "num_processes=2 idle_timeout=None")
        pids = pids_of(k)
        time.sleep(6)
        assert pids_of(k) == pids
        k.execute("%distributed stop", timeout=RUN)
        k.execute("import os\nos.environ['DISTKERNEL_IDLE_TIMEOUT'] = 'soon'")
        r = k.execute("%distributed start num_processes=2", timeout=RUN)
        assert r.status == "error" and "DISTKERNEL_IDLE_TIMEOUT" in r.content["evalue"], \
            r.describe()
        assert support.wait_no_descendants(k.pid, timeout=END_WITHIN) == []
    finally:
        k.stop()
