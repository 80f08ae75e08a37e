/*
 * JSON values to Python objects and back (kernel/dk_pyjson.h): the reply of
 * every shell request crosses here once, so what JSON cannot say must come out
 * as the glue's json.dumps made it.
 */
#include "dk_pyjson.h"

#include <criterion/criterion.h>
#include <math.h>

/* CPython keeps some of its memory until the process ends, even after
 * Py_Finalize (interned strings, type caches), and LeakSanitizer, which the
 * sanitizer pass runs on the unit tests, would report it for every test. Only
 * allocations made inside libpython are left out; this file's and
 * dk_pyjson's are still checked. LeakSanitizer reads this function itself. */
const char *__lsan_default_suppressions(void) __attribute__((used));
const char *__lsan_default_suppressions(void)
{
    return "leak:libpython";
}

/* ... and a suppression that matched is not itself a report. */
const char *__lsan_default_options(void) __attribute__((used));
const char *__lsan_default_options(void)
{
    return "print_suppressions=0";
}

static void start(void)
{
    Py_Initialize();
}

static void stop(void)
{
    Py_Finalize();
}

TestSuite(pyjson, .init = start, .fini = stop);

/* A Python expression's value. */
static PyObject *eval(const char *expr)
{
    PyObject *globals = PyDict_New();
    PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins());
    PyObject *code = Py_CompileString(expr, "<test>", Py_eval_input);
    PyObject *v = code ? PyEval_EvalCode(code, globals, globals) : NULL;
    Py_XDECREF(code);
    Py_DECREF(globals);
    cr_assert_not_null(v, "could not evaluate %s", expr);
    return v;
}

static json_t *from(const char *expr, PyObject *dflt)
{
    PyObject *o = eval(expr);
    json_t *j = dk_pyjson_from_python(o, dflt);
    Py_DECREF(o);
    return j;
}

static void assert_json(json_t *j, const char *expected)
{
    cr_assert_not_null(j);
    json_t *want = json_loads(expected, 0, NULL);
    char *got = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    cr_assert(json_equal(j, want), "got %s, expected %s", got, expected);
    free(got);
    json_decref(want);
    json_decref(j);
}

Test(pyjson, a_reply_of_every_json_type_comes_out_as_it_went_in)
{
    const char *text = "{\"status\":\"ok\",\"n\":-42,\"x\":1.5,\"yes\":true,\"no\":false,"
                       "\"none\":null,\"list\":[1,\"two\",[3]],\"nested\":{\"a\":{\"b\":[]}},"
                       "\"text\":\"caf\xc3\xa9 \xe2\x82\xac\"}";
    json_t *in = json_loads(text, 0, NULL);
    PyObject *o = dk_pyjson_to_python(in);
    cr_assert_not_null(o);
    cr_assert(PyDict_Check(o));
    json_t *back = dk_pyjson_from_python(o, NULL);
    Py_DECREF(o);
    cr_assert(json_equal(in, back));
    json_decref(in);
    json_decref(back);
}

Test(pyjson, tuples_are_arrays_and_keys_that_are_not_strings_are_their_str)
{
    assert_json(from("{1: (2, 3), None: [], 'k': ()}", NULL),
                "{\"1\":[2,3],\"None\":[],\"k\":[]}");
}

Test(pyjson, nan_and_infinities_become_null)
{
    assert_json(from("[float('nan'), float('inf'), -float('inf'), 0.25]", NULL),
                "[null,null,null,0.25]");
}

Test(pyjson, an_integer_beyond_64_bits_becomes_a_real)
{
    json_t *j = from("[2**70, -2**63, 2**63 - 1]", NULL);
    cr_assert(json_is_real(json_array_get(j, 0)));
    cr_assert_float_eq(json_real_value(json_array_get(j, 0)), ldexp(1.0, 70), 1e6);
    cr_assert_eq(json_integer_value(json_array_get(j, 1)), INT64_MIN);
    cr_assert_eq(json_integer_value(json_array_get(j, 2)), INT64_MAX);
    json_decref(j);
}

Test(pyjson, what_json_has_no_type_for_goes_through_the_default)
{
    PyObject *dflt = eval("lambda o: sorted(o) if isinstance(o, (set, frozenset)) else repr(o)");
    assert_json(from("{'b': b'\\x00', 's': {3, 1, 2}, 'o': object.__name__}", dflt),
                "{\"b\":\"b'\\\\x00'\",\"s\":[1,2,3],\"o\":\"object\"}");
    Py_DECREF(dflt);
}

Test(pyjson, without_a_default_an_object_json_cannot_say_is_a_type_error)
{
    cr_assert_null(from("[b'bytes']", NULL));
    cr_assert(PyErr_ExceptionMatches(PyExc_TypeError));
    PyErr_Clear();
}

Test(pyjson, a_lone_surrogate_is_replaced_not_an_error)
{
    json_t *j = from("'a\\udc80b'", NULL);
    cr_assert_not_null(j);
    cr_assert_str_eq(json_string_value(j), "a?b");
    json_decref(j);
}

Test(pyjson, nesting_past_the_limit_is_refused_both_ways)
{
    PyObject *deep = eval("__import__('functools').reduce(lambda a, _: [a], range(300), [])");
    cr_assert_null(dk_pyjson_from_python(deep, NULL));
    cr_assert(PyErr_ExceptionMatches(PyExc_RecursionError));
    PyErr_Clear();
    Py_DECREF(deep);
    json_t *j = json_array();
    for (int i = 0; i < 300; i++) {
        json_t *outer = json_array();
        json_array_append_new(outer, j);
        j = outer;
    }
    cr_assert_null(dk_pyjson_to_python(j));
    cr_assert(PyErr_ExceptionMatches(PyExc_RecursionError));
    PyErr_Clear();
    json_decref(j);
}

Test(pyjson, null_from_the_caller_is_none)
{
    PyObject *o = dk_pyjson_to_python(NULL);
    cr_assert_eq(o, Py_None);
    Py_DECREF(o);
}
