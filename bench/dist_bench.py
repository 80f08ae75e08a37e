#!/usr/bin/python3
"""%%distributed benchmark: fan-out against a bare launch, relay against ipyparallel.

Run with Debian's interpreter (it has torch, pyzmq, jupyter_client; ipyparallel
comes from python3-ipyparallel):

    /usr/bin/python3 bench/dist_bench.py [--prefix ./prefix] [--json out.json]

1. Fan-out: N ranks run `import torch; dist.init_process_group("gloo");
   print(rank)` as a `%%distributed num_processes=N` cell (execute_request to
   idle), against the same N ranks started by a shell script with the same
   rank environment (`/usr/bin/python3 -c CODE` each, then `wait`). Trials are
   interleaved; medians and their ratio are reported (target <= 1.10x).
2. Relay: N ranks print L lines each; every line reaching the client is
   counted and checked for per-rank order, and the payload rate (MB/s) is
   compared with ipyparallel's `%%px` running the same loop on N engines
   from an ipykernel (target: distkernel >= 2x).

See bench/README.md for the details.
"""

import argparse
import atexit
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone

try:
    import zmq
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager
except ImportError:  # pragma: no cover
    sys.exit("pyzmq/jupyter_client missing: run this with /usr/bin/python3")

DELIM = b"<IDS|MSG>"
now = time.perf_counter

# Everything we start, so that nothing is left behind whatever happens.
_KERNELS = []
_GROUPS = []
_LOG_PARENTS = set()


def _cleanup():
    for kern in list(_KERNELS):
        kern.close()
    for proc in list(_GROUPS):
        kill_group(proc)


