/*
 * dk_stacks_fold: one rank's dump read and folded into where it is. See
 * dk_stacks.h.
 *
 * The dump is read line by line; a line that is not a thread header, a frame
 * or the "  ..." of a cut stack is passed over, so garbage costs a look and
 * nothing else. A frame line is `  File "NAME", line N in FUNC`, where NAME
 * may hold anything (quotes, `", line `): it ends at the last `", line `.
 * Frames are not copied: they point into the dump, which outlives them. A
 * thread header is known by its start ("Thread 0x", "Current thread 0x"), so
 * the thread name newer CPythons add before " (most recent call first)"
 * changes nothing.
 *
 * Decorators: torch wraps its collectives (c10d_logger's `wrapper`,
 * _contextlib's `decorate_context`), so the outermost library frame is often
 * a wrapper. A frame whose function has a wrapper's name (wrapper, inner,
 * wrapped, _fn, decorate_context) is passed over for the next library frame
 * inward, when there is one: the user called all_reduce, not `wrapper`.
 */
#include "dk_stacks.h"
#include "dk_utf8.h"

#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FRAMES 128      /* faulthandler writes at most 100 per thread */
#define MAX_FIELD 160       /* bytes of a file or function name kept for display */
#define MAX_CALL 120        /* bytes of a folded call shown */
#define MAX_FUNC 32         /* bytes of a cell function's name shown */
#define MAX_RUNS 3          /* runs of cell frames shown ("line 3 in f ×99 ← line 10") */
#define MAX_SOURCE 80       /* bytes of the innermost cell line's source shown */
#define MAX_CELL_READ (1 << 20) /* bytes of a cell's file read for that line */

typedef struct {
    const char *file, *func;    /* into the dump (not NUL-terminated) */
    size_t file_len, func_len;
    long line;                  /* -1: "???" */
} frame_t;

typedef struct {
    dk_stacks_is_cell_fn is_cell;
    void *data;
} cells_t;

/* ---- text helpers -------------------------------------------------------- */

typedef struct {
    char *buf;
    size_t len, cap;
    bool failed;
} str_t;

static void str_add(str_t *s, const char *text, size_t len)
{
    if (s->failed)
        return;
    if (s->len + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 128;
        while (cap < s->len + len + 1)
            cap *= 2;
        char *buf = realloc(s->buf, cap);
        if (!buf) {
            s->failed = true;
            return;
        }
        s->buf = buf;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, len);
    s->len += len;
    s->buf[s->len] = '\0';
}

static void str_puts(str_t *s, const char *text) { str_add(s, text, strlen(text)); }

/* How much of TEXT (LEN bytes of valid UTF-8) fits MAX bytes, cut between
 * characters: a name cut inside one would no longer be UTF-8. */
static size_t boundary(const char *text, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char) text[max] & 0xC0) == 0x80)
        max--;
    return max;
}

/* TEXT (LEN bytes of valid UTF-8) cut to at most MAX bytes on a character
 * boundary, "…" at the cut; control characters become '?', so a name from a
 * dump cannot break a line of the summary. */
static void str_field(str_t *s, const char *text, size_t len, size_t max)
{
    bool cut = len > max;
    len = boundary(text, len, max);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char) text[i];
        char ch = c < 0x20 || c == 0x7f ? '?' : (char) c;
        str_add(s, &ch, 1);
    }
    if (cut)
        str_puts(s, "\xe2\x80\xa6");
}

static bool starts(const char *line, size_t len, const char *prefix)
{
    size_t n = strlen(prefix);
    return len >= n && memcmp(line, prefix, n) == 0;
}

/* ---- folding library frames to a call ----------------------------------- */

static bool implementation_module(const char *name, size_t len)
{
    static const char *const known[] = {"distributed_c10d", "c10d_logger"};
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (strlen(known[i]) == len && memcmp(known[i], name, len) == 0)
            return true;
    return false;
}

/* Where the module path starts in FILE: after site-packages/, dist-packages/
 * or lib/pythonX.Y/; else at the file's own name. */
