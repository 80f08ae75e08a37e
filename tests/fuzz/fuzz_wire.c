/*
 * fuzz_wire: the Jupyter wire decoder (protocol/dk_wire.h), signature checking
 * and replay refusal included.
 *
 * Input: one flags byte, then the frames of a message separated by the byte
 * 0x1E (ASCII record separator, which valid JSON text never contains raw):
 *
 *     FLAGS ident... 1E "<IDS|MSG>" 1E signature 1E header 1E parent 1E metadata
 *           1E content [1E buffer...]
 *
 *   bit 0  re-sign: replace the signature frame with the right HMAC-SHA256 of the
 *          four JSON frames for the key "fuzz-key". Without it a mutated JSON
 *          frame would fail verification and the fuzzer could never reach the
 *          JSON parsing behind it; with it, it gets there on every try.
 *   bit 1  decode with no error buffer (ERR = NULL, ERRLEN = 0).
 *   bits 4-7  capacity - 1 of the replay guard the frames are also fed to.
 *
 * Each input is decoded by a signed session (key "fuzz-key", with a replay
 * guard) and by an unsigned one, and what the header promises is checked:
 *   - a signed decode succeeds only if the signature frame is exactly the HMAC
 *     computed here independently (one-shot OpenSSL HMAC, not dk_signer);
 *   - the same message decoded again by the same guard is refused as a replay,
 *     and is accepted again when no guard is given;
 *   - an unsigned session never refuses for a signature or a replay, so it
 *     accepts whatever a signed one accepts;
 *   - a decoded message has the identities before the delimiter, the buffers
 *     after content, four JSON objects and a string msg_id and msg_type;
 *   - round trip: re-encoded with dk_wire_encode, signed or not, it decodes
 *     again to the same identities, JSON and buffers; unsigned, a signed
 *     session refuses it.
 * Finally every frame is offered as a signature to a small replay guard and to
 * a plain FIFO model of it: the guard's hash table and ring must answer as the
 * model does, through evictions.
 */
#include "fuzz_check.h"

#include "dk_wire.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <string.h>

#define KEY "fuzz-key"
#define SEP 0x1E
#define MAX_FRAMES 64
#define REPLAY_MODEL_MAX 16

static dk_signer_t *signed_s;
static dk_signer_t *unsigned_s;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    signed_s = dk_signer_new(KEY, strlen(KEY));
    unsigned_s = dk_signer_new("", 0);
    FUZZ_CHECK(signed_s && unsigned_s, "cannot create the signers");
    FUZZ_CHECK(dk_signer_enabled(signed_s) && !dk_signer_enabled(unsigned_s),
               "a signer with a key must sign and one without must not");
    return 0;
}

typedef struct {
    const void *data[MAX_FRAMES];
    size_t len[MAX_FRAMES];
    size_t n;
    size_t delim;           /* index of the delimiter frame, n if none */
    bool complete;          /* delimiter + signature + 4 JSON frames present */
    char expected[DK_SIG_HEX_LEN + 1];  /* the right signature, if complete */
} frames_t;

static void split(const uint8_t *data, size_t size, frames_t *fr)
{
    fr->n = 0;
    size_t start = 0;
    for (size_t i = 0; i <= size; i++) {
        if (i == size || (data[i] == SEP && fr->n + 1 < MAX_FRAMES)) {
            fr->data[fr->n] = data + start;
            fr->len[fr->n] = i - start;
            fr->n++;
            start = i + 1;
        }
    }
    fr->delim = fr->n;
    for (size_t i = 0; i < fr->n; i++) {
        if (fr->len[i] == strlen(DK_DELIM) && memcmp(fr->data[i], DK_DELIM, fr->len[i]) == 0) {
            fr->delim = i;
            break;
        }
    }
    fr->complete = fr->delim < fr->n && fr->n - fr->delim - 1 >= 5;
}

/* HMAC-SHA256 of the four JSON frames, hex, without dk_signer. */
static void reference_sign(frames_t *fr)
{
    size_t total = 0;
    for (int i = 0; i < 4; i++)
        total += fr->len[fr->delim + 2 + i];
    unsigned char *all = malloc(total ? total : 1);
    FUZZ_CHECK(all, "out of memory");
    size_t at = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = fr->len[fr->delim + 2 + i];
        if (n)
            memcpy(all + at, fr->data[fr->delim + 2 + i], n);
        at += n;
    }
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    FUZZ_CHECK(HMAC(EVP_sha256(), KEY, (int) strlen(KEY), all, total, mac, &mac_len),
               "OpenSSL HMAC failed");
    free(all);
    for (unsigned i = 0; i < mac_len; i++)
        snprintf(fr->expected + 2 * i, 3, "%02x", mac[i]);
}

