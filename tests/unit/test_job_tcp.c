/*
 * Ranks on other nodes (runtime/launch/dk_job.h): the back channel over TCP,
 * rank 0's port, lost nodes and silent hosts, the Python rank and
 * distkernel-rank over TCP, launchers' lines, interrupts through a launcher.
 * The fixture is job_fixture.h's.
 */
#include "job_fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dk_backchan.h"
#include "dk_fdlimit.h"
#include "dk_logdir.h"
#include "dk_logfile.h"
#include "dk_stackreq.h"
#include "dk_tidy.h"
#include "proc_alive.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* ------------------------------------------------------------------------ */
/* Ranks on other nodes: the back channel over TCP                          */



static int connect_v4(const char *addr, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int rc = connect(fd, (struct sockaddr *) &sa, sizeof sa);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

Test(tcp, the_listener_is_bound_to_the_given_address_only)
{
    dk_backchan_sink_t none = {0};
    dk_backchan_opts_t opts = {.tcp_addr = "127.0.0.1"};
    char err[512] = "";
    dk_backchan_t *ch = dk_backchan_new_opts(1, false, "x", 1, &none, &opts, err, sizeof err);
    cr_assert_not_null(ch, "%s", err);
    int port = dk_backchan_port(ch);
    cr_assert_gt(port, 0);
    char want[64];
    snprintf(want, sizeof want, "tcp:127.0.0.1:%d", port);
    cr_assert_str_eq(dk_backchan_address(ch), want);
    cr_assert_null(dk_backchan_path(ch));
    cr_assert_eq(connect_v4("127.0.0.1", port), 0, "%s", strerror(errno));
    /* Another address of this same host: nothing listens there. */
    cr_assert_neq(connect_v4("127.0.0.2", port), 0);
    cr_assert_eq(errno, ECONNREFUSED);
    dk_backchan_destroy(&ch);
}

Test(tcp, a_wildcard_or_a_name_is_refused_with_what_to_give)
{
    dk_backchan_sink_t none = {0};
    const char *bad[] = {"0.0.0.0", "::", "localhost"};
    const char *why[] = {"every network", "every network", "not a numeric"};
    for (int i = 0; i < 3; i++) {
        dk_backchan_opts_t opts = {.tcp_addr = bad[i]};
        char err[512] = "";
        dk_backchan_t *ch = dk_backchan_new_opts(1, false, "x", 1, &none, &opts, err, sizeof err);
        cr_assert_null(ch, "%s was accepted", bad[i]);
        cr_assert(strstr(err, why[i]), "%s: %s", bad[i], err);
    }
}

Test(tcp, ranks_connect_over_tcp_and_their_results_and_payload_arrive_intact, .timeout = 60)
{
    size_t len = 4u << 20;
    unsigned char *payload = malloc(len);
    for (size_t i = 0; i < len; i++)
        payload[i] = (unsigned char) (i * 2654435761u >> 13);
    char digest[65];
    sha256_hex(payload, len, digest);
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = tcp_spec(3, extra);
    spec.payload = payload;
    spec.payload_len = len;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 3; r++) {
        char want[160];
        snprintf(want, sizeof want, "rank=%d len=%zu sha256=%s", r, len, digest);
        cr_assert_str_eq(rec.msg[r].buf, want);
        cr_assert_str_eq(env_of(r, "DISTKERNEL_BC"), dk_job_bc_address(job));
        cr_assert(output_has(r, 1, "KEYLEN 64"));
    }
    cr_assert(!strncmp(dk_job_bc_address(job), "tcp:127.0.0.1:", 14), "%s",
              dk_job_bc_address(job));
    free(payload);
    finish(&job);
}

/* MASTER_PORT from rank 0: ranks that said HELLO before rank 0 wait for its
 * port, every rank gets the same one before its PAYLOAD, and none is given a
 * MASTER_PORT in its environment. */
Test(tcp, the_port_rank_0_sends_reaches_every_rank_before_its_payload, .timeout = 60)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", "FAKE_CONNECT_DELAY_MS_0=700",
                           "FAKE_SEND_PORT_0=23456", NULL};
    dk_job_spec_t spec = tcp_spec(3, extra);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 3; r++) {
        cr_assert(output_has(r, 1, "port 23456\n"), "rank %d", r);
        cr_assert_not(output_has(r, 1, "MASTER_PORT was set"), "rank %d", r);
        cr_assert_str_eq(env_of(r, "DISTKERNEL_MASTER_PORT"), "rank0");
        cr_assert(strncmp(rec.msg[r].buf, "rank=", 5) == 0, "rank %d: %s", r, rec.msg[r].buf);
    }
    cr_assert_eq(dk_job_master_port(job), 0);
    finish(&job);
}

static void port_refused(const char *setting, const char *why)
{
    const char *extra[] = {setting, NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert(warned(why), "no warning \"%s\"", why);
    finish(&job);
}

Test(tcp, a_port_from_a_rank_other_than_0_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_1=23456", "a port nobody asked for");
}

Test(tcp, a_port_of_0_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_0=0", "did not hold a TCP port");
}

Test(tcp, a_port_past_65535_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_0=70000", "did not hold a TCP port");
}

/* Without bc_tcp_addr there is no channel a port could come back over. */
Test(tcp, a_port_from_rank_0_needs_the_tcp_channel)
{
    dk_job_spec_t spec = spec_for(1, NULL);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    char err[256] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    cr_assert_null(job);
    cr_assert(strstr(err, "DK_JOB_PORT_FROM_RANK0 with bc_tcp_addr"), "%s", err);
}

Test(tcp, a_forged_mac_over_tcp_is_refused)
{
    const char *extra[] = {"FAKE_MODE_0=forge_mac", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(0, 1, "refused as expected"));
    cr_assert(warned("did not verify"));
    finish(&job);
}

Test(tcp, output_sent_as_frames_reaches_the_sink_and_the_log_in_order, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=3000", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        const char *out = rec.out[r][1].buf, *err = rec.out[r][2].buf;
        cr_assert(out && err, "rank %d: no output came", r);
        const char *at_out = out, *at_err = err;
        for (int i = 0; i < 3000; i++) {
            char line[32];
            snprintf(line, sizeof line, "out %d\n", i);
            at_out = strstr(at_out, line);
            cr_assert_not_null(at_out, "rank %d: \"out %d\" missing or out of order", r, i);
            snprintf(line, sizeof line, "err %d\n", i);
            at_err = strstr(at_err, line);
            cr_assert_not_null(at_err, "rank %d: \"err %d\" missing or out of order", r, i);
        }
        cr_assert_gt(rec.ncaught_up[r][1], 0);
        char path[512];
        snprintf(path, sizeof path, "%s/rank-%d.log", log_dir, r);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f);
        char *text = calloc(1, 1 << 20);
        size_t n = fread(text, 1, (1 << 20) - 1, f);
        fclose(f);
        text[n] = '\0';
        cr_assert(strstr(text, "out 2999\n") && strstr(text, "err 2999\n"));
        free(text);
    }
    finish(&job);
}

