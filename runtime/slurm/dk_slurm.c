/*
 * dk_slurm: one allocation, through Slurm's commands. See dk_slurm.h.
 *
 * Waiting for an allocation. `salloc --no-shell` blocks until Slurm grants the
 * job, then exits; while it waits it has already said the job's id on stderr.
 * So salloc runs under dk_proc with two callbacks: its stderr is collected
 * (the id is read from it), and the cancel callback, asked every 100 ms, is
 * where the wait is watched: the caller's cancel, the wait limit, and once a
 * second squeue for the state and Slurm's reason to report. A stop sends
 * salloc SIGINT first, on which it revokes its own request; scancel follows
 * anyway, since a salloc killed harder would leave the request queued.
 *
 * Never a job left behind. Each request is named distkernel-<random>, so a
 * failure before the id is known (salloc hung, killed, or died saying
 * nothing) still cancels it: `scancel --name`. Every later failure cancels by
 * id. The only job this code does not cancel is one it did not ask for (the
 * allocation it runs inside). And a process killed outright (a kernel's
 * SIGKILL) cancels too: before salloc runs, a last word (dk_spawn_last_word)
 * is armed with `scancel --name=distkernel-<random>`, replaced by `scancel
 * ID` as soon as salloc says the id; release disarms it. The name cannot be
 * changed from slurm_args (dk_slurm_check_args refuses -J).
 *
 * Bounded time. Every command has a deadline (command_timeout_s) enforced by
 * the same cancel callback; past it, the stop ladder with a short grace ends
 * it (a hung Slurm client ignores SIGINT, rarely SIGTERM, never SIGKILL). A
 * question before a run (sinfo: dk_slurm_query_t) is ended the same way by
 * its caller's cancel, so that an interrupt does not wait out the deadline.
 *
 * The questions asked before a run (sinfo: is Slurm reachable, how many GPUs
 * and CPUs a node has) are in dk_slurm_query.c, through the same slurm_run
 * (dk_slurm_command.h).
 */
#include "dk_slurm.h"
#include "dk_slurm_command.h"

#include "dk_clock.h"
#include "dk_err.h"
#include "dk_proc.h"
#include "dk_random.h"
#include "dk_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* How long a SIGKILLed kernel's job outlives it (last_word_by_id). */
#define LAST_WORD_GRACE_S 3
#define DK_STR_(x) #x
#define DK_STR(x) DK_STR_(x)
#define OUT_MAX (1 << 20)
#define POLL_EVERY_S 1.0        /* squeue while a request waits */
#define GRACE_S 0.5             /* between the rungs of a command's stop ladder */

struct dk_slurm_t {
    char job_id[32];
    char job_name[64];
    bool owned;
    bool released;
    double timeout_s;
    char time_limit[64];        /* --time as asked, or "" */
    char **names;
    char **addrs;
    size_t count;
    /* For an owned job: `scancel --name` run if this process dies before
     * releasing it (dk_spawn_last_word), so a SIGKILLed kernel leaves no job
     * in the queue nor an allocation held. -1 when none. */
    int last_word_pid, last_word_fd;
    bool last_word_by_id;       /* `scancel ID` once the id is known */
};

/* ---- running one command ------------------------------------------------- */


/* A command's stderr, its latest SAY_MAX bytes: a message quotes how it
 * ended, and a long banner first (a site's job_submit plugin) must not push
 * salloc's "Pending job allocation N" out. Before old text goes, the job's
 * id is taken from it, in case the id came with the banner's tail. */
static void on_stderr(void *data, const char *bytes, size_t len)
{
    command_t *c = data;
    while (len) {
        size_t room = sizeof c->said - 1 - c->said_len;
        if (room == 0) {
            if (c->job && !c->job->job_id[0])
                dk_slurm_salloc_job_id(c->said, c->job->job_id, sizeof c->job->job_id);
            size_t drop = c->said_len / 2;
            memmove(c->said, c->said + drop, c->said_len - drop);
            c->said_len -= drop;
            continue;
        }
        size_t n = len < room ? len : room;
        memcpy(c->said + c->said_len, bytes, n);
        c->said_len += n;
        c->said[c->said_len] = '\0';
        bytes += n;
        len -= n;
    }
}

static void watch_wait(command_t *c);
static void note_state(command_t *c, const dk_slurm_squeue_t *q);

