/*
 * dk_backchan_admit: which accepted connection may take one of the slots.
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
 */
#include "dk_backchan_state.h"
#include "dk_clock.h"
#include "dk_peer.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/rand.h>

#define ACCEPT_BUDGET 64                   /* connections accepted (or dropped) per poll turn */

/* Close the connections that have waited for their HELLO past the deadline. */
void chan_expire_pending(dk_backchan_t *self)
{
    double now = dk_now_s();
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd >= 0 && c->rank < 0 && now - c->since >= DK_BC_HELLO_DEADLINE_S)
            chan_refuse(self, c, "it did not say HELLO within " DK_BC_STR(DK_BC_HELLO_DEADLINE_S) " s");
    }
}

/* A free slot for a new connection, or NULL when every slot is taken; then
 * *OLDEST is the connection that has waited longest for its HELLO (NULL if
 * every slot holds a rank). */
conn_t *chan_free_slot(dk_backchan_t *self, conn_t **oldest)
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
    if (!chan_free_slot((dk_backchan_t *) self, &oldest) && oldest &&
        oldest->since + EVICT_AFTER_S < next)
        next = oldest->since + EVICT_AFTER_S;
    for (size_t i = 0; self->heartbeat_s > 0 && i < self->nconns; i++) {
        const conn_t *c = &self->conns[i];
        if (c->fd < 0 || !chan_is_agent(self, c))
            continue;
        double ping = c->pinged_at + DK_BC_PING_S, silent = c->heard_at + self->heartbeat_s;
        if (!chan_conn_has_output(c) && (next < 0 || ping < next))
            next = ping;
        if (!c->lost && (next < 0 || silent < next))
            next = silent;
    }
    return next;
}

/* Whether a connection waiting to be accepted can have a slot now, making one
 * by closing the longest-waiting pending connection if it has had
 * EVICT_AFTER_S. If not, the connection waits in the listen backlog. */
conn_t *chan_slot_for_new(dk_backchan_t *self)
{
    conn_t *oldest;
    conn_t *slot = chan_free_slot(self, &oldest);
    if (slot || !oldest || dk_now_s() - oldest->since < EVICT_AFTER_S)
        return slot;
    chan_refuse(self, oldest, "it had not said HELLO and every slot was wanted");
    return oldest;
}

/* Whether the connection just accepted as FD, from PEER, may take a slot:
 * over TCP with an allow-list, only one from the run's nodes. Others are
 * closed here; the first is named to the user, the rest only counted (a
 * flood must not flood the notebook too). */
static bool admit(dk_backchan_t *self, int fd, const struct sockaddr_storage *peer,
                  socklen_t plen)
{
    /* Over a Unix socket, only our own user's processes (dk_peer.h): its
     * folder is 0700, and this holds even if it were not. */
    if (!self->port) {
        char why[160];
        if (dk_peer_check(fd, "a connection to the back channel", why, sizeof why) == 0)
            return true;
        close(fd);
        if (self->dropped++ == 0)
            chan_warn(self, "back channel: dropped %s", why);
        return false;
    }
    if (!self->allow || dk_accept_allows(self->allow, (const struct sockaddr *) peer, plen))
        return true;
    close(fd);
    if (self->dropped++ == 0) {
        char text[64];
        dk_accept_peer_text((const struct sockaddr *) peer, text, sizeof text);
        chan_warn(self, "back channel: dropped a connection from %s, which is not one of the "
             "run's nodes (any further ones are dropped without a word)", text);
    }
    return false;
}

void chan_accept_all(dk_backchan_t *self)
{
    chan_expire_pending(self);
    for (int k = 0; k < ACCEPT_BUDGET && self->listen_fd >= 0; k++) {
        conn_t *slot = chan_slot_for_new(self);
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
            chan_warn(self, "back channel: out of file descriptors (%s); no further ranks can "
                 "connect", strerror(errno));
            close(self->listen_fd);
            self->listen_fd = -1;
            return;
        }
        if (fd < 0)
            return;
        if (!admit(self, fd, &peer, plen))
            continue;
        chan_conn_close(self, slot);
        slot->fd = fd;
        slot->rank = -1;
        slot->since = slot->heard_at = slot->pinged_at = dk_now_s();
        if (self->port) {
            /* Frames are small and answered at once: no Nagle delay. */
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        }
        chan_conn_start(self, slot);
    }
}

/* C was just accepted (or opened by its agent): its nonce goes first. */
void chan_conn_start(dk_backchan_t *self, conn_t *c)
{
    unsigned char nonce[DK_FRAME_NONCE_LEN];
    if (RAND_bytes(nonce, sizeof nonce) != 1) {
        chan_refuse(self, c, "OpenSSL could not make a nonce");
        return;
    }
    dk_frame_side_init(&c->side, self->key, nonce, DK_FRAME_DIR_TO_RANK);
    memcpy(c->head, nonce, sizeof nonce);
    c->head_len = sizeof nonce;
    chan_conn_write(self, c);
}
