"""Warm start on Slurm's nodes: each node agent forks its node's ranks from a
template of its own that imported torch once (runtime/agent/dk_agent.h), as the
kernel does on its node (test_warm.py), with the cold start as the fallback.

The ranks prove where they came from: torch already imported when the cell's
first line runs, and a parent that is their node's template. A node whose
template cannot import runs its ranks cold in the same run, which succeeds and
says so once, in warm.log; its ranks' environment is the warm ones' but for
what names the rank and node. A killed agent takes its template and the
template's socket folder with it. No timing is asserted (bench/scale_bench.py).
"""
import json
import os
import re
import signal
import time

import pytest

import support
from test_slurm_runs import node_commands, rank_processes, start, wait_clean

pytestmark = [pytest.mark.skipif(support.KERNEL_NAME != "distkernel",
                                 reason="%distributed is distkernel's")]

RUN = 240

# A warm module that imports everywhere but on node2.
NODE2_FAILS = ("import socket\n"
               "if socket.gethostname() == 'node2':\n"
               "    raise ImportError('this module is not for node2')\n")

PROBE = """%%distributed num_processes=4 nodes=2 tracking=False {opts}
import sys
TORCH_FIRST = 'torch' in sys.modules
import json, os
def parent(pid):  # its process name, at most 15 characters
    with open(f'/proc/{{pid}}/comm') as f:
        return f.read().strip()
json.dumps({{'env': dict(os.environ), 'torch_first': TORCH_FIRST, 'ppid': os.getppid(),
            'parent': parent(os.getppid()), 'pgid': os.getpgrp(), 'sid': os.getsid(0),
            'pid': os.getpid()}})
"""

# Uses only the standard library: its nodes' templates import no warm module.
LIGHT = """%%distributed num_processes=4 nodes=2 tracking=False warm_modules=warm_not_on_node2
import json, os, sys
with open(f'/proc/{os.getppid()}/comm') as f:
    PARENT = f.read().strip()
json.dumps({'modules': sorted(sys.modules), 'parent': PARENT, 'log': os.environ['DISTKERNEL_LOG']})
"""


def probe(k, opts=""):
    r = k.execute(PROBE.format(opts=opts), timeout=RUN)
    assert r.status == "ok", r.describe()
    ranks = {}
    for m in re.finditer(r"^rank (\d+): '(.*)'$", r.result, re.M):
        ranks[int(m.group(1))] = json.loads(m.group(2).encode().decode("unicode_escape"))
    assert sorted(ranks) == [0, 1, 2, 3], r.describe()
    return r, ranks


# What differs between ranks on two nodes by design: which rank and node they
# are (their node's tasks, its agent's pid), and their log file.
PER_RANK = {"RANK", "GROUP_RANK", "NODE_RANK", "ROLE_RANK", "SLURM_PROCID", "SLURM_NODEID",
            "SLURMD_NODENAME", "SLURM_TOPOLOGY_ADDR", "SLURM_GTIDS", "SLURM_TASK_PID",
            "DISTKERNEL_LOG", "HOSTNAME",
            "DISTKERNEL_TRACKING_PORT"}     # its node's door to the tracking server


