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
 * Admission (issue 21 item 4, issue 22). Over TCP, a connection whose peer
 * address is not one of the run's nodes is closed right after accept4, before
 * it takes a slot or costs a nonce (dk_accept.h): a stranger's flood costs an
 * accept and a close each. What is accepted goes into a fixed set of
 * world_size + DK_BC_SLACK slots, so every rank not yet in can wait for its
 * HELLO at once, however many connect in the same second: strangers aside,
 * the ranks are never short of slots. The set is the
 * bound on memory and descriptors: at 1,024 ranks, 1,088 slots of ~330 bytes
 * (~350 KiB), each connection before its HELLO holding at most one HELLO-sized
 * frame (37 bytes), and 1,088 descriptors plus the listener, as
 * dk_fdlimit_job_check reserves. A connection that has not said HELLO within
 * DK_BC_HELLO_DEADLINE_S is closed; and when every slot is taken (only
 * connections from the nodes' own addresses that do not authenticate can
 * do that), the one that has waited longest gives its slot up once it has
 * had EVICT_AFTER_S, so such connections cannot keep a rank out for long (a
 * rank closed that way before its nonce arrives connects again: the rank's
 * side retries until the connect deadline).
 * The listen backlog is the world plus the slack (the system caps it at
 * net.core.somaxconn), so hundreds of ranks connecting at once are queued by
 * the system rather than dropped and retried a second later.
 *
 * Once every rank has said a valid HELLO, the listener is closed (and the
 * Unix socket unlinked) and any connection still waiting for a HELLO is
 * closed: no rank can claim a second connection, so nothing listens for the
 * life of started ranks.
 *
 * Every descriptor is non-blocking and each connection has its own input and
 * output state, so a slow reader of a large payload or a peer trickling a
 * frame byte by byte holds up nobody. The payload is kept once; each rank's
 * output is a small header (nonce, length, MAC, type, rank) plus a pointer into
 * that copy, sent with sendmsg(MSG_NOSIGNAL) so a vanished reader is an error
 * code, not a SIGPIPE to the host.
 *
 * The MAC of a PAYLOAD frame covers the whole payload and differs per
 * connection (the nonce), so it is computed once per rank when its HELLO
 * arrives: about a quarter second per rank for 500 MB, during which this loop
 * does nothing else. Ranks are waiting for exactly that payload at that moment,
 * so nothing useful is delayed.
 *
 * Warnings are capped: a local process looping on connect must not flood the
 * notebook.
 *
 * Ranks on other nodes (dk_backchan_opts_t): the listener is a TCP socket
 * bound to the one address the nodes route to, never a wildcard, so the
 * channel is reachable from the cluster's network and from nothing else this
 * host is on. Nothing else changes: a connection from anywhere earns nothing
 * before its HELLO verifies, and the same limits hold. Over the network a
 * peer can vanish without a FIN (a node powered off, a cut link), so there
 * each side sends a PING every DK_BC_PING_S, and a connection silent for
 * longer than the heartbeat deadline is reported (on_lost) once. A PING is
 * queued only when nothing else is being written: a connection busy with a
 * payload is talking anyway. Remote ranks' fd 1/2 arrive as OUTPUT frames.
 *
 * A persistent channel (started ranks) sends nothing at HELLO. Each round,
 * dk_backchan_send_task replaces the one payload copy (every connection has
 * written the last one by then: its rank answered it) and queues a TASK frame
 * per connection with that connection's next sequence number; the round in
 * the frame, and in the answer, ties each answer to its task.
 */
#include "dk_backchan.h"
#include "dk_accept.h"
#include "dk_err.h"
#include "dk_clock.h"
#include "dk_logdir.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#define READ_BUDGET ((size_t) 4 << 20)     /* bytes per connection per poll turn */
/* ... and seconds: a flood of tiny frames costs a MAC and a callback each, so
 * bytes alone do not bound a turn's time (4 MiB of 44-byte frames is ~95,000
 * of them). The drain's slice is longer: it is reading what ranks said
 * before they exited. */
#define READ_SLICE_S 0.05
#define DRAIN_SLICE_S 0.25
#define ACCEPT_BUDGET 64                   /* connections accepted (or dropped) per poll turn */
#define EVICT_AFTER_S 0.5                  /* a pending connection's HELLO time when others wait */
#define WARNINGS_MAX 20
#define BODY_HEAD 5                        /* u8 type | u32 rank */
#define FRAME_MIN (DK_BC_MAC_LEN + BODY_HEAD)
#define SOCKET_NAME "bc.sock"

