#!/usr/bin/python3
"""What seeing where the ranks are costs: live samples, and the error's stacks.

    /usr/bin/python3 bench/stall_bench.py [--prefix DIR] [--pairs 5] [--loop-s 15]
                                          [--every 0.1] [--ends 3] [--worlds 8,64]
                                          [--skip-overhead] [--json out.json]

1. Sampling overhead (distributed/dk_dist_stall.h). Two gloo ranks run a loop
   of small all_reduces that prints nothing, timed inside rank 0 (wall clock
   and the rank's CPU time) from a barrier to the loop's end, with
   stall_after=0 (nothing is ever asked: the reference) and with
   stall_after=2 (sampling begins once the ranks are in the loop), --pairs
   times each, interleaved (A B, B A, ...), so that load on the machine hits
   both alike. The product samples every 5 s, one sample's cost lost in this
   machine's noise; the kernel here samples every --every seconds
   (DISTKERNEL_STALL_EVERY), so that a run holds many samples, and rank 0
   counts how many it answered (the end lines in its stacks file). Reported:
   min and median of each, their ratios, what one sample costs the loop, and
   so the overhead at one sample per 5 s. The loop's length is calibrated
   first to about --loop-s seconds.
2. Time from the timeout to the error, at each world size of --worlds: a cell
   of N cold CPU ranks sleeping, with timeout=T (10 s, 20 s from 32 ranks
   up, so that every rank is in its sleep by then), --ends times. The ranks
   share this client's wall clock: the timeout counts from just before the
   kernel forks the first rank, whose process start time each rank prints
   (/proc/self/stat, 10 ms ticks); the figure runs from the earliest of them
   + T to the cell's idle status after its error. The reference, in the same run, is a `pass`
   cell of the same ranks (their start and their end, which the error's
   path pays too).
The kernel's rank logs go to a fresh DISTKERNEL_LOG_DIR, removed at the end.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_bench as db  # noqa: E402  (its client and cleanup)

LOOP = """%%distributed num_processes=2 tracking=False stall_after={after} timeout=None
import os, time, torch, torch.distributed as dist
def dumps():
    # How many times this rank was asked: the end lines in its stacks file.
    for fd in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{{fd}}")
        except OSError:
            continue
        if "stacks" in path and "/rank-" in path:
            with open(path, "rb") as f:
                return f.read().count(b"distkernel stacks: end")
    return -1
if not dist.is_initialized():
    dist.init_process_group("gloo")
x = torch.ones(256)
dist.barrier()
n0 = dumps()
t0, c0 = time.perf_counter(), time.process_time()
for _ in range({iters}):
    dist.all_reduce(x)
el, cpu = time.perf_counter() - t0, time.process_time() - c0
if dist.get_rank() == 0:
    print(f"LOOP {{el:.6f}} {{cpu:.6f}} {{dumps() - n0}}", flush=True)
"""

# Cold ranks: the kernel forks each itself, right after the timeout's clock
# starts, so a rank's process start (/proc/self/stat, 10 ms ticks) is when
# that clock started, to a few ms; a warm rank is forked later by the template.
SLEEP = """%%distributed num_processes={n} tracking=False timeout={t} warm=False
import os, time
with open("/proc/self/stat") as f:
    ticks = int(f.read().rsplit(")", 1)[1].split()[19])
