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
 * Capped log files are dk_logfile.c's.
 *
 * Why flock marks a running job: it is released by the kernel when the
 * holder dies, so a crashed kernel never leaves a folder that looks running
 * for ever, and it works across kernels of the same user without a registry.
 */
#include "dk_logdir.h"
#include "dk_err.h"
#include "dk_tidy.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define REMOVE_DEPTH 4

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
        dk_set_err(err, errlen, "no directory for the rank logs: HOME is not set and user %u "
                   "has no home directory; set DISTKERNEL_LOG_DIR to a directory of yours",
                   (unsigned) geteuid());
        return NULL;
    }
    if (asprintf(&out, "%s/.local/state/distkernel/logs", home) < 0)
        out = NULL;
    return out;
}

/* Why directory ST (reached as SHOWN) may not be used, or NULL. FINAL: it is
 * the one our files go in (or, with DK_LOGDIR_CODE, the code is read from). */
static const char *unsafe(const struct stat *st, bool final, int flags)
{
    uid_t me = geteuid();
    bool code = final && (flags & DK_LOGDIR_CODE);
    if (!S_ISDIR(st->st_mode) && !(code && S_ISREG(st->st_mode)))
        return "is not a directory";
    if (st->st_uid != me && st->st_uid != 0)
        return "belongs to another user, who could read, rename or replace what is in it";
    bool shared = (st->st_mode & (S_IWGRP | S_IWOTH)) != 0;
    if (shared && !(st->st_mode & S_ISVTX))
        return "is writable by other users, who could rename or replace what is in it";
    /* Code: root's is the system's (dist-packages); anyone may add files to a
     * sticky folder, and a file added there is as good as replaced. */
    if (code && shared)
        return "is writable by other users, who could add files to it";
    if (final && !code && !(flags & DK_LOGDIR_SHARED_OK) && (st->st_uid != me || shared))
        return st->st_uid != me ? "belongs to root, not to you"
                                : "is writable by other users";
    return NULL;
}

static void refuse(char *err, size_t errlen, const char *path, size_t len, const char *why,
                   const struct stat *st, int flags, const char *hint)
{
    dk_set_err(err, errlen, "refusing to use %.*s for %s: it %s (owner uid %u, mode %04o)%s%s",
               (int) len, path, flags & DK_LOGDIR_CODE ? "code" : "logs", why,
               (unsigned) st->st_uid, (unsigned) (st->st_mode & 07777), hint ? "; " : "",
               hint ? hint : "");
}

/* Open component NAME of DIRFD: a directory, or a symlink owned by us or root
 * to one; with FILE_OK also a regular file (not through a symlink). */
