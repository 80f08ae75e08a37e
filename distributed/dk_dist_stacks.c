/*
 * dk_dist_stacks: the asked ranks' dumps, grouped for the error and written
 * whole. See the header.
 *
 * stacks.txt is written before the summary is made: the summary names it
 * when it leaves groups out, and the file holds every dump, grouped as the
 * summary orders them (dk_stacks_write). It is created as the run's other
 * files are (0600, never through a symlink) and replaced if there: a round
 * of started ranks writes its own in its own folder.
 */
#include "dk_dist_stacks.h"

#include "dk_err.h"
#include "dk_logdir.h"
#include "dk_stacks.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int write_stacks(FILE *f, void *stacks)
{
    return dk_stacks_write(stacks, f);
}

static int write_file(dk_stacks_t *stacks, const char *path, char *err, size_t errlen)
{
    return dk_logdir_write_file(path, write_stacks, stacks, err, errlen);
}

char *dk_dist_stacks_report(int world, const char *const *dumps, const size_t *lens,
                            const char *const *hosts, const char *cells_dir, const char *log_dir,
                            char *file, size_t file_len, char *err, size_t errlen)
{
    file[0] = '\0';
    dk_set_err(err, errlen, "%s", "");
    dk_stacks_t *stacks = dk_stacks_new(cells_dir ? dk_stacks_is_under : NULL, (void *) cells_dir);
    if (!stacks) {
        dk_set_err(err, errlen, "out of memory grouping the ranks' stacks");
        return NULL;
    }
    for (int r = 0; r < world; r++) {
        if (dumps[r] && dk_stacks_add(stacks, r, hosts ? hosts[r] : NULL, dumps[r], lens[r]) < 0) {
            dk_set_err(err, errlen, "out of memory grouping the ranks' stacks");
            dk_stacks_destroy(&stacks);
            return NULL;
        }
    }
    char *summary = NULL;
    if (dk_stacks_ranks(stacks) > 0) {
        char path[4200];
        if (log_dir) {
            snprintf(path, sizeof path, "%s/%s", log_dir, DK_DIST_STACKS_FILE);
            if (write_file(stacks, path, err, errlen) == 0)
                snprintf(file, file_len, "%s", path);
        }
        summary = dk_stacks_summary(stacks, 0, file[0] ? file : NULL);
        if (!summary)
            dk_set_err(err, errlen, "out of memory grouping the ranks' stacks");
    }
    dk_stacks_destroy(&stacks);
    return summary;
}
