/*
 * dk_stacks: the ranks grouped by where they are. See the header.
 *
 * Each rank is judged once, when it is added (dk_stack_fold, in
 * dk_stacks_fold.c): its signature is hashed into an open-addressing table of
 * groups, and equal signatures (compared whole, not only by hash) share a
 * group. Nothing of the frames is kept but the dump itself, for stacks.txt, so
 * memory is the dumps (each at most DK_STACKS_MAX_DUMP) and a few words per
 * rank and group. An index by rank refuses a rank added twice and finds a
 * rank's dump when writing, without a search over the ranks.
 *
 * The order is made when asked for: groups by size, ties by their lowest
 * rank. Summary lines are built with open_memstream; the fields are bounded
 * where they are made (dk_stack_fold, the rank runs), so the lines are too.
 */
#include "dk_stacks.h"

#include "dk_lost.h"
#include "dk_utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LABEL_RANKS 64      /* bytes of a group's rank runs shown */
#define FLIGHT_RANKS 28     /* bytes of the runs of ranks behind shown */
#define FLIGHT_TEXT 256     /* room for a group's last collective */
#define FLIGHT_SHOWN 100    /* bytes of it shown (and "…") */
#define LINE_MAX_BYTES 511  /* a summary line's bytes, at most, its newline aside */

typedef struct {
    int rank;
    char *node;
    char *dump;                 /* valid UTF-8, NUL-terminated */
    size_t dropped;             /* bytes of the dump not kept (its head) */
    size_t group;
    dk_flight_t *flight;        /* its last collective; NULL: no flight line */
} rank_t;

typedef struct {
    char *sig;
    uint64_t hash;
    char *call;                 /* NULL: the stack is the cell line itself */
    char *where;
    int *ranks;
    size_t n, cap;
} group_t;

struct dk_stacks_t {
    dk_stacks_is_cell_fn is_cell;
    void *data;
    rank_t *ranks;
    size_t n_ranks, cap_ranks;
    group_t *groups;
    size_t n_groups, cap_groups;
    size_t *at;                 /* at[rank]: its index in ranks + 1; 0: not added */
    size_t at_cap;
    size_t *table;              /* group index + 1; 0 is empty */
    size_t table_cap;           /* a power of two, at least twice n_groups */
};

bool dk_stacks_is_under(void *data, const char *filename)
{
    const char *dir = data;
    return dir && filename && strncmp(filename, dir, strlen(dir)) == 0;
}

dk_stacks_t *dk_stacks_new(dk_stacks_is_cell_fn is_cell, void *data)
{
    dk_stacks_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->is_cell = is_cell;
    self->data = data;
    return self;
}

void dk_stacks_destroy(dk_stacks_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_stacks_t *self = *self_p;
    for (size_t i = 0; i < self->n_ranks; i++) {
        free(self->ranks[i].node);
        free(self->ranks[i].dump);
        free(self->ranks[i].flight);
    }
    for (size_t i = 0; i < self->n_groups; i++) {
        free(self->groups[i].sig);
        free(self->groups[i].call);
        free(self->groups[i].where);
        free(self->groups[i].ranks);
    }
    free(self->ranks);
    free(self->groups);
    free(self->table);
    free(self->at);
    free(self);
    *self_p = NULL;
}

size_t dk_stacks_ranks(const dk_stacks_t *self) { return self ? self->n_ranks : 0; }
size_t dk_stacks_groups(const dk_stacks_t *self) { return self ? self->n_groups : 0; }

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char) *s) * 1099511628211ULL;
    return h;
}

static bool table_grow(dk_stacks_t *self)
{
    size_t cap = self->table_cap ? self->table_cap * 2 : 64;
    size_t *table = calloc(cap, sizeof *table);
    if (!table)
        return false;
    for (size_t g = 0; g < self->n_groups; g++) {
        size_t at = self->groups[g].hash & (cap - 1);
        while (table[at])
            at = (at + 1) & (cap - 1);
        table[at] = g + 1;
    }
    free(self->table);
    self->table = table;
    self->table_cap = cap;
    return true;
}

/* The group of SIG, made (taking CALL and WHERE) when new; SIZE_MAX when
 * memory ran out. */
