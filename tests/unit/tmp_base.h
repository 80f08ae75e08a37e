/*
 * A fresh private folder under /tmp for each test of the log suites
 * (test_logdir.c, test_logfile.c), removed after it with dk_logdir_remove,
 * which never follows a link out of it; and the small file helpers both use.
 */
#ifndef TMP_BASE_H
#define TMP_BASE_H

#include "dk_logdir.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char base[256];

static void tmp_base_make(const char *suite)
{
    snprintf(base, sizeof base, "/tmp/dk-test-%s-XXXXXX", suite);
    cr_assert_not_null(mkdtemp(base));
}

static void tmp_base_remove(void)
{
    int fd = open("/tmp", O_RDONLY | O_DIRECTORY);
    dk_logdir_remove(fd, base + 5);
    close(fd);
}

/* BASE/REL, in one of a few rotating buffers (enough for one assertion). */
__attribute__((unused)) static char *at(const char *rel)
{
    static char paths[8][512];
    static int i;
    char *p = paths[i++ % 8];
    snprintf(p, 512, "%s/%s", base, rel);
    return p;
}

__attribute__((unused)) static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

__attribute__((unused)) static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t) n + 1);
    cr_assert_eq(fread(buf, 1, (size_t) n, f), (size_t) n);
    buf[n] = '\0';
    fclose(f);
    if (len)
        *len = (size_t) n;
    return buf;
}

__attribute__((unused)) static bool exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

#endif
