/*
 * dk_job_launch: a job's start, everything before its runtime thread runs.
 *
 * dk_job_start does everything that can fail before any rank exists (the
 * spec's checks, the descriptors it needs, the log folder and files, the
 * back channel, the port, the environments), then forks each rank, or the
 * launcher (srun) of the node agents that start them (dk_job_agents.c),
 * from the calling thread, starts
 * the sentinel that ends the ranks' groups with the host, and hands the job
 * to the runtime thread (dk_job.c). A failure part-way ends what was started.
 */
#include "dk_job_state.h"
#include "dk_clock.h"
#include "dk_err.h"

#include "dk_fdlimit.h"
#include "dk_logdir.h"
#include "dk_rankenv.h"
#include "dk_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>

extern char **environ;

#define DEFAULT_GRACE_S 2.0
#define WORLD_MAX 65536

/* ------------------------------------------------------------------------ */
/* Start                                                                     */

#define LOG_DIR_HINT "set DISTKERNEL_LOG_DIR to a directory that is yours alone"

/* The job's log directory, checked, held and kept open (logs can hold anything
 * a cell prints: it must be the user's alone). */
static bool open_log_dir(dk_job_t *job, char *err, size_t errlen)
{
    job->log_dirfd = dk_logdir_open(job->log_dir, DK_LOGDIR_CREATE, LOG_DIR_HINT, err, errlen);
    if (job->log_dirfd < 0)
        return false;
    if (dk_logdir_hold(job->log_dirfd) != 0) {
        dk_set_err(err, errlen, "the log directory %s is in use by another job (%s)", job->log_dir,
                   strerror(errno));
        return false;
    }
    return true;
}

/* No log_dir given: a fresh ROOT/kernel-PID/run-RANDOM under the default root. */
static char *fresh_log_dir(char *err, size_t errlen)
{
    char *root = dk_logdir_default_root(err, errlen);
    if (!root)
        return NULL;
    unsigned char id[8];
    char *dir = NULL;
    if (RAND_bytes(id, sizeof id) == 1 &&
        asprintf(&dir, "%s/kernel-%d/run-%02x%02x%02x%02x%02x%02x%02x%02x", root, (int) getpid(),
                 id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]) < 0)
        dir = NULL;
    if (!dir)
        dk_set_err(err, errlen, "out of memory or no random bytes for a log directory name");
    free(root);
    return dir;
}

static bool check_spec(const dk_job_spec_t *spec, char *err, size_t errlen)
{
    if (!spec)
        dk_set_err(err, errlen, "no job description was given");
    else if (spec->world_size < 1 || spec->world_size > WORLD_MAX)
        dk_set_err(err, errlen, "world_size is %d; it must be between 1 and %d",
                   spec->world_size, WORLD_MAX);
    else if (!spec->rank_exe || !*spec->rank_exe)
        dk_set_err(err, errlen, "no rank executable was given");
    else if (!spec->persistent && spec->payload_len > 0 && !spec->payload)
        dk_set_err(err, errlen, "payload_len is %zu but payload is NULL", spec->payload_len);
    else if (spec->bc_tcp_addr && spec->heartbeat_s > 0 &&
             spec->heartbeat_s < 2 * DK_BC_PING_S)
        /* One late PING must not make a rank lost. */
        dk_set_err(err, errlen, "heartbeat_s is %g; it must be at least %g (a PING goes every "
                   "%g s) or 0 for the default of %g", spec->heartbeat_s, 2 * DK_BC_PING_S,
                   DK_BC_PING_S, DK_BC_HEARTBEAT_DEFAULT_S);
    else if (spec->ranks_per_node < 0 ||
             (spec->ranks_per_node > 0 && spec->world_size % spec->ranks_per_node != 0))
        dk_set_err(err, errlen, "ranks_per_node is %d; it must divide world_size (%d)",
                   spec->ranks_per_node, spec->world_size);
    else if (spec->master_addr && (!*spec->master_addr || strlen(spec->master_addr) > 100))
        dk_set_err(err, errlen, "master_addr must be a host name or address of 1 to 100 "
                   "characters");
    else if ((spec->master_port < 0 && spec->master_port != DK_JOB_PORT_FROM_RANK0) ||
             spec->master_port > 65535 ||
             (spec->master_port == DK_JOB_PORT_FROM_RANK0 && !spec->bc_tcp_addr))
        dk_set_err(err, errlen, "master_port is %d; it must be a TCP port (1-65535), 0, or "
                   "DK_JOB_PORT_FROM_RANK0 with bc_tcp_addr", spec->master_port);
    else if (spec->payload_len > DK_FRAME_PAYLOAD_MAX)
        dk_set_err(err, errlen, "the payload is %zu bytes; a job can carry at most 1 GiB to its "
                   "ranks (pass large data through files instead)", spec->payload_len);
    else
        return true;
    return false;
}

