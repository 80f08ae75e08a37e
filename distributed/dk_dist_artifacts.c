/*
 * dk_dist_artifacts: what of a run's log folder goes with its MLflow run.
 * See the header.
 */
#include "dk_dist_artifacts.h"

#include "dk_tgz.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int dk_dist_artifacts_pick(const dk_dist_artifacts_t *a, int *out, int cap)
{
    int n = 0;
    if (a->world <= DK_ARTIFACTS_EACH) {
        for (int r = 0; r < a->world && n < cap; r++)
            out[n++] = r;
        return n;
    }
    int most = cap < DK_ARTIFACTS_PICKED ? cap : DK_ARTIFACTS_PICKED;
#define TAKE(r)                                                                                 \
    do {                                                                                        \
        bool seen = false;                                                                      \
        for (int i = 0; i < n; i++)                                                             \
            seen = seen || out[i] == (r);                                                       \
        if (!seen && n < most)                                                                  \
            out[n++] = (r);                                                                     \
    } while (0)
    TAKE(0);
    if (a->root >= 0 && a->root < a->world)
        TAKE(a->root);
    for (int r = 0; a->ranks && r < a->world && n < most; r++)
        if (a->ranks[r].state == DK_RANK_FAILED && !a->ranks[r].lost)
            TAKE(r);
#undef TAKE
    return n;
}

/* The last CAP bytes of NAME in the folder DIRFD (with, when it was cut, a
 * first line that says so and names WHOLE); malloc'd, its length in *LEN
 * and the file's size in *SIZE. NULL when it cannot be read. */
static char *read_tail(int dirfd, const char *name, size_t cap, const char *whole, size_t *len,
                       size_t *size)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0)
        return NULL;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return NULL;
    }
    *size = (size_t) st.st_size;
    size_t take = *size > cap ? cap : *size;
    char note[600] = "";
    if (take < *size)
        snprintf(note, sizeof note, "[distkernel] the first %zu bytes of this log are left out "
                 "here; the whole log is %s\n", *size - take, whole);
    size_t nl = strlen(note);
    char *buf = malloc(nl + take + 1);
    size_t got = 0;
    while (buf && got < take) {
        ssize_t r = pread(fd, buf + nl + got, take - got, (off_t) (*size - take + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t) r;
    }
    close(fd);
    if (!buf)
        return NULL;
    memcpy(buf, note, nl);
    *len = nl + got;
    return buf;
}

static const char *state_word(const dk_dist_artifacts_t *a, int r)
{
    if (!a->ranks)
        return "-";
    if (a->ranks[r].lost)
        return "lost";
    switch (a->ranks[r].state) {
    case DK_RANK_STARTING:
        return "never started";
    case DK_RANK_RUNNING:
        return "running";
    case DK_RANK_DONE:
        return "finished";
    case DK_RANK_FAILED:
        return r == a->root ? "failed (root cause)" : "failed";
    default:
        return "ended";
    }
}

static bool add(dk_tracked_file_t **files, size_t *n, size_t *cap, const char *path, char *data,
                size_t len)
{
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 16;
        dk_tracked_file_t *more = realloc(*files, ncap * sizeof *more);
        if (!more) {
            free(data);
            return false;
        }
        *files = more;
        *cap = ncap;
    }
    dk_tracked_file_t *f = &(*files)[(*n)++];
    snprintf(f->path, sizeof f->path, "%s", path);
    f->data = data;
    f->len = len;
    return true;
}

/* The log folder's file NAME (its last MAX bytes) as the artifact PATH, when
 * it can be read. */
static void add_file(const dk_dist_artifacts_t *a, int dirfd, const char *name,
                     const char *path, size_t max, dk_tracked_file_t **files, size_t *n,
                     size_t *cap)
{
    char whole[4200];
    snprintf(whole, sizeof whole, "%s/%s", a->log_dir, name);
    size_t len = 0, size = 0;
    char *data = read_tail(dirfd, name, max, whole, &len, &size);
    if (data)
        add(files, n, cap, path, data, len);
}

