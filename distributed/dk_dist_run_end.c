/*
 * dk_dist_run_end: waiting for a run's ranks, and what it ended with.
 *
 * Part of dk_dist_run (dk_dist_run_state.h says which file holds what). The
 * main thread waits with the GIL released, waking every
 * DK_DIST_WAIT_SLICE_MS to honour an interrupt or a shutdown, to tick the
 * output, to sample the stacks of ranks silent past stall_after and to
 * refresh the status display. On started ranks it waits for the round, an
 * interrupt interrupts the round rather than ending the ranks, and the run
 * detaches from the pool as soon as the round ends: output written after
 * that goes only to the ranks' logs, never after the cell's result. Under
 * restarts=, a failed attempt is followed by the next (dk_dist_run_restart.c)
 * and the wait goes on.
 *
 * Then: the ranks' last facts, MLflow's status and files, the results, or
 * the error (dk_dist_outcome) with where the ranks were (dk_dist_stacks).
 */
#include "dk_dist_run_state.h"
#include "dk_clock.h"
#include "dk_dist_artifacts.h"
#include "dk_dist_outcome.h"
#include "dk_dist_pool.h"
#include "dk_logdir.h"
#include "dk_dist_stacks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Between two slices of the wait: an interrupt or a shutdown ends every rank. */
static void honour_signals(dk_dist_run_t *run)
{
    if (PyErr_CheckSignals() < 0) {
        PyErr_Clear();
        if (!run->interrupted) {
            run->interrupted = true;
            if (run->pool && !run->starting) {
                dk_job_interrupt(run->job);
                dist_run_write_err(run,
                                   "[distkernel] interrupted: KeyboardInterrupt in every rank\n");
            } else {
                dk_job_cancel(run->job);
                dist_run_write_err(run, "[distkernel] interrupted: ending every rank\n");
            }
        }
    }
    if (!run->shutdown && dk_kernel_shutting_down(run->kernel)) {
        run->shutdown = true;
        dk_job_cancel(run->job);
    }
}

char *dist_run_cells_folder(void)
{
    PyObject *mod = PyImport_ImportModule("distkernel._cells");
    PyObject *folder = mod ? PyObject_CallMethod(mod, "folder", NULL) : NULL;
    const char *text = folder && PyUnicode_Check(folder) ? dk_py_utf8(folder) : NULL;
    char *out = text ? strdup(text) : NULL;
    if (PyErr_Occurred()) {
        dk_log("distributed: cannot tell the cell files' folder (stacks show no cell lines)");
        PyErr_Clear();
    }
    Py_XDECREF(folder);
    Py_XDECREF(mod);
    return out;
}

/* Where the ranks were, from the stacks the runtime asked them for before it
 * ended them (none on a run that ended by itself): made once, with
 * stacks.txt in the run's log folder. */
static void make_stacks(dk_dist_run_t *run)
{
    if (run->stacks_made)
        return;
    run->stacks_made = true;
    int world = run->plan.world;
    const char **dumps = calloc((size_t) world, sizeof *dumps);
    size_t *lens = calloc((size_t) world, sizeof *lens);
    bool any = false;
    for (int r = 0; dumps && lens && r < world; r++) {
        dumps[r] = dk_job_rank_stacks(run->job, r, &lens[r]);
        any = any || dumps[r];
    }
    if (any) {
        char *cells = dist_run_cells_folder();
        char err[4400];
        run->stacks = dk_dist_stacks_report(world, dumps, lens, run->hosts, cells,
                                            dk_job_log_dir(run->job), run->stacks_file,
                                            sizeof run->stacks_file, err, sizeof err);
        if (*err)
            dk_log("distributed: %s", err);
        free(cells);
    }
    free(dumps);
    free(lens);
}

