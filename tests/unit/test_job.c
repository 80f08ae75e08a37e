/*
 * Running a job of rank processes (runtime/launch/dk_job.h), with fake_rank as the
 * rank executable: it speaks the back channel and misbehaves on request
 * (FAKE_MODE, FAKE_MODE_<rank>; see fake_rank.c).
 *
 * Each test runs in its own process (criterion), so the recorder below is a
 * plain global; it has a lock because the sink is called from the runtime
 * thread while a test may be looking.
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "dk_backchan.h"
#include "dk_fdlimit.h"
#include "dk_job.h"
#include "dk_logdir.h"
#include "dk_logfile.h"
#include "dk_stackreq.h"
#include "dk_tidy.h"

#ifndef FAKE_RANK
#error "FAKE_RANK (the path of fake_rank) must be defined"
#endif

#define MAXR 12
#define MAXSTATES 16
/* Tests that time the kill escalation use FAST_GRACE; the others use a grace
 * long enough that a loaded machine (sanitizers, parallel tests) never turns a
 * rank's own clean exit into a SIGTERM. */
#define GRACE 2.0
#define FAST_GRACE 0.3

/* ------------------------------------------------------------------------ */
/* Recording what the sink is told                                           */

typedef struct {
    char *buf;
    size_t len;
} bytes_t;

static struct {
    pthread_mutex_t lock;
    bytes_t out[MAXR][3];           /* [rank][fd] */
    dk_rank_state_t states[MAXR][MAXSTATES];
    int nstates[MAXR];
    int state_code[MAXR], state_signal[MAXR];
    bytes_t msg[MAXR];
    bool msg_error[MAXR];
    int nmsg[MAXR];
    char warnings[64][1024];
    int nwarnings;
    double first_error_at;
    size_t caught_up_at_len[MAXR][3];   /* output length at the last on_caught_up */
    int ncaught_up[MAXR][3];
    bool last_words_first[MAXR];        /* "last words" on fd 1 and 2 before its message */
    char lost_host[MAXR][64];           /* on_lost's host, "" if not told */
    size_t out_len_at_msg[MAXR][3];     /* output length when its message came */
    bytes_t sampled[MAXR];              /* the last live sample's dumps (on_stacks) */
    bool sample_asked[MAXR];
    int nsamples;
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static void append(bytes_t *b, const void *data, size_t len)
{
    b->buf = realloc(b->buf, b->len + len + 1);
    memcpy(b->buf + b->len, data, len);
    b->len += len;
    b->buf[b->len] = '\0';
}

/* When set, output "hold" from a rank holds the runtime's thread in the sink:
 * it creates HOLD_DIR/held and returns once HOLD_DIR/release exists. */
static const char *hold_dir;

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

static const dk_sink_t sink = {NULL,       on_output,    on_state, on_message,
                               on_warning, on_caught_up, on_lost,  on_stacks};

static bool output_has(int rank, int fd, const char *needle)
{
    pthread_mutex_lock(&rec.lock);
    bool found = rec.out[rank][fd].buf && strstr(rec.out[rank][fd].buf, needle);
    pthread_mutex_unlock(&rec.lock);
    return found;
}

static void wait_output(int rank, const char *needle)
{
    for (int i = 0; i < 1000 && !output_has(rank, 1, needle); i++)
        usleep(10000);
    cr_assert(output_has(rank, 1, needle), "rank %d never printed \"%s\"", rank, needle);
}

static bool warned(const char *needle)
{
    pthread_mutex_lock(&rec.lock);
    bool found = false;
    for (int i = 0; i < rec.nwarnings && !found; i++)
        found = strstr(rec.warnings[i], needle) != NULL;
    pthread_mutex_unlock(&rec.lock);
    return found;
}

/* How many warnings hold NEEDLE. */
static int warned_times(const char *needle)
{
    pthread_mutex_lock(&rec.lock);
    int n = 0;
    for (int i = 0; i < rec.nwarnings; i++)
        n += strstr(rec.warnings[i], needle) != NULL;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

/* The value fake_rank printed for NAME ("ENV NAME=value"), in a static buffer. */
static const char *env_of(int rank, const char *name)
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

static char log_dir[256];

static void make_log_dir(void)
{
    snprintf(log_dir, sizeof log_dir, "/tmp/dk-test-job-XXXXXX");
    cr_assert_not_null(mkdtemp(log_dir));
}

static void remove_dir(const char *dir)
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
static const char *env[32];

static void set_env(const char *const *extra)
{
    size_t n = 0;
    env[n++] = "PATH=/usr/bin:/bin";
    for (size_t i = 0; extra && extra[i] && n < 31; i++)
        env[n++] = extra[i];
    env[n] = NULL;
}

static dk_job_spec_t spec_for(int world_size, const char *const *extra)
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

static dk_job_t *start(const dk_job_spec_t *spec)
{
    char err[512] = "";
    dk_job_t *job = dk_job_start(spec, &sink, err, sizeof err);
    cr_assert_not_null(job, "dk_job_start failed: %s", err);
    return job;
}

static dk_job_t *run(int world_size, const char *const *extra)
{
    dk_job_spec_t spec = spec_for(world_size, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    return job;
}

static void finish(dk_job_t **job)
{
    dk_job_destroy(job);
    if (log_dir[0])
        remove_dir(log_dir);
    log_dir[0] = '\0';
}

/* The descriptors open in this process. The folder watcher's socket
 * (dk_tidy.h), opened by the first folder a job makes and held for the
 * process's life, is opened first, so that it is counted before and after. */
static int count_fds(void)
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

static void sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char d[32];
    unsigned int n = 0;
    EVP_Digest(data, len, d, &n, EVP_sha256(), NULL);
    for (int i = 0; i < 32; i++)
        sprintf(out + 2 * i, "%02x", d[i]);
}

/* ------------------------------------------------------------------------ */
/* Results                                                                   */

Test(job, all_ranks_return_results_and_a_large_payload_arrives_intact, .timeout = 60)
{
    size_t len = 50u << 20;
    unsigned char *payload = malloc(len);
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        payload[i] = (unsigned char) x;
    }
    char digest[65];
    sha256_hex(payload, len, digest);

    dk_job_spec_t spec = spec_for(4, NULL);
    spec.payload = payload;
    spec.payload_len = len;
    dk_job_t *job = start(&spec);
    free(payload);                  /* the job made its own copy */
    cr_assert(dk_job_wait(job, 50000));

    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(dk_job_root_cause(job), -1);
    for (int r = 0; r < 4; r++) {
        char expected[160];
        snprintf(expected, sizeof expected, "rank=%d len=%zu sha256=%s", r, len, digest);
        cr_assert_eq(rec.nmsg[r], 1);
        cr_assert_not(rec.msg_error[r]);
        cr_assert_str_eq(rec.msg[r].buf, expected);
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
        cr_assert_eq(dk_job_rank_exit_code(job, r), 0);
        cr_assert_eq(dk_job_rank_signal(job, r), 0);
    }
    finish(&job);
}

Test(job, each_rank_goes_starting_running_done)
{
    dk_job_t *job = run(2, NULL);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(rec.nstates[r], 3);
        cr_assert_eq(rec.states[r][0], DK_RANK_STARTING);
        cr_assert_eq(rec.states[r][1], DK_RANK_RUNNING);
        cr_assert_eq(rec.states[r][2], DK_RANK_DONE);
        cr_assert_eq(rec.state_code[r], 0);
    }
    finish(&job);
}

Test(job, an_empty_payload_is_delivered)
{
    dk_job_t *job = run(1, NULL);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(strstr(rec.msg[0].buf, "len=0 sha256=e3b0c442") != NULL);
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* How ranks are started                                                     */

Test(job, ranks_get_the_torch_distributed_environment)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", "FAKE_EXTRA=kept", "RANK=99", NULL};
    dk_job_t *job = run(3, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    char port[16], run_id[64];
    snprintf(port, sizeof port, "%d", dk_job_master_port(job));
    snprintf(run_id, sizeof run_id, "%s", env_of(0, "TORCHELASTIC_RUN_ID"));
    cr_assert_eq(strlen(run_id), 32);
    cr_assert_eq(strspn(run_id, "0123456789abcdef"), 32);
    for (int r = 0; r < 3; r++) {
        char rs[8], log[512];
        snprintf(rs, sizeof rs, "%d", r);
        snprintf(log, sizeof log, "%s/rank-%d.log", log_dir, r);
        cr_assert_str_eq(env_of(r, "RANK"), rs);
        cr_assert_str_eq(env_of(r, "LOCAL_RANK"), rs);
        cr_assert_str_eq(env_of(r, "ROLE_RANK"), rs);
        cr_assert_str_eq(env_of(r, "WORLD_SIZE"), "3");
        cr_assert_str_eq(env_of(r, "LOCAL_WORLD_SIZE"), "3");
        cr_assert_str_eq(env_of(r, "ROLE_WORLD_SIZE"), "3");
        cr_assert_str_eq(env_of(r, "GROUP_RANK"), "0");
        cr_assert_str_eq(env_of(r, "NODE_RANK"), "0");
        cr_assert_str_eq(env_of(r, "GROUP_WORLD_SIZE"), "1");
        cr_assert_str_eq(env_of(r, "ROLE_NAME"), "default");
        cr_assert_str_eq(env_of(r, "MASTER_ADDR"), "127.0.0.1");
        cr_assert_str_eq(env_of(r, "MASTER_PORT"), port);
        cr_assert_str_eq(env_of(r, "TORCHELASTIC_RUN_ID"), run_id);
        cr_assert_str_eq(env_of(r, "TORCHELASTIC_RESTART_COUNT"), "0");
        cr_assert_str_eq(env_of(r, "TORCHELASTIC_MAX_RESTARTS"), "0");
        cr_assert_str_eq(env_of(r, "OMP_NUM_THREADS"), "1");
        cr_assert_str_eq(env_of(r, "DISTKERNEL_LOG"), log);
        cr_assert_str_eq(env_of(r, "FAKE_EXTRA"), "kept");
        cr_assert(strstr(rec.out[r][1].buf, "KEYLEN 64\n") != NULL);
    }
    cr_assert_gt(dk_job_master_port(job), 0);
    finish(&job);
}

Test(job, ranks_spread_over_nodes_get_their_node_and_local_rank_and_the_given_store)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = spec_for(6, extra);
    spec.ranks_per_node = 3;
    spec.master_addr = "10.9.8.7";
    spec.master_port = 29123;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(dk_job_master_port(job), 29123);
    for (int r = 0; r < 6; r++) {
        char rs[8], local[8], node[8];
        snprintf(rs, sizeof rs, "%d", r);
        snprintf(local, sizeof local, "%d", r % 3);
        snprintf(node, sizeof node, "%d", r / 3);
        cr_assert_str_eq(env_of(r, "RANK"), rs);
        cr_assert_str_eq(env_of(r, "LOCAL_RANK"), local);
        cr_assert_str_eq(env_of(r, "LOCAL_WORLD_SIZE"), "3");
        cr_assert_str_eq(env_of(r, "GROUP_RANK"), node);
        cr_assert_str_eq(env_of(r, "NODE_RANK"), node);
        cr_assert_str_eq(env_of(r, "GROUP_WORLD_SIZE"), "2");
        cr_assert_str_eq(env_of(r, "WORLD_SIZE"), "6");
        cr_assert_str_eq(env_of(r, "ROLE_WORLD_SIZE"), "6");
        cr_assert_str_eq(env_of(r, "MASTER_ADDR"), "10.9.8.7");
        cr_assert_str_eq(env_of(r, "MASTER_PORT"), "29123");
    }
    finish(&job);
}

Test(job, ranks_per_node_must_divide_the_world)
{
    dk_job_spec_t spec = spec_for(4, NULL);
    spec.ranks_per_node = 3;
    char err[512] = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "ranks_per_node is 3; it must divide world_size (4)"), "%s", err);
    spec.ranks_per_node = 2;
    spec.master_addr = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "master_addr"), "%s", err);
    spec.master_addr = NULL;
    spec.master_port = 70000;
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "master_port is 70000"), "%s", err);
    dk_job_t *none = NULL;
    finish(&none);
}

Test(job, omp_num_threads_is_kept_when_the_host_sets_it)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", "OMP_NUM_THREADS=7", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_str_eq(env_of(0, "OMP_NUM_THREADS"), "7");
    finish(&job);
}

Test(job, a_rank_starts_with_only_stdio_open_default_signals_and_its_own_group)
{
    /* Give the host state a rank must not inherit: a blocked and an ignored
     * signal, and a descriptor without close-on-exec. */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &block, NULL);
    signal(SIGUSR2, SIG_IGN);
    int stray = open("/dev/null", O_RDONLY);
    cr_assert_geq(stray, 0);

    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_t *job = run(1, extra);
    const char *out = rec.out[0][1].buf;
    cr_assert(strstr(out, "FDS 0 1 2\n") != NULL, "%s", out);
    cr_assert(strstr(out, "STDIN /dev/null\n") != NULL, "%s", out);
    cr_assert(strstr(out, "SigBlk:\t0000000000000000\n") != NULL, "%s", out);
    cr_assert(strstr(out, "SigIgn:\t0000000000000000\n") != NULL, "%s", out);
    char pg[64];
    snprintf(pg, sizeof pg, "PGID %d PID %d\n", dk_job_rank_pid(job, 0), dk_job_rank_pid(job, 0));
    cr_assert(strstr(out, pg) != NULL, "%s", out);
    close(stray);
    finish(&job);
}

Test(job, a_missing_executable_is_an_error_and_starts_nothing)
{
    int before = count_fds();
    dk_job_spec_t spec = spec_for(2, NULL);
    spec.rank_exe = "/nonexistent/rank";
    char err[512] = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "/nonexistent/rank") && strstr(err, "No such file"), "%s", err);
    cr_assert_eq(count_fds(), before);
    remove_dir(log_dir);
}

Test(job, a_bad_description_is_an_error)
{
    char err[512] = "";
    dk_job_spec_t spec = {.world_size = 0, .rank_exe = FAKE_RANK};
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "world_size") != NULL, "%s", err);

    static const char byte = 0;
    spec.world_size = 1;
    spec.payload = &byte;
    spec.payload_len = (size_t) 2 << 30;
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "1 GiB") != NULL, "%s", err);
}

