/*
 * dk_nccl: the NCCL check on the GPUs. See dk_nccl.h.
 *
 * One process drives every local GPU: ncclCommInitAll makes one communicator
 * per device, and each all-reduce is issued for all of them inside one
 * ncclGroupStart/ncclGroupEnd. Timing follows nccl-tests: warm-up iterations,
 * then the wall clock around ITERS all-reduces, stopped once every stream has
 * synchronised; the time of one all-reduce is the mean. The buffers are zero
 * while timed (sums of zeros stay zero however often they run in place); the
 * result is checked once, before, on a small buffer holding rank + 1 on each
 * GPU, where every element must come back as n(n+1)/2.
 *
 * The CUDA runtime and NCCL are loaded with dlopen (dk_nccl_load.c); the
 * tables of their functions are looked up once per run.
 */
#include "dk_nccl.h"
#include "dk_err.h"
#include "dk_clock.h"
#include "dk_nccl_cuda.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Elements of the buffer the result is checked on. */
#define VERIFY_COUNT 1024
/* The health check's allocation. */
#define HEALTH_BYTES (1u << 20)

/* The loaded libraries (dk_nccl_load.c), looked up by dk_nccl_run. */
static const dk_cuda_api_t *cuda;
static const dk_nccl_api_t *nccl;

void dk_nccl_opts_default(dk_nccl_opts_t *opts)
{
    memset(opts, 0, sizeof *opts);
    opts->max_bytes = DK_NCCL_DEFAULT_MAX_BYTES;
    opts->warmup = DK_NCCL_DEFAULT_WARMUP;
    opts->iters = DK_NCCL_DEFAULT_ITERS;
    opts->pairs = 1;
}

