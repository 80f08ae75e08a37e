/*
 * dk_kernel_state: what the kernel's files share, private to kernel/: the
 * kernel's struct and the few functions its parts call in one another.
 *   dk_kernel.c          the kernel's life: setup, the shell loop, execute
 *   dk_kernel_reply.c    replies: their type, sending, receiving, refusals
 *   dk_kernel_control.c  the control and heartbeat threads (interrupt,
 *                        shutdown, debug_request)
 */
#ifndef DK_KERNEL_STATE_H
#define DK_KERNEL_STATE_H

#include "dk_kernel.h"
#include "dk_debug.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#define SHUTDOWN_GRACE_MS 600
/* How long the main thread may take to end the process once it has begun
 * (exit hooks, the history, the cell files): on a loaded machine that is
 * seconds, and cutting it short leaves the cell folder behind and the
 * history unsaved. Below jupyter_client's 5 s wait before it kills. */
#define SHUTDOWN_EXIT_MS 4000
#define DK_HISTORY_IDLE_MS 200

struct dk_kernel_t {
    dk_conn_t conn;
    dk_signer_t *signer;
    dk_replay_t *replay;
    char session[40];
    zsock_t *shell, *control, *stdin_sock, *iopub_sock, *hb;
    dk_iopub_t *iopub;
    dk_stream_t *stream;
    dk_magic_registry_t *magics;
    pthread_t main_tid, control_tid, hb_tid;
    atomic_bool executing;
    atomic_bool shutting_down;
    int wake[2];                 /* control -> main: shutdown requested */
    json_t *kernel_info;         /* kernel_info_reply content */
    json_t *kernel_info_debug;   /* the same with debugger true */
    atomic_bool debugger;        /* debugpy found: answer with kernel_info_debug */
    zactor_t *debug;             /* debug_request worker, from the first one on */
    bool debug_running;          /* the worker has one (control thread only) */
    zlist_t *debug_waiting;      /* dk_msg_t: debug_requests that came while it ran */
    dk_msg_t *request;           /* shell request being handled (main thread) */
    struct {                     /* what the features asked to run at exit */
        void (*fn)(void *data);
        void *data;
    } on_exit[DK_KERNEL_MAX_HOOKS];
    atomic_int n_on_exit;
    dk_kernel_function_t functions[DK_KERNEL_MAX_HOOKS];   /* for _distkernel */
    size_t n_functions;
};

/* Set once the process has begun to end (kernel_exit_process). */
extern atomic_bool kernel_exiting;

/* -- dk_kernel.c -- */

/* kernel_info_reply's content, with the debugger or without. */
json_t *kernel_info_reply(dk_kernel_t *k);
/* The features' exit hooks, newest first, each once. */
void kernel_run_exit_hooks(dk_kernel_t *k);
/* End the process. CLEAN (main thread only, GIL held) saves history first. */
void kernel_exit_process(dk_kernel_t *k, bool clean) __attribute__((noreturn));

/* -- dk_kernel_reply.c -- */

/* "execute_request" -> "execute_reply" (a new string). */
char *kernel_reply_type_for(const char *request_type);
/* Send REPLY_TYPE with CONTENT (as JSON text, or as a value) to the peer
 * that sent REQ on SOCK. */
void kernel_send_reply_text(dk_kernel_t *k, zsock_t *sock, dk_msg_t *req, const char *reply_type,
                            const char *content_json);
void kernel_send_reply(dk_kernel_t *k, zsock_t *sock, dk_msg_t *req, const char *reply_type,
                       json_t *content);
/* Receive and decode one message from SOCK; NULL (logged) if it is refused. */
dk_msg_t *kernel_recv_msg(dk_kernel_t *k, zsock_t *sock, const char *channel);
/* Whether a message of type T expects a reply. */
bool kernel_is_request(const char *t);
/* The reply content for a request whose fields have the wrong JSON types. */
json_t *kernel_refusal(const char *why, json_t **error_out);

/* -- dk_kernel_control.c -- */

void *kernel_control_main(void *arg);
void *kernel_hb_main(void *arg);

#endif
