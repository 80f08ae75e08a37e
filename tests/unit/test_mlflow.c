/*
 * The MLflow client (runtime/mlflow/dk_mlflow.h): the bodies it sends and the error
 * answers it reads on their own, then the calls against tests/mlflow_server.py,
 * a small tracking server that records what it receives and can be told to
 * require credentials, fail, lag or lose a create race.
 *
 * Each test runs in its own process (criterion), so the server of a test is a
 * plain global, started by the test with the flags it needs and stopped by the
 * suite's .fini.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dk_mlflow.h"

#ifndef MLFLOW_SERVER
#error "MLFLOW_SERVER (the path of tests/mlflow_server.py) must be defined"
#endif
#ifndef PYTHON3
#define PYTHON3 "/usr/bin/python3"
#endif

/* Slack on top of timeout * attempts + backoff for the timing tests: the
 * machine may be busy (sanitizers, parallel tests). */
#define SLACK_S 0.75

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* ------------------------------------------------------------------------ */
/* The test server                                                           */

static struct {
    pid_t pid;
    int port;
    char url[64];
} srv;

/* Start tests/mlflow_server.py with the extra flags given (NULL-terminated). */
static void server_start(const char *flag, ...)
{
    const char *argv[32] = {PYTHON3, MLFLOW_SERVER, "--port", "0"};
    int argc = 4;
    va_list ap;
    va_start(ap, flag);
    for (const char *a = flag; a && argc < 31; a = va_arg(ap, const char *))
        argv[argc++] = a;
    va_end(ap);
    argv[argc] = NULL;

    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    srv.pid = fork();
    cr_assert_neq(srv.pid, -1);
    if (srv.pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* never outlive the test */
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        execv(PYTHON3, (char **) argv);
        _exit(127);
    }
    close(fds[1]);
    char line[32] = "";
    size_t n = 0;
    struct pollfd p = {fds[0], POLLIN, 0};
    while (n + 1 < sizeof line && !memchr(line, '\n', n) && poll(&p, 1, 20000) == 1) {
        ssize_t got = read(fds[0], line + n, sizeof line - 1 - n);
        if (got <= 0)
            break;
        n += (size_t) got;
        line[n] = '\0';
    }
    close(fds[0]);
    srv.port = atoi(line);
    cr_assert_gt(srv.port, 0, "mlflow_server.py did not print its port (got \"%s\")", line);
    snprintf(srv.url, sizeof srv.url, "http://127.0.0.1:%d", srv.port);
}

static void server_stop(void)
{
    if (srv.pid > 0) {
        kill(srv.pid, SIGTERM);
        waitpid(srv.pid, NULL, 0);
        srv.pid = 0;
    }
}

static size_t collect(char *data, size_t size, size_t n, void *userdata)
{
    char **buf = userdata;
    size_t old = *buf ? strlen(*buf) : 0;
    *buf = realloc(*buf, old + size * n + 1);
    memcpy(*buf + old, data, size * n);
    (*buf)[old + size * n] = '\0';
    return size * n;
}

/* GET (BODY NULL) or POST the server's control PATH; its JSON answer. */
static json_t *server_call(const char *path, const char *body)
{
    char url[128], *answer = NULL;
    snprintf(url, sizeof url, "%s%s", srv.url, path);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &answer);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    cr_assert_eq(rc, CURLE_OK, "%s: %s", path, curl_easy_strerror(rc));
    json_t *root = json_loads(answer, 0, NULL);
    free(answer);
    cr_assert_not_null(root, "%s did not answer JSON", path);
    return root;
}

/* The recorded requests whose path ends with ENDPOINT (all when NULL); new ref. */
static json_t *requests_to(const char *endpoint)
{
    json_t *all = server_call("/_test/requests", NULL), *out = json_array();
    size_t i;
    json_t *r;
    json_array_foreach(all, i, r) {
        const char *path = json_string_value(json_object_get(r, "path"));
        size_t pl = strlen(path), el = endpoint ? strlen(endpoint) : 0;
        if (!endpoint || (pl >= el && strcmp(path + pl - el, endpoint) == 0))
            json_array_append(out, r);
    }
    json_decref(all);
    return out;
}

/* The server's record of run RUN_ID ({info, data, status_history}); new ref. */
static json_t *server_run(const char *run_id)
{
    json_t *state = server_call("/_test/state", NULL), *found = NULL;
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(state, "runs"), i, r) {
        json_t *id = json_object_get(json_object_get(r, "info"), "run_id");
        if (strcmp(json_string_value(id), run_id) == 0)
            found = json_incref(r);
    }
    json_decref(state);
    cr_assert_not_null(found, "the server has no run %s", run_id);
    return found;
}

/* The value of KEY in a [{key, value}] LIST, or NULL. */
static const char *kv_get(json_t *list, const char *key)
{
    size_t i;
    json_t *kv;
    json_array_foreach(list, i, kv) {
        if (strcmp(json_string_value(json_object_get(kv, "key")), key) == 0)
            return json_string_value(json_object_get(kv, "value"));
    }
    return NULL;
}

static const char *header_of(json_t *request, const char *name)
{
    return json_string_value(json_object_get(json_object_get(request, "headers"), name));
}

/* A client of URL (the test server when NULL) with a short timeout. */
static dk_mlflow_t *client(const char *url, dk_mlflow_config_t cfg)
{
    char err[512] = "";
    cfg.tracking_uri = url ? url : srv.url;
    if (cfg.timeout_s == 0)
        cfg.timeout_s = 5;
    dk_mlflow_t *c = dk_mlflow_new(&cfg, err, sizeof err);
    cr_assert_not_null(c, "dk_mlflow_new: %s", err);
    return c;
}

