/*
 * dk_setting: every DISTKERNEL_* environment variable distkernel reads or
 * sets, in one table (dk_setting_table.c), and the one way a number is read
 * from one of them.
 *
 * A row says the variable's name, who sets it (a user, a Slurm site, or
 * distkernel for its own processes), what holds when it is unset, and what
 * it does; a number's row also its default and the range it may take.
 * `distkernel config` prints the table with this environment's values,
 * `distkernel config --markdown` writes docs/configuration.md from it, and
 * tests/e2e/test_settings.py checks that every DISTKERNEL_* name in the code
 * is in it, every name in it is in the code, and the page is current.
 *
 * One error policy for the numbers (dk_setting_number): unset or empty is
 * the default; a value that is not a number of the row's range (text, a
 * number followed by text, a fraction where a whole number is wanted, out of
 * range) is one line in the process's log (dk_log) naming the variable, its
 * value and what is allowed, once per process and variable, and the default
 * is kept. The kernel, its node agents and its ranks read them alike.
 *
 * The few settings a run reads as it starts, with the cell's options, are
 * checked with them and refused in the cell instead, as a bad option is
 * (DISTKERNEL_LOG_CAP, DISTKERNEL_LOG_ROOT_CAP, DISTKERNEL_IDLE_TIMEOUT,
 * DISTKERNEL_STALL_AFTER): the user is looking at that cell.
 */
#ifndef DK_SETTING_H
#define DK_SETTING_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    DK_SETTING_USER,       /* a user, or a kernelspec's --env, sets it */
    DK_SETTING_SITE,       /* a Slurm site's defaults for every user */
    DK_SETTING_INTERNAL,   /* distkernel sets it for its own processes */
} dk_setting_scope_t;

typedef enum {
    DK_SETTING_TEXT = 0,   /* a name, a path, a list: read where it is used */
    DK_SETTING_NUMBER,     /* a number of [least, most] */
    DK_SETTING_WHOLE,      /* a whole number of [least, most] */
} dk_setting_type_t;

typedef struct {
    const char *name;
    dk_setting_scope_t scope;
    const char *fallback;  /* what holds when it is unset, as the reader reads it */
    const char *meaning;   /* one sentence */
    dk_setting_type_t type;
    double value;          /* NUMBER, WHOLE: the default */
    double least, most;    /* NUMBER, WHOLE: what it may be */
} dk_setting_t;

size_t dk_settings_count(void);
const dk_setting_t *dk_settings_at(size_t i);

/* NAME's row, or NULL. */
const dk_setting_t *dk_setting_find(const char *name);

/* The number NAME holds (a NUMBER or WHOLE row), or its default: see the
 * top. A name not in the table, or not a number's row, is a bug: it is
 * logged, and 0 returned. Thread-safe. */
double dk_setting_number(const char *name);

/* Whether V is a value S (a number's row) allows, into *OUT. */
bool dk_setting_parse(const dk_setting_t *s, const char *v, double *out);

/* "a number from 2 to 3600", "a whole number from 1 to 2047": what NAME's
 * row allows, for messages and `distkernel config`. */
void dk_setting_allowed(const dk_setting_t *s, char *out, size_t len);

#endif
