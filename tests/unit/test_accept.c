/*
 * The back channel's admission (runtime/channel/dk_accept.h, dk_backchan_admit.c): who is
 * let in, how many at once, and when the listener closes. Issue 21 item 4 and
 * the back-channel part of issue 22.
 *
 * fake_rank plays the ranks, over TCP on 127.0.0.1; a thread of this process
 * plays the stranger, its connections bound to 127.0.0.2 (on Linux all of
 * 127/8 is this host's loopback), which the job does not allow. All traffic is
 * on loopback; every loop is bounded in count and time.
 *
 * DK_ACCEPT_RANKS (default 256) sets the size of the "same second" test and
 * DK_ACCEPT_HELLO_DELAY_MS (default 1200) its ranks' pause between nonce and
 * HELLO, so the same test serves as the benchmark of bench/README.md; it
 * prints "accepted N ranks in S s" on stderr.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "dk_job.h"

#ifndef FAKE_RANK
#error "FAKE_RANK (the path of fake_rank) must be defined"
#endif

#define MAXRANKS 1024

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------------ */
/* What the sink is told                                                     */

static struct {
    pthread_mutex_t lock;
    int running;                /* ranks that reached RUNNING */
    double first_running_at;    /* when the first did */
    double all_running_at;      /* when the last of WANT did */
    int want;
    int failed;
    char warnings[32][512];
    int nwarnings;
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void on_output(void *data, int rank, int fd, const char *bytes, size_t len)
{
    (void) data, (void) rank, (void) fd, (void) bytes, (void) len;
}

static void on_state(void *data, int rank, dk_rank_state_t state, int code, int sig)
{
    (void) data, (void) rank, (void) code, (void) sig;
    pthread_mutex_lock(&rec.lock);
    if (state == DK_RANK_RUNNING && ++rec.running == 1)
        rec.first_running_at = now_s();
    if (state == DK_RANK_RUNNING && rec.running == rec.want)
        rec.all_running_at = now_s();
    if (state == DK_RANK_FAILED)
        rec.failed++;
    pthread_mutex_unlock(&rec.lock);
}

static void on_message(void *data, int rank, bool is_error, const void *bytes, size_t len)
{
    (void) data, (void) rank, (void) is_error, (void) bytes, (void) len;
}

static void on_warning(void *data, const char *text)
{
    (void) data;
    pthread_mutex_lock(&rec.lock);
    if (rec.nwarnings < 32)
        snprintf(rec.warnings[rec.nwarnings++], sizeof rec.warnings[0], "%s", text);
    pthread_mutex_unlock(&rec.lock);
}

static const dk_sink_t sink = {.on_output = on_output, .on_state = on_state,
                               .on_message = on_message, .on_warning = on_warning};

static bool warned(const char *needle)
{
    pthread_mutex_lock(&rec.lock);
    bool found = false;
    for (int i = 0; i < rec.nwarnings && !found; i++)
        found = strstr(rec.warnings[i], needle) != NULL;
    pthread_mutex_unlock(&rec.lock);
    return found;
}

static const char *first_warning(void)
{
    return rec.nwarnings ? rec.warnings[0] : "(none)";
}

/* ------------------------------------------------------------------------ */
/* Jobs                                                                      */

static char log_dir[256];
static const char *env[16];

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

static dk_job_spec_t spec_for(int world_size, const char *const *extra)
{
    size_t n = 0;
    env[n++] = "PATH=/usr/bin:/bin";
    for (size_t i = 0; extra && extra[i] && n < 15; i++)
        env[n++] = extra[i];
    env[n] = NULL;
    snprintf(log_dir, sizeof log_dir, "/tmp/dk-test-accept-XXXXXX");
    cr_assert_not_null(mkdtemp(log_dir));
    pthread_mutex_lock(&rec.lock);
    rec.running = rec.failed = rec.nwarnings = 0;
    rec.all_running_at = rec.first_running_at = 0;
    rec.want = world_size;
    pthread_mutex_unlock(&rec.lock);
    dk_job_spec_t spec = {
        .world_size = world_size,
        .rank_exe = FAKE_RANK,
        .env = env,
        .grace_s = 2.0,
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

static void finish(dk_job_t **job)
{
    dk_job_destroy(job);
    remove_dir(log_dir);
}

/* The port of a "tcp:127.0.0.1:PORT" address. */
static int port_of(dk_job_t *job)
{
    const char *a = dk_job_bc_address(job);
    const char *colon = strrchr(a, ':');
    cr_assert(!strncmp(a, "tcp:", 4) && colon, "%s", a);
    return atoi(colon + 1);
}

/* Whether a TCP connection to 127.0.0.1:PORT is refused (nothing listens). */
/* A connection to 127.0.0.1:port is refused. *err gets connect's errno. */
static bool tcp_refused(int port, int *err)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t) port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int rc;
    do
        rc = connect(fd, (struct sockaddr *) &sa, sizeof sa);
    while (rc != 0 && errno == EINTR);
    *err = rc == 0 ? 0 : errno;
    close(fd);
    return rc != 0 && *err == ECONNREFUSED;
}

/* A socket of this process listens on TCP port PORT: its inode is both in
 * /proc/net/tcp, in state LISTEN (0A) on that port, and behind one of
 * /proc/self/fd. Another process that binds the port once ours is closed (the
 * unit tests run side by side, all on loopback) is not ours. */
static bool this_process_listens_on(int port)
{
    FILE *f = fopen("/proc/net/tcp", "r");
    cr_assert(f, "cannot read /proc/net/tcp: %s", strerror(errno));
    char line[512];
    unsigned long inodes[16];
    int ninodes = 0;
    (void) !fgets(line, sizeof line, f); /* the header */
    while (fgets(line, sizeof line, f) && ninodes < 16) {
        unsigned local_port, state;
        unsigned long inode;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*u %*d %lu", &local_port,
                   &state, &inode) == 3 &&
            (int) local_port == port && state == 0x0A)
            inodes[ninodes++] = inode;
    }
    fclose(f);
    bool ours = false;
    DIR *d = opendir("/proc/self/fd");
    cr_assert(d);
    for (struct dirent *e; !ours && (e = readdir(d));) {
        char path[300], target[64];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        unsigned long inode;
        if (sscanf(target, "socket:[%lu]", &inode) == 1)
            for (int i = 0; i < ninodes; i++)
                ours = ours || inodes[i] == inode;
    }
    closedir(d);
    return ours;
}

