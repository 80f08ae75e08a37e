/*
 * distkernel-rank, the program: load the environment's libpython, then the
 * rank's body (rank_main.c, in libdistkernel-rank.so) on it. It links no
 * Python, so one build serves every environment (dk_pyload.h).
 */
#include "dk_pyload.h"

#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    char err[2048], host[256] = "?";
    int (*rank_main)(int, char **) = NULL;
    /* On a Slurm node the kernel's environment may simply not exist: say so,
     * naming the node and the path, rather than that a library is missing. */
    gethostname(host, sizeof host - 1);
    if (dk_pyload_check_python(host, err, sizeof err) < 0) {
        fprintf(stderr, "distkernel-rank: %s\n", err);
        return 1;
    }
    if (dk_pyload_open(dk_pyload_libpython(), NULL, 0, err, sizeof err) == 0)
        *(void **)&rank_main = dk_pyload_entry("libdistkernel-rank.so", "dk_rank_main", err,
                                               sizeof err);
    if (!rank_main) {
        fprintf(stderr, "distkernel-rank on %s: %s\n", host, err);
        return 1;
    }
    return rank_main(argc, argv);
}
