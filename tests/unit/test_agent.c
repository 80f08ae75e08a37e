/*
 * The node agent (runtime/agent/dk_agent.h) against a fake runtime over a
 * socketpair: its frames (dk_frame.h), and its rank bookkeeping: which
 * ranks it starts, what they wrote labelled by rank, their exits and
 * signals, the kernel's SIGNAL and STACKS, and the end of its ranks when the
 * kernel goes silent or closes. Ranks are small shell and Python programs.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dk_agent.h"
#include "dk_backchan.h"
#include "dk_frame.h"
#include "dk_relay.h"
#include "dk_tidy.h"
#include "stranger.h"

static const unsigned char KEY[32] = "0123456789abcdef0123456789abcde";
static const unsigned char NONCE[32] = "nonce-nonce-nonce-nonce-nonce-n";
#define KEY_HEX "3031323334353637383961626364656630313233343536373839616263646500"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* ---- a fake runtime ---------------------------------------------------------------- */

typedef struct {
    int fd;
    pid_t agent;
    dk_frame_key_t *key;
    dk_frame_side_t side;   /* the kernel's side of the agent's connection */
    unsigned char in[1 << 20];
    size_t len;
    /* the last frame read */
    int type;
    uint32_t id;
    unsigned char payload[256 << 10];
    size_t plen;
} kern_t;

typedef struct {
    int node, world, per;
    const char *script;     /* sh -c SCRIPT, or NULL for the program below */
    const char *program;
    double heartbeat_s, grace_s, stacks_wait_s;
    bool stacks;
    const char *template;   /* a warm-start template program (a path), or NULL */
    double warm_wait_s;
    int say_fd;             /* where the agent's lines go; 0: stderr */
    const char *host;       /* the node's name for the agent's lines, or NULL */
} agent_opts_t;

/* The fake runtime's side of the connection, as the kernel's: it seals
 * toward the agent and opens what the agent sealed toward the runtime. */
static void kern_side_init(kern_t *k)
{
    k->key = dk_frame_key_new(KEY);
    cr_assert_not_null(k->key);
    dk_frame_side_init(&k->side, k->key, NONCE, DK_FRAME_DIR_TO_RANK);
}

static kern_t *agent_start(const agent_opts_t *o)
{
    kern_t *k = calloc(1, sizeof *k);
    cr_assert_not_null(k);
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    k->agent = fork();
    cr_assert_neq(k->agent, -1);
    if (k->agent == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* a test that fails leaves nothing */
        close(sv[0]);
        dk_template_t *t = NULL;
        if (o->template) {
            char err[512];
            const char *tenv[] = {"PATH=/usr/bin:/bin", NULL};
            t = dk_template_start(o->template, tenv, "torch", NULL, "", err, sizeof err);
            cr_assert_not_null(t, "%s", err);
        }
        char *argv[] = {"/bin/sh", "-c", (char *) o->script, NULL};
        const char *base[] = {"PATH=/usr/bin:/bin", "SLURM_STEP_ID=4", NULL};
        dk_agent_spec_t spec = {
            .node = o->node, .host = o->host, .world_size = o->world,
            .ranks_per_node = o->per, .rank_exe = o->program ? o->program : "/bin/sh",
            .rank_argv = o->program ? NULL : argv, .base_env = base,
            .proto = {.master_addr = "node1", .run_id = "run7", .bc_address = "tcp:1.2.3.4:5",
                      .bc_key_hex = KEY_HEX},
            .log_dir = "/logs/run", .stacks = o->stacks, .stacks_wait_s = o->stacks_wait_s,
            .fd = sv[1], .key = KEY, .nonce = NONCE,
            .heartbeat_s = o->heartbeat_s > 0 ? o->heartbeat_s : 30, .connect_timeout_s = 120,
            .grace_s = o->grace_s > 0 ? o->grace_s : 0.5, .say_fd = o->say_fd ? o->say_fd : 2,
            .template = t, .warm_wait_s = o->warm_wait_s > 0 ? o->warm_wait_s : -1,
        };
        int rc = dk_agent_run(&spec);
        dk_template_destroy(&t);
        dk_tidy_end();      /* as distkernel-agent ends: its folder watcher with it */
        _exit(rc);
    }
    close(sv[1]);
    k->fd = sv[0];
    kern_side_init(k);
    return k;
}

/* The next frame that is not a PING, within TIMEOUT_S; false at EOF. */
static bool next_frame(kern_t *k, double timeout_s)
{
    double until = now() + timeout_s;
    for (;;) {
        dk_frame_msg_t f;
        const char *why;
        long took = dk_frame_open(&k->side, k->in, k->len, 1 << 19, &f, NULL, &why);
        cr_assert_geq(took, 0, "the agent's frame did not open: %s", why);
        if (took > 0) {
            k->type = f.type;
            k->id = f.id;
            cr_assert_leq(f.len, sizeof k->payload);
            memcpy(k->payload, f.payload, f.len);
            k->plen = f.len;
            k->payload[f.len < sizeof k->payload ? f.len : 0] = '\0';
            memmove(k->in, k->in + took, k->len - (size_t) took);
            k->len -= (size_t) took;
            if (k->type == DK_FRAME_PING)
                continue;
            return true;
        }
        double left = until - now();
        cr_assert_gt(left, 0, "no frame from the agent within %g s", timeout_s);
        struct pollfd p = {.fd = k->fd, .events = POLLIN};
        if (poll(&p, 1, (int) (left * 1000) + 1) <= 0)
            continue;
        ssize_t n = recv(k->fd, k->in + k->len, sizeof k->in - k->len, 0);
        cr_assert_geq(n, 0);
        if (n == 0)
            return false;
        k->len += (size_t) n;
    }
}

