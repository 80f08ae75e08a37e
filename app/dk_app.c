/*
 * The kernel's body, in libdistkernel-kernel.so: what `distkernel -f FILE`
 * runs once the program (main.c) has loaded the environment's libpython
 * (runtime/python/dk_pyload.h). The composition root: it builds the kernel,
 * adds the features and runs it.
 */
#include "dk_check.h"
#include "dk_conn.h"
#include "dk_distributed.h"
#include "dk_fdlimit.h"
#include "dk_tidy.h"
#include "dk_kernel.h"

#include <czmq.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Do not trust the signal state we inherit. A server started in the background
 * by a script (`jupyter notebook &`, nohup, many container entrypoints) passes
 * SIGINT, and sometimes SIGHUP or SIGQUIT, as ignored, and may pass a blocked
 * mask; ignored dispositions and the mask survive exec, so every process the
 * kernel starts (`!cmd`, subprocess, multiprocessing) would inherit them too.
 * Every ignored signal goes back to its default and the mask is emptied.
 * SIGINT is the exception until Python is up: its default would kill the
 * kernel, so it stays as inherited and the glue installs Python's
 * KeyboardInterrupt handler itself (what ipykernel does too), whatever
 * CPython's own initialisation decided from the inherited state. */
static void reset_inherited_signals(void)
{
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP || sig == SIGINT || sigaction(sig, NULL, &sa) != 0)
            continue;
        if (!(sa.sa_flags & SA_SIGINFO) && sa.sa_handler == SIG_IGN) {
            sa.sa_handler = SIG_DFL;
            sigaction(sig, &sa, NULL);
        }
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

__attribute__((visibility("default"))) int dk_kernel_main(const char *conn_path,
                                                         const char *unusable);

/* Serve the connection file CONN_PATH. UNUSABLE, when not NULL, is why the
 * environment's Python cannot run (the one line every request is answered
 * with, dk_kernel_run). Returns only when the kernel cannot start. */
int dk_kernel_main(const char *conn_path, const char *unusable)
{
    reset_inherited_signals();
    /* CZMQ would install SIGINT/SIGTERM handlers of its own on first use; the
     * interpreter's handler must be the one that sees SIGINT. */
    zsys_handler_set(NULL);

    /* Every frontend connection and every rank of a run is a descriptor; the
     * usual soft limit of 1024 is far below what the hard limit allows. */
    dk_fdlimit_raise();

    /* The folder watcher (dk_tidy.h), forked now while the process is small:
     * it holds, for the kernel's life, the pages the kernel has at the fork. */
    char why[256];
    if (dk_tidy_start(why, sizeof why) < 0)
        fprintf(stderr, "distkernel: warning: %s; the kernel's temporary folders stay in "
                "TMPDIR if it is killed\n", why);

    char err[1024];
    dk_conn_t conn;
    if (dk_conn_load(conn_path, &conn, err, sizeof err) < 0) {
        fprintf(stderr, "distkernel: %s\n", err);
        return 1;
    }
    /* Legal (the spec says an empty key disables signing), but then anyone who
     * can reach the ports can run code as this user. */
    if (conn.key_len == 0)
        dk_log("warning: the connection file's key is empty, so messages are not signed: "
               "any process that can reach %s:%d can run code in this kernel",
               conn.ip, conn.ports[DK_CHAN_SHELL]);
    dk_kernel_t *kernel = dk_kernel_new(&conn, err, sizeof err);
    if (!kernel) {
        fprintf(stderr, "distkernel: %s\n", err);
        dk_conn_clear(&conn);
        return 1;
    }
    /* The composition root: the features are built here, on the kernel core,
     * which knows nothing of them. They live as long as the process. */
    if (!dk_distributed_new(kernel) || dk_check_register(kernel) < 0) {
        fprintf(stderr, "distkernel: cannot set up %%%%distributed (out of memory)\n");
        return 1;
    }
    dk_kernel_run(kernel, unusable);
    return 0;
}