Test(tcp, a_childs_output_and_the_last_words_arrive_before_the_result)
{
    const char *extra[] = {"FAKE_MODE=spawn_writer", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        cr_assert(output_has(r, 1, "child-out"), "rank %d", r);
        cr_assert(output_has(r, 2, "child-err"), "rank %d", r);
        cr_assert(rec.last_words_first[r], "rank %d: its last output came after its result", r);
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
    }
    finish(&job);
}

Test(tcp, silent_ranks_are_lost_and_told_by_node, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=freeze", "FAKE_MODE_3=freeze", NULL};
    const char *hosts[] = {"node1", "node1", "node2", "node2"};
    dk_job_spec_t spec = tcp_spec(4, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    int root = dk_job_root_cause(job);
    cr_assert(root == 2 || root == 3, "root cause %d", root);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    cr_assert_str_eq(rec.lost_host[2], "node2");
    cr_assert_str_eq(rec.lost_host[3], "node2");
    /* Each rank went silent on its own, and the node is told once. */
    cr_assert_eq(warned_times("on node2 lost: "), 1);
    cr_assert_str_eq(rec.lost_host[0], "");
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    /* told by the first of the two to be found silent */
    cr_assert(warned(root == 2 ? "rank 2 on node2 lost: " : "rank 3 on node2 lost: "));
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    finish(&job);
}

/* Ten nodes go quiet at once: the cell is told of the first eight, one line
 * each, and then once that more went; the summary still names all ten. */
Test(tcp, past_eight_lost_nodes_one_line_says_more_went, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=freeze", "FAKE_MODE_0=sleep", NULL};
    const char *hosts[] = {"node0", "node1", "node2", "node3", "node4", "node5",
                           "node6", "node7", "node8", "node9", "node10"};
    dk_job_spec_t spec = tcp_spec(11, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    for (int r = 1; r < 11; r++)
        cr_assert(dk_job_rank_lost(job, r), "rank %d", r);
    cr_assert_eq(warned_times(" lost: "), 8);
    cr_assert_eq(warned_times("more nodes were lost; the run's error names every one"), 1);
    char summary[512];
    dk_job_lost_summary(job, summary, sizeof summary);
    for (int n = 1; n <= 10; n++) {
        char clause[32];
        snprintf(clause, sizeof clause, "node%d lost (rank %d)", n, n);
        cr_assert(strstr(summary, clause), "%s not in: %s", clause, summary);
    }
    finish(&job);
}

/* Node2 goes quiet while rank 2 is still starting: rank 3's connection times
 * out, and rank 2, which never connected, is lost with its node rather than
 * reported as a rank ended after rank 3 failed. */
Test(tcp, a_rank_still_starting_on_a_lost_node_is_lost_with_it, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=freeze_at_start", "FAKE_MODE_3=freeze",
                           NULL};
    const char *hosts[] = {"node1", "node1", "node2", "node2"};
    dk_job_spec_t spec = tcp_spec(4, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 3);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    cr_assert_str_eq(rec.lost_host[2], "node2");
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("rank 2 on node2 lost with it: it had not connected yet"));
    finish(&job);
}

/* Rank 0 raises gloo's "Connection closed by peer" because node2 went
 * quiet; the kernel learns that only at the heartbeat deadline. The echo
 * waits for it: node2 is the root cause, not rank 0. */
Test(tcp, a_peers_connection_error_waits_for_the_lost_node_it_echoes, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_0=echo_error", "FAKE_MODE_1=freeze", NULL};
    const char *hosts[] = {"node1", "node2"};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(dk_job_rank_lost(job, 1));
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (rank 1)");
    finish(&job);
}

/* Ranks 0 and 1 both raise gloo's "Connection closed by peer" because node2
 * went quiet. The second echo is no news of the peer that went: both wait
 * for the heartbeat deadline, and node2 is the root cause, not rank 0 or 1. */
Test(tcp, two_echoes_of_a_lost_node_wait_for_it_together, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_0=echo_error", "FAKE_MODE_1=echo_error",
                           "FAKE_MODE_2=freeze", NULL};
    const char *hosts[] = {"node1", "node1", "node2"};
    dk_job_spec_t spec = tcp_spec(3, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 2);
    cr_assert(dk_job_rank_lost(job, 2));
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (rank 2)");
    finish(&job);
}

/* A node that goes down while all its ranks are still starting leaves no
 * connection to go silent: launched ranks not connected by the connect
 * deadline, their launchers still running, are lost with their node. */
Test(tcp, launched_ranks_not_connected_by_the_deadline_are_lost_with_their_node, .timeout = 60)
{
    static const char *const cmd[] = {FAKE_RANK, NULL};
    static const char *const *cmds[4] = {cmd, cmd, cmd, cmd};
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=freeze_at_start",
                           "FAKE_MODE_3=freeze_at_start", NULL};
    const char *hosts[] = {"node1", "node1", "node2", "node2"};
    dk_job_spec_t spec = tcp_spec(4, extra);
    spec.heartbeat_s = 2.0;
    spec.connect_timeout_s = 3.0;
    spec.rank_hosts = hosts;
    spec.rank_commands = cmds;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("had not connected 3 s after its launch"));
    finish(&job);
}

Test(tcp, a_heartbeat_deadline_shorter_than_two_pings_is_refused)
{
    dk_job_spec_t spec = tcp_spec(1, NULL);
    spec.heartbeat_s = 1.5;
    char err[256] = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "heartbeat_s is 1.5; it must be at least 2"), "%s", err);
}

