"""The glue between distkernel's C core and IPython.

The C side owns the protocol: sockets, signatures, busy/idle, replies, output
capture and interrupts. It calls `Kernel.handle(msg_type, content_json, buffers)`
for the requests only IPython can answer and sends back the JSON text this
returns. Python reaches the kernel through the built-in module `_distkernel`;
what it publishes goes through _iopub.py (the JSON, and which request a
thread's output belongs to), which the comms' stand-in kernel shares.

Comm support (ipywidgets) reuses ipykernel's Comm and CommManager, which expect
an ipykernel Kernel object; a small stand-in is built the first time a comm is
used, so starting the kernel does not pay for importing ipykernel.
"""

import builtins
import getpass as _getpass_module
import io
import os
import signal
import sys
import threading

import _distkernel


def _defer_terminal_import():
    """IPython's package __init__ imports its terminal front end (prompt_toolkit,
    the debugger: ~40% of the kernel's start-up) for `IPython.embed`, which a
    kernel never uses. Stand in for that one module until something really asks
    for it; then the real one is imported and takes its place."""
    import importlib
    import types

    name = "IPython.terminal.embed"
    if name in sys.modules:
        return

    class _Deferred(types.ModuleType):
        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            if sys.modules.get(name) is self:
                del sys.modules[name]
            return getattr(importlib.import_module(name), attr)

    stub = _Deferred(name)
    stub.embed = lambda *a, **kw: importlib.import_module(name).embed(*a, **kw)
    sys.modules[name] = stub


_defer_terminal_import()

from IPython.core import page, payloadpage  # noqa: E402
from IPython.core.displayhook import DisplayHook  # noqa: E402
from IPython.core.displaypub import DisplayPublisher  # noqa: E402
from IPython.core.error import StdinNotImplementedError  # noqa: E402
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

from distkernel import _cells  # noqa: E402  (imports IPython: after the deferral above)
from distkernel._iopub import KERNEL_PID, parents, publish  # noqa: E402
# The C side takes json.dumps's default from here (kernel/dk_python.c).
from distkernel._iopub import _default  # noqa: E402,F401


# ---- output streams ------------------------------------------------------------

class OutStream(io.TextIOBase):
    """sys.stdout / sys.stderr of a cell: text goes to the kernel's stream buffer,
    which coalesces it with what reaches fd 1 and 2 and publishes it."""

    def __init__(self, fd, name):
        super().__init__()
        self._fd = fd
        self._name = name

    name = property(lambda self: self._name)
    encoding = "utf-8"
    errors = "replace"

    def writable(self):
        return True

    def readable(self):
        return False

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if os.getpid() != KERNEL_PID:
            return self._write_in_child(text)
        parent = parents.current()
        if parent is None:
            _distkernel.stream_write(self._fd, text)
        elif text:
            # Another request's: the running one's buffered text goes first.
            _distkernel.flush()
            publish("stream", {"name": "stderr" if self._fd == 2 else "stdout", "text": text})
        return len(text)

    def flush(self):
        if os.getpid() == KERNEL_PID:
            _distkernel.flush()
        elif self._child_tail:
            tail, self._child_tail = self._child_tail, ""
            _write_fd(self._fd, tail)

    _child_tail = ""

    def _write_in_child(self, text):
        """In a forked child: whole lines go to fd 1 or 2 at once, each in one
        write, so the lines of children printing side by side never mix
        (print() writes a line's text and its newline separately). An
        unfinished line waits for its newline or a flush."""
        pending = self._child_tail + text
        cut = pending.rfind("\n") + 1
        self._child_tail = pending[cut:]
        if cut:
            _write_fd(self._fd, pending[:cut])
        return len(text)

    def _is_master_process(self):
        """True in the kernel's own process, False in a process forked from it
        (the name ipykernel's OutStream uses, which code in the wild calls)."""
        return os.getpid() == KERNEL_PID