up = time.clock_gettime(time.CLOCK_BOOTTIME)
print(f"START {{time.time() - (up - ticks / os.sysconf('SC_CLK_TCK')):.6f}}", flush=True)
time.sleep(600)
"""

PASS = "%%distributed num_processes={n} tracking=False warm=False\npass"


def stats(xs):
    xs = sorted(xs)
    return {"min_s": xs[0], "median_s": statistics.median(xs), "max_s": xs[-1], "n": len(xs)}


def loop_time(kern, after, iters):
    _, msgs, reply = kern.run(LOOP.format(after=after, iters=iters))
    if reply["status"] != "ok":
        tb = "\n".join(reply.get("traceback", []))
        sys.exit(f"loop failed (stall_after={after}): {reply.get('ename')}: "
                 f"{reply.get('evalue')}\n{tb[-3000:]}")
    out = "".join(c.get("text", "") for _, t, c in db.decode(msgs) if t == "stream")
    m = re.search(r"LOOP ([0-9.]+) ([0-9.]+) (-?[0-9]+)", out)
    if not m:
        sys.exit(f"no loop time in the output: {out[-500:]}")
    return float(m.group(1)), float(m.group(2)), int(m.group(3))


def overhead(kern, pairs, loop_s, every):
    # Calibrate: iterations for about LOOP_S seconds of loop.
    probe = 2000
    t, _, _ = loop_time(kern, 0, probe)
    iters = max(probe, int(probe * loop_s / max(t, 1e-3)))
    off, on, off_cpu, on_cpu, asked = [], [], [], [], []
    for i in range(pairs):
        for after in ((0, 2) if i % 2 == 0 else (2, 0)):
            wall, cpu, n = loop_time(kern, after, iters)
            (off if after == 0 else on).append(wall)
            (off_cpu if after == 0 else on_cpu).append(cpu)
            if after:
                asked.append(n)
            elif n:
                sys.exit(f"stall_after=0 asked rank 0 {n} times")
        print(f"  pair {i + 1}: off {off[-1]:.3f} s (cpu {off_cpu[-1]:.3f}), "
              f"on {on[-1]:.3f} s (cpu {on_cpu[-1]:.3f}, {asked[-1]} samples)", flush=True)
    out = {"iters": iters, "every_s": every, "off": stats(off), "on": stats(on),
           "off_cpu": stats(off_cpu), "on_cpu": stats(on_cpu), "samples": asked,
           "off_all_s": off, "on_all_s": on}
    out["ratio_min"] = out["on"]["min_s"] / out["off"]["min_s"]
    out["ratio_median"] = out["on"]["median_s"] / out["off"]["median_s"]
    out["cpu_ratio_median"] = out["on_cpu"]["median_s"] / out["off_cpu"]["median_s"]
    # What one sample costs the loop, from the medians, and so the overhead at
    # the product's pace (one sample per DK_DIST_STALL_EVERY_S, 5 s).
    n = statistics.median(asked)
    per = (out["on"]["median_s"] - out["off"]["median_s"]) / max(n, 1)
    per_min = (out["on"]["min_s"] - out["off"]["min_s"]) / max(n, 1)
    out["per_sample_s"] = per
    out["per_sample_min_s"] = per_min
    out["overhead_at_5s"] = per / 5.0
    out["overhead_at_5s_min"] = per_min / 5.0
    return out


def to_error(kern, n, t):
    """Seconds from the timeout to the cell's end (its error shown, status
    idle), on the wall clock the ranks share with this client."""
    elapsed, msgs, reply = kern.run(SLEEP.format(n=n, t=t), timeout=600)
    done = time.time()
    if reply.get("ename") != "TimeoutError":
        sys.exit(f"{n} ranks: expected a TimeoutError, got {reply.get('ename')}: "
                 f"{reply.get('evalue')}")
    out = "".join(c.get("text", "") for _, mtype, c in db.decode(msgs) if mtype == "stream")
    starts = [float(x) for x in re.findall(r"START ([0-9.]+)", out)]
    if len(starts) != n:
        sys.exit(f"{n} ranks: {len(starts)} started before the timeout; give a larger one")
    return done - (min(starts) + t)


def ends(kern, worlds, count):
    out = {}
    for n in worlds:
        t = 20 if n >= 32 else 10
        delays, refs = [], []
        for _ in range(count):
            delays.append(to_error(kern, n, t))
            elapsed, _, reply = kern.run(PASS.format(n=n), timeout=600)
            if reply["status"] != "ok":
                sys.exit(f"{n} ranks: pass failed: {reply.get('evalue')}")
            refs.append(elapsed)
            print(f"  {n} ranks: timeout to error {delays[-1]:.2f} s; pass cell {refs[-1]:.2f} s",
                  flush=True)
        out[str(n)] = {"timeout_s": t, "to_error": stats(delays), "pass_cell": stats(refs),
                       "ratio_median": statistics.median(delays) / statistics.median(refs)}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default=os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", "prefix")))
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--loop-s", type=float, default=15.0)
    ap.add_argument("--every", type=float, default=0.1,
                    help="seconds between samples (DISTKERNEL_STALL_EVERY; the product's is 5)")
    ap.add_argument("--ends", type=int, default=3)
    ap.add_argument("--worlds", default="8,64")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    log_root = tempfile.mkdtemp(prefix="stall-bench-logs-")
    env = dict(os.environ, DISTKERNEL_LOG_DIR=log_root, DISTKERNEL_STALL_EVERY=str(a.every))
    res = {"load_before": db.loadavg()}
    kern = None
    try:
        kern = db.Kernel("distkernel", [os.path.join(a.prefix, "share", "jupyter", "kernels")],
                         env=env)
        if not a.skip_overhead:
            print("sampling overhead, 2 gloo ranks, a silent all_reduce loop:", flush=True)
            res["overhead"] = overhead(kern, a.pairs, a.loop_s, a.every)
        print("timeout to error:", flush=True)
        res["ends"] = ends(kern, [int(w) for w in a.worlds.split(",")], a.ends)
    finally:
        if kern:
            kern.close()
        shutil.rmtree(log_root, ignore_errors=True)
    res["load_after"] = db.loadavg()
    print(f"load before {res['load_before']}, after {res['load_after']}")
    if "overhead" in res:
        o = res["overhead"]
        print(f"overhead ({o['iters']} all_reduces; a sample every {o['every_s']} s, "
              f"{statistics.median(o['samples'])} a run):")
        for k in ("off", "on"):
            s, c = o[k], o[k + "_cpu"]
            print(f"  stall_after={'0' if k == 'off' else '2'}: min {s['min_s']:.3f} s, "
                  f"median {s['median_s']:.3f} s, max {s['max_s']:.3f} s (n={s['n']}); "
                  f"rank 0 CPU median {c['median_s']:.3f} s")
        print(f"  on / off: wall min {o['ratio_min']:.4f}x, median {o['ratio_median']:.4f}x; "
              f"rank CPU median {o['cpu_ratio_median']:.4f}x")
        print(f"  one sample costs the loop {o['per_sample_s'] * 1e3:.2f} ms (medians), "
              f"{o['per_sample_min_s'] * 1e3:.2f} ms (mins): at one per 5 s, "
              f"{o['overhead_at_5s'] * 100:.3f} % ({o['overhead_at_5s_min'] * 100:.3f} %)")
    for n, e in res.get("ends", {}).items():
        d, p = e["to_error"], e["pass_cell"]
        print(f"{n} ranks, timeout={e['timeout_s']}: timeout to error min {d['min_s']:.2f} s, "
              f"median {d['median_s']:.2f} s; pass cell median {p['median_s']:.2f} s; "
              f"ratio {e['ratio_median']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