static bool frame_equals(zframe_t *f, const void *data, size_t len)
{
    return f && zframe_size(f) == len && (len == 0 || memcmp(zframe_data(f), data, len) == 0);
}

static void check_decoded(const dk_msg_t *m, const frames_t *fr)
{
    FUZZ_CHECK(m->n_idents == fr->delim, "%zu identities, the delimiter is frame %zu",
               m->n_idents, fr->delim);
    for (size_t i = 0; i < m->n_idents; i++)
        FUZZ_CHECK(frame_equals(m->idents[i], fr->data[i], fr->len[i]), "identity %zu differs",
                   i);
    FUZZ_CHECK(m->n_buffers == fr->n - fr->delim - 6, "%zu buffers, %zu frames after content",
               m->n_buffers, fr->n - fr->delim - 6);
    for (size_t i = 0; i < m->n_buffers; i++) {
        size_t k = fr->delim + 6 + i;
        FUZZ_CHECK(frame_equals(m->buffers[i], fr->data[k], fr->len[k]), "buffer %zu differs",
                   i);
    }
    FUZZ_CHECK(json_is_object(m->header) && json_is_object(m->parent) &&
                   json_is_object(m->metadata) && json_is_object(m->content),
               "a decoded part is not a JSON object");
    json_t *type = json_object_get(m->header, "msg_type");
    FUZZ_CHECK(json_is_string(json_object_get(m->header, "msg_id")), "no string msg_id");
    FUZZ_CHECK(json_is_string(type) && m->msg_type == json_string_value(type),
               "msg_type is not the header's string");
}

static void check_refused(const dk_msg_t *m, const char *err, size_t errlen)
{
    if (m || errlen == 0)
        return;
    FUZZ_CHECK(fuzz_terminated(err, errlen) && err[0] != '\0',
               "a refusal must say why in a NUL-terminated message");
}

static void check_same(const dk_msg_t *a, const dk_msg_t *b)
{
    FUZZ_CHECK(a->n_idents == b->n_idents && a->n_buffers == b->n_buffers,
               "round trip changed the frame counts (%zu/%zu idents, %zu/%zu buffers)",
               a->n_idents, b->n_idents, a->n_buffers, b->n_buffers);
    for (size_t i = 0; i < a->n_idents; i++)
        FUZZ_CHECK(zframe_eq(a->idents[i], b->idents[i]), "round trip changed identity %zu", i);
    for (size_t i = 0; i < a->n_buffers; i++)
        FUZZ_CHECK(zframe_eq(a->buffers[i], b->buffers[i]), "round trip changed buffer %zu", i);
    FUZZ_CHECK(json_equal(a->header, b->header) && json_equal(a->parent, b->parent) &&
                   json_equal(a->metadata, b->metadata) && json_equal(a->content, b->content),
               "round trip changed the JSON");
    FUZZ_CHECK(strcmp(a->msg_type, b->msg_type) == 0, "round trip changed msg_type");
}

/* Encode M with ENC, decode with DEC: must give M back. Then, if ENC does not
 * sign, a signed session must refuse the result. */
static void round_trip(const dk_msg_t *m, const dk_signer_t *enc, const dk_signer_t *dec)
{
    zmsg_t *z = dk_wire_encode(enc, m->idents, m->n_idents, m->header, m->parent, m->metadata,
                               m->content, m->buffers, m->n_buffers);
    FUZZ_CHECK(z, "dk_wire_encode failed on a message that was just decoded");
    FUZZ_CHECK(zmsg_size(z) == m->n_idents + 6 + m->n_buffers, "encoded %zu frames",
               zmsg_size(z));
    dk_replay_t *replay = dk_replay_new(4);
    FUZZ_CHECK(replay, "out of memory");
    char err[256] = "";
    dk_msg_t *back = dk_wire_decode_zmsg(dec, replay, z, err, sizeof err);
    FUZZ_CHECK(back, "a re-encoded message does not decode: %s", err);
    check_same(m, back);
    dk_msg_destroy(&back);
    if (!dk_signer_enabled(enc)) {
        back = dk_wire_decode_zmsg(signed_s, replay, z, err, sizeof err);
        FUZZ_CHECK(!back, "a signed session accepted an unsigned message");
    }
    dk_replay_destroy(&replay);
    zmsg_destroy(&z);
}

