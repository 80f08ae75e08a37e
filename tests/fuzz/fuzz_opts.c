/*
 * fuzz_opts: the magic line parser (magics/dk_magic.h) and the options of
 * %%distributed (distributed/dk_dist_opts.h).
 *
 * Input: the text of a cell, as a user types it (an embedded NUL ends it, as
 * it would for the C string the kernel hands over). It goes the way a cell
 * goes through the kernel: dk_magic_parse against a registry holding the
 * %%distributed cell magic and two line magics (one of them sharing its name),
 * and, when %%distributed is called, dk_dist_opts_parse on its arguments. The
 * whole text is also parsed as options directly, with an error buffer of 256,
 * 8 or 1 bytes (chosen by the input's length), so every option's error path
 * runs with truncation. What is checked:
 *   - a match is one of the registered magics, of the kind the text names
 *     (`%%` cell, `%` line), its name follows the '%' after blank lines only;
 *     its args are one line with no surrounding blanks; a cell magic's body
 *     is the text after the first line's '\n', byte for byte, and a line
 *     magic's body is ""; dk_magic_run hands the handler exactly those;
 *   - no match leaves OUT zeroed;
 *   - accepted options are in their documented ranges (log_cap 0 or >= 4K), every string field is
 *     NUL-terminated within its array, `result` is an identifier, and the
 *     cross-option rules hold (num_processes excludes GPUs; a GPU_<n>x count
 *     matches num_accelerators); output= is one of its modes, and a list
 *     (distributed/dk_rank_list.h) kept for it parses again, into at least one rank
 *     of the largest world and exactly as many flags as it says;
 *   - a refusal writes a non-empty, NUL-terminated message.
 */
#include "fuzz_check.h"

#include "dk_dist_opts.h"
#include "dk_magic.h"
#include "dk_rank_list.h"

#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static dk_magic_registry_t *registry;

typedef struct {
    const dk_magic_call_t *call;
    int runs;
} host_t;

static int handler(void *host_p, void *data, const char *args, const char *body)
{
    host_t *host = host_p;
    FUZZ_CHECK(data == (void *)&registry, "dk_magic_run did not pass the magic's data");
    FUZZ_CHECK(args == host->call->args && body == host->call->body,
               "dk_magic_run did not pass the parsed args and body");
    host->runs++;
    return 0;
}