static const char *const loopback[] = {"127.0.0.1"};

/* ------------------------------------------------------------------------ */
/* The stranger                                                              */

/* Opens connections from 127.0.0.2 to 127.0.0.1:port at RATE a second, never
 * says anything, keeps the newest HOLD of them open; stops when told, or
 * after SECONDS, whichever is first. */
typedef struct {
    int port, rate, hold;
    double seconds;
    atomic_bool stop;
    pthread_t thread;
    int opened, failed;
} flood_t;

static void *flood_main(void *arg)
{
    flood_t *f = arg;
    int *held = calloc((size_t) f->hold, sizeof *held);
    for (int i = 0; i < f->hold; i++)
        held[i] = -1;
    struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.2", &from.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    to.sin_port = htons((uint16_t) f->port);
    double t0 = now_s(), gap = 1.0 / f->rate;
    long max = (long) (f->seconds * f->rate);
    for (long k = 0; k < max && !atomic_load(&f->stop); k++) {
        double due = t0 + (double) k * gap, wait = due - now_s();
        if (wait > 0)
            usleep((useconds_t) (wait * 1e6));
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *) &from, sizeof from) != 0 ||
            (connect(fd, (struct sockaddr *) &to, sizeof to) != 0 && errno != EINPROGRESS)) {
            f->failed++;
            if (fd >= 0)
                close(fd);
            continue;
        }
        f->opened++;
        int slot = (int) (k % f->hold);
        if (held[slot] >= 0)
            close(held[slot]);
        held[slot] = fd;
    }
    for (int i = 0; i < f->hold; i++)
        if (held[i] >= 0)
            close(held[i]);
    free(held);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                     */

/* Issue 21 item 4: a stranger (an address that is not one of the run's
 * nodes) opening hundreds of connections a second, and holding them, does not
 * keep the ranks out: they are all in within a few seconds of connecting. The
 * ranks connect a second after the flood began, so it is in full swing. */
