/*
 * dk_python: the embedded interpreter, the `_distkernel` built-in module, and the
 * calls into the glue object (python/distkernel/_kernel.py).
 *
 * The interpreter is the one the kernel was built against (a meson option), and
 * sys.executable names that interpreter, not this binary, so subprocess and
 * multiprocessing start a real Python. Python installs its SIGINT handler during
 * initialisation; nothing in C installs one before it.
 */
#include "dk_pyabi.h"

#include "dk_python.h"
#include "dk_err.h"
#include "dk_pyinit.h"
#include "dk_pyload.h"
#include "dk_pyjson.h"
#include "dk_tidy.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static PyObject *glue;   /* the distkernel._kernel.Kernel instance */
static PyObject *json_default;   /* how the glue makes JSON of what has no JSON type */
static PyObject *handled_types;  /* frozenset of the shell messages the glue answers */
static atomic_bool ready; /* glue loaded: other threads may call in */

const char *dk_python_version(void)
{
    static char version[32];
    if (!version[0]) {
        const char *v = Py_GetVersion();
        size_t n = strcspn(v, " ");
        if (n >= sizeof version)
            n = sizeof version - 1;
        memcpy(version, v, n);
    }
    return version;
}

/* ---- the _distkernel module --------------------------------------------------- */

/* The module's state is the kernel it belongs to (set by dk_python_start before
 * any Python code runs): its functions find the kernel there, not in a global. */
static dk_kernel_t *kernel_of(PyObject *module)
{
    return *(dk_kernel_t **)PyModule_GetState(module);
}

static PyObject *py_publish(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"msg_type", "content", "metadata", "buffers", "parent", NULL};
    const char *msg_type, *content, *metadata = NULL, *parent = NULL;
    PyObject *buffers = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|zOz", names, &msg_type, &content, &metadata,
                                     &buffers, &parent))
        return NULL;
    zframe_t *frames[64];
    size_t n = 0;
    if (buffers != Py_None) {
        PyObject *seq = PySequence_Tuple(buffers);
        if (!seq)
            return NULL;
        Py_ssize_t len = PyTuple_Size(seq);
        if (len > 64) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "at most 64 buffers per message");
            return NULL;
        }
        for (Py_ssize_t i = 0; i < len; i++) {
            /* bytes as they are; a bytearray or memoryview through a copy
             * (the stable ABI of 3.10 has no buffer protocol). */
            PyObject *item = PyTuple_GetItem(seq, i);
            PyObject *b = item ? (PyBytes_Check(item) ? (Py_INCREF(item), item)
                                                      : PyBytes_FromObject(item))
                               : NULL;
            char *data;
            Py_ssize_t size;
            if (!b || PyBytes_AsStringAndSize(b, &data, &size) < 0) {
                Py_XDECREF(b);
                for (size_t j = 0; j < n; j++)
                    zframe_destroy(&frames[j]);
                Py_DECREF(seq);
                return NULL;
            }
            frames[n++] = zframe_new(data, (size_t)size);
            Py_DECREF(b);
        }
        Py_DECREF(seq);
    }
    dk_kernel_t *k = kernel_of(self);
    if (strcmp(msg_type, "stream") != 0)
        dk_stream_flush(dk_kernel_stream(k));
    int rc = dk_iopub_publish_text(dk_kernel_iopub(k), msg_type, content, metadata, parent,
                                   frames, n);
    for (size_t j = 0; j < n; j++)
        zframe_destroy(&frames[j]);
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "could not publish a %s message", msg_type);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_stream_write(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "stream_write(which, text)");
        return NULL;
    }
    long which = PyLong_AsLong(args[0]);
    if (which == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(args[1], &len);
    if (!text)
        return NULL;
    if (len > 0)
        dk_stream_write(dk_kernel_stream(kernel_of(self)),
                        which == 2 ? DK_STDERR : DK_STDOUT, text, (size_t)len);
    Py_RETURN_NONE;
}

