/*
 * dk_nccl: the NCCL preflight check. An all-reduce across every local GPU,
 * from one process, timed over message sizes the way nccl-tests times them,
 * plus each GPU's health, and a verdict that names a failing or slow GPU or link.
 *
 * The CUDA runtime and NCCL are loaded with dlopen when the check runs, so one
 * build serves machines with and without them. Running the check creates a
 * CUDA context on every GPU, which is why the kernel never calls dk_nccl_run
 * itself: it starts `distkernel-check` (runtime/gpu/check_main.c) and reads the
 * JSON report that program prints.
 *
 * The arithmetic, the verdict and the two renderings (JSON, text table) are
 * plain functions of a dk_nccl_result_t, testable with no GPU.
 *
 * Bandwidth, as nccl-tests defines it for all_reduce (its doc/PERFORMANCE.md):
 *   algbw = bytes / time                   (bytes of one rank's buffer)
 *   busbw = algbw * 2 * (n - 1) / n        (n ranks)
 * busbw is what the slowest link carried; it is the figure to compare across
 * node sizes and against the hardware's link speed. With ONE GPU the factor is
 * 0, so busbw is 0 by definition: compare algbw there. GB/s are 10^9 bytes/s.
 */
#ifndef DK_NCCL_H
#define DK_NCCL_H

#include <stddef.h>

#include <jansson.h>

#include "dk_gpu.h"

/* Message sizes: from DK_NCCL_MIN_BYTES, doubling, up to the largest that fits
 * under the maximum (1 GiB unless asked otherwise), and never above a third of
 * the free memory of the GPU with the least free (the buffers, NCCL's own, and
 * room for whatever else runs there). */
#define DK_NCCL_MIN_BYTES 8
#define DK_NCCL_DEFAULT_MAX_BYTES (1ULL << 30)
#define DK_NCCL_FREE_MEMORY_DIVISOR 3
#define DK_NCCL_MAX_SIZES 48

/* nccl-tests' defaults: -w 5 -n 20. */
#define DK_NCCL_DEFAULT_WARMUP 5
#define DK_NCCL_DEFAULT_ITERS 20

/* Finding the slow link: with 3 or more GPUs, every pair of GPUs (up to
 * DK_NCCL_ALL_PAIRS_MAX GPUs; beyond, each GPU with its neighbour) runs the
 * all-reduce alone at DK_NCCL_PAIR_BYTES (or the largest size, if smaller),
 * timed as the median of DK_NCCL_PAIR_ITERS all-reduces each timed alone. A
 * pair whose busbw is below DK_NCCL_SLOW_FRACTION of the best pair's is slow; a
 * GPU all of whose pairs are slow (or fail) while some pair without it is not
 * is named as the slow (or failing) GPU, otherwise the pair is named as a link. */
#define DK_NCCL_PAIR_BYTES (256ULL << 20)
#define DK_NCCL_ALL_PAIRS_MAX 16
#define DK_NCCL_MAX_PAIRS 128
#define DK_NCCL_SLOW_FRACTION 0.75
#define DK_NCCL_PAIR_ITERS 5
/* Bandwidth that falls at the largest size below this fraction of the best of
 * any size (busbw, or algbw on one GPU) is reported as slow: throttling, or
 * memory pressure from another process. Judged only when the largest size is
 * at least DK_NCCL_FALLOFF_MIN_BYTES: below, latency and noise dominate. */
#define DK_NCCL_FALLOFF_FRACTION 0.5
#define DK_NCCL_FALLOFF_MIN_BYTES (64ULL << 20)

/* How the check ran. Start from dk_nccl_opts_default. */
typedef struct {
    size_t max_bytes;            /* largest message; default DK_NCCL_DEFAULT_MAX_BYTES */
    int warmup, iters;           /* per size */
    int pairs;                   /* 1: time pairs of GPUs (when 3 or more); 0: don't */
    int out_of_place;            /* 0: in place, as torch.distributed.all_reduce */
    /* Told what the check is doing before each step that could hang ("all-reduce
     * of 1 GiB across GPUs 0-7"), so a watchdog can say where it stopped. */
    void (*progress)(const char *stage, void *data);
    void *data;
} dk_nccl_opts_t;