Test(job, two_jobs_at_once_get_different_master_ports)
{
    dk_job_spec_t spec = spec_for(1, NULL);
    dk_job_t *a = start(&spec);
    dk_job_t *b = start(&spec);
    cr_assert_neq(dk_job_master_port(a), dk_job_master_port(b));
    cr_assert(dk_job_wait(a, 20000));
    cr_assert(dk_job_wait(b, 20000));
    dk_job_destroy(&a);
    finish(&b);
}

/* ------------------------------------------------------------------------ */
/* Failures                                                                  */

Test(job, an_error_on_one_rank_is_the_root_cause_and_the_others_are_stopped)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_1=error", NULL};
    dk_job_t *job = run(3, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(rec.msg_error[1]);
    cr_assert_str_eq(rec.msg[1].buf, "boom on rank 1");
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 1);
    for (int r = 0; r < 3; r += 2) {
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED);
        cr_assert_eq(dk_job_rank_signal(job, r), SIGINT);
        cr_assert_eq(rec.states[r][rec.nstates[r] - 1], DK_RANK_STOPPED);
    }
    finish(&job);
}

/* A peer that exits on its own while unanswered failed before the rank whose
 * error came first (it likely only saw the peer go). But a peer that is
 * exiting because it finished sent its RESULT first: when that RESULT waits
 * in the socket behind the error, the peer is not the root cause. Here the
 * runtime's thread is held while rank 0 sends its RESULT and starts exiting
 * and rank 1 sends its ERROR, so the next turn finds both frames, rank 1's
 * (connected first) ahead. */
Test(job, a_peer_exiting_after_its_result_is_not_taken_for_the_root_cause)
{
    char dir[] = "/tmp/dk-test-sync-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char sync[600];
    snprintf(sync, sizeof sync, "FAKE_SYNC=%s", dir);
    hold_dir = dir;
    const char *extra[] = {"FAKE_MODE_0=exiting_result", "FAKE_MODE_1=error_synced", sync,
                           NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 0);
    cr_assert_str_eq(rec.msg[0].buf, "done");
    finish(&job);
    hold_dir = NULL;
    remove_dir(dir);
}

Test(job, a_non_zero_exit_is_a_failure_with_its_code)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_0=exit3", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 3);
    cr_assert_eq(dk_job_rank_signal(job, 0), 0);
    cr_assert_eq(rec.state_code[0], 3);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    finish(&job);
}

/* The kernel tells "exited during start-up, before it received the cell" from
 * "exited before returning a result" by whether the rank was ever RUNNING: a rank
 * that never got its payload must never be reported RUNNING. */
Test(job, a_rank_exiting_before_it_connects_is_never_running)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_1=exit3_at_start", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 3);
    cr_assert_eq(rec.nstates[1], 2);
    cr_assert_eq(rec.states[1][0], DK_RANK_STARTING);
    cr_assert_eq(rec.states[1][1], DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    finish(&job);
}

/* On this node a killed rank's sockets close at once, but the process the
 * runtime reaps for it (a warm rank's launcher) ends a moment later; its
 * peer's "Connection closed by peer", which arrives in between, is its echo
 * and waits for it: rank 1, which closed its connection and died without a
 * word, is the root cause (seen in a full run with a rank SIGKILLed in
 * all_reduce, whose peer was blamed). */
Test(job, a_peers_connection_error_here_waits_for_the_rank_it_echoes)
{
    const char *extra[] = {"FAKE_MODE_0=echo_error", "FAKE_MODE_1=close_hang", "FAKE_SLEEP_S=1",
                           NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 3);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    finish(&job);
}

Test(job, a_crash_is_reported_with_its_signal)
{
    const char *extra[] = {"FAKE_MODE=segv", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), -1);
    cr_assert_eq(dk_job_rank_signal(job, 0), SIGSEGV);
    cr_assert_eq(rec.state_code[0], -1);
    cr_assert_eq(rec.state_signal[0], SIGSEGV);
    finish(&job);
}

Test(job, exiting_without_a_result_is_a_failure)
{
    const char *extra[] = {"FAKE_MODE=no_result", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 0);
    cr_assert_eq(rec.nmsg[0], 0);
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* Ending ranks                                                              */

Test(job, cancel_stops_every_rank)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    dk_job_t *job = start(&spec);
    wait_output(0, "sleeping");
    wait_output(1, "sleeping");
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    cr_assert_not(dk_job_wait(job, 50), "the job ended by itself");
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    cr_assert_eq(dk_job_root_cause(job), -1);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED);
        cr_assert_eq(dk_job_rank_signal(job, r), SIGINT);
    }
    finish(&job);
}

Test(job, cancel_after_the_end_changes_nothing)
{
    dk_job_t *job = run(1, NULL);
    dk_job_cancel(job);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE);
    finish(&job);
}

Test(job, ranks_that_answer_sigint_with_an_error_are_stopped_not_failed)
{
    const char *extra[] = {"FAKE_MODE=interruptible", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    dk_job_t *job = start(&spec);
    wait_output(0, "sleeping");
    wait_output(1, "sleeping");
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    cr_assert_eq(dk_job_root_cause(job), -1);
    for (int r = 0; r < 2; r++) {
        cr_assert(rec.msg_error[r]);
        cr_assert_str_eq(rec.msg[r].buf, "KeyboardInterrupt");
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED);
        cr_assert_eq(dk_job_rank_exit_code(job, r), 1);
    }
    finish(&job);
}

Test(job, a_rank_that_ignores_sigint_and_sigterm_is_killed_within_three_graces)
{
    const char *extra[] = {"FAKE_MODE=ignore_signals", NULL};
    dk_job_spec_t spec = spec_for(1, extra);
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    wait_output(0, "sleeping");
    double t0 = now_s();
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 20000));
    double took = now_s() - t0;
    cr_assert_geq(took, 2 * FAST_GRACE - 0.05, "SIGKILL came early: %.3f s", took);
    cr_assert_lt(took, 3 * FAST_GRACE, "the job took %.3f s to end", took);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    cr_assert_eq(dk_job_rank_signal(job, 0), SIGKILL);
    finish(&job);
}

Test(job, a_failure_kills_a_rank_that_ignores_signals)
{
    /* Rank 1 ignores the stop signals; rank 0 fails as soon as it has its
     * payload, perhaps before rank 1 has started: either way the job ends. */
    const char *extra[] = {"FAKE_MODE_0=error", "FAKE_MODE_1=ignore_signals", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_lt(now_s() - rec.first_error_at, 3 * FAST_GRACE + 0.2);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    finish(&job);
}

Test(job, a_rank_that_hangs_after_its_error_is_terminated_not_interrupted)
{
    /* SIGINT is for ranks still running code; one that has reported is given
     * the grace to exit and then SIGTERM. */
    const char *extra[] = {"FAKE_MODE=error_hang", NULL};
    dk_job_spec_t spec = spec_for(1, extra);
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_lt(now_s() - rec.first_error_at, 2 * FAST_GRACE);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_signal(job, 0), SIGTERM);
    finish(&job);
}

Test(job, the_timeout_stops_every_rank)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.timeout_s = 0.5;
    double t0 = now_s();
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_geq(now_s() - t0, 0.5);
    cr_assert_eq(dk_job_end(job), DK_END_TIMEOUT);
    cr_assert_eq(dk_job_root_cause(job), -1);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED, "rank %d: state %d code %d",
                     r, dk_job_rank_state(job, r), dk_job_rank_exit_code(job, r));
    finish(&job);
}

Test(job, destroy_leaves_no_rank_process_behind)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(3, extra);
    dk_job_t *job = start(&spec);
    int pids[3];
    for (int r = 0; r < 3; r++)
        pids[r] = dk_job_rank_pid(job, r);
    finish(&job);
    cr_assert_null(job);
    for (int r = 0; r < 3; r++) {
        errno = 0;
        cr_assert_eq(kill(pids[r], 0), -1);
        cr_assert_eq(errno, ESRCH, "rank %d (pid %d) is still there", r, pids[r]);
    }
}

/* PID has exited (gone, or a zombie nobody has collected yet). */
static bool process_ended(int pid)
{
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return true;
    char path[64], stat[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[n] = '\0';
    const char *paren = strrchr(stat, ')');
    return paren && paren[1] == ' ' && paren[2] == 'Z';
}

Test(job, ranks_die_with_their_host)
{
    /* The host is killed before it can clean up: give it a TMPDIR to remove. */
    make_log_dir();
    char tmp[300];
    snprintf(tmp, sizeof tmp, "%s/tmp", log_dir);
    cr_assert_eq(mkdir(tmp, 0700), 0);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t host = fork();
    if (host == 0) {
        close(p[0]);
        setenv("TMPDIR", tmp, 1);
        const char *extra[] = {"FAKE_MODE=sleep", NULL};
        dk_job_spec_t spec = spec_for(2, extra);
        dk_job_t *job = start(&spec);
        wait_output(0, "sleeping");
        wait_output(1, "sleeping");
        int pids[2] = {dk_job_rank_pid(job, 0), dk_job_rank_pid(job, 1)};
        if (write(p[1], pids, sizeof pids) != sizeof pids)
            _exit(1);
        for (;;)
            pause();
    }
    close(p[1]);
    int pids[2];
    cr_assert_eq(read(p[0], pids, sizeof pids), (ssize_t) sizeof pids);
    close(p[0]);
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    for (int r = 0; r < 2; r++) {
        for (int i = 0; i < 500 && !process_ended(pids[r]); i++)
            usleep(10000);
        cr_assert(process_ended(pids[r]), "rank %d (pid %d) outlived its host", r, pids[r]);
    }
    DIR *d = opendir(tmp);
    for (struct dirent *e; d && (e = readdir(d));) {
        char path[600];
        snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
        if (e->d_name[0] != '.')
            remove_dir(path);       /* the back-channel directory and its socket */
    }
    if (d)
        closedir(d);
    rmdir(tmp);
    remove_dir(log_dir);
}

/* A rank that exits leaving a child running (in its process group): the child
 * ends with it, and does not hold the job. */
Test(job, a_child_a_rank_leaves_running_ends_with_the_rank)
{
    const char *extra[] = {"FAKE_MODE=grandchild", NULL};
    double t0 = now_s();
    dk_job_t *job = run(1, extra);
    cr_assert_lt(now_s() - t0, 5.0);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE);
    const char *at = strstr(rec.out[0][1].buf, "GRANDCHILD ");
    cr_assert_not_null(at);
    pid_t child = (pid_t) atoi(at + strlen("GRANDCHILD "));
    bool gone = false;
    for (int i = 0; i < 200 && !gone; i++) {
        gone = process_ended((int) child);
        if (!gone)
            usleep(10000);
    }
    if (!gone)
        kill(child, SIGKILL);
    cr_assert(gone, "the rank's child %d outlived it", (int) child);
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* The back channel                                                          */

Test(job, a_forged_mac_is_refused_with_a_warning_and_the_job_completes)
{
    const char *extra[] = {"FAKE_MODE_0=forge_mac", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(0, 1, "refused as expected"));
    cr_assert(warned("did not verify"));
    finish(&job);
}

/* Rank 1 connects late: the listener closes once every rank is in, and the
 * second HELLO must reach it while it is open. */
Test(job, a_second_hello_for_a_connected_rank_is_refused)
{
    const char *extra[] = {"FAKE_MODE_0=duplicate_hello", "FAKE_CONNECT_DELAY_MS_1=1500", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(0, 1, "refused as expected"));
    cr_assert(warned("already connected"));
    finish(&job);
}

Test(job, a_hello_for_a_rank_outside_the_job_is_refused)
{
    const char *extra[] = {"FAKE_MODE=bad_rank", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(warned("named rank 2, but this job has ranks 0 to 1"));
    finish(&job);
}

/* Finding 6 of issue 11: connections that never say HELLO (more than there are
 * pending slots) neither keep a rank out nor stay past the deadline. */
Test(job, idle_connections_without_hello_do_not_fail_the_job_and_are_closed, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_0=idle_hello", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK, "%s", rec.nwarnings ? rec.warnings[0] : "");
    cr_assert(output_has(0, 1, "idle closed after"), "the idle connection was not closed");
    /* They were closed when every rank was in (issue 21 item 4), or when
     * a rank's connection needed a slot. */
    cr_assert(warned("every rank is in and it had not said HELLO") ||
              warned("every slot was wanted"), "%s", rec.nwarnings ? rec.warnings[0] : "");
    finish(&job);
}

/* Finding 5 of issue 11: a job that cannot have its descriptors is refused
 * before anything starts, with what it needs and what is free. */
Test(job, a_job_that_would_run_out_of_descriptors_is_refused_up_front)
{
    struct rlimit rl = {256, 256};
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    int before = count_fds();
    dk_job_spec_t spec = spec_for(100, NULL);
    char err[512] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    cr_assert_null(job);
    char need[64];
    snprintf(need, sizeof need, "100 ranks need %zu file descriptors", dk_fdlimit_job_need(100));
    cr_assert(strstr(err, need), "%s", err);
    cr_assert(strstr(err, "of its limit of 256 are free"), "%s", err);
    cr_assert(strstr(err, "ulimit -Hn"), "%s", err);
    cr_assert_eq(count_fds(), before, "a refused job left descriptors open");
    /* What the message says fits does fit. */
    const char *use = strstr(err, "Use at most ");
    cr_assert_not_null(use);
    int fit = atoi(use + strlen("Use at most "));
    cr_assert_gt(fit, 1);
    finish(&job);
    /* The recorder keeps MAXR ranks: lower the limit so that is what fits. */
    rl.rlim_cur = rl.rlim_max = (rlim_t) (count_fds() + dk_fdlimit_job_need(MAXR) + 2);
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    spec = spec_for(MAXR + 1, NULL);
    job = dk_job_start(&spec, &sink, err, sizeof err);
    cr_assert_null(job);
    fit = atoi(strstr(err, "Use at most ") + strlen("Use at most "));
    cr_assert_eq(fit, MAXR, "%s", err);
    finish(&job);
    spec = spec_for(fit, NULL);
    job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    finish(&job);
}

Test(job, an_oversized_frame_is_refused_before_it_is_read)
{
    const char *extra[] = {"FAKE_MODE=oversize", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert(warned("outside the protocol's limits"));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    finish(&job);
}

Test(job, the_socket_directory_is_removed)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_t *job = run(1, extra);
    char path[512];
    snprintf(path, sizeof path, "%s", env_of(0, "DISTKERNEL_BC"));
    struct stat st;
    char *slash = strrchr(path, '/');
    *slash = '\0';
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);
    finish(&job);
    cr_assert_eq(stat(path, &st), -1, "%s is still there", path);
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

/* Every "TAG i" line of TEXT, in order, is numbered 0..N-1. */
static void expect_numbered(const char *text, const char *tag, int n)
{
    int next = 0;
    size_t tlen = strlen(tag);
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        cr_assert_not_null(end);
        if (strncmp(line, tag, tlen) == 0 && line[tlen] == ' ') {
            cr_assert_eq(atoi(line + tlen + 1), next, "expected %s %d, found %.*s", tag, next,
                         (int) (end - line), line);
            next++;
        }
        line = end + 1;
    }
    cr_assert_eq(next, n);
}

static char *read_file(const char *path, size_t *len)
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

Test(job, output_is_relayed_in_order_and_kept_in_the_log)
{
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=5000", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        expect_numbered(rec.out[r][1].buf, "out", 5000);
        expect_numbered(rec.out[r][2].buf, "err", 5000);
        char path[512];
        snprintf(path, sizeof path, "%s/rank-%d.log", dk_job_log_dir(job), r);
        size_t len;
        char *log = read_file(path, &len);
        cr_assert_eq(len, rec.out[r][1].len + rec.out[r][2].len);
        expect_numbered(log, "out", 5000);
        expect_numbered(log, "err", 5000);
        free(log);
    }
    finish(&job);
}

