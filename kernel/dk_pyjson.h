/*
 * dk_pyjson: JSON values (jansson) to Python objects and back, with no text in
 * between.
 *
 * A request's content is parsed once, by the wire decoder, and handed to the
 * glue as Python objects; the glue's reply comes back as objects and is
 * serialised once, by the sender. Before, the content was dumped to text,
 * parsed again by Python's json, the reply dumped by Python and its status
 * sniffed in C with strstr.
 *
 * Python objects that JSON has no type for are turned into what the glue's
 * json.dumps `default` made of them (distkernel._kernel._default: base64 for
 * bytes, ISO text for dates, a list for sets and tuples, else repr), and NaN
 * and infinities become null, as they did.
 *
 * Both directions need the GIL.
 */
#ifndef DK_PYJSON_H
#define DK_PYJSON_H

#include "dk_pyabi.h"
#include <jansson.h>

/* VALUE (borrowed) as a new Python object: objects become dicts, arrays lists,
 * integers ints, reals floats. Returns NULL with a Python exception set (out
 * of memory, or nesting deeper than DK_PYJSON_MAX_DEPTH). */
PyObject *dk_pyjson_to_python(json_t *value);

/* OBJ (borrowed) as a new JSON value. DEFAULT (borrowed, may be NULL) is called
 * with any object JSON has no type for and must return one it has (or raise).
 * Dict keys that are not strings are turned into their str(). Integers beyond
 * 64 bits become reals. Returns NULL with a Python exception set. */
json_t *dk_pyjson_from_python(PyObject *obj, PyObject *dflt);

#define DK_PYJSON_MAX_DEPTH 200

#endif
