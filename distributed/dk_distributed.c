/*
 * dk_distributed: the feature object and its Python entry points. See the
 * header.
 *
 * The feature is a few files, one idea each:
 *   dk_dist_run        a run's lifecycle: start, wait, result or error
 *   dk_dist_output      rank output to "[rank N]" lines and progress displays
 *   dk_dist_outcome    what the user is told about each rank of a failed run
 *   dk_dist_status     the run's status display text
 *   dk_dist_plan       how many ranks, on which devices
 *   dk_dist_logs       the run's log folder, and how many the kernel keeps
 *   dk_dist_mlflow     the run's MLflow variables, notes and link
 *   dk_dist_preflight  check=True
 *   dk_dist_pool      ranks started with `%distributed start`, kept between cells
 * Here: %%distributed and `_distkernel.run_job`, which turn a run's end into
 * the cell's result or error, or into what .distributed() returns or raises;
 * `%distributed start|status|stop|restart`; and the feature, which holds what
 * outlives a run (its log folders, the started ranks).
 *
 * While ranks are started, a run that names no size (or theirs) runs on them;
 * another size is refused, since the two would compete for the same devices.
 * Ranks that ended on their own stay recorded until the next run, which says
 * so and forgets them.
 */
#include "dk_pyabi.h"

#include "dk_distributed.h"
#include "dk_dist_logs.h"
#include "dk_dist_opts.h"
#include "dk_dist_warm.h"
#include "dk_dist_pool.h"
#include "dk_dist_run.h"
#include "dk_python.h"
#include "dk_tracking.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The feature, one per kernel: what it needs of the kernel, its magic, and
 * what outlives a run (which run folders this kernel keeps). */
struct dk_distributed_t {
    dk_dist_host_t host;        /* the kernel, and what outlives a run: */
    dk_dist_logs_t logs;        /* which run folders this kernel keeps */
    dk_tracking_t *tracking;    /* the MLflow server it started, its experiment */
    dk_magic_t magic;
    dk_magic_t line_magic;      /* %distributed start|status|stop|restart */
    dk_dist_pool_t *pool;       /* the started ranks, or NULL */
    dk_template_t *warm;        /* the warm-start template (dk_dist_warm), or NULL */
    bool starting;              /* `%distributed start` is under way (pool not yet set) */
    char *pool_options;         /* what they were started with, as written (restart,
                                   messages), or NULL */
    char *pythonpath_said;      /* PYTHONPATH's refused entries, as last said in a cell */
};

/* ---- started ranks -------------------------------------------------------------- */

/* The longest wait for started ranks to finish ending once one has exited:
 * the others get the stop ladder (a grace of 2 s between its rungs). */
#define POOL_ENDING_WAIT_MS 10000

/* What another thread's use of the ranks gets while they are being started. */
#define POOL_STARTING_TEXT                                                                  \
    "ranks are being started by `%distributed start`; wait for it or interrupt it"

/* Whether OPTIONS asks for a size other than POOL's. Sets a Python ValueError
 * (bad options, or another size) and returns -1; 0 when the run may use the
 * pool. */
static int pool_fits(dk_dist_pool_t *pool, const char *started_with, const char *options)
{
    dk_dist_opts_t o;
    char err[1024];
    if (dk_dist_opts_parse(options, &o, err, sizeof err) < 0) {
        PyErr_SetString(PyExc_ValueError, err);
        return -1;
    }
    const dk_dist_plan_t *plan = dk_dist_pool_plan(pool);
    const dk_dist_opts_t *started = dk_dist_pool_opts(pool);
    int nodes = started->nodes ? started->nodes : 1;
    /* Where the ranks run is part of their size: nodes= or launcher= other
     * than the start's would otherwise run on these ranks as if not given. */
    bool other = (o.num_processes && (plan->gpu || o.num_processes != plan->world)) ||
                 (o.num_accelerators && (!plan->gpu || o.num_accelerators != plan->world)) ||
                 (o.accelerator_model[0] && (!plan->gpu ||
                                             strcasecmp(o.accelerator_model, plan->model) != 0)) ||
                 (o.nodes && o.nodes != nodes) ||
                 /* A cell that names no launcher parses as local (its default):
                  * it runs on ranks started on Slurm's nodes as on any. */
                 (o.launcher == DK_LAUNCHER_SLURM && started->launcher != DK_LAUNCHER_SLURM);
    if (!other)
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "ranks are started (%s, by `%%distributed start %s`) and this asks for "
                 "another size (%s). Leave out the size options to run on the started ranks, "
                 "or run `%%distributed stop` first.", plan->what, started_with, options);
    return -1;
}

