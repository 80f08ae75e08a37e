/*
 * dk_slurm: what a run needs from a Slurm cluster, through Slurm's own commands.
 *
 * distkernel never schedules across nodes itself: where ranks outgrow a node,
 * the cluster's Slurm places them, and the kernel drives it as a user at a
 * shell would, with sinfo, salloc, squeue and scancel (srun comes with the
 * network back channel). This object is one allocation:
 *
 *   - outside an allocation (a kernel on a login node), dk_slurm_allocate asks
 *     for one with `salloc --no-shell`, reports the request's state and Slurm's
 *     reason while it is queued, and owns the job: release (or destroy) cancels
 *     it with scancel;
 *   - inside one (SLURM_JOB_ID set, e.g. a kernel started by a batch job) it
 *     adopts that allocation, whose steps the ranks will be, and never cancels it.
 *
 * Every command runs through dk_proc (its own process group, nothing left
 * running) under a deadline; a command that hangs is ended with the stop
 * ladder. A job is never left behind: every request carries a job name of its
 * own, so an error before salloc said the job's id still cancels it by name,
 * and a process that dies holding an owned job (even by SIGKILL) has it
 * cancelled by name by a process that outlives it (dk_spawn_last_word).
 *
 * Slurm's commands are found on PATH and run with the process's environment,
 * where a site sets SLURM_CONF (and the user's defaults, SLURM_PARTITION ...).
 * Not thread-safe: one thread drives an allocation.
 */
#ifndef DK_SLURM_H
#define DK_SLURM_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dk_slurm_t dk_slurm_t;

/* Each Slurm command's deadline when the caller gives none. */
#define DK_SLURM_COMMAND_TIMEOUT_S 30.0

typedef struct {
    int nodes;                  /* >= 1 */
    int tasks_per_node;         /* >= 1: the ranks each node runs */
    int gpus_per_node;          /* > 0: --gpus-per-node (GPU ranks); 0: no GPU asked for */
    const char *gpu_type;       /* with gpus_per_node: NULL or "" any GPU, else that GRES
                                   type (--gpus-per-node=TYPE:N) */
    const char *partition;      /* NULL or "": Slurm's default (the same for the four) */
    const char *account;
    const char *qos;
    const char *constraint;
    const char *extra_args;     /* more salloc options, split like a shell's words */
    double time_limit_s;        /* the allocation's time limit; <= 0: Slurm's default */
    /* With time_limit_s <= 0: ask for the partition's MaxTime (from sinfo), the
     * longest Slurm allows, rather than its DefaultTime, which a site may keep
     * short for jobs that name no limit. For an allocation that lives as long
     * as its user keeps it (started ranks), released by its owner. */
    bool longest_time;
    /* With time_limit_s > 0: the limit is a wish, not the user's (no
     * timeout= was given). Where the partition's MaxTime (from sinfo) is
     * shorter, ask for that instead: a request over it would wait in the
     * queue for ever where the site does not enforce partition limits. */
    bool clamp_time;
    double wait_s;              /* the longest wait in the queue; <= 0: no limit */
    double command_timeout_s;   /* each command's deadline; <= 0: DK_SLURM_COMMAND_TIMEOUT_S */
    /* Called at each poll (about every second) while the request waits, with
     * its state and Slurm's reason (state "PENDING", reason "Resources",
     * "Priority", "PartitionDown" ...), changed or not; may be NULL. */
    void (*on_wait)(void *data, const char *job_id, const char *state, const char *reason);
    /* Asked about every 100 ms while the request waits: true cancels it. May be NULL. */
    bool (*cancelled)(void *data);
    void *data;
} dk_slurm_request_t;

/* How a question to Slurm (sinfo, before a run) may end early: its deadline,
 * and the caller's cancel, asked about every 100 ms while the command runs;
 * the first true ends the command (the stop ladder on its process group) and
 * the question fails with ERR saying it was cancelled. A user's interrupt
 * must not wait for a slow slurmctld. Where a function takes one, NULL means
 * the default deadline and no cancel. */
