/*
 * fuzz_lines: the rank output line assembler (runtime/base/dk_lines.h) and the UTF-8
 * repair under it (runtime/base/dk_utf8.h).
 *
 * Input: a small header, then the bytes a rank writes:
 *
 *     MAX K SIZE_1 ... SIZE_K PAYLOAD
 *
 *   MAX    the assembler's max_line (0: the default, 65536; 1-3 mean 4);
 *   K      K % 16 chunk sizes follow (0: the payload is fed in one call);
 *   SIZE_i the sizes, 0-255, used in turn to cut the payload into the chunks
 *          that reads from a pipe would deliver (0 is an empty feed).
 *
 * What dk_lines.h promises, checked in the callback on every event: the text is
 * NUL-terminated at LEN with no NUL before it, is valid UTF-8 (judged by
 * fuzz_check.h's own validator), holds no '\n' and no '\r' (it is what follows
 * the last '\r'), and is at most MAX_LINE bytes, or 3 * MAX_LINE when the
 * payload is not valid UTF-8 (each invalid byte may become a 3-byte U+FFFD). A
 * feed reports DK_PROGRESS at most once, after its lines, only when what the
 * line shows changed; finish reports lines only.
 *
 * And what it implies across calls:
 *   - the finished lines do not depend on how the bytes were chunked: the
 *     payload fed in one call gives the same DK_LINE texts;
 *   - when no line is long enough to be cut, they are exactly what a terminal
 *     would show, computed here from the payload by a plain reference: split at
 *     '\n', drop a '\r' right before it, keep what follows the last '\r',
 *     repair the UTF-8; the unfinished last line only if it is not empty.
 * dk_utf8 is checked directly on the payload too: the repair is valid UTF-8,
 * equals the input when that was valid and NUL-free, and grows at most
 * threefold; the complete prefix holds back at most 3 bytes, none when the
 * payload is valid.
 */
#include "fuzz_check.h"

#include "dk_lines.h"
#include "dk_utf8.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    char **texts;
    size_t *lens;
    size_t n, cap;
} lines_t;

typedef struct {
    size_t max_text;        /* bound on an event's text length */
    bool in_feed;           /* inside dk_lines_feed (not finish) */
    bool progressed;        /* this feed already reported DK_PROGRESS */
    char *shown;            /* last DK_PROGRESS text of the current line, or NULL */
    size_t shown_len;
    lines_t lines;          /* every DK_LINE text, in order */
} recorder_t;

static void lines_push(lines_t *l, const char *text, size_t len)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->texts = realloc(l->texts, l->cap * sizeof *l->texts);
        l->lens = realloc(l->lens, l->cap * sizeof *l->lens);
        FUZZ_CHECK(l->texts && l->lens, "out of memory");
    }
    l->texts[l->n] = malloc(len + 1);
    FUZZ_CHECK(l->texts[l->n], "out of memory");
    memcpy(l->texts[l->n], text, len + 1);
    l->lens[l->n++] = len;
}

static void lines_free(lines_t *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->texts[i]);
    free(l->texts);
    free(l->lens);
    memset(l, 0, sizeof *l);
}

static void forget_shown(recorder_t *r)
{
    free(r->shown);
    r->shown = NULL;
    r->shown_len = 0;
}

static void on_event(void *data, dk_lines_event_t kind, const char *text, size_t len)
{
    recorder_t *r = data;
    FUZZ_CHECK(kind == DK_LINE || kind == DK_PROGRESS, "event kind %d", (int) kind);
    FUZZ_CHECK(text && text[len] == '\0' && strlen(text) == len,
               "text is not NUL-terminated at its length %zu", len);
    FUZZ_CHECK(fuzz_utf8_valid(text, len), "text is not valid UTF-8");
    FUZZ_CHECK(!memchr(text, '\n', len), "text holds a '\\n'");
    FUZZ_CHECK(!memchr(text, '\r', len), "text holds a '\\r'");
    FUZZ_CHECK(len <= r->max_text, "text of %zu bytes, at most %zu expected", len, r->max_text);
    FUZZ_CHECK(!r->progressed, "an event after this feed's DK_PROGRESS");
    if (kind == DK_LINE) {
        lines_push(&r->lines, text, len);
        forget_shown(r);
        return;
    }
    FUZZ_CHECK(r->in_feed, "DK_PROGRESS from dk_lines_finish");
    FUZZ_CHECK(r->shown ? len != r->shown_len || memcmp(text, r->shown, len) != 0 : len > 0,
               "DK_PROGRESS without a change");
    r->progressed = true;
    free(r->shown);
    r->shown = malloc(len + 1);
    FUZZ_CHECK(r->shown, "out of memory");
    memcpy(r->shown, text, len + 1);
    r->shown_len = len;
}

static void feed(dk_lines_t *a, recorder_t *r, const uint8_t *bytes, size_t len)
{
    r->in_feed = true;
    r->progressed = false;
    dk_lines_feed(a, (const char *) bytes, len, on_event, r);
    r->in_feed = false;
    r->progressed = false;
}

