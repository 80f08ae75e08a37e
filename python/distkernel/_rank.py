"""What one rank process runs (started by distkernel-rank).

It connects to the kernel's back channel, receives the job (a cell with the
notebook names it uses, or a function with its arguments, pickled with
cloudpickle), runs it as this rank, and sends back the value or the error.
"""

import ast
import linecache
import os
import struct
import sys
import traceback

import cloudpickle

from distkernel import _backchannel as bc
from distkernel import _flight

CELL_FILE = "<distributed-cell>"


def _prime_linecache(sources):
    """The notebook's cell sources, for tracebacks and inspect.getsource here
    even where the kernel's cell files cannot be read (mtime None: linecache
    keeps them when the file is missing)."""
    for filename, text in sources.items():
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)


def _run_cell(code, namespace, filename=CELL_FILE, line_offset=0):
    """Run CODE, the body of a cell whose first line is LINE_OFFSET lines into
    FILENAME (the cell's own file), so its lines are the notebook's."""
    if filename not in linecache.cache:
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename)
    if line_offset:
        ast.increment_lineno(tree, line_offset)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), namespace)
    if last is not None:
        return eval(compile(last, filename, "eval"), namespace)
    return None


def _error_payload(exc):
    import json
    # Drop distkernel's own frames before the user's code (this file's, and
    # _ray.py's around a ray_launch driver): the user's code starts at the cell
    # or function.
    tb = exc.__traceback__
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    while tb is not None and tb.tb_next is not None and \
            os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(package):
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    return json.dumps({"ename": type(exc).__name__, "evalue": str(exc),
                       "traceback": [line.rstrip("\n") for line in lines]}).encode()


def main():
    try:
        return _main()
    except KeyboardInterrupt:
        # Stopped before the user's code ran (another rank failed first, or the
        # cell was interrupted): nothing of ours is worth a traceback.
        return 130
    finally:
        # Every rank, cold or warm: a warm rank 0 waits for all of them.
        _check_out_of_store()


FLUSH_INTERVAL = 0.02   # a line print()ed reaches the kernel within this
IDLE_FLUSH = 1.0        # bytes written to sys.stdout.buffer directly: within this


def _buffer_output():
    """A rank's stdout and stderr are pipes to the kernel. Unbuffered or
    line-buffered, every print() is a write() (and the kernel wakes for each):
    a rank printing fast spends most of its time there. Block-buffered, a line
    could wait for a long time. So they are buffered in blocks and flushed by
    a thread FLUSH_INTERVAL after the first text written since the last
    flush, before the rank reports, and before os._exit; what a crash can
    take with it is at most the last FLUSH_INTERVAL of output.

    The thread sleeps while the rank prints nothing. A thread that woke on a
    timer instead (50 times a second) took the GIL from the training loop as
    often, and cost a CPU-bound FSDP step on two cores 7%
    (docs/performance.md); now a rank that prints once a step pays one wake
    a step at most. Bytes written below the text layer, which no text write
    announces, are flushed within IDLE_FLUSH."""
    import io
    import threading

    wake = threading.Event()
    stop = threading.Event()

    class _Stream(io.TextIOWrapper):
        def write(self, text):
            n = super().write(text)
            if not wake.is_set():
                wake.set()
            return n

    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        raw = io.FileIO(old.fileno(), "w", closefd=False)
        setattr(sys, name, _Stream(io.BufferedWriter(raw, 1 << 16),
                                   encoding="utf-8", errors="backslashreplace"))

    def flush_all():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass

    def flusher():
        while not stop.is_set():
            if wake.wait(IDLE_FLUSH) and stop.wait(FLUSH_INTERVAL):
                break
            # Cleared before the flush: a write during it wakes the next round.
            wake.clear()
            flush_all()

    thread = threading.Thread(target=flusher, name="distkernel-flush", daemon=True)
    thread.start()

    def stop_flusher():
        # Before the interpreter finalizes: a daemon thread caught holding a
        # stream's lock then makes Python abort ("could not acquire lock").
        stop.set()
        wake.set()
        thread.join(1.0)
        flush_all()

    import atexit
    atexit.register(stop_flusher)
    real_exit = os._exit

    def _exit(code):
        flush_all()
        real_exit(code)

    os._exit = _exit


def _enter_kernel_folder():
    """A rank started by its node's agent starts where srun started the agent,
    in a folder every node has (`--chdir=/`), not in the kernel's, which need
    not exist on its node (no shared filesystem is assumed; slurmstepd would
    say so on the agent's stderr and start it in /tmp). It goes to the kernel's folder
    (DISTKERNEL_CWD) where its node has it, as a local rank runs there, and
    otherwise to the user's home; but only to a folder its node's other users
    cannot write (_NodeFolders): a path that is not shared (/tmp/proj) may
    have been made on this node by someone else, with a torch.py in it. With
    neither, it stays in `/`, which every node has and only root can write,
    rather than /tmp, which every user can, and says so in its log. A rank
    that is not in the kernel's folder leaves '' (the notebook folder, on the
    kernel's sys.path) off its own: the folder's modules come in the payload
    (_SentModules), and a stray file in the home must not shadow a package.
    Whether it is in the kernel's folder."""
    folder = os.environ.pop("DISTKERNEL_CWD", None)
    if folder is None:
        return True         # started here, in the kernel's folder
    _NodeFolders.remote = True
    home = os.path.expanduser("~")
    for place in (folder, home):
        fd = _NodeFolders.open(place)
        if fd is None:
            continue
        try:
            os.fchdir(fd)   # the folder that was checked, whatever its path names now
        except OSError:
            continue
        finally:
            os.close(fd)
        os.environ["PWD"] = place
        if place != folder and folder in _NodeFolders.refused:
            _Notes.say(f"running in {place}, not in the kernel's folder {folder}")
        return place == folder
    os.chdir("/")
    os.environ["PWD"] = "/"
    _Notes.say(f"running in /: neither the kernel's folder {folder} nor the home {home} can "
               f"be used on this node; not in /tmp, which every user of the node can write")
    return False


