/*
 * dk_tunnel: the tracking server's port on every node. See dk_tunnel.h.
 *
 * One thread per end. Its poll set is rebuilt on each turn: slot 0 the wake
 * pipe, slot 1 the listener, then two slots per connection (its two sockets;
 * a socket with nothing to wait for is given as -1, so that a hang-up it
 * cannot act on yet does not spin the loop).
 */
#include "dk_tunnel.h"

#include "dk_clock.h"
#include "dk_err.h"
#include "dk_sockowner.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { GATE, DOOR };
enum { HANDSHAKE, SPLICE };

/* One direction of a connection: bytes read from fd[i], not yet all written
 * to fd[1 - i]. */
typedef struct {
    unsigned char *buf;
    size_t len, off;
    bool eof;       /* its source said it has no more */
    bool shut;      /* and that was passed on (shutdown SHUT_WR) */
} dir_t;

typedef struct {
    int fd[2];          /* [0] the connection taken, [1] the one it goes on to */
    int state;
    unsigned char nonce[DK_FRAME_NONCE_LEN];
    unsigned char got[DK_FRAME_MAC_LEN];
    size_t ngot;
    long long deadline_ms;
    dir_t d[2];
} conn_t;

struct dk_tunnel_t {
    int role;
    int listen_fd;
    int port;
    int wake[2];
    dk_frame_key_t *key;
    dk_accept_t *allow;             /* gate: the run's nodes' addresses, or NULL */
    pthread_t thread;
    bool started;
    pthread_mutex_t lock;           /* the upstream and the stats */
    struct sockaddr_storage up;     /* gate: the server; door: the gate */
    socklen_t up_len;               /* 0: none */
    dk_tunnel_stats_t stats;
    conn_t *conns;                  /* the thread's own */
    size_t nconns, cap;
};

int dk_tunnel_parse_addr(const char *s, struct sockaddr_storage *out, unsigned *outlen, char *err,
                         size_t errlen)
{
    char host[INET6_ADDRSTRLEN + 2];
    const char *colon = s ? strrchr(s, ':') : NULL;
    size_t hl = colon ? (size_t) (colon - s) : 0;
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || hl == 0 || hl >= sizeof host || !colon[1] || *end || port < 1 || port > 65535) {
        dk_set_err(err, errlen, "'%s' is not HOST:PORT", s ? s : "");
        return -1;
    }
    memcpy(host, s, hl);
    host[hl] = '\0';
    memset(out, 0, sizeof *out);
    if (host[0] == '[' && host[hl - 1] == ']') {
        host[hl - 1] = '\0';
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *) out;
        if (inet_pton(AF_INET6, host + 1, &a6->sin6_addr) == 1) {
            a6->sin6_family = AF_INET6;
            a6->sin6_port = htons((uint16_t) port);
            *outlen = sizeof *a6;
            return 0;
        }
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *) out;
        if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
            a4->sin_family = AF_INET;
            a4->sin_port = htons((uint16_t) port);
            *outlen = sizeof *a4;
            return 0;
        }
    }
    dk_set_err(err, errlen, "'%s' is not a numeric address with a port", s);
    return -1;
}

bool dk_tunnel_proof(dk_frame_key_t *key, const unsigned char nonce[DK_FRAME_NONCE_LEN],
                     unsigned char out[DK_FRAME_MAC_LEN])
{
    return dk_frame_mac(key, nonce, DK_TUNNEL_PROOF_DIR, 0, DK_TUNNEL_PROOF_BODY,
                        sizeof DK_TUNNEL_PROOF_BODY - 1, NULL, 0, out);
}

static void count(dk_tunnel_t *t, unsigned long *field, long delta)
{
    pthread_mutex_lock(&t->lock);
    *field = (unsigned long) ((long) *field + delta);
    pthread_mutex_unlock(&t->lock);
}

static void conn_close(dk_tunnel_t *t, conn_t *c, bool refused)
{
    /* Counted first: whoever sees the close may look at the counts. */
    if (refused)
        count(t, &t->stats.refused, 1);
    if (c->state == SPLICE)
        count(t, &t->stats.open, -1);
    for (int i = 0; i < 2; i++) {
        if (c->fd[i] >= 0)
            close(c->fd[i]);
        free(c->d[i].buf);
    }
    memset(c, 0, sizeof *c);
    c->fd[0] = c->fd[1] = -1;
}

