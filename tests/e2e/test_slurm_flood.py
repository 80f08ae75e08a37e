"""
Issue 21, item 4 (and the back channel of issue 22) end to end, on the
simulated Slurm cluster: another user floods the kernel's back-channel port
while a 2x2 cell runs.

The stranger is `dkattacker` (tests/e2e/users.py) on the kernel's own host,
the login namespace, whose address on the cluster's network ($NET.1) is none
of the run's nodes. It finds the port the way anyone can, as a new listening
socket on that address in /proc/net/tcp, and opens 300 connections a second
to it, holding the newest 400 open and never saying a word, until the cell is
done (bounded: at most 120 s, and a stop file).

What must hold:
- the cell runs, on both nodes (the ranks are not kept out);
- not one of the stranger's connections is sent a byte (they are dropped at
  accept: before the fix each was sent a nonce and held a slot);
- once every rank is in, the port is closed: each rank, after a barrier, tries
  to connect to the back channel from its node (an allowed address) and is
  refused.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import support
import users

sys.path.insert(0, os.path.dirname(__file__))
from test_slurm_runs import start, wait_clean  # noqa: E402

pytestmark = pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                reason="distkernel's back channel")

RATE = 300          # connections a second, as issue 21 asks
HOLD = 400          # the newest this many stay open

FLOODER = r"""
import errno, json, os, select, socket, sys, time
net1, rate, hold, limit_s, stop = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    float(sys.argv[4]), sys.argv[5]
want = "".join(f"{int(x):02X}" for x in reversed(net1.split(".")))

def listening():
    ports = set()
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            p = line.split()
            addr, port = p[1].split(":")
            if addr == want and p[3] == "0A":
                ports.add(int(port, 16))
    return ports

before = listening()
print("ready", flush=True)
t0 = time.monotonic()
port = None
while port is None and time.monotonic() - t0 < limit_s and not os.path.exists(stop):
    new = listening() - before
    port = min(new) if new else None
    if port is None:
        time.sleep(0.002)
stats = {"port": port, "opened": 0, "bytes": 0, "closed_by_peer": 0, "refused": 0,
         "errors": 0, "seconds": 0.0}
held = []
t1 = time.monotonic()
k = 0
while port is not None and time.monotonic() - t0 < limit_s and not os.path.exists(stop):
    due = t1 + k / rate
    wait = due - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    k += 1
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    rc = s.connect_ex((net1, port))
    if rc not in (0, errno.EINPROGRESS):
        stats["refused" if rc == errno.ECONNREFUSED else "errors"] += 1
        s.close()
    else:
        stats["opened"] += 1
        held.append(s)
    if len(held) > hold:
        held.pop(0).close()
    if k % 20 == 0 and held:
        readable, _, _ = select.select(held, [], [], 0)
        for r in readable:
            try:
                got = r.recv(4096)
            except OSError as exc:
                stats["refused" if exc.errno == errno.ECONNREFUSED else "closed_by_peer"] += 1
                got = None
            if got:
                stats["bytes"] += len(got)
            else:
                if got == b"":
                    stats["closed_by_peer"] += 1
                held.remove(r)
                r.close()
stats["seconds"] = round(time.monotonic() - t1, 2)
for s in held:
    s.close()
print(json.dumps(stats), flush=True)
"""

# warm=False: the cell reads the back channel's address from the environment
# its node agent was started with (/proc/PPID/environ: a cold rank is the
# agent's child), which a warm rank, forked from its node's template, is not.
CELL = """%%distributed num_processes=4 nodes=2 warm=False
import os, socket, time, torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()          # every rank said its HELLO before its code ran
def environ(pid):
    text = open(f"/proc/{pid}/environ").read()
    return dict(v.split("=", 1) for v in text.split("\\0") if "=" in v)
# The rank's channel is its node agent's relay (a Unix socket); the agent,
# its parent, has the kernel's address.
assert environ("self")["DISTKERNEL_BC"].endswith("/relay.sock")
host, port = environ(os.getppid())["DISTKERNEL_BC"][4:].rsplit(":", 1)
try:
    socket.create_connection((host, int(port)), timeout=5).close()
    state = "open"
except ConnectionRefusedError:
    state = "closed"
except OSError as exc:
    state = f"unknown ({exc})"
dist.barrier()
print("host", socket.gethostname(), "rank", dist.get_rank(), "back channel", state, flush=True)
time.sleep(2)           # the flood goes on while the ranks run
dist.get_rank()
"""


@pytest.mark.timeout(360)
def test_a_2x2_cell_runs_while_another_user_floods_its_back_channel(slurm_cluster, tmp_path):
    _, attacker = users.pair()
    net1 = slurm_cluster.login_addr     # the kernel's host on the cluster's network
    # The stranger reads its script from a folder it can reach (tmp_path's
    # parents are root's own) and is told to stop by a file there.
    shared = pathlib.Path(tempfile.mkdtemp(prefix="dk-flood-"))
    shared.chmod(0o755)
    stop = shared / "stop"
    script = shared / "flooder.py"
    script.write_text(FLOODER)
    script.chmod(0o644)
    k = start(tmp_path, slurm_cluster)
    flooder = None
    try:
        still = k.execute("1 + 1")
        assert still.status == "ok", still.describe()
        flooder = users.popen_as(attacker, ["/usr/bin/python3", str(script), net1, str(RATE),
                                            str(HOLD), "120", str(stop)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert flooder.stdout.readline().strip() == "ready", flooder.stderr.read()
        t0 = time.monotonic()
        r = k.execute(CELL, timeout=300)
        took = time.monotonic() - t0
        stop.touch()
        out, err = flooder.communicate(timeout=30)
        stats = json.loads(out.strip().splitlines()[-1])
        print(f"cell {took:.1f} s under the flood: {stats}")
        assert r.status == "ok", r.describe()
        for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
            assert f"host {host} rank {rank} back channel closed" in r.stdout, r.stdout
        assert stats["port"], f"the stranger never saw the port: {stats} {err}"
        rate = stats["opened"] / max(stats["seconds"], 0.1)
        assert stats["opened"] >= 300 and rate >= 0.6 * RATE, f"no flood happened: {stats}"
        assert stats["bytes"] == 0, f"a stranger's connection was sent bytes: {stats}"
    finally:
        stop.touch()
        if flooder and flooder.poll() is None:
            flooder.kill()
            flooder.wait()
        k.stop()
        shutil.rmtree(shared, ignore_errors=True)
    assert wait_clean(slurm_cluster) == [], "left behind after the test"
