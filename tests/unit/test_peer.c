/*
 * Another user on a rank's node (issue 38, items 1 and 2), against the real
 * distkernel-rank: a socket that user binds where a template's was, and a
 * PYTHONPATH folder that user made, with a sitecustomize.py in it. And the
 * peer check itself (runtime/base/dk_peer.h).
 *
 * The other user is `nobody` (uid 65534), taken by a forked child with
 * setresuid, so most tests need root (CI runs as root) and skip otherwise.
 */
#include <criterion/criterion.h>

#include "dk_peer.h"
#include "stranger.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define NO_LEAK_CHECK "ASAN_OPTIONS=detect_leaks=0"   /* the embedded CPython's, not ours */

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/dk-test-peer-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (dir[0] && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

TestSuite(peer, .init = make_dir, .fini = remove_dir);

static void need_root(void)
{
    if (geteuid() != 0)
        cr_skip_test("acting as another user needs root");
}

/* The stranger listening at DIR/NAME (DIR opened to everyone for it); the
 * path in PATH. */
static stranger_t stranger_in_dir(const char *name, int timeout_s, char *path, size_t len)
{
    need_root();
    snprintf(path, len, "%s/%s", dir, name);
    cr_assert_eq(chmod(dir, 0777), 0);
    return stranger_listens(path, false, timeout_s);
}

static int connect_to(const char *path)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    cr_assert_lt(strlen(path), sizeof addr.sun_path);
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *) &addr, sizeof addr), 0, "%s", strerror(errno));
    return fd;
}

Test(peer, a_connection_of_our_own_passes)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    char err[256] = "";
    cr_assert_eq(dk_peer_check(sv[0], "ours", err, sizeof err), 0, "%s", err);
    close(sv[0]);
    close(sv[1]);
}

Test(peer, a_socket_another_user_listens_on_is_refused_naming_it, .timeout = 20)
{
    char path[128];
    stranger_t s = stranger_in_dir("template", 10, path, sizeof path);
    int fd = connect_to(path);
    char err[256] = "";
    cr_assert_eq(dk_peer_check(fd, "the template's socket", err, sizeof err), -1);
    cr_assert(strstr(err, "the template's socket belongs to another user (uid 65534"), "%s",
              err);
    close(fd);
    bool connected;
    cr_assert_eq(stranger_end(&s, &connected), 0);
}

/* ---- the real distkernel-rank --------------------------------------------- */

/* Run distkernel-rank with ENV (NULL-terminated) to its end; its exit status. */
static int run_rank(const char *const *env)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        dup2(null, 1);
        dup2(null, 2);
        execle(RANK_EXE, RANK_EXE, (char *) NULL, (char *const *) env);
        _exit(127);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return status;
}

static char *slurp(const char *path)
{
    static char buf[8192];
    buf[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f)
        return buf;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Item 2, as it was reproduced: the template's folder went with its agent,
 * and another user bound a socket at its path before a slow rank asked. The
 * rank must send nothing there (its environment holds the run's key and
 * exported secrets; its request passes its output descriptors), and goes on
 * cold saying why in warm.log. */
Test(peer, a_rank_sends_nothing_to_a_template_socket_of_another_user, .timeout = 60)
{
    char sock[128], logs[128], log[160], warm_env[160], log_env[200], warm_log[200];
    stranger_t s = stranger_in_dir("template", 30, sock, sizeof sock);
    /* Not under DIR, which the stranger's socket opens to everyone: a log
     * folder under it would be refused, rightly. */
    snprintf(logs, sizeof logs, "/tmp/dk-test-peer-logs-XXXXXX");
    cr_assert_not_null(mkdtemp(logs));
    snprintf(log, sizeof log, "%s/rank-0.log", logs);
    snprintf(warm_env, sizeof warm_env, "DISTKERNEL_WARM_SOCKET=%s", sock);
    snprintf(log_env, sizeof log_env, "DISTKERNEL_LOG=%s", log);
    snprintf(warm_log, sizeof warm_log, "%s/warm.log", logs);
    const char *env[] = {"PATH=/usr/bin:/bin", "DISTKERNEL_GLUE_DIR=" PY_SRC, NO_LEAK_CHECK,
                         warm_env, log_env, "RANK=0", "HF_TOKEN=hf_secret_of_the_victim",
                         "DISTKERNEL_BC=/nonexistent/bc.sock",
                         "DISTKERNEL_BC_KEY=00112233445566778899aabbccddeeff"
                         "00112233445566778899aabbccddeeff",
                         NULL};
    int status = run_rank(env);
    bool connected;
    long sent = stranger_end(&s, &connected);
    cr_assert(connected, "the rank never reached the socket (the test proves nothing)");
    cr_assert_eq(sent, 0, "the rank sent another user's template %ld bytes", sent);
    /* cold, then ended by its unreachable back channel */
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) != 0, "status %d", status);
    const char *why = slurp(warm_log);
    bool said = strstr(why, "rank 0 started cold: the warm-start template's socket") &&
                strstr(why, "belongs to another user (uid 65534");
    unlink(warm_log);
    rmdir(logs);
    cr_assert(said, "warm.log: %s", why);
}

