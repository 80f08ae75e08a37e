/*
 * distkernel: a Jupyter kernel for Python, written in C.
 *
 *     distkernel [--python PATH [--libpython LIB]] -f CONNECTION_FILE
 *     distkernel install [--user | --sys-prefix | --prefix DIR] [--name NAME] ...
 *     distkernel config [--all | --names | --markdown]
 *
 * Started by a Jupyter frontend through its kernelspec (kernel.json), which
 * `distkernel install` writes (app/dk_install.h).
 *
 * This program links no Python: it finds the environment's libpython, loads
 * it, and then the kernel itself (dk_app.c, in libdistkernel-kernel.so) on it
 * (runtime/python/dk_pyload.h). An environment that cannot run any more (gone,
 * changed, IPython removed) still gets a kernel: one that answers every
 * request with the one line that says why, and what to do.
 */
#include "dk_install.h"
#include "dk_pyload.h"
#include "dk_pyprobe.h"
#include "dk_settings.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: distkernel [--python PATH [--libpython LIB]] -f CONNECTION_FILE\n"
            "       distkernel install [--user | --sys-prefix | --prefix DIR] [--name NAME]\n"
            "                          [--display-name TEXT] [--python PATH] [--env VAR VALUE]...\n"
            "       distkernel config [--all | --names | --markdown]\n"
            "\n"
            "A Jupyter kernel for Python notebooks, with %%%%distributed to run a cell as\n"
            "torch.distributed ranks. Frontends start it through its kernelspec:\n"
            "pick \"distkernel\" in Jupyter, or `jupyter console --kernel distkernel`.\n"
            "`distkernel install --python ENV/bin/python` writes one for a Python\n"
            "environment, CPython 3.10 or later (see `distkernel install --help`).\n");
}

/* Run in the environment of PYTHON (a venv's or conda env's python): the
 * interpreter starts as that python (dk_pyload reads DISTKERNEL_PYTHON), and
 * so does every rank, which inherits the variable; the environment's bin
 * folder comes first on PATH, as an activated venv has it, so `!pip` and
 * subprocesses find its programs. */
static int use_environment(const char *python, char *why, size_t whylen)
{
    if (setenv("DISTKERNEL_PYTHON", python, 1) < 0 ||
        dk_pyload_check_python(NULL, why, whylen) < 0)
        return -1;
    const char *slash = strrchr(python, '/');
    if (!slash)
        return 0;
    const char *path = getenv("PATH");
    char *bin = strndup(python, slash == python ? 1 : (size_t)(slash - python)), *value = NULL;
    if (bin && asprintf(&value, "%s%s%s", bin, path && *path ? ":" : "", path ? path : "") >= 0)
        setenv("PATH", value, 1);
    free(bin);
    free(value);
    return 0;
}

/* The installation PYTHON resolves to, as PREFIX/bin/pythonX.Y: PREFIX in
 * PREFIX_OUT and "X.Y" in VERSION. -1 when it is not laid out so. */
static int installation_of(const char *python, char *prefix_out, size_t len, char *version,
                           size_t vlen)
{
    char real[PATH_MAX];
    if (!realpath(python, real))
        return -1;
    char *name = strrchr(real, '/');
    *name++ = '\0';
    char *bin = strrchr(real, '/');
    int n = 0;
    if (!bin || strcmp(bin, "/bin") != 0 || strncmp(name, "python3.", 8) != 0 ||
        sscanf(name + 6, "%*d.%*d%n", &n) < 0 || n == 0 || name[6 + n] != '\0')
        return -1;
    *bin = '\0';
    snprintf(prefix_out, len, "%s", real);
    snprintf(version, vlen, "%s", name + 6);
    return 0;
}

/* Whether LIB, recorded when the kernel was installed, is still PYTHON's:
 * there, and of the installation PYTHON resolves to (a venv made again from
 * another Python, a conda env upgraded to another version, are not). */
static bool still_its_library(const char *python, const char *lib)
{
    char prefix[PATH_MAX], version[16], want[64];
    if (access(lib, R_OK) < 0)
        return false;
    if (installation_of(python, prefix, sizeof prefix, version, sizeof version) < 0)
        return true;          /* not laid out as an installation: nothing to compare */
    size_t n = strlen(prefix);
    const char *lib_name = strrchr(lib, '/');
    snprintf(want, sizeof want, "libpython%s.", version);
    return strncmp(lib, prefix, n) == 0 && lib[n] == '/' && lib_name &&
           strncmp(lib_name + 1, want, strlen(want)) == 0;
}

