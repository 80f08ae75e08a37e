"""
Started ranks on a Slurm cluster: `%distributed start nodes=2 num_processes=4`
on the simulated cluster of tests/slurm/ (2 nodes, 2 ranks each), through a
real kernel.

The start asks Slurm for the nodes once; the allocation is held while the
ranks live and released when they end, however they end. The tests check
what the user sees (state kept on the same processes of both nodes, an
exception and an interrupt that keep the ranks, a lost node, the status) and
what is left: after each test no job of ours is in squeue and no rank
process lives on any node.
"""
import os
import re
import signal
import sys
import time

import pytest

import support

sys.path.insert(0, str(support.REPO_ROOT / "tests"))

from test_slurm_runs import our_jobs, rank_processes, start, still_serves, wait_clean  # noqa: E402

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="%distributed is distkernel's")

RUN = 240           # a cell that starts ranks on the cluster, on a busy machine
START = "%distributed start nodes=2 num_processes=4"
WHERE = ("%%distributed\nimport os, socket\n"
         "(socket.gethostname(), os.getpid())\n")


def rank_values(r):
    """{rank: value} from a cell's result "rank 0: ...\\nrank 1: ..."."""
    assert r.status == "ok", r.describe()
    return {int(m.group(1)): eval(m.group(2))
            for m in re.finditer(r"^rank (\d+): (.*)$", r.result, re.M)}


def start_ranks(k, options=START):
    r = k.execute(options, timeout=RUN)
    assert r.status == "ok", r.describe()
    assert "started 4 CPU ranks" in r.stdout, r.describe()
    jobs = our_jobs(slurm_cluster_of(k))
    assert len(jobs) == 1 and jobs[0].endswith(" RUNNING"), jobs
    return jobs[0].split()[0]


_clusters = {}


def slurm_cluster_of(k):
    return _clusters[id(k)]


@pytest.fixture
def kernel(slurm_cluster, tmp_path):
    k = start(tmp_path, slurm_cluster)
    _clusters[id(k)] = slurm_cluster
    yield k
    k.stop()
    _clusters.pop(id(k), None)
    assert wait_clean(slurm_cluster) == [], "left behind after the test"


def stop_and_check_released(k, cluster):
    r = k.execute("%distributed stop", timeout=RUN)
    assert r.status == "ok" and "stopped the started ranks" in r.stdout, r.describe()
    # The allocation is released by the stop itself, not later: the job is
    # gone, or Slurm is finishing it (COMPLETING: the nodes are still tearing
    # its steps down, which takes longer on a loaded machine).
    assert all(j.endswith(" COMPLETING") for j in our_jobs(cluster)), "stop left the Slurm job"
    assert wait_clean(cluster) == []


@pytest.mark.timeout(600)
def test_state_is_kept_across_cells_on_the_same_pids_on_both_nodes(kernel, slurm_cluster):
    job = start_ranks(kernel)
    first = rank_values(kernel.execute(WHERE, timeout=RUN))
    assert [first[r][0] for r in range(4)] == ["node1", "node1", "node2", "node2"], first
    r = kernel.execute("%%distributed\nimport torch, torch.distributed as dist\n"
                       "dist.init_process_group('gloo')\n"
                       "t = torch.ones(1) * (dist.get_rank() + 1)\nkept = 'v' + os.environ['RANK']\n",
                       timeout=RUN)
    assert r.status == "ok", r.describe()
    r = kernel.execute("%%distributed\ndist.all_reduce(t)\n(kept, int(t.item()))", timeout=RUN)
    assert rank_values(r) == {0: ("v0", 10), 1: ("v1", 10), 2: ("v2", 10), 3: ("v3", 10)}, \
        r.describe()
    assert rank_values(kernel.execute(WHERE, timeout=RUN)) == first
    # A rank's output (fd 1 and 2, through its agent) comes before its
    # answer (through the agent's relay of its connection): every line of a
    # cell is that cell's, even 300 KB written at C level in one write just
    # before it ends, into a pipe made large enough to take them at once
    # (F_SETPIPE_SZ), more than the agent reads from a pipe at a time.
    r = kernel.execute("%%distributed\nimport fcntl, os\nfcntl.fcntl(1, 1031, 1 << 20)\n"
                       "text = ''.join(f'line {i} of {os.environ[\"RANK\"]}\\n' "
                       "for i in range(20000))\n"
                       "assert os.write(1, text.encode()) == len(text)\n"
                       "os.write(2, b'last words\\n')\n", timeout=RUN)
    assert r.status == "ok", r.describe()
    for rank in range(4):
        lines = re.findall(rf"^\[rank {rank}\] line (\d+) of {rank}$", r.stdout, re.M)
        assert [int(n) for n in lines] == list(range(20000)), (rank, len(lines))
        assert f"[rank {rank}] last words" in r.stderr, r.describe()
    r = kernel.execute("%%distributed\nprint('next')\n", timeout=RUN)
    assert r.status == "ok" and " line " not in r.stdout and "last words" not in r.stderr, \
        r.describe()
    # One allocation all along, held with no time limit of ours: the
    # partition's MaxTime (INFINITE on the test cluster).
    assert [line.split()[0] for line in our_jobs(slurm_cluster)] == [job]
    limit = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%l").stdout.strip()
    assert limit == "UNLIMITED", limit
    # The status names the Slurm job and each rank's node.
    status = kernel.execute("%distributed status").stdout
    assert f"Slurm job {job} on node[1-2] (time limit infinite)" in status, status
    assert "rank 0 on node1 · rank 1 on node1 · rank 2 on node2 · rank 3 on node2" in status, \
        status
    stop_and_check_released(kernel, slurm_cluster)
    still_serves(kernel)


