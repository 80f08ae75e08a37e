/*
 * dk_distributed: the feature object and its Python entry points. See the
 * header.
 *
 * The feature is a few files, one idea each:
 *   dk_dist_run        a run's lifecycle: start, wait, result or error
 *   dk_dist_relay      rank output to "[rank N]" lines and progress displays
 *   dk_dist_outcome    what the user is told about each rank of a failed run
 *   dk_dist_status     the run's status display text
 *   dk_dist_plan       how many ranks, on which devices
 *   dk_dist_logs       the run's log folder, and how many the kernel keeps
 *   dk_dist_mlflow     the run's MLflow variables, notes and link
 *   dk_dist_preflight  check=True
 * Here: %%distributed and `_distkernel.run_job`, which turn a run's end into
 * the cell's result or error, or into what .distributed() returns or raises;
 * and the feature, which holds what outlives a run (its log folders).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dk_distributed.h"
#include "dk_dist_logs.h"
#include "dk_dist_opts.h"
#include "dk_dist_run.h"
#include "dk_python.h"
#include "dk_tracking.h"

#include <stdarg.h>
#include <stdlib.h>

/* The feature, one per kernel: what it needs of the kernel, its magic, and
 * what outlives a run (which run folders this kernel keeps). */
struct dk_distributed_t {
    dk_dist_host_t host;        /* the kernel, and what outlives a run: */
    dk_dist_logs_t logs;        /* which run folders this kernel keeps */
    dk_tracking_t *tracking;    /* the MLflow server it started, its experiment */
    dk_magic_t magic;
};

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
        json_t *data = text ? json_loads(PyUnicode_AsUTF8(text), 0, NULL) : NULL;
        if (data)
            dk_exec_result(ex, data);
        json_decref(data);
        Py_XDECREF(text);
        PyErr_Clear();
    }
    Py_DECREF(bundle);
    return 0;
}

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
    dk_dist_run_t *run = dk_dist_run_start(&d->host, "cell", args, p, (size_t)len);
    Py_DECREF(payload);
    if (!run) {
        exec_error_from_python(ex);
        return -1;
    }
    int rc;
    if (dk_dist_run_wait(run) == DK_END_OK) {
        rc = cell_result(ex, run);
    } else {
        json_t *e = dk_dist_run_error(run, true);
        dk_exec_error(ex, json_string_value(json_object_get(e, "ename")),
                      json_string_value(json_object_get(e, "evalue")),
                      json_object_get(e, "traceback"));
        json_decref(e);
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
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "sy*", &options, &payload))
        return NULL;
    dk_dist_run_t *run = dk_dist_run_start(&d->host, "function", options, payload.buf,
                                           (size_t)payload.len);
    PyBuffer_Release(&payload);
    if (!run)
        return NULL;
    PyObject *out = NULL;
    if (dk_dist_run_wait(run) == DK_END_OK) {
        PyObject *results = dk_dist_run_results(run);
        if (results)
            out = Py_BuildValue("(Nss)", results, dk_dist_run_log_dir(run), dk_dist_run_url(run));
    } else {
        raise_run_error(run);
    }
    dk_dist_run_destroy(&run);
    return out;
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
    d->host = (dk_dist_host_t){.kernel = kernel, .logs = &d->logs, .tracking = d->tracking};
    d->magic = (dk_magic_t){.name = "distributed", .kind = DK_MAGIC_CELL, .doc = dk_dist_doc,
                            .run = distributed_magic, .data = d};
    dk_kernel_function_t fn = {.name = "run_job", .fn = (void (*)(void))run_job, .flags = METH_VARARGS,
                               .doc = "run_job(options_text, payload) -> (results, log_dir, "
                                      "run_url): run a pickled job as ranks.",
                               .data = d};
    if (!d->tracking || dk_magic_register(dk_kernel_magics(kernel), &d->magic) < 0 ||
        dk_kernel_add_function(kernel, &fn) < 0 ||
        dk_kernel_on_exit(kernel, stop_tracking_server, d->tracking) < 0) {
        dk_tracking_destroy(&d->tracking);
        free(d);
        return NULL;
    }
    return d;
}