/* Every rank has exited: the records' final facts, from the job. */
static void last_facts(dk_dist_run_t *run)
{
    for (int r = 0; r < run->plan.world; r++) {
        dk_dist_rank_t *ri = &run->ranks[r];
        ri->state = dk_job_rank_state(run->job, r);
        ri->exit_code = dk_job_rank_exit_code(run->job, r);
        ri->term_signal = dk_job_rank_signal(run->job, r);
        ri->log_complete = dk_job_rank_log_complete(run->job, r);
        ri->log_capped = dk_job_rank_log_capped(run->job, r);
    }
}

/* What of the log folder of RUN's job, which ended as END, goes with the
 * MLflow run (dk_dist_artifacts.h); the records say which ranks were lost. */
static dk_dist_artifacts_t run_files(dk_dist_run_t *run, dk_job_end_t end)
{
    bool gone = run->pool && dk_job_end(run->job) != DK_END_NONE;
    pthread_mutex_lock(&run->lock);
    for (int r = 0; r < run->plan.world; r++)
        run->ranks[r].lost = dk_job_rank_lost(run->job, r);
    pthread_mutex_unlock(&run->lock);
    return (dk_dist_artifacts_t){
        .log_dir = dk_job_log_dir(run->job), .world = run->plan.world, .ranks = run->ranks,
        .hosts = run->hosts, .stacks = end != DK_END_OK && run->stacks_file[0],
        .root = end != DK_END_FAILED      ? -1
                : run->pool && !gone      ? dk_job_round_root_cause(run->job)
                                          : dk_job_root_cause(run->job)};
}

void dist_run_attempt_logs(dk_dist_run_t *run, bool error)
{
    if (!run->mlflow.tracked.active)
        return;
    make_stacks(run);
    char under[32];
    snprintf(under, sizeof under, "attempt-%d/", run->attempt);
    dk_dist_artifacts_t files = run_files(run, DK_END_FAILED);
    files.under = under;
    files.error = error;
    dk_dist_mlflow_attach(&run->mlflow, run->kernel, &files);
}

/* Every rank has exited: the last output, the records' final facts, MLflow's
 * status, and a word on output the frontend did not get. */
static void finish(dk_dist_run_t *run, dk_job_end_t end)
{
    dk_dist_output_finish(run->output);
    last_facts(run);
    bool error = false;
    if (end != DK_END_OK) {
        /* The error the cell is about to show, kept beside the logs, and
         * stacks.txt, made for it: both go with the logs to the MLflow run. */
        json_t *e = dk_dist_run_error(run, true);
        error = dist_run_keep_error(run, e);
        json_decref(e);
    }
    dk_dist_artifacts_t files = run_files(run, end);
    files.error = error;
    dk_dist_mlflow_end(&run->mlflow, run->kernel,
                       end == DK_END_OK       ? "FINISHED"
                       : end == DK_END_FAILED ? "FAILED"
                                              : "KILLED",
                       &files);
    dk_stream_t *stream = dk_kernel_stream(run->kernel);
    dk_stream_flush(stream);
    unsigned long long lines, bytes;
    dk_stream_thinned(stream, &lines, &bytes);
    if (lines > run->thinned_at_start) {
        char line[4400];
        snprintf(line, sizeof line,
                 "[distkernel] output thinned: %llu lines of this run were not shown "
                 "here; every rank's full output is in %s/rank-N.log\n",
                 lines - run->thinned_at_start, dk_job_log_dir(run->job));
        dist_run_write_err(run, line);
        dk_stream_flush(stream);
    }
    dk_stream_set_thin_hint(stream, NULL);
}

/* How the run ended: the job's, or on started ranks the round's. */
static dk_job_end_t run_end(dk_dist_run_t *run)
{
    return run->pool ? dk_job_round_end(run->job) : dk_job_end(run->job);
}

/* Wait for the attempt's ranks (or the round), honouring signals, ticking
 * the output, sampling silent ranks and refreshing the status. */
