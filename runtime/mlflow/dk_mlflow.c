/*
 * dk_mlflow: MLflow's tracking REST API over libcurl. See dk_mlflow.h.
 *
 * One libcurl easy handle per client, so consecutive calls reuse the
 * connection (a local server answers in well under a millisecond; opening a
 * connection per call is most of the cost). Every call goes through
 * request(), which owns the three things that keep a bad server from hurting
 * a run:
 *   - a per-attempt timeout (CURLOPT_TIMEOUT_MS, connect included);
 *   - a bounded number of retries, only for what may pass on its own
 *     (connection errors, timeouts, 5xx, 429), with a short backoff;
 *   - a cap on the size of an answer.
 * So a call takes at most (retries + 1) * timeout plus the backoff.
 *
 * Retrying a POST that timed out may apply it twice (two runs created): MLflow's
 * own client takes the same risk, and a stray empty run is better than a
 * missing one.
 *
 * Credentials go to libcurl only (CURLOPT_USERNAME/PASSWORD, an Authorization
 * header, or the URI's user:password@ which libcurl reads itself). Messages
 * name the server by `shown`, the URI with its userinfo removed, and every
 * message is scrubbed of each secret before the caller sees it.
 *
 * The bodies, the error answers, the URI shown and the ids are text, built and
 * read without a server, in dk_mlflow_text.c.
 */
#include "dk_err.h"
#include "dk_mlflow.h"
#include "dk_io.h"
#include "dk_mlflow_text.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define API "/api/2.0/mlflow/"
#define MAX_ANSWER (4u << 20)       /* bytes; MLflow's answers here are a few KB */
#define PARAMS_PER_BATCH 100        /* MLflow's limit per log-batch call */

struct dk_mlflow_t {
    CURL *curl;
    struct curl_slist *headers;
    char *base;             /* the URI as given, no trailing '/': libcurl reads user:pw@ */
    char *shown;            /* the same without user:password@, for messages */
    char *secrets[3];       /* token, password, the URI's userinfo: scrubbed from messages */
    long timeout_ms;
    int retries;
    char curl_error[CURL_ERROR_SIZE];
    char *answer;           /* the body of the last answer, NUL-terminated */
    size_t answer_len;
    bool answer_too_big;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}


/* Replace every occurrence of SECRET in the NUL-terminated BUF (of capacity
 * CAP) by "***". */
static void scrub(char *buf, size_t cap, const char *secret)
{
    if (!buf || cap == 0 || !secret || !*secret || !strstr(buf, secret))
        return;
    size_t slen = strlen(secret), o = 0;
    char *out = malloc(cap);
    if (!out) {
        buf[0] = '\0';   /* better no message than one with a password */
        return;
    }
    for (const char *p = buf; *p && o + 1 < cap;) {
        if (strncmp(p, secret, slen) == 0) {
            for (const char *r = "***"; *r && o + 1 < cap; r++)
                out[o++] = *r;
            p += slen;
        } else {
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    memcpy(buf, out, o + 1);
    free(out);
}

/* ------------------------------------------------------------------------ */
/* The client                                                                */

static size_t on_answer(char *data, size_t size, size_t n, void *userdata)
{
    dk_mlflow_t *self = userdata;
    size_t len = size * n;
    if (self->answer_len + len > MAX_ANSWER) {
        self->answer_too_big = true;
        return 0;   /* CURLE_WRITE_ERROR */
    }
    char *grown = realloc(self->answer, self->answer_len + len + 1);
    if (!grown)
        return 0;
    self->answer = grown;
    memcpy(self->answer + self->answer_len, data, len);
    self->answer_len += len;
    self->answer[self->answer_len] = '\0';
    return len;
}

/* The request headers (with the bearer token, when that is the scheme) and the
 * secrets every message is scrubbed of: the token, the password, and the
 * password in the URI's userinfo (AUTHORITY .. AT). */
static void set_headers_and_secrets(dk_mlflow_t *self, const dk_mlflow_config_t *cfg,
                                    bool basic, const char *authority, const char *at)
{
    bool bearer = !basic && cfg->token && *cfg->token;
    self->headers = curl_slist_append(NULL, "Content-Type: application/json");
    self->headers = curl_slist_append(self->headers, "Accept: application/json");
    /* No "Expect: 100-continue" wait before a larger POST body: servers that
     * do not answer it cost a second per call. */
    self->headers = curl_slist_append(self->headers, "Expect:");
    if (bearer) {
        size_t n = strlen(cfg->token) + sizeof "Authorization: Bearer ";
        char *h = malloc(n);
        if (h) {
            snprintf(h, n, "Authorization: Bearer %s", cfg->token);
            self->headers = curl_slist_append(self->headers, h);
            free(h);
        }
        self->secrets[0] = strdup(cfg->token);
    }
    if (basic)
        self->secrets[1] = strdup(cfg->password);
    if (at) {
        const char *colon = memchr(authority, ':', (size_t) (at - authority));
        if (colon && at - colon > 1)
            self->secrets[2] = strndup(colon + 1, (size_t) (at - colon - 1));
    }
}

/* The curl handle's options: timeouts, protocols, answer buffer, auth, TLS. */
static void set_curl_options(dk_mlflow_t *self, const dk_mlflow_config_t *cfg, bool basic)
{
    CURL *c = self->curl;
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, self->timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, self->timeout_ms);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, self->curl_error);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_answer);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, self);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, self->headers);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "distkernel-mlflow/1");
    if (basic) {
        curl_easy_setopt(c, CURLOPT_HTTPAUTH, (long) CURLAUTH_BASIC);
        curl_easy_setopt(c, CURLOPT_USERNAME, cfg->username);
        curl_easy_setopt(c, CURLOPT_PASSWORD, cfg->password);
    }
    if (cfg->insecure_tls) {
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 0L);
        curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 0L);
    }
}