void job_free(dk_job_t *job)
{
    for (int r = 0; job->ranks && r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        job_close_fd(&rk->pidfd);
        job_close_fd(&rk->pipe_fd[0]);
        job_close_fd(&rk->pipe_fd[1]);
        dk_logfile_close(&rk->log);
        free(rk->log_path);
        free(rk->host);
    }
    dk_spawn_sentinel_end(&job->sentinel_pid, &job->sentinel_fd);
    job_agents_free(job);
    dk_stackreq_destroy(&job->stacks);
    free(job->master_addr);
    dk_backchan_destroy(&job->chan);
    job_close_fd(&job->wake[0]);
    job_close_fd(&job->wake[1]);
    pthread_mutex_destroy(&job->lock);
    pthread_mutex_destroy(&job->log_lock);
    pthread_cond_destroy(&job->cond);
    free(job->submit_payload);
    free(job->ranks);
    free(job->fds);
    free(job->slot_rank);
    free(job->slot_kind);
    job_close_fd(&job->log_dirfd);
    free(job->log_dir);
    free(job->warm_socket);
    free(job);
}

/* Start failed after some ranks were forked: end them, leave nothing behind. */
static void kill_started(dk_job_t *job)
{
    if (job->agents_pid > 0 && !job->agents_reaped) {
        killpg(job->agents_pid, SIGKILL);
        waitpid(job->agents_pid, NULL, 0);
        job->agents_reaped = true;
    }
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->pid > 0 && !rk->reaped) {
            killpg(rk->pid, SIGKILL);
            waitpid(rk->pid, NULL, 0);
            rk->reaped = true;
        }
    }
}

static bool open_logs(dk_job_t *job, char *err, size_t errlen)
{
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        size_t len = strlen(job->log_dir) + 32;
        if (!(rk->log_path = malloc(len))) {
            dk_set_err(err, errlen, "out of memory");
            return false;
        }
        snprintf(rk->log_path, len, "%s/rank-%d.log", job->log_dir, r);
        /* A file left by an earlier job of this directory is ours (the folder is
         * ours alone): start afresh, and never through a link. */
        const char *name = rk->log_path + strlen(job->log_dir) + 1;
        unlinkat(job->log_dirfd, name, 0);
        char why[512];
        if (!(rk->log = dk_logfile_new(job->log_dirfd, name, job->log_cap, why, sizeof why))) {
            dk_set_err(err, errlen, "cannot create rank %d's log file %s: %s", r, rk->log_path, why);
            return false;
        }
    }
    return true;
}

/* Fork rank R with the torch.distributed (torchrun-compatible) environment
 * (dk_rankenv.h). */
