/*
 * frame_bench: seal + open of one back-channel frame, per frame, three ways:
 *   old    what the kernel, the agent and the ranks did before dk_frame: a new
 *          EVP_MAC_CTX and EVP_MAC_init with the key for every MAC;
 *   dup    EVP_MAC_CTX_dup of a context keyed once (the other way to keep a
 *          key's setup), for comparison;
 *   codec  dk_frame_seal + dk_frame_open (one context keyed once, restarted
 *          with EVP_MAC_init(ctx, NULL, ...) for each MAC).
 * For 100-byte and 4 KiB payloads. Each figure is CPU time, the best of
 * ROUNDS slices of about 0.1 s of CPU, the three ways taking turns (the machine is shared: the
 * best slice is the least disturbed, and turns spread the disturbance over
 * all three). Not a test: nothing here passes or fails.
 *
 *   ninja -C build bench/frame_bench && build/bench/frame_bench [ROUNDS]
 */
#include "dk_be32.h"
#include "dk_frame.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

static const unsigned char KEY[32] = "frame_bench key, not a secret..";
static unsigned char NONCE[32];
static EVP_MAC *hmac;
static EVP_MAC_CTX *keyed;      /* for "dup" */

/* This thread's CPU time: what a frame costs the kernel, and what a busy
 * shared machine disturbs least (time spent waiting for a core is not in it). */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static bool feed(EVP_MAC_CTX *ctx, unsigned char dir, uint32_t seq, const unsigned char *body,
                 size_t len, unsigned char out[32])
{
    unsigned char seq_be[4];
    dk_put_be32(seq_be, seq);
    size_t n = 0;
    return EVP_MAC_update(ctx, NONCE, 32) && EVP_MAC_update(ctx, &dir, 1) &&
           EVP_MAC_update(ctx, seq_be, 4) && EVP_MAC_update(ctx, body, len) &&
           EVP_MAC_final(ctx, out, &n, 32) && n == 32;
}

/* The MAC as every frame paid for it before dk_frame. */
static bool mac_old(unsigned char dir, uint32_t seq, const unsigned char *body, size_t len,
                    unsigned char out[32])
{
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(hmac);
    bool ok = ctx && EVP_MAC_init(ctx, KEY, 32, params) && feed(ctx, dir, seq, body, len, out);
    EVP_MAC_CTX_free(ctx);
    return ok;
}

static bool mac_dup(unsigned char dir, uint32_t seq, const unsigned char *body, size_t len,
                    unsigned char out[32])
{
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_dup(keyed);
    bool ok = ctx && feed(ctx, dir, seq, body, len, out);
    EVP_MAC_CTX_free(ctx);
    return ok;
}

typedef bool (*mac_fn)(unsigned char, uint32_t, const unsigned char *, size_t, unsigned char *);

/* Seal and open one frame the way the old code did, with MAC. */
static bool round_trip_with(mac_fn mac, uint32_t seq, const unsigned char *payload, size_t len,
                            unsigned char *frame)
{
    unsigned char *body = frame + 36;
    body[0] = 6;
    dk_put_be32(body + 1, 3);
    memcpy(body + 5, payload, len);
    if (!mac('R', seq, body, 5 + len, frame + 4))
        return false;
    dk_put_be32(frame, (uint32_t) (32 + 5 + len));
    unsigned char expected[32];
    uint32_t n = dk_get_be32(frame);
    return mac('R', seq, frame + 36, n - 32, expected) &&
           CRYPTO_memcmp(expected, frame + 4, 32) == 0;
}

/* Seconds per frame of WAY (0 old, 1 dup, 2 codec) for LEN-byte payloads,
 * over about SLICE_S seconds. */
static double slice(int way, size_t len, double slice_s, dk_frame_key_t *key,
                    const unsigned char *payload, unsigned char *frame)
{
    dk_frame_side_t rank, kernel;
    dk_frame_side_init(&rank, key, NONCE, 'R');
    dk_frame_side_init(&kernel, key, NONCE, 'K');
    long frames = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < 100; i++, frames++) {
            bool ok;
            if (way == 0)
                ok = round_trip_with(mac_old, (uint32_t) frames, payload, len, frame);
            else if (way == 1)
                ok = round_trip_with(mac_dup, (uint32_t) frames, payload, len, frame);
            else {
                dk_frame_msg_t m;
                size_t n = dk_frame_seal(&rank, 6, 3, payload, len, frame);
                ok = n > 0 && dk_frame_open(&kernel, frame, n, len, &m, NULL, NULL) > 0;
            }
            if (!ok) {
                fprintf(stderr, "frame_bench: a frame did not seal or open\n");
                exit(1);
            }
        }
    } while ((t = now_s()) - t0 < slice_s);
    return (t - t0) / (double) frames;
}

/* The best of ROUNDS slices of each way, the ways taking turns within each
 * round, so that whatever else the machine does hits all three alike. */
static void per_frame(size_t len, int rounds, double best[3])
{
    unsigned char *payload = malloc(len), *frame = malloc(DK_FRAME_HEAD + len);
    memset(payload, 'p', len);
    dk_frame_key_t *key = dk_frame_key_new(KEY);
    best[0] = best[1] = best[2] = 1e9;
    for (int r = 0; r < rounds; r++) {
        for (int k = 0; k < 3; k++) {
            int way = (r + k) % 3;
            double each = slice(way, len, 0.1, key, payload, frame);
            if (each < best[way])
                best[way] = each;
        }
    }
    dk_frame_key_destroy(&key);
    free(payload);
    free(frame);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    if (rounds < 1)
        rounds = 1;
    for (int i = 0; i < 32; i++)
        NONCE[i] = (unsigned char) i;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    hmac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    keyed = hmac ? EVP_MAC_CTX_new(hmac) : NULL;
    if (!keyed || !EVP_MAC_init(keyed, KEY, 32, params)) {
        fprintf(stderr, "frame_bench: OpenSSL has no HMAC-SHA256\n");
        return 1;
    }
    printf("%s; seal + open of one frame, best of %d slices each\n", OpenSSL_version(OPENSSL_VERSION),
           rounds);
    printf("%-8s %10s %10s %10s %12s %12s\n", "payload", "old us", "dup us", "codec us",
           "old/codec", "dup/codec");
    const size_t sizes[] = {100, 4096};
    for (size_t s = 0; s < 2; s++) {
        double best[3];
        per_frame(sizes[s], rounds, best);
        double old = best[0], dup = best[1], codec = best[2];
        printf("%-8zu %10.3f %10.3f %10.3f %11.2fx %11.2fx\n", sizes[s], old * 1e6, dup * 1e6,
               codec * 1e6, old / codec, dup / codec);
    }
    EVP_MAC_CTX_free(keyed);
    EVP_MAC_free(hmac);
    return 0;
}
