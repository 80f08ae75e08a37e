/*
 * Running a job of rank processes on this host (runtime/launch/dk_job.h),
 * with fake_rank as the rank executable (job_fixture.h): results, the torch
 * environment, failures and their root cause, the stop ladder, the back
 * channel's refusals, output and its logs, descriptors, persistent jobs;
 * and the Python rank side's frame limits. The back channel over TCP is
 * test_job_tcp.c's; node agents and the ranks' stacks, test_job_agents.c's;
 * runs over TCP whose ranks node agents start, test_job_agents_tcp.c's.
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

/* ------------------------------------------------------------------------ */
/* Results                                                                   */

Test(job, all_ranks_return_results_and_a_large_payload_arrives_intact, .timeout = 60)
{
    size_t len = 50u << 20;
    unsigned char *payload = malloc(len);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        payload[i] = (unsigned char) x;
    }
    char digest[65];
    sha256_hex(payload, len, digest);

    dk_job_spec_t spec = spec_for(4, NULL);
    spec.payload = payload;
    spec.payload_len = len;
    dk_job_t *job = start(&spec);
    free(payload);                  /* the job made its own copy */
    cr_assert(dk_job_wait(job, 50000));

    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(dk_job_root_cause(job), -1);
    for (int r = 0; r < 4; r++) {
        char expected[160];
        snprintf(expected, sizeof expected, "rank=%d len=%zu sha256=%s", r, len, digest);
        cr_assert_eq(rec.nmsg[r], 1);
        cr_assert_not(rec.msg_error[r]);
        cr_assert_str_eq(rec.msg[r].buf, expected);
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
        cr_assert_eq(dk_job_rank_exit_code(job, r), 0);
        cr_assert_eq(dk_job_rank_signal(job, r), 0);
    }
    finish(&job);
}

Test(job, each_rank_goes_starting_running_done)
{
    dk_job_t *job = run(2, NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(rec.nstates[r], 3);
        cr_assert_eq(rec.states[r][0], DK_RANK_STARTING);
        cr_assert_eq(rec.states[r][1], DK_RANK_RUNNING);
        cr_assert_eq(rec.states[r][2], DK_RANK_DONE);
        cr_assert_eq(rec.state_code[r], 0);
    }
    finish(&job);
}

Test(job, an_empty_payload_is_delivered)
{
    dk_job_t *job = run(1, NULL);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(strstr(rec.msg[0].buf, "len=0 sha256=e3b0c442") != NULL);
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* How ranks are started                                                     */

Test(job, ranks_get_the_torch_distributed_environment)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", "FAKE_EXTRA=kept", "RANK=99", NULL};
    dk_job_t *job = run(3, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    char port[16], run_id[64];
    snprintf(port, sizeof port, "%d", dk_job_master_port(job));
    snprintf(run_id, sizeof run_id, "%s", env_of(0, "TORCHELASTIC_RUN_ID"));
    cr_assert_eq(strlen(run_id), 32);
    cr_assert_eq(strspn(run_id, "0123456789abcdef"), 32);
    for (int r = 0; r < 3; r++) {
        char rs[8], log[512];
        snprintf(rs, sizeof rs, "%d", r);
        snprintf(log, sizeof log, "%s/rank-%d.log", log_dir, r);
        cr_assert_str_eq(env_of(r, "RANK"), rs);
        cr_assert_str_eq(env_of(r, "LOCAL_RANK"), rs);
        cr_assert_str_eq(env_of(r, "ROLE_RANK"), rs);
        cr_assert_str_eq(env_of(r, "WORLD_SIZE"), "3");
        cr_assert_str_eq(env_of(r, "LOCAL_WORLD_SIZE"), "3");
        cr_assert_str_eq(env_of(r, "ROLE_WORLD_SIZE"), "3");
        cr_assert_str_eq(env_of(r, "GROUP_RANK"), "0");
        cr_assert_str_eq(env_of(r, "NODE_RANK"), "0");
        cr_assert_str_eq(env_of(r, "GROUP_WORLD_SIZE"), "1");
        cr_assert_str_eq(env_of(r, "ROLE_NAME"), "default");
        cr_assert_str_eq(env_of(r, "MASTER_ADDR"), "127.0.0.1");
        cr_assert_str_eq(env_of(r, "MASTER_PORT"), port);
        cr_assert_str_eq(env_of(r, "TORCHELASTIC_RUN_ID"), run_id);
        cr_assert_str_eq(env_of(r, "TORCHELASTIC_RESTART_COUNT"), "0");
        cr_assert_str_eq(env_of(r, "TORCHELASTIC_MAX_RESTARTS"), "0");
        cr_assert_str_eq(env_of(r, "OMP_NUM_THREADS"), "1");
        cr_assert_str_eq(env_of(r, "DISTKERNEL_LOG"), log);
        cr_assert_str_eq(env_of(r, "FAKE_EXTRA"), "kept");
        cr_assert(strstr(rec.out[r][1].buf, "KEYLEN 64\n") != NULL);
    }
    cr_assert_gt(dk_job_master_port(job), 0);
    finish(&job);
}

Test(job, ranks_spread_over_nodes_get_their_node_and_local_rank_and_the_given_store)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = spec_for(6, extra);
    spec.ranks_per_node = 3;
    spec.master_addr = "10.9.8.7";
    spec.master_port = 29123;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(dk_job_master_port(job), 29123);
    for (int r = 0; r < 6; r++) {
        char rs[8], local[8], node[8];
        snprintf(rs, sizeof rs, "%d", r);
        snprintf(local, sizeof local, "%d", r % 3);
        snprintf(node, sizeof node, "%d", r / 3);
        cr_assert_str_eq(env_of(r, "RANK"), rs);
        cr_assert_str_eq(env_of(r, "LOCAL_RANK"), local);
        cr_assert_str_eq(env_of(r, "LOCAL_WORLD_SIZE"), "3");
        cr_assert_str_eq(env_of(r, "GROUP_RANK"), node);
        cr_assert_str_eq(env_of(r, "NODE_RANK"), node);
        cr_assert_str_eq(env_of(r, "GROUP_WORLD_SIZE"), "2");
        cr_assert_str_eq(env_of(r, "WORLD_SIZE"), "6");
        cr_assert_str_eq(env_of(r, "ROLE_WORLD_SIZE"), "6");
        cr_assert_str_eq(env_of(r, "MASTER_ADDR"), "10.9.8.7");
        cr_assert_str_eq(env_of(r, "MASTER_PORT"), "29123");
    }
    finish(&job);
}

