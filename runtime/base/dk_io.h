/*
 * dk_io: all of a buffer written to a descriptor, the loop every writer of
 * the runtime needs. write() and send() may take part of what they are given
 * (a pipe nearly full, a socket's buffer) or be interrupted by a signal
 * before taking anything; both mean "again, with what is left", and only a
 * real error (or, on a socket, a peer that takes nothing for too long) ends
 * the write.
 *
 * Two forms, for the two kinds of descriptor the runtime writes:
 *   dk_write_all  any descriptor, with write(): files, pipes, a log. It calls
 *                 nothing but write(), so a signal handler may use it.
 *   dk_send_all   a socket, with send(MSG_NOSIGNAL), so a peer that went away
 *                 is an error code (EPIPE), never a SIGPIPE that would kill
 *                 the process; and, given a timeout, the peer's silence is
 *                 bounded: a peer that takes nothing for that long is as good
 *                 as gone (ETIMEDOUT).
 *
 * tests/unit/fake_rank.c keeps its own loop: it uses none of the runtime's code.
 */
#ifndef DK_IO_H
#define DK_IO_H

#include <stddef.h>

/* Write all LEN bytes of BUF to FD. 0, or -1 with errno set: write()'s error,
 * or ENOSPC when a write took nothing. A descriptor that is non-blocking and
 * full fails with EAGAIN. Async-signal-safe (the caller keeps errno). */
int dk_write_all(int fd, const void *buf, size_t len);

/* Send all LEN bytes of BUF on socket FD, with MSG_NOSIGNAL. TIMEOUT_MS < 0:
 * wait as the socket does (a blocking socket blocks). TIMEOUT_MS >= 0: never
 * block in send (MSG_DONTWAIT); when the socket takes nothing, wait at most
 * TIMEOUT_MS for it to take more, each time. 0, or -1 with errno set:
 * send()'s or poll()'s error (EPIPE, ECONNRESET: the peer is gone), or
 * ETIMEDOUT when the peer took nothing for TIMEOUT_MS. */
int dk_send_all(int fd, const void *buf, size_t len, int timeout_ms);

#endif
