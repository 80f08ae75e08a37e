"""
What a run on the simulated Slurm cluster (tests/slurm/, 2 nodes) shows to
Slurm-aware code and asks of Slurm: the SLURM_* variables its ranks see, the
slurm_args it refuses, and the time limit it asks for.

Helpers and the `kernel` fixture are test_slurm_runs.py's: after each test no
job of ours is in squeue and no rank process lives on any node.
"""
import re
import time

import pytest

import support

from test_slurm_runs import kernel, still_serves, start, wait_clean  # noqa: F401


@pytest.mark.timeout(120)
def test_slurm_args_naming_the_job_is_refused_before_slurm_is_asked(kernel, slurm_cluster):
    jobs_before = slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split()
    r = kernel.execute("%%distributed num_processes=2 nodes=2 slurm_args='-J exp1'\n1\n",
                       timeout=60)
    assert r.status == "error", r.describe()
    evalue = r.content["evalue"]
    assert "slurm_args may not set --job-name (-J), as '-J' does" in evalue, evalue
    assert "--comment=" in evalue, evalue
    # nothing was asked of Slurm: no job of any name, queued or not
    assert slurm_cluster.run("squeue", "-h", "-o", "%i").stdout.split() == jobs_before
    assert wait_clean(slurm_cluster) == []
    still_serves(kernel)


# What Slurm-aware code reads (PyTorch Lightning's SLURMEnvironment, submitit,
# accelerate), and what one `srun -N2 --ntasks-per-node=2` step says.
SLURM_VARS = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS",
              "SLURM_NNODES", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES",
              "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
              "SLURM_GTIDS", "SLURM_DISTRIBUTION")
LISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES")
PRINT_VARS = ("import os\n"
              f"print(' '.join(n + '=' + os.environ.get(n, '-') for n in {SLURM_VARS + LISTS!r}),"
              " flush=True)\n")


def parse_vars(line):
    return dict(word.split("=", 1) for word in line.split())


def real_step_vars(cluster):
    """Each task's variables in one real 2 x 2 step, by SLURM_PROCID."""
    got = cluster.run("salloc", "-N2", "--ntasks-per-node=2", "--no-shell",
                      "--job-name=probe-step")
    assert got.returncode == 0, got.stderr
    job = got.stderr.split("Granted job allocation ")[1].split()[0]
    try:
        step = cluster.run("srun", f"--jobid={job}", "-N2", "--ntasks-per-node=2", "--quiet",
                           "/usr/bin/python3", "-c", PRINT_VARS, timeout=120)
        assert step.returncode == 0, step.stderr
    finally:
        cluster.run("scancel", job)
    tasks = [parse_vars(line) for line in step.stdout.splitlines() if line.strip()]
    return {int(t["SLURM_PROCID"]): t for t in tasks}


