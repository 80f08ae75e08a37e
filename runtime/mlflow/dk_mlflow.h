/*
 * dk_mlflow: a client for MLflow's tracking REST API (2.0), in C.
 *
 * Every distributed run is an MLflow run. Its user (the kernel's distributed
 * feature, distributed/dk_tracking.c) creates it through this client before the
 * ranks start (they log into it through MLFLOW_RUN_ID), and writes its final
 * status after every rank has exited, so that the true outcome wins over the
 * FINISHED a rank's MLflow client writes at exit.
 *
 * A tracking server that is down, slow or failing must never fail or stall a
 * run: every request has a bounded timeout (seconds), connection errors and 5xx
 * answers are retried a bounded number of times with a short backoff, and the
 * caller gets an error value it turns into one warning line.
 *
 * Credentials (bearer token, basic user and password, or user:password in the
 * URI) are sent, never written into an error message or a link.
 *
 * Endpoints used (all under /api/2.0/mlflow/, JSON bodies):
 *   GET  experiments/get-by-name?experiment_name=   RESOURCE_DOES_NOT_EXIST if absent
 *   POST experiments/create {name}                  RESOURCE_ALREADY_EXISTS on a race
 *   POST runs/create {experiment_id, run_name, start_time, tags:[{key,value}]}
 *   POST runs/log-batch {run_id, metrics, params:[{key,value}], tags}
 *   POST runs/update {run_id, status, end_time}
 * Errors come back as HTTP 4xx/5xx with {"error_code": "...", "message": "..."}.
 *
 * Not thread-safe: one client per thread (a libcurl easy handle inside).
 */
#ifndef DK_MLFLOW_H
#define DK_MLFLOW_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    const char *tracking_uri;   /* "http://host:port" (path prefix allowed); required */
    const char *token;          /* MLFLOW_TRACKING_TOKEN: bearer; NULL if none */
    const char *username;       /* MLFLOW_TRACKING_USERNAME / PASSWORD: basic; NULL if none */
    const char *password;
    bool insecure_tls;          /* MLFLOW_TRACKING_INSECURE_TLS: skip certificate checks */
    double timeout_s;           /* per attempt, connect included; <= 0: 5 */
    int retries;                /* extra attempts on connection errors and 5xx; < 0: 2 */
} dk_mlflow_config_t;

typedef struct dk_mlflow_t dk_mlflow_t;

/* A client for CFG (copied). NULL with a reason in ERR when the URI is not an
 * http(s) URI. */
dk_mlflow_t *dk_mlflow_new(const dk_mlflow_config_t *cfg, char *err, size_t errlen);
void dk_mlflow_destroy(dk_mlflow_t **self_p);

/* Whether ID is an experiment id as MLflow issues them: decimal digits (its
 * SQL store's autoincrement key, as a string; at most 19, an int64). */
bool dk_mlflow_is_experiment_id(const char *id);

/* Whether ID is a run id as MLflow issues them: uuid4().hex, 32 lowercase
 * hexadecimal digits. */
bool dk_mlflow_is_run_id(const char *id);

/* The id of experiment NAME, created if absent; a create that loses a race
 * (RESOURCE_ALREADY_EXISTS) looks the name up again. Returns 0, or -1 with ERR;
 * an id that is not MLflow's (dk_mlflow_is_experiment_id) is such an error,
 * since it goes into links and paths. */
int dk_mlflow_experiment(dk_mlflow_t *self, const char *name, char *id, size_t idlen, char *err,
                         size_t errlen);

/* Create a run in EXPERIMENT_ID named RUN_NAME with TAGS (a JSON object of string
 * values, borrowed; may be NULL), start time START_MS (ms since the epoch).
 * mlflow.runName is added to the tags. Writes the run id. 0, or -1 with ERR;
 * a run id that is not MLflow's (dk_mlflow_is_run_id) is refused as an error. */
int dk_mlflow_create_run(dk_mlflow_t *self, const char *experiment_id, const char *run_name,
                         json_t *tags, long long start_ms, char *run_id, size_t run_id_len,
                         char *err, size_t errlen);

