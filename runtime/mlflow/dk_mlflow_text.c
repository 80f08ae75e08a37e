/*
 * dk_mlflow_text: MLflow's REST API as text, with no server and no libcurl.
 *
 * The bodies the client sends (create-run, log-batch, update-run), the error
 * answers it reads, the URI it shows without its credentials, and the ids
 * it accepts: pure functions, tested on their own (tests/unit/test_mlflow.c).
 * The client that sends them is dk_mlflow.c.
 */
#include "dk_mlflow.h"
#include "dk_mlflow_text.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void mlflow_copy_str(char *out, size_t outlen, const char *s)
{
    if (out && outlen)
        snprintf(out, outlen, "%s", s ? s : "");
}

/* Where the userinfo of URI ends: the '@' inside its authority, or NULL. */
const char *mlflow_userinfo_at(const char *uri, const char **authority)
{
    const char *scheme_end = strstr(uri, "://");
    *authority = scheme_end ? scheme_end + 3 : uri;
    size_t authlen = strcspn(*authority, "/?#");
    const char *at = NULL;
    for (const char *p = *authority; p < *authority + authlen; p++)
        if (*p == '@')
            at = p;   /* the last one: '@' may appear unescaped in a password */
    return at;
}

/* URI without user:password@ and without trailing '/' (malloc'd). */
char *mlflow_strip_uri(const char *uri)
{
    const char *authority;
    const char *at = mlflow_userinfo_at(uri, &authority);
    size_t head = (size_t) (authority - uri);
    const char *rest = at ? at + 1 : authority;
    size_t restlen = strlen(rest);
    while (restlen > 0 && rest[restlen - 1] == '/')
        restlen--;
    char *out = malloc(head + restlen + 1);
    if (!out)
        return NULL;
    memcpy(out, uri, head);
    memcpy(out + head, rest, restlen);
    out[head + restlen] = '\0';
    return out;
}

void dk_mlflow_strip_uri(const char *uri, char *out, size_t outlen)
{
    if (!out || outlen == 0)
        return;
    char *shown = mlflow_strip_uri(uri ? uri : "");
    snprintf(out, outlen, "%s", shown ? shown : "(a URI: out of memory to show it)");
    free(shown);
}

bool dk_mlflow_loopback_addr(const char *uri, char *out, size_t outlen)
{
    bool https = uri && strncmp(uri, "https://", 8) == 0;
    if (!uri || !(https || strncmp(uri, "http://", 7) == 0))
        return false;
    const char *authority;
    const char *at = mlflow_userinfo_at(uri, &authority);
    const char *host = at ? at + 1 : authority;
    size_t len = strcspn(host, "/?#");
    const char *port = NULL;
    size_t hostlen = len;
    if (host[0] == '[') {
        const char *close = memchr(host, ']', len);
        if (!close)
            return false;
        hostlen = (size_t) (close - host) + 1;
        if (hostlen < len && host[hostlen] == ':')
            port = host + hostlen + 1;
        else if (hostlen != len)
            return false;
    } else {
        const char *colon = memchr(host, ':', len);
        if (colon) {
            hostlen = (size_t) (colon - host);
            port = colon + 1;
        }
    }
    long p = https ? 443 : 80;
    if (port) {
        size_t plen = (size_t) (host + len - port);
        if (plen == 0 || plen > 5 || strspn(port, "0123456789") < plen)
            return false;
        p = strtol(port, NULL, 10);
        if (p < 1 || p > 65535)
            return false;
    }
#define IS(name) (hostlen == sizeof name - 1 && strncasecmp(host, name, hostlen) == 0)
    const char *numeric = IS("127.0.0.1") || IS("localhost") ? "127.0.0.1"
                          : IS("[::1]")                      ? "[::1]"
                                                             : NULL;
#undef IS
    if (!numeric)
        return false;
    snprintf(out, outlen, "%s:%ld", numeric, p);
    return true;
}

/* The JSON string for a param or tag value, as MLflow's Python client would
 * write it (str(value)): numbers in their shortest form, True/False/None. */
static char *value_string(json_t *v)
{
    char buf[64];
    switch (json_typeof(v)) {
    case JSON_STRING:
        return strdup(json_string_value(v));
    case JSON_INTEGER:
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return strdup(buf);
    case JSON_REAL: {
        double d = json_real_value(v);
        snprintf(buf, sizeof buf, "%.15g", d);
        if (strtod(buf, NULL) != d)
            snprintf(buf, sizeof buf, "%.17g", d);
        if (isfinite(d) && !strpbrk(buf, ".e"))
            strncat(buf, ".0", sizeof buf - strlen(buf) - 1);
        return strdup(buf);
    }
    case JSON_TRUE:
        return strdup("True");
    case JSON_FALSE:
        return strdup("False");
    case JSON_NULL:
        return strdup("None");
    default:
        return json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    }
}

/* Append {key, value} to the array LIST, value turned into a string. */
static int append_pair(json_t *list, const char *key, json_t *value)
{
    char *s = value_string(value);
    if (!s)
        return -1;
    json_t *pair = json_pack("{s:s, s:s}", "key", key, "value", s);
    free(s);
    return pair ? json_array_append_new(list, pair) : -1;
}

