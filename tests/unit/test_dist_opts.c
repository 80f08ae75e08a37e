/*
 * The options of %%distributed and @distributed (distributed/dk_dist_opts.h).
 *
 * Each test is one rule of the option language: what a value form means, what
 * the deprecated names do, how options combine, and that every mistake is
 * caught before launch with a message naming the option and what it accepts.
 */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_dist_opts.h"

static dk_dist_opts_t opts;
static char err[512];

/* Parse ARGS, expecting success and no error text. */
static void ok(const char *args)
{
    err[0] = '\0';
    int rc = dk_dist_opts_parse(args, &opts, err, sizeof err);
    cr_assert_eq(rc, 0, "rejected \"%s\": %s", args ? args : "(null)", err);
}

/* Parse ARGS, expecting an error whose text holds every one of the NULL-ended
 * substrings that follow. */
static void fails(const char *args, ...)
{
    err[0] = '\0';
    int rc = dk_dist_opts_parse(args, &opts, err, sizeof err);
    cr_assert_eq(rc, -1, "accepted \"%s\"", args);
    cr_assert_neq(err[0], '\0', "no message for \"%s\"", args);
    va_list ap;
    va_start(ap, args);
    for (const char *want = va_arg(ap, const char *); want; want = va_arg(ap, const char *))
        cr_assert_not_null(strstr(err, want), "\"%s\": message \"%s\" lacks \"%s\"", args, err,
                           want);
    va_end(ap);
}

/* The defaults every parse starts from. */
static void expect_defaults(void)
{
    cr_assert_eq(opts.num_accelerators, 0);
    cr_assert_str_eq(opts.accelerator_model, "");
    cr_assert_eq(opts.accelerator_count, 0);
    cr_assert_eq(opts.num_processes, 0);
    cr_assert_float_eq(opts.timeout_s, 10800.0, 1e-9);
    cr_assert_eq(opts.output, DK_OUTPUT_ALL);
    cr_assert_str_eq(opts.result_name, "");
    cr_assert_not(opts.check);
    cr_assert(opts.tracking);
    cr_assert_str_eq(opts.experiment, "");
    cr_assert_str_eq(opts.run_name, "");
    cr_assert_str_eq(opts.warnings, "");
}

/* ---- defaults and empty input ---- */

Test(defaults, empty_args_give_the_defaults)
{
    ok("");
    expect_defaults();
}

Test(defaults, null_args_give_the_defaults)
{
    ok(NULL);
    expect_defaults();
}

Test(defaults, blanks_only_give_the_defaults)
{
    ok("  \t  \n ");
    expect_defaults();
}

Test(defaults, timeout_defaults_to_three_hours)
{
    ok("num_processes=2");
    cr_assert_float_eq(opts.timeout_s, DK_DEFAULT_TIMEOUT_S, 1e-9);
    cr_assert_float_eq(DK_DEFAULT_TIMEOUT_S, 10800.0, 1e-9);
}

Test(defaults, output_defaults_to_all_ranks)
{
    ok("num_processes=2");
    cr_assert_eq(opts.output, DK_OUTPUT_ALL);
}

Test(defaults, a_parse_resets_what_an_earlier_parse_set)
{
    ok("gpus=2 result=r output=rank0 timeout=5 check=True tracking=False experiment=e "
       "run_name=n");
    ok("");
    expect_defaults();
}

/* ---- each option and its value forms ---- */

Test(values, num_accelerators_takes_an_integer)
{
    ok("num_accelerators=8");
    cr_assert_eq(opts.num_accelerators, 8);
    cr_assert_str_eq(opts.warnings, "");
}

Test(values, num_processes_takes_an_integer)
{
    ok("num_processes=2");
    cr_assert_eq(opts.num_processes, 2);
    cr_assert_eq(opts.num_accelerators, 0);
}

Test(values, integers_may_be_quoted)
{
    ok("num_processes='3'");
    cr_assert_eq(opts.num_processes, 3);
    ok("num_accelerators=\"4\"");
    cr_assert_eq(opts.num_accelerators, 4);
}

Test(values, timeout_takes_whole_seconds)
{
    ok("timeout=3600");
    cr_assert_float_eq(opts.timeout_s, 3600.0, 1e-9);
}

Test(values, timeout_takes_fractional_seconds)
{
    ok("timeout=1.5");
    cr_assert_float_eq(opts.timeout_s, 1.5, 1e-9);
}

Test(values, timeout_none_means_no_limit)
{
    ok("timeout=None");
    cr_assert_float_eq(opts.timeout_s, 0.0, 1e-12);
}

Test(values, stall_after_defaults_to_a_minute_and_0_turns_it_off)
{
    unsetenv(DK_STALL_AFTER_ENV);
    ok("");
    cr_assert_float_eq(opts.stall_after_s, 60.0, 1e-9);
    ok("stall_after=2.5");
    cr_assert_float_eq(opts.stall_after_s, 2.5, 1e-9);
    ok("stall_after=0");
    cr_assert_float_eq(opts.stall_after_s, 0.0, 1e-12);
}

Test(values, stall_after_refuses_what_is_not_seconds)
{
    unsetenv(DK_STALL_AFTER_ENV);
    fails("stall_after=-1", "stall_after", "0 or more", "0 turns it off", "'-1'", NULL);
    fails("stall_after=soon", "stall_after", "'soon'", NULL);
    fails("stall_after=None", "stall_after", NULL);
    fails("stall_after='5'", "stall_after", NULL);
}

