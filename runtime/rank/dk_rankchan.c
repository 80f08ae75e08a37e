/*
 * dk_rankchan: a remote rank's sending side, with heartbeats that need no
 * GIL. See the header.
 *
 * Why in C: the rank's PINGs and output used to go from a Python thread, and
 * a thread runs Python only while it holds the GIL. A main thread in a C call
 * that keeps the GIL (an extension that never releases it, ctypes.PyDLL, a
 * long pure-C loop in a module) silenced the heartbeats, and past the
 * deadline the kernel counted a live rank lost and ended the job; and if that
 * call wrote more than a pipe holds (64 KiB) to fd 1 or 2, it blocked for
 * good on a pipe only that Python thread could empty. Here a
 * pthread sends the PINGs and reads the pipes, and never touches Python.
 *
 * The two senders share one socket and one sequence number (every frame's MAC
 * covers its seq, and the kernel expects them in order), so a mutex guards
 * both, and a frame is written whole under it: a PING is never spliced into
 * the middle of a large RESULT. Python's send releases the GIL before it
 * takes the mutex, so a PING waiting for the socket never holds up Python,
 * and the pinger never waits for the GIL.
 *
 * A kernel that takes no byte for the heartbeat deadline is gone (killed, its
 * node lost, the network cut): Python's send then raises TimeoutError and
 * _backchannel.py ends the rank; the pinger, which has no one to tell, says
 * one line on the launcher's stderr and ends the rank's process group itself,
 * as _backchannel.py's _silent does. A broken connection (EPIPE, reset: the
 * kernel closed it, or was SIGKILLed) stops the pings; the Python thread
 * reading the socket sees the close and acts on it, but not while the main
 * thread holds the GIL, so the pinger also ends the rank when the connection
 * has been broken for the deadline and the rank is still here (a rank told
 * to stop by a close exits by itself well before; _backchannel.py allows the
 * same).
 *
 * Frames are sealed by dk_frame (runtime/channel/, compiled in), with the
 * key's HMAC set up once at attach: a PING or a line of output costs its own
 * bytes' hashing, not the key's setup again.
 *
 * After fork() the child has no pinger and must not wait on a mutex the
 * pinger held at the fork: an atfork handler detaches the child.
 */
#include "dk_rankchan.h"
#include "dk_backchan.h"
#include "dk_be32.h"
#include "dk_frame.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static struct {
    pthread_mutex_t lock;       /* the socket's sending side and seq */
    int fd;                     /* -1: not attached */
    int silent_fd;
    dk_frame_key_t *key;        /* the job's key, set up at attach */
    dk_frame_side_t side;       /* our nonce and count, sealing toward the kernel */
    uint32_t rank;
    double deadline;
    bool running;               /* the thread exists */
    bool broken;                /* a send failed: the connection is gone */
    double broken_at;
    double interval;
    pthread_t thread;
    /* The rank's fd 1 and 2 are pipes whose read ends are here ([1], [2]; -1
     * at EOF). OUT_LOCK is held from a read until its frame is written, so
     * output goes out in the order it was read; it is taken before LOCK. */
    pthread_mutex_t out_lock;
    int pipes[3];
} ch = {.lock = PTHREAD_MUTEX_INITIALIZER, .out_lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1,
        .silent_fd = -1, .pipes = {-1, -1, -1}};

static bool atfork_set;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* In the child of a fork: nothing here is ours any more. */
static void atfork_child(void)
{
    pthread_mutex_init(&ch.lock, NULL);
    pthread_mutex_init(&ch.out_lock, NULL);
    ch.fd = -1;
    ch.running = false;
}

/* Write one frame of type KIND with PAYLOAD, whole. Call with ch.lock held.
 * Returns 0; -1 with errno when the connection broke; -2 when the kernel took
 * no byte for the deadline. */