/* A rank that wrote a line and went quiet: the sink hears that everything it
 * wrote has been passed on (what tells a rank's unfinished line from one still
 * in the pipe). */
Test(job, a_quiet_rank_is_reported_caught_up_after_its_output)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_SLEEP_S=1", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_str_eq(rec.out[0][1].buf, "sleeping\n");
    cr_assert_gt(rec.ncaught_up[0][1], 0, "never told the output of rank 0 was all passed on");
    cr_assert_eq(rec.caught_up_at_len[0][1], strlen("sleeping\n"),
                 "caught up at %zu bytes, before the rank's line", rec.caught_up_at_len[0][1]);
    finish(&job);
}

/* A file size limit stands in for a full disk: writes fail the same way. */
Test(job, a_log_that_cannot_be_written_is_reported_once_and_output_still_flows)
{
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {4096, 4096};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=2000", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    expect_numbered(rec.out[0][1].buf, "out", 2000);
    expect_numbered(rec.out[0][2].buf, "err", 2000);
    cr_assert_eq(rec.nwarnings, 1);
    cr_assert(warned("rank 0's log file") && warned(strerror(EFBIG)), "%s", rec.warnings[0]);
    cr_assert(!dk_job_rank_log_complete(job, 0));
    finish(&job);
}

/* A rank-N.log planted in the log directory (a symlink to a file of the user)
 * is replaced, never written through. */
Test(job, a_planted_log_symlink_is_replaced_not_followed)
{
    make_log_dir();
    char victim[512], link[512];
    snprintf(victim, sizeof victim, "%s/victim", log_dir);
    FILE *f = fopen(victim, "w");
    fputs("precious\n", f);
    fclose(f);
    snprintf(link, sizeof link, "%s/rank-0.log", log_dir);
    cr_assert_eq(symlink(victim, link), 0);
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=20", NULL};
    dk_job_t *job = run(1, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    size_t len;
    char *text = read_file(victim, &len);
    cr_assert_str_eq(text, "precious\n");
    free(text);
    struct stat st;
    cr_assert(lstat(link, &st) == 0 && S_ISREG(st.st_mode));
    unlink(victim);
    finish(&job);
}

/* Past its cap a rank's log keeps head and tail, and the sink is told once. */
Test(job, a_log_past_its_cap_keeps_head_and_tail_and_the_sink_is_told)
{
    make_log_dir();
    dk_job_spec_t spec = spec_for(1, (const char *[]){"FAKE_MODE=print_lots", "FAKE_LINES=20000",
                                                      NULL});
    spec.log_cap = 64 << 10;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    expect_numbered(rec.out[0][1].buf, "out", 20000);
    cr_assert_eq(rec.nwarnings, 1);
    cr_assert(warned("passed its log cap of 65536 bytes"), "%s", rec.warnings[0]);
    char path[512];
    snprintf(path, sizeof path, "%s/rank-0.log", log_dir);
    size_t len;
    char *text = read_file(path, &len);
    cr_assert_leq(len, (64 << 10) + 512);
    cr_assert_not_null(strstr(text, "bytes of output left out here"));
    free(text);
    finish(&job);
}

/* Six ranks pass the cap: four are told one by one, then one line for the rest. */
Test(job, past_four_ranks_one_line_tells_of_the_others_past_the_log_cap, .timeout = 60)
{
    make_log_dir();
    dk_job_spec_t spec = spec_for(6, (const char *[]){"FAKE_MODE=print_lots", "FAKE_LINES=4000",
                                                      NULL});
    spec.log_cap = 16 << 10;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert_eq(warned_times("passed its log cap of 16384 bytes"), 4);
    cr_assert_eq(warned_times("more ranks' output passed the log cap"), 1);
    cr_assert_eq(rec.nwarnings, 5);
    finish(&job);
}

Test(job, without_a_log_dir_logs_go_to_a_fresh_directory)
{
    dk_job_spec_t spec = spec_for(1, NULL);
    spec.log_dir = NULL;
    char state[] = "/tmp/dk-test-state-XXXXXX";
    cr_assert_not_null(mkdtemp(state));
    unsetenv("DISTKERNEL_LOG_DIR");
    setenv("XDG_STATE_HOME", state, 1);
    remove_dir(log_dir);
    log_dir[0] = '\0';
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    char path[512];
    snprintf(path, sizeof path, "%s/rank-0.log", dk_job_log_dir(job));
    cr_assert_eq(access(path, F_OK), 0);
    char want[256];
    snprintf(want, sizeof want, "%s/distkernel/logs/kernel-%d/run-", state, (int) getpid());
    cr_assert(strncmp(dk_job_log_dir(job), want, strlen(want)) == 0, "%s", dk_job_log_dir(job));
    finish(&job);
    int tmp = open("/tmp", O_RDONLY | O_DIRECTORY);
    dk_logdir_remove(tmp, state + 5);
    close(tmp);
}

/* ------------------------------------------------------------------------ */
/* Resources                                                                 */

Test(job, no_descriptor_is_leaked)
{
    int before = count_fds();
    const char *extra[] = {"FAKE_MODE_0=forge_mac", "FAKE_MODE_1=print_lots", NULL};
    dk_job_t *job = run(3, extra);
    finish(&job);

    const char *sleepers[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(2, sleepers);
    job = start(&spec);
    finish(&job);           /* destroyed while running */
    cr_assert_eq(count_fds(), before);
}

/* The back channel's socket directory is made only where nobody else can swap
 * it: a TMPDIR writable by others (and not sticky) is refused, naming TMPDIR. */
Test(job, a_tmpdir_others_can_write_is_refused_for_the_back_channel)
{
    char open_dir[] = "/tmp/dk-test-open-XXXXXX";
    cr_assert_not_null(mkdtemp(open_dir));
    cr_assert_eq(chmod(open_dir, 0777), 0);
    setenv("TMPDIR", open_dir, 1);
    dk_job_spec_t spec = spec_for(1, NULL);
    char err[1024] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    cr_assert_null(job);
    cr_assert(strstr(err, open_dir) && strstr(err, "writable by other users") &&
              strstr(err, "TMPDIR"), "%s", err);
    rmdir(open_dir);
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* Persistent jobs: rounds on ranks that stay                                */

static dk_job_t *start_persistent(int world_size, double idle_timeout_s)
{
    const char *extra[] = {"FAKE_MODE=rounds", NULL};
    dk_job_spec_t spec = spec_for(world_size, extra);
    spec.persistent = true;
    spec.idle_timeout_s = idle_timeout_s;
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_round_wait(job, 20000), "the ranks never all said HELLO");
    cr_assert_eq(dk_job_round_end(job), DK_END_OK);
    return job;
}

/* Submit ACTION as the next round and wait for it to end. */
static dk_job_end_t round_of(dk_job_t *job, const char *action)
{
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, action, strlen(action), 0, err, sizeof err), 0, "%s", err);
    cr_assert(dk_job_round_wait(job, 20000), "the round did not end");
    return dk_job_round_end(job);
}

Test(job, a_persistent_job_runs_rounds_on_the_same_ranks)
{
    dk_job_t *job = start_persistent(2, 0);
    int pids[2] = {dk_job_rank_pid(job, 0), dk_job_rank_pid(job, 1)};
    for (int round = 1; round <= 3; round++) {
        cr_assert_eq(round_of(job, "result"), DK_END_OK);
        for (int r = 0; r < 2; r++) {
            char expected[64];
            snprintf(expected, sizeof expected, "round=%d rank=%d", round, r);
            cr_assert_str_eq(rec.msg[r].buf, expected);
            cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
            cr_assert_eq(dk_job_rank_pid(job, r), pids[r]);
        }
    }
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    /* A second submit while a round runs is refused. */
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "sleep", 5, 0, err, sizeof err), 0);
    wait_output(0, "sleeping 4");
    cr_assert_eq(dk_job_submit(job, "result", 6, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "still running"), "%s", err);
    dk_job_interrupt(job);
    cr_assert(dk_job_round_wait(job, 20000));
    cr_assert_eq(dk_job_round_end(job), DK_END_CANCELLED);
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    cr_assert_str_eq(rec.msg[1].buf, "round=5 rank=1");
    finish(&job);
    cr_assert_eq(kill(pids[0], 0), -1, "rank 0 outlived its job");
}

Test(job, an_error_ends_the_round_not_the_job)
{
    dk_job_t *job = start_persistent(2, 0);
    cr_assert_eq(round_of(job, "error@1"), DK_END_FAILED);
    cr_assert_eq(dk_job_round_root_cause(job), 1);
    cr_assert(rec.msg_error[1]);
    cr_assert_str_eq(rec.msg[1].buf, "boom in round 1 on rank 1");
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    finish(&job);
}

Test(job, a_rank_that_exits_ends_every_rank_with_it_as_root_cause)
{
    dk_job_t *job = start_persistent(2, 0);
    cr_assert_eq(round_of(job, "exit3@0"), DK_END_FAILED);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 0);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 3);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "result", 6, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "ended"), "%s", err);
    finish(&job);
}

Test(job, a_rank_stuck_after_an_interrupt_ends_the_job_after_the_grace)
{
    dk_job_t *job = start_persistent(2, 0);
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "stuck@1", 7, 0, err, sizeof err), 0);
    wait_output(1, "stuck 1");
    double t0 = now_s();
    dk_job_interrupt(job);
    cr_assert(dk_job_round_wait(job, 20000));
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_geq(now_s() - t0, FAST_GRACE - 0.05);
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    cr_assert_eq(dk_job_round_end(job), DK_END_CANCELLED);
    cr_assert(warned("did not return to the prompt"));
    finish(&job);
}

Test(job, the_round_timeout_interrupts_and_keeps_the_ranks)
{
    dk_job_t *job = start_persistent(2, 0);
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "sleep", 5, 1.0, err, sizeof err), 0, "%s", err);
    cr_assert(dk_job_round_wait(job, 20000));
    cr_assert_eq(dk_job_round_end(job), DK_END_TIMEOUT);
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    finish(&job);
}

/* An interrupt that comes before the ranks have read their task is not lost
 * (they ignore SIGINT between tasks): it is sent again until they answer, and
 * the round ends interrupted with the ranks kept, not as stuck ranks. */
Test(job, an_interrupt_right_after_a_submit_reaches_the_ranks)
{
    dk_job_t *job = start_persistent(2, 0);
    for (int i = 0; i < 5; i++) {
        char err[256] = "";
        cr_assert_eq(dk_job_submit(job, "sleep", 5, 0, err, sizeof err), 0, "%s", err);
        dk_job_interrupt(job);
        cr_assert(dk_job_round_wait(job, 20000));
        cr_assert_eq(dk_job_round_end(job), DK_END_CANCELLED);
        cr_assert_eq(dk_job_end(job), DK_END_NONE, "the ranks were ended (round %d)", i);
        cr_assert_not(warned("did not return to the prompt"));
    }
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    finish(&job);
}

Test(job, an_idle_persistent_job_ends_after_its_idle_timeout)
{
    dk_job_t *job = start_persistent(2, 3);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    cr_assert(dk_job_wait(job, 20000), "the idle job never ended");
    cr_assert_eq(dk_job_end(job), DK_END_IDLE);
    for (int r = 0; r < 2; r++)
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED, "rank %d: state %d code %d",
                     r, dk_job_rank_state(job, r), dk_job_rank_exit_code(job, r));
    finish(&job);
}

Test(job, an_answer_naming_another_round_closes_the_connection)
{
    dk_job_t *job = start_persistent(2, 0);
    cr_assert_neq(round_of(job, "bad_round@1"), DK_END_OK);
    cr_assert(warned("did not name the current round"));
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    finish(&job);
}

/* The state letter of PID in /proc/PID/stat, '?' when unreadable. */
static char proc_state(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

/* A SIGKILLed rank's main thread is a zombie before its other threads have
 * ended; waitid and the runtime thread see the process exit only after the
 * last. The look before a cell is sent must count it already: a user who saw
 * the rank die (ps shows it <defunct>) gets "the ranks are gone", not a cell
 * that fails as if it had killed the rank. */
Test(job, a_rank_whose_main_thread_is_a_zombie_counts_as_exited)
{
    dk_job_t *job = start_persistent(2, 0);
    cr_assert_not(dk_job_any_rank_exited(job));
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "leader_exit@1", 13, 0, err, sizeof err), 0, "%s", err);
    wait_output(1, "leader exiting 1");
    int pid = dk_job_rank_pid(job, 1);
    for (int i = 0; i < 500 && proc_state(pid) != 'Z'; i++)
        usleep(10 * 1000);
    cr_assert_eq(proc_state(pid), 'Z', "rank 1's main thread did not end");
    siginfo_t si;
    memset(&si, 0, sizeof si);
    cr_assert_eq(waitid(P_PID, (id_t) pid, &si, WEXITED | WNOHANG | WNOWAIT), 0);
    cr_assert_eq(si.si_pid, 0, "the process was collectable: the test shows nothing");
    cr_assert(dk_job_any_rank_exited(job));
    cr_assert_eq(dk_job_end(job), DK_END_NONE);
    finish(&job);
}

