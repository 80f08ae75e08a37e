#!/usr/bin/python3
"""distkernel at scale on the simulated Slurm cluster (tests/slurm/), each figure
against a reference measured in the same run.

    nice -n 19 /usr/bin/python3 bench/scale_bench.py [--prefix build/prefix] [--json out.json]
                                                    [--only curve,bare,torch,pass,relay]

1. curve: a trivial cell (`pass`) at 8, 16, ... ranks on nodes of 16 ranks each
   (8 on one node), up to --max-ranks or until memory runs short (each size's
   peak use, doubled, must leave --min-free GiB free), one node agent per node,
   one srun step of N tasks: wall time
   (execute_request to idle), the kernel's CPU (its own, and its reaped
   children's: salloc and srun on the login side), slurmctld's CPU, the kernel's
   peak RSS (VmHWM) and the peak summed RSS and number of its live children
   (sampled every --sample-every s); per rank where it says more.
2. bare: at --bare-ranks (512) on 32 nodes, and at 16 on 1 node, `salloc -N.. -n..
   srun python3 -c pass` from a shell, each right after the kernel's cell of the
   same size.
3. torch: import torch + init_process_group("gloo") + one all_reduce, 32 ranks on
   8 nodes, as a cell and from a bare `salloc ... srun` (one torch import each).
4. pass: `%distributed start` of --pass-ranks ranks, then `%%distributed pass`
   cells, against `rc[:].execute("pass", block=True)` on as many ipyparallel
   engines started with srun on the same nodes (ipcontroller on the login
   namespace's address, the cluster's NET.1), interleaved.
5. relay: 64 ranks on 8 nodes printing --lines lines each, as a cell and with
   `rc[:].execute(loop)` on 64 ipyparallel engines under srun (the client
   reading every engine's stdout), lines counted on both sides.

The cluster (DISTKERNEL_SLURM_SIM_DIR/_NET/_BRIDGE/_CPUS/_GPUS, defaults below)
is brought up with as many nodes as the largest run needs and taken down at the
end, also on error or SIGTERM; the kernel's rank logs go to a temporary folder
that is removed. See bench/README.md.
"""

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import dist_bench as db  # noqa: E402  (its client and cleanup)
from slurm_cluster import bring_up, cluster_sh  # noqa: E402

now = time.monotonic
PER_NODE = 16
SIM_DEFAULTS = {"DISTKERNEL_SLURM_SIM_DIR": "/tmp/slurm-bench",
                "DISTKERNEL_SLURM_SIM_NET": "10.85.0",
                "DISTKERNEL_SLURM_SIM_BRIDGE": "brbench",
                "DISTKERNEL_SLURM_SIM_CPUS": str(PER_NODE),
                "DISTKERNEL_SLURM_SIM_GPUS": "0"}