static void wait_job(dk_dist_run_t *run)
{
    long long last_status = dk_now_ms();
    for (;;) {
        bool done;
        Py_BEGIN_ALLOW_THREADS
        done = run->pool ? dk_job_round_wait(run->job, DK_DIST_WAIT_SLICE_MS)
                         : dk_job_wait(run->job, DK_DIST_WAIT_SLICE_MS);
        Py_END_ALLOW_THREADS
        if (done)
            break;
        honour_signals(run);
        dk_dist_output_tick(run->output);
        /* Silent past stall_after: where are the ranks? (dk_dist_stall.h) */
        if (run->stall && !run->interrupted && dk_dist_stall_due(run->stall, dk_now_ms()))
            dk_job_sample_stacks(run->job);
        if (run->stall && dk_dist_stall_changed(run->stall, dk_now_ms()))
            run->status_dirty = true;
        if (run->status_dirty || dk_now_ms() - last_status >= DK_DIST_STATUS_EVERY_MS) {
            dist_run_publish_status(run, run->interrupted ? "ending ranks" : NULL, false);
            last_status = dk_now_ms();
        }
    }
}

dk_job_end_t dk_dist_run_wait(dk_dist_run_t *run)
{
    char given_args[sizeof run->opts.slurm_args + 1] = "";
    for (;;) {
        wait_job(run);
        if (!dist_run_restartable(run, run_end(run)))
            break;
        dk_dist_stall_destroy(&run->stall);
        dk_dist_output_finish(run->output);
        last_facts(run);
        if (!dist_run_restart(run, given_args, sizeof given_args)) {
            dk_dist_output_finish(run->output);
            dk_dist_mlflow_end(&run->mlflow, run->kernel, "FAILED", NULL);
            dk_stream_set_thin_hint(dk_kernel_stream(run->kernel), NULL);
            dist_run_publish_status(run, "failed", true);
            return DK_END_FAILED;
        }
    }
    /* On started ranks the round is over but the ranks go on: what a rank's
     * background thread writes from now on belongs to no cell (it goes to the
     * rank's log), not after this cell's result. The rank drained its output
     * before answering, so the cell's own output is in the output already. */
    if (run->pool)
        dk_dist_pool_attach(run->pool, NULL);
    /* No sink calls it any more; the final status says no silence. */
    dk_dist_stall_destroy(&run->stall);
    dk_job_end_t end = run_end(run);
    finish(run, end);
    dist_run_publish_status(run,
                            end == DK_END_OK ? "finished"
                            : run->interrupted ? "interrupted"
                                               : "failed",
                            true);
    return end;
}

PyObject *dk_dist_run_results(dk_dist_run_t *run)
{
    PyObject *list = PyList_New(run->plan.world);
    for (int r = 0; list && r < run->plan.world; r++) {
        dk_dist_rank_t *ri = &run->ranks[r];
        PyObject *item = ri->message && !ri->is_error
                             ? PyBytes_FromStringAndSize(ri->message, (Py_ssize_t)ri->message_len)
                             : Py_NewRef(Py_None);
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        if (PyList_SetItem(list, r, item) < 0) {   /* steals item */
            Py_CLEAR(list);
            break;
        }
    }
    return list;
}

/* A traceback (a JSON array of strings) as a frontend shows it, its lines
 * joined by newlines, without the terminal's colours, into F. */
static int write_plain(FILE *f, void *data)
{
    size_t i;
    json_t *line;
    json_array_foreach((json_t *)data, i, line) {
        if (i > 0 && fputc('\n', f) == EOF)
            return -1;
        for (const char *s = json_string_value(line); s && *s;) {
            if (s[0] == '\033' && s[1] == '[') {
                /* A control sequence: ESC [, parameters, one final byte. */
                for (s += 2; *s && !(*s >= 0x40 && *s <= 0x7e); s++)
                    ;
                s += *s != '\0';
            } else if (fputc(*s++, f) == EOF) {
                return -1;
            }
        }
    }
    return fputc('\n', f) == EOF ? -1 : 0;
}

