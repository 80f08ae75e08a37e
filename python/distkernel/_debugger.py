"""The Jupyter debugger: debug_request on control, debug_event on IOPub.

The kernel's control thread hands every debug_request to a worker thread
(kernel/dk_debug.c), which calls `handle` here with the GIL. Nothing of this
module is imported before the first debug_request.

On `initialize`, debugpy starts (debugpy.listen: pydevd in this process, the
debug adapter as a subprocess) and this module connects to the adapter as a
Debug Adapter Protocol client over TCP (Content-Length framing). Requests are
then either answered here (what only the kernel knows: dumpCell, debugInfo,
source, modules, inspectVariables, richInspectVariables, copyToGlobals,
configurationDone) or forwarded to the adapter, whose responses come back
through a reader thread; its events are published as debug_event.

Threads of ours are hidden from pydevd, so a breakpoint stops the cell (the
main thread) and never this machinery: the worker answers while the main
thread waits inside pydevd, and the control thread never waits for the GIL.
"""

import json
import os
import re
import signal
import socket
import sys
import threading

import _distkernel
from distkernel import _cells

TIMEOUT = 30.0  # seconds to wait for the adapter's response to one request
GLUE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Namespace entries that are IPython's or the kernel's, not the user's.
_HIDDEN = {"__name__", "__doc__", "__package__", "__loader__", "__spec__", "__annotations__",
           "__builtins__", "__builtin__", "__display__", "get_ipython", "debugpy", "exit",
           "quit", "In", "Out", "_oh", "_dh", "_", "__", "___"}
_HIDDEN_RE = re.compile(r"^_(\d|i)")
_RESUMING = {"continue", "next", "stepIn", "stepOut", "stepBack", "reverseContinue", "goto"}


def _hide_from_pydevd(thread):
    thread.pydev_do_not_trace = True
    thread.is_pydev_daemon_thread = True


class AdapterError(Exception):
    pass


