/*
 * dk_debug: debug_request answered off the control thread. See the header.
 *
 * Jobs cross the actor's pipe as pointers (one process; the pipe is inproc),
 * which keeps a reply of any size off the control thread's hands until it
 * sends it.
 */
#include "dk_debug.h"
#include "dk_python.h"

#include <stdlib.h>
#include <string.h>

static void *recv_pointer(zsock_t *sock, bool *term)
{
    zmsg_t *msg = zmsg_recv(sock);
    void *ptr = NULL;
    *term = msg == NULL;
    zframe_t *f = msg ? zmsg_first(msg) : NULL;
    if (f && zframe_size(f) == sizeof ptr)
        memcpy(&ptr, zframe_data(f), sizeof ptr);
    else if (f && zframe_streq(f, "$TERM"))
        *term = true;
    zmsg_destroy(&msg);
    return ptr;
}

static int send_pointer(zsock_t *sock, void *ptr)
{
    return zsock_send(sock, "b", &ptr, sizeof ptr);
}

static void worker(zsock_t *pipe, void *args)
{
    (void)args;
    zsock_signal(pipe, 0);
    for (;;) {
        bool term;
        dk_debug_job_t *job = recv_pointer(pipe, &term);
        if (term)
            break;
        if (!job)
            continue;
        char *content = json_dumps(job->request->content, JSON_COMPACT);
        char *parent = json_dumps(job->request->header, JSON_COMPACT);
        job->reply = dk_python_debug_request(content ? content : "{}", parent ? parent : "{}");
        free(content);
        free(parent);
        if (send_pointer(pipe, job) != 0)
            dk_debug_job_destroy(&job);
    }
}

zactor_t *dk_debug_new(void)
{
    return zactor_new(worker, NULL);
}

int dk_debug_submit(zactor_t *w, dk_msg_t *request)
{
    dk_debug_job_t *job = calloc(1, sizeof *job);
    if (!job)
        return -1;
    job->request = request;
    if (send_pointer(zactor_sock(w), job) != 0) {
        free(job);
        return -1;
    }
    return 0;
}

dk_debug_job_t *dk_debug_recv(zactor_t *w)
{
    bool term;
    return recv_pointer(zactor_sock(w), &term);
}

void dk_debug_job_destroy(dk_debug_job_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_msg_destroy(&(*self_p)->request);
    free((*self_p)->reply);
    free(*self_p);
    *self_p = NULL;
}
