#!/usr/bin/python3
"""Latency / startup / memory benchmark: distkernel vs ipykernel (vs xeus-python).

Run with Debian's interpreter (it has pyzmq, jupyter_client, psutil):

    /usr/bin/python3 bench/kernel_bench.py [--prefix ./prefix] [--json out.json]

The measured path uses a lean raw-ZeroMQ client written here (pyzmq only, our
own HMAC-SHA256 signing); jupyter_client is used only to read kernelspec argv.
See bench/README.md for what is measured and how.
"""

import argparse
import atexit
import hashlib
import hmac
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime, timezone

try:
    import zmq
except ImportError:  # pragma: no cover
    sys.exit("pyzmq missing: run this with /usr/bin/python3 (Debian's python3-zmq)")
try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None

DELIM = b"<IDS|MSG>"
PROTOCOL_VERSION = "5.3"
now = time.perf_counter

# Every process we launch, so that nothing is left behind whatever happens.
_LIVE = {}


def _reap_all():
    for proc in list(_LIVE.values()):
        _kill_group(proc)
    _LIVE.clear()


def _kill_group(proc):
    """Kill the process group of a kernel we launched (start_new_session=True)."""
    pgid = proc.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            break
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = now() + 2.0
        while now() < deadline:
            proc.poll()
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.02)
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        pass


atexit.register(_reap_all)


def _on_signal(signum, _frame):
    _reap_all()
    sys.exit(128 + signum)


for _s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_s, _on_signal)


# ---------------------------------------------------------------------------
# statistics helpers


