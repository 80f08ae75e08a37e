/*
 * dk_distributed: running a cell or a function as N ranks. See the header.
 *
 * A run is three parties. The runtime thread calls the sink: output bytes go
 * through one line assembler per rank and stream (dk_lines), finished lines
 * become "[rank N] ..." text in the cell's stdout or stderr (coalesced by
 * dk_stream), and a line being redrawn with '\r' (a progress bar) becomes a
 * display of its own, updated in place, one per rank, so bars never turn into
 * thousands of lines nor fight over one line. The main thread waits with the GIL
 * released, wakes every WAIT_SLICE_MS to honour an interrupt or a shutdown
 * (which cancel the job), refreshes the status display, and, once every rank has
 * exited, builds the result or the root-cause error. A mutex guards what both
 * threads touch.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dk_distributed.h"
#include "dk_check.h"
#include "dk_dist_opts.h"
#include "dk_nccl.h"
#include "dk_gpu.h"
#include "dk_job.h"
#include "dk_kernel.h"
#include "dk_lines.h"
#include "dk_logdir.h"
#include "dk_logfile.h"
#include "dk_python.h"
#include "dk_tracking.h"

#include <stdint.h>
#include <sys/stat.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WAIT_SLICE_MS 50
#define STATUS_EVERY_MS 1000
#define PROGRESS_EVERY_MS 100
#define PARTIAL_SHOWN_AFTER_MS 300
#define KILL_GRACE_S 2.0

typedef struct run_t run_t;

#define KEEP_RUN_LOGS 20

/* The feature, one per kernel: what it needs of the kernel, its magic, and
 * what outlives a run (which run folders this kernel keeps). */
struct dk_distributed_t {
    dk_kernel_t *kernel;
    dk_magic_t magic;
    char kept[KEEP_RUN_LOGS][128];   /* this kernel's newest run folders, a ring */
    unsigned long runs;              /* runs started so far */
};

typedef struct {
    run_t *run;
    int rank;
    int fd;                     /* 1 or 2 */
    dk_lines_t *lines;
    bool progress_open;         /* a progress display exists for this stream */
    bool progress_dirty;        /* newer text than the display shows */
    char *progress_text;
    long long progress_sent_ms;
    long long partial_since_ms; /* an unfinished line is waiting, since */
    long long caught_up_ms;     /* ... and its pipe was found empty, since */
    char display_id[80];
    int displays;               /* progress displays opened so far */
} slot_t;

typedef struct {
    dk_rank_state_t state;
    int exit_code, term_signal;
    void *message;              /* RESULT or ERROR bytes */
    size_t message_len;
    bool is_error;
    int gpu_index;              /* NVML index, -1 for CPU ranks */
    int pid;
    bool got_cell;              /* reached RUNNING: its cell or function was delivered */
} rank_info_t;

struct run_t {
    dk_distributed_t *feature;
    dk_kernel_t *kernel;
    dk_dist_opts_t opts;
    int world;
    bool gpu;
    char what[160];             /* "2 CPU ranks (gloo)", "8 × NVIDIA H100" */
    char run_id[24];
    dk_job_t *job;
    pthread_mutex_t lock;
    slot_t *slots;              /* world * 2 */
    rank_info_t *ranks;
    bool status_dirty;
    bool status_shown;          /* the status display exists */
    long long t0_ms;
    bool interrupted, shutdown;
    const char *kind;           /* "cell" or "function" */
    char device[128];           /* "NVIDIA H100 80GB HBM3" or "cpu" */
    char model[32];
    dk_tracked_run_t tracked;
    char mlflow_env[3][1400];   /* the run's MLFLOW_* variables for the ranks */
    char *batch;                /* labelled lines of one sink_output call */
    size_t batch_len, batch_cap;
    unsigned long long thinned_at_start;   /* dk_stream_thinned lines, before the run */
};

extern char **environ;

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *signal_name(int sig)
{
    static const struct { int sig; const char *name; } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
        {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},   {0, NULL}};
    for (int i = 0; names[i].name; i++)
        if (names[i].sig == sig)
            return names[i].name;
    return "a signal";
}

/* ---- sink: runs on the runtime thread ------------------------------------------ */

/* Hand the batch of finished lines of slot S to the cell's stream. */
static void flush_batch(slot_t *s)
{
    run_t *run = s->run;
    if (run->batch_len)
        dk_stream_append(dk_kernel_stream(run->kernel), s->fd == 2 ? DK_STDERR : DK_STDOUT,
                         run->batch, run->batch_len);
    run->batch_len = 0;
}

/* Publish a display: FORCE queues it behind a frontend that is behind (the first
 * and last states of a display must arrive); otherwise it is offered after the
 * stream text before it, and false means IOPub was full and nothing was sent
 * (the caller keeps it dirty and tries again). */
static bool publish_display(run_t *run, const char *msg_type, json_t *content, bool force)
{
    dk_stream_t *stream = dk_kernel_stream(run->kernel);
    dk_iopub_t *iopub = dk_kernel_iopub(run->kernel);
    if (force) {
        dk_stream_flush(stream);
        dk_iopub_publish(iopub, msg_type, content, NULL);
        return true;
    }
    if (!dk_stream_offer(stream))
        return false;
    char *text = json_dumps(content, JSON_COMPACT);
    int rc = text ? dk_iopub_offer_text(iopub, msg_type, text) : -1;
    free(text);
    return rc != DK_IOPUB_FULL;
}

/* Show S's line in its progress display, opening the display if it is not open.
 * Unforced, a full IOPub leaves it dirty for the next try (see publish_display). */