typedef struct {
    int index;                   /* CUDA device number in this process */
    char name[96];               /* from NVML; "GPU <index>" when unknown */
    unsigned long long mem_total, mem_used;   /* bytes, from NVML before the check */
    unsigned long long mem_free;              /* bytes, from CUDA at the health check */
    int healthy;                 /* set device, allocate, write, read back, free: all ok */
    char error[200];             /* why not healthy */
    int in_run;                  /* took part in the all-reduce */
    int result;                  /* 1 right, 0 wrong, -1 not checked */
    double got, want;            /* the value read back (first wrong one) and expected */
} dk_nccl_gpu_t;

typedef struct {
    size_t bytes;                /* one rank's buffer */
    double seconds;              /* one all-reduce, mean over iters */
    double algbw, busbw;         /* GB/s */
} dk_nccl_point_t;

typedef struct {
    int a, b;                    /* CUDA device numbers */
    size_t bytes;
    double seconds, busbw;       /* 0 when it failed */
    char error[200];             /* "" when it ran */
} dk_nccl_pair_t;

typedef struct {
    int available;               /* 0: no driver, no GPU, no CUDA runtime or no NCCL */
    char reason[256];            /* when not available: why, in one line */
    int nccl_version;            /* NCCL_VERSION_CODE, e.g. 22809 */
    int cuda_runtime_version, cuda_driver_version;   /* e.g. 13000 */
    int warmup, iters, out_of_place;
    int ngpus;
    dk_nccl_gpu_t gpus[DK_GPU_MAX];
    int nranks;                  /* GPUs in the all-reduce: the healthy ones */
    char run_error[256];         /* the all-reduce across nranks failed: why */
    int npoints;
    dk_nccl_point_t points[DK_NCCL_MAX_SIZES];
    int npairs;
    dk_nccl_pair_t pairs[DK_NCCL_MAX_PAIRS];
    double wall_seconds;         /* the whole check */
} dk_nccl_result_t;

typedef enum {
    DK_NCCL_OK = 0,              /* every GPU healthy, results right, nothing slow */
    DK_NCCL_SLOW,                /* it works, but a GPU or link is slow */
    DK_NCCL_FAILED,              /* a GPU, a link or the all-reduce failed, or a result is wrong */
    DK_NCCL_UNAVAILABLE,         /* nothing to check: no driver, GPU, CUDA runtime or NCCL */
} dk_nccl_verdict_t;

/* Fill OPTS with the defaults above (no progress callback). */
void dk_nccl_opts_default(dk_nccl_opts_t *opts);

/* Run the check on every GPU this process can see and fill OUT. Never fails
 * as a call: with no driver, GPU, CUDA runtime or NCCL, OUT->available is 0 and
 * OUT->reason says which; a GPU or NCCL failure is recorded in OUT for
 * dk_nccl_verdict to judge. Creates CUDA contexts and leaves the libraries
 * loaded: call it from a process of its own (distkernel-check). Set
 * CUDA_DEVICE_ORDER=PCI_BUS_ID before the first call so that CUDA numbers the
 * GPUs as NVML does, and the names from dk_gpu_discover land on the right GPU. */
void dk_nccl_run(const dk_nccl_opts_t *opts, dk_nccl_result_t *out);

/* Load the CUDA runtime and ask how many GPUs it sees. Returns the count, or
 * -1 with WHY filled ("libcudart not found ...", "the CUDA runtime found no
 * usable NVIDIA driver: ..."). Creates no context. DISTKERNEL_CUDART_LIB
 * names the library to load first; then libcudart.so.13, .so.12, .so, on the
 * loader's path and under $CUDA_HOME/lib64 and /usr/local/cuda/lib64. */
