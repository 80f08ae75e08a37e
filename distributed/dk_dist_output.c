/*
 * dk_dist_output: rank output to labelled lines and progress displays. See the
 * header.
 *
 * One slot per rank and fd holds its line assembler and its progress display.
 * A line that is merely arriving in pieces, or whose rest is still in the pipe
 * behind a flood from other ranks, is printed once, whole: an unfinished line
 * gets a display only when it is being redrawn ('\r': what it shows no longer
 * starts with what it showed), or when it has been left unfinished for
 * DK_DIST_OUTPUT_PARTIAL_MS counted from when the kernel had read everything the
 * rank wrote. Finished lines of one read are collected in one batch and
 * appended once, so the stream coalesces them; the batch is handed over
 * before any display, so text and displays keep their order.
 */
#include "dk_dist_output.h"
#include "dk_clock.h"
#include "dk_lines.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    dk_dist_output_t *output;
    int rank;
    int fd;                     /* 1 or 2 */
    dk_lines_t *lines;
    bool progress_open;         /* a progress display exists for this stream */
    bool progress_dirty;        /* newer text than the display shows */
    char *progress_text;        /* what the unfinished line shows now */
    long long progress_sent_ms;
    long long partial_since_ms; /* an unfinished line is waiting, since */
    long long caught_up_ms;     /* ... and its pipe was found empty, since */
    char display_id[80];
    int displays;               /* progress displays opened so far */
} slot_t;

struct dk_dist_output_t {
    dk_dist_output_io_t io;
    int world;
    bool *shown;                /* world flags: whose output the cell shows; NULL: all */
    char run_id[24];
    pthread_mutex_t lock;
    slot_t *slots;              /* world * 2: rank r's stdout, then its stderr */
    char *batch;                /* labelled lines of one read */
    size_t batch_len, batch_cap;
};

static long long now_ms(dk_dist_output_t *self)
{
    if (self->io.now_ms)
        return self->io.now_ms(self->io.data);
    return dk_now_ms();
}

dk_dist_output_t *dk_dist_output_new(int world, const char *run_id, const bool *shown,
                                   const dk_dist_output_io_t *io)
{
    dk_dist_output_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->io = *io;
    self->world = world;
    snprintf(self->run_id, sizeof self->run_id, "%s", run_id);
    pthread_mutex_init(&self->lock, NULL);
    self->slots = calloc((size_t)world * 2, sizeof *self->slots);
    if (shown && (self->shown = malloc((size_t)world * sizeof *self->shown)))
        memcpy(self->shown, shown, (size_t)world * sizeof *self->shown);
    if (!self->slots || (shown && !self->shown)) {
        dk_dist_output_destroy(&self);
        return NULL;
    }
    for (int i = 0; i < world * 2; i++) {
        slot_t *s = &self->slots[i];
        s->output = self;
        s->rank = i / 2;
        s->fd = i % 2 + 1;
        s->lines = dk_lines_new(0);
        if (!s->lines) {
            dk_dist_output_destroy(&self);
            return NULL;
        }
    }
    return self;
}

