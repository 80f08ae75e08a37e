/*
 * dk_nccl_report: the part of the NCCL check that needs no GPU. The bandwidth
 * arithmetic, the message sizes, the verdict, and the report as JSON (what
 * distkernel-check prints and the kernel reads) and as a text table (what a
 * person reads). See dk_nccl.h for the definitions and the thresholds.
 *
 * The verdict is a walk over the result that emits one problem per finding,
 * most serious rules first; the one-line summary is the first problem and
 * the JSON lists them all, so both always agree.
 */
#include "dk_nccl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arithmetic ---- */

double dk_nccl_algbw(size_t bytes, double seconds)
{
    return seconds > 0 ? (double)bytes / 1e9 / seconds : 0.0;
}

double dk_nccl_busbw(size_t bytes, double seconds, int nranks)
{
    if (nranks < 1)
        return 0.0;
    return dk_nccl_algbw(bytes, seconds) * 2.0 * (nranks - 1) / nranks;
}

int dk_nccl_sizes(size_t max_bytes, size_t *out, int cap)
{
    int n = 0;
    for (size_t s = DK_NCCL_MIN_BYTES; s <= max_bytes && n < cap; s *= 2) {
        out[n++] = s;
        if (s > ((size_t)-1) / 2)
            break;
    }
    return n;
}

size_t dk_nccl_cap_bytes(size_t requested, const unsigned long long *free_bytes, int n)
{
    size_t cap = requested;
    for (int i = 0; i < n; i++) {
        unsigned long long room = free_bytes[i] / DK_NCCL_FREE_MEMORY_DIVISOR;
        if (room < cap)
            cap = (size_t)room;
    }
    return cap;
}

/* ---- formatting helpers ---- */

/* "8 B", "4 KiB", "1 GiB", "1.5 GiB". */
static void fmt_bytes(double bytes, char *out, size_t len)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024 && u < 4) {
        bytes /= 1024;
        u++;
    }
    if (bytes == floor(bytes))
        snprintf(out, len, "%.0f %s", bytes, units[u]);
    else
        snprintf(out, len, "%.1f %s", bytes, units[u]);
}

