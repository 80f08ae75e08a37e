/*
 * dk_tidy: the watcher that removes a process's temporary folders when it
 * ends. See the header.
 *
 * The wire, host to watcher, on a stream socket: records that end in a NUL.
 * "+DEV INO PATH" keep the folder PATH, which is the directory DEV, INO (16
 * hex digits each, taken by the host when it kept it: by the time the watcher
 * reads the record, the name may hold another folder); "-PATH" forget it;
 * "!" the host is ending: remove what is kept now and exit. One process
 * writes, under the lock, so records never interleave.
 */
#include "dk_tidy.h"

#include "dk_err.h"
#include "dk_io.h"
#include "dk_watch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How deep a kept folder is emptied: the folder, and two levels below. */
#define DEPTH 3
/* How long dk_tidy_end waits for the watcher to finish. */
#define END_WAIT_MS 2000

/* ---- the watcher ----------------------------------------------------------------
 *
 * A forked child of a threaded host that never execs: async-signal-safe calls
 * only, static memory only (the host's allocator may have been locked by
 * another thread at the fork). Nothing here runs in the host.
 */

typedef struct {
    dev_t dev;
    ino_t ino;
    char path[DK_TIDY_PATH_MAX];
} kept_t;

static kept_t kept[DK_TIDY_MAX];
static int n_kept;
#define ID_LEN 34               /* "DEV INO " */
static char record_buf[1 + ID_LEN + DK_TIDY_PATH_MAX];  /* the record so far */
static size_t record_len;
static bool record_skip;        /* too long: skipped to its NUL */
static char read_buf[4096];
static char dents[DEPTH][4096];

/* getdents64's record (linux/dirent.h's struct linux_dirent64). */
typedef struct {
    uint64_t d_ino;
    int64_t d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
} dent_t;

static bool same_path(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

/* 16 hex digits at P, or false. */
static bool hex16(const char *p, uint64_t *v)
{
    *v = 0;
    for (int i = 0; i < 16; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        *v = *v << 4 | (uint64_t) d;
    }
    return true;
}

/* One whole record of LEN bytes in RECORD_BUF. Returns false for '!'. */
static bool take_record(size_t len)
{
    char op = record_buf[0];
    if (op == '!')
        return false;
    size_t at = op == '+' ? 1 + ID_LEN : 1;
    if (len <= at || len - at >= DK_TIDY_PATH_MAX)
        return true;
    char path[DK_TIDY_PATH_MAX];
    memcpy(path, record_buf + at, len - at);
    path[len - at] = '\0';
    if (op == '+' && n_kept < DK_TIDY_MAX) {
        uint64_t dev, ino;
        if (!hex16(record_buf + 1, &dev) || !hex16(record_buf + 18, &ino))
            return true;
        kept_t *k = &kept[n_kept++];
        k->dev = (dev_t) dev;
        k->ino = (ino_t) ino;
        memcpy(k->path, path, len - at + 1);
    } else if (op == '-') {
        /* The newest of that name: a folder removed and made again under the
         * same name is two records of it. */
        for (int i = n_kept - 1; i >= 0; i--) {
            if (same_path(kept[i].path, path)) {
                kept[i] = kept[--n_kept];
                break;
            }
        }
    }
    return true;
}

/* N bytes read from the host. Returns false once it said '!'. */
static bool take_bytes(const char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c == '\0') {
            bool go_on = record_skip || record_len == 0 || take_record(record_len);
            record_len = 0;
            record_skip = false;
            if (!go_on)
                return false;
        } else if (!record_skip) {
            if (record_len == sizeof record_buf)
                record_skip = true;
            else
                record_buf[record_len++] = c;
        }
    }
    return true;
}

/* Empty the directory open on FD, DEPTH levels below a kept folder: unlink
 * what is in it, emptying and removing a directory inside while there is a
 * level left. Never follows a symlink (unlinkat removes the link itself). */
