/*
 * Runs over TCP whose ranks node agents start (spec.agent_command, started
 * by a shell on this host: job_fixture.h's agent_spec): what the back
 * channel over TCP and the judge promise such a run. The payload and the
 * answers through the agents' relays, rank 0's port and its refusals, a
 * forged or reflected frame, the ranks' output in order, a node that goes
 * silent and how its loss is told, a connection that closes unanswered, an
 * echo of a lost node, a runtime held up or flooded past the deadline.
 */
#include "job_fixture.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

/* Wait (at most 20 s) until each rank in [FROM, TO) has said WHAT on fd 1. */
static void wait_said(int from, int to, const char *what)
{
    for (int i = 0; i < 2000; i++) {
        bool all = true;
        for (int r = from; r < to; r++)
            all = all && output_has(r, 1, what);
        if (all)
            return;
        usleep(10000);
    }
    for (int r = from; r < to; r++)
        cr_assert(output_has(r, 1, what), "rank %d did not say \"%s\": %s", r, what,
                  rec.out[r][2].buf ? rec.out[r][2].buf : "");
}

/* Stop node NODE's agent (SIGSTOP): silent, as an agent on a node that went
 * down or was cut off is. The job's end kills it with its launcher. */
static void freeze_agent(int node)
{
    cr_assert_eq(kill(agent_pid(node), SIGSTOP), 0);
}

static void make_sync_dir(char *dir, char *setting, size_t len)
{
    cr_assert_not_null(mkdtemp(dir));
    snprintf(setting, len, "FAKE_SYNC=%s", dir);
}

static void touch(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "cannot create %s", path);
    fclose(f);
}

/* ---- the payload, the answers, the port ---- */

Test(agents_tcp, the_payload_and_the_answers_cross_the_agents_intact, .timeout = 60)
{
    size_t len = 4u << 20;
    unsigned char *payload = malloc(len);
    for (size_t i = 0; i < len; i++)
        payload[i] = (unsigned char) (i * 2654435761u >> 13);
    char digest[65];
    sha256_hex(payload, len, digest);
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.payload = payload;
    spec.payload_len = len;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(!strncmp(dk_job_bc_address(job), "tcp:127.0.0.1:", 14), "%s",
              dk_job_bc_address(job));
    /* The host's folder, for the ranks to go to where their node has it. */
    char here[4096];
    cr_assert_not_null(getcwd(here, sizeof here));
    for (int r = 0; r < 4; r++) {
        char want[160];
        snprintf(want, sizeof want, "rank=%d len=%zu sha256=%s", r, len, digest);
        cr_expect_str_eq(rec.msg[r].buf, want);
        cr_expect(output_has(r, 1, "KEYLEN 64"), "rank %d", r);
        cr_expect_str_eq(env_of(r, "DISTKERNEL_CWD"), here, "rank %d", r);
    }
    free(payload);
    finish(&job);
    agents_done();
}

/* MASTER_PORT from rank 0: ranks that said HELLO before rank 0 wait for its
 * port, every rank gets the same one before its PAYLOAD, and none is given a
 * MASTER_PORT in its environment. */
Test(agents_tcp, the_port_rank_0_sends_reaches_every_rank_before_its_payload, .timeout = 60)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", "FAKE_CONNECT_DELAY_MS_0=700",
                           "FAKE_SEND_PORT_0=23456", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 4; r++) {
        cr_expect(output_has(r, 1, "port 23456\n"), "rank %d", r);
        cr_expect_not(output_has(r, 1, "MASTER_PORT was set"), "rank %d", r);
        cr_expect_str_eq(env_of(r, "DISTKERNEL_MASTER_PORT"), "rank0");
        cr_expect(rec.msg[r].buf && !strncmp(rec.msg[r].buf, "rank=", 5), "rank %d", r);
    }
    cr_assert_eq(dk_job_master_port(job), 0);
    finish(&job);
    agents_done();
}