static PyObject *py_flush(PyObject *self, PyObject *unused)
{
    /* Kept under the GIL: a flush never waits long (non-blocking reads and a
     * PUB send), and releasing the GIL here would hand it to IPython's history
     * thread in the middle of every cell. */
    dk_stream_flush(dk_kernel_stream(kernel_of(self)));
    Py_RETURN_NONE;
}

static PyObject *py_fork_source(PyObject *self, PyObject *unused)
{
    int fds[2];
    if (dk_stream_fork_source(dk_kernel_stream(kernel_of(self)), fds) < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(ii)", fds[0], fds[1]);
}

static PyObject *py_input_request(PyObject *self, PyObject *args)
{
    const char *prompt;
    int password = 0;
    if (!PyArg_ParseTuple(args, "s|p", &prompt, &password))
        return NULL;
    char *answer = dk_kernel_input(kernel_of(self), prompt, password);
    if (!answer)
        return NULL;
    PyObject *out = PyUnicode_DecodeUTF8(answer, (Py_ssize_t)strlen(answer), "replace");
    free(answer);
    return out;
}

static PyObject *py_parent(PyObject *self, PyObject *unused)
{
    char *p = dk_iopub_parent(dk_kernel_iopub(kernel_of(self)));
    if (!p)
        return PyErr_NoMemory();
    PyObject *out = PyUnicode_FromString(p);
    free(p);
    return out;
}

static PyObject *py_session(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(dk_iopub_session(dk_kernel_iopub(kernel_of(self))));
}

static PyObject *py_native_magics(PyObject *self, PyObject *unused)
{
    dk_magic_registry_t *reg = dk_kernel_magics(kernel_of(self));
    PyObject *out = PyList_New(0);
    for (size_t i = 0; out && i < dk_magic_count(reg); i++) {
        const dk_magic_t *m = dk_magic_at(reg, i);
        PyObject *t = Py_BuildValue("(sss)", m->name, m->kind == DK_MAGIC_CELL ? "cell" : "line",
                                    m->doc ? m->doc : "");
        if (!t || PyList_Append(out, t) < 0) {
            Py_XDECREF(t);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(t);
    }
    return out;
}

/* A native magic called from Python code (get_ipython().run_cell_magic(...)):
 * its error becomes a Python exception in the calling cell. */
static PyObject *py_run_native_magic(PyObject *self, PyObject *args)
{
    const char *name, *line, *cell = NULL;
    int count;
    if (!PyArg_ParseTuple(args, "ssiz", &name, &line, &count, &cell))
        return NULL;
    dk_kernel_t *k = kernel_of(self);
    const dk_magic_t *m =
        dk_magic_find(dk_kernel_magics(k), name, cell ? DK_MAGIC_CELL : DK_MAGIC_LINE);
    if (!m) {
        PyErr_Format(PyExc_LookupError, "no native magic %s%s", cell ? "%%" : "%", name);
        return NULL;
    }
    dk_magic_call_t call = {.magic = m, .args = (char *)line, .body = (char *)(cell ? cell : "")};
    dk_exec_t ex = {.kernel = k, .execution_count = count};
    dk_magic_run(&call, &ex);
    if (PyErr_Occurred()) {
        json_decref(ex.error);
        return NULL;
    }
    if (ex.error) {
        PyErr_Format(PyExc_RuntimeError, "%s: %s",
                     json_string_value(json_object_get(ex.error, "ename")),
                     json_string_value(json_object_get(ex.error, "evalue")));
        json_decref(ex.error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_log(PyObject *self, PyObject *args)
{
    const char *text;
    if (!PyArg_ParseTuple(args, "s", &text))
        return NULL;
    dk_log("%s", text);
    Py_RETURN_NONE;
}

static PyObject *py_tidy_keep(PyObject *self, PyObject *args)
{
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    char err[256];
    if (dk_tidy_keep(path, err, sizeof err) < 0)
        return PyErr_Format(PyExc_OSError, "%s", err);
    Py_RETURN_NONE;
}

static PyObject *py_tidy_forget(PyObject *self, PyObject *args)
{
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    dk_tidy_forget(path);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"log", py_log, METH_VARARGS, "log(text): write a line to the kernel's log (its stderr)."},
    {"publish", (PyCFunction)(void (*)(void))py_publish, METH_VARARGS | METH_KEYWORDS,
     "publish(msg_type, content_json, metadata_json=None, buffers=None, parent=None): send "
     "on IOPub under PARENT (header JSON), by default the current parent."},
    {"stream_write", (PyCFunction)(void (*)(void))py_stream_write, METH_FASTCALL,
     "stream_write(fd, text): append text to the cell's stdout (1) or stderr (2)."},
    {"flush", py_flush, METH_NOARGS, "flush(): publish buffered output now."},
    {"fork_source", py_fork_source, METH_NOARGS,
     "fork_source() -> (stdout_fd, stderr_fd) or None: pipes for a child about to be "
     "forked, whose output belongs to the running cell."},
    {"input_request", py_input_request, METH_VARARGS,
     "input_request(prompt, password=False): ask the frontend for a line."},
    {"tidy_keep", py_tidy_keep, METH_VARARGS,
     "tidy_keep(path): remove the folder PATH when the kernel ends, even by SIGKILL."},
    {"tidy_forget", py_tidy_forget, METH_VARARGS,
     "tidy_forget(path): the folder PATH was removed: do not remove it at the end."},
    {"parent", py_parent, METH_NOARGS, "parent(): the current parent header (JSON)."},
    {"session", py_session, METH_NOARGS, "session(): the kernel's session id."},
    {"native_magics", py_native_magics, METH_NOARGS,
     "native_magics(): [(name, 'line'|'cell', doc)] handled by the kernel in C."},
    {"run_native_magic", py_run_native_magic, METH_VARARGS,
     "run_native_magic(name, line, execution_count, cell_or_None)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_distkernel",
                                        "The distkernel kernel, seen from Python.",
                                        sizeof(dk_kernel_t *),
                                        module_methods, NULL, NULL, NULL, NULL};

static PyObject *init_module(void)
{
    return PyModule_Create(&module_def);
}

/* ---- interpreter -------------------------------------------------------------- */

/* Log the pending Python exception, with its traceback, to the kernel's log
 * (not to sys.stderr, which is the cell's output), and clear it. */
static void log_python_error(const char *what)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *text = NULL;
    PyObject *mod = PyImport_ImportModule("traceback");
    if (mod && type) {
        PyObject *lines = PyObject_CallMethod(mod, "format_exception", "(OOO)", type,
                                              value ? value : Py_None, tb ? tb : Py_None);
        PyObject *empty = PyUnicode_FromString("");
        if (lines && empty)
            text = PyUnicode_Join(empty, lines);
        Py_XDECREF(lines);
        Py_XDECREF(empty);
    }
    Py_XDECREF(mod);
    const char *msg = text ? dk_py_utf8(text) : NULL;
    dk_log("%s failed:\n%s", what, msg ? msg : "(no traceback)");
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
}

#define FUNCTION_DATA "distkernel.function_data"

void *dk_python_function_data(PyObject *self)
{
    return PyCapsule_GetPointer(self, FUNCTION_DATA);
}

/* Give the _distkernel module its kernel, and the functions the features
 * added (dk_kernel_add_function), each bound to its data. */
static int bind_module(dk_kernel_t *k, char *err, size_t errlen)
{
    PyObject *m = PyImport_ImportModule("_distkernel");
    if (!m) {
        log_python_error("import _distkernel");
        dk_set_err(err, errlen, "cannot create the _distkernel module");
        return -1;
    }
    *(dk_kernel_t **)PyModule_GetState(m) = k;
    PyObject *name = PyModule_GetNameObject(m);
    int rc = name ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < dk_kernel_function_count(k); i++) {
        const dk_kernel_function_t *f = dk_kernel_function_at(k, i);
        /* CPython keeps a pointer to the definition: it lives as long as the
         * process, like the interpreter. */
        PyMethodDef *def = calloc(1, sizeof *def);
        PyObject *data = def ? PyCapsule_New(f->data, FUNCTION_DATA, NULL) : NULL;
        PyObject *fn = data ? (def->ml_name = f->name, def->ml_meth = (PyCFunction)f->fn,
                               def->ml_flags = f->flags, def->ml_doc = f->doc,
                               PyCFunction_NewEx(def, data, name))
                            : NULL;
        Py_XDECREF(data);
        if (!fn || PyModule_AddObject(m, f->name, fn) < 0) {
            Py_XDECREF(fn);
            rc = -1;
        }
    }
    Py_XDECREF(name);
    Py_DECREF(m);
    if (rc < 0) {
        log_python_error("adding the features' functions to _distkernel");
        dk_set_err(err, errlen, "cannot add the features' functions to _distkernel");
    }
    return rc;
}

/* Which of the modules the kernel needs the environment lacks: 0, or -1 with
 * the line that says so and how to add them. */
static int check_modules(char *err, size_t errlen)
{
    static const char *const needed[][2] = {{"IPython", "ipython"},
                                            {"cloudpickle", "cloudpickle"}};
    char missing[64] = "", pkgs[64] = "";
    PyObject *util = PyImport_ImportModule("importlib.util");
    for (size_t i = 0; util && i < sizeof needed / sizeof *needed; i++) {
        PyObject *spec = PyObject_CallMethod(util, "find_spec", "(s)", needed[i][0]);
        if (spec == Py_None) {
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s",
                     *missing ? " and " : "", needed[i][0]);
            snprintf(pkgs + strlen(pkgs), sizeof pkgs - strlen(pkgs), " %s", needed[i][1]);
        }
        Py_XDECREF(spec);
        PyErr_Clear();
    }
    Py_XDECREF(util);
    PyErr_Clear();
    if (!*missing)
        return 0;
    const char *python = dk_pyload_python();
    dk_set_err(err, errlen,
               "this kernel's environment %s lacks %s, which the kernel needs: install it "
               "there (%s -m pip install%s) and restart the kernel",
               python, missing, python, pkgs);
    return -1;
}

int dk_python_start(dk_kernel_t *k, char *err, size_t errlen)
{
    if (PyImport_AppendInittab("_distkernel", init_module) < 0) {
        dk_set_err(err, errlen, "cannot register the _distkernel module");
        return -1;
    }
    if (dk_pyinit_start("", err, errlen) < 0 || check_modules(err, errlen) < 0 ||
        bind_module(k, err, errlen) < 0)
        return -1;
    PyObject *mod = PyImport_ImportModule("distkernel._kernel");
    if (mod) {
        glue = PyObject_CallMethod(mod, "Kernel", NULL);
        json_default = PyObject_GetAttrString(mod, "_default");
        Py_DECREF(mod);
    }
    if (!glue) {
        log_python_error("cannot load the kernel's Python glue");
        dk_set_err(err, errlen, "cannot load distkernel._kernel (see the log above)");
        return -1;
    }
    handled_types = PyObject_CallMethod(glue, "message_types", NULL);
    if (!handled_types || !json_default) {
        log_python_error("the glue's message types");
        dk_set_err(err, errlen, "distkernel._kernel is incomplete (see the log above)");
        return -1;
    }
    atomic_store(&ready, true);
    return 0;
}

bool dk_python_handles(const char *msg_type)
{
    PyObject *t = PyUnicode_FromString(msg_type);
    int found = t ? PySequence_Contains(handled_types, t) : -1;
    Py_XDECREF(t);
    if (found < 0)
        PyErr_Clear();
    return found == 1;
}

/* Call glue.METHOD(*ARGS) (ARGS stolen) expecting a dict (or None); returns
 * it as JSON, NULL for None. A failure in the glue is logged and answered as
 * an error reply naming it. */
static json_t *call_json(const char *method, PyObject *args)
{
    PyObject *fn = args ? PyObject_GetAttrString(glue, method) : NULL;
    PyObject *res = fn ? PyObject_Call(fn, args, NULL) : NULL;
    Py_XDECREF(fn);
    Py_XDECREF(args);
    json_t *out = NULL;
    if (res && res != Py_None)
        out = dk_pyjson_from_python(res, json_default);
    if (!res || (res != Py_None && !out)) {
        log_python_error(method);
        out = json_pack("{s:s, s:s, s:s, s:[]}", "status", "error", "ename", "InternalError",
                        "evalue", "distkernel's Python glue failed; see the kernel log",
                        "traceback");
    }
    Py_XDECREF(res);
    return out;
}

json_t *dk_python_handle(const char *msg_type, json_t *content, zframe_t *const *buffers,
                         size_t n_buffers)
{
    PyObject *bufs = PyList_New((Py_ssize_t)n_buffers);
    for (size_t i = 0; bufs && i < n_buffers; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)zframe_data(buffers[i]),
                                                (Py_ssize_t)zframe_size(buffers[i]));
        if (!b || PyList_SetItem(bufs, (Py_ssize_t)i, b) < 0)   /* steals b */
            Py_CLEAR(bufs);
    }
    PyObject *c = bufs ? dk_pyjson_to_python(content) : NULL;
    if (!c) {
        Py_XDECREF(bufs);
        return call_json("handle", NULL);
    }
    return call_json("handle", Py_BuildValue("(sNN)", msg_type, c, bufs));
}