Test(job, ranks_per_node_must_divide_the_world)
{
    dk_job_spec_t spec = spec_for(4, NULL);
    spec.ranks_per_node = 3;
    char err[512] = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "ranks_per_node is 3; it must divide world_size (4)"), "%s", err);
    spec.ranks_per_node = 2;
    spec.master_addr = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "master_addr"), "%s", err);
    spec.master_addr = NULL;
    spec.master_port = 70000;
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "master_port is 70000"), "%s", err);
    dk_job_t *none = NULL;
    finish(&none);
}

Test(job, omp_num_threads_is_kept_when_the_host_sets_it)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", "OMP_NUM_THREADS=7", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_str_eq(env_of(0, "OMP_NUM_THREADS"), "7");
    finish(&job);
}

Test(job, a_rank_starts_with_only_stdio_open_default_signals_and_its_own_group)
{
    /* Give the host state a rank must not inherit: a blocked and an ignored
     * signal, and a descriptor without close-on-exec. */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    signal(SIGUSR2, SIG_IGN);
    int stray = open("/dev/null", O_RDONLY);
    cr_assert_geq(stray, 0);

    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_t *job = run(1, extra);
    const char *out = rec.out[0][1].buf;
    cr_assert(strstr(out, "FDS 0 1 2\n") != NULL, "%s", out);
    cr_assert(strstr(out, "STDIN /dev/null\n") != NULL, "%s", out);
    cr_assert(strstr(out, "SigBlk:\t0000000000000000\n") != NULL, "%s", out);
    cr_assert(strstr(out, "SigIgn:\t0000000000000000\n") != NULL, "%s", out);
    char pg[64];
    snprintf(pg, sizeof pg, "PGID %d PID %d\n", dk_job_rank_pid(job, 0), dk_job_rank_pid(job, 0));
    cr_assert(strstr(out, pg) != NULL, "%s", out);
    close(stray);
    finish(&job);
}

Test(job, a_missing_executable_is_an_error_and_starts_nothing)
{
    int before = count_fds();
    dk_job_spec_t spec = spec_for(2, NULL);
    spec.rank_exe = "/nonexistent/rank";
    char err[512] = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "/nonexistent/rank") && strstr(err, "No such file"), "%s", err);
    cr_assert_eq(count_fds(), before);
    remove_dir(log_dir);
}

Test(job, a_bad_description_is_an_error)
{
    char err[512] = "";
    dk_job_spec_t spec = {.world_size = 0, .rank_exe = FAKE_RANK};
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "world_size") != NULL, "%s", err);

    static const char byte = 0;
    spec.world_size = 1;
    spec.payload = &byte;
    spec.payload_len = (size_t) 2 << 30;
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "1 GiB") != NULL, "%s", err);
}

Test(job, two_jobs_at_once_get_different_master_ports)
{
    dk_job_spec_t spec = spec_for(1, NULL);
    dk_job_t *a = start(&spec);
    dk_job_t *b = start(&spec);
    cr_assert_neq(dk_job_master_port(a), dk_job_master_port(b));
    cr_assert(dk_job_wait(a, 20000));
    cr_assert(dk_job_wait(b, 20000));
    dk_job_destroy(&a);
    finish(&b);
}

/* ------------------------------------------------------------------------ */
/* Failures                                                                  */

Test(job, an_error_on_one_rank_is_the_root_cause_and_the_others_are_stopped)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_1=error", NULL};
    dk_job_t *job = run(3, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(rec.msg_error[1]);
    cr_assert_str_eq(rec.msg[1].buf, "boom on rank 1");
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 1);
    for (int r = 0; r < 3; r += 2) {
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED);
        cr_assert_eq(dk_job_rank_signal(job, r), SIGINT);
        cr_assert_eq(rec.states[r][rec.nstates[r] - 1], DK_RANK_STOPPED);
    }
    finish(&job);
}

