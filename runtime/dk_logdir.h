/*
 * dk_logdir: where the runtime's files go on a machine shared with other users,
 * and how much of the disk they may take.
 *
 * The log root. DISTKERNEL_LOG_DIR, or else the user's own state directory
 * ($XDG_STATE_HOME/distkernel/logs, $HOME/.local/state/distkernel/logs), never
 * a predictable name in a shared /tmp. It is opened one component at a time with
 * openat(O_NOFOLLOW | O_DIRECTORY), and every component is checked on its open
 * descriptor (fstat): owned by root or the user, and writable by others only
 * when sticky (/tmp). A component that is a symlink is followed only when the
 * link is owned by root or the user (a home directory on a symlink works; a
 * link planted by someone else does not). The root itself must be the user's
 * and not writable by group or others. Whatever is missing is created 0700.
 *
 * Below the root: ROOT/kernel-PID/ per host process, ROOT/kernel-PID/run-... per
 * job, each made with mkdirat 0700 and reopened O_NOFOLLOW; files are created
 * with openat(O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC), 0600. So a path, once
 * its root is verified, is resolved only through directories nobody else can
 * write: no rename or symlink can redirect it.
 *
 * Retention. Pruning removes whole run folders with unlinkat, looking at each
 * entry with fstatat(AT_SYMLINK_NOFOLLOW) and descending only through
 * openat(O_NOFOLLOW): a symlink is removed, never followed, and nothing outside
 * the root is touched. A job's run folder is held with flock(LOCK_SH) while it
 * runs (dk_logdir_hold); pruning skips a folder it cannot lock exclusively, so
 * a running job's logs are never removed, by this kernel or another.
 *
 * The size cap. dk_logfile_t writes one rank's log up to a cap: see below.
 */
#ifndef DK_LOGDIR_H
#define DK_LOGDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define DK_LOG_CAP_DEFAULT (1ULL << 30)        /* per rank log: 1 GiB */
#define DK_LOG_CAP_MIN (4ULL << 10)            /* below this a log is all marker */
#define DK_LOG_ROOT_CAP_DEFAULT (10ULL << 30)  /* the whole root: 10 GiB */

/* Flags of dk_logdir_open. */
#define DK_LOGDIR_CREATE 1     /* create missing components, 0700 */
#define DK_LOGDIR_SHARED_OK 2  /* the final directory may be root's and sticky (/tmp) */

/* The default log root as a path (malloc'd, the caller frees): DISTKERNEL_LOG_DIR,
 * $XDG_STATE_HOME/distkernel/logs, or $HOME (the passwd entry's when unset)
 * /.local/state/distkernel/logs. NULL with a reason in ERR when none is known. */
char *dk_logdir_default_root(char *err, size_t errlen);

/* Open directory PATH as described above and return a descriptor on it
 * (O_DIRECTORY | O_CLOEXEC, the caller closes), or -1 with a reason in ERR
 * that names the directory at fault and ends with HINT (may be NULL), e.g.
 * "set DISTKERNEL_LOG_DIR to a directory of yours". */
int dk_logdir_open(const char *path, int flags, const char *hint, char *err, size_t errlen);

/* Directory NAME in DIRFD: created 0700 (with FRESH, one that already exists
 * is an error), opened O_NOFOLLOW and checked (the user's, not writable by
 * others). Returns its descriptor or -1 with a reason in ERR. */
int dk_logdir_mkdir(int dirfd, const char *name, bool fresh, char *err, size_t errlen);

/* A new file NAME in DIRFD, write-only and appending, 0600, with O_EXCL and
 * O_NOFOLLOW (an existing entry is an error: unlink it first if it may be a
 * leftover). Returns its descriptor or -1 with a reason in ERR. */
int dk_logdir_create(int dirfd, const char *name, char *err, size_t errlen);

/* Hold directory descriptor FD as in use (flock LOCK_SH) until it is closed:
 * pruning then leaves it alone. Returns 0, or -1 with errno. */
int dk_logdir_hold(int fd);

/* Remove NAME in DIRFD: a file or symlink is unlinked, a directory emptied
 * (to a depth of 4, never through a symlink) and removed. Returns 0, or -1
 * with errno when NAME (or something in it) could not be removed. */
int dk_logdir_remove(int dirfd, const char *name);

/* Bytes used under NAME in DIRFD (st_blocks, never through a symlink). */
unsigned long long dk_logdir_usage(int dirfd, const char *name);

/* What pruning keeps. */
typedef struct {
    int keep_dead_kernels;      /* folders of exited kernels kept regardless of age */
    long dead_age_s;            /* older folders of exited kernels beyond those go */
    unsigned long long cap;     /* the whole root; 0: no cap */
} dk_logdir_policy_t;

/* Prune the root ROOTFD: folders kernel-PID of processes that no longer exist
 * (other than SELF) beyond the newest KEEP_DEAD_KERNELS once older than
 * DEAD_AGE_S; then, while the root holds more than CAP bytes, run folders
 * (kernel-*\/run-*) oldest first, never one that is held (dk_logdir_hold), and
 * kernel folders of exited processes left empty. Returns the number of run
 * folders removed for the cap. */
int dk_logdir_prune(int rootfd, const dk_logdir_policy_t *policy, pid_t self);

/* ------------------------------------------------------------------------ */
/* A log file with a size cap.
 *
 * A rank can print faster than any disk fills (5 GiB in 33 s was measured),
 * and what matters in a huge log is its beginning (the setup, the first
 * error) and its end (the last error, the traceback). So a capped log keeps
 * its head and its tail: the first CAP/2 bytes go straight to the file; after
 * that, output goes to two tail segments, NAME.tail-0 and NAME.tail-1, of CAP/4
 * each, used in turn: when the current one is full, the other is truncated and
 * written next. The older segment's bytes are what is dropped. When the log is
 * closed, a marker line saying how many bytes were left out is appended,
 * followed by the older segment and then the newer one (from the first line
 * that starts within their first 4 KiB, so the tail does not open mid-line),
 * and the segments are removed. So disk use is at most CAP while the rank runs
 * (1.25 CAP for a moment while the tail is copied, each segment emptied once
 * copied), memory is one copy buffer, and the tail holds between CAP/4 and
 * CAP/2 of the last bytes. Until the log is closed
 * the latest output is in the segments, not in NAME. */
typedef struct dk_logfile_t dk_logfile_t;

/* Create NAME in DIRFD (dk_logdir_create) with cap CAP (0: DK_LOG_CAP_DEFAULT;
 * smaller than DK_LOG_CAP_MIN: DK_LOG_CAP_MIN). Keeps a duplicate of DIRFD.
 * NULL with a reason in ERR. */
dk_logfile_t *dk_logfile_new(int dirfd, const char *name, unsigned long long cap, char *err,
                             size_t errlen);

/* Append LEN bytes. Returns 0, or -1 with errno when a write failed (a full
 * disk): the log is then incomplete and later writes are refused. */
int dk_logfile_write(dk_logfile_t *self, const void *bytes, size_t len);

/* True once the output passed the head, that is, once it will be cut. */
bool dk_logfile_capped(dk_logfile_t *self);

/* Bytes written so far in all. */
unsigned long long dk_logfile_total(dk_logfile_t *self);

/* The cap in effect. */
unsigned long long dk_logfile_cap(dk_logfile_t *self);

/* Assemble head, marker and tail into NAME, remove the segments, close, free.
 * Returns 0, or -1 with errno when the assembly could not be written. Sets
 * *SELF_P to NULL. */
int dk_logfile_close(dk_logfile_t **self_p);

#endif