/* Once the job's id is known, the last word cancels by it: an id names this
 * job alone, whatever its name turned out to be (a job_submit plugin may
 * rename it). The last word by name is ended only once the new one is
 * armed; if it cannot be, the old one stays. */
static void last_word_by_id(dk_slurm_t *self)
{
    if (self->last_word_by_id || !self->job_id[0])
        return;
    /* Not at once: the node agents see the killed kernel's connection close
     * when this does, and end their ranks with the stop ladder and remove
     * their node's folders first; a cancelled job has slurmstepd SIGKILL
     * its steps within a second (measured on the test cluster), which would
     * take the agents' folder watchers with them. LAST_WORD_GRACE_S later
     * the job goes, whatever is left in it. */
    char *scancel[] = {"/bin/sh", "-c", "sleep " DK_STR(LAST_WORD_GRACE_S) "; exec scancel \"$1\"",
                       "distkernel-last-word", self->job_id, NULL};
    int pid = -1, fd = -1;
    if (dk_spawn_last_word(scancel, &pid, &fd, NULL, 0) < 0)
        return;
    dk_spawn_sentinel_end(&self->last_word_pid, &self->last_word_fd);
    self->last_word_pid = pid;
    self->last_word_fd = fd;
    self->last_word_by_id = true;
}

static bool should_stop(void *data)
{
    command_t *c = data;
    if (c->req)
        watch_wait(c);
    else if (!c->stop && c->query && c->query->cancelled && c->query->cancelled(c->query->data))
        c->stop = 1;
    if (c->stop)
        return true;
    if (dk_now_s() >= c->deadline)
        c->timed_out = true;
    return c->timed_out;
}

/* The stderr a message quotes: its last line that says something, trimmed. */
const char *slurm_said_text(command_t *c)
{
    size_t n = c->said_len;
    while (n && (c->said[n - 1] == '\n' || c->said[n - 1] == ' '))
        c->said[--n] = '\0';
    return n ? c->said : "(nothing on stderr)";
}

/* Run Slurm's PROGRAM with ARGS (NULL-terminated, argv[0] excluded) to its end,
 * within TIMEOUT_S (0: none; C->deadline is set here). Its stdout into *OUT when
 * OUT is not NULL. Returns its exit code (>= 0), or -1 with ERR when it could
 * not run, was ended by a signal, or passed its deadline. */
int slurm_run(const char *program, const char *const *args, double timeout_s, command_t *c,
              char **out, char *err, size_t errlen)
{
    char *path = dk_spawn_find_program(program, err, errlen);
    if (!path)
        return -1;
    size_t n = 0;
    while (args[n])
        n++;
    char **argv = calloc(n + 2, sizeof *argv);
    if (!argv) {
        free(path);
        dk_set_err(err, errlen, "out of memory running %s", program);
        return -1;
    }
    argv[0] = (char *) program;
    memcpy(argv + 1, args, n * sizeof *argv);
    c->deadline = timeout_s > 0 ? dk_now_s() + timeout_s : 1e300;
    dk_proc_spec_t spec = {.path = path, .argv = argv, .envp = environ, .max_out = OUT_MAX,
                           .grace_s = GRACE_S, .on_stderr = on_stderr,
                           .cancelled = should_stop, .data = c};
    dk_proc_result_t res;
    int rc = dk_proc_run(&spec, &res, err, errlen);
    free(argv);
    free(path);
    if (rc < 0)
        return -1;
    if (c->timed_out) {
        dk_set_err(err, errlen, "Slurm's %s did not answer within %.0f s and was ended; is "
                   "slurmctld up and reachable from here? (it said: %s)", program, timeout_s,
                   slurm_said_text(c));
        rc = -1;
    } else if (c->stop && !c->req) {
        /* A question cancelled (a salloc's stop is its caller's to tell). */
        dk_set_err(err, errlen, "Slurm's %s was cancelled before it answered", program);
        rc = -1;
    } else if (res.exit_code < 0 && !c->stop) {
        dk_set_err(err, errlen, "Slurm's %s was killed by signal %d (it said: %s)", program,
                   res.term_signal, slurm_said_text(c));
        rc = -1;
    } else {
        rc = res.exit_code < 0 ? 128 + res.term_signal : res.exit_code;
    }
    if (rc >= 0 && out) {
        *out = res.out;
        res.out = NULL;
    }
    dk_proc_result_free(&res);
    return rc;
}

