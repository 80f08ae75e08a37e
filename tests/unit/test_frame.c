/*
 * The back channel's frame codec (runtime/channel/dk_frame.h) pinned to its
 * wire: every frame it seals carries the MAC that OpenSSL's one-shot HMAC()
 * computes over nonce | dir | seq | body, frame after frame on one key (the
 * codec restarts one keyed context; a restart that lost the key or kept the
 * last frame's bytes would fail here); it opens only what the other side
 * sealed with the same key, nonce and count; and one fixed frame, byte for
 * byte, so that any change to the format fails (the ranks' Python
 * (_backchannel.py) and older agents speak it too).
 */
#include <criterion/criterion.h>

#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "dk_be32.h"
#include "dk_frame.h"

static const unsigned char KEY[32] = "distkernel frame codec test key!";
static unsigned char NONCE[32];

static void init_nonce(void)
{
    for (int i = 0; i < 32; i++)
        NONCE[i] = (unsigned char) (0x40 + i);
}

/* The MAC of a frame, computed apart from the codec: one-shot HMAC-SHA256
 * over the bytes the wire says are authenticated. */
static void reference_mac(const unsigned char *key, const unsigned char *nonce, unsigned char dir,
                          uint32_t seq, const unsigned char *body, size_t body_len,
                          unsigned char out[32])
{
    unsigned char msg[32 + 1 + 4 + 256];
    cr_assert_leq(body_len, 256);
    memcpy(msg, nonce, 32);
    msg[32] = dir;
    dk_put_be32(msg + 33, seq);
    memcpy(msg + 37, body, body_len);
    unsigned int n = 0;
    cr_assert_not_null(HMAC(EVP_sha256(), key, 32, msg, 37 + body_len, out, &n));
    cr_assert_eq(n, 32);
}

static void from_hex(const char *hex, unsigned char *out, size_t n)
{
    cr_assert_eq(strlen(hex), 2 * n);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        cr_assert_eq(sscanf(hex + 2 * i, "%2x", &v), 1);
        out[i] = (unsigned char) v;
    }
}

TestSuite(frame, .init = init_nonce);

Test(frame, every_sealed_frame_carries_the_reference_hmac)
{
    dk_frame_key_t *key = dk_frame_key_new(KEY);
    cr_assert_not_null(key);
    dk_frame_side_t rank;
    dk_frame_side_init(&rank, key, NONCE, DK_FRAME_DIR_TO_RUNTIME);
    /* Many frames on one key, of sizes around SHA-256's 64-byte block, so a
     * restart that carried anything over from the frame before shows. */
    for (uint32_t i = 0; i < 40; i++) {
        unsigned char payload[200], out[DK_FRAME_HEAD + 200], want[32];
        size_t len = (i * 37) % 200;
        for (size_t j = 0; j < len; j++)
            payload[j] = (unsigned char) (i + j);
        size_t n = dk_frame_seal(&rank, DK_FRAME_OUTPUT, 5, payload, len, out);
        cr_assert_eq(n, DK_FRAME_HEAD + len);
        cr_expect_eq(dk_get_be32(out), 32 + 5 + len);
        cr_expect_eq(out[36], DK_FRAME_OUTPUT);
        cr_expect_eq(dk_get_be32(out + 37), 5);
        cr_expect_eq(memcmp(out + DK_FRAME_HEAD, payload, len), 0);
        reference_mac(KEY, NONCE, 'R', i, out + 36, 5 + len, want);
        cr_expect_eq(memcmp(out + 4, want, 32), 0, "frame %u's MAC", i);
    }
    cr_expect_eq(rank.seq_out, 40);
    dk_frame_key_destroy(&key);
    cr_expect_null(key);
}

Test(frame, a_body_sealed_in_two_pieces_is_the_same_frame)
{
    dk_frame_key_t *key = dk_frame_key_new(KEY);
    dk_frame_side_t a, b;
    dk_frame_side_init(&a, key, NONCE, DK_FRAME_DIR_TO_RANK);
    dk_frame_side_init(&b, key, NONCE, DK_FRAME_DIR_TO_RANK);
    unsigned char whole[DK_FRAME_HEAD + 100], head[4 + 32 + 9], body_head[9], tail[91];
    memset(tail, 'x', sizeof tail);
    body_head[0] = DK_FRAME_TASK;
    dk_put_be32(body_head + 1, 2);
    dk_put_be32(body_head + 5, 9);      /* the round */
    cr_assert_eq(dk_frame_seal_head(&a, body_head, 9, tail, sizeof tail, head), sizeof head);
    memcpy(whole + DK_FRAME_HEAD, body_head + 5, 4);
    memcpy(whole + DK_FRAME_HEAD + 4, tail, sizeof tail);
    cr_assert_eq(dk_frame_seal(&b, DK_FRAME_TASK, 2, whole + DK_FRAME_HEAD, 95, whole),
                 DK_FRAME_HEAD + 95);
    cr_expect_eq(memcmp(head, whole, sizeof head), 0);
    dk_frame_key_destroy(&key);
}