Test(tcp, a_job_without_lost_ranks_has_an_empty_summary)
{
    dk_job_spec_t spec = tcp_spec(1, NULL);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    char summary[64] = "x";
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "");
    finish(&job);
}

/* The host freezes (as a SIGKILLed kernel's node, or a cut network, looks from
 * a rank): every rank ends itself once the host has been silent past the
 * deadline. Nothing else would end them here: the host process still exists,
 * so PR_SET_PDEATHSIG never fires. */
/* Start a 2-rank job over TCP in a child (the host) with SPEC's ranks, wait
 * for both to print "sleeping", freeze the host, and tell whether both ranks
 * were gone within 10 s. */
static bool ranks_gone_after_the_host_freezes(dk_job_spec_t spec)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t host = fork();
    if (host == 0) {
        close(fds[0]);
        spec.heartbeat_s = 2.0;
        char err[512];
        dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
        if (!job)
            _exit(2);
        for (int i = 0; i < 1000 && !(output_has(0, 1, "sleeping") &&
                                      output_has(1, 1, "sleeping")); i++)
            usleep(10000);
        int pids[2] = {dk_job_rank_pid(job, 0), dk_job_rank_pid(job, 1)};
        if (write(fds[1], pids, sizeof pids) != (ssize_t) sizeof pids)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    int pids[2];
    cr_assert_eq(read(fds[0], pids, sizeof pids), (ssize_t) sizeof pids, "the host did not start");
    cr_assert(alive(pids[0]) && alive(pids[1]));
    kill(host, SIGSTOP);
    bool gone = gone_within(pids[0], 10000) && gone_within(pids[1], 2000);
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    if (log_dir[0])
        remove_dir(log_dir);
    return gone;
}

Test(tcp, ranks_end_themselves_when_their_host_goes_silent, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    cr_assert(ranks_gone_after_the_host_freezes(tcp_spec(2, extra)),
              "a rank outlived its silent host");
}

#ifndef RANK_PY
#define RANK_PY "import sys; from distkernel import _rank; sys.exit(_rank.main())"
#endif

static const char *python_rank_argv[] = {PYTHON3, "-c", RANK_PY, NULL};

static dk_job_spec_t python_spec(int world_size, const void *payload, size_t len)
{
    static const char *extra[] = {"PYTHONPATH=" PY_SRC, NULL};
    dk_job_spec_t spec = tcp_spec(world_size, extra);
    spec.rank_exe = PYTHON3;
    spec.rank_argv = python_rank_argv;
    spec.payload = payload;
    spec.payload_len = len;
    return spec;
}

Test(tcp, python_ranks_end_themselves_when_their_host_goes_silent, .timeout = 60)
{
    static char payload[65536];
    size_t len = cell_payload("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n",
                              payload, sizeof payload);
    cr_assert(ranks_gone_after_the_host_freezes(python_spec(2, payload, len)),
              "a Python rank outlived its silent host");
}

Test(tcp, rank_programs_end_themselves_when_their_host_goes_silent, .timeout = 60)
{
    static char payload[65536];
    size_t len = cell_payload("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n",
                              payload, sizeof payload);
    cr_assert(ranks_gone_after_the_host_freezes(rank_exe_spec(2, payload, len)),
              "a rank outlived its silent host");
}

/* A SIGKILLed host shows on a remote rank's connection as a close, not as
 * silence, and nothing else reaches a rank on another node (srun dies with the
 * host; its tasks do not). Here each rank's launcher is `setsid -w`, so the
 * Python rank is in a session of its own, out of reach of the parent-death
 * signal and the sentinel, as a task of srun on another node is; it prints
 * its pid, the host is SIGKILLed, and the rank must end itself. */
/* SPEC's one rank, started by CMD (in a session of its own), says "sleeping
 * PID"; its host is SIGKILLed: whether the rank is gone within 15 s. */