/* "2.28.9" from 22809 (NCCL >= 2.9) or 2708 (older). */
static void fmt_nccl_version(int code, char *out, size_t len)
{
    if (code >= 10000)
        snprintf(out, len, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
    else
        snprintf(out, len, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

/* "13.0" from 13000. */
static void fmt_cuda_version(int code, char *out, size_t len)
{
    snprintf(out, len, "%d.%d", code / 1000, code % 1000 / 10);
}

static const char *gpu_name(const dk_nccl_result_t *r, int index)
{
    for (int i = 0; i < r->ngpus; i++)
        if (r->gpus[i].index == index && r->gpus[i].name[0])
            return r->gpus[i].name;
    return "unknown GPU";
}

/* "GPUs 0, 1, 3" for the GPUs that took part in the all-reduce. */
static void fmt_run_gpus(const dk_nccl_result_t *r, char *out, size_t len)
{
    size_t used = (size_t)snprintf(out, len, "GPU%s", r->nranks == 1 ? "" : "s");
    int first = 1;
    for (int i = 0; i < r->ngpus && used < len; i++) {
        if (!r->gpus[i].in_run)
            continue;
        used += (size_t)snprintf(out + used, len - used, "%s%d", first ? " " : ", ",
                                 r->gpus[i].index);
        first = 0;
    }
}

/* Digits after the point for GB/s in messages: 1 for real links, more for
 * the small figures of tiny sizes and slow models. */
#define GBS(x) ((x) < 1 ? 3 : 1), (x)

/* ---- the verdict ---- */

typedef void (*emit_fn)(void *ctx, dk_nccl_verdict_t severity, const char *kind, int gpu_a,
                        int gpu_b, const char *message);

/* Emit a formatted problem. gpu_a/gpu_b are -1 when not about a GPU/pair. */
static void emitf(emit_fn emit, void *ctx, dk_nccl_verdict_t severity, const char *kind,
                  int gpu_a, int gpu_b, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void emitf(emit_fn emit, void *ctx, dk_nccl_verdict_t severity, const char *kind,
                  int gpu_a, int gpu_b, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(ctx, severity, kind, gpu_a, gpu_b, msg);
}

static int pair_has(const dk_nccl_pair_t *p, int gpu)
{
    return p->a == gpu || p->b == gpu;
}

/* What makes a pair bad under one rule: it failed (FAILED), or it finished
 * below SLOW_BELOW, a fraction of the BEST pair's bus bandwidth. */
typedef struct {
    int failed;
    double best, slow_below;
} pair_rule_t;

/* Whether PP is judged under RULE at all: failed pairs are not slow ones. */
static int pair_counts(const pair_rule_t *rule, const dk_nccl_pair_t *pp)
{
    return rule->failed ? 1 : !pp->error[0];
}

static int pair_bad(const pair_rule_t *rule, const dk_nccl_pair_t *pp)
{
    return rule->failed ? pp->error[0] != 0 : (!pp->error[0] && pp->busbw < rule->slow_below);
}

/* GPU is the culprit when all its pairs are bad while some pair without it is
 * not: say so, and return 1. */
static int judge_gpu(const dk_nccl_result_t *r, const pair_rule_t *rule, int gpu, emit_fn emit,
                     void *ctx)
{
    int mine = 0, mine_bad = 0, other_good = 0;
    double lo = 0, hi = 0;
    const char *first_error = "";
    for (int p = 0; p < r->npairs; p++) {
        const dk_nccl_pair_t *pp = &r->pairs[p];
        if (!pair_counts(rule, pp))
            continue;
        if (!pair_has(pp, gpu)) {
            other_good |= !pair_bad(rule, pp);
            continue;
        }
        mine++;
        if (!pair_bad(rule, pp))
            continue;
        if (!mine_bad++) {
            lo = hi = pp->busbw;
            first_error = pp->error;
        }
        lo = pp->busbw < lo ? pp->busbw : lo;
        hi = pp->busbw > hi ? pp->busbw : hi;
    }
    if (mine == 0 || mine_bad < mine || !other_good)
        return 0;
    if (rule->failed)
        emitf(emit, ctx, DK_NCCL_FAILED, "gpu_failed", gpu, -1,
              "GPU %d (%s) fails every all-reduce it takes part in: %s", gpu, gpu_name(r, gpu),
              first_error);
    else
        emitf(emit, ctx, DK_NCCL_SLOW, "slow_gpu", gpu, -1,
              "GPU %d (%s) is slow: its pairs reach %.*f-%.*f GB/s bus bandwidth, the best "
              "pair %.*f GB/s (below %.0f%% counts as slow)",
              gpu, gpu_name(r, gpu), GBS(lo), GBS(hi), GBS(rule->best),
              DK_NCCL_SLOW_FRACTION * 100);
    return 1;
}

/* The bad pairs that no culprit GPU explains are bad links. */
static void judge_links(const dk_nccl_result_t *r, const pair_rule_t *rule, const int *culprit,
                        emit_fn emit, void *ctx)
{
    for (int p = 0; p < r->npairs; p++) {
        const dk_nccl_pair_t *pp = &r->pairs[p];
        if (!pair_counts(rule, pp) || !pair_bad(rule, pp))
            continue;
        if ((pp->a >= 0 && pp->a < DK_GPU_MAX && culprit[pp->a]) ||
            (pp->b >= 0 && pp->b < DK_GPU_MAX && culprit[pp->b]))
            continue;
        char size[32];
        fmt_bytes((double)pp->bytes, size, sizeof size);
        if (rule->failed)
            emitf(emit, ctx, DK_NCCL_FAILED, "link_failed", pp->a, pp->b,
                  "the link between GPU %d and GPU %d failed: %s", pp->a, pp->b, pp->error);
        else
            emitf(emit, ctx, DK_NCCL_SLOW, "slow_link", pp->a, pp->b,
                  "the link between GPU %d and GPU %d is slow: %.*f GB/s bus bandwidth at %s, "
                  "the best pair %.*f GB/s (below %.0f%% counts as slow)",
                  pp->a, pp->b, GBS(pp->busbw), size, GBS(rule->best),
                  DK_NCCL_SLOW_FRACTION * 100);
    }
}

/* Pairs, under the failed rule or the slow one: every pair failing is one
 * finding; otherwise culprit GPUs first, then the links they do not explain. */
static void judge_pairs(const dk_nccl_result_t *r, int failed_rule, emit_fn emit, void *ctx)
{
    pair_rule_t rule = {.failed = failed_rule};
    for (int p = 0; p < r->npairs; p++)
        if (!r->pairs[p].error[0] && r->pairs[p].busbw > rule.best)
            rule.best = r->pairs[p].busbw;
    rule.slow_below = rule.best * DK_NCCL_SLOW_FRACTION;
    int any_bad = 0, all_bad = 1, counted = 0;
    for (int p = 0; p < r->npairs; p++) {
        const dk_nccl_pair_t *pp = &r->pairs[p];
        if (!pair_counts(&rule, pp))
            continue;
        counted++;
        if (pair_bad(&rule, pp))
            any_bad = 1;
        else
            all_bad = 0;
    }
    if (!any_bad)
        return;
    if (failed_rule && all_bad && counted > 1) {
        emitf(emit, ctx, DK_NCCL_FAILED, "pairs_failed", -1, -1,
              "every pair of GPUs failed the all-reduce: %s", r->pairs[0].error);
        return;
    }
    int culprit[DK_GPU_MAX] = {0};
    for (int g = 0; g < r->ngpus; g++) {
        int gpu = r->gpus[g].index;
        if (gpu >= 0 && gpu < DK_GPU_MAX)
            culprit[gpu] = judge_gpu(r, &rule, gpu, emit, ctx);
    }
    judge_links(r, &rule, culprit, emit, ctx);
}

/* The bandwidth a size is judged by: busbw, or algbw on one GPU (busbw is 0). */
static double judged_bw(const dk_nccl_result_t *r, const dk_nccl_point_t *pt)
{
    return r->nranks > 1 ? pt->busbw : pt->algbw;
}

static void judge_falloff(const dk_nccl_result_t *r, emit_fn emit, void *ctx)
{
    if (r->run_error[0] || r->npoints < 2 ||
        r->points[r->npoints - 1].bytes < DK_NCCL_FALLOFF_MIN_BYTES)
        return;
    int best = 0;
    for (int i = 1; i < r->npoints; i++)
        if (judged_bw(r, &r->points[i]) > judged_bw(r, &r->points[best]))
            best = i;
    const dk_nccl_point_t *last = &r->points[r->npoints - 1];
    double top = judged_bw(r, &r->points[best]);
    if (judged_bw(r, last) >= top * DK_NCCL_FALLOFF_FRACTION)
        return;
    char at_last[32], at_best[32];
    fmt_bytes((double)last->bytes, at_last, sizeof at_last);
    fmt_bytes((double)r->points[best].bytes, at_best, sizeof at_best);
    const char *what = r->nranks > 1 ? "bus" : "algorithm";
    emitf(emit, ctx, DK_NCCL_SLOW, "falloff", -1, -1,
          "%s bandwidth falls at the largest size: %.*f GB/s at %s against %.*f GB/s at %s "
          "(throttling, or another process using the GPU)",
          what, GBS(judged_bw(r, last)), at_last, GBS(top), at_best);
}

static void walk_problems(const dk_nccl_result_t *r, emit_fn emit, void *ctx)
{
    for (int i = 0; i < r->ngpus; i++) {
        const dk_nccl_gpu_t *g = &r->gpus[i];
        if (!g->healthy)
            emitf(emit, ctx, DK_NCCL_FAILED, "gpu_failed", g->index, -1,
                  "GPU %d (%s) failed its health check: %s", g->index, g->name,
                  g->error[0] ? g->error : "unknown error");
    }
    for (int i = 0; i < r->ngpus; i++) {
        const dk_nccl_gpu_t *g = &r->gpus[i];
        if (g->healthy && g->in_run && g->result == 0)
            emitf(emit, ctx, DK_NCCL_FAILED, "wrong_result", g->index, -1,
                  "GPU %d (%s) returned a wrong all-reduce result: %g where %g was expected",
                  g->index, g->name, g->got, g->want);
    }
    if (r->run_error[0]) {
        char gpus[400];
        fmt_run_gpus(r, gpus, sizeof gpus);
        emitf(emit, ctx, DK_NCCL_FAILED, "allreduce_failed", -1, -1,
              "the all-reduce across %s failed: %s", gpus, r->run_error);
    }
    judge_pairs(r, 1, emit, ctx);
    judge_pairs(r, 0, emit, ctx);
    judge_falloff(r, emit, ctx);
}

typedef struct {
    dk_nccl_verdict_t worst;
    int count;
    char first[600];
} verdict_ctx_t;

static void verdict_emit(void *vctx, dk_nccl_verdict_t severity, const char *kind, int gpu_a,
                         int gpu_b, const char *message)
{
    (void)kind, (void)gpu_a, (void)gpu_b;
    verdict_ctx_t *ctx = vctx;
    if (ctx->count++ == 0)
        snprintf(ctx->first, sizeof ctx->first, "%s", message);
    if (severity > ctx->worst)
        ctx->worst = severity;
}

dk_nccl_verdict_t dk_nccl_verdict(const dk_nccl_result_t *r, char *summary, size_t len)
{
    if (!r->available) {
        if (summary && len)
            snprintf(summary, len, "%s", r->reason[0] ? r->reason : "no GPU to check");
        return DK_NCCL_UNAVAILABLE;
    }
    verdict_ctx_t ctx = {.worst = DK_NCCL_OK};
    walk_problems(r, verdict_emit, &ctx);
    if (!summary || !len)
        return ctx.worst;
    if (ctx.count > 1)
        snprintf(summary, len, "%s (and %d more problem%s)", ctx.first, ctx.count - 1,
                 ctx.count > 2 ? "s" : "");
    else if (ctx.count == 1)
        snprintf(summary, len, "%s", ctx.first);
    else if (r->npoints == 0)
        snprintf(summary, len, "%d GPU%s healthy; no all-reduce was timed", r->ngpus,
                 r->ngpus == 1 ? "" : "s");
    else {
        const dk_nccl_point_t *last = &r->points[r->npoints - 1];
        char size[32];
        fmt_bytes((double)last->bytes, size, sizeof size);
        if (r->nranks == 1)
            snprintf(summary, len,
                     "all-reduce on 1 GPU ok: %.*f GB/s algorithm bandwidth at %s "
                     "(bus bandwidth is 0 on one GPU)",
                     GBS(last->algbw), size);
        else
            snprintf(summary, len, "all-reduce across %d GPUs ok: %.*f GB/s bus bandwidth at %s",
                     r->nranks, GBS(last->busbw), size);
    }
    return ctx.worst;
}

const char *dk_nccl_verdict_name(dk_nccl_verdict_t v)
{
    switch (v) {
    case DK_NCCL_OK:
        return "ok";
    case DK_NCCL_SLOW:
        return "slow";
    case DK_NCCL_FAILED:
        return "failed";
    case DK_NCCL_UNAVAILABLE:
        break;
    }
    return "unavailable";
}

/* ---- JSON ---- */

json_t *dk_nccl_unavailable_json(const char *reason)
{
    return json_pack("{s:b, s:s, s:s}", "ok", 0, "verdict", "unavailable", "reason",
                     reason && *reason ? reason : "no GPU to check");
}

static void json_emit(void *ctx, dk_nccl_verdict_t severity, const char *kind, int gpu_a,
                      int gpu_b, const char *message)
{
    json_t *gpus = json_array();
    if (gpu_a >= 0)
        json_array_append_new(gpus, json_integer(gpu_a));
    if (gpu_b >= 0)
        json_array_append_new(gpus, json_integer(gpu_b));
    json_array_append_new((json_t *)ctx,
                          json_pack("{s:s, s:s, s:o, s:s}", "kind", kind, "severity",
                                    dk_nccl_verdict_name(severity), "gpus", gpus, "message",
                                    message));
}

/* A string, or null when S is empty. */
static json_t *string_or_null(const char *s)
{
    return s && *s ? json_string(s) : json_null();
}

static json_t *gpus_json(const dk_nccl_result_t *r)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < r->ngpus; i++) {
        const dk_nccl_gpu_t *g = &r->gpus[i];
        const char *result = g->result == 1 ? "right" : g->result == 0 ? "wrong" : "unchecked";
        json_array_append_new(
            arr, json_pack("{s:i, s:s, s:I, s:I, s:I, s:b, s:o, s:b, s:s}", "index", g->index,
                           "name", g->name, "memory_total", (json_int_t)g->mem_total,
                           "memory_used", (json_int_t)g->mem_used, "memory_free",
                           (json_int_t)g->mem_free, "healthy", g->healthy, "error",
                           string_or_null(g->error), "in_run", g->in_run, "result", result));
    }
    return arr;
}

static json_t *sizes_json(const dk_nccl_result_t *r)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < r->npoints; i++) {
        const dk_nccl_point_t *p = &r->points[i];
        json_array_append_new(
            arr, json_pack("{s:I, s:I, s:f, s:f, s:f}", "bytes", (json_int_t)p->bytes, "count",
                           (json_int_t)(p->bytes / sizeof(float)), "time_us",
                           p->seconds * 1e6, "algbw_gbs",
                           p->algbw, "busbw_gbs", p->busbw));
    }
    return arr;
}

