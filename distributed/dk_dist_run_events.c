/*
 * dk_dist_run_events: a run's job events, and what the cell shows of them.
 *
 * Part of dk_dist_run (dk_dist_run_state.h says which file holds what). The
 * sink runs on the runtime thread: output goes to dk_dist_output, which has a lock
 * of its own (it may wait on a slow frontend, and the status display must not
 * wait with it); states and messages go to the ranks' records under the run's
 * lock, and mark the status display dirty for the main thread, which
 * publishes it between slices of its wait.
 *
 * Displays are offered behind the stream text before them: a frontend that is
 * behind skips the updates in between, never the first and last states.
 */
#include "dk_dist_run_state.h"
#include "dk_clock.h"
#include "dk_dist_status.h"
#include "dk_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dist_run_write_err(dk_dist_run_t *run, const char *text)
{
    dk_stream_write(dk_kernel_stream(run->kernel), DK_STDERR, text, strlen(text));
}

/* ---- displays ----------------------------------------------------------------- */

/* Publish TEXT as display DISPLAY_ID: FORCE queues it behind a frontend that is
 * behind (the first and last states of a display must arrive); otherwise it is
 * offered after the stream text before it, and false means IOPub was full and
 * nothing was sent. */
static bool publish_display(dk_kernel_t *kernel, const char *display_id, bool update,
                            const char *text, bool force)
{
    const char *msg_type = update ? "update_display_data" : "display_data";
    json_t *content = json_pack("{s:{s:s}, s:{}, s:{s:s}}", "data", "text/plain", text,
                                "metadata", "transient", "display_id", display_id);
    if (!content)
        return false;
    dk_stream_t *stream = dk_kernel_stream(kernel);
    dk_iopub_t *iopub = dk_kernel_iopub(kernel);
    bool sent = true;
    if (force) {
        dk_stream_flush(stream);
        dk_iopub_publish(iopub, msg_type, content, NULL);
    } else if (!dk_stream_offer(stream)) {
        sent = false;
    } else {
        char *dumped = json_dumps(content, JSON_COMPACT);
        sent = (dumped ? dk_iopub_offer_text(iopub, msg_type, dumped) : -1) != DK_IOPUB_FULL;
        free(dumped);
    }
    json_decref(content);
    return sent;
}

static void output_append(void *data, int fd, const char *text, size_t len)
{
    dk_dist_run_t *run = data;
    dk_stream_append(dk_kernel_stream(run->kernel), fd == 2 ? DK_STDERR : DK_STDOUT, text, len);
}

static bool output_display(void *data, const char *display_id, bool update, const char *text,
                          bool force)
{
    dk_dist_run_t *run = data;
    return publish_display(run->kernel, display_id, update, text, force);
}

dk_dist_output_io_t dist_run_output_io(dk_dist_run_t *run)
{
    return (dk_dist_output_io_t){.data = run, .append = output_append, .display = output_display};
}

static char *stall_where(void *data, size_t max_lines)
{
    return dk_dist_stall_lines(data, dk_now_ms(), max_lines);
}

void dist_run_publish_status(dk_dist_run_t *run, const char *headline, bool force)
{
    dk_dist_status_t st = {.what = run->plan.what,
                           .elapsed_s = (double)(dk_now_ms() - run->t0_ms) / 1000.0,
                           .headline = headline, .world = run->plan.world, .ranks = run->ranks,
                           .attempt = run->attempt,
                           .attempts = run->pool ? 0 : run->opts.restarts + 1,
                           .gpu = run->plan.gpu,
                           .log_dir = run->job ? dk_job_log_dir(run->job) : run->log_dir,
                           .hosts = run->hosts, .gpu_memory = dk_gpu_process_memory,
                           .t0_ms = run->t0_ms, .output = run->opts.output,
                           .shown = run->shown, .where = run->stall ? stall_where : NULL,
                           .where_data = run->stall};
    /* Ranks on other nodes gone silent: the status names their nodes. Only
     * this thread writes LOST, so it needs not the run's lock. */
    for (int r = 0; run->job && run->hosts && r < run->plan.world; r++)
        run->ranks[r].lost = dk_job_rank_lost(run->job, r);
    pthread_mutex_lock(&run->lock);
    char *text = dk_dist_status_text(&st);
    run->status_dirty = false;
    pthread_mutex_unlock(&run->lock);
    if (!text)
        return;
    char display_id[64];
    snprintf(display_id, sizeof display_id, "distkernel-%s-status", run->run_id);
    if (publish_display(run->kernel, display_id, run->status_shown, text,
                        force || !run->status_shown))
        run->status_shown = true;
    else
        run->status_dirty = true;
    free(text);
}

/* ---- the sink: runs on the runtime thread ------------------------------------- */

static void sink_output(void *data, int rank, int fd, const char *bytes, size_t len)
{
    dk_dist_run_t *run = data;
    if (run->stall)
        dk_dist_stall_output(run->stall, dk_now_ms());
    dk_dist_output_write(run->output, rank, fd, bytes, len);
}

static void sink_stacks(void *data, int world, const char *const *dumps, const size_t *lens)
{
    dk_dist_run_t *run = data;
    if (run->stall)
        dk_dist_stall_sampled(run->stall, world, dumps, lens);
}

static void sink_caught_up(void *data, int rank, int fd)
{
    dk_dist_run_t *run = data;
    dk_dist_output_caught_up(run->output, rank, fd);
}

static void sink_state(void *data, int rank, dk_rank_state_t state, int exit_code, int term_signal)
{
    dk_dist_run_t *run = data;
    pthread_mutex_lock(&run->lock);
    run->ranks[rank].state = state;
    if (state == DK_RANK_RUNNING && !run->ranks[rank].got_cell)
        run->ranks[rank].running_ms = dk_now_ms();
    if (state == DK_RANK_RUNNING)
        run->ranks[rank].got_cell = true;
    run->ranks[rank].exit_code = exit_code;
    run->ranks[rank].term_signal = term_signal;
    run->status_dirty = true;
    pthread_mutex_unlock(&run->lock);
}

static void sink_message(void *data, int rank, bool is_error, const void *bytes, size_t len)
{
    dk_dist_run_t *run = data;
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return;
    memcpy(copy, bytes, len);
    pthread_mutex_lock(&run->lock);
    free(run->ranks[rank].message);
    run->ranks[rank].message = copy;
    run->ranks[rank].message_len = len;
    run->ranks[rank].is_error = is_error;
    pthread_mutex_unlock(&run->lock);
}

static void sink_warning(void *data, const char *text)
{
    dk_dist_run_t *run = data;
    char line[1024];
    int n = snprintf(line, sizeof line, "[distkernel] %s\n", text);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    dk_stream_write(dk_kernel_stream(run->kernel), DK_STDERR, line, (size_t)n);
}

dk_sink_t dist_run_sink(dk_dist_run_t *run)
{
    return (dk_sink_t){.data = run, .on_output = sink_output, .on_caught_up = sink_caught_up,
                       .on_state = sink_state, .on_message = sink_message,
                       .on_warning = sink_warning, .on_stacks = sink_stacks};
}
