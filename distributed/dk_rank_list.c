/*
 * dk_rank_list: parsing "0,8,16-31". See the header.
 *
 * Digits are read by hand rather than with strtol, which would take "+3",
 * " 3" and "0x1f" as ranks; a number stops growing once it is past
 * DK_RANK_LIST_RANKS_MAX, so no length of digits overflows, and it is then
 * refused as past any run.
 */
#include "dk_rank_list.h"
#include "dk_err.h"

#include <ctype.h>
#include <string.h>

#define EXAMPLE "like 0,8,16-31"

/* A whole number at *PP, which is moved past it; false (nothing moved) when
 * no digit is there. */
static bool number(const char **pp, long *out)
{
    const char *p = *pp;
    if (!isdigit((unsigned char)*p))
        return false;
    long v = 0;
    for (; isdigit((unsigned char)*p); p++)
        if (v <= DK_RANK_LIST_RANKS_MAX)
            v = v * 10 + (*p - '0');
    *pp = p;
    *out = v;
    return true;
}

/* The item from START to END (a comma or the end), blanks around it
 * dropped, into *FIRST and *LAST; -1 with ERR when it is no rank or range. */
static int item(const char *start, const char *end, long *first, long *last, char *err,
                size_t errlen)
{
    while (start < end && isspace((unsigned char)*start))
        start++;
    while (end > start && isspace((unsigned char)end[-1]))
        end--;
    int len = (int)(end - start);
    if (len == 0) {
        dk_set_err(err, errlen, "an empty item (a comma too many?); write ranks and ranges "
                   "separated by single commas, " EXAMPLE);
        return -1;
    }
    const char *p = start;
    bool ok = number(&p, first);
    *last = *first;
    if (ok && *p == '-') {
        p++;
        ok = number(&p, last);
    }
    if (!ok || p != end) {
        dk_set_err(err, errlen, "'%.*s' is not a rank nor a range of ranks; write ranks as "
                   "whole numbers from 0, and ranges as FIRST-LAST, " EXAMPLE, len, start);
        return -1;
    }
    if (*last < *first) {
        dk_set_err(err, errlen, "the range %.*s runs backwards; write it from its first rank "
                   "to its last: %ld-%ld", len, start, *last, *first);
        return -1;
    }
    if (*last >= DK_RANK_LIST_RANKS_MAX) {
        dk_set_err(err, errlen, "'%.*s' is past the ranks of any run (a run has at most %d "
                   "ranks, 0-%d)", len, start, DK_RANK_LIST_RANKS_MAX,
                   DK_RANK_LIST_RANKS_MAX - 1);
        return -1;
    }
    return 0;
}

/* ERR for the item FIRST-LAST, whose last rank is past WORLD's. */
static void past_world(long first, long last, int world, char *err, size_t errlen)
{
    char ranks[48], fix[48];
    if (world == 1) {
        snprintf(ranks, sizeof ranks, "its 1 rank is 0");
        snprintf(fix, sizeof fix, "list rank 0 only");
    } else {
        snprintf(ranks, sizeof ranks, "its %d ranks are 0-%d", world, world - 1);
        snprintf(fix, sizeof fix, "list ranks from 0 to %d", world - 1);
    }
    if (first == last)
        dk_set_err(err, errlen, "rank %ld is not in this run (%s); %s", last, ranks, fix);
    else
        dk_set_err(err, errlen, "the range %ld-%ld goes past this run's last rank, %d (%s); %s",
                   first, last, world - 1, ranks, fix);
}

int dk_rank_list_parse(const char *text, int world, bool *shown, char *err, size_t errlen)
{
    if (world > 0 && shown)
        memset(shown, 0, (size_t)world * sizeof *shown);
    const char *p = text ? text : "";
    while (isspace((unsigned char)*p))
        p++;
    if (!*p) {
        dk_set_err(err, errlen, "no rank is listed; write ranks and ranges separated by "
                   "commas, " EXAMPLE);
        return -1;
    }
    int count = 0;
    for (;;) {
        const char *end = p + strcspn(p, ",");
        long first, last;
        if (item(p, end, &first, &last, err, errlen) < 0)
            return -1;
        if (world > 0 && last >= world) {
            past_world(first, last, world, err, errlen);
            return -1;
        }
        for (long r = first; world > 0 && r <= last; r++) {
            count += !shown[r];
            shown[r] = true;
        }
        if (!*end)
            break;
        p = end + 1;
    }
    return count;
}
