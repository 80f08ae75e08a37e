/*
 * dk_stackreq: ask the ranks for their stacks. See the header.
 *
 * Each rank's file only grows: the ready line, then one dump and its end
 * line per signal (ours, or one the user sent by hand). A request remembers
 * where the file ended when it signalled, and what follows is the answer.
 * The files are opened only while a request runs, so a job of many ranks
 * holds no descriptor for them in between.
 *
 * An end asks a rank that has a sampler thread through it first, as a live
 * sample does: that answer is made with the GIL, so it can carry the rank's
 * last collective (torch's flight recorder, python/distkernel/_flight.py),
 * which faulthandler's handler, without the GIL, cannot read. A rank whose
 * sampler has written nothing by a quarter of the wait (its main thread
 * holds the GIL in a C loop) gets the end's signal then, and answers
 * without it; the wait as a whole is the same.
 */
#include "dk_stackreq.h"

#include "dk_err.h"
#include "dk_logdir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct {
    char *path;
    pid_t pid;              /* from the ready line; 0 until it is read */
    pid_t sampler;          /* the thread that takes samples (ready line); 0: none */
    off_t read_at;          /* the file's bytes consumed */
    int fd;                 /* open while asked in a running request */
    bool asked;             /* in the last request */
    bool pending;           /* asked, not yet answered or gone */
    bool by_channel;        /* asked over the back channel: answered by dk_stackreq_answer */
    bool fallback;          /* an end asked its sampler: the signal follows if it is silent */
    pid_t group;            /* the process group it was asked in */
    char *dump;             /* what it wrote for the last request, its tail */
    size_t len;
    size_t cap;             /* DUMP's size: grown as answers come, up to KEEP + 1 */
} slot_t;

struct dk_stackreq_t {
    char *dir;
    int world;
    slot_t *slots;
    bool running;
    double until;
    double fallback_at;     /* when an end signals the ranks whose sampler is silent */
};

dk_stackreq_t *dk_stackreq_new(int world, char *err, size_t errlen)
{
    dk_stackreq_t *self = calloc(1, sizeof *self);
    if (!self || world < 1 || !(self->slots = calloc((size_t) world, sizeof *self->slots))) {
        dk_set_err(err, errlen, world < 1 ? "no ranks to ask for stacks" : "out of memory");
        free(self);
        return NULL;
    }
    self->world = world;
    if (!(self->dir = dk_logdir_socket_dir("stacks", "rank-1048576", "the ranks' stacks folder",
                                          err, errlen))) {
        dk_stackreq_destroy(&self);
        return NULL;
    }
    for (int r = 0; r < world; r++) {
        slot_t *s = &self->slots[r];
        s->fd = -1;
        if (asprintf(&s->path, "%s/rank-%d", self->dir, r) < 0) {
            s->path = NULL;
            dk_set_err(err, errlen, "out of memory");
            dk_stackreq_destroy(&self);
            return NULL;
        }
        int fd = open(s->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) {
            dk_set_err(err, errlen, "cannot create %s: %s", s->path, strerror(errno));
            dk_stackreq_destroy(&self);
            return NULL;
        }
        close(fd);
    }
    return self;
}

void dk_stackreq_destroy(dk_stackreq_t **self_p)
{
    dk_stackreq_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    for (int r = 0; self->slots && r < self->world; r++) {
        slot_t *s = &self->slots[r];
        if (s->fd >= 0)
            close(s->fd);
        if (s->path)
            unlink(s->path);
        free(s->path);
        free(s->dump);
    }
    dk_logdir_socket_dir_remove(self->dir);
    free(self->dir);
    free(self->slots);
    free(self);
    *self_p = NULL;
}

const char *dk_stackreq_path(const dk_stackreq_t *self, int rank)
{
    return rank >= 0 && rank < self->world ? self->slots[rank].path : NULL;
}

/* The ready line at the file's start: the rank's pid, and where dumps begin. */
static void read_ready(slot_t *s)
{
    char line[96];
    ssize_t n = pread(s->fd, line, sizeof line - 1, 0);
    if (n <= 0)
        return;
    line[n] = '\0';
    char *nl = strchr(line, '\n');
    size_t head = strlen(DK_STACKS_READY);
    if (!nl || strncmp(line, DK_STACKS_READY, head) != 0)
        return;
    char *end;
    long pid = strtol(line + head, &end, 10);
    long sampler = 0;
    size_t tail = strlen(DK_STACKS_READY_SAMPLER);
    if (end != nl && strncmp(end, DK_STACKS_READY_SAMPLER, tail) == 0)
        sampler = strtol(end + tail, &end, 10);
    if (end != nl || pid <= 0 || sampler < 0)
        return;
    s->pid = (pid_t) pid;
    s->sampler = (pid_t) sampler;
    s->read_at = nl + 1 - line;
}

