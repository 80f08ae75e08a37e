/*
 * dk_codepath: which entries of a search path (PYTHONPATH's form: folders
 * separated by ':') code may be imported from, by dk_logdir's rule for code.
 *
 * A rank on another node than the kernel's gets the kernel's PYTHONPATH. An
 * entry that does not exist on that node (/tmp/lib, node-local scratch) can
 * be made there by another user of the node, with a sitecustomize.py in it,
 * and CPython would run it while it starts, before any of distkernel's
 * Python could look. So the rank program filters the list before CPython
 * starts (dk_rankpyenv.h), and the kernel checks its own once to say so in
 * the cell. An entry is kept only when dk_logdir_open(DK_LOGDIR_CODE) passes
 * on it now: the user's or root's, writable by nobody else, every folder
 * above it root's or the user's and writable by others only when sticky.
 * Missing entries are left out without a word (the kernel's folder on a node
 * that does not share it always was); refused and relative ones (which would
 * name a folder under wherever the rank happens to start) are left out and
 * told to the NOTE callback. Empty entries (the working folder, to CPython)
 * are left out too.
 */
#ifndef DK_CODEPATH_H
#define DK_CODEPATH_H

/* Called for each entry left out for a reason the user should read: ENTRY
 * and WHY (one sentence, naming the entry). */
typedef void dk_codepath_note_fn(void *data, const char *entry, const char *why);

/* The entries of LIST (':'-separated) that code may come from, in their
 * order, ':'-separated (malloc'd, the caller frees; "" when none is). NOTE
 * (may be NULL) hears of each refused or relative one. NULL when out of
 * memory. */
char *dk_codepath_filter(const char *list, dk_codepath_note_fn *note, void *data);

#endif
