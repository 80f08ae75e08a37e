/*
 * dk_job: run one distributed job as N rank processes on this node.
 *
 * This is the embeddable runtime: it knows processes, pipes and signals, and
 * nothing of Jupyter. A host (the kernel, a CLI, a test) describes a job, passes
 * a sink of callbacks, and gets a handle to wait on or cancel.
 *
 * Each rank is the rank executable started with fork+exec from the calling
 * thread (which must outlive the job: PR_SET_PDEATHSIG follows the thread that
 * forked), in a process group of its own, with PR_SET_PDEATHSIG(SIGKILL) so no
 * rank outlives its host, its stdout and stderr on pipes the runtime always
 * drains, and every other descriptor closed. What a rank starts in its group
 * (a subprocess, a DataLoader's workers) ends with the host as well, even when
 * the host is SIGKILLed: a sentinel process (dk_spawn_sentinel) ends the
 * ranks' groups when the host's end of its pipe closes.
 *
 * Back channel. The runtime listens on a Unix socket in a fresh 0700 directory
 * and gives every rank its path and a per-job random key (environment variables
 * DISTKERNEL_BC and DISTKERNEL_BC_KEY, 64 hex digits). Its bytes (the nonce
 * each connection starts with, the frames, their MACs, directions, counts and
 * types) are specified once, in runtime/channel/dk_frame.h; this header says
 * what a job does with them. A frame whose MAC does not verify ends the
 * connection (and is reported as a warning): only a process that was given
 * the key, on this connection, can speak. A rank says HELLO, is sent the
 * job's PAYLOAD, sends exactly one RESULT or ERROR and then exits.
 *
 * MASTER_PORT from rank 0 (spec.master_port DK_JOB_PORT_FROM_RANK0, with
 * spec.bc_tcp_addr). A port free on the kernel's host says nothing of rank
 * 0's node, so there the ranks get DISTKERNEL_MASTER_PORT=rank0 and no
 * MASTER_PORT. Rank 0 finds a port free on its node and holds it bound
 * until just before its work runs; right after its HELLO it sends that port
 * in a PORT frame, and the runtime sends every rank (rank 0 too) a PORT frame
 * with it before its PAYLOAD or first TASK; a rank that said HELLO earlier
 * waits for it. The rank sets MASTER_PORT from it. A PORT from any other rank, a
 * second one, or one outside 1-65535 ends that connection.
 *
 * Ranks on other nodes (spec.bc_tcp_addr, spec.agent_command). The runtime
 * listens on TCP, bound to that one address, and DISTKERNEL_BC is
 * "tcp:ADDR:PORT" ("tcp:[ADDR]:PORT" for IPv6); the key still travels only
 * in the environment. What connects there is each node's agent
 * (runtime/agent/dk_agent.h), which starts its node's ranks and carries
 * their connections (to a Unix socket of its own, the rank's DISTKERNEL_BC),
 * their output, exits and stacks on its one connection (dk_frame.h, frame
 * types 6, 7 and 10 to 16). A rank's own frames are as above, and it may send
 * OUTPUT too: lines for its log only (DK_FRAME_OUTPUT_LOG).
 * The runtime and each agent send a PING every second (DK_BC_PING_S) while
 * connected. An agent whose connection is silent for longer than
 * spec.heartbeat_s, or closes, is its node lost: every rank of it that had
 * not ended is lost, a failure (the first is the root cause; on_lost,
 * dk_job_lost_summary). A rank whose connection its side closes (end of
 * file, reset) before it answered is judged by its exit, but that exit is
 * awaited only for spec.heartbeat_s: a rank still running then is lost, as
 * silence would have it, with the ranks of its node that have no connection
 * left; a peer's failure meanwhile waits, since it is most likely the echo
 * of that loss (gloo's "Connection closed by peer"), and the closed rank's
 * fate becomes the root cause. An agent whose runtime is silent that long,
 * or closes, ends its ranks, so a host killed by SIGKILL leaves no rank on
 * any node.
 *
 * Persistent jobs (spec.persistent) keep their ranks between rounds. The runtime
 * sends nothing at HELLO; each round (dk_job_submit) it sends every rank a
 * TASK frame (u32 round | the round's payload bytes), and the rank answers
 * with one RESULT or ERROR whose payload starts with the same u32 round, then
 * waits for the next TASK on the same connection (seq keeps counting; rounds
 * are numbered from 1). An answer naming another round,
 * or a second answer in a round, ends the connection. A rank exits when the
 * connection reaches EOF. In a persistent job an ERROR is not a failure of the
 * job: the round ends with it, and the ranks stay. A rank that exits, for any
 * reason the runtime did not cause, is a failure and ends every rank.
 *
 * A rank has failed when it sends ERROR, exits non-zero, dies by a signal, or
 * exits without a RESULT. The first failure observed is the root cause; the
 * runtime then ends every other rank: SIGINT, and after GRACE SIGTERM, and after
 * GRACE SIGKILL, each sent to the rank's whole process group. Cancel (interrupt,
 * shutdown) and the timeout end ranks the same way.
 * With spec.stacks the live ranks of this node are first asked for their
 * Python stacks, all at once, and the first signal waits for their answers
 * (at most spec.stacks_wait_s, 2 s): dk_job_rank_stacks.
 *
 * Rounds of a persistent job. Round 0 is the start: it ends when every rank has
 * said HELLO. A round ends when every rank has answered. An ERROR that is not
 * an answer to our SIGINT makes its rank the round's root cause, and the ranks
 * that have not answered get SIGINT (a Python rank raises KeyboardInterrupt and
 * answers). dk_job_interrupt and the round's timeout do the same to every rank
 * that has not answered. A rank that has not answered GRACE after that SIGINT
 * is stuck (a collective whose peer is gone): the whole job is stopped as
 * above, with the round's root cause as the job's. With idle_timeout_s, a job
 * that has had no round running for that long is stopped (DK_END_IDLE). On
 * stop a persistent job also closes the back channel, so an idle rank (which
 * ignores SIGINT between rounds) exits at once.
 *
 * Threads: one runtime thread per job polls the listening socket, the
 * connections, the pipes, one pidfd per rank, and a wake pipe. Sink callbacks are
 * called from that thread, never concurrently with each other.
 */
