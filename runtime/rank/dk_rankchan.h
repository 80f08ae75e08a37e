/*
 * dk_rankchan: the sending side of a remote rank's back channel, in C.
 *
 * Part of distkernel-rank only (rank_main.c registers it before CPython
 * starts), as the built-in module _distkernel_rankchan that
 * python/distkernel/_backchannel.py uses when it is there. Once a rank on
 * another node has said HELLO, every frame it sends goes through here, and a
 * native thread sends its PINGs and its fd 1 and 2 (OUTPUT frames): a rank
 * whose main thread holds the GIL in a long C call (an extension that never
 * releases it) still sends heartbeats and output, and is not declared lost
 * while alive. The wire format is dk_job.h's.
 *
 * Python API (all module functions; one channel per process):
 *   attach(fd, key, nonce, rank, seq, deadline, silent_fd)
 *       take over sending on socket FD from sequence number SEQ; DEADLINE is
 *       the heartbeat deadline (s); SILENT_FD is where the one line goes when
 *       the kernel takes nothing for that long (then the rank's process group
 *       is ended, as _backchannel.py's _silent does).
 *   send(kind, payload)
 *       one frame, whole, with the GIL released while it waits for the socket.
 *       TimeoutError: the kernel took no byte for DEADLINE; OSError: the
 *       connection broke.
 *   start(interval, out_fd, err_fd)
 *       a native thread sends a PING every INTERVAL s, and what the read ends
 *       OUT_FD and ERR_FD (non-blocking pipes that are the rank's fd 1 and 2)
 *       get, as OUTPUT frames (flag 1 when a read found no more); it owns them.
 *   flush()                 send what the pipes hold now (before an answer).
 *   stop()                  detach: no frame after it (a send is an OSError,
 *                           EBADF); the thread goes on emptying the pipes, and
 *                           drops what it reads, until the process ends.
 */
#ifndef DK_RANKCHAN_H
#define DK_RANKCHAN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define DK_RANKCHAN_MODULE "_distkernel_rankchan"

/* For PyImport_AppendInittab, before the interpreter starts. */
PyObject *dk_rankchan_init(void);

#endif
