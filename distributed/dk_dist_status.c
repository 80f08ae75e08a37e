/*
 * dk_dist_status: a run's status display text. See the header.
 *
 * A few ranks get a line with a word each (and their GPU memory while they
 * run: the first thing to look at when a job is slow or about to run out).
 * Past DK_DIST_STATUS_EACH_RANK_MAX that line would grow with the world (7,000
 * characters at 256 ranks), so the display says what a reader looks for in
 * lines that do not grow: how many ranks are in each state; which nodes
 * differ, when few kinds of node account for all (a node whose ranks
 * failed, beside fifteen whose ranks all run); the ranks that need a look,
 * by name; the GPU memory as its spread, since the rank that holds the most
 * is the one that runs out first. Each line is cut to a fixed width, so the
 * whole is bounded too: a display refreshed every second must not cost more
 * than the run it shows.
 *
 * Nodes are found by sorting the ranks by node name (O(N log N)); the nodes
 * with the same counts, by sorting the nodes by their counts.
 *
 * Started ranks go through the same lines: their states are a cell's (a rank
 * that answered is done, but stays, idle; a failed one raised and stays too),
 * so only the words differ, and the header and the per-rank line, which say
 * what they always have. Their GPU memory is any live rank's, not a running
 * one's only: an idle rank holds its memory.
 */
#include "dk_dist_status.h"

#include "dk_hostlist.h"
#include "dk_lost.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Lines of nodes at most: past that, nodes differ too much to say by node. */
#define NODE_LINES_MAX 4
/* Bytes of a list of ranks or nodes on a line, past which it ends in "…". */
#define LIST_MAX 100
/* Lost nodes named one by one with their ranks, at most. */
#define LOST_NODES_MAX 3
/* Bytes of one line, the header and logs aside. */
#define LINE_MAX 512

/* How much longer than the median the slowest rank took to start, at
 * least, to be named. */
#define SLOW_START_S 1.0

#define ELLIPSIS "\xe2\x80\xa6"
#define GIB (1024.0 * 1024.0 * 1024.0)

static const char *state_word(dk_rank_state_t st)
{
    switch (st) {
    case DK_RANK_STARTING: return "starting";
    case DK_RANK_RUNNING: return "running";
    case DK_RANK_DONE: return "done";
    case DK_RANK_FAILED: return "failed";
    case DK_RANK_STOPPED: return "stopped";
    }
    return "?";
}

/* What the counts count, in the order they are told: a rank of a lost node
 * is lost, whatever its state. */
enum { K_RUNNING, K_DONE, K_STARTING, K_FAILED, K_LOST, K_STOPPED, KINDS };
static const char *const kind_words[KINDS] = {"running", "done", "starting",
                                              "failed", "lost", "stopped"};
static const char *const started_words[KINDS] = {"running", "idle", "starting",
                                                 "raised", "lost", "interrupted"};

static const char *const *words_of(const dk_dist_status_t *st)
{
    return st->started ? started_words : kind_words;
}

static int kind_of(const dk_dist_rank_t *ri)
{
    if (ri->lost)
        return K_LOST;
    switch (ri->state) {
    case DK_RANK_STARTING: return K_STARTING;
    case DK_RANK_RUNNING: return K_RUNNING;
    case DK_RANK_DONE: return K_DONE;
    case DK_RANK_FAILED: return K_FAILED;
    case DK_RANK_STOPPED: return K_STOPPED;
    }
    return K_FAILED;
}

/* ---- text, bounded ------------------------------------------------------------ */

typedef struct {
    char *text;
    size_t len, cap;
} text_t;

/* Append as snprintf would, never past the buffer (what does not fit is cut). */
static void put(text_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void put(text_t *t, const char *fmt, ...)
{
    if (t->len + 1 >= t->cap)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->text + t->len, t->cap - t->len, fmt, ap);
    va_end(ap);
    t->len = n < 0 ? t->len : t->len + (size_t) n < t->cap ? t->len + (size_t) n : t->cap - 1;
}

/* RANKS[0..N) (ascending) as "rank 5" or "ranks 5, 9–12 (5)" into BUF. */
static void ranks_words(const int *ranks, size_t n, char *buf, size_t len)
{
    size_t at = (size_t) snprintf(buf, len, "rank%s ", n > 1 ? "s" : "");
    dk_ranks_format(ranks, n, 2, buf, len - 16, &at);
    if (n > 1)
        snprintf(buf + at, len - at, " (%zu)", n);
}