int dk_python_native_begin(const char *code, bool silent, bool store_history)
{
    PyObject *res = PyObject_CallMethod(glue, "native_begin", "(sii)", code, (int)silent,
                                        (int)store_history);
    if (!res) {
        log_python_error("native_begin");
        return 0;
    }
    int count = (int)PyLong_AsLong(res);
    Py_DECREF(res);
    return count;
}

json_t *dk_python_native_finish(int execution_count, json_t *error, json_t *user_expressions)
{
    PyObject *e = dk_pyjson_to_python(error);
    PyObject *u = e ? dk_pyjson_to_python(user_expressions) : NULL;
    if (!u) {
        Py_XDECREF(e);
        return call_json("native_finish", NULL);
    }
    return call_json("native_finish", Py_BuildValue("(iNN)", execution_count, e, u));
}

bool dk_python_history_pending(void)
{
    PyObject *res = PyObject_CallMethod(glue, "history_pending", NULL);
    if (!res) {
        log_python_error("history_pending");
        return false;
    }
    bool pending = PyObject_IsTrue(res) == 1;
    Py_DECREF(res);
    return pending;
}

void dk_python_write_history(void)
{
    PyObject *res = PyObject_CallMethod(glue, "write_history", NULL);
    if (!res)
        log_python_error("write_history");
    Py_XDECREF(res);
}