Test(job, each_round_can_have_its_own_log_dir)
{
    dk_job_t *job = start_persistent(1, 0);
    char dir2[300], err[256] = "";
    snprintf(dir2, sizeof dir2, "%s-2", log_dir);
    cr_assert_eq(dk_job_set_log_dir(job, dir2, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(dk_job_log_dir(job), dir2);
    cr_assert_eq(dk_job_submit(job, "sleep", 5, 0, err, sizeof err), 0, "%s", err);
    wait_output(0, "sleeping 1");
    dk_job_interrupt(job);
    cr_assert(dk_job_round_wait(job, 20000));
    finish(&job);
    char path[512], text[256] = "";
    snprintf(path, sizeof path, "%s/rank-0.log", dir2);
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no %s", path);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_assert(strstr(text, "sleeping 1"), "the round's log has: %s", text);
    remove_dir(dir2);
}

/* ------------------------------------------------------------------------ */
/* The back channel's size limit, kernel and rank side                       */

Test(job, a_task_larger_than_a_rank_accepts_is_refused_before_it_is_sent)
{
    dk_job_t *job = start_persistent(1, 0);
    char err[256] = "";
    /* Refused on its length alone: nothing of it is read or copied. */
    static const char small[1];
    cr_assert_eq(dk_job_submit(job, small, DK_BC_TASK_MAX + 1, 0, err, sizeof err), -1);
    cr_assert(strstr(err, "at most 1 GiB"), "%s", err);
    cr_assert_eq(round_of(job, "result"), DK_END_OK);
    finish(&job);
}

#ifndef PYTHON3
#define PYTHON3 "/usr/bin/python3"
#endif

/* python/distkernel/_backchannel.py accepts the largest TASK frame the kernel
 * sends and refuses one byte more; distkernel._rank._serve ends cleanly when
 * the channel closes and fails on a bad frame (tests/unit/bc_limits.py). */
Test(backchan, the_rank_side_accepts_exactly_what_the_kernel_sends, .timeout = 60)
{
    char a[4][32];
    snprintf(a[0], sizeof a[0], "%zu", DK_BC_PAYLOAD_MAX);
    snprintf(a[1], sizeof a[1], "%zu", (size_t) DK_BC_FRAME_MAX);
    snprintf(a[2], sizeof a[2], "%zu", DK_BC_TASK_MAX);
    snprintf(a[3], sizeof a[3], "%d", DK_BC_MAC_LEN);
    cr_assert_eq(DK_BC_FRAME_MAX, (size_t) DK_BC_MAC_LEN + 5 + DK_BC_PAYLOAD_MAX);
    cr_assert_eq(DK_BC_TASK_MAX + 4, DK_BC_PAYLOAD_MAX);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        setenv("PYTHONPATH", PY_SRC, 1);
        execl(PYTHON3, PYTHON3, BC_LIMITS_PY, a[0], a[1], a[2], a[3], (char *) NULL);
        _exit(127);
    }
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "bc_limits.py failed (status %d): see its stderr", status);
}

/* ------------------------------------------------------------------------ */
/* Ranks on other nodes: the back channel over TCP                          */

#include "proc_alive.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

static dk_job_spec_t tcp_spec(int world_size, const char *const *extra)
{
    dk_job_spec_t spec = spec_for(world_size, extra);
    spec.bc_tcp_addr = "127.0.0.1";
    return spec;
}

static int connect_v4(const char *addr, int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
    inet_pton(AF_INET, addr, &sa.sin_addr);
    int rc = connect(fd, (struct sockaddr *) &sa, sizeof sa);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

Test(tcp, the_listener_is_bound_to_the_given_address_only)
{
    dk_backchan_sink_t none = {0};
    dk_backchan_opts_t opts = {.tcp_addr = "127.0.0.1"};
    char err[512] = "";
    dk_backchan_t *ch = dk_backchan_new_opts(1, false, "x", 1, &none, &opts, err, sizeof err);
    cr_assert_not_null(ch, "%s", err);
    int port = dk_backchan_port(ch);
    cr_assert_gt(port, 0);
    char want[64];
    snprintf(want, sizeof want, "tcp:127.0.0.1:%d", port);
    cr_assert_str_eq(dk_backchan_address(ch), want);
    cr_assert_null(dk_backchan_path(ch));
    cr_assert_eq(connect_v4("127.0.0.1", port), 0, "%s", strerror(errno));
    /* Another address of this same host: nothing listens there. */
    cr_assert_neq(connect_v4("127.0.0.2", port), 0);
    cr_assert_eq(errno, ECONNREFUSED);
    dk_backchan_destroy(&ch);
}

Test(tcp, a_wildcard_or_a_name_is_refused_with_what_to_give)
{
    dk_backchan_sink_t none = {0};
    const char *bad[] = {"0.0.0.0", "::", "localhost"};
    const char *why[] = {"every network", "every network", "not a numeric"};
    for (int i = 0; i < 3; i++) {
        dk_backchan_opts_t opts = {.tcp_addr = bad[i]};
        char err[512] = "";
        dk_backchan_t *ch = dk_backchan_new_opts(1, false, "x", 1, &none, &opts, err, sizeof err);
        cr_assert_null(ch, "%s was accepted", bad[i]);
        cr_assert(strstr(err, why[i]), "%s: %s", bad[i], err);
    }
}

Test(tcp, ranks_connect_over_tcp_and_their_results_and_payload_arrive_intact, .timeout = 60)
{
    size_t len = 4u << 20;
    unsigned char *payload = malloc(len);
    for (size_t i = 0; i < len; i++)
        payload[i] = (unsigned char) (i * 2654435761u >> 13);
    char digest[65];
    sha256_hex(payload, len, digest);
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = tcp_spec(3, extra);
    spec.payload = payload;
    spec.payload_len = len;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 3; r++) {
        char want[160];
        snprintf(want, sizeof want, "rank=%d len=%zu sha256=%s", r, len, digest);
        cr_assert_str_eq(rec.msg[r].buf, want);
        cr_assert_str_eq(env_of(r, "DISTKERNEL_BC"), dk_job_bc_address(job));
        cr_assert(output_has(r, 1, "KEYLEN 64"));
    }
    cr_assert(!strncmp(dk_job_bc_address(job), "tcp:127.0.0.1:", 14), "%s",
              dk_job_bc_address(job));
    free(payload);
    finish(&job);
}

/* MASTER_PORT from rank 0: ranks that said HELLO before rank 0 wait for its
 * port, every rank gets the same one before its PAYLOAD, and none is given a
 * MASTER_PORT in its environment. */
Test(tcp, the_port_rank_0_sends_reaches_every_rank_before_its_payload, .timeout = 60)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", "FAKE_CONNECT_DELAY_MS_0=700",
                           "FAKE_SEND_PORT_0=23456", NULL};
    dk_job_spec_t spec = tcp_spec(3, extra);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 3; r++) {
        cr_assert(output_has(r, 1, "port 23456\n"), "rank %d", r);
        cr_assert_not(output_has(r, 1, "MASTER_PORT was set"), "rank %d", r);
        cr_assert_str_eq(env_of(r, "DISTKERNEL_MASTER_PORT"), "rank0");
        cr_assert(strncmp(rec.msg[r].buf, "rank=", 5) == 0, "rank %d: %s", r, rec.msg[r].buf);
    }
    cr_assert_eq(dk_job_master_port(job), 0);
    finish(&job);
}

static void port_refused(const char *setting, const char *why)
{
    const char *extra[] = {setting, NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    spec.grace_s = FAST_GRACE;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert(warned(why), "no warning \"%s\"", why);
    finish(&job);
}

Test(tcp, a_port_from_a_rank_other_than_0_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_1=23456", "a port nobody asked for");
}

Test(tcp, a_port_of_0_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_0=0", "did not hold a TCP port");
}

Test(tcp, a_port_past_65535_is_refused, .timeout = 60)
{
    port_refused("FAKE_SEND_PORT_0=70000", "did not hold a TCP port");
}

/* Without bc_tcp_addr there is no channel a port could come back over. */
Test(tcp, a_port_from_rank_0_needs_the_tcp_channel)
{
    dk_job_spec_t spec = spec_for(1, NULL);
    spec.master_port = DK_JOB_PORT_FROM_RANK0;
    char err[256] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    cr_assert_null(job);
    cr_assert(strstr(err, "DK_JOB_PORT_FROM_RANK0 with bc_tcp_addr"), "%s", err);
}

Test(tcp, a_forged_mac_over_tcp_is_refused)
{
    const char *extra[] = {"FAKE_MODE_0=forge_mac", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(output_has(0, 1, "refused as expected"));
    cr_assert(warned("did not verify"));
    finish(&job);
}

Test(tcp, output_sent_as_frames_reaches_the_sink_and_the_log_in_order, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=print_lots", "FAKE_LINES=3000", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        const char *out = rec.out[r][1].buf, *err = rec.out[r][2].buf;
        cr_assert(out && err, "rank %d: no output came", r);
        const char *at_out = out, *at_err = err;
        for (int i = 0; i < 3000; i++) {
            char line[32];
            snprintf(line, sizeof line, "out %d\n", i);
            at_out = strstr(at_out, line);
            cr_assert_not_null(at_out, "rank %d: \"out %d\" missing or out of order", r, i);
            snprintf(line, sizeof line, "err %d\n", i);
            at_err = strstr(at_err, line);
            cr_assert_not_null(at_err, "rank %d: \"err %d\" missing or out of order", r, i);
        }
        cr_assert_gt(rec.ncaught_up[r][1], 0);
        char path[512];
        snprintf(path, sizeof path, "%s/rank-%d.log", log_dir, r);
        FILE *f = fopen(path, "r");
        cr_assert_not_null(f);
        char *text = calloc(1, 1 << 20);
        size_t n = fread(text, 1, (1 << 20) - 1, f);
        fclose(f);
        text[n] = '\0';
        cr_assert(strstr(text, "out 2999\n") && strstr(text, "err 2999\n"));
        free(text);
    }
    finish(&job);
}

Test(tcp, a_childs_output_and_the_last_words_arrive_before_the_result)
{
    const char *extra[] = {"FAKE_MODE=spawn_writer", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        cr_assert(output_has(r, 1, "child-out"), "rank %d", r);
        cr_assert(output_has(r, 2, "child-err"), "rank %d", r);
        cr_assert(rec.last_words_first[r], "rank %d: its last output came after its result", r);
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
    }
    finish(&job);
}

Test(tcp, silent_ranks_are_lost_and_told_by_node, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=freeze", "FAKE_MODE_3=freeze", NULL};
    const char *hosts[] = {"node1", "node1", "node2", "node2"};
    dk_job_spec_t spec = tcp_spec(4, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    int root = dk_job_root_cause(job);
    cr_assert(root == 2 || root == 3, "root cause %d", root);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    cr_assert_str_eq(rec.lost_host[2], "node2");
    cr_assert_str_eq(rec.lost_host[3], "node2");
    /* Each rank went silent on its own, and the node is told once. */
    cr_assert_eq(warned_times("on node2 lost: "), 1);
    cr_assert_str_eq(rec.lost_host[0], "");
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    /* told by the first of the two to be found silent */
    cr_assert(warned(root == 2 ? "rank 2 on node2 lost: " : "rank 3 on node2 lost: "));
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    finish(&job);
}

/* Ten nodes go quiet at once: the cell is told of the first eight, one line
 * each, and then once that more went; the summary still names all ten. */
Test(tcp, past_eight_lost_nodes_one_line_says_more_went, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=freeze", "FAKE_MODE_0=sleep", NULL};
    const char *hosts[] = {"node0", "node1", "node2", "node3", "node4", "node5",
                           "node6", "node7", "node8", "node9", "node10"};
    dk_job_spec_t spec = tcp_spec(11, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    for (int r = 1; r < 11; r++)
        cr_assert(dk_job_rank_lost(job, r), "rank %d", r);
    cr_assert_eq(warned_times(" lost: "), 8);
    cr_assert_eq(warned_times("more nodes were lost; the run's error names every one"), 1);
    char summary[512];
    dk_job_lost_summary(job, summary, sizeof summary);
    for (int n = 1; n <= 10; n++) {
        char clause[32];
        snprintf(clause, sizeof clause, "node%d lost (rank %d)", n, n);
        cr_assert(strstr(summary, clause), "%s not in: %s", clause, summary);
    }
    finish(&job);
}

/* Node2 goes quiet while rank 2 is still starting: rank 3's connection times
 * out, and rank 2, which never connected, is lost with its node rather than
 * reported as a rank ended after rank 3 failed. */
Test(tcp, a_rank_still_starting_on_a_lost_node_is_lost_with_it, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=freeze_at_start", "FAKE_MODE_3=freeze",
                           NULL};
    const char *hosts[] = {"node1", "node1", "node2", "node2"};
    dk_job_spec_t spec = tcp_spec(4, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 3);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    cr_assert_str_eq(rec.lost_host[2], "node2");
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("rank 2 on node2 lost with it: it had not connected yet"));
    finish(&job);
}

/* Rank 0 raises gloo's "Connection closed by peer" because node2 went
 * quiet; the kernel learns that only at the heartbeat deadline. The echo
 * waits for it: node2 is the root cause, not rank 0. */
Test(tcp, a_peers_connection_error_waits_for_the_lost_node_it_echoes, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_0=echo_error", "FAKE_MODE_1=freeze", NULL};
    const char *hosts[] = {"node1", "node2"};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(dk_job_rank_lost(job, 1));
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (rank 1)");
    finish(&job);
}

/* Ranks 0 and 1 both raise gloo's "Connection closed by peer" because node2
 * went quiet. The second echo is no news of the peer that went: both wait
 * for the heartbeat deadline, and node2 is the root cause, not rank 0 or 1. */
Test(tcp, two_echoes_of_a_lost_node_wait_for_it_together, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_0=echo_error", "FAKE_MODE_1=echo_error",
                           "FAKE_MODE_2=freeze", NULL};
    const char *hosts[] = {"node1", "node1", "node2"};
    dk_job_spec_t spec = tcp_spec(3, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 2);
    cr_assert(dk_job_rank_lost(job, 2));
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (rank 2)");
    finish(&job);
}

