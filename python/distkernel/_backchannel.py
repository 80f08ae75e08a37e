"""The rank side of the runtime's back channel (see runtime/launch/dk_job.h).

Every frame is  u32 length | 32-byte MAC | body,  MAC = HMAC-SHA256(key, nonce |
u8 dir | u32 seq | body),  body = u8 type | u32 rank | payload. The nonce is
what the runtime writes first on the connection; dir is b"R" on what a rank
sends and b"K" on what the kernel sends, so a frame of ours sent back to us
does not verify; seq counts the sending side's frames.
A persistent job sends TASK frames (u32 round | payload) instead of one
PAYLOAD, and each answer's payload starts with that u32 round.

Over TCP (DISTKERNEL_BC=tcp:HOST:PORT, ranks on another node than the
kernel), the rank keeps trying to connect and read its nonce, with jittered
backoff, for DISTKERNEL_BC_CONNECT_TIMEOUT seconds (the kernel's own connect
deadline): a kernel taking in hundreds of ranks at once, or a port another
user floods, delays a rank but does not fail it. Once the rank has said HELLO a thread of this module carries the
rest: it replaces fd 1 and 2 with pipes and sends what they get (C-level
writes and children's included) as OUTPUT frames; a PING goes every second
(from a native thread of distkernel-rank, _distkernel_rankchan, which then
sends every frame, so that a main thread holding the GIL in a long C call
does not silence the rank; from this thread under a plain python3); it reads
the kernel's frames, so that a kernel silent for longer than
DISTKERNEL_BC_HEARTBEAT seconds (killed, its node gone) ends this rank and its
process group; and an answer (RESULT, ERROR) goes only after every byte
written to fd 1 and 2 before it. Closing shuts down our side and waits for the
kernel's close, so nothing sent is still in flight when the rank exits.
"""

import collections
import hashlib
import hmac
import os
import random
import select
import signal
import socket
import struct
import threading
import time

try:
    # distkernel-rank has it built in (runtime/rank/dk_rankchan.c): the sending side
    # in C, with PINGs from a native thread that needs no GIL. A plain python3
    # has not; its PINGs then come from the Python thread below.
    import _distkernel_rankchan as _native
except ImportError:
    _native = None

HELLO, PAYLOAD, RESULT, ERROR, TASK, OUTPUT, PING, INTERRUPT, PORT, STACKS = range(1, 11)
MAC_LEN = 32
# The direction byte of the MAC (dk_backchan.h, DK_BC_DIR_TO_*).
TO_KERNEL = b"R"
TO_RANK = b"K"
# The protocol's one size limit, as runtime/channel/dk_backchan.h has it (and
# tests/unit/test_job.c checks): the bytes after a frame's u8 type | u32 rank,
# either way. A frame's length field covers the MAC, type, rank and those.
PAYLOAD_MAX = 1 << 30
MAX_FRAME = MAC_LEN + 5 + PAYLOAD_MAX
# OUTPUT frames: u8 fd | u8 flags | at most OUTPUT_MAX bytes (dk_backchan.h).
OUTPUT_MAX = 64 << 10
OUTPUT_CAUGHT_UP = 0x01
OUTPUT_LOG = 3      # OUTPUT's fd for the rank's log only (DK_BC_OUTPUT_LOG)
STACKS_MAX = 128 << 10  # the most bytes of a STACKS answer (DK_BC_STACKS_MAX)
PING_S = 1.0
HEARTBEAT_DEFAULT_S = 5.0
CONNECT_DEFAULT_S = 120.0       # dk_job.h DK_JOB_CONNECT_DEFAULT_S
CONNECT_PAUSE_MAX_S = 2.0       # the longest pause between two tries to connect


class BackChannelError(Exception):
    """The channel broke its protocol (a bad frame, a failed MAC)."""


class ChannelClosed(BackChannelError):
    """The kernel closed the channel: how started ranks are told to stop."""


class ConnectFailed(BackChannelError):
    """The kernel's address did not answer (or refused) within the deadline."""


def connect_deadline():
    """How long after its start a rank keeps trying to connect
    (DISTKERNEL_BC_CONNECT_TIMEOUT: the kernel's own deadline for it, after
    which it counts the rank lost with its node)."""
    return float(os.environ.get("DISTKERNEL_BC_CONNECT_TIMEOUT") or CONNECT_DEFAULT_S)


def heartbeat_deadline():
    """The silence after which the kernel counts as gone (DISTKERNEL_BC_HEARTBEAT)."""
    return float(os.environ.get("DISTKERNEL_BC_HEARTBEAT") or HEARTBEAT_DEFAULT_S)


