/*
 * dk_dist_warm: the kernel's warm-start template. See the header.
 *
 * A template that failed (an import error, or not ready within the wait) is
 * ended and its fingerprint remembered with the reason: the runs after it go
 * cold at once with that reason instead of paying for the same failure (up to
 * DISTKERNEL_WARM_WAIT_S, 180 s) each time, until something it was built from
 * changes.
 */
#include "dk_pyabi.h"

#include "dk_dist_warm.h"
#include "dk_log.h"
#include "dk_setting.h"

#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WARM_SLICE_MS 100

/* The fingerprint whose template failed, and why (under warm_lock). */
static char failed_fp[128];
static char failed_why[1024];

/* How long a run waits for its template to import before it goes cold. */
static int build_wait_ms(void)
{
    return (int)(dk_setting_number("DISTKERNEL_WARM_WAIT_S") * 1000);
}

/* torch (unless DISTKERNEL_WARM_TORCH=0), DISTKERNEL_WARM_MODULES, then
 * warm_modules=, comma-separated; "" when there are none. */
static void module_list(const dk_dist_opts_t *opts, char *out, size_t len)
{
    const char *env = getenv("DISTKERNEL_WARM_MODULES");
    const char *torch = getenv("DISTKERNEL_WARM_TORCH");
    const char *parts[] = {torch && strcmp(torch, "0") == 0 ? "" : "torch", env ? env : "",
                           opts->warm_modules};
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (!parts[i][0] || used >= len)
            continue;
        int n = snprintf(out + used, len - used, "%s%s", used ? "," : "", parts[i]);
        used = n < 0 ? len : used + (size_t) n;
    }
}

/* The kernel's sys.path, newline-separated (a new string), or NULL. */
static char *import_path(void)
{
    PyObject *path = PySys_GetObject("path");   /* borrowed */
    PyObject *sep = PyUnicode_FromString("\n");
    PyObject *joined = path && sep ? PyUnicode_Join(sep, path) : NULL;
    Py_XDECREF(sep);
    const char *s = joined ? dk_py_utf8(joined) : NULL;
    char *copy = s ? strdup(s) : NULL;
    Py_XDECREF(joined);
    PyErr_Clear();
    return copy;
}

/* distkernel._dist.warm_fingerprint(MODULES) into OUT; false with WHY. */
static bool fingerprint(const char *modules, char *out, size_t len, char *why, size_t whylen)
{
    PyObject *mod = PyImport_ImportModule("distkernel._dist");
    PyObject *fp = mod ? PyObject_CallMethod(mod, "warm_fingerprint", "s", modules) : NULL;
    Py_XDECREF(mod);
    const char *s = fp ? dk_py_utf8(fp) : NULL;
    if (!s) {
        PyErr_Clear();
        snprintf(why, whylen, "the template's fingerprint could not be computed");
        Py_XDECREF(fp);
        return false;
    }
    snprintf(out, len, "%s", s);
    Py_DECREF(fp);
    return true;
}

static const char *warm_socket(dk_template_t **slot, const dk_dist_opts_t *opts,
                               const char *rank_exe, bool *interrupted, char *why,
                               size_t whylen);

/* One run at a time builds or checks the template: a run waits for the
 * template with the GIL released, when another thread's run (a .distributed()
 * call) could otherwise replace it under it. Taken with the GIL released, so
 * that the thread holding it can always get the GIL back. */
static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;

/* Whether the calling thread is Python's main thread (the kernel's). */
static bool on_main_thread(void)
{
    PyObject *threading = PyImport_ImportModule("threading");
    PyObject *main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
    PyObject *ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
    unsigned long id = ident ? PyLong_AsUnsignedLong(ident) : 0;
    Py_XDECREF(ident);
    Py_XDECREF(main);
    Py_XDECREF(threading);
    PyErr_Clear();
    return ident && id == PyThread_get_thread_ident();
}

char *dk_dist_warm_socket(dk_template_t **slot, const dk_dist_opts_t *opts,
                          const char *rank_exe, bool *interrupted, char *why, size_t whylen)
{
    *interrupted = false;
    /* Only the main thread: the template's PR_SET_PDEATHSIG follows the
     * thread that started it (a worker's exit would kill it and its ranks),
     * and a run from another thread with another fingerprint would replace
     * the template under a run that is starting ranks from it. */
    if (opts->warm && !on_main_thread()) {
        snprintf(why, whylen, "warm start is for runs from the kernel's main thread; this "
                 "run came from another thread (a .distributed() call in a thread)");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&warm_lock);
    Py_END_ALLOW_THREADS
    const char *socket = warm_socket(slot, opts, rank_exe, interrupted, why, whylen);
    /* Copied under the lock: the template may be replaced once it is let go. */
    char *copy = socket ? strdup(socket) : NULL;
    if (socket && !copy)
        snprintf(why, whylen, "out of memory");
    pthread_mutex_unlock(&warm_lock);
    return copy;
}