class _Adapter:
    """A DAP client connection to the debugpy adapter."""

    def __init__(self, host, port, on_event):
        self._sock = socket.create_connection((host, port), timeout=TIMEOUT)
        self._sock.settimeout(None)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._on_event = on_event
        self._lock = threading.Lock()
        self._seq = 0
        self._pending = {}           # our seq -> [threading.Event, response or None]
        self.initialized = threading.Event()
        self.closed = False
        self._reader = threading.Thread(target=self._read, name="distkernel-debug-adapter",
                                        daemon=True)
        _hide_from_pydevd(self._reader)
        self._reader.start()

    def _read(self):
        buf = b""
        try:
            while True:
                head_end = buf.find(b"\r\n\r\n")
                if head_end < 0:
                    chunk = self._sock.recv(65536)
                    if not chunk:
                        break
                    buf += chunk
                    continue
                length = None
                for line in buf[:head_end].split(b"\r\n"):
                    key, _, value = line.partition(b":")
                    if key.strip().lower() == b"content-length":
                        length = int(value)
                if length is None:
                    raise AdapterError("a message from the adapter had no Content-Length")
                start = head_end + 4
                while len(buf) < start + length:
                    chunk = self._sock.recv(max(65536, start + length - len(buf)))
                    if not chunk:
                        raise EOFError
                    buf += chunk
                body, buf = buf[start:start + length], buf[start + length:]
                self._dispatch(json.loads(body))
        except Exception as exc:  # the adapter went away: answer whoever waits
            if not self.closed:
                _distkernel.log(f"debugger: the connection to debugpy's adapter ended ({exc!r})")
        finally:
            self.closed = True
            with self._lock:
                for slot in self._pending.values():
                    slot[0].set()

    def _dispatch(self, msg):
        if msg.get("type") == "response":
            with self._lock:
                slot = self._pending.get(msg.get("request_seq"))
            if slot is not None:
                slot[1] = msg
                slot[0].set()
        elif msg.get("type") == "event":
            if msg.get("event") == "initialized":
                self.initialized.set()
            self._on_event(msg)

    def send(self, msg):
        """Send MSG (a request) under a seq of ours; returns a waiter."""
        with self._lock:
            self._seq += 1
            seq = self._seq
            slot = self._pending[seq] = [threading.Event(), None]
        out = dict(msg, seq=seq)
        body = json.dumps(out).encode("utf-8")
        self._sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return seq, slot

    def wait(self, seq, slot, timeout=TIMEOUT):
        slot[0].wait(timeout)
        with self._lock:
            self._pending.pop(seq, None)
        if slot[1] is None:
            raise AdapterError("the debug adapter did not answer"
                               + (" (it has gone)" if self.closed else f" within {timeout:.0f} s"))
        return slot[1]

    def request(self, msg, timeout=TIMEOUT):
        seq, slot = self.send(msg)
        return self.wait(seq, slot, timeout)

    def close(self):
        self.closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class Debugger:
    def __init__(self):
        self.endpoint = None         # the adapter's client endpoint, once debugpy listens
        self.adapter = None
        self.started = False
        self.attached = False
        self.breakpoints = {}        # source path -> breakpoints, for debugInfo
        self.stopped_threads = set()
        self.parent = "{}"           # header of the latest debug_request
        self._removed_transforms = []

    # -- plumbing --

    def _publish_event(self, msg):
        body = msg.get("body") or {}
        if msg.get("event") == "stopped":
            if "threadId" in body:
                self.stopped_threads.add(body["threadId"])
        elif msg.get("event") == "continued":
            if body.get("allThreadsContinued", True):
                self.stopped_threads.clear()
            else:
                self.stopped_threads.discard(body.get("threadId"))
        _distkernel.publish("debug_event", _cells_dumps(msg), None, None, self.parent)

    def _forward(self, request):
        reply = self.adapter.request(request)
        reply["request_seq"] = request.get("seq")
        return reply

    @staticmethod
    def _reply(request, success=True, body=None, message=None):
        reply = {"type": "response", "request_seq": request.get("seq"), "success": success,
                 "command": request.get("command"), "body": body if body is not None else {}}
        if message:
            reply["message"] = message
        return reply

    # -- start and stop --

    def _start(self):
        if self.endpoint is None:
            # pydevd warns about frozen modules on 3.11 unless told not to.
            os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
            import debugpy
            # Processes a cell starts are not debugged (and not patched to be).
            debugpy.configure(subProcess=False)
            # This thread blocks every signal (the kernel's threads leave
            # them to the main thread) and the adapter would inherit that:
            # unblock all but SIGINT while it is spawned.
            old = signal.pthread_sigmask(signal.SIG_SETMASK, {signal.SIGINT})
            try:
                self.endpoint = debugpy.listen(("127.0.0.1", 0))
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
            debugpy.trace_this_thread(False)
            _hide_from_pydevd(threading.current_thread())
        self.adapter = _Adapter(*self.endpoint, self._publish_event)
        self._keep_leading_empty_lines()
        self.started = True

    def _stop(self):
        if self.adapter is not None:
            self.adapter.close()
        self.adapter = None
        self.started = self.attached = False
        self.breakpoints.clear()
        self.stopped_threads.clear()
        self._restore_transforms()

    def _keep_leading_empty_lines(self):
        """IPython drops a cell's leading empty lines before compiling it,
        which would move every line against the cell the frontend shows (and
        sets breakpoints in): not while debugging."""
        from IPython.core.inputtransformer2 import leading_empty_lines
        transforms = _shell().input_transformer_manager.cleanup_transforms
        while leading_empty_lines in transforms:
            index = transforms.index(leading_empty_lines)
            self._removed_transforms.append((index, transforms.pop(index)))

    def _restore_transforms(self):
        transforms = _shell().input_transformer_manager.cleanup_transforms
        while self._removed_transforms:
            index, fn = self._removed_transforms.pop()
            transforms.insert(index, fn)

    # -- requests --

    def handle(self, request):
        command = request.get("command")
        local = getattr(self, "do_" + str(command), None)
        if command == "initialize":
            if not self.started:
                self._start()
            return self._forward(request)
        if command in ("debugInfo", "inspectVariables", "richInspectVariables", "modules",
                       "source", "dumpCell"):
            return local(request)
        if not self.started:
            return self._reply(request, False,
                               message="the debugger is not started: send initialize first")
        if local is not None:
            return local(request)
        if command in _RESUMING and not self.stopped_threads:
            # pydevd never answers these for a thread that is not stopped.
            return self._reply(request, False, message="no thread is stopped")
        return self._forward(request)

    def do_attach(self, request):
        args = request.setdefault("arguments", {})
        args["justMyCode"] = args.get("justMyCode", True)
        # The kernel's glue is not the user's code: never step into it.
        args.setdefault("rules", []).append({"path": GLUE_DIR, "include": False})
        if self.attached:
            return self._forward(request)
        # debugpy answers attach only after configurationDone, which it asks
        # for with its "initialized" event: the frontend's own
        # configurationDone comes later and is answered here.
        seq, slot = self.adapter.send(request)
        if not self.adapter.initialized.wait(TIMEOUT):
            raise AdapterError("the debug adapter did not initialize")
        self.adapter.request({"type": "request", "command": "configurationDone"})
        reply = self.adapter.wait(seq, slot)
        reply["request_seq"] = request.get("seq")
        self.attached = reply.get("success", False)
        return reply

    def do_configurationDone(self, request):
        return self._reply(request)

    def do_disconnect(self, request):
        # The debuggee is this kernel: it goes on. Asked to "terminate" it,
        # debugpy ends its adapter and pydevd's connection, and a later
        # initialize would find no debugger to attach to.
        request.setdefault("arguments", {})["terminateDebuggee"] = False
        try:
            reply = self._forward(request)
        finally:
            self._stop()
        return reply

    def do_setBreakpoints(self, request):
        reply = self._forward(request)
        args = request.get("arguments", {})
        path = (args.get("source") or {}).get("path")
        if path:
            if args.get("breakpoints"):
                self.breakpoints[path] = args["breakpoints"]
            else:
                self.breakpoints.pop(path, None)
        return reply

    def do_dumpCell(self, request):
        code = request.get("arguments", {}).get("code", "")
        path = _cells.files.write(code)
        return self._reply(request, body={"sourcePath": path})

    def do_debugInfo(self, request):
        return self._reply(request, body={
            "isStarted": self.started,
            "hashMethod": _cells.HASH_METHOD,
            "hashSeed": _cells.HASH_SEED,
            "tmpFilePrefix": _cells.files.prefix,
            "tmpFileSuffix": _cells.SUFFIX,
            "breakpoints": [{"source": path, "breakpoints": bps}
                            for path, bps in self.breakpoints.items()],
            "stoppedThreads": sorted(self.stopped_threads),
            "richRendering": True,
            "exceptionPaths": ["Python Exceptions"],
        })

    def do_source(self, request):
        path = (request.get("arguments", {}).get("source") or {}).get("path", "")
        text = _cells.cell_source(path)
        if text is None:
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except (OSError, UnicodeDecodeError, TypeError) as exc:
                return self._reply(request, False, message=f"source unavailable: {exc}")
        return self._reply(request, body={"content": text})

    def do_modules(self, request):
        args = request.get("arguments", {})
        modules = list(sys.modules.values())
        start = args.get("startModule", 0)
        count = args.get("moduleCount") or len(modules)
        found = []
        for i, module in enumerate(modules[start:start + count], start):
            path = getattr(getattr(module, "__spec__", None), "origin", None)
            if path and path.endswith(".py"):
                found.append({"id": i, "name": module.__name__, "path": path})
        return self._reply(request, body={"modules": found, "totalModules": len(modules)})

    def do_variables(self, request):
        if not self.stopped_threads:
            # inspectVariables hands out no references to expand.
            return self._reply(request, body={"variables": []})
        reply = self._forward(request)
        if reply.get("success"):
            reply["body"]["variables"] = [v for v in reply["body"].get("variables", [])
                                          if _accept(v.get("name", ""))]
        return reply

    def do_inspectVariables(self, request):
        shell = _shell()
        hidden = shell.user_ns_hidden
        variables = []
        for name, value in list(shell.user_ns.items()):
            if not _accept(name) or (name in hidden and hidden[name] is value):
                continue
            variables.append({"name": name, "value": _short_repr(value),
                              "type": type(value).__name__, "evaluateName": name,
                              "variablesReference": 0})
        return self._reply(request, body={"variables": variables})

    def do_richInspectVariables(self, request):
        args = request.get("arguments", {})
        name = args.get("variableName", "")
        if not str(name).isidentifier():
            # JupyterLab asks for the pseudo-variables of its tree too.
            return self._reply(request, name in ("special variables", "function variables"),
                               body={"data": {}, "metadata": {}})
        data, metadata = {}, {}
        if self.stopped_threads and "frameId" in args:
            reply = self.adapter.request({
                "type": "request", "command": "evaluate",
                "arguments": {"expression": f"get_ipython().display_formatter.format({name})",
                              "frameId": args["frameId"], "context": "clipboard"}})
            if reply.get("success"):
                import ast
                try:
                    data, metadata = ast.literal_eval(reply["body"]["result"])
                except (ValueError, SyntaxError, TypeError):
                    data = {"text/plain": reply["body"]["result"]}
        else:
            result = _shell().user_expressions({name: name})[name]
            if result.get("status") == "ok":
                data, metadata = result.get("data", {}), result.get("metadata", {})
        return self._reply(request, body={
            "data": data, "metadata": {k: v for k, v in metadata.items() if k in data}})

    def do_copyToGlobals(self, request):
        args = request.get("arguments", {})
        src, dst = args.get("srcVariableName", ""), args.get("dstVariableName", "")
        if not (str(src).isidentifier() and str(dst).isidentifier()):
            return self._reply(request, False,
                               message="copyToGlobals takes two variable names (identifiers)")
        # An evaluate, not a setExpression: pydevd (debugpy 1.6) never
        # answers a setExpression whose value fails, and stops answering
        # anything after it.
        reply = self.adapter.request({
            "type": "request", "command": "evaluate",
            "arguments": {"expression": f"globals().__setitem__({dst!r}, {src})",
                          "frameId": args.get("srcFrameId"), "context": "repl"}})
        if not reply.get("success"):
            return self._reply(request, False, message=reply.get("message")
                               or f"could not copy {src} to the globals")
        return self._reply(request)


def _accept(name):
    return name not in _HIDDEN and not _HIDDEN_RE.match(name)


def _short_repr(value, limit=200):
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<repr failed: {type(exc).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _shell():
    from IPython.core.interactiveshell import InteractiveShell
    return InteractiveShell.instance()


def _cells_dumps(obj):
    from distkernel._iopub import dumps
    return dumps(obj)


_debugger = Debugger()


def handle(content_json, parent_json):
    """A debug_request's content (JSON text) -> the debug_reply content."""
    _hide_from_pydevd(threading.current_thread())
    try:
        request = json.loads(content_json)
        if not isinstance(request, dict):
            raise ValueError("a debug_request's content is a DAP request object")
    except ValueError as exc:
        return _cells_dumps({"type": "response", "success": False,
                             "message": f"not a debug request: {exc}"})
    _debugger.parent = parent_json
    try:
        reply = _debugger.handle(request)
    except Exception as exc:
        reply = Debugger._reply(request, False, message=f"{type(exc).__name__}: {exc}")
    return _cells_dumps(reply)
