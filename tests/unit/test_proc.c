/*
 * Running one helper program to its end (runtime/proc/dk_proc.h), with small
 * programs written in sh: stdout kept and bounded, stderr handed over, the
 * exit status and the killing signal, a start failure, and a cancel that
 * climbs the stop ladder (SIGINT, then SIGTERM, then SIGKILL) when the
 * program ignores a rung, leaving nothing behind.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dk_proc.h"
#include "proc_alive.h"

extern char **environ;

static char errbuf[4096];
static size_t errlen;

static void on_stderr(void *data, const char *bytes, size_t len)
{
    (void) data;
    cr_assert_lt(errlen + len, sizeof errbuf);
    memcpy(errbuf + errlen, bytes, len);
    errlen += len;
    errbuf[errlen] = '\0';
}

static bool cancel_on_ready;

/* Cancel once the program said it is ready (its traps are set). */
static bool cancel_when_ready(void *data)
{
    (void) data;
    return strstr(errbuf, "ready") != NULL;
}

static int run_sh(const char *script, size_t max_out, dk_proc_result_t *res)
{
    char *argv[] = {"sh", "-c", (char *) script, NULL};
    dk_proc_spec_t spec = {.path = "/bin/sh", .argv = argv, .envp = environ,
                           .max_out = max_out, .grace_s = 0.3, .on_stderr = on_stderr,
                           .cancelled = cancel_on_ready ? cancel_when_ready : NULL};
    char err[512] = "";
    int rc = dk_proc_run(&spec, res, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    return rc;
}

Test(proc, keeps_stdout_hands_over_stderr_and_says_the_exit_code)
{
    dk_proc_result_t res;
    run_sh("printf '{\"a\": 1}'; echo oops >&2; exit 3", 1024, &res);
    cr_assert_str_eq(res.out, "{\"a\": 1}");
    cr_assert_eq(res.out_len, 8);
    cr_assert_str_eq(errbuf, "oops\n");
    cr_assert_eq(res.exit_code, 3);
    cr_assert_eq(res.term_signal, 0);
    cr_assert_not(res.out_overflow);
    cr_assert_not(res.cancelled);
    dk_proc_result_free(&res);
}

Test(proc, a_program_that_writes_nothing_gives_an_empty_string)
{
    dk_proc_result_t res;
    run_sh("exit 0", 1024, &res);
    cr_assert_not_null(res.out);
    cr_assert_str_eq(res.out, "");
    cr_assert_eq(res.exit_code, 0);
    dk_proc_result_free(&res);
}

Test(proc, stdout_past_the_bound_is_cut_and_said)
{
    dk_proc_result_t res;
    run_sh("head -c 100000 /dev/zero | tr '\\0' x", 1000, &res);
    cr_assert(res.out_overflow);
    cr_assert_eq(res.out_len, 1000);
    cr_assert_eq(strspn(res.out, "x"), 1000);
    cr_assert_eq(res.exit_code, 0, "the program still ran to its end");
    dk_proc_result_free(&res);
}

Test(proc, a_signal_that_ends_it_is_said)
{
    dk_proc_result_t res;
    run_sh("kill -USR1 $$", 1024, &res);
    cr_assert_eq(res.term_signal, SIGUSR1);
    cr_assert_eq(res.exit_code, -1);
    dk_proc_result_free(&res);
}

Test(proc, a_program_that_cannot_start_is_an_error_with_its_name)
{
    char *argv[] = {"nope", NULL};
    dk_proc_spec_t spec = {.path = "/nonexistent/helper", .argv = argv, .envp = environ,
                           .max_out = 10};
    dk_proc_result_t res;
    char err[512] = "";
    cr_assert_eq(dk_proc_run(&spec, &res, err, sizeof err), -1);
    cr_assert(strstr(err, "/nonexistent/helper") && strstr(err, strerror(ENOENT)), "%s", err);
    cr_assert_null(res.out);
}

/* Whether the program's stderr says it got INT, then TERM (sh may add its own
 * "Terminated" line for a killed sleep). */
static bool got_int_then_term(void)
{
    const char *i = strstr(errbuf, "INT\n");
    return i && strstr(i, "TERM\n");
}

/* The script records each signal it gets in stderr, then does what it is told. */
#define TRAPS(on_int, on_term)                                                          \
    "trap 'echo INT >&2; " on_int "' INT; trap 'echo TERM >&2; " on_term "' TERM; "     \
    "echo ready >&2; while :; do sleep 0.05; done"

TestSuite(cancel, .timeout = 30);   /* a ladder that never climbs hangs: fail instead */

Test(cancel, sigint_ends_a_program_that_heeds_it)
{
    cancel_on_ready = true;
    dk_proc_result_t res;
    run_sh(TRAPS("exit 130", "exit 143"), 1024, &res);
    cr_assert(res.cancelled);
    cr_assert_str_eq(errbuf, "ready\nINT\n");
    cr_assert_eq(res.exit_code, 130);
    dk_proc_result_free(&res);
}

Test(cancel, sigterm_follows_when_sigint_is_ignored)
{
    cancel_on_ready = true;
    dk_proc_result_t res;
    run_sh(TRAPS(":", "exit 143"), 1024, &res);
    cr_assert(res.cancelled);
    cr_assert(got_int_then_term(), "%s", errbuf);
    cr_assert_eq(res.exit_code, 143);
    dk_proc_result_free(&res);
}

Test(cancel, sigkill_ends_a_program_that_ignores_both)
{
    cancel_on_ready = true;
    dk_proc_result_t res;
    run_sh(TRAPS(":", ":"), 1024, &res);
    cr_assert(res.cancelled);
    cr_assert(got_int_then_term(), "%s", errbuf);
    cr_assert_eq(res.term_signal, SIGKILL);
    dk_proc_result_free(&res);
}

Test(cancel, reaches_the_programs_children_and_leaves_nothing_behind)
{
    cancel_on_ready = true;
    char pidfile[] = "/tmp/test_proc_XXXXXX";
    int fd = mkstemp(pidfile);
    cr_assert_geq(fd, 0);
    close(fd);
    char script[512];
    /* A child that ignores SIGINT and SIGTERM and holds the pipes open. */
    snprintf(script, sizeof script,
             "sh -c 'trap \"\" INT TERM; echo $$ > %s; echo ready >&2; "
             "while :; do sleep 0.05; done' & wait", pidfile);
    dk_proc_result_t res;
    run_sh(script, 1024, &res);
    cr_assert(res.cancelled);
    FILE *f = fopen(pidfile, "r");
    int child = 0;
    cr_assert(f && fscanf(f, "%d", &child) == 1);
    fclose(f);
    unlink(pidfile);
    for (int i = 0; i < 50 && alive(child); i++)
        usleep(20000);
    cr_assert_not(alive(child), "the program's child %d is still there", child);
    dk_proc_result_free(&res);
}
