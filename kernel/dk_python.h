/*
 * dk_python: the embedded CPython and the glue that runs cells through IPython.
 *
 * The kernel calls into one Python object, distkernel._kernel.Kernel, with JSON
 * text in and JSON text out: the C side owns the protocol, Python owns what only
 * IPython can do (running code, completion, inspection, history, comms). Python
 * reaches back into the kernel through the built-in module `_distkernel`
 * (publishing, streams, stdin, native magics).
 *
 * Every function here is called from the main thread with the GIL held.
 */
#ifndef DK_PYTHON_H
#define DK_PYTHON_H

#include "dk_kernel.h"

/* The interpreter's version ("3.11.2"), usable before dk_python_start. */
const char *dk_python_version(void);

/* Start the interpreter, give the built-in module `_distkernel` its kernel K
 * and the functions the features added to K, import the glue and create the
 * shell (the glue registers K's native magics with IPython). Leaves the GIL
 * held by the caller. Returns -1 with a reason in ERR. */
int dk_python_start(dk_kernel_t *k, char *err, size_t errlen);

/* In a function added with dk_kernel_add_function: the DATA it was added with,
 * from the SELF it is called with. */
struct _object;   /* PyObject, without making every includer include Python.h */
void *dk_python_function_data(struct _object *self);

/* Handle one shell request of MSG_TYPE with CONTENT (borrowed; and BUFFERS,
 * for comm messages), given to the glue as Python objects. Returns the reply
 * content (new reference), or NULL when the request has no reply (comm
 * messages). A failure inside the glue is logged and answered with an error
 * reply naming it. */
json_t *dk_python_handle(const char *msg_type, json_t *content, zframe_t *const *buffers,
                         size_t n_buffers);

/* Whether the glue handles MSG_TYPE (the glue's table is the one list of the
 * shell messages Python answers). Valid once dk_python_start returned. */
bool dk_python_handles(const char *msg_type);

/* For a cell handled by a native magic: count it and record it in history as
 * IPython would, and publish execute_input unless SILENT. Returns the execution
 * count the cell runs under. */
int dk_python_native_begin(const char *code, bool silent, bool store_history);

/* The execute_reply content (new reference) for a native-magic cell: ERROR
 * (borrowed, may be NULL) from dk_exec_error, USER_EXPRESSIONS (borrowed)
 * evaluated as a Python cell's would be. */
json_t *dk_python_native_finish(int execution_count, json_t *error, json_t *user_expressions);

/* Run a pending SIGINT's Python handler and drop the KeyboardInterrupt, so an
 * interrupt that arrived between cells does not hit the next one. */
void dk_python_discard_interrupt(void);

/* Whether cells ran whose history is not yet written, and: write it now (in
 * IPython's saving thread). The kernel writes history once it has been idle
 * for DK_HISTORY_IDLE_MS, so the write never competes with a reply. */
bool dk_python_history_pending(void);
void dk_python_write_history(void);

/* Whether debugpy can be imported (looked up, not imported). Main thread. */
bool dk_python_debugger_available(void);

/* Answer a debug_request (CONTENT_JSON, its header PARENT_JSON, which the
 * debugger's events go out under) through distkernel._debugger. Unlike the
 * rest of this file, callable from any thread: it takes the GIL itself.
 * Returns the debug_reply content, malloc'd JSON text; never NULL except
 * when out of memory. */
char *dk_python_debug_request(const char *content_json, const char *parent_json);

/* Save history and run the shell's exit hooks before the process exits. */
void dk_python_shutdown(void);

#endif