/* A node that goes down while all its ranks are still starting leaves no
 * connection to go silent: launched ranks not connected by the connect
 * deadline, their launchers still running, are lost with their node. */
Test(tcp, launched_ranks_not_connected_by_the_deadline_are_lost_with_their_node, .timeout = 60)
{
    static const char *const cmd[] = {FAKE_RANK, NULL};
    static const char *const *cmds[4] = {cmd, cmd, cmd, cmd};
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=freeze_at_start",
                           "FAKE_MODE_3=freeze_at_start", NULL};
    const char *hosts[] = {"node1", "node1", "node2", "node2"};
    dk_job_spec_t spec = tcp_spec(4, extra);
    spec.heartbeat_s = 2.0;
    spec.connect_timeout_s = 3.0;
    spec.rank_hosts = hosts;
    spec.rank_commands = cmds;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("had not connected 3 s after its launch"));
    finish(&job);
}

Test(tcp, a_heartbeat_deadline_shorter_than_two_pings_is_refused)
{
    dk_job_spec_t spec = tcp_spec(1, NULL);
    spec.heartbeat_s = 1.5;
    char err[256] = "";
    cr_assert_null(dk_job_start(&spec, &sink, err, sizeof err));
    cr_assert(strstr(err, "heartbeat_s is 1.5; it must be at least 2"), "%s", err);
}

Test(tcp, a_job_without_lost_ranks_has_an_empty_summary)
{
    dk_job_spec_t spec = tcp_spec(1, NULL);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000));
    char summary[64] = "x";
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "");
    finish(&job);
}

/* The host freezes (as a SIGKILLed kernel's node, or a cut network, looks from
 * a rank): every rank ends itself once the host has been silent past the
 * deadline. Nothing else would end them here: the host process still exists,
 * so PR_SET_PDEATHSIG never fires. */
/* Start a 2-rank job over TCP in a child (the host) with SPEC's ranks, wait
 * for both to print "sleeping", freeze the host, and tell whether both ranks
 * were gone within 10 s. */
static bool ranks_gone_after_the_host_freezes(dk_job_spec_t spec)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t host = fork();
    if (host == 0) {
        close(fds[0]);
        spec.heartbeat_s = 2.0;
        char err[512];
        dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
        if (!job)
            _exit(2);
        for (int i = 0; i < 1000 && !(output_has(0, 1, "sleeping") &&
                                      output_has(1, 1, "sleeping")); i++)
            usleep(10000);
        int pids[2] = {dk_job_rank_pid(job, 0), dk_job_rank_pid(job, 1)};
        if (write(fds[1], pids, sizeof pids) != (ssize_t) sizeof pids)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    int pids[2];
    cr_assert_eq(read(fds[0], pids, sizeof pids), (ssize_t) sizeof pids, "the host did not start");
    cr_assert(alive(pids[0]) && alive(pids[1]));
    kill(host, SIGSTOP);
    bool gone = gone_within(pids[0], 10000) && gone_within(pids[1], 2000);
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    if (log_dir[0])
        remove_dir(log_dir);
    return gone;
}

Test(tcp, ranks_end_themselves_when_their_host_goes_silent, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    cr_assert(ranks_gone_after_the_host_freezes(tcp_spec(2, extra)),
              "a rank outlived its silent host");
}

#ifndef RANK_PY
#define RANK_PY "import sys; from distkernel import _rank; sys.exit(_rank.main())"
#endif

/* The cell's job, pickled by the real cloudpickle, into BUF; its length. */
static size_t cell_payload(const char *code, char *buf, size_t size)
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

static const char *python_rank_argv[] = {PYTHON3, "-c", RANK_PY, NULL};

/* The same run by distkernel-rank, as ranks are run, with this tree's Python
 * (not the installed one). Under the sanitizers it is instrumented too: what
 * its embedded CPython keeps at exit is not ours to report (as in
 * test_template.c). */
static dk_job_spec_t rank_exe_spec(int world_size, const void *payload, size_t len)
{
    static const char *extra[] = {"PYTHONPATH=" PY_SRC, "DISTKERNEL_GLUE_DIR=" PY_SRC,
                                  "ASAN_OPTIONS=detect_leaks=0", NULL};
    dk_job_spec_t spec = tcp_spec(world_size, extra);
    spec.rank_exe = RANK_EXE;
    spec.payload = payload;
    spec.payload_len = len;
    return spec;
}

static dk_job_spec_t python_spec(int world_size, const void *payload, size_t len)
{
    static const char *extra[] = {"PYTHONPATH=" PY_SRC, NULL};
    dk_job_spec_t spec = tcp_spec(world_size, extra);
    spec.rank_exe = PYTHON3;
    spec.rank_argv = python_rank_argv;
    spec.payload = payload;
    spec.payload_len = len;
    return spec;
}

Test(tcp, python_ranks_end_themselves_when_their_host_goes_silent, .timeout = 60)
{
    static char payload[65536];
    size_t len = cell_payload("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n",
                              payload, sizeof payload);
    cr_assert(ranks_gone_after_the_host_freezes(python_spec(2, payload, len)),
              "a Python rank outlived its silent host");
}

Test(tcp, rank_programs_end_themselves_when_their_host_goes_silent, .timeout = 60)
{
    static char payload[65536];
    size_t len = cell_payload("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n",
                              payload, sizeof payload);
    cr_assert(ranks_gone_after_the_host_freezes(rank_exe_spec(2, payload, len)),
              "a rank outlived its silent host");
}

/* A SIGKILLed host shows on a remote rank's connection as a close, not as
 * silence, and nothing else reaches a rank on another node (srun dies with the
 * host; its tasks do not). Here each rank's launcher is `setsid -w`, so the
 * Python rank is in a session of its own, out of reach of the parent-death
 * signal and the sentinel, as a task of srun on another node is; it prints
 * its pid, the host is SIGKILLed, and the rank must end itself. */
/* SPEC's one rank, started by CMD (in a session of its own), says "sleeping
 * PID"; its host is SIGKILLed: whether the rank is gone within 15 s. */
static bool rank_gone_after_its_host_is_killed(dk_job_spec_t spec, const char *const *cmd)
{
    static const char *const *cmds[1];
    cmds[0] = cmd;
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t host = fork();
    if (host == 0) {
        close(fds[0]);
        spec.heartbeat_s = 2.0;
        spec.rank_commands = cmds;
        char err[512];
        dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
        if (!job)
            _exit(2);
        for (int i = 0; i < 2000 && !output_has(0, 1, "sleeping "); i++)
            usleep(10000);
        const char *at = output_has(0, 1, "sleeping ") ? strstr(rec.out[0][1].buf, "sleeping ")
                                                       : NULL;
        int pid = at ? atoi(at + 9) : 0;
        if (write(fds[1], &pid, sizeof pid) != (ssize_t) sizeof pid)
            _exit(3);
        for (;;)
            pause();
    }
    close(fds[1]);
    int pid = 0;
    cr_assert_eq(read(fds[0], &pid, sizeof pid), (ssize_t) sizeof pid, "the host did not start");
    cr_assert_gt(pid, 0, "the rank did not say its pid");
    cr_assert(alive(pid));
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
    bool gone = gone_within(pid, 15000);
    if (!gone)
        kill(pid, SIGKILL);
    if (log_dir[0])
        remove_dir(log_dir);
    return gone;
}

Test(tcp, python_ranks_end_themselves_when_their_host_is_killed, .timeout = 60)
{
    static char payload[65536];
    size_t len = cell_payload("import os, time\nprint('sleeping', os.getpid(), flush=True)\n"
                              "time.sleep(60)\n", payload, sizeof payload);
    static const char *cmd[] = {"setsid", "-w", PYTHON3, "-c", RANK_PY, NULL};
    cr_assert(rank_gone_after_its_host_is_killed(python_spec(1, payload, len), cmd),
              "a remote rank outlived its SIGKILLed host");
}

/* ... and so does distkernel-rank while its main thread holds the GIL (a C
 * call through ctypes.PyDLL): the Python thread that would see the close
 * cannot run, the native one that sends PINGs finds the connection broken. */
Test(tcp, a_rank_holding_the_gil_ends_itself_when_its_host_is_killed, .timeout = 60)
{
    static char payload[65536];
    size_t len = cell_payload("import ctypes, os\nprint('sleeping', os.getpid(), flush=True)\n"
                              "ctypes.PyDLL(None).sleep(60)\n", payload, sizeof payload);
    static const char *cmd[] = {"setsid", "-w", RANK_EXE, NULL};
    cr_assert(rank_gone_after_its_host_is_killed(rank_exe_spec(1, payload, len), cmd),
              "a rank holding the GIL outlived its SIGKILLed host");
}

/* The real rank side (python/distkernel/_rank.py and _backchannel.py) over
 * TCP: its print()s, a child's writes and C-level writes arrive as OUTPUT
 * frames (fd 1 is no longer the runtime's pipe), and its value intact. */
static void output_and_result(bool rank_exe);

Test(tcp, the_python_rank_over_tcp_sends_its_output_and_result, .timeout = 90)
{
    output_and_result(false);
}

/* The same run by distkernel-rank, whose frames and PINGs are sent by C
 * (runtime/rank/dk_rankchan.c). */
Test(tcp, the_rank_program_over_tcp_sends_its_output_and_result, .timeout = 90)
{
    output_and_result(true);
}

static void output_and_result(bool rank_exe)
{
    const char *code =
        "import os\n"
        "print('hello from', os.environ['RANK'])\n"
        "os.system('echo child-' + os.environ['RANK'] + '; echo child-err >&2')\n"
        "os.write(2, b'c-level-err\\n')\n"
        "'value-' + os.environ['RANK'] * 3\n";
    static char payload[65536];
    size_t len = cell_payload(code, payload, sizeof payload);
    dk_job_spec_t spec = rank_exe ? rank_exe_spec(2, payload, len) : python_spec(2, payload, len);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    for (int r = 0; r < 2; r++) {
        char want[64];
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE, "rank %d: %s %s", r,
                     rec.out[r][2].buf ? rec.out[r][2].buf : "", rec.msg[r].buf ? rec.msg[r].buf : "");
        snprintf(want, sizeof want, "hello from %d\n", r);
        cr_assert(output_has(r, 1, want), "rank %d: %s", r, rec.out[r][1].buf);
        snprintf(want, sizeof want, "child-%d\n", r);
        cr_assert(output_has(r, 1, want), "rank %d: %s", r, rec.out[r][1].buf);
        cr_assert(output_has(r, 2, "child-err\n"));
        cr_assert(output_has(r, 2, "c-level-err\n"));
        /* ... and all of it before the result. */
        cr_assert_not_null(memmem(rec.out[r][2].buf, rec.out_len_at_msg[r][2], "c-level-err\n", 12),
                           "rank %d: its last output came after its result", r);
        cr_assert_not_null(memmem(rec.out[r][1].buf, rec.out_len_at_msg[r][1], want, strlen(want)),
                           "rank %d: its output came after its result", r);
        snprintf(want, sizeof want, "value-%d%d%d", r, r, r);
        cr_assert(!rec.msg_error[r]);
        cr_assert_not_null(memmem(rec.msg[r].buf, rec.msg[r].len, want, strlen(want)),
                           "rank %d's value is not in its result", r);
    }
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    finish(&job);
}

/* Ranks busy in their work for longer than the deadline send nothing of their
 * own: the heartbeats both ways keep them, and the job, alive. */
Test(tcp, quiet_ranks_outlive_the_deadline_on_heartbeats, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_SLEEP_S=4", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(dk_job_rank_state(job, r), DK_RANK_DONE);
        cr_assert(!dk_job_rank_lost(job, r));
    }
    finish(&job);
}

Test(tcp, output_for_another_fd_closes_the_connection_with_a_warning)
{
    const char *extra[] = {"FAKE_MODE_1=bad_output", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(output_has(1, 1, "refused as expected"));
    cr_assert(warned("not for fd 1 or 2"));
    finish(&job);
}

/* What a rank says about itself for its log (DK_BC_OUTPUT_LOG: a folder of
 * its node it would not use) goes to rank-N.log, never to the sink. */
Test(tcp, a_ranks_note_for_its_log_goes_to_its_log_only)
{
    const char *extra[] = {"FAKE_MODE_1=log_note", NULL};
    dk_job_t *job = run(2, extra);
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_expect(!output_has(1, 1, "a note") && !output_has(1, 2, "a note"),
              "the note reached the cell");
    char path[512];
    snprintf(path, sizeof path, "%s/rank-1.log", log_dir);
    size_t len = 0;
    char *log = read_file(path, &len);
    cr_assert_not_null(log);
    cr_expect_not_null(strstr(log, "a note about itself\n"), "rank-1.log: %s", log);
    free(log);
    finish(&job);
}

/* The runtime's own loop held up past the deadline (a slow sink, a stalled
 * disk) is not the rank's silence: what the rank sent meanwhile is waiting
 * unread. */
Test(tcp, a_runtime_held_up_past_the_deadline_does_not_take_its_ranks_for_lost, .timeout = 60)
{
    char dir[] = "/tmp/dk-test-hold-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    hold_dir = dir;
    const char *extra[] = {"FAKE_MODE=hold", "FAKE_SLEEP_S=3", "FAKE_RANK_DEADLINE=30", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    char held[512], release[512];
    snprintf(held, sizeof held, "%s/held", dir);
    snprintf(release, sizeof release, "%s/release", dir);
    for (int i = 0; i < 2000 && access(held, F_OK) != 0; i++)
        usleep(10000);
    cr_assert_eq(access(held, F_OK), 0, "the runtime was never held");
    usleep(4500000);            /* 2.25 heartbeat deadlines */
    FILE *f = fopen(release, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    cr_assert(!dk_job_rank_lost(job, 0));
    finish(&job);
    unlink(held);
    unlink(release);
    rmdir(dir);
}

/* Started ranks over TCP: idle between cells for longer than the deadline,
 * kept by the heartbeats, then a cell's output and value. */
Test(tcp, python_started_ranks_over_tcp_idle_past_the_deadline_then_run_a_cell, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload("import os\nprint('cell on', os.environ['RANK'])\n6 * 7\n", payload,
                              sizeof payload);
    dk_job_spec_t spec = python_spec(2, NULL, 0);
    spec.persistent = true;
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_round_wait(job, 60000), "the ranks never said HELLO");
    cr_assert_eq(dk_job_round_end(job), DK_END_OK);
    usleep(4500000);            /* idle for 2.25 deadlines */
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, payload, len, 0, err, sizeof err), 0, "%s (%s)", err,
                 rec.nwarnings ? rec.warnings[0] : "");
    cr_assert(dk_job_round_wait(job, 60000));
    cr_assert_eq(dk_job_round_end(job), DK_END_OK);
    for (int r = 0; r < 2; r++) {
        char want[32];
        snprintf(want, sizeof want, "cell on %d\n", r);
        cr_assert(output_has(r, 1, want), "rank %d: %s", r, rec.out[r][1].buf);
        cr_assert(!dk_job_rank_lost(job, r));
        /* cloudpickle's 42: BININT1 (K) 42 (*) */
        cr_assert_not_null(memmem(rec.msg[r].buf, rec.msg[r].len, "K*", 2));
    }
    finish(&job);
}

