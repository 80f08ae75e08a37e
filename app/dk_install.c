/*
 * dk_install: `distkernel install`. See the header; the probe of the python
 * and the check of what it says are dk_pyprobe's.
 */
#include "dk_install.h"
#include "dk_err.h"
#include "dk_io.h"
#include "dk_pyprobe.h"
#include "dk_spawn.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_NAME "distkernel"
/* jupyter_core's SYSTEM_JUPYTER_PATH[0] on Linux, where a system-wide install goes. */
#define SYSTEM_JUPYTER_DIR "/usr/local/share/jupyter"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: distkernel install [--user | --sys-prefix | --prefix DIR] [--name NAME]\n"
            "                          [--display-name TEXT] [--python PATH]\n"
            "                          [--env VAR VALUE]...\n"
            "\n"
            "Install a kernelspec whose kernel runs in the Python environment of PATH (a\n"
            "venv, conda env or installation of CPython 3.10 or later; default: %s),\n"
            "as `python -m ipykernel install` does.\n"
            "\n"
            "  --user             install for the current user instead of system-wide\n"
            "  --sys-prefix       install into the environment's sys.prefix\n"
            "  --prefix DIR       install into DIR/share/jupyter/kernels\n"
            "  --name NAME        the kernelspec's name (default: " DEFAULT_NAME ")\n"
            "  --display-name T   the name Jupyter shows (default: NAME)\n"
            "  --python PATH      the environment's python (e.g. ENV/bin/python)\n"
            "  --env VAR VALUE    set VAR in the kernel's environment (repeatable)\n",
            DK_PYTHON_EXE);
}

/* -- the command line ------------------------------------------------------------ */

/* An option's value: "--opt VALUE" or "--opt=VALUE". */
static const char *value_of(const char *opt, int argc, char *const *argv, int *i, char *err,
                            size_t errlen, bool *matched)
{
    size_t n = strlen(opt);
    *matched = false;
    if (strncmp(argv[*i], opt, n) != 0)
        return NULL;
    if (argv[*i][n] == '=') {
        *matched = true;
        return argv[*i] + n + 1;
    }
    if (argv[*i][n] != '\0')
        return NULL;
    *matched = true;
    if (*i + 1 >= argc) {
        dk_set_err(err, errlen, "%s needs a value", opt);
        return NULL;
    }
    return argv[++*i];
}

int dk_install_parse(int argc, char *const *argv, dk_install_opts_t *opts, char *err,
                     size_t errlen)
{
    memset(opts, 0, sizeof *opts);
    opts->name = DEFAULT_NAME;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v;
        bool m;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            opts->help = true;
        } else if (strcmp(a, "--user") == 0) {
            opts->user = true;
        } else if (strcmp(a, "--sys-prefix") == 0) {
            /* ipykernel's --sys-prefix is --prefix=sys.prefix: the later wins. */
            opts->sys_prefix = true;
            opts->prefix = NULL;
        } else if ((v = value_of("--prefix", argc, argv, &i, err, errlen, &m)) || m) {
            if (!v)
                goto fail;
            opts->prefix = v;
            opts->sys_prefix = false;
        } else if ((v = value_of("--name", argc, argv, &i, err, errlen, &m)) || m) {
            if (!v)
                goto fail;
            opts->name = v;
        } else if ((v = value_of("--display-name", argc, argv, &i, err, errlen, &m)) || m) {
            if (!v)
                goto fail;
            opts->display_name = v;
        } else if ((v = value_of("--python", argc, argv, &i, err, errlen, &m)) || m) {
            if (!v)
                goto fail;
            opts->python = v;
        } else if (strcmp(a, "--env") == 0) {
            if (i + 2 >= argc) {
                dk_set_err(err, errlen, "--env needs two values: --env VAR VALUE");
                goto fail;
            }
            const char *name = argv[++i], *value = argv[++i];
            if (!*name || strchr(name, '=')) {
                dk_set_err(err, errlen, "--env: '%s' is not a variable's name", name);
                goto fail;
            }
            dk_install_env_t *env = realloc(opts->env, (opts->n_env + 1) * sizeof *env);
            if (!env) {
                dk_set_err(err, errlen, "out of memory");
                goto fail;
            }
            opts->env = env;
            /* As ipykernel's dict: a variable given twice keeps its last value. */
            size_t k = 0;
            while (k < opts->n_env && strcmp(env[k].name, name) != 0)
                k++;
            env[k] = (dk_install_env_t){name, value};
            if (k == opts->n_env)
                opts->n_env++;
        } else {
            dk_set_err(err, errlen, "unknown argument '%s'", a);
            goto fail;
        }
    }
    if (opts->user && (opts->prefix || opts->sys_prefix)) {
        dk_set_err(err, errlen, "--user and %s ask for two places: choose one",
                   opts->sys_prefix ? "--sys-prefix" : "--prefix");
        goto fail;
    }
    if (opts->prefix && !*opts->prefix) {
        dk_set_err(err, errlen, "--prefix needs a folder");
        goto fail;
    }
    return 0;
