/*
 * dk_tracking: MLflow runs for distributed runs. See dk_tracking.h.
 *
 * Requests are made from the kernel's main thread, before the ranks start and
 * after they have all exited, with short timeouts (DISTKERNEL_MLFLOW_TIMEOUT
 * seconds, default 2, one retry): against a local server the whole
 * bookkeeping costs a few milliseconds, against a dead one a bounded few seconds.
 * Experiment ids are cached per tracking URI and name for the kernel's life.
 *
 * The server process itself (start, log, supervision, stop) is the runtime's
 * (dk_server.h); this file keeps only the MLflow bookkeeping, and what it
 * remembers between runs lives in the dk_tracking_t the feature owns.
 */
#include "dk_tracking.h"
#include "dk_clock.h"
#include "dk_kernel.h"
#include "dk_logdir.h"
#include "dk_mlflow.h"
#include "dk_server.h"
#include "dk_setting.h"
#include "dk_spawn.h"

#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* What the kernel remembers between runs. Only the main thread touches it,
 * except `server`, which dk_tracking_stop_server may take from any thread. */
struct dk_tracking_t {
    dk_server_t *server;     /* the tracking server this kernel started, or NULL */
    bool tried;              /* started once, or found `mlflow` missing */
    bool told_off;           /* the "tracking is off" line was shown */
    char exp_key[1600];      /* uri + "\n" + experiment name ... */
    char exp_id[128];        /* ... and its id */
};

dk_tracking_t *dk_tracking_new(void)
{
    return calloc(1, sizeof(dk_tracking_t));
}

void dk_tracking_destroy(dk_tracking_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_tracking_stop_server(*self_p);
    free(*self_p);
    *self_p = NULL;
}

static double request_timeout(void)
{
    return dk_setting_number("DISTKERNEL_MLFLOW_TIMEOUT");
}

/* How long the server the kernel starts has to answer /health (s):
 * DISTKERNEL_MLFLOW_START_TIMEOUT. MLflow 3 imports for 10-30 s on an idle
 * 2-core machine and over a minute on a loaded one; a busy login node may
 * need longer. */
static int start_timeout(void)
{
    return (int)dk_setting_number("DISTKERNEL_MLFLOW_START_TIMEOUT");
}

/* Start `mlflow server` on a free loopback port with MLflow's own default
 * store in the notebook's directory, once; NULL when mlflow is not installed
 * or did not start (NOTE then says why). */
static const char *start_server(dk_tracking_t *self, char *note, size_t notelen)
{
    if (self->tried) {
        if (!self->server)
            return NULL;
        /* Checked before every run: were the server gone, its port would be anyone's. */
        char err[1024];
        if (dk_server_check(self->server, err, sizeof err) < 0) {
            snprintf(note, notelen, "MLflow tracking is off for this run: %s", err);
            return NULL;
        }
        return dk_server_uri(self->server);
    }
    self->tried = true;
    char cwd[2048], store[2200];
    if (!getcwd(cwd, sizeof cwd)) {
        snprintf(note, notelen, "MLflow tracking is off: could not pick a port for its server");
        return NULL;
    }
    char found[256];
    char *program = dk_spawn_find_program("mlflow", found, sizeof found);
    if (!program)
        return NULL;    /* not installed: no store to make, and the caller says so */
    free(program);
    /* The store holds every run's parameters and metrics: it is made here,
     * 0600, in a folder checked as the log root is, before MLflow opens it by
     * path (SQLite keeps the mode of an existing file, and gives its journal
     * files the same). */
    char err[3000];
    int dir = dk_logdir_open(cwd, 0, "run the notebook from a folder of yours, or set "
                             "MLFLOW_TRACKING_URI to your tracking server", err, sizeof err);
    int db = dir >= 0 ? dk_logdir_private_file(dir, "mlflow.db", err, sizeof err) : -1;
    if (dir >= 0)
        close(dir);
    if (db < 0) {
        snprintf(note, notelen, "MLflow tracking is off: its store, mlflow.db, would be "
                                "in the notebook's folder %.1000s: %s", cwd, err);
        return NULL;
    }
    close(db);
    snprintf(store, sizeof store, "sqlite:///%s/mlflow.db", cwd);
    /* One worker: the server has one user, this kernel. MLflow's default of
     * 4 each import the server and open the store at their first request;
     * on 2 busy cores that doubled the time to answer (75 s against 35 s,
     * past DISTKERNEL_MLFLOW_START_TIMEOUT's 60 s) and the first run's
     * lookups outlasted their timeout, so the cell's first run went unrecorded. */
    const char *args[] = {"server", "--backend-store-uri", store, "--host", "127.0.0.1",
                          "--port", "{port}", "--workers", "1", NULL};
    dk_server_spec_t spec = {.program = "mlflow", .args = args, .name = "`mlflow server`",
                             .log_name = "mlflow-server.log", .health_path = "/health",
                             .start_timeout_s = start_timeout()};
    bool missing;
    dk_server_t *server = dk_server_start(&spec, &missing, err, sizeof err);
    if (!server && !missing)
        snprintf(note, notelen, "MLflow tracking is off: %s%s", err,
                 strstr(err, "did not answer within")
                     ? "; DISTKERNEL_MLFLOW_START_TIMEOUT=SECONDS gives it longer"
                     : "");
    __atomic_store_n(&self->server, server, __ATOMIC_SEQ_CST);
    return server ? dk_server_uri(server) : NULL;
}

