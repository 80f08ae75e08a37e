"""Soak: many executes and distributed cells in one kernel; what grows.

Runs N plain executes and M `%%distributed num_processes=2` cells in one
distkernel and reports the kernel's memory (RSS) and open descriptors before,
during and after, the processes left behind (zombies, orphans with the run's
TORCHELASTIC_RUN_ID), and the rank log folders kept.

    /usr/bin/python3 bench/soak.py [--prefix PREFIX] [--executes N] [--cells M] [--json PATH]
"""

import argparse
import glob
import json
import os
import sys
import time

import psutil
from jupyter_client.manager import KernelManager

HERE = os.path.dirname(os.path.abspath(__file__))


def run(kc, code, timeout=120):
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            break
    reply = kc.get_shell_msg(timeout=timeout)
    assert reply["content"]["status"] == "ok", reply["content"]


def sample(proc):
    return {"rss_mib": proc.memory_info().rss / 2**20, "fds": proc.num_fds(),
            "threads": proc.num_threads(),
            "children": len(proc.children(recursive=True))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default=os.path.join(HERE, "..", "prefix"))
    ap.add_argument("--executes", type=int, default=10000)
    ap.add_argument("--cells", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["JUPYTER_PATH"] = os.path.join(os.path.abspath(args.prefix), "share", "jupyter")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    km = KernelManager(kernel_name="distkernel")
    km.start_kernel(env=env)
    kc = km.client()
    kc.start_channels()
    samples = []
    t0 = time.time()
    try:
        kc.wait_for_ready(timeout=60)
        proc = psutil.Process(km.provisioner.process.pid)
        run(kc, "x = 0")
        run(kc, "%%distributed num_processes=2 tracking=False\n1")
        samples.append(("warm", sample(proc)))
        for i in range(args.executes):
            run(kc, f"x += 1; print(x) if x % 1000 == 0 else None")
            if (i + 1) % max(1, args.executes // 5) == 0:
                samples.append((f"execute {i + 1}", sample(proc)))
        run_ids = []
        for i in range(args.cells):
            run(kc, "%%distributed num_processes=2 tracking=False\n"
                    "import os\nprint(os.environ['RANK'])\nint(os.environ['RANK'])")
            if (i + 1) % max(1, args.cells // 5) == 0:
                samples.append((f"distributed {i + 1}", sample(proc)))
        time.sleep(1)
        end = sample(proc)
        zombies = [c.pid for c in proc.children(recursive=True)
                   if c.status() == psutil.STATUS_ZOMBIE]
        logs = glob.glob(os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                      f"distkernel-logs-{os.getuid()}", f"kernel-{proc.pid}", "*"))
    finally:
        kc.stop_channels()
        km.shutdown_kernel()
    warm = samples[0][1]
    result = {"executes": args.executes, "cells": args.cells, "seconds": time.time() - t0,
              "samples": samples, "end": end, "rss_growth_mib": end["rss_mib"] - warm["rss_mib"],
              "fd_growth": end["fds"] - warm["fds"], "zombies": zombies,
              "kept_run_logs": len(logs)}
    for label, s in samples + [("end", end)]:
        print(f"{label:>18}: rss {s['rss_mib']:7.1f} MiB  fds {s['fds']:3d}  "
              f"threads {s['threads']:2d}  children {s['children']}")
    print(f"growth after warm-up: rss {result['rss_growth_mib']:+.1f} MiB, "
          f"fds {result['fd_growth']:+d}; zombies {len(zombies)}; "
          f"run log folders kept {len(logs)}; {result['seconds']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(1 if zombies or result["fd_growth"] > 0 else 0)


if __name__ == "__main__":
    main()