static json_t *pairs_json(const dk_nccl_result_t *r)
{
    json_t *arr = json_array();
    for (int i = 0; arr && i < r->npairs; i++) {
        const dk_nccl_pair_t *p = &r->pairs[i];
        json_array_append_new(
            arr, json_pack("{s:[i,i], s:I, s:f, s:f, s:o}", "gpus", p->a, p->b, "bytes",
                           (json_int_t)p->bytes, "time_us", p->seconds * 1e6,
                           "busbw_gbs", p->busbw, "error",
                           string_or_null(p->error)));
    }
    return arr;
}

json_t *dk_nccl_report_json(const dk_nccl_result_t *r)
{
    if (!r->available)
        return dk_nccl_unavailable_json(r->reason);
    char summary[800], nccl[32], rt[16], drv[16];
    dk_nccl_verdict_t v = dk_nccl_verdict(r, summary, sizeof summary);
    fmt_nccl_version(r->nccl_version, nccl, sizeof nccl);
    fmt_cuda_version(r->cuda_runtime_version, rt, sizeof rt);
    fmt_cuda_version(r->cuda_driver_version, drv, sizeof drv);
    json_t *problems = json_array();
    if (problems)
        walk_problems(r, json_emit, problems);
    const char *note =
        r->nranks == 1
            ? "busbw = algbw * 2(n-1)/n as nccl-tests reports all_reduce; with one GPU that is 0, "
              "so compare algbw"
            : "busbw = algbw * 2(n-1)/n as nccl-tests reports all_reduce; compare it with the "
              "link speed";
    return json_pack("{s:b, s:s, s:s, s:o, s:s, s:s, s:s, s:s, s:b, s:i, s:i, s:i, s:f, s:o, "
                     "s:o, s:o, s:s}",
                     "ok", v == DK_NCCL_OK, "verdict", dk_nccl_verdict_name(v), "summary",
                     summary, "problems", problems, "nccl_version", nccl,
                     "cuda_runtime_version", rt, "cuda_driver_version", drv, "op",
                     "all_reduce float32 sum", "in_place", !r->out_of_place, "warmup",
                     r->warmup, "iters", r->iters, "nranks", r->nranks, "wall_seconds",
                     r->wall_seconds, "gpus", gpus_json(r), "sizes",
                     sizes_json(r), "pairs", pairs_json(r), "note", note);
}