static bool rank_gone_after_its_host_is_killed(dk_job_spec_t spec, const char *const *cmd)
{
    static const char *const *cmds[1];
    cmds[0] = cmd;
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t host = fork();
    if (host == 0) {
        close(fds[0]);
        spec.heartbeat_s = 2.0;
        spec.rank_commands = cmds;
        char err[512];
        dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
        if (!job)
            _exit(2);
        for (int i = 0; i < 2000 && !output_has(0, 1, "sleeping "); i++)
            usleep(10000);
        const char *at = output_has(0, 1, "sleeping ") ? strstr(rec.out[0][1].buf, "sleeping ")
                                                       : NULL;
        int pid = at ? atoi(at + 9) : 0;
        if (write(fds[1], &pid, sizeof pid) != (ssize_t) sizeof pid)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    int pid = 0;
    cr_assert_eq(read(fds[0], &pid, sizeof pid), (ssize_t) sizeof pid, "the host did not start");
    cr_assert_gt(pid, 0, "the rank did not say its pid");
    cr_assert(alive(pid));
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    bool gone = gone_within(pid, 15000);
    if (!gone)
        kill(pid, SIGKILL);
    if (log_dir[0])
        remove_dir(log_dir);
    return gone;
}

Test(tcp, python_ranks_end_themselves_when_their_host_is_killed, .timeout = 60)
{
    static char payload[65536];
    size_t len = cell_payload("import os, time\nprint('sleeping', os.getpid(), flush=True)\n"
                              "time.sleep(60)\n", payload, sizeof payload);
    static const char *cmd[] = {"setsid", "-w", PYTHON3, "-c", RANK_PY, NULL};
    cr_assert(rank_gone_after_its_host_is_killed(python_spec(1, payload, len), cmd),
              "a remote rank outlived its SIGKILLed host");
}

/* ... and so does distkernel-rank while its main thread holds the GIL (a C
 * call through ctypes.PyDLL): the Python thread that would see the close
 * cannot run, the native one that sends PINGs finds the connection broken. */
Test(tcp, a_rank_holding_the_gil_ends_itself_when_its_host_is_killed, .timeout = 60)
{
    static char payload[65536];
    size_t len = cell_payload("import ctypes, os\nprint('sleeping', os.getpid(), flush=True)\n"
                              "ctypes.PyDLL(None).sleep(60)\n", payload, sizeof payload);
    static const char *cmd[] = {"setsid", "-w", RANK_EXE, NULL};
    cr_assert(rank_gone_after_its_host_is_killed(rank_exe_spec(1, payload, len), cmd),
              "a rank holding the GIL outlived its SIGKILLed host");
}

/* The real rank side (python/distkernel/_rank.py and _backchannel.py) over
 * TCP: its print()s, a child's writes and C-level writes arrive as OUTPUT
 * frames (fd 1 is no longer the runtime's pipe), and its value intact. */
static void output_and_result(bool rank_exe);

Test(tcp, the_python_rank_over_tcp_sends_its_output_and_result, .timeout = 90)
{
    output_and_result(false);
}

/* The same run by distkernel-rank, whose frames and PINGs are sent by C
 * (runtime/rank/dk_rankchan.c). */
Test(tcp, the_rank_program_over_tcp_sends_its_output_and_result, .timeout = 90)
{
    output_and_result(true);
}

static void output_and_result(bool rank_exe)
{
    const char *code =
        "import os\n"
        "print('hello from', os.environ['RANK'])\n"
        "os.system('echo child-' + os.environ['RANK'] + '; echo child-err >&2')\n"
        "os.write(2, b'c-level-err\\n')\n"
        "'value-' + os.environ['RANK'] * 3\n";
    static char payload[65536];
    size_t len = cell_payload(code, payload, sizeof payload);
    dk_job_spec_t spec = rank_exe ? rank_exe_spec(2, payload, len) : python_spec(2, payload, len);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    for (int r = 0; r < 2; r++) {
        char want[64];
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE, "rank %d: %s %s", r,
                     rec.out[r][2].buf ? rec.out[r][2].buf : "", rec.msg[r].buf ? rec.msg[r].buf : "");
        snprintf(want, sizeof want, "hello from %d\n", r);
        cr_assert(output_has(r, 1, want), "rank %d: %s", r, rec.out[r][1].buf);
        snprintf(want, sizeof want, "child-%d\n", r);
        cr_assert(output_has(r, 1, want), "rank %d: %s", r, rec.out[r][1].buf);
        cr_assert(output_has(r, 2, "child-err\n"));
        cr_assert(output_has(r, 2, "c-level-err\n"));
        /* ... and all of it before the result. */
        cr_assert_not_null(memmem(rec.out[r][2].buf, rec.out_len_at_msg[r][2], "c-level-err\n", 12),
                           "rank %d: its last output came after its result", r);
        cr_assert_not_null(memmem(rec.out[r][1].buf, rec.out_len_at_msg[r][1], want, strlen(want)),
                           "rank %d: its output came after its result", r);
        snprintf(want, sizeof want, "value-%d%d%d", r, r, r);
        cr_assert(!rec.msg_error[r]);
        cr_assert_not_null(memmem(rec.msg[r].buf, rec.msg[r].len, want, strlen(want)),
                           "rank %d's value is not in its result", r);
    }
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    finish(&job);
}

/* Ranks busy in their work for longer than the deadline send nothing of their
 * own: the heartbeats both ways keep them, and the job, alive. */
Test(tcp, quiet_ranks_outlive_the_deadline_on_heartbeats, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_SLEEP_S=4", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
        cr_assert(!dk_job_rank_lost(job, r));
    }
    finish(&job);
}

Test(tcp, output_for_another_fd_closes_the_connection_with_a_warning)
{
    const char *extra[] = {"FAKE_MODE_1=bad_output", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(output_has(1, 1, "refused as expected"));
    cr_assert(warned("not for fd 1 or 2"));
    finish(&job);
}

/* What a rank says about itself for its log (DK_BC_OUTPUT_LOG: a folder of
 * its node it would not use) goes to rank-N.log, never to the sink. */
Test(tcp, a_ranks_note_for_its_log_goes_to_its_log_only)
{
    const char *extra[] = {"FAKE_MODE_1=log_note", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_expect(!output_has(1, 1, "a note") && !output_has(1, 2, "a note"),
              "the note reached the cell");
    char path[512];
    snprintf(path, sizeof path, "%s/rank-1.log", log_dir);
    size_t len = 0;
    char *log = read_file(path, &len);
    cr_assert_not_null(log);
    cr_expect_not_null(strstr(log, "a note about itself\n"), "rank-1.log: %s", log);
    free(log);
    finish(&job);
}

/* The runtime's own loop held up past the deadline (a slow sink, a stalled
 * disk) is not the rank's silence: what the rank sent meanwhile is waiting
 * unread. */
Test(tcp, a_runtime_held_up_past_the_deadline_does_not_take_its_ranks_for_lost, .timeout = 60)
{
    char dir[] = "/tmp/dk-test-hold-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    hold_dir = dir;
    const char *extra[] = {"FAKE_MODE=hold", "FAKE_SLEEP_S=3", "FAKE_RANK_DEADLINE=30", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    char held[512], release[512];
    snprintf(held, sizeof held, "%s/held", dir);
    snprintf(release, sizeof release, "%s/release", dir);
    for (int i = 0; i < 2000 && access(held, F_OK) != 0; i++)
        usleep(10000);
    cr_assert_eq(access(held, F_OK), 0, "the runtime was never held");
    usleep(4500000);            /* 2.25 heartbeat deadlines */
    FILE *f = fopen(release, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(!dk_job_rank_lost(job, 0));
    finish(&job);
    unlink(held);
    unlink(release);
    rmdir(dir);
}

/* Started ranks over TCP: idle between cells for longer than the deadline,
 * kept by the heartbeats, then a cell's output and value. */
Test(tcp, python_started_ranks_over_tcp_idle_past_the_deadline_then_run_a_cell, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload("import os\nprint('cell on', os.environ['RANK'])\n6 * 7\n", payload,
                              sizeof payload);
    dk_job_spec_t spec = python_spec(2, NULL, 0);
    spec.persistent = true;
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_round_wait(job, 60000), "the ranks never said HELLO");
    cr_assert_eq(dk_job_round_end(job), DK_END_OK);
    usleep(4500000);            /* idle for 2.25 deadlines */
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, payload, len, 0, err, sizeof err), 0, "%s (%s)", err,
                 rec.nwarnings ? rec.warnings[0] : "");
    cr_assert(dk_job_round_wait(job, 60000));
    cr_assert_eq(dk_job_round_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        char want[32];
        snprintf(want, sizeof want, "cell on %d\n", r);
        cr_assert(output_has(r, 1, want), "rank %d: %s", r, rec.out[r][1].buf);
        cr_assert(!dk_job_rank_lost(job, r));
        /* cloudpickle's 42: BININT1 (K) 42 (*) */
        cr_assert_not_null(memmem(rec.msg[r].buf, rec.msg[r].len, "K*", 2));
    }
    finish(&job);
}

/* A launcher that exits on its own (srun whose node was cut off) while its
 * rank's connection is still open and unanswered: the verdict waits for the
 * heartbeats, which tell the rank lost. */
Test(tcp, a_launcher_exiting_while_its_connection_is_open_waits_for_the_heartbeats, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=orphan_silent", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    int orphan = 0;
    const char *at = rec.out[0][1].buf ? strstr(rec.out[0][1].buf, "ORPHAN ") : NULL;
    if (at)
        orphan = atoi(at + 7);
    if (orphan > 0)
        kill(orphan, SIGKILL);
    cr_assert_gt(orphan, 0, "no orphan was reported");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 1);
    cr_assert(dk_job_rank_lost(job, 0));
    char summary[64];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "localhost lost (rank 0)");
    finish(&job);
}

