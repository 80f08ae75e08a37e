"""
What the end-to-end tests share: a started kernel with a client that sorts what it
receives by request, and a bare ZeroMQ socket that signs (or mis-signs) by hand.

jupyter_client's BlockingKernelClient hands back messages in arrival order, whatever
request they answer. Tests that have two requests in flight (stop_on_error, comms,
interrupts) need them by parent instead, so `Kernel` pumps the client's queues into
per-parent buffers and stamps each message with the time it arrived, which is how the
output tests tell "flushed while the cell ran" from "flushed at the end".

`RawChannel` exists for the abuse tests: jupyter_client refuses to send a badly signed
or malformed message, so those frames are built and signed here with hmac/hashlib.

Set DISTKERNEL_E2E_KERNEL=python3 to run the suite against ipykernel, which is how the
tests themselves were checked; the default, and what CI runs, is distkernel.
"""
import datetime
import hashlib
import hmac
import json
import os
import sys
import pathlib
import queue
import struct
import time
import uuid
import zlib

import zmq
from jupyter_client import KernelManager

KERNEL_NAME = os.environ.get("DISTKERNEL_E2E_KERNEL", "distkernel")
REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
# The build's install, ./prefix of this checkout unless told (scripts/build.sh's).
PREFIX = pathlib.Path(os.environ.get("DISTKERNEL_PREFIX", REPO_ROOT / "prefix")).resolve()
JUPYTER_DATA = PREFIX / "share" / "jupyter"
KERNELSPEC_DIR = JUPYTER_DATA / "kernels" / "distkernel"
PYTHON = "/usr/bin/python3"  # Debian's, which has the Jupyter stack
# The shared libpython of Debian's Python, which a kernel installed for it loads.
LIBPYTHON = "/usr/lib/x86_64-linux-gnu/libpython%d.%d.so.1.0" % sys.version_info[:2]
DELIM = b"<IDS|MSG>"


class NoReply(AssertionError):
    """The kernel did not answer in time."""


class Execution:
    """One execute_request: its shell reply and every iopub message it caused,
    from status busy to status idle, each stamped with `received_at`."""

    def __init__(self, msg_id, sent_at, reply, messages):
        self.msg_id = msg_id
        self.sent_at = sent_at
        self.reply = reply
        self.messages = messages

    @property
    def content(self):
        return self.reply["content"]

    @property
    def status(self):
        return self.reply["content"]["status"]

    @property
    def outputs(self):
        """iopub messages other than status and execute_input."""
        return [m for m in self.messages if m["msg_type"] not in ("status", "execute_input")]

    def of_type(self, *msg_types):
        return [m for m in self.messages if m["msg_type"] in msg_types]

    def streams(self, name):
        return [m for m in self.of_type("stream") if m["content"]["name"] == name]

    @property
    def stdout(self):
        return "".join(m["content"]["text"] for m in self.streams("stdout"))

    @property
    def stderr(self):
        return "".join(m["content"]["text"] for m in self.streams("stderr"))

    @property
    def result(self):
        """The text/plain of the execute_result, or None if there was none."""
        results = self.of_type("execute_result")
        return results[-1]["content"]["data"].get("text/plain") if results else None

    def describe(self):
        lines = [f"reply: {self.content}"]
        for m in self.messages:
            lines.append(f"  iopub {m['msg_type']}: {str(m['content'])[:300]}")
        return "\n".join(lines)


