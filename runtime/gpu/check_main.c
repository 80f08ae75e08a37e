/*
 * distkernel-check: the NCCL preflight check as a program of its own.
 *
 *   distkernel-check [--json] [--max-bytes N[K|M|G]] [--iters N] [--warmup N]
 *                    [--no-pairs] [--out-of-place] [--timeout SECONDS]
 *
 * The kernel must never hold a CUDA context (it would pin memory on every GPU
 * for the life of the notebook), so %distributed_check starts this program and
 * renders the JSON it prints (--json); without --json it prints the text table.
 *
 * stdout carries the report and nothing else: while the check runs, whatever
 * the CUDA runtime or NCCL print (NCCL_DEBUG=INFO writes to stdout) goes to
 * stderr. A watchdog (--timeout, default 300 s) turns a hang, such as a link
 * that never completes a collective, into a report naming the step it hung at.
 *
 * Exit status: 0 when the check ran and found nothing failing, also when it
 * was slow or there was nothing to check (no driver, GPU, CUDA runtime or
 * NCCL: one line says which); 1 when a present GPU, link or all-reduce failed;
 * 2 on a usage error; 3 when the watchdog fired.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dk_io.h"
#include "dk_nccl.h"

#define DEFAULT_TIMEOUT 300

static void usage(FILE *f)
{
    fprintf(f, "usage: distkernel-check [--json] [--max-bytes N[K|M|G]] [--iters N] "
               "[--warmup N] [--no-pairs] [--out-of-place] [--timeout SECONDS]\n"
               "All-reduce across every local GPU with NCCL and report time, algorithm and "
               "bus bandwidth per size,\neach GPU's health, and any failing or slow GPU or "
               "link.\n");
}

/* The watchdog's line, prepared outside the signal handler. Two buffers: the
 * callback fills the one not in use, then flips, so the handler never reads
 * a half-written line. */
static struct {
    char line[2][700];
    volatile sig_atomic_t current;
    int fd;
    int json;
    int timeout;
} watchdog = {.fd = -1};

static void on_progress(const char *stage, void *data)
{
    (void)data;
    char safe[200];
    snprintf(safe, sizeof safe, "%s", stage);
    for (char *c = safe; *c; c++)
        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
            *c = '\'';
    int next = !watchdog.current;
    if (watchdog.json)
        snprintf(watchdog.line[next], sizeof watchdog.line[next],
                 "{\"ok\": false, \"verdict\": \"failed\", \"summary\": \"the NCCL check did not "
                 "finish within %d s; it was at: %s\", \"problems\": [{\"kind\": \"timeout\", "
                 "\"severity\": \"failed\", \"gpus\": [], \"message\": \"stuck at: %s\"}]}\n",
                 watchdog.timeout, safe, safe);
    else
        snprintf(watchdog.line[next], sizeof watchdog.line[next],
                 "NCCL check: failed: it did not finish within %d s; it was at: %s\n",
                 watchdog.timeout, safe);
    watchdog.current = next;
}

static void on_alarm(int sig)
{
    (void)sig;
    const char *line = watchdog.line[watchdog.current];
    size_t len = strlen(line);
    while (len > 0) {
        ssize_t w = write(watchdog.fd, line, len);
        if (w <= 0)
            break;
        line += w;
        len -= (size_t)w;
    }
    _exit(3);
}

/* "1G", "64M", "4096" -> bytes. Returns -1 on anything else. */
static int parse_bytes(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno || s[0] == '-')
        return -1;
    unsigned long long mult = 1;
    if (*end == 'K' || *end == 'k')
        mult = 1ULL << 10;
    else if (*end == 'M' || *end == 'm')
        mult = 1ULL << 20;
    else if (*end == 'G' || *end == 'g')
        mult = 1ULL << 30;
    else if (*end)
        return -1;
    if (mult > 1 && end[1] && strcmp(end + 1, "iB") != 0 && strcmp(end + 1, "B") != 0)
        return -1;
    if (v > (unsigned long long)((size_t)-1) / mult)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* The command line into OPTS, JSON and TIMEOUT. Returns -1 to go on, or the
 * exit status: 0 after --help, 2 after a usage error (both printed). */
static int parse_args(int argc, char **argv, dk_nccl_opts_t *opts, int *json, int *timeout)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            *json = 1;
            continue;
        } else if (strcmp(a, "--no-pairs") == 0) {
            opts->pairs = 0;
            continue;
        } else if (strcmp(a, "--out-of-place") == 0) {
            opts->out_of_place = 1;
            continue;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        }
        const char *val = i + 1 < argc ? argv[++i] : NULL;
        int bad = !val;
        if (bad)
            ;
        else if (strcmp(a, "--max-bytes") == 0)
            bad = parse_bytes(val, &opts->max_bytes) < 0 || opts->max_bytes < DK_NCCL_MIN_BYTES;
        else if (strcmp(a, "--iters") == 0)
            bad = parse_int(val, 1, 100000, &opts->iters) < 0;
        else if (strcmp(a, "--warmup") == 0)
            bad = parse_int(val, 0, 100000, &opts->warmup) < 0;
        else if (strcmp(a, "--timeout") == 0)
            bad = parse_int(val, 1, 86400, timeout) < 0;
        else
            bad = 1;
        if (bad) {
            fprintf(stderr, "distkernel-check: cannot use '%s%s%s'\n", a, val ? " " : "",
                    val ? val : "");
            usage(stderr);
            return 2;
        }
    }
    return -1;
}

int main(int argc, char **argv)
{
    dk_nccl_opts_t opts;
    dk_nccl_opts_default(&opts);
    int json = 0, timeout = DEFAULT_TIMEOUT;
    int done = parse_args(argc, argv, &opts, &json, &timeout);
    if (done >= 0)
        return done;

    /* CUDA numbers GPUs as NVML does, so names and memory land on the right GPU. */
    setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 0);

    /* Keep stdout for the report; everything else printed meanwhile goes to stderr. */
    fflush(stdout);
    int report_fd = dup(STDOUT_FILENO);
    if (report_fd < 0 || dup2(STDERR_FILENO, STDOUT_FILENO) < 0) {
        perror("distkernel-check: dup");
        return 1;
    }
    watchdog.fd = report_fd;
    watchdog.json = json;
    watchdog.timeout = timeout;
    on_progress("starting", NULL);
    opts.progress = on_progress;
    signal(SIGALRM, on_alarm);
    alarm((unsigned)timeout);

    dk_nccl_result_t *r = calloc(1, sizeof *r);
    if (!r) {
        fprintf(stderr, "distkernel-check: out of memory\n");
        return 1;
    }
    dk_nccl_run(&opts, r);
    alarm(0);
    fflush(stdout);

    dk_nccl_verdict_t v = dk_nccl_verdict(r, NULL, 0);
    json_t *report = dk_nccl_report_json(r);
    free(r);
    char *out = NULL;
    if (report)
        out = json ? json_dumps(report, JSON_REAL_PRECISION(10))
                   : dk_nccl_report_text(report);
    json_decref(report);
    if (!out) {
        fprintf(stderr, "distkernel-check: out of memory\n");
        return 1;
    }
    int rc = dk_write_all(report_fd, out, strlen(out));
    if (rc == 0 && json)
        rc = dk_write_all(report_fd, "\n", 1);
    free(out);
    close(report_fd);
    if (rc < 0)
        return 1;
    return v == DK_NCCL_FAILED ? 1 : 0;
}
