/*
 * dk_dist_opts: parsing and validating distributed options. See the header.
 *
 * The grammar is deliberately small (no expressions): an option's value is known
 * when the cell is submitted, and a typo must be caught before eight processes
 * start and claim eight GPUs.
 */
#include "dk_dist_opts.h"
#include "dk_err.h"
#include "dk_rank_list.h"
#include "dk_slurm.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One string, longer than the 4095 characters C11 promises; GCC and Clang take
 * it, and one string is what %%distributed? shows. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverlength-strings"
const char dk_dist_doc[] =
    "%%distributed [option=value ...]\n"
    "\n"
    "Run the cell as torch.distributed ranks on this node, one process per GPU (or per\n"
    "CPU rank), and show every rank's output, labelled, as it is written.\n"
    "\n"
    "Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
    "MASTER_ADDR and a free MASTER_PORT, so `dist.init_process_group()` works as under\n"
    "torchrun; bind your GPU with `torch.cuda.set_device(int(os.environ['LOCAL_RANK']))`.\n"
    "Functions, classes and values the cell uses that earlier cells defined are sent to\n"
    "every rank; modules are imported again there. Changes ranks make to their\n"
    "variables do not come back; each rank's last expression value does.\n"
    "\n"
    "Options:\n"
    "  num_accelerators=N   GPUs (one rank each); default: every GPU of the node.\n"
    "                       Deprecated alias: gpus=N.\n"
    "  accelerator_type=T   GPUs of a model, as GPU_<n>x<MODEL> (GPU_8xH100, GPU_1xA10,\n"
    "                       or AcceleratorType.GPU_8xH100; GPUType.H100 for gpu_type;\n"
    "                       n is the number of ranks). Deprecated alias: gpu_type=MODEL.\n"
    "                       The node's own model runs. A type of the managed platform's\n"
    "                       fleet (A10, H100, B300) runs on whatever GPUs the node has\n"
    "                       (an H200 node, say), with a line naming both; any other model\n"
    "                       is an error naming the node's GPUs and the platform's types.\n"
    "  num_processes=N      run N CPU ranks instead (backend gloo), e.g. on a machine\n"
    "                       without GPUs.\n"
    "  timeout=SECONDS      end every rank after this long (default 10800, 3 hours);\n"
    "                       timeout=None for no limit.\n"
    "  stall_after=SECONDS  once no rank has printed for this long (default 60, or\n"
    "                       $DISTKERNEL_STALL_AFTER), the status shows where the ranks\n"
    "                       are, grouped by stack (the odd one out first), sampled every\n"
    "                       5 s until a rank prints again; 0 turns it off. A sample\n"
    "                       interrupts nothing; a rank holding the GIL in C code (as\n"
    "                       torch's rendezvous does) shows no Python stack in it.\n"
    "  output=all|rank0|local0|LIST\n"
    "                       whose output the cell shows: every rank's (default), rank\n"
    "                       0's, local rank 0's of each node, or the ranks of a list\n"
    "                       such as 0,8,16-31 (ranks and FIRST-LAST ranges). The full\n"
    "                       output of every rank is always in its log file.\n"
    "  result=NAME          store the per-rank results (a list) in variable NAME.\n"
    "  check=True           run the NCCL preflight check across the GPUs first.\n"
    "  experiment=NAME      the MLflow experiment of the run (default: $MLFLOW_EXPERIMENT_NAME,\n"
    "                       $MLFLOW_EXPERIMENT_ID, else one named after the notebook).\n"
    "  run_name=NAME        the MLflow run's name (default: generated).\n"
    "  tracking=False       do not record the run in MLflow.\n"
    "  warm=False           start this run's ranks cold, not forked from the kernel's\n"
    "                       warm-start template (which has imported torch already;\n"
    "                       DISTKERNEL_WARM=0 turns it off for every run).\n"
    "  warm_modules=A,B     more modules the template imports (and those of\n"
    "                       $DISTKERNEL_WARM_MODULES); a module that starts a thread\n"
    "                       makes runs cold, with the reason in the run's warm.log.\n"
    "  log_cap=SIZE         the most each rank's log file keeps (default 1G, or\n"
    "                       $DISTKERNEL_LOG_CAP): past it, its first and last parts\n"
    "                       with a line saying how much was left out between them.\n"
    "\n"
    "On a Slurm cluster (the kernel on a login node, or inside an allocation):\n"
    "  nodes=N              run on N nodes; num_accelerators / num_processes are the\n"
    "                       total, split evenly over them. nodes > 1 means Slurm.\n"
    "                       GPU ranks without nodes=: as many nodes as the GPUs fill\n"
    "                       (the partition's GPUs per node, from sinfo); each node's\n"
    "                       ranks see its GPUs, LOCAL_RANK's being the rank's own.\n"
    "  launcher=local|slurm where ranks run: this node (default), or Slurm's nodes.\n"
    "  partition=P  account=A  qos=Q  constraint=C\n"
    "                       what Slurm is asked for (default: Slurm's own defaults).\n"
    "  slurm_args=\"...\"     more Slurm options, passed through as they are.\n"
    "  export_secrets=A,B   variables that name a secret (*TOKEN*, *PASSWORD*, *SECRET*,\n"
    "                       *_KEY ...) are not sent to Slurm's nodes unless listed here\n"
    "                       (default $DISTKERNEL_SLURM_EXPORT_SECRETS); MLflow's reach the\n"
    "                       ranks over the run's authenticated channel.\n"
    "  advertise_addr=A     this host's address on the nodes' network, where the ranks\n"
    "                       reach the kernel (default $DISTKERNEL_ADVERTISE_ADDR, else\n"
    "                       the route to the first node that is not this host).\n"
    "  Defaults, set once by a site (e.g. in the kernelspec's env): DISTKERNEL_NODES,\n"
    "  DISTKERNEL_LAUNCHER, DISTKERNEL_SLURM_PARTITION, DISTKERNEL_SLURM_ACCOUNT,\n"
    "  DISTKERNEL_SLURM_QOS, DISTKERNEL_SLURM_CONSTRAINT, DISTKERNEL_SLURM_ARGS,\n"
    "  DISTKERNEL_SLURM_EXPORT_SECRETS.\n"
    "Started ranks (state kept between cells, like %%px):\n"
    "  %distributed start OPTIONS   start ranks (same options, plus idle_timeout=SECONDS:\n"
    "                       end them after this long without a cell; default 3600, or\n"
    "                       $DISTKERNEL_IDLE_TIMEOUT; None for never). Then every\n"
    "                       %%distributed cell and .distributed() call without size\n"
    "                       options runs on them, with their globals kept; the\n"
    "                       start's options (output=, timeout=...) are its defaults.\n"
    "  %distributed status  the started ranks: uptime, idle time, PIDs (past 8 ranks,\n"
    "                       counts by state and node), whose output cells show.\n"
    "  %distributed stop    end them.   %distributed restart: stop, then start again.\n"
    "An exception in a cell leaves them running; interrupt raises KeyboardInterrupt\n"
    "in every rank. A rank that dies, or one stuck after an interrupt, ends them all.\n"
    "\n"
    "Every run is an MLflow run (MLFLOW_TRACKING_URI, or a local server when the\n"
    "`mlflow` command is installed): its link is shown, ranks log into it through\n"
    "MLFLOW_RUN_ID, and its final status is FINISHED, FAILED or KILLED.\n"
    "\n"
    "Every rank's output is also in rank-N.log, in a folder of its own under\n"
    "$DISTKERNEL_LOG_DIR (default $XDG_STATE_HOME/distkernel/logs, else\n"
    "~/.local/state/distkernel/logs), which must be yours alone. A kernel keeps its\n"
    "last 20 runs, and the whole folder at most $DISTKERNEL_LOG_ROOT_CAP (default\n"
    "10G): the oldest runs go first, never a running one.\n"    "\n"
    "Reading a run of hundreds or thousands of ranks: show a few ranks in the cell,\n"
    "output=local0 (one rank per node, 128 lines for 1,024 ranks on 128 nodes) or a\n"
    "list (output=0,512,1023), and read the rest in the run's log folder, which the\n"
    "status display names: rank-N.log has rank N's whole output, for example\n"
    "`grep -l Traceback LOGDIR/rank-*.log` finds the ranks that raised.\n"
    "\n"
    "Interrupting the cell, its timeout, a failing rank, and shutting down or\n"
    "restarting the kernel end every rank. The first rank to fail is the root cause\n"
    "shown as the cell's error, with a summary of every rank's fate.\n"
    "\n"
    "The same options work on the decorator:\n"
    "    from distkernel import distributed   # or serverless_gpu / databricks.air\n"
    "    @distributed(num_processes=2)\n"
    "    def train(epochs): ...\n"
    "    results = train.distributed(3)        # one entry per rank\n"
    "\n"
    "The managed platform's packages, for its notebooks to run unchanged:\n"
    "  serverless_gpu       distributed (gpus=, gpu_type= are its names), GPUType (A10,\n"
    "                       H100, B300), ray_init, DistributedError, get_global_rank,\n"
    "                       get_local_rank, get_world_size, get_local_world_size,\n"
    "                       get_node_rank\n"
    "  serverless_gpu.ray   ray_launch, ray_init\n"
    "  databricks.air       distributed, AcceleratorType (GPU_1xA10, GPU_1xH100, GPU_8xH100,\n"
    "                       GPU_8xB300), ray_launch, ray_init, and the same helpers;\n"
    "                       gpus= and gpu_type= work with a FutureWarning naming\n"
    "                       num_accelerators= and accelerator_type=, once per line\n"
    "  databricks.air.ray   ray_launch, ray_init\n"
    "What differs: remote=True runs the ranks on this site's own Slurm (as\n"
    "launcher=slurm), remote=False on this node's GPUs (a platform type the node lacks\n"
    "runs on what it has, with a notice); serverless_gpu.data and\n"
    "databricks.air.data (UCVolumeDataset, UCVolumeWriter, UCVolumeReader) are the\n"
    "platform's Unity Catalog storage and an ImportError here: use a torch Dataset over\n"
    "local or mounted files.\n"
    "\n"
    "@ray_launch(...) (same options) runs a function as the Ray driver: every rank joins\n"
    "a torch rendezvous, rank 0 runs `ray start --head`, sets RAY_ADDRESS and runs the\n"
    "function, the others run `ray start --address=...` and wait; every rank runs\n"
    "`ray stop` however the run ends; .distributed() returns the driver's value. It\n"
    "needs the `ray` command on PATH, checked before anything starts. Inside a\n"
    "distributed function or cell, `with ray_init() as cluster:` does the same for a\n"
    "block (cluster.is_driver on rank 0).\n";
