/*
 * dk_debug: debug requests answered off the control thread. The Python side
 * (dk_python_debug_request) is replaced here by a stub that echoes the
 * request's command and, for "hold", waits until the test lets it go: the
 * control side must be free to go on meanwhile.
 */
#include <criterion/criterion.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dk_debug.h"

static atomic_bool release;
static atomic_int held;

char *dk_python_debug_request(const char *content_json, const char *parent_json)
{
    json_t *content = json_loads(content_json, 0, NULL);
    json_t *parent = json_loads(parent_json, 0, NULL);
    const char *command = json_string_value(json_object_get(content, "command"));
    if (command && strcmp(command, "hold") == 0) {
        atomic_fetch_add(&held, 1);
        while (!atomic_load(&release)) {
            struct timespec ts = {0, 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    json_t *reply = json_pack("{s:s, s:s?}", "command", command ? command : "",
                              "parent", json_string_value(json_object_get(parent, "msg_id")));
    char *text = json_dumps(reply, JSON_COMPACT);
    json_decref(reply);
    json_decref(content);
    json_decref(parent);
    return text;
}

static dk_msg_t *request(const char *command, int n)
{
    dk_msg_t *m = calloc(1, sizeof *m);
    char id[32];
    snprintf(id, sizeof id, "msg-%d", n);
    m->header = json_pack("{s:s, s:s}", "msg_id", id, "msg_type", "debug_request");
    m->parent = json_object();
    m->metadata = json_object();
    m->content = json_pack("{s:s, s:i}", "command", command, "seq", n);
    m->msg_type = "debug_request";
    return m;
}

/* The next finished job, waiting up to 10 s. */
static dk_debug_job_t *next(zactor_t *w)
{
    zpoller_t *p = zpoller_new(w, NULL);
    void *which = zpoller_wait(p, 10000);
    zpoller_destroy(&p);
    cr_assert(which == w, "no job came back");
    dk_debug_job_t *job = dk_debug_recv(w);
    cr_assert_not_null(job);
    return job;
}

Test(debug, a_request_comes_back_with_its_reply)
{
    zactor_t *w = dk_debug_new();
    cr_assert_not_null(w);
    dk_msg_t *req = request("debugInfo", 7);
    cr_assert_eq(dk_debug_submit(w, req), 0);
    dk_debug_job_t *job = next(w);
    cr_assert_eq(job->request, req);
    cr_assert_str_eq(job->reply, "{\"command\":\"debugInfo\",\"parent\":\"msg-7\"}");
    dk_debug_job_destroy(&job);
    cr_assert_null(job);
    zactor_destroy(&w);
}

Test(debug, requests_are_answered_in_the_order_they_came)
{
    zactor_t *w = dk_debug_new();
    for (int i = 0; i < 50; i++)
        cr_assert_eq(dk_debug_submit(w, request("stackTrace", i)), 0);
    for (int i = 0; i < 50; i++) {
        dk_debug_job_t *job = next(w);
        cr_assert_eq(json_integer_value(json_object_get(job->request->content, "seq")), i);
        dk_debug_job_destroy(&job);
    }
    zactor_destroy(&w);
}

Test(debug, submitting_does_not_wait_for_the_worker)
{
    atomic_store(&release, false);
    atomic_store(&held, 0);
    zactor_t *w = dk_debug_new();
    cr_assert_eq(dk_debug_submit(w, request("hold", 1)), 0);
    while (atomic_load(&held) == 0) {
        struct timespec ts = {0, 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    /* The worker is stuck in "Python"; the caller is not. */
    cr_assert_eq(dk_debug_submit(w, request("debugInfo", 2)), 0);
    zpoller_t *p = zpoller_new(w, NULL);
    cr_assert_null(zpoller_wait(p, 50), "a reply came while the worker was held");
    zpoller_destroy(&p);
    atomic_store(&release, true);
    dk_debug_job_t *a = next(w), *b = next(w);
    cr_assert_str_eq(json_string_value(json_object_get(a->request->content, "command")), "hold");
    cr_assert_str_eq(json_string_value(json_object_get(b->request->content, "command")),
                     "debugInfo");
    dk_debug_job_destroy(&a);
    dk_debug_job_destroy(&b);
    zactor_destroy(&w);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, debug_job_takes_null)
{
    dk_debug_job_destroy(NULL);
    dk_debug_job_t *none = NULL;
    dk_debug_job_destroy(&none);
    cr_assert_null(none);
}
