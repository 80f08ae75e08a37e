/*
 * dk_err: the one way distkernel's C code fills an error message.
 *
 * Functions that can fail take (char *err, size_t errlen) and write there what
 * the user will read; ERR may be NULL or ERRLEN 0 when the caller does not want
 * it. Header-only, so every layer (wire, runtime, magics) can use it without a
 * link dependency between them.
 */
#ifndef DK_ERR_H
#define DK_ERR_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline void dk_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static inline void dk_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

#endif
