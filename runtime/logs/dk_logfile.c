/*
 * dk_logfile: a capped log file, its head and its tail. See the header.
 *
 * Files are made like every file of dk_logdir: openat(O_CREAT | O_EXCL |
 * O_NOFOLLOW) in a directory already checked to be the user's alone, so a
 * segment name reused from a crashed run is ours to unlink and nobody else's.
 * The segments are read back at close, hence O_RDWR for them.
 */
#include "dk_logfile.h"
#include "dk_err.h"
#include "dk_io.h"
#include "dk_logdir.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE_SKIP_MAX 4096   /* the longest partial line a tail skips */

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

struct dk_logfile_t {
    int dirfd;                  /* borrowed */
    int fd;                     /* NAME: the head, then at close the rest */
    int seg[2];                 /* tail segments, -1 until needed */
    char *name;
    unsigned long long cap, head_cap, seg_cap;
    unsigned long long head, seg_len[2], total;
    int cur;                    /* the segment written now */
    bool failed;
};

dk_logfile_t *dk_logfile_new(int dirfd, const char *name, unsigned long long cap, char *err,
                             size_t errlen)
{
    dk_logfile_t *self = calloc(1, sizeof *self);
    if (!self || !(self->name = strdup(name))) {
        free(self);
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    self->seg[0] = self->seg[1] = -1;
    self->cap = cap == 0 ? DK_LOG_CAP_DEFAULT : cap < DK_LOG_CAP_MIN ? DK_LOG_CAP_MIN : cap;
    self->head_cap = self->cap / 2;
    self->seg_cap = self->cap / 4;
    self->dirfd = dirfd;
    self->fd = dk_logdir_create(dirfd, name, err, errlen);
    if (self->fd < 0) {
        free(self->name);
        free(self);
        return NULL;
    }
    return self;
}

static int segment_name(const dk_logfile_t *self, int i, char *out, size_t outlen)
{
    return snprintf(out, outlen, "%s.tail-%d", self->name, i);
}

/* Make segment I empty and ready (created the first time, truncated after). */
static int reset_segment(dk_logfile_t *self, int i)
{
    if (self->seg[i] < 0) {
        char name[512];
        segment_name(self, i, name, sizeof name);
        unlinkat(self->dirfd, name, 0);   /* a leftover of ours: the folder is ours alone */
        self->seg[i] = openat(self->dirfd, name, O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);   /* read back at close */
        if (self->seg[i] < 0)
            return -1;
    } else if (ftruncate(self->seg[i], 0) != 0) {
        return -1;
    }
    self->seg_len[i] = 0;
    return 0;
}

int dk_logfile_write(dk_logfile_t *self, const void *bytes, size_t len)
{
    if (self->failed) {
        errno = EIO;
        return -1;
    }
    const char *p = bytes;
    self->total += len;
    if (self->head < self->head_cap) {
        size_t n = len < self->head_cap - self->head ? len : (size_t) (self->head_cap - self->head);
        if (dk_write_all(self->fd, p, n) != 0)
            goto failed;
        self->head += n;
        p += n;
        len -= n;
    }
    while (len > 0) {
        if (self->seg[self->cur] < 0 && reset_segment(self, self->cur) != 0)
            goto failed;   /* the first byte past the head */
        unsigned long long room = self->seg_cap - self->seg_len[self->cur];
        if (room == 0) {
            self->cur ^= 1;
            if (reset_segment(self, self->cur) != 0)
                goto failed;
            continue;
        }
        size_t n = len < room ? len : (size_t) room;
        if (dk_write_all(self->seg[self->cur], p, n) != 0)
            goto failed;
        self->seg_len[self->cur] += n;
        p += n;
        len -= n;
    }
    return 0;
failed:
    self->failed = true;
    return -1;
}

bool dk_logfile_capped(dk_logfile_t *self)
{
    return self->total > self->head_cap;
}

unsigned long long dk_logfile_total(dk_logfile_t *self)
{
    return self->total;
}

unsigned long long dk_logfile_cap(dk_logfile_t *self)
{
    return self->cap;
}

static int copy_segment(dk_logfile_t *self, int i, off_t off)
{
    char buf[65536];
    for (;;) {
        ssize_t n = pread(self->seg[i], buf, sizeof buf, off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        if (dk_write_all(self->fd, buf, (size_t) n) != 0)
            return -1;
        off += n;
    }
}

int dk_logfile_close(dk_logfile_t **self_p)
{
    dk_logfile_t *self = self_p ? *self_p : NULL;
    if (!self)
        return 0;
    *self_p = NULL;
    int rc = 0, saved = 0;
    if (self->seg[self->cur] >= 0 && !self->failed) {
        int older = self->cur ^ 1;
        int first = self->seg[older] >= 0 && self->seg_len[older] > 0 ? older : self->cur;
        /* The tail starts at a line: skip the partial one it begins with, if
         * it ends soon (binary output has no lines to respect). */
        char peek[LINE_SKIP_MAX];
        ssize_t got = pread(self->seg[first], peek, sizeof peek, 0);
        char *nl = got > 0 ? memchr(peek, '\n', (size_t) got) : NULL;
        off_t skip = nl && (unsigned long long) (nl - peek + 1) < self->seg_len[first]
                         ? nl - peek + 1 : 0;
        unsigned long long kept = self->seg_len[0] + self->seg_len[1] - (unsigned long long) skip;
        unsigned long long dropped = self->total - self->head - kept;
        char marker[512];
        int n = snprintf(marker, sizeof marker,
                         "\n[distkernel] %" PRIu64 " bytes of output left out here: this log "
                         "keeps the first %" PRIu64 " and the last %" PRIu64 " bytes of %" PRIu64
                         " (the cap is %" PRIu64 " bytes; log_cap= or DISTKERNEL_LOG_CAP "
                         "changes it)\n",
                         (uint64_t) dropped, (uint64_t) self->head, (uint64_t) kept,
                         (uint64_t) self->total, (uint64_t) self->cap);
        /* Each segment is emptied once copied: at most 1.25 CAP on disk. */
        if (dk_write_all(self->fd, marker, (size_t) n) != 0 ||
            (first == older && (copy_segment(self, older, skip) != 0 ||
                                ftruncate(self->seg[older], 0) != 0)) ||
            copy_segment(self, self->cur, first == older ? 0 : skip) != 0) {
            rc = -1;
            saved = errno;
        }
    }
    for (int i = 0; i < 2; i++) {
        if (self->seg[i] < 0)
            continue;
        char name[512];
        segment_name(self, i, name, sizeof name);
        unlinkat(self->dirfd, name, 0);
        close_fd(&self->seg[i]);
    }
    close_fd(&self->fd);
    free(self->name);
    free(self);
    if (rc)
        errno = saved;
    return rc;
}