static const char *warm_socket(dk_template_t **slot, const dk_dist_opts_t *opts,
                               const char *rank_exe, bool *interrupted, char *why,
                               size_t whylen)
{
    *interrupted = false;
    const char *off = getenv("DISTKERNEL_WARM");
    if (!opts->warm || (off && strcmp(off, "0") == 0)) {
        snprintf(why, whylen, "warm start is off (%s)",
                 opts->warm ? "DISTKERNEL_WARM=0" : "warm=False");
        return NULL;
    }
    if (opts->launcher != DK_LAUNCHER_LOCAL) {
        snprintf(why, whylen, "warm start is for ranks on this node; launcher=slurm starts "
                 "them on Slurm's nodes");
        return NULL;
    }
    char modules[1024], fp[128];
    module_list(opts, modules, sizeof modules);
    if (!fingerprint(modules, fp, sizeof fp, why, whylen))
        return NULL;
    if (failed_fp[0] && strcmp(failed_fp, fp) == 0) {
        snprintf(why, whylen, "the template built from this kernel's state failed before "
                 "(%s); a change to the environment, working directory, sys.path, packages "
                 "or warm modules builds a new one", failed_why);
        return NULL;
    }
    failed_fp[0] = '\0';
    const char *rebuilt = "";
    char gone[512];
    if (*slot && strcmp(dk_template_fingerprint(*slot), fp) != 0) {
        dk_template_destroy(slot);
        rebuilt = "a new template (the kernel's environment, working directory, sys.path, "
                  "packages or warm modules changed): ";
    } else if (*slot && dk_template_was_ready(*slot) &&
               dk_template_ready(*slot, 0, gone, sizeof gone) < 0) {
        /* It served and then ended (killed, out of memory): build another. */
        dk_template_destroy(slot);
        rebuilt = "a new template (the last one had ended): ";
    }
    if (!*slot) {
        char err[1024];
        char *path = import_path();
        *slot = dk_template_start(rank_exe, NULL, modules, path, fp, err, sizeof err);
        free(path);
        if (!*slot) {
            snprintf(why, whylen, "%s%s", rebuilt, err);
            return NULL;
        }
    }
    int ready = 0, wait_ms = build_wait_ms();
    for (int waited = 0; ready == 0 && waited < wait_ms; waited += WARM_SLICE_MS) {
        Py_BEGIN_ALLOW_THREADS
        ready = dk_template_ready(*slot, WARM_SLICE_MS, why, whylen);
        Py_END_ALLOW_THREADS
        if (PyErr_CheckSignals() < 0) {
            /* The template goes on importing; the next run may use it. */
            *interrupted = true;
            return NULL;
        }
    }
    if (ready == 0)
        snprintf(why, whylen, "the template was not ready after %.1f s (still %s%s)",
                 wait_ms / 1000.0, modules[0] ? "importing " : "starting", modules);
    if (ready <= 0 && !dk_template_was_ready(*slot)) {
        /* Never ready: end it, and let no later run wait for the same. */
        snprintf(failed_fp, sizeof failed_fp, "%s", fp);
        snprintf(failed_why, sizeof failed_why, "%s", why);
        dk_template_destroy(slot);
        return NULL;
    }
    if (ready <= 0 || dk_template_check(*slot, why, whylen) < 0)
        return NULL;
    return dk_template_socket(*slot);
}

bool dk_dist_warm_for_agents(const dk_dist_opts_t *opts, char *modules, size_t len,
                             char **path, char *why, size_t whylen)
{
    *path = NULL;
    const char *off = getenv("DISTKERNEL_WARM");
    if (!opts->warm || (off && strcmp(off, "0") == 0)) {
        snprintf(why, whylen, "warm start is off (%s)",
                 opts->warm ? "DISTKERNEL_WARM=0" : "warm=False");
        return false;
    }
    module_list(opts, modules, len);
    *path = import_path();
    return true;
}

void dk_dist_warm_for_run(const void *payload, size_t len, char *modules, size_t mlen,
                          const char *log_dir)
{
    if (!payload || !modules[0])
        return;
    PyObject *mod = PyImport_ImportModule("distkernel._dist");
    PyObject *res = mod ? PyObject_CallMethod(mod, "agent_warm_modules", "y#s",
                                              (const char *) payload, (Py_ssize_t) len, modules)
                        : NULL;
    Py_XDECREF(mod);
    const char *narrowed, *why;
    if (res && PyArg_ParseTuple(res, "ss", &narrowed, &why) && strlen(narrowed) < mlen) {
        if (why[0] && log_dir) {
            char path[4200];
            snprintf(path, sizeof path, "%s/warm.log", log_dir);
            int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd >= 0) {
                dprintf(fd, "%s\n", why);
                close(fd);
            }
        }
        snprintf(modules, mlen, "%s", narrowed);
    }
    Py_XDECREF(res);
    PyErr_Clear();
}

void dk_dist_warm_end(dk_template_t **slot)
{
    /* A run may hold the lock while it waits for the template (up to the
     * build wait): exit does not wait that long. Without the lock only the
     * pidfd is safe to signal (the run may reap the template meanwhile). */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    if (pthread_mutex_timedlock(&warm_lock, &until) != 0) {
        dk_template_kill(*slot);
        return;
    }
    dk_template_end(*slot);
    pthread_mutex_unlock(&warm_lock);
}

void dk_dist_warm_status_line(dk_template_t **slot, char *out, size_t outlen)
{
    out[0] = '\0';
    if (pthread_mutex_trylock(&warm_lock) != 0)
        return;     /* a run is building or using it: no line rather than a wait */
    long kb = *slot ? dk_template_rss_kb(*slot) : -1;
    if (kb >= 0)
        snprintf(out, outlen, "warm-start template: " DK_TEMPLATE_ARGV0 " (pid %d), "
                              "%.1f MiB resident; fresh runs' ranks are forked from it\n",
                 dk_template_pid(*slot), (double) kb / 1024.0);
    pthread_mutex_unlock(&warm_lock);
}

void dk_dist_warm_note(const char *log_dir, const char *why)
{
    if (getenv("DISTKERNEL_DEBUG"))
        dk_log("ranks start cold: %s", why);
    char path[4200];
    snprintf(path, sizeof path, "%s/warm.log", log_dir);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    dprintf(fd, "the ranks started cold: %s\n", why);
    close(fd);
}
