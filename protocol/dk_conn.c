/*
 * dk_conn: reading the connection file a frontend hands the kernel.
 *
 * The file is written by jupyter_client (or by a person, for a kernel started by
 * hand), so every field is checked and every refusal names the file, the field
 * and what was expected: a kernel that cannot start is debugged from that one
 * line in the frontend's log.
 *
 * Strict where a mistake is a security or connectivity problem, lenient where
 * clients differ:
 *   - "key" must be present (a string, "" to disable signing): a missing key
 *     silently turning authentication off would be the wrong default;
 *   - with a non-empty key, "signature_scheme" must be "hmac-" and a digest
 *     OpenSSL provides (hmac-sha256, hmac-sha512, hmac-sha3_256, ...); a missing
 *     one means hmac-sha256, jupyter_client's default; with an empty key it is
 *     not used;
 *   - ports are JSON integers 1-65535; a decimal string ("5555") is accepted too,
 *     since hand-written files and some launchers quote them. Port 0 ("pick
 *     one") is refused: the kernel cannot report a chosen port back;
 *   - "transport" defaults to "tcp" (as ipykernel does) and must be tcp or ipc;
 *     "kernel_name" is optional.
 *
 * The ipc endpoint is "ipc://IP-PORT", the IP field being a path prefix: the
 * same name jupyter_client computes, so both sides meet at the same socket file.
 */
#include "dk_err.h"
#include "dk_conn.h"
#include "dk_wire.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netdb.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Bigger than any real connection file by far; stops a wrong -f argument
 * (a dataset, a device) from being read whole into memory. */
#define CONN_MAX_BYTES (1024 * 1024)

static const char *const channel_names[DK_CHAN_COUNT] = {
    "shell", "iopub", "stdin", "control", "hb",
};

static const char *const port_fields[DK_CHAN_COUNT] = {
    "shell_port", "iopub_port", "stdin_port", "control_port", "hb_port",
};

const char *dk_channel_name(dk_channel_t ch)
{
    if ((int) ch < 0 || ch >= DK_CHAN_COUNT)
        return "unknown";
    return channel_names[ch];
}


/* A port from an integer or a decimal string; -1 if neither or out of range. */
static int port_value(const json_t *j)
{
    long long v;
    if (json_is_integer(j)) {
        v = json_integer_value(j);
    } else if (json_is_string(j)) {
        const char *s = json_string_value(j);
        size_t n = json_string_length(j);
        if (n == 0 || n > 5)
            return -1;
        v = 0;
        for (size_t i = 0; i < n; i++) {
            if (s[i] < '0' || s[i] > '9')
                return -1;
            v = v * 10 + (s[i] - '0');
        }
    } else {
        return -1;
    }
    return (v >= 1 && v <= 65535) ? (int) v : -1;
}

/* Copy string field FIELD of OBJ into DST (DSTLEN bytes). Returns 0, 1 if the
 * field is absent (DST untouched), or -1 with ERR written. */
static int get_string(const json_t *obj, const char *field, char *dst, size_t dstlen,
                      const char *src, char *err, size_t errlen)
{
    json_t *j = json_object_get(obj, field);
    if (!j)
        return 1;
    if (!json_is_string(j)) {
        dk_set_err(err, errlen, "%s: \"%s\" must be a string", src, field);
        return -1;
    }
    size_t n = json_string_length(j);
    if (n >= dstlen || memchr(json_string_value(j), '\0', n)) {
        dk_set_err(err, errlen, "%s: \"%s\" is too long (%zu bytes, at most %zu)", src, field, n,
                dstlen - 1);
        return -1;
    }
    memcpy(dst, json_string_value(j), n + 1);
    return 0;
}

/* "transport" (default tcp) and "ip" of ROOT into CONN. */
static int parse_address(json_t *root, dk_conn_t *conn, const char *src, char *err,
                         size_t errlen)
{
    strcpy(conn->transport, "tcp");
    if (get_string(root, "transport", conn->transport, sizeof conn->transport, src, err,
                   errlen) < 0)
        return -1;
    if (strcmp(conn->transport, "tcp") != 0 && strcmp(conn->transport, "ipc") != 0) {
        dk_set_err(err, errlen, "%s: \"transport\" is \"%s\", expected \"tcp\" or \"ipc\"", src,
                   conn->transport);
        return -1;
    }
    int got = get_string(root, "ip", conn->ip, sizeof conn->ip, src, err, errlen);
    if (got < 0)
        return -1;
    if (got > 0 || conn->ip[0] == '\0') {
        dk_set_err(err, errlen, "%s: missing \"ip\" (the address to bind, e.g. \"127.0.0.1\"%s)",
                   src, strcmp(conn->transport, "ipc") == 0 ? ", or the ipc path prefix" : "");
        return -1;
    }
    return 0;
}

