/*
 * Node names written as Slurm writes them (runtime/slurm/dk_hostlist.h): the text
 * for small sets, and, at every size, that dk_slurm_hostlist_expand reads it
 * back to the same names.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_hostlist.h"
#include "dk_slurm.h"

static void expect(const char *const *names, size_t n, const char *want)
{
    char *got = dk_hostlist_compress(names, n);
    cr_assert_not_null(got);
    cr_expect_str_eq(got, want);
    free(got);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *) a, *(char *const *) b);
}

/* Compress NAMES[0..N), expand the result, and compare both as sorted sets. */
static void round_trip(char **names, size_t n)
{
    char *list = dk_hostlist_compress((const char *const *) names, n);
    cr_assert_not_null(list);
    char **back = NULL, err[256] = "";
    size_t count = 0;
    cr_assert_eq(dk_slurm_hostlist_expand(list, &back, &count, err, sizeof err), 0, "%s: %s",
                 list, err);
    char **want = malloc(n * sizeof *want);
    memcpy(want, names, n * sizeof *want);
    qsort(want, n, sizeof *want, name_cmp);
    size_t unique = 0;
    for (size_t i = 0; i < n; i++)
        if (!unique || strcmp(want[unique - 1], want[i]))
            want[unique++] = want[i];
    qsort(back, count, sizeof *back, name_cmp);
    cr_assert_eq(count, unique, "%s expands to %zu names, not %zu", list, count, unique);
    for (size_t i = 0; i < count; i++)
        cr_assert_str_eq(back[i], want[i], "%s", list);
    free(want);
    dk_slurm_names_free(back, count);
    free(list);
}

static char **numbered(const char *fmt, size_t n, int first)
{
    char **v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, fmt, (int) i + first);
        v[i] = strdup(name);
    }
    return v;
}

static void free_names(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

Test(hostlist, one_name_is_itself)
{
    const char *names[] = {"node1"};
    expect(names, 1, "node1");
}

Test(hostlist, no_names_is_empty)
{
    expect(NULL, 0, "");
}

Test(hostlist, a_run_of_numbers_is_a_range)
{
    const char *names[] = {"node1", "node2", "node3", "node5"};
    expect(names, 4, "node[1-3,5]");
}

Test(hostlist, names_are_sorted_and_said_once)
{
    const char *names[] = {"node16", "node3", "node1", "node2", "node3", "node16"};
    expect(names, 6, "node[1-3,16]");
}

Test(hostlist, mixed_names_each_get_their_bracket)
{
    const char *names[] = {"login5", "gpu-a01", "gpu-a02", "gpu-a03"};
    expect(names, 4, "gpu-a[01-03],login5");
}

Test(hostlist, a_name_without_number_is_written_whole)
{
    const char *names[] = {"login", "node2", "node1", "localhost"};
    expect(names, 4, "localhost,login,node[1-2]");
}

Test(hostlist, the_number_may_be_followed_by_text)
{
    const char *names[] = {"rack1-b", "rack2-b", "rack2-c"};
    expect(names, 3, "rack[1-2]-b,rack2-c");
}

Test(hostlist, the_width_of_leading_zeros_is_kept)
{
    const char *names[] = {"n08", "n09", "n10", "n11"};
    expect(names, 4, "n[08-11]");
    const char *across[] = {"n9", "n10", "n11"};
    expect(across, 3, "n[9-11]");
}

Test(hostlist, a_different_width_starts_a_range_of_its_own)
{
    const char *names[] = {"node01", "node1"};
    expect(names, 2, "node[1,01]");
    const char *mixed[] = {"n1", "n02"};
    expect(mixed, 2, "n[1,02]");
}

Test(hostlist, only_the_last_number_is_bracketed)
{
    const char *names[] = {"r1n1", "r1n2", "r2n1"};
    expect(names, 3, "r1n[1-2],r2n1");
}

Test(hostlist, a_number_too_long_to_expand_is_part_of_the_name)
{
    const char *names[] = {"n1234567890", "n1234567891"};
    expect(names, 2, "n1234567890,n1234567891");
}

Test(hostlist, round_trips_through_the_expander_at_every_size)
{
    size_t sizes[] = {1, 2, 8, 9, 64, 256, 1024, 4096};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        char **v = numbered("node%d", sizes[k], 1);
        round_trip(v, sizes[k]);
        free_names(v, sizes[k]);
        char **padded = numbered("gpu-a%04d", sizes[k], 0);
        round_trip(padded, sizes[k]);
        free_names(padded, sizes[k]);
    }
}

Test(hostlist, round_trips_with_holes_repeats_and_mixed_names)
{
    size_t n = 4096;
    char **v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) {
        char name[64];
        switch (i % 5) {
        case 0: snprintf(name, sizeof name, "node%zu", (i * 7919) % 3001); break;
        case 1: snprintf(name, sizeof name, "gpu-a%02zu", i % 150); break;
        case 2: snprintf(name, sizeof name, "rack%zu-b", i % 40 + (i % 3 ? 0 : 100)); break;
        case 3: snprintf(name, sizeof name, "login%zu", i % 2); break;
        default: snprintf(name, sizeof name, "%s", i % 2 ? "localhost" : "head"); break;
        }
        v[i] = strdup(name);
    }
    round_trip(v, n);
    free_names(v, n);
}

Test(hostlist, sixteen_nodes_are_one_short_list)
{
    char **v = numbered("node%d", 16, 1);
    char *list = dk_hostlist_compress((const char *const *) v, 16);
    cr_assert_str_eq(list, "node[1-16]");
    free(list);
    free_names(v, 16);
}