/* A peer that exits on its own while unanswered failed before the rank whose
 * error came first (it likely only saw the peer go). But a peer that is
 * exiting because it finished sent its RESULT first: when that RESULT waits
 * in the socket behind the error, the peer is not the root cause. Here the
 * runtime's thread is held while rank 0 sends its RESULT and starts exiting
 * and rank 1 sends its ERROR, so the next turn finds both frames, rank 1's
 * (connected first) ahead. */
Test(job, a_peer_exiting_after_its_result_is_not_taken_for_the_root_cause)
{
    char dir[] = "/tmp/dk-test-sync-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char sync[600];
    snprintf(sync, sizeof sync, "FAKE_SYNC=%s", dir);
    hold_dir = dir;
    const char *extra[] = {"FAKE_MODE_0=exiting_result", "FAKE_MODE_1=error_synced", sync,
                           NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 0);
    cr_assert_str_eq(rec.msg[0].buf, "done");
    finish(&job);
    hold_dir = NULL;
    remove_dir(dir);
}

Test(job, a_non_zero_exit_is_a_failure_with_its_code)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_0=exit3", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 3);
    cr_assert_eq(dk_job_rank_signal(job, 0), 0);
    cr_assert_eq(rec.state_code[0], 3);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    finish(&job);
}

/* The kernel tells "exited during start-up, before it received the cell" from
 * "exited before returning a result" by whether the rank was ever RUNNING: a rank
 * that never got its payload must never be reported RUNNING. */
Test(job, a_rank_exiting_before_it_connects_is_never_running)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_1=exit3_at_start", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 3);
    cr_assert_eq(rec.nstates[1], 2);
    cr_assert_eq(rec.states[1][0], DK_RANK_STARTING);
    cr_assert_eq(rec.states[1][1], DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    finish(&job);
}

/* On this node a killed rank's sockets close at once, but the process the
 * runtime reaps for it (a warm rank's launcher) ends a moment later; its
 * peer's "Connection closed by peer", which arrives in between, is its echo
 * and waits for it: rank 1, which closed its connection and died without a
 * word, is the root cause (seen in a full run with a rank SIGKILLed in
 * all_reduce, whose peer was blamed). */
Test(job, a_peers_connection_error_here_waits_for_the_rank_it_echoes)
{
    const char *extra[] = {"FAKE_MODE_0=echo_error", "FAKE_MODE_1=close_hang", "FAKE_SLEEP_S=1",
                           NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 3);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    finish(&job);
}

Test(job, a_crash_is_reported_with_its_signal)
{
    const char *extra[] = {"FAKE_MODE=segv", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), -1);
    cr_assert_eq(dk_job_rank_signal(job, 0), SIGSEGV);
    cr_assert_eq(rec.state_code[0], -1);
    cr_assert_eq(rec.state_signal[0], SIGSEGV);
    finish(&job);
}

Test(job, exiting_without_a_result_is_a_failure)
{
    const char *extra[] = {"FAKE_MODE=no_result", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 0);
    cr_assert_eq(rec.nmsg[0], 0);
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* Ending ranks                                                              */

Test(job, cancel_stops_every_rank)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    dk_job_t *job = start(&spec);
    wait_output(0, "sleeping");
    wait_output(1, "sleeping");
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    cr_assert_not(dk_job_wait(job, 50), "the job ended by itself");
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    cr_assert_eq(dk_job_root_cause(job), -1);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED);
        cr_assert_eq(dk_job_rank_signal(job, r), SIGINT);
    }
    finish(&job);
}

Test(job, cancel_after_the_end_changes_nothing)
{
    dk_job_t *job = run(1, NULL);
    dk_job_cancel(job);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE);
    finish(&job);
}

Test(job, ranks_that_answer_sigint_with_an_error_are_stopped_not_failed)
{
    const char *extra[] = {"FAKE_MODE=interruptible", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    dk_job_t *job = start(&spec);
    wait_output(0, "sleeping");
    wait_output(1, "sleeping");
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    cr_assert_eq(dk_job_root_cause(job), -1);
    for (int r = 0; r < 2; r++) {
        cr_assert(rec.msg_error[r]);
        cr_assert_str_eq(rec.msg[r].buf, "KeyboardInterrupt");
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED);
        cr_assert_eq(dk_job_rank_exit_code(job, r), 1);
    }
    finish(&job);
}

Test(job, a_rank_that_ignores_sigint_and_sigterm_is_killed_within_three_graces)
{
    const char *extra[] = {"FAKE_MODE=ignore_signals", NULL};
    dk_job_spec_t spec = spec_for(1, extra);
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    wait_output(0, "sleeping");
    double t0 = now_s();
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 20000));
    double took = now_s() - t0;
    cr_assert_geq(took, 2 * FAST_GRACE - 0.05, "SIGKILL came early: %.3f s", took);
    cr_assert_lt(took, 3 * FAST_GRACE, "the job took %.3f s to end", took);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    cr_assert_eq(dk_job_rank_signal(job, 0), SIGKILL);
    finish(&job);
}

