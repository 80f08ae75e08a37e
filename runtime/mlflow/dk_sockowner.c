/*
 * dk_sockowner: whose process listens on a loopback port. See dk_sockowner.h.
 *
 * Addresses in /proc/net/tcp are the kernel's in-memory words printed with
 * %08X, so a word read back with strtoul equals the word of the address as it
 * lies in memory (network order) on either endianness: the comparisons below
 * are against such words, never against host-order numbers.
 */
#include "dk_sockowner.h"

#include "dk_err.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TCP_LISTEN 0x0A
#define MAX_LISTENERS 16
#define MAX_PROC_FILE (16u << 20)   /* /proc/net/tcp of a very busy host */

/* The word at hex text P (8 digits), or false. */
static bool hex_word(const char *p, uint32_t *w)
{
    char buf[9];
    for (int i = 0; i < 8; i++) {
        if (!isxdigit((unsigned char) p[i]))
            return false;
        buf[i] = p[i];
    }
    buf[8] = '\0';
    *w = (uint32_t) strtoul(buf, NULL, 16);
    return true;
}

/* Whether the local address of 8 (v4) or 32 (v6) hex digits at P is one a
 * connection to 127.0.0.1 reaches. */
static bool reaches_loopback(const char *p, bool v6)
{
    uint32_t lo = htonl(INADDR_LOOPBACK), any = htonl(INADDR_ANY);
    uint32_t w[4];
    for (int i = 0; i < (v6 ? 4 : 1); i++)
        if (!hex_word(p + 8 * i, &w[i]))
            return false;
    if (!v6)
        return w[0] == lo || w[0] == any;
    if (w[0] != 0 || w[1] != 0)
        return false;
    if (w[2] == 0)                              /* :: (the v4 part is zero too) */
        return w[3] == 0;
    return w[2] == htonl(0xffff) && (w[3] == lo || w[3] == any);   /* ::ffff:a.b.c.d */
}

/* The next socket's line of a /proc/net/tcp text: its local address (the
 * text after "  sl: "), with *LINE moved to the line after it; NULL at the
 * end. Start with *LINE = TEXT: the header is skipped. A line without "sl:"
 * gives "" (no field of it matches). Lines are
 * "  sl: LOCAL:PORT REMOTE:PORT st tx:rx tr:when retr uid timeout inode ...". */
static const char *next_socket(const char **line, const char *text)
{
    if (*line == text)
        *line = text ? strchr(text, '\n') : NULL;         /* the header */
    if (!*line || !*++*line)
        return NULL;
    const char *here = *line, *next = strchr(here, '\n');
    *line = next;       /* NULL after the last line */
    const char *p = strchr(here, ':');
    if (!p || (next && p > next))
        return "";
    for (p++; *p == ' '; p++) {
    }
    return p;
}

size_t dk_sockowner_listeners(const char *text, bool v6, int port, dk_listener_t *out,
                              size_t cap)
{
    size_t found = 0, addr_len = v6 ? 32 : 8;
    const char *line = text, *local;
    while ((local = next_socket(&line, text))) {
        const char *p = local;
        char *end;
        unsigned long lport = 0, st = 0, uid = 0, inode = 0;
        bool ok = strlen(local) > addr_len + 1 && local[addr_len] == ':';
        if (ok) {
            lport = strtoul(local + addr_len + 1, &end, 16);
            ok = *end == ' ';
            p = end;
        }
        if (ok) {                       /* the remote address */
            while (*p == ' ')
                p++;
            p = strchr(p, ' ');
            ok = p != NULL;
        }
        if (ok) {
            st = strtoul(p, &end, 16);
            /* tx:rx, tr:when, retransmits, then uid, timeout, inode */
            int fields = sscanf(end, " %*x:%*x %*x:%*x %*x %lu %*d %lu", &uid, &inode);
            ok = fields == 2;
        }
        if (ok && st == TCP_LISTEN && (int) lport == port && reaches_loopback(local, v6)) {
            if (found < cap)
                out[found] = (dk_listener_t){.inode = inode, .uid = (unsigned) uid};
            found++;
        }
    }
    return found;
}

/* The port at hex text P (after "ADDR:"), or -1 when it is not " "-ended. */
static long hex_port(const char *p)
{
    char *end;
    unsigned long port = strtoul(p, &end, 16);
    return end != p && *end == ' ' && port <= 65535 ? (long) port : -1;
}

/* Whether the 8 (v4) or 32 (v6) hex digits at P are 127.0.0.1 (in v6, as
 * ::ffff:127.0.0.1). */
static bool is_loopback_v4(const char *p, bool v6)
{
    uint32_t w[4];
    for (int i = 0; i < (v6 ? 4 : 1); i++)
        if (!hex_word(p + 8 * i, &w[i]))
            return false;
    if (!v6)
        return w[0] == htonl(INADDR_LOOPBACK);
    return w[0] == 0 && w[1] == 0 && w[2] == htonl(0xffff) && w[3] == htonl(INADDR_LOOPBACK);
}

bool dk_sockowner_conn_uid(const char *text, bool v6, int peer_port, int our_port,
                           unsigned *uid)
{
    size_t addr_len = v6 ? 32 : 8;
    const char *line = text, *local;
    while ((local = next_socket(&line, text))) {
        if (strlen(local) > addr_len + 1) {
            const char *remote = local + addr_len + 1;
            while (*remote && *remote != ' ')
                remote++;
            while (*remote == ' ')
                remote++;
            unsigned long owner;
            if (strlen(local) > addr_len + 1 && local[addr_len] == ':' &&
                strlen(remote) > addr_len + 1 && remote[addr_len] == ':' &&
                is_loopback_v4(local, v6) && is_loopback_v4(remote, v6) &&
                hex_port(local + addr_len + 1) == peer_port &&
                hex_port(remote + addr_len + 1) == our_port &&
                sscanf(strchr(remote, ' '), " %*x %*x:%*x %*x:%*x %*x %lu", &owner) == 1) {
                *uid = (unsigned) owner;
                return true;
            }
        }
    }
    return false;
}