dk_mlflow_t *dk_mlflow_new(const dk_mlflow_config_t *cfg, char *err, size_t errlen)
{
    const char *uri = cfg ? cfg->tracking_uri : NULL;
    if (!uri || !*uri) {
        dk_set_err(err, errlen, "MLflow: no tracking URI (set MLFLOW_TRACKING_URI to the tracking "
                             "server, e.g. http://127.0.0.1:5000)");
        return NULL;
    }
    char *shown = mlflow_strip_uri(uri);
    const char *authority;
    bool http = strncasecmp(uri, "http://", 7) == 0 || strncasecmp(uri, "https://", 8) == 0;
    const char *at = mlflow_userinfo_at(uri, &authority);
    const char *host = at ? at + 1 : authority;
    if (!shown || !http || strcspn(host, "/?#") == 0) {
        dk_set_err(err, errlen,
                "MLflow: the tracking URI \"%s\" is not an http:// or https:// address of a "
                "tracking server (file and database stores are reached through one: "
                "mlflow server --backend-store-uri ...)",
                shown ? shown : "");
        free(shown);
        return NULL;
    }
    pthread_once(&curl_once, curl_init);
    dk_mlflow_t *self = calloc(1, sizeof *self);
    if (!self || curl_init_rc != CURLE_OK || !(self->curl = curl_easy_init())) {
        dk_set_err(err, errlen, "MLflow: could not start libcurl (out of memory?)");
        free(shown);
        free(self);
        return NULL;
    }
    self->shown = shown;
    self->base = strdup(uri);
    size_t baselen = strlen(self->base);
    while (baselen > 0 && self->base[baselen - 1] == '/')
        self->base[--baselen] = '\0';
    self->timeout_ms = (long) ((cfg->timeout_s > 0 ? cfg->timeout_s : 5.0) * 1000.0);
    if (self->timeout_ms < 1)
        self->timeout_ms = 1;
    self->retries = cfg->retries < 0 ? 2 : cfg->retries;

    /* MLflow's client: basic when a user and a password are set, else bearer. */
    bool basic = cfg->username && *cfg->username && cfg->password && *cfg->password;
    set_headers_and_secrets(self, cfg, basic, authority, at);
    set_curl_options(self, cfg, basic);
    if (!self->base || !self->headers) {
        dk_set_err(err, errlen, "MLflow: out of memory");
        dk_mlflow_destroy(&self);
        return NULL;
    }
    return self;
}

void dk_mlflow_destroy(dk_mlflow_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    dk_mlflow_t *self = *self_p;
    if (self->curl)
        curl_easy_cleanup(self->curl);
    curl_slist_free_all(self->headers);
    for (int i = 0; i < 3; i++)
        free(self->secrets[i]);
    free(self->base);
    free(self->shown);
    free(self->answer);
    free(self);
    *self_p = NULL;
}