/* logs/ranks.tar.gz and logs/index.txt, for a run above DK_ARTIFACTS_EACH ranks. */
static void archive(const dk_dist_artifacts_t *a, int dirfd, dk_tracked_file_t **files,
                    size_t *n, size_t *cap)
{
    size_t each = DK_ARTIFACTS_ARCHIVE_MAX / (size_t) a->world;
    if (each < DK_ARTIFACTS_ARCHIVE_EACH_MIN)
        each = DK_ARTIFACTS_ARCHIVE_EACH_MIN;
    if (each > DK_ARTIFACTS_LOG_MAX)
        each = DK_ARTIFACTS_LOG_MAX;
    dk_tgz_t *tgz = dk_tgz_new();
    size_t icap = 512 + (size_t) a->world * 128, ilen = 0;
    char *index = malloc(icap);
    if (!tgz || !index) {
        dk_tgz_destroy(tgz);
        free(index);
        return;
    }
    ilen += (size_t) snprintf(index, icap,
                              "# every rank's log of this run: rank, node, how it ended, the "
                              "log's bytes, and the bytes of it in ranks.tar.gz (its last ones)\n"
                              "# the whole logs: %s\n", a->log_dir);
    long long now = (long long) time(NULL);
    bool ok = true;
    for (int r = 0; r < a->world; r++) {
        char name[32], whole[4200];
        snprintf(name, sizeof name, "rank-%d.log", r);
        snprintf(whole, sizeof whole, "%s/%s", a->log_dir, name);
        size_t len = 0, size = 0;
        char *data = read_tail(dirfd, name, each, whole, &len, &size);
        const char *host = a->hosts && a->hosts[r] ? a->hosts[r] : "-";
        if (ilen + 200 + strlen(host) < icap)
            ilen += (size_t) snprintf(index + ilen, icap - ilen, "rank %d\t%s\t%s\t%zu\t%s\n", r,
                                      host, state_word(a, r), data ? size : 0,
                                      !data ? "no log" : len >= size ? "whole" : "its end");
        if (data)
            ok = ok && dk_tgz_add(tgz, name, data, len, now);
        free(data);
    }
    static const char *const extra[] = {"agents.log", "warm.log", "ranks.txt"};
    for (size_t i = 0; ok && i < sizeof extra / sizeof *extra; i++) {
        char whole[4200];
        snprintf(whole, sizeof whole, "%s/%s", a->log_dir, extra[i]);
        size_t len = 0, size = 0;
        char *data = read_tail(dirfd, extra[i], DK_ARTIFACTS_LOG_MAX, whole, &len, &size);
        if (data)
            ok = dk_tgz_add(tgz, extra[i], data, len, now);
        free(data);
    }
    size_t tlen = 0;
    unsigned char *bytes = ok ? dk_tgz_finish(tgz, &tlen) : (dk_tgz_destroy(tgz), NULL);
    add(files, n, cap, "logs/index.txt", index, ilen);
    if (bytes)
        add(files, n, cap, "logs/ranks.tar.gz", (char *) bytes, tlen);
}

dk_tracked_file_t *dk_dist_artifacts_collect(const dk_dist_artifacts_t *a, size_t *n)
{
    *n = 0;
    int dirfd = a->log_dir ? open(a->log_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dirfd < 0 || a->world < 1) {
        if (dirfd >= 0)
            close(dirfd);
        return NULL;
    }
    dk_tracked_file_t *files = NULL;
    size_t cap = 0;
    int picked[DK_ARTIFACTS_EACH];
    int np = dk_dist_artifacts_pick(a, picked, DK_ARTIFACTS_EACH);
    for (int i = 0; i < np; i++) {
        char name[32], path[64];
        snprintf(name, sizeof name, "rank-%d.log", picked[i]);
        snprintf(path, sizeof path, "logs/%s", name);
        add_file(a, dirfd, name, path, DK_ARTIFACTS_LOG_MAX, &files, n, &cap);
    }
    if (a->error)
        add_file(a, dirfd, DK_DIST_ERROR_FILE, DK_DIST_ERROR_FILE, DK_ARTIFACTS_LOG_MAX, &files,
                 n, &cap);
    if (a->stacks)
        add_file(a, dirfd, "stacks.txt", "stacks.txt", DK_ARTIFACTS_STACKS_MAX, &files, n, &cap);
    if (a->world > DK_ARTIFACTS_EACH)
        archive(a, dirfd, &files, n, &cap);
    close(dirfd);
    for (size_t i = 0; a->under && i < *n; i++) {
        char path[sizeof files[i].path];
        snprintf(path, sizeof path, "%s%s", a->under, files[i].path);
        memcpy(files[i].path, path, sizeof path);
    }
    return files;
}

void dk_dist_artifacts_free(dk_tracked_file_t *files, size_t n)
{
    for (size_t i = 0; files && i < n; i++)
        free((void *) files[i].data);
    free(files);
}
