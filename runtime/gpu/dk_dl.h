/*
 * dk_dl: loading a shared library at run time, the one way the runtime does it
 * (NVML in dk_gpu.c, the CUDA runtime and NCCL in dk_nccl_load.c), so one
 * build runs on machines with and without GPUs.
 *
 * Libraries are opened RTLD_NOW | RTLD_LOCAL and never closed by these
 * functions: the caller keeps the handle for the process's life.
 */
#ifndef DK_DL_H
#define DK_DL_H

#include <stdbool.h>
#include <stddef.h>

/* dlopen the first library found: the path in environment variable ENV_VAR
 * (when ENV_VAR is not NULL and set), then each of NAMES (NULL-terminated) on
 * the loader's path and, after each, DIR/lib64/NAME for each of DIRS
 * (NULL-terminated, may be NULL; empty entries are skipped). Returns the
 * handle, or NULL with TRIED (LEN bytes, always terminated) saying what was
 * tried: "ENV=path (dlerror); name1, name2". */
void *dk_dl_open_first(const char *env_var, const char *const *names, const char *const *dirs,
                       char *tried, size_t len);

typedef struct {
    const char *symbol;
    void **slot;            /* where its address goes: (void **)&table.fn */
    bool required;
} dk_dl_sym_t;

/* Look up each of the N SYMS in LIB and store it (NULL when absent). Returns
 * true when every required one was found. */
bool dk_dl_resolve(void *lib, const dk_dl_sym_t *syms, size_t n);

#endif
