/*
 * The Jupyter wire format: signing, verification, replay refusal, decoding and
 * encoding, as specified in protocol/dk_wire.h.
 */
#include <criterion/criterion.h>

#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_wire.h"

#define KEY "secret-key"
#define HEADER "{\"msg_id\":\"1\",\"msg_type\":\"kernel_info_request\"}"

/* HMAC-SHA256 of HEADER "{}{}{}" keyed with KEY, computed independently with
 *   printf '%s' '{"msg_id":"1","msg_type":"kernel_info_request"}{}{}{}' \
 *       | openssl dgst -sha256 -hmac 'secret-key'
 * and cross-checked with Python's hmac.new(key, msg, hashlib.sha256). */
#define HEADER_SIG "d24613c901272087168eb7a17b371d2f54d14044dca08737846f4baf86191b6a"

/* The well-known HMAC-SHA256 example (key "key"), also from
 *   printf '%s' 'The quick brown fox jumps over the lazy dog' \
 *       | openssl dgst -sha256 -hmac key */
#define FOX_SIG "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"

/* A list of frames being assembled, as a socket would deliver them. */
typedef struct {
    const void *data[32];
    size_t len[32];
    size_t n;
    char sig[DK_SIG_HEX_MAX + 1];
} frames_t;

static void push(frames_t *fr, const void *data, size_t len)
{
    cr_assert_lt(fr->n, 32);
    fr->data[fr->n] = data;
    fr->len[fr->n] = len;
    fr->n++;
}

static void push_str(frames_t *fr, const char *s)
{
    push(fr, s, strlen(s));
}

/* Append delimiter, signature (computed by SIGNER) and the four JSON parts. */
static void push_msg(frames_t *fr, const dk_signer_t *signer, const char *header,
                     const char *parent, const char *metadata, const char *content)
{
    const void *parts[4] = {header, parent, metadata, content};
    size_t lens[4] = {strlen(header), strlen(parent), strlen(metadata), strlen(content)};
    dk_signer_sign(signer, parts, lens, 4, fr->sig);
    push_str(fr, DK_DELIM);
    push_str(fr, fr->sig);
    for (int i = 0; i < 4; i++)
        push(fr, parts[i], lens[i]);
}

static dk_msg_t *decode(const dk_signer_t *signer, dk_replay_t *replay, frames_t *fr, char *err,
                        size_t errlen)
{
    err[0] = '\0';
    return dk_wire_decode(signer, replay, fr->data, fr->len, fr->n, err, errlen);
}

static dk_signer_t *signer;
static dk_replay_t *replay;

static void setup(void)
{
    signer = dk_signer_new(KEY, strlen(KEY));
    replay = dk_replay_new(DK_REPLAY_HISTORY);
    cr_assert_not_null(signer);
    cr_assert_not_null(replay);
}

static void teardown(void)
{
    dk_signer_destroy(&signer);
    dk_replay_destroy(&replay);
}

TestSuite(sign, .init = setup, .fini = teardown);
TestSuite(replay, .init = setup, .fini = teardown);
TestSuite(decode, .init = setup, .fini = teardown);
TestSuite(encode, .init = setup, .fini = teardown);
TestSuite(header);

/* ---- signing ---- */

Test(sign, matches_an_independently_computed_hmac_sha256)
{
    dk_signer_t *s = dk_signer_new("key", 3);
    const void *parts[1] = {"The quick brown fox jumps over the lazy dog"};
    size_t lens[1] = {strlen(parts[0])};
    char out[DK_SIG_HEX_LEN + 1];
    dk_signer_sign(s, parts, lens, 1, out);
    cr_assert_str_eq(out, FOX_SIG);
    dk_signer_destroy(&s);
    cr_assert_null(s);
}

/* Finding 6 of issue 11: other hmac-* schemes, checked against Python's
 * hmac.new(b"key", FOX, hashlib.sha512 / hashlib.sha3_256). */
