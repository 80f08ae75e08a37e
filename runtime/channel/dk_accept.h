/*
 * dk_accept: who may connect to a back channel over TCP, checked at accept.
 *
 * A back channel for ranks on other nodes listens on the cluster's network
 * (dk_backchan_opts_t.tcp_addr), where any host, and any user of any host,
 * can open connections. A connection earns nothing before its HELLO verifies,
 * but until then it holds a slot and a descriptor, and a stranger opening a
 * few hundred connections a second could keep the run's ranks waiting in the
 * listen backlog (issue 21, item 4). The run knows where its ranks are: the
 * allocation's nodes. So the peer address of each accepted connection is
 * looked up here, right after accept4 and before it takes a slot or is sent a
 * nonce, and a connection from any other address is closed at once: a flood
 * from elsewhere costs an accept and a close each, and no slot.
 *
 * The list is made once, when the run starts, from the nodes' names or
 * addresses (Slurm's NodeAddr, which may be a name), each resolved to every
 * IPv4 and IPv6 address it has (a node reaches the kernel from the address its
 * route picks, which may be any of them). An IPv4-mapped IPv6 peer
 * (::ffff:a.b.c.d) is compared as the IPv4 address it is.
 *
 * What this does not stop: another user on one of the run's own nodes shares
 * that node's address. Against them the back channel's slots are sized for
 * the whole world plus slack and a connection that has not said HELLO gives
 * its slot up when a newer one wants it (dk_backchan_admit.c); the HELLO's MAC is
 * what keeps them from speaking.
 *
 * Bounds: one entry per resolved address, at most DK_ACCEPT_ADDRS_MAX (a
 * 1,024-rank run on 128 nodes has 128 to 256); the check is a linear scan,
 * ~100 ns at 256 entries, cheap beside the accept it follows. Not thread-safe:
 * one thread (the job's poll loop) owns it; resolution blocks (getaddrinfo)
 * and happens only in dk_accept_new.
 */
#ifndef DK_ACCEPT_H
#define DK_ACCEPT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#define DK_ACCEPT_ADDRS_MAX 4096

typedef struct dk_accept_t dk_accept_t;

/* An allow-list of the addresses HOSTS (NHOSTS names or numeric addresses;
 * duplicates are fine) resolve to now. Returns NULL with ERR naming the host
 * when one does not resolve (a node the kernel cannot name is one it cannot
 * tell from a stranger), or when out of memory. */
dk_accept_t *dk_accept_new(const char *const *hosts, size_t nhosts, char *err, size_t errlen);

void dk_accept_destroy(dk_accept_t **self_p);

/* A node that is this host connects from whichever local address its route
 * to the listener picks: the listener's own address (LISTEN_ADDR, numeric),
 * or loopback when it listens there, not the node's NodeAddr. So when any of
 * the list's addresses is one of this host's, LISTEN_ADDR and loopback are
 * added (a stranger on this host is then let in as the node's other users
 * are: see above). Returns false when out of room. */
bool dk_accept_add_this_host(dk_accept_t *self, const char *listen_addr);

/* Whether a peer at SA (LEN bytes, from accept4) is one of the list's
 * addresses; the port is not looked at. A peer of another family than
 * AF_INET/AF_INET6 is not allowed. */
bool dk_accept_allows(const dk_accept_t *self, const struct sockaddr *sa, socklen_t len);

/* How many addresses the list holds. */
size_t dk_accept_count(const dk_accept_t *self);

/* SA's address as text (numeric) into OUT, for what the user is told. */
void dk_accept_peer_text(const struct sockaddr *sa, char *out, size_t outlen);

#endif
