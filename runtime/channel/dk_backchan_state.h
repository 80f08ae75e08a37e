/*
 * dk_backchan_state: one back channel's state, shared by the files that serve it.
 *
 * Private to runtime/channel/ (dk_backchan.h is the API). The channel is three
 * files over this state:
 *   dk_backchan.c        making it (the listener, the key), what the job asks
 *                        of it, and its poll turn: heartbeats, tasks, the drain;
 *   dk_backchan_frame.c  the frames on one connection: written, read, verified
 *                        and acted on;
 *   dk_backchan_admit.c  admission: who may take a slot, and when a waiting
 *                        connection gives its slot up;
 *   dk_backchan_relay.c  ranks' connections carried on their node agent's
 *                        (a slot each, no descriptor of their own).
 */
#ifndef DK_BACKCHAN_STATE_H
#define DK_BACKCHAN_STATE_H

#include "dk_backchan.h"
#include "dk_accept.h"
#include "dk_frame.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EVICT_AFTER_S 0.5                  /* a pending connection's HELLO time when others wait */
#define FRAME_MIN (DK_FRAME_MAC_LEN + DK_FRAME_BODY_HEAD) /* the least a length field says */
/* The fd of a connection relayed by an agent (conn_t.agent): in use, but no
 * descriptor of ours. */
#define RELAYED_FD INT_MAX

typedef struct conn conn_t;
struct conn {
    int fd;                 /* -1: free slot; RELAYED_FD: relayed (agent) */
    int rank;               /* -1 until a valid HELLO */
    double since;           /* when it was accepted (CLOCK_MONOTONIC seconds) */
    bool done;              /* RESULT or ERROR received */
    bool delivering;        /* PAYLOAD frame queued, not yet reported written */
    double heard_at;        /* when bytes last arrived (an agent's heartbeats) */
    double pinged_at;       /* when we last queued a PING (agents) */
    bool lost;              /* an agent's: reported silent past the deadline */
    bool port_due;          /* port_from_rank0: its HELLO came before the port; its
                               PORT (and PAYLOAD) go out once rank 0 sends it */
    dk_frame_side_t side;   /* its nonce and both counts (frames sent after
                               the nonce, frames verified), over the job's key */
    /* input: a 4-byte length, then a frame of that many bytes */
    unsigned char len_buf[4];
    size_t len_have;
    unsigned char *frame;
    size_t frame_len, frame_have;
    /* output: a small head (the nonce or a PING still being written, then a
     * frame's header), then a borrowed body */
    /* agents: frames queued (agent_queue) while another is written, and
     * the queue being written, owned here (body points into it) */
    unsigned char *queue;
    size_t queue_len;
    unsigned char *owned_body;
    /* A rank's connection to its node's agent, relayed on the agent's own
     * (DK_FRAME_RELAY, stream number STREAM); NULL: a socket of its own. */
    conn_t *agent;
    uint32_t stream;
    /* agents: one of their relayed connections has bytes to send */
    bool relay_due;
    unsigned char head[DK_FRAME_NONCE_LEN + 4 + FRAME_MIN + 4 + FRAME_MIN + 4 + 4 + FRAME_MIN + 4];
    size_t head_len, head_off;
    const unsigned char *body;
    size_t body_len, body_off;
};

struct dk_backchan_t {
    int world_size;
    dk_backchan_sink_t sink;
    char *dir;
    char *path;             /* Unix socket; NULL for TCP */
    char *address;          /* what ranks get in DISTKERNEL_BC */
    int port;               /* TCP only */
    double heartbeat_s;     /* > 0: PINGs and the silence deadline */
    int listen_fd;
    dk_frame_key_t *key;    /* HMAC set up once for every connection's frames */
    char key_hex[DK_FRAME_KEY_LEN * 2 + 1];
    unsigned char *payload;
    size_t payload_len;
    bool persistent;        /* rounds of TASK frames; nothing sent at HELLO */
    uint32_t round;         /* the round a RESULT or ERROR must name */
    bool port_from_rank0;   /* opts.port_from_rank0 */
    int master_port;        /* ... and the port rank 0 sent; 0 until then */
    int agents;             /* node agents that may connect (opts.agents) */
    int ranks_per_node;     /* ... each speaking for this many ranks */
    bool *claimed;          /* per rank, then per agent (world_size + node): a
                               connection has said HELLO for it */
    int nclaimed;           /* ... how many ranks have */
    dk_accept_t *allow;     /* TCP: the run's nodes' addresses; NULL: any */
    unsigned long dropped;  /* connections closed at accept: not from a node */
    conn_t *conns;
    size_t nconns;
    size_t *polled;         /* conn slot of each pollfd entry after the listener */
    bool polled_listener;
    unsigned warnings;
};

/* dk_backchan.c */
void chan_warn(dk_backchan_t *self, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Close C. A relayed connection tells its agent (RELAY_END); an agent's
 * close takes its relayed connections with it, without a word (the agent's
 * loss is the story). */
void chan_conn_close(dk_backchan_t *self, conn_t *c);

/* dk_backchan_frame.c */
bool chan_conn_has_output(const conn_t *c);
bool chan_is_agent(const dk_backchan_t *self, const conn_t *c);
void chan_agent_flush(dk_backchan_t *self, conn_t *c);
bool chan_agent_queue(dk_backchan_t *self, conn_t *c, int type, uint32_t id,
                      const unsigned char *payload, size_t len);
void chan_conn_write(dk_backchan_t *self, conn_t *c);
void chan_conn_advance(conn_t *c, size_t sent);
void chan_conn_written(dk_backchan_t *self, conn_t *c);
bool chan_queue_payload(dk_backchan_t *self, conn_t *c);
bool chan_queue_empty(dk_backchan_t *self, conn_t *c, unsigned char type);
void chan_refuse(dk_backchan_t *self, conn_t *c, const char *why);
void chan_conn_read(dk_backchan_t *self, conn_t *c, size_t budget, double slice_s);
void chan_conn_start(dk_backchan_t *self, conn_t *c);

/* dk_backchan_relay.c: ranks' connections relayed by their node's agent */
void chan_relay_frame(dk_backchan_t *self, conn_t *agent, int type, uint32_t stream,
                      const unsigned char *p, size_t len);
void chan_relay_pump(dk_backchan_t *self, conn_t *agent);
void chan_conn_feed(dk_backchan_t *self, conn_t *c, const unsigned char *p, size_t len);

/* dk_backchan_admit.c */
void chan_expire_pending(dk_backchan_t *self);
conn_t *chan_free_slot(dk_backchan_t *self, conn_t **oldest);
void chan_accept_all(dk_backchan_t *self);
conn_t *chan_slot_for_new(dk_backchan_t *self);

#endif