/* The started ranks have ended since the last cell: say so (once) as the
 * pending Python exception, with how to start them again, and forget them. */
static void gone_error(dk_distributed_t *d)
{
    char why[512];
    dk_dist_pool_gone_text(d->pool, why, sizeof why);
    PyErr_Format(PyExc_RuntimeError,
                 "the started ranks are gone: %s; their variables are lost. Start them "
                 "again with `%%distributed start %s`, or run `%%distributed stop` to go "
                 "back to a fresh set of ranks per cell.",
                 why, d->pool_options);
    dk_dist_pool_destroy(&d->pool);
}

/* The started ranks a run should use: NULL with no exception when there are
 * none; NULL with a Python exception when the run cannot go ahead (the ranks
 * ended since the last cell: said once, then forgotten; another size). */
static dk_dist_pool_t *pool_for_run(dk_distributed_t *d, const char *options, bool *refused)
{
    *refused = false;
    /* A start under way: a fresh run now would compete for its devices, and
     * this one should run on the ranks once they are there. */
    if (d->starting) {
        PyErr_SetString(PyExc_RuntimeError, POOL_STARTING_TEXT);
        *refused = true;
        return NULL;
    }
    if (!d->pool)
        return NULL;
    /* Before anything else: a run in progress holds the pool, gone or not. */
    if (dk_dist_pool_busy(d->pool)) {
        PyErr_SetString(PyExc_RuntimeError, DK_DIST_POOL_BUSY_TEXT);
        *refused = true;
        return NULL;
    }
    /* A rank killed just now (the out-of-memory killer, a user's kill) may
     * not have been seen by the job's thread yet: a cell sent now would fail
     * as if the cell had killed it. Such a job ends at once; wait for it. */
    dk_job_t *job = dk_dist_pool_job(d->pool);
    if (dk_dist_pool_alive(d->pool) && job && dk_job_any_rank_exited(job)) {
        Py_BEGIN_ALLOW_THREADS
        dk_job_wait(job, POOL_ENDING_WAIT_MS);
        Py_END_ALLOW_THREADS
    }
    if (!dk_dist_pool_alive(d->pool)) {
        gone_error(d);
        *refused = true;
        return NULL;
    }
    if (pool_fits(d->pool, d->pool_options, options) < 0) {
        *refused = true;
        return NULL;
    }
    return d->pool;
}

/* A run: on the started ranks when there are (and they fit), else fresh. */
static dk_dist_run_t *run_start(dk_distributed_t *d, const char *kind, const char *options,
                                const void *payload, size_t len)
{
    bool refused;
    dk_dist_pool_t *pool = pool_for_run(d, options, &refused);
    if (refused)
        return NULL;
    if (!pool)
        return dk_dist_run_start(&d->host, kind, options, payload, len);
    dk_dist_run_t *run = dk_dist_run_start_on(&d->host, pool, kind, options, payload, len);
    /* The ranks may end between the look above and the cell's submit (a rank
     * killed just before): that is the same news, told the same way. */
    if (!run && d->pool && !dk_dist_pool_busy(d->pool) && !dk_dist_pool_alive(d->pool) &&
        PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        PyErr_Clear();
        gone_error(d);
    }
    return run;
}

/* A run on the started ranks that failed because they had ended before its
 * cell reached them (killed while idle, and the kernel had not seen it yet):
 * frees the run and sets the same exception pool_for_run gives when the kernel
 * had seen it, so the message does not depend on who was first. */
