/*
 * What the job tests share (job_fixture.h): the recorder of what the sink is
 * told, and starting and ending jobs of fake_rank.
 */
#include "job_fixture.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "dk_logdir.h"
#include "dk_tidy.h"

recorder_t rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

void append(bytes_t *b, const void *data, size_t len)
{
    b->buf = realloc(b->buf, b->len + len + 1);
    memcpy(b->buf + b->len, data, len);
    b->len += len;
    b->buf[b->len] = '\0';
}

/* When set, output "hold" from a rank holds the runtime's thread in the sink:
 * it creates HOLD_DIR/held and returns once HOLD_DIR/release exists. */
const char *hold_dir;

static void hold_here(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/held", hold_dir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fclose(f);
    snprintf(path, sizeof path, "%s/release", hold_dir);
    for (int i = 0; i < 2000 && access(path, F_OK) != 0; i++)
        usleep(10000);
}

static void on_output(void *data, int rank, int fd, const char *bytes, size_t len)
{
    (void) data;
    cr_assert(rank >= 0 && rank < MAXR && (fd == 1 || fd == 2));
    pthread_mutex_lock(&rec.lock);
    append(&rec.out[rank][fd], bytes, len);
    pthread_mutex_unlock(&rec.lock);
    if (hold_dir && memmem(bytes, len, "hold", 4))
        hold_here();
}

static void on_state(void *data, int rank, dk_rank_state_t state, int code, int sig)
{
    (void) data;
    pthread_mutex_lock(&rec.lock);
    if (rec.nstates[rank] < MAXSTATES)
        rec.states[rank][rec.nstates[rank]++] = state;
    rec.state_code[rank] = code;
    rec.state_signal[rank] = sig;
    pthread_mutex_unlock(&rec.lock);
}

static void on_message(void *data, int rank, bool is_error, const void *bytes, size_t len)
{
    (void) data;
    pthread_mutex_lock(&rec.lock);
    rec.msg[rank].len = 0;
    append(&rec.msg[rank], bytes, len);
    rec.msg_error[rank] = is_error;
    rec.nmsg[rank]++;
    for (int fd = 1; fd <= 2; fd++)
        rec.out_len_at_msg[rank][fd] = rec.out[rank][fd].len;
    rec.last_words_first[rank] = rec.out[rank][1].buf && strstr(rec.out[rank][1].buf, "last words") &&
                                 rec.out[rank][2].buf && strstr(rec.out[rank][2].buf, "last words");
    if (is_error && rec.first_error_at == 0)
        rec.first_error_at = now_s();
    pthread_mutex_unlock(&rec.lock);
}

static void on_warning(void *data, const char *text)
{
    (void) data;
    pthread_mutex_lock(&rec.lock);
    if (rec.nwarnings < 64)
        snprintf(rec.warnings[rec.nwarnings++], sizeof rec.warnings[0], "%s", text);
    pthread_mutex_unlock(&rec.lock);
}

static void on_caught_up(void *data, int rank, int fd)
{
    (void) data;
    cr_assert(rank >= 0 && rank < MAXR && (fd == 1 || fd == 2));
    pthread_mutex_lock(&rec.lock);
    rec.caught_up_at_len[rank][fd] = rec.out[rank][fd].len;
    rec.ncaught_up[rank][fd]++;
    pthread_mutex_unlock(&rec.lock);
}

static void on_lost(void *data, int rank, const char *host)
{
    (void) data;
    pthread_mutex_lock(&rec.lock);
    snprintf(rec.lost_host[rank], sizeof rec.lost_host[rank], "%s", host);
    pthread_mutex_unlock(&rec.lock);
}

static void on_stacks(void *data, int world, const char *const *dumps, const size_t *lens)
{
    (void) data;
    pthread_mutex_lock(&rec.lock);
    for (int r = 0; r < world && r < MAXR; r++) {
        rec.sampled[r].len = 0;
        rec.sample_asked[r] = dumps[r] != NULL;
        append(&rec.sampled[r], dumps[r] ? dumps[r] : "", dumps[r] ? lens[r] : 0);
    }
    rec.nsamples++;
    pthread_mutex_unlock(&rec.lock);
}

