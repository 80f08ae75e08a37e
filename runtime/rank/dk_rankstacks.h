/*
 * dk_rankstacks: the rank's side of dk_stackreq, the end line after a dump.
 *
 * Part of distkernel-rank only (rank_main.c registers it before CPython
 * starts), as the built-in module _distkernel_stacks that
 * python/distkernel/_rankstacks.py uses. faulthandler writes a rank's stacks from
 * its signal handler, without the GIL; but its dump has no end a reader can
 * tell from a pause, and the kernel must not wait out a silence for each
 * rank. So a C handler of ours, which needs no GIL either, is installed on
 * the signal first, and faulthandler is registered over it with chain=True:
 * after the dump it calls the previous handler, ours, which writes
 * DK_STACKS_END (dk_stackreq.h) to the same file.
 *
 * Python API:
 *   arm(fd) -> signum
 *       install the end-line handler for DK_STACKS_SIGNAL, writing to FD
 *       (which stays open for the process's life); returns the signal for
 *       faulthandler.register(signum, file=fd, all_threads=True, chain=True).
 *   SIGNAL
 *       that signal (a forked warm rank ignores it until it is armed).
 *   SAMPLE
 *       the live sample's signal (dk_stackreq_sample), sent to a thread of
 *       the rank's own, which blocks it and takes it with sigwait.
 *   READY_SAMPLER
 *       what follows the pid in the ready line, before that thread's id.
 *   END
 *       the line written after each dump (DK_STACKS_END).
 *   READY
 *       the start of the line the rank writes once armed, before its pid.
 */
#ifndef DK_RANKSTACKS_H
#define DK_RANKSTACKS_H

#include "dk_pyabi.h"

#define DK_RANKSTACKS_MODULE "_distkernel_stacks"

/* For PyImport_AppendInittab, before the interpreter starts. */
PyObject *dk_rankstacks_init(void);

#endif