static size_t group_for(dk_stacks_t *self, char **sig, char **call, char **where)
{
    uint64_t hash = fnv1a(*sig);
    if (2 * (self->n_groups + 1) > self->table_cap && !table_grow(self))
        return SIZE_MAX;
    size_t at = hash & (self->table_cap - 1);
    for (; self->table[at]; at = (at + 1) & (self->table_cap - 1)) {
        group_t *g = &self->groups[self->table[at] - 1];
        if (g->hash == hash && !strcmp(g->sig, *sig))
            return self->table[at] - 1;
    }
    if (self->n_groups == self->cap_groups) {
        size_t cap = self->cap_groups ? 2 * self->cap_groups : 16;
        group_t *groups = realloc(self->groups, cap * sizeof *groups);
        if (!groups)
            return SIZE_MAX;
        self->groups = groups;
        self->cap_groups = cap;
    }
    self->groups[self->n_groups] = (group_t){.sig = *sig, .hash = hash, .call = *call,
                                             .where = *where};
    *sig = *call = *where = NULL;
    self->table[at] = ++self->n_groups;
    return self->n_groups - 1;
}

static bool group_add(group_t *g, int rank)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 4;
        int *ranks = realloc(g->ranks, cap * sizeof *ranks);
        if (!ranks)
            return false;
        g->ranks = ranks;
        g->cap = cap;
    }
    g->ranks[g->n++] = rank;
    return true;
}

int dk_stacks_add(dk_stacks_t *self, int rank, const char *node, const char *dump, size_t len)
{
    if (!self || rank < 0 || rank > DK_STACKS_MAX_RANK || (!dump && len > 0))
        return -1;
    if ((size_t) rank >= self->at_cap) {
        size_t cap = self->at_cap ? self->at_cap : 64;
        while (cap <= (size_t) rank)
            cap *= 2;
        size_t *at = realloc(self->at, cap * sizeof *at);
        if (!at)
            return -1;
        memset(at + self->at_cap, 0, (cap - self->at_cap) * sizeof *at);
        self->at = at;
        self->at_cap = cap;
    }
    if (self->at[rank])
        return -1;
    if (self->n_ranks == self->cap_ranks) {
        size_t cap = self->cap_ranks ? 2 * self->cap_ranks : 16;
        rank_t *ranks = realloc(self->ranks, cap * sizeof *ranks);
        if (!ranks)
            return -1;
        self->ranks = ranks;
        self->cap_ranks = cap;
    }
    size_t dropped = len > DK_STACKS_MAX_DUMP ? len - DK_STACKS_MAX_DUMP : 0;
    size_t text_len;
    rank_t r = {.rank = rank, .dropped = dropped};
    r.node = strdup(node ? node : "localhost");
    r.dump = dk_utf8_sanitize(dump ? dump + dropped : "", len - dropped, &text_len);
    dk_flight_t flight;
    if (r.dump && dk_flight_parse(r.dump, &flight) && (r.flight = malloc(sizeof flight)))
        *r.flight = flight;
    dk_stack_t stack = {0};
    bool ok = r.node && r.dump && dk_stack_fold(r.dump, self->is_cell, self->data, &stack) == 0;
    if (ok) {
        r.group = group_for(self, &stack.signature, &stack.call, &stack.where);
        ok = r.group != SIZE_MAX && group_add(&self->groups[r.group], rank);
        /* A new group without its rank stays, empty; the summary skips it. */
    }
    dk_stack_clear(&stack);
    if (!ok) {
        free(r.node);
        free(r.dump);
        free(r.flight);
        return -1;
    }
    self->ranks[self->n_ranks++] = r;
    self->at[rank] = self->n_ranks;
    return 0;
}

/* ---- the summary and the full dumps -------------------------------------- */

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *) a, y = *(const int *) b;
    return (x > y) - (x < y);
}

static int cmp_group(const void *a, const void *b)
{
    const group_t *x = *(group_t *const *) a, *y = *(group_t *const *) b;
    if (x->n != y->n)
        return (x->n > y->n) - (x->n < y->n);
    return cmp_int(&x->ranks[0], &y->ranks[0]);
}

/* The non-empty groups, smallest first, each with its ranks sorted; N set. */
static group_t **ordered(dk_stacks_t *self, size_t *n)
{
    group_t **order = malloc((self->n_groups + 1) * sizeof *order);
    if (!order)
        return NULL;
    *n = 0;
    for (size_t g = 0; g < self->n_groups; g++) {
        if (self->groups[g].n == 0)
            continue;
        qsort(self->groups[g].ranks, self->groups[g].n, sizeof(int), cmp_int);
        order[(*n)++] = &self->groups[g];
    }
    qsort(order, *n, sizeof *order, cmp_group);
    return order;
}

