/*
 * The settings table and its one reader of numbers (runtime/base/dk_setting.h):
 * the table sorted and findable, a number's value, its default when unset,
 * and one line in the log (once) with the default kept for each kind of bad
 * value.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dk_log.h"
#include "dk_setting.h"

static int log_pipe[2];

static void setup(void)
{
    cr_assert_eq(pipe2(log_pipe, O_NONBLOCK), 0);
    dk_log_to(log_pipe[1]);
}

static void teardown(void)
{
    dk_log_to(2);
    close(log_pipe[0]);
    close(log_pipe[1]);
}

/* What was logged since the last call ("" if nothing). */
static const char *logged(void)
{
    static char buf[8192];
    ssize_t n = read(log_pipe[0], buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = '\0';
    return buf;
}

TestSuite(setting, .init = setup, .fini = teardown);

Test(setting, the_table_is_sorted_and_every_row_is_found)
{
    for (size_t i = 0; i < dk_settings_count(); i++) {
        const dk_setting_t *s = dk_settings_at(i);
        cr_assert(strncmp(s->name, "DISTKERNEL_", 11) == 0, "%s", s->name);
        if (i > 0)
            cr_assert_lt(strcmp(dk_settings_at(i - 1)->name, s->name), 0, "%s", s->name);
        cr_assert_eq(dk_setting_find(s->name), s);
        if (s->type != DK_SETTING_TEXT)
            cr_assert(s->least <= s->value || s->value == -1,
                      "%s: its default is outside its range", s->name);
    }
    cr_assert_null(dk_setting_find("DISTKERNEL_NO_SUCH"));
    cr_assert_null(dk_settings_at(dk_settings_count()));
}

Test(setting, unset_or_empty_is_the_default_silently)
{
    unsetenv("DISTKERNEL_SLURM_HEARTBEAT");
    cr_assert_eq(dk_setting_number("DISTKERNEL_SLURM_HEARTBEAT"), 10);
    setenv("DISTKERNEL_SLURM_HEARTBEAT", "", 1);
    cr_assert_eq(dk_setting_number("DISTKERNEL_SLURM_HEARTBEAT"), 10);
    cr_assert_str_eq(logged(), "");
}

Test(setting, a_value_in_range_is_taken)
{
    setenv("DISTKERNEL_SLURM_HEARTBEAT", "3", 1);
    cr_assert_eq(dk_setting_number("DISTKERNEL_SLURM_HEARTBEAT"), 3);
    setenv("DISTKERNEL_MLFLOW_TIMEOUT", "0.5", 1);
    cr_assert_eq(dk_setting_number("DISTKERNEL_MLFLOW_TIMEOUT"), 0.5);
    setenv("DISTKERNEL_MAX_MESSAGE_MB", "2047", 1);
    cr_assert_eq(dk_setting_number("DISTKERNEL_MAX_MESSAGE_MB"), 2047);
    cr_assert_str_eq(logged(), "");
}

Test(setting, a_bad_value_is_one_line_naming_it_and_the_default_is_kept)
{
    static const char *const bad[] = {"abc", "3s", "1", "3601", "-5", "nan", "inf", " "};
    const dk_setting_t *s = dk_setting_find("DISTKERNEL_SLURM_HEARTBEAT");
    double d;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_assert_not(dk_setting_parse(s, bad[i], &d), "'%s' taken", bad[i]);
    setenv("DISTKERNEL_SLURM_HEARTBEAT", "3s", 1);
    cr_assert_eq(dk_setting_number("DISTKERNEL_SLURM_HEARTBEAT"), 10);
    cr_assert_str_eq(logged(), "[distkernel] DISTKERNEL_SLURM_HEARTBEAT is '3s', which is not a "
                               "number from 2 to 3600: 10 is used (distkernel config lists the "
                               "settings)\n");
    setenv("DISTKERNEL_SLURM_HEARTBEAT", "1", 1);
    cr_assert_eq(dk_setting_number("DISTKERNEL_SLURM_HEARTBEAT"), 10, "below its range");
    cr_assert_str_eq(logged(), "", "said once a process");
}

Test(setting, a_whole_number_takes_no_fraction)
{
    setenv("DISTKERNEL_MLFLOW_START_TIMEOUT", "2.5", 1);
    cr_assert_eq(dk_setting_number("DISTKERNEL_MLFLOW_START_TIMEOUT"), 60);
    cr_assert(strstr(logged(), "which is not a whole number from 1 to 3600: 60 is used"));
    setenv("DISTKERNEL_MLFLOW_START_TIMEOUT", "300", 1);
    cr_assert_eq(dk_setting_number("DISTKERNEL_MLFLOW_START_TIMEOUT"), 300);
}

Test(setting, a_text_or_unknown_name_is_a_bug_said_in_the_log)
{
    cr_assert_eq(dk_setting_number("DISTKERNEL_LOG_DIR"), 0);
    cr_assert(strstr(logged(), "DISTKERNEL_LOG_DIR is not a number in the settings table"));
    cr_assert_eq(dk_setting_number("DISTKERNEL_NO_SUCH"), 0);
    cr_assert(strstr(logged(), "DISTKERNEL_NO_SUCH is not a number"));
}
