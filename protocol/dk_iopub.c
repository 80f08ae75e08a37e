/*
 * dk_iopub: serialised publishing on the IOPub socket. See dk_iopub.h for why a
 * mutex and not a publisher thread.
 */
#include "dk_iopub.h"
#include "dk_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define FLUSH_EVERY_MS 2          /* retry of a queue the socket refused */
#define FLUSH_MAX_PAUSE_MS 50     /* ... backing off to this while nothing leaves */
#define DESTROY_FLUSH_MS 1000     /* what the queue gets at exit before it is dropped */

typedef struct queued_t {
    zmsg_t *msg;
    size_t bytes;
    struct queued_t *next;
} queued_t;

struct dk_iopub_t {
    zsock_t *pub;
    const dk_signer_t *signer;
    char *session;
    char *parent;           /* current parent header, JSON text */
    pthread_mutex_t lock;
    int wake[2];            /* a byte: the queue became non-empty, or stopping */
    queued_t *head, *tail;  /* refused messages, oldest first */
    size_t queued, queued_bytes;
    unsigned long long dropped;
    bool stopping, flusher_running;
    pthread_t flusher;
    void *monitor;          /* PAIR receiving the socket's connect/disconnect events */
    atomic_int connections; /* frontends connected (flusher writes, senders read) */
    long long stalled_since_ms;   /* first refusal since the last send; 0 = none */
    unsigned long long passed_over;   /* sends that left a stuck frontend behind */
};

static void set_nodrop(dk_iopub_t *self, int on)
{
    zmq_setsockopt(zsock_resolve(self->pub), ZMQ_XPUB_NODROP, &on, sizeof on);
}

/* Hand MSG to the socket without waiting. Returns 0 (sent; MSG is destroyed) or
 * DK_IOPUB_FULL (refused at the high-water mark; MSG is untouched). A socket
 * refuses a message only on its first frame, so the rest never waits. Lock held. */
static int send_now_locked(dk_iopub_t *self, zmsg_t **msg_p)
{
    zmsg_t *msg = *msg_p;
    size_t n = zmsg_size(msg);
    zframe_t *frame = zmsg_first(msg);
    bool lossy = false;
    for (size_t i = 0; frame; i++, frame = zmsg_next(msg)) {
        int flags = ZFRAME_REUSE | (i + 1 < n ? ZFRAME_MORE : 0) | (i == 0 ? ZFRAME_DONTWAIT : 0);
        if (zframe_send(&frame, self->pub, flags) == 0)
            continue;
        if (i > 0 || (errno != EAGAIN && zmq_errno() != EAGAIN))
            break;   /* the socket is closing; the message is lost with it */
        /* Refused: some frontend's queue is full. With more than one frontend
         * connected and nothing gone out for DK_IOPUB_STUCK_MS, one of them has
         * stopped reading and holds back the rest: this one message goes out
         * lossily, which ZeroMQ drops for the full queue only and so takes that
         * frontend out of the sending set until it reads again (see the header). */
        long long now = dk_now_ms();
        if (!self->stalled_since_ms)
            self->stalled_since_ms = now;
        if (now - self->stalled_since_ms < DK_IOPUB_STUCK_MS ||
            atomic_load(&self->connections) < 2)
            return DK_IOPUB_FULL;
        set_nodrop(self, 0);
        lossy = true;
        if (zframe_send(&frame, self->pub, flags) != 0)
            break;
        self->passed_over++;
    }
    if (lossy)
        set_nodrop(self, 1);
    self->stalled_since_ms = 0;
    zmsg_destroy(msg_p);
    return 0;
}

/* Send what the queue holds, oldest first, until the socket refuses. Lock held. */
static void flush_locked(dk_iopub_t *self)
{
    while (self->head) {
        queued_t *q = self->head;
        if (send_now_locked(self, &q->msg) == DK_IOPUB_FULL)
            return;
        self->head = q->next;
        if (!self->head)
            self->tail = NULL;
        self->queued--;
        self->queued_bytes -= q->bytes;
        free(q);
    }
}

