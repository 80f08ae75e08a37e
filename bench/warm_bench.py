#!/usr/bin/python3
"""Warm start: a fresh 8-rank cell forked from the warm-start template, against
a bare shell launch of the same 8 ranks, in the same run.

    /usr/bin/python3 bench/warm_bench.py [--prefix DIR] [-n 8] [--trials 5] [--json out.json]

The cell and the bare launch are dist_bench's fan-out (import torch, gloo
init_process_group, print the rank; the bare script sets the same rank
environment and runs `python3 -c CODE` per rank). Three are timed, interleaved,
execute_request to idle: the warm cell (`%%distributed num_processes=N`), the
same cell cold (`warm=False`: today's launch), and the bare launch. The first
distkernel cell, which builds the template, is timed on its own. Reported:
medians, warm/bare (target <= 0.2x) and cold/bare, the template's resident
memory (VmRSS, and PSS where readable: what it adds, its pages being shared
with the ranks it forks), and the kernel's idle RSS before any distributed
cell, with whether a template existed then (it must not).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dist_bench as db  # noqa: E402  (its client, fan-out cell and bare launch)


def kernel_pid(kern):
    return kern.km.provisioner.process.pid


def template_pid(kern):
    """The kernel's child started with DISTKERNEL_TEMPLATE, or None."""
    import psutil
    for p in psutil.Process(kernel_pid(kern)).children():
        try:
            if "DISTKERNEL_TEMPLATE" in p.environ():
                return p.pid
        except psutil.Error:
            pass
    return None


def memory_kb(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                out["rss_kb"] = int(line.split()[1])
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    out["pss_kb"] = int(line.split()[1])
    except OSError:
        pass
    return out


def timed_dk(kern, ranks, opts):
    code = f"%%distributed num_processes={ranks} tracking=False {opts}\n" + db.FANOUT_CODE
    elapsed, raw, reply = kern.run(code)
    msgs = db.decode(raw)
    db.remove_logs(db.log_dirs(msgs))
    seen = {line for _, t, c in msgs if t == "stream" and c["name"] == "stdout"
            for line in c["text"].splitlines()}
    ok = reply["status"] == "ok" and all(f"[rank {r}] {r}" in seen for r in range(ranks))
    return elapsed, ok, "" if ok else f"{reply.get('ename')}: {reply.get('evalue')}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefix", default=os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", "prefix")))
    ap.add_argument("-n", "--ranks", type=int, default=8)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--json")
    a = ap.parse_args()
    kdir = os.path.join(a.prefix, "share", "jupyter", "kernels")
    log_root = tempfile.mkdtemp(prefix="warm-bench-logs-")
    env = dict(os.environ, DISTKERNEL_LOG_DIR=log_root)
    out = {"ranks": a.ranks, "load_before": db.loadavg()}
    d = tempfile.mkdtemp(prefix="warm-bench-")
    script = os.path.join(d, "bare_launch.sh")
    with open(script, "w") as f:
        f.write(db.BARE_SCRIPT)
    dk = db.Kernel("distkernel", [kdir], env=env)
    try:
        dk.run("1")
        out["kernel_idle_before_any_run"] = memory_kb(kernel_pid(dk))
        out["template_before_any_run"] = template_pid(dk)
        t, ok, detail = timed_dk(dk, a.ranks, "")
        out["first_cell_builds_template_s"] = t
        print(f"first cell (builds the template): {t:.2f} s {'ok' if ok else detail}",
              flush=True)
        tp = template_pid(dk)
        out["template"] = memory_kb(tp) if tp else None
        print(f"template pid {tp}: {out['template']}; kernel idle before any run: "
              f"{out['kernel_idle_before_any_run']}, template then: "
              f"{out['template_before_any_run']}", flush=True)
        res = {"warm": [], "cold": [], "bare": [], "failures": []}
        for trial in range(-1, a.trials):
            order = ("warm", "cold", "bare")
            if trial % 2:
                order = order[::-1]
            for who in order:
                if who == "bare":
                    t, ok, detail = db.fanout_bare(script, a.ranks, a.python)
                else:
                    t, ok, detail = timed_dk(dk, a.ranks, "warm=False" if who == "cold" else "")
                tag = "warm-up" if trial < 0 else f"trial {trial + 1}"
                print(f"  {tag:8} {who:5} {t:7.2f} s {'ok' if ok else 'FAILED ' + detail}",
                      flush=True)
                if not ok:
                    res["failures"].append({"who": who, "trial": trial, "detail": detail})
                elif trial >= 0:
                    res[who].append(t)
        for who in ("warm", "cold", "bare"):
            res[f"{who}_median_s"] = db.median(res[who])
        if res["warm_median_s"] and res["bare_median_s"]:
            res["warm_over_bare"] = res["warm_median_s"] / res["bare_median_s"]
            res["target_met"] = res["warm_over_bare"] <= 0.2
        if res["cold_median_s"] and res["bare_median_s"]:
            res["cold_over_bare"] = res["cold_median_s"] / res["bare_median_s"]
        out["fanout"] = res
        print(f"median: warm {db.fmt(res['warm_median_s'])} s, cold "
              f"{db.fmt(res['cold_median_s'])} s, bare {db.fmt(res['bare_median_s'])} s; "
              f"warm/bare {db.fmt(res.get('warm_over_bare'), 3)}x (target <= 0.2x), "
              f"cold/bare {db.fmt(res.get('cold_over_bare'), 3)}x", flush=True)
    finally:
        dk.close()
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(log_root, ignore_errors=True)
    out["load_after"] = db.loadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
