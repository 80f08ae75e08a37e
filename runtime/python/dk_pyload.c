/*
 * dk_pyload: the environment's libpython, then distkernel's library on it.
 * See dk_pyload.h.
 */
#include "dk_pyload.h"
#include "dk_err.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *dk_pyload_python(void)
{
    const char *env = getenv("DISTKERNEL_PYTHON");
    return env && *env ? env : DK_PYTHON_EXE;
}

const char *dk_pyload_libpython(void)
{
    const char *env = getenv("DISTKERNEL_LIBPYTHON");
    return env && *env ? env : DK_LIBPYTHON;
}

int dk_pyload_check_python(const char *host, char *err, size_t errlen)
{
    const char *python = dk_pyload_python();
    if (access(python, X_OK) == 0)
        return 0;
    int e = errno;
    if (host)
        dk_set_err(err, errlen,
                   "the kernel's Python environment is not on node %s: %s: %s. The kernel "
                   "runs in the environment of %s, and every node its ranks run on needs "
                   "that environment at the same path: put it on a filesystem the nodes "
                   "share, or create it at that path on each node",
                   host, python, strerror(e), python);
    else
        dk_set_err(err, errlen,
                   "the kernel's Python environment is gone: %s: %s. Install the kernel "
                   "again for an environment that exists (distkernel install --python PATH)",
                   python, strerror(e));
    return -1;
}

int dk_pyload_parse_version(const char *version, int *major, int *minor, bool *free_threaded)
{
    int n = 0;
    if (!version || sscanf(version, "%d.%d%n", major, minor, &n) != 2 || n == 0)
        return -1;
    /* "3.13.0 experimental free-threading build (main, ...)": the words
     * before the build's own parenthesis. */
    size_t head = strcspn(version, "(");
    const char *ft = strstr(version, "free-threading");
    *free_threaded = ft && (size_t)(ft - version) < head;
    return 0;
}

int dk_pyload_open(const char *libpython, char *version, size_t version_len, char *err,
                   size_t errlen)
{
    dlerror();
    void *lib = dlopen(libpython, RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        const char *why = dlerror();
        dk_set_err(err, errlen, "cannot load %s: %s", libpython, why ? why : "dlopen failed");
        return -1;
    }
    const char *(*get_version)(void);
    *(void **)&get_version = dlsym(lib, "Py_GetVersion");   /* POSIX's way round ISO C */
    const char *v = get_version ? get_version() : NULL;
    int major, minor;
    bool ft;
    if (dk_pyload_parse_version(v, &major, &minor, &ft) < 0) {
        dk_set_err(err, errlen, "%s is not a CPython library (it has no Py_GetVersion)",
                   libpython);
        return -1;
    }
    size_t n = strcspn(v, " ");
    if (version)
        snprintf(version, version_len, "%.*s", (int)n, v);
    if (major < DK_PYLOAD_MIN_MAJOR ||
        (major == DK_PYLOAD_MIN_MAJOR && minor < DK_PYLOAD_MIN_MINOR)) {
        dk_set_err(err, errlen,
                   "%s is Python %.*s, older than the oldest distkernel runs on (%d.%d): "
                   "use an environment of Python %d.%d or later",
                   libpython, (int)n, v, DK_PYLOAD_MIN_MAJOR, DK_PYLOAD_MIN_MINOR,
                   DK_PYLOAD_MIN_MAJOR, DK_PYLOAD_MIN_MINOR);
        return -1;
    }
    if (ft) {
        dk_set_err(err, errlen,
                   "%s is a free-threaded Python %.*s, which has no stable ABI for distkernel "
                   "to run on: use the same Python's build with the GIL (python%d.%d, not "
                   "python%d.%dt)",
                   libpython, (int)n, v, major, minor, major, minor);
        return -1;
    }
    return 0;
}

/* This program's folder, in DIR. */
static int own_folder(char *dir, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", dir, len - 1);
    if (n <= 0)
        return -1;
    dir[n] = '\0';
    char *slash = strrchr(dir, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    return 0;
}

void *dk_pyload_entry(const char *name, const char *entry, char *err, size_t errlen)
{
    char path[PATH_MAX], dir[PATH_MAX];
    if (own_folder(dir, sizeof dir) < 0 ||
        (size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path ||
        access(path, F_OK) < 0)
        snprintf(path, sizeof path, "%s/%s", DK_PRIVLIB_DIR, name);
    dlerror();
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        /* "undefined symbol: PyX": the libpython loaded lacks what the
         * stable ABI of 3.10 promises; not a CPython, or a broken one. */
        dk_set_err(err, errlen, "cannot load %s: %s%s", path, why ? why : "dlopen failed",
                   why && strstr(why, "undefined symbol")
                       ? " (the environment's libpython lacks it: is it a CPython 3.10 or "
                         "later?)"
                       : "");
        return NULL;
    }
    void *fn = dlsym(lib, entry);
    if (!fn)
        dk_set_err(err, errlen, "%s has no %s: distkernel's installation is incomplete",
                   path, entry);
    return fn;
}
