/*
 * runtime/proc/dk_spawn's last word: a command run when its host ends, however it
 * ends, and never when the host disarms it. The host here is a forked child
 * of the test, which arms the last word and then dies (or disarms it); the
 * command writes a file whose presence is the evidence.
 */
#include "dk_spawn.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[64], mark[128];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/dk-test-spawn-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(mark, sizeof mark, "%s/said", dir);
}

static void teardown(void)
{
    unlink(mark);
    rmdir(dir);
}

TestSuite(last_word, .init = setup, .fini = teardown);

static bool appears(const char *path, int within_ms)
{
    for (int waited = 0; waited <= within_ms; waited += 20) {
        if (access(path, F_OK) == 0)
            return true;
        usleep(20000);
    }
    return false;
}

/* How the host ends after arming. */
enum { DIE_KILL, DIE_EXIT, DISARM, SIGNAL_IT_THEN_KILL, FORK_THEN_KILL };

static pid_t forked_child = -1;

/* A host process that arms the last word ("write MARK") and then ends as told.
 * Returns the last word's pid (reported through a pipe). */
static pid_t host(int how)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t h = fork();
    cr_assert_geq(h, 0);
    if (h == 0) {
        close(p[0]);
        char cmd[256];
        snprintf(cmd, sizeof cmd, "echo said > %s", mark);
        char *argv[] = {"sh", "-c", cmd, NULL};
        int pid, fd;
        char err[256];
        if (dk_spawn_last_word(argv, &pid, &fd, err, sizeof err) < 0) {
            fprintf(stderr, "%s\n", err);
            _exit(3);
        }
        if (write(p[1], &pid, sizeof pid) != sizeof pid)
            _exit(4);
        if (how == SIGNAL_IT_THEN_KILL) {
            /* What a terminal's Ctrl-C or a hangup would send: ignored. */
            kill(pid, SIGINT);
            kill(pid, SIGTERM);
            kill(pid, SIGHUP);
            usleep(200000);
        }
        if (how == FORK_THEN_KILL) {
            /* A child forked without exec (os.fork, a DataLoader worker)
             * holds a copy of the pipe's write end and outlives the host. */
            pid_t c = fork();
            if (c == 0) {
                sleep(30);
                _exit(0);
            }
            if (write(p[1], &c, sizeof c) != sizeof c)
                _exit(4);
        }
        if (how == DISARM) {
            dk_spawn_sentinel_end(&pid, &fd);
            _exit(pid == -1 && fd == -1 ? 0 : 5);
        }
        if (how == DIE_EXIT)
            _exit(0);
        raise(SIGKILL);
        _exit(6);
    }
    close(p[1]);
    int pid = -1;
    cr_assert_eq(read(p[0], &pid, sizeof pid), (ssize_t) sizeof pid);
    if (how == FORK_THEN_KILL)
        cr_assert_eq(read(p[0], &forked_child, sizeof forked_child),
                     (ssize_t) sizeof forked_child);
    close(p[0]);
    int status;
    cr_assert_eq(waitpid(h, &status, 0), h);
    if (how == DISARM)
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    return pid;
}

Test(last_word, runs_when_its_host_is_killed)
{
    host(DIE_KILL);
    cr_expect(appears(mark, 5000), "the command did not run after the host's SIGKILL");
}

Test(last_word, runs_when_its_host_is_killed_while_a_forked_child_lives)
{
    host(FORK_THEN_KILL);
    cr_assert_gt(forked_child, 0);
    bool said = appears(mark, 5000);
    bool child_alive = kill(forked_child, 0) == 0;
    kill(forked_child, SIGKILL);
    cr_expect(child_alive, "the forked child was gone before the check: the test proves nothing");
    cr_expect(said, "the command did not run: the forked child's copy of the pipe kept it waiting");
}

Test(last_word, runs_when_its_host_exits)
{
    host(DIE_EXIT);
    cr_expect(appears(mark, 5000), "the command did not run after the host's exit");
}

Test(last_word, outlives_interrupt_terminate_and_hangup_meant_for_the_host)
{
    host(SIGNAL_IT_THEN_KILL);
    cr_expect(appears(mark, 5000), "SIGINT/SIGTERM/SIGHUP disarmed the last word");
}

Test(last_word, never_runs_when_disarmed)
{
    pid_t pid = host(DISARM);
    cr_assert_gt(pid, 0);
    cr_expect_not(appears(mark, 600), "a disarmed last word ran its command");
    /* and it is gone (reaped by its host) */
    cr_expect(kill(pid, 0) != 0 && errno == ESRCH, "the last word %d is still there", pid);
}

