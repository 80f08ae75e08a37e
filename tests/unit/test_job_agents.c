/*
 * The ranks' stacks before they are ended and live samples (spec.stacks,
 * dk_stackreq.h), and node agents (spec.agent_command, dk_job_agents.c)
 * started by a shell on this host. The fixture is job_fixture.h's.
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

/* ---- the ranks' stacks before they are ended (spec.stacks, dk_stackreq.h) ---- */

/* SPEC's ranks sleep in a cell; once each has said so, the job is
 * cancelled: each rank's stacks, asked before its SIGINT, show the cell's
 * line 2, and the answers did not hold the stop up for the whole wait. The
 * print and the sleep share line 2: a rank's main thread may not have taken
 * the GIL back from its print's write yet when the answer is made (on a busy
 * machine it did not, and the stack showed the print's line). */
static void stacks_of_sleeping_ranks(dk_job_spec_t spec, int world)
{
    spec.stacks = true;
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 6000; i++) {
        bool all = true;
        for (int r = 0; r < world; r++)
            all = all && output_has(r, 1, "sleeping");
        if (all)
            break;
        usleep(10000);
    }
    for (int r = 0; r < world; r++)
        cr_assert(output_has(r, 1, "sleeping"), "rank %d did not start: %s", r,
                  rec.out[r][2].buf ? rec.out[r][2].buf : "");
    double t0 = now_s();
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_assert_lt(now_s() - t0, 15.0);
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    for (int r = 0; r < world; r++) {
        size_t len;
        const char *dump = dk_job_rank_stacks(job, r, &len);
        cr_assert_not_null(dump, "rank %d was not asked", r);
        cr_assert(strstr(dump, "File \"<distributed-cell>\", line 2 in <module>"),
                  "rank %d: %s", r, dump);
        cr_assert_null(strstr(dump, DK_STACKS_END), "rank %d: the end line is left out", r);
    }
    finish(&job);
}

static const char *SLEEPING_CELL = "import time\nprint('sleeping', flush=True); time.sleep(60)\n";

