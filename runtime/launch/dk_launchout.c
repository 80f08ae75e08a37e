/*
 * dk_launchout: a launcher's own lines told apart from its tasks' output. See
 * the header.
 *
 * Three states, at a line's start and within it:
 *   START     the line's first bytes, held while they are still a prefix of
 *             "srun: ", "slurmstepd: " or "slurmstepd-NODE: " (at most
 *             PREFIX_MAX bytes); the first byte that rules that out sends
 *             them on as the rank's, and the line goes on as RANK;
 *   RANK      bytes pass through as read, up to and with the newline;
 *   LAUNCHER  the prefix matched: the line is held to its newline and passed
 *             on whole (in LINE_MAX pieces past that).
 * So a rank's output waits only when a line starts with "s" and the next
 * bytes have not come yet, and never longer than its pipe's end: the runtime
 * finishes the filter at EOF.
 *
 * Slurm's node names: slurmstepd says "slurmstepd-node1: " where it knows the
 * node's name (22.05 on a node whose NodeName differs from its hostname, and
 * later versions always). A NodeName is a hostname: letters, digits, '-',
 * '_' and '.', at most HOST_MAX bytes; anything else after "slurmstepd-" is
 * not Slurm's line.
 */
#include "dk_launchout.h"

#include <stdlib.h>
#include <string.h>

#define HOST_MAX 64
#define STEPD "slurmstepd"
#define STEPD_LEN 10
#define PREFIX_MAX (STEPD_LEN + 1 + HOST_MAX + 2)

typedef enum { START, RANK, LAUNCHER } state_t;

struct dk_launchout_t {
    state_t state;
    size_t len;
    char buf[DK_LAUNCHOUT_LINE_MAX];
};

typedef enum { NO = 0, MAYBE = 1, YES = 2 } match_t;

/* Whether BUF (LEN bytes, the start of a line) is, or may become, WORD. */
static match_t literal(const char *buf, size_t len, const char *word)
{
    size_t n = strlen(word);
    if (memcmp(buf, word, len < n ? len : n) != 0)
        return NO;
    return len >= n ? YES : MAYBE;
}

static bool host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_' || c == '.';
}

/* "slurmstepd: " or "slurmstepd-NODE: ". */
static match_t stepd(const char *buf, size_t len)
{
    match_t m = literal(buf, len, STEPD);
    if (m != YES || len == STEPD_LEN)
        return m == NO ? NO : MAYBE;    /* "slurmstepd" alone is not yet a prefix */
    if (buf[STEPD_LEN] == ':')
        return literal(buf + STEPD_LEN, len - STEPD_LEN, ": ");
    if (buf[STEPD_LEN] != '-')
        return NO;
    size_t i = STEPD_LEN + 1;
    while (i < len && host_char(buf[i]) && i - STEPD_LEN - 1 < HOST_MAX)
        i++;
    if (i == len)
        return i - STEPD_LEN - 1 <= HOST_MAX ? MAYBE : NO;
    if (i == STEPD_LEN + 1 || host_char(buf[i]))
        return NO;          /* no name, or one too long */
    return literal(buf + i, len - i, ": ");
}

/* What the line starting with BUF (LEN bytes) is. */
static match_t prefix(const char *buf, size_t len)
{
    match_t a = literal(buf, len, "srun: "), b = stepd(buf, len);
    return a > b ? a : b;
}

dk_launchout_t *dk_launchout_new(void)
{
    return calloc(1, sizeof(dk_launchout_t));
}

void dk_launchout_destroy(dk_launchout_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free(*self_p);
    *self_p = NULL;
}

static void flush(dk_launchout_t *self, dk_launchout_kind_t kind, dk_launchout_fn fn, void *data)
{
    if (self->len > 0)
        fn(data, kind, self->buf, self->len);
    self->len = 0;
}

void dk_launchout_feed(dk_launchout_t *self, const char *bytes, size_t len, dk_launchout_fn fn,
                       void *data)
{
    size_t i = 0;
    while (i < len) {
        if (self->state == RANK) {
            const char *nl = memchr(bytes + i, '\n', len - i);
            size_t run = nl ? (size_t)(nl - (bytes + i)) + 1 : len - i;
            fn(data, DK_LAUNCHOUT_RANK, bytes + i, run);
            i += run;
            if (nl)
                self->state = START;
            continue;
        }
        char c = bytes[i++];
        if (self->state == LAUNCHER) {
            self->buf[self->len++] = c;
            if (c == '\n') {
                flush(self, DK_LAUNCHOUT_LAUNCHER, fn, data);
                self->state = START;
            } else if (self->len == sizeof self->buf) {
                flush(self, DK_LAUNCHOUT_LAUNCHER, fn, data);
            }
            continue;
        }
        /* START: the buffer holds less than PREFIX_MAX bytes of a possible prefix. */
        self->buf[self->len++] = c;
        if (c == '\n') {
            flush(self, DK_LAUNCHOUT_RANK, fn, data);
            continue;
        }
        match_t m = prefix(self->buf, self->len);
        if (m == YES) {
            self->state = LAUNCHER;
        } else if (m == NO || self->len >= PREFIX_MAX) {
            flush(self, DK_LAUNCHOUT_RANK, fn, data);
            self->state = RANK;
        }
    }
}

void dk_launchout_finish(dk_launchout_t *self, dk_launchout_fn fn, void *data)
{
    flush(self, self->state == LAUNCHER ? DK_LAUNCHOUT_LAUNCHER : DK_LAUNCHOUT_RANK, fn, data);
    self->state = START;
}

/* Whether NEEDLE occurs in the LEN bytes at HAY. */
static bool has(const char *hay, size_t len, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (!memcmp(hay + i, needle, n))
            return true;
    return false;
}

bool dk_launchout_tells(const char *line, size_t len)
{
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    if (len == 0 || prefix(line, len) != YES)
        return false;
    /* Restating the exit status, or srun waiting on a step that is ending
     * for a reason said before (or one of ours: the stop). */
    static const char *const bookkeeping[] = {
        ": Exited with exit code ", "Job step aborted: Waiting up to", "Terminating StepId=",
        "forcing job termination", "Force Terminated", NULL};
    for (int i = 0; bookkeeping[i]; i++)
        if (has(line, len, bookkeeping[i]))
            return false;
    /* A prefix with nothing after it tells nothing. */
    const char *colon = memchr(line, ':', len);
    return colon && (size_t)(colon - line) + 2 < len;
}