Test(sign, other_digests_match_python_hmac)
{
    static const struct {
        const char *digest, *hex;
    } cases[] = {
        {"sha512", "b42af09057bac1e2d41708e48a902e09b5ff7f12ab428a4fe86653c73dd248fb"
                   "82f948a549f7b791a5b41915ee4d1ec3935357e4e2317250d0372afa2ebeeb3a"},
        {"sha3_256", "8c6e0683409427f8931711b10ca92a506eb1fafa48fadd66d76126f47ac2c333"},
        {"SHA256", FOX_SIG},
    };
    const void *parts[1] = {"The quick brown fox jumps over the lazy dog"};
    size_t lens[1] = {strlen(parts[0])};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dk_signer_t *s = dk_signer_new_digest(cases[i].digest, "key", 3);
        cr_assert_not_null(s, "%s", cases[i].digest);
        cr_assert_eq(dk_signer_hex_len(s), strlen(cases[i].hex));
        char out[DK_SIG_HEX_MAX + 1];
        dk_signer_sign(s, parts, lens, 1, out);
        cr_assert_str_eq(out, cases[i].hex, "%s", cases[i].digest);
        cr_assert(dk_signer_verify(s, parts, lens, 1, out, strlen(out)));
        cr_assert_not(dk_signer_verify(s, parts, lens, 1, FOX_SIG, DK_SIG_HEX_LEN) &&
                      strcmp(cases[i].hex, FOX_SIG) != 0);
        dk_signer_destroy(&s);
    }
    cr_assert_null(dk_signer_new_digest("nosuch", "key", 3));
    cr_assert_null(dk_signer_new_digest("shake256", "key", 3));
}

Test(decode, accepts_a_message_signed_with_hmac_sha512)
{
    dk_signer_t *s512 = dk_signer_new_digest("sha512", KEY, strlen(KEY));
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, s512, HEADER, "{}", "{}", "{}");
    cr_assert_eq(fr.len[1], 128);
    dk_msg_t *msg = decode(s512, replay, &fr, err, sizeof err);
    cr_assert_not_null(msg, "%s", err);
    dk_msg_destroy(&msg);
    /* Replayed: the 128-digit signature was recorded (as its digest). */
    cr_assert_null(decode(s512, replay, &fr, err, sizeof err));
    /* A SHA-256 signature is malformed for this session. */
    frames_t fr2 = {0};
    push_msg(&fr2, signer, HEADER, "{}", "{}", "{\"x\":1}");
    cr_assert_null(decode(s512, replay, &fr2, err, sizeof err));
    cr_assert_not_null(strstr(err, "expected 128 lowercase hex digits of HMAC-sha512"), "%s", err);
    dk_signer_destroy(&s512);
}

Test(sign, covers_the_four_parts_concatenated_in_order)
{
    const void *parts[4] = {HEADER, "{}", "{}", "{}"};
    size_t lens[4] = {strlen(HEADER), 2, 2, 2};
    char out[DK_SIG_HEX_LEN + 1];
    dk_signer_sign(signer, parts, lens, 4, out);
    cr_assert_str_eq(out, HEADER_SIG);
}

Test(sign, round_trips_through_verify)
{
    const void *parts[4] = {HEADER, "{}", "{}", "{\"a\":1}"};
    size_t lens[4] = {strlen(HEADER), 2, 2, 7};
    char out[DK_SIG_HEX_LEN + 1];
    dk_signer_sign(signer, parts, lens, 4, out);
    cr_assert(dk_signer_verify(signer, parts, lens, 4, out, strlen(out)));
}

Test(sign, verify_refuses_a_tampered_part)
{
    const void *parts[4] = {HEADER, "{}", "{}", "{}"};
    size_t lens[4] = {strlen(HEADER), 2, 2, 2};
    parts[3] = "{ }";
    lens[3] = 3;
    cr_assert_not(dk_signer_verify(signer, parts, lens, 4, HEADER_SIG, DK_SIG_HEX_LEN));
}

Test(sign, verify_refuses_a_signature_made_with_another_key)
{
    dk_signer_t *other = dk_signer_new("other-key", 9);
    const void *parts[4] = {HEADER, "{}", "{}", "{}"};
    size_t lens[4] = {strlen(HEADER), 2, 2, 2};
    cr_assert_not(dk_signer_verify(other, parts, lens, 4, HEADER_SIG, DK_SIG_HEX_LEN));
    dk_signer_destroy(&other);
}

Test(sign, verify_refuses_a_truncated_or_uppercase_signature)
{
    const void *parts[4] = {HEADER, "{}", "{}", "{}"};
    size_t lens[4] = {strlen(HEADER), 2, 2, 2};
    char upper[DK_SIG_HEX_LEN + 1];
    for (int i = 0; i <= DK_SIG_HEX_LEN; i++)
        upper[i] = (char) (HEADER_SIG[i] >= 'a' ? HEADER_SIG[i] - 32 : HEADER_SIG[i]);
    cr_assert_not(dk_signer_verify(signer, parts, lens, 4, HEADER_SIG, DK_SIG_HEX_LEN - 1));
    cr_assert_not(dk_signer_verify(signer, parts, lens, 4, upper, DK_SIG_HEX_LEN));
    cr_assert_not(dk_signer_verify(signer, parts, lens, 4, "", 0));
}