/* Log PARAMS (a JSON object; values are turned into strings) in log-batch
 * calls of at most 100 params each. 0, or -1 with ERR. */
int dk_mlflow_log_params(dk_mlflow_t *self, const char *run_id, json_t *params, char *err,
                         size_t errlen);

/* Set TAGS (a JSON object; values are turned into strings) on the run: unlike
 * a parameter, a tag may be set again with another value. 0, or -1 with ERR. */
int dk_mlflow_set_tags(dk_mlflow_t *self, const char *run_id, json_t *tags, char *err,
                       size_t errlen);

/* Set the run's status ("FINISHED", "FAILED", "KILLED", "RUNNING") and end
 * time END_MS (0: none). 0, or -1 with ERR. */
int dk_mlflow_update_run(dk_mlflow_t *self, const char *run_id, const char *status,
                         long long end_ms, char *err, size_t errlen);

/* The artifact_uri of run RUN_ID (runs/get) into OUT. 0, or -1 with ERR. */
int dk_mlflow_artifact_uri(dk_mlflow_t *self, const char *run_id, char *out, size_t outlen,
                           char *err, size_t errlen);

/* Store LEN bytes of DATA as the artifact PATH ("logs/rank-0.log": letters,
 * digits and "/._-") of a run whose artifact_uri is ARTIFACT_URI:
 *   mlflow-artifacts:/P  through the server's artifact proxy, as MLflow's
 *                        client does: PUT /api/2.0/mlflow-artifacts/artifacts/P/PATH
 *   file:///F or /F      written to F/PATH on this host (the server's store
 *                        is a local folder)
 * Any other store (s3://, gs://, dbfs:/...) needs that store's client: -1,
 * with ERR saying so. Each attempt's timeout grows by a second per MB. */
int dk_mlflow_put_artifact(dk_mlflow_t *self, const char *artifact_uri, const char *path,
                           const void *data, size_t len, char *err, size_t errlen);

/* The run's page: "<uri>/#/experiments/<experiment_id>/runs/<run_id>", with any
 * user:password@ removed from the URI. */
void dk_mlflow_run_url(const char *tracking_uri, const char *experiment_id, const char *run_id,
                       char *out, size_t outlen);

/* URI as it may be shown: without the user:password@ of its authority (a
 * password may itself contain '@': the userinfo ends at the authority's last
 * '@'; an '@' in the path, query or fragment is kept) and without trailing '/'.
 * URIs without "://" are taken as starting with their authority. Writes into
 * OUT (always terminated, cut to OUTLEN). The one definition: links, messages
 * and cache keys all use it. */
void dk_mlflow_strip_uri(const char *uri, char *out, size_t outlen);

/* Whether URI is an http(s) tracking server on this host's loopback, which
 * ranks on other nodes reach only through dk_tunnel: host 127.0.0.1,
 * localhost or [::1] (as distkernel._rankjob takes them). Writes its numeric
 * "127.0.0.1:PORT" or "[::1]:PORT" (the scheme's port when none is given) to
 * OUT. */
bool dk_mlflow_loopback_addr(const char *uri, char *out, size_t outlen);

/* ---- the pieces above, exposed for tests ---- */

/* The JSON bodies the calls send (new references). */
json_t *dk_mlflow_body_create_run(const char *experiment_id, const char *run_name, json_t *tags,
                                  long long start_ms);
json_t *dk_mlflow_body_log_params(const char *run_id, json_t *params, size_t first, size_t count);
/* A log-batch body with PAIRS' members FIRST..FIRST+COUNT as FIELD ("params" or "tags"). */
json_t *dk_mlflow_body_log_batch(const char *run_id, const char *field, json_t *pairs,
                                 size_t first, size_t count);
json_t *dk_mlflow_body_update_run(const char *run_id, const char *status, long long end_ms);

/* Read an MLflow error body ({"error_code", "message"}) of LEN bytes: writes the
 * code (or "" when the body is not one) and a message. */
void dk_mlflow_parse_error(const char *body, size_t len, char *code, size_t codelen, char *msg,
                           size_t msglen);

#endif
