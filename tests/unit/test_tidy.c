/*
 * A process's temporary folders, removed when it ends however it ends
 * (runtime/logs/dk_tidy.h). Each test forks a "host" that keeps folders in a
 * fresh base under /tmp and then ends: SIGKILLed, or normally. The test
 * process is a child subreaper, so the host's watcher, orphaned when the host
 * dies, becomes the test's child and is waited for here, not by sleeping.
 */
#include <criterion/criterion.h>

#include "dk_logdir.h"
#include "dk_tidy.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tmp_base.h"

static void setup(void)
{
    tmp_base_make("tidy");
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
}

TestSuite(tidy, .init = setup, .fini = tmp_base_remove);

/* A folder BASE/NAME, made with a file, a socket and a folder with a file in
 * it, as the kernel's folders hold; its path in a static rotating buffer. */
static char *make_full(const char *name)
{
    char *dir = at(name);
    cr_assert_eq(mkdir(dir, 0700), 0, "%s: %s", dir, strerror(errno));
    char path[600];
    snprintf(path, sizeof path, "%s/file", dir);
    write_file(path, "text\n");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/sock", dir);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert(s >= 0 && bind(s, (struct sockaddr *) &sa, sizeof sa) == 0, "%s", strerror(errno));
    close(s);
    snprintf(path, sizeof path, "%s/inner", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/inner/file", dir);
    write_file(path, "text\n");
    return dir;
}

/* Fork the host: it runs BODY, which returns 0 when its own checks passed,
 * then writes its watcher's pid to the test and ends as END says:
 * "kill" (SIGKILL), "end" (dk_tidy_end, then exit). Returns the watcher's pid
 * (-1: none), after the host has ended and its status was checked. */
static pid_t run_host(int (*body)(void), const char *end)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t host = fork();
    cr_assert(host >= 0);
    if (host == 0) {
        close(p[0]);
        int rc = body();
        pid_t w = dk_tidy_pid();
        if (write(p[1], &w, sizeof w) != (ssize_t) sizeof w)
            _exit(3);
        if (rc != 0)
            _exit(rc);
        if (strcmp(end, "kill") == 0)
            raise(SIGKILL);
        dk_tidy_end();
        /* Ended and waited for: no longer this process's child. */
        _exit(w > 0 && waitpid(w, NULL, WNOHANG) < 0 && errno == ECHILD ? 0 : 4);
    }
    close(p[1]);
    pid_t w = -1;
    cr_assert_eq(read(p[0], &w, sizeof w), (ssize_t) sizeof w);
    close(p[0]);
    int status;
    cr_assert_eq(waitpid(host, &status, 0), host);
    if (strcmp(end, "kill") == 0)
        cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "host status %#x", status);
    else
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "host status %#x", status);
    return w;
}

/* Wait for the orphaned watcher W (our child now) to finish, at most 10 s. */
static void wait_watcher(pid_t w)
{
    cr_assert(w > 0);
    for (int i = 0; i < 1000; i++) {
        pid_t got = waitpid(w, NULL, WNOHANG);
        if (got == w || (got < 0 && errno == ECHILD))
            return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cr_assert_fail("the watcher %d did not end within 10 s of its host", (int) w);
}

static int keep(const char *dir)
{
    char err[256] = "";
    return dk_tidy_keep(dir, err, sizeof err) == 0 ? 0 : (fprintf(stderr, "%s\n", err), 10);
}

/* ---- a SIGKILLed host ------------------------------------------------------ */

static int keeps_forgets_and_replaces(void)
{
    if (keep(make_full("kept")) || keep(make_full("forgotten")) || keep(make_full("replaced")))
        return 10;
    dk_tidy_forget(at("forgotten"));
    /* The name now holds another folder than the one kept. */
    char moved[600];
    snprintf(moved, sizeof moved, "%s.old", at("replaced"));
    if (rename(at("replaced"), moved) != 0 || mkdir(at("replaced"), 0700) != 0)
        return 11;
    return 0;
}

Test(tidy, a_killed_host_leaves_none_of_the_folders_it_kept)
{
    pid_t w = run_host(keeps_forgets_and_replaces, "kill");
    wait_watcher(w);
    cr_expect(!exists(at("kept")), "a kept folder outlived its SIGKILLed host");
    cr_expect(exists(at("forgotten/file")), "a forgotten folder was removed");
    cr_expect(exists(at("replaced")), "a folder that took a kept one's name was removed");
    cr_expect(exists(at("replaced.old/inner/file")), "a kept folder moved away was removed");
}

static int keeps_then_signals_its_watcher(void)
{
    if (keep(make_full("first")))
        return 10;
    pid_t w = dk_tidy_pid();
    /* A Ctrl-C, a kill or a hangup meant for the host and its group. */
    if (kill(w, SIGINT) || kill(w, SIGTERM) || kill(w, SIGHUP) || kill(w, SIGPIPE))
        return 12;
    if (keep(make_full("second")))
        return 10;
    return dk_tidy_pid() == w ? 0 : 13;    /* the same watcher took the second */
}

Test(tidy, signals_meant_for_the_host_do_not_end_its_watcher)
{
    pid_t w = run_host(keeps_then_signals_its_watcher, "kill");
    wait_watcher(w);
    cr_expect(!exists(at("first")) && !exists(at("second")));
}

static int names_its_watcher(void)
{
    if (keep(make_full("kept")))
        return 10;
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int) dk_tidy_pid());
    /* It names itself once it runs: wait for that, at most 10 s. */
    for (int i = 0; i < 1000 && strcmp(comm, "distkernel-tidy\n") != 0; i++) {
        FILE *f = fopen(path, "r");
        if (!f || !fgets(comm, sizeof comm, f))
            return 14;
        fclose(f);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return strcmp(comm, "distkernel-tidy\n") == 0 ? 0 : 15;
}

