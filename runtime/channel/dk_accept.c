/*
 * dk_accept: the allow-list of peer addresses (see dk_accept.h).
 *
 * Addresses are kept as 16 bytes each, IPv4 in its IPv4-mapped IPv6 form, so
 * one comparison serves both families and a mapped peer matches its IPv4
 * node.
 */
#include "dk_accept.h"
#include "dk_err.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    unsigned char b[16];
} addr16_t;

struct dk_accept_t {
    addr16_t *addrs;
    size_t n, cap;
};

/* SA's address as 16 bytes (IPv4 mapped); false for another family. */
static bool to16(const struct sockaddr *sa, socklen_t len, addr16_t *out)
{
    memset(out, 0, sizeof *out);
    if (sa->sa_family == AF_INET && len >= (socklen_t) sizeof(struct sockaddr_in)) {
        out->b[10] = out->b[11] = 0xff;
        memcpy(out->b + 12, &((const struct sockaddr_in *) sa)->sin_addr, 4);
        return true;
    }
    if (sa->sa_family == AF_INET6 && len >= (socklen_t) sizeof(struct sockaddr_in6)) {
        memcpy(out->b, &((const struct sockaddr_in6 *) sa)->sin6_addr, 16);
        return true;
    }
    return false;
}

static bool add(dk_accept_t *self, const addr16_t *a)
{
    for (size_t i = 0; i < self->n; i++)
        if (!memcmp(self->addrs[i].b, a->b, 16))
            return true;
    if (self->n == self->cap) {
        size_t cap = self->cap ? 2 * self->cap : 16;
        if (cap > DK_ACCEPT_ADDRS_MAX)
            return false;
        addr16_t *grown = realloc(self->addrs, cap * sizeof *grown);
        if (!grown)
            return false;
        self->addrs = grown;
        self->cap = cap;
    }
    self->addrs[self->n++] = *a;
    return true;
}

dk_accept_t *dk_accept_new(const char *const *hosts, size_t nhosts, char *err, size_t errlen)
{
    dk_accept_t *self = calloc(1, sizeof *self);
    if (!self) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < nhosts; i++) {
        struct addrinfo hints, *ai = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        int rc = hosts[i] ? getaddrinfo(hosts[i], NULL, &hints, &ai) : EAI_NONAME;
        if (rc != 0) {
            dk_set_err(err, errlen, "the node '%s' does not resolve to an address (%s), so "
                       "its ranks' connections could not be told from a stranger's",
                       hosts[i] ? hosts[i] : "(none)", gai_strerror(rc));
            dk_accept_destroy(&self);
            return NULL;
        }
        bool ok = true;
        for (struct addrinfo *p = ai; p && ok; p = p->ai_next) {
            addr16_t a;
            if (to16(p->ai_addr, p->ai_addrlen, &a))
                ok = add(self, &a);
        }
        freeaddrinfo(ai);
        if (!ok) {
            dk_set_err(err, errlen, "the run's nodes have more than %d addresses, or memory "
                       "ran out", DK_ACCEPT_ADDRS_MAX);
            dk_accept_destroy(&self);
            return NULL;
        }
    }
    return self;
}

void dk_accept_destroy(dk_accept_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->addrs);
    free(*self_p);
    *self_p = NULL;
}

/* Whether A is an address of this host: one a socket can bind. */
static bool is_local(const addr16_t *a)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    if (!memcmp(a->b, mapped, 12)) {
        struct sockaddr_in *in = (struct sockaddr_in *) &ss;
        in->sin_family = AF_INET;
        memcpy(&in->sin_addr, a->b + 12, 4);
        len = sizeof *in;
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *) &ss;
        in6->sin6_family = AF_INET6;
        memcpy(&in6->sin6_addr, a->b, 16);
        len = sizeof *in6;
    }
    int fd = socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    bool local = fd >= 0 && bind(fd, (struct sockaddr *) &ss, len) == 0;
    if (fd >= 0)
        close(fd);
    return local;
}

static bool add_numeric(dk_accept_t *self, const char *text)
{
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_NUMERICHOST;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(text, NULL, &hints, &ai) != 0)
        return true;    /* not an address: nothing to add */
    addr16_t a;
    bool ok = !to16(ai->ai_addr, ai->ai_addrlen, &a) || add(self, &a);
    freeaddrinfo(ai);
    return ok;
}

bool dk_accept_add_this_host(dk_accept_t *self, const char *listen_addr)
{
    bool any = false;
    for (size_t i = 0; i < self->n && !any; i++)
        any = is_local(&self->addrs[i]);
    if (!any)
        return true;
    return add_numeric(self, listen_addr) && add_numeric(self, "127.0.0.1") &&
           add_numeric(self, "::1");
}

bool dk_accept_allows(const dk_accept_t *self, const struct sockaddr *sa, socklen_t len)
{
    addr16_t a;
    if (!to16(sa, len, &a))
        return false;
    for (size_t i = 0; i < self->n; i++)
        if (!memcmp(self->addrs[i].b, a.b, 16))
            return true;
    return false;
}

size_t dk_accept_count(const dk_accept_t *self)
{
    return self->n;
}

void dk_accept_peer_text(const struct sockaddr *sa, char *out, size_t outlen)
{
    char text[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *) sa)->sin_addr, text, sizeof text);
    else if (sa->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *) sa)->sin6_addr, text, sizeof text);
    snprintf(out, outlen, "%s", text);
}
