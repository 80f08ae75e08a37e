"""
`%%distributed` and `@distributed(remote=True)` running on a Slurm cluster: the
simulated one of tests/slurm/ (2 nodes), through a real kernel.

A run asks Slurm for the nodes (salloc --no-shell), starts each rank as a step
on its node (srun), and the ranks reach the kernel over TCP. The tests check
what the user sees (output of both nodes, results, the root cause, the
interrupt, a request that never runs) and what is left: after each test no
job of ours is in squeue and no rank process lives on any node.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import slurm_cluster
import support

sys.path.insert(0, str(support.REPO_ROOT / "tests"))
from mlflow_server import MlflowTestServer  # noqa: E402

ALL_GONE_WITHIN = 30


def start(tmp_path, cluster, wrap=None, **env):
    """A kernel with the cluster's client environment (SLURM_CONF), less any
    Slurm setting of ours; its rank logs under tmp_path/logs. WRAP: argv words
    the kernel's command is run by (it gets the command as its last words)."""
    base = {k: v for k, v in cluster.env.items()
            if not k.startswith(("SLURM_", "DISTKERNEL_SLURM_")) and
            k not in ("DISTKERNEL_NODES", "DISTKERNEL_LAUNCHER")}
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    base.update(DISTKERNEL_LOG_DIR=str(logs), MLFLOW_TRACKING_URI="", SLURM_CONF=cluster.conf)
    for name in slurm_cluster.TEMPLATE_VARS:   # this module's, not the cluster's (bring_up)
        if name in os.environ:
            base[name] = os.environ[name]
    base.update(env)
    if not wrap:
        return support.Kernel.start(env=base)
    km = support.KernelManager(kernel_name=support.KERNEL_NAME)
    km.kernel_spec.argv = [*wrap, *km.kernel_spec.argv]
    return support.Kernel.launch(km, env=base)


def our_jobs(cluster):
    """The kernel's jobs in squeue (their names start with distkernel-)."""
    out = cluster.run("squeue", "-h", "-o", "%i %j %T").stdout
    return [line for line in out.splitlines() if " distkernel-" in line]


def node_commands(cluster, node):
    """(pid, command line) of each process living on NODE."""
    found = []
    for pid in cluster.pids(node):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                found.append((pid, f.read().replace(b"\0", b" ").decode(errors="replace")))
        except OSError:
            continue
    return found


def rank_processes(cluster):
    """Rank programs (and their srun steps' tasks, the node agents among them:
    an agent's command line names the rank program, and the agents' warm-start
    templates) living on the nodes."""
    return [f"{node}: {pid} {cmd}" for node in cluster.node_names()
            for pid, cmd in node_commands(cluster, node)
            if "distkernel-rank" in cmd or "distkernel-template" in cmd]


def sruns_of(k):
    """The sruns the kernel K started (on this, the login host); not the
    helper process each srun forks, which is an srun too."""
    procs = support.descendants(k.pid, template=True)
    sruns = {p.pid for p in procs if p.name() == "srun"}
    return [p for p in procs if p.pid in sruns and p.ppid() not in sruns]


