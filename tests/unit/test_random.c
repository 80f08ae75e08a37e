/*
 * runtime/base/dk_random.h: names that do not collide, from getrandom or,
 * where it fails, from the clock, the pid and a counter.
 */
#include "dk_random.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* N names of NBYTES bytes made by MAKE, all lowercase hex, all different. */
static void all_differ(void (*make)(char *, size_t), size_t nbytes)
{
    enum { N = 2000 };
    char (*names)[65] = calloc(N, sizeof *names);
    cr_assert_not_null(names);
    for (int i = 0; i < N; i++) {
        make(names[i], nbytes);
        cr_assert_eq(strlen(names[i]), 2 * nbytes);
        cr_assert_eq(strspn(names[i], "0123456789abcdef"), 2 * nbytes, "%s", names[i]);
    }
    qsort(names, N, sizeof *names, cmp);
    for (int i = 1; i < N; i++)
        cr_assert_str_neq(names[i - 1], names[i], "a name made twice");
    free(names);
}

static void from_the_clock(char *out, size_t nbytes)
{
    unsigned char b[32];
    dk_clock_bytes(b, nbytes);
    for (size_t i = 0; i < nbytes; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

Test(random, names_are_hex_and_never_repeat)
{
    all_differ(dk_unique_hex, 6);      /* a Slurm job's name */
    all_differ(dk_unique_hex, 8);      /* a run's id */
}

/* Where getrandom fails: never a constant (a run's id once fell back to
 * 5a5a..., which gave every run the same status display). */
Test(random, without_random_bytes_names_still_differ)
{
    all_differ(from_the_clock, 6);
    all_differ(from_the_clock, 8);
}

Test(random, a_long_name_is_cut_at_32_bytes)
{
    char out[80];
    dk_unique_hex(out, 40);
    cr_assert_eq(strlen(out), 64);
}
