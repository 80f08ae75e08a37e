/*
 * Who listens on a loopback port (runtime/mlflow/dk_sockowner.h): /proc/net/tcp and
 * tcp6 read on their own, then the owner check against real sockets of this
 * test, of a child of it, and of a process outside the tree asked about.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dk_sockowner.h"

/* Port 0x1F90 (8080): listeners on 127.0.0.1 (inode 101), 0.0.0.0 (102) and
 * 127.0.0.2 (103, not reached); an established socket (104); 127.0.0.1 on
 * another port (105). */
static const char TCP[] =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 101 1 0000000000000000 100 0 0 10 0\n"
    "   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 102 1 0000000000000000 100 0 0 10 0\n"
    "   2: 0200007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1001        0 103 1 0000000000000000 100 0 0 10 0\n"
    "   3: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 104 1 0000000000000000 20 4 30 10 -1\n"
    "   4: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 105 1 0000000000000000 100 0 0 10 0\n";

/* Port 8080 in tcp6: :: (201), ::1 (202, not reached), ::ffff:127.0.0.1 (203). */
static const char TCP6[] =
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    "   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1002        0 201 1 0000000000000000 100 0 0 10 0\n"
    "   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1002        0 202 1 0000000000000000 100 0 0 10 0\n"
    "   2: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1002        0 203 1 0000000000000000 100 0 0 10 0\n";

Test(listeners, tcp_gives_the_listeners_that_127_0_0_1_reaches)
{
    dk_listener_t l[8];
    cr_assert_eq(dk_sockowner_listeners(TCP, false, 8080, l, 8), 2);
    cr_assert_eq(l[0].inode, 101);
    cr_assert_eq(l[0].uid, 1000);
    cr_assert_eq(l[1].inode, 102, "0.0.0.0 reaches 127.0.0.1 too");
    cr_assert_eq(l[1].uid, 1001);
}

Test(listeners, tcp6_gives_the_dual_stack_and_mapped_listeners)
{
    dk_listener_t l[8];
    cr_assert_eq(dk_sockowner_listeners(TCP6, true, 8080, l, 8), 2);
    cr_assert_eq(l[0].inode, 201);
    cr_assert_eq(l[1].inode, 203);
}

Test(listeners, another_port_has_its_own)
{
    dk_listener_t l[8];
    cr_assert_eq(dk_sockowner_listeners(TCP, false, 8081, l, 8), 1);
    cr_assert_eq(l[0].inode, 105);
    cr_assert_eq(dk_sockowner_listeners(TCP, false, 9999, l, 8), 0);
}

Test(listeners, more_than_fit_are_counted)
{
    dk_listener_t l[1];
    cr_assert_eq(dk_sockowner_listeners(TCP, false, 8080, l, 1), 2);
    cr_assert_eq(l[0].inode, 101);
}

Test(listeners, garbage_is_skipped)
{
    dk_listener_t l[2];
    cr_assert_eq(dk_sockowner_listeners("header\nnot a line\n   0: zz\n\n", false, 8080, l, 2), 0);
    cr_assert_eq(dk_sockowner_listeners(NULL, false, 8080, l, 2), 0);
    cr_assert_eq(dk_sockowner_listeners("", true, 8080, l, 2), 0);
}

/* A socket bound to 127.0.0.1 on a free port, listening when LISTEN. */
static int loopback_socket(bool listening, int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *) &a, sizeof a), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *) &a, &len), 0);
    if (listening)
        cr_assert_eq(listen(fd, 4), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* A child that waits to be killed; with LISTEN_FD >= 0 it keeps that socket. */
static pid_t idle_child(int keep_fd)
{
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        (void) keep_fd;
        for (;;)
            pause();
    }
    return pid;
}

static void end_child(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

Test(check, a_socket_of_the_process_itself_is_ours)
{
    int port, fd = loopback_socket(true, &port);
    char err[512] = "";
    cr_assert_eq(dk_sockowner_check(getpid(), port, err, sizeof err), DK_SOCKOWNER_OURS, "%s",
                 err);
    close(fd);
}

Test(check, a_socket_held_only_by_a_descendant_is_ours)
{
    int port, fd = loopback_socket(true, &port);
    pid_t child = idle_child(fd);
    close(fd);  /* now only the child holds it */
    char err[512] = "";
    cr_assert_eq(dk_sockowner_check(getpid(), port, err, sizeof err), DK_SOCKOWNER_OURS, "%s",
                 err);
    end_child(child);
}

Test(check, a_socket_outside_the_tree_is_foreign_and_says_whose)
{
    int port, fd = loopback_socket(true, &port);
    pid_t other = fork();   /* holds nothing: the socket is closed in it */
    cr_assert_neq(other, -1);
    if (other == 0) {
        close(fd);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
    char err[512] = "";
    cr_assert_eq(dk_sockowner_check(other, port, err, sizeof err), DK_SOCKOWNER_FOREIGN);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", port);
    cr_assert(strstr(err, where) != NULL, "names the port: %s", err);
    cr_assert(strstr(err, "uid") != NULL, "names the owner: %s", err);
    end_child(other);
    close(fd);
}

Test(check, a_port_bound_but_not_listening_has_no_listener)
{
    int port, fd = loopback_socket(false, &port);
    char err[512] = "";
    cr_assert_eq(dk_sockowner_check(getpid(), port, err, sizeof err), DK_SOCKOWNER_NONE, "%s",
                 err);
    close(fd);
}