class Kernel:
    """A started kernel (KernelManager `km`) and a BlockingKernelClient `kc` on it."""

    def __init__(self, km, kc):
        self.km = km
        self.kc = kc
        self._iopub = {}  # parent msg_id -> [msg, ...] in arrival order
        self._replies = {}  # (channel, parent msg_id) -> msg

    @classmethod
    def start(cls, kernel_name=KERNEL_NAME, ready_timeout=30, **launch):
        """Start a kernel; LAUNCH goes to KernelManager.start_kernel (e.g. stderr=file)."""
        return cls.launch(KernelManager(kernel_name=kernel_name), ready_timeout, **launch)

    @classmethod
    def launch(cls, km, ready_timeout=30, **launch):
        """Start KM's kernel with LAUNCH and wait until it answers; a kernel
        that does not is shut down before the error is raised."""
        km.start_kernel(**launch)
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=ready_timeout)
        except Exception:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        return cls(km, kc)

    def stop(self):
        self.kc.stop_channels()
        try:
            if self.km.has_kernel:
                self.km.shutdown_kernel(now=False)
        except Exception:
            self.km.shutdown_kernel(now=True)

    @property
    def pid(self):
        return self.km.provisioner.process.pid

    @property
    def process(self):
        """The subprocess.Popen of the kernel."""
        return self.km.provisioner.process

    def connection_info(self):
        return self.km.get_connection_info(session=False)

    # -- sending -------------------------------------------------------------
    def send(self, msg_type, content=None, channel="shell", metadata=None):
        """Send a request on shell or control; returns its msg_id."""
        chan = {"shell": self.kc.shell_channel, "control": self.kc.control_channel}[channel]
        msg = self.kc.session.msg(msg_type, content if content is not None else {}, metadata=metadata)
        chan.send(msg)
        return msg["header"]["msg_id"]

    def start_execute(self, code, **kw):
        """Send an execute_request without waiting; returns its msg_id."""
        return self.kc.execute(code, **kw)

    def execute(self, code, timeout=30, **kw):
        """Execute CODE and return the Execution once the kernel is idle again."""
        sent_at = time.monotonic()
        msg_id = self.kc.execute(code, **kw)
        return self.finish(msg_id, timeout=timeout, sent_at=sent_at)

    def finish(self, msg_id, timeout=30, sent_at=None, reply=None):
        """Wait for the reply (unless already given as REPLY) and the idle of MSG_ID."""
        reply = reply or self.reply(msg_id, timeout=timeout)
        messages = self.iopub_until_idle(msg_id, timeout=timeout)
        return Execution(msg_id, sent_at, reply, messages)

    # -- receiving -----------------------------------------------------------
    def _get(self, channel, timeout):
        getter = {
            "shell": self.kc.get_shell_msg,
            "control": self.kc.get_control_msg,
            "iopub": self.kc.get_iopub_msg,
            "stdin": self.kc.get_stdin_msg,
        }[channel]
        msg = getter(timeout=max(timeout, 0))
        msg["received_at"] = time.monotonic()
        return msg

    def reply(self, msg_id, channel="shell", timeout=30):
        """The reply to MSG_ID on CHANNEL; replies to other requests are kept for later.
        iopub is pumped meanwhile, so iopub arrival times stay accurate."""
        key = (channel, msg_id)
        deadline = time.monotonic() + timeout
        while not self.replied(msg_id, channel):
            if time.monotonic() >= deadline:
                raise NoReply(f"no {channel} reply to {msg_id} within {timeout} s")
            self.pump_iopub(min(0.005, max(deadline - time.monotonic(), 0)))
        return self._replies.pop(key)

    def replied(self, msg_id, channel="shell"):
        """Whether the reply to MSG_ID has arrived already (does not wait)."""
        while True:
            try:
                msg = self._get(channel, 0)
            except queue.Empty:
                break
            self._replies[(channel, msg["parent_header"].get("msg_id"))] = msg
        return (channel, msg_id) in self._replies

    def pump_iopub(self, timeout):
        """Receive one iopub message into the buffers; False if none came in TIMEOUT s."""
        try:
            msg = self._get("iopub", timeout)
        except queue.Empty:
            return False
        self._iopub.setdefault(msg["parent_header"].get("msg_id"), []).append(msg)
        return True

    def iopub_for(self, msg_id):
        """The iopub messages received so far whose parent is MSG_ID (a live list)."""
        return self._iopub.setdefault(msg_id, [])

    def iopub_until_idle(self, msg_id, timeout=30):
        """Every iopub message with parent MSG_ID up to and including status idle."""
        deadline = time.monotonic() + timeout
        msgs = self.iopub_for(msg_id)
        while not any(_is_idle(m) for m in msgs):
            if not self.pump_iopub(deadline - time.monotonic()) and time.monotonic() >= deadline:
                got = [m["msg_type"] for m in msgs]
                raise NoReply(f"no status idle for {msg_id} within {timeout} s; got {got}")
        end = next(i for i, m in enumerate(msgs) if _is_idle(m))
        return list(msgs[: end + 1])

    def wait_iopub(self, predicate, timeout=10):
        """The first iopub message (of any parent) for which PREDICATE holds."""
        deadline = time.monotonic() + timeout
        while True:
            for msgs in self._iopub.values():
                for m in msgs:
                    if predicate(m):
                        return m
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoReply(f"no matching iopub message within {timeout} s")
            self.pump_iopub(remaining)

    def wait_iopub_type(self, msg_id, msg_type, timeout=10):
        return self.wait_iopub(
            lambda m: m["msg_type"] == msg_type and m["parent_header"].get("msg_id") == msg_id,
            timeout,
        )

    def wait_running(self, msg_id, settle=0.3, timeout=10):
        """Block until the cell of MSG_ID has started (execute_input seen), then SETTLE s."""
        self.wait_iopub_type(msg_id, "execute_input", timeout)
        time.sleep(settle)

    def stdin_request(self, timeout=10):
        """The next message on stdin (an input_request), pumping iopub meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._get("stdin", 0)
            except queue.Empty:
                pass
            if time.monotonic() >= deadline:
                raise NoReply(f"no input_request on stdin within {timeout} s")
            self.pump_iopub(0.005)

    def restart_now(self):
        """Last resort after a failed test left a cell running: kill and restart."""
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=30)


def _is_idle(msg):
    return msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"


# -- raw frames -----------------------------------------------------------------


def endpoint(conn, channel):
    port = conn[f"{channel}_port"]
    if conn["transport"] == "ipc":
        return f"ipc://{conn['ip']}-{port}"
    return f"{conn['transport']}://{conn['ip']}:{port}"


def sign(key, parts):
    """Hex HMAC-SHA256 of PARTS (the four JSON frames), as the spec defines it."""
    if not key:
        return b""
    mac = hmac.new(key, digestmod=hashlib.sha256)
    for p in parts:
        mac.update(p)
    return mac.hexdigest().encode()


def jbytes(obj):
    return json.dumps(obj).encode()


def new_header(msg_type, session):
    return {
        "msg_id": uuid.uuid4().hex,
        "username": "e2e",
        "session": session,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "msg_type": msg_type,
        "version": "5.3",
    }


class RawChannel:
    """A bare DEALER socket on the kernel's shell or control ROUTER."""

    def __init__(self, conn, channel):
        key = conn["key"]
        self.key = key.encode() if isinstance(key, str) else key
        self.session = uuid.uuid4().hex
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint(conn, channel))

    def close(self):
        self.sock.close(0)
        self.ctx.term()

    def frames(self, msg_type, content=None, header=None):
        """A correctly signed message as a list of frames; returns (msg_id, frames)."""
        header = header or new_header(msg_type, self.session)
        parts = [jbytes(header), b"{}", b"{}", jbytes(content if content is not None else {})]
        return header["msg_id"], [DELIM, sign(self.key, parts)] + parts

    def send_frames(self, frames):
        self.sock.send_multipart(frames)

    def request(self, msg_type, content=None):
        msg_id, frames = self.frames(msg_type, content)
        self.send_frames(frames)
        return msg_id

    def recv(self, timeout):
        """The next multipart message, or None if nothing came within TIMEOUT s."""
        if self.sock.poll(int(timeout * 1000), zmq.POLLIN):
            return self.sock.recv_multipart()
        return None

    def parse(self, frames):
        """Split, verify and decode a message the kernel sent."""
        i = frames.index(DELIM)
        sig, parts = frames[i + 1], frames[i + 2 : i + 6]
        assert hmac.compare_digest(sig, sign(self.key, parts)), "kernel's signature is wrong"
        header, parent, metadata, content = (json.loads(p) for p in parts)
        return {"header": header, "parent_header": parent, "metadata": metadata,
                "content": content, "msg_type": header["msg_type"]}

    def reply_to(self, msg_id, timeout=10):
        """The reply whose parent is MSG_ID; anything else received first is an error."""
        frames = self.recv(timeout)
        if frames is None:
            raise NoReply(f"no reply to {msg_id} within {timeout} s")
        msg = self.parse(frames)
        assert msg["parent_header"].get("msg_id") == msg_id, (
            f"expected the reply to {msg_id}, got {msg['msg_type']} for "
            f"{msg['parent_header'].get('msg_id')}: {msg['content']}")
        return msg