/* ---- text ---- */

static const char *jstr(const json_t *obj, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : dflt;
}

static double jnum(const json_t *obj, const char *key)
{
    return json_number_value(json_object_get(obj, key));
}

static void text_gpus(FILE *f, const json_t *gpus)
{
    if (json_array_size(gpus) == 0)
        return;
    fprintf(f, "  GPU  %-28s %22s  %s\n", "name", "memory used / total", "health");
    size_t i;
    const json_t *g;
    json_array_foreach(gpus, i, g) {
        char used[32], total[32], mem[80];
        fmt_bytes(jnum(g, "memory_used"), used, sizeof used);
        fmt_bytes(jnum(g, "memory_total"), total, sizeof total);
        snprintf(mem, sizeof mem, "%s / %s", used, total);
        const char *health = json_is_true(json_object_get(g, "healthy"))
                                 ? (strcmp(jstr(g, "result", ""), "wrong") == 0 ? "WRONG RESULT"
                                                                                : "ok")
                                 : jstr(g, "error", "failed");
        fprintf(f, "  %3d  %-28s %22s  %s\n", (int)jnum(g, "index"), jstr(g, "name", "?"), mem,
                health);
    }
}

static void text_sizes(FILE *f, const json_t *sizes)
{
    if (json_array_size(sizes) == 0)
        return;
    fprintf(f, "  %10s %12s %12s %13s %13s\n", "size", "count", "time (us)", "algbw (GB/s)",
            "busbw (GB/s)");
    size_t i;
    const json_t *s;
    json_array_foreach(sizes, i, s) {
        char size[32];
        fmt_bytes(jnum(s, "bytes"), size, sizeof size);
        fprintf(f, "  %10s %12.0f %12.2f %13.2f %13.2f\n", size, jnum(s, "count"),
                jnum(s, "time_us"), jnum(s, "algbw_gbs"), jnum(s, "busbw_gbs"));
    }
}