def _write_fd(fd, text):
    """Write TEXT to FD now, whole. In a forked child fd 1 and 2 are pipes to
    the kernel, so what a child prints reaches its cell in the order it was
    written, and no finished line waits in a buffer that os._exit (or a crash)
    would lose."""
    data = text.encode("utf-8", "replace")
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        view = view[n:]
    return len(text)


_forking = threading.local()


def _before_fork():
    """In the kernel, before a fork: pipes of its own for the child's fd 1 and 2,
    so that what it writes, even after its cell has ended, goes to the cell
    that forked it (dk_stream_fork_source)."""
    if os.getpid() == KERNEL_PID:
        _forking.fds = _distkernel.fork_source()


def _after_fork_in_parent():
    fds, _forking.fds = getattr(_forking, "fds", None), None
    for fd in fds or ():
        os.close(fd)


def _in_child():
    """After a fork: the child has no kernel threads. Its fd 1 and 2 become the
    pipes made for it; its sys.stdout and sys.stderr (our OutStreams, or
    anything that wraps them) write straight to fd 1 and 2 from now on
    (OutStream.write checks the pid), and input() and getpass fail cleanly
    instead of waiting on the kernel's stdin socket."""
    fds, _forking.fds = getattr(_forking, "fds", None), None
    if fds:
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.close(fds[0])
        os.close(fds[1])
    builtins.input = _child_input
    _getpass_module.getpass = _child_input


def _child_input(*args, **kwargs):
    raise EOFError("input() in a process forked from the kernel: only the kernel's own "
                   "process can ask the frontend for input")


# ---- display -----------------------------------------------------------------

class KernelDisplayPublisher(DisplayPublisher):
    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
        content = {"data": data, "metadata": metadata or {}, "transient": transient or {}}
        publish("update_display_data" if update else "display_data", content)

    def clear_output(self, wait=False):
        publish("clear_output", {"wait": bool(wait)})


class KernelDisplayHook(DisplayHook):
    """Turns a cell's last value into an execute_result."""

    _content = None   # while a value is being displayed

    def start_displayhook(self):
        self._content = {"execution_count": None, "data": {}, "metadata": {}}

    def write_output_prompt(self):
        self._content["execution_count"] = self.prompt_count

    def write_format_data(self, format_dict, md_dict=None):
        self._content["data"] = format_dict
        self._content["metadata"] = md_dict or {}

    def finish_displayhook(self):
        sys.stdout.flush()
        sys.stderr.flush()
        if self._content["data"]:
            publish("execute_result", self._content)
        self._content = None


class KernelShell(InteractiveShell):
    display_pub_class = KernelDisplayPublisher
    displayhook_class = KernelDisplayHook
    compiler_class = _cells.CellCompiler   # cells compile as files named by hash

    def __init__(self, **kw):
        super().__init__(**kw)
        self.last_error = None
        self.error_in_displayhook = False
        self._comm_kernel = None

    # ipykernel 7's shell API for the parent of output (see _Parents).

    def get_parent(self):
        parent = parents.current()
        return parent if parent is not None else parents.running()

    def set_parent(self, parent):
        parents.var.set(parent)
        parents.shared = parent

    def set_thread_parent(self, parent):
        return parents.var.set(parent)

    def reset_thread_parent(self, token):
        parents.var.reset(token)

    def init_hooks(self):
        super().init_hooks()
        # `obj?` and friends come back as a "page" payload, as in ipykernel.
        self.set_hook("show_in_pager", page.as_hook(payloadpage.page), 99)

    def _showtraceback(self, etype, evalue, stb):
        sys.stdout.flush()
        sys.stderr.flush()
        content = {"traceback": stb, "ename": str(etype.__name__), "evalue": str(evalue)}
        publish("error", content)
        self.last_error = content
        if self.displayhook._content is not None:
            # The value's repr failed: the cell failed (ipykernel 7 too).
            self.error_in_displayhook = True

    def ask_exit(self, keep_kernel=False):
        self.exit_now = True
        self.payload_manager.write_payload({"source": "ask_exit", "keepkernel": keep_kernel})

    def set_next_input(self, text, replace=False):
        self.payload_manager.write_payload(
            {"source": "set_next_input", "text": text, "replace": replace})

    @property
    def kernel(self):
        """An ipykernel-compatible kernel object, for code that expects one
        (ipywidgets: get_ipython().kernel.comm_manager)."""
        if self._comm_kernel is None:
            from distkernel import _comms
            self._comm_kernel = _comms.make_kernel(self)
        return self._comm_kernel


