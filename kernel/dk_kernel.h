/*
 * dk_kernel: the kernel core. It owns the five sockets, maps message types to
 * handlers, wraps every request in busy/idle, and hands Python requests to the
 * embedded interpreter (dk_python). There is one kernel per process.
 *
 * Threads: the main thread owns the interpreter and serves shell (and stdin, from
 * inside input()); a control thread answers kernel_info, interrupt and shutdown
 * while a cell runs; a heartbeat thread echoes pings without the GIL; dk_stream's
 * reader drains fd 1 and 2. Only the main thread ever takes the GIL here.
 */
#ifndef DK_KERNEL_H
#define DK_KERNEL_H

#include "dk_conn.h"
#include "dk_iopub.h"
#include "dk_magic.h"
#include "dk_stream.h"
#include "dk_wire.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct dk_kernel_t dk_kernel_t;

/* Bind the sockets of CONN (taken over: the kernel clears it), start the
 * heartbeat, control and output threads. Returns NULL with a reason in ERR. */
dk_kernel_t *dk_kernel_new(dk_conn_t *conn, char *err, size_t errlen);

/* Start Python and serve until shutdown. Does not return: the process exits. */
void dk_kernel_run(dk_kernel_t *self) __attribute__((noreturn));

/* The process's kernel (NULL before dk_kernel_new). Python's built-in module and
 * the native magics reach the kernel through it. */
dk_kernel_t *dk_kernel_current(void);

dk_iopub_t *dk_kernel_iopub(dk_kernel_t *self);
dk_stream_t *dk_kernel_stream(dk_kernel_t *self);
dk_magic_registry_t *dk_kernel_magics(dk_kernel_t *self);

/* Ask the frontend for a line of input on stdin, on behalf of the shell request
 * being handled; called by the main thread with the GIL held (it is released
 * while waiting). Returns the malloc'd answer, or NULL when interrupted or when
 * the kernel shuts down, with a Python exception set (KeyboardInterrupt, EOFError). */
char *dk_kernel_input(dk_kernel_t *self, const char *prompt, bool password);

/* True while a shutdown is under way: long waits give up. */
bool dk_kernel_shutting_down(dk_kernel_t *self);

/* Write a line to the kernel's log (its original stderr), printf-style. */
void dk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The execution a native magic runs in: the handler publishes through it. */
typedef struct {
    dk_kernel_t *kernel;
    int execution_count;
    bool silent;
    json_t *error;     /* set by dk_exec_error: {ename, evalue, traceback} */
} dk_exec_t;

/* Report the cell's error: publishes one `error` message (the only one of the
 * cell: later calls are ignored) and makes the reply an error reply. TRACEBACK
 * is borrowed, an array of strings (may be NULL). */
void dk_exec_error(dk_exec_t *ex, const char *ename, const char *evalue, json_t *traceback);

/* Publish an execute_result with DATA (borrowed mime bundle) unless silent. */
void dk_exec_result(dk_exec_t *ex, json_t *data);

#endif