_NOTES_MAX = 8      # a rank's notes about its node's folders: this many, then one line


class _Notes:
    """Lines about this rank for its log only, never the cell (OUTPUT frames
    for fd 3, DK_BC_OUTPUT_LOG): which of its node's folders it would not
    use, and why. Said before the channel is up, they wait for it. At most
    _NOTES_MAX, then one line saying more were left unsaid: a node full of
    planted folders must not fill the log."""

    channel = None
    pending = []
    count = 0

    @classmethod
    def say(cls, text):
        import socket

        if cls.count > _NOTES_MAX:
            return
        cls.count += 1
        if cls.count > _NOTES_MAX:
            text = "more of this node's folders were refused; they are not listed"
        line = f"distkernel-rank on {socket.gethostname()}: {text}\n".encode(errors="replace")
        if cls.channel is None:
            cls.pending.append(line)
        else:
            cls._send(line)

    @classmethod
    def attach(cls, channel):
        cls.channel = channel
        for line in cls.pending:
            cls._send(line)
        cls.pending = []

    @classmethod
    def _send(cls, line):
        try:
            cls.channel.send(bc.OUTPUT, struct.pack(">BB", bc.OUTPUT_LOG, 0) + line[:4096])
        except (OSError, bc.BackChannelError):
            pass    # a channel that broke is the run's failure, said elsewhere; not a note's