typedef struct {
    double timeout_s;           /* <= 0: DK_SLURM_COMMAND_TIMEOUT_S */
    bool (*cancelled)(void *data);   /* may be NULL */
    void *data;
} dk_slurm_query_t;

/* Whether Slurm can be used from here: sinfo, salloc, srun, squeue and scancel
 * on PATH, and `sinfo` answering within QUERY's deadline. Returns 0, or -1
 * with ERR saying what is missing or what sinfo said, and what to set (PATH,
 * SLURM_CONF), or that QUERY's cancel ended it. */
int dk_slurm_reachable(const dk_slurm_query_t *query, char *err, size_t errlen);

/* The GPUs of each node where a run would go, from `sinfo -h -o '%P|%G'`
 * asked as QUERY says (with NODELIST not NULL: `-n NODELIST`, the nodes of an
 * allocation the kernel runs in; else PARTITION's nodes, NULL or "" the
 * default partition):
 * *GPUS the most GPUs one of those nodes has (0: none), GRES what sinfo said
 * for them ("gpu:h100:8(S:0-1)", "(null)"), for messages. With MODEL (a GPU
 * model the user asked for, "H100"; NULL or "": any) and nodes whose GRES has
 * that type, those count instead: *GPUS the most of that type, GRES that
 * node's, TYPE Slurm's name for it ("h100"; "" when no node has the type,
 * and then *GPUS and GRES are as without MODEL). Returns 0, or -1 with ERR
 * (sinfo failed or was cancelled, or no such partition). */
int dk_slurm_gpus_per_node(const char *partition, const char *nodelist,
                           const dk_slurm_query_t *query, const char *model, int *gpus,
                           char *gres, size_t greslen, char *type, size_t typelen, char *err,
                           size_t errlen);

/* An allocation for REQ: the one this process runs in when SLURM_JOB_ID is set
 * (REQ->nodes must fit it), else a new one from salloc, waited for (REQ's
 * callbacks say how the wait goes). Returns the allocation, its node list
 * known, or NULL with ERR (Slurm's own words included); on NULL no job of this
 * request is left in Slurm's queue. A job that is CONFIGURING once granted
 * (nodes booting, a prolog) is waited for until RUNNING, within the same
 * wait. When the wait was cancelled, passed REQ->wait_s, or cannot end
 * because a limit of Slurm's refuses the request's time limit (a reason
 * dk_slurm_time_limit_reason knows), *CANCELLED (may be NULL) says which: 1
 * cancelled, 2 wait_s, 3 the time limit. */
dk_slurm_t *dk_slurm_allocate(const dk_slurm_request_t *req, int *cancelled, char *err,
                              size_t errlen);

/* The job's id ("1234"). */
const char *dk_slurm_job_id(const dk_slurm_t *self);

/* The time limit asked for, as given to salloc's --time ("infinite",
 * "1-00:00:00", "65:00"), or "" when Slurm's default applies (no
 * longest_time nor time_limit_s, or an adopted allocation). */
const char *dk_slurm_time_limit(const dk_slurm_t *self);

/* True when this object asked for the job (and so ends it); false for an
 * allocation it runs inside. */
bool dk_slurm_owned(const dk_slurm_t *self);

/* The nodes of the allocation, in Slurm's order, and each one's address
 * (NodeAddr, which is the name itself where the site set none). I < count. */
size_t dk_slurm_node_count(const dk_slurm_t *self);
const char *dk_slurm_node_name(const dk_slurm_t *self, size_t i);
const char *dk_slurm_node_addr(const dk_slurm_t *self, size_t i);

/* The time the job has left before Slurm ends it (its time limit; squeue's
 * %L), in seconds into *LEFT_S; -1 when it has none ("UNLIMITED") or Slurm
 * does not say. Returns 0, or -1 with ERR (squeue failed). */
int dk_slurm_time_left(dk_slurm_t *self, long *left_s, char *err, size_t errlen);

/* The job's state and Slurm's reason now, from squeue (STATE "" once Slurm
 * has forgotten the job). Returns 0, or -1 with ERR. */
int dk_slurm_state(dk_slurm_t *self, char *state, size_t statelen, char *reason,
                   size_t reasonlen, char *err, size_t errlen);