/* ---- the allocation -------------------------------------------------------- */

static dk_slurm_t *job_new(double timeout_s)
{
    dk_slurm_t *self = calloc(1, sizeof *self);
    if (self) {
        self->timeout_s = timeout_s > 0 ? timeout_s : DK_SLURM_COMMAND_TIMEOUT_S;
        self->last_word_pid = self->last_word_fd = -1;
    }
    return self;
}

static void free_nodes(dk_slurm_t *self)
{
    dk_slurm_names_free(self->names, self->count);
    dk_slurm_names_free(self->addrs, self->count);
    self->names = self->addrs = NULL;
    self->count = 0;
}

/* `scancel` the job by id, or by name when the id is not known yet. */
static int cancel_job(dk_slurm_t *self, char *err, size_t errlen)
{
    command_t c = {0};
    char name_arg[96];
    const char *by_id[] = {self->job_id, NULL};
    const char *by_name[] = {name_arg, NULL};
    snprintf(name_arg, sizeof name_arg, "--name=%s", self->job_name);
    if (!self->job_id[0] && !self->job_name[0])
        return 0;
    int rc = slurm_run("scancel", self->job_id[0] ? by_id : by_name, self->timeout_s, &c, NULL, err,
                 errlen);
    /* a job that already ended is released */
    if (rc > 0 && !strstr(c.said, "Invalid job id") && !strstr(c.said, "already complet")) {
        dk_set_err(err, errlen, "scancel %s failed: %s", self->job_id[0] ? self->job_id : name_arg,
                   slurm_said_text(&c));
        return -1;
    }
    return rc < 0 ? -1 : 0;
}

/* squeue's one line about the job into Q. Returns 1, 0 when Slurm no longer
 * knows the job, or -1 with ERR. */
/* `squeue -h -j JOB -o FORMAT` into *OUT (free it): 1, 0 when Slurm has
 * forgotten the job (*OUT NULL), -1 with ERR. */
static int squeue_own(dk_slurm_t *self, const char *format, char **out, char *err,
                      size_t errlen)
{
    command_t c = {0};
    const char *args[] = {"-h", "-j", self->job_id, "-o", format, NULL};
    *out = NULL;
    int rc = slurm_run("squeue", args, self->timeout_s, &c, out, err, errlen);
    if (rc < 0)
        return -1;
    if (rc > 0) {
        free(*out);
        *out = NULL;
        if (strstr(c.said, "Invalid job id"))
            return 0;
        dk_set_err(err, errlen, "squeue -j %s failed: %s", self->job_id, slurm_said_text(&c));
        return -1;
    }
    return 1;
}

static int squeue_job(dk_slurm_t *self, dk_slurm_squeue_t *q, char *err, size_t errlen)
{
    char *out = NULL;
    int rc = squeue_own(self, "%i|%T|%r|%N", &out, err, errlen);
    if (rc <= 0)
        return rc;
    int found = out[0] ? 1 : 0;
    if (found && dk_slurm_parse_squeue(out, q) < 0) {
        dk_set_err(err, errlen, "squeue -j %s answered '%.200s', not a job's line",
                   self->job_id, out);
        found = -1;
    }
    free(out);
    return found;
}

/* Called from the salloc run's cancel callback: the caller's cancel, the wait
 * limit, and the state and reason while the request is queued. */
static void watch_wait(command_t *c)
{
    const dk_slurm_request_t *req = c->req;
    double now = dk_now_s();
    if (c->stop)
        return;
    if (req->cancelled && req->cancelled(req->data)) {
        c->stop = 1;
        return;
    }
    if (c->wait_end > 0 && now >= c->wait_end) {
        c->stop = 2;
        return;
    }
    if (!c->job->job_id[0] && !dk_slurm_salloc_job_id(c->said, c->job->job_id,
                                                      sizeof c->job->job_id))
        return;
    /* Slurm took the request: from here on it waits in the queue, which the
     * wait limit bounds, not the command's deadline. */
    c->deadline = 1e300;
    last_word_by_id(c->job);
    if (now < c->next_poll)
        return;
    c->next_poll = now + POLL_EVERY_S;
    dk_slurm_squeue_t q;
    if (squeue_job(c->job, &q, NULL, 0) == 1)
        note_state(c, &q);
}

/* Q, the job's line while it waits: reported at each poll, changed or not,
 * so that what shows the wait (a status line's elapsed time) moves; a reason
 * that cannot change while it waits ends the wait. */
