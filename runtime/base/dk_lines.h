/*
 * dk_lines: turning a rank's output bytes into labelled lines and live progress.
 *
 * Output from many ranks is shown interleaved, so it can only be shown a whole
 * line at a time, each labelled with its rank. Progress bars (tqdm) redraw one
 * line with '\r' many times a second; shown as lines they would be thousands of
 * lines, and shown raw they would fight across ranks. So an assembler per rank
 * and fd splits the bytes into:
 *   DK_LINE      a finished line ('\n'-terminated; "\r\n" counts as '\n'), whose
 *                text is what a terminal would finally show: what follows the
 *                last '\r' of the line;
 *   DK_PROGRESS  after each feed that leaves an unfinished line: what that line
 *                shows now (what follows its last '\r'), to be drawn in place.
 * Text is valid UTF-8 (incomplete sequences are held back, invalid bytes become
 * U+FFFD). A line longer than MAX_LINE bytes is emitted in MAX_LINE pieces, so
 * memory stays bounded whatever a rank writes.
 */
#ifndef DK_LINES_H
#define DK_LINES_H

#include <stddef.h>

typedef enum { DK_LINE = 0, DK_PROGRESS = 1 } dk_lines_event_t;

/* TEXT (LEN bytes, NUL-terminated, valid UTF-8, no '\n') is valid only during the call. */
typedef void (*dk_lines_fn)(void *data, dk_lines_event_t kind, const char *text, size_t len);

typedef struct dk_lines_t dk_lines_t;

/* MAX_LINE 0 means 65536. NULL on allocation failure. */
dk_lines_t *dk_lines_new(size_t max_line);
void dk_lines_destroy(dk_lines_t **self_p);

/* Feed LEN bytes; calls FN(DATA, ...) for each finished line, then at most once
 * with DK_PROGRESS if an unfinished line remains and it changed. */
void dk_lines_feed(dk_lines_t *self, const char *bytes, size_t len, dk_lines_fn fn, void *data);

/* End of stream: an unfinished line is emitted as a DK_LINE (if non-empty). */
void dk_lines_finish(dk_lines_t *self, dk_lines_fn fn, void *data);

#endif