#pragma GCC diagnostic pop

/* The platform's enum members (python/distkernel/_platform.py holds the same
 * lists; tests/e2e/test_platform.py checks that they agree). */
const char dk_dist_platform_gpu_types[] = "A10, H100, B300";
const char dk_dist_platform_accelerator_types[] = "GPU_1xA10, GPU_1xH100, GPU_8xH100, GPU_8xB300";

bool dk_dist_platform_model(const char *model)
{
    static const char *const models[] = {"A10", "H100", "B300"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        if (strcmp(model, models[i]) == 0)
            return true;
    return false;
}

static const char accepted[] =
    "accepted options: num_accelerators, accelerator_type, num_processes, timeout, stall_after, "
    "output, "
    "result, check, experiment, run_name, tracking, log_cap, nodes, launcher, partition, "
    "account, qos, constraint, slurm_args, export_secrets, advertise_addr, idle_timeout, warm, "
    "warm_modules (and the deprecated "
    "gpus, gpu_type)";

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
                 accepted);
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

/* ---- one parser per option ---------------------------------------------------- *
 * Each gets the option's NAME as written (the old name, for an alias), its
 * VALUE and whether it was QUOTED, and fills its field of O; -1 with ERR. */

typedef int (*opt_parser_t)(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                            char *err, size_t errlen);

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