Test(stacks, local_ranks_answer_for_their_stacks_before_they_are_stopped, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload(SLEEPING_CELL, payload, sizeof payload);
    static const char *extra[] = {"PYTHONPATH=" PY_SRC, "DISTKERNEL_GLUE_DIR=" PY_SRC,
                                  "ASAN_OPTIONS=detect_leaks=0", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.rank_exe = RANK_EXE;
    spec.payload = payload;
    spec.payload_len = len;
    stacks_of_sleeping_ranks(spec, 2);
}

/* A rank started by its node's agent is asked through its agent, which
 * signals it there: its answer, made as a local rank's is, comes back on the
 * agent's connection. */
Test(stacks, ranks_under_agents_answer_through_their_agents, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload(SLEEPING_CELL, payload, sizeof payload);
    static const char *extra[] = {"PYTHONPATH=" PY_SRC, "DISTKERNEL_GLUE_DIR=" PY_SRC,
                                  "ASAN_OPTIONS=detect_leaks=0", NULL};
    dk_job_spec_t spec = agent_spec_for(2, 1, extra, "", RANK_EXE);
    spec.payload = payload;
    spec.payload_len = len;
    stacks_of_sleeping_ranks(spec, 2);
    agents_done();
}

static int samples(void)
{
    pthread_mutex_lock(&rec.lock);
    int n = rec.nsamples;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

/* Wait (at most 30 s) for the N-th live sample's answers. */
static void wait_sample(int n)
{
    for (int i = 0; i < 3000 && samples() < n; i++)
        usleep(10000);
    cr_assert_geq(samples(), n, "no answer to live sample %d", n);
}

/* A live sample (dk_job_sample_stacks) hands the sleeping ranks' stacks to
 * the host, again on each ask, and stops nothing: the ranks sleep on, and
 * the stop that ends them still asks for the stacks of its own. */
Test(stacks, a_live_sample_tells_where_the_ranks_are_and_stops_nothing, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload(SLEEPING_CELL, payload, sizeof payload);
    static const char *extra[] = {"PYTHONPATH=" PY_SRC, "DISTKERNEL_GLUE_DIR=" PY_SRC,
                                  "ASAN_OPTIONS=detect_leaks=0", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.rank_exe = RANK_EXE;
    spec.payload = payload;
    spec.payload_len = len;
    spec.stacks = true;
    /* A sample ends when every rank has answered; its default 2 s is too
     * little for a sampler thread to be scheduled under the sanitizers on 2
     * loaded cores (CI once saw a rank's answer missing). A broken sampler
     * still fails: the answer never comes. */
    spec.stacks_wait_s = 20;
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 6000 && !(output_has(0, 1, "sleeping") && output_has(1, 1, "sleeping"));
         i++)
        usleep(10000);
    cr_assert(output_has(0, 1, "sleeping") && output_has(1, 1, "sleeping"),
              "the ranks did not start");
    for (int n = 1; n <= 2; n++) {
        cr_assert(dk_job_sample_stacks(job));
        wait_sample(n);
        pthread_mutex_lock(&rec.lock);
        for (int r = 0; r < 2; r++) {
            cr_assert(rec.sample_asked[r], "rank %d was not asked", r);
            cr_assert(strstr(rec.sampled[r].buf, "File \"<distributed-cell>\", line 2 in <module>"),
                      "rank %d: %s", r, rec.sampled[r].buf);
        }
        pthread_mutex_unlock(&rec.lock);
        cr_assert_eq(dk_job_end(job), DK_END_NONE, "a sample ended the job");
        /* Not dk_job_rank_stacks here: it is valid once the job has ended,
         * and the job's thread clears the sample's answers only after the
         * sink has them (read here, that raced under load: CI-like runs saw
         * the answers not cleared yet). */
    }
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    for (int r = 0; r < 2; r++) {
        size_t n_len;
        const char *dump = dk_job_rank_stacks(job, r, &n_len);
        cr_assert(dump && strstr(dump, "line 2 in <module>"), "rank %d: %s", r,
                  dump ? dump : "(not asked)");
    }
    cr_assert_not(dk_job_sample_stacks(job), "an ended job takes no sample");
    finish(&job);
}

Test(stacks, without_spec_stacks_no_rank_is_asked, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.timeout_s = 0.5;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_TIMEOUT);
    size_t len;
    cr_assert_null(dk_job_rank_stacks(job, 0, &len));
    cr_assert_null(dk_job_rank_stacks(job, 1, &len));
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* Ranks started by node agents (spec.agent_command, runtime/agent/)         */

Test(agents, every_rank_runs_under_its_nodes_agent_and_answers, .timeout = 60)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.payload = "job";
    spec.payload_len = 3;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_DONE, "rank %d", r);
        cr_expect_eq(dk_job_rank_exit_code(job, r), 0, "rank %d", r);
        cr_expect_eq(dk_job_rank_pid(job, r), -1, "rank %d has no process here", r);
        char want[64];
        snprintf(want, sizeof want, "rank=%d len=3", r);
        cr_expect(rec.msg[r].buf && strstr(rec.msg[r].buf, want), "rank %d: %s", r,
                  rec.msg[r].buf ? rec.msg[r].buf : "(none)");
        /* Its connection is its agent's relay (a Unix socket on its node),
         * shared with its node's other rank and no other's: the answer
         * above came through it. */
        char bc_buf[256] = "";
        const char *bc = env_of(r, "DISTKERNEL_BC");
        if (bc)
            bc = strncpy(bc_buf, bc, sizeof bc_buf - 1);    /* env_of's buffer is reused */
        cr_expect(bc && strstr(bc, "/distkernel-relay-") && strstr(bc, "/relay.sock"),
                  "rank %d: DISTKERNEL_BC=%s", r, bc ? bc : "(none)");
        if (bc && r % 2 == 1)
            cr_expect_str_eq(bc, env_of(r - 1, "DISTKERNEL_BC"), "rank %d", r);
        if (bc && r >= 2)
            cr_expect_str_neq(bc, env_of(r - 2, "DISTKERNEL_BC"), "rank %d", r);
        char node[8];
        snprintf(node, sizeof node, "%d", r / 2);
        cr_expect_str_eq(env_of(r, "GROUP_RANK"), node);
    }
    /* The launcher's own line is in agents.log, not in any rank's output. */
    char path[512], text[4096] = "";
    snprintf(path, sizeof path, "%s/agents.log", dk_job_log_dir(job));
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_expect(strstr(text, "srun: a line of the launcher"), "agents.log: %s", text);
    cr_expect(!output_has(0, 2, "srun: a line"));
    finish(&job);
    agents_done();
}