static void port_refused(const char *setting, const char *why)
{
    const char *extra[] = {setting, NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert(warned(why), "no warning \"%s\"", why);
    finish(&job);
    agents_done();
}

Test(agents_tcp, a_port_from_a_rank_other_than_0_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_1=23456", "a port nobody asked for");
}

Test(agents_tcp, a_port_of_0_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_0=0", "did not hold a TCP port");
}

Test(agents_tcp, a_port_past_65535_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_0=70000", "did not hold a TCP port");
}

/* ---- frames that must not verify ---- */

Test(agents_tcp, a_forged_mac_through_an_agent_is_refused, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_0=forge_mac", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(0, 1, "refused as expected"));
    cr_assert(warned("did not verify"));
    finish(&job);
    agents_done();
}

/* With agents, a rank's HELLO comes only on a connection its agent relays,
 * and AGENT_HELLO only on an agent's own (issue 38): each other way, even
 * signed with the run's key, is refused, and the rank then runs as usual. */
Test(agents_tcp, a_relayed_connection_saying_agent_hello_is_refused, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_1=agent_hello", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(1, 1, "refused as expected"));
    cr_assert(warned("a relayed connection said AGENT_HELLO"));
    finish(&job);
    agents_done();
}

Test(agents_tcp, a_ranks_hello_straight_to_the_kernel_is_refused, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_1=direct_hello", NULL};
    dk_job_spec_t spec = agent_spec_with(2, 1, extra, "FAKE_KERNEL_BC=$DISTKERNEL_BC");
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(1, 1, "refused as expected"));
    cr_assert(warned("said a rank's HELLO on a connection of its own"));
    finish(&job);
    agents_done();
}

/* Reflection (review of issue 13): without the direction in the MAC, a man
 * in the middle could send the runtime's own frame back to it with the seq
 * it expects next, and it would verify. Rank 1 has said HELLO (its seq 0)
 * and been sent PORT (the runtime's seq 0) and PAYLOAD (seq 1): it sends the
 * PAYLOAD back as its seq 1. It is refused as any forgery is, not as a
 * message of the wrong type, and the rank's connection ends. */
Test(agents_tcp, a_frame_of_the_runtime_reflected_back_to_it_is_refused, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_1=reflect", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert(output_has(1, 1, "reflected seq 1"), "the fake rank reflected nothing");
    cr_assert(warned("closed rank 1's connection: a message did not verify"),
              "the reflected frame was not refused as a forgery");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    finish(&job);
    agents_done();
}

/* ---- output ---- */

Test(agents_tcp, output_reaches_the_sink_and_the_log_in_order, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=3000", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
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
        size_t len = 0;
        char *text = read_file(path, &len);
        cr_assert(text && strstr(text, "out 2999\n") && strstr(text, "err 2999\n"));
        free(text);
    }
    finish(&job);
    agents_done();
}

Test(agents_tcp, a_childs_output_and_the_last_words_arrive_before_the_result, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=spawn_writer", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        cr_assert(output_has(r, 1, "child-out"), "rank %d", r);
        cr_assert(output_has(r, 2, "child-err"), "rank %d", r);
        cr_assert(rec.last_words_first[r], "rank %d: its last output came after its result", r);
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
    }
    finish(&job);
    agents_done();
}

/* ---- heartbeats ---- */

/* Ranks busy for longer than the deadline send nothing of their own: the
 * heartbeats between the runtime and their agents keep the job alive. */
Test(agents_tcp, quiet_ranks_outlive_the_deadline_on_their_agents_heartbeats, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_SLEEP_S=4", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
        cr_assert(!dk_job_rank_lost(job, r));
    }
    finish(&job);
    agents_done();
}

/* Started ranks idle between cells for longer than the deadline (the idle
 * time is the point: it is slept), kept by the heartbeats, then a round. */
Test(agents_tcp, started_ranks_idle_past_the_deadline_then_run_a_round, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=rounds", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    spec.persistent = true;
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_round_wait(job, 30000), "the ranks never said HELLO");
    cr_assert_eq(dk_job_round_end(job), DK_END_OK);
    usleep(4500000);            /* idle for 2.25 deadlines */
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "result", 6, 0, err, sizeof err), 0, "%s", err);
    cr_assert(dk_job_round_wait(job, 30000));
    cr_assert_eq(dk_job_round_end(job), DK_END_OK, "%s", rec.nwarnings ? rec.warnings[0] : "");
    for (int r = 0; r < 2; r++) {
        char want[32];
        snprintf(want, sizeof want, "round=1 rank=%d", r);
        cr_assert(rec.msg[r].buf && strstr(rec.msg[r].buf, want), "rank %d", r);
        cr_assert(!dk_job_rank_lost(job, r));
    }
    finish(&job);
    agents_done();
}

