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

#ifndef CLUSTER_SH
#error "CLUSTER_SH (tests/slurm/cluster.sh) must be defined"
#endif

/* A 2-node allocation and what a job on it needs. */
static struct {
    char job_id[32], addr[64], err[512], jobopt[64], slurm_conf[512], log_dir[64];
    const char *cmd[2][9];
    const char *const *cmds[2];
    const char *hosts[2];
    const char *env[5];
} cl;

static const char *shell_line(const char *cmd);

static dk_job_spec_t cluster_spec(const char *mode)
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
    snprintf(cl.job_id, sizeof cl.job_id, "%s", shell_line(cmd));
    cr_assert(cl.job_id[0], "salloc gave no allocation");
    snprintf(cmd, sizeof cmd, "sed -n 's/^NodeName=node1 NodeAddr=\\([0-9.]*\\) .*/\\1/p' %s", conf);
    char node_addr[64];
    snprintf(node_addr, sizeof node_addr, "%s", shell_line(cmd));
    cr_assert_eq(dk_netaddr_route_to(node_addr, cl.addr, sizeof cl.addr, cl.err, sizeof cl.err),
                 0, "%s", cl.err);
    snprintf(cl.jobopt, sizeof cl.jobopt, "--jobid=%s", cl.job_id);
    snprintf(cl.slurm_conf, sizeof cl.slurm_conf, "SLURM_CONF=%s", conf);
    static const char *nodes[2] = {"node1", "node2"};
    for (int r = 0; r < 2; r++) {
        const char *c[] = {"srun", cl.jobopt, "-N1", "-n1", "-w", nodes[r], "--export=ALL",
                           FAKE_RANK, NULL};
        memcpy(cl.cmd[r], c, sizeof c);
        cl.cmds[r] = cl.cmd[r];
        cl.hosts[r] = nodes[r];
    }
    static char mode_var[64];
    snprintf(mode_var, sizeof mode_var, "FAKE_MODE=%s", mode);
    const char *env[] = {"PATH=/usr/bin:/bin", cl.slurm_conf, mode_var, NULL};
    memcpy(cl.env, env, sizeof env);
    snprintf(cl.log_dir, sizeof cl.log_dir, "/tmp/dk-test-remote-XXXXXX");
    cr_assert_not_null(mkdtemp(cl.log_dir));
    dk_job_spec_t spec = {
        .world_size = 2,
        .rank_exe = FAKE_RANK,
        .env = cl.env,
        .log_dir = cl.log_dir,
        .bc_tcp_addr = cl.addr,
        .rank_hosts = cl.hosts,
        .rank_commands = cl.cmds,
    };
    return spec;
}

static void cluster_release(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "scancel %s; rm -rf %s", cl.job_id, cl.log_dir);
    cr_assert_eq(system(cmd), 0);
}

static bool said(int rank, int fd, const char *needle)
{
    pthread_mutex_lock(&lock);
    bool found = strstr(out[rank][fd], needle) != NULL;
    pthread_mutex_unlock(&lock);
    return found;
}

Test(remote_ranks, ranks_started_with_srun_on_two_nodes_send_output_and_results_over_tcp,
     .timeout = 180)
{
    dk_job_spec_t spec = cluster_spec("spawn_writer");
    dk_sink_t sink = {.on_output = on_output, .on_message = on_message};
    char err[512] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    bool ended = job && dk_job_wait(job, 120000);
    dk_job_end_t end = job ? dk_job_end(job) : DK_END_NONE;
    dk_job_destroy(&job);
    cluster_release();
    cr_assert(ended, "the job did not end: %s %s %s", err, out[0][2], out[1][2]);
    cr_assert_eq(end, DK_END_OK, "rank 0: %s | %s; rank 1: %s | %s", out[0][1], out[0][2],
                 out[1][1], out[1][2]);
    for (int r = 0; r < 2; r++) {
        char want[32];
        snprintf(want, sizeof want, "on node%d\n", r + 1);
        cr_assert(said(r, 1, want), "rank %d: %s", r, out[r][1]);
        cr_assert(said(r, 1, "child-out\n") && said(r, 2, "child-err\n"));
        snprintf(want, sizeof want, "rank=%d len=0", r);
        cr_assert(!strncmp(msg[r], want, strlen(want)), "rank %d: %s", r, msg[r]);
    }
}

/* node2's network is cut mid-run (no FIN, no RST: its rank just goes
 * quiet): the heartbeats tell, within seconds and without srun's help, and
 * the job ends with node2's rank lost as the root cause. */
Test(remote_ranks, a_node_cut_off_mid_run_is_told_lost_by_the_heartbeats, .timeout = 180)
{
    dk_job_spec_t spec = cluster_spec("sleep");
    spec.heartbeat_s = 2.0;
    spec.grace_s = 0.5;
    dk_sink_t sink = {.on_output = on_output, .on_message = on_message};
    char err[512] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    for (int i = 0; job && i < 3000 && !(said(0, 1, "sleeping") && said(1, 1, "sleeping")); i++)
        usleep(10000);
    bool running = job && said(0, 1, "sleeping") && said(1, 1, "sleeping");
    int killed = running ? system(CLUSTER_SH " exec node2 ip link set eth0 down") : -1;
    bool ended = job && dk_job_wait(job, 30000);
    char summary[128] = "";
    dk_job_end_t end = DK_END_NONE;
    int root = -1;
    if (job) {
        end = dk_job_end(job);
        root = dk_job_root_cause(job);
        dk_job_lost_summary(job, summary, sizeof summary);
    }
    dk_job_destroy(&job);
    int restarted = system(CLUSTER_SH " exec node2 ip link set eth0 up");
    cluster_release();
    cr_assert(running, "the ranks never ran: %s %s %s", err, out[0][2], out[1][2]);
    cr_assert_eq(killed, 0);
    cr_assert(ended, "the job did not end within 30 s of node2's loss");
    cr_assert_eq(end, DK_END_FAILED);
    cr_assert_eq(root, 1);
    cr_assert_str_eq(summary, "node2 lost (rank 1)");
    cr_assert_eq(restarted, 0);
}
