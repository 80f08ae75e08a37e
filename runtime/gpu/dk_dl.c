/*
 * dk_dl: run-time library loading. See dk_dl.h.
 */
#include "dk_dl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

/* Append to TRIED at *USED, never past LEN. */
static void note(char *tried, size_t len, size_t *used, const char *fmt, const char *a,
                 const char *b, const char *c)
{
    if (*used >= len)
        return;
    int n = snprintf(tried + *used, len - *used, fmt, a, b, c);
    if (n > 0)
        *used += (size_t) n;
}

void *dk_dl_open_first(const char *env_var, const char *const *names, const char *const *dirs,
                       char *tried, size_t len)
{
    size_t used = 0;
    if (len)
        tried[0] = '\0';
    const char *explicit = env_var ? getenv(env_var) : NULL;
    if (explicit && *explicit) {
        void *h = dlopen(explicit, RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        note(tried, len, &used, "%s=%s (%s); ", env_var, explicit, dlerror());
    }
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
        for (int d = 0; dirs && dirs[d]; d++) {
            if (!*dirs[d])
                continue;
            char path[512];
            snprintf(path, sizeof path, "%s/lib64/%s", dirs[d], names[i]);
            if ((h = dlopen(path, RTLD_NOW | RTLD_LOCAL)))
                return h;
        }
        note(tried, len, &used, "%s%s%s", i ? ", " : "", names[i], "");
    }
    return NULL;
}

bool dk_dl_resolve(void *lib, const dk_dl_sym_t *syms, size_t n)
{
    bool all = true;
    for (size_t i = 0; i < n; i++) {
        *syms[i].slot = dlsym(lib, syms[i].symbol);
        if (!*syms[i].slot && syms[i].required)
            all = false;
    }
    return all;
}