/* Queue MSG behind the others. Past DK_IOPUB_QUEUE_MAX it is dropped, unless it
 * is one the frontend waits for (ALWAYS: status, a cell's result or error), which
 * are small and one or two a request. Lock held. */
static void enqueue_locked(dk_iopub_t *self, zmsg_t **msg_p, bool always)
{
    size_t bytes = zmsg_content_size(*msg_p);
    queued_t *q = malloc(sizeof *q);
    if (!q || (!always && self->queued_bytes + bytes > DK_IOPUB_QUEUE_MAX)) {
        free(q);
        self->dropped++;
        zmsg_destroy(msg_p);
        return;
    }
    q->msg = *msg_p;
    *msg_p = NULL;
    q->bytes = bytes;
    q->next = NULL;
    if (self->tail)
        self->tail->next = q;
    else
        self->head = q;
    self->tail = q;
    self->queued++;
    self->queued_bytes += bytes;
    if (self->queued == 1 && write(self->wake[1], "q", 1) < 0) {
        /* full pipe: the flusher is awake already */
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Count frontends from the monitor's events: each ACCEPTED is one connection
 * and each DISCONNECTED its end (ZeroMQ reports both for every TCP or IPC
 * connection, handshake or not). Flusher thread only. */
static void read_monitor(dk_iopub_t *self)
{
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, self->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            return;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&m) >= 2)
            memcpy(&event, zmq_msg_data(&m), sizeof event);
        bool more = zmq_msg_more(&m);
        zmq_msg_close(&m);
        while (more) {      /* the endpoint frame */
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, self->monitor, 0) < 0) {
                zmq_msg_close(&m);
                break;
            }
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (event == ZMQ_EVENT_ACCEPTED)
            atomic_fetch_add(&self->connections, 1);
        else if (event == ZMQ_EVENT_DISCONNECTED && atomic_load(&self->connections) > 0)
            atomic_fetch_sub(&self->connections, 1);
    }
}

static void *flusher_main(void *arg)
{
    dk_iopub_t *self = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    int pause_ms = FLUSH_EVERY_MS;
    zmq_pollitem_t items[2] = {{self->monitor, 0, ZMQ_POLLIN, 0},
                               {NULL, self->wake[0], ZMQ_POLLIN, 0}};
    int n_items = self->monitor ? 2 : 1;
    zmq_pollitem_t *first = self->monitor ? items : items + 1;
    for (;;) {
        pthread_mutex_lock(&self->lock);
        bool stopping = self->stopping, waiting = self->head != NULL;
        pthread_mutex_unlock(&self->lock);
        if (stopping)
            break;
        /* Asleep while the queue is empty; a slow frontend is retried often,
         * one that has stopped reading costs at most FLUSH_MAX_PAUSE_MS wake-ups. */
        zmq_poll(first, n_items, waiting ? pause_ms : -1);
        if (self->monitor && (items[0].revents & ZMQ_POLLIN))
            read_monitor(self);
        if (items[1].revents & ZMQ_POLLIN) {
            char buf[64];
            while (read(self->wake[0], buf, sizeof buf) > 0)
                ;
        }
        pthread_mutex_lock(&self->lock);
        size_t before = self->queued;
        flush_locked(self);
        if (self->head)
            pause_ms = self->queued < before ? FLUSH_EVERY_MS
                       : pause_ms * 2 > FLUSH_MAX_PAUSE_MS ? FLUSH_MAX_PAUSE_MS : pause_ms * 2;
        pthread_mutex_unlock(&self->lock);
    }
    return NULL;
}

