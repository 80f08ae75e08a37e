"""
A run's step starts beside the job's other steps on any site: on a cluster
where memory is a consumable resource (the second simulated cluster,
`slurm_mem_cluster`: SelectTypeParameters=CR_CPU_Memory, no DefMemPerCPU),
and for a kernel whose environment describes a batch job's or a step's shape
(SLURM_MEM_PER_NODE, SRUN_CPUS_PER_TASK ..., which every srun reads as its
defaults), or which runs inside a step that holds its allocation's CPUs
(`srun --pty jupyter lab`).

The ranks are started by the node agents' one step (docs/slurm.md), and rank
0 waits in the rendezvous for all the others: a step that Slurm holds back
until another ends is a cell that hangs until timeout=. The cells here have a
short timeout= so that such a wait fails the test rather than hang it.

Helpers are test_slurm_runs.py's: after each test no job of ours is in squeue
and no rank process lives on any node.
"""
import subprocess
import time

import pytest

from test_slurm_runs import GLOO_CELL, our_jobs, start, still_serves, wait_clean

CELL = GLOO_CELL.replace("nodes=2\n", "nodes=2 timeout=60\n", 1)
RESULT = ("rank 0: ('node1', 0, 10)\nrank 1: ('node1', 1, 10)\n"
          "rank 2: ('node2', 2, 10)\nrank 3: ('node2', 3, 10)")


def allocate(cluster, *args):
    got = cluster.run("salloc", "-N2", "--ntasks-per-node=2", "--no-shell",
                      "--job-name=batch-of-user", *args)
    assert got.returncode == 0, got.stderr
    return got.stderr.split("Granted job allocation ")[1].split()[0]


@pytest.mark.timeout(300)
def test_a_batch_job_that_asked_for_memory_runs_its_2_by_2_cell(slurm_mem_cluster, tmp_path):
    # A kernel started by `sbatch -N2 --ntasks-per-node=2 --mem=1500`: its
    # environment says SLURM_MEM_PER_NODE=1500, which srun takes as every
    # step's --mem; with it the agents' step would ask for memory the job's
    # other steps may hold, and wait for it.
    cluster = slurm_mem_cluster
    config = cluster.run("scontrol", "show", "config").stdout
    assert "SelectTypeParameters    = CR_CPU_MEMORY" in config, config
    job = allocate(cluster, "--mem=1500")
    try:
        k = start(tmp_path, cluster, SLURM_JOB_ID=job, SLURM_JOB_NODELIST="node[1-2]",
                  SLURM_NNODES="2", SLURM_NTASKS="4", SLURM_NTASKS_PER_NODE="2",
                  SLURM_MEM_PER_NODE="1500")
        try:
            r = k.execute(CELL, timeout=240)
            assert r.status == "ok", r.describe()
            assert r.result == RESULT, r.describe()
            still_serves(k)
        finally:
            k.stop()
        assert wait_clean(cluster) == []
        state = cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
        assert state == "RUNNING", "the kernel's own allocation was ended"
    finally:
        cluster.run("scancel", job)


ENV_CELL = CELL + """\
import os
print('env', ' '.join(n + '=' + os.environ.get(n, '-') for n in (
    'SLURM_JOB_ID', 'SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_MEM_PER_NODE',
    'SLURM_CPUS_PER_TASK', 'SRUN_CPUS_PER_TASK', 'SLURM_LABELIO')), flush=True)
"""


@pytest.mark.timeout(300)
def test_a_kernel_inside_a_step_with_srun_defaults_in_its_environment_runs_its_ranks(
        slurm_mem_cluster, tmp_path):
    # The kernel runs in a step of its allocation that holds every CPU of it
    # (`srun --pty jupyter lab`; here a step that sleeps), and its environment
    # carries srun's defaults of a batch script: 2 CPUs per task (all of a
    # node's), more memory than a node has, a label on every line.
    cluster = slurm_mem_cluster
    job = allocate(cluster)
    holder = subprocess.Popen(["srun", f"--jobid={job}", "-N2", "--ntasks-per-node=2",
                               "--quiet", "sleep", "600"], env=cluster.env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while f"{job}.0" not in cluster.run("squeue", "-h", "-s", "-j", job, "-o",
                                            "%i").stdout.split():
            assert time.monotonic() < deadline and holder.poll() is None, "no step held the CPUs"
            time.sleep(0.2)
        k = start(tmp_path, cluster, SLURM_JOB_ID=job, SLURM_JOB_NODELIST="node[1-2]",
                  SLURM_STEP_ID="0", SLURM_CPUS_PER_TASK="2", SRUN_CPUS_PER_TASK="2",
                  SLURM_MEM_PER_NODE="4096", SLURM_NTASKS_PER_NODE="2",
                  SLURM_DISTRIBUTION="cyclic", SLURM_LABELIO="1")
        try:
            r = k.execute(ENV_CELL, timeout=240)
            assert r.status == "ok", r.describe()
            for rank in range(4):
                # the job's variables are kept, the run's shape is rewritten,
                # srun's defaults are gone (the cell ran, so no step waited)
                assert (f"[rank {rank}] env SLURM_JOB_ID={job} SLURM_PROCID={rank} "
                        "SLURM_NTASKS=4 SLURM_MEM_PER_NODE=- SLURM_CPUS_PER_TASK=- "
                        "SRUN_CPUS_PER_TASK=- SLURM_LABELIO=-") in r.stdout, r.describe()
            assert "[rank 3] host node2 rank 3 local 1 sum 10" in r.stdout, r.describe()
            still_serves(k)
        finally:
            k.stop()
        assert wait_clean(cluster) == []
        assert holder.poll() is None, "the kernel's own step was ended"
    finally:
        holder.terminate()
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
        cluster.run("scancel", job)
    assert our_jobs(cluster) == []
