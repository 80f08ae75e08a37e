/*
 * The NCCL preflight check (runtime/gpu/dk_nccl.h) without a GPU: the bandwidth
 * arithmetic against nccl-tests' figures, the message sizes, the verdict on
 * synthetic results (a failed GPU, a wrong result, a slow or failed link, a
 * slow GPU), the report as JSON and as a text table, and the no-driver path
 * of the real loader and of distkernel-check on this machine, which has no
 * NVIDIA driver; then the real distkernel-check on a model of a node, with the
 * fake NVML, CUDA runtime and NCCL of fake_cuda.c, faults injected. The GPU
 * path itself is checked by tests/device/gpu_check.sh.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dk_nccl.h"

#define GiB (1ULL << 30)
#define MiB (1ULL << 20)

/* ---- synthetic results ---- */

/* A result as a healthy node of N GPUs named NAME would give: every size up to
 * MAX timed at BUSBW GB/s (small sizes slower, as latency dominates), every
 * result right, and, with 3 or more GPUs, every pair at PAIR_BUSBW. */
static dk_nccl_result_t *healthy_node(int n, const char *name, size_t max, double busbw,
                                      double pair_busbw)
{
    dk_nccl_result_t *r = calloc(1, sizeof *r);
    cr_assert_not_null(r);
    r->available = 1;
    r->nccl_version = 22809;
    r->cuda_runtime_version = 13000;
    r->cuda_driver_version = 13000;
    r->warmup = 5;
    r->iters = 20;
    r->ngpus = n;
    r->nranks = n;
    for (int i = 0; i < n; i++) {
        dk_nccl_gpu_t *g = &r->gpus[i];
        g->index = i;
        snprintf(g->name, sizeof g->name, "%s", name);
        g->mem_total = 150754820096ULL;
        g->mem_used = 1ULL << 29;
        g->mem_free = g->mem_total - g->mem_used;
        g->healthy = 1;
        g->in_run = 1;
        g->result = 1;
        g->want = g->got = n * (n + 1) / 2.0;
    }
    size_t sizes[DK_NCCL_MAX_SIZES];
    r->npoints = dk_nccl_sizes(max, sizes, DK_NCCL_MAX_SIZES);
    for (int i = 0; i < r->npoints; i++) {
        dk_nccl_point_t *p = &r->points[i];
        p->bytes = sizes[i];
        /* Latency 20 us plus the bytes at full speed. */
        double factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
        p->seconds = 20e-6 + (double)sizes[i] * factor / (busbw * 1e9);
        p->algbw = dk_nccl_algbw(sizes[i], p->seconds);
        p->busbw = dk_nccl_busbw(sizes[i], p->seconds, n);
    }
    if (n >= 3)
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++) {
                dk_nccl_pair_t *p = &r->pairs[r->npairs++];
                p->a = a;
                p->b = b;
                p->bytes = DK_NCCL_PAIR_BYTES;
                p->busbw = pair_busbw;
                p->seconds = (double)p->bytes / (pair_busbw * 1e9);
            }
    r->wall_seconds = 12.5;
    return r;
}

static dk_nccl_pair_t *pair(dk_nccl_result_t *r, int a, int b)
{
    for (int i = 0; i < r->npairs; i++)
        if (r->pairs[i].a == a && r->pairs[i].b == b)
            return &r->pairs[i];
    cr_assert_fail("no pair %d-%d", a, b);
    return NULL;
}

static dk_nccl_verdict_t verdict_of(const dk_nccl_result_t *r, char *summary)
{
    return dk_nccl_verdict(r, summary, 1000);
}

#define assert_has(haystack, needle) \
    cr_assert_not_null(strstr(haystack, needle), "\"%s\" not in:\n%s", needle, haystack)
