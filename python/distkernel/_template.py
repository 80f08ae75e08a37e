"""The warm-start template: a process that imports the warm modules once and
forks a rank from itself for each request (distkernel._rank.template_main).

A template is a distkernel-rank started by the kernel (runtime/launch/dk_template.c)
with DISTKERNEL_TEMPLATE (its socket's path) and DISTKERNEL_WARM_MODULES set.
It imports those modules once, then forks a rank for each request on its
socket: the request comes from a distkernel-rank started by the job as a cold
rank would be (runtime/rank/rank_main.c), which sends its own environment, working
directory, process group and stdout/stderr, waits, passes the job's stops
on to the rank, and ends as the rank ended. So the rank is the cold rank's
process in every way the job sees (pipes, environment, status, stops), less
the imports; like a cold rank it leads a session of its own (_become_rank),
whose group the template ends when the rank or its requester ends.

  request: b"F" | 3 zero bytes | u32 body length (big endian), with
           SCM_RIGHTS [stdout, stderr]; body: u32 pgid (the requester's;
           unused since ranks lead their own) | cwd NUL | NAME=value NUL...
           b"P" | 3 zero bytes | u32 0: can a rank be forked now?
  replies: b"ok PID\n" | b"no REASON\n", then after an F, b"exit STATUS\n"
           (the raw wait status) when the rank has ended.

The rank a template forks runs what a cold rank runs (_rank.main, handed to
serve), so this module needs nothing of the rank's but what it shares with the
template: where it imports from (_rankpath.py), the signals the kernel asks
for stacks with (_rankstacks.py), and rank 0's store (_rendezvous.py).
"""

import os
import sys
import traceback

from distkernel import _rankpath
from distkernel._rankpath import NodeFolders
from distkernel._rankstacks import stacks_signals
from distkernel._rendezvous import hold_store_for_peers


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


def _become_rank(rank_main, body, fds, template_pid, closing):
    """In the forked child: the process the request describes, which runs
    RANK_MAIN as a cold rank would and ends with its exit code (_exit_warm)."""
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
    # requester ends (_Template).
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
    # until main() arms them (_rankstacks.arm_stacks): their default would
    # end the rank.
    asked_with = stacks_signals()
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        handler = signal.SIG_DFL
        if sig == signal.SIGINT:
            handler = signal.default_int_handler
        elif sig in (signal.SIGPIPE, signal.SIGXFSZ) or sig in asked_with:
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
        rc = rank_main()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: B902 - as PyErr_Print would, for a cold rank
        traceback.print_exc()
        rc = 1
    _exit_warm(rc, template_names)


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
    hold_store_for_peers()
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


def serve(rank_main):
    """The template's life: import the warm modules, say "ready", then fork a
    rank that runs RANK_MAIN for each request on the socket, until the kernel
    ends the template. Returns 3 when a warm module would not import;
    otherwise it never returns."""
    path = os.environ.pop("DISTKERNEL_TEMPLATE")
    names = [m.strip() for m in os.environ.pop("DISTKERNEL_WARM_MODULES", "").split(",")
             if m.strip()]
    _rankpath.settle_template()
    if not _import_warm_modules(names):
        return 3
    # What the template holds stays out of the collector's sight: a
    # collection in a rank would otherwise write to (and so copy) every page
    # of it.
    import gc
    gc.collect()
    gc.freeze()
    template = _Template(path, rank_main)
    template.end_with_parent()
    # On a line of its own, whatever a warm module printed before it.
    sys.stdout.write("\nready\n")
    sys.stdout.flush()
    template.serve_forever()


def _import_warm_modules(names):
    """Import NAMES, and what every rank imports anyway, as the notebook
    would (the kernel's sys.path first); then the template's own sys.path
    back. False, said on stderr, when one would not import."""
    import importlib

    # A rank gets this process's own sys.path back, and then the kernel's as
    # a cold rank does (use_kernel_sys_path).
    own_path = list(sys.path)
    _rankpath.use_kernel_sys_path([p for p in os.environ.pop("DISTKERNEL_WARM_PATH",
                                                             "").split("\n") if p])
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
            return False
    # Its own path back, as checked as a rank's (distkernel-rank has left
    # the refused PYTHONPATH entries out already).
    sys.path[:] = [p for p in own_path if not NodeFolders.remote or NodeFolders.usable(p)]
    return True


