/*
 * dk_settings: every DISTKERNEL_* environment variable distkernel reads or
 * sets, in one table: its name, who sets it, its default and what it does.
 *
 * It is the one list: `distkernel config` prints it with the values of this
 * environment, `distkernel config --markdown` writes docs/configuration.md
 * from it, and tests/e2e/test_settings.py checks that every DISTKERNEL_* name
 * in the code is in it, that every name in it is in the code, and that the
 * doc is current. The table itself is in dk_settings.c.
 */
#ifndef DK_SETTINGS_H
#define DK_SETTINGS_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    DK_SETTING_USER,       /* a user, or a kernelspec's --env, sets it */
    DK_SETTING_SITE,       /* a Slurm site's defaults for every user */
    DK_SETTING_INTERNAL,   /* distkernel sets it for its own processes */
} dk_setting_scope_t;

typedef struct {
    const char *name;
    dk_setting_scope_t scope;
    const char *fallback;  /* what holds when it is unset, as the reader reads it */
    const char *meaning;   /* one sentence */
} dk_setting_t;

size_t dk_settings_count(void);
const dk_setting_t *dk_settings_at(size_t i);

/* `distkernel config [--all | --names | --markdown]`. Returns the exit code. */
int dk_settings_main(int argc, char **argv, FILE *out);

#endif