Test(values, the_help_says_how_stall_after_works)
{
    cr_assert_not_null(strstr(dk_dist_doc, "stall_after=SECONDS"));
    cr_assert_not_null(strstr(dk_dist_doc, "$DISTKERNEL_STALL_AFTER"));
    cr_assert_not_null(strstr(dk_dist_doc, "0 turns it off"));
}

Test(values, stall_after_comes_from_the_environment_and_the_cell_wins)
{
    setenv(DK_STALL_AFTER_ENV, "5", 1);
    ok("");
    cr_assert_float_eq(opts.stall_after_s, 5.0, 1e-9);
    ok("stall_after=0");
    cr_assert_float_eq(opts.stall_after_s, 0.0, 1e-12);
    setenv(DK_STALL_AFTER_ENV, "a minute", 1);
    fails("", "DISTKERNEL_STALL_AFTER", "stall_after=", "'a minute'", "0 or more", NULL);
    unsetenv(DK_STALL_AFTER_ENV);
}

Test(values, output_all_and_rank0)
{
    ok("output=rank0");
    cr_assert_eq(opts.output, DK_OUTPUT_RANK0);
    ok("output=all");
    cr_assert_eq(opts.output, DK_OUTPUT_ALL);
}

Test(values, output_local0_is_local_rank_0_of_each_node)
{
    ok("output=local0");
    cr_assert_eq(opts.output, DK_OUTPUT_LOCAL0);
    cr_assert_str_eq(opts.output_ranks, "");
}

Test(values, output_takes_a_list_of_ranks_kept_as_written)
{
    ok("output=0,8,16-31");
    cr_assert_eq(opts.output, DK_OUTPUT_LIST);
    cr_assert_str_eq(opts.output_ranks, "0,8,16-31");
    ok("output=7");
    cr_assert_eq(opts.output, DK_OUTPUT_LIST);
    cr_assert_str_eq(opts.output_ranks, "7");
    ok("output='0, 2-3'");
    cr_assert_str_eq(opts.output_ranks, "0, 2-3");
    ok("output=all");
    cr_assert_str_eq(opts.output_ranks, "", "another mode forgets the list");
}

Test(values, a_list_past_the_world_is_not_known_here_only_its_syntax)
{
    /* The world is the node's or Slurm's: checked once the run is planned. */
    ok("num_processes=4 output=0,9");
    cr_assert_str_eq(opts.output_ranks, "0,9");
}

Test(values, the_help_says_how_to_read_a_run_of_a_thousand_ranks)
{
    const char *want[] = {"output=all|rank0|local0|LIST", "local rank 0's of each node",
                          "0,8,16-31", "hundreds or thousands of ranks", "output=local0",
                          "rank-N.log has rank N's whole output"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(dk_dist_doc, want[i]), "the help lacks %s", want[i]);
}

Test(values, output_may_be_quoted_either_way)
{
    ok("output='rank0'");
    cr_assert_eq(opts.output, DK_OUTPUT_RANK0);
    ok("output=\"rank0\"");
    cr_assert_eq(opts.output, DK_OUTPUT_RANK0);
}

Test(values, result_takes_an_identifier)
{
    ok("result=losses");
    cr_assert_str_eq(opts.result_name, "losses");
    ok("result=_r2");
    cr_assert_str_eq(opts.result_name, "_r2");
}

Test(values, result_may_be_quoted_either_way)
{
    ok("result='per_rank'");
    cr_assert_str_eq(opts.result_name, "per_rank");
    ok("result=\"per_rank\"");
    cr_assert_str_eq(opts.result_name, "per_rank");
}

Test(values, check_takes_true_and_false)
{
    ok("check=True");
    cr_assert(opts.check);
    ok("check=False");
    cr_assert_not(opts.check);
}

Test(values, tracking_takes_true_and_false)
{
    ok("tracking=False");
    cr_assert_not(opts.tracking);
    ok("tracking=True");
    cr_assert(opts.tracking);
}

Test(values, experiment_and_run_name_take_names_with_blanks_when_quoted)
{
    ok("experiment='/Users/me/my experiment' run_name=\"ddp run 1\"");
    cr_assert_str_eq(opts.experiment, "/Users/me/my experiment");
    cr_assert_str_eq(opts.run_name, "ddp run 1");
    ok("experiment=mlp run_name=first");
    cr_assert_str_eq(opts.experiment, "mlp");
    cr_assert_str_eq(opts.run_name, "first");
}

Test(values, accelerator_type_gives_count_and_model)
{
    ok("accelerator_type=GPU_8xH100");
    cr_assert_eq(opts.accelerator_count, 8);
    cr_assert_str_eq(opts.accelerator_model, "H100");
    cr_assert_str_eq(opts.warnings, "");
}

Test(values, accelerator_type_alone_sets_num_accelerators)
{
    ok("accelerator_type=GPU_8xH100");
    cr_assert_eq(opts.num_accelerators, 8);
    ok("accelerator_type=GPU_1xA10");
    cr_assert_eq(opts.num_accelerators, 1);
    cr_assert_str_eq(opts.accelerator_model, "A10");
}

Test(values, the_type_as_written_is_kept_for_messages)
{
    ok("accelerator_type=gpu_8xh100");
    cr_assert_str_eq(opts.accelerator_given, "accelerator_type=GPU_8xH100");
    ok("gpu_type=h200");
    cr_assert_str_eq(opts.accelerator_given, "gpu_type=H200");
    ok("num_processes=2");
    cr_assert_str_eq(opts.accelerator_given, "");
}