/* End an owned job (scancel); nothing for an adopted one. Idempotent. Returns
 * 0, or -1 with ERR when scancel failed (destroy tries again). */
int dk_slurm_release(dk_slurm_t *self, char *err, size_t errlen);

/* Release (if not done) and free; *SELF_P becomes NULL. */
void dk_slurm_destroy(dk_slurm_t **self_p);

/* ---- Slurm's text formats, pure (no command runs) ------------------------- */

/* Expand a Slurm host list ("node[1-3,5]", "gpu[01-02]-a,login",
 * "r[1-2]n[1-2]") into names, in order. Returns 0 with *NAMES (free with
 * dk_slurm_names_free) and *COUNT, or -1 with ERR for a malformed list or
 * one of more than 65536 names. */
int dk_slurm_hostlist_expand(const char *list, char ***names, size_t *count, char *err,
                             size_t errlen);
void dk_slurm_names_free(char **names, size_t count);

/* Split TEXT into words as a shell would: blanks separate, '...' and "..."
 * quote, a backslash escapes the next character. Returns 0 with *WORDS (free
 * with dk_slurm_names_free) and *COUNT, or -1 with ERR (an unterminated quote). */
int dk_slurm_split_words(const char *text, char ***words, size_t *count, char *err,
                         size_t errlen);

/* Whether TEXT, more salloc options as shell words (slurm_args), leaves alone
 * what distkernel relies on: the job's name (-J, --job-name: the request is
 * found and cancelled by it, even after the kernel is SIGKILLed) and its shape
 * (-N, --nodes, -n, --ntasks, --ntasks-per-node: the ranks are placed by it).
 * Long options are refused also as the prefixes salloc accepts for them
 * ("--job-n"), short ones also run together ("-vN2"). Returns 0, or -1 with
 * ERR naming the option, why it is refused and what to give instead (an
 * unterminated quote is also -1). */
int dk_slurm_check_args(const char *text, char *err, size_t errlen);

/* One line of `squeue -h -o '%i|%T|%r|%N'` into its fields (each NUL-terminated
 * and truncated to its buffer). Returns 0, or -1 when LINE is not such a line. */
typedef struct {
    char job_id[32];
    char state[32];
    char reason[128];
    char nodes[1024];
} dk_slurm_squeue_t;
int dk_slurm_parse_squeue(const char *line, dk_slurm_squeue_t *out);

/* The time limit of PARTITION (NULL or "": the default one, marked '*') in
 * the output of `sinfo -h -o '%P %l'` (lines "PART[*] LIMIT"), copied into
 * OUT: "infinite", "1-00:00:00", "30:00" as sinfo writes it. Where PARTITION
 * is a list ("a,b"), its first. False when TEXT names no such partition, or
 * its limit is "n/a". */
bool dk_slurm_partition_limit(const char *text, const char *partition, char *out,
                              size_t outlen);

/* The number of GPUs in one node's GRES as sinfo's %G writes it:
 * "gpu:8", "gpu:h100:8(S:0-1)", "gpu:a100:4,gpu:v100:2" (6), "mps:100,gpu:2"
 * (2), "(null)" (0). Types of GRES other than gpu are not GPUs. */
int dk_slurm_gres_gpus(const char *gres);

/* The GPUs in one node's GRES whose type is MODEL's ("H100": types "h100",
 * "nvidia_h100_80gb_hbm3", "H100-SXM"; a word of the type, split at '_' and
 * '-', is MODEL, case aside; "a100" is not "A10"), TYPE the first such type
 * as Slurm names it ("" when none). 0 for an empty MODEL or untyped GRES. */
int dk_slurm_gres_gpus_of(const char *gres, const char *model, char *type, size_t typelen);

/* The GPU types one node's GRES names, "a100, v100" ("" when untyped). */
void dk_slurm_gres_gpu_types(const char *gres, char *out, size_t outlen);

/* As dk_slurm_partition_gpus, counting only GPUs of MODEL's type
 * (dk_slurm_gres_gpus_of): the most a node has, GRES that node's line, TYPE
 * its type's name. 0 when no node has that type (GRES and TYPE then ""). */
