/*
 * dk_peer: whether the process at the other end of a Unix socket is our own
 * user's.
 *
 * distkernel's Unix sockets (the back channel, a node agent's relay, a
 * warm-start template) live in fresh 0700 folders, so only their user can
 * reach them while they exist. But a folder is removed when its owner is done
 * (a node agent whose kernel went away removes its relay's and template's at
 * once), and a rank still starting then connects by path to whatever is there
 * now: another user of the node can have made the folder again and bound a
 * socket in it, and the rank would hand that user its environment (the run's
 * key, an exported HF_TOKEN) and its output descriptors. So every connect to
 * such a socket, and every accept on one, asks the kernel who the peer is
 * (SO_PEERCRED: its effective uid when it called connect or listen) and
 * speaks only to our own uid.
 */
#ifndef DK_PEER_H
#define DK_PEER_H

#include <stddef.h>

/* 0 when the peer of connected Unix socket FD runs as this process's
 * effective uid; -1 otherwise, with why in ERR naming WHAT (e.g. "the
 * warm-start template's socket at /tmp/..."): another user's uid, or the
 * system's error when the peer cannot be asked. */
int dk_peer_check(int fd, const char *what, char *err, size_t errlen);

#endif