Test(values, the_platforms_enum_members_are_accepted_as_written_in_python)
{
    ok("accelerator_type=AcceleratorType.GPU_8xH100");
    cr_assert_eq(opts.accelerator_count, 8);
    cr_assert_str_eq(opts.accelerator_model, "H100");
    ok("gpu_type=GPUType.B300");
    cr_assert_str_eq(opts.accelerator_model, "B300");
    fails("gpu_type=AcceleratorType.GPU_8xH100", "gpu_type", "H100", NULL);
    fails("accelerator_type=GPUType.H100", "accelerator_type", "GPU_8xH100", NULL);
}

Test(values, the_platform_models_are_its_gpu_types)
{
    cr_assert(dk_dist_platform_model("A10"));
    cr_assert(dk_dist_platform_model("H100"));
    cr_assert(dk_dist_platform_model("B300"));
    cr_assert_not(dk_dist_platform_model("H200"));
    cr_assert_not(dk_dist_platform_model("A100"));
    cr_assert_not(dk_dist_platform_model(""));
}

Test(values, accelerator_type_is_case_insensitive)
{
    ok("accelerator_type=gpu_8xh100");
    cr_assert_eq(opts.accelerator_count, 8);
    cr_assert_str_eq(opts.accelerator_model, "H100");
    ok("accelerator_type=Gpu_2XB300");
    cr_assert_eq(opts.accelerator_count, 2);
    cr_assert_str_eq(opts.accelerator_model, "B300");
}

Test(values, accelerator_type_may_be_quoted_either_way)
{
    ok("accelerator_type='GPU_8xH100'");
    cr_assert_eq(opts.accelerator_count, 8);
    cr_assert_str_eq(opts.accelerator_model, "H100");
    ok("accelerator_type=\"GPU_4xA100\"");
    cr_assert_eq(opts.accelerator_count, 4);
    cr_assert_str_eq(opts.accelerator_model, "A100");
}

Test(values, accelerator_type_agreeing_with_num_accelerators_is_fine)
{
    ok("num_accelerators=8 accelerator_type=GPU_8xH100");
    cr_assert_eq(opts.num_accelerators, 8);
    cr_assert_eq(opts.accelerator_count, 8);
}

Test(values, options_combine_in_any_order_and_spacing)
{
    ok("  result=r   timeout=60\toutput=rank0 num_processes=4  check=False ");
    cr_assert_eq(opts.num_processes, 4);
    cr_assert_float_eq(opts.timeout_s, 60.0, 1e-9);
    cr_assert_eq(opts.output, DK_OUTPUT_RANK0);
    cr_assert_str_eq(opts.result_name, "r");
    cr_assert_not(opts.check);
}

Test(values, a_backslash_escapes_the_quote_inside_a_quoted_value)
{
    /* The escaped quote does not end the value: it reaches output's check,
     * which rejects the odd value by name, instead of a syntax error. */
    fails("output='ra\\'nk0'", "output", "all", "rank0", "ra'nk0", NULL);
    ok("result='r\\_1'");
    cr_assert_str_eq(opts.result_name, "r_1");
}

/* ---- the managed platform's older names ---- */

Test(aliases, gpus_is_num_accelerators_with_a_warning)
{
    ok("gpus=8");
    cr_assert_eq(opts.num_accelerators, 8);
    cr_assert_not_null(strstr(opts.warnings, "gpus"), "warnings: %s", opts.warnings);
    cr_assert_not_null(strstr(opts.warnings, "deprecated"), "warnings: %s", opts.warnings);
    cr_assert_not_null(strstr(opts.warnings, "num_accelerators"), "warnings: %s", opts.warnings);
}

Test(aliases, gpu_type_is_the_model_with_a_warning)
{
    ok("gpu_type=H100");
    cr_assert_str_eq(opts.accelerator_model, "H100");
    cr_assert_eq(opts.accelerator_count, 0);
    cr_assert_eq(opts.num_accelerators, 0);
    cr_assert_not_null(strstr(opts.warnings, "gpu_type"), "warnings: %s", opts.warnings);
    cr_assert_not_null(strstr(opts.warnings, "deprecated"), "warnings: %s", opts.warnings);
    cr_assert_not_null(strstr(opts.warnings, "accelerator_type"), "warnings: %s", opts.warnings);
}

Test(aliases, gpu_type_is_case_insensitive_and_may_be_quoted)
{
    ok("gpu_type=\"h100\"");
    cr_assert_str_eq(opts.accelerator_model, "H100");
    ok("gpu_type='a10'");
    cr_assert_str_eq(opts.accelerator_model, "A10");
}

Test(aliases, both_old_names_give_both_warnings)
{
    ok("gpus=8 gpu_type=H100");
    cr_assert_eq(opts.num_accelerators, 8);
    cr_assert_str_eq(opts.accelerator_model, "H100");
    cr_assert_not_null(strstr(opts.warnings, "gpus="), "warnings: %s", opts.warnings);
    cr_assert_not_null(strstr(opts.warnings, "gpu_type="), "warnings: %s", opts.warnings);
    cr_assert_not_null(strchr(opts.warnings, '\n'), "one warning per line: %s", opts.warnings);
}

Test(aliases, new_names_give_no_warning)
{
    ok("num_accelerators=8 accelerator_type=GPU_8xH100 timeout=None output=all result=r "
       "tracking=True experiment=x run_name=y check=False");
    cr_assert_str_eq(opts.warnings, "");
}

/* ---- options that contradict each other ---- */

Test(conflicts, num_accelerators_contradicting_accelerator_type)
{
    fails("num_accelerators=4 accelerator_type=GPU_8xH100", "num_accelerators",
          "accelerator_type", "4", "GPU_8xH100", NULL);
}

