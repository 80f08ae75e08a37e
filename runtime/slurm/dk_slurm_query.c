/*
 * dk_slurm_query: questions to Slurm before a run, through sinfo.
 *
 * Whether Slurm can be used from here, and how many GPUs and CPUs a node of
 * a partition has. Each is one command (slurm_run, dk_slurm_command.h) with
 * the query's deadline, ended at once when its caller cancels.
 */
#include "dk_slurm_command.h"

#include "dk_err.h"
#include "dk_spawn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- questions before a run ----------------------------------------------- */

/* A question's command, its deadline and cancel QUERY's. */
static command_t question(const dk_slurm_query_t *query, double *timeout_s)
{
    *timeout_s = query && query->timeout_s > 0 ? query->timeout_s : DK_SLURM_COMMAND_TIMEOUT_S;
    return (command_t){.query = query};
}

int dk_slurm_reachable(const dk_slurm_query_t *query, char *err, size_t errlen)
{
    static const char *const needed[] = {"sinfo", "salloc", "srun", "squeue", "scancel"};
    char missing[128] = "";
    for (size_t i = 0; i < sizeof needed / sizeof needed[0]; i++) {
        char *path = dk_spawn_find_program(needed[i], NULL, 0);
        if (!path) {
            size_t used = strlen(missing);
            snprintf(missing + used, sizeof missing - used, "%s%s", used ? ", " : "", needed[i]);
        }
        free(path);
    }
    if (missing[0]) {
        const char *path = getenv("PATH");
        dk_set_err(err, errlen, "Slurm is not reachable from here: its commands %s are not on "
                   "PATH (%s). Run the kernel where Slurm's client commands are installed, "
                   "or add their folder to PATH in the kernelspec's env", missing,
                   path ? path : "unset");
        return -1;
    }
    /* Slurm retries an unreadable SLURM_CONF for 60 s before it gives up */
    const char *conf = getenv("SLURM_CONF");
    if (conf && conf[0] && access(conf, R_OK) != 0) {
        dk_set_err(err, errlen, "Slurm is not reachable from here: SLURM_CONF is '%s', which "
                   "cannot be read (%s); set it to the cluster's slurm.conf (in the "
                   "kernelspec's env), or unset it where Slurm finds its configuration itself",
                   conf, strerror(errno));
        return -1;
    }
    double t;
    command_t c = question(query, &t);
    static const char *const args[] = {"-h", "-o", "%P %a", NULL};
    char *out = NULL;
    int rc = slurm_run("sinfo", args, t, &c, &out, err, errlen);
    free(out);
    if (rc == 0)
        return 0;
    if (rc > 0 || c.timed_out) {
        char detail[1200];
        if (c.timed_out)
            snprintf(detail, sizeof detail, "sinfo did not answer within %.0f s", t);
        else
            snprintf(detail, sizeof detail, "sinfo failed: %.1000s", slurm_said_text(&c));
        dk_set_err(err, errlen, "Slurm is not reachable from here: %s. SLURM_CONF is %s%s%s; "
                   "set it to the cluster's slurm.conf (in the kernelspec's env) and check "
                   "that `sinfo` works in a terminal on this machine", detail,
                   conf ? "'" : "", conf ? conf : "not set (Slurm then reads /etc/slurm/slurm.conf)",
                   conf ? "'" : "");
    }
    return -1;
}

/* ---- GPUs ------------------------------------------------------------------ */

int dk_slurm_gpus_per_node(const char *partition, const char *nodelist,
                           const dk_slurm_query_t *query, const char *model, int *gpus,
                           char *gres, size_t greslen, char *type, size_t typelen, char *err,
                           size_t errlen)
{
    if (type && typelen)
        type[0] = '\0';
    double t;
    command_t c = question(query, &t);
    const char *args[8] = {"-h", "-o", "%P|%G"};
    size_t n = 3;
    if (nodelist && nodelist[0]) {
        args[n++] = "-n";
        args[n++] = nodelist;
    }
    args[n] = NULL;
    char *out = NULL;
    int rc = slurm_run("sinfo", args, t, &c, &out, err, errlen);
    if (rc > 0)
        dk_set_err(err, errlen, "sinfo could not say the nodes' GPUs: %s", slurm_said_text(&c));
    bool any = nodelist && nodelist[0];
    int most = rc == 0 ? dk_slurm_partition_gpus(out, partition, any, gres, greslen) : -1;
    if (most > 0 && model && model[0] && type && typelen) {
        char typed_gres[512];
        int typed = dk_slurm_partition_gpus_of(out, partition, any, model, typed_gres,
                                               sizeof typed_gres, type, typelen);
        if (typed > 0) {
            most = typed;
            snprintf(gres, greslen, "%s", typed_gres);
        }
    }
    free(out);
    if (rc != 0)
        return -1;
    if (most < 0) {
        if (nodelist && nodelist[0])
            dk_set_err(err, errlen, "sinfo knows none of the nodes %s", nodelist);
        else if (partition && partition[0])
            dk_set_err(err, errlen, "Slurm has no partition '%s' (sinfo lists none of that "
                       "name); give partition= one that `sinfo` lists", partition);
        else
            dk_set_err(err, errlen, "Slurm has no default partition; give partition= one "
                       "that `sinfo` lists");
        return -1;
    }
    *gpus = most;
    return 0;
}

int dk_slurm_cpus_per_node(const char *partition, const dk_slurm_query_t *query, int *cpus,
                           char *err, size_t errlen)
{
    double t;
    command_t c = question(query, &t);
    const char *args[] = {"-h", "-o", "%P|%c", NULL};
    char *out = NULL;
    int rc = slurm_run("sinfo", args, t, &c, &out, err, errlen);
    if (rc > 0)
        dk_set_err(err, errlen, "sinfo could not say the nodes' CPUs: %s", slurm_said_text(&c));
    int most = rc == 0 ? dk_slurm_partition_cpus(out, partition) : -1;
    free(out);
    if (rc != 0)
        return -1;
    if (most < 0) {
        dk_set_err(err, errlen, "sinfo says no CPU count for %s%s%s",
                   partition && partition[0] ? "partition " : "the default partition",
                   partition && partition[0] ? partition : "", "");
        return -1;
    }
    *cpus = most;
    return 0;
}
