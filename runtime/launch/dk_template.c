/*
 * dk_template: a warm-start template. See the header.
 *
 * The template tells it is ready by writing "ready" on its stdout once its
 * modules are imported and its socket listens; anything else it writes (an
 * import's traceback) is kept, last DK_TEMPLATE_TAIL bytes, for the reason
 * given when it fails. Its pipes are read only here, while waiting or
 * checking: once ready it writes nothing (the ranks it forks write to their
 * own pipes), so they cannot fill.
 */
#include "dk_template.h"

#include "dk_peer.h"
#include "dk_err.h"
#include "dk_logdir.h"
#include "dk_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DK_TEMPLATE_TAIL 2048
#define SOCKET_NAME "template"
#define READY_LINE "\nready\n"

extern char **environ;

struct dk_template_t {
    dk_spawned_t sp;
    bool ready, reaped;
    int status;
    char *dir, *socket, *fingerprint;
    /* The last bytes of stdout: "ready" is looked for as a whole line over
     * this window and each new read, so that a warm module's banner of any
     * length, printed at import, does not hide it. */
    char out[sizeof READY_LINE];
    size_t out_len;
    char tail[DK_TEMPLATE_TAIL];    /* the last of stderr */
    size_t tail_len;
};

static void free_template(dk_template_t *t)
{
    if (t->socket)
        unlink(t->socket);
    dk_logdir_socket_dir_remove(t->dir);
    free(t->socket);
    free(t->dir);
    free(t->fingerprint);
    free(t);
}

