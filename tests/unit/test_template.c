/*
 * The warm-start template (runtime/launch/dk_template.c) with the real rank program
 * (build/runtime/rank/distkernel-rank, the Python glue from the source tree): it
 * becomes ready, forks jobs' ranks that are the job's in every way (exit
 * codes, signals, output), refuses when a module left a thread running (the
 * ranks then start cold and warm.log says why), reports a failed import, and
 * leaves nothing when destroyed.
 */
#include "dk_job.h"
#include "dk_template.h"
#include "proc_alive.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static char out_text[2][8192];
static size_t out_len[2];

static void on_output(void *data, int rank, int fd, const char *bytes, size_t len)
{
    (void)data;
    if (getenv("DK_TEST_DEBUG") && fd == 2)
        fprintf(stderr, "[rank %d] %.*s", rank, (int)len, bytes);
    if (fd == 1 && rank >= 0 && rank < 2 && out_len[rank] + len < sizeof out_text[rank]) {
        memcpy(out_text[rank] + out_len[rank], bytes, len);
        out_len[rank] += len;
    }
}

static char error_text[4096];

static void on_message(void *data, int rank, bool is_error, const void *bytes, size_t len)
{
    (void)data;
    (void)rank;
    if (is_error && !error_text[0])
        snprintf(error_text, sizeof error_text, "%.*s", (int)len, (const char *)bytes);
}

static const dk_sink_t sink = {.on_output = on_output, .on_message = on_message};

/* Under the sanitizers the rank program is instrumented too: what the
 * embedded CPython keeps at exit is not ours to report. */
#define NO_LEAK_CHECK "ASAN_OPTIONS=detect_leaks=0"

static const char *env[] = {"PATH=/usr/bin:/bin", "DISTKERNEL_GLUE_DIR=" PY_SRC,
                            "WARM_TEST=from-the-job", NO_LEAK_CHECK, NULL};

