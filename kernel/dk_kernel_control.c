/*
 * dk_kernel_control: the control and heartbeat threads. Control answers
 * kernel_info, turns interrupt_request into a SIGINT for the main thread,
 * ends the process on shutdown_request within a bounded time, and hands
 * debug_request to its worker (dk_debug). See dk_kernel.c and
 * dk_kernel_state.h.
 */
#include "dk_kernel_state.h"
#include "dk_err.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void handle_control(dk_kernel_t *k, dk_msg_t *req)
{
    const char *t = req->msg_type;
    char *parent = json_dumps(req->header, JSON_COMPACT);
    char *reply_type = kernel_reply_type_for(t);
    dk_iopub_status(k->iopub, "busy", parent);
    char why[256];
    if (strcmp(t, "kernel_info_request") == 0) {
        kernel_send_reply(k, k->control, req, reply_type, kernel_info_reply(k));
    } else if (strcmp(t, "shutdown_request") == 0 &&
               !dk_wire_check_content(t, req->content, why, sizeof why)) {
        /* restart: "no" used to shut the kernel down (as restart false): a
         * request that is not what the spec says does nothing but answer. */
        dk_log("refused a %s: %s", t, why);
        json_t *content = kernel_refusal(why, NULL);
        if (content)
            kernel_send_reply(k, k->control, req, reply_type, content);
        json_decref(content);
    } else if (strcmp(t, "interrupt_request") == 0) {
        if (atomic_load(&k->executing))
            pthread_kill(k->main_tid, SIGINT);
        kernel_send_reply_text(k, k->control, req, reply_type, "{\"status\":\"ok\"}");
    } else if (strcmp(t, "shutdown_request") == 0) {
        bool restart = json_is_true(json_object_get(req->content, "restart"));
        json_t *content = json_pack("{s:s, s:b}", "status", "ok", "restart", restart);
        kernel_send_reply(k, k->control, req, reply_type, content);
        dk_iopub_publish(k->iopub, "shutdown_reply", content, parent);
        json_decref(content);
        dk_iopub_status(k->iopub, "idle", parent);
        atomic_store(&k->shutting_down, true);
        char c = 1;
        ssize_t w = write(k->wake[1], &c, 1);
        (void)w;
        if (atomic_load(&k->executing))
            pthread_kill(k->main_tid, SIGINT);
        /* The main thread exits cleanly when the cell gives way; if it does not
         * within the grace, end the process from here. */
        struct timespec ts = {0, SHUTDOWN_GRACE_MS * 1000L * 1000L};
        nanosleep(&ts, NULL);
        if (atomic_load(&kernel_exiting)) {
            /* The main thread is ending the process; its _exit ends this wait. */
            kernel_run_exit_hooks(k);
            struct timespec slice = {0, 50 * 1000 * 1000};
            for (int waited = 0; waited < SHUTDOWN_EXIT_MS; waited += 50)
                nanosleep(&slice, NULL);
            _exit(0);
        }
        dk_log("a cell did not stop within %d ms of shutdown; exiting", SHUTDOWN_GRACE_MS);
        kernel_exit_process(k, false);
    } else {
        dk_log("ignored a control message of unknown type '%s'", t);
    }
    dk_iopub_status(k->iopub, "idle", parent);
    free(reply_type);
    free(parent);
}

/* debug_request: status busy, and the worker has it; debug_replied sends the
 * reply and idle. Takes REQ. */
static void start_debug_request(dk_kernel_t *k, dk_msg_t *req)
{
    char *parent = json_dumps(req->header, JSON_COMPACT);
    dk_iopub_status(k->iopub, "busy", parent);
    if (!k->debug)
        k->debug = dk_debug_new();
    if (k->debug && dk_debug_submit(k->debug, req) == 0) {
        k->debug_running = true;
    } else {
        kernel_send_reply_text(k, k->control, req, "debug_reply",
                        "{\"type\":\"response\",\"success\":false,"
                        "\"message\":\"the kernel could not start its debugger thread\"}");
        dk_iopub_status(k->iopub, "idle", parent);
        dk_msg_destroy(&req);
    }
    free(parent);
}

/* Debug requests run one at a time, as ipykernel 7 runs control requests: one
 * that comes while another runs waits here, so each is busy, reply, idle in
 * turn (a frontend pairs them; ipykernel's test_debug_requests_sequential). The
 * worker took them in order already; only their busy came early. Takes REQ. */
static void handle_debug_request(dk_kernel_t *k, dk_msg_t *req)
{
    if (k->debug_running) {
        if (!k->debug_waiting)
            k->debug_waiting = zlist_new();
        if (k->debug_waiting && zlist_append(k->debug_waiting, req) == 0)
            return;
    }
    start_debug_request(k, req);   /* or, out of memory, beside the one running */
}

static void debug_replied(dk_kernel_t *k)
{
    dk_debug_job_t *job = dk_debug_recv(k->debug);
    if (!job)
        return;
    char *parent = json_dumps(job->request->header, JSON_COMPACT);
    kernel_send_reply_text(k, k->control, job->request, "debug_reply", job->reply ? job->reply : "{}");
    dk_iopub_status(k->iopub, "idle", parent);
    free(parent);
    dk_debug_job_destroy(&job);
    k->debug_running = false;
    dk_msg_t *next;
    while (!k->debug_running && k->debug_waiting && (next = zlist_pop(k->debug_waiting)))
        start_debug_request(k, next);
}

static void block_all_signals(void)
{
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
}

/* The frontend's process, when it told us (jupyter_client sets JPY_PARENT_PID),
 * or 0. A kernel whose frontend died without shutting it down (killed, crashed)
 * would otherwise run on forever, holding its ranks and their GPUs. */
static pid_t parent_pid(void)
{
    const char *p = getenv("JPY_PARENT_PID");
    long pid = p ? strtol(p, NULL, 10) : 0;
    return pid > 1 && getppid() == (pid_t)pid ? (pid_t)pid : 0;
}

void *kernel_control_main(void *arg)
{
    dk_kernel_t *k = arg;
    block_all_signals();
    pid_t parent = parent_pid();
    zpoller_t *poller = zpoller_new(k->control, NULL);
    bool polling_debug = false;
    for (;;) {
        void *which = zpoller_wait(poller, 1000);
        if (which && which == k->debug) {
            debug_replied(k);
            continue;
        }
        if (which != k->control) {
            if (zpoller_terminated(poller))
                break;
            if (parent && getppid() != parent) {
                dk_log("the frontend (pid %d) is gone; exiting", (int)parent);
                kernel_exit_process(k, false);
            }
            continue;
        }
        dk_msg_t *req = kernel_recv_msg(k, k->control, "control");
        if (!req) {
            if (zsys_interrupted || errno == ETERM)
                break;
            continue;
        }
        if (strcmp(req->msg_type, "debug_request") == 0) {
            handle_debug_request(k, req);
            if (k->debug && !polling_debug)
                polling_debug = zpoller_add(poller, k->debug) == 0;
            continue;
        }
        handle_control(k, req);
        dk_msg_destroy(&req);
    }
    zpoller_destroy(&poller);
    return NULL;
}

void *kernel_hb_main(void *arg)
{
    dk_kernel_t *k = arg;
    block_all_signals();
    void *sock = zsock_resolve(k->hb);
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            if (errno == ETERM)
                break;
            continue;
        }
        int more = zmq_msg_more(&m);
        zmq_msg_send(&m, sock, more ? ZMQ_SNDMORE : 0);
        zmq_msg_close(&m);
    }
    return NULL;
}
