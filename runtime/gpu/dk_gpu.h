/*
 * dk_gpu: what GPUs this node has, without touching CUDA.
 *
 * Discovery goes through NVML (libnvidia-ml, shipped with the driver), loaded
 * with dlopen at run time: one build runs on machines with and without GPUs,
 * and NVML never creates a CUDA context, so the kernel process does not pin
 * memory on every GPU the way cudaGetDeviceCount() followed by any CUDA call
 * would. CUDA_VISIBLE_DEVICES is honoured (indexes or UUIDs), as CUDA would.
 */
#ifndef DK_GPU_H
#define DK_GPU_H

#include <stddef.h>

#define DK_GPU_MAX 64

typedef struct {
    int index;                  /* NVML index */
    char name[96];              /* "NVIDIA H200" */
    char model[32];             /* "H200" (dk_gpu_model_from_name), "" if unknown */
    char uuid[96];
    unsigned long long mem_total, mem_used;   /* bytes */
} dk_gpu_t;

typedef struct {
    int count;
    dk_gpu_t gpus[DK_GPU_MAX];
    char why_none[256];         /* when count == 0: why ("no NVIDIA driver", ...) */
} dk_gpu_list_t;

/* Fill OUT with the GPUs visible to this process. Never fails: with no driver
 * or no GPU, OUT->count is 0 and OUT->why_none says why. */
void dk_gpu_discover(dk_gpu_list_t *out);

/* Map a CUDA device name ("NVIDIA H100 80GB HBM3", "NVIDIA A10", "NVIDIA L4") to
 * the managed platform's model name ("H100", "A10", "L4"); writes "" when it is
 * not one that is known. */
void dk_gpu_model_from_name(const char *device_name, char *out, size_t outlen);

/* Memory in use on the GPU at NVML index INDEX by process PID, in bytes; 0 when
 * unknown. */
unsigned long long dk_gpu_process_memory(int index, int pid);

#endif
