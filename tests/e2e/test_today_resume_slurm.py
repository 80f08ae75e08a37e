"""restarts= across Slurm nodes, with a checkpoint folder the nodes share
(issue 36): on the simulated 2-node cluster, the kernel installed for the
test venv (torch 2) trains FSDP2 on 4 ranks, 2 a node, saving a distributed
checkpoint every 5 steps into a folder of the shared filesystem. node2 is
crashed at step 12 of the first attempt; with restarts=1 the run is started
again on a new allocation (Slurm has none of 2 nodes without node2, so it is
asked again with node2, booted again meanwhile) and goes on from step 10
with the losses of an uninterrupted run of the same cell on this node.

Skipped where the venv is not built, and in the sanitizer pass (the restart's
C paths are test_restarts.py's and test_slurm_runs.py's).
"""
import threading
import time

import pytest

import support
from test_today_mlflow import VENV, today  # noqa: F401
from test_today_mlflow_slurm import kernel_of_a_cluster_user
from test_slurm_runs import wait_clean

pytestmark = [
    pytest.mark.skipif(support.KERNEL_NAME != "distkernel", reason="%%distributed is distkernel's"),
    pytest.mark.skipif(not VENV, reason="no test venv of today's stack (scripts/venv.sh; "
                                        "scripts/test.sh sets DISTKERNEL_TEST_VENV)"),
]

RUN = 300

# The training, as a function the cells call: the same on this node and on
# Slurm's. Each step's batch comes from the step's own seed, so a step's loss
# depends only on the model and optimizer the checkpoint restores.
SETUP = """
import os, socket, time
import torch, torch.nn as nn, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from distkernel.checkpoint import ExtraState, VolumeReader, VolumeWriter, latest_step

def train(root, crash_at=None):
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    start = 0
    if latest_step(root) is not None:
        msd, osd = get_state_dict(model, opt)
        extra = ExtraState()
        dcp.load({"model": msd, "optim": osd, "extra": extra}, storage_reader=VolumeReader(root))
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
        start = extra["step"]
    losses = []
    for step in range(start, 20):
        if step == crash_at and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
            dist.barrier()
            print("AT", step, socket.gethostname(), flush=True)
            time.sleep(600)          # the test crashes node2 now
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(16, 8, generator=g)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item())
        if (step + 1) % 5 == 0:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd, "extra": ExtraState(step=step + 1)},
                     storage_writer=VolumeWriter(root, step=step + 1))
    dist.destroy_process_group()
    return (start, losses)
"""


@pytest.fixture
def kernel(today, slurm_cluster, tmp_path):  # noqa: F811
    k = kernel_of_a_cluster_user(today, slurm_cluster, tmp_path,
                                 DISTKERNEL_SLURM_HEARTBEAT="3", MLFLOW_TRACKING_URI="")
    yield k
    k.stop()
    assert wait_clean(slurm_cluster) == [], "left behind after the test"


@pytest.mark.timeout(2 * RUN + 120)
def test_a_lost_node_is_survived_from_the_shared_checkpoint(kernel, slurm_cluster, tmp_path):
    shared = tmp_path / "shared"          # one filesystem for every simulated node
    r = kernel.execute(SETUP + "'ready'", timeout=60)
    assert r.status == "ok", r.describe()
    r = kernel.execute(f"%%distributed num_processes=4 tracking=False result=reference\n"
                       f"train({str(shared / 'reference')!r})", timeout=RUN)
    assert r.status == "ok", r.describe()
    reference = support.json_value(kernel, "reference")[0][1]
    assert len(reference) == 20

    msg_id = kernel.start_execute(
        "%%distributed num_processes=4 nodes=2 restarts=1 tracking=False result=resumed\n"
        f"train({str(shared / 'run')!r}, crash_at=12)")
    kernel.wait_iopub(lambda m: m["msg_type"] == "stream" and
                      m["parent_header"].get("msg_id") == msg_id and
                      "[rank 3] AT 12 node2" in m["content"]["text"], timeout=RUN)
    slurm_cluster.kill("node2")
    # node2 boots again while the kernel ends the attempt and asks Slurm for
    # the next: Slurm has no 2 nodes without it, so the next takes it again.
    booted = threading.Thread(target=slurm_cluster.start, args=("node2", RUN))
    time.sleep(1.0)
    booted.start()
    try:
        r = kernel.finish(msg_id, timeout=RUN)
    finally:
        booted.join(RUN)
        slurm_cluster.wait_state("node2", {"idle", "mixed", "allocated"})
    assert r.status == "ok", r.describe()
    err = r.stderr
    assert "[distkernel] attempt 1 of 2 failed" in err and "node2 lost (ranks 2–3)" in err, err
    assert "[distkernel] starting every rank again: attempt 2 of 2, leaving out the lost " \
           "nodes node2" in err, err
    assert "[distkernel] Slurm has no allocation for attempt 2 without node2" in err, err
    got = support.json_value(kernel, "resumed")
    assert len(got) == 4, r.describe()
    for rank, (start, losses) in enumerate(got):
        assert start == 10, (rank, start)
        assert losses == reference[10:], (rank, losses, reference)
