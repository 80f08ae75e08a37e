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
#include "dk_log.h"          /* dk_log: the kernel's messages, never in a cell */
#include "dk_magic.h"
#include "dk_stream.h"
#include "dk_wire.h"

#include <jansson.h>
#include <stdbool.h>

typedef struct dk_kernel_t dk_kernel_t;

/* Bind the sockets of CONN (taken over: the kernel clears it), start the
 * heartbeat, control and output threads. Returns NULL with a reason in ERR. */
dk_kernel_t *dk_kernel_new(dk_conn_t *conn, char *err, size_t errlen);

/* The ename of the error every request gets from a kernel whose environment
 * cannot run (dk_kernel_run). */
#define DK_KERNEL_UNUSABLE_ENAME "KernelEnvironmentError"

/* Start Python and serve until shutdown. Does not return: the process exits.
 * A kernel whose Python cannot run, because UNUSABLE says why (not NULL:
 * Python is not started) or because it fails to start (IPython removed), still
 * serves: kernel_info as always, every other request with an error that is
 * that one line, also written to the kernel's log, and shutdown. */
void dk_kernel_run(dk_kernel_t *self, const char *unusable) __attribute__((noreturn));

#define DK_KERNEL_MAX_HOOKS 16

/* Run FN(DATA) when the process exits (shutdown, a vanished frontend), newest
 * first, once; from whichever thread ends the process, so FN must not need the
 * GIL. For a feature's own cleanup (the MLflow server). Returns -1 when
 * DK_KERNEL_MAX_HOOKS are taken. Call before dk_kernel_run. */
int dk_kernel_on_exit(dk_kernel_t *self, void (*fn)(void *data), void *data);

/* A function a feature adds to Python's built-in module `_distkernel`. FN is a
 * PyCFunction, cast (this header needs no Python.h), called with
 * FLAGS (METH_VARARGS, ...) and, as its `self`, DATA in a capsule:
 * dk_python_function_data(self) gives it back. NAME and DOC are borrowed and
 * must live as long as the kernel. */
typedef struct {
    const char *name;
    void (*fn)(void);
    int flags;
    const char *doc;
    void *data;
} dk_kernel_function_t;

/* Add FN (copied) before dk_kernel_run starts Python. Returns -1 when
 * DK_KERNEL_MAX_HOOKS are taken. */
int dk_kernel_add_function(dk_kernel_t *self, const dk_kernel_function_t *fn);
size_t dk_kernel_function_count(const dk_kernel_t *self);
const dk_kernel_function_t *dk_kernel_function_at(const dk_kernel_t *self, size_t i);

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