/* Item 1: a PYTHONPATH folder another user made on the rank's node, with a
 * sitecustomize.py in it that CPython's `site` would import as it starts.
 * With OURS, the folder is the user's own, and the same file runs: the
 * test can tell. */
static bool sitecustomize_ran(bool ours)
{
    char lib[128], site[160], marker[160], pp[200], marker_env[200];
    snprintf(lib, sizeof lib, "%s/lib", dir);
    snprintf(site, sizeof site, "%s/sitecustomize.py", lib);
    snprintf(marker, sizeof marker, "%s/ran", dir);
    cr_assert_eq(mkdir(lib, 0755), 0);
    FILE *f = fopen(site, "w");
    cr_assert_not_null(f);
    fprintf(f, "import os\nopen(os.environ['MARKER'], 'w').write('planted')\n");
    fclose(f);
    if (!ours) {
        cr_assert_eq(chown(site, OTHER_UID, OTHER_UID), 0);
        cr_assert_eq(chown(lib, OTHER_UID, OTHER_UID), 0);
    }
    cr_assert_eq(chmod(dir, 0755), 0);   /* ours, and the marker's */
    snprintf(pp, sizeof pp, "PYTHONPATH=/nonexistent/dk-lib:%s", lib);
    snprintf(marker_env, sizeof marker_env, "MARKER=%s", marker);
    /* DISTKERNEL_CWD: started by a node agent, on another node than the
     * kernel's; the back channel is unreachable, so the rank ends once
     * Python has started. */
    const char *env[] = {"PATH=/usr/bin:/bin", "DISTKERNEL_GLUE_DIR=" PY_SRC, NO_LEAK_CHECK, pp,
                         marker_env, "DISTKERNEL_CWD=/", "RANK=1",
                         "DISTKERNEL_BC=/nonexistent/bc.sock",
                         "DISTKERNEL_BC_KEY=00112233445566778899aabbccddeeff"
                         "00112233445566778899aabbccddeeff",
                         NULL};
    int status = run_rank(env);
    cr_assert(WIFEXITED(status), "status %d", status);
    return access(marker, F_OK) == 0;
}

Test(peer, a_pythonpath_folder_of_another_user_is_not_imported_from_on_another_node,
     .timeout = 60)
{
    need_root();
    cr_assert_not(sitecustomize_ran(false), "another user's sitecustomize.py ran in the rank");
}

Test(peer, a_pythonpath_folder_of_the_users_own_is_imported_from_on_another_node, .timeout = 60)
{
    need_root();
    cr_assert(sitecustomize_ran(true), "the user's own PYTHONPATH entry was not used");
}

/* ---- the rank's back channel (python/distkernel/_backchannel.py) ----------- */

/* Run python3 -c CODE with distkernel's package on its path; its exit code. */
static int run_python(const char *code, const char *arg)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        const char *env[] = {"PATH=/usr/bin:/bin", "PYTHONPATH=" PY_SRC, NULL};
        execle("/usr/bin/python3", "python3", "-c", code, arg, (char *) NULL,
               (char *const *) env);
        _exit(127);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "status %d", status);
    return WEXITSTATUS(status);
}

#define EXPECT_REFUSAL(words)                                                              \
    "import sys\n"                                                                         \
    "from distkernel import _backchannel as bc\n"                                          \
    "try:\n"                                                                               \
    "    bc.BackChannel(sys.argv[1], b'k' * 32, 0)\n"                                      \
    "except bc.BackChannelError as exc:\n"                                                 \
    "    sys.exit(7 if " words " else print(exc) or 8)\n"                                  \
    "sys.exit(9)\n"

Test(peer, a_rank_sends_nothing_to_a_back_channel_socket_of_another_user, .timeout = 30)
{
    char path[128];
    stranger_t s = stranger_in_dir("relay.sock", 20, path, sizeof path);
    int rc = run_python(EXPECT_REFUSAL("'belongs to another user (uid 65534' in str(exc)"), path);
    bool connected;
    long sent = stranger_end(&s, &connected);
    cr_assert(connected, "the rank never reached the socket (the test proves nothing)");
    cr_assert_eq(sent, 0, "the rank sent another user's socket %ld bytes", sent);
    cr_assert_eq(rc, 7, "exit %d (9: it connected; 8: another refusal)", rc);
}

/* Issue 38, item 3: an agent without a relay once gave its ranks its own
 * tcp: address, which the rank took for a relative socket path. */
Test(peer, a_back_channel_that_is_not_an_absolute_socket_path_is_refused, .timeout = 30)
{
    int rc = run_python(EXPECT_REFUSAL("'is not the absolute path of a Unix socket' in str(exc)"),
                        "tcp:127.0.0.1:9");
    cr_assert_eq(rc, 7, "exit %d", rc);
}