def test_a_node_whose_template_cannot_import_runs_cold_beside_warm_ones(slurm_cluster,
                                                                         tmp_path):
    mods = tmp_path / "mods"
    mods.mkdir(mode=0o700)
    (mods / "warm_not_on_node2.py").write_text(NODE2_FAILS)
    k = start(tmp_path, slurm_cluster)
    try:
        r = k.execute(f"import sys; sys.path.insert(0, {str(mods)!r})")
        assert r.status == "ok", r.describe()
        r, ranks = probe(k, "warm_modules=warm_not_on_node2")
        # node1's ranks (0, 1) came from its template; node2's (2, 3) are cold.
        for rank in (0, 1):
            info = ranks[rank]
            assert info["torch_first"] and info["parent"] == "distkernel-tmpl", (rank, info)
            # Forked into a session (and group) of its own, as on one node.
            assert info["pgid"] == info["sid"] == info["pid"], info
        assert ranks[0]["ppid"] == ranks[1]["ppid"], "one template for the node's ranks"
        for rank in (2, 3):
            info = ranks[rank]
            assert not info["torch_first"] and info["parent"] == "distkernel-agen", (rank, info)
            assert info["pgid"] == info["sid"] == info["pid"], info
        # The same environment, warm or cold, but for what names the rank.
        warm, cold = ranks[0]["env"], ranks[2]["env"]
        assert set(warm) == set(cold), set(warm) ^ set(cold)
        differ = {n for n in warm if warm[n] != cold[n]}
        assert differ <= PER_RANK, {n: (warm[n], cold[n]) for n in differ - PER_RANK}
        assert warm["SLURM_PROCID"] == "0" and cold["SLURM_PROCID"] == "2", (warm, cold)
        assert "DISTKERNEL_WARM_SOCKET" not in warm and "DISTKERNEL_BC_KEY" not in warm, warm
        # Said once for the run, in its warm.log, not in the cell.
        log_dir = os.path.dirname(ranks[0]["env"]["DISTKERNEL_LOG"])
        with open(os.path.join(log_dir, "warm.log")) as f:
            lines = f.read().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("the ranks on node 1 (node2) started cold: the warm-start "
                                   "template exited with code 3"), lines
        assert "this module is not for node2" in lines[0], lines
        assert "cold" not in r.stdout + r.stderr, r.describe()
        # warm=False: no template anywhere, every rank cold.
        r, ranks = probe(k, "warm=False")
        for rank, info in ranks.items():
            assert not info["torch_first"] and info["parent"] == "distkernel-agen", (rank, info)
        # A cell that imports only the standard library and names no warm
        # module: every node's template imports none (node2's too, so all
        # four ranks are warm), and warm.log says why.
        r = k.execute(LIGHT, timeout=RUN)
        assert r.status == "ok", r.describe()
        light = {int(m.group(1)): json.loads(m.group(2)) for m in
                 re.finditer(r"^rank (\d+): '(.*)'$", r.result, re.M)}
        assert sorted(light) == [0, 1, 2, 3], r.describe()
        for rank, info in light.items():
            assert info["parent"] == "distkernel-tmpl", (rank, info)
            assert not {"torch", "warm_not_on_node2"} & set(info["modules"]), (rank, info)
        with open(os.path.join(os.path.dirname(light[0]["log"]), "warm.log")) as f:
            lines = f.read().splitlines()
        assert lines == ["the nodes' templates imported none of the warm modules (torch, "
                         "warm_not_on_node2): the run's code imports only the standard library "
                         "and names none of them"], lines
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []


def on_node(cluster, node, word):
    """Pids of the processes on NODE whose command line holds WORD."""
    return [pid for pid, cmd in node_commands(cluster, node) if word in cmd]


def wait_for(what, timeout=30):
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what.__doc__}"
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_a_killed_agent_takes_its_template_and_its_socket_folder(slurm_cluster, tmp_path):
    k = start(tmp_path, slurm_cluster)
    try:
        msg_id = k.start_execute("%%distributed num_processes=4 nodes=2 tracking=False\n"
                                 "import sys, time\nprint('READY', 'torch' in sys.modules, "
                                 "flush=True)\ntime.sleep(300)\n")
        k.wait_iopub(lambda m: m["msg_type"] == "stream" and
                     m["parent_header"].get("msg_id") == msg_id and
                     "[rank 3] READY" in m["content"]["text"], timeout=RUN)
        templates = on_node(slurm_cluster, "node2", "distkernel-template")
        assert len(templates) == 1, templates
        with open(f"/proc/{templates[0]}/environ", "rb") as f:
            env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
        folder = os.path.dirname(env[b"DISTKERNEL_TEMPLATE"].decode())
        assert os.path.isdir(folder), folder
        agents = [p for p in on_node(slurm_cluster, "node2", "distkernel-agent")
                  if "distkernel-template" not in open(f"/proc/{p}/cmdline").read()]
        agent = min(agents)     # the agent, not a last word it forked
        os.kill(agent, signal.SIGKILL)

        def template_gone():
            """node2's template ended and its folder removed"""
            left = on_node(slurm_cluster, "node2", "distkernel-template")
            template_gone.__doc__ = (f"node2's template ended and its folder removed (left: "
                                     f"template pids {left}, folder "
                                     f"{'kept' if os.path.exists(folder) else 'removed'})")
            return not left and not os.path.exists(folder)
        # Under the sanitizers, on 2 loaded cores, it once took just over 30 s.
        wait_for(template_gone, timeout=60 if os.environ.get("DISTKERNEL_SANITIZED") == "1"
                 else 30)
        r = k.finish(msg_id, timeout=RUN)
        assert r.status == "error", r.describe()
        assert "node2" in r.content["evalue"] + r.stdout + r.stderr, r.describe()
        assert "[rank 0] READY True" in r.stdout, "the ranks were warm: " + r.describe()
    finally:
        k.stop()
    assert wait_clean(slurm_cluster) == []
    assert rank_processes(slurm_cluster) == []
