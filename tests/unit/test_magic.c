/*
 * Kernel-native magics: the registry and which cells the parser claims
 * (magics/dk_magic.h).
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "dk_magic.h"

typedef struct {
    int calls;
    char args[256];
    char body[256];
    void *data;
} host_t;

static int record(void *host, void *data, const char *args, const char *body)
{
    host_t *h = host;
    h->calls++;
    h->data = data;
    strncpy(h->args, args, sizeof h->args - 1);
    strncpy(h->body, body, sizeof h->body - 1);
    return 7;
}

static const dk_magic_t distributed = {"distributed", DK_MAGIC_CELL, "Run on every GPU.", record, NULL};
static const dk_magic_t nccl_check = {"nccl_check", DK_MAGIC_LINE, "Check NCCL.", record, NULL};

static dk_magic_registry_t *reg;

static void setup(void)
{
    reg = dk_magic_registry_new();
    cr_assert_not_null(reg);
    cr_assert_eq(dk_magic_register(reg, &distributed), 0);
    cr_assert_eq(dk_magic_register(reg, &nccl_check), 0);
}

static void teardown(void)
{
    dk_magic_registry_destroy(&reg);
    cr_assert_null(reg);
}

TestSuite(registry, .init = setup, .fini = teardown);
TestSuite(parse, .init = setup, .fini = teardown);

/* Parse CODE, expecting no match and an untouched (zeroed) call. */
static void expect_no_match(const char *code)
{
    dk_magic_call_t call;
    memset(&call, 0x55, sizeof call);
    cr_assert_not(dk_magic_parse(reg, code, &call), "matched: \"%s\"", code);
    cr_assert_null(call.magic);
    cr_assert_null(call.args);
    cr_assert_null(call.body);
}

/* Parse CODE, expecting MAGIC with ARGS and BODY. */
static void expect_match(const char *code, const dk_magic_t *magic, const char *args,
                         const char *body)
{
    dk_magic_call_t call;
    cr_assert(dk_magic_parse(reg, code, &call), "no match: \"%s\"", code);
    cr_assert_eq(call.magic, magic);
    cr_assert_str_eq(call.args, args);
    cr_assert_str_eq(call.body, body);
    dk_magic_call_clear(&call);
    cr_assert_null(call.args);
}

/* ---- registry ---- */

Test(registry, lists_magics_in_registration_order)
{
    cr_assert_eq(dk_magic_count(reg), 2);
    cr_assert_eq(dk_magic_at(reg, 0), &distributed);
    cr_assert_eq(dk_magic_at(reg, 1), &nccl_check);
    cr_assert_null(dk_magic_at(reg, 2));
}

Test(registry, finds_by_name_and_kind)
{
    cr_assert_eq(dk_magic_find(reg, "distributed", DK_MAGIC_CELL), &distributed);
    cr_assert_null(dk_magic_find(reg, "distributed", DK_MAGIC_LINE));
    cr_assert_null(dk_magic_find(reg, "distrib", DK_MAGIC_CELL));
    cr_assert_null(dk_magic_find(reg, "distributedx", DK_MAGIC_CELL));
}

Test(registry, refuses_a_duplicate_name_of_the_same_kind)
{
    static const dk_magic_t again = {"distributed", DK_MAGIC_CELL, "", record, NULL};
    cr_assert_eq(dk_magic_register(reg, &again), -1);
    cr_assert_eq(dk_magic_count(reg), 2);
}

Test(registry, accepts_the_same_name_as_line_and_cell_magic)
{
    static const dk_magic_t line = {"distributed", DK_MAGIC_LINE, "", record, NULL};
    cr_assert_eq(dk_magic_register(reg, &line), 0);
    cr_assert_eq(dk_magic_find(reg, "distributed", DK_MAGIC_LINE), &line);
    cr_assert_eq(dk_magic_find(reg, "distributed", DK_MAGIC_CELL), &distributed);
}

Test(registry, refuses_a_name_that_is_not_an_identifier)
{
    const char *bad[] = {"", "1gpu", "dist-ributed", "has space", "%%x", "x?"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dk_magic_t m = {bad[i], DK_MAGIC_CELL, "", record, NULL};
        cr_assert_eq(dk_magic_register(reg, &m), -1, "accepted \"%s\"", bad[i]);
    }
    dk_magic_t none = {NULL, DK_MAGIC_CELL, "", record, NULL};
    cr_assert_eq(dk_magic_register(reg, &none), -1);
    dk_magic_t ok = {"_under_score9", DK_MAGIC_CELL, "", record, NULL};
    cr_assert_eq(dk_magic_register(reg, &ok), 0);
}

Test(registry, grows_past_its_first_allocation)
{
    static char names[40][16];
    static dk_magic_t many[40];
    for (int i = 0; i < 40; i++) {
        snprintf(names[i], sizeof names[i], "m%d", i);
        many[i] = (dk_magic_t) {names[i], DK_MAGIC_LINE, "", record, NULL};
        cr_assert_eq(dk_magic_register(reg, &many[i]), 0);
    }
    cr_assert_eq(dk_magic_count(reg), 42);
    cr_assert_eq(dk_magic_find(reg, "m39", DK_MAGIC_LINE), &many[39]);
}

