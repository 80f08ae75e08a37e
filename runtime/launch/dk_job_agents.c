/*
 * dk_job_agents: a job whose ranks are started by node agents
 * (spec.agent_command, dk_job.h; the agent is runtime/agent/dk_agent.h).
 *
 * One launcher process (srun, one task per node) starts every agent; the
 * runtime watches its pipes (its own
 * lines, and what an agent says about itself, to agents.log in the log
 * folder, the last telling line kept), its exit. The agents' connections
 * are the back channel's (ids world_size + node); what they tell of their
 * ranks comes here: an exit (job_agent_exit, judged as a reaped rank is),
 * and the loss of an agent, which is its node's (job_agent_gone): every
 * rank of the node that had not ended is lost and judged at once, since no
 * exit will ever be told of it.
 */
#include "dk_job_state.h"
#include "dk_log.h"
#include "dk_clock.h"
#include "dk_err.h"
#include "dk_frame.h"
#include "dk_lost.h"

#include "dk_spawn.h"
#include "dk_tunnel.h"
#include "dk_utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/crypto.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define AGENT_VARS 13
/* The most of an agent's last words kept (bytes). */
#define AGENT_WORDS_MAX 1024

/* The gate to the tracking server (dk_tunnel.h), for every job with agents:
 * a persistent job may be given a server only later. Only the run's nodes
 * may come through, as for the back channel. A job without one is warned of. */
static void open_tracking_gate(dk_job_t *job, const dk_job_spec_t *spec)
{
    char why[512];
    unsigned char key[DK_FRAME_KEY_LEN];
    dk_accept_t *allow = NULL;
    if (spec->bc_allow_hosts &&
        (!(allow = dk_accept_new(spec->bc_allow_hosts, spec->bc_nallow, why, sizeof why)) ||
         !dk_accept_add_this_host(allow, spec->bc_tcp_addr)))
        dk_accept_destroy(&allow);
    if (spec->bc_allow_hosts && !allow)
        snprintf(why, sizeof why, "its nodes' addresses cannot be listed");
    else if (dk_frame_key_from_hex(dk_backchan_key_hex(job->chan), key) == 0)
        job->tunnel = dk_tunnel_gate_new(spec->bc_tcp_addr, key, spec->tunnel_upstream, allow,
                                         why, sizeof why);
    else
        snprintf(why, sizeof why, "the run's key is not one");
    OPENSSL_cleanse(key, sizeof key);
    if (!job->tunnel)
        job_warn(job, "ranks on other nodes will not reach a tracking server on this host: %s",
                 why);
}

/* The node agents' environment: BASE and what each agent is told of the
 * job (its DISTKERNEL_AGENT_* and back-channel variables), a new array
 * (dk_spawn_env_free), or NULL when out of memory. */