def parse_any(frames, key):
    """Decode a signed message from raw frames (iopub: topic frames come first)."""
    i = frames.index(DELIM)
    parts = frames[i + 2 : i + 6]
    assert hmac.compare_digest(frames[i + 1], sign(key, parts)), "kernel's signature is wrong"
    header, parent, metadata, content = (json.loads(p) for p in parts)
    return {"header": header, "parent_header": parent, "metadata": metadata,
            "content": content, "msg_type": header["msg_type"]}


def tiny_png(width=2, height=2, rgb=(200, 30, 30)):
    """A valid PNG image, built from bytes so the tests need no image library."""

    def chunk(tag, data):
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


# -- distributed runs ------------------------------------------------------------
#
# Helpers for the %%distributed / @distributed tests: rank processes are found as
# descendants of the kernel (psutil) or, once the kernel is gone, by the
# TORCHELASTIC_RUN_ID in their environment (/proc/PID/environ).

import re as _re  # noqa: E402
import threading as _threading  # noqa: E402

RANK_LINE = _re.compile(r"^\[rank (\d+)\] ?(.*)$")


def rank_lines(text):
    """{rank: [line, ...]} of the "[rank N] ..." lines of TEXT, label removed."""
    out = {}
    for line in text.splitlines():
        m = RANK_LINE.match(line)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def status_displays(execution):
    """The display_data/update_display_data messages of the run's status line."""
    return [m for m in execution.of_type("display_data", "update_display_data")
            if m["content"]["data"].get("text/plain", "").startswith("distributed:")]