static int write_frame(int kind, const unsigned char *payload, size_t len)
{
    /* The frame's head (length, MAC, type, rank) here; the payload is sent
     * from where it lies. */
    unsigned char body[DK_FRAME_BODY_HEAD], head[DK_FRAME_HEAD];
    body[0] = (unsigned char) kind;
    dk_put_be32(body + 1, ch.rank);
    if (dk_frame_seal_head(&ch.side, body, sizeof body, payload, len, head) != sizeof head) {
        errno = EPROTO;
        return -1;
    }
    size_t at = 0, total = sizeof head + len;
    while (at < total) {
        struct iovec part[2];
        int n = 0;
        if (at < sizeof head)
            part[n++] = (struct iovec){head + at, sizeof head - at};
        size_t pay_at = at > sizeof head ? at - sizeof head : 0;
        if (len > pay_at)
            part[n++] = (struct iovec){(unsigned char *) payload + pay_at, len - pay_at};
        struct msghdr msg = {.msg_iov = part, .msg_iovlen = (size_t) n};
        ssize_t w = sendmsg(ch.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            at += (size_t) w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* A kernel that takes no byte for the deadline is as gone as one
             * that says nothing (however long the whole frame takes). */
            struct pollfd p = {.fd = ch.fd, .events = POLLOUT};
            int r;
            do
                r = poll(&p, 1, (int) (ch.deadline * 1000));
            while (r < 0 && errno == EINTR);
            if (r == 0)
                return -2;
            if (r < 0)
                return -1;
            continue;
        }
        if (w == 0)
            errno = EPIPE;
        return -1;
    }
    return 0;
}

/* The kernel took nothing for the deadline, or closed the connection that
 * long ago (CLOSED): it is gone. Nothing of this rank may outlive it (as
 * _backchannel.py's _silent). */
static void kernel_gone(bool closed)
{
    char line[200];
    int n = snprintf(line, sizeof line, "distkernel: rank %u: %s %.1f s%s; ending this rank\n",
                     ch.rank, closed ? "the kernel closed the back channel" :
                     "the kernel took nothing for", ch.deadline, closed ? " ago" : "");
    if (ch.silent_fd >= 0 && n > 0 && write(ch.silent_fd, line, (size_t) n) < 0)
        n = 0;
    killpg(getpgrp(), SIGKILL);
    _exit(1);
}

/* Send one frame from the thread or flush(): a broken connection is noted
 * (the reading side acts on it), a kernel taking nothing for the deadline
 * ends the rank. Takes LOCK. */
static void send_noted(int kind, const unsigned char *payload, size_t len)
{
    pthread_mutex_lock(&ch.lock);
    int rc = ch.fd >= 0 && !ch.broken ? write_frame(kind, payload, len) : 0;
    if (rc == -1) {
        ch.broken = true;
        ch.broken_at = now_s();
    }
    pthread_mutex_unlock(&ch.lock);
    if (rc == -2)
        kernel_gone(false);
}

/* Pass on what pipe FD (1 or 2) holds: one read, or (DRAIN) until it is
 * empty. Once the connection is gone, what is read is dropped, so that the
 * rank's writers never block on a full pipe. Takes OUT_LOCK. */
static void pump(int fd, bool drain)
{
    static unsigned char buf[2 + DK_BC_OUTPUT_MAX];
    pthread_mutex_lock(&ch.out_lock);
    while (ch.pipes[fd] >= 0) {
        ssize_t n = read(ch.pipes[fd], buf + 2, DK_BC_OUTPUT_MAX);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;      /* EAGAIN: empty */
        if (n == 0) {
            close(ch.pipes[fd]);
            ch.pipes[fd] = -1;
            break;
        }
        buf[0] = (unsigned char) fd;
        buf[1] = (size_t) n < DK_BC_OUTPUT_MAX ? DK_BC_OUTPUT_CAUGHT_UP : 0;
        send_noted(DK_BC_OUTPUT, buf, 2 + (size_t) n);
        if (!drain)
            break;
    }
    pthread_mutex_unlock(&ch.out_lock);
}

/* The native thread: fd 1 and 2 as OUTPUT frames, and a PING every interval,
 * without the GIL. */
static void *pinger(void *arg)
{
    (void) arg;
    /* Signals are the main thread's (SIGINT is the user's KeyboardInterrupt). */
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL);
    double next = now_s() + ch.interval;
    for (;;) {
        pthread_mutex_lock(&ch.lock);
        bool gone = ch.fd >= 0 && ch.broken && now_s() - ch.broken_at > ch.deadline;
        pthread_mutex_unlock(&ch.lock);
        if (gone)
            kernel_gone(true);
        double left = next - now_s();
        if (left <= 0) {
            next = now_s() + ch.interval;
            send_noted(DK_BC_PING, NULL, 0);
            continue;
        }
        pthread_mutex_lock(&ch.out_lock);       /* flush() may close one at EOF */
        struct pollfd p[3] = {{-1, 0, 0}, {ch.pipes[1], POLLIN, 0}, {ch.pipes[2], POLLIN, 0}};
        pthread_mutex_unlock(&ch.out_lock);
        int r = poll(p, 3, (int) (left * 1000) + 1);
        if (r < 0 && errno != EINTR)
            break;
        for (int fd = 1; r > 0 && fd <= 2; fd++) {
            if (p[fd].revents)
                pump(fd, false);
        }
    }
    return NULL;
}