#define READ_CHUNK 16384
_Static_assert(READ_CHUNK < DK_STACKREQ_KEEP, "a read fits in what is kept");

/* Room in S's dump for WANT bytes and a NUL (at most DK_STACKREQ_KEEP): a
 * request of a thousand ranks holds what they wrote, not a thousand times
 * the most one may write. False when memory ran out. */
static bool room(slot_t *s, size_t want)
{
    if (want > DK_STACKREQ_KEEP)
        want = DK_STACKREQ_KEEP;
    if (want + 1 <= s->cap)
        return true;
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < want + 1)
        cap *= 2;
    if (cap > DK_STACKREQ_KEEP + 1)
        cap = DK_STACKREQ_KEEP + 1;
    char *dump = realloc(s->dump, cap);
    if (!dump)
        return false;
    s->dump = dump;
    s->cap = cap;
    return true;
}

/* Keep DATA (N <= READ_CHUNK bytes) at the end of S's dump, within
 * DK_STACKREQ_KEEP (what does not fit in memory is dropped). */
static void keep(slot_t *s, const char *data, size_t n)
{
    if (!room(s, s->len + n))
        return;
    if (s->len + n > DK_STACKREQ_KEEP) {
        size_t drop = s->len + n - DK_STACKREQ_KEEP;
        memmove(s->dump, s->dump + drop, s->len - drop);
        s->len -= drop;
    }
    memcpy(s->dump + s->len, data, n);
    s->len += n;
}

/* Read what S's file has past read_at; the end line ends its answer. */
static void read_answer(slot_t *s)
{
    char buf[READ_CHUNK];
    ssize_t n;
    while ((n = pread(s->fd, buf, sizeof buf, s->read_at)) > 0) {
        s->read_at += n;
        keep(s, buf, (size_t) n);
    }
    size_t end = strlen(DK_STACKS_END);
    if (s->len >= end && memcmp(s->dump + s->len - end, DK_STACKS_END, end) == 0) {
        s->len -= end;
        s->pending = false;
    }
    s->dump[s->len] = '\0';
}

static void close_slot(slot_t *s)
{
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    s->pending = false;
    s->by_channel = false;
    s->fallback = false;
}

void dk_stackreq_clear(dk_stackreq_t *self)
{
    dk_stackreq_end(self);
    for (int r = 0; r < self->world; r++) {
        slot_t *s = &self->slots[r];
        s->asked = false;
        free(s->dump);
        s->dump = NULL;
        s->len = s->cap = 0;
    }
}

/* Whether PID, which rank's stacks file names, is still that rank: in GROUP,
 * the group the job started it in, or leading a group of its own, as a rank
 * a warm-start template forked does (a session of its own: _template.py,
 * _become_rank). A cold rank leads GROUP, so either way a process that took
 * the pid since would have to lead a group of that id. */
static bool still_the_rank(pid_t pid, pid_t group)
{
    pid_t g = getpgid(pid);
    return g > 0 && (g == group || g == pid);
}