#ifndef DK_JOB_H
#define DK_JOB_H

#include "dk_lost.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    DK_RANK_STARTING = 0,  /* forked, not yet connected */
    DK_RANK_RUNNING,       /* connected and received its payload */
    DK_RANK_DONE,          /* sent RESULT and exited 0 */
    DK_RANK_FAILED,        /* sent ERROR, or exited non-zero / by signal / without result */
    DK_RANK_STOPPED        /* ended by the runtime (another rank failed, cancel, timeout) */
} dk_rank_state_t;

typedef enum {
    DK_END_NONE = 0,       /* still running */
    DK_END_OK,             /* every rank DONE */
    DK_END_FAILED,         /* a rank failed (root cause: first_failed_rank) */
    DK_END_CANCELLED,      /* dk_job_cancel */
    DK_END_TIMEOUT,        /* the job's timeout passed */
    DK_END_IDLE            /* a persistent job had no round for idle_timeout_s */
} dk_job_end_t;

typedef struct {
    void *data;
    /* Bytes a rank wrote to fd 1 or 2 (FD), in order per rank and fd, as read. */
    void (*on_output)(void *data, int rank, int fd, const char *bytes, size_t len);
    /* A rank changed state. For FAILED/STOPPED, EXIT_CODE (-1 if by signal) and
     * TERM_SIGNAL (0 if none) say how the process ended, when it has. */
    void (*on_state)(void *data, int rank, dk_rank_state_t state, int exit_code,
                     int term_signal);
    /* A rank sent RESULT (IS_ERROR false) or ERROR (true). The bytes are only
     * valid during the call. */
    void (*on_message)(void *data, int rank, bool is_error, const void *bytes, size_t len);
    /* Something the user should know that is not a rank's output (a refused
     * back-channel connection, a log file that cannot be written). */
    void (*on_warning)(void *data, const char *text);
    /* Everything RANK has written to FD so far has been passed on (a read found
     * the pipe empty). May be NULL. Tells a line the rank left unfinished from
     * one whose rest is still in the pipe behind a busy reader. */
    void (*on_caught_up)(void *data, int rank, int fd);
    /* RANK, on HOST (spec.rank_hosts, or "localhost"), has been silent past
     * the heartbeat deadline: it is lost and counts as failed. May be NULL. */
    void (*on_lost)(void *data, int rank, const char *host);
    /* The answers to a live sample (dk_job_sample_stacks): DUMPS[R] (LENS[R]
     * bytes, NUL-terminated) is what rank R wrote, "" when it did not answer
     * in time, NULL when it was not asked (not in a cell: done, gone, lost).
     * Valid during the call only. May be NULL. */
    void (*on_stacks)(void *data, int world, const char *const *dumps, const size_t *lens);
} dk_sink_t;