static char **agents_env(dk_job_t *job, const dk_job_spec_t *spec, const char *const *base,
                         const char *run_id)
{
    char vars[AGENT_VARS][160];
    const char *set[AGENT_VARS + 5];
    size_t k = 0;
#define SETF(...) (snprintf(vars[k], sizeof vars[k], __VA_ARGS__), set[k] = vars[k], k++)
    SETF("DISTKERNEL_AGENT_WORLD=%d", job->world_size);
    SETF("DISTKERNEL_AGENT_PER_NODE=%d", job->ranks_per_node);
    SETF("DISTKERNEL_AGENT_RUN_ID=%s", run_id);
    SETF("DISTKERNEL_AGENT_MASTER_ADDR=%s", job->master_addr ? job->master_addr : "127.0.0.1");
    SETF("DISTKERNEL_AGENT_MASTER_PORT=%d", job->master_port);
    SETF("DISTKERNEL_AGENT_GRACE=%g", job->stop.grace);
    SETF("DISTKERNEL_AGENT_STACKS=%d", job->stacks ? 1 : 0);
    SETF("DISTKERNEL_BC_KEY=%s", dk_backchan_key_hex(job->chan));
    SETF("DISTKERNEL_BC_HEARTBEAT=%g", job->heartbeat_s);
    SETF("DISTKERNEL_BC_CONNECT_TIMEOUT=%g", job->connect_timeout_s);
    if (job->tunnel)
        SETF(strchr(spec->bc_tcp_addr, ':') ? "DISTKERNEL_AGENT_TUNNEL=[%s]:%d"
                                            : "DISTKERNEL_AGENT_TUNNEL=%s:%d",
             spec->bc_tcp_addr, dk_tunnel_port(job->tunnel));
#undef SETF
    char *bc = NULL, *logs = NULL, *cwd = NULL, *mods = NULL, *wpath = NULL, here[PATH_MAX];
    if (asprintf(&bc, "DISTKERNEL_BC=%s", dk_backchan_address(job->chan)) < 0)
        bc = NULL;
    if (asprintf(&logs, "DISTKERNEL_AGENT_LOG_DIR=%s", job->log_dir) < 0)
        logs = NULL;
    if (getcwd(here, sizeof here) && asprintf(&cwd, "DISTKERNEL_CWD=%s", here) < 0)
        cwd = NULL;
    bool warm_ok = true;
    if (spec->agent_warm_modules) {
        warm_ok = asprintf(&mods, "DISTKERNEL_AGENT_WARM_MODULES=%s",
                           spec->agent_warm_modules) >= 0 &&
                  asprintf(&wpath, "DISTKERNEL_AGENT_WARM_PATH=%s",
                           spec->agent_warm_path ? spec->agent_warm_path : "") >= 0;
        if (!warm_ok)
            mods = wpath = NULL;
    }
    char **env = NULL;
    if (bc && logs && warm_ok) {
        set[k++] = bc;
        set[k++] = logs;
        if (cwd)
            set[k++] = cwd;
        if (mods) {
            set[k++] = mods;
            set[k++] = wpath;
        }
        env = dk_spawn_env_build(base, set, k);
    }
    free(bc);
    free(logs);
    free(cwd);
    free(mods);
    free(wpath);
    return env;
}

bool job_start_agents(dk_job_t *job, const dk_job_spec_t *spec, const char *const *base,
                      const char *run_id, char *err, size_t errlen)
{
    const char *const *cmd = spec->agent_command;
    if (!cmd || !cmd[0] || !spec->bc_tcp_addr || spec->ranks_per_node < 1) {
        dk_set_err(err, errlen, "node agents need a command, bc_tcp_addr and ranks_per_node");
        return false;
    }
    job->nagents = job->world_size / job->ranks_per_node;
    job->agent_hello = calloc((size_t) job->nagents, sizeof *job->agent_hello);
    job->agent_gone = calloc((size_t) job->nagents, sizeof *job->agent_gone);
    job->agent_words = calloc((size_t) job->nagents, sizeof *job->agent_words);
    job->agent_cold = calloc((size_t) job->nagents, sizeof *job->agent_cold);
    job->agents_filter[0] = dk_launchout_new();
    job->agents_filter[1] = dk_launchout_new();
    if (!job->agent_hello || !job->agent_gone || !job->agent_words || !job->agent_cold ||
        !job->agents_filter[0] ||
        !job->agents_filter[1]) {
        dk_set_err(err, errlen, "out of memory");
        return false;
    }
    char why[512];
    unlinkat(job->log_dirfd, "agents.log", 0);
    if (!(job->agents_log = dk_logfile_new(job->log_dirfd, "agents.log", job->log_cap, why,
                                           sizeof why)))
        job_warn(job, "the node agents' own lines will not be kept: %s", why);
    open_tracking_gate(job, spec);
    char **env = agents_env(job, spec, base, run_id);
    if (!env) {
        dk_set_err(err, errlen, "out of memory building the node agents' environment");
        return false;
    }
    char *launcher = dk_spawn_find_program(cmd[0], err, errlen);
    dk_spawned_t sp;
    int rc = launcher ? dk_spawn(launcher, (char *const *) cmd, env, &sp, why, sizeof why) : -1;
    dk_spawn_env_free(env);
    free(launcher);
    if (rc != 0) {
        if (launcher)
            dk_set_err(err, errlen, "cannot start the node agents: %s", why);
        return false;
    }
    job->agents_pid = sp.pid;
    job->agents_pidfd = sp.pidfd;
    job->agents_pipe[0] = sp.out_fd;
    job->agents_pipe[1] = sp.err_fd;
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        rk->by_agent = true;
        job->unreaped++;
    }
    return true;
}