Test(conflicts, gpus_contradicting_accelerator_type)
{
    fails("gpus=2 accelerator_type=GPU_8xH100", "accelerator_type", NULL);
}

Test(conflicts, num_processes_with_num_accelerators)
{
    fails("num_processes=2 num_accelerators=2", "num_processes", "num_accelerators", NULL);
}

Test(conflicts, num_processes_with_accelerator_type)
{
    fails("num_processes=2 accelerator_type=GPU_2xH100", "num_processes", "accelerator_type",
          NULL);
}

Test(conflicts, num_processes_with_gpu_type)
{
    fails("gpu_type=H100 num_processes=2", "num_processes", NULL);
}

Test(conflicts, gpus_and_num_accelerators_together)
{
    fails("gpus=8 num_accelerators=8", "num_accelerators", "gpus", NULL);
}

Test(conflicts, num_accelerators_twice)
{
    fails("num_accelerators=8 num_accelerators=4", "num_accelerators", NULL);
}

Test(conflicts, gpu_type_and_accelerator_type_together)
{
    fails("gpu_type=H100 accelerator_type=GPU_8xH100", "accelerator_type", "gpu_type", NULL);
}

/* ---- bad values: each message names the option and what it accepts ---- */

Test(bad_values, num_accelerators_zero)
{
    fails("num_accelerators=0", "num_accelerators", "positive whole number", "'0'", NULL);
}

Test(bad_values, num_accelerators_negative)
{
    fails("num_accelerators=-1", "num_accelerators", "positive whole number", "'-1'", NULL);
}

Test(bad_values, num_accelerators_not_a_number)
{
    fails("num_accelerators=eight", "num_accelerators", "positive whole number", "'eight'", NULL);
    fails("num_accelerators=8.0", "num_accelerators", "positive whole number", NULL);
    fails("num_accelerators=8x", "num_accelerators", "positive whole number", NULL);
    fails("num_accelerators=''", "num_accelerators", "positive whole number", NULL);
}

Test(bad_values, num_accelerators_past_the_integer_range)
{
    fails("num_accelerators=99999999999999999999", "num_accelerators", NULL);
}

Test(bad_values, gpus_error_uses_the_name_the_user_wrote)
{
    fails("gpus=0", "gpus", "positive whole number", NULL);
}

Test(bad_values, num_processes_zero_negative_and_words)
{
    fails("num_processes=0", "num_processes", "positive whole number", NULL);
    fails("num_processes=-3", "num_processes", "positive whole number", NULL);
    fails("num_processes=two", "num_processes", "positive whole number", NULL);
    fails("num_processes=None", "num_processes", "positive whole number", NULL);
    fails("num_processes=True", "num_processes", "positive whole number", NULL);
}

Test(bad_values, num_processes_past_the_integer_range)
{
    fails("num_processes=99999999999999999999", "num_processes", NULL);
}

Test(bad_values, huge_rank_count_names_the_limit)
{
    /* 5000 is a positive whole number: the message must say what the limit is,
     * or the user is told their (valid-looking) value is not a number. */
    fails("num_processes=5000", "num_processes", "4096", NULL);
    fails("num_accelerators=5000", "num_accelerators", "4096", NULL);
    /* ... and why it is what it is (finding 5 of issue 11). */
    fails("num_processes=5000", "a live output line for every rank",
          "5 of the kernel's file descriptors", NULL);
}

Test(bad_values, rank_count_limit_is_inclusive)
{
    ok("num_processes=4096");
    cr_assert_eq(opts.num_processes, 4096);
    ok("num_processes=1");
    cr_assert_eq(opts.num_processes, 1);
}

Test(bad_values, timeout_zero)
{
    fails("timeout=0", "timeout", "seconds", "None", "'0'", NULL);
}

Test(bad_values, timeout_negative)
{
    fails("timeout=-5", "timeout", "seconds", "None", NULL);
}

Test(bad_values, timeout_words_infinity_and_nan)
{
    fails("timeout=forever", "timeout", "None", NULL);
    fails("timeout=inf", "timeout", "None", NULL);
    fails("timeout=nan", "timeout", "None", NULL);
    fails("timeout=1e999", "timeout", "None", NULL);
    fails("timeout=10s", "timeout", "None", NULL);
}

Test(bad_values, timeout_none_must_be_bare)
{
    fails("timeout='None'", "timeout", "None", NULL);
    fails("timeout=none", "timeout", "None", NULL);
}

Test(bad_values, timeout_quoted_number_is_a_string)
{
    fails("timeout=\"60\"", "timeout", NULL);
}

Test(bad_values, output_other_than_all_or_rank0)
{
    fails("output=rank1", "output", "all", "rank0", "local0", "0,8,16-31", "'rank1'", NULL);
    fails("output=ALL", "output", "all", "rank0", NULL);
    fails("output=", "output", "all", "rank0", NULL);
    fails("output=x", "output must be all, rank0, local0 (local rank 0 of each node) or a list "
          "of ranks such as 0,8,16-31, got 'x'", NULL);
}

Test(bad_values, a_bad_list_of_ranks_says_what_is_wrong_and_what_to_write)
{
    fails("output=3-1", "output=3-1: the range 3-1 runs backwards; write it from its first rank "
          "to its last: 1-3", NULL);
    fails("output=0,x", "output=0,x: 'x' is not a rank nor a range of ranks", "FIRST-LAST",
          NULL);
    fails("output=0,,1", "output=0,,1: an empty item", NULL);
    fails("output=0,5000", "output=0,5000: '5000' is past the ranks of any run", NULL);
}

