/*
 * dk_nccl_load: the CUDA runtime and NCCL, loaded with dlopen when the check
 * first needs them. See dk_nccl_cuda.h for what is called and dk_nccl.h for
 * where the libraries are looked for.
 *
 * The tables are filled once per process (pthread_once) and never unloaded:
 * a process has one set of these libraries, and the check runs in a process
 * of its own.
 */
#include "dk_nccl.h"
#include "dk_nccl_cuda.h"
#include "dk_dl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dk_cuda_api_t cuda;
static dk_nccl_api_t nccl;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT, nccl_once = PTHREAD_ONCE_INIT;

/* DIRS for dk_dl_open_first: $CUDA_HOME, then /usr/local/cuda. */
#define CUDA_DIRS {getenv("CUDA_HOME") ? getenv("CUDA_HOME") : "", "/usr/local/cuda", NULL}

#define SYM(table, field, symbol, required) {symbol, (void **)&table.field, required}

static void cuda_load(void)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                        NULL};
    const char *dirs[] = CUDA_DIRS;
    char tried[200];
    cuda.count = -1;
    cuda.lib = dk_dl_open_first("DISTKERNEL_CUDART_LIB", names, dirs, tried, sizeof tried);
    if (!cuda.lib) {
        snprintf(cuda.why, sizeof cuda.why,
                 "libcudart not found (tried %s): install the CUDA runtime or set "
                 "DISTKERNEL_CUDART_LIB to its path",
                 tried);
        return;
    }
    const dk_dl_sym_t syms[] = {
        SYM(cuda, get_device_count, "cudaGetDeviceCount", true),
        SYM(cuda, set_device, "cudaSetDevice", true),
        SYM(cuda, malloc, "cudaMalloc", true),
        SYM(cuda, free, "cudaFree", true),
        SYM(cuda, memset, "cudaMemset", true),
        SYM(cuda, memcpy, "cudaMemcpy", true),
        SYM(cuda, mem_get_info, "cudaMemGetInfo", true),
        SYM(cuda, stream_create, "cudaStreamCreateWithFlags", true),
        SYM(cuda, stream_destroy, "cudaStreamDestroy", true),
        SYM(cuda, stream_sync, "cudaStreamSynchronize", true),
        SYM(cuda, device_sync, "cudaDeviceSynchronize", true),
        SYM(cuda, get_last_error, "cudaGetLastError", true),
        SYM(cuda, error_string, "cudaGetErrorString", true),
        SYM(cuda, runtime_version, "cudaRuntimeGetVersion", true),
        SYM(cuda, driver_version, "cudaDriverGetVersion", true),
    };
    if (!dk_dl_resolve(cuda.lib, syms, sizeof syms / sizeof *syms)) {
        snprintf(cuda.why, sizeof cuda.why, "the CUDA runtime library lacks a function the "
                                            "check needs; it is too old");
        cuda.lib = NULL;
        return;
    }
    int n = 0;
    dk_cuda_err_t rc = cuda.get_device_count(&n);
    if (rc == DK_CUDA_ERROR_INSUFFICIENT_DRIVER)
        snprintf(cuda.why, sizeof cuda.why, "the CUDA runtime found no usable NVIDIA driver: %s",
                 cuda.error_string(rc));
    else if (rc == DK_CUDA_ERROR_NO_DEVICE || (rc == DK_CUDA_SUCCESS && n == 0))
        snprintf(cuda.why, sizeof cuda.why, "the CUDA runtime sees no GPU");
    else if (rc != DK_CUDA_SUCCESS) {
        snprintf(cuda.why, sizeof cuda.why, "the CUDA runtime cannot use the GPUs: %s (CUDA "
                 "error %d)", cuda.error_string(rc), rc);
        cuda.broken = 1;
    } else
        cuda.count = n;
}

static void nccl_load(void)
{
    static const char *const names[] = {"libnccl.so.2", "libnccl.so", NULL};
    char tried[200];
    nccl.version = -1;
    const char *dirs[] = CUDA_DIRS;
    nccl.lib = dk_dl_open_first("DISTKERNEL_NCCL_LIB", names, dirs, tried, sizeof tried);
    if (!nccl.lib) {
        snprintf(nccl.why, sizeof nccl.why,
                 "NCCL not found (tried %s): install NCCL or set DISTKERNEL_NCCL_LIB to the "
                 "path of libnccl.so.2 (the one torch ships will do)",
                 tried);
        return;
    }
    const dk_dl_sym_t syms[] = {
        SYM(nccl, get_version, "ncclGetVersion", true),
        SYM(nccl, comm_init_all, "ncclCommInitAll", true),
        SYM(nccl, comm_destroy, "ncclCommDestroy", true),
        SYM(nccl, async_error, "ncclCommGetAsyncError", false),
        SYM(nccl, all_reduce, "ncclAllReduce", true),
        SYM(nccl, group_start, "ncclGroupStart", true),
        SYM(nccl, group_end, "ncclGroupEnd", true),
        SYM(nccl, error_string, "ncclGetErrorString", true),
    };
    int v = 0;
    if (!dk_dl_resolve(nccl.lib, syms, sizeof syms / sizeof *syms) ||
        nccl.get_version(&v) != DK_NCCL_SUCCESS) {
        snprintf(nccl.why, sizeof nccl.why, "the NCCL library lacks a function the check needs; "
                                            "it is too old");
        nccl.lib = NULL;
        return;
    }
    nccl.version = v;
}

#undef SYM
#undef CUDA_DIRS

const dk_cuda_api_t *dk_cuda_api(void)
{
    pthread_once(&cuda_once, cuda_load);
    return &cuda;
}

const dk_nccl_api_t *dk_nccl_api(void)
{
    pthread_once(&nccl_once, nccl_load);
    return &nccl;
}

int dk_nccl_cuda_device_count(char *why, size_t whylen)
{
    pthread_once(&cuda_once, cuda_load);
    if (cuda.count < 0 && why && whylen)
        snprintf(why, whylen, "%s", cuda.why);
    return cuda.count;
}

int dk_nccl_library_version(char *why, size_t whylen)
{
    pthread_once(&nccl_once, nccl_load);
    if (nccl.version < 0 && why && whylen)
        snprintf(why, whylen, "%s", nccl.why);
    return nccl.version;
}

