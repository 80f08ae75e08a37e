/*
 * dk_iopub and dk_stream when a frontend reads IOPub slower than the kernel
 * writes: offers are refused instead of dropped, other messages are queued and
 * delivered in order once the frontend reads, and stream output waits, then is
 * thinned with a notice that counts exactly what was not shown.
 *
 * The frontend is a SUB socket on an inproc endpoint with small high-water
 * marks, so "full" is reached after a handful of messages and nothing sits in
 * operating system buffers.
 */
#include <criterion/criterion.h>

#include <jansson.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dk_iopub.h"
#include "dk_stream.h"

static zsock_t *pub, *sub;
static dk_signer_t *signer;
static dk_iopub_t *iopub;
static int endpoint_no;

/* Whether S is readable within MS milliseconds. */
static bool readable_within(zsock_t *s, int ms)
{
    zpoller_t *p = zpoller_new(s, NULL);
    bool ok = zpoller_wait(p, ms) != NULL;
    zpoller_destroy(&p);
    return ok;
}

static void setup(void)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://iopub-test-%d-%d", getpid(), endpoint_no++);
    pub = zsock_new(ZMQ_PUB);
    zsock_set_sndhwm(pub, 4);
    cr_assert(zsock_bind(pub, "%s", ep) == 0);
    sub = zsock_new(ZMQ_SUB);
    zsock_set_rcvhwm(sub, 4);
    zsock_set_subscribe(sub, "");
    cr_assert(zsock_connect(sub, "%s", ep) == 0);
    signer = dk_signer_new("k", 1);
    iopub = dk_iopub_new(pub, signer, "session");
    cr_assert(iopub);
    /* The subscription travels to the PUB side asynchronously: wait for it. */
    for (int i = 0; i < 200; i++) {
        dk_iopub_status(iopub, "starting", "{}");
        if (readable_within(sub, 10)) {
            zmsg_t *m = zmsg_recv(sub);
            zmsg_destroy(&m);
            break;
        }
    }
    while (readable_within(sub, 20)) {
        zmsg_t *m = zmsg_recv(sub);
        zmsg_destroy(&m);
    }
}

static void teardown(void)
{
    dk_iopub_destroy(&iopub);
    zsock_destroy(&sub);
    zsock_destroy(&pub);
    dk_signer_destroy(&signer);
}


typedef struct {
    char msg_type[32];
    json_t *content;
} got_t;

/* The next message the frontend reads, or false if none within MS. */
static bool recv_one(got_t *got, int ms)
{
    if (!readable_within(sub, ms))
        return false;
    zmsg_t *m = zmsg_recv(sub);
    cr_assert(m);
    zframe_t *f = zmsg_first(m);
    while (f && !zframe_streq(f, "<IDS|MSG>"))
        f = zmsg_next(m);
    cr_assert(f, "no delimiter");
    zmsg_next(m);                       /* signature */
    zframe_t *header = zmsg_next(m);
    zmsg_next(m);                       /* parent */
    zmsg_next(m);                       /* metadata */
    zframe_t *content = zmsg_next(m);
    json_t *h = json_loadb((const char *)zframe_data(header), zframe_size(header), 0, NULL);
    snprintf(got->msg_type, sizeof got->msg_type, "%s",
             json_string_value(json_object_get(h, "msg_type")));
    json_decref(h);
    got->content = json_loadb((const char *)zframe_data(content), zframe_size(content), 0, NULL);
    zmsg_destroy(&m);
    return true;
}

static int offer_n(int n)
{
    int sent = 0;
    for (int i = 0; i < n; i++) {
        char text[64];
        snprintf(text, sizeof text, "{\"name\":\"stdout\",\"text\":\"offer %d\\n\"}", i);
        if (dk_iopub_offer_text(iopub, "stream", text) == DK_IOPUB_SENT)
            sent++;
        else
            break;
    }
    return sent;
}

TestSuite(iopub, .init = setup, .fini = teardown, .timeout = 60);

