/*
 * The back channel over TCP (runtime/channel/dk_backchan.h): its listener
 * and the job's checks of what a run over TCP needs; what a rank's own
 * connection may carry besides its answer; and the words for lost ranks.
 * Runs whose ranks are started by node agents over TCP are
 * test_job_agents_tcp.c's. The fixture is job_fixture.h's.
 */
#include "job_fixture.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dk_backchan.h"
#include "dk_lost.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

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

Test(tcp, a_heartbeat_deadline_shorter_than_two_pings_is_refused)
{
    dk_job_spec_t spec = tcp_spec(1, NULL);
    spec.heartbeat_s = 1.5;
    char err[256] = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "heartbeat_s is 1.5; it must be at least 2"), "%s", err);
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

/* What a rank says about itself for its log (DK_FRAME_OUTPUT_LOG: a folder of
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
