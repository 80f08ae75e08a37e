/*
 * dk_backchan: accepting, authenticating and serving rank connections.
 *
 * Anyone who can reach the socket can connect (the 0700 directory limits that
 * to our own user), so a connection earns nothing until its HELLO verifies: it
 * is sent a fresh nonce, and until then it may hold at most one HELLO-sized
 * frame of memory. Only after the MAC checks out is anything in the body
 * looked at. The first valid HELLO for a rank claims that rank for the rest of
 * the job; a second claim, an unknown rank, a bad MAC, an oversized frame or a
 * message out of protocol closes the connection with a warning.
 *
 * The channel is four files over one state (dk_backchan_state.h): this one
 * makes the channel and runs its poll turn; dk_backchan_frame.c writes, reads
 * and verifies the frames of each connection; dk_backchan_admit.c decides
 * which accepted connection may take a slot; dk_backchan_relay.c serves the
 * ranks whose connections their node's agent carries on its own.
 *
 *
 * Once every rank has said a valid HELLO, the listener is closed (and the
 * Unix socket unlinked) and any connection still waiting for a HELLO is
 * closed: no rank can claim a second connection, so nothing listens for the
 * life of started ranks.
 *
 * Warnings are capped: a local process looping on connect must not flood the
 * notebook.
 *
 * Ranks on other nodes (dk_backchan_opts_t): the listener is a TCP socket
 * bound to the one address the nodes route to, never a wildcard, so the
 * channel is reachable from the cluster's network and from nothing else this
 * host is on. Nothing else changes: a connection from anywhere earns nothing
 * before its HELLO verifies, and the same limits hold. What connects there
 * is each node's agent, carrying its ranks' connections (dk_backchan_relay.c).
 * Over the network a peer can vanish without a FIN (a node powered off, a
 * cut link), so the runtime and each agent send a PING every DK_BC_PING_S,
 * and an agent's connection silent for longer than the heartbeat deadline is
 * reported (on_lost) once. A PING is queued only when nothing else is being
 * written: a connection busy with a payload is talking anyway.
 *
 * A persistent channel (started ranks) sends nothing at HELLO. Each round,
 * dk_backchan_send_task replaces the one payload copy (every connection has
 * written the last one by then: its rank answered it) and queues a TASK frame
 * per connection with that connection's next sequence number; the round in
 * the frame, and in the answer, ties each answer to its task.
 */
#include "dk_backchan_state.h"
#include "dk_err.h"
#include "dk_clock.h"
#include "dk_logdir.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#define READ_BUDGET ((size_t) 4 << 20)     /* bytes per connection per poll turn */
/* ... and seconds: a flood of tiny frames costs a MAC and a callback each, so
 * bytes alone do not bound a turn's time (4 MiB of 44-byte frames is ~95,000
 * of them). The drain's slice is longer: it is reading what ranks said
 * before they exited. */
#define READ_SLICE_S 0.05
#define DRAIN_SLICE_S 0.25
#define WARNINGS_MAX 20
#define SOCKET_NAME "bc.sock"

void chan_warn(dk_backchan_t *self, const char *fmt, ...)
{
    if (self->warnings > WARNINGS_MAX || !self->sink.on_warning)
        return;
    char text[512];
    if (self->warnings++ == WARNINGS_MAX) {
        snprintf(text, sizeof text,
                 "back channel: further problems with connections are not reported");
    } else {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(text, sizeof text, fmt, ap);
        va_end(ap);
    }
    self->sink.on_warning(self->sink.data, text);
}

/* ------------------------------------------------------------------------ */
/* Setup and teardown                                                        */

/* Room in the system's accept queue for every rank at once, and the slack. */
static int backlog(const dk_backchan_t *self)
{
    size_t n = self->nconns;
    return n > 65535 ? 65535 : (int) n;
}

static bool listen_on(dk_backchan_t *self, char *err, size_t errlen)
{
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", self->path);
    self->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (self->listen_fd < 0 || bind(self->listen_fd, (struct sockaddr *) &addr, sizeof addr) != 0 ||
        listen(self->listen_fd, backlog(self)) != 0) {
        dk_set_err(err, errlen, "cannot listen on the back-channel socket %s: %s", self->path,
                   strerror(errno));
        return false;
    }
    return true;
}