Test(iopub, offers_are_refused_once_the_frontend_is_full_not_dropped)
{
    int sent = offer_n(1000);
    cr_assert(sent > 0 && sent < 100, "sent %d of 1000 to a frontend that does not read", sent);
    /* Everything accepted arrives, in order; nothing after it. */
    got_t g;
    for (int i = 0; i < sent; i++) {
        cr_assert(recv_one(&g, 1000), "offer %d of %d never arrived", i, sent);
        char want[32];
        snprintf(want, sizeof want, "offer %d\n", i);
        cr_assert_str_eq(json_string_value(json_object_get(g.content, "text")), want);
        json_decref(g.content);
    }
    cr_assert_not(recv_one(&g, 100), "a refused offer was sent anyway");
}

Test(iopub, other_messages_are_queued_while_full_and_arrive_in_order)
{
    int sent = offer_n(1000);
    for (int i = 0; i < 50; i++) {
        char content[64];
        snprintf(content, sizeof content, "{\"seq\":%d}", i);
        cr_assert_eq(dk_iopub_publish_text(iopub, "display_data", content, NULL, NULL, NULL, 0),
                     0);
    }
    dk_iopub_status(iopub, "idle", NULL);
    cr_assert_gt(dk_iopub_queued(iopub), 40, "messages were not queued behind a full frontend");
    /* While older messages wait, an offer is refused even if the socket has room. */
    cr_assert_eq(dk_iopub_offer_text(iopub, "stream", "{\"name\":\"stdout\",\"text\":\"late\"}"),
                 DK_IOPUB_FULL);
    got_t g;
    for (int i = 0; i < sent; i++) {
        cr_assert(recv_one(&g, 1000));
        cr_assert_str_eq(g.msg_type, "stream");
        json_decref(g.content);
    }
    for (int i = 0; i < 50; i++) {
        cr_assert(recv_one(&g, 2000), "queued message %d never arrived", i);
        cr_assert_str_eq(g.msg_type, "display_data");
        cr_assert_eq(json_integer_value(json_object_get(g.content, "seq")), i);
        json_decref(g.content);
    }
    cr_assert(recv_one(&g, 2000));
    cr_assert_str_eq(g.msg_type, "status");
    json_decref(g.content);
    cr_assert_eq(dk_iopub_queued(iopub), 0);
    cr_assert_eq(dk_iopub_dropped(iopub), 0);
    /* Drained: offers are taken again. */
    cr_assert_eq(offer_n(1), 1);
}

