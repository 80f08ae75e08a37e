#!/usr/bin/python3
"""A 2-node x 2-rank gloo cell on the simulated Slurm cluster (tests/slurm/),
against the same ranks started by one `srun -N2 -n4` from a shell, alternated
in one run.

    /usr/bin/python3 bench/slurm_bench.py [--prefix DIR] [--trials 3] [--json out.json]

The cluster is brought up as the e2e fixture does (DISTKERNEL_SLURM_SIM_* pick
which one; a healthy one is reused and left up). Both sides run dist_bench's
fan-out (import torch, gloo init_process_group, print the rank). Timed: the
cell from execute_request to idle (salloc, one srun step per rank, the TCP
back channel, scancel), and srun's whole run (its own allocation). Reported:
medians and cell/srun (the issue's target: <= 1.15x).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "e2e"))
import dist_bench as db  # noqa: E402
from slurm_cluster import bring_up  # noqa: E402

# srun gives SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS; torch wants its own names.
SRUN_CODE = ('import os\n'
             'os.environ.update(RANK=os.environ["SLURM_PROCID"], '
             'WORLD_SIZE=os.environ["SLURM_NTASKS"], LOCAL_RANK=os.environ["SLURM_LOCALID"], '
             'MASTER_ADDR="node1", MASTER_PORT="29555")\n' + db.FANOUT_CODE)


def srun_once(env):
    t0 = time.monotonic()
    run = subprocess.run(["srun", "-N2", "-n4", "--label", "/usr/bin/python3", "-c", SRUN_CODE],
                         capture_output=True, text=True, env=env, timeout=600)
    took = time.monotonic() - t0
    ranks = sorted(line.split(": ", 1)[1] for line in run.stdout.splitlines() if ": " in line)
    ok = run.returncode == 0 and ranks == ["0", "1", "2", "3"]
    return took, ok, "" if ok else run.stderr[-800:]


def cell_once(kern):
    took, raw, reply = kern.run("%%distributed num_processes=4 nodes=2\n" + db.FANOUT_CODE)
    return took, reply["status"] == "ok", "" if reply["status"] == "ok" else str(reply)[:800]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default=os.path.join(HERE, "..", "prefix"))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    cluster = bring_up(2)
    env = dict(cluster.env, MLFLOW_TRACKING_URI="")
    kern = db.Kernel("distkernel", [os.path.join(args.prefix, "share", "jupyter", "kernels")],
                     env=env)
    cells, sruns = [], []
    try:
        cell_once(kern)     # not timed: the kernel's first cell imports its glue
        for _ in range(args.trials):
            for name, fn, out in (("cell", lambda: cell_once(kern), cells),
                                  ("srun", lambda: srun_once(env), sruns)):
                took, ok, detail = fn()
                if not ok:
                    sys.exit(f"{name} failed: {detail}")
                out.append(took)
    finally:
        kern.close()
    res = {"cell_s": cells, "srun_s": sruns, "cell_median_s": db.median(cells),
           "srun_median_s": db.median(sruns), "load": db.loadavg()}
    res["ratio"] = res["cell_median_s"] / res["srun_median_s"]
    print(f"2x2 gloo cell {res['cell_median_s']:.2f} s, srun -N2 -n4 {res['srun_median_s']:.2f} s "
          f"(medians of {args.trials}), cell/srun {res['ratio']:.2f}x; load {res['load']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