/* A numeric address, with its port, bound and listening; a wildcard is
 * refused (the channel must be reachable on the cluster's network only). */
static bool listen_tcp(dk_backchan_t *self, const char *host, int port, char *err, size_t errlen)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    int rc = port < 0 || port > 65535 ? EAI_SERVICE : getaddrinfo(host, service, &hints, &ai);
    if (rc != 0) {
        dk_set_err(err, errlen, "the back channel's address \"%s\" port %d is not a numeric "
                   "IPv4 or IPv6 address and port (%s); give this host's address on the "
                   "network the nodes reach it by", host, port, gai_strerror(rc));
        return false;
    }
    bool wildcard =
        (ai->ai_family == AF_INET &&
         ((struct sockaddr_in *) ai->ai_addr)->sin_addr.s_addr == htonl(INADDR_ANY)) ||
        (ai->ai_family == AF_INET6 &&
         IN6_IS_ADDR_UNSPECIFIED(&((struct sockaddr_in6 *) ai->ai_addr)->sin6_addr));
    if (wildcard) {
        dk_set_err(err, errlen, "the back channel's address %s would listen on every network "
                   "this host is on; give the one address the nodes reach it by", host);
        freeaddrinfo(ai);
        return false;
    }
    int one = 1;
    self->listen_fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    bool ok = self->listen_fd >= 0 &&
              (ai->ai_family != AF_INET6 ||
               setsockopt(self->listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) == 0) &&
              bind(self->listen_fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
              listen(self->listen_fd, backlog(self)) == 0;
    int family = ai->ai_family;
    freeaddrinfo(ai);
    struct sockaddr_storage bound;
    socklen_t blen = sizeof bound;
    if (ok)
        ok = getsockname(self->listen_fd, (struct sockaddr *) &bound, &blen) == 0;
    if (!ok) {
        dk_set_err(err, errlen, "cannot listen for ranks on %s port %d: %s (is it an address "
                   "of this host?)", host, port, strerror(errno));
        return false;
    }
    char text[INET6_ADDRSTRLEN];
    const void *a = family == AF_INET6 ? (const void *) &((struct sockaddr_in6 *) &bound)->sin6_addr
                                       : (const void *) &((struct sockaddr_in *) &bound)->sin_addr;
    inet_ntop(family, a, text, sizeof text);
    self->port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *) &bound)->sin6_port
                                          : ((struct sockaddr_in *) &bound)->sin_port);
    if (asprintf(&self->address, family == AF_INET6 ? "tcp:[%s]:%d" : "tcp:%s:%d", text,
                 self->port) < 0) {
        self->address = NULL;
        dk_set_err(err, errlen, "out of memory");
        return false;
    }
    return true;
}

dk_backchan_t *dk_backchan_new(int world_size, const void *payload, size_t payload_len,
                               const dk_backchan_sink_t *sink, char *err, size_t errlen)
{
    return dk_backchan_new_opts(world_size, false, payload, payload_len, sink, NULL, err, errlen);
}