/* ------------------------------------------------------------------------ */
/* Bodies and error answers (pure; tested on their own)                     */

json_t *dk_mlflow_body_create_run(const char *experiment_id, const char *run_name, json_t *tags,
                                  long long start_ms)
{
    json_t *list = json_array();
    json_t *body = json_object();
    if (!list || !body)
        goto fail;
    const char *key;
    json_t *value;
    if (json_is_object(tags))
        json_object_foreach(tags, key, value) {
            if (run_name && strcmp(key, "mlflow.runName") == 0)
                continue;   /* RUN_NAME wins: the server rejects two different names */
            if (append_pair(list, key, value) != 0)
                goto fail;
        }
    if (run_name && json_array_append_new(list, json_pack("{s:s, s:s}", "key", "mlflow.runName",
                                                          "value", run_name)) != 0)
        goto fail;
    if (json_object_set_new(body, "experiment_id", json_string(experiment_id)) != 0
        || (run_name && json_object_set_new(body, "run_name", json_string(run_name)) != 0)
        || json_object_set_new(body, "start_time", json_integer(start_ms)) != 0
        || json_object_set_new(body, "tags", list) != 0)
        goto fail_body;
    return body;
fail:
    json_decref(list);
fail_body:
    json_decref(body);
    return NULL;
}

json_t *dk_mlflow_body_log_params(const char *run_id, json_t *params, size_t first, size_t count)
{
    return dk_mlflow_body_log_batch(run_id, "params", params, first, count);
}

json_t *dk_mlflow_body_log_batch(const char *run_id, const char *field, json_t *params,
                                 size_t first, size_t count)
{
    bool tags = strcmp(field, "tags") == 0;
    json_t *list = json_array();
    json_t *body = json_pack("{s:s, s:[], s:[]}", "run_id", run_id, "metrics",
                             tags ? "params" : "tags");
    if (!list || !body)
        goto fail;
    size_t i = 0;
    const char *key;
    json_t *value;
    if (json_is_object(params))
        json_object_foreach(params, key, value) {
            if (i >= first && i - first < count && append_pair(list, key, value) != 0)
                goto fail;
            i++;
        }
    if (json_object_set_new(body, field, list) != 0) {
        json_decref(body);
        return NULL;
    }
    return body;
fail:
    json_decref(list);
    json_decref(body);
    return NULL;
}

json_t *dk_mlflow_body_update_run(const char *run_id, const char *status, long long end_ms)
{
    json_t *body = json_pack("{s:s, s:s}", "run_id", run_id, "status", status);
    if (body && end_ms > 0 && json_object_set_new(body, "end_time", json_integer(end_ms)) != 0) {
        json_decref(body);
        return NULL;
    }
    return body;
}

/* Copy at most LEN bytes of S into OUT as one printable line. */
static void one_line(char *out, size_t outlen, const char *s, size_t len)
{
    if (!out || outlen == 0)
        return;
    size_t o = 0;
    bool space = false;
    for (size_t i = 0; i < len && s[i] && o + 1 < outlen; i++) {
        unsigned char c = (unsigned char) s[i];
        if (isspace(c) || c < 0x20 || c == 0x7f) {
            space = o > 0;
            continue;
        }
        if (space && o + 2 < outlen)
            out[o++] = ' ';
        space = false;
        out[o++] = (char) c;
    }
    out[o] = '\0';
}

void dk_mlflow_parse_error(const char *body, size_t len, char *code, size_t codelen, char *msg,
                           size_t msglen)
{
    mlflow_copy_str(code, codelen, "");
    mlflow_copy_str(msg, msglen, "");
    if (!body || len == 0)
        return;
    json_t *root = json_loadb(body, len, 0, NULL);
    json_t *c = json_object_get(root, "error_code");
    json_t *m = json_object_get(root, "message");
    if (json_is_object(root) && (json_is_string(c) || json_is_string(m))) {
        if (json_is_string(c))
            one_line(code, codelen, json_string_value(c), json_string_length(c));
        if (json_is_string(m))
            one_line(msg, msglen, json_string_value(m), json_string_length(m));
    } else {
        /* Not MLflow's (a proxy's HTML page, a plain-text 502): its first words
         * are still the best hint there is. */
        one_line(msg, msglen < 201 ? msglen : 201, body, len);
    }
    json_decref(root);
}

void dk_mlflow_run_url(const char *tracking_uri, const char *experiment_id, const char *run_id,
                       char *out, size_t outlen)
{
    char *base = mlflow_strip_uri(tracking_uri ? tracking_uri : "");
    if (out && outlen)
        snprintf(out, outlen, "%s/#/experiments/%s/runs/%s", base ? base : "",
                 experiment_id ? experiment_id : "", run_id ? run_id : "");
    free(base);
}

bool dk_mlflow_is_experiment_id(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > 19)
        return false;
    for (size_t i = 0; i < n; i++)
        if (id[i] < '0' || id[i] > '9')
            return false;
    return true;
}

bool dk_mlflow_is_run_id(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n != 32)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= '0' && id[i] <= '9') || (id[i] >= 'a' && id[i] <= 'f')))
            return false;
    return true;
}
