/*
 * dk_distributed: %%distributed and the @distributed decorator, on the runtime.
 *
 * This is where the kernel meets the runtime (runtime/dk_job.h): it checks the
 * options against the node's devices, asks the Python glue for the job's payload
 * (the cell and the notebook names it uses, or a function and its arguments,
 * pickled), runs the job with a sink that turns rank output into labelled stream
 * text and live displays, waits for it while honouring interrupts and shutdown,
 * and turns the outcome into the cell's result or error.
 */
#ifndef DK_DISTRIBUTED_H
#define DK_DISTRIBUTED_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dk_magic.h"

/* Register %%distributed with REG. */
void dk_distributed_register(dk_magic_registry_t *reg);

/* _distkernel.run_job(options_text, payload_bytes) -> list of bytes (each
 * rank's pickled value); raises distkernel.DistributedError (or
 * KeyboardInterrupt, TimeoutError, ValueError for bad options) otherwise. */
PyObject *dk_distributed_run_job(PyObject *self, PyObject *args);

#endif
