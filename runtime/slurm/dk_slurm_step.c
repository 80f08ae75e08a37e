/*
 * dk_slurm_step: the environment of a run's step, the one srun of its node
 * agents (dk_dist_slurm.c builds the command). See dk_slurm.h.
 *
 * The agents' step starts beside whatever the job already runs, and a step
 * that Slurm holds back until another ends is a cell that hangs until
 * timeout=. So it must never wait for another step of the job: srun's
 * --overlap (dk_dist_slurm.c), and none of srun's input variables in its
 * environment. srun reads SRUN_CPUS_PER_TASK, SLURM_MEM_PER_NODE,
 * SLURM_NTASKS_PER_NODE, SLURM_DISTRIBUTION ... as defaults for its options,
 * and a kernel started by a batch script or inside a step has them,
 * describing that script's or step's shape, not the run's: the step could
 * ask for more memory than its node has (refused), more CPUs than it may have
 * (waits), a label on every line (SLURM_LABELIO), its output sent to a file
 * (SLURM_STDOUTMODE) or its tasks killed when the first one ends
 * (SLURM_WAIT). The job's own variables (SLURM_JOB_ID, SLURM_JOB_NODELIST,
 * SLURM_CONF, ...) stay: srun needs some, and the ranks see them as in any
 * step of their job. What srun says about the step it starts (SLURM_STEP_ID,
 * SLURM_CPUS_ON_NODE, ...) it sets itself, and each rank rewrites the run's
 * shape (dk_slurm_rank.c).
 *
 * Pure but for memory: nothing here runs a command.
 */
#include "dk_slurm.h"

#include "dk_spawn.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* srun's input variables (`man srun`, INPUT ENVIRONMENT VARIABLES) that
 * change what a step asks for, where and how its tasks run, its time, its
 * I/O, or what ends it. Not here: those that name the job (SLURM_JOB_ID,
 * SLURM_JOB_NAME, SLURM_ACCOUNT ...), SLURM_CONF, the site's and user's
 * programs around a task (SLURM_TASK_PROLOG, SLURM_MPI_TYPE, SRUN_CONTAINER),
 * which are wishes about every step, not a shape. */
static const char *const SRUN_INPUTS[] = {
    /* the step's resources */
    "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES", "SLURM_NTASKS_PER_NODE",
    "SLURM_NTASKS_PER_CORE", "SLURM_NTASKS_PER_SOCKET", "SLURM_NTASKS_PER_GPU",
    "SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK", "SLURM_CPUS_PER_GPU",
    "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_MEM_PER_GPU",
    "SLURM_GPUS", "SLURM_GPUS_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_GRES",
    "SLURM_STEP_GRES", "SLURM_GRES_FLAGS", "SLURM_EXACT", "SLURM_EXCLUSIVE", "SLURM_OVERLAP",
    "SLURM_WHOLE", "SLURM_OVERCOMMIT", "SLURM_CORE_SPEC", "SLURM_THREAD_SPEC",
    "SLURM_THREADS_PER_CORE", "SLURM_HINT", "SLURM_NETWORK", "SLURM_RESV_PORTS",
    /* where and how its tasks run */
    "SLURM_DISTRIBUTION", "SLURM_DIST_PLANESIZE", "SLURM_CPU_BIND", "SLURM_MEM_BIND",
    "SLURM_GPU_BIND", "SLURM_CPU_FREQ_REQ", "SLURM_GPU_FREQ", "SLURM_USE_MIN_NODES",
    "SLURM_SPREAD_JOB", "SLURM_CLUSTERS", "SLURM_PARTITION", "SLURM_RESERVATION",
    "SLURM_CONSTRAINT", "SLURM_REMOTE_CWD", "SLURM_WORKING_DIR", "SLURM_EXPORT_ENV",
    "SRUN_EXPORT_ENV", "SLURM_BCAST", "SLURM_BCAST_EXCLUDE", "SLURM_SEND_LIBS",
    /* its time, its I/O, what ends it */
    "SLURM_TIMELIMIT", "SLURM_IMMEDIATE", "SLURM_WAIT", "SLURM_KILL_BAD_EXIT", "SLURM_NO_KILL",
    "SLURM_SIGNAL", "SLURM_LABELIO", "SLURM_STDINMODE", "SLURM_STDOUTMODE",
    "SLURM_STDERRMODE", "SLURM_OPEN_MODE", "SLURM_UNBUFFEREDIO", "SLURM_DEBUG", "SLURMD_DEBUG",
    "SLURM_DISABLE_STATUS", "SLURM_THREADS",
};

bool dk_slurm_srun_input(const char *word)
{
    const char *eq = word ? strchr(word, '=') : NULL;
    size_t len = eq ? (size_t)(eq - word) : (word ? strlen(word) : 0);
    for (size_t i = 0; len && i < sizeof SRUN_INPUTS / sizeof SRUN_INPUTS[0]; i++)
        if (strlen(SRUN_INPUTS[i]) == len && strncmp(SRUN_INPUTS[i], word, len) == 0)
            return true;
    return false;
}