Test(frame, a_frame_opens_with_its_key_nonce_direction_and_count_only)
{
    dk_frame_key_t *key = dk_frame_key_new(KEY);
    unsigned char other_key_bytes[32];
    memcpy(other_key_bytes, KEY, 32);
    other_key_bytes[31] ^= 1;
    dk_frame_key_t *other_key = dk_frame_key_new(other_key_bytes);
    unsigned char other_nonce[32];
    memcpy(other_nonce, NONCE, 32);
    other_nonce[0] ^= 1;

    dk_frame_side_t rank, kernel;
    dk_frame_side_init(&rank, key, NONCE, DK_FRAME_DIR_TO_RUNTIME);
    dk_frame_side_init(&kernel, key, NONCE, DK_FRAME_DIR_TO_RANK);
    cr_expect_eq(kernel.dir_in, 'R');
    unsigned char f0[DK_FRAME_HEAD + 4], f1[DK_FRAME_HEAD + 4];
    size_t n0 = dk_frame_seal(&rank, DK_FRAME_PORT, 0, "\0\0\x75\x30", 4, f0);
    size_t n1 = dk_frame_seal(&rank, DK_FRAME_PING, 0, NULL, 0, f1);
    cr_assert(n0 > 0 && n1 > 0);

    dk_frame_msg_t m;
    /* Out of order: frame 1 first. */
    cr_expect_eq(dk_frame_open(&kernel, f1, n1, 64, &m, NULL, NULL), -1);
    /* Another key, another nonce, the same direction (sent back to its writer). */
    dk_frame_side_t wrong;
    dk_frame_side_init(&wrong, other_key, NONCE, DK_FRAME_DIR_TO_RANK);
    cr_expect_eq(dk_frame_open(&wrong, f0, n0, 64, &m, NULL, NULL), -1);
    dk_frame_side_init(&wrong, key, other_nonce, DK_FRAME_DIR_TO_RANK);
    cr_expect_eq(dk_frame_open(&wrong, f0, n0, 64, &m, NULL, NULL), -1);
    dk_frame_side_init(&wrong, key, NONCE, DK_FRAME_DIR_TO_RUNTIME);
    cr_expect_eq(dk_frame_open(&wrong, f0, n0, 64, &m, NULL, NULL), -1);
    /* One flipped bit of the body. */
    unsigned char bad[sizeof f0];
    memcpy(bad, f0, n0);
    bad[n0 - 1] ^= 0x80;
    cr_expect_eq(dk_frame_open(&kernel, bad, n0, 64, &m, NULL, NULL), -1);

    /* Failures counted nothing: in order, both open. */
    cr_assert_eq(dk_frame_open(&kernel, f0, n0, 64, &m, NULL, NULL), (long) n0);
    cr_expect_eq(m.type, DK_FRAME_PORT);
    cr_expect_eq(m.id, 0);
    cr_assert_eq(m.len, 4);
    cr_expect_eq(dk_get_be32(m.payload), 30000);
    cr_expect_eq(dk_frame_open(&kernel, f1, n1, 64, &m, NULL, NULL), (long) n1);
    cr_expect_eq(m.type, DK_FRAME_PING);
    cr_expect_eq(m.len, 0);
    /* Replayed. */
    const char *why = NULL;
    cr_expect_eq(dk_frame_open(&kernel, f1, n1, 64, &m, NULL, &why), -1);
    cr_expect(strstr(why, "did not verify"), "%s", why);
    cr_expect_eq(kernel.seq_in, 2);
    dk_frame_key_destroy(&key);
    dk_frame_key_destroy(&other_key);
}

Test(frame, verify_takes_the_frame_after_its_length)
{
    dk_frame_key_t *key = dk_frame_key_new(KEY);
    dk_frame_side_t agent, kernel;
    dk_frame_side_init(&agent, key, NONCE, DK_FRAME_DIR_TO_RUNTIME);
    dk_frame_side_init(&kernel, key, NONCE, DK_FRAME_DIR_TO_RANK);
    unsigned char f[DK_FRAME_HEAD + 8];
    size_t n = dk_frame_seal(&agent, DK_FRAME_EXIT, 3, "\0\0\0\1\0\0\0\0", 8, f);
    cr_expect_not(dk_frame_verify(&kernel, f + 4, DK_FRAME_MAC_LEN - 1));
    cr_expect(dk_frame_verify(&kernel, f + 4, n - 4));
    cr_expect_not(dk_frame_verify(&kernel, f + 4, n - 4));     /* the count moved on */
    dk_frame_key_destroy(&key);
}

