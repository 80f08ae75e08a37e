/*
 * dk_nccl_cuda: the slice of the CUDA runtime and NCCL C APIs that dk_nccl
 * calls, declared here so that building needs neither header.
 *
 * Both libraries are loaded with dlopen at run time (dk_nccl_load.c), so only their
 * C ABI matters: enums are passed as int, handles as opaque pointers. The
 * values below are the ones CUDA 12/13 and NCCL 2.x have always used. When the
 * real headers are on the build machine, dk_nccl_abi_check.c compiles them
 * side by side with this file and fails the build on any difference.
 *
 * Private to runtime/gpu/ (dk_nccl.c, dk_nccl_load.c): callers include dk_nccl.h.
 */
#ifndef DK_NCCL_CUDA_H
#define DK_NCCL_CUDA_H

#include <stddef.h>

/* dk_nccl_abi_check.c defines DK_NCCL_CUDA_REAL_TYPES and maps these names
 * to the headers' own types, so the prototypes below are checked against the
 * real ones. */
#ifndef DK_NCCL_CUDA_REAL_TYPES
/* CUDA runtime (cuda_runtime_api.h, driver_types.h). */
typedef int dk_cuda_err_t;                       /* cudaError_t */
typedef int dk_cuda_memcpy_kind_t;               /* enum cudaMemcpyKind */
typedef struct dk_cuda_stream *dk_cuda_stream_t; /* cudaStream_t */
/* NCCL (nccl.h). */
typedef int dk_nccl_res_t;                       /* ncclResult_t */
typedef int dk_nccl_datatype_t;                  /* ncclDataType_t */
typedef int dk_nccl_redop_t;                     /* ncclRedOp_t */
typedef struct dk_nccl_comm *dk_nccl_comm_t;     /* ncclComm_t */
#endif

enum {
    DK_CUDA_SUCCESS = 0,                  /* cudaSuccess */
    DK_CUDA_ERROR_INSUFFICIENT_DRIVER = 35, /* cudaErrorInsufficientDriver */
    DK_CUDA_ERROR_NO_DEVICE = 100,        /* cudaErrorNoDevice */
    DK_CUDA_MEMCPY_HOST_TO_DEVICE = 1,    /* cudaMemcpyHostToDevice */
    DK_CUDA_MEMCPY_DEVICE_TO_HOST = 2,    /* cudaMemcpyDeviceToHost */
    DK_CUDA_STREAM_NON_BLOCKING = 1,      /* cudaStreamNonBlocking */
};

typedef dk_cuda_err_t (*dk_cuda_get_device_count_fn)(int *count);
typedef dk_cuda_err_t (*dk_cuda_set_device_fn)(int device);
typedef dk_cuda_err_t (*dk_cuda_malloc_fn)(void **ptr, size_t size);
typedef dk_cuda_err_t (*dk_cuda_free_fn)(void *ptr);
typedef dk_cuda_err_t (*dk_cuda_memset_fn)(void *ptr, int value, size_t count);
typedef dk_cuda_err_t (*dk_cuda_memcpy_fn)(void *dst, const void *src, size_t count,
                                           dk_cuda_memcpy_kind_t kind);
typedef dk_cuda_err_t (*dk_cuda_mem_get_info_fn)(size_t *free_bytes, size_t *total_bytes);
typedef dk_cuda_err_t (*dk_cuda_stream_create_with_flags_fn)(dk_cuda_stream_t *stream,
                                                             unsigned int flags);
typedef dk_cuda_err_t (*dk_cuda_stream_destroy_fn)(dk_cuda_stream_t stream);
typedef dk_cuda_err_t (*dk_cuda_stream_synchronize_fn)(dk_cuda_stream_t stream);
typedef dk_cuda_err_t (*dk_cuda_device_synchronize_fn)(void);
typedef dk_cuda_err_t (*dk_cuda_get_last_error_fn)(void);
typedef const char *(*dk_cuda_get_error_string_fn)(dk_cuda_err_t error);
typedef dk_cuda_err_t (*dk_cuda_version_fn)(int *version);

enum {
    DK_NCCL_SUCCESS = 0,   /* ncclSuccess */
    DK_NCCL_IN_PROGRESS = 7, /* ncclInProgress */
    DK_NCCL_FLOAT32 = 7,   /* ncclFloat32 */
    DK_NCCL_SUM = 0,       /* ncclSum */
};

typedef dk_nccl_res_t (*dk_nccl_get_version_fn)(int *version);
typedef dk_nccl_res_t (*dk_nccl_comm_init_all_fn)(dk_nccl_comm_t *comms, int ndev,
                                                  const int *devlist);
typedef dk_nccl_res_t (*dk_nccl_comm_destroy_fn)(dk_nccl_comm_t comm);
typedef dk_nccl_res_t (*dk_nccl_comm_get_async_error_fn)(dk_nccl_comm_t comm,
                                                         dk_nccl_res_t *async_error);
typedef dk_nccl_res_t (*dk_nccl_all_reduce_fn)(const void *sendbuff, void *recvbuff,
                                               size_t count, dk_nccl_datatype_t datatype,
                                               dk_nccl_redop_t op,
                                               dk_nccl_comm_t comm, dk_cuda_stream_t stream);
typedef dk_nccl_res_t (*dk_nccl_group_fn)(void);
typedef const char *(*dk_nccl_get_error_string_fn)(dk_nccl_res_t result);

/* The CUDA runtime as loaded (dk_nccl_load.c). */
typedef struct {
    void *lib;
    char why[400];
    int count;
    int broken;   /* the runtime loaded but failed on GPUs the driver reports */
    dk_cuda_get_device_count_fn get_device_count;
    dk_cuda_set_device_fn set_device;
    dk_cuda_malloc_fn malloc;
    dk_cuda_free_fn free;
    dk_cuda_memset_fn memset;
    dk_cuda_memcpy_fn memcpy;
    dk_cuda_mem_get_info_fn mem_get_info;
    dk_cuda_stream_create_with_flags_fn stream_create;
    dk_cuda_stream_destroy_fn stream_destroy;
    dk_cuda_stream_synchronize_fn stream_sync;
    dk_cuda_device_synchronize_fn device_sync;
    dk_cuda_get_last_error_fn get_last_error;
    dk_cuda_get_error_string_fn error_string;
    dk_cuda_version_fn runtime_version, driver_version;
} dk_cuda_api_t;

/* NCCL as loaded (dk_nccl_load.c). */
typedef struct {
    void *lib;
    char why[400];
    int version;
    dk_nccl_get_version_fn get_version;
    dk_nccl_comm_init_all_fn comm_init_all;
    dk_nccl_comm_destroy_fn comm_destroy;
    dk_nccl_comm_get_async_error_fn async_error;
    dk_nccl_all_reduce_fn all_reduce;
    dk_nccl_group_fn group_start, group_end;
    dk_nccl_get_error_string_fn error_string;
} dk_nccl_api_t;

/* The CUDA runtime, loaded on the first call (once per process: a process has
 * one set of these libraries, never unloaded). lib is NULL, or count is -1,
 * when it cannot be used, and why says so. */
const dk_cuda_api_t *dk_cuda_api(void);

/* NCCL, likewise: lib is NULL and why says so when it cannot be used. */
const dk_nccl_api_t *dk_nccl_api(void);

#endif
