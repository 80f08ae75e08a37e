"""Comms (ipywidgets and friends) through ipykernel's own Comm and CommManager.

ipykernel's Comm publishes with `kernel.session.send(kernel.iopub_socket, ...)`
and finds its kernel as the ipykernel Kernel singleton, so the stand-in below is
an ipykernel Kernel with a Session whose send() hands the message to distkernel's
publisher. Nothing else of ipykernel runs: no sockets, no event loop.
"""

import json
import logging

import _distkernel
from ipykernel.comm import CommManager
from ipykernel.jsonutil import json_clean
from ipykernel.kernelbase import Kernel
from jupyter_client.session import Session

from distkernel._kernel import dumps


class _PublishingSession(Session):
    def send(self, stream, msg_or_type, content=None, parent=None, ident=None, buffers=None,
             track=False, header=None, metadata=None):
        _distkernel.publish(msg_or_type, dumps(json_clean(content or {})),
                            dumps(json_clean(metadata)) if metadata else None,
                            [bytes(b) for b in buffers] if buffers else None)


class _CommKernel(Kernel):
    def get_parent(self, channel="shell"):
        return json.loads(_distkernel.parent())

    def handle_comm(self, msg_type, content, buffers):
        """Hand a comm_open / comm_msg / comm_close from the frontend to the
        CommManager, which dispatches to the target or the comm's handler."""
        msg = {"content": content, "buffers": buffers or [], "metadata": {},
               "header": self.get_parent(), "msg_type": msg_type}
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
