/*
 * dk_pyprobe: what a python says about itself. See the header.
 *
 * Why a probe, and not a look at the file: "is this python 3.11 with our
 * ABI?" has no reliable answer from its name (python3, python, a conda
 * python3.11 that is a 3.12), from following symlinks (a venv's python links
 * to a base interpreter, a conda env's is a real file) or from pyvenv.cfg
 * (virtualenv and conda write different keys, or none). Running it is what
 * ipykernel effectively does too (it is that python that writes the spec), and
 * it answers the other questions at once: sys.prefix for --sys-prefix,
 * whether IPython and cloudpickle are importable there, and whether debugpy
 * is (the kernelspec then offers JupyterLab's debugger).
 */
#include "dk_pyprobe.h"
#include "dk_err.h"
#include "dk_proc.h"
#include "dk_pyload.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROBE_MARK "distkernel-probe 1"
#define PROBE_TIMEOUT_S 60

extern char **environ;

/* -- the probe ------------------------------------------------------------------- */

/* The folder it runs in, and '' (-c puts it first), leave sys.path: a folder
 * named IPython where `distkernel install` is run must not pass for the
 * module. The version comes first and every later step may fail quietly, so
 * that any Python, 2.7 too, says which version it is. */
const char dk_pyprobe_script[] =
    "import sys, os\n"
    "sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
    "print('" PROBE_MARK "')\n"
    "print('version %d.%d' % sys.version_info[:2])\n"
    "try:\n"
    "    import sysconfig\n"
    "    soabi = sysconfig.get_config_var('SOABI') or ''\n"
    "except Exception:\n"
    "    soabi = ''\n"
    "print('soabi ' + soabi)\n"
    "print('prefix ' + sys.prefix)\n"
    "print('implementation ' + getattr(getattr(sys, 'implementation', None), 'name', '?'))\n"
    "kind = 'venv' if getattr(sys, 'base_prefix', sys.prefix) != sys.prefix else "
    "('conda' if os.path.isdir(os.path.join(sys.prefix, 'conda-meta')) else 'installation')\n"
    "print('kind ' + kind)\n"
    "print('base ' + getattr(sys, 'base_prefix', sys.prefix))\n"
    "try:\n"
    "    v = sysconfig.get_config_var\n"
    "    free = bool(v('Py_GIL_DISABLED'))\n"
    "    names = [n for n in (v('INSTSONAME'), v('LDLIBRARY')) if n and '.so' in n]\n"
    "    dirs = [d for d in (v('LIBDIR'), os.path.join(v('LIBDIR') or '', v('MULTIARCH') or ''),"
    " v('LIBPL')) if d]\n"
    "    libs = [os.path.join(d, n) for n in names for d in dirs"
    " if os.path.isfile(os.path.join(d, n))]\n"
    "except Exception:\n"
    "    free, libs = False, []\n"
    "print('freethreaded ' + ('yes' if free else 'no'))\n"
    "print('libpython ' + (libs[0] if libs else ''))\n"
    "def has(m):\n"
    "    try:\n"
    "        import importlib.util\n"
    "        return importlib.util.find_spec(m) is not None\n"
    "    except Exception:\n"
    "        return False\n"
    "print('missing ' + ' '.join(m for m in ('IPython', 'cloudpickle') if not has(m)))\n"
    "print('debugpy ' + ('yes' if has('debugpy') else 'no'))\n";

void dk_pyprobe_clear(dk_pyprobe_t *probe)
{
    free(probe->soabi);
    free(probe->prefix);
    free(probe->missing);
    free(probe->implementation);
    free(probe->kind);
    free(probe->base);
    free(probe->libpython);
    memset(probe, 0, sizeof *probe);
}

/* The rest of OUT's line starting with "KEY " (a new string), or NULL. */
static char *field(const char *out, const char *key)
{
    size_t n = strlen(key);
    for (const char *line = out; *line;) {
        const char *end = strchr(line, '\n');
        if (strncmp(line, key, n) == 0 && line[n] == ' ') {
            const char *v = line + n + 1;
            return strndup(v, end ? (size_t)(end - v) : strlen(v));
        }
        if (!end)
            break;
        line = end + 1;
    }
    return NULL;
}

int dk_pyprobe_parse(const char *out, dk_pyprobe_t *probe, char *err, size_t errlen)
{
    memset(probe, 0, sizeof *probe);
    if (strncmp(out, PROBE_MARK "\n", sizeof PROBE_MARK) != 0) {
        dk_set_err(err, errlen, "it did not run distkernel's probe");
        return -1;
    }
    char *version = field(out, "version");
    char tail;
    probe->soabi = field(out, "soabi");
    probe->prefix = field(out, "prefix");
    probe->missing = field(out, "missing");
    if (!version || sscanf(version, "%d.%d%c", &probe->major, &probe->minor, &tail) != 2 ||
        !probe->soabi || !probe->prefix || !*probe->prefix || !probe->missing) {
        dk_set_err(err, errlen, "its answer to distkernel's probe is incomplete");
        free(version);
        dk_pyprobe_clear(probe);
        return -1;
    }
    free(version);
    /* Every Python from 3.3 prints these; an old one may not get this far. */
    probe->implementation = field(out, "implementation");
    probe->kind = field(out, "kind");
    probe->base = field(out, "base");
    probe->libpython = field(out, "libpython");
    char *ft = field(out, "freethreaded");
    probe->free_threaded = ft && strcmp(ft, "yes") == 0;
    free(ft);
#define OR_EMPTY(f) if (!probe->f) probe->f = strdup("")
    OR_EMPTY(implementation);
    OR_EMPTY(kind);
    OR_EMPTY(base);
    OR_EMPTY(libpython);
#undef OR_EMPTY
    /* Optional: a probe without the line offers no debugger. */
    char *debugpy = field(out, "debugpy");
    probe->debugpy = debugpy && strcmp(debugpy, "yes") == 0;
    free(debugpy);
    return 0;
}

