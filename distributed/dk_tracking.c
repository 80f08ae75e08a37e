/*
 * dk_tracking: MLflow runs for distributed runs. See dk_tracking.h.
 *
 * Requests are made from the kernel's main thread, before the ranks start and
 * after they have all exited, with short timeouts (DISTKERNEL_MLFLOW_TIMEOUT
 * seconds, default 2, one retry): against a local server the whole
 * bookkeeping costs a few milliseconds, against a dead one a bounded few seconds.
 * Experiment ids are cached per tracking URI and name for the kernel's life.
 */
#include "dk_tracking.h"
#include "dk_kernel.h"
#include "dk_logdir.h"
#include "dk_mlflow.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#define SERVER_START_TIMEOUT_S 60
#define SERVER_LOG "mlflow-server.log"

/* The tracking server this kernel started (one per process). */
static struct {
    pid_t pid;
    char uri[128];
    bool tried;          /* started once, or found `mlflow` missing */
    bool told_off;       /* the "tracking is off" line was shown */
} server;

static struct {
    char key[1600];      /* uri + "\n" + experiment name */
    char id[128];
} exp_cache;

static long long wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double request_timeout(void)
{
    const char *t = getenv("DISTKERNEL_MLFLOW_TIMEOUT");
    double v = t ? atof(t) : 0;
    return v > 0 ? v : 2.0;
}

/* The URI without user:password@, for links and messages. */
static void strip_credentials(const char *uri, char *out, size_t outlen)
{
    const char *scheme_end = strstr(uri, "://");
    const char *at = scheme_end ? strchr(scheme_end + 3, '@') : NULL;
    const char *slash = scheme_end ? strchr(scheme_end + 3, '/') : NULL;
    if (at && (!slash || at < slash))
        snprintf(out, outlen, "%.*s%s", (int)(scheme_end + 3 - uri), uri, at + 1);
    else
        snprintf(out, outlen, "%s", uri);
    size_t n = strlen(out);
    while (n > 0 && out[n - 1] == '/')
        out[--n] = '\0';
}

static char *find_on_path(const char *prog)
{
    const char *path = getenv("PATH");
    if (!path)
        return NULL;
    char *copy = strdup(path);
    char *found = NULL;
    for (char *save = NULL, *dir = strtok_r(copy, ":", &save); dir && !found;
         dir = strtok_r(NULL, ":", &save)) {
        char candidate[4096];
        snprintf(candidate, sizeof candidate, "%s/%s", *dir ? dir : ".", prog);
        if (access(candidate, X_OK) == 0)
            found = strdup(candidate);
    }
    free(copy);
    return found;
}

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(s);
    return port;
}

static size_t discard(char *ptr, size_t size, size_t n, void *data)
{
    (void)ptr;
    (void)data;
    return size * n;
}

/* MLflow's server answers GET /health with 200 once it serves. */
static bool server_alive(const char *uri)
{
    CURL *h = curl_easy_init();
    if (!h)
        return false;
    char url[256];
    snprintf(url, sizeof url, "%s/health", uri);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    long code = 0;
    bool ok = curl_easy_perform(h) == CURLE_OK &&
              curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200;
    curl_easy_cleanup(h);
    return ok;
}

/* ---- the server's guard ------------------------------------------------------
 *
 * `mlflow server` runs its web server as children of its own, which would
 * outlive a kernel that is SIGKILLed (PR_SET_PDEATHSIG reaches only the direct
 * child). So the kernel's child is a guard: it leads a process group, starts
 * the server in it, and when the kernel goes away (its PDEATHSIG) or asks it to
 * stop (SIGTERM), ends the whole group: SIGTERM, then SIGKILL. It runs in the
 * forked child of a threaded process, so it uses async-signal-safe calls only.
 */
static volatile sig_atomic_t guard_stop;

static void guard_on_term(int sig)
{
    (void)sig;
    guard_stop = 1;
}

static void guard_main(pid_t kernel, char *exe, char *const argv[], int log, int log_dirfd)
    __attribute__((noreturn));