/* C from a handshake to copying, its second socket FD. */
static bool splice_start(dk_tunnel_t *t, conn_t *c, int fd)
{
    c->fd[1] = fd;
    c->d[0].buf = malloc(DK_TUNNEL_BUF);
    c->d[1].buf = malloc(DK_TUNNEL_BUF);
    if (!c->d[0].buf || !c->d[1].buf)
        return false;
    c->state = SPLICE;
    count(t, &t->stats.taken, 1);
    count(t, &t->stats.open, 1);
    return true;
}

/* A socket connected to ADDR, non-blocking, within TIMEOUT_MS; -1 when not. */
static int connect_to(const struct sockaddr_storage *addr, socklen_t len, int timeout_ms)
{
    int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *) addr, len) == 0)
        return fd;
    if (errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0 ||
        soerr != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* All of LEN bytes from FD (non-blocking) within TIMEOUT_MS. */
static bool read_full(int fd, unsigned char *buf, size_t len, int timeout_ms)
{
    long long until = dk_now_ms() + timeout_ms;
    size_t got = 0;
    while (got < len) {
        ssize_t n = recv(fd, buf + got, len - got, 0);
        if (n > 0) {
            got += (size_t) n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR))
            return false;
        long long left = until - dk_now_ms();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int) left) < 0)
            return false;
    }
    return true;
}

/* A door's new connection FD: a process of ours, then on to the gate. */
static void door_take(dk_tunnel_t *t, conn_t *c, int fd)
{
    unsigned uid;
    c->fd[0] = fd;
    if (dk_sockowner_peer_uid(fd, &uid, NULL, 0) < 0 || uid != (unsigned) geteuid()) {
        conn_close(t, c, true);
        return;
    }
    pthread_mutex_lock(&t->lock);
    struct sockaddr_storage gate = t->up;
    socklen_t gl = t->up_len;
    pthread_mutex_unlock(&t->lock);
    int g = connect_to(&gate, gl, (int) (DK_TUNNEL_HANDSHAKE_S * 1000));
    unsigned char nonce[DK_FRAME_NONCE_LEN], proof[DK_FRAME_MAC_LEN];
    bool ok = g >= 0 && read_full(g, nonce, sizeof nonce, (int) (DK_TUNNEL_HANDSHAKE_S * 1000)) &&
              dk_tunnel_proof(t->key, nonce, proof) &&
              send(g, proof, sizeof proof, MSG_NOSIGNAL) == (ssize_t) sizeof proof;
    if (!ok) {
        if (g >= 0)
            close(g);
        conn_close(t, c, true);
        return;
    }
    if (!splice_start(t, c, g))
        conn_close(t, c, true);
}

/* A gate's new connection FD: send it a nonce; its answer comes in the loop. */
static void gate_take(dk_tunnel_t *t, conn_t *c, int fd)
{
    c->fd[0] = fd;
    c->state = HANDSHAKE;
    c->deadline_ms = dk_now_ms() + (long long) (DK_TUNNEL_HANDSHAKE_S * 1000);
    if (RAND_bytes(c->nonce, sizeof c->nonce) != 1 ||
        send(fd, c->nonce, sizeof c->nonce, MSG_NOSIGNAL) != (ssize_t) sizeof c->nonce)
        conn_close(t, c, true);
}

/* A gate's connection in its handshake, readable. */
static void gate_answer(dk_tunnel_t *t, conn_t *c)
{
    ssize_t n = recv(c->fd[0], c->got + c->ngot, sizeof c->got - c->ngot, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        conn_close(t, c, true);
        return;
    }
    c->ngot += (size_t) n;
    if (c->ngot < sizeof c->got)
        return;
    unsigned char want[DK_FRAME_MAC_LEN];
    if (!dk_tunnel_proof(t->key, c->nonce, want) ||
        CRYPTO_memcmp(want, c->got, sizeof want) != 0) {
        conn_close(t, c, true);
        return;
    }
    pthread_mutex_lock(&t->lock);
    struct sockaddr_storage up = t->up;
    socklen_t ul = t->up_len;
    pthread_mutex_unlock(&t->lock);
    /* The server is on this host's loopback: the connect is over at once. */
    int s = ul ? connect_to(&up, ul, 2000) : -1;
    if (s < 0 || !splice_start(t, c, s)) {
        if (s >= 0)
            close(s);
        conn_close(t, c, true);
    }
}

