/*
 * distkernel: a Jupyter kernel for Python, written in C.
 *
 *     distkernel [--python PATH] -f CONNECTION_FILE
 *     distkernel install [--user | --sys-prefix | --prefix DIR] [--name NAME] ...
 *
 * Started by a Jupyter frontend through its kernelspec (kernel.json), which
 * `distkernel install` writes (app/dk_install.h).
 */
#include "dk_check.h"
#include "dk_conn.h"
#include "dk_distributed.h"
#include "dk_fdlimit.h"
#include "dk_tidy.h"
#include "dk_install.h"
#include "dk_kernel.h"
#include "dk_pyinit.h"

#include <czmq.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: distkernel [--python PATH] -f CONNECTION_FILE\n"
            "       distkernel install [--user | --sys-prefix | --prefix DIR] [--name NAME]\n"
            "                          [--display-name TEXT] [--python PATH] [--env VAR VALUE]...\n"
            "\n"
            "A Jupyter kernel for Python notebooks, with %%%%distributed to run a cell as\n"
            "torch.distributed ranks. Frontends start it through its kernelspec:\n"
            "pick \"distkernel\" in Jupyter, or `jupyter console --kernel distkernel`.\n"
            "`distkernel install --python ENV/bin/python` writes one for a Python\n"
            "environment (see `distkernel install --help`).\n");
}

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

/* Run in the environment of PYTHON (a venv's or conda env's python): the
 * embedded interpreter starts as that python (dk_pyinit reads
 * DISTKERNEL_PYTHON), and so does every rank, which inherits the variable;
 * the environment's bin folder comes first on PATH, as an activated venv has
 * it, so `!pip` and subprocesses find its programs. */
static int use_environment(const char *python)
{
    if (setenv("DISTKERNEL_PYTHON", python, 1) < 0)
        return -1;
    char err[1024];
    if (dk_pyinit_check_python(NULL, err, sizeof err) < 0) {
        fprintf(stderr, "distkernel: %s\n", err);
        return -1;
    }
    const char *slash = strrchr(python, '/');
    if (!slash)
        return 0;
    const char *path = getenv("PATH");
    char *bin = strndup(python, slash == python ? 1 : (size_t)(slash - python)), *value = NULL;
    int rc = -1;
    if (bin && asprintf(&value, "%s%s%s", bin, path && *path ? ":" : "", path ? path : "") >= 0)
        rc = setenv("PATH", value, 1);
    free(bin);
    free(value);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "install") == 0)
        return dk_install_main(argc - 1, argv + 1);
    reset_inherited_signals();
    /* CZMQ would install SIGINT/SIGTERM handlers of its own on first use; the
     * interpreter's handler must be the one that sees SIGINT. */
    zsys_handler_set(NULL);

    const char *conn_path = NULL, *python = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--python") == 0 && i + 1 < argc) {
            python = argv[++i];
        } else if ((strcmp(argv[i], "-f") == 0 || strcmp(argv[i], "--connection-file") == 0) &&
            i + 1 < argc) {
            conn_path = argv[++i];
        } else if (strncmp(argv[i], "--connection-file=", 18) == 0) {
            conn_path = argv[i] + 18;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("distkernel %s\n", DK_VERSION);
            return 0;
        } else {
            fprintf(stderr, "distkernel: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!conn_path) {
        fprintf(stderr, "distkernel: no connection file given (-f FILE)\n");
        usage(stderr);
        return 2;
    }
    /* Without --python, the build's own Python, whatever a parent kernel in
     * another environment passed down (a notebook that runs `jupyter execute`). */
    if (python ? use_environment(python) < 0 : unsetenv("DISTKERNEL_PYTHON") < 0)
        return 1;

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
    dk_kernel_run(kernel);
}
