/*
 * dk_relay: a node agent's relay of its ranks' back-channel connections.
 *
 * The agent's ranks connect to a Unix socket of the agent's
 * (DISTKERNEL_BC=its path), in a fresh 0700 folder (dk_logdir_socket_dir),
 * instead of each opening a TCP connection to the kernel. The relay carries
 * each such connection's bytes, untouched, on the agent's one connection
 * (DK_FRAME_RELAY frames, dk_frame.h): a stream per rank connection, told to
 * the kernel when it is accepted (an empty RELAY), ended by either side
 * (RELAY_END). The rank's frames keep their MACs over the nonce the kernel
 * sends it through the relay, so the relay does not read them; to the rank
 * the channel is a local one (no heartbeats: the agent watches it), and its
 * fd 1 and 2 stay the agent's pipes, so all its output comes through the
 * agent's OUTPUT frames.
 *
 * Order: before anything read from a stream is passed on, the host drains
 * its ranks' pipes (the BEFORE callback), so what a rank wrote to fd 1 or 2
 * before it sent its answer reaches the kernel before the answer, as over a
 * connection of its own; and before a rank's EXIT the host relays what its
 * streams hold (dk_relay_flush_in), so its answer comes before its exit.
 *
 * Descriptors are non-blocking; what the kernel sends a rank that does not
 * read yet waits in that stream's buffer. One thread; nothing here is
 * thread-safe.
 */
#ifndef DK_RELAY_H
#define DK_RELAY_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dk_relay dk_relay_t;

typedef struct {
    void *data;
    /* Send the kernel a frame of TYPE (DK_FRAME_RELAY, DK_FRAME_RELAY_END) for STREAM. */
    void (*send)(void *data, int type, uint32_t stream, const void *bytes, size_t len);
    /* Called before bytes read from a stream are sent: pass on what the
     * ranks' pipes hold. */
    void (*before)(void *data);
} dk_relay_sink_t;

/* A relay listening for at most MAX_STREAMS connections at once (more are
 * closed as they come). NULL with a reason in ERR. */
dk_relay_t *dk_relay_new(int max_streams, const dk_relay_sink_t *sink, char *err, size_t errlen);

/* Close every stream and the listener; remove the socket and its folder. */
void dk_relay_destroy(dk_relay_t **self_p);

/* What the ranks get in DISTKERNEL_BC: the socket's path (borrowed). */
const char *dk_relay_address(const dk_relay_t *self);

/* Most pollfd entries dk_relay_poll_fill writes. */
size_t dk_relay_max_fds(const dk_relay_t *self);
size_t dk_relay_poll_fill(dk_relay_t *self, struct pollfd *fds);
void dk_relay_poll_handle(dk_relay_t *self, const struct pollfd *fds, size_t n);

/* Pass on everything the streams hold now (called before a rank's EXIT). */
void dk_relay_flush_in(dk_relay_t *self);

/* A RELAY or RELAY_END frame from the kernel for STREAM. */
void dk_relay_from_kernel(dk_relay_t *self, int type, uint32_t stream, const void *bytes,
                          size_t len);

/* Remove the socket and its folder now (nothing will connect any more); the
 * streams and the listener stay open. */
void dk_relay_unlink(dk_relay_t *self);

/* The kernel is gone: remove the socket's folder, close every stream (the
 * ranks read an end of file) and stop listening. */
void dk_relay_end_all(dk_relay_t *self);

#endif
