/*
 * dk_settings: the table of distkernel's environment variables, and
 * `distkernel config`. See the header.
 */
#include "dk_settings.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define USER DK_SETTING_USER
#define SITE DK_SETTING_SITE
#define INTERNAL DK_SETTING_INTERNAL

/* Sorted by name. */
static const dk_setting_t settings[] = {
    {"DISTKERNEL_ADVERTISE_ADDR", SITE,
     "the route to the first node that is not this host",
     "This host's numeric address on the nodes' network, where Slurm ranks reach the kernel (advertise_addr= wins)"},
    {"DISTKERNEL_AGENT_GRACE", INTERNAL,
     "2 s",
     "The stop ladder's grace, in seconds, that the kernel gives each node agent"},
    {"DISTKERNEL_AGENT_LOG_DIR", INTERNAL,
     "-",
     "The run's log folder, given to each node agent, where its ranks' rank-N.log files go"},
    {"DISTKERNEL_AGENT_MASTER_ADDR", INTERNAL,
     "-",
     "The MASTER_ADDR a node agent gives its ranks"},
    {"DISTKERNEL_AGENT_MASTER_PORT", INTERNAL,
     "0",
     "The MASTER_PORT a node agent gives its ranks; 0 lets rank 0 pick a free port"},
    {"DISTKERNEL_AGENT_NODE", INTERNAL,
     "-",
     "This node's index in the run, from 0, given to its agent (else SLURM_NODEID)"},
    {"DISTKERNEL_AGENT_PER_NODE", INTERNAL,
     "-",
     "How many ranks each node's agent starts"},
    {"DISTKERNEL_AGENT_RUN_ID", INTERNAL,
     "-",
     "The run's id, which a node agent gives its ranks as TORCHELASTIC_RUN_ID"},
    {"DISTKERNEL_AGENT_STACKS", INTERNAL,
     "0",
     "1: the node agent answers stack-sample requests for its ranks (faulthandler)"},
    {"DISTKERNEL_AGENT_TUNNEL", INTERNAL,
     "-",
     "The kernel's tracking gate, from which a node agent opens a door on its node for its ranks' MLflow requests"},
    {"DISTKERNEL_AGENT_WARM_MODULES", INTERNAL,
     "-",
     "Set: the node agent starts a warm-start template that imports these modules, comma-separated"},
    {"DISTKERNEL_AGENT_WARM_PATH", INTERNAL,
     "-",
     "The kernel's sys.path, newline-separated, for the node agent's warm-start template"},
    {"DISTKERNEL_AGENT_WORLD", INTERNAL,
     "-",
     "The run's number of ranks, given to each node agent"},
    {"DISTKERNEL_BC", INTERNAL,
     "-",
     "The back channel's address (a Unix socket's path, or host:port for an agent) that a rank or agent connects to"},
    {"DISTKERNEL_BC_CONNECT_TIMEOUT", INTERNAL,
     "120 s",
     "How long a node agent keeps trying to connect to the kernel's back channel"},
    {"DISTKERNEL_BC_HEARTBEAT", INTERNAL,
     "5 s",
     "How long the back channel may be silent before a node agent takes it for lost"},
    {"DISTKERNEL_BC_KEY", INTERNAL,
     "-",
     "The back channel's key, given to each rank and agent and hidden from /proc once read"},
    {"DISTKERNEL_CHECK_EXE", USER,
     "the installed distkernel-check",
     "The preflight-check program check=True runs, for a build not installed yet"},
    {"DISTKERNEL_CUDART_LIB", USER,
     "libcudart.so.13, .so.12, .so on the loader's path, $CUDA_HOME, /usr/local/cuda",
     "The CUDA runtime library the NCCL preflight check loads first"},
    {"DISTKERNEL_CWD", INTERNAL,
     "-",
     "The kernel's folder, given to ranks on other nodes, which run there where their node has it"},
    {"DISTKERNEL_DEBUG", USER,
     "none",
     "Set: why ranks started cold is also written to the kernel's stderr, not just to the run's warm.log"},
    {"DISTKERNEL_GLUE_DIR", USER,
     "the package folder the build installed",
     "Where distkernel's Python package is loaded from, for a build not installed yet"},
    {"DISTKERNEL_IDLE_TIMEOUT", USER,
     "3600 s",
     "How long started ranks may go without a cell before they are ended, when idle_timeout= is not given; 0: never"},
    {"DISTKERNEL_LAUNCHER", SITE,
     "local",
     "Where ranks run by default, local (this node) or slurm; the cell's launcher= wins"},
    {"DISTKERNEL_LIBPYTHON", INTERNAL,
     "the build's libpython",
     "The libpython the kernel loaded, so that every rank, warm, started or on a Slurm node, loads the same one"},
    {"DISTKERNEL_LOG", INTERNAL,
     "-",
     "A rank's own log file (rank-N.log), in whose folder it notes why it started cold"},
    {"DISTKERNEL_LOG_CAP", USER,
     "1G",
     "The most each rank's log file keeps (past it, its first and last parts); log_cap= wins"},
    {"DISTKERNEL_LOG_DIR", USER,
     "$XDG_STATE_HOME/distkernel/logs, else ~/.local/state/distkernel/logs",
     "Where the runs' rank logs go, in a folder that must be yours alone"},
    {"DISTKERNEL_LOG_ROOT_CAP", USER,
     "10G",
     "The most the whole log folder holds: before a run, the oldest runs of any kernel go first"},
    {"DISTKERNEL_MASTER_PORT", INTERNAL,
     "-",
     "rank0: rank 0 binds a free port on its node and sends it to the other ranks, instead of a given MASTER_PORT"},
    {"DISTKERNEL_MAX_MESSAGE_MB", USER,
     "256",
     "The largest Jupyter message frame, in MiB (1 to 2047), the kernel reads; a larger one drops its sender"},
    {"DISTKERNEL_MLFLOW_START_TIMEOUT", USER,
     "60 s",
     "How long the kernel waits for the MLflow server it starts before it turns tracking off"},
    {"DISTKERNEL_MLFLOW_TIMEOUT", USER,
     "2 s",
     "How long each of the kernel's MLflow requests may take (with one retry) before it gives up"},
    {"DISTKERNEL_NCCL_LIB", USER,
     "libnccl.so.2, libnccl.so on the loader's path, $CUDA_HOME, /usr/local/cuda",
     "The NCCL library the preflight check loads first (the one torch ships will do)"},
    {"DISTKERNEL_NODES", SITE,
     "one node, or as many as the GPUs need",
     "How many nodes a run uses by default (more than 1 means Slurm); the cell's nodes= wins"},
    {"DISTKERNEL_PATH_NOTES", INTERNAL,
     "-",
     "The sys.path entries a rank on another node left out, one PATHTABWHY line each, for the rank to report"},
    {"DISTKERNEL_PYTHON", INTERNAL,
     "the build's Python",
     "The environment's python, set from the kernel's --python, that the kernel and every rank start in"},
    {"DISTKERNEL_RANK_EXE", USER,
     "the installed distkernel-rank",
     "The rank program the kernel starts, for a build not installed yet"},
    {"DISTKERNEL_SLURM_ACCOUNT", SITE,
     "Slurm's default",
     "The Slurm account runs are charged to by default; the cell's account= wins"},
    {"DISTKERNEL_SLURM_ARGS", SITE,
     "none",
     "More salloc/srun options, as shell words, for every Slurm run; the cell's slurm_args= wins"},
    {"DISTKERNEL_SLURM_CONNECT_TIMEOUT", SITE,
     "120 s",
     "How long node agents have to connect after srun starts them (at least 10) before their node is lost"},
    {"DISTKERNEL_SLURM_CONSTRAINT", SITE,
     "Slurm's default",
     "The Slurm node constraint runs ask for by default; the cell's constraint= wins"},
    {"DISTKERNEL_SLURM_EXPORT_SECRETS", SITE,
     "none",
     "Secret-named variables, comma-separated, sent to Slurm's nodes anyway; the cell's export_secrets= wins"},
    {"DISTKERNEL_SLURM_HEARTBEAT", SITE,
     "10 s",
     "How long a node agent may be silent (at least 2 s) before its node is taken for lost"},
    {"DISTKERNEL_SLURM_JOB_NODES", INTERNAL,
     "-",
     "The allocation's nodes, comma-separated, given to each Slurm rank to set its SLURM_* variables"},
    {"DISTKERNEL_SLURM_PARTITION", SITE,
     "Slurm's default",
     "The Slurm partition runs ask for by default; the cell's partition= wins"},
    {"DISTKERNEL_SLURM_QOS", SITE,
     "Slurm's default",
     "The Slurm QOS runs ask for by default; the cell's qos= wins"},
    {"DISTKERNEL_SLURM_RUN_NODES", INTERNAL,
     "-",
     "The run's nodes in node order, comma-separated, given to each Slurm rank to set its SLURM_* variables"},
    {"DISTKERNEL_STACKS", INTERNAL,
     "-",
     "The file a rank writes its stacks to when the kernel samples where a stalled run is"},
    {"DISTKERNEL_STALL_AFTER", USER,
     "60 s",
     "How long no rank may print before the status shows where the ranks are; 0: never; stall_after= wins"},
    {"DISTKERNEL_STALL_EVERY", USER,
     "5 s",
     "Seconds between stack samples while a stall lasts; for benchmarking what a sample costs, not for users"},
    {"DISTKERNEL_TEMPLATE", INTERNAL,
     "-",
     "The socket of a warm-start template; set, distkernel-rank runs as that template, not as a rank"},
    {"DISTKERNEL_TRACKING_PORT", INTERNAL,
     "-",
     "The port of the node's door to the kernel's tracking server, which a Slurm rank points MLFLOW_TRACKING_URI at"},
    {"DISTKERNEL_WARM", USER,
     "1",
     "0 turns warm start off for every run: ranks start cold, not forked from the template"},
    {"DISTKERNEL_WARM_MODULES", USER,
     "none",
     "More modules, comma-separated, the warm-start template imports (with torch and warm_modules=)"},
    {"DISTKERNEL_WARM_PATH", INTERNAL,
     "-",
     "The kernel's sys.path, newline-separated, given to a warm-start template"},
    {"DISTKERNEL_WARM_SOCKET", INTERNAL,
     "-",
     "The warm-start template's socket, given to a rank so that it is forked from the template"},
    {"DISTKERNEL_WARM_TORCH", USER,
     "1",
     "0 leaves torch out of the warm-start template's imports"},
    {"DISTKERNEL_WARM_WAIT_S", USER,
     "180 s",
     "How long a run waits for its warm-start template to import before its ranks start cold"},
};