PY = "/usr/bin/python3"
GiB = 1 << 30


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def vm_hwm(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def cpu_of(pid):
    """CPU seconds (user+sys) of PID so far, or None."""
    if not pid:
        return None
    row = db.proc_stat(pid)
    return row[1] if row else None


def sockets_of(pid):
    """How many sockets PID holds open (its back channel's connections among
    them), 0 once it is gone."""
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
            except OSError:
                pass
    except OSError:
        pass
    return n


class Sampler(threading.Thread):
    """Every EVERY s: the peak summed RSS of PID's live descendants (on the login
    side: salloc, and srun with its helpers), the most of them alive at once, by
    name, and the lowest MemAvailable. One walk of /proc costs ~25 us a process
    (~40 ms with 1,024 ranks up), hence not every 0.1 s."""

    def __init__(self, pid, every):
        super().__init__(daemon=True)
        self.pid, self.every, self.stop_ev = pid, every, threading.Event()
        self.children_rss = self.children_max = 0
        self.children_names = {}
        self.min_avail = mem_available()
        self.kernel_sockets = 0

    def sample(self):
        self.kernel_sockets = max(self.kernel_sockets, sockets_of(self.pid))
        table = db.proc_table()
        kids = db.descendants(table, self.pid)
        self.children_rss = max(self.children_rss, sum(table[p][2] for p in kids))
        if len(kids) > self.children_max:
            self.children_max = len(kids)
            names = {}
            for p in kids:
                names[comm(p)] = names.get(comm(p), 0) + 1
            self.children_names = names
        self.min_avail = min(self.min_avail, mem_available())

    def run(self):
        while not self.stop_ev.wait(self.every):
            self.sample()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.join()


def kernel_pid(kern):
    return kern.km.provisioner.process.pid


SAMPLE_EVERY = 0.5    # --sample-every
CTLD_PID = None       # slurmctld of the benchmark's cluster, for its CPU per cell


def cell(kern, code, timeout=1800):
    """Run CODE; seconds, kernel CPU (own, reaped children), slurmctld's CPU,
    memory, reply."""
    pid = kernel_pid(kern)
    c0, k0 = kern.cpu(), cpu_of(CTLD_PID)
    with Sampler(pid, SAMPLE_EVERY) as s:
        took, raw, reply = kern.run(code, timeout=timeout)
    c1, k1 = kern.cpu(), cpu_of(CTLD_PID)
    return {"s": took, "kernel_cpu_s": c1[0] - c0[0], "children_cpu_s": c1[1] - c0[1],
            "ctld_cpu_s": k1 - k0 if k0 is not None and k1 is not None else None,
            "kernel_hwm": vm_hwm(pid), "children_rss_peak": s.children_rss,
            "children_max": s.children_max, "children_names": s.children_names,
            "kernel_sockets": s.kernel_sockets,
            "min_avail": s.min_avail, "load_after": db.loadavg(),
            "ok": reply["status"] == "ok",
            "error": "" if reply["status"] == "ok" else
            f"{reply.get('ename')}: {reply.get('evalue')}"[:800], "raw": raw}


def must(res, what):
    if not res["ok"]:
        sys.exit(f"{what} failed: {res['error']}")
    res.pop("raw", None)
    return res


def shell(argv, env, timeout=1800):
    """Run ARGV (a bare salloc/srun); seconds, reaped CPU (user+sys), ok, tail."""
    r0 = os.times()
    t0 = now()
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    took = now() - t0
    r1 = os.times()
    return {"s": took, "cpu_s": (r1.children_user - r0.children_user +
                                 r1.children_system - r0.children_system),
            "ok": run.returncode == 0, "stdout": run.stdout,
            "tail": (run.stderr + run.stdout)[-800:]}


def nodes_for(ranks):
    return max(1, ranks // PER_NODE)


def summary(xs):
    xs = sorted(xs)
    return {"min": xs[0], "median": db.median(xs), "max": xs[-1], "n": len(xs)}


# ---------------------------------------------------------------- 1 + 2: curve, bare


def bare_pass(env, ranks):
    n = nodes_for(ranks)
    r = shell(["salloc", "-N", str(n), "-n", str(ranks), "--quiet", "srun", "-N", str(n),
               "-n", str(ranks), PY, "-c", "pass"], env)
    if not r["ok"]:
        sys.exit(f"bare salloc/srun of {ranks} failed: {r['tail']}")
    r.pop("stdout")
    return r


def keep_evidence(a):
    """Slurm's logs and the kernel's rank logs, kept for a failed run."""
    dest = tempfile.mkdtemp(prefix="scale-bench-failure-")
    shutil.copytree(os.path.join(a.sim_dir, "log"), os.path.join(dest, "slurm-log"),
                    dirs_exist_ok=True)
    shutil.copytree(a.log_root, os.path.join(dest, "kernel-logs"), dirs_exist_ok=True)
    print(f"  Slurm's and the kernel's logs kept in {dest}", flush=True)


def cell_line(ranks, nodes, r):
    per = 1e3 / ranks
    kids = ", ".join(f"{n} {k}" for k, n in sorted(r["children_names"].items()))
    ctld = (f", slurmctld {r['ctld_cpu_s']:5.2f} s" if r.get("ctld_cpu_s") is not None else "")
    return (f"  {ranks:5} ranks {nodes:3} nodes: cell {r['s']:7.2f} s, CPU kernel "
            f"{r['kernel_cpu_s']:6.2f} s ({r['kernel_cpu_s'] * per:.2f} ms/rank), its "
            f"children {r['children_cpu_s']:6.2f} s ({r['children_cpu_s'] * per:.2f} ms/rank)"
            f"{ctld}; RSS kernel {r['kernel_hwm'] / 2**20:6.1f} MiB, children "
            f"{r['children_rss_peak'] / 2**20:7.1f} MiB (at most {r['children_max']} alive: "
            f"{kids or 'none seen'}); kernel sockets <= {r.get('kernel_sockets', 0)}; "
            f"free >= {r['min_avail'] / GiB:4.1f} GiB, load "
            f"{r['load_after'][0]:.0f}")


def per_rank(p, idle_hwm):
    """Per rank figures of a curve point (medians over its trials)."""
    n = p["ranks"]
    res = {"kernel_cpu_ms": 1e3 * p["kernel_cpu_s"]["median"] / n,
           "children_cpu_ms": 1e3 * p["children_cpu_s"]["median"] / n,
           "kernel_rss_kib": (p["kernel_hwm"] - idle_hwm) / 1024 / n,
           "children_rss_kib": p["children_rss_peak"] / 1024 / n}
    if p.get("ctld_cpu_s"):
        res["ctld_cpu_ms"] = 1e3 * p["ctld_cpu_s"]["median"] / n
    return res


def point_of(ranks, runs, idle_hwm):
    point = {"ranks": ranks, "nodes": nodes_for(ranks), "runs": runs}
    for k in ("s", "kernel_cpu_s", "children_cpu_s", "ctld_cpu_s"):
        xs = [r[k] for r in runs if r.get(k) is not None]
        if xs:
            point[k] = summary(xs)
    point["kernel_hwm"] = max(r["kernel_hwm"] for r in runs)
    point["children_rss_peak"] = max(r["children_rss_peak"] for r in runs)
    point["children_max"] = max(r["children_max"] for r in runs)
    point["kernel_sockets"] = max(r.get("kernel_sockets", 0) for r in runs)
    point["per_rank"] = per_rank(point, idle_hwm)
    return point


HOLD_S = 0           # --hold: the curve's cell sleeps this long (every rank connected at once)


def pass_cell(ranks):
    body = f"import time\ntime.sleep({HOLD_S:g})" if HOLD_S > 0 else "pass"
    return (f"%%distributed num_processes={ranks} nodes={nodes_for(ranks)} "
            f"launcher=slurm tracking=False\n{body}")


def bench_curve(a, kern, env, out):
    sizes = [s for s in (8, 16, 32, 64, 128, 256, 512, 1024)
             if a.min_ranks <= s <= a.max_ranks]
    curve, bare = [], {}
    idle_hwm = vm_hwm(kernel_pid(kern))
    out["kernel_rss_idle"] = idle_hwm
    for ranks in sizes:
        trials = a.trials if ranks < a.big_from else a.big_trials
        avail = mem_available()
        if curve:
            # Peak use of the last size, doubled, must leave --min-free GiB.
            last = curve[-1]
            used = max(0, last["avail_before"] - min(r["min_avail"] for r in last["runs"]))
            if avail - 2 * used < a.min_free * GiB:
                out["curve_stopped"] = (f"{ranks} ranks not run: {last['ranks']} used "
                                        f"{used / GiB:.1f} GiB at peak "
                                        f"({used / last['ranks'] / 2**20:.1f} MiB a rank), "
                                        f"{ranks} would need about {2 * used / GiB:.1f} of "
                                        f"{avail / GiB:.1f} GiB available, leaving "
                                        f"under {a.min_free} GiB")
                print("  " + out["curve_stopped"], flush=True)
                break
        runs = []
        with_bare = ranks in (a.bare_ranks, PER_NODE) and "bare" in a.only
        if with_bare:
            bare[ranks] = []
        failed = None
        for t in range(trials):
            r = cell(kern, pass_cell(ranks))
            r.pop("raw")
            if not r["ok"]:
                failed = f"{ranks} ranks: the cell failed after {r['s']:.1f} s: {r['error']}"
                print("  " + failed, flush=True)
                keep_evidence(a)
            else:
                runs.append(r)
                print(cell_line(ranks, nodes_for(ranks), r), flush=True)
            if with_bare:
                # Right after the cell of the same size, under the same load.
                b = bare_pass(env, ranks)
                bare[ranks].append(b)
                print(f"  {ranks:5} ranks: bare salloc+srun {b['s']:7.2f} s "
                      f"(CPU {b['cpu_s']:.2f} s)", flush=True)
            if failed:
                break
        if failed:
            out["curve_stopped"] = failed
        if not runs:
            break
        point = point_of(ranks, runs, idle_hwm)
        point["avail_before"] = avail
        curve.append(point)
        if failed:
            break
    out["curve"] = curve
    if bare:
        out["bare"] = {str(k): {"runs": v, "s": summary([r["s"] for r in v])}
                       for k, v in bare.items()}
        by = {p["ranks"]: p for p in curve}
        big, one = a.bare_ranks, PER_NODE
        if big in bare and big in by:
            cell_s, bare_s = by[big]["s"]["median"], out["bare"][str(big)]["s"]["median"]
            res = {"cell_s": cell_s, "bare_s": bare_s, "ratio": cell_s / bare_s,
                   "target": 1.5, "met": cell_s / bare_s <= 1.5}
            if one in bare and one in by:
                # On a real cluster each node starts its own ranks in parallel: the
                # 1-node run is what a node's share costs; what the login side does
                # per rank (the kernel, its salloc and srun) stays serial.
                c1 = by[one]
                login_extra = ((by[big]["kernel_cpu_s"]["median"] +
                                by[big]["children_cpu_s"]["median"]) -
                               (c1["kernel_cpu_s"]["median"] + c1["children_cpu_s"]["median"]))
                est = c1["s"]["median"] + login_extra
                res.update({"cell_1node_s": c1["s"]["median"],
                            "bare_1node_s": out["bare"][str(one)]["s"]["median"],
                            "login_cpu_extra_s": login_extra,
                            "cell_parallel_nodes_est_s": min(est, cell_s),
                            "per_node_share": max(0.0, 1 - est / cell_s),
                            "ratio_parallel_est": min(est, cell_s) /
                            out["bare"][str(one)]["s"]["median"]})
            out["vs_bare"] = res
            print(f"  {big} ranks: cell {cell_s:.2f} s, bare {bare_s:.2f} s: {res['ratio']:.2f}x "
                  f"(target <= 1.5x: {'met' if res['met'] else 'not met'})", flush=True)
            if "per_node_share" in res:
                print(f"  1 node x {one}: cell {res['cell_1node_s']:.2f} s, bare "
                      f"{res['bare_1node_s']:.2f} s; login-side CPU added from {one} to {big} "
                      f"ranks {login_extra:.2f} s; with nodes starting in parallel about "
                      f"{res['cell_parallel_nodes_est_s']:.2f} s, i.e. "
                      f"{100 * res['per_node_share']:.0f}% of the {big}-rank time is per-node "
                      "start-up that a real cluster runs in parallel", flush=True)


# ---------------------------------------------------------------- 3: torch

TORCH_CODE = ('import torch, torch.distributed as dist\n'
              'dist.init_process_group("gloo")\n'
              't = torch.ones(1)\n'
              'dist.all_reduce(t)\n'
              'assert int(t.item()) == dist.get_world_size()\n')
SRUN_ENV = ('import os\n'
            'os.environ.update(RANK=os.environ["SLURM_PROCID"], '
            'WORLD_SIZE=os.environ["SLURM_NTASKS"], LOCAL_RANK=os.environ["SLURM_LOCALID"], '
            'MASTER_ADDR="node1", MASTER_PORT="29561")\n')


def bench_torch(a, kern, env, out):
    ranks, nodes = a.torch_ranks, a.torch_nodes
    cells, bares = [], []
    for t in range(a.torch_trials):
        order = ("cell", "bare") if t % 2 == 0 else ("bare", "cell")
        for who in order:
            if who == "cell":
                r = must(cell(kern, f"%%distributed num_processes={ranks} nodes={nodes} "
                                    f"launcher=slurm tracking=False\n{TORCH_CODE}"),
                         "torch cell")
                cells.append(r)
            else:
                r = shell(["salloc", "-N", str(nodes), "-n", str(ranks), "--quiet", "srun", "-N",
                           str(nodes), "-n", str(ranks), PY, "-c", SRUN_ENV + TORCH_CODE], env)
                if not r["ok"]:
                    sys.exit(f"bare torch run failed: {r['tail']}")
                r.pop("stdout")
                bares.append(r)
            print(f"  torch {ranks} ranks on {nodes} nodes: {who} {r['s']:.2f} s, free >= "
                  f"{r.get('min_avail', mem_available()) / GiB:.1f} GiB", flush=True)
    res = {"ranks": ranks, "nodes": nodes, "cell": cells, "bare": bares,
           "cell_s": summary([r["s"] for r in cells]), "bare_s": summary([r["s"] for r in bares])}
    res["ratio"] = res["cell_s"]["median"] / res["bare_s"]["median"]
    res["met"] = res["ratio"] <= 0.5
    out["torch"] = res
    print(f"  torch: cell {res['cell_s']['median']:.2f} s, bare {res['bare_s']['median']:.2f} s: "
          f"{res['ratio']:.2f}x (target <= 0.5x: {'met' if res['met'] else 'not met'})",
          flush=True)


# ---------------------------------------------------------------- 4 + 5: ipyparallel under srun


def engines_rss():
    """Summed RSS of the ipyparallel engines living now (on every node)."""
    total, page = 0, os.sysconf("SC_PAGE_SIZE")
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if argv[:3] != [PY.encode(), b"-m", b"ipyparallel.engine"]:
                continue
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, ValueError):
            continue
    return total


class Engines:
    """ipcontroller on the login namespace's address, N ipengines under one srun
    on NODES nodes, and a Client; all in a private profile folder."""

    def __init__(self, env, login_addr, ranks, nodes, timeout, min_free):
        self.profile = tempfile.mkdtemp(prefix="scale-bench-ipp-")
        self.procs = []
        self.client = None
        self.log = open(os.path.join(self.profile, "out.log"), "w+")
        try:
            self._start(env, login_addr, ranks, nodes, timeout, min_free)
        except BaseException:
            self.close()
            raise

    def _start(self, env, login_addr, ranks, nodes, timeout, min_free):
        t0 = now()
        ctl = subprocess.Popen(
            [shutil.which("ipcontroller"), f"--profile-dir={self.profile}", f"--ip={login_addr}",
             "--log-level=WARN"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._own(ctl)
        conn = os.path.join(self.profile, "security", "ipcontroller-engine.json")
        deadline = now() + 120
        while not os.path.exists(conn):
            if now() > deadline or ctl.poll() is not None:
                raise RuntimeError(f"ipcontroller did not start: {self.tail()}")
            time.sleep(0.2)
        time.sleep(0.5)   # the file is written before its sockets are bound
        per = f"--ntasks-per-node={ranks // nodes}"
        eng = subprocess.Popen(
            ["salloc", "-N", str(nodes), per, "--quiet", "srun", "-N", str(nodes), per,
             PY, "-m", "ipyparallel.engine", f"--file={conn}",
             "--log-level=WARN"],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self._own(eng)
        import ipyparallel as ipp
        self.client = ipp.Client(os.path.join(self.profile, "security",
                                              "ipcontroller-client.json"))
        deadline = now() + timeout
        while len(self.client.ids) < ranks:
            if now() > deadline or eng.poll() is not None:
                raise RuntimeError(f"{len(self.client.ids)} of {ranks} engines came: "
                                   f"{self.tail()}")
            if mem_available() < min_free * GiB:
                raise RuntimeError(f"memory: {len(self.client.ids)} of {ranks} engines up "
                                   f"with {mem_available() / GiB:.1f} GiB left")
            time.sleep(0.5)
        self.ready_s = now() - t0
        self.rss = engines_rss()
        self.view = self.client[:]
        for r, e in enumerate(sorted(self.client.ids)):
            self.client[e]["rank"] = r

    def _own(self, proc):
        self.procs.append(proc)
        db._GROUPS.append(proc)

    def tail(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-2000:]

    def close(self):
        if self.client:
            try:
                self.client.shutdown(hub=True, block=False)
            except Exception:
                pass
            self.client.close()
            self.client = None
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            db.kill_group(p)
        self.procs = []
        if not self.log.closed:
            self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)


def ipp_pass(eng):
    t0 = now()
    eng.view.execute("pass", block=True)
    return now() - t0


def bench_pass(a, kern, env, login_addr, out):
    ranks, nodes = a.pass_ranks, nodes_for(a.pass_ranks)
    res = {"ranks": ranks, "nodes": nodes}
    start = must(cell(kern, f"%distributed start nodes={nodes} num_processes={ranks} "
                            "launcher=slurm tracking=False"), "%distributed start")
    res["start_s"] = start["s"]
    print(f"  pass: {ranks} ranks started on {nodes} nodes in {start['s']:.2f} s", flush=True)
    eng = None
    try:
        try:
            eng = Engines(env, login_addr, ranks, nodes, a.ipp_timeout, a.min_free)
            res["engines_ready_s"] = eng.ready_s
            res["engines_rss"] = eng.rss
            print(f"  pass: {ranks} ipyparallel engines under srun ready in {eng.ready_s:.1f} s, "
                  f"{eng.rss / 2**20:.0f} MiB RSS", flush=True)
        except Exception as e:
            res["ipp_status"] = f"could not start: {e}"
            print(f"  pass: ipyparallel {res['ipp_status']}", flush=True)
        for _ in range(3):
            must(cell(kern, "%%distributed\npass"), "warm-up cell")
            if eng:
                ipp_pass(eng)
        dk, px = [], []
        while len(dk) < a.pass_samples:
            for _ in range(5):
                dk.append(must(cell(kern, "%%distributed\npass"), "pass cell")["s"])
            for _ in range(5 if eng else 0):
                px.append(ipp_pass(eng))
        res["dk_s"] = summary(dk)
        if px:
            res["ipp_s"] = summary(px)
            res["ratio"] = res["dk_s"]["median"] / res["ipp_s"]["median"]
            res["met"] = res["ratio"] < 1
        print(f"  pass on {ranks} started ranks: median {res['dk_s']['median'] * 1e3:.0f} ms"
              + (f"; ipyparallel execute('pass') median {res['ipp_s']['median'] * 1e3:.0f} ms: "
                 f"{res['ratio']:.2f}x (target < 1x: {'met' if res['met'] else 'not met'})"
                 if px else ""), flush=True)
    finally:
        if eng:
            eng.close()
        must(cell(kern, "%distributed stop"), "%distributed stop")
    out["pass"] = res


RELAY = ("import os\nrank = int(os.environ.get('RANK', rank))\n"
         "for i in range({lines}):\n    print(f'{{rank}} {{i}}')\n")


def relay_dk_once(kern, ranks, lines):
    r = cell(kern, "%%distributed\n" + RELAY.format(lines=lines).replace(
        "os.environ.get('RANK', rank)", "os.environ['RANK']"))
    raw = r.pop("raw")
    if not r["ok"]:
        sys.exit(f"relay cell failed: {r['error']}")
    check = db.LineCheck(ranks, lines)
    text = "".join(json.loads(c)["text"] for _, t, c in raw
                   if t == "stream" and json.loads(c)["name"] == "stdout")
    for line in text.splitlines():
        m = db.RANK_LINE.match(line)
        if m:
            check.add(int(m.group(1)), m.group(2))
    r.update(check.summary())
    return r


def relay_ipp_once(eng, ranks, lines):
    t0 = now()
    ar = eng.view.execute(RELAY.format(lines=lines), block=False)
    ar.get()
    ar.wait_for_output(600)   # stdout comes on its own channel, maybe after the result
    took = now() - t0
    check = db.LineCheck(ranks, lines)
    for e, text in zip(ar.engine_id, ar.stdout):
        for line in text.splitlines():
            parts = line.split(" ")
            check.add(int(parts[0]) if parts[0].isdigit() else -1, line)
    res = check.summary()
    res["s"] = took
    return res


def bench_relay(a, kern, env, login_addr, out):
    ranks, nodes, lines = a.relay_ranks, a.relay_nodes, a.lines
    res = {"ranks": ranks, "nodes": nodes, "lines": lines, "dk": [], "ipp": []}
    eng = None
    # Both sides on processes started beforehand: the kernel's started ranks
    # and the engines; what is timed is the code and its output.
    must(cell(kern, f"%distributed start nodes={nodes} num_processes={ranks} "
                    "launcher=slurm tracking=False"), "%distributed start")
    try:
        try:
            eng = Engines(env, login_addr, ranks, nodes, a.ipp_timeout, a.min_free)
            res["engines_ready_s"] = eng.ready_s
            res["engines_rss"] = eng.rss
        except Exception as e:
            res["ipp_status"] = f"could not start: {e}"
            print(f"  relay: ipyparallel {res['ipp_status']}", flush=True)
        relay_dk_once(kern, ranks, 100)      # warm-up, not timed
        if eng:
            relay_ipp_once(eng, ranks, 100)
        for t in range(a.relay_trials):
            for who in (("dk", "ipp") if t % 2 == 0 else ("ipp", "dk")):
                if who == "ipp" and not eng:
                    continue
                r = (relay_dk_once(kern, ranks, lines) if who == "dk"
                     else relay_ipp_once(eng, ranks, lines))
                r["mb_per_s"] = r["payload_bytes"] / r["s"] / 1e6
                res[who].append(r)
                print(f"  relay {ranks} x {lines} lines: {who:3} {r['s']:6.2f} s "
                      f"{r['mb_per_s']:5.2f} MB/s, {r['lines_received']}/{r['lines_expected']} "
                      f"lines, in order {r['in_order']}", flush=True)
    finally:
        if eng:
            eng.close()
        must(cell(kern, "%distributed stop"), "%distributed stop")
    for who in ("dk", "ipp"):
        if res[who]:
            res[f"{who}_mb_per_s"] = summary([r["mb_per_s"] for r in res[who]])
            res[f"{who}_complete"] = all(r["complete"] for r in res[who])
            for r in res[who]:
                for k in ("per_rank_received", "per_rank_out_of_order", "raw"):
                    r.pop(k, None)
    if res["dk"] and res["ipp"]:
        res["ratio"] = res["dk_mb_per_s"]["median"] / res["ipp_mb_per_s"]["median"]
        res["met"] = res["ratio"] >= 2
        print(f"  relay: {res['ratio']:.2f}x ipyparallel (target >= 2x: "
              f"{'met' if res['met'] else 'not met'})", flush=True)
    out["relay"] = res


# ---------------------------------------------------------------- plot


def plot(out, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib: apt-get install python3-matplotlib for the plot", flush=True)
        return
    curve = out["curve"]
    # Runs from before the one-step-per-rank launch was removed (5 December
    # 2026) may hold its curve ("steps") or have run the main curve that way
    # (config "launch"): they are drawn as they ran.
    launch = out["config"].get("launch", "agent")
    x = [p["ranks"] for p in curve]
    steps = out.get("steps", []) if launch != "steps" else []
    sx = [p["ranks"] for p in steps]
    fig, ax = plt.subplots(1, 3, figsize=(12, 3.6), dpi=80)
    ax[0].plot(x, [p["s"]["median"] for p in curve], "o-", label=f"cell ({launch})")
    if steps:
        ax[0].plot(sx, [p["s"]["median"] for p in steps], "x", label="cell (steps)")
    bare = out.get("bare", {})
    bx = sorted(int(k) for k in bare)
    if bx:
        ax[0].plot(bx, [bare[str(k)]["s"]["median"] for k in bx], "s", label="bare salloc+srun")
    if out.get("curve_stopped"):
        ax[0].text(0.03, 0.97, "stopped at " + out["curve_stopped"].split(":")[0]
                   + ("\n(" + out["curve_stopped"].split(": ", 2)[-1][:60] + ")"
                      if "failed" in out["curve_stopped"] else ""),
                   transform=ax[0].transAxes, fontsize=7, va="top")
    ax[0].set_title("trivial cell: wall time")
    ax[0].set_ylabel("s")
    kids = "its children (salloc, srun)" if launch != "steps" else "its srun steps"
    ax[1].plot(x, [p["kernel_cpu_s"]["median"] for p in curve], "o-", label="kernel")
    ax[1].plot(x, [p["children_cpu_s"]["median"] for p in curve], "o-", label=kids)
    if steps:
        ax[1].plot(sx, [p["kernel_cpu_s"]["median"] for p in steps], "x", label="kernel (steps)")
        ax[1].plot(sx, [p["children_cpu_s"]["median"] for p in steps], "+",
                   label="its srun steps (steps)")
    ax[1].set_title("login-side CPU (user+sys)")
    ax[1].set_ylabel("s")
    ax[2].plot(x, [p["kernel_hwm"] / 2**20 for p in curve], "o-", label="kernel (VmHWM)")
    ax[2].plot(x, [p["children_rss_peak"] / 2**20 for p in curve], "o-",
               label=kids + " (peak sum)")
    if steps:
        ax[2].plot(sx, [p["children_rss_peak"] / 2**20 for p in steps], "+",
                   label="its srun steps (steps)")
    ax[2].set_title("login-side RSS")
    ax[2].set_ylabel("MiB")
    for a in ax:
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel(f"ranks ({PER_NODE} a node)")
        a.legend(fontsize=7)
        a.grid(alpha=0.3)
    fig.suptitle(f"distkernel on the simulated Slurm cluster, {out['started'][:10]} "
                 f"({os.cpu_count()} cores shared by every node)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    print(f"plot in {path} ({os.path.getsize(path) // 1024} KiB)", flush=True)


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", default=os.path.join(ROOT, "build", "prefix"))
    ap.add_argument("--only", default="curve,bare,torch,pass,relay")
    ap.add_argument("--max-ranks", type=int, default=1024)
    ap.add_argument("--min-ranks", type=int, default=8, help="curve: the smallest size run")
    ap.add_argument("--min-free", type=float, default=4.0, help="GiB to leave free")
    ap.add_argument("--trials", type=int, default=2, help="curve trials below --big-from")
    ap.add_argument("--big-trials", type=int, default=1, help="curve trials from --big-from")
    ap.add_argument("--big-from", type=int, default=256)
    ap.add_argument("--sample-every", type=float, default=0.5,
                    help="seconds between samples of the login side's processes")
    ap.add_argument("--bare-ranks", type=int, default=512)
    ap.add_argument("--torch-ranks", type=int, default=32)
    ap.add_argument("--torch-nodes", type=int, default=8)
    ap.add_argument("--torch-trials", type=int, default=2)
    ap.add_argument("--pass-ranks", type=int, default=128)
    ap.add_argument("--pass-samples", type=int, default=20)
    ap.add_argument("--relay-ranks", type=int, default=64)
    ap.add_argument("--relay-nodes", type=int, default=8)
    ap.add_argument("--lines", type=int, default=20000)
    ap.add_argument("--relay-trials", type=int, default=3)
    ap.add_argument("--ipp-timeout", type=float, default=900)
    ap.add_argument("--plot", default=os.path.join(HERE, "scale.png"))
    ap.add_argument("--heartbeat", type=float, default=60,
                    help="DISTKERNEL_SLURM_HEARTBEAT for the kernel (0: its default, 10 s): "
                         "hundreds of ranks starting on 2 shared cores starve the ranks' "
                         "heartbeat threads past 10 s, and their nodes are taken for lost")
    ap.add_argument("--connect-timeout", type=float, default=0,
                    help="DISTKERNEL_SLURM_CONNECT_TIMEOUT for the kernel (0: its default, "
                         "120 s)")
    ap.add_argument("--hold", type=float, default=0,
                    help="curve: the cell sleeps this many seconds instead of `pass`, so "
                         "the kernel holds every rank's connection at once")
    ap.add_argument("--json")
    ap.add_argument("--replot", metavar="JSON", help="only draw --plot from a run's --json")
    a = ap.parse_args()
    if a.replot:
        with open(a.replot) as f:
            plot(json.load(f), a.plot)
        return
    a.only = a.only.split(",")
    global SAMPLE_EVERY, CTLD_PID, HOLD_S
    SAMPLE_EVERY = a.sample_every
    HOLD_S = a.hold
    kdir = os.path.join(a.prefix, "share", "jupyter", "kernels")
    if not os.path.isfile(os.path.join(kdir, "distkernel", "kernel.json")):
        sys.exit(f"no distkernel kernelspec under {kdir}: build with scripts/build.sh first")
    sim = {k: os.environ.get(k, v) for k, v in SIM_DEFAULTS.items()}
    sim_cpus = int(sim["DISTKERNEL_SLURM_SIM_CPUS"])
    if sim_cpus < PER_NODE:
        sys.exit(f"DISTKERNEL_SLURM_SIM_CPUS must be at least {PER_NODE}")
    need = [nodes_for(a.max_ranks) if "curve" in a.only else 1,
            a.torch_nodes if "torch" in a.only else 1,
            # ipyparallel's engines need nodes of their own beside the kernel's
            # allocation (both are held at once)
            2 * nodes_for(a.pass_ranks) if "pass" in a.only else 1,
            2 * a.relay_nodes if "relay" in a.only else 1]
    nodes = max(need)
    out = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "host": platform.node(), "cpus": os.cpu_count(), "load_at_start": db.loadavg(),
           "mem_available_at_start": mem_available(), "config": vars(a), "sim": sim}
    print(f"scale_bench: {os.cpu_count()} CPUs, load {db.loadavg()}, "
          f"{mem_available() / GiB:.1f} GiB available; cluster of {nodes} nodes", flush=True)
    sh_env = dict(os.environ, **sim)
    log_root = tempfile.mkdtemp(prefix="scale-bench-logs-")
    a.sim_dir, a.log_root = sim["DISTKERNEL_SLURM_SIM_DIR"], log_root
    cluster = kern = None

    def down(*_):
        if kern:
            kern.close()
        db._cleanup()
        if cluster and cluster.started:
            cluster_sh("down", env=sh_env, timeout=600)
        shutil.rmtree(log_root, ignore_errors=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        t0 = now()
        cluster = bring_up(nodes, env=sh_env)
        out["cluster_up_s"] = now() - t0
        print(f"cluster up in {out['cluster_up_s']:.0f} s "
              f"({'started' if cluster.started else 'reused'})", flush=True)
        env = dict(cluster.env, MLFLOW_TRACKING_URI="")
        kenv = {k: v for k, v in cluster.env.items()
                if not k.startswith(("SLURM_", "DISTKERNEL_SLURM_"))
                and k not in ("DISTKERNEL_NODES", "DISTKERNEL_LAUNCHER")}
        kenv.update(DISTKERNEL_LOG_DIR=log_root, MLFLOW_TRACKING_URI="", SLURM_CONF=cluster.conf)
        try:
            with open(os.path.join(a.sim_dir, "pids", "slurmctld")) as f:
                pid = int(f.read().split()[0])
            CTLD_PID = pid if comm(pid) == "slurmctld" else None
        except (OSError, ValueError, IndexError):
            CTLD_PID = None
        if a.connect_timeout:
            kenv["DISTKERNEL_SLURM_CONNECT_TIMEOUT"] = str(a.connect_timeout)
        if a.heartbeat:
            kenv["DISTKERNEL_SLURM_HEARTBEAT"] = str(a.heartbeat)
        kern = db.Kernel("distkernel", [kdir], env=kenv)
        must(cell(kern, "%%distributed num_processes=2 nodes=1 launcher=slurm "
                        "tracking=False\npass"),
             "warm-up cell")
        if "curve" in a.only:
            print("== curve: a `pass` cell", flush=True)
            if "bare" not in a.only:
                a.bare_ranks = -1
            bench_curve(a, kern, env, out)
        if out.get("curve"):
            plot(out, a.plot)
        for name, title, fn in (
                ("torch", "torch + gloo + all_reduce", lambda: bench_torch(a, kern, env, out)),
                ("pass", "pass on started ranks",
                 lambda: bench_pass(a, kern, env, cluster.login_addr, out)),
                ("relay", "relay", lambda: bench_relay(a, kern, env, cluster.login_addr, out))):
            if name not in a.only:
                continue
            print(f"== {title}", flush=True)
            try:
                fn()
            except (Exception, SystemExit) as e:   # the next part still runs
                out.setdefault("errors", {})[name] = str(e)
                print(f"  {name} failed: {e}", flush=True)
    finally:
        down()
        kern = None
    out["load_at_end"] = db.loadavg()
    out["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(f"load at end {out['load_at_end']}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
        print(f"results in {a.json}")


if __name__ == "__main__":
    main()
