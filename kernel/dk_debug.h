/*
 * dk_debug: the Jupyter debugger's requests (debug_request on control),
 * answered off the control thread.
 *
 * A debug request is Python work (python/distkernel/_debugger.py talks to the
 * debugpy adapter), so it needs the GIL. The control thread must never wait
 * for the GIL: a cell that holds it (a long C call) would then hold up
 * kernel_info, interrupt and shutdown too. So the control thread hands each
 * debug_request to this worker, a CZMQ actor, and goes back to its socket;
 * the worker takes the GIL, gets the reply, and hands it back through the
 * actor's pipe, which the control thread polls beside its socket and answers
 * from. Requests are answered one at a time, in the order they came.
 *
 * Nothing of this exists until the first debug_request: the debugger costs a
 * kernel nothing until a frontend uses it.
 */
#ifndef DK_DEBUG_H
#define DK_DEBUG_H

#include "dk_wire.h"

/* A request and, once the worker is done with it, its reply content. */
typedef struct {
    dk_msg_t *request;
    char *reply;   /* JSON text, malloc'd */
} dk_debug_job_t;

/* Start the worker. NULL if the thread cannot be started. */
zactor_t *dk_debug_new(void);

/* Hand REQUEST (a decoded debug_request; ownership passes) to the worker.
 * Returns -1, REQUEST untouched, if it cannot be queued. */
int dk_debug_submit(zactor_t *worker, dk_msg_t *request);

/* The next finished job, once WORKER's pipe is readable; NULL if none. The
 * caller answers it and frees it with dk_debug_job_destroy. */
dk_debug_job_t *dk_debug_recv(zactor_t *worker);
void dk_debug_job_destroy(dk_debug_job_t **self_p);

#endif
