/*
 * dk_dist_plan: how many ranks, and where, from a run's options and the node.
 *
 * num_processes=N asks for N CPU ranks (gloo); otherwise each rank gets one of
 * the node's GPUs, all of them unless num_accelerators= says fewer.
 *
 * accelerator_type= (or gpu_type=) names a GPU model. The node's own model
 * runs. A model of the managed platform's fleet (A10, H100, B300) that this
 * node lacks runs too, on the node's GPUs, with a one-line notice naming both:
 * on that platform the type picks a machine from its fleet, here the node is
 * given, and a notebook written there should run unchanged. Any other model
 * is a requirement the node does not meet: an error naming what it has and the
 * platform's types. Pure: the caller discovers the GPUs.
 */
#ifndef DK_DIST_PLAN_H
#define DK_DIST_PLAN_H

#include "dk_dist_opts.h"
#include "dk_gpu.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int world;                   /* the number of ranks */
    bool gpu;                    /* GPU ranks, one GPU each; else CPU ranks */
    char what[160];              /* for the status line: "2 CPU ranks", "8 × NVIDIA H100" */
    char device[128];            /* "NVIDIA H100 80GB HBM3" or "cpu" */
    char model[32];              /* the GPUs' model ("H100"), "" for CPU ranks */
    int gpu_index[DK_GPU_MAX];   /* rank r's NVML index, for GPU ranks */
    char notice[400];            /* a line for the user ("" if none): a platform type
                                    this node lacks, and what runs instead */
    /* launcher=slurm (dk_dist_plan_slurm): the ranks run on Slurm's nodes,
     * NODES of them with PER_NODE ranks each and, for GPU ranks, as many GPUs
     * asked of each node; gpu_index is unset (no GPU of this host is theirs). */
    bool remote;
    int nodes;
    int per_node;
    char gpu_type[64];           /* Slurm's GRES type of the GPUs asked for ("h100"), ""
                                    for any (no type asked, or the nodes name none) */
} dk_dist_plan_t;

/* Plan the run that OPTS asks for on a node with GPUS into OUT. Returns 0, or
 * -1 with ERR saying what the node lacks and what to ask for instead. */
int dk_dist_plan(const dk_dist_opts_t *opts, const dk_gpu_list_t *gpus, dk_dist_plan_t *out,
                 char *err, size_t errlen);

/* Rank R's GPU on this host (its NVML index, which the status line reads the
 * memory of), or -1: CPU ranks, and ranks on Slurm's nodes, whose pids here
 * are srun's and whose GPUs are not this host's. */
int dk_dist_plan_local_gpu(const dk_dist_plan_t *plan, int r);

/* Whose output the cell shows, for a run planned as PLAN with OPTS's
 * output=: *SHOWN NULL for every rank (output=all), else an array of
 * PLAN->world flags the caller frees (rank0: rank 0; local0: local rank 0 of
 * each node, ranks 0, per_node, 2 * per_node... on Slurm's nodes, rank 0 on
 * this one; a list: its ranks). Returns 0, or -1 with ERR naming what the
 * list asks that the world lacks (a rank past its last) and what to write,
 * or saying the memory ran out. Called before any rank starts. */
int dk_dist_plan_output(const dk_dist_plan_t *plan, const dk_dist_opts_t *opts, bool **shown,
                        char *err, size_t errlen);

/* Plan a run on Slurm's nodes (launcher=slurm) that OPTS asks for, where
 * each node has GPUS_PER_NODE GPUs (GRES: sinfo's words for them, WHERE:
 * "partition gpu", for messages): nothing of this host decides. CPU ranks:
 * num_processes over nodes= (1 by default). GPU ranks: one GPU each,
 * num_accelerators (default: every GPU of nodes= nodes, 1 by default) over
 * nodes=, or over as many whole nodes as they fill when nodes= is not given.
 * The world must split evenly over the nodes and fit each node's GPUs (an
 * error names DISTKERNEL_NODES when the nodes are its default).
 * GPU_TYPE: the nodes' GRES type of the model OPTS asks for (accelerator_type
 * or gpu_type), "" when none has it; the plan then asks for that type, and
 * otherwise a model the nodes' typed GRES lacks is an error naming their
 * types, unless it is one of the managed platform's (a notice: the nodes'
 * GPUs are used). Untyped GRES cannot be checked: a notice says so.
 * Returns 0, or -1 with ERR naming the numbers and what to give instead. */
int dk_dist_plan_slurm(const dk_dist_opts_t *opts, int gpus_per_node, const char *gres,
                       const char *gpu_type,
                       const char *where, dk_dist_plan_t *out, char *err, size_t errlen);

#endif
