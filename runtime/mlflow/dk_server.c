/*
 * dk_server: one supervised local server. See dk_server.h.
 *
 * The guard (dk_spawn.c) does the stopping, so what is here is the start:
 * program, port, log, spawn, then polling the health URL every 200 ms while
 * watching for an early exit. The log folder's descriptor is handed to the
 * guard so it can remove the log even when the host is already gone.
 */
#include "dk_server.h"

#include "dk_clock.h"
#include "dk_err.h"
#include "dk_logdir.h"
#include "dk_sockowner.h"
#include "dk_spawn.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 32
#define HEALTH_EVERY_MS 200
#define STOP_WAIT_MS 4000       /* the guard's own ladder takes 3 s */

extern char **environ;

struct dk_server_t {
    pid_t guard;
    int port;
    char uri[64];
};

static size_t discard(char *ptr, size_t size, size_t n, void *data)
{
    (void) ptr;
    (void) data;
    return size * n;
}

/* Whether URI + PATH answers 200 within a second. */
static bool answers(const char *uri, const char *path)
{
    CURL *h = curl_easy_init();
    if (!h)
        return false;
    char url[256];
    snprintf(url, sizeof url, "%s%s", uri, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    long code = 0;
    bool ok = curl_easy_perform(h) == CURLE_OK &&
              curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200;
    curl_easy_cleanup(h);
    return ok;
}

/* The log NAME in ROOT/kernel-PID: returns its descriptor and sets *DIRFD to
 * the folder's, or -1 with the reason in WHERE; WHERE otherwise gets its path. */
static int open_log(const char *name, int *dirfd, char *where, size_t wherelen)
{
    char err[1024];
    *dirfd = -1;
    char *base = dk_logdir_default_root(err, sizeof err);
    int root = base ? dk_logdir_open(base, DK_LOGDIR_CREATE,
                                     "set DISTKERNEL_LOG_DIR to a directory that is yours alone",
                                     err, sizeof err) : -1;
    char kname[32];
    snprintf(kname, sizeof kname, "kernel-%d", (int) getpid());
    int log = -1;
    if (root >= 0 && (*dirfd = dk_logdir_mkdir(root, kname, false, err, sizeof err)) >= 0) {
        unlinkat(*dirfd, name, 0);      /* a leftover of a kernel with our pid: ours */
        log = dk_logdir_create(*dirfd, name, err, sizeof err);
    }
    if (log >= 0)
        snprintf(where, wherelen, "%s/%s/%s", base, kname, name);
    else
        snprintf(where, wherelen, "its log, which could not be kept: %s", err);
    if (root >= 0)
        close(root);
    free(base);
    return log;
}

/* Spawn PROGRAM with SPEC's args under a guard, output to LOG (or /dev/null).
 * Returns the guard's pid, or -1 with ERR. */
static int spawn_guarded(const dk_server_spec_t *spec, char *program, const char *port,
                         int log, int dirfd, char *err, size_t errlen)
{
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    argv[argc++] = program;
    for (size_t i = 0; spec->args[i] && argc < MAX_ARGS + 1; i++)
        argv[argc++] = (char *) (strcmp(spec->args[i], "{port}") == 0 ? port : spec->args[i]);
    argv[argc] = NULL;
    int devnull = log < 0 ? open("/dev/null", O_WRONLY | O_CLOEXEC) : -1;
    if (log < 0 && devnull < 0) {
        dk_set_err(err, errlen, "cannot open /dev/null: %s", strerror(errno));
        return -1;
    }
    dk_spawn_opts_t opts = {.what = "server's guard", .out_fd = log >= 0 ? log : devnull,
                            .guard = true, .keep_fd = dirfd,
                            .unlink_at_end = log >= 0 ? spec->log_name : NULL};
    dk_spawned_t child;
    int rc = dk_spawn_with(program, argv, environ, &opts, &child, err, errlen);
    if (devnull >= 0)
        close(devnull);
    if (rc < 0)
        return -1;
    if (child.pidfd >= 0)
        close(child.pidfd);
    return child.pid;
}

/* The error for a port another process took before the server listened
 * (WHY: dk_sockowner_check's account of it). Returns -1. */
static int port_taken(const dk_server_spec_t *spec, const char *why, char *err, size_t errlen)
{
    dk_set_err(err, errlen, "%s was not started: %s; it took the port before the server "
                            "could listen, and no request was sent to it. Another user may "
                            "be watching for the port; set MLFLOW_TRACKING_URI to a server "
                            "you trust", spec->name, why);
    return -1;
}

/* Wait until SELF serves. Returns 0, or -1 with ERR (the server is stopped,
 * or exited by itself). */
static int await_health(dk_server_t *self, const dk_server_spec_t *spec, const char *log_where,
                        char *err, size_t errlen)
{
    long long deadline = dk_now_ms() + (long long) spec->start_timeout_s * 1000;
    char why[512];
    for (;;) {
        if (waitpid(self->guard, NULL, WNOHANG) == self->guard) {
            /* A server that found its port taken exits at once: then whoever
             * took it is the cause to name, not the exit. The pid is gone, so
             * any listener on the port counts as foreign here. */
            pid_t gone = self->guard;
            self->guard = 0;
            if (dk_sockowner_check(gone, self->port, why, sizeof why) == DK_SOCKOWNER_FOREIGN)
                return port_taken(spec, why, err, errlen);
            dk_set_err(err, errlen, "%s exited at start (see %s)", spec->name, log_where);
            return -1;
        }
        /* No request, not even the health check, before the listener is seen
         * to be the server's: until then the port may be anyone's. */
        dk_sockowner_t owner = dk_sockowner_check(self->guard, self->port, why, sizeof why);
        if (owner == DK_SOCKOWNER_FOREIGN)
            return port_taken(spec, why, err, errlen);
        if (owner == DK_SOCKOWNER_OURS && answers(self->uri, spec->health_path))
            return 0;
        if (dk_now_ms() >= deadline) {
            dk_set_err(err, errlen, "%s did not answer within %d s (see %s)", spec->name,
                       spec->start_timeout_s, log_where);
            return -1;
        }
        struct timespec ts = {0, HEALTH_EVERY_MS * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

dk_server_t *dk_server_start(const dk_server_spec_t *spec, bool *missing, char *err,
                             size_t errlen)
{
    *missing = false;
    char ignored[256];
    char *program = dk_spawn_find_program(spec->program, ignored, sizeof ignored);
    if (!program) {
        *missing = true;
        return NULL;
    }
    dk_server_t *self = calloc(1, sizeof *self);
    int port = dk_spawn_free_port(ignored, sizeof ignored);
    if (!self || port < 0) {
        dk_set_err(err, errlen, "could not pick a port for its server");
        free(program);
        free(self);
        return NULL;
    }
    char port_s[16], log_where[2200];
    snprintf(port_s, sizeof port_s, "%d", port);
    self->port = port;
    snprintf(self->uri, sizeof self->uri, "http://127.0.0.1:%d", port);
    int dirfd;
    int log = open_log(spec->log_name, &dirfd, log_where, sizeof log_where);
    char why[1024];
    self->guard = spawn_guarded(spec, program, port_s, log, dirfd, why, sizeof why);
    if (log >= 0)
        close(log);
    if (dirfd >= 0)
        close(dirfd);
    free(program);
    if (self->guard < 0) {
        dk_set_err(err, errlen, "could not start %s: %s", spec->name, why);
        free(self);
        return NULL;
    }
    if (await_health(self, spec, log_where, err, errlen) < 0) {
        dk_server_destroy(&self);
        return NULL;
    }
    return self;
}

int dk_server_check(const dk_server_t *self, char *err, size_t errlen)
{
    char why[512];
    if (dk_sockowner_check(self->guard, self->port, why, sizeof why) == DK_SOCKOWNER_OURS)
        return 0;
    dk_set_err(err, errlen, "the server this kernel started no longer holds its port (%s); "
                            "no request was sent there", why);
    return -1;
}

const char *dk_server_uri(const dk_server_t *self)
{
    return self->uri;
}

void dk_server_destroy(dk_server_t **self_p)
{
    dk_server_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    *self_p = NULL;
    if (self->guard > 0) {
        kill(self->guard, SIGTERM);     /* the guard ends the server's whole group */
        long long deadline = dk_now_ms() + STOP_WAIT_MS;
        bool reaped = false;
        while (!(reaped = waitpid(self->guard, NULL, WNOHANG) == self->guard) &&
               dk_now_ms() < deadline) {
            struct timespec ts = {0, 50 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (!reaped) {
            kill(-self->guard, SIGKILL);
            waitpid(self->guard, NULL, 0);
        }
    }
    free(self);
}
