/*
 * dk_dist_opts: the options of %%distributed and of the @distributed decorator.
 *
 * Both spell options the same way, `name=value` separated by blanks:
 *
 *     %%distributed num_accelerators=8 accelerator_type=GPU_8xH100 timeout=3600
 *     %%distributed num_processes=2 output=rank0 result=losses
 *
 * (the decorator's keyword arguments are turned into this text). Values are
 * integers, numbers, None, True/False, bare words or quoted strings. The names of
 * the managed platform's older API, `gpus` and `gpu_type`, are accepted with a
 * deprecation warning, as that platform does. Everything is validated here,
 * before anything starts; an error names the option, the value, and what is
 * accepted.
 */
#ifndef DK_DIST_OPTS_H
#define DK_DIST_OPTS_H

#include <stdbool.h>
#include <stddef.h>

#define DK_DEFAULT_TIMEOUT_S 10800.0
#define DK_DEFAULT_IDLE_TIMEOUT_S 3600.0
/* restarts= at most: a run that fails this often has a cause a restart will not fix. */
#define DK_RESTARTS_MAX 100
/* stall_after='s default, and the variable that changes it (the option wins). */
#define DK_DEFAULT_STALL_AFTER_S 60.0
#define DK_STALL_AFTER_ENV "DISTKERNEL_STALL_AFTER"

/* Whose output the cell shows (output=); every rank's is in its log whatever
 * this says. LOCAL0: local rank 0 of each node. LIST: the ranks of
 * output_ranks (dk_rank_list). */
typedef enum {
    DK_OUTPUT_ALL = 0,
    DK_OUTPUT_RANK0,
    DK_OUTPUT_LOCAL0,
    DK_OUTPUT_LIST
} dk_output_mode_t;

/* Where the ranks run: this node, or nodes Slurm allocates. */
typedef enum { DK_LAUNCHER_LOCAL = 0, DK_LAUNCHER_SLURM } dk_launcher_t;

typedef struct {
    int num_accelerators;       /* 0: not given (every GPU of the node) */
    char accelerator_model[32]; /* "H100", "" if not given */
    char accelerator_given[64]; /* the option as written, "accelerator_type=GPU_8xH100" or
                                   "gpu_type=H100", for messages; "" if not given */
    int accelerator_count;      /* n of GPU_<n>x<MODEL>, 0 if not given */
    int num_processes;          /* CPU ranks; 0: not given */
    double timeout_s;           /* 0: no timeout (timeout=None) */
    bool timeout_given;         /* timeout= was given (else the default) */
    int restarts;               /* a failed run starts every rank again, up to this
                                   many times (torchrun's --max-restarts); 0: never */
    double stall_after_s;       /* ranks silent this long: show where they are
                                   (distributed/dk_dist_stall.h); 0: never */
    dk_output_mode_t output;
    char output_ranks[1024];    /* output=LIST: the list as written ("0,8,16-31"), its syntax
                                   checked; "" for the other modes */
    char result_name[128];      /* "" : results not stored under a name */
    bool check;                 /* run the NCCL preflight check first */
    bool tracking;              /* record the run in MLflow (default true) */
    char experiment[256];       /* MLflow experiment name, "" : the default */
    char run_name[256];         /* MLflow run name, "" : a generated one */
    unsigned long long log_cap; /* bytes each rank's log keeps; 0: not given */
    /* ---- on a Slurm cluster. Each option's default comes from its
     * environment variable (a site sets them once, in the kernelspec's env):
     * nodes DISTKERNEL_NODES, launcher DISTKERNEL_LAUNCHER, partition
     * DISTKERNEL_SLURM_PARTITION, account DISTKERNEL_SLURM_ACCOUNT, qos
     * DISTKERNEL_SLURM_QOS, constraint DISTKERNEL_SLURM_CONSTRAINT, slurm_args
     * DISTKERNEL_SLURM_ARGS, export_secrets DISTKERNEL_SLURM_EXPORT_SECRETS. An
     * option given in the cell wins. */
    int nodes;                  /* 0: not given (one node, or as many as GPUs need) */
    bool nodes_from_env;        /* nodes is DISTKERNEL_NODES's, not given in the cell */
    dk_launcher_t launcher;     /* slurm when asked, or when nodes > 1 */
    int ranks_per_node;         /* the world size / nodes, when both are known; else 0 */
    char partition[128];        /* "": Slurm's default, likewise the three below */
    char account[128];
    char qos[128];
    char constraint[256];
    char slurm_args[1024];      /* more salloc/srun options, as shell words */
    char export_secrets[512];   /* secret-named variables Slurm ranks get anyway
                                   (export_secrets=, $DISTKERNEL_SLURM_EXPORT_SECRETS):
                                   names separated by commas, "" if none */
    char advertise_addr[64];    /* this host's address the nodes reach it by, numeric;
                                   "": $DISTKERNEL_ADVERTISE_ADDR, else the route */
    double idle_timeout_s;      /* started ranks: end after this long idle; 0: never */
    bool idle_given;            /* idle_timeout= was given */
    bool warm;                  /* fork fresh runs' ranks from a warm-start template
                                   (default true; also off with DISTKERNEL_WARM=0) */
    char warm_modules[512];     /* more modules the template imports, comma-separated
                                   (and those of DISTKERNEL_WARM_MODULES), "" if none */
    char warnings[512];         /* deprecation warnings, "" if none */
} dk_dist_opts_t;

