"""What one rank process runs (started by distkernel-rank).

It connects to the kernel's back channel, receives the job (a cell with the
notebook names it uses, or a function with its arguments, pickled with
cloudpickle), runs it as this rank, and sends back the value or the error.
"""

import ast
import linecache
import os
import sys
import traceback

import cloudpickle

from distkernel import _backchannel as bc

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


FLUSH_INTERVAL = 0.02


def _buffer_output():
    """A rank's stdout and stderr are pipes to the kernel. Unbuffered or
    line-buffered, every print() is a write() (and the kernel wakes for each):
    a rank printing fast spends most of its time there. Block-buffered, a line
    could wait for a long time. So they are buffered in blocks and flushed
    every FLUSH_INTERVAL by a thread, before the rank reports, and before
    os._exit; what a crash can take with it is at most the last FLUSH_INTERVAL
    of output."""
    import io
    import threading

    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        raw = io.FileIO(old.fileno(), "w", closefd=False)
        setattr(sys, name, io.TextIOWrapper(io.BufferedWriter(raw, 1 << 16),
                                            encoding="utf-8", errors="backslashreplace"))

    def flush_all():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass

    stop = threading.Event()

    def flusher():
        while not stop.wait(FLUSH_INTERVAL):
            flush_all()

    thread = threading.Thread(target=flusher, name="distkernel-flush", daemon=True)
    thread.start()

    def stop_flusher():
        # Before the interpreter finalizes: a daemon thread caught holding a
        # stream's lock then makes Python abort ("could not acquire lock").
        stop.set()
        thread.join(1.0)
        flush_all()

    import atexit
    atexit.register(stop_flusher)
    real_exit = os._exit

    def _exit(code):
        flush_all()
        real_exit(code)

    os._exit = _exit


def _main():
    _buffer_output()
    path = os.environ.pop("DISTKERNEL_BC")
    key = bytes.fromhex(os.environ.pop("DISTKERNEL_BC_KEY"))
    rank = int(os.environ["RANK"])
    channel = bc.BackChannel(path, key, rank)
    channel.send(bc.HELLO)
    kind, payload = channel.recv()
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


def _run_job(box, main_ns, keep_globals=False):
    """Run one job (a pickled cell or function, the one item of BOX, which is
    emptied so that its bytes are freed while the job runs) in MAIN_NS; its
    value. KEEP_GLOBALS (started ranks): a notebook function runs with MAIN_NS
    as its globals, as a cell does, so it sees and sets what earlier cells and
    calls left there."""
    job = cloudpickle.loads(box.pop())
    _use_kernel_sys_path(job.get("sys_path", []))
    _prime_linecache(job.get("sources", {}))
    _CellEnv.apply(job.get("env", {}))
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
    only the rank has."""
    sys.path[:] = list(kernel_path) + [p for p in sys.path if p not in kernel_path]


class _Unpicklable:
    """Stands in for a rank's value that could not be pickled."""

    def __init__(self, text, why):
        self.text, self.why = text, why

    def __repr__(self):
        return f"{self.text}  (not picklable: {self.why})"