Test(job, a_failure_kills_a_rank_that_ignores_signals)
{
    /* Rank 1 ignores the stop signals; rank 0 fails as soon as it has its
     * payload, perhaps before rank 1 has started: either way the job ends. */
    const char *extra[] = {"FAKE_MODE_0=error", "FAKE_MODE_1=ignore_signals", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_lt(now_s() - rec.first_error_at, 3 * FAST_GRACE + 0.2);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    finish(&job);
}

Test(job, a_rank_that_hangs_after_its_error_is_terminated_not_interrupted)
{
    /* SIGINT is for ranks still running code; one that has reported is given
     * the grace to exit and then SIGTERM. */
    const char *extra[] = {"FAKE_MODE=error_hang", NULL};
    dk_job_spec_t spec = spec_for(1, extra);
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_lt(now_s() - rec.first_error_at, 2 * FAST_GRACE);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_signal(job, 0), SIGTERM);
    finish(&job);
}

Test(job, the_timeout_stops_every_rank)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.timeout_s = 0.5;
    double t0 = now_s();
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_geq(now_s() - t0, 0.5);
    cr_assert_eq(dk_job_end(job), DK_END_TIMEOUT);
    cr_assert_eq(dk_job_root_cause(job), -1);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED, "rank %d: state %d code %d",
                     r, dk_job_rank_state(job, r), dk_job_rank_exit_code(job, r));
    finish(&job);
}

Test(job, destroy_leaves_no_rank_process_behind)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(3, extra);
    dk_job_t *job = start(&spec);
    int pids[3];
    for (int r = 0; r < 3; r++)
        pids[r] = dk_job_rank_pid(job, r);
    finish(&job);
    cr_assert_null(job);
    for (int r = 0; r < 3; r++) {
        errno = 0;
        cr_assert_eq(kill(pids[r], 0), -1);
        cr_assert_eq(errno, ESRCH, "rank %d (pid %d) is still there", r, pids[r]);
    }
}

/* PID has exited (gone, or a zombie nobody has collected yet). */
static bool process_ended(int pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return true;
    char path[64], stat[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *paren = strrchr(stat, ')');
    return paren && paren[1] == ' ' && paren[2] == 'Z';
}

Test(job, ranks_die_with_their_host)
{
    /* The host is killed before it can clean up: give it a TMPDIR to remove. */
    make_log_dir();
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s/tmp", log_dir);
    cr_assert_eq(mkdir(tmp, 0700), 0);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t host = fork();
    if (host == 0) {
        close(p[0]);
        setenv("TMPDIR", tmp, 1);
        const char *extra[] = {"FAKE_MODE=sleep", NULL};
        dk_job_spec_t spec = spec_for(2, extra);
        dk_job_t *job = start(&spec);
        wait_output(0, "sleeping");
        wait_output(1, "sleeping");
        int pids[2] = {dk_job_rank_pid(job, 0), dk_job_rank_pid(job, 1)};
        if (write(p[1], pids, sizeof pids) != sizeof pids)
            _exit(1);
        for (;;)
            pause();
    }
    close(p[1]);
    int pids[2];
    cr_assert_eq(read(p[0], pids, sizeof pids), (ssize_t) sizeof pids);
    close(p[0]);
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 500 && !process_ended(pids[r]); i++)
            usleep(10000);
        cr_assert(process_ended(pids[r]), "rank %d (pid %d) outlived its host", r, pids[r]);
    }
    DIR *d = opendir(tmp);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
        if (e->d_name[0] != '.')
            remove_dir(path);       /* the back-channel directory and its socket */
    }
    if (d)
        closedir(d);
    rmdir(tmp);
    remove_dir(log_dir);
}

/* A rank that exits leaving a child running (in its process group): the child
 * ends with it, and does not hold the job. */
Test(job, a_child_a_rank_leaves_running_ends_with_the_rank)
{
    const char *extra[] = {"FAKE_MODE=grandchild", NULL};
    double t0 = now_s();
    dk_job_t *job = run(1, extra);
    cr_assert_lt(now_s() - t0, 5.0);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE);
    const char *at = strstr(rec.out[0][1].buf, "GRANDCHILD ");
    cr_assert_not_null(at);
    pid_t child = (pid_t) atoi(at + strlen("GRANDCHILD "));
    bool gone = false;
    for (int i = 0; i < 200 && !gone; i++) {
        gone = process_ended((int) child);
        if (!gone)
            usleep(10000);
    }
    if (!gone)
        kill(child, SIGKILL);
    cr_assert(gone, "the rank's child %d outlived it", (int) child);
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* The back channel                                                          */

Test(job, a_forged_mac_is_refused_with_a_warning_and_the_job_completes)
{
    const char *extra[] = {"FAKE_MODE_0=forge_mac", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(0, 1, "refused as expected"));
    cr_assert(warned("did not verify"));
    finish(&job);
}

/* Rank 1 connects late: the listener closes once every rank is in, and the
 * second HELLO must reach it while it is open. */
Test(job, a_second_hello_for_a_connected_rank_is_refused)
{
    const char *extra[] = {"FAKE_MODE_0=duplicate_hello", "FAKE_CONNECT_DELAY_MS_1=1500", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(0, 1, "refused as expected"));
    cr_assert(warned("already connected"));
    finish(&job);
}

