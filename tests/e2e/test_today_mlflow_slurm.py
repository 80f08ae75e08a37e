"""The real MLflow 3 server of the kernel, reached by ranks on other nodes
(issue 34, item 4): on the simulated 2-node Slurm cluster, the kernel
installed for the test venv starts its own `mlflow server` on its host's
127.0.0.1, and a 2 x 2 cell's ranks log into the cell's run with
`mlflow.log_metric`, through the door each node's agent keeps on that node's
127.0.0.1 and the job's gate on the kernel's host (dk_tunnel.h). Another
user of a node gets nothing through the door.

Skipped where the venv is not built, as test_today_mlflow.py, and in the
sanitizer pass (its C paths are the tunnel's unit tests and the Slurm tests').
"""
import os
import re

import pytest
from jupyter_client import KernelManager

import slurm_cluster as cluster_module
import support
from test_today_mlflow import VENV, RUN, SLOW_MACHINE, get, the_run, today  # noqa: F401
from test_slurm_runs import wait_clean

pytestmark = [
    pytest.mark.skipif(support.KERNEL_NAME != "distkernel", reason="%%distributed is distkernel's"),
    pytest.mark.skipif(not VENV, reason="no test venv of today's stack (scripts/venv.sh; "
                                        "scripts/test.sh sets DISTKERNEL_TEST_VENV)"),
]

# Each rank logs a metric of its own, says where it ran and what its tracking
# URI became; rank 0 of the second node also asks the door as `nobody`, who
# must get nothing, and then as itself, who must get the server's answer.
CELL = """%%distributed num_processes=4 nodes=2
import os, socket, subprocess, sys, mlflow
rank = int(os.environ["RANK"])
mlflow.log_metric(f"node_metric_rank{rank}", 10.0 + rank)
door = os.environ.get("DISTKERNEL_TRACKING_PORT", "")
stranger = None
if rank == 2 and os.geteuid() == 0:
    ask = ("import sys, urllib.request as u\\n"
           "try:\\n"
           "    u.build_opener(u.ProxyHandler({})).open("
           "'http://127.0.0.1:' + sys.argv[1] + '/health', timeout=20).read()\\n"
           "    print('ANSWERED')\\n"
           "except Exception as e:\\n"
           "    print('REFUSED', type(e).__name__)\\n")
    as_nobody = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                "/usr/bin/python3", "-c", ask, door],
                               capture_output=True, text=True, timeout=60)
    as_me = subprocess.run(["/usr/bin/python3", "-c", ask, door], capture_output=True,
                           text=True, timeout=60)
    stranger = (as_nobody.stdout.strip() or as_nobody.stderr[-300:], as_me.stdout.strip())
(socket.gethostname(), os.environ["MLFLOW_TRACKING_URI"], door, stranger)
"""


def kernel_of_a_cluster_user(specs, cluster, root, **env):
    """The venv's kernel (kernelspecs SPECS) as a user of CLUSTER starts it:
    the cluster's client environment, no allocation's variables and no
    MLFLOW_TRACKING_URI (it starts its own server on 127.0.0.1), its logs in
    ROOT/logs and its folder ROOT/notebook, with ENV."""
    base = {k: v for k, v in cluster.env.items()
            if not k.startswith(("SLURM_", "DISTKERNEL_SLURM_", "MLFLOW_")) and
            k not in ("DISTKERNEL_NODES", "DISTKERNEL_LAUNCHER")}
    logs = root / "logs"
    logs.mkdir(mode=0o700)
    notebook = root / "notebook"
    notebook.mkdir(mode=0o700)
    base.update(DISTKERNEL_LOG_DIR=str(logs), SLURM_CONF=cluster.conf, **SLOW_MACHINE, **env)
    for name in cluster_module.TEMPLATE_VARS:   # this module's, as test_slurm_runs.start
        if name in os.environ:
            base[name] = os.environ[name]
    km = KernelManager(kernel_name="distkernel-today", kernel_spec_manager=specs)
    return support.Kernel.launch(km, env=base, cwd=str(notebook))


@pytest.fixture
def kernel(today, slurm_cluster, tmp_path):  # noqa: F811
    k = kernel_of_a_cluster_user(today, slurm_cluster, tmp_path)
    yield k
    k.stop()
    assert wait_clean(slurm_cluster) == [], "left behind after the test"


@pytest.mark.timeout(420)
def test_ranks_on_the_nodes_log_into_the_run_on_the_kernels_own_server(kernel):
    r = kernel.execute(CELL, timeout=RUN + 60)
    assert r.status == "ok", r.describe()
    server, run = the_run(r)
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", server), server
    assert run["info"]["status"] == "FINISHED", run["info"]
    # every rank's metric, from both nodes, in the cell's run
    for rank in range(4):
        history = get(server, "metrics/get-history", run_id=run["info"]["run_id"],
                      metric_key=f"node_metric_rank{rank}")["metrics"]
        assert [m["value"] for m in history] == [10.0 + rank], (rank, history)
    values = r.of_type("execute_result")[0]["content"]["data"]["text/plain"]  # each rank's value
    # the ranks ran on the cluster's nodes, each through its own node's door
    hosts = set(re.findall(r"'(node\d+)'", values))
    assert len(hosts) == 2, values
    doors = re.findall(r"'http://127\.0\.0\.1:(\d+)',\s*'(\d+)'", values)
    assert len(doors) == 4 and all(uri == door for uri, door in doors), values
    # another user of the node gets nothing through the door; the user does
    if os.geteuid() == 0:
        assert "('REFUSED" in values and "'ANSWERED')" in values, values


@pytest.mark.timeout(420)
def test_started_ranks_on_the_nodes_log_each_cell_into_its_own_run(kernel):
    """Started ranks outlive runs: their gate is open from their start, before
    any run, and each cell's run gives it the server (dk_job_set_tunnel_upstream)."""
    r = kernel.execute("%distributed start nodes=2 num_processes=4", timeout=RUN + 60)
    assert r.status == "ok", r.describe()
    try:
        runs = []
        for cell in (1, 2):
            r = kernel.execute("%%distributed\nimport os, mlflow\n"
                               f"mlflow.log_metric('cell{cell}', int(os.environ['RANK']))\n"
                               "os.environ['MLFLOW_TRACKING_URI']", timeout=RUN)
            assert r.status == "ok", r.describe()
            server, run = the_run(r)
            assert run["info"]["status"] == "FINISHED", run["info"]
            history = get(server, "metrics/get-history", run_id=run["info"]["run_id"],
                          metric_key=f"cell{cell}")["metrics"]
            assert sorted(m["value"] for m in history) == [0.0, 1.0, 2.0, 3.0], history
            runs.append(run["info"]["run_id"])
        assert runs[0] != runs[1]
    finally:
        kernel.execute("%distributed stop", timeout=RUN)