static bool run_gone_before_cell(dk_distributed_t *d, dk_dist_run_t **run)
{
    if (!d->pool || !dk_dist_run_pool_gone_before_cell(*run))
        return false;
    dk_dist_run_destroy(run);  /* frees the pool it borrowed */
    gone_error(d);
    return true;
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
    const char *msg = s ? dk_py_utf8(s) : NULL;
    char name[128];
    dk_exec_error(ex, dk_py_type_name(type, name, sizeof name), msg ? msg : "", NULL);
    PyErr_Clear();
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* A cell's run that ended OK: the glue stores the results under result= and
 * says what the cell shows. Returns -1 with the cell's error reported. */
static int cell_result(dk_exec_t *ex, dk_dist_run_t *run)
{
    PyObject *results = dk_dist_run_results(run);
    PyObject *bundle = results ? glue_call("finish_cell", "(Ns)", results,
                                           dk_dist_run_result_name(run))
                               : NULL;
    if (!bundle) {
        exec_error_from_python(ex);
        return -1;
    }
    if (bundle != Py_None) {
        PyObject *text = glue_call("dumps", "(O)", bundle);
        json_t *data = text ? json_loads(dk_py_utf8(text), 0, NULL) : NULL;
        if (data)
            dk_exec_result(ex, data);
        json_decref(data);
        Py_XDECREF(text);
        PyErr_Clear();
    }
    Py_DECREF(bundle);
    return 0;
}

static void exec_run_error(dk_exec_t *ex, dk_dist_run_t *run);

/* %%distributed: the handler dk_magic calls with the cell's exec context. */
static int distributed_magic(void *host, void *data, const char *args, const char *body)
{
    dk_exec_t *ex = host;
    dk_distributed_t *d = data;
    PyObject *payload = glue_call("prepare_cell", "(s)", body);
    char *p;
    Py_ssize_t len;
    if (!payload || PyBytes_AsStringAndSize(payload, &p, &len) < 0) {
        Py_XDECREF(payload);
        exec_error_from_python(ex);
        return -1;
    }
    dk_dist_run_t *run = run_start(d, "cell", args, p, (size_t)len);
    Py_DECREF(payload);
    if (!run) {
        exec_error_from_python(ex);
        return -1;
    }
    int rc;
    if (dk_dist_run_wait(run) == DK_END_OK) {
        rc = cell_result(ex, run);
    } else if (run_gone_before_cell(d, &run)) {
        exec_error_from_python(ex);
        rc = -1;
    } else {
        exec_run_error(ex, run);
        rc = -1;
    }
    dk_dist_run_destroy(&run);
    return rc;
}

/* A .distributed() call's run that did not end OK: raise its error through the
 * glue (distkernel.DistributedError, KeyboardInterrupt, TimeoutError...). */
static void raise_run_error(dk_dist_run_t *run)
{
    json_t *e = dk_dist_run_error(run, false);
    PyObject *tb = PyList_New(0);
    size_t i;
    json_t *line;
    json_array_foreach(json_object_get(e, "traceback"), i, line) {
        PyObject *s = tb ? PyUnicode_FromString(json_string_value(line)) : NULL;
        if (s) {
            PyList_Append(tb, s);
            Py_DECREF(s);
        }
    }
    PyObject *res = tb ? glue_call("raise_error", "(ssN)",
                                   json_string_value(json_object_get(e, "ename")),
                                   json_string_value(json_object_get(e, "evalue")), tb)
                       : NULL;
    Py_XDECREF(res);   /* raise_error raises: res is NULL with the exception set */
    json_decref(e);
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
    const char *payload;
    Py_ssize_t payload_len;
    if (!PyArg_ParseTuple(args, "sy#", &options, &payload, &payload_len))
        return NULL;
    dk_dist_run_t *run = run_start(d, "function", options, payload, (size_t)payload_len);
    if (!run)
        return NULL;
    PyObject *out = NULL;
    if (dk_dist_run_wait(run) == DK_END_OK) {
        PyObject *results = dk_dist_run_results(run);
        if (results)
            out = Py_BuildValue("(Nss)", results, dk_dist_run_log_dir(run), dk_dist_run_url(run));
    } else if (run_gone_before_cell(d, &run)) {
        /* the exception is set */
    } else {
        raise_run_error(run);
    }
    dk_dist_run_destroy(&run);
    return out;
}

static void say(dk_distributed_t *d, const char *text)
{
    dk_stream_write(dk_kernel_stream(d->host.kernel), DK_STDOUT, text, strlen(text));
}

/* A run's error as the cell's error. */
static void exec_run_error(dk_exec_t *ex, dk_dist_run_t *run)
{
    json_t *e = dk_dist_run_error(run, true);
    dk_exec_error(ex, json_string_value(json_object_get(e, "ename")),
                  json_string_value(json_object_get(e, "evalue")),
                  json_object_get(e, "traceback"));
    json_decref(e);
}

/* Whether the started ranks are in use by a run (another thread's call may
 * come while a cell waits with the GIL released): said as EX's error. */
static bool pool_refused_busy(dk_exec_t *ex, dk_distributed_t *d)
{
    if (d->starting) {
        dk_exec_error(ex, "RuntimeError", POOL_STARTING_TEXT, NULL);
        return true;
    }
    if (!d->pool || !dk_dist_pool_busy(d->pool))
        return false;
    dk_exec_error(ex, "RuntimeError", DK_DIST_POOL_BUSY_TEXT, NULL);
    return true;
}

static int pool_start(dk_exec_t *ex, dk_distributed_t *d, const char *options)
{
    if (pool_refused_busy(ex, d))
        return -1;
    if (d->pool && dk_dist_pool_alive(d->pool)) {
        char msg[512];
        snprintf(msg, sizeof msg, "ranks are already started (%s); `%%distributed stop` or "
                 "`%%distributed restart` first", dk_dist_pool_plan(d->pool)->what);
        dk_exec_error(ex, "RuntimeError", msg, NULL);
        return -1;
    }
    dk_dist_pool_destroy(&d->pool);
    /* Kept whole, however long: restart starts exactly these again. */
    char *kept = strdup(options);
    if (!kept) {
        dk_exec_error(ex, "MemoryError", "out of memory for the start's options", NULL);
        return -1;
    }
    /* Starting and waiting release the GIL: until the pool is set, another
     * thread's start, stop or run is refused (POOL_STARTING_TEXT). */
    d->starting = true;
    dk_dist_run_t *run = dk_dist_run_start_pool(&d->host, options);
    if (!run) {
        d->starting = false;
        free(kept);
        exec_error_from_python(ex);
        return -1;
    }
    int rc = 0;
    dk_job_end_t end = dk_dist_run_wait(run);
    d->starting = false;
    if (end == DK_END_OK) {
        d->pool = dk_dist_run_take_pool(run);
        free(d->pool_options);
        d->pool_options = kept;
        kept = NULL;
        char line[512];
        snprintf(line, sizeof line, "started %s (%s): %%%%distributed cells now run on them\n",
                 dk_dist_pool_plan(d->pool)->what, dk_dist_pool_id(d->pool));
        say(d, line);
    } else {
        exec_run_error(ex, run);
        rc = -1;
    }
    free(kept);
    dk_dist_run_destroy(&run);
    return rc;
}

static int pool_stop(dk_exec_t *ex, dk_distributed_t *d)
{
    if (pool_refused_busy(ex, d))
        return -1;
    if (!d->pool) {
        say(d, "no ranks are started\n");
        return 0;
    }
    bool alive = dk_dist_pool_alive(d->pool);
    Py_BEGIN_ALLOW_THREADS
    dk_dist_pool_destroy(&d->pool);
    Py_END_ALLOW_THREADS
    say(d, alive ? "stopped the started ranks\n" : "the started ranks had already ended\n");
    return 0;
}

/* %distributed start OPTIONS | status | stop | restart */
static int distributed_line_magic(void *host, void *data, const char *args, const char *body)
{
    (void)body;
    dk_exec_t *ex = host;
    dk_distributed_t *d = data;
    char verb[16] = "";
    size_t n = strcspn(args, " \t");
    if (n < sizeof verb)
        snprintf(verb, sizeof verb, "%.*s", (int)n, args);
    const char *rest = args + n + strspn(args + n, " \t");
    if (strcmp(verb, "start") == 0)
        return pool_start(ex, d, rest);
    if (*rest) {
        dk_exec_error(ex, "ValueError", "%distributed status, stop and restart take no options",
                      NULL);
        return -1;
    }
    if (strcmp(verb, "stop") == 0)
        return pool_stop(ex, d);
    if (strcmp(verb, "restart") == 0) {
        if (pool_refused_busy(ex, d))
            return -1;
        if (!d->pool) {
            dk_exec_error(ex, "RuntimeError", "no ranks are started: `%distributed start "
                          "OPTIONS` starts them", NULL);
            return -1;
        }
        char *options = strdup(d->pool_options ? d->pool_options : "");
        if (!options) {
            dk_exec_error(ex, "MemoryError", "out of memory for the start's options", NULL);
            return -1;
        }
        int rc = pool_stop(ex, d) < 0 ? -1 : pool_start(ex, d, options);
        free(options);
        return rc;
    }
    if (strcmp(verb, "status") == 0) {
        char template_line[256];
        dk_dist_warm_status_line(&d->warm, template_line, sizeof template_line);
        if (template_line[0])
            say(d, template_line);
        if (!d->pool) {
            say(d, "no ranks are started (`%distributed start OPTIONS` starts them)\n");
        } else if (!dk_dist_pool_alive(d->pool)) {
            char why[512], line[800];
            dk_dist_pool_gone_text(d->pool, why, sizeof why);
            snprintf(line, sizeof line, "the started ranks are gone: %s\n", why);
            say(d, line);
        } else {
            char *text = dk_dist_pool_status_text(d->pool);
            if (text) {
                say(d, text);
                say(d, "\n");
            }
            free(text);
        }
        return 0;
    }
    dk_exec_error(ex, "ValueError", "usage: %distributed start OPTIONS | status | stop | "
                  "restart (OPTIONS as for %%distributed, plus idle_timeout=SECONDS)", NULL);
    return -1;
}

/* At exit, the started ranks end and are waited for. The pool is not freed:
 * this may run on the control thread while the main thread is still inside a
 * cell that uses it (a shutdown that the cell did not give way to), and the
 * process is about to end anyway. */
static void stop_pool(void *data)
{
    dk_distributed_t *d = data;
    /* On Slurm's nodes this also waits for the allocation's release. */
    if (d->pool)
        dk_dist_pool_end(d->pool);
}

/* At exit the template goes with its folder (it would die with the kernel
 * anyway, but leave the folder). Not freed, as for the pool. */
static void stop_template(void *data)
{
    dk_distributed_t *d = data;
    dk_dist_warm_end(&d->warm);
}

static void stop_tracking_server(void *data)
{
    dk_tracking_stop_server(data);
}

dk_distributed_t *dk_distributed_new(dk_kernel_t *kernel)
{
    dk_distributed_t *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->tracking = dk_tracking_new();
    d->host = (dk_dist_host_t){.kernel = kernel, .logs = &d->logs, .tracking = d->tracking,
                               .warm = &d->warm, .pythonpath_said = &d->pythonpath_said};
    d->magic = (dk_magic_t){.name = "distributed", .kind = DK_MAGIC_CELL, .doc = dk_dist_doc,
                            .run = distributed_magic, .data = d};
    dk_kernel_function_t fn = {.name = "run_job", .fn = (void (*)(void))run_job, .flags = METH_VARARGS,
                               .doc = "run_job(options_text, payload) -> (results, log_dir, "
                                      "run_url): run a pickled job as ranks.",
                               .data = d};
    d->line_magic = (dk_magic_t){.name = "distributed", .kind = DK_MAGIC_LINE,
                                 .doc = dk_dist_doc, .run = distributed_line_magic, .data = d};
    if (!d->tracking || dk_magic_register(dk_kernel_magics(kernel), &d->magic) < 0 ||
        dk_magic_register(dk_kernel_magics(kernel), &d->line_magic) < 0 ||
        dk_kernel_on_exit(kernel, stop_pool, d) < 0 ||
        dk_kernel_on_exit(kernel, stop_template, d) < 0 ||
        dk_kernel_add_function(kernel, &fn) < 0 ||
        dk_kernel_on_exit(kernel, stop_tracking_server, d->tracking) < 0) {
        dk_tracking_destroy(&d->tracking);
        free(d);
        return NULL;
    }
    return d;
}
