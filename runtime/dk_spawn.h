/*
 * dk_spawn: starting one rank process, and the pieces its start needs.
 *
 * Internal to the runtime (dk_job uses it); not part of the embedding API.
 * Everything that allocates (argv, the environment, the program's path) is
 * prepared before fork, because between fork and exec the child of a
 * multi-threaded host may only make async-signal-safe calls.
 */
#ifndef DK_SPAWN_H
#define DK_SPAWN_H

#include <stddef.h>

typedef struct {
    int pid;
    int pidfd;      /* readable when the process exits; -1 where pidfd_open is missing */
    int out_fd;     /* read end of its stdout pipe: non-blocking, close-on-exec */
    int err_fd;     /* read end of its stderr pipe: likewise */
} dk_spawned_t;

/* Fork and exec PATH with ARGV and ENVP: in a process group of its own, killed
 * when the calling thread exits (PR_SET_PDEATHSIG), default signal dispositions
 * and an empty mask, stdin from /dev/null, stdout and stderr on fresh pipes and
 * no other descriptor open. Returns 0 and fills OUT, or -1 with a reason in ERR
 * when the process could not be started (then none exists: an exec failure is
 * reported and the child reaped here). */
int dk_spawn(const char *path, char *const argv[], char *const envp[], dk_spawned_t *out,
             char *err, size_t errlen);

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

/* A TCP port on 127.0.0.1 that was free a moment ago (bound with port 0, read,
 * released), or -1 with a reason in ERR. */
int dk_spawn_free_port(char *err, size_t errlen);

#endif
