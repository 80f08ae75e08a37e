/*
 * dk_dist_plan: ranks and devices for a run. See the header.
 *
 * Asking for what the node cannot give is an error before anything starts,
 * rather than ranks that fail one by one: the message names the node's GPUs
 * and, with none, how to run CPU ranks instead.
 *
 * On Slurm the node is not this host: the plan is made against what sinfo
 * says the cluster's nodes have (dk_dist_plan_slurm), and the numbers must
 * come out whole (every node runs as many ranks, each GPU rank has a GPU of
 * its node) before Slurm is asked for anything.
 */
#include "dk_dist_plan.h"
#include "dk_err.h"
#include "dk_rank_list.h"
#include "dk_slurm.h"

#include <stdio.h>
#include <stdlib.h>
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

int dk_dist_plan_local_gpu(const dk_dist_plan_t *plan, int r)
{
    return plan->gpu && !plan->remote && r >= 0 && r < DK_GPU_MAX ? plan->gpu_index[r] : -1;
}

int dk_dist_plan_output(const dk_dist_plan_t *plan, const dk_dist_opts_t *opts, bool **shown,
                        char *err, size_t errlen)
{
    *shown = NULL;
    if (opts->output == DK_OUTPUT_ALL)
        return 0;
    bool *set = calloc((size_t)plan->world, sizeof *set);
    if (!set) {
        dk_set_err(err, errlen, "out of memory for the output= of %d ranks", plan->world);
        return -1;
    }
    /* Ranks are laid out node by node (dk_dist_slurm): a node's first is
     * its local rank 0. One node when the ranks are this host's. */
    int per_node = plan->remote && plan->per_node > 0 ? plan->per_node : plan->world;
    if (opts->output == DK_OUTPUT_RANK0)
        set[0] = true;
    else if (opts->output == DK_OUTPUT_LOCAL0)
        for (int r = 0; r < plan->world; r += per_node)
            set[r] = true;
    else {
        char why[512];
        if (dk_rank_list_parse(opts->output_ranks, plan->world, set, why, sizeof why) < 0) {
            dk_set_err(err, errlen, "output=%s: %s (output=all shows every rank). No rank was "
                       "started.", opts->output_ranks, why);
            free(set);
            return -1;
        }
    }
    *shown = set;
    return 0;
}

/* The ranks' split over the nodes, once the world is known: every node runs
 * as many, and each has at least one (a world known only here, e.g. every
 * GPU of the nodes, was not checked with the options). */
static int split_nodes(const dk_dist_opts_t *o, int world, int nodes, dk_dist_plan_t *out,
                       char *err, size_t errlen)
{
    const char *what = o->num_processes ? "num_processes" : "num_accelerators";
    if (world < nodes || world % nodes) {
        const char *whose = o->num_processes || o->num_accelerators ? what
                                                                   : "every GPU of the nodes";
        const char *unset = o->num_processes || o->num_accelerators
                                ? "" : ", num_accelerators not given";
        char given[96];
        if (o->nodes_from_env && o->nodes > 0)
            dk_set_err(err, errlen, "%d rank%s (%s%s) cannot be split evenly over %s: every "
                       "node runs as many ranks; give %s as a multiple of %d, or a number of "
                       "nodes that divides %d: " DK_DIST_NODES_ENV_FIX, world,
                       world == 1 ? "" : "s", whose, unset,
                       dk_dist_opts_nodes_given(o, given, sizeof given), what, nodes, world);
        else
            dk_set_err(err, errlen, "%d rank%s (%s%s) cannot be split evenly over nodes=%d: "
                       "every node runs as many ranks; give %s as a multiple of %d, or nodes= "
                       "a divisor of %d", world, world == 1 ? "" : "s", whose, unset, nodes,
                       what, nodes, world);
        return -1;
    }
    out->nodes = nodes;
    out->per_node = world / nodes;
    out->world = world;
    out->remote = true;
    return 0;
}

/* What the user asked of the GPUs' model against the nodes' GRES: OUT's
 * gpu_type and notice, or -1 with ERR (a model that is not the platform's
 * and that the typed GRES lacks). */