Test(sign, empty_key_disables_signing)
{
    dk_signer_t *s = dk_signer_new("", 0);
    const void *parts[1] = {"x"};
    size_t lens[1] = {1};
    char out[DK_SIG_HEX_LEN + 1] = "garbage";
    cr_assert_not(dk_signer_enabled(s));
    cr_assert(dk_signer_enabled(signer));
    dk_signer_sign(s, parts, lens, 1, out);
    cr_assert_str_eq(out, "");
    cr_assert(dk_signer_verify(s, parts, lens, 1, "anything", 8));
    dk_signer_destroy(&s);
}

/* ---- replay guard ---- */

Test(replay, refuses_a_signature_seen_before)
{
    cr_assert(dk_replay_check_and_add(replay, HEADER_SIG, DK_SIG_HEX_LEN));
    cr_assert_not(dk_replay_check_and_add(replay, HEADER_SIG, DK_SIG_HEX_LEN));
    cr_assert(dk_replay_check_and_add(replay, FOX_SIG, DK_SIG_HEX_LEN));
}

Test(replay, forgets_the_oldest_signature_once_full)
{
    dk_replay_t *r = dk_replay_new(3);
    cr_assert(dk_replay_check_and_add(r, "a", 1));
    cr_assert(dk_replay_check_and_add(r, "b", 1));
    cr_assert(dk_replay_check_and_add(r, "c", 1));
    cr_assert(dk_replay_check_and_add(r, "d", 1));     /* evicts a */
    cr_assert_not(dk_replay_check_and_add(r, "b", 1));
    cr_assert_not(dk_replay_check_and_add(r, "c", 1));
    cr_assert_not(dk_replay_check_and_add(r, "d", 1));
    cr_assert(dk_replay_check_and_add(r, "a", 1));     /* new again; evicts b */
    cr_assert(dk_replay_check_and_add(r, "b", 1));     /* evicts c */
    cr_assert_not(dk_replay_check_and_add(r, "d", 1));
    cr_assert_not(dk_replay_check_and_add(r, "a", 1));
    dk_replay_destroy(&r);
    cr_assert_null(r);
}

Test(replay, keeps_exactly_the_last_capacity_signatures)
{
    enum { CAP = 1000, TOTAL = 5000 };
    dk_replay_t *r = dk_replay_new(CAP);
    char sig[DK_SIG_HEX_LEN + 1];
    for (int i = 0; i < TOTAL; i++) {
        snprintf(sig, sizeof sig, "%064d", i);
        cr_assert(dk_replay_check_and_add(r, sig, DK_SIG_HEX_LEN), "sig %d", i);
    }
    for (int i = TOTAL - CAP; i < TOTAL; i++) {
        snprintf(sig, sizeof sig, "%064d", i);
        cr_assert_not(dk_replay_check_and_add(r, sig, DK_SIG_HEX_LEN), "sig %d", i);
    }
    snprintf(sig, sizeof sig, "%064d", TOTAL - CAP - 1);
    cr_assert(dk_replay_check_and_add(r, sig, DK_SIG_HEX_LEN));
    dk_replay_destroy(&r);
}

Test(replay, tells_long_signatures_apart)
{
    char a[200], b[200];
    memset(a, 'x', sizeof a);
    memcpy(b, a, sizeof b);
    b[199] = 'y';
    cr_assert(dk_replay_check_and_add(replay, a, sizeof a));
    cr_assert(dk_replay_check_and_add(replay, b, sizeof b));
    cr_assert_not(dk_replay_check_and_add(replay, a, sizeof a));
}

Test(replay, refuses_a_capacity_of_zero)
{
    cr_assert_null(dk_replay_new(0));
}

/* ---- decoding ---- */

Test(decode, accepts_a_correctly_signed_message)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    dk_msg_t *msg = decode(signer, replay, &fr, err, sizeof err);
    cr_assert_not_null(msg, "%s", err);
    cr_assert_str_eq(msg->msg_type, "kernel_info_request");
    cr_assert_str_eq(json_string_value(json_object_get(msg->header, "msg_id")), "1");
    cr_assert(json_is_object(msg->parent));
    cr_assert_eq(json_object_size(msg->parent), 0);
    cr_assert(json_is_object(msg->metadata));
    cr_assert(json_is_object(msg->content));
    cr_assert_eq(msg->n_idents, 0);
    cr_assert_eq(msg->n_buffers, 0);
    dk_msg_destroy(&msg);
    cr_assert_null(msg);
}