static int ask(dk_stackreq_t *self, const pid_t *groups, double now, double wait_s, int end_sig)
{
    dk_stackreq_clear(self);
    int asked = 0;
    for (int r = 0; r < self->world; r++) {
        slot_t *s = &self->slots[r];
        if (groups[r] <= 0 && groups[r] != DK_STACKREQ_BY_CHANNEL)
            continue;
        s->cap = 0;
        if (!room(s, 0))
            continue;           /* out of memory: this rank is not asked */
        s->asked = true;
        s->dump[0] = '\0';
        if (groups[r] == DK_STACKREQ_BY_CHANNEL) {
            s->by_channel = s->pending = true;
            asked++;
            continue;
        }
        s->fd = open(s->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (s->fd < 0)
            continue;
        if (s->pid == 0)
            read_ready(s);
        if (s->pid == 0) {
            close_slot(s);      /* still starting: a signal now would end it */
            continue;
        }
        /* What is there already (a dump the user asked for by hand) is not
         * this answer. */
        struct stat st;
        if (fstat(s->fd, &st) == 0 && st.st_size > s->read_at)
            s->read_at = st.st_size;
        /* The pid still the rank's (still_the_rank): not a stranger's that
         * reused it. A sample goes to the rank's sampler thread alone (tgkill checks
         * that the thread is the pid's); a rank without one is not sampled.
         * An end asks the sampler first, the signal when there is none (or
         * it is gone) and later when it is silent (fall_back). */
        bool end = end_sig == DK_STACKS_SIGNAL;
        s->group = groups[r];
        s->fallback = end && s->sampler > 0 && still_the_rank(s->pid, groups[r]) &&
                      syscall(SYS_tgkill, s->pid, s->sampler, DK_SAMPLE_SIGNAL) == 0;
        if (!s->fallback &&
            (!still_the_rank(s->pid, groups[r]) || (!end && s->sampler <= 0) ||
             (end ? kill(s->pid, end_sig)
                  : syscall(SYS_tgkill, s->pid, s->sampler, end_sig)) != 0)) {
            close_slot(s);
            continue;
        }
        s->pending = true;
        asked++;
    }
    self->running = asked > 0;
    wait_s = wait_s > 0 ? wait_s : DK_STACKREQ_WAIT_S;
    self->until = now + wait_s;
    self->fallback_at = now + wait_s / 4;
    return asked;
}

/* The end's signal to each rank whose sampler was asked and has written
 * nothing yet (see the top). */
static void fall_back(dk_stackreq_t *self)
{
    for (int r = 0; r < self->world; r++) {
        slot_t *s = &self->slots[r];
        if (!s->fallback || !s->pending)
            continue;
        s->fallback = false;
        if (s->len == 0 && still_the_rank(s->pid, s->group))
            kill(s->pid, DK_STACKS_SIGNAL);
    }
}

int dk_stackreq_begin(dk_stackreq_t *self, const pid_t *groups, double now, double wait_s)
{
    return ask(self, groups, now, wait_s, DK_STACKS_SIGNAL);
}

int dk_stackreq_sample(dk_stackreq_t *self, const pid_t *groups, double now, double wait_s)
{
    return ask(self, groups, now, wait_s, DK_SAMPLE_SIGNAL);
}

bool dk_stackreq_poll(dk_stackreq_t *self, double now)
{
    if (!self->running)
        return true;
    bool waiting = false;
    for (int r = 0; r < self->world; r++) {
        slot_t *s = &self->slots[r];
        if (!s->pending)
            continue;
        if (!s->by_channel)
            read_answer(s);
        waiting = waiting || s->pending;
    }
    if (waiting && now >= self->fallback_at)
        fall_back(self);
    if (!waiting || now >= self->until)
        dk_stackreq_end(self);
    return !self->running;
}

bool dk_stackreq_running(const dk_stackreq_t *self)
{
    return self->running;
}

double dk_stackreq_next_at(const dk_stackreq_t *self, double now)
{
    if (!self->running)
        return -1;
    return now + DK_STACKREQ_TICK_S < self->until ? now + DK_STACKREQ_TICK_S : self->until;
}

void dk_stackreq_answer(dk_stackreq_t *self, int rank, const void *dump, size_t len)
{
    if (!self->running || rank < 0 || rank >= self->world || !self->slots[rank].by_channel ||
        !self->slots[rank].pending)
        return;
    slot_t *s = &self->slots[rank];
    if (len > DK_STACKREQ_KEEP) {
        dump = (const char *) dump + len - DK_STACKREQ_KEEP;
        len = DK_STACKREQ_KEEP;
    }
    if (room(s, len)) {
        memcpy(s->dump, dump, len);
        s->len = len;
        s->dump[len] = '\0';
    }
    close_slot(s);
}

void dk_stackreq_gone(dk_stackreq_t *self, int rank)
{
    if (rank < 0 || rank >= self->world || !self->slots[rank].pending)
        return;
    if (!self->slots[rank].by_channel)
        read_answer(&self->slots[rank]);    /* what it wrote before it went */
    close_slot(&self->slots[rank]);
}

void dk_stackreq_end(dk_stackreq_t *self)
{
    for (int r = 0; r < self->world; r++) {
        slot_t *s = &self->slots[r];
        if (s->pending && !s->by_channel)
            read_answer(s);
        close_slot(s);
    }
    self->running = false;
}

const char *dk_stackreq_dump(const dk_stackreq_t *self, int rank, size_t *len)
{
    if (rank < 0 || rank >= self->world || !self->slots[rank].asked) {
        *len = 0;
        return NULL;
    }
    const slot_t *s = &self->slots[rank];
    *len = s->dump ? s->len : 0;
    return s->dump ? s->dump : "";
}