int dk_nccl_cuda_device_count(char *why, size_t whylen);

/* Load NCCL (DISTKERNEL_NCCL_LIB first, then libnccl.so.2 as above). Returns
 * its version code (22809 for 2.28.9), or -1 with WHY filled. */
int dk_nccl_library_version(char *why, size_t whylen);

/* ---- arithmetic (no GPU) ---- */

/* Algorithm bandwidth in GB/s (10^9 bytes/s) of BYTES moved in SECONDS; 0 when
 * SECONDS is not positive. */
double dk_nccl_algbw(size_t bytes, double seconds);

/* Bus bandwidth in GB/s of an all-reduce of BYTES over NRANKS ranks that took
 * SECONDS: algbw * 2(n-1)/n, as nccl-tests computes it. 0 for one rank. */
double dk_nccl_busbw(size_t bytes, double seconds, int nranks);

/* The message sizes of a sweep: DK_NCCL_MIN_BYTES doubling while <= MAX_BYTES.
 * Writes at most CAP sizes to OUT and returns how many; 0 when MAX_BYTES is
 * below DK_NCCL_MIN_BYTES. */
int dk_nccl_sizes(size_t max_bytes, size_t *out, int cap);

/* The largest message the sweep may use: REQUESTED, capped by the free
 * memory of the GPU with the least (FREE_BYTES[0..N-1]) divided by
 * DK_NCCL_FREE_MEMORY_DIVISOR. */
size_t dk_nccl_cap_bytes(size_t requested, const unsigned long long *free_bytes, int n);

/* ---- verdict and report (no GPU) ---- */

/* Judge R: the verdict, and in SUMMARY (may be NULL) one line that names the
 * failing or slow GPU or link, or says all is well. Rules in the order they
 * apply: a GPU that fails its health check, a GPU whose all-reduce result is
 * wrong, an all-reduce that failed, pairs that failed, pairs that are slow,
 * bandwidth falling off at the largest size (constants above). */
dk_nccl_verdict_t dk_nccl_verdict(const dk_nccl_result_t *r, char *summary, size_t len);

/* "ok", "slow", "failed", "unavailable". */
const char *dk_nccl_verdict_name(dk_nccl_verdict_t v);

/* The report as JSON, owned by the caller (json_decref); NULL when out of
 * memory. Shape: {"ok", "verdict", "summary", "problems": [{"kind", "severity",
 * "gpus", "message"}], "nccl_version", "cuda_runtime_version", "cuda_driver_version",
 * "op", "in_place", "warmup", "iters", "nranks", "wall_seconds", "gpus":
 * [{"index", "name", "memory_total", "memory_used", "memory_free", "healthy",
 * "error", "in_run", "result"}], "sizes": [{"bytes", "count", "time_us", "algbw_gbs",
 * "busbw_gbs"}], "pairs": [{"gpus", "bytes", "time_us", "busbw_gbs", "error"}],
 * "note"}; when R is not available just {"ok": false, "verdict":
 * "unavailable", "reason"}. "ok" is true only for the verdict "ok". Problem
 * kinds: gpu_failed, wrong_result, allreduce_failed, pairs_failed, link_failed
 * (severity "failed"); slow_gpu, slow_link, falloff ("slow"); distkernel-check's
 * watchdog adds timeout. "gpus" lists the CUDA device numbers a problem names. */
json_t *dk_nccl_report_json(const dk_nccl_result_t *r);

/* {"ok": false, "verdict": "unavailable", "reason": REASON}; NULL when out of memory. */
json_t *dk_nccl_unavailable_json(const char *reason);

/* Render a report made by dk_nccl_report_json (or parsed from
 * distkernel-check's output) as a text table for a person: the GPUs, one row
 * per size in nccl-tests' columns, the pairs, and the verdict. An unavailable
 * report renders as its one line. Returns a string the caller frees; NULL when
 * out of memory or REPORT is not an object. */
char *dk_nccl_report_text(const json_t *report);

#endif