def log_dir(execution):
    """The log directory the status display of EXECUTION names, or None."""
    for m in status_displays(execution):
        found = _re.search(r"logs: (\S+)", m["content"]["data"]["text/plain"])
        if found:
            return pathlib.Path(found.group(1))
    return None


def descendants(pid, template=False, tidy=False):
    """Every living-or-zombie descendant of PID (psutil.Process objects). The
    kernel's warm-start template, a child that stays between runs by design
    (tests/e2e/test_warm.py), is left out unless TEMPLATE; the ranks it forked
    are not. So is the kernel's folder watcher, which lives as long as the
    kernel (tidy_of), unless TIDY."""
    import psutil
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in procs
            if (tidy or not is_tidy_of(p, pid)) and (template or not is_template_of(p, pid))]


TIDY = "distkernel-tidy"


def is_tidy_of(proc, pid):
    """Whether PROC is the folder watcher of the process PID: its child named
    distkernel-tidy (runtime/logs/dk_tidy.h), which removes PID's temporary
    folders when PID ends, however it ends."""
    import psutil
    try:
        return proc.ppid() == pid and proc.name() == TIDY
    except psutil.Error:
        return False


def tidy_of(pid):
    """The pid of PID's folder watcher, or None when it has none."""
    import psutil
    try:
        procs = psutil.Process(pid).children()
    except psutil.NoSuchProcess:
        return None
    return next((p.pid for p in procs if is_tidy_of(p, pid)), None)


def is_template_of(proc, pid):
    """Whether PROC is the warm-start template of the kernel PID: its child
    started with DISTKERNEL_TEMPLATE (a rank it forked is its child, not the
    kernel's, though /proc shows it the same starting environment)."""
    import psutil
    try:
        return proc.ppid() == pid and "DISTKERNEL_TEMPLATE" in proc.environ()
    except psutil.Error:
        return False


def describe_processes(procs):
    import psutil
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(f"{p.pid} (gone)")
    return out


def wait_no_descendants(pid, timeout=5.0):
    """Wait until PID has no descendant at all (a zombie counts); returns what is
    left after TIMEOUT s, as text lines ([] when none)."""
    deadline = time.monotonic() + timeout
    while True:
        left = descendants(pid)
        if not left or time.monotonic() >= deadline:
            return describe_processes(left)
        time.sleep(0.05)