typedef struct {
    int world_size;             /* >= 1 */
    const char *rank_exe;       /* the program each rank runs */
    const char *const *rank_argv; /* argv for it (NULL: just the program name) */
    /* The base environment (NULL: the host's `environ` at start). The runtime
     * adds RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK=0,
     * NODE_RANK=0, ROLE_RANK, ROLE_NAME=default, GROUP_WORLD_SIZE=1,
     * ROLE_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT (a port free at
     * start) (see ranks_per_node and master_addr for ranks on several nodes),
     * TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT=0, TORCHELASTIC_MAX_RESTARTS=0,
     * OMP_NUM_THREADS=1 unless set, DISTKERNEL_BC, DISTKERNEL_BC_KEY,
     * DISTKERNEL_LOG (the rank's log file). */
    const char *const *env;
    const void *payload;        /* sent to every rank in PAYLOAD (copied) */
    size_t payload_len;
    double timeout_s;           /* <= 0: none */
    double grace_s;             /* between SIGINT, SIGTERM, SIGKILL; <= 0: 2.0 */
    /* rank-N.log files go here, created 0700 if missing. It must be the user's
     * alone, reached only through directories of the user or root (see
     * dk_logdir.h); otherwise the job does not start. NULL: a fresh
     * kernel-PID/run-RANDOM under the default root (dk_logdir_default_root). */
    const char *log_dir;
    /* Each rank-N.log keeps at most this many bytes: past it, its head and tail
     * with a marker between (dk_logfile_t). 0: DK_LOG_CAP_DEFAULT (1 GiB). */
    unsigned long long log_cap;
    /* Keep the ranks between rounds (see the top). PAYLOAD is then unused. */
    bool persistent;
    double idle_timeout_s;      /* persistent jobs: <= 0: never idle out */
    /* A warm-start template's socket (dk_template_socket), or NULL. Each rank
     * is then forked by that template (see rank_main.c): the same environment,
     * group, pipes and exit status, judged and stopped as any rank. A rank the
     * template refuses starts cold and says why in warm.log in the log folder. */
    const char *warm_socket;
    /* Ranks on other nodes: listen on TCP bound to this numeric address only
     * (bc_tcp_port, 0: ephemeral), with heartbeats for node agents (see the
     * top; agent_command). NULL: a Unix socket and no heartbeats, as for
     * ranks on this node. */
    const char *bc_tcp_addr;
    int bc_tcp_port;
    /* With bc_tcp_addr: the run's nodes (names or numeric addresses,
     * bc_nallow of them, resolved at start). A connection from any other
     * address is closed as it is accepted (dk_accept.h); a name that does not
     * resolve fails the start. NULL: any address may connect (each must still
     * say a HELLO signed with the job's key). */
    const char *const *bc_allow_hosts;
    size_t bc_nallow;
    /* The silence deadline: >= 2 * DK_BC_PING_S; <= 0: DK_BC_HEARTBEAT_DEFAULT_S. */
    double heartbeat_s;
    /* With agent_command: an agent that has not connected this long after
     * the job's start (and heartbeat_s more, for the agent's own word on why
     * to arrive first), while its launcher still runs, is its node lost (a
     * node that went down while its agent was starting has no connection to
     * go silent). <= 0: DK_JOB_CONNECT_DEFAULT_S. Agents are given it too
     * (DISTKERNEL_BC_CONNECT_TIMEOUT): an agent keeps trying to connect, with
     * backoff, for this long after its own start. */
    double connect_timeout_s;
    /* Each rank's node name, for what is said when ranks are lost (NULL:
     * every rank is "localhost"). world_size entries, copied. */
    const char *const *rank_hosts;
    /* Ranks spread over nodes, RANKS_PER_NODE on each, in rank order (0:
     * all on one node). Then LOCAL_RANK = RANK % it, LOCAL_WORLD_SIZE = it,
     * GROUP_RANK (and NODE_RANK) = RANK / it, GROUP_WORLD_SIZE = the nodes.
     * WORLD_SIZE must be a multiple of it. */
    int ranks_per_node;
    /* Where rank 0's store listens: MASTER_ADDR (NULL: 127.0.0.1) and
     * MASTER_PORT (0: a port free here at start; DK_JOB_PORT_FROM_RANK0:
     * rank 0 finds one free on its node, see "MASTER_PORT from rank 0"
     * above; needs bc_tcp_addr). */
    const char *master_addr;
    int master_port;
    /* Ask the ranks of this node for their Python stacks before the runtime
     * signals them (a failure while others run, cancel, the timeout, a
     * round's interrupt or error; not an idle timeout), once per job or
     * round, waiting at most STACKS_WAIT_S for all of them together (<= 0:
     * DK_STACKREQ_WAIT_S, 2 s): dk_job_rank_stacks, dk_stackreq.h. Each rank
     * started here gets DISTKERNEL_STACKS; one started by a node agent is
     * asked through its agent (a STACKS frame, see agent_command). */
    bool stacks;
    double stacks_wait_s;
    /* Ranks started by node agents (distkernel-agent, runtime/agent/dk_agent.h),
     * one per node: the one launcher AGENT_COMMAND (an argv; [0] looked up
     * on PATH; srun with one task per node) starts world_size /
     * ranks_per_node agents, each of which learns its node from its task
     * (SLURM_NODEID) and starts that node's ranks, with the environment the
     * runtime gives the launcher: the back channel's variables (the key only
     * there) and DISTKERNEL_AGENT_* (agent_main.c). Needs bc_tcp_addr and
     * ranks_per_node. Such a rank has no
     * process here: its output before its own connection, its exit and its
     * stacks come from its agent's frames, and the stop ladder's signals go
     * to its agent (SIGNAL frames). An agent lost (its connection closed or
     * silent past heartbeat_s, or not connected connect_timeout_s after the
     * start) is its node lost, with every rank of it that had not ended.
     * The launcher's own lines go to agents.log in the log folder. */
    const char *const *agent_command;
    /* With agent_command: each agent starts a warm-start template on its node
     * importing these modules (comma-separated, dk_template.h) with
     * AGENT_WARM_PATH (newline-separated, NULL: none) first on sys.path, and
     * forks its ranks from it, as warm_socket does here. NULL: cold ranks.
     * A node whose template fails starts cold; the first such node's reason
     * goes to warm.log in the log folder (each agent's line is in
     * agents.log). */
    const char *agent_warm_modules;
    const char *agent_warm_path;
    /* With agent_command: the tracking server the ranks are to reach, when it
     * is on this host's loopback ("127.0.0.1:PORT"; NULL: none, or one the
     * nodes reach themselves). The job opens a gate on bc_tcp_addr and each
     * agent a door on its node's 127.0.0.1 that leads to it (dk_tunnel.h),
     * and tells its ranks the door's port (DISTKERNEL_TRACKING_PORT). The
     * gate is open for the job's life, so that a persistent job's later
     * rounds can be given one (dk_job_set_tunnel_upstream). */
    const char *tunnel_upstream;
} dk_job_spec_t;