/* ---- parsing ---- */

Test(parse, cell_magic_takes_args_and_body)
{
    expect_match("%%distributed num_accelerators=8\nimport torch\nprint(1)\n", &distributed,
                 "num_accelerators=8", "import torch\nprint(1)\n");
}

Test(parse, cell_magic_body_is_kept_byte_for_byte)
{
    expect_match("%%distributed\n\n  indented\n\n", &distributed, "", "\n  indented\n\n");
}

Test(parse, cell_magic_without_body_has_empty_body)
{
    expect_match("%%distributed gpus=2", &distributed, "gpus=2", "");
    expect_match("%%distributed\n", &distributed, "", "");
}

Test(parse, line_magic_alone_in_the_cell)
{
    expect_match("%nccl_check", &nccl_check, "", "");
    expect_match("%nccl_check --size 64M", &nccl_check, "--size 64M", "");
}

Test(parse, line_magic_allows_trailing_newlines_and_whitespace)
{
    expect_match("%nccl_check verbose\n", &nccl_check, "verbose", "");
    expect_match("%nccl_check verbose \n  \n\t\n", &nccl_check, "verbose", "");
}

Test(parse, line_magic_followed_by_code_is_left_to_ipython)
{
    expect_no_match("%nccl_check\nprint(1)\n");
}

Test(parse, args_are_stripped_of_surrounding_blanks)
{
    expect_match("%%distributed  \t num_processes=2  timeout=60 \t \nx = 1\n", &distributed,
                 "num_processes=2  timeout=60", "x = 1\n");
    expect_match("%%distributed gpus=2\r\nx\r\n", &distributed, "gpus=2", "x\r\n");
}

Test(parse, skips_leading_blank_lines)
{
    expect_match("\n  \n\t\n%%distributed gpus=2\nx\n", &distributed, "gpus=2", "x\n");
    expect_match("\n\n%nccl_check\n", &nccl_check, "", "");
}

Test(parse, help_requests_are_not_matched)
{
    expect_no_match("%%distributed?");
    expect_no_match("%%distributed??");
    expect_no_match("%%distributed?\n");
    expect_no_match("%nccl_check?");
    expect_no_match("%nccl_check??\n");
}

Test(parse, unknown_names_are_not_matched)
{
    expect_no_match("%%timeit\nx = 1\n");
    expect_no_match("%%distrib\nx\n");
    expect_no_match("%%distributedx\nx\n");
    expect_no_match("%pwd");
}

Test(parse, a_name_registered_for_the_other_kind_is_not_matched)
{
    expect_no_match("%distributed gpus=2");
    expect_no_match("%%nccl_check\nx\n");
}

Test(parse, a_name_glued_to_other_characters_is_not_matched)
{
    expect_no_match("%%distributed-x\nbody\n");
    expect_no_match("%%distributed.x\nbody\n");
    expect_no_match("%nccl_check=1");
}

Test(parse, code_that_does_not_start_with_a_magic_is_not_matched)
{
    expect_no_match("");
    expect_no_match("\n\n  \n");
    expect_no_match("x = 1\n%%distributed\n");
    expect_no_match("%%\nx\n");
    expect_no_match("%%%distributed\nx\n");
    expect_no_match("%% distributed\nx\n");
    expect_no_match("# %%distributed\nx\n");
    /* Indented magics are left to IPython, which dedents them itself. */
    expect_no_match("  %%distributed\nx\n");
}

Test(parse, needs_a_registry_and_code)
{
    dk_magic_call_t call;
    cr_assert_not(dk_magic_parse(NULL, "%%distributed\n", &call));
    cr_assert_null(call.magic);
    cr_assert_not(dk_magic_parse(reg, NULL, &call));
    cr_assert_not(dk_magic_parse(reg, "%%distributed\n", NULL));
}

Test(parse, run_calls_the_handler_with_host_args_and_body)
{
    dk_magic_call_t call;
    host_t host = {0};
    cr_assert(dk_magic_parse(reg, "%%distributed gpus=8\nbody()\n", &call));
    cr_assert_eq(dk_magic_run(&call, &host), 7);
    cr_assert_eq(host.calls, 1);
    cr_assert_str_eq(host.args, "gpus=8");
    cr_assert_str_eq(host.body, "body()\n");
    dk_magic_call_clear(&call);
}

Test(parse, run_passes_the_magics_own_data_to_its_handler)
{
    int feature = 0;
    dk_magic_t owned = {"owned", DK_MAGIC_LINE, "A feature's magic.", record, &feature};
    cr_assert_eq(dk_magic_register(reg, &owned), 0);
    dk_magic_call_t call;
    cr_assert(dk_magic_parse(reg, "%owned x", &call));
    host_t host = {0};
    dk_magic_run(&call, &host);
    cr_assert_eq(host.data, &feature);
    cr_assert_str_eq(host.args, "x");
    dk_magic_call_clear(&call);
}

Test(parse, run_without_a_magic_fails)
{
    dk_magic_call_t call = {0};
    cr_assert_eq(dk_magic_run(&call, NULL), -1);
    cr_assert_eq(dk_magic_run(NULL, NULL), -1);
}