Test(agents, nodes_whose_template_fails_run_cold_and_the_run_says_so_once, .timeout = 60)
{
    /* The agents are asked for a template each; started from the fake rank,
     * which is none, it fails on both nodes: their ranks start cold, the run
     * succeeds, and warm.log has one line for the run. */
    dk_job_spec_t spec = agent_spec(4, 2, NULL);
    spec.agent_warm_modules = "torch";
    spec.agent_warm_path = "/nonexistent\n/also-not";
    spec.payload = "job";
    spec.payload_len = 3;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 4; r++)
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_DONE, "rank %d", r);
    char path[512], text[4096] = "";
    snprintf(path, sizeof path, "%s/warm.log", dk_job_log_dir(job));
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no warm.log");
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    /* Both nodes are named in the one line, with the first one's reason. */
    cr_expect(strncmp(text, "the ranks on nodes 0, 1 (node1, node2) ", 39) == 0 &&
              strstr(text, "started cold: the warm-start template exited with code"), "%s", text);
    cr_expect_eq(strchr(text, '\n'), text + n - 1, "one line for the run: %s", text);
    /* Each agent said it in agents.log. */
    snprintf(path, sizeof path, "%s/agents.log", dk_job_log_dir(job));
    f = fopen(path, "r");
    cr_assert_not_null(f);
    n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_expect(strstr(text, "node 0 (node1): ranks start cold") &&
              strstr(text, "node 1 (node2): ranks start cold"),
              "agents.log: %s", text);
    finish(&job);
    agents_done();
}

Test(agents, a_rank_that_fails_is_the_root_cause_and_the_others_are_stopped, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=interruptible", "FAKE_MODE_3=exit3", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_expect_eq(dk_job_root_cause(job), 3);
    cr_expect_eq(dk_job_rank_state(job, 3), DK_RANK_FAILED);
    cr_expect_eq(dk_job_rank_exit_code(job, 3), 3);
    for (int r = 0; r < 3; r++)
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_expect_str_eq(summary, "");
    finish(&job);
    agents_done();
}

Test(agents, a_cancel_reaches_the_ranks_through_their_agents, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=interruptible", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 2000 && !(output_has(0, 1, "sleeping") && output_has(1, 1, "sleeping") &&
                                  output_has(2, 1, "sleeping") && output_has(3, 1, "sleeping"));
         i++)
        usleep(10000);
    cr_assert(output_has(2, 1, "sleeping") && output_has(3, 1, "sleeping"));
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED, "rank %d", r);
        cr_expect(rec.msg_error[r] && strstr(rec.msg[r].buf, "KeyboardInterrupt"),
                  "rank %d got SIGINT from its agent", r);
    }
    finish(&job);
    agents_done();
}

Test(agents, an_agent_that_cannot_connect_says_why_as_a_rank_does, .timeout = 60)
{
    /* Port 1 refuses: each agent tries for its connect deadline, says why
     * and exits 2; its node's ranks, never started, end with that, its words
     * on the node's first rank's stderr. Not a lost node. */
    dk_job_spec_t spec = agent_spec_with(4, 2, NULL, "DISTKERNEL_BC=tcp:127.0.0.1:1 "
                                                     "DISTKERNEL_BC_CONNECT_TIMEOUT=1");
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    /* The first agent to give up is the root cause; the other node's ranks
     * may be stopped before its agent gives up too. */
    int root = dk_job_root_cause(job);
    cr_assert(root == 0 || root == 2, "root cause %d", root);
    for (int r = root; r < root + 2; r++) {
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_FAILED, "rank %d", r);
        cr_expect_eq(dk_job_rank_exit_code(job, r), 2, "rank %d", r);
    }
    const char *why = "could not connect to the kernel's back channel at 127.0.0.1:1 within 1 s";
    cr_expect(output_has(root, 2, why), "%s",
              rec.out[root][2].buf ? rec.out[root][2].buf : "(nothing on its stderr)");
    cr_expect(!output_has(1, 2, why) && !output_has(3, 2, why), "told once per node");
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_expect_str_eq(summary, "");
    finish(&job);
    agents_done();
}

Test(agents, a_killed_agent_is_its_node_lost, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 2000 && !(output_has(2, 1, "sleeping") && output_has(3, 1, "sleeping"));
         i++)
        usleep(10000);
    cr_assert(output_has(3, 1, "sleeping"));
    cr_assert_eq(kill(agent_pid(1), SIGKILL), 0);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    int root = dk_job_root_cause(job);
    cr_expect(root == 2 || root == 3, "root cause %d", root);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_expect_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_expect_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    cr_expect_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    finish(&job);
    agents_done();
}
