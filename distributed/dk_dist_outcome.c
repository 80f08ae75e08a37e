/*
 * dk_dist_outcome: what the user is told about each rank. See the header.
 *
 * The error reads top down: what happened (the headline, for a cell), the root
 * cause's own traceback when it raised, then every rank's fate, then where the
 * full output is. A rank that failed first is the root cause and the others
 * were ended because of it, so the user looks at one traceback, not N. A rank
 * that died without raising gets its exit code or signal in words, and when it
 * died before its cell was delivered, that is said too: the cause is then in
 * how ranks start (the environment, sitecustomize, a broken install), not in
 * the user's code.
 *
 * A rank on another node that went silent past the heartbeat deadline is
 * lost, and so, as a rule, are the other ranks of its node with it: the
 * headline names the nodes, one clause each with their ranks as runs
 * ("node2 lost (ranks 4–7); node3 lost (rank 8)"), and the traceback gives
 * each lost node a line of its own, since the node, not a rank's code, is
 * what the user must look at. Past LOST_LINES_MAX nodes (a rack, a switch)
 * they are one host list instead ("16 nodes lost (128 ranks): node[9-24]").
 *
 * Past DK_DIST_OUTCOME_EACH_RANK_MAX ranks a line per rank buries the cause
 * (256 lines of "ended by distkernel after rank 152 failed"), so the fates
 * are grouped: each rank's fate is written without its "rank N: ", which is
 * the only part that names the rank itself, the fates are sorted once, and
 * the ranks of one fate become one line with its ranks as runs. Grouping is
 * by the words, so a fate reads the same alone and in a group, and the
 * wording stays in one place (fate_words). Whatever does not fit in the
 * error's lines is gathered in a last line; ranks.txt has it all.
 */
#include "dk_dist_outcome.h"

#include "dk_err.h"
#include "dk_hostlist.h"
#include "dk_logdir.h"
#include "dk_lost.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The lost nodes the error gives a line each, the last of them naming them
 * all when there are more; and the text they are cut from. */
#define LOST_LINES_MAX 8
#define LOST_TEXT_MAX 8192
#define LOST_ALL_MAX 400
/* The bytes of a group's ranks ("0–151, 153–255") before they end in "…". */
#define RUNS_MAX 200
/* The fewest lines the fates get, whatever else the error says. */
#define FATES_MIN 4

