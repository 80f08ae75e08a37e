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
#include "dk_utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char *data;
    size_t len, cap;
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
};

static const char *stream_names[2] = {"stdout", "stderr"};

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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

/* Publish the complete-UTF-8 part of buffer I; keep an incomplete tail. Lock held. */
static void publish_locked(dk_stream_t *self, int i)
{
    buf_t *b = &self->buf[i];
    if (b->len == 0)
        return;
    size_t n = dk_utf8_complete_prefix(b->data, b->len);
    if (n == 0)
        return;
    size_t text_len;
    char *text = dk_utf8_sanitize(b->data, n, &text_len);
    if (text) {
        json_t *content = json_pack("{s:s, s:s%}", "name", stream_names[i], "text", text,
                                    text_len);
        if (content)
            dk_iopub_publish(self->iopub, "stream", content, NULL);
        json_decref(content);
        free(text);
    }
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
}

static void mark_pending_locked(dk_stream_t *self)
{
    if (self->deadline_ms == 0 && (self->buf[0].len || self->buf[1].len)) {
        self->deadline_ms = now_ms() + DK_STREAM_INTERVAL_MS;
        char c = 1;
        ssize_t w = write(self->wake[1], &c, 1);
        (void)w;
    }
}

/* Read what the pipes hold right now into the buffers. Lock held. */
static void drain_locked(dk_stream_t *self)
{
    char chunk[16384];
    for (int i = 0; i < 2; i++) {
        for (;;) {
            ssize_t n = read(self->pipe_rd[i], chunk, sizeof chunk);
            if (n > 0) {
                buf_append(&self->buf[i], chunk, (size_t)n);
                if (self->buf[i].len >= DK_STREAM_CHUNK)
                    publish_locked(self, i);
                continue;
            }
            if (n < 0 && errno == EINTR)
                continue;
            break;
        }
    }
}

static void publish_all_locked(dk_stream_t *self)
{
    publish_locked(self, 0);
    publish_locked(self, 1);
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
            long long left = deadline - now_ms();
            timeout = left > 0 ? (int)left : 0;
        }
        struct pollfd fds[3] = {{self->pipe_rd[0], POLLIN, 0},
                                {self->pipe_rd[1], POLLIN, 0},
                                {self->wake[0], POLLIN, 0}};
        int rc = poll(fds, 3, timeout);
        if (rc < 0 && errno != EINTR)
            break;
        if (fds[2].revents & POLLIN) {
            char tmp[64];
            while (read(self->wake[0], tmp, sizeof tmp) > 0) {
            }
        }
        pthread_mutex_lock(&self->lock);
        if ((fds[0].revents | fds[1].revents) & (POLLIN | POLLHUP)) {
            drain_locked(self);
            mark_pending_locked(self);
        }
        if (self->deadline_ms && now_ms() >= self->deadline_ms)
            publish_all_locked(self);
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
        snprintf(err, errlen, "out of memory");
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
    snprintf(err, errlen, "cannot capture fd 1 and 2: %s", strerror(errno));
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
    buf_append(&self->buf[name], buf, len);
    if (self->buf[name].len >= DK_STREAM_CHUNK)
        publish_locked(self, name);
    mark_pending_locked(self);
    pthread_mutex_unlock(&self->lock);
}

void dk_stream_append(dk_stream_t *self, dk_stream_name_t name, const char *buf, size_t len)
{
    pthread_mutex_lock(&self->lock);
    buf_append(&self->buf[name], buf, len);
    if (self->buf[name].len >= DK_STREAM_CHUNK)
        publish_locked(self, name);
    mark_pending_locked(self);
    pthread_mutex_unlock(&self->lock);
}

void dk_stream_flush(dk_stream_t *self)
{
    fflush(stdout);
    fflush(stderr);
    pthread_mutex_lock(&self->lock);
    drain_locked(self);
    publish_all_locked(self);
    pthread_mutex_unlock(&self->lock);
}

int dk_stream_log_fd(const dk_stream_t *self)
{
    return self->saved_fd[1];
}
