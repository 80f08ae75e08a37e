/*
 * dk_kernel: sockets, threads and request dispatch.
 *
 * The main thread loops on the shell socket. Each request is decoded (signature
 * and replay checked before any JSON is parsed), announced with status busy,
 * handled, followed by a flush of the cell's output, the reply, and status idle,
 * so a client that waits for idle has everything. Python requests go to
 * dk_python; kernel_info is answered from C.
 *
 * Interrupts are signals: the control thread turns interrupt_request into a
 * SIGINT for the main thread (pthread_kill), where Python's own handler raises
 * KeyboardInterrupt; a bare flag would not wake time.sleep or a blocking read.
 * Every other thread blocks all signals, so a SIGINT sent to the process (signal
 * mode, a terminal) reaches the main thread too. A SIGINT that lands between
 * cells is consumed before the next one runs.
 *
 * debug_request (the Jupyter debugger) is Python work: control hands it to a
 * worker thread (dk_debug) and answers it when the worker is done, so control
 * never waits for the GIL, even while a cell holds it or sits at a breakpoint.
 *
 * Shutdown is answered on control and then ends the process within a bounded
 * time even if a cell ignores the interrupt: the main thread exits cleanly when
 * it can, and the control thread exits the process itself when it does not.
 *
 * This file is the kernel's life (setup, the shell loop, execute); replies
 * are dk_kernel_reply.c's and the control and heartbeat threads
 * dk_kernel_control.c's (dk_kernel_state.h).
 */
#include "dk_kernel_state.h"
#include "dk_err.h"
#include "dk_setting.h"
#include "dk_python.h"
#include "dk_tidy.h"

#include "dk_pyabi.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


dk_iopub_t *dk_kernel_iopub(dk_kernel_t *self) { return self->iopub; }
dk_stream_t *dk_kernel_stream(dk_kernel_t *self) { return self->stream; }
dk_magic_registry_t *dk_kernel_magics(dk_kernel_t *self) { return self->magics; }

int dk_kernel_on_exit(dk_kernel_t *self, void (*fn)(void *data), void *data)
{
    int n = atomic_load(&self->n_on_exit);
    if (n >= DK_KERNEL_MAX_HOOKS)
        return -1;
    self->on_exit[n].fn = fn;
    self->on_exit[n].data = data;
    atomic_store(&self->n_on_exit, n + 1);
    return 0;
}

int dk_kernel_add_function(dk_kernel_t *self, const dk_kernel_function_t *fn)
{
    if (self->n_functions >= DK_KERNEL_MAX_HOOKS)
        return -1;
    self->functions[self->n_functions++] = *fn;
    return 0;
}

size_t dk_kernel_function_count(const dk_kernel_t *self) { return self->n_functions; }

const dk_kernel_function_t *dk_kernel_function_at(const dk_kernel_t *self, size_t i)
{
    return i < self->n_functions ? &self->functions[i] : NULL;
}

/* The features' exit hooks, newest first. Each runs once even when the control
 * thread and the main thread both end the process. */
void kernel_run_exit_hooks(dk_kernel_t *k)
{
    for (int i = atomic_exchange(&k->n_on_exit, 0) - 1; i >= 0; i--)
        k->on_exit[i].fn(k->on_exit[i].data);
}

bool dk_kernel_shutting_down(dk_kernel_t *self) { return atomic_load(&self->shutting_down); }

/* ---- kernel_info ------------------------------------------------------------ */

/* "debugger" says the debugger is there twice: the field of protocol 5.3, and
 * supported_features (JEP 92), which ipykernel 7 sends and JupyterLab 4
 * reads. "kernel subshells" (JEP 91) is not among them: distkernel has none. */