Test(decode, refuses_a_tampered_frame)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{\"code\":\"1\"}");
    fr.data[fr.n - 1] = "{\"code\":\"2\"}";
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "invalid signature"), "%s", err);
}

Test(decode, refuses_a_wrong_signature)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    fr.data[1] = FOX_SIG;
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "invalid signature"), "%s", err);
}

Test(decode, refuses_a_non_hex_signature)
{
    frames_t fr = {0};
    char err[256];
    char bad[] = HEADER_SIG;
    bad[10] = 'g';
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    fr.data[1] = bad;
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "malformed signature"), "%s", err);
}

Test(decode, refuses_a_signature_of_the_wrong_length)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    fr.len[1] = DK_SIG_HEX_LEN - 2;
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "malformed signature"), "%s", err);
    fr.len[1] = 0;
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "malformed signature"), "%s", err);
}

Test(decode, refuses_a_replayed_message)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    dk_msg_t *msg = decode(signer, replay, &fr, err, sizeof err);
    cr_assert_not_null(msg, "%s", err);
    dk_msg_destroy(&msg);
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "duplicate signature"), "%s", err);
}

Test(decode, does_not_record_a_message_that_fails_verification)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    const char *forged = "{\"forged\":true}";
    fr.data[fr.n - 1] = forged;
    fr.len[fr.n - 1] = strlen(forged);
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    /* The genuine message with that signature must still get through. */
    fr.data[fr.n - 1] = "{}";
    fr.len[fr.n - 1] = 2;
    dk_msg_t *msg = decode(signer, replay, &fr, err, sizeof err);
    cr_assert_not_null(msg, "%s", err);
    dk_msg_destroy(&msg);
}

Test(decode, without_a_replay_guard_accepts_repeats)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    for (int i = 0; i < 2; i++) {
        dk_msg_t *msg = decode(signer, NULL, &fr, err, sizeof err);
        cr_assert_not_null(msg, "%s", err);
        dk_msg_destroy(&msg);
    }
}

Test(decode, unsigned_session_accepts_empty_signatures_and_repeats)
{
    dk_signer_t *none = dk_signer_new(NULL, 0);
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, none, HEADER, "{}", "{}", "{}");
    cr_assert_eq(fr.len[1], 0);
    for (int i = 0; i < 3; i++) {
        dk_msg_t *msg = decode(none, replay, &fr, err, sizeof err);
        cr_assert_not_null(msg, "attempt %d: %s", i, err);
        dk_msg_destroy(&msg);
    }
    dk_signer_destroy(&none);
}

Test(decode, refuses_a_message_without_delimiter)
{
    frames_t fr = {0};
    char err[256];
    push_str(&fr, "identity");
    push_str(&fr, HEADER_SIG);
    push_str(&fr, HEADER);
    push_str(&fr, "{}");
    push_str(&fr, "{}");
    push_str(&fr, "{}");
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "delimiter"), "%s", err);
    fr.n = 0;
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "delimiter"), "%s", err);
}

Test(decode, refuses_fewer_than_five_frames_after_delimiter)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    fr.n--;     /* drop content */
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "expected at least 5"), "%s", err);
}

Test(decode, refuses_invalid_json)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, HEADER, "{}", "{}", "{\"code\": ");
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "content frame is not valid JSON"), "%s", err);
}

Test(decode, refuses_json_that_is_not_an_object)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, "[\"msg_id\", \"msg_type\"]", "{}", "{}", "{}");
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "header frame is an array, expected a JSON object"), "%s",
                       err);

    frames_t fr2 = {0};
    push_msg(&fr2, signer, HEADER, "null", "{}", "{}");
    cr_assert_null(decode(signer, replay, &fr2, err, sizeof err));
    cr_assert_not_null(strstr(err, "parent_header frame is null"), "%s", err);
}

Test(decode, refuses_a_header_without_msg_type)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, "{\"msg_id\":\"1\"}", "{}", "{}", "{}");
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "msg_type"), "%s", err);

    frames_t fr2 = {0};
    push_msg(&fr2, signer, "{\"msg_id\":\"1\",\"msg_type\":7}", "{}", "{}", "{}");
    cr_assert_null(decode(signer, replay, &fr2, err, sizeof err));
    cr_assert_not_null(strstr(err, "msg_type"), "%s", err);
}