static void text_pairs(FILE *f, const json_t *pairs)
{
    if (json_array_size(pairs) == 0)
        return;
    char size[32];
    fmt_bytes(jnum(json_array_get(pairs, 0), "bytes"), size, sizeof size);
    fprintf(f, "  pairs of GPUs alone, at %s:\n  %10s %13s\n", size, "GPUs", "busbw (GB/s)");
    size_t i;
    const json_t *p;
    json_array_foreach(pairs, i, p) {
        const json_t *g = json_object_get(p, "gpus");
        char ab[32];
        snprintf(ab, sizeof ab, "%d - %d", (int)json_integer_value(json_array_get(g, 0)),
                 (int)json_integer_value(json_array_get(g, 1)));
        const char *err = jstr(p, "error", NULL);
        if (err)
            fprintf(f, "  %10s  failed: %s\n", ab, err);
        else
            fprintf(f, "  %10s %13.2f\n", ab, jnum(p, "busbw_gbs"));
    }
}

char *dk_nccl_report_text(const json_t *report)
{
    if (!json_is_object(report))
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    const char *verdict = jstr(report, "verdict", "unavailable");
    if (strcmp(verdict, "unavailable") == 0) {
        fprintf(f, "NCCL check: %s\n", jstr(report, "reason", "no GPU to check"));
    } else {
        int nranks = (int)jnum(report, "nranks");
        fprintf(f,
                "NCCL check: %s on %d GPU%s (NCCL %s, CUDA runtime %s, driver %s), %s, "
                "%d warm-up + %d timed per size, %.1f s in all\n",
                jstr(report, "op", "all_reduce"), nranks, nranks == 1 ? "" : "s",
                jstr(report, "nccl_version", "?"), jstr(report, "cuda_runtime_version", "?"),
                jstr(report, "cuda_driver_version", "?"),
                json_is_false(json_object_get(report, "in_place")) ? "out of place" : "in place",
                (int)jnum(report, "warmup"), (int)jnum(report, "iters"),
                jnum(report, "wall_seconds"));
        text_gpus(f, json_object_get(report, "gpus"));
        text_sizes(f, json_object_get(report, "sizes"));
        text_pairs(f, json_object_get(report, "pairs"));
        fprintf(f, "verdict: %s: %s\n", verdict, jstr(report, "summary", ""));
        const json_t *problems = json_object_get(report, "problems");
        if (json_array_size(problems) > 1) {
            size_t i;
            const json_t *p;
            json_array_foreach(problems, i, p) fprintf(f, "  - %s\n", jstr(p, "message", ""));
        }
        if (jstr(report, "note", NULL))
            fprintf(f, "note: %s\n", jstr(report, "note", ""));
    }
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
