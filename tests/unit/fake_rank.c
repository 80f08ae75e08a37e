/*
 * fake_rank: the rank side of the back channel, in C, so the runtime can be
 * tested without Python or torch.
 *
 * It is written from the protocol's text (the wire: runtime/channel/
 * dk_frame.h; what a job does with it: runtime/launch/dk_job.h),
 * independently of the runtime's own code, whose headers and libraries it
 * does not use, so a misreading on either side shows up as a failed test
 * rather than as two matching bugs.
 *
 * The behaviour comes from the environment: FAKE_MODE for every rank, or
 * FAKE_MODE_<rank> for one rank. Modes:
 *   result           HELLO, read PAYLOAD, RESULT "rank=R len=N sha256=HEX", exit 0
 *   error            ... ERROR "boom on rank R", exit 1
 *   error_hang       ... ERROR "boom on rank R", then sleep 60 s instead of exiting
 *   exit3            ... exit 3 without a result
 *   exit3_at_start   exit 3 before connecting to the back channel (no HELLO)
 *   segv             ... die by SIGSEGV
 *   no_result        ... exit 0 without a result
 *   sleep            ... print "sleeping", sleep FAKE_SLEEP_S (60) seconds, then as result
 *   interruptible    ... as sleep, but SIGINT sends ERROR "KeyboardInterrupt" and exits 1
 *                    (what a Python rank does)
 *   ignore_signals   ... ignore SIGINT and SIGTERM, print "sleeping", sleep forever
 *   forge_mac        first a connection whose HELLO carries a wrong MAC; then as result
 *   bad_rank         first a connection whose HELLO names rank WORLD_SIZE; then as result
 *   agent_hello      (under an agent) first a relayed connection that says a valid
 *                    AGENT_HELLO for node 0; then as result
 *   direct_hello     (under an agent, FAKE_KERNEL_BC the kernel's tcp: address) first a
 *                    connection straight to the kernel with a valid HELLO; then as result
 *   duplicate_hello  after its own HELLO, a second connection with a valid HELLO for
 *                    the same rank; then as result on the first
 *   oversize         ... announce a 2 GiB frame, then exit 0
 *   exiting_result   (with error_synced on another rank, files in FAKE_SYNC) connect
 *                    once "r1" exists, print "hold", send RESULT once "held" exists,
 *                    then stay on the way out: the main thread ends (the process
 *                    shows PF_EXITING) while another creates "r0" and exits 0 a
 *                    second later
 *   error_synced     HELLO, PAYLOAD, create "r1"; once "r0" exists ERROR "boom on
 *                    rank R", create "release", exit 1
 *   print_lots       print FAKE_LINES (1000) numbered lines to stdout and to stderr,
 *                    alternating, then as result
 *   grandchild       leave a child holding stdout and stderr for 30 s ("GRANDCHILD pid"),
 *                    then as result
 *   idle_hello       first FAKE_IDLE (72) connections that never say HELLO (nor read);
 *                    then HELLO and PAYLOAD on its own, then wait up to 30 s for the
 *                    runtime to close the newest idle one ("idle closed after N s" or
 *                    "idle still open"), then as result
 *   rounds           a rank of a persistent job: HELLO, then for each TASK (u32 round |
 *                    text) act on the text and answer with the round: "result" RESULT
 *                    "round=N rank=R"; "error" ERROR "boom in round N on rank R";
 *                    "sleep" print "sleeping N", wait for SIGINT, ERROR
 *                    "KeyboardInterrupt"; "stuck" print "stuck N", ignore SIGINT and
 *                    sleep forever; "exit3" exit 3; "bad_round" RESULT naming round
 *                    N+1; "leader_exit" print "leader exiting N", then the main
 *                    thread ends alone (a zombie leader, another thread sleeping). The text may be "ACTION@R": that action on rank R, "result"
 *                    on the others. SIGINT between rounds is ignored; EOF exits 0.
 *   log_note         ... an OUTPUT frame for its log only (fd 3, DK_FRAME_OUTPUT_LOG):
 *                    "a note about itself", then as result
 *   bad_output       (Unix socket) ... an OUTPUT frame for fd 4, wait to be closed,
 *                    print "refused as expected", exit 0 without a result
 *   hold             ... print "hold", sleep FAKE_SLEEP_S (60) seconds, then as result
 *   close_hang       ... print "closing", close its connection without an answer
 *                    (create "r0" in FAKE_SYNC, if set), sleep FAKE_SLEEP_S (60) seconds,
 *                    exit 3: a rank that lives on after its connection closed, or
 *                    exits later on its own
 *   echo_error       ... half a second after its PAYLOAD (with FAKE_SYNC: once "go"
 *                    exists there), ERROR with gloo's "Connection closed by peer
 *                    [10.0.0.2]:15792" (the echo of a lost peer), exit 1
 *   freeze_at_start  print "freezing before connecting" and stop itself before any
 *                    connection: a rank whose node went quiet while it was starting
 *   reflect          ... read the runtime's frames until one whose seq is the one the
 *                    runtime expects of us next (with DISTKERNEL_MASTER_PORT=rank0 on
 *                    a rank other than 0: its PAYLOAD, after its PORT), print
 *                    "reflected seq N" and send its bytes back unchanged (a man in
 *                    the middle reflecting it), then wait to be closed and exit 1.
 *                    The runtime must refuse it: the MAC's direction differs.
 *   flood            ... print "flooding", then send OUTPUT frames of one byte ('.')
 *                    as fast as they are taken for FAKE_FLOOD_S (60) seconds, then
 *                    exit 0 without a result
 *   spawn_writer     ... run `sh -c` that writes "child-out" to fd 1 and "child-err"
 *                    to fd 2 and "on HOSTNAME" to fd 1 (a child's C-level writes), print "last words" to
 *                    both just before its RESULT, then as result
 * DISTKERNEL_BC is a Unix socket's path (the runtime's, or a node agent's relay)
 * or "tcp:ADDR:PORT" (the runtime listening on TCP): it connects there either way.
 * With DISTKERNEL_MASTER_PORT=rank0 (the runtime's "MASTER_PORT from rank 0"),
 * after its HELLO rank 0 sends PORT FAKE_SEND_PORT (31337; another rank too when
 * FAKE_SEND_PORT_R is set), then each rank reads the runtime's PORT frame and
 * prints "port N" (adding " (MASTER_PORT was set)" if it was) before its
 * PAYLOAD. FAKE_CONNECT_DELAY_MS[_R]: wait that long before connecting.
 * FAKE_HELLO_DELAY_MS[_R]: wait that long between the nonce and the HELLO (a
 * rank on a busy node, hundreds of them starting on a few cores).
 * With FAKE_PRINT_ENV set it first prints "ENV NAME=value" for the variables the
 * runtime sets, and facts about how it was started (open fds, stdin, signal
 * mask, process group).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

enum { HELLO = 1, PAYLOAD = 2, RESULT = 3, ERROR = 4, TASK = 5, OUTPUT = 6, PORT = 9,
       AGENT_HELLO = 11 };

static unsigned char key[32];
static int rank, world_size;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dprintf(2, "fake_rank: ");
    vdprintf(2, fmt, ap);
    dprintf(2, "\n");
    va_end(ap);
    exit(99);
}

static void be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char) (v >> 24);
    p[1] = (unsigned char) (v >> 16);
    p[2] = (unsigned char) (v >> 8);
    p[3] = (unsigned char) v;
}

static uint32_t rd32(const unsigned char *p)
{
    return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

/* DIR: 'R' on what we send, 'K' on what the runtime sends (dk_frame.h). */
static void mac(const unsigned char *nonce, unsigned char dir, uint32_t seq,
                const unsigned char *body, size_t body_len, unsigned char out[32])
{
    EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(m);
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end(),
    };
    unsigned char s[4];
    be32(s, seq);
    size_t len = 0;
    if (!EVP_MAC_init(ctx, key, sizeof key, params) || !EVP_MAC_update(ctx, nonce, 32) ||
        !EVP_MAC_update(ctx, &dir, 1) || !EVP_MAC_update(ctx, s, 4) ||
        !EVP_MAC_update(ctx, body, body_len) ||
        !EVP_MAC_final(ctx, out, &len, 32))
        die("HMAC failed");
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(m);
}

