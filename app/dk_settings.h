/*
 * dk_settings: `distkernel config`, the table of every DISTKERNEL_*
 * variable (runtime/base/dk_setting.h) printed with this environment's
 * values, or as docs/configuration.md.
 */
#ifndef DK_SETTINGS_H
#define DK_SETTINGS_H

#include <stdio.h>

/* `distkernel config [--all | --names | --markdown]`. Returns the exit code. */
int dk_settings_main(int argc, char **argv, FILE *out);

#endif