/* Would another attempt of a call that ended with RC / HTTP STATUS help? */
static bool worth_retrying(CURLcode rc, long status)
{
    switch (rc) {
    case CURLE_OK:
        return status >= 500 || status == 429;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return true;
    default:
        return false;
    }
}

static void backoff(int attempt)
{
    long ms = attempt == 0 ? 100 : attempt == 1 ? 300 : 1000;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* ERR = "MLflow at <server>: DOING failed[ after N attempts]: <why>", scrubbed of
 * every secret. */
static void fail(dk_mlflow_t *self, char *err, size_t errlen, const char *doing, int attempts,
                 const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    char why[1024], tries[32] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    if (attempts > 1)
        snprintf(tries, sizeof tries, " after %d attempts", attempts);
    dk_set_err(err, errlen, "MLflow at %s: %s failed%s: %s", self->shown, doing, tries, why);
    for (int i = 0; i < 3; i++)
        scrub(err, errlen, self->secrets[i]);
}

/* Why an HTTP STATUS answer failed, from its body; CODE gets MLflow's error_code. */
static void http_failure(dk_mlflow_t *self, long status, char *code, size_t codelen, char *why,
                         size_t whylen)
{
    char msg[512];
    dk_mlflow_parse_error(self->answer, self->answer_len, code, codelen, msg, sizeof msg);
    char hint[300] = "";
    const char *location = NULL;
    if (status == 401 || status == 403) {
        snprintf(hint, sizeof hint, "; check MLFLOW_TRACKING_TOKEN or "
                                    "MLFLOW_TRACKING_USERNAME/PASSWORD");
    } else if (status == 404 && !*code) {
        snprintf(hint, sizeof hint, "; is this the address of an MLflow tracking server?");
    } else if (status >= 300 && status < 400
               && curl_easy_getinfo(self->curl, CURLINFO_REDIRECT_URL, &location) == CURLE_OK
               && location) {
        char *shown = mlflow_strip_uri(location);
        snprintf(hint, sizeof hint, "; the server redirects to %s: set the tracking URI to "
                                    "where MLflow is", shown ? shown : "elsewhere");
        free(shown);
    }
    snprintf(why, whylen, "HTTP %ld%s%s%s%s%s", status, *code ? " " : "", code,
             *msg ? ": " : "", msg, hint);
}

/* Call METHOD ("GET" or "POST") on API PATH (with QUERY, already encoded, or
 * NULL) sending BODY (POST). On a 2xx answer, returns 0 and *REPLY (new
 * reference, NULL for an empty answer). Otherwise -1, with CODE set to
 * MLflow's error_code ("" if none) and ERR saying what DOING met. */
static int perform(dk_mlflow_t *self, const char *method, const char *url, const void *payload,
                   size_t payload_len, long timeout_ms, json_t **reply, char *code,
                   size_t codelen, const char *doing, char *err, size_t errlen);

static int request(dk_mlflow_t *self, const char *method, const char *path, const char *query,
                   json_t *body, json_t **reply, char *code, size_t codelen, const char *doing,
                   char *err, size_t errlen)
{
    *reply = NULL;
    mlflow_copy_str(code, codelen, "");
    size_t urllen = strlen(self->base) + strlen(API) + strlen(path) + 2
                    + (query ? strlen(query) : 0);
    char *url = malloc(urllen);
    char *payload = body ? json_dumps(body, JSON_COMPACT) : NULL;
    if (!url || (body && !payload)) {
        fail(self, err, errlen, doing, 1, "out of memory");
        free(url);
        free(payload);
        return -1;
    }
    snprintf(url, urllen, "%s" API "%s%s%s", self->base, path, query ? "?" : "",
             query ? query : "");
    const char *sent = strcmp(method, "POST") == 0 ? (payload ? payload : "{}") : NULL;
    int rc = perform(self, method, url, sent, sent ? strlen(sent) : 0, self->timeout_ms, reply,
                     code, codelen, doing, err, errlen);
    free(payload);
    free(url);
    return rc;
}

/* METHOD ("GET", "POST" or "PUT", the last two with PAYLOAD_LEN bytes of
 * PAYLOAD) on URL, each attempt within TIMEOUT_MS; as request. */
static int perform(dk_mlflow_t *self, const char *method, const char *url, const void *payload,
                   size_t payload_len, long timeout_ms, json_t **reply, char *code,
                   size_t codelen, const char *doing, char *err, size_t errlen)
{
    *reply = NULL;
    mlflow_copy_str(code, codelen, "");
    CURL *c = self->curl;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    if (strcmp(method, "GET") != 0) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, payload);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) payload_len);
        if (strcmp(method, "PUT") == 0)
            curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
    } else {
        curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
    }

    CURLcode rc;
    long status;
    int attempts = 0;
    for (;;) {
        self->answer_len = 0;
        self->answer_too_big = false;
        self->curl_error[0] = '\0';
        rc = curl_easy_perform(c);
        attempts++;
        status = 0;
        if (rc == CURLE_OK)
            curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
        if (attempts > self->retries || !worth_retrying(rc, status))
            break;
        backoff(attempts - 1);
    }
    /* libcurl does not copy POSTFIELDS: unhook the body before its owner frees it. */
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, NULL);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, NULL);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, self->timeout_ms);

    if (rc != CURLE_OK) {
        if (self->answer_too_big)
            fail(self, err, errlen, doing, attempts, "the answer was larger than %u MiB",
                 MAX_ANSWER >> 20);
        else if (rc == CURLE_OPERATION_TIMEDOUT)
            fail(self, err, errlen, doing, attempts, "no answer within %.3g s",
                 (double) self->timeout_ms / 1000.0);
        else
            fail(self, err, errlen, doing, attempts, "%s",
                 self->curl_error[0] ? self->curl_error : curl_easy_strerror(rc));
        return -1;
    }
    if (status < 200 || status > 299) {
        char why[1024];
        http_failure(self, status, code, codelen, why, sizeof why);
        fail(self, err, errlen, doing, attempts, "%s", why);
        return -1;
    }
    if (self->answer_len == 0)
        return 0;
    *reply = json_loadb(self->answer, self->answer_len, 0, NULL);
    if (!*reply) {
        fail(self, err, errlen, doing, attempts, "the answer is not JSON; is this the address "
                                                 "of an MLflow tracking server?");
        return -1;
    }
    return 0;
}

