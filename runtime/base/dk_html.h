/*
 * dk_html: text made safe to place in HTML.
 *
 * Everything the kernel writes into a text/html output passes through here:
 * ids and names from a tracking server, a run name the user chose, a URL from
 * the environment. None of it is markup, so all of it is escaped, in element
 * content and in quoted attribute values alike (the five characters that can
 * end either: & < > " ').
 */
#ifndef DK_HTML_H
#define DK_HTML_H

#include <stddef.h>

/* TEXT with & < > " ' replaced by their character references, as a new
 * NUL-terminated string the caller frees; NULL TEXT is "". NULL only when
 * out of memory. */
char *dk_html_escape(const char *text);

#endif