/* A launcher that exits on its own (srun whose node was cut off) while its
 * rank's connection is still open and unanswered: the verdict waits for the
 * heartbeats, which tell the rank lost. */
Test(tcp, a_launcher_exiting_while_its_connection_is_open_waits_for_the_heartbeats, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=orphan_silent", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    int orphan = 0;
    const char *at = rec.out[0][1].buf ? strstr(rec.out[0][1].buf, "ORPHAN ") : NULL;
    if (at)
        orphan = atoi(at + 7);
    if (orphan > 0)
        kill(orphan, SIGKILL);
    cr_assert_gt(orphan, 0, "no orphan was reported");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 1);
    cr_assert(dk_job_rank_lost(job, 0));
    char summary[64];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "localhost lost (rank 0)");
    finish(&job);
}

/* Node2's processes are killed (their connections close, FIN or RST) while
 * the launchers we see stay (srun of Slurm 22.05.8 off the cluster, bug
 * 16401): the ranks are lost once the heartbeat deadline passes, not when
 * the launchers exit, which would be never. */
Test(tcp, ranks_whose_connections_close_while_their_launchers_stay_are_lost, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", "FAKE_MODE_2=close_hang", "FAKE_MODE_3=close_hang",
                           NULL};
    const char *hosts[] = {"node1", "node1", "node2", "node2"};
    dk_job_spec_t spec = tcp_spec(4, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job waited for the launchers");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    int root = dk_job_root_cause(job);
    cr_assert(root == 2 || root == 3, "root cause %d", root);
    for (int r = 0; r < 4; r++)
        cr_assert_eq(dk_job_rank_lost(job, r), r >= 2, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_assert(warned("on node2 lost: its connection closed without an answer"));
    cr_assert(output_has(2, 1, "closing"));
    /* The stop ladder ended the launchers: nothing of the job is left. */
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    cr_assert_neq(dk_job_rank_state(job, root), DK_RANK_RUNNING);
    finish(&job);
}

/* A launcher that exits within the deadline after its rank's connection
 * closed (srun saying "Node failure on node2"): its own verdict stands. */
Test(tcp, a_launcher_exiting_soon_after_its_connection_closed_keeps_its_verdict, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE_1=close_hang", "FAKE_SLEEP_S=0.5", NULL};
    const char *hosts[] = {"node1", "node2"};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.heartbeat_s = 3.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000));
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert_eq(dk_job_rank_state(job, 1), DK_RANK_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 1), 3);
    cr_assert_not(dk_job_rank_lost(job, 1));
    char summary[64] = "x";
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "");
    finish(&job);
}

/* A healthy peer sees the lost node's connection close (gloo's "Connection
 * closed by peer") and sends its ERROR after the close: the root cause is the
 * lost node, not that echo. */
Test(tcp, a_peers_error_after_a_close_leaves_the_root_cause_to_the_lost_node, .timeout = 60)
{
    char dir[] = "/tmp/dk-test-sync-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char sync[600];
    snprintf(sync, sizeof sync, "FAKE_SYNC=%s", dir);
    const char *extra[] = {"FAKE_MODE_0=error_synced", "FAKE_MODE_1=close_hang", sync, NULL};
    const char *hosts[] = {"node1", "node2"};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.heartbeat_s = 2.0;
    spec.rank_hosts = hosts;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job waited for the launcher");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_str_eq(rec.msg[0].buf, "boom on rank 0");
    cr_assert_eq(dk_job_root_cause(job), 1);
    cr_assert(dk_job_rank_lost(job, 1));
    cr_assert_not(dk_job_rank_lost(job, 0));
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_FAILED);
    char summary[64];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_assert_str_eq(summary, "node2 lost (rank 1)");
    finish(&job);
    remove_dir(dir);
}

/* The words for lost ranks from plain records: one clause per node, runs of
 * ranks with an en dash, nodes in the order of their first lost rank. */
Test(tcp, lost_ranks_are_told_by_node_with_runs)
{
    const char *hosts[] = {"node1", "node1", "node1", "node1", "node2", "node2",
                           "node2", "node2", "node3", "node3", "node3", "node3", NULL};
    bool lost[12] = {false};
    char buf[200];
    dk_lost_format(12, lost, hosts, "; ", buf, sizeof buf);
    cr_assert_str_eq(buf, "");
    for (int r = 4; r < 8; r++)
        lost[r] = true;
    dk_lost_format(12, lost, hosts, "; ", buf, sizeof buf);
    cr_assert_str_eq(buf, "node2 lost (ranks 4" DK_EN_DASH "7)");
    lost[6] = false;
    lost[8] = true;
    lost[10] = lost[11] = true;
    dk_lost_format(12, lost, hosts, "\n", buf, sizeof buf);
    cr_assert_str_eq(buf, "node2 lost (ranks 4" DK_EN_DASH "5, 7)\n"
                          "node3 lost (ranks 8, 10" DK_EN_DASH "11)");
    /* No hosts: every rank is on "localhost". */
    bool one[2] = {false, true};
    dk_lost_format(2, one, NULL, "; ", buf, sizeof buf);
    cr_assert_str_eq(buf, "localhost lost (rank 1)");
    /* Truncated, never overrun. */
    char small[12];
    dk_lost_format(12, lost, hosts, "; ", small, sizeof small);
    cr_assert_eq(strlen(small), sizeof small - 1);
}

/* Reflection (review of issue 13): a PING's body is the same both ways, so
 * without the direction in the MAC a man in the middle could send the
 * runtime's own PING back to it with the seq it expects next, and it would
 * verify. With it, the reflected frame is refused like any forgery, and the
 * rank's connection ends (so the rank fails). */
Test(tcp, a_frame_of_the_runtime_reflected_back_to_it_is_refused, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=reflect", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert(output_has(0, 1, "reflected seq 1"), "the fake rank did not reflect a PING");
    cr_assert(warned("did not verify"), "the reflected PING was not refused");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    finish(&job);
}

/* A remote rank that keeps sending (review of issue 13): when another rank
 * exits, the runtime reads what has arrived before judging it, and that read
 * must end although the flood does not. Here rank 1 finishes while rank 0
 * floods for 60 s: its verdict (DONE) must come while the flood goes on, and
 * a cancel must then end the flooder. Unbounded, the read went on until the
 * flooder, hearing no PING from the runtime stuck in it, took the runtime for
 * dead and ended itself. */
Test(tcp, a_flooding_rank_does_not_hold_up_another_ranks_verdict, .timeout = 150)
{
    const char *extra[] = {"FAKE_MODE_0=flood", "FAKE_MODE_1=sleep", "FAKE_SLEEP_S=2", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    dk_job_t *job = start(&spec);
    bool done = false;
    for (int i = 0; i < 3000 && !done; i++) {
        pthread_mutex_lock(&rec.lock);
        done = rec.nstates[1] > 0 && rec.states[1][rec.nstates[1] - 1] == DK_RANK_DONE;
        pthread_mutex_unlock(&rec.lock);
        if (!done)
            usleep(10000);
    }
    bool flooding = dk_job_end(job) == DK_END_NONE;
    pthread_mutex_lock(&rec.lock);
    size_t dots = rec.out[0][1].len;
    pthread_mutex_unlock(&rec.lock);
    dk_job_cancel(job);
    bool ended = dk_job_wait(job, 60000);
    cr_assert(done, "rank 1's verdict did not come within 30 s while rank 0 flooded: %s %s",
              rec.out[1][1].buf ? rec.out[1][1].buf : "", rec.out[1][2].buf ? rec.out[1][2].buf : "");
    cr_assert(flooding, "the flood ended before rank 1's verdict");
    cr_assert_gt(dots, 1000, "rank 0 did not flood (%zu bytes)", dots);
    cr_assert(ended, "the cancelled job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    finish(&job);
}

/* A TCP listener on 127.0.0.1 that takes no more connections: its accept
 * queue is full and nobody accepts, so Linux drops further SYNs, as a
 * firewall that drops packets does. Returns the listener; *PORT its port;
 * HELD[0..*NHELD) the connections that filled the queue. */
static int dropping_listener(int *port, int *held, int *nheld)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    cr_assert_eq(bind(lfd, (struct sockaddr *) &sa, sizeof sa), 0);
    cr_assert_eq(listen(lfd, 0), 0);
    socklen_t sl = sizeof sa;
    getsockname(lfd, (struct sockaddr *) &sa, &sl);
    *port = ntohs(sa.sin_port);
    *nheld = 0;
    /* Connect until one does not complete: from then on SYNs are dropped. */
    for (int i = 0; i < 16; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        held[(*nheld)++] = fd;
        if (connect(fd, (struct sockaddr *) &sa, sizeof sa) == 0)
            continue;
        cr_assert_eq(errno, EINPROGRESS);
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        if (poll(&p, 1, 500) == 0)
            return lfd;
    }
    cr_assert_fail("the listener's queue never filled");
    return -1;
}

/* A rank whose kernel address does not answer (SYNs dropped) keeps trying,
 * each try bounded by the heartbeat deadline, until the connect deadline
 * (DISTKERNEL_BC_CONNECT_TIMEOUT, the kernel's own: 120 s by default, 5 s
 * here), then gives up saying so on stderr, rather than waiting out the
 * system's connect timeout (about two minutes with tcp_syn_retries 6) once:
 * by then the kernel has counted it lost. */
Test(tcp, a_python_rank_whose_kernel_does_not_answer_gives_up_and_says_so, .timeout = 120)
{
    int port, held[16], nheld;
    int lfd = dropping_listener(&port, held, &nheld);
    int err_pipe[2];
    cr_assert_eq(pipe(err_pipe), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        char bc[64];
        snprintf(bc, sizeof bc, "tcp:127.0.0.1:%d", port);
        setenv("PYTHONPATH", PY_SRC, 1);
        setenv("DISTKERNEL_BC", bc, 1);
        setenv("DISTKERNEL_BC_KEY", "00000000000000000000000000000000"
                                    "00000000000000000000000000000000", 1);
        setenv("DISTKERNEL_BC_HEARTBEAT", "2", 1);
        setenv("DISTKERNEL_BC_CONNECT_TIMEOUT", "5", 1);
        setenv("RANK", "0", 1);
        dup2(err_pipe[1], 2);
        close(err_pipe[0]);
        close(err_pipe[1]);
        execl(PYTHON3, PYTHON3, "-c", RANK_PY, (char *) NULL);
        _exit(127);
    }
    close(err_pipe[1]);
    /* Well inside the system's timeout, well past the deadline of 2 s. */
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < 400 && got == 0; i++) {
        got = waitpid(pid, &status, WNOHANG);
        if (got == 0)
            usleep(100000);
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
    }
    char err[4096] = "";
    ssize_t n = read(err_pipe[0], err, sizeof err - 1);
    err[n > 0 ? n : 0] = '\0';
    close(err_pipe[0]);
    for (int i = 0; i < nheld; i++)
        close(held[i]);
    close(lfd);
    cr_assert_neq(got, 0, "the rank was still connecting after 40 s");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d: %s", status, err);
    char want[128];
    snprintf(want, sizeof want, "could not connect to the kernel's back channel at "
             "127.0.0.1:%d within 5 s (", port);
    cr_assert(strstr(err, want), "stderr: %s", err);
    cr_assert(strstr(err, "tries; the last: no answer)"), "stderr: %s", err);
    cr_assert_null(strstr(err, "(1 tries"), "it tried once: %s", err);
    cr_assert_null(strstr(err, "Traceback"), "stderr: %s", err);
}

/* Issue 21 item 4: a rank whose kernel is not listening yet (refused: a
 * kernel busy taking in hundreds of ranks, or a listen queue another user
 * fills) tries again, with backoff, and is in once it listens. */
#define RETRY_PY                                                                   \
    "import os, socket, threading, time\n"                                        \
    "from distkernel import _backchannel as bc\n"                                 \
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]\n"  \
    "os.environ.update(DISTKERNEL_BC_HEARTBEAT='2', DISTKERNEL_BC_CONNECT_TIMEOUT='10')\n" \
    "def later():\n"                                                              \
    "    time.sleep(1.5); s.listen(1); c, _ = s.accept(); c.sendall(b'n' * 32)\n" \
    "    time.sleep(2)\n"                                                         \
    "threading.Thread(target=later, daemon=True).start()\n"                       \
    "t0 = time.monotonic()\n"                                                     \
    "ch = bc.BackChannel(f'tcp:127.0.0.1:{port}', b'k' * 32, 0)\n"               \
    "print('in after %.1f s' % (time.monotonic() - t0), ch.nonce == b'n' * 32)\n"

/* Run CODE with Debian's python and distkernel's Python glue (30 s at most):
 * its exit status, with stdout and stderr in OUT. */