static json_t *build_kernel_info(bool debugger)
{
    const char *pyver = dk_python_version();
    char banner[256];
    snprintf(banner, sizeof banner,
             "distkernel %s: Python %s through IPython, with %%%%distributed for multi-GPU cells\n",
             DK_VERSION, pyver);
    json_t *features = debugger ? json_pack("[s]", "debugger") : json_array();
    return json_pack("{s:s, s:s, s:s, s:s, s:{s:s, s:s, s:s, s:s, s:s, s:s, s:{s:s, s:i}},"
                     " s:s, s:[{s:s, s:s}], s:b, s:o}",
                     "status", "ok", "protocol_version", DK_PROTOCOL_VERSION,
                     "implementation", "distkernel", "implementation_version", DK_VERSION,
                     "language_info", "name", "python", "version", pyver, "mimetype",
                     "text/x-python", "file_extension", ".py", "pygments_lexer", "ipython3",
                     "nbconvert_exporter", "python", "codemirror_mode", "name", "ipython",
                     "version", 3, "banner", banner, "help_links", "text", "Python Reference",
                     "url", "https://docs.python.org/3/", "debugger", debugger,
                     "supported_features", features);
}

json_t *kernel_info_reply(dk_kernel_t *k)
{
    return atomic_load(&k->debugger) ? k->kernel_info_debug : k->kernel_info;
}

/* ---- shutdown --------------------------------------------------------------- */

atomic_bool kernel_exiting;

/* End the process. CLEAN (main thread only, GIL held) saves history first. */
void kernel_exit_process(dk_kernel_t *k, bool clean)
{
    atomic_store(&kernel_exiting, true);
    kernel_run_exit_hooks(k);
    if (clean)
        dk_python_shutdown();
    /* The temporary folders still kept (all of them when Python did not shut
     * down) are removed, and the watcher that would have removed them after a
     * SIGKILL ends with them, leaving no child. */
    dk_tidy_end();
    if (k->stream)
        dk_stream_flush(k->stream);
    /* Give ZeroMQ's I/O thread a moment to put the last reply and status on the
     * wire: _exit drops whatever is still queued. */
    struct timespec ts = {0, 30 * 1000 * 1000};
    nanosleep(&ts, NULL);
    _exit(0);
}


/* ---- execute ---------------------------------------------------------------- */

void dk_exec_error(dk_exec_t *ex, const char *ename, const char *evalue, json_t *traceback)
{
    if (ex->error)
        return;
    json_t *tb = traceback ? json_deep_copy(traceback) : json_array();
    if (json_array_size(tb) == 0) {
        /* Frontends that show only the traceback must still show something. */
        char line[2048];
        snprintf(line, sizeof line, "%s: %s", ename, evalue);
        json_array_append_new(tb, json_string(line));
    }
    ex->error = json_pack("{s:s, s:s, s:o}", "ename", ename, "evalue", evalue, "traceback", tb);
    dk_stream_flush(ex->kernel->stream);
    dk_iopub_publish(ex->kernel->iopub, "error", ex->error, NULL);
}

void dk_exec_result(dk_exec_t *ex, json_t *data)
{
    if (ex->silent)
        return;
    json_t *content = json_pack("{s:i, s:O, s:{}}", "execution_count", ex->execution_count,
                                "data", data, "metadata");
    dk_stream_flush(ex->kernel->stream);
    dk_iopub_publish(ex->kernel->iopub, "execute_result", content, NULL);
    json_decref(content);
}

