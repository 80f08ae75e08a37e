/*
 * dk_dist_opts_slurm: the options of %%distributed on a Slurm cluster.
 *
 * Part of dk_dist_opts (dk_dist_opts_table.h says which file holds what):
 * the parsers of the values of nodes, launcher, partition, account, qos,
 * constraint, slurm_args, export_secrets and advertise_addr (rows of the
 * table in dk_dist_opts_table.c), and their defaults, which a site sets once
 * in the environment (the kernelspec's env), parsed as the options are.
 *
 * What goes to Slurm is checked here, before anything of the run exists
 * (its log folder, its MLflow run), rather than by salloc once they do.
 */
#include "dk_dist_opts_table.h"
#include "dk_err.h"
#include "dk_slurm.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Nodes are not processes of this machine, so their bound is not that of
 * ranks (RANKS_MAX, dk_dist_opts_table.c). */
#define NODES_MAX 4096

int dist_opt_nodes(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                   char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long n = strtol(value, &end, 10);
    if (!*value || *end || errno || n < 1 || n > NODES_MAX) {
        dk_set_err(err, errlen, "nodes must be a whole number of nodes from 1 to %d, got '%s'",
                   NODES_MAX, value);
        return -1;
    }
    o->nodes = (int)n;
    o->nodes_from_env = false;     /* set again by dist_opts_env_defaults for DISTKERNEL_NODES */
    return 0;
}

int dist_opt_launcher(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                      char *err, size_t errlen)
{
    if (strcmp(value, "local") == 0)
        o->launcher = DK_LAUNCHER_LOCAL;
    else if (strcmp(value, "slurm") == 0)
        o->launcher = DK_LAUNCHER_SLURM;
    else {
        dk_set_err(err, errlen, "launcher must be local (this node) or slurm (nodes of a Slurm "
                   "cluster), got '%s'", value);
        return -1;
    }
    return 0;
}

/* partition, account, qos, constraint: one word each, handed to Slurm as one
 * argument (no shell sees it). */
int dist_opt_slurm_name(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                        char *err, size_t errlen)
{
    char *dst = strcmp(name, "partition") == 0 ? o->partition
              : strcmp(name, "account") == 0   ? o->account
              : strcmp(name, "qos") == 0       ? o->qos
                                               : o->constraint;
    size_t cap = dst == o->constraint ? sizeof o->constraint : sizeof o->partition;
    bool ok = value[0] && strlen(value) < cap;
    for (const char *c = value; ok && *c; c++)
        ok = isgraph((unsigned char)*c);
    if (!ok) {
        dk_set_err(err, errlen, "%s must be a Slurm %s name of 1 to %zu characters without "
                   "blanks, got '%s'", name, name, cap - 1, value);
        return -1;
    }
    snprintf(dst, cap, "%s", value);
    return 0;
}

/* Whether TEXT splits into shell words: its quotes are closed. */
static bool quotes_closed(const char *text)
{
    for (const char *p = text; *p; p++) {
        if (*p == '\\' && p[1])
            p++;
        else if (*p == '\'' || *p == '"') {
            const char *close = strchr(p + 1, *p);
            if (!close)
                return false;
            p = close;
        }
    }
    return true;
}

int dist_opt_slurm_args(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                        char *err, size_t errlen)
{
    bool ok = strlen(value) < sizeof o->slurm_args && quotes_closed(value);
    for (const char *c = value; ok && *c; c++)
        ok = *c == ' ' || *c == '\t' || isprint((unsigned char)*c);
    if (!ok) {
        dk_set_err(err, errlen, "slurm_args must be Slurm options as shell words (quotes "
                   "closed, printable, under %zu characters), such as \"--exclusive "
                   "--mem=0\", got '%s'", sizeof o->slurm_args, value);
        return -1;
    }
    /* Refused here, before anything of the run exists, rather than by salloc's
     * caller once the log folder and the MLflow run do. */
    if (dk_slurm_check_args(value, err, errlen) < 0)
        return -1;
    snprintf(o->slurm_args, sizeof o->slurm_args, "%s", value);
    return 0;
}

/* advertise_addr: numeric, since the back channel binds it. */
int dist_opt_advertise_addr(const char *name, const char *value, bool quoted,
                            dk_dist_opts_t *o, char *err, size_t errlen)
{
    (void)name;
    (void)quoted;
    unsigned char buf[sizeof(struct in6_addr)];
    if (strlen(value) >= sizeof o->advertise_addr ||
        (inet_pton(AF_INET, value, buf) != 1 && inet_pton(AF_INET6, value, buf) != 1)) {
        dk_set_err(err, errlen, "advertise_addr must be a numeric IPv4 or IPv6 address of "
                   "this host on the nodes' network, such as 10.0.0.5, got '%s'", value);
        return -1;
    }
    snprintf(o->advertise_addr, sizeof o->advertise_addr, "%s", value);
    return 0;
}

/* export_secrets: environment variable names, separated by commas. */
int dist_opt_export_secrets(const char *name, const char *value, bool quoted,
                            dk_dist_opts_t *o, char *err, size_t errlen)
{
    bool ok = strlen(value) < sizeof o->export_secrets;
    for (const char *c = value; ok && *c; c++)
        ok = isalnum((unsigned char)*c) || *c == '_' || *c == ',';
    if (!ok) {
        dk_set_err(err, errlen, "%s=%s: expected environment variable names separated by "
                   "commas, like export_secrets=WANDB_API_KEY,HF_TOKEN (at most %zu "
                   "characters)", name, value, sizeof o->export_secrets - 1);
        return -1;
    }
    snprintf(o->export_secrets, sizeof o->export_secrets, "%s", value);
    return 0;
}

/* The Slurm options' defaults, which a site sets once in the environment
 * (the kernelspec's env): each variable is parsed as its option is. */
static const struct {
    const char *env;
    dist_opt_parser_t parse;
    const char *name;
} slurm_env[] = {
    {"DISTKERNEL_NODES", dist_opt_nodes, "nodes"},
    {"DISTKERNEL_LAUNCHER", dist_opt_launcher, "launcher"},
    {"DISTKERNEL_SLURM_PARTITION", dist_opt_slurm_name, "partition"},
    {"DISTKERNEL_SLURM_ACCOUNT", dist_opt_slurm_name, "account"},
    {"DISTKERNEL_SLURM_QOS", dist_opt_slurm_name, "qos"},
    {"DISTKERNEL_SLURM_CONSTRAINT", dist_opt_slurm_name, "constraint"},
    {"DISTKERNEL_SLURM_ARGS", dist_opt_slurm_args, "slurm_args"},
    {"DISTKERNEL_SLURM_EXPORT_SECRETS", dist_opt_export_secrets, "export_secrets"},
};

int dist_opts_env_defaults(dk_dist_opts_t *o, char *err, size_t errlen)
{
    for (size_t i = 0; i < sizeof slurm_env / sizeof slurm_env[0]; i++) {
        const char *value = getenv(slurm_env[i].env);
        if (!value || !value[0])
            continue;
        char why[400];
        if (slurm_env[i].parse(slurm_env[i].name, value, true, o, why, sizeof why) < 0) {
            dk_set_err(err, errlen, "the environment variable %s (the default of %s=) is wrong: "
                       "%s", slurm_env[i].env, slurm_env[i].name, why);
            return -1;
        }
        if (slurm_env[i].parse == dist_opt_nodes)
            o->nodes_from_env = true;
    }
    return 0;
}
