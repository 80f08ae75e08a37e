/*
 * dk_backchan: the runtime's end of the authenticated back channel.
 *
 * Internal to the runtime (dk_job drives it from its poll loop). Its bytes
 * are dk_frame.h's, the one specification of the wire (included here: the
 * frame types and limits are DK_FRAME_*), and what a job does with its
 * frames is dk_job.h's. The channel owns a listening socket (a Unix socket in
 * a fresh 0700 directory, or, for ranks on other nodes, a TCP socket bound to
 * one given address), the job's key, one copy of the payload, and every
 * connection. It never blocks: the job's loop polls the descriptors
 * that dk_backchan_poll_fill lists and hands the results to
 * dk_backchan_poll_handle.
 */
#ifndef DK_BACKCHAN_H
#define DK_BACKCHAN_H

#include "dk_frame.h"

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Streams an agent may have open beyond one per rank of its node. */
#define DK_BC_RELAY_SLACK 4

/* Heartbeats, between the runtime and each node agent: each side sends a PING
 * every DK_BC_PING_S while connected; a peer silent for longer than its
 * deadline is lost (default below). */
#define DK_BC_PING_S 1.0
#define DK_BC_HEARTBEAT_DEFAULT_S 5.0

/* Connection slots beyond one per rank: the most connections that may wait
 * for their HELLO at once is the ranks not yet in plus this (dk_backchan_admit.c),
 * and each waits at most DK_BC_HELLO_DEADLINE_S (a rank says HELLO as soon as
 * it has the nonce). Over TCP only the run's nodes get a slot
 * (dk_backchan_opts_t.allow_hosts). The slots bound what connections cost: at
 * 1,024 ranks, 1,088 descriptors and ~350 KiB of connection state (a
 * connection before its HELLO holds at most a 37-byte frame), plus the
 * listener until every rank is in; the listen backlog is the same 1,088,
 * capped by net.core.somaxconn. One thread (the job's poll loop) does all of
 * it. */
#define DK_BC_SLACK 64
#define DK_BC_HELLO_DEADLINE_S 5
#define DK_BC_STR_(x) #x
#define DK_BC_STR(x) DK_BC_STR_(x)

typedef struct {
    void *data;
    /* RANK's PAYLOAD frame has been written in full. */
    void (*on_delivered)(void *data, int rank);
    /* RANK sent RESULT (IS_ERROR false) or ERROR; BYTES valid during the call. */
    void (*on_message)(void *data, int rank, bool is_error, const void *bytes, size_t len);
    /* A refused or dropped connection, in words for the user. */
    void (*on_warning)(void *data, const char *text);
    /* Persistent channels only: RANK's HELLO verified (it is ready for tasks).
     * May be NULL. */
    void (*on_hello)(void *data, int rank);
    /* RANK's OUTPUT frame: BYTES it wrote to FD (1 or 2), or a line for its
     * log only (FD DK_FRAME_OUTPUT_LOG), valid during the call; CAUGHT_UP when
     * the rank had nothing more waiting. May be NULL. */
    void (*on_output)(void *data, int rank, int fd, const void *bytes, size_t len,
                      bool caught_up);
    /* Heartbeats only: the connection of node agent ID (world_size + its
     * node) has been silent for SILENT_S, past the deadline. Told once per
     * connection. May be NULL. */
    void (*on_lost)(void *data, int id, double silent_s);
    /* RANK's connection was ended by its peer (end of file, a reset, or a
     * write the peer no longer takes) before the rank answered (RESULT or
     * ERROR; in a persistent job, while a task awaited its answer). Told
     * once per connection; never for a connection this side closed. May be
     * NULL. */
    void (*on_closed)(void *data, int rank);
    /* RANK's STACKS frame: its dump, BYTES valid during the call. May be NULL. */
    void (*on_stacks)(void *data, int rank, const void *bytes, size_t len);
    /* Node agents (opts.agents): RANK, on the node of the agent that said
     * so, ended with EXIT_CODE (-1: by a signal) or TERM_SIGNAL (0: none).
     * An agent's silence and its close come through on_lost and on_closed
     * with the id world_size + NODE. An agent's OUTPUT and STACKS frames
     * come through on_output and on_stacks with their rank. May be NULL. */
    void (*on_agent_exit)(void *data, int rank, int exit_code, int term_signal);
    /* The agent of NODE said AGENT_HELLO. May be NULL. */
    void (*on_agent_hello)(void *data, int node);
} dk_backchan_sink_t;

/* How a channel listens. Zeroed (or NULL): today's local channel, a Unix
 * socket and no heartbeats. */
typedef struct {
    /* Listen on TCP, bound to this numeric IPv4 or IPv6 address only (never a
     * wildcard: "0.0.0.0" and "::" are refused). NULL: a Unix socket. */
    const char *tcp_addr;
    int tcp_port;           /* with tcp_addr: 0 for an ephemeral port */
    /* > 0: send every connected node agent a PING each DK_BC_PING_S and
     * report one silent for longer than this (on_lost). A rank's own
     * connection has none: one relayed by its agent is the agent's to watch. */
    double heartbeat_s;
    /* MASTER_PORT comes from rank 0 (dk_job.h, "MASTER_PORT from rank 0"):
     * rank 0's HELLO counts once its PORT frame follows; every rank is sent
     * that port in a PORT frame before its PAYLOAD (or first TASK). */
    bool port_from_rank0;
    /* With tcp_addr: the run's nodes (names or addresses, NALLOW of them,
     * resolved when the channel is made: dk_accept.h). A connection from any
     * other address is closed as it is accepted, before it takes a slot. NULL:
     * any address may connect (and must still say a valid HELLO). */
    const char *const *allow_hosts;
    size_t nallow;
    /* Node agents (runtime/agent/dk_agent.h): this many may connect, each
     * saying AGENT_HELLO for its node (0 to AGENTS - 1), speaking for the
     * RANKS_PER_NODE ranks of its node. 0: none. */
    int agents;
    int ranks_per_node;
} dk_backchan_opts_t;

