/*
 * dk_job_state: the state of one job, shared by the files that run it.
 *
 * Private to runtime/launch/ (dk_job.h is the API). One job is five files,
 * one idea each, over this one state:
 *   dk_job.c         the runtime thread's poll loop, and the handle the host
 *                    holds (waiting, cancelling, reading what each rank did);
 *   dk_job_launch.c  everything before the loop: the checks, the logs, the
 *                    back channel, each rank's environment and its fork;
 *   dk_job_chan.c    the channel to the ranks: back-channel events, and their
 *                    output from pipes and frames to the logs and the sink;
 *   dk_job_judge.c   judging how each rank ended (its exit, its loss, the root
 *                    cause) and the stop that follows a failure;
 *   dk_job_round.c   the rounds of a persistent job (started ranks).
 * Fields are the runtime thread's unless said: those marked guarded are read
 * by other threads under job->lock (see the top of dk_job.c).
 */
#ifndef DK_JOB_STATE_H
#define DK_JOB_STATE_H

#include "dk_job.h"

#include "dk_backchan.h"
#include "dk_launchout.h"
#include "dk_logfile.h"
#include "dk_stackreq.h"
#include "dk_stop.h"
#include "dk_tunnel.h"

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define REAP_DRAIN_BUDGET ((size_t) 16 << 20)
/* The raw bytes of the agents' launcher's last telling line kept (agents_line):
 * enough for srun's and slurmstepd's messages; sanitized, at most 3 times as
 * much. */
#define LAUNCHER_LINE_KEEP 320

typedef struct {
    pid_t pid;
    int pidfd;
    int pipe_fd[2];         /* read ends of stdout, stderr; -1 at EOF */
    dk_logfile_t *log;      /* NULL once a write failed */
    bool log_failed;        /* a write to the log failed: it is incomplete */
    bool log_capped;        /* the log passed its cap (the sink was told); guarded */
    char *log_path;
    bool reaped;
    bool signalled;         /* the runtime has sent its group a stop signal */
    bool got_result;
    bool reported;          /* sent RESULT or ERROR */
    bool failed;            /* failed on its own, before any stop signal */
    bool was_exiting;       /* job_resolve_failure's note: exiting, unanswered */
    bool echo;              /* its ERROR says a peer's connection went away */
    bool interrupted;       /* persistent: sent SIGINT this round */
    char *host;             /* its node, for what is said when it is lost */
    bool by_agent;          /* started by its node's agent: no process here (pid -1) */
    bool exit_told;         /* ... whose agent has told its exit */
    int exit_status;        /* ... as a wait status */
    bool lost;              /* silent past the heartbeat deadline; guarded */
    bool closed_unanswered; /* its connection was ended by its side before it answered */
    double closed_until;    /* > 0: its exit is awaited until then (bc_closed) */
    bool deferred;          /* collected, its verdict waiting (see job_reap) */
    double deferred_until;
    int deferred_status;
    bool deferred_known;
    /* guarded by job->lock */
    dk_rank_state_t state;
    int exit_code;
    int term_signal;
} rank_t;

/* A line of a node agent's own, being read from its launcher's pipe. */
typedef struct {
    char buf[1024];
    size_t len;
    bool overflow;
} agent_text_t;