static const char *signal_name(int sig)
{
    static const struct { int sig; const char *name; } names[] = {
        {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
        {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
        {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
        {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGXCPU, "SIGXCPU"},
        {SIGXFSZ, "SIGXFSZ"}, {SIGSYS, "SIGSYS"},   {0, NULL}};
    for (int i = 0; names[i].name; i++)
        if (names[i].sig == sig)
            return names[i].name;
    return "a signal";
}

/* A field of a rank's ERROR message; "" when it has none. */
static const char *error_field(json_t *error, const char *key)
{
    const char *v = json_string_value(json_object_get(error, key));
    return v ? v : "";
}

/* The ERROR a rank sent, parsed, or NULL (it sent none, or not JSON). */
static json_t *rank_error(const dk_dist_rank_t *ri)
{
    if (!ri->is_error || !ri->message)
        return NULL;
    return json_loadb(ri->message, ri->message_len, 0, NULL);
}

/* Why distkernel ended a rank that had not failed. */
static void ended_by_us(const dk_dist_outcome_t *o, const dk_dist_rank_t *ri, int root,
                        char *out, size_t outlen)
{
    if (o->kept && root >= 0)
        snprintf(out, outlen, "interrupted after rank %d failed (still running)", root);
    else if (o->kept)
        snprintf(out, outlen, "interrupted (%s; still running)",
                 o->end == DK_END_TIMEOUT ? "timeout" : "KeyboardInterrupt");
    else if (root >= 0)
        snprintf(out, outlen, "ended by distkernel after rank %d failed", root);
    else if (o->end == DK_END_IDLE)
        snprintf(out, outlen, "ended by distkernel (idle_timeout)");
    else
        snprintf(out, outlen, "ended by distkernel (%s)",
                 o->interrupted ? "interrupted"
                 : o->shutdown  ? "kernel shutting down"
                                : "timeout");
    /* SIGKILL is the last step of the stop (SIGINT, SIGTERM, SIGKILL): say so,
     * since it explains the wait and means the rank's own cleanup never ran. */
    if (ri->term_signal == SIGKILL)
        snprintf(out + strlen(out), outlen - strlen(out),
                 "; it outlived SIGINT and SIGTERM and was killed with SIGKILL");
}

/* The fate of rank R without its "rank R: ", the words ranks of one fate
 * share (and so are grouped by), into OUT. */
static void fate_words(const dk_dist_outcome_t *o, int r, int root, char *out, size_t outlen)
{
    const dk_dist_rank_t *ri = &o->ranks[r];
    const char *when = ri->got_cell ? "" : " during start-up, before it received the cell";
    json_t *e = NULL;
    if (ri->state == DK_RANK_DONE) {
        snprintf(out, outlen, "finished");
    } else if (ri->lost) {
        snprintf(out, outlen, "lost with %s (nothing heard from it past the heartbeat "
                 "deadline)", ri->host ? ri->host : "localhost");
    } else if (ri->state == DK_RANK_STOPPED) {
        ended_by_us(o, ri, root, out, outlen);
    } else if (ri->is_error && ri->message) {
        e = rank_error(ri);
        snprintf(out, outlen, "raised %s: %s",
                 e ? error_field(e, "ename") : "an exception", e ? error_field(e, "evalue") : "");
        json_decref(e);
    } else if (ri->term_signal) {
        snprintf(out, outlen, "killed by signal %d (%s)%s%s", ri->term_signal,
                 signal_name(ri->term_signal), when,
                 ri->term_signal == SIGKILL ? ", often the out-of-memory killer (see dmesg)" : "");
    } else if (ri->exit_code > 0) {
        snprintf(out, outlen, "exited with code %d%s", ri->exit_code,
                 ri->got_cell ? " before returning a result" : when);
    } else {
        snprintf(out, outlen, "exited without returning a result%s", when);
    }
    if (root == r)
        snprintf(out + strlen(out), outlen - strlen(out), "   <- root cause (first failure)");
}

void dk_dist_outcome_fate(const dk_dist_outcome_t *o, int r, int root, char *out, size_t outlen)
{
    int n = snprintf(out, outlen, "rank %d: ", r);
    if (n > 0 && (size_t) n < outlen)
        fate_words(o, r, root, out + n, outlen - (size_t) n);
}

/* The lost ranks by node into BUF, clauses separated by SEP (dk_lost_format);
 * empty when none was lost. */
static void lost_nodes(const dk_dist_outcome_t *o, const char *sep, char *buf, size_t len)
{
    buf[0] = '\0';
    if (o->world <= 0)
        return;
    bool *lost = calloc((size_t) o->world, sizeof *lost);
    const char **hosts = calloc((size_t) o->world, sizeof *hosts);
    if (lost && hosts) {
        for (int r = 0; r < o->world; r++) {
            lost[r] = o->ranks[r].lost;
            hosts[r] = o->ranks[r].host;
        }
        dk_lost_format(o->world, lost, hosts, sep, buf, len);
    }
    free(lost);
    free(hosts);
}

static int host_cmp(const void *pa, const void *pb)
{
    return strcmp(*(const char *const *) pa, *(const char *const *) pb);
}

/* The lost ranks' nodes as one host list ("node[3-14]"), malloc'd (NULL when
 * out of memory); their number into *NODES, the lost ranks' into *RANKS. */
static char *lost_hosts(const dk_dist_outcome_t *o, size_t *nodes, size_t *ranks)
{
    *nodes = *ranks = 0;
    const char **hosts = malloc((size_t) o->world * sizeof *hosts);
    for (int r = 0; hosts && r < o->world; r++)
        if (o->ranks[r].lost)
            hosts[(*ranks)++] = o->ranks[r].host ? o->ranks[r].host : "localhost";
    char *list = hosts ? dk_hostlist_compress(hosts, *ranks) : NULL;
    if (list) {
        qsort(hosts, *ranks, sizeof *hosts, host_cmp);
        for (size_t i = 0; i < *ranks; i++)
            *nodes += !i || strcmp(hosts[i - 1], hosts[i]);
    }
    free(hosts);
    return list;
}

/* Past LOST_LINES_MAX lost nodes, in one clause: "24 nodes lost (192 ranks):
 * node[3-26]", the list cut at OUTLEN with "…". False when no more nodes
 * than that were lost, or out of memory: each then gets its own clause. */
static bool many_lost(const dk_dist_outcome_t *o, const char *intro, char *out, size_t outlen)
{
    size_t nodes, ranks;
    char *list = lost_hosts(o, &nodes, &ranks);
    bool many = list && nodes > LOST_LINES_MAX;
    if (many) {
        int n = snprintf(out, outlen, "%s%zu nodes lost (%zu ranks): ", intro, nodes, ranks);
        if (n > 0 && (size_t) n + strlen(list) < outlen)
            snprintf(out + n, outlen - (size_t) n, "%s", list);
        else if (n > 0 && (size_t) n + 8 < outlen)
            snprintf(out + n, outlen - (size_t) n, "%.*s\xe2\x80\xa6",
                     (int) (outlen - (size_t) n - 4), list);
    }
    free(list);
    return many;
}

/* Whether the run's error leads with its lost nodes: the first failure is a
 * lost rank, or a rank of a lost node, or a rank that died without a Python
 * error while ranks were lost (a node cut off mid-collective takes its peers'
 * connections down before the heartbeat deadline tells it). A
 * Python exception on a node that was not lost stays the root cause. */
static bool lost_leads(const dk_dist_outcome_t *o)
{
    if (o->root < 0)
        return false;
    const dk_dist_rank_t *root = &o->ranks[o->root];
    if (root->lost)
        return true;
    bool any = false, root_node = false;
    for (int r = 0; r < o->world; r++) {
        if (!o->ranks[r].lost)
            continue;
        any = true;
        root_node |= root->host && o->ranks[r].host && !strcmp(root->host, o->ranks[r].host);
    }
    return any && (root_node || !root->is_error);
}

/* One line per lost node appended to TB, at most LOST_LINES_MAX: past that,
 * the last gives them all as a host list ("node[3-14]"), since a switch or a
 * rack that goes down takes many nodes with it. */
static void lost_lines(const dk_dist_outcome_t *o, json_t *tb)
{
    char *lines = malloc(LOST_TEXT_MAX);
    if (!lines)
        return;
    char all[LOST_ALL_MAX];
    bool many = many_lost(o, "\xe2\x80\xa6; in all, ", all, sizeof all);
    size_t shown = many ? LOST_LINES_MAX - 1 : LOST_LINES_MAX;
    lost_nodes(o, "\n", lines, LOST_TEXT_MAX);
    size_t count = 0;
    for (char *at = lines, *nl; at && *at && count < shown; at = nl ? nl + 1 : NULL) {
        nl = strchr(at, '\n');
        if (nl)
            *nl = '\0';
        json_array_append_new(tb, json_string(at));
        count++;
    }
    if (many)
        json_array_append_new(tb, json_string(all));
    free(lines);
}

/* ename and evalue of the run, and, when the root cause raised, its traceback
 * under a line naming it (and its node), appended to TB; *OWN, the lines of
 * that traceback, which are the rank's and not bounded here. */
static void cause(const dk_dist_outcome_t *o, json_t *tb, char *ename, size_t enamelen,
                  char *evalue, size_t evaluelen, size_t *own)
{
    *own = 0;
    snprintf(ename, enamelen, "DistributedError");
    evalue[0] = '\0';
    if (o->kept && o->end == DK_END_CANCELLED) {
        snprintf(ename, enamelen, "KeyboardInterrupt");
        snprintf(evalue, evaluelen, "interrupted: every rank raised KeyboardInterrupt; the "
                 "started ranks are still running");
    } else if (o->kept && o->end == DK_END_TIMEOUT && o->timeout_cut) {
        snprintf(ename, enamelen, "TimeoutError");
        snprintf(evalue, evaluelen, "the cell ran past %.0f s, all the started ranks' Slurm "
                 "allocation had left of its time limit, and every rank was interrupted; "
                 "Slurm ends the ranks at that limit", o->timeout_s);
    } else if (o->kept && o->end == DK_END_TIMEOUT) {
        snprintf(ename, enamelen, "TimeoutError");
        snprintf(evalue, evaluelen, "the cell ran past timeout=%g s and every rank was "
                 "interrupted; the started ranks are still running", o->timeout_s);
    } else if (o->end == DK_END_IDLE) {
        snprintf(ename, enamelen, "DistributedError");
        snprintf(evalue, evaluelen, "the started ranks were idle past idle_timeout and ended");
    } else if (o->end == DK_END_CANCELLED) {
        snprintf(ename, enamelen, "%s", o->shutdown ? "KernelShutdown" : "KeyboardInterrupt");
        snprintf(evalue, evaluelen, "%s: every rank was ended",
                 o->shutdown ? "the kernel is shutting down" : "interrupted");
    } else if (o->end == DK_END_TIMEOUT && o->timeout_cut) {
        snprintf(ename, enamelen, "TimeoutError");
        snprintf(evalue, evaluelen,
                 "the job ran past %.0f s, all its Slurm allocation had left of its time "
                 "limit, and every rank was ended; ask Slurm for more time (a partition with "
                 "a longer MaxTime, or slurm_args='--time=...' where the site allows it)",
                 o->timeout_s);
    } else if (o->end == DK_END_TIMEOUT) {
        snprintf(ename, enamelen, "TimeoutError");
        snprintf(evalue, evaluelen,
                 "the job ran past timeout=%g s and every rank was ended; give a larger "
                 "timeout= or timeout=None",
                 o->timeout_s);
    } else if (lost_leads(o)) {
        /* Name every lost node with its ranks, one line each. */
        snprintf(ename, enamelen, "NodeLost");
        if (!many_lost(o, "", evalue, evaluelen))
            lost_nodes(o, "; ", evalue, evaluelen);
        lost_lines(o, tb);
        json_array_append_new(tb, json_string(
            "Nothing was heard from them past the heartbeat deadline: the node is down, its "
            "network is cut, or its ranks are frozen. The other ranks were ended."));
    } else if (o->root >= 0) {
        const dk_dist_rank_t *ri = &o->ranks[o->root];
        json_t *e = rank_error(ri);
        if (e) {
            snprintf(ename, enamelen, "%s", error_field(e, "ename"));
            snprintf(evalue, evaluelen, "[rank %d] %s", o->root, error_field(e, "evalue"));
            char head[384];
            snprintf(head, sizeof head, "Rank %d%s%.256s failed first (root cause):", o->root,
                     ri->host ? " on " : "", ri->host ? ri->host : "");
            json_array_append_new(tb, json_string(head));
            size_t i;
            json_t *line;
            json_array_foreach(json_object_get(e, "traceback"), i, line) {
                json_array_append(tb, line);
                ++*own;
            }
            json_decref(e);
        } else {
            dk_dist_outcome_fate(o, o->root, -1, evalue, evaluelen);
            snprintf(ename, enamelen, "%s", ri->term_signal ? "RankKilled" : "RankExited");
        }
    }
}

static bool log_cut_short(const dk_dist_rank_t *ri) { return !ri->log_complete; }
static bool log_capped(const dk_dist_rank_t *ri) { return ri->log_capped; }

/* Append INTRO and the ranks PICK chooses, as runs, then ")", to LOGS (AT
 * bytes used so far, of CAP): " (cut short, ...: rank 0, 2, 5–9)"; nothing
 * when none is chosen. */
static void list_ranks(const dk_dist_outcome_t *o, bool (*pick)(const dk_dist_rank_t *),
                       const char *intro, char *logs, size_t cap, size_t *at)
{
    int *ranks = o->world > 0 ? malloc((size_t) o->world * sizeof *ranks) : NULL;
    size_t n = 0;
    for (int r = 0; ranks && r < o->world; r++)
        if (pick(&o->ranks[r]))
            ranks[n++] = r;
    if (n > 0 && *at + strlen(intro) + 8 < cap) {
        *at += (size_t) snprintf(logs + *at, cap - *at, "%s", intro);
        dk_ranks_format(ranks, n, 3, logs, cap - 2, at);
        *at += (size_t) snprintf(logs + *at, cap - *at, ")");
    }
    free(ranks);
}

/* The last line: where every rank's output is, and which logs are not whole. */
static json_t *logs_line(const dk_dist_outcome_t *o)
{
    char logs[1600];
    int n = snprintf(logs, sizeof logs, "Full output of every rank: %s/rank-N.log", o->log_dir);
    size_t at = n < 0 ? 0 : (size_t) n < sizeof logs ? (size_t) n : sizeof logs - 1;
    /* Say which logs a full disk cut short, rather than promise every byte. */
    list_ranks(o, log_cut_short, " (cut short, the disk refused writes: rank ", logs,
               sizeof logs, &at);
    /* And which keep only their head and tail (log_cap). */
    list_ranks(o, log_capped, " (head and tail only, past log_cap: rank ", logs, sizeof logs,
               &at);
    return json_string(logs);
}

/* ---- the ranks' fates, grouped ----------------------------------------------------- */

/* One rank's fate: its words (malloc'd) and the rank. */
typedef struct {
    char *words;
    int rank;
} fate_t;

/* The ranks of one fate: FATES[start, start + n), ascending; FIRST, the
 * order it is told in (the root cause's -1, else its lowest rank). */
typedef struct {
    size_t start, n;
    int first;
} group_t;

static int fate_cmp(const void *pa, const void *pb)
{
    const fate_t *a = pa, *b = pb;
    int c = strcmp(a->words, b->words);
    return c ? c : (a->rank > b->rank) - (a->rank < b->rank);
}

static int group_cmp(const void *pa, const void *pb)
{
    const group_t *a = pa, *b = pb;
    return (a->first > b->first) - (a->first < b->first);
}

static int int_cmp(const void *pa, const void *pb)
{
    int a = *(const int *) pa, b = *(const int *) pb;
    return (a > b) - (a < b);
}

/* "  rank 152: WORDS", "  ranks 0–151, 153–255 (255): WORDS"; the runs cut
 * with "…" past RUNS_MAX bytes, the count saying how many there are. */
static json_t *group_line(const int *ranks, size_t n, const char *words)
{
    char runs[RUNS_MAX] = "";
    size_t at = 0;
    dk_ranks_format(ranks, n, 2, runs, sizeof runs, &at);
    size_t len = strlen(words) + sizeof runs + 64;
    char *line = malloc(len);
    if (!line)
        return NULL;
    if (n == 1)
        snprintf(line, len, "  rank %s: %s", runs, words);
    else
        snprintf(line, len, "  ranks %s (%zu): %s", runs, n, words);
    json_t *j = json_string(line);
    free(line);
    return j;
}

/* Every rank's fate, sorted by its words, then rank: one fate's ranks side
 * by side. NULL when out of memory. */
static fate_t *sorted_fates(const dk_dist_outcome_t *o)
{
    fate_t *fates = calloc((size_t) o->world, sizeof *fates);
    char words[2048];
    for (int r = 0; fates && r < o->world; r++) {
        fate_words(o, r, o->root, words, sizeof words);
        fates[r] = (fate_t){.words = strdup(words), .rank = r};
        if (!fates[r].words) {
            for (int q = 0; q < r; q++)
                free(fates[q].words);
            free(fates);
            return NULL;
        }
    }
    if (fates)
        qsort(fates, (size_t) o->world, sizeof *fates, fate_cmp);
    return fates;
}

/* The fates of O's ranks appended to TB, one line per fate with its ranks:
 * the root cause's first, then by lowest rank; at most MAX lines (MAX >= 2),
 * the last then gathering the fates left over. */
static void grouped_fates(const dk_dist_outcome_t *o, json_t *tb, size_t max)
{
    size_t world = (size_t) o->world;
    fate_t *fates = sorted_fates(o);
    group_t *groups = malloc(world * sizeof *groups);
    int *ranks = malloc(world * sizeof *ranks);
    if (!fates || !groups || !ranks) {
        json_array_append_new(tb, json_string("  (out of memory grouping the ranks' fates)"));
        goto out;
    }
    size_t ng = 0;
    for (size_t i = 0, j; i < world; i = j) {
        for (j = i + 1; j < world && !strcmp(fates[j].words, fates[i].words); j++)
            ;
        groups[ng++] = (group_t){.start = i, .n = j - i,
                                 .first = fates[i].rank == o->root ? -1 : fates[i].rank};
    }
    qsort(groups, ng, sizeof *groups, group_cmp);
    size_t shown = ng <= max ? ng : max - 1;
    for (size_t g = 0; g < shown; g++) {
        for (size_t k = 0; k < groups[g].n; k++)
            ranks[k] = fates[groups[g].start + k].rank;
        json_array_append_new(tb, group_line(ranks, groups[g].n,
                                             fates[groups[g].start].words));
    }
    if (shown < ng) {
        size_t n = 0;
        for (size_t g = shown; g < ng; g++)
            for (size_t k = 0; k < groups[g].n; k++)
                ranks[n++] = fates[groups[g].start + k].rank;
        qsort(ranks, n, sizeof *ranks, int_cmp);
        char words[160];
        snprintf(words, sizeof words, "%zu other fates%s", ng - shown,
                 o->ranks_file ? "; every rank's is in the file below" : "");
        json_array_append_new(tb, group_line(ranks, n, words));
    }
out:
    for (size_t i = 0; fates && i < world; i++)
        free(fates[i].words);
    free(fates);
    free(groups);
    free(ranks);
}

/* Lines of the error other than the root cause's own traceback, with the
 * ones still to come after the fates (the ranks file, the logs, the started
 * ranks gone, the headline): what leaves MAX for the fates. */
static size_t fates_room(const dk_dist_outcome_t *o, json_t *tb, size_t own, bool headline)
{
    size_t used = json_array_size(tb) - own + 1 + (o->ranks_file ? 1 : 0) +
                  (o->pool_gone ? 1 : 0) + (headline ? 2 : 0);
    return used + FATES_MIN < DK_DIST_OUTCOME_MAX_LINES ? DK_DIST_OUTCOME_MAX_LINES - used
                                                        : FATES_MIN;
}

/* Where the ranks were, put before the rest of TB: the heading, O's
 * summary lines, the stacks file, and a blank line before what follows.
 * Returns how many lines were put there (0: no rank was asked). */
static size_t stacks_lines(const dk_dist_outcome_t *o, json_t *tb)
{
    if (!o->stacks || !*o->stacks)
        return 0;
    size_t at = 0;
    json_array_insert_new(tb, at++, json_string("Where the ranks were:"));
    for (const char *p = o->stacks; *p;) {
        const char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t) (nl - p) : strlen(p);
        json_array_insert_new(tb, at++, json_stringn(p, n));
        p += n + (nl ? 1 : 0);
    }
    if (o->stacks_file) {
        char line[4300];
        snprintf(line, sizeof line, "Every rank's stacks, in full: %s", o->stacks_file);
        json_array_insert_new(tb, at++, json_string(line));
    }
    if (json_array_size(tb) > at)
        json_array_insert_new(tb, at++, json_string(""));
    return at;
}

json_t *dk_dist_outcome_error(const dk_dist_outcome_t *o, bool headline)
{
    json_t *tb = json_array();
    if (!tb)
        return NULL;
    char ename[128], evalue[2048];
    size_t own;
    cause(o, tb, ename, sizeof ename, evalue, sizeof evalue, &own);
    size_t where = stacks_lines(o, tb);
    json_array_append_new(tb, json_string(""));
    json_array_append_new(tb, json_string("Ranks:"));
    if (o->world <= DK_DIST_OUTCOME_EACH_RANK_MAX) {
        for (int r = 0; r < o->world; r++) {
            char fate[2048], line[2100];
            dk_dist_outcome_fate(o, r, o->root, fate, sizeof fate);
            snprintf(line, sizeof line, "  %s", fate);
            json_array_append_new(tb, json_string(line));
        }
    } else {
        grouped_fates(o, tb, fates_room(o, tb, own, headline));
        if (o->ranks_file) {
            char line[4200];
            snprintf(line, sizeof line, "Every rank's fate, one line each: %s", o->ranks_file);
            json_array_append_new(tb, json_string(line));
        }
    }
    json_array_append_new(tb, logs_line(o));
    if (o->pool_gone)
        json_array_append_new(tb, json_string("The started ranks have ended; %distributed start "
                                              "starts new ones (their variables are lost)."));
    /* The first line says what happened: some frontends (Notebook 6) show the
     * traceback list and nothing else, not ename and evalue. Coloured as
     * IPython colours the exception line of a traceback. */
    if (headline) {
        const char *first = json_string_value(json_array_get(tb, 0));
        if (first && *first && !where)
            json_array_insert_new(tb, 0, json_string(""));
        char line[2400];
        snprintf(line, sizeof line, "\x1b[0;31m%s\x1b[0m: %s", ename, evalue);
        json_array_insert_new(tb, 0, json_string(line));
    }
    return json_pack("{s:s, s:s, s:o}", "ename", ename, "evalue", evalue, "traceback", tb);
}

static int write_fates(FILE *f, void *data)
{
    const dk_dist_outcome_t *o = data;
    char fate[2048];
    for (int r = 0; r < o->world; r++) {
        dk_dist_outcome_fate(o, r, o->root, fate, sizeof fate);
        if (fprintf(f, "%s\n", fate) < 0)
            return -1;
    }
    return 0;
}

int dk_dist_outcome_write_fates(const dk_dist_outcome_t *o, const char *path, char *err,
                                size_t errlen)
{
    return dk_logdir_write_file(path, write_fates, (void *) o, err, errlen);
}