Test(frame, open_waits_for_a_whole_frame_and_refuses_a_size_out_of_bounds)
{
    dk_frame_key_t *key = dk_frame_key_new(KEY);
    dk_frame_side_t agent, kernel;
    dk_frame_side_init(&agent, key, NONCE, DK_FRAME_DIR_TO_RUNTIME);
    dk_frame_side_init(&kernel, key, NONCE, DK_FRAME_DIR_TO_RANK);
    unsigned char f[DK_FRAME_HEAD + 10];
    size_t n = dk_frame_seal(&agent, DK_FRAME_STACKS, 1, "0123456789", 10, f);
    dk_frame_msg_t m;
    size_t need = 0;
    const char *why = NULL;
    cr_expect_eq(dk_frame_open(&kernel, f, 3, 10, &m, &need, &why), 0);
    cr_expect_eq(need, 4);
    cr_expect_eq(dk_frame_open(&kernel, f, n - 1, 10, &m, &need, &why), 0);
    cr_expect_eq(need, n);
    cr_expect_eq(dk_frame_open(&kernel, f, n, 9, &m, &need, &why), -1, "over MAX_PAYLOAD");
    cr_expect_str_eq(why, "a message's size is outside the protocol's limits");
    unsigned char tiny[4];
    dk_put_be32(tiny, DK_FRAME_MAC_LEN + 4);
    cr_expect_eq(dk_frame_open(&kernel, tiny, 4, 10, &m, NULL, &why), -1, "no room for type, id");
    /* A length past what this side takes is refused from its 4 bytes, before
     * anything waits for (or is allocated to) the rest. */
    unsigned char big[4];
    dk_put_be32(big, DK_FRAME_MAC_LEN + DK_FRAME_BODY_HEAD + 11);
    cr_expect_eq(dk_frame_open(&kernel, big, 4, 10, &m, &need, &why), -1, "refused before whole");
    cr_expect_eq(dk_frame_open(&kernel, f, n, 10, &m, NULL, &why), (long) n);
    cr_expect_eq(m.len, 10);
    dk_frame_key_destroy(&key);
}

/* One frame, byte for byte: a rank's OUTPUT (fd 1, caught up, "hello\n") for
 * rank 3 as its 8th frame (seq 7). The expected bytes were computed apart
 * from distkernel (Python's hmac over the same fields). If this fails, the
 * wire changed: every other side (ranks' Python, agents, older kernels) with
 * it, or not at all. */
Test(frame, a_known_frame_is_byte_for_byte)
{
    static const char want_hex[] =
        "0000002d"
        "fbc071e74f814bb38a59a91d3c2261e39b69f7921468c83df790f22b88c68502"
        "06" "00000003" "0101" "68656c6c6f0a";
    unsigned char want[49];
    from_hex(want_hex, want, sizeof want);
    dk_frame_key_t *key = dk_frame_key_new(KEY);
    dk_frame_side_t rank;
    dk_frame_side_init(&rank, key, NONCE, DK_FRAME_DIR_TO_RUNTIME);
    rank.seq_out = 7;
    unsigned char out[sizeof want];
    cr_assert_eq(dk_frame_seal(&rank, DK_FRAME_OUTPUT, 3, "\x01\x01hello\n", 8, out), sizeof want);
    cr_expect_eq(memcmp(out, want, sizeof want), 0);

    dk_frame_side_t kernel;
    dk_frame_side_init(&kernel, key, NONCE, DK_FRAME_DIR_TO_RANK);
    kernel.seq_in = 7;
    dk_frame_msg_t m;
    cr_expect_eq(dk_frame_open(&kernel, want, sizeof want, 64, &m, NULL, NULL), (long) sizeof want);
    dk_frame_key_destroy(&key);
}

Test(frame, the_key_goes_to_hex_and_back)
{
    char hex[2 * DK_FRAME_KEY_LEN + 1];
    dk_frame_key_to_hex(KEY, hex);
    cr_expect_str_eq(hex, "646973746b65726e656c206672616d6520636f6465632074657374206b657921");
    unsigned char back[32];
    cr_assert_eq(dk_frame_key_from_hex(hex, back), 0);
    cr_expect_eq(memcmp(back, KEY, 32), 0);
    cr_expect_eq(dk_frame_key_from_hex("6469", back), -1);
    cr_expect_eq(dk_frame_key_from_hex(NULL, back), -1);
    hex[5] = 'g';
    cr_expect_eq(dk_frame_key_from_hex(hex, back), -1);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, frame_key_takes_null)
{
    dk_frame_key_destroy(NULL);
    dk_frame_key_t *none = NULL;
    dk_frame_key_destroy(&none);
    cr_assert_null(none);
}