#define DK_JOB_PORT_FROM_RANK0 (-1)
#define DK_JOB_CONNECT_DEFAULT_S 120.0

typedef struct dk_job_t dk_job_t;

/* Start the job. Returns NULL with a reason in ERR when nothing could be started
 * (then no process exists). Copies everything it needs from SPEC and SINK. */
dk_job_t *dk_job_start(const dk_job_spec_t *spec, const dk_sink_t *sink, char *err,
                       size_t errlen);

/* Wait up to TIMEOUT_MS (-1: forever) for the job to end: every rank exited and
 * reaped and every callback delivered. Returns true when it has ended. */
bool dk_job_wait(dk_job_t *job, int timeout_ms);

/* End every rank (SIGINT, SIGTERM, SIGKILL with the grace between). Returns at
 * once; dk_job_wait tells when it is over. The end becomes DK_END_CANCELLED
 * unless the job had already ended otherwise. Thread-safe. */
void dk_job_cancel(dk_job_t *job);

/* How the job ended (DK_END_NONE while running). */
dk_job_end_t dk_job_end(dk_job_t *job);

/* The rank whose failure was observed first, or -1. */
int dk_job_root_cause(dk_job_t *job);

/* Per-rank facts, valid after the job ended. */
dk_rank_state_t dk_job_rank_state(dk_job_t *job, int rank);
int dk_job_rank_exit_code(dk_job_t *job, int rank);     /* -1 if by signal */
/* False once a write to the rank's log failed (a full disk): the log is cut short. */
bool dk_job_rank_log_complete(dk_job_t *job, int rank);
/* True when the rank's output passed its log cap: its log keeps head and tail only. */
bool dk_job_rank_log_capped(dk_job_t *job, int rank);
int dk_job_rank_signal(dk_job_t *job, int rank);        /* 0 if none */
int dk_job_rank_pid(dk_job_t *job, int rank);

/* Whether any rank's process has already exited, judged or not: a look at the
 * processes themselves (waitid without collecting), for a host about to hand
 * work to a persistent job's ranks, since the runtime thread may not have seen
 * a death yet. A rank whose main thread is a zombie counts, though its other
 * threads may still be ending (waitid and the runtime thread see it only when
 * the last one has). Thread-safe. */