int dk_slurm_partition_gpus_of(const char *text, const char *partition, bool any_partition,
                               const char *model, char *gres, size_t greslen, char *type,
                               size_t typelen);

/* The most GPUs a node of PARTITION has (NULL or "": the default, marked
 * '*'; a list "a,b": its first) in the output of `sinfo -h -o '%P|%G'` (lines
 * "PART[*]|GRES", one per distinct GRES), GRES sinfo's words for them (the
 * line of that most, "(null)" when none); ANY_PARTITION: every line counts
 * (sinfo was asked about given nodes). -1 when TEXT names no such partition. */
int dk_slurm_partition_gpus(const char *text, const char *partition, bool any_partition,
                            char *gres, size_t greslen);

/* The most CPUs a node of PARTITION (as dk_slurm_partition_gpus) has in the
 * output of `sinfo -h -o '%P|%c'`; -1 when TEXT names no such partition or
 * says no number. */
int dk_slurm_partition_cpus(const char *text, const char *partition);

/* The most CPUs a node of PARTITION (NULL or "": the default) has, from
 * sinfo (as QUERY says), into *CPUS. Returns 0, or -1 with ERR (sinfo failed
 * or was cancelled, or knows no such partition). */
int dk_slurm_cpus_per_node(const char *partition, const dk_slurm_query_t *query, int *cpus,
                           char *err, size_t errlen);

/* Whether Slurm's REASON for a pending job says its time limit is over a
 * limit that will not change while it waits: the partition's MaxTime
 * ("PartitionTimeLimit"), a QOS's or association's MaxWall
 * ("QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit"). */
bool dk_slurm_time_limit_reason(const char *reason);

/* A Slurm time as sinfo and squeue write it ("30:00", "1:00:00",
 * "2-00:00:00", "5", "2-12") in seconds; -1 for "infinite", "UNLIMITED" or
 * what is not such a time. */
long dk_slurm_time_s(const char *text);

/* The job id in salloc's words on stderr ("salloc: Pending job allocation 12",
 * "salloc: Granted job allocation 12", "salloc: job 12 queued and waiting for
 * resources"), copied into ID; false when TEXT holds none. */
bool dk_slurm_salloc_job_id(const char *text, char *id, size_t idlen);

/* ---- a rank's SLURM_* variables (dk_slurm_rank.c), pure ------------------ */

/* Set by the Slurm launcher for each rank: the run's nodes, in node order
 * (GROUP_RANK indexes them), and the allocation's, both comma-separated. */
#define DK_SLURM_RUN_NODES_ENV "DISTKERNEL_SLURM_RUN_NODES"
#define DK_SLURM_JOB_NODES_ENV "DISTKERNEL_SLURM_JOB_NODES"

/* The SLURM_* variables a rank of a run over Slurm must see so that Slurm-aware
 * code finds the run's world, not its node agent's step (one task per node): "NAME=VALUE" words
 * (free with dk_slurm_names_free) for SLURM_PROCID (RANK), SLURM_LOCALID
 * (LOCAL_RANK), SLURM_NODEID (GROUP_RANK), SLURM_NTASKS, SLURM_NPROCS and
 * SLURM_STEP_NUM_TASKS (WORLD_SIZE), SLURM_NNODES and SLURM_STEP_NUM_NODES
 * (the run's nodes), SLURM_JOB_NUM_NODES (the allocation's),
 * SLURM_TASKS_PER_NODE and SLURM_STEP_TASKS_PER_NODE ("4(x2)"),
 * SLURM_NTASKS_PER_NODE, SLURM_STEP_NODELIST (the run's nodes),
 * SLURM_JOB_NODELIST and SLURM_NODELIST (the allocation's), SLURM_GTIDS (the
 * node's ranks) and SLURM_DISTRIBUTION=block; all from ENV (an environment
 * array). Returns 0 with *COUNT 0 where ENV is not such a rank's (no
 * DK_SLURM_RUN_NODES_ENV, or no SLURM_STEP_ID: not started by srun), or -1
 * with ERR when the runtime's variables are missing or do not add up. */
int dk_slurm_rank_env(const char *const *env, char ***words, size_t *count, char *err,
                      size_t errlen);

