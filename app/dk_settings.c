/*
 * dk_settings: `distkernel config`, the settings table
 * (runtime/base/dk_setting.h) as a user reads it. See the header.
 */
#include "dk_settings.h"
#include "dk_setting.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *scope_name(dk_setting_scope_t scope)
{
    return scope == DK_SETTING_USER ? "user" : scope == DK_SETTING_SITE ? "site" : "internal";
}

/* "; a number from 2 to 3600" for a number's row, "" otherwise, in BUF. */
static const char *allowed_words(const dk_setting_t *s, char *buf, size_t len)
{
    if (s->type == DK_SETTING_TEXT)
        return "";
    char allowed[96];
    dk_setting_allowed(s, allowed, sizeof allowed);
    snprintf(buf, len, "; %s (another value is logged, and the default kept)", allowed);
    return buf;
}

static void markdown(FILE *out)
{
    static const struct {
        dk_setting_scope_t scope;
        const char *title, *intro;
    } parts[] = {
        {DK_SETTING_USER, "What you may set",
         "In the kernel's environment: `export` before starting Jupyter, or a kernelspec's "
         "`--env NAME VALUE` (`distkernel install`). A cell's own options "
         "([distributed cells](distributed-cells.md#options)) come before these."},
        {DK_SETTING_SITE, "What a Slurm site sets",
         "Defaults for every user of a cluster, in the environment the kernels start in "
         "(a kernelspec written with `--env`, or the site's profile): see "
         "[for a Slurm site's admins](slurm-admin.md#site-defaults)."},
        {DK_SETTING_INTERNAL, "What distkernel sets for its own processes",
         "Set by the kernel for its ranks, node agents and warm-start templates, or by "
         "those for one another. They are listed so that you can read a rank's "
         "environment; setting them yourself is not supported."},
    };
    fprintf(out,
            "# Configuration\n\n"
            "Every `DISTKERNEL_*` environment variable distkernel reads or sets. "
            "`distkernel config` prints the ones you may set with their values in your "
            "environment (`--all`: every one).\n\n"
            "A number that is not one its row allows (text, a fraction where a whole "
            "number is wanted, out of its range) is one line in the kernel's log (or the "
            "node agent's, in `agents.log`) naming it, its value and what is allowed, "
            "and its default is used; `distkernel config` marks it. The settings a run "
            "reads as it starts, with the cell's options (`DISTKERNEL_LOG_CAP`, "
            "`DISTKERNEL_LOG_ROOT_CAP`, `DISTKERNEL_IDLE_TIMEOUT`, "
            "`DISTKERNEL_STALL_AFTER`), are refused in the cell instead, as a bad option "
            "is.\n\n"
            "This page is generated from the table in `runtime/base/dk_setting_table.c` by "
            "`distkernel config --markdown`; a test checks that it is current.\n");
    for (size_t p = 0; p < sizeof parts / sizeof *parts; p++) {
        fprintf(out, "\n## %s\n\n%s\n\n| name | when unset | what it does |\n|---|---|---|\n",
                parts[p].title, parts[p].intro);
        for (size_t i = 0; i < dk_settings_count(); i++) {
            const dk_setting_t *s = dk_settings_at(i);
            char allowed[192];
            if (s->scope == parts[p].scope)
                fprintf(out, "| `%s` | %s | %s%s |\n", s->name, s->fallback, s->meaning,
                        allowed_words(s, allowed, sizeof allowed));
        }
    }
}

static void usage(FILE *out)
{
    fprintf(out, "usage: distkernel config [--all | --names | --markdown]\n"
                 "\n"
                 "The DISTKERNEL_* environment variables: those you may set, with their\n"
                 "values here (--all: those distkernel sets for its own processes too;\n"
                 "--names: every name; --markdown: docs/configuration.md).\n");
}

int dk_settings_main(int argc, char **argv, FILE *out)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (argc > 2 || (argc == 2 && strcmp(mode, "--all") != 0 && strcmp(mode, "--names") != 0 &&
                     strcmp(mode, "--markdown") != 0)) {
        bool help = strcmp(mode, "--help") == 0 || strcmp(mode, "-h") == 0;
        if (!help)
            fprintf(stderr, "distkernel config: unknown argument '%s'\n", argv[argc - 1]);
        usage(help ? out : stderr);
        return help ? 0 : 2;
    }
    if (strcmp(mode, "--markdown") == 0) {
        markdown(out);
        return 0;
    }
    bool all = strcmp(mode, "--all") == 0, names = strcmp(mode, "--names") == 0;
    for (size_t i = 0; i < dk_settings_count(); i++) {
        const dk_setting_t *s = dk_settings_at(i);
        if (names) {
            fprintf(out, "%s\n", s->name);
            continue;
        }
        if (s->scope == DK_SETTING_INTERNAL && !all)
            continue;
        const char *value = getenv(s->name);
        double d;
        bool refused = value && *value && s->type != DK_SETTING_TEXT &&
                       !dk_setting_parse(s, value, &d);
        fprintf(out, "%-34s %-8s %s%s\n", s->name, scope_name(s->scope),
                value ? value : "(unset)", refused ? "   (not allowed: the default is used)" : "");
        char allowed[192];
        fprintf(out, "%-34s          %s; unset: %s%s\n", "", s->meaning, s->fallback,
                allowed_words(s, allowed, sizeof allowed));
    }
    return 0;
}