Test(bad_values, a_value_too_long_is_refused_not_cut)
{
    /* Cut at the buffer, "0,1,...,39" would end in the middle of a number
     * and show other ranks than the user listed. */
    char args[8192] = "output=";
    size_t used = strlen(args);
    for (int r = 0; r < 1200; r++)
        used += (size_t)snprintf(args + used, sizeof args - used, "%s%d", r ? "," : "", r);
    fails(args, "option output: its value is longer than 1023 characters", "ranges (16-31",
          NULL);
}

Test(bad_values, result_must_be_an_identifier)
{
    fails("result=1abc", "result", "variable name", "'1abc'", NULL);
    fails("result=a-b", "result", "variable name", NULL);
    fails("result='two words'", "result", "variable name", NULL);
    fails("result=a.b", "result", "variable name", NULL);
    fails("result=", "result", "variable name", NULL);
}

Test(bad_values, result_name_too_long)
{
    char args[256];
    memset(args, 0, sizeof args);
    strcpy(args, "result=");
    memset(args + 7, 'a', 200);
    fails(args, "result", "variable name", NULL);
}

Test(bad_values, check_other_than_true_or_false)
{
    fails("check=yes", "check", "True", "False", NULL);
    fails("check=1", "check", "True", "False", NULL);
}

Test(bad_values, tracking_other_than_true_or_false)
{
    fails("tracking=off", "tracking", "True", "False", NULL);
}

Test(bad_values, experiment_and_run_name_must_not_be_empty)
{
    fails("experiment=''", "experiment", "non-empty", NULL);
    fails("run_name=", "run_name", "non-empty", NULL);
}

Test(bad_values, experiment_name_too_long)
{
    char args[400];
    strcpy(args, "experiment=");
    memset(args + 11, 'e', 300);
    args[311] = '\0';
    fails(args, "experiment", "255", NULL);
}

Test(bad_values, accelerator_type_without_the_gpu_prefix)
{
    fails("accelerator_type=H100", "accelerator_type", "GPU_<n>x<MODEL>", "GPU_8xH100", "'H100'",
          NULL);
}

Test(bad_values, accelerator_type_malformed)
{
    fails("accelerator_type=GPU_xH100", "accelerator_type", "GPU_<n>x<MODEL>", NULL);
    fails("accelerator_type=GPU_8H100", "accelerator_type", "GPU_<n>x<MODEL>", NULL);
    fails("accelerator_type=GPU_8x", "accelerator_type", "GPU_<n>x<MODEL>", NULL);
    fails("accelerator_type=GPU_8x-H100", "accelerator_type", "GPU_<n>x<MODEL>", NULL);
    fails("accelerator_type=GPU_ 8xH100", "accelerator_type", NULL);
    fails("accelerator_type=", "accelerator_type", "GPU_<n>x<MODEL>", NULL);
}

Test(bad_values, accelerator_type_count_out_of_bounds)
{
    fails("accelerator_type=GPU_0xH100", "accelerator_type", "GPU_<n>x<MODEL>", NULL);
    fails("accelerator_type=GPU_-1xH100", "accelerator_type", "GPU_<n>x<MODEL>", NULL);
    fails("accelerator_type=GPU_99999999999999999999xH100", "accelerator_type", NULL);
}

Test(bad_values, gpu_type_must_be_a_model_name)
{
    fails("gpu_type=GPU_8xH100", "gpu_type", "H100", NULL);
    fails("gpu_type=", "gpu_type", "H100", NULL);
    fails("gpu_type='H 100'", "gpu_type", "H100", NULL);
}

/* ---- unknown options and malformed text ---- */

Test(syntax, unknown_option_lists_the_accepted_ones)
{
    fails("num_gpus=8", "num_gpus", "num_accelerators", "accelerator_type", "num_processes",
          "timeout", "output", "result", "check", "experiment", "run_name", "tracking", NULL);
}

Test(syntax, option_names_are_case_sensitive)
{
    fails("NUM_PROCESSES=2", "NUM_PROCESSES", "num_processes", NULL);
}

Test(syntax, token_without_equals_sign)
{
    fails("num_processes", "num_processes", "name=value", NULL);
    fails("num_processes=2 verbose", "verbose", "name=value", NULL);
}

Test(syntax, token_without_a_name)
{
    fails("=2", "name=value", NULL);
    fails("-n 2", "name=value", NULL);
}

Test(syntax, blanks_around_the_equals_sign_are_not_accepted)
{
    fails("num_processes = 2", "num_processes", "name=value", NULL);
}

Test(syntax, python_style_commas_are_rejected)
{
    fails("num_processes=2, timeout=5", "num_processes", NULL);
}

Test(syntax, unterminated_single_quote)
{
    fails("result='abc", "result", "unterminated", NULL);
}

Test(syntax, unterminated_double_quote)
{
    fails("output=\"rank0 timeout=5", "output", "unterminated", NULL);
}

Test(syntax, error_in_a_later_option_is_still_reported)
{
    fails("num_processes=2 timeout=5 output=some", "output", NULL);
}

Test(syntax, help_text_documents_every_option)
{
    const char *names[] = {"num_accelerators", "accelerator_type", "num_processes", "timeout",
                           "output", "result", "check", "experiment", "run_name", "tracking",
                           "gpus", "gpu_type", "None", "rank0", "10800", NULL};
    for (int i = 0; names[i]; i++)
        cr_assert_not_null(strstr(dk_dist_doc, names[i]), "help lacks %s", names[i]);
}

Test(syntax, error_message_is_truncated_not_overflowed)
{
    char small[16];
    memset(small, 'x', sizeof small);
    int rc = dk_dist_opts_parse("nonsense_option=1", &opts, small, sizeof small);
    cr_assert_eq(rc, -1);
    cr_assert_eq(strlen(small), sizeof small - 1);
}