Test(accept, a_flood_from_an_address_that_is_no_node_does_not_keep_ranks_out, .timeout = 60)
{
    const char *extra[] = {"FAKE_CONNECT_DELAY_MS=1000", NULL};
    dk_job_spec_t spec = spec_for(4, extra);
    spec.bc_tcp_addr = "127.0.0.1";
    spec.bc_allow_hosts = loopback;
    spec.bc_nallow = 1;
    dk_job_t *job = start(&spec);
    flood_t f = {.port = port_of(job), .rate = 500, .hold = 400, .seconds = 12};
    double t0 = now_s();
    cr_assert_eq(pthread_create(&f.thread, NULL, flood_main, &f), 0);
    bool ended = dk_job_wait(job, 30000);
    atomic_store(&f.stop, true);
    pthread_join(f.thread, NULL);
    cr_assert(ended, "the job did not end within 30 s of a flood (%d connections)", f.opened);
    cr_assert_eq(dk_job_end(job), DK_END_OK, "%s", first_warning());
    double took = rec.all_running_at - t0;
    fprintf(stderr, "flood: %d connections from 127.0.0.2 (%d failed); 4 ranks in %.2f s "
            "after the flood began (they connect at 1 s)\n", f.opened, f.failed, took);
    cr_assert_gt(f.opened, 300, "the flood did not happen (%d connections)", f.opened);
    cr_assert_lt(took, 4.0, "the ranks took %.2f s to get in under the flood", took);
    cr_assert(warned("dropped a connection from 127.0.0.2, which is not one of the run's nodes"),
              "%s", first_warning());
    finish(&job);
}

/* Issue 22: hundreds of ranks connecting in the same second are all taken in,
 * even when each takes a while between its nonce and its HELLO (a rank on a
 * busy node). The job's listener held 64 waiting connections and closed one
 * that had waited a second to make room: those ranks were refused. */
Test(accept, hundreds_of_ranks_connecting_in_the_same_second_are_all_accepted, .timeout = 120)
{
    const char *n_s = getenv("DK_ACCEPT_RANKS"), *delay_s = getenv("DK_ACCEPT_HELLO_DELAY_MS");
    int n = n_s ? atoi(n_s) : 256;
    int delay_ms = delay_s ? atoi(delay_s) : 1200;
    cr_assert(n >= 1 && n <= MAXRANKS);
    char delay[64];
    snprintf(delay, sizeof delay, "FAKE_HELLO_DELAY_MS=%d", delay_ms);
    const char *extra[] = {delay, NULL};
    dk_job_spec_t spec = spec_for(n, extra);
    spec.bc_tcp_addr = "127.0.0.1";
    spec.bc_allow_hosts = loopback;
    spec.bc_nallow = 1;
    double t0 = now_s();
    dk_job_t *job = start(&spec);
    bool ended = dk_job_wait(job, 90000);
    cr_assert(ended, "the job did not end within 90 s (%d of %d ranks in)", rec.running, n);
    cr_assert_eq(dk_job_end(job), DK_END_OK, "%d of %d ranks in; %s", rec.running, n,
                 first_warning());
    cr_assert_eq(rec.running, n);
    fprintf(stderr, "accepted %d ranks in %.2f s (the first in at %.2f s; HELLO after %d ms)\n",
            n, rec.all_running_at - t0, rec.first_running_at - t0, delay_ms);
    finish(&job);
}

/* Issue 21 item 4: once every rank is in, nothing listens, so started ranks
 * (a persistent job) do not keep a port open for their whole life. */
Test(accept, the_listener_closes_once_every_started_rank_is_in, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=rounds", NULL};
    dk_job_spec_t spec = spec_for(3, extra);
    spec.bc_tcp_addr = "127.0.0.1";
    spec.bc_allow_hosts = loopback;
    spec.bc_nallow = 1;
    spec.persistent = true;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_round_wait(job, 20000), "the ranks never all said HELLO");
    cr_assert_eq(dk_job_round_end(job), DK_END_OK);
    int port = port_of(job);
    int cerr;
    bool refused = tcp_refused(port, &cerr);
    cr_assert(!this_process_listens_on(port), "the job still listens on port %d with every rank "
              "in", port);
    /* Not refused: another test's listener took the freed port since. */
    cr_assert(refused || cerr == 0, "connecting to port %d failed with %s, not refused", port,
              strerror(cerr));
    char err[256] = "";
    cr_assert_eq(dk_job_submit(job, "result", 6, 0, err, sizeof err), 0, "%s", err);
    cr_assert(dk_job_round_wait(job, 20000));
    cr_assert_eq(dk_job_round_end(job), DK_END_OK, "the ranks' connections went with it");
    finish(&job);
}