/* Ids go into the run's link, into paths and into the ranks' environment:
 * one that is not what MLflow issues is the mark of a broken or hostile
 * server, and is refused rather than cleaned. */
#define NOT_AN_EXPERIMENT_ID "the server answered with an experiment id that is not MLflow's " \
                             "(decimal digits), refused; is this the address of an MLflow " \
                             "tracking server?"

/* Copy the id V (a string, or an integer as old servers wrote them) to OUT.
 * 0, or -1 when V is no id or does not fit. */
static int copy_id(json_t *v, char *out, size_t outlen)
{
    if (json_is_integer(v)) {
        int n = snprintf(out, outlen, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return n > 0 && (size_t) n < outlen ? 0 : -1;
    }
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= outlen)
        return -1;
    mlflow_copy_str(out, outlen, json_string_value(v));
    return 0;
}

/* Look NAME up: 1 found (id written), 0 absent, -1 error. */
static int lookup_experiment(dk_mlflow_t *self, const char *name, char *id, size_t idlen,
                             char *err, size_t errlen)
{
    char doing[300], code[64];
    snprintf(doing, sizeof doing, "looking up experiment \"%s\"", name);
    char *escaped = curl_easy_escape(self->curl, name, 0);
    size_t qlen = (escaped ? strlen(escaped) : 0) + sizeof "experiment_name=";
    char *query = escaped ? malloc(qlen) : NULL;
    if (!query) {
        curl_free(escaped);
        fail(self, err, errlen, doing, 1, "out of memory");
        return -1;
    }
    snprintf(query, qlen, "experiment_name=%s", escaped);
    curl_free(escaped);
    json_t *reply;
    int rc = request(self, "GET", "experiments/get-by-name", query, NULL, &reply, code,
                     sizeof code, doing, err, errlen);
    free(query);
    if (rc != 0)
        return strcmp(code, "RESOURCE_DOES_NOT_EXIST") == 0 ? 0 : -1;
    int found = 1;
    json_t *experiment = json_object_get(reply, "experiment");
    json_t *stage = json_object_get(experiment, "lifecycle_stage");
    if (copy_id(json_object_get(experiment, "experiment_id"), id, idlen) != 0) {
        fail(self, err, errlen, doing, 1, "the answer has no experiment id");
        found = -1;
    } else if (!dk_mlflow_is_experiment_id(id)) {
        fail(self, err, errlen, doing, 1, NOT_AN_EXPERIMENT_ID);
        id[0] = '\0';
        found = -1;
    } else if (json_is_string(stage) && strcmp(json_string_value(stage), "deleted") == 0) {
        fail(self, err, errlen, doing, 1, "the experiment (id %s) is deleted: restore it "
                                          "(mlflow experiments restore --experiment-id %s) or "
                                          "choose another name", id, id);
        found = -1;
    }
    json_decref(reply);
    return found;
}

