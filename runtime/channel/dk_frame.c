/*
 * dk_frame: the back channel's frames, sealed and opened with a key set up
 * once. See the header.
 *
 * Each frame used to pay for a fresh EVP_MAC_CTX and EVP_MAC_init with the
 * key: a context allocation, the digest's fetch, and the key's two SHA-256
 * blocks (inner and outer pad) before its own bytes. At a few hundred ranks
 * each sending a PING a second and their output, that was most of the
 * kernel's per-frame CPU. Here the key's context is made once; a frame
 * restarts it with EVP_MAC_init(ctx, NULL, 0, NULL), which OpenSSL 3's HMAC
 * takes as starting over from the key already set (it keeps the padded
 * key's digest states in the context; the 3.0 series has done so reliably
 * since the fix for openssl/openssl#17811). That is also cheaper than
 * EVP_MAC_CTX_dup of a keyed context per frame, which allocates a whole
 * HMAC context each time (bench/README.md, frame_bench). The one context is
 * why a key is for one thread at a time. tests/unit/test_frame.c checks
 * every MAC against OpenSSL's one-shot HMAC(), frame after frame, so an
 * OpenSSL that did not keep the key would fail there, not on a cluster.
 */
#include "dk_frame.h"
#include "dk_be32.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

struct dk_frame_key_t {
    EVP_MAC_CTX *ctx;       /* keyed once; restarted for each MAC */
};

dk_frame_key_t *dk_frame_key_new(const unsigned char *key)
{
    dk_frame_key_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    self->ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    EVP_MAC_free(mac);      /* the context holds its own reference */
    if (!self->ctx || !EVP_MAC_init(self->ctx, key, DK_FRAME_KEY_LEN, params))
        dk_frame_key_destroy(&self);
    return self;
}

void dk_frame_key_destroy(dk_frame_key_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    EVP_MAC_CTX_free((*self_p)->ctx);     /* OpenSSL wipes its copy of the key */
    free(*self_p);
    *self_p = NULL;
}

bool dk_frame_mac(dk_frame_key_t *self, const unsigned char *nonce, unsigned char dir,
                  uint32_t seq, const void *head, size_t head_len, const void *tail,
                  size_t tail_len, unsigned char out[DK_FRAME_MAC_LEN])
{
    unsigned char seq_be[4];
    dk_put_be32(seq_be, seq);
    size_t out_len = 0;
    return EVP_MAC_init(self->ctx, NULL, 0, NULL) &&
           EVP_MAC_update(self->ctx, nonce, DK_FRAME_NONCE_LEN) &&
           EVP_MAC_update(self->ctx, &dir, 1) && EVP_MAC_update(self->ctx, seq_be, 4) &&
           EVP_MAC_update(self->ctx, head, head_len) &&
           (tail_len == 0 || EVP_MAC_update(self->ctx, tail, tail_len)) &&
           EVP_MAC_final(self->ctx, out, &out_len, DK_FRAME_MAC_LEN) &&
           out_len == DK_FRAME_MAC_LEN;
}

int dk_frame_key_from_hex(const char *hex, unsigned char key[DK_FRAME_KEY_LEN])
{
    if (!hex || strlen(hex) != 2 * DK_FRAME_KEY_LEN)
        return -1;
    for (size_t i = 0; i < DK_FRAME_KEY_LEN; i++) {
        unsigned v = 0;
        for (int j = 0; j < 2; j++) {
            char c = hex[2 * i + (size_t) j];
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0)
                return -1;
            v = v << 4 | (unsigned) d;
        }
        key[i] = (unsigned char) v;
    }
    return 0;
}

void dk_frame_key_to_hex(const unsigned char key[DK_FRAME_KEY_LEN], char *hex_out)
{
    for (size_t i = 0; i < DK_FRAME_KEY_LEN; i++)
        snprintf(hex_out + 2 * i, 3, "%02x", key[i]);
}

