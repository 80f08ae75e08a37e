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

/* Whether the node's GPUS can give what O asks for; ERR says why not. */
static bool gpus_fit(const dk_dist_opts_t *o, const dk_gpu_list_t *gpus, char *err,
                     size_t errlen)
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
    for (int i = 0; o->accelerator_model[0] && i < gpus->count; i++) {
        if (strcmp(gpus->gpus[i].model, o->accelerator_model) != 0) {
            dk_set_err(err, errlen, "accelerator_type asks for %s GPUs, but this node has %d × %s (%s)",
                       o->accelerator_model, gpus->count, gpus->gpus[i].name,
                       gpus->gpus[i].model[0] ? gpus->gpus[i].model : "unknown model");
            return false;
        }
    }
    return true;
}

int dk_dist_plan(const dk_dist_opts_t *opts, const dk_gpu_list_t *gpus, dk_dist_plan_t *out,
                 char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (opts->num_processes)
        return plan_cpu(opts, out);
    if (!gpus_fit(opts, gpus, err, errlen))
        return -1;
    out->world = opts->num_accelerators ? opts->num_accelerators : gpus->count;
    out->gpu = true;
    snprintf(out->what, sizeof out->what, "%d × %s", out->world, gpus->gpus[0].name);
    snprintf(out->device, sizeof out->device, "%s", gpus->gpus[0].name);
    snprintf(out->model, sizeof out->model, "%s", gpus->gpus[0].model);
    for (int r = 0; r < out->world; r++)
        out->gpu_index[r] = gpus->gpus[r].index;
    return 0;
}