/* Node2's processes are killed (their connections close, FIN or RST) while
 * the launchers we see stay (srun of Slurm 22.05.8 off the cluster, bug
 * 16401): the ranks are lost once the heartbeat deadline passes, not when
 * the launchers exit, which would be never. */
Test(tcp, ranks_whose_connections_close_while_their_launchers_stay_are_lost, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=close_hang", "FAKE_MODE_3=close_hang",
                           NULL};
    const char *hosts[] = {"node1", "node1", "node2", "node2"};
    dk_job_spec_t spec = tcp_spec(4, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job waited for the launchers");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    int root = dk_job_root_cause(job);
    cr_assert(root == 2 || root == 3, "root cause %d", root);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("on node2 lost: its connection closed without an answer"));
    cr_assert(output_has(2, 1, "closing"));
    /* The stop ladder ended the launchers: nothing of the job is left. */
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    cr_assert_neq(dk_job_rank_state(job, root), DK_RANK_RUNNING);
    finish(&job);
}

/* A launcher that exits within the deadline after its rank's connection
 * closed (srun saying "Node failure on node2"): its own verdict stands. */
Test(tcp, a_launcher_exiting_soon_after_its_connection_closed_keeps_its_verdict, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_1=close_hang", "FAKE_SLEEP_S=0.5", NULL};
    const char *hosts[] = {"node1", "node2"};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.heartbeat_s = 3.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 3);
    cr_assert_not(dk_job_rank_lost(job, 1));
    char summary[64] = "x";
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "");
    finish(&job);
}

/* A healthy peer sees the lost node's connection close (gloo's "Connection
 * closed by peer") and sends its ERROR after the close: the root cause is the
 * lost node, not that echo. */
Test(tcp, a_peers_error_after_a_close_leaves_the_root_cause_to_the_lost_node, .timeout = 60)
{
    char dir[] = "/tmp/dk-test-sync-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char sync[600];
    snprintf(sync, sizeof sync, "FAKE_SYNC=%s", dir);
    const char *extra[] = {"FAKE_MODE_0=error_synced", "FAKE_MODE_1=close_hang", sync, NULL};
    const char *hosts[] = {"node1", "node2"};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job waited for the launcher");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_str_eq(rec.msg[0].buf, "boom on rank 0");
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(dk_job_rank_lost(job, 1));
    cr_assert_not(dk_job_rank_lost(job, 0));
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    char summary[64];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (rank 1)");
    finish(&job);
    remove_dir(dir);
}

/* The words for lost ranks from plain records: one clause per node, runs of
 * ranks with an en dash, nodes in the order of their first lost rank. */
Test(tcp, lost_ranks_are_told_by_node_with_runs)
{
    const char *hosts[] = {"node1", "node1", "node1", "node1", "node2", "node2",
                           "node2", "node2", "node3", "node3", "node3", "node3", NULL};
    bool lost[12] = {false};
    char buf[200];
    dk_lost_format(12, lost, hosts, "; ", buf, sizeof buf);
    cr_assert_str_eq(buf, "");
    for (int r = 4; r < 8; r++)
        lost[r] = true;
    dk_lost_format(12, lost, hosts, "; ", buf, sizeof buf);
    cr_assert_str_eq(buf, "node2 lost (ranks 4" DK_EN_DASH "7)");
    lost[6] = false;
    lost[8] = true;
    lost[10] = lost[11] = true;
    dk_lost_format(12, lost, hosts, "\n", buf, sizeof buf);
    cr_assert_str_eq(buf, "node2 lost (ranks 4" DK_EN_DASH "5, 7)\n"
                          "node3 lost (ranks 8, 10" DK_EN_DASH "11)");
    /* No hosts: every rank is on "localhost". */
    bool one[2] = {false, true};
    dk_lost_format(2, one, NULL, "; ", buf, sizeof buf);
    cr_assert_str_eq(buf, "localhost lost (rank 1)");
    /* Truncated, never overrun. */
    char small[12];
    dk_lost_format(12, lost, hosts, "; ", small, sizeof small);
    cr_assert_eq(strlen(small), sizeof small - 1);
}

/* Reflection (review of issue 13): a PING's body is the same both ways, so
 * without the direction in the MAC a man in the middle could send the
 * runtime's own PING back to it with the seq it expects next, and it would
 * verify. With it, the reflected frame is refused like any forgery, and the
 * rank's connection ends (so the rank fails). */
Test(tcp, a_frame_of_the_runtime_reflected_back_to_it_is_refused, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=reflect", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert(output_has(0, 1, "reflected seq 1"), "the fake rank did not reflect a PING");
    cr_assert(warned("did not verify"), "the reflected PING was not refused");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    finish(&job);
}

/* A remote rank that keeps sending (review of issue 13): when another rank
 * exits, the runtime reads what has arrived before judging it, and that read
 * must end although the flood does not. Here rank 1 finishes while rank 0
 * floods for 60 s: its verdict (DONE) must come while the flood goes on, and
 * a cancel must then end the flooder. Unbounded, the read went on until the
 * flooder, hearing no PING from the runtime stuck in it, took the runtime for
 * dead and ended itself. */
