/*
 * dk_hostlist: a set of host names as one Slurm host list. See the header.
 *
 * Each name splits at its last run of digits into head, number and tail
 * ("gpu-a" 01 ""; "rack" 2 "-b"). Sorted by head, tail and number, the names
 * that share head and tail stand side by side, and a bracket holds them as
 * ranges. A range goes on while the next number is one more and is written
 * with the width of the range's first ("01-03"), since that is the width
 * dk_slurm_hostlist_expand gives every number of the range: "9-10" reads
 * back as node9 node10, "08-10" as node08 node09 node10, and "node1" beside
 * "node01" starts a range of its own ("node[1,01]"). Numbers of more than 9
 * digits are not numbers to the expander, so such a name is written whole.
 */
#include "dk_hostlist.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIGITS_MAX 9

typedef struct {
    const char *name;
    size_t head;      /* bytes before the number; the whole name when it has none */
    size_t digits;    /* bytes of the number, 0 when it has none */
    long value;
} entry_t;

static entry_t split(const char *name)
{
    entry_t e = {.name = name, .head = strlen(name)};
    size_t end = e.head;
    while (end > 0 && !isdigit((unsigned char) name[end - 1]))
        end--;
    size_t start = end;
    while (start > 0 && isdigit((unsigned char) name[start - 1]))
        start--;
    if (end == start || end - start > DIGITS_MAX)
        return e;
    e.head = start;
    e.digits = end - start;
    for (size_t i = start; i < end; i++)
        e.value = e.value * 10 + (name[i] - '0');
    return e;
}

static const char *tail(const entry_t *e) { return e->name + e->head + e->digits; }

/* Head, then tail, then whether there is a number: the names of one bracket. */
static int group_cmp(const entry_t *a, const entry_t *b)
{
    size_t n = a->head < b->head ? a->head : b->head;
    int c = memcmp(a->name, b->name, n);
    if (c || a->head != b->head)
        return c ? c : (a->head < b->head ? -1 : 1);
    if ((c = strcmp(tail(a), tail(b))))
        return c;
    return (a->digits > 0) - (b->digits > 0);
}

static int entry_cmp(const void *pa, const void *pb)
{
    const entry_t *a = pa, *b = pb;
    int c = group_cmp(a, b);
    if (c)
        return c;
    if (a->value != b->value)
        return a->value < b->value ? -1 : 1;
    if (a->digits != b->digits)
        return a->digits < b->digits ? -1 : 1;
    return 0;
}

/* A growing string; NULL text once out of memory. */
typedef struct {
    char *text;
    size_t len, cap;
} out_t;

static void put(out_t *o, const char *s, size_t n)
{
    if (!o->text)
        return;
    if (o->len + n + 1 > o->cap) {
        size_t cap = (o->len + n + 1) * 2;
        char *grown = realloc(o->text, cap);
        if (!grown) {
            free(o->text);
            o->text = NULL;
            return;
        }
        o->text = grown;
        o->cap = cap;
    }
    memcpy(o->text + o->len, s, n);
    o->len += n;
    o->text[o->len] = '\0';
}

/* Whether B's number, written with WIDTH (of the range's first), is B's. */
static bool continues(const entry_t *a, const entry_t *b, size_t width)
{
    char digits[DIGITS_MAX + 2];
    int n = snprintf(digits, sizeof digits, "%0*ld", (int) width, b->value);
    return b->value == a->value + 1 && (size_t) n == b->digits &&
           !memcmp(digits, b->name + b->head, b->digits);
}

/* The ranges of V[0..N), names of one bracket, as "1-3,5". */
static void ranges(out_t *o, const entry_t *v, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j + 1 < n && continues(&v[j], &v[j + 1], v[i].digits))
            j++;
        if (i)
            put(o, ",", 1);
        put(o, v[i].name + v[i].head, v[i].digits);
        if (j > i) {
            put(o, "-", 1);
            put(o, v[j].name + v[j].head, v[j].digits);
        }
        i = j + 1;
    }
}

char *dk_hostlist_compress(const char *const *names, size_t n)
{
    out_t o = {.text = malloc(64), .cap = 64};
    entry_t *v = n ? malloc(n * sizeof *v) : NULL;
    if (!o.text || (n && !v)) {
        free(o.text);
        free(v);
        return NULL;
    }
    o.text[0] = '\0';
    if (n == 0)
        return o.text;
    for (size_t i = 0; i < n; i++)
        v[i] = split(names[i]);
    qsort(v, n, sizeof *v, entry_cmp);
    /* Without repeats: equal entries are equal names. */
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (!u || entry_cmp(&v[u - 1], &v[i]))
            v[u++] = v[i];
    for (size_t i = 0; i < u;) {
        size_t j = i + 1;
        while (j < u && !group_cmp(&v[i], &v[j]))
            j++;
        if (o.len)
            put(&o, ",", 1);
        if (j - i == 1) {
            put(&o, v[i].name, strlen(v[i].name));
        } else {
            put(&o, v[i].name, v[i].head);
            put(&o, "[", 1);
            ranges(&o, v + i, j - i);
            put(&o, "]", 1);
            put(&o, tail(&v[i]), strlen(tail(&v[i])));
        }
        i = j;
    }
    free(v);
    return o.text;
}