/* PYTHON's libpython where an installation keeps it (PREFIX/lib, or
 * PREFIX/lib/ARCH as Debian's does), found without running it: for a
 * kernelspec that names none (written before --libpython was) or one that is
 * no longer the environment's. NULL when it is not there: the probe says. */
static char *library_beside(const char *python)
{
    char prefix[PATH_MAX], version[16], path[PATH_MAX + 64];
    if (installation_of(python, prefix, sizeof prefix, version, sizeof version) < 0)
        return NULL;
    snprintf(path, sizeof path, "%s/lib/libpython%s.so.1.0", prefix, version);
    if (access(path, R_OK) == 0)
        return strdup(path);
    snprintf(path, sizeof path, "%s/lib/%s/libpython%s.so.1.0", prefix, DK_MULTIARCH, version);
    return access(path, R_OK) == 0 ? strdup(path) : NULL;
}

/* The libpython for the environment of PYTHON: LIB when it is still the
 * environment's, else the one beside its installation, else what the
 * environment's python says now (its probe). NULL with why not in WHY; a
 * changed environment is said on stderr. */
static char *environment_library(const char *python, const char *lib, char *why, size_t whylen)
{
    if (lib && still_its_library(python, lib))
        return strdup(lib);
    char *found = library_beside(python);
    dk_pyprobe_t probe = {0};
    char err[2048];
    if (!found && (dk_pyprobe_run(python, &probe, err, sizeof err) < 0 ||
                   dk_pyprobe_check(&probe, python, err, sizeof err) < 0)) {
        snprintf(why, whylen, "this kernel's environment %s%s: %s", lib ? "changed since the "
                 "kernel was installed, and " : "", lib ? "cannot run it any more" : "cannot run it",
                 err);
        if (probe.prefix)
            dk_pyprobe_clear(&probe);
        return NULL;
    }
    char version[16] = "", prefix[PATH_MAX];
    if (!found) {
        found = strdup(probe.libpython);
        snprintf(version, sizeof version, "%d.%d", probe.major, probe.minor);
    } else {
        installation_of(python, prefix, sizeof prefix, version, sizeof version);
    }
    if (lib && found)
        fprintf(stderr, "distkernel: the environment of %s changed since the kernel was "
                "installed: it is Python %s now, on %s (was %s). Install the kernel again "
                "to show that in its name: distkernel install --python %s\n",
                python, version, found, lib, python);
    if (probe.prefix)
        dk_pyprobe_clear(&probe);
    return found;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "install") == 0)
        return dk_install_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "config") == 0)
        return dk_settings_main(argc - 1, argv + 1, stdout);
    const char *conn_path = NULL, *python = NULL, *libpython = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--python") == 0 && i + 1 < argc) {
            python = argv[++i];
        } else if (strcmp(argv[i], "--libpython") == 0 && i + 1 < argc) {
            libpython = argv[++i];
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
    char unusable[3072] = "";
    char *lib = NULL;
    if (!python) {
        unsetenv("DISTKERNEL_PYTHON");
        lib = strdup(DK_LIBPYTHON);
    } else if (use_environment(python, unusable, sizeof unusable) == 0) {
        lib = environment_library(python, libpython, unusable, sizeof unusable);
    }
    /* Every rank loads the library the kernel loaded. */
    if (lib && (setenv("DISTKERNEL_LIBPYTHON", lib, 1) < 0 ||
                dk_pyload_open(lib, NULL, 0, unusable, sizeof unusable) < 0) &&
        !*unusable)
        snprintf(unusable, sizeof unusable, "cannot set DISTKERNEL_LIBPYTHON: out of memory");
    free(lib);
    /* A kernel that cannot run Python still answers, on the build's library,
     * which its Python code then never calls. */
    char err[2048];
    if (*unusable && dk_pyload_open(DK_LIBPYTHON, NULL, 0, err, sizeof err) < 0) {
        fprintf(stderr, "distkernel: %s\n", unusable);
        return 1;
    }
    int (*kernel_main)(const char *, const char *) = NULL;
    *(void **)&kernel_main = dk_pyload_entry("libdistkernel-kernel.so", "dk_kernel_main", err,
                                             sizeof err);
    if (!kernel_main) {
        fprintf(stderr, "distkernel: %s\n", err);
        return 1;
    }
    return kernel_main(conn_path, *unusable ? unusable : NULL);
}