int dk_mlflow_experiment(dk_mlflow_t *self, const char *name, char *id, size_t idlen, char *err,
                         size_t errlen)
{
    if (!self || !name || !*name || !id || idlen == 0) {
        dk_set_err(err, errlen, "MLflow: no experiment name given");
        return -1;
    }
    int found = lookup_experiment(self, name, id, idlen, err, errlen);
    if (found != 0)
        return found > 0 ? 0 : -1;

    char doing[300], code[64];
    snprintf(doing, sizeof doing, "creating experiment \"%s\"", name);
    json_t *body = json_pack("{s:s}", "name", name);
    json_t *reply;
    int rc = request(self, "POST", "experiments/create", NULL, body, &reply, code, sizeof code,
                     doing, err, errlen);
    json_decref(body);
    if (rc != 0) {
        /* Someone created it between our lookup and our create: use theirs. */
        if (strcmp(code, "RESOURCE_ALREADY_EXISTS") != 0)
            return -1;
        found = lookup_experiment(self, name, id, idlen, err, errlen);
        if (found == 0)
            fail(self, err, errlen, doing, 1, "the server says it both exists "
                                              "(RESOURCE_ALREADY_EXISTS) and does not "
                                              "(RESOURCE_DOES_NOT_EXIST)");
        return found > 0 ? 0 : -1;
    }
    rc = copy_id(json_object_get(reply, "experiment_id"), id, idlen);
    json_decref(reply);
    if (rc != 0) {
        fail(self, err, errlen, doing, 1, "the answer has no experiment id");
    } else if (!dk_mlflow_is_experiment_id(id)) {
        fail(self, err, errlen, doing, 1, NOT_AN_EXPERIMENT_ID);
        id[0] = '\0';
        rc = -1;
    }
    return rc;
}

int dk_mlflow_create_run(dk_mlflow_t *self, const char *experiment_id, const char *run_name,
                         json_t *tags, long long start_ms, char *run_id, size_t run_id_len,
                         char *err, size_t errlen)
{
    if (!self || !experiment_id || !run_id || run_id_len == 0) {
        dk_set_err(err, errlen, "MLflow: creating the run failed: no experiment given");
        return -1;
    }
    char doing[300], code[64];
    snprintf(doing, sizeof doing, "creating the run in experiment %s", experiment_id);
    json_t *body = dk_mlflow_body_create_run(experiment_id, run_name, tags, start_ms);
    if (!body) {
        fail(self, err, errlen, doing, 1, "out of memory");
        return -1;
    }
    json_t *reply;
    int rc = request(self, "POST", "runs/create", NULL, body, &reply, code, sizeof code, doing,
                     err, errlen);
    json_decref(body);
    if (rc != 0)
        return -1;
    json_t *info = json_object_get(json_object_get(reply, "run"), "info");
    rc = copy_id(json_object_get(info, "run_id"), run_id, run_id_len);
    if (rc != 0)    /* servers before MLflow 1.0 only wrote run_uuid */
        rc = copy_id(json_object_get(info, "run_uuid"), run_id, run_id_len);
    json_decref(reply);
    if (rc != 0) {
        fail(self, err, errlen, doing, 1, "the answer has no run id");
    } else if (!dk_mlflow_is_run_id(run_id)) {
        /* Not shown: it is the server's text, and may be anything. */
        fail(self, err, errlen, doing, 1, "the server answered with a run id that is not "
                                          "MLflow's (32 lowercase hex digits), refused; is "
                                          "this the address of an MLflow tracking server?");
        run_id[0] = '\0';
        rc = -1;
    }
    return rc;
}

