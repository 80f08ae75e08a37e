/*
 * dk_magic: kernel-native magics.
 *
 * A cell whose first line is `%%NAME ARGS` (a cell magic) or whose only line is
 * `%NAME ARGS` (a line magic), where NAME is registered here, is handled by C
 * before Python sees it. The same names are also registered with IPython by the
 * Python glue (with the doc text kept here), so `%lsmagic` lists them, `%%NAME?`
 * shows their documentation, and IPython-side calls (`get_ipython().run_cell_magic`)
 * reach the same handler.
 *
 * `%%NAME?` and `%NAME?` are never matched: they are help requests, which
 * IPython answers from the registered doc.
 */
#ifndef DK_MAGIC_H
#define DK_MAGIC_H

#include <stdbool.h>
#include <stddef.h>

typedef enum { DK_MAGIC_LINE, DK_MAGIC_CELL } dk_magic_kind_t;

/* A handler runs the magic. HOST is what the embedding program passed to
 * dk_magic_run (the kernel passes its execution context); DATA is the magic's
 * own (the feature that registered it); ARGS is the rest of the magic line
 * (leading blanks stripped), BODY the cell body after the first line ("" for a
 * line magic). It returns 0 on success or -1 after reporting an error through
 * the host. */
typedef int (*dk_magic_fn)(void *host, void *data, const char *args, const char *body);

typedef struct {
    const char *name;      /* without % */
    dk_magic_kind_t kind;
    const char *doc;       /* full help text shown by `%%NAME?` */
    dk_magic_fn run;
    void *data;            /* passed to RUN: the registering feature's object */
} dk_magic_t;

typedef struct dk_magic_registry_t dk_magic_registry_t;

/* Create an empty registry; NULL on allocation failure. */
dk_magic_registry_t *dk_magic_registry_new(void);
void dk_magic_registry_destroy(dk_magic_registry_t **self_p);

/* Add MAGIC (borrowed: it must outlive the registry). Returns -1 if a magic of the
 * same name and kind is already registered or the name is not an identifier. */
int dk_magic_register(dk_magic_registry_t *self, const dk_magic_t *magic);

/* Number of registered magics, and the I-th one (registration order). */
size_t dk_magic_count(const dk_magic_registry_t *self);
const dk_magic_t *dk_magic_at(const dk_magic_registry_t *self, size_t i);

/* Look up by name and kind; NULL if absent. */
const dk_magic_t *dk_magic_find(const dk_magic_registry_t *self, const char *name,
                                dk_magic_kind_t kind);

/* A parsed call: what dk_magic_parse found. ARGS and BODY are owned (free with
 * dk_magic_call_clear). */
typedef struct {
    const dk_magic_t *magic;
    char *args;
    char *body;
} dk_magic_call_t;

/* If CODE invokes a registered magic, fill OUT and return true; otherwise return
 * false and leave OUT zeroed. Leading blank lines are skipped. */
bool dk_magic_parse(const dk_magic_registry_t *self, const char *code, dk_magic_call_t *out);
void dk_magic_call_clear(dk_magic_call_t *call);

/* Run a parsed call with HOST; returns the handler's result. */
int dk_magic_run(const dk_magic_call_t *call, void *host);

#endif
