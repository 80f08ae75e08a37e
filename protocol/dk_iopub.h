/*
 * dk_iopub: the one place that sends on the IOPub socket.
 *
 * Several threads publish: the shell thread (status, execute_input, results,
 * display data from Python), the control thread (status around control requests),
 * and the output reader (stream messages from fd 1/2). A ZeroMQ socket must not be
 * used by two threads at once, so every send goes through this object, which holds
 * a mutex around signing and sending.
 *
 * A frontend that reads IOPub slower than the kernel writes (nbclient behind a
 * flood of rank output) fills its queue in the socket. A plain PUB socket then
 * drops silently, and what it drops may be the `idle` the frontend waits for, so
 * the socket is set to refuse instead (ZMQ_XPUB_NODROP) and every send is
 * non-blocking. What a full queue refuses depends on the message:
 * - dk_iopub_offer_text (stream output) is refused and returns DK_IOPUB_FULL; the
 *   caller keeps the text, waits, or thins it and says so (dk_stream);
 * - every other message (status, results, displays, comms) is queued here, in
 *   order, and a flusher thread hands the queue to the socket as the frontend
 *   reads. Nothing blocks: the control thread answers while IOPub is full.
 * The queue is bounded (DK_IOPUB_QUEUE_MAX bytes); past that a message is dropped
 * and counted, which only a frontend that stopped reading altogether can cause.
 *
 * Refusing is all-or-nothing: ZeroMQ refuses a send when any one subscriber's
 * queue is full, so one subscriber that stops reading (a stuck frontend, or any
 * local process that connects to the port, subscribes and never reads; no key
 * is needed to subscribe) would hold back every other frontend for as long as
 * it stays connected. So the kernel counts connections (a socket monitor's
 * ACCEPTED and DISCONNECTED events, which a peer cannot fake) and, when more
 * than one is connected and nothing has gone out for DK_IOPUB_STUCK_MS while a
 * send waits, sends that one message with ZMQ_XPUB_NODROP off. libzmq 4.3
 * checks the option at each send; a lossy send goes to every subscriber with
 * room and is dropped for the full one, and that drop takes the full
 * subscriber out of the sending set until it reads again, so from the next
 * message on, refusing works for the others as before. Measured with Debian's
 * libzmq 4.3.4 (tests/unit/test_iopub.c, tests/e2e/test_stranger.py).
 *
 * The trade-off: with two or more connections the kernel cannot tell a stuck
 * stranger from a frontend that has read nothing for DK_IOPUB_STUCK_MS, so such
 * a frontend loses what is sent until it reads again, its `idle` included
 * (today's lossless wait applies to a single connection only, which is the
 * common case: one notebook). DK_IOPUB_STUCK_MS is below dk_stream's
 * BACKPRESSURE_MS (500 ms), so a frontend that keeps up sees the stuck one
 * passed over before stream output would be thinned, and gets every line.
 * Extra connections that do not subscribe (a port scan, a half-open connection,
 * gone after ZMQ_HANDSHAKE_IVL) only make passing over possible; they never
 * hold anyone back.
 *
 * The design card suggested an inproc PUSH/PULL fan-in to a publisher thread; a
 * fan-in fair-queues between its producers, so two messages sent one after the
 * other from two threads could reach the frontend in the other order (a stream
 * chunk after the `idle` that followed it). The mutex gives one total order.
 *
 * The publisher also keeps the "current parent": the header of the shell request
 * being handled, which stream and display messages are attributed to.
 */
#ifndef DK_IOPUB_H
#define DK_IOPUB_H

#include "dk_wire.h"

#define DK_IOPUB_QUEUE_MAX (64u << 20)
#define DK_IOPUB_HWM 100   /* messages in a frontend's queue before it counts as full */
#define DK_IOPUB_STUCK_MS 400   /* no send for this long, with 2+ connections: pass over */

typedef struct dk_iopub_t dk_iopub_t;

/* Wrap PUB (borrowed; the caller closes it after destroying this). SIGNER is
 * borrowed. SESSION is the kernel's session id, copied. NULL on allocation failure. */
dk_iopub_t *dk_iopub_new(zsock_t *pub, const dk_signer_t *signer, const char *session);
void dk_iopub_destroy(dk_iopub_t **self_p);

/* Set the current parent header, as compact JSON text (copied). NULL means {}. */
void dk_iopub_set_parent(dk_iopub_t *self, const char *parent_json);

/* Copy of the current parent header text (malloc'd, caller frees). */
char *dk_iopub_parent(dk_iopub_t *self);

/* Publish MSG_TYPE with CONTENT_JSON (compact JSON object text). METADATA_JSON may
 * be NULL ({}). PARENT_JSON NULL means the current parent. BUFFERS may be NULL/0
 * and are copied. Returns 0, or -1 if the message could not be built. */
int dk_iopub_publish_text(dk_iopub_t *self, const char *msg_type, const char *content_json,
                          const char *metadata_json, const char *parent_json,
                          zframe_t *const *buffers, size_t n_buffers);

/* Results of dk_iopub_offer_text. */
enum { DK_IOPUB_SENT = 0, DK_IOPUB_FULL = 1 };

/* Like dk_iopub_publish_text with the current parent, for output that may be
 * held back: sends now and returns DK_IOPUB_SENT, or returns DK_IOPUB_FULL and
 * sends nothing when a frontend's queue is full or older messages still wait
 * (order is kept). -1 if the message could not be built. */
int dk_iopub_offer_text(dk_iopub_t *self, const char *msg_type, const char *content_json);

/* Messages waiting in the queue, and messages dropped because it was full. */
size_t dk_iopub_queued(dk_iopub_t *self);
unsigned long long dk_iopub_dropped(dk_iopub_t *self);

/* Sends that went out lossily, leaving a stuck frontend behind (see above), and
 * the frontends (TCP or IPC connections) counted now. */
unsigned long long dk_iopub_passed_over(dk_iopub_t *self);
int dk_iopub_connections(dk_iopub_t *self);

/* Same with CONTENT a JSON object (borrowed). */
int dk_iopub_publish(dk_iopub_t *self, const char *msg_type, json_t *content,
                     const char *parent_json);

/* Publish {"execution_state": STATE} under PARENT_JSON (NULL = current). */
int dk_iopub_status(dk_iopub_t *self, const char *state, const char *parent_json);

/* The session id (borrowed) and signer (borrowed), for building other messages. */
const char *dk_iopub_session(const dk_iopub_t *self);

#endif