typedef struct dk_backchan_t dk_backchan_t;

/* Create the directory, the listening socket and the key, and copy PAYLOAD.
 * SINK is copied. Returns NULL with a reason in ERR. */
dk_backchan_t *dk_backchan_new(int world_size, const void *payload, size_t payload_len,
                               const dk_backchan_sink_t *sink, char *err, size_t errlen);

/* A channel for a persistent job (see dk_job.h): nothing is sent at HELLO;
 * dk_backchan_send_task hands out each round. */
dk_backchan_t *dk_backchan_new_persistent(int world_size, const dk_backchan_sink_t *sink,
                                          char *err, size_t errlen);

/* Either of the above (PERSISTENT picks), listening as OPTS says (NULL: a Unix
 * socket). Returns NULL with a reason in ERR: an address that is not numeric,
 * a wildcard, or one this host does not have (bind fails) is named there. */
dk_backchan_t *dk_backchan_new_opts(int world_size, bool persistent, const void *payload,
                                    size_t payload_len, const dk_backchan_sink_t *sink,
                                    const dk_backchan_opts_t *opts, char *err, size_t errlen);

/* With opts.port_from_rank0: the port rank 0 sent, 0 until it has. */
int dk_backchan_master_port(const dk_backchan_t *self);

/* Persistent channels: queue a TASK frame (u32 ROUND, then PAYLOAD, copied) to
 * every connected rank; from now on each may send one RESULT or ERROR, which
 * must name ROUND. Call only when the previous round's frames were all written
 * (every rank has answered). Returns -1 with ERR when out of memory or the
 * payload is larger than DK_FRAME_TASK_MAX. */
int dk_backchan_send_task(dk_backchan_t *self, uint32_t round, const void *payload, size_t len,
                          char *err, size_t errlen);

/* Close every descriptor, remove the socket and its directory, wipe the key. */
void dk_backchan_destroy(dk_backchan_t **self_p);

/* The socket's path (NULL for TCP) and the key as 64 hex digits (borrowed). */
const char *dk_backchan_path(const dk_backchan_t *self);
/* What a rank is given in DISTKERNEL_BC to connect (borrowed): the socket's
 * path, or "tcp:ADDR:PORT" ("tcp:[ADDR]:PORT" for IPv6). */
const char *dk_backchan_address(const dk_backchan_t *self);
/* Whether RANK has a connection (it said HELLO) that is still open. */
bool dk_backchan_rank_open(const dk_backchan_t *self, int rank);
/* Whether RANK has ever said a valid HELLO (its connection may be closed since). */
bool dk_backchan_rank_connected_once(const dk_backchan_t *self, int rank);

/* Send the agent of NODE a SIGNAL (SIG for RANK's process group, or every
 * rank's: DK_FRAME_ALL_RANKS) or a STACKS request (TYPE DK_FRAME_STACKS; SIG 0:
 * the ending dump, DK_FRAME_STACKS_SAMPLE: a live sample),
 * queued behind what its connection is writing. False when that agent has
 * no connection, or it was lost (nothing will be sent). */
bool dk_backchan_agent_send(dk_backchan_t *self, int node, int type, uint32_t rank, int sig);

/* The TCP port listened on, or 0 for a Unix socket. */
int dk_backchan_port(const dk_backchan_t *self);
const char *dk_backchan_key_hex(const dk_backchan_t *self);

/* Most pollfd entries dk_backchan_poll_fill can write. */
size_t dk_backchan_max_fds(const dk_backchan_t *self);

/* When (CLOCK_MONOTONIC seconds) the next connection waiting for its HELLO
 * runs out of time, or the next heartbeat is due or missed, or -1 if none:
 * the poll must wake by then. */
double dk_backchan_deadline(const dk_backchan_t *self);

/* Write the descriptors to poll into FDS; returns how many. Connections past
 * their HELLO deadline are closed first. */
size_t dk_backchan_poll_fill(dk_backchan_t *self, struct pollfd *fds);

/* Act on the poll results for the N entries last filled: accept, read, write.
 * Reads are budgeted per connection (bytes and time) so that one busy peer
 * cannot starve the loop. */
void dk_backchan_poll_handle(dk_backchan_t *self, const struct pollfd *fds, size_t n);

/* Read everything already received on every connection (the bytes queued on
 * its socket when called, and no more, however fast a peer keeps sending; at
 * most a quarter second per connection):
 * called when a rank has exited, so its last frames are seen before its exit
 * is judged. */
void dk_backchan_drain(dk_backchan_t *self);

/* Stop listening and close every connection (the job has ended). The
 * listener also closes by itself once every rank has said a valid HELLO
 * (nothing is left to wait for, so nothing listens for the life of started
 * ranks; a Unix socket is unlinked then). */
void dk_backchan_close_all(dk_backchan_t *self);

/* The same for the ranks' connections only (EOF is an idle started rank's
 * cue to exit): the node agents' stay open, to tell those exits. */
void dk_backchan_close_ranks(dk_backchan_t *self);

#endif
