/*
 * dk_wire: framing, signing and replay refusal for Jupyter messages.
 *
 * The wire format is a list of frames; the JSON parts are signed as raw bytes,
 * so everything that decides whether a message is acceptable can be done without
 * parsing JSON. Decoding therefore runs cheapest-and-safest first:
 *
 *   1. find the "<IDS|MSG>" delimiter (frames before it are routing identities);
 *   2. require signature + header + parent + metadata + content after it;
 *   3. check the signature's shape, then its value with CRYPTO_memcmp;
 *   4. refuse a signature seen before (only in a signed session: unsigned
 *      messages all carry "", which would look like a replay every time);
 *   5. only now hand the four frames to jansson.
 *
 * An attacker without the key never gets its bytes as far as the JSON parser,
 * and a message that fails verification is never recorded as seen, so forged
 * traffic cannot evict genuine signatures from the replay history.
 *
 * Signing uses OpenSSL's EVP_MAC: "HMAC" with SHA256 (what jupyter_client
 * writes, and what a file without "signature_scheme" means) or any other digest
 * OpenSSL provides, since the spec allows every hmac-* scheme. A fresh MAC context is
 * made per call instead of sharing one: the signer stays immutable and can be
 * used from the shell, control and iopub threads at once without a lock; the
 * cost (a key schedule of two SHA-256 blocks) is small next to a ZeroMQ send.
 *
 * The replay guard is a FIFO set: a ring of fixed-size nodes in insertion order
 * plus a chained hash table of indices into that ring. When the ring is full the
 * oldest node is unlinked from its bucket and reused, so memory is allocated
 * once (calloc: pages are only touched as the history fills) and
 * dk_replay_check_and_add never allocates and so never fails. Signatures of up
 * to DK_SIG_HEX_LEN bytes are kept verbatim; a longer one (HMAC-SHA384 or -512)
 * is kept as its SHA-256, marked so it cannot collide with a verbatim key: the
 * node stays the size the common scheme needs.
 */
#include "dk_err.h"
#include "dk_wire.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>


/* ------------------------------------------------------------------------ */
/* Signer                                                                    */

struct dk_signer_t {
    unsigned char *key;     /* NULL when signing is disabled */
    size_t key_len;
    EVP_MAC *mac;           /* fetched once; EVP_MAC objects are shareable */
    char digest[64];        /* OpenSSL's name for the HMAC's digest */
    size_t mac_len;         /* bytes of a MAC; its hex is twice that */
};

/* The digest OpenSSL knows by NAME, or by NAME with '_' read as '-' (Python's
 * hashlib says sha3_256, OpenSSL SHA3-256), written into OUT; its size in bytes,
 * or 0 if there is none, it is an extendable-output function (no fixed size to
 * sign with) or its hex would not fit DK_SIG_HEX_MAX. */
static size_t digest_lookup(const char *name, char *out, size_t outlen)
{
    if (!name || !*name || strlen(name) >= outlen)
        return 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        snprintf(out, outlen, "%s", name);
        if (attempt == 1) {
            if (!strchr(out, '_'))
                break;
            for (char *p = out; *p; p++)
                if (*p == '_')
                    *p = '-';
        }
        EVP_MD *md = EVP_MD_fetch(NULL, out, NULL);
        if (!md)
            continue;
        bool xof = (EVP_MD_get_flags(md) & EVP_MD_FLAG_XOF) != 0;
        int size = EVP_MD_get_size(md);
        EVP_MD_free(md);
        if (xof || size <= 0 || (size_t) size * 2 > DK_SIG_HEX_MAX)
            return 0;
        return (size_t) size;
    }
    return 0;
}

bool dk_signer_digest_check(const char *digest)
{
    char name[64];
    return digest_lookup(digest, name, sizeof name) > 0;
}

dk_signer_t *dk_signer_new(const char *key, size_t key_len)
{
    return dk_signer_new_digest(NULL, key, key_len);
}

