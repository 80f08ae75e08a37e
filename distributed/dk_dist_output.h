/*
 * dk_dist_output: from the bytes ranks write to what the cell shows.
 *
 * Each rank's stdout and stderr go through a line assembler (runtime/base/dk_lines)
 * of their own. A finished line becomes "[rank N] text\n" in the cell's stdout
 * or stderr; the lines of one read are handed over together. A line being
 * redrawn with '\r' (a progress bar) becomes a display of its own, updated in
 * place, at most every DK_DIST_OUTPUT_PROGRESS_MS, and left in its final state
 * when the line is finished; so bars never turn into thousands of lines, nor
 * fight over one line across ranks. A line left unfinished for
 * DK_DIST_OUTPUT_PARTIAL_MS once the kernel has read everything the rank wrote
 * ("Epoch 1... " before a long step) is shown the same way.
 *
 * It knows no kernel: it calls what it is given (dk_dist_output_io_t) to
 * append text and to publish displays, and asks it the time, so a test drives
 * it alone. Its methods may be called from two threads (the runtime's, which
 * reads the pipes, and the main thread's ticks): a mutex inside guards it, and
 * the io callbacks are called with it held.
 */
#ifndef DK_DIST_OUTPUT_H
#define DK_DIST_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>

#define DK_DIST_OUTPUT_PROGRESS_MS 100   /* a progress display's updates, at most every */
#define DK_DIST_OUTPUT_PARTIAL_MS 300    /* an unfinished line is shown after, once caught up */
#define DK_DIST_OUTPUT_STALL_MS 50       /* a read this slow means the kernel read no pipe */

typedef struct {
    void *data;
    /* Append LEN bytes of finished, labelled lines to the cell's stdout (FD 1)
     * or stderr (FD 2). */
    void (*append)(void *data, int fd, const char *text, size_t len);
    /* Show TEXT in the display DISPLAY_ID: a new display unless UPDATE. FORCE:
     * it must arrive (a display's first and last states), so queue it behind a
     * frontend that is behind; otherwise return false when nothing was sent
     * because the frontend is behind, and the output tries again later. */
    bool (*display)(void *data, const char *display_id, bool update, const char *text,
                    bool force);
    /* Milliseconds on a monotonic clock; NULL: CLOCK_MONOTONIC. */
    long long (*now_ms)(void *data);
} dk_dist_output_io_t;

typedef struct dk_dist_output_t dk_dist_output_t;

/* The output of WORLD ranks of the run RUN_ID (part of its displays' ids).
 * SHOWN: NULL to show every rank's output, else WORLD flags (copied) saying
 * whose output the cell shows (output=rank0, local0, a list); the others' is
 * dropped here (it stays in their logs). IO is copied. NULL when out of
 * memory. */
dk_dist_output_t *dk_dist_output_new(int world, const char *run_id, const bool *shown,
                                   const dk_dist_output_io_t *io);
void dk_dist_output_destroy(dk_dist_output_t **self_p);

/* LEN bytes that rank RANK wrote to FD (1 or 2): its finished lines are
 * appended, its progress display drawn or updated. */
void dk_dist_output_write(dk_dist_output_t *self, int rank, int fd, const char *bytes, size_t len);

/* The kernel has read everything rank RANK wrote to FD so far: from now on an
 * unfinished line of it counts as left unfinished. */
void dk_dist_output_caught_up(dk_dist_output_t *self, int rank, int fd);

/* Call often while the job runs (every few tens of ms): sends the progress
 * updates that were held back or refused, and shows lines left unfinished. */
void dk_dist_output_tick(dk_dist_output_t *self);

/* Every rank has exited: unfinished lines are finished, and each progress
 * display gets its final state. */
void dk_dist_output_finish(dk_dist_output_t *self);

#endif
