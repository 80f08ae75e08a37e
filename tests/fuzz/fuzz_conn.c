/*
 * fuzz_conn: the connection-file parser (protocol/dk_conn.h).
 *
 * Input: the bytes of a connection file, as a frontend (or a person, or a wrong
 * -f argument) would hand them over. The input is parsed twice, once with a
 * roomy error buffer and once with one of 1 to 16 bytes, and the header's
 * promises are checked:
 *   - both parses agree, and a refusal leaves OUT empty and a NUL-terminated,
 *     non-empty message (truncated, never overrun, in the small buffer);
 *   - an accepted file has transport tcp or ipc, a non-empty IP, five ports in
 *     1-65535, an owned NUL-terminated key of key_len bytes, and
 *     NUL-terminated transport, ip and kernel_name within their arrays;
 *   - dk_conn_endpoint gives "tcp://IP:PORT" or "ipc://IP-PORT" for every
 *     channel in a buffer that is large enough, and NULL (never an overrun) in
 *     one that is one byte too small;
 *   - dk_conn_clear leaves the struct zeroed, and is safe twice.
 */
#include "fuzz_check.h"

#include "dk_conn.h"

#include <stdint.h>
#include <string.h>

static bool is_zeroed(const dk_conn_t *c)
{
    static const dk_conn_t zero;
    return memcmp(c, &zero, sizeof zero) == 0;
}

static void check_endpoints(const dk_conn_t *c)
{
    bool ipc = strcmp(c->transport, "ipc") == 0;
    for (int ch = 0; ch < DK_CHAN_COUNT; ch++) {
        char want[512];
        int n = snprintf(want, sizeof want, ipc ? "ipc://%s-%d" : "tcp://%s:%d", c->ip,
                         c->ports[ch]);
        FUZZ_CHECK(n > 0 && (size_t) n < sizeof want, "endpoint longer than expected");
        char buf[512];
        char *got = dk_conn_endpoint(c, (dk_channel_t) ch, buf, sizeof buf);
        FUZZ_CHECK(got == buf && strcmp(buf, want) == 0, "%s endpoint is '%s', expected '%s'",
                   dk_channel_name((dk_channel_t) ch), got ? buf : "(null)", want);
        /* Exactly enough room, then one byte short, in a heap block ASan guards. */
        char *tight = malloc((size_t) n + 1);
        FUZZ_CHECK(tight, "out of memory");
        FUZZ_CHECK(dk_conn_endpoint(c, (dk_channel_t) ch, tight, (size_t) n + 1) == tight,
                   "endpoint refused a buffer of exactly its size");
        FUZZ_CHECK(dk_conn_endpoint(c, (dk_channel_t) ch, tight, (size_t) n) == NULL,
                   "endpoint accepted a buffer one byte short");
        free(tight);
        FUZZ_CHECK(strcmp(dk_channel_name((dk_channel_t) ch), "unknown") != 0,
                   "channel %d has no name", ch);
    }
    char buf[64];
    FUZZ_CHECK(dk_conn_endpoint(c, DK_CHAN_COUNT, buf, sizeof buf) == NULL,
               "an endpoint for a channel that does not exist");
}

static void check_accepted(const dk_conn_t *c)
{
    FUZZ_CHECK(fuzz_terminated(c->transport, sizeof c->transport) &&
                   fuzz_terminated(c->ip, sizeof c->ip) &&
                   fuzz_terminated(c->kernel_name, sizeof c->kernel_name),
               "a string field is not NUL-terminated within its array");
    FUZZ_CHECK(strcmp(c->transport, "tcp") == 0 || strcmp(c->transport, "ipc") == 0,
               "transport '%s'", c->transport);
    FUZZ_CHECK(c->ip[0] != '\0', "accepted an empty ip");
    for (int ch = 0; ch < DK_CHAN_COUNT; ch++)
        FUZZ_CHECK(c->ports[ch] >= 1 && c->ports[ch] <= 65535, "%s port %d",
                   dk_channel_name((dk_channel_t) ch), c->ports[ch]);
    FUZZ_CHECK(c->key && c->key[c->key_len] == '\0' && strlen(c->key) == c->key_len,
               "the key is not %zu bytes and NUL-terminated", c->key_len);
    check_endpoints(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A heap copy of exactly SIZE bytes: an overread past the text is caught. */
    char *text = malloc(size ? size : 1);
    FUZZ_CHECK(text, "out of memory");
    if (size)
        memcpy(text, data, size);

    dk_conn_t conn;
    memset(&conn, 0xA5, sizeof conn);   /* the parser must set or clear every byte */
    char err[512];
    int rc = dk_conn_parse(text, size, &conn, err, sizeof err);
    if (rc == 0) {
        check_accepted(&conn);
    } else {
        FUZZ_CHECK(rc == -1, "dk_conn_parse returned %d", rc);
        FUZZ_CHECK(is_zeroed(&conn), "a refused file left OUT not empty");
        FUZZ_CHECK(fuzz_terminated(err, sizeof err) && err[0], "no message for a refusal");
    }

    size_t small_len = 1 + size % 16;
    char *small = malloc(small_len);
    FUZZ_CHECK(small, "out of memory");
    dk_conn_t again;
    int rc2 = dk_conn_parse(text, size, &again, small, small_len);
    FUZZ_CHECK(rc2 == rc, "the parse result depends on the error buffer (%d, %d)", rc, rc2);
    if (rc2 != 0)
        FUZZ_CHECK(fuzz_terminated(small, small_len), "a truncated message is not terminated");
    else
        FUZZ_CHECK(again.key_len == conn.key_len && memcmp(again.key, conn.key, conn.key_len) == 0,
                   "two parses of the same file give different keys");
    free(small);

    dk_conn_clear(&again);
    dk_conn_clear(&conn);
    FUZZ_CHECK(is_zeroed(&conn), "dk_conn_clear left something behind");
    dk_conn_clear(&conn);
    free(text);
    return 0;
}