@pytest.mark.timeout(600)
def test_a_cell_ends_as_a_timeout_before_the_allocations_time_limit(kernel, slurm_cluster):
    # Started ranks in a 1-minute allocation: a cell that would outlast it is
    # cut to end as a timeout first, saying why, rather than die under Slurm.
    start_ranks(kernel, START + " slurm_args='--time=1'")
    r = kernel.execute("%%distributed\nimport time\ntime.sleep(250)\n", timeout=RUN)
    assert r.status == "error" and r.content["ename"] == "TimeoutError", r.describe()
    assert "all the started ranks' Slurm allocation had left of its time limit" in \
        r.content["evalue"], r.describe()
    assert re.search(r"distkernel: Slurm job \d+ has \d+ s left of its time limit .*: this "
                     r"cell ends as a timeout after \d+ s", r.stderr), r.describe()
    r = kernel.execute("%distributed stop", timeout=RUN)
    assert r.status == "ok", r.describe()
    assert wait_clean(slurm_cluster, timeout=90) == []


@pytest.mark.timeout(600)
def test_an_exception_keeps_the_ranks(kernel, slurm_cluster):
    start_ranks(kernel)
    before = rank_values(kernel.execute(WHERE.replace("import os", "kept = 7\nimport os"),
                                        timeout=RUN))
    r = kernel.execute("%%distributed\nimport os\nif os.environ['RANK'] == '2':\n"
                       "    raise ValueError('bad on ' + socket.gethostname())\n", timeout=RUN)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "ValueError", r.describe()
    assert "bad on node2" in r.content["evalue"], r.describe()
    r = kernel.execute(WHERE.replace("os.getpid())", "os.getpid(), kept)"), timeout=RUN)
    assert rank_values(r) == {k: v + (7,) for k, v in before.items()}, r.describe()
    stop_and_check_released(kernel, slurm_cluster)


@pytest.mark.timeout(600)
def test_interrupt_in_a_sleeping_cell_raises_keyboardinterrupt_in_every_rank_and_keeps_them(
        kernel, slurm_cluster):
    start_ranks(kernel)
    before = rank_values(kernel.execute(WHERE, timeout=RUN))
    code = ("%%distributed\nimport time, socket\n"
            "try:\n"
            "    print('READY', flush=True)\n"
            "    time.sleep(300)\n"
            "except KeyboardInterrupt:\n"
            "    print('KeyboardInterrupt on', socket.gethostname(), flush=True)\n"
            "    raise\n")
    msg_id = kernel.start_execute(code)
    for rank in range(4):
        kernel.wait_iopub(lambda m: m["msg_type"] == "stream" and
                          m["parent_header"].get("msg_id") == msg_id and
                          f"[rank {rank}] READY" in m["content"]["text"], timeout=120)
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=60)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "KeyboardInterrupt", r.describe()
    for rank, node in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"[rank {rank}] KeyboardInterrupt on {node}" in r.stdout, r.describe()
    assert rank_values(kernel.execute(WHERE, timeout=RUN)) == before
    stop_and_check_released(kernel, slurm_cluster)


@pytest.mark.timeout(600)
def test_idle_timeout_ends_the_ranks_and_releases_the_job_before_any_cell(kernel, slurm_cluster):
    start_ranks(kernel, START + " idle_timeout=3")
    # No cell runs: the release must not wait for the next one to notice.
    assert wait_clean(slurm_cluster, timeout=60) == []
    r = kernel.execute("%%distributed\n1", timeout=RUN)
    assert r.status == "error", r.describe()
    assert "the started ranks are gone: they were idle for longer than idle_timeout=3 s" in \
        r.content["evalue"], r.describe()


@pytest.mark.timeout(600)
def test_a_lost_node_ends_them_all_and_the_next_cell_says_so(slurm_cluster, tmp_path):
    # node2's network cut: its ranks go quiet (no FIN), the heartbeats tell
    # (3 s here); every rank ends and the job is released with no cell running.
    k = start(tmp_path, slurm_cluster, DISTKERNEL_SLURM_HEARTBEAT="3")
    _clusters[id(k)] = slurm_cluster
    try:
        start_ranks(k)
        rank_values(k.execute(WHERE, timeout=RUN))
        slurm_cluster.cut("node2")
        try:
            assert wait_clean(slurm_cluster, timeout=90) == []
        finally:
            slurm_cluster.reconnect("node2")
        r = k.execute("%distributed status")
        assert "the started ranks are gone: node2 lost (ranks 2–3)" in r.stdout, r.describe()
        r = k.execute("%%distributed\n1", timeout=RUN)
        assert r.status == "error", r.describe()
        evalue = r.content["evalue"]
        assert evalue.startswith("the started ranks are gone: node2 lost (ranks 2–3);"), evalue
        assert f"`{START}`" in evalue, evalue
        still_serves(k)
    finally:
        k.stop()
    assert wait_clean(slurm_cluster, timeout=60) == []