Test(dist_opts, sizes_parse_with_binary_suffixes)
{
    unsigned long long v;
    cr_assert(dk_dist_opts_parse_size("4096", &v) && v == 4096);
    cr_assert(dk_dist_opts_parse_size("64k", &v) && v == 64 << 10);
    cr_assert(dk_dist_opts_parse_size("1M", &v) && v == 1 << 20);
    cr_assert(dk_dist_opts_parse_size("2GiB", &v) && v == 2ULL << 30);
    cr_assert(dk_dist_opts_parse_size("1GB", &v) && v == 1ULL << 30);
    cr_assert(!dk_dist_opts_parse_size("", &v));
    cr_assert(!dk_dist_opts_parse_size("-1", &v));
    cr_assert(!dk_dist_opts_parse_size("1X", &v));
    cr_assert(!dk_dist_opts_parse_size("99999999999T", &v));
}

Test(dist_opts, log_cap_takes_a_size_and_defaults_to_not_given)
{
    dk_dist_opts_t o;
    char err[512];
    cr_assert_eq(dk_dist_opts_parse("num_processes=2", &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(o.log_cap, 0);
    cr_assert_eq(dk_dist_opts_parse("log_cap=64M", &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(o.log_cap, 64ULL << 20);
    cr_assert_eq(dk_dist_opts_parse("log_cap='1G'", &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(o.log_cap, 1ULL << 30);
    cr_assert_eq(dk_dist_opts_parse("log_cap=1048576", &o, err, sizeof err), 0, "%s", err);
    cr_assert_eq(o.log_cap, 1ULL << 20);
}

Test(dist_opts, a_bad_log_cap_is_refused_naming_what_is_accepted)
{
    dk_dist_opts_t o;
    char err[512];
    const char *bad[] = {"log_cap=lots", "log_cap=-1", "log_cap=100", "log_cap=None", "log_cap=1Q"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(dk_dist_opts_parse(bad[i], &o, err, sizeof err), -1, "%s", bad[i]);
        cr_assert(strstr(err, "log_cap must be a size") != NULL, "%s", err);
    }
}

/* ---- on a Slurm cluster --------------------------------------------------- */

static void no_slurm_env(void)
{
    const char *vars[] = {"DISTKERNEL_NODES", "DISTKERNEL_LAUNCHER", "DISTKERNEL_SLURM_PARTITION",
                          "DISTKERNEL_SLURM_ACCOUNT", "DISTKERNEL_SLURM_QOS",
                          "DISTKERNEL_SLURM_CONSTRAINT", "DISTKERNEL_SLURM_ARGS",
                          "DISTKERNEL_SLURM_EXPORT_SECRETS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

Test(dist_opts, slurm_options_are_read_and_the_world_is_split_over_the_nodes)
{
    no_slurm_env();
    ok("nodes=2 num_processes=8 partition=gpu account=proj1 qos=high constraint=h100&ib "
       "slurm_args='--exclusive --comment=\"a b\"'");
    cr_expect_eq(opts.nodes, 2);
    cr_expect_eq(opts.ranks_per_node, 4);
    cr_expect_eq(opts.launcher, DK_LAUNCHER_SLURM);
    cr_expect_str_eq(opts.partition, "gpu");
    cr_expect_str_eq(opts.account, "proj1");
    cr_expect_str_eq(opts.qos, "high");
    cr_expect_str_eq(opts.constraint, "h100&ib");
    cr_expect_str_eq(opts.slurm_args, "--exclusive --comment=\"a b\"");
}

Test(dist_opts, without_slurm_options_a_run_is_local)
{
    no_slurm_env();
    ok("num_processes=2");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_LOCAL);
    cr_expect_eq(opts.nodes, 0);
    cr_expect_eq(opts.ranks_per_node, 0);
    cr_expect_str_eq(opts.partition, "");
    cr_expect_str_eq(opts.slurm_args, "");
    ok("nodes=1 num_processes=2");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_LOCAL);
    cr_expect_eq(opts.ranks_per_node, 2);
}

Test(dist_opts, more_than_one_node_or_launcher_slurm_means_slurm)
{
    no_slurm_env();
    ok("nodes=2");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_SLURM);
    cr_expect_eq(opts.ranks_per_node, 0);
    ok("launcher=slurm num_accelerators=8");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_SLURM);
    cr_expect_eq(opts.nodes, 0);
    ok("launcher=local");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_LOCAL);
    fails("nodes=2 launcher=local", "nodes=2 needs launcher=slurm", NULL);
    fails("launcher=ssh", "launcher must be local", "or slurm", "'ssh'", NULL);
}

Test(dist_opts, gpus_is_the_total_over_the_nodes_too)
{
    no_slurm_env();
    ok("gpus=16 nodes=2");
    cr_expect_eq(opts.num_accelerators, 16);
    cr_expect_eq(opts.ranks_per_node, 8);
    cr_expect_str_eq(opts.warnings, "FutureWarning: gpus= is deprecated; use num_accelerators=");
}

Test(dist_opts, an_uneven_split_over_the_nodes_is_an_error_that_says_so)
{
    no_slurm_env();
    fails("nodes=3 num_processes=8", "num_processes=8 cannot be split evenly over nodes=3",
          "multiple of 3", NULL);
    fails("nodes=4 num_accelerators=2", "num_accelerators=2 cannot be split evenly over nodes=4",
          NULL);
    fails("nodes=2 accelerator_type=GPU_3xH100", "num_accelerators=3 cannot be split", NULL);
}

Test(dist_opts, bad_slurm_values_are_refused_with_what_is_accepted)
{
    no_slurm_env();
    fails("nodes=0", "nodes must be a whole number of nodes from 1 to 4096", "'0'", NULL);
    fails("nodes=two", "nodes must be", "'two'", NULL);
    fails("nodes=5000", "nodes must be", NULL);
    fails("partition='a b'", "partition must be a Slurm partition name", "without blanks", NULL);
    fails("account=''", "account must be", NULL);
    fails("slurm_args=\"--comment='open\"", "slurm_args must be Slurm options as shell words",
          "quotes closed", NULL);
    fails("bogus=1", "nodes, launcher, partition, account, qos, constraint, slurm_args", NULL);
}

Test(dist_opts, advertise_addr_is_a_numeric_address_of_this_host)
{
    no_slurm_env();
    ok("nodes=2 num_processes=4");
    cr_expect_str_eq(opts.advertise_addr, "");
    ok("nodes=2 num_processes=4 advertise_addr=10.1.2.3");
    cr_expect_str_eq(opts.advertise_addr, "10.1.2.3");
    ok("nodes=2 num_processes=4 advertise_addr=fd00::7");
    cr_expect_str_eq(opts.advertise_addr, "fd00::7");
    fails("nodes=2 num_processes=4 advertise_addr=login1", "advertise_addr must be a numeric",
          "'login1'", NULL);
    fails("advertise_addr=10.0.0", "advertise_addr must be a numeric", NULL);
}

Test(dist_opts, slurm_args_may_not_change_the_jobs_name_or_shape)
{
    no_slurm_env();
    fails("nodes=2 slurm_args='-J exp1'", "slurm_args may not set --job-name (-J)",
          "'-J' does", "find and cancel it", "--comment=", NULL);
    fails("slurm_args='--exclusive --nodes=3'", "may not set --nodes (-N)", "give nodes=N",
          NULL);
    fails("slurm_args='--ntasks 8'", "may not set --ntasks (-n)", "num_processes=", NULL);
    fails("slurm_args=--ntasks-per-node=4", "may not set --ntasks-per-node", NULL);
    /* before anything of the run exists, and from the site's default too */
    setenv("DISTKERNEL_SLURM_ARGS", "--job-name=site", 1);
    fails("num_processes=2", "DISTKERNEL_SLURM_ARGS", "may not set --job-name", NULL);
    unsetenv("DISTKERNEL_SLURM_ARGS");
    ok("slurm_args='--exclusive --ntasks-per-core=1 --comment=\"-J x\" --nodelist=node1'");
}

Test(dist_opts, slurm_defaults_come_from_the_environment_and_the_cell_wins)
{
    no_slurm_env();
    setenv("DISTKERNEL_SLURM_PARTITION", "gpu", 1);
    setenv("DISTKERNEL_SLURM_ACCOUNT", "site", 1);
    setenv("DISTKERNEL_SLURM_QOS", "normal", 1);
    setenv("DISTKERNEL_SLURM_CONSTRAINT", "ib", 1);
    setenv("DISTKERNEL_SLURM_ARGS", "--exclusive", 1);
    ok("num_processes=2");
    cr_expect_str_eq(opts.partition, "gpu");
    cr_expect_str_eq(opts.account, "site");
    cr_expect_str_eq(opts.qos, "normal");
    cr_expect_str_eq(opts.constraint, "ib");
    cr_expect_str_eq(opts.slurm_args, "--exclusive");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_LOCAL);
    ok("partition=debug slurm_args='--mem=0'");
    cr_expect_str_eq(opts.partition, "debug");
    cr_expect_str_eq(opts.slurm_args, "--mem=0");
    cr_expect_str_eq(opts.account, "site");

    setenv("DISTKERNEL_NODES", "2", 1);
    ok("num_processes=4");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_SLURM);
    cr_expect_eq(opts.ranks_per_node, 2);
    ok("nodes=1 num_processes=4");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_LOCAL);
    unsetenv("DISTKERNEL_NODES");
    setenv("DISTKERNEL_LAUNCHER", "slurm", 1);
    ok("num_processes=4");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_SLURM);
    ok("launcher=local num_processes=4");
    cr_expect_eq(opts.launcher, DK_LAUNCHER_LOCAL);
}

