/*
 * What GPUs the node has (runtime/gpu/dk_gpu.h): the device-name to model mapping
 * that accelerator_type is checked against, and discovery through its no-GPU
 * path (this machine has no NVIDIA driver; the GPU path is checked on the
 * device machine).
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_gpu.h"

/* The model dk_gpu_model_from_name gives for NAME. */
static const char *model_of(const char *name)
{
    static char out[32];
    memset(out, 'x', sizeof out);
    dk_gpu_model_from_name(name, out, sizeof out);
    cr_assert_not_null(memchr(out, '\0', sizeof out), "unterminated for \"%s\"", name);
    return out;
}

#define expect_model(name, model) \
    cr_assert_str_eq(model_of(name), model, "\"%s\" -> \"%s\", want \"%s\"", name, \
                     model_of(name), model)

/* ---- device name to model ---- */

Test(model, h100_variants)
{
    expect_model("NVIDIA H100 80GB HBM3", "H100");
    expect_model("NVIDIA H100 PCIe", "H100");
    expect_model("NVIDIA H100 NVL", "H100");
}

Test(model, h200_is_not_h20)
{
    expect_model("NVIDIA H200", "H200");
    expect_model("NVIDIA H200 NVL", "H200");
    expect_model("NVIDIA H20", "H20");
}

Test(model, a100_is_not_a10)
{
    expect_model("NVIDIA A100-SXM4-80GB", "A100");
    expect_model("NVIDIA A100-PCIE-40GB", "A100");
    expect_model("NVIDIA A100 80GB PCIe", "A100");
}

Test(model, a10_and_a10g_are_told_apart)
{
    expect_model("NVIDIA A10", "A10");
    expect_model("NVIDIA A10G", "A10G");
}

Test(model, l4_l40_and_l40s_are_told_apart)
{
    expect_model("NVIDIA L4", "L4");
    expect_model("NVIDIA L40S", "L40S");
    expect_model("NVIDIA L40", "L40");
}

Test(model, blackwell)
{
    expect_model("NVIDIA B200", "B200");
    expect_model("NVIDIA GB200", "GB200");
}

Test(model, older_tesla_names)
{
    expect_model("Tesla T4", "T4");
    expect_model("Tesla V100-SXM2-16GB", "V100");
}

Test(model, matching_ignores_case)
{
    expect_model("nvidia h100 80gb hbm3", "H100");
    expect_model("tesla t4", "T4");
}

Test(model, unknown_names_give_empty)
{
    expect_model("NVIDIA GeForce RTX 4090", "");
    expect_model("AMD Instinct MI300X", "");
    expect_model("", "");
}

Test(model, model_must_be_a_whole_word)
{
    /* "T4" inside "RTX 4090" or "A10" inside "XA100Z" is no match. */
    expect_model("NVIDIA RTX4000", "");
    expect_model("NVIDIA XA100Z", "");
}

Test(model, null_name_gives_empty)
{
    expect_model(NULL, "");
}

Test(model, short_output_buffer_is_truncated_and_terminated)
{
    char out[3];
    memset(out, 'x', sizeof out);
    dk_gpu_model_from_name("NVIDIA H100 80GB HBM3", out, sizeof out);
    cr_assert_str_eq(out, "H1");
}

/* ---- discovery without a driver ---- */

/* True when this machine can load the NVIDIA driver's NVML library: then the
 * no-GPU tests do not apply. */
static bool has_nvidia_driver(void)
{
    dk_gpu_list_t list;
    dk_gpu_discover(&list);
    return list.count > 0 || strstr(list.why_none, "libnvidia-ml") == NULL;
}

Test(discover, no_driver_means_no_gpu_and_says_why)
{
    if (has_nvidia_driver())
        cr_skip_test("this machine has an NVIDIA driver");
    dk_gpu_list_t list;
    memset(&list, 0x55, sizeof list);
    dk_gpu_discover(&list);
    cr_assert_eq(list.count, 0);
    cr_assert_neq(list.why_none[0], '\0');
    cr_assert_not_null(memchr(list.why_none, '\0', sizeof list.why_none));
    cr_assert_not_null(strstr(list.why_none, "driver"), "why_none: %s", list.why_none);
}

Test(discover, repeated_discovery_gives_the_same_answer)
{
    dk_gpu_list_t a, b;
    dk_gpu_discover(&a);
    dk_gpu_discover(&b);
    cr_assert_eq(a.count, b.count);
    cr_assert_str_eq(a.why_none, b.why_none);
}

Test(discover, cuda_visible_devices_without_a_driver_does_not_crash)
{
    if (has_nvidia_driver())
        cr_skip_test("this machine has an NVIDIA driver");
    const char *values[] = {"0,1", "", "-1", "GPU-0123abcd", "0, 3,junk,,", "NoDevFiles", NULL};
    for (int i = 0; values[i]; i++) {
        cr_assert_eq(setenv("CUDA_VISIBLE_DEVICES", values[i], 1), 0);
        dk_gpu_list_t list;
        dk_gpu_discover(&list);
        cr_assert_eq(list.count, 0, "CUDA_VISIBLE_DEVICES=%s", values[i]);
        cr_assert_not_null(strstr(list.why_none, "driver"), "CUDA_VISIBLE_DEVICES=%s: %s",
                           values[i], list.why_none);
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
}

Test(discover, a_very_long_cuda_visible_devices_does_not_crash)
{
    char value[4096];
    size_t n = 0;
    while (n + 4 < sizeof value)
        n += (size_t)snprintf(value + n, sizeof value - n, "%zu,", n % 10);
    cr_assert_eq(setenv("CUDA_VISIBLE_DEVICES", value, 1), 0);
    dk_gpu_list_t list;
    dk_gpu_discover(&list);
    cr_assert_leq(list.count, DK_GPU_MAX);
    unsetenv("CUDA_VISIBLE_DEVICES");
}

Test(discover, process_memory_without_a_driver_is_zero)
{
    if (has_nvidia_driver())
        cr_skip_test("this machine has an NVIDIA driver");
    cr_assert_eq(dk_gpu_process_memory(0, 1), 0ULL);
    cr_assert_eq(dk_gpu_process_memory(-1, -1), 0ULL);
}
