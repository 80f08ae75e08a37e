/*
 * dk_dist_opts: parsing and validating distributed options. See the header.
 *
 * The grammar is deliberately small (no expressions): an option's value is known
 * when the cell is submitted, and a typo must be caught before eight processes
 * start and claim eight GPUs.
 *
 * This file is the grammar: the text split into name=value tokens (a value
 * bare or quoted), each handed to the option table (dk_dist_opts_table.c,
 * which checks the value), then the checks that need several options at once.
 * dk_dist_opts_table.h says which file holds the rest.
 */
#include "dk_dist_opts_table.h"
#include "dk_err.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* One `name=value` token; VALUE is unquoted. Returns the position after it, NULL
 * at the end, or sets ERR. */
static const char *next_token(const char *p, char *name, size_t nlen, char *value, size_t vlen,
                              bool *quoted, char *err, size_t errlen)
{
    while (*p && isspace((unsigned char)*p))
        p++;
    if (!*p)
        return NULL;
    size_t n = 0;
    const char *start = p;
    while (*p && (isalnum((unsigned char)*p) || *p == '_')) {
        if (n + 1 < nlen)
            name[n++] = *p;
        p++;
    }
    name[n] = '\0';
    if (n == 0 || *p != '=') {
        const char *end = start;
        while (*end && !isspace((unsigned char)*end))
            end++;
        dk_set_err(err, errlen, "expected name=value, got '%.*s'; %s", (int)(end - start), start,
                 dist_opts_accepted);
        return (const char *)-1;
    }
    p++;
    size_t v = 0;
    bool cut = false;
    *quoted = false;
    if (*p == '"' || *p == '\'') {
        char q = *p++;
        *quoted = true;
        while (*p && *p != q) {
            if (*p == '\\' && p[1])
                p++;
            if (v + 1 < vlen)
                value[v++] = *p;
            else
                cut = true;
            p++;
        }
        if (*p != q) {
            dk_set_err(err, errlen, "option %s: unterminated quoted value", name);
            return (const char *)-1;
        }
        p++;
    } else {
        while (*p && !isspace((unsigned char)*p)) {
            if (v + 1 < vlen)
                value[v++] = *p;
            else
                cut = true;
            p++;
        }
    }
    value[v] = '\0';
    /* Cut short, a value would say something else than what was written (a
     * list of ranks that stops in the middle of a number). */
    if (cut) {
        dk_set_err(err, errlen, "option %s: its value is longer than %zu characters%s", name,
                   vlen - 1, strcmp(name, "output") == 0
                   ? "; write runs of ranks as ranges (16-31 rather than 16,17,...,31)" : "");
        return (const char *)-1;
    }
    return p;
}

const char *dk_dist_opts_nodes_given(const dk_dist_opts_t *o, char *out, size_t len)
{
    if (o->nodes_from_env)
        snprintf(out, len, "nodes=%d (the default from DISTKERNEL_NODES=%d)", o->nodes,
                 o->nodes);
    else
        snprintf(out, len, "nodes=%d", o->nodes);
    return out;
}

/* The node counts nearest to NODES that split WORLD ranks evenly, for a
 * message: "nodes=1 or nodes=3". */
static void nodes_that_fit(int world, int nodes, char *out, size_t len)
{
    int below = 1, above = 0;
    for (int d = 1; d <= world; d++) {
        if (world % d)
            continue;
        if (d <= nodes)
            below = d;
        else if (!above)
            above = d;
    }
    if (above)
        snprintf(out, len, "nodes=%d or nodes=%d", below, above);
    else
        snprintf(out, len, "nodes=%d", below);
}

/* nodes, launcher and the world size, together. */
static int check_nodes(dk_dist_opts_t *o, bool launcher_given, char *err, size_t errlen)
{
    if (o->nodes > 1 && o->launcher == DK_LAUNCHER_LOCAL) {
        if (launcher_given) {
            dk_set_err(err, errlen, "nodes=%d needs launcher=slurm: launcher=local runs every "
                       "rank on this node", o->nodes);
            return -1;
        }
        o->launcher = DK_LAUNCHER_SLURM;
    }
    int world = o->num_processes ? o->num_processes : o->num_accelerators;
    const char *what = o->num_processes ? "num_processes" : "num_accelerators";
    if (o->nodes && world) {
        if (world < o->nodes || world % o->nodes) {
            char given[96], fit[64];
            nodes_that_fit(world, o->nodes, fit, sizeof fit);
            if (o->nodes_from_env)
                dk_set_err(err, errlen, "%s=%d cannot be split evenly over %s: %s is the "
                           "total over all nodes, and every node runs as many ranks; use a "
                           "multiple of %d, or a number of nodes that divides %d (%s): "
                           DK_DIST_NODES_ENV_FIX, what, world,
                           dk_dist_opts_nodes_given(o, given, sizeof given), what, o->nodes,
                           world, fit);
            else
                dk_set_err(err, errlen, "%s=%d cannot be split evenly over nodes=%d: %s is the "
                           "total over all nodes, and every node runs as many ranks; use a "
                           "multiple of %d", what, world, o->nodes, what, o->nodes);
            return -1;
        }
        o->ranks_per_node = world / o->nodes;
    }
    return 0;
}

int dk_dist_opts_parse(const char *args, dk_dist_opts_t *o, char *err, size_t errlen)
{
    if (dist_opts_defaults(o, err, errlen) < 0)
        return -1;
    return dk_dist_opts_parse_onto(args, o, err, errlen);
}

int dk_dist_opts_parse_onto(const char *args, dk_dist_opts_t *o, char *err, size_t errlen)
{
    o->warnings[0] = '\0';
    bool seen[DIST_OPTS_ROWS] = {false};
    char name[64], value[1024];
    bool quoted;
    if (dist_opts_env_defaults(o, err, errlen) < 0)
        return -1;
    const char *p = args ? args : "";
    for (;;) {
        p = next_token(p, name, sizeof name, value, sizeof value, &quoted, err, errlen);
        if (!p)
            break;
        if (p == (const char *)-1 || dist_opts_set(name, value, quoted, o, seen, err, errlen) < 0)
            return -1;
    }
    if (o->num_processes && (o->num_accelerators || o->accelerator_model[0])) {
        dk_set_err(err, errlen, "num_processes runs CPU ranks and cannot be combined with "
                              "num_accelerators or accelerator_type");
        return -1;
    }
    if (o->num_accelerators && o->accelerator_count &&
        o->num_accelerators != o->accelerator_count) {
        dk_set_err(err, errlen, "num_accelerators=%d contradicts accelerator_type=GPU_%dx%s",
                 o->num_accelerators, o->accelerator_count, o->accelerator_model);
        return -1;
    }
    if (!o->num_accelerators && o->accelerator_count)
        o->num_accelerators = o->accelerator_count;
    return check_nodes(o, dist_opts_given(seen, "launcher"), err, errlen);
}