Test(dist_opts, a_wrong_environment_default_names_the_variable)
{
    no_slurm_env();
    setenv("DISTKERNEL_LAUNCHER", "ssh", 1);
    fails("num_processes=2", "the environment variable DISTKERNEL_LAUNCHER",
          "launcher must be local", NULL);
    unsetenv("DISTKERNEL_LAUNCHER");
    setenv("DISTKERNEL_NODES", "0", 1);
    fails("", "DISTKERNEL_NODES", "nodes must be", NULL);
}

Test(dist_opts, a_world_that_does_not_fit_distkernel_nodes_names_the_variable)
{
    no_slurm_env();
    setenv("DISTKERNEL_NODES", "2", 1);
    fails("num_processes=3", "num_processes=3 cannot be split evenly over nodes=2 (the default "
          "from DISTKERNEL_NODES=2)", "use a multiple of 2, or a number of nodes that divides "
          "3 (nodes=1 or nodes=3)", "give nodes= in the cell (it wins over DISTKERNEL_NODES)",
          "change DISTKERNEL_NODES", NULL);
    setenv("DISTKERNEL_NODES", "8", 1);
    fails("num_accelerators=12", "num_accelerators=12 cannot be split evenly over nodes=8 (the "
          "default from DISTKERNEL_NODES=8)", "(nodes=6 or nodes=12)", NULL);
    /* nodes= in the cell wins, and its own mistake names no variable */
    ok("nodes=3 num_processes=3");
    cr_assert(!opts.nodes_from_env);
    fails("nodes=2 num_processes=3", "cannot be split evenly over nodes=2: ", NULL);
    cr_assert_null(strstr(err, "DISTKERNEL_NODES"), "%s", err);
    unsetenv("DISTKERNEL_NODES");
}

