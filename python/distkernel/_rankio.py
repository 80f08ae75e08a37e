"""What a rank writes besides its value: its stdout and stderr, block-buffered
and flushed by a thread (buffer_output), and notes for its log alone (Notes).

A rank's stdout and stderr are pipes to whoever started it (the kernel, or its
node's agent); the notes go on the back channel as OUTPUT frames for fd 3,
which reach the rank's log and never the cell.
"""

import os
import struct
import sys

from distkernel import _backchannel as bc

FLUSH_INTERVAL = 0.02   # a line print()ed reaches the kernel within this
IDLE_FLUSH = 1.0        # bytes written to sys.stdout.buffer directly: within this


def buffer_output():
    """A rank's stdout and stderr are pipes to the kernel. Unbuffered or
    line-buffered, every print() is a write() (and the kernel wakes for each):
    a rank printing fast spends most of its time there. Block-buffered, a line
    could wait for a long time. So they are buffered in blocks and flushed by
    a thread FLUSH_INTERVAL after the first text written since the last
    flush, before the rank reports, and before os._exit; what a crash can
    take with it is at most the last FLUSH_INTERVAL of output.

    The thread sleeps while the rank prints nothing. A thread that woke on a
    timer instead (50 times a second) took the GIL from the training loop as
    often, and cost a CPU-bound FSDP step on two cores 7%
    (docs/performance.md); now a rank that prints once a step pays one wake
    a step at most. Bytes written below the text layer, which no text write
    announces, are flushed within IDLE_FLUSH."""
    import io
    import threading

    wake = threading.Event()
    stop = threading.Event()

    class _Stream(io.TextIOWrapper):
        def write(self, text):
            n = super().write(text)
            if not wake.is_set():
                wake.set()
            return n

    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        raw = io.FileIO(old.fileno(), "w", closefd=False)
        setattr(sys, name, _Stream(io.BufferedWriter(raw, 1 << 16),
                                   encoding="utf-8", errors="backslashreplace"))

    def flush_all():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass

    def flusher():
        while not stop.is_set():
            if wake.wait(IDLE_FLUSH) and stop.wait(FLUSH_INTERVAL):
                break
            # Cleared before the flush: a write during it wakes the next round.
            wake.clear()
            flush_all()

    thread = threading.Thread(target=flusher, name="distkernel-flush", daemon=True)
    thread.start()

    def stop_flusher():
        # Before the interpreter finalizes: a daemon thread caught holding a
        # stream's lock then makes Python abort ("could not acquire lock").
        stop.set()
        wake.set()
        thread.join(1.0)
        flush_all()

    import atexit
    atexit.register(stop_flusher)
    real_exit = os._exit

    def _exit(code):
        flush_all()
        real_exit(code)

    os._exit = _exit


_NOTES_MAX = 8      # a rank's notes about its node's folders: this many, then one line


class Notes:
    """Lines about this rank for its log only, never the cell (OUTPUT frames
    for fd 3, OUTPUT_LOG): which of its node's folders it would not
    use, and why. Said before the channel is up, they wait for it. At most
    _NOTES_MAX, then one line saying more were left unsaid: a node full of
    planted folders must not fill the log."""

    channel = None
    pending = []
    count = 0

    @classmethod
    def say(cls, text):
        import socket

        if cls.count > _NOTES_MAX:
            return
        cls.count += 1
        if cls.count > _NOTES_MAX:
            text = "more of this node's folders were refused; they are not listed"
        line = f"distkernel-rank on {socket.gethostname()}: {text}\n".encode(errors="replace")
        if cls.channel is None:
            cls.pending.append(line)
        else:
            cls._send(line)

    @classmethod
    def attach(cls, channel):
        cls.channel = channel
        for line in cls.pending:
            cls._send(line)
        cls.pending = []

    @classmethod
    def _send(cls, line):
        try:
            cls.channel.send(bc.OUTPUT, struct.pack(">BB", bc.OUTPUT_LOG, 0) + line[:4096])
        except (OSError, bc.BackChannelError):
            pass    # a channel that broke is the run's failure, said elsewhere; not a note's