static void publish_progress_locked(slot_t *s, bool force)
{
    if (!s->progress_text)
        return;
    if (!s->progress_open)
        snprintf(s->display_id, sizeof s->display_id, "distkernel-%s-r%d-fd%d-%d",
                 s->run->run_id, s->rank, s->fd, s->displays);
    char label[600];
    snprintf(label, sizeof label, "[rank %d] ", s->rank);
    size_t n = strlen(label) + strlen(s->progress_text) + 1;
    char *text = malloc(n);
    if (!text)
        return;
    snprintf(text, n, "%s%s", label, s->progress_text);
    json_t *content = json_pack("{s:{s:s}, s:{}, s:{s:s}}", "data", "text/plain", text,
                                "metadata", "transient", "display_id", s->display_id);
    flush_batch(s);
    bool sent = content && publish_display(s->run, s->progress_open ? "update_display_data"
                                                                    : "display_data",
                                           content, force);
    json_decref(content);
    free(text);
    if (!sent) {
        s->progress_dirty = true;
        return;
    }
    if (!s->progress_open)
        s->displays++;
    s->progress_open = true;
    s->progress_dirty = false;
    s->progress_sent_ms = now_ms();
}

/* A rank's unfinished line is shown in place of its own (a display updated in
 * place) when it is being redrawn ('\r', a progress bar), or when the rank has
 * left it unfinished for PARTIAL_SHOWN_AFTER_MS ("Epoch 1... " before a long
 * step), counted from when the kernel had read everything the rank wrote (see
 * sink_caught_up). A line that is merely arriving in pieces, or whose rest is
 * still in the pipe behind a flood from other ranks, is printed once, whole. */
static void on_line(void *data, dk_lines_event_t kind, const char *text, size_t len)
{
    slot_t *s = data;
    if (kind == DK_PROGRESS) {
        bool redraw = s->progress_text && strncmp(text, s->progress_text,
                                                  strlen(s->progress_text)) != 0;
        free(s->progress_text);
        s->progress_text = strndup(text, len);
        if (!s->partial_since_ms)
            s->partial_since_ms = now_ms();
        if (s->progress_open) {
            if (now_ms() - s->progress_sent_ms >= PROGRESS_EVERY_MS)
                publish_progress_locked(s, false);
            else
                s->progress_dirty = true;
        } else if (redraw) {
            publish_progress_locked(s, false);
        }
        return;
    }
    s->partial_since_ms = 0;
    s->caught_up_ms = 0;
    if (s->progress_open) {
        /* The redrawn line is finished (a bar at 100%): it stays where it was
         * drawn, in its final state, instead of being printed again. */
        free(s->progress_text);
        s->progress_text = strndup(text, len);
        publish_progress_locked(s, true);
        s->progress_open = false;
        free(s->progress_text);
        s->progress_text = NULL;
        return;
    }
    free(s->progress_text);
    s->progress_text = NULL;
    /* Collected into the run's batch, handed to the stream once per read. */
    run_t *run = s->run;
    char label[32];
    int ln = snprintf(label, sizeof label, "[rank %d] ", s->rank);
    size_t need = run->batch_len + (size_t)ln + len + 1;
    if (need > run->batch_cap) {
        size_t cap = run->batch_cap ? run->batch_cap : 4096;
        while (cap < need)
            cap *= 2;
        char *p = realloc(run->batch, cap);
        if (!p)
            return;
        run->batch = p;
        run->batch_cap = cap;
    }
    memcpy(run->batch + run->batch_len, label, (size_t)ln);
    memcpy(run->batch + run->batch_len + (size_t)ln, text, len);
    run->batch[need - 1] = '\n';
    run->batch_len = need;
}


static void sink_output(void *data, int rank, int fd, const char *bytes, size_t len)
{
    run_t *run = data;
    if (run->opts.output == DK_OUTPUT_RANK0 && rank != 0)
        return;   /* still in the rank's log file */
    pthread_mutex_lock(&run->lock);
    slot_t *s = &run->slots[rank * 2 + (fd == 2)];
    long long t = now_ms();
    dk_lines_feed(s->lines, bytes, len, on_line, s);
    flush_batch(s);
    /* While the kernel waited for a slow frontend (dk_stream's backpressure) it
     * read no pipe, so no rank can be known to have stopped writing: each must
     * be found caught up again before its unfinished line is shown. */
    if (now_ms() - t >= WAIT_SLICE_MS)
        for (int i = 0; i < run->world * 2; i++)
            run->slots[i].caught_up_ms = 0;
    pthread_mutex_unlock(&run->lock);
}

static void sink_caught_up(void *data, int rank, int fd)
{
    run_t *run = data;
    pthread_mutex_lock(&run->lock);
    slot_t *s = &run->slots[rank * 2 + (fd == 2)];
    if (s->partial_since_ms && !s->caught_up_ms)
        s->caught_up_ms = now_ms();
    pthread_mutex_unlock(&run->lock);
}

static void sink_state(void *data, int rank, dk_rank_state_t state, int exit_code, int term_signal)
{
    run_t *run = data;
    pthread_mutex_lock(&run->lock);
    run->ranks[rank].state = state;
    if (state == DK_RANK_RUNNING)
        run->ranks[rank].got_cell = true;
    run->ranks[rank].exit_code = exit_code;
    run->ranks[rank].term_signal = term_signal;
    run->status_dirty = true;
    pthread_mutex_unlock(&run->lock);
}

static void sink_message(void *data, int rank, bool is_error, const void *bytes, size_t len)
{
    run_t *run = data;
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return;
    memcpy(copy, bytes, len);
    pthread_mutex_lock(&run->lock);
    free(run->ranks[rank].message);
    run->ranks[rank].message = copy;
    run->ranks[rank].message_len = len;
    run->ranks[rank].is_error = is_error;
    pthread_mutex_unlock(&run->lock);
}

static void sink_warning(void *data, const char *text)
{
    run_t *run = data;
    char line[1024];
    int n = snprintf(line, sizeof line, "[distkernel] %s\n", text);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    dk_stream_write(dk_kernel_stream(run->kernel), DK_STDERR, line, (size_t)n);
}

/* ---- status display: main thread ---------------------------------------------- */