void dk_dist_output_destroy(dk_dist_output_t **self_p)
{
    dk_dist_output_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    for (int i = 0; self->slots && i < self->world * 2; i++) {
        dk_lines_destroy(&self->slots[i].lines);
        free(self->slots[i].progress_text);
    }
    free(self->slots);
    free(self->shown);
    free(self->batch);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

/* Hand the batch of finished lines of slot S to the cell's stream. */
static void flush_batch(slot_t *s)
{
    dk_dist_output_t *self = s->output;
    if (self->batch_len)
        self->io.append(self->io.data, s->fd, self->batch, self->batch_len);
    self->batch_len = 0;
}

/* Show S's line in its progress display, opening the display if it is not open.
 * Unforced, a refused display stays dirty for the next tick. */
static void publish_progress(slot_t *s, bool force)
{
    dk_dist_output_t *self = s->output;
    if (!s->progress_text)
        return;
    if (!s->progress_open)
        snprintf(s->display_id, sizeof s->display_id, "distkernel-%s-r%d-fd%d-%d",
                 self->run_id, s->rank, s->fd, s->displays);
    char label[32];
    snprintf(label, sizeof label, "[rank %d] ", s->rank);
    size_t n = strlen(label) + strlen(s->progress_text) + 1;
    char *text = malloc(n);
    if (!text)
        return;
    snprintf(text, n, "%s%s", label, s->progress_text);
    flush_batch(s);
    bool sent = self->io.display(self->io.data, s->display_id, s->progress_open, text, force);
    free(text);
    if (!sent) {
        s->progress_dirty = true;
        return;
    }
    if (!s->progress_open)
        s->displays++;
    s->progress_open = true;
    s->progress_dirty = false;
    s->progress_sent_ms = now_ms(self);
}

static void on_progress(slot_t *s, const char *text, size_t len)
{
    long long now = now_ms(s->output);
    bool redraw = s->progress_text &&
                  strncmp(text, s->progress_text, strlen(s->progress_text)) != 0;
    free(s->progress_text);
    s->progress_text = strndup(text, len);
    if (!s->partial_since_ms)
        s->partial_since_ms = now;
    if (s->progress_open) {
        if (now - s->progress_sent_ms >= DK_DIST_OUTPUT_PROGRESS_MS)
            publish_progress(s, false);
        else
            s->progress_dirty = true;
    } else if (redraw) {
        publish_progress(s, false);
    }
}

/* Add "[rank N] TEXT\n" to the batch. */
static void batch_line(slot_t *s, const char *text, size_t len)
{
    dk_dist_output_t *self = s->output;
    char label[32];
    int ln = snprintf(label, sizeof label, "[rank %d] ", s->rank);
    size_t need = self->batch_len + (size_t)ln + len + 1;
    if (need > self->batch_cap) {
        size_t cap = self->batch_cap ? self->batch_cap : 4096;
        while (cap < need)
            cap *= 2;
        char *p = realloc(self->batch, cap);
        if (!p)
            return;
        self->batch = p;
        self->batch_cap = cap;
    }
    memcpy(self->batch + self->batch_len, label, (size_t)ln);
    memcpy(self->batch + self->batch_len + (size_t)ln, text, len);
    self->batch[need - 1] = '\n';
    self->batch_len = need;
}

static void on_line(void *data, dk_lines_event_t kind, const char *text, size_t len)
{
    slot_t *s = data;
    if (kind == DK_PROGRESS) {
        on_progress(s, text, len);
        return;
    }
    s->partial_since_ms = 0;
    s->caught_up_ms = 0;
    free(s->progress_text);
    s->progress_text = NULL;
    if (s->progress_open) {
        /* The redrawn line is finished (a bar at 100%): it stays where it was
         * drawn, in its final state, instead of being printed again. */
        s->progress_text = strndup(text, len);
        publish_progress(s, true);
        s->progress_open = false;
        free(s->progress_text);
        s->progress_text = NULL;
        return;
    }
    batch_line(s, text, len);
}

static slot_t *slot(dk_dist_output_t *self, int rank, int fd)
{
    return &self->slots[rank * 2 + (fd == 2)];
}

void dk_dist_output_write(dk_dist_output_t *self, int rank, int fd, const char *bytes, size_t len)
{
    if (self->shown && !self->shown[rank])
        return;   /* still in the rank's log file */
    pthread_mutex_lock(&self->lock);
    slot_t *s = slot(self, rank, fd);
    long long t = now_ms(self);
    dk_lines_feed(s->lines, bytes, len, on_line, s);
    flush_batch(s);
    /* While the kernel waited for a slow frontend (the stream's backpressure) it
     * read no pipe, so no rank can be known to have stopped writing: each must
     * be found caught up again before its unfinished line is shown. */
    if (now_ms(self) - t >= DK_DIST_OUTPUT_STALL_MS)
        for (int i = 0; i < self->world * 2; i++)
            self->slots[i].caught_up_ms = 0;
    pthread_mutex_unlock(&self->lock);
}

void dk_dist_output_caught_up(dk_dist_output_t *self, int rank, int fd)
{
    pthread_mutex_lock(&self->lock);
    slot_t *s = slot(self, rank, fd);
    if (s->partial_since_ms && !s->caught_up_ms)
        s->caught_up_ms = now_ms(self);
    pthread_mutex_unlock(&self->lock);
}

void dk_dist_output_tick(dk_dist_output_t *self)
{
    pthread_mutex_lock(&self->lock);
    long long now = now_ms(self);
    for (int i = 0; i < self->world * 2; i++) {
        slot_t *s = &self->slots[i];
        if (s->progress_open && s->progress_dirty)
            publish_progress(s, false);
        else if (!s->progress_open && s->progress_text && s->caught_up_ms &&
                 now - s->caught_up_ms >= DK_DIST_OUTPUT_PARTIAL_MS)
            publish_progress(s, false);
    }
    pthread_mutex_unlock(&self->lock);
}

void dk_dist_output_finish(dk_dist_output_t *self)
{
    pthread_mutex_lock(&self->lock);
    for (int i = 0; i < self->world * 2; i++) {
        slot_t *s = &self->slots[i];
        dk_lines_finish(s->lines, on_line, s);
        flush_batch(s);
        if (s->progress_dirty)
            publish_progress(s, true);
    }
    pthread_mutex_unlock(&self->lock);
}