static void note_state(command_t *c, const dk_slurm_squeue_t *q)
{
    const dk_slurm_request_t *req = c->req;
    snprintf(c->state, sizeof c->state, "%s", q->state);
    snprintf(c->reason, sizeof c->reason, "%s", q->reason);
    if (req->on_wait)
        req->on_wait(req->data, c->job->job_id, q->state, q->reason);
    /* Over a partition's MaxTime or a QOS's MaxWall, a job waits for ever
     * where the site does not enforce the limits at submission (Slurm's
     * default): say so now rather than at the end of the wait. */
    if (strcmp(q->state, "PENDING") == 0 && dk_slurm_time_limit_reason(q->reason))
        c->stop = 3;
}

/* Whether TEXT (extra_args) sets the time limit, which then wins over ours. */
static bool sets_time(const char *text)
{
    char **w = NULL;
    size_t n = 0;
    bool found = false;
    if (text && dk_slurm_split_words(text, &w, &n, NULL, 0) == 0)
        for (size_t i = 0; i < n && !found; i++)
            found = strcmp(w[i], "--time") == 0 || strncmp(w[i], "--time=", 7) == 0 ||
                    strncmp(w[i], "-t", 2) == 0;
    dk_slurm_names_free(w, n);
    return found;
}

static void unique_name(char *name, size_t len)
{
    char hex[13];
    dk_unique_hex(hex, 6);
    snprintf(name, len, "distkernel-%s", hex);
}

/* salloc's argument list for REQ, TIME_LIMIT its --time ("": none); NULL with
 * ERR. The site's or user's extra_args come last: an option there (a --time
 * of their own) wins over ours, except those dk_slurm_check_args refuses
 * (the job's name and shape), which nothing may change. */
static char **salloc_args(const dk_slurm_request_t *req, const char *name,
                          const char *time_limit, char *err, size_t errlen)
{
    char **extra = NULL;
    size_t nextra = 0;
    if (req->extra_args && dk_slurm_check_args(req->extra_args, err, errlen) < 0)
        return NULL;
    if (req->extra_args &&
        dk_slurm_split_words(req->extra_args, &extra, &nextra, err, errlen) < 0)
        return NULL;
    char **a = calloc(nextra + 16, sizeof *a);
    size_t n = 0;
    bool ok = a != NULL;
#define ADD(...) do { if (ok && asprintf(&a[n], __VA_ARGS__) >= 0) n++; else ok = false; } while (0)
    ADD("--no-shell");
    ADD("--job-name=%s", name);
    ADD("--nodes=%d", req->nodes);
    ADD("--ntasks-per-node=%d", req->tasks_per_node);
    if (req->gpus_per_node > 0 && req->gpu_type && req->gpu_type[0])
        ADD("--gpus-per-node=%s:%d", req->gpu_type, req->gpus_per_node);
    else if (req->gpus_per_node > 0)
        ADD("--gpus-per-node=%d", req->gpus_per_node);
    if (req->partition && req->partition[0])
        ADD("--partition=%s", req->partition);
    if (req->account && req->account[0])
        ADD("--account=%s", req->account);
    if (req->qos && req->qos[0])
        ADD("--qos=%s", req->qos);
    if (req->constraint && req->constraint[0])
        ADD("--constraint=%s", req->constraint);
    if (time_limit && time_limit[0])
        ADD("--time=%s", time_limit);
    for (size_t i = 0; i < nextra; i++)
        ADD("%s", extra[i]);
#undef ADD
    dk_slurm_names_free(extra, nextra);
    if (!ok) {
        for (size_t i = 0; i < n; i++)
            free(a[i]);
        free(a);
        dk_set_err(err, errlen, "out of memory preparing salloc's arguments");
        return NULL;
    }
    return a;
}

static void free_args(char **a)
{
    for (size_t i = 0; a && a[i]; i++)
        free(a[i]);
    free(a);
}

