/*
 * The stop ladder (runtime/proc/dk_stop.h) on a clock the test turns by hand: which
 * signal falls due when, escalation when the target ignores a rung, and
 * nothing once the target is gone.
 */
#include <criterion/criterion.h>

#include <signal.h>

#include "dk_stop.h"

Test(ladder, begins_with_sigint_at_once)
{
    dk_stop_t s = dk_stop_ladder(2.0);
    cr_assert_not(dk_stop_begun(&s));
    cr_assert_lt(dk_stop_next_at(&s), 0, "nothing is due before the stop begins");
    cr_assert_eq(dk_stop_due(&s, 100.0), 0);
    cr_assert_eq(dk_stop_begin(&s, 10.0), SIGINT);
    cr_assert(dk_stop_begun(&s));
}

Test(ladder, escalates_one_grace_apart_while_the_target_stays)
{
    dk_stop_t s = dk_stop_ladder(2.0);
    dk_stop_begin(&s, 10.0);
    cr_assert_float_eq(dk_stop_next_at(&s), 12.0, 1e-9);
    cr_assert_eq(dk_stop_due(&s, 11.999), 0, "SIGTERM before the grace is up");
    cr_assert_eq(dk_stop_due(&s, 12.0), SIGTERM);
    cr_assert_eq(dk_stop_due(&s, 12.5), 0, "each rung is handed out once");
    cr_assert_float_eq(dk_stop_next_at(&s), 14.0, 1e-9);
    cr_assert_eq(dk_stop_due(&s, 13.9), 0);
    cr_assert_eq(dk_stop_due(&s, 14.0), SIGKILL);
    cr_assert_lt(dk_stop_next_at(&s), 0, "nothing after SIGKILL");
    cr_assert_eq(dk_stop_due(&s, 1000.0), 0);
}

Test(ladder, a_late_caller_gets_every_overdue_rung_in_order)
{
    dk_stop_t s = dk_stop_ladder(1.0);
    dk_stop_begin(&s, 0.0);
    cr_assert_eq(dk_stop_due(&s, 5.0), SIGTERM);
    cr_assert_eq(dk_stop_due(&s, 5.0), SIGKILL);
    cr_assert_eq(dk_stop_due(&s, 5.0), 0);
}

Test(ladder, rungs_are_timed_from_the_start_not_from_a_late_rung)
{
    dk_stop_t s = dk_stop_ladder(2.0);
    dk_stop_begin(&s, 0.0);
    cr_assert_eq(dk_stop_due(&s, 3.5), SIGTERM);     /* looked 1.5 late */
    cr_assert_eq(dk_stop_due(&s, 3.9), 0);
    cr_assert_eq(dk_stop_due(&s, 4.0), SIGKILL, "due at start + 2 graces, as before");
}

Test(ladder, a_second_begin_changes_nothing)
{
    dk_stop_t s = dk_stop_ladder(2.0);
    cr_assert_eq(dk_stop_begin(&s, 10.0), SIGINT);
    cr_assert_eq(dk_stop_begin(&s, 11.0), 0, "the first start decides the schedule");
    cr_assert_eq(dk_stop_due(&s, 12.0), SIGTERM);
}

Test(ladder, nothing_is_due_once_the_target_is_gone)
{
    dk_stop_t s = dk_stop_ladder(2.0);
    dk_stop_begin(&s, 0.0);
    dk_stop_gone(&s);
    cr_assert_lt(dk_stop_next_at(&s), 0);
    cr_assert_eq(dk_stop_due(&s, 100.0), 0);
    dk_stop_t t = dk_stop_ladder(2.0);
    dk_stop_gone(&t);
    cr_assert_eq(dk_stop_begin(&t, 0.0), 0, "a stop of what is gone sends nothing");
}

Test(custom, a_guard_ladder_is_sigterm_then_sigkill)
{
    static const int two[] = {SIGTERM, SIGKILL};
    dk_stop_t s = dk_stop_custom(two, 2, 3.0);
    cr_assert_eq(dk_stop_begin(&s, 1.0), SIGTERM);
    cr_assert_eq(dk_stop_due(&s, 3.9), 0);
    cr_assert_eq(dk_stop_due(&s, 4.0), SIGKILL);
    cr_assert_eq(dk_stop_due(&s, 100.0), 0);
}

Test(custom, too_many_rungs_are_cut_to_the_maximum)
{
    int many[DK_STOP_MAX_SIGNALS + 3];
    for (int i = 0; i < DK_STOP_MAX_SIGNALS + 3; i++)
        many[i] = i + 1;
    dk_stop_t s = dk_stop_custom(many, DK_STOP_MAX_SIGNALS + 3, 1.0);
    cr_assert_eq(s.nsignals, DK_STOP_MAX_SIGNALS);
    cr_assert_eq(dk_stop_begin(&s, 0.0), 1);
    for (int i = 1; i < DK_STOP_MAX_SIGNALS; i++)
        cr_assert_eq(dk_stop_due(&s, 100.0), i + 1);
    cr_assert_eq(dk_stop_due(&s, 100.0), 0);
}
