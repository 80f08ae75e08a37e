/*
 * dk_stream: cell output capture and coalescing. See dk_stream.h.
 *
 * One mutex guards both buffers and both pipe read ends: whoever holds it may
 * drain the pipes (non-blocking reads) and publish. The reader thread sleeps in
 * poll() on the pipes and a wake pipe; it wakes when bytes arrive, when the
 * oldest pending byte reaches its deadline, or when a Python write makes a buffer
 * non-empty (so the deadline is recomputed).
 */
#include "dk_stream.h"
#include "dk_clock.h"
#include "dk_err.h"
#include "dk_utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BACKPRESSURE_MS 500   /* how long writers wait for a full IOPub before thinning */
#define RETRY_EVERY_MS 2       /* between offers while IOPub is full */
#define MAX_SOURCES 256        /* forked children with pipes of their own */

/* The fd 1 and 2 of a process forked from the kernel (and of what it starts):
 * its output belongs to the cell that was running when it was forked. */
typedef struct {
    int rd[2];               /* read ends; -1 once at EOF */
    char *parent;            /* the parent header at fork time */
} source_t;

/* A buffer holds text only: valid UTF-8, ready for a message. Raw bytes (the
 * kernel's fd 1/2, Python's writes) are cleaned on the way in, an incomplete
 * last character held in TAIL until the rest arrives; rank output comes in
 * clean (dk_lines cleaned it) and is not scanned again. */
typedef struct {
    char *data;
    size_t len, cap;
    char tail[4];
    size_t tail_len;
    unsigned long long thin_lines, thin_bytes;   /* thinned, not yet said */
} buf_t;

struct dk_stream_t {
    dk_iopub_t *iopub;
    pthread_mutex_t lock;
    buf_t buf[2];
    int pipe_rd[2];          /* read ends for fd 1, fd 2 */
    int saved_fd[2];         /* the original fd 1, fd 2 */
    int wake[2];
    long long deadline_ms;   /* 0 = nothing pending */
    int stopping;
    pthread_t reader;
    long long full_since_ms; /* IOPub refused the last offer, since; 0 = it took it */
    long long offered_ms;    /* time of the last refused offer */
    bool thinning;           /* waited BACKPRESSURE_MS already; drop until IOPub takes */
    char *thin_hint;         /* where the full output is, for the notice */
    unsigned long long thinned_lines, thinned_bytes;   /* totals */
    source_t sources[MAX_SOURCES];
    int n_sources;
};

static const char *stream_names[2] = {"stdout", "stderr"};

static int buf_append(buf_t *b, const char *data, size_t len)
{
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + len)
            cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p)
            return -1;
        b->data = p;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

static void format_size(char *out, size_t outlen, unsigned long long bytes)
{
    if (bytes >= 1000000)
        snprintf(out, outlen, "%.1f MB", (double)bytes / 1e6);
    else if (bytes >= 1000)
        snprintf(out, outlen, "%.1f kB", (double)bytes / 1e3);
    else
        snprintf(out, outlen, "%llu bytes", bytes);
}

/* The notice that takes the place of thinned output in stream I (malloc'd). */
static char *thin_notice(const dk_stream_t *self, const buf_t *b)
{
    char size[32];
    format_size(size, sizeof size, b->thin_bytes);
    const char *hint = self->thin_hint ? self->thin_hint : "; that output was not saved";
    size_t n = 256 + strlen(hint);
    char *text = malloc(n);
    if (text)
        snprintf(text, n, "[distkernel] output thinned: %llu line%s (%s) not shown here "
                 "because the frontend was not reading fast enough%s\n",
                 b->thin_lines, b->thin_lines == 1 ? "" : "s", size, hint);
    return text;
}

/* Publish the complete-UTF-8 part of buffer I, keeping an incomplete tail, with
 * the notice of output thinned before it. FORCE queues the message in IOPub when
 * a frontend is behind (nothing is lost: the kernel is about to reply or display);
 * otherwise it is offered, and a full IOPub leaves the text where it is. Returns
 * false if IOPub refused it. Lock held. */