/* Not runtime/base's dk_write_all: this program uses none of the runtime's
 * code (above), and a write that fails here ends the fake rank. */
static void write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            die("write: %s", strerror(errno));
        p += w;
        n -= (size_t) w;
    }
}

/* Read N bytes; false at EOF before any byte. */
static bool read_all(int fd, void *buf, size_t n)
{
    char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == ECONNRESET)
            r = 0;
        if (r < 0)
            die("read: %s", strerror(errno));
        if (r == 0) {
            if (got == 0)
                return false;
            die("EOF inside a frame");
        }
        got += (size_t) r;
    }
    return true;
}

typedef struct {
    int fd;
    unsigned char nonce[32];
    uint32_t seq_out, seq_in;
} conn_t;

static bool over_tcp(void)
{
    const char *a = getenv("DISTKERNEL_BC");
    return a && !strncmp(a, "tcp:", 4);
}

/* "tcp:ADDR:PORT" or "tcp:[ADDR]:PORT": a connected TCP socket. */
static int connect_tcp(const char *address)
{
    char host[128];
    const char *colon = strrchr(address + 4, ':');
    if (!colon)
        die("bad address %s", address);
    const char *h = address + 4;
    size_t n = (size_t) (colon - h);
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        h++;
        n -= 2;
    }
    snprintf(host, sizeof host, "%.*s", (int) n, h);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *ai;
    if (getaddrinfo(host, colon + 1, &hints, &ai) != 0)
        die("bad address %s", address);
    int fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        die("connect %s: %s", address, strerror(errno));
    freeaddrinfo(ai);
    return fd;
}

