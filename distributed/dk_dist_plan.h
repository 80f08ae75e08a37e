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
} dk_dist_plan_t;

/* Plan the run that OPTS asks for on a node with GPUS into OUT. Returns 0, or
 * -1 with ERR saying what the node lacks and what to ask for instead. */
int dk_dist_plan(const dk_dist_opts_t *opts, const dk_gpu_list_t *gpus, dk_dist_plan_t *out,
                 char *err, size_t errlen);

#endif