static bool publish_locked(dk_stream_t *self, int i, bool force)
{
    buf_t *b = &self->buf[i];
    size_t n = b->len;
    if (n == 0 && !b->thin_bytes)
        return true;
    if (!force && self->full_since_ms && dk_now_ms() - self->offered_ms < RETRY_EVERY_MS)
        return false;
    char *notice = b->thin_bytes ? thin_notice(self, b) : NULL;
    size_t notice_len = notice ? strlen(notice) : 0;
    char *both = malloc(notice_len + n + 1);
    char *content_text = NULL;
    if (both) {
        memcpy(both, notice ? notice : "", notice_len);
        if (n)
            memcpy(both + notice_len, b->data, n);
        json_t *content = json_pack("{s:s, s:s%}", "name", stream_names[i], "text", both,
                                    notice_len + n);
        content_text = content ? json_dumps(content, JSON_COMPACT) : NULL;
        json_decref(content);
    }
    free(notice);
    free(both);
    if (!content_text)
        return true;   /* out of memory: the text stays and is tried again */
    int rc = force ? dk_iopub_publish_text(self->iopub, "stream", content_text, NULL, NULL,
                                           NULL, 0)
                   : dk_iopub_offer_text(self->iopub, "stream", content_text);
    free(content_text);
    if (rc == DK_IOPUB_FULL) {
        self->offered_ms = dk_now_ms();
        if (!self->full_since_ms)
            self->full_since_ms = self->offered_ms;
        return false;
    }
    self->full_since_ms = 0;
    self->thinning = false;
    b->thin_lines = b->thin_bytes = 0;
    memmove(b->data, b->data + n, b->len - n);
    b->len -= n;
    /* Shrink a buffer a flood grew, so idle memory returns to its usual size. */
    if (b->cap > 4 * DK_STREAM_CHUNK && b->len < DK_STREAM_CHUNK) {
        char *p = realloc(b->data, DK_STREAM_CHUNK);
        if (p) {
            b->data = p;
            b->cap = DK_STREAM_CHUNK;
        }
    }
    return true;
}

/* Drop the finished lines of buffer I (all of it if none is finished), counted
 * for the notice that will stand in their place. Lock held. */
static void thin_locked(dk_stream_t *self, int i)
{
    buf_t *b = &self->buf[i];
    size_t drop = 0, lines = 0;
    for (size_t k = 0; k < b->len; k++)
        if (b->data[k] == '\n') {
            drop = k + 1;
            lines++;
        }
    if (drop == 0) {
        drop = b->len;
        lines = 1;
    }
    b->thin_lines += lines;
    b->thin_bytes += drop;
    self->thinned_lines += lines;
    self->thinned_bytes += drop;
    memmove(b->data, b->data + drop, b->len - drop);
    b->len -= drop;
    self->thinning = true;
}

/* Backpressure: before LEN more bytes go into buffer I, it must stay under
 * DK_STREAM_BUF_MAX. While IOPub refuses (a frontend behind), the writer waits,
 * up to BACKPRESSURE_MS per episode: a rank blocks on its pipe, Python on its
 * write. A frontend that does not catch up in that time is not waited for again
 * until it does: what does not fit is thinned, and the notice says so. Lock held;
 * released while waiting. */
static void make_room_locked(dk_stream_t *self, int i, size_t len)
{
    buf_t *b = &self->buf[i];
    while (b->len && b->len + len > DK_STREAM_BUF_MAX) {
        if (publish_locked(self, i, false))
            return;
        if (self->thinning || dk_now_ms() - self->full_since_ms >= BACKPRESSURE_MS) {
            thin_locked(self, i);
            return;
        }
        pthread_mutex_unlock(&self->lock);
        struct timespec ts = {0, RETRY_EVERY_MS * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&self->lock);
    }
}

/* Add LEN bytes of text (valid UTF-8) to buffer I, publishing a full chunk.
 * Lock held. */
static void add_locked(dk_stream_t *self, int i, const char *data, size_t len)
{
    make_room_locked(self, i, len);
    buf_append(&self->buf[i], data, len);
    if (self->buf[i].len >= DK_STREAM_CHUNK)
        publish_locked(self, i, false);
}

/* Add LEN raw bytes to buffer I as text: after the held tail, up to the last
 * complete character, invalid bytes replaced; an incomplete last character is
 * held for the next write. Lock held. */