@pytest.mark.timeout(300)
def test_every_rank_sees_slurm_variables_of_the_run_not_of_its_step(kernel, slurm_cluster):
    r = kernel.execute("%%distributed num_processes=4 nodes=2\n" + PRINT_VARS, timeout=240)
    assert r.status == "ok", r.describe()
    ranks = {}
    for line in r.stdout.splitlines():
        if line.startswith("[rank ") and "SLURM_PROCID=" in line:
            rank = int(line[6:line.index("]")])
            ranks[rank] = parse_vars(line[line.index("]") + 1:])
    assert sorted(ranks) == [0, 1, 2, 3], r.stdout
    for rank, v in ranks.items():
        assert v["SLURM_PROCID"] == str(rank), v
        assert v["SLURM_LOCALID"] == str(rank % 2), v
        assert v["SLURM_NODEID"] == str(rank // 2), v
        assert v["SLURM_NTASKS"] == v["SLURM_NPROCS"] == v["SLURM_STEP_NUM_TASKS"] == "4", v
        assert v["SLURM_NNODES"] == v["SLURM_STEP_NUM_NODES"] == v["SLURM_JOB_NUM_NODES"] == "2"
        assert v["SLURM_TASKS_PER_NODE"] == v["SLURM_STEP_TASKS_PER_NODE"] == "2(x2)", v
        assert v["SLURM_STEP_NODELIST"] == v["SLURM_JOB_NODELIST"] == "node1,node2", v
    # the same as Slurm's own step of the same shape says, list syntax apart
    real = real_step_vars(slurm_cluster)
    for rank in range(4):
        assert {n: ranks[rank][n] for n in SLURM_VARS} == {n: real[rank][n] for n in SLURM_VARS}
    assert wait_clean(slurm_cluster) == []


# The test cluster's `short` partition has MaxTime=5 (minutes), and Slurm's
# default EnforcePartLimits=NO: a longer request is queued for ever.
TIME_LIMIT_CELL = ("%%distributed num_processes=2 nodes=2 partition=short{}\n"
                   "import os, subprocess\n"
                   "subprocess.run(['squeue', '-h', '-j', os.environ['SLURM_JOB_ID'], '-o', "
                   "'LIMIT=%l'], check=True)\n")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("timeout", ["", " timeout=None"])
def test_without_a_timeout_the_time_limit_fits_the_partition(kernel, slurm_cluster, timeout):
    # no timeout=: 3 h 05 is cut to the MaxTime; timeout=None: the MaxTime,
    # not the DefaultTime (1 minute) that would end the ranks under the user
    r = kernel.execute(TIME_LIMIT_CELL.format(timeout), timeout=240)
    assert r.status == "ok", r.describe()
    assert "[rank 0] LIMIT=5:00" in r.stdout, r.describe()
    assert wait_clean(slurm_cluster) == []


@pytest.mark.timeout(120)
def test_a_timeout_over_the_partitions_limit_fails_at_once_saying_so(kernel, slurm_cluster):
    t0 = time.monotonic()
    r = kernel.execute(TIME_LIMIT_CELL.format(" timeout=600"), timeout=90)
    took = time.monotonic() - t0
    assert r.status == "error", r.describe()
    assert r.content["ename"] == "RuntimeError", r.describe()
    evalue = r.content["evalue"]
    assert "Slurm will not run the request: Slurm will not run job" in evalue, evalue
    assert "its time limit (15:00) is over a limit of the partition" in evalue, evalue
    assert "(PENDING: PartitionTimeLimit)" in evalue, evalue
    assert "give a shorter timeout=, or a partition= whose limit allows it" in evalue, evalue
    assert "longer timeout" not in evalue, evalue
    assert took < 60, took      # not the whole wait (timeout=600)
    assert wait_clean(slurm_cluster) == []
    still_serves(kernel)


@pytest.mark.timeout(120)
def test_started_ranks_over_the_partitions_limit_fail_at_once_saying_what_to_change(
        kernel, slurm_cluster):
    # started ranks ask for the MaxTime; a --time of the user's wins, here
    # over the MaxTime (5 minutes)
    t0 = time.monotonic()
    r = kernel.execute("%distributed start nodes=2 num_processes=2 partition=short "
                       "slurm_args='--time=10:00'\n", timeout=90)
    assert r.status == "error", r.describe()
    evalue = r.content["evalue"]
    assert "its time limit (the --time of slurm_args) is over a limit of the partition " \
           "(PENDING: PartitionTimeLimit)" in evalue, evalue
    assert "Started ranks ask for the partition's MaxTime: give a shorter one in " \
           "slurm_args='--time=H:MM:SS', or a partition= whose limit allows it" in evalue, evalue
    assert time.monotonic() - t0 < 60
    assert wait_clean(slurm_cluster) == []
    still_serves(kernel)


# What a rank was started with (/proc/self/environ: what srun sent to its node)
# and what it has when the cell runs, of these names.
SECRETS = ("JUPYTERHUB_API_TOKEN", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_TOKEN",
           "MLFLOW_TRACKING_URI", "HF_TOKEN", "DK_PLAIN")
SECRETS_CELL = ("%%distributed num_processes=2 nodes=2\n"
                "import os\n"
                "_start = {w.split(b'=', 1)[0].decode()\n"
                "          for w in open('/proc/self/environ', 'rb').read().split(b'\\0') if w}\n"
                f"print('START', *[n for n in {SECRETS!r} if n in _start], flush=True)\n"
                f"print('NOW', *[n + '=' + os.environ[n] for n in {SECRETS!r} if n in os.environ],"
                " flush=True)\n")


@pytest.mark.timeout(300)
def test_secrets_are_not_sent_to_slurm_ranks_unless_listed_and_mlflows_come_by_the_channel(
        slurm_cluster, tmp_path):
    # A tracking URI with a password in it is a secret too; nothing listens
    # there, so tracking is off for the run, and the URI still reaches the
    # ranks as the notebook's MLflow calls would need it: by the channel.
    uri = f"http://ann:uri-5ecret@127.0.0.1:{support.closed_port()}"
    k = start(tmp_path, slurm_cluster, JUPYTERHUB_API_TOKEN="hub-5ecret",
              AWS_SECRET_ACCESS_KEY="aws-5ecret", MLFLOW_TRACKING_TOKEN="ml-5ecret",
              MLFLOW_TRACKING_URI=uri, DISTKERNEL_MLFLOW_TIMEOUT="1",
              HF_TOKEN="hf-listed", DK_PLAIN="plain", DISTKERNEL_SLURM_EXPORT_SECRETS="HF_TOKEN")
    try:
        r = k.execute(SECRETS_CELL, timeout=240)
    finally:
        k.stop()
    assert r.status == "ok", r.describe()
    for rank in (0, 1):
        lines = [line.split("] ", 1)[1].split() for line in r.stdout.splitlines()
                 if line.startswith(f"[rank {rank}] ")]
        start_names = next(words[1:] for words in lines if words[0] == "START")
        now = dict(w.split("=", 1) for w in next(words[1:] for words in lines
                                                    if words[0] == "NOW"))
        # Sent by srun: the listed secret and the rest, not the others.
        assert sorted(start_names) == ["DK_PLAIN", "HF_TOKEN"], (rank, start_names)
        # MLflow's token reached the rank through the run's channel; the others never.
        # The URI names the kernel's 127.0.0.1: on the node it names the node's
        # door to it instead (dk_tunnel.h), its credentials kept.
        door_uri = now.pop("MLFLOW_TRACKING_URI", "")
        assert re.fullmatch(r"http://ann:uri-5ecret@127\.0\.0\.1:\d+", door_uri), door_uri
        assert now == {"MLFLOW_TRACKING_TOKEN": "ml-5ecret",
                       "HF_TOKEN": "hf-listed", "DK_PLAIN": "plain"}, (rank, now)
    assert wait_clean(slurm_cluster) == [], "left behind after the test"