static const char *state_word(dk_rank_state_t st)
{
    switch (st) {
    case DK_RANK_STARTING: return "starting";
    case DK_RANK_RUNNING: return "running";
    case DK_RANK_DONE: return "done";
    case DK_RANK_FAILED: return "failed";
    case DK_RANK_STOPPED: return "stopped";
    }
    return "?";
}

/* The run's status display. FORCE: the first and last states, which must arrive;
 * the updates in between are skipped while a frontend is behind. */
static void publish_status(run_t *run, const char *headline, bool force)
{
    double elapsed = (double)(now_ms() - run->t0_ms) / 1000.0;
    size_t cap = 512 + (size_t)run->world * 96;
    char *text = malloc(cap);
    if (!text)
        return;
    size_t n = 0;
    n += (size_t)snprintf(text + n, cap - n, "distributed: %s · %.1f s%s%s\n", run->what, elapsed,
                          headline ? " · " : "", headline ? headline : "");
    pthread_mutex_lock(&run->lock);
    for (int r = 0; r < run->world && n < cap; r++) {
        rank_info_t *ri = &run->ranks[r];
        n += (size_t)snprintf(text + n, cap - n, "%srank %d %s", r ? " · " : "  ", r,
                              state_word(ri->state));
        if (run->gpu && ri->gpu_index >= 0 && ri->state == DK_RANK_RUNNING && ri->pid > 0) {
            unsigned long long used = dk_gpu_process_memory(ri->gpu_index, ri->pid);
            if (used && n < cap)
                n += (size_t)snprintf(text + n, cap - n, " (GPU %.1f GiB)",
                                      (double)used / (1024.0 * 1024.0 * 1024.0));
        }
    }
    run->status_dirty = false;
    pthread_mutex_unlock(&run->lock);
    if (n < cap)
        n += (size_t)snprintf(text + n, cap - n, "\n  logs: %s", dk_job_log_dir(run->job));
    char display_id[64];
    snprintf(display_id, sizeof display_id, "distkernel-%s-status", run->run_id);
    json_t *content = json_pack("{s:{s:s}, s:{}, s:{s:s}}", "data", "text/plain", text,
                                "metadata", "transient", "display_id", display_id);
    if (publish_display(run, run->status_shown ? "update_display_data" : "display_data", content,
                        force || !run->status_shown))
        run->status_shown = true;
    else
        run->status_dirty = true;
    json_decref(content);
    free(text);
}

static void flush_progress(run_t *run)
{
    long long now = now_ms();
    pthread_mutex_lock(&run->lock);
    for (int i = 0; i < run->world * 2; i++) {
        slot_t *s = &run->slots[i];
        if (s->progress_open && s->progress_dirty)
            publish_progress_locked(s, false);
        else if (!s->progress_open && s->progress_text && s->caught_up_ms &&
                 now - s->caught_up_ms >= PARTIAL_SHOWN_AFTER_MS)
            publish_progress_locked(s, false);
    }
    pthread_mutex_unlock(&run->lock);
}

/* ---- devices and the job -------------------------------------------------------- */

/* Decide how many ranks and where, from the options and the node; -1 with ERR. */
static int plan(run_t *run, char *err, size_t errlen)
{
    const dk_dist_opts_t *o = &run->opts;
    if (o->num_processes) {
        run->world = o->num_processes;
        run->gpu = false;
        snprintf(run->what, sizeof run->what, "%d CPU rank%s", run->world,
                 run->world == 1 ? "" : "s");
        snprintf(run->device, sizeof run->device, "cpu");
        return 0;
    }
    dk_gpu_list_t gpus;
    dk_gpu_discover(&gpus);
    if (gpus.count == 0) {
        snprintf(err, errlen,
                 "no GPU on this node (%s). To run CPU ranks instead, give num_processes=N, "
                 "for example: %%%%distributed num_processes=2",
                 gpus.why_none);
        return -1;
    }
    if (o->num_accelerators > gpus.count) {
        snprintf(err, errlen, "num_accelerators=%d asks for more GPUs than this node has: %d × %s",
                 o->num_accelerators, gpus.count, gpus.gpus[0].name);
        return -1;
    }
    if (o->accelerator_model[0]) {
        for (int i = 0; i < gpus.count; i++) {
            if (strcmp(gpus.gpus[i].model, o->accelerator_model) != 0) {
                snprintf(err, errlen,
                         "accelerator_type asks for %s GPUs, but this node has %d × %s (%s)",
                         o->accelerator_model, gpus.count, gpus.gpus[i].name,
                         gpus.gpus[i].model[0] ? gpus.gpus[i].model : "unknown model");
                return -1;
            }
        }
    }
    run->world = o->num_accelerators ? o->num_accelerators : gpus.count;
    run->gpu = true;
    snprintf(run->what, sizeof run->what, "%d × %s", run->world, gpus.gpus[0].name);
    snprintf(run->device, sizeof run->device, "%s", gpus.gpus[0].name);
    snprintf(run->model, sizeof run->model, "%s", gpus.gpus[0].model);
    for (int r = 0; r < run->world; r++)
        run->ranks[r].gpu_index = gpus.gpus[r].index;
    return 0;
}

static void run_free(run_t *run)
{
    if (!run)
        return;
    dk_job_destroy(&run->job);
    for (int i = 0; run->slots && i < run->world * 2; i++) {
        dk_lines_destroy(&run->slots[i].lines);
        free(run->slots[i].progress_text);
    }
    for (int r = 0; run->ranks && r < run->world; r++)
        free(run->ranks[r].message);
    free(run->slots);
    free(run->ranks);
    free(run->batch);
    pthread_mutex_destroy(&run->lock);
    free(run);
}

static void note_line(run_t *run, const char *note)
{
    if (!note[0])
        return;
    char line[1200];
    int n = snprintf(line, sizeof line, "%s\n", note);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    dk_stream_write(dk_kernel_stream(run->kernel), DK_STDERR, line, (size_t)n);
}

