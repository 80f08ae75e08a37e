/*
 * dk_netaddr: which address of this host ranks on other nodes reach it by.
 *
 * A host has several addresses (loopback, the site's network, a container
 * bridge, a management network); the back channel listens on exactly one
 * (dk_backchan_opts_t), and it must be the one the nodes' packets come back
 * to. The kernel asks the routing table: the source address of a UDP socket
 * connected to the first node (connect sends nothing), unless the user or the
 * site names it (an option, or DISTKERNEL_ADVERTISE_ADDR).
 */
#ifndef DK_NETADDR_H
#define DK_NETADDR_H

#include <stddef.h>

#define DK_NETADDR_ENV "DISTKERNEL_ADVERTISE_ADDR"

/* The local address packets to HOST (a name or a numeric IPv4/IPv6 address)
 * leave from, written numerically (IPv6 without brackets) into OUT. Returns 0,
 * or -1 with ERR naming HOST when it cannot be resolved or has no route. */
int dk_netaddr_route_to(const char *host, char *out, size_t outlen, char *err, size_t errlen);

/* The address to listen on and give the ranks: OPTION (advertise_addr=) when
 * non-empty, else $DISTKERNEL_ADVERTISE_ADDR when non-empty, else the route to
 * the first of NODES (NNODES, in the run's order) that is not reached over
 * loopback (a node that is this host), loopback only when all of them are.
 * A given address must be numeric (the listener binds it). Returns 0, or -1
 * with ERR saying which source was wrong and what to give. */
int dk_netaddr_advertise(const char *option, const char *const *nodes, size_t nnodes, char *out,
                         size_t outlen, char *err, size_t errlen);

#endif
