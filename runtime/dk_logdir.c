/*
 * dk_logdir: safe log directories, their retention, and capped log files.
 *
 * The whole file follows one rule: after the root has been opened and checked,
 * no path string is resolved again. Everything below it is reached from a
 * directory descriptor with *at() calls and O_NOFOLLOW, so what was checked is
 * what is used; a check by name followed by an open by name (the race the
 * issue's attacker won by swapping the run directory) cannot happen.
 *
 * Checking a directory: it must be owned by root or by us (a directory of
 * another user may be renamed or replaced by its owner at any time), and if
 * group or others may write it, it must be sticky (then others can add
 * entries but not rename or remove ours). The final directory, where our files
 * are, must be ours and writable by us alone (with DK_LOGDIR_SHARED_OK, a
 * root-owned sticky one like /tmp is accepted, for callers that make their
 * own private directory inside with mkdtemp).
 *
 * Why flock marks a running job: it is released by the kernel when the
 * holder dies, so a crashed kernel never leaves a folder that looks running
 * for ever, and it works across kernels of the same user without a registry.
 */
#include "dk_logdir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define REMOVE_DEPTH 4
#define LINE_SKIP_MAX 4096   /* the longest partial line a tail skips */

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ------------------------------------------------------------------------ */
/* The root                                                                  */

char *dk_logdir_default_root(char *err, size_t errlen)
{
    const char *env = getenv("DISTKERNEL_LOG_DIR");
    if (env && *env)
        return strdup(env);
    const char *state = getenv("XDG_STATE_HOME");
    char *out = NULL;
    /* The XDG spec says a relative XDG_STATE_HOME is invalid and to be ignored. */
    if (state && state[0] == '/') {
        if (asprintf(&out, "%s/distkernel/logs", state) < 0)
            out = NULL;
        return out;
    }
    const char *home = getenv("HOME");
    if (!home || home[0] != '/') {
        struct passwd *pw = getpwuid(geteuid());
        home = pw && pw->pw_dir && pw->pw_dir[0] == '/' ? pw->pw_dir : NULL;
    }
    if (!home) {
        snprintf(err, errlen, "no directory for the rank logs: HOME is not set and user %u "
                 "has no home directory; set DISTKERNEL_LOG_DIR to a directory of yours",
                 (unsigned) geteuid());
        return NULL;
    }
    if (asprintf(&out, "%s/.local/state/distkernel/logs", home) < 0)
        out = NULL;
    return out;
}

/* Why directory ST (reached as SHOWN) may not be used, or NULL. FINAL: it is
 * the one our files go in. */