static const char *module_start(const char *file)
{
    const char *best = NULL;
    for (const char *p = file; (p = strstr(p, "-packages/")) != NULL; p++) {
        if ((p - file >= 4 && !memcmp(p - 4, "site", 4)) ||
            (p - file >= 4 && !memcmp(p - 4, "dist", 4)))
            best = p + strlen("-packages/");
    }
    if (best)
        return best;
    for (const char *p = file; (p = strstr(p, "/lib/python3")) != NULL; p++) {
        const char *q = p + strlen("/lib/python3");
        while (*q == '.' || (*q >= '0' && *q <= '9'))
            q++;
        if (*q == '/')
            best = q + 1;
    }
    if (best)
        return best;
    const char *slash = strrchr(file, '/');
    return slash ? slash + 1 : file;
}

char *dk_stacks_call_name(const char *file, const char *func)
{
    str_t s = {0};
    str_puts(&s, "");
    file = file ? file : "";
    func = func ? func : "";
    const char *start = module_start(file);
    size_t len = strlen(start);
    if (len > 3 && !strcmp(start + len - 3, ".py"))
        len -= 3;
    if (len >= 9 && !memcmp(start + len - 9, "/__init__", 9))
        len -= 9;
    /* "<frozen importlib._bootstrap>", "<string>", "???": not a path. */
    bool path = len > 0 && start[0] != '<' && !(len == 3 && !memcmp(start, "???", 3));
    bool first = true;
    for (size_t at = 0; path && at < len;) {
        const char *part = start + at;
        const char *slash = memchr(part, '/', len - at);
        size_t n = slash ? (size_t) (slash - part) : len - at;
        at += n + 1;
        if (n == 0 || (!first && (part[0] == '_' || implementation_module(part, n))))
            continue;
        if (!first)
            str_puts(&s, ".");
        str_add(&s, part, n);
        first = false;
    }
    if (strcmp(func, "<module>") != 0 || first) {
        if (!first)
            str_puts(&s, ".");
        str_puts(&s, func);
    }
    return s.failed ? (free(s.buf), NULL) : s.buf;
}

static bool wrapper_name(const frame_t *f)
{
    static const char *const names[] = {"wrapper", "inner", "wrapped", "_fn", "decorate_context"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (strlen(names[i]) == f->func_len && !memcmp(names[i], f->func, f->func_len))
            return true;
    return false;
}

/* ---- parsing a dump ------------------------------------------------------ */

/* `  File "NAME", line N in FUNC`; the last `", line ` ends the name, which
 * may hold anything. */
static bool parse_frame(const char *line, size_t len, frame_t *f)
{
    static const char head[] = "  File \"", mid[] = "\", line ";
    if (!starts(line, len, head))
        return false;
    const char *name = line + strlen(head), *end = line + len, *sep = NULL;
    for (const char *p = name; p + strlen(mid) <= end; p++)
        if (!memcmp(p, mid, strlen(mid)))
            sep = p;
    if (!sep)
        return false;
    const char *num = sep + strlen(mid);
    const char *in = NULL;
    for (const char *p = num; p + 4 <= end; p++) {
        if (!memcmp(p, " in ", 4)) {
            in = p;
            break;
        }
    }
    if (!in)
        return false;
    long n = 0;
    bool digits = in > num;
    for (const char *p = num; p < in && digits; p++) {
        digits = *p >= '0' && *p <= '9';
        if (digits && n < 100000000)
            n = n * 10 + (*p - '0');
    }
    *f = (frame_t){.file = name, .file_len = (size_t) (sep - name), .func = in + 4,
                   .func_len = (size_t) (end - in - 4), .line = digits ? n : -1};
    return true;
}

static bool thread_header(const char *line, size_t len)
{
    return starts(line, len, "Thread 0x") || starts(line, len, "Current thread 0x") ||
           starts(line, len, "Traceback (most recent call first):");
}

static bool cell_frame(const cells_t *self, const frame_t *f)
{
    if (!self->is_cell)
        return false;
    char file[1024];
    size_t n = f->file_len < sizeof file - 1 ? f->file_len : sizeof file - 1;
    memcpy(file, f->file, n);
    file[n] = '\0';
    return self->is_cell(self->data, file);
}

/* The main thread's frames (see the header) into FRAMES; their count. */
static size_t main_thread(const cells_t *self, const char *dump, frame_t *frames, bool *truncated)
{
    const char *chosen = NULL;          /* where the chosen thread's lines start */
    bool chosen_has_cell = false;
    const char *thread = dump;
    bool has_cell = false;
    for (const char *line = dump; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t) (nl - line) : strlen(line);
        frame_t f;
        if (thread_header(line, len)) {
            if (thread != line && (has_cell || !chosen_has_cell)) {
                chosen = thread;
                chosen_has_cell = has_cell;
            }
            thread = line;
            has_cell = false;
        } else if (!has_cell && parse_frame(line, len, &f)) {
            has_cell = cell_frame(self, &f);
        }
        line = nl ? nl + 1 : line + len;
    }
    if (has_cell || !chosen_has_cell)
        chosen = thread;
    size_t n = 0;
    *truncated = false;
    for (const char *line = chosen; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t) (nl - line) : strlen(line);
        if (line != chosen && thread_header(line, len))
            break;
        if (n < MAX_FRAMES && parse_frame(line, len, &frames[n]))
            n++;
        else if (len == 5 && !memcmp(line, "  ...", 5))
            *truncated = true;
        line = nl ? nl + 1 : line + len;
    }
    return n;
}