static void add_raw_locked(dk_stream_t *self, int i, const char *data, size_t len)
{
    buf_t *b = &self->buf[i];
    char *joined = NULL;
    if (b->tail_len) {
        joined = malloc(b->tail_len + len);
        if (!joined)
            return;
        memcpy(joined, b->tail, b->tail_len);
        memcpy(joined + b->tail_len, data, len);
        data = joined;
        len += b->tail_len;
        b->tail_len = 0;
    }
    size_t n = dk_utf8_complete_prefix(data, len);
    if (len - n <= sizeof b->tail) {
        memcpy(b->tail, data + n, len - n);
        b->tail_len = len - n;
    } else {
        n = len;   /* not a held-back character: dk_utf8 said to clean it all */
    }
    if (dk_utf8_valid_prefix(data, n) == n) {
        /* What Python and most programs write: text already. */
        if (n)
            add_locked(self, i, data, n);
    } else {
        size_t text_len;
        char *text = dk_utf8_sanitize(data, n, &text_len);
        if (text)
            add_locked(self, i, text, text_len);
        free(text);
    }
    free(joined);
}

static void mark_pending_locked(dk_stream_t *self)
{
    if (self->deadline_ms == 0 && (self->buf[0].len || self->buf[1].len ||
                                   self->buf[0].thin_bytes || self->buf[1].thin_bytes)) {
        self->deadline_ms = dk_now_ms() + DK_STREAM_INTERVAL_MS;
        char c = 1;
        ssize_t w = write(self->wake[1], &c, 1);
        (void)w;
    }
}

/* Publish LEN bytes a forked child wrote to stream I, under PARENT: the cell it
 * was forked in has ended, so its output goes there and not into the running
 * cell. Queued, not offered: a child that outlived its cell writes little, and
 * what it wrote must not be lost. Lock held. */
static void publish_late_locked(dk_stream_t *self, int i, const char *parent, const char *data,
                                size_t len)
{
    size_t text_len;
    char *text = dk_utf8_sanitize(data, len, &text_len);
    json_t *content = text ? json_pack("{s:s, s:s%}", "name", stream_names[i], "text", text,
                                       text_len)
                           : NULL;
    char *content_text = content ? json_dumps(content, JSON_COMPACT) : NULL;
    if (content_text)
        dk_iopub_publish_text(self->iopub, "stream", content_text, NULL, parent, NULL, 0);
    free(content_text);
    json_decref(content);
    free(text);
}

/* Read what fd I of source S holds now. Into the running cell's buffers if the
 * child was forked in it (its order with the cell's own output kept), else
 * published under the child's cell. At EOF (every writer gone) the read end
 * is closed. Lock held. */