bool dk_job_any_rank_exited(dk_job_t *job);

/* Whether RANK was lost (silent past the heartbeat deadline). */
bool dk_job_rank_lost(dk_job_t *job, int rank);

/* The lost ranks grouped by node, for the user: "node2 lost (ranks 4–7)",
 * "node2 lost (rank 4); node3 lost (ranks 8, 10–11)" (runs of ranks with an
 * en dash, DK_EN_DASH). Empty when none was lost. Truncated to fit BUF. */
void dk_job_lost_summary(dk_job_t *job, char *buf, size_t len);

/* The Python stacks RANK showed when they were asked for (spec.stacks):
 * faulthandler's text, *LEN bytes, NUL-terminated; "" when it was asked and
 * did not answer in time (still starting, or stuck past a signal handler);
 * NULL when it was not asked (it had finished, failed or exited already, or
 * nothing was asked: the run ended by itself). Valid once the job has ended,
 * or on a persistent job once the round has, until the next round. */
const char *dk_job_rank_stacks(dk_job_t *job, int rank, size_t *len);

/* Ask the live ranks for their stacks now, as a stop would (spec.stacks,
 * the same files and STACKS frames, the same 2 s bound), but stopping
 * nothing: the runtime thread begins the request and goes on with its work
 * while the answers come, then hands them to sink.on_stacks, once; they are
 * not what dk_job_rank_stacks tells. For a host that shows where ranks that
 * have been silent for a while are. Nothing is asked, and on_stacks is not
 * called, when the job has no spec.stacks, is ending, a request is running,
 * or (persistent jobs) no round is; a stop or an interrupt that comes while
 * a sample runs takes its answers as its own. Returns at once; false when
 * the job has ended. Thread-safe. */
bool dk_job_sample_stacks(dk_job_t *job);

/* The address ranks were given in DISTKERNEL_BC (borrowed). */
const char *dk_job_bc_address(dk_job_t *job);

/* The directory holding rank-N.log (borrowed). */
const char *dk_job_log_dir(dk_job_t *job);

/* The MASTER_PORT given to the ranks; 0 when rank 0 picks it (DK_JOB_PORT_FROM_RANK0). */
int dk_job_master_port(dk_job_t *job);

/* ---- persistent jobs ---- */

/* Make LOG_DIR (created 0700, checked as for spec.log_dir) the directory of the
 * next round's rank-N.log files; output read from now on goes there. Call
 * between rounds. Returns -1 with ERR, keeping the old logs, when it cannot. */
int dk_job_set_log_dir(dk_job_t *job, const char *log_dir, char *err, size_t errlen);

/* The tracking server the gate leads to from now on (as spec.tunnel_upstream;
 * NULL: none). No-op for a job without agents. -1 with ERR when it is not a
 * numeric HOST:PORT. */
int dk_job_set_tunnel_upstream(dk_job_t *job, const char *upstream, char *err, size_t errlen);

/* Start the next round: every rank gets PAYLOAD (copied) in a TASK frame.
 * TIMEOUT_S (<= 0: none) interrupts the round when it passes. Returns -1 with
 * ERR when the job has ended, is ending, or a round is still running, or when
 * PAYLOAD is larger than a rank accepts (DK_FRAME_TASK_MAX, dk_frame.h). */
int dk_job_submit(dk_job_t *job, const void *payload, size_t len, double timeout_s, char *err,
                  size_t errlen);

/* Wait up to TIMEOUT_MS (-1: forever) for the current round to end (every rank
 * answered, or the job ended). Returns true when it has. */
bool dk_job_round_wait(dk_job_t *job, int timeout_ms);

/* How the last round ended: DK_END_NONE while it runs; DK_END_OK (every rank
 * sent RESULT), DK_END_FAILED (a rank raised: dk_job_round_root_cause),
 * DK_END_CANCELLED (dk_job_interrupt), DK_END_TIMEOUT; when the job ended during
 * the round, how the job ended (then dk_job_end is not DK_END_NONE). */
dk_job_end_t dk_job_round_end(dk_job_t *job);
int dk_job_round_root_cause(dk_job_t *job);

/* Interrupt the current round: SIGINT to every rank that has not answered; a
 * rank still not answering after the grace ends the job. Thread-safe. */
void dk_job_interrupt(dk_job_t *job);

/* Seconds since the last round ended (0 while one runs). */
double dk_job_idle_s(dk_job_t *job);

/* Cancel if still running, wait for the end, join the runtime thread, remove the
 * back-channel directory (not the logs), free. Sets *JOB_P to NULL. */
void dk_job_destroy(dk_job_t **job_p);

#endif
