/*
 * dk_log: the kernel's own messages, all through one path. See the header.
 */
#include "dk_log.h"
#include "dk_io.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

/* One log per process. */
static atomic_int log_fd = 2;

void dk_log_to(int fd)
{
    atomic_store(&log_fd, fd);
}

void dk_log(const char *fmt, ...)
{
    static const char prefix[] = "[distkernel] ";
    char line[2048];
    size_t at = sizeof prefix - 1;
    memcpy(line, prefix, at);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line + at, sizeof line - at - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    at += (size_t) n < sizeof line - at - 1 ? (size_t) n : sizeof line - at - 2;
    line[at++] = '\n';
    (void) dk_write_all(atomic_load(&log_fd), line, at);
}