void dk_frame_side_init(dk_frame_side_t *side, dk_frame_key_t *key, const unsigned char *nonce,
                        unsigned char dir_out)
{
    memset(side, 0, sizeof *side);
    side->key = key;
    memcpy(side->nonce, nonce, sizeof side->nonce);
    side->dir_out = dir_out;
    side->dir_in = dir_out == DK_FRAME_DIR_TO_RUNTIME ? DK_FRAME_DIR_TO_RANK
                                                      : DK_FRAME_DIR_TO_RUNTIME;
}

size_t dk_frame_seal_head(dk_frame_side_t *side, const void *head, size_t head_len,
                          const void *tail, size_t tail_len, unsigned char *out)
{
    if (head_len > UINT32_MAX - DK_FRAME_MAC_LEN ||
        tail_len > UINT32_MAX - DK_FRAME_MAC_LEN - head_len)
        return 0;
    unsigned char mac[DK_FRAME_MAC_LEN];
    if (!dk_frame_mac(side->key, side->nonce, side->dir_out, side->seq_out, head, head_len, tail,
                      tail_len, mac))
        return 0;
    side->seq_out++;
    /* HEAD first: it may lie where the length and MAC go, or already in place. */
    memmove(out + 4 + DK_FRAME_MAC_LEN, head, head_len);
    dk_put_be32(out, (uint32_t) (DK_FRAME_MAC_LEN + head_len + tail_len));
    memcpy(out + 4, mac, sizeof mac);
    return 4 + DK_FRAME_MAC_LEN + head_len;
}

size_t dk_frame_seal(dk_frame_side_t *side, int type, uint32_t id, const void *payload,
                     size_t len, unsigned char *out)
{
    unsigned char *body = out + 4 + DK_FRAME_MAC_LEN;
    if (len)
        memmove(body + DK_FRAME_BODY_HEAD, payload, len);
    body[0] = (unsigned char) type;
    dk_put_be32(body + 1, id);
    return dk_frame_seal_head(side, body, DK_FRAME_BODY_HEAD + len, NULL, 0, out);
}

bool dk_frame_verify(dk_frame_side_t *side, const unsigned char *frame, size_t frame_len)
{
    unsigned char expected[DK_FRAME_MAC_LEN];
    if (frame_len < DK_FRAME_MAC_LEN ||
        !dk_frame_mac(side->key, side->nonce, side->dir_in, side->seq_in,
                      frame + DK_FRAME_MAC_LEN, frame_len - DK_FRAME_MAC_LEN, NULL, 0,
                      expected) ||
        CRYPTO_memcmp(expected, frame, sizeof expected) != 0)
        return false;
    side->seq_in++;
    return true;
}

long dk_frame_open(dk_frame_side_t *side, const unsigned char *buf, size_t len,
                   size_t max_payload, dk_frame_msg_t *msg, size_t *need, const char **why)
{
    static const char *const quiet = "";
    if (why)
        *why = quiet;
    if (need)
        *need = 4;
    if (len < 4)
        return 0;
    uint32_t n = dk_get_be32(buf);
    if (n < DK_FRAME_MAC_LEN + DK_FRAME_BODY_HEAD ||
        n - DK_FRAME_MAC_LEN - DK_FRAME_BODY_HEAD > max_payload) {
        if (why)
            *why = "a message's size is outside the protocol's limits";
        return -1;
    }
    if (need)
        *need = 4 + (size_t) n;
    if (len < 4 + (size_t) n)
        return 0;
    if (!dk_frame_verify(side, buf + 4, n)) {
        if (why)
            *why = "a message did not verify (not signed with this job's key, or out of order)";
        return -1;
    }
    const unsigned char *body = buf + 4 + DK_FRAME_MAC_LEN;
    msg->type = body[0];
    msg->id = dk_get_be32(body + 1);
    msg->payload = body + DK_FRAME_BODY_HEAD;
    msg->len = n - DK_FRAME_MAC_LEN - DK_FRAME_BODY_HEAD;
    return (long) (4 + n);
}
