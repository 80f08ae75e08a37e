/*
 * dk_rankpyenv: a remote rank's Python variables, checked before CPython
 * starts. See the header.
 */
#include "dk_rankpyenv.h"

#include "dk_codepath.h"
#include "dk_err.h"
#include "dk_logdir.h"

#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NOTES_MAX 8192      /* what DISTKERNEL_PATH_NOTES may hold; the rank's log says 8 */

typedef struct {
    char text[NOTES_MAX];
    size_t len;
} notes_t;

static void add_note(void *data, const char *entry, const char *why)
{
    notes_t *n = data;
    /* A path with a tab or a newline would break the line format: the entry
     * is still left out, and the note says so without it. */
    bool plain = !strpbrk(entry, "\t\n") && !strchr(why, '\n');
    int k = snprintf(n->text + n->len, sizeof n->text - n->len, "%s\t%s\n",
                     plain ? entry : "?", plain ? why : "a PYTHONPATH entry with a tab or "
                     "newline in its name was left off");
    if (k > 0 && (size_t) k < sizeof n->text - n->len)
        n->len += (size_t) k;
    else
        n->text[n->len] = '\0';
}

/* A PYTHONPATH entry left out, said as such. */
static void path_note(void *data, const char *entry, const char *why)
{
    char line[1300];
    snprintf(line, sizeof line, "left off PYTHONPATH: %s", why);
    add_note(data, entry, line);
}

/* PATH must pass the rule for code: 0, or -1 with why in ERR (WHAT names
 * it for the user). */
static int must_pass(const char *path, const char *what, char *err, size_t errlen)
{
    char why[1024] = "";
    int fd = dk_logdir_open(path, DK_LOGDIR_CODE, NULL, why, sizeof why);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    dk_set_err(err, errlen, "%s %s cannot be used on this node: %s. Its folders must be yours "
               "(or root's) and writable by nobody else", what, path,
               why[0] ? why : strerror(errno));
    return -1;
}

/* Two levels above PYTHON (ENV/bin/python -> ENV) into OUT; false when
 * there are not two. */
static bool environment_folder(const char *python, char *out, size_t len)
{
    if (snprintf(out, len, "%s", python) >= (int) len)
        return false;
    for (int up = 0; up < 2; up++) {
        char *slash = strrchr(out, '/');
        if (!slash)
            return false;
        *slash = '\0';
    }
    if (!out[0])
        snprintf(out, len, "/");
    return out[0] == '/';
}

/* The user base CPython would use: PYTHONUSERBASE, or HOME (the passwd
 * entry's when unset)/.local. */
static bool user_base(char *out, size_t len)
{
    const char *set = getenv("PYTHONUSERBASE");
    if (set && *set)
        return snprintf(out, len, "%s", set) < (int) len;
    const char *home = getenv("HOME");
    struct passwd *pw = (!home || !*home) ? getpwuid(getuid()) : NULL;
    if (pw)
        home = pw->pw_dir;
    return home && *home && snprintf(out, len, "%s/.local", home) < (int) len;
}

int dk_rankpyenv_check(const char *python, const char *glue, char *err, size_t errlen)
{
    char folder[PATH_MAX];
    if (!environment_folder(python, folder, sizeof folder)) {
        dk_set_err(err, errlen, "the kernel's Python %s is not an absolute path of an "
                   "environment (ENV/bin/python)", python);
        return -1;
    }
    if (must_pass(folder, "the kernel's Python environment", err, errlen) < 0 ||
        must_pass(glue, "distkernel's Python package folder", err, errlen) < 0)
        return -1;
    const char *home = getenv("PYTHONHOME");
    if (home && *home) {
        char copy[PATH_MAX * 2];
        snprintf(copy, sizeof copy, "%s", home);
        char *rest = copy;
        for (char *part; (part = strsep(&rest, ":"));)
            if (*part && must_pass(part, "PYTHONHOME's folder", err, errlen) < 0)
                return -1;
    }
    notes_t notes = {.len = 0};
    notes.text[0] = '\0';
    const char *path = getenv("PYTHONPATH");
    if (path && *path) {
        char *kept = dk_codepath_filter(path, path_note, &notes);
        if (!kept) {
            dk_set_err(err, errlen, "out of memory checking PYTHONPATH");
            return -1;
        }
        int rc = *kept ? setenv("PYTHONPATH", kept, 1) : unsetenv("PYTHONPATH");
        free(kept);
        if (rc != 0) {
            dk_set_err(err, errlen, "cannot set PYTHONPATH: %s", strerror(errno));
            return -1;
        }
    }
    char base[PATH_MAX], why[1024] = "";
    int fd = -1;
    if (user_base(base, sizeof base))
        fd = dk_logdir_open(base, DK_LOGDIR_CODE, NULL, why, sizeof why);
    if (fd >= 0) {
        close(fd);
    } else {
        if (errno != ENOENT && errno != ENOTDIR && why[0]) {
            char line[1200];
            snprintf(line, sizeof line, "the user's site-packages are off: %s", why);
            add_note(&notes, base, line);
        }
        if (setenv("PYTHONNOUSERSITE", "1", 1) != 0) {
            dk_set_err(err, errlen, "cannot set PYTHONNOUSERSITE: %s", strerror(errno));
            return -1;
        }
    }
    if (notes.len ? setenv(DK_RANKPYENV_NOTES, notes.text, 1) != 0
                  : unsetenv(DK_RANKPYENV_NOTES) != 0) {
        dk_set_err(err, errlen, "cannot set " DK_RANKPYENV_NOTES ": %s", strerror(errno));
        return -1;
    }
    return 0;
}
