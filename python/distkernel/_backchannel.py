"""The rank side of the runtime's back channel (see runtime/dk_job.h).

Every frame is  u32 length | 32-byte MAC | body,  MAC = HMAC-SHA256(key, nonce |
u32 seq | body),  body = u8 type | u32 rank | payload. The nonce is what the
runtime writes first on the connection; seq counts this side's frames.
A persistent job sends TASK frames (u32 round | payload) instead of one
PAYLOAD, and each answer's payload starts with that u32 round.
"""

import hashlib
import hmac
import socket
import struct

HELLO, PAYLOAD, RESULT, ERROR, TASK = 1, 2, 3, 4, 5
MAC_LEN = 32
# The protocol's one size limit, as runtime/dk_backchan.h has it (and
# tests/unit/test_job.c checks): the bytes after a frame's u8 type | u32 rank,
# either way. A frame's length field covers the MAC, type, rank and those.
PAYLOAD_MAX = 1 << 30
MAX_FRAME = MAC_LEN + 5 + PAYLOAD_MAX


class BackChannelError(Exception):
    """The channel broke its protocol (a bad frame, a failed MAC)."""


class ChannelClosed(BackChannelError):
    """The kernel closed the channel: how started ranks are told to stop."""


class BackChannel:
    def __init__(self, path, key, rank):
        self.key = key
        self.rank = rank
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.nonce = self._recv_exact(32)
        self.send_seq = 0
        self.recv_seq = 0

    def _recv_exact(self, n):
        chunks, left = [], n
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ChannelClosed("the kernel closed the back channel")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _mac(self, seq, body):
        h = hmac.new(self.key, digestmod=hashlib.sha256)
        h.update(self.nonce)
        h.update(struct.pack(">I", seq))
        h.update(body)
        return h.digest()

    def send(self, kind, payload=b""):
        if len(payload) > PAYLOAD_MAX:
            raise BackChannelError(f"a message of {len(payload)} bytes is more than the back "
                                   f"channel carries ({PAYLOAD_MAX} bytes)")
        body = struct.pack(">BI", kind, self.rank) + bytes(payload)
        mac = self._mac(self.send_seq, body)
        self.send_seq += 1
        self.sock.sendall(struct.pack(">I", len(mac) + len(body)) + mac + body)

    def recv(self):
        (length,) = struct.unpack(">I", self._recv_exact(4))
        if length < MAC_LEN + 5 or length > MAX_FRAME:
            raise BackChannelError(f"bad frame length {length} (the protocol allows "
                                   f"{MAC_LEN + 5} to {MAX_FRAME})")
        mac = self._recv_exact(MAC_LEN)
        body = self._recv_exact(length - MAC_LEN)
        if not hmac.compare_digest(mac, self._mac(self.recv_seq, body)):
            raise BackChannelError("a frame from the kernel failed authentication")
        self.recv_seq += 1
        kind, rank = struct.unpack(">BI", body[:5])
        return kind, body[5:]

    def close(self):
        self.sock.close()
