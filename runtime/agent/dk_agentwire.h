/*
 * dk_agentwire: the frames of one back-channel connection, sealed and opened
 * whole, for a node agent (and for the tests that play the runtime to it).
 *
 * The wire is dk_job.h's: after the 32-byte nonce the runtime sends, every
 * frame is u32 length | 32-byte MAC | body, MAC = HMAC-SHA256(key, nonce |
 * u8 dir | u32 seq | body), body = u8 type | u32 id | payload. A wire has a
 * side: it seals frames in its own direction with its own count, and opens
 * only frames in the other direction, in order, so a frame sent back to the
 * side that wrote it, replayed or reordered does not verify.
 *
 * The codec is dk_frame (runtime/channel/, shared with the kernel and the
 * ranks); a wire is one side of it with its own key and the agent's limit on
 * what a frame may carry. Pure but for memory and OpenSSL: no descriptor is
 * touched.
 */
#ifndef DK_AGENTWIRE_H
#define DK_AGENTWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dk_frame.h"

#define DK_AGENTWIRE_KEY_LEN DK_FRAME_KEY_LEN
#define DK_AGENTWIRE_NONCE_LEN DK_FRAME_NONCE_LEN
#define DK_AGENTWIRE_MAC_LEN DK_FRAME_MAC_LEN
#define DK_AGENTWIRE_HEAD DK_FRAME_HEAD     /* length, MAC, type, id */

typedef struct {
    dk_frame_key_t *key;            /* owned */
    dk_frame_side_t side;           /* nonce, directions, counts */
    size_t max_payload;             /* the most a frame opened may carry */
} dk_agentwire_t;

typedef dk_frame_msg_t dk_agentframe_t;     /* payload points into the buffer opened */

/* A wire with KEY and NONCE, sealing in direction DIR_OUT and opening the
 * other ('R' and 'K', dk_backchan.h), opening at most MAX_PAYLOAD bytes of
 * payload a frame. -1 when OpenSSL has no HMAC (nothing to clear then). */
int dk_agentwire_init(dk_agentwire_t *w, const unsigned char *key, const unsigned char *nonce,
                      unsigned char dir_out, size_t max_payload);
void dk_agentwire_clear(dk_agentwire_t *w);

/* The key from its 64 hex digits (DISTKERNEL_BC_KEY). -1 when it is not that. */
int dk_agentwire_key_from_hex(const char *hex, unsigned char key[DK_AGENTWIRE_KEY_LEN]);

/* Seal one frame of TYPE for ID with PAYLOAD (LEN bytes) into OUT, which
 * holds DK_AGENTWIRE_HEAD + LEN bytes; the next seal counts on. Returns the
 * frame's size, or 0 when OpenSSL failed. */
size_t dk_agentwire_seal(dk_agentwire_t *w, int type, uint32_t id, const void *payload,
                         size_t len, unsigned char *out);

/* Open the first frame in BUF (LEN bytes received, in order). Returns the
 * bytes it took (the frame is in *F, pointing into BUF), 0 when the frame is
 * not whole yet (*NEED, if given, says how many bytes it needs in all), or
 * -1 when it breaks the protocol (its size, its MAC: the connection must be
 * closed), with why in WHY (a static string). */
long dk_agentwire_open(dk_agentwire_t *w, const unsigned char *buf, size_t len,
                       dk_agentframe_t *f, size_t *need, const char **why);

#endif