typedef struct {
    int fd;                 /* -1: free slot */
    int rank;               /* -1 until a valid HELLO */
    double since;           /* when it was accepted (CLOCK_MONOTONIC seconds) */
    bool done;              /* RESULT or ERROR received */
    bool delivering;        /* PAYLOAD frame queued, not yet reported written */
    double heard_at;        /* when bytes last arrived (heartbeats) */
    double pinged_at;       /* when we last queued a PING */
    bool lost;              /* reported silent past the deadline */
    bool interrupt_due;     /* an INTERRUPT to send once the output is written */
    bool stacks_due;        /* a STACKS request to send likewise */
    bool port_due;          /* port_from_rank0: its HELLO came before the port; its
                               PORT (and PAYLOAD) go out once rank 0 sends it */
    unsigned char nonce[DK_BC_NONCE_LEN];
    uint32_t seq_in;
    uint32_t seq_out;       /* frames we have sent after the nonce */
    /* input: a 4-byte length, then a frame of that many bytes */
    unsigned char len_buf[4];
    size_t len_have;
    unsigned char *frame;
    size_t frame_len, frame_have;
    /* output: a small head (the nonce or a PING still being written, then a
     * frame's header), then a borrowed body */
    unsigned char head[DK_BC_NONCE_LEN + 4 + FRAME_MIN + 4 + FRAME_MIN + 4 + 4 + FRAME_MIN + 4];
    size_t head_len, head_off;
    const unsigned char *body;
    size_t body_len, body_off;
} conn_t;

struct dk_backchan_t {
    int world_size;
    dk_backchan_sink_t sink;
    char *dir;
    char *path;             /* Unix socket; NULL for TCP */
    char *address;          /* what ranks get in DISTKERNEL_BC */
    int port;               /* TCP only */
    double heartbeat_s;     /* > 0: PINGs and the silence deadline */
    int listen_fd;
    unsigned char key[DK_BC_KEY_LEN];
    char key_hex[DK_BC_KEY_LEN * 2 + 1];
    EVP_MAC *mac;
    unsigned char *payload;
    size_t payload_len;
    bool persistent;        /* rounds of TASK frames; nothing sent at HELLO */
    uint32_t round;         /* the round a RESULT or ERROR must name */
    bool port_from_rank0;   /* opts.port_from_rank0 */
    int master_port;        /* ... and the port rank 0 sent; 0 until then */
    bool *claimed;          /* per rank: a connection has said HELLO for it */
    int nclaimed;           /* ... how many ranks have */
    dk_accept_t *allow;     /* TCP: the run's nodes' addresses; NULL: any */
    unsigned long dropped;  /* connections closed at accept: not from a node */
    conn_t *conns;
    size_t nconns;
    size_t *polled;         /* conn slot of each pollfd entry after the listener */
    bool polled_listener;
    unsigned warnings;
};

static void warn(dk_backchan_t *self, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void warn(dk_backchan_t *self, const char *fmt, ...)
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

static void put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char) (v >> 24);
    p[1] = (unsigned char) (v >> 16);
    p[2] = (unsigned char) (v >> 8);
    p[3] = (unsigned char) v;
}