class _NodeFolders:
    """What a rank on another node than the kernel's may run in and import
    from: a folder or sys.path entry its node's other users cannot change,
    checked by distkernel-rank's built-in _distkernel_rankpath
    (runtime/rank/dk_rankpath.h, dk_logdir's check for code: the user's or root's,
    writable by nobody else, through parents nobody else can rename). A
    refused one is left out, and said once in the rank's log (_Notes); one
    that is not there is left out silently, as the kernel's folder on a node
    that does not share it always was. A plain python3 under an agent (the
    runtime's own tests) has no checker: it enters no folder and leaves the
    rest of sys.path as it is."""

    remote = False      # this rank runs on another node (DISTKERNEL_CWD was set)
    refused = set()

    @classmethod
    def _checker(cls):
        try:
            import _distkernel_rankpath
        except ImportError:
            return None
        return _distkernel_rankpath

    @classmethod
    def open(cls, path, what="folder not entered"):
        """A descriptor on PATH if this rank may use it (the caller closes),
        else None; WHAT says what a refusal means, in the log."""
        check = cls._checker()
        if check is None:
            cls._refuse(path, f"{what}: {path} cannot be checked: this rank is not "
                              f"distkernel-rank")
            return None
        try:
            return check.open(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            cls._refuse(path, f"{what}: {exc.strerror or exc}")
            return None

    @classmethod
    def usable(cls, entry):
        """Whether sys.path entry ENTRY may stay on this rank's sys.path."""
        if entry == "" or cls._checker() is None:
            return True     # '': the working directory, checked as it was entered
        fd = cls.open(entry, "left off sys.path")
        if fd is None:
            return False
        os.close(fd)
        return True

    @classmethod
    def _refuse(cls, path, why):
        if path not in cls.refused:
            cls.refused.add(path)
            _Notes.say(why)


_IN_KERNEL_FOLDER = True
_RUN_KEY = None     # the back channel's key: every rank of the run holds it, no one else


def run_secret(label):
    """A secret of this run for LABEL (bytes): HMAC-SHA256 of LABEL under the
    back channel's key, which every rank of the run has and nobody else; the
    key itself stays here. None outside a rank of distkernel's."""
    import hashlib
    import hmac

    if _RUN_KEY is None:
        return None
    return hmac.new(_RUN_KEY, b"distkernel/" + label, hashlib.sha256).digest()


def _arm_stacks():
    """Let the kernel ask for this rank's stacks (runtime/stacks/dk_stackreq.h): on
    its signal faulthandler writes every thread's stack to the rank's file
    (DISTKERNEL_STACKS) from the signal handler, without the GIL, and the
    handler it chains to (_distkernel_stacks, runtime/rank/dk_rankstacks.h) writes
    the end line. The ready line says the rank may be signalled, and which pid
    to signal (a warm rank is not the process the kernel started). A plain
    python3 has no _distkernel_stacks: it is never asked."""
    path = os.environ.pop("DISTKERNEL_STACKS", None)
    if not path:
        return
    try:
        import _distkernel_stacks
    except ImportError:
        return
    import faulthandler
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return      # not asked; the rank runs as before
    # The file is made by whoever started the rank, in a 0700 folder; a
    # folder made again by another user after that one was removed would
    # hand them this rank's stacks.
    import stat
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        _Notes.say(f"the stacks file {path} is not a file of this user's (owner uid "
                   f"{st.st_uid}): this rank's stacks cannot be asked for")
        return
    try:
        signum = _distkernel_stacks.arm(fd)
        faulthandler.register(signum, file=fd, all_threads=True, chain=True)
        sampler = _start_sampler(fd, _distkernel_stacks.SAMPLE, _distkernel_stacks.END.encode())
        ready = b"%s%d" % (_distkernel_stacks.READY.encode(), os.getpid())
        if sampler:
            ready += b"%s%d" % (_distkernel_stacks.READY_SAMPLER.encode(), sampler)
        os.write(fd, ready + b"\n")
    except (OSError, RuntimeError, ValueError):
        pass


def _start_sampler(fd, signum, end):
    """Answer the kernel's live samples (runtime/stacks/dk_stackreq.h,
    DK_SAMPLE_SIGNAL) while the rank runs on, from a thread of their own: the
    kernel sends the signal to this thread alone (tgkill), which blocks it and
    takes it with sigwait. So no other thread is interrupted (a blocking
    system call would see EINTR, and torch's rendezvous fails on it), and the
    rank's signal mask and dispositions, which the programs it starts
    inherit, stay as they were but for a handler of SIGNUM that does nothing
    (a handler, unlike an ignored signal, is not inherited across exec). The
    dump waits for the GIL: a main thread holding it in a C loop does not
    answer a sample (the end's request, on the other signal, still reaches
    it). The kernel asks this thread first at an end as well, since only an
    answer made with the GIL can end in the rank's last collective (the
    flight line, _flight.py). Returns the thread's id, or 0 when it did not
    start."""
    import faulthandler
    import signal
    import threading

    wanted = {signum}
    started = threading.Event()
    tid = [0]

    def answer():
        signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
        tid[0] = threading.get_native_id()
        started.set()
        while True:
            signal.sigwait(wanted)
            # Samples that queued while this thread waited for the GIL: one answer.
            while signal.sigtimedwait(wanted, 0) is not None:
                pass
            try:
                faulthandler.dump_traceback(file=fd, all_threads=True)
                os.write(fd, _flight.line().encode() + end)
            except OSError:
                return

    signal.signal(signum, lambda *_: None)
    threading.Thread(target=answer, name="distkernel-stacks-sampler", daemon=True).start()
    started.wait(5)
    return tid[0]


def _take_path_notes(say):
    """What distkernel-rank left out of the Python variables it started with
    on another node (runtime/rank/dk_rankpyenv.h): each path is marked
    refused, so that the kernel's sys.path, which holds a PYTHONPATH entry
    too, does not name it again (_NodeFolders); with SAY, each reason goes
    to the rank's log. A template takes them without a word: each rank it
    forks says its own."""
    for line in os.environ.pop("DISTKERNEL_PATH_NOTES", "").splitlines():
        path, tab, why = line.partition("\t")
        if tab:
            _NodeFolders.refused.add(path)
            if say:
                _Notes.say(why)


def _main():
    global _IN_KERNEL_FOLDER, _RUN_KEY
    _take_path_notes(say=True)
    _arm_stacks()
    _IN_KERNEL_FOLDER = _enter_kernel_folder()
    _buffer_output()
    path = os.environ.pop("DISTKERNEL_BC")
    key = bytes.fromhex(os.environ.pop("DISTKERNEL_BC_KEY"))
    _RUN_KEY = key
    rank = int(os.environ["RANK"])
    channel = bc.BackChannel(path, key, rank)
    channel.send(bc.HELLO)
    _Notes.attach(channel)
    held = _master_port_from_rank0(channel, rank)
    kind, payload = channel.recv()
    for sock in held:
        sock.close()        # the store binds it now (the work starts)
    if kind == bc.TASK:
        return _serve(channel, payload)
    if kind != bc.PAYLOAD:
        raise bc.BackChannelError(f"expected the job, got frame type {kind}")
    from distkernel import _compat
    _compat.install()
    # distkernel-rank blocked SIGINT while Python started; from here on an
    # interrupt is the user's KeyboardInterrupt (one already pending lands now).
    import signal
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    main_ns = sys.modules["__main__"].__dict__
    try:
        box = [payload]
        del payload
        value = _run_job(box, main_ns)
    except BaseException as exc:  # noqa: B902 - KeyboardInterrupt and SystemExit too
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            value = None
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            channel.send(bc.ERROR, _error_payload(exc))
            channel.close()
            return 130 if isinstance(exc, KeyboardInterrupt) else 1
    blob = _pickle_value(value)
    sys.stdout.flush()
    sys.stderr.flush()
    channel.send(bc.RESULT, blob)
    channel.close()
    return 0


# Where rank 0 looks for a free MASTER_PORT first: above the usual service
# ports and below Linux's ephemeral range (32768-60999), where the node's own
# outgoing connections take theirs and could take it back once released.
_PORT_RANGE = (20000, 32768)
_PORT_TRIES = 64


def _bind_free_port():
    """Sockets bound to a TCP port free on this node on every address (IPv4
    and, where the node has it, IPv6), and the port: a random one in
    _PORT_RANGE, else one the system picks. Held bound, they keep it free
    until closed."""
    import errno
    import random
    import socket

    def bind_all(port):
        held = []
        try:
            s4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s4)
            s4.bind(("", port))
            port = s4.getsockname()[1]
            if socket.has_ipv6:
                try:
                    s6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
                except OSError:
                    return held, port       # no IPv6 on this node
                held.append(s6)
                s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    s6.bind(("::", port))
                except OSError as exc:
                    if exc.errno != errno.EADDRNOTAVAIL:    # no IPv6 address here
                        raise
            return held, port
        except OSError:
            for sock in held:
                sock.close()
            return None, 0

    rng = random.SystemRandom()
    for _ in range(_PORT_TRIES):
        held, port = bind_all(rng.randrange(*_PORT_RANGE))
        if held:
            return held, port
    held, port = bind_all(0)
    if not held:
        raise OSError("rank 0 found no free TCP port on its node for MASTER_PORT")
    return held, port