/* NAMES[0..N) as a host list into BUF ("node[1-16]"), cut with "…" past LEN. */
static void hosts_words(const char **names, size_t n, char *buf, size_t len)
{
    char *list = dk_hostlist_compress(names, n);
    if (!list) {
        snprintf(buf, len, ELLIPSIS);
        return;
    }
    if (strlen(list) < len)
        snprintf(buf, len, "%s", list);
    else
        snprintf(buf, len, "%.*s" ELLIPSIS, (int) (len - sizeof ELLIPSIS), list);
    free(list);
}

static const char *host_of(const dk_dist_status_t *st, int r)
{
    return st->hosts && st->hosts[r] ? st->hosts[r] : "localhost";
}

/* "250 running · 4 done · 1 failed", the kinds with a count, in WORDS. */
static void counts_words(const int *counts, const char *const *words, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; k < KINDS && at < len; k++)
        if (counts[k])
            at += (size_t) snprintf(buf + at, len - at, "%s%d %s", at ? " · " : "", counts[k],
                                    words[k]);
}

/* Whether ST tells RI's GPU memory: a run's running ranks, and any started
 * rank that has started and is not lost (idle, it still holds its memory). */
static bool holds_gpu(const dk_dist_status_t *st, const dk_dist_rank_t *ri)
{
    if (!st->gpu || ri->gpu_index < 0 || ri->pid <= 0)
        return false;
    return st->started ? ri->state != DK_RANK_STARTING && !ri->lost
                       : ri->state == DK_RANK_RUNNING;
}

/* ---- up to a few ranks: a word each --------------------------------------------- */

/* A run's ranks by state, with their GPU memory while they run; started
 * ranks by pid, as their status has always named them (their state is a
 * cell's, which the cell tells), or by node on Slurm's nodes, where the pid
 * here is srun's and the rank's own is the node's. */
static void each_rank(text_t *t, const dk_dist_status_t *st)
{
    for (int r = 0; r < st->world; r++) {
        const dk_dist_rank_t *ri = &st->ranks[r];
        put(t, "%srank %d", r ? " · " : "  ", r);
        if (st->started && st->hosts) {
            put(t, " on %.64s", host_of(st, r));
        } else if (st->started) {
            put(t, " pid %d", ri->pid);
        } else {
            put(t, "%s%.40s %s", st->hosts ? " on " : "", st->hosts ? st->hosts[r] : "",
                state_word(ri->state));
            unsigned long long used = holds_gpu(st, ri) ? st->gpu_memory(ri->gpu_index, ri->pid)
                                                        : 0;
            if (used)
                put(t, " (GPU %.1f GiB)", (double) used / GIB);
        }
    }
    put(t, "\n");
}

/* ---- many ranks: nodes ------------------------------------------------------------ */

/* A node: its name, its lowest rank (Slurm's order), its ranks by kind. */
typedef struct {
    const char *host;
    int first;
    int counts[KINDS];
} node_t;

static int node_by_counts(const void *pa, const void *pb)
{
    const node_t *a = pa, *b = pb;
    int c = memcmp(a->counts, b->counts, sizeof a->counts);
    return c ? c : (a->first > b->first) - (a->first < b->first);
}

/* The nodes of ST's ranks into *NODES (malloc'd, sorted by counts then
 * lowest rank); returns their number, -1 when out of memory. */
static int find_nodes(const dk_dist_status_t *st, node_t **nodes)
{
    dk_placed_t *order = malloc((size_t) st->world * sizeof *order);
    *nodes = calloc((size_t) st->world, sizeof **nodes);
    if (!order || !*nodes) {
        free(order);
        free(*nodes);
        *nodes = NULL;
        return -1;
    }
    for (int r = 0; r < st->world; r++)
        order[r] = (dk_placed_t){.host = host_of(st, r), .rank = r};
    qsort(order, (size_t) st->world, sizeof *order, dk_placed_cmp);
    int n = 0;
    for (int i = 0; i < st->world; i++) {
        int r = order[i].rank;
        if (!i || strcmp(order[i].host, (*nodes)[n - 1].host))
            (*nodes)[n++] = (node_t){.host = order[i].host, .first = r};
        (*nodes)[n - 1].counts[kind_of(&st->ranks[r])]++;
    }
    free(order);
    qsort(*nodes, (size_t) n, sizeof **nodes, node_by_counts);
    return n;
}

/* A run of NODES[0..N) with the same counts. */
typedef struct {
    const node_t *nodes;
    size_t n;
} node_group_t;

/* Groups in Slurm's order: by their lowest rank, their first node's. */
static int group_by_first(const void *pa, const void *pb)
{
    const node_group_t *a = pa, *b = pb;
    return (a->nodes[0].first > b->nodes[0].first) - (a->nodes[0].first < b->nodes[0].first);
}

