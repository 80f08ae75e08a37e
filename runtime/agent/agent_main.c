/*
 * distkernel-agent: the node agent (dk_agent.h), one per node of a run over
 * Slurm, started by the kernel as the tasks of one srun step.
 *
 * Usage: distkernel-agent [RANK_PROGRAM [ARG...]]
 * (default: distkernel-rank beside this program). Everything else comes from
 * the environment the kernel gives it, the key only there:
 *   DISTKERNEL_BC, DISTKERNEL_BC_KEY      the back channel and its key
 *   DISTKERNEL_BC_HEARTBEAT               the silence deadline (s)
 *   DISTKERNEL_BC_CONNECT_TIMEOUT         how long to try to connect (s)
 *   DISTKERNEL_AGENT_NODE                 this node in the run, from 0
 *                                         (unset: SLURM_NODEID, the step's)
 *   DISTKERNEL_AGENT_WORLD                the run's ranks
 *   DISTKERNEL_AGENT_PER_NODE             ranks on each node
 *   DISTKERNEL_AGENT_RUN_ID               TORCHELASTIC_RUN_ID
 *   DISTKERNEL_AGENT_LOG_DIR              the run's log folder (the ranks'
 *                                         DISTKERNEL_LOG is in it)
 *   DISTKERNEL_AGENT_MASTER_ADDR          MASTER_ADDR
 *   DISTKERNEL_AGENT_MASTER_PORT          MASTER_PORT; 0 or unset: rank 0
 *                                         picks one (DISTKERNEL_MASTER_PORT=rank0)
 *   DISTKERNEL_AGENT_GRACE                the stop ladder's grace (s)
 *   DISTKERNEL_AGENT_STACKS               1: answer STACKS (faulthandler)
 *   DISTKERNEL_AGENT_WARM_MODULES         set: start a warm-start template on
 *                                         this node importing these (comma-
 *                                         separated; dk_template.h) and fork
 *                                         the ranks from it (dk_agent.h)
 *   DISTKERNEL_AGENT_WARM_PATH            its import path (newline-separated)
 *   DISTKERNEL_WARM_WAIT_S                how long the ranks wait for it (s)
 *   DISTKERNEL_CWD                        the kernel's folder, for the ranks
 *   DISTKERNEL_AGENT_TUNNEL               set: the job's gate to a tracking
 *                                         server on the kernel's host
 *                                         (HOST:PORT); the agent opens a door
 *                                         to it on this node's 127.0.0.1 for
 *                                         its user's processes only and tells
 *                                         the ranks its port in
 *                                         DISTKERNEL_TRACKING_PORT (dk_tunnel.h)
 * The DISTKERNEL_AGENT_* variables are the agent's own: its ranks do not
 * see them. The template is started first, before the agent connects, so
 * that it imports while the kernel is reached. Its environment is the ranks'
 * base less the back channel's variables (it only imports and forks: the
 * ranks get theirs from the distkernel-rank that asks); it dies with the
 * agent (PR_SET_PDEATHSIG), and the agent's folder watcher (dk_tidy.h)
 * removes its socket's folder if the agent is killed. Exit status: 0 every rank ended and was told; 1 the
 * kernel went away first and the ranks were ended; 2 nothing could start.
 */
#include "dk_agent.h"

#include "dk_backchan.h"
#include "dk_frame.h"
#include "dk_spawn.h"
#include "dk_tidy.h"
#include "dk_setting.h"
#include "dk_tunnel.h"

#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

/* SLURM_NODEID, the agent's node when the kernel does not name it: a whole
 * number, else -1. */
static int slurm_node_id(void)
{
    const char *v = getenv("SLURM_NODEID");
    char *end;
    long x = v && *v ? strtol(v, &end, 10) : -1;
    return v && *v && !*end && x >= 0 && x <= INT_MAX ? (int) x : -1;
}

/* DISTKERNEL_AGENT_NODE (what the kernel says), else SLURM_NODEID. */
static int node_index(void)
{
    int node = (int)dk_setting_number("DISTKERNEL_AGENT_NODE");
    return node >= 0 ? node : slurm_node_id();
}

/* The run's key, taken out of the environment: unsetenv alone would leave
 * it in the block /proc/PID/environ shows for the agent's whole life (to
 * root, and to a debugger of the user's), so its bytes there are
 * overwritten, as distkernel-rank does with its copy. The ranks get it from
 * the agent (dk_rankenv), the template never. NULL when it is not set. */
static char *take_key(void)
{
    static const char name[] = "DISTKERNEL_BC_KEY=";
    char *key = NULL;
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, name, sizeof name - 1) != 0)
            continue;
        char *block = *e + sizeof name - 1;
        if ((key = strdup(block)))
            memset(block, 'x', strlen(block));
        break;
    }
    unsetenv("DISTKERNEL_BC_KEY");
    return key;
}