static void make_run(dk_mlflow_t *c, char *exp, char *run)
{
    char err[512] = "";
    cr_assert_eq(dk_mlflow_experiment(c, "exp", exp, 64, err, sizeof err), 0, "%s", err);
    cr_assert_eq(dk_mlflow_create_run(c, exp, "r", NULL, 1, run, 64, err, sizeof err), 0, "%s",
                 err);
}

/* A port nothing listens on: bound, so no one else takes it, but not listening,
 * so a connect is refused. */
static int closed_port(int *fd)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    *fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_eq(bind(*fd, (struct sockaddr *) &a, sizeof a), 0);
    cr_assert_eq(getsockname(*fd, (struct sockaddr *) &a, &len), 0);
    return ntohs(a.sin_port);
}

static void no_proxy(void)
{
    /* The client honours http_proxy, as MLflow's does; the test server is local. */
    unsetenv("http_proxy");
    unsetenv("HTTP_PROXY");
    unsetenv("https_proxy");
    unsetenv("HTTPS_PROXY");
    unsetenv("all_proxy");
    unsetenv("ALL_PROXY");
}

/* ------------------------------------------------------------------------ */
/* Request bodies                                                            */

Test(body, create_run_has_experiment_name_start_time_and_tags)
{
    json_t *tags = json_pack("{s:s, s:s, s:s}", "mlflow.source.type", "NOTEBOOK",
                             "mlflow.source.name", "/home/ann/train.ipynb", "mlflow.user", "ann");
    json_t *b = dk_mlflow_body_create_run("7", "cell-3", tags, 1700000000123LL);
    cr_assert_str_eq(json_string_value(json_object_get(b, "experiment_id")), "7");
    cr_assert_str_eq(json_string_value(json_object_get(b, "run_name")), "cell-3");
    cr_assert_eq(json_integer_value(json_object_get(b, "start_time")), 1700000000123LL);
    json_t *list = json_object_get(b, "tags");
    cr_assert_eq(json_array_size(list), 4);
    cr_assert_str_eq(kv_get(list, "mlflow.runName"), "cell-3");
    cr_assert_str_eq(kv_get(list, "mlflow.source.type"), "NOTEBOOK");
    cr_assert_str_eq(kv_get(list, "mlflow.source.name"), "/home/ann/train.ipynb");
    cr_assert_str_eq(kv_get(list, "mlflow.user"), "ann");
    json_decref(b);
    json_decref(tags);
}

Test(body, create_run_name_replaces_a_runName_tag)
{
    json_t *tags = json_pack("{s:s}", "mlflow.runName", "old");
    json_t *b = dk_mlflow_body_create_run("1", "new", tags, 5);
    json_t *list = json_object_get(b, "tags");
    cr_assert_eq(json_array_size(list), 1);
    cr_assert_str_eq(kv_get(list, "mlflow.runName"), "new");
    json_decref(b);
    json_decref(tags);
}

Test(body, create_run_without_tags_still_names_the_run)
{
    json_t *b = dk_mlflow_body_create_run("1", "solo", NULL, 5);
    cr_assert_eq(json_array_size(json_object_get(b, "tags")), 1);
    cr_assert_str_eq(kv_get(json_object_get(b, "tags"), "mlflow.runName"), "solo");
    json_decref(b);
}

Test(body, create_run_tag_values_become_strings)
{
    json_t *tags = json_pack("{s:i}", "world_size", 4);
    json_t *b = dk_mlflow_body_create_run("1", "r", tags, 5);
    cr_assert_str_eq(kv_get(json_object_get(b, "tags"), "world_size"), "4");
    json_decref(b);
    json_decref(tags);
}

Test(body, log_params_has_run_id_params_and_empty_metrics_and_tags)
{
    json_t *params = json_pack("{s:s}", "accelerator_type", "H100");
    json_t *b = dk_mlflow_body_log_params("abc", params, 0, 100);
    cr_assert_str_eq(json_string_value(json_object_get(b, "run_id")), "abc");
    cr_assert_eq(json_array_size(json_object_get(b, "params")), 1);
    cr_assert_str_eq(kv_get(json_object_get(b, "params"), "accelerator_type"), "H100");
    cr_assert(json_is_array(json_object_get(b, "metrics")));
    cr_assert_eq(json_array_size(json_object_get(b, "metrics")), 0);
    cr_assert_eq(json_array_size(json_object_get(b, "tags")), 0);
    json_decref(b);
    json_decref(params);
}

Test(body, log_batch_of_tags_leaves_the_params_empty)
{
    json_t *tags = json_pack("{s:s, s:s}", "distkernel.attempt", "2 of 3", "distkernel.attempt.1",
                             "ValueError: [rank 1] boom");
    json_t *b = dk_mlflow_body_log_batch("r", "tags", tags, 0, 100);
    cr_assert_not_null(b);
    cr_assert_eq(json_array_size(json_object_get(b, "params")), 0);
    cr_assert_eq(json_array_size(json_object_get(b, "metrics")), 0);
    cr_assert_eq(json_array_size(json_object_get(b, "tags")), 2);
    cr_assert_str_eq(kv_get(json_object_get(b, "tags"), "distkernel.attempt"), "2 of 3");
    json_decref(b);
    json_decref(tags);
}

