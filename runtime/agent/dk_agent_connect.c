/*
 * dk_agent_connect: a node agent's connection to the kernel's back channel,
 * tried until the connect deadline (dk_agent.h's dk_agent_connect).
 */
#include "dk_agent.h"

#include "dk_clock.h"
#include "dk_err.h"
#include "dk_peer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---- connecting ----------------------------------------------------------------- */

/* One try: the connection, or -1 with why in WHY (the system's word, "no
 * answer" past PER_TRY_S), or -2 when ADDRESS can never be reached (WHY says
 * why, whole). */
static int connect_once(const char *address, double per_try_s, char *why, size_t whylen)
{
    if (strncmp(address, "tcp:", 4) != 0) {
        struct sockaddr_un sun = {.sun_family = AF_UNIX};
        if (strlen(address) >= sizeof sun.sun_path) {
            dk_set_err(why, whylen, "the socket path %s is too long", address);
            return -2;
        }
        memcpy(sun.sun_path, address, strlen(address) + 1);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *) &sun, sizeof sun) == 0) {
            /* The kernel's folder may be gone and made again by another
             * user: the agent speaks only to its own (dk_peer.h). */
            if (dk_peer_check(fd, "the back channel's socket", why, whylen) == 0)
                return fd;
            close(fd);
            return -2;
        }
        dk_set_err(why, whylen, "%s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char host[128];
    const char *h = address + 4, *port;
    if (*h == '[') {
        const char *end = strchr(h, ']');
        if (!end || end[1] != ':' || (size_t) (end - h - 1) >= sizeof host) {
            dk_set_err(why, whylen, "%s is not tcp:[ADDR]:PORT", address);
            return -2;
        }
        snprintf(host, sizeof host, "%.*s", (int) (end - h - 1), h + 1);
        port = end + 2;
    } else {
        const char *colon = strrchr(h, ':');
        if (!colon || (size_t) (colon - h) >= sizeof host) {
            dk_set_err(why, whylen, "%s is not tcp:ADDR:PORT", address);
            return -2;
        }
        snprintf(host, sizeof host, "%.*s", (int) (colon - h), h);
        port = colon + 1;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST |
                                                                     AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    int g = getaddrinfo(host, port, &hints, &ai);
    if (g != 0) {
        dk_set_err(why, whylen, "%s is not a numeric address and port: %s", address,
                   gai_strerror(g));
        return -2;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* A node whose packets are dropped would otherwise wait out the
     * system's SYN retries (minutes), past the connect deadline. */
    struct timeval tv = {(time_t) per_try_s,
                         (suseconds_t) ((per_try_s - (double) (time_t) per_try_s) * 1e6)};
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int rc = fd >= 0 ? connect(fd, ai->ai_addr, ai->ai_addrlen) : -1;
    int saved = errno;
    freeaddrinfo(ai);
    if (rc == 0) {
        struct timeval none = {0, 0};
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
        return fd;
    }
    dk_set_err(why, whylen, "%s", saved == EINPROGRESS || saved == ETIMEDOUT || saved == EAGAIN
                                      ? "no answer" : strerror(saved));
    if (fd >= 0)
        close(fd);
    return -1;
}

int dk_agent_connect(const char *address, double deadline_s,
                     unsigned char nonce[DK_FRAME_NONCE_LEN], char *err, size_t errlen)
{
    if (!address || !*address) {
        dk_set_err(err, errlen, "no back-channel address (DISTKERNEL_BC) was given");
        return -1;
    }
    double until = dk_now_s() + deadline_s, wait = 0.05;
    int fd, tries = 0;
    char why[512] = "";
    for (;;) {
        tries++;
        double left = until - dk_now_s();
        fd = connect_once(address, left < 0.5 ? 0.5 : left > 10 ? 10 : left, why, sizeof why);
        if (fd >= 0 || fd == -2 || dk_now_s() + wait > until)
            break;
        struct timespec ts = {(time_t) wait, (long) ((wait - (double) (time_t) wait) * 1e9)};
        nanosleep(&ts, NULL);
        wait = wait * 2 > 1.0 ? 1.0 : wait * 2;
    }
    if (fd == -2) {
        dk_set_err(err, errlen, "%s", why);
        return -1;
    }
    if (fd < 0) {
        /* As a rank says it (python/distkernel/_backchannel.py). */
        bool tcp = strncmp(address, "tcp:", 4) == 0;
        dk_set_err(err, errlen, "could not connect to the kernel's back channel at %s within %g s "
                   "(%d tries; the last: %s)%s", tcp ? address + 4 : address, deadline_s, tries,
                   why, tcp ? "; this node must reach that address and port over TCP (a "
                   "firewall or a route may be in the way, or the kernel is gone)" : "");
        return -1;
    }
    size_t have = 0;
    while (have < DK_FRAME_NONCE_LEN) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        double left = until - dk_now_s();
        int r = poll(&p, 1, left > 0 ? (int) (left * 1000) + 1 : 0);
        if (r < 0 && errno == EINTR)
            continue;
        ssize_t n = r > 0 ? recv(fd, nonce + have, DK_FRAME_NONCE_LEN - have, 0) : -1;
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            dk_set_err(err, errlen, "%s accepted the connection but sent no nonce%s", address,
                       r == 0 ? " in time" : "");
            close(fd);
            return -1;
        }
        have += (size_t) n;
    }
    return fd;
}