/* Each node's address (NodeAddr), from `sinfo -N -o '%N|%o'`. */
static int find_addrs(dk_slurm_t *self, const char *nodelist, char *err, size_t errlen)
{
    self->addrs = calloc(self->count, sizeof *self->addrs);
    if (!self->addrs) {
        dk_set_err(err, errlen, "out of memory");
        return -1;
    }
    command_t c = {0};
    const char *args[] = {"-h", "-N", "-n", nodelist, "-o", "%N|%o", NULL};
    char *out = NULL;
    int rc = slurm_run("sinfo", args, self->timeout_s, &c, &out, err, errlen);
    if (rc > 0)
        dk_set_err(err, errlen, "sinfo -n %s failed: %s", nodelist, slurm_said_text(&c));
    for (char *line = out, *next; rc == 0 && line && *line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *bar = strchr(line, '|');
        if (!bar)
            continue;
        *bar = '\0';
        for (size_t i = 0; i < self->count; i++)
            if (!self->addrs[i] && strcmp(self->names[i], line) == 0)
                self->addrs[i] = strdup(bar + 1);
    }
    free(out);
    if (rc != 0)
        return -1;
    for (size_t i = 0; i < self->count; i++) {
        if (!self->addrs[i] && !(self->addrs[i] = strdup(self->names[i]))) {
            dk_set_err(err, errlen, "out of memory");
            return -1;
        }
    }
    return 0;
}

static int learn_nodes(dk_slurm_t *self, const char *nodelist, char *err, size_t errlen)
{
    free_nodes(self);
    if (dk_slurm_hostlist_expand(nodelist, &self->names, &self->count, err, errlen) < 0)
        return -1;
    return find_addrs(self, nodelist, err, errlen);
}

/* Inside an allocation: adopt it. */
static dk_slurm_t *adopt(const dk_slurm_request_t *req, const char *job_id, char *err,
                         size_t errlen)
{
    dk_slurm_t *self = job_new(req->command_timeout_s);
    if (!self) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    snprintf(self->job_id, sizeof self->job_id, "%s", job_id);
    const char *nodelist = getenv("SLURM_JOB_NODELIST");
    if (!nodelist || !nodelist[0])
        nodelist = getenv("SLURM_NODELIST");
    if (!nodelist || !nodelist[0]) {
        dk_set_err(err, errlen, "SLURM_JOB_ID is %s but SLURM_JOB_NODELIST is not set: this "
                   "process is not inside a usable Slurm allocation; unset SLURM_JOB_ID to "
                   "ask Slurm for a new one", job_id);
        goto fail;
    }
    if (learn_nodes(self, nodelist, err, errlen) < 0)
        goto fail;
    if ((size_t) req->nodes > self->count) {
        dk_set_err(err, errlen, "the run needs %d nodes but this kernel runs inside Slurm job "
                   "%s, which has %zu (%s); ask for fewer nodes, or start the kernel in a "
                   "larger allocation", req->nodes, job_id, self->count, nodelist);
        goto fail;
    }
    return self;
fail:
    dk_slurm_destroy(&self);
    return NULL;
}

bool dk_slurm_partition_limit(const char *text, const char *partition, char *out,
                              size_t outlen)
{
    char want[256] = "";
    if (partition && partition[0])
        snprintf(want, sizeof want, "%.*s", (int) strcspn(partition, ","), partition);
    for (const char *line = text; line && *line; ) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t) (eol - line) : strlen(line);
        char copy[512], part[256], limit[64];
        /* One line at a time: a line of one word must not take the next's. */
        snprintf(copy, sizeof copy, "%.*s", (int) (len < sizeof copy ? len : 0), line);
        if (sscanf(copy, "%255s %63s", part, limit) == 2) {
            size_t n = strlen(part);
            bool dflt = n && part[n - 1] == '*';
            if (dflt)
                part[--n] = '\0';
            if ((want[0] ? strcmp(part, want) == 0 : dflt) && strcmp(limit, "n/a") != 0) {
                snprintf(out, outlen, "%s", limit);
                return true;
            }
        }
        line = eol ? eol + 1 : NULL;
    }
    return false;
}

/* SELF->time_limit for REQ: time_limit_s in minutes:seconds, or with
 * longest_time the partition's MaxTime from sinfo. Returns 0, or -1 with ERR. */
