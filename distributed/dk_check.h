/*
 * dk_check: %distributed_check and check=True, the NCCL preflight check.
 *
 * The check all-reduces across every local GPU and creates a CUDA context on
 * each, so it runs in its own process, distkernel-check (runtime/gpu/check_main.c),
 * never in the kernel, which must hold no CUDA context. The kernel relays what
 * the program writes to stderr (NCCL's own logs), reads its JSON report from
 * stdout, and renders it with dk_nccl_report_text.
 */
#ifndef DK_CHECK_H
#define DK_CHECK_H

#include "dk_kernel.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Register %distributed_check with KERNEL's magics. Returns -1 if it cannot. */
int dk_check_register(dk_kernel_t *kernel);

/* Run the check with ARGS (extra command-line arguments, blank-separated; may
 * be NULL), called on the main thread with the GIL held (released while it
 * waits); what the program writes to stderr goes to STREAM's stderr. Returns
 * the report (new reference), or NULL with ERR filled; an interrupt ends the
 * program and sets *INTERRUPTED. */
json_t *dk_check_run(dk_stream_t *stream, const char *args, bool *interrupted, char *err,
                     size_t errlen);

#endif