/* distkernel-rank in this program's own folder. */
static char *rank_beside_me(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return NULL;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    char *path = NULL;
    if (asprintf(&path, "%s/distkernel-rank", self) < 0)
        return NULL;
    return path;
}

/* This node's template. Its socket's folder goes with the agent, even a
 * killed one (dk_logdir_socket_dir keeps it with dk_tidy). */
typedef struct {
    dk_template_t *template;
    char failed[1024];          /* why it could not be started, or "" */
} warm_t;

/* The variables the template does not get: the back channel's (the ranks
 * get theirs from the requesting distkernel-rank, not from it). */
static bool template_keeps(const char *entry)
{
    static const char *const drop[] = {"DISTKERNEL_BC=", "DISTKERNEL_BC_KEY=",
                                       "DISTKERNEL_BC_HEARTBEAT=",
                                       "DISTKERNEL_BC_CONNECT_TIMEOUT="};
    for (size_t i = 0; i < sizeof drop / sizeof drop[0]; i++)
        if (strncmp(entry, drop[i], strlen(drop[i])) == 0)
            return false;
    return true;
}

/* Start the template the kernel asked for (DISTKERNEL_AGENT_WARM_MODULES),
 * from PROGRAM (distkernel-rank), with BASE less the back channel. */
static void warm_start(warm_t *w, const char *program, const char *const *base)
{
    const char *modules = getenv("DISTKERNEL_AGENT_WARM_MODULES");
    if (!modules)
        return;
    size_t n = 0;
    while (base[n])
        n++;
    const char **env = calloc(n + 1, sizeof *env);
    if (!env) {
        snprintf(w->failed, sizeof w->failed, "out of memory");
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (template_keeps(base[i]))
            env[k++] = base[i];
    w->template = dk_template_start(program, env, modules, getenv("DISTKERNEL_AGENT_WARM_PATH"),
                                    "", w->failed, sizeof w->failed);
    free(env);
}

/* The template ended, its folder removed. */
static void warm_end(warm_t *w)
{
    dk_template_destroy(&w->template);
}

/* This node's name for the agent's own lines: Slurm's (SLURMD_NODENAME, as
 * the user sees it in squeue and in the kernel's messages), else the host's. */
static const char *node_name(char *buf, size_t len)
{
    const char *slurm = getenv("SLURMD_NODENAME");
    if (slurm && *slurm && strlen(slurm) < len && !strpbrk(slurm, "():\n"))
        return slurm;
    if (gethostname(buf, len) != 0)
        return NULL;
    buf[len - 1] = '\0';
    return strpbrk(buf, "():\n") ? NULL : buf;
}

/* The agent, with the run's key in hex (NULL: none was given). */
/* Where this agent is, for its lines on stderr: "node 3 (node3)". */
typedef struct {
    int node;
    const char *host;
} where_t;

static void say(const where_t *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const where_t *w, const char *fmt, ...)
{
    char text[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    fprintf(stderr, "distkernel-agent: node %d%s%s%s: %s\n", w->node, w->host ? " (" : "",
            w->host ? w->host : "", w->host ? ")" : "", text);
}

/* The ranks' base environment: the agent's, less its own variables, with
 * room for one more (the tracking door's port). NULL when out of memory. */
static const char **ranks_base(size_t *count)
{
    size_t n = 0;
    while (environ[n])
        n++;
    const char **base = calloc(n + 2, sizeof *base);
    size_t k = 0;
    for (size_t i = 0; base && i < n; i++)
        if (strncmp(environ[i], "DISTKERNEL_AGENT_", 17) != 0)
            base[k++] = environ[i];
    *count = k;
    return base;
}

/* A door on this node to the tracking server on the kernel's host, for this
 * user's processes only: a rank reaches it as 127.0.0.1 (dk_tunnel.h). Its
 * port goes into BASE (at *COUNT) as DISTKERNEL_TRACKING_PORT, in VAR. */
static dk_tunnel_t *tracking_door(const where_t *w, const unsigned char *key, const char **base,
                                  size_t *count, char *var, size_t varlen)
{
    const char *gate = getenv("DISTKERNEL_AGENT_TUNNEL");
    if (!gate || !*gate)
        return NULL;
    char terr[256];
    dk_tunnel_t *door = dk_tunnel_door_new(gate, key, terr, sizeof terr);
    if (!door) {
        say(w, "the ranks of this node will not reach the tracking server on the kernel's "
            "host: %s", terr);
        return NULL;
    }
    snprintf(var, varlen, "DISTKERNEL_TRACKING_PORT=%d", dk_tunnel_port(door));
    base[(*count)++] = var;
    return door;
}

/* The node's agent, once its environment is read: connect, then run
 * (dk_agent_run). */
static int serve(const where_t *w, dk_agent_spec_t *spec, const char *address, warm_t *warm)
{
    char err[1024];
    unsigned char nonce[DK_FRAME_NONCE_LEN];
    spec->fd = dk_agent_connect(address, spec->connect_timeout_s, nonce, err, sizeof err);
    if (spec->fd < 0) {
        say(w, "%s", err);
        return 2;
    }
    spec->nonce = nonce;
    spec->template = warm->template;
    spec->warm_wait_s = dk_setting_number("DISTKERNEL_WARM_WAIT_S");
    spec->warm_failed = warm->failed[0] ? warm->failed : NULL;
    int rc = dk_agent_run(spec);
    close(spec->fd);
    return rc;
}

static int agent(int argc, char **argv, const char *key_hex)
{
    if (argc > 1 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        printf("usage: distkernel-agent [RANK_PROGRAM [ARG...]]\n"
               "The node agent of a distkernel run over Slurm: started by the kernel, one per\n"
               "node, it starts that node's ranks and speaks for them. See dk_agent.h.\n");
        return 0;
    }
    /* Whatever signal state srun passed on, the ranks get default signals
     * (dk_spawn); the agent itself must not die of a write to a closed pipe. */
    signal(SIGPIPE, SIG_IGN);
    char host_buf[65];
    where_t w = {node_index(),
                 node_name(host_buf, sizeof host_buf)};
    int world = (int)dk_setting_number("DISTKERNEL_AGENT_WORLD");
    int per = (int)dk_setting_number("DISTKERNEL_AGENT_PER_NODE");
    const char *address = getenv("DISTKERNEL_BC");
    const char *run_id = getenv("DISTKERNEL_AGENT_RUN_ID");
    unsigned char key[DK_FRAME_KEY_LEN];
    if (w.node < 0 || world < 1 || per < 1 || !address || !run_id ||
        dk_frame_key_from_hex(key_hex, key) < 0) {
        fprintf(stderr, "distkernel-agent: started without the environment the kernel gives "
                "it (DISTKERNEL_AGENT_NODE or SLURM_NODEID, DISTKERNEL_AGENT_WORLD, "
                "DISTKERNEL_AGENT_PER_NODE, DISTKERNEL_AGENT_RUN_ID, DISTKERNEL_BC, "
                "DISTKERNEL_BC_KEY)\n");
        return 2;
    }
    char *program = NULL;
    char err[1024];
    if (argc > 1)
        program = dk_spawn_find_program(argv[1], err, sizeof err);
    else if (!(program = rank_beside_me()))
        snprintf(err, sizeof err, "cannot find distkernel-rank beside this program");
    size_t k = 0;
    const char **base = program ? ranks_base(&k) : NULL;
    if (!base) {
        say(&w, "%s", program ? "out of memory" : err);
        free(program);
        return 2;
    }
    /* The node's folders (the template's, the stacks') go with the agent
     * however it ends; its watcher is forked before anything else is. */
    char why[256];
    if (dk_tidy_start(why, sizeof why) < 0)
        say(&w, "%s; its folders stay in TMPDIR if it is killed", why);
    char door_var[64];
    dk_tunnel_t *door = tracking_door(&w, key, base, &k, door_var, sizeof door_var);
    warm_t warm = {0};
    warm_start(&warm, program, base);
    int port = (int)dk_setting_number("DISTKERNEL_AGENT_MASTER_PORT");
    dk_agent_spec_t spec = {
        .node = w.node, .host = w.host, .world_size = world, .ranks_per_node = per,
        .rank_exe = program, .rank_argv = argc > 1 ? argv + 1 : NULL,
        .base_env = base,
        .proto = {
            .master_addr = getenv("DISTKERNEL_AGENT_MASTER_ADDR"),
            .master_port = port > 0 && port <= 65535 ? port : 0,
            .run_id = run_id, .bc_address = address, .bc_key_hex = key_hex,
            .cwd = getenv("DISTKERNEL_CWD"),
        },
        .log_dir = getenv("DISTKERNEL_AGENT_LOG_DIR"),
        .stacks = dk_setting_number("DISTKERNEL_AGENT_STACKS") == 1,
        .key = key,
        .heartbeat_s = dk_setting_number("DISTKERNEL_BC_HEARTBEAT"),
        .connect_timeout_s = dk_setting_number("DISTKERNEL_BC_CONNECT_TIMEOUT"),
        .grace_s = dk_setting_number("DISTKERNEL_AGENT_GRACE"),
        .say_fd = STDERR_FILENO,
    };
    int rc = serve(&w, &spec, address, &warm);
    warm_end(&warm);
    dk_tunnel_destroy(&door);
    free(base);
    free(program);
    /* The stacks' and the template's folders are removed by now: the folder
     * watcher has nothing left to do, and the agent leaves no child. */
    dk_tidy_end();
    return rc;
}

int main(int argc, char **argv)
{
    char *key_hex = take_key();
    int rc = agent(argc, argv, key_hex);
    free(key_hex);
    return rc;
}