Test(body, log_params_values_are_written_as_python_would)
{
    json_t *params = json_pack("{s:i, s:f, s:f, s:b, s:b, s:n, s:s, s:[i,i]}", "world_size", 8,
                               "ratio", 0.1, "lr", 100.0, "flag", 1, "off", 0, "none",
                               "name", "x y", "list", 1, 2);
    json_t *b = dk_mlflow_body_log_params("r", params, 0, 100);
    json_t *list = json_object_get(b, "params");
    cr_assert_str_eq(kv_get(list, "world_size"), "8");
    cr_assert_str_eq(kv_get(list, "ratio"), "0.1");
    cr_assert_str_eq(kv_get(list, "lr"), "100.0");
    cr_assert_str_eq(kv_get(list, "flag"), "True");
    cr_assert_str_eq(kv_get(list, "off"), "False");
    cr_assert_str_eq(kv_get(list, "none"), "None");
    cr_assert_str_eq(kv_get(list, "name"), "x y");
    cr_assert_str_eq(kv_get(list, "list"), "[1,2]");
    json_decref(b);
    json_decref(params);
}

Test(body, log_params_250_split_100_100_50)
{
    json_t *params = json_object();
    char key[16];
    for (int i = 0; i < 250; i++) {
        snprintf(key, sizeof key, "p%03d", i);
        json_object_set_new(params, key, json_integer(i));
    }
    size_t want[] = {100, 100, 50, 0};
    for (int batch = 0; batch < 4; batch++) {
        json_t *b = dk_mlflow_body_log_params("r", params, (size_t) batch * 100, 100);
        json_t *list = json_object_get(b, "params");
        cr_assert_eq(json_array_size(list), want[batch], "batch %d has %zu params", batch,
                     json_array_size(list));
        if (want[batch]) {
            snprintf(key, sizeof key, "p%03d", batch * 100);
            cr_assert_str_eq(json_string_value(json_object_get(json_array_get(list, 0), "key")),
                             key);
        }
        json_decref(b);
    }
    json_decref(params);
}

Test(body, update_run_has_status_and_end_time)
{
    json_t *b = dk_mlflow_body_update_run("abc", "FAILED", 1700000000999LL);
    cr_assert_str_eq(json_string_value(json_object_get(b, "run_id")), "abc");
    cr_assert_str_eq(json_string_value(json_object_get(b, "status")), "FAILED");
    cr_assert_eq(json_integer_value(json_object_get(b, "end_time")), 1700000000999LL);
    json_decref(b);
}

Test(body, update_run_without_end_time_leaves_it_out)
{
    json_t *b = dk_mlflow_body_update_run("abc", "RUNNING", 0);
    cr_assert_null(json_object_get(b, "end_time"));
    json_decref(b);
}

/* ------------------------------------------------------------------------ */
/* Error answers                                                             */

static char code[64], msg[256];

static void parse(const char *body)
{
    memset(code, 'x', sizeof code);
    memset(msg, 'x', sizeof msg);
    dk_mlflow_parse_error(body, body ? strlen(body) : 0, code, sizeof code, msg, sizeof msg);
}

Test(error_body, mlflow_error_gives_code_and_message)
{
    parse("{\"error_code\": \"RESOURCE_DOES_NOT_EXIST\", \"message\": \"No run abc\"}");
    cr_assert_str_eq(code, "RESOURCE_DOES_NOT_EXIST");
    cr_assert_str_eq(msg, "No run abc");
}

Test(error_body, missing_message_gives_code_only)
{
    parse("{\"error_code\": \"INTERNAL_ERROR\"}");
    cr_assert_str_eq(code, "INTERNAL_ERROR");
    cr_assert_str_eq(msg, "");
}

Test(error_body, missing_code_gives_message_only)
{
    parse("{\"message\": \"bad\"}");
    cr_assert_str_eq(code, "");
    cr_assert_str_eq(msg, "bad");
}

Test(error_body, json_without_either_field_is_not_an_mlflow_error)
{
    parse("{\"detail\": \"nope\"}");
    cr_assert_str_eq(code, "");
    cr_assert_str_eq(msg, "{\"detail\": \"nope\"}");
}

Test(error_body, not_json_gives_its_first_words_on_one_line)
{
    parse("<html>\n<title>502 Bad Gateway</title>\r\n</html>\n");
    cr_assert_str_eq(code, "");
    cr_assert_str_eq(msg, "<html> <title>502 Bad Gateway</title> </html>");
}

Test(error_body, empty_body_gives_nothing)
{
    parse("");
    cr_assert_str_eq(code, "");
    cr_assert_str_eq(msg, "");
    parse(NULL);
    cr_assert_str_eq(code, "");
}

Test(error_body, long_message_is_cut_to_the_buffer)
{
    char body[2048];
    snprintf(body, sizeof body, "{\"error_code\": \"E\", \"message\": \"%01500d\"}", 0);
    parse(body);
    cr_assert_eq(strlen(msg), sizeof msg - 1);
}

Test(error_body, only_len_bytes_are_read)
{
    const char *body = "{\"error_code\": \"A\"}garbage";
    dk_mlflow_parse_error(body, 19, code, sizeof code, msg, sizeof msg);
    cr_assert_str_eq(code, "A");
}

Test(error_body, multiline_message_becomes_one_line)
{
    parse("{\"error_code\": \"E\", \"message\": \"line one\\nline two\\ttab\"}");
    cr_assert_str_eq(msg, "line one line two tab");
}

/* ------------------------------------------------------------------------ */
/* Run links                                                                 */

static const char *link_of(const char *uri)
{
    static char out[256];
    dk_mlflow_run_url(uri, "12", "0123456789abcdef0123456789abcdef", out, sizeof out);
    return out;
}

#define RUN "/#/experiments/12/runs/0123456789abcdef0123456789abcdef"

Test(run_url, plain_uri)
{
    cr_assert_str_eq(link_of("http://127.0.0.1:5000"), "http://127.0.0.1:5000" RUN);
}