dk_signer_t *dk_signer_new_digest(const char *digest, const char *key, size_t key_len)
{
    dk_signer_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->mac_len = digest_lookup(digest ? digest : "SHA256", self->digest, sizeof self->digest);
    if (self->mac_len == 0) {
        free(self);
        return NULL;
    }
    if (key && key_len > 0) {
        self->key = malloc(key_len);
        self->mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
        if (!self->key || !self->mac) {
            dk_signer_destroy(&self);
            return NULL;
        }
        memcpy(self->key, key, key_len);
        self->key_len = key_len;
    }
    return self;
}

void dk_signer_destroy(dk_signer_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_signer_t *self = *self_p;
    if (self->key) {
        OPENSSL_cleanse(self->key, self->key_len);
        free(self->key);
    }
    EVP_MAC_free(self->mac);
    free(self);
    *self_p = NULL;
}

bool dk_signer_enabled(const dk_signer_t *self)
{
    return self && self->key_len > 0;
}

size_t dk_signer_hex_len(const dk_signer_t *self)
{
    return dk_signer_enabled(self) ? 2 * self->mac_len : 0;
}

/* The HMAC of the concatenated parts as lowercase hex into OUT (hex_len + 1
 * bytes). Returns false (OUT = "") if OpenSSL fails, so a failure can never
 * verify. */
static bool signer_hex(const dk_signer_t *self, const void *const *parts, const size_t *lens,
                       size_t n, char *out)
{
    static const char hexdigits[] = "0123456789abcdef";
    unsigned char mac[EVP_MAX_MD_SIZE];
    size_t mac_len = 0;
    char digest[sizeof self->digest];
    memcpy(digest, self->digest, sizeof digest);
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };

    out[0] = '\0';
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(self->mac);
    bool ok = ctx && EVP_MAC_init(ctx, self->key, self->key_len, params);
    for (size_t i = 0; ok && i < n; i++) {
        if (lens[i] > 0)
            ok = EVP_MAC_update(ctx, parts[i], lens[i]);
    }
    ok = ok && EVP_MAC_final(ctx, mac, &mac_len, sizeof mac) && mac_len == self->mac_len;
    EVP_MAC_CTX_free(ctx);
    if (!ok)
        return false;
    for (size_t i = 0; i < mac_len; i++) {
        out[2 * i] = hexdigits[mac[i] >> 4];
        out[2 * i + 1] = hexdigits[mac[i] & 0x0f];
    }
    out[2 * mac_len] = '\0';
    return true;
}

void dk_signer_sign(const dk_signer_t *self, const void *const *parts, const size_t *lens,
                    size_t n, char *out)
{
    out[0] = '\0';
    if (dk_signer_enabled(self))
        signer_hex(self, parts, lens, n, out);
}

bool dk_signer_verify(const dk_signer_t *self, const void *const *parts, const size_t *lens,
                      size_t n, const char *sig, size_t sig_len)
{
    if (!dk_signer_enabled(self))
        return true;
    char expected[DK_SIG_HEX_MAX + 1];
    size_t hex_len = dk_signer_hex_len(self);
    if (!sig || sig_len != hex_len || !signer_hex(self, parts, lens, n, expected))
        return false;
    return CRYPTO_memcmp(expected, sig, hex_len) == 0;
}

/* ------------------------------------------------------------------------ */
/* Replay guard                                                              */

#define NIL UINT32_MAX

typedef struct {
    uint64_t hash;
    uint32_t next;                      /* next node in the same bucket, or NIL */
    uint8_t len;                        /* bytes of KEY in use */
    uint8_t digested;                   /* KEY is the SHA-256 of a longer signature */
    unsigned char key[DK_SIG_HEX_LEN];
} replay_node_t;

struct dk_replay_t {
    pthread_mutex_t lock;
    size_t capacity;
    size_t used;            /* nodes filled so far; == capacity once the ring is full */
    size_t oldest;          /* ring index evicted next, once full */
    uint32_t *buckets;      /* heads of the chains, NIL when empty */
    size_t mask;            /* bucket count - 1 (a power of two) */
    replay_node_t *nodes;
};