/* The runtime's own loop held up past the deadline (a slow sink, a stalled
 * disk; here for 2.25 deadlines, slept) is not its agents' silence: what
 * they sent meanwhile is waiting unread. The agent is given a long deadline
 * of its own, so that it does not take the held runtime for gone. */
Test(agents_tcp, a_runtime_held_up_past_the_deadline_does_not_take_its_nodes_for_lost,
     .timeout = 60)
{
    char dir[] = "/tmp/dk-test-hold-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    hold_dir = dir;
    const char *extra[] = {"FAKE_MODE=hold", "FAKE_SLEEP_S=3", NULL};
    dk_job_spec_t spec = agent_spec_with(1, 1, extra, "DISTKERNEL_BC_HEARTBEAT=30");
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    char held[512], release[512];
    snprintf(held, sizeof held, "%s/held", dir);
    snprintf(release, sizeof release, "%s/release", dir);
    for (int i = 0; i < 2000 && access(held, F_OK) != 0; i++)
        usleep(10000);
    cr_assert_eq(access(held, F_OK), 0, "the runtime was never held");
    usleep(4500000);
    touch(dir, "release");
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(!dk_job_rank_lost(job, 0));
    finish(&job);
    agents_done();
    unlink(held);
    unlink(release);
    rmdir(dir);
}

/* A rank whose agent keeps sending (a flood of its output) does not hold up
 * another rank's verdict: when a rank exits, the runtime reads what has
 * arrived before judging it, and that read must end although the flood does
 * not. Rank 1 finishes while rank 0 floods for 60 s: its verdict (DONE) must
 * come while the flood goes on, and a cancel must then end the flooder. */
Test(agents_tcp, a_flooding_rank_does_not_hold_up_another_ranks_verdict, .timeout = 150)
{
    const char *extra[] = {"FAKE_MODE_0=flood", "FAKE_MODE_1=sleep", "FAKE_SLEEP_S=2", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
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
    cr_assert(done, "rank 1's verdict did not come within 30 s while rank 0 flooded");
    cr_assert(flooding, "the flood ended before rank 1's verdict");
    cr_assert_gt(dots, 1000, "rank 0 did not flood (%zu bytes)", dots);
    cr_assert(ended, "the cancelled job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    finish(&job);
    agents_done();
}

/* ---- lost nodes ---- */

Test(agents_tcp, a_silent_node_is_lost_and_told_once_with_its_ranks_as_a_run, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    wait_said(0, 4, "sleeping");
    freeze_agent(1);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    int root = dk_job_root_cause(job);
    cr_assert(root == 2 || root == 3, "root cause %d", root);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    cr_assert_str_eq(rec.lost_host[2], "node2");
    cr_assert_str_eq(rec.lost_host[3], "node2");
    cr_assert_str_eq(rec.lost_host[0], "");
    cr_assert_eq(warned_times("on node2 lost: "), 1);
    cr_assert(warned("rank 2 on node2 lost: nothing heard from its node agent for "));
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    finish(&job);
    agents_done();
}

/* Ten nodes go quiet at once: the cell is told of the first eight, one line
 * each, and then once that more went; the summary still names all ten. */
Test(agents_tcp, past_eight_lost_nodes_one_line_says_more_went, .timeout = 90)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = agent_spec(11, 1, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    wait_said(0, 11, "sleeping");
    for (int node = 1; node < 11; node++)
        freeze_agent(node);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    for (int r = 1; r < 11; r++)
        cr_assert(dk_job_rank_lost(job, r), "rank %d", r);
    cr_assert_not(dk_job_rank_lost(job, 0));
    cr_assert_eq(warned_times(" lost: "), 8);
    cr_assert_eq(warned_times("more nodes were lost; the run's error names every one"), 1);
    char summary[512];
    dk_job_lost_summary(job, summary, sizeof summary);
    for (int r = 1; r < 11; r++) {
        char clause[32];
        snprintf(clause, sizeof clause, "node%d lost (rank %d)", r + 1, r);
        cr_assert(strstr(summary, clause), "%s not in: %s", clause, summary);
    }
    finish(&job);
    agents_done();
}

/* Node2 goes quiet while rank 3 is still starting: rank 3, which never
 * connected, is lost with its node, and said to be. */
Test(agents_tcp, a_rank_still_starting_on_a_lost_node_is_lost_with_it, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_3=freeze_at_start", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    wait_said(0, 3, "sleeping");
    wait_said(3, 4, "freezing before connecting");
    freeze_agent(1);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 2);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("rank 3 on node2 lost with it: it had not connected yet"));
    finish(&job);
    agents_done();
}