/* ---- the agents' step (dk_slurm_step.c), pure --------------------------- */

/* The srun of a run's node agents: ARGV (NULL-terminated) points into the
 * struct and at the caller's AGENT and RANK_EXE, which must outlive it. */
#define DK_SLURM_AGENTS_WORDS 20
typedef struct {
    char job[80];               /* --jobid=ID */
    char nodes[32];             /* --nodes=N */
    char tasks[32];             /* --ntasks=N */
    char *node_list;            /* --nodelist=NODES, on the heap */
    const char *argv[DK_SLURM_AGENTS_WORDS];
} dk_slurm_agents_t;

/* Fills A with the one step that runs AGENT (distkernel-agent) once on each
 * of the NODES nodes of NODE_LIST (as Slurm writes them, "node[1-16]"), a
 * step of job JOB_ID, each agent given RANK_EXE: `srun --jobid=ID --nodes=N
 * --ntasks=N --ntasks-per-node=1 --overlap [--gres=none]
 * --nodelist=NODE_LIST --kill-on-bad-exit=0 --cpu-bind=none --export=ALL
 * --quiet --chdir=/ AGENT RANK_EXE`. --overlap: it never waits for another
 * step of the job (a kernel inside a step that holds the CPUs, a site where
 * memory is consumable); --gres=none unless GPU (GPU ranks share their
 * node's GPUs of the job, each binding its LOCAL_RANK's); --kill-on-bad-exit=0:
 * one agent's exit is its node's, judged by the kernel, not the end of the
 * others; --cpu-bind=none: an agent bound to one task's CPUs would hold its
 * node's ranks there; --chdir=/: a folder every node has (each rank goes to
 * the kernel's folder itself where its node has it). Returns 0, or -1 for
 * an empty or too long id, an empty list or program, NODES < 1, or no
 * memory. Free with dk_slurm_agents_free. */
int dk_slurm_agents_argv(dk_slurm_agents_t *a, const char *job_id, const char *node_list,
                         int nodes, bool gpu, const char *agent, const char *rank_exe);
void dk_slurm_agents_free(dk_slurm_agents_t *a);

/* Whether WORD ("NAME=value", or a bare NAME) is one of srun's input variables
 * that shape a step (SRUN_CPUS_PER_TASK, SLURM_CPUS_PER_TASK,
 * SLURM_MEM_PER_NODE, SLURM_NTASKS_PER_NODE, SLURM_DISTRIBUTION, SLURM_LABELIO,
 * ...). The job's own (SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_CONF) are not. */
bool dk_slurm_srun_input(const char *word);

/* Whether WORD ("NAME=value", or a bare NAME) names a secret: its name,
 * upper-cased, holds TOKEN (not as TOKENIZER), PASSWORD, PASSWD or SECRET,
 * or ends in _KEY (JUPYTERHUB_API_TOKEN, MLFLOW_TRACKING_PASSWORD, AWS_SECRET_ACCESS_KEY,
 * WANDB_API_KEY, ...). srun --export=ALL would send it to every node, in every
 * rank's /proc/PID/environ there. */
bool dk_slurm_secret_name(const char *word);

/* Whether WORD is a secret: its name is (dk_slurm_secret_name), or its value
 * holds a URL with a password in it ("scheme://user:password@host...",
 * MLFLOW_TRACKING_URI=https://ann:pw@mlflow.example, DATABASE_URL=...): the
 * password would reach every node as a token would. */
bool dk_slurm_secret(const char *word);

/* Whether WORD's name is one of LIST (names separated by commas; NULL or ""
 * lists none). */
bool dk_slurm_name_listed(const char *word, const char *list);

/* A step's environment: BASE less srun's input variables
 * (dk_slurm_srun_input) and less the secrets (dk_slurm_secret) unless
 * EXPORT_SECRETS lists them, then SET (NSET
 * "NAME=value" words, never filtered: the run's own) over it, as
 * dk_spawn_env_build. Free with dk_spawn_env_free; NULL when out of memory. */
char **dk_slurm_step_env(const char *const *base, const char *const *set, size_t nset,
                         const char *export_secrets);

#endif
