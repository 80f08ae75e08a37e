"""What MLflow bookkeeping adds to a distributed cell.

One distkernel, one local tracking server (tests/mlflow_server.py, which
answers as MLflow's REST API does), and the same two-rank cell run with
tracking on and with tracking=False, interleaved. The figure is the difference
of the medians (target: at most 50 ms), and the ratio of the medians.

    /usr/bin/python3 bench/mlflow_bench.py [--prefix PREFIX] [--trials N] [--json PATH]
"""

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from jupyter_client.manager import KernelManager  # noqa: E402
from mlflow_server import MlflowTestServer  # noqa: E402

CELL = "%%distributed num_processes=2{opts}\nimport os\nint(os.environ['RANK'])"


def run(kc, code, timeout=120):
    t0 = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            break
    reply = kc.get_shell_msg(timeout=timeout)
    assert reply["content"]["status"] == "ok", reply["content"]
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", default=os.path.join(HERE, "..", "prefix"))
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--json")
    args = ap.parse_args()
    os.environ["JUPYTER_PATH"] = os.path.join(os.path.abspath(args.prefix), "share", "jupyter")
    with MlflowTestServer() as srv:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["MLFLOW_TRACKING_URI"] = srv.url
        km = KernelManager(kernel_name="distkernel")
        km.start_kernel(env=env)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=60)
            run(kc, CELL.format(opts=""))            # warm-up: experiment created
            run(kc, CELL.format(opts=" tracking=False"))
            on, off = [], []
            for _ in range(args.trials):
                on.append(run(kc, CELL.format(opts="")))
                off.append(run(kc, CELL.format(opts=" tracking=False")))
            runs = len(srv.runs())
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=False)
    med_on, med_off = statistics.median(on), statistics.median(off)
    result = {"trials": args.trials, "tracking_on_s": on, "tracking_off_s": off,
              "median_on_s": med_on, "median_off_s": med_off,
              "added_ms": (med_on - med_off) * 1000, "ratio": med_on / med_off,
              "runs_recorded": runs, "load_average": os.getloadavg()}
    print(f"distributed cell, 2 CPU ranks, {args.trials} interleaved trials each")
    print(f"  tracking on : median {med_on * 1000:8.1f} ms")
    print(f"  tracking off: median {med_off * 1000:8.1f} ms")
    print(f"  added by MLflow bookkeeping: {result['added_ms']:.1f} ms "
          f"(ratio {result['ratio']:.3f}); target <= 50 ms")
    print(f"  runs recorded by the server: {runs}; load average {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