static conn_t connect_bc(void)
{
    const char *path = getenv("DISTKERNEL_BC");
    if (!path)
        die("DISTKERNEL_BC is not set");
    conn_t c = {0};
    if (over_tcp()) {
        c.fd = connect_tcp(path);
        if (!read_all(c.fd, c.nonce, 32))
            die("no nonce");
        return c;
    }
    c.fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    if (connect(c.fd, (struct sockaddr *) &addr, sizeof addr) != 0)
        die("connect %s: %s", path, strerror(errno));
    if (!read_all(c.fd, c.nonce, 32))
        die("no nonce");
    return c;
}

static void send_frame(conn_t *c, int type, uint32_t r, const void *payload, size_t len,
                       bool forge)
{
    size_t body_len = 5 + len;
    unsigned char *frame = malloc(4 + 32 + body_len);
    be32(frame, (uint32_t) (32 + body_len));
    unsigned char *body = frame + 36;
    body[0] = (unsigned char) type;
    be32(body + 1, r);
    if (len)
        memcpy(body + 5, payload, len);
    mac(c->nonce, 'R', c->seq_out++, body, body_len, frame + 4);
    if (forge)
        frame[4] ^= 0x01;
    write_all(c->fd, frame, 4 + 32 + body_len);
    free(frame);
}

/* Mode flood: send OUTPUT frames of one byte for S seconds, as fast as the
 * connection takes them, many to a write, so the runtime (two reads, a MAC,
 * a log write and a callback per frame) cannot keep up. */
static void flood(conn_t *c, double s)
{
    enum { BATCH = 256, FRAME = 4 + 32 + 5 + 3 };
    static unsigned char buf[BATCH * FRAME];
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double) (t.tv_sec - t0.tv_sec) + (double) (t.tv_nsec - t0.tv_nsec) / 1e9 >= s)
            return;
        for (int i = 0; i < BATCH; i++) {
            unsigned char *f = buf + i * FRAME, *body = f + 36;
            be32(f, FRAME - 4);
            body[0] = OUTPUT;
            be32(body + 1, (uint32_t) rank);
            body[5] = 1;        /* fd 1 */
            body[6] = 0;
            body[7] = '.';
            mac(c->nonce, 'R', c->seq_out++, body, FRAME - 36, f + 4);
        }
        write_all(c->fd, buf, sizeof buf);
    }
}

/* NAME_R (this rank's) if set, else NAME. */
static const char *var_for(const char *name)
{
    static char buf[96];
    snprintf(buf, sizeof buf, "%s_%d", name, rank);
    return getenv(buf) ? buf : name;
}