def parse_address(address):
    """("unix", path) or ("tcp", (host, port)) from DISTKERNEL_BC."""
    if not address.startswith("tcp:"):
        return "unix", address
    host, _, port = address[4:].rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit():
        raise BackChannelError(f"DISTKERNEL_BC={address!r} is not tcp:HOST:PORT")
    return "tcp", (host, int(port))


class BackChannel:
    def __init__(self, path, key, rank):
        self.key = key
        self.rank = rank
        kind, where = parse_address(path)
        self.remote = kind == "tcp"
        if self.remote:
            self.nonce = self._connect_tcp(where)
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(where)
            self.nonce = self._recv_exact(32)
        self.send_seq = 0
        self.recv_seq = 0
        self._send_lock = threading.Lock()
        self._remote = None

    def _connect_tcp(self, where):
        """Connect to the kernel on another node and read its nonce, trying
        again with backoff until the connect deadline (connect_deadline, from
        the first try: about the rank's start, which the kernel counts from): a
        kernel busy taking in hundreds of ranks, or a listener another user
        floods, is a reason to wait, not to fail the run. Each try is bounded
        by the heartbeat deadline: an address whose packets are dropped (a
        firewall, a wrong route) would otherwise hold one try for the system's
        connect timeout (about two minutes). Returns the nonce."""
        per_try = heartbeat_deadline()
        give_up = time.monotonic() + connect_deadline()
        host, port = where
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        pause, tries = 0.05, 0
        while True:
            tries += 1
            left = give_up - time.monotonic()
            try:
                self.sock = socket.create_connection(where, timeout=max(0.5, min(per_try, left)))
            except OSError as exc:
                why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
                failed = (f"could not connect to the kernel's back channel at {shown} within "
                          f"{connect_deadline():g} s ({tries} tries; the last: {why}); this "
                          f"node must reach that address and port over TCP (a firewall or a "
                          f"route may be in the way, or the kernel is gone)")
            else:
                try:
                    self.sock.settimeout(max(0.5, min(per_try, give_up - time.monotonic())))
                    nonce = self._recv_exact(32)
                except (TimeoutError, ChannelClosed, OSError) as exc:
                    self.sock.close()
                    failed = (f"the kernel's back channel at {shown} accepted the connection "
                              f"but did not start it within {connect_deadline():g} s ({tries} "
                              f"tries; the last: {exc or type(exc).__name__})")
                else:
                    self.sock.settimeout(None)
                    self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return nonce
            left = give_up - time.monotonic()
            if left <= 0:
                raise ConnectFailed(failed) from None
            # Jittered, so ranks refused together do not come back together;
            # never past the deadline, where the last try is made.
            time.sleep(min(pause * (0.5 + random.random()), left))
            pause = min(pause * 2, CONNECT_PAUSE_MAX_S)

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
        if self._remote is not None and kind in (RESULT, ERROR):
            self._remote.flush_output()     # what the rank wrote comes first
        self._send(kind, payload)
        if kind == HELLO and self.remote and self._remote is None:
            self._remote = _Remote(self)

    def _send(self, kind, payload=b""):
        if self._remote is not None and self._remote.native:
            try:
                _native.send(kind, payload)
            except TimeoutError:
                self._remote._silent("the kernel took nothing for "
                                     f"{self._remote.deadline:g} s")
            return
        body = struct.pack(">BI", kind, self.rank) + bytes(payload)
        with self._send_lock:
            mac = self._mac(TO_KERNEL, self.send_seq, body)
            self.send_seq += 1
            frame = struct.pack(">I", len(mac) + len(body)) + mac + body
            if self._remote is None:
                self.sock.sendall(frame)
            else:
                self._remote.sendall(frame)

    def _check_length(self, length):
        if length < MAC_LEN + 5 or length > MAX_FRAME:
            raise BackChannelError(f"bad frame length {length} (the protocol allows "
                                   f"{MAC_LEN + 5} to {MAX_FRAME})")

    def _open(self, mac, body):
        """Verify one frame from the kernel; (kind, payload)."""
        if not hmac.compare_digest(mac, self._mac(TO_RANK, self.recv_seq, body)):
            raise BackChannelError("a frame from the kernel failed authentication")
        self.recv_seq += 1
        kind, rank = struct.unpack(">BI", body[:5])
        return kind, body[5:]

    def recv(self):
        if self._remote is not None:
            return self._remote.next_frame()
        while True:
            (length,) = struct.unpack(">I", self._recv_exact(4))
            self._check_length(length)
            mac = self._recv_exact(MAC_LEN)
            body = self._recv_exact(length - MAC_LEN)
            kind, payload = self._open(mac, body)
            if kind != PING:
                return kind, payload

    def close(self):
        if self._remote is not None:
            self._remote.close()
        self.sock.close()


