/*
 * dk_lines: splitting a rank's output into finished lines and live progress.
 *
 * The assembler keeps only the unfinished line, and only the part of it a
 * terminal would still show: a carriage return empties the buffer, so a
 * progress bar redrawn a million times costs one bar's worth of memory. The
 * catch is "\r\n", which is a newline and not a return: a '\r' at the end of a
 * chunk cannot be judged until the next byte arrives, so it is remembered
 * (pending_cr) and applied then. Until it is applied the line still shows what
 * it held, which is also what finish() emits if the stream ends there.
 *
 * Text leaves as UTF-8 through dk_utf8: a finished line is sanitized whole (an
 * incomplete sequence before '\n' can never complete, so it becomes U+FFFD);
 * progress shows only the complete prefix, the tail waiting for the next chunk.
 * '\r' and '\n' are ASCII and never inside a multi-byte sequence, so splitting on
 * them at the byte level is safe.
 *
 * An over-long line is cut when more bytes arrive than MAX_LINE holds, not when
 * the buffer becomes full: a line of exactly MAX_LINE bytes followed by '\n' is
 * one line, not a line and an empty one. Cuts fall on a character boundary.
 */
#include "dk_lines.h"

#include "dk_utf8.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_MAX_LINE 65536

struct dk_lines_t {
    size_t max_line;
    char *buf;              /* the unfinished line since its last '\r' (raw bytes) */
    size_t len, cap;
    bool pending_cr;        /* the last byte seen was '\r'; '\n' may still follow */
    char *shown;            /* text of the last DK_PROGRESS for this line, or NULL */
    size_t shown_len;
};

dk_lines_t *dk_lines_new(size_t max_line)
{
    dk_lines_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    /* Below 4 a cut could never hold back a split character. */
    self->max_line = max_line == 0 ? DEFAULT_MAX_LINE : max_line < 4 ? 4 : max_line;
    return self;
}

void dk_lines_destroy(dk_lines_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_lines_t *self = *self_p;
    free(self->buf);
    free(self->shown);
    free(self);
    *self_p = NULL;
}

static void forget_shown(dk_lines_t *self)
{
    free(self->shown);
    self->shown = NULL;
    self->shown_len = 0;
}

/* Emit LEN raw bytes of the buffer as a DK_LINE. */
static void emit_line(dk_lines_t *self, size_t len, dk_lines_fn fn, void *data)
{
    size_t out_len = 0;
    char *text = dk_utf8_sanitize(self->buf ? self->buf : "", len, &out_len);
    if (text)
        fn(data, DK_LINE, text, out_len);
    free(text);
    forget_shown(self);
}

static void finish_line(dk_lines_t *self, dk_lines_fn fn, void *data)
{
    emit_line(self, self->len, fn, data);
    self->len = 0;
}

/* The buffer is full and more bytes are coming: emit it as a piece, keeping an
 * incomplete trailing character for the next piece. */
static void cut_piece(dk_lines_t *self, dk_lines_fn fn, void *data)
{
    size_t keep_from = dk_utf8_complete_prefix(self->buf, self->len);
    if (keep_from == 0)
        keep_from = self->len;
    emit_line(self, keep_from, fn, data);
    memmove(self->buf, self->buf + keep_from, self->len - keep_from);
    self->len -= keep_from;
}

/* Room for at least one more byte, growing geometrically up to max_line. */
static bool make_room(dk_lines_t *self)
{
    if (self->len < self->cap)
        return true;
    size_t cap = self->cap ? self->cap * 2 : 256;
    if (cap > self->max_line)
        cap = self->max_line;
    if (cap <= self->len)
        return false;
    char *grown = realloc(self->buf, cap);
    if (!grown)
        return false;
    self->buf = grown;
    self->cap = cap;
    return true;
}

/* Append a run of bytes containing neither '\r' nor '\n'. */
static void append(dk_lines_t *self, const char *bytes, size_t n, dk_lines_fn fn, void *data)
{
    while (n > 0) {
        if (self->len == self->max_line)
            cut_piece(self, fn, data);
        if (!make_room(self))
            return;     /* out of memory: drop the bytes rather than crash */
        size_t take = self->cap - self->len;
        if (take > n)
            take = n;
        memcpy(self->buf + self->len, bytes, take);
        self->len += take;
        bytes += take;
        n -= take;
    }
}

/* After a feed: redraw the unfinished line if what it shows changed. */
static void report_progress(dk_lines_t *self, dk_lines_fn fn, void *data)
{
    size_t complete = self->len ? dk_utf8_complete_prefix(self->buf, self->len) : 0;
    size_t text_len = 0;
    char *text = dk_utf8_sanitize(self->buf ? self->buf : "", complete, &text_len);
    if (!text)
        return;
    bool changed = self->shown
        ? text_len != self->shown_len || memcmp(text, self->shown, text_len) != 0
        : text_len > 0;
    if (changed) {
        fn(data, DK_PROGRESS, text, text_len);
        free(self->shown);
        self->shown = text;
        self->shown_len = text_len;
    } else {
        free(text);
    }
}

void dk_lines_feed(dk_lines_t *self, const char *bytes, size_t len, dk_lines_fn fn, void *data)
{
    size_t i = 0;
    while (i < len) {
        if (self->pending_cr) {
            self->pending_cr = false;
            if (bytes[i] == '\n') {
                finish_line(self, fn, data);
                i++;
                continue;
            }
            self->len = 0;      /* a real carriage return: the line starts over */
        }
        size_t run = i;
        while (run < len && bytes[run] != '\n' && bytes[run] != '\r')
            run++;
        append(self, bytes + i, run - i, fn, data);
        i = run;
        if (i == len)
            break;
        if (bytes[i] == '\n')
            finish_line(self, fn, data);
        else
            self->pending_cr = true;
        i++;
    }
    report_progress(self, fn, data);
}

void dk_lines_finish(dk_lines_t *self, dk_lines_fn fn, void *data)
{
    if (self->len > 0)
        finish_line(self, fn, data);
    self->len = 0;
    self->pending_cr = false;
    forget_shown(self);
}
