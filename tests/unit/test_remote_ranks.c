/*
 * Ranks on other nodes, for real: fake_rank started with srun on two nodes of
 * the simulated Slurm cluster (tests/slurm/, brought up around this program by
 * with_cluster.sh), reaching the runtime over TCP on the address the route to
 * the nodes leaves from (dk_netaddr). Skips, saying why, where no cluster can
 * run (with_cluster.sh fails instead on CI).
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dk_job.h"
#include "dk_netaddr.h"

#ifndef FAKE_RANK
#error "FAKE_RANK (the path of fake_rank) must be defined"
#endif

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char out[2][3][8192];
static char msg[2][256];

static void on_output(void *data, int rank, int fd, const char *bytes, size_t len)
{
    (void) data;
    pthread_mutex_lock(&lock);
    size_t have = strlen(out[rank][fd]);
    if (len > sizeof out[rank][fd] - 1 - have)
        len = sizeof out[rank][fd] - 1 - have;
    memcpy(out[rank][fd] + have, bytes, len);
    out[rank][fd][have + len] = '\0';
    pthread_mutex_unlock(&lock);
}

static void on_message(void *data, int rank, bool is_error, const void *bytes, size_t len)
{
    (void) data;
    (void) is_error;
    snprintf(msg[rank], sizeof msg[rank], "%.*s", (int) len, (const char *) bytes);
}

/* The first line a shell command prints, in a static buffer ("" if none). */
static const char *shell_line(const char *cmd)
{
    static char line[512];
    line[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (p) {
        if (!fgets(line, sizeof line, p))
            line[0] = '\0';
        pclose(p);
    }
    line[strcspn(line, "\n")] = '\0';
    return line;
}

Test(remote_ranks, ranks_started_with_srun_on_two_nodes_send_output_and_results_over_tcp,
     .timeout = 180)
{
    const char *conf = getenv("DISTKERNEL_TEST_SLURM_CONF");
    if (!conf || !conf[0]) {
        const char *why = getenv("DISTKERNEL_TEST_SLURM_SKIP");
        cr_skip_test("no test cluster: %s", why ? why : "run through tests/slurm/with_cluster.sh");
    }
    setenv("SLURM_CONF", conf, 1);
    unsetenv("SLURM_JOB_ID");
    char cmd[512];
    snprintf(cmd, sizeof cmd, "salloc -N2 --no-shell -J dk-remote-ranks 2>&1 | "
             "sed -n 's/.*Granted job allocation \\([0-9]*\\).*/\\1/p'");
    char job_id[32];
    snprintf(job_id, sizeof job_id, "%s", shell_line(cmd));
    cr_assert(job_id[0], "salloc gave no allocation");

    char node_addr[64], addr[64], err[512] = "";
    snprintf(cmd, sizeof cmd, "sed -n 's/^NodeName=node1 NodeAddr=\\([0-9.]*\\) .*/\\1/p' %s", conf);
    snprintf(node_addr, sizeof node_addr, "%s", shell_line(cmd));
    int rc = dk_netaddr_route_to(node_addr, addr, sizeof addr, err, sizeof err);

    char jobopt[64], slurm_conf[512];
    snprintf(jobopt, sizeof jobopt, "--jobid=%s", job_id);
    snprintf(slurm_conf, sizeof slurm_conf, "SLURM_CONF=%s", conf);
    const char *cmd0[] = {"srun", jobopt, "-N1", "-n1", "-w", "node1", "--export=ALL", FAKE_RANK, NULL};
    const char *cmd1[] = {"srun", jobopt, "-N1", "-n1", "-w", "node2", "--export=ALL", FAKE_RANK, NULL};
    const char *const *cmds[] = {cmd0, cmd1};
    const char *hosts[] = {"node1", "node2"};
    const char *env[] = {"PATH=/usr/bin:/bin", slurm_conf, "FAKE_MODE=spawn_writer", NULL};
    char log_dir[] = "/tmp/dk-test-remote-XXXXXX";
    cr_assert_not_null(mkdtemp(log_dir));
    dk_job_spec_t spec = {
        .world_size = 2,
        .rank_exe = FAKE_RANK,
        .env = env,
        .log_dir = log_dir,
        .bc_tcp_addr = addr,
        .rank_hosts = hosts,
        .rank_commands = cmds,
    };
    dk_sink_t sink = {.on_output = on_output, .on_message = on_message};
    dk_job_t *job = rc == 0 ? dk_job_start(&spec, &sink, err, sizeof err) : NULL;
    bool ended = job && dk_job_wait(job, 120000);
    dk_job_end_t end = job ? dk_job_end(job) : DK_END_NONE;
    dk_job_destroy(&job);
    snprintf(cmd, sizeof cmd, "scancel %s; rm -rf %s", job_id, log_dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert(ended, "the job did not end: %s %s", out[0][2], out[1][2]);
    cr_assert_eq(end, DK_END_OK, "rank 0: %s | %s; rank 1: %s | %s", out[0][1], out[0][2],
                 out[1][1], out[1][2]);
    for (int r = 0; r < 2; r++) {
        char want[32];
        snprintf(want, sizeof want, "on node%d\n", r + 1);
        cr_assert(strstr(out[r][1], want), "rank %d: %s", r, out[r][1]);
        cr_assert(strstr(out[r][1], "child-out\n") && strstr(out[r][2], "child-err\n"));
        snprintf(want, sizeof want, "rank=%d len=0", r);
        cr_assert(!strncmp(msg[r], want, strlen(want)), "rank %d: %s", r, msg[r]);
    }
}
