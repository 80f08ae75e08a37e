/*
 * dk_dist_run_restart: restarts=, a run's next attempt after a failed one.
 *
 * Part of dk_dist_run (dk_dist_run_state.h says which file holds what). When
 * an attempt fails (a rank raised, exited or was killed, a node was lost) and
 * attempts are left, every rank has ended already (the job ends them all);
 * then: what the attempt ended with goes into the cell (its error, bounded at
 * any size, and its logs), into its log folder (error.txt) and into the
 * MLflow run (a tag, and its logs under attempt-N/), the nodes it lost are kept
 * to leave out of the next Slurm allocation, the job, the allocation, the
 * output, the records and the stall watch are made anew, and the next
 * attempt starts with its own log folder, the same MLflow run and run id, and
 * TORCHELASTIC_RESTART_COUNT one more (dist_run_relaunch).
 *
 * Runs on the main thread with the GIL held, between two waits.
 */
#include "dk_dist_run_state.h"
#include "dk_clock.h"
#include "dk_setting.h"
#include "dk_hostlist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool dist_run_restartable(dk_dist_run_t *run, dk_job_end_t end)
{
    return !run->pool && end == DK_END_FAILED && run->attempt <= run->opts.restarts &&
           !run->interrupted && !run->shutdown && !dk_kernel_shutting_down(run->kernel);
}

/* NAME into the run's lost nodes, once. A run has at most a node a rank, and
 * a node's ranks are one after another: the last name is the likely one. */
static void note_lost_node(dk_dist_run_t *run, const char *name)
{
    for (size_t i = run->n_lost; i-- > 0;)
        if (strcmp(run->lost[i], name) == 0)
            return;
    char **more = realloc(run->lost, (run->n_lost + 1) * sizeof *more);
    char *copy = more ? strdup(name) : NULL;
    if (more)
        run->lost = more;
    if (!copy)
        return;     /* out of memory: the next allocation may take it again */
    run->lost[run->n_lost++] = copy;
}

/* What the attempt that just failed ended with, into the cell's stderr (the
 * error it would have been, bounded at any size as that is) and error.txt in
 * its log folder, and its first line into ENDED for the MLflow run. Whether
 * error.txt was written. */
static bool say_attempt_failed(dk_dist_run_t *run, char *ended, size_t endedlen)
{
    json_t *e = dist_run_error(run, true);
    const char *ename = e ? json_string_value(json_object_get(e, "ename")) : NULL;
    const char *evalue = e ? json_string_value(json_object_get(e, "evalue")) : NULL;
    snprintf(ended, endedlen, "%s: %s", ename ? ename : "Error", evalue ? evalue : "");
    char *nl = strchr(ended, '\n');
    if (nl)
        *nl = '\0';
    char head[600];
    snprintf(head, sizeof head, "[distkernel] attempt %d of %d failed; its logs: %s\n",
             run->attempt, run->opts.restarts + 1, dk_job_log_dir(run->job));
    dist_run_write_err(run, head);
    size_t i;
    json_t *line;
    json_array_foreach(json_object_get(e, "traceback"), i, line) {
        const char *s = json_string_value(line);
        if (!s)
            continue;
        dist_run_write_err(run, s);
        if (!*s || s[strlen(s) - 1] != '\n')
            dist_run_write_err(run, "\n");
    }
    bool kept = dist_run_keep_error(run, e);
    json_decref(e);
    size_t before = run->n_lost;
    for (int r = 0; run->hosts && r < run->plan.world; r++)
        if (run->ranks[r].lost && run->hosts[r])
            note_lost_node(run, run->hosts[r]);
    if (run->n_lost != before) {
        char *list = dk_hostlist_compress((const char *const *)run->lost, run->n_lost);
        if (list) {
            free(run->lost_list);
            run->lost_list = list;
        }
    }
    return kept;
}

/* The last attempt's records, output, stall watch, stacks, job and Slurm
 * allocation, made ready for the next. */
static int reset_for_attempt(dk_dist_run_t *run)
{
    /* First: the job's runtime thread calls the sink (the output, the
     * records) until the job is destroyed. */
    dk_job_destroy(&run->job);
    dk_dist_slurm_destroy(&run->slurm);     /* after: the ranks were its steps */
    run->hosts = NULL;
    /* A new output (its displays' ids the attempt's); out of memory, the
     * old one stays, finished, for the wait's end. */
    char output_id[48];
    snprintf(output_id, sizeof output_id, "%s-%d", run->run_id, run->attempt);
    dk_dist_output_io_t io = dist_run_output_io(run);
    dk_dist_output_t *output = dk_dist_output_new(run->plan.world, output_id, run->shown, &io);
    if (!output)
        return -1;
    dk_dist_output_destroy(&run->output);
    run->output = output;
    for (int r = 0; r < run->plan.world; r++) {
        int gpu = run->ranks[r].gpu_index;
        free(run->ranks[r].message);
        memset(&run->ranks[r], 0, sizeof run->ranks[r]);
        run->ranks[r].gpu_index = gpu;
    }
    free(run->stacks);
    run->stacks = NULL;
    run->stacks_made = false;
    run->stacks_file[0] = '\0';
    run->timeout_cut = false;
    if (run->opts.stall_after_s > 0) {
        char *cells = dist_run_cells_folder();
        run->stall = dk_dist_stall_new(run->plan.world, run->opts.stall_after_s,
                                       dk_setting_number(DK_DIST_STALL_EVERY_ENV), dk_now_ms(),
                                       cells);
        free(cells);
    }
    return 0;
}