void dk_python_discard_interrupt(void)
{
    if (PyErr_CheckSignals() < 0)
        PyErr_Clear();
}

void dk_python_shutdown(void)
{
    PyObject *res = PyObject_CallMethod(glue, "shutdown", NULL);
    if (!res)
        log_python_error("shutdown");
    Py_XDECREF(res);
}

bool dk_python_debugger_available(void)
{
    /* find_spec looks for the package on sys.path without importing it. */
    PyObject *util = PyImport_ImportModule("importlib.util");
    PyObject *spec = util ? PyObject_CallMethod(util, "find_spec", "s", "debugpy") : NULL;
    bool found = spec && spec != Py_None;
    if (!spec)
        PyErr_Clear();
    Py_XDECREF(spec);
    Py_XDECREF(util);
    return found;
}

char *dk_python_debug_request(const char *content_json, const char *parent_json)
{
    if (!atomic_load(&ready))
        return strdup("{\"type\":\"response\",\"success\":false,"
                      "\"message\":\"the kernel is still starting; try again\"}");
    PyGILState_STATE gil = PyGILState_Ensure();
    char *out = NULL;
    PyObject *mod = PyImport_ImportModule("distkernel._debugger");
    PyObject *res = mod ? PyObject_CallMethod(mod, "handle", "(ss)", content_json, parent_json)
                        : NULL;
    if (res && PyUnicode_Check(res)) {
        const char *s = dk_py_utf8(res);
        out = s ? strdup(s) : NULL;
    }
    if (!res || !out) {
        log_python_error("debug_request");
        out = strdup("{\"type\":\"response\",\"success\":false,"
                     "\"message\":\"distkernel's debugger failed; see the kernel log\"}");
    }
    Py_XDECREF(res);
    Py_XDECREF(mod);
    PyGILState_Release(gil);
    return out;
}