static const dk_magic_t magics[] = {
    {"distributed", DK_MAGIC_CELL, "run the cell as torch.distributed ranks", handler, &registry},
    {"distributed", DK_MAGIC_LINE, "a line magic sharing the cell magic's name", handler,
     &registry},
    {"dk_status", DK_MAGIC_LINE, "a line magic", handler, &registry},
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    registry = dk_magic_registry_new();
    FUZZ_CHECK(registry, "out of memory");
    for (size_t i = 0; i < sizeof magics / sizeof magics[0]; i++)
        FUZZ_CHECK(dk_magic_register(registry, &magics[i]) == 0, "cannot register %s",
                   magics[i].name);
    FUZZ_CHECK(dk_magic_register(registry, &magics[0]) == -1, "registered a name twice");
    FUZZ_CHECK(dk_magic_count(registry) == 3, "count");
    return 0;
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static bool is_ident(const char *s)
{
    if (!(isalpha((unsigned char) s[0]) || s[0] == '_'))
        return false;
    for (; *s; s++) {
        if (!(isalnum((unsigned char) *s) || *s == '_'))
            return false;
    }
    return true;
}

static void check_opts(const char *args, size_t errlen)
{
    dk_dist_opts_t o;
    memset(&o, 0xA5, sizeof o);
    char *err = malloc(errlen);     /* on the heap, so an overrun of ERRLEN is caught */
    FUZZ_CHECK(err, "out of memory");
    int rc = dk_dist_opts_parse(args, &o, err, errlen);
    if (rc != 0) {
        FUZZ_CHECK(rc == -1, "dk_dist_opts_parse returned %d", rc);
        FUZZ_CHECK(fuzz_terminated(err, errlen), "error message not terminated");
        FUZZ_CHECK(errlen == 1 || err[0] != '\0', "a refusal without a message");
        free(err);
        return;
    }
    free(err);
    FUZZ_CHECK(fuzz_terminated(o.accelerator_model, sizeof o.accelerator_model) &&
                   fuzz_terminated(o.accelerator_given, sizeof o.accelerator_given) &&
                   fuzz_terminated(o.result_name, sizeof o.result_name) &&
                   fuzz_terminated(o.experiment, sizeof o.experiment) &&
                   fuzz_terminated(o.run_name, sizeof o.run_name) &&
                   fuzz_terminated(o.warnings, sizeof o.warnings),
               "a string option is not NUL-terminated within its array");
    FUZZ_CHECK(o.num_accelerators >= 0 && o.num_accelerators <= 4096, "num_accelerators=%d",
               o.num_accelerators);
    FUZZ_CHECK(o.accelerator_count >= 0 && o.accelerator_count <= 4096, "accelerator_count=%d",
               o.accelerator_count);
    FUZZ_CHECK(o.num_processes >= 0 && o.num_processes <= 4096, "num_processes=%d",
               o.num_processes);
    FUZZ_CHECK(!o.num_processes || (!o.num_accelerators && !o.accelerator_model[0]),
               "num_processes together with GPUs");
    FUZZ_CHECK(!o.accelerator_count || o.num_accelerators == o.accelerator_count,
               "num_accelerators=%d but GPU_%dx", o.num_accelerators, o.accelerator_count);
    FUZZ_CHECK(isfinite(o.timeout_s) && o.timeout_s >= 0, "timeout=%g", o.timeout_s);
    FUZZ_CHECK(o.log_cap == 0 || o.log_cap >= DK_LOG_CAP_MIN_BYTES, "log_cap=%llu", o.log_cap);
    FUZZ_CHECK(o.output == DK_OUTPUT_ALL || o.output == DK_OUTPUT_RANK0 ||
                   o.output == DK_OUTPUT_LOCAL0 || o.output == DK_OUTPUT_LIST, "output=%d",
               (int) o.output);
    FUZZ_CHECK(fuzz_terminated(o.output_ranks, sizeof o.output_ranks) &&
                   (o.output == DK_OUTPUT_LIST) == (o.output_ranks[0] != '\0'),
               "output_ranks '%.40s' for output=%d", o.output_ranks, (int) o.output);
    if (o.output == DK_OUTPUT_LIST) {
        static bool shown[DK_RANK_LIST_RANKS_MAX];
        char why[256];
        FUZZ_CHECK(dk_rank_list_parse(o.output_ranks, 0, NULL, why, sizeof why) == 0,
                   "a list kept that its syntax refuses: %s", why);
        int n = dk_rank_list_parse(o.output_ranks, DK_RANK_LIST_RANKS_MAX, shown, why,
                                   sizeof why);
        int set = 0;
        for (int r = 0; r < DK_RANK_LIST_RANKS_MAX; r++)
            set += shown[r];
        FUZZ_CHECK(n >= 1 && n == set, "the list '%.40s' gives %d ranks and %d flags",
                   o.output_ranks, n, set);
    }
    for (const char *c = o.accelerator_model; *c; c++)
        FUZZ_CHECK(isalnum((unsigned char) *c), "accelerator model '%s'", o.accelerator_model);
    FUZZ_CHECK(!o.result_name[0] || is_ident(o.result_name), "result='%s'", o.result_name);
}

static void check_call(const char *code, const dk_magic_call_t *call)
{
    const dk_magic_t *m = call->magic;
    FUZZ_CHECK(dk_magic_find(registry, m->name, m->kind) == m, "matched an unregistered magic");
    FUZZ_CHECK(call->args && call->body, "a match without args or body");

    /* Only blank lines before the magic line. */
    const char *line = code;
    for (const char *p = code; *p; p++) {
        if (*p == '%') {
            line = p;
            break;
        }
        FUZZ_CHECK(*p == '\n' || is_blank(*p), "text before the magic line");
        if (*p == '\n')
            line = p + 1;
    }
    FUZZ_CHECK(line[0] == '%', "no '%%' where the magic line starts");
    const char *name = line + (m->kind == DK_MAGIC_CELL ? 2 : 1);
    FUZZ_CHECK((m->kind == DK_MAGIC_CELL) == (line[1] == '%'), "kind does not match '%%'s");
    size_t nlen = strlen(m->name);
    FUZZ_CHECK(strncmp(name, m->name, nlen) == 0, "the name is not '%s'", m->name);
    char after = name[nlen];
    FUZZ_CHECK(after == '\0' || after == '\n' || is_blank(after), "name followed by '%c'",
               after);

    size_t alen = strlen(call->args);
    FUZZ_CHECK(!strchr(call->args, '\n'), "args span lines");
    FUZZ_CHECK(alen == 0 || (!is_blank(call->args[0]) && !is_blank(call->args[alen - 1])),
               "args '%s' have surrounding blanks", call->args);
    FUZZ_CHECK(strstr(name + nlen, call->args), "args are not from the magic line");

    const char *eol = strchr(name, '\n');
    if (m->kind == DK_MAGIC_CELL) {
        FUZZ_CHECK(strcmp(call->body, eol ? eol + 1 : "") == 0,
                   "the body is not the text after the first line");
    } else {
        FUZZ_CHECK(call->body[0] == '\0', "a line magic with a body");
        for (const char *p = eol ? eol : ""; *p; p++)
            FUZZ_CHECK(*p == '\n' || is_blank(*p), "a line magic followed by more code");
    }

    host_t host = {call, 0};
    FUZZ_CHECK(dk_magic_run(call, &host) == 0 && host.runs == 1, "handler not run once");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *code = malloc(size + 1);
    FUZZ_CHECK(code, "out of memory");
    if (size)
        memcpy(code, data, size);
    code[size] = '\0';

    dk_magic_call_t call;
    memset(&call, 0xA5, sizeof call);
    if (dk_magic_parse(registry, code, &call)) {
        check_call(code, &call);
        if (call.magic == &magics[0])
            check_opts(call.args, 256);
    } else {
        FUZZ_CHECK(!call.magic && !call.args && !call.body, "no match but OUT is not zeroed");
    }
    dk_magic_call_clear(&call);
    dk_magic_call_clear(&call);

    static const size_t errlens[] = {256, 8, 1};
    check_opts(code, errlens[size % 3]);
    free(code);
    return 0;
}
