/*
 * dk_dist_stall: where the ranks of a silent run are. See the header.
 *
 * Two times decide everything: when a rank last printed (HEARD, from the
 * runtime thread, atomic) and when a sample was last asked for (ASKED, from
 * the waiting thread). A sample is kept only if nothing was heard after it
 * was asked, and shown only while that still holds, so output clears the
 * groups without anyone having to clear them: the next status refresh, which
 * dk_dist_stall_changed makes immediate, no longer finds them visible.
 *
 * The answers are grouped where they arrive (the runtime thread), once per
 * sample; the status reads the summary under the lock, cut to the lines it
 * has left, as often as it refreshes.
 */
#include "dk_dist_stall.h"

#include "dk_stacks.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dk_dist_stall_t {
    int world;
    long long after_ms;
    long long every_ms;
    char *cells_dir;
    atomic_llong heard_ms;      /* the last output, or the ranks' start */
    atomic_llong asked_ms;      /* the last ask; 0: none */
    pthread_mutex_t lock;       /* guards the three below */
    dk_stacks_t *stacks;        /* the last sample kept, or NULL */
    long long stacks_asked_ms;  /* when it was asked for */
    unsigned long gen;          /* samples kept so far */
    /* the waiting thread's: what the status showed last */
    bool shown;
    unsigned long shown_gen;
};

dk_dist_stall_t *dk_dist_stall_new(int world, double stall_after_s, double every_s,
                                   long long now_ms, const char *cells_dir)
{
    dk_dist_stall_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    if (cells_dir && !(self->cells_dir = strdup(cells_dir))) {
        free(self);
        return NULL;
    }
    self->world = world;
    self->after_ms = (long long) (stall_after_s * 1000.0);
    self->every_ms = (long long) ((every_s > 0 ? every_s : DK_DIST_STALL_EVERY_S) * 1000.0);
    atomic_init(&self->heard_ms, now_ms);
    atomic_init(&self->asked_ms, 0);
    pthread_mutex_init(&self->lock, NULL);
    return self;
}

void dk_dist_stall_destroy(dk_dist_stall_t **self_p)
{
    dk_dist_stall_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    dk_stacks_destroy(&self->stacks);
    pthread_mutex_destroy(&self->lock);
    free(self->cells_dir);
    free(self);
    *self_p = NULL;
}

void dk_dist_stall_output(dk_dist_stall_t *self, long long now_ms)
{
    atomic_store_explicit(&self->heard_ms, now_ms, memory_order_relaxed);
}

bool dk_dist_stall_due(dk_dist_stall_t *self, long long now_ms)
{
    long long heard = atomic_load_explicit(&self->heard_ms, memory_order_relaxed);
    if (now_ms - heard < self->after_ms)
        return false;
    long long asked = atomic_load(&self->asked_ms);
    if (asked > heard && now_ms - asked < self->every_ms)
        return false;
    atomic_store(&self->asked_ms, now_ms);
    return true;
}

void dk_dist_stall_sampled(dk_dist_stall_t *self, int world, const char *const *dumps,
                           const size_t *lens)
{
    long long asked = atomic_load(&self->asked_ms);
    if (atomic_load(&self->heard_ms) > asked)
        return;     /* a rank printed since: the sample says nothing of now */
    dk_stacks_t *stacks = dk_stacks_new(self->cells_dir ? dk_stacks_is_under : NULL,
                                        self->cells_dir);
    for (int r = 0; stacks && r < world && r < self->world; r++)
        if (dumps[r] && dk_stacks_add(stacks, r, NULL, dumps[r], lens[r]) < 0)
            dk_stacks_destroy(&stacks);     /* out of memory: nothing kept */
    if (!stacks)
        return;
    pthread_mutex_lock(&self->lock);
    dk_stacks_t *old = self->stacks;
    self->stacks = stacks;
    self->stacks_asked_ms = asked;
    self->gen++;
    pthread_mutex_unlock(&self->lock);
    dk_stacks_destroy(&old);
}

/* Whether the kept sample is to be shown: it has ranks, and nothing was
 * heard since it was asked for. Under the lock. */
static bool visible(dk_dist_stall_t *self)
{
    return self->stacks && dk_stacks_ranks(self->stacks) > 0 &&
           atomic_load(&self->heard_ms) <= self->stacks_asked_ms;
}

bool dk_dist_stall_changed(dk_dist_stall_t *self, long long now_ms)
{
    (void) now_ms;
    pthread_mutex_lock(&self->lock);
    bool shown = visible(self);
    bool changed = shown != self->shown || (shown && self->gen != self->shown_gen);
    pthread_mutex_unlock(&self->lock);
    return changed;
}

/* Append SUMMARY's lines to OUT, each indented two more spaces. */
static void indent(FILE *out, const char *summary)
{
    for (const char *line = summary; *line;) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t) (nl - line) + 1 : strlen(line);
        fprintf(out, "  %.*s", (int) n, line);
        line += n;
    }
}

char *dk_dist_stall_lines(dk_dist_stall_t *self, long long now_ms, size_t max_lines)
{
    pthread_mutex_lock(&self->lock);
    self->shown = visible(self);
    self->shown_gen = self->gen;
    if (!self->shown || max_lines < 1) {
        pthread_mutex_unlock(&self->lock);
        return NULL;
    }
    double silent = (double) (now_ms - atomic_load(&self->heard_ms)) / 1000.0;
    char *summary = max_lines >= 2 ? dk_stacks_summary(self->stacks, max_lines - 1, "") : NULL;
    size_t groups = dk_stacks_groups(self->stacks);
    pthread_mutex_unlock(&self->lock);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (!out || (max_lines >= 2 && !summary)) {
        if (out)
            fclose(out);
        free(text);
        free(summary);
        return NULL;
    }
    if (summary) {
        fprintf(out, "  silent %.0f s; where the ranks are:\n", silent);
        indent(out, summary);
    } else {
        fprintf(out, "  silent %.0f s; the ranks are in %zu place%s (no room here to show "
                     "them)\n", silent, groups, groups == 1 ? "" : "s");
    }
    free(summary);
    bool failed = ferror(out) != 0;
    if (fclose(out) != 0 || failed) {
        free(text);
        return NULL;
    }
    return text;
}
