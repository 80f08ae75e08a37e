/*
 * dk_io: all of a buffer written to a descriptor. See the header.
 */
#include "dk_io.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

int dk_write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;     /* took nothing, said nothing: a full file system */
            return -1;
        }
        p += w;
        len -= (size_t) w;
    }
    return 0;
}

/* Wait at most TIMEOUT_MS for FD to take more. 0 when it may; -1 with errno
 * (ETIMEDOUT when it did not within the time). */
static int wait_writable(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int r;
    do
        r = poll(&p, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        errno = ETIMEDOUT;
    /* POLLERR or POLLHUP count as ready: the next send says what broke. */
    return r > 0 ? 0 : -1;
}

int dk_send_all(int fd, const void *buf, size_t len, int timeout_ms)
{
    const char *p = buf;
    int flags = MSG_NOSIGNAL | (timeout_ms >= 0 ? MSG_DONTWAIT : 0);
    while (len > 0) {
        ssize_t w = send(fd, p, len, flags);
        if (w > 0) {
            p += w;
            len -= (size_t) w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && timeout_ms >= 0) {
            if (wait_writable(fd, timeout_ms) < 0)
                return -1;
            continue;
        }
        if (w == 0)
            errno = EPIPE;          /* took nothing, said nothing: treat the peer as gone */
        return -1;
    }
    return 0;
}
