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
 * A rank started through srun that ended without an error of its own gets
 * the last line srun or slurmstepd wrote of it as the reason, where that
 * says more than the exit status: those lines reach the rank's log only.
 *
 * A rank on another node that went silent past the heartbeat deadline is
 * lost, and so, as a rule, are the other ranks of its node with it: the
 * headline names the nodes, one clause each with their ranks as runs
 * ("node2 lost (ranks 4–7); node3 lost (rank 8)"), and the traceback gives
 * each lost node a line of its own, since the node, not a rank's code, is
 * what the user must look at.
 */
#include "dk_dist_outcome.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
static void ended_by_us(const dk_dist_outcome_t *o, const dk_dist_rank_t *ri, int r, int root,
                        char *out, size_t outlen)
{
    if (o->kept && root >= 0)
        snprintf(out, outlen, "rank %d: interrupted after rank %d failed (still running)", r,
                 root);
    else if (o->kept)
        snprintf(out, outlen, "rank %d: interrupted (%s; still running)", r,
                 o->end == DK_END_TIMEOUT ? "timeout" : "KeyboardInterrupt");
    else if (root >= 0)
        snprintf(out, outlen, "rank %d: ended by distkernel after rank %d failed", r, root);
    else if (o->end == DK_END_IDLE)
        snprintf(out, outlen, "rank %d: ended by distkernel (idle_timeout)", r);
    else
        snprintf(out, outlen, "rank %d: ended by distkernel (%s)", r,
                 o->interrupted ? "interrupted"
                 : o->shutdown  ? "kernel shutting down"
                                : "timeout");
    /* SIGKILL is the last step of the stop (SIGINT, SIGTERM, SIGKILL): say so,
     * since it explains the wait and means the rank's own cleanup never ran. */
    if (ri->term_signal == SIGKILL)
        snprintf(out + strlen(out), outlen - strlen(out),
                 "; it outlived SIGINT and SIGTERM and was killed with SIGKILL");
}