const dk_sink_t sink = {NULL,       on_output,    on_state, on_message,
                         on_warning, on_caught_up, on_lost,  on_stacks};

bool output_has(int rank, int fd, const char *needle)
{
    pthread_mutex_lock(&rec.lock);
    bool found = rec.out[rank][fd].buf && strstr(rec.out[rank][fd].buf, needle);
    pthread_mutex_unlock(&rec.lock);
    return found;
}

void wait_output(int rank, const char *needle)
{
    for (int i = 0; i < 1000 && !output_has(rank, 1, needle); i++)
        usleep(10000);
    cr_assert(output_has(rank, 1, needle), "rank %d never printed \"%s\"", rank, needle);
}

bool warned(const char *needle)
{
    pthread_mutex_lock(&rec.lock);
    bool found = false;
    for (int i = 0; i < rec.nwarnings && !found; i++)
        found = strstr(rec.warnings[i], needle) != NULL;
    pthread_mutex_unlock(&rec.lock);
    return found;
}

/* How many warnings hold NEEDLE. */
int warned_times(const char *needle)
{
    pthread_mutex_lock(&rec.lock);
    int n = 0;
    for (int i = 0; i < rec.nwarnings; i++)
        n += strstr(rec.warnings[i], needle) != NULL;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

/* The value fake_rank printed for NAME ("ENV NAME=value"), in a static buffer. */
const char *env_of(int rank, const char *name)
{
    static char value[512];
    char key[128];
    snprintf(key, sizeof key, "ENV %s=", name);
    const char *at = rec.out[rank][1].buf ? strstr(rec.out[rank][1].buf, key) : NULL;
    cr_assert_not_null(at, "rank %d did not print %s", rank, name);
    at += strlen(key);
    size_t n = strcspn(at, "\n");
    snprintf(value, sizeof value, "%.*s", (int) n, at);
    return value;
}

/* ------------------------------------------------------------------------ */
/* Starting jobs                                                             */

char log_dir[256];

void make_log_dir(void)
{
    snprintf(log_dir, sizeof log_dir, "/tmp/dk-test-job-XXXXXX");
    cr_assert_not_null(mkdtemp(log_dir));
}

void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* Environment for the ranks: a minimal base plus the test's own settings. */
const char *env[32];

void set_env(const char *const *extra)
{
    size_t n = 0;
    env[n++] = "PATH=/usr/bin:/bin";
    for (size_t i = 0; extra && extra[i] && n < 31; i++)
        env[n++] = extra[i];
    env[n] = NULL;
}

dk_job_spec_t spec_for(int world_size, const char *const *extra)
{
    set_env(extra);
    if (!log_dir[0])
        make_log_dir();
    dk_job_spec_t spec = {
        .world_size = world_size,
        .rank_exe = FAKE_RANK,
        .env = env,
        .grace_s = GRACE,
        .log_dir = log_dir,
    };
    return spec;
}

dk_job_t *start(const dk_job_spec_t *spec)
{
    char err[512] = "";
    dk_job_t *job = dk_job_start(spec, &sink, err, sizeof err);
    cr_assert_not_null(job, "dk_job_start failed: %s", err);
    return job;
}

dk_job_t *run(int world_size, const char *const *extra)
{
    dk_job_spec_t spec = spec_for(world_size, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    return job;
}

void finish(dk_job_t **job)
{
    dk_job_destroy(job);
    if (log_dir[0])
        remove_dir(log_dir);
    log_dir[0] = '\0';
}

/* The descriptors open in this process. The folder watcher's socket
 * (dk_tidy.h), opened by the first folder a job makes and held for the
 * process's life, is opened first, so that it is counted before and after. */
int count_fds(void)
{
    char tmp[] = "/tmp/dk-test-job-XXXXXX";
    cr_assert_not_null(mkdtemp(tmp));
    cr_assert_eq(dk_tidy_keep(tmp, NULL, 0), 0);
    dk_logdir_socket_dir_remove(tmp);
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;   /* the directory's own descriptor */
}

void sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char d[32];
    unsigned int n = 0;
    EVP_Digest(data, len, d, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open %s", path);
    bytes_t b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
        append(&b, chunk, n);
    fclose(f);
    *len = b.len;
    return b.buf;
}

dk_job_spec_t tcp_spec(int world_size, const char *const *extra)
{
    dk_job_spec_t spec = spec_for(world_size, extra);
    spec.bc_tcp_addr = "127.0.0.1";
    return spec;
}


/* The cell's job, pickled by the real cloudpickle, into BUF; its length. */
size_t cell_payload(const char *code, char *buf, size_t size)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "PYTHONPATH=%s %s -c 'import sys, cloudpickle; sys.stdout.buffer.write("
             "cloudpickle.dumps({\"kind\": \"cell\", \"names\": {}, \"code\": sys.argv[1]}))' "
             "\"$(cat <<'CODE'\n%sCODE\n)\"",
             PY_SRC, PYTHON3, code);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t len = fread(buf, 1, size, p);
    cr_assert_eq(pclose(p), 0);
    cr_assert_gt(len, 0);
    return len;
}


