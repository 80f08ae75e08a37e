/*
 * The loader of the environment's libpython and of distkernel's libraries on
 * it (runtime/python/dk_pyload.h). Each test is a process of its own
 * (criterion's), so each may load a libpython of its own.
 */
#include "dk_pyload.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char err[2048];

Test(pyload, a_version_string_says_its_version_and_whether_it_is_free_threaded)
{
    int major, minor;
    bool ft;
    cr_assert_eq(dk_pyload_parse_version("3.12.1 (main, Jan  1 2024) [GCC 12.2.0]", &major,
                                         &minor, &ft), 0);
    cr_assert(major == 3 && minor == 12 && !ft);
    cr_assert_eq(dk_pyload_parse_version("3.13.0 experimental free-threading build (main, Oct "
                                         "7 2024) [GCC 12.2.0]", &major, &minor, &ft), 0);
    cr_assert(major == 3 && minor == 13 && ft);
    /* the words after the build's parenthesis are the compiler's, not the build's */
    cr_assert_eq(dk_pyload_parse_version("3.12.0 (main) [free-threading gcc]", &major, &minor,
                                         &ft), 0);
    cr_assert(!ft);
    cr_assert_eq(dk_pyload_parse_version("PyPy", &major, &minor, &ft), -1);
    cr_assert_eq(dk_pyload_parse_version(NULL, &major, &minor, &ft), -1);
}

Test(pyload, the_builds_libpython_loads_and_says_its_version)
{
    char version[32];
    cr_assert_eq(dk_pyload_open(DK_LIBPYTHON, version, sizeof version, err, sizeof err), 0,
                 "%s", err);
    cr_assert_str_eq(version, DK_PYTHON_VERSION_FULL);
    /* again: harmless */
    cr_assert_eq(dk_pyload_open(DK_LIBPYTHON, NULL, 0, err, sizeof err), 0, "%s", err);
}

/* The libpython of pyenv's X.Y, or NULL when this machine has none. */
static char *pyenv_lib(const char *xy)
{
    static char path[512];
    const char *root = "/root/.pyenv/versions";
    DIR *d = opendir(root);
    struct dirent *e;
    char want[16];
    snprintf(want, sizeof want, "%s.", xy);
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, want, strlen(want)) != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s/lib/libpython%s.so.1.0", root, e->d_name, xy);
        if (access(path, R_OK) == 0) {
            closedir(d);
            return path;
        }
    }
    if (d)
        closedir(d);
    return NULL;
}

Test(pyload, another_minor_version_loads_too)
{
    const char *lib = pyenv_lib("3.13");
    if (!lib)
        cr_skip_test("no CPython 3.13 with a shared libpython here");
    char version[32];
    cr_assert_eq(dk_pyload_open(lib, version, sizeof version, err, sizeof err), 0, "%s", err);
    cr_assert_eq(strncmp(version, "3.13.", 5), 0, "%s", version);
}

Test(pyload, a_python_older_than_3_10_is_refused_naming_it)
{
    const char *lib = pyenv_lib("3.9");
    if (!lib)
        cr_skip_test("no CPython 3.9 with a shared libpython here");
    cr_assert_eq(dk_pyload_open(lib, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "is Python 3.9."), "%s", err);
    cr_assert(strstr(err, "older than the oldest distkernel runs on (3.10)"), "%s", err);
}

Test(pyload, a_library_that_is_no_python_or_not_there_is_named)
{
    cr_assert_eq(dk_pyload_open("/nonexistent/libpython3.12.so", NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "cannot load /nonexistent/libpython3.12.so"), "%s", err);
    cr_assert_eq(dk_pyload_open(NOT_PYTHON, NULL, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "is not a CPython library"), "%s", err);
}

Test(pyload, a_libpython_in_a_folder_with_spaces_loads)
{
    char dir[] = "/tmp/dk pyload XXXXXX", path[512], cmd[1200];
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/lib python/libpython.so.1.0", dir);
    snprintf(cmd, sizeof cmd, "mkdir '%s/lib python' && cp '%s' '%s'", dir, DK_LIBPYTHON, path);
    cr_assert_eq(system(cmd), 0);
    char version[32];
    int rc = dk_pyload_open(path, version, sizeof version, err, sizeof err);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_str_eq(version, DK_PYTHON_VERSION_FULL);
}

Test(pyload, a_symbol_the_libpython_lacks_is_named)
{
    cr_assert_eq(dk_pyload_open(DK_LIBPYTHON, NULL, 0, err, sizeof err), 0, "%s", err);
    /* libdkpyload-needs.so, next to this program, calls a Py_ function no
     * CPython has, as a library built for a newer stable ABI would. */
    cr_assert_null(dk_pyload_entry("libdkpyload-needs.so", "dk_needs", err, sizeof err));
    cr_assert(strstr(err, "undefined symbol: PyDK_NotInAnyCPython"), "%s", err);
    cr_assert(strstr(err, "is it a CPython 3.10 or later?"), "%s", err);
}

Test(pyload, an_entry_a_library_lacks_is_named)
{
    cr_assert_null(dk_pyload_entry("libdkpyload-plain.so", "dk_no_such_entry", err, sizeof err));
    cr_assert(strstr(err, "has no dk_no_such_entry"), "%s", err);
    void *fn = dk_pyload_entry("libdkpyload-plain.so", "dk_plain", err, sizeof err);
    cr_assert_not_null(fn, "%s", err);
    int (*plain)(void);
    *(void **)&plain = fn;
    cr_assert_eq(plain(), 42);
}

Test(pyload, the_environment_names_the_python_and_the_library)
{
    setenv("DISTKERNEL_PYTHON", "/e/bin/python", 1);
    setenv("DISTKERNEL_LIBPYTHON", "/b/lib/libpython3.12.so.1.0", 1);
    cr_assert_str_eq(dk_pyload_python(), "/e/bin/python");
    cr_assert_str_eq(dk_pyload_libpython(), "/b/lib/libpython3.12.so.1.0");
    setenv("DISTKERNEL_PYTHON", "", 1);
    unsetenv("DISTKERNEL_LIBPYTHON");
    cr_assert_str_eq(dk_pyload_python(), DK_PYTHON_EXE);
    cr_assert_str_eq(dk_pyload_libpython(), DK_LIBPYTHON);
    cr_assert_eq(dk_pyload_check_python("node7", err, sizeof err), 0, "%s", err);
    setenv("DISTKERNEL_PYTHON", "/nonexistent/bin/python", 1);
    cr_assert_eq(dk_pyload_check_python("node7", err, sizeof err), -1);
    cr_assert(strstr(err, "not on node node7: /nonexistent/bin/python"), "%s", err);
}
