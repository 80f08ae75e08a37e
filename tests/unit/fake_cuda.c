/*
 * fake_cuda: stand-ins for libnvidia-ml.so.1, libcudart.so.13 and libnccl.so.2,
 * so that test_nccl runs the real distkernel-check, loader and runner on a
 * machine with no GPU. Built three times (tests/unit/meson.build) with one of
 * FAKE_NVML, FAKE_CUDART, FAKE_NCCL defined, as libfake_*.so; test_nccl links
 * the real names to them in a folder it puts on distkernel-check's
 * LD_LIBRARY_PATH.
 *
 * "Device memory" is host memory and an all-reduce is a sum on the host, done
 * at ncclGroupEnd when every rank of the communicator has called in, over the
 * first SUMMED elements only (the check verifies a small buffer; the large
 * ones are zeros), so that the time is the model's: each all-reduce sleeps as
 * long as a link of FAKE_BW_MBS (default 50 MB/s) would take: slow enough
 * that the timer's and the scheduler's noise, a few ms, hardly shows. Faults, from the environment:
 *   FAKE_GPUS=N           GPUs the driver and CUDA report (default 2)
 *   FAKE_GPU_NAME=NAME    the name NVML reports (default "NVIDIA H100 80GB HBM3")
 *   FAKE_BROKEN_GPU=k     cudaMalloc fails on GPU k
 *   FAKE_WRONG_GPU=k      GPU k's all-reduce result is off by one
 *   FAKE_SLOW_GPU=k       an all-reduce with GPU k in it is 4 times slower
 *   FAKE_SLOW_PAIR=a,b    the all-reduce of exactly GPUs a and b is 4 times slower
 *   FAKE_FAIL_PAIR=a,b    ncclCommInitAll of exactly GPUs a and b fails
 *   FAKE_HANG=1           ncclGroupEnd never returns
 * ncclCommInitAll also prints to stdout, as NCCL_DEBUG=INFO does.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

#if defined(FAKE_NVML) || defined(FAKE_CUDART)
static int gpus(void)
{
    return env_int("FAKE_GPUS", 2);
}
#endif

#ifdef FAKE_NVML
typedef struct { unsigned long long total, free, used; } nvml_memory_t;

int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = (unsigned int)gpus(); return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **dev)
{
    *dev = (void *)(size_t)(i + 1);
    return 0;
}
int nvmlDeviceGetName(void *dev, char *name, unsigned int len)
{
    (void)dev;
    const char *model = getenv("FAKE_GPU_NAME");
    snprintf(name, len, "%s", model && *model ? model : "NVIDIA H100 80GB HBM3");
    return 0;
}
int nvmlDeviceGetUUID(void *dev, char *uuid, unsigned int len)
{
    snprintf(uuid, len, "GPU-fake-%zu", (size_t)dev - 1);
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *dev, nvml_memory_t *m)
{
    (void)dev;
    m->total = 85520809984ULL;
    m->used = 4ULL << 20;
    m->free = m->total - m->used;
    return 0;
}
const char *nvmlErrorString(int rc) { (void)rc; return "fake NVML error"; }
#endif

#ifdef FAKE_CUDART
static int current;

int cudaGetDeviceCount(int *n) { *n = gpus(); return 0; }
int cudaSetDevice(int d) { if (d < 0 || d >= gpus()) return 101; current = d; return 0; }
int cudaMalloc(void **p, size_t n)
{
    if (current == env_int("FAKE_BROKEN_GPU", -1))
        return 2;   /* cudaErrorMemoryAllocation */
    *p = malloc(n ? n : 1);
    return *p ? 0 : 2;
}
int cudaFree(void *p) { free(p); return 0; }
int cudaMemset(void *p, int v, size_t n) { memset(p, v, n); return 0; }
int cudaMemcpy(void *d, const void *s, size_t n, int kind) { (void)kind; memcpy(d, s, n); return 0; }
int cudaMemGetInfo(size_t *free_b, size_t *total) { *total = 85520809984ULL; *free_b = *total - (4ULL << 20); return 0; }
int cudaStreamCreateWithFlags(void **s, unsigned int f) { (void)f; *s = malloc(1); return 0; }
int cudaStreamDestroy(void *s) { free(s); return 0; }
int cudaStreamSynchronize(void *s) { (void)s; return 0; }
int cudaDeviceSynchronize(void) { return 0; }
int cudaGetLastError(void) { return 0; }
const char *cudaGetErrorString(int rc) { return rc == 2 ? "out of memory" : "fake CUDA error"; }
int cudaRuntimeGetVersion(int *v) { *v = 13000; return 0; }
int cudaDriverGetVersion(int *v) { *v = 13000; return 0; }
#endif

