/*
 * dk_agentwire: frames sealed and opened whole. See the header.
 */
#include "dk_agentwire.h"
#include "dk_be32.h"

#include <stdio.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/params.h>

int dk_agentwire_init(dk_agentwire_t *w, const unsigned char *key, const unsigned char *nonce,
                      unsigned char dir_out, size_t max_payload)
{
    memset(w, 0, sizeof *w);
    memcpy(w->key, key, sizeof w->key);
    memcpy(w->nonce, nonce, sizeof w->nonce);
    w->dir_out = dir_out;
    w->dir_in = dir_out == 'R' ? 'K' : 'R';
    w->max_payload = max_payload;
    w->mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    return w->mac ? 0 : -1;
}

void dk_agentwire_clear(dk_agentwire_t *w)
{
    EVP_MAC_free(w->mac);
    OPENSSL_cleanse(w->key, sizeof w->key);
    w->mac = NULL;
}

int dk_agentwire_key_from_hex(const char *hex, unsigned char key[DK_AGENTWIRE_KEY_LEN])
{
    if (!hex || strlen(hex) != 2 * DK_AGENTWIRE_KEY_LEN)
        return -1;
    for (size_t i = 0; i < DK_AGENTWIRE_KEY_LEN; i++) {
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

static bool mac_of(dk_agentwire_t *w, unsigned char dir, uint32_t seq, const unsigned char *body,
                   size_t head, const unsigned char *payload, size_t len,
                   unsigned char out[DK_AGENTWIRE_MAC_LEN])
{
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    unsigned char seq_be[4];
    dk_put_be32(seq_be, seq);
    size_t out_len = 0;
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(w->mac);
    bool ok = ctx && EVP_MAC_init(ctx, w->key, sizeof w->key, params) &&
              EVP_MAC_update(ctx, w->nonce, sizeof w->nonce) && EVP_MAC_update(ctx, &dir, 1) &&
              EVP_MAC_update(ctx, seq_be, 4) && EVP_MAC_update(ctx, body, head) &&
              (len == 0 || EVP_MAC_update(ctx, payload, len)) &&
              EVP_MAC_final(ctx, out, &out_len, DK_AGENTWIRE_MAC_LEN) &&
              out_len == DK_AGENTWIRE_MAC_LEN;
    EVP_MAC_CTX_free(ctx);
    return ok;
}

size_t dk_agentwire_seal(dk_agentwire_t *w, int type, uint32_t id, const void *payload,
                         size_t len, unsigned char *out)
{
    unsigned char *body = out + 4 + DK_AGENTWIRE_MAC_LEN;
    body[0] = (unsigned char) type;
    dk_put_be32(body + 1, id);
    if (len)
        memmove(body + 5, payload, len);
    if (!mac_of(w, w->dir_out, w->seq_out, body, 5 + len, NULL, 0, out + 4))
        return 0;
    dk_put_be32(out, (uint32_t) (DK_AGENTWIRE_MAC_LEN + 5 + len));
    w->seq_out++;
    return DK_AGENTWIRE_HEAD + len;
}

long dk_agentwire_open(dk_agentwire_t *w, const unsigned char *buf, size_t len,
                       dk_agentframe_t *f, size_t *need, const char **why)
{
    static const char *const quiet = "";
    if (why)
        *why = quiet;
    if (need)
        *need = 4;
    if (len < 4)
        return 0;
    uint32_t n = dk_get_be32(buf);
    if (n < DK_AGENTWIRE_MAC_LEN + 5 || n - DK_AGENTWIRE_MAC_LEN - 5 > w->max_payload) {
        if (why)
            *why = "a message's size is outside the protocol's limits";
        return -1;
    }
    if (need)
        *need = 4 + (size_t) n;
    if (len < 4 + (size_t) n)
        return 0;
    const unsigned char *body = buf + 4 + DK_AGENTWIRE_MAC_LEN;
    size_t body_len = n - DK_AGENTWIRE_MAC_LEN;
    unsigned char expected[DK_AGENTWIRE_MAC_LEN];
    if (!mac_of(w, w->dir_in, w->seq_in, body, body_len, NULL, 0, expected) ||
        CRYPTO_memcmp(expected, buf + 4, sizeof expected) != 0) {
        if (why)
            *why = "a message did not verify (not signed with this job's key, or out of order)";
        return -1;
    }
    w->seq_in++;
    f->type = body[0];
    f->id = dk_get_be32(body + 1);
    f->payload = body + 5;
    f->len = body_len - 5;
    return (long) (4 + n);
}
