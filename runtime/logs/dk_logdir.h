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
 * The size cap of one log file is dk_logfile.h's.
 */
#ifndef DK_LOGDIR_H
#define DK_LOGDIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#define DK_LOG_ROOT_CAP_DEFAULT (10ULL << 30)  /* the whole root: 10 GiB */

/* Flags of dk_logdir_open. */
#define DK_LOGDIR_CREATE 1     /* create missing components, 0700 */
#define DK_LOGDIR_SHARED_OK 2  /* the final directory may be root's and sticky (/tmp) */
#define DK_LOGDIR_CODE 4       /* a place code is run or imported from (a rank's folder, a
                                  sys.path entry): the final component may be root's as well
                                  as the user's (/usr/lib/python3/dist-packages), may be a
                                  regular file (a zip on sys.path), and must not be writable
                                  by group or others, sticky or not; refusals say "for code" */

/* The default log root as a path (malloc'd, the caller frees): DISTKERNEL_LOG_DIR,
 * $XDG_STATE_HOME/distkernel/logs, or $HOME (the passwd entry's when unset)
 * /.local/state/distkernel/logs. NULL with a reason in ERR when none is known. */
char *dk_logdir_default_root(char *err, size_t errlen);

/* Open directory PATH as described above and return a descriptor on it
 * (O_DIRECTORY | O_CLOEXEC, the caller closes), or -1 with a reason in ERR
 * that names the directory at fault and ends with HINT (may be NULL), e.g.
 * "set DISTKERNEL_LOG_DIR to a directory of yours". On -1, errno is the
 * failed call's (ENOENT: a component is missing) or EACCES when what was
 * found is refused. A relative PATH is taken from the working directory. */
int dk_logdir_open(const char *path, int flags, const char *hint, char *err, size_t errlen);

/* A fresh 0700 directory "BASE/distkernel-KIND-XXXXXX" for a Unix socket
 * named SOCKET_NAME: under $TMPDIR, or under /tmp when $TMPDIR is unset, too
 * long for a socket path, refused (another user's, writable by others) or
 * unusable; ERR then says both reasons if /tmp fails too. The base is checked first (dk_logdir_open with
 * DK_LOGDIR_SHARED_OK), so that nobody else can rename the fresh directory
 * away and put their own in its place before the socket is bound. Returns the
 * path (malloc'd) or NULL with a reason in ERR that names WHAT ("the back
 * channel's directory"). The directory is removed when this process ends,
 * however it ends (dk_tidy.h), unless dk_logdir_socket_dir_remove removed it
 * first. It holds ".owner", which this process keeps locked (flock) for the
 * directory's life: the first call in a process removes the user's
 * directories of this kind in the base that are older than a minute and
 * whose owner is gone with its watcher (both SIGKILLed, as Slurm may end a
 * node agent's step). */
char *dk_logdir_socket_dir(const char *kind, const char *socket_name, const char *what,
                           char *err, size_t errlen);

/* Remove DIR, a directory from dk_logdir_socket_dir emptied by its user (its
 * socket unlinked), and tell the watcher it is gone. */
void dk_logdir_socket_dir_remove(const char *dir);

/* Directory NAME in DIRFD: created 0700 (with FRESH, one that already exists
 * is an error), opened O_NOFOLLOW and checked (the user's, not writable by
 * others). Returns its descriptor or -1 with a reason in ERR. */
int dk_logdir_mkdir(int dirfd, const char *name, bool fresh, char *err, size_t errlen);

/* A new file NAME in DIRFD, write-only and appending, 0600, with O_EXCL and
 * O_NOFOLLOW (an existing entry is an error: unlink it first if it may be a
 * leftover). Returns its descriptor or -1 with a reason in ERR. */
int dk_logdir_create(int dirfd, const char *name, char *err, size_t errlen);

/* File NAME in DIRFD, the user's alone: opened read-write, created 0600 when
 * absent, never through a symlink (O_NOFOLLOW); an existing one must be a
 * regular file of the user's, and loses any group or other permission. For a
 * store another program then opens by path (mlflow.db). Returns its
 * descriptor or -1 with a reason in ERR. */
int dk_logdir_private_file(int dirfd, const char *name, char *err, size_t errlen);

/* Write the file at PATH (a run's folder's, made 0600, never through a
 * symlink, truncated) with WRITE(F, DATA), which returns 0 or -1 with errno
 * set. Returns 0, or -1 with ERR naming PATH and why (the open, WRITE, or the
 * final flush and close). For the files an error names (ranks.txt, stacks.txt). */
int dk_logdir_write_file(const char *path, int (*write)(FILE *f, void *data), void *data,
                         char *err, size_t errlen);

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
 * kernel folders of exited processes left empty. With a cap, *USAGE (when not
 * NULL) gets the bytes the root holds afterwards. Returns the number of run
 * folders removed for the cap. */
int dk_logdir_prune(int rootfd, const dk_logdir_policy_t *policy, pid_t self,
                    unsigned long long *usage);

#endif