def _interrupt_self():
    """The kernel's interrupt, for a rank its launcher (srun) does not pass a
    SIGINT to: SIGINT to this rank's process group when it leads one (its
    children get it too, as a local rank's group does), else to itself."""
    try:
        if os.getpgrp() == os.getpid():
            os.killpg(0, signal.SIGINT)
        else:
            os.kill(os.getpid(), signal.SIGINT)
    except OSError:
        pass


class _Remote:
    """The thread of a rank on another node: output, heartbeats, and reading
    the kernel's frames (see the top)."""

    def __init__(self, channel):
        self.ch = channel
        self.deadline = heartbeat_deadline()
        self.frames = collections.deque()
        self.cond = threading.Condition()
        self.closed = False         # the kernel closed (or the channel broke)
        self.error = None
        self.closing = False        # we have shut down our side
        self.heard_at = time.monotonic()
        self.out_lock = threading.Lock()
        self.inbuf = bytearray()
        # The launcher's stderr, kept for the one line said when the kernel
        # goes silent (fd 2 is ours from here on).
        self.launcher_err = os.dup(2)
        os.set_inheritable(self.launcher_err, False)
        self.pipes = {}
        for fd in (1, 2):
            r, w = os.pipe()
            os.dup2(w, fd)
            os.close(w)
            os.set_blocking(r, False)
            self.pipes[fd] = r
        # Heartbeats and output that a main thread holding the GIL (a long C
        # call) cannot stop: from here on frames are sent by C, and PINGs and
        # fd 1 and 2 by a native thread, which owns the pipes.
        self.native = _native is not None
        if self.native:
            _native.attach(channel.sock.fileno(), channel.key, channel.nonce, channel.rank,
                           channel.send_seq, self.deadline, self.launcher_err)
            _native.start(PING_S, self.pipes[1], self.pipes[2])
            self.pipes = {}
        self.thread = threading.Thread(target=self._run, name="distkernel-backchannel",
                                       daemon=True)
        self.thread.start()

    def sendall(self, data):
        """Send DATA; a kernel that takes none of it for the deadline is as
        gone as one that says nothing (however long the whole takes)."""
        view = memoryview(data)
        while view:
            try:
                n = self.ch.sock.send(view[:1 << 20], socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                _, writable, _ = select.select([], [self.ch.sock], [], self.deadline)
                if not writable:
                    self._silent()
                continue
            view = view[n:]

    # -- output --------------------------------------------------------------

    def _pump(self, fd, drain):
        """Send what fd FD's pipe holds: one read, or (DRAIN) until it is empty.
        False once the pipe is at EOF."""
        r = self.pipes.get(fd)
        if r is None:
            return False
        with self.out_lock:
            while True:
                try:
                    data = os.read(r, OUTPUT_MAX)
                except BlockingIOError:
                    return True
                except InterruptedError:
                    continue
                if not data:
                    os.close(r)
                    del self.pipes[fd]
                    return False
                flags = OUTPUT_CAUGHT_UP if len(data) < OUTPUT_MAX else 0
                if not self.closing and not self.closed:
                    try:
                        self.ch._send(OUTPUT, struct.pack(">BB", fd, flags) + data)
                    except OSError:
                        pass    # the kernel is gone: the pipe is still drained, and
                                # _run ends this rank within the deadline
                if not drain:
                    return True

    def flush_output(self):
        if self.native:
            _native.flush()
            return
        for fd in (1, 2):
            self._pump(fd, drain=True)

    # -- the kernel's frames ---------------------------------------------------

    def _read_socket(self):
        try:
            data = self.ch.sock.recv(1 << 20)
        except (ConnectionError, OSError) as exc:
            self._end(ChannelClosed(f"the back channel broke: {exc}"))
            return
        if not data:
            self._end(None)
            return
        self.heard_at = time.monotonic()
        self.inbuf += data
        try:
            while len(self.inbuf) >= 4:
                (length,) = struct.unpack(">I", self.inbuf[:4])
                self.ch._check_length(length)
                if len(self.inbuf) < 4 + length:
                    break
                frame = bytes(self.inbuf[4:4 + length])
                del self.inbuf[:4 + length]
                kind, payload = self.ch._open(frame[:MAC_LEN], frame[MAC_LEN:])
                if kind == INTERRUPT:
                    _interrupt_self()
                elif kind == STACKS:
                    self._send_stacks()
                elif kind != PING:
                    with self.cond:
                        self.frames.append((kind, payload))
                        self.cond.notify_all()
        except BackChannelError as exc:
            self._end(exc)

    def _send_stacks(self):
        """The kernel asks where this rank is (runtime/stacks/dk_stackreq.h): every
        thread's stack as faulthandler writes it, through a file of this
        node (a pipe could fill up before it is read), its tail if long.
        This thread needs the GIL for it: a main thread that holds the GIL
        in a C loop keeps the answer back, and the kernel's wait ends. With
        the GIL, the answer ends in the rank's last collective when torch's
        flight recorder has one (_flight.py)."""
        import faulthandler
        import tempfile
        try:
            with tempfile.TemporaryFile() as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
                from distkernel import _flight
                os.write(f.fileno(), _flight.line().encode())  # after faulthandler's, by fd
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - STACKS_MAX))
                dump = f.read()
            self.ch._send(STACKS, dump)
        except OSError:
            pass    # no file on this node, or the channel broke: no answer

    def _readable_now(self):
        try:
            return bool(select.select([self.ch.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return False

    def _end(self, error):
        with self.cond:
            self.closed = True
            self.error = error
            self.cond.notify_all()

    def next_frame(self):
        with self.cond:
            while not self.frames and not self.closed:
                self.cond.wait()
            if self.frames:
                return self.frames.popleft()
            if self.error is not None and not isinstance(self.error, ChannelClosed):
                raise self.error
            raise ChannelClosed("the kernel closed the back channel")

    # -- the thread ------------------------------------------------------------

    def _silent(self, why=None):
        """The kernel has said nothing past the deadline: it is gone (killed,
        its node lost, the network cut). Nothing of this rank may outlive it."""
        why = why or f"nothing heard from the kernel for {time.monotonic() - self.heard_at:.1f} s"
        msg = f"distkernel: rank {self.ch.rank}: {why}; ending this rank\n"
        try:
            os.write(self.launcher_err, msg.encode())
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    def _run(self):
        next_ping = time.monotonic() + PING_S
        closed_at = None
        while True:
            with self.cond:
                reading = not self.closed
            now = time.monotonic()
            if not reading and not self.closing:
                # The kernel closed the channel while this rank still had work:
                # killed (SIGKILL shows here as a close, not as silence), or it
                # refused us. A started rank between cells exits on that close
                # by itself; give it the deadline, then end whatever is left.
                closed_at = closed_at or now
                if now - closed_at > self.deadline:
                    self._silent("the kernel closed the back channel "
                                 f"{now - closed_at:.1f} s ago")
            elif not reading and not self.pipes:
                return      # (the native thread, if any, goes on until stop)
            if now >= next_ping:
                next_ping = now + PING_S
                if reading and not self.closing and not self.native:
                    try:
                        self.ch._send(PING)
                    except OSError:
                        pass        # its reading side says what happened
            fds = list(self.pipes.values()) + ([self.ch.sock] if reading else [])
            wake = next_ping if closed_at is None else min(next_ping, closed_at + self.deadline)
            try:
                ready, _, _ = select.select(fds, [], [], max(0.0, wake - time.monotonic()))
            except (OSError, ValueError):
                ready = []          # a pipe closed under us by flush_output
            if self.ch.sock in ready:
                self._read_socket()
            # Judged only after a look at the socket: time spent blocked in
            # our own sends (a busy kernel) is not the kernel's silence, nor is
            # time this thread waited for the GIL (a main thread in a long C
            # call) after that select: look again, now, before the verdict.
            elif reading and time.monotonic() - self.heard_at > self.deadline:
                if self._readable_now():
                    self._read_socket()
                else:
                    self._silent()
            for fd, r in list(self.pipes.items()):
                if r in ready:
                    self._pump(fd, drain=False)

    def close(self):
        """Every byte written so far to fd 1 and 2, then our end, then wait
        (up to the deadline) for the kernel to read all and close."""
        self.flush_output()
        with self.out_lock:
            self.closing = True
        if self.native:
            _native.stop()      # no PING after our end is shut
        try:
            self.ch.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        end = time.monotonic() + self.deadline
        with self.cond:
            while not self.closed and time.monotonic() < end:
                self.cond.wait(end - time.monotonic())