static bool start_rank(dk_job_t *job, int r, const char *program, char *const argv[],
                       const char *const *base, const char *run_id, char *err, size_t errlen)
{
    rank_t *rk = &job->ranks[r];
    dk_rankenv_t in = {
        .rank = r, .world_size = job->world_size, .ranks_per_node = job->ranks_per_node,
        .master_addr = job->master_addr, .master_port = job->master_port, .run_id = run_id,
        .bc_address = dk_backchan_address(job->chan),
        .bc_key_hex = dk_backchan_key_hex(job->chan),
        .log_path = rk->log_path,
        /* Where it answers for its stacks (dk_stackreq.h). */
        .stacks_path = job->stacks ? dk_stackreq_path(job->stacks, r) : NULL,
        .warm_socket = job->warm_socket,
    };
    char **env = dk_rankenv_build(base, &in);
    if (!env) {
        dk_set_err(err, errlen, "out of memory building rank %d's environment", r);
        return false;
    }

    dk_spawned_t sp;
    char why[512];
    /* A session of its own (dk_spawn.h), for the scheduler's share. A rank
     * forked by a warm-start template leads one too (_template.py, _become_rank);
     * this process, its requester, passes the job's stops on to it. */
    dk_spawn_opts_t opts = DK_SPAWN_OPTS_INIT;
    opts.session = true;
    int rc = dk_spawn_with(program, argv, env, &opts, &sp, why, sizeof why);
    dk_spawn_env_free(env);
    if (rc != 0) {
        dk_set_err(err, errlen, "cannot start rank %d: %s", r, why);
        return false;
    }
    rk->pid = sp.pid;
    rk->pidfd = sp.pidfd;
    rk->pipe_fd[0] = sp.out_fd;
    rk->pipe_fd[1] = sp.err_fd;
    job->unreaped++;
    return true;
}

/* The sentinel for every rank's process group (each rank leads its own). */
static bool start_sentinel(dk_job_t *job, char *err, size_t errlen)
{
    int *pgids = calloc((size_t) job->world_size + 1, sizeof *pgids);
    if (!pgids) {
        dk_set_err(err, errlen, "out of memory");
        return false;
    }
    int n = 0;
    for (int r = 0; r < job->world_size; r++)
        if (job->ranks[r].pid > 0)      /* not a rank its node's agent started */
            pgids[n++] = job->ranks[r].pid;
    if (job->agents_pid > 0)
        pgids[n++] = job->agents_pid;
    char why[256];
    int rc = dk_spawn_sentinel(pgids, n, &job->sentinel_pid, &job->sentinel_fd, why, sizeof why);
    free(pgids);
    if (rc != 0)
        dk_set_err(err, errlen, "cannot start the process that ends the ranks' children with "
                   "the kernel: %s", why);
    return rc == 0;
}

static bool start_thread(dk_job_t *job, char *err, size_t errlen)
{
    /* The runtime thread takes no signals: the host's SIGINT belongs to its main
     * thread (Python's handler expects it there). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&job->thread, NULL, job_thread, job);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        dk_set_err(err, errlen, "cannot start the runtime thread: %s", strerror(rc));
        return false;
    }
    return true;
}

static dk_job_t *job_alloc(const dk_job_spec_t *spec, const dk_sink_t *sink)
{
    dk_job_t *job = calloc(1, sizeof *job);
    if (!job)
        return NULL;
    job->wake[0] = job->wake[1] = job->log_dirfd = -1;
    job->agents_pid = job->agents_pidfd = job->agents_pipe[0] = job->agents_pipe[1] = -1;
    job->sentinel_pid = job->sentinel_fd = -1;
    job->log_cap = spec->log_cap;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&job->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&job->lock, NULL);
    pthread_mutex_init(&job->log_lock, NULL);
    job->persistent = spec->persistent;
    job->idle_timeout_s = spec->idle_timeout_s;
    job->round_root = -1;
    job->round_deadline = -1;
    /* Round 0 of a persistent job is its start: every rank says HELLO. */
    job->round_active = spec->persistent;
    job->round_pending = spec->world_size;
    if (sink)
        job->sink = *sink;
    job->world_size = spec->world_size;
    job->ranks_per_node = spec->ranks_per_node > 0 ? spec->ranks_per_node : spec->world_size;
    if (spec->master_addr && !(job->master_addr = strdup(spec->master_addr))) {
        job_free(job);
        return NULL;
    }
    job->timeout_s = spec->timeout_s;
    job->stop = dk_stop_ladder(spec->grace_s > 0 ? spec->grace_s : DEFAULT_GRACE_S);
    job->root_cause = -1;
    job->failure_pending = -1;
    job->ranks = calloc((size_t) spec->world_size, sizeof *job->ranks);
    if (!job->ranks) {
        job_free(job);
        return NULL;
    }
    if (spec->bc_tcp_addr)
        job->heartbeat_s = spec->heartbeat_s > 0 ? spec->heartbeat_s : DK_BC_HEARTBEAT_DEFAULT_S;
    job->connect_timeout_s = spec->connect_timeout_s > 0 ? spec->connect_timeout_s
                                                         : DK_JOB_CONNECT_DEFAULT_S;
    for (int r = 0; r < spec->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        rk->pid = -1;
        rk->pidfd = rk->pipe_fd[0] = rk->pipe_fd[1] = -1;
        rk->exit_code = -1;
    }
    for (int r = 0; r < spec->world_size; r++) {
        const char *host = spec->rank_hosts && spec->rank_hosts[r] ? spec->rank_hosts[r]
                                                                   : "localhost";
        if (!(job->ranks[r].host = strdup(host))) {
            job_free(job);
            return NULL;
        }
    }
    return job;
}