Test(decode, refuses_a_header_without_msg_id)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, "{\"msg_type\":\"execute_request\"}", "{}", "{}", "{}");
    cr_assert_null(decode(signer, replay, &fr, err, sizeof err));
    cr_assert_not_null(strstr(err, "msg_id"), "%s", err);
}

Test(decode, refuses_header_fields_of_another_type)
{
    static const char *const headers[] = {
        "{\"msg_id\":\"1\",\"msg_type\":\"execute_request\",\"session\":5}",
        "{\"msg_id\":\"1\",\"msg_type\":\"execute_request\",\"username\":null}",
        "{\"msg_id\":\"1\",\"msg_type\":\"execute_request\",\"date\":[]}",
        "{\"msg_id\":\"1\",\"msg_type\":\"execute_request\",\"version\":5.3}",
    };
    static const char *const names[] = {"session", "username", "date", "version"};
    for (size_t i = 0; i < 4; i++) {
        frames_t fr = {0};
        char err[256];
        push_msg(&fr, signer, headers[i], "{}", "{}", "{}");
        cr_assert_null(decode(signer, replay, &fr, err, sizeof err), "%s", headers[i]);
        cr_assert_not_null(strstr(err, names[i]), "%s", err);
        cr_assert_not_null(strstr(err, "expected a string"), "%s", err);
    }
}

Test(decode, accepts_a_header_with_only_msg_id_and_msg_type_and_unknown_fields)
{
    frames_t fr = {0};
    char err[256];
    push_msg(&fr, signer, "{\"msg_id\":\"1\",\"msg_type\":\"execute_request\",\"x\":[1,null]}",
             "{}", "{}", "{}");
    dk_msg_t *msg = decode(signer, replay, &fr, err, sizeof err);
    cr_assert_not_null(msg, "%s", err);
    dk_msg_destroy(&msg);
}

Test(decode, preserves_identities_and_buffers)
{
    frames_t fr = {0};
    char err[256];
    const char bin[] = {0, 1, 2, (char) 0xff};
    push_str(&fr, "router-id-1");
    push(&fr, "\0id2", 4);
    push_msg(&fr, signer, HEADER, "{}", "{}", "{}");
    push(&fr, bin, sizeof bin);
    push(&fr, "", 0);
    dk_msg_t *msg = decode(signer, replay, &fr, err, sizeof err);
    cr_assert_not_null(msg, "%s", err);
    cr_assert_eq(msg->n_idents, 2);
    cr_assert(zframe_streq(msg->idents[0], "router-id-1"));
    cr_assert_eq(zframe_size(msg->idents[1]), 4);
    cr_assert_eq(memcmp(zframe_data(msg->idents[1]), "\0id2", 4), 0);
    cr_assert_eq(msg->n_buffers, 2);
    cr_assert_eq(zframe_size(msg->buffers[0]), sizeof bin);
    cr_assert_eq(memcmp(zframe_data(msg->buffers[0]), bin, sizeof bin), 0);
    cr_assert_eq(zframe_size(msg->buffers[1]), 0);
    dk_msg_destroy(&msg);
}

Test(decode, reads_a_received_zmsg_without_consuming_it)
{
    zmsg_t *raw = zmsg_new();
    const void *parts[4] = {HEADER, "{}", "{}", "{}"};
    size_t lens[4] = {strlen(HEADER), 2, 2, 2};
    char sig[DK_SIG_HEX_LEN + 1];
    dk_signer_sign(signer, parts, lens, 4, sig);
    zmsg_addstr(raw, "id");
    zmsg_addstr(raw, DK_DELIM);
    zmsg_addstr(raw, sig);
    for (int i = 0; i < 4; i++)
        zmsg_addmem(raw, parts[i], lens[i]);
    char err[256] = "";
    dk_msg_t *msg = dk_wire_decode_zmsg(signer, replay, raw, err, sizeof err);
    cr_assert_not_null(msg, "%s", err);
    cr_assert_eq(msg->n_idents, 1);
    cr_assert_eq(zmsg_size(raw), 7);
    dk_msg_destroy(&msg);
    zmsg_destroy(&raw);
}