dk_backchan_t *dk_backchan_new_opts(int world_size, bool persistent, const void *payload,
                                    size_t payload_len, const dk_backchan_sink_t *sink,
                                    const dk_backchan_opts_t *opts, char *err, size_t errlen)
{
    dk_backchan_t *self = calloc(1, sizeof *self);
    if (!self) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    self->listen_fd = -1;
    self->world_size = world_size;
    self->sink = *sink;
    self->agents = opts && opts->agents > 0 ? opts->agents : 0;
    self->ranks_per_node = opts && opts->ranks_per_node > 0 ? opts->ranks_per_node : 1;
    self->nconns = (size_t) world_size + (size_t) self->agents + DK_BC_SLACK;
    self->claimed = calloc((size_t) world_size + (size_t) self->agents, sizeof *self->claimed);
    self->conns = calloc(self->nconns, sizeof *self->conns);
    self->polled = calloc(self->nconns, sizeof *self->polled);
    if (payload_len > 0)
        self->payload = malloc(payload_len);
    if (!self->claimed || !self->conns || !self->polled || (payload_len > 0 && !self->payload)) {
        dk_set_err(err, errlen, "out of memory (payload of %zu bytes)", payload_len);
        goto fail;
    }
    unsigned char key[DK_FRAME_KEY_LEN];
    bool keyed = RAND_bytes(key, sizeof key) == 1 && (self->key = dk_frame_key_new(key));
    if (keyed)
        dk_frame_key_to_hex(key, self->key_hex);
    OPENSSL_cleanse(key, sizeof key);
    if (!keyed) {
        dk_set_err(err, errlen, "OpenSSL cannot provide HMAC-SHA256 or random bytes for the "
                   "back-channel key");
        goto fail;
    }
    for (size_t i = 0; i < self->nconns; i++)
        self->conns[i].fd = -1;
    if (payload_len > 0)
        memcpy(self->payload, payload, payload_len);
    self->payload_len = payload_len;
    self->persistent = persistent;
    self->port_from_rank0 = opts && opts->port_from_rank0;
    if (opts && opts->heartbeat_s > 0)
        self->heartbeat_s = opts->heartbeat_s;
    if (opts && opts->tcp_addr) {
        if (opts->allow_hosts &&
            (!(self->allow = dk_accept_new(opts->allow_hosts, opts->nallow, err, errlen)) ||
             !dk_accept_add_this_host(self->allow, opts->tcp_addr))) {
            if (self->allow)
                dk_set_err(err, errlen, "out of memory");
            goto fail;
        }
        if (!listen_tcp(self, opts->tcp_addr, opts->tcp_port, err, errlen))
            goto fail;
        return self;
    }

    if (!(self->dir = dk_logdir_socket_dir("bc", SOCKET_NAME, "the back-channel directory", err,
                                           errlen)))
        goto fail;
    size_t plen = strlen(self->dir) + sizeof "/" SOCKET_NAME;
    if (!(self->path = malloc(plen))) {
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    snprintf(self->path, plen, "%s/%s", self->dir, SOCKET_NAME);
    if (!listen_on(self, err, errlen))
        goto fail;
    if (!(self->address = strdup(self->path))) {
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    return self;
fail:
    dk_backchan_destroy(&self);
    return NULL;
}

dk_backchan_t *dk_backchan_new_persistent(int world_size, const dk_backchan_sink_t *sink,
                                          char *err, size_t errlen)
{
    return dk_backchan_new_opts(world_size, true, NULL, 0, sink, NULL, err, errlen);
}

void chan_conn_close(dk_backchan_t *self, conn_t *c)
{
    if (c->fd == RELAYED_FD) {
        /* Its agent ends the rank's connection to it: an idle started
         * rank's cue to exit, as a closed socket of its own would be. */
        conn_t *a = c->agent;
        if (a && a->fd >= 0 && chan_agent_queue(self, a, DK_FRAME_RELAY_END, c->stream, NULL, 0))
            a->relay_due = true;
    } else if (c->fd >= 0) {
        close(c->fd);
        if (chan_is_agent(self, c))
            for (size_t i = 0; i < self->nconns; i++)
                if (self->conns[i].agent == c) {
                    self->conns[i].agent = NULL;    /* gone with it: nothing to tell */
                    chan_conn_close(self, &self->conns[i]);
                }
    }
    free(c->frame);
    free(c->queue);
    free(c->owned_body);
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->rank = -1;
}

void dk_backchan_close_all(dk_backchan_t *self)
{
    for (size_t i = 0; i < self->nconns; i++)
        chan_conn_close(self, &self->conns[i]);
    if (self->listen_fd >= 0)
        close(self->listen_fd);
    self->listen_fd = -1;
}

void dk_backchan_close_ranks(dk_backchan_t *self)
{
    for (size_t i = 0; i < self->nconns; i++)
        if (self->conns[i].fd >= 0 && !chan_is_agent(self, &self->conns[i]))
            chan_conn_close(self, &self->conns[i]);
    /* The agents tell their ranks (RELAY_END) at once. */
    for (size_t i = 0; i < self->nconns; i++)
        if (self->conns[i].fd >= 0 && self->conns[i].relay_due)
            chan_relay_pump(self, &self->conns[i]);
    if (self->listen_fd >= 0)
        close(self->listen_fd);
    self->listen_fd = -1;
}

void dk_backchan_destroy(dk_backchan_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_backchan_t *self = *self_p;
    if (self->conns)
        dk_backchan_close_all(self);
    else if (self->listen_fd >= 0)
        close(self->listen_fd);
    if (self->path)
        unlink(self->path);
    dk_logdir_socket_dir_remove(self->dir);
    dk_frame_key_destroy(&self->key);
    OPENSSL_cleanse(self->key_hex, sizeof self->key_hex);
    free(self->payload);
    free(self->claimed);
    dk_accept_destroy(&self->allow);
    free(self->conns);
    free(self->polled);
    free(self->path);
    free(self->address);
    free(self->dir);
    free(self);
    *self_p = NULL;
}

const char *dk_backchan_path(const dk_backchan_t *self)
{
    return self->path;
}

const char *dk_backchan_address(const dk_backchan_t *self)
{
    return self->address;
}

bool dk_backchan_rank_open(const dk_backchan_t *self, int rank)
{
    for (size_t i = 0; i < self->nconns; i++) {
        if (self->conns[i].fd >= 0 && self->conns[i].rank == rank)
            return true;
    }
    return false;
}

bool dk_backchan_rank_connected_once(const dk_backchan_t *self, int rank)
{
    return rank >= 0 && rank < self->world_size + self->agents && self->claimed[rank];
}

bool dk_backchan_agent_send(dk_backchan_t *self, int node, int type, uint32_t rank, int sig)
{
    if (node < 0 || node >= self->agents)
        return false;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0 || c->rank != self->world_size + node || c->lost)
            continue;
        unsigned char p[4] = {(unsigned char) (sig >> 24), (unsigned char) (sig >> 16),
                              (unsigned char) (sig >> 8), (unsigned char) sig};
        bool with_sig = type == DK_FRAME_SIGNAL || (type == DK_FRAME_STACKS && sig != 0);
        if (!chan_agent_queue(self, c, type, rank, with_sig ? p : NULL, with_sig ? 4 : 0)) {
            chan_refuse(self, c, "out of memory, or OpenSSL could not sign, a message to it");
            return false;
        }
        chan_agent_flush(self, c);
        return c->fd >= 0;
    }
    return false;
}

