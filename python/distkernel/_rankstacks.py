"""How the kernel can ask a rank where it is: its stacks, dumped on a signal.

At an end the kernel signals the rank and faulthandler writes every thread's
stack to the rank's file from the signal handler (arm_stacks); while the rank
runs on, a thread of its own answers live samples (_start_sampler). Both come
with the rank's last collective (the flight line, _flight.py). The request's
other side is runtime/stacks/dk_stackreq.h.
"""

import os

from distkernel import _flight
from distkernel._rankio import Notes


def arm_stacks():
    """Let the kernel ask for this rank's stacks (runtime/stacks/dk_stackreq.h): on
    its signal faulthandler writes every thread's stack to the rank's file
    (DISTKERNEL_STACKS) from the signal handler, without the GIL, and the
    handler it chains to (_distkernel_stacks, runtime/rank/dk_rankstacks.h) writes
    the end line. The ready line says the rank may be signalled, and which pid
    to signal (a warm rank is not the process the kernel started). A plain
    python3 has no _distkernel_stacks: it is never asked."""
    path = os.environ.pop("DISTKERNEL_STACKS", None)
    if not path:
        return
    try:
        import _distkernel_stacks
    except ImportError:
        return
    import faulthandler
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return      # not asked; the rank runs as before
    # The file is made by whoever started the rank, in a 0700 folder; a
    # folder made again by another user after that one was removed would
    # hand them this rank's stacks.
    import stat
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        Notes.say(f"the stacks file {path} is not a file of this user's (owner uid "
                  f"{st.st_uid}): this rank's stacks cannot be asked for")
        return
    try:
        signum = _distkernel_stacks.arm(fd)
        faulthandler.register(signum, file=fd, all_threads=True, chain=True)
        sampler = _start_sampler(fd, _distkernel_stacks.SAMPLE, _distkernel_stacks.END.encode())
        ready = b"%s%d" % (_distkernel_stacks.READY.encode(), os.getpid())
        if sampler:
            ready += b"%s%d" % (_distkernel_stacks.READY_SAMPLER.encode(), sampler)
        os.write(fd, ready + b"\n")
    except (OSError, RuntimeError, ValueError):
        pass


def _start_sampler(fd, signum, end):
    """Answer the kernel's live samples (runtime/stacks/dk_stackreq.h,
    DK_SAMPLE_SIGNAL) while the rank runs on, from a thread of their own: the
    kernel sends the signal to this thread alone (tgkill), which blocks it and
    takes it with sigwait. So no other thread is interrupted (a blocking
    system call would see EINTR, and torch's rendezvous fails on it), and the
    rank's signal mask and dispositions, which the programs it starts
    inherit, stay as they were but for a handler of SIGNUM that does nothing
    (a handler, unlike an ignored signal, is not inherited across exec). The
    dump waits for the GIL: a main thread holding it in a C loop does not
    answer a sample (the end's request, on the other signal, still reaches
    it). The kernel asks this thread first at an end as well, since only an
    answer made with the GIL can end in the rank's last collective (the
    flight line, _flight.py). Returns the thread's id, or 0 when it did not
    start."""
    import faulthandler
    import signal
    import threading

    wanted = {signum}
    started = threading.Event()
    tid = [0]

    def answer():
        signal.pthread_sigmask(signal.SIG_BLOCK, wanted)
        tid[0] = threading.get_native_id()
        started.set()
        while True:
            signal.sigwait(wanted)
            # Samples that queued while this thread waited for the GIL: one answer.
            while signal.sigtimedwait(wanted, 0) is not None:
                pass
            try:
                faulthandler.dump_traceback(file=fd, all_threads=True)
                os.write(fd, _flight.line().encode() + end)
            except OSError:
                return

    signal.signal(signum, lambda *_: None)
    threading.Thread(target=answer, name="distkernel-stacks-sampler", daemon=True).start()
    started.wait(5)
    return tid[0]


def stacks_signals():
    """The signals the kernel asks for stacks with: at an end, and for a live
    sample; none when this is not distkernel-rank."""
    try:
        import _distkernel_stacks
    except ImportError:
        return ()
    return (_distkernel_stacks.SIGNAL, _distkernel_stacks.SAMPLE)