/* ---- judging a rank ------------------------------------------------------ */

static bool same_frame(const frame_t *a, const frame_t *b)
{
    return a->line == b->line && a->file_len == b->file_len && a->func_len == b->func_len &&
           !memcmp(a->file, b->file, a->file_len) && !memcmp(a->func, b->func, a->func_len);
}

/* Line F->line of F's file, the cell's source (read on the kernel's side:
 * the cell files the predicate accepts are the kernel's own), without its
 * indentation and end, into OUT (nothing when it cannot be read: a rank on
 * another node whose file is not here, a line past the end). What a
 * traceback shows beside "line N", so a rank stopped in a call into C
 * (time.sleep) says which call. */
static void cell_source(const frame_t *f, str_t *out)
{
    char path[PATH_MAX];
    if (f->line < 1 || f->file_len == 0 || f->file_len >= sizeof path)
        return;
    memcpy(path, f->file, f->file_len);
    path[f->file_len] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return;
    struct stat st;
    size_t cap = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0
                     ? (st.st_size < MAX_CELL_READ ? (size_t) st.st_size : MAX_CELL_READ) : 0;
    char *buf = cap ? malloc(cap) : NULL;
    size_t len = 0;
    while (buf && len < cap) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r <= 0)
            break;
        len += (size_t) r;
    }
    close(fd);
    const char *line = buf, *end = buf ? buf + len : NULL;
    for (long n = 1; line && n < f->line; n++) {
        line = memchr(line, '\n', (size_t) (end - line));
        line = line ? line + 1 : NULL;
    }
    if (line && line < end) {
        const char *stop = memchr(line, '\n', (size_t) (end - line));
        stop = stop ? stop : end;
        while (line < stop && (*line == ' ' || *line == '\t'))
            line++;
        while (stop > line && (stop[-1] == ' ' || stop[-1] == '\t' || stop[-1] == '\r'))
            stop--;
        size_t n = dk_utf8_valid_prefix(line, (size_t) (stop - line));
        if (n > 0) {
            str_puts(out, ": ");
            str_field(out, line, n, MAX_SOURCE);
        }
    }
    free(buf);
}

/* Fold FRAMES (N, innermost first) into the call, the where text and the
 * signature. False when memory ran out. */