/* The five "*_port" fields of ROOT into CONN. */
static int parse_ports(json_t *root, dk_conn_t *conn, const char *src, char *err, size_t errlen)
{
    for (int ch = 0; ch < DK_CHAN_COUNT; ch++) {
        json_t *j = json_object_get(root, port_fields[ch]);
        if (!j) {
            dk_set_err(err, errlen, "%s: missing \"%s\" (an integer port 1-65535)", src,
                       port_fields[ch]);
            return -1;
        }
        conn->ports[ch] = port_value(j);
        if (conn->ports[ch] < 0) {
            char *shown = json_dumps(j, JSON_ENCODE_ANY | JSON_COMPACT);
            dk_set_err(err, errlen, "%s: \"%s\" is %.40s, expected an integer port 1-65535", src,
                       port_fields[ch], shown ? shown : "not a port");
            free(shown);
            return -1;
        }
    }
    return 0;
}

/* "signature_scheme" of ROOT into CONN->digest: "hmac-" and a digest.
 * jupyter_client's Session takes any hashlib name, so any digest OpenSSL has is
 * accepted; no field means jupyter_client's default, hmac-sha256. With an empty
 * key nothing is signed, and the scheme does not matter. */
static int parse_scheme(json_t *root, dk_conn_t *conn, const char *src, char *err,
                        size_t errlen)
{
    json_t *scheme = json_object_get(root, "signature_scheme");
    if (scheme && !json_is_string(scheme)) {
        dk_set_err(err, errlen, "%s: \"signature_scheme\" must be a string", src);
        return -1;
    }
    const char *text = scheme ? json_string_value(scheme) : "hmac-sha256";
    if (strncmp(text, "hmac-", 5) != 0 || strlen(text + 5) >= sizeof conn->digest ||
        !dk_signer_digest_check(text + 5)) {
        if (conn->key_len > 0) {
            dk_set_err(err, errlen,
                       "%s: \"signature_scheme\" is \"%.40s\", expected \"hmac-\" and a digest "
                       "OpenSSL provides (\"hmac-sha256\", the default, \"hmac-sha512\", ...)",
                       src, text);
            return -1;
        }
        text = "hmac-sha256";
    }
    snprintf(conn->digest, sizeof conn->digest, "%s", text + 5);
    return 0;
}

/* "key" of ROOT, and its scheme, into CONN (the key copied). */
static int parse_key(json_t *root, dk_conn_t *conn, const char *src, char *err, size_t errlen)
{
    json_t *key = json_object_get(root, "key");
    if (!key) {
        dk_set_err(err, errlen,
                   "%s: missing \"key\" (the HMAC key; write \"key\": \"\" to disable signing)",
                   src);
        return -1;
    }
    if (!json_is_string(key)) {
        dk_set_err(err, errlen, "%s: \"key\" must be a string", src);
        return -1;
    }
    conn->key_len = json_string_length(key);
    if (parse_scheme(root, conn, src, err, errlen) < 0)
        return -1;
    conn->key = malloc(conn->key_len + 1);
    if (!conn->key) {
        dk_set_err(err, errlen, "%s: out of memory", src);
        return -1;
    }
    memcpy(conn->key, json_string_value(key), conn->key_len + 1);
    return 0;
}

static int parse_named(const char *text, size_t len, const char *src, dk_conn_t *out,
                       char *err, size_t errlen)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!out || (!text && len > 0)) {
        dk_set_err(err, errlen, "%s: nothing to parse", src);
        return -1;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text ? text : "", len, JSON_DECODE_ANY, &jerr);
    if (!root) {
        dk_set_err(err, errlen, "%s: not valid JSON (%s, line %d column %d)", src, jerr.text,
                   jerr.line, jerr.column);
        return -1;
    }
    dk_conn_t conn;
    memset(&conn, 0, sizeof conn);
    int rc = -1;
    if (!json_is_object(root))
        dk_set_err(err, errlen, "%s: expected a JSON object with the ports, ip and key", src);
    else if (parse_address(root, &conn, src, err, errlen) == 0 &&
             parse_ports(root, &conn, src, err, errlen) == 0 &&
             get_string(root, "kernel_name", conn.kernel_name, sizeof conn.kernel_name, src, err,
                        errlen) >= 0 &&
             parse_key(root, &conn, src, err, errlen) == 0) {
        *out = conn;
        rc = 0;
    }
    json_decref(root);
    return rc;
}

int dk_conn_parse(const char *text, size_t len, dk_conn_t *out, char *err, size_t errlen)
{
    return parse_named(text, len, "connection file", out, err, errlen);
}