/* Receive one frame; returns its payload (malloc'd) and length. */
static unsigned char *recv_frame(conn_t *c, int *type, size_t *len)
{
    unsigned char h[4];
    if (!read_all(c->fd, h, 4))
        die("the runtime closed the back channel");
    uint32_t n = rd32(h);
    if (n < 37)
        die("short frame");
    unsigned char *frame = malloc(n);
    if (!frame || !read_all(c->fd, frame, n))
        die("cannot read a frame of %u bytes", n);
    unsigned char expect[32];
    mac(c->nonce, 'K', c->seq_in++, frame + 32, n - 32, expect);
    if (memcmp(expect, frame, 32) != 0)
        die("the runtime's frame did not verify");
    *type = frame[32];
    if (rd32(frame + 33) != (uint32_t) rank)
        die("frame for another rank");
    *len = n - 37;
    memmove(frame, frame + 37, *len);
    return frame;
}

/* Mode reflect: read the runtime's frames, verifying each, until one whose
 * seq is the one the runtime expects of us next (our seq_out), and write its
 * bytes back as they came; that seq is then used up on both sides. */
static void reflect_frame(conn_t *c)
{
    for (;;) {
        unsigned char h[4];
        if (!read_all(c->fd, h, 4))
            die("the runtime closed the back channel");
        uint32_t n = rd32(h);
        if (n < 37)
            die("short frame");
        unsigned char *frame = malloc(4 + n);
        if (!frame || !read_all(c->fd, frame + 4, n))
            die("cannot read a frame of %u bytes", n);
        memcpy(frame, h, 4);
        unsigned char expect[32];
        uint32_t seq = c->seq_in++;
        mac(c->nonce, 'K', seq, frame + 4 + 32, n - 32, expect);
        if (memcmp(expect, frame + 4, 32) != 0)
            die("the runtime's frame did not verify");
        if (seq != c->seq_out) {
            free(frame);
            continue;       /* not aligned with ours yet */
        }
        dprintf(1, "reflected seq %u\n", seq);
        write_all(c->fd, frame, 4 + n);
        c->seq_out++;
        free(frame);
        return;
    }
}

/* Wait until the runtime closes C (it refused it). */
static void expect_closed(conn_t *c)
{
    unsigned char b;
    if (read_all(c->fd, &b, 1))
        die("the runtime did not close a connection it should have refused");
    close(c->fd);
}

/* FAKE_SYNC/NAME: create it; wait (up to 20 s) until it exists. */
static void sync_path(const char *name, char *out, size_t n)
{
    const char *dir = getenv("FAKE_SYNC");
    if (!dir)
        die("FAKE_SYNC is not set");
    snprintf(out, n, "%s/%s", dir, name);
}

static void sync_touch(const char *name)
{
    char path[512];
    sync_path(name, path, sizeof path);
    FILE *f = fopen(path, "w");
    if (!f)
        die("cannot create %s", path);
    fclose(f);
}

static void sync_wait(const char *name)
{
    char path[512];
    sync_path(name, path, sizeof path);
    for (int i = 0; i < 2000 && access(path, F_OK) != 0; i++)
        usleep(10000);
    if (access(path, F_OK) != 0)
        die("%s never appeared", path);
}

/* exiting_result: the thread that outlives main, so the process stays exiting. */
static void *linger(void *arg)
{
    (void) arg;
    usleep(50000);              /* main has called pthread_exit by now */
    sync_touch("r0");
    usleep(1000000);
    exit(0);
}

static void print_facts(void)
{
    static const char *names[] = {
        "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
        "ROLE_NAME", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "OMP_NUM_THREADS", "DISTKERNEL_BC", "DISTKERNEL_LOG", "DISTKERNEL_CWD", "FAKE_EXTRA",
        "DISTKERNEL_MASTER_PORT",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        dprintf(1, "ENV %s=%s\n", names[i], v ? v : "(unset)");
    }
    const char *k = getenv("DISTKERNEL_BC_KEY");
    dprintf(1, "KEYLEN %zu\n", k ? strlen(k) : 0);

    DIR *d = opendir("/proc/self/fd");
    int own = dirfd(d);
    dprintf(1, "FDS");
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] != '.' && atoi(e->d_name) != own)
            dprintf(1, " %s", e->d_name);
    }
    dprintf(1, "\n");
    closedir(d);

    char target[256] = "";
    ssize_t n = readlink("/proc/self/fd/0", target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    dprintf(1, "STDIN %s\n", target);

    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "SigBlk:", 7) || !strncmp(line, "SigIgn:", 7))
            dprintf(1, "%s", line);
    }
    if (f)
        fclose(f);
    dprintf(1, "PGID %d PID %d\n", (int) getpgrp(), (int) getpid());
}