static int open_component(int dirfd, const char *name, int flags, bool file_ok, bool *created)
{
    int fl = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
    int fd = openat(dirfd, name, fl | O_NOFOLLOW);
    if (fd < 0 && errno == ENOTDIR && file_ok)
        return openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
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
        dk_set_err(err, errlen, "no log directory was given%s%s", hint ? "; " : "",
                   hint ? hint : "");
        return -1;
    }
    int fd = open(path[0] == '/' ? "/" : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        dk_set_err(err, errlen, "cannot open %s: %s", path[0] == '/' ? "/" : ".", strerror(errno));
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
                refuse(err, errlen, path, n, unsafe(&st, true, flags), &st, flags, hint);
                close_fd(&fd);
                errno = EACCES;
            }
            return fd;
        }
        char name[256];
        if (j - i >= sizeof name) {
            dk_set_err(err, errlen, "the log directory %s has a name component over 255 bytes", path);
            close_fd(&fd);
            return -1;
        }
        memcpy(name, path + i, j - i);
        name[j - i] = '\0';
        bool created = false;
        int next = open_component(fd, name, flags, last && (flags & DK_LOGDIR_CODE), &created);
        if (next < 0) {
            int e = errno;
            if (e == EPERM)
                dk_set_err(err, errlen, "refusing to use %s for %s: %.*s is a symlink owned by "
                           "another user%s%s", path, flags & DK_LOGDIR_CODE ? "code" : "logs",
                           (int) j, path, hint ? "; " : "", hint ? hint : "");
            else
                dk_set_err(err, errlen, "cannot %s %s%.*s: %s%s%s",
                           flags & DK_LOGDIR_CREATE ? "create or open" : "open",
                           flags & DK_LOGDIR_CODE ? "" : "the log directory ", (int) j, path,
                           strerror(e), hint ? "; " : "", hint ? hint : "");
            close_fd(&fd);
            errno = e == EPERM ? EACCES : e;
            return -1;
        }
        close_fd(&fd);
        fd = next;
        const char *why = fstat(fd, &st) != 0 ? "cannot be examined" : unsafe(&st, last, flags);
        if (why) {
            refuse(err, errlen, path, j, why, &st, flags, hint);
            close_fd(&fd);
            errno = EACCES;
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
        dk_set_err(err, errlen, "cannot create the log directory %s: %s", name, strerror(errno));
        return -1;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        dk_set_err(err, errlen, "cannot open the log directory %s: %s", name, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
        dk_set_err(err, errlen, "refusing to use the log directory %s: it is not yours alone "
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
        dk_set_err(err, errlen, "cannot create the log file %s: %s", name, strerror(errno));
    return fd;
}

int dk_logdir_private_file(int dirfd, const char *name, char *err, size_t errlen)
{
    int fd = openat(dirfd, name, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd < 0) {
        dk_set_err(err, errlen, "cannot open %s: %s", name, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
        dk_set_err(err, errlen, "%s is not a file of yours", name);
        close(fd);
        return -1;
    }
    /* One made earlier with the default mode (by an older kernel, or by
     * MLflow itself) is narrowed: what it holds is no one else's to read. */
    if ((st.st_mode & 077) && fchmod(fd, 0600) != 0) {
        dk_set_err(err, errlen, "cannot make %s private (chmod 600): %s", name, strerror(errno));
        close(fd);
        return -1;
    }
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

int dk_logdir_prune(int rootfd, const dk_logdir_policy_t *policy, pid_t self,
                    unsigned long long *usage)
{
    entries_t kernels = {0};
    list_kernels(rootfd, self, &kernels);

    /* Folders of exited kernels: the newest few stay, the rest once old. */
    entries_t dead = {0};
    for (size_t i = 0; i < kernels.n; i++)
        if (kernels.v[i].dead && push(&dead))
            dead.v[dead.n - 1] = kernels.v[i];
    if (dead.n > 1)   /* qsort must not be given the NULL of an empty list */
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
        if (runs.n > 1)
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
        if (usage)
            *usage = total;
    }
    free(kernels.v);
    return removed;
}

/* Socket folders' owners. Each folder dk_logdir_socket_dir makes holds
 * OWNER_FILE, which its maker keeps open with an exclusive flock for the
 * folder's life (the lock goes with the process, however it ends, and with
 * every fork of it that still holds the descriptor). A folder whose lock
 * nobody holds, older than SWEEP_AGE_S, was left by a process that died with
 * its folder watcher (a node agent SIGKILLed with its Slurm step by
 * proctrack): the next dk_logdir_socket_dir of that user in that base removes
 * it. A folder without the file (made by an older distkernel, or one whose
 * maker has not made it yet) is never removed, nor is a young one. */
#define OWNER_FILE ".owner"
#define OWNERS_MAX 64
#define SWEEP_AGE_S 60

static struct {
    pthread_mutex_t lock;
    char *dir[OWNERS_MAX];
    int fd[OWNERS_MAX];
    bool swept;
} owners = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Hold DIR's owner lock for its life. Without one (no slot, a failure) the
 * folder still serves; it is only never swept. */
static void own(const char *dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/" OWNER_FILE, dir);
    int fd = open(path, O_RDONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        unlink(path);   /* an owner file nobody holds would be swept */
        close(fd);
        return;
    }
    pthread_mutex_lock(&owners.lock);
    for (int i = 0; i < OWNERS_MAX; i++)
        if (!owners.dir[i]) {
            if ((owners.dir[i] = strdup(dir))) {
                owners.fd[i] = fd;
                fd = -1;
            }
            break;
        }
    pthread_mutex_unlock(&owners.lock);
    if (fd >= 0) {
        /* No slot: no owner file either (one nobody holds would be swept
         * while the folder serves); the folder is never swept. */
        unlink(path);
        close(fd);
    }
}

/* Remove the dead folder NAME in BASEFD: its entries (sockets and files, one
 * level; a subfolder keeps it), then itself. */
static void sweep_one(int basefd, const char *name)
{
    int dfd = openat(basefd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    unlinkat(basefd, name, AT_REMOVEDIR);
}

/* Remove BASE's socket folders of this user that nobody owns any more. */
static void sweep(const char *base)
{
    int basefd = open(base, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (basefd < 0)
        return;
    int scan = dup(basefd);
    DIR *d = scan >= 0 ? fdopendir(scan) : NULL;
    if (!d) {
        if (scan >= 0)
            close(scan);
        close(basefd);
        return;
    }
    time_t now = time(NULL);
    uid_t me = geteuid();
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "distkernel-", strlen("distkernel-")) != 0)
            continue;
        struct stat st;
        if (fstatat(basefd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
            st.st_uid != me || now - st.st_mtime < SWEEP_AGE_S)
            continue;
        char owner[NAME_MAX + sizeof "/" OWNER_FILE];
        snprintf(owner, sizeof owner, "%s/" OWNER_FILE, e->d_name);
        int fd = openat(basefd, owner, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;   /* no owner file: not ours to judge */
        struct stat fst;
        bool dead = fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode) && fst.st_uid == me &&
                    flock(fd, LOCK_EX | LOCK_NB) == 0;
        if (dead)
            sweep_one(basefd, e->d_name);
        close(fd);
    }
    closedir(d);
    close(basefd);
}

char *dk_logdir_socket_dir(const char *kind, const char *socket_name, const char *what,
                           char *err, size_t errlen)
{
    const char *tmpdir = getenv("TMPDIR");
    const char *bases[2] = {tmpdir, "/tmp"};
    char refused[1024] = "";    /* why $TMPDIR could not serve, for the error if /tmp cannot */
    for (int i = 0; i < 2; i++) {
        const char *base = bases[i];
        if (!base || !*base || (i == 1 && tmpdir && strcmp(tmpdir, "/tmp") == 0))
            continue;
        /* "BASE/distkernel-KIND-XXXXXX/SOCKET_NAME" and its NUL */
        size_t dir_len = strlen(base) + strlen("/distkernel-") + strlen(kind) + strlen("-XXXXXX");
        if (dir_len + 1 + strlen(socket_name) + 1 > sizeof ((struct sockaddr_un *) 0)->sun_path)
            continue;
        /* A $TMPDIR that is refused (another user made it, it is writable
         * by others) or unusable gives way to /tmp, as a missing one does:
         * the folder made below is fresh and private either way. */
        char why[1024];
        int fd = dk_logdir_open(base, DK_LOGDIR_SHARED_OK,
                                "set TMPDIR to a directory that is yours alone", why, sizeof why);
        if (fd < 0) {
            if (i == 0) {
                snprintf(refused, sizeof refused, "%s", why);
                continue;
            }
            if (refused[0])
                dk_set_err(err, errlen, "cannot create %s: %s; and %s", what, refused, why);
            else
                dk_set_err(err, errlen, "%s", why);
            return NULL;
        }
        close(fd);
        pthread_mutex_lock(&owners.lock);
        bool first = !owners.swept;
        owners.swept = true;
        pthread_mutex_unlock(&owners.lock);
        if (first)
            sweep(base);    /* once a process: what its predecessors left */
        char *dir = malloc(dir_len + 1);
        if (!dir)
            break;
        snprintf(dir, dir_len + 1, "%s/distkernel-%s-XXXXXX", base, kind);
        if (mkdtemp(dir)) {
            /* Not kept (no watcher, a fork failed): the folder still serves,
             * and its user removes it as always; only a SIGKILL leaves it. */
            dk_tidy_keep(dir, NULL, 0);
            own(dir);
            return dir;
        }
        snprintf(why, sizeof why, "cannot create %s in %s: %s", what, base, strerror(errno));
        free(dir);
        if (i == 0) {
            snprintf(refused, sizeof refused, "%s", why);
            continue;
        }
        if (refused[0])
            dk_set_err(err, errlen, "%s; and %s", refused, why);
        else
            dk_set_err(err, errlen, "%s", why);
        return NULL;
    }
    dk_set_err(err, errlen, "cannot create %s: no usable temporary directory (%s)", what,
               refused[0] ? refused : "$TMPDIR is unset or too long for a socket path, and "
               "/tmp is missing");
    return NULL;
}

void dk_logdir_socket_dir_remove(const char *dir)
{
    if (!dir)
        return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/" OWNER_FILE, dir);
    unlink(path);
    pthread_mutex_lock(&owners.lock);
    for (int i = 0; i < OWNERS_MAX; i++)
        if (owners.dir[i] && strcmp(owners.dir[i], dir) == 0) {
            close(owners.fd[i]);
            free(owners.dir[i]);
            owners.dir[i] = NULL;
            break;
        }
    pthread_mutex_unlock(&owners.lock);
    rmdir(dir);
    dk_tidy_forget(dir);
}

int dk_logdir_write_file(const char *path, int (*write)(FILE *f, void *data), void *data,
                         char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        dk_set_err(err, errlen, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int rc = write(f, data) < 0 || ferror(f) ? -1 : 0;
    int saved = errno;
    if (fclose(f) != 0 && rc == 0) {
        rc = -1;
        saved = errno;
    }
    if (rc < 0)
        dk_set_err(err, errlen, "cannot write %s: %s", path, strerror(saved));
    return rc;
}