static dk_template_t *ready_template(const char *modules)
{
    char err[2048] = "";
    dk_template_t *t = dk_template_start(RANK_EXE, env, modules, NULL, "fp", err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    int ready = dk_template_ready(t, 60000, err, sizeof err);
    cr_assert_eq(ready, 1, "the template is not ready (%d): %s", ready, err);
    return t;
}

/* A pickled cell for distkernel._rank (made by the same cloudpickle). */
static char *payload_of(const char *code, size_t *len)
{
    setenv("DK_TEST_CELL", code, 1);
    const char *cmd = PYTHON3 " -c 'import cloudpickle, os, sys; sys.stdout.buffer.write("
                      "cloudpickle.dumps({\"kind\": \"cell\", \"code\": os.environ[\"DK_TEST_CELL\"], "
                      "\"names\": {}}))'";
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    char *buf = malloc(1 << 16);
    *len = fread(buf, 1, 1 << 16, p);
    cr_assert_eq(pclose(p), 0);
    return buf;
}

static char log_dir[256];

static dk_job_t *run_job_env(const char *socket, const char *const *job_env, const char *code)
{
    snprintf(log_dir, sizeof log_dir, "/tmp/dk-test-template-XXXXXX");
    cr_assert_not_null(mkdtemp(log_dir));
    memset(out_len, 0, sizeof out_len);
    memset(out_text, 0, sizeof out_text);
    error_text[0] = '\0';
    size_t len;
    char *payload = payload_of(code, &len);
    dk_job_spec_t spec = {.world_size = 2, .rank_exe = RANK_EXE, .env = job_env,
                          .payload = payload, .payload_len = len, .grace_s = 1,
                          .log_dir = log_dir, .warm_socket = socket};
    char err[512] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    free(payload);
    cr_assert_not_null(job, "%s", err);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    return job;
}

static dk_job_t *run_job(dk_template_t *t, const char *code)
{
    return run_job_env(dk_template_socket(t), env, code);
}

static void remove_logs(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", log_dir);
    cr_assert_eq(system(cmd), 0);
}

Test(template, ranks_are_forked_from_it_with_the_jobs_environment, .timeout = 120)
{
    dk_template_t *t = ready_template("json");
    char why[512];
    cr_assert_eq(dk_template_check(t, why, sizeof why), 0, "%s", why);
    cr_assert_gt(dk_template_rss_kb(t), 0);
    dk_job_t *job = run_job(t, "import os\n"
                               "print(os.getppid(), os.environ['RANK'], os.environ['WARM_TEST'],"
                               " 'DISTKERNEL_WARM_SOCKET' in os.environ, os.getpgrp() == os.getppid(),"
                               " os.getpgrp() == os.getpid() == os.getsid(0), flush=True)\n");
    cr_assert_eq(dk_job_end(job), DK_END_OK, "end %d rank 0: %s exit %d sig %d state %d: %s", dk_job_end(job), out_text[0], dk_job_rank_exit_code(job, 0), dk_job_rank_signal(job, 0), dk_job_rank_state(job, 0), error_text);
    for (int r = 0; r < 2; r++) {
        char want[128];
        /* Parent: the template. Group: its own, as its session (so the
         * scheduler gives it its own share, dk_spawn.h), not the template's. */
        snprintf(want, sizeof want, "%d %d from-the-job False False True\n", dk_template_pid(t),
                 r);
        cr_assert_str_eq(out_text[r], want);
    }
    char warm_log[300];
    snprintf(warm_log, sizeof warm_log, "%s/warm.log", log_dir);
    cr_assert_neq(access(warm_log, F_OK), 0, "a warm rank wrote warm.log");
    dk_job_destroy(&job);
    remove_logs();
    int pid = dk_template_pid(t);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", dk_template_socket(t));
    dk_template_destroy(&t);
    cr_assert_null(t);
    cr_assert(!alive(pid), "the template outlived dk_template_destroy");
    *strrchr(dir, '/') = '\0';
    cr_assert_neq(access(dir, F_OK), 0, "the template's folder %s is left", dir);
}

Test(template, a_warm_ranks_exit_code_and_signal_are_the_jobs, .timeout = 120)
{
    dk_template_t *t = ready_template("");
    dk_job_t *job = run_job(t, "import os, signal\n"
                               "if os.environ['RANK'] == '1':\n"
                               "    os.kill(os.getpid(), signal.SIGSEGV)\n"
                               "import time; time.sleep(30)\n");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_signal(job, 1), SIGSEGV);
    /* Rank 0 was stopped by the job's ladder, through its group. */
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    dk_job_destroy(&job);
    remove_logs();
    job = run_job(t, "import os, time\nif os.environ['RANK'] == '0':\n    os._exit(3)\n"
                     "time.sleep(30)\n");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 3);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    dk_job_destroy(&job);
    remove_logs();
    dk_template_destroy(&t);
}

