/*
 * dk_relay: a node agent's relay of its ranks' connections. See the header.
 */
#include "dk_relay.h"

#include "dk_err.h"
#include "dk_frame.h"
#include "dk_logdir.h"
#include "dk_peer.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SOCKET_NAME "relay.sock"

typedef struct {
    int fd;                 /* -1: free */
    uint32_t id;
    unsigned char *out;     /* from the kernel, not yet written */
    size_t out_len, out_off;
    bool ending;            /* the kernel ended it: close once OUT is written */
} stream_t;

struct dk_relay {
    dk_relay_sink_t sink;
    char *dir, *path;
    int listen_fd;
    stream_t *streams;
    int max;
    uint32_t next_id;
    int *polled;            /* stream index of each pollfd after the listener; -1: listener */
};

static void stream_close(stream_t *s)
{
    if (s->fd >= 0)
        close(s->fd);
    free(s->out);
    memset(s, 0, sizeof *s);
    s->fd = -1;
}

dk_relay_t *dk_relay_new(int max_streams, const dk_relay_sink_t *sink, char *err, size_t errlen)
{
    dk_relay_t *self = calloc(1, sizeof *self);
    if (!self || max_streams < 1) {
        dk_set_err(err, errlen, "out of memory");
        free(self);
        return NULL;
    }
    self->sink = *sink;
    self->listen_fd = -1;
    self->max = max_streams;
    self->streams = calloc((size_t) max_streams, sizeof *self->streams);
    self->polled = calloc((size_t) max_streams + 1, sizeof *self->polled);
    if (!self->streams || !self->polled) {
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    for (int i = 0; i < max_streams; i++)
        self->streams[i].fd = -1;
    if (!(self->dir = dk_logdir_socket_dir("relay", SOCKET_NAME, "the ranks' relay folder", err,
                                           errlen)))
        goto fail;
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (asprintf(&self->path, "%s/%s", self->dir, SOCKET_NAME) < 0) {
        self->path = NULL;
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", self->path);
    self->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (self->listen_fd < 0 || bind(self->listen_fd, (struct sockaddr *) &addr, sizeof addr) != 0 ||
        listen(self->listen_fd, max_streams) != 0) {
        dk_set_err(err, errlen, "cannot listen on %s: %s", self->path, strerror(errno));
        goto fail;
    }
    return self;
fail:
    dk_relay_destroy(&self);
    return NULL;
}

void dk_relay_destroy(dk_relay_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_relay_t *self = *self_p;
    for (int i = 0; self->streams && i < self->max; i++)
        stream_close(&self->streams[i]);
    if (self->listen_fd >= 0)
        close(self->listen_fd);
    if (self->path)
        unlink(self->path);
    if (self->dir)
        dk_logdir_socket_dir_remove(self->dir);
    free(self->dir);
    free(self->path);
    free(self->streams);
    free(self->polled);
    free(self);
    *self_p = NULL;
}

const char *dk_relay_address(const dk_relay_t *self)
{
    return self->path;
}

size_t dk_relay_max_fds(const dk_relay_t *self)
{
    return (size_t) self->max + 1;
}

static stream_t *find(dk_relay_t *self, uint32_t id)
{
    for (int i = 0; i < self->max; i++)
        if (self->streams[i].fd >= 0 && self->streams[i].id == id)
            return &self->streams[i];
    return NULL;
}

/* Write what S holds for its rank; close it when ending and written. */
static void stream_write(dk_relay_t *self, stream_t *s)
{
    while (s->out_off < s->out_len) {
        ssize_t n = send(s->fd, s->out + s->out_off, s->out_len - s->out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0) {
            /* The rank is gone: what it was owed goes nowhere. Its end of
             * file (read next) tells the kernel. */
            s->out_off = s->out_len;
            break;
        }
        s->out_off += (size_t) n;
    }
    free(s->out);
    s->out = NULL;
    s->out_len = s->out_off = 0;
    if (s->ending)
        stream_close(s);
    (void) self;
}

/* Read from S once (at most one frame's worth) and pass it on; its end (or
 * a reset) is told as RELAY_END. False when nothing more is waiting. */
static bool stream_read(dk_relay_t *self, stream_t *s)
{
    static unsigned char buf[DK_FRAME_RELAY_MAX];
    if (s->fd < 0 || s->ending)
        return false;
    ssize_t n;
    do
        n = recv(s->fd, buf, sizeof buf, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return false;
    if (self->sink.before)
        self->sink.before(self->sink.data);
    if (n <= 0) {
        self->sink.send(self->sink.data, DK_FRAME_RELAY_END, s->id, NULL, 0);
        stream_close(s);
        return false;
    }
    self->sink.send(self->sink.data, DK_FRAME_RELAY, s->id, buf, (size_t) n);
    return true;
}

static void accept_all(dk_relay_t *self)
{
    for (;;) {
        int fd = accept4(self->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && errno == EINTR)
            continue;
        if (fd < 0)
            return;
        /* Only our own user's processes (the folder is 0700; this holds
         * even if it was not): another user's connection never becomes a
         * stream (dk_peer.h). */
        if (dk_peer_check(fd, "a connection to the relay", NULL, 0) < 0) {
            close(fd);
            continue;
        }
        stream_t *s = NULL;
        for (int i = 0; !s && i < self->max; i++)
            if (self->streams[i].fd < 0)
                s = &self->streams[i];
        if (!s) {
            close(fd);  /* more connections than the node has ranks (and the slack) */
            continue;
        }
        s->fd = fd;
        s->id = self->next_id++;
        self->sink.send(self->sink.data, DK_FRAME_RELAY, s->id, NULL, 0);  /* a new one */
    }
}

size_t dk_relay_poll_fill(dk_relay_t *self, struct pollfd *fds)
{
    size_t n = 0;
    if (self->listen_fd >= 0) {
        fds[n] = (struct pollfd) {.fd = self->listen_fd, .events = POLLIN};
        self->polled[n++] = -1;
    }
    for (int i = 0; i < self->max; i++) {
        stream_t *s = &self->streams[i];
        if (s->fd < 0)
            continue;
        short events = s->ending ? 0 : POLLIN;
        if (s->out_off < s->out_len)
            events |= POLLOUT;
        fds[n] = (struct pollfd) {.fd = s->fd, .events = events};
        self->polled[n++] = i;
    }
    return n;
}

void dk_relay_poll_handle(dk_relay_t *self, const struct pollfd *fds, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (!fds[k].revents)
            continue;
        if (self->polled[k] < 0) {
            accept_all(self);
            continue;
        }
        stream_t *s = &self->streams[self->polled[k]];
        if (s->fd != fds[k].fd)
            continue;
        if (fds[k].revents & POLLOUT)
            stream_write(self, s);
        if (s->fd >= 0 && (fds[k].revents & (POLLIN | POLLHUP | POLLERR)))
            stream_read(self, s);
    }
}

void dk_relay_flush_in(dk_relay_t *self)
{
    for (int i = 0; i < self->max; i++)
        while (stream_read(self, &self->streams[i]))
            ;
}

void dk_relay_from_kernel(dk_relay_t *self, int type, uint32_t stream, const void *bytes,
                          size_t len)
{
    stream_t *s = find(self, stream);
    if (!s)
        return;     /* ended here: its end crossed the kernel's bytes */
    if (type == DK_FRAME_RELAY_END) {
        s->ending = true;
        stream_write(self, s);
        return;
    }
    if (len == 0)
        return;
    unsigned char *out = realloc(s->out, s->out_len + len);
    if (!out) {
        /* Nothing to do but end it: the kernel hears of it as a close. */
        self->sink.send(self->sink.data, DK_FRAME_RELAY_END, s->id, NULL, 0);
        stream_close(s);
        return;
    }
    memcpy(out + s->out_len, bytes, len);
    s->out = out;
    s->out_len += len;
    stream_write(self, s);
}

void dk_relay_unlink(dk_relay_t *self)
{
    if (self->path)
        unlink(self->path);
    if (self->dir)
        dk_logdir_socket_dir_remove(self->dir);
    free(self->dir);
    self->dir = NULL;
}

void dk_relay_end_all(dk_relay_t *self)
{
    /* Nothing connects any more: the folder goes now, not at the agent's
     * end, which Slurm's SIGKILL may make sudden (dk_agent.c, kernel_gone). */
    dk_relay_unlink(self);
    for (int i = 0; i < self->max; i++)
        stream_close(&self->streams[i]);
    if (self->listen_fd >= 0)
        close(self->listen_fd);
    self->listen_fd = -1;
}