void dk_tracking_stop_server(dk_tracking_t *self)
{
    /* Both the main and the control thread may get here on the way out. */
    dk_server_t *server = __atomic_exchange_n(&self->server, NULL, __ATOMIC_SEQ_CST);
    dk_server_destroy(&server);
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

/* The tracking URI for this run: MLFLOW_TRACKING_URI, or the server this
 * kernel starts. NULL when tracking is off for the run (NOTE may say why). */
static const char *tracking_uri(dk_tracking_t *self, char *note, size_t notelen)
{
    const char *uri = getenv("MLFLOW_TRACKING_URI");
    if (!uri || !*uri) {
        uri = start_server(self, note, notelen);
        if (!uri) {
            if (!note[0] && !self->told_off)
                snprintf(note, notelen,
                         "MLflow tracking is off: set MLFLOW_TRACKING_URI to your tracking server, "
                         "or install mlflow to have distkernel start one (tracking=False hides "
                         "this line)");
            self->told_off = true;
        }
        return uri;
    }
    if (strncasecmp(uri, "http://", 7) != 0 && strncasecmp(uri, "https://", 8) != 0) {
        char shown[1024];
        dk_mlflow_strip_uri(uri, shown, sizeof shown);
        snprintf(note, notelen,
                 "MLflow tracking is off for this run: MLFLOW_TRACKING_URI=%.200s is not an HTTP "
                 "tracking server (distkernel records runs through MLflow's REST API; point it "
                 "at `mlflow server`)",
                 shown);
        return NULL;
    }
    return uri;
}

/* The run's experiment id into OUT: MLFLOW_EXPERIMENT_ID unless the cell names
 * an experiment, else found or created by name (cached per URI and name).
 * Returns 0, or -1 with ERR. */
static int experiment_id(dk_tracking_t *self, dk_mlflow_t *c, const char *uri, const dk_tracking_request_t *req,
                         dk_tracked_run_t *out, char *err, size_t errlen)
{
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
        /* It goes into the run's link as the server's ids do: held to the same form. */
        if (!dk_mlflow_is_experiment_id(exp_id_env)) {
            snprintf(err, errlen, "MLFLOW_EXPERIMENT_ID is not an MLflow experiment id "
                                  "(decimal digits); set it to one, or unset it to name "
                                  "the experiment");
            return -1;
        }
        snprintf(out->experiment_id, sizeof out->experiment_id, "%s", exp_id_env);
        return 0;
    }
    char clean[1024], key[sizeof self->exp_key];
    dk_mlflow_strip_uri(uri, clean, sizeof clean);
    snprintf(key, sizeof key, "%s\n%s", clean, experiment);
    if (strcmp(key, self->exp_key) == 0) {
        snprintf(out->experiment_id, sizeof out->experiment_id, "%s", self->exp_id);
        return 0;
    }
    if (dk_mlflow_experiment(c, experiment, out->experiment_id, sizeof out->experiment_id, err,
                             errlen) < 0)
        return -1;
    snprintf(self->exp_key, sizeof self->exp_key, "%s", key);
    snprintf(self->exp_id, sizeof self->exp_id, "%s", out->experiment_id);
    return 0;
}