/* A Slurm run's next allocation leaves out the nodes lost so far, after
 * whatever slurm_args the user gave (salloc takes the last --exclude), which
 * GIVEN keeps. Whether it does. */
static bool exclude_lost_nodes(dk_dist_run_t *run, char *given, size_t givenlen)
{
    if (run->opts.launcher != DK_LAUNCHER_SLURM || !run->lost_list)
        return false;
    if (!given[0])
        snprintf(given, givenlen, "%s ", run->opts.slurm_args);
    char args[sizeof run->opts.slurm_args + 16];
    int n = snprintf(args, sizeof args, "%s--exclude=%s", given, run->lost_list);
    if (n < 0 || (size_t)n >= sizeof run->opts.slurm_args) {
        dist_run_write_err(run, "[distkernel] too many lost nodes to leave out of the next "
                                "Slurm allocation; Slurm picks its nodes\n");
        return false;
    }
    memcpy(run->opts.slurm_args, args, (size_t)n + 1);
    return true;
}

/* The next attempt's ranks. A cluster with no allocation of the run's size
 * that leaves out the lost nodes (Slurm refuses the request at once) is
 * asked again without leaving them out: a lost node Slurm has seen go down
 * it does not give, and one that has come back may serve. */
static bool relaunch(dk_dist_run_t *run, bool excluded, const char *given)
{
    if (dist_run_relaunch(run, false))
        return true;
    if (!excluded || !PyErr_ExceptionMatches(PyExc_RuntimeError))
        return false;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *why = s ? dk_py_utf8(s) : NULL;
    char line[2400];
    snprintf(line, sizeof line, "[distkernel] Slurm has no allocation for attempt %d without "
             "%s (%s); asking for one that may include them\n", run->attempt, run->lost_list,
             why ? why : "no reason given");
    dist_run_write_err(run, line);
    Py_XDECREF(s);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    size_t n = strlen(given);
    snprintf(run->opts.slurm_args, sizeof run->opts.slurm_args, "%.*s",
             (int)(n && given[n - 1] == ' ' ? n - 1 : n), given);
    return dist_run_relaunch(run, true);
}

bool dist_run_restart(dk_dist_run_t *run, char *given_args, size_t given_len)
{
    char ended[1024];
    dist_run_attempt_logs(run, say_attempt_failed(run, ended, sizeof ended));
    bool excluded = exclude_lost_nodes(run, given_args, given_len);
    if (reset_for_attempt(run) < 0) {
        run->restart_error = strdup("out of memory starting the next attempt");
        return false;
    }
    run->attempt++;
    char line[1400];
    snprintf(line, sizeof line, "[distkernel] starting every rank again: attempt %d of %d%s%s\n",
             run->attempt, run->opts.restarts + 1,
             excluded ? ", leaving out the lost nodes " : "", excluded ? run->lost_list : "");
    dist_run_write_err(run, line);
    if (!relaunch(run, excluded, given_args)) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *s = value ? PyObject_Str(value) : NULL;
        const char *why = s ? dk_py_utf8(s) : NULL;
        char text[2048];
        /* An interrupt while Slurm's queue held the next attempt is the
         * cell's KeyboardInterrupt, as it is while the first one waits. */
        bool interrupted = type && PyErr_GivenExceptionMatches(type, PyExc_KeyboardInterrupt);
        run->interrupted = run->interrupted || interrupted;
        snprintf(text, sizeof text, "attempt %d of %d %s (%s); attempt %d ended with %s",
                 run->attempt, run->opts.restarts + 1,
                 interrupted ? "was interrupted while starting" : "could not start",
                 why && *why ? why : interrupted ? "KeyboardInterrupt" : "unknown",
                 run->attempt - 1, ended);
        snprintf(run->restart_ename, sizeof run->restart_ename, "%s",
                 interrupted ? "KeyboardInterrupt" : "RuntimeError");
        run->restart_error = strdup(text);
        PyErr_Clear();
        Py_XDECREF(s);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return false;
    }
    dk_dist_mlflow_attempt(&run->mlflow, run->kernel, run->attempt, run->opts.restarts + 1,
                           ended);
    dist_run_announce(run);
    return true;
}
