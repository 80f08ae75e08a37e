"""Comms (ipywidgets and friends) through ipykernel's own Comm and CommManager.

ipykernel's Comm publishes with `kernel.session.send(kernel.iopub_socket, ...)`
and finds its kernel as the ipykernel Kernel singleton, so the stand-in below is
an ipykernel Kernel with a Session whose send() hands the message to distkernel's
publisher. Nothing else of ipykernel runs: no sockets, no event loop.

Since ipykernel 6.18, widgets make their comms through the `comm` package
(`comm.create_comm`, `comm.get_comm_manager`), whose own defaults are comms
that send nothing: ipykernel replaces them when it starts, and so does the
kernel (_kernel.install_comm_package), with create_comm and comm_manager below.
"""

import logging

import _distkernel
from ipykernel.comm import CommManager
from ipykernel.jsonutil import json_clean
from ipykernel.kernelbase import Kernel
from jupyter_client.session import Session

from distkernel._iopub import dumps, publish


class _PublishingSession(Session):
    def send(self, stream, msg_or_type, content=None, parent=None, ident=None, buffers=None,
             track=False, header=None, metadata=None):
        # PARENT: a message (from get_parent) or a header; an empty one (no
        # request yet) leaves it to the kernel's own.
        header = parent.get("header", parent) if parent else None
        publish(msg_or_type, json_clean(content or {}),
                json_clean(metadata) if metadata else None,
                [bytes(b) for b in buffers] if buffers else None,
                dumps(header) if header else None)


class _CommKernel(Kernel):
    def get_parent(self, channel=None):
        """The request output goes under, as a message: what ipykernel returns,
        and what ipywidgets' Output reads the msg_id of. The shell's (the
        control channel's requests are not Python's)."""
        return self.shell.get_parent()

    def handle_comm(self, msg_type, content, buffers):
        """Hand a comm_open / comm_msg / comm_close from the frontend to the
        CommManager, which dispatches to the target or the comm's handler."""
        parent = self.get_parent()
        msg = {**parent, "content": content, "buffers": buffers or [], "metadata": {},
               "msg_type": msg_type}
        getattr(self.comm_manager, msg_type)(None, None, msg)


class _KernelLogHandler(logging.Handler):
    """Log records go to the kernel's own log, never into a cell's output."""

    def emit(self, record):
        try:
            _distkernel.log(self.format(record))
        except Exception:
            pass


def _logger():
    log = logging.getLogger("distkernel")
    if not log.handlers:
        log.addHandler(_KernelLogHandler())
        log.propagate = False
    return log


def make_kernel(shell):
    kernel = _CommKernel.instance(session=_PublishingSession(key=b""), shell=shell,
                                  log=_logger())
    kernel.shell = shell   # ipykernel's Comm.handle_msg reads kernel.shell
    kernel.comm_manager = CommManager(parent=kernel, kernel=kernel, log=kernel.log)
    return kernel


def create_comm(shell, *args, **kwargs):
    """comm.create_comm: a comm that publishes through the kernel (ipykernel's
    own BaseComm, as its create_comm makes), registered with comm_manager."""
    try:
        from ipykernel.comm.comm import BaseComm
    except ImportError:   # ipykernel < 6.18, which has no use for the comm package
        from ipykernel.comm import Comm as BaseComm

    kernel = shell.kernel
    c = BaseComm(*args, **kwargs)
    c.kernel = kernel
    return c