Test(run_url, trailing_slashes_are_dropped)
{
    cr_assert_str_eq(link_of("http://127.0.0.1:5000/"), "http://127.0.0.1:5000" RUN);
    cr_assert_str_eq(link_of("http://127.0.0.1:5000//"), "http://127.0.0.1:5000" RUN);
}

Test(run_url, path_prefix_is_kept)
{
    cr_assert_str_eq(link_of("https://example.com/mlflow"), "https://example.com/mlflow" RUN);
    cr_assert_str_eq(link_of("https://example.com/mlflow/"), "https://example.com/mlflow" RUN);
}

Test(run_url, credentials_are_removed)
{
    cr_assert_str_eq(link_of("https://ann:s3cret@example.com:8443/ml"),
                     "https://example.com:8443/ml" RUN);
    cr_assert_str_eq(link_of("http://ann@example.com"), "http://example.com" RUN);
    cr_assert_str_eq(link_of("http://ann:p@ss@example.com/"), "http://example.com" RUN);
}

Test(run_url, at_sign_in_the_path_is_not_userinfo)
{
    cr_assert_str_eq(link_of("http://example.com/team@x"), "http://example.com/team@x" RUN);
}

static const char *shown(const char *uri)
{
    static char out[256];
    dk_mlflow_strip_uri(uri, out, sizeof out);
    return out;
}

Test(strip_uri, a_password_with_at_signs_is_removed_whole)
{
    cr_assert_str_eq(shown("https://ann:p@ss@w0rd@example.com:8443/ml/"),
                     "https://example.com:8443/ml");
    cr_assert_str_eq(shown("http://ann:@@@example.com"), "http://example.com");
}

Test(strip_uri, a_uri_without_credentials_is_kept_but_its_trailing_slash)
{
    cr_assert_str_eq(shown("http://127.0.0.1:5000"), "http://127.0.0.1:5000");
    cr_assert_str_eq(shown("https://example.com/mlflow/"), "https://example.com/mlflow");
    cr_assert_str_eq(shown("databricks"), "databricks");
}

Test(strip_uri, only_the_authority_loses_userinfo)
{
    cr_assert_str_eq(shown("http://example.com/team@x"), "http://example.com/team@x");
    cr_assert_str_eq(shown("http://example.com?who=a@b"), "http://example.com?who=a@b");
    cr_assert_str_eq(shown("http://u:p@example.com/a@b"), "http://example.com/a@b");
    cr_assert_str_eq(shown("databricks://tok:en@profile"), "databricks://profile");
}

Test(strip_uri, a_short_buffer_is_terminated)
{
    char out[8];
    dk_mlflow_strip_uri("http://ann:pw@example.com", out, sizeof out);
    cr_assert_str_eq(out, "http://");
}

Test(run_url, short_buffer_is_terminated)
{
    char out[10];
    dk_mlflow_run_url("http://127.0.0.1:5000", "1", "abc", out, sizeof out);
    cr_assert_str_eq(out, "http://12");
}

/* ------------------------------------------------------------------------ */
/* Creating a client                                                         */

Test(client, needs_an_http_uri)
{
    const char *bad[] = {"", "file:///tmp/mlruns", "sqlite:///mlflow.db", "databricks",
                         "http://", "ftp://ann:s3cret@host/"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[512] = "";
        dk_mlflow_config_t cfg = {.tracking_uri = bad[i]};
        cr_assert_null(dk_mlflow_new(&cfg, err, sizeof err), "accepted \"%s\"", bad[i]);
        cr_assert(strstr(err, "MLflow") != NULL, "%s", err);
        cr_assert_null(strstr(err, "s3cret"), "%s", err);
    }
    char err[512] = "";
    dk_mlflow_config_t none = {0};
    cr_assert_null(dk_mlflow_new(&none, err, sizeof err));
    cr_assert(strstr(err, "MLFLOW_TRACKING_URI") != NULL, "%s", err);
}

Test(client, takes_http_and_https_and_destroy_clears_the_pointer)
{
    const char *good[] = {"http://127.0.0.1:5000", "HTTPS://mlflow.example.com/prefix/"};
    for (size_t i = 0; i < 2; i++) {
        dk_mlflow_config_t cfg = {.tracking_uri = good[i], .token = "t"};
        dk_mlflow_t *c = dk_mlflow_new(&cfg, NULL, 0);
        cr_assert_not_null(c, "%s", good[i]);
        dk_mlflow_destroy(&c);
        cr_assert_null(c);
    }
    dk_mlflow_destroy(NULL);
}

Test(client, unknown_status_is_refused_without_a_request)
{
    char err[256];
    dk_mlflow_config_t cfg = {.tracking_uri = "http://127.0.0.1:9"};
    dk_mlflow_t *c = dk_mlflow_new(&cfg, NULL, 0);
    cr_assert_eq(dk_mlflow_update_run(c, "abc", "DONE", 0, err, sizeof err), -1);
    cr_assert(strstr(err, "\"DONE\"") != NULL, "%s", err);
    dk_mlflow_destroy(&c);
}

/* ------------------------------------------------------------------------ */
/* Against the test server                                                   */

TestSuite(server, .init = no_proxy, .fini = server_stop, .timeout = 60);

