/*
 * dk_gpu: GPU discovery through NVML loaded at run time. See dk_gpu.h.
 *
 * The few NVML entry points used here are declared locally (their C ABI has
 * been stable since NVML's _v2 symbols), so building needs no NVML header.
 */
#include "dk_gpu.h"
#include "dk_dl.h"
#include <ctype.h>

#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void *nvml_device_t;
typedef struct { unsigned long long total, free, used; } nvml_memory_t;
typedef struct { unsigned int pid; unsigned long long used; unsigned int gi, ci; } nvml_proc_t;

static struct {
    void *lib;
    int (*init)(void);
    int (*count)(unsigned int *);
    int (*handle)(unsigned int, nvml_device_t *);
    int (*name)(nvml_device_t, char *, unsigned int);
    int (*uuid)(nvml_device_t, char *, unsigned int);
    int (*memory)(nvml_device_t, nvml_memory_t *);
    int (*procs)(nvml_device_t, unsigned int *, nvml_proc_t *);
    const char *(*error)(int);
    int ok;
    char why[200];
} nvml;

static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;

static void nvml_load(void)
{
    static const char *const names[] = {"libnvidia-ml.so.1", "libnvidia-ml.so", NULL};
    char tried[200];
    nvml.lib = dk_dl_open_first(NULL, names, NULL, tried, sizeof tried);
    if (!nvml.lib) {
        snprintf(nvml.why, sizeof nvml.why, "no NVIDIA driver on this machine (libnvidia-ml.so.1 "
                                            "not found)");
        return;
    }
#define SYM(field, symbol, required) {symbol, (void **)&nvml.field, required}
    const dk_dl_sym_t syms[] = {
        SYM(init, "nvmlInit_v2", true),
        SYM(count, "nvmlDeviceGetCount_v2", true),
        SYM(handle, "nvmlDeviceGetHandleByIndex_v2", true),
        SYM(name, "nvmlDeviceGetName", true),
        SYM(uuid, "nvmlDeviceGetUUID", false),
        SYM(memory, "nvmlDeviceGetMemoryInfo", true),
        SYM(procs, "nvmlDeviceGetComputeRunningProcesses_v3", false),
        SYM(error, "nvmlErrorString", false),
    };
#undef SYM
    if (!dk_dl_resolve(nvml.lib, syms, sizeof syms / sizeof *syms)) {
        snprintf(nvml.why, sizeof nvml.why, "the NVIDIA driver's NVML library is too old");
        return;
    }
    int rc = nvml.init();
    if (rc != 0) {
        snprintf(nvml.why, sizeof nvml.why, "the NVIDIA driver did not start: %s",
                 nvml.error ? nvml.error(rc) : "NVML error");
        return;
    }
    nvml.ok = 1;
}

/* Is NVML device (INDEX, UUID) visible under CUDA_VISIBLE_DEVICES? Returns its
 * position in the list, or -1. Without the variable every device is visible in
 * NVML order. */
static int visible_position(int index, const char *uuid, int *listed)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    *listed = env != NULL;
    if (!env)
        return index;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", env);
    int pos = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save), pos++) {
        while (*tok == ' ')
            tok++;
        char *end;
        long n = strtol(tok, &end, 10);
        if (end != tok && *end == '\0') {
            if (n < 0)
                return -1;   /* CUDA stops at the first invalid index */
            if (n == index)
                return pos;
        } else if (uuid[0] && strncmp(uuid, tok, strlen(tok)) == 0) {
            return pos;
        }
    }
    return -1;
}

void dk_gpu_discover(dk_gpu_list_t *out)
{
    memset(out, 0, sizeof *out);
    pthread_once(&nvml_once, nvml_load);
    if (!nvml.ok) {
        snprintf(out->why_none, sizeof out->why_none, "%s", nvml.why);
        return;
    }
    unsigned int n = 0;
    if (nvml.count(&n) != 0 || n == 0) {
        snprintf(out->why_none, sizeof out->why_none, "the NVIDIA driver reports no GPU");
        return;
    }
    dk_gpu_t found[DK_GPU_MAX];
    int pos_of[DK_GPU_MAX];
    int total = 0, listed = 0;
    for (unsigned int i = 0; i < n && total < DK_GPU_MAX; i++) {
        nvml_device_t dev;
        if (nvml.handle(i, &dev) != 0)
            continue;
        dk_gpu_t g = {.index = (int)i};
        nvml.name(dev, g.name, sizeof g.name);
        if (nvml.uuid)
            nvml.uuid(dev, g.uuid, sizeof g.uuid);
        nvml_memory_t mem;
        if (nvml.memory(dev, &mem) == 0) {
            g.mem_total = mem.total;
            g.mem_used = mem.used;
        }
        dk_gpu_model_from_name(g.name, g.model, sizeof g.model);
        int pos = visible_position((int)i, g.uuid, &listed);
        if (pos < 0)
            continue;
        pos_of[total] = pos;
        found[total++] = g;
    }
    /* Order as CUDA will number them: the order of CUDA_VISIBLE_DEVICES. */
    for (int want = 0, placed = 0; placed < total && want < 4096; want++)
        for (int j = 0; j < total; j++)
            if (pos_of[j] == want)
                out->gpus[placed++] = found[j];
    out->count = total;
    if (total == 0)
        snprintf(out->why_none, sizeof out->why_none,
                 "CUDA_VISIBLE_DEVICES hides every GPU of this node");
}

unsigned long long dk_gpu_process_memory(int index, int pid)
{
    pthread_once(&nvml_once, nvml_load);
    if (!nvml.ok || !nvml.procs)
        return 0;
    nvml_device_t dev;
    if (nvml.handle((unsigned int)index, &dev) != 0)
        return 0;
    nvml_proc_t procs[64];
    unsigned int n = 64;
    if (nvml.procs(dev, &n, procs) != 0)
        return 0;
    for (unsigned int i = 0; i < n; i++)
        if ((int)procs[i].pid == pid)
            return procs[i].used;
    return 0;
}

void dk_gpu_model_from_name(const char *device_name, char *out, size_t outlen)
{
    /* Longest names first, so "H200" is not read as "H20" and "A100" not as "A10". */
    static const char *models[] = {"GB200", "GB300", "B200", "B300", "H200", "H100", "H800",
                                   "H20",  "A100",  "A800", "A10G", "A10",  "A30",  "A40",
                                   "A6000", "L40S", "L40",  "L4",   "T4",   "V100", NULL};
    out[0] = '\0';
    if (!device_name)
        return;
    char upper_name[256];
    snprintf(upper_name, sizeof upper_name, "%s", device_name);
    for (char *c = upper_name; *c; c++)
        *c = (char)toupper((unsigned char)*c);
    for (int i = 0; models[i]; i++) {
        const char *hit = strstr(upper_name, models[i]);
        while (hit) {
            size_t n = strlen(models[i]);
            bool left = hit == upper_name || !isalnum((unsigned char)hit[-1]);
            bool right = !isalnum((unsigned char)hit[n]);
            if (left && right) {
                snprintf(out, outlen, "%s", models[i]);
                return;
            }
            hit = strstr(hit + 1, models[i]);
        }
    }
}