Test(tcp, a_flooding_rank_does_not_hold_up_another_ranks_verdict, .timeout = 150)
{
    const char *extra[] = {"FAKE_MODE_0=flood", "FAKE_MODE_1=sleep", "FAKE_SLEEP_S=2", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    dk_job_t *job = start(&spec);
    bool done = false;
    for (int i = 0; i < 3000 && !done; i++) {
        pthread_mutex_lock(&rec.lock);
        done = rec.nstates[1] > 0 && rec.states[1][rec.nstates[1] - 1] == DK_RANK_DONE;
        pthread_mutex_unlock(&rec.lock);
        if (!done)
            usleep(10000);
    }
    bool flooding = dk_job_end(job) == DK_END_NONE;
    pthread_mutex_lock(&rec.lock);
    size_t dots = rec.out[0][1].len;
    pthread_mutex_unlock(&rec.lock);
    dk_job_cancel(job);
    bool ended = dk_job_wait(job, 60000);
    cr_assert(done, "rank 1's verdict did not come within 30 s while rank 0 flooded: %s %s",
              rec.out[1][1].buf ? rec.out[1][1].buf : "", rec.out[1][2].buf ? rec.out[1][2].buf : "");
    cr_assert(flooding, "the flood ended before rank 1's verdict");
    cr_assert_gt(dots, 1000, "rank 0 did not flood (%zu bytes)", dots);
    cr_assert(ended, "the cancelled job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    finish(&job);
}

/* A TCP listener on 127.0.0.1 that takes no more connections: its accept
 * queue is full and nobody accepts, so Linux drops further SYNs, as a
 * firewall that drops packets does. Returns the listener; *PORT its port;
 * HELD[0..*NHELD) the connections that filled the queue. */
static int dropping_listener(int *port, int *held, int *nheld)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(bind(lfd, (struct sockaddr *) &sa, sizeof sa), 0);
    cr_assert_eq(listen(lfd, 0), 0);
    socklen_t sl = sizeof sa;
    getsockname(lfd, (struct sockaddr *) &sa, &sl);
    *port = ntohs(sa.sin_port);
    *nheld = 0;
    /* Connect until one does not complete: from then on SYNs are dropped. */
    for (int i = 0; i < 16; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        held[(*nheld)++] = fd;
        if (connect(fd, (struct sockaddr *) &sa, sizeof sa) == 0)
            continue;
        cr_assert_eq(errno, EINPROGRESS);
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 500) == 0)
            return lfd;
    }
    cr_assert_fail("the listener's queue never filled");
    return -1;
}

/* A rank whose kernel address does not answer (SYNs dropped) keeps trying,
 * each try bounded by the heartbeat deadline, until the connect deadline
 * (DISTKERNEL_BC_CONNECT_TIMEOUT, the kernel's own: 120 s by default, 5 s
 * here), then gives up saying so on stderr, rather than waiting out the
 * system's connect timeout (about two minutes with tcp_syn_retries 6) once:
 * by then the kernel has counted it lost. */
Test(tcp, a_python_rank_whose_kernel_does_not_answer_gives_up_and_says_so, .timeout = 120)
{
    int port, held[16], nheld;
    int lfd = dropping_listener(&port, held, &nheld);
    int err_pipe[2];
    cr_assert_eq(pipe(err_pipe), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        char bc[64];
        snprintf(bc, sizeof bc, "tcp:127.0.0.1:%d", port);
        setenv("PYTHONPATH", PY_SRC, 1);
        setenv("DISTKERNEL_BC", bc, 1);
        setenv("DISTKERNEL_BC_KEY", "00000000000000000000000000000000"
                                    "00000000000000000000000000000000", 1);
        setenv("DISTKERNEL_BC_HEARTBEAT", "2", 1);
        setenv("DISTKERNEL_BC_CONNECT_TIMEOUT", "5", 1);
        setenv("RANK", "0", 1);
        dup2(err_pipe[1], 2);
        close(err_pipe[0]);
        close(err_pipe[1]);
        execl(PYTHON3, PYTHON3, "-c", RANK_PY, (char *) NULL);
        _exit(127);
    }
    close(err_pipe[1]);
    /* Well inside the system's timeout, well past the deadline of 2 s. */
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 400 && got == 0; i++) {
        got = waitpid(pid, &status, WNOHANG);
        if (got == 0)
            usleep(100000);
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    char err[4096] = "";
    ssize_t n = read(err_pipe[0], err, sizeof err - 1);
    err[n > 0 ? n : 0] = '\0';
    close(err_pipe[0]);
    for (int i = 0; i < nheld; i++)
        close(held[i]);
    close(lfd);
    cr_assert_neq(got, 0, "the rank was still connecting after 40 s");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d: %s", status, err);
    char want[128];
    snprintf(want, sizeof want, "could not connect to the kernel's back channel at "
             "127.0.0.1:%d within 5 s (", port);
    cr_assert(strstr(err, want), "stderr: %s", err);
    cr_assert(strstr(err, "tries; the last: no answer)"), "stderr: %s", err);
    cr_assert_null(strstr(err, "(1 tries"), "it tried once: %s", err);
    cr_assert_null(strstr(err, "Traceback"), "stderr: %s", err);
}

/* Issue 21 item 4: a rank whose kernel is not listening yet (refused: a
 * kernel busy taking in hundreds of ranks, or a listen queue another user
 * fills) tries again, with backoff, and is in once it listens. */
#define RETRY_PY                                                                   \
    "import os, socket, threading, time\n"                                        \
    "from distkernel import _backchannel as bc\n"                                 \
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]\n"  \
    "os.environ.update(DISTKERNEL_BC_HEARTBEAT='2', DISTKERNEL_BC_CONNECT_TIMEOUT='10')\n" \
    "def later():\n"                                                              \
    "    time.sleep(1.5); s.listen(1); c, _ = s.accept(); c.sendall(b'n' * 32)\n" \
    "    time.sleep(2)\n"                                                         \
    "threading.Thread(target=later, daemon=True).start()\n"                       \
    "t0 = time.monotonic()\n"                                                     \
    "ch = bc.BackChannel(f'tcp:127.0.0.1:{port}', b'k' * 32, 0)\n"               \
    "print('in after %.1f s' % (time.monotonic() - t0), ch.nonce == b'n' * 32)\n"

/* Run CODE with Debian's python and distkernel's Python glue (30 s at most):
 * its exit status, with stdout and stderr in OUT. */
