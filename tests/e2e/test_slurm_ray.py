"""A real Ray cluster over 2 simulated Slurm nodes (issue 34, item 5):
`@ray_launch(num_processes=4, nodes=2, remote=True)` and `ray_init` in a
`%%distributed nodes=2` cell, 2 ranks on each node, with the kernel installed
for the test venv (whose bin folder, shared by the nodes as a home folder is,
comes first on the ranks' PATH). test_today_ray.py has the same on one node,
and the helpers.

Checked against Ray: the driver's `ray.cluster_resources()` holds both nodes'
CPUs, its Ray nodes are on both Slurm nodes' addresses (not 127.0.1.1, which
the other node could not reach), a stranger without the run's token is
refused, and `ray stop` runs on every rank after the run, with no Ray
process left on either node (the simulated nodes' processes are this host's:
test_today_ray.ray_processes sees them). An interrupt and a failing driver
are test_today_ray.py's, on one node: over two nodes an interrupt's test took
4 minutes of the test command for no path of its own.

Group B of the Slurm clusters (slurm_cluster.GROUP_B_FILES), with
test_today_ray.py: `ray stop` on one of them would stop the other's Ray.
"""
import os

import pytest
from jupyter_client import KernelManager

import support
from test_today_ray import (GONE_WITHIN, LAUNCH, RUN, RecordedRay, VENV,
                            assert_stopped_everywhere, ray_processes, the_result,
                            today)  # noqa: F401 -- `today` is a fixture

pytestmark = [
    # Run after the parallel part, one at a time (scripts/test.sh): Ray's own
    # start-up timeouts (the GCS's RPCs, a node's registration) fail its
    # `ray start` on 2 cores that 4 test workers keep busy, as on one CI run.
    pytest.mark.alone,
    pytest.mark.skipif(support.KERNEL_NAME != "distkernel", reason="ray_launch is distkernel's"),
    pytest.mark.skipif(not VENV, reason="no test venv of today's stack (scripts/venv.sh; "
                                        "scripts/test.sh sets DISTKERNEL_TEST_VENV)"),
]


@pytest.fixture(scope="module")
def kernel(today, slurm_cluster, tmp_path_factory):
    left = ray_processes()
    assert not left, "Ray processes were running before the test:\n" + "\n".join(left)
    logs = tmp_path_factory.mktemp("slurm-ray-logs")
    logs.chmod(0o700)
    env = {k: v for k, v in slurm_cluster.env.items()
           if not k.startswith(("SLURM_", "DISTKERNEL_SLURM_"))
           and k not in ("DISTKERNEL_NODES", "DISTKERNEL_LAUNCHER")}
    env.update(SLURM_CONF=slurm_cluster.conf, DISTKERNEL_LOG_DIR=str(logs),
               MLFLOW_TRACKING_URI="")
    km = KernelManager(kernel_name="distkernel-today", kernel_spec_manager=today)
    k = support.Kernel.launch(km, env=env)
    yield k
    k.stop()


@pytest.fixture
def recorded(kernel, tmp_path):
    """RecordedRay first on the ranks' PATH (on the nodes too: the kernel's
    environment is the ranks')."""
    tmp_path.chmod(0o755)
    rec = RecordedRay(tmp_path)
    r = kernel.execute(f"import os\n_path = os.environ['PATH']\n"
                       f"os.environ['PATH'] = {str(rec.bin)!r} + os.pathsep + _path")
    assert r.status == "ok", r.describe()
    yield rec
    kernel.execute("os.environ['PATH'] = _path")


@pytest.mark.timeout(RUN + GONE_WITHIN + 60)
def test_ray_launch_over_two_slurm_nodes_sees_both_nodes_cpus(kernel, recorded, slurm_cluster):
    r = kernel.execute(LAUNCH.replace("@OPTS@", ", nodes=2, remote=True"), timeout=RUN)
    assert r.status == "ok", r.describe()
    got = the_result(r)
    # 2 Ray nodes on each Slurm node, each with its rank's share: the nodes'
    # CPUs (this host's, which the simulated nodes run on) over their 2 ranks
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert got["nodes"] == 4 and got["cpus"] == 4 * share, got
    net = slurm_cluster.login_addr.rsplit(".", 1)[0] + "."
    assert len(got["hosts"]) == 2 and all(h.startswith(net) for h in got["hosts"]), got
    assert got["mode"] == "token", got
    rc, out = got["stranger"]
    assert rc != 0 and "STRANGER JOINED" not in out, out
    assert "AuthenticationError" in out and "InvalidAuthToken" in out, out
    assert_stopped_everywhere(recorded, r)