Test(server, experiment_is_created_once_then_reused)
{
    server_start(NULL);
    char id1[64], id2[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_experiment(c, "distkernel", id1, sizeof id1, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(dk_mlflow_experiment(c, "distkernel", id2, sizeof id2, err, sizeof err), 0,
                 "%s", err);
    dk_mlflow_destroy(&c);
    cr_assert_str_eq(id1, id2);
    cr_assert_str_neq(id1, "0");    /* not the Default experiment */
    json_t *creates = requests_to("experiments/create");
    json_t *lookups = requests_to("experiments/get-by-name");
    cr_assert_eq(json_array_size(creates), 1);
    cr_assert_eq(json_array_size(lookups), 2, "absent, then found");
    json_decref(creates);
    json_decref(lookups);
}

Test(server, experiment_name_is_url_encoded)
{
    server_start(NULL);
    const char *name = "team a/ü&x=1+2#3";
    char id[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_experiment(c, name, id, sizeof id, err, sizeof err), 0, "%s", err);
    dk_mlflow_destroy(&c);
    json_t *lookups = requests_to("experiments/get-by-name");
    json_t *q = json_object_get(json_array_get(lookups, 0), "query");
    cr_assert_str_eq(json_string_value(json_object_get(q, "experiment_name")), name);
    json_decref(lookups);
    json_t *creates = requests_to("experiments/create");
    json_t *body = json_object_get(json_array_get(creates, 0), "body");
    cr_assert_str_eq(json_string_value(json_object_get(body, "name")), name);
    json_decref(creates);
}

Test(server, experiment_created_concurrently_is_looked_up_again)
{
    /* --race: the lookup says absent while "another client" creates it, so our
     * create meets RESOURCE_ALREADY_EXISTS. */
    server_start("--race", "1", NULL);
    char id[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_experiment(c, "raced", id, sizeof id, err, sizeof err), 0, "%s", err);
    dk_mlflow_destroy(&c);
    cr_assert_str_eq(id, "1");
    json_t *all = requests_to(NULL);
    cr_assert_eq(json_array_size(all), 3);
    int want[] = {404, 400, 200};
    const char *paths[] = {"get-by-name", "create", "get-by-name"};
    for (size_t i = 0; i < 3; i++) {
        json_t *r = json_array_get(all, i);
        cr_assert_eq(json_integer_value(json_object_get(r, "status")), want[i]);
        cr_assert(strstr(json_string_value(json_object_get(r, "path")), paths[i]) != NULL);
    }
    json_decref(all);
}

Test(server, create_run_returns_a_32_hex_id_and_stores_tags)
{
    server_start(NULL);
    char exp[64], run[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_experiment(c, "e", exp, sizeof exp, err, sizeof err), 0, "%s", err);
    json_t *tags = json_pack("{s:s, s:s}", "mlflow.source.type", "NOTEBOOK", "mlflow.user",
                             "ann");
    cr_assert_eq(dk_mlflow_create_run(c, exp, "cell-1", tags, 1700000000123LL, run, sizeof run,
                                      err, sizeof err), 0, "%s", err);
    json_decref(tags);
    dk_mlflow_destroy(&c);
    cr_assert_eq(strlen(run), 32);
    for (int i = 0; i < 32; i++)
        cr_assert(isxdigit((unsigned char) run[i]));
    json_t *r = server_run(run);
    json_t *info = json_object_get(r, "info"), *stored = json_object_get(json_object_get(r,
                                                                                       "data"),
                                                                        "tags");
    cr_assert_str_eq(json_string_value(json_object_get(info, "status")), "RUNNING");
    cr_assert_str_eq(json_string_value(json_object_get(info, "experiment_id")), exp);
    cr_assert_str_eq(json_string_value(json_object_get(info, "run_name")), "cell-1");
    cr_assert_eq(json_integer_value(json_object_get(info, "start_time")), 1700000000123LL);
    cr_assert_str_eq(kv_get(stored, "mlflow.runName"), "cell-1");
    cr_assert_str_eq(kv_get(stored, "mlflow.source.type"), "NOTEBOOK");
    cr_assert_str_eq(kv_get(stored, "mlflow.user"), "ann");
    json_decref(r);
}

Test(server, create_run_in_a_missing_experiment_fails_at_once)
{
    server_start(NULL);
    char run[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_create_run(c, "999", "r", NULL, 1, run, sizeof run, err, sizeof err),
                 -1);
    dk_mlflow_destroy(&c);
    cr_assert(strstr(err, "HTTP 404 RESOURCE_DOES_NOT_EXIST") != NULL, "%s", err);
    cr_assert(strstr(err, srv.url) != NULL, "names the server: %s", err);
    json_t *creates = requests_to("runs/create");
    cr_assert_eq(json_array_size(creates), 1, "a 4xx is not retried");
    json_decref(creates);
}

Test(server, params_are_logged)
{
    server_start(NULL);
    char exp[64], run[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    make_run(c, exp, run);
    json_t *params = json_pack("{s:i, s:s, s:i}", "world_size", 4, "accelerator_type", "H100",
                               "accelerator_count", 8);
    cr_assert_eq(dk_mlflow_log_params(c, run, params, err, sizeof err), 0, "%s", err);
    json_decref(params);
    dk_mlflow_destroy(&c);
    json_t *r = server_run(run);
    json_t *stored = json_object_get(json_object_get(r, "data"), "params");
    cr_assert_eq(json_array_size(stored), 3);
    cr_assert_str_eq(kv_get(stored, "world_size"), "4");
    cr_assert_str_eq(kv_get(stored, "accelerator_type"), "H100");
    json_decref(r);
    json_t *batches = requests_to("runs/log-batch");
    cr_assert_eq(json_array_size(batches), 1, "one batch");
    json_decref(batches);
}

Test(server, params_250_take_three_batches_of_100_100_50)
{
    server_start(NULL);
    char exp[64], run[64], err[512] = "", key[16];
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    make_run(c, exp, run);
    json_t *params = json_object();
    for (int i = 0; i < 250; i++) {
        snprintf(key, sizeof key, "p%03d", i);
        json_object_set_new(params, key, json_integer(i));
    }
    cr_assert_eq(dk_mlflow_log_params(c, run, params, err, sizeof err), 0, "%s", err);
    json_decref(params);
    dk_mlflow_destroy(&c);
    json_t *batches = requests_to("runs/log-batch");
    cr_assert_eq(json_array_size(batches), 3);
    size_t want[] = {100, 100, 50};
    for (size_t i = 0; i < 3; i++) {
        json_t *body = json_object_get(json_array_get(batches, i), "body");
        cr_assert_eq(json_array_size(json_object_get(body, "params")), want[i]);
    }
    json_decref(batches);
    json_t *r = server_run(run);
    cr_assert_eq(json_array_size(json_object_get(json_object_get(r, "data"), "params")), 250);
    json_decref(r);
}

Test(server, no_params_send_nothing)
{
    server_start(NULL);
    char err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    json_t *params = json_object();
    cr_assert_eq(dk_mlflow_log_params(c, "abc", params, err, sizeof err), 0, "%s", err);
    json_decref(params);
    dk_mlflow_destroy(&c);
    json_t *all = requests_to(NULL);
    cr_assert_eq(json_array_size(all), 0);
    json_decref(all);
}

Test(server, update_writes_status_and_end_time)
{
    server_start(NULL);
    char exp[64], run[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    make_run(c, exp, run);
    cr_assert_eq(dk_mlflow_update_run(c, run, "FINISHED", 0, err, sizeof err), 0, "%s", err);
    cr_assert_eq(dk_mlflow_update_run(c, run, "KILLED", 1700000000999LL, err, sizeof err), 0,
                 "%s", err);
    dk_mlflow_destroy(&c);
    json_t *r = server_run(run);
    json_t *info = json_object_get(r, "info");
    cr_assert_str_eq(json_string_value(json_object_get(info, "status")), "KILLED");
    cr_assert_eq(json_integer_value(json_object_get(info, "end_time")), 1700000000999LL);
    json_t *history = json_object_get(r, "status_history");
    cr_assert_eq(json_array_size(history), 3, "RUNNING, FINISHED, KILLED");
    json_decref(r);
}

Test(server, update_of_a_missing_run_fails_with_the_server_message)
{
    server_start(NULL);
    char err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_update_run(c, "0123", "FAILED", 5, err, sizeof err), -1);
    dk_mlflow_destroy(&c);
    cr_assert(strstr(err, "setting the run's status to FAILED") != NULL, "%s", err);
    cr_assert(strstr(err, "RESOURCE_DOES_NOT_EXIST: Run with id=0123 not found") != NULL, "%s",
              err);
}

Test(server, bearer_token_is_sent)
{
    server_start("--token", "t0k-SECRET", NULL);
    char exp[64], run[64];
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){.token = "t0k-SECRET"});
    make_run(c, exp, run);
    dk_mlflow_destroy(&c);
    json_t *all = requests_to(NULL);
    cr_assert_geq(json_array_size(all), 3);
    size_t i;
    json_t *r;
    json_array_foreach(all, i, r) {
        cr_assert_str_eq(header_of(r, "authorization"), "Bearer t0k-SECRET");
        cr_assert_neq(json_integer_value(json_object_get(r, "status")), 401);
    }
    json_decref(all);
}

Test(server, basic_auth_is_sent)
{
    server_start("--basic", "ann:pa55word", NULL);
    char exp[64], run[64];
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){.username = "ann",
                                                       .password = "pa55word",
                                                       .token = "ignored"});
    make_run(c, exp, run);
    dk_mlflow_destroy(&c);
    json_t *all = requests_to(NULL);
    size_t i;
    json_t *r;
    json_array_foreach(all, i, r) {   /* base64("ann:pa55word") */
        cr_assert_str_eq(header_of(r, "authorization"), "Basic YW5uOnBhNTV3b3Jk");
    }
    json_decref(all);
}