/* PAIRS as FIELD ("params" or "tags") of RUN_ID, in log-batch calls of at
 * most PARAMS_PER_BATCH each; DOING names it in errors. */
static int log_batch(dk_mlflow_t *self, const char *run_id, const char *field, json_t *pairs,
                     const char *doing, char *err, size_t errlen)
{
    if (!self || !run_id) {
        dk_set_err(err, errlen, "MLflow: %s failed: no run given", doing);
        return -1;
    }
    size_t n = json_is_object(pairs) ? json_object_size(pairs) : 0;
    char code[64];
    for (size_t first = 0; first < n; first += PARAMS_PER_BATCH) {
        json_t *body = dk_mlflow_body_log_batch(run_id, field, pairs, first, PARAMS_PER_BATCH);
        if (!body) {
            fail(self, err, errlen, doing, 1, "out of memory");
            return -1;
        }
        json_t *reply;
        int rc = request(self, "POST", "runs/log-batch", NULL, body, &reply, code, sizeof code,
                         doing, err, errlen);
        json_decref(body);
        json_decref(reply);
        if (rc != 0)
            return -1;
    }
    return 0;
}

int dk_mlflow_log_params(dk_mlflow_t *self, const char *run_id, json_t *params, char *err,
                         size_t errlen)
{
    return log_batch(self, run_id, "params", params, "logging the run's parameters", err,
                     errlen);
}

int dk_mlflow_set_tags(dk_mlflow_t *self, const char *run_id, json_t *tags, char *err,
                       size_t errlen)
{
    return log_batch(self, run_id, "tags", tags, "setting the run's tags", err, errlen);
}

int dk_mlflow_update_run(dk_mlflow_t *self, const char *run_id, const char *status,
                         long long end_ms, char *err, size_t errlen)
{
    static const char *known[] = {"RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED"};
    bool ok = false;
    for (size_t i = 0; status && i < sizeof known / sizeof known[0]; i++)
        ok = ok || strcmp(status, known[i]) == 0;
    if (!self || !run_id || !ok) {
        dk_set_err(err, errlen, "MLflow: setting the run's status failed: \"%s\" is not one of "
                             "RUNNING, SCHEDULED, FINISHED, FAILED, KILLED",
                status ? status : "(none)");
        return -1;
    }
    char doing[64], code[64];
    snprintf(doing, sizeof doing, "setting the run's status to %s", status);
    json_t *body = dk_mlflow_body_update_run(run_id, status, end_ms);
    if (!body) {
        fail(self, err, errlen, doing, 1, "out of memory");
        return -1;
    }
    json_t *reply;
    int rc = request(self, "POST", "runs/update", NULL, body, &reply, code, sizeof code, doing,
                     err, errlen);
    json_decref(body);
    json_decref(reply);
    return rc;
}

int dk_mlflow_artifact_uri(dk_mlflow_t *self, const char *run_id, char *out, size_t outlen,
                           char *err, size_t errlen)
{
    char doing[200], code[64], query[80];
    snprintf(doing, sizeof doing, "looking up run %s", run_id ? run_id : "");
    if (!self || !run_id || !dk_mlflow_is_run_id(run_id)) {
        dk_set_err(err, errlen, "MLflow: %s failed: not a run id", doing);
        return -1;
    }
    snprintf(query, sizeof query, "run_id=%s", run_id);
    json_t *reply;
    if (request(self, "GET", "runs/get", query, NULL, &reply, code, sizeof code, doing, err,
                errlen) != 0)
        return -1;
    json_t *uri = json_object_get(json_object_get(json_object_get(reply, "run"), "info"),
                                  "artifact_uri");
    int rc = json_is_string(uri) && json_string_length(uri) < outlen ? 0 : -1;
    if (rc == 0)
        mlflow_copy_str(out, outlen, json_string_value(uri));
    else
        fail(self, err, errlen, doing, 1, "the answer has no artifact_uri");
    json_decref(reply);
    return rc;
}

