/*
 * dk_distributed: %%distributed and the @distributed decorator, on the runtime.
 *
 * This is where the kernel meets the runtime (runtime/launch/dk_job.h): it checks the
 * options against the node's devices, asks the Python glue for the job's payload
 * (the cell and the notebook names it uses, or a function and its arguments,
 * pickled), runs the job with a sink that turns rank output into labelled stream
 * text and live displays, waits for it while honouring interrupts and shutdown,
 * and turns the outcome into the cell's result or error.
 */
#ifndef DK_DISTRIBUTED_H
#define DK_DISTRIBUTED_H

#include "dk_kernel.h"

typedef struct dk_distributed_t dk_distributed_t;

/* The feature for KERNEL: registers %%distributed and the line magic
 * `%distributed start|status|stop|restart` (ranks kept between cells) with the
 * kernel's magics, `_distkernel.run_job` (what @distributed's .distributed()
 * calls) with its Python module, and ending the started ranks and the MLflow
 * server it may start with its exit.
 * Call before dk_kernel_run; the feature lives as long as the process.
 * Returns NULL when out of memory or when the kernel has no room left. */
dk_distributed_t *dk_distributed_new(dk_kernel_t *kernel);

#endif