def pct(values, p):
    """Percentile with linear interpolation (p in 0..100)."""
    v = sorted(values)
    if not v:
        return float("nan")
    k = (len(v) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize(values):
    return {
        "n": len(values),
        "median": statistics.median(values) if values else float("nan"),
        "p90": pct(values, 90),
        "p99": pct(values, 99),
        "min": min(values) if values else float("nan"),
        "max": max(values) if values else float("nan"),
        "mean": statistics.fmean(values) if values else float("nan"),
    }


# ---------------------------------------------------------------------------
# kernel discovery


def find_specs(prefix, ipy_python):
    """Return {name: {"argv": [...], "source": str}} for the kernels to compare."""
    os.environ["JUPYTER_PATH"] = os.path.join(prefix, "share", "jupyter") + (
        os.pathsep + os.environ["JUPYTER_PATH"] if os.environ.get("JUPYTER_PATH") else ""
    )
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    specs = {}
    notes = {}

    # distkernel: must come from <prefix>/share/jupyter
    dk_dir = os.path.join(prefix, "share", "jupyter", "kernels", "distkernel")
    try:
        spec = ksm.get_kernel_spec("distkernel")
        specs["distkernel"] = {"argv": list(spec.argv), "source": spec.resource_dir}
        if os.path.realpath(spec.resource_dir) != os.path.realpath(dk_dir):
            notes["distkernel"] = "kernelspec found at %s, not under --prefix" % spec.resource_dir
    except NoSuchKernel:
        sys.exit("distkernel kernelspec not found under %s (is it installed?)" % dk_dir)

    # ipykernel: Debian's python3-ipykernel, run by /usr/bin/python3
    want = [ipy_python, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    try:
        spec = ksm.get_kernel_spec("python3")
        argv = list(spec.argv)
        if argv[:3] != want[:3]:
            notes["ipykernel"] = "kernelspec python3 argv %r replaced by %r" % (argv, want)
            argv = want
        specs["ipykernel"] = {"argv": argv, "source": spec.resource_dir}
    except NoSuchKernel:
        specs["ipykernel"] = {"argv": want, "source": "(built in)"}

    # xeus-python: only if present
    xp = None
    try:
        spec = ksm.get_kernel_spec("xpython")
        xp = {"argv": list(spec.argv), "source": spec.resource_dir}
    except NoSuchKernel:
        exe = shutil.which("xpython")
        if exe:
            xp = {"argv": [exe, "-f", "{connection_file}"], "source": exe}
    if xp:
        specs["xeus-python"] = xp
    else:
        notes["xeus-python"] = "not available (no `xpython` on PATH, no kernelspec `xpython`)"
    return specs, notes


BASELINE = "distkernel-linked"


def baseline_spec(baseline_prefix):
    """The kernelspec of the distkernel installed in BASELINE_PREFIX (an older build, that links libpython)."""
    path = os.path.join(baseline_prefix, "share", "jupyter", "kernels", "distkernel", "kernel.json")
    try:
        with open(path) as f:
            return {"argv": list(json.load(f)["argv"]), "source": os.path.dirname(path)}
    except (OSError, ValueError, KeyError) as e:
        sys.exit("--baseline-prefix: no usable kernelspec at %s (%s)" % (path, e))


def env_specs(prefix, pythons):
    """{"distkernel-pyX.Y": spec} for --prefix's distkernel in each Python environment.

    The argv is what `distkernel install --python EXE` writes, so it is the
    kernel a user of that environment gets.
    """
    specs = {}
    exe = os.path.join(prefix, "bin", "distkernel")
    with tempfile.TemporaryDirectory(prefix="kernel-bench-specs-") as tmp:
        for i, python in enumerate(pythons):
            try:
                version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                         capture_output=True, text=True, check=True).stdout.strip()
            except (OSError, subprocess.CalledProcessError) as e:
                sys.exit("--env-python %s: cannot run it (%s)" % (python, e))
            name = "distkernel-py" + version
            if name in specs:
                name += "-%d" % i
            ks = "bench-env-%d" % i
            done = subprocess.run([exe, "install", "--prefix", tmp, "--name", ks, "--python", python],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                sys.exit("--env-python %s: distkernel install failed:\n%s" % (python, done.stderr or done.stdout))
            with open(os.path.join(tmp, "share", "jupyter", "kernels", ks, "kernel.json")) as f:
                specs[name] = {"argv": list(json.load(f)["argv"]), "source": "distkernel install --python " + python}
    return specs


# ---------------------------------------------------------------------------
# the lean raw-ZeroMQ client


def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Kernel:
    """One launched kernel plus a lean client (DEALER shell/control, SUB iopub)."""

    CHECKED = {}  # kernel name -> messages whose signature was checked
    BAD = {}  # kernel name -> messages with a wrong signature

    def __init__(self, name, argv, ctx, workdir, env):
        self.name = name
        self.ctx = ctx
        self.key = uuid.uuid4().hex.encode()
        self.session = uuid.uuid4().hex
        self._hmac = hmac.new(self.key, digestmod=hashlib.sha256)
        self._counter = 0
        ports = free_ports(5)
        self.conn = {
            "shell_port": ports[0],
            "iopub_port": ports[1],
            "stdin_port": ports[2],
            "control_port": ports[3],
            "hb_port": ports[4],
            "ip": "127.0.0.1",
            "key": self.key.decode(),
            "transport": "tcp",
            "signature_scheme": "hmac-sha256",
            "kernel_name": name,
        }
        fd, self.conn_file = tempfile.mkstemp(prefix="kernel-%s-" % name, suffix=".json", dir=workdir)
        with os.fdopen(fd, "w") as f:
            json.dump(self.conn, f)
        self.argv = [a.replace("{connection_file}", self.conn_file) for a in argv]
        self.env = env
        self.log_path = self.conn_file[:-5] + ".log"
        self.proc = None
        Kernel.CHECKED.setdefault(name, 0)
        Kernel.BAD.setdefault(name, 0)

    # -- wire -------------------------------------------------------------
    def sign(self, parts):
        h = self._hmac.copy()
        for p in parts:
            h.update(p)
        return h.hexdigest().encode()

    def msg(self, msg_type, content_bytes):
        self._counter += 1
        msg_id = "%s_%d" % (self.session, self._counter)
        header = json.dumps(
            {
                "msg_id": msg_id,
                "session": self.session,
                "username": "bench",
                "date": datetime.now(timezone.utc).isoformat(),
                "msg_type": msg_type,
                "version": PROTOCOL_VERSION,
            }
        ).encode()
        parts = [header, b"{}", b"{}", content_bytes]
        return msg_id, [DELIM, self.sign(parts)] + parts

    def verify(self, frames):
        i = frames.index(DELIM)
        ok = hmac.compare_digest(self.sign(frames[i + 2 : i + 6]), frames[i + 1])
        Kernel.CHECKED[self.name] += 1
        if not ok:
            Kernel.BAD[self.name] += 1
        return ok

    @staticmethod
    def parse(frames):
        """-> (msg_type, parent_msg_id, content_bytes) without verifying."""
        i = frames.index(DELIM)
        header = json.loads(frames[i + 2])
        parent = json.loads(frames[i + 3])
        return header.get("msg_type"), parent.get("msg_id"), frames[i + 5]

    # -- lifecycle ----------------------------------------------------------
    def connect(self):
        c = self.conn
        url = "tcp://127.0.0.1:%d"
        self.shell = self.ctx.socket(zmq.DEALER)
        self.shell.linger = 0
        self.shell.connect(url % c["shell_port"])
        self.control = self.ctx.socket(zmq.DEALER)
        self.control.linger = 0
        self.control.connect(url % c["control_port"])
        self.iopub = self.ctx.socket(zmq.SUB)
        self.iopub.linger = 0
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(url % c["iopub_port"])
        self.poller = zmq.Poller()
        self.poller.register(self.shell, zmq.POLLIN)
        self.poller.register(self.iopub, zmq.POLLIN)

    def start(self, timeout=60.0):
        """Launch and wait for ready; returns timings in seconds."""
        self.connect()  # ZMQ connect before bind is fine; keeps client setup off the clock
        log = open(self.log_path, "ab")
        t0 = now()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=self.env,
            cwd=os.path.dirname(self.conn_file),
            start_new_session=True,
        )
        _LIVE[self.proc.pid] = self.proc
        log.close()
        t_popen = now() - t0
        content = b"{}"
        got_reply = got_iopub = None
        last_send = -1.0
        deadline = t0 + timeout
        while got_reply is None or got_iopub is None:
            t = now()
            if t > deadline:
                raise RuntimeError("%s not ready after %.0fs; log:\n%s" % (self.name, timeout, self.log_tail()))
            if self.proc.poll() is not None:
                raise RuntimeError("%s exited with %s during startup; log:\n%s" % (self.name, self.proc.returncode, self.log_tail()))
            if t - last_send >= 0.050:  # like wait_for_ready: keep asking until answered
                self.shell.send_multipart(self.msg("kernel_info_request", content)[1])
                last_send = t
            wait_ms = max(0, int((last_send + 0.050 - now()) * 1000)) + 1
            for sock, _ in self.poller.poll(wait_ms):
                frames = sock.recv_multipart()
                t = now()
                if sock is self.shell:
                    self.verify(frames)
                    mtype, _, _ = self.parse(frames)
                    if mtype == "kernel_info_reply" and got_reply is None:
                        got_reply = t
                else:
                    self.verify(frames)
                    if got_iopub is None:
                        got_iopub = t
        return {
            "ready": max(got_reply, got_iopub) - t0,
            "first_reply": got_reply - t0,
            "first_iopub": got_iopub - t0,
            "popen": t_popen,
        }

    def drain(self, quiet=0.1, limit=2.0):
        """Discard pending messages until nothing arrives for `quiet` seconds."""
        end = now() + limit
        while now() < end:
            ev = self.poller.poll(int(quiet * 1000))
            if not ev:
                return
            for sock, _ in ev:
                while True:
                    try:
                        self.verify(sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break

    EXEC = json.dumps(
        {
            "code": "pass",
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
    ).encode()

    EXEC_NO_HISTORY = json.dumps(
        {
            "code": "pass",
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
    ).encode()

    def execute_rt(self, keep=None, timeout=30.0, msg_type="execute_request", content=None):
        """One execute_request("pass") round trip.

        Returns (t_total, t_reply, t_idle) in seconds from the send to: both
        messages seen, the reply on shell, the status idle on iopub.
        Signatures are checked after the clock stops (frames kept in `keep`).
        Other requests (kernel_info_request) can be timed the same way.
        """
        reply_type = msg_type[: -len("_request")] + "_reply"
        msg_id, frames = self.msg(msg_type, self.EXEC if content is None else content)
        got = []
        t_reply = t_idle = None
        poll = self.poller.poll
        parse = self.parse
        shell = self.shell
        t0 = now()
        shell.send_multipart(frames)
        end = t0 + timeout
        while t_reply is None or t_idle is None:
            ev = poll(1000)
            if not ev and now() > end:
                raise RuntimeError("%s: no execute_reply/idle in %.0fs" % (self.name, timeout))
            for sock, _ in ev:
                fr = sock.recv_multipart()
                t = now()
                got.append(fr)
                mtype, parent, content = parse(fr)
                if parent != msg_id:
                    continue
                if sock is shell:
                    if mtype == reply_type:
                        t_reply = t
                elif mtype == "status" and b"idle" in content and json.loads(content).get("execution_state") == "idle":
                    t_idle = t
        t_end = max(t_reply, t_idle)
        if keep is not None:
            keep.extend(got)
        return t_end - t0, t_reply - t0, t_idle - t0

    SLEEP = json.dumps(
        {
            "code": "import time\ntime.sleep(100)",
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        }
    ).encode()

    def interrupt_rt(self, settle=0.3, timeout=30.0):
        """A cell in time.sleep(100), then interrupt_request on control.

        Returns (t_total, t_reply) in seconds from the interrupt to: the
        execute_reply and status idle, the execute_reply alone. The interrupt
        is sent SETTLE s after execute_input, as a user would press the button.
        """
        msg_id, frames = self.msg("execute_request", self.SLEEP)
        self.shell.send_multipart(frames)
        end = now() + timeout
        started = False
        while not started:
            if now() > end:
                raise RuntimeError("%s: the sleeping cell never started" % self.name)
            for sock, _ in self.poller.poll(1000):
                fr = sock.recv_multipart()
                mtype, parent, _ = self.parse(fr)
                started = started or (sock is self.iopub and parent == msg_id and mtype == "execute_input")
        time.sleep(settle)
        _, frames = self.msg("interrupt_request", b"{}")
        t0 = now()
        self.control.send_multipart(frames)
        t_reply = t_idle = None
        end = t0 + timeout
        while t_reply is None or t_idle is None:
            ev = self.poller.poll(1000)
            if not ev and now() > end:
                raise RuntimeError("%s: no reply within %.0fs of the interrupt" % (self.name, timeout))
            for sock, _ in ev:
                fr = sock.recv_multipart()
                t = now()
                mtype, parent, content = self.parse(fr)
                if parent != msg_id:
                    continue
                if sock is self.shell and mtype == "execute_reply":
                    if json.loads(content).get("ename") != "KeyboardInterrupt":
                        raise RuntimeError("%s: the interrupted cell ended with %s" % (self.name, content[:200]))
                    t_reply = t
                elif mtype == "status" and json.loads(content).get("execution_state") == "idle":
                    t_idle = t
        while self.control.poll(0):
            self.control.recv_multipart()  # the interrupt_reply
        return max(t_reply, t_idle) - t0, t_reply - t0

    def memory(self):
        if psutil is None:
            return None
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return None
        rss = uss = pss = 0
        uss_ok = True
        for p in procs:
            try:
                full = p.memory_full_info()
                rss += full.rss
                uss += full.uss
                pss += getattr(full, "pss", 0)
            except psutil.AccessDenied:
                uss_ok = False
                rss += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return {
            "rss": rss,
            "uss": uss if uss_ok else None,
            "pss": pss if uss_ok else None,
            "processes": len(procs),
            "threads": sum(p.num_threads() for p in procs if p.is_running()),
        }

    def shutdown(self, timeout=5.0):
        """shutdown_request on control, wait for exit, then kill. Returns info."""
        info = {"clean": False, "reply": False}
        t0 = now()
        if self.proc is not None and self.proc.poll() is None:
            msg_id, frames = self.msg("shutdown_request", b'{"restart": false}')
            self.control.send_multipart(frames)
            if self.control.poll(int(timeout * 1000)):
                fr = self.control.recv_multipart()
                self.verify(fr)
                mtype, parent, _ = self.parse(fr)
                info["reply"] = mtype == "shutdown_reply" and parent == msg_id
            try:
                self.proc.wait(timeout=max(0.1, timeout - (now() - t0)))
                info["clean"] = True
            except subprocess.TimeoutExpired:
                pass
        info["seconds"] = now() - t0
        if self.proc is not None:
            _kill_group(self.proc)  # also catches any stray children
            info["returncode"] = self.proc.returncode
            _LIVE.pop(self.proc.pid, None)
        for s in ("shell", "control", "iopub"):
            sock = getattr(self, s, None)
            if sock is not None:
                sock.close(linger=0)
        return info

    def log_tail(self, n=2000):
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""


# ---------------------------------------------------------------------------
# driver


def fmt_ms(s):
    return "%.3f" % (s * 1e3)


def fmt_mib(b):
    return "-" if b is None else "%.1f" % (b / 2**20)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", default=os.path.join(os.path.dirname(os.path.dirname(
                    os.path.abspath(__file__))), "prefix"), help="distkernel install prefix (default %(default)s)")
    ap.add_argument("--ipykernel-python", default="/usr/bin/python3", help="interpreter for ipykernel (default %(default)s)")
    ap.add_argument("-n", "--samples", type=int, default=1000, help="round-trip samples per kernel (default %(default)s)")
    ap.add_argument("--warmup", type=int, default=50, help="warm-up round trips per kernel (default %(default)s)")
    ap.add_argument("--diag-samples", type=int, default=200,
                    help="samples per kernel for the secondary diagnostics, 0 to skip (default %(default)s)")
    ap.add_argument("--block", type=int, default=50, help="samples per interleaved block (default %(default)s)")
    ap.add_argument("-k", "--starts", type=int, default=5, help="start-to-ready trials per kernel (default %(default)s)")
    ap.add_argument("--interrupts", type=int, default=20,
                    help="interrupt trials per kernel (a cell in time.sleep, then interrupt_request), 0 to skip (default %(default)s)")
    ap.add_argument("--idle", type=float, default=1.0, help="idle seconds before the memory reading (default %(default)s)")
    ap.add_argument("--kernels", default=None, help="comma list to restrict: distkernel,ipykernel,xeus-python "
                         "(none: only those of --baseline-prefix and --env-python)")
    ap.add_argument("--baseline-prefix", default=None,
                    help="also run the distkernel installed here (an older build that links libpython) as %s, "
                         "and report every distkernel against it" % BASELINE)
    ap.add_argument("--env-python", action="append", default=[], metavar="EXE",
                    help="also run --prefix's distkernel in this Python environment, as distkernel-pyX.Y "
                         "(argv from `distkernel install --python EXE`); repeatable")
    ap.add_argument("--json", default=None, help="write results as JSON to this path")
    args = ap.parse_args()

    for p in [args.prefix] + ([args.baseline_prefix] if args.baseline_prefix else []):
        if not os.path.exists(os.path.join(p, "bin", "distkernel")):
            sys.exit("distkernel not installed at %s (bin/distkernel missing)" % p)

    # jupyter_client imports ipykernel (and so debugpy) to resolve "python3";
    # keep debugpy's frozen-modules warning off our console, not the kernels' env.
    had = os.environ.get("PYDEVD_DISABLE_FILE_VALIDATION")
    os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    try:
        specs, notes = find_specs(args.prefix, args.ipykernel_python)
    finally:
        if had is None:
            os.environ.pop("PYDEVD_DISABLE_FILE_VALIDATION", None)
        else:
            os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = had
    if args.kernels:
        wanted = [k.strip() for k in args.kernels.split(",")]
        specs = {k: v for k, v in specs.items() if k in wanted}
    # the kernels asked for by --baseline-prefix and --env-python are run whatever --kernels says
    extra = env_specs(args.prefix, args.env_python)
    if args.baseline_prefix:
        specs[BASELINE] = baseline_spec(args.baseline_prefix)
    names = [n for n in (BASELINE, "distkernel") if n in specs] + list(extra)
    names += [n for n in ("ipykernel", "xeus-python") if n in specs]
    specs.update(extra)
    w = max([12] + [len(n) for n in names])  # width of the kernel column
    env = dict(os.environ)
    ctx = zmq.Context()
    workdir = tempfile.mkdtemp(prefix="kernel-bench-")
    t_run = now()

    print("kernel benchmark: %s" % ", ".join(names))
    for n in names:
        print("  %-*s %s" % (w, n, " ".join(specs[n]["argv"])))
    for n, note in notes.items():
        print("  note %-7s %s" % (n + ":", note))
    sys.stdout.flush()

    results = {n: {"argv": specs[n]["argv"], "spec": specs[n]["source"]} for n in names}
    try:
        # (1) start to ready, fresh process each time, interleaved; order rotates per round
        starts = {n: [] for n in names}
        shutdowns = {n: [] for n in names}
        for k in range(args.starts):
            order = names[k % len(names):] + names[: k % len(names)]
            for n in order:
                kern = Kernel(n, specs[n]["argv"], ctx, workdir, env)
                try:
                    starts[n].append(kern.start())
                finally:
                    shutdowns[n].append(kern.shutdown())
        print("start-to-ready: %d trials per kernel done (%.1fs)" % (args.starts, now() - t_run))
        sys.stdout.flush()

        # (2) round trips: all kernels alive, warm up, then interleaved blocks
        live = {}
        for n in names:
            live[n] = Kernel(n, specs[n]["argv"], ctx, workdir, env)
            live[n].start()
            live[n].drain()
        keep = {n: [] for n in names}
        for n in names:
            for _ in range(args.warmup):
                live[n].execute_rt(keep=keep[n])
            live[n].drain()

        # (3) idle memory after warm-up, every kernel idle for --idle seconds
        time.sleep(args.idle)
        mem = {n: live[n].memory() for n in names}

        rts = {n: [] for n in names}
        rep = {n: [] for n in names}
        idl = {n: [] for n in names}
        blocks = (args.samples + args.block - 1) // args.block
        for b in range(blocks):
            order = names[b % len(names):] + names[: b % len(names)]
            for n in order:
                todo = min(args.block, args.samples - len(rts[n]))
                kern = live[n]
                for _ in range(todo):
                    t, r, i = kern.execute_rt(keep=keep[n])
                    rts[n].append(t)
                    rep[n].append(r)
                    idl[n].append(i)
        # diagnostics (secondary, fewer samples, same interleaving): a request that
        # runs no code, and the same "pass" with store_history=False
        diag_kinds = {
            "kernel_info": {"msg_type": "kernel_info_request", "content": b"{}"},
            "pass_no_history": {"content": Kernel.EXEC_NO_HISTORY},
        }
        diag = {d: {n: [] for n in names} for d in diag_kinds}
        n_diag = args.diag_samples
        for b in range((n_diag + args.block - 1) // args.block if n_diag else 0):
            order = names[b % len(names):] + names[: b % len(names)]
            for d, kw in diag_kinds.items():
                for n in order:
                    todo = min(args.block, n_diag - len(diag[d][n]))
                    for _ in range(todo):
                        diag[d][n].append(live[n].execute_rt(keep=keep[n], **kw)[0])
        # interrupt latency: interleaved one trial at a time
        ints = {n: [] for n in names}
        for k in range(args.interrupts):
            order = names[k % len(names):] + names[: k % len(names)]
            for n in order:
                ints[n].append(live[n].interrupt_rt())
                live[n].drain()
        mem_after = {n: live[n].memory() for n in names}
        for n in names:
            for fr in keep[n]:
                live[n].verify(fr)
            keep[n] = None
        final_shutdown = {n: live[n].shutdown() for n in names}
        live = {}
    finally:
        _reap_all()
        ctx.destroy(linger=0)
        shutil.rmtree(workdir, ignore_errors=True)

    # ------------------------------------------------------------------ report
    for n in names:
        r = results[n]
        r["start_to_ready_s"] = summarize([s["ready"] for s in starts[n]])
        r["start_to_ready_s"]["trials"] = [s["ready"] for s in starts[n]]
        r["start_first_reply_s"] = summarize([s["first_reply"] for s in starts[n]])
        r["start_first_iopub_s"] = summarize([s["first_iopub"] for s in starts[n]])
        r["round_trip_s"] = summarize(rts[n])
        r["round_trip_reply_s"] = summarize(rep[n])
        r["round_trip_idle_s"] = summarize(idl[n])
        r["diagnostics_round_trip_s"] = {d: summarize(diag[d][n]) for d in diag if diag[d][n]}
        if ints[n]:
            r["interrupt_s"] = summarize([t for t, _ in ints[n]])
            r["interrupt_reply_s"] = summarize([t for _, t in ints[n]])
        r["idle_memory"] = mem[n]
        r["memory_after_samples"] = mem_after[n]
        r["shutdowns"] = shutdowns[n] + [final_shutdown[n]]
        r["signatures_checked"] = Kernel.CHECKED.get(n, 0)
        r["bad_signatures"] = Kernel.BAD.get(n, 0)

    print()
    hdr = "%-*s %9s %9s %9s %9s %9s | %9s %9s | %9s %9s" % (
        w, "kernel", "rt med", "rt p90", "rt p99", "reply med", "idle med", "start med", "start min", "RSS MiB", "USS MiB")
    print("round trip = execute_request('pass') -> execute_reply + status idle (ms); start = Popen -> kernel_info_reply + iopub (ms)")
    print(hdr)
    print("-" * len(hdr))
    for n in names:
        r = results[n]
        rt, st = r["round_trip_s"], r["start_to_ready_s"]
        m = r["idle_memory"] or {}
        print("%-*s %9s %9s %9s %9s %9s | %9s %9s | %9s %9s" % (
            w, n, fmt_ms(rt["median"]), fmt_ms(rt["p90"]), fmt_ms(rt["p99"]),
            fmt_ms(r["round_trip_reply_s"]["median"]), fmt_ms(r["round_trip_idle_s"]["median"]),
            fmt_ms(st["median"]), fmt_ms(st["min"]), fmt_mib(m.get("rss")), fmt_mib(m.get("uss"))))
    if "xeus-python" not in names:
        print("%-*s not available" % (w, "xeus-python"))
    if args.diag_samples:
        print("\ndiagnostics, reply + idle median (p90) ms, %d samples each:" % args.diag_samples)
        print("%-*s %20s %20s %20s" % (w, "kernel", "kernel_info", "pass, no history", "pass (as above)"))
        for n in names:
            dd = results[n]["diagnostics_round_trip_s"]
            cell = lambda x: "%s (%s)" % (fmt_ms(x["median"]), fmt_ms(x["p90"]))
            print("%-*s %20s %20s %20s" % (w, n, cell(dd["kernel_info"]), cell(dd["pass_no_history"]),
                                            cell(results[n]["round_trip_s"])))

    if args.interrupts:
        print("\ninterrupt = interrupt_request on control -> the sleeping cell's execute_reply"
              " (KeyboardInterrupt) + idle, %d trials (ms):" % args.interrupts)
        print("%-*s %9s %9s %9s" % (w, "kernel", "median", "p90", "max"))
        for n in names:
            x = results[n]["interrupt_s"]
            print("%-*s %9s %9s %9s" % (w, n, fmt_ms(x["median"]), fmt_ms(x["p90"]), fmt_ms(x["max"])))

    ratios = {}
    targets = {}
    if "distkernel" in names and "ipykernel" in names:
        d, i = results["distkernel"], results["ipykernel"]
        ratios = {
            "round_trip_median": d["round_trip_s"]["median"] / i["round_trip_s"]["median"],
            "round_trip_p90": d["round_trip_s"]["p90"] / i["round_trip_s"]["p90"],
            "round_trip_p99": d["round_trip_s"]["p99"] / i["round_trip_s"]["p99"],
            "start_to_ready_median": d["start_to_ready_s"]["median"] / i["start_to_ready_s"]["median"],
        }
        if "interrupt_s" in d and "interrupt_s" in i:
            ratios["interrupt_median"] = d["interrupt_s"]["median"] / i["interrupt_s"]["median"]
            targets["interrupt max < 1 s"] = d["interrupt_s"]["max"] < 1.0
        dm, im = d["idle_memory"] or {}, i["idle_memory"] or {}
        if dm.get("rss") and im.get("rss"):
            ratios["idle_rss"] = dm["rss"] / im["rss"]
        if dm.get("uss") and im.get("uss"):
            ratios["idle_uss"] = dm["uss"] / im["uss"]
        targets["round_trip_median <= 0.25x ipykernel"] = ratios["round_trip_median"] <= 0.25
        targets["start_to_ready_median <= 0.5x ipykernel"] = ratios["start_to_ready_median"] <= 0.5
        if "idle_rss" in ratios:
            targets["idle_rss <= ipykernel"] = ratios["idle_rss"] <= 1.0
        if "xeus-python" in names:
            x = results["xeus-python"]
            ratios["round_trip_median_vs_xeus"] = d["round_trip_s"]["median"] / x["round_trip_s"]["median"]
            targets["round_trip_median < xeus-python"] = ratios["round_trip_median_vs_xeus"] < 1.0
        else:
            targets["round_trip_median < xeus-python"] = "xeus-python not available"

        print()
        print("distkernel / ipykernel:")
        for key, v in ratios.items():
            print("  %-28s %.3f" % (key, v))
        print("targets:")
        for key, v in targets.items():
            print("  %-42s %s" % (key, v if isinstance(v, str) else ("PASS" if v else "FAIL")))

    # every other distkernel against the linked build, measured side by side in this run
    linked = {}
    goal = "round trip and start medians <= 1.10x " + BASELINE
    if BASELINE in names:
        b = results[BASELINE]
        for n in names:
            if n == BASELINE or not n.startswith("distkernel"):
                continue
            r = results[n]
            q = linked[n] = {
                "round_trip_median": r["round_trip_s"]["median"] / b["round_trip_s"]["median"],
                "round_trip_p90": r["round_trip_s"]["p90"] / b["round_trip_s"]["p90"],
                "round_trip_p99": r["round_trip_s"]["p99"] / b["round_trip_s"]["p99"],
                "start_to_ready_median": r["start_to_ready_s"]["median"] / b["start_to_ready_s"]["median"],
            }
            rm, bm = r["idle_memory"] or {}, b["idle_memory"] or {}
            for m in ("rss", "uss"):
                if rm.get(m) and bm.get(m):
                    q["idle_" + m] = rm[m] / bm[m]
            targets[n + " " + goal] = (
                q["round_trip_median"] <= 1.10 and q["start_to_ready_median"] <= 1.10)
        if linked:
            print("\n<kernel> / %s (same run); target: round-trip and start-to-ready medians at most 1.10x:" % BASELINE)
            print("%-*s %9s %9s %9s %9s %9s %9s  %s" % (
                w, "kernel", "rt med", "rt p90", "rt p99", "start med", "RSS", "USS", "target"))
            for n, q in linked.items():
                ok = targets[n + " " + goal]
                print("%-*s %9.3f %9.3f %9.3f %9.3f %9s %9s  %s" % (
                    w, n, q["round_trip_median"], q["round_trip_p90"], q["round_trip_p99"],
                    q["start_to_ready_median"], "%.3f" % q["idle_rss"] if "idle_rss" in q else "-",
                    "%.3f" % q["idle_uss"] if "idle_uss" in q else "-", "PASS" if ok else "FAIL"))

    bad = {n: results[n]["bad_signatures"] for n in names if results[n]["bad_signatures"]}
    if bad:
        print("\nWARNING: messages with bad signatures: %s" % bad)
    unclean = [(n, s) for n in names for s in results[n]["shutdowns"] if not s["clean"]]
    if unclean:
        print("\nnote: %d shutdown(s) needed a kill: %s" % (len(unclean), ", ".join(n for n, _ in unclean)))
    print("\ntotal %.1fs" % (now() - t_run))

    if args.json:
        out = {
            "benchmark": "kernel_bench",
            "when": datetime.now(timezone.utc).isoformat(),
            "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": sys.version.split()[0],
                     "pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()},
            "config": {"samples": args.samples, "warmup": args.warmup, "block": args.block,
                       "diag_samples": args.diag_samples,
                       "starts": args.starts, "interrupts": args.interrupts, "idle_s": args.idle, "prefix": args.prefix,
                       "baseline_prefix": args.baseline_prefix, "env_pythons": args.env_python,
                       "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
                       "ipython_dir": os.environ.get("IPYTHONDIR") or os.path.expanduser("~/.ipython")},
            "notes": notes,
            "kernels": results,
            "ratios_distkernel_over_ipykernel": ratios,
            "ratios_over_distkernel_linked": linked,
            "targets": targets,
            "units": {"times": "seconds", "memory": "bytes"},
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print("wrote %s" % args.json)


if __name__ == "__main__":
    main()