Test(decode, survives_arbitrary_frames)
{
    /* A small in-process fuzz: random frame counts and bytes, sometimes with a
     * delimiter, in signed and unsigned sessions. Nothing may crash or leak. */
    dk_signer_t *none = dk_signer_new(NULL, 0);
    const char *pool[] = {DK_DELIM, "{}", "[]", "{", "null", HEADER, HEADER_SIG, "", "\xff\xfe",
                          "{\"msg_id\":1}", "{\"msg_id\":\"x\",\"msg_type\":\"y\"}"};
    const size_t n_pool = sizeof pool / sizeof pool[0];
    unsigned int seed = 12345;
    char err[256];
    for (int round = 0; round < 20000; round++) {
        frames_t fr = {0};
        size_t n = (size_t) (rand_r(&seed) % 12);
        for (size_t i = 0; i < n; i++) {
            const char *s = pool[rand_r(&seed) % n_pool];
            size_t len = strlen(s);
            if (len && rand_r(&seed) % 4 == 0)
                len = (size_t) rand_r(&seed) % len;     /* truncate */
            push(&fr, s, len);
        }
        dk_msg_t *msg = decode(round % 2 ? signer : none, replay, &fr, err, sizeof err);
        if (!msg)
            cr_assert_neq(err[0], '\0', "a refusal must give a reason");
        dk_msg_destroy(&msg);
    }
    dk_signer_destroy(&none);
}

/* ---- encoding ---- */

Test(encode, round_trips_through_decode)
{
    json_t *header = dk_header_new("execute_reply", "sess-1", "alice");
    json_t *parent = json_pack("{s:s, s:s}", "msg_id", "p1", "msg_type", "execute_request");
    json_t *content = json_pack("{s:s, s:i, s:s}", "status", "ok", "execution_count", 3,
                                "text", "h\xc3\xa9llo \"quoted\"\n");
    zframe_t *ident = zframe_from("client");
    zframe_t *buffer = zframe_new("\x00\x01", 2);
    zmsg_t *raw = dk_wire_encode(signer, &ident, 1, header, parent, NULL, content, &buffer, 1);
    cr_assert_not_null(raw);
    cr_assert_eq(zmsg_size(raw), 1 + 1 + 1 + 4 + 1);

    char err[256] = "";
    dk_msg_t *msg = dk_wire_decode_zmsg(signer, replay, raw, err, sizeof err);
    cr_assert_not_null(msg, "%s", err);
    cr_assert(json_equal(msg->header, header));
    cr_assert(json_equal(msg->parent, parent));
    cr_assert_eq(json_object_size(msg->metadata), 0);
    cr_assert(json_equal(msg->content, content));
    cr_assert_str_eq(msg->msg_type, "execute_reply");
    cr_assert(zframe_eq(msg->idents[0], ident));
    cr_assert(zframe_eq(msg->buffers[0], buffer));

    dk_msg_destroy(&msg);
    zmsg_destroy(&raw);
    zframe_destroy(&ident);
    zframe_destroy(&buffer);
    json_decref(header);
    json_decref(parent);
    json_decref(content);
}

Test(encode, lays_out_frames_as_the_protocol_says)
{
    const char *parts[4] = {HEADER, "{}", "{}", "{}"};
    size_t lens[4] = {strlen(HEADER), 2, 2, 2};
    zmsg_t *raw = dk_wire_encode_raw(signer, NULL, 0, parts, lens, NULL, 0);
    cr_assert_not_null(raw);
    cr_assert_eq(zmsg_size(raw), 6);
    char *delim = zmsg_popstr(raw);
    char *sig = zmsg_popstr(raw);
    char *header = zmsg_popstr(raw);
    cr_assert_str_eq(delim, DK_DELIM);
    cr_assert_str_eq(sig, HEADER_SIG);
    cr_assert_str_eq(header, HEADER);
    free(delim);
    free(sig);
    free(header);
    zmsg_destroy(&raw);
}

Test(encode, leaves_the_signature_empty_without_a_key)
{
    dk_signer_t *none = dk_signer_new("", 0);
    const char *parts[4] = {HEADER, "{}", "{}", "{}"};
    size_t lens[4] = {strlen(HEADER), 2, 2, 2};
    zmsg_t *raw = dk_wire_encode_raw(none, NULL, 0, parts, lens, NULL, 0);
    cr_assert_not_null(raw);
    zframe_t *delim = zmsg_first(raw);
    zframe_t *sig = zmsg_next(raw);
    cr_assert(zframe_streq(delim, DK_DELIM));
    cr_assert_eq(zframe_size(sig), 0);
    zmsg_destroy(&raw);
    dk_signer_destroy(&none);
}

Test(encode, refuses_parts_that_are_not_objects)
{
    json_t *header = dk_header_new("status", "s", "u");
    json_t *array = json_array();
    cr_assert_null(dk_wire_encode(signer, NULL, 0, header, NULL, NULL, array, NULL, 0));
    cr_assert_null(dk_wire_encode(signer, NULL, 0, header, NULL, NULL, NULL, NULL, 0));
    cr_assert_null(dk_wire_encode(signer, NULL, 0, array, NULL, NULL, header, NULL, 0));
    json_decref(header);
    json_decref(array);
}

