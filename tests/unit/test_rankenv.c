/*
 * dk_rankenv: the one environment of a rank, whoever starts it (the kernel's
 * launch or a node agent).
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "dk_rankenv.h"
#include "dk_spawn.h"

static const char *get(char **env, const char *name)
{
    return dk_spawn_env_get((const char *const *) env, name);
}

static size_t count(char **env, const char *name)
{
    size_t n = 0, len = strlen(name);
    for (size_t i = 0; env[i]; i++)
        n += strncmp(env[i], name, len) == 0 && env[i][len] == '=';
    return n;
}

/* Rank RANK of 1,024 on 128 nodes, started by its node's agent. */
static dk_rankenv_t under_an_agent(int rank)
{
    return (dk_rankenv_t){
        .rank = rank, .world_size = 1024, .ranks_per_node = 8, .master_addr = "node1",
        .master_port = 0, .run_id = "0123abcd", .bc_address = "/tmp/dk-agent-x/relay.sock",
        .bc_key_hex = "ab",
        .log_path = "/logs/rank-77.log", .stacks_path = "/s/77", .cwd = "/home/u",
    };
}

Test(rankenv, torchrun_variables_of_a_rank_on_node_9)
{
    const char *base[] = {"PATH=/bin", "RANK=99", "HOME=/h", NULL};
    dk_rankenv_t in = under_an_agent(77);
    char **env = dk_rankenv_build(base, &in);
    cr_assert_not_null(env);
    cr_expect_str_eq(get(env, "RANK"), "77");
    cr_expect_eq(count(env, "RANK"), 1, "the base's RANK is replaced, not repeated");
    cr_expect_str_eq(get(env, "LOCAL_RANK"), "5");
    cr_expect_str_eq(get(env, "WORLD_SIZE"), "1024");
    cr_expect_str_eq(get(env, "LOCAL_WORLD_SIZE"), "8");
    cr_expect_str_eq(get(env, "GROUP_RANK"), "9");
    cr_expect_str_eq(get(env, "NODE_RANK"), "9");
    cr_expect_str_eq(get(env, "ROLE_RANK"), "77");
    cr_expect_str_eq(get(env, "ROLE_NAME"), "default");
    cr_expect_str_eq(get(env, "GROUP_WORLD_SIZE"), "128");
    cr_expect_str_eq(get(env, "ROLE_WORLD_SIZE"), "1024");
    cr_expect_str_eq(get(env, "MASTER_ADDR"), "node1");
    cr_expect_null(get(env, "MASTER_PORT"));
    cr_expect_str_eq(get(env, "DISTKERNEL_MASTER_PORT"), "rank0");
    cr_expect_str_eq(get(env, "TORCHELASTIC_RUN_ID"), "0123abcd");
    cr_expect_str_eq(get(env, "TORCHELASTIC_RESTART_COUNT"), "0");
    cr_expect_str_eq(get(env, "TORCHELASTIC_MAX_RESTARTS"), "0");
    cr_expect_str_eq(get(env, "OMP_NUM_THREADS"), "1");
    cr_expect_str_eq(get(env, "DISTKERNEL_BC"), "/tmp/dk-agent-x/relay.sock");
    cr_expect_str_eq(get(env, "DISTKERNEL_BC_KEY"), "ab");
    /* its channel is a local one: no deadlines of its own */
    cr_expect_null(get(env, "DISTKERNEL_BC_HEARTBEAT"));
    cr_expect_null(get(env, "DISTKERNEL_BC_CONNECT_TIMEOUT"));
    cr_expect_str_eq(get(env, "DISTKERNEL_LOG"), "/logs/rank-77.log");
    cr_expect_str_eq(get(env, "DISTKERNEL_STACKS"), "/s/77");
    cr_expect_str_eq(get(env, "DISTKERNEL_CWD"), "/home/u");
    cr_expect_null(get(env, "DISTKERNEL_WARM_SOCKET"));
    cr_expect_str_eq(get(env, "PATH"), "/bin");
    cr_expect_str_eq(get(env, "HOME"), "/h");
    dk_spawn_env_free(env);
}

Test(rankenv, a_local_rank_has_a_port_no_heartbeat_and_keeps_omp_threads)
{
    const char *base[] = {"OMP_NUM_THREADS=4", NULL};
    dk_rankenv_t in = {
        .rank = 1, .world_size = 2, .ranks_per_node = 2, .master_port = 29500,
        .run_id = "r", .bc_address = "/tmp/bc/sock", .bc_key_hex = "k",
        .log_path = "/l/rank-1.log", .warm_socket = "/tmp/warm",
    };
    char **env = dk_rankenv_build(base, &in);
    cr_assert_not_null(env);
    cr_expect_str_eq(get(env, "MASTER_ADDR"), "127.0.0.1");
    cr_expect_str_eq(get(env, "MASTER_PORT"), "29500");
    cr_expect_null(get(env, "DISTKERNEL_MASTER_PORT"));
    cr_expect_null(get(env, "DISTKERNEL_BC_HEARTBEAT"));
    cr_expect_null(get(env, "DISTKERNEL_BC_CONNECT_TIMEOUT"));
    cr_expect_null(get(env, "DISTKERNEL_STACKS"));
    cr_expect_null(get(env, "DISTKERNEL_CWD"));
    cr_expect_str_eq(get(env, "DISTKERNEL_WARM_SOCKET"), "/tmp/warm");
    cr_expect_str_eq(get(env, "OMP_NUM_THREADS"), "4");
    cr_expect_eq(count(env, "OMP_NUM_THREADS"), 1);
    cr_expect_str_eq(get(env, "GROUP_WORLD_SIZE"), "1");
    dk_spawn_env_free(env);
}

Test(rankenv, every_rank_of_a_node_agrees_on_its_node)
{
    for (int r = 0; r < 1024; r++) {
        dk_rankenv_t in = under_an_agent(r);
        char **env = dk_rankenv_build(NULL, &in);
        cr_assert_not_null(env);
        cr_assert_eq(atoi(get(env, "GROUP_RANK")), r / 8);
        cr_assert_eq(atoi(get(env, "LOCAL_RANK")), r % 8);
        dk_spawn_env_free(env);
    }
}

Test(rankenv, what_every_rank_needs_must_be_given)
{
    dk_rankenv_t in = under_an_agent(0);
    in.bc_key_hex = NULL;
    cr_expect_null(dk_rankenv_build(NULL, &in));
    in = under_an_agent(0);
    in.log_path = NULL;
    cr_expect_null(dk_rankenv_build(NULL, &in));
    in = under_an_agent(0);
    in.ranks_per_node = 0;
    cr_expect_null(dk_rankenv_build(NULL, &in));
    cr_expect_null(dk_rankenv_build(NULL, NULL));
}
