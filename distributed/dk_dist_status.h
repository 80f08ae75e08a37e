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
 * When output= shows some ranks only (a list, or local0), a line says
 * which, above the logs: "output shown: ranks 0, 8, 16–31 (all in the logs)".
 *
 * While the ranks have been silent past stall_after, the lines left above
 * the logs say where they are (dk_dist_stall.h), the smallest group first:
 *
 *     silent 75 s; where the ranks are:
 *       rank 1:            time.sleep                    (cell line 6)
 *       ranks 0, 2, 3 (3): torch.distributed.all_reduce  (cell line 8)
 *
 * A display of its own, updated in place while the job runs (dk_dist_run
 * publishes it). Pure but for the GPU memory, which the caller supplies.
 *
 * Started ranks (`%distributed status`, dk_dist_pool) are told by the same
 * rules and the same code, under a header of their own and without a logs
 * line (each cell has its folder). Up to 8 ranks, each with its pid, or its
 * node on Slurm's nodes; above, the counts and exceptions, where a rank done
 * with its cell is idle (it stays), one whose cell raised has "raised", and
 * one interrupted is "interrupted":
 *
 *   started ranks 1f0c9a2e: 1024 CPU ranks · up 312 s · running a cell
 *     Slurm job 4242 on node[1-128] (time limit 2:00:00)
 *     1024 ranks on 128 nodes: 1018 running · 5 idle · 1 raised
 *     node[1-9,11-128]: 8 running on each
 *     node10: 2 running · 5 idle · 1 raised
 *     raised: rank 77 on node10
 *     output shown: ranks 0, 8, 16–31 (all in the logs)
 */
#ifndef DK_DIST_STATUS_H
#define DK_DIST_STATUS_H

#include "dk_dist_opts.h"
#include "dk_dist_rank.h"

/* Up to this many ranks, each has its word on the ranks' line. */
#define DK_DIST_STATUS_EACH_RANK_MAX 8
/* The status's lines at most, at any size. */
#define DK_DIST_STATUS_MAX_LINES 12

/* What the status of started ranks says that a run's does not. */
typedef struct {
    const char *id;              /* the started ranks' name (dk_dist_pool_id) */
    double idle_s;               /* idle for this long; 0: a cell runs on them */
    double idle_timeout_s;       /* they end after this long idle; 0: never */
    /* On Slurm's nodes: the allocation the ranks are steps of, its nodes as
     * Slurm writes them, its time limit ("": Slurm's default); NULL here. */
    const char *slurm_job;
    const char *slurm_nodes;
    const char *slurm_time_limit;
} dk_dist_started_t;

typedef struct {
    const char *what;            /* "2 CPU ranks", "8 × NVIDIA H100" */
    double elapsed_s;
    const char *headline;        /* "finished", "failed", ... or NULL */
    int attempt, attempts;       /* restarts=: "attempt 2 of 3" (ATTEMPTS 0: none) */
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
    /* Whose output the cell shows (dk_dist_plan_output): SHOWN NULL for every
     * rank's, else WORLD flags; with OUTPUT DK_OUTPUT_LOCAL0 or DK_OUTPUT_LIST
     * the status names those ranks. */
    dk_output_mode_t output;
    const bool *shown;
    /* Started ranks: their header's facts, and ELAPSED_S is how long they
     * have been up (WHAT, WORLD, RANKS, GPU, HOSTS, GPU_MEMORY as for a run;
     * HEADLINE and LOG_DIR unused). NULL for a run. */
    const dk_dist_started_t *started;
    /* A run's ranks silent for a while: WHERE(WHERE_DATA, MAX_LINES) gives
     * the lines saying where they are, within the lines the status has left
     * (at least 1), each ending in '\n' (malloc'd), or NULL for none
     * (dk_dist_stall_lines). NULL: none. */
    char *(*where)(void *data, size_t max_lines);
    void *where_data;
} dk_dist_status_t;

/* The status text (malloc'd; NULL when out of memory), a run's or, with
 * STARTED, the started ranks'; no newline at its end. At most
 * DK_DIST_STATUS_MAX_LINES lines. O(N log N) in the ranks, with one
 * gpu_memory call per GPU rank it tells the memory of. */
char *dk_dist_status_text(const dk_dist_status_t *st);

#endif