Test(job, a_hello_for_a_rank_outside_the_job_is_refused)
{
    const char *extra[] = {"FAKE_MODE=bad_rank", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(warned("named rank 2, but this job has ranks 0 to 1"));
    finish(&job);
}

/* Finding 6 of issue 11: connections that never say HELLO (more than there are
 * pending slots) neither keep a rank out nor stay past the deadline. */
Test(job, idle_connections_without_hello_do_not_fail_the_job_and_are_closed, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_0=idle_hello", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK, "%s", rec.nwarnings ? rec.warnings[0] : "");
    cr_assert(output_has(0, 1, "idle closed after"), "the idle connection was not closed");
    /* They were closed when every rank was in (issue 21 item 4), or when
     * a rank's connection needed a slot. */
    cr_assert(warned("every rank is in and it had not said HELLO") ||
              warned("every slot was wanted"), "%s", rec.nwarnings ? rec.warnings[0] : "");
    finish(&job);
}

/* Finding 5 of issue 11: a job that cannot have its descriptors is refused
 * before anything starts, with what it needs and what is free. */
Test(job, a_job_that_would_run_out_of_descriptors_is_refused_up_front)
{
    struct rlimit rl = {256, 256};
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    int before = count_fds();
    dk_job_spec_t spec = spec_for(100, NULL);
    char err[512] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    cr_assert_null(job);
    char need[64];
    snprintf(need, sizeof need, "100 ranks need %zu file descriptors", dk_fdlimit_job_need(100));
    cr_assert(strstr(err, need), "%s", err);
    cr_assert(strstr(err, "of its limit of 256 are free"), "%s", err);
    cr_assert(strstr(err, "ulimit -Hn"), "%s", err);
    cr_assert_eq(count_fds(), before, "a refused job left descriptors open");
    /* What the message says fits does fit. */
    const char *use = strstr(err, "Use at most ");
    cr_assert_not_null(use);
    int fit = atoi(use + strlen("Use at most "));
    cr_assert_gt(fit, 1);
    finish(&job);
    /* The recorder keeps MAXR ranks: lower the limit so that is what fits. */
    rl.rlim_cur = rl.rlim_max = (rlim_t) (count_fds() + dk_fdlimit_job_need(MAXR) + 2);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    spec = spec_for(MAXR + 1, NULL);
    job = dk_job_start(&spec, &sink, err, sizeof err);
    cr_assert_null(job);
    fit = atoi(strstr(err, "Use at most ") + strlen("Use at most "));
    cr_assert_eq(fit, MAXR, "%s", err);
    finish(&job);
    spec = spec_for(fit, NULL);
    job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    finish(&job);
}

Test(job, an_oversized_frame_is_refused_before_it_is_read)
{
    const char *extra[] = {"FAKE_MODE=oversize", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert(warned("outside the protocol's limits"));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    finish(&job);
}

Test(job, the_socket_directory_is_removed)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_t *job = run(1, extra);
    char path[512];
    snprintf(path, sizeof path, "%s", env_of(0, "DISTKERNEL_BC"));
    struct stat st;
    char *slash = strrchr(path, '/');
    *slash = '\0';
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    finish(&job);
    cr_assert_eq(stat(path, &st), -1, "%s is still there", path);
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

/* Every "TAG i" line of TEXT, in order, is numbered 0..N-1. */
static void expect_numbered(const char *text, const char *tag, int n)
{
    int next = 0;
    size_t tlen = strlen(tag);
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        cr_assert_not_null(end);
        if (strncmp(line, tag, tlen) == 0 && line[tlen] == ' ') {
            cr_assert_eq(atoi(line + tlen + 1), next, "expected %s %d, found %.*s", tag, next,
                         (int) (end - line), line);
            next++;
        }
        line = end + 1;
    }
    cr_assert_eq(next, n);
}


Test(job, output_is_relayed_in_order_and_kept_in_the_log)
{
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=5000", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        expect_numbered(rec.out[r][1].buf, "out", 5000);
        expect_numbered(rec.out[r][2].buf, "err", 5000);
        char path[512];
        snprintf(path, sizeof path, "%s/rank-%d.log", dk_job_log_dir(job), r);
        size_t len;
        char *log = read_file(path, &len);
        cr_assert_eq(len, rec.out[r][1].len + rec.out[r][2].len);
        expect_numbered(log, "out", 5000);
        expect_numbered(log, "err", 5000);
        free(log);
    }
    finish(&job);
}

/* A rank that wrote a line and went quiet: the sink hears that everything it
 * wrote has been passed on (what tells a rank's unfinished line from one still
 * in the pipe). */
Test(job, a_quiet_rank_is_reported_caught_up_after_its_output)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_SLEEP_S=1", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_str_eq(rec.out[0][1].buf, "sleeping\n");
    cr_assert_gt(rec.ncaught_up[0][1], 0, "never told the output of rank 0 was all passed on");
    cr_assert_eq(rec.caught_up_at_len[0][1], strlen("sleeping\n"),
                 "caught up at %zu bytes, before the rank's line", rec.caught_up_at_len[0][1]);
    finish(&job);
}