int dk_job_set_tunnel_upstream(dk_job_t *job, const char *upstream, char *err, size_t errlen)
{
    return job->tunnel ? dk_tunnel_set_upstream(job->tunnel, upstream, err, errlen) : 0;
}

void job_agents_free(dk_job_t *job)
{
    dk_tunnel_destroy(&job->tunnel);
    job_close_fd(&job->agents_pidfd);
    job_close_fd(&job->agents_pipe[0]);
    job_close_fd(&job->agents_pipe[1]);
    dk_launchout_destroy(&job->agents_filter[0]);
    dk_launchout_destroy(&job->agents_filter[1]);
    dk_logfile_close(&job->agents_log);
    free(job->agents_line);
    free(job->agent_hello);
    free(job->agent_gone);
    free(job->agent_cold);
    free(job->agents_cold_why);
    for (int node = 0; job->agent_words && node < job->nagents; node++)
        free(job->agent_words[node]);
    free(job->agent_words);
}

/* Node NODE's agent starts its ranks cold, for WHY (dk_agent.h): said in
 * warm.log in the log folder as one line for the run, as the kernel says why
 * its own ranks start cold (dk_dist_warm_note). The line names every such
 * node, by index and, for the first AGENT_COLD_NAMED, by name, with the first
 * one's reason, and is rewritten as more nodes say so; each node's own line
 * is in agents.log. */
#define AGENT_COLD_NAMED 8
static void agent_cold(dk_job_t *job, int node, const char *why, size_t len)
{
    if (job->agent_cold[node])
        return;
    job->agent_cold[node] = true;
    job->agents_cold++;
    if (!job->agents_cold_why) {
        size_t keep = dk_utf8_complete_prefix(why, len > AGENT_WORDS_MAX ? AGENT_WORDS_MAX : len);
        size_t out_len = 0;
        job->agents_cold_why = dk_utf8_sanitize(why, keep, &out_len);
    }
    int *nodes = malloc((size_t) job->agents_cold * sizeof *nodes);
    if (!nodes)
        return;
    int n = 0;
    for (int k = 0; k < job->nagents && n < job->agents_cold; k++)
        if (job->agent_cold[k])
            nodes[n++] = k;
    char which[512] = "", names[512] = "";
    size_t at = 0;
    dk_ranks_format(nodes, (size_t) n, 3, which, sizeof which, &at);
    at = 0;
    int named = 0;
    for (int k = 0; k < n && named < AGENT_COLD_NAMED; k++) {
        const char *host = job->ranks[nodes[k] * job->ranks_per_node].host;
        if (!host)
            continue;
        int w = snprintf(names + at, sizeof names - at, "%s%s", named ? ", " : "", host);
        if (w < 0 || (size_t) w >= sizeof names - at)
            break;
        at += (size_t) w;
        named++;
    }
    if (named && named < n)
        snprintf(names + at, sizeof names - at, ", and %d more", n - named);
    const char *text = job->agents_cold_why ? job->agents_cold_why : "";
    if (getenv("DISTKERNEL_DEBUG"))
        dk_log("the ranks on node %d start cold: %s", node, text);
    int fd = openat(job->log_dirfd, "warm.log", O_WRONLY | O_TRUNC | O_CREAT | O_NOFOLLOW |
                    O_CLOEXEC, 0600);
    if (fd >= 0) {
        dprintf(fd, "the ranks on node%s %s%s%s%s started cold: %s (each node that did says "
                "why in agents.log)\n", n > 1 ? "s" : "", which, named ? " (" : "", names,
                named ? ")" : "", text);
        close(fd);
    }
    free(nodes);
}