Test(last_word, a_command_not_found_is_said_before_anything_starts)
{
    char *argv[] = {"no-such-command-dk", NULL};
    int pid = 7, fd = 7;
    char err[256] = "";
    cr_assert_eq(dk_spawn_last_word(argv, &pid, &fd, err, sizeof err), -1);
    cr_expect_eq(pid, -1);
    cr_expect_eq(fd, -1);
    cr_expect(strstr(err, "no-such-command-dk"), "%s", err);
}

/* A host that lives on has its last word act now (a release of its Slurm job
 * that failed twice): the command runs, and the process is collected when it
 * is done, so that no zombie stays beside the host for its whole life. The
 * host is this test's process. */
Test(last_word, acting_now_runs_it_and_leaves_no_zombie)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "sleep 0.3; echo said > %s", mark);
    char *argv[] = {"sh", "-c", cmd, NULL};
    int pid = -1, fd = -1;
    char err[256] = "";
    cr_assert_eq(dk_spawn_last_word(argv, &pid, &fd, err, sizeof err), 0, "%s", err);
    cr_assert_gt(pid, 0);
    int was = pid;
    dk_spawn_last_word_now(&pid, &fd);   /* returns before the command is done */
    cr_expect_eq(pid, -1);
    cr_expect_eq(fd, -1);
    cr_expect(appears(mark, 5000), "the last word did not act");
    bool gone = false;
    for (int i = 0; i < 250 && !gone; i++) {
        gone = kill(was, 0) != 0 && errno == ESRCH;
        if (!gone)
            usleep(20000);
    }
    cr_expect(gone, "the last word %d was left a zombie", was);
}

/* The kernel's MASTER_PORT: outside the ephemeral range, where another run's
 * outgoing connections could take it before rank 0 binds it, and free on
 * every address (rank 0's TCPStore binds them all). */
Test(free_port, is_outside_the_ephemeral_range_and_free_on_every_address)
{
    for (int i = 0; i < 20; i++) {
        char err[256] = "";
        int port = dk_spawn_free_port(err, sizeof err);
        cr_assert(port >= DK_SPAWN_PORT_LOW && port < DK_SPAWN_PORT_HIGH, "port %d: %s", port,
                  err);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert(fd >= 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons((uint16_t) port);
        cr_assert(bind(fd, (struct sockaddr *) &a, sizeof a) == 0, "port %d: %s", port,
                  strerror(errno));
        close(fd);
    }
}

/* A process started with OPTS: its session and group as dk_spawn_with leaves
 * them when it returns (no waiting: the child has set them before its exec). */
static void started_in(bool session, pid_t *sid, pid_t *pgid)
{
    char *argv[] = {"/bin/sleep", "30", NULL};
    char *envp[] = {NULL};
    dk_spawn_opts_t opts = DK_SPAWN_OPTS_INIT;
    opts.session = session;
    dk_spawned_t sp;
    char err[256] = "";
    cr_assert_eq(dk_spawn_with(argv[0], argv, envp, &opts, &sp, err, sizeof err), 0, "%s", err);
    *sid = getsid(sp.pid);
    *pgid = getpgid(sp.pid);
    kill(-sp.pid, SIGKILL);     /* the group, as the job ends a rank */
    int status;
    cr_assert_eq(waitpid(sp.pid, &status, 0), sp.pid);
    cr_expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    cr_expect_eq(sp.pid, *pgid, "the child leads its group");
    *sid = *sid == sp.pid ? 0 : *sid;   /* 0: it leads its session */
    if (sp.out_fd >= 0)
        close(sp.out_fd);
    if (sp.err_fd >= 0)
        close(sp.err_fd);
    if (sp.pidfd >= 0)
        close(sp.pidfd);
}

/* A rank leads a session of its own, so that the scheduler's autogroups give
 * it its own share (dk_spawn.h); other children stay in the caller's. */
Test(spawn, a_session_of_its_own_only_when_asked_and_its_group_either_way)
{
    pid_t sid, pgid;
    started_in(true, &sid, &pgid);
    cr_expect_eq(sid, 0, "asked for a session, the child is in session %d", (int) sid);
    started_in(false, &sid, &pgid);
    cr_expect_eq(sid, getsid(0), "the child left the caller's session for %d", (int) sid);
}