def _master_port_from_rank0(channel, rank):
    """MASTER_PORT when the kernel leaves it to rank 0 (ranks on other nodes:
    DISTKERNEL_MASTER_PORT=rank0): rank 0 binds a port free on its node, the
    one MASTER_ADDR names, and sends it; every rank is sent it back before its
    work. Returns the sockets holding it (rank 0's), to close as the work
    starts."""
    if os.environ.pop("DISTKERNEL_MASTER_PORT", None) != "rank0":
        return []
    held = []
    if rank == 0:
        held, port = _bind_free_port()
        channel.send(bc.PORT, struct.pack(">I", port))
    kind, payload = channel.recv()
    if kind != bc.PORT or len(payload) != 4:
        raise bc.BackChannelError(f"expected the run's MASTER_PORT, got frame type {kind}")
    os.environ["MASTER_PORT"] = str(struct.unpack(">I", payload)[0])
    return held


def _run_job(box, main_ns, keep_globals=False):
    """Run one job (a pickled cell or function, the one item of BOX, which is
    emptied so that its bytes are freed while the job runs) in MAIN_NS; its
    value. KEEP_GLOBALS (started ranks): a notebook function runs with MAIN_NS
    as its globals, as a cell does, so it sees and sets what earlier cells and
    calls left there."""
    job = cloudpickle.loads(box.pop())
    _use_kernel_sys_path(job.get("sys_path", []))
    _SentModules.add(job.get("modules", {}))
    _prime_linecache(job.get("sources", {}))
    _CellEnv.apply(job.get("env", {}))
    _tracking_through_door()
    _let_go_of_earlier_runs()
    if job["kind"] == "cell":
        for name, blob in job["names"].items():
            main_ns[name] = cloudpickle.loads(blob)
        return _run_cell(job["code"], main_ns, job.get("filename", CELL_FILE),
                         job.get("line_offset", 0))
    if "job" in job:
        job = cloudpickle.loads(job["job"])
    fn = job["fn"]
    if keep_globals:
        fn = _in_namespace(fn, main_ns)
    return fn(*job["args"], **job["kwargs"])