static uint32_t get_be32(const unsigned char *p)
{
    return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

/* MAC = HMAC-SHA256(key, nonce | u8 direction | u32 seq | head | tail); head
 * and tail are the body in at most two pieces, so a PAYLOAD frame is never
 * assembled in memory. DIR is DK_BC_DIR_TO_RANK for what we send and
 * DK_BC_DIR_TO_RUNTIME for what we verify: a frame of ours sent back to us
 * (a PING's body is the same both ways) does not verify. */
static bool frame_mac(dk_backchan_t *self, const unsigned char *nonce, unsigned char dir,
                      uint32_t seq, const unsigned char *head, size_t head_len,
                      const unsigned char *tail, size_t tail_len,
                      unsigned char out[DK_BC_MAC_LEN])
{
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    unsigned char seq_be[4];
    put_be32(seq_be, seq);
    size_t out_len = 0;
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(self->mac);
    bool ok = ctx && EVP_MAC_init(ctx, self->key, sizeof self->key, params) &&
              EVP_MAC_update(ctx, nonce, DK_BC_NONCE_LEN) && EVP_MAC_update(ctx, &dir, 1) &&
              EVP_MAC_update(ctx, seq_be, 4) &&
              EVP_MAC_update(ctx, head, head_len) &&
              (tail_len == 0 || EVP_MAC_update(ctx, tail, tail_len)) &&
              EVP_MAC_final(ctx, out, &out_len, DK_BC_MAC_LEN) && out_len == DK_BC_MAC_LEN;
    EVP_MAC_CTX_free(ctx);
    return ok;
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
    self->nconns = (size_t) world_size + DK_BC_SLACK;
    self->claimed = calloc((size_t) world_size, sizeof *self->claimed);
    self->conns = calloc(self->nconns, sizeof *self->conns);
    self->polled = calloc(self->nconns, sizeof *self->polled);
    self->mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (payload_len > 0)
        self->payload = malloc(payload_len);
    if (!self->claimed || !self->conns || !self->polled || (payload_len > 0 && !self->payload)) {
        dk_set_err(err, errlen, "out of memory (payload of %zu bytes)", payload_len);
        goto fail;
    }
    if (!self->mac || RAND_bytes(self->key, sizeof self->key) != 1) {
        dk_set_err(err, errlen, "OpenSSL cannot provide HMAC-SHA256 or random bytes for the "
                   "back-channel key");
        goto fail;
    }
    for (size_t i = 0; i < self->nconns; i++)
        self->conns[i].fd = -1;
    if (payload_len > 0)
        memcpy(self->payload, payload, payload_len);
    self->payload_len = payload_len;
    for (size_t i = 0; i < sizeof self->key; i++)
        snprintf(self->key_hex + 2 * i, 3, "%02x", self->key[i]);
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

static void conn_close(conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->frame);
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->rank = -1;
}

/* The peer ended connection C. A rank that had not answered is told to the
 * job: its end is judged by its exit, but over the network that exit may
 * never come (an srun stuck after its node was lost), and the job bounds the
 * wait (dk_job.c, bc_closed). */
static void peer_closed(dk_backchan_t *self, conn_t *c)
{
    int rank = c->rank;
    bool unanswered = rank >= 0 && !c->done;
    conn_close(c);
    if (unanswered && self->sink.on_closed)
        self->sink.on_closed(self->sink.data, rank);
}

void dk_backchan_close_all(dk_backchan_t *self)
{
    for (size_t i = 0; i < self->nconns; i++)
        conn_close(&self->conns[i]);
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
    if (self->dir)
        rmdir(self->dir);
    OPENSSL_cleanse(self->key, sizeof self->key);
    OPENSSL_cleanse(self->key_hex, sizeof self->key_hex);
    EVP_MAC_free(self->mac);
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
    return rank >= 0 && rank < self->world_size && self->claimed[rank];
}

static void heartbeat(dk_backchan_t *self);

bool dk_backchan_interrupt(dk_backchan_t *self, int rank)
{
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0 || c->rank != rank)
            continue;
        c->interrupt_due = true;
        /* Now, when the connection is free; else after what it is writing
         * (the next turn's heartbeat). */
        if (self->heartbeat_s > 0)
            heartbeat(self);
        return true;
    }
    return false;
}

bool dk_backchan_ask_stacks(dk_backchan_t *self, int rank)
{
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0 || c->rank != rank || c->lost)
            continue;
        c->stacks_due = true;
        if (self->heartbeat_s > 0)
            heartbeat(self);
        return true;
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
/* Writing                                                                   */

static bool conn_has_output(const conn_t *c)
{
    return c->head_off < c->head_len || c->body_off < c->body_len;
}

static void conn_write(dk_backchan_t *self, conn_t *c)
{
    while (conn_has_output(c)) {
        struct iovec iov[2] = {
            {c->head + c->head_off, c->head_len - c->head_off},
            {(void *) (c->body + c->body_off), c->body_len - c->body_off},
        };
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov[0].iov_len ? iov : iov + 1;
        msg.msg_iovlen = iov[0].iov_len ? 2 : 1;
        ssize_t n = sendmsg(c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n < 0) {
            peer_closed(self, c);   /* the peer went away */
            return;
        }
        size_t sent = (size_t) n;
        size_t from_head = c->head_len - c->head_off < sent ? c->head_len - c->head_off : sent;
        c->head_off += from_head;
        c->body_off += sent - from_head;
    }
    c->head_off = c->head_len = 0;
    if (c->delivering) {
        c->delivering = false;
        if (self->sink.on_delivered)
            self->sink.on_delivered(self->sink.data, c->rank);
    }
}

