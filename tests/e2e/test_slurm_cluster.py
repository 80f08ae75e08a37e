"""
The test cluster itself (tests/slurm/cluster.sh): what the Slurm launcher's tests
stand on. Placement over the simulated nodes, a crashed node and its reboot, and
a teardown that leaves nothing while another cluster keeps running beside it.
"""
import os
import subprocess
import time

from slurm_cluster import CLUSTER, bring_up, cluster_sh


def test_tasks_run_on_each_node_with_its_own_hostname(slurm_cluster):
    run = slurm_cluster.run("srun", "-N2", "--ntasks-per-node=2", "--label", "hostname")
    assert run.returncode == 0, run.stderr
    hosts = sorted(line.split(": ", 1)[1] for line in run.stdout.splitlines())
    assert hosts == ["node1", "node1", "node2", "node2"]


def test_a_killed_node_leaves_no_process_and_boots_again(slurm_cluster):
    # A job that ran just before (the test above, or any other of the session:
    # the cluster is shared) may still be completing on node2. Crashed then, it
    # keeps the rebooted node "mixed" until slurmctld gives up on it, which is
    # not what this test is about: it starts from an idle node.
    assert slurm_cluster.wait_state("node2", {"idle"}) == "idle"
    assert slurm_cluster.pids("node2"), "node2 runs nothing before the crash"
    slurm_cluster.kill("node2")
    gone = subprocess.run([str(CLUSTER), "pids", "node2"], capture_output=True, text=True)
    assert gone.returncode != 0 and "not running" in gone.stderr
    slurm_cluster.start("node2")
    assert slurm_cluster.wait_state("node2", {"idle"}) == "idle"
    # slurmctld may call the node idle a moment before its slurmd takes step
    # launches ("Communication connection failure"): a rebooted node must run
    # a job again soon, not on the very first try.
    deadline = time.monotonic() + 60
    while True:
        run = slurm_cluster.run("srun", "-N2", "--ntasks-per-node=1", "hostname")
        if run.returncode == 0 or time.monotonic() > deadline or \
                "Communication connection failure" not in run.stderr:
            break
        time.sleep(1)
    assert run.returncode == 0 and sorted(run.stdout.split()) == ["node1", "node2"], run.stderr


def test_teardown_leaves_nothing_and_spares_another_cluster(slurm_cluster):
    # munged wants every folder above its socket searchable by all: not pytest's tmp_path
    folder = f"/tmp/distkernel-slurm-other-{os.getpid()}"
    other = dict(os.environ, DISTKERNEL_SLURM_SIM_DIR=folder,
                 DISTKERNEL_SLURM_SIM_NET="10.79.1", DISTKERNEL_SLURM_SIM_BRIDGE="dkslurm1")
    try:
        second = bring_up(1, env=other)
        assert second.started
        assert second.run("srun", "-N1", "hostname").stdout.strip() == "node1"
        # a job left running on it is ended with it
        job = second.run("salloc", "-N1", "--no-shell")
        assert job.returncode == 0, job.stderr
    finally:
        cluster_sh("down", env=other)
    left = subprocess.run([str(CLUSTER), "leftovers"], capture_output=True, text=True, env=other)
    assert left.returncode == 0, f"left behind:\n{left.stdout}"
    assert not os.path.exists(folder)
    run = slurm_cluster.run("sinfo", "-h", "-p", "sim", "-o", "%T %D")
    assert run.stdout.strip() == "idle 2", run.stdout + run.stderr
