/*
 * dk_install: `distkernel install`, a kernelspec for one Python environment.
 *
 *     distkernel install [--user | --sys-prefix | --prefix DIR] [--name NAME]
 *                        [--display-name TEXT] [--python PATH] [--env VAR VALUE]...
 *
 * The options mean what they mean to `python -m ipykernel install` (ipykernel
 * 6.17) and the kernelspec goes where jupyter_client's KernelSpecManager puts
 * it: system-wide /usr/local/share/jupyter/kernels/NAME, --user the user's
 * Jupyter data folder, --prefix DIR/share/jupyter/kernels, --sys-prefix the
 * environment's own sys.prefix. NAME is lower-cased and must match
 * [a-z0-9._-]+; an existing kernelspec of that name is replaced.
 *
 * The difference from ipykernel: one distkernel serves every environment, so
 * it does not run the environment's python but loads its libpython and starts
 * it as that python would (kernel.json's argv is `distkernel --python PATH
 * --libpython LIB -f {connection_file}`, see runtime/python/dk_pyload.h). PATH is
 * probed first (dk_pyprobe.h), which finds LIB, and refused, with no
 * kernelspec written, when it is no CPython, older than 3.10, free-threaded,
 * built without a shared libpython, or lacks IPython or cloudpickle. The
 * refusal says what to do.
 *
 * The pieces are pure where they can be (parse, destination, kernel.json)
 * so the unit tests drive them alone; dk_install_write touches files, and
 * the probe (dk_pyprobe.h) runs the python.
 */
#ifndef DK_INSTALL_H
#define DK_INSTALL_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    const char *name, *value;
} dk_install_env_t;

/* What the command line asked for. Strings point into the argv parsed. */
typedef struct {
    bool user, sys_prefix, help;
    const char *prefix;          /* --prefix DIR, or NULL */
    const char *name;            /* as given (dk_install_kernel_name lower-cases it) */
    const char *display_name;    /* NULL: the default (see dk_install_display_name) */
    const char *python;          /* NULL: the Python the kernel embeds */
    dk_install_env_t *env;       /* --env pairs in order (owned: dk_install_opts_clear) */
    size_t n_env;
} dk_install_opts_t;

/* Parse ARGV[0..ARGC) (the words after `install`) into OPTS. Returns 0
 * (OPTS->help set for -h/--help), or -1 with ERR saying which word is wrong;
 * OPTS then holds nothing to free. Both --user and a prefix is an error, as
 * it is to jupyter_client. */
int dk_install_parse(int argc, char *const *argv, dk_install_opts_t *opts, char *err,
                     size_t errlen);

/* Free what OPTS owns; safe on a zeroed or cleared one. */
void dk_install_opts_clear(dk_install_opts_t *opts);

/* The kernelspec's name: NAME lower-cased, in a new string (the caller frees
 * it), or NULL with ERR when it is not [a-z0-9._-]+ or out of memory. */
char *dk_install_kernel_name(const char *name, char *err, size_t errlen);

/* The folder the kernelspec NAME goes to for OPTS (a new string, the caller
 * frees it), as KernelSpecManager._get_destination_dir finds it: SYS_PREFIX is
 * the environment's sys.prefix (for --sys-prefix), CWD makes a relative
 * --prefix absolute; the user's folder comes from the environment
 * (JUPYTER_DATA_DIR, else XDG_DATA_HOME/jupyter, else HOME/.local/share/jupyter).
 * NULL with ERR when it cannot be said (no HOME, out of memory). */
char *dk_install_destination(const dk_install_opts_t *opts, const char *name,
                             const char *sys_prefix, char *err, size_t errlen);

/* What an environment is called in a display name: the last folder of its
 * PREFIX, or its parent's for a project's venv (proj/.venv: "proj"), or
 * "system" for the system's Python (KIND "installation" in /usr). A static
 * buffer's: copy it before the next call. */
const char *dk_install_env_label(const char *prefix, const char *kind);

/* The display name: --display-name, else "Python VERSION (NAME)", or for the
 * default name "distkernel (Python VERSION, ENV_LABEL)" (dk_install_env_label).
 * Borrowed or a static buffer's: copy it before the next call. */
const char *dk_install_display_name(const dk_install_opts_t *opts, const char *name,
                                    const char *version, const char *env_label);

/* kernel.json's text for a kernel run by KERNEL_EXE in the environment of
 * PYTHON on its LIBPYTHON (PYTHON NULL: the build's Python, and argv names
 * none), a new string (the
 * caller frees it), or NULL when out of memory. DEBUGGER is metadata's
 * "debugger", which JupyterLab 4 reads to offer its debugger for the kernel:
 * whether debugpy is in the environment, as `ipykernel install` writes it. */
char *dk_install_spec_json(const char *kernel_exe, const char *python, const char *libpython,
                           const char *display_name, bool debugger,
                           const dk_install_env_t *env, size_t n_env);

/* Write the kernelspec folder DEST: kernel.json with SPEC_JSON and the logos
 * found in LOGO_DIR. It is built beside DEST and renamed into place, so a
 * failure leaves no half-written kernelspec, and replaces one already there.
 * Returns 0, or -1 with ERR (the folder cannot be written: on EACCES it says
 * to try --user). */
int dk_install_write(const char *dest, const char *spec_json, const char *logo_dir,
                     bool user, char *err, size_t errlen);

/* The whole command: ARGV[0] is "install". Returns the process's exit code. */
int dk_install_main(int argc, char **argv);

#endif