/* Parse ARGS into OUT (which it initialises with the defaults, those of the
 * Slurm options from the environment). Returns 0, or -1 with a message for the
 * user in ERR (naming the environment variable when its value is wrong). */
int dk_dist_opts_parse(const char *args, dk_dist_opts_t *out, char *err, size_t errlen);

/* Parse ARGS onto OUT as it is (options ARGS leaves out keep their values in
 * OUT): cells on started ranks take the options the ranks were started with
 * as their defaults. Returns 0, or -1 with ERR (OUT may then be changed). */
int dk_dist_opts_parse_onto(const char *args, dk_dist_opts_t *out, char *err, size_t errlen);

/* The smallest log_cap accepted (the runtime's DK_LOG_CAP_MIN). */
#define DK_LOG_CAP_MIN_BYTES 4096ULL

/* "1G", "64M", "512k", "4096" (bytes; K/M/G/T are powers of 1024, an optional
 * trailing "B" or "iB" is allowed) into *OUT. Returns false, leaving *OUT
 * alone, unless TEXT is such a size. Used for log_cap= and for the
 * DISTKERNEL_LOG_CAP and DISTKERNEL_LOG_ROOT_CAP variables. */
bool dk_dist_opts_parse_size(const char *text, unsigned long long *out);

/* The GPU models of the managed platform's fleet (GPUType: A10, H100, B300),
 * as a ", "-separated list for messages, and whether MODEL (upper case, as in
 * accelerator_model) is one of them. A notebook written for that platform
 * names one of these; dk_dist_plan runs it on whatever this node has. */
extern const char dk_dist_platform_gpu_types[];
extern const char dk_dist_platform_accelerator_types[];
bool dk_dist_platform_model(const char *model);

/* OPTS's nodes as a message about a world that does not fit them names
 * them: "nodes=4", or, when they are DISTKERNEL_NODES's default,
 * "nodes=4 (the default from DISTKERNEL_NODES=4)". Returns OUT. */
const char *dk_dist_opts_nodes_given(const dk_dist_opts_t *opts, char *out, size_t len);

/* What to do, besides the numbers, when a world does not fit nodes that came
 * from DISTKERNEL_NODES: the cell's nodes= wins over the variable. */
#define DK_DIST_NODES_ENV_FIX                                                          \
    "give nodes= in the cell (it wins over DISTKERNEL_NODES), or change DISTKERNEL_NODES " \
    "where the kernel's environment sets it (the kernelspec's env)"

/* The help text of %%distributed (what `%%distributed?` shows). */
extern const char dk_dist_doc[];

#endif