/* Queue the PAYLOAD frame for C's rank, or in a persistent channel the TASK
 * frame of the current round (its body head then ends with the round). */
static bool queue_payload(dk_backchan_t *self, conn_t *c)
{
    unsigned char body_head[BODY_HEAD + 4];
    size_t head_n = BODY_HEAD;
    body_head[0] = self->persistent ? DK_BC_TASK : DK_BC_PAYLOAD;
    put_be32(body_head + 1, (uint32_t) c->rank);
    if (self->persistent) {
        put_be32(body_head + BODY_HEAD, self->round);
        head_n += 4;
    }
    unsigned char mac[DK_BC_MAC_LEN];
    if (!frame_mac(self, c->nonce, DK_BC_DIR_TO_RANK, c->seq_out, body_head, head_n,
                   self->payload, self->payload_len, mac))
        return false;
    c->seq_out++;
    if (c->head_off > 0) {      /* never in practice: the nonce went before the HELLO came */
        memmove(c->head, c->head + c->head_off, c->head_len - c->head_off);
        c->head_len -= c->head_off;
        c->head_off = 0;
    }
    unsigned char *h = c->head + c->head_len;
    put_be32(h, (uint32_t) (DK_BC_MAC_LEN + head_n + self->payload_len));
    memcpy(h + 4, mac, sizeof mac);
    memcpy(h + 4 + DK_BC_MAC_LEN, body_head, head_n);
    c->head_len += 4 + DK_BC_MAC_LEN + head_n;
    c->body = self->payload;
    c->body_len = self->payload_len;
    c->body_off = 0;
    c->delivering = true;
    return true;
}

static void refuse(dk_backchan_t *self, conn_t *c, const char *why);

/* Append the PORT frame (the run's MASTER_PORT) to C's head, after whatever
 * small frame is still being written there (a PING); nothing with a body is
 * queued on C yet (its PAYLOAD or TASK follows this). */
static bool queue_port(dk_backchan_t *self, conn_t *c)
{
    unsigned char body[BODY_HEAD + 4];
    body[0] = DK_BC_PORT;
    put_be32(body + 1, (uint32_t) c->rank);
    put_be32(body + BODY_HEAD, (uint32_t) self->master_port);
    unsigned char mac[DK_BC_MAC_LEN];
    if (!frame_mac(self, c->nonce, DK_BC_DIR_TO_RANK, c->seq_out, body, sizeof body, NULL, 0,
                   mac))
        return false;
    c->seq_out++;
    if (c->head_off > 0) {
        memmove(c->head, c->head + c->head_off, c->head_len - c->head_off);
        c->head_len -= c->head_off;
        c->head_off = 0;
    }
    unsigned char *h = c->head + c->head_len;
    put_be32(h, (uint32_t) (DK_BC_MAC_LEN + sizeof body));
    memcpy(h + 4, mac, sizeof mac);
    memcpy(h + 4 + DK_BC_MAC_LEN, body, sizeof body);
    c->head_len += 4 + DK_BC_MAC_LEN + sizeof body;
    return true;
}

/* C's rank is ready for its work: the PORT frame first when the port comes
 * from rank 0, then the PAYLOAD (or, persistent, on_hello: tasks may come).
 * False when it was refused (closed). */
static bool rank_ready(dk_backchan_t *self, conn_t *c)
{
    if (self->port_from_rank0 && !queue_port(self, c)) {
        refuse(self, c, "OpenSSL could not sign the port");
        return false;
    }
    if (self->persistent) {
        c->done = true;     /* nothing to answer until the first TASK */
        if (conn_has_output(c))
            conn_write(self, c);
        if (c->fd >= 0 && self->sink.on_hello)
            self->sink.on_hello(self->sink.data, c->rank);
        return c->fd >= 0;
    }
    if (!queue_payload(self, c)) {
        refuse(self, c, "OpenSSL could not sign the payload");
        return false;
    }
    conn_write(self, c);
    return c->fd >= 0;
}

/* Rank 0's PORT frame (port_from_rank0): every rank waiting for it gets it. */
static void port_arrived(dk_backchan_t *self, conn_t *c0, const unsigned char *payload,
                         size_t len)
{
    uint32_t port = len == 4 ? get_be32(payload) : 0;
    if (port == 0 || port > 65535) {
        refuse(self, c0, "its PORT message did not hold a TCP port (1-65535)");
        return;
    }
    self->master_port = (int) port;
    c0->port_due = true;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd >= 0 && c->rank >= 0 && c->port_due) {
            c->port_due = false;
            rank_ready(self, c);
        }
    }
}