/* The notebook's active MLflow run id, if its Python has one (malloc'd). */
static char *active_parent_run(void)
{
    PyObject *mod = PyImport_ImportModule("distkernel._dist");
    PyObject *res = mod ? PyObject_CallMethod(mod, "active_mlflow_run", NULL) : NULL;
    Py_XDECREF(mod);
    char *out = NULL;
    if (res && PyUnicode_Check(res))
        out = strdup(PyUnicode_AsUTF8(res));
    Py_XDECREF(res);
    PyErr_Clear();
    return out;
}

/* Create the MLflow run; returns the ranks' environment (the kernel's, plus
 * the run's variables) or NULL for the kernel's own. */
static char **begin_tracking(run_t *run)
{
    char *parent = active_parent_run();
    dk_tracking_request_t req = {.opts = &run->opts, .world_size = run->world, .gpu = run->gpu,
                                 .device = run->device, .accelerator_model = run->model,
                                 .kind = run->kind, .parent_run_id = parent};
    char note[1200];
    dk_tracking_begin(&req, &run->tracked, note, sizeof note);
    free(parent);
    note_line(run, note);
    if (!run->tracked.active)
        return NULL;
    char (*vars)[1400] = run->mlflow_env;
    snprintf(vars[0], sizeof vars[0], "MLFLOW_TRACKING_URI=%s", run->tracked.tracking_uri);
    snprintf(vars[1], sizeof vars[1], "MLFLOW_RUN_ID=%s", run->tracked.run_id);
    snprintf(vars[2], sizeof vars[2], "MLFLOW_EXPERIMENT_ID=%s", run->tracked.experiment_id);
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 4, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "MLFLOW_TRACKING_URI=", 20) != 0 &&
            strncmp(environ[i], "MLFLOW_RUN_ID=", 14) != 0 &&
            strncmp(environ[i], "MLFLOW_EXPERIMENT_ID=", 21) != 0)
            env[k++] = environ[i];
    for (int i = 0; i < 3; i++)
        env[k++] = vars[i];
    env[k] = NULL;
    return env;
}

static void end_tracking(run_t *run, const char *status)
{
    char note[1200];
    dk_tracking_end(&run->tracked, status, note, sizeof note);
    note_line(run, note);
}

static void publish_run_link(run_t *run)
{
    char *html = NULL;
    const char *url = run->tracked.url;
    size_t n = strlen(url) * 2 + strlen(run->tracked.run_name) + 200;
    html = malloc(n);
    if (!html)
        return;
    snprintf(html, n, "MLflow run <a href=\"%s\" target=\"_blank\">%s</a>", url,
             run->tracked.run_name);
    char text[2400];
    snprintf(text, sizeof text, "MLflow run %s: %s", run->tracked.run_name, url);
    json_t *content = json_pack("{s:{s:s, s:s}, s:{}, s:{}}", "data", "text/plain", text,
                                "text/html", html, "metadata", "transient");
    dk_stream_flush(dk_kernel_stream(run->kernel));
    dk_iopub_publish(dk_kernel_iopub(run->kernel), "display_data", content, NULL);
    json_decref(content);
    free(html);
}

static const char *final_status(run_t *run)
{
    switch (dk_job_end(run->job)) {
    case DK_END_OK: return "FINISHED";
    case DK_END_FAILED: return "FAILED";
    default: return "KILLED";
    }
}

/* Where a run's rank-N.log files go: ROOT/kernel-PID/run-NNNN-ID, ROOT being
 * DISTKERNEL_LOG_DIR or the user's state directory (dk_logdir_default_root),
 * checked to be the user's alone on every run (the notebook may change
 * DISTKERNEL_LOG_DIR). Retention (runtime/dk_logdir.h does the removing, never
 * through a symlink, never a running job's folder):
 *   - a kernel keeps its last KEEP_RUN_LOGS runs, so a long session does not fill
 *     the disk with logs nobody will read;
 *   - folders of exited kernels are kept for reading after the fact, the newest
 *     KEEP_DEAD_KERNELS always, the others until DEAD_KERNEL_AGE_S old; a folder
 *     whose kernel still runs is not touched by that rule;
 *   - the whole root holds at most DISTKERNEL_LOG_ROOT_CAP (default
 *     DK_LOG_ROOT_CAP_DEFAULT): before each run, the oldest runs of any kernel go
 *     first until it fits.
 * A run folder is made fresh here and held by the job from its start; a pruner of
 * another kernel in between could only take it if it were the oldest run of an
 * over-full root, and then the run fails to start with a message, nothing worse. */
#define KEEP_DEAD_KERNELS 10
#define DEAD_KERNEL_AGE_S (24 * 3600)
#define LOG_DIR_HINT "set DISTKERNEL_LOG_DIR to a directory that is yours alone"

static int size_from_env(const char *name, unsigned long long dflt, unsigned long long *out)
{
    const char *v = getenv(name);
    *out = dflt;
    if (!v || !*v)
        return 0;
    if (!dk_dist_opts_parse_size(v, out)) {
        PyErr_Format(PyExc_ValueError, "%s=%s is not a size; give bytes or a size such as "
                     "512M or 2G (K, M, G, T: powers of 1024)", name, v);
        return -1;
    }
    return 0;
}

/* Make this run's log folder; its path goes in OUT. Returns -1 with a Python
 * exception set when the root is not safe or the folder cannot be made. */