/* Run a native-magic cell; returns the reply content. */
static json_t *execute_native(dk_kernel_t *k, dk_magic_call_t *call, const char *code,
                              bool silent, bool store_history, json_t *user_expr)
{
    dk_exec_t ex = {.kernel = k, .silent = silent};
    ex.execution_count = dk_python_native_begin(code, silent, store_history);
    dk_magic_run(call, &ex);
    if (PyErr_Occurred()) {
        /* A handler interrupted while in Python code. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        char name[128];
        dk_py_type_name(type, name, sizeof name);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        const char *msg = s ? dk_py_utf8(s) : "";
        dk_exec_error(&ex, name, msg ? msg : "", NULL);
        Py_XDECREF(s);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Clear();
    }
    json_t *reply = dk_python_native_finish(ex.execution_count, ex.error, user_expr);
    json_decref(ex.error);
    return reply;
}

static json_t *handle_execute(dk_kernel_t *k, dk_msg_t *req)
{
    const char *code = json_string_value(json_object_get(req->content, "code"));
    dk_magic_call_t call;
    if (code && dk_magic_parse(k->magics, code, &call)) {
        bool silent = json_is_true(json_object_get(req->content, "silent"));
        json_t *sh = json_object_get(req->content, "store_history");
        bool store_history = sh ? json_is_true(sh) : !silent;
        json_t *reply = execute_native(k, &call, code, silent, store_history && !silent,
                                       json_object_get(req->content, "user_expressions"));
        dk_magic_call_clear(&call);
        return reply;
    }
    return dk_python_handle("execute_request", req->content, NULL, 0);
}

static void handle_shell(dk_kernel_t *k, dk_msg_t *req);

/* After a failed cell with stop_on_error, answer the execute_requests already
 * queued on shell with status "aborted", as ipykernel does, instead of running
 * them. Every other request in the queue (kernel_info, inspect, comm_info, ...)
 * is answered as usual, in its turn: only cells depend on the one that failed. */
static void abort_queued(dk_kernel_t *k)
{
    zpoller_t *poller = zpoller_new(k->shell, NULL);
    while (zpoller_wait(poller, 0) == k->shell) {
        dk_msg_t *req = kernel_recv_msg(k, k->shell, "shell");
        if (!req)
            continue;
        if (strcmp(req->msg_type, "execute_request") != 0) {
            handle_shell(k, req);
            dk_msg_destroy(&req);
            continue;
        }
        char *parent = json_dumps(req->header, JSON_COMPACT);
        char *reply_type = kernel_reply_type_for(req->msg_type);
        dk_iopub_status(k->iopub, "busy", parent);
        kernel_send_reply_text(k, k->shell, req, reply_type, "{\"status\":\"aborted\"}");
        dk_iopub_status(k->iopub, "idle", parent);
        free(parent);
        free(reply_type);
        dk_msg_destroy(&req);
    }
    zpoller_destroy(&poller);
}

/* connect_reply: the ports of the kernel's channels (deprecated in the spec,
 * still sent by some clients; ipykernel answers it the same way). */
static json_t *connect_reply(dk_kernel_t *k)
{
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "status", "ok", "shell_port",
                     k->conn.ports[DK_CHAN_SHELL], "iopub_port", k->conn.ports[DK_CHAN_IOPUB],
                     "stdin_port", k->conn.ports[DK_CHAN_STDIN], "control_port",
                     k->conn.ports[DK_CHAN_CONTROL], "hb_port", k->conn.ports[DK_CHAN_HB]);
}

static void handle_shell(dk_kernel_t *k, dk_msg_t *req)
{
    const char *t = req->msg_type;
    bool known = strcmp(t, "kernel_info_request") == 0 || strcmp(t, "execute_request") == 0 ||
                 strcmp(t, "connect_request") == 0 || dk_python_handles(t);
    if (!known) {
        dk_log("ignored a shell message of unknown type '%s'", t);
        return;
    }
    /* Check the content's types before anything of the request runs: the glue
     * used to read them with Python's truthiness (silent: "no" ran silently)
     * and failed only after the cell had run (user_expressions: [...] ran the
     * code, then answered "InternalError"). */
    char why[256];
    bool well_typed = dk_wire_check_content(t, req->content, why, sizeof why);
    if (!well_typed && !kernel_is_request(t)) {
        dk_log("ignored a %s: %s", t, why);     /* not a request: nobody to answer */
        return;
    }
    char *parent = json_dumps(req->header, JSON_COMPACT);
    dk_stream_flush(k->stream);
    dk_iopub_set_parent(k->iopub, parent);
    dk_iopub_status(k->iopub, "busy", NULL);
    k->request = req;

    char *reply_type = kernel_reply_type_for(t);
    json_t *reply = NULL;
    bool stop_on_error = false;
    if (!well_typed) {
        /* stop_on_error stays false: the request ran nothing, and its own
         * stop_on_error may be the field that is wrong, so what is queued
         * behind it is not aborted. */
        dk_log("refused a %s: %s", t, why);
        json_t *error = NULL;
        reply = kernel_refusal(why, &error);
        /* Frontends show a cell's error from iopub, not from the reply. */
        if (error && strcmp(t, "execute_request") == 0)
            dk_iopub_publish(k->iopub, "error", error, NULL);
        json_decref(error);
    } else if (strcmp(t, "kernel_info_request") == 0) {
        reply = json_incref(kernel_info_reply(k));
    } else if (strcmp(t, "connect_request") == 0) {
        reply = connect_reply(k);
    } else {
        if (strcmp(t, "execute_request") == 0) {
            json_t *soe = json_object_get(req->content, "stop_on_error");
            stop_on_error = soe ? json_is_true(soe) : true;
            dk_python_discard_interrupt();
            atomic_store(&k->executing, true);
            reply = handle_execute(k, req);
            atomic_store(&k->executing, false);
            dk_python_discard_interrupt();
        } else {
            reply = dk_python_handle(t, req->content, req->buffers, req->n_buffers);
        }
    }
    dk_stream_flush(k->stream);
    if (reply) {
        kernel_send_reply(k, k->shell, req, reply_type, reply);
        /* Before this request's idle, as ipykernel does: a client that waits
         * for idle and then sends its next cell must find the queue as the
         * failure left it, not have the new cell aborted. The requests
         * answered meanwhile set their own parents; ours comes back after. */
        const char *status = json_string_value(json_object_get(reply, "status"));
        if (stop_on_error && status && strcmp(status, "error") == 0) {
            abort_queued(k);
            dk_iopub_set_parent(k->iopub, parent);
        }
    }
    dk_iopub_status(k->iopub, "idle", NULL);
    k->request = NULL;
    json_decref(reply);
    free(reply_type);
    free(parent);
}

/* ---- stdin ------------------------------------------------------------------ */

char *dk_kernel_input(dk_kernel_t *k, const char *prompt, bool password)
{
    if (!k->request) {
        PyErr_SetString(PyExc_RuntimeError, "input() outside of a request");
        return NULL;
    }
    dk_stream_flush(k->stream);
    json_t *content = json_pack("{s:s, s:b}", "prompt", prompt, "password", password);
    json_t *header = dk_header_new("input_request", k->session, "kernel");
    zmsg_t *msg = dk_wire_encode(k->signer, k->request->idents, k->request->n_idents, header,
                                 k->request->header, NULL, content, NULL, 0);
    json_decref(content);
    json_decref(header);
    /* Drop a stale input_reply left by an earlier, interrupted request. */
    zpoller_t *poller = zpoller_new(k->stdin_sock, NULL);
    while (zpoller_wait(poller, 0) == k->stdin_sock) {
        zmsg_t *stale = zmsg_recv(k->stdin_sock);
        zmsg_destroy(&stale);
    }
    if (!msg || zmsg_send(&msg, k->stdin_sock) != 0) {
        zmsg_destroy(&msg);
        zpoller_destroy(&poller);
        PyErr_SetString(PyExc_EOFError, "could not send input_request");
        return NULL;
    }
    char *answer = NULL;
    for (;;) {
        void *which;
        Py_BEGIN_ALLOW_THREADS
        which = zpoller_wait(poller, 100);
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0)
            break;
        if (atomic_load(&k->shutting_down)) {
            PyErr_SetString(PyExc_EOFError, "the kernel is shutting down");
            break;
        }
        if (which != k->stdin_sock)
            continue;
        dk_msg_t *reply = kernel_recv_msg(k, k->stdin_sock, "stdin");
        if (!reply)
            continue;
        char why[256];
        if (strcmp(reply->msg_type, "input_reply") == 0 &&
            !dk_wire_check_content("input_reply", reply->content, why, sizeof why)) {
            /* A value that is not a string is not an answer: input() used to
             * return "" for it. Keep waiting for one that is. */
            dk_log("ignored an input_reply on stdin: %s", why);
        } else if (strcmp(reply->msg_type, "input_reply") == 0) {
            const char *value = json_string_value(json_object_get(reply->content, "value"));
            answer = strdup(value ? value : "");
            dk_msg_destroy(&reply);
            break;
        } else {
            dk_log("ignored a '%s' on stdin", reply->msg_type);
        }
        dk_msg_destroy(&reply);
    }
    zpoller_destroy(&poller);
    return answer;
}

