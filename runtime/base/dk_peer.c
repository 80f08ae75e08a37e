/*
 * dk_peer: whether a Unix socket's peer is our own user's. See the header.
 */
#include "dk_peer.h"

#include "dk_err.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int dk_peer_check(int fd, const char *what, char *err, size_t errlen)
{
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || len != sizeof cred) {
        dk_set_err(err, errlen, "%s: cannot tell whose it is (%s)", what,
                   strerror(len != sizeof cred ? EPROTO : errno));
        return -1;
    }
    if (cred.uid == geteuid())
        return 0;
    dk_set_err(err, errlen, "%s belongs to another user (uid %u, pid %d); nothing was sent to it",
               what, (unsigned) cred.uid, (int) cred.pid);
    errno = EACCES;
    return -1;
}
