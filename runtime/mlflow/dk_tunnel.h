/*
 * dk_tunnel: the tracking server's port, brought to every node of a run.
 *
 * The tracking server a kernel uses is often on its own loopback (the one it
 * starts, or a user's `mlflow server` on 127.0.0.1). Ranks on other nodes of
 * a Slurm run cannot reach that: each node's 127.0.0.1 is its own. Opening
 * the server to the cluster's network would open it to every user there. So
 * each node gets the server's port as a loopback port of its own, which only
 * the user's processes may use:
 *
 *   rank --(127.0.0.1:DOOR)--> door (in the node's agent)
 *        --(TCP, the run's network)--> gate (in the kernel's job)
 *        --(127.0.0.1:SERVER)--> tracking server
 *
 * The door listens on 127.0.0.1 of its node and takes a connection only when
 * its other end is a process of the agent's own uid (dk_sockowner_peer_uid:
 * the client socket's owner in /proc/net/tcp); anyone else's is closed before
 * a byte goes through. For each connection it takes, it opens one to the
 * gate, which sends a nonce of 32 random bytes; the door answers with
 * HMAC-SHA256 under the run's back-channel key (which only the kernel, the
 * agents and the ranks hold) of the nonce (dk_frame_mac, direction 'T',
 * count 0, body "distkernel tunnel"). A gate that does not get the right
 * answer within a few seconds closes the connection, having forwarded
 * nothing; one that does connects to the server and from then on both ends
 * only copy bytes, in both directions, until either side closes. What goes
 * through is the tracking client's own HTTP (or TLS), unchanged: its
 * credentials, if the server asks for any, are its own.
 *
 * Each end is one thread with one poll loop over all its connections, so the
 * gate serves 1,024 ranks' connections without 1,024 threads. A direction
 * reads only when what it read before has all been written on: a slow reader
 * slows its writer, memory stays 2 x DK_TUNNEL_BUF per connection. An end
 * takes at most its cap of connections at once; more are closed as they come.
 */
#ifndef DK_TUNNEL_H
#define DK_TUNNEL_H

#include "dk_accept.h"
#include "dk_frame.h"

#include <stdbool.h>
#include <stddef.h>

#define DK_TUNNEL_BUF 16384             /* bytes buffered per direction */
#define DK_TUNNEL_PROOF_BODY "distkernel tunnel"
#define DK_TUNNEL_PROOF_DIR 'T'
#define DK_TUNNEL_HANDSHAKE_S 5.0       /* the gate's wait for a door's answer */
#define DK_TUNNEL_GATE_CAP 4096         /* connections a gate holds at once */
#define DK_TUNNEL_DOOR_CAP 512          /* ... and a door */

typedef struct dk_tunnel_t dk_tunnel_t;

typedef struct {
    unsigned long taken;        /* connections forwarded */
    unsigned long refused;      /* closed before anything was forwarded */
    unsigned long open;         /* connections open now */
} dk_tunnel_stats_t;

/* The kernel's end: listen on ADDR (numeric IPv4 or IPv6, port 0: any free
 * one) and splice each connection that proves KEY (DK_FRAME_KEY_LEN bytes,
 * copied) to UPSTREAM ("127.0.0.1:PORT", "[::1]:PORT"; NULL: none yet,
 * connections are closed). With ALLOW (taken, whatever the result; NULL:
 * any address), a connection from an address not on it is closed as it is
 * accepted, before it is sent anything, as the back channel does
 * (dk_accept.h): a stranger elsewhere on the network gets not even a nonce.
 * NULL with ERR on failure. */
dk_tunnel_t *dk_tunnel_gate_new(const char *addr, const unsigned char *key, const char *upstream,
                                dk_accept_t *allow, char *err, size_t errlen);

/* A node's end: listen on 127.0.0.1 (a free port) and send each connection
 * of this uid's processes to GATE ("HOST:PORT", numeric), proving KEY. */
dk_tunnel_t *dk_tunnel_door_new(const char *gate, const unsigned char *key, char *err,
                                size_t errlen);

/* The port it listens on. */
int dk_tunnel_port(const dk_tunnel_t *self);

/* A gate's upstream from now on (connections already spliced keep theirs);
 * NULL: none. -1 with ERR when it is not a numeric HOST:PORT. */
int dk_tunnel_set_upstream(dk_tunnel_t *self, const char *upstream, char *err, size_t errlen);

void dk_tunnel_stats(dk_tunnel_t *self, dk_tunnel_stats_t *out);

/* Stop its thread and close every connection and the listener. NULL-safe. */
void dk_tunnel_destroy(dk_tunnel_t **self_p);

/* "HOST:PORT" or "[HOST]:PORT", HOST numeric, into a socket address. 0, or
 * -1 with ERR. */
struct sockaddr_storage;
int dk_tunnel_parse_addr(const char *s, struct sockaddr_storage *out, unsigned *outlen, char *err,
                         size_t errlen);

/* The door's answer to NONCE under KEY (a dk_frame key). False when OpenSSL
 * failed. */
bool dk_tunnel_proof(dk_frame_key_t *key, const unsigned char nonce[DK_FRAME_NONCE_LEN],
                     unsigned char out[DK_FRAME_MAC_LEN]);

#endif
