#!/usr/bin/python3
"""Today's stack against its anchors, each in one run (issue 34, item 7).

    /usr/bin/python3 bench/today_bench.py [--prefix build/prefix] [--venv VENV]
        [--only launcher,ipp,fsdp] [--json out.json]

The kernel is distkernel installed for the venv's Python (`distkernel install
--python VENV/bin/python`, into a temporary prefix), as a user of today's
stack installs it; the references run in the same venv (scripts/venv.sh).

1. launcher: one small function (gloo init_process_group, a line per rank, an
   all_reduce, a second line per rank) on 4 processes, through accelerate's
   `notebook_launcher(fn, num_processes=4)` in an ipykernel 7 of the venv, and
   as a warm `%%distributed num_processes=4` cell (ranks forked from the
   kernel's warm-start template, built by an untimed first cell). From
   execute_request to the first line the function printed, and to the cell's
   idle status; interleaved trials, medians and distkernel / accelerate.
2. ipp: ipyparallel of the venv (and Debian's, with --debian-ipp) against
   started ranks (`%distributed start num_processes=8`), pool_bench's `pass`
   cells in interleaved blocks and dist_bench's relay (8 x --lines lines,
   every line checked) on the started ranks against `%%px`.
3. fsdp: bench/fsdp_loop.py (FSDP2 `fully_shard`, CPU, gloo) under
   `VENV/bin/torchrun --nproc-per-node=2` and as a `%%distributed
   num_processes=2` cell whose text is the script's; steps per second timed by
   the ranks themselves after warm-up steps; interleaved; distkernel / torchrun
   (target >= 0.98).

Every distkernel cell has tracking=False (the references keep no MLflow runs).
Rank logs go to a temporary DISTKERNEL_LOG_DIR that is removed at the end. See
bench/README.md.
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dist_bench as db  # noqa: E402  (client, ipcluster, relay, cleanup)
import pool_bench as pb  # noqa: E402  (timed cells, summaries, %%px setup)

KERNEL = "distkernel-today"

# ---------------------------------------------------------------- launcher

FN = '''\
def fn():
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"fn: rank {rank} of {world} up", flush=True)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    print(f"fn: rank {rank} sum {t.item():g}", flush=True)
    dist.destroy_process_group()
'''
FN_LINE = re.compile(r"fn: rank (\d+) (?:of \d+ up|sum (\S+))")


def fn_check(msgs, ranks):
    """(seconds to the first line fn printed, ok): every rank's two lines, the right sum."""
    first, up, sums = None, set(), {}
    for t, mtype, c in msgs:
        if mtype != "stream":
            continue
        for m in FN_LINE.finditer(json.loads(c)["text"]):
            first = t if first is None else first
            if m.group(2) is None:
                up.add(int(m.group(1)))
            else:
                sums[int(m.group(1))] = m.group(2)
    want = f"{ranks * (ranks + 1) // 2:g}"
    ok = up == set(range(ranks)) and sums == {r: want for r in range(ranks)}
    return first, ok


def end_hung_cell(kern):
    """End a hung cell, then wait for it behind a `pass` cell: distkernel's by an
    interrupt (its ranks are its to end); ipykernel's by SIGKILL to the processes
    below it (the launch's ranks; the launcher then raises). Returns those pids."""
    if kern.name == KERNEL:
        kern.km.interrupt_kernel()
        kern.run("pass", timeout=300)
        return []
    table = db.proc_table()
    pids = db.descendants(table, kern.km.provisioner.process.pid)
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    kern.run("pass", timeout=300)
    return pids


def launcher_once(kern, code, ranks, timeout):
    try:
        elapsed, raw, reply = kern.run(code, timeout=timeout)
    except TimeoutError:
        pids = end_hung_cell(kern)
        return {"first_line_s": None, "end_s": None, "ok": False, "hung": True,
                "detail": f"no end within {timeout} s: hung; " +
                          (f"its processes {pids} killed" if pids else "interrupted")}
    first, ok = fn_check(raw, ranks)
    ok = ok and reply["status"] == "ok"
    detail = "" if ok else (f"reply {reply['status']} {reply.get('ename', '')} "
                            f"{reply.get('evalue', '')}; output "
                            f"{''.join(json.loads(c).get('text', '') for _, t, c in raw)[-800:]!r}")
    return {"first_line_s": first, "end_s": elapsed, "ok": ok, "hung": False, "detail": detail}


