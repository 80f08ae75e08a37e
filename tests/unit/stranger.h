/*
 * Another user of the machine, for the tests of what distkernel's programs
 * say to a socket that is not their user's (test_peer.c, test_agent.c):
 * `nobody` (uid 65534), taken by a forked child with setresuid, listens at a
 * path, takes one connection, reads it to its end and reports how many
 * bytes it was sent. Taking another uid needs root (CI runs as root): the
 * callers skip otherwise.
 */
#ifndef STRANGER_H
#define STRANGER_H

#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define OTHER_UID 65534   /* nobody */

typedef struct {
    pid_t pid;
    int report;     /* the child writes how many bytes it was sent, then closes */
} stranger_t;

static void stranger_alarm(int sig)
{
    (void) sig;
}

/* As `nobody`: (with MAKE_FOLDER, first make PATH's folder, 0755) bind PATH,
 * open it to everyone, accept one connection, read it to its end (or for
 * TIMEOUT_S), report the byte count. Returns once it listens. */
static stranger_t stranger_listens(const char *path, bool make_folder, int timeout_s)
{
    int ready[2], report[2];
    cr_assert_eq(pipe(ready), 0);
    cr_assert_eq(pipe(report), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(ready[0]);
        close(report[0]);
        if (setresgid(OTHER_UID, OTHER_UID, OTHER_UID) != 0 ||
            setresuid(OTHER_UID, OTHER_UID, OTHER_UID) != 0)
            _exit(2);
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(path) >= sizeof addr.sun_path)
            _exit(5);
        memcpy(addr.sun_path, path, strlen(path) + 1);
        if (make_folder) {
            char folder[sizeof addr.sun_path];
            memcpy(folder, path, sizeof folder);
            char *slash = strrchr(folder, '/');
            if (!slash)
                _exit(6);
            *slash = '\0';
            if (mkdir(folder, 0755) != 0)
                _exit(7);
        }
        int l = socket(AF_UNIX, SOCK_STREAM, 0);
        if (l < 0 || bind(l, (struct sockaddr *) &addr, sizeof addr) != 0 || listen(l, 4) != 0 ||
            chmod(path, 0777) != 0)
            _exit(3);
        if (write(ready[1], "r", 1) != 1)
            _exit(4);
        /* At TIMEOUT_S, accept or read return EINTR (no SA_RESTART): the
         * report still goes out, so a test says what happened. */
        struct sigaction sa = {.sa_handler = stranger_alarm};
        sigemptyset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);
        alarm((unsigned) timeout_s);
        int c = accept(l, NULL, NULL);
        long total = 0;
        char buf[4096];
        ssize_t n;
        while (c >= 0 && (n = read(c, buf, sizeof buf)) > 0)
            total += n;
        dprintf(report[1], "%ld %s\n", total, c >= 0 ? "connected" : "never");
        if (make_folder) {
            unlink(path);
            char *slash = strrchr(addr.sun_path, '/');
            *slash = '\0';
            rmdir(addr.sun_path);
        }
        _exit(0);
    }
    close(ready[1]);
    close(report[1]);
    char r;
    cr_assert_eq(read(ready[0], &r, 1), 1, "the stranger could not listen");
    close(ready[0]);
    return (stranger_t) {.pid = pid, .report = report[0]};
}

/* What the stranger was sent: its byte count, and whether anyone connected. */
static long stranger_end(stranger_t *s, bool *connected)
{
    char line[64] = "";
    ssize_t n = read(s->report, line, sizeof line - 1);
    close(s->report);
    int status;
    waitpid(s->pid, &status, 0);
    cr_assert_gt(n, 0, "the stranger reported nothing");
    line[n] = '\0';
    *connected = strstr(line, "connected") != NULL;
    return atol(line);
}

#endif
