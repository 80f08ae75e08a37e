/*
 * dk_lost: what is said when ranks on other nodes are lost.
 *
 * A node that goes down takes all its ranks with it, so the user is told of
 * nodes, each with its lost ranks as runs: "node2 lost (ranks 4–7)",
 * "node2 lost (ranks 4–5, 7); node3 lost (rank 8)". Used by dk_job
 * (dk_job_lost_summary) and by the feature's cell error (dk_dist_outcome).
 */
#ifndef DK_LOST_H
#define DK_LOST_H

#include <stdbool.h>
#include <stddef.h>

/* U+2013, between the ends of a run of ranks ("4–7"), in UTF-8. */
#define DK_EN_DASH "\xe2\x80\x93"

/* N ranks, LOST[r] whether rank r was lost, HOSTS[r] its node (HOSTS or an
 * entry NULL: "localhost"): one clause per node, in the order of its first
 * lost rank, with SEP between clauses ("; " for one line, "\n" for one line
 * per node). Empty when none was lost; truncated to fit BUF (LEN >= 1). */
void dk_lost_format(int n, const bool *lost, const char *const *hosts, const char *sep,
                    char *buf, size_t len);

#endif