def bench_launcher(a, dk, out):
    ranks = a.launcher_ranks
    print(f"\n== launcher: {ranks} processes, accelerate notebook_launcher vs a warm "
          f"%%distributed cell, {a.launcher_trials} interleaved trials", flush=True)
    kdir = db.ipykernel_dir(a.python)
    try:
        ipk = db.Kernel("ipybench", [kdir])
    finally:
        shutil.rmtree(kdir, ignore_errors=True)
    res = {"load_before": db.loadavg(), "dk": [], "accelerate": [], "failures": []}
    try:
        pb.timed(ipk, "import torch\nfrom accelerate import notebook_launcher")
        dk_code = f"%%distributed num_processes={ranks} tracking=False\n{FN}fn()"

        def acc_code():
            # a free port each time: the default 29500 may be another run's
            return f"{FN}notebook_launcher(fn, num_processes={ranks}, use_port='{db.free_port()}')"
        r = launcher_once(dk, dk_code, ranks, 600)
        res["dk_first_cell_s"] = r["end_s"]
        print(f"  first distkernel cell (builds the template): {r['end_s']:.2f} s "
              f"{'ok' if r['ok'] else r['detail']}", flush=True)
        for trial in range(-1, a.launcher_trials):
            order = ("dk", "accelerate") if trial % 2 else ("accelerate", "dk")
            for who in order:
                r = launcher_once(dk, dk_code, ranks, a.launcher_timeout) if who == "dk" \
                    else launcher_once(ipk, acc_code(), ranks, a.launcher_timeout)
                tag = "warm-up" if trial < 0 else f"trial {trial + 1}"
                print(f"  {tag:8} {who:10} first line {db.fmt(r['first_line_s'], 3)} s, end "
                      f"{db.fmt(r['end_s'], 3)} s {'ok' if r['ok'] else 'FAILED ' + r['detail']}",
                      flush=True)
                if not r["ok"]:
                    res["failures"].append(dict(r, who=who, trial=trial))
                elif trial >= 0:
                    res[who].append(r)
    finally:
        ipk.close()
    for who in ("dk", "accelerate"):
        res[f"{who}_failed"] = sum(f["who"] == who for f in res["failures"])
        res[f"{who}_hung"] = sum(f["who"] == who and f["hung"] for f in res["failures"])
        for what in ("first_line_s", "end_s"):
            res[f"{who}_{what}"] = db.median([r[what] for r in res[who]])
    for what in ("first_line_s", "end_s"):
        if res[f"dk_{what}"] and res[f"accelerate_{what}"]:
            res[f"ratio_{what}"] = res[f"dk_{what}"] / res[f"accelerate_{what}"]
    res["load_after"] = db.loadavg()
    print(f"  median first line: distkernel {db.fmt(res['dk_first_line_s'], 3)} s, accelerate "
          f"{db.fmt(res['accelerate_first_line_s'], 3)} s: "
          f"{db.fmt(res.get('ratio_first_line_s'), 3)}x", flush=True)
    print(f"  median end:        distkernel {db.fmt(res['dk_end_s'], 3)} s, accelerate "
          f"{db.fmt(res['accelerate_end_s'], 3)} s: {db.fmt(res.get('ratio_end_s'), 3)}x",
          flush=True)
    print(f"  failed (hung): distkernel {res['dk_failed']} ({res['dk_hung']}), accelerate "
          f"{res['accelerate_failed']} ({res['accelerate_hung']}) of "
          f"{a.launcher_trials + 1} each", flush=True)
    out["launcher"] = res


# ---------------------------------------------------------------- ipyparallel