/* ---- setup and main loop ---------------------------------------------------- */

#define DK_MAX_HEARTBEAT 65536
#define DK_HANDSHAKE_MS 5000     /* ZeroMQ's default is 30 s of a descriptor per stranger */

static int max_message_bytes(void)
{
    return (int)dk_setting_number("DISTKERNEL_MAX_MESSAGE_MB") << 20;
}

static zsock_t *bind_socket(dk_kernel_t *k, int type, dk_channel_t ch, char *err, size_t errlen)
{
    char endpoint[512];
    zsock_t *s = zsock_new(type);
    if (!s) {
        dk_set_err(err, errlen, "cannot create the %s socket", dk_channel_name(ch));
        return NULL;
    }
    zsock_set_linger(s, 1000);
    if (type == ZMQ_ROUTER)
        zsock_set_router_handover(s, 1);
    /* A frame larger than this is not read into memory: ZeroMQ disconnects the
     * peer that sent it. Heartbeats are a few bytes; requests get
     * DISTKERNEL_MAX_MESSAGE_MB (default 256 MiB), far above any
     * notebook's cell or comm message. */
    if (type == ZMQ_ROUTER || type == ZMQ_REP)
        zsock_set_maxmsgsize(s, type == ZMQ_REP ? DK_MAX_HEARTBEAT : max_message_bytes());
    /* A connection that has not finished its ZMTP greeting within this is
     * closed, so half-open connections cannot pile up descriptors. */
    zsock_set_handshake_ivl(s, DK_HANDSHAKE_MS);
    bool ipv6 = false;
    if (!dk_conn_bind_endpoint(&k->conn, ch, endpoint, sizeof endpoint, &ipv6, err, errlen)) {
        zsock_destroy(&s);
        return NULL;
    }
    zsock_set_ipv6(s, ipv6);
    if (zsock_bind(s, "%s", endpoint) < 0) {
        int e = zmq_errno();
        dk_set_err(err, errlen, "cannot bind the %s channel to %s: %s%s", dk_channel_name(ch),
                 endpoint, zmq_strerror(e),
                 e == EADDRINUSE ? " (is another kernel using it?)"
                 : e == EADDRNOTAVAIL || e == ENODEV
                     ? " (the connection file's \"ip\" is not an address of this machine)"
                     : "");
        zsock_destroy(&s);
        return NULL;
    }
    return s;
}