static const char *accelerator(const dk_tracking_request_t *req)
{
    return req->gpu ? (req->accelerator_model[0] ? req->accelerator_model : "gpu") : "cpu";
}

/* The run's name: the cell's run_name, or distributed-NxMODEL-STAMP. */
static void run_name(const dk_tracking_request_t *req, char *out, size_t outlen)
{
    if (req->opts->run_name[0]) {
        snprintf(out, outlen, "%s", req->opts->run_name);
        return;
    }
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char stamp[32];
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(out, outlen, "distributed-%dx%s-%s", req->world_size, accelerator(req), stamp);
}

/* The run's tags (new reference). */
static json_t *run_tags(const dk_tracking_request_t *req)
{
    char user[128];
    user_name(user, sizeof user);
    json_t *tags = json_pack("{s:s, s:s, s:s}", "mlflow.source.type", "NOTEBOOK", "mlflow.user",
                             user, "distkernel.kind", req->kind);
    const char *nb = getenv("JPY_SESSION_NAME");
    json_object_set_new(tags, "mlflow.source.name", json_string(nb && *nb ? nb : "distkernel"));
    if (req->parent_run_id && *req->parent_run_id)
        json_object_set_new(tags, "mlflow.parentRunId", json_string(req->parent_run_id));
    if (req->pool_id && *req->pool_id)
        json_object_set_new(tags, "distkernel.pool", json_string(req->pool_id));
    return tags;
}

/* The run's parameters (new reference). */
static json_t *run_params(const dk_tracking_request_t *req)
{
    const dk_dist_opts_t *o = req->opts;
    /* A list as written, cut where older MLflow servers cut a param (250
     * characters) rather than refuse the run's parameters for it. */
    char output[251];
    if (o->output == DK_OUTPUT_LIST && strlen(o->output_ranks) >= sizeof output)
        snprintf(output, sizeof output, "%.246s...", o->output_ranks);
    else
        snprintf(output, sizeof output, "%s", o->output == DK_OUTPUT_LIST ? o->output_ranks
                                              : o->output == DK_OUTPUT_RANK0 ? "rank0"
                                              : o->output == DK_OUTPUT_LOCAL0 ? "local0" : "all");
    json_t *params = json_pack("{s:i, s:s, s:s, s:i, s:s, s:s}", "world_size", req->world_size,
                               "device", req->device, "accelerator_type", accelerator(req),
                               "num_accelerators", req->gpu ? req->world_size : 0, "output",
                               output, "kind", req->kind);
    if (o->timeout_s > 0)
        json_object_set_new(params, "timeout", json_real(o->timeout_s));
    else
        json_object_set_new(params, "timeout", json_string("None"));
    if (o->num_processes)
        json_object_set_new(params, "num_processes", json_integer(o->num_processes));
    return params;
}

