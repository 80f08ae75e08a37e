/*
 * dk_rankenv: the environment of one rank, in one place.
 *
 * Every way a rank is started builds its environment here: the kernel's own
 * launch of a job's ranks on this node (dk_job_launch.c) and a node agent
 * starting its node's ranks (runtime/agent/, distkernel-agent).
 * So a rank sees the same variables whoever forked it:
 *   - torchrun's: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
 *     NODE_RANK, ROLE_RANK, ROLE_NAME=default, GROUP_WORLD_SIZE,
 *     ROLE_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or DISTKERNEL_MASTER_PORT=
 *     rank0 when rank 0 picks it), TORCHELASTIC_RUN_ID,
 *     TORCHELASTIC_RESTART_COUNT=0, TORCHELASTIC_MAX_RESTARTS=0, and
 *     OMP_NUM_THREADS=1 unless the base sets it;
 *   - the back channel's: DISTKERNEL_BC, DISTKERNEL_BC_KEY (a rank's channel
 *     is a Unix socket, the kernel's or its agent's relay: no heartbeats and
 *     no connect deadline of its own);
 *   - the rank's own: DISTKERNEL_LOG, DISTKERNEL_STACKS (dk_stackreq.h),
 *     DISTKERNEL_WARM_SOCKET, DISTKERNEL_CWD, each when given.
 * A rank of a run over Slurm rewrites its SLURM_* variables itself, before
 * any Python runs, from these and the run's node lists
 * (runtime/slurm/dk_slurm_rank.c, called by distkernel-rank): that is pure
 * of the environment built here, so it holds for either launcher.
 *
 * Pure but for memory: nothing is started.
 */
#ifndef DK_RANKENV_H
#define DK_RANKENV_H

#include <stddef.h>

typedef struct {
    int rank;
    int world_size;
    int ranks_per_node;         /* >= 1, divides world_size */
    const char *master_addr;    /* NULL: 127.0.0.1 */
    int master_port;            /* > 0; <= 0: rank 0 finds one (DISTKERNEL_MASTER_PORT=rank0) */
    const char *run_id;         /* TORCHELASTIC_RUN_ID */
    const char *bc_address;     /* DISTKERNEL_BC */
    const char *bc_key_hex;     /* DISTKERNEL_BC_KEY */
    const char *log_path;       /* DISTKERNEL_LOG */
    const char *stacks_path;    /* DISTKERNEL_STACKS, or NULL */
    const char *warm_socket;    /* DISTKERNEL_WARM_SOCKET, or NULL */
    const char *cwd;            /* DISTKERNEL_CWD, or NULL */
} dk_rankenv_t;

/* BASE (NULL: none) with IN's variables set over it: a NULL-terminated array
 * of new strings (dk_spawn_env_free), or NULL when out of memory or IN lacks
 * what every rank needs (run_id, bc_address, bc_key_hex, log_path, a
 * ranks_per_node of at least 1). */
char **dk_rankenv_build(const char *const *base, const dk_rankenv_t *in);

#endif
