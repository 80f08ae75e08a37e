/*
 * dk_backchan_relay: ranks' connections relayed by their node's agent.
 *
 * A rank started by a node agent connects to the agent's Unix socket, and
 * the agent carries the connection's bytes on its own (DK_FRAME_RELAY, one
 * stream per rank connection). Here each such stream is a connection like
 * any other (conn_t, with fd RELAYED_FD and its agent): it is sent a nonce,
 * says HELLO, is verified, sent its PORT, PAYLOAD or TASKs, and answers,
 * frame for frame as over a socket of its own; only its bytes come from its
 * agent's RELAY frames (chan_conn_feed) and go into its agent's queue
 * (chan_relay_pump). So a run of 1,024 ranks on 128 nodes is 128
 * connections to poll and write, not 1,152, and a node's ranks' frames share
 * its agent's reads and writes.
 *
 * The agent can neither forge nor alter a rank's frames: they keep their MACs
 * over the nonce sent here. It holds the key anyway (it is one of the run's
 * processes, started with it); what the relay adds is that a stream's HELLO
 * must name a rank of the agent's own node.
 *
 * A relayed connection has no heartbeats of its own: to its agent the rank
 * is local (its output is read from its pipes, its exit seen by a pidfd),
 * and the agent's heartbeats speak for the node. Its close is the agent's
 * RELAY_END (the rank closed, or exited); ours is a RELAY_END to the agent,
 * which closes the rank's connection (an idle started rank's cue to exit).
 *
 * Writing: when an agent's connection has nothing in flight, its relayed
 * connections' pending bytes are cut into RELAY frames of at most
 * DK_FRAME_RELAY_MAX, a connection at a time from where the last pump stopped
 * (so a large payload to one rank does not hold up the others' frames for
 * long), up to QUEUE_MAX at once: what the kernel holds for a node beyond
 * its ranks' own output is bounded, and a payload is never copied whole.
 */
#include "dk_backchan_state.h"
#include "dk_clock.h"

#include <stdlib.h>
#include <string.h>

#define QUEUE_MAX ((size_t) 256 << 10)     /* RELAY bytes queued on an agent at once */

static conn_t *find_stream(dk_backchan_t *self, const conn_t *agent, uint32_t stream)
{
    for (size_t i = 0; i < self->nconns; i++) {
        conn_t *c = &self->conns[i];
        if (c->fd == RELAYED_FD && c->agent == agent && c->stream == stream)
            return c;
    }
    return NULL;
}

static size_t streams_of(const dk_backchan_t *self, const conn_t *agent)
{
    size_t n = 0;
    for (size_t i = 0; i < self->nconns; i++)
        n += self->conns[i].fd == RELAYED_FD && self->conns[i].agent == agent;
    return n;
}

/* The agent opens STREAM: a rank has connected to it. */
static void open_stream(dk_backchan_t *self, conn_t *agent, uint32_t stream)
{
    if (self->listen_fd < 0 ||
        streams_of(self, agent) >= (size_t) self->ranks_per_node + DK_BC_RELAY_SLACK) {
        /* Every rank is in (nothing more may say HELLO), or the agent has
         * more connections open than its node has ranks: refused, as a
         * socket's would be. */
        if (chan_agent_queue(self, agent, DK_FRAME_RELAY_END, stream, NULL, 0))
            agent->relay_due = true;
        return;
    }
    conn_t *slot = chan_slot_for_new(self);
    if (!slot) {
        if (chan_agent_queue(self, agent, DK_FRAME_RELAY_END, stream, NULL, 0))
            agent->relay_due = true;
        return;
    }
    chan_conn_close(self, slot);
    slot->fd = RELAYED_FD;
    slot->agent = agent;
    slot->stream = stream;
    slot->rank = -1;
    slot->since = slot->heard_at = slot->pinged_at = dk_now_s();
    chan_conn_start(self, slot);
}

void chan_relay_frame(dk_backchan_t *self, conn_t *agent, int type, uint32_t stream,
                      const unsigned char *p, size_t len)
{
    if (len > DK_FRAME_RELAY_MAX || (type == DK_FRAME_RELAY_END && len != 0)) {
        chan_refuse(self, agent, "its agent relayed a message of an unexpected size");
        return;
    }
    conn_t *c = find_stream(self, agent, stream);
    if (type == DK_FRAME_RELAY_END) {
        if (!c)
            return;     /* one we closed: its end crossed ours */
        int rank = c->rank;
        bool unanswered = rank >= 0 && !c->done;
        c->agent = NULL;    /* ended there: nothing to tell back */
        chan_conn_close(self, c);
        if (unanswered && self->sink.on_closed)
            self->sink.on_closed(self->sink.data, rank);
        return;
    }
    if (!c) {
        /* A new stream (empty), or the rest of one we closed (its bytes
         * crossed our RELAY_END): dropped. */
        if (len == 0)
            open_stream(self, agent, stream);
        return;
    }
    chan_conn_feed(self, c, p, len);
}

/* Bytes of C's output, at most MAX, as one RELAY frame on AGENT's queue.
 * False when nothing could be queued (out of memory, OpenSSL). */
static bool relay_some(dk_backchan_t *self, conn_t *agent, conn_t *c, size_t max)
{
    static unsigned char chunk[DK_FRAME_RELAY_MAX];
    size_t n = 0;
    size_t from_head = c->head_len - c->head_off;
    if (from_head > max)
        from_head = max;
    memcpy(chunk, c->head + c->head_off, from_head);
    n = from_head;
    size_t from_body = c->body_len - c->body_off;
    if (from_body > max - n)
        from_body = max - n;
    if (from_body)
        memcpy(chunk + n, c->body + c->body_off, from_body);
    n += from_body;
    if (!chan_agent_queue(self, agent, DK_FRAME_RELAY, c->stream, chunk, n))
        return false;
    chan_conn_advance(c, n);
    if (!chan_conn_has_output(c))
        chan_conn_written(self, c);
    return true;
}

void chan_relay_pump(dk_backchan_t *self, conn_t *agent)
{
    agent->relay_due = false;
    if (agent->fd < 0)
        return;
    /* Round robin over the agent's relayed connections, from the one after
     * where the last pump stopped (remembered in the agent's stream field,
     * which an agent's own connection does not use). */
    size_t n = self->nconns, start = agent->stream % (n ? n : 1);
    bool more = false;
    for (size_t k = 0; k < n; k++) {
        size_t i = (start + k) % n;
        conn_t *c = &self->conns[i];
        if (c->fd != RELAYED_FD || c->agent != agent || !chan_conn_has_output(c))
            continue;
        if (agent->queue_len >= QUEUE_MAX) {
            more = true;
            agent->stream = (uint32_t) i;
            break;
        }
        if (!relay_some(self, agent, c, DK_FRAME_RELAY_MAX)) {
            chan_refuse(self, agent, "out of memory, or OpenSSL could not sign, a message to it");
            return;
        }
        if (chan_conn_has_output(c))
            more = true;    /* a payload larger than one frame: its next piece next time */
    }
    chan_agent_flush(self, agent);
    if (agent->fd >= 0 && more)
        agent->relay_due = true;
}