static int run_python(const char *code, char *out, size_t outlen)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "PYTHONPATH=%s timeout 30 %s -c \"$DK_PY\" 2>&1", PY_SRC, PYTHON3);
    setenv("DK_PY", code, 1);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = '\0';
    int status = pclose(p);
    unsetenv("DK_PY");
    return status;
}

Test(tcp, a_python_rank_keeps_trying_until_the_kernel_listens, .timeout = 60)
{
    char out[4096] = "";
    int status = run_python(RETRY_PY, out, sizeof out);
    cr_assert_eq(status, 0, "%s", out);
    double after = -1;
    cr_assert(sscanf(out, "in after %lf s True", &after) == 1 && strstr(out, "True"), "%s", out);
    cr_assert(after >= 1.4 && after < 5, "in after %.1f s: %s", after, out);
}

/* Issue 22: a kernel whose listen queue takes the connection but which never
 * starts it (no nonce: a kernel too busy taking in hundreds of ranks, a
 * stranger's listener on a reused port) is tried again, each try bounded by
 * the heartbeat deadline, until the connect deadline, and the rank gives up
 * then, naming the deadline, not after one try. */
#define SILENT_PY                                                                  \
    "import os, socket, time\n"                                                   \
    "from distkernel import _backchannel as bc\n"                                 \
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(64)\n"               \
    "port = s.getsockname()[1]\n"                                                 \
    "os.environ.update(DISTKERNEL_BC_HEARTBEAT='2', DISTKERNEL_BC_CONNECT_TIMEOUT='5')\n" \
    "t0 = time.monotonic()\n"                                                     \
    "try:\n"                                                                      \
    "    bc.BackChannel(f'tcp:127.0.0.1:{port}', b'k' * 32, 0)\n"               \
    "except bc.ConnectFailed as e:\n"                                             \
    "    print('gave up after %.1f s:' % (time.monotonic() - t0), e)\n"

Test(tcp, a_python_rank_whose_kernel_never_starts_the_connection_gives_up_at_the_deadline,
     .timeout = 60)
{
    char out[4096] = "";
    int status = run_python(SILENT_PY, out, sizeof out);
    cr_assert_eq(status, 0, "%s", out);
    double after = -1;
    int tries = 0;
    cr_assert(sscanf(out, "gave up after %lf s:", &after) == 1, "%s", out);
    cr_assert(after >= 4.5 && after < 8, "gave up after %.1f s: %s", after, out);
    const char *why = strstr(out, "accepted the connection but did not start it within 5 s (");
    cr_assert(why && sscanf(why, "accepted the connection but did not start it within 5 s "
                            "(%d tries; the last: ", &tries) == 1, "%s", out);
    cr_assert_geq(tries, 2, "%s", out);
}

/* Heartbeats and the GIL (review of issue 13): a rank whose main thread holds
 * the GIL in a long C call (here libc's sleep through ctypes.PyDLL, which,
 * unlike CDLL, keeps the GIL) for three times the deadline is alive, and must
 * not be declared lost: its PINGs come from a thread that needs no GIL. Run
 * by distkernel-rank, as ranks are. */
Test(tcp, a_rank_holding_the_gil_in_a_long_c_call_is_not_lost, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload("import ctypes\nprint('holding', flush=True)\n"
                              "ctypes.PyDLL(None).sleep(6)\nprint('released', flush=True)\n"
                              "'held'\n", payload, sizeof payload);
    dk_job_spec_t spec = rank_exe_spec(1, payload, len);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert(!dk_job_rank_lost(job, 0), "a rank holding the GIL was declared lost");
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE, "exit %d signal %d: %s",
                 dk_job_rank_exit_code(job, 0), dk_job_rank_signal(job, 0),
                 rec.out[0][2].buf ? rec.out[0][2].buf : "");
    cr_assert(output_has(0, 1, "released"));
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    finish(&job);
}

/* ... and its output flows meanwhile: a C call that holds the GIL and writes
 * more than a pipe holds (300 kB to fd 1, through ctypes.PyDLL) used to block
 * for good, since only a Python thread emptied the pipe. The timeout ends it
 * if it does. */
Test(tcp, a_rank_writing_much_while_holding_the_gil_is_not_stuck, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload("import ctypes\n"
                              "ctypes.PyDLL(None).write(1, b'x' * 300000, 300000)\n"
                              "print('released', flush=True)\n'held'\n", payload, sizeof payload);
    dk_job_spec_t spec = rank_exe_spec(1, payload, len);
    spec.heartbeat_s = 2.0;
    spec.timeout_s = 30;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK, "end %d, %zu bytes of output", dk_job_end(job),
                 rec.out[0][1].len);
    cr_assert(output_has(0, 1, "released"));
    cr_assert_eq(rec.out[0][1].len, 300000 + strlen("released\n"));
    finish(&job);
}

/* What a rank writes after its answer (here 300 kB from an atexit handler,
 * as Python's finalization or a child may) is dropped, not left to block the
 * rank's exit on a full pipe. */
Test(tcp, output_after_the_answer_does_not_keep_a_rank_from_exiting, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload("import atexit, os\n"
                              "atexit.register(lambda: os.write(1, b'x' * 300000))\n"
                              "'answered'\n", payload, sizeof payload);
    dk_job_spec_t spec = rank_exe_spec(1, payload, len);
    spec.timeout_s = 30;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 60000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK, "end %d", dk_job_end(job));
    cr_assert_eq(dk_job_rank_state(job, 0), DK_RANK_DONE);
    finish(&job);
}

/* A rank started through a launcher that does not pass SIGINT on (srun takes
 * one as "print the tasks' state"): here `sh` that traps INT and runs the rank
 * in a session of its own. The job's interrupt must still reach the rank, as
 * a KeyboardInterrupt in its cell: over the back channel (INTERRUPT frame). */
static void interrupt_through_a_launcher(bool rank_exe)
{
    static char payload[65536];
    size_t len = cell_payload("import time\ntry:\n    print('sleeping', flush=True)\n"
                              "    time.sleep(60)\nexcept KeyboardInterrupt:\n"
                              "    print('rank got KeyboardInterrupt', flush=True)\n    raise\n",
                              payload, sizeof payload);
    static const char *py_cmd[] = {"sh", "-c", "trap : INT; setsid \"$0\" \"$@\"", PYTHON3, "-c",
                                   RANK_PY, NULL};
    static const char *exe_cmd[] = {"sh", "-c", "trap : INT; setsid \"$0\" \"$@\"", RANK_EXE,
                                    NULL};
    static const char *const *cmds[1];
    cmds[0] = rank_exe ? exe_cmd : py_cmd;
    dk_job_spec_t spec = rank_exe ? rank_exe_spec(1, payload, len) : python_spec(1, payload, len);
    spec.rank_commands = cmds;
    spec.grace_s = 10;      /* SIGTERM would come after this: well after the interrupt */
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 3000 && !output_has(0, 1, "sleeping"); i++)
        usleep(10000);
    cr_assert(output_has(0, 1, "sleeping"), "the rank did not start: %s", rec.out[0][2].buf);
    double t0 = now_s();
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_expect(output_has(0, 1, "rank got KeyboardInterrupt"),
              "the interrupt did not reach the rank as a KeyboardInterrupt: %s / %s",
              rec.out[0][1].buf, rec.out[0][2].buf);
    cr_expect_lt(now_s() - t0, 8.0, "the rank ended only by the later rungs");
    finish(&job);
}

Test(tcp, an_interrupt_reaches_a_python_rank_whose_launcher_keeps_sigint, .timeout = 90)
{
    interrupt_through_a_launcher(false);
}

Test(tcp, an_interrupt_reaches_a_rank_program_whose_launcher_keeps_sigint, .timeout = 90)
{
    interrupt_through_a_launcher(true);
}

/* A rank started through a launcher: srun's pipes carry the launcher's own
 * lines ("srun: ...", "slurmstepd-NODE: ..."), and whatever the rank wrote
 * before its channel was up. Here fake_rank plays srun (launcher_noise): its
 * lines come in pieces, split inside a prefix and inside a line, the last one
 * with no newline before the pipe's end. */
static const char *const noise_cmd[] = {FAKE_RANK, NULL};

static dk_job_t *run_noise(bool launched)
{
    static const char *const *cmds[1] = {noise_cmd};
    const char *extra[] = {"FAKE_MODE=launcher_noise", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    if (launched)
        spec.rank_commands = cmds;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert_eq(dk_job_rank_exit_code(job, 0), 3);
    return job;
}

/* srun saying the rank's node failed: the rank is lost with its node (the
 * heartbeats would say so a little later), not a rank that exited. */
Test(tcp, a_launcher_that_says_its_node_failed_loses_the_rank, .timeout = 60)
{
    static const char *const *cmds[1] = {noise_cmd};
    const char *extra[] = {"FAKE_MODE=node_failure", NULL};
    dk_job_spec_t spec = tcp_spec(1, extra);
    spec.rank_commands = cmds;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_assert(dk_job_rank_lost(job, 0));
    cr_assert(warned("lost: its launcher said \"srun: error: Node failure on node2\""));
    finish(&job);
}

Test(tcp, a_launchers_own_lines_go_to_the_rank_log_only, .timeout = 60)
{
    dk_job_t *job = run_noise(true);
    cr_assert_not(dk_job_rank_lost(job, 0), "a killed task is not a lost node");
    pthread_mutex_lock(&rec.lock);
    cr_expect_str_eq(rec.out[0][2].buf ? rec.out[0][2].buf : "",
                     "Traceback (most recent call last):\nsize 3\n");
    cr_expect_str_eq(rec.out[0][1].buf ? rec.out[0][1].buf : "", "rank says hi\n");
    pthread_mutex_unlock(&rec.lock);
    char path[512];
    snprintf(path, sizeof path, "%s/rank-0.log", log_dir);
    size_t len = 0;
    char *log = read_file(path, &len);
    cr_assert_not_null(log);
    static const char *const lines[] = {
        "srun: error: node2: task 0: Exited with exit code 1\n",
        "Traceback (most recent call last):\n",
        "slurmstepd-node2: error: *** STEP 12.3 ON node2 CANCELLED AT 2026-12-02T01:00:00 ***\n",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n",
        "srun: warning: on stdout\n", "rank says hi\n", "size 3\n", NULL};
    for (int i = 0; lines[i]; i++)
        cr_expect_not_null(strstr(log, lines[i]), "the log lacks %s:\n%s", lines[i], log);
    size_t tail = strlen("srun: error: node2: task 0: Killed");
    cr_expect(len >= tail && !memcmp(log + len - tail, "srun: error: node2: task 0: Killed", tail),
              "the unfinished last line is not at the log's end:\n%s", log);
    free(log);
    /* The reason for the outcome: the last line that says more than the exit
     * status (not "Exited with exit code", not srun's "Job step aborted"). */
    char line[DK_JOB_LAUNCHER_LINE_MAX];
    dk_job_rank_launcher_line(job, 0, line, sizeof line);
    cr_expect_str_eq(line, "srun: error: node2: task 0: Killed");
    finish(&job);
}

/* The same bytes from a rank on this node (no launcher) are its own output,
 * passed on as read: a local rank keeps its byte path. */
Test(tcp, a_local_ranks_srun_like_lines_are_its_own_output, .timeout = 60)
{
    dk_job_t *job = run_noise(false);
    pthread_mutex_lock(&rec.lock);
    const char *err = rec.out[0][2].buf ? rec.out[0][2].buf : "";
    cr_expect_not_null(strstr(err, "srun: error: node2: task 0: Exited with exit code 1\n"), "%s",
                       err);
    cr_expect_not_null(strstr(err, "slurmstepd-node2: error: *** STEP 12.3"), "%s", err);
    cr_expect_not_null(strstr(err, "srun: error: node2: task 0: Killed"), "%s", err);
    pthread_mutex_unlock(&rec.lock);
    char line[DK_JOB_LAUNCHER_LINE_MAX] = "x";
    dk_job_rank_launcher_line(job, 0, line, sizeof line);
    cr_expect_str_eq(line, "");
    finish(&job);
}

/* A launched rank is told the host's working directory (DISTKERNEL_CWD), to
 * go there where its node has it; a local rank starts there already. */
Test(tcp, a_launched_rank_is_told_the_hosts_folder, .timeout = 60)
{
    static const char *const *cmds[2] = {noise_cmd, NULL};
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = tcp_spec(2, extra);
    spec.rank_commands = cmds;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 20000), "the job did not end");
    char here[4096];
    cr_assert_not_null(getcwd(here, sizeof here));
    cr_expect_str_eq(env_of(0, "DISTKERNEL_CWD"), here);
    cr_expect_str_eq(env_of(1, "DISTKERNEL_CWD"), "(unset)", "a local rank was told a folder");
    finish(&job);
}

/* ---- the ranks' stacks before they are ended (spec.stacks, dk_stackreq.h) ---- */

/* SPEC's ranks sleep in a cell; once each has said so, the job is
 * cancelled: each rank's stacks, asked before its SIGINT, show the cell's
 * line 2, and the answers did not hold the stop up for the whole wait. The
 * print and the sleep share line 2: a rank's main thread may not have taken
 * the GIL back from its print's write yet when the answer is made (on a busy
 * machine it did not, and the stack showed the print's line). */
static void stacks_of_sleeping_ranks(dk_job_spec_t spec, int world)
{
    spec.stacks = true;
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 6000; i++) {
        bool all = true;
        for (int r = 0; r < world; r++)
            all = all && output_has(r, 1, "sleeping");
        if (all)
            break;
        usleep(10000);
    }
    for (int r = 0; r < world; r++)
        cr_assert(output_has(r, 1, "sleeping"), "rank %d did not start: %s", r,
                  rec.out[r][2].buf ? rec.out[r][2].buf : "");
    double t0 = now_s();
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_assert_lt(now_s() - t0, 15.0);
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    for (int r = 0; r < world; r++) {
        size_t len;
        const char *dump = dk_job_rank_stacks(job, r, &len);
        cr_assert_not_null(dump, "rank %d was not asked", r);
        cr_assert(strstr(dump, "File \"<distributed-cell>\", line 2 in <module>"),
                  "rank %d: %s", r, dump);
        cr_assert_null(strstr(dump, DK_STACKS_END), "rank %d: the end line is left out", r);
    }
    finish(&job);
}

static const char *SLEEPING_CELL = "import time\nprint('sleeping', flush=True); time.sleep(60)\n";