/* Run the assembler over PAYLOAD cut by SIZES (N_SIZES, none zero-only). */
static void run(size_t max_line, size_t max_text, const uint8_t *payload, size_t len,
                const uint8_t *sizes, size_t n_sizes, lines_t *out)
{
    dk_lines_t *a = dk_lines_new(max_line);
    FUZZ_CHECK(a, "out of memory");
    recorder_t r = {.max_text = max_text};
    if (n_sizes == 0) {
        feed(a, &r, payload, len);
    } else {
        size_t at = 0;
        for (size_t j = 0; at < len; j++) {
            size_t n = sizes[j % n_sizes];
            if (n > len - at)
                n = len - at;
            feed(a, &r, payload + at, n);
            at += n;
        }
    }
    dk_lines_finish(a, on_event, &r);
    /* Finish forgets the line: a new one starts clean. */
    forget_shown(&r);
    dk_lines_destroy(&a);
    FUZZ_CHECK(a == NULL, "destroy did not clear the pointer");
    *out = r.lines;
}

static void add_reference(lines_t *ref, const uint8_t *s, size_t n)
{
    if (n > 0 && s[n - 1] == '\r')
        n--;
    size_t from = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\r')
            from = i + 1;
    }
    size_t out_len;
    char *text = dk_utf8_sanitize((const char *) s + from, n - from, &out_len);
    FUZZ_CHECK(text, "out of memory");
    lines_push(ref, text, out_len);
    free(text);
}

static lines_t reference(const uint8_t *p, size_t len)
{
    lines_t ref = {0};
    size_t start = 0;
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '\n') {
            add_reference(&ref, p + start, i - start);
            start = i + 1;
        }
    }
    size_t n = len - start;
    /* An unfinished line ending in '\r' still shows what came before it. */
    size_t shown = (n > 0 && p[len - 1] == '\r') ? n - 1 : n;
    size_t from = 0;
    for (size_t i = 0; i < shown; i++) {
        if (p[start + i] == '\r')
            from = i + 1;
    }
    if (shown > from)
        add_reference(&ref, p + start, n);
    return ref;
}

static void check_same_lines(const lines_t *a, const lines_t *b, const char *what)
{
    FUZZ_CHECK(a->n == b->n, "%s: %zu lines against %zu", what, a->n, b->n);
    for (size_t i = 0; i < a->n; i++)
        FUZZ_CHECK(a->lens[i] == b->lens[i] && memcmp(a->texts[i], b->texts[i], a->lens[i]) == 0,
                   "%s: line %zu is '%s' against '%s'", what, i, a->texts[i], b->texts[i]);
}

static void check_utf8(const uint8_t *p, size_t len, bool valid)
{
    size_t out_len = 0;
    char *text = dk_utf8_sanitize((const char *) p, len, &out_len);
    FUZZ_CHECK(text, "dk_utf8_sanitize failed");
    FUZZ_CHECK(text[out_len] == '\0' && strlen(text) == out_len, "repair not terminated");
    FUZZ_CHECK(fuzz_utf8_valid(text, out_len), "the repair is not valid UTF-8");
    FUZZ_CHECK(out_len <= 3 * len, "repair grew %zu bytes to %zu", len, out_len);
    if (valid)
        FUZZ_CHECK(out_len == len && memcmp(text, p, len) == 0, "changed valid UTF-8");
    free(text);
    size_t prefix = dk_utf8_complete_prefix((const char *) p, len);
    FUZZ_CHECK(prefix <= len && len - prefix <= 3, "complete prefix %zu of %zu", prefix, len);
    if (valid)
        FUZZ_CHECK(prefix == len, "held back bytes of valid UTF-8");
    /* What is held back must be the start of a character that could complete. */
    for (size_t i = prefix; i < len; i++)
        FUZZ_CHECK(p[i] >= 0x80, "held back an ASCII byte");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    size_t max_line = data[0];
    size_t n_sizes = data[1] % 16;
    if (size < 2 + n_sizes)
        return 0;
    const uint8_t *sizes = data + 2;
    const uint8_t *payload = data + 2 + n_sizes;
    size_t len = size - 2 - n_sizes;
    bool all_zero = true;
    for (size_t i = 0; i < n_sizes; i++)
        all_zero = all_zero && sizes[i] == 0;
    if (all_zero)
        n_sizes = 0;

    size_t effective = max_line == 0 ? 65536 : max_line < 4 ? 4 : max_line;
    bool valid = fuzz_utf8_valid((const char *) payload, len) && !memchr(payload, '\0', len);
    size_t max_text = valid ? effective : 3 * effective;

    check_utf8(payload, len, valid);

    lines_t chunked, whole;
    run(max_line, max_text, payload, len, sizes, n_sizes, &chunked);
    run(max_line, max_text, payload, len, NULL, 0, &whole);
    check_same_lines(&chunked, &whole, "chunked against whole");
    if (len <= effective) {
        lines_t ref = reference(payload, len);
        check_same_lines(&whole, &ref, "assembler against reference");
        lines_free(&ref);
    }
    lines_free(&chunked);
    lines_free(&whole);
    return 0;
}
