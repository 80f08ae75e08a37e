/*
 * dk_wire: the Jupyter wire format and its signatures.
 *
 * A message on the wire is
 *     [identity..., "<IDS|MSG>", signature, header, parent_header, metadata, content, buffer...]
 * where signature is the lowercase hex HMAC-SHA256, keyed with the connection key,
 * over header, parent_header, metadata and content (in that order, concatenated).
 * An empty key means messages are neither signed nor checked.
 *
 * Decoding checks, in this order and before any JSON is parsed: the delimiter
 * exists, the four JSON frames exist, the signature matches (constant-time
 * compare), and the signature was not seen before (replay refusal, a history of
 * DK_REPLAY_HISTORY signatures, as jupyter_client keeps). Only then are the four
 * frames parsed; each must be a JSON object and the header must carry string
 * msg_id and msg_type (and session, username, date, version, when present, must be
 * strings too). Anything else is refused with a message naming the reason.
 *
 * The signer is immutable after creation and safe to share between threads. The
 * replay guard has its own lock and is safe to share too.
 */
#ifndef DK_WIRE_H
#define DK_WIRE_H

#include <czmq.h>
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define DK_PROTOCOL_VERSION "5.3"
#define DK_DELIM "<IDS|MSG>"
#define DK_SIG_HEX_LEN 64      /* HMAC-SHA256, the default scheme, in hex */
#define DK_SIG_HEX_MAX 128     /* the longest signature any scheme makes (SHA-512) */
#define DK_REPLAY_HISTORY 65536

typedef struct dk_signer_t dk_signer_t;
typedef struct dk_replay_t dk_replay_t;

/* A decoded message. Everything is owned by the message. */
typedef struct {
    zframe_t **idents;      /* routing identities, in order */
    size_t n_idents;
    json_t *header;         /* object, has string msg_id and msg_type */
    json_t *parent;         /* object, may be empty */
    json_t *metadata;       /* object */
    json_t *content;        /* object */
    zframe_t **buffers;     /* extra binary frames after content */
    size_t n_buffers;
    const char *msg_type;   /* borrowed from header */
} dk_msg_t;

/* Create a signer for KEY (KEY_LEN bytes; may be 0 for "no signing") that signs
 * with HMAC-SHA256. Returns NULL only on allocation failure. Destroy with
 * dk_signer_destroy. */
dk_signer_t *dk_signer_new(const char *key, size_t key_len);

/* Same with HMAC over DIGEST, an OpenSSL digest name ("SHA512", "sha3-256"; NULL
 * means SHA256). Returns NULL on allocation failure or when OpenSSL cannot make an
 * HMAC with DIGEST (see dk_signer_digest_check). */
dk_signer_t *dk_signer_new_digest(const char *digest, const char *key, size_t key_len);

/* Whether OpenSSL can make an HMAC over DIGEST whose hex fits DK_SIG_HEX_MAX
 * (extendable-output functions such as SHAKE cannot). Python spells some names
 * with '_' (sha3_256) where OpenSSL has '-'; both are accepted. */
bool dk_signer_digest_check(const char *digest);

/* The length of this signer's signatures in hex digits (0 with signing disabled). */
size_t dk_signer_hex_len(const dk_signer_t *self);
void dk_signer_destroy(dk_signer_t **self_p);

/* True when the key is non-empty and messages are signed. */
bool dk_signer_enabled(const dk_signer_t *self);

/* Compute the hex signature of the N parts (PARTS[i] of LENS[i] bytes) into OUT,
 * which must hold dk_signer_hex_len + 1 (at most DK_SIG_HEX_MAX + 1) bytes. With signing disabled OUT is "". */
void dk_signer_sign(const dk_signer_t *self, const void *const *parts, const size_t *lens,
                    size_t n, char *out);

/* Check SIG (SIG_LEN bytes) against the signature of the parts, in constant time.
 * With signing disabled every signature is accepted. */
bool dk_signer_verify(const dk_signer_t *self, const void *const *parts, const size_t *lens,
                      size_t n, const char *sig, size_t sig_len);

/* A bounded set of seen signatures (FIFO eviction after CAPACITY entries). */
dk_replay_t *dk_replay_new(size_t capacity);
void dk_replay_destroy(dk_replay_t **self_p);

/* Record SIG. Returns true if it was new, false if it was already seen (a replay). */
bool dk_replay_check_and_add(dk_replay_t *self, const char *sig, size_t sig_len);

/* Decode FRAMES (N_FRAMES frames of the given bytes). REPLAY may be NULL (no replay
 * check; an unsigned session never checks replay either, since empty signatures
 * repeat). On success returns a new message (free with dk_msg_destroy). On failure
 * returns NULL and writes the reason into ERR. */
dk_msg_t *dk_wire_decode(const dk_signer_t *signer, dk_replay_t *replay,
                         const void *const *frames, const size_t *lens, size_t n_frames,
                         char *err, size_t errlen);

/* The same, from a received zmsg_t (which is not modified or freed). */
dk_msg_t *dk_wire_decode_zmsg(const dk_signer_t *signer, dk_replay_t *replay, zmsg_t *raw,
                              char *err, size_t errlen);

void dk_msg_destroy(dk_msg_t **self_p);

/* Check the JSON types of CONTENT's fields against the messaging spec for
 * MSG_TYPE: execute, complete, inspect, is_complete, history, comm_info and
 * shutdown requests, input_reply, comm_open, comm_msg and comm_close. A field
 * may be absent (the kernel's default applies) unless the spec requires it
 * (code, value, comm_id, target_name of comm_open); a present one must have the
 * spec's type, null standing for absent only where clients send it (cursor_pos,
 * history's session/start/stop/n/pattern, comm_info's target_name). Unknown
 * fields and unknown msg_types pass. Returns false, with the reason in ERR
 * ("execute_request: \"silent\" must be a boolean, not a string"), when a
 * request must be refused before anything of it runs. */
bool dk_wire_check_content(const char *msg_type, const json_t *content, char *err,
                           size_t errlen);

/* Build a header object for a new message: msg_id (random UUID), msg_type,
 * session, username, date (ISO 8601 UTC with microseconds), version "5.3".
 * Returns a new reference. */
json_t *dk_header_new(const char *msg_type, const char *session, const char *username);

/* Encode a message to send. IDENTS (N_IDENTS frames, copied; may be NULL/0) are the
 * routing prefix. HEADER, PARENT, METADATA, CONTENT are borrowed JSON objects
 * (PARENT, METADATA may be NULL for {}). BUFFERS (copied) may be NULL/0.
 * Returns a new zmsg_t ready for zmsg_send, or NULL if a part cannot be serialised. */
zmsg_t *dk_wire_encode(const dk_signer_t *signer, zframe_t *const *idents, size_t n_idents,
                       json_t *header, json_t *parent, json_t *metadata, json_t *content,
                       zframe_t *const *buffers, size_t n_buffers);

/* Same, with the JSON parts already serialised (PARTS[0..3] = header, parent,
 * metadata, content as compact JSON text). Used on the hot path and by the Python
 * glue, which hands over JSON text it serialised itself. */
zmsg_t *dk_wire_encode_raw(const dk_signer_t *signer, zframe_t *const *idents, size_t n_idents,
                           const char *const parts[4], const size_t lens[4],
                           zframe_t *const *buffers, size_t n_buffers);

#endif
