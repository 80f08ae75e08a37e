#!/usr/bin/python3
"""Started ranks against fresh ones and against ipyparallel, in the same run.

    /usr/bin/python3 bench/pool_bench.py [--prefix DIR] [-n 8] [--fresh 3] [--samples 50]
                                         [--no-ipyparallel] [--json out.json]

1. Fresh: `%%distributed num_processes=N tracking=False` with `pass`, each a new
   set of N ranks (start, import, run, end), --fresh times.
2. Started: `%distributed start num_processes=N` once (timed on its own), then
   `%%distributed tracking=False` with `pass` on the started ranks, --samples
   times after 5 warm-up cells.
3. ipyparallel: `%%px pass` on N engines (`ipcluster start -n N`) from an
   ipykernel, --samples times after 5 warm-up cells.
Samples 2 and 3 are interleaved in blocks of 10. Each sample is execute_request
to the cell's idle status on iopub (dist_bench's client). The kernel's rank
logs go to a fresh DISTKERNEL_LOG_DIR, removed at the end, so that what is
measured does not depend on what other runs left in the user's log root
(a kernel measures that root before its first run, which the start pays).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_bench as db  # noqa: E402  (its client, cluster and cleanup)


def summary(xs):
    xs = sorted(xs)
    return {"median_s": statistics.median(xs), "p90_s": xs[int(0.9 * (len(xs) - 1))],
            "min_s": xs[0], "n": len(xs)}


def timed(kern, code):
    elapsed, _, reply = kern.run(code)
    if reply["status"] != "ok":
        sys.exit(f"{kern.name}: cell failed: {code!r}: {reply.get('ename')}: "
                 f"{reply.get('evalue')}")
    return elapsed


def start_ipp(n, python, ipcluster=None):
    """(ipykernel of PYTHON with %px on N engines, its cluster, "ran") or (None, None, why)."""
    ipcluster = ipcluster or shutil.which("ipcluster")
    if not ipcluster or not os.access(ipcluster, os.X_OK):
        return None, None, f"no ipcluster ({ipcluster or 'not on PATH'}; " \
                           "apt-get install python3-ipyparallel)"
    cluster = db.Cluster(n, ipcluster)
    kdir = db.ipykernel_dir(python)
    try:
        kern = db.Kernel("ipybench", [kdir])
    finally:
        shutil.rmtree(kdir, ignore_errors=True)
    _, _, reply = kern.run(db.IPP_SETUP.format(profile_dir=cluster.profile_dir, n=n),
                           timeout=900)
    if reply["status"] != "ok":
        kern.close()
        cluster.stop()
        return None, None, f"%px setup failed: {reply.get('evalue')}"
    return kern, cluster, "ran"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default=os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", "prefix")))
    ap.add_argument("-n", "--ranks", type=int, default=8)
    ap.add_argument("--fresh", type=int, default=3)
    ap.add_argument("--samples", type=int, default=50)
    ap.add_argument("--python", default="/usr/bin/python3", help="ipykernel's interpreter")
    ap.add_argument("--no-ipyparallel", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    n = a.ranks
    log_root = tempfile.mkdtemp(prefix="pool-bench-logs-")
    env = dict(os.environ, DISTKERNEL_LOG_DIR=log_root)
    out = {"ranks": n, "load_before": db.loadavg()}
    dk = ipp = cluster = None
    try:
        dk = db.Kernel("distkernel", [os.path.join(a.prefix, "share", "jupyter", "kernels")],
                       env=env)
        if not a.no_ipyparallel:
            ipp, cluster, out["ipp_status"] = start_ipp(n, a.python)
            print(f"ipyparallel: {out['ipp_status']}", flush=True)
        fresh = [timed(dk, f"%%distributed num_processes={n} tracking=False\npass")
                 for _ in range(a.fresh)]
        out["start_s"] = timed(dk, f"%distributed start num_processes={n}")
        started, px = [], []
        for _ in range(5):
            timed(dk, "%%distributed tracking=False\npass")
            if ipp:
                timed(ipp, "%%px\npass")
        while len(started) < a.samples:
            for _ in range(10):
                started.append(timed(dk, "%%distributed tracking=False\npass"))
            for _ in range(10 if ipp else 0):
                px.append(timed(ipp, "%%px\npass"))
        timed(dk, "%distributed stop")
    finally:
        if dk:
            dk.close()
        if ipp:
            ipp.close()
        if cluster:
            cluster.stop()
        shutil.rmtree(log_root, ignore_errors=True)
    out["fresh"] = summary(fresh)
    out["started"] = summary(started)
    out["started_over_fresh"] = out["started"]["median_s"] / out["fresh"]["median_s"]
    print(f"{n} ranks, a `pass` cell (load before: {out['load_before']}):")
    print(f"  fresh cell      median {out['fresh']['median_s'] * 1e3:9.1f} ms (n={a.fresh})")
    print(f"  start           {out['start_s'] * 1e3:9.1f} ms (once)")
    print(f"  started cell    median {out['started']['median_s'] * 1e3:9.1f} ms "
          f"(p90 {out['started']['p90_s'] * 1e3:.1f}, n={len(started)})")
    if px:
        out["px"] = summary(px)
        out["started_over_px"] = out["started"]["median_s"] / out["px"]["median_s"]
        print(f"  %%px pass       median {out['px']['median_s'] * 1e3:9.1f} ms "
              f"(p90 {out['px']['p90_s'] * 1e3:.1f}, n={len(px)})")
        print(f"  started / %%px  {out['started_over_px']:.2f}x")
    print(f"  started / fresh {out['started_over_fresh']:.4f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