class _Fd:
    """A bare descriptor, closed with the template's objects in a new rank."""

    def __init__(self, fd):
        self.fd = fd

    def close(self):
        os.close(self.fd)


class _Template:
    """The template's socket and the ranks it forked. Three things wake it: a
    request on the listener; a rank's end, as SIGCHLD written to the wakeup
    pipe; a requester's end, as its connection turning readable (nothing
    more is sent on it)."""

    def __init__(self, path, rank_main):
        import selectors
        import signal
        import socket

        self.rank_main = rank_main
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(128)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        signal.set_wakeup_fd(self.wake_w)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.children = {}              # pid -> the connection that asked for it
        self.children_watched = set()   # those connections the selector watches
        self.me = os.getpid()

    def _end(self, signum, frame):
        # The kernel ends the template with SIGTERM, and so does its death
        # (the parent-death signal, end_with_parent): each rank leads a group
        # of its own, which the template's end would otherwise leave to run.
        import signal
        if os.getpid() != self.me:  # a fork not yet a rank: only itself
            os._exit(128 + signum)
        for pid in list(self.children):
            _end_group(pid)
        signal.signal(signum, signal.SIG_DFL)   # and ends of the signal, as asked
        os.kill(self.me, signum)
        os._exit(128 + signum)

    def end_with_parent(self):
        """End (_end) on SIGTERM, which the kernel sends, and when the kernel
        dies (PR_SET_PDEATHSIG), already dead included."""
        import ctypes
        import signal
        parent = os.getppid()
        signal.signal(signal.SIGTERM, self._end)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            self._end(signal.SIGTERM, None)

    def serve_forever(self):
        while True:
            for key, _ in self.sel.select():
                if key.fileobj == self.wake_r:
                    self._reap()
                elif key.fileobj != self.listener:
                    self._check_requester(key)
                else:
                    self._answer(self.listener.accept()[0])

    def _reap(self):
        """Ranks that ended: each one's group ends too, and its requester is
        sent its status."""
        try:
            while os.read(self.wake_r, 4096):
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
            conn = self.children.pop(pid, None)
            if conn is not None:
                # What the rank left running in its group ends with it, as a
                # cold rank's (dk_job_judge.c): unreaped, its id is nobody
                # else's yet.
                _end_group(pid)
            _, status = os.waitpid(pid, 0)
            if conn is not None:
                if conn in self.children_watched:
                    self.children_watched.discard(conn)
                    self.sel.unregister(conn)
                try:
                    conn.sendall(b"exit %d\n" % status)
                except OSError:
                    pass
                conn.close()

    def _check_requester(self, key):
        """A requester's connection turned readable. Gone (SIGKILLed with its
        job's group) before its rank ended, the rank's group goes too."""
        import socket
        try:
            gone = not key.fileobj.recv(1, socket.MSG_DONTWAIT)
        except BlockingIOError:
            gone = False
        except OSError:
            gone = True
        if gone:
            self.children_watched.discard(key.fileobj)
            self.sel.unregister(key.fileobj)
            if self.children.get(key.data) is key.fileobj:
                _end_group(key.data)

    def _answer(self, conn):
        """One request on CONN, from a process of this user's: a rank forked
        (_fork) for an F that may be, else the reply to a P, or why not."""
        import socket
        import struct
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
            return
        # Outside the try: the rank's own errors are the rank's, not ours.
        self._fork(conn, fds, body)

    def _fork(self, conn, fds, body):
        """A rank for the request on CONN (its pipes FDS, its BODY); its pid
        goes back on CONN, which is then watched for the requester's end."""
        import selectors
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
            return
        if pid == 0:
            # The child never returns into the template's code: an early
            # error would run the template's finalization (and more) here.
            try:
                closing = [self.sel, self.listener, conn, _Fd(self.wake_r), _Fd(self.wake_w)]
                closing += self.children.values()
                _become_rank(self.rank_main, body, fds, self.me, closing)
            except BaseException:  # noqa: B902
                try:
                    traceback.print_exc()
                except BaseException:  # noqa: B902
                    pass
            os._exit(1)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        try:
            conn.sendall(b"ok %d\n" % pid)
        except OSError:
            pass
        # Nothing more comes on it: readable means the requester is gone.
        self.sel.register(conn, selectors.EVENT_READ, pid)
        self.children_watched.add(conn)
