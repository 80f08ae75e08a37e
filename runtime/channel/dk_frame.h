/*
 * dk_frame: the back channel's frame codec, for the parties that speak it in
 * C: the kernel's channel (dk_backchan_frame.c) and the node agent
 * (dk_agentwire). It needs nothing but dk_be32.h and OpenSSL.
 *
 * The wire is dk_job.h's: after the 32-byte nonce the runtime sends on a
 * connection, every frame in both directions is
 *     u32 length (big endian, of what follows) | 32-byte MAC | body
 *     MAC  = HMAC-SHA256(key, nonce | u8 dir | u32 seq | body)
 *     body = u8 type | u32 id | payload
 * where dir is 'R' (to the runtime) or 'K' (from it) and seq counts the
 * frames one side has sent on this connection, from 0. A frame sent back to
 * the side that wrote it, replayed or reordered does not verify.
 *
 * Two objects:
 *   dk_frame_key_t   a job's key with its HMAC made ready once. HMAC's key
 *                    setup (two SHA-256 blocks, and OpenSSL's context and
 *                    provider look-ups) is done at dk_frame_key_new; each
 *                    frame restarts the ready context from that state
 *                    (EVP_MAC_init with a NULL key: the key set before, in
 *                    OpenSSL 3's HMAC), so a frame costs its own bytes and
 *                    nothing more. The kernel has one for all its
 *                    connections; an agent or a rank has one.
 *   dk_frame_side_t  one side of one connection: the key it uses (borrowed),
 *                    the connection's nonce, its direction, and the two
 *                    sequence counts. Plain data, so it lives inside the
 *                    caller's connection state.
 *
 * Threads: a key keeps one HMAC context, so a key and every side that uses
 * it are for one thread at a time (the rank's two senders hold their lock).
 * Pure but for memory and OpenSSL: no descriptor is touched.
 */
#ifndef DK_FRAME_H
#define DK_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DK_FRAME_KEY_LEN 32
#define DK_FRAME_NONCE_LEN 32
#define DK_FRAME_MAC_LEN 32
#define DK_FRAME_BODY_HEAD 5                                   /* u8 type | u32 id */
#define DK_FRAME_HEAD (4 + DK_FRAME_MAC_LEN + DK_FRAME_BODY_HEAD)  /* length, MAC, type, id */
#define DK_FRAME_DIR_TO_RUNTIME 'R'     /* dk_backchan.h's DK_BC_DIR_TO_RUNTIME */
#define DK_FRAME_DIR_TO_RANK 'K'        /* ... and DK_BC_DIR_TO_RANK */

typedef struct dk_frame_key_t dk_frame_key_t;

typedef struct {
    dk_frame_key_t *key;            /* borrowed: outlives the side */
    unsigned char nonce[DK_FRAME_NONCE_LEN];
    unsigned char dir_out, dir_in;  /* 'R' and 'K', or 'K' and 'R' */
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