void dk_tracking_begin(dk_tracking_t *self, const dk_tracking_request_t *req, dk_tracked_run_t *out, char *note,
                       size_t notelen)
{
    memset(out, 0, sizeof *out);
    note[0] = '\0';
    if (!req->opts->tracking)
        return;
    const char *uri = tracking_uri(self, note, notelen);
    if (!uri)
        return;
    char err[1024];
    dk_mlflow_t *c = client_for(uri, err, sizeof err);
    if (!c) {
        snprintf(note, notelen, "MLflow tracking is off for this run: %s", err);
        return;
    }
    if (experiment_id(self, c, uri, req, out, err, sizeof err) < 0) {
        snprintf(note, notelen, "MLflow: could not record this run (%s); the run goes on", err);
        dk_mlflow_destroy(&c);
        return;
    }
    run_name(req, out->run_name, sizeof out->run_name);
    json_t *tags = run_tags(req);
    out->start_ms = dk_wall_ms();
    int rc = dk_mlflow_create_run(c, out->experiment_id, out->run_name, tags, out->start_ms,
                                  out->run_id, sizeof out->run_id, err, sizeof err);
    json_decref(tags);
    if (rc < 0) {
        snprintf(note, notelen, "MLflow: could not record this run (%s); the run goes on", err);
        dk_mlflow_destroy(&c);
        return;
    }
    json_t *params = run_params(req);
    if (dk_mlflow_log_params(c, out->run_id, params, err, sizeof err) < 0)
        snprintf(note, notelen, "MLflow: the run's parameters were not recorded (%s)", err);
    json_decref(params);
    dk_mlflow_destroy(&c);
    out->active = true;
    snprintf(out->tracking_uri, sizeof out->tracking_uri, "%s", uri);
    dk_mlflow_run_url(uri, out->experiment_id, out->run_id, out->url, sizeof out->url);
}

void dk_tracking_log_slurm(dk_tracked_run_t *run, const char *job_id, const char *nodes,
                           char *note, size_t notelen)
{
    note[0] = '\0';
    if (!run->active)
        return;
    char err[1024];
    json_t *params = json_pack("{s:s, s:s}", "slurm_job_id", job_id, "nodes", nodes);
    dk_mlflow_t *c = params ? client_for(run->tracking_uri, err, sizeof err) : NULL;
    if (!params)
        snprintf(err, sizeof err, "out of memory");
    if (!c || dk_mlflow_log_params(c, run->run_id, params, err, sizeof err) < 0)
        snprintf(note, notelen, "MLflow: the run's Slurm job and nodes were not recorded (%s)",
                 err);
    json_decref(params);
    dk_mlflow_destroy(&c);
}

void dk_tracking_tag(dk_tracked_run_t *run, json_t *tags, char *note, size_t notelen)
{
    note[0] = '\0';
    if (!run->active)
        return;
    char err[1024];
    dk_mlflow_t *c = client_for(run->tracking_uri, err, sizeof err);
    if (!c || dk_mlflow_set_tags(c, run->run_id, tags, err, sizeof err) < 0)
        snprintf(note, notelen, "MLflow: the run's attempt was not recorded (%s)", err);
    dk_mlflow_destroy(&c);
}

size_t dk_tracking_attach(dk_tracked_run_t *run, const dk_tracked_file_t *files, size_t n,
                          char *why, size_t whylen)
{
    why[0] = '\0';
    if (!run->active || n == 0)
        return 0;
    char artifact_uri[2048];
    dk_mlflow_t *c = client_for(run->tracking_uri, why, whylen);
    size_t stored = 0;
    if (c && dk_mlflow_artifact_uri(c, run->run_id, artifact_uri, sizeof artifact_uri, why,
                                    whylen) == 0)
        while (stored < n && dk_mlflow_put_artifact(c, artifact_uri, files[stored].path,
                                                    files[stored].data, files[stored].len, why,
                                                    whylen) == 0)
            stored++;
    dk_mlflow_destroy(&c);
    return stored;
}

void dk_tracking_end(dk_tracked_run_t *run, const char *status, char *note, size_t notelen)
{
    note[0] = '\0';
    if (!run->active)
        return;
    char err[1024];
    dk_mlflow_t *c = client_for(run->tracking_uri, err, sizeof err);
    if (!c || dk_mlflow_update_run(c, run->run_id, status, dk_wall_ms(), err, sizeof err) < 0)
        snprintf(note, notelen, "MLflow: the run's final status (%s) was not recorded (%s)",
                 status, err);
    dk_mlflow_destroy(&c);
}
