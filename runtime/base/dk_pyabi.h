/*
 * dk_pyabi: how distkernel's C code sees CPython. Every file that calls
 * Python includes this header, never <Python.h> itself (a unit test checks).
 *
 * distkernel is one build for every CPython from 3.10 on (docs/architecture.md,
 * "One build, every Python"): its Python-using code is compiled against the
 * stable ABI of 3.10 (Py_LIMITED_API), links no libpython, and runs on the
 * libpython of the environment it serves, loaded at start (dk_pyload.h). So
 * only the limited API is here: no PyConfig, no struct fields, no macros that
 * reach into objects. The few helpers below stand in for the non-limited
 * calls the code would otherwise reach for.
 */
#ifndef DK_PYABI_H
#define DK_PYABI_H

#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdio.h>

/* Whether this thread holds the GIL. Outside the limited API, but a plain
 * int(void) that every libpython from 3.4 on exports (and the loader checks
 * every symbol when it loads distkernel's library). */
PyAPI_FUNC(int) PyGILState_Check(void);

/* The UTF-8 text of a str (owned by it), or NULL with an exception set. */
static inline const char *dk_py_utf8(PyObject *s)
{
    return PyUnicode_AsUTF8AndSize(s, NULL);
}

/* TYPE's __name__ (what ipykernel shows as an error's ename) in BUF, or
 * "Error" when it has none; never fails, never leaves an exception. */
static inline const char *dk_py_type_name(PyObject *type, char *buf, size_t len)
{
    PyObject *name = type ? PyObject_GetAttrString(type, "__name__") : NULL;
    const char *s = name && PyUnicode_Check(name) ? dk_py_utf8(name) : NULL;
    snprintf(buf, len, "%s", s ? s : "Error");
    Py_XDECREF(name);
    if (!s)
        PyErr_Clear();
    return buf;
}

#endif