/* Move C's bytes on where its sockets allow; false when it is over. */
static bool splice_turn(conn_t *c, const short revents[2])
{
    for (int i = 0; i < 2; i++) {
        dir_t *d = &c->d[i];
        int src = c->fd[i], dst = c->fd[1 - i];
        if (!d->eof && d->len == 0 && (revents[i] & (POLLIN | POLLHUP | POLLERR))) {
            ssize_t n = recv(src, d->buf, DK_TUNNEL_BUF, 0);
            if (n > 0) {
                d->len = (size_t) n;
                d->off = 0;
            } else if (n == 0) {
                d->eof = true;
            } else if (errno != EAGAIN && errno != EINTR) {
                return false;
            }
        }
        while (d->off < d->len) {
            ssize_t n = send(dst, d->buf + d->off, d->len - d->off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                d->off += (size_t) n;
            } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
                break;
            } else {
                return false;
            }
        }
        if (d->off == d->len)
            d->len = d->off = 0;
        if (d->eof && d->len == 0 && !d->shut) {
            shutdown(dst, SHUT_WR);
            d->shut = true;
        }
    }
    return !(c->d[0].shut && c->d[1].shut);
}

static void take_new(dk_tunnel_t *t)
{
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage peer;
        socklen_t pl = sizeof peer;
        int fd = accept4(t->listen_fd, (struct sockaddr *) &peer, &pl,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        size_t cap = t->role == GATE ? DK_TUNNEL_GATE_CAP : DK_TUNNEL_DOOR_CAP;
        if (t->nconns >= cap || (t->allow && !dk_accept_allows(t->allow,
                                                               (struct sockaddr *) &peer, pl))) {
            count(t, &t->stats.refused, 1);     /* before the close its peer sees */
            close(fd);
            continue;
        }
        if (t->nconns == t->cap) {
            size_t ncap = t->cap ? t->cap * 2 : 16;
            conn_t *more = realloc(t->conns, ncap * sizeof *more);
            if (!more) {
                count(t, &t->stats.refused, 1);
                close(fd);
                continue;
            }
            t->conns = more;
            t->cap = ncap;
        }
        conn_t *c = &t->conns[t->nconns++];
        memset(c, 0, sizeof *c);
        c->fd[0] = c->fd[1] = -1;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (t->role == GATE)
            gate_take(t, c, fd);
        else
            door_take(t, c, fd);
        if (c->fd[0] < 0)
            t->nconns--;    /* refused at once */
    }
}

static void *loop(void *arg)
{
    dk_tunnel_t *t = arg;
    struct pollfd *p = NULL;
    size_t pcap = 0;
    for (;;) {
        size_t n = 2 + 2 * t->nconns;
        if (n > pcap) {
            struct pollfd *more = realloc(p, n * sizeof *p);
            if (!more)
                break;
            p = more;
            pcap = n;
        }
        p[0] = (struct pollfd){.fd = t->wake[0], .events = POLLIN};
        p[1] = (struct pollfd){.fd = t->listen_fd, .events = POLLIN};
        long long now = dk_now_ms(), next = -1;
        for (size_t i = 0; i < t->nconns; i++) {
            conn_t *c = &t->conns[i];
            struct pollfd *q = &p[2 + 2 * i];
            q[0] = (struct pollfd){.fd = -1};
            q[1] = (struct pollfd){.fd = -1};
            if (c->state == HANDSHAKE) {
                q[0] = (struct pollfd){.fd = c->fd[0], .events = POLLIN};
                if (next < 0 || c->deadline_ms < next)
                    next = c->deadline_ms;
                continue;
            }
            short ev[2] = {0, 0};
            for (int k = 0; k < 2; k++) {
                if (!c->d[k].eof && c->d[k].len == 0)
                    ev[k] |= POLLIN;
                if (c->d[k].off < c->d[k].len)
                    ev[1 - k] |= POLLOUT;
            }
            for (int k = 0; k < 2; k++)
                if (ev[k])
                    q[k] = (struct pollfd){.fd = c->fd[k], .events = ev[k]};
        }
        int timeout = next < 0 ? -1 : next <= now ? 0 : (int) (next - now);
        if (poll(p, n, timeout) < 0 && errno != EINTR)
            break;
        if (p[0].revents)
            break;      /* dk_tunnel_destroy */
        now = dk_now_ms();
        size_t live = 0;
        size_t before = t->nconns;
        for (size_t i = 0; i < before; i++) {
            conn_t *c = &t->conns[i];
            short rev[2] = {p[2 + 2 * i].revents, p[3 + 2 * i].revents};
            if (c->state == HANDSHAKE) {
                if (rev[0])
                    gate_answer(t, c);
                else if (now >= c->deadline_ms)
                    conn_close(t, c, true);
            } else if ((rev[0] || rev[1]) && !splice_turn(c, rev)) {
                conn_close(t, c, false);
            }
            if (c->fd[0] >= 0)
                t->conns[live++] = *c;
        }
        t->nconns = live;
        if (p[1].revents & POLLIN)
            take_new(t);
    }
    free(p);
    return NULL;
}

