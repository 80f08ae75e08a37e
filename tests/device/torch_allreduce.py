"""The all-reduce distkernel-check times, timed by torch.distributed with NCCL.

One process, world size 1, on cuda:0 (the device machine has one GPU), timed as
distkernel-check and nccl-tests time it: per size WARMUP untimed all-reduces,
then the wall clock around ITERS all-reduces ended by a synchronize; the time of
one is the mean. torch.distributed.all_reduce works in place, as
distkernel-check does by default, on float32 with op SUM. Bandwidths follow
nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n (0 for one rank).

    python3 tests/device/torch_allreduce.py [--max-bytes N] [--iters 20] [--warmup 5] [--json OUT]

Prints a table; --json writes {"torch_version", "nccl_version", "world", "device",
"sizes": [{"bytes", "time_us", "algbw_gbs", "busbw_gbs"}], "wall_seconds"}.
"""
import argparse
import json
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()

    t_start = time.perf_counter()
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    n = dist.get_world_size()

    free, _total = torch.cuda.mem_get_info(device)
    max_bytes = min(args.max_bytes, free // 3)  # as distkernel-check caps it
    buf = torch.zeros(max_bytes // 4, dtype=torch.float32, device=device)

    # The result, once, as distkernel-check checks it: rank r holds r + 1.
    probe = torch.full((1024,), 1.0, device=device)
    dist.all_reduce(probe)
    torch.cuda.synchronize()
    assert torch.all(probe == n * (n + 1) / 2), probe[:4]

    sizes = []
    size = 8
    while size <= max_bytes:
        view = buf[: size // 4]
        for _ in range(args.warmup):
            dist.all_reduce(view)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(view)
        torch.cuda.synchronize()
        secs = (time.perf_counter() - t0) / args.iters
        algbw = size / 1e9 / secs
        sizes.append({"bytes": size, "count": size // 4, "time_us": secs * 1e6,
                      "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n})
        size *= 2

    nccl = torch.cuda.nccl.version()
    report = {
        "torch_version": torch.__version__,
        "nccl_version": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
        "world": n,
        "device": torch.cuda.get_device_name(device),
        "in_place": True,
        "warmup": args.warmup,
        "iters": args.iters,
        "sizes": sizes,
        "wall_seconds": time.perf_counter() - t_start,
    }
    dist.destroy_process_group()

    print(f"torch {report['torch_version']} NCCL {report['nccl_version']} on {report['device']}, "
          f"world {n}, in place, {args.warmup} warm-up + {args.iters} timed per size")
    print(f"{'bytes':>12} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}")
    for s in sizes:
        print(f"{s['bytes']:>12} {s['time_us']:>12.2f} {s['algbw_gbs']:>13.2f} {s['busbw_gbs']:>13.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