/* An agent's own line (agent_main.c: "distkernel-agent: node K (HOST): WHY",
 * or without " (HOST)" where it has no name)
 * before it said AGENT_HELLO: it gives up without connecting (it cannot
 * reach the kernel, or its rank program is missing) and exits 2. Its words
 * are kept, for its node's ranks (job_agents_judge). */
static void agent_said(dk_job_t *job, const char *line, size_t len)
{
    static const char lead[] = "distkernel-agent: node ";
    const size_t lead_len = sizeof lead - 1;
    if (len <= lead_len || memcmp(line, lead, lead_len) != 0)
        return;
    size_t i = lead_len;
    long node = 0;
    size_t digits = 0;
    while (i < len && line[i] >= '0' && line[i] <= '9' && digits < 9)
        node = node * 10 + (line[i++] - '0'), digits++;
    if (i + 1 < len && line[i] == ' ' && line[i + 1] == '(') {   /* its node's name */
        const char *close = memchr(line + i, ')', len - i);
        if (!close)
            return;
        i = (size_t) (close - line) + 1;
    }
    if (!digits || i + 2 > len || line[i] != ':' || line[i + 1] != ' ' || node >= job->nagents)
        return;
    static const char cold[] = "ranks start cold: ";
    const size_t cold_len = sizeof cold - 1;
    if (len - (i + 2) > cold_len && memcmp(line + i + 2, cold, cold_len) == 0) {
        /* Not a reason to give up on the node (it may come before its hello
         * is seen here): its ranks run, cold. */
        agent_cold(job, (int) node, line + i + 2 + cold_len, len - (i + 2 + cold_len));
        return;
    }
    if (job->agent_hello[node] || job->agent_gone[node] || job->agent_words[node])
        return;
    size_t keep = dk_utf8_complete_prefix(line, len > AGENT_WORDS_MAX ? AGENT_WORDS_MAX : len);
    size_t out_len = 0;
    job->agent_words[node] = dk_utf8_sanitize(line, keep, &out_len);
}

/* The tasks' own bytes of the launcher's pipe WHICH, which arrive in
 * pieces: whole lines to agent_said. A line longer than the buffer is
 * no agent's. */
static void agent_bytes(dk_job_t *job, int which, const char *bytes, size_t len, bool end)
{
    agent_text_t *t = &job->agents_text[which];
    for (size_t i = 0; i < len; i++) {
        if (bytes[i] == '\n') {
            if (!t->overflow)
                agent_said(job, t->buf, t->len);
            t->len = 0;
            t->overflow = false;
        } else if (t->len < sizeof t->buf) {
            t->buf[t->len++] = bytes[i];
        } else {
            t->overflow = true;
        }
    }
    if (end) {
        if (!t->overflow)
            agent_said(job, t->buf, t->len);
        t->len = 0;
        t->overflow = false;
    }
}

/* The launcher's bytes: all to agents.log; its telling lines kept. */
static void agents_out(void *data, dk_launchout_kind_t kind, const char *bytes, size_t len)
{
    dk_job_t *job = data;
    if (job->agents_log && dk_logfile_write(job->agents_log, bytes, len) != 0)
        dk_logfile_close(&job->agents_log);
    if (kind == DK_LAUNCHOUT_RANK)
        agent_bytes(job, job->agents_feeding, bytes, len, false);
    if (kind == DK_LAUNCHOUT_RANK || !dk_launchout_tells(bytes, len))
        return;
    while (len > 0 && (bytes[len - 1] == '\n' || bytes[len - 1] == '\r'))
        len--;
    if (len > LAUNCHER_LINE_KEEP)
        len = dk_utf8_complete_prefix(bytes, LAUNCHER_LINE_KEEP);
    size_t out_len = 0;
    char *text = dk_utf8_sanitize(bytes, len, &out_len);
    if (text) {
        free(job->agents_line);
        job->agents_line = text;
    }
}