def install_comm_package(shell):
    """Where the `comm` package is installed (ipykernel >= 6.18 and the
    ipywidgets of today use it), its create_comm and get_comm_manager become
    the kernel's, as ipykernel's own start does; left as they are, a widget's
    comm sends nothing and it never shows. The stand-in kernel (and ipykernel's
    import) still waits for the first comm."""
    import importlib.util
    if importlib.util.find_spec("comm") is None:
        return
    import comm

    def create_comm(*args, **kwargs):
        from distkernel import _comms
        return _comms.create_comm(shell, *args, **kwargs)

    comm.create_comm = create_comm
    comm.get_comm_manager = lambda *args, **kwargs: shell.kernel.comm_manager


# ---- the object the C side calls ------------------------------------------------

class Kernel:
    def __init__(self):
        # As ipykernel (through IPython's InteractiveShellApp): the working
        # directory first, so a module next to the notebook imports, and
        # `%cd` moves where imports look. Ranks get this sys.path too.
        if "" not in sys.path:
            sys.path.insert(0, "")
        sys.stdout = OutStream(1, "<stdout>")
        sys.stderr = OutStream(2, "<stderr>")
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                            after_in_child=_in_child)
        self._saved_sigint = None
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if "MPLBACKEND" not in os.environ:
            import importlib.util
            if importlib.util.find_spec("matplotlib_inline") is not None:
                os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        from distkernel import _compat
        _compat.install()
        self.shell = KernelShell.instance()
        install_comm_package(self.shell)
        self._tune_history()
        self.allow_stdin = False
        builtins.input = self.raw_input
        _getpass_module.getpass = self.getpass
        self._register_native_magics()
        self._interruptible_pdb()
        self.handlers = {
            "execute_request": self.execute,
            "complete_request": self.complete,
            "inspect_request": self.inspect,
            "is_complete_request": self.is_complete,
            "history_request": self.history,
            "comm_info_request": self.comm_info,
            "comm_open": lambda c, b: self.comm_message("comm_open", c, b),
            "comm_msg": lambda c, b: self.comm_message("comm_msg", c, b),
            "comm_close": lambda c, b: self.comm_message("comm_close", c, b),
        }

    def _tune_history(self):
        """History is written by IPython's saving thread after every cell. With
        SQLite's default synchronous=FULL each write waits for an fsync, and the
        thread holds the GIL long enough to show in every reply. synchronous=OFF
        (this connection only; the file is unchanged) still survives a crash of
        the kernel, which is what history needs."""
        hm = self.shell.history_manager
        try:
            hm.db.execute("PRAGMA synchronous=OFF")
        except Exception:
            pass
        # IPython wakes its saving thread from inside run_cell, and the thread's
        # write then competes for the GIL with the reply (~1.5 ms a cell). The
        # kernel instead wakes it once it has been idle for a moment
        # (DK_HISTORY_IDLE_MS): a person never runs cells that fast, so history
        # is on disk as promptly as before, and a burst of cells (nbconvert, a
        # client loop) is written in one go.
        self._history_cache_size = hm.db_cache_size
        hm.db_cache_size = sys.maxsize

    @staticmethod
    def _interruptible_pdb():
        """pdb.set_trace() and breakpoint() stop at IPython's InterruptiblePdb,
        as in ipykernel: an interrupt while it waits for a command ends the
        cell instead of printing --KeyboardInterrupt-- and asking again, which
        left the kernel waiting forever."""
        import pdb

        from IPython.core import debugger
        debugger.Pdb = debugger.InterruptiblePdb
        pdb.Pdb = debugger.InterruptiblePdb
        pdb.set_trace = debugger.set_trace

    def arm_interrupt(self):
        """Before a cell: SIGINT raises KeyboardInterrupt, whatever handler the
        kernel inherited (ignored, when a script started the server in the
        background) or a cell installed. disarm_interrupt puts back a cell's
        own handler afterwards, as ipykernel does."""
        self._saved_sigint = signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def disarm_interrupt(self):
        saved, self._saved_sigint = self._saved_sigint, None
        if saved is not None and saved is not signal.default_int_handler:
            try:
                signal.signal(signal.SIGINT, saved)
            except (TypeError, ValueError):
                pass

    def history_pending(self):
        hm = self.shell.history_manager
        return len(hm.db_input_cache) > self._history_cache_size

    def write_history(self):
        """Called by the kernel when it has been idle a moment after a cell."""
        hm = self.shell.history_manager
        if self.history_pending() and hm.save_thread is not None:
            hm.save_flag.set()

    def _register_native_magics(self):
        shell = self.shell
        for name, kind, doc in _distkernel.native_magics():
            if kind == "cell":
                def magic(line, cell, _name=name):
                    _distkernel.run_native_magic(_name, line, shell.execution_count, cell)
            else:
                def magic(line, _name=name):
                    _distkernel.run_native_magic(_name, line, shell.execution_count, None)
            magic.__name__ = name
            magic.__doc__ = doc
            shell.register_magic_function(magic, magic_kind=kind, magic_name=name)

    def message_types(self):
        """The shell messages this glue answers: the C side asks once, so this
        table is the one list of them."""
        return frozenset(self.handlers)

    def handle(self, msg_type, content, buffers):
        """CONTENT comes parsed (a dict), and the reply goes back as one: the C
        side turns it into JSON once, as it sends it (kernel/dk_pyjson.h)."""
        return self.handlers[msg_type](content, buffers)

    # -- stdin --

    def raw_input(self, prompt=""):
        if not self.allow_stdin:
            raise StdinNotImplementedError(
                "input() was called, but this frontend does not support input requests.")
        value = _distkernel.input_request(str(prompt), False)
        if value == "\x04":
            raise EOFError
        return value

    def getpass(self, prompt="Password: ", stream=None):
        if not self.allow_stdin:
            raise StdinNotImplementedError(
                "getpass() was called, but this frontend does not support input requests.")
        return _distkernel.input_request(str(prompt), True)

    # -- execute --

    def execute(self, c, buffers):
        shell = self.shell
        code = c.get("code", "")
        silent = bool(c.get("silent", False))
        store_history = bool(c.get("store_history", not silent)) and not silent
        self.allow_stdin = bool(c.get("allow_stdin", False))
        parents.new_request()
        if not silent:
            publish("execute_input", {"code": code, "execution_count": shell.execution_count})
        shell.last_error = None
        shell.error_in_displayhook = False
        self.arm_interrupt()
        try:
            result = shell.run_cell(code, store_history=store_history, silent=silent)
        finally:
            self.allow_stdin = False
            self.disarm_interrupt()
        count = shell.execution_count - 1 if store_history else shell.execution_count
        if result.success and not (shell.error_in_displayhook and shell.last_error):
            reply = {"status": "ok", "execution_count": count,
                     "user_expressions": shell.user_expressions(c.get("user_expressions") or {})}
        else:
            err = shell.last_error or {
                "ename": type(result.error_in_exec or result.error_before_exec).__name__,
                "evalue": str(result.error_in_exec or result.error_before_exec),
                "traceback": []}
            reply = {"status": "error", "execution_count": count, "user_expressions": {}, **err}
        reply["payload"] = shell.payload_manager.read_payload()
        shell.payload_manager.clear_payload()
        return reply

    def native_begin(self, code, silent, store_history):
        shell = self.shell
        parents.new_request()
        self.arm_interrupt()
        count = shell.execution_count
        _cells.native_cell = code
        shell.compile.cache(code, count)
        if store_history:
            shell.history_manager.store_inputs(count, code, code)
        if not silent:
            publish("execute_input", {"code": code, "execution_count": count})
        if store_history:
            shell.execution_count += 1
        return count

    def native_finish(self, count, error, user_expressions):
        self.disarm_interrupt()
        _cells.native_cell = None
        if error:
            return {"status": "error", "execution_count": count, "payload": [],
                    "user_expressions": {}, **error}
        return {"status": "ok", "execution_count": count, "payload": [],
                "user_expressions": self.shell.user_expressions(user_expressions or {})}

    # -- introspection --

    def complete(self, c, buffers):
        from IPython.core.completer import provisionalcompleter, rectify_completions
        code = c.get("code", "")
        pos = c.get("cursor_pos")
        pos = len(code) if pos is None else pos
        with provisionalcompleter():
            completions = list(rectify_completions(
                code, self.shell.Completer.completions(code, pos)))
        if completions:
            start, end = completions[0].start, completions[0].end
        else:
            start = end = pos
        return {
            "status": "ok",
            "matches": [comp.text for comp in completions],
            "cursor_start": start,
            "cursor_end": end,
            "metadata": {"_jupyter_types_experimental": [
                {"start": comp.start, "end": comp.end, "text": comp.text,
                 "type": comp.type, "signature": comp.signature} for comp in completions]},
        }

    def inspect(self, c, buffers):
        from IPython.utils.tokenutil import token_at_cursor
        code = c.get("code", "")
        pos = c.get("cursor_pos")
        pos = len(code) if pos is None else pos
        name = token_at_cursor(code, pos)
        try:
            data = self.shell.object_inspect_mime(name, detail_level=c.get("detail_level", 0))
            if not self.shell.enable_html_pager:
                data.pop("text/html", None)
            found = True
        except KeyError:
            data, found = {}, False
        return {"status": "ok", "found": found, "data": data, "metadata": {}}

    def is_complete(self, c, buffers):
        status, indent = self.shell.input_transformer_manager.check_complete(c.get("code", ""))
        reply = {"status": status}
        if status == "incomplete":
            reply["indent"] = " " * (indent or 0)
        return reply

    def history(self, c, buffers):
        hm = self.shell.history_manager
        kind = c.get("hist_access_type", "tail")
        raw, output = c.get("raw", True), c.get("output", False)
        if kind == "tail":
            hist = hm.get_tail(c.get("n", 10), raw=raw, output=output, include_latest=True)
        elif kind == "range":
            hist = hm.get_range(c.get("session", 0), c.get("start", 0), c.get("stop"),
                                raw=raw, output=output)
        elif kind == "search":
            hist = hm.search(c.get("pattern", "*"), raw=raw, output=output, n=c.get("n"),
                             unique=c.get("unique", False))
        else:
            return {"status": "error", "ename": "ValueError",
                    "evalue": f"unknown hist_access_type {kind!r}: use tail, range or search",
                    "traceback": [], "history": []}
        # IPython numbers the running session 0 in get_range; clients expect the
        # session number that tail and search report.
        current = hm.session_number
        return {"status": "ok", "history": [
            (current if entry[0] == 0 else entry[0], *entry[1:]) for entry in hist]}

    # -- comms --

    def comm_info(self, c, buffers):
        kernel = self.shell._comm_kernel
        comms = kernel.comm_manager.comms if kernel is not None else {}
        target = c.get("target_name")
        return {"status": "ok", "comms": {
            comm_id: {"target_name": comm.target_name} for comm_id, comm in comms.items()
            if target is None or comm.target_name == target}}

    def comm_message(self, msg_type, c, buffers):
        self.shell.kernel.handle_comm(msg_type, c, buffers)

    def shutdown(self):
        try:
            self.shell.history_manager.db_cache_size = self._history_cache_size
            self.shell.atexit_operations()
        except Exception:
            pass
        _cells.files.remove()
