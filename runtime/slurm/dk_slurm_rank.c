/*
 * dk_slurm_rank: the SLURM_* variables a rank of a run over Slurm sees. See
 * dk_slurm.h.
 *
 * Why they are rewritten. A node's ranks are started by its node agent, one
 * task of the agents' step (srun --ntasks-per-node=1, dk_dist_slurm.c), so
 * srun tells every rank of a node its agent's task: SLURM_PROCID its node,
 * SLURM_NTASKS the nodes, SLURM_LOCALID 0. Slurm-aware libraries (PyTorch
 * Lightning's SLURMEnvironment, submitit, accelerate, DeepSpeed) read those,
 * not torchrun's, and would see a world of one rank a node in which every
 * rank of a node has the same number. So the rank program rewrites them, before
 * any Python runs, to what one `srun --nodes=N --ntasks-per-node=K` step of
 * the whole run would have said, from what the runtime set (RANK, LOCAL_RANK,
 * GROUP_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) and the node lists the launcher
 * passed (DK_SLURM_RUN_NODES_ENV, DK_SLURM_JOB_NODES_ENV). The values were
 * taken from such a step on the test cluster. What one step cannot fake stays
 * srun's: SLURM_STEP_ID (the agents' step), SLURM_CPUS_ON_NODE, the
 * launcher's ports.
 *
 * Pure: it reads an environment array and returns the words to set.
 */
#include "dk_slurm.h"

#include "dk_err.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *env_get(const char *const *env, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; env && env[i]; i++)
        if (strncmp(env[i], name, len) == 0 && env[i][len] == '=')
            return env[i] + len + 1;
    return NULL;
}

static int env_int(const char *const *env, const char *name, long *out, char *err,
                   size_t errlen)
{
    const char *v = env_get(env, name);
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : -1;
    if (!v || !*v || *end || errno || x < 0 || x > 1000000) {
        dk_set_err(err, errlen, "%s is '%s', not a number the runtime sets; this rank was not "
                   "started by distkernel's launcher", name, v ? v : "(unset)");
        return -1;
    }
    *out = x;
    return 0;
}

static size_t list_count(const char *list)
{
    size_t n = 1;
    for (const char *p = list; *p; p++)
        n += *p == ',';
    return n;
}

typedef struct {
    char **v;
    size_t n;
    bool ok;
} words_t;

static void add(words_t *w, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void add(words_t *w, const char *name, const char *fmt, ...)
{
    if (!w->ok)
        return;
    char *value = NULL, *word = NULL;
    va_list ap;
    va_start(ap, fmt);
    int rc = vasprintf(&value, fmt, ap);
    va_end(ap);
    if (rc < 0 || asprintf(&word, "%s=%s", name, value) < 0) {
        w->ok = false;
        free(value);
        return;
    }
    free(value);
    w->v[w->n++] = word;
}

int dk_slurm_rank_env(const char *const *env, char ***words, size_t *count, char *err,
                      size_t errlen)
{
    *words = NULL;
    *count = 0;
    const char *run_nodes = env_get(env, DK_SLURM_RUN_NODES_ENV);
    const char *job_nodes = env_get(env, DK_SLURM_JOB_NODES_ENV);
    /* Only a rank that srun started for a run over Slurm: a local run inside
     * an allocation keeps what its job says. */
    if (!run_nodes || !run_nodes[0] || !env_get(env, "SLURM_STEP_ID"))
        return 0;
    if (!job_nodes || !job_nodes[0])
        job_nodes = run_nodes;
    long rank, local, node, world, per;
    if (env_int(env, "RANK", &rank, err, errlen) < 0 ||
        env_int(env, "LOCAL_RANK", &local, err, errlen) < 0 ||
        env_int(env, "GROUP_RANK", &node, err, errlen) < 0 ||
        env_int(env, "WORLD_SIZE", &world, err, errlen) < 0 ||
        env_int(env, "LOCAL_WORLD_SIZE", &per, err, errlen) < 0)
        return -1;
    long nodes = (long) list_count(run_nodes);
    if (per < 1 || nodes * per != world || rank >= world || local >= per || node >= nodes) {
        dk_set_err(err, errlen, "the run's shape does not add up: RANK=%ld LOCAL_RANK=%ld "
                   "GROUP_RANK=%ld WORLD_SIZE=%ld LOCAL_WORLD_SIZE=%ld over %ld node%s (%s)",
                   rank, local, node, world, per, nodes, nodes == 1 ? "" : "s", run_nodes);
        return -1;
    }
    words_t w = {.v = calloc(24, sizeof *w.v), .ok = true};
    if (!w.v) {
        dk_set_err(err, errlen, "out of memory");
        return -1;
    }
    char tasks[64];
    if (nodes > 1)
        snprintf(tasks, sizeof tasks, "%ld(x%ld)", per, nodes);
    else
        snprintf(tasks, sizeof tasks, "%ld", per);
    /* this node's ranks, by their global ids */
    char *gtids = NULL;
    size_t gtids_len = 0;
    FILE *g = open_memstream(&gtids, &gtids_len);
    for (long i = 0; g && i < per; i++)
        fprintf(g, "%s%ld", i ? "," : "", node * per + i);
    if (!g || fclose(g) != 0)
        w.ok = false;
    add(&w, "SLURM_PROCID", "%ld", rank);
    add(&w, "SLURM_LOCALID", "%ld", local);
    add(&w, "SLURM_NODEID", "%ld", node);
    add(&w, "SLURM_NTASKS", "%ld", world);
    add(&w, "SLURM_NPROCS", "%ld", world);
    add(&w, "SLURM_STEP_NUM_TASKS", "%ld", world);
    add(&w, "SLURM_NNODES", "%ld", nodes);
    add(&w, "SLURM_STEP_NUM_NODES", "%ld", nodes);
    add(&w, "SLURM_JOB_NUM_NODES", "%zu", list_count(job_nodes));
    add(&w, "SLURM_TASKS_PER_NODE", "%s", tasks);
    add(&w, "SLURM_STEP_TASKS_PER_NODE", "%s", tasks);
    add(&w, "SLURM_NTASKS_PER_NODE", "%ld", per);
    add(&w, "SLURM_STEP_NODELIST", "%s", run_nodes);
    add(&w, "SLURM_JOB_NODELIST", "%s", job_nodes);
    add(&w, "SLURM_NODELIST", "%s", job_nodes);
    add(&w, "SLURM_GTIDS", "%s", gtids ? gtids : "");
    add(&w, "SLURM_DISTRIBUTION", "%s", "block");
    free(gtids);
    if (!w.ok) {
        dk_slurm_names_free(w.v, w.n);
        dk_set_err(err, errlen, "out of memory");
        return -1;
    }
    *words = w.v;
    *count = w.n;
    return 0;
}
