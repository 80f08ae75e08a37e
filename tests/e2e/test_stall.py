"""Where silent ranks are, live: once no rank has printed for stall_after
seconds, the run's status display shows the ranks grouped by stack, the odd
one out first, sampled every few seconds, and drops them as soon as a rank
prints again (distributed/dk_dist_stall.h). stall_after=0 turns it off; a bad
value, in the cell or in DISTKERNEL_STALL_AFTER, is an error that names it.

The ranks wait for files the test makes, so each phase lasts until the test
has seen what it waits for, never a fixed time.
"""
import time

import pytest

import support

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%%distributed is distkernel's")

RUN = 120           # seconds a cell that starts ranks may take on a busy machine
WHERE = "where the ranks are:"

# Rank 1 polls for GO (cell line 6) while rank 0 waits for it in a gloo
# all_reduce (line 10); then rank 1 prints every 0.2 s until DONE exists.
# A sample in torch's rendezvous can fail it (EINTR, runtime/dk_rankstacks.c):
# the line before it prints, so the silence starts after the rendezvous.
WAITING = """%%distributed num_processes=2 {opts}
import os, time, torch, torch.distributed as dist
print("joining", flush=True); dist.is_initialized() or dist.init_process_group("gloo")
print("here", flush=True)
if dist.get_rank() == 1:
    while not os.path.exists({go!r}): time.sleep(0.05)
    while not os.path.exists({done!r}):
        print("tick", flush=True)
        time.sleep(0.2)
dist.all_reduce(torch.ones(1))
"""


def statuses(kernel, msg_id):
    """The status display's texts of MSG_ID received so far, with their times."""
    return [(m["received_at"], m["content"]["data"]["text/plain"])
            for m in kernel.iopub_for(msg_id)
            if m["msg_type"] in ("display_data", "update_display_data")
            and m["content"]["data"].get("text/plain", "").startswith("distributed:")]


def printed(kernel, msg_id, text):
    return any(text in m["content"]["text"] for m in kernel.iopub_for(msg_id)
               if m["msg_type"] == "stream")


def wait_status(kernel, msg_id, predicate, timeout=RUN):
    """The first status text of MSG_ID for which PREDICATE(received_at, text) holds."""
    deadline = time.monotonic() + timeout
    while True:
        for at, text in statuses(kernel, msg_id):
            if predicate(at, text):
                return text
        assert time.monotonic() < deadline, statuses(kernel, msg_id)[-3:]
        kernel.pump_iopub(min(1.0, max(deadline - time.monotonic(), 0)))


def group_line(text, rank):
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(f"rank {rank}:")]
    assert len(lines) == 1, text
    return lines[0]


def run_waiting(kernel, tmp_path, opts):
    go, done = tmp_path / "go", tmp_path / "done"
    msg_id = kernel.start_execute(WAITING.format(opts=opts, go=str(go), done=str(done)))
    return msg_id, go, done


def the_groups_show_and_clear(kernel, msg_id, go, done):
    """The status shows rank 1 polling and rank 0 in all_reduce; once rank 1
    prints, a status without them follows while the ranks still run."""
    shown = wait_status(kernel, msg_id, lambda _at, t: WHERE in t and "all_reduce" in t)
    lines = shown.splitlines()
    at = next(i for i, line in enumerate(lines) if WHERE in line)
    assert lines[at].strip().startswith("silent "), shown
    assert len(lines) <= 12, shown
    assert "torch.distributed.all_reduce" in group_line(shown, 0), shown
    assert "(cell line 10: dist.all_reduce(torch.ones(1)))" in group_line(shown, 0), shown
    assert "cell line 6: while not os.path.exists(" in group_line(shown, 1), shown
    assert lines[-1].strip().startswith("logs: "), shown   # the logs line stays last
    go.touch()
    deadline = time.monotonic() + RUN
    while not printed(kernel, msg_id, "[rank 1] tick"):
        assert time.monotonic() < deadline, "rank 1 never printed"
        kernel.pump_iopub(0.2)
    since = time.monotonic()
    cleared = wait_status(kernel, msg_id, lambda at, t: at >= since and WHERE not in t)
    assert "running" in cleared and "finished" not in cleared, cleared
    done.touch()
    r = kernel.finish(msg_id, timeout=RUN)
    assert r.status == "ok", r.describe()
    return r


@pytest.mark.timeout(240)
def test_silent_ranks_show_where_they_are_until_a_rank_prints(kernel, tmp_path):
    msg_id, go, done = run_waiting(kernel, tmp_path, "stall_after=3")
    the_groups_show_and_clear(kernel, msg_id, go, done)