#define assert_near(a, b, tol) \
    cr_assert(fabs((a) - (b)) <= (tol), "%s = %.9g, want %.9g", #a, (double)(a), (double)(b))

/* ---- bandwidth arithmetic ---- */

Test(bandwidth, one_gib_in_10_ms_on_8_gpus_is_107_algbw_and_188_busbw)
{
    /* nccl-tests: algbw = 1073741824 B / 1e9 / 0.010 s; busbw = algbw * 2*7/8. */
    assert_near(dk_nccl_algbw(GiB, 0.010), 107.3741824, 1e-9);
    assert_near(dk_nccl_busbw(GiB, 0.010, 8), 187.9048192, 1e-9);
}

Test(bandwidth, matches_an_nccl_tests_all_reduce_line)
{
    /* all_reduce_perf -g 8: 134217728 bytes, 33554432 floats, 1093.1 us,
     * which nccl-tests prints as algbw 122.79 and busbw 214.88. */
    assert_near(dk_nccl_algbw(134217728, 1093.1e-6), 122.79, 0.005);
    assert_near(dk_nccl_busbw(134217728, 1093.1e-6, 8), 214.88, 0.005);
}

Test(bandwidth, two_gpus_have_busbw_equal_to_algbw)
{
    assert_near(dk_nccl_busbw(256 * MiB, 0.001, 2), dk_nccl_algbw(256 * MiB, 0.001), 1e-12);
}

Test(bandwidth, one_gpu_has_busbw_zero_by_the_formula)
{
    cr_assert_eq(dk_nccl_busbw(GiB, 0.0005, 1), 0.0);
    cr_assert_gt(dk_nccl_algbw(GiB, 0.0005), 2000.0);
}

Test(bandwidth, four_gpus_scale_by_one_and_a_half)
{
    assert_near(dk_nccl_busbw(1000000000, 1.0, 4), 1.5, 1e-12);
}

Test(bandwidth, no_time_gives_no_bandwidth)
{
    cr_assert_eq(dk_nccl_algbw(GiB, 0.0), 0.0);
    cr_assert_eq(dk_nccl_busbw(GiB, -1.0, 8), 0.0);
    cr_assert_eq(dk_nccl_busbw(GiB, 1.0, 0), 0.0);
}

/* ---- message sizes ---- */

Test(sizes, go_from_8_bytes_doubling_to_1_gib)
{
    size_t s[DK_NCCL_MAX_SIZES];
    int n = dk_nccl_sizes(GiB, s, DK_NCCL_MAX_SIZES);
    cr_assert_eq(n, 28, "2^3 .. 2^30 is 28 sizes, got %d", n);
    cr_assert_eq(s[0], 8);
    cr_assert_eq(s[n - 1], GiB);
    for (int i = 1; i < n; i++)
        cr_assert_eq(s[i], 2 * s[i - 1]);
}

Test(sizes, stop_at_the_largest_doubling_under_the_maximum)
{
    size_t s[DK_NCCL_MAX_SIZES];
    int n = dk_nccl_sizes(1000, s, DK_NCCL_MAX_SIZES);
    cr_assert_eq(n, 7);
    cr_assert_eq(s[n - 1], 512);
}

Test(sizes, are_whole_floats)
{
    size_t s[DK_NCCL_MAX_SIZES];
    int n = dk_nccl_sizes(4 * GiB, s, DK_NCCL_MAX_SIZES);
    for (int i = 0; i < n; i++)
        cr_assert_eq(s[i] % sizeof(float), 0);
}

Test(sizes, none_below_8_bytes_and_never_past_the_array)
{
    size_t s[4];
    cr_assert_eq(dk_nccl_sizes(7, s, 4), 0);
    cr_assert_eq(dk_nccl_sizes(GiB, s, 4), 4);
    cr_assert_eq(s[3], 64);
}

Test(sizes, are_capped_by_a_third_of_the_least_free_memory)
{
    unsigned long long free_b[] = {80 * GiB, 2 * GiB, 40 * GiB};
    size_t cap = dk_nccl_cap_bytes(GiB, free_b, 3);
    cr_assert_eq(cap, (size_t)(2 * GiB / 3));
    size_t s[DK_NCCL_MAX_SIZES];
    int n = dk_nccl_sizes(cap, s, DK_NCCL_MAX_SIZES);
    cr_assert_eq(s[n - 1], 512 * MiB);
    unsigned long long plenty[] = {140 * GiB};
    cr_assert_eq(dk_nccl_cap_bytes(GiB, plenty, 1), GiB);
}

/* ---- verdict ---- */

Test(verdict, a_healthy_node_is_ok)
{
    dk_nccl_result_t *r = healthy_node(8, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_OK, "%s", s);
    assert_has(s, "across 8 GPUs ok");
    assert_has(s, "at 1 GiB");
    free(r);
}

Test(verdict, a_gpu_that_fails_its_health_check_is_named)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA A100-SXM4-80GB", GiB, 200, 230);
    r->gpus[3].healthy = 0;
    r->gpus[3].in_run = 0;
    snprintf(r->gpus[3].error, sizeof r->gpus[3].error,
             "cannot allocate 1 MiB: out of memory (CUDA error 2)");
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_FAILED);
    assert_has(s, "GPU 3 (NVIDIA A100-SXM4-80GB) failed its health check");
    assert_has(s, "out of memory");
    free(r);
}

