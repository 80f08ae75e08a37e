"""The rank side of the runtime's back channel.

The wire is specified once, in runtime/channel/dk_frame.h: the frame's
layout, its MAC, the direction bytes, the sequence counts and the types. The
constants below are that header's, named as it names them without DK_FRAME_
(its DK_FRAME_DIR_TO_RUNTIME and _TO_RANK are TO_RUNTIME and TO_RANK here);
tests/e2e/test_wire_spec.py fails when the two disagree. What a job does with
the frames (a persistent job's TASK rounds, PORT before the work) is
runtime/launch/dk_job.h's.

DISTKERNEL_BC is a Unix socket's absolute path: the kernel's, for a rank on its
node, or its node agent's, which carries the connection to the kernel untouched
(runtime/agent/dk_agent.h); its peer must be our own user's. The rank's output goes on its fd 1 and 2 either
way, read by whoever started it.

The channel's key is the run's: every rank of the run has it and nobody else,
so a secret of the run (run_secret, which _ray.py signs with) is derived from
it, and the key itself never leaves this module.
"""

import hashlib
import hmac
import os
import socket
import struct
import threading

# The frame types a rank speaks.
HELLO, PAYLOAD, RESULT, ERROR, TASK, OUTPUT = range(1, 7)
PORT = 9
NONCE_LEN = 32      # what the runtime writes first on a connection
MAC_LEN = 32
BODY_HEAD = 5       # u8 type | u32 id, before a frame's payload
# The direction byte of the MAC: a frame of ours sent back to us does not verify.
TO_RUNTIME = b"R"   # on what a rank sends
TO_RANK = b"K"      # on what the runtime (the kernel) sends
# The protocol's one size limit: the bytes after a frame's type and id, either
# way (tests/unit/test_job.c checks that this side takes exactly that). A
# frame's length field covers the MAC, type, id and those.
PAYLOAD_MAX = 1 << 30
LEN_MAX = MAC_LEN + BODY_HEAD + PAYLOAD_MAX
OUTPUT_LOG = 3      # OUTPUT's fd for the rank's log only, never the cell


class BackChannelError(Exception):
    """The channel broke its protocol (a bad frame, a failed MAC)."""


def _check_peer(sock, path):
    """The socket's folder is a fresh 0700 one, but it is removed when its
    owner is done (a node agent whose kernel went away), and another user of
    the node may have made it again and bound a socket there: the rank would
    hand them its output and, with HELLO, what its key signs. So the peer must
    run as our own uid (SO_PEERCRED, as runtime/base/dk_peer.h checks in C)."""
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", cred)
    if uid != os.geteuid():
        raise BackChannelError(f"the back channel's socket {path} belongs to another user "
                               f"(uid {uid}, pid {pid}); nothing was sent to it")


class ChannelClosed(BackChannelError):
    """The kernel closed the channel: how started ranks are told to stop."""


class BackChannel:
    def __init__(self, path, key, rank):
        self.key = key
        self.rank = rank
        # The kernel and every agent give an absolute socket path; anything
        # else (a TCP address, a relative name) would be looked up under
        # wherever the rank happens to run.
        if not path.startswith("/"):
            raise BackChannelError(f"DISTKERNEL_BC={path!r} is not the absolute path of a Unix "
                                   f"socket, as the kernel and its node agents give; this "
                                   f"rank cannot reach the kernel")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.connect(path)
            _check_peer(self.sock, path)
        except BaseException:
            self.sock.close()
            raise
        self.nonce = self._recv_exact(NONCE_LEN)
        self.send_seq = 0
        self.recv_seq = 0
        self._send_lock = threading.Lock()

    def _recv_exact(self, n):
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ChannelClosed("the kernel closed the back channel")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _mac(self, direction, seq, body):
        h = hmac.new(self.key, digestmod=hashlib.sha256)
        h.update(self.nonce)
        h.update(direction)
        h.update(struct.pack(">I", seq))
        h.update(body)
        return h.digest()

    def send(self, kind, payload=b""):
        if len(payload) > PAYLOAD_MAX:
            raise BackChannelError(f"a message of {len(payload)} bytes is more than the back "
                                   f"channel carries ({PAYLOAD_MAX} bytes)")
        body = struct.pack(">BI", kind, self.rank) + bytes(payload)
        with self._send_lock:
            mac = self._mac(TO_RUNTIME, self.send_seq, body)
            self.send_seq += 1
            self.sock.sendall(struct.pack(">I", len(mac) + len(body)) + mac + body)

    def _check_length(self, length):
        if length < MAC_LEN + BODY_HEAD or length > LEN_MAX:
            raise BackChannelError(f"bad frame length {length} (the protocol allows "
                                   f"{MAC_LEN + BODY_HEAD} to {LEN_MAX})")

    def _open(self, mac, body):
        """Verify one frame from the kernel; (kind, payload)."""
        if not hmac.compare_digest(mac, self._mac(TO_RANK, self.recv_seq, body)):
            raise BackChannelError("a frame from the kernel failed authentication")
        self.recv_seq += 1
        kind, rank = struct.unpack(">BI", body[:BODY_HEAD])
        return kind, body[BODY_HEAD:]

    def recv(self):
        (length,) = struct.unpack(">I", self._recv_exact(4))
        self._check_length(length)
        mac = self._recv_exact(MAC_LEN)
        body = self._recv_exact(length - MAC_LEN)
        return self._open(mac, body)

    def close(self):
        self.sock.close()


# ---- the run's key, for secrets of the run ---------------------------------------

_RUN_KEY = None     # the back channel's key: every rank of the run holds it, no one else


def hold_run_key(key):
    """Keep KEY, the back channel's key this rank was started with, for
    run_secret."""
    global _RUN_KEY
    _RUN_KEY = key


def run_secret(label):
    """A secret of this run for LABEL (bytes): HMAC-SHA256 of LABEL under the
    back channel's key, which every rank of the run has and nobody else; the
    key itself stays here. None outside a rank of distkernel's."""
    if _RUN_KEY is None:
        return None
    return hmac.new(_RUN_KEY, b"distkernel/" + label, hashlib.sha256).digest()