static void hex(const unsigned char *in, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", in[i]);
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void) sig;
    interrupted = 1;
}

/* Sleep S seconds, or until SIGINT when it is caught. */
/* Sleep S seconds, or until SIGINT when it is handled. SIGINT is blocked by the
 * caller beforehand and unblocked only inside ppoll, so one that arrives just
 * before the wait is not missed (it interrupts ppoll at once). */
static void sleep_s(double s)
{
    struct timespec ts = {(time_t) s, (long) ((s - (double) (time_t) s) * 1e9)};
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += ts.tv_sec;
    end.tv_nsec += ts.tv_nsec;
    if (end.tv_nsec >= 1000000000L) {
        end.tv_sec++;
        end.tv_nsec -= 1000000000L;
    }
    sigset_t open;
    sigprocmask(SIG_SETMASK, NULL, &open);
    sigdelset(&open, SIGINT);
    while (!interrupted) {
        struct timespec now, left;
        clock_gettime(CLOCK_MONOTONIC, &now);
        left.tv_sec = end.tv_sec - now.tv_sec;
        left.tv_nsec = end.tv_nsec - now.tv_nsec;
        if (left.tv_nsec < 0) {
            left.tv_sec--;
            left.tv_nsec += 1000000000L;
        }
        if (left.tv_sec < 0)
            return;
        ppoll(NULL, 0, &left, &open);
    }
}

/* Send TYPE answering round ROUND: u32 round | TEXT. */
static void answer(conn_t *c, int type, uint32_t round, const char *text)
{
    size_t n = strlen(text);
    unsigned char *buf = malloc(4 + n);
    be32(buf, round);
    memcpy(buf + 4, text, n);
    send_frame(c, type, (uint32_t) rank, buf, 4 + n, false);
    free(buf);
}

/* A persistent job's rank (mode "rounds"). */
static void *sleep_forever(void *unused)
{
    (void) unused;
    for (;;)
        pause();
    return NULL;
}

static int serve_rounds(void)
{
    struct sigaction sa = {.sa_handler = on_sigint};
    sigaction(SIGINT, &sa, NULL);
    conn_t c = connect_bc();
    send_frame(&c, HELLO, (uint32_t) rank, NULL, 0, false);
    for (;;) {
        unsigned char h[4];
        if (!read_all(c.fd, h, 4))
            return 0;           /* the runtime closed the channel: we are done */
        uint32_t n = rd32(h);
        if (n < 41)
            die("short task frame");
        unsigned char *frame = malloc(n + 1);
        if (!frame || !read_all(c.fd, frame, n))
            die("cannot read a frame of %u bytes", n);
        unsigned char expect[32];
        mac(c.nonce, 'K', c.seq_in++, frame + 32, n - 32, expect);
        if (memcmp(expect, frame, 32) != 0)
            die("the runtime's frame did not verify");
        if (frame[32] != TASK)
            die("expected TASK, got type %d", frame[32]);
        if (rd32(frame + 33) != (uint32_t) rank)
            die("frame for another rank");
        uint32_t round = rd32(frame + 37);
        frame[n] = '\0';
        char action[64];
        snprintf(action, sizeof action, "%s", (char *) frame + 41);
        free(frame);
        char *at = strchr(action, '@');
        if (at) {
            *at = '\0';
            if (atoi(at + 1) != rank)
                snprintf(action, sizeof action, "result");
        }
        char text[128];
        interrupted = 0;
        if (!strcmp(action, "error")) {
            snprintf(text, sizeof text, "boom in round %u on rank %d", round, rank);
            answer(&c, ERROR, round, text);
        } else if (!strcmp(action, "sleep")) {
            dprintf(1, "sleeping %u\n", round);
            sleep_s(60);
            answer(&c, ERROR, round, "KeyboardInterrupt");
        } else if (!strcmp(action, "stuck")) {
            signal(SIGINT, SIG_IGN);
            dprintf(1, "stuck %u\n", round);
            for (;;)
                pause();
        } else if (!strcmp(action, "exit3")) {
            return 3;
        } else if (!strcmp(action, "leader_exit")) {
            /* The main thread ends alone: the leader is a zombie while the
             * process lives on (as a SIGKILLed rank whose threads are still
             * tearing down looks, for a while). */
            pthread_t t;
            if (pthread_create(&t, NULL, sleep_forever, NULL) != 0)
                die("pthread_create");
            dprintf(1, "leader exiting %u\n", round);
            pthread_exit(NULL);
        } else {
            snprintf(text, sizeof text, "round=%u rank=%d", round, rank);
            answer(&c, RESULT, round + (strcmp(action, "bad_round") == 0), text);
        }
    }
}