#undef USER
#undef SITE
#undef INTERNAL

size_t dk_settings_count(void)
{
    return sizeof settings / sizeof *settings;
}

const dk_setting_t *dk_settings_at(size_t i)
{
    return i < dk_settings_count() ? &settings[i] : NULL;
}

static const char *scope_name(dk_setting_scope_t scope)
{
    return scope == DK_SETTING_USER ? "user" : scope == DK_SETTING_SITE ? "site" : "internal";
}

static void markdown(FILE *out)
{
    static const struct {
        dk_setting_scope_t scope;
        const char *title, *intro;
    } parts[] = {
        {DK_SETTING_USER, "What you may set",
         "In the kernel's environment: `export` before starting Jupyter, or a kernelspec's "
         "`--env NAME VALUE` (`distkernel install`). A cell's own options "
         "([distributed cells](distributed-cells.md#options)) come before these."},
        {DK_SETTING_SITE, "What a Slurm site sets",
         "Defaults for every user of a cluster, in the environment the kernels start in "
         "(a kernelspec written with `--env`, or the site's profile): see "
         "[for a Slurm site's admins](slurm-admin.md#site-defaults)."},
        {DK_SETTING_INTERNAL, "What distkernel sets for its own processes",
         "Set by the kernel for its ranks, node agents and warm-start templates, or by "
         "those for one another. They are listed so that you can read a rank's "
         "environment; setting them yourself is not supported."},
    };
    fprintf(out,
            "# Configuration\n\n"
            "Every `DISTKERNEL_*` environment variable distkernel reads or sets. "
            "`distkernel config` prints the ones you may set with their values in your "
            "environment (`--all`: every one).\n\n"
            "This page is generated from the table in `app/dk_settings.c` by "
            "`distkernel config --markdown`; a test checks that it is current.\n");
    for (size_t p = 0; p < sizeof parts / sizeof *parts; p++) {
        fprintf(out, "\n## %s\n\n%s\n\n| name | when unset | what it does |\n|---|---|---|\n",
                parts[p].title, parts[p].intro);
        for (size_t i = 0; i < dk_settings_count(); i++)
            if (settings[i].scope == parts[p].scope)
                fprintf(out, "| `%s` | %s | %s |\n", settings[i].name, settings[i].fallback,
                        settings[i].meaning);
    }
}