/* The replay guard against a FIFO model: CAPACITY most recent new signatures. */
static void replay_model(const frames_t *fr, size_t capacity)
{
    dk_replay_t *guard = dk_replay_new(capacity);
    FUZZ_CHECK(guard, "dk_replay_new(%zu) failed", capacity);
    const void *seen[REPLAY_MODEL_MAX];
    size_t seen_len[REPLAY_MODEL_MAX];
    size_t used = 0, oldest = 0;
    for (size_t i = 0; i < fr->n; i++) {
        bool known = false;
        for (size_t k = 0; k < used && !known; k++)
            known = seen_len[k] == fr->len[i] &&
                    (fr->len[i] == 0 || memcmp(seen[k], fr->data[i], fr->len[i]) == 0);
        bool fresh = dk_replay_check_and_add(guard, fr->data[i], fr->len[i]);
        FUZZ_CHECK(fresh == !known, "frame %zu (%zu bytes): the guard says %s, the model %s",
                   i, fr->len[i], fresh ? "new" : "replay", known ? "replay" : "new");
        if (known)
            continue;
        if (used < capacity) {
            seen[used] = fr->data[i];
            seen_len[used++] = fr->len[i];
        } else {
            seen[oldest] = fr->data[i];
            seen_len[oldest] = fr->len[i];
            oldest = (oldest + 1) % capacity;
        }
    }
    dk_replay_destroy(&guard);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    frames_t fr;
    split(data + 1, size - 1, &fr);
    if (fr.complete) {
        reference_sign(&fr);
        if (flags & 1) {
            fr.data[fr.delim + 1] = fr.expected;
            fr.len[fr.delim + 1] = DK_SIG_HEX_LEN;
        }
    }
    char errbuf[256];
    char *err = (flags & 2) ? NULL : errbuf;
    size_t errlen = (flags & 2) ? 0 : sizeof errbuf;

    /* The signed session. */
    bool sig_right = fr.complete && fr.len[fr.delim + 1] == DK_SIG_HEX_LEN &&
                     memcmp(fr.data[fr.delim + 1], fr.expected, DK_SIG_HEX_LEN) == 0;
    if (fr.complete) {
        bool ok = dk_signer_verify(signed_s, fr.data + fr.delim + 2, fr.len + fr.delim + 2, 4,
                                   fr.data[fr.delim + 1], fr.len[fr.delim + 1]);
        FUZZ_CHECK(ok == sig_right, "dk_signer_verify says %d, the reference HMAC %d", ok,
                   sig_right);
    }
    dk_replay_t *replay = dk_replay_new(8);
    FUZZ_CHECK(replay, "out of memory");
    dk_msg_t *m = dk_wire_decode(signed_s, replay, fr.data, fr.len, fr.n, err, errlen);
    check_refused(m, err, errlen);
    if (m) {
        FUZZ_CHECK(sig_right, "accepted a message whose signature is not the HMAC");
        check_decoded(m, &fr);
        dk_msg_t *again = dk_wire_decode(signed_s, replay, fr.data, fr.len, fr.n, err, errlen);
        FUZZ_CHECK(!again, "accepted the same signed message twice (a replay)");
        check_refused(again, err, errlen);
        again = dk_wire_decode(signed_s, NULL, fr.data, fr.len, fr.n, err, errlen);
        FUZZ_CHECK(again, "refused without a replay guard what it accepted with one");
        dk_msg_destroy(&again);
    }

    /* The unsigned session: the signature frame is not looked at. */
    dk_msg_t *u = dk_wire_decode(unsigned_s, replay, fr.data, fr.len, fr.n, err, errlen);
    check_refused(u, err, errlen);
    FUZZ_CHECK(u || !m, "an unsigned session refused what a signed one accepted");
    if (u) {
        check_decoded(u, &fr);
        dk_msg_t *again = dk_wire_decode(unsigned_s, replay, fr.data, fr.len, fr.n, err, errlen);
        FUZZ_CHECK(again, "an unsigned session refused a repeated message as a replay");
        dk_msg_destroy(&again);
        round_trip(u, signed_s, signed_s);
        round_trip(u, unsigned_s, unsigned_s);
    }
    dk_msg_destroy(&u);
    dk_msg_destroy(&m);
    dk_replay_destroy(&replay);

    replay_model(&fr, 1 + (flags >> 4));
    return 0;
}
