/*
 * dk_lost: what is said when ranks on other nodes are lost.
 *
 * A node that goes down takes all its ranks with it, so the user is told of
 * nodes, each with its lost ranks as runs: "node2 lost (ranks 4–7)",
 * "node2 lost (ranks 4–5, 7); node3 lost (rank 8)". Used by dk_job
 * (dk_job_lost_summary) and by the feature's cell error (dk_dist_outcome).
 * The runs themselves (dk_ranks_format) are the one way ranks are written
 * as ranges; dk_stacks labels its groups with them too.
 */
#ifndef DK_LOST_H
#define DK_LOST_H

#include <stdbool.h>
#include <stddef.h>

/* U+2013, between the ends of a run of ranks ("4–7"), in UTF-8. */
#define DK_EN_DASH "\xe2\x80\x93"

/* The ranks RANKS[0..N) (ascending, no repeats) as runs: "0–151, 153–255",
 * "2", "4, 6"; a run shorter than MIN_RUN ranks is written rank by rank (2:
 * "4–5, 7", as lost ranks are told; 3: "0, 1, 3", as the issue shows the
 * groups of a hung run). Appended at *AT in BUF (of LEN, LEN >= 1, NUL-terminated
 * there) and *AT advanced. What does not fit is cut at a run and ends in
 * ", …" (or "…" alone), so a reader sees that ranks are missing; never past
 * BUF. Shared by dk_lost_format and dk_stacks (the groups of a hung run). */
void dk_ranks_format(const int *ranks, size_t n, int min_run, char *buf, size_t len,
                     size_t *at);

/* A rank and its node: sorted with dk_placed_cmp, the ranks of a node come
 * together, each node's in rank order (nodes by name). */
typedef struct {
    const char *host;
    int rank;
} dk_placed_t;

int dk_placed_cmp(const void *a, const void *b);

/* N ranks, LOST[r] whether rank r was lost, HOSTS[r] its node (HOSTS or an
 * entry NULL: "localhost"): one clause per node, in the order of its first
 * lost rank, with SEP between clauses ("; " for one line, "\n" for one line
 * per node). Empty when none was lost, or when out of memory; truncated to
 * fit BUF (LEN >= 1). O(N + L log L) for L lost ranks. */
void dk_lost_format(int n, const bool *lost, const char *const *hosts, const char *sep,
                    char *buf, size_t len);

/* Mark lost, in LOST[0..N), every rank of a node that has a lost rank (HOSTS
 * as for dk_lost_format). A node cut off loses all its ranks, but the runtime
 * marks only those it heard go silent (dk_job_rank_lost): the stop that
 * follows closes the others' connections before their own deadline. O(N log
 * N). Returns 0, or -1 when out of memory, LOST unchanged. */
int dk_lost_whole_nodes(int n, bool *lost, const char *const *hosts);

#endif