Test(iopub, a_frontend_that_reads_gets_everything)
{
    int total = 0;
    got_t g;
    for (int i = 0; i < 2000; i++) {
        char text[64];
        snprintf(text, sizeof text, "{\"seq\":%d}", i);
        dk_iopub_publish_text(iopub, "display_data", text, NULL, NULL, NULL, 0);
        while (recv_one(&g, 0)) {
            cr_assert_eq(json_integer_value(json_object_get(g.content, "seq")), total);
            total++;
            json_decref(g.content);
        }
    }
    while (total < 2000 && recv_one(&g, 2000)) {
        cr_assert_eq(json_integer_value(json_object_get(g.content, "seq")), total);
        total++;
        json_decref(g.content);
    }
    cr_assert_eq(total, 2000);
    cr_assert_eq(dk_iopub_dropped(iopub), 0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Stream output to a frontend that stops reading: the writer waits a bounded
 * time, then finished lines are thinned; when the frontend reads again it gets
 * whole lines in order and a notice whose count is exactly what it missed. */
Test(iopub, stream_output_waits_then_is_thinned_with_an_exact_notice)
{
    char err[256];
    dk_stream_t *stream = dk_stream_new(iopub, err, sizeof err);
    cr_assert(stream, "%s", err);
    dk_stream_set_thin_hint(stream, "; every rank's full output is in /logs/run-1");
    const int lines = 200000;
    double t0 = now_s();
    char line[128];
    for (int i = 0; i < lines; i += 100) {
        char batch[100 * 128];
        size_t len = 0;
        for (int j = i; j < i + 100; j++)
            len += (size_t)snprintf(batch + len, sizeof batch - len, "[rank 0] line %d\n", j);
        dk_stream_append(stream, DK_STDOUT, batch, len);
    }
    double took = now_s() - t0;
    cr_assert_lt(took, 20.0, "the writer was held %.1f s by a frontend that stopped reading", took);
    unsigned long long thinned, bytes;
    dk_stream_thinned(stream, &thinned, &bytes);
    cr_assert_gt(thinned, 0, "nothing was thinned for a frontend that never read");
    /* The frontend reads again; the kernel flushes, as before its reply. */
    char *shown = NULL;
    size_t shown_len = 0;
    FILE *mem = open_memstream(&shown, &shown_len);
    got_t g;
    bool flushed = false;
    for (;;) {
        if (!recv_one(&g, 300)) {
            if (flushed)
                break;
            dk_stream_flush(stream);
            flushed = true;
            continue;
        }
        if (strcmp(g.msg_type, "stream") == 0)
            fputs(json_string_value(json_object_get(g.content, "text")), mem);
        json_decref(g.content);
    }
    fclose(mem);
    /* Whole lines, in order, with gaps; each gap preceded by a notice; the notices
     * add up to the lines missing. */
    regex_t notice;
    regcomp(&notice,
            "^\\[distkernel\\] output thinned: ([0-9]+) lines? \\([^)]*\\) not shown here because "
            "the frontend was not reading fast enough; every rank's full output is in "
            "/logs/run-1$", REG_EXTENDED);
    long next = 0, missing_told = 0, shown_lines = 0, pending_told = 0;
    char *save = NULL;
    for (char *l = strtok_r(shown, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        regmatch_t m[2];
        if (regexec(&notice, l, 2, m, 0) == 0) {
            pending_told += atol(l + m[1].rm_so);
            continue;
        }
        int n;
        cr_assert(sscanf(l, "[rank 0] line %d", &n) == 1, "not a whole line: '%s'", l);
        snprintf(line, sizeof line, "[rank 0] line %d", n);
        cr_assert_str_eq(l, line, "a line was cut");
        cr_assert(n >= next, "line %d shown after line %ld", n, next);
        cr_assert_eq(n - next, pending_told, "lines %ld..%d missing, but a notice said %ld",
                     next, n - 1, pending_told);
        missing_told += pending_told;
        pending_told = 0;
        next = n + 1;
        shown_lines++;
    }
    missing_told += pending_told;
    cr_assert_eq(lines - next, pending_told, "the last %ld lines are missing without notice",
                 lines - next);
    cr_assert_eq(shown_lines + missing_told, lines);
    cr_assert_eq((unsigned long long)missing_told, thinned);
    regfree(&notice);
    free(shown);
    dk_stream_destroy(&stream);
}

/* A frontend that reads, even slowly, loses nothing: the writer waits for it. */
Test(iopub, stream_output_to_a_slow_reader_is_complete)
{
    char err[256];
    dk_stream_t *stream = dk_stream_new(iopub, err, sizeof err);
    cr_assert(stream, "%s", err);
    const int lines = 20000;
    char *shown = NULL;
    size_t shown_len = 0;
    FILE *mem = open_memstream(&shown, &shown_len);
    got_t g;
    for (int i = 0; i < lines; i += 100) {
        char batch[100 * 64];
        size_t len = 0;
        for (int j = i; j < i + 100; j++)
            len += (size_t)snprintf(batch + len, sizeof batch - len, "line %d\n", j);
        dk_stream_append(stream, DK_STDOUT, batch, len);
        while (recv_one(&g, 0)) {     /* a reader that keeps up, one step behind */
            fputs(json_string_value(json_object_get(g.content, "text")), mem);
            json_decref(g.content);
        }
    }
    dk_stream_flush(stream);
    while (recv_one(&g, 300)) {
        if (strcmp(g.msg_type, "stream") == 0)
            fputs(json_string_value(json_object_get(g.content, "text")), mem);
        json_decref(g.content);
    }
    fclose(mem);
    unsigned long long thinned, bytes;
    dk_stream_thinned(stream, &thinned, &bytes);
    cr_assert_eq(thinned, 0);
    long next = 0;
    char *save = NULL;
    for (char *l = strtok_r(shown, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        int n;
        cr_assert(sscanf(l, "line %d", &n) == 1 && n == next, "expected line %ld, got '%s'",
                  next, l);
        next++;
    }
    cr_assert_eq(next, lines);
    free(shown);
    dk_stream_destroy(&stream);
}

/* ---- finding 3 of issue 11: a subscriber that never reads -------------------
 * Over TCP (the monitor counts TCP and IPC connections, not inproc), with big
 * messages so that the operating system's buffers fill quickly. */

#define BIG 32768

typedef struct {
    zsock_t *sock;
    int expected;           /* offers to read, numbered 0.. */
    int got, out_of_order;
    bool idle;
    pthread_t tid;
} reader_t;

static void *reader_main(void *arg)
{
    reader_t *r = arg;
    zpoller_t *p = zpoller_new(r->sock, NULL);
    while (!r->idle && zpoller_wait(p, 10000)) {
        zmsg_t *m = zmsg_recv(r->sock);
        if (!m)
            break;
        zframe_t *f = zmsg_first(m);
        while (f && !zframe_streq(f, "<IDS|MSG>"))
            f = zmsg_next(m);
        for (int i = 0; f && i < 5; i++)
            f = zmsg_next(m);   /* signature, header, parent, metadata -> content */
        json_t *c = f ? json_loadb((const char *)zframe_data(f), zframe_size(f), 0, NULL) : NULL;
        const char *text = json_string_value(json_object_get(c, "text"));
        const char *state = json_string_value(json_object_get(c, "execution_state"));
        if (text) {
            if (atoi(text) != r->got)
                r->out_of_order++;
            r->got++;
        } else if (state && strcmp(state, "idle") == 0) {
            r->idle = true;
        }
        json_decref(c);
        zmsg_destroy(&m);
    }
    zpoller_destroy(&p);
    return NULL;
}

/* An iopub on a TCP publisher with N subscribers (SUBS) connected, subscribed
 * and drained; the test decides which of them read after that. */
static dk_iopub_t *tcp_iopub(zsock_t **pub_p, zsock_t **subs, int n)
{
    zsock_t *p = zsock_new(ZMQ_PUB);
    zsock_set_sndhwm(p, 4);
    int port = zsock_bind(p, "tcp://127.0.0.1:*");
    cr_assert_gt(port, 0);
    dk_iopub_t *io = dk_iopub_new(p, signer, "session");
    for (int i = 0; i < n; i++) {
        subs[i] = zsock_new(ZMQ_SUB);
        zsock_set_rcvhwm(subs[i], 1);
        zsock_set_subscribe(subs[i], "");
        cr_assert(zsock_connect(subs[i], "tcp://127.0.0.1:%d", port) == 0);
    }
    /* Every subscriber has joined when each has read a status. */
    for (int i = 0; i < n; i++) {
        bool joined = false;
        for (int t = 0; t < 500 && !joined; t++) {
            dk_iopub_status(io, "starting", "{}");
            joined = readable_within(subs[i], 10);
        }
        cr_assert(joined, "subscriber %d never joined", i);
    }
    for (int i = 0; i < n; i++)
        while (readable_within(subs[i], 50)) {
            zmsg_t *m = zmsg_recv(subs[i]);
            zmsg_destroy(&m);
        }
    for (int t = 0; t < 200 && dk_iopub_connections(io) < n; t++)
        usleep(10000);
    cr_assert_eq(dk_iopub_connections(io), n);
    *pub_p = p;
    return io;
}

/* Offer numbered BIG-byte stream texts 0..N-1, each retried until sent (as
 * dk_stream does); returns the longest wait for one, in ms. */
static long long offer_all(dk_iopub_t *io, int n, long long give_up_ms)
{
    static char text[BIG + 64];
    long long longest = 0;
    for (int i = 0; i < n; i++) {
        int k = snprintf(text, sizeof text, "{\"name\":\"stdout\",\"text\":\"%d ", i);
        memset(text + k, 'x', BIG);
        snprintf(text + k + BIG, sizeof text - k - BIG, "\\n\"}");
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        for (;;) {
            if (dk_iopub_offer_text(io, "stream", text) == DK_IOPUB_SENT)
                break;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            long long waited = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
            if (waited > give_up_ms)
                return waited;
            usleep(2000);
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        long long waited = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
        if (waited > longest)
            longest = waited;
    }
    return longest;
}

Test(iopub, a_subscriber_that_never_reads_does_not_hold_back_another)
{
    zsock_t *tpub, *subs[2];
    dk_iopub_t *io = tcp_iopub(&tpub, subs, 2);
    reader_t r = {.sock = subs[1]};
    pthread_create(&r.tid, NULL, reader_main, &r);
    /* 64 MiB: far more than the stuck subscriber's socket buffers hold. */
    int n = 2048;
    long long longest = offer_all(io, n, 5000);
    cr_assert_lt(longest, 5000, "an offer waited %lld ms: the stuck subscriber held it back",
                 longest);
    dk_iopub_status(io, "idle", "{}");
    pthread_join(r.tid, NULL);
    cr_assert_eq(r.got, n, "the reading frontend got %d of %d", r.got, n);
    cr_assert_eq(r.out_of_order, 0);
    cr_assert(r.idle, "no idle");
    cr_assert_geq(dk_iopub_passed_over(io), 1);
    dk_iopub_destroy(&io);
    for (int i = 0; i < 2; i++)
        zsock_destroy(&subs[i]);
    zsock_destroy(&tpub);
}

Test(iopub, a_single_subscriber_that_stops_reading_is_waited_for_not_dropped)
{
    zsock_t *tpub, *subs[1];
    dk_iopub_t *io = tcp_iopub(&tpub, subs, 1);
    /* Fill it, then keep offering past DK_IOPUB_STUCK_MS: still refused. */
    long long waited = offer_all(io, 2048, 3 * DK_IOPUB_STUCK_MS);
    cr_assert_geq(waited, 3 * DK_IOPUB_STUCK_MS, "offers never refused");
    dk_iopub_status(io, "idle", "{}");
    cr_assert_eq(dk_iopub_passed_over(io), 0);
    /* Reading again, it gets the rest in order and its idle. */
    reader_t r = {.sock = subs[0]};
    pthread_create(&r.tid, NULL, reader_main, &r);
    pthread_join(r.tid, NULL);
    cr_assert(r.idle, "the idle was dropped");
    cr_assert_eq(r.out_of_order, 0);
    cr_assert_eq(dk_iopub_dropped(io), 0);
    dk_iopub_destroy(&io);
    zsock_destroy(&subs[0]);
    zsock_destroy(&tpub);
}

/* Raw bytes (Python's writes, the kernel's fd 1/2) become text on the way in:
 * a character split over two writes arrives whole, an invalid byte becomes
 * U+FFFD, and rank output appended between them is neither scanned nor
 * disturbed. */
Test(iopub, raw_writes_become_text_with_split_characters_joined)
{
    char err[256];
    dk_stream_t *stream = dk_stream_new(iopub, err, sizeof err);
    cr_assert(stream, "%s", err);
    dk_stream_write(stream, DK_STDOUT, "caf\xc3", 4);          /* é, first byte */
    dk_stream_append(stream, DK_STDOUT, "[rank 0] \xe2\x9c\x93\n", 13);
    dk_stream_write(stream, DK_STDOUT, "\xa9 bad:\xff end\n", 12);
    dk_stream_flush(stream);
    char *shown = NULL;
    size_t shown_len = 0;
    FILE *mem = open_memstream(&shown, &shown_len);
    got_t g;
    while (recv_one(&g, 300)) {
        if (strcmp(g.msg_type, "stream") == 0)
            fputs(json_string_value(json_object_get(g.content, "text")), mem);
        json_decref(g.content);
    }
    fclose(mem);
    cr_assert_str_eq(shown, "caf[rank 0] \xe2\x9c\x93\n\xc3\xa9 bad:\xef\xbf\xbd end\n");
    free(shown);
    dk_stream_destroy(&stream);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, iopub_and_stream_take_null)
{
    dk_iopub_destroy(NULL);
    dk_iopub_t *no_iopub = NULL;
    dk_iopub_destroy(&no_iopub);
    cr_assert_null(no_iopub);
    dk_stream_destroy(NULL);
    dk_stream_t *no_stream = NULL;
    dk_stream_destroy(&no_stream);
    cr_assert_null(no_stream);
}