static int next_log_dir(dk_distributed_t *d, const char *run_id, char *out, size_t outlen)
{
    unsigned long long root_cap;
    if (size_from_env("DISTKERNEL_LOG_ROOT_CAP", DK_LOG_ROOT_CAP_DEFAULT, &root_cap) < 0)
        return -1;
    char err[1024];
    char *base = dk_logdir_default_root(err, sizeof err);
    int root = base ? dk_logdir_open(base, DK_LOGDIR_CREATE, LOG_DIR_HINT, err, sizeof err) : -1;
    if (root < 0) {
        PyErr_Format(PyExc_RuntimeError, "no rank was started: %s", err);
        free(base);
        return -1;
    }
    dk_logdir_policy_t policy = {.keep_dead_kernels = KEEP_DEAD_KERNELS,
                                 .dead_age_s = DEAD_KERNEL_AGE_S, .cap = root_cap};
    if (d->runs > 0)
        policy.keep_dead_kernels = INT32_MAX;   /* exited kernels: looked at once per kernel */
    dk_logdir_prune(root, &policy, getpid());
    char kname[32], name[128];
    snprintf(kname, sizeof kname, "kernel-%d", (int)getpid());
    int kdir = dk_logdir_mkdir(root, kname, false, err, sizeof err);
    snprintf(name, sizeof name, "run-%04lu-%s", d->runs + 1, run_id);
    int rdir = kdir >= 0 ? dk_logdir_mkdir(kdir, name, true, err, sizeof err) : -1;
    if (rdir < 0) {
        PyErr_Format(PyExc_RuntimeError, "no rank was started: in %s: %s; %s", base, err,
                     LOG_DIR_HINT);
        if (kdir >= 0)
            close(kdir);
        close(root);
        free(base);
        return -1;
    }
    close(rdir);
    d->runs++;
    char *slot = d->kept[d->runs % KEEP_RUN_LOGS];
    if (slot[0])
        dk_logdir_remove(kdir, slot);
    snprintf(slot, sizeof d->kept[0], "%s", name);
    snprintf(out, outlen, "%s/%s/%s", base, kname, name);
    close(kdir);
    close(root);
    free(base);
    return 0;
}

static const char *rank_exe(void)
{
    const char *exe = getenv("DISTKERNEL_RANK_EXE");
    return exe && *exe ? exe : DK_RANK_EXE;
}

/* check=True: the NCCL preflight check before any rank starts. Returns -1 with
 * a Python exception set when the job must not start. */
static int preflight(run_t *run)
{
    dk_stream_t *stream = dk_kernel_stream(run->kernel);
    if (!run->gpu) {
        static const char line[] = "check=True: CPU ranks, no GPU to check\n";
        dk_stream_write(stream, DK_STDERR, line, sizeof line - 1);
        return 0;
    }
    bool interrupted;
    char err[1024];
    json_t *report = dk_check_run(stream, NULL, &interrupted, err, sizeof err);
    if (!report) {
        if (interrupted)
            PyErr_SetString(PyExc_KeyboardInterrupt, "interrupted during the GPU check");
        else
            PyErr_Format(PyExc_RuntimeError, "the NCCL preflight check could not run: %s", err);
        return -1;
    }
    const char *verdict = json_string_value(json_object_get(report, "verdict"));
    char *text = dk_nccl_report_text(report);
    if (text) {
        dk_stream_write(stream, DK_STDOUT, text, strlen(text));
        free(text);
    }
    int rc = 0;
    if (verdict && strcmp(verdict, "failed") == 0) {
        const char *summary = json_string_value(json_object_get(report, "summary"));
        PyErr_Format(PyExc_RuntimeError,
                     "the NCCL preflight check failed (%s); no rank was started",
                     summary ? summary : "see the report above");
        rc = -1;
    }
    json_decref(report);
    return rc;
}

/* Parse, plan and start. Returns NULL with a Python exception set. */
static run_t *run_start(dk_distributed_t *d, const char *kind, const char *options,
                        const void *payload, size_t len)
{
    run_t *run = calloc(1, sizeof *run);
    if (!run) {
        PyErr_NoMemory();
        return NULL;
    }
    pthread_mutex_init(&run->lock, NULL);
    run->feature = d;
    run->kernel = d->kernel;
    run->kind = kind;
    char err[1024];
    if (dk_dist_opts_parse(options, &run->opts, err, sizeof err) < 0) {
        PyErr_SetString(PyExc_ValueError, err);
        run_free(run);
        return NULL;
    }
    if (run->opts.warnings[0]) {
        char line[600];
        int n = snprintf(line, sizeof line, "%s\n", run->opts.warnings);
        dk_stream_write(dk_kernel_stream(run->kernel), DK_STDERR, line, (size_t)n);
    }
    size_t cap = run->opts.num_processes > DK_GPU_MAX ? (size_t)run->opts.num_processes
                                                      : DK_GPU_MAX;
    run->ranks = calloc(cap, sizeof *run->ranks);
    if (!run->ranks || plan(run, err, sizeof err) < 0) {
        if (run->ranks)
            PyErr_SetString(PyExc_RuntimeError, err);
        else
            PyErr_NoMemory();
        run_free(run);
        return NULL;
    }
    if (!run->gpu)
        for (int r = 0; r < run->world; r++)
            run->ranks[r].gpu_index = -1;
    if (run->opts.check && preflight(run) < 0) {
        run_free(run);
        return NULL;
    }
    run->slots = calloc((size_t)run->world * 2, sizeof *run->slots);
    if (!run->slots) {
        PyErr_NoMemory();
        run_free(run);
        return NULL;
    }
    unsigned char id[8];
    FILE *ur = fopen("/dev/urandom", "rb");
    if (!ur || fread(id, 1, sizeof id, ur) != sizeof id)
        memset(id, 0x5a, sizeof id);
    if (ur)
        fclose(ur);
    for (int i = 0; i < 8; i++)
        snprintf(run->run_id + 2 * i, 3, "%02x", id[i]);
    for (int i = 0; i < run->world * 2; i++) {
        slot_t *s = &run->slots[i];
        s->run = run;
        s->rank = i / 2;
        s->fd = i % 2 + 1;
        s->lines = dk_lines_new(0);
        if (!s->lines) {
            PyErr_NoMemory();
            run_free(run);
            return NULL;
        }
    }
    char **env = begin_tracking(run);
    if (PyErr_CheckSignals() < 0) {
        /* Interrupted while the run was being recorded: start nothing. */
        free(env);
        end_tracking(run, "KILLED");
        run_free(run);
        return NULL;
    }
    char log_dir[4096];
    unsigned long long log_cap = run->opts.log_cap;
    if ((!log_cap && size_from_env("DISTKERNEL_LOG_CAP", DK_LOG_CAP_DEFAULT, &log_cap) < 0) ||
        next_log_dir(run->feature, run->run_id, log_dir, sizeof log_dir) < 0) {
        free(env);
        end_tracking(run, "FAILED");
        run_free(run);
        return NULL;
    }
    dk_job_spec_t spec = {
        .log_cap = log_cap,
        .log_dir = log_dir,
        .env = (const char *const *)env,
        .world_size = run->world,
        .rank_exe = rank_exe(),
        .payload = payload,
        .payload_len = len,
        .timeout_s = run->opts.timeout_s,
        .grace_s = KILL_GRACE_S,
    };
    dk_sink_t sink = {.data = run, .on_output = sink_output,
                      .on_caught_up = sink_caught_up, .on_state = sink_state,
                      .on_message = sink_message, .on_warning = sink_warning};
    run->job = dk_job_start(&spec, &sink, err, sizeof err);
    free(env);
    if (!run->job) {
        end_tracking(run, "FAILED");
        PyErr_Format(PyExc_RuntimeError, "could not start the ranks: %s", err);
        run_free(run);
        return NULL;
    }
    for (int r = 0; r < run->world; r++)
        run->ranks[r].pid = dk_job_rank_pid(run->job, r);
    /* A frontend too slow for the ranks is shown less, and told where it all is. */
    unsigned long long bytes;
    dk_stream_thinned(dk_kernel_stream(run->kernel), &run->thinned_at_start, &bytes);
    char hint[4200];
    snprintf(hint, sizeof hint, "; every rank's full output is in %s", dk_job_log_dir(run->job));
    dk_stream_set_thin_hint(dk_kernel_stream(run->kernel), hint);
    run->t0_ms = now_ms();
    publish_status(run, NULL, true);
    if (run->tracked.active)
        publish_run_link(run);
    return run;
}