/* ... and for ranks on this node: the Unix socket is gone. */
Test(accept, the_unix_socket_is_gone_once_every_rank_is_in, .timeout = 60)
{
    const char *extra[] = {"FAKE_MODE=rounds", NULL};
    dk_job_spec_t spec = spec_for(2, extra);
    spec.persistent = true;
    dk_job_t *job = start(&spec);
    cr_assert(dk_job_round_wait(job, 20000), "the ranks never all said HELLO");
    const char *path = dk_job_bc_address(job);
    struct stat st;
    cr_assert(lstat(path, &st) != 0 && errno == ENOENT, "%s is still there", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    cr_assert_neq(connect(fd, (struct sockaddr *) &sa, sizeof sa), 0);
    close(fd);
    finish(&job);
}

/* A node name that does not resolve fails the start: its ranks could not be
 * told from strangers. */
Test(accept, a_node_that_does_not_resolve_is_refused_at_start)
{
    const char *const nodes[] = {"127.0.0.1", "no-such-node.invalid"};
    dk_job_spec_t spec = spec_for(1, NULL);
    spec.bc_tcp_addr = "127.0.0.1";
    spec.bc_allow_hosts = nodes;
    spec.bc_nallow = 2;
    char err[512] = "";
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    cr_assert_null(job);
    cr_assert(strstr(err, "no-such-node.invalid"), "%s", err);
    remove_dir(log_dir);
}

/* ------------------------------------------------------------------------ */
/* The allow-list alone                                                      */

#include "dk_accept.h"

static struct sockaddr_in v4(const char *text)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, text, &sa.sin_addr);
    return sa;
}

static bool allows(const dk_accept_t *a, const char *text)
{
    struct sockaddr_in sa = v4(text);
    return dk_accept_allows(a, (struct sockaddr *) &sa, sizeof sa);
}

Test(allow, only_the_nodes_addresses_are_allowed_ipv4_mapped_included)
{
    const char *const nodes[] = {"192.0.2.11", "192.0.2.12", "192.0.2.11"};
    char err[256] = "";
    dk_accept_t *a = dk_accept_new(nodes, 3, err, sizeof err);
    cr_assert_not_null(a, "%s", err);
    cr_assert_eq(dk_accept_count(a), 2);
    cr_assert(allows(a, "192.0.2.11") && allows(a, "192.0.2.12"));
    cr_assert(!allows(a, "192.0.2.1") && !allows(a, "127.0.0.1"));
    struct sockaddr_in6 m = {.sin6_family = AF_INET6};
    inet_pton(AF_INET6, "::ffff:192.0.2.12", &m.sin6_addr);
    cr_assert(dk_accept_allows(a, (struct sockaddr *) &m, sizeof m));
    /* No node is this host: the listener's own address stays a stranger's
     * (the login host on a cluster). */
    cr_assert(dk_accept_add_this_host(a, "192.0.2.1"));
    cr_assert(!allows(a, "192.0.2.1"));
    dk_accept_destroy(&a);
    cr_assert_null(a);
}

Test(allow, a_node_that_is_this_host_may_connect_from_the_listeners_address)
{
    const char *const nodes[] = {"127.0.0.5"};     /* all of 127/8 is this host's */
    char err[256] = "";
    dk_accept_t *a = dk_accept_new(nodes, 1, err, sizeof err);
    cr_assert_not_null(a, "%s", err);
    cr_assert(!allows(a, "127.0.0.1"));
    cr_assert(dk_accept_add_this_host(a, "127.0.0.1"));
    cr_assert(allows(a, "127.0.0.1") && allows(a, "127.0.0.5"));
    cr_assert(!allows(a, "127.0.0.2"));
    dk_accept_destroy(&a);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, accept_takes_null)
{
    dk_accept_destroy(NULL);
    dk_accept_t *none = NULL;
    dk_accept_destroy(&none);
    cr_assert_null(none);
}
