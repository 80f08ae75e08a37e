/*
 * dk_html: text made safe to place in HTML. See dk_html.h.
 *
 * Two passes (measure, then write) so the result is one exact allocation.
 */
#include "dk_html.h"

#include <stdlib.h>
#include <string.h>

/* The reference for C, or NULL when C stands for itself. */
static const char *reference(char c)
{
    switch (c) {
    case '&': return "&amp;";
    case '<': return "&lt;";
    case '>': return "&gt;";
    case '"': return "&quot;";
    case '\'': return "&#39;";
    default: return NULL;
    }
}

char *dk_html_escape(const char *text)
{
    if (!text)
        text = "";
    size_t n = 1;
    for (const char *p = text; *p; p++) {
        const char *r = reference(*p);
        n += r ? strlen(r) : 1;
    }
    char *out = malloc(n);
    if (!out)
        return NULL;
    char *w = out;
    for (const char *p = text; *p; p++) {
        const char *r = reference(*p);
        if (r) {
            size_t len = strlen(r);
            memcpy(w, r, len);
            w += len;
        } else {
            *w++ = *p;
        }
    }
    *w = '\0';
    return out;
}