static void drain_source_locked(dk_stream_t *self, source_t *src, int i, const char *current)
{
    char chunk[16384];
    bool same_cell = current && strcmp(current, src->parent) == 0;
    for (;;) {
        ssize_t n = read(src->rd[i], chunk, sizeof chunk);
        if (n > 0) {
            if (same_cell)
                add_raw_locked(self, i, chunk, (size_t)n);
            else
                publish_late_locked(self, i, src->parent, chunk, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0) {
            close(src->rd[i]);
            src->rd[i] = -1;
        }
        break;
    }
}

/* Drain every source; forget those whose both ends are closed. Lock held. */
static void drain_sources_locked(dk_stream_t *self)
{
    if (self->n_sources == 0)
        return;
    char *current = dk_iopub_parent(self->iopub);
    int kept = 0;
    for (int s = 0; s < self->n_sources; s++) {
        source_t *src = &self->sources[s];
        for (int i = 0; i < 2; i++)
            if (src->rd[i] >= 0)
                drain_source_locked(self, src, i, current);
        if (src->rd[0] < 0 && src->rd[1] < 0)
            free(src->parent);
        else
            self->sources[kept++] = *src;
    }
    self->n_sources = kept;
    free(current);
}

/* Read what the pipes hold right now into the buffers. Lock held. */
static void drain_locked(dk_stream_t *self)
{
    char chunk[16384];
    for (int i = 0; i < 2; i++) {
        for (;;) {
            ssize_t n = read(self->pipe_rd[i], chunk, sizeof chunk);
            if (n > 0) {
                add_raw_locked(self, i, chunk, (size_t)n);
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            break;
        }
    }
    drain_sources_locked(self);
}

/* Publish both buffers (FORCE: see publish_locked). Lock held. */
static void publish_all_locked(dk_stream_t *self, bool force)
{
    publish_locked(self, 0, force);
    publish_locked(self, 1, force);
    self->deadline_ms = 0;
    mark_pending_locked(self);  /* an incomplete UTF-8 tail stays pending */
}

static void *reader_main(void *arg)
{
    dk_stream_t *self = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        pthread_mutex_lock(&self->lock);
        long long deadline = self->deadline_ms;
        int stopping = self->stopping;
        pthread_mutex_unlock(&self->lock);
        if (stopping)
            break;
        int timeout = -1;
        if (deadline) {
            long long left = deadline - dk_now_ms();
            timeout = left > 0 ? (int)left : 0;
        }
        /* The sources' read ends, as they are now: a source added meanwhile
         * wakes this thread through the wake pipe. */
        struct pollfd fds[3 + 2 * MAX_SOURCES];
        int nfds = 3;
        fds[0] = (struct pollfd){self->pipe_rd[0], POLLIN, 0};
        fds[1] = (struct pollfd){self->pipe_rd[1], POLLIN, 0};
        fds[2] = (struct pollfd){self->wake[0], POLLIN, 0};
        pthread_mutex_lock(&self->lock);
        for (int s = 0; s < self->n_sources; s++)
            for (int i = 0; i < 2; i++)
                if (self->sources[s].rd[i] >= 0)
                    fds[nfds++] = (struct pollfd){self->sources[s].rd[i], POLLIN, 0};
        pthread_mutex_unlock(&self->lock);
        int rc = poll(fds, (nfds_t)nfds, timeout);
        if (rc < 0 && errno != EINTR)
            break;
        if (fds[2].revents & POLLIN) {
            char tmp[64];
            while (read(self->wake[0], tmp, sizeof tmp) > 0) {
            }
        }
        bool ready = false;
        for (int f = 0; f < nfds; f++)
            if (f != 2 && (fds[f].revents & (POLLIN | POLLHUP)))
                ready = true;
        pthread_mutex_lock(&self->lock);
        if (ready) {
            drain_locked(self);
            mark_pending_locked(self);
        }
        if (self->deadline_ms && dk_now_ms() >= self->deadline_ms)
            publish_all_locked(self, false);
        pthread_mutex_unlock(&self->lock);
    }
    return NULL;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

dk_stream_t *dk_stream_new(dk_iopub_t *iopub, char *err, size_t errlen)
{
    dk_stream_t *self = calloc(1, sizeof *self);
    if (!self) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    self->iopub = iopub;
    pthread_mutex_init(&self->lock, NULL);
    self->saved_fd[0] = self->saved_fd[1] = self->wake[0] = self->wake[1] = -1;
    self->pipe_rd[0] = self->pipe_rd[1] = -1;
    if (pipe2(self->wake, O_CLOEXEC | O_NONBLOCK) < 0)
        goto fail;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < 2; i++) {
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
            goto fail;
        /* A larger pipe lets a burst land without waking the reader per 4 KB. */
        fcntl(p[0], F_SETPIPE_SZ, 1 << 20);
        self->saved_fd[i] = fcntl(i + 1, F_DUPFD_CLOEXEC, 3);
        if (self->saved_fd[i] < 0 || dup2(p[1], i + 1) < 0) {
            close(p[0]);
            close(p[1]);
            goto fail;
        }
        close(p[1]);
        self->pipe_rd[i] = p[0];
        set_nonblock(p[0]);
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (pthread_create(&self->reader, NULL, reader_main, self) != 0)
        goto fail;
    return self;
fail:
    dk_set_err(err, errlen, "cannot capture fd 1 and 2: %s", strerror(errno));
    for (int i = 0; i < 2; i++) {
        if (self->saved_fd[i] >= 0) {
            dup2(self->saved_fd[i], i + 1);
            close(self->saved_fd[i]);
        }
        if (self->pipe_rd[i] >= 0)
            close(self->pipe_rd[i]);
    }
    if (self->wake[0] >= 0) {
        close(self->wake[0]);
        close(self->wake[1]);
    }
    pthread_mutex_destroy(&self->lock);
    free(self);
    return NULL;
}

int dk_stream_fork_source(dk_stream_t *self, int write_fds[2])
{
    int p[2][2] = {{-1, -1}, {-1, -1}};
    pthread_mutex_lock(&self->lock);
    char *parent = self->n_sources < MAX_SOURCES ? dk_iopub_parent(self->iopub) : NULL;
    if (!parent || pipe2(p[0], O_CLOEXEC) < 0 || pipe2(p[1], O_CLOEXEC) < 0) {
        for (int i = 0; i < 2; i++)
            if (p[i][0] >= 0) {
                close(p[i][0]);
                close(p[i][1]);
            }
        free(parent);
        pthread_mutex_unlock(&self->lock);
        return -1;
    }
    source_t *src = &self->sources[self->n_sources++];
    src->parent = parent;
    for (int i = 0; i < 2; i++) {
        set_nonblock(p[i][0]);
        src->rd[i] = p[i][0];
        write_fds[i] = p[i][1];
    }
    pthread_mutex_unlock(&self->lock);
    char c = 1;
    ssize_t w = write(self->wake[1], &c, 1);
    (void)w;
    return 0;
}

void dk_stream_destroy(dk_stream_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_stream_t *self = *self_p;
    dk_stream_flush(self);
    pthread_mutex_lock(&self->lock);
    self->stopping = 1;
    pthread_mutex_unlock(&self->lock);
    char c = 1;
    ssize_t w = write(self->wake[1], &c, 1);
    (void)w;
    pthread_join(self->reader, NULL);
    for (int i = 0; i < 2; i++) {
        dup2(self->saved_fd[i], i + 1);
        close(self->saved_fd[i]);
        close(self->pipe_rd[i]);
        free(self->buf[i].data);
    }
    for (int s = 0; s < self->n_sources; s++) {
        for (int i = 0; i < 2; i++)
            if (self->sources[s].rd[i] >= 0)
                close(self->sources[s].rd[i]);
        free(self->sources[s].parent);
    }
    free(self->thin_hint);
    close(self->wake[0]);
    close(self->wake[1]);
    pthread_mutex_destroy(&self->lock);
    free(self);
    *self_p = NULL;
}

void dk_stream_write(dk_stream_t *self, dk_stream_name_t name, const char *buf, size_t len)
{
    pthread_mutex_lock(&self->lock);
    drain_locked(self);
    add_raw_locked(self, name, buf, len);
    mark_pending_locked(self);
    pthread_mutex_unlock(&self->lock);
}

void dk_stream_append(dk_stream_t *self, dk_stream_name_t name, const char *buf, size_t len)
{
    pthread_mutex_lock(&self->lock);
    add_locked(self, name, buf, len);
    mark_pending_locked(self);
    pthread_mutex_unlock(&self->lock);
}

void dk_stream_flush(dk_stream_t *self)
{
    fflush(stdout);
    fflush(stderr);
    pthread_mutex_lock(&self->lock);
    drain_locked(self);
    publish_all_locked(self, true);
    pthread_mutex_unlock(&self->lock);
}

bool dk_stream_offer(dk_stream_t *self)
{
    pthread_mutex_lock(&self->lock);
    bool ok = publish_locked(self, 0, false) && publish_locked(self, 1, false);
    pthread_mutex_unlock(&self->lock);
    return ok;
}

void dk_stream_set_thin_hint(dk_stream_t *self, const char *hint)
{
    char *copy = hint ? strdup(hint) : NULL;
    pthread_mutex_lock(&self->lock);
    free(self->thin_hint);
    self->thin_hint = copy;
    pthread_mutex_unlock(&self->lock);
}

void dk_stream_thinned(dk_stream_t *self, unsigned long long *lines, unsigned long long *bytes)
{
    pthread_mutex_lock(&self->lock);
    *lines = self->thinned_lines;
    *bytes = self->thinned_bytes;
    pthread_mutex_unlock(&self->lock);
}

int dk_stream_log_fd(const dk_stream_t *self)
{
    return self->saved_fd[1];
}
