"""Where the ranks were: a run that did not end by itself says, in its error,
where each live rank's Python stack was when it was ended, ranks with the same
stack grouped, the odd one out first, library frames folded to the call the
user made and cell frames shown as the cell's lines; every dump is in
stacks.txt in the run's log folder (runtime/stacks/dk_stackreq.h, dk_stacks.h).

One node, a few ranks. The ranks say when they are where the test wants them
(a line printed just before), and the test waits for those lines; the sleep or
collective after them is what is caught.
"""
import re
import shutil
import subprocess

import pytest

import support

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%%distributed is distkernel's")

RUN = 120           # seconds a cell that starts ranks may take on a busy machine
HEADING = "Where the ranks were:"


def where(r):
    """The summary lines of R's error under its heading, and the stacks file's line."""
    tb = r.content.get("traceback", [])
    assert HEADING in tb, "\n".join(tb)
    lines = tb[tb.index(HEADING) + 1:]
    end = next(i for i, line in enumerate(lines) if not line.startswith("  "))
    return lines[:end], lines[end]


def text(r):
    return r.content.get("ename", "") + ": " + r.content.get("evalue", "") + "\n" + \
        "\n".join(r.content.get("traceback", []))


def group(lines, ranks):
    """The summary line of the group of RANKS ("rank 1:", "ranks 0, 2 (2):")."""
    head = f"rank {ranks[0]}:" if len(ranks) == 1 else \
        "ranks " + ", ".join(map(str, ranks)) + f" ({len(ranks)}):"
    found = [line for line in lines if line.strip().startswith(head)]
    assert len(found) == 1, (head, lines)
    return found[0]


def stacks_file(r, world):
    """stacks.txt, named in the error, holding every rank of WORLD."""
    _, named = where(r)
    m = re.fullmatch(r"Every rank's stacks, in full: (\S+)", named)
    assert m, named
    path = support.log_dir(r) / "stacks.txt"
    assert m.group(1) == str(path), (named, path)
    text = path.read_text()
    for rank in range(world):
        assert re.search(rf"^--- rank {rank} on ", text, re.M), text
    return text


# Rank 1 sleeps while the others wait for it in a gloo all_reduce.
ASLEEP = """%%distributed num_processes=3{opts}
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
print("here", flush=True)
if dist.get_rank() == 1:
    time.sleep(600)
dist.all_reduce(torch.ones(1))
"""


def assert_asleep_and_waiting(r):
    lines, _ = where(r)
    assert len(lines) == 2, lines
    assert lines[0].strip().startswith("rank 1:"), lines     # the odd one out first
    assert "cell line 6" in group(lines, [1]), lines
    waiting = group(lines, [0, 2])
    assert "torch.distributed.all_reduce" in waiting and "cell line 7" in waiting, lines
    # torch imported, but a gloo group: no last collective (_flight.py).
    assert not any(" last " in line for line in lines), lines
    assert "distkernel flight:" not in stacks_file(r, 3)


@pytest.mark.timeout(240)
def test_a_timeout_says_where_every_rank_was(kernel):
    # Warm ranks are at their lines within a few seconds even on a busy
    # machine; the timeout is what the test waits for, so it is short.
    r = kernel.execute(ASLEEP.format(opts=" timeout=15"), timeout=RUN)
    assert r.content["ename"] == "TimeoutError", text(r)
    tb = r.content["traceback"]
    assert tb[1] == HEADING, text(r)      # right after the headline
    assert_asleep_and_waiting(r)


def seen(kernel, msg_id, texts):
    """Wait until every one of TEXTS was in MSG_ID's streams."""
    def all_in(_m):
        out = "".join(m["content"]["text"] for m in kernel.iopub_for(msg_id)
                      if m["msg_type"] == "stream")
        return all(t in out for t in texts)
    kernel.wait_iopub(lambda m: m["parent_header"].get("msg_id") == msg_id and all_in(m),
                      timeout=RUN)


def interrupted(kernel, code, texts):
    """Run CODE, interrupt it once TEXTS were printed; its execution."""
    msg_id = kernel.start_execute(code)
    seen(kernel, msg_id, texts)
    kernel.km.interrupt_kernel()
    return kernel.finish(msg_id, timeout=RUN)


HERE = [f"[rank {n}] here" for n in range(3)]


@pytest.mark.timeout(240)
def test_an_interrupt_says_where_every_rank_was(kernel):
    r = interrupted(kernel, ASLEEP.format(opts=""), HERE)
    assert r.content["ename"] == "KeyboardInterrupt", text(r)
    assert_asleep_and_waiting(r)