/* "  node[1-9,11-16]: 16 running on each", a line per kind of node, when
 * there are two to NODE_LINES_MAX kinds: one says no more than the counts,
 * more say less than the exceptions. */
static void node_lines(text_t *t, const node_t *nodes, int n, const char *const *words)
{
    node_group_t groups[NODE_LINES_MAX];
    size_t ng = 0;
    for (int i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && !memcmp(nodes[j].counts, nodes[i].counts,
                                         sizeof nodes[i].counts); j++)
            ;
        if (ng == NODE_LINES_MAX)
            return;
        groups[ng++] = (node_group_t){.nodes = nodes + i, .n = (size_t) (j - i)};
    }
    if (ng < 2)
        return;
    qsort(groups, ng, sizeof *groups, group_by_first);
    for (size_t g = 0; g < ng; g++) {
        const char **names = malloc(groups[g].n * sizeof *names);
        if (!names)
            return;
        for (size_t i = 0; i < groups[g].n; i++)
            names[i] = groups[g].nodes[i].host;
        char list[LIST_MAX], counts[LINE_MAX];
        hosts_words(names, groups[g].n, list, sizeof list);
        counts_words(groups[g].nodes[0].counts, words, counts, sizeof counts);
        put(t, "  %s: %s%s\n", list, counts, groups[g].n > 1 ? " on each" : "");
        free(names);
    }
}

/* ---- many ranks: the exceptions ---------------------------------------------------- */

/* The ranks of ST of kind KIND into RANKS (ascending), their nodes into
 * NAMES (either may be NULL); returns how many. */
static size_t ranks_of(const dk_dist_status_t *st, int kind, int *ranks, const char **names)
{
    size_t n = 0;
    for (int r = 0; r < st->world; r++) {
        if (kind_of(&st->ranks[r]) != kind)
            continue;
        if (ranks)
            ranks[n] = r;
        if (names)
            names[n] = host_of(st, r);
        n++;
    }
    return n;
}

/* "  LABEL: ranks 152, 160–163 (5) on node[10-11]" for the ranks of KIND. */
static void named_ranks(text_t *t, const dk_dist_status_t *st, int kind, const char *label,
                        int *ranks, const char **names)
{
    size_t n = ranks_of(st, kind, ranks, names);
    if (!n)
        return;
    char which[LIST_MAX], where[LIST_MAX] = "";
    ranks_words(ranks, n, which, sizeof which);
    if (st->hosts)
        hosts_words(names, n, where, sizeof where);
    put(t, "  %s: %s%s%s\n", label, which, where[0] ? " on " : "", where);
}

/* "  node7 lost (ranks 48–55); node9 lost (rank 70)", the lost ranks by
 * node, for up to LOST_NODES_MAX nodes; past that "  lost: node[7-9,12] (4
 * nodes, 32 ranks)", as a switch or a rack takes many nodes down at once. */
static void lost_line(text_t *t, const dk_dist_status_t *st, const node_t *nodes, int n,
                      const int *counts, bool *lost, const char **names)
{
    size_t lost_nodes = 0;
    for (int i = 0; i < n; i++)
        if (nodes[i].counts[K_LOST])
            names[lost_nodes++] = nodes[i].host;
    if (!lost_nodes)
        return;
    char line[LINE_MAX];
    if (lost_nodes > LOST_NODES_MAX) {
        hosts_words(names, lost_nodes, line, LIST_MAX);
        put(t, "  lost: %s (%zu nodes, %d ranks)\n", line, lost_nodes, counts[K_LOST]);
        return;
    }
    for (int r = 0; r < st->world; r++)
        lost[r] = st->ranks[r].lost;
    dk_lost_format(st->world, lost, st->hosts, "; ", line, sizeof line);
    put(t, "  %s\n", line);
}

static int double_cmp(const void *pa, const void *pb)
{
    double a = *(const double *) pa, b = *(const double *) pb;
    return (a > b) - (a < b);
}

/* The ranks still starting while others have started, or, once all have,
 * the slowest to start against the median when it stands out (twice the
 * median, and SLOW_START_S more): a rank that takes long to start is a node
 * that is slow, short of memory, or has a bad environment. */
