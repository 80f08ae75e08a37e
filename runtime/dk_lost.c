/*
 * dk_lost: the words for lost ranks, grouped by node. See the header.
 *
 * Pure (records in, text out) so that the runtime's own summary and the
 * feature's cell error, which keeps its own records, say it the same way.
 */
#include "dk_lost.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Append to BUF (of LEN, holding *AT bytes) as snprintf would, never past it. */
static void put(char *buf, size_t len, size_t *at, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void put(char *buf, size_t len, size_t *at, const char *fmt, ...)
{
    if (*at >= len)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *at, len - *at, fmt, ap);
    va_end(ap);
    *at = n < 0 ? len : *at + (size_t) n;
}

void dk_lost_format(int n, const bool *lost, const char *const *hosts, const char *sep,
                    char *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    buf[0] = '\0';
    size_t at = 0;
    bool *said = n > 0 ? calloc((size_t) n, sizeof *said) : NULL;
    if (!said)
        return;
#define HOST_OF(r) (hosts && hosts[r] ? hosts[r] : "localhost")
    /* One clause per node, in the order of its first lost rank; its lost
     * ranks as runs ("4–7", "8, 10–11"). */
    for (int r = 0; r < n; r++) {
        if (!lost[r] || said[r])
            continue;
        const char *host = HOST_OF(r);
        int count = 0;
        for (int q = r; q < n; q++)
            count += lost[q] && !strcmp(HOST_OF(q), host);
        put(buf, len, &at, "%s%s lost (rank%s ", at ? sep : "", host, count > 1 ? "s" : "");
        bool first = true;
        for (int q = r; q < n; q++) {
            if (!lost[q] || said[q] || strcmp(HOST_OF(q), host))
                continue;
            int end = q;
            while (end + 1 < n && lost[end + 1] && !strcmp(HOST_OF(end + 1), host))
                end++;
            for (int k = q; k <= end; k++)
                said[k] = true;
            if (end == q)
                put(buf, len, &at, "%s%d", first ? "" : ", ", q);
            else
                put(buf, len, &at, "%s%d" DK_EN_DASH "%d", first ? "" : ", ", q, end);
            first = false;
        }
        put(buf, len, &at, ")");
    }
#undef HOST_OF
    free(said);
}
