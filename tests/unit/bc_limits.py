"""The rank side of the back channel's size limit, against the kernel's.

Run by tests/unit/test_job.c with the C constants as arguments:
    bc_limits.py PAYLOAD_MAX LEN_MAX TASK_MAX MAC_LEN
Exits 0 when the rank accepts exactly what the kernel sends and refuses one
byte more, and when _serve treats a closed channel as the end and a bad frame
as an error, and when a frame of the rank's own sent back to it is refused.
Nothing of the frame's size is allocated: the length field is
judged before its bytes are read.
"""
import socket
import struct
import sys
import threading

import cloudpickle

from distkernel import _backchannel as bc
from distkernel import _rank


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def recv_with_length(length):
    """What BackChannel.recv raises when a frame announces LENGTH and the
    kernel then closes the connection."""
    ours, theirs = socket.socketpair()
    ch = bc.BackChannel.__new__(bc.BackChannel)
    ch.sock, ch.key, ch.rank, ch.nonce, ch.send_seq, ch.recv_seq = ours, b"k" * 32, 0, b"n" * 32, 0, 0
    theirs.sendall(struct.pack(">I", length))
    theirs.close()
    try:
        ch.recv()
    except bc.BackChannelError as e:
        return e
    finally:
        ours.close()
    return None


def reflected():
    """What BackChannel.recv raises when the kernel's side sends back the very
    HELLO frame the rank sent, with the seq the rank expects next (a man in
    the middle reflecting it): the direction in the MAC must refuse it."""
    ours, theirs = socket.socketpair()
    ch = bc.BackChannel.__new__(bc.BackChannel)
    ch.sock, ch.key, ch.rank, ch.nonce, ch.send_seq, ch.recv_seq = ours, b"k" * 32, 0, b"n" * 32, 0, 0
    ch._send_lock = threading.Lock()
    ch.send(bc.HELLO)
    frame = theirs.recv(1 << 16)
    theirs.sendall(frame)
    theirs.close()
    try:
        ch.recv()
    except bc.BackChannelError as e:
        return e
    finally:
        ours.close()
    return None


class FakeChannel:
    def __init__(self, exc):
        self.exc, self.sent = exc, []

    def send(self, kind, payload=b""):
        self.sent.append(kind)

    def recv(self):
        raise self.exc


def main():
    payload_max, len_max, task_max, mac_len = map(int, sys.argv[1:5])
    check(bc.PAYLOAD_MAX == payload_max, f"PAYLOAD_MAX {bc.PAYLOAD_MAX} != C's {payload_max}")
    check(bc.LEN_MAX == len_max, f"LEN_MAX {bc.LEN_MAX} != C's {len_max}")
    # The largest TASK the kernel sends: MAC, type, rank, round, payload.
    largest = mac_len + 5 + 4 + task_max
    e = recv_with_length(largest)
    check(isinstance(e, bc.ChannelClosed), f"a task of {task_max} bytes was refused: {e!r}")
    e = recv_with_length(largest + 1)
    check(type(e) is bc.BackChannelError and "bad frame length" in str(e),
          f"a frame one byte over the limit was not refused: {e!r}")
    # A frame of the rank's own, sent back to it, does not verify.
    e = reflected()
    check(type(e) is bc.BackChannelError and "authentication" in str(e),
          f"a reflected HELLO was not refused: {e!r}")
    # _serve: a closed channel ends the rank cleanly; a bad frame is an error.
    task = struct.pack(">I", 1) + cloudpickle.dumps(
        {"kind": "function", "fn": int, "args": (), "kwargs": {}})
    check(_rank._serve(FakeChannel(bc.ChannelClosed("closed")), task) == 0,
          "a closed channel did not end _serve with 0")
    chan = FakeChannel(bc.BackChannelError("bad frame length"))
    try:
        rc = _rank._serve(chan, task)
    except bc.BackChannelError:
        rc = "raised"
    check(rc == "raised", f"a bad frame ended _serve with {rc!r} instead of an error")
    check(chan.sent == [bc.RESULT], f"_serve sent {chan.sent}")
    print("ok")


main()