void dk_dist_outcome_fate(const dk_dist_outcome_t *o, int r, int root, char *out, size_t outlen)
{
    const dk_dist_rank_t *ri = &o->ranks[r];
    const char *when = ri->got_cell ? "" : " during start-up, before it received the cell";
    json_t *e = NULL;
    if (ri->state == DK_RANK_DONE) {
        snprintf(out, outlen, "rank %d: finished", r);
    } else if (ri->lost) {
        snprintf(out, outlen, "rank %d: lost with %s (nothing heard from it past the heartbeat "
                 "deadline)", r, ri->host ? ri->host : "localhost");
    } else if (ri->state == DK_RANK_STOPPED) {
        ended_by_us(o, ri, r, root, out, outlen);
    } else if (ri->is_error && ri->message) {
        e = rank_error(ri);
        snprintf(out, outlen, "rank %d: raised %s: %s", r,
                 e ? error_field(e, "ename") : "an exception", e ? error_field(e, "evalue") : "");
        json_decref(e);
    } else if (ri->term_signal) {
        snprintf(out, outlen, "rank %d: killed by signal %d (%s)%s%s", r, ri->term_signal,
                 signal_name(ri->term_signal), when,
                 ri->term_signal == SIGKILL ? ", often the out-of-memory killer (see dmesg)" : "");
    } else if (ri->exit_code > 0) {
        snprintf(out, outlen, "rank %d: exited with code %d%s", r, ri->exit_code,
                 ri->got_cell ? " before returning a result" : when);
    } else {
        snprintf(out, outlen, "rank %d: exited without returning a result%s", r, when);
    }
    /* A rank that ended without an error of its own, through srun: what srun
     * or slurmstepd said of it, where that says more than the exit status
     * ("task 0: Killed", "Node failure on node2", a step CANCELLED). The line
     * itself went to the rank's log, not to the cell. */
    if (ri->state == DK_RANK_FAILED && !ri->lost && !(ri->is_error && ri->message) &&
        ri->launcher_line[0])
        snprintf(out + strlen(out), outlen - strlen(out), " (%s)", ri->launcher_line);
    if (root == r)
        snprintf(out + strlen(out), outlen - strlen(out), "   <- root cause (first failure)");
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

/* ename and evalue of the run, and, when the root cause raised, its traceback
 * under a line naming it, appended to TB. */
/* Whether the run's error leads with its lost nodes: the first failure is a
 * lost rank, or a rank of a lost node, or a rank that died without a Python
 * error while ranks were lost (a node cut off mid-collective takes its peers'
 * launchers or connections down before the heartbeat deadline tells it). A
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

static void cause(const dk_dist_outcome_t *o, json_t *tb, char *ename, size_t enamelen,
                  char *evalue, size_t evaluelen)
{
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
        lost_nodes(o, "; ", evalue, evaluelen);
        char lines[1024];
        lost_nodes(o, "\n", lines, sizeof lines);
        for (char *at = lines, *nl; at && *at; at = nl ? nl + 1 : NULL) {
            nl = strchr(at, '\n');
            if (nl)
                *nl = '\0';
            json_array_append_new(tb, json_string(at));
        }
        json_array_append_new(tb, json_string(
            "Nothing was heard from them past the heartbeat deadline: the node is down, its "
            "network is cut, or its ranks are frozen. The other ranks were ended."));
    } else if (o->root >= 0) {
        const dk_dist_rank_t *ri = &o->ranks[o->root];
        json_t *e = rank_error(ri);
        if (e) {
            snprintf(ename, enamelen, "%s", error_field(e, "ename"));
            snprintf(evalue, evaluelen, "[rank %d] %s", o->root, error_field(e, "evalue"));
            char head[128];
            snprintf(head, sizeof head, "Rank %d failed first (root cause):", o->root);
            json_array_append_new(tb, json_string(head));
            size_t i;
            json_t *line;
            json_array_foreach(json_object_get(e, "traceback"), i, line)
                json_array_append(tb, line);
            json_decref(e);
        } else {
            dk_dist_outcome_fate(o, o->root, -1, evalue, evaluelen);
            snprintf(ename, enamelen, "%s", ri->term_signal ? "RankKilled" : "RankExited");
        }
    }
}

static bool log_cut_short(const dk_dist_rank_t *ri) { return !ri->log_complete; }
static bool log_capped(const dk_dist_rank_t *ri) { return ri->log_capped; }

/* Append INTRO and the ranks PICK chooses, then ")", to LOGS (N bytes used so
 * far, of CAP): " (cut short, ...: rank 0, 2)"; nothing when none is chosen.
 * Returns the new N. */
static int list_ranks(const dk_dist_outcome_t *o, bool (*pick)(const dk_dist_rank_t *),
                      const char *intro, char *logs, size_t cap, int n)
{
    const char *sep = intro;
    for (int r = 0; r < o->world && n > 0 && (size_t)n < cap - 16; r++) {
        if (!pick(&o->ranks[r]))
            continue;
        n += snprintf(logs + n, cap - (size_t)n, "%s%d", sep, r);
        sep = ", ";
    }
    if (sep != intro && n > 0 && (size_t)n < cap - 2)
        n += snprintf(logs + n, cap - (size_t)n, ")");
    return n;
}

/* The last line: where every rank's output is, and which logs are not whole. */
static json_t *logs_line(const dk_dist_outcome_t *o)
{
    char logs[1600];
    int n = snprintf(logs, sizeof logs, "Full output of every rank: %s/rank-N.log", o->log_dir);
    /* Say which logs a full disk cut short, rather than promise every byte. */
    n = list_ranks(o, log_cut_short, " (cut short, the disk refused writes: rank ", logs,
                   sizeof logs, n);
    /* And which keep only their head and tail (log_cap). */
    list_ranks(o, log_capped, " (head and tail only, past log_cap: rank ", logs, sizeof logs, n);
    return json_string(logs);
}

json_t *dk_dist_outcome_error(const dk_dist_outcome_t *o, bool headline)
{
    json_t *tb = json_array();
    if (!tb)
        return NULL;
    char ename[128], evalue[2048];
    cause(o, tb, ename, sizeof ename, evalue, sizeof evalue);
    json_array_append_new(tb, json_string(""));
    json_array_append_new(tb, json_string("Ranks:"));
    for (int r = 0; r < o->world; r++) {
        char fate[2048], line[2100];
        dk_dist_outcome_fate(o, r, o->root, fate, sizeof fate);
        snprintf(line, sizeof line, "  %s", fate);
        json_array_append_new(tb, json_string(line));
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
        if (first && *first)
            json_array_insert_new(tb, 0, json_string(""));
        char line[2400];
        snprintf(line, sizeof line, "\x1b[0;31m%s\x1b[0m: %s", ename, evalue);
        json_array_insert_new(tb, 0, json_string(line));
    }
    return json_pack("{s:s, s:s, s:o}", "ename", ename, "evalue", evalue, "traceback", tb);
}