/* A file size limit stands in for a full disk: writes fail the same way. */
Test(job, a_log_that_cannot_be_written_is_reported_once_and_output_still_flows)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {4096, 4096};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=2000", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    expect_numbered(rec.out[0][1].buf, "out", 2000);
    expect_numbered(rec.out[0][2].buf, "err", 2000);
    cr_assert_eq(rec.nwarnings, 1);
    cr_assert(warned("rank 0's log file") && warned(strerror(EFBIG)), "%s", rec.warnings[0]);
    cr_assert(!dk_job_rank_log_complete(job, 0));
    finish(&job);
}

/* A rank-N.log planted in the log directory (a symlink to a file of the user)
 * is replaced, never written through. */
Test(job, a_planted_log_symlink_is_replaced_not_followed)
{
    make_log_dir();
    char victim[512], link[512];
    snprintf(victim, sizeof victim, "%s/victim", log_dir);
    FILE *f = fopen(victim, "w");
    fputs("precious\n", f);
    fclose(f);
    snprintf(link, sizeof link, "%s/rank-0.log", log_dir);
    cr_assert_eq(symlink(victim, link), 0);
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=20", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    size_t len;
    char *text = read_file(victim, &len);
    cr_assert_str_eq(text, "precious\n");
    free(text);
    struct stat st;
    cr_assert(lstat(link, &st) == 0 && S_ISREG(st.st_mode));
    unlink(victim);
    finish(&job);
}

/* Past its cap a rank's log keeps head and tail, and the sink is told once. */
Test(job, a_log_past_its_cap_keeps_head_and_tail_and_the_sink_is_told)
{
    make_log_dir();
    dk_job_spec_t spec = spec_for(1, (const char *[]){"FAKE_MODE=print_lots", "FAKE_LINES=20000",
                                                      NULL});
    spec.log_cap = 64 << 10;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    expect_numbered(rec.out[0][1].buf, "out", 20000);
    cr_assert_eq(rec.nwarnings, 1);
    cr_assert(warned("passed its log cap of 65536 bytes"), "%s", rec.warnings[0]);
    char path[512];
    snprintf(path, sizeof path, "%s/rank-0.log", log_dir);
    size_t len;
    char *text = read_file(path, &len);
    cr_assert_leq(len, (64 << 10) + 512);
    cr_assert_not_null(strstr(text, "bytes of output left out here"));
    free(text);
    finish(&job);
}

/* Six ranks pass the cap: four are told one by one, then one line for the rest. */
Test(job, past_four_ranks_one_line_tells_of_the_others_past_the_log_cap, .timeout = 60)
{
    make_log_dir();
    dk_job_spec_t spec = spec_for(6, (const char *[]){"FAKE_MODE=print_lots", "FAKE_LINES=4000",
                                                      NULL});
    spec.log_cap = 16 << 10;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(warned_times("passed its log cap of 16384 bytes"), 4);
    cr_assert_eq(warned_times("more ranks' output passed the log cap"), 1);
    cr_assert_eq(rec.nwarnings, 5);
    finish(&job);
}

Test(job, without_a_log_dir_logs_go_to_a_fresh_directory)
{
    dk_job_spec_t spec = spec_for(1, NULL);
    spec.log_dir = NULL;
    char state[] = "/tmp/dk-test-state-XXXXXX";
    cr_assert_not_null(mkdtemp(state));
    unsetenv("DISTKERNEL_LOG_DIR");
    setenv("XDG_STATE_HOME", state, 1);
    remove_dir(log_dir);
    log_dir[0] = '\0';
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    char path[512];
    snprintf(path, sizeof path, "%s/rank-0.log", dk_job_log_dir(job));
    cr_assert_eq(access(path, F_OK), 0);
    char want[256];
    snprintf(want, sizeof want, "%s/distkernel/logs/kernel-%d/run-", state, (int) getpid());
    cr_assert(strncmp(dk_job_log_dir(job), want, strlen(want)) == 0, "%s", dk_job_log_dir(job));
    finish(&job);
    int tmp = open("/tmp", O_RDONLY | O_DIRECTORY);
    dk_logdir_remove(tmp, state + 5);
    close(tmp);
}

/* ------------------------------------------------------------------------ */
/* Resources                                                                 */

Test(job, no_descriptor_is_leaked)
{
    int before = count_fds();
    const char *extra[] = {"FAKE_MODE_0=forge_mac", "FAKE_MODE_1=print_lots", NULL};
    dk_job_t *job = run(3, extra);
    finish(&job);

    const char *sleepers[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(2, sleepers);
    job = start(&spec);
    finish(&job);           /* destroyed while running */
    cr_assert_eq(count_fds(), before);
}

/* The back channel's socket directory is made only where nobody else can swap
 * it: a TMPDIR writable by others (and not sticky) gives way to a fresh
 * folder under /tmp, and the job runs (issue 38, item 3). */
Test(job, a_tmpdir_others_can_write_gives_way_to_tmp_for_the_back_channel)
{
    char open_dir[] = "/tmp/dk-test-open-XXXXXX";
    cr_assert_not_null(mkdtemp(open_dir));
    cr_assert_eq(chmod(open_dir, 0777), 0);
    setenv("TMPDIR", open_dir, 1);
    dk_job_spec_t spec = spec_for(1, NULL);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    finish(&job);
    unsetenv("TMPDIR");
    cr_assert_eq(rmdir(open_dir), 0, "something was made in the open TMPDIR: %s",
                 strerror(errno));
}

/* ------------------------------------------------------------------------ */
/* Persistent jobs: rounds on ranks that stay                                */

static dk_job_t *start_persistent(int world_size, double idle_timeout_s)
{
    const char *extra[] = {"FAKE_MODE=rounds", NULL};
    dk_job_spec_t spec = spec_for(world_size, extra);
    spec.persistent = true;
    spec.idle_timeout_s = idle_timeout_s;
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_round_wait(job, 20000), "the ranks never all said HELLO");
    cr_assert_eq(dk_job_round_end(job), DK_END_OK);
    return job;
}

