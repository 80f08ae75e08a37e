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

void dk_ranks_format(const int *ranks, size_t n, int min_run, char *buf, size_t len,
                     size_t *at)
{
    if (!buf || len == 0 || *at >= len)
        return;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
            j++;
        if (j - i + 1 < (size_t) (min_run > 2 ? min_run : 2))
            j = i;
        char run[64];
        if (j == i)
            snprintf(run, sizeof run, "%s%d", i ? ", " : "", ranks[i]);
        else
            snprintf(run, sizeof run, "%s%d" DK_EN_DASH "%d", i ? ", " : "", ranks[i], ranks[j]);
        /* This run must leave room for the ", …" that says more follow. */
        const char *more = i ? ", \xe2\x80\xa6" : "\xe2\x80\xa6";
        size_t need = strlen(run) + (j + 1 < n ? strlen(", \xe2\x80\xa6") : 0);
        if (*at + need >= len) {
            if (*at + strlen(more) < len) {
                memcpy(buf + *at, more, strlen(more) + 1);
                *at += strlen(more);
            }
            return;
        }
        memcpy(buf + *at, run, strlen(run) + 1);
        *at += strlen(run);
        i = j + 1;
    }
}

void dk_lost_format(int n, const bool *lost, const char *const *hosts, const char *sep,
                    char *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    buf[0] = '\0';
    size_t at = 0;
    bool *said = n > 0 ? calloc((size_t) n, sizeof *said) : NULL;
    int *ranks = n > 0 ? calloc((size_t) n, sizeof *ranks) : NULL;
    if (!said || !ranks) {
        free(said);
        free(ranks);
        return;
    }
#define HOST_OF(r) (hosts && hosts[r] ? hosts[r] : "localhost")
    /* One clause per node, in the order of its first lost rank; its lost
     * ranks as runs ("4–7", "8, 10–11"). */
    for (int r = 0; r < n; r++) {
        if (!lost[r] || said[r])
            continue;
        const char *host = HOST_OF(r);
        size_t count = 0;
        for (int q = r; q < n; q++) {
            if (lost[q] && !said[q] && !strcmp(HOST_OF(q), host)) {
                said[q] = true;
                ranks[count++] = q;
            }
        }
        put(buf, len, &at, "%s%s lost (rank%s ", at ? sep : "", host, count > 1 ? "s" : "");
        dk_ranks_format(ranks, count, 2, buf, len, &at);
        put(buf, len, &at, ")");
    }
#undef HOST_OF
    free(said);
    free(ranks);
}