def _in_namespace(fn, main_ns):
    """FN, if the notebook defined it, rebuilt on MAIN_NS: the names it was sent
    with go there first (as a cell's notebook names do)."""
    import types

    if not isinstance(fn, types.FunctionType) or fn.__module__ != "__main__":
        return fn
    for name, value in fn.__globals__.items():
        if not name.startswith("__"):
            main_ns[name] = value
    new = types.FunctionType(fn.__code__, main_ns, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    return new


def _pickle_value(value):
    try:
        return cloudpickle.dumps(value, protocol=5)
    except Exception as exc:
        return cloudpickle.dumps(_Unpicklable(repr(value), f"{type(exc).__name__}: {exc}"))


_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _tracking_through_door():
    """A tracking server on the kernel host's loopback (the one the kernel
    started, or a user's on 127.0.0.1), reached from this node: there
    127.0.0.1 is this node's own. The node's agent keeps a door to it on this
    node's 127.0.0.1 for this user's processes only (dk_tunnel.h) and says
    its port in DISTKERNEL_TRACKING_PORT; MLFLOW_TRACKING_URI is pointed at
    that port, the rest of it (scheme, credentials, path) as it was."""
    port = os.environ.get("DISTKERNEL_TRACKING_PORT", "")
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not port.isdigit() or not uri:
        return
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(uri)
        host = parts.hostname
    except ValueError:
        return
    if parts.scheme not in ("http", "https") or host not in _LOOPBACK_HOSTS:
        return
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@" if userinfo else ""
    netloc += f"{'127.0.0.1' if host == '::1' else host}:{port}"
    os.environ["MLFLOW_TRACKING_URI"] = urlunsplit(parts._replace(netloc=netloc))


def _let_go_of_earlier_runs():
    """On started ranks, each cell has an MLflow run of its own
    (MLFLOW_RUN_ID), which the kernel made and ends. A cell's
    `mlflow.log_metric` makes that run MLflow's active run in the process,
    and MLflow keeps it active: the next cell's metrics would go to the
    earlier cell's run. Runs left active by earlier cells are let go here,
    without a word to the server: the kernel has written their final status,
    which `mlflow.end_run()` would overwrite with FINISHED."""
    fluent = sys.modules.get("mlflow.tracking.fluent")
    stack_var = getattr(fluent, "_active_run_stack", None)
    if stack_var is None:
        return
    try:
        stack = stack_var.get()
        want = os.environ.get("MLFLOW_RUN_ID")
        stack[:] = [run for run in stack if run.info.run_id == want]
    except Exception:   # another MLflow's insides: leave them as they are
        pass


class _CellEnv:
    """The variables a cell's job sets (its MLflow run's) hold for that cell
    only: on started ranks, each cell first puts back what the ranks started
    with, so that a cell without tracking does not log into the last cell's
    run."""

    _saved = {}     # name -> the value at start (None: unset)

    @classmethod
    def apply(cls, env):
        for name, value in cls._saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, value in env.items():
            cls._saved.setdefault(name, os.environ.get(name))
            os.environ[name] = value


class _Busy:
    """SIGINT is a KeyboardInterrupt only while a cell runs, and only once per
    cell. Between cells it is ignored: the kernel interrupts only ranks it has
    not heard from, and one whose answer was still on its way must not die of
    that interrupt; the kernel ends idle ranks by closing the channel. The
    kernel sends SIGINT again every 0.1 s until a rank answers (a rank that had
    not yet read its cell would otherwise miss it): the repeats must not cut
    short the cell's own handling of the first."""

    def __init__(self):
        self.running = False

    def __call__(self, signum, frame):
        if self.running:
            self.running = False
            raise KeyboardInterrupt


def _serve(channel, task):
    """A persistent rank: run each TASK in the same __main__ namespace, answer
    it with its round, and wait for the next, until the kernel closes the
    channel."""
    import signal

    from distkernel import _compat
    _compat.install()
    busy = _Busy()
    signal.signal(signal.SIGINT, busy)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    main_ns = sys.modules["__main__"].__dict__
    while True:
        round_no, box = task[:4], [task[4:]]
        del task
        try:
            busy.running = True
            try:
                value = _run_job(box, main_ns, keep_globals=True)
            finally:
                busy.running = False
            kind, reply = bc.RESULT, _pickle_value(value)
        except BaseException as exc:  # noqa: B902 - KeyboardInterrupt and SystemExit too
            busy.running = False
            if isinstance(exc, SystemExit) and exc.code in (None, 0):
                kind, reply = bc.RESULT, _pickle_value(None)
            else:
                kind, reply = bc.ERROR, _error_payload(exc)
        del box
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            channel.send(kind, round_no + reply)
            del reply
            frame, task = channel.recv()
        except (ConnectionError, bc.ChannelClosed):
            return 0    # the kernel closed the channel: the ranks are being stopped
        # Anything else (a frame that breaks the protocol) is this rank's
        # failure, raised: the kernel reports it with its traceback, not as a
        # clean exit.
        if frame != bc.TASK:
            raise bc.BackChannelError(f"expected a task, got frame type {frame}")


def _use_kernel_sys_path(kernel_path):
    """Import as the notebook does: the kernel's sys.path, in its order ('' first,
    the working directory, which the rank shares with the kernel), then what
    only the rank has. '' (and any relative entry, which would name a folder
    under another) stays off where the rank is not in the kernel's folder
    (_enter_kernel_folder); on another node, so does every entry the node's
    other users could have put code in (_NodeFolders), the rank's own
    included."""
    if not _IN_KERNEL_FOLDER:
        kernel_path = [p for p in kernel_path if os.path.isabs(p)]
    path = list(kernel_path) + [p for p in sys.path if p not in kernel_path]
    if _NodeFolders.remote:
        path = [p for p in path if _NodeFolders.usable(p)]
    sys.path[:] = path


class _SentModules:
    """The notebook folder's modules as the kernel sent them (a run on other
    nodes, which need not share the folder: _dist.with_local_modules), imported
    from memory. It comes last on sys.meta_path: where the folder is there
    (one node, a shared filesystem), its files are found first, as for a local
    run. A package's submodules come here too (its __path__ is empty)."""

    _modules = {}
    _installed = False

    @classmethod
    def add(cls, modules):
        if not modules:
            return
        cls._modules.update(modules)
        if not cls._installed:
            sys.meta_path.append(cls())
            cls._installed = True

    def find_spec(self, name, path=None, target=None):
        import importlib.machinery

        sent = self._modules.get(name)
        if sent is None:
            return None
        filename, _, is_pkg = sent
        spec = importlib.machinery.ModuleSpec(name, self, origin=filename, is_package=is_pkg)
        spec.has_location = True
        if is_pkg:
            spec.submodule_search_locations = []
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        filename, source, _ = self._modules[module.__name__]
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)

    def get_source(self, name):
        """For tracebacks (linecache asks the module's loader when the file is
        not on this node)."""
        sent = self._modules.get(name)
        return sent[1].decode("utf-8", "replace") if sent else None


class _Unpicklable:
    """Stands in for a rank's value that could not be pickled."""

    def __init__(self, text, why):
        self.text, self.why = text, why

    def __repr__(self):
        return f"{self.text}  (not picklable: {self.why})"


