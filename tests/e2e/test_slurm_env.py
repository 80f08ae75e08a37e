"""
What a run on the simulated Slurm cluster (tests/slurm/, 2 nodes) shows to
Slurm-aware code and asks of Slurm: the SLURM_* variables its ranks see, the
slurm_args it refuses, and the time limit it asks for.

Helpers and the `kernel` fixture are test_slurm_runs.py's: after each test no
job of ours is in squeue and no rank process lives on any node.
"""
import pytest

from test_slurm_runs import kernel, our_jobs, still_serves, start, wait_clean  # noqa: F401


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
    assert our_jobs(slurm_cluster) == []
    still_serves(kernel)