static dk_tunnel_t *start(int role, const char *listen_addr, const unsigned char *key,
                          const char *upstream, dk_accept_t *allow, char *err, size_t errlen)
{
    dk_tunnel_t *t = calloc(1, sizeof *t);
    if (!t) {
        dk_accept_destroy(&allow);
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    t->allow = allow;
    t->role = role;
    t->listen_fd = t->wake[0] = t->wake[1] = -1;
    pthread_mutex_init(&t->lock, NULL);
    char addr_port[INET6_ADDRSTRLEN + 16];
    snprintf(addr_port, sizeof addr_port, strchr(listen_addr, ':') ? "[%s]:1" : "%s:1",
             listen_addr);
    struct sockaddr_storage la;
    unsigned ll;
    if (!(t->key = dk_frame_key_new(key))) {
        dk_set_err(err, errlen, "OpenSSL has no HMAC-SHA256");
        goto fail;
    }
    if (dk_tunnel_parse_addr(addr_port, &la, &ll, err, errlen) < 0)
        goto fail;
    ((struct sockaddr_in *) &la)->sin_port = 0;    /* same offset in sockaddr_in6 */
    if (upstream && dk_tunnel_set_upstream(t, upstream, err, errlen) < 0)
        goto fail;
    t->listen_fd = socket(la.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_storage bound;
    socklen_t bl = sizeof bound;
    if (t->listen_fd < 0 || bind(t->listen_fd, (struct sockaddr *) &la, ll) < 0 ||
        listen(t->listen_fd, 128) < 0 ||
        getsockname(t->listen_fd, (struct sockaddr *) &bound, &bl) < 0) {
        dk_set_err(err, errlen, "cannot listen on %s: %s", listen_addr, strerror(errno));
        goto fail;
    }
    t->port = ntohs(((struct sockaddr_in *) &bound)->sin_port);
    if (pipe2(t->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        dk_set_err(err, errlen, "pipe: %s", strerror(errno));
        goto fail;
    }
    if (pthread_create(&t->thread, NULL, loop, t) != 0) {
        dk_set_err(err, errlen, "cannot start a thread");
        goto fail;
    }
    t->started = true;
    return t;
fail:
    dk_tunnel_destroy(&t);
    return NULL;
}

dk_tunnel_t *dk_tunnel_gate_new(const char *addr, const unsigned char *key, const char *upstream,
                                dk_accept_t *allow, char *err, size_t errlen)
{
    return start(GATE, addr, key, upstream, allow, err, errlen);
}

dk_tunnel_t *dk_tunnel_door_new(const char *gate, const unsigned char *key, char *err,
                                size_t errlen)
{
    if (!gate) {
        dk_set_err(err, errlen, "no gate to go to");
        return NULL;
    }
    return start(DOOR, "127.0.0.1", key, gate, NULL, err, errlen);
}

int dk_tunnel_port(const dk_tunnel_t *self)
{
    return self->port;
}

int dk_tunnel_set_upstream(dk_tunnel_t *self, const char *upstream, char *err, size_t errlen)
{
    struct sockaddr_storage a;
    unsigned len = 0;
    if (upstream && dk_tunnel_parse_addr(upstream, &a, &len, err, errlen) < 0)
        return -1;
    pthread_mutex_lock(&self->lock);
    if (upstream)
        self->up = a;
    self->up_len = (socklen_t) len;
    pthread_mutex_unlock(&self->lock);
    return 0;
}

void dk_tunnel_stats(dk_tunnel_t *self, dk_tunnel_stats_t *out)
{
    pthread_mutex_lock(&self->lock);
    *out = self->stats;
    pthread_mutex_unlock(&self->lock);
}

void dk_tunnel_destroy(dk_tunnel_t **self_p)
{
    dk_tunnel_t *t = self_p ? *self_p : NULL;
    if (!t)
        return;
    if (t->started) {
        ssize_t w;
        do
            w = write(t->wake[1], "q", 1);
        while (w < 0 && errno == EINTR);
        pthread_join(t->thread, NULL);
    }
    for (size_t i = 0; i < t->nconns; i++)
        conn_close(t, &t->conns[i], false);
    free(t->conns);
    for (int i = 0; i < 2; i++)
        if (t->wake[i] >= 0)
            close(t->wake[i]);
    if (t->listen_fd >= 0)
        close(t->listen_fd);
    dk_frame_key_destroy(&t->key);
    dk_accept_destroy(&t->allow);
    pthread_mutex_destroy(&t->lock);
    free(t);
    *self_p = NULL;
}