static void progress(const dk_nccl_opts_t *opts, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void progress(const dk_nccl_opts_t *opts, const char *fmt, ...)
{
    if (!opts->progress)
        return;
    char stage[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(stage, sizeof stage, fmt, ap);
    va_end(ap);
    opts->progress(stage, opts->data);
}

/* ---- one GPU: health ---- */

static int cuda_failed(dk_cuda_err_t rc, const char *what, char *err, size_t len)
{
    if (rc == DK_CUDA_SUCCESS)
        return 0;
    dk_set_err(err, len, "%s: %s (CUDA error %d)", what, cuda->error_string(rc), rc);
    cuda->get_last_error();   /* clear it, if it is not sticky */
    return 1;
}

/* Select the device, allocate, write a pattern, read it back, free. */
static void health_check(dk_nccl_gpu_t *g)
{
    char *err = g->error;
    size_t len = sizeof g->error;
    void *dev = NULL;
    unsigned char *host = malloc(HEALTH_BYTES);
    g->healthy = 0;
    if (!host) {
        dk_set_err(err, len, "out of host memory");
        return;
    }
    size_t free_b = 0, total_b = 0;
    if (cuda_failed(cuda->set_device(g->index), "cannot select it", err, len) ||
        cuda_failed(cuda->mem_get_info(&free_b, &total_b), "cannot read its memory", err, len) ||
        cuda_failed(cuda->malloc(&dev, HEALTH_BYTES), "cannot allocate 1 MiB", err, len) ||
        cuda_failed(cuda->memset(dev, 0xA5, HEALTH_BYTES), "cannot write its memory", err, len) ||
        cuda_failed(cuda->memcpy(host, dev, HEALTH_BYTES, DK_CUDA_MEMCPY_DEVICE_TO_HOST),
                    "cannot read its memory back", err, len)) {
        if (dev)
            cuda->free(dev);
        free(host);
        return;
    }
    g->mem_free = free_b;
    if (!g->mem_total)
        g->mem_total = total_b;
    int pattern_ok = 1;
    for (size_t i = 0; i < HEALTH_BYTES && pattern_ok; i++)
        pattern_ok = host[i] == 0xA5;
    free(host);
    if (cuda_failed(cuda->free(dev), "cannot free its memory", err, len))
        return;
    if (!pattern_ok) {
        dk_set_err(err, len, "memory read back differs from what was written");
        return;
    }
    g->healthy = 1;
}

/* ---- the all-reduce across a set of GPUs ---- */

typedef struct {
    int n;
    const int *devs;
    dk_nccl_comm_t comms[DK_GPU_MAX];
    dk_cuda_stream_t streams[DK_GPU_MAX];
    void *send[DK_GPU_MAX], *recv[DK_GPU_MAX];
    int out_of_place;
} ring_t;

static int nccl_failed(dk_nccl_res_t rc, const char *what, char *err, size_t len)
{
    if (rc == DK_NCCL_SUCCESS)
        return 0;
    dk_set_err(err, len, "%s: %s (NCCL error %d)", what, nccl->error_string(rc), rc);
    return 1;
}

static void ring_close(ring_t *ring)
{
    for (int i = 0; i < ring->n; i++) {
        cuda->set_device(ring->devs[i]);
        if (ring->streams[i])
            cuda->stream_sync(ring->streams[i]);
        if (ring->comms[i])
            nccl->comm_destroy(ring->comms[i]);
        if (ring->recv[i] && ring->recv[i] != ring->send[i])
            cuda->free(ring->recv[i]);
        if (ring->send[i])
            cuda->free(ring->send[i]);
        if (ring->streams[i])
            cuda->stream_destroy(ring->streams[i]);
    }
    cuda->get_last_error();
}

/* Communicators, one stream and BYTES of buffer (two, out of place) per GPU. */
static int ring_open(ring_t *ring, const int *devs, int n, size_t bytes, int out_of_place,
                     char *err, size_t len)
{
    memset(ring, 0, sizeof *ring);
    ring->n = n;
    ring->devs = devs;
    ring->out_of_place = out_of_place;
    if (nccl_failed(nccl->comm_init_all(ring->comms, n, devs), "NCCL could not start", err, len)) {
        memset(ring->comms, 0, sizeof ring->comms);
        return -1;
    }
    for (int i = 0; i < n; i++) {
        char what[80];
        snprintf(what, sizeof what, "GPU %d", devs[i]);
        if (cuda_failed(cuda->set_device(devs[i]), what, err, len) ||
            cuda_failed(cuda->stream_create(&ring->streams[i], DK_CUDA_STREAM_NON_BLOCKING), what,
                        err, len) ||
            cuda_failed(cuda->malloc(&ring->send[i], bytes), what, err, len))
            return -1;
        if (!out_of_place)
            ring->recv[i] = ring->send[i];
        else if (cuda_failed(cuda->malloc(&ring->recv[i], bytes), what, err, len))
            return -1;
    }
    return 0;
}

/* Issue one all-reduce of COUNT floats on every GPU, as one group. */
static int ring_all_reduce(ring_t *ring, size_t count, char *err, size_t len)
{
    dk_nccl_res_t rc = nccl->group_start();
    for (int i = 0; rc == DK_NCCL_SUCCESS && i < ring->n; i++)
        rc = nccl->all_reduce(ring->send[i], ring->recv[i], count, DK_NCCL_FLOAT32, DK_NCCL_SUM,
                             ring->comms[i], ring->streams[i]);
    dk_nccl_res_t end = nccl->group_end();
    if (rc == DK_NCCL_SUCCESS)
        rc = end;
    return nccl_failed(rc, "all-reduce", err, len) ? -1 : 0;
}

static int ring_sync(ring_t *ring, char *err, size_t len)
{
    for (int i = 0; i < ring->n; i++) {
        char what[80];
        snprintf(what, sizeof what, "GPU %d", ring->devs[i]);
        if (cuda_failed(cuda->set_device(ring->devs[i]), what, err, len) ||
            cuda_failed(cuda->stream_sync(ring->streams[i]), what, err, len))
            return -1;
        dk_nccl_res_t async = DK_NCCL_SUCCESS;
        if (nccl->async_error && nccl->async_error(ring->comms[i], &async) == DK_NCCL_SUCCESS &&
            nccl_failed(async, what, err, len))
            return -1;
    }
    return 0;
}

/* The mean seconds of one all-reduce of BYTES, after WARMUP untimed ones. */
static int ring_time(ring_t *ring, size_t bytes, int warmup, int iters, double *seconds,
                     char *err, size_t len)
{
    size_t count = bytes / sizeof(float);
    for (int i = 0; i < warmup; i++)
        if (ring_all_reduce(ring, count, err, len) < 0)
            return -1;
    if (ring_sync(ring, err, len) < 0)
        return -1;
    double t0 = dk_now_s();
    for (int i = 0; i < iters; i++)
        if (ring_all_reduce(ring, count, err, len) < 0)
            return -1;
    if (ring_sync(ring, err, len) < 0)
        return -1;
    *seconds = (dk_now_s() - t0) / (iters > 0 ? iters : 1);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median seconds of ITERS all-reduces of BYTES, each timed alone: for
 * the pairs, which are compared with each other, so that one hiccup of the
 * machine does not make a link look slow. */
static int ring_time_median(ring_t *ring, size_t bytes, int iters, double *seconds, char *err,
                            size_t len)
{
    double t[64];
    if (iters > 64)
        iters = 64;
    if (iters < 1)
        iters = 1;
    size_t count = bytes / sizeof(float);
    if (ring_all_reduce(ring, count, err, len) < 0 || ring_sync(ring, err, len) < 0)
        return -1;   /* warm-up */
    for (int i = 0; i < iters; i++) {
        double t0 = dk_now_s();
        if (ring_all_reduce(ring, count, err, len) < 0 || ring_sync(ring, err, len) < 0)
            return -1;
        t[i] = dk_now_s() - t0;
    }
    qsort(t, (size_t)iters, sizeof t[0], cmp_double);
    *seconds = iters % 2 ? t[iters / 2] : (t[iters / 2 - 1] + t[iters / 2]) / 2;
    return 0;
}

/* Rank r's buffer holds r + 1; after the all-reduce every element must be
 * n(n+1)/2 on every GPU. Marks each GPU's result. Small integers are exact
 * in float32, so the comparison is exact. */
static int verify_with(ring_t *ring, dk_nccl_result_t *out, const int *slots, float *host,
                       char *err, size_t len);

static int ring_verify(ring_t *ring, dk_nccl_result_t *out, const int *slots, char *err,
                       size_t len)
{
    float *host = malloc(VERIFY_COUNT * sizeof *host);
    if (!host) {
        dk_set_err(err, len, "out of host memory");
        return -1;
    }
    int rc = verify_with(ring, out, slots, host, err, len);
    free(host);
    return rc;
}

static int verify_with(ring_t *ring, dk_nccl_result_t *out, const int *slots, float *host,
                       char *err, size_t len)
{
    size_t bytes = VERIFY_COUNT * sizeof *host;
    for (int i = 0; i < ring->n; i++) {
        for (size_t k = 0; k < VERIFY_COUNT; k++)
            host[k] = (float)(i + 1);
        if (cuda_failed(cuda->set_device(ring->devs[i]), "verify", err, len) ||
            cuda_failed(cuda->memcpy(ring->send[i], host, bytes, DK_CUDA_MEMCPY_HOST_TO_DEVICE),
                        "verify", err, len))
            return -1;
    }
    if (ring_all_reduce(ring, VERIFY_COUNT, err, len) < 0 || ring_sync(ring, err, len) < 0)
        return -1;
    float want = (float)ring->n * (float)(ring->n + 1) / 2;
    for (int i = 0; i < ring->n; i++) {
        dk_nccl_gpu_t *g = &out->gpus[slots[i]];
        if (cuda_failed(cuda->set_device(ring->devs[i]), "verify", err, len) ||
            cuda_failed(cuda->memcpy(host, ring->recv[i], bytes, DK_CUDA_MEMCPY_DEVICE_TO_HOST),
                        "verify", err, len))
            return -1;
        g->result = 1;
        g->want = want;
        g->got = want;
        for (size_t k = 0; k < VERIFY_COUNT; k++)
            if (host[k] != want) {
                g->result = 0;
                g->got = host[k];
                break;
            }
    }
    return 0;
}

static int ring_zero(ring_t *ring, size_t bytes, char *err, size_t len)
{
    for (int i = 0; i < ring->n; i++)
        if (cuda_failed(cuda->set_device(ring->devs[i]), "zero", err, len) ||
            cuda_failed(cuda->memset(ring->send[i], 0, bytes), "zero", err, len) ||
            cuda_failed(cuda->device_sync(), "zero", err, len))
            return -1;
    return 0;
}

/* Put a formatted prefix in front of the message in ERR. */
static void prefix_error(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void prefix_error(char *err, size_t len, const char *fmt, ...)
{
    char prefix[100];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    size_t plen = n < 0 ? 0 : (size_t)n < sizeof prefix ? (size_t)n : sizeof prefix - 1;
    if (plen + 1 >= len)
        return;
    size_t keep = strnlen(err, len - 1);
    if (keep > len - 1 - plen)
        keep = len - 1 - plen;
    memmove(err + plen, err, keep);
    memcpy(err, prefix, plen);
    err[plen + keep] = '\0';
}

/* "0-7" or "0, 2, 5". */
static void fmt_devs(const int *devs, int n, char *out, size_t len)
{
    int contiguous = 1;
    for (int i = 1; i < n; i++)
        contiguous &= devs[i] == devs[i - 1] + 1;
    if (n > 1 && contiguous) {
        snprintf(out, len, "%d-%d", devs[0], devs[n - 1]);
        return;
    }
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%d", i ? ", " : "", devs[i]);
}

/* The sweep across every healthy GPU. */
static void sweep(const dk_nccl_opts_t *opts, dk_nccl_result_t *out, const int *devs,
                  const int *slots, int n, size_t max_bytes)
{
    size_t sizes[DK_NCCL_MAX_SIZES];
    int nsizes = dk_nccl_sizes(max_bytes, sizes, DK_NCCL_MAX_SIZES);
    size_t buf = nsizes ? sizes[nsizes - 1] : 0;
    if (buf < VERIFY_COUNT * sizeof(float))
        buf = VERIFY_COUNT * sizeof(float);
    char on[200], *err = out->run_error;
    size_t len = sizeof out->run_error;
    fmt_devs(devs, n, on, sizeof on);
    progress(opts, "starting NCCL across GPU%s %s", n == 1 ? "" : "s", on);
    ring_t ring;
    if (ring_open(&ring, devs, n, buf, opts->out_of_place, err, len) < 0) {
        ring_close(&ring);
        return;
    }
    progress(opts, "checking the all-reduce result across GPU%s %s", n == 1 ? "" : "s", on);
    if (ring_verify(&ring, out, slots, err, len) < 0 || ring_zero(&ring, buf, err, len) < 0) {
        ring_close(&ring);
        return;
    }
    for (int s = 0; s < nsizes; s++) {
        progress(opts, "all-reduce of %zu bytes across GPU%s %s", sizes[s], n == 1 ? "" : "s",
                 on);
        double secs = 0;
        if (ring_time(&ring, sizes[s], opts->warmup, opts->iters, &secs, err, len) < 0) {
            prefix_error(err, len, "at %zu bytes: ", sizes[s]);
            break;
        }
        dk_nccl_point_t *p = &out->points[out->npoints++];
        p->bytes = sizes[s];
        p->seconds = secs;
        p->algbw = dk_nccl_algbw(sizes[s], secs);
        p->busbw = dk_nccl_busbw(sizes[s], secs, n);
    }
    ring_close(&ring);
}

/* Each pair of healthy GPUs alone (neighbours only, past DK_NCCL_ALL_PAIRS_MAX). */
static void time_pairs(const dk_nccl_opts_t *opts, dk_nccl_result_t *out, const int *devs,
                       int n, size_t max_bytes)
{
    size_t bytes = max_bytes < DK_NCCL_PAIR_BYTES ? max_bytes : DK_NCCL_PAIR_BYTES;
    bytes = bytes / sizeof(float) * sizeof(float);
    if (bytes < DK_NCCL_MIN_BYTES)
        return;
    for (int i = 0; i < n; i++) {
        for (int j = i + 1; j < n && out->npairs < DK_NCCL_MAX_PAIRS; j++) {
            int neighbours = j == i + 1 || (i == 0 && j == n - 1);
            if (n > DK_NCCL_ALL_PAIRS_MAX && !neighbours)
                continue;
            dk_nccl_pair_t *p = &out->pairs[out->npairs++];
            int two[2] = {devs[i], devs[j]};
            p->a = two[0];
            p->b = two[1];
            p->bytes = bytes;
            progress(opts, "all-reduce of %zu bytes between GPU %d and GPU %d", bytes, p->a, p->b);
            ring_t ring;
            if (ring_open(&ring, two, 2, bytes, opts->out_of_place, p->error, sizeof p->error) ==
                    0 &&
                ring_zero(&ring, bytes, p->error, sizeof p->error) == 0 &&
                ring_time_median(&ring, bytes, DK_NCCL_PAIR_ITERS, &p->seconds, p->error,
                                 sizeof p->error) == 0)
                p->busbw = dk_nccl_busbw(bytes, p->seconds, 2);
            else
                p->seconds = 0;
            ring_close(&ring);
        }
    }
}

/* The driver lists GPUs that CUDA cannot use: each of them has failed, with
 * CUDA's reason. */
static void report_unusable(const dk_gpu_list_t *found, dk_nccl_result_t *out)
{
    out->available = 1;
    out->ngpus = found->count;
    for (int i = 0; i < found->count; i++) {
        dk_nccl_gpu_t *g = &out->gpus[i];
        g->index = i;
        g->result = -1;
        snprintf(g->name, sizeof g->name, "%s", found->gpus[i].name);
        g->mem_total = found->gpus[i].mem_total;
        g->mem_used = found->gpus[i].mem_used;
        snprintf(g->error, sizeof g->error, "%.199s", cuda->why);
    }
    out->reason[0] = '\0';
}

/* Health-check OUT's first N GPUs (named from FOUND when CUDA and NVML see
 * the same ones). The healthy ones' device numbers go to DEVS, their slots in
 * OUT->gpus to SLOTS and their free memory to FREE_B; returns how many. */
static int check_each_gpu(const dk_nccl_opts_t *opts, const dk_gpu_list_t *found, int n,
                          dk_nccl_result_t *out, int *devs, int *slots,
                          unsigned long long *free_b)
{
    int healthy = 0;
    for (int i = 0; i < n; i++) {
        dk_nccl_gpu_t *g = &out->gpus[i];
        g->index = i;
        g->result = -1;
        /* CUDA and NVML agree on the order under CUDA_DEVICE_ORDER=PCI_BUS_ID. */
        if (found->count == n) {
            snprintf(g->name, sizeof g->name, "%s", found->gpus[i].name);
            g->mem_total = found->gpus[i].mem_total;
            g->mem_used = found->gpus[i].mem_used;
        } else {
            snprintf(g->name, sizeof g->name, "GPU %d", i);
        }
        progress(opts, "health check of GPU %d", i);
        health_check(g);
        if (g->healthy) {
            slots[healthy] = i;
            free_b[healthy] = g->mem_free;
            devs[healthy++] = i;
        }
    }
    return healthy;
}

/* The GPUs NVML finds, or NULL with OUT->reason. */
static dk_gpu_list_t *discover(dk_nccl_result_t *out)
{
    dk_gpu_list_t *found = calloc(1, sizeof *found);
    if (!found) {
        snprintf(out->reason, sizeof out->reason, "out of memory");
        return NULL;
    }
    dk_gpu_discover(found);
    if (found->count == 0) {
        snprintf(out->reason, sizeof out->reason, "%s", found->why_none);
        free(found);
        return NULL;
    }
    return found;
}

void dk_nccl_run(const dk_nccl_opts_t *opts_in, dk_nccl_result_t *out)
{
    dk_nccl_opts_t defaults;
    if (!opts_in) {
        dk_nccl_opts_default(&defaults);
        opts_in = &defaults;
    }
    const dk_nccl_opts_t *opts = opts_in;
    double t0 = dk_now_s();
    memset(out, 0, sizeof *out);
    out->warmup = opts->warmup;
    out->iters = opts->iters;
    out->out_of_place = opts->out_of_place;

    progress(opts, "looking for GPUs");
    dk_gpu_list_t *found = discover(out);
    if (!found)
        return;
    int n = dk_nccl_cuda_device_count(out->reason, sizeof out->reason);
    cuda = dk_cuda_api();
    if (n < 0 && cuda->broken) {
        report_unusable(found, out);
        free(found);
        out->wall_seconds = dk_now_s() - t0;
        return;
    }
    if (n < 0 || dk_nccl_library_version(out->reason, sizeof out->reason) < 0) {
        free(found);
        return;
    }
    nccl = dk_nccl_api();
    out->available = 1;
    out->nccl_version = nccl->version;
    cuda->runtime_version(&out->cuda_runtime_version);
    cuda->driver_version(&out->cuda_driver_version);

    if (n > DK_GPU_MAX)
        n = DK_GPU_MAX;
    out->ngpus = n;
    int devs[DK_GPU_MAX], slots[DK_GPU_MAX];
    unsigned long long free_b[DK_GPU_MAX];
    int healthy = check_each_gpu(opts, found, n, out, devs, slots, free_b);
    free(found);
    out->nranks = healthy;
    for (int i = 0; i < healthy; i++)
        out->gpus[slots[i]].in_run = 1;
    if (healthy > 0) {
        size_t max_bytes = dk_nccl_cap_bytes(opts->max_bytes, free_b, healthy);
        sweep(opts, out, devs, slots, healthy, max_bytes);
        if (opts->pairs && healthy >= 3)
            time_pairs(opts, out, devs, healthy, max_bytes);
    }
    out->wall_seconds = dk_now_s() - t0;
    progress(opts, "done");
}