#ifdef FAKE_NCCL
#define MAXR 64
#define SUMMED 65536

typedef struct clique {
    int n, devs[MAXR], pending;
    const float *send[MAXR];
    float *recv[MAXR];
    size_t count;
} clique_t;

typedef struct { clique_t *c; int rank; } comm_t;

static clique_t *open_cliques[MAXR];

static int pair_is(const char *var, const int *devs, int n)
{
    const char *v = getenv(var);
    int a, b;
    if (!v || sscanf(v, "%d,%d", &a, &b) != 2 || n != 2)
        return 0;
    return (devs[0] == a && devs[1] == b) || (devs[0] == b && devs[1] == a);
}

int ncclGetVersion(int *v) { *v = 22809; return 0; }
int ncclCommInitAll(comm_t **comms, int n, const int *devs)
{
    printf("fake NCCL INFO: init %d ranks\n", n);
    fflush(stdout);
    if (pair_is("FAKE_FAIL_PAIR", devs, n))
        return 2;   /* ncclSystemError */
    clique_t *c = calloc(1, sizeof *c);
    c->n = n;
    for (int i = 0; i < n; i++) {
        c->devs[i] = devs[i];
        comms[i] = calloc(1, sizeof(comm_t));
        comms[i]->c = c;
        comms[i]->rank = i;
    }
    for (int i = 0; i < MAXR; i++)
        if (!open_cliques[i]) {
            open_cliques[i] = c;
            break;
        }
    return 0;
}
int ncclCommDestroy(comm_t *comm)
{
    clique_t *c = comm->c;
    free(comm);
    if (--c->n == 0) {
        for (int i = 0; i < MAXR; i++)
            if (open_cliques[i] == c)
                open_cliques[i] = NULL;
        free(c);
    }
    return 0;
}
int ncclCommGetAsyncError(comm_t *comm, int *err) { (void)comm; *err = 0; return 0; }
int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, comm_t *comm,
                  void *stream)
{
    (void)stream;
    if (type != 7 || op != 0)
        return 4;   /* ncclInvalidArgument: only float32 sum is modelled */
    clique_t *c = comm->c;
    c->send[comm->rank] = send;
    c->recv[comm->rank] = recv;
    c->count = count;
    c->pending++;
    return 0;
}
int ncclGroupStart(void) { return 0; }
static void finish(clique_t *c)
{
    int slow = 0;
    for (int r = 0; r < c->n; r++)
        slow |= c->devs[r] == env_int("FAKE_SLOW_GPU", -1);
    slow |= pair_is("FAKE_SLOW_PAIR", c->devs, c->n);
    size_t summed = c->count < SUMMED ? c->count : SUMMED;
    float *sum = calloc(summed ? summed : 1, sizeof *sum);
    for (int r = 0; r < c->n; r++)
        for (size_t k = 0; k < summed; k++)
            sum[k] += c->send[r][k];
    for (int r = 0; r < c->n; r++) {
        memcpy(c->recv[r], sum, summed * sizeof *sum);
        if (c->devs[r] == env_int("FAKE_WRONG_GPU", -1) && c->count)
            c->recv[r][0] += 1;
    }
    free(sum);
    /* The time a ring of links at FAKE_BW_MBS would take. */
    double bytes = (double)c->count * sizeof(float) * (c->n > 1 ? 2.0 * (c->n - 1) / c->n : 1.0);
    double secs = bytes / (env_int("FAKE_BW_MBS", 50) * 1e6) * (slow ? 4 : 1);
    struct timespec ts = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
    nanosleep(&ts, NULL);
    c->pending = 0;
}
int ncclGroupEnd(void)
{
    if (env_int("FAKE_HANG", 0))
        for (;;)
            pause();
    for (int i = 0; i < MAXR; i++)
        if (open_cliques[i] && open_cliques[i]->pending == open_cliques[i]->n)
            finish(open_cliques[i]);
    return 0;
}
const char *ncclGetErrorString(int rc)
{
    return rc == 2 ? "unhandled system error (fake)" : "fake NCCL error";
}
#endif
