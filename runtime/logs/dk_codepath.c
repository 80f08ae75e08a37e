/*
 * dk_codepath: the entries of a search path that code may come from. See the
 * header; the check is dk_logdir_open's, as for a rank's folders.
 */
#include "dk_codepath.h"

#include "dk_logdir.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *dk_codepath_filter(const char *list, dk_codepath_note_fn *note, void *data)
{
    size_t len = list ? strlen(list) : 0;
    char *copy = malloc(len + 1), *kept = malloc(len + 1);
    if (!copy || !kept) {
        free(copy);
        free(kept);
        return NULL;
    }
    memcpy(copy, list ? list : "", len + 1);
    size_t at = 0;
    char *rest = copy;
    for (char *entry; (entry = strsep(&rest, ":"));) {
        if (!*entry)
            continue;
        char why[1200];
        if (entry[0] != '/') {
            if (note) {
                snprintf(why, sizeof why, "%s is a relative folder: on another node it would "
                         "name a folder under wherever the rank starts", entry);
                note(data, entry, why);
            }
            continue;
        }
        char err[1024] = "";
        int fd = dk_logdir_open(entry, DK_LOGDIR_CODE, NULL, err, sizeof err);
        if (fd < 0) {
            /* Missing (or under a file): nothing there to import, and a
             * refusal that matters is EACCES. */
            if (note && errno != ENOENT && errno != ENOTDIR) {
                snprintf(why, sizeof why, "%s", err[0] ? err : strerror(errno));
                note(data, entry, why);
            }
            continue;
        }
        close(fd);
        if (at)
            kept[at++] = ':';
        memcpy(kept + at, entry, strlen(entry));
        at += strlen(entry);
    }
    kept[at] = '\0';
    free(copy);
    return kept;
}