static int request_time_limit(const dk_slurm_request_t *req, dk_slurm_t *self, char *err,
                              size_t errlen)
{
    if (req->time_limit_s > 0) {
        long s = (long) (req->time_limit_s + 0.999);
        snprintf(self->time_limit, sizeof self->time_limit, "%ld:%02ld", s / 60, s % 60);
        if (!req->clamp_time)
            return 0;
    } else if (!req->longest_time) {
        return 0;
    }
    command_t c = {0};
    static const char *const args[] = {"-h", "-o", "%P %l", NULL};
    char *out = NULL;
    char max[sizeof self->time_limit];
    int rc = slurm_run("sinfo", args, self->timeout_s, &c, &out, err, errlen);
    bool found = rc == 0 && out && dk_slurm_partition_limit(out, req->partition, max, sizeof max);
    free(out);
    if (req->time_limit_s > 0) {
        /* Clamping is a courtesy: where sinfo cannot say, the wish stands
         * (and a limit Slurm refuses ends the wait at once, watch_wait). */
        long longest = found ? dk_slurm_time_s(max) : -1;
        if (longest > 0 && longest < (long) (req->time_limit_s + 0.999))
            snprintf(self->time_limit, sizeof self->time_limit, "%s", max);
        return 0;
    }
    if (found)
        snprintf(self->time_limit, sizeof self->time_limit, "%s", max);
    if (rc < 0)
        return -1;
    if (rc != 0) {
        dk_set_err(err, errlen, "sinfo could not say the partition's time limit: %s",
                   slurm_said_text(&c));
        return -1;
    }
    if (!found)     /* a partition sinfo does not list: salloc will say so */
        self->time_limit[0] = '\0';
    return 0;
}

static dk_slurm_t *request(const dk_slurm_request_t *req, int *cancelled, char *err,
                           size_t errlen)
{
    dk_slurm_t *self = job_new(req->command_timeout_s);
    if (!self) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    self->owned = true;
    unique_name(self->job_name, sizeof self->job_name);
    /* Armed before the request exists: a kernel killed while salloc waits
     * leaves a queued job otherwise (salloc dies with it, its request stays). */
    char name_arg[96];
    snprintf(name_arg, sizeof name_arg, "--name=%s", self->job_name);
    char *scancel[] = {"scancel", name_arg, NULL};
    if (dk_spawn_last_word(scancel, &self->last_word_pid, &self->last_word_fd, err, errlen) < 0)
        goto fail;
    if (request_time_limit(req, self, err, errlen) < 0)
        goto fail;
    char **args = salloc_args(req, self->job_name, self->time_limit, err, errlen);
    if (!args)
        goto fail;
    command_t c = {.req = req, .job = self};
    if (req->wait_s > 0)
        c.wait_end = dk_now_s() + req->wait_s;
    int rc = slurm_run("salloc", (const char *const *) args, self->timeout_s, &c, NULL, err, errlen);
    free_args(args);
    if (c.stop)
        goto stopped;
    if (rc != 0) {
        if (rc > 0)
            dk_set_err(err, errlen, "salloc could not allocate %d node%s: %s", req->nodes,
                       req->nodes == 1 ? "" : "s", slurm_said_text(&c));
        goto fail;
    }
    if (!self->job_id[0] &&
        !dk_slurm_salloc_job_id(c.said, self->job_id, sizeof self->job_id)) {
        dk_set_err(err, errlen, "salloc succeeded but did not say the job's id: %s",
                   slurm_said_text(&c));
        goto fail;
    }
    last_word_by_id(self);
    dk_slurm_squeue_t q;
    int found = squeue_job(self, &q, err, errlen);
    /* Granted is not yet running where nodes boot first (power saving, cloud
     * nodes) or a prolog runs at allocation (PrologFlags=Alloc): the job is
     * CONFIGURING, and waited for within the same wait as the queue. */
    while (found == 1 && strcmp(q.state, "CONFIGURING") == 0) {
        note_state(&c, &q);
        double next = dk_now_s() + POLL_EVERY_S;
        while (!c.stop && dk_now_s() < next) {
            if (req->cancelled && req->cancelled(req->data))
                c.stop = 1;
            else if (c.wait_end > 0 && dk_now_s() >= c.wait_end)
                c.stop = 2;
            else
                usleep(100000);
        }
        if (c.stop)
            goto stopped;
        found = squeue_job(self, &q, err, errlen);
    }
    if (found == 0)
        dk_set_err(err, errlen, "Slurm job %s ended right after it was granted", self->job_id);
    if (found != 1)
        goto fail;
    if (strcmp(q.state, "RUNNING") != 0 || !q.nodes[0]) {
        dk_set_err(err, errlen, "Slurm job %s is %s (%s) right after it was granted",
                   self->job_id, q.state, q.reason);
        goto fail;
    }
    if (learn_nodes(self, q.nodes, err, errlen) < 0)
        goto fail;
    return self;
stopped:
    if (cancelled)
        *cancelled = c.stop;
    if (c.stop == 1)
        dk_set_err(err, errlen, "the Slurm request%s%s was cancelled while %s%s%s",
                   self->job_id[0] ? " " : "", self->job_id,
                   c.state[0] ? c.state : "waiting", c.reason[0] ? ": " : "", c.reason);
    else if (c.stop == 2)
        dk_set_err(err, errlen, "Slurm did not grant the request%s%s within %.0f s (%s%s%s); "
                   "it was cancelled", self->job_id[0] ? " " : "", self->job_id, req->wait_s,
                   c.state[0] ? c.state : "waiting", c.reason[0] ? ": " : "", c.reason);
    else
        dk_set_err(err, errlen, "Slurm will not run job %s: its time limit (%s) is over a "
                   "limit of %s (PENDING: %s); it was cancelled", self->job_id,
                   sets_time(req->extra_args) ? "the --time of slurm_args"
                   : self->time_limit[0] ? self->time_limit : "the partition's default",
                   strstr(c.reason, "MaxWall") ? "its QOS or account" : "the partition",
                   c.reason);
fail:
    dk_slurm_destroy(&self);       /* cancels it, by id or by name */
    return NULL;
}