/* ---- ranks started by node agents (spec.agent_command) ---- */

static char agents_dir[128];

dk_job_spec_t agent_spec_for(int world, int per, const char *const *extra, const char *vars,
                             const char *program)
{
    static char script[1024];
    static const char *cmd[4];
    static const char *hosts[AGENT_NODES_MAX];
    static char names[AGENT_NODES_MAX][16];
    cr_assert(world / per <= AGENT_NODES_MAX && world <= AGENT_NODES_MAX);
    snprintf(agents_dir, sizeof agents_dir, "/tmp/dk-agents-XXXXXX");
    cr_assert_not_null(mkdtemp(agents_dir));
    snprintf(script, sizeof script,
             "k=0; while [ $k -lt %d ]; do DISTKERNEL_AGENT_NODE=$k "
             "SLURMD_NODENAME=node$((k + 1)) %s %s %s & "
             "echo $! > %s/agent-$k; k=$((k + 1)); done; "
             "echo 'srun: a line of the launcher' >&2; wait",
             world / per, vars, AGENT_EXE, program, agents_dir);
    cmd[0] = "/bin/sh";
    cmd[1] = "-c";
    cmd[2] = script;
    cmd[3] = NULL;
    dk_job_spec_t spec = tcp_spec(world, extra);
    spec.ranks_per_node = per;
    spec.agent_command = cmd;
    for (int r = 0; r < world; r++) {
        snprintf(names[r], sizeof names[r], "node%d", r / per + 1);
        hosts[r] = names[r];
    }
    spec.rank_hosts = hosts;
    return spec;
}

dk_job_spec_t agent_spec_with(int world, int per, const char *const *extra, const char *vars)
{
    return agent_spec_for(world, per, extra, vars, FAKE_RANK);
}

dk_job_spec_t agent_spec(int world, int per, const char *const *extra)
{
    return agent_spec_with(world, per, extra, "");
}

void agents_done(void)
{
    char path[192];
    for (int k = 0; k < AGENT_NODES_MAX; k++) {
        snprintf(path, sizeof path, "%s/agent-%d", agents_dir, k);
        unlink(path);
    }
    rmdir(agents_dir);
}

pid_t agent_pid(int node)
{
    char path[192];
    snprintf(path, sizeof path, "%s/agent-%d", agents_dir, node);
    int pid = 0;
    for (int i = 0; i < 500 && pid <= 0; i++) {
        FILE *f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%d", &pid) != 1)
                pid = 0;
            fclose(f);
        }
        if (pid <= 0)
            usleep(10000);
    }
    cr_assert_gt(pid, 0, "no pid for node %d's agent", node);
    return (pid_t) pid;
}