int main(void)
{
    const char *rank_s = getenv("RANK"), *ws = getenv("WORLD_SIZE");
    const char *key_hex = getenv("DISTKERNEL_BC_KEY");
    if (!rank_s || !ws || !key_hex || strlen(key_hex) != 64)
        die("RANK, WORLD_SIZE or DISTKERNEL_BC_KEY missing");
    rank = atoi(rank_s);
    world_size = atoi(ws);
    for (int i = 0; i < 32; i++) {
        unsigned v;
        sscanf(key_hex + 2 * i, "%2x", &v);
        key[i] = (unsigned char) v;
    }
    char var[64];
    snprintf(var, sizeof var, "FAKE_MODE_%d", rank);
    const char *mode = getenv(var) ? getenv(var) : getenv("FAKE_MODE");
    if (!mode)
        mode = "result";
    if (!strcmp(mode, "ignore_signals")) {
        signal(SIGINT, SIG_IGN);
        signal(SIGTERM, SIG_IGN);
    }
    if (getenv("FAKE_PRINT_ENV"))
        print_facts();
    if (!strcmp(mode, "exit3_at_start"))
        return 3;
    if (!strcmp(mode, "freeze_at_start")) {
        dprintf(1, "freezing before connecting\n");
        raise(SIGSTOP);
    }
    if (!strcmp(mode, "rounds"))
        return serve_rounds();

    if (!strcmp(mode, "forge_mac") || !strcmp(mode, "bad_rank")) {
        conn_t bad = connect_bc();
        bool forge = !strcmp(mode, "forge_mac");
        send_frame(&bad, HELLO, forge ? (uint32_t) rank : (uint32_t) world_size, NULL, 0, forge);
        expect_closed(&bad);
        dprintf(1, "refused as expected\n");
    }

    if (!strcmp(mode, "agent_hello")) {
        conn_t bad = connect_bc();
        send_frame(&bad, AGENT_HELLO, 0, NULL, 0, false);
        expect_closed(&bad);
        dprintf(1, "refused as expected\n");
    }
    if (!strcmp(mode, "direct_hello")) {
        const char *kernel = getenv("FAKE_KERNEL_BC");
        if (!kernel || strncmp(kernel, "tcp:", 4) != 0)
            die("FAKE_KERNEL_BC is not the kernel's tcp: address");
        conn_t bad = {.fd = connect_tcp(kernel)};
        if (!read_all(bad.fd, bad.nonce, 32))
            die("no nonce");
        send_frame(&bad, HELLO, (uint32_t) rank, NULL, 0, false);
        expect_closed(&bad);
        dprintf(1, "refused as expected\n");
    }

    int idle_last = -1;
    if (!strcmp(mode, "idle_hello")) {
        int n = getenv("FAKE_IDLE") ? atoi(getenv("FAKE_IDLE")) : 72;
        for (int i = 0; i < n; i++) {
            int fd = socket(AF_UNIX, SOCK_STREAM, 0);
            struct sockaddr_un addr = {.sun_family = AF_UNIX};
            snprintf(addr.sun_path, sizeof addr.sun_path, "%s", getenv("DISTKERNEL_BC"));
            if (connect(fd, (struct sockaddr *) &addr, sizeof addr) != 0)
                die("idle connect: %s", strerror(errno));
            idle_last = fd;
        }
    }
    struct timespec idle_t0;
    clock_gettime(CLOCK_MONOTONIC, &idle_t0);

    if (!strcmp(mode, "exiting_result"))
        sync_wait("r1");        /* connect after rank 1: its frames are read first */
    const char *delay = getenv(var_for("FAKE_CONNECT_DELAY_MS"));
    if (delay)
        usleep((useconds_t) atoi(delay) * 1000);
    conn_t c = connect_bc();
    const char *hello_delay = getenv(var_for("FAKE_HELLO_DELAY_MS"));
    if (hello_delay)
        usleep((useconds_t) atoi(hello_delay) * 1000);
    send_frame(&c, HELLO, (uint32_t) rank, NULL, 0, false);
    int type;
    size_t len;
    const char *from = getenv("DISTKERNEL_MASTER_PORT");
    if (from && !strcmp(from, "rank0")) {
        /* Rank 0 sends the port it found (FAKE_SEND_PORT, 31337 by default);
         * another rank only when told to (FAKE_SEND_PORT_R). Every rank is
         * then sent the run's port before its PAYLOAD. */
        const char *send = getenv(var_for("FAKE_SEND_PORT"));
        if (rank == 0 && !send)
            send = "31337";
        if (send) {
            unsigned char be[4];
            be32(be, (uint32_t) strtoul(send, NULL, 10));
            send_frame(&c, PORT, (uint32_t) rank, be, 4, false);
        }
        unsigned char *port = recv_frame(&c, &type, &len);
        if (type != PORT || len != 4)
            die("expected PORT, got type %d (%zu bytes)", type, len);
        dprintf(1, "port %u%s\n", rd32(port), getenv("MASTER_PORT") ? " (MASTER_PORT was set)" : "");
        free(port);
    }
    if (!strcmp(mode, "reflect")) {
        reflect_frame(&c);
        expect_closed(&c);
        return 1;
    }
    unsigned char *payload = recv_frame(&c, &type, &len);
    if (type != PAYLOAD)
        die("expected PAYLOAD, got type %d", type);
    if (!strcmp(mode, "hold"))
        dprintf(1, "hold\n");
    unsigned char digest[32];
    unsigned int dlen = 0;
    EVP_Digest(payload, len, digest, &dlen, EVP_sha256(), NULL);
    free(payload);
    char digest_hex[65];
    hex(digest, 32, digest_hex);

    if (idle_last >= 0) {
        /* The nonce, then end of file once the HELLO deadline has passed. */
        unsigned char buf[64];
        bool closed = false;
        for (;;) {
            struct pollfd p = {.fd = idle_last, .events = POLLIN};
            if (poll(&p, 1, 30000) <= 0)
                break;
            ssize_t got = read(idle_last, buf, sizeof buf);
            if (got <= 0) {
                closed = true;
                break;
            }
        }
        struct timespec t1;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (closed)
            dprintf(1, "idle closed after %ld s\n", (long) (t1.tv_sec - idle_t0.tv_sec));
        else
            dprintf(1, "idle still open\n");
    }
    if (!strcmp(mode, "duplicate_hello")) {
        conn_t dup = connect_bc();
        send_frame(&dup, HELLO, (uint32_t) rank, NULL, 0, false);
        expect_closed(&dup);
        dprintf(1, "refused as expected\n");
    } else if (!strcmp(mode, "error") || !strcmp(mode, "error_hang")) {
        char text[64];
        int n = snprintf(text, sizeof text, "boom on rank %d", rank);
        send_frame(&c, ERROR, (uint32_t) rank, text, (size_t) n, false);
        if (!strcmp(mode, "error_hang"))
            sleep_s(60);
        return 1;
    } else if (!strcmp(mode, "error_synced")) {
        sync_touch("r1");
        sync_wait("r0");
        char text[64];
        int n = snprintf(text, sizeof text, "boom on rank %d", rank);
        send_frame(&c, ERROR, (uint32_t) rank, text, (size_t) n, false);
        sync_touch("release");
        return 1;
    } else if (!strcmp(mode, "exiting_result")) {
        dprintf(1, "hold\n");
        sync_wait("held");      /* the runtime's thread is held in the sink */
        static const char text[] = "done";
        send_frame(&c, RESULT, (uint32_t) rank, text, sizeof text - 1, false);
        close(c.fd);
        pthread_t t;
        if (pthread_create(&t, NULL, linger, NULL) != 0)
            die("pthread_create failed");
        pthread_exit(NULL);
    } else if (!strcmp(mode, "exit3")) {
        return 3;
    } else if (!strcmp(mode, "no_result")) {
        return 0;
    } else if (!strcmp(mode, "segv")) {
        struct rlimit none = {0, 0};
        setrlimit(RLIMIT_CORE, &none);
        signal(SIGSEGV, SIG_DFL);
        raise(SIGSEGV);
        return 98;
    } else if (!strcmp(mode, "oversize")) {
        unsigned char h[4];
        be32(h, 0x80000000u);
        write_all(c.fd, h, 4);
        expect_closed(&c);
        return 0;
    } else if (!strcmp(mode, "sleep") || !strcmp(mode, "interruptible")) {
        if (!strcmp(mode, "interruptible")) {
            sigset_t intr;
            sigemptyset(&intr);
            sigaddset(&intr, SIGINT);
            sigprocmask(SIG_BLOCK, &intr, NULL);
            struct sigaction sa = {.sa_handler = on_sigint};
            sigaction(SIGINT, &sa, NULL);
        }
        dprintf(1, "sleeping\n");
        sleep_s(getenv("FAKE_SLEEP_S") ? atof(getenv("FAKE_SLEEP_S")) : 60);
        if (interrupted) {
            static const char text[] = "KeyboardInterrupt";
            send_frame(&c, ERROR, (uint32_t) rank, text, sizeof text - 1, false);
            return 1;
        }
    } else if (!strcmp(mode, "ignore_signals")) {
        dprintf(1, "sleeping\n");
        for (;;)
            pause();
    } else if (!strcmp(mode, "print_lots")) {
        int lines = getenv("FAKE_LINES") ? atoi(getenv("FAKE_LINES")) : 1000;
        for (int i = 0; i < lines; i++) {
            dprintf(1, "out %d\n", i);
            dprintf(2, "err %d\n", i);
        }
    } else if (!strcmp(mode, "log_note")) {
        static const unsigned char note[] = "\3\0a note about itself\n";
        send_frame(&c, OUTPUT, (uint32_t) rank, note, sizeof note - 1, false);
    } else if (!strcmp(mode, "bad_output")) {
        static const unsigned char bad[] = {4, 0, 'x'};
        send_frame(&c, OUTPUT, (uint32_t) rank, bad, sizeof bad, false);
        expect_closed(&c);
        dprintf(1, "refused as expected\n");
        return 0;
    } else if (!strcmp(mode, "hold")) {
        sleep_s(getenv("FAKE_SLEEP_S") ? atof(getenv("FAKE_SLEEP_S")) : 60);
    } else if (!strcmp(mode, "close_hang")) {
        dprintf(1, "closing\n");
        close(c.fd);
        if (getenv("FAKE_SYNC"))
            sync_touch("r0");
        sleep_s(getenv("FAKE_SLEEP_S") ? atof(getenv("FAKE_SLEEP_S")) : 60);
        return 3;
    } else if (!strcmp(mode, "flood")) {
        dprintf(1, "flooding\n");
        flood(&c, getenv("FAKE_FLOOD_S") ? atof(getenv("FAKE_FLOOD_S")) : 60);
        return 0;
    } else if (!strcmp(mode, "echo_error")) {
        /* what gloo raises on a rank whose peer's node went away */
        if (getenv("FAKE_SYNC"))
            sync_wait("go");
        else
            usleep(500000);
        static const char text[] = "{\"ename\": \"RuntimeError\", \"evalue\": \"[../gloo/"
                                   "transport/tcp/pair.cc:598] Connection closed by peer "
                                   "[10.0.0.2]:15792\"}";
        send_frame(&c, ERROR, (uint32_t) rank, text, sizeof text - 1, false);
        return 1;
    } else if (!strcmp(mode, "spawn_writer")) {
        if (system("echo child-out; echo child-err >&2; echo \"on $(uname -n)\"") != 0)
            die("system failed");
        dprintf(1, "last words\n");
        dprintf(2, "last words\n");
    } else if (!strcmp(mode, "grandchild")) {
        pid_t pid = fork();
        if (pid == 0) {
            close(c.fd);
            sleep_s(30);
            _exit(0);
        }
        dprintf(1, "GRANDCHILD %d\n", (int) pid);
    }

    char result[160];
    int n = snprintf(result, sizeof result, "rank=%d len=%zu sha256=%s", rank, len, digest_hex);
    send_frame(&c, RESULT, (uint32_t) rank, result, (size_t) n, false);
    close(c.fd);
    return 0;
}
