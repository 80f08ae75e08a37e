#!/usr/bin/env python3
"""A distributed checkpoint through distkernel.checkpoint against torch.save
(issue 36, part 2), in one run, with the venv's Python (it needs torch):

    VENV/bin/python bench/checkpoint_bench.py [--ranks 2] [--mb 200] [--trials 7]
        [--dir DIR] [--json out.json]

An MLP under FSDP2 (`fully_shard` on each layer, then the whole) with AdamW,
after one training step, so that the state (parameters and AdamW's two moments)
is about --mb MB, on --ranks CPU ranks (gloo; torch.multiprocessing, one torch
thread a rank, as torchrun and distkernel set). Each trial times, between
barriers, on rank 0:

1. dcp: `dcp.save(get_state_dict(model, optim), storage_writer=VolumeWriter(root,
   step=trial, keep=None))`: every rank writes its shard into the partial folder,
   fsyncs it, and rank 0 writes the metadata and commits the folder;
2. fs: the same through torch's own FileSystemWriter into a new folder (no
   partial folder, commit, lock or pruning): what VolumeWriter adds to DCP;
3. torch.save: the full state gathered onto rank 0 (`get_state_dict` with
   `full_state_dict=True, cpu_offload=True`), `torch.save` of it to one file on
   rank 0 and an fsync of that file (the durability DCP gives), the gather
   timed on its own too.

The three take turns at going first from trial to trial, after one untimed
warm-up of each; what a trial wrote is removed before the next, untimed.
Reported: each trial, then min and median of each, dcp / torch.save and
dcp / fs. The
files go to a new folder in --dir (default $TMPDIR or /tmp), removed at the
end: put it on the filesystem you care about. See bench/README.md.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# the checkout's package, so that the bench measures the code beside it
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build(mb):
    """An MLP of square layers whose parameters and AdamW moments make about MB MB."""
    import torch
    from torch.distributed.fsdp import fully_shard
    width = 2048
    per_layer = (width * width + width) * 4 * 3            # bytes: weights, bias, 2 moments
    layers = max(1, round(mb * 1e6 / per_layer))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).square().mean().backward()
    optim.step()
    optim.zero_grad()
    return model, optim, layers * per_layer


def timed(fn):
    import torch.distributed as dist
    dist.barrier()
    t = time.perf_counter()
    extra = fn()
    dist.barrier()
    return time.perf_counter() - t, extra


def dcp_save(model, optim, root, step):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from distkernel.checkpoint import VolumeWriter
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd},
             storage_writer=VolumeWriter(root, step=step, keep=None))


def fs_save(model, optim, folder):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, storage_writer=dcp.FileSystemWriter(folder))


def torch_save(model, optim, path):
    """Gather, then rank 0 writes one file; returns the gather's seconds."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    t = time.perf_counter()
    msd, osd = get_state_dict(model, optim,
                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    gather = time.perf_counter() - t
    if dist.get_rank() == 0:
        with open(path, "wb") as f:
            torch.save({"model": msd, "optim": osd}, f)
            f.flush()
            os.fsync(f.fileno())
    return gather


def tidy(folder):
    import torch.distributed as dist
    dist.barrier()
    if dist.get_rank() == 0:
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
        os.sync()
    dist.barrier()


def rank_main(rank, a, port, queue):
    import torch
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(a.ranks), TORCHELASTIC_RUN_ID=f"checkpoint-bench-{port}")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    model, optim, nbytes = build(a.mb)
    root = os.path.join(a.dir, "dcp")
    path = os.path.join(a.dir, "torch.pt")
    rows = []
    whos = ["dcp", "fs", "torch"]
    for trial in range(-1, a.trials):
        k = (trial + 1) % len(whos)
        order = whos[k:] + whos[:k]
        row = {"trial": trial, "first": order[0]}
        for who in order:
            if who == "dcp":
                row["dcp_s"], _ = timed(lambda: dcp_save(model, optim, root, trial + 1))
            elif who == "fs":
                row["fs_s"], _ = timed(lambda: fs_save(model, optim, os.path.join(a.dir, "fs")))
            else:
                row["torch_s"], row["gather_s"] = timed(lambda: torch_save(model, optim, path))
            tidy(a.dir)
        if rank == 0:
            tag = "warm-up" if trial < 0 else f"trial {trial + 1}"
            print(f"  {tag:8} dcp {row['dcp_s']:.3f} s, fs {row['fs_s']:.3f} s, torch.save "
                  f"{row['torch_s']:.3f} s (gather {row['gather_s']:.3f} s), first: "
                  f"{row['first']}", flush=True)
            if trial >= 0:
                rows.append(row)
    if rank == 0:
        queue.put({"state_bytes": nbytes, "rows": rows})
    dist.destroy_process_group()


def summary(res):
    rows = res["rows"]
    out = {}
    for key in ("dcp_s", "fs_s", "torch_s", "gather_s"):
        vals = [r[key] for r in rows]
        out[key] = {"min": min(vals), "median": statistics.median(vals)}
    out["ratio_median"] = out["dcp_s"]["median"] / out["torch_s"]["median"]
    out["ratio_min"] = out["dcp_s"]["min"] / out["torch_s"]["min"]
    out["pair_ratios"] = [r["dcp_s"] / r["torch_s"] for r in rows]
    out["ratio_fs_median"] = out["dcp_s"]["median"] / out["fs_s"]["median"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mb", type=float, default=200.0, help="state size, MB (1e6 bytes)")
    ap.add_argument("--trials", type=int, default=7)
    ap.add_argument("--dir", help="the folder in which a temporary one takes the checkpoints")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args()
    import torch
    import torch.multiprocessing as mp
    a.dir = tempfile.mkdtemp(prefix="checkpoint-bench-", dir=a.dir)
    try:
        print(f"== checkpoint: FSDP2 state of about {a.mb:g} MB on {a.ranks} CPU ranks, "
              f"torch {torch.__version__}, into {a.dir}; {a.trials} interleaved trials",
              flush=True)
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(rank_main, args=(a, free_port(), queue), nprocs=a.ranks)
        res = queue.get()
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    s = summary(res)
    mb = res["state_bytes"] / 1e6
    print(f"  state: {mb:.1f} MB (parameters and AdamW's two moments)")
    for key, what in (("dcp_s", "dcp (VolumeWriter)"), ("fs_s", "dcp (FileSystemWriter)"),
                      ("torch_s", "torch.save (gathered)"),
                      ("gather_s", "  of which gather")):
        print(f"  {what:22} min {s[key]['min']:.3f} s, median {s[key]['median']:.3f} s")
    print(f"  dcp / torch.save: median {s['ratio_median']:.2f}x, min {s['ratio_min']:.2f}x; "
          f"per pair {', '.join(f'{r:.2f}' for r in s['pair_ratios'])}")
    print(f"  VolumeWriter / FileSystemWriter: median {s['ratio_fs_median']:.2f}x")
    print(f"  dcp throughput (median): {mb / s['dcp_s']['median']:.0f} MB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ranks": a.ranks, "torch": torch.__version__, "summary": s, **res}, f,
                      indent=1)


if __name__ == "__main__":
    main()
