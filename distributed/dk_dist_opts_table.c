/*
 * dk_dist_opts_table: the options of %%distributed, one row each.
 *
 * Part of dk_dist_opts (dk_dist_opts_table.h says which file holds what).
 * The table is the truth about every option: its name, its old name (the
 * managed platform's first API, accepted with a warning), and the parser of
 * its value, which checks it and fills its field. Adding an option is adding
 * a row and its parser. The parsers of the Slurm options' values are in
 * dk_dist_opts_slurm.c, with those options' defaults from the environment.
 *
 * Each parser's error names the option as written, the value, and what is
 * accepted: the options are checked before eight processes start and claim
 * eight GPUs.
 */
#include "dk_dist_opts_table.h"
#include "dk_err.h"
#include "dk_rank_list.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char dist_opts_accepted[] =
    "accepted options: num_accelerators, accelerator_type, num_processes, timeout, restarts, "
    "stall_after, output, "
    "result, check, experiment, run_name, tracking, log_cap, nodes, launcher, partition, "
    "account, qos, constraint, slurm_args, export_secrets, advertise_addr, idle_timeout, warm, "
    "warm_modules (and the deprecated "
    "gpus, gpu_type)";

/* The kernel holds descriptors for each rank (five for a local one,
 * runtime/channel/dk_fdlimit.h), its log and its output line; 4096 is far more than
 * one node has cores or GPUs for. Whether a count fits the descriptor limit is
 * checked when the cell runs. A list of ranks (output=) knows the bound too. */
#define RANKS_MAX DK_RANK_LIST_RANKS_MAX

bool dk_dist_opts_parse_size(const char *text, unsigned long long *out)
{
    if (!text || *text < '0' || *text > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno)
        return false;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift && *end == 'i')
        end++;
    if (*end == 'B' || (*end == 'b' && shift))
        end++;
    if (*end || (shift && v > (ULLONG_MAX >> shift)))
        return false;
    *out = v << shift;
    return true;
}

static int parse_count(const char *name, const char *value, int *out, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long n = strtol(value, &end, 10);
    if (!*value || *end || errno || n < 1 || n > RANKS_MAX) {
        dk_set_err(err, errlen, "%s must be a positive whole number (1 to %d), got '%s'; at "
                   "most %d because the kernel keeps a log and a live output line for every "
                   "rank, and each rank on this node holds 5 of the kernel's file descriptors",
                   name, RANKS_MAX, value, RANKS_MAX);
        return -1;
    }
    *out = (int)n;
    return 0;
}

static bool valid_model(const char *m)
{
    if (!*m || strlen(m) >= 32)
        return false;
    for (; *m; m++)
        if (!isalnum((unsigned char)*m))
            return false;
    return true;
}

static void upper(char *s)
{
    for (; *s; s++)
        *s = (char)toupper((unsigned char)*s);
}

static void add_warning(dk_dist_opts_t *o, const char *text)
{
    size_t used = strlen(o->warnings);
    snprintf(o->warnings + used, sizeof o->warnings - used, "%s%s", used ? "\n" : "", text);
}

/* ---- one parser per option (dist_opt_parser_t) ------------------------------- */

static int bool_value(const char *name, const char *value, bool *out, char *err, size_t errlen)
{
    if (strcmp(value, "True") == 0 || strcmp(value, "true") == 0)
        *out = true;
    else if (strcmp(value, "False") == 0 || strcmp(value, "false") == 0)
        *out = false;
    else {
        dk_set_err(err, errlen, "%s must be True or False, got '%s'", name, value);
        return -1;
    }
    return 0;
}

static int opt_accelerators(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                            char *err, size_t errlen)
{
    return parse_count(name, value, &o->num_accelerators, err, errlen);
}

static int opt_processes(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                         char *err, size_t errlen)
{
    return parse_count(name, value, &o->num_processes, err, errlen);
}

