/*
 * dk_rankpath: the check of a remote rank's folders, for its Python. See the
 * header; the check itself is dk_logdir's, so the rank's folders and the log
 * root are held to the same rules by the same code.
 */
#include "dk_rankpath.h"

#include "dk_logdir.h"

#include <errno.h>

static PyObject *py_open(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *path_obj;
    if (!PyArg_ParseTuple(args, "O&", PyUnicode_FSConverter, &path_obj))
        return NULL;
    char err[1024] = "";
    const char *path = PyBytes_AsString(path_obj);
    int fd, e;
    Py_BEGIN_ALLOW_THREADS      /* a slow network filesystem must not hold the GIL */
    fd = dk_logdir_open(path, DK_LOGDIR_CODE, NULL, err, sizeof err);
    e = errno;
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (fd >= 0)
        return PyLong_FromLong(fd);
    PyObject *exc_args = Py_BuildValue("(is)", e ? e : EACCES, err);
    if (exc_args) {
        PyErr_SetObject(PyExc_OSError, exc_args);
        Py_DECREF(exc_args);
    }
    return NULL;
}

static PyMethodDef methods[] = {
    {"open", py_open, METH_VARARGS,
     "A descriptor on PATH if a remote rank may run in it or import from it; else OSError."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, DK_RANKPATH_MODULE,
    "Which folders a rank on another node may run in and import from.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyObject *dk_rankpath_init(void)
{
    return PyModule_Create(&module);
}