@pytest.mark.timeout(600)
def test_kernel_shutdown_with_started_ranks_releases_the_job(slurm_cluster, tmp_path):
    k = start(tmp_path, slurm_cluster)
    _clusters[id(k)] = slurm_cluster
    try:
        start_ranks(k)
        assert len(rank_processes(slurm_cluster)) >= 4
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


FORK = ("import os, time\nchild = os.fork()\n"
        "if child == 0:\n    time.sleep(120)\n    os._exit(0)\nchild")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("forked_child", [False, True], ids=["alone", "with_a_forked_child"])
def test_a_kernel_killed_with_started_ranks_leaves_nothing_within_a_minute(slurm_cluster,
                                                                           tmp_path,
                                                                           forked_child):
    # With a forked child: a child of the kernel forked without exec (os.fork,
    # multiprocessing's fork method, a DataLoader worker) holds copies of the
    # kernel's descriptors, the pipe its watchers wait on included, and outlives
    # it; the kernel's death must still release the job.
    k = start(tmp_path, slurm_cluster)
    _clusters[id(k)] = slurm_cluster
    child = None
    try:
        start_ranks(k)
        rank_values(k.execute(WHERE, timeout=RUN))
        assert len(rank_processes(slurm_cluster)) >= 4
        if forked_child:
            r = k.execute(FORK)
            assert r.status == "ok", r.describe()
            child = int(r.result)
        os.kill(k.pid, signal.SIGKILL)
        k.process.wait(timeout=30)
        t0 = time.monotonic()
        if child:
            assert os.path.exists(f"/proc/{child}"), "the forked child ended with the kernel"
        left = wait_clean(slurm_cluster, timeout=60)
    finally:
        k.kc.stop_channels()
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert left == []
    assert time.monotonic() - t0 < 60


@pytest.mark.timeout(300)
def test_a_start_queued_in_slurm_shows_its_state_and_an_interrupt_cancels_it(kernel,
                                                                               slurm_cluster):
    msg_id = kernel.start_execute(START + " partition=stuck")
    shown = kernel.wait_iopub(
        lambda m: m["msg_type"] in ("display_data", "update_display_data") and
        m["parent_header"].get("msg_id") == msg_id and
        "PENDING (PartitionDown)" in m["content"]["data"]["text/plain"], timeout=60)
    job = shown["content"]["data"]["text/plain"].split("Slurm job ", 1)[1].split()[0]
    assert [line.split()[0] for line in our_jobs(slurm_cluster)] == [job]
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=30)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "KeyboardInterrupt", r.describe()
    assert f"Slurm request {job} was cancelled while PENDING" in r.content["evalue"], r.describe()
    assert wait_clean(slurm_cluster) == []
    r = kernel.execute("%distributed status")
    assert "no ranks are started" in r.stdout, r.describe()
    still_serves(kernel)


@pytest.mark.timeout(600)
def test_a_rank_killed_between_cells_ends_them_all_and_releases_the_job(kernel, slurm_cluster):
    start_ranks(kernel)
    where = rank_values(kernel.execute(WHERE, timeout=RUN))
    node, pid = where[3]
    slurm_cluster.exec(node, "kill", "-KILL", str(pid))
    # No cell runs: the job is released when the ranks end, not when a cell notices.
    assert wait_clean(slurm_cluster, timeout=60) == []
    r = kernel.execute("%%distributed\n1", timeout=RUN)
    assert r.status == "error", r.describe()
    evalue = r.content["evalue"]
    assert evalue.startswith("the started ranks are gone: rank 3 "), evalue
    assert f"`{START}`" in evalue, evalue
    still_serves(kernel)


@pytest.mark.timeout(600)
def test_restart_releases_the_job_and_asks_for_a_new_one(kernel, slurm_cluster):
    job = start_ranks(kernel)
    before = rank_values(kernel.execute(WHERE, timeout=RUN))
    r = kernel.execute("%distributed restart", timeout=RUN)
    assert r.status == "ok" and "started 4 CPU ranks" in r.stdout, r.describe()
    jobs = [line.split()[0] for line in our_jobs(slurm_cluster)]
    assert len(jobs) == 1 and jobs != [job], jobs
    after = rank_values(kernel.execute(WHERE, timeout=RUN))
    assert [h for h, _ in after.values()] == [h for h, _ in before.values()]
    assert [p for _, p in after.values()] != [p for _, p in before.values()]
    stop_and_check_released(kernel, slurm_cluster)
