/*
 * A supervised local server (runtime/mlflow/dk_server.h) with a stand-in for
 * `mlflow server`: an sh script on PATH that, like MLflow, runs the actual
 * server (tests/mlflow_server.py) as a child of its own. Started, it answers;
 * stopped, or its host SIGKILLed, the script and its child are gone and the
 * log it wrote is removed; a missing program and one that exits at start are
 * said as such.
 */
#include <criterion/criterion.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dk_server.h"
#include "proc_alive.h"

static char tmp[] = "/tmp/test_server_XXXXXX";
static char pids_path[256];

static void write_script(const char *name, const char *body)
{
    char path[512];
    snprintf(path, sizeof path, "%s/bin/%s", tmp, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(body, f);
    fclose(f);
    chmod(path, 0755);
}

static void setup(void)
{
    cr_assert_not_null(mkdtemp(tmp));
    char path[512];
    snprintf(path, sizeof path, "%s/bin", tmp);
    mkdir(path, 0700);
    snprintf(pids_path, sizeof pids_path, "%s/pids", tmp);
    char script[2048];
    snprintf(script, sizeof script,
             "#!/bin/sh\n"
             "%s %s --port \"$2\" &\n"
             "echo \"$$ $!\" > %s\n"
             "wait\n", PYTHON3, MLFLOW_SERVER, pids_path);
    write_script("fakesrv", script);
    write_script("diesrv", "#!/bin/sh\necho 'no such command' >&2\nexit 1\n");
    snprintf(path, sizeof path, "%s/bin:/usr/bin:/bin", tmp);
    setenv("PATH", path, 1);
    snprintf(path, sizeof path, "%s/logs", tmp);
    setenv("DISTKERNEL_LOG_DIR", path, 1);
}

static void teardown(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(server, .init = setup, .fini = teardown, .timeout = 60);

static const char *const args[] = {"--port", "{port}", NULL};

static dk_server_spec_t spec_of(const char *program)
{
    return (dk_server_spec_t){.program = program, .args = args, .name = "`fake server`",
                              .log_name = "fake-server.log", .health_path = "/health",
                              .start_timeout_s = 30};
}

static void read_pids(int *script, int *server)
{
    FILE *f = fopen(pids_path, "r");
    cr_assert_not_null(f, "the stand-in did not start");
    cr_assert_eq(fscanf(f, "%d %d", script, server), 2);
    fclose(f);
}

static bool log_exists(int host)
{
    char path[512];
    snprintf(path, sizeof path, "%s/logs/kernel-%d/fake-server.log", tmp, host);
    return access(path, F_OK) == 0;
}

Test(server, serves_and_stopping_it_ends_its_children_and_removes_its_log)
{
    bool missing;
    char err[1024] = "";
    dk_server_spec_t spec = spec_of("fakesrv");
    dk_server_t *s = dk_server_start(&spec, &missing, err, sizeof err);
    cr_assert_not_null(s, "%s", err);
    cr_assert_eq(strncmp(dk_server_uri(s), "http://127.0.0.1:", 17), 0, "%s", dk_server_uri(s));
    int script, server;
    read_pids(&script, &server);
    cr_assert(alive(script) && alive(server));
    cr_assert(log_exists(getpid()), "the log is not where it should be");
    dk_server_destroy(&s);
    cr_assert_null(s);
    cr_assert(gone_within(script, 2000), "the program outlived its stop");
    cr_assert(gone_within(server, 2000), "the program's own child outlived its stop");
    cr_assert_not(log_exists(getpid()), "the log was left behind");
    dk_server_destroy(&s);      /* again: nothing */
}

Test(server, dies_with_a_host_that_is_sigkilled)
{
    pid_t host = fork();
    cr_assert_geq(host, 0);
    if (host == 0) {
        bool missing;
        char err[1024];
        dk_server_spec_t spec = spec_of("fakesrv");
        _exit(dk_server_start(&spec, &missing, err, sizeof err) ? (pause(), 0) : 1);
    }
    for (int i = 0; i < 1500 && access(pids_path, F_OK) != 0; i++)
        usleep(20000);
    usleep(300000);         /* the pids are written */
    int script, server;
    read_pids(&script, &server);
    cr_assert(alive(script) && alive(server));
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    cr_assert(gone_within(script, 8000), "the program outlived its SIGKILLed host");
    cr_assert(gone_within(server, 8000), "the program's child outlived its SIGKILLed host");
    for (int i = 0; i < 250 && log_exists(host); i++)
        usleep(20000);      /* the guard removes it just before its last SIGKILL */
    cr_assert_not(log_exists(host), "the log was left behind");
}

Test(server, a_program_not_on_path_is_missing)
{
    bool missing = false;
    char err[1024] = "";
    dk_server_spec_t spec = spec_of("no-such-server-program");
    cr_assert_null(dk_server_start(&spec, &missing, err, sizeof err));
    cr_assert(missing);
    cr_assert_str_eq(err, "");
}

Test(server, a_program_that_exits_at_start_is_said_with_its_log)
{
    bool missing = true;
    char err[1024] = "";
    dk_server_spec_t spec = spec_of("diesrv");
    cr_assert_null(dk_server_start(&spec, &missing, err, sizeof err));
    cr_assert_not(missing);
    cr_assert(strstr(err, "`fake server` exited at start") && strstr(err, "fake-server.log"),
              "%s", err);
}