dk_replay_t *dk_replay_new(size_t capacity)
{
    /* A guard that remembers nothing would silently accept every replay. */
    if (capacity == 0 || capacity >= NIL)
        return NULL;
    size_t n_buckets = 1;
    while (n_buckets < capacity)
        n_buckets <<= 1;

    dk_replay_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->nodes = calloc(capacity, sizeof *self->nodes);
    self->buckets = malloc(n_buckets * sizeof *self->buckets);
    if (!self->nodes || !self->buckets || pthread_mutex_init(&self->lock, NULL) != 0) {
        free(self->nodes);
        free(self->buckets);
        free(self);
        return NULL;
    }
    for (size_t i = 0; i < n_buckets; i++)
        self->buckets[i] = NIL;
    self->capacity = capacity;
    self->mask = n_buckets - 1;
    return self;
}

void dk_replay_destroy(dk_replay_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_replay_t *self = *self_p;
    pthread_mutex_destroy(&self->lock);
    free(self->nodes);
    free(self->buckets);
    free(self);
    *self_p = NULL;
}

/* FNV-1a: verified signatures are HMAC output, already uniform, so a cheap
 * hash spreads them well; only the bucket index comes from it. */
static uint64_t replay_hash(const unsigned char *key, size_t len, bool digested)
{
    uint64_t h = digested ? 0x84222325cbf29ce4ULL : 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < len; i++) {
        h ^= key[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static void replay_unlink(dk_replay_t *self, uint32_t idx)
{
    uint32_t *link = &self->buckets[self->nodes[idx].hash & self->mask];
    while (*link != NIL && *link != idx)
        link = &self->nodes[*link].next;
    if (*link == idx)
        *link = self->nodes[idx].next;
}

bool dk_replay_check_and_add(dk_replay_t *self, const char *sig, size_t sig_len)
{
    if (!self)
        return true;
    unsigned char key[DK_SIG_HEX_LEN];
    size_t key_len = sig_len;
    bool digested = sig_len > DK_SIG_HEX_LEN;
    if (digested) {
        unsigned int dlen = 0;
        if (!EVP_Digest(sig, sig_len, key, &dlen, EVP_sha256(), NULL))
            return false;   /* cannot tell: fail closed */
        key_len = dlen;
    } else if (sig_len > 0) {
        memcpy(key, sig, sig_len);
    }
    uint64_t h = replay_hash(key, key_len, digested);

    pthread_mutex_lock(&self->lock);
    uint32_t *head = &self->buckets[h & self->mask];
    for (uint32_t i = *head; i != NIL; i = self->nodes[i].next) {
        const replay_node_t *node = &self->nodes[i];
        if (node->hash == h && node->len == key_len && node->digested == digested &&
            memcmp(node->key, key, key_len) == 0) {
            pthread_mutex_unlock(&self->lock);
            return false;
        }
    }
    uint32_t slot;
    if (self->used < self->capacity) {
        slot = (uint32_t) self->used++;
    } else {
        slot = (uint32_t) self->oldest;
        replay_unlink(self, slot);
        self->oldest = (self->oldest + 1) % self->capacity;
    }
    replay_node_t *node = &self->nodes[slot];
    node->hash = h;
    node->len = (uint8_t) key_len;
    node->digested = digested;
    if (key_len > 0)
        memcpy(node->key, key, key_len);
    /* Read the head only now: the eviction above may have unlinked it. */
    node->next = *head;
    *head = slot;
    pthread_mutex_unlock(&self->lock);
    return true;
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                  */

static const char *const part_names[4] = {"header", "parent_header", "metadata", "content"};


static bool frame_is_delim(const void *data, size_t len)
{
    return len == sizeof DK_DELIM - 1 && data && memcmp(data, DK_DELIM, len) == 0;
}

static bool is_lower_hex(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return false;
    }
    return true;
}

static const char *json_kind(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "something else";
}

/* Parse one JSON part, which must be an object. */
static json_t *parse_part(const void *data, size_t len, const char *name, char *err,
                          size_t errlen)
{
    json_error_t jerr;
    json_t *j = json_loadb(data ? data : "", len, JSON_DECODE_ANY, &jerr);
    if (!j) {
        dk_set_err(err, errlen, "refused message: %s frame is not valid JSON (%s, at byte %d)",
                name, jerr.text, jerr.position);
        return NULL;
    }
    if (!json_is_object(j)) {
        dk_set_err(err, errlen, "refused message: %s frame is %s, expected a JSON object", name,
                json_kind(j));
        json_decref(j);
        return NULL;
    }
    return j;
}

static zframe_t **copy_frames(const void *const *frames, const size_t *lens, size_t n)
{
    if (n == 0)
        return NULL;
    zframe_t **out = calloc(n, sizeof *out);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        out[i] = zframe_new(frames[i], lens[i]);
        if (!out[i]) {
            for (size_t k = 0; k < i; k++)
                zframe_destroy(&out[k]);
            free(out);
            return NULL;
        }
    }
    return out;
}

/* The signature SIG over the four PARTS: well formed, valid, and not seen
 * before (checked in that order, so forged messages never fill REPLAY). */
static bool signature_ok(const dk_signer_t *signer, dk_replay_t *replay, const char *sig,
                         size_t sig_len, const void *const *parts, const size_t *part_lens,
                         char *err, size_t errlen)
{
    if (!dk_signer_enabled(signer))
        return true;
    if (sig_len != dk_signer_hex_len(signer) || !is_lower_hex(sig, sig_len)) {
        dk_set_err(err, errlen,
                   "refused message: malformed signature (%zu bytes, expected %zu lowercase "
                   "hex digits of HMAC-%s)", sig_len, dk_signer_hex_len(signer), signer->digest);
        return false;
    }
    if (!dk_signer_verify(signer, parts, part_lens, 4, sig, sig_len)) {
        dk_set_err(err, errlen,
                   "refused message: invalid signature (the message was altered or signed "
                   "with another key; check the connection file's key)");
        return false;
    }
    if (replay && !dk_replay_check_and_add(replay, sig, sig_len)) {
        dk_set_err(err, errlen,
                   "refused message: duplicate signature (a replay of a message already "
                   "received)");
        return false;
    }
    return true;
}

/* The header's fields: msg_id and msg_type must be strings, and the others a
 * header has are strings too (the spec's header schema). The kernel only
 * echoes them, but a message whose header is not what the spec says is not a
 * Jupyter message, so it is refused like one that lacks msg_type rather than
 * run. Absent ones are allowed, as jupyter_client requires only msg_id and
 * msg_type too. */
static bool header_ok(const json_t *header, char *err, size_t errlen)
{
    json_t *msg_id = json_object_get(header, "msg_id");
    json_t *msg_type = json_object_get(header, "msg_type");
    if (!json_is_string(msg_id) || !json_is_string(msg_type)) {
        dk_set_err(err, errlen, "refused message: header has no string \"%s\"",
                   json_is_string(msg_id) ? "msg_type" : "msg_id");
        return false;
    }
    static const char *const header_strings[] = {"session", "username", "date", "version"};
    for (size_t i = 0; i < sizeof header_strings / sizeof *header_strings; i++) {
        json_t *v = json_object_get(header, header_strings[i]);
        if (v && !json_is_string(v)) {
            dk_set_err(err, errlen, "refused message: header \"%s\" is %s, expected a string",
                       header_strings[i], json_kind(v));
            return false;
        }
    }
    return true;
}

/* A message from its four JSON PARTS and the frames around them; NULL with
 * ERR. */
static dk_msg_t *build_msg(const void *const *frames, const size_t *lens, size_t delim,
                           size_t n_buffers, char *err, size_t errlen)
{
    const void *const *parts = frames + delim + 2;
    const size_t *part_lens = lens + delim + 2;
    dk_msg_t *msg = calloc(1, sizeof *msg);
    if (!msg) {
        dk_set_err(err, errlen, "refused message: out of memory");
        return NULL;
    }
    json_t **slots[4] = {&msg->header, &msg->parent, &msg->metadata, &msg->content};
    for (int i = 0; i < 4; i++) {
        *slots[i] = parse_part(parts[i], part_lens[i], part_names[i], err, errlen);
        if (!*slots[i]) {
            dk_msg_destroy(&msg);
            return NULL;
        }
    }
    if (!header_ok(msg->header, err, errlen)) {
        dk_msg_destroy(&msg);
        return NULL;
    }
    msg->msg_type = json_string_value(json_object_get(msg->header, "msg_type"));
    msg->idents = copy_frames(frames, lens, delim);
    msg->buffers = copy_frames(frames + delim + 6, lens + delim + 6, n_buffers);
    if ((delim && !msg->idents) || (n_buffers && !msg->buffers)) {
        dk_set_err(err, errlen, "refused message: out of memory");
        dk_msg_destroy(&msg);
        return NULL;
    }
    msg->n_idents = delim;
    msg->n_buffers = n_buffers;
    return msg;
}

dk_msg_t *dk_wire_decode(const dk_signer_t *signer, dk_replay_t *replay,
                         const void *const *frames, const size_t *lens, size_t n_frames,
                         char *err, size_t errlen)
{
    if (n_frames > 0 && (!frames || !lens)) {
        dk_set_err(err, errlen, "refused message: no frame data was given");
        return NULL;
    }
    size_t delim = 0;
    while (delim < n_frames && !frame_is_delim(frames[delim], lens[delim]))
        delim++;
    if (delim == n_frames) {
        dk_set_err(err, errlen,
                   "refused message: no \"" DK_DELIM "\" delimiter frame among its %zu frames "
                   "(not a Jupyter message)", n_frames);
        return NULL;
    }
    size_t after = n_frames - delim - 1;
    if (after < 5) {
        dk_set_err(err, errlen,
                   "refused message: %zu frames after the delimiter, expected at least 5 "
                   "(signature, header, parent_header, metadata, content)", after);
        return NULL;
    }
    if (!signature_ok(signer, replay, frames[delim + 1], lens[delim + 1], frames + delim + 2,
                      lens + delim + 2, err, errlen))
        return NULL;
    return build_msg(frames, lens, delim, after - 5, err, errlen);
}

dk_msg_t *dk_wire_decode_zmsg(const dk_signer_t *signer, dk_replay_t *replay, zmsg_t *raw,
                              char *err, size_t errlen)
{
    if (!raw) {
        dk_set_err(err, errlen, "refused message: no message");
        return NULL;
    }
    size_t n = zmsg_size(raw);
    const void **frames = calloc(n ? n : 1, sizeof *frames);
    size_t *lens = calloc(n ? n : 1, sizeof *lens);
    dk_msg_t *msg = NULL;
    if (!frames || !lens) {
        dk_set_err(err, errlen, "refused message: out of memory");
    } else {
        size_t i = 0;
        for (zframe_t *f = zmsg_first(raw); f && i < n; f = zmsg_next(raw), i++) {
            frames[i] = zframe_data(f);
            lens[i] = zframe_size(f);
        }
        msg = dk_wire_decode(signer, replay, frames, lens, i, err, errlen);
    }
    free(frames);
    free(lens);
    return msg;
}

void dk_msg_destroy(dk_msg_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_msg_t *self = *self_p;
    for (size_t i = 0; i < self->n_idents; i++)
        zframe_destroy(&self->idents[i]);
    for (size_t i = 0; i < self->n_buffers; i++)
        zframe_destroy(&self->buffers[i]);
    free(self->idents);
    free(self->buffers);
    json_decref(self->header);
    json_decref(self->parent);
    json_decref(self->metadata);
    json_decref(self->content);
    free(self);
    *self_p = NULL;
}

/* ------------------------------------------------------------------------ */
/* Content types                                                             */

/* What the messaging spec says each field of a request's content is. A field
 * absent from the content gets the kernel's default; one that is present must
 * have its type. NULLABLE: null stands for "absent" (jupyter_client sends None
 * for the optional integers of history_request, and cursor_pos). */
typedef enum { K_STRING, K_BOOL, K_INT, K_OBJECT, K_STRING_MAP } field_kind_t;

enum { F_REQUIRED = 1, F_NULLABLE = 2 };

typedef struct {
    const char *name;
    field_kind_t kind;
    unsigned flags;
} field_spec_t;

typedef struct {
    const char *msg_type;
    field_spec_t fields[10];    /* ends at the first NULL name */
} content_spec_t;

static const content_spec_t content_specs[] = {
    {"execute_request", {{"code", K_STRING, F_REQUIRED}, {"silent", K_BOOL, 0},
                         {"store_history", K_BOOL, 0}, {"user_expressions", K_STRING_MAP, 0},
                         {"allow_stdin", K_BOOL, 0}, {"stop_on_error", K_BOOL, 0}}},
    {"complete_request", {{"code", K_STRING, F_REQUIRED}, {"cursor_pos", K_INT, F_NULLABLE}}},
    {"inspect_request", {{"code", K_STRING, F_REQUIRED}, {"cursor_pos", K_INT, F_NULLABLE},
                         {"detail_level", K_INT, 0}}},
    {"is_complete_request", {{"code", K_STRING, F_REQUIRED}}},
    {"history_request", {{"output", K_BOOL, 0}, {"raw", K_BOOL, 0},
                         {"hist_access_type", K_STRING, 0}, {"session", K_INT, F_NULLABLE},
                         {"start", K_INT, F_NULLABLE}, {"stop", K_INT, F_NULLABLE},
                         {"n", K_INT, F_NULLABLE}, {"pattern", K_STRING, F_NULLABLE},
                         {"unique", K_BOOL, 0}}},
    {"comm_info_request", {{"target_name", K_STRING, F_NULLABLE}}},
    {"shutdown_request", {{"restart", K_BOOL, 0}}},
    {"input_reply", {{"value", K_STRING, F_REQUIRED}}},
    {"comm_open", {{"comm_id", K_STRING, F_REQUIRED}, {"target_name", K_STRING, F_REQUIRED},
                   {"data", K_OBJECT, 0}}},
    {"comm_msg", {{"comm_id", K_STRING, F_REQUIRED}, {"data", K_OBJECT, 0}}},
    {"comm_close", {{"comm_id", K_STRING, F_REQUIRED}, {"data", K_OBJECT, 0}}},
};

static const char *const kind_names[] = {
    [K_STRING] = "a string", [K_BOOL] = "a boolean", [K_INT] = "an integer",
    [K_OBJECT] = "an object", [K_STRING_MAP] = "an object of strings",
};

static bool has_kind(const json_t *v, field_kind_t kind)
{
    switch (kind) {
    case K_STRING: return json_is_string(v);
    case K_BOOL: return json_is_boolean(v);
    case K_INT: return json_is_integer(v);
    case K_OBJECT: return json_is_object(v);
    case K_STRING_MAP: {
        if (!json_is_object(v))
            return false;
        const char *key;
        json_t *item;
        json_object_foreach((json_t *) v, key, item) {
            if (!json_is_string(item))
                return false;
        }
        return true;
    }
    }
    return false;
}

bool dk_wire_check_content(const char *msg_type, const json_t *content, char *err,
                           size_t errlen)
{
    if (!msg_type)
        return true;
    if (!json_is_object(content)) {
        dk_set_err(err, errlen, "%s: the content is %s, expected an object", msg_type,
                   content ? json_kind(content) : "missing");
        return false;
    }
    for (size_t i = 0; i < sizeof content_specs / sizeof *content_specs; i++) {
        const content_spec_t *spec = &content_specs[i];
        if (strcmp(spec->msg_type, msg_type) != 0)
            continue;
        for (const field_spec_t *f = spec->fields; f->name; f++) {
            json_t *v = json_object_get(content, f->name);
            if (!v || (json_is_null(v) && (f->flags & F_NULLABLE))) {
                if (!v && (f->flags & F_REQUIRED)) {
                    dk_set_err(err, errlen, "%s: \"%s\" is missing (%s is required)", msg_type,
                               f->name, kind_names[f->kind]);
                    return false;
                }
                continue;
            }
            if (!has_kind(v, f->kind)) {
                dk_set_err(err, errlen, "%s: \"%s\" must be %s, not %s", msg_type, f->name,
                           kind_names[f->kind],
                           f->kind == K_STRING_MAP && json_is_object(v)
                               ? "an object with other values" : json_kind(v));
                return false;
            }
        }
        return true;
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* Building and encoding                                                     */

/* A random (version 4) UUID in its canonical lowercase 8-4-4-4-12 form. */
static bool uuid4(char out[37])
{
    unsigned char b[16];
    if (RAND_bytes(b, sizeof b) != 1)
        return false;
    b[6] = (unsigned char) ((b[6] & 0x0f) | 0x40);     /* version 4 */
    b[8] = (unsigned char) ((b[8] & 0x3f) | 0x80);     /* RFC 4122 variant */
    snprintf(out, 37,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
             b[13], b[14], b[15]);
    return true;
}

/* Now as "YYYY-MM-DDTHH:MM:SS.uuuuuuZ", the form jupyter_client writes. */
static bool iso_now(char *out, size_t outlen)
{
    struct timespec ts;
    struct tm tm;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || !gmtime_r(&ts.tv_sec, &tm))
        return false;
    size_t n = strftime(out, outlen, "%Y-%m-%dT%H:%M:%S", &tm);
    if (n == 0)
        return false;
    return snprintf(out + n, outlen - n, ".%06ldZ", ts.tv_nsec / 1000) < (int) (outlen - n);
}

json_t *dk_header_new(const char *msg_type, const char *session, const char *username)
{
    char id[37];
    char date[64];
    if (!msg_type || !uuid4(id) || !iso_now(date, sizeof date))
        return NULL;
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}",
                     "msg_id", id,
                     "msg_type", msg_type,
                     "session", session ? session : "",
                     "username", username ? username : "",
                     "date", date,
                     "version", DK_PROTOCOL_VERSION);
}