Test(server, credentials_in_the_uri_are_sent_but_never_shown)
{
    server_start("--basic", "ann:pa55word", NULL);
    char uri[128], id[64], err[512] = "";
    snprintf(uri, sizeof uri, "http://ann:pa55word@127.0.0.1:%d/", srv.port);
    dk_mlflow_t *c = client(uri, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_experiment(c, "e", id, sizeof id, err, sizeof err), 0, "%s", err);
    /* an error names the server without the password */
    cr_assert_eq(dk_mlflow_create_run(c, "999", "r", NULL, 1, id, sizeof id, err, sizeof err), -1);
    dk_mlflow_destroy(&c);
    cr_assert(strstr(err, srv.url) != NULL, "%s", err);
    cr_assert_null(strstr(err, "pa55word"), "%s", err);
    json_t *all = requests_to(NULL);
    cr_assert_str_eq(header_of(json_array_get(all, 0), "authorization"),
                     "Basic YW5uOnBhNTV3b3Jk");
    json_decref(all);
    char link[256];
    dk_mlflow_run_url(uri, "1", "abc", link, sizeof link);
    cr_assert_null(strstr(link, "pa55word"), "%s", link);
}

Test(server, wrong_token_is_a_401_not_retried_and_not_shown)
{
    server_start("--token", "right", NULL);
    char id[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){.token = "wrong-T0KEN"});
    cr_assert_eq(dk_mlflow_experiment(c, "e", id, sizeof id, err, sizeof err), -1);
    dk_mlflow_destroy(&c);
    cr_assert(strstr(err, "HTTP 401") != NULL, "%s", err);
    cr_assert(strstr(err, "MLFLOW_TRACKING_TOKEN") != NULL, "says what to check: %s", err);
    cr_assert_null(strstr(err, "wrong-T0KEN"), "%s", err);
    json_t *all = requests_to(NULL);
    cr_assert_eq(json_array_size(all), 1);
    json_decref(all);
}

