/*
 * dk_dist_status: the text of a run's status display.
 *
 * Up to DK_DIST_STATUS_EACH_RANK_MAX ranks, a line per rank:
 *
 *   distributed: 2 × NVIDIA H100 · 12.3 s · finished
 *     rank 0 running (GPU 3.1 GiB) · rank 1 done
 *     (ranks on other nodes: "rank 0 on node1 running · rank 1 on node2 done")
 *     logs: /home/u/.local/state/distkernel/logs/kernel-1/run-0001-…
 *
 * Above, at most DK_DIST_STATUS_MAX_LINES lines whatever the size: the
 * counts by state, the nodes by what their ranks do where that differs from
 * node to node (their names as Slurm writes them), the exceptions by name
 * (failed ranks, lost nodes, the ranks still starting or the slowest to
 * start), and the GPU memory as min / median / max:
 *
 *   distributed: 256 × NVIDIA H100 · 41.0 s
 *     256 ranks on 16 nodes: 250 running · 4 done · 1 starting · 1 failed
 *     node[1-9,11-16]: 16 running on each
 *     node10: 10 running · 4 done · 1 starting · 1 failed
 *     failed: rank 152 on node10
 *     still starting after 41.0 s: rank 153 on node10
 *     GPU memory: min 2.9 GiB · median 3.1 GiB · max 7.8 GiB (rank 12 on node1)
 *     logs: /home/u/.local/state/distkernel/logs/kernel-1/run-0001-…
 *
 * A display of its own, updated in place while the job runs (dk_dist_run
 * publishes it). Pure but for the GPU memory, which the caller supplies.
 */
#ifndef DK_DIST_STATUS_H
#define DK_DIST_STATUS_H

#include "dk_dist_rank.h"

/* Up to this many ranks, each has its word on the ranks' line. */
#define DK_DIST_STATUS_EACH_RANK_MAX 8
/* The status's lines at most, at any size. */
#define DK_DIST_STATUS_MAX_LINES 12

typedef struct {
    const char *what;            /* "2 CPU ranks", "8 × NVIDIA H100" */
    double elapsed_s;
    const char *headline;        /* "finished", "failed", ... or NULL */
    int world;
    const dk_dist_rank_t *ranks; /* WORLD records */
    bool gpu;                    /* GPU ranks: show each running rank's GPU memory */
    const char *log_dir;
    /* Each rank's node, for ranks on several nodes (NULL: all on this one). */
    const char *const *hosts;
    /* The bytes process PID uses on GPU INDEX, 0 if unknown (dk_gpu_process_memory). */
    unsigned long long (*gpu_memory)(int index, int pid);
    /* When the ranks were started, on the clock of the records' running_ms
     * (dk_now_ms): how long each took to start. */
    long long t0_ms;
} dk_dist_status_t;

/* The status text (malloc'd; NULL when out of memory). O(N log N) in the
 * ranks, with one gpu_memory call per running GPU rank. */
char *dk_dist_status_text(const dk_dist_status_t *st);

#endif