/* The whole of /proc file PATH (malloc'd, NUL-terminated), or NULL. */
static char *slurp(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (len + 1 >= cap) {
            char *bigger = cap < MAX_PROC_FILE ? realloc(buf, cap * 2) : NULL;
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0) {
                free(buf);
                buf = NULL;
            }
            break;
        }
        len += (size_t) n;
    }
    close(fd);
    if (buf)
        buf[len] = '\0';
    return buf;
}

/* The parent of PID from /proc/PID/stat, or -1. */
static pid_t parent_of(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')');    /* the name may hold anything */
    int ppid;
    if (!close_paren || sscanf(close_paren + 1, " %*c %d", &ppid) != 1)
        return -1;
    return (pid_t) ppid;
}

/* Whether PID is ROOT or descends from it. */
static bool in_tree(pid_t pid, pid_t root)
{
    for (int depth = 0; pid > 1 && depth < 64; depth++) {
        if (pid == root)
            return true;
        pid = parent_of(pid);
    }
    return pid == root;
}

/* Whether PID has socket INODE open. */
static bool holds(pid_t pid, unsigned long inode)
{
    char path[64], want[48], link[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int) pid);
    snprintf(want, sizeof want, "socket:[%lu]", inode);
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        ssize_t n = readlinkat(dirfd(d), e->d_name, link, sizeof link - 1);
        if (n > 0) {
            link[n] = '\0';
            found = strcmp(link, want) == 0;
        }
    }
    closedir(d);
    return found;
}

/* Whether a process of ROOT's tree holds socket INODE. */
static bool tree_holds(pid_t root, unsigned long inode)
{
    DIR *d = opendir("/proc");
    if (!d)
        return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        found = in_tree((pid_t) pid, root) && holds((pid_t) pid, inode);
    }
    closedir(d);
    return found;
}

dk_sockowner_t dk_sockowner_check(pid_t root, int port, char *err, size_t errlen)
{
    dk_listener_t l[MAX_LISTENERS];
    size_t n = 0;
    static const char *const files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int v6 = 0; v6 < 2; v6++) {
        char *text = slurp(files[v6]);
        if (!text && !(v6 && errno == ENOENT)) {    /* no tcp6 without IPv6 */
            dk_set_err(err, errlen, "cannot read %s to see who listens on 127.0.0.1:%d: %s",
                       files[v6], port, strerror(errno));
            return DK_SOCKOWNER_FOREIGN;
        }
        if (text)
            n += dk_sockowner_listeners(text, v6, port, l + (n < MAX_LISTENERS ? n : 0),
                                        n < MAX_LISTENERS ? MAX_LISTENERS - n : 0);
        free(text);
    }
    if (n == 0)
        return DK_SOCKOWNER_NONE;
    if (n > MAX_LISTENERS) {
        dk_set_err(err, errlen, "%zu sockets listen on 127.0.0.1:%d", n, port);
        return DK_SOCKOWNER_FOREIGN;
    }
    for (size_t i = 0; i < n; i++) {
        if (tree_holds(root, l[i].inode))
            continue;
        struct passwd pw, *found = NULL;
        char buf[1024];
        getpwuid_r(l[i].uid, &pw, buf, sizeof buf, &found);
        char who[300];
        if (l[i].uid == getuid())
            snprintf(who, sizeof who, "another process of yours (uid %u)", l[i].uid);
        else
            snprintf(who, sizeof who, "another user, uid %u%s%s%s", l[i].uid,
                     found ? " (" : "", found ? found->pw_name : "", found ? ")" : "");
        dk_set_err(err, errlen, "127.0.0.1:%d is held by %s, not by the server this "
                                "process started", port, who);
        return DK_SOCKOWNER_FOREIGN;
    }
    return DK_SOCKOWNER_OURS;
}

int dk_sockowner_peer_uid(int fd, unsigned *uid, char *err, size_t errlen)
{
    struct sockaddr_in ours, peer;
    socklen_t ol = sizeof ours, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *) &ours, &ol) < 0 ||
        getpeername(fd, (struct sockaddr *) &peer, &pl) < 0) {
        dk_set_err(err, errlen, "cannot see the connection's ends: %s", strerror(errno));
        return -1;
    }
    if (ours.sin_family != AF_INET || peer.sin_family != AF_INET ||
        ours.sin_addr.s_addr != htonl(INADDR_LOOPBACK) ||
        peer.sin_addr.s_addr != htonl(INADDR_LOOPBACK)) {
        dk_set_err(err, errlen, "not a connection over 127.0.0.1");
        return -1;
    }
    int peer_port = ntohs(peer.sin_port), our_port = ntohs(ours.sin_port);
    static const char *const files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    for (int v6 = 0; v6 < 2; v6++) {
        char *text = slurp(files[v6]);
        if (!text && !(v6 && errno == ENOENT)) {
            dk_set_err(err, errlen, "cannot read %s to see who connected from 127.0.0.1:%d: %s",
                       files[v6], peer_port, strerror(errno));
            return -1;
        }
        bool found = text && dk_sockowner_conn_uid(text, v6, peer_port, our_port, uid);
        free(text);
        if (found)
            return 0;
    }
    dk_set_err(err, errlen, "no socket of this host is connected from 127.0.0.1:%d", peer_port);
    return -1;
}
