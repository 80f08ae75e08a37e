/*
 * dk_check: the NCCL preflight check, run out of process. See dk_check.h.
 */
#include "dk_pyabi.h"

#include "dk_check.h"
#include "dk_kernel.h"
#include "dk_nccl.h"
#include "dk_err.h"
#include "dk_proc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ARGS 32
#define MAX_REPORT (16u << 20)
#define STOP_GRACE_S 2.0

extern char **environ;

static const char *check_exe(void)
{
    const char *exe = getenv("DISTKERNEL_CHECK_EXE");
    return exe && *exe ? exe : DK_CHECK_EXE;
}

/* ARGV for the check: the program, --json, then ARGS split at blanks into
 * COPY (at most MAX_ARGS words; the rest are dropped, as before). */
static void build_argv(char *copy, char *argv[MAX_ARGS + 3])
{
    int argc = 0;
    argv[argc++] = (char *)check_exe();
    argv[argc++] = "--json";
    for (char *save = NULL, *tok = strtok_r(copy, " \t\n", &save); tok && argc < MAX_ARGS + 2;
         tok = strtok_r(NULL, " \t\n", &save))
        argv[argc++] = tok;
    argv[argc] = NULL;
}

/* The program's stderr (NCCL's own logs) goes to the cell's stderr. Called
 * without the GIL: dk_stream_write is thread-safe. */
static void relay_stderr(void *data, const char *bytes, size_t len)
{
    dk_stream_write(data, DK_STDERR, bytes, len);
}

/* Whether the user interrupted (SIGINT, seen by Python's handler). dk_proc_run
 * runs with the GIL released, so take it for the check. */
static bool user_interrupted(void *data)
{
    (void)data;
    PyGILState_STATE gil = PyGILState_Ensure();
    bool hit = PyErr_CheckSignals() < 0;
    if (hit)
        PyErr_Clear();
    PyGILState_Release(gil);
    return hit;
}

/* The report in RES, or NULL with ERR saying why there is none. */
static json_t *report_of(const dk_proc_result_t *res, char *err, size_t errlen)
{
    if (res->cancelled) {
        dk_set_err(err, errlen, "interrupted");
        return NULL;
    }
    if (res->out_overflow) {
        dk_set_err(err, errlen, "distkernel-check wrote more than %u bytes", MAX_REPORT);
        return NULL;
    }
    json_error_t jerr;
    json_t *report = res->out_len ? json_loadb(res->out, res->out_len, 0, &jerr) : NULL;
    if (report)
        return report;
    if (res->term_signal)
        dk_set_err(err, errlen, "distkernel-check was killed by signal %d", res->term_signal);
    else
        dk_set_err(err, errlen, "distkernel-check (exit code %d) wrote no report", res->exit_code);
    return NULL;
}

json_t *dk_check_run(dk_stream_t *stream, const char *args, bool *interrupted, char *err,
                     size_t errlen)
{
    *interrupted = false;
    char *copy = strdup(args ? args : "");
    if (!copy) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    char *argv[MAX_ARGS + 3];
    build_argv(copy, argv);
    dk_proc_spec_t spec = {
        .path = argv[0], .argv = argv, .envp = environ, .max_out = MAX_REPORT,
        .grace_s = STOP_GRACE_S, .on_stderr = relay_stderr, .cancelled = user_interrupted,
        .data = stream,
    };
    dk_proc_result_t res;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dk_proc_run(&spec, &res, err, errlen);
    Py_END_ALLOW_THREADS
    free(copy);
    if (rc < 0)
        return NULL;
    *interrupted = res.cancelled;
    json_t *report = report_of(&res, err, errlen);
    dk_proc_result_free(&res);
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
