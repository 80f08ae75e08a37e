/*
 * dk_check: the NCCL preflight check, run out of process. See dk_check.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dk_check.h"
#include "dk_kernel.h"
#include "dk_nccl.h"
#include "dk_spawn.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 32
#define MAX_REPORT (16u << 20)
#define STOP_GRACE_MS 2000

extern char **environ;

static const char *check_exe(void)
{
    const char *exe = getenv("DISTKERNEL_CHECK_EXE");
    return exe && *exe ? exe : DK_CHECK_EXE;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

json_t *dk_check_run(dk_stream_t *stream, const char *args, bool *interrupted, char *err,
                     size_t errlen)
{
    *interrupted = false;
    char *copy = strdup(args ? args : "");
    char *argv[MAX_ARGS + 3];
    int argc = 0;
    argv[argc++] = (char *)check_exe();
    argv[argc++] = "--json";
    for (char *save = NULL, *tok = strtok_r(copy, " \t\n", &save); tok && argc < MAX_ARGS + 2;
         tok = strtok_r(NULL, " \t\n", &save))
        argv[argc++] = tok;
    argv[argc] = NULL;

    dk_spawned_t child;
    if (dk_spawn(argv[0], argv, environ, &child, err, errlen) < 0) {
        free(copy);
        return NULL;
    }
    free(copy);
    char *out = NULL;
    size_t out_len = 0, out_cap = 0;
    bool out_open = true, err_open = true, too_big = false;
    long long stop_at = 0;
    int stop_step = 0;
    while (out_open || err_open) {
        struct pollfd fds[2] = {{out_open ? child.out_fd : -1, POLLIN, 0},
                                {err_open ? child.err_fd : -1, POLLIN, 0}};
        Py_BEGIN_ALLOW_THREADS
        poll(fds, 2, 100);
        Py_END_ALLOW_THREADS
        char buf[16384];
        if (fds[0].revents) {
            ssize_t n = read(child.out_fd, buf, sizeof buf);
            if (n > 0 && out_len + (size_t)n <= MAX_REPORT) {
                if (out_len + (size_t)n + 1 > out_cap) {
                    out_cap = (out_len + (size_t)n + 1) * 2;
                    out = realloc(out, out_cap);
                }
                memcpy(out + out_len, buf, (size_t)n);
                out_len += (size_t)n;
            } else if (n > 0) {
                too_big = true;
            } else if (n == 0 || errno != EAGAIN) {
                out_open = false;
            }
        }
        if (fds[1].revents) {
            ssize_t n = read(child.err_fd, buf, sizeof buf);
            if (n > 0)
                dk_stream_write(stream, DK_STDERR, buf, (size_t)n);
            else if (n == 0 || errno != EAGAIN)
                err_open = false;
        }
        if (PyErr_CheckSignals() < 0) {
            PyErr_Clear();
            if (!*interrupted) {
                *interrupted = true;
                kill(-child.pid, SIGINT);
                stop_at = now_ms();
                stop_step = 1;
            }
        }
        if (stop_step && now_ms() - stop_at > STOP_GRACE_MS) {
            kill(-child.pid, stop_step == 1 ? SIGTERM : SIGKILL);
            stop_at = now_ms();
            stop_step = stop_step == 1 ? 2 : 3;
        }
    }
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    waitpid(child.pid, &status, 0);
    Py_END_ALLOW_THREADS
    close(child.out_fd);
    close(child.err_fd);
    if (child.pidfd >= 0)
        close(child.pidfd);
    json_t *report = NULL;
    if (*interrupted) {
        snprintf(err, errlen, "interrupted");
    } else if (too_big) {
        snprintf(err, errlen, "distkernel-check wrote more than %u bytes", MAX_REPORT);
    } else {
        json_error_t jerr;
        report = out ? json_loadb(out, out_len, 0, &jerr) : NULL;
        if (!report) {
            if (WIFSIGNALED(status))
                snprintf(err, errlen, "distkernel-check was killed by signal %d",
                         WTERMSIG(status));
            else
                snprintf(err, errlen, "distkernel-check (exit code %d) wrote no report",
                         WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
    }
    free(out);
    return report;
}

static void write_text(dk_exec_t *ex, dk_stream_name_t name, const char *text)
{
    dk_stream_write(dk_kernel_stream(ex->kernel), name, text, strlen(text));
}

static int check_magic(void *host, void *data, const char *args, const char *body)
{
    dk_exec_t *ex = host;
    bool interrupted;
    char err[1024];
    json_t *report = dk_check_run(dk_kernel_stream(ex->kernel), args, &interrupted, err,
                                  sizeof err);
    if (!report) {
        dk_exec_error(ex, interrupted ? "KeyboardInterrupt" : "GPUCheckError",
                      interrupted ? "the GPU check was interrupted" : err, NULL);
        return -1;
    }
    const char *verdict = json_string_value(json_object_get(report, "verdict"));
    if (verdict && strcmp(verdict, "unavailable") == 0) {
        char line[1200];
        snprintf(line, sizeof line, "distributed_check: nothing to check: %s\n",
                 json_string_value(json_object_get(report, "reason")));
        write_text(ex, DK_STDOUT, line);
        json_decref(report);
        return 0;
    }
    char *text = dk_nccl_report_text(report);
    if (text) {
        write_text(ex, DK_STDOUT, text);
        if (text[0] && text[strlen(text) - 1] != '\n')
            write_text(ex, DK_STDOUT, "\n");
        free(text);
    }
    int rc = 0;
    if (verdict && strcmp(verdict, "failed") == 0) {
        const char *summary = json_string_value(json_object_get(report, "summary"));
        dk_exec_error(ex, "GPUCheckFailed", summary ? summary : "the NCCL check failed", NULL);
        rc = -1;
    }
    json_decref(report);
    return rc;
}

static const dk_magic_t check_line_magic = {
    .name = "distributed_check",
    .kind = DK_MAGIC_LINE,
    .doc = "%distributed_check [--max-bytes N[K|M|G]] [--iters N] [--no-pairs] [--out-of-place]\n"
           "\n"
           "Check the node's GPUs before a long job: an NCCL all-reduce across every\n"
           "local GPU, over message sizes from 8 bytes to 1 GiB (at most a third of the\n"
           "free memory), reported per size as time, algorithm bandwidth and bus\n"
           "bandwidth computed as nccl-tests does, with each GPU's name, memory and\n"
           "health. A failing or slow GPU or link is named, and a failure is the\n"
           "cell's error. It runs in a separate process, so the kernel keeps no CUDA\n"
           "context. Without GPUs it says so in one line.\n"
           "\n"
           "The same check runs before a distributed job with check=True:\n"
           "    %%distributed num_accelerators=8 check=True\n",
    .run = check_magic,
};

int dk_check_register(dk_kernel_t *kernel)
{
    return dk_magic_register(dk_kernel_magics(kernel), &check_line_magic);
}
