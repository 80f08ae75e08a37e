/*
 * dk_setting: the table's lookup and the one reader of its numbers. See the
 * header.
 */
#include "dk_setting.h"
#include "dk_log.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const dk_setting_t *dk_setting_find(const char *name)
{
    /* Sorted by name (a test checks it): halves. */
    size_t lo = 0, hi = dk_settings_count();
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, dk_settings_at(mid)->name);
        if (c == 0)
            return dk_settings_at(mid);
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

void dk_setting_allowed(const dk_setting_t *s, char *out, size_t len)
{
    snprintf(out, len, "%s from %g to %g", s->type == DK_SETTING_WHOLE ? "a whole number"
                                                                       : "a number",
             s->least, s->most);
}

bool dk_setting_parse(const dk_setting_t *s, const char *v, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end || errno || !isfinite(d) || d < s->least || d > s->most ||
        (s->type == DK_SETTING_WHOLE && d != (double)(long long)d))
        return false;
    *out = d;
    return true;
}

/* Each variable's bad value is said once a process: a setting read per run
 * or per connection would say it again each time. */
static pthread_mutex_t said_lock = PTHREAD_MUTEX_INITIALIZER;
static const dk_setting_t *said[64];
static size_t n_said;

static bool first_time(const dk_setting_t *s)
{
    pthread_mutex_lock(&said_lock);
    bool first = true;
    for (size_t i = 0; first && i < n_said; i++)
        first = said[i] != s;
    if (first && n_said < sizeof said / sizeof *said)
        said[n_said++] = s;
    pthread_mutex_unlock(&said_lock);
    return first;
}

double dk_setting_number(const char *name)
{
    const dk_setting_t *s = dk_setting_find(name);
    if (!s || s->type == DK_SETTING_TEXT) {
        dk_log("%s is not a number in the settings table (runtime/base/dk_setting_table.c)",
               name);
        return 0;
    }
    const char *v = getenv(name);
    double d;
    if (!v || !*v)
        return s->value;
    if (dk_setting_parse(s, v, &d))
        return d;
    if (first_time(s)) {
        char allowed[96];
        dk_setting_allowed(s, allowed, sizeof allowed);
        dk_log("%s is '%.200s', which is not %s: %g is used (distkernel config lists the "
               "settings)", name, v, allowed, s->value);
    }
    return s->value;
}