@pytest.mark.timeout(240)
def test_a_rank_that_raised_is_not_asked_and_the_others_are_shown_waiting(kernel, tmp_path):
    # Rank 1 raises once ranks 0 and 2 are on their way into their wait (the
    # test makes GO when they have said so), not while one of them may still
    # be in init_process_group. They wait on the run's store, which rank 0
    # serves: in a gloo barrier they would be woken by an error as soon as
    # rank 1's process ends and its connections close, and one could then be
    # caught on its way out of the cell instead.
    go = tmp_path / "go"
    msg_id = kernel.start_execute(f"""%%distributed num_processes=3
import os, time, torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    while not os.path.exists({str(go)!r}): time.sleep(0.05)
    raise ValueError("rank one gives up")
print("waiting", flush=True); dist.distributed_c10d._get_default_store().wait(["never set"])
""")
    seen(kernel, msg_id, ["[rank 0] waiting", "[rank 2] waiting"])
    go.touch()
    r = kernel.finish(msg_id, timeout=RUN)
    assert r.content["ename"] == "ValueError", text(r)
    lines, _ = where(r)
    assert len(lines) == 1, lines
    assert "cell line 7" in group(lines, [0, 2]), lines
    # The root cause's own traceback follows, as before.
    tb = r.content["traceback"]
    assert "Rank 1 failed first (root cause):" in tb[tb.index(HEADING):], text(r)
    stacks = stacks_file(r, 0)
    assert "--- rank 1 " not in stacks, stacks


SPIN_C = "void spin(void) { for (volatile unsigned long i = 0;; i++) ; }\n"


@pytest.mark.timeout(240)
@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler for the spinning loop")
def test_a_rank_holding_the_gil_in_a_c_loop_answers(kernel, tmp_path):
    (tmp_path / "spin.c").write_text(SPIN_C)
    lib = tmp_path / "spin.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-o", str(lib), str(tmp_path / "spin.c")],
                   check=True)
    # ctypes.PyDLL keeps the GIL through the call (CDLL would release it).
    r = interrupted(kernel, f"""%%distributed num_processes=3
import ctypes, torch, torch.distributed as dist
dist.init_process_group("gloo")
print("here", flush=True)
if dist.get_rank() == 1:
    ctypes.PyDLL({str(lib)!r}).spin()
dist.all_reduce(torch.ones(1))
""", HERE)
    assert r.content["ename"] == "KeyboardInterrupt", text(r)
    lines, _ = where(r)
    assert "cell line 6" in group(lines, [1]), lines
    assert "torch.distributed.all_reduce" in group(lines, [0, 2]), lines
    stacks_file(r, 3)


@pytest.mark.timeout(240)
def test_a_deep_recursion_stays_within_its_lines(kernel):
    r = interrupted(kernel, """%%distributed num_processes=2
import sys, time
sys.setrecursionlimit(20000)
def down(n):
    if n == 0:
        print("here", flush=True)
        time.sleep(600)
    return down(n - 1)
down(5000)
""", ["[rank 0] here", "[rank 1] here"])
    assert r.content["ename"] == "KeyboardInterrupt", text(r)
    lines, named = where(r)
    assert len(lines) == 1 and len(lines[0]) < 512, lines
    assert lines[0].strip().startswith("ranks 0, 1 (2):"), lines
    assert len(r.content["traceback"]) < 20, text(r)
    full = stacks_file(r, 2)
    assert len(full) < 200_000, len(full)     # faulthandler's 100 frames a thread


@pytest.mark.timeout(240)
def test_the_decorators_exception_says_where_the_ranks_were(kernel):
    r = interrupted(kernel, """from distkernel import distributed
@distributed(num_processes=3, tracking=False)
def hang():
    import time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    print("here", flush=True)
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.ones(1))
try:
    hang.distributed()
except KeyboardInterrupt as exc:
    print(exc)
""", HERE)
    assert r.status == "ok", r.describe()
    out = r.stdout
    assert HEADING in out, out
    lines = out[out.index(HEADING):].splitlines()[1:3]
    assert lines[0].strip().startswith("rank 1:") and "in hang: time.sleep(600)" in lines[0], out
    assert lines[1].strip().startswith("ranks 0, 2 (2): torch.distributed.all_reduce"), out
    assert "Every rank's stacks, in full: " in out, out


@pytest.mark.timeout(300)
def test_started_ranks_stuck_past_the_grace_say_where_they_were(kernel):
    r = kernel.execute("%distributed start num_processes=3", timeout=RUN)
    assert r.status == "ok", r.describe()
    try:
        r = kernel.execute("%%distributed\nimport torch, torch.distributed as dist\n"
                           "dist.init_process_group('gloo')", timeout=RUN)
        assert r.status == "ok", r.describe()
        # The process group is the one the ranks kept: the cell's lines stay.
        r = interrupted(kernel, ASLEEP.format(opts="").replace(
            'dist.init_process_group("gloo")', "assert dist.is_initialized()"), HERE)
        assert "did not return to the prompt" in r.stderr, r.describe()
        assert_asleep_and_waiting(r)
    finally:
        kernel.execute("%distributed stop", timeout=RUN)