Test(tidy, the_watcher_is_named_in_ps)
{
    wait_watcher(run_host(names_its_watcher, "kill"));
}

/* ---- a host that ends normally ------------------------------------------------ */

static int keeps_one_and_removes_one(void)
{
    char *gone = make_full("removed by its user");
    if (keep(make_full("kept")) || keep(gone))
        return 10;
    /* As dk_logdir_socket_dir_remove is used: emptied, then removed. */
    char path[600];
    snprintf(path, sizeof path, "%s/inner/file", gone);
    unlink(path);
    snprintf(path, sizeof path, "%s/inner", gone);
    rmdir(path);
    snprintf(path, sizeof path, "%s/file", gone);
    unlink(path);
    snprintf(path, sizeof path, "%s/sock", gone);
    unlink(path);
    dk_logdir_socket_dir_remove(gone);
    return exists(gone) ? 16 : 0;
}

Test(tidy, a_host_that_ends_normally_has_its_watcher_done_before_it_exits)
{
    /* The host checks that dk_tidy_end collected the watcher (exit 0). */
    pid_t w = run_host(keeps_one_and_removes_one, "end");
    cr_assert(w > 0);
    cr_expect(!exists(at("kept")));
    cr_expect(!exists(at("removed by its user")));
}

static int starts_early_then_keeps(void)
{
    char err[256] = "";
    if (dk_tidy_start(err, sizeof err) != 0)
        return 21;
    pid_t early = dk_tidy_pid();
    if (early <= 0 || keep(make_full("kept")) || dk_tidy_pid() != early)
        return 22;
    return dk_tidy_start(err, sizeof err) == 0 && dk_tidy_pid() == early ? 0 : 23;
}

Test(tidy, a_watcher_started_early_keeps_what_is_kept_later)
{
    wait_watcher(run_host(starts_early_then_keeps, "kill"));
    cr_expect(!exists(at("kept")));
}

static int keeps_nothing(void)
{
    return 0;
}

Test(tidy, a_host_that_kept_nothing_starts_no_watcher)
{
    cr_assert_eq(run_host(keeps_nothing, "kill"), -1);
}

/* ---- a fork of the host --------------------------------------------------------- */

static int forks_a_child_that_keeps_and_dies(void)
{
    if (keep(make_full("host's")))
        return 10;
    pid_t host_watcher = dk_tidy_pid();
    pid_t child = fork();
    if (child == 0) {
        /* os.fork in a cell: this process is not the watcher's host. */
        if (dk_tidy_pid() != -1 || keep(make_full("child's")) || dk_tidy_pid() == host_watcher)
            _exit(17);
        raise(SIGKILL);
    }
    int status;
    if (child < 0 || waitpid(child, &status, 0) != child || !WIFSIGNALED(status))
        return 18;
    /* The child's watcher removes the child's folder, not the host's. */
    for (int i = 0; i < 1000 && exists(at("child's")); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (exists(at("child's")))
        return 19;
    return exists(at("host's/inner/file")) && dk_tidy_pid() == host_watcher ? 0 : 20;
}

Test(tidy, a_fork_of_the_host_has_a_watcher_of_its_own)
{
    wait_watcher(run_host(forks_a_child_that_keeps_and_dies, "kill"));
    cr_expect(!exists(at("host's")));
}

/* ---- what is refused ---------------------------------------------------------- */

Test(tidy, a_relative_or_overlong_path_or_a_file_is_refused_with_a_reason)
{
    char err[256] = "";
    cr_expect_eq(dk_tidy_keep("relative/path", err, sizeof err), -1);
    cr_expect(strstr(err, "not an absolute path") && strstr(err, "relative/path"), "%s", err);
    char long_path[DK_TIDY_PATH_MAX + 8];
    memset(long_path, 'a', sizeof long_path - 1);
    long_path[0] = '/';
    long_path[sizeof long_path - 1] = '\0';
    cr_expect_eq(dk_tidy_keep(long_path, err, sizeof err), -1);
    cr_expect(strstr(err, "too long"), "%s", err);
    write_file(at("file"), "text\n");
    cr_expect_eq(dk_tidy_keep(at("file"), err, sizeof err), -1);
    cr_expect(strstr(err, "is not a folder"), "%s", err);
    cr_expect_eq(dk_tidy_pid(), -1, "a refused path started a watcher");
}
