/*
 * dk_nccl_abi_check: compile-time proof that dk_nccl_cuda.h matches the real
 * CUDA runtime and NCCL headers.
 *
 * Built only when meson finds cuda_runtime_api.h and nccl.h (runtime/gpu/meson.build).
 * It maps dk_nccl_cuda.h's type names to the headers' types, then asks the
 * compiler whether every function pointer type dk_nccl.c stores dlsym results
 * in is the type of the real function, and whether every constant and size
 * it relies on is the headers' own. Nothing here runs and nothing links
 * against libcudart or libnccl: __typeof__ does not reference the symbols.
 */
#include <cuda_runtime_api.h>
#include <nccl.h>

#define DK_NCCL_CUDA_REAL_TYPES 1
#define dk_cuda_err_t cudaError_t
#define dk_cuda_memcpy_kind_t enum cudaMemcpyKind
#define dk_cuda_stream_t cudaStream_t
#define dk_nccl_res_t ncclResult_t
#define dk_nccl_datatype_t ncclDataType_t
#define dk_nccl_redop_t ncclRedOp_t
#define dk_nccl_comm_t ncclComm_t
#include "dk_nccl_cuda.h"

#define SAME_TYPE(fn_type, real_fn) \
    _Static_assert(__builtin_types_compatible_p(fn_type, __typeof__(&real_fn)), \
                   #fn_type " does not match " #real_fn " in the CUDA/NCCL headers")

SAME_TYPE(dk_cuda_get_device_count_fn, cudaGetDeviceCount);
SAME_TYPE(dk_cuda_set_device_fn, cudaSetDevice);
SAME_TYPE(dk_cuda_malloc_fn, cudaMalloc);
SAME_TYPE(dk_cuda_free_fn, cudaFree);
SAME_TYPE(dk_cuda_memset_fn, cudaMemset);
SAME_TYPE(dk_cuda_memcpy_fn, cudaMemcpy);
SAME_TYPE(dk_cuda_mem_get_info_fn, cudaMemGetInfo);
SAME_TYPE(dk_cuda_stream_create_with_flags_fn, cudaStreamCreateWithFlags);
SAME_TYPE(dk_cuda_stream_destroy_fn, cudaStreamDestroy);
SAME_TYPE(dk_cuda_stream_synchronize_fn, cudaStreamSynchronize);
SAME_TYPE(dk_cuda_device_synchronize_fn, cudaDeviceSynchronize);
SAME_TYPE(dk_cuda_get_last_error_fn, cudaGetLastError);
SAME_TYPE(dk_cuda_get_error_string_fn, cudaGetErrorString);
SAME_TYPE(dk_cuda_version_fn, cudaRuntimeGetVersion);
SAME_TYPE(dk_cuda_version_fn, cudaDriverGetVersion);

SAME_TYPE(dk_nccl_get_version_fn, ncclGetVersion);
SAME_TYPE(dk_nccl_comm_init_all_fn, ncclCommInitAll);
SAME_TYPE(dk_nccl_comm_destroy_fn, ncclCommDestroy);
SAME_TYPE(dk_nccl_comm_get_async_error_fn, ncclCommGetAsyncError);
SAME_TYPE(dk_nccl_all_reduce_fn, ncclAllReduce);
SAME_TYPE(dk_nccl_group_fn, ncclGroupStart);
SAME_TYPE(dk_nccl_group_fn, ncclGroupEnd);
SAME_TYPE(dk_nccl_get_error_string_fn, ncclGetErrorString);

#define SAME_VALUE(ours, real) \
    _Static_assert((int)(ours) == (int)(real), #ours " is not " #real " in the CUDA/NCCL headers")

/* dk_nccl.c, built without the headers, passes these as int and pointers. */
_Static_assert(sizeof(cudaError_t) == sizeof(int), "cudaError_t is not int-sized");
_Static_assert(sizeof(enum cudaMemcpyKind) == sizeof(int), "cudaMemcpyKind is not int-sized");
_Static_assert(sizeof(ncclResult_t) == sizeof(int), "ncclResult_t is not int-sized");
_Static_assert(sizeof(ncclDataType_t) == sizeof(int), "ncclDataType_t is not int-sized");
_Static_assert(sizeof(ncclRedOp_t) == sizeof(int), "ncclRedOp_t is not int-sized");
_Static_assert(sizeof(cudaStream_t) == sizeof(void *), "cudaStream_t is not a pointer");
_Static_assert(sizeof(ncclComm_t) == sizeof(void *), "ncclComm_t is not a pointer");

SAME_VALUE(DK_CUDA_SUCCESS, cudaSuccess);
SAME_VALUE(DK_CUDA_ERROR_INSUFFICIENT_DRIVER, cudaErrorInsufficientDriver);
SAME_VALUE(DK_CUDA_ERROR_NO_DEVICE, cudaErrorNoDevice);
SAME_VALUE(DK_CUDA_MEMCPY_HOST_TO_DEVICE, cudaMemcpyHostToDevice);
SAME_VALUE(DK_CUDA_MEMCPY_DEVICE_TO_HOST, cudaMemcpyDeviceToHost);
SAME_VALUE(DK_CUDA_STREAM_NON_BLOCKING, cudaStreamNonBlocking);
SAME_VALUE(DK_NCCL_SUCCESS, ncclSuccess);
SAME_VALUE(DK_NCCL_IN_PROGRESS, ncclInProgress);
SAME_VALUE(DK_NCCL_FLOAT32, ncclFloat32);
SAME_VALUE(DK_NCCL_SUM, ncclSum);

/* ISO C wants a translation unit to declare something. */
extern const int dk_nccl_abi_checked;
const int dk_nccl_abi_checked = NCCL_VERSION_CODE;