int dk_backchan_master_port(const dk_backchan_t *self)
{
    return self->master_port;
}

/* Queue an empty frame of TYPE (a PING, an INTERRUPT) on C (nothing else is
 * being written on it). */
static bool queue_empty(dk_backchan_t *self, conn_t *c, unsigned char type)
{
    unsigned char body[BODY_HEAD];
    body[0] = type;
    put_be32(body + 1, (uint32_t) c->rank);
    unsigned char mac[DK_BC_MAC_LEN];
    if (!frame_mac(self, c->nonce, DK_BC_DIR_TO_RANK, c->seq_out, body, sizeof body, NULL, 0,
                   mac))
        return false;
    c->seq_out++;
    put_be32(c->head, (uint32_t) (DK_BC_MAC_LEN + sizeof body));
    memcpy(c->head + 4, mac, sizeof mac);
    memcpy(c->head + 4 + DK_BC_MAC_LEN, body, sizeof body);
    c->head_off = 0;
    c->head_len = 4 + DK_BC_MAC_LEN + sizeof body;
    c->body = NULL;
    c->body_len = c->body_off = 0;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */

static void refuse(dk_backchan_t *self, conn_t *c, const char *why)
{
    if (c->rank < 0)
        warn(self, "back channel: refused a connection: %s", why);
    else
        warn(self, "back channel: closed rank %d's connection: %s", c->rank, why);
    conn_close(c);
}

/* Every rank has said HELLO: no one else has anything to say here. Close the
 * listener (unlink the Unix socket) and whatever still waits for its HELLO. */
static void stop_listening(dk_backchan_t *self)
{
    if (self->listen_fd >= 0)
        close(self->listen_fd);
    self->listen_fd = -1;
    if (self->path)
        unlink(self->path);
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd >= 0 && c->rank < 0)
            refuse(self, c, "every rank is in and it had not said HELLO");
    }
}

/* A whole frame has arrived in c->frame: verify, then act. */
static void conn_frame(dk_backchan_t *self, conn_t *c)
{
    const unsigned char *body = c->frame + DK_BC_MAC_LEN;
    size_t body_len = c->frame_len - DK_BC_MAC_LEN;
    unsigned char expected[DK_BC_MAC_LEN];
    if (!frame_mac(self, c->nonce, DK_BC_DIR_TO_RUNTIME, c->seq_in, body, body_len, NULL, 0,
                   expected) ||
        CRYPTO_memcmp(expected, c->frame, DK_BC_MAC_LEN) != 0) {
        refuse(self, c, "a message did not verify (it was not signed with this job's key)");
        return;
    }
    c->seq_in++;
    int type = body[0];
    uint32_t rank = get_be32(body + 1);
    char why[160];

    if (c->rank < 0) {
        if (type != DK_BC_HELLO) {
            refuse(self, c, "its first message was not a HELLO");
        } else if (rank >= (uint32_t) self->world_size) {
            snprintf(why, sizeof why, "its HELLO named rank %u, but this job has ranks 0 to %d",
                     rank, self->world_size - 1);
            refuse(self, c, why);
        } else if (self->claimed[rank]) {
            snprintf(why, sizeof why, "its HELLO named rank %u, which is already connected",
                     rank);
            refuse(self, c, why);
        } else {
            self->claimed[rank] = true;
            self->nclaimed++;
            c->rank = (int) rank;
            /* Before the rank is reported ready: whoever hears that every
             * rank is in finds nothing listening. */
            if (self->nclaimed == self->world_size)
                stop_listening(self);
            /* With the port from rank 0, every rank waits for it: rank 0's
             * own PORT frame follows its HELLO. */
            if (self->port_from_rank0 && (rank == 0 || self->master_port == 0))
                c->port_due = true;
            else
                rank_ready(self, c);
        }
        return;
    }
    if (rank != (uint32_t) c->rank) {
        refuse(self, c, "a message named another rank");
    } else if (type == DK_BC_PORT) {
        if (!self->port_from_rank0 || c->rank != 0 || self->master_port != 0)
            refuse(self, c, "it sent a port nobody asked for");
        else
            port_arrived(self, c, body + BODY_HEAD, body_len - BODY_HEAD);
    } else if (type == DK_BC_PING) {
        /* Its arrival was the point (heard_at). */
    } else if (type == DK_BC_STACKS) {
        if (body_len - BODY_HEAD > DK_BC_STACKS_MAX)
            refuse(self, c, "it sent more than 128 KiB of stacks in one message");
        else if (self->sink.on_stacks)
            self->sink.on_stacks(self->sink.data, c->rank, body + BODY_HEAD,
                                 body_len - BODY_HEAD);
    } else if (type == DK_BC_OUTPUT) {
        int fd = body_len >= BODY_HEAD + 2 ? body[BODY_HEAD] : 0;
        if ((fd != 1 && fd != 2 && fd != DK_BC_OUTPUT_LOG) ||
            body_len - BODY_HEAD - 2 > DK_BC_OUTPUT_MAX)
            refuse(self, c, "it sent output that is not for fd 1 or 2 or its log, or more "
                   "than 64 KiB in one message");
        else if (self->sink.on_output)
            self->sink.on_output(self->sink.data, c->rank, fd, body + BODY_HEAD + 2,
                                 body_len - BODY_HEAD - 2,
                                 (body[BODY_HEAD + 1] & DK_BC_OUTPUT_CAUGHT_UP) != 0);
    } else if (type != DK_BC_RESULT && type != DK_BC_ERROR)
        refuse(self, c, "it sent a message of an unexpected type");
    else if (c->done)
        refuse(self, c, self->persistent ? "it answered with no task waiting for an answer"
                                         : "it sent a second result");
    else if (self->persistent && c->delivering)
        /* An answer before its TASK has been read in full is not an answer to
         * it; and the TASK still being written must not be freed or queued
         * over by the next round. */
        refuse(self, c, "it answered before it had read its task");
    else if (self->persistent &&
             (body_len < BODY_HEAD + 4 || get_be32(body + BODY_HEAD) != self->round))
        refuse(self, c, "its answer did not name the current round");
    else {
        c->done = true;
        size_t skip = BODY_HEAD + (self->persistent ? 4 : 0);
        if (self->sink.on_message)
            self->sink.on_message(self->sink.data, c->rank, type == DK_BC_ERROR,
                                  body + skip, body_len - skip);
    }
}