struct dk_job_t {
    dk_sink_t sink;
    int world_size;
    double timeout_s;
    rank_t *ranks;
    dk_backchan_t *chan;
    char *log_dir;
    int log_dirfd;          /* held (dk_logdir_hold) while the job exists */
    unsigned long long log_cap;
    int master_port;
    char *master_addr;      /* NULL: 127.0.0.1 */
    int ranks_per_node;     /* >= 1 */
    int wake[2];
    pthread_t thread;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* The sentinel that ends the ranks' process groups (their
     * children too) if the host dies (dk_spawn_sentinel); -1 when none. Set at
     * start, ended by the runtime thread once every rank is reaped. */
    int sentinel_pid, sentinel_fd;
    bool cancel_requested;  /* guarded */
    bool ended;             /* guarded */
    dk_job_end_t end;       /* guarded */
    int root_cause;         /* guarded */
    int failure_pending;    /* runtime thread: the turn's first failure, or -1 */
    double failure_at;      /* ... when it was noted */

    /* persistent jobs (see dk_job.h); guarded by lock unless said */
    bool persistent;
    double idle_timeout_s;
    char *warm_socket;          /* spec.warm_socket (copied), or NULL */
    double heartbeat_s;         /* > 0: ranks over TCP, with heartbeats */
    pthread_mutex_t log_lock;   /* the ranks' log objects: swapped between rounds */
    bool round_active;
    dk_job_end_t round_end;
    int round_root;
    double idle_since;
    bool submit_pending;
    void *submit_payload;
    size_t submit_len;
    double submit_timeout_s;
    bool interrupt_requested;
    bool sample_requested;      /* dk_job_sample_stacks */
    /* runtime thread only */
    uint32_t round;
    int round_pending;          /* ranks that have not answered this round */
    double round_started_at;
    double round_timeout_s;
    dk_job_end_t round_reason;  /* CANCELLED or TIMEOUT once interrupted */
    double round_deadline;      /* the grace after our SIGINT ends; -1: none */
    double round_resend_at;     /* the next SIGINT to ranks still not answering */

    /* runtime thread only */
    struct pollfd *fds;
    int *slot_rank;         /* for each pollfd after the back channel's: rank and */
    int *slot_kind;         /* which descriptor (0 stdout, 1 stderr, 2 pidfd) */
    size_t max_fds;
    double started_at;
    double connect_timeout_s;   /* spec's: for the agents (job_agents_judge) */
    dk_job_end_t stop_reason;
    dk_stop_t stop;         /* SIGINT, SIGTERM, SIGKILL: a grace apart (seconds) */
    int unreaped;
    double last_reap_at;
    bool drain_cut;         /* cancel during the drain window: stop waiting */
    /* spec.stacks: the live ranks' stacks are asked for before they are
     * signalled, once per job (per round of a persistent one); the stop or
     * the round's interrupt waits for the answers (job_stacks_over). NULL: never.
     * Read by others once the job or the round has ended. */
    dk_stackreq_t *stacks;
    double stacks_wait_s;
    bool stacks_asked;
    bool sampling;              /* the running request is a live sample (job_sample_stacks) */
    bool stop_deferred;
    bool interrupt_deferred;

    /* Node agents (spec.agent_command); runtime thread only unless said */
    int nagents;                /* 0: none */
    pid_t agents_pid;           /* the one launcher (srun) of every agent */
    int agents_pidfd;
    int agents_pipe[2];
    bool agents_reaped;
    double agents_exited_at;    /* ... when it was reaped */
    bool agents_exit_judged;    /* ... and the agents that never came judged */
    dk_launchout_t *agents_filter[2];
    dk_logfile_t *agents_log;   /* agents.log: the launcher's lines */
    dk_tunnel_t *tunnel;        /* the tracking server's gate for the agents (dk_tunnel.h) */
    char *agents_line;          /* its last telling line, or NULL */
    bool *agent_hello;          /* per node: its agent said AGENT_HELLO */
    bool *agent_gone;           /* per node: its agent was lost (or never came) */
    agent_text_t agents_text[2];    /* per launcher pipe: the tasks' line being read */
    int agents_feeding;         /* the pipe whose bytes are being filtered */
    char **agent_words;         /* per node: what its agent said before it gave up
                                   without connecting, or NULL (agents_out) */
    int agents_cold;            /* nodes whose agent said its ranks start cold */
    bool *agent_cold;           /* per node: ... this one */
    char *agents_cold_why;      /* what the first of them said */
    int lost_nodes_told;        /* nodes whose loss was warned of (job_lose) */
    /* Ranks warned of, per kind of per-rank warning (job_warn_rank); log_lock */
    int told_log_failed, told_log_capped, told_log_unfinished;
};

/* dk_job.c */
void job_warn(dk_job_t *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A warning about one rank, of a kind whose count *TOLD keeps: the first
 * DK_JOB_RANKS_TOLD ranks are each told, then MORE once (a run of 1,024 ranks
 * whose disk is full says so in a few lines, not 1,024). */
#define DK_JOB_RANKS_TOLD 4
void job_warn_rank(dk_job_t *job, int *told, const char *more, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void job_close_fd(int *fd);
void *job_thread(void *arg);
bool job_wait_for(dk_job_t *job, int timeout_ms, bool (*done)(const dk_job_t *));
void job_request(dk_job_t *job, bool *flag);

/* dk_job_launch.c */
void job_free(dk_job_t *job);

/* dk_job_chan.c */
dk_backchan_sink_t job_backchan_sink(dk_job_t *job);
void job_drain_pipe(dk_job_t *job, int r, int which, size_t budget);
void job_close_logs(dk_job_t *job);

/* dk_job_judge.c */
void job_set_state(dk_job_t *job, int r, dk_rank_state_t state);
bool job_ask_stacks(dk_job_t *job);
void job_sample_stacks(dk_job_t *job);
void job_sample_over(dk_job_t *job);
void job_stacks_over(dk_job_t *job);
void job_begin_stop(dk_job_t *job, dk_job_end_t reason);
bool job_closing(const rank_t *rk);
void job_note_failure(dk_job_t *job, int r);
double job_echo_deadline(const dk_job_t *job);
void job_resolve_failure(dk_job_t *job);
void job_escalate(dk_job_t *job);
void job_lose(dk_job_t *job, int r, const char *why);
void job_judge_closed(dk_job_t *job);
void job_reap(dk_job_t *job, int r);
void job_reaped(dk_job_t *job, int r, int status, bool known);
void job_judge_gone(dk_job_t *job, int r);
void job_judge_deferred(dk_job_t *job);

/* dk_job_agents.c */
bool job_start_agents(dk_job_t *job, const dk_job_spec_t *spec, const char *const *base,
                      const char *run_id, char *err, size_t errlen);
void job_agents_free(dk_job_t *job);
void job_agents_drain(dk_job_t *job, int which);
void job_agents_reap(dk_job_t *job);
void job_agents_judge(dk_job_t *job);
void job_agents_end(dk_job_t *job);
void job_agent_gone(dk_job_t *job, int node, const char *why);
void job_agent_exit(dk_job_t *job, int r, int exit_code, int term_signal);
void job_agents_reap_told(dk_job_t *job);
bool job_agents_words_pending(const dk_job_t *job);
/* dk_job_chan.c */
void job_deliver(dk_job_t *job, int r, int fd, const char *buf, size_t n);

/* dk_job_round.c */
void job_round_answered(dk_job_t *job);
void job_signal_unanswered(dk_job_t *job);
void job_interrupt_round(dk_job_t *job);
void job_round_stuck(dk_job_t *job);
void job_start_round(dk_job_t *job);
void job_round_message(dk_job_t *job, int r, bool is_error, const void *bytes, size_t len);

#endif
