"""What one rank process runs (started by distkernel-rank, runtime/rank/rank_main.c,
which calls main here, or template_main in a warm-start template).

It connects to the kernel's back channel, receives the job (a cell with the
notebook names it uses, or a function with its arguments, pickled with
cloudpickle), runs it as this rank, and sends back the value or the error; a
started rank (a persistent job) serves task after task until the kernel
closes the channel. This file is that conversation; what it uses has a module
of its own:

  _rankjob.py     one job: unpickled, run in __main__, its value or error
  _rankpath.py    where the rank runs and what it imports from
  _rankio.py      its stdout and stderr (buffered, flushed), notes for its log
  _rankstacks.py  its stacks, when the kernel asks where it is
  _rendezvous.py  MASTER_PORT from rank 0, and rank 0's store held at the end
  _template.py    the warm-start template, which forks ranks that run main
"""

import os
import sys

from distkernel import _backchannel as bc
from distkernel._rankpath import enter_kernel_folder, take_path_notes
from distkernel._rankio import Notes, buffer_output
from distkernel._rankjob import error_payload, pickle_value, run_job
from distkernel._rankstacks import arm_stacks
from distkernel._rendezvous import check_out_of_store, master_port_from_rank0


def main():
    try:
        return _main()
    except KeyboardInterrupt:
        # Stopped before the user's code ran (another rank failed first, or the
        # cell was interrupted): nothing of ours is worth a traceback.
        return 130
    finally:
        # Every rank, cold or warm: a warm rank 0 waits for all of them.
        check_out_of_store()


def _main():
    take_path_notes(say=True)
    arm_stacks()
    enter_kernel_folder()
    buffer_output()
    path = os.environ.pop("DISTKERNEL_BC")
    key = bytes.fromhex(os.environ.pop("DISTKERNEL_BC_KEY"))
    bc.hold_run_key(key)
    rank = int(os.environ["RANK"])
    channel = bc.BackChannel(path, key, rank)
    channel.send(bc.HELLO)
    Notes.attach(channel)
    held = master_port_from_rank0(channel, rank)
    kind, payload = channel.recv()
    for sock in held:
        sock.close()        # the store binds it now (the work starts)
    if kind == bc.TASK:
        return _serve(channel, payload)
    if kind != bc.PAYLOAD:
        raise bc.BackChannelError(f"expected the job, got frame type {kind}")
    from distkernel import _compat
    _compat.install()
    # distkernel-rank blocked SIGINT while Python started; from here on an
    # interrupt is the user's KeyboardInterrupt (one already pending lands now).
    import signal
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    main_ns = sys.modules["__main__"].__dict__
    try:
        box = [payload]
        del payload
        value = run_job(box, main_ns)
    except BaseException as exc:  # noqa: B902 - KeyboardInterrupt and SystemExit too
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            value = None
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            channel.send(bc.ERROR, error_payload(exc))
            channel.close()
            return 130 if isinstance(exc, KeyboardInterrupt) else 1
    blob = pickle_value(value)
    sys.stdout.flush()
    sys.stderr.flush()
    channel.send(bc.RESULT, blob)
    channel.close()
    return 0


class _Busy:
    """SIGINT is a KeyboardInterrupt only while a cell runs, and only once per
    cell. Between cells it is ignored: the kernel interrupts only ranks it has
    not heard from, and one whose answer was still on its way must not die of
    that interrupt; the kernel ends idle ranks by closing the channel. The
    kernel sends SIGINT again every 0.1 s until a rank answers (a rank that had
    not yet read its cell would otherwise miss it): the repeats must not cut
    short the cell's own handling of the first."""

    def __init__(self):
        self.running = False

    def __call__(self, signum, frame):
        if self.running:
            self.running = False
            raise KeyboardInterrupt


def _serve(channel, task):
    """A persistent rank: run each TASK in the same __main__ namespace, answer
    it with its round, and wait for the next, until the kernel closes the
    channel."""
    import signal

    from distkernel import _compat
    _compat.install()
    busy = _Busy()
    signal.signal(signal.SIGINT, busy)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    main_ns = sys.modules["__main__"].__dict__
    while True:
        round_no, box = task[:4], [task[4:]]
        del task
        try:
            busy.running = True
            try:
                value = run_job(box, main_ns, keep_globals=True)
            finally:
                busy.running = False
            kind, reply = bc.RESULT, pickle_value(value)
        except BaseException as exc:  # noqa: B902 - KeyboardInterrupt and SystemExit too
            busy.running = False
            if isinstance(exc, SystemExit) and exc.code in (None, 0):
                kind, reply = bc.RESULT, pickle_value(None)
            else:
                kind, reply = bc.ERROR, error_payload(exc)
        del box
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            channel.send(kind, round_no + reply)
            del reply
            frame, task = channel.recv()
        except (ConnectionError, bc.ChannelClosed):
            return 0    # the kernel closed the channel: the ranks are being stopped
        # Anything else (a frame that breaks the protocol) is this rank's
        # failure, raised: the kernel reports it with its traceback, not as a
        # clean exit.
        if frame != bc.TASK:
            raise bc.BackChannelError(f"expected a task, got frame type {frame}")


def template_main():
    """A warm-start template (distkernel-rank with DISTKERNEL_TEMPLATE): the
    ranks it forks run main (_template.py). Imported here, not above: a cold
    rank has no use for it."""
    from distkernel import _template
    return _template.serve(main)