static void start_line(text_t *t, const dk_dist_status_t *st, const int *counts, int *ranks,
                       const char **names, double *times)
{
    if (counts[K_STARTING] && counts[K_STARTING] < st->world) {
        char label[64];
        snprintf(label, sizeof label, "still starting after %.1f s", st->elapsed_s);
        named_ranks(t, st, K_STARTING, label, ranks, names);
        return;
    }
    size_t n = 0;
    int slowest = -1;
    for (int r = 0; r < st->world; r++) {
        if (!st->ranks[r].running_ms)
            continue;
        double s = (double) (st->ranks[r].running_ms - st->t0_ms) / 1000.0;
        times[n++] = s > 0 ? s : 0;
        if (slowest < 0 || st->ranks[r].running_ms > st->ranks[slowest].running_ms)
            slowest = r;
    }
    if (n < 2)
        return;
    qsort(times, n, sizeof *times, double_cmp);
    double median = times[n / 2];
    if (times[n - 1] < 2 * median || times[n - 1] < median + SLOW_START_S)
        return;
    put(t, "  slowest to start: rank %d%s%.60s, %.1f s (median %.1f s)\n", slowest,
        st->hosts ? " on " : "", st->hosts ? host_of(st, slowest) : "", times[n - 1],
        median);
}

/* One running rank's GPU memory. */
typedef struct {
    unsigned long long bytes;
    int rank;
} gpu_use_t;

static int gpu_use_cmp(const void *pa, const void *pb)
{
    const gpu_use_t *a = pa, *b = pb;
    if (a->bytes != b->bytes)
        return a->bytes < b->bytes ? -1 : 1;
    return (a->rank < b->rank) - (a->rank > b->rank);   /* the max: the lowest such rank */
}

/* "  GPU memory: min 2.9 GiB · median 3.1 GiB · max 7.8 GiB (rank 12 on node1)",
 * over the ranks that hold memory (holds_gpu) whose memory is known. */
static void gpu_line(text_t *t, const dk_dist_status_t *st, gpu_use_t *use)
{
    size_t n = 0;
    for (int r = 0; st->gpu && r < st->world; r++) {
        const dk_dist_rank_t *ri = &st->ranks[r];
        if (!holds_gpu(st, ri))
            continue;
        unsigned long long used = st->gpu_memory(ri->gpu_index, ri->pid);
        if (used)
            use[n++] = (gpu_use_t){.bytes = used, .rank = r};
    }
    if (!n)
        return;
    qsort(use, n, sizeof *use, gpu_use_cmp);
    const gpu_use_t *max = &use[n - 1];
    put(t, "  GPU memory: min %.1f GiB · median %.1f GiB · max %.1f GiB (rank %d%s%.60s)\n",
        (double) use[0].bytes / GIB, (double) use[n / 2].bytes / GIB, (double) max->bytes / GIB,
        max->rank, st->hosts ? " on " : "", st->hosts ? host_of(st, max->rank) : "");
}

/* Counts, nodes, exceptions and GPU memory, for more ranks than get a word each. */
static int many_ranks(text_t *t, const dk_dist_status_t *st)
{
    size_t world = (size_t) st->world;
    int *ranks = malloc(world * sizeof *ranks);
    const char **names = malloc(world * sizeof *names);
    bool *lost = malloc(world * sizeof *lost);
    double *times = malloc(world * sizeof *times);
    gpu_use_t *use = malloc(world * sizeof *use);
    node_t *nodes = NULL;
    int n = ranks && names && lost && times && use ? find_nodes(st, &nodes) : -1;
    if (n >= 0) {
        int counts[KINDS] = {0};
        for (int i = 0; i < n; i++)
            for (int k = 0; k < KINDS; k++)
                counts[k] += nodes[i].counts[k];
        char words[LINE_MAX];
        counts_words(counts, words_of(st), words, sizeof words);
        put(t, "  %d ranks", st->world);
        if (st->hosts)
            put(t, " on %d node%s", n, n > 1 ? "s" : "");
        put(t, ": %s\n", words);
        node_lines(t, nodes, n, words_of(st));
        named_ranks(t, st, K_FAILED, words_of(st)[K_FAILED], ranks, names);
        lost_line(t, st, nodes, n, counts, lost, names);
        start_line(t, st, counts, ranks, names, times);
        gpu_line(t, st, use);
    }
    free(ranks);
    free(names);
    free(lost);
    free(times);
    free(use);
    free(nodes);
    return n >= 0 ? 0 : -1;
}

/* ---- whose output is shown ----------------------------------------------------------- */

/* "  output shown: ranks 0, 8, 16–31 (all in the logs)", when output= shows
 * some ranks only: the cell's output then is not all there is, and the
 * reader of a thousand ranks should know whose they are reading. */
