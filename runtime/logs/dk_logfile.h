/*
 * dk_logfile: a log file with a size cap.
 *
 * A rank can print faster than any disk fills (5 GiB in 33 s was measured),
 * and what matters in a huge log is its beginning (the setup, the first
 * error) and its end (the last error, the traceback). So a capped log keeps
 * its head and its tail: the first CAP/2 bytes go straight to the file; after
 * that, output goes to two tail segments, NAME.tail-0 and NAME.tail-1, of CAP/4
 * each, used in turn: when the current one is full, the other is truncated and
 * written next. The older segment's bytes are what is dropped. When the log is
 * closed, a marker line saying how many bytes were left out is appended,
 * followed by the older segment and then the newer one (from the first line
 * that starts within their first 4 KiB, so the tail does not open mid-line),
 * and the segments are removed. So disk use is at most CAP while the rank runs
 * (1.25 CAP for a moment while the tail is copied, each segment emptied once
 * copied), memory is one copy buffer, and the tail holds between CAP/4 and
 * CAP/2 of the last bytes. Until the log is closed the latest output is in
 * the segments, not in NAME.
 */
#ifndef DK_LOGFILE_H
#define DK_LOGFILE_H

#include <stdbool.h>
#include <stddef.h>

#define DK_LOG_CAP_DEFAULT (1ULL << 30)        /* per rank log: 1 GiB */
#define DK_LOG_CAP_MIN (4ULL << 10)            /* below this a log is all marker */

typedef struct dk_logfile_t dk_logfile_t;

/* Create NAME in DIRFD (dk_logdir_create) with cap CAP (0: DK_LOG_CAP_DEFAULT;
 * smaller than DK_LOG_CAP_MIN: DK_LOG_CAP_MIN). DIRFD is borrowed and must stay
 * open until dk_logfile_close (a job with thousands of ranks shares one).
 * NULL with a reason in ERR. */
dk_logfile_t *dk_logfile_new(int dirfd, const char *name, unsigned long long cap, char *err,
                             size_t errlen);

/* Append LEN bytes. Returns 0, or -1 with errno when a write failed (a full
 * disk): the log is then incomplete and later writes are refused. */
int dk_logfile_write(dk_logfile_t *self, const void *bytes, size_t len);

/* True once the output passed the head, that is, once it will be cut. */
bool dk_logfile_capped(dk_logfile_t *self);

/* Bytes written so far in all. */
unsigned long long dk_logfile_total(dk_logfile_t *self);

/* The cap in effect. */
unsigned long long dk_logfile_cap(dk_logfile_t *self);

/* Assemble head, marker and tail into NAME, remove the segments, close, free.
 * Returns 0, or -1 with errno when the assembly could not be written. Sets
 * *SELF_P to NULL; NULL, or a pointer to NULL, is nothing to do (0). */
int dk_logfile_close(dk_logfile_t **self_p);

#endif
