/*
 * dk_netaddr: the address ranks on other nodes reach this host by.
 *
 * The routing table already knows: a UDP socket connected to the first node
 * gets, from the kernel, the source address its packets would leave with
 * (connect on a datagram socket only records the peer; nothing goes on the
 * wire, so this works before any node answers and needs no privilege). An
 * address the user gives is taken as it is, but must be numeric: it is bound,
 * and a name resolving to several addresses would make that a guess.
 */
#include "dk_netaddr.h"
#include "dk_err.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Port 9 (discard): any port does, nothing is sent. */
#define PROBE_PORT "9"

int dk_netaddr_route_to(const char *host, char *out, size_t outlen, char *err, size_t errlen)
{
    if (!host || !*host) {
        dk_set_err(err, errlen, "no node was named to find the route to");
        return -1;
    }
    struct addrinfo hints, *list = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(host, PROBE_PORT, &hints, &list);
    if (rc != 0) {
        dk_set_err(err, errlen, "cannot resolve the node %s (%s); set %s to this host's "
                   "address on the nodes' network", host, gai_strerror(rc), DK_NETADDR_ENV);
        return -1;
    }
    int last_errno = 0;
    for (struct addrinfo *ai = list; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        struct sockaddr_storage local;
        socklen_t len = sizeof local;
        bool ok = connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
                  getsockname(fd, (struct sockaddr *) &local, &len) == 0;
        last_errno = errno;
        close(fd);
        if (!ok)
            continue;
        const void *a = local.ss_family == AF_INET6
                            ? (const void *) &((struct sockaddr_in6 *) &local)->sin6_addr
                            : (const void *) &((struct sockaddr_in *) &local)->sin_addr;
        if (!inet_ntop(local.ss_family, a, out, (socklen_t) outlen)) {
            last_errno = errno;
            continue;
        }
        freeaddrinfo(list);
        return 0;
    }
    freeaddrinfo(list);
    dk_set_err(err, errlen, "this host has no route to the node %s (%s); set %s to this host's "
               "address on the nodes' network", host, strerror(last_errno), DK_NETADDR_ENV);
    return -1;
}

/* ADDR, given by the user, if it is a numeric address: copied into OUT. */
static int given(const char *addr, const char *source, char *out, size_t outlen, char *err,
                 size_t errlen)
{
    unsigned char buf[sizeof(struct in6_addr)];
    if (inet_pton(AF_INET, addr, buf) != 1 && inet_pton(AF_INET6, addr, buf) != 1) {
        dk_set_err(err, errlen, "%s is \"%s\", which is not a numeric IPv4 or IPv6 address; "
                   "give this host's address on the nodes' network, such as 10.0.0.5",
                   source, addr);
        return -1;
    }
    if (strlen(addr) >= outlen) {
        dk_set_err(err, errlen, "%s is too long", source);
        return -1;
    }
    /* The back channel binds it: say now, naming where it came from, when
     * this host has no such address (a value meant for another machine). */
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
    if (getaddrinfo(addr, "0", &hints, &ai) == 0 && ai) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int bound = fd >= 0 ? bind(fd, ai->ai_addr, ai->ai_addrlen) : 0;
        int bind_errno = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        if (bound != 0 && bind_errno == EADDRNOTAVAIL) {
            dk_set_err(err, errlen, "%s is %s, which is not an address of this host; give "
                       "this host's address on the nodes' network (or leave it unset: the "
                       "route to the first node decides)", source, addr);
            return -1;
        }
    }
    memcpy(out, addr, strlen(addr) + 1);
    return 0;
}

/* Whether ADDR (numeric) is a loopback address: 127/8, ::1, or ::ffff:127/104. */
static bool loopback(const char *addr)
{
    struct in_addr v4;
    struct in6_addr v6;
    if (inet_pton(AF_INET, addr, &v4) == 1)
        return (ntohl(v4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, addr, &v6) != 1)
        return false;
    if (IN6_IS_ADDR_LOOPBACK(&v6))
        return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

int dk_netaddr_advertise(const char *option, const char *const *nodes, size_t nnodes, char *out,
                         size_t outlen, char *err, size_t errlen)
{
    if (option && *option)
        return given(option, "advertise_addr", out, outlen, err, errlen);
    const char *env = getenv(DK_NETADDR_ENV);
    if (env && *env)
        return given(env, DK_NETADDR_ENV, out, outlen, err, errlen);
    if (nnodes == 0) {
        dk_set_err(err, errlen, "no node was named to find the route to");
        return -1;
    }
    /* The route to a node that is this host leaves from loopback (a kernel on
     * the allocation's first node, whose name /etc/hosts maps to 127.0.1.1):
     * the other nodes could not reach that, so the route to the first node
     * that is elsewhere decides. Only when every node is this host is
     * loopback the answer. */
    for (size_t i = 0; i < nnodes; i++) {
        if (dk_netaddr_route_to(nodes[i], out, outlen, err, errlen) < 0)
            return -1;
        if (!loopback(out))
            return 0;
    }
    return dk_netaddr_route_to(nodes[0], out, outlen, err, errlen);
}
