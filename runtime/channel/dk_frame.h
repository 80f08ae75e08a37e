/*
 * dk_frame: the back channel's wire, specified once, and its frame codec.
 *
 * This header is the one specification of the bytes on the back channel.
 * Whatever speaks them follows it and says so rather than describing them
 * again: the kernel's end (dk_backchan*.c, which seals and opens with the
 * codec below), the node agent (runtime/agent/, the same codec), the rank
 * (python/distkernel/_backchannel.py, whose constants of the same names
 * tests/e2e/test_wire_spec.py checks against this file's), and the test
 * rank (tests/unit/fake_rank.c, written from this text alone). What a job
 * does with the frames, when each is sent and what follows, is dk_job.h's.
 *
 * The runtime is the kernel's side: it listens (dk_backchan.h), and what
 * connects is a rank, or a node agent speaking for its node's ranks
 * (dk_agent.h). Every constant below has this one name; Python's is the same
 * without DK_FRAME_ (and TO_RUNTIME, TO_RANK for the directions).
 *
 * A connection. The runtime's first bytes on it are a fresh random nonce of
 * DK_FRAME_NONCE_LEN bytes. From then on every frame, in both directions, is
 *     u32 length | MAC | body                   (length: of MAC and body)
 *     body = u8 type | u32 id | payload         (DK_FRAME_BODY_HEAD, then payload)
 *     MAC  = HMAC-SHA256(key, nonce | u8 dir | u32 seq | body)
 * every integer big endian, the MAC DK_FRAME_MAC_LEN bytes.
 *   key  the job's DK_FRAME_KEY_LEN random bytes, which reach a rank or an
 *        agent only in its environment (DISTKERNEL_BC_KEY, 64 hex digits),
 *        never on the wire.
 *   dir  DK_FRAME_DIR_TO_RUNTIME ('R') on a frame to the runtime,
 *        DK_FRAME_DIR_TO_RANK ('K', the kernel's) on one from it, to a rank
 *        or an agent.
 *   seq  how many frames that side has sent on this connection before this
 *        one, from 0; the two sides count apart.
 *   id   the rank the frame is of or for; on an agent's HELLO and PING, its
 *        node; on RELAY and RELAY_END, the agent's number for a relayed
 *        connection (a stream, never reused by that agent).
 * So a frame verifies only on the connection of its nonce, in the direction
 * it was sent, in its place: one reflected to the side that wrote it (a
 * PING's body is the same both ways), replayed, reordered or cut does not,
 * and a frame that does not verify ends the connection. A length outside
 * DK_FRAME_MAC_LEN + DK_FRAME_BODY_HEAD to DK_FRAME_LEN_MAX ends it too,
 * before anything is allocated for it (a side may take less: an agent, no
 * more than a RELAY frame's).
 *
 * The types, and their payloads (none: empty):
 *   1 HELLO       rank -> runtime, none: I am rank id, ready.
 *   2 PAYLOAD     runtime -> rank: the job's bytes, opaque.
 *   3 RESULT      rank -> runtime: the rank's value, opaque; in a persistent
 *                 job, u32 round first.
 *   4 ERROR       rank -> runtime: the rank's exception, opaque; in a
 *                 persistent job, u32 round first.
 *   5 TASK        runtime -> rank: u32 round | the round's bytes, at most
 *                 DK_FRAME_TASK_MAX of them (a persistent job's rounds).
 *   6 OUTPUT      rank or agent -> runtime: u8 fd | u8 flags | at most
 *                 DK_FRAME_OUTPUT_MAX bytes the rank wrote to fd 1 or 2, or,
 *                 fd DK_FRAME_OUTPUT_LOG, a line for its log only; flags
 *                 DK_FRAME_OUTPUT_CAUGHT_UP: nothing more was waiting.
 *   7 PING        runtime <-> agent, none: I am here (dk_backchan.h says how
 *                 often).
 *   9 PORT        u32 port: rank 0 -> runtime, the MASTER_PORT it holds free
 *                 on its node; runtime -> every rank, that port.
 *  10 STACKS      runtime -> agent: none, or u32 DK_FRAME_STACKS_SAMPLE for a
 *                 live sample: send me rank id's Python stacks (id
 *                 DK_FRAME_ALL_RANKS: every rank's of the node);
 *                 agent -> runtime: rank id's faulthandler dump, its last
 *                 DK_FRAME_STACKS_MAX bytes ("" when it did not answer).
 *  11 AGENT_HELLO agent -> runtime, none: I am the agent of node id.
 *  12 EXIT        agent -> runtime: i32 exit code (-1: by a signal) | u32
 *                 signal (0: none): rank id ended.
 *  13 STARTED     agent -> runtime: u32 pid: rank id was started.
 *  14 SIGNAL      runtime -> agent: u32 signal, for rank id's process group
 *                 (DK_FRAME_ALL_RANKS: every rank's of the node).
 *  15 RELAY       either way: at most DK_FRAME_RELAY_MAX bytes of stream id,
 *                 carried untouched (a relayed rank's own frames, whose MACs
 *                 are over the nonce the runtime sent that stream, so the
 *                 agent can neither forge nor alter them); from the agent,
 *                 none for a new stream, which the runtime sends its nonce.
 *  16 RELAY_END   either way, none: stream id has ended.
 * Type 8 (an INTERRUPT once) is retired: never reuse it.
 *
 * Two objects make the codec:
 *   dk_frame_key_t   a job's key with its HMAC made ready once. HMAC's key
 *                    setup (two SHA-256 blocks, and OpenSSL's context and
 *                    provider look-ups) is done at dk_frame_key_new; each
 *                    frame restarts the ready context from that state
 *                    (EVP_MAC_init with a NULL key: the key set before, in
 *                    OpenSSL 3's HMAC), so a frame costs its own bytes and
 *                    nothing more. The kernel has one for all its
 *                    connections; an agent has one.
 *   dk_frame_side_t  one side of one connection: the key it uses (borrowed),
 *                    the connection's nonce, its direction, and the two
 *                    sequence counts. Plain data, so it lives inside the
 *                    caller's connection state.
 *
 * Threads: a key keeps one HMAC context, so a key and every side that uses
 * it are for one thread at a time. Pure but for memory and OpenSSL: no
 * descriptor is touched; it needs nothing but dk_be32.h and OpenSSL.
 */