int dk_conn_load(const char *path, dk_conn_t *out, char *err, size_t errlen)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!path) {
        dk_set_err(err, errlen, "no connection file given (start the kernel with -f FILE)");
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        dk_set_err(err, errlen, "cannot open connection file '%s': %s", path, strerror(errno));
        return -1;
    }
    char *text = malloc(CONN_MAX_BYTES + 1);
    size_t len = text ? fread(text, 1, CONN_MAX_BYTES + 1, f) : 0;
    bool read_error = !text || ferror(f);
    int saved = errno;
    fclose(f);

    char src[512];
    snprintf(src, sizeof src, "connection file '%s'", path);
    int rc = -1;
    if (read_error)
        dk_set_err(err, errlen, "cannot read %s: %s", src, text ? strerror(saved) : "out of memory");
    else if (len > CONN_MAX_BYTES)
        dk_set_err(err, errlen, "%s is larger than %d bytes: not a connection file", src,
                CONN_MAX_BYTES);
    else
        rc = parse_named(text, len, src, out, err, errlen);
    free(text);
    return rc;
}

void dk_conn_clear(dk_conn_t *conn)
{
    if (!conn)
        return;
    if (conn->key) {
        explicit_bzero(conn->key, conn->key_len);   /* a plain memset may be elided */
        free(conn->key);
    }
    memset(conn, 0, sizeof *conn);
}

char *dk_conn_endpoint(const dk_conn_t *conn, dk_channel_t ch, char *buf, size_t buflen)
{
    if (!conn || !buf || (int) ch < 0 || ch >= DK_CHAN_COUNT)
        return NULL;
    bool ipc = strcmp(conn->transport, "ipc") == 0;
    int n = snprintf(buf, buflen, ipc ? "%s://%s-%d" : "%s://%s:%d", conn->transport, conn->ip,
                     conn->ports[ch]);
    if (n < 0 || (size_t) n >= buflen)
        return NULL;
    return buf;
}

/* dk_conn_endpoint, with ERR written when it fails. */
static char *plain_endpoint(const dk_conn_t *conn, dk_channel_t ch, char *buf, size_t buflen,
                            char *err, size_t errlen)
{
    char *ep = dk_conn_endpoint(conn, ch, buf, buflen);
    if (!ep)
        dk_set_err(err, errlen, "the %s endpoint does not fit in %zu bytes", dk_channel_name(ch),
                   buflen);
    return ep;
}

char *dk_conn_bind_endpoint(const dk_conn_t *conn, dk_channel_t ch, char *buf, size_t buflen,
                            bool *ipv6, char *err, size_t errlen)
{
    *ipv6 = false;
    if (!conn || strcmp(conn->transport, "tcp") != 0 || strcmp(conn->ip, "*") == 0)
        return plain_endpoint(conn, ch, buf, buflen, err, errlen);
    /* ZeroMQ binds only to numeric addresses (or interface names) and only to
     * IPv4 unless told otherwise, so "localhost" and "::1", both legal in a
     * connection file, are turned into what it takes here. */
    char host[sizeof conn->ip];
    snprintf(host, sizeof host, "%s", conn->ip);
    size_t n = strlen(host);
    if (host[0] == '[' && n > 2 && host[n - 1] == ']') {
        memmove(host, host + 1, n - 2);
        host[n - 2] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return plain_endpoint(conn, ch, buf, buflen, err, errlen);   /* an interface name */
    /* A name with both (localhost) binds IPv4: that is what a frontend's ZeroMQ,
     * IPv4-only by default, connects to when it resolves the same name. */
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *a = res; a; a = a->ai_next) {
        if (a->ai_family == AF_INET) {
            pick = a;
            break;
        }
        if (a->ai_family == AF_INET6 && !pick)
            pick = a;
    }
    char numeric[NI_MAXHOST];
    bool ok = pick && getnameinfo(pick->ai_addr, pick->ai_addrlen, numeric, sizeof numeric, NULL,
                                  0, NI_NUMERICHOST) == 0;
    bool v6 = ok && pick->ai_family == AF_INET6;
    freeaddrinfo(res);
    if (!ok) {
        dk_set_err(err, errlen, "the connection file's \"ip\" \"%s\" has no IPv4 or IPv6 "
                   "address", conn->ip);
        return NULL;
    }
    int w = snprintf(buf, buflen, v6 ? "tcp://[%s]:%d" : "tcp://%s:%d", numeric, conn->ports[ch]);
    if (w < 0 || (size_t) w >= buflen) {
        dk_set_err(err, errlen, "the connection file's \"ip\" is too long");
        return NULL;
    }
    *ipv6 = v6;
    return buf;
}
