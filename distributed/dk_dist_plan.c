/*
 * dk_dist_plan: ranks and devices for a run. See the header.
 *
 * Asking for what the node cannot give is an error before anything starts,
 * rather than ranks that fail one by one: the message names the node's GPUs
 * and, with none, how to run CPU ranks instead.
 */
#include "dk_dist_plan.h"
#include "dk_err.h"

#include <stdio.h>
#include <string.h>

static int plan_cpu(const dk_dist_opts_t *o, dk_dist_plan_t *out)
{
    out->world = o->num_processes;
    out->gpu = false;
    snprintf(out->what, sizeof out->what, "%d CPU rank%s", out->world, out->world == 1 ? "" : "s");
    snprintf(out->device, sizeof out->device, "cpu");
    return 0;
}

/* Whether the node's GPUS can give what O asks for; ERR says why not, NOTICE
 * what the user should know when it can (a platform type mapped to the node's). */
static bool gpus_fit(const dk_dist_opts_t *o, const dk_gpu_list_t *gpus, char *notice,
                     size_t noticelen, char *err, size_t errlen)
{
    if (gpus->count == 0) {
        dk_set_err(err, errlen,
                   "no GPU on this node (%s). To run CPU ranks instead, give num_processes=N, "
                   "for example: %%%%distributed num_processes=2",
                   gpus->why_none);
        return false;
    }
    if (o->num_accelerators > gpus->count) {
        dk_set_err(err, errlen, "num_accelerators=%d asks for more GPUs than this node has: %d × %s",
                   o->num_accelerators, gpus->count, gpus->gpus[0].name);
        return false;
    }
    int world = o->num_accelerators ? o->num_accelerators : gpus->count;
    for (int i = 0; o->accelerator_model[0] && i < world; i++) {
        if (strcmp(gpus->gpus[i].model, o->accelerator_model) == 0)
            continue;
        const char *has = gpus->gpus[i].model[0] ? gpus->gpus[i].model : "unknown model";
        if (dk_dist_platform_model(o->accelerator_model)) {
            snprintf(notice, noticelen,
                     "%s is the managed platform's %s; this node has %d × %s (%s), so the run "
                     "uses those", o->accelerator_given, o->accelerator_model, gpus->count,
                     gpus->gpus[i].name, has);
            return true;
        }
        dk_set_err(err, errlen, "%s asks for %s GPUs, but this node has %d × %s (%s), and %s is "
                   "not one of the managed platform's types either (those run on whatever the "
                   "node has): accelerator_type %s; gpu_type %s",
                   o->accelerator_given, o->accelerator_model, gpus->count, gpus->gpus[i].name,
                   has, o->accelerator_model, dk_dist_platform_accelerator_types,
                   dk_dist_platform_gpu_types);
        return false;
    }
    return true;
}

int dk_dist_plan(const dk_dist_opts_t *opts, const dk_gpu_list_t *gpus, dk_dist_plan_t *out,
                 char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (opts->num_processes)
        return plan_cpu(opts, out);
    char notice[sizeof out->notice] = "";
    if (!gpus_fit(opts, gpus, notice, sizeof notice, err, errlen))
        return -1;
    out->world = opts->num_accelerators ? opts->num_accelerators : gpus->count;
    out->gpu = true;
    snprintf(out->notice, sizeof out->notice, "%s", notice);
    snprintf(out->what, sizeof out->what, "%d × %s", out->world, gpus->gpus[0].name);
    snprintf(out->device, sizeof out->device, "%s", gpus->gpus[0].name);
    snprintf(out->model, sizeof out->model, "%s", gpus->gpus[0].model);
    for (int r = 0; r < out->world; r++)
        out->gpu_index[r] = gpus->gpus[r].index;
    return 0;
}
