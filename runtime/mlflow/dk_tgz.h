/*
 * dk_tgz: a gzip'd tar archive, made in memory.
 *
 * What a run attaches to its MLflow run at 1,024 ranks is one archive of
 * every rank's log rather than 1,024 uploads (distributed/dk_dist_artifacts.c).
 * Plain files only, POSIX ustar headers (names up to 100 bytes), mode 0644;
 * what `tar -xzf` and Python's tarfile read.
 */
#ifndef DK_TGZ_H
#define DK_TGZ_H

#include <stdbool.h>
#include <stddef.h>

typedef struct dk_tgz_t dk_tgz_t;

/* An empty archive, or NULL when out of memory. */
dk_tgz_t *dk_tgz_new(void);

/* Add a file NAME (at most 100 bytes, no "..") of LEN bytes at DATA, with
 * modification time MTIME (s since the epoch). False when NAME is not one or
 * out of memory (the archive is then unusable). */
bool dk_tgz_add(dk_tgz_t *self, const char *name, const void *data, size_t len, long long mtime);

/* End the archive; its bytes (malloc'd, the caller frees) and their count, or
 * NULL. SELF is freed either way. */
unsigned char *dk_tgz_finish(dk_tgz_t *self, size_t *len);

/* Free an archive not finished. NULL-safe. */
void dk_tgz_destroy(dk_tgz_t *self);

#endif
