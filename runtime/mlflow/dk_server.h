/*
 * dk_server: a local HTTP server program the host starts and supervises
 * (`mlflow server` for dk_tracking), as an object the caller owns.
 *
 * The program is looked up on PATH and started on a free loopback port
 * through dk_spawn's guard mode: signals blocked around fork, descriptors
 * swept, stdin /dev/null, and a guard process that leads the server's
 * process group, so the server and every worker it starts die with the host,
 * even when the host is SIGKILLed. Its stdout and stderr go to a log,
 * ROOT/kernel-PID/LOG_NAME under the checked log root (dk_logdir.h), created
 * with O_EXCL | O_NOFOLLOW relative to the folder's descriptor, never a
 * predictable name in a shared /tmp (a planted symlink there once made the
 * kernel overwrite the user's files); the guard removes it when it stops the
 * server.
 *
 * Start returns once the server answers its health URL with 200, and no
 * request goes out before the socket listening on the port is seen to be the
 * server's own (dk_sockowner.h): the port is free when picked but is the
 * server's only once it listens, and in between another user can take it.
 * Such a port is refused, not retried: an attacker who watches /proc for the
 * server's command line wins every retry too, and one clear message tells the
 * user that someone is racing for their server.
 */
#ifndef DK_SERVER_H
#define DK_SERVER_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dk_server_t dk_server_t;

typedef struct {
    const char *program;        /* looked up on PATH, e.g. "mlflow" */
    const char *const *args;    /* after the program, NULL-terminated; an argument
                                   "{port}" becomes the chosen port */
    const char *name;           /* in messages, e.g. "`mlflow server`" */
    const char *log_name;       /* its log file, e.g. "mlflow-server.log" */
    const char *health_path;    /* answers 200 once it serves, e.g. "/health" */
    int start_timeout_s;        /* how long it may take to answer */
} dk_server_spec_t;

/* Start SPEC's program and wait until it serves. Returns the server, or NULL
 * with *MISSING set when the program is not on PATH (ERR untouched), or NULL
 * with a reason in ERR (what failed; where its log is, when there is one):
 * no free port, could not start, exited at start, did not answer in time
 * (then it has been stopped), or the port was taken by a process that is not
 * the server's (then it has been stopped and ERR says who holds the port).
 * Call on the thread whose end should end the
 * server (PR_SET_PDEATHSIG follows the thread). */
dk_server_t *dk_server_start(const dk_server_spec_t *spec, bool *missing, char *err,
                             size_t errlen);

/* Whether the server still holds its port (the socket listening there is its
 * own): 0, or -1 with ERR saying who does. A server that died leaves its port
 * to anyone; call before each use. */
int dk_server_check(const dk_server_t *self, char *err, size_t errlen);

/* Its base URL, "http://127.0.0.1:PORT" (owned by the server). */
const char *dk_server_uri(const dk_server_t *self);

/* Stop the server (its guard ends the whole group: SIGTERM, SIGKILL 3 s later;
 * after 4 s the group is SIGKILLed from here), reap the guard, free, and set
 * *SELF_P to NULL. NULL or *SELF_P NULL: nothing. Blocks up to about 4 s. */
void dk_server_destroy(dk_server_t **self_p);

#endif