# ---- the warm-start template --------------------------------------------------
#
# A template is a distkernel-rank started by the kernel (runtime/launch/dk_template.c)
# with DISTKERNEL_TEMPLATE (its socket's path) and DISTKERNEL_WARM_MODULES set.
# It imports those modules once, then forks a rank for each request on its
# socket: the request comes from a distkernel-rank started by the job as a cold
# rank would be (runtime/rank/rank_main.c), which sends its own environment, working
# directory, process group and stdout/stderr, waits, passes the job's stops
# on to the rank, and ends as the rank ended. So the rank is the cold rank's
# process in every way the job sees (pipes, environment, status, stops), less
# the imports; like a cold rank it leads a session of its own (_become_rank),
# whose group the template ends when the rank or its requester ends.
#
#   request: b"F" | 3 zero bytes | u32 body length (big endian), with
#            SCM_RIGHTS [stdout, stderr]; body: u32 pgid (the requester's;
#            unused since ranks lead their own) | cwd NUL | NAME=value NUL...
#            b"P" | 3 zero bytes | u32 0: can a rank be forked now?
#   replies: b"ok PID\n" | b"no REASON\n", then after an F, b"exit STATUS\n"
#            (the raw wait status) when the rank has ended.

def _template_unfit():
    """Why a rank must not be forked from this process now, or None. A fork
    copies only the calling thread: a thread a module started (an OpenMP pool,
    a watcher) would be missing in the rank with its locks held; CUDA cannot
    be used in a forked child at all."""
    import threading
    n = threading.active_count()
    if n != 1:
        names = ", ".join(t.name for t in threading.enumerate())
        return f"{n} Python threads run in the template ({names}); a warm module started them"
    try:
        tasks = len(os.listdir("/proc/self/task"))
    except OSError:
        tasks = 1
    if tasks != 1:
        return f"{tasks} threads run in the template; a warm module started them"
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_initialized():
        return "CUDA was initialised in the template (a warm module used the GPU)"
    # torch.cuda.is_initialized() is not enough: torch.cuda.is_available()
    # runs cuInit (without the NVML check, which the kernel asks for, a
    # module may still call the driver itself) and leaves it False. The
    # driver mapped or its device files open is what poisons a fork.
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                lib = line.rpartition("/")[2].strip()
                if lib.startswith(("libcuda.so", "libnvidia")):
                    return (f"{lib} (the CUDA driver) is loaded in the template; a warm "
                            "module used the GPU, and a forked rank could not")
    except OSError:
        pass
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        fds = []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            return (f"{target} is open in the template; a warm module used the GPU, "
                    "and a forked rank could not")
    return None


def _recv_exact(conn, n):
    buf = b""
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the request was cut short")
        buf += chunk
    return buf


def _read_request(conn):
    """(kind, fds, body) of one request on CONN."""
    import array
    import socket
    fds = array.array("i")
    head, anc, _flags, _addr = conn.recvmsg(8, socket.CMSG_SPACE(2 * fds.itemsize))
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    try:
        if len(head) < 8:
            head += _recv_exact(conn, 8 - len(head))
        length = int.from_bytes(head[4:8], "big")
        if length > 64 << 20:
            raise ConnectionError("request too large")
        return head[:1], list(fds), _recv_exact(conn, length)
    except BaseException:
        # The fds arrived with the header: ours to close, or the template
        # keeps them (the requester's pipes) open for good.
        for fd in fds:
            os.close(fd)
        raise


RANK_NAME = b"distkernel-rank"


def _take_the_rank_name(libc):
    """In a rank forked from the template: the rank's name back, where ps and
    pgrep look (the template's is distkernel-template, runtime/launch/dk_template.h):
    the process name, and the command line, overwritten in place (the
    template's is longer, so the rank's fits; what is past it is zeroed)."""
    import ctypes
    libc.prctl(15, RANK_NAME, 0, 0, 0)          # PR_SET_NAME
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rpartition(b")")[2].split()
        start, end = int(fields[45]), int(fields[46])    # arg_start, arg_end
    except (OSError, ValueError, IndexError):
        return
    if end - start > len(RANK_NAME):
        ctypes.memmove(start, RANK_NAME + b"\0" * (end - start - len(RANK_NAME)), end - start)


