/*
 * dk_dist_stall: where the ranks of a silent run are, live.
 *
 * A run whose ranks have printed nothing for stall_after seconds may be hung
 * (one rank in a data loader, the others in all_reduce) or in a long silent
 * step; either way the user wants to know where the ranks are without ending
 * them. From then on, and while the silence lasts, the run asks its ranks for
 * their stacks every DK_DIST_STALL_EVERY_S (dk_job_sample_stacks: the same
 * request a stop makes, never waited for) and its status display shows them
 * grouped as the error would, within the lines the display has left:
 *
 *     silent 75 s; where the ranks are:
 *       rank 1:            time.sleep                    (cell line 6)
 *       ranks 0, 2, 3 (3): torch.distributed.all_reduce  (cell line 8)
 *
 * Output from any rank clears them at once, and a sample asked for before
 * that output is dropped when it comes. Nothing is asked, and nothing runs
 * but a comparison of two times per wait slice, until the first stall_after
 * expires. stall_after 0 turns it off (stall_after= and DISTKERNEL_STALL_AFTER
 * are read with the other options: distributed/dk_dist_opts.h).
 *
 * Threads: the runtime thread tells output (dk_dist_stall_output: one atomic
 * store, on every chunk a rank writes) and hands in the answers
 * (dk_dist_stall_sampled: grouping them there, O(ranks), every few seconds
 * at most); the run's waiting thread asks (dk_dist_stall_due) and reads
 * the lines for the status (dk_dist_stall_lines). A mutex guards the groups.
 * Times are milliseconds of one monotonic clock (dk_now_ms), given by the
 * caller, so a test drives it without real time.
 */
#ifndef DK_DIST_STALL_H
#define DK_DIST_STALL_H

#include <stdbool.h>
#include <stddef.h>

/* Seconds between two samples while the silence lasts; DK_DIST_STALL_EVERY_ENV
 * (read by dk_setting_number, whose table says what it may be) changes it,
 * for a benchmark that measures what one sample costs (bench/stall_bench.py),
 * not for users. */
#define DK_DIST_STALL_EVERY_S 5.0
#define DK_DIST_STALL_EVERY_ENV "DISTKERNEL_STALL_EVERY"

typedef struct dk_dist_stall_t dk_dist_stall_t;

/* Watch a run of WORLD ranks for silence past STALL_AFTER_S seconds (> 0),
 * counted from NOW_MS (the ranks' start) until a rank prints, and sample
 * every EVERY_S (<= 0: DK_DIST_STALL_EVERY_S) while it lasts. Frames in
 * files under CELLS_DIR (ending in '/'; NULL: none; copied) are the cells'.
 * NULL when out of memory. */
dk_dist_stall_t *dk_dist_stall_new(int world, double stall_after_s, double every_s,
                                   long long now_ms, const char *cells_dir);
void dk_dist_stall_destroy(dk_dist_stall_t **self_p);

/* A rank printed at NOW_MS. Any thread; lock-free. */
void dk_dist_stall_output(dk_dist_stall_t *self, long long now_ms);

/* Whether to ask for a sample at NOW_MS: silent for stall_after, and the
 * last ask EVERY_S ago or more (or none since the silence
 * began). A true answer counts as asked at NOW_MS. */
bool dk_dist_stall_due(dk_dist_stall_t *self, long long now_ms);

/* A sample's answers (dk_sink_t.on_stacks: DUMPS[R] NULL for a rank not
 * asked), grouped and kept for the status, unless a rank printed after the
 * sample was asked for. Any thread. */
void dk_dist_stall_sampled(dk_dist_stall_t *self, int world, const char *const *dumps,
                           const size_t *lens);

/* Whether the lines to show have changed since the last dk_dist_stall_lines
 * (a sample came, or output cleared it): the status is due now. */
bool dk_dist_stall_changed(dk_dist_stall_t *self, long long now_ms);

/* The lines for the status at NOW_MS, at most MAX_LINES (>= 1), each ending
 * in '\n' and indented by two spaces: the silence and the groups, smallest
 * first; with room for none, one line saying how many there are. NULL when
 * there is nothing to show (not silent past stall_after, no sample kept) or
 * memory ran out. The caller frees it. */
char *dk_dist_stall_lines(dk_dist_stall_t *self, long long now_ms, size_t max_lines);

#endif