static int output_line(text_t *t, const dk_dist_status_t *st)
{
    if (!st->shown || (st->output != DK_OUTPUT_LOCAL0 && st->output != DK_OUTPUT_LIST))
        return 0;
    int *ranks = malloc((size_t) st->world * sizeof *ranks);
    if (!ranks)
        return -1;
    size_t n = 0;
    for (int r = 0; r < st->world; r++)
        if (st->shown[r])
            ranks[n++] = r;
    char which[LIST_MAX] = "no rank";
    if (n) {
        size_t at = (size_t) snprintf(which, sizeof which, "rank%s ", n > 1 ? "s" : "");
        dk_ranks_format(ranks, n, 2, which, sizeof which, &at);
    }
    put(t, "  output shown: %s%s (all in the logs)\n",
        st->output == DK_OUTPUT_LOCAL0 ? "local rank 0 of each node, " : "", which);
    free(ranks);
    return 0;
}

/* ---- where silent ranks are ---------------------------------------------------------- */

/* The lines of ST->where, in the lines left of DK_DIST_STATUS_MAX_LINES
 * (RESERVED more are to come after them: the logs line). */
static int where_lines(text_t *t, const dk_dist_status_t *st, size_t reserved)
{
    if (!st->where)
        return 0;
    size_t used = 0;
    for (size_t i = 0; i < t->len; i++)
        used += t->text[i] == '\n';
    if (used + reserved >= DK_DIST_STATUS_MAX_LINES)
        return 0;
    char *where = st->where(st->where_data, DK_DIST_STATUS_MAX_LINES - used - reserved);
    if (!where)
        return 0;
    size_t n = strlen(where);
    char *grown = realloc(t->text, t->cap + n);
    if (!grown) {
        free(where);
        return -1;
    }
    t->text = grown;
    t->cap += n;
    put(t, "%s", where);
    free(where);
    return 0;
}

/* ---- the whole ------------------------------------------------------------------------ */

/* The started ranks' header: "started ranks ID: WHAT · up 312 s · idle for
 * 20 s (ended after 3600 s idle)", and their Slurm job's line. */
static void started_header(text_t *t, const dk_dist_status_t *st)
{
    const dk_dist_started_t *p = st->started;
    put(t, "started ranks %s: %s · up %.0f s · %s", p->id, st->what, st->elapsed_s,
        p->idle_s > 0 ? "idle" : "running a cell");
    if (p->idle_s > 0)
        put(t, " for %.0f s", p->idle_s);
    if (p->idle_timeout_s > 0)
        put(t, " (ended after %g s idle)", p->idle_timeout_s);
    put(t, "\n");
    if (p->slurm_job)
        put(t, "  Slurm job %s on %s (time limit %s)\n", p->slurm_job, p->slurm_nodes,
            p->slurm_time_limit[0] ? p->slurm_time_limit : "Slurm's default");
}

/* " · attempt 2 of 3" under restarts= into TEXT, else "". */
static const char *attempt_text(const dk_dist_status_t *st, char text[64])
{
    text[0] = '\0';
    if (st->attempts > 1)
        snprintf(text, 64, " · attempt %d of %d", st->attempt, st->attempts);
    return text;
}

char *dk_dist_status_text(const dk_dist_status_t *st)
{
    bool each = st->world <= DK_DIST_STATUS_EACH_RANK_MAX;
    const dk_dist_started_t *p = st->started;
    size_t cap = 256 + strlen(st->what) + LINE_MAX +
                 (st->headline ? strlen(st->headline) : 0) +
                 (p ? strlen(p->id) : strlen(st->log_dir)) +
                 (p && p->slurm_job ? strlen(p->slurm_job) + strlen(p->slurm_nodes) +
                                          strlen(p->slurm_time_limit)
                                    : 0) +
                 (each ? (size_t) st->world * 140 : (size_t) DK_DIST_STATUS_MAX_LINES * LINE_MAX);
    text_t t = {.text = malloc(cap), .cap = cap};
    if (!t.text)
        return NULL;
    t.text[0] = '\0';
    char attempt[64];
    if (p)
        started_header(&t, st);
    else
        put(&t, "distributed: %s%s · %.1f s%s%s\n", st->what, attempt_text(st, attempt),
            st->elapsed_s, st->headline ? " · " : "", st->headline ? st->headline : "");
    if (each) {
        each_rank(&t, st);
    } else if (many_ranks(&t, st) < 0) {
        free(t.text);
        return NULL;
    }
    if (output_line(&t, st) < 0 || (!p && where_lines(&t, st, 1) < 0)) {
        free(t.text);
        return NULL;
    }
    if (p && t.len && t.text[t.len - 1] == '\n')
        t.text[--t.len] = '\0';     /* the last line's newline */
    else if (!p)
        put(&t, "  logs: %s", st->log_dir);
    return t.text;
}
