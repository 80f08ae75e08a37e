/*
 * The tracking server's port on every node (runtime/mlflow/dk_tunnel.h):
 * a door and a gate on this host's loopback, between a client and a server
 * of the test's own, with real sockets. What goes through arrives whole and
 * in order, both ways, with a half-close passed on; a door with the wrong
 * key, a stranger at the gate, another user at the door and a gate with no
 * server get nothing through. Also who owns the client end of a loopback
 * connection (dk_sockowner_conn_uid, dk_sockowner_peer_uid).
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dk_sockowner.h"
#include "dk_tunnel.h"

#define OTHER_UID 65534   /* nobody */

/* ---- who owns a loopback connection's client end ---- */

/* A client 127.0.0.1:0xD431 of uid 1000 connected to a server on
 * 127.0.0.1:0x1F90 (line 1), the server's end of it (line 2, uid 1001), and
 * in tcp6 a dual-stack client ::ffff:127.0.0.1:0xD432 of uid 1002. */
static const char TCP[] =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 100 1 0 100 0 0 10 0\n"
    "   1: 0100007F:D431 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1000        0 101 1 0 20 4 30 10 -1\n"
    "   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1001        0 102 1 0 20 4 30 10 -1\n";
static const char TCP6[] =
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 0000000000000000FFFF00000100007F:D432 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000  1002        0 201 1 0 20 4 30 10 -1\n";

Test(conn_uid, the_client_end_is_the_line_from_its_port_to_ours)
{
    unsigned uid = 0;
    cr_assert(dk_sockowner_conn_uid(TCP, false, 0xD431, 0x1F90, &uid));
    cr_assert_eq(uid, 1000);
    cr_assert(dk_sockowner_conn_uid(TCP6, true, 0xD432, 0x1F90, &uid));
    cr_assert_eq(uid, 1002, "a dual-stack client is in tcp6");
}

Test(conn_uid, no_line_no_owner)
{
    unsigned uid = 7;
    cr_assert_not(dk_sockowner_conn_uid(TCP, false, 0xD433, 0x1F90, &uid));
    cr_assert_not(dk_sockowner_conn_uid(TCP, false, 0xD431, 0x1F91, &uid));
    cr_assert_not(dk_sockowner_conn_uid("", false, 0xD431, 0x1F90, &uid));
    cr_assert_not(dk_sockowner_conn_uid(NULL, false, 0xD431, 0x1F90, &uid));
    cr_assert_eq(uid, 7);
}

static int listen_loopback(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *) &a, sizeof a), 0);
    cr_assert_eq(listen(fd, 16), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *) &a, &l), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static int connect_loopback(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(fd, (struct sockaddr *) &a, sizeof a), 0, "connect: %s",
                 strerror(errno));
    return fd;
}

Test(conn_uid, a_real_connection_is_this_processes_uid)
{
    int port, lfd = listen_loopback(&port);
    int c = connect_loopback(port);
    int s = accept(lfd, NULL, NULL);
    unsigned uid = 12345;
    char err[256] = "";
    cr_assert_eq(dk_sockowner_peer_uid(s, &uid, err, sizeof err), 0, "%s", err);
    cr_assert_eq(uid, (unsigned) geteuid());
    close(c);
    close(s);
    close(lfd);
}

/* ---- the tunnel ---- */

static const unsigned char KEY[DK_FRAME_KEY_LEN] = "0123456789abcdef0123456789abcdef";
static const unsigned char OTHER_KEY[DK_FRAME_KEY_LEN] = "fedcba9876543210fedcba9876543210";

/* The server at the far end: echoes each connection back to its client
 * until the client's end, then closes; counts the connections it took. */
typedef struct {
    int lfd, port;
    int taken;
    pthread_t thread;
} echo_t;

static void *echo_main(void *arg)
{
    echo_t *e = arg;
    for (;;) {
        int s = accept(e->lfd, NULL, NULL);
        if (s < 0)
            return NULL;
        __atomic_add_fetch(&e->taken, 1, __ATOMIC_SEQ_CST);
        char buf[4096];
        ssize_t n;
        while ((n = read(s, buf, sizeof buf)) > 0)
            for (ssize_t off = 0; off < n;) {
                ssize_t w = write(s, buf + off, (size_t) (n - off));
                if (w <= 0)
                    break;
                off += w;
            }
        close(s);
    }
}

static void echo_start(echo_t *e)
{
    memset(e, 0, sizeof *e);
    e->lfd = listen_loopback(&e->port);
    pthread_create(&e->thread, NULL, echo_main, e);
}

static void echo_stop(echo_t *e)
{
    shutdown(e->lfd, SHUT_RDWR);
    pthread_join(e->thread, NULL);
    close(e->lfd);
}

static char *addr(int port)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "127.0.0.1:%d", port);
    return buf;
}

/* Everything FD sends back until its end (at most CAP bytes), within 20 s. */
static size_t read_to_end(int fd, char *out, size_t cap)
{
    size_t got = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        cr_assert_eq(poll(&p, 1, 20000), 1, "nothing came back in 20 s");
        ssize_t n = read(fd, out + got, cap - got);
        if (n <= 0)
            return got;
        got += (size_t) n;
        cr_assert_lt(got, cap + 1);
    }
}