#ifndef DK_FRAME_H
#define DK_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the wire ------------------------------------------------------------- */

#define DK_FRAME_KEY_LEN 32
#define DK_FRAME_NONCE_LEN 32
#define DK_FRAME_MAC_LEN 32
#define DK_FRAME_BODY_HEAD 5                                   /* u8 type | u32 id */
#define DK_FRAME_HEAD (4 + DK_FRAME_MAC_LEN + DK_FRAME_BODY_HEAD)  /* length, MAC, type, id */

#define DK_FRAME_DIR_TO_RUNTIME 'R'     /* rank or agent -> runtime */
#define DK_FRAME_DIR_TO_RANK 'K'        /* runtime (the kernel) -> rank or agent */

enum {
    DK_FRAME_HELLO = 1,
    DK_FRAME_PAYLOAD = 2,
    DK_FRAME_RESULT = 3,
    DK_FRAME_ERROR = 4,
    DK_FRAME_TASK = 5,
    DK_FRAME_OUTPUT = 6,
    DK_FRAME_PING = 7,
    DK_FRAME_PORT = 9,
    DK_FRAME_STACKS = 10,
    DK_FRAME_AGENT_HELLO = 11,
    DK_FRAME_EXIT = 12,
    DK_FRAME_STARTED = 13,
    DK_FRAME_SIGNAL = 14,
    DK_FRAME_RELAY = 15,
    DK_FRAME_RELAY_END = 16,
};

/* The protocol's one size limit: the most bytes a frame may carry after its
 * u8 type | u32 id, either way (tests/unit/test_job.c checks that the rank
 * takes exactly that much and refuses a byte more). */
#define DK_FRAME_PAYLOAD_MAX ((size_t) 1 << 30)
/* The largest value of a frame's length field: MAC, type and id, payload. */
#define DK_FRAME_LEN_MAX (DK_FRAME_MAC_LEN + DK_FRAME_BODY_HEAD + DK_FRAME_PAYLOAD_MAX)
/* The largest job a TASK frame carries: its round (u32) comes first. */
#define DK_FRAME_TASK_MAX (DK_FRAME_PAYLOAD_MAX - 4)
/* The most bytes of output one OUTPUT frame carries (after fd and flags), so
 * a rank's flood is interleaved with its heartbeats and reaches the sink in
 * pieces of the size a pipe read gives. */
#define DK_FRAME_OUTPUT_MAX ((size_t) 64 << 10)
/* OUTPUT's flag: the sender's read found nothing more waiting on that fd. */
#define DK_FRAME_OUTPUT_CAUGHT_UP 0x01
/* OUTPUT's fd for the rank's log only, never the cell: what the rank program
 * says about itself (a folder it would not use on its node, and why), one
 * line per thing, which a run of 1,024 ranks must not put in the cell. */
#define DK_FRAME_OUTPUT_LOG 3
/* The most bytes one RELAY frame carries. */
#define DK_FRAME_RELAY_MAX ((size_t) 64 << 10)
/* The most bytes of a rank's stacks one STACKS frame carries. */
#define DK_FRAME_STACKS_MAX ((size_t) 128 << 10)
/* The payload (u32) of a STACKS frame to an agent for a live sample: the
 * agent sends DK_SAMPLE_SIGNAL to each rank's sampler thread (tgkill), not
 * DK_STACKS_SIGNAL to the rank, which would interrupt its system calls
 * (dk_stackreq.h). Without a payload (or 0): the ending dump. */