Test(verdict, a_wrong_all_reduce_result_names_the_gpu)
{
    dk_nccl_result_t *r = healthy_node(2, "NVIDIA H200", GiB, 300, 0);
    r->gpus[1].result = 0;
    r->gpus[1].got = 2;
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_FAILED);
    assert_has(s, "GPU 1 (NVIDIA H200) returned a wrong all-reduce result: 2 where 3 was expected");
    free(r);
}

Test(verdict, a_failed_all_reduce_names_the_gpus_in_it)
{
    dk_nccl_result_t *r = healthy_node(2, "NVIDIA L4", GiB, 20, 0);
    r->npoints = 3;
    snprintf(r->run_error, sizeof r->run_error, "at 64 bytes: all-reduce: unhandled system error");
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_FAILED);
    assert_has(s, "the all-reduce across GPUs 0, 1 failed: at 64 bytes");
    free(r);
}

Test(verdict, a_slow_link_is_named)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    pair(r, 1, 2)->busbw = 150;
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_SLOW);
    assert_has(s, "the link between GPU 1 and GPU 2 is slow: 150.0 GB/s bus bandwidth at 256 MiB");
    assert_has(s, "best pair 370.0 GB/s");
    free(r);
}

Test(verdict, a_gpu_whose_every_pair_is_slow_is_named_instead_of_its_links)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    pair(r, 0, 2)->busbw = 100;
    pair(r, 1, 2)->busbw = 110;
    pair(r, 2, 3)->busbw = 105;
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_SLOW);
    assert_has(s, "GPU 2 (NVIDIA H100 80GB HBM3) is slow: its pairs reach 100.0-110.0 GB/s");
    cr_assert_null(strstr(s, "more problem"), "only GPU 2 is named: %s", s);
    free(r);
}

Test(verdict, the_slow_threshold_is_three_quarters_of_the_best_pair)
{
    dk_nccl_result_t *r = healthy_node(3, "NVIDIA A10G", GiB, 20, 40);
    pair(r, 0, 1)->busbw = 40 * DK_NCCL_SLOW_FRACTION;
    cr_assert_eq(verdict_of(r, NULL), DK_NCCL_OK);
    pair(r, 0, 1)->busbw = 40 * DK_NCCL_SLOW_FRACTION - 0.01;
    cr_assert_eq(verdict_of(r, NULL), DK_NCCL_SLOW);
    free(r);
}

Test(verdict, a_failed_link_is_named)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    dk_nccl_pair_t *p = pair(r, 0, 3);
    p->busbw = 0;
    snprintf(p->error, sizeof p->error, "NCCL could not start: remote process exited");
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_FAILED);
    assert_has(s, "the link between GPU 0 and GPU 3 failed: NCCL could not start");
    free(r);
}

Test(verdict, a_gpu_that_fails_every_pair_is_named)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    snprintf(r->run_error, sizeof r->run_error, "NCCL could not start: internal error");
    r->npoints = 0;
    for (int other = 0; other < 4; other++) {
        if (other == 1)
            continue;
        dk_nccl_pair_t *p = other < 1 ? pair(r, other, 1) : pair(r, 1, other);
        p->busbw = 0;
        snprintf(p->error, sizeof p->error, "NCCL could not start: internal error");
    }
    json_t *j = dk_nccl_report_json(r);
    json_t *problems = json_object_get(j, "problems");
    cr_assert_eq(json_array_size(problems), 2, "the all-reduce, then GPU 1: %s",
                 json_dumps(problems, 0));
    json_t *second = json_array_get(problems, 1);
    cr_assert_str_eq(json_string_value(json_object_get(second, "kind")), "gpu_failed");
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(second, "gpus"), 0)), 1);
    assert_has(json_string_value(json_object_get(second, "message")),
               "GPU 1 (NVIDIA H100 80GB HBM3) fails every all-reduce it takes part in");
    json_decref(j);
    free(r);
}

Test(verdict, every_pair_failing_is_one_problem_not_a_list_of_links)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    for (int i = 0; i < r->npairs; i++)
        snprintf(r->pairs[i].error, sizeof r->pairs[i].error, "unhandled cuda error");
    json_t *j = dk_nccl_report_json(r);
    json_t *problems = json_object_get(j, "problems");
    cr_assert_eq(json_array_size(problems), 1);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(problems, 0), "kind")),
                     "pairs_failed");
    json_decref(j);
    free(r);
}

Test(verdict, bandwidth_falling_at_the_largest_size_is_slow)
{
    dk_nccl_result_t *r = healthy_node(8, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    dk_nccl_point_t *last = &r->points[r->npoints - 1];
    last->seconds *= 4;
    last->algbw = dk_nccl_algbw(last->bytes, last->seconds);
    last->busbw = dk_nccl_busbw(last->bytes, last->seconds, 8);
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_SLOW);
    assert_has(s, "bus bandwidth falls at the largest size");
    assert_has(s, "at 1 GiB against");
    free(r);
}