/* Wait for the end, honouring interrupts and shutdown. GIL held on entry/exit. */
static void run_wait(run_t *run)
{
    long long last_status = now_ms();
    for (;;) {
        bool done;
        Py_BEGIN_ALLOW_THREADS
        done = dk_job_wait(run->job, WAIT_SLICE_MS);
        Py_END_ALLOW_THREADS
        if (done)
            break;
        if (PyErr_CheckSignals() < 0) {
            PyErr_Clear();
            if (!run->interrupted) {
                run->interrupted = true;
                dk_job_cancel(run->job);
                char line[] = "[distkernel] interrupted: ending every rank\n";
                dk_stream_write(dk_kernel_stream(run->kernel), DK_STDERR, line, sizeof line - 1);
            }
        }
        if (!run->shutdown && dk_kernel_shutting_down(run->kernel)) {
            run->shutdown = true;
            dk_job_cancel(run->job);
        }
        flush_progress(run);
        if (run->status_dirty || now_ms() - last_status >= STATUS_EVERY_MS) {
            publish_status(run, run->interrupted ? "ending ranks" : NULL, false);
            last_status = now_ms();
        }
    }
    /* The runtime thread is done: finish half-written lines from here. */
    for (int i = 0; i < run->world * 2; i++) {
        slot_t *s = &run->slots[i];
        dk_lines_finish(s->lines, on_line, s);
        flush_batch(s);
        if (s->progress_dirty)
            publish_progress_locked(s, true);
    }
    for (int r = 0; r < run->world; r++) {
        run->ranks[r].state = dk_job_rank_state(run->job, r);
        run->ranks[r].exit_code = dk_job_rank_exit_code(run->job, r);
        run->ranks[r].term_signal = dk_job_rank_signal(run->job, r);
    }
    end_tracking(run, final_status(run));
    dk_stream_t *stream = dk_kernel_stream(run->kernel);
    dk_stream_flush(stream);
    unsigned long long lines, bytes;
    dk_stream_thinned(stream, &lines, &bytes);
    if (lines > run->thinned_at_start) {
        char line[4400];
        int n = snprintf(line, sizeof line,
                         "[distkernel] output thinned: %llu lines of this run were not shown "
                         "here; every rank's full output is in %s/rank-N.log\n",
                         lines - run->thinned_at_start, dk_job_log_dir(run->job));
        dk_stream_write(stream, DK_STDERR, line, n < (int)sizeof line ? (size_t)n : sizeof line - 1);
        dk_stream_flush(stream);
    }
    dk_stream_set_thin_hint(stream, NULL);
}

/* ---- outcome ---------------------------------------------------------------- */

/* The fate of rank R in a few words. */
static void describe_rank(run_t *run, int r, int root, char *out, size_t outlen)
{
    rank_info_t *ri = &run->ranks[r];
    /* A rank that died before its cell was delivered never ran the user's code:
     * the cause is in how it starts (its environment, sitecustomize, a broken
     * install), which is worth saying. */
    const char *when = ri->got_cell ? "" : " during start-up, before it received the cell";
    if (ri->state == DK_RANK_DONE) {
        snprintf(out, outlen, "rank %d: finished", r);
    } else if (ri->state == DK_RANK_STOPPED) {
        if (root >= 0)
            snprintf(out, outlen, "rank %d: ended by distkernel after rank %d failed", r, root);
        else
            snprintf(out, outlen, "rank %d: ended by distkernel (%s)", r,
                     run->interrupted ? "interrupted"
                     : run->shutdown  ? "kernel shutting down"
                                      : "timeout");
        /* SIGKILL is the last step of the stop (SIGINT, SIGTERM, SIGKILL): say so,
         * since it explains the wait and means the rank's own cleanup never ran. */
        if (ri->term_signal == SIGKILL)
            snprintf(out + strlen(out), outlen - strlen(out),
                     "; it outlived SIGINT and SIGTERM and was killed with SIGKILL");
    } else if (ri->is_error && ri->message) {
        json_t *e = json_loadb(ri->message, ri->message_len, 0, NULL);
        snprintf(out, outlen, "rank %d: raised %s: %s", r,
                 e ? json_string_value(json_object_get(e, "ename")) : "an exception",
                 e ? json_string_value(json_object_get(e, "evalue")) : "");
        json_decref(e);
    } else if (ri->term_signal) {
        snprintf(out, outlen, "rank %d: killed by signal %d (%s)%s%s", r, ri->term_signal,
                 signal_name(ri->term_signal), when,
                 ri->term_signal == SIGKILL ? ", often the out-of-memory killer (see dmesg)" : "");
    } else if (ri->exit_code > 0) {
        snprintf(out, outlen, "rank %d: exited with code %d%s", r, ri->exit_code,
                 ri->got_cell ? " before returning a result" : when);
    } else {
        snprintf(out, outlen, "rank %d: exited without returning a result%s", r, when);
    }
    if (root == r)
        snprintf(out + strlen(out), outlen - strlen(out), "   <- root cause (first failure)");
}