/* gpu_type=H100: the older spelling, a bare model. */
static int opt_gpu_type(const char *value, dk_dist_opts_t *o, char *err, size_t errlen)
{
    char model[32];
    snprintf(model, sizeof model, "%.31s", value);
    upper(model);
    if (strlen(value) >= sizeof model || !valid_model(model)) {
        dk_set_err(err, errlen, "gpu_type must be a GPU model such as H100, A10 or B300, got '%s'",
                 value);
        return -1;
    }
    snprintf(o->accelerator_model, sizeof o->accelerator_model, "%s", model);
    snprintf(o->accelerator_given, sizeof o->accelerator_given, "gpu_type=%s", model);
    return 0;
}

/* VALUE without a leading "ENUM." (GPUType.H100 as the decorator's Python
 * would spell it: the magic takes the platform's enum members too). */
static const char *enum_member(const char *value, const char *enum_name)
{
    size_t n = strlen(enum_name);
    return strncmp(value, enum_name, n) == 0 && value[n] == '.' ? value + n + 1 : value;
}

static int opt_accelerator_type(const char *name, const char *value, bool quoted,
                                dk_dist_opts_t *o, char *err, size_t errlen)
{
    if (strcmp(name, "gpu_type") == 0)
        return opt_gpu_type(enum_member(value, "GPUType"), o, err, errlen);
    value = enum_member(value, "AcceleratorType");
    char buf[256];
    snprintf(buf, sizeof buf, "%s", value);
    upper(buf);
    char *x = strchr(buf, 'X');
    char *end = NULL;
    long n = 0;
    if (strncmp(buf, "GPU_", 4) == 0 && x) {
        errno = 0;
        n = strtol(buf + 4, &end, 10);
    }
    if (!x || end != x || n < 1 || n > 4096 || !valid_model(x + 1)) {
        dk_set_err(err, errlen, "accelerator_type must look like GPU_<n>x<MODEL> "
                              "(GPU_1xA10, GPU_8xH100, GPU_8xB300), got '%s'", value);
        return -1;
    }
    o->accelerator_count = (int)n;
    snprintf(o->accelerator_model, sizeof o->accelerator_model, "%.31s", x + 1);
    snprintf(o->accelerator_given, sizeof o->accelerator_given, "accelerator_type=GPU_%ldx%.31s",
             n, x + 1);
    return 0;
}

static int opt_timeout(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                       char *err, size_t errlen)
{
    o->timeout_given = true;
    if (!quoted && strcmp(value, "None") == 0) {
        o->timeout_s = 0;
        return 0;
    }
    char *end;
    errno = 0;
    double t = strtod(value, &end);
    if (quoted || !*value || *end || errno || !(t > 0) || !isfinite(t)) {
        dk_set_err(err, errlen, "timeout must be a number of seconds greater than 0, "
                              "or None for no limit, got '%s'", value);
        return -1;
    }
    o->timeout_s = t;
    return 0;
}

static int opt_restarts(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                        char *err, size_t errlen)
{
    char *end;
    errno = 0;
    long n = strtol(value, &end, 10);
    if (quoted || !*value || *end || errno || n < 0 || n > DK_RESTARTS_MAX) {
        dk_set_err(err, errlen, "%s must be a whole number from 0 to %d (how many times a failed "
                   "run starts every rank again), got '%s'", name, DK_RESTARTS_MAX, value);
        return -1;
    }
    o->restarts = (int)n;
    return 0;
}

/* Seconds >= 0 (0: off) into *OUT, from the option or the variable. */
static bool stall_seconds(const char *value, double *out)
{
    char *end;
    errno = 0;
    double t = strtod(value, &end);
    if (!*value || *end || errno || !(t >= 0) || !isfinite(t))
        return false;
    *out = t;
    return true;
}

#define STALL_ACCEPTED "a number of seconds, 0 or more (0 turns it off)"

static int opt_stall_after(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                           char *err, size_t errlen)
{
    if (quoted || !stall_seconds(value, &o->stall_after_s)) {
        dk_set_err(err, errlen, "%s must be " STALL_ACCEPTED ", got '%s'", name, value);
        return -1;
    }
    return 0;
}