@pytest.mark.timeout(300)
def test_started_ranks_show_where_they_are_too(kernel, tmp_path):
    r = kernel.execute("%distributed start num_processes=2 stall_after=3", timeout=RUN)
    assert r.status == "ok", r.describe()
    try:
        # The process group first, in a cell of its own, which the ranks keep.
        r = kernel.execute("%%distributed stall_after=0\nimport torch.distributed as dist\n"
                           "dist.init_process_group('gloo')", timeout=RUN)
        assert r.status == "ok", r.describe()
        code = WAITING.replace("%%distributed num_processes=2 {opts}", "%%distributed")
        go, done = tmp_path / "go", tmp_path / "done"
        msg_id = kernel.start_execute(code.format(go=str(go), done=str(done)))
        the_groups_show_and_clear(kernel, msg_id, go, done)
    finally:
        kernel.execute("%distributed stop", timeout=RUN)


@pytest.mark.timeout(240)
def test_stall_after_0_samples_nothing(kernel, tmp_path):
    # The variable would sample after 1 s; the cell's 0 turns it off.
    r = kernel.execute("%env DISTKERNEL_STALL_AFTER=1")
    assert r.status == "ok", r.describe()
    try:
        msg_id, go, done = run_waiting(kernel, tmp_path, "stall_after=0")
        deadline = time.monotonic() + RUN
        while not printed(kernel, msg_id, "[rank 1] here"):
            assert time.monotonic() < deadline, "the ranks never started"
            kernel.pump_iopub(0.2)
        since = time.monotonic()
        # Three refreshes a second or more apart: silent for 2 s and more.
        wait_status(kernel, msg_id, lambda at, _t: at >= since + 3)
        assert not any(WHERE in t for _at, t in statuses(kernel, msg_id))
        go.touch()
        done.touch()
        r = kernel.finish(msg_id, timeout=RUN)
        assert r.status == "ok", r.describe()
        assert not any(WHERE in t for _at, t in statuses(kernel, msg_id))
    finally:
        kernel.execute("%env DISTKERNEL_STALL_AFTER=")


@pytest.mark.timeout(120)
def test_a_bad_stall_after_is_an_error_naming_it_and_the_kernel_serves_on(kernel):
    r = kernel.execute("%%distributed num_processes=2 stall_after=-5\nprint('never')")
    assert r.content["ename"] == "ValueError", r.describe()
    assert "stall_after" in r.content["evalue"] and "0 or more" in r.content["evalue"], \
        r.content["evalue"]
    r = kernel.execute("%env DISTKERNEL_STALL_AFTER=soon")
    try:
        r = kernel.execute("%%distributed num_processes=2\nprint('never')")
        assert r.content["ename"] == "ValueError", r.describe()
        assert "DISTKERNEL_STALL_AFTER" in r.content["evalue"], r.content["evalue"]
        assert "'soon'" in r.content["evalue"], r.content["evalue"]
    finally:
        kernel.execute("%env DISTKERNEL_STALL_AFTER=")
    r = kernel.execute("6 * 7")
    assert r.status == "ok" and r.result == "42", r.describe()


# Ranks 1 and 2 wait in torch's rendezvous for rank 0, the store's host,
# which waits for GO: they try to connect to it again and again.
RENDEZVOUS = """%%distributed num_processes=3 stall_after=1
import os, time, torch, torch.distributed as dist
if os.environ["RANK"] == "0":
    while not os.path.exists({go!r}): time.sleep(0.05)
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
print("joined", flush=True)
"""


@pytest.mark.timeout(240)
def test_samples_do_not_break_a_rendezvous_they_land_in(kernel, tmp_path):
    # A sample is a signal; one that a rank's thread took would make torch's
    # rendezvous fail with "Interrupted system call". The ranks block it and a
    # thread of their own takes it (runtime/stacks/dk_stackreq.h). Sampled
    # every 0.1 s here: some 30 samples land in the rendezvous of ranks 1
    # and 2. torch 1.13 waits there holding the GIL, so a sample, which needs
    # it, finds no Python stack for them; rank 0's is in the cell.
    r = kernel.execute("%env DISTKERNEL_STALL_EVERY=0.1")
    assert r.status == "ok", r.describe()
    try:
        go = tmp_path / "go"
        msg_id = kernel.start_execute(RENDEZVOUS.format(go=str(go)))
        shown = wait_status(kernel, msg_id, lambda _at, t: WHERE in t and "cell line 4" in t)
        assert "cell line 4" in group_line(shown, 0), shown
        since = time.monotonic()
        wait_status(kernel, msg_id, lambda at, t: at >= since + 3 and WHERE in t)
        go.touch()
        r = kernel.finish(msg_id, timeout=RUN)
        assert r.status == "ok", r.describe()
        for rank in range(3):
            assert f"[rank {rank}] joined" in r.stdout, r.describe()
    finally:
        kernel.execute("%env DISTKERNEL_STALL_EVERY=")