static PyObject *py_attach(PyObject *self, PyObject *args)
{
    (void) self;
    int fd, silent_fd;
    Py_buffer key, nonce;
    unsigned long rank, seq;
    double deadline;
    if (!PyArg_ParseTuple(args, "iy*y*kkdi", &fd, &key, &nonce, &rank, &seq, &deadline,
                          &silent_fd))
        return NULL;
    PyObject *ret = NULL;
    dk_frame_key_t *fkey = NULL;
    if (key.len != DK_FRAME_KEY_LEN || nonce.len != DK_FRAME_NONCE_LEN) {
        PyErr_Format(PyExc_ValueError, "key and nonce must be %d bytes each", DK_FRAME_KEY_LEN);
    } else if (ch.fd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "the back channel is attached already");
    } else if (!(fkey = dk_frame_key_new(key.buf))) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL has no HMAC");
    } else {
        if (!atfork_set && pthread_atfork(NULL, NULL, atfork_child) == 0)
            atfork_set = true;
        pthread_mutex_lock(&ch.lock);
        dk_frame_key_destroy(&ch.key);     /* an earlier attach's (before a fork, a stop) */
        ch.key = fkey;
        dk_frame_side_init(&ch.side, fkey, nonce.buf, DK_BC_DIR_TO_RUNTIME);
        ch.side.seq_out = (uint32_t) seq;
        ch.rank = (uint32_t) rank;
        ch.deadline = deadline > 0 ? deadline : 5.0;
        ch.silent_fd = silent_fd;
        ch.fd = fd;
        pthread_mutex_unlock(&ch.lock);
        ret = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&nonce);
    return ret;
}

static PyObject *py_send(PyObject *self, PyObject *args)
{
    (void) self;
    int kind;
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "iy*", &kind, &payload))
        return NULL;
    int rc, saved = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&ch.lock);
    if (ch.fd < 0) {
        rc = -1;
        saved = EBADF;
    } else {
        rc = write_frame(kind, payload.buf, (size_t) payload.len);
        saved = errno;
    }
    pthread_mutex_unlock(&ch.lock);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&payload);
    if (rc == -2) {
        PyErr_Format(PyExc_TimeoutError, "the kernel took nothing for %.1f s", ch.deadline);
        return NULL;
    }
    if (rc < 0) {
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *py_start(PyObject *self, PyObject *args)
{
    (void) self;
    double interval;
    int out_fd, err_fd;
    if (!PyArg_ParseTuple(args, "dii", &interval, &out_fd, &err_fd))
        return NULL;
    int err = 0;
    if (ch.fd < 0) {
        err = EBADF;
    } else if (!ch.running) {
        ch.pipes[1] = out_fd;
        ch.pipes[2] = err_fd;
        ch.interval = interval > 0 ? interval : 1.0;
        ch.broken = false;
        err = pthread_create(&ch.thread, NULL, pinger, NULL);
        ch.running = err == 0;
        if (!err)
            pthread_detach(ch.thread);      /* it runs until the process ends */
    }
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *py_flush(PyObject *self, PyObject *args)
{
    (void) self;
    (void) args;
    Py_BEGIN_ALLOW_THREADS
    pump(1, true);
    pump(2, true);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_stop(PyObject *self, PyObject *args)
{
    (void) self;
    (void) args;
    /* Detach: no frame after this (our end is shut next, and Python closes
     * the socket: never write to a reused fd). The thread goes on reading the
     * pipes and dropping what it reads, so that whatever still writes to fd
     * 1 or 2 (Python's finalization, a child) never blocks on a full pipe. */
    pthread_mutex_lock(&ch.lock);
    ch.fd = -1;
    pthread_mutex_unlock(&ch.lock);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"attach", py_attach, METH_VARARGS, "Take over sending on the back channel's socket."},
    {"send", py_send, METH_VARARGS, "Send one frame, whole."},
    {"start", py_start, METH_VARARGS, "Output and PINGs from a native thread."},
    {"flush", py_flush, METH_NOARGS, "Send what fd 1 and 2 hold now."},
    {"stop", py_stop, METH_NOARGS, "No more frames: detach (the pipes are still drained)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, DK_RANKCHAN_MODULE,
    "A remote rank's back-channel sending side, with heartbeats that need no GIL.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyObject *dk_rankchan_init(void)
{
    return PyModule_Create(&module);
}