typedef struct {
    struct timespec deadline;
    bool timed_out;
} probe_clock_t;

static bool probe_late(void *data)
{
    probe_clock_t *c = data;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > c->deadline.tv_sec ||
        (now.tv_sec == c->deadline.tv_sec && now.tv_nsec >= c->deadline.tv_nsec))
        c->timed_out = true;
    return c->timed_out;
}

int dk_pyprobe_run(const char *python, dk_pyprobe_t *probe, char *err, size_t errlen)
{
    memset(probe, 0, sizeof *probe);
    struct stat st;
    if (stat(python, &st) < 0) {
        dk_set_err(err, errlen, "%s is not a Python: %s", python, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode) || access(python, X_OK) < 0) {
        dk_set_err(err, errlen, "%s is not a Python: it is not an executable file", python);
        return -1;
    }
    char *argv[] = {(char *)python, "-c", (char *)dk_pyprobe_script, NULL};
    probe_clock_t clock = {.timed_out = false};
    clock_gettime(CLOCK_MONOTONIC, &clock.deadline);
    clock.deadline.tv_sec += PROBE_TIMEOUT_S;
    dk_proc_spec_t spec = {.path = python, .argv = argv, .envp = environ, .max_out = 64 * 1024,
                           .cancelled = probe_late, .data = &clock};
    dk_proc_result_t res;
    char why[512];
    if (dk_proc_run(&spec, &res, why, sizeof why) < 0) {
        dk_set_err(err, errlen, "%s is not a Python: it could not be run: %s", python, why);
        return -1;
    }
    int rc = 0;
    if (clock.timed_out) {
        dk_set_err(err, errlen, "%s is not a Python: it did not answer within %d s", python,
                   PROBE_TIMEOUT_S);
        rc = -1;
    } else if (dk_pyprobe_parse(res.out ? res.out : "", probe, why, sizeof why) < 0) {
        dk_set_err(err, errlen,
                   "%s is not a Python: asked for its version (%s -c ...), %s (exit status %d)",
                   python, python, why, res.exit_code);
        rc = -1;
    }
    dk_proc_result_free(&res);
    return rc;
}

/* -- the check ------------------------------------------------------------------- */

int dk_pyprobe_check(const dk_pyprobe_t *probe, const char *python, char *err, size_t errlen)
{
    if (*probe->implementation && strcmp(probe->implementation, "cpython") != 0) {
        dk_set_err(err, errlen,
                   "%s is %s %d.%d, not CPython: distkernel runs Python code on CPython's own "
                   "library. Use a CPython environment (python.org's, conda's, pyenv's, a "
                   "Linux distribution's, or a venv of one)",
                   python, probe->implementation, probe->major, probe->minor);
        return -1;
    }
    if (probe->major < DK_PYLOAD_MIN_MAJOR ||
        (probe->major == DK_PYLOAD_MIN_MAJOR && probe->minor < DK_PYLOAD_MIN_MINOR)) {
        dk_set_err(err, errlen,
                   "%s is Python %d.%d, older than the oldest distkernel runs on (%d.%d). "
                   "Use an environment of Python %d.%d or later",
                   python, probe->major, probe->minor, DK_PYLOAD_MIN_MAJOR, DK_PYLOAD_MIN_MINOR,
                   DK_PYLOAD_MIN_MAJOR, DK_PYLOAD_MIN_MINOR);
        return -1;
    }
    if (probe->free_threaded) {
        dk_set_err(err, errlen,
                   "%s is a free-threaded Python %d.%d (%s), which has no stable ABI for "
                   "distkernel to run on. Use the same Python's build with the GIL "
                   "(python%d.%d, not python%d.%dt)",
                   python, probe->major, probe->minor, probe->soabi, probe->major, probe->minor,
                   probe->major, probe->minor);
        return -1;
    }
    if (!*probe->libpython) {
        dk_set_err(err, errlen,
                   "%s is Python %d.%d built without a shared libpython (its library is "
                   "linked into the program, --enable-shared was not given), and distkernel "
                   "runs on the shared one. Use a Python built with --enable-shared: "
                   "conda's, python.org's and Linux distributions' are; with pyenv, "
                   "PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install %d.%d",
                   python, probe->major, probe->minor, probe->major, probe->minor);
        return -1;
    }
    if (*probe->missing) {
        char pkgs[128] = "";
        for (const char *m = probe->missing; *m;) {
            size_t n = strcspn(m, " ");
            if (strncmp(m, "IPython", n) == 0 && n == 7)
                strncat(pkgs, " ipython", sizeof pkgs - strlen(pkgs) - 1);
            else
                snprintf(pkgs + strlen(pkgs), sizeof pkgs - strlen(pkgs), " %.*s", (int)n, m);
            m += n;
            while (*m == ' ')
                m++;
        }
        dk_set_err(err, errlen,
                   "the environment of %s (sys.prefix %s) lacks what the kernel needs: %s. "
                   "Install it there (%s -m pip install%s), or make the venv with "
                   "--system-site-packages to use the system's",
                   python, probe->prefix, probe->missing, python, pkgs);
        return -1;
    }
    return 0;
}