/* The error of a run that did not end OK: {ename, evalue, traceback}. With
 * HEADLINE, the traceback starts with "ename: evalue", for a cell's error
 * output; a .distributed() call's exception gets its headline in Python. */
static json_t *run_error(run_t *run, bool headline)
{
    dk_job_end_t end = dk_job_end(run->job);
    int root = end == DK_END_FAILED ? dk_job_root_cause(run->job) : -1;
    json_t *tb = json_array();
    char ename[128] = "DistributedError", evalue[1024] = "";
    if (end == DK_END_CANCELLED) {
        snprintf(ename, sizeof ename, "%s", run->shutdown ? "KernelShutdown" : "KeyboardInterrupt");
        snprintf(evalue, sizeof evalue, "%s: every rank was ended",
                 run->shutdown ? "the kernel is shutting down" : "interrupted");
    } else if (end == DK_END_TIMEOUT) {
        snprintf(ename, sizeof ename, "TimeoutError");
        snprintf(evalue, sizeof evalue,
                 "the job ran past timeout=%g s and every rank was ended; give a larger "
                 "timeout= or timeout=None",
                 run->opts.timeout_s);
    } else if (root >= 0) {
        rank_info_t *ri = &run->ranks[root];
        json_t *e = ri->is_error && ri->message ? json_loadb(ri->message, ri->message_len, 0, NULL)
                                                : NULL;
        if (e) {
            snprintf(ename, sizeof ename, "%s", json_string_value(json_object_get(e, "ename")));
            snprintf(evalue, sizeof evalue, "[rank %d] %s", root,
                     json_string_value(json_object_get(e, "evalue")));
            char head[128];
            snprintf(head, sizeof head, "Rank %d failed first (root cause):", root);
            json_array_append_new(tb, json_string(head));
            json_t *lines = json_object_get(e, "traceback");
            size_t i;
            json_t *line;
            json_array_foreach(lines, i, line) json_array_append(tb, line);
            json_decref(e);
        } else {
            char fate[512];
            describe_rank(run, root, -1, fate, sizeof fate);
            snprintf(ename, sizeof ename, "%s", ri->term_signal ? "RankKilled" : "RankExited");
            snprintf(evalue, sizeof evalue, "%s", fate);
        }
    }
    json_array_append_new(tb, json_string(""));
    json_array_append_new(tb, json_string("Ranks:"));
    for (int r = 0; r < run->world; r++) {
        char fate[640];
        describe_rank(run, r, root, fate, sizeof fate);
        char line[700];
        snprintf(line, sizeof line, "  %s", fate);
        json_array_append_new(tb, json_string(line));
    }
    char logs[1600];
    int n = snprintf(logs, sizeof logs, "Full output of every rank: %s/rank-N.log",
                     dk_job_log_dir(run->job));
    /* Say which logs a full disk cut short, rather than promise every byte. */
    const char *sep = " (cut short, the disk refused writes: rank ";
    for (int r = 0; r < run->world && n > 0 && (size_t)n < sizeof logs - 16; r++) {
        if (dk_job_rank_log_complete(run->job, r))
            continue;
        n += snprintf(logs + n, sizeof logs - (size_t)n, "%s%d", sep, r);
        sep = ", ";
    }
    if (strcmp(sep, ", ") == 0 && (size_t)n < sizeof logs - 2)
        n += snprintf(logs + n, sizeof logs - (size_t)n, ")");
    /* And which logs keep only their head and tail (log_cap). */
    sep = " (head and tail only, past log_cap: rank ";
    for (int r = 0; r < run->world && n > 0 && (size_t)n < sizeof logs - 16; r++) {
        if (!dk_job_rank_log_capped(run->job, r))
            continue;
        n += snprintf(logs + n, sizeof logs - (size_t)n, "%s%d", sep, r);
        sep = ", ";
    }
    if (strcmp(sep, ", ") == 0 && n > 0 && (size_t)n < sizeof logs - 2)
        snprintf(logs + n, sizeof logs - (size_t)n, ")");
    json_array_append_new(tb, json_string(logs));
    /* The first line says what happened: some frontends (Notebook 6) show the
     * traceback list and nothing else, not ename and evalue. Coloured as
     * IPython colours the exception line of a traceback. */
    const char *first = json_string_value(json_array_get(tb, 0));
    if (headline && first && *first)
        json_array_insert_new(tb, 0, json_string(""));
    if (headline) {
        char line[1400];
        snprintf(line, sizeof line, "\x1b[0;31m%s\x1b[0m: %s", ename, evalue);
        json_array_insert_new(tb, 0, json_string(line));
    }
    return json_pack("{s:s, s:s, s:o}", "ename", ename, "evalue", evalue, "traceback", tb);
}

/* Every rank's value bytes, as a list (None where a rank sent none). */
static PyObject *run_results(run_t *run)
{
    PyObject *list = PyList_New(run->world);
    for (int r = 0; list && r < run->world; r++) {
        rank_info_t *ri = &run->ranks[r];
        PyObject *item = ri->message && !ri->is_error
                             ? PyBytes_FromStringAndSize(ri->message, (Py_ssize_t)ri->message_len)
                             : Py_NewRef(Py_None);
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, r, item);
    }
    return list;
}

