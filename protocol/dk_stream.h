/*
 * dk_stream: the cell's stdout and stderr, from Python and from fd 1 and 2.
 *
 * Python's sys.stdout/sys.stderr write into a per-stream buffer here; fd 1 and 2
 * are replaced by pipes whose bytes (C extensions, `!cmd`, subprocesses) land in
 * the same buffers. A reader thread always drains the pipes, without the GIL, so a
 * 1 MB printf from C while the GIL is held never blocks. Buffers are published as
 * `stream` messages at most every DK_STREAM_INTERVAL_MS, as soon as they hold
 * DK_STREAM_CHUNK bytes, and whenever the kernel flushes (before every reply,
 * display message and input_request): many writes make few messages.
 *
 * When a frontend reads IOPub slower than output comes (dk_iopub refuses the
 * offer), a buffer grows to DK_STREAM_BUF_MAX and then its writers wait: a rank
 * blocks on its pipe, Python on its write. After BACKPRESSURE_MS (dk_stream.c)
 * the kernel stops waiting for that frontend: finished lines that do not fit are
 * dropped and counted, and the next text published starts with a notice saying
 * how much was not shown and where the full output is (dk_stream_set_thin_hint).
 * Kernel memory stays bounded and nothing the frontend is shown is out of order.
 *
 * Python writes first drain the pipes, so `print(); os.system("echo"); print()`
 * keeps its order whenever the child's output has reached the pipe.
 */
#ifndef DK_STREAM_H
#define DK_STREAM_H

#include "dk_iopub.h"

#include <stdbool.h>
#include <stddef.h>

#define DK_STREAM_INTERVAL_MS 50
#define DK_STREAM_CHUNK 65536
#define DK_STREAM_BUF_MAX (4 * DK_STREAM_CHUNK)

typedef enum { DK_STDOUT = 0, DK_STDERR = 1 } dk_stream_name_t;

typedef struct dk_stream_t dk_stream_t;

/* Start capturing: fd 1 and 2 become pipes drained by a reader thread; output is
 * published on IOPUB (borrowed) under its current parent. Returns NULL on failure
 * with a reason in ERR. The original fd 2 is dup'ed first: dk_stream_log_fd gives
 * it, for the kernel's own log lines. */
dk_stream_t *dk_stream_new(dk_iopub_t *iopub, char *err, size_t errlen);

/* Stop the reader, publish what is left, restore fd 1 and 2. */
void dk_stream_destroy(dk_stream_t **self_p);

/* Append LEN bytes written by Python to stream NAME, cleaned to UTF-8 as the
 * pipes' bytes are. Thread-safe. */
void dk_stream_write(dk_stream_t *self, dk_stream_name_t name, const char *buf, size_t len);

/* Append LEN bytes of text from elsewhere (rank output relayed by the kernel),
 * which must be valid UTF-8 without NUL bytes, as dk_lines gives it: it is not
 * scanned again. Unlike dk_stream_write it does not first drain fd 1/2: their order relative to
 * another process's output means nothing, and a relay of many lines would pay
 * two read() calls per call. Thread-safe. */
void dk_stream_append(dk_stream_t *self, dk_stream_name_t name, const char *buf, size_t len);

/* Pipes for the fd 1 and 2 of a process about to be forked from the kernel
 * (os.fork, multiprocessing, DataLoader workers): WRITE_FDS gets their write
 * ends (O_CLOEXEC), which the child puts on fd 1 and 2 and the kernel closes
 * once the child exists. What the child, and whatever it starts, writes there
 * belongs to the cell running now: while that cell runs it joins the cell's
 * output in order; once another cell runs it is published under this one, so
 * a child that outlives its cell never writes into a later cell. The pipes
 * close when every writer is gone. Returns -1 (nothing made) when too many
 * forked children are alive, or without descriptors: the child then writes
 * to the kernel's own fd 1 and 2. Thread-safe. */
int dk_stream_fork_source(dk_stream_t *self, int write_fds[2]);

/* Flush C stdio, drain the pipes and publish both buffers now. Thread-safe. */
void dk_stream_flush(dk_stream_t *self);

/* Publish both buffers now if IOPub takes them, without draining the pipes or
 * queueing; false if a frontend is behind and text is still waiting. For what
 * may be skipped when IOPub is full (a progress update), so that it never
 * overtakes the text before it. Thread-safe. */
bool dk_stream_offer(dk_stream_t *self);

/* Where the full output is while output may be thinned, as the end of the notice
 * ("; every rank's full output is in DIR"); NULL for none. Copied. */
void dk_stream_set_thin_hint(dk_stream_t *self, const char *hint);

/* Lines and bytes thinned since the kernel started. */
void dk_stream_thinned(dk_stream_t *self, unsigned long long *lines, unsigned long long *bytes);

/* The kernel's original stderr, for its own log. */
int dk_stream_log_fd(const dk_stream_t *self);

#endif