zmsg_t *dk_wire_encode_raw(const dk_signer_t *signer, zframe_t *const *idents, size_t n_idents,
                           const char *const parts[4], const size_t lens[4],
                           zframe_t *const *buffers, size_t n_buffers)
{
    if (!parts || !lens)
        return NULL;
    for (int i = 0; i < 4; i++) {
        if (!parts[i])
            return NULL;
    }
    char sig[DK_SIG_HEX_MAX + 1];
    dk_signer_sign(signer, (const void *const *) parts, lens, 4, sig);
    if (dk_signer_enabled(signer) && sig[0] == '\0')
        return NULL;    /* an unsigned message would only be refused by the peer */

    zmsg_t *msg = zmsg_new();
    if (!msg)
        return NULL;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n_idents; i++) {
        zframe_t *copy = idents[i] ? zframe_dup(idents[i]) : NULL;
        rc = copy ? zmsg_append(msg, &copy) : -1;
    }
    if (rc == 0)
        rc = zmsg_addmem(msg, DK_DELIM, sizeof DK_DELIM - 1);
    if (rc == 0)
        rc = zmsg_addmem(msg, sig, strlen(sig));
    for (int i = 0; rc == 0 && i < 4; i++)
        rc = zmsg_addmem(msg, parts[i], lens[i]);
    for (size_t i = 0; rc == 0 && i < n_buffers; i++) {
        zframe_t *copy = buffers[i] ? zframe_dup(buffers[i]) : NULL;
        rc = copy ? zmsg_append(msg, &copy) : -1;
    }
    if (rc != 0)
        zmsg_destroy(&msg);
    return msg;
}

zmsg_t *dk_wire_encode(const dk_signer_t *signer, zframe_t *const *idents, size_t n_idents,
                       json_t *header, json_t *parent, json_t *metadata, json_t *content,
                       zframe_t *const *buffers, size_t n_buffers)
{
    json_t *objs[4] = {header, parent, metadata, content};
    char *texts[4] = {NULL, NULL, NULL, NULL};
    size_t lens[4] = {0, 0, 0, 0};
    zmsg_t *msg = NULL;
    bool ok = json_is_object(header) && json_is_object(content);
    for (int i = 0; ok && i < 4; i++) {
        if (!objs[i]) {
            texts[i] = strdup("{}");
        } else if (json_is_object(objs[i])) {
            /* Compact, as jupyter_client signs what it sends byte for byte; the
             * peer verifies the bytes, so any canonical form works. */
            texts[i] = json_dumps(objs[i], JSON_COMPACT);
        }
        ok = texts[i] != NULL;
        if (ok)
            lens[i] = strlen(texts[i]);
    }
    if (ok)
        msg = dk_wire_encode_raw(signer, idents, n_idents, (const char *const *) texts, lens,
                                 buffers, n_buffers);
    for (int i = 0; i < 4; i++)
        free(texts[i]);
    return msg;
}