dk_template_t *dk_template_start(const char *rank_exe, const char *const *env,
                                 const char *modules, const char *import_path,
                                 const char *fingerprint, char *err,
                                 size_t errlen)
{
    dk_template_t *t = calloc(1, sizeof *t);
    if (!t) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    t->sp.pid = -1;
    t->out[0] = '\n';      /* the first byte of stdout starts a line */
    t->out_len = 1;
    char *program = dk_spawn_find_program(rank_exe, err, errlen);
    if (!program || !(t->dir = dk_logdir_socket_dir("warm", SOCKET_NAME, "the template's directory",
                                                    err, errlen)))
        goto fail;
    if (asprintf(&t->socket, "%s/" SOCKET_NAME, t->dir) < 0 ||
        !(t->fingerprint = strdup(fingerprint ? fingerprint : ""))) {
        t->socket = NULL;
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    const char *const *base = env ? env : (const char *const *)environ;
    char *sock_var = NULL, *mod_var = NULL, *path_var = NULL;
    const char *set[5];
    size_t k = 0;
    if (asprintf(&sock_var, "DISTKERNEL_TEMPLATE=%s", t->socket) >= 0)
        set[k++] = sock_var;
    if (asprintf(&mod_var, "DISTKERNEL_WARM_MODULES=%s", modules ? modules : "") >= 0)
        set[k++] = mod_var;
    if (asprintf(&path_var, "DISTKERNEL_WARM_PATH=%s", import_path ? import_path : "") >= 0)
        set[k++] = path_var;
    if (!dk_spawn_env_get(base, "OMP_NUM_THREADS"))
        set[k++] = "OMP_NUM_THREADS=1";
    /* torch.cuda.is_available() in a warm module then asks NVML, not the
     * driver: cuInit in the template would break CUDA in every rank forked
     * from it. The template's own: a rank gets the requester's environment. */
    set[k++] = "PYTORCH_NVML_BASED_CUDA_CHECK=1";
    char **envp = k >= 3 ? dk_spawn_env_build(base, set, k) : NULL;
    free(sock_var);
    free(mod_var);
    free(path_var);
    if (!envp) {
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    /* Named for what it is: it outlives runs by design, and as a
     * "distkernel-rank" it would look like an orphaned rank in ps. rank_main
     * sets the same name as its process name (comm); the ranks it forks
     * take back "distkernel-rank" (_template.py, _become_rank). */
    char *argv[] = {DK_TEMPLATE_ARGV0, NULL};
    dk_spawn_opts_t opts = DK_SPAWN_OPTS_INIT;
    opts.what = "warm-start template";
    char why[512];
    int rc = dk_spawn_with(program, argv, envp, &opts, &t->sp, why, sizeof why);
    dk_spawn_env_free(envp);
    if (rc < 0) {
        dk_set_err(err, errlen, "cannot start the warm-start template: %s", why);
        t->sp.pid = -1;
        goto fail;
    }
    free(program);
    return t;
fail:
    free(program);
    free_template(t);
    return NULL;
}

/* Read what is in the pipes now. */
static void drain(dk_template_t *t)
{
    char buf[4096];
    ssize_t n;
    const size_t keep_out = sizeof READY_LINE - 2;     /* all of the line but one byte */
    char scan[sizeof READY_LINE + sizeof buf];
    while (t->sp.out_fd >= 0 && (n = read(t->sp.out_fd, buf, sizeof buf)) > 0) {
        if (t->ready)
            continue;
        memcpy(scan, t->out, t->out_len);
        memcpy(scan + t->out_len, buf, (size_t)n);
        size_t len = t->out_len + (size_t)n;
        if (memmem(scan, len, READY_LINE, sizeof READY_LINE - 1))
            t->ready = true;
        t->out_len = len < keep_out ? len : keep_out;
        memcpy(t->out, scan + len - t->out_len, t->out_len);
    }
    while (t->sp.err_fd >= 0 && (n = read(t->sp.err_fd, buf, sizeof buf)) > 0) {
        if ((size_t)n >= sizeof t->tail) {
            memcpy(t->tail, buf + n - (sizeof t->tail - 1), sizeof t->tail - 1);
            t->tail_len = sizeof t->tail - 1;
        } else {
            size_t keep = t->tail_len + (size_t)n < sizeof t->tail ? t->tail_len
                                                                    : sizeof t->tail - 1 - (size_t)n;
            memmove(t->tail, t->tail + t->tail_len - keep, keep);
            memcpy(t->tail + keep, buf, (size_t)n);
            t->tail_len = keep + (size_t)n;
        }
        t->tail[t->tail_len] = '\0';
    }
}

/* True (and the reason in WHY) when the template has exited. */
static bool gone(dk_template_t *t, char *why, size_t whylen)
{
    if (!t->reaped) {
        int status;
        pid_t got = waitpid(t->sp.pid, &status, WNOHANG);
        if (got == 0)
            return false;
        t->reaped = true;
        t->status = got == t->sp.pid ? status : 0;
    }
    drain(t);
    char how[64];
    if (WIFSIGNALED(t->status))
        snprintf(how, sizeof how, "was killed by signal %d", WTERMSIG(t->status));
    else
        snprintf(how, sizeof how, "exited with code %d", WEXITSTATUS(t->status));
    dk_set_err(why, whylen, "the warm-start template %s%s%s", how, t->tail_len ? ": " : "",
               t->tail);
    return true;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

int dk_template_ready(dk_template_t *t, int timeout_ms, char *why, size_t whylen)
{
    long long deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
    for (;;) {
        drain(t);
        if (gone(t, why, whylen))
            return -1;
        if (t->ready)
            return 1;
        long long left = deadline < 0 ? 100 : deadline - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd p[3] = {{.fd = t->sp.out_fd, .events = POLLIN},
                              {.fd = t->sp.err_fd, .events = POLLIN},
                              {.fd = t->sp.pidfd, .events = POLLIN}};
        /* Without a pidfd, an exit is seen within 100 ms. */
        poll(p, 3, (int)(left < 100 ? left : 100));
    }
}

int dk_template_check(dk_template_t *t, char *why, size_t whylen)
{
    int ready = dk_template_ready(t, 0, why, whylen);
    if (ready <= 0) {
        if (ready == 0)
            dk_set_err(why, whylen, "the warm-start template is still importing");
        return -1;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", t->socket);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct timeval tv = {.tv_sec = 10};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0 ||
        connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        dk_set_err(why, whylen, "the warm-start template cannot be reached: %s",
                   strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (dk_peer_check(fd, "the warm-start template's socket", why, whylen) < 0 ||
        send(fd, "P\0\0\0\0\0\0\0", 8, MSG_NOSIGNAL) != 8) {
        if (errno != EACCES)
            dk_set_err(why, whylen, "the warm-start template cannot be reached: %s",
                       strerror(errno));
        close(fd);
        return -1;
    }
    char line[1024];
    size_t n = 0;
    ssize_t r;
    while (n + 1 < sizeof line && (r = read(fd, line + n, sizeof line - 1 - n)) > 0)
        n += (size_t)r;
    close(fd);
    line[n] = '\0';
    char *nl = strchr(line, '\n');
    if (nl)
        *nl = '\0';
    if (strncmp(line, "ok", 2) == 0)
        return 0;
    dk_set_err(why, whylen, "%s", strncmp(line, "no ", 3) == 0 ? line + 3
                                  : "the warm-start template did not answer");
    return -1;
}

bool dk_template_was_ready(const dk_template_t *t)
{
    return t->ready;
}

const char *dk_template_socket(const dk_template_t *t)
{
    return t->socket;
}

const char *dk_template_fingerprint(const dk_template_t *t)
{
    return t->fingerprint;
}

int dk_template_pid(const dk_template_t *t)
{
    return t->sp.pid;
}

long dk_template_rss_kb(const dk_template_t *t)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", t->sp.pid);
    FILE *f = fopen(path, "re");
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

/* How long an ending template has to end its ranks' groups. */
#define END_WAIT_MS 2000

/* SIGTERM through the template's pidfd, and wait (at most END_WAIT_MS) for it
 * to exit: each rank it forked leads a group of its own, which the template
 * ends on SIGTERM before it exits (_template.py, serve); a SIGKILL
 * would leave what the ranks started running. */
static void term_and_wait(const dk_template_t *t)
{
    if (t->sp.pidfd < 0)
        return;
    if (syscall(SYS_pidfd_send_signal, t->sp.pidfd, SIGTERM, NULL, 0) != 0)
        return;
    struct pollfd p = {.fd = t->sp.pidfd, .events = POLLIN};
    while (poll(&p, 1, END_WAIT_MS) < 0 && errno == EINTR)
        ;
}

void dk_template_end(dk_template_t *t)
{
    if (!t || t->sp.pid <= 0)
        return;
    /* Once reaped, its pid (and group id) may be another process's now. */
    if (!t->reaped) {
        term_and_wait(t);
        kill(-t->sp.pid, SIGKILL);
        kill(t->sp.pid, SIGKILL);
    }
    unlink(t->socket);
    dk_logdir_socket_dir_remove(t->dir);
}

void dk_template_unlink(dk_template_t *t)
{
    if (!t || !t->dir)
        return;
    unlink(t->socket);
    dk_logdir_socket_dir_remove(t->dir);
}

void dk_template_kill(const dk_template_t *t)
{
    /* The pidfd names this process and no other, reaped or not. */
    if (t && t->sp.pidfd >= 0) {
        term_and_wait(t);
        syscall(SYS_pidfd_send_signal, t->sp.pidfd, SIGKILL, NULL, 0);
    }
}

void dk_template_destroy(dk_template_t **t_p)
{
    dk_template_t *t = t_p ? *t_p : NULL;
    if (!t)
        return;
    *t_p = NULL;
    if (t->sp.pid > 0 && !t->reaped) {
        term_and_wait(t);
        kill(-t->sp.pid, SIGKILL);
        kill(t->sp.pid, SIGKILL);
        while (waitpid(t->sp.pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    if (t->sp.pidfd >= 0)
        close(t->sp.pidfd);
    if (t->sp.out_fd >= 0)
        close(t->sp.out_fd);
    if (t->sp.err_fd >= 0)
        close(t->sp.err_fd);
    free_template(t);
}