static int run_python(const char *code, char *out, size_t outlen)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "PYTHONPATH=%s timeout 30 %s -c \"$DK_PY\" 2>&1", PY_SRC, PYTHON3);
    setenv("DK_PY", code, 1);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    unsetenv("DK_PY");
    return status;
}

Test(tcp, a_python_rank_keeps_trying_until_the_kernel_listens, .timeout = 60)
{
    char out[4096] = "";
    int status = run_python(RETRY_PY, out, sizeof out);
    cr_assert_eq(status, 0, "%s", out);
    double after = -1;
    cr_assert(sscanf(out, "in after %lf s True", &after) == 1 && strstr(out, "True"), "%s", out);
    cr_assert(after >= 1.4 && after < 5, "in after %.1f s: %s", after, out);
}

/* Issue 22: a kernel whose listen queue takes the connection but which never
 * starts it (no nonce: a kernel too busy taking in hundreds of ranks, a
 * stranger's listener on a reused port) is tried again, each try bounded by
 * the heartbeat deadline, until the connect deadline, and the rank gives up
 * then, naming the deadline, not after one try. */
#define SILENT_PY                                                                  \
    "import os, socket, time\n"                                                   \
    "from distkernel import _backchannel as bc\n"                                 \
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(64)\n"               \
    "port = s.getsockname()[1]\n"                                                 \
    "os.environ.update(DISTKERNEL_BC_HEARTBEAT='2', DISTKERNEL_BC_CONNECT_TIMEOUT='5')\n" \
    "t0 = time.monotonic()\n"                                                     \
    "try:\n"                                                                      \
    "    bc.BackChannel(f'tcp:127.0.0.1:{port}', b'k' * 32, 0)\n"               \
    "except bc.ConnectFailed as e:\n"                                             \
    "    print('gave up after %.1f s:' % (time.monotonic() - t0), e)\n"

Test(tcp, a_python_rank_whose_kernel_never_starts_the_connection_gives_up_at_the_deadline,
     .timeout = 60)
{
    char out[4096] = "";
    int status = run_python(SILENT_PY, out, sizeof out);
    cr_assert_eq(status, 0, "%s", out);
    double after = -1;
    int tries = 0;
    cr_assert(sscanf(out, "gave up after %lf s:", &after) == 1, "%s", out);
    cr_assert(after >= 4.5 && after < 8, "gave up after %.1f s: %s", after, out);
    const char *why = strstr(out, "accepted the connection but did not start it within 5 s (");
    cr_assert(why && sscanf(why, "accepted the connection but did not start it within 5 s "
                            "(%d tries; the last: ", &tries) == 1, "%s", out);
    cr_assert_geq(tries, 2, "%s", out);
}

/* Heartbeats and the GIL (review of issue 13): a rank whose main thread holds
 * the GIL in a long C call (here libc's sleep through ctypes.PyDLL, which,
 * unlike CDLL, keeps the GIL) for three times the deadline is alive, and must
 * not be declared lost: its PINGs come from a thread that needs no GIL. Run
 * by distkernel-rank, as ranks are. */
Test(tcp, a_rank_holding_the_gil_in_a_long_c_call_is_not_lost, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload("import ctypes\nprint('holding', flush=True)\n"
                              "ctypes.PyDLL(None).sleep(6)\nprint('released', flush=True)\n"
                              "'held'\n", payload, sizeof payload);
    dk_job_spec_t spec = rank_exe_spec(1, payload, len);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert(!dk_job_rank_lost(job, 0), "a rank holding the GIL was declared lost");
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE, "exit %d signal %d: %s",
                 dk_job_rank_exit_code(job, 0), dk_job_rank_signal(job, 0),
                 rec.out[0][2].buf ? rec.out[0][2].buf : "");
    cr_assert(output_has(0, 1, "released"));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    finish(&job);
}

/* ... and its output flows meanwhile: a C call that holds the GIL and writes
 * more than a pipe holds (300 kB to fd 1, through ctypes.PyDLL) used to block
 * for good, since only a Python thread emptied the pipe. The timeout ends it
 * if it does. */
Test(tcp, a_rank_writing_much_while_holding_the_gil_is_not_stuck, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload("import ctypes\n"
                              "ctypes.PyDLL(None).write(1, b'x' * 300000, 300000)\n"
                              "print('released', flush=True)\n'held'\n", payload, sizeof payload);
    dk_job_spec_t spec = rank_exe_spec(1, payload, len);
    spec.heartbeat_s = 2.0;
    spec.timeout_s = 30;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK, "end %d, %zu bytes of output", dk_job_end(job),
                 rec.out[0][1].len);
    cr_assert(output_has(0, 1, "released"));
    cr_assert_eq(rec.out[0][1].len, 300000 + strlen("released\n"));
    finish(&job);
}

/* What a rank writes after its answer (here 300 kB from an atexit handler,
 * as Python's finalization or a child may) is dropped, not left to block the
 * rank's exit on a full pipe. */
Test(tcp, output_after_the_answer_does_not_keep_a_rank_from_exiting, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload("import atexit, os\n"
                              "atexit.register(lambda: os.write(1, b'x' * 300000))\n"
                              "'answered'\n", payload, sizeof payload);
    dk_job_spec_t spec = rank_exe_spec(1, payload, len);
    spec.timeout_s = 30;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK, "end %d", dk_job_end(job));
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE);
    finish(&job);
}

/* A rank started through a launcher that does not pass SIGINT on (srun takes
 * one as "print the tasks' state"): here `sh` that traps INT and runs the rank
 * in a session of its own. The job's interrupt must still reach the rank, as
 * a KeyboardInterrupt in its cell: over the back channel (INTERRUPT frame). */
