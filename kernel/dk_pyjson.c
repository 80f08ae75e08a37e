/*
 * dk_pyjson: JSON values to Python objects and back. See dk_pyjson.h.
 *
 * Both directions recurse, bounded by DK_PYJSON_MAX_DEPTH: a reply nested
 * deeper than that is a bug in what produced it, and is refused rather than
 * allowed to exhaust the C stack.
 */
#include "dk_pyjson.h"

#include <math.h>
#include <stdbool.h>

static PyObject *to_python(json_t *v, int depth);

static PyObject *object_to_python(json_t *v, int depth)
{
    PyObject *d = PyDict_New();
    const char *key;
    json_t *item;
    json_object_foreach(v, key, item)
    {
        PyObject *pv = d ? to_python(item, depth + 1) : NULL;
        int rc = pv ? PyDict_SetItemString(d, key, pv) : -1;
        Py_XDECREF(pv);
        if (rc < 0) {
            Py_XDECREF(d);
            return NULL;
        }
    }
    return d;
}

static PyObject *array_to_python(json_t *v, int depth)
{
    PyObject *l = PyList_New((Py_ssize_t)json_array_size(v));
    size_t i;
    json_t *item;
    json_array_foreach(v, i, item)
    {
        PyObject *pv = l ? to_python(item, depth + 1) : NULL;
        if (!pv) {
            Py_XDECREF(l);
            return NULL;
        }
        if (PyList_SetItem(l, (Py_ssize_t)i, pv) < 0) {   /* steals pv */
            Py_DECREF(l);
            return NULL;
        }
    }
    return l;
}

static PyObject *to_python(json_t *v, int depth)
{
    if (depth > DK_PYJSON_MAX_DEPTH) {
        PyErr_SetString(PyExc_RecursionError, "JSON nested too deeply");
        return NULL;
    }
    switch (json_typeof(v)) {
    case JSON_OBJECT: return object_to_python(v, depth);
    case JSON_ARRAY: return array_to_python(v, depth);
    case JSON_STRING:
        return PyUnicode_DecodeUTF8(json_string_value(v), (Py_ssize_t)json_string_length(v),
                                    "replace");
    case JSON_INTEGER: return PyLong_FromLongLong(json_integer_value(v));
    case JSON_REAL: return PyFloat_FromDouble(json_real_value(v));
    case JSON_TRUE: Py_RETURN_TRUE;
    case JSON_FALSE: Py_RETURN_FALSE;
    default: Py_RETURN_NONE;
    }
}

PyObject *dk_pyjson_to_python(json_t *value)
{
    if (!value)
        Py_RETURN_NONE;
    return to_python(value, 0);
}

/* ---- Python to JSON ------------------------------------------------------------ */

static json_t *from_python(PyObject *o, PyObject *dflt, int depth);

static json_t *oom(void)
{
    PyErr_NoMemory();
    return NULL;
}

static json_t *str_from_python(PyObject *o)
{
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s) {
        json_t *j = json_stringn(s, (size_t)n);
        return j ? j : oom();
    }
    /* Lone surrogates have no UTF-8: replaced, as Python's json would escape
     * them into something no frontend can show either. */
    PyErr_Clear();
    PyObject *b = PyUnicode_AsEncodedString(o, "utf-8", "replace");
    json_t *j = b ? json_stringn(PyBytes_AsString(b), (size_t)PyBytes_Size(b)) : NULL;
    Py_XDECREF(b);
    return j ? j : (PyErr_Occurred() ? NULL : oom());
}

static json_t *int_from_python(PyObject *o)
{
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    if (!overflow)
        return json_integer(v);
    double d = PyLong_AsDouble(o);
    if (d == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return json_null();   /* beyond a double too: as NaN and infinities */
    }
    return json_real(d);
}

static json_t *dict_from_python(PyObject *o, PyObject *dflt, int depth)
{
    json_t *obj = json_object();
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (obj && PyDict_Next(o, &pos, &key, &value)) {
        PyObject *k = PyUnicode_Check(key) ? (Py_INCREF(key), key) : PyObject_Str(key);
        const char *ks = k ? dk_py_utf8(k) : NULL;
        json_t *jv = ks ? from_python(value, dflt, depth + 1) : NULL;
        int rc = jv ? json_object_set_new(obj, ks, jv) : -1;
        Py_XDECREF(k);
        if (rc < 0) {
            json_decref(obj);
            return PyErr_Occurred() ? NULL : oom();
        }
    }
    return obj ? obj : oom();
}

static json_t *sequence_from_python(PyObject *o, PyObject *dflt, int depth)
{
    json_t *arr = json_array();
    bool list = PyList_Check(o);
    Py_ssize_t n = list ? PyList_Size(o) : PyTuple_Size(o);
    for (Py_ssize_t i = 0; arr && i < n; i++) {
        PyObject *item = list ? PyList_GetItem(o, i) : PyTuple_GetItem(o, i);
        json_t *jv = item ? from_python(item, dflt, depth + 1) : NULL;
        if (!jv || json_array_append_new(arr, jv) < 0) {
            json_decref(arr);
            return PyErr_Occurred() ? NULL : oom();
        }
    }
    return arr ? arr : oom();
}

static json_t *from_python(PyObject *o, PyObject *dflt, int depth)
{
    if (depth > DK_PYJSON_MAX_DEPTH) {
        PyErr_SetString(PyExc_RecursionError, "a reply nested too deeply for JSON");
        return NULL;
    }
    if (o == Py_None)
        return json_null();
    if (PyBool_Check(o))
        return json_boolean(o == Py_True);
    if (PyLong_Check(o))
        return int_from_python(o);
    if (PyFloat_Check(o)) {
        double d = PyFloat_AsDouble(o);
        return isfinite(d) ? json_real(d) : json_null();
    }
    if (PyUnicode_Check(o))
        return str_from_python(o);
    if (PyDict_Check(o))
        return dict_from_python(o, dflt, depth);
    if (PyList_Check(o) || PyTuple_Check(o))
        return sequence_from_python(o, dflt, depth);
    if (!dflt) {
        char name[128];
        PyErr_Format(PyExc_TypeError, "%s is not JSON",
                     dk_py_type_name((PyObject *)Py_TYPE(o), name, sizeof name));
        return NULL;
    }
    PyObject *plain = PyObject_CallFunctionObjArgs(dflt, o, NULL);
    json_t *j = plain ? from_python(plain, dflt, depth + 1) : NULL;
    Py_XDECREF(plain);
    return j;
}

json_t *dk_pyjson_from_python(PyObject *obj, PyObject *dflt)
{
    return from_python(obj, dflt, 0);
}