/* ---- headers ---- */

static bool matches(const char *pattern, const char *text)
{
    regex_t re;
    cr_assert_eq(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    bool ok = regexec(&re, text, 0, NULL, 0) == 0;
    regfree(&re);
    return ok;
}

Test(header, carries_type_session_username_and_version_5_3)
{
    json_t *h = dk_header_new("kernel_info_reply", "session-x", "bob");
    cr_assert_not_null(h);
    cr_assert_str_eq(json_string_value(json_object_get(h, "msg_type")), "kernel_info_reply");
    cr_assert_str_eq(json_string_value(json_object_get(h, "session")), "session-x");
    cr_assert_str_eq(json_string_value(json_object_get(h, "username")), "bob");
    cr_assert_str_eq(json_string_value(json_object_get(h, "version")), "5.3");
    cr_assert_eq(json_object_size(h), 6);
    json_decref(h);
}

Test(header, msg_id_is_a_random_uuid4)
{
    json_t *a = dk_header_new("status", "s", "u");
    json_t *b = dk_header_new("status", "s", "u");
    const char *ida = json_string_value(json_object_get(a, "msg_id"));
    const char *idb = json_string_value(json_object_get(b, "msg_id"));
    const char *uuid4 = "^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$";
    cr_assert(matches(uuid4, ida), "%s", ida);
    cr_assert(matches(uuid4, idb), "%s", idb);
    cr_assert_str_neq(ida, idb);
    json_decref(a);
    json_decref(b);
}

Test(header, date_is_iso8601_utc_with_microseconds)
{
    json_t *h = dk_header_new("status", "s", "u");
    const char *date = json_string_value(json_object_get(h, "date"));
    cr_assert(matches("^[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-6][0-9]"
                      "\\.[0-9]{6}Z$", date), "%s", date);
    /* and it is now, not some other time */
    char year[8];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(year, sizeof year, "%Y", &tm);
    cr_assert_eq(strncmp(date, year, 4), 0, "%s", date);
    json_decref(h);
}

/* ---- content types ----------------------------------------------------------- */

/* dk_wire_check_content on CONTENT (JSON text) for MSG_TYPE; the reason in ERR. */
static bool check(const char *msg_type, const char *content, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *c = json_loads(content, 0, &jerr);
    cr_assert_not_null(c, "%s: %s", content, jerr.text);
    err[0] = '\0';
    bool ok = dk_wire_check_content(msg_type, c, err, errlen);
    json_decref(c);
    return ok;
}

#define EXECUTE(extra) \
    "{\"code\":\"x = 1\",\"silent\":false,\"store_history\":true,\"user_expressions\":{}," \
    "\"allow_stdin\":false,\"stop_on_error\":true" extra "}"

Test(content, accepts_the_requests_jupyter_client_sends)
{
    char err[256];
    cr_assert(check("execute_request", EXECUTE(""), err, sizeof err), "%s", err);
    cr_assert(check("execute_request", "{\"code\":\"\"}", err, sizeof err), "%s", err);
    cr_assert(check("execute_request", EXECUTE(",\"user_expressions\":{\"a\":\"1+1\"}"), err,
                    sizeof err), "%s", err);
    cr_assert(check("complete_request", "{\"code\":\"pri\",\"cursor_pos\":3}", err, sizeof err));
    cr_assert(check("complete_request", "{\"code\":\"pri\",\"cursor_pos\":null}", err,
                    sizeof err));
    cr_assert(check("inspect_request", "{\"code\":\"len\",\"cursor_pos\":3,\"detail_level\":1}",
                    err, sizeof err));
    cr_assert(check("is_complete_request", "{\"code\":\"for i in x:\"}", err, sizeof err));
    cr_assert(check("history_request", "{\"output\":false,\"raw\":true,\"hist_access_type\":"
                    "\"range\",\"session\":0,\"start\":1,\"stop\":null,\"n\":null}", err,
                    sizeof err), "%s", err);
    cr_assert(check("comm_info_request", "{}", err, sizeof err));
    cr_assert(check("comm_info_request", "{\"target_name\":null}", err, sizeof err));
    cr_assert(check("shutdown_request", "{\"restart\":true}", err, sizeof err));
    cr_assert(check("input_reply", "{\"value\":\"\"}", err, sizeof err));
    cr_assert(check("comm_open", "{\"comm_id\":\"c\",\"target_name\":\"t\",\"data\":{}}", err,
                    sizeof err));
    cr_assert(check("comm_msg", "{\"comm_id\":\"c\",\"data\":{\"x\":[1]}}", err, sizeof err));
}

Test(content, unknown_fields_and_unknown_types_pass)
{
    char err[256];
    cr_assert(check("execute_request", EXECUTE(",\"cell_id\":7,\"x\":[null]"), err, sizeof err));
    cr_assert(check("kernel_info_request", "{\"anything\":[1,2]}", err, sizeof err));
    cr_assert(check("no_such_request", "{\"code\":5}", err, sizeof err));
}

Test(content, refuses_execute_fields_of_another_type_naming_the_field)
{
    static const struct {
        const char *content, *field, *wanted;
    } cases[] = {
        {EXECUTE(",\"code\":5"), "code", "must be a string, not a number"},
        {EXECUTE(",\"code\":[\"x = 1\"]"), "code", "must be a string, not an array"},
        {EXECUTE(",\"code\":null"), "code", "must be a string, not null"},
        {EXECUTE(",\"silent\":\"yes\""), "silent", "must be a boolean, not a string"},
        {EXECUTE(",\"silent\":0"), "silent", "must be a boolean, not a number"},
        {EXECUTE(",\"store_history\":null"), "store_history", "must be a boolean"},
        {EXECUTE(",\"allow_stdin\":\"false\""), "allow_stdin", "must be a boolean"},
        {EXECUTE(",\"stop_on_error\":1"), "stop_on_error", "must be a boolean"},
        {EXECUTE(",\"user_expressions\":[\"a\"]"), "user_expressions", "an object of strings"},
        {EXECUTE(",\"user_expressions\":{\"a\":5}"), "user_expressions", "an object of strings"},
        {"{\"silent\":false}", "code", "is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256];
        cr_assert_not(check("execute_request", cases[i].content, err, sizeof err), "%s",
                      cases[i].content);
        cr_assert_not_null(strstr(err, cases[i].field), "%s", err);
        cr_assert_not_null(strstr(err, cases[i].wanted), "%s", err);
        cr_assert_eq(strncmp(err, "execute_request: ", 17), 0, "%s", err);
    }
}

Test(content, refuses_other_requests_fields_of_another_type)
{
    char err[256];
    cr_assert_not(check("complete_request", "{\"code\":\"x\",\"cursor_pos\":\"1\"}", err,
                        sizeof err));
    cr_assert_not(check("complete_request", "{\"code\":\"x\",\"cursor_pos\":1.0}", err,
                        sizeof err));
    cr_assert_not(check("inspect_request", "{\"code\":\"x\",\"detail_level\":true}", err,
                        sizeof err));
    cr_assert_not(check("is_complete_request", "{}", err, sizeof err));
    cr_assert_not(check("history_request", "{\"n\":\"10\"}", err, sizeof err));
    cr_assert_not(check("history_request", "{\"hist_access_type\":null}", err, sizeof err));
    cr_assert_not(check("comm_info_request", "{\"target_name\":[]}", err, sizeof err));
    cr_assert_not(check("shutdown_request", "{\"restart\":\"no\"}", err, sizeof err));
    cr_assert_not_null(strstr(err, "restart"), "%s", err);
    cr_assert_not(check("input_reply", "{\"value\":5}", err, sizeof err));
    cr_assert_not(check("input_reply", "{}", err, sizeof err));
    cr_assert_not(check("comm_msg", "{\"comm_id\":1,\"data\":{}}", err, sizeof err));
    cr_assert_not(check("comm_open", "{\"comm_id\":\"c\",\"data\":{}}", err, sizeof err));
}

Test(content, refuses_content_that_is_not_an_object)
{
    char err[256];
    json_t *a = json_array();
    cr_assert_not(dk_wire_check_content("execute_request", a, err, sizeof err));
    cr_assert_not(dk_wire_check_content("execute_request", NULL, err, sizeof err));
    json_decref(a);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, wire_objects_take_null)
{
    dk_msg_destroy(NULL);
    dk_msg_t *no_msg = NULL;
    dk_msg_destroy(&no_msg);
    cr_assert_null(no_msg);
    dk_replay_destroy(NULL);
    dk_replay_t *no_replay = NULL;
    dk_replay_destroy(&no_replay);
    cr_assert_null(no_replay);
    dk_signer_destroy(NULL);
    dk_signer_t *no_signer = NULL;
    dk_signer_destroy(&no_signer);
    cr_assert_null(no_signer);
}