Test(stacks, local_ranks_answer_for_their_stacks_before_they_are_stopped, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload(SLEEPING_CELL, payload, sizeof payload);
    static const char *extra[] = {"PYTHONPATH=" PY_SRC, "DISTKERNEL_GLUE_DIR=" PY_SRC,
                                  "ASAN_OPTIONS=detect_leaks=0", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.rank_exe = RANK_EXE;
    spec.payload = payload;
    spec.payload_len = len;
    stacks_of_sleeping_ranks(spec, 2);
}

/* A rank on another node (started through a launcher) cannot be signalled
 * from here: it is asked over its connection, and its back-channel thread
 * answers. */
Test(stacks, launched_ranks_answer_over_their_connection, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload(SLEEPING_CELL, payload, sizeof payload);
    static const char *const cmd[] = {RANK_EXE, NULL};
    static const char *const *cmds[2] = {cmd, cmd};
    dk_job_spec_t spec = rank_exe_spec(2, payload, len);
    spec.rank_commands = cmds;
    stacks_of_sleeping_ranks(spec, 2);
}

static int samples(void)
{
    pthread_mutex_lock(&rec.lock);
    int n = rec.nsamples;
    pthread_mutex_unlock(&rec.lock);
    return n;
}

/* Wait (at most 30 s) for the N-th live sample's answers. */
static void wait_sample(int n)
{
    for (int i = 0; i < 3000 && samples() < n; i++)
        usleep(10000);
    cr_assert_geq(samples(), n, "no answer to live sample %d", n);
}

/* A live sample (dk_job_sample_stacks) hands the sleeping ranks' stacks to
 * the host, again on each ask, and stops nothing: the ranks sleep on, and
 * the stop that ends them still asks for the stacks of its own. */
Test(stacks, a_live_sample_tells_where_the_ranks_are_and_stops_nothing, .timeout = 90)
{
    static char payload[65536];
    size_t len = cell_payload(SLEEPING_CELL, payload, sizeof payload);
    static const char *extra[] = {"PYTHONPATH=" PY_SRC, "DISTKERNEL_GLUE_DIR=" PY_SRC,
                                  "ASAN_OPTIONS=detect_leaks=0", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.rank_exe = RANK_EXE;
    spec.payload = payload;
    spec.payload_len = len;
    spec.stacks = true;
    /* A sample ends when every rank has answered; its default 2 s is too
     * little for a sampler thread to be scheduled under the sanitizers on 2
     * loaded cores (CI once saw a rank's answer missing). A broken sampler
     * still fails: the answer never comes. */
    spec.stacks_wait_s = 20;
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 6000 && !(output_has(0, 1, "sleeping") && output_has(1, 1, "sleeping"));
         i++)
        usleep(10000);
    cr_assert(output_has(0, 1, "sleeping") && output_has(1, 1, "sleeping"),
              "the ranks did not start");
    for (int n = 1; n <= 2; n++) {
        cr_assert(dk_job_sample_stacks(job));
        wait_sample(n);
        pthread_mutex_lock(&rec.lock);
        for (int r = 0; r < 2; r++) {
            cr_assert(rec.sample_asked[r], "rank %d was not asked", r);
            cr_assert(strstr(rec.sampled[r].buf, "File \"<distributed-cell>\", line 2 in <module>"),
                      "rank %d: %s", r, rec.sampled[r].buf);
        }
        pthread_mutex_unlock(&rec.lock);
        cr_assert_eq(dk_job_end(job), DK_END_NONE, "a sample ended the job");
        /* Not dk_job_rank_stacks here: it is valid once the job has ended,
         * and the job's thread clears the sample's answers only after the
         * sink has them (read here, that raced under load: CI-like runs saw
         * the answers not cleared yet). */
    }
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    for (int r = 0; r < 2; r++) {
        size_t n_len;
        const char *dump = dk_job_rank_stacks(job, r, &n_len);
        cr_assert(dump && strstr(dump, "line 2 in <module>"), "rank %d: %s", r,
                  dump ? dump : "(not asked)");
    }
    cr_assert_not(dk_job_sample_stacks(job), "an ended job takes no sample");
    finish(&job);
}

Test(stacks, without_spec_stacks_no_rank_is_asked, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.timeout_s = 0.5;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 30000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_TIMEOUT);
    size_t len;
    cr_assert_null(dk_job_rank_stacks(job, 0, &len));
    cr_assert_null(dk_job_rank_stacks(job, 1, &len));
    finish(&job);
}

/* ------------------------------------------------------------------------ */
/* Ranks started by node agents (spec.agent_command, runtime/agent/)         */

static char agents_dir[128];

/* A job of WORLD ranks, PER on each "node", whose agents a shell starts, as
 * srun would (one task per node, each told its node); each agent's pid goes
 * to agents_dir/agent-K. */
/* Agents started with VARS (assignments for the shell) before each. */
static dk_job_spec_t agent_spec_with(int world, int per, const char *const *extra,
                                     const char *vars);

static dk_job_spec_t agent_spec(int world, int per, const char *const *extra)
{
    return agent_spec_with(world, per, extra, "");
}

static dk_job_spec_t agent_spec_with(int world, int per, const char *const *extra,
                                     const char *vars)
{
    static char script[1024];
    static const char *cmd[4];
    static const char *hosts[8];
    static char names[8][16];
    snprintf(agents_dir, sizeof agents_dir, "/tmp/dk-agents-XXXXXX");
    cr_assert_not_null(mkdtemp(agents_dir));
    snprintf(script, sizeof script,
             "k=0; while [ $k -lt %d ]; do DISTKERNEL_AGENT_NODE=$k "
             "SLURMD_NODENAME=node$((k + 1)) %s %s %s & "
             "echo $! > %s/agent-$k; k=$((k + 1)); done; "
             "echo 'srun: a line of the launcher' >&2; wait",
             world / per, vars, AGENT_EXE, FAKE_RANK, agents_dir);
    cmd[0] = "/bin/sh";
    cmd[1] = "-c";
    cmd[2] = script;
    cmd[3] = NULL;
    dk_job_spec_t spec = tcp_spec(world, extra);
    spec.ranks_per_node = per;
    spec.agent_command = cmd;
    for (int r = 0; r < world && r < 8; r++) {
        snprintf(names[r], sizeof names[r], "node%d", r / per + 1);
        hosts[r] = names[r];
    }
    spec.rank_hosts = hosts;
    return spec;
}

static void agents_done(void)
{
    char path[192];
    for (int k = 0; k < 8; k++) {
        snprintf(path, sizeof path, "%s/agent-%d", agents_dir, k);
        unlink(path);
    }
    rmdir(agents_dir);
}

static pid_t agent_pid(int node)
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

Test(agents, every_rank_runs_under_its_nodes_agent_and_answers, .timeout = 60)
{
    const char *extra[] = {"FAKE_PRINT_ENV=1", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.payload = "job";
    spec.payload_len = 3;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_DONE, "rank %d", r);
        cr_expect_eq(dk_job_rank_exit_code(job, r), 0, "rank %d", r);
        cr_expect_eq(dk_job_rank_pid(job, r), -1, "rank %d has no process here", r);
        char want[64];
        snprintf(want, sizeof want, "rank=%d len=3", r);
        cr_expect(rec.msg[r].buf && strstr(rec.msg[r].buf, want), "rank %d: %s", r,
                  rec.msg[r].buf ? rec.msg[r].buf : "(none)");
        /* Its connection is its agent's relay (a Unix socket on its node),
         * shared with its node's other rank and no other's: the answer
         * above came through it. */
        char bc_buf[256] = "";
        const char *bc = env_of(r, "DISTKERNEL_BC");
        if (bc)
            bc = strncpy(bc_buf, bc, sizeof bc_buf - 1);    /* env_of's buffer is reused */
        cr_expect(bc && strstr(bc, "/distkernel-relay-") && strstr(bc, "/relay.sock"),
                  "rank %d: DISTKERNEL_BC=%s", r, bc ? bc : "(none)");
        if (bc && r % 2 == 1)
            cr_expect_str_eq(bc, env_of(r - 1, "DISTKERNEL_BC"), "rank %d", r);
        if (bc && r >= 2)
            cr_expect_str_neq(bc, env_of(r - 2, "DISTKERNEL_BC"), "rank %d", r);
        char node[8];
        snprintf(node, sizeof node, "%d", r / 2);
        cr_expect_str_eq(env_of(r, "GROUP_RANK"), node);
    }
    /* The launcher's own line is in agents.log, not in any rank's output. */
    char path[512], text[4096] = "";
    snprintf(path, sizeof path, "%s/agents.log", dk_job_log_dir(job));
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_expect(strstr(text, "srun: a line of the launcher"), "agents.log: %s", text);
    cr_expect(!output_has(0, 2, "srun: a line"));
    finish(&job);
    agents_done();
}

Test(agents, nodes_whose_template_fails_run_cold_and_the_run_says_so_once, .timeout = 60)
{
    /* The agents are asked for a template each; started from the fake rank,
     * which is none, it fails on both nodes: their ranks start cold, the run
     * succeeds, and warm.log has one line for the run. */
    dk_job_spec_t spec = agent_spec(4, 2, NULL);
    spec.agent_warm_modules = "torch";
    spec.agent_warm_path = "/nonexistent\n/also-not";
    spec.payload = "job";
    spec.payload_len = 3;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_OK);
    for (int r = 0; r < 4; r++)
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_DONE, "rank %d", r);
    char path[512], text[4096] = "";
    snprintf(path, sizeof path, "%s/warm.log", dk_job_log_dir(job));
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no warm.log");
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    /* Both nodes are named in the one line, with the first one's reason. */
    cr_expect(strncmp(text, "the ranks on nodes 0, 1 (node1, node2) ", 39) == 0 &&
              strstr(text, "started cold: the warm-start template exited with code"), "%s", text);
    cr_expect_eq(strchr(text, '\n'), text + n - 1, "one line for the run: %s", text);
    /* Each agent said it in agents.log. */
    snprintf(path, sizeof path, "%s/agents.log", dk_job_log_dir(job));
    f = fopen(path, "r");
    cr_assert_not_null(f);
    n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    cr_expect(strstr(text, "node 0 (node1): ranks start cold") &&
              strstr(text, "node 1 (node2): ranks start cold"),
              "agents.log: %s", text);
    finish(&job);
    agents_done();
}

Test(agents, a_rank_that_fails_is_the_root_cause_and_the_others_are_stopped, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=interruptible", "FAKE_MODE_3=exit3", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    cr_expect_eq(dk_job_root_cause(job), 3);
    cr_expect_eq(dk_job_rank_state(job, 3), DK_RANK_FAILED);
    cr_expect_eq(dk_job_rank_exit_code(job, 3), 3);
    for (int r = 0; r < 3; r++)
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED, "rank %d", r);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_expect_str_eq(summary, "");
    finish(&job);
    agents_done();
}

Test(agents, a_cancel_reaches_the_ranks_through_their_agents, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=interruptible", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 2000 && !(output_has(0, 1, "sleeping") && output_has(1, 1, "sleeping") &&
                                  output_has(2, 1, "sleeping") && output_has(3, 1, "sleeping"));
         i++)
        usleep(10000);
    cr_assert(output_has(2, 1, "sleeping") && output_has(3, 1, "sleeping"));
    dk_job_cancel(job);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_CANCELLED);
    for (int r = 0; r < 4; r++) {
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_STOPPED, "rank %d", r);
        cr_expect(rec.msg_error[r] && strstr(rec.msg[r].buf, "KeyboardInterrupt"),
                  "rank %d got SIGINT from its agent", r);
    }
    finish(&job);
    agents_done();
}

Test(agents, an_agent_that_cannot_connect_says_why_as_a_rank_does, .timeout = 60)
{
    /* Port 1 refuses: each agent tries for its connect deadline, says why
     * and exits 2; its node's ranks, never started, end with that, its words
     * on the node's first rank's stderr. Not a lost node. */
    dk_job_spec_t spec = agent_spec_with(4, 2, NULL, "DISTKERNEL_BC=tcp:127.0.0.1:1 "
                                                     "DISTKERNEL_BC_CONNECT_TIMEOUT=1");
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    /* The first agent to give up is the root cause; the other node's ranks
     * may be stopped before its agent gives up too. */
    int root = dk_job_root_cause(job);
    cr_assert(root == 0 || root == 2, "root cause %d", root);
    for (int r = root; r < root + 2; r++) {
        cr_expect_eq(dk_job_rank_state(job, r), DK_RANK_FAILED, "rank %d", r);
        cr_expect_eq(dk_job_rank_exit_code(job, r), 2, "rank %d", r);
    }
    const char *why = "could not connect to the kernel's back channel at 127.0.0.1:1 within 1 s";
    cr_expect(output_has(root, 2, why), "%s",
              rec.out[root][2].buf ? rec.out[root][2].buf : "(nothing on its stderr)");
    cr_expect(!output_has(1, 2, why) && !output_has(3, 2, why), "told once per node");
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_expect_str_eq(summary, "");
    finish(&job);
    agents_done();
}

Test(agents, a_killed_agent_is_its_node_lost, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=sleep", NULL};
    dk_job_spec_t spec = agent_spec(4, 2, extra);
    spec.heartbeat_s = 2.0;
    dk_job_t *job = start(&spec);
    for (int i = 0; i < 2000 && !(output_has(2, 1, "sleeping") && output_has(3, 1, "sleeping"));
         i++)
        usleep(10000);
    cr_assert(output_has(3, 1, "sleeping"));
    cr_assert_eq(kill(agent_pid(1), SIGKILL), 0);
    cr_assert(dk_job_wait(job, 40000), "the job did not end");
    cr_assert_eq(dk_job_end(job), DK_END_FAILED);
    int root = dk_job_root_cause(job);
    cr_expect(root == 2 || root == 3, "root cause %d", root);
    char summary[128];
    dk_job_lost_summary(job, summary, sizeof summary);
    cr_expect_str_eq(summary, "node2 lost (ranks 2" DK_EN_DASH "3)");
    cr_expect_eq(dk_job_rank_state(job, 0), DK_RANK_STOPPED);
    cr_expect_eq(dk_job_rank_state(job, 1), DK_RANK_STOPPED);
    finish(&job);
    agents_done();
}