bool dist_run_keep_error(dk_dist_run_t *run, json_t *e)
{
    char path[4200], err[4400];
    snprintf(path, sizeof path, "%s/" DK_DIST_ERROR_FILE, dk_job_log_dir(run->job));
    if (!e || dk_logdir_write_file(path, write_plain, json_object_get(e, "traceback"), err,
                                   sizeof err) < 0) {
        dk_log("distributed: %s", e ? err : "out of memory making the run's error");
        return false;
    }
    return true;
}

json_t *dk_dist_run_error(dk_dist_run_t *run, bool headline)
{
    if (run->restart_error)
        return json_pack("{s:s, s:s, s:[]}", "ename", run->restart_ename, "evalue",
                         run->restart_error, "traceback");
    json_t *e = dist_run_error(run, headline);
    const char *evalue = json_string_value(json_object_get(e, "evalue"));
    if (e && evalue && run->opts.restarts > 0 && !run->pool) {
        /* Which attempt this was, and that none is left (or why none followed). */
        size_t n = strlen(evalue) + 160;
        char *text = malloc(n);
        if (text) {
            snprintf(text, n, "%s [attempt %d of %d%s]", evalue, run->attempt,
                     run->opts.restarts + 1,
                     run_end(run) != DK_END_FAILED ? "; a timeout or an interrupt is not "
                                                     "restarted"
                     : run->attempt > run->opts.restarts ? "; no restart left" : "");
            json_object_set_new(e, "evalue", json_string(text));
            free(text);
        }
    }
    return e;
}

json_t *dist_run_error(dk_dist_run_t *run, bool headline)
{
    make_stacks(run);
    dk_job_end_t end = run_end(run);
    bool gone = run->pool && dk_job_end(run->job) != DK_END_NONE;
    int root = end != DK_END_FAILED ? -1
               : run->pool && !gone ? dk_job_round_root_cause(run->job)
                                    : dk_job_root_cause(run->job);
    /* Ranks on other nodes: which went silent, and where they ran. */
    pthread_mutex_lock(&run->lock);
    for (int r = 0; r < run->plan.world; r++) {
        run->ranks[r].lost = dk_job_rank_lost(run->job, r);
        run->ranks[r].host = run->hosts ? run->hosts[r] : NULL;
    }
    pthread_mutex_unlock(&run->lock);
    dk_dist_outcome_t o = {.end = end, .root = root,
                           .kept = run->pool && !gone, .pool_gone = gone && !run->starting,
                           .interrupted = run->interrupted, .shutdown = run->shutdown,
                           .timeout_s = run->timeout_s, .timeout_cut = run->timeout_cut,
                           .log_dir = dk_job_log_dir(run->job),
                           .world = run->plan.world, .ranks = run->ranks,
                           .stacks = run->stacks,
                           .stacks_file = run->stacks_file[0] ? run->stacks_file : NULL};
    /* Above a few ranks the error groups them by fate; every rank's own line
     * goes to the log folder, which the error names (or not, if unwritable). */
    char path[4200], err[4300];
    if (o.world > DK_DIST_OUTCOME_EACH_RANK_MAX) {
        snprintf(path, sizeof path, "%s/%s", o.log_dir, DK_DIST_OUTCOME_FATES_FILE);
        if (dk_dist_outcome_write_fates(&o, path, err, sizeof err) == 0)
            o.ranks_file = path;
        else
            dk_log("distributed: %s", err);
    }
    return dk_dist_outcome_error(&o, headline);
}

bool dk_dist_run_pool_gone_before_cell(dk_dist_run_t *run)
{
    if (!run->pool || run->starting || run->interrupted || run->shutdown ||
        dk_job_end(run->job) != DK_END_FAILED)
        return false;
    int root = dk_job_root_cause(run->job);
    pthread_mutex_lock(&run->lock);
    bool early = root >= 0 && !run->ranks[root].got_cell;
    pthread_mutex_unlock(&run->lock);
    return early;
}
