"""What the kernel's Python side publishes on IOPub, and under which request:
JSON as the kernel sends it (dumps), the request a thread's or an asyncio
task's output belongs to (parents), and publish(), which sends a message
through the C side (`_distkernel.publish`) or, in a process forked from the
kernel, writes its text to fd 1 and 2.

Both the kernel glue (_kernel.py) and the comms' stand-in kernel (_comms.py)
publish through it; neither needs the other for that.
"""

import base64
import contextvars
import datetime
import json
import math
import os
import sys

import _distkernel

# The process that runs the kernel. A process forked from it (multiprocessing's
# default start method, os.fork(), DataLoader workers) has a copy of this
# module but none of the kernel's threads, and its copy of the ZeroMQ sockets
# must never be used: its output goes to fd 1 and 2 instead (_kernel._in_child).
KERNEL_PID = os.getpid()


def _default(obj):
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, (datetime.datetime, datetime.date)):
        return obj.isoformat()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return repr(obj)


def _finite(obj):
    """Replace NaN and infinities (not JSON) with None, as a last resort."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps(obj):
    try:
        return json.dumps(obj, default=_default, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":"))
    except ValueError:
        return json.dumps(_finite(json.loads(json.dumps(obj, default=_default))),
                          default=_default, ensure_ascii=False, separators=(",", ":"))


# ---- whose output ---------------------------------------------------------------

class _Parents:
    """Which request a thread's or an asyncio task's output belongs to: the
    shell API of ipykernel 7 (get_parent, set_parent, set_thread_parent,
    reset_thread_parent), which libraries use to send what a background thread
    prints to the cell that started it.

    The C side publishes under the request it is running. A thread or task
    that set a parent of its own publishes under that one instead: it is a
    ContextVar, so a new thread starts without one and an asyncio task
    inherits its creator's. set_parent also sets it for every thread that has
    none, until the next request, as in ipykernel (whose next execute_request
    calls set_parent again). None is "the request running"; a parent is a
    message, as get_parent returns it, or a bare header."""

    def __init__(self):
        self.var = contextvars.ContextVar("distkernel_parent")
        self.shared = None

    def current(self):
        return self.var.get(self.shared)

    def header_json(self):
        """The header JSON that output goes under, or None for the request running."""
        p = self.current()
        if p is None:
            return None
        return dumps(p["header"] if "header" in p else p)

    def new_request(self):
        """A request starts: output goes under it again, in the main thread and
        in every thread without a parent of its own."""
        self.shared = None
        self.var.set(None)

    @staticmethod
    def running():
        """The request running, as a message (ipywidgets' Output reads its
        header's msg_id); its header is empty between requests."""
        header = json.loads(_distkernel.parent() or "{}")
        return {"header": header, "msg_id": header.get("msg_id"),
                "msg_type": header.get("msg_type"), "parent_header": {}, "metadata": {},
                "content": {}}


parents = _Parents()


def publish(msg_type, content, metadata=None, buffers=None, parent=None):
    """Publish on IOPub under PARENT (header JSON), by default the parent of the
    calling thread or task (_Parents), else the request running."""
    if os.getpid() != KERNEL_PID:
        _publish_from_child(msg_type, content)
        return
    _distkernel.publish(msg_type, dumps(content), dumps(metadata) if metadata else None,
                        buffers, parent or parents.header_json())


def _publish_from_child(msg_type, content):
    """A forked child cannot reach IOPub (the kernel's sockets are not
    fork-safe): what it displays is shown as its plain text on stdout, which
    reaches the running cell through fd 1 like the rest of its output."""
    data = content.get("data") if isinstance(content, dict) else None
    if msg_type in ("display_data", "update_display_data", "execute_result") and data:
        text = data.get("text/plain")
        if text:
            sys.stdout.write(str(text) + "\n")
    elif msg_type == "error":
        sys.stderr.write("\n".join(content.get("traceback") or []) + "\n")