static bool fold(const cells_t *self, const frame_t *frames, size_t n, bool truncated,
                 char **call, str_t *where, str_t *sig)
{
    size_t c = 0;
    while (c < n && !cell_frame(self, &frames[c]))
        c++;
    *call = NULL;
    const frame_t *lib = NULL;
    if (c == n && n > 0)
        lib = &frames[0];
    else if (c > 0 && c < n) {
        size_t o = c - 1;
        while (o > 0 && wrapper_name(&frames[o]))
            o--;
        lib = &frames[o];
    }
    if (lib) {
        char file[MAX_FIELD + 1], func[MAX_FIELD + 1];
        size_t fl = boundary(lib->file, lib->file_len, MAX_FIELD);
        size_t gl = boundary(lib->func, lib->func_len, MAX_FIELD);
        memcpy(file, lib->file, fl);
        file[fl] = '\0';
        memcpy(func, lib->func, gl);
        func[gl] = '\0';
        char *name = dk_stacks_call_name(file, func);
        str_t shown = {0};
        if (name)
            str_field(&shown, name, strlen(name), MAX_CALL);
        free(name);
        if (!name || shown.failed) {
            free(shown.buf);
            return false;
        }
        *call = shown.buf;
    }
    str_puts(sig, *call ? *call : "");
    str_puts(sig, "\n");
    if (n == 0)
        str_puts(where, "no Python stack");
    else if (c == n)
        str_puts(where, truncated ? "below the 100 frames shown" : "not in the cell");
    /* The cell frames outward from the innermost, equal ones in a row as one run. */
    size_t runs = 0;
    for (size_t i = c; i < n;) {
        if (!cell_frame(self, &frames[i])) {
            i++;
            continue;
        }
        size_t k = 1;
        while (i + k < n && same_frame(&frames[i], &frames[i + k]))
            k++;
        char num[64];
        snprintf(num, sizeof num, "\t%ld\t%zu\n", frames[i].line, k);
        str_add(sig, frames[i].file, frames[i].file_len);
        str_puts(sig, "\t");
        str_add(sig, frames[i].func, frames[i].func_len);
        str_puts(sig, num);
        if (runs < MAX_RUNS) {
            str_puts(where, runs ? " \xe2\x86\x90 line " : "cell line ");
            if (frames[i].line < 0)
                str_puts(where, "?");
            else {
                snprintf(num, sizeof num, "%ld", frames[i].line);
                str_puts(where, num);
            }
            if (!(frames[i].func_len == 8 && !memcmp(frames[i].func, "<module>", 8))) {
                str_puts(where, " in ");
                str_field(where, frames[i].func, frames[i].func_len, MAX_FUNC);
            }
            if (k > 1) {
                snprintf(num, sizeof num, " \xc3\x97%zu%s", k, truncated && i + k == n ? "+" : "");
                str_puts(where, num);
            }
            if (runs == 0)
                cell_source(&frames[i], where);
        } else if (runs == MAX_RUNS) {
            str_puts(where, " \xe2\x86\x90 \xe2\x80\xa6");
        }
        runs++;
        i += k;
    }
    return !where->failed && !sig->failed;
}


int dk_stack_fold(const char *dump, dk_stacks_is_cell_fn is_cell, void *data, dk_stack_t *out)
{
    *out = (dk_stack_t){0};
    cells_t cells = {is_cell, data};
    frame_t *frames = malloc(MAX_FRAMES * sizeof *frames);
    str_t where = {0}, sig = {0};
    char *call = NULL;
    bool truncated = false, ok = frames != NULL;
    if (ok) {
        size_t n = main_thread(&cells, dump ? dump : "", frames, &truncated);
        ok = fold(&cells, frames, n, truncated, &call, &where, &sig);
    }
    free(frames);
    if (!ok) {
        free(call);
        free(where.buf);
        free(sig.buf);
        return -1;
    }
    *out = (dk_stack_t){.call = call, .where = where.buf, .signature = sig.buf};
    return 0;
}

void dk_stack_clear(dk_stack_t *stack)
{
    if (!stack)
        return;
    free(stack->call);
    free(stack->where);
    free(stack->signature);
    *stack = (dk_stack_t){0};
}
