/*
 * What the job tests (test_job.c, test_job_tcp.c, test_job_agents.c,
 * test_job_agents_tcp.c) share:
 * running a job of rank processes (runtime/launch/dk_job.h) with fake_rank as
 * the rank executable, which speaks the back channel and misbehaves on
 * request (FAKE_MODE, FAKE_MODE_<rank>; see fake_rank.c), and recording what
 * the job's sink is told.
 *
 * Each test runs in its own process (criterion), so the recorder is a plain
 * global; it has a lock because the sink is called from the runtime thread
 * while a test may be looking.
 */
#ifndef DK_TEST_JOB_FIXTURE_H
#define DK_TEST_JOB_FIXTURE_H

#include <criterion/criterion.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "dk_job.h"

#ifndef FAKE_RANK
#error "FAKE_RANK (the path of fake_rank) must be defined"
#endif
#ifndef PYTHON3
#define PYTHON3 "/usr/bin/python3"
#endif

#define MAXR 12
#define MAXSTATES 16
/* Tests that time the kill escalation use FAST_GRACE; the others use a grace
 * long enough that a loaded machine (sanitizers, parallel tests) never turns a
 * rank's own clean exit into a SIGTERM. */
#define GRACE 2.0
#define FAST_GRACE 0.3

typedef struct {
    char *buf;
    size_t len;
} bytes_t;

/* What the sink was told, under lock. */
typedef struct {
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
} recorder_t;

extern recorder_t rec;
extern const dk_sink_t sink;            /* records into rec */
/* When set, output "hold" from a rank holds the runtime's thread in the sink:
 * it creates HOLD_DIR/held and returns once HOLD_DIR/release exists. */
extern const char *hold_dir;
extern char log_dir[256];               /* the jobs' log folder, made by spec_for */
extern const char *env[32];             /* the ranks' environment, set by set_env */

double now_s(void);
void append(bytes_t *b, const void *data, size_t len);
bool output_has(int rank, int fd, const char *needle);
void wait_output(int rank, const char *needle);     /* on fd 1, within 10 s */
bool warned(const char *needle);
int warned_times(const char *needle);               /* how many warnings hold NEEDLE */
/* The value fake_rank printed for NAME ("ENV NAME=value"), in a static buffer. */
const char *env_of(int rank, const char *name);

void make_log_dir(void);
void remove_dir(const char *dir);
/* Environment for the ranks: a minimal base plus the test's own settings. */
void set_env(const char *const *extra);
dk_job_spec_t spec_for(int world_size, const char *const *extra);
dk_job_t *start(const dk_job_spec_t *spec);
dk_job_t *run(int world_size, const char *const *extra);   /* started and waited for */
void finish(dk_job_t **job);
/* The descriptors open in this process, the folder watcher's counted. */
int count_fds(void);
void sha256_hex(const void *data, size_t len, char out[65]);
char *read_file(const char *path, size_t *len);     /* whole; free it */

/* spec_for's, with the back channel on TCP on 127.0.0.1. */
dk_job_spec_t tcp_spec(int world_size, const char *const *extra);
/* The cell's job CODE, pickled by the real cloudpickle, into BUF; its length. */
size_t cell_payload(const char *code, char *buf, size_t size);

/* A job of WORLD ranks, PER on each "node" (named node1, node2, ...), over
 * tcp_spec's channel, whose node agents (AGENT_EXE) a shell on this host
 * starts as srun would: one per node, each told its node, with VARS
 * (assignments for the shell, "" for none) before it and PROGRAM as the
 * rank program; each agent's pid is kept for agent_pid. agent_spec_with's
 * and agent_spec's program is FAKE_RANK. At most AGENT_NODES_MAX ranks. */
#define AGENT_NODES_MAX 16
dk_job_spec_t agent_spec_for(int world, int per, const char *const *extra, const char *vars,
                             const char *program);
dk_job_spec_t agent_spec_with(int world, int per, const char *const *extra, const char *vars);
dk_job_spec_t agent_spec(int world, int per, const char *const *extra);
/* Node NODE's agent's pid (waited for, at most 5 s). */
pid_t agent_pid(int node);
/* Remove what the last agent_spec* left (after finish). */
void agents_done(void);

#endif
