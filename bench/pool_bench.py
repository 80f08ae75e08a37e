#!/usr/bin/python3
"""Started ranks against fresh ones: the same cell, in the same kernel, same run.

    /usr/bin/python3 bench/pool_bench.py [--prefix DIR] [-n 8] [--fresh 5] [--pooled 50]
                                         [--json out.json]

1. Fresh: `%%distributed num_processes=N` with `import torch; pass`, each a new
   set of N ranks (start, import, run, end), FRESH times.
2. Started: `%distributed start num_processes=N` once (timed on its own), then
   `%%distributed` with the same body on the started ranks, POOLED times (after
   5 warm-up cells, whose first pays the ranks' `import torch`).
Each sample is execute_request to its reply and idle status, through
jupyter_client. Medians, p90 and their ratio are printed (and written as JSON).
"""

import argparse
import json
import os
import statistics
import sys
import time

from jupyter_client import KernelManager


def timed(kc, code, timeout=600):
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            break
    reply = kc.get_shell_msg(timeout=timeout)
    took = time.perf_counter() - t0
    if reply["content"]["status"] != "ok":
        sys.exit(f"cell failed: {code!r}: {reply['content'].get('evalue')}")
    return took


def summary(xs):
    xs = sorted(xs)
    return {"median_s": statistics.median(xs), "p90_s": xs[int(0.9 * (len(xs) - 1))],
            "min_s": xs[0], "n": len(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default=os.path.join(os.path.dirname(__file__), "..", "prefix"))
    ap.add_argument("-n", "--ranks", type=int, default=8)
    ap.add_argument("--fresh", type=int, default=5)
    ap.add_argument("--pooled", type=int, default=50)
    ap.add_argument("--json")
    a = ap.parse_args()
    os.environ["JUPYTER_PATH"] = os.path.join(os.path.abspath(a.prefix), "share", "jupyter")
    km = KernelManager(kernel_name="distkernel")
    km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        body = "import torch\npass"
        n = a.ranks
        fresh = [timed(kc, f"%%distributed num_processes={n} tracking=False\n{body}")
                 for _ in range(a.fresh)]
        start = timed(kc, f"%distributed start num_processes={n}")
        for _ in range(5):
            timed(kc, f"%%distributed tracking=False\n{body}")
        pooled = [timed(kc, f"%%distributed tracking=False\n{body}") for _ in range(a.pooled)]
        timed(kc, "%distributed stop")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    out = {"ranks": n, "fresh": summary(fresh), "start_s": start, "pooled": summary(pooled)}
    out["pooled_over_fresh"] = out["pooled"]["median_s"] / out["fresh"]["median_s"]
    print(f"{n} ranks, `import torch; pass`:")
    print(f"  fresh cell     median {out['fresh']['median_s'] * 1e3:8.1f} ms "
          f"(p90 {out['fresh']['p90_s'] * 1e3:.1f}, n={a.fresh})")
    print(f"  start          {start * 1e3:8.1f} ms (once)")
    print(f"  started cell   median {out['pooled']['median_s'] * 1e3:8.1f} ms "
          f"(p90 {out['pooled']['p90_s'] * 1e3:.1f}, n={a.pooled})")
    print(f"  ratio          {out['pooled_over_fresh']:.4f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