fail:
    dk_install_opts_clear(opts);
    return -1;
}

void dk_install_opts_clear(dk_install_opts_t *opts)
{
    free(opts->env);
    opts->env = NULL;
    opts->n_env = 0;
}

char *dk_install_kernel_name(const char *name, char *err, size_t errlen)
{
    if (!*name) {
        dk_set_err(err, errlen, "the kernel's name is empty");
        return NULL;
    }
    char *lower = strdup(name);
    if (!lower) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    for (char *c = lower; *c; c++) {
        *c = (char)tolower((unsigned char)*c);
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || strchr("._-", *c))) {
            dk_set_err(err, errlen,
                       "invalid kernel name '%s': a kernel's name may only contain ASCII "
                       "letters, digits, '.', '_' and '-'", name);
            free(lower);
            return NULL;
        }
    }
    return lower;
}

/* -- where, and what --------------------------------------------------------------- */

static char *join(const char *a, const char *b)
{
    char *s;
    size_t n = strlen(a);
    return asprintf(&s, "%s%s%s", a, n && a[n - 1] == '/' ? "" : "/", b) < 0 ? NULL : s;
}

/* jupyter_core.paths.jupyter_data_dir() on Linux. */
static char *user_data_dir(char *err, size_t errlen)
{
    const char *d = getenv("JUPYTER_DATA_DIR");
    if (d && *d)
        return strdup(d);
    const char *xdg = getenv("XDG_DATA_HOME");
    if (xdg && *xdg)
        return join(xdg, "jupyter");
    const char *home = getenv("HOME");
    if (!home || !*home) {
        struct passwd *pw = getpwuid(getuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (!home) {
        dk_set_err(err, errlen, "--user: no home folder (HOME is not set)");
        return NULL;
    }
    /* get_home_dir() resolves links (a /home that links elsewhere). */
    char real[PATH_MAX];
    return join(realpath(home, real) ? real : home, ".local/share/jupyter");
}

char *dk_install_destination(const dk_install_opts_t *opts, const char *name,
                             const char *sys_prefix, char *err, size_t errlen)
{
    char *base = NULL, *kernels = NULL, *dest = NULL;
    if (opts->user) {
        base = user_data_dir(err, errlen);
    } else if (opts->prefix || opts->sys_prefix) {
        const char *p = opts->sys_prefix ? sys_prefix : opts->prefix;
        char cwd[PATH_MAX];
        char *abs = NULL;
        if (p[0] == '/')
            abs = strdup(p);
        else if (getcwd(cwd, sizeof cwd))
            abs = join(cwd, p);
        base = abs ? join(abs, "share/jupyter") : NULL;
        free(abs);
    } else {
        base = strdup(SYSTEM_JUPYTER_DIR);
    }
    if (base && (kernels = join(base, "kernels")))
        dest = join(kernels, name);
    if (!dest && base)
        dk_set_err(err, errlen, "out of memory");
    free(base);
    free(kernels);
    return dest;
}

const char *dk_install_env_label(const char *prefix, const char *kind)
{
    static char label[256];
    static const char *const generic[] = {".venv", "venv", ".env", "env"};
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s", prefix);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
    if (strcmp(kind, "installation") == 0 && (strcmp(path, "/usr") == 0 ||
                                              strcmp(path, "/usr/local") == 0))
        return "system";
    char *base = strrchr(path, '/');
    for (size_t i = 0; base && base > path && i < sizeof generic / sizeof *generic; i++)
        if (strcmp(base + 1, generic[i]) == 0) {
            /* proj/.venv: the project's name says more than ".venv" */
            *base = '\0';
            base = strrchr(path, '/');
            break;
        }
    snprintf(label, sizeof label, "%s", base && base[1] ? base + 1 : path);
    return label;
}

const char *dk_install_display_name(const dk_install_opts_t *opts, const char *name,
                                    const char *version, const char *env_label)
{
    static char fallback[320];
    if (opts->display_name)
        return opts->display_name;
    /* The default name's kernel says it is distkernel's, beside ipykernel's
     * "Python 3 (ipykernel)" in the launcher. */
    if (strcmp(name, DEFAULT_NAME) == 0)
        snprintf(fallback, sizeof fallback, "distkernel (Python %s, %s)", version, env_label);
    else
        snprintf(fallback, sizeof fallback, "Python %s (%s)", version, name);
    return fallback;
}

char *dk_install_spec_json(const char *kernel_exe, const char *python, const char *libpython,
                           const char *display_name, bool debugger,
                           const dk_install_env_t *env, size_t n_env)
{
    json_t *argv = python && libpython
                       ? json_pack("[ssssss]", kernel_exe, "--python", python, "--libpython",
                                   libpython, "-f")
                       : json_pack("[ss]", kernel_exe, "-f");
    json_t *spec = argv ? json_pack("{s:o,s:s,s:s,s:s,s:{s:b}}", "argv", argv,
                                    "display_name", display_name, "language", "python",
                                    "interrupt_mode", "message", "metadata", "debugger", debugger)
                        : NULL;
    char *text = NULL;
    if (!spec || json_array_append_new(argv, json_string("{connection_file}")) < 0)
        goto out;
    if (n_env > 0) {
        json_t *e = json_object();
        if (!e || json_object_set_new(spec, "env", e) < 0)
            goto out;
        for (size_t i = 0; i < n_env; i++)
            if (json_object_set_new(e, env[i].name, json_string(env[i].value)) < 0)
                goto out;
    }
    text = json_dumps(spec, JSON_INDENT(1) | JSON_SORT_KEYS);
out:
    json_decref(spec);
    return text;
}

/* -- writing it ---------------------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return (flag == FTW_DP ? rmdir(path) : unlink(path)) < 0 ? -1 : 0;
}

static int remove_tree(const char *path)
{
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static int mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int rc = mkdir(path, 0777);
        *p = '/';
        if (rc < 0 && errno != EEXIST)
            return -1;
    }
    return mkdir(path, 0777) < 0 && errno != EEXIST ? -1 : 0;
}

static int write_file(const char *path, const char *bytes, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return -1;
    if (dk_write_all(fd, bytes, len) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return close(fd);
}

static int copy_file(const char *from, const char *to)
{
    FILE *f = fopen(from, "rb");
    if (!f)
        return -1;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len == cap) {
            char *b = realloc(buf, cap = cap ? cap * 2 : 16384);
            if (!b) {
                rc = -1;
                break;
            }
            buf = b;
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0) {
            rc = ferror(f) ? -1 : 0;
            break;
        }
    }
    fclose(f);
    if (rc == 0)
        rc = write_file(to, buf, len);
    free(buf);
    return rc;
}

static const char *const logos[] = {"logo-32x32.png", "logo-64x64.png", "logo-svg.svg"};

int dk_install_write(const char *dest, const char *spec_json, const char *logo_dir,
                     bool user, char *err, size_t errlen)
{
    char *parent = strdup(dest), *tmp = NULL, *file = NULL, *src = NULL;
    char *slash = parent ? strrchr(parent, '/') : NULL;
    int rc = -1;
    if (slash && slash != parent)
        *slash = '\0';
    /* Built in the same folder, so that the rename into place cannot cross filesystems. */
    if (!slash || slash == parent || asprintf(&tmp, "%s/.%s.XXXXXX", parent, slash + 1) < 0) {
        dk_set_err(err, errlen, "cannot install into %s: not a folder's path", dest);
        goto out;
    }
    if (mkdirs(parent) < 0 || !mkdtemp(tmp)) {
        int e = errno;
        dk_set_err(err, errlen, "cannot write the kernelspec in %s: %s%s", parent, strerror(e),
                   e == EACCES && !user ? ". Perhaps you want `sudo` or `--user`?" : "");
        free(tmp);
        tmp = NULL;
        goto out;
    }
    /* mkdtemp's folder is 0700; a kernelspec is read by whoever runs Jupyter. */
    mode_t mask = umask(0);
    umask(mask);
    chmod(tmp, 0777 & ~mask);
    file = join(tmp, "kernel.json");
    if (!file || write_file(file, spec_json, strlen(spec_json)) < 0) {
        dk_set_err(err, errlen, "cannot write %s: %s", file ? file : "kernel.json",
                   strerror(errno));
        goto out;
    }
    for (size_t i = 0; i < sizeof logos / sizeof logos[0]; i++) {
        free(file);
        free(src);
        file = join(tmp, logos[i]);
        src = join(logo_dir, logos[i]);
        if (!file || !src || copy_file(src, file) < 0) {
            dk_set_err(err, errlen, "cannot copy the logo %s: %s (is distkernel installed?)",
                       src ? src : logos[i], strerror(errno));
            goto out;
        }
    }
    struct stat st;
    if (lstat(dest, &st) == 0 && (S_ISDIR(st.st_mode) ? remove_tree(dest) : unlink(dest)) < 0) {
        dk_set_err(err, errlen, "cannot replace the kernelspec in %s: %s", dest, strerror(errno));
        goto out;
    }
    if (rename(tmp, dest) < 0) {
        dk_set_err(err, errlen, "cannot install the kernelspec as %s: %s", dest, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (rc < 0 && tmp)
        remove_tree(tmp);
    free(parent);
    free(tmp);
    free(file);
    free(src);
    return rc;
}

/* -- the command ----------------------------------------------------------------- */

/* PYTHON as the kernelspec will name it: absolute, but with its links kept (a
 * venv's python is a link to the base interpreter, and following it would
 * leave the venv). A bare name is looked up on PATH, as a shell would. */
static char *absolute_python(const char *python, char *err, size_t errlen)
{
    if (!strchr(python, '/'))
        return dk_spawn_find_program(python, err, errlen);
    if (python[0] == '/')
        return strdup(python);
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        dk_set_err(err, errlen, "cannot tell the current folder: %s", strerror(errno));
        return NULL;
    }
    return join(cwd, python[0] == '.' && python[1] == '/' ? python + 2 : python);
}

int dk_install_main(int argc, char **argv)
{
    dk_install_opts_t opts;
    char err[2048];
    if (dk_install_parse(argc - 1, argv + 1, &opts, err, sizeof err) < 0) {
        fprintf(stderr, "distkernel install: %s\n\n", err);
        usage(stderr);
        return 2;
    }
    if (opts.help) {
        usage(stdout);
        dk_install_opts_clear(&opts);
        return 0;
    }
    int rc = 1;
    char *name = NULL, *python = NULL, *dest = NULL, *spec = NULL, exe[PATH_MAX];
    dk_pyprobe_t probe = {0};
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        fprintf(stderr, "distkernel install: cannot tell where this program is: %s\n",
                strerror(errno));
        goto out;
    }
    exe[n] = '\0';
    if (!(name = dk_install_kernel_name(opts.name, err, sizeof err)) ||
        !(python = absolute_python(opts.python ? opts.python : DK_PYTHON_EXE, err, sizeof err)) ||
        dk_pyprobe_run(python, &probe, err, sizeof err) < 0 ||
        dk_pyprobe_check(&probe, python, err, sizeof err) < 0 ||
        !(dest = dk_install_destination(&opts, name, probe.prefix, err, sizeof err))) {
        fprintf(stderr, "distkernel install: %s\n", err);
        goto out;
    }
    char version[16];
    snprintf(version, sizeof version, "%d.%d", probe.major, probe.minor);
    const char *display = dk_install_display_name(
        &opts, name, version, dk_install_env_label(probe.prefix, probe.kind));
    spec = dk_install_spec_json(exe, opts.python ? python : NULL, probe.libpython, display,
                                probe.debugpy, opts.env, opts.n_env);
    if (!spec) {
        fprintf(stderr, "distkernel install: out of memory\n");
        goto out;
    }
    if (dk_install_write(dest, spec, DK_LOGO_DIR, opts.user, err, sizeof err) < 0) {
        fprintf(stderr, "distkernel install: %s\n", err);
        goto out;
    }
    /* What it found, so that a user sees which Python the kernel runs on. */
    char kind[PATH_MAX + 16];
    if (strcmp(probe.kind, "venv") == 0)
        snprintf(kind, sizeof kind, "a venv of %s", probe.base);
    else
        snprintf(kind, sizeof kind, "%s",
                 strcmp(probe.kind, "conda") == 0 ? "a conda environment" : "an installation");
    printf("Found Python %d.%d, %s, in %s\n"
           "The kernel will load %s and show as \"%s\"\n"
           "Installed kernelspec %s in %s\n",
           probe.major, probe.minor, kind, probe.prefix, probe.libpython, display, name, dest);
    rc = 0;
out:
    dk_pyprobe_clear(&probe);
    dk_install_opts_clear(&opts);
    free(name);
    free(python);
    free(dest);
    free(spec);
    return rc;
}