#define DK_FRAME_STACKS_SAMPLE 1u
/* The id of a SIGNAL or STACKS frame to an agent: every rank of its node. */
#define DK_FRAME_ALL_RANKS 0xFFFFFFFFu

/* ---- the codec ------------------------------------------------------------ */

typedef struct dk_frame_key_t dk_frame_key_t;

typedef struct {
    dk_frame_key_t *key;            /* borrowed: outlives the side */
    unsigned char nonce[DK_FRAME_NONCE_LEN];
    unsigned char dir_out, dir_in;  /* DK_FRAME_DIR_TO_*: one each */
    uint32_t seq_out, seq_in;       /* frames sealed, frames opened */
} dk_frame_side_t;

typedef struct {
    int type;
    uint32_t id;
    const unsigned char *payload;   /* into the buffer given to dk_frame_open */
    size_t len;
} dk_frame_msg_t;

/* A key of DK_FRAME_KEY_LEN bytes, copied, with its HMAC-SHA256 set up.
 * NULL when OpenSSL has no HMAC or no memory. Free with dk_frame_key_destroy,
 * which wipes the key. */
dk_frame_key_t *dk_frame_key_new(const unsigned char *key);
void dk_frame_key_destroy(dk_frame_key_t **self_p);

/* HMAC-SHA256 under SELF of nonce | dir | seq (big endian) | head | tail, the
 * body given in two pieces (TAIL may be NULL when TAIL_LEN is 0) so that a
 * large payload is never copied behind its header. False when OpenSSL
 * failed. For the sides' functions below and for tests. */
bool dk_frame_mac(dk_frame_key_t *self, const unsigned char *nonce, unsigned char dir,
                  uint32_t seq, const void *head, size_t head_len, const void *tail,
                  size_t tail_len, unsigned char out[DK_FRAME_MAC_LEN]);

/* The key from its 64 hex digits (DISTKERNEL_BC_KEY), and back: -1 when HEX
 * is not that; HEX_OUT holds 2 * DK_FRAME_KEY_LEN + 1 bytes. */
int dk_frame_key_from_hex(const char *hex, unsigned char key[DK_FRAME_KEY_LEN]);
void dk_frame_key_to_hex(const unsigned char key[DK_FRAME_KEY_LEN], char *hex_out);

/* SIDE, using KEY, on the connection of NONCE (DK_FRAME_NONCE_LEN bytes,
 * copied), sealing in direction DIR_OUT and opening the other, both counts
 * at 0. */
void dk_frame_side_init(dk_frame_side_t *side, dk_frame_key_t *key, const unsigned char *nonce,
                        unsigned char dir_out);

/* Seal the next frame out whose body is HEAD then TAIL, writing its first
 * 4 + DK_FRAME_MAC_LEN + HEAD_LEN bytes (length, MAC, HEAD) to OUT; TAIL is
 * not copied: it goes on the wire right after them. HEAD may already lie at
 * OUT + 4 + DK_FRAME_MAC_LEN. Returns the bytes written, or 0 when OpenSSL
 * failed (the count is not moved on). */
size_t dk_frame_seal_head(dk_frame_side_t *side, const void *head, size_t head_len,
                          const void *tail, size_t tail_len, unsigned char *out);

/* Seal one whole frame of TYPE for ID with PAYLOAD (LEN bytes, which may
 * already lie at OUT + DK_FRAME_HEAD) into OUT, which holds DK_FRAME_HEAD +
 * LEN bytes. Returns the frame's size, or 0 when OpenSSL failed. */
size_t dk_frame_seal(dk_frame_side_t *side, int type, uint32_t id, const void *payload,
                     size_t len, unsigned char *out);

/* Verify the next frame in, given after its length: FRAME is its MAC then
 * its body (FRAME_LEN bytes, at least DK_FRAME_MAC_LEN). True, and the count
 * moved on, when it was sealed with this key and nonce in the other
 * direction at this count. */
bool dk_frame_verify(dk_frame_side_t *side, const unsigned char *frame, size_t frame_len);

/* Open the first frame in BUF (LEN bytes received, in order), carrying at
 * most MAX_PAYLOAD bytes of payload. Returns the bytes it took (the frame is
 * in *MSG, pointing into BUF), 0 when it is not whole yet (*NEED, if given,
 * says how many bytes it needs in all), or -1 when it breaks the protocol
 * (its size, its MAC: the connection must be closed), with why in WHY (a
 * static string). */
long dk_frame_open(dk_frame_side_t *side, const unsigned char *buf, size_t len,
                   size_t max_payload, dk_frame_msg_t *msg, size_t *need, const char **why);

#endif