Test(verdict, several_problems_are_counted_in_the_summary)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    r->gpus[0].healthy = 0;
    r->gpus[2].healthy = 0;
    pair(r, 1, 3)->busbw = 10;
    char s[1000];
    cr_assert_eq(verdict_of(r, s), DK_NCCL_FAILED, "failure outranks slowness");
    assert_has(s, "GPU 0 (");
    assert_has(s, "(and 2 more problems)");
    free(r);
}

Test(verdict, nothing_to_check_is_unavailable_with_the_reason)
{
    dk_nccl_result_t r = {.available = 0};
    snprintf(r.reason, sizeof r.reason, "no NVIDIA driver on this machine");
    char s[1000];
    cr_assert_eq(verdict_of(&r, s), DK_NCCL_UNAVAILABLE);
    cr_assert_str_eq(s, "no NVIDIA driver on this machine");
    cr_assert_str_eq(dk_nccl_verdict_name(DK_NCCL_UNAVAILABLE), "unavailable");
}

/* ---- the report ---- */

Test(report, json_has_the_documented_shape)
{
    dk_nccl_result_t *r = healthy_node(8, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    json_t *j = dk_nccl_report_json(r);
    cr_assert_not_null(j);
    cr_assert(json_is_true(json_object_get(j, "ok")));
    cr_assert_str_eq(json_string_value(json_object_get(j, "verdict")), "ok");
    cr_assert_str_eq(json_string_value(json_object_get(j, "nccl_version")), "2.28.9");
    cr_assert_str_eq(json_string_value(json_object_get(j, "cuda_runtime_version")), "13.0");
    cr_assert(json_is_true(json_object_get(j, "in_place")));
    cr_assert_eq(json_integer_value(json_object_get(j, "nranks")), 8);
    cr_assert_eq(json_integer_value(json_object_get(j, "iters")), 20);
    cr_assert_eq(json_array_size(json_object_get(j, "problems")), 0);
    cr_assert(json_is_string(json_object_get(j, "summary")));
    cr_assert(json_is_string(json_object_get(j, "note")));

    json_t *gpus = json_object_get(j, "gpus");
    cr_assert_eq(json_array_size(gpus), 8);
    json_t *g = json_array_get(gpus, 7);
    cr_assert_eq(json_integer_value(json_object_get(g, "index")), 7);
    cr_assert_str_eq(json_string_value(json_object_get(g, "name")), "NVIDIA H100 80GB HBM3");
    cr_assert_eq(json_integer_value(json_object_get(g, "memory_total")), 150754820096LL);
    cr_assert_eq(json_integer_value(json_object_get(g, "memory_used")), 1LL << 29);
    cr_assert(json_is_true(json_object_get(g, "healthy")));
    cr_assert(json_is_null(json_object_get(g, "error")));
    cr_assert_str_eq(json_string_value(json_object_get(g, "result")), "right");

    json_t *sizes = json_object_get(j, "sizes");
    cr_assert_eq(json_array_size(sizes), 28);
    json_t *last = json_array_get(sizes, 27);
    cr_assert_eq(json_integer_value(json_object_get(last, "bytes")), (json_int_t)GiB);
    cr_assert_eq(json_integer_value(json_object_get(last, "count")), (json_int_t)(GiB / 4));
    const dk_nccl_point_t *p = &r->points[27];
    assert_near(json_real_value(json_object_get(last, "time_us")), p->seconds * 1e6, 0.005);
    assert_near(json_real_value(json_object_get(last, "algbw_gbs")), p->algbw, 0.0005);
    assert_near(json_real_value(json_object_get(last, "busbw_gbs")), p->busbw, 0.0005);

    json_t *pairs = json_object_get(j, "pairs");
    cr_assert_eq(json_array_size(pairs), 28, "8 GPUs make 28 pairs");
    json_t *p0 = json_array_get(pairs, 0);
    cr_assert_eq(json_integer_value(json_array_get(json_object_get(p0, "gpus"), 1)), 1);
    cr_assert(json_is_null(json_object_get(p0, "error")));
    json_decref(j);
    free(r);
}

Test(report, problems_name_their_kind_severity_and_gpus)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    pair(r, 1, 2)->busbw = 150;
    json_t *j = dk_nccl_report_json(r);
    cr_assert(json_is_false(json_object_get(j, "ok")), "slow is not ok");
    cr_assert_str_eq(json_string_value(json_object_get(j, "verdict")), "slow");
    json_t *p = json_array_get(json_object_get(j, "problems"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(p, "kind")), "slow_link");
    cr_assert_str_eq(json_string_value(json_object_get(p, "severity")), "slow");
    json_t *gpus = json_object_get(p, "gpus");
    cr_assert_eq(json_array_size(gpus), 2);
    cr_assert_eq(json_integer_value(json_array_get(gpus, 0)), 1);
    cr_assert_eq(json_integer_value(json_array_get(gpus, 1)), 2);
    json_decref(j);
    free(r);
}