dk_slurm_t *dk_slurm_allocate(const dk_slurm_request_t *req, int *cancelled, char *err,
                              size_t errlen)
{
    if (cancelled)
        *cancelled = 0;
    if (req->nodes < 1 || req->tasks_per_node < 1) {
        dk_set_err(err, errlen, "a Slurm request needs at least 1 node and 1 task per node "
                   "(got %d and %d)", req->nodes, req->tasks_per_node);
        return NULL;
    }
    const char *inside = getenv("SLURM_JOB_ID");
    if (inside && inside[0])
        return adopt(req, inside, err, errlen);
    return request(req, cancelled, err, errlen);
}

const char *dk_slurm_job_id(const dk_slurm_t *self) { return self->job_id; }
const char *dk_slurm_time_limit(const dk_slurm_t *self) { return self->time_limit; }
bool dk_slurm_owned(const dk_slurm_t *self) { return self->owned; }
size_t dk_slurm_node_count(const dk_slurm_t *self) { return self->count; }
const char *dk_slurm_node_name(const dk_slurm_t *self, size_t i) { return self->names[i]; }
const char *dk_slurm_node_addr(const dk_slurm_t *self, size_t i) { return self->addrs[i]; }

int dk_slurm_time_left(dk_slurm_t *self, long *left_s, char *err, size_t errlen)
{
    *left_s = -1;
    char *out = NULL;
    int rc = squeue_own(self, "%L", &out, err, errlen);
    if (rc <= 0)
        return rc;          /* 0: Slurm no longer knows the job, nor its time */
    out[strcspn(out, " \n")] = '\0';
    *left_s = dk_slurm_time_s(out);     /* -1: UNLIMITED, NOT_SET, INVALID */
    free(out);
    return 0;
}

int dk_slurm_state(dk_slurm_t *self, char *state, size_t statelen, char *reason,
                   size_t reasonlen, char *err, size_t errlen)
{
    dk_slurm_squeue_t q;
    int found = squeue_job(self, &q, err, errlen);
    if (found < 0)
        return -1;
    snprintf(state, statelen, "%s", found ? q.state : "");
    snprintf(reason, reasonlen, "%s", found ? q.reason : "");
    return 0;
}

int dk_slurm_release(dk_slurm_t *self, char *err, size_t errlen)
{
    if (!self->owned || self->released)
        return 0;
    if (cancel_job(self, err, errlen) < 0)
        return -1;
    self->released = true;
    dk_spawn_sentinel_end(&self->last_word_pid, &self->last_word_fd);
    return 0;
}

void dk_slurm_destroy(dk_slurm_t **self_p)
{
    dk_slurm_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    /* A failed release gets one more try; a job must not outlive its owner. */
    if (dk_slurm_release(self, NULL, 0) < 0)
        dk_slurm_release(self, NULL, 0);
    /* Both releases failed: the last word tries once more, now, on its own
     * (and is reaped when done: a kernel that lives on keeps no zombie). */
    dk_spawn_last_word_now(&self->last_word_pid, &self->last_word_fd);
    free_nodes(self);
    free(self);
    *self_p = NULL;
}