void job_agents_drain(dk_job_t *job, int which)
{
    char buf[65536];
    for (int k = 0; k < 64 && job->agents_pipe[which] >= 0; k++) {
        ssize_t n = read(job->agents_pipe[which], buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        job->agents_feeding = which;
        if (n <= 0) {
            dk_launchout_finish(job->agents_filter[which], agents_out, job);
            agent_bytes(job, which, NULL, 0, true);
            job_close_fd(&job->agents_pipe[which]);
            return;
        }
        dk_launchout_feed(job->agents_filter[which], buf, (size_t) n, agents_out, job);
    }
}

/* The launcher has exited: the agents that never connected never will
 * (job_agents_judge says so once its pipes are drained). */
void job_agents_reap(dk_job_t *job)
{
    if (job->agents_reaped || job->agents_pid <= 0)
        return;
    int status;
    pid_t got;
    do
        got = waitpid(job->agents_pid, &status, WNOHANG);
    while (got < 0 && errno == EINTR);
    if (got == 0)
        return;
    job->agents_reaped = true;
    job->agents_exited_at = dk_now_s();
    job_close_fd(&job->agents_pidfd);
    job_agents_drain(job, 0);
    job_agents_drain(job, 1);
    dk_backchan_drain(job->chan);
}

/* After the launcher's exit, what its tasks said may still be on its way
 * through srun's pipes (srun writes its own lines first): the agents that
 * never connected are judged once both pipes are at their end, or this long
 * after the exit (an srun helper that keeps them open). */
#define AGENTS_LAST_WORDS_S 2.0

bool job_agents_words_pending(const dk_job_t *job)
{
    return job->nagents > 0 && job->agents_reaped && !job->agents_exit_judged;
}

static void agents_never_came(dk_job_t *job)
{
    if (!job_agents_words_pending(job))
        return;
    if ((job->agents_pipe[0] >= 0 || job->agents_pipe[1] >= 0) &&
        dk_now_s() < job->agents_exited_at + AGENTS_LAST_WORDS_S)
        return;
    job->agents_exit_judged = true;
    for (int node = 0; node < job->nagents; node++) {
        if (job->agent_hello[node] || job->agent_gone[node] || job->agent_words[node])
            continue;       /* one that said why is judged below (job_agents_judge) */
        char why[LAUNCHER_LINE_KEEP + 128];
        snprintf(why, sizeof why, "its node agent never connected, and the agents' launcher "
                 "exited%s%s%s", job->agents_line ? " (\"" : "",
                 job->agents_line ? job->agents_line : "", job->agents_line ? "\")" : "");
        job_agent_gone(job, node, why);
    }
}

/* Agents that have not connected by the connect deadline, while their
 * launcher still runs: their nodes are lost (one at a time: the stop that
 * follows ends the rest). */
void job_agents_judge(dk_job_t *job)
{
    if (job->nagents == 0)
        return;
    agents_never_came(job);
    /* An agent that gave up without connecting said why: its node's ranks
     * end as a rank that could not start does (exit code 2, the agent's),
     * its words on the node's first rank's stderr, once. */
    for (int node = 0; node < job->nagents; node++) {
        if (!job->agent_words[node] || job->agent_gone[node] || job->agent_hello[node])
            continue;
        job->agent_gone[node] = true;
        int first = node * job->ranks_per_node;
        const char *words = job->agent_words[node];
        job_deliver(job, first, 2, words, strlen(words));
        job_deliver(job, first, 2, "\n", 1);
        for (int r = first; r < first + job->ranks_per_node; r++)
            if (!job->ranks[r].reaped && !job->ranks[r].exit_told)
                job_reaped(job, r, 2 << 8, true);
    }
    if (job->stop_reason != DK_END_NONE)
        return;
    if (dk_now_s() < job->started_at + job->connect_timeout_s + job->heartbeat_s)
        return;
    for (int node = 0; node < job->nagents; node++) {
        if (job->agent_hello[node] || job->agent_gone[node])
            continue;
        char why[160];
        snprintf(why, sizeof why, "its node agent had not connected %.0f s after the start: "
                 "its node may be down or its start stuck", job->connect_timeout_s);
        job_agent_gone(job, node, why);
        return;
    }
}

/* Every rank is judged: the agents are told (the channel closes) and exit;
 * the launcher gets the heartbeat deadline to follow (an srun may never
 * exit after a node loss: Slurm bug 16401), then SIGKILL. */
void job_agents_end(dk_job_t *job)
{
    if (job->agents_pid <= 0 || job->agents_reaped)
        return;
    dk_backchan_close_all(job->chan);
    double until = dk_now_s() + (job->heartbeat_s > 0 ? job->heartbeat_s : 5.0);
    while (!job->agents_reaped && dk_now_s() < until) {
        struct pollfd p[3] = {{job->agents_pidfd, POLLIN, 0}, {job->agents_pipe[0], POLLIN, 0},
                              {job->agents_pipe[1], POLLIN, 0}};
        int ms = (int) ((until - dk_now_s()) * 1000) + 1;
        if (poll(p, 3, job->agents_pidfd >= 0 ? ms : 50) < 0 && errno != EINTR)
            break;
        job_agents_drain(job, 0);
        job_agents_drain(job, 1);
        job_agents_reap(job);
    }
    if (!job->agents_reaped) {
        killpg(job->agents_pid, SIGKILL);
        waitpid(job->agents_pid, NULL, 0);
        job->agents_reaped = true;
    }
}

void job_agent_gone(dk_job_t *job, int node, const char *why)
{
    if (node < 0 || node >= job->nagents || job->agent_gone[node])
        return;
    job->agent_gone[node] = true;
    int first = node * job->ranks_per_node;
    bool told = false;
    for (int r = first; r < first + job->ranks_per_node; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->reaped || rk->exit_told)
            continue;       /* its exit was told (its verdict may wait: job_reaped) */
        if (!rk->lost) {
            if (!told)
                job_lose(job, r, why);      /* says so, and its node's mates */
            else {
                pthread_mutex_lock(&job->lock);
                rk->lost = true;
                pthread_mutex_unlock(&job->lock);
                if (job->sink.on_lost)
                    job->sink.on_lost(job->sink.data, r, rk->host);
                job_note_failure(job, r);
            }
            told = true;
        }
        job_judge_gone(job, r);
    }
}

void job_agent_exit(dk_job_t *job, int r, int exit_code, int term_signal)
{
    rank_t *rk = &job->ranks[r];
    if (!rk->by_agent || rk->reaped || rk->exit_told)
        return;
    /* Judged in the loop (job_agents_reap_told); its node's agent closing
     * meanwhile does not lose it. */
    rk->exit_told = true;
    rk->exit_status = exit_code >= 0 ? (exit_code & 0xff) << 8 : term_signal & 0x7f;
}

/* The exits agents told this turn, judged outside the channel's callbacks
 * (job_reaped reads the channel, which must not be read from inside itself). */
void job_agents_reap_told(dk_job_t *job)
{
    for (int r = 0; job->nagents > 0 && r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->by_agent && rk->exit_told && !rk->reaped)
            job_reaped(job, r, rk->exit_status, true);
    }
}