bool dk_slurm_secret_name(const char *word)
{
    static const char *const inside[] = {"TOKEN", "PASSWORD", "PASSWD", "SECRET"};
    const char *eq = word ? strchr(word, '=') : NULL;
    size_t len = eq ? (size_t)(eq - word) : (word ? strlen(word) : 0);
    char name[256];
    if (len == 0 || len >= sizeof name)
        return len > 0;     /* a name that long: kept back rather than looked at */
    for (size_t i = 0; i < len; i++)
        name[i] = (char)toupper((unsigned char)word[i]);
    name[len] = '\0';
    for (size_t i = 0; i < sizeof inside / sizeof inside[0]; i++)
        for (const char *at = strstr(name, inside[i]); at; at = strstr(at + 1, inside[i]))
            if (strncmp(at, "TOKENIZER", 9) != 0)   /* TOKENIZERS_PARALLELISM is no secret */
                return true;
    return len >= 4 && strcmp(name + len - 4, "_KEY") == 0;
}

/* Whether TEXT holds "://USER:PASSWORD@" in a URL's authority (before its
 * first '/', '?' or '#'), the password not empty. */
static bool url_with_password(const char *text)
{
    for (const char *at = strstr(text, "://"); at; at = strstr(at + 1, "://")) {
        const char *auth = at + 3;
        size_t n = strcspn(auth, "/?# \t,;");
        const char *last_at = NULL;
        for (size_t i = 0; i < n; i++)
            if (auth[i] == '@')
                last_at = auth + i;
        if (!last_at)
            continue;
        const char *colon = memchr(auth, ':', (size_t) (last_at - auth));
        if (colon && colon + 1 < last_at)
            return true;
    }
    return false;
}

bool dk_slurm_secret(const char *word)
{
    if (dk_slurm_secret_name(word))
        return true;
    const char *eq = word ? strchr(word, '=') : NULL;
    return eq && url_with_password(eq + 1);
}

bool dk_slurm_name_listed(const char *word, const char *list)
{
    const char *eq = word ? strchr(word, '=') : NULL;
    size_t len = eq ? (size_t)(eq - word) : (word ? strlen(word) : 0);
    for (const char *p = list; len && p && *p;) {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, word, len) == 0)
            return true;
        p += n + (p[n] == ',');
    }
    return false;
}

char **dk_slurm_step_env(const char *const *base, const char *const *set, size_t nset,
                         const char *export_secrets)
{
    size_t n = 0;
    while (base && base[n])
        n++;
    const char **kept = calloc(n + 1, sizeof *kept);
    if (!kept)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!dk_slurm_srun_input(base[i]) &&
            (!dk_slurm_secret(base[i]) || dk_slurm_name_listed(base[i], export_secrets)))
            kept[k++] = base[i];
    char **env = dk_spawn_env_build(kept, set, nset);
    free(kept);
    return env;
}

int dk_slurm_agents_argv(dk_slurm_agents_t *a, const char *job_id, const char *node_list,
                         int nodes, bool gpu, const char *agent, const char *rank_exe)
{
    memset(a, 0, sizeof *a);
    if (!job_id || !*job_id || !node_list || !*node_list || nodes < 1 || !agent || !*agent ||
        !rank_exe || !*rank_exe)
        return -1;
    int j = snprintf(a->job, sizeof a->job, "--jobid=%s", job_id);
    if (j < 0 || (size_t)j >= sizeof a->job)
        return -1;
    snprintf(a->nodes, sizeof a->nodes, "--nodes=%d", nodes);
    snprintf(a->tasks, sizeof a->tasks, "--ntasks=%d", nodes);
    if (asprintf(&a->node_list, "--nodelist=%s", node_list) < 0) {
        a->node_list = NULL;
        return -1;
    }
    size_t n = 0;
    a->argv[n++] = "srun";
    a->argv[n++] = a->job;
    a->argv[n++] = a->nodes;
    a->argv[n++] = a->tasks;
    a->argv[n++] = "--ntasks-per-node=1";
    a->argv[n++] = "--overlap";
    if (!gpu)
        a->argv[n++] = "--gres=none";
    a->argv[n++] = a->node_list;
    a->argv[n++] = "--kill-on-bad-exit=0";
    a->argv[n++] = "--cpu-bind=none";
    a->argv[n++] = "--export=ALL";
    a->argv[n++] = "--quiet";
    /* srun's default folder is its own, the kernel's, which a node without a
     * shared filesystem lacks: slurmstepd would then say "couldn't chdir to
     * ... going to /tmp instead". / is on every node; each rank goes to the
     * kernel's folder itself where its node has it (DISTKERNEL_CWD,
     * distkernel._rankpath). */
    a->argv[n++] = "--chdir=/";
    a->argv[n++] = agent;
    a->argv[n++] = rank_exe;
    a->argv[n] = NULL;
    return 0;
}

void dk_slurm_agents_free(dk_slurm_agents_t *a)
{
    free(a->node_list);
    a->node_list = NULL;
}