/* An agent that has not connected by the connect deadline while its
 * launcher runs (its node went down while it started, or its start is
 * stuck) is its node lost. Here node2's agent is sent to a listener that
 * never starts a connection, and given a deadline of its own far past the
 * job's. */
Test(agents_tcp, an_agent_not_connected_by_the_deadline_is_its_node_lost, .timeout = 60)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    cr_assert_eq(bind(lfd, (struct sockaddr *) &sa, sizeof sa), 0);
    cr_assert_eq(listen(lfd, 16), 0);
    getsockname(lfd, (struct sockaddr *) &sa, &sl);
    char vars[512];
    snprintf(vars, sizeof vars,
             "DISTKERNEL_BC=$(if [ $k = 1 ]; then echo tcp:127.0.0.1:%d; "
             "else echo \"$DISTKERNEL_BC\"; fi) "
             "DISTKERNEL_BC_CONNECT_TIMEOUT=$(if [ $k = 1 ]; then echo 60; "
             "else echo \"$DISTKERNEL_BC_CONNECT_TIMEOUT\"; fi)", ntohs(sa.sin_port));
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = agent_spec_with(4, 2, extra, vars);
    spec.heartbeat_s = 2.0;
    spec.connect_timeout_s = 3.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    close(lfd);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 2);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("rank 2 on node2 lost: its node agent had not connected 3 s after the "
                     "start"), "%s", rec.nwarnings ? rec.warnings[0] : "(no warning)");
    finish(&job);
    agents_done();
}

/* ---- echoes of a lost node, and connections that close unanswered ---- */

/* Rank 0 raises gloo's "Connection closed by peer" once node2 has gone
 * quiet; the kernel learns that only at the heartbeat deadline. The echo
 * waits for it: node2 is the root cause, not rank 0. */
Test(agents_tcp, a_peers_connection_error_waits_for_the_lost_node_it_echoes, .timeout = 60)
{
    char dir[] = "/tmp/dk-test-sync-XXXXXX", sync[600];
    make_sync_dir(dir, sync, sizeof sync);
    const char *extra[] = {"FAKE_MODE_0=echo_error", "FAKE_MODE_1=sleep", sync, NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    wait_said(1, 2, "sleeping");
    freeze_agent(1);
    touch(dir, "go");
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(dk_job_rank_lost(job, 1));
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (rank 1)");
    finish(&job);
    agents_done();
    remove_dir(dir);
}

/* Ranks 0 and 1 both raise it: the second echo is no news of the peer that
 * went, and both wait for the heartbeat deadline together. */
Test(agents_tcp, two_echoes_of_a_lost_node_wait_for_it_together, .timeout = 60)
{
    char dir[] = "/tmp/dk-test-sync-XXXXXX", sync[600];
    make_sync_dir(dir, sync, sizeof sync);
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_0=echo_error", "FAKE_MODE_1=echo_error",
                           sync, NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    wait_said(2, 4, "sleeping");
    freeze_agent(1);
    touch(dir, "go");
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 2);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    finish(&job);
    agents_done();
    remove_dir(dir);
}

/* Node2's ranks close their connections without an answer and live on, their
 * agent telling no exit: they are lost once the heartbeat deadline passes. */
Test(agents_tcp, ranks_whose_connections_close_unanswered_and_live_on_are_lost, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=close_hang", "FAKE_MODE_3=close_hang",
                           NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    int root = dk_job_root_cause(job);
    cr_assert(root == 2 || root == 3, "root cause %d", root);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("on node2 lost: its connection closed without an answer, and its agent "
                     "had not told its exit"), "%s", rec.nwarnings ? rec.warnings[0] : "");
    cr_assert(output_has(2, 1, "closing"));
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    finish(&job);
    agents_done();
}

/* A rank that exits within the deadline after its connection closed keeps
 * its own verdict. */
Test(agents_tcp, a_rank_exiting_soon_after_its_connection_closed_keeps_its_verdict,
     .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_1=close_hang", "FAKE_SLEEP_S=0.5", NULL};
    dk_job_spec_t spec = agent_spec(2, 1, extra);
    spec.heartbeat_s = 3.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 3);
    cr_assert_not(dk_job_rank_lost(job, 1));
    char summary[64] = "x";
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "");
    finish(&job);
    agents_done();
}