@pytest.mark.timeout(240)
def test_a_run_that_finishes_asks_no_rank(kernel):
    r = kernel.execute("%%distributed num_processes=2\nimport os\nint(os.environ['RANK'])",
                       timeout=RUN)
    assert r.status == "ok", r.describe()
    assert not (support.log_dir(r) / "stacks.txt").exists()


# 64 ranks in 4 places, groups of 1, 2, 4 and 57 ranks, with no torch (64
# ranks importing it would cost this machine more than the test is about).
SIXTY_FOUR = """%%distributed num_processes=64 timeout={timeout}
import os, time
rank = int(os.environ["RANK"])
if rank == 9:
    time.sleep(600)
elif rank in (3, 60):
    time.sleep(601)
elif rank in (10, 11, 12, 13):
    time.sleep(602)
else:
    time.sleep(603)
"""


@pytest.mark.timeout(240)
def test_64_ranks_in_4_places_stay_within_45_lines(kernel):
    r = kernel.execute(SIXTY_FOUR.format(timeout=20), timeout=RUN)
    assert r.content["ename"] == "TimeoutError", text(r)
    whole = text(r).splitlines()
    assert len(whole) <= 45, text(r)
    lines, named = where(r)
    labels = [line.split(":")[0].strip() for line in lines]
    assert labels[:3] == ["rank 9", "ranks 3, 60 (2)", "ranks 10–13 (4)"], lines
    assert len(labels) == 4 and labels[3].startswith("ranks 0") and labels[3].endswith("(57)"), \
        lines
    # Each line's source too, as a traceback shows it: the call into C
    # (time.sleep) shows no frame of its own.
    for line, n, s in zip(lines, (5, 7, 9, 11), (600, 601, 602, 603)):
        assert line.rstrip().endswith(f"cell line {n}: time.sleep({s})"), lines
    stacks_file(r, 64)


# GPU runs with torch's NCCL flight recorder on: each group line ends in its
# ranks' last collective. No NCCL here (Debian's torch 1.13 has no recorder
# and no CUDA), so the cell fakes what python/distkernel/_flight.py reads:
# the recorder on, the default group NCCL's, and the recorder's dump (a pickle
# in torch 2.4's schema) with rank 2 one collective behind. The ranks really
# hang in gloo: rank 1 asleep, ranks 0 and 2 in all_reduce.
FLIGHT = """%%distributed num_processes=3 timeout=15
import os, pickle, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
def entry(record_id, seq, state):
    return {"record_id": record_id, "pg_id": 0, "process_group": ("0", "default_pg"),
            "collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False, "op_id": seq,
            "profiling_name": "nccl:all_reduce", "time_created_ns": 1000 + seq,
            "input_sizes": [[1024, 1024]], "input_dtypes": ["Float"],
            "output_sizes": [[1024, 1024]], "output_dtypes": ["Float"], "state": state,
            "retired": False, "timeout_ms": 600000}
def dump_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False):
    last = entry(11, 11, "completed") if rank == 2 else entry(12, 12, "started")
    return pickle.dumps({"version": "2.4", "pg_config": {}, "pg_status": {},
                         "entries": [entry(10, 10, "completed"), last]})
os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"
dist.get_backend = lambda group=None: "nccl"
torch._C._distributed_c10d._dump_nccl_trace = dump_trace
print("here", flush=True)
if rank == 1:
    time.sleep(600)
dist.all_reduce(torch.ones(1))
"""


@pytest.mark.timeout(240)
def test_the_flight_recorder_shows_the_rank_one_collective_behind(kernel):
    r = kernel.execute(FLIGHT, timeout=RUN)
    assert r.content["ename"] == "TimeoutError", text(r)
    lines, _ = where(r)
    assert len(lines) == 2, lines
    asleep = group(lines, [1])
    assert "cell line 21" in asleep and "last all_reduce #12, 4 MiB, started" in asleep, lines
    waiting = group(lines, [0, 2])
    assert "torch.distributed.all_reduce" in waiting and "cell line 22" in waiting, lines
    assert "last all_reduce #11–12, 4 MiB, started; at #11 (completed): rank 2" in waiting, lines
    full = stacks_file(r, 3)
    line = "distkernel flight: op=all_reduce seq=%d state=%s bytes=4194304 pg=0\n"
    assert full.count(line % (12, "started")) == 2 and full.count(line % (11, "completed")) == 1, \
        full