Test(server, answers_500_are_retried_then_succeed)
{
    server_start("--fail", "2", NULL);
    char id[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){.retries = 2});
    cr_assert_eq(dk_mlflow_experiment(c, "e", id, sizeof id, err, sizeof err), 0, "%s", err);
    dk_mlflow_destroy(&c);
    json_t *lookups = requests_to("get-by-name");
    cr_assert_eq(json_array_size(lookups), 3, "500, 500, then 404 (absent)");
    json_decref(lookups);
}

Test(server, answers_500_beyond_the_retries_fail_with_the_server_message)
{
    server_start("--fail", "100", NULL);
    char id[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){.retries = 1});
    cr_assert_eq(dk_mlflow_experiment(c, "e", id, sizeof id, err, sizeof err), -1);
    dk_mlflow_destroy(&c);
    cr_assert(strstr(err, "HTTP 500 INTERNAL_ERROR: injected failure") != NULL, "%s", err);
    cr_assert(strstr(err, "after 2 attempts") != NULL, "%s", err);
    json_t *all = requests_to(NULL);
    cr_assert_eq(json_array_size(all), 2);
    json_decref(all);
}

Test(server, server_down_fails_fast_without_the_password)
{
    int fd, port = closed_port(&fd);
    char uri[128], id[64], err[512] = "";
    snprintf(uri, sizeof uri, "http://ann:uri-pa55@127.0.0.1:%d", port);
    dk_mlflow_config_t cfg = {.username = "bob", .password = "cfg-pa55", .timeout_s = 1.0,
                              .retries = 2};
    dk_mlflow_t *c = client(uri, cfg);
    double t0 = now_s();
    cr_assert_eq(dk_mlflow_experiment(c, "e", id, sizeof id, err, sizeof err), -1);
    double took = now_s() - t0;
    dk_mlflow_destroy(&c);
    close(fd);
    cr_assert_lt(took, 1.0 * 3 + 0.4 + SLACK_S, "took %.2f s", took);
    char where[64];
    snprintf(where, sizeof where, "127.0.0.1:%d", port);
    cr_assert(strstr(err, where) != NULL, "%s", err);
    cr_assert(strstr(err, "after 3 attempts") != NULL, "%s", err);
    cr_assert_null(strstr(err, "pa55"), "%s", err);
}

Test(server, slow_server_fails_within_the_bound)
{
    server_start("--delay", "5", NULL);
    char id[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){.timeout_s = 0.5, .retries = 1});
    double t0 = now_s();
    cr_assert_eq(dk_mlflow_experiment(c, "e", id, sizeof id, err, sizeof err), -1);
    double took = now_s() - t0;
    dk_mlflow_destroy(&c);
    cr_assert_geq(took, 1.0, "two attempts of 0.5 s: took %.2f s", took);
    cr_assert_lt(took, 0.5 * 2 + 0.1 + SLACK_S, "took %.2f s", took);
    cr_assert(strstr(err, "failed after 2 attempts: no answer within 0.5 s") != NULL, "%s", err);
}

Test(server, not_an_mlflow_server_says_so)
{
    server_start(NULL);
    char uri[128], id[64], err[512] = "";
    snprintf(uri, sizeof uri, "%s/not-mlflow", srv.url);
    dk_mlflow_t *c = client(uri, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_experiment(c, "e", id, sizeof id, err, sizeof err), -1);
    dk_mlflow_destroy(&c);
    cr_assert(strstr(err, "HTTP 404") != NULL, "%s", err);
    cr_assert(strstr(err, "MLflow tracking server?") != NULL, "%s", err);
}

Test(server, one_client_many_calls)
{
    /* The whole life of a run, as the runtime makes it, on one connection. */
    server_start(NULL);
    char exp[64], run[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    make_run(c, exp, run);
    json_t *params = json_pack("{s:i}", "world_size", 2);
    cr_assert_eq(dk_mlflow_log_params(c, run, params, err, sizeof err), 0, "%s", err);
    json_decref(params);
    cr_assert_eq(dk_mlflow_update_run(c, run, "FAILED", 42, err, sizeof err), 0, "%s", err);
    dk_mlflow_destroy(&c);
    json_t *r = server_run(run);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(r, "info"), "status")),
                     "FAILED");
    json_decref(r);
    json_t *all = requests_to(NULL);
    size_t i;
    json_t *q;
    json_array_foreach(all, i, q) {
        cr_assert_null(json_object_get(json_object_get(q, "headers"), "expect"),
                       "no Expect: 100-continue wait");
        if (strcmp(json_string_value(json_object_get(q, "method")), "POST") == 0)
            cr_assert_str_eq(header_of(q, "content-type"), "application/json");
    }
    json_decref(all);
}

/* Threads with a client each, racing to create the same experiment: one wins,
 * the others meet RESOURCE_ALREADY_EXISTS (or find it), all get its id. */
typedef struct {
    char id[64];
    char err[512];
    int rc;
} racer_t;

static void *race_for_experiment(void *arg)
{
    racer_t *r = arg;
    dk_mlflow_config_t cfg = {.tracking_uri = srv.url, .timeout_s = 10};
    dk_mlflow_t *c = dk_mlflow_new(&cfg, r->err, sizeof r->err);
    r->rc = c ? dk_mlflow_experiment(c, "contended", r->id, sizeof r->id, r->err, sizeof r->err)
              : -1;
    dk_mlflow_destroy(&c);
    return NULL;
}