/* export_secrets: environment variable names, separated by commas. */
static int opt_export_secrets(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                              char *err, size_t errlen)
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

/* ---- on a Slurm cluster ---- */

/* Nodes are not processes of this machine, so their bound is not RANKS_MAX's. */
#define NODES_MAX 4096

static int opt_nodes(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
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
    o->nodes_from_env = false;     /* env_defaults says otherwise for DISTKERNEL_NODES */
    return 0;
}

static int opt_launcher(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
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
static int opt_slurm_name(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
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

static int opt_slurm_args(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
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
static int opt_advertise_addr(const char *name, const char *value, bool quoted,
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

/* The options. An option with an old name (the managed platform's first API)
 * accepts either, warns on the old one, and refuses both given at once. */
static const struct {
    const char *name, *old_name, *deprecation;
    opt_parser_t parse;
} options[] = {
    {"num_accelerators", "gpus", "FutureWarning: gpus= is deprecated; use num_accelerators=",
     opt_accelerators},
    {"accelerator_type", "gpu_type",
     "FutureWarning: gpu_type= is deprecated; use accelerator_type=GPU_<n>x<MODEL>",
     opt_accelerator_type},
    {"num_processes", NULL, NULL, opt_processes},
    {"timeout", NULL, NULL, opt_timeout},
    {"stall_after", NULL, NULL, opt_stall_after},
    {"output", NULL, NULL, opt_output},
    {"result", NULL, NULL, opt_result},
    {"experiment", NULL, NULL, opt_mlflow_name},
    {"run_name", NULL, NULL, opt_mlflow_name},
    {"tracking", NULL, NULL, opt_tracking},
    {"log_cap", NULL, NULL, opt_log_cap},
    {"check", NULL, NULL, opt_check},
    /* on a Slurm cluster (defaults from the environment: slurm_env below) */
    {"nodes", NULL, NULL, opt_nodes},
    {"launcher", NULL, NULL, opt_launcher},
    {"partition", NULL, NULL, opt_slurm_name},
    {"account", NULL, NULL, opt_slurm_name},
    {"qos", NULL, NULL, opt_slurm_name},
    {"constraint", NULL, NULL, opt_slurm_name},
    {"slurm_args", NULL, NULL, opt_slurm_args},
    {"export_secrets", NULL, NULL, opt_export_secrets},
    {"advertise_addr", NULL, NULL, opt_advertise_addr},
    {"idle_timeout", NULL, NULL, opt_idle_timeout},
    {"warm", NULL, NULL, opt_warm},
    {"warm_modules", NULL, NULL, opt_warm_modules},
};
#define N_OPTIONS (sizeof options / sizeof options[0])

/* Parse one NAME=VALUE into O; SEEN marks the options given so far. */
static int parse_one(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                     bool seen[N_OPTIONS], char *err, size_t errlen)
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
    dk_set_err(err, errlen, "unknown option '%s'; %s", name, accepted);
    return -1;
}

/* The Slurm options' defaults, which a site sets once in the environment
 * (the kernelspec's env): each variable is parsed as its option is. */
static const struct {
    const char *env;
    opt_parser_t parse;
    const char *name;
} slurm_env[] = {
    {"DISTKERNEL_NODES", opt_nodes, "nodes"},
    {"DISTKERNEL_LAUNCHER", opt_launcher, "launcher"},
    {"DISTKERNEL_SLURM_PARTITION", opt_slurm_name, "partition"},
    {"DISTKERNEL_SLURM_ACCOUNT", opt_slurm_name, "account"},
    {"DISTKERNEL_SLURM_QOS", opt_slurm_name, "qos"},
    {"DISTKERNEL_SLURM_CONSTRAINT", opt_slurm_name, "constraint"},
    {"DISTKERNEL_SLURM_ARGS", opt_slurm_args, "slurm_args"},
    {"DISTKERNEL_SLURM_EXPORT_SECRETS", opt_export_secrets, "export_secrets"},
};

static int env_defaults(dk_dist_opts_t *o, char *err, size_t errlen)
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
        if (slurm_env[i].parse == opt_nodes)
            o->nodes_from_env = true;
    }
    return 0;
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
    return dk_dist_opts_parse_onto(args, o, err, errlen);
}

int dk_dist_opts_parse_onto(const char *args, dk_dist_opts_t *o, char *err, size_t errlen)
{
    o->warnings[0] = '\0';
    bool seen[N_OPTIONS] = {false};
    char name[64], value[1024];
    bool quoted;
    if (env_defaults(o, err, errlen) < 0)
        return -1;
    const char *p = args ? args : "";
    for (;;) {
        p = next_token(p, name, sizeof name, value, sizeof value, &quoted, err, errlen);
        if (!p)
            break;
        if (p == (const char *)-1 || parse_one(name, value, quoted, o, seen, err, errlen) < 0)
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
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (options[i].parse == opt_launcher)
            return check_nodes(o, seen[i], err, errlen);
    return 0;
}
