/*
 * dk_agent: a node agent, the process that starts one node's ranks and
 * speaks for them (distkernel-agent, agent_main.c).
 *
 * A run over Slurm on N nodes is one srun step of N tasks, one per node
 * (docs/slurm.md says why), and each task is an agent. The agent:
 *   - connects to the kernel's back channel as a rank does (the key only in
 *     its environment) and says AGENT_HELLO for its node K (dk_frame.h);
 *   - starts its node's ranks, K * ranks_per_node to (K + 1) * ranks_per_node
 *     - 1, each forked and exec'd (dk_spawn: a process group of its own,
 *     PR_SET_PDEATHSIG, and a sentinel that ends the groups, children
 *     included, if the agent is killed) with the environment every rank gets
 *     (dk_rankenv.h), and says STARTED (its pid) for each;
 *   - reads each rank's stdout and stderr from the start (pipes: C-level
 *     writes and its children's included) and sends them as OUTPUT frames
 *     labelled by rank: what a rank wrote before its own channel was up, and
 *     whatever its children still write there;
 *   - sees each rank's exit (a pidfd) and, once its pipes are drained, says
 *     EXIT with its code or signal;
 *   - signals a rank's process group (or every rank's) when the kernel sends
 *     SIGNAL: the stop ladder stays the kernel's, which knows the job;
 *   - answers STACKS for a rank (or every rank) by sending the faulthandler
 *     signal on this node (dk_stackreq.h: a rank holding the GIL answers),
 *     and forwards each dump in a STACKS frame, "" when a rank did not answer
 *     within the wait;
 *   - sends a PING every DK_BC_PING_S; a kernel silent past the heartbeat
 *     deadline, or one that closed the connection, is gone: the agent ends
 *     its ranks with the stop ladder (SIGINT, SIGTERM, SIGKILL a grace apart)
 *     and exits 1 once they are reaped.
 * Once every rank has exited and been told, the agent shuts its side of the
 * connection and waits (at most the heartbeat deadline) for the kernel to
 * close it, so nothing it sent is in flight when it exits 0.
 *
 * The ranks do not open connections to the kernel: each connects to the
 * agent's relay (dk_relay.h, a Unix socket on this node), whose bytes the
 * agent carries on its one connection (RELAY frames), so to the rank its
 * channel is a local one and its output stays on the agent's pipes. What the
 * agent sends in a turn of its loop is written at once, at the turn's end.
 *
 * Warm start, as on one node: with a template (spec.template, which the
 * caller started before connecting, so that torch imports meanwhile), the
 * agent waits for it after AGENT_HELLO (PINGs going on, at most
 * warm_wait_s), asks it whether it can fork (dk_template_check), and gives
 * each rank DISTKERNEL_WARM_SOCKET: distkernel-rank, started as a cold rank
 * would be (same environment, group, pipes), has the template fork the rank
 * into its group and ends as the rank ended (rank_main.c). So the output,
 * exits, signals, stop ladder and stacks are the same for warm ranks. A
 * template that failed to import, is not ready in time or cannot fork is
 * ended, and the node's ranks start cold: the agent says so once, in one
 * line ("ranks start cold: WHY") that the kernel notes in the run's
 * warm.log. A SIGNAL for ranks not started yet is kept and sent to them
 * once they are; STACKS for them is answered "" at once.
 *
 * One thread, one poll loop; nothing here is thread-safe.
 */
#ifndef DK_AGENT_H
#define DK_AGENT_H

#include "dk_frame.h"
#include "dk_rankenv.h"
#include "dk_template.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    int node;                   /* K: this agent's node in the run, from 0 */
    const char *host;           /* this node's name, for the agent's own lines, or NULL */
    int world_size;
    int ranks_per_node;         /* >= 1, divides world_size */
    const char *rank_exe;       /* a path */
    char *const *rank_argv;     /* NULL: just the program */
    const char *const *base_env;/* the ranks' base environment (NULL: none) */
    /* The rest of each rank's environment: rank, log_path and stacks_path
     * are the agent's to fill; run_id, bc_address and bc_key_hex are needed. */
    dk_rankenv_t proto;
    const char *log_dir;        /* rank R's DISTKERNEL_LOG: LOG_DIR/rank-R.log */
    bool stacks;                /* give ranks a stacks file; answer STACKS */
    double stacks_wait_s;       /* <= 0: DK_STACKREQ_WAIT_S */
    int fd;                     /* the connection, its nonce already read */
    const unsigned char *key;   /* DK_FRAME_KEY_LEN bytes */
    const unsigned char *nonce; /* DK_FRAME_NONCE_LEN bytes */
    double heartbeat_s;         /* <= 0: DK_BC_HEARTBEAT_DEFAULT_S */
    /* The kernel's connect deadline (DISTKERNEL_BC_CONNECT_TIMEOUT): ranks not
     * connected by then are taken for lost; <= 0: none to keep to. */
    double connect_timeout_s;
    double grace_s;             /* the ladder's; <= 0: 2 s */
    int say_fd;                 /* where the agent's own lines go (its stderr), or -1 */
    /* This node's warm-start template, started by the caller as early as it
     * could be (dk_template_start: it imports while the agent connects), or
     * NULL: the ranks start cold. The caller destroys it after the run. */
    dk_template_t *template;
    /* The most to wait for it to be ready; < 0: DISTKERNEL_WARM_WAIT_S's
     * default (dk_setting.h). At most half of
     * connect_timeout_s, past which the kernel takes ranks for lost. */
    double warm_wait_s;
    /* Why no template could be started although the run asked for one (said
     * once, as a cold start's reason), or NULL. */
    const char *warm_failed;
} dk_agent_spec_t;

/* Run the agent to its end: 0 when every rank exited and the kernel closed
 * the connection after it was told; 1 when the kernel went away first (the
 * ranks were ended); 2 when nothing could be started (a line on say_fd). */
int dk_agent_run(const dk_agent_spec_t *spec);

/* Connect to ADDRESS (a Unix socket's path, "tcp:ADDR:PORT" or
 * "tcp:[ADDR]:PORT"), retrying with backoff until DEADLINE_S from now, and
 * read the runtime's nonce. Returns the descriptor (blocking, close-on-exec)
 * or -1 with a reason in ERR. */
int dk_agent_connect(const char *address, double deadline_s,
                     unsigned char nonce[DK_FRAME_NONCE_LEN], char *err, size_t errlen);

#endif