Test(template, a_module_that_starts_a_thread_makes_ranks_start_cold, .timeout = 120)
{
    char mod_dir[] = "/tmp/dk-test-mod-XXXXXX";
    cr_assert_not_null(mkdtemp(mod_dir));
    char path[300];
    snprintf(path, sizeof path, "%s/threaded_mod.py", mod_dir);
    FILE *f = fopen(path, "w");
    fputs("import threading, time\n"
          "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n", f);
    fclose(f);
    char pp[320];
    snprintf(pp, sizeof pp, "PYTHONPATH=%s", mod_dir);
    const char *tenv[] = {"PATH=/usr/bin:/bin", "DISTKERNEL_GLUE_DIR=" PY_SRC, pp, NO_LEAK_CHECK,
                          NULL};
    char err[2048] = "";
    dk_template_t *t = dk_template_start(RANK_EXE, tenv, "threaded_mod", NULL, "", err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    cr_assert_eq(dk_template_ready(t, 60000, err, sizeof err), 1, "%s", err);
    cr_assert_eq(dk_template_check(t, err, sizeof err), -1);
    cr_assert(strstr(err, "threads run in the template"), "%s", err);
    dk_job_t *job = run_job(t, "import os\nprint(os.getppid(), flush=True)\n");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    /* Cold: the ranks are the job's own children, not the template's. */
    char tpid[32];
    snprintf(tpid, sizeof tpid, "%d\n", dk_template_pid(t));
    cr_assert_str_neq(out_text[0], tpid);
    char warm_log[300], text[1024] = "";
    snprintf(warm_log, sizeof warm_log, "%s/warm.log", log_dir);
    f = fopen(warm_log, "r");
    cr_assert_not_null(f, "no warm.log saying why the ranks started cold");
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_assert(strstr(text, "started cold: the template refused: ") && strstr(text, "threads"),
              "%s", text);
    dk_job_destroy(&job);
    remove_logs();
    dk_template_destroy(&t);
    unlink(path);
    rmdir(mod_dir);
}

Test(template, a_module_that_cannot_be_imported_is_the_reason, .timeout = 120)
{
    char err[2048] = "";
    dk_template_t *t = dk_template_start(RANK_EXE, env, "no_such_module_dk", NULL, "", err,
                                         sizeof err);
    cr_assert_not_null(t, "%s", err);
    cr_assert_eq(dk_template_ready(t, 60000, err, sizeof err), -1);
    cr_assert(strstr(err, "no_such_module_dk") && strstr(err, "exited with code 3"), "%s", err);
    dk_template_destroy(&t);
}

/* A template whose one warm module, in a fresh folder, is SOURCE. */
static dk_template_t *template_with_module(const char *source, char *mod_dir, char *path,
                                           size_t pathlen)
{
    cr_assert_not_null(mkdtemp(mod_dir));
    snprintf(path, pathlen, "%s/banner_mod.py", mod_dir);
    FILE *f = fopen(path, "w");
    fputs(source, f);
    fclose(f);
    char pp[320];
    snprintf(pp, sizeof pp, "PYTHONPATH=%s", mod_dir);
    const char *tenv[] = {"PATH=/usr/bin:/bin", "DISTKERNEL_GLUE_DIR=" PY_SRC, pp, NO_LEAK_CHECK,
                          NULL};
    char err[2048] = "";
    dk_template_t *t = dk_template_start(RANK_EXE, tenv, "banner_mod", NULL, "", err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    return t;
}

Test(template, a_long_banner_printed_at_import_does_not_hide_ready, .timeout = 120)
{
    char mod_dir[] = "/tmp/dk-test-mod-XXXXXX", path[300], err[2048] = "";
    dk_template_t *t = template_with_module("print('b' * 200)\nprint('x' * 5000, end='')\n",
                                            mod_dir, path, sizeof path);
    cr_assert_eq(dk_template_ready(t, 60000, err, sizeof err), 1, "%s", err);
    cr_assert_eq(dk_template_check(t, err, sizeof err), 0, "%s", err);
    dk_template_destroy(&t);
    unlink(path);
    rmdir(mod_dir);
}

Test(template, ready_counts_only_as_a_line_of_its_own, .timeout = 120)
{
    char mod_dir[] = "/tmp/dk-test-mod-XXXXXX", path[300], err[2048] = "";
    dk_template_t *t = template_with_module("import time\nprint('already', flush=True)\n"
                                            "time.sleep(3600)\n", mod_dir, path, sizeof path);
    cr_assert_eq(dk_template_ready(t, 3000, err, sizeof err), 0, "%s", err);
    dk_template_destroy(&t);
    unlink(path);
    rmdir(mod_dir);
}

Test(template, dk_template_kill_ends_it_through_its_pidfd, .timeout = 120)
{
    dk_template_t *t = ready_template("");
    char err[2048] = "";
    dk_template_kill(t);
    int ready = 1;
    for (int i = 0; i < 100 && ready == 1; i++) {
        ready = dk_template_ready(t, 0, err, sizeof err);
        if (ready == 1)
            usleep(100 * 1000);
    }
    cr_assert_eq(ready, -1, "%s", err);
    /* SIGTERM first, on which it ends its ranks' groups and then itself. */
    cr_assert(strstr(err, "killed by signal 15"), "%s", err);
    /* Reaped: ending it now signals nothing (its pid may be another's). */
    dk_template_end(t);
    dk_template_destroy(&t);
}

/* A "template" that hangs up on each request after its header. */
static void *hang_up(void *arg)
{
    int listener = *(int *)arg;
    for (int i = 0; i < 2; i++) {
        int c = accept(listener, NULL, NULL);
        if (c < 0)
            continue;
        char head[8];   /* the header (its fds dropped), then no more */
        ssize_t n = recv(c, head, sizeof head, MSG_WAITALL);
        (void)n;
        close(c);
    }
    return NULL;
}

Test(template, a_template_that_hangs_up_mid_request_sends_the_rank_cold, .timeout = 120)
{
    char dir[] = "/tmp/dk-test-hangup-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s/template", dir);
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    cr_assert(listener >= 0 && bind(listener, (struct sockaddr *)&addr, sizeof addr) == 0 &&
              listen(listener, 8) == 0);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, hang_up, &listener), 0);
    /* A request far larger than the socket's buffer: the rank is still
     * sending it when the template hangs up. */
    static char big[8][100000];
    const char *big_env[16];
    size_t k = 0;
    for (; env[k]; k++)
        big_env[k] = env[k];
    for (int i = 0; i < 8; i++) {
        snprintf(big[i], 16, "BIG%d=", i);
        memset(big[i] + 5, 'x', sizeof big[i] - 6);
        big[i][sizeof big[i] - 1] = '\0';
        big_env[k++] = big[i];
    }
    big_env[k] = NULL;
    dk_job_t *job = run_job_env(addr.sun_path, big_env, "print('cold', flush=True)\n");
    pthread_join(th, NULL);
    cr_assert_eq(dk_job_end(job), DK_END_OK, "rank 0 exit %d signal %d: %s",
                 dk_job_rank_exit_code(job, 0), dk_job_rank_signal(job, 0), error_text);
    cr_assert_str_eq(out_text[0], "cold\n");
    dk_job_destroy(&job);
    remove_logs();
    close(listener);
    unlink(addr.sun_path);
    rmdir(dir);
}