/* A frame's length has arrived: check it against what this connection may
 * send before allocating anything. */
static bool conn_frame_start(dk_backchan_t *self, conn_t *c)
{
    uint32_t len = get_be32(c->len_buf);
    char why[160];
    if (c->rank < 0 && len != FRAME_MIN) {
        snprintf(why, sizeof why, "its first message (%u bytes) is not a HELLO", len);
        refuse(self, c, why);
        return false;
    }
    if (len < FRAME_MIN || len - FRAME_MIN > DK_BC_PAYLOAD_MAX) {
        snprintf(why, sizeof why, "a message of %u bytes is outside the protocol's limits "
                 "(%d bytes to 1 GiB)", len, FRAME_MIN);
        refuse(self, c, why);
        return false;
    }
    if (!(c->frame = malloc(len))) {
        refuse(self, c, "out of memory for its message");
        return false;
    }
    c->frame_len = len;
    c->frame_have = 0;
    return true;
}

/* Read until EAGAIN, EOF, BUDGET bytes, or the first whole frame after
 * SLICE_S seconds. */
static void conn_read(dk_backchan_t *self, conn_t *c, size_t budget, double slice_s)
{
    double until = dk_now_s() + slice_s;
    while (c->fd >= 0 && budget > 0) {
        unsigned char *dst;
        size_t want;
        if (!c->frame) {
            dst = c->len_buf + c->len_have;
            want = sizeof c->len_buf - c->len_have;
        } else {
            dst = c->frame + c->frame_have;
            want = c->frame_len - c->frame_have;
        }
        if (want > budget)
            want = budget;
        ssize_t n = recv(c->fd, dst, want, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            peer_closed(self, c);   /* EOF or reset */
            return;
        }
        budget -= (size_t) n;
        c->heard_at = dk_now_s();
        if (!c->frame) {
            c->len_have += (size_t) n;
            if (c->len_have == sizeof c->len_buf && !conn_frame_start(self, c))
                return;
        } else if ((c->frame_have += (size_t) n) == c->frame_len) {
            conn_frame(self, c);
            if (c->fd < 0)
                return;
            free(c->frame);
            c->frame = NULL;
            c->len_have = 0;
            if (dk_now_s() >= until)
                return;
        }
    }
}

