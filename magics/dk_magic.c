/*
 * dk_magic: a registry of kernel-native magics and the parser that finds them.
 *
 * The parser is deliberately narrow. It claims a cell only when it is certain
 * the cell is a call to one of our magics; anything else (a help request, an
 * unknown name, a line magic followed by more code, a `%` inside Python) is left
 * to IPython, which knows the full magic grammar. A false negative costs
 * nothing, since the same handlers are registered with IPython by the Python
 * glue; a false positive would take a cell away from Python. So:
 *
 *   - blank lines (only spaces, tabs, CR) before the magic are skipped, as
 *     IPython's own cleanup does;
 *   - `%%NAME ARGS` on the first line is a cell magic; the body is everything
 *     after that line's newline, byte for byte;
 *   - `%NAME ARGS` is a line magic only when it is the whole cell (trailing
 *     whitespace and newlines allowed): `%time x` followed by more lines is
 *     IPython's business;
 *   - NAME is a C identifier and must be followed by a blank or the end of the
 *     line; `%%NAME?` and `%NAME??` are help requests and never match;
 *   - ARGS have surrounding blanks stripped.
 *
 * The registry is a small array searched linearly: there are a handful of
 * magics, looked up once per cell.
 */
#include "dk_magic.h"

#include <stdlib.h>
#include <string.h>

struct dk_magic_registry_t {
    const dk_magic_t **items;
    size_t count;
    size_t cap;
};

dk_magic_registry_t *dk_magic_registry_new(void)
{
    return calloc(1, sizeof(dk_magic_registry_t));
}

void dk_magic_registry_destroy(dk_magic_registry_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    free((*self_p)->items);
    free(*self_p);
    *self_p = NULL;
}

static bool is_ident_start(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
}

static bool is_ident_char(char c)
{
    return is_ident_start(c) || (c >= '0' && c <= '9');
}

/* Blanks within a line; '\n' is the only line separator. */
static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

static bool is_identifier(const char *name)
{
    if (!name || !is_ident_start(name[0]))
        return false;
    for (const char *p = name + 1; *p; p++) {
        if (!is_ident_char(*p))
            return false;
    }
    return true;
}

static const dk_magic_t *find_n(const dk_magic_registry_t *self, const char *name, size_t len,
                                dk_magic_kind_t kind)
{
    for (size_t i = 0; self && i < self->count; i++) {
        const dk_magic_t *m = self->items[i];
        if (m->kind == kind && strncmp(m->name, name, len) == 0 && m->name[len] == '\0')
            return m;
    }
    return NULL;
}

int dk_magic_register(dk_magic_registry_t *self, const dk_magic_t *magic)
{
    if (!self || !magic || !magic->run || !is_identifier(magic->name))
        return -1;
    if (find_n(self, magic->name, strlen(magic->name), magic->kind))
        return -1;
    if (self->count == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 8;
        const dk_magic_t **items = realloc(self->items, cap * sizeof *items);
        if (!items)
            return -1;
        self->items = items;
        self->cap = cap;
    }
    self->items[self->count++] = magic;
    return 0;
}

size_t dk_magic_count(const dk_magic_registry_t *self)
{
    return self ? self->count : 0;
}

const dk_magic_t *dk_magic_at(const dk_magic_registry_t *self, size_t i)
{
    return self && i < self->count ? self->items[i] : NULL;
}

const dk_magic_t *dk_magic_find(const dk_magic_registry_t *self, const char *name,
                                dk_magic_kind_t kind)
{
    return name ? find_n(self, name, strlen(name), kind) : NULL;
}

static char *strndup_stripped(const char *start, const char *end)
{
    while (start < end && is_blank(*start))
        start++;
    while (end > start && is_blank(end[-1]))
        end--;
    return strndup(start, (size_t) (end - start));
}

bool dk_magic_parse(const dk_magic_registry_t *self, const char *code, dk_magic_call_t *out)
{
    if (!out)
        return false;
    memset(out, 0, sizeof *out);
    if (!self || !code)
        return false;

    const char *line = code;
    for (;;) {
        const char *p = line;
        while (is_blank(*p))
            p++;
        if (*p != '\n')
            break;
        line = p + 1;
    }
    if (line[0] != '%')
        return false;

    dk_magic_kind_t kind = line[1] == '%' ? DK_MAGIC_CELL : DK_MAGIC_LINE;
    const char *name = line + (kind == DK_MAGIC_CELL ? 2 : 1);
    if (!is_ident_start(*name))
        return false;
    const char *name_end = name + 1;
    while (is_ident_char(*name_end))
        name_end++;
    /* '?' after the name is a help request; anything else glued to the name
     * (`%%a-b`, `%x.y`) is not a call of a magic named by the prefix. */
    if (*name_end != '\0' && *name_end != '\n' && !is_blank(*name_end))
        return false;

    const char *eol = strchr(name_end, '\n');
    const char *line_end = eol ? eol : name_end + strlen(name_end);
    if (kind == DK_MAGIC_LINE) {
        for (const char *p = line_end; *p; p++) {
            if (*p != '\n' && !is_blank(*p))
                return false;
        }
    }
    const dk_magic_t *magic = find_n(self, name, (size_t) (name_end - name), kind);
    if (!magic)
        return false;

    char *args = strndup_stripped(name_end, line_end);
    char *body = strdup(kind == DK_MAGIC_CELL && eol ? eol + 1 : "");
    if (!args || !body) {
        free(args);
        free(body);
        return false;
    }
    out->magic = magic;
    out->args = args;
    out->body = body;
    return true;
}

void dk_magic_call_clear(dk_magic_call_t *call)
{
    if (!call)
        return;
    free(call->args);
    free(call->body);
    memset(call, 0, sizeof *call);
}

int dk_magic_run(const dk_magic_call_t *call, void *host)
{
    if (!call || !call->magic || !call->magic->run)
        return -1;
    return call->magic->run(host, call->magic->data, call->args ? call->args : "",
                            call->body ? call->body : "");
}