static int count_fds(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    cr_assert_not_null(d);
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

Test(template, a_request_cut_short_after_its_fds_leaks_none_in_the_template, .timeout = 120)
{
    dk_template_t *t = ready_template("");
    int pid = dk_template_pid(t);
    int before = count_fds(pid);
    for (int i = 0; i < 3; i++) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        snprintf(addr.sun_path, sizeof addr.sun_path, "%s", dk_template_socket(t));
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0);
        /* An F request promising a body of 100 bytes, with two fds; then gone. */
        char head[8] = {'F', 0, 0, 0, 0, 0, 0, 100};
        int fds[2] = {1, 2};
        union {
            char buf[CMSG_SPACE(sizeof fds)];
            struct cmsghdr align;
        } ctl;
        struct iovec iov = {.iov_base = head, .iov_len = sizeof head};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                             .msg_controllen = sizeof ctl.buf};
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof fds);
        memcpy(CMSG_DATA(c), fds, sizeof fds);
        cr_assert_eq(sendmsg(fd, &msg, MSG_NOSIGNAL), (ssize_t)sizeof head);
        close(fd);
    }
    /* The template still serves (it handled all three), and holds no more fds. */
    char err[2048] = "";
    cr_assert_eq(dk_template_check(t, err, sizeof err), 0, "%s", err);
    int after = count_fds(pid);
    cr_assert_eq(after, before, "the template holds %d fds, %d before", after, before);
    dk_template_destroy(&t);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, template_takes_null)
{
    dk_template_destroy(NULL);
    dk_template_t *none = NULL;
    dk_template_destroy(&none);
    cr_assert_null(none);
}