def bench_ipp(a, dk, out):
    n = a.ranks
    refs = [("today", a.python, os.path.join(a.venv, "bin", "ipcluster"))]
    if a.debian_ipp:
        refs.append(("debian", "/usr/bin/python3", "/usr/bin/ipcluster"))
    print(f"\n== ipyparallel against {n} started ranks: `pass` ({a.samples} samples, blocks "
          f"of 10) and relay ({n} x {a.lines} lines, {a.relay_trials} trials)", flush=True)
    res = {"ranks": n, "lines": a.lines, "load_before": db.loadavg(), "refs": {}}
    ipps = {}
    try:
        for name, python, ipcluster in refs:
            kern, cluster, status = pb.start_ipp(n, python, ipcluster)
            version = subprocess.run([python, "-c", "import ipyparallel as i; print(i.__version__)"],
                                     capture_output=True, text=True).stdout.strip()
            res["refs"][name] = {"status": status, "python": python, "ipyparallel": version}
            print(f"  ipyparallel {version} ({python}): {status}", flush=True)
            if kern:
                ipps[name] = (kern, cluster)
        res["start_s"] = pb.timed(dk, f"%distributed start num_processes={n} tracking=False")
        dk_pass = "%%distributed\npass"
        for _ in range(5):
            pb.timed(dk, dk_pass)
            for kern, _ in ipps.values():
                pb.timed(kern, "%%px\npass")
        started, px = [], {name: [] for name in ipps}
        while len(started) < a.samples:
            for _ in range(10):
                started.append(pb.timed(dk, dk_pass))
            for name, (kern, _) in ipps.items():
                for _ in range(10):
                    px[name].append(pb.timed(kern, "%%px\npass"))
        res["started_pass"] = pb.summary(started)
        print(f"  pass: started ranks median {res['started_pass']['median_s'] * 1e3:.1f} ms "
              f"(p90 {res['started_pass']['p90_s'] * 1e3:.1f})", flush=True)
        for name, xs in px.items():
            s = res["refs"][name]["pass"] = pb.summary(xs)
            s["started_over_px"] = res["started_pass"]["median_s"] / s["median_s"]
            print(f"  pass: %%px ({name}) median {s['median_s'] * 1e3:.1f} ms (p90 "
                  f"{s['p90_s'] * 1e3:.1f}): started / %%px {s['started_over_px']:.3f}x",
                  flush=True)
        # relay: dist_bench's loop and line check, on the started ranks and on the engines
        db.relay_dk(dk, n, min(a.lines, 1000), False)
        for kern, cluster in ipps.values():
            db.relay_ipp(kern, n, min(a.lines, 1000), cluster)
        runs = {"dk": [], **{name: [] for name in ipps}}
        for trial in range(a.relay_trials):
            order = ["dk", *ipps]
            for who in (order if trial % 2 == 0 else order[::-1]):
                r = (db.relay_dk(dk, n, a.lines, False) if who == "dk"
                     else db.relay_ipp(*ipps[who][:1], n, a.lines, ipps[who][1]))
                r["load"] = db.loadavg()
                runs[who].append(r)
                print(f"  relay trial {trial + 1} {who:6} {r['seconds']:6.2f} s "
                      f"{r['mb_per_s']:6.2f} MB/s (first->last output "
                      f"{db.fmt(r['stream_mb_per_s'])} MB/s) lines {r['lines_received']}/"
                      f"{r['lines_expected']} complete={r['complete']} in_order={r['in_order']} "
                      f"reply={r['reply_status']}", flush=True)
        for who, rs in runs.items():
            ok = [r for r in rs if r["complete"] and r["in_order"] and r["reply_status"] == "ok"]
            s = {"mb_per_s": db.median([r["mb_per_s"] for r in ok]),
                 "seconds": db.median([r["seconds"] for r in ok]),
                 "stream_mb_per_s": db.median([r["stream_mb_per_s"] for r in ok
                                               if r["stream_mb_per_s"]]),
                 "complete_in_order": len(ok), "trials": len(rs),
                 "runs": [{k: v for k, v in r.items() if not k.endswith("examples")}
                          for r in rs]}
            (res.setdefault("relay_dk", s) if who == "dk" else
             res["refs"][who].__setitem__("relay", s))
        for name in ipps:
            s = res["refs"][name]["relay"]
            if s["mb_per_s"] and res["relay_dk"]["mb_per_s"]:
                s["dk_over_px"] = res["relay_dk"]["mb_per_s"] / s["mb_per_s"]
            print(f"  relay: started ranks {db.fmt(res['relay_dk']['mb_per_s'])} MB/s, %%px "
                  f"({name}) {db.fmt(s['mb_per_s'])} MB/s: {db.fmt(s.get('dk_over_px'))}x "
                  f"(complete and in order: {res['relay_dk']['complete_in_order']}/"
                  f"{res['relay_dk']['trials']} and {s['complete_in_order']}/{s['trials']})",
                  flush=True)
        pb.timed(dk, "%distributed stop")
    finally:
        for kern, cluster in ipps.values():
            kern.close()
            cluster.stop()
    res["load_after"] = db.loadavg()
    out["ipp"] = res