Test(dist_opts, the_help_lists_the_slurm_options_and_their_variables)
{
    const char *want[] = {"nodes=N", "launcher=local|slurm", "partition=P", "slurm_args=",
                          "DISTKERNEL_SLURM_PARTITION", "DISTKERNEL_NODES", "DISTKERNEL_LAUNCHER",
                          "DISTKERNEL_SLURM_ARGS", "split evenly"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        cr_expect(strstr(dk_dist_doc, want[i]), "the help lacks %s", want[i]);
}

Test(values, idle_timeout_for_started_ranks)
{
    ok("");
    cr_assert_float_eq(opts.idle_timeout_s, DK_DEFAULT_IDLE_TIMEOUT_S, 1e-9);
    cr_assert(!opts.idle_given);
    ok("num_processes=2 idle_timeout=90");
    cr_assert_float_eq(opts.idle_timeout_s, 90.0, 1e-9);
    cr_assert(opts.idle_given);
    ok("idle_timeout=None");
    cr_assert_float_eq(opts.idle_timeout_s, 0.0, 1e-9);
    cr_assert(opts.idle_given);
    fails("idle_timeout=0", "idle_timeout", "greater than 0", "None", NULL);
    fails("idle_timeout='5'", "idle_timeout", NULL);
    fails("idle_timeout=soon", "idle_timeout", "soon", NULL);
}

/* restarts= (issue 36): a whole number from 0 to DK_RESTARTS_MAX, 0 by default. */
Test(values, restarts_is_a_small_whole_number)
{
    ok("");
    cr_assert_eq(opts.restarts, 0);
    ok("num_processes=4 restarts=3");
    cr_assert_eq(opts.restarts, 3);
    ok("restarts=0");
    cr_assert_eq(opts.restarts, 0);
    ok("restarts=100");
    cr_assert_eq(opts.restarts, DK_RESTARTS_MAX);
    fails("restarts=101", "restarts", "0 to 100", "101", NULL);
    fails("restarts=-1", "restarts", "whole number", NULL);
    fails("restarts=1.5", "restarts", "1.5", NULL);
    fails("restarts='2'", "restarts", NULL);
    fails("restarts=None", "restarts", NULL);
    fails("restarts=", "restarts", NULL);
    cr_expect(strstr(dk_dist_doc, "restarts=K"), "the help lacks restarts=");
}

Test(values, parse_onto_keeps_what_the_text_leaves_out)
{
    ok("num_processes=2 output=rank0 timeout=5 experiment=e");
    cr_assert_eq(dk_dist_opts_parse_onto("timeout=9 result=r", &opts, err, sizeof err), 0, "%s",
                 err);
    cr_assert_eq(opts.num_processes, 2);
    cr_assert_eq(opts.output, DK_OUTPUT_RANK0);
    cr_assert_float_eq(opts.timeout_s, 9.0, 1e-9);
    cr_assert_str_eq(opts.result_name, "r");
    cr_assert_str_eq(opts.experiment, "e");
    cr_assert_eq(dk_dist_opts_parse_onto("output=nope", &opts, err, sizeof err), -1);
}

/* Warm start (distributed/dk_dist_warm.h): on by default, warm=False turns it
 * off; warm_modules= takes module names only. */
Test(warm, warm_start_is_on_unless_turned_off)
{
    ok("");
    cr_assert(opts.warm);
    cr_assert_str_eq(opts.warm_modules, "");
    ok("warm=False");
    cr_assert(!opts.warm);
    ok("warm=True warm_modules=transformers,numpy.linalg");
    cr_assert(opts.warm);
    cr_assert_str_eq(opts.warm_modules, "transformers,numpy.linalg");
}

Test(warm, warm_modules_must_be_module_names)
{
    fails("warm_modules=\"os; import evil\"", "warm_modules", "module names separated by commas",
          NULL);
    fails("warm=maybe", "warm", NULL);
}

/* Secrets on Slurm's nodes (runtime/slurm/dk_slurm.h, dk_slurm_secret_name): none
 * unless listed, by export_secrets= or DISTKERNEL_SLURM_EXPORT_SECRETS. */
Test(dist_opts, export_secrets_lists_names_and_has_a_default_from_the_environment)
{
    no_slurm_env();
    ok("nodes=2 num_processes=2");
    cr_expect_str_eq(opts.export_secrets, "");
    ok("nodes=2 num_processes=2 export_secrets=WANDB_API_KEY,HF_TOKEN");
    cr_expect_str_eq(opts.export_secrets, "WANDB_API_KEY,HF_TOKEN");
    setenv("DISTKERNEL_SLURM_EXPORT_SECRETS", "HF_TOKEN", 1);
    ok("nodes=2 num_processes=2");
    cr_expect_str_eq(opts.export_secrets, "HF_TOKEN");
    ok("nodes=2 num_processes=2 export_secrets=GITHUB_TOKEN");
    cr_expect_str_eq(opts.export_secrets, "GITHUB_TOKEN", "the cell's wins");
    unsetenv("DISTKERNEL_SLURM_EXPORT_SECRETS");
    fails("export_secrets='A B'", "export_secrets", "variable names separated by commas", NULL);
}