Test(server, clients_in_threads_racing_to_create_agree)
{
    server_start(NULL);
    enum { N = 8 };
    pthread_t t[N];
    racer_t r[N];
    memset(r, 0, sizeof r);
    for (int i = 0; i < N; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, race_for_experiment, &r[i]), 0);
    for (int i = 0; i < N; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(r[i].rc, 0, "thread %d: %s", i, r[i].err);
        cr_assert_str_eq(r[i].id, r[0].id);
    }
    json_t *state = server_call("/_test/state", NULL);
    cr_assert_eq(json_array_size(json_object_get(state, "experiments")), 2, "Default + one");
    json_decref(state);
}

/* ------------------------------------------------------------------------ */
/* Ids: only what MLflow issues goes into a link                             */

Test(ids, a_run_id_is_32_lowercase_hex_digits)
{
    cr_assert(dk_mlflow_is_run_id("0123456789abcdef0123456789abcdef"));
    cr_assert_not(dk_mlflow_is_run_id("0123456789ABCDEF0123456789abcdef"), "upper case");
    cr_assert_not(dk_mlflow_is_run_id("0123456789abcdef0123456789abcde"), "31 digits");
    cr_assert_not(dk_mlflow_is_run_id("0123456789abcdef0123456789abcdef0"), "33 digits");
    cr_assert_not(dk_mlflow_is_run_id("0123456789abcdef-123456789abcdef"), "a dash");
    cr_assert_not(dk_mlflow_is_run_id("\"><img src=x onerror=alert(1)>"));
    cr_assert_not(dk_mlflow_is_run_id(""));
    cr_assert_not(dk_mlflow_is_run_id(NULL));
}

Test(ids, an_experiment_id_is_decimal_digits)
{
    cr_assert(dk_mlflow_is_experiment_id("0"));
    cr_assert(dk_mlflow_is_experiment_id("1234567890123456789"));
    cr_assert_not(dk_mlflow_is_experiment_id("12345678901234567890"), "past an int64");
    cr_assert_not(dk_mlflow_is_experiment_id("-1"));
    cr_assert_not(dk_mlflow_is_experiment_id("1 "));
    cr_assert_not(dk_mlflow_is_experiment_id("1\"><script>"));
    cr_assert_not(dk_mlflow_is_experiment_id(""));
    cr_assert_not(dk_mlflow_is_experiment_id(NULL));
}

#define HOSTILE "\"><img src=x onerror=alert(1)>"

Test(server, a_run_id_that_is_not_mlflows_is_refused_and_not_repeated)
{
    server_start(NULL);
    char exp[64], run[64], err[512] = "";
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_experiment(c, "e", exp, sizeof exp, err, sizeof err), 0, "%s", err);
    json_decref(server_call("/_test/config", "{\"run_id\": \"\\\"><img src=x onerror=alert(1)>\"}"));
    cr_assert_eq(dk_mlflow_create_run(c, exp, "r", NULL, 1, run, sizeof run, err, sizeof err),
                 -1);
    dk_mlflow_destroy(&c);
    cr_assert_str_eq(run, "", "no id is handed on");
    cr_assert(strstr(err, "not MLflow's") != NULL, "%s", err);
    cr_assert(strstr(err, "<img") == NULL, "the server's text is not repeated: %s", err);
}

Test(server, an_experiment_id_that_is_not_mlflows_is_refused)
{
    server_start(NULL);
    char exp[64], err[512] = "";
    json_decref(server_call("/_test/config", "{\"experiment_id\": \"1\\\"><img src=x>\"}"));
    dk_mlflow_t *c = client(NULL, (dk_mlflow_config_t){0});
    cr_assert_eq(dk_mlflow_experiment(c, "e", exp, sizeof exp, err, sizeof err), -1);
    cr_assert_str_eq(exp, "");
    cr_assert(strstr(err, "not MLflow's") != NULL, "%s", err);
    /* Found by name on the next call: the lookup holds it to the same form. */
    err[0] = '\0';
    cr_assert_eq(dk_mlflow_experiment(c, "e", exp, sizeof exp, err, sizeof err), -1);
    cr_assert(strstr(err, "not MLflow's") != NULL, "%s", err);
    dk_mlflow_destroy(&c);
}

/* ---- which servers ranks on other nodes reach through the tunnel ---- */

static const char *loopback(const char *uri)
{
    static char out[64];
    return dk_mlflow_loopback_addr(uri, out, sizeof out) ? out : NULL;
}

Test(loopback_addr, the_kernels_own_server_and_a_users_on_loopback)
{
    cr_assert_str_eq(loopback("http://127.0.0.1:5000"), "127.0.0.1:5000");
    cr_assert_str_eq(loopback("http://localhost:5000/prefix/"), "127.0.0.1:5000");
    cr_assert_str_eq(loopback("http://LOCALHOST"), "127.0.0.1:80");
    cr_assert_str_eq(loopback("https://user:p%40ss@127.0.0.1/mlflow"), "127.0.0.1:443");
    cr_assert_str_eq(loopback("http://[::1]:8080"), "[::1]:8080");
    cr_assert_str_eq(loopback("http://a@b@localhost:1?x#y"), "127.0.0.1:1");
}

Test(loopback_addr, servers_the_nodes_reach_themselves_or_none)
{
    const char *others[] = {"http://10.0.0.5:5000", "http://mlflow.example.com",
                            "http://127.0.0.1.example.com:5000", "http://127.0.0.2:5000",
                            "databricks", "file:///tmp/mlruns", "sqlite:///mlflow.db",
                            "http://127.0.0.1:", "http://127.0.0.1:99999",
                            "http://127.0.0.1:50x0", "http://[::1", "http://[::1]x:5", "",
                            "http://localhost.:5000"};
    for (size_t i = 0; i < sizeof others / sizeof *others; i++)
        cr_assert_null(loopback(others[i]), "%s", others[i]);
    cr_assert_null(loopback(NULL));
}
