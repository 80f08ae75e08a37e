/*
 * dk_spawn: the one way the runtime starts a process, and the pieces a start
 * needs.
 *
 * Internal to the runtime (dk_job, dk_proc and dk_server use it); not part of
 * the embedding API: the kernel starts processes through those three.
 * Everything that allocates (argv, the environment, the program's path) is
 * prepared before fork, because between fork and exec the child of a
 * multi-threaded host may only make async-signal-safe calls.
 */
#ifndef DK_SPAWN_H
#define DK_SPAWN_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int pid;
    int pidfd;      /* readable when the process exits; -1 where pidfd_open is missing */
    int out_fd;     /* read end of its stdout pipe: non-blocking, close-on-exec */
    int err_fd;     /* read end of its stderr pipe: likewise */
} dk_spawned_t;

typedef struct {
    const char *what;       /* in messages: "rank process", "helper program" */
    int out_fd;             /* >= 0: the child's stdout and stderr (a log), no pipes; the
                               caller keeps its descriptor. -1: fresh pipes */
    bool guard;             /* start a guard that runs PATH as its child (see below) */
    int keep_fd;            /* guard only: a folder descriptor the guard keeps (a copy),
                               or -1 */
    const char *unlink_at_end; /* guard only: a name in KEEP_FD the guard removes when it
                                  stops the program, or NULL */
    bool session;           /* a session of its own (setsid), not only a group: see below */
} dk_spawn_opts_t;

/* SESSION: the child calls setsid() in place of setpgid(0, 0), so it leads a
 * session as well as its group (the group's id is its pid either way, and
 * the caller's killpg reaches it and its children as before). Linux's
 * scheduler gives each session its own autogroup, a fair share of the CPUs
 * that its processes split among themselves: ranks in the kernel's session
 * share one among all of them, and a CPU-bound step on two busy cores was
 * 9% slower for it than under torchrun, whose workers each lead a session
 * (docs/performance.md). Without a terminal the new session changes nothing
 * else. The caller does not set the group itself (it could not, once the
 * child leads a session; nor before: a group leader cannot setsid): the
 * child has done it when dk_spawn_with returns, since that waits for the exec. */

#define DK_SPAWN_OPTS_INIT {.what = "rank process", .out_fd = -1, .keep_fd = -1}

/* dk_spawn with OPTS. In guard mode the process started (OUT->pid, leader of
 * its group) is a guard, not PATH: it starts PATH in its group and, when the
 * caller's thread ends (its PR_SET_PDEATHSIG is SIGTERM, which it catches) or
 * it is sent SIGTERM, stops the whole group, PATH's own children included:
 * SIGTERM, then SIGKILL 3 s later, removing UNLINK_AT_END in between. When
 * PATH ends by itself the guard exits with its status (a signal: 1). An exec
 * failure of PATH is still reported here as an error. OUT's pipes are -1 when
 * OPTS->out_fd was given. */
int dk_spawn_with(const char *path, char *const argv[], char *const envp[],
                  const dk_spawn_opts_t *opts, dk_spawned_t *out, char *err, size_t errlen);

/* Fork and exec PATH with ARGV and ENVP: in a process group of its own, killed
 * when the calling thread exits (PR_SET_PDEATHSIG), default signal dispositions
 * and an empty mask, stdin from /dev/null, stdout and stderr on fresh pipes and
 * no other descriptor open. Returns 0 and fills OUT, or -1 with a reason in ERR
 * when the process could not be started (then none exists: an exec failure is
 * reported and the child reaped here). */
int dk_spawn(const char *path, char *const argv[], char *const envp[], dk_spawned_t *out,
             char *err, size_t errlen);

/* A sentinel for process groups whose leaders die with the host
 * (PR_SET_PDEATHSIG) but whose other members would not: a forked process of
 * its own group, running no program, that waits on a pipe whose only writer
 * is the host and, when the host goes (even by SIGKILL: the pipe's EOF), sends
 * SIGKILL to each of the N groups PGIDS (a rank's subprocess.Popen children,
 * a DataLoader's workers). Fills *PID and *FD (the pipe's write end, kept
 * open and close-on-exec in the host). Returns -1 with ERR when it cannot be
 * started (then none exists). */
int dk_spawn_sentinel(const int *pgids, int n, int *pid, int *fd, char *err, size_t errlen);

/* The last word: a process that runs ARGV (looked up on PATH now, with the
 * host's environment as it is now) when the host ends, however it ends (even
 * SIGKILL: the same pipe as the sentinel's), and not otherwise. It ignores
 * SIGINT, SIGTERM and SIGHUP while it waits (a terminal's Ctrl-C must not
 * disarm it) and runs ARGV with /dev/null on 0-2 and default signals. For what
 * must not outlive the host elsewhere: a Slurm allocation (`scancel`). Fills
 * *PID and *FD as dk_spawn_sentinel does; disarm it with
 * dk_spawn_sentinel_end. Returns -1 with ERR when it cannot be started. */
int dk_spawn_last_word(char *const argv[], int *pid, int *fd, char *err, size_t errlen);

/* Have a last word act now, as if its host had ended (it gets its pipe's
 * EOF), and have it reaped when it is done, without waiting for it here (a
 * thread of its own waits): no zombie is left beside a host that lives on.
 * Sets *PID and *FD to -1. Nothing when *PID <= 0. */
void dk_spawn_last_word_now(int *pid, int *fd);

/* End a sentinel without it acting (the groups are the caller's to end):
 * SIGKILL, reap, close *FD; sets *PID and *FD to -1. Nothing when *PID <= 0. */
void dk_spawn_sentinel_end(int *pid, int *fd);

/* PROGRAM as a path execve accepts: itself if it contains '/', else the first
 * executable match on $PATH. Returns a new string (free it) or NULL with a
 * reason in ERR. */
char *dk_spawn_find_program(const char *program, char *err, size_t errlen);

/* A new environment: BASE without the names that SET (NSET "NAME=value"
 * strings) defines, followed by SET. Returns a NULL-terminated array of new
 * strings (free with dk_spawn_env_free), or NULL when out of memory. */
char **dk_spawn_env_build(const char *const *base, const char *const *set, size_t nset);
void dk_spawn_env_free(char **env);

/* The value of NAME in ENV, or NULL. */
const char *dk_spawn_env_get(const char *const *env, const char *name);

/* Where dk_spawn_free_port looks first: above the usual service ports and
 * below Linux's ephemeral range (32768-60999). */
#define DK_SPAWN_PORT_LOW 20000
#define DK_SPAWN_PORT_HIGH 32768
#define DK_SPAWN_PORT_TRIES 64

/* A TCP port that was free a moment ago on every address of this host
 * (bound, released): a random one in [DK_SPAWN_PORT_LOW, DK_SPAWN_PORT_HIGH),
 * else one the system picks; -1 with a reason in ERR. */
int dk_spawn_free_port(char *err, size_t errlen);

#endif