static int opt_idle_timeout(const char *name, const char *value, bool quoted,
                            dk_dist_opts_t *o, char *err, size_t errlen)
{
    o->idle_given = true;
    if (!quoted && strcmp(value, "None") == 0) {
        o->idle_timeout_s = 0;
        return 0;
    }
    char *end;
    errno = 0;
    double t = strtod(value, &end);
    if (quoted || !*value || *end || errno || !(t > 0) || !isfinite(t)) {
        dk_set_err(err, errlen, "%s must be a number of seconds greater than 0, "
                                "or None for no limit, got '%s'", name, value);
        return -1;
    }
    o->idle_timeout_s = t;
    return 0;
}

static int opt_output(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                      char *err, size_t errlen)
{
    o->output_ranks[0] = '\0';
    if (strcmp(value, "all") == 0) {
        o->output = DK_OUTPUT_ALL;
        return 0;
    }
    if (strcmp(value, "rank0") == 0) {
        o->output = DK_OUTPUT_RANK0;
        return 0;
    }
    if (strcmp(value, "local0") == 0) {
        o->output = DK_OUTPUT_LOCAL0;
        return 0;
    }
    /* A list: its ranks are checked against the world once the run is
     * planned (dk_dist_plan_output), before any rank starts. */
    char why[512];
    bool list_like = isdigit((unsigned char)value[strspn(value, " ")]);
    if (dk_rank_list_parse(value, 0, NULL, why, sizeof why) < 0) {
        if (list_like)
            dk_set_err(err, errlen, "output=%s: %s", value, why);
        else
            dk_set_err(err, errlen, "output must be all, rank0, local0 (local rank 0 of each "
                       "node) or a list of ranks such as 0,8,16-31, got '%s'", value);
        return -1;
    }
    o->output = DK_OUTPUT_LIST;
    snprintf(o->output_ranks, sizeof o->output_ranks, "%s", value);
    return 0;
}

static int opt_result(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                      char *err, size_t errlen)
{
    bool ident = (isalpha((unsigned char)value[0]) || value[0] == '_') &&
                 strlen(value) < sizeof o->result_name;
    for (const char *c = value; ident && *c; c++)
        ident = isalnum((unsigned char)*c) || *c == '_';
    if (!ident) {
        dk_set_err(err, errlen, "result must be a Python variable name, got '%s'", value);
        return -1;
    }
    snprintf(o->result_name, sizeof o->result_name, "%s", value);
    return 0;
}

static int opt_mlflow_name(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                           char *err, size_t errlen)
{
    char *dst = name[0] == 'e' ? o->experiment : o->run_name;
    if (!value[0] || strlen(value) >= sizeof o->experiment) {
        dk_set_err(err, errlen, "%s must be a non-empty name of at most %zu characters", name,
                 sizeof o->experiment - 1);
        return -1;
    }
    snprintf(dst, sizeof o->experiment, "%s", value);
    return 0;
}

static int opt_tracking(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                        char *err, size_t errlen)
{
    return bool_value(name, value, &o->tracking, err, errlen);
}

static int opt_warm(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                    char *err, size_t errlen)
{
    return bool_value(name, value, &o->warm, err, errlen);
}

/* Module names (dotted identifiers) separated by commas. */
static int opt_warm_modules(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                            char *err, size_t errlen)
{
    bool ok = strlen(value) < sizeof o->warm_modules;
    for (const char *c = value; ok && *c; c++)
        ok = isalnum((unsigned char)*c) || *c == '_' || *c == '.' || *c == ',';
    if (!ok) {
        dk_set_err(err, errlen, "%s=%s: expected module names separated by commas, like "
                   "warm_modules=transformers,numpy (at most %zu characters)", name, value,
                   sizeof o->warm_modules - 1);
        return -1;
    }
    snprintf(o->warm_modules, sizeof o->warm_modules, "%s", value);
    return 0;
}

static int opt_check(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                     char *err, size_t errlen)
{
    return bool_value(name, value, &o->check, err, errlen);
}

static int opt_log_cap(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                       char *err, size_t errlen)
{
    unsigned long long cap;
    if (!dk_dist_opts_parse_size(value, &cap) || cap < DK_LOG_CAP_MIN_BYTES) {
        dk_set_err(err, errlen, "log_cap must be a size of at least 4K, such as 64M or "
                              "2G (K, M, G, T: powers of 1024), got '%s'", value);
        return -1;
    }
    o->log_cap = cap;
    return 0;
}