Test(report, one_gpu_says_busbw_is_zero_and_to_compare_algbw)
{
    dk_nccl_result_t *r = healthy_node(1, "NVIDIA H200", GiB, 2000, 0);
    json_t *j = dk_nccl_report_json(r);
    assert_has(json_string_value(json_object_get(j, "note")), "with one GPU that is 0");
    assert_has(json_string_value(json_object_get(j, "summary")),
               "all-reduce on 1 GPU ok");
    assert_has(json_string_value(json_object_get(j, "summary")), "algorithm bandwidth at 1 GiB");
    json_t *last = json_array_get(json_object_get(j, "sizes"), 27);
    cr_assert_eq(json_real_value(json_object_get(last, "busbw_gbs")), 0.0);
    cr_assert_eq(json_array_size(json_object_get(j, "pairs")), 0);
    json_decref(j);
    free(r);
}

Test(report, unavailable_is_one_json_object_with_the_reason)
{
    dk_nccl_result_t r = {.available = 0};
    snprintf(r.reason, sizeof r.reason, "no NVIDIA driver on this machine");
    json_t *j = dk_nccl_report_json(&r);
    cr_assert(json_is_false(json_object_get(j, "ok")));
    cr_assert_str_eq(json_string_value(json_object_get(j, "verdict")), "unavailable");
    cr_assert_str_eq(json_string_value(json_object_get(j, "reason")),
                     "no NVIDIA driver on this machine");
    cr_assert_eq(json_object_size(j), 3);
    char *text = dk_nccl_report_text(j);
    cr_assert_str_eq(text, "NCCL check: no NVIDIA driver on this machine\n");
    free(text);
    json_decref(j);
}

