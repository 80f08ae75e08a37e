/*
 * dk_conn: the Jupyter connection file.
 *
 * A frontend starts a kernel with `-f FILE`; FILE is a JSON object that names the
 * transport, the IP, one port per channel (shell, iopub, stdin, control, hb), the
 * signature scheme and the HMAC key. Any "hmac-DIGEST" OpenSSL can compute is
 * accepted (none means hmac-sha256); an empty key means "do not sign".
 */
#ifndef DK_CONN_H
#define DK_CONN_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    DK_CHAN_SHELL = 0,
    DK_CHAN_IOPUB,
    DK_CHAN_STDIN,
    DK_CHAN_CONTROL,
    DK_CHAN_HB,
    DK_CHAN_COUNT
} dk_channel_t;

typedef struct {
    char transport[16];          /* "tcp" or "ipc" */
    char ip[256];                /* address, or path prefix for ipc */
    int ports[DK_CHAN_COUNT];    /* indexed by dk_channel_t */
    char *key;                   /* owned; may be "" (no signing) */
    size_t key_len;
    char digest[64];             /* the scheme's digest ("sha256"), for dk_signer_new_digest */
    char kernel_name[128];       /* may be "" */
} dk_conn_t;

/* Parse the connection file at PATH into OUT. Returns 0 on success. On failure
 * returns -1, leaves OUT empty (nothing to free) and writes a message for the user
 * into ERR (ERRLEN bytes, always NUL-terminated) that names the file and the field
 * that was missing or wrong. Free a successful OUT with dk_conn_clear(). */
int dk_conn_load(const char *path, dk_conn_t *out, char *err, size_t errlen);

/* Same as dk_conn_load, from a JSON text of LEN bytes already in memory. */
int dk_conn_parse(const char *text, size_t len, dk_conn_t *out, char *err, size_t errlen);

/* Release what OUT owns and zero it. Safe on a zeroed struct. */
void dk_conn_clear(dk_conn_t *conn);

/* Write the ZeroMQ endpoint of channel CH into BUF ("tcp://127.0.0.1:5555" or
 * "ipc://PATH-5555"). Returns BUF, or NULL if BUFLEN is too small. */
char *dk_conn_endpoint(const dk_conn_t *conn, dk_channel_t ch, char *buf, size_t buflen);

/* The endpoint to bind channel CH to: like dk_conn_endpoint, but a host name
 * ("localhost") is resolved to a numeric address (IPv4 first) and an IPv6
 * address is bracketed, with *IPV6 set so the caller enables IPv6 on the socket.
 * A name that does not resolve is left to ZeroMQ (an interface name). Returns
 * BUF, or NULL with ERR written. */
char *dk_conn_bind_endpoint(const dk_conn_t *conn, dk_channel_t ch, char *buf, size_t buflen,
                            bool *ipv6, char *err, size_t errlen);

/* The name of a channel ("shell", "iopub", ...), for logs. */
const char *dk_channel_name(dk_channel_t ch);

#endif
