/*
 * dk_dist_status: the text of a run's status display.
 *
 *   distributed: 2 × NVIDIA H100 · 12.3 s · finished
 *     rank 0 running (GPU 3.1 GiB) · rank 1 done
 *     (ranks on other nodes: "rank 0 on node1 running · rank 1 on node2 done")
 *     logs: /home/u/.local/state/distkernel/logs/kernel-1/run-0001-…
 *
 * A display of its own, updated in place while the job runs (dk_dist_run
 * publishes it). Pure but for the GPU memory, which the caller supplies.
 */
#ifndef DK_DIST_STATUS_H
#define DK_DIST_STATUS_H

#include "dk_dist_rank.h"

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
} dk_dist_status_t;

/* The status text (malloc'd; NULL when out of memory). */
char *dk_dist_status_text(const dk_dist_status_t *st);

#endif