dk_job_t *dk_job_start(const dk_job_spec_t *spec, const dk_sink_t *sink, char *err,
                       size_t errlen)
{
    char scratch[1];
    if (!err || errlen == 0) {
        err = scratch;
        errlen = sizeof scratch;
    }
    if (!check_spec(spec, err, errlen) || !dk_fdlimit_job_check(spec->world_size, err, errlen))
        return NULL;
    dk_job_t *job = job_alloc(spec, sink);
    if (!job) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    char *program = dk_spawn_find_program(spec->rank_exe, err, errlen);
    if (!program)
        goto fail;
    if (spec->warm_socket && !(job->warm_socket = strdup(spec->warm_socket))) {
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }

    if (spec->log_dir ? !(job->log_dir = strdup(spec->log_dir))
                      : !(job->log_dir = fresh_log_dir(err, errlen))) {
        if (spec->log_dir)
            dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (!open_log_dir(job, err, errlen))
        goto fail;
    dk_backchan_sink_t bcsink = job_backchan_sink(job);
    dk_backchan_opts_t opts = {spec->bc_tcp_addr, spec->bc_tcp_port, 0,
                               spec->master_port == DK_JOB_PORT_FROM_RANK0,
                               spec->bc_allow_hosts, spec->bc_nallow,
                               spec->agent_command ? spec->world_size / job->ranks_per_node : 0,
                               job->ranks_per_node};
    if (spec->bc_tcp_addr)
        opts.heartbeat_s = spec->heartbeat_s > 0 ? spec->heartbeat_s : DK_BC_HEARTBEAT_DEFAULT_S;
    job->chan = dk_backchan_new_opts(spec->world_size, spec->persistent, spec->payload,
                                     spec->payload_len, &bcsink, &opts, err, errlen);
    if (!job->chan)
        goto fail;
    if (spec->master_port > 0 || spec->master_port == DK_JOB_PORT_FROM_RANK0)
        job->master_port = spec->master_port > 0 ? spec->master_port : 0;
    else if ((job->master_port = dk_spawn_free_port(err, errlen)) < 0)
        goto fail;
    unsigned char id[16];
    char run_id[2 * sizeof id + 1];
    if (RAND_bytes(id, sizeof id) != 1) {
        dk_set_err(err, errlen, "OpenSSL cannot provide random bytes for TORCHELASTIC_RUN_ID");
        goto fail;
    }
    for (size_t i = 0; i < sizeof id; i++)
        snprintf(run_id + 2 * i, 3, "%02x", id[i]);
    if (pipe2(job->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        dk_set_err(err, errlen, "cannot create the runtime's wake pipe: %s", strerror(errno));
        goto fail;
    }
    job->max_fds = 1 + dk_backchan_max_fds(job->chan) + 3 * (size_t) spec->world_size + 3;
    job->fds = calloc(job->max_fds, sizeof *job->fds);
    job->slot_rank = calloc(3 * (size_t) spec->world_size + 3, sizeof *job->slot_rank);
    job->slot_kind = calloc(3 * (size_t) spec->world_size + 3, sizeof *job->slot_kind);
    if (!job->fds || !job->slot_rank || !job->slot_kind) {
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (!open_logs(job, err, errlen))
        goto fail;
    /* A folder that cannot be made costs the stacks only. */
    if (spec->stacks) {
        char why[512];
        if (!(job->stacks = dk_stackreq_new(spec->world_size, why, sizeof why)))
            job_warn(job, "the ranks' stacks will not be shown if the run hangs: %s", why);
        job->stacks_wait_s = spec->stacks_wait_s;
    }

    char *default_argv[2] = {program, NULL};
    char *const *argv = spec->rank_argv ? (char *const *) spec->rank_argv : default_argv;
    const char *const *base = spec->env ? spec->env : (const char *const *) environ;
    job->started_at = dk_now_s();
    if (spec->agent_command && !job_start_agents(job, spec, base, run_id, err, errlen))
        goto fail;
    for (int r = 0; !spec->agent_command && r < spec->world_size; r++)
        if (!start_rank(job, r, program, argv, base, run_id, err, errlen))
            goto fail;
    /* What a rank starts (a subprocess, a DataLoader's workers) ends with the
     * host too, even when it is SIGKILLed: the ranks die of PR_SET_PDEATHSIG,
     * their children would not. */
    if (!start_sentinel(job, err, errlen))
        goto fail;
    if (!start_thread(job, err, errlen))
        goto fail;
    free(program);
    return job;

fail:
    kill_started(job);
    free(program);
    job_free(job);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* A persistent job's next round's logs                                      */

int dk_job_set_log_dir(dk_job_t *job, const char *log_dir, char *err, size_t errlen)
{
    /* Everything that can fail happens on the side, before the swap. */
    dk_job_t fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.world_size = job->world_size;
    fresh.log_cap = job->log_cap;
    fresh.log_dirfd = -1;
    rank_t *ranks = calloc((size_t) job->world_size, sizeof *ranks);
    fresh.ranks = ranks;
    fresh.log_dir = strdup(log_dir);
    bool ok = ranks && fresh.log_dir;
    if (!ok)
        dk_set_err(err, errlen, "out of memory");
    ok = ok && open_log_dir(&fresh, err, errlen) && open_logs(&fresh, err, errlen);
    if (ok) {
        pthread_mutex_lock(&job->log_lock);
        for (int r = 0; r < job->world_size; r++) {
            rank_t *rk = &job->ranks[r];
            dk_logfile_t *old = rk->log;
            char *old_path = rk->log_path;
            rk->log = ranks[r].log;
            rk->log_path = ranks[r].log_path;
            ranks[r].log = old;
            ranks[r].log_path = old_path;
            pthread_mutex_lock(&job->lock);
            rk->log_failed = rk->log_capped = false;
            pthread_mutex_unlock(&job->lock);
        }
        char *old_dir = job->log_dir;
        int old_fd = job->log_dirfd;
        job->log_dir = fresh.log_dir;
        job->log_dirfd = fresh.log_dirfd;
        fresh.log_dir = old_dir;
        fresh.log_dirfd = old_fd;
        pthread_mutex_unlock(&job->log_lock);
    }
    /* FRESH now holds what is no longer used: the old logs, or the new ones
     * that could not all be made. */
    for (int r = 0; ranks && r < job->world_size; r++) {
        dk_logfile_close(&ranks[r].log);
        free(ranks[r].log_path);
    }
    free(ranks);
    job_close_fd(&fresh.log_dirfd);
    free(fresh.log_dir);
    return ok ? 0 : -1;
}
