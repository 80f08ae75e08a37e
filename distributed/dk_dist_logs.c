/*
 * dk_dist_logs: a kernel's run log folders and their retention. See the header.
 *
 * The kernel remembers its own newest run folders (a ring) rather than listing
 * its folder each time: the run that falls out of the ring is removed by name.
 */
#include "dk_dist_logs.h"
#include "dk_err.h"
#include "dk_dist_opts.h"
#include "dk_logdir.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define LOG_DIR_HINT "set DISTKERNEL_LOG_DIR to a directory that is yours alone"

int dk_dist_logs_size_from_env(const char *name, unsigned long long dflt,
                               unsigned long long *out, char *err, size_t errlen)
{
    const char *v = getenv(name);
    *out = dflt;
    if (!v || !*v)
        return 0;
    if (!dk_dist_opts_parse_size(v, out)) {
        dk_set_err(err, errlen, "%s=%s is not a size; give bytes or a size such as "
                   "512M or 2G (K, M, G, T: powers of 1024)", name, v);
        return -1;
    }
    return 0;
}

/* Whether the root must be measured (and pruned) before this run: see the
 * header. The last run's folder is measured here, in KDIR. */
static bool must_measure(dk_dist_logs_t *self, int kdir, unsigned long long root_cap)
{
    if (self->runs == 0 || root_cap != self->cap_seen)
        return true;
    if (root_cap == 0)
        return false;   /* no cap: exited kernels were looked at before the first run */
    const char *last = self->kept[self->runs % DK_DIST_KEEP_RUN_LOGS];   /* see keep() */
    unsigned long long wrote = last[0] ? dk_logdir_usage(kdir, last) : 0;
    if (wrote >= self->room)
        return true;
    self->room -= wrote;
    return false;
}

/* The kernel's own folder in ROOT, made if missing, the root pruned first when
 * it must be. */
static int kernel_dir(dk_dist_logs_t *self, int root, unsigned long long root_cap,
                      const char *kname, char *err, size_t errlen)
{
    int kdir = dk_logdir_mkdir(root, kname, false, err, errlen);
    if (kdir < 0 || !must_measure(self, kdir, root_cap))
        return kdir;
    dk_logdir_policy_t policy = {.keep_dead_kernels = DK_DIST_KEEP_DEAD_KERNELS,
                                 .dead_age_s = DK_DIST_DEAD_KERNEL_AGE_S, .cap = root_cap};
    if (self->runs > 0)
        policy.keep_dead_kernels = INT32_MAX;   /* exited kernels: looked at once per kernel */
    unsigned long long usage = 0;
    dk_logdir_prune(root, &policy, getpid(), &usage);
    self->cap_seen = root_cap;
    self->room = root_cap > usage ? root_cap - usage : 0;
    return kdir;
}

/* Remember run folder NAME in the ring, removing the one it replaces. */
static void keep(dk_dist_logs_t *self, int kdir, const char *name)
{
    char *slot = self->kept[self->runs % DK_DIST_KEEP_RUN_LOGS];
    if (slot[0])
        dk_logdir_remove(kdir, slot);
    snprintf(slot, sizeof self->kept[0], "%s", name);
}

int dk_dist_logs_next(dk_dist_logs_t *self, const char *run_id, unsigned long long root_cap,
                      char *out, size_t outlen, char *err, size_t errlen)
{
    char why[1024];
    char *base = dk_logdir_default_root(why, sizeof why);
    int root = base ? dk_logdir_open(base, DK_LOGDIR_CREATE, LOG_DIR_HINT, why, sizeof why) : -1;
    if (root < 0) {
        dk_set_err(err, errlen, "no rank was started: %s", why);
        free(base);
        return -1;
    }
    char kname[32], name[128];
    snprintf(kname, sizeof kname, "kernel-%d", (int)getpid());
    int kdir = kernel_dir(self, root, root_cap, kname, why, sizeof why);
    snprintf(name, sizeof name, "run-%04lu-%s", self->runs + 1, run_id);
    int rdir = kdir >= 0 ? dk_logdir_mkdir(kdir, name, true, why, sizeof why) : -1;
    if (rdir < 0) {
        dk_set_err(err, errlen, "no rank was started: in %s: %s; %s", base, why, LOG_DIR_HINT);
        if (kdir >= 0)
            close(kdir);
        close(root);
        free(base);
        return -1;
    }
    close(rdir);
    self->runs++;
    keep(self, kdir, name);
    snprintf(out, outlen, "%s/%s/%s", base, kname, name);
    close(kdir);
    close(root);
    free(base);
    return 0;
}