int dk_backchan_port(const dk_backchan_t *self)
{
    return self->port;
}

const char *dk_backchan_key_hex(const dk_backchan_t *self)
{
    return self->key_hex;
}

size_t dk_backchan_max_fds(const dk_backchan_t *self)
{
    return self->nconns + 1;
}

/* ------------------------------------------------------------------------ */
/* Polling                                                                   */

/* Heartbeats: a PING to each node agent that is due one, and the report of
 * one silent past the deadline. A rank has none of its own: a relayed rank
 * is a local one to its agent, whose heartbeats speak for its node. */
static void heartbeat(dk_backchan_t *self)
{
    if (self->heartbeat_s <= 0)
        return;
    double now = dk_now_s();
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0 || !chan_is_agent(self, c))
            continue;
        /* Bytes waiting unread are not silence: this loop was what was busy. */
        unsigned char peek;
        if (!c->lost && now - c->heard_at > self->heartbeat_s &&
            recv(c->fd, &peek, 1, MSG_PEEK | MSG_DONTWAIT) > 0)
            c->heard_at = now;
        if (!c->lost && now - c->heard_at > self->heartbeat_s) {
            c->lost = true;
            if (self->sink.on_lost)
                self->sink.on_lost(self->sink.data, c->rank, now - c->heard_at);
        }
        if (c->fd >= 0 && c->queue_len > 0 && !chan_conn_has_output(c))
            chan_agent_flush(self, c);
        if (c->fd >= 0 && now >= c->pinged_at + DK_BC_PING_S && !chan_conn_has_output(c)) {
            c->pinged_at = now;
            if (!chan_queue_empty(self, c, DK_FRAME_PING))
                chan_refuse(self, c, "OpenSSL could not sign a heartbeat");
            else
                chan_conn_write(self, c);
        }
    }
}

