/*
 * dk_backchan_frame: the frames on one back-channel connection.
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
 * Every frame is sealed and verified by dk_frame (whose header specifies the
 * wire) over the job's key, set up once (self->key), and the connection's
 * side (c->side: its nonce and counts). A PAYLOAD or TASK frame's body is
 * sealed in two pieces (the small head here, the payload where it lies), so
 * it is never assembled in memory. We seal in direction DK_FRAME_DIR_TO_RANK
 * and verify DK_FRAME_DIR_TO_RUNTIME: a frame of ours sent back to us (a
 * PING's body is the same both ways) does not verify.
 */
#include "dk_backchan_state.h"
#include "dk_be32.h"
#include "dk_clock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The peer ended connection C. A rank that had not answered is told to the
 * job: its end is judged by its exit, but over the network that exit may
 * never come (an srun stuck after its node was lost), and the job bounds the
 * wait (dk_job_chan.c, bc_closed). */
static void peer_closed(dk_backchan_t *self, conn_t *c)
{
    int rank = c->rank;
    bool unanswered = rank >= 0 && !c->done;
    chan_conn_close(self, c);
    if (unanswered && self->sink.on_closed)
        self->sink.on_closed(self->sink.data, rank);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                   */

bool chan_conn_has_output(const conn_t *c)
{
    return c->head_off < c->head_len || c->body_off < c->body_len;
}

/* SENT bytes of C's output have gone (to its socket, or into its agent's
 * queue): the head's first, then the body's. */
void chan_conn_advance(conn_t *c, size_t sent)
{
    size_t from_head = c->head_len - c->head_off < sent ? c->head_len - c->head_off : sent;
    c->head_off += from_head;
    c->body_off += sent - from_head;
}

/* Everything C had to send has gone. */
void chan_conn_written(dk_backchan_t *self, conn_t *c)
{
    c->head_off = c->head_len = 0;
    if (c->owned_body) {
        free(c->owned_body);
        c->owned_body = NULL;
        c->body = NULL;
        c->body_len = c->body_off = 0;
    }
    if (c->delivering) {
        c->delivering = false;
        if (self->sink.on_delivered)
            self->sink.on_delivered(self->sink.data, c->rank);
    }
}

void chan_conn_write(dk_backchan_t *self, conn_t *c)
{
    if (c->fd == RELAYED_FD) {
        /* Its agent's connection carries it, at the agent's next turn
         * (chan_relay_pump). */
        if (c->agent && chan_conn_has_output(c))
            c->agent->relay_due = true;
        return;
    }
    while (chan_conn_has_output(c)) {
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
        chan_conn_advance(c, (size_t) n);
    }
    chan_conn_written(self, c);
}

/* Queue the PAYLOAD frame for C's rank, or in a persistent channel the TASK
 * frame of the current round (its body head then ends with the round). */
bool chan_queue_payload(dk_backchan_t *self, conn_t *c)
{
    unsigned char body_head[DK_FRAME_BODY_HEAD + 4];
    size_t head_n = DK_FRAME_BODY_HEAD;
    body_head[0] = self->persistent ? DK_FRAME_TASK : DK_FRAME_PAYLOAD;
    dk_put_be32(body_head + 1, (uint32_t) c->rank);
    if (self->persistent) {
        dk_put_be32(body_head + DK_FRAME_BODY_HEAD, self->round);
        head_n += 4;
    }
    if (c->head_off > 0) {      /* never in practice: the nonce went before the HELLO came */
        memmove(c->head, c->head + c->head_off, c->head_len - c->head_off);
        c->head_len -= c->head_off;
        c->head_off = 0;
    }
    size_t n = dk_frame_seal_head(&c->side, body_head, head_n, self->payload, self->payload_len,
                                  c->head + c->head_len);
    if (n == 0)
        return false;
    c->head_len += n;
    c->body = self->payload;
    c->body_len = self->payload_len;
    c->body_off = 0;
    c->delivering = true;
    return true;
}


/* Append the PORT frame (the run's MASTER_PORT) to C's head, after whatever
 * small frame is still being written there (a PING); nothing with a body is
 * queued on C yet (its PAYLOAD or TASK follows this). */
static bool queue_port(dk_backchan_t *self, conn_t *c)
{
    unsigned char body[DK_FRAME_BODY_HEAD + 4];
    body[0] = DK_FRAME_PORT;
    dk_put_be32(body + 1, (uint32_t) c->rank);
    dk_put_be32(body + DK_FRAME_BODY_HEAD, (uint32_t) self->master_port);
    if (c->head_off > 0) {
        memmove(c->head, c->head + c->head_off, c->head_len - c->head_off);
        c->head_len -= c->head_off;
        c->head_off = 0;
    }
    size_t n = dk_frame_seal_head(&c->side, body, sizeof body, NULL, 0, c->head + c->head_len);
    c->head_len += n;
    return n > 0;
}

/* C's rank is ready for its work: the PORT frame first when the port comes
 * from rank 0, then the PAYLOAD (or, persistent, on_hello: tasks may come).
 * False when it was refused (closed). */
static bool rank_ready(dk_backchan_t *self, conn_t *c)
{
    if (self->port_from_rank0 && !queue_port(self, c)) {
        chan_refuse(self, c, "OpenSSL could not sign the port");
        return false;
    }
    if (self->persistent) {
        c->done = true;     /* nothing to answer until the first TASK */
        if (chan_conn_has_output(c))
            chan_conn_write(self, c);
        if (c->fd >= 0 && self->sink.on_hello)
            self->sink.on_hello(self->sink.data, c->rank);
        return c->fd >= 0;
    }
    if (!chan_queue_payload(self, c)) {
        chan_refuse(self, c, "OpenSSL could not sign the payload");
        return false;
    }
    chan_conn_write(self, c);
    return c->fd >= 0;
}

/* Rank 0's PORT frame (port_from_rank0): every rank waiting for it gets it. */
static void port_arrived(dk_backchan_t *self, conn_t *c0, const unsigned char *payload,
                         size_t len)
{
    uint32_t port = len == 4 ? dk_get_be32(payload) : 0;
    if (port == 0 || port > 65535) {
        chan_refuse(self, c0, "its PORT message did not hold a TCP port (1-65535)");
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

/* Queue an empty frame of TYPE (a PING) on C (nothing else is
 * being written on it). */
bool chan_queue_empty(dk_backchan_t *self, conn_t *c, unsigned char type)
{
    unsigned char body[DK_FRAME_BODY_HEAD];
    body[0] = type;
    dk_put_be32(body + 1, (uint32_t) c->rank);
    size_t n = dk_frame_seal_head(&c->side, body, sizeof body, NULL, 0, c->head);
    if (n == 0)
        return false;
    c->head_off = 0;
    c->head_len = n;
    c->body = NULL;
    c->body_len = c->body_off = 0;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Node agents                                                               */

bool chan_is_agent(const dk_backchan_t *self, const conn_t *c)
{
    return c->rank >= self->world_size;
}

/* Append one sealed frame to C's queue (written by chan_agent_flush). */
bool chan_agent_queue(dk_backchan_t *self, conn_t *c, int type, uint32_t id,
                      const unsigned char *payload, size_t len)
{
    size_t n = 4 + DK_FRAME_MAC_LEN + DK_FRAME_BODY_HEAD + len;
    unsigned char *q = realloc(c->queue, c->queue_len + n);
    if (!q)
        return false;
    c->queue = q;
    unsigned char *f = q + c->queue_len;
    unsigned char *body = f + 4 + DK_FRAME_MAC_LEN;
    body[0] = (unsigned char) type;
    dk_put_be32(body + 1, id);
    if (len)
        memcpy(body + DK_FRAME_BODY_HEAD, payload, len);
    if (dk_frame_seal_head(&c->side, body, DK_FRAME_BODY_HEAD + len, NULL, 0, f) == 0)
        return false;
    c->queue_len += n;
    return true;
}

/* Start writing C's queue when nothing else is being written. */
void chan_agent_flush(dk_backchan_t *self, conn_t *c)
{
    if (c->fd < 0 || c->queue_len == 0 || chan_conn_has_output(c))
        return;
    c->owned_body = c->queue;
    c->body = c->queue;
    c->body_len = c->queue_len;
    c->body_off = 0;
    c->queue = NULL;
    c->queue_len = 0;
    chan_conn_write(self, c);
}

/* A frame on an agent's connection, verified: ID names a rank of its node. */
static void agent_frame(dk_backchan_t *self, conn_t *c, int type, uint32_t id,
                        const unsigned char *p, size_t len)
{
    int node = c->rank - self->world_size;
    uint32_t first = (uint32_t) node * (uint32_t) self->ranks_per_node;
    if (type == DK_FRAME_PING)
        return;     /* its arrival was the point (heard_at) */
    if (type == DK_FRAME_RELAY || type == DK_FRAME_RELAY_END) {
        chan_relay_frame(self, c, type, id, p, len);
        return;
    }
    if (id < first || id >= first + (uint32_t) self->ranks_per_node ||
        id >= (uint32_t) self->world_size) {
        chan_refuse(self, c, "its agent spoke of a rank that is not on its node");
        return;
    }
    int rank = (int) id;
    if (type == DK_FRAME_STARTED)
        return;     /* the pid is the agent's business; its exit comes as EXIT */
    if (type == DK_FRAME_EXIT && len == 8) {
        if (self->sink.on_agent_exit)
            self->sink.on_agent_exit(self->sink.data, rank, (int) dk_get_be32(p),
                                     (int) dk_get_be32(p + 4));
    } else if (type == DK_FRAME_OUTPUT && len >= 2 && (p[0] == 1 || p[0] == 2) &&
               len - 2 <= DK_FRAME_OUTPUT_MAX) {
        if (self->sink.on_output)
            self->sink.on_output(self->sink.data, rank, p[0], p + 2, len - 2,
                                 (p[1] & DK_FRAME_OUTPUT_CAUGHT_UP) != 0);
    } else if (type == DK_FRAME_STACKS && len <= DK_FRAME_STACKS_MAX) {
        if (self->sink.on_stacks)
            self->sink.on_stacks(self->sink.data, rank, p, len);
    } else {
        chan_refuse(self, c, "its agent sent a message of an unexpected type or size");
    }
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */

void chan_refuse(dk_backchan_t *self, conn_t *c, const char *why)
{
    if (c->rank < 0)
        chan_warn(self, "back channel: refused a connection: %s", why);
    else
        chan_warn(self, "back channel: closed rank %d's connection: %s", c->rank, why);
    chan_conn_close(self, c);
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
            chan_refuse(self, c, "every rank is in and it had not said HELLO");
    }
}

/* A whole frame has arrived in c->frame: verify, then act. */
/* An agent's AGENT_HELLO, naming its node (RANK), on a connection of its own. */
static void agent_hello(dk_backchan_t *self, conn_t *c, uint32_t rank)
{
    char why[160];
    uint32_t id = (uint32_t) self->world_size + rank;
    if (rank >= (uint32_t) self->agents) {
        snprintf(why, sizeof why, "its AGENT_HELLO named node %u, but this job has %d "
                 "agent%s", rank, self->agents, self->agents == 1 ? "" : "s");
        chan_refuse(self, c, why);
    } else if (self->claimed[id]) {
        snprintf(why, sizeof why, "its AGENT_HELLO named node %u, whose agent is already "
                 "connected", rank);
        chan_refuse(self, c, why);
    } else {
        self->claimed[id] = true;
        self->nclaimed++;
        c->rank = (int) id;
        if (self->nclaimed == self->world_size + self->agents)
            stop_listening(self);
        if (self->sink.on_agent_hello)
            self->sink.on_agent_hello(self->sink.data, (int) rank);
    }
}

/* The first message on a rank's connection (direct, or relayed by its
 * node's agent): a HELLO naming RANK, or the connection is refused. */
static void rank_hello(dk_backchan_t *self, conn_t *c, int type, uint32_t rank)
{
    char why[160];
    if (type != DK_FRAME_HELLO) {
        chan_refuse(self, c, "its first message was not a HELLO");
    } else if (rank >= (uint32_t) self->world_size) {
        snprintf(why, sizeof why, "its HELLO named rank %u, but this job has ranks 0 to %d",
                 rank, self->world_size - 1);
        chan_refuse(self, c, why);
    } else if (self->claimed[rank]) {
        snprintf(why, sizeof why, "its HELLO named rank %u, which is already connected",
                 rank);
        chan_refuse(self, c, why);
    } else if (c->agent && rank / (uint32_t) self->ranks_per_node !=
                               (uint32_t) (c->agent->rank - self->world_size)) {
        snprintf(why, sizeof why, "its HELLO named rank %u, which is not on the node of "
                 "the agent that relays it", rank);
        chan_refuse(self, c, why);
    } else {
        self->claimed[rank] = true;
        self->nclaimed++;
        c->rank = (int) rank;
        /* Before the rank is reported ready: whoever hears that every
         * rank is in finds nothing listening. */
        if (self->nclaimed == self->world_size + self->agents)
            stop_listening(self);
        /* With the port from rank 0, every rank waits for it: rank 0's
         * own PORT frame follows its HELLO. */
        if (self->port_from_rank0 && (rank == 0 || self->master_port == 0))
            c->port_due = true;
        else
            rank_ready(self, c);
    }
}

/* A message on a connection that has said its HELLO: an agent's, or rank
 * RANK's PORT, OUTPUT, RESULT or ERROR. */
static void hello_said_frame(dk_backchan_t *self, conn_t *c, int type, uint32_t rank,
                             const unsigned char *body, size_t body_len)
{
    if (chan_is_agent(self, c)) {
        agent_frame(self, c, type, rank, body + DK_FRAME_BODY_HEAD, body_len - DK_FRAME_BODY_HEAD);
    } else if (rank != (uint32_t) c->rank) {
        chan_refuse(self, c, "a message named another rank");
    } else if (type == DK_FRAME_PORT) {
        if (!self->port_from_rank0 || c->rank != 0 || self->master_port != 0)
            chan_refuse(self, c, "it sent a port nobody asked for");
        else
            port_arrived(self, c, body + DK_FRAME_BODY_HEAD, body_len - DK_FRAME_BODY_HEAD);
    } else if (type == DK_FRAME_OUTPUT) {
        int fd = body_len >= DK_FRAME_BODY_HEAD + 2 ? body[DK_FRAME_BODY_HEAD] : 0;
        if ((fd != 1 && fd != 2 && fd != DK_FRAME_OUTPUT_LOG) ||
            body_len - DK_FRAME_BODY_HEAD - 2 > DK_FRAME_OUTPUT_MAX)
            chan_refuse(self, c, "it sent output that is not for fd 1 or 2 or its log, or more "
                   "than 64 KiB in one message");
        else if (self->sink.on_output)
            self->sink.on_output(self->sink.data, c->rank, fd, body + DK_FRAME_BODY_HEAD + 2,
                                 body_len - DK_FRAME_BODY_HEAD - 2,
                                 (body[DK_FRAME_BODY_HEAD + 1] & DK_FRAME_OUTPUT_CAUGHT_UP) != 0);
    } else if (type != DK_FRAME_RESULT && type != DK_FRAME_ERROR)
        chan_refuse(self, c, "it sent a message of an unexpected type");
    else if (c->done)
        chan_refuse(self, c, self->persistent ? "it answered with no task waiting for an answer"
                                         : "it sent a second result");
    else if (self->persistent && c->delivering)
        /* An answer before its TASK has been read in full is not an answer to
         * it; and the TASK still being written must not be freed or queued
         * over by the next round. */
        chan_refuse(self, c, "it answered before it had read its task");
    else if (self->persistent && (body_len < DK_FRAME_BODY_HEAD + 4 ||
                                  dk_get_be32(body + DK_FRAME_BODY_HEAD) != self->round))
        chan_refuse(self, c, "its answer did not name the current round");
    else {
        c->done = true;
        size_t skip = DK_FRAME_BODY_HEAD + (self->persistent ? 4 : 0);
        if (self->sink.on_message)
            self->sink.on_message(self->sink.data, c->rank, type == DK_FRAME_ERROR,
                                  body + skip, body_len - skip);
    }
}

static void conn_frame(dk_backchan_t *self, conn_t *c)
{
    const unsigned char *body = c->frame + DK_FRAME_MAC_LEN;
    size_t body_len = c->frame_len - DK_FRAME_MAC_LEN;
    if (!dk_frame_verify(&c->side, c->frame, c->frame_len)) {
        chan_refuse(self, c, "a message did not verify (it was not signed with this job's key)");
        return;
    }
    int type = body[0];
    uint32_t rank = dk_get_be32(body + 1);

    /* With node agents, every rank's connection is relayed by its agent, and
     * only a connection of its own may be an agent's: a direct connection
     * saying a rank's HELLO, or a relayed one saying AGENT_HELLO, is neither. */
    if (c->rank < 0 && self->agents > 0 && type == DK_FRAME_HELLO && !c->agent) {
        chan_refuse(self, c, "it said a rank's HELLO on a connection of its own, but this job's "
                    "ranks reach it through their node agents");
        return;
    }
    if (c->rank < 0 && type == DK_FRAME_AGENT_HELLO && c->agent) {
        chan_refuse(self, c, "a relayed connection said AGENT_HELLO");
        return;
    }
    if (c->rank < 0 && type == DK_FRAME_AGENT_HELLO)
        agent_hello(self, c, rank);
    else if (c->rank < 0)
        rank_hello(self, c, type, rank);
    else
        hello_said_frame(self, c, type, rank, body, body_len);
}

/* A frame's length has arrived: check it against what this connection may
 * send before allocating anything. */
static bool conn_frame_start(dk_backchan_t *self, conn_t *c)
{
    uint32_t len = dk_get_be32(c->len_buf);
    char why[160];
    if (c->rank < 0 && len != FRAME_MIN) {
        snprintf(why, sizeof why, "its first message (%u bytes) is not a HELLO", len);
        chan_refuse(self, c, why);
        return false;
    }
    if (len < FRAME_MIN || len - FRAME_MIN > DK_FRAME_PAYLOAD_MAX) {
        snprintf(why, sizeof why, "a message of %u bytes is outside the protocol's limits "
                 "(%d bytes to 1 GiB)", len, FRAME_MIN);
        chan_refuse(self, c, why);
        return false;
    }
    if (!(c->frame = malloc(len))) {
        chan_refuse(self, c, "out of memory for its message");
        return false;
    }
    c->frame_len = len;
    c->frame_have = 0;
    return true;
}

/* Where C's next bytes go (its frame's length, then its frame) and how many
 * it wants there. */
static unsigned char *conn_want(conn_t *c, size_t *want)
{
    if (!c->frame) {
        *want = sizeof c->len_buf - c->len_have;
        return c->len_buf + c->len_have;
    }
    *want = c->frame_len - c->frame_have;
    return c->frame + c->frame_have;
}

/* N bytes have landed where conn_want said: -1 when C was closed (refused,
 * or by what its frame did), 1 when a whole frame was acted on, else 0. */
static int conn_took(dk_backchan_t *self, conn_t *c, size_t n)
{
    if (!c->frame) {
        c->len_have += n;
        if (c->len_have == sizeof c->len_buf && !conn_frame_start(self, c))
            return -1;
        return 0;
    }
    if ((c->frame_have += n) < c->frame_len)
        return 0;
    conn_frame(self, c);
    if (c->fd < 0)
        return -1;
    free(c->frame);
    c->frame = NULL;
    c->len_have = 0;
    return 1;
}

/* Read until EAGAIN, EOF, BUDGET bytes, or the first whole frame after
 * SLICE_S seconds. */
void chan_conn_read(dk_backchan_t *self, conn_t *c, size_t budget, double slice_s)
{
    double until = dk_now_s() + slice_s;
    while (c->fd >= 0 && budget > 0) {
        size_t want;
        unsigned char *dst = conn_want(c, &want);
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
        int took = conn_took(self, c, (size_t) n);
        if (took < 0 || (took > 0 && dk_now_s() >= until))
            return;
    }
}

/* LEN bytes of relayed connection C's stream, as its agent carried them:
 * read as chan_conn_read reads a socket's. */
void chan_conn_feed(dk_backchan_t *self, conn_t *c, const unsigned char *p, size_t len)
{
    c->heard_at = dk_now_s();
    while (c->fd >= 0 && len > 0) {
        size_t want;
        unsigned char *dst = conn_want(c, &want);
        if (want > len)
            want = len;
        memcpy(dst, p, want);
        p += want;
        len -= want;
        if (conn_took(self, c, want) < 0)
            return;
    }
}