static void send_to_agent(kern_t *k, int type, uint32_t id, const void *payload, size_t len)
{
    unsigned char buf[DK_FRAME_HEAD + 64];
    size_t n = dk_frame_seal(&k->side, type, id, payload, len, buf);
    cr_assert_eq(send(k->fd, buf, n, MSG_NOSIGNAL), (ssize_t) n);
}

static void send_signal(kern_t *k, uint32_t id, int sig)
{
    unsigned char p[4] = {0, 0, 0, (unsigned char) sig};
    send_to_agent(k, DK_FRAME_SIGNAL, id, p, 4);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

/* The agent's exit status within TIMEOUT_S. */
static int agent_wait(kern_t *k, double timeout_s)
{
    double until = now() + timeout_s;
    int status;
    pid_t got;
    while ((got = waitpid(k->agent, &status, WNOHANG)) == 0) {
        cr_assert_lt(now(), until, "the agent did not end within %g s", timeout_s);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cr_assert_eq(got, k->agent);
    cr_assert(WIFEXITED(status), "the agent died by signal %d", WTERMSIG(status));
    return WEXITSTATUS(status);
}

static void agent_free(kern_t *k)
{
    if (k->fd >= 0)
        close(k->fd);
    dk_frame_key_destroy(&k->key);
    free(k);
}

/* Per rank of a node of 2 (ranks BASE, BASE + 1): what arrived. */
typedef struct {
    char out[2][4096], err[2][4096];
    int exit_code[2], exit_signal[2];
    bool exited[2];
    bool exited_before_output[2];
    pid_t pid[2];
    int exits;
} seen_t;

static void take(kern_t *k, seen_t *s, uint32_t base)
{
    cr_assert(k->id == base || k->id == base + 1, "a frame for rank %u", k->id);
    int i = (int) (k->id - base);
    if (k->type == DK_FRAME_STARTED) {
        cr_assert_eq(k->plen, 4);
        s->pid[i] = (pid_t) be32(k->payload);
    } else if (k->type == DK_FRAME_OUTPUT) {
        cr_assert_geq(k->plen, 2);
        s->exited_before_output[i] |= s->exited[i];
        char *to = k->payload[0] == 1 ? s->out[i] : s->err[i];
        cr_assert(k->payload[0] == 1 || k->payload[0] == 2);
        strncat(to, (char *) k->payload + 2, 4000 - strlen(to));
    } else if (k->type == DK_FRAME_EXIT) {
        cr_assert_eq(k->plen, 8);
        s->exit_code[i] = (int) be32(k->payload);
        s->exit_signal[i] = (int) be32(k->payload + 4);
        s->exited[i] = true;
        s->exits++;
    } else {
        cr_assert_fail("an unexpected frame of type %d", k->type);
    }
}

Test(agent, starts_its_nodes_ranks_and_tells_their_output_and_exits, .timeout = 30)
{
    agent_opts_t o = {
        .node = 1, .world = 4, .per = 2,
        .script = "echo out $RANK $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE "
                  "$MASTER_ADDR $TORCHELASTIC_RUN_ID $DISTKERNEL_LOG $SLURM_STEP_ID; "
                  "echo err $RANK >&2; sh -c 'echo child of $RANK'; exit $((RANK + 3))",
    };
    kern_t *k = agent_start(&o);
    cr_assert(next_frame(k, 10));
    cr_expect_eq(k->type, DK_FRAME_AGENT_HELLO);
    cr_expect_eq(k->id, 1);
    cr_expect_eq(k->plen, 0);
    seen_t s = {0};
    while (s.exits < 2) {
        cr_assert(next_frame(k, 10));
        take(k, &s, 2);
    }
    cr_expect_str_eq(s.out[0], "out 2 0 1 4 2 node1 run7 /logs/run/rank-2.log 4\nchild of 2\n");
    cr_expect_str_eq(s.out[1], "out 3 1 1 4 2 node1 run7 /logs/run/rank-3.log 4\nchild of 3\n");
    cr_expect_str_eq(s.err[0], "err 2\n");
    cr_expect_str_eq(s.err[1], "err 3\n");
    cr_expect_eq(s.exit_code[0], 5);
    cr_expect_eq(s.exit_code[1], 6);
    cr_expect_eq(s.exit_signal[0], 0);
    cr_expect(s.pid[0] > 0 && s.pid[1] > 0 && s.pid[0] != s.pid[1]);
    cr_expect(!s.exited_before_output[0] && !s.exited_before_output[1],
              "a rank's output comes before its exit");
    /* Everything told: the agent shuts its side and waits for our close. */
    cr_expect(!next_frame(k, 10));
    close(k->fd);
    k->fd = -1;
    cr_expect_eq(agent_wait(k, 10), 0);
    agent_free(k);
}

Test(agent, signals_a_rank_or_every_rank_when_the_kernel_asks, .timeout = 30)
{
    agent_opts_t o = {.node = 0, .world = 2, .per = 2, .script = "echo up; exec sleep 60"};
    kern_t *k = agent_start(&o);
    cr_assert(next_frame(k, 10));
    cr_assert_eq(k->type, DK_FRAME_AGENT_HELLO);
    seen_t s = {0};
    while (strlen(s.out[0]) + strlen(s.out[1]) < 6) {
        cr_assert(next_frame(k, 10));
        take(k, &s, 0);
    }
    send_signal(k, 1, SIGTERM);
    while (!s.exited[1]) {
        cr_assert(next_frame(k, 10));
        take(k, &s, 0);
    }
    cr_expect_eq(s.exit_signal[1], SIGTERM);
    cr_expect_eq(s.exit_code[1], -1);
    cr_expect(!s.exited[0], "only rank 1 was signalled");
    send_signal(k, DK_FRAME_ALL_RANKS, SIGKILL);
    while (!s.exited[0]) {
        cr_assert(next_frame(k, 10));
        take(k, &s, 0);
    }
    cr_expect_eq(s.exit_signal[0], SIGKILL);
    close(k->fd);
    k->fd = -1;
    cr_expect_eq(agent_wait(k, 10), 0);
    agent_free(k);
}

/* Wait until PID is gone (reaped by the agent), at most TIMEOUT_S. */
static void expect_gone(pid_t pid, double timeout_s)
{
    double until = now() + timeout_s;
    while (kill(pid, 0) == 0) {
        cr_assert_lt(now(), until, "rank process %d still runs", (int) pid);
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Ranks that ignore SIGINT (the ladder must go on to SIGTERM), on a node of
 * 2; the agent started and both ranks' "up" read into S. */
#define DEAF_TO_SIGINT "trap '' INT; echo up; while :; do sleep 0.05; done"
static kern_t *agent_with_ranks_up(agent_opts_t *o, seen_t *s)
{
    kern_t *k = agent_start(o);
    cr_assert(next_frame(k, 10));
    while (strlen(s->out[0]) + strlen(s->out[1]) < 6) {
        cr_assert(next_frame(k, 10));
        take(k, s, 0);
    }
    return k;
}

static void ends_its_ranks_when_the_kernel_goes(bool close_it)
{
    agent_opts_t o = {.node = 0, .world = 2, .per = 2, .heartbeat_s = 2, .grace_s = 0.3,
                      .script = DEAF_TO_SIGINT};
    seen_t s = {0};
    kern_t *k = agent_with_ranks_up(&o, &s);
    double t0 = now();
    if (close_it) {
        close(k->fd);
        k->fd = -1;
    }
    /* Silent: we send no PING and read nothing more. */
    cr_expect_eq(agent_wait(k, 10), 1);
    double took = now() - t0;
    expect_gone(s.pid[0], 2);
    expect_gone(s.pid[1], 2);
    if (close_it)
        cr_expect_lt(took, 1.8, "a close is acted on at once, not after the deadline");
    else
        cr_expect_geq(took, 1.9, "a kernel is silent only past the deadline");
    agent_free(k);
}

Test(agent, ends_its_ranks_when_the_kernel_is_silent, .timeout = 30)
{
    ends_its_ranks_when_the_kernel_goes(false);
}

Test(agent, ends_its_ranks_when_the_kernel_closes, .timeout = 30)
{
    ends_its_ranks_when_the_kernel_goes(true);
}

Test(agent, a_sigterm_ends_its_ranks_tells_their_exits_and_ends_the_agent, .timeout = 30)
{
    /* Slurm ending the step: the agent does not die of SIGTERM, its ranks
     * (which ignore SIGINT here) are ended by the ladder, their exits are
     * told while the kernel listens, and the agent ends without waiting for
     * the kernel's close (its heartbeat deadline, 30 s here). */
    agent_opts_t o = {.node = 0, .world = 2, .per = 2, .grace_s = 0.3,
                      .script = DEAF_TO_SIGINT};
    seen_t s = {0};
    kern_t *k = agent_with_ranks_up(&o, &s);
    double t0 = now();
    cr_assert_eq(kill(k->agent, SIGTERM), 0);
    while (s.exits < 2) {
        cr_assert(next_frame(k, 10), "the agent closed before telling both exits");
        take(k, &s, 0);
    }
    cr_expect_eq(s.exit_signal[0], SIGTERM, "the ladder's second rung");
    cr_expect_eq(s.exit_signal[1], SIGTERM);
    cr_expect(!next_frame(k, 10), "a frame after the exits: type %d", k->type);
    cr_expect_eq(agent_wait(k, 10), 0, "every rank ended and was told");
    cr_expect_lt(now() - t0, 5, "the agent waited for the kernel's close");
    agent_free(k);
}

Test(agent, a_kernel_gone_has_the_stacks_folder_removed_before_the_ranks_end, .timeout = 30)
{
    /* Slurm SIGKILLs the step soon after a SIGKILLed kernel's job is
     * cancelled: the node's folders must not wait for the ranks' ladder. */
    agent_opts_t o = {.node = 0, .world = 2, .per = 2, .grace_s = 2, .stacks = true,
                      .script = "trap '' INT; echo \"up $DISTKERNEL_STACKS\"; "
                                "while :; do sleep 0.05; done"};
    kern_t *k = agent_start(&o);
    cr_assert(next_frame(k, 10));
    seen_t s = {0};
    while (!strchr(s.out[0], '\n')) {
        cr_assert(next_frame(k, 10));
        take(k, &s, 0);
    }
    char *path = strchr(s.out[0], '/');
    cr_assert_not_null(path, "%s", s.out[0]);
    *strchr(path, '\n') = '\0';
    *strrchr(path, '/') = '\0';    /* the folder of the rank's socket */
    cr_assert(strstr(path, "/distkernel-stacks-"), "%s", path);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "%s", path);
    close(k->fd);
    k->fd = -1;
    double t0 = now();
    while (stat(path, &st) == 0) {
        cr_assert_lt(now() - t0, 1.5, "%s still there while the ladder's SIGINT is ignored",
                     path);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    cr_expect_eq(kill(s.pid[0], 0), 0, "the folder went only when the ranks had ended");
    cr_expect_eq(agent_wait(k, 10), 1);
    agent_free(k);
}

/* A rank as distkernel-rank arms itself for stacks (dk_stackreq.h), sleeping
 * in a C call; local rank 1 never arms. */
#define STACKS_RANK                                                                     \
    "if [ $LOCAL_RANK = 1 ]; then echo up; exec sleep 60; fi\n"                          \
    "exec " PYTHON3 " -c '\n"                                                            \
    "import faulthandler, os, signal, sys, time\n"                                       \
    "f = open(os.environ[\"DISTKERNEL_STACKS\"], \"a\", buffering=1)\n"                  \
    "sig = signal.SIGRTMAX - 7\n"                                                        \
    "signal.signal(sig, lambda *a: f.write(\"distkernel stacks: end\\n\"))\n"            \
    "faulthandler.register(sig, file=f, all_threads=True, chain=True)\n"                 \
    "f.write(\"distkernel stacks: ready, pid %d\\n\" % os.getpid())\n"                   \
    "def waiting_in_a_cell():\n"                                                         \
    "    print(\"up\", flush=True)\n"                                                    \
    "    time.sleep(60)\n"                                                               \
    "waiting_in_a_cell()\n'"

Test(agent, answers_stacks_by_signalling_its_ranks_here, .timeout = 40)
{
    agent_opts_t o = {.node = 3, .world = 8, .per = 2, .stacks = true, .stacks_wait_s = 1.0,
                      .script = STACKS_RANK};
    kern_t *k = agent_start(&o);
    cr_assert(next_frame(k, 10));
    seen_t s = {0};
    while (strlen(s.out[0]) + strlen(s.out[1]) < 6) {
        cr_assert(next_frame(k, 20));
        take(k, &s, 6);
    }
    send_to_agent(k, DK_FRAME_STACKS, DK_FRAME_ALL_RANKS, NULL, 0);
    char dump[2][8192] = {"", ""};
    bool got[2] = {false, false};
    while (!got[0] || !got[1]) {
        cr_assert(next_frame(k, 10));
        cr_assert_eq(k->type, DK_FRAME_STACKS, "type %d", k->type);
        cr_assert(k->id == 6 || k->id == 7);
        size_t len = k->plen < sizeof dump[0] - 1 ? k->plen : sizeof dump[0] - 1;
        memcpy(dump[k->id - 6], k->payload, len);
        dump[k->id - 6][len] = '\0';
        got[k->id - 6] = true;
    }
    cr_expect(strstr(dump[0], "waiting_in_a_cell"), "rank 6's stacks: %s", dump[0]);
    cr_expect_str_eq(dump[1], "", "rank 7 never armed: asked, no answer");
    send_signal(k, DK_FRAME_ALL_RANKS, SIGKILL);
    while (s.exits < 2) {
        cr_assert(next_frame(k, 10));
        take(k, &s, 6);
    }
    close(k->fd);
    k->fd = -1;
    cr_expect_eq(agent_wait(k, 10), 0);
    agent_free(k);
}

/* A rank as distkernel-rank arms its sampler thread (python/distkernel/_rankstacks.py):
 * the thread blocks DK_SAMPLE_SIGNAL and takes it with sigwait. Local rank 1
 * has no sampler (its ready line names none). Neither arms DK_STACKS_SIGNAL:
 * its default action ends the rank, so a sample sent as the ending dump's
 * signal would show as an exit. */
#define SAMPLER_RANK                                                                    \
    "exec " PYTHON3 " -c '\n"                                                            \
    "import faulthandler, os, signal, threading, time\n"                                 \
    "f = open(os.environ[\"DISTKERNEL_STACKS\"], \"a\", buffering=1)\n"                  \
    "sig = signal.SIGRTMAX - 6\n"                                                        \
    "tid = []\n"                                                                         \
    "up = threading.Event()\n"                                                           \
    "def answer():\n"                                                                    \
    "    signal.pthread_sigmask(signal.SIG_BLOCK, {sig})\n"                              \
    "    tid.append(threading.get_native_id())\n"                                        \
    "    up.set()\n"                                                                     \
    "    while True:\n"                                                                  \
    "        signal.sigwait({sig})\n"                                                    \
    "        faulthandler.dump_traceback(file=f, all_threads=True)\n"                    \
    "        f.write(\"distkernel stacks: end\\n\")\n"                                   \
    "signal.signal(sig, lambda *a: None)\n"                                              \
    "if os.environ[\"LOCAL_RANK\"] == \"0\":\n"                                          \
    "    threading.Thread(target=answer, daemon=True).start()\n"                         \
    "    up.wait(5)\n"                                                                   \
    "    f.write(\"distkernel stacks: ready, pid %d, sampler %d\\n\" % (os.getpid(), tid[0]))\n" \
    "else:\n"                                                                            \
    "    f.write(\"distkernel stacks: ready, pid %d\\n\" % os.getpid())\n"               \
    "def sampled_in_a_cell():\n"                                                         \
    "    print(\"up\", flush=True)\n"                                                    \
    "    time.sleep(60)\n"                                                               \
    "sampled_in_a_cell()\n'"

Test(agent, samples_a_rank_through_its_sampler_thread_only, .timeout = 40)
{
    agent_opts_t o = {.node = 3, .world = 8, .per = 2, .stacks = true, .stacks_wait_s = 1.0,
                      .script = SAMPLER_RANK};
    kern_t *k = agent_start(&o);
    cr_assert(next_frame(k, 10));   /* its AGENT_HELLO */
    seen_t s = {0};
    while (strlen(s.out[0]) + strlen(s.out[1]) < 6) {
        cr_assert(next_frame(k, 20));
        take(k, &s, 6);
    }
    for (int round = 0; round < 2; round++) {
        unsigned char sample[4] = {0, 0, 0, DK_FRAME_STACKS_SAMPLE};
        send_to_agent(k, DK_FRAME_STACKS, DK_FRAME_ALL_RANKS, sample, sizeof sample);
        char dump[2][8192] = {"", ""};
        bool got[2] = {false, false};
        while (!got[0] || !got[1]) {
            cr_assert(next_frame(k, 10));
            cr_assert_eq(k->type, DK_FRAME_STACKS, "type %d (a rank signalled as for the end "
                         "exits)", k->type);
            cr_assert(k->id == 6 || k->id == 7);
            size_t len = k->plen < sizeof dump[0] - 1 ? k->plen : sizeof dump[0] - 1;
            memcpy(dump[k->id - 6], k->payload, len);
            dump[k->id - 6][len] = '\0';
            got[k->id - 6] = true;
        }
        cr_expect(strstr(dump[0], "sampled_in_a_cell"), "rank 6's sample: %s", dump[0]);
        cr_expect_str_eq(dump[1], "", "rank 7 has no sampler: not signalled, no answer");
    }
    cr_expect_eq(s.exits, 0, "a sample ended a rank");
    send_signal(k, DK_FRAME_ALL_RANKS, SIGKILL);
    while (s.exits < 2) {
        cr_assert(next_frame(k, 10));
        take(k, &s, 6);
    }
    close(k->fd);
    k->fd = -1;
    cr_expect_eq(agent_wait(k, 10), 0);
    agent_free(k);
}

Test(agent, a_rank_that_cannot_start_ends_the_agent_at_once, .timeout = 30)
{
    agent_opts_t o = {.node = 0, .world = 2, .per = 2, .program = "/nonexistent/rank"};
    kern_t *k = agent_start(&o);
    cr_assert(next_frame(k, 10));
    cr_expect_eq(k->type, DK_FRAME_AGENT_HELLO);
    cr_expect_eq(agent_wait(k, 10), 2);
    agent_free(k);
    agent_opts_t bad = {.node = 2, .world = 4, .per = 2, .script = "exit 0"};
    k = agent_start(&bad);
    cr_expect_eq(agent_wait(k, 10), 2, "node 2 of 2 nodes is not in the run");
    agent_free(k);
}

/* ---- warm start ------------------------------------------------------------------- */

/* A program file in a fresh folder (the template is started from a path). */
static char *program_file(char dir[static 32], const char *body)
{
    snprintf(dir, 32, "/tmp/dk-agent-warm-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    char *path = NULL;
    cr_assert_geq(asprintf(&path, "%s/template", dir), 0);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(body, f);
    fclose(f);
    cr_assert_eq(chmod(path, 0700), 0);
    return path;
}

static void program_free(char *dir, char *path)
{
    unlink(path);
    rmdir(dir);
    free(path);
}

/* Everything the agent said, once it has exited (its say_fd's read end). */
static void said(int fd, char *out, size_t len)
{
    size_t n = 0;
    ssize_t r;
    while (n + 1 < len && (r = read(fd, out + n, len - 1 - n)) > 0)
        n += (size_t) r;
    out[n] = '\0';
    close(fd);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* An agent of O started with its say_fd a pipe whose read end goes to *SAY,
 * and its AGENT_HELLO read. */
static kern_t *warm_agent_start(agent_opts_t *o, int *say)
{
    int p[2];
    cr_assert_eq(pipe2(p, O_CLOEXEC), 0);
    o->say_fd = p[1];
    kern_t *k = agent_start(o);
    close(p[1]);
    cr_assert(next_frame(k, 10));
    cr_assert_eq(k->type, DK_FRAME_AGENT_HELLO);
    *say = p[0];
    return k;
}

/* The kernel's side closed, the agent's clean exit, and what it said. */
static void warm_agent_end(kern_t *k, int say, char *lines, size_t len)
{
    close(k->fd);
    k->fd = -1;
    cr_expect_eq(agent_wait(k, 10), 0);
    said(say, lines, len);
}

/* A rank that says whether it was given a template, and stays on as local rank 1. */
#define WARM_PROBE_RANK \
    "echo \"$RANK ${DISTKERNEL_WARM_SOCKET:-cold}\"; [ $LOCAL_RANK = 0 ] && exit 0; exec sleep 30"

Test(agent, a_template_that_fails_to_import_starts_the_ranks_cold_and_says_so_once,
     .timeout = 30)
{
    char dir[32];
    char *tmpl = program_file(dir, "#!/bin/sh\necho \"could not import warm module 'torch': "
                                   "ModuleNotFoundError\" >&2\nexit 3\n");
    agent_opts_t o = {.node = 0, .world = 2, .per = 2, .template = tmpl, .host = "node7",
                      .script = "echo \"$RANK ${DISTKERNEL_WARM_SOCKET:-cold}\""};
    int say;
    kern_t *k = warm_agent_start(&o, &say);
    seen_t s = {0};
    while (s.exits < 2) {
        cr_assert(next_frame(k, 20));
        take(k, &s, 0);
    }
    cr_expect_str_eq(s.out[0], "0 cold\n");
    cr_expect_str_eq(s.out[1], "1 cold\n");
    cr_expect_eq(s.exit_code[0], 0);
    char lines[4096];
    warm_agent_end(k, say, lines, sizeof lines);
    cr_expect_eq(count(lines, "ranks start cold: "), 1, "once for the node: %s", lines);
    /* Named as the user knows the node: by its index in the run and its name. */
    cr_expect(strstr(lines, "distkernel-agent: node 0 (node7): ranks start cold: the warm-start "
                            "template exited with code 3: could not import warm module 'torch'"),
              "%s",
              lines);
    agent_free(k);
    program_free(dir, tmpl);
}

Test(agent, while_the_template_imports_the_kernel_is_heard_and_its_asks_are_kept, .timeout = 30)
{
    char dir[32];
    char *tmpl = program_file(dir, "#!/bin/sh\nexec sleep 30\n");
    /* A wait past the heartbeat deadline: the PINGs go on meanwhile. */
    agent_opts_t o = {.node = 0, .world = 2, .per = 2, .template = tmpl,
                      .warm_wait_s = 2.5, .heartbeat_s = 1.5, .stacks = true,
                      .script = WARM_PROBE_RANK};
    int say;
    kern_t *k = warm_agent_start(&o, &say);
    /* Before any rank started: a stop for rank 1 and stacks for both. */
    send_signal(k, 1, SIGTERM);
    send_to_agent(k, DK_FRAME_STACKS, DK_FRAME_ALL_RANKS, NULL, 0);
    bool stacks[2] = {false, false};
    while (!stacks[0] || !stacks[1]) {
        cr_assert(next_frame(k, 2));
        cr_assert_eq(k->type, DK_FRAME_STACKS, "type %d before the ranks start", k->type);
        cr_expect_eq(k->plen, 0, "a rank not started has no stacks");
        stacks[k->id] = true;
    }
    /* Heard and PINGed through the wait: the agent is still ours. */
    double t0 = now();
    while (now() - t0 < 2.0) {
        send_to_agent(k, DK_FRAME_PING, 0, NULL, 0);
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    seen_t s = {0};
    while (s.exits < 2) {
        cr_assert(next_frame(k, 10));
        take(k, &s, 0);
        send_to_agent(k, DK_FRAME_PING, 0, NULL, 0);
    }
    cr_expect_str_eq(s.out[0], "0 cold\n");
    cr_expect_eq(s.exit_code[0], 0);
    cr_expect_eq(s.exit_signal[1], SIGTERM, "the stop that came before rank 1 started");
    char lines[4096];
    warm_agent_end(k, say, lines, sizeof lines);
    cr_expect_eq(count(lines, "ranks start cold: "), 1, "%s", lines);
    cr_expect(strstr(lines, "ranks start cold: this node's template was not ready after 2.5 s"),
              "%s", lines);
    cr_expect(!strstr(lines, "silent"), "%s", lines);
    agent_free(k);
    program_free(dir, tmpl);
}

Test(agent, a_stop_for_every_rank_ends_the_wait_for_the_template, .timeout = 30)
{
    char dir[32];
    char *tmpl = program_file(dir, "#!/bin/sh\nexec sleep 30\n");
    /* A wait longer than the test's own timeout: only the stop can end it. */
    agent_opts_t o = {.node = 0, .world = 2, .per = 2, .template = tmpl,
                      .warm_wait_s = 60, .script = "exec sleep 30"};
    int say;
    kern_t *k = warm_agent_start(&o, &say);
    send_signal(k, DK_FRAME_ALL_RANKS, SIGTERM);
    seen_t s = {0};
    while (s.exits < 2) {
        cr_assert(next_frame(k, 20));
        take(k, &s, 0);
    }
    cr_expect_eq(s.exit_signal[0], SIGTERM);
    cr_expect_eq(s.exit_signal[1], SIGTERM);
    char lines[4096];
    warm_agent_end(k, say, lines, sizeof lines);
    cr_expect_eq(count(lines, "ranks start cold: "), 1, "%s", lines);
    cr_expect(strstr(lines, "ranks start cold: the run was stopped while this node's template "
                            "imported"), "%s", lines);
    agent_free(k);
    program_free(dir, tmpl);
}

/* A template that is ready and says it can fork ("P" -> "ok 0"). */
#define FAKE_TEMPLATE                                                                   \
    "#!" PYTHON3 "\n"                                                                    \
    "import os, socket\n"                                                                \
    "s = socket.socket(socket.AF_UNIX)\n"                                                \
    "s.bind(os.environ['DISTKERNEL_TEMPLATE'])\n"                                        \
    "s.listen(8)\n"                                                                      \
    "print('\\nready', flush=True)\n"                                                   \
    "while True:\n"                                                                      \
    "    c, _ = s.accept()\n"                                                            \
    "    if c.recv(8)[:1] == b'P':\n"                                                    \
    "        c.sendall(b'ok 0\\n')\n"                                                    \
    "    c.close()\n"

Test(agent, a_template_that_can_fork_is_named_to_every_rank, .timeout = 30)
{
    char dir[32];
    char *tmpl = program_file(dir, FAKE_TEMPLATE);
    agent_opts_t o = {.node = 1, .world = 4, .per = 2, .template = tmpl,
                      .script = "echo \"$RANK ${DISTKERNEL_WARM_SOCKET:-cold}\""};
    int say;
    kern_t *k = warm_agent_start(&o, &say);
    seen_t s = {0};
    while (s.exits < 2) {
        cr_assert(next_frame(k, 20));
        take(k, &s, 2);
    }
    const char *sock = strchr(s.out[0], ' ');
    cr_assert_not_null(sock, "%s", s.out[0]);
    cr_expect(strstr(sock, "/distkernel-warm-") && strstr(sock, "/template\n"), "%s", s.out[0]);
    char want[4200];
    snprintf(want, sizeof want, "3%s", sock);
    cr_expect_str_eq(s.out[1], want, "one template for the node's ranks");
    char lines[4096];
    warm_agent_end(k, say, lines, sizeof lines);
    cr_expect(!strstr(lines, "cold"), "%s", lines);
    agent_free(k);
    program_free(dir, tmpl);
}

/* ---- the program --------------------------------------------------------------------- */

Test(agent, the_program_connects_with_its_environment_and_says_hello, .timeout = 30)
{
    char dir[] = "/tmp/dk-agent-test-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[64];
    snprintf(path, sizeof path, "%s/bc", dir);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    snprintf(sun.sun_path, sizeof sun.sun_path, "%s", path);
    cr_assert_eq(bind(lfd, (struct sockaddr *) &sun, sizeof sun), 0);
    cr_assert_eq(listen(lfd, 4), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char bc[160];
        snprintf(bc, sizeof bc, "DISTKERNEL_BC=%s", path);
        char *env[] = {bc, "DISTKERNEL_BC_KEY=" KEY_HEX, "SLURM_NODEID=1",
                       "DISTKERNEL_AGENT_WORLD=2", "DISTKERNEL_AGENT_PER_NODE=1",
                       "DISTKERNEL_AGENT_RUN_ID=r", "DISTKERNEL_AGENT_LOG_DIR=/l",
                       "PATH=/usr/bin:/bin", NULL};
        char *argv[] = {AGENT_EXE, "/bin/sh", "-c",
                        "echo $RANK $SLURM_NODEID ${DISTKERNEL_AGENT_WORLD:-none} "
                        "${#DISTKERNEL_BC_KEY}", NULL};
        execve(AGENT_EXE, argv, env);
        _exit(127);
    }
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(send(fd, NONCE, 32, 0), 32);
    kern_t *k = calloc(1, sizeof *k);
    k->fd = fd;
    k->agent = pid;
    kern_side_init(k);
    cr_assert(next_frame(k, 10));
    cr_expect_eq(k->type, DK_FRAME_AGENT_HELLO);
    cr_expect_eq(k->id, 1, "the node is the step's SLURM_NODEID");
    /* The run's key is not in the block /proc shows for the agent's life
     * (issue 38); its rank still gets it (64 hex digits, below). */
    char environ_path[64], block[8192];
    snprintf(environ_path, sizeof environ_path, "/proc/%d/environ", (int) pid);
    int efd = open(environ_path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(efd, 0);
    ssize_t got = read(efd, block, sizeof block - 1);
    close(efd);
    cr_assert_gt(got, 0);
    cr_expect_null(memmem(block, (size_t) got, KEY_HEX, strlen(KEY_HEX)),
                   "the agent's /proc/PID/environ shows the run's key");
    char out[256] = "";
    bool exited = false;
    while (!exited) {
        cr_assert(next_frame(k, 10));
        cr_assert_eq(k->id, 1, "node 1 of one rank a node runs rank 1");
        if (k->type == DK_FRAME_OUTPUT)
            strncat(out, (char *) k->payload + 2, sizeof out - strlen(out) - 1);
        exited = k->type == DK_FRAME_EXIT;
    }
    cr_expect_str_eq(out, "1 1 none 64\n", "its own variables are not the rank's; the key is");
    close(k->fd);
    k->fd = -1;
    cr_expect_eq(agent_wait(k, 10), 0);
    agent_free(k);
    close(lfd);
    unlink(path);
    rmdir(dir);
}

/* ---- the relay of the ranks' connections (dk_relay.h) ---------------------------- */

/* A rank that connects to its DISTKERNEL_BC, reads what the kernel relays
 * ("go"), writes 200 KB to fd 1 in one write (its pipe enlarged to take it
 * at once) and then answers on its connection, and exits at its end of file.
 * Its agent (its parent) is stopped meanwhile, so that it wakes to both the
 * output and the answer waiting. */
static const char RELAY_RANK[] =
    "#!/usr/bin/python3\n"
    "import fcntl, os, signal, socket\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect(os.environ['DISTKERNEL_BC'])\n"
    "assert s.recv(2) == b'go'\n"
    "fcntl.fcntl(1, 1031, 1 << 20)\n"
    "os.kill(os.getppid(), signal.SIGSTOP)\n"
    "assert os.write(1, b'x' * 200000) == 200000\n"
    "s.sendall(b'answer from ' + os.environ['RANK'].encode())\n"
    "os.kill(os.getppid(), signal.SIGCONT)\n"
    "assert s.recv(1) == b''\n"
    "print('bye', os.environ['DISTKERNEL_BC'].startswith('tcp:'), flush=True)\n";

Test(agent, relays_its_ranks_connections_their_output_first, .timeout = 30)
{
    char dir[32];
    char *program = program_file(dir, RELAY_RANK);
    agent_opts_t o = {.node = 0, .world = 1, .per = 1, .program = program};
    kern_t *k = agent_start(&o);
    cr_assert(next_frame(k, 10));
    cr_assert_eq(k->type, DK_FRAME_AGENT_HELLO);
    uint32_t stream = UINT32_MAX;
    size_t out = 0;
    char answer[64] = "", bye[64] = "";
    bool exited = false, ended = false;
    while (!exited) {
        cr_assert(next_frame(k, 10));
        if (k->type == DK_FRAME_STARTED)
            continue;
        if (k->type == DK_FRAME_RELAY && k->plen == 0) {
            /* A new connection: the rank's. The kernel's bytes go to it. */
            cr_assert_eq(stream, UINT32_MAX, "a second stream");
            stream = k->id;
            send_to_agent(k, DK_FRAME_RELAY, stream, "go", 2);
        } else if (k->type == DK_FRAME_RELAY) {
            cr_assert_eq(k->id, stream);
            cr_assert_eq(out, 200000, "the answer came before the rank's output (%zu bytes)",
                         out);
            strncat(answer, (char *) k->payload, sizeof answer - strlen(answer) - 1);
            if (!ended) {
                send_to_agent(k, DK_FRAME_RELAY_END, stream, NULL, 0);   /* its cue to exit */
                ended = true;
            }
        } else if (k->type == DK_FRAME_OUTPUT) {
            cr_assert_eq(k->id, 0);
            if (k->payload[2] == 'x')
                out += k->plen - 2;
            else
                strncat(bye, (char *) k->payload + 2, sizeof bye - strlen(bye) - 1);
        } else if (k->type == DK_FRAME_RELAY_END) {
            cr_assert_fail("the agent ended a stream the kernel had ended");
        } else {
            cr_assert_eq(k->type, DK_FRAME_EXIT, "type %d", k->type);
            cr_assert_eq(be32(k->payload), 0, "the rank exited %d", (int) be32(k->payload));
            exited = true;
        }
    }
    cr_expect_str_eq(answer, "answer from 0");
    cr_expect_str_eq(bye, "bye False\n", "the rank's channel is its agent's relay");
    cr_expect(!next_frame(k, 10));
    close(k->fd);
    k->fd = -1;
    cr_expect_eq(agent_wait(k, 10), 0);
    agent_free(k);
    program_free(dir, program);
}

/* A rank that opens its relay's folder and socket to everyone, has another
 * user (nobody) connect and speak there, says what became of that
 * connection, then connects itself and waits for the kernel's "go". */
static const char STRANGER_AT_THE_RELAY[] =
    "#!/usr/bin/python3\n"
    "import os, socket\n"
    "path = os.environ['DISTKERNEL_BC']\n"
    "os.chmod(os.path.dirname(path), 0o711)\n"
    "os.chmod(path, 0o777)\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.setresgid(65534, 65534, 65534)\n"
    "    os.setresuid(65534, 65534, 65534)\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    s.settimeout(5)\n"
    "    s.connect(path)\n"
    "    try:\n"
    "        s.sendall(b'x' * 37)\n"
    "        got = s.recv(1)\n"
    "    except ConnectionError:\n"
    "        got = b''\n"
    "    print('stranger', 'closed' if got == b'' else repr(got), flush=True)\n"
    "    os._exit(0)\n"
    "os.waitpid(pid, 0)\n"
    "s = socket.socket(socket.AF_UNIX)\n"
    "s.connect(path)\n"
    "assert s.recv(2) == b'go'\n"
    "print('rank heard go', flush=True)\n";

/* Issue 38, item 2: the relay's accept checks the peer's uid too, so
 * another user's connection never becomes a stream, even were the folder
 * open to them. */
Test(agent, the_relay_closes_another_users_connection_and_relays_the_ranks, .timeout = 30)
{
    if (geteuid() != 0)
        cr_skip_test("acting as another user needs root");
    char dir[32];
    char *program = program_file(dir, STRANGER_AT_THE_RELAY);
    agent_opts_t o = {.node = 0, .world = 1, .per = 1, .program = program};
    kern_t *k = agent_start(&o);
    cr_assert(next_frame(k, 10));
    cr_assert_eq(k->type, DK_FRAME_AGENT_HELLO);
    int streams = 0;
    char out[256] = "";
    bool exited = false;
    while (!exited) {
        cr_assert(next_frame(k, 15));
        if (k->type == DK_FRAME_RELAY && k->plen == 0) {
            streams++;
            send_to_agent(k, DK_FRAME_RELAY, k->id, "go", 2);
        } else if (k->type == DK_FRAME_OUTPUT) {
            strncat(out, (char *) k->payload + 2, sizeof out - strlen(out) - 1);
        } else if (k->type == DK_FRAME_EXIT) {
            exited = true;
        }
    }
    cr_expect_eq(streams, 1, "another user's connection became a stream; output: %s", out);
    cr_expect(strstr(out, "stranger closed\n") && strstr(out, "rank heard go\n"), "%s", out);
    close(k->fd);
    k->fd = -1;
    agent_wait(k, 10);
    agent_free(k);
    program_free(dir, program);
}

/* ---- another user where the agent's folders were (issue 38, item 2) ------------- */

/* As it was reproduced: the kernel goes away while a rank of the node is
 * still starting (held here until the test lets it go on), and the agent
 * removes its template's folder at once; another user makes the folder
 * again and binds a socket at the template's path; then the rank asks it
 * for a fork. The request would hold the rank's environment (the run's key,
 * an exported HF_TOKEN) and its output descriptors: the rank must send that
 * socket nothing. */
Test(agent, a_slow_rank_sends_nothing_to_a_template_another_user_put_in_its_place,
     .timeout = 90)
{
    if (geteuid() != 0)
        cr_skip_test("acting as another user needs root");
    char dir[32];
    char *tmpl = program_file(dir, FAKE_TEMPLATE);
    char go[64], script[1024];
    snprintf(go, sizeof go, "%s/go", dir);
    snprintf(script, sizeof script,
             "echo \"sock $DISTKERNEL_WARM_SOCKET\"; trap '' INT TERM; "
             "while [ ! -e %s ]; do sleep 0.02; done; unset SLURM_STEP_ID; "
             "HF_TOKEN=hf_secret_of_the_victim ASAN_OPTIONS=detect_leaks=0 exec %s",
             go, RANK_EXE);
    /* Its stop ladder's SIGKILL comes 2 graces after the kernel's end: 20 s,
     * time enough on a loaded machine for the stranger to listen and the
     * rank to reach it (a SIGKILL first, the test would prove nothing). */
    agent_opts_t o = {.node = 0, .world = 1, .per = 1, .template = tmpl, .grace_s = 10,
                      .script = script};
    int say;
    kern_t *k = warm_agent_start(&o, &say);
    char sock[256] = "";
    while (!sock[0]) {
        cr_assert(next_frame(k, 20));
        if (k->type == DK_FRAME_OUTPUT && k->plen > 7 && !memcmp(k->payload + 2, "sock /", 6))
            snprintf(sock, sizeof sock, "%.*s", (int) k->plen - 8, (char *) k->payload + 7);
    }
    /* The kernel goes; the template's folder with it. */
    close(k->fd);
    k->fd = -1;
    char folder[256];
    snprintf(folder, sizeof folder, "%s", sock);
    *strrchr(folder, '/') = '\0';
    struct stat st;
    for (int i = 0; i < 500 && stat(folder, &st) == 0; i++)
        usleep(10000);
    cr_assert_neq(stat(folder, &st), 0, "the agent kept %s after its kernel went", folder);
    stranger_t s = stranger_listens(sock, true, 30);
    FILE *f = fopen(go, "w");
    cr_assert_not_null(f);
    fclose(f);
    bool connected;
    long sent = stranger_end(&s, &connected);
    cr_assert(connected, "the rank never reached the socket (the test proves nothing)");
    cr_assert_eq(sent, 0, "the rank sent another user's template %ld bytes", sent);
    agent_wait(k, 40);
    close(say);
    agent_free(k);
    unlink(go);
    program_free(dir, tmpl);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, agent_relay_takes_null)
{
    dk_relay_destroy(NULL);
    dk_relay_t *none = NULL;
    dk_relay_destroy(&none);
    cr_assert_null(none);
}