size_t dk_backchan_poll_fill(dk_backchan_t *self, struct pollfd *fds)
{
    chan_expire_pending(self);
    heartbeat(self);
    size_t n = 0;
    /* With every pending slot taken by connections too young to close, new
     * ones wait in the backlog; polling the listener then would only spin. */
    conn_t *oldest;
    self->polled_listener = self->listen_fd >= 0 &&
                            (chan_free_slot(self, &oldest) ||
                             (oldest && dk_now_s() - oldest->since >= EVICT_AFTER_S));
    if (self->polled_listener)
        fds[n++] = (struct pollfd) {.fd = self->listen_fd, .events = POLLIN};
    size_t k = 0;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0 || c->agent)
            continue;
        if (c->relay_due && !chan_conn_has_output(c))
            chan_relay_pump(self, c);
        if (c->fd < 0)
            continue;
        short events = POLLIN;
        if (chan_conn_has_output(c) || c->relay_due)
            events |= POLLOUT;
        fds[n++] = (struct pollfd) {.fd = c->fd, .events = events};
        self->polled[k++] = i;
    }
    return n;
}

void dk_backchan_poll_handle(dk_backchan_t *self, const struct pollfd *fds, size_t n)
{
    size_t first = self->polled_listener ? 1 : 0;
    for (size_t i = first; i < n; i++) {
        conn_t *c = &self->conns[self->polled[i - first]];
        short re = fds[i].revents;
        if (c->fd < 0 || c->fd != fds[i].fd || re == 0)
            continue;
        if (re & POLLOUT)
            chan_conn_write(self, c);
        if (c->fd >= 0 && c->relay_due && !chan_conn_has_output(c))
            chan_relay_pump(self, c);
        if (c->fd >= 0 && (re & (POLLIN | POLLHUP | POLLERR)))
            chan_conn_read(self, c, READ_BUDGET, READ_SLICE_S);
    }
    if (first && (fds[0].revents & POLLIN))
        chan_accept_all(self);
}

int dk_backchan_send_task(dk_backchan_t *self, uint32_t round, const void *payload, size_t len,
                          char *err, size_t errlen)
{
    if (len > DK_FRAME_TASK_MAX) {
        dk_set_err(err, errlen, "the payload is %zu bytes; a cell can carry at most 1 GiB to its "
                 "ranks (pass large data through files instead)", len);
        return -1;
    }
    unsigned char *copy = malloc(len ? len : 1);
    if (!copy) {
        dk_set_err(err, errlen, "out of memory (payload of %zu bytes)", len);
        return -1;
    }
    if (len)
        memcpy(copy, payload, len);
    /* Every frame of the last round has been written (each rank answered it),
     * so no connection still points into the old copy. */
    free(self->payload);
    self->payload = copy;
    self->payload_len = len;
    self->round = round;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0 || c->rank < 0 || chan_is_agent(self, c))
            continue;
        if (c->delivering) {
            /* Cannot happen with an honest rank (it answered the last task,
             * so it read it); a connection still owed bytes of the old copy
             * is closed rather than left pointing into freed memory. */
            chan_refuse(self, c, "it had not read its last task");
            continue;
        }
        c->done = false;
        if (!chan_queue_payload(self, c))
            chan_refuse(self, c, "OpenSSL could not sign the task");
        else
            chan_conn_write(self, c);
    }
    return 0;
}

void dk_backchan_drain(dk_backchan_t *self)
{
    /* What has arrived so far, and no more: an agent whose rank keeps sending
     * (a flood of OUTPUT) would otherwise keep this loop reading for as long
     * as it likes, and nothing else (a verdict, an interrupt, the timeout, our
     * PINGs) would happen meanwhile. The bytes queued on the socket now are
     * all that an exited rank, or its agent, can have sent; what comes later is read by the
     * poll loop under its budget. The queue is bounded by the socket's
     * receive buffer, and its reading by DRAIN_SLICE_S (a buffer full of tiny
     * frames is a flood, not a rank's last words). */
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0 || c->agent)
            continue;       /* a relayed rank's bytes come on its agent's */
        int queued = 0;
        if (ioctl(c->fd, FIONREAD, &queued) != 0 || queued < 0)
            queued = (int) READ_BUDGET;
        /* One byte more, so that an end of file behind them is seen too. */
        chan_conn_read(self, c, (size_t) queued + 1, DRAIN_SLICE_S);
    }
}