typedef struct {
    int fd;
    const char *data;
    size_t len;
} writer_t;

static void *write_then_shut(void *arg)
{
    writer_t *w = arg;
    for (size_t off = 0; off < w->len;) {
        ssize_t n = write(w->fd, w->data + off, w->len - off);
        if (n <= 0)
            break;
        off += (size_t) n;
    }
    shutdown(w->fd, SHUT_WR);
    return NULL;
}

Test(tunnel, bytes_go_through_door_and_gate_whole_and_back)
{
    echo_t echo;
    echo_start(&echo);
    char err[256] = "";
    dk_tunnel_t *gate = dk_tunnel_gate_new("127.0.0.1", KEY, addr(echo.port), NULL, err,
                                           sizeof err);
    cr_assert(gate, "%s", err);
    dk_tunnel_t *door = dk_tunnel_door_new(addr(dk_tunnel_port(gate)), KEY, err, sizeof err);
    cr_assert(door, "%s", err);

    /* 3 MB each way, far more than the tunnel buffers: it must wait for the
     * reader rather than drop or grow. Written from a thread while this one
     * reads, as a client and server with full buffers both ways would. */
    size_t len = 3u << 20;
    char *data = malloc(len), *back = malloc(len + 1);
    for (size_t i = 0; i < len; i++)
        data[i] = (char) (i * 7 + i / 251);
    int c = connect_loopback(dk_tunnel_port(door));
    writer_t w = {c, data, len};
    pthread_t t;
    pthread_create(&t, NULL, write_then_shut, &w);
    size_t got = read_to_end(c, back, len + 1);
    pthread_join(t, NULL);
    cr_assert_eq(got, len, "the client's end passed through and the server's came back");
    cr_assert(memcmp(data, back, len) == 0, "the bytes came back as they were sent");
    close(c);

    /* A second connection gets its own way through. */
    c = connect_loopback(dk_tunnel_port(door));
    cr_assert_eq(write(c, "ping", 4), 4);
    shutdown(c, SHUT_WR);
    cr_assert_eq(read_to_end(c, back, 16), 4);
    cr_assert(memcmp(back, "ping", 4) == 0);
    close(c);

    dk_tunnel_stats_t s;
    dk_tunnel_stats(gate, &s);
    cr_assert_eq(s.taken, 2);
    cr_assert_eq(s.refused, 0);
    cr_assert_eq(echo.taken, 2);
    dk_tunnel_destroy(&door);
    dk_tunnel_destroy(&gate);
    cr_assert_null(gate);
    echo_stop(&echo);
    free(data);
    free(back);
}

/* What a client of DOOR_PORT gets back for "GET /": nothing, the tunnel
 * closed it; and what the gate and the server saw. */
static void assert_refused(dk_tunnel_t *gate, int door_port, echo_t *echo)
{
    int c = connect_loopback(door_port);
    (void) !write(c, "GET / HTTP/1.1\r\n\r\n", 18);
    char buf[64];
    cr_assert_eq(read_to_end(c, buf, sizeof buf), 0, "nothing came back");
    close(c);
    dk_tunnel_stats_t s;
    dk_tunnel_stats(gate, &s);
    cr_assert_eq(s.taken, 0);
    cr_assert_eq(s.refused, 1);
    cr_assert_eq(echo->taken, 0, "nothing reached the server");
}

Test(tunnel, a_door_without_the_runs_key_gets_nothing_through)
{
    echo_t echo;
    echo_start(&echo);
    dk_tunnel_t *gate = dk_tunnel_gate_new("127.0.0.1", KEY, addr(echo.port), NULL, NULL, 0);
    dk_tunnel_t *door = dk_tunnel_door_new(addr(dk_tunnel_port(gate)), OTHER_KEY, NULL, 0);
    cr_assert(gate && door);
    assert_refused(gate, dk_tunnel_port(door), &echo);
    dk_tunnel_destroy(&door);
    dk_tunnel_destroy(&gate);
    echo_stop(&echo);
}

Test(tunnel, a_stranger_at_the_gate_gets_nothing_through)
{
    /* Anyone on the run's network can reach the gate: a client that talks
     * HTTP at it without the proof is closed, having reached nothing. */
    echo_t echo;
    echo_start(&echo);
    dk_tunnel_t *gate = dk_tunnel_gate_new("127.0.0.1", KEY, addr(echo.port), NULL, NULL, 0);
    cr_assert(gate);
    int c = connect_loopback(dk_tunnel_port(gate));
    const char req[] = "GET /api/2.0/mlflow/runs/get HTTP/1.1\r\nHost: x\r\n\r\n";
    (void) !write(c, req, sizeof req - 1);
    char buf[64];
    cr_assert_eq(read_to_end(c, buf, sizeof buf), DK_FRAME_NONCE_LEN, "only the nonce");
    close(c);
    dk_tunnel_stats_t s;
    dk_tunnel_stats(gate, &s);
    cr_assert_eq(s.refused, 1);
    cr_assert_eq(echo.taken, 0);
    dk_tunnel_destroy(&gate);
    echo_stop(&echo);
}