static int slurm_model(const dk_dist_opts_t *opts, const char *gres, const char *gpu_type,
                       const char *where, dk_dist_plan_t *out, char *err, size_t errlen)
{
    if (!opts->accelerator_model[0])
        return 0;
    if (gpu_type && gpu_type[0]) {
        snprintf(out->gpu_type, sizeof out->gpu_type, "%s", gpu_type);
        snprintf(out->model, sizeof out->model, "%s", opts->accelerator_model);
        return 0;
    }
    char types[256];
    dk_slurm_gres_gpu_types(gres, types, sizeof types);
    if (!types[0]) {
        snprintf(out->notice, sizeof out->notice, "%.64s is not checked on Slurm's nodes (their "
                 "GRES, %.120s, names no GPU type); constraint= picks nodes by their features",
                 opts->accelerator_given, gres);
        return 0;
    }
    if (dk_dist_platform_model(opts->accelerator_model)) {
        snprintf(out->notice, sizeof out->notice, "%.64s is the managed platform's %.32s; the "
                 "nodes of %.60s have %.60s GPUs (GRES %.60s), so the run uses those",
                 opts->accelerator_given, opts->accelerator_model, where, types, gres);
        return 0;
    }
    dk_set_err(err, errlen, "%s asks for %s GPUs, but the nodes of %s have %s (GRES %s); give "
               "one of those types, or partition= one whose nodes have %s GPUs",
               opts->accelerator_given, opts->accelerator_model, where, types, gres,
               opts->accelerator_model);
    return -1;
}

int dk_dist_plan_slurm(const dk_dist_opts_t *opts, int gpus_per_node, const char *gres,
                       const char *gpu_type, const char *where, dk_dist_plan_t *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (opts->num_processes) {
        if (split_nodes(opts, opts->num_processes, opts->nodes > 0 ? opts->nodes : 1, out, err,
                        errlen) < 0)
            return -1;
        snprintf(out->what, sizeof out->what, "%d CPU rank%s on %d node%s", out->world,
                 out->world == 1 ? "" : "s", out->nodes, out->nodes == 1 ? "" : "s");
        snprintf(out->device, sizeof out->device, "cpu");
        return 0;
    }
    int k = gpus_per_node;
    if (k <= 0) {
        dk_set_err(err, errlen, "the run asks for GPU ranks, but the nodes of %s have no GPU "
                   "(Slurm's GRES for them: %s). Give partition= one whose nodes have GPUs "
                   "(`sinfo -o '%%P %%G'` lists each partition's), or run CPU ranks with "
                   "num_processes=N", where, gres && gres[0] ? gres : "(null)");
        return -1;
    }
    if (slurm_model(opts, gres, gpu_type, where, out, err, errlen) < 0)
        return -1;
    int nodes = opts->nodes > 0 ? opts->nodes : 0;
    int world = opts->num_accelerators ? opts->num_accelerators : (nodes ? nodes : 1) * k;
    if (!nodes) {
        if (world > k && world % k) {
            dk_set_err(err, errlen, "num_accelerators=%d does not fill whole nodes: each node "
                       "of %s has %d GPUs (%s), so without nodes= give a multiple of %d "
                       "(%d, %d), or give nodes= with num_accelerators a multiple of it",
                       world, where, k, gres, k, (world / k) * k, (world / k + 1) * k);
            return -1;
        }
        nodes = world > k ? world / k : 1;
    }
    if (split_nodes(opts, world, nodes, out, err, errlen) < 0)
        return -1;
    if (out->per_node > k) {
        int need = (world + k - 1) / k;
        while (world % need)    /* the fewest nodes that split it evenly */
            need++;
        char given[96];
        if (opts->nodes_from_env)
            dk_set_err(err, errlen, "num_accelerators=%d over %s asks %d GPUs of each node, "
                       "but a node of %s has %d (%s); %s: nodes=%d, or nodes= unset in both "
                       "to take as many nodes as the GPUs need", world,
                       dk_dist_opts_nodes_given(opts, given, sizeof given), out->per_node,
                       where, k, gres, DK_DIST_NODES_ENV_FIX, need);
        else
            dk_set_err(err, errlen, "num_accelerators=%d over nodes=%d asks %d GPUs of each "
                       "node, but a node of %s has %d (%s); give nodes=%d, or leave nodes= "
                       "out to take as many nodes as the GPUs need", world, nodes,
                       out->per_node, where, k, gres, need);
        return -1;
    }
    out->gpu = true;
    snprintf(out->what, sizeof out->what, "%d GPU rank%s on %d node%s", out->world,
             out->world == 1 ? "" : "s", out->nodes, out->nodes == 1 ? "" : "s");
    snprintf(out->device, sizeof out->device, "GPU (Slurm GRES %s)", gres);
    return 0;
}