static void interrupt_through_a_launcher(bool rank_exe)
{
    static char payload[65536];
    size_t len = cell_payload("import time\ntry:\n    print('sleeping', flush=True)\n"
                              "    time.sleep(60)\nexcept KeyboardInterrupt:\n"
                              "    print('rank got KeyboardInterrupt', flush=True)\n    raise\n",
                              payload, sizeof payload);
    static const char *py_cmd[] = {"sh", "-c", "trap : INT; setsid \"$0\" \"$@\"", PYTHON3, "-c",
                                   RANK_PY, NULL};
    static const char *exe_cmd[] = {"sh", "-c", "trap : INT; setsid \"$0\" \"$@\"", RANK_EXE,
                                    NULL};
    static const char *const *cmds[1];
    cmds[0] = rank_exe ? exe_cmd : py_cmd;
    dk_job_spec_t spec = rank_exe ? rank_exe_spec(1, payload, len) : python_spec(1, payload, len);
    spec.rank_commands = cmds;
    spec.grace_s = 10;      /* SIGTERM would come after this: well after the interrupt */
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 3000 && !output_has(0, 1, "sleeping"); i++)
        usleep(10000);
    cr_assert(output_has(0, 1, "sleeping"), "the rank did not start: %s", rec.out[0][2].buf);
    double t0 = now_s();
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_expect(output_has(0, 1, "rank got KeyboardInterrupt"),
              "the interrupt did not reach the rank as a KeyboardInterrupt: %s / %s",
              rec.out[0][1].buf, rec.out[0][2].buf);
    cr_expect_lt(now_s() - t0, 8.0, "the rank ended only by the later rungs");
    finish(&job);
}

Test(tcp, an_interrupt_reaches_a_python_rank_whose_launcher_keeps_sigint, .timeout = 90)
{
    interrupt_through_a_launcher(false);
}

Test(tcp, an_interrupt_reaches_a_rank_program_whose_launcher_keeps_sigint, .timeout = 90)
{
    interrupt_through_a_launcher(true);
}

/* A rank started through a launcher: srun's pipes carry the launcher's own
 * lines ("srun: ...", "slurmstepd-NODE: ..."), and whatever the rank wrote
 * before its channel was up. Here fake_rank plays srun (launcher_noise): its
 * lines come in pieces, split inside a prefix and inside a line, the last one
 * with no newline before the pipe's end. */
static const char *const noise_cmd[] = {FAKE_RANK, NULL};

static dk_job_t *run_noise(bool launched)
{
    static const char *const *cmds[1] = {noise_cmd};
    const char *extra[] = {"FAKE_MODE=launcher_noise", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    if (launched)
        spec.rank_commands = cmds;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 3);
    return job;
}

/* srun saying the rank's node failed: the rank is lost with its node (the
 * heartbeats would say so a little later), not a rank that exited. */
Test(tcp, a_launcher_that_says_its_node_failed_loses_the_rank, .timeout = 60)
{
    static const char *const *cmds[1] = {noise_cmd};
    const char *extra[] = {"FAKE_MODE=node_failure", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    spec.rank_commands = cmds;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert(dk_job_rank_lost(job, 0));
    cr_assert(warned("lost: its launcher said \"srun: error: Node failure on node2\""));
    finish(&job);
}

Test(tcp, a_launchers_own_lines_go_to_the_rank_log_only, .timeout = 60)
{
    dk_job_t *job = run_noise(true);
    cr_assert_not(dk_job_rank_lost(job, 0), "a killed task is not a lost node");
    pthread_mutex_lock(&rec.lock);
    cr_expect_str_eq(rec.out[0][2].buf ? rec.out[0][2].buf : "",
                     "Traceback (most recent call last):\nsize 3\n");
    cr_expect_str_eq(rec.out[0][1].buf ? rec.out[0][1].buf : "", "rank says hi\n");
    pthread_mutex_unlock(&rec.lock);
    char path[512];
    snprintf(path, sizeof path, "%s/rank-0.log", log_dir);
    size_t len = 0;
    char *log = read_file(path, &len);
    cr_assert_not_null(log);
    static const char *const lines[] = {
        "srun: error: node2: task 0: Exited with exit code 1\n",
        "Traceback (most recent call last):\n",
        "slurmstepd-node2: error: *** STEP 12.3 ON node2 CANCELLED AT 2026-12-02T01:00:00 ***\n",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n",
        "srun: warning: on stdout\n", "rank says hi\n", "size 3\n", NULL};
    for (int i = 0; lines[i]; i++)
        cr_expect_not_null(strstr(log, lines[i]), "the log lacks %s:\n%s", lines[i], log);
    size_t tail = strlen("srun: error: node2: task 0: Killed");
    cr_expect(len >= tail && !memcmp(log + len - tail, "srun: error: node2: task 0: Killed", tail),
              "the unfinished last line is not at the log's end:\n%s", log);
    free(log);
    /* The reason for the outcome: the last line that says more than the exit
     * status (not "Exited with exit code", not srun's "Job step aborted"). */
    char line[DK_JOB_LAUNCHER_LINE_MAX];
    dk_job_rank_launcher_line(job, 0, line, sizeof line);
    cr_expect_str_eq(line, "srun: error: node2: task 0: Killed");
    finish(&job);
}

/* The same bytes from a rank on this node (no launcher) are its own output,
 * passed on as read: a local rank keeps its byte path. */
Test(tcp, a_local_ranks_srun_like_lines_are_its_own_output, .timeout = 60)
{
    dk_job_t *job = run_noise(false);
    pthread_mutex_lock(&rec.lock);
    const char *err = rec.out[0][2].buf ? rec.out[0][2].buf : "";
    cr_expect_not_null(strstr(err, "srun: error: node2: task 0: Exited with exit code 1\n"), "%s",
                       err);
    cr_expect_not_null(strstr(err, "slurmstepd-node2: error: *** STEP 12.3"), "%s", err);
    cr_expect_not_null(strstr(err, "srun: error: node2: task 0: Killed"), "%s", err);
    pthread_mutex_unlock(&rec.lock);
    char line[DK_JOB_LAUNCHER_LINE_MAX] = "x";
    dk_job_rank_launcher_line(job, 0, line, sizeof line);
    cr_expect_str_eq(line, "");
    finish(&job);
}

/* A launched rank is told the host's working directory (DISTKERNEL_CWD), to
 * go there where its node has it; a local rank starts there already. */
Test(tcp, a_launched_rank_is_told_the_hosts_folder, .timeout = 60)
{
    static const char *const *cmds[2] = {noise_cmd, NULL};
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.rank_commands = cmds;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    char here[4096];
    cr_assert_not_null(getcwd(here, sizeof here));
    cr_expect_str_eq(env_of(0, "DISTKERNEL_CWD"), here);
    cr_expect_str_eq(env_of(1, "DISTKERNEL_CWD"), "(unset)", "a local rank was told a folder");
    finish(&job);
}