/* Whether S is a path MLflow's artifact store takes as is: letters, digits
 * and "/._-", no "..", no empty segment at its start. */
static bool plain_path(const char *s)
{
    return *s && *s != '/' && !strstr(s, "..") &&
           strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-") ==
               strlen(s);
}

/* Write LEN bytes of DATA to FOLDER/PATH on this host, making PATH's folders. */
static int put_local(const char *folder, const char *path, const void *data, size_t len,
                     char *err, size_t errlen)
{
    size_t n = strlen(folder) + strlen(path) + 2;
    char *full = malloc(n);
    if (!full) {
        dk_set_err(err, errlen, "out of memory");
        return -1;
    }
    snprintf(full, n, "%s/%s", folder, path);
    for (char *p = full + strlen(folder) + 1; (p = strchr(p, '/')); p++) {
        *p = '\0';
        if (mkdir(full, 0755) != 0 && errno != EEXIST) {
            dk_set_err(err, errlen, "cannot make %s: %s", full, strerror(errno));
            free(full);
            return -1;
        }
        *p = '/';
    }
    int fd = open(full, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    int e = fd < 0 || dk_write_all(fd, data, len) != 0 ? errno : 0;
    if (fd >= 0 && close(fd) != 0 && !e)
        e = errno;      /* a file system that says only at close that it is full */
    int rc = e ? -1 : 0;
    if (e)
        dk_set_err(err, errlen, "cannot write %s: %s", full, strerror(e));
    free(full);
    return rc;
}

int dk_mlflow_put_artifact(dk_mlflow_t *self, const char *artifact_uri, const char *path,
                           const void *data, size_t len, char *err, size_t errlen)
{
    char doing[300], code[64];
    snprintf(doing, sizeof doing, "storing %s with the run", path ? path : "");
    if (!self || !artifact_uri || !path || !plain_path(path)) {
        dk_set_err(err, errlen, "MLflow: %s failed: not an artifact path", doing);
        return -1;
    }
    const char *proxied = NULL;
    if (strncmp(artifact_uri, "mlflow-artifacts:///", 20) == 0)
        proxied = artifact_uri + 20;
    else if (strncmp(artifact_uri, "mlflow-artifacts:/", 18) == 0 && artifact_uri[18] != '/')
        proxied = artifact_uri + 18;
    if (!proxied) {
        const char *local = strncmp(artifact_uri, "file://", 7) == 0 ? artifact_uri + 7
                            : artifact_uri[0] == '/'                  ? artifact_uri
                                                                      : NULL;
        if (local && local[0] == '/') {
            char why[600];
            if (put_local(local, path, data, len, why, sizeof why) == 0)
                return 0;
            fail(self, err, errlen, doing, 1, "%s", why);
            return -1;
        }
        fail(self, err, errlen, doing, 1, "the run's artifacts go to %.200s, a store distkernel "
                                          "does not write to (it writes through the server's "
                                          "mlflow-artifacts proxy, or to a local folder)",
             artifact_uri);
        return -1;
    }
    size_t plen = strlen(proxied);
    while (plen > 0 && proxied[plen - 1] == '/')
        plen--;
    char *where = strndup(proxied, plen);
    if (!where || !plain_path(where)) {
        fail(self, err, errlen, doing, 1, "the run's artifact location from the server is not "
                                          "a plain path, refused");
        free(where);
        return -1;
    }
    static const char ARTIFACTS[] = "/api/2.0/mlflow-artifacts/artifacts/";
    size_t urllen = strlen(self->base) + sizeof ARTIFACTS + plen + strlen(path) + 2;
    char *url = malloc(urllen);
    if (!url) {
        free(where);
        fail(self, err, errlen, doing, 1, "out of memory");
        return -1;
    }
    snprintf(url, urllen, "%s%s%s/%s", self->base, ARTIFACTS, where, path);
    free(where);
    /* A log of some MB goes to a server on the other side of a network: each
     * attempt gets its timeout plus a second per MB. */
    long timeout_ms = self->timeout_ms + (long) (len >> 20) * 1000;
    json_t *reply;
    int rc = perform(self, "PUT", url, len ? data : "", len, timeout_ms, &reply, code,
                     sizeof code, doing, err, errlen);
    json_decref(reply);
    free(url);
    return rc;
}