def _become_rank(body, fds, template_pid, closing):
    """In the forked child: the process the request describes. Returns the
    rank's exit code."""
    import ctypes
    import signal
    for obj in closing:
        try:
            obj.close()
        except Exception:
            pass
    signal.set_wakeup_fd(-1)
    cwd, _, env = body[4:].partition(b"\0")
    # A session (and group) of its own, as a cold rank's: the scheduler gives
    # each session its share of the CPUs (runtime/proc/dk_spawn.h). Its
    # requester, the process the job sees, passes the job's stops on to this
    # group (rank_main.c); the template ends the group when the rank or the
    # requester ends (template_main).
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG: die with the template
    _take_the_rank_name(libc)
    if os.getppid() != template_pid:
        os._exit(1)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if os.sysconf("SC_OPEN_MAX") > 0 else 65536)
    # As a cold rank starts: Python's own dispositions, SIGINT blocked until
    # the user's code runs (rank_main.c). The stacks signals stay ignored
    # until main() arms them (_arm_stacks): their default would end the rank.
    stacks_signals = _stacks_signals()
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.SIG_DFL
        if sig == signal.SIGINT:
            handler = signal.default_int_handler
        elif sig in (signal.SIGPIPE, signal.SIGXFSZ) or sig in stacks_signals:
            handler = signal.SIG_IGN
        try:
            signal.signal(sig, handler)
        except (OSError, ValueError):
            pass
    signal.pthread_sigmask(signal.SIG_SETMASK, {signal.SIGINT})
    os.environb.clear()
    for item in env.split(b"\0"):
        name, eq, value = item.partition(b"=")
        if eq and name:
            os.environb[name] = value
    os.chdir(cwd)
    # Seeds a cold rank would draw fresh (torch's default seed is fixed anyway).
    if "random" in sys.modules:
        sys.modules["random"].seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "random"):
        numpy.random.seed()
    template_names = set(sys.modules["__main__"].__dict__)
    try:
        rc = main()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: B902 - as PyErr_Print would, for a cold rank
        traceback.print_exc()
        rc = 1
    _exit_warm(rc, template_names)


def _stacks_signals():
    """The signals the kernel asks for stacks with: at an end, and for a live
    sample; none when this is not distkernel-rank."""
    try:
        import _distkernel_stacks
    except ImportError:
        return ()
    return (_distkernel_stacks.SIGNAL, _distkernel_stacks.SAMPLE)


def _exit_warm(rc, template_names=()):
    """End a forked rank as interpreter shutdown would, less the teardown of
    every module: that touches every object the template imported, so each
    page shared with the template is copied, seconds for torch. Non-daemon
    threads are waited for and atexit handlers run (the output flusher's
    among them), as at a cold rank's exit; then what the user's code made
    (its names in __main__, all but TEMPLATE_NAMES) is dropped and
    collected, so that a file left open is closed (its buffer written) and
    __del__ runs, as the teardown of __main__ would."""
    import atexit
    import gc
    import threading
    _hold_store_for_peers()
    try:
        threading._shutdown()
    except BaseException:  # noqa: B902
        pass
    atexit._run_exitfuncs()
    try:
        for name in ("last_type", "last_value", "last_traceback"):
            if hasattr(sys, name):
                setattr(sys, name, None)
        main_ns = sys.modules["__main__"].__dict__
        for name in [n for n in main_ns if n not in template_names]:
            del main_ns[name]
        gc.collect()
    except BaseException:  # noqa: B902 - a __del__ that raises ends nothing
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(rc)


EXIT_HOLD_S = 60.0
CHECK_OUT_KEY = "distkernel_warm_exit"