/* Close the connections that have waited for their HELLO past the deadline. */
static void expire_pending(dk_backchan_t *self)
{
    double now = dk_now_s();
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd >= 0 && c->rank < 0 && now - c->since >= DK_BC_HELLO_DEADLINE_S)
            refuse(self, c, "it did not say HELLO within " DK_BC_STR(DK_BC_HELLO_DEADLINE_S) " s");
    }
}

/* A free slot for a new connection, or NULL when every slot is taken; then
 * *OLDEST is the connection that has waited longest for its HELLO (NULL if
 * every slot holds a rank). */
static conn_t *free_slot(dk_backchan_t *self, conn_t **oldest)
{
    *oldest = NULL;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0)
            return c;
        if (c->rank < 0 && (!*oldest || c->since < (*oldest)->since))
            *oldest = c;
    }
    return NULL;
}

double dk_backchan_deadline(const dk_backchan_t *self)
{
    double next = -1;
    for (size_t i = 0; i < self->nconns; i++) {
        const conn_t *c = &self->conns[i];
        if (c->fd >= 0 && c->rank < 0 && (next < 0 || c->since + DK_BC_HELLO_DEADLINE_S < next))
            next = c->since + DK_BC_HELLO_DEADLINE_S;
    }
    conn_t *oldest;
    if (!free_slot((dk_backchan_t *) self, &oldest) && oldest &&
        oldest->since + EVICT_AFTER_S < next)
        next = oldest->since + EVICT_AFTER_S;
    for (size_t i = 0; self->heartbeat_s > 0 && i < self->nconns; i++) {
        const conn_t *c = &self->conns[i];
        if (c->fd < 0 || c->rank < 0)
            continue;
        double ping = c->pinged_at + DK_BC_PING_S, silent = c->heard_at + self->heartbeat_s;
        if (!conn_has_output(c) && (next < 0 || ping < next))
            next = ping;
        if (!c->lost && (next < 0 || silent < next))
            next = silent;
    }
    return next;
}

/* Whether a connection waiting to be accepted can have a slot now, making one
 * by closing the longest-waiting pending connection if it has had
 * EVICT_AFTER_S. If not, the connection waits in the listen backlog. */
static conn_t *slot_for_new(dk_backchan_t *self)
{
    conn_t *oldest;
    conn_t *slot = free_slot(self, &oldest);
    if (slot || !oldest || dk_now_s() - oldest->since < EVICT_AFTER_S)
        return slot;
    refuse(self, oldest, "it had not said HELLO and every slot was wanted");
    return oldest;
}

/* Whether the connection just accepted as FD, from PEER, may take a slot:
 * over TCP with an allow-list, only one from the run's nodes. Others are
 * closed here; the first is named to the user, the rest only counted (a
 * flood must not flood the notebook too). */
static bool admit(dk_backchan_t *self, int fd, const struct sockaddr_storage *peer,
                  socklen_t plen)
{
    if (!self->allow || dk_accept_allows(self->allow, (const struct sockaddr *) peer, plen))
        return true;
    close(fd);
    if (self->dropped++ == 0) {
        char text[64];
        dk_accept_peer_text((const struct sockaddr *) peer, text, sizeof text);
        warn(self, "back channel: dropped a connection from %s, which is not one of the "
             "run's nodes (any further ones are dropped without a word)", text);
    }
    return false;
}