# ---------------------------------------------------------------- FSDP

FSDP_RESULT = re.compile(r"FSDP_RESULT (\{.*\})")


def fsdp_env(a):
    return {"FSDP_WIDTH": str(a.fsdp_width), "FSDP_LAYERS": str(a.fsdp_layers),
            "FSDP_BATCH": str(a.fsdp_batch), "FSDP_STEPS": str(a.fsdp_steps),
            "FSDP_WARMUP": str(a.fsdp_warmup)}


def fsdp_result(text):
    m = FSDP_RESULT.search(text)
    return json.loads(m.group(1)) if m else None


def fsdp_launch(a, argv):
    """The FSDP loop's result from the ranks ARGV starts (in a session of
    their own, ended whatever happens), and "" or why it failed."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, **fsdp_env(a)), start_new_session=True)
    db._GROUPS.append(proc)
    try:
        so, se = proc.communicate(timeout=900)
    finally:
        db.kill_group(proc)
    r = fsdp_result(so.decode(errors="replace"))
    return r, "" if r and proc.returncode == 0 else \
        f"exit {proc.returncode}: {se.decode(errors='replace')[-1500:]}"


def fsdp_torchrun(a, script):
    return fsdp_launch(a, [os.path.join(a.venv, "bin", "torchrun"),
                           f"--nproc-per-node={a.fsdp_ranks}",
                           f"--master-port={db.free_port()}", script])


def fsdp_bare(a, script, bare_sh):
    """The ranks with no launcher at all: dist_bench's bare shell launch (the
    rank environment distkernel gives, then `python -c SCRIPT` each)."""
    with open(script) as f:
        code = f.read()
    return fsdp_launch(a, ["/bin/bash", bare_sh, str(a.fsdp_ranks), str(db.free_port()),
                           a.python, code])


def fsdp_cell(a, dk, script):
    with open(script) as f:
        code = (f"%%distributed num_processes={a.fsdp_ranks} tracking=False "
                f"{a.fsdp_cell_options}\n" + f.read())
    _, raw, reply = dk.run(code, timeout=900)
    text = "".join(json.loads(c).get("text", "") for _, t, c in raw if t == "stream")
    r = fsdp_result(text)
    return r, "" if r and reply["status"] == "ok" else \
        f"reply {reply['status']} {reply.get('evalue', '')}: {text[-1500:]}"


def bench_fsdp(a, dk, out):
    script = os.path.join(HERE, "fsdp_loop.py")
    print(f"\n== FSDP: {a.fsdp_ranks} ranks, {a.fsdp_steps} timed steps after "
          f"{a.fsdp_warmup}, {a.fsdp_trials} interleaved trials", flush=True)
    res = {"load_before": db.loadavg(), "env": fsdp_env(a), "dk": [], "torchrun": [],
           "bare": [], "failures": []}
    bare_sh = os.path.join(a.tmp, "bare_launch.sh")
    with open(bare_sh, "w") as f:
        f.write(db.BARE_SCRIPT)
    sides = ("torchrun", "dk") + (("bare",) if a.fsdp_bare else ())
    for trial in range(-1, a.fsdp_trials):
        for who in (sides if trial % 2 == 0 else sides[::-1]):
            r, detail = (fsdp_cell(a, dk, script) if who == "dk" else
                         fsdp_torchrun(a, script) if who == "torchrun" else
                         fsdp_bare(a, script, bare_sh))
            tag = "warm-up" if trial < 0 else f"trial {trial + 1}"
            print(f"  {tag:8} {who:8} " + (f"{r['steps_per_s']:.3f} steps/s, "
                                           f"rank 0 CPU {r['cpu_s'] / r['seconds']:.2f} of its wall, "
                                           f"{r.get('threads')} torch thread(s)"
                                           if r and not detail
                                           else f"FAILED {detail}") +
                  f"  (load {os.getloadavg()[0]:.1f})", flush=True)
            if detail:
                res["failures"].append({"who": who, "trial": trial, "detail": detail})
            elif trial >= 0:
                res[who].append(dict(r, load=db.loadavg(), trial=trial))
    # each trial's pair, run one right after the other: how far apart the same
    # code lands under the machine's load
    dk_by_trial = {r["trial"]: r["steps_per_s"] for r in res["dk"]}
    res["pair_ratios"] = sorted(dk_by_trial[r["trial"]] / r["steps_per_s"]
                                for r in res["torchrun"] if r["trial"] in dk_by_trial)
    for who in ("dk", "torchrun", "bare"):
        res[f"{who}_median_steps_per_s"] = db.median([r["steps_per_s"] for r in res[who]])
    if res["dk_median_steps_per_s"] and res["bare_median_steps_per_s"]:
        res["dk_over_bare"] = res["dk_median_steps_per_s"] / res["bare_median_steps_per_s"]
        res["torchrun_over_bare"] = (res["torchrun_median_steps_per_s"] or 0) / \
            res["bare_median_steps_per_s"]
    if res["dk_median_steps_per_s"] and res["torchrun_median_steps_per_s"]:
        res["ratio"] = res["dk_median_steps_per_s"] / res["torchrun_median_steps_per_s"]
        res["target_met"] = res["ratio"] >= 0.98
    res["load_after"] = db.loadavg()
    print(f"  median: distkernel {db.fmt(res['dk_median_steps_per_s'], 3)} steps/s, torchrun "
          f"{db.fmt(res['torchrun_median_steps_per_s'], 3)} steps/s: "
          f"{db.fmt(res.get('ratio'), 3)}x (target >= 0.98x)", flush=True)
    if res["bare"]:
        print(f"  bare launch {db.fmt(res['bare_median_steps_per_s'], 3)} steps/s: distkernel / "
              f"bare {db.fmt(res.get('dk_over_bare'), 3)}x, torchrun / bare "
              f"{db.fmt(res.get('torchrun_over_bare'), 3)}x", flush=True)
    if res["pair_ratios"]:
        print(f"  pairs: distkernel / torchrun median {db.median(res['pair_ratios']):.3f}x, "
              f"from {res['pair_ratios'][0]:.3f}x to {res['pair_ratios'][-1]:.3f}x", flush=True)
    out["fsdp"] = res


# ---------------------------------------------------------------- main


def versions(python):
    code = ("import importlib.metadata as m, json\nout = {}\n"
            "for p in ('torch', 'ipykernel', 'ipython', 'jupyter_client', 'ipyparallel', "
            "'accelerate'):\n"
            "    try: out[p] = m.version(p)\n"
            "    except Exception: out[p] = None\nprint(json.dumps(out))")
    return json.loads(subprocess.run([python, "-c", code], capture_output=True, text=True,
                                     check=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", default=os.path.join(HERE, "..", "prefix"),
                    help="distkernel build's install prefix (its bin/distkernel installs the "
                         "kernel for the venv)")
    ap.add_argument("--venv", default=os.environ.get("DISTKERNEL_TEST_VENV"),
                    help="the venv of today's stack (default: $DISTKERNEL_TEST_VENV, else "
                         "the path scripts/venv.sh prints, which builds it if missing)")
    ap.add_argument("--only", default="launcher,ipp,fsdp")
    ap.add_argument("--launcher-ranks", type=int, default=4)
    ap.add_argument("--launcher-trials", type=int, default=20)
    ap.add_argument("--launcher-timeout", type=float, default=60,
                    help="seconds before a launcher cell counts as hung (its ranks are "
                         "then killed and the trial is a failure)")
    ap.add_argument("-n", "--ranks", type=int, default=8, help="started ranks and engines")
    ap.add_argument("--samples", type=int, default=50, help="`pass` cells each")
    ap.add_argument("--lines", type=int, default=100000, help="relay lines a rank")
    ap.add_argument("--relay-trials", type=int, default=3)
    ap.add_argument("--debian-ipp", action="store_true",
                    help="also Debian's ipyparallel (/usr/bin/ipcluster, /usr/bin/python3)")
    ap.add_argument("--fsdp-ranks", type=int, default=2)
    ap.add_argument("--fsdp-trials", type=int, default=9)
    ap.add_argument("--fsdp-bare", action=argparse.BooleanOptionalAction, default=True,
                    help="also the ranks launched bare from a shell (dist_bench's launch)")
    ap.add_argument("--fsdp-cell-options", default="",
                    help="more %%%%distributed options for the FSDP cell (warm=False: cold ranks)")
    ap.add_argument("--fsdp-steps", type=int, default=60)
    ap.add_argument("--fsdp-warmup", type=int, default=5)
    ap.add_argument("--fsdp-width", type=int, default=512)
    ap.add_argument("--fsdp-layers", type=int, default=4)
    ap.add_argument("--fsdp-batch", type=int, default=64)
    ap.add_argument("--json")
    a = ap.parse_args()
    if not a.venv:
        a.venv = subprocess.run([os.path.join(HERE, "..", "scripts", "venv.sh")], check=True,
                                stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    a.python = os.path.join(a.venv, "bin", "python")
    only = set(a.only.split(","))
    if only - {"launcher", "ipp", "fsdp"}:
        sys.exit(f"--only: unknown part(s) {sorted(only - {'launcher', 'ipp', 'fsdp'})}; "
                 "choose from launcher,ipp,fsdp")
    exe = os.path.join(a.prefix, "bin", "distkernel")
    if not os.access(exe, os.X_OK):
        sys.exit(f"no {exe}: build and install distkernel first (scripts/build.sh), "
                 "or give --prefix")
    if not os.access(a.python, os.X_OK):
        sys.exit(f"no {a.python}: build the venv of today's stack first (scripts/venv.sh), "
                 "or give --venv")
    tmp = a.tmp = tempfile.mkdtemp(prefix="today-bench-")
    out = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "cpus": os.cpu_count(), "load_at_start": db.loadavg(),
           "versions": versions(a.python), "config": vars(a)}
    print(f"today_bench: {os.cpu_count()} CPUs, load average {db.loadavg()}, venv "
          f"{out['versions']}", flush=True)
    try:
        subprocess.run([exe, "install", "--prefix", tmp, "--name", KERNEL, "--python", a.python],
                       check=True, capture_output=True, timeout=120)
        env = dict(os.environ, DISTKERNEL_LOG_DIR=os.path.join(tmp, "logs"), **fsdp_env(a))
        dk = db.Kernel(KERNEL, [os.path.join(tmp, "share", "jupyter", "kernels")], env=env)
        try:
            if "launcher" in only:
                bench_launcher(a, dk, out)
            if "ipp" in only:
                bench_ipp(a, dk, out)
            if "fsdp" in only:
                bench_fsdp(a, dk, out)
        finally:
            dk.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_at_end"] = db.loadavg()
    out["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(f"load average at end: {out['load_at_end']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"results in {a.json}")


if __name__ == "__main__":
    main()