/* The options. An option with an old name (the managed platform's first API)
 * accepts either, warns on the old one, and refuses both given at once. */
static const struct {
    const char *name, *old_name, *deprecation;
    dist_opt_parser_t parse;
} options[] = {
    {"num_accelerators", "gpus", "FutureWarning: gpus= is deprecated; use num_accelerators=",
     opt_accelerators},
    {"accelerator_type", "gpu_type",
     "FutureWarning: gpu_type= is deprecated; use accelerator_type=GPU_<n>x<MODEL>",
     opt_accelerator_type},
    {"num_processes", NULL, NULL, opt_processes},
    {"timeout", NULL, NULL, opt_timeout},
    {"restarts", NULL, NULL, opt_restarts},
    {"stall_after", NULL, NULL, opt_stall_after},
    {"output", NULL, NULL, opt_output},
    {"result", NULL, NULL, opt_result},
    {"experiment", NULL, NULL, opt_mlflow_name},
    {"run_name", NULL, NULL, opt_mlflow_name},
    {"tracking", NULL, NULL, opt_tracking},
    {"log_cap", NULL, NULL, opt_log_cap},
    {"check", NULL, NULL, opt_check},
    /* on a Slurm cluster (dk_dist_opts_slurm.c; defaults from the environment) */
    {"nodes", NULL, NULL, dist_opt_nodes},
    {"launcher", NULL, NULL, dist_opt_launcher},
    {"partition", NULL, NULL, dist_opt_slurm_name},
    {"account", NULL, NULL, dist_opt_slurm_name},
    {"qos", NULL, NULL, dist_opt_slurm_name},
    {"constraint", NULL, NULL, dist_opt_slurm_name},
    {"slurm_args", NULL, NULL, dist_opt_slurm_args},
    {"export_secrets", NULL, NULL, dist_opt_export_secrets},
    {"advertise_addr", NULL, NULL, dist_opt_advertise_addr},
    {"idle_timeout", NULL, NULL, opt_idle_timeout},
    {"warm", NULL, NULL, opt_warm},
    {"warm_modules", NULL, NULL, opt_warm_modules},
};
#define N_OPTIONS (sizeof options / sizeof options[0])
_Static_assert(N_OPTIONS == DIST_OPTS_ROWS, "DIST_OPTS_ROWS is the number of options' rows");

/* Parse one NAME=VALUE into O; SEEN marks the options given so far. */
int dist_opts_set(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                  bool seen[DIST_OPTS_ROWS], char *err, size_t errlen)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        bool old = options[i].old_name && strcmp(name, options[i].old_name) == 0;
        if (!old && strcmp(name, options[i].name) != 0)
            continue;
        if (options[i].old_name && seen[i]) {
            dk_set_err(err, errlen, "%s is given twice (%s is its old name)", options[i].name,
                     options[i].old_name);
            return -1;
        }
        seen[i] = true;
        if (old)
            add_warning(o, options[i].deprecation);
        return options[i].parse(name, value, quoted, o, err, errlen);
    }
    dk_set_err(err, errlen, "unknown option '%s'; %s", name, dist_opts_accepted);
    return -1;
}

bool dist_opts_given(const bool seen[DIST_OPTS_ROWS], const char *name)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strcmp(options[i].name, name) == 0)
            return seen[i];
    return false;
}

int dist_opts_defaults(dk_dist_opts_t *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->timeout_s = DK_DEFAULT_TIMEOUT_S;
    o->idle_timeout_s = DK_DEFAULT_IDLE_TIMEOUT_S;
    o->stall_after_s = DK_DEFAULT_STALL_AFTER_S;
    o->tracking = true;
    o->warm = true;
    const char *stall = getenv(DK_STALL_AFTER_ENV);
    if (stall && *stall && !stall_seconds(stall, &o->stall_after_s)) {
        dk_set_err(err, errlen, "the environment variable " DK_STALL_AFTER_ENV " (the default "
                   "of stall_after=) is '%.64s'; it must be " STALL_ACCEPTED, stall);
        return -1;
    }
    return 0;
}