/* "rank 2", "ranks 0, 1, 3 (3)", "ranks 0–151, 153–255 (255)". */
static void label(const group_t *g, char *buf, size_t len)
{
    size_t at = (size_t) snprintf(buf, len, "rank%s ", g->n > 1 ? "s" : "");
    char runs[LABEL_RANKS];
    size_t runs_at = 0;
    runs[0] = '\0';
    dk_ranks_format(g->ranks, g->n, 3, runs, sizeof runs, &runs_at);
    if (g->n > 1)
        snprintf(buf + at, len - at, "%s (%zu)", runs, g->n);
    else
        snprintf(buf + at, len - at, "%s", runs);
}

/* TEXT (valid UTF-8) cut to at most MAX bytes (MAX >= 3) between
 * characters, ending in "…" when cut. */
static void cut_text(char *text, size_t max)
{
    if (strlen(text) <= max)
        return;
    size_t cut = max - 3;
    while (cut > 0 && ((unsigned char) text[cut] & 0xC0) == 0x80)
        cut--;
    memcpy(text + cut, "\xe2\x80\xa6", 4);
}

/* Whether every rank of G with a flight line has the same FIELD. */
#define SAME(first, f, field) (strcmp((first)->field, (f)->field) == 0)

/* The last collective of G's ranks ("last all_reduce #12, 4 MiB, started"),
 * the range of sequence numbers when they differ and then the ranks at the
 * lowest ("#11–12 …; at #11 (completed): rank 3"), and how many ranks had no
 * flight line; "" when none had one. The ranks are sorted (ordered). False
 * when memory ran out. */
static bool flight_text(const dk_stacks_t *self, const group_t *g, char *buf, size_t len)
{
    buf[0] = '\0';
    const dk_flight_t *first = NULL, *low = NULL;
    size_t with = 0, at_low = 0;
    long long max = -1;
    bool ops = true, sizes = true, states = true, low_states = true;
    for (size_t k = 0; k < g->n; k++) {
        const dk_flight_t *f = self->ranks[self->at[g->ranks[k]] - 1].flight;
        if (!f)
            continue;
        with++;
        if (!first)
            first = f;
        ops = ops && SAME(first, f, op);
        sizes = sizes && first->bytes == f->bytes && SAME(first, f, shape);
        max = f->seq > max ? f->seq : max;
        if (!low || f->seq < low->seq) {
            low = f;
            at_low = 0;
            low_states = true;
        }
        if (f->seq == low->seq) {
            at_low++;
            low_states = low_states && SAME(low, f, state);
        }
    }
    if (!with)
        return true;
    /* The state shown is that of the ranks at the highest number. */
    const dk_flight_t *high = NULL;
    for (size_t k = 0; k < g->n; k++) {
        const dk_flight_t *f = self->ranks[self->at[g->ranks[k]] - 1].flight;
        if (f && f->seq == max) {
            high = high ? high : f;
            states = states && SAME(high, f, state);
        }
    }
    char size[48] = "";
    if (!sizes)
        snprintf(size, sizeof size, ", sizes differ");
    else if (first->bytes >= 0) {
        snprintf(size, sizeof size, ", ");
        dk_flight_size(first->bytes, size + 2, sizeof size - 2);
    } else if (first->shape[0])
        snprintf(size, sizeof size, ", %s", first->shape);
    size_t at = (size_t) snprintf(buf, len, "last %s #", ops ? first->op : "collective");
    if (low->seq == max)
        at += (size_t) snprintf(buf + at, at < len ? len - at : 0, "%lld", max);
    else
        at += (size_t) snprintf(buf + at, at < len ? len - at : 0, "%lld" DK_EN_DASH "%lld",
                                low->seq, max);
    at += (size_t) snprintf(buf + at, at < len ? len - at : 0, "%s%s%s%s", size,
                            ops ? "" : " (ops differ)", states && high->state[0] ? ", " : "",
                            states ? high->state : ", states differ");
    if (low->seq != max && at < len) {
        int *behind = malloc(at_low * sizeof *behind);
        if (!behind)
            return false;
        size_t n = 0;
        for (size_t k = 0; k < g->n; k++) {
            const dk_flight_t *f = self->ranks[self->at[g->ranks[k]] - 1].flight;
            if (f && f->seq == low->seq)
                behind[n++] = g->ranks[k];
        }
        char runs[FLIGHT_RANKS];
        size_t runs_at = 0;
        runs[0] = '\0';
        dk_ranks_format(behind, n, 3, runs, sizeof runs, &runs_at);
        free(behind);
        at += (size_t) snprintf(buf + at, len - at, "; at #%lld%s%s%s", low->seq,
                                low_states && low->state[0] ? " (" : "",
                                low_states ? low->state : "",
                                low_states && low->state[0] ? ")" : "");
        if (at < len && n > 1)
            at += (size_t) snprintf(buf + at, len - at, ", %zu ranks: %s", n, runs);
        else if (at < len)
            at += (size_t) snprintf(buf + at, len - at, ": rank %s", runs);
    }
    if (with < g->n && at < len)
        snprintf(buf + at, len - at, "; %zu rank%s not recorded", g->n - with,
                 g->n - with > 1 ? "s" : "");
    cut_text(buf, FLIGHT_SHOWN + 3);
    return true;
}