static void usage(FILE *out)
{
    fprintf(out, "usage: distkernel config [--all | --names | --markdown]\n"
                 "\n"
                 "The DISTKERNEL_* environment variables: those you may set, with their\n"
                 "values here (--all: those distkernel sets for its own processes too;\n"
                 "--names: every name; --markdown: docs/configuration.md).\n");
}

int dk_settings_main(int argc, char **argv, FILE *out)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (argc > 2 || (argc == 2 && strcmp(mode, "--all") != 0 && strcmp(mode, "--names") != 0 &&
                     strcmp(mode, "--markdown") != 0)) {
        bool help = strcmp(mode, "--help") == 0 || strcmp(mode, "-h") == 0;
        if (!help)
            fprintf(stderr, "distkernel config: unknown argument '%s'\n", argv[argc - 1]);
        usage(help ? out : stderr);
        return help ? 0 : 2;
    }
    if (strcmp(mode, "--markdown") == 0) {
        markdown(out);
        return 0;
    }
    bool all = strcmp(mode, "--all") == 0, names = strcmp(mode, "--names") == 0;
    for (size_t i = 0; i < dk_settings_count(); i++) {
        const dk_setting_t *s = &settings[i];
        if (names) {
            fprintf(out, "%s\n", s->name);
            continue;
        }
        if (s->scope == DK_SETTING_INTERNAL && !all)
            continue;
        const char *value = getenv(s->name);
        fprintf(out, "%-34s %-8s %s\n", s->name, scope_name(s->scope),
                value ? value : "(unset)");
        fprintf(out, "%-34s          %s; unset: %s\n", "", s->meaning, s->fallback);
    }
    return 0;
}