static void accept_all(dk_backchan_t *self)
{
    expire_pending(self);
    for (int k = 0; k < ACCEPT_BUDGET && self->listen_fd >= 0; k++) {
        conn_t *slot = slot_for_new(self);
        if (!slot)
            return;
        struct sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        int fd = accept4(self->listen_fd, (struct sockaddr *) &peer, &plen,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && errno == EINTR)
            continue;
        if (fd < 0 && (errno == EMFILE || errno == ENFILE)) {
            /* A listener we cannot accept from stays readable forever; stop. */
            warn(self, "back channel: out of file descriptors (%s); no further ranks can "
                 "connect", strerror(errno));
            close(self->listen_fd);
            self->listen_fd = -1;
            return;
        }
        if (fd < 0)
            return;
        if (!admit(self, fd, &peer, plen))
            continue;
        conn_close(slot);
        slot->fd = fd;
        slot->rank = -1;
        slot->since = slot->heard_at = slot->pinged_at = dk_now_s();
        if (self->port) {
            /* Frames are small and answered at once: no Nagle delay. */
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        if (RAND_bytes(slot->nonce, sizeof slot->nonce) != 1) {
            refuse(self, slot, "OpenSSL could not make a nonce");
            continue;
        }
        memcpy(slot->head, slot->nonce, sizeof slot->nonce);
        slot->head_len = sizeof slot->nonce;
        conn_write(self, slot);
    }
}

/* ------------------------------------------------------------------------ */
/* Polling                                                                   */

/* Heartbeats: a PING to each rank that is due one, and the report of a rank
 * silent past the deadline. */
static void heartbeat(dk_backchan_t *self)
{
    if (self->heartbeat_s <= 0)
        return;
    double now = dk_now_s();
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0 || c->rank < 0)
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
        if (c->fd >= 0 && c->interrupt_due && !conn_has_output(c)) {
            c->interrupt_due = false;
            if (!queue_empty(self, c, DK_BC_INTERRUPT))
                refuse(self, c, "OpenSSL could not sign an interrupt");
            else
                conn_write(self, c);
        }
        if (c->fd >= 0 && c->stacks_due && !conn_has_output(c)) {
            c->stacks_due = false;
            if (!queue_empty(self, c, DK_BC_STACKS))
                refuse(self, c, "OpenSSL could not sign a request for stacks");
            else
                conn_write(self, c);
        }
        if (c->fd >= 0 && now >= c->pinged_at + DK_BC_PING_S && !conn_has_output(c)) {
            c->pinged_at = now;
            if (!queue_empty(self, c, DK_BC_PING))
                refuse(self, c, "OpenSSL could not sign a heartbeat");
            else
                conn_write(self, c);
        }
    }
}

size_t dk_backchan_poll_fill(dk_backchan_t *self, struct pollfd *fds)
{
    expire_pending(self);
    heartbeat(self);
    size_t n = 0;
    /* With every pending slot taken by connections too young to close, new
     * ones wait in the backlog; polling the listener then would only spin. */
    conn_t *oldest;
    self->polled_listener = self->listen_fd >= 0 &&
                            (free_slot(self, &oldest) ||
                             (oldest && dk_now_s() - oldest->since >= EVICT_AFTER_S));
    if (self->polled_listener)
        fds[n++] = (struct pollfd) {.fd = self->listen_fd, .events = POLLIN};
    size_t k = 0;
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0)
            continue;
        short events = POLLIN;
        if (conn_has_output(c))
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
            conn_write(self, c);
        if (c->fd >= 0 && (re & (POLLIN | POLLHUP | POLLERR)))
            conn_read(self, c, READ_BUDGET, READ_SLICE_S);
    }
    if (first && (fds[0].revents & POLLIN))
        accept_all(self);
}

int dk_backchan_send_task(dk_backchan_t *self, uint32_t round, const void *payload, size_t len,
                          char *err, size_t errlen)
{
    if (len > DK_BC_TASK_MAX) {
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
        if (c->fd < 0 || c->rank < 0)
            continue;
        if (c->delivering) {
            /* Cannot happen with an honest rank (it answered the last task,
             * so it read it); a connection still owed bytes of the old copy
             * is closed rather than left pointing into freed memory. */
            refuse(self, c, "it had not read its last task");
            continue;
        }
        c->done = false;
        if (!queue_payload(self, c))
            refuse(self, c, "OpenSSL could not sign the task");
        else
            conn_write(self, c);
    }
    return 0;
}

void dk_backchan_drain(dk_backchan_t *self)
{
    /* What has arrived so far, and no more: a remote rank that keeps sending
     * (a flood of OUTPUT) would otherwise keep this loop reading for as long
     * as it likes, and nothing else (a verdict, an interrupt, the timeout, our
     * PINGs) would happen meanwhile. The bytes queued on the socket now are
     * all that an exited rank can have sent; what comes later is read by the
     * poll loop under its budget. The queue is bounded by the socket's
     * receive buffer, and its reading by DRAIN_SLICE_S (a buffer full of tiny
     * frames is a flood, not a rank's last words). */
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd < 0)
            continue;
        int queued = 0;
        if (ioctl(c->fd, FIONREAD, &queued) != 0 || queued < 0)
            queued = (int) READ_BUDGET;
        /* One byte more, so that an end of file behind them is seen too. */
        conn_read(self, c, (size_t) queued + 1, DRAIN_SLICE_S);
    }
}