static const char *unsafe(const struct stat *st, bool final, int flags)
{
    uid_t me = geteuid();
    if (!S_ISDIR(st->st_mode))
        return "is not a directory";
    if (st->st_uid != me && st->st_uid != 0)
        return "belongs to another user, who could read, rename or replace what is in it";
    bool shared = (st->st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if (shared && !(st->st_mode & S_ISVTX))
        return "is writable by other users, who could rename or replace what is in it";
    if (final && !(flags & DK_LOGDIR_SHARED_OK) && (st->st_uid != me || shared))
        return st->st_uid != me ? "belongs to root, not to you"
                                : "is writable by other users";
    return NULL;
}

static void refuse(char *err, size_t errlen, const char *path, size_t len, const char *why,
                   const struct stat *st, const char *hint)
{
    snprintf(err, errlen, "refusing to use %.*s for logs: it %s (owner uid %u, mode %04o)%s%s",
             (int) len, path, why, (unsigned) st->st_uid, (unsigned) (st->st_mode & 07777),
             hint ? "; " : "", hint ? hint : "");
}

/* Open component NAME of DIRFD: a directory, or a symlink owned by us or root
 * to one. */
static int open_component(int dirfd, const char *name, int flags, bool *created)
{
    int fl = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
    int fd = openat(dirfd, name, fl | O_NOFOLLOW);
    if (fd < 0 && errno == ENOENT && (flags & DK_LOGDIR_CREATE)) {
        if (mkdirat(dirfd, name, 0700) == 0)
            *created = true;
        else if (errno != EEXIST)
            return -1;
        fd = openat(dirfd, name, fl | O_NOFOLLOW);
    }
    if (fd >= 0 || (errno != ELOOP && errno != ENOTDIR))
        return fd;
    struct stat link;
    if (fstatat(dirfd, name, &link, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(link.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    if (link.st_uid != geteuid() && link.st_uid != 0) {
        errno = EPERM;
        return -1;
    }
    return openat(dirfd, name, fl);
}

int dk_logdir_open(const char *path, int flags, const char *hint, char *err, size_t errlen)
{
    if (!path || !*path) {
        snprintf(err, errlen, "no log directory was given%s%s", hint ? "; " : "",
                 hint ? hint : "");
        return -1;
    }
    int fd = open(path[0] == '/' ? "/" : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open %s: %s", path[0] == '/' ? "/" : ".", strerror(errno));
        return -1;
    }
    size_t i = 0, n = strlen(path);
    for (;;) {
        while (i < n && path[i] == '/')
            i++;
        size_t j = i;
        while (j < n && path[j] != '/')
            j++;
        bool last = true;
        for (size_t k = j; k < n; k++)
            last = last && path[k] == '/';
        struct stat st;
        if (j == i) {   /* "/" or "." itself */
            if (fstat(fd, &st) == 0 && unsafe(&st, true, flags)) {
                refuse(err, errlen, path, n, unsafe(&st, true, flags), &st, hint);
                close_fd(&fd);
            }
            return fd;
        }
        char name[256];
        if (j - i >= sizeof name) {
            snprintf(err, errlen, "the log directory %s has a name component over 255 bytes", path);
            close_fd(&fd);
            return -1;
        }
        memcpy(name, path + i, j - i);
        name[j - i] = '\0';
        bool created = false;
        int next = open_component(fd, name, flags, &created);
        if (next < 0) {
            int e = errno;
            if (e == EPERM)
                snprintf(err, errlen, "refusing to use %s for logs: %.*s is a symlink owned by "
                         "another user%s%s", path, (int) j, path, hint ? "; " : "",
                         hint ? hint : "");
            else
                snprintf(err, errlen, "cannot %s the log directory %.*s: %s%s%s",
                         flags & DK_LOGDIR_CREATE ? "create or open" : "open", (int) j, path,
                         strerror(e), hint ? "; " : "", hint ? hint : "");
            close_fd(&fd);
            return -1;
        }
        close_fd(&fd);
        fd = next;
        const char *why = fstat(fd, &st) != 0 ? "cannot be examined" : unsafe(&st, last, flags);
        if (why) {
            refuse(err, errlen, path, j, why, &st, hint);
            close_fd(&fd);
            return -1;
        }
        if (last)
            return fd;
        i = j;
    }
}

int dk_logdir_mkdir(int dirfd, const char *name, bool fresh, char *err, size_t errlen)
{
    if (mkdirat(dirfd, name, 0700) != 0 && (fresh || errno != EEXIST)) {
        snprintf(err, errlen, "cannot create the log directory %s: %s", name, strerror(errno));
        return -1;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot open the log directory %s: %s", name, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        snprintf(err, errlen, "refusing to use the log directory %s: it is not yours alone "
                 "(owner uid %u, mode %04o)", name, (unsigned) st.st_uid,
                 (unsigned) (st.st_mode & 07777));
        close_fd(&fd);
        return -1;
    }
    return fd;
}

static int create_at(int dirfd, const char *name, int access)
{
    return openat(dirfd, name, access | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

int dk_logdir_create(int dirfd, const char *name, char *err, size_t errlen)
{
    int fd = create_at(dirfd, name, O_WRONLY);
    if (fd < 0)
        snprintf(err, errlen, "cannot create the log file %s: %s", name, strerror(errno));
    return fd;
}

int dk_logdir_hold(int fd)
{
    return flock(fd, LOCK_SH | LOCK_NB);
}

/* ------------------------------------------------------------------------ */
/* Removal and usage: never through a symlink                                */

static int remove_in(int dirfd, const char *name, int depth)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(dirfd, name, 0) == 0 || errno == ENOENT ? 0 : -1;
    if (depth <= 0) {
        errno = ELOOP;
        return -1;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (remove_in(fd, e->d_name, depth - 1) != 0)
            rc = -1;
    }
    closedir(d);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        rc = -1;
    return rc;
}

int dk_logdir_remove(int dirfd, const char *name)
{
    return remove_in(dirfd, name, REMOVE_DEPTH);
}

static unsigned long long usage_in(int dirfd, const char *name, int depth)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return 0;
    unsigned long long total = (unsigned long long) st.st_blocks * 512;
    if (!S_ISDIR(st.st_mode) || depth <= 0)
        return total;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return total;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            total += usage_in(fd, e->d_name, depth - 1);
    closedir(d);
    return total;
}

unsigned long long dk_logdir_usage(int dirfd, const char *name)
{
    return usage_in(dirfd, name, REMOVE_DEPTH);
}

/* ------------------------------------------------------------------------ */
/* Pruning                                                                   */

typedef struct {
    char kernel[64];
    char run[200];          /* empty for a kernel folder entry */
    time_t mtime;
    unsigned long long bytes;
    bool dead;              /* its kernel process is gone */
} entry_t;

typedef struct {
    entry_t *v;
    size_t n, cap;
} entries_t;

static entry_t *push(entries_t *es)
{
    if (es->n == es->cap) {
        size_t cap = es->cap ? 2 * es->cap : 32;
        entry_t *p = realloc(es->v, cap * sizeof *p);
        if (!p)
            return NULL;
        es->v = p;
        es->cap = cap;
    }
    entry_t *e = &es->v[es->n++];
    memset(e, 0, sizeof *e);
    return e;
}

static int newest_first(const void *a, const void *b)
{
    time_t x = ((const entry_t *) a)->mtime, y = ((const entry_t *) b)->mtime;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int oldest_first(const void *a, const void *b)
{
    return newest_first(b, a);
}

/* The kernel-PID folders directly in ROOTFD. */
static void list_kernels(int rootfd, pid_t self, entries_t *out)
{
    int fd = openat(rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (strncmp(e->d_name, "kernel-", 7) != 0 || strlen(e->d_name) >= sizeof out->v->kernel)
            continue;
        long pid = strtol(e->d_name + 7, &end, 10);
        struct stat st;
        if (*end || pid <= 0 || fstatat(rootfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISDIR(st.st_mode))
            continue;
        entry_t *k = push(out);
        if (!k)
            break;
        snprintf(k->kernel, sizeof k->kernel, "%s", e->d_name);
        k->mtime = st.st_mtime;
        k->dead = pid != (long) self && kill((pid_t) pid, 0) != 0 && errno == ESRCH;
    }
    closedir(d);
}

/* True when nobody holds run folder NAME of KFD (dk_logdir_hold). */
static bool idle(int kfd, const char *name)
{
    int fd = openat(kfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOTDIR || errno == ELOOP;   /* not a folder: nothing runs there */
    bool ok = flock(fd, LOCK_EX | LOCK_NB) == 0;
    close(fd);
    return ok;
}

static void list_runs(int rootfd, const entry_t *k, entries_t *out)
{
    int kfd = openat(rootfd, k->kernel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int dfd = kfd >= 0 ? dup(kfd) : -1;
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        if (kfd >= 0)
            close(kfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        struct stat st;
        if (strncmp(e->d_name, "run-", 4) != 0 || strlen(e->d_name) >= sizeof out->v->run ||
            fstatat(kfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        entry_t *r = push(out);
        if (!r)
            break;
        snprintf(r->kernel, sizeof r->kernel, "%s", k->kernel);
        snprintf(r->run, sizeof r->run, "%s", e->d_name);
        r->mtime = st.st_mtime;
        r->bytes = dk_logdir_usage(kfd, e->d_name);
        r->dead = k->dead;
    }
    closedir(d);
    close(kfd);
}

int dk_logdir_prune(int rootfd, const dk_logdir_policy_t *policy, pid_t self)
{
    entries_t kernels = {0};
    list_kernels(rootfd, self, &kernels);

    /* Folders of exited kernels: the newest few stay, the rest once old. */
    entries_t dead = {0};
    for (size_t i = 0; i < kernels.n; i++)
        if (kernels.v[i].dead && push(&dead))
            dead.v[dead.n - 1] = kernels.v[i];
    qsort(dead.v, dead.n, sizeof *dead.v, newest_first);
    time_t now = time(NULL);
    for (size_t i = (size_t) (policy->keep_dead_kernels > 0 ? policy->keep_dead_kernels : 0);
         i < dead.n; i++) {
        if (now - dead.v[i].mtime >= policy->dead_age_s)
            dk_logdir_remove(rootfd, dead.v[i].kernel);
    }
    free(dead.v);

    int removed = 0;
    if (policy->cap > 0) {
        entries_t runs = {0};
        for (size_t i = 0; i < kernels.n; i++)
            list_runs(rootfd, &kernels.v[i], &runs);
        unsigned long long total = dk_logdir_usage(rootfd, ".");
        qsort(runs.v, runs.n, sizeof *runs.v, oldest_first);
        for (size_t i = 0; i < runs.n && total > policy->cap; i++) {
            entry_t *r = &runs.v[i];
            int kfd = openat(rootfd, r->kernel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (kfd < 0)
                continue;
            if (idle(kfd, r->run) && dk_logdir_remove(kfd, r->run) == 0) {
                total -= r->bytes < total ? r->bytes : total;
                removed++;
                /* An exited kernel's folder with nothing left goes too. */
                if (r->dead)
                    unlinkat(rootfd, r->kernel, AT_REMOVEDIR);
            }
            close(kfd);
        }
        free(runs.v);
    }
    free(kernels.v);
    return removed;
}

/* ------------------------------------------------------------------------ */
/* Capped log files                                                          */

struct dk_logfile_t {
    int dirfd;
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
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    self->seg[0] = self->seg[1] = -1;
    self->cap = cap == 0 ? DK_LOG_CAP_DEFAULT : cap < DK_LOG_CAP_MIN ? DK_LOG_CAP_MIN : cap;
    self->head_cap = self->cap / 2;
    self->seg_cap = self->cap / 4;
    self->dirfd = fcntl(dirfd, F_DUPFD_CLOEXEC, 3);
    self->fd = self->dirfd >= 0 ? dk_logdir_create(dirfd, name, err, errlen) : -1;
    if (self->dirfd < 0 || self->fd < 0) {
        if (self->dirfd < 0)
            snprintf(err, errlen, "cannot duplicate a directory descriptor: %s", strerror(errno));
        close_fd(&self->dirfd);
        free(self->name);
        free(self);
        return NULL;
    }
    return self;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t) w;
    }
    return 0;
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
        self->seg[i] = create_at(self->dirfd, name, O_RDWR);   /* read back at close */
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
        if (write_all(self->fd, p, n) != 0)
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
        if (write_all(self->seg[self->cur], p, n) != 0)
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
        if (write_all(self->fd, buf, (size_t) n) != 0)
            return -1;
        off += n;
    }
}

int dk_logfile_close(dk_logfile_t **self_p)
{
    dk_logfile_t *self = *self_p;
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
        if (write_all(self->fd, marker, (size_t) n) != 0 ||
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
    close_fd(&self->dirfd);
    free(self->name);
    free(self);
    if (rc)
        errno = saved;
    return rc;
}
