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

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dk_cuda_api_t cuda;
static dk_nccl_api_t nccl;
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT, nccl_once = PTHREAD_ONCE_INIT;

/* dlopen the first of NAMES found: an explicit path from ENV_VAR, then each
 * name on the loader's path, then under $CUDA_HOME/lib64 and
 * /usr/local/cuda/lib64. TRIED lists what was tried, for the message. */
static void *open_first(const char *env_var, const char *const *names, char *tried, size_t len)
{
    const char *dirs[] = {getenv("CUDA_HOME"), "/usr/local/cuda", NULL};
    size_t used = 0;
    tried[0] = '\0';
    const char *explicit = getenv(env_var);
    if (explicit && *explicit) {
        void *h = dlopen(explicit, RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        used += (size_t)snprintf(tried + used, len - used, "%s=%s (%s); ", env_var, explicit,
                                 dlerror());
    }
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        for (int d = 0; d < 2; d++) {
            if (!dirs[d] || !*dirs[d])
                continue;
            char path[512];
            snprintf(path, sizeof path, "%s/lib64/%s", dirs[d], names[i]);
            if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
                return h;
        }
        if (used < len)
            used += (size_t)snprintf(tried + used, len - used, "%s%s", i ? ", " : "", names[i]);
    }
    return NULL;
}

#define LOAD(table, field, symbol) (*(void **)&table.field = dlsym(table.lib, symbol))

static void cuda_load(void)
{
    static const char *const names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so",
                                        NULL};
    char tried[200];
    cuda.count = -1;
    cuda.lib = open_first("DISTKERNEL_CUDART_LIB", names, tried, sizeof tried);
    if (!cuda.lib) {
        snprintf(cuda.why, sizeof cuda.why,
                 "libcudart not found (tried %s): install the CUDA runtime or set "
                 "DISTKERNEL_CUDART_LIB to its path",
                 tried);
        return;
    }
    LOAD(cuda, get_device_count, "cudaGetDeviceCount");
    LOAD(cuda, set_device, "cudaSetDevice");
    LOAD(cuda, malloc, "cudaMalloc");
    LOAD(cuda, free, "cudaFree");
    LOAD(cuda, memset, "cudaMemset");
    LOAD(cuda, memcpy, "cudaMemcpy");
    LOAD(cuda, mem_get_info, "cudaMemGetInfo");
    LOAD(cuda, stream_create, "cudaStreamCreateWithFlags");
    LOAD(cuda, stream_destroy, "cudaStreamDestroy");
    LOAD(cuda, stream_sync, "cudaStreamSynchronize");
    LOAD(cuda, device_sync, "cudaDeviceSynchronize");
    LOAD(cuda, get_last_error, "cudaGetLastError");
    LOAD(cuda, error_string, "cudaGetErrorString");
    LOAD(cuda, runtime_version, "cudaRuntimeGetVersion");
    LOAD(cuda, driver_version, "cudaDriverGetVersion");
    if (!cuda.get_device_count || !cuda.set_device || !cuda.malloc || !cuda.free ||
        !cuda.memset || !cuda.memcpy || !cuda.mem_get_info || !cuda.stream_create ||
        !cuda.stream_destroy || !cuda.stream_sync || !cuda.device_sync ||
        !cuda.get_last_error || !cuda.error_string || !cuda.runtime_version ||
        !cuda.driver_version) {
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
    nccl.lib = open_first("DISTKERNEL_NCCL_LIB", names, tried, sizeof tried);
    if (!nccl.lib) {
        snprintf(nccl.why, sizeof nccl.why,
                 "NCCL not found (tried %s): install NCCL or set DISTKERNEL_NCCL_LIB to the "
                 "path of libnccl.so.2 (the one torch ships will do)",
                 tried);
        return;
    }
    LOAD(nccl, get_version, "ncclGetVersion");
    LOAD(nccl, comm_init_all, "ncclCommInitAll");
    LOAD(nccl, comm_destroy, "ncclCommDestroy");
    LOAD(nccl, async_error, "ncclCommGetAsyncError");
    LOAD(nccl, all_reduce, "ncclAllReduce");
    LOAD(nccl, group_start, "ncclGroupStart");
    LOAD(nccl, group_end, "ncclGroupEnd");
    LOAD(nccl, error_string, "ncclGetErrorString");
    int v = 0;
    if (!nccl.get_version || !nccl.comm_init_all || !nccl.comm_destroy || !nccl.all_reduce ||
        !nccl.group_start || !nccl.group_end || !nccl.error_string ||
        nccl.get_version(&v) != DK_NCCL_SUCCESS) {
        snprintf(nccl.why, sizeof nccl.why, "the NCCL library lacks a function the check needs; "
                                            "it is too old");
        nccl.lib = NULL;
        return;
    }
    nccl.version = v;
}

#undef LOAD

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