def processes_with_env(name, value):
    """PIDs of living processes whose environment has NAME=VALUE (zombies have
    none, so they are not counted)."""
    return processes_with_any_env({name: [value]})


def processes_with_any_env(wanted):
    """PIDs of living processes whose environment has NAME=VALUE for any NAME of
    WANTED ({name: [value, ...]}) and any of its values."""
    needles = {f"{name}={value}".encode() for name, values in wanted.items() for value in values}
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = set(f.read().split(b"\0"))
        except OSError:
            continue
        if env & needles:
            found.append(int(entry))
    return found


def alive(pid):
    """Whether PID is a running process (a zombie is not)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, timeout):
    """Wait until none of PIDS is alive; returns the ones still alive."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


class ChildWatcher:
    """Samples the descendants of a process while a block runs; `seen` holds every
    PID observed. Used to show that no rank was started."""

    def __init__(self, pid, interval=0.01):
        self.pid = pid
        self.interval = interval
        self.seen = set()
        self._stop = _threading.Event()
        self._thread = _threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.seen.update(p.pid for p in descendants(self.pid))
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.seen.update(p.pid for p in descendants(self.pid))
        return False


# Put at the top of a rank's code: every rank announces itself on stdout, so a test
# knows when ranks run and which processes (PID, TORCHELASTIC_RUN_ID) to look for.
ANNOUNCE = ("import os as _os\n"
            "print(f\"READY pid={_os.getpid()} run={_os.environ['TORCHELASTIC_RUN_ID']}\", "
            "flush=True)\n")
_ANNOUNCED = _re.compile(r"^\[rank (\d+)\] READY pid=(\d+) run=(\S+)$", _re.M)


def announced(kernel, msg_id):
    """{rank: (pid, run_id)} from the READY lines received so far for MSG_ID."""
    text = "".join(m["content"]["text"] for m in kernel.iopub_for(msg_id)
                   if m["msg_type"] == "stream")
    return {int(r): (int(pid), run) for r, pid, run in _ANNOUNCED.findall(text)}


def wait_announced(kernel, msg_id, world=2, timeout=60):
    """Wait until all WORLD ranks of MSG_ID printed their READY line."""
    deadline = time.monotonic() + timeout
    while True:
        got = announced(kernel, msg_id)
        if len(got) >= world:
            return got
        if kernel.replied(msg_id):
            raise AssertionError(f"the cell ended before every rank was ready: {got}")
        if time.monotonic() >= deadline:
            raise NoReply(f"only {sorted(got)} of {world} ranks were ready within {timeout} s")
        kernel.pump_iopub(0.05)


def json_value(kernel, expr, timeout=30):
    """The value of the Python expression EXPR in the kernel, through JSON."""
    r = kernel.execute(f"import json as _json\nprint(_json.dumps({expr}))", timeout=timeout)
    assert r.status == "ok", r.describe()
    return json.loads(r.stdout)


# -- MLflow tracking ------------------------------------------------------------------
#
# Helpers for test_mlflow.py: a kernel environment with chosen MLFLOW_* variables, every
# iopub message a kernel sent (to look for leaked credentials), and a port nobody
# listens on (a tracking server that is down).

import socket as _socket  # noqa: E402


def kernel_env(unset_prefixes=("MLFLOW_", "DISTKERNEL_MLFLOW_"), **values):
    """A copy of this process's environment for a kernel: every variable starting with
    one of UNSET_PREFIXES removed (so the caller's own MLflow settings never leak into
    a test), then VALUES set (a value of None removes the name)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(tuple(unset_prefixes))}
    for k, v in values.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = str(v)
    return env


def all_iopub(kernel):
    """Every iopub message KERNEL has sent so far, whatever its parent."""
    while kernel.pump_iopub(0.05):
        pass
    return [m for msgs in kernel._iopub.values() for m in msgs]


def closed_port():
    """A loopback port that was free a moment ago and that nothing listens on."""
    s = _socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