Test(report, text_table_has_nccl_tests_columns_and_the_verdict)
{
    dk_nccl_result_t *r = healthy_node(8, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    /* The largest size exactly as in the arithmetic test: 1 GiB in 10 ms. */
    dk_nccl_point_t *last = &r->points[r->npoints - 1];
    last->seconds = 0.010;
    last->algbw = dk_nccl_algbw(GiB, 0.010);
    last->busbw = dk_nccl_busbw(GiB, 0.010, 8);
    json_t *j = dk_nccl_report_json(r);
    char *t = dk_nccl_report_text(j);
    cr_assert_not_null(t);
    assert_has(t, "NCCL check: all_reduce float32 sum on 8 GPUs (NCCL 2.28.9, CUDA runtime 13.0");
    assert_has(t, "in place, 5 warm-up + 20 timed per size, 12.5 s in all");
    assert_has(t, "size        count    time (us)  algbw (GB/s)  busbw (GB/s)");
    assert_has(t, "       8 B            2");
    assert_has(t, "     1 GiB    268435456     10000.00        107.37        187.90\n");
    assert_has(t, "    7  NVIDIA H100 80GB HBM3");
    assert_has(t, "512 MiB / 140.4 GiB  ok");
    assert_has(t, "pairs of GPUs alone, at 256 MiB");
    assert_has(t, "     0 - 1        370.00");
    assert_has(t, "verdict: ok: all-reduce across 8 GPUs ok: 187.9 GB/s bus bandwidth at 1 GiB");
    free(t);
    json_decref(j);
    free(r);
}

Test(report, text_lists_every_problem_and_marks_the_failed_gpu)
{
    dk_nccl_result_t *r = healthy_node(4, "NVIDIA H100 80GB HBM3", GiB, 360, 370);
    r->gpus[2].healthy = 0;
    snprintf(r->gpus[2].error, sizeof r->gpus[2].error, "cannot select it: ECC error");
    pair(r, 0, 1)->busbw = 12;
    json_t *j = dk_nccl_report_json(r);
    char *t = dk_nccl_report_text(j);
    assert_has(t, "cannot select it: ECC error\n");
    assert_has(t, "verdict: failed: GPU 2 (NVIDIA H100 80GB HBM3) failed its health check");
    assert_has(t, "  - the link between GPU 0 and GPU 1 is slow");
    free(t);
    json_decref(j);
    free(r);
}

Test(report, text_of_something_that_is_not_a_report_is_null)
{
    json_t *a = json_array();
    cr_assert_null(dk_nccl_report_text(a));
    cr_assert_null(dk_nccl_report_text(NULL));
    json_decref(a);
}

/* ---- the real loader on this machine (no NVIDIA driver) ---- */

Test(no_driver, the_check_reports_no_nvidia_driver_in_one_line)
{
    dk_nccl_result_t *r = calloc(1, sizeof *r);
    dk_nccl_run(NULL, r);
    cr_assert_eq(r->available, 0, "this machine has no GPU, yet the check ran");
    assert_has(r->reason, "no NVIDIA driver");
    cr_assert_null(strchr(r->reason, '\n'));
    cr_assert_eq(dk_nccl_verdict(r, NULL, 0), DK_NCCL_UNAVAILABLE);
    free(r);
}

Test(no_driver, the_cuda_runtime_loader_says_why_it_sees_no_gpu)
{
    char why[400] = "";
    int n = dk_nccl_cuda_device_count(why, sizeof why);
    cr_assert_eq(n, -1, "no GPU here, but CUDA counted %d", n);
    cr_assert(strstr(why, "libcudart not found") || strstr(why, "no usable NVIDIA driver") ||
                  strstr(why, "sees no GPU"),
              "unexpected reason: %s", why);
    /* Asking again gives the same answer without loading again. */
    char again[400] = "";
    cr_assert_eq(dk_nccl_cuda_device_count(again, sizeof again), -1);
    cr_assert_str_eq(why, again);
}

Test(no_driver, a_cuda_runtime_that_is_not_there_is_named)
{
    setenv("DISTKERNEL_CUDART_LIB", "/nonexistent/libcudart.so.13", 1);
    char why[400] = "";
    cr_assert_eq(dk_nccl_cuda_device_count(why, sizeof why), -1);
    /* Found elsewhere (this machine has CUDA 13 installed) or not at all. */
    cr_assert(strstr(why, "/nonexistent/libcudart.so.13") || strstr(why, "NVIDIA driver") ||
                  strstr(why, "sees no GPU"),
              "unexpected reason: %s", why);
}

Test(no_driver, nccl_loads_or_says_it_is_missing)
{
    char why[400] = "";
    int v = dk_nccl_library_version(why, sizeof why);
    if (v < 0)
        assert_has(why, "NCCL not found");
    else
        cr_assert_geq(v, 20000, "NCCL version code %d", v);
}

/* distkernel-check itself, as the kernel starts it, with ENV ("A=1 B=2") in
 * its environment. Returns its exit status; OUT holds its stdout. */
static int run_check_env(const char *env, const char *args, char *out, size_t len)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "env %s '%s' %s 2>/dev/null", env, CHECK_EXE, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, len - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static int run_check(const char *args, char *out, size_t len)
{
    return run_check_env("", args, out, len);
}

Test(no_driver, distkernel_check_prints_one_json_line_and_exits_0)
{
    char out[4096];
    cr_assert_eq(run_check("--json", out, sizeof out), 0);
    char *nl = strchr(out, '\n');
    cr_assert(nl && nl[1] == '\0', "one line: %s", out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, out);
    cr_assert(json_is_false(json_object_get(j, "ok")));
    assert_has(json_string_value(json_object_get(j, "reason")), "no NVIDIA driver");
    json_decref(j);
}

Test(no_driver, distkernel_check_prints_one_text_line_and_exits_0)
{
    char out[4096];
    cr_assert_eq(run_check("--max-bytes 64M --iters 3", out, sizeof out), 0);
    cr_assert(strncmp(out, "NCCL check: no NVIDIA driver", 28) == 0, "got: %s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
}

Test(no_driver, distkernel_check_rejects_bad_arguments_with_status_2)
{
    char out[4096];
    cr_assert_eq(run_check("--iters 0", out, sizeof out), 2);
    cr_assert_eq(run_check("--max-bytes lots", out, sizeof out), 2);
    cr_assert_eq(run_check("--max-bytes 4", out, sizeof out), 2);
    cr_assert_eq(run_check("--frobnicate", out, sizeof out), 2);
    cr_assert_eq(run_check("--timeout", out, sizeof out), 2);
    cr_assert_str_eq(out, "", "nothing on stdout for a usage error");
}

/* ---- the real check on a model of a node (tests/unit/fake_cuda.c) ---- */

/* Sizes up to 1 MiB: the model's 50 MB/s links take 21 ms for that, far
 * above the timer's and the scheduler's noise. */
#define FAKE_ARGS "--json --max-bytes 1M --warmup 0 --iters 2"

/* FAKE_CUDA_DIR, holding the names the loaders look for (libnvidia-ml.so.1,
 * libcudart.so.13, libnccl.so.2), each a link to its fake. Tests run in
 * parallel, so a link another made first is fine. */
static const char *fake_cuda_dir(void)
{
    static const char *links[][2] = {{"libnvidia-ml.so.1", FAKE_NVML},
                                     {"libcudart.so.13", FAKE_CUDART},
                                     {"libnccl.so.2", FAKE_NCCL}};
    mkdir(FAKE_CUDA_DIR, 0755);
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", FAKE_CUDA_DIR, links[i][0]);
        if (symlink(links[i][1], path) != 0)
            cr_assert_eq(errno, EEXIST, "cannot link %s: %s", path, strerror(errno));
    }
    return FAKE_CUDA_DIR;
}

/* Run distkernel-check --json against the fake libraries with FAULTS in the
 * environment; returns the parsed report and its exit status in *RC. */
static json_t *fake_check(const char *faults, const char *args, int *rc)
{
    static char out[1 << 20];
    char env[512];
    snprintf(env, sizeof env, "LD_LIBRARY_PATH='%s' %s", fake_cuda_dir(), faults);
    *rc = run_check_env(env, args, out, sizeof out);
    char *nl = strchr(out, '\n');
    cr_assert(nl && nl[1] == '\0', "stdout must be the report alone, on one line:\n%s", out);
    json_error_t e;
    json_t *j = json_loads(out, 0, &e);
    cr_assert_not_null(j, "not JSON (%s): %s", e.text, out);
    return j;
}

static const char *jstring(const json_t *j, const char *key)
{
    const char *s = json_string_value(json_object_get(j, key));
    cr_assert_not_null(s, "no \"%s\" string in %s", key, json_dumps(j, 0));
    return s;
}

/* The first problem's kind and the GPUs it names, as "slow_link 1 2". */
static const char *first_problem(const json_t *j)
{
    static char buf[200];
    const json_t *p = json_array_get(json_object_get(j, "problems"), 0);
    cr_assert_not_null(p, "no problem in %s", json_dumps(j, 0));
    size_t used = (size_t)snprintf(buf, sizeof buf, "%s", jstring(p, "kind"));
    size_t i;
    const json_t *g;
    json_array_foreach(json_object_get(p, "gpus"), i, g) used +=
        (size_t)snprintf(buf + used, sizeof buf - used, " %d", (int)json_integer_value(g));
    return buf;
}

Test(fake_node, two_healthy_gpus_pass_with_every_size_timed)
{
    int rc;
    json_t *j = fake_check("FAKE_GPUS=2", FAKE_ARGS, &rc);
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(jstring(j, "verdict"), "ok", "%s", jstring(j, "summary"));
    cr_assert(json_is_true(json_object_get(j, "ok")));
    cr_assert_eq(json_integer_value(json_object_get(j, "nranks")), 2);
    cr_assert_str_eq(jstring(j, "nccl_version"), "2.28.9");
    json_t *sizes = json_object_get(j, "sizes");
    cr_assert_eq(json_array_size(sizes), 18, "8 B .. 1 MiB");
    json_t *last = json_array_get(sizes, 17);
    cr_assert_eq(json_integer_value(json_object_get(last, "bytes")), 1 << 20);
    /* 2 ranks: busbw == algbw, and the model's 50 MB/s links give at most that. */
    double alg = json_number_value(json_object_get(last, "algbw_gbs"));
    double bus = json_number_value(json_object_get(last, "busbw_gbs"));
    assert_near(bus, alg, 1e-9);
    cr_assert(bus > 0.02 && bus <= 0.0505, "busbw %.4f GB/s on a 0.05 GB/s model", bus);
    json_t *g = json_array_get(json_object_get(j, "gpus"), 1);
    cr_assert_str_eq(jstring(g, "name"), "NVIDIA H100 80GB HBM3");
    cr_assert_str_eq(jstring(g, "result"), "right");
    cr_assert_eq(json_integer_value(json_object_get(g, "memory_total")), 85520809984LL);
    cr_assert_eq(json_array_size(json_object_get(j, "pairs")), 0, "no pairs with 2 GPUs");
    json_decref(j);
}

Test(fake_node, one_gpu_reports_algbw_and_a_zero_busbw)
{
    int rc;
    json_t *j = fake_check("FAKE_GPUS=1", FAKE_ARGS, &rc);
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(jstring(j, "verdict"), "ok", "%s", jstring(j, "summary"));
    json_t *last = json_array_get(json_object_get(j, "sizes"), 17);
    cr_assert_eq(json_number_value(json_object_get(last, "busbw_gbs")), 0.0);
    cr_assert_gt(json_number_value(json_object_get(last, "algbw_gbs")), 0.0);
    assert_has(jstring(j, "summary"), "all-reduce on 1 GPU ok");
    json_decref(j);
}

Test(fake_node, a_gpu_that_cannot_allocate_fails_the_check_by_name)
{
    int rc;
    json_t *j = fake_check("FAKE_GPUS=3 FAKE_BROKEN_GPU=1", FAKE_ARGS, &rc);
    cr_assert_eq(rc, 1, "a failed GPU is a non-zero exit");
    cr_assert_str_eq(jstring(j, "verdict"), "failed");
    cr_assert_str_eq(first_problem(j), "gpu_failed 1");
    assert_has(jstring(j, "summary"), "GPU 1 (NVIDIA H100 80GB HBM3) failed its health check: "
                                      "cannot allocate 1 MiB: out of memory");
    cr_assert_eq(json_integer_value(json_object_get(j, "nranks")), 2, "the others still run");
    json_decref(j);
}

Test(fake_node, a_wrong_result_fails_the_check_by_name)
{
    int rc;
    json_t *j = fake_check("FAKE_GPUS=2 FAKE_WRONG_GPU=0", FAKE_ARGS, &rc);
    cr_assert_eq(rc, 1);
    cr_assert_str_eq(first_problem(j), "wrong_result 0");
    assert_has(jstring(j, "summary"), "4 where 3 was expected");
    json_decref(j);
}

Test(fake_node, a_slow_link_is_found_by_timing_the_pairs)
{
    int rc;
    json_t *j = fake_check("FAKE_GPUS=4 FAKE_SLOW_PAIR=1,2", FAKE_ARGS, &rc);
    cr_assert_eq(rc, 0, "slow is not a failure");
    cr_assert_str_eq(jstring(j, "verdict"), "slow", "%s", jstring(j, "summary"));
    cr_assert_str_eq(first_problem(j), "slow_link 1 2");
    cr_assert_eq(json_array_size(json_object_get(j, "problems")), 1, "%s", jstring(j, "summary"));
    cr_assert_eq(json_array_size(json_object_get(j, "pairs")), 6, "4 GPUs make 6 pairs");
    json_decref(j);
}

Test(fake_node, a_slow_gpu_is_named_rather_than_its_links)
{
    int rc;
    json_t *j = fake_check("FAKE_GPUS=4 FAKE_SLOW_GPU=3", FAKE_ARGS, &rc);
    cr_assert_eq(rc, 0);
    cr_assert_str_eq(first_problem(j), "slow_gpu 3", "%s", jstring(j, "summary"));
    cr_assert_eq(json_array_size(json_object_get(j, "problems")), 1, "%s", jstring(j, "summary"));
    json_decref(j);
}

Test(fake_node, a_link_that_cannot_start_fails_the_check_by_name)
{
    int rc;
    json_t *j = fake_check("FAKE_GPUS=4 FAKE_FAIL_PAIR=0,3", FAKE_ARGS, &rc);
    cr_assert_eq(rc, 1);
    cr_assert_str_eq(first_problem(j), "link_failed 0 3", "%s", jstring(j, "summary"));
    assert_has(jstring(j, "summary"), "unhandled system error (fake)");
    json_decref(j);
}

Test(fake_node, a_hung_all_reduce_is_reported_by_the_watchdog)
{
    int rc;
    json_t *j = fake_check("FAKE_GPUS=2 FAKE_HANG=1", "--json --max-bytes 1M --timeout 1", &rc);
    cr_assert_eq(rc, 3);
    cr_assert_str_eq(jstring(j, "verdict"), "failed");
    cr_assert(json_is_false(json_object_get(j, "ok")));
    assert_has(jstring(j, "summary"), "did not finish within 1 s");
    assert_has(jstring(j, "summary"), "checking the all-reduce result across GPUs 0-1");
    json_decref(j);
}

Test(fake_node, the_text_table_is_printed_without_json)
{
    char out[1 << 16], env[512];
    snprintf(env, sizeof env, "LD_LIBRARY_PATH='%s' FAKE_GPUS=2", fake_cuda_dir());
    cr_assert_eq(run_check_env(env, "--max-bytes 64K --iters 2 --warmup 0", out, sizeof out), 0);
    assert_has(out, "NCCL check: all_reduce float32 sum on 2 GPUs (NCCL 2.28.9, CUDA runtime "
                    "13.0, driver 13.0), in place, 0 warm-up + 2 timed per size");
    assert_has(out, "    64 KiB        16384");
    assert_has(out, "verdict: ok: all-reduce across 2 GPUs ok");
    cr_assert_null(strstr(out, "fake NCCL INFO"), "NCCL's chatter goes to stderr");
}
