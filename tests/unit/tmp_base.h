/*
 * A fresh private folder under /tmp for each test of the log suites
 * (test_logdir.c, test_logfile.c), removed after it with dk_logdir_remove,
 * which never follows a link out of it.
 */
#ifndef TMP_BASE_H
#define TMP_BASE_H

#include "dk_logdir.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
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
static char *at(const char *rel)
{
    static char paths[8][512];
    static int i;
    char *p = paths[i++ % 8];
    snprintf(p, 512, "%s/%s", base, rel);
    return p;
}

#endif