def _default_store():
    """The env:// process group's store, or None."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        from torch.distributed import distributed_c10d
        return distributed_c10d._get_default_store()
    except Exception:
        return None


def _check_out_of_store():
    """Tell rank 0 (which may be warm and hold the store for its peers) that
    this rank is done with the store."""
    store = _default_store()
    try:
        if store is not None:
            store.add(CHECK_OUT_KEY, 1)
    except Exception:
        pass    # a store that is gone already: nobody waits


def _hold_store_for_peers():
    """Rank 0 of an env:// process group hosts its TCPStore: when it exits,
    a peer still finishing init_process_group (which talks to the store after
    its barrier) gets "Connection reset by peer". A cold rank 0 takes long
    enough over its interpreter's teardown that this is never seen; a warm one
    exits at once. So every rank, cold or warm, checks out in the store as its
    main() ends (_check_out_of_store), and a warm rank 0 waits (at most
    EXIT_HOLD_S, for a peer that died without checking out) until every rank
    has."""
    store = _default_store()
    try:
        if store is None:
            return
        import time
        dist = sys.modules["torch.distributed"]
        if dist.get_rank() != 0:
            return
        world = dist.get_world_size()
        deadline = time.monotonic() + EXIT_HOLD_S
        # The job stops its ranks (SIGTERM, after a peer failed) while we
        # hold: this rank has its result in and is done, so it exits as
        # done, not as stopped by the job.
        import signal

        class _Stop(Exception):
            pass

        def stop(_sig, _frame):
            raise _Stop

        old = signal.signal(signal.SIGTERM, stop)
        try:
            while store.add(CHECK_OUT_KEY, 0) < world and time.monotonic() < deadline:
                time.sleep(0.005)
        except _Stop:
            pass
        finally:
            signal.signal(signal.SIGTERM, old)
    except Exception:
        pass    # a store that is gone already: nothing to hold


def _end_group(pid):
    """SIGKILL the group of the template's unreaped child PID (a warm rank),
    or PID alone when it has not made its group yet."""
    import signal
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    except OSError:
        pass


def template_main():
    import importlib
    import selectors
    import signal
    import socket
    import struct

    global _IN_KERNEL_FOLDER
    path = os.environ.pop("DISTKERNEL_TEMPLATE")
    names = [m.strip() for m in os.environ.pop("DISTKERNEL_WARM_MODULES", "").split(",")
             if m.strip()]
    # Each rank says in its own log what its distkernel-rank left out; the
    # template only keeps from naming those paths again.
    _take_path_notes(say=False)
    if os.environ.pop("DISTKERNEL_CWD", None) is not None:
        # A node agent's template, on another node than the kernel's
        # (runtime/agent/agent_main.c): it imports only from what its ranks
        # may (_NodeFolders), and not from relative entries ('' would be /).
        _NodeFolders.remote = True
        _IN_KERNEL_FOLDER = False
    # Imported as the notebook would (the kernel's sys.path first); a rank
    # gets this process's own sys.path back, and then the kernel's as a cold
    # rank does (_use_kernel_sys_path).
    own_path = list(sys.path)
    _use_kernel_sys_path([p for p in os.environ.pop("DISTKERNEL_WARM_PATH", "").split("\n")
                          if p])
    # What every rank imports anyway.
    import json  # noqa: F401
    import threading  # noqa: F401
    from distkernel import _compat  # noqa: F401
    for name in names:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # noqa: B902
            print(f"could not import warm module {name!r}: {type(exc).__name__}: {exc}",
                  file=sys.stderr, flush=True)
            return 3
    # Its own path back, as checked as a rank's (distkernel-rank has left
    # the refused PYTHONPATH entries out already).
    sys.path[:] = [p for p in own_path if not _NodeFolders.remote or _NodeFolders.usable(p)]
    # What the template holds stays out of the collector's sight: a
    # collection in a rank would otherwise write to (and so copy) every page
    # of it.
    import gc
    gc.collect()
    gc.freeze()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda s, f: None)
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children = {}       # pid -> the connection that asked for it
    children_watched = set()    # those connections the selector watches
    me = os.getpid()

    def _end(signum, frame):
        # The kernel ends the template with SIGTERM, and so does its death
        # (the parent-death signal below): each rank leads a group of its
        # own, which the template's end would otherwise leave to run.
        if os.getpid() != me:   # a fork not yet a rank: only itself
            os._exit(128 + signum)
        for pid in list(children):
            _end_group(pid)
        signal.signal(signum, signal.SIG_DFL)   # and ends of the signal, as asked
        os.kill(me, signum)
        os._exit(128 + signum)

    parent = os.getppid()
    signal.signal(signal.SIGTERM, _end)
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        _end(signal.SIGTERM, None)
    # On a line of its own, whatever a warm module printed before it.
    sys.stdout.write("\nready\n")
    sys.stdout.flush()

    class _Fd:
        def __init__(self, fd):
            self.fd = fd

        def close(self):
            os.close(self.fd)

    while True:
        for key, _ in sel.select():
            if key.fileobj == wake_r:
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
                while True:
                    try:
                        ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                    except ChildProcessError:
                        break
                    if ended is None:
                        break
                    pid = ended.si_pid
                    conn = children.pop(pid, None)
                    if conn is not None:
                        # What the rank left running in its group ends with
                        # it, as a cold rank's (dk_job_judge.c): unreaped, its
                        # id is nobody else's yet.
                        _end_group(pid)
                    _, status = os.waitpid(pid, 0)
                    if conn is not None:
                        if conn in children_watched:
                            children_watched.discard(conn)
                            sel.unregister(conn)
                        try:
                            conn.sendall(b"exit %d\n" % status)
                        except OSError:
                            pass
                        conn.close()
                continue
            if key.fileobj != listener:
                # A requester went away (SIGKILLed with its job's group)
                # before its rank ended: the rank's group goes too.
                try:
                    gone = not key.fileobj.recv(1, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    children_watched.discard(key.fileobj)
                    sel.unregister(key.fileobj)
                    if children.get(key.data) is key.fileobj:
                        _end_group(key.data)
                continue
            conn, _ = listener.accept()
            fds = []
            try:
                conn.settimeout(10)
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                       struct.calcsize("3i"))
                if struct.unpack("3i", cred)[1] != os.getuid():
                    raise ConnectionError("a stranger")
                kind, fds, body = _read_request(conn)
                why = _template_unfit()
                if kind == b"F" and why is None and len(fds) != 2:
                    why = "a malformed request"
                if kind != b"F" or why is not None:
                    conn.sendall(b"ok 0\n" if why is None else b"no " + why.encode() + b"\n")
                    raise ConnectionAbortedError
                sys.stdout.flush()
                sys.stderr.flush()
            except (OSError, ValueError):
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            # Outside the try: the rank's own errors are the rank's, not ours.
            try:
                pid = os.fork()
            except OSError as exc:
                try:
                    conn.sendall(b"no could not fork: " + str(exc).encode() + b"\n")
                except OSError:
                    pass
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            if pid == 0:
                # The child never returns into the template's code: an early
                # error would run the template's finalization (and more) here.
                try:
                    closing = [sel, listener, conn, _Fd(wake_r), _Fd(wake_w)]
                    closing += children.values()
                    _become_rank(body, fds, me, closing)
                except BaseException:  # noqa: B902
                    try:
                        traceback.print_exc()
                    except BaseException:  # noqa: B902
                        pass
                os._exit(1)
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            try:
                conn.sendall(b"ok %d\n" % pid)
            except OSError:
                pass
            # Nothing more comes on it: readable means the requester is gone.
            sel.register(conn, selectors.EVENT_READ, pid)
            children_watched.add(conn)