static void guard_main(pid_t kernel, char *exe, char *const argv[], int log, int log_dirfd)
{
    setpgid(0, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = guard_on_term;
    sigaction(SIGTERM, &sa, NULL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (getppid() != kernel)
        _exit(0);
    pid_t srv = fork();
    if (srv == 0) {
        signal(SIGTERM, SIG_DFL);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0)
            dup2(devnull, 0);
        if (log < 0)
            log = open("/dev/null", O_WRONLY);
        if (log >= 0) {
            dup2(log, 1);
            dup2(log, 2);
        }
        execv(exe, argv);
        _exit(127);
    }
    int status = 0;
    while (!guard_stop) {
        pid_t r = waitpid(srv, &status, 0);
        if (r == srv)
            _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);   /* the server ended itself */
    }
    kill(-getpgrp(), SIGTERM);   /* the server and its workers (and this guard: handled) */
    struct timespec tick = {0, 50 * 1000 * 1000};
    for (int i = 0; i < 60 && waitpid(srv, &status, WNOHANG) == 0; i++)
        nanosleep(&tick, NULL);
    if (log_dirfd >= 0)
        unlinkat(log_dirfd, SERVER_LOG, 0);
    signal(SIGTERM, SIG_DFL);
    kill(-getpgrp(), SIGKILL);   /* whatever is left, this guard included */
    _exit(0);
}

/* The server's log: ROOT/kernel-PID/mlflow-server.log in the checked log root
 * of the rank logs (dk_logdir.h), made with O_EXCL | O_NOFOLLOW relative to the
 * folder's descriptor, never a predictable name in a shared /tmp (where a
 * planted symlink once made the kernel overwrite the user's files). Returns the
 * log's descriptor and sets *DIRFD to the folder's (the guard removes the log
 * at the end), or -1 with the reason in PATH. */
static int open_server_log(int *dirfd, char *path, size_t pathlen)
{
    char err[1024];
    *dirfd = -1;
    char *base = dk_logdir_default_root(err, sizeof err);
    int root = base ? dk_logdir_open(base, DK_LOGDIR_CREATE,
                                     "set DISTKERNEL_LOG_DIR to a directory that is yours alone",
                                     err, sizeof err) : -1;
    char kname[32];
    snprintf(kname, sizeof kname, "kernel-%d", (int)getpid());
    int log = -1;
    if (root >= 0 && (*dirfd = dk_logdir_mkdir(root, kname, false, err, sizeof err)) >= 0) {
        unlinkat(*dirfd, SERVER_LOG, 0);   /* a leftover of a kernel with our pid: ours */
        log = dk_logdir_create(*dirfd, SERVER_LOG, err, sizeof err);
    }
    if (log >= 0)
        snprintf(path, pathlen, "%s/%s/%s", base, kname, SERVER_LOG);
    else
        snprintf(path, pathlen, "its log, which could not be kept: %s", err);
    if (root >= 0)
        close(root);
    free(base);
    return log;
}

/* Start `mlflow server` on a free loopback port with MLflow's own default
 * store in the notebook's directory; NULL when mlflow is not installed. */
static const char *start_server(char *note, size_t notelen)
{
    if (server.tried)
        return server.pid > 0 ? server.uri : NULL;
    server.tried = true;
    char *mlflow = find_on_path("mlflow");
    if (!mlflow)
        return NULL;
    int port = free_port();
    char cwd[2048];
    if (port < 0 || !getcwd(cwd, sizeof cwd)) {
        free(mlflow);
        snprintf(note, notelen, "MLflow tracking is off: could not pick a port for its server");
        return NULL;
    }
    char store[2200], port_s[16], log_path[2200];
    snprintf(store, sizeof store, "sqlite:///%s/mlflow.db", cwd);
    snprintf(port_s, sizeof port_s, "%d", port);
    int log_dirfd;
    int log = open_server_log(&log_dirfd, log_path, sizeof log_path);
    char *argv[] = {mlflow, "server", "--backend-store-uri", store, "--host", "127.0.0.1",
                    "--port", port_s, NULL};
    pid_t kernel = getpid();
    pid_t pid = fork();
    if (pid == 0)
        guard_main(kernel, mlflow, argv, log, log_dirfd);
    if (log >= 0)
        close(log);
    if (log_dirfd >= 0)
        close(log_dirfd);
    free(mlflow);
    if (pid < 0) {
        snprintf(note, notelen, "MLflow tracking is off: could not start `mlflow server`: %s",
                 strerror(errno));
        return NULL;
    }
    server.pid = pid;
    snprintf(server.uri, sizeof server.uri, "http://127.0.0.1:%d", port);
    for (int i = 0; i < SERVER_START_TIMEOUT_S * 5; i++) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            server.pid = 0;
            snprintf(note, notelen,
                     "MLflow tracking is off: `mlflow server` exited at start (see %s)", log_path);
            return NULL;
        }
        if (server_alive(server.uri))
            return server.uri;
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    dk_tracking_shutdown();
    snprintf(note, notelen, "MLflow tracking is off: `mlflow server` did not answer within %d s "
                            "(see %s)", SERVER_START_TIMEOUT_S, log_path);
    return NULL;
}