def wait_clean(cluster, timeout=ALL_GONE_WITHIN, completing_ok=False):
    """Wait until no job of ours is queued and no rank, agent or template lives
    on a node (rank_processes); what is left. COMPLETING_OK: a job Slurm shows
    COMPLETING is not left (after a node's loss it stays so for a minute:
    test_slurm_scale)."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = our_jobs(cluster)
        if completing_ok:
            jobs = [j for j in jobs if not j.endswith(" COMPLETING")]
        left = jobs + rank_processes(cluster)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


@pytest.fixture
def kernel(slurm_cluster, tmp_path):
    k = start(tmp_path, slurm_cluster)
    yield k
    k.stop()
    assert wait_clean(slurm_cluster) == [], "left behind after the test"


def still_serves(k):
    r = k.execute("1 + 1")
    assert r.status == "ok" and "2" in str(r.of_type("execute_result")), r.describe()


GLOO_CELL = """%%distributed num_processes=4 nodes=2
import socket, os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
# One DDP training step: every rank's gradient differs, the averaged step
# leaves every rank with the same weights.
torch.manual_seed(0)
model = DDP(torch.nn.Linear(2, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.full((4, 2), float(dist.get_rank() + 1))
model(x).sum().backward()
opt.step()
w = [round(v, 6) for v in model.module.weight.detach().flatten().tolist()]
print("host", socket.gethostname(), "rank", dist.get_rank(), "local", os.environ["LOCAL_RANK"],
      "sum", int(t.item()), "weights", w, flush=True)
(socket.gethostname(), dist.get_rank(), int(t.item()))
"""


@pytest.mark.timeout(300)
def test_a_2_node_gloo_cell_runs_on_both_nodes(kernel, slurm_cluster):
    r = kernel.execute(GLOO_CELL, timeout=240)
    assert r.status == "ok", r.describe()
    out = r.stdout
    for rank, host, local in ((0, "node1", 0), (1, "node1", 1), (2, "node2", 0), (3, "node2", 1)):
        assert f"[rank {rank}] host {host} rank {rank} local {local} sum 10" in out, out
    # DDP averaged the gradients over both nodes: one set of weights, moved
    # from the seeded start.
    weights = set(re.findall(r"weights (\[[^\]]*\])", out))
    assert len(weights) == 1 and len(re.findall(r"weights \[", out)) == 4, out
    assert r.result == ("rank 0: ('node1', 0, 10)\nrank 1: ('node1', 1, 10)\n"
                        "rank 2: ('node2', 2, 10)\nrank 3: ('node2', 3, 10)"), r.describe()
    status = [m for m in r.of_type("display_data", "update_display_data")
              if "distributed:" in m["content"]["data"]["text/plain"]]
    final = status[-1]["content"]["data"]["text/plain"]
    assert "rank 0 on node1 done" in final and "rank 3 on node2 done" in final, final


@pytest.mark.timeout(300)
def test_output_local0_shows_local_rank_0_of_each_node_and_the_logs_keep_all(kernel,
                                                                             slurm_cluster):
    r = kernel.execute("%%distributed num_processes=4 nodes=2 output=local0\n"
                       "import os, socket\n"
                       "print('from', os.environ['RANK'], 'on', socket.gethostname())\n",
                       timeout=240)
    assert r.status == "ok", r.describe()
    assert support.rank_lines(r.stdout) == {0: ["from 0 on node1"], 2: ["from 2 on node2"]}, \
        r.describe()
    logs = support.log_dir(r)
    for rank, node in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"from {rank} on {node}" in (logs / f"rank-{rank}.log").read_text(), rank


# Takes every TCP port it can of the range a random pick would come from
# (20000-32767), on every address of the network it runs in, and holds them
# until its stdin closes.
PORT_BLOCKER = """
import resource, socket, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
held = []
for port in range(20000, 32768):
    s = socket.socket()
    try:
        s.bind(("", port))
        s.listen()
        held.append(s)
    except OSError:
        s.close()
print("holding", len(held), flush=True)
sys.stdin.read()
"""

PORT_CELL = """%%distributed num_processes=4 nodes=2
import os, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print("port", os.environ["MASTER_PORT"], flush=True)
"""


@pytest.mark.timeout(300)
def test_master_port_is_a_port_rank_0_found_free_on_the_first_node(kernel, slurm_cluster):
    # With every port of 20000-32767 taken on node1, a port picked at random
    # from afar would be taken too: the run must still find one that is free
    # there, and every rank must get the same.
    node1 = slurm_cluster.pids("node1")[0]
    blocker = subprocess.Popen(["nsenter", "-t", str(node1), "-n", "/usr/bin/python3", "-c",
                                PORT_BLOCKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)
    try:
        line = blocker.stdout.readline()
        assert line.startswith("holding") and int(line.split()[1]) > 12000, line
        r = kernel.execute(PORT_CELL, timeout=240)
        assert r.status == "ok", r.describe()
        ports = {int(p) for p in re.findall(r"^\[rank \d\] port (\d+)$", r.stdout, re.M)}
        assert len(ports) == 1 and len(re.findall(r"\] port ", r.stdout)) == 4, r.describe()
        port = ports.pop()
        assert not 20000 <= port < 32768, port
    finally:
        blocker.stdin.close()
        blocker.wait(timeout=30)


OUTPUT_CELL = """%%distributed num_processes=4 nodes=2
import os, subprocess, sys, time
from tqdm import tqdm
r = os.environ["RANK"]
os.write(1, f"c-level {r}\\n".encode())          # below Python's sys.stdout
subprocess.run(["sh", "-c", f"echo child-out {r}; echo child-err {r} >&2"], check=True)
for _ in tqdm(range(30)):
    time.sleep(0.03)
print("done", r, flush=True)
"""


@pytest.mark.timeout(300)
def test_remote_ranks_output_reaches_the_cell_as_a_local_ranks_does(kernel):
    # What a rank on node2 writes at the C level, what its child writes, and a
    # tqdm bar: labelled in the cell, the bar a live display of its own, and
    # all of it in the kernel's rank log.
    r = kernel.execute(OUTPUT_CELL, timeout=240)
    assert r.status == "ok", r.describe()
    for rank in range(4):
        for line in (f"c-level {rank}", f"child-out {rank}", f"done {rank}"):
            assert f"[rank {rank}] {line}\n" in r.stdout, (line, r.describe())
        assert f"[rank {rank}] child-err {rank}\n" in r.stderr, r.describe()
    assert sum("%|" in x for x in (r.stdout + r.stderr).splitlines()) <= 8, r.describe()
    bars = {}
    for m in r.of_type("display_data", "update_display_data"):
        text = m["content"]["data"].get("text/plain", "")
        found = support.RANK_LINE.match(text)
        if found and "%|" in text:
            bars.setdefault(int(found.group(1)), []).append(text)
    assert set(bars) == {0, 1, 2, 3}, r.describe()
    assert all("100%" in shown[-1] for shown in bars.values()), bars
    status = [m["content"]["data"]["text/plain"] for m in r.of_type("display_data",
                                                                       "update_display_data")
              if "distributed:" in m["content"]["data"].get("text/plain", "")]
    logs = re.search(r"logs: (\S+)", status[-1]).group(1)
    log3 = open(os.path.join(logs, "rank-3.log"), errors="replace").read()
    for line in ("c-level 3", "child-out 3", "child-err 3", "done 3"):
        assert line in log3, (line, log3)


@pytest.mark.timeout(300)
def test_the_decorator_with_remote_true_returns_every_rank_result(kernel):
    code = ("from distkernel import distributed\n"
            "@distributed(num_processes=4, nodes=2, remote=True)\n"
            "def where(x):\n"
            "    import os, socket\n"
            "    return (socket.gethostname(), int(os.environ['RANK']), x)\n"
            "res = where.distributed(7)\n"
            "print(sorted(res))\n")
    r = kernel.execute(code, timeout=240)
    assert r.status == "ok", r.describe()
    assert "[('node1', 0, 7), ('node1', 1, 7), ('node2', 2, 7), ('node2', 3, 7)]" in r.stdout, \
        r.describe()


@pytest.mark.timeout(300)
def test_a_rank_failing_on_node_2_is_the_root_cause(kernel):
    code = ("%%distributed num_processes=4 nodes=2\n"
            "import os, socket, time\n"
            "if os.environ['RANK'] == '3':\n"
            "    raise ValueError('broken on ' + socket.gethostname())\n"
            "time.sleep(120)\n")
    t0 = time.monotonic()
    r = kernel.execute(code, timeout=240)
    assert r.status == "error", r.describe()
    assert time.monotonic() - t0 < 100, "the other ranks were not ended"
    assert r.content["ename"] == "ValueError", r.describe()
    assert "broken on node2" in r.content["evalue"], r.describe()
    assert "rank 3" in str(r.content), r.describe()
    still_serves(kernel)


@pytest.mark.timeout(300)
def test_interrupt_while_running_ends_the_ranks_on_every_node(kernel, slurm_cluster):
    # Each rank sees the interrupt as a KeyboardInterrupt in its code, as on
    # one node (srun passes no SIGINT on: the kernel asks each rank itself).
    code = ("%%distributed num_processes=4 nodes=2\n"
            "import time, socket\n"
            "try:\n"
            "    print('READY', flush=True)\n"
            "    time.sleep(300)\n"
            "except KeyboardInterrupt:\n"
            "    print('KeyboardInterrupt on', socket.gethostname(), flush=True)\n"
            "    raise\n")
    msg_id = kernel.start_execute(code)
    kernel.wait_iopub(lambda m: m["msg_type"] == "stream" and
                      m["parent_header"].get("msg_id") == msg_id and
                      "[rank 3] READY" in m["content"]["text"], timeout=180)
    assert len(rank_processes(slurm_cluster)) >= 4
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=60)
    assert time.monotonic() - t0 < 60
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "KeyboardInterrupt", r.describe()
    for rank, node in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"[rank {rank}] KeyboardInterrupt on {node}" in r.stdout, r.describe()
    assert wait_clean(slurm_cluster) == []
    still_serves(kernel)


SPIN_C = "void spin(void) { for (volatile unsigned long i = 0;; i++) ; }\n"


@pytest.mark.timeout(300)
@pytest.mark.skipif(not shutil.which("cc"), reason="needs a C compiler for the spinning loop")
def test_an_interrupt_says_where_the_ranks_on_every_node_were(kernel, slurm_cluster, tmp_path):
    # The kernel cannot signal ranks on other nodes. With node agents, each
    # agent signals its ranks (runtime/stacks/dk_stackreq.h), so rank 3,
    # which holds the GIL in a C loop on node2 (ctypes.PyDLL keeps it through
    # the call), answers too. With one step per rank, a rank answers over its
    # back channel from a Python thread, which needs the GIL: rank 3 cannot.
    (tmp_path / "spin.c").write_text(SPIN_C)
    lib = tmp_path / "spin.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-o", str(lib), str(tmp_path / "spin.c")],
                   check=True)
    code = ("%%distributed num_processes=4 nodes=2\n"
            "import ctypes, time, torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "print('here', flush=True)\n"
            "if dist.get_rank() == 2:\n"
            "    time.sleep(300)\n"
            "if dist.get_rank() == 3:\n"
            f"    ctypes.PyDLL({str(lib)!r}).spin()\n"
            "dist.all_reduce(torch.ones(1))\n")
    msg_id = kernel.start_execute(code)

    def all_here(_m):
        out = "".join(m["content"]["text"] for m in kernel.iopub_for(msg_id)
                      if m["msg_type"] == "stream")
        return all(f"[rank {n}] here" in out for n in range(4))
    kernel.wait_iopub(lambda m: m["parent_header"].get("msg_id") == msg_id and all_here(m),
                      timeout=180)
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=60)
    assert r.content["ename"] == "KeyboardInterrupt", r.describe()
    tb = r.content["traceback"]
    at = tb.index("Where the ranks were:") + 1
    where = [line.strip() for line in tb[at:tb.index("", at)]]
    by_who = {line.split(":", 1)[0]: line for line in where if not line.startswith("Every")}
    assert "cell line 6" in by_who["rank 2"], tb
    assert by_who["ranks 0, 1 (2)"].startswith("ranks 0, 1 (2): torch.distributed.all_reduce"), tb
    assert "cell line 8" in by_who["rank 3"], tb
    stacks = (support.log_dir(r) / "stacks.txt").read_text()
    for rank, node in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        assert f"--- rank {rank} on {node} ---" in stacks, stacks
    assert wait_clean(slurm_cluster) == []
    still_serves(kernel)


# Ranks 1 to 3 wait in torch's rendezvous for rank 0, the store's host,
# which waits for GO (cell line 4) on node1.
RENDEZVOUS = """%%distributed num_processes=4 nodes=2 stall_after=1
import os, time, torch, torch.distributed as dist
if os.environ["RANK"] == "0":
    while not os.path.exists({go!r}): time.sleep(0.05)
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
print("joined", flush=True)
"""


@pytest.mark.timeout(300)
def test_live_samples_reach_ranks_through_their_node_agent_and_spare_the_rendezvous(
        slurm_cluster, tmp_path):
    # The node agent samples a rank with
    # DK_SAMPLE_SIGNAL to the rank's sampler thread alone (tgkill). The
    # ending dump's signal, which goes to the process, would make a blocking
    # system call in torch's rendezvous fail ("Interrupted system call"), as
    # tests/e2e/test_stall.py checks on one node. Sampled every 0.1 s: some
    # 30 samples land in the rendezvous of ranks 1 to 3 on both nodes.
    from test_stall import WHERE, group_line, wait_status
    k = start(tmp_path, slurm_cluster, DISTKERNEL_STALL_EVERY="0.1")
    try:
        go = tmp_path / "go"
        msg_id = k.start_execute(RENDEZVOUS.format(go=str(go)))
        shown = wait_status(k, msg_id, lambda _at, t: WHERE in t and "cell line 4" in t,
                            timeout=240)
        assert "cell line 4" in group_line(shown, 0), shown
        assert len(sruns_of(k)) == 1, "not run by node agents"
        since = time.monotonic()
        wait_status(k, msg_id, lambda at, t: at >= since + 3 and WHERE in t)
        go.touch()
        r = k.finish(msg_id, timeout=120)
        assert r.status == "ok", r.describe()
        for rank in range(4):
            assert f"[rank {rank}] joined" in r.stdout, r.describe()
        still_serves(k)
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(300)
def test_interrupt_while_queued_cancels_the_request(kernel, slurm_cluster):
    code = "%%distributed num_processes=2 nodes=2 partition=stuck\n1\n"
    msg_id = kernel.start_execute(code)
    shown = kernel.wait_iopub(
        lambda m: m["msg_type"] in ("display_data", "update_display_data") and
        m["parent_header"].get("msg_id") == msg_id and
        "PENDING (PartitionDown)" in m["content"]["data"]["text/plain"], timeout=60)
    text = shown["content"]["data"]["text/plain"]
    job = text.split("Slurm job ", 1)[1].split()[0]
    assert [line.split()[0] for line in our_jobs(slurm_cluster)] == [job]
    kernel.km.interrupt_kernel()
    r = kernel.finish(msg_id, timeout=30)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "KeyboardInterrupt", r.describe()
    evalue = r.content["evalue"]
    assert f"Slurm request {job} was cancelled while PENDING: PartitionDown" in evalue, evalue
    assert our_jobs(slurm_cluster) == []
    still_serves(kernel)


@pytest.mark.timeout(300)
def test_a_partition_that_never_runs_the_job_ends_at_the_timeout(kernel, slurm_cluster):
    t0 = time.monotonic()
    r = kernel.execute("%%distributed num_processes=2 nodes=2 partition=stuck timeout=4\n1\n",
                       timeout=60)
    took = time.monotonic() - t0
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "TimeoutError", r.describe()
    evalue = r.content["evalue"]
    assert "timeout=4 passed while waiting for Slurm's nodes" in evalue, evalue
    assert "PENDING: PartitionDown" in evalue and "No rank was started" in evalue, evalue
    assert 3.5 < took < 40, took
    assert our_jobs(slurm_cluster) == []
    still_serves(kernel)


@pytest.mark.timeout(300)
def test_a_rank_late_to_the_rendezvous_is_not_taken_for_lost(kernel):
    # rank 0 waits for rank 3 in init_process_group, inside a C call that holds
    # its GIL: its heartbeats stop meanwhile, which must not read as a lost node
    code = ("%%distributed num_processes=4 nodes=2\n"
            "import os, time, torch, torch.distributed as dist\n"
            "if os.environ['RANK'] == '3':\n"
            "    time.sleep(12)\n"
            "dist.init_process_group('gloo')\n"
            "t = torch.ones(1)\n"
            "dist.all_reduce(t)\n"
            "int(t.item())\n")
    r = kernel.execute(code, timeout=240)
    assert r.status == "ok", r.describe()
    assert r.result == "rank 0: 4\nrank 1: 4\nrank 2: 4\nrank 3: 4", r.describe()


@pytest.mark.timeout(300)
def test_a_time_limit_shorter_than_the_timeout_ends_the_run_as_a_timeout(kernel,
                                                                        slurm_cluster):
    # A 1-minute allocation and the default timeout (3 h): Slurm would kill
    # the ranks at its limit (a rank "exited with code 143", Slurm's CANCELLED
    # lines); the run must end first, as a timeout that says why.
    r = kernel.execute("%%distributed num_processes=2 nodes=2 slurm_args='--time=1'\n"
                       "import time\nprint('started', flush=True)\ntime.sleep(250)\n",
                       timeout=240)
    assert r.status == "error" and r.content["ename"] == "TimeoutError", r.describe()
    assert "all its Slurm allocation had left of its time limit" in r.content["evalue"], \
        r.describe()
    assert re.search(r"distkernel: Slurm job \d+ has \d+ s left of its time limit \(timeout="
                     r"10800 s would outlast it\): this run ends as a timeout after \d+ s",
                     r.stderr), r.describe()
    assert "[rank 0] started" in r.stdout and "[rank 1] started" in r.stdout, r.describe()
    assert "CANCELLED" not in r.stdout + r.stderr, r.describe()
    still_serves(kernel)


@pytest.mark.timeout(300)
def test_the_run_timeout_ends_the_ranks_and_releases_the_nodes(kernel, slurm_cluster):
    code = ("%%distributed num_processes=2 nodes=2 timeout=15\n"
            "import time\nprint('READY', flush=True)\ntime.sleep(300)\n")
    r = kernel.execute(code, timeout=120)
    assert r.status == "error", r.describe()
    assert "15" in r.content["evalue"] and "timeout" in r.content["evalue"].lower(), r.describe()
    assert "[rank 1] READY" in r.stdout, r.describe()
    assert wait_clean(slurm_cluster) == []
    still_serves(kernel)


@pytest.mark.timeout(300)
def test_shutdown_mid_run_releases_the_nodes(slurm_cluster, tmp_path):
    k = start(tmp_path, slurm_cluster)
    try:
        msg_id = k.start_execute("%%distributed num_processes=4 nodes=2\n"
                                 "import time\nprint('READY', flush=True)\ntime.sleep(300)\n")
        k.wait_iopub(lambda m: m["msg_type"] == "stream" and
                     m["parent_header"].get("msg_id") == msg_id and
                     "[rank 3] READY" in m["content"]["text"], timeout=180)
        assert our_jobs(slurm_cluster)
        # One srun for the node agents of the whole run, not one per rank.
        sruns = sruns_of(k)
        assert len(sruns) == 1, [" ".join(p.cmdline()) for p in sruns]
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(300)
def test_a_kernel_killed_mid_run_leaves_nothing_on_the_cluster(slurm_cluster, tmp_path):
    k = start(tmp_path, slurm_cluster)
    try:
        msg_id = k.start_execute("%%distributed num_processes=4 nodes=2\n"
                                 "import time\nprint('READY', flush=True)\ntime.sleep(300)\n")
        k.wait_iopub(lambda m: m["msg_type"] == "stream" and
                     m["parent_header"].get("msg_id") == msg_id and
                     "[rank 3] READY" in m["content"]["text"], timeout=180)
        assert our_jobs(slurm_cluster) and len(rank_processes(slurm_cluster)) >= 4
        os.kill(k.pid, signal.SIGKILL)
        k.process.wait(timeout=30)
    finally:
        k.kc.stop_channels()
    assert wait_clean(slurm_cluster, timeout=60) == []


@pytest.mark.timeout(300)
def test_the_mlflow_run_records_the_slurm_job_and_the_nodes(slurm_cluster, tmp_path):
    with MlflowTestServer() as srv:
        k = start(tmp_path, slurm_cluster, MLFLOW_TRACKING_URI=srv.url)
        try:
            r = k.execute("%%distributed num_processes=2 nodes=2\nimport os\n"
                                   "os.environ['RANK']\n", timeout=240)
            assert r.status == "ok", r.describe()
            shown = [m["content"]["data"]["text/plain"]
                     for m in r.of_type("display_data", "update_display_data")
                     if "Slurm job" in m["content"]["data"]["text/plain"]]
            job = shown[0].split("Slurm job ", 1)[1].split()[0]
        finally:
            k.stop()
        runs = srv.runs()
        assert len(runs) == 1, runs
        params = {p["key"]: p["value"] for p in runs[0]["data"]["params"]}
        assert params["slurm_job_id"] == job, params
        assert params["nodes"] == "node[1-2]", params   # as Slurm writes a node list
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(300)
def test_inside_a_larger_allocation_the_mlflow_run_records_its_own_nodes(slurm_cluster,
                                                                          tmp_path):
    # The notebook's allocation has both nodes; a 1-node run uses one of them.
    got = slurm_cluster.run("salloc", "-N2", "--no-shell", "--job-name=batch-of-user")
    assert got.returncode == 0, got.stderr
    job = got.stderr.split("Granted job allocation ")[1].split()[0]
    try:
        with MlflowTestServer() as srv:
            k = start(tmp_path, slurm_cluster, MLFLOW_TRACKING_URI=srv.url, SLURM_JOB_ID=job,
                      SLURM_JOB_NODELIST="node[1-2]")
            try:
                r = k.execute("%%distributed num_processes=1 nodes=1 launcher=slurm\n"
                              "import os\nos.environ['SLURMD_NODENAME']\n", timeout=240)
                assert r.status == "ok", r.describe()
            finally:
                k.stop()
            runs = srv.runs()
        assert len(runs) == 1, runs
        params = {p["key"]: p["value"] for p in runs[0]["data"]["params"]}
        assert params["slurm_job_id"] == job, params
        assert params["nodes"] == r.result.split(": ")[1].strip("'"), (params, r.result)
    finally:
        slurm_cluster.run("scancel", job)
    assert rank_processes(slurm_cluster) == []


def kill_node_2_mid_run(kernel, slurm_cluster, code):
    """Run CODE, kill node2 once rank 3 printed READY; the reply and the
    seconds from the kill to the end of the cell."""
    msg_id = kernel.start_execute(code)
    kernel.wait_iopub(lambda m: m["msg_type"] == "stream" and
                      m["parent_header"].get("msg_id") == msg_id and
                      "[rank 3] READY" in m["content"]["text"], timeout=180)
    t0 = time.monotonic()
    try:
        # inside the try: a kill that fails half way still gets node2 booted
        # again, rather than leaving the shared cluster a node short
        slurm_cluster.kill("node2")
        r = kernel.finish(msg_id, timeout=120)
        took = time.monotonic() - t0
    finally:
        slurm_cluster.start("node2")
        slurm_cluster.wait_state("node2", {"idle"})
    return r, took


def assert_node_2_lost(r, took, slurm_cluster):
    """The cell ended as a lost node2, however the kernel heard of it first:
    its ranks' connections closed or went silent past the heartbeat deadline,
    or srun said "Node failure on node2" (which it may, with the workaround
    for Slurm bug 16401; without it srun never exits)."""
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "NodeLost", r.describe()
    assert r.content["evalue"] == "node2 lost (ranks 2–3)", r.describe()
    assert took < 30, took     # the heartbeat deadline after the close, not timeout=


@pytest.mark.timeout(400)
def test_node_2_lost_mid_run_ends_the_cell_and_leaves_nothing(kernel, slurm_cluster):
    # The test cluster's crash SIGKILLs the node's processes before it drops
    # its network, so the ranks' connections close (FIN) rather than go silent
    # (test_node_2_cut_off_mid_run_... is that case); srun, the process the
    # kernel sees for each rank, may never exit (Slurm bug 16401).
    code = ("%%distributed num_processes=4 nodes=2\n"
            "import time\nprint('READY', flush=True)\ntime.sleep(300)\n")
    r, took = kill_node_2_mid_run(kernel, slurm_cluster, code)
    assert_node_2_lost(r, took, slurm_cluster)
    still_serves(kernel)


@pytest.mark.timeout(400)
def test_node_2_lost_while_its_peers_wait_in_a_collective_is_the_root_cause(kernel,
                                                                           slurm_cluster):
    # Ranks 0 and 1 wait in a barrier for node2's ranks: the kill closes their
    # gloo connections, and they fail at once with "Connection closed by
    # peer". That is the echo of the loss, not its cause.
    code = ("%%distributed num_processes=4 nodes=2\n"
            "import time, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "print('READY', flush=True)\n"
            "if dist.get_rank() < 2:\n"
            "    dist.barrier()\n"
            "time.sleep(300)\n")
    r, took = kill_node_2_mid_run(kernel, slurm_cluster, code)
    assert_node_2_lost(r, took, slurm_cluster)
    assert "[rank 0]" not in r.content["evalue"] and "[rank 1]" not in r.content["evalue"], \
        r.describe()
    still_serves(kernel)


@pytest.mark.timeout(300)
def test_inside_an_allocation_the_ranks_are_its_steps_and_it_is_kept(slurm_cluster, tmp_path):
    got = slurm_cluster.run("salloc", "-N2", "--ntasks-per-node=2", "--no-shell",
                            "--job-name=batch-of-user")
    assert got.returncode == 0, got.stderr
    job = got.stderr.split("Granted job allocation ")[1].split()[0]
    try:
        k = start(tmp_path, slurm_cluster, SLURM_JOB_ID=job, SLURM_JOB_NODELIST="node[1-2]")
        try:
            r = k.execute("%%distributed num_processes=4 nodes=2\n"
                          "import os\n(os.environ['SLURM_JOB_ID'], os.environ['SLURMD_NODENAME'])\n",
                          timeout=240)
            assert r.status == "ok", r.describe()
            assert r.result == (f"rank 0: ('{job}', 'node1')\nrank 1: ('{job}', 'node1')\n"
                                f"rank 2: ('{job}', 'node2')\nrank 3: ('{job}', 'node2')"), \
                r.describe()
            assert our_jobs(slurm_cluster) == []
            state = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
            assert state == "RUNNING", "the kernel's own allocation was ended"
        finally:
            k.stop()
        assert rank_processes(slurm_cluster) == []
    finally:
        slurm_cluster.run("scancel", job)


@pytest.mark.timeout(300)
def test_node_2_cut_off_mid_run_is_reported_lost_with_its_ranks(slurm_cluster, tmp_path):
    # no FIN, no RST: node2's ranks just go quiet; the heartbeats tell (3 s
    # here, DISTKERNEL_SLURM_HEARTBEAT), well before Slurm notices the node
    k = start(tmp_path, slurm_cluster, DISTKERNEL_SLURM_HEARTBEAT="3")
    try:
        msg_id = k.start_execute("%%distributed num_processes=4 nodes=2\n"
                                 "import time\nprint('READY', flush=True)\ntime.sleep(300)\n")
        k.wait_iopub(lambda m: m["msg_type"] == "stream" and
                     m["parent_header"].get("msg_id") == msg_id and
                     "[rank 3] READY" in m["content"]["text"], timeout=180)
        t0 = time.monotonic()
        slurm_cluster.cut("node2")
        try:
            r = k.finish(msg_id, timeout=120)
            took = time.monotonic() - t0
        finally:
            slurm_cluster.reconnect("node2")
        assert r.status == "error", r.describe()
        assert r.content["ename"] == "NodeLost", r.describe()
        assert r.content["evalue"] == "node2 lost (ranks 2–3)", r.describe()
        assert took < 20, took
        still_serves(k)
    finally:
        k.stop()
    assert wait_clean(slurm_cluster, timeout=60) == []


@pytest.mark.timeout(300)
def test_ranks_that_can_never_connect_end_within_the_connect_deadline_and_are_reported(
        slurm_cluster, tmp_path):
    # The nodes are sent to 127.0.0.1, which on a node is the node itself:
    # every try to reach the kernel is refused. Each rank keeps trying
    # (backoff) until the connect deadline, 10 s here
    # (DISTKERNEL_SLURM_CONNECT_TIMEOUT; 120 s by default), then gives up
    # naming it. The kernel counts the same deadline from the job's start and
    # a heartbeat deadline more, so the ranks' own word on why comes first.
    k = start(tmp_path, slurm_cluster, DISTKERNEL_SLURM_CONNECT_TIMEOUT="10")
    try:
        t0 = time.monotonic()
        r = k.execute("%%distributed num_processes=2 nodes=2 advertise_addr=127.0.0.1\n1\n",
                      timeout=120)
        took = time.monotonic() - t0
        assert r.status == "error", r.describe()
        # The root cause is a rank that gave up and exited, not a lost node.
        # With node agents it is the agent that cannot connect: it says so
        # as a rank does (on its node's first rank's stderr) and exits 2,
        # which its node's ranks, never started, end with.
        assert r.content["ename"] == "RankExited", r.describe()
        assert ("exited with code 2 during start-up, before it received "
                "the cell") in r.content["evalue"], r.describe()
        gave_up = re.findall(r"could not connect to the kernel's back channel at "
                             r"127\.0\.0\.1:\d+ within 10 s \((\d+) tries; the last: "
                             r"Connection refused\)", r.stderr)
        assert gave_up, r.describe()
        assert all(int(tries) > 1 for tries in gave_up), gave_up
        # not before the deadline (the ranks kept trying), not long after it
        assert 9 < took < 40, took
        still_serves(k)
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(120)
def test_options_salloc_refuses_are_a_clear_error_and_nothing_is_left(kernel, slurm_cluster):
    r = kernel.execute("%%distributed num_processes=2 nodes=2 slurm_args='--no-such-option'\n1\n",
                       timeout=60)
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "RuntimeError", r.describe()
    evalue = r.content["evalue"]
    assert evalue.startswith("nodes=2: Slurm gave no nodes: salloc could not allocate 2 nodes:"), \
        evalue
    assert "--no-such-option" in evalue and "No rank was started" in evalue, evalue
    assert our_jobs(slurm_cluster) == []
    still_serves(kernel)


@pytest.mark.timeout(300)
def test_advertise_addr_in_the_cell_wins_over_its_variable(slurm_cluster, tmp_path):
    # The variable names an address this host does not have (the channel could
    # not listen there); the cell's option names the one the nodes reach.
    login = slurm_cluster.login_addr
    k = start(tmp_path, slurm_cluster, DISTKERNEL_ADVERTISE_ADDR="192.0.2.7")
    try:
        r = k.execute("%%distributed num_processes=2 nodes=2\n1\n", timeout=240)
        assert r.status == "error" and r.content["ename"] == "ValueError", r.describe()
        assert "No rank was started" in r.content["evalue"], r.describe()
        assert ("DISTKERNEL_ADVERTISE_ADDR is 192.0.2.7, which is not an address of this host"
                in r.content["evalue"]), r.describe()
        assert wait_clean(slurm_cluster) == []
        r = k.execute(f"%%distributed num_processes=2 nodes=2 advertise_addr={login}\n"
                      "import os\nos.environ['SLURMD_NODENAME']\n", timeout=240)
        assert r.status == "ok", r.describe()
        assert r.result == "rank 0: 'node1'\nrank 1: 'node2'", r.describe()
        r = k.execute("%%distributed num_processes=2 nodes=2 advertise_addr=login\n1\n")
        assert r.status == "error" and r.content["ename"] == "ValueError", r.describe()
        assert "advertise_addr must be a numeric" in r.content["evalue"], r.describe()
        still_serves(k)
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(300)
def test_ray_launch_on_two_nodes_gives_each_ray_node_its_own_address(slurm_cluster, tmp_path):
    # Ray, left to itself, takes the address of the node's hostname (127.0.1.1
    # on Debian-like nodes), where the other nodes cannot reach it: each rank's
    # `ray start` is given the node's address on the route to the first node.
    import json
    fake_ray = support.REPO_ROOT / "tests" / "e2e" / "fake_ray.py"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(fake_ray, bin_dir / "ray")
    log = tmp_path / "ray.jsonl"
    k = start(tmp_path, slurm_cluster, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
              FAKE_RAY_LOG=str(log))
    try:
        r = k.execute("from databricks.air import ray_launch\n"
                      "@ray_launch(num_processes=4, nodes=2, tracking=False)\n"
                      "def drive():\n"
                      "    import os\n"
                      "    return os.environ['RAY_ADDRESS']\n"
                      "drive.distributed()", timeout=240)
        assert r.status == "ok", r.describe()
        net = slurm_cluster.login_addr.rsplit(".", 1)[0]
        starts = {int(x["rank"]): x["argv"] for x in map(json.loads, log.read_text().splitlines())
                  if x["event"] == "start"}
        assert sorted(starts) == [0, 1, 2, 3], starts
        for rank, argv in starts.items():
            node = 1 if rank < 2 else 2
            assert f"--node-ip-address={net}.{10 + node}" in argv, (rank, argv)
        port = next(a.split("=", 1)[1] for a in starts[0] if a.startswith("--port="))
        assert r.result == f"'{net}.11:{port}'", r.describe()
        assert all(f"--address={net}.11:{port}" in starts[q] for q in (1, 2, 3)), starts
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


MYMOD = """\
import socket


def where():
    return "mymod on " + socket.gethostname()


def boom():
    raise ValueError("raised in mymod")
"""


@pytest.mark.timeout(300)
def test_the_notebook_folders_modules_reach_nodes_that_do_not_share_it(slurm_cluster, tmp_path):
    # The kernel runs in a mount namespace of its own, where the notebook
    # folder is on a tmpfs: the nodes (slurmd's namespace) do not have it, as
    # on a cluster without a shared filesystem.
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "mymod.py").write_text(MYMOD)
    (src / "pkg" / "__init__.py").write_text("NAME = 'pkg'\n")
    (src / "pkg" / "sub.py").write_text("from . import NAME\nVALUE = NAME + '.sub'\n")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (f"mount -t tmpfs tmpfs {mnt} && mkdir {mnt}/nb && cp -r {src}/. {mnt}/nb/ && "
              f"cd {mnt}/nb && exec \"$@\"")
    k = start(tmp_path, slurm_cluster,
              wrap=["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"])
    try:
        r = k.execute("import os, pkg.sub\nfrom mymod import where\nos.getcwd()")
        assert r.status == "ok" and r.result == repr(f"{mnt}/nb"), r.describe()
        assert not (mnt / "nb").exists(), "the notebook folder is visible outside the kernel"
        # mymod: not imported by the cell, pickled by reference (where), and
        # imported by the kernel; pkg.sub: a package's submodule.
        r = k.execute("%%distributed num_processes=2 nodes=2\n"
                      "import os, mymod, pkg.sub\n"
                      "(where(), mymod.where(), pkg.sub.VALUE, os.path.exists('mymod.py'))\n",
                      timeout=240)
        assert r.status == "ok", r.describe()
        assert r.result == ("rank 0: ('mymod on node1', 'mymod on node1', 'pkg.sub', False)\n"
                            "rank 1: ('mymod on node2', 'mymod on node2', 'pkg.sub', False)"), \
            r.describe()
        r = k.execute("%%distributed num_processes=2 nodes=2\nimport mymod\nmymod.boom()\n",
                      timeout=240)
        assert r.status == "error" and r.content["ename"] == "ValueError", r.describe()
        text = "\n".join(r.content["traceback"])
        assert 'raise ValueError("raised in mymod")' in text, r.describe()
        still_serves(k)
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(120)
def test_more_ranks_per_node_than_its_cpus_is_refused_before_slurm_is_asked(kernel,
                                                                         slurm_cluster):
    # The simulated nodes have 2 CPUs: 4 ranks on each would wait in the queue
    # (PartitionConfig) for the whole timeout.
    r = kernel.execute("%%distributed num_processes=8 nodes=2\n1\n", timeout=60)
    assert r.status == "error" and r.content["ename"] == "ValueError", r.describe()
    evalue = r.content["evalue"]
    assert evalue.startswith("nodes=2: 8 ranks on 2 nodes puts 4 on each, but a node of the "
                             "default partition has at most 2 CPUs"), evalue
    assert "give nodes=4 (or more nodes), or at most 4 ranks. No rank was started." in evalue, \
        evalue
    assert our_jobs(slurm_cluster) == []
    r = kernel.execute("%%distributed num_processes=4 nodes=2\nimport os\nos.environ['RANK']\n",
                       timeout=240)
    assert r.status == "ok", r.describe()


@pytest.mark.timeout(300)
def test_silent_ranks_on_every_node_show_where_they_are(kernel, slurm_cluster, tmp_path):
    # Live, over the back channel: the status shows rank 2 (node2) polling
    # for a file while the others wait for it in all_reduce, and drops them
    # once rank 2 prints (distributed/dk_dist_stall.h; tests/e2e/test_stall.py).
    from test_stall import WHERE, printed, wait_status
    go = tmp_path / "go"
    code = ("%%distributed num_processes=4 nodes=2 stall_after=3\n"
            "import os, time, torch, torch.distributed as dist\n"
            "print('joining', flush=True); dist.init_process_group('gloo')\n"
            "print('here', flush=True)\n"
            "if dist.get_rank() == 2:\n"
            f"    while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
            "    print('going', flush=True)\n"
            "dist.all_reduce(torch.ones(1))\n")
    msg_id = kernel.start_execute(code)
    shown = wait_status(kernel, msg_id, lambda _at, t: WHERE in t and "all_reduce" in t,
                        timeout=180)
    lines = [line.strip() for line in shown.splitlines()]
    at = next(i for i, line in enumerate(lines) if WHERE in line)
    assert lines[at + 1].startswith("rank 2:") and "cell line 6" in lines[at + 1], shown
    assert lines[at + 2].startswith("ranks 0, 1, 3 (3): torch.distributed.all_reduce"), shown
    go.touch()
    deadline = time.monotonic() + 60
    while not printed(kernel, msg_id, "[rank 2] going"):
        assert time.monotonic() < deadline, "rank 2 never printed"
        kernel.pump_iopub(0.2)
    r = kernel.finish(msg_id, timeout=60)
    assert r.status == "ok", r.describe()
    assert WHERE not in support.status_displays(r)[-1]["content"]["data"]["text/plain"]
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(400)
def test_restarts_start_a_run_whose_node_was_lost_on_a_new_allocation_without_it(
        kernel, slurm_cluster):
    # restarts=1 (issue 36): a 1-node run's node crashes; the second attempt
    # is a new Slurm job that leaves the lost node out, so it runs on the
    # other one, with the attempt in its environment.
    msg_id = kernel.start_execute(
        "%%distributed num_processes=2 nodes=1 launcher=slurm restarts=1\n"
        "import os, socket, time\n"
        "if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0':\n"
        "    print('READY', socket.gethostname(), flush=True)\n"
        "    time.sleep(300)\n"
        "(socket.gethostname(), os.environ['TORCHELASTIC_RESTART_COUNT'])\n")
    ready = kernel.wait_iopub(lambda m: m["msg_type"] == "stream" and
                              m["parent_header"].get("msg_id") == msg_id and
                              "[rank 1] READY" in m["content"]["text"], timeout=180)
    lost = ready["content"]["text"].split("[rank 1] READY ")[1].split()[0]
    other = "node1" if lost == "node2" else "node2"
    try:
        slurm_cluster.kill(lost)
        r = kernel.finish(msg_id, timeout=180)
    finally:
        slurm_cluster.start(lost)
        slurm_cluster.wait_state(lost, {"idle"})
    assert r.status == "ok", r.describe()
    assert r.result == f"rank 0: ('{other}', '1')\nrank 1: ('{other}', '1')", r.describe()
    assert f"{lost} lost (ranks 0–1)" in r.stderr, r.stderr
    assert f"starting every rank again: attempt 2 of 2, leaving out the lost nodes {lost}" \
        in r.stderr, r.stderr
    assert "attempt 2 runs as Slurm job" in r.stderr and f"on {other}" in r.stderr, r.stderr
    still_serves(kernel)