dk_kernel_t *dk_kernel_new(dk_conn_t *conn, char *err, size_t errlen)
{
    dk_kernel_t *k = calloc(1, sizeof *k);
    if (!k) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    k->conn = *conn;
    memset(conn, 0, sizeof *conn);
    k->main_tid = pthread_self();
    zuuid_t *uuid = zuuid_new();
    snprintf(k->session, sizeof k->session, "%s", zuuid_str_canonical(uuid));
    zuuid_destroy(&uuid);
    k->signer = dk_signer_new_digest(k->conn.digest[0] ? k->conn.digest : NULL, k->conn.key,
                                     k->conn.key_len);
    k->replay = dk_replay_new(DK_REPLAY_HISTORY);
    k->magics = dk_magic_registry_new();
    k->kernel_info = build_kernel_info(false);
    k->kernel_info_debug = build_kernel_info(true);
    if (!k->signer || !k->replay || !k->magics || !k->kernel_info || !k->kernel_info_debug ||
        pipe2(k->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    /* Threads and ZeroMQ's own I/O threads inherit this mask: only the main
     * thread takes signals. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    if (!(k->shell = bind_socket(k, ZMQ_ROUTER, DK_CHAN_SHELL, err, errlen)) ||
        !(k->control = bind_socket(k, ZMQ_ROUTER, DK_CHAN_CONTROL, err, errlen)) ||
        !(k->stdin_sock = bind_socket(k, ZMQ_ROUTER, DK_CHAN_STDIN, err, errlen)) ||
        !(k->iopub_sock = bind_socket(k, ZMQ_PUB, DK_CHAN_IOPUB, err, errlen)) ||
        !(k->hb = bind_socket(k, ZMQ_REP, DK_CHAN_HB, err, errlen))) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return NULL;
    }
    k->iopub = dk_iopub_new(k->iopub_sock, k->signer, k->session);
    k->stream = dk_stream_new(k->iopub, err, errlen);
    if (!k->iopub || !k->stream) {
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        return NULL;
    }
    dk_log_to(dk_stream_log_fd(k->stream));   /* the kernel's messages: never in a cell */
    pthread_create(&k->hb_tid, NULL, kernel_hb_main, k);
    pthread_create(&k->control_tid, NULL, kernel_control_main, k);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return k;
}

/* ---- a kernel whose environment cannot run ----------------------------------- */

/* Answer REQ, in a kernel without Python: kernel_info and connect as always;
 * every other request with an error that is the line UNUSABLE, shown in the
 * cell too for an execute_request, so the notebook says what to do. */
static void answer_unusable(dk_kernel_t *k, dk_msg_t *req, const char *unusable, int *count)
{
    const char *t = req->msg_type;
    if (strcmp(t, "kernel_info_request") == 0 || strcmp(t, "connect_request") == 0) {
        handle_shell(k, req);
        return;
    }
    if (!kernel_is_request(t))
        return;
    char *parent = json_dumps(req->header, JSON_COMPACT);
    char *reply_type = kernel_reply_type_for(t);
    dk_iopub_set_parent(k->iopub, parent);
    dk_iopub_status(k->iopub, "busy", NULL);
    json_t *error = json_pack("{s:s, s:s, s:[s]}", "ename", DK_KERNEL_UNUSABLE_ENAME, "evalue",
                              unusable, "traceback", unusable);
    json_t *reply = json_deep_copy(error);
    json_object_set_new(reply, "status", json_string("error"));
    if (strcmp(t, "execute_request") == 0) {
        json_object_set_new(reply, "execution_count", json_integer(++*count));
        json_object_set_new(reply, "user_expressions", json_object());
        json_object_set_new(reply, "payload", json_array());
        dk_iopub_publish(k->iopub, "error", error, NULL);
    }
    kernel_send_reply(k, k->shell, req, reply_type, reply);
    dk_iopub_status(k->iopub, "idle", NULL);
    json_decref(error);
    json_decref(reply);
    free(reply_type);
    free(parent);
}

static void run_unusable(dk_kernel_t *k, const char *unusable) __attribute__((noreturn));
static void run_unusable(dk_kernel_t *k, const char *unusable)
{
    dk_log("%s", unusable);
    /* No Python handler is there to take SIGINT: an interrupt must not end
     * the kernel. */
    signal(SIGINT, SIG_IGN);
    dk_iopub_status(k->iopub, "starting", "{}");
    zmq_pollitem_t items[2] = {{zsock_resolve(k->shell), 0, ZMQ_POLLIN, 0},
                               {NULL, k->wake[0], ZMQ_POLLIN, 0}};
    int count = 0;
    while (!atomic_load(&k->shutting_down)) {
        if (zmq_poll(items, 2, -1) < 0 || !(items[0].revents & ZMQ_POLLIN))
            continue;
        dk_msg_t *req = kernel_recv_msg(k, k->shell, "shell");
        if (req) {
            answer_unusable(k, req, unusable, &count);
            dk_msg_destroy(&req);
        }
    }
    kernel_exit_process(k, false);
}

void dk_kernel_run(dk_kernel_t *k, const char *unusable)
{
    char err[2048];
    if (!unusable && dk_python_start(k, err, sizeof err) < 0)
        unusable = err;
    if (unusable)
        run_unusable(k, unusable);
    atomic_store(&k->debugger, dk_python_debugger_available());
    /* Announced once Python is up rather than at bind time: a frontend's
     * subscription, made as it launches us, has joined by now. */
    dk_iopub_status(k->iopub, "starting", "{}");
    zmq_pollitem_t items[2] = {{zsock_resolve(k->shell), 0, ZMQ_POLLIN, 0},
                               {NULL, k->wake[0], ZMQ_POLLIN, 0}};
    bool history_pending = false;
    for (;;) {
        int rc;
        Py_BEGIN_ALLOW_THREADS
        rc = zmq_poll(items, 2, history_pending ? DK_HISTORY_IDLE_MS : -1);
        Py_END_ALLOW_THREADS
        if (rc == 0 && history_pending) {
            dk_python_write_history();
            history_pending = false;
            continue;
        }
        if (rc < 0) {
            /* EINTR: a SIGINT between cells. Consume it here. */
            dk_python_discard_interrupt();
            continue;
        }
        if (atomic_load(&k->shutting_down))
            break;
        if (items[0].revents & ZMQ_POLLIN) {
            dk_msg_t *req = kernel_recv_msg(k, k->shell, "shell");
            if (req) {
                handle_shell(k, req);
                dk_msg_destroy(&req);
                history_pending = dk_python_history_pending();
            }
        }
        if (atomic_load(&k->shutting_down))
            break;
    }
    kernel_exit_process(k, true);
}