void dk_tracking_shutdown(void)
{
    /* Both the main and the control thread may get here on the way out. */
    pid_t pid = __atomic_exchange_n(&server.pid, 0, __ATOMIC_SEQ_CST);
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);   /* the guard ends the server's whole group */
    for (int i = 0; i < 80; i++) {
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

static dk_mlflow_t *client_for(const char *uri, char *err, size_t errlen)
{
    const char *insecure = getenv("MLFLOW_TRACKING_INSECURE_TLS");
    dk_mlflow_config_t cfg = {
        .tracking_uri = uri,
        .token = getenv("MLFLOW_TRACKING_TOKEN"),
        .username = getenv("MLFLOW_TRACKING_USERNAME"),
        .password = getenv("MLFLOW_TRACKING_PASSWORD"),
        .insecure_tls = insecure && (strcasecmp(insecure, "true") == 0 || strcmp(insecure, "1") == 0),
        .timeout_s = request_timeout(),
        .retries = 1,
    };
    return dk_mlflow_new(&cfg, err, errlen);
}

static void default_experiment(char *out, size_t outlen)
{
    const char *nb = getenv("JPY_SESSION_NAME");
    if (nb && *nb) {
        const char *base = strrchr(nb, '/');
        snprintf(out, outlen, "%s", base ? base + 1 : nb);
        char *dot = strrchr(out, '.');
        if (dot && strcmp(dot, ".ipynb") == 0)
            *dot = '\0';
        if (*out)
            return;
    }
    snprintf(out, outlen, "distkernel");
}

static void user_name(char *out, size_t outlen)
{
    const char *u = getenv("USER");
    struct passwd *pw = u && *u ? NULL : getpwuid(getuid());
    snprintf(out, outlen, "%s", u && *u ? u : pw ? pw->pw_name : "unknown");
}

void dk_tracking_begin(const dk_tracking_request_t *req, dk_tracked_run_t *out, char *note,
                       size_t notelen)
{
    memset(out, 0, sizeof *out);
    note[0] = '\0';
    if (!req->opts->tracking)
        return;
    const char *uri = getenv("MLFLOW_TRACKING_URI");
    if (!uri || !*uri) {
        uri = start_server(note, notelen);
        if (!uri) {
            if (!note[0] && !server.told_off)
                snprintf(note, notelen,
                         "MLflow tracking is off: set MLFLOW_TRACKING_URI to your tracking server, "
                         "or install mlflow to have distkernel start one (tracking=False hides "
                         "this line)");
            server.told_off = true;
            return;
        }
    } else if (strncasecmp(uri, "http://", 7) != 0 && strncasecmp(uri, "https://", 8) != 0) {
        char shown[1024];
        strip_credentials(uri, shown, sizeof shown);
        snprintf(note, notelen,
                 "MLflow tracking is off for this run: MLFLOW_TRACKING_URI=%.200s is not an HTTP "
                 "tracking server (distkernel records runs through MLflow's REST API; point it "
                 "at `mlflow server`)",
                 shown);
        return;
    }
    char err[1024];
    char clean[1024];
    strip_credentials(uri, clean, sizeof clean);
    dk_mlflow_t *c = client_for(uri, err, sizeof err);
    if (!c) {
        snprintf(note, notelen, "MLflow tracking is off for this run: %s", err);
        return;
    }
    char experiment[512];
    const char *exp_id_env = getenv("MLFLOW_EXPERIMENT_ID");
    const char *exp_name_env = getenv("MLFLOW_EXPERIMENT_NAME");
    if (req->opts->experiment[0])
        snprintf(experiment, sizeof experiment, "%s", req->opts->experiment);
    else if (exp_name_env && *exp_name_env)
        snprintf(experiment, sizeof experiment, "%s", exp_name_env);
    else
        default_experiment(experiment, sizeof experiment);
    if (!req->opts->experiment[0] && exp_id_env && *exp_id_env) {
        snprintf(out->experiment_id, sizeof out->experiment_id, "%s", exp_id_env);
    } else {
        char key[sizeof exp_cache.key];
        snprintf(key, sizeof key, "%s\n%s", clean, experiment);
        if (strcmp(key, exp_cache.key) == 0) {
            snprintf(out->experiment_id, sizeof out->experiment_id, "%s", exp_cache.id);
        } else if (dk_mlflow_experiment(c, experiment, out->experiment_id,
                                        sizeof out->experiment_id, err, sizeof err) < 0) {
            snprintf(note, notelen, "MLflow: could not record this run (%s); the run goes on", err);
            dk_mlflow_destroy(&c);
            return;
        } else {
            snprintf(exp_cache.key, sizeof exp_cache.key, "%s", key);
            snprintf(exp_cache.id, sizeof exp_cache.id, "%s", out->experiment_id);
        }
    }
    if (req->opts->run_name[0]) {
        snprintf(out->run_name, sizeof out->run_name, "%s", req->opts->run_name);
    } else {
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char stamp[32];
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
        snprintf(out->run_name, sizeof out->run_name, "distributed-%dx%s-%s", req->world_size,
                 req->gpu ? (req->accelerator_model[0] ? req->accelerator_model : "gpu") : "cpu",
                 stamp);
    }
    char user[128];
    user_name(user, sizeof user);
    json_t *tags = json_pack("{s:s, s:s, s:s}", "mlflow.source.type", "NOTEBOOK", "mlflow.user",
                             user, "distkernel.kind", req->kind);
    const char *nb = getenv("JPY_SESSION_NAME");
    json_object_set_new(tags, "mlflow.source.name", json_string(nb && *nb ? nb : "distkernel"));
    if (req->parent_run_id && *req->parent_run_id)
        json_object_set_new(tags, "mlflow.parentRunId", json_string(req->parent_run_id));
    out->start_ms = wall_ms();
    int rc = dk_mlflow_create_run(c, out->experiment_id, out->run_name, tags, out->start_ms,
                                  out->run_id, sizeof out->run_id, err, sizeof err);
    json_decref(tags);
    if (rc < 0) {
        snprintf(note, notelen, "MLflow: could not record this run (%s); the run goes on", err);
        dk_mlflow_destroy(&c);
        return;
    }
    const dk_dist_opts_t *o = req->opts;
    json_t *params = json_pack("{s:i, s:s, s:s, s:i, s:s, s:s}", "world_size", req->world_size,
                               "device", req->device, "accelerator_type",
                               req->gpu ? (req->accelerator_model[0] ? req->accelerator_model : "gpu")
                                        : "cpu",
                               "num_accelerators", req->gpu ? req->world_size : 0, "output",
                               o->output == DK_OUTPUT_RANK0 ? "rank0" : "all", "kind", req->kind);
    if (o->timeout_s > 0)
        json_object_set_new(params, "timeout", json_real(o->timeout_s));
    else
        json_object_set_new(params, "timeout", json_string("None"));
    if (o->num_processes)
        json_object_set_new(params, "num_processes", json_integer(o->num_processes));
    if (dk_mlflow_log_params(c, out->run_id, params, err, sizeof err) < 0)
        snprintf(note, notelen, "MLflow: the run's parameters were not recorded (%s)", err);
    json_decref(params);
    dk_mlflow_destroy(&c);
    out->active = true;
    snprintf(out->tracking_uri, sizeof out->tracking_uri, "%s", uri);
    dk_mlflow_run_url(uri, out->experiment_id, out->run_id, out->url, sizeof out->url);
}

void dk_tracking_end(dk_tracked_run_t *run, const char *status, char *note, size_t notelen)
{
    note[0] = '\0';
    if (!run->active)
        return;
    char err[1024];
    dk_mlflow_t *c = client_for(run->tracking_uri, err, sizeof err);
    if (!c || dk_mlflow_update_run(c, run->run_id, status, wall_ms(), err, sizeof err) < 0)
        snprintf(note, notelen, "MLflow: the run's final status (%s) was not recorded (%s)",
                 status, err);
    dk_mlflow_destroy(&c);
}
