"""One FSDP training loop, run unchanged under `torchrun` and as a
`%%distributed` cell (bench/today_bench.py puts this text in the cell).

torch 2's `fully_shard` (FSDP2) on CPU with gloo: an MLP of FSDP_LAYERS
blocks, each block its own FSDP unit, AdamW, random data. Every rank times
FSDP_STEPS steps after FSDP_WARMUP untimed ones, between barriers, and rank 0
prints one line (its own CPU seconds over the timed steps too):

    FSDP_RESULT {"steps_per_s": ..., "steps": ..., "world": ..., "loss": ...}

Sizes come from the environment (FSDP_WIDTH, FSDP_LAYERS, FSDP_BATCH,
FSDP_STEPS, FSDP_WARMUP) so that both launches run the same thing.
"""
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

WIDTH = int(os.environ.get("FSDP_WIDTH", "512"))
LAYERS = int(os.environ.get("FSDP_LAYERS", "4"))
BATCH = int(os.environ.get("FSDP_BATCH", "64"))
STEPS = int(os.environ.get("FSDP_STEPS", "50"))
WARMUP = int(os.environ.get("FSDP_WARMUP", "5"))

if not dist.is_initialized():
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU())
                        for _ in range(LAYERS)], nn.Linear(WIDTH, 1))
for block in model:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
gen = torch.Generator().manual_seed(1 + rank)


def step():
    x = torch.randn(BATCH, WIDTH, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss


for _ in range(WARMUP):
    step()
dist.barrier()
t0, cpu0 = time.perf_counter(), time.process_time()
for _ in range(STEPS):
    loss = step()
dist.barrier()
elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
if rank == 0:
    print("FSDP_RESULT " + json.dumps({"steps_per_s": STEPS / elapsed, "steps": STEPS,
                                       "seconds": elapsed, "cpu_s": cpu, "world": world,
                                       "threads": torch.get_num_threads(),
                                       "loss": float(loss.detach())}), flush=True)
dist.destroy_process_group()
