/*
 * dk_sockowner: whose process listens on a loopback port.
 *
 * A server the host starts on a port it picked (dk_server.h) cannot be given
 * that port: the host binds a free one, closes it, and the server binds it
 * seconds later, after its imports. Meanwhile the port number is in the
 * server's command line, in /proc, for anyone to read, and another user who
 * binds 127.0.0.1:N (or 0.0.0.0:N, or [::]:N) first receives every request
 * the host meant for its server. So before the first request the host asks
 * here who listens: the listening sockets that a connection to 127.0.0.1:N
 * can reach are read from /proc/net/tcp and tcp6 (their inodes), and each must
 * be among the sockets open in the server's own processes (/proc/PID/fd ->
 * "socket:[INODE]", PID the server's top process or any descendant). Only the
 * user and root can read another process's fd folder, so a process of someone
 * else never passes.
 *
 * Both files are those of the caller's network namespace, which the server
 * shares; the check is a snapshot, and holds afterwards because a port that a
 * listening socket holds cannot be bound by another user.
 */
#ifndef DK_SOCKOWNER_H
#define DK_SOCKOWNER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* A listening socket that a connection to 127.0.0.1:PORT reaches. */
typedef struct {
    unsigned long inode;
    unsigned uid;           /* its owner, as /proc/net/tcp says */
} dk_listener_t;

/* Read TEXT, the contents of /proc/net/tcp (V6 false) or /proc/net/tcp6 (V6
 * true), for sockets in state LISTEN on PORT whose local address a connection
 * to 127.0.0.1 reaches: 127.0.0.1 or 0.0.0.0; in tcp6 also :: (dual-stack),
 * ::ffff:127.0.0.1 and ::ffff:0.0.0.0. Writes up to CAP of them to OUT and
 * returns how many there are (more than CAP when they did not all fit).
 * Lines it cannot read are skipped. */
size_t dk_sockowner_listeners(const char *text, bool v6, int port, dk_listener_t *out,
                              size_t cap);

/* What dk_sockowner_check found. */
typedef enum {
    DK_SOCKOWNER_FOREIGN = -1,  /* someone else listens (ERR says who) */
    DK_SOCKOWNER_NONE = 0,      /* no one listens yet */
    DK_SOCKOWNER_OURS = 1,      /* every listener is ROOT's or a descendant's */
} dk_sockowner_t;

/* Whether the sockets listening on 127.0.0.1:PORT (as above) all belong to
 * process ROOT or its descendants. DK_SOCKOWNER_FOREIGN fills ERR with what
 * the user needs: the port, and the uid (and name) of the socket's owner.
 * /proc that cannot be read counts as FOREIGN too (ERR says so): the check
 * fails closed. */
dk_sockowner_t dk_sockowner_check(pid_t root, int port, char *err, size_t errlen);

/* Who is at the other end of a loopback connection.
 *
 * A listener on 127.0.0.1 is reachable by every user of the host. For a
 * connection it accepted from 127.0.0.1:PEER_PORT to 127.0.0.1:OUR_PORT, the
 * client's own socket is on this host too, in the same tables: a line whose
 * local address is 127.0.0.1:PEER_PORT and whose remote one is
 * 127.0.0.1:OUR_PORT (in tcp6, as ::ffff:127.0.0.1, for a dual-stack client),
 * and its uid column is the client's owner. */

/* Read TEXT (/proc/net/tcp, or tcp6 when V6) for that line; true with its
 * owner in *UID when there is one. */
bool dk_sockowner_conn_uid(const char *text, bool v6, int peer_port, int our_port,
                           unsigned *uid);

/* The uid of the process at the other end of FD, a TCP connection accepted
 * on 127.0.0.1. 0 with *UID, or -1 with ERR (not a loopback connection, /proc
 * unreadable, no such line: the client is gone); callers refuse on -1. */
int dk_sockowner_peer_uid(int fd, unsigned *uid, char *err, size_t errlen);

#endif