/* Submit ACTION as the next round and wait for it to end. */
static dk_job_end_t round_of(dk_job_t *job, const char *action)
{
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, action, strlen(action), 0, err, sizeof err), 0, "%s", err);
    cr_assert(dk_job_round_wait(job, 20000), "the round did not end");
    return dk_job_round_end(job);
}

Test(job, a_persistent_job_runs_rounds_on_the_same_ranks)
{
    dk_job_t *job = start_persistent(2, 0);
    int pids[2] = {dk_job_rank_pid(job, 0), dk_job_rank_pid(job, 1)};
    for (int round = 1; round <= 3; round++) {
        cr_assert_eq(round_of(job, "result"), DK_END_OK);
        for (int r = 0; r < 2; r++) {
            char expected[64];
            snprintf(expected, sizeof expected, "round=%d rank=%d", round, r);
            cr_assert_str_eq(rec.msg[r].buf, expected);
            cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
            cr_assert_eq(dk_job_rank_pid(job, r), pids[r]);
        }
    }
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    /* A second submit while a round runs is refused. */
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "sleep", 5, 0, err, sizeof err), 0);
    wait_output(0, "sleeping 4");
    cr_assert_eq(dk_job_submit(job, "result", 6, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "still running"), "%s", err);
    dk_job_interrupt(job);
    cr_assert(dk_job_round_wait(job, 20000));
    cr_assert_eq(dk_job_round_end(job), DK_END_CANCELLED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    cr_assert_str_eq(rec.msg[1].buf, "round=5 rank=1");
    finish(&job);
    cr_assert_eq(kill(pids[0], 0), -1, "rank 0 outlived its job");
}

Test(job, an_error_ends_the_round_not_the_job)
{
    dk_job_t *job = start_persistent(2, 0);
    cr_assert_eq(round_of(job, "error@1"), DK_END_FAILED);
    cr_assert_eq(dk_job_round_root_cause(job), 1);
    cr_assert(rec.msg_error[1]);
    cr_assert_str_eq(rec.msg[1].buf, "boom in round 1 on rank 1");
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    finish(&job);
}

Test(job, a_rank_that_exits_ends_every_rank_with_it_as_root_cause)
{
    dk_job_t *job = start_persistent(2, 0);
    cr_assert_eq(round_of(job, "exit3@0"), DK_END_FAILED);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 3);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "result", 6, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "ended"), "%s", err);
    finish(&job);
}

Test(job, a_rank_stuck_after_an_interrupt_ends_the_job_after_the_grace)
{
    dk_job_t *job = start_persistent(2, 0);
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "stuck@1", 7, 0, err, sizeof err), 0);
    wait_output(1, "stuck 1");
    double t0 = now_s();
    dk_job_interrupt(job);
    cr_assert(dk_job_round_wait(job, 20000));
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_geq(now_s() - t0, FAST_GRACE - 0.05);
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    cr_assert_eq(dk_job_round_end(job), DK_END_CANCELLED);
    cr_assert(warned("did not return to the prompt"));
    finish(&job);
}

Test(job, the_round_timeout_interrupts_and_keeps_the_ranks)
{
    dk_job_t *job = start_persistent(2, 0);
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "sleep", 5, 1.0, err, sizeof err), 0, "%s", err);
    cr_assert(dk_job_round_wait(job, 20000));
    cr_assert_eq(dk_job_round_end(job), DK_END_TIMEOUT);
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    finish(&job);
}

/* An interrupt that comes before the ranks have read their task is not lost
 * (they ignore SIGINT between tasks): it is sent again until they answer, and
 * the round ends interrupted with the ranks kept, not as stuck ranks. */
Test(job, an_interrupt_right_after_a_submit_reaches_the_ranks)
{
    dk_job_t *job = start_persistent(2, 0);
    for (int i = 0; i < 5; i++) {
        char err[256] = "";
        cr_assert_eq(dk_job_submit(job, "sleep", 5, 0, err, sizeof err), 0, "%s", err);
        dk_job_interrupt(job);
        cr_assert(dk_job_round_wait(job, 20000));
        cr_assert_eq(dk_job_round_end(job), DK_END_CANCELLED);
        cr_assert_eq(dk_job_end(job), DK_END_NONE, "the ranks were ended (round %d)", i);
        cr_assert_not(warned("did not return to the prompt"));
    }
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    finish(&job);
}