static void empty_dir(int fd, int depth)
{
    for (int pass = 0; pass < 8; pass++) {
        bool any = false;
        if (lseek(fd, 0, SEEK_SET) != 0)
            return;
        for (;;) {
            long got = syscall(SYS_getdents64, fd, dents[depth], sizeof dents[depth]);
            if (got <= 0)
                break;
            for (long off = 0; off < got;) {
                const dent_t *d = (const dent_t *) (dents[depth] + off);
                off += d->d_reclen;
                const char *name = d->d_name;
                if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2])))
                    continue;
                any = true;
                if (unlinkat(fd, name, 0) == 0 || errno != EISDIR || depth + 1 >= DEPTH)
                    continue;
                int sub = openat(fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                if (sub >= 0) {
                    empty_dir(sub, depth + 1);
                    close(sub);
                }
                unlinkat(fd, name, AT_REMOVEDIR);
            }
        }
        if (!any)
            return;
    }
}

static void remove_kept(const kept_t *k)
{
    int fd = open(k->path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    struct stat st;
    bool ours = fstat(fd, &st) == 0 && st.st_dev == k->dev && st.st_ino == k->ino &&
                st.st_uid == geteuid();
    if (ours)
        empty_dir(fd, 0);
    close(fd);
    if (ours)
        rmdir(k->path);
}

static _Noreturn void watch(int sock, pid_t host, long max_fd)
{
    setpgid(0, 0);
    dk_watch_quiet_signals();
    prctl(PR_SET_NAME, (unsigned long) "distkernel-tidy", 0, 0, 0);
    int pidfd = dk_watch_keep_only(sock, host, max_fd);
    bool go_on = true;                  /* the host has not said '!' */
    bool alive = getppid() == host;     /* else it ended before the pidfd was taken */
    struct pollfd fds[2] = {{.fd = 0, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    while (go_on && alive) {
        int n = poll(fds, pidfd >= 0 ? 2 : 1, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || fds[1].revents)
            break;
        ssize_t got = read(0, read_buf, sizeof read_buf);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;      /* EOF: every copy of the host's end is closed */
        go_on = take_bytes(read_buf, (size_t) got);
    }
    /* What the host wrote just before it ended may still wait. */
    if (go_on && fcntl(0, F_SETFL, O_NONBLOCK) == 0) {
        ssize_t got;
        while ((got = read(0, read_buf, sizeof read_buf)) > 0 &&
               take_bytes(read_buf, (size_t) got))
            ;
    }
    for (int i = 0; i < n_kept; i++)
        remove_kept(&kept[i]);
    _exit(0);
}

/* ---- the host's side -------------------------------------------------------------- */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t owner = -1;        /* the process whose watcher this is */
static pid_t watcher = -1;
static int wfd = -1;
static bool ended;

/* Collect a watcher that has ended, or has just been told to; waits at most
 * WAIT_MS. */
static void reap(pid_t pid, int wait_ms)
{
    for (int waited = 0;; waited += 10) {
        pid_t got = waitpid(pid, NULL, WNOHANG);
        if (got == pid || (got < 0 && errno != EINTR) || waited >= wait_ms)
            return;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static int start_locked(char *err, size_t errlen)
{
    pid_t me = getpid();
    if (owner == me && wfd >= 0)
        return 0;
    if (owner != me && wfd >= 0) {
        /* A fork of the host without exec: that is the host's watcher, and
         * this its copy of the socket. */
        close(wfd);
        wfd = -1;
        watcher = -1;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        dk_set_err(err, errlen, "cannot create the folder watcher's socket: %s", strerror(errno));
        return -1;
    }
    long max_fd = dk_watch_fd_limit();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t child = fork();
    if (child == 0)
        watch(sv[1], me, max_fd);
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(sv[1]);
    if (child < 0) {
        close(sv[0]);
        dk_set_err(err, errlen, "cannot fork the folder watcher: %s", strerror(fork_errno));
        return -1;
    }
    setpgid(child, child);
    shutdown(sv[0], SHUT_RD);
    /* A process that ends by exit() (a program returning from main, a test)
     * ends its watcher as dk_tidy_end does, rather than leaving it to be
     * reparented. Once per process: a fork inherits the registration, and
     * dk_tidy_end does nothing in a process that is not the watcher's host. */
    static pid_t registered;
    if (registered != me && atexit(dk_tidy_end) == 0)
        registered = me;
    owner = me;
    watcher = child;
    wfd = sv[0];
    return 0;
}

/* Send OP for PATH (none for '!'); ST: the folder, for '+'. */
static int send_locked(char op, const char *path, const struct stat *st)
{
    char rec[2 + ID_LEN + DK_TIDY_PATH_MAX];
    size_t len = 0;
    rec[len++] = op;
    if (st)
        len += (size_t) snprintf(rec + len, ID_LEN + 1, "%016llx %016llx ",
                                 (unsigned long long) st->st_dev,
                                 (unsigned long long) st->st_ino);
    if (path) {
        memcpy(rec + len, path, strlen(path));
        len += strlen(path);
    }
    rec[len++] = '\0';
    return dk_send_all(wfd, rec, len, -1);
}

/* The watcher is gone (killed by someone): collect it and forget its socket. */
static void lost_locked(void)
{
    close(wfd);
    wfd = -1;
    reap(watcher, 0);
    watcher = -1;
}

int dk_tidy_start(char *err, size_t errlen)
{
    pthread_mutex_lock(&lock);
    int rc = -1;
    if (ended)
        dk_set_err(err, errlen, "the process is ending");
    else
        rc = start_locked(err, errlen);
    pthread_mutex_unlock(&lock);
    return rc;
}

int dk_tidy_keep(const char *path, char *err, size_t errlen)
{
    if (!path || path[0] != '/') {
        dk_set_err(err, errlen, "not an absolute path, so not kept for removal at exit: %s",
                   path ? path : "(null)");
        return -1;
    }
    if (strlen(path) >= DK_TIDY_PATH_MAX) {
        dk_set_err(err, errlen, "the path is too long to be kept for removal at exit "
                   "(%zu bytes, at most %d): %.64s...", strlen(path), DK_TIDY_PATH_MAX - 1, path);
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
        dk_set_err(err, errlen, "%s is not a folder, so not kept for removal at exit", path);
        return -1;
    }
    pthread_mutex_lock(&lock);
    int rc = -1;
    if (ended) {
        dk_set_err(err, errlen, "the process is ending");
    } else if (start_locked(err, errlen) == 0) {
        rc = send_locked('+', path, &st);
        if (rc < 0) {
            /* Someone ended it: a new watcher for what is kept from now on. */
            lost_locked();
            if (start_locked(err, errlen) == 0 && (rc = send_locked('+', path, &st)) < 0) {
                lost_locked();
                dk_set_err(err, errlen, "the folder watcher ended at once");
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

void dk_tidy_forget(const char *path)
{
    if (!path || strlen(path) >= DK_TIDY_PATH_MAX)
        return;
    pthread_mutex_lock(&lock);
    if (owner == getpid() && wfd >= 0 && send_locked('-', path, NULL) < 0)
        lost_locked();
    pthread_mutex_unlock(&lock);
}

void dk_tidy_end(void)
{
    pthread_mutex_lock(&lock);
    ended = true;
    pid_t pid = -1;
    if (owner == getpid() && wfd >= 0) {
        send_locked('!', NULL, NULL);
        close(wfd);
        wfd = -1;
        pid = watcher;
        watcher = -1;
    }
    pthread_mutex_unlock(&lock);
    if (pid > 0)
        reap(pid, END_WAIT_MS);
}

pid_t dk_tidy_pid(void)
{
    pthread_mutex_lock(&lock);
    pid_t pid = owner == getpid() ? watcher : -1;
    pthread_mutex_unlock(&lock);
    return pid;
}