def kill_group(proc, grace=5.0):
    """SIGTERM, then SIGKILL, the process group led by PROC (start_new_session)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        if proc.poll() is not None:
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = now() + wait
        while now() < deadline:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.05)
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass
    if proc in _GROUPS:
        _GROUPS.remove(proc)


atexit.register(_cleanup)


def _on_signal(signum, frame):
    _cleanup()
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _on_signal)


def loadavg():
    return list(os.getloadavg())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def median(xs):
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------- kernels


class Kernel:
    """A kernel started with jupyter_client, plus our own iopub SUB socket.

    jupyter_client starts the kernel and sends requests; iopub is read on a
    socket of our own with no receive high-water mark, drained in a tight loop
    and decoded afterwards, so that the client is never the bottleneck (nor a
    reason for the kernel's PUB socket to drop messages).
    """

    def __init__(self, name, kernel_dirs, env=None):
        self.name = name
        ksm = KernelSpecManager(kernel_dirs=kernel_dirs)
        self.km = KernelManager(kernel_name=name, kernel_spec_manager=ksm)
        t0 = now()
        self.km.start_kernel(env=env) if env else self.km.start_kernel()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)
        _KERNELS.append(self)
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.RCVBUF, 4 << 20)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        ci = self.km.get_connection_info()
        self.sub.connect(f"{ci['transport']}://{ci['ip']}:{ci['iopub_port']}")
        # The SUB is connected once a kernel_info's status reaches it.
        deadline = now() + 30
        while now() < deadline:
            self.kc.kernel_info()
            if self.sub.poll(200):
                self.drain_until_quiet(0.2)
                break
        else:
            raise RuntimeError(f"{name}: no iopub message on our SUB socket")
        self.start_s = now() - t0

    def cpu(self):
        """(own, reaped children's) CPU seconds of the kernel process, from /proc."""
        try:
            pid = self.km.provisioner.process.pid
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            tick = os.sysconf("SC_CLK_TCK")
            return ((int(fields[11]) + int(fields[12])) / tick,
                    (int(fields[13]) + int(fields[14])) / tick)
        except (OSError, AttributeError, IndexError, ValueError):
            return (0.0, 0.0)

    def drain_until_quiet(self, quiet):
        while self.sub.poll(int(quiet * 1000)):
            self.sub.recv_multipart()

    def run(self, code, timeout=900):
        """Execute CODE; return (seconds to idle, [(t, msg_type, content bytes)], reply content).

        The clock starts just before execute_request is sent and stops when our
        SUB socket has the cell's `status: idle`.
        """
        self.drain_until_quiet(0.05)
        t0 = now()
        msg_id = self.kc.execute(code)
        key = msg_id.encode()
        msgs = []
        deadline = t0 + timeout
        while True:
            left = deadline - now()
            if left <= 0 or not self.sub.poll(int(left * 1000)):
                raise TimeoutError(f"{self.name}: no idle within {timeout} s")
            frames = self.sub.recv_multipart()
            t = now()
            i = frames.index(DELIM)
            if key not in frames[i + 3]:  # parent header
                continue
            mtype = json.loads(frames[i + 2])["msg_type"]
            if mtype == "status":
                if json.loads(frames[i + 5])["execution_state"] == "idle":
                    elapsed = t - t0
                    break
                continue
            msgs.append((t - t0, mtype, frames[i + 5]))
        reply = None
        while reply is None:
            m = self.kc.get_shell_msg(timeout=60)
            if m["parent_header"].get("msg_id") == msg_id:
                reply = m["content"]
        return elapsed, msgs, reply

    def close(self):
        if self not in _KERNELS:
            return
        _KERNELS.remove(self)
        try:
            self.sub.close(0)
            self.kc.stop_channels()
            self.km.shutdown_kernel(now=False)
        except Exception:
            try:
                self.km.shutdown_kernel(now=True)
            except Exception:
                pass


def decode(msgs):
    """[(t, type, content dict)] from run()'s raw list."""
    return [(t, mtype, json.loads(c)) for t, mtype, c in msgs]


def ipykernel_dir(python):
    """A kernelspec dir whose python3 runs ipykernel under PYTHON."""
    d = tempfile.mkdtemp(prefix="dist-bench-ks-")
    os.makedirs(os.path.join(d, "ipybench"))
    with open(os.path.join(d, "ipybench", "kernel.json"), "w") as f:
        json.dump({"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                   "display_name": "ipykernel (bench)", "language": "python"}, f)
    return d


def log_dirs(msgs):
    """The rank log folders the distkernel status line names."""
    found = set()
    for _, mtype, c in msgs:
        if mtype in ("display_data", "update_display_data"):
            m = re.search(r"logs: (\S+)", c.get("data", {}).get("text/plain", ""))
            if m:
                found.add(m.group(1))
    return sorted(found)


def remove_logs(dirs):
    for d in dirs:
        # Only the run folders distkernel makes: LOG_ROOT/kernel-PID/run-NNNN-ID,
        # LOG_ROOT being the user's state directory's distkernel/logs (or, with
        # older builds, /tmp/distkernel-logs-UID or /tmp/distkernel-job-XXXXXX).
        if ((re.match(r"^/tmp/distkernel-(job-\w+|logs-\d+/kernel-\d+/run-[\w-]+)$", d)
             or re.match(r"^/.+/distkernel/logs/kernel-\d+/run-\d+-[0-9a-f]+$", d))
                and os.path.isdir(d) and not os.path.islink(d)):
            shutil.rmtree(d, ignore_errors=True)
            if "/kernel-" in d:
                _LOG_PARENTS.add(os.path.dirname(d))


def remove_empty_log_parents():
    """The per-kernel log folders emptied above, once their kernels are gone."""
    for d in sorted(_LOG_PARENTS):
        try:
            os.rmdir(d)
        except OSError:
            pass
    _LOG_PARENTS.clear()


# ---------------------------------------------------------------- fan-out

FANOUT_CODE = ('import os, torch, torch.distributed as dist\n'
               'dist.init_process_group("gloo")\n'
               'print(dist.get_rank())')

BARE_SCRIPT = r'''#!/bin/bash
# The same ranks as %%distributed starts, launched bare: the rank environment
# the kernel's runtime sets (runtime/launch/dk_job_launch.c), then `python3 -c CODE` each.
# Each rank writes to its own file (as distkernel gives each rank its own
# pipe and log), printed as "RANK: TEXT" lines once all have exited.
N=$1; PORT=$2; PY=$3; CODE=$4
RUN_ID=bare$$
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
pids=()
for ((r = 0; r < N; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$N LOCAL_WORLD_SIZE=$N GROUP_RANK=0 ROLE_RANK=$r \
  ROLE_NAME=default GROUP_WORLD_SIZE=1 ROLE_WORLD_SIZE=$N MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=$PORT TORCHELASTIC_RUN_ID=$RUN_ID TORCHELASTIC_RESTART_COUNT=0 \
  TORCHELASTIC_MAX_RESTARTS=0 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
  "$PY" -c "$CODE" > "$OUT/$r" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for ((r = 0; r < N; r++)); do sed "s/^/$r: /" "$OUT/$r"; done
exit $rc
'''


def fanout_bare(script, ranks, python):
    port = free_port()
    t0 = now()
    proc = subprocess.Popen(["/bin/bash", script, str(ranks), str(port), python, FANOUT_CODE],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    _GROUPS.append(proc)
    out, err = proc.communicate(timeout=900)
    elapsed = now() - t0
    _GROUPS.remove(proc)
    lines = out.decode(errors="replace").splitlines()
    ok = (proc.returncode == 0
          and sorted(lines) == sorted(f"{r}: {r}" for r in range(ranks)))
    detail = "" if ok else (f"exit {proc.returncode}, stdout {out[-300:]!r}, "
                            f"stderr {err.decode(errors='replace')[-1500:]}")
    return elapsed, ok, detail


def fanout_dk(kern, ranks):
    code = f"%%distributed num_processes={ranks}\n" + FANOUT_CODE
    elapsed, raw, reply = kern.run(code)
    msgs = decode(raw)
    seen = set()
    stderr = []
    for _, mtype, c in msgs:
        if mtype == "stream" and c["name"] == "stdout":
            for line in c["text"].splitlines():
                m = re.match(r"^\[rank (\d+)\] (\d+)$", line)
                if m and m.group(1) == m.group(2):
                    seen.add(int(m.group(1)))
        elif mtype == "stream":
            stderr.append(c["text"])
    logs = log_dirs(msgs)
    ok = reply["status"] == "ok" and seen == set(range(ranks))
    detail = "" if ok else f"reply {reply.get('status')} {reply.get('evalue', '')}; " \
                           f"ranks seen {sorted(seen)}; stderr {''.join(stderr)[-1500:]}"
    return elapsed, ok, detail, logs


def bench_fanout(args, dk):
    print(f"\n== fan-out: {args.ranks} ranks, gloo init_process_group, "
          f"{args.trials} interleaved trials (+{args.warmup} warm-up each)", flush=True)
    d = tempfile.mkdtemp(prefix="dist-bench-")
    script = os.path.join(d, "bare_launch.sh")
    with open(script, "w") as f:
        f.write(BARE_SCRIPT)
    res = {"dk": [], "bare": [], "failures": [], "load_before": loadavg()}
    try:
        for trial in range(-args.warmup, args.trials):
            order = ("dk", "bare") if trial % 2 == 0 else ("bare", "dk")
            for who in order:
                if who == "dk":
                    t, ok, detail, logs = fanout_dk(dk, args.ranks)
                    if not args.keep_logs:
                        remove_logs(logs)
                else:
                    t, ok, detail = fanout_bare(script, args.ranks, args.python)
                tag = "warm-up" if trial < 0 else f"trial {trial + 1}"
                print(f"  {tag:8} {who:5} {t:7.2f} s {'ok' if ok else 'FAILED ' + detail}",
                      flush=True)
                if not ok:
                    res["failures"].append({"who": who, "trial": trial, "detail": detail})
                if trial >= 0 and ok:
                    res[who].append(t)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    res["load_after"] = loadavg()
    res["dk_median_s"] = median(res["dk"])
    res["bare_median_s"] = median(res["bare"])
    if res["dk_median_s"] and res["bare_median_s"]:
        res["ratio"] = res["dk_median_s"] / res["bare_median_s"]
        res["target_met"] = res["ratio"] <= 1.10
    print(f"  median: distkernel {fmt(res['dk_median_s'])} s, bare {fmt(res['bare_median_s'])} s,"
          f" ratio {fmt(res.get('ratio'), 3)}x (target <= 1.10x)", flush=True)
    return res


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


# ---------------------------------------------------------------- relay

RELAY_LOOP = "for i in range({lines}):\n    print(f\"{{rank}} {{i}}\")\n"


def payload_bytes(rank, count):
    """Bytes of the lines f"{rank} {i}\\n" for i < count (what the ranks print)."""
    total, digits, lo = 0, 1, 0
    while lo < count:
        hi = min(count, 10 ** digits)
        total += (hi - lo) * (len(str(rank)) + 1 + digits + 1)
        lo, digits = hi, digits + 1
    return total


class LineCheck:
    """Per-rank completeness and order of "R i" payload lines."""

    def __init__(self, ranks, lines):
        self.ranks, self.lines = ranks, lines
        self.next = [0] * ranks
        self.received = [0] * ranks
        self.out_of_order = [0] * ranks
        self.bad = 0           # lines that are not "R i" of the right rank
        self.bad_examples = []
        self.first_gap = {}    # rank -> (expected, got)

    def add(self, rank, payload):
        parts = payload.split(" ")
        if (len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit()
                or int(parts[0]) != rank or not 0 <= rank < self.ranks):
            self.bad += 1
            if len(self.bad_examples) < 5:
                self.bad_examples.append(f"rank {rank}: {payload[:80]!r}")
            return
        i = int(parts[1])
        self.received[rank] += 1
        if i != self.next[rank]:
            self.out_of_order[rank] += 1
            self.first_gap.setdefault(rank, (self.next[rank], i))
        self.next[rank] = i + 1

    def summary(self):
        complete = all(r == self.lines for r in self.received)
        ordered = not any(self.out_of_order)
        delivered = sum(payload_bytes(r, min(n, self.lines)) for r, n in enumerate(self.received))
        return {
            "complete": complete and self.bad == 0,
            "in_order": ordered,
            "lines_expected": self.ranks * self.lines,
            "lines_received": sum(self.received),
            "per_rank_received": self.received,
            "per_rank_out_of_order": self.out_of_order,
            "first_gap": {str(k): v for k, v in self.first_gap.items()},
            "malformed_lines": self.bad,
            "malformed_examples": self.bad_examples,
            "payload_bytes": delivered,
        }


RANK_LINE = re.compile(r"^\[rank (\d+)\] (.*)$")


def relay_dk(kern, ranks, lines, keep_logs, options=""):
    code = (f"%%distributed num_processes={ranks} {options}\nimport os\n"
            "rank = int(os.environ['RANK'])\n" + RELAY_LOOP.format(lines=lines))
    cpu0 = kern.cpu()
    elapsed, raw, reply = kern.run(code)
    cpu1 = kern.cpu()
    t_decode = now()
    msgs = decode(raw)
    check = LineCheck(ranks, lines)
    # The cell's output in order: stdout stream text, and the per-rank displays
    # distkernel opens for a line being redrawn or left unfinished (placeholders,
    # filled with each display's final text, which is what the notebook shows).
    pieces, final, stderr = [], {}, []
    stream_msgs = wire = 0
    first = last = None
    for t, mtype, c in msgs:
        if mtype == "stream":
            stream_msgs += 1
            wire += len(c["text"].encode())
            if c["name"] != "stdout":
                stderr.append(c["text"])
                continue
            pieces.append(c["text"])
            first = t if first is None else first
            last = t
        elif mtype in ("display_data", "update_display_data"):
            did = c.get("transient", {}).get("display_id", "")
            if did.endswith("-status"):
                continue
            if did not in final:
                pieces.append(("display", did))
            final[did] = c.get("data", {}).get("text/plain", "")
    as_display = []

    def take(line, via_display):
        m = RANK_LINE.match(line)
        if not m:
            check.bad += 1
            if len(check.bad_examples) < 5:
                check.bad_examples.append(line[:80])
            return
        check.add(int(m.group(1)), m.group(2))
        if via_display:
            as_display.append(line)

    carry = ""
    for p in pieces:
        if isinstance(p, str):
            parts = (carry + p).split("\n")
            carry = parts.pop()
            for line in parts:
                if line:
                    take(line, False)
        else:
            for line in final[p[1]].split("\n"):
                if line:
                    take(line, True)
    if carry:
        take(carry, False)
    res = check.summary()
    logs = log_dirs(msgs)
    if keep_logs:
        res["log_dirs"] = logs
    else:
        remove_logs(logs)
    res.update({
        "seconds": elapsed,
        "mb_per_s": res["payload_bytes"] / elapsed / 1e6,
        "reply_status": reply["status"],
        "stream_messages": stream_msgs,
        "stream_text_bytes": wire,
        "first_output_s": first,
        "last_output_s": last,
        "stream_mb_per_s": (res["payload_bytes"] / (last - first) / 1e6
                            if first is not None and last > first else None),
        "kernel_cpu_s": cpu1[0] - cpu0[0],
        "ranks_cpu_s": cpu1[1] - cpu0[1],
        "lines_as_display": len(as_display),
        "lines_as_display_examples": as_display[:10],
        "stderr_tail": "".join(stderr)[-1000:],
        "iopub_messages": len(msgs),
        "decode_s": now() - t_decode,
    })
    return res


IPP_SETUP = """\
import time, ipyparallel as ipp
rc = ipp.Client(profile_dir={profile_dir!r})
# (not rc.wait_for_engines, and %%px without its progress bar: in a kernel both
# draw an ipywidgets bar through tqdm, which fails with Debian 12's pair,
# "AttributeError: 'FloatProgress' object has no attribute 'style'")
deadline = time.monotonic() + 600
while len(rc.ids) < {n} and time.monotonic() < deadline:
    time.sleep(0.1)
assert len(rc.ids) >= {n}, f"only {{len(rc.ids)}} engines registered"
dv = rc[:]
dv.block = True
dv.activate()
for r, e in enumerate(sorted(rc.ids)):
    rc[e]['rank'] = r
get_ipython().run_line_magic("pxconfig", "--progress-after -1")
sorted(rc.ids)
"""

PX_HEADER = re.compile(r"^\[(stdout|stderr):(\d+)\] ?")


def proc_stat(pid):
    """(ppid, CPU seconds user+sys, RSS bytes) of PID from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"),
            int(fields[21]) * os.sysconf("SC_PAGE_SIZE"))


def proc_table():
    """{pid: proc_stat(pid)} of every process."""
    table = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            row = proc_stat(pid)
            if row:   # else it exited between the listing and the read
                table[int(pid)] = row
    return table


def descendants(table, root):
    """The pids below ROOT in TABLE (proc_table()), ROOT not included."""
    kids = {}
    for pid, (ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def tree_cpu(root):
    """CPU seconds of ROOT and its live descendants (ipcluster, its controller
    and engines), from /proc."""
    table = proc_table()
    return sum(table[p][1] for p in [root] + descendants(table, root) if p in table)


def relay_ipp(kern, ranks, lines, cluster):
    code = "%%px\n" + RELAY_LOOP.format(lines=lines)
    cpu0, ecpu0 = kern.cpu(), tree_cpu(cluster.proc.pid)
    elapsed, raw, reply = kern.run(code)
    cpu1, ecpu1 = kern.cpu(), tree_cpu(cluster.proc.pid)
    msgs = decode(raw)
    # Inside a kernel, ipyparallel 7 republishes each engine's whole stream so far
    # as one display (display_id per engine request and stream), updated in place:
    # the last version of each display is what the notebook shows.
    displays = {}
    wire = updates = stream_msgs = 0
    first = last = None
    streamed = []
    for t, mtype, c in msgs:
        if mtype in ("display_data", "update_display_data"):
            txt = c.get("data", {}).get("text/plain", "")
            did = c.get("transient", {}).get("display_id") or f"anon{len(displays)}"
            displays[did] = txt
            updates += 1
            wire += len(txt.encode())
            first = t if first is None else first
            last = t
        elif mtype == "stream":
            stream_msgs += 1
            wire += len(c["text"].encode())
            streamed.append((c["name"], c["text"]))
            first = t if first is None else first
            last = t
    check = LineCheck(ranks, lines)
    for did, txt in displays.items():
        m = PX_HEADER.match(txt)
        if not m or m.group(1) != "stdout":
            continue
        body = txt[m.end():].split("\n")
        rank = int(body[0].split(" ")[0]) if body and body[0] else -1
        for line in body:
            if line:
                check.add(rank, line)
    # Without in-place displays (--no-stream or outside a kernel) output comes as
    # stream text with a "[stdout:E] " header whenever the engine changes.
    for name, txt in streamed if not displays else []:
        for line in txt.split("\n"):
            m = PX_HEADER.match(line)
            if m:
                line = line[m.end():]
            if line and name == "stdout":
                parts = line.split(" ")
                check.add(int(parts[0]) if parts[0].isdigit() else -1, line)
    res = check.summary()
    res.update({
        "seconds": elapsed,
        "mb_per_s": res["payload_bytes"] / elapsed / 1e6,
        "reply_status": reply["status"],
        "reply_error": reply.get("evalue", ""),
        "stream_mb_per_s": (res["payload_bytes"] / (last - first) / 1e6
                            if first is not None and last > first else None),
        "kernel_cpu_s": cpu1[0] - cpu0[0],
        "engines_cpu_s": ecpu1 - ecpu0,
        "display_messages": updates,
        "stream_messages": stream_msgs,
        "wire_text_bytes": wire,
        "first_output_s": first,
        "last_output_s": last,
        "iopub_messages": len(msgs),
    })
    return res


class Cluster:
    """`ipcluster start -n N` in a private profile directory."""

    def __init__(self, n, ipcluster):
        self.n = n
        self.profile_dir = tempfile.mkdtemp(prefix="dist-bench-ipp-")
        self.ipcluster = ipcluster
        self.log = open(os.path.join(self.profile_dir, "ipcluster.out"), "w+")
        self.t0 = now()
        self.proc = subprocess.Popen(
            [ipcluster, "start", "-n", str(n), f"--profile-dir={self.profile_dir}",
             "--daemonize=False", "--log-level=WARN"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        _GROUPS.append(self.proc)

    def tail(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def stop(self):
        try:
            subprocess.run([self.ipcluster, "stop", f"--profile-dir={self.profile_dir}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        except Exception:
            pass
        deadline = now() + 20
        while now() < deadline and self.proc.poll() is None:
            time.sleep(0.2)
        kill_group(self.proc)
        self.log.close()
        shutil.rmtree(self.profile_dir, ignore_errors=True)


def bench_relay(args, dk):
    print(f"\n== relay: {args.ranks} ranks x {args.lines} lines, "
          f"{args.relay_trials} interleaved trial(s) each", flush=True)
    res = {"dk": [], "ipp": [], "remote": [], "load_before": loadavg(), "ipp_status": "not run"}
    remote = f"nodes={args.remote_nodes}" if args.remote_nodes else ""
    if remote:
        print(f"  and remote: the same ranks over {args.remote_nodes} Slurm nodes "
              f"(SLURM_CONF={os.environ.get('SLURM_CONF', '')}), their output over the "
              "network back channel", flush=True)
    ipp_kern = cluster = None
    engines = args.engines or args.ranks
    if not args.no_ipyparallel:
        ipcluster = shutil.which("ipcluster")
        try:
            import ipyparallel  # noqa: F401  (only to say early that it is missing)
            res["ipyparallel_version"] = ipyparallel.__version__
        except ImportError as e:
            ipcluster = None
            res["ipp_status"] = f"ipyparallel not importable by {sys.executable}: {e}"
        if ipcluster is None and res["ipp_status"] == "not run":
            res["ipp_status"] = "ipcluster not on PATH (apt-get install python3-ipyparallel)"
        if ipcluster:
            try:
                cluster = Cluster(engines, ipcluster)
                kdir = ipykernel_dir(args.python)
                try:
                    ipp_kern = Kernel("ipybench", [kdir])
                finally:
                    shutil.rmtree(kdir, ignore_errors=True)
                t, raw, reply = ipp_kern.run(
                    IPP_SETUP.format(profile_dir=cluster.profile_dir, n=engines), timeout=900)
                res["ipcluster_ready_s"] = now() - cluster.t0
                if reply["status"] != "ok":
                    res["ipcluster_log_tail"] = cluster.tail()
                    raise RuntimeError(f"%%px setup failed: {reply.get('ename')}: "
                                       f"{reply.get('evalue')}")
                res["ipp_status"] = "ran"
                res["engines"] = engines
                print(f"  ipcluster: {engines} engines ready after "
                      f"{res['ipcluster_ready_s']:.1f} s", flush=True)
            except Exception as e:
                res["ipp_status"] = f"could not start: {e}"
                print(f"  ipyparallel: {res['ipp_status']}", flush=True)
                if ipp_kern:
                    ipp_kern.close()
                    ipp_kern = None
                if cluster:
                    cluster.stop()
                    cluster = None
    try:
        if args.warmup:
            relay_dk(dk, args.ranks, min(args.lines, 1000), args.keep_logs)
            if ipp_kern:
                relay_ipp(ipp_kern, engines, min(args.lines, 1000), cluster)
            if remote:
                relay_dk(dk, args.ranks, min(args.lines, 1000), args.keep_logs, remote)
        for trial in range(args.relay_trials):
            order = ("dk", "ipp", "remote") if trial % 2 == 0 else ("remote", "ipp", "dk")
            for who in order:
                if who == "ipp" and not ipp_kern or who == "remote" and not remote:
                    continue
                if who == "dk":
                    r = relay_dk(dk, args.ranks, args.lines, args.keep_logs)
                elif who == "remote":
                    r = relay_dk(dk, args.ranks, args.lines, args.keep_logs, remote)
                else:
                    r = relay_ipp(ipp_kern, engines, args.lines, cluster)
                r["load"] = loadavg()
                res[who].append(r)
                extra = (f" (as displays, not stdout: {r['lines_as_display']})"
                         if r.get("lines_as_display") else "")
                print(f"  trial {trial + 1} {who:4} {r['seconds']:7.2f} s "
                      f"{r['mb_per_s']:6.2f} MB/s (first->last output "
                      f"{fmt(r['stream_mb_per_s'])} MB/s; CPU s: kernel {r['kernel_cpu_s']:.1f}"
                      f" ranks {fmt(r.get('ranks_cpu_s', r.get('engines_cpu_s')), 1)})"
                      f"  lines {r['lines_received']}/"
                      f"{r['lines_expected']}{extra} complete={r['complete']} "
                      f"in_order={r['in_order']} reply={r['reply_status']}", flush=True)
    finally:
        if ipp_kern:
            ipp_kern.close()
        if cluster:
            cluster.stop()
    res["load_after"] = loadavg()
    for who in ("dk", "ipp", "remote"):
        runs = res[who]
        res[f"{who}_median_mb_per_s"] = median([r["mb_per_s"] for r in runs])
        res[f"{who}_median_s"] = median([r["seconds"] for r in runs])
        res[f"{who}_median_stream_mb_per_s"] = median(
            [r["stream_mb_per_s"] for r in runs if r["stream_mb_per_s"]])
        res[f"{who}_all_complete_in_order"] = bool(runs) and all(
            r["complete"] and r["in_order"] for r in runs)
    if res["dk_median_mb_per_s"] and res["ipp_median_mb_per_s"]:
        res["ratio"] = res["dk_median_mb_per_s"] / res["ipp_median_mb_per_s"]
        res["target_met"] = res["ratio"] >= 2.0
    if remote and res["remote_median_stream_mb_per_s"] and res["dk_median_stream_mb_per_s"]:
        # First to last output line: the relay itself, without salloc and srun.
        res["remote_vs_local_stream"] = (res["remote_median_stream_mb_per_s"] /
                                         res["dk_median_stream_mb_per_s"])
        res["remote_target_met"] = res["remote_vs_local_stream"] >= 0.8
        print(f"  remote relay (first->last output): {fmt(res['remote_median_stream_mb_per_s'])} "
              f"MB/s vs local {fmt(res['dk_median_stream_mb_per_s'])} MB/s: "
              f"{fmt(res['remote_vs_local_stream'])}x (target >= 0.8x)", flush=True)
    print(f"  median: distkernel {fmt(res['dk_median_mb_per_s'])} MB/s, ipyparallel "
          f"{fmt(res['ipp_median_mb_per_s'])} MB/s, ratio {fmt(res.get('ratio'))}x "
          f"(target >= 2x); ipyparallel: {res['ipp_status']}", flush=True)
    return res


# ---------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prefix", default=os.path.join(os.path.dirname(os.path.dirname(
                    os.path.abspath(__file__))), "prefix"),
                    help="distkernel install; kernelspec read from PREFIX/share/jupyter")
    ap.add_argument("--python", default="/usr/bin/python3",
                    help="interpreter for bare ranks and for ipykernel")
    ap.add_argument("--ranks", type=int, default=8, help="ranks (and ipyparallel engines)")
    ap.add_argument("--engines", type=int, default=0,
                    help="ipyparallel engines if not --ranks (for a small machine)")
    ap.add_argument("--lines", type=int, default=100000, help="lines each rank prints (relay)")
    ap.add_argument("--trials", type=int, default=5, help="fan-out trials each")
    ap.add_argument("--relay-trials", type=int, default=3, help="relay trials each")
    ap.add_argument("--warmup", type=int, default=1, help="untimed warm-up runs each")
    ap.add_argument("--only", choices=("fanout", "relay"), help="run one benchmark only")
    ap.add_argument("--no-ipyparallel", action="store_true", help="relay: distkernel only")
    ap.add_argument("--remote-nodes", type=int, default=0,
                    help="relay: also run the ranks over N Slurm nodes (SLURM_CONF set; "
                         "e.g. the test cluster, tests/slurm/cluster.sh up N)")
    ap.add_argument("--keep-logs", action="store_true",
                    help="keep the rank log folders distkernel writes for each run")
    ap.add_argument("--json", help="write all results to this file")
    args = ap.parse_args()

    kdir = os.path.join(args.prefix, "share", "jupyter", "kernels")
    if not os.path.isfile(os.path.join(kdir, "distkernel", "kernel.json")):
        sys.exit(f"no distkernel kernelspec under {kdir}: install with meson first")
    out = {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "cpus": os.cpu_count(), "load_at_start": loadavg(),
        "config": {k: v for k, v in vars(args).items()},
    }
    print(f"dist_bench: {os.cpu_count()} CPUs, load average {loadavg()}", flush=True)
    dk = Kernel("distkernel", [kdir])
    out["distkernel_start_s"] = dk.start_s
    try:
        if args.only in (None, "fanout"):
            out["fanout"] = bench_fanout(args, dk)
        if args.only in (None, "relay"):
            out["relay"] = bench_relay(args, dk)
    finally:
        dk.close()
        remove_empty_log_parents()
    out["load_at_end"] = loadavg()
    out["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    print(f"load average at end: {out['load_at_end']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"results in {args.json}")


if __name__ == "__main__":
    main()