static PyObject *glue_call(const char *fn, const char *fmt, ...)
{
    PyObject *mod = PyImport_ImportModule("distkernel._dist");
    if (!mod)
        return NULL;
    PyObject *callable = PyObject_GetAttrString(mod, fn);
    Py_DECREF(mod);
    if (!callable)
        return NULL;
    va_list ap;
    va_start(ap, fmt);
    PyObject *args = Py_VaBuildValue(fmt, ap);
    va_end(ap);
    PyObject *res = args ? PyObject_CallObject(callable, args) : NULL;
    Py_XDECREF(args);
    Py_DECREF(callable);
    return res;
}

/* Report the pending Python exception as the cell's error. */
static void exec_error_from_python(dk_exec_t *ex)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
    dk_exec_error(ex, type ? ((PyTypeObject *)type)->tp_name : "Error", msg ? msg : "", NULL);
    PyErr_Clear();
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* %%distributed: the handler dk_magic calls with the cell's exec context. */
static int distributed_magic(void *host, void *data, const char *args, const char *body)
{
    dk_exec_t *ex = host;
    dk_distributed_t *d = data;
    PyObject *payload = glue_call("prepare_cell", "(s)", body);
    if (!payload) {
        exec_error_from_python(ex);
        return -1;
    }
    char *p;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(payload, &p, &len) < 0) {
        Py_DECREF(payload);
        exec_error_from_python(ex);
        return -1;
    }
    run_t *run = run_start(d, "cell", args, p, (size_t)len);
    Py_DECREF(payload);
    if (!run) {
        exec_error_from_python(ex);
        return -1;
    }
    run_wait(run);
    int rc = 0;
    if (dk_job_end(run->job) == DK_END_OK) {
        publish_status(run, "finished", true);
        PyObject *results = run_results(run);
        PyObject *bundle = results ? glue_call("finish_cell", "(Ns)", results,
                                               run->opts.result_name)
                                   : NULL;
        if (!bundle) {
            exec_error_from_python(ex);
            rc = -1;
        } else if (bundle != Py_None) {
            PyObject *text = glue_call("dumps", "(O)", bundle);
            json_t *data = text ? json_loads(PyUnicode_AsUTF8(text), 0, NULL) : NULL;
            if (data)
                dk_exec_result(ex, data);
            json_decref(data);
            Py_XDECREF(text);
            PyErr_Clear();
        }
        Py_XDECREF(bundle);
    } else {
        publish_status(run, run->interrupted ? "interrupted" : "failed", true);
        json_t *e = run_error(run, true);
        dk_exec_error(ex, json_string_value(json_object_get(e, "ename")),
                      json_string_value(json_object_get(e, "evalue")),
                      json_object_get(e, "traceback"));
        json_decref(e);
        rc = -1;
    }
    run_free(run);
    return rc;
}

/* _distkernel.run_job(options_text, payload_bytes) -> (results, log_dir,
 * run_url): each rank's pickled value (None where a rank sent none), the logs'
 * folder, the MLflow run's page ("" without tracking); raises
 * distkernel.DistributedError (or KeyboardInterrupt, TimeoutError, ValueError
 * for bad options) otherwise. */
static PyObject *run_job(PyObject *self, PyObject *args)
{
    dk_distributed_t *d = dk_python_function_data(self);
    const char *options;
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "sy*", &options, &payload))
        return NULL;
    run_t *run = run_start(d, "function", options, payload.buf,
                           (size_t)payload.len);
    PyBuffer_Release(&payload);
    if (!run)
        return NULL;
    run_wait(run);
    PyObject *out = NULL;
    dk_job_end_t end = dk_job_end(run->job);
    if (end == DK_END_OK) {
        publish_status(run, "finished", true);
        PyObject *results = run_results(run);
        if (results)
            out = Py_BuildValue("(Nss)", results, dk_job_log_dir(run->job),
                                run->tracked.active ? run->tracked.url : "");
    } else {
        publish_status(run, run->interrupted ? "interrupted" : "failed", true);
        json_t *e = run_error(run, false);
        PyObject *tb = PyList_New(0);
        size_t i;
        json_t *line;
        json_array_foreach(json_object_get(e, "traceback"), i, line)
        {
            PyObject *s = PyUnicode_FromString(json_string_value(line));
            if (s) {
                PyList_Append(tb, s);
                Py_DECREF(s);
            }
        }
        PyObject *res = glue_call("raise_error", "(ssN)",
                                  json_string_value(json_object_get(e, "ename")),
                                  json_string_value(json_object_get(e, "evalue")), tb);
        Py_XDECREF(res);   /* raise_error raises: res is NULL with the exception set */
        json_decref(e);
    }
    run_free(run);
    return out;
}

static void stop_tracking_server(void *unused)
{
    (void)unused;
    dk_tracking_shutdown();
}

dk_distributed_t *dk_distributed_new(dk_kernel_t *kernel)
{
    dk_distributed_t *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->kernel = kernel;
    d->magic = (dk_magic_t){.name = "distributed", .kind = DK_MAGIC_CELL, .doc = dk_dist_doc,
                            .run = distributed_magic, .data = d};
    dk_kernel_function_t fn = {.name = "run_job", .fn = (void (*)(void))run_job, .flags = METH_VARARGS,
                               .doc = "run_job(options_text, payload) -> (results, log_dir, "
                                      "run_url): run a pickled job as ranks.",
                               .data = d};
    if (dk_magic_register(dk_kernel_magics(kernel), &d->magic) < 0 ||
        dk_kernel_add_function(kernel, &fn) < 0 ||
        dk_kernel_on_exit(kernel, stop_tracking_server, NULL) < 0) {
        free(d);
        return NULL;
    }
    return d;
}
