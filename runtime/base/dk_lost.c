/*
 * dk_lost: the words for lost ranks, grouped by node. See the header.
 *
 * Pure (records in, text out) so that the runtime's own summary and the
 * feature's cell error, which keeps its own records, say it the same way.
 *
 * Ranks are grouped by node by sorting them by node name, not by comparing
 * each lost rank's node with every other rank's: a thousand ranks on a
 * thousand nodes, all lost, would be a million comparisons where a display
 * needs a few thousand.
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

int dk_placed_cmp(const void *pa, const void *pb)
{
    const dk_placed_t *a = pa, *b = pb;
    int c = strcmp(a->host, b->host);
    return c ? c : (a->rank > b->rank) - (a->rank < b->rank);
}

static const char *host_of(const char *const *hosts, int r)
{
    return hosts && hosts[r] ? hosts[r] : "localhost";
}

/* The ranks R of [0, N) with FLAGS[r] (every rank when FLAGS is NULL) into
 * *PLACED (malloc'd), sorted by node then rank; returns how many, -1 when out
 * of memory. */
static int place(int n, const bool *flags, const char *const *hosts, dk_placed_t **placed)
{
    int m = 0;
    for (int r = 0; r < n; r++)
        m += !flags || flags[r];
    *placed = malloc((size_t) (m ? m : 1) * sizeof **placed);
    if (!*placed)
        return -1;
    m = 0;
    for (int r = 0; r < n; r++)
        if (!flags || flags[r])
            (*placed)[m++] = (dk_placed_t){.host = host_of(hosts, r), .rank = r};
    qsort(*placed, (size_t) m, sizeof **placed, dk_placed_cmp);
    return m;
}

/* A node's lost ranks: PLACED[from..to), the lowest first. */
typedef struct {
    int from, to;
    int first;
} clause_t;

static int clause_cmp(const void *pa, const void *pb)
{
    const clause_t *a = pa, *b = pb;
    return (a->first > b->first) - (a->first < b->first);
}

/* The lost ranks sorted by node make one clause per run of the same node;
 * the clauses sorted by their first rank are the order they are told in. */
void dk_lost_format(int n, const bool *lost, const char *const *hosts, const char *sep,
                    char *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    buf[0] = '\0';
    dk_placed_t *placed;
    int m = place(n, lost, hosts, &placed);
    if (m <= 0) {
        free(placed);
        return;
    }
    clause_t *clauses = malloc((size_t) m * sizeof *clauses);
    int *ranks = malloc((size_t) m * sizeof *ranks);
    if (!clauses || !ranks) {
        free(clauses);
        free(ranks);
        free(placed);
        return;
    }
    int nc = 0;
    for (int i = 0; i < m; i++) {
        if (!i || strcmp(placed[i].host, placed[i - 1].host))
            clauses[nc++] = (clause_t){.from = i, .first = placed[i].rank};
        clauses[nc - 1].to = i + 1;
    }
    qsort(clauses, (size_t) nc, sizeof *clauses, clause_cmp);
    size_t at = 0;
    for (int c = 0; c < nc && at < len; c++) {
        size_t count = 0;
        for (int i = clauses[c].from; i < clauses[c].to; i++)
            ranks[count++] = placed[i].rank;
        put(buf, len, &at, "%s%s lost (rank%s ", at ? sep : "", placed[clauses[c].from].host,
            count > 1 ? "s" : "");
        dk_ranks_format(ranks, count, 2, buf, len, &at);
        put(buf, len, &at, ")");
    }
    free(clauses);
    free(ranks);
    free(placed);
}

int dk_lost_whole_nodes(int n, bool *lost, const char *const *hosts)
{
    bool any = false;
    for (int r = 0; r < n && !any; r++)
        any = lost[r];
    if (!any)
        return 0;
    dk_placed_t *placed;
    int m = place(n, NULL, hosts, &placed);
    if (m < 0)
        return -1;
    for (int i = 0, j; i < m; i = j) {
        bool node_lost = false;
        for (j = i; j < m && !strcmp(placed[j].host, placed[i].host); j++)
            node_lost = node_lost || lost[placed[j].rank];
        for (int k = i; node_lost && k < j; k++)
            lost[placed[k].rank] = true;
    }
    free(placed);
    return 0;
}
