/*
 * dk_rankenv: the environment of one rank. See the header.
 */
#include "dk_rankenv.h"

#include "dk_spawn.h"
#include "dk_stackreq.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#define SHORT_VARS 22
#define LONG_VARS 5

char **dk_rankenv_build(const char *const *base, const dk_rankenv_t *in)
{
    if (!in || !in->run_id || !in->bc_address || !in->bc_key_hex || !in->log_path ||
        in->ranks_per_node < 1)
        return NULL;
    char vars[SHORT_VARS][128];
    const char *set[SHORT_VARS + LONG_VARS];
    size_t k = 0;
#define SETF(...) (snprintf(vars[k], sizeof vars[k], __VA_ARGS__), set[k] = vars[k], k++)
    int r = in->rank, n = in->world_size, per = in->ranks_per_node;
    SETF("RANK=%d", r);
    SETF("LOCAL_RANK=%d", r % per);
    SETF("WORLD_SIZE=%d", n);
    SETF("LOCAL_WORLD_SIZE=%d", per);
    SETF("GROUP_RANK=%d", r / per);
    SETF("NODE_RANK=%d", r / per);
    SETF("ROLE_RANK=%d", r);
    SETF("ROLE_NAME=default");
    SETF("GROUP_WORLD_SIZE=%d", n / per);
    SETF("ROLE_WORLD_SIZE=%d", n);
    SETF("MASTER_ADDR=%s", in->master_addr ? in->master_addr : "127.0.0.1");
    if (in->master_port > 0)
        SETF("MASTER_PORT=%d", in->master_port);
    else
        SETF("DISTKERNEL_MASTER_PORT=rank0");   /* a PORT frame brings it */
    SETF("TORCHELASTIC_RUN_ID=%s", in->run_id);
    SETF("TORCHELASTIC_RESTART_COUNT=0");
    SETF("TORCHELASTIC_MAX_RESTARTS=0");
    SETF("DISTKERNEL_BC_KEY=%s", in->bc_key_hex);
    if (!dk_spawn_env_get(base, "OMP_NUM_THREADS"))
        SETF("OMP_NUM_THREADS=1");
#undef SETF
    /* Paths can be long: these are allocated. */
    char *stacks = NULL, *bc = NULL, *log = NULL, *warm = NULL, *cwd = NULL;
    bool ok = true;
    if (in->stacks_path && asprintf(&stacks, DK_STACKS_ENV "=%s", in->stacks_path) < 0)
        ok = false, stacks = NULL;
    if (asprintf(&bc, "DISTKERNEL_BC=%s", in->bc_address) < 0)
        ok = false, bc = NULL;
    if (asprintf(&log, "DISTKERNEL_LOG=%s", in->log_path) < 0)
        ok = false, log = NULL;
    if (in->warm_socket && asprintf(&warm, "DISTKERNEL_WARM_SOCKET=%s", in->warm_socket) < 0)
        ok = false, warm = NULL;
    if (in->cwd && asprintf(&cwd, "DISTKERNEL_CWD=%s", in->cwd) < 0)
        ok = false, cwd = NULL;
    char **env = NULL;
    if (ok) {
        if (stacks)
            set[k++] = stacks;
        set[k++] = bc;
        set[k++] = log;
        if (warm)
            set[k++] = warm;
        if (cwd)
            set[k++] = cwd;
        env = dk_spawn_env_build(base, set, k);
    }
    free(stacks);
    free(bc);
    free(log);
    free(warm);
    free(cwd);
    return env;
}