Test(job, an_idle_persistent_job_ends_after_its_idle_timeout)
{
    dk_job_t *job = start_persistent(2, 3);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    cr_assert(dk_job_wait(job, 20000), "the idle job never ended");
    cr_assert_eq(dk_job_end(job), DK_END_IDLE);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED, "rank %d: state %d code %d",
                     r, dk_job_rank_state(job, r), dk_job_rank_exit_code(job, r));
    finish(&job);
}

Test(job, an_answer_naming_another_round_closes_the_connection)
{
    dk_job_t *job = start_persistent(2, 0);
    cr_assert_neq(round_of(job, "bad_round@1"), DK_END_OK);
    cr_assert(warned("did not name the current round"));
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    finish(&job);
}

/* The state letter of PID in /proc/PID/stat, '?' when unreadable. */
static char proc_state(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

/* A SIGKILLed rank's main thread is a zombie before its other threads have
 * ended; waitid and the runtime thread see the process exit only after the
 * last. The look before a cell is sent must count it already: a user who saw
 * the rank die (ps shows it <defunct>) gets "the ranks are gone", not a cell
 * that fails as if it had killed the rank. */
Test(job, a_rank_whose_main_thread_is_a_zombie_counts_as_exited)
{
    dk_job_t *job = start_persistent(2, 0);
    cr_assert_not(dk_job_any_rank_exited(job));
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "leader_exit@1", 13, 0, err, sizeof err), 0, "%s", err);
    wait_output(1, "leader exiting 1");
    int pid = dk_job_rank_pid(job, 1);
    for (int i = 0; i < 500 && proc_state(pid) != 'Z'; i++)
        usleep(10 * 1000);
    cr_assert_eq(proc_state(pid), 'Z', "rank 1's main thread did not end");
    siginfo_t si;
    memset(&si, 0, sizeof si);
    cr_assert_eq(waitid(P_PID, (id_t) pid, &si, WEXITED | WNOHANG | WNOWAIT), 0);
    cr_assert_eq(si.si_pid, 0, "the process was collectable: the test shows nothing");
    cr_assert(dk_job_any_rank_exited(job));
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    finish(&job);
}

Test(job, each_round_can_have_its_own_log_dir)
{
    dk_job_t *job = start_persistent(1, 0);
    char dir2[300], err[256] = "";
    snprintf(dir2, sizeof dir2, "%s-2", log_dir);
    cr_assert_eq(dk_job_set_log_dir(job, dir2, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(dk_job_log_dir(job), dir2);
    cr_assert_eq(dk_job_submit(job, "sleep", 5, 0, err, sizeof err), 0, "%s", err);
    wait_output(0, "sleeping 1");
    dk_job_interrupt(job);
    cr_assert(dk_job_round_wait(job, 20000));
    finish(&job);
    char path[512], text[256] = "";
    snprintf(path, sizeof path, "%s/rank-0.log", dir2);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no %s", path);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_assert(strstr(text, "sleeping 1"), "the round's log has: %s", text);
    remove_dir(dir2);
}

/* ------------------------------------------------------------------------ */
/* The back channel's size limit, kernel and rank side                       */

Test(job, a_task_larger_than_a_rank_accepts_is_refused_before_it_is_sent)
{
    dk_job_t *job = start_persistent(1, 0);
    char err[256] = "";
    /* Refused on its length alone: nothing of it is read or copied. */
    static const char small[1];
    cr_assert_eq(dk_job_submit(job, small, DK_FRAME_TASK_MAX + 1, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "at most 1 GiB"), "%s", err);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    finish(&job);
}

/* python/distkernel/_backchannel.py accepts the largest TASK frame the kernel
 * sends and refuses one byte more; distkernel._rank._serve ends cleanly when
 * the channel closes and fails on a bad frame (tests/unit/bc_limits.py). */
Test(backchan, the_rank_side_accepts_exactly_what_the_kernel_sends, .timeout = 60)
{
    char a[4][32];
    snprintf(a[0], sizeof a[0], "%zu", DK_FRAME_PAYLOAD_MAX);
    snprintf(a[1], sizeof a[1], "%zu", (size_t) DK_FRAME_LEN_MAX);
    snprintf(a[2], sizeof a[2], "%zu", DK_FRAME_TASK_MAX);
    snprintf(a[3], sizeof a[3], "%d", DK_FRAME_MAC_LEN);
    cr_assert_eq(DK_FRAME_LEN_MAX, (size_t) DK_FRAME_MAC_LEN + 5 + DK_FRAME_PAYLOAD_MAX);
    cr_assert_eq(DK_FRAME_TASK_MAX + 4, DK_FRAME_PAYLOAD_MAX);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setenv("PYTHONPATH", PY_SRC, 1);
        execl(PYTHON3, PYTHON3, BC_LIMITS_PY, a[0], a[1], a[2], a[3], (char *) NULL);
        _exit(127);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "bc_limits.py failed (status %d): see its stderr", status);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, job_and_backchan_take_null)
{
    dk_job_destroy(NULL);
    dk_job_t *no_job = NULL;
    dk_job_destroy(&no_job);
    cr_assert_null(no_job);
    dk_backchan_destroy(NULL);
    dk_backchan_t *no_chan = NULL;
    dk_backchan_destroy(&no_chan);
    cr_assert_null(no_chan);
}