Test(tunnel, a_gate_sends_nothing_to_an_address_that_is_not_the_runs)
{
    /* The run's nodes are elsewhere: a connection from 127.0.0.1 is closed
     * as it is accepted, not even sent the nonce. */
    echo_t echo;
    echo_start(&echo);
    const char *nodes[] = {"10.255.255.1"};
    dk_accept_t *allow = dk_accept_new(nodes, 1, NULL, 0);
    cr_assert(allow);
    dk_tunnel_t *gate = dk_tunnel_gate_new("127.0.0.1", KEY, addr(echo.port), allow, NULL, 0);
    cr_assert(gate);
    int c = connect_loopback(dk_tunnel_port(gate));
    char buf[64];
    cr_assert_eq(read_to_end(c, buf, sizeof buf), 0, "not a byte, not the nonce");
    close(c);
    dk_tunnel_stats_t s;
    dk_tunnel_stats(gate, &s);
    cr_assert_eq(s.refused, 1);
    cr_assert_eq(echo.taken, 0);
    dk_tunnel_destroy(&gate);
    echo_stop(&echo);
}

Test(tunnel, a_gate_with_no_server_closes_and_takes_one_when_given)
{
    echo_t echo;
    echo_start(&echo);
    dk_tunnel_t *gate = dk_tunnel_gate_new("127.0.0.1", KEY, NULL, NULL, NULL, 0);
    dk_tunnel_t *door = dk_tunnel_door_new(addr(dk_tunnel_port(gate)), KEY, NULL, 0);
    cr_assert(gate && door);
    assert_refused(gate, dk_tunnel_port(door), &echo);
    char err[128];
    cr_assert_eq(dk_tunnel_set_upstream(gate, "nonsense", err, sizeof err), -1);
    cr_assert(strstr(err, "nonsense"), "%s", err);
    cr_assert_eq(dk_tunnel_set_upstream(gate, addr(echo.port), NULL, 0), 0);
    int c = connect_loopback(dk_tunnel_port(door));
    cr_assert_eq(write(c, "x", 1), 1);
    shutdown(c, SHUT_WR);
    char buf[8];
    cr_assert_eq(read_to_end(c, buf, sizeof buf), 1);
    close(c);
    dk_tunnel_destroy(&door);
    dk_tunnel_destroy(&gate);
    echo_stop(&echo);
}

Test(tunnel, another_user_at_the_door_gets_nothing_through)
{
    if (geteuid() != 0)
        cr_skip_test("acting as another user needs root");
    echo_t echo;
    echo_start(&echo);
    dk_tunnel_t *gate = dk_tunnel_gate_new("127.0.0.1", KEY, addr(echo.port), NULL, NULL, 0);
    dk_tunnel_t *door = dk_tunnel_door_new(addr(dk_tunnel_port(gate)), KEY, NULL, 0);
    cr_assert(gate && door);
    int port = dk_tunnel_port(door);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* nobody, on the same host's 127.0.0.1: exit 0 when nothing came back */
        if (setresgid(OTHER_UID, OTHER_UID, OTHER_UID) != 0 ||
            setresuid(OTHER_UID, OTHER_UID, OTHER_UID) != 0)
            _exit(2);
        int c = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(c, (struct sockaddr *) &a, sizeof a) != 0)
            _exit(3);
        (void) !write(c, "GET / HTTP/1.1\r\n\r\n", 18);
        struct pollfd p = {.fd = c, .events = POLLIN};
        char buf[16];
        if (poll(&p, 1, 20000) != 1)
            _exit(4);
        _exit(read(c, buf, sizeof buf) <= 0 ? 0 : 5);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the stranger's status: %d",
              status);
    dk_tunnel_stats_t s;
    dk_tunnel_stats(door, &s);
    cr_assert_eq(s.refused, 1);
    cr_assert_eq(s.taken, 0);
    dk_tunnel_stats(gate, &s);
    cr_assert_eq(s.taken + s.refused, 0, "the door did not even go to the gate");
    cr_assert_eq(echo.taken, 0);
    dk_tunnel_destroy(&door);
    dk_tunnel_destroy(&gate);
    echo_stop(&echo);
}

Test(tunnel, addresses)
{
    struct sockaddr_storage a;
    unsigned len;
    cr_assert_eq(dk_tunnel_parse_addr("127.0.0.1:5000", &a, &len, NULL, 0), 0);
    cr_assert_eq(a.ss_family, AF_INET);
    cr_assert_eq(dk_tunnel_parse_addr("[::1]:5000", &a, &len, NULL, 0), 0);
    cr_assert_eq(a.ss_family, AF_INET6);
    char err[128];
    const char *bad[] = {"localhost:5000", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0",
                         "127.0.0.1:70000", ":5000", "::1:5000", "127.0.0.1:50x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_eq(dk_tunnel_parse_addr(bad[i], &a, &len, err, sizeof err), -1, "%s", bad[i]);
}