static int columns(const char *text)
{
    int n = 0;
    for (; *text; text++)
        n += ((unsigned char) *text & 0xC0) != 0x80;
    return n;
}

char *dk_stacks_summary(dk_stacks_t *self, size_t max_lines, const char *full_name)
{
    if (!self)
        return NULL;
    max_lines = max_lines ? max_lines : DK_STACKS_MAX_LINES;
    size_t n = 0;
    group_t **order = ordered(self, &n);
    if (!order)
        return NULL;
    size_t shown = n <= max_lines ? n : max_lines - 1;
    int label_w = 0, call_w = 0;
    char buf[LABEL_RANKS + 64];
    for (size_t i = 0; i < shown; i++) {
        label(order[i], buf, sizeof buf);
        int w = columns(buf);
        label_w = w > label_w ? w : label_w;
        w = order[i]->call ? columns(order[i]->call) : 0;
        call_w = w > call_w ? w : call_w;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out) {
        free(order);
        return NULL;
    }
    /* Columns are characters, not bytes: "–" and "…" pad as one. */
    char flight[FLIGHT_TEXT];
    bool ok = true;
    for (size_t i = 0; i < shown && ok; i++) {
        const group_t *g = order[i];
        label(g, buf, sizeof buf);
        ok = flight_text(self, g, flight, sizeof flight);
        long at = ftell(out);
        fprintf(out, "  %s:%*s", buf, label_w + 1 - columns(buf), "");
        if (g->call)
            fprintf(out, "%s%*s(%s)", g->call, call_w + 2 - columns(g->call), "", g->where);
        else
            fprintf(out, "%s", g->where);
        /* The stack's part is bounded where it is made (about 440 bytes at
         * worst); the flight text gets what is left of the line, if any. */
        long used = at >= 0 ? ftell(out) - at : LINE_MAX_BYTES;
        if (flight[0] && used + 2 + 4 <= LINE_MAX_BYTES) {
            cut_text(flight, (size_t) (LINE_MAX_BYTES - used - 2));
            fprintf(out, "  %s", flight);
        }
        fputs("\n", out);
    }
    if (shown < n) {
        size_t ranks = 0;
        for (size_t i = shown; i < n; i++)
            ranks += order[i]->n;
        bool named = !full_name || *full_name;
        fprintf(out, "  \xe2\x80\xa6 and %zu more groups (%zu ranks)%s%s\n", n - shown, ranks,
                named ? ": see " : "", named ? (full_name ? full_name : "stacks.txt") : "");
    }
    free(order);
    bool failed = !ok || ferror(out) != 0;
    if (fclose(out) != 0 || failed || !text) {
        free(text);
        return NULL;
    }
    return text;
}

int dk_stacks_write(dk_stacks_t *self, FILE *out)
{
    if (!self || !out)
        return -1;
    size_t n = 0;
    group_t **order = ordered(self, &n);
    if (!order)
        return -1;
    fprintf(out, "# %zu ranks in %zu groups, the smallest group first\n", self->n_ranks, n);
    char buf[LABEL_RANKS + 64], flight[FLIGHT_TEXT];
    for (size_t i = 0; i < n; i++) {
        const group_t *g = order[i];
        label(g, buf, sizeof buf);
        if (!flight_text(self, g, flight, sizeof flight)) {
            free(order);
            return -1;
        }
        fprintf(out, "\n== %s: %s%s%s%s%s%s\n", buf, g->call ? g->call : "", g->call ? " (" : "",
                g->where, g->call ? ")" : "", flight[0] ? "  " : "", flight);
        for (size_t k = 0; k < g->n; k++) {
            const rank_t *r = &self->ranks[self->at[g->ranks[k]] - 1];
            fprintf(out, "\n--- rank %d on %s ---\n", r->rank, r->node);
            if (r->dropped)
                fprintf(out, "[the first %zu bytes of this dump were not kept]\n", r->dropped);
            fputs(r->dump, out);
            if (!*r->dump || r->dump[strlen(r->dump) - 1] != '\n')
                fputs("\n", out);
        }
    }
    free(order);
    return fflush(out) == 0 && !ferror(out) ? 0 : -1;
}