dk_iopub_t *dk_iopub_new(zsock_t *pub, const dk_signer_t *signer, const char *session)
{
    dk_iopub_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->pub = pub;
    self->signer = signer;
    self->session = strdup(session);
    self->parent = strdup("{}");
    self->wake[0] = self->wake[1] = -1;
    pthread_mutex_init(&self->lock, NULL);
    if (!self->session || !self->parent || pipe2(self->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        dk_iopub_destroy(&self);
        return NULL;
    }
    /* Connections are counted so that a stuck frontend is passed over only when
     * there is another to pass it for. The receiving end has no high-water mark:
     * ZeroMQ's I/O thread would otherwise block on a full monitor queue. */
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://dk-iopub-monitor-%p", (void *)self);
    if (zmq_socket_monitor(zsock_resolve(pub), ep, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) == 0) {
        self->monitor = zmq_socket(zsys_init(), ZMQ_PAIR);
        int zero = 0;
        if (self->monitor) {
            zmq_setsockopt(self->monitor, ZMQ_RCVHWM, &zero, sizeof zero);
            zmq_setsockopt(self->monitor, ZMQ_LINGER, &zero, sizeof zero);
            if (zmq_connect(self->monitor, ep) != 0) {
                zmq_close(self->monitor);
                self->monitor = NULL;
            }
        }
        if (!self->monitor)
            zmq_socket_monitor(zsock_resolve(pub), NULL, 0);
    }
    /* Refuse at the high-water mark instead of dropping (see the header), and keep
     * that mark low: what a frontend has not read yet is memory here and delay
     * there, and stream messages are up to DK_STREAM_BUF_MAX bytes. ZeroMQ reads
     * the mark when a frontend connects, which is after this. */
    zsock_set_sndhwm(pub, DK_IOPUB_HWM);
    int one = 1;
    zmq_setsockopt(zsock_resolve(pub), ZMQ_XPUB_NODROP, &one, sizeof one);
    if (pthread_create(&self->flusher, NULL, flusher_main, self) != 0) {
        dk_iopub_destroy(&self);
        return NULL;
    }
    self->flusher_running = true;
    return self;
}

void dk_iopub_destroy(dk_iopub_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_iopub_t *self = *self_p;
    if (self->flusher_running) {
        pthread_mutex_lock(&self->lock);
        self->stopping = true;
        if (write(self->wake[1], "s", 1) < 0) {
            /* full pipe: the flusher wakes anyway */
        }
        pthread_mutex_unlock(&self->lock);
        pthread_join(self->flusher, NULL);
    }
    if (self->monitor) {
        pthread_mutex_lock(&self->lock);    /* the PUB socket is shared */
        zmq_socket_monitor(zsock_resolve(self->pub), NULL, 0);
        pthread_mutex_unlock(&self->lock);
        zmq_close(self->monitor);
    }
    /* The last messages (the idle after shutdown_reply) get a moment to leave. */
    for (int waited = 0;; waited += FLUSH_EVERY_MS) {
        flush_locked(self);
        if (!self->head || waited >= DESTROY_FLUSH_MS)
            break;
        sleep_ms(FLUSH_EVERY_MS);
    }
    while (self->head) {
        queued_t *q = self->head;
        self->head = q->next;
        zmsg_destroy(&q->msg);
        free(q);
    }
    for (int i = 0; i < 2; i++)
        if (self->wake[i] >= 0)
            close(self->wake[i]);
    pthread_mutex_destroy(&self->lock);
    free(self->session);
    free(self->parent);
    free(self);
    *self_p = NULL;
}

void dk_iopub_set_parent(dk_iopub_t *self, const char *parent_json)
{
    char *copy = strdup(parent_json ? parent_json : "{}");
    if (!copy)
        return;
    pthread_mutex_lock(&self->lock);
    free(self->parent);
    self->parent = copy;
    pthread_mutex_unlock(&self->lock);
}

char *dk_iopub_parent(dk_iopub_t *self)
{
    pthread_mutex_lock(&self->lock);
    char *copy = strdup(self->parent);
    pthread_mutex_unlock(&self->lock);
    return copy;
}

const char *dk_iopub_session(const dk_iopub_t *self)
{
    return self->session;
}

/* Build and send one message. OFFER: refuse rather than queue (stream output). */
static int publish(dk_iopub_t *self, const char *msg_type, const char *content_json,
                   const char *metadata_json, const char *parent_json,
                   zframe_t *const *buffers, size_t n_buffers, bool offer)
{
    json_t *header = dk_header_new(msg_type, self->session, "kernel");
    char *header_text = header ? json_dumps(header, JSON_COMPACT) : NULL;
    json_decref(header);
    if (!header_text)
        return -1;

    zframe_t *topic = zframe_new(msg_type, strlen(msg_type));
    pthread_mutex_lock(&self->lock);
    const char *parent = parent_json ? parent_json : self->parent;
    const char *parts[4] = {header_text, parent, metadata_json ? metadata_json : "{}",
                            content_json};
    size_t lens[4];
    for (int i = 0; i < 4; i++)
        lens[i] = strlen(parts[i]);
    zmsg_t *msg = dk_wire_encode_raw(self->signer, &topic, 1, parts, lens, buffers, n_buffers);
    int rc = -1;
    if (msg) {
        flush_locked(self);
        if (!self->head && send_now_locked(self, &msg) == 0)
            rc = DK_IOPUB_SENT;
        else if (offer)
            rc = DK_IOPUB_FULL;
        else {
            bool always = strcmp(msg_type, "status") == 0 || strcmp(msg_type, "error") == 0 ||
                          strcmp(msg_type, "execute_result") == 0 ||
                          strcmp(msg_type, "execute_input") == 0;
            enqueue_locked(self, &msg, always);
            rc = 0;
        }
    }
    pthread_mutex_unlock(&self->lock);
    zmsg_destroy(&msg);
    zframe_destroy(&topic);
    free(header_text);
    return rc;
}

int dk_iopub_publish_text(dk_iopub_t *self, const char *msg_type, const char *content_json,
                          const char *metadata_json, const char *parent_json,
                          zframe_t *const *buffers, size_t n_buffers)
{
    return publish(self, msg_type, content_json, metadata_json, parent_json, buffers,
                   n_buffers, false);
}

int dk_iopub_offer_text(dk_iopub_t *self, const char *msg_type, const char *content_json)
{
    return publish(self, msg_type, content_json, NULL, NULL, NULL, 0, true);
}

size_t dk_iopub_queued(dk_iopub_t *self)
{
    pthread_mutex_lock(&self->lock);
    size_t n = self->queued;
    pthread_mutex_unlock(&self->lock);
    return n;
}

unsigned long long dk_iopub_passed_over(dk_iopub_t *self)
{
    pthread_mutex_lock(&self->lock);
    unsigned long long n = self->passed_over;
    pthread_mutex_unlock(&self->lock);
    return n;
}

int dk_iopub_connections(dk_iopub_t *self)
{
    return atomic_load(&self->connections);
}

unsigned long long dk_iopub_dropped(dk_iopub_t *self)
{
    pthread_mutex_lock(&self->lock);
    unsigned long long n = self->dropped;
    pthread_mutex_unlock(&self->lock);
    return n;
}

int dk_iopub_publish(dk_iopub_t *self, const char *msg_type, json_t *content,
                     const char *parent_json)
{
    char *text = json_dumps(content, JSON_COMPACT);
    if (!text)
        return -1;
    int rc = dk_iopub_publish_text(self, msg_type, text, NULL, parent_json, NULL, 0);
    free(text);
    return rc;
}

int dk_iopub_status(dk_iopub_t *self, const char *state, const char *parent_json)
{
    char content[64];
    snprintf(content, sizeof content, "{\"execution_state\":\"%s\"}", state);
    return dk_iopub_publish_text(self, "status", content, NULL, parent_json, NULL, 0);
}
