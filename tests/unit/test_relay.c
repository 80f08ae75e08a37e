/*
 * Ranks' connections relayed by their node's agent (runtime/channel/
 * dk_backchan_relay.c, the kernel's side; DK_FRAME_RELAY in dk_backchan.h).
 *
 * This test plays a node agent over TCP on 127.0.0.1 (dk_frame, as the agent
 * does) and, inside its streams, the ranks (their own frames, sealed over the
 * nonce the channel sends each stream), and turns the channel's poll loop
 * itself. Every wait is bounded.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dk_backchan.h"
#include "dk_be32.h"
#include "dk_frame.h"

#define WORLD 4         /* 2 nodes of 2 */
#define PER 2

static struct {
    char msg[WORLD][64];
    int closed[WORLD + 2];
    int delivered[WORLD];
    char warnings[8][256];
    int nwarnings;
} rec;

static void on_delivered(void *d, int rank)
{
    (void) d;
    rec.delivered[rank]++;
}

static void on_message(void *d, int rank, bool is_error, const void *bytes, size_t len)
{
    (void) d, (void) is_error;
    snprintf(rec.msg[rank], sizeof rec.msg[rank], "%.*s", (int) len, (const char *) bytes);
}

static void on_warning(void *d, const char *text)
{
    (void) d;
    if (rec.nwarnings < 8)
        snprintf(rec.warnings[rec.nwarnings++], sizeof rec.warnings[0], "%s", text);
}

static void on_closed(void *d, int rank)
{
    (void) d;
    rec.closed[rank]++;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* One turn of the channel's loop, waiting at most MS. */
static void turn(dk_backchan_t *ch, int ms)
{
    struct pollfd fds[64];
    size_t n = dk_backchan_poll_fill(ch, fds);
    if (poll(fds, n, ms) > 0)
        dk_backchan_poll_handle(ch, fds, n);
}

typedef struct {
    int fd;
    dk_frame_key_t *key;
    dk_frame_side_t side;       /* the agent's connection */
    unsigned char in[1 << 20];
    size_t in_len;
} agent_t;

typedef struct {
    uint32_t stream;
    dk_frame_side_t side;       /* the rank's own, over its stream's nonce */
    unsigned char in[1 << 16];
    size_t in_len;
    bool ended;                 /* the channel sent RELAY_END */
} stream_t;

static dk_backchan_t *channel(void)
{
    memset(&rec, 0, sizeof rec);
    dk_backchan_sink_t sink = {.on_delivered = on_delivered, .on_message = on_message,
                               .on_warning = on_warning, .on_closed = on_closed};
    dk_backchan_opts_t opts = {.tcp_addr = "127.0.0.1", .heartbeat_s = 30, .agents = WORLD / PER,
                               .ranks_per_node = PER};
    char err[256];
    dk_backchan_t *ch = dk_backchan_new_opts(WORLD, false, "job", 3, &sink, &opts, err,
                                             sizeof err);
    cr_assert_not_null(ch, "%s", err);
    return ch;
}

static void agent_send(agent_t *a, int type, uint32_t id, const void *p, size_t len)
{
    unsigned char *buf = malloc(DK_FRAME_HEAD + len);
    size_t n = dk_frame_seal(&a->side, type, id, p, len, buf);
    cr_assert_gt(n, 0);
    cr_assert_eq(send(a->fd, buf, n, MSG_NOSIGNAL), (ssize_t) n);
    free(buf);
}

/* Turn the channel until the agent has a frame from it (at most 5 s). */
static dk_frame_msg_t agent_next(dk_backchan_t *ch, agent_t *a)
{
    double until = now_s() + 5;
    for (;;) {
        dk_frame_msg_t m;
        const char *why = NULL;
        long took = dk_frame_open(&a->side, a->in, a->in_len, DK_FRAME_RELAY_MAX, &m, NULL, &why);
        cr_assert_geq(took, 0, "the channel broke the protocol: %s", why);
        if (took > 0) {
            if (m.type == DK_FRAME_PING) {
                memmove(a->in, a->in + took, a->in_len - (size_t) took);
                a->in_len -= (size_t) took;
                continue;
            }
            /* Kept in place until the next call: copy it out of the buffer. */
            static unsigned char copy[DK_FRAME_RELAY_MAX];
            memcpy(copy, m.payload, m.len);
            m.payload = copy;
            memmove(a->in, a->in + took, a->in_len - (size_t) took);
            a->in_len -= (size_t) took;
            return m;
        }
        cr_assert_lt(now_s(), until, "no frame from the channel within 5 s");
        turn(ch, 20);
        ssize_t r = recv(a->fd, a->in + a->in_len, sizeof a->in - a->in_len, MSG_DONTWAIT);
        if (r > 0)
            a->in_len += (size_t) r;
    }
}

static void agent_connect(dk_backchan_t *ch, agent_t *a, int node)
{
    memset(a, 0, sizeof *a);
    a->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(dk_backchan_port(ch))};
    inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
    cr_assert_eq(connect(a->fd, (struct sockaddr *) &addr, sizeof addr), 0);
    unsigned char key[32], nonce[32];
    cr_assert_eq(dk_frame_key_from_hex(dk_backchan_key_hex(ch), key), 0);
    a->key = dk_frame_key_new(key);
    size_t have = 0;
    for (double until = now_s() + 5; have < sizeof nonce; ) {
        cr_assert_lt(now_s(), until, "no nonce");
        turn(ch, 20);
        ssize_t r = recv(a->fd, nonce + have, sizeof nonce - have, MSG_DONTWAIT);
        if (r > 0)
            have += (size_t) r;
    }
    dk_frame_side_init(&a->side, a->key, nonce, DK_FRAME_DIR_TO_RUNTIME);
    agent_send(a, DK_FRAME_AGENT_HELLO, (uint32_t) node, NULL, 0);
}

/* The agent says a rank connected as STREAM: the channel sends the stream
 * its nonce. */
static void stream_open(dk_backchan_t *ch, agent_t *a, stream_t *s, uint32_t stream)
{
    memset(s, 0, sizeof *s);
    s->stream = stream;
    agent_send(a, DK_FRAME_RELAY, stream, NULL, 0);
    dk_frame_msg_t m = agent_next(ch, a);
    if (m.type == DK_FRAME_RELAY_END) {
        cr_assert_eq(m.id, stream);
        s->ended = true;
        return;
    }
    cr_assert_eq(m.type, DK_FRAME_RELAY);
    cr_assert_eq(m.id, stream);
    cr_assert_eq(m.len, 32, "the stream's first bytes are its nonce");
    dk_frame_side_init(&s->side, a->key, m.payload, DK_FRAME_DIR_TO_RUNTIME);
}

/* The rank in stream S sends a frame. */
static void rank_send(agent_t *a, stream_t *s, int type, uint32_t rank, const char *p)
{
    size_t len = p ? strlen(p) : 0;
    unsigned char frame[DK_FRAME_HEAD + 64];
    size_t n = dk_frame_seal(&s->side, type, rank, p, len, frame);
    cr_assert_gt(n, 0);
    agent_send(a, DK_FRAME_RELAY, s->stream, frame, n);
}

/* The next frame the channel relays to stream S, opened as the rank would. */
static dk_frame_msg_t rank_next(dk_backchan_t *ch, agent_t *a, stream_t *s)
{
    for (;;) {
        dk_frame_msg_t m;
        const char *why = NULL;
        long took = dk_frame_open(&s->side, s->in, s->in_len, 1 << 15, &m, NULL, &why);
        cr_assert_geq(took, 0, "the rank could not open what was relayed: %s", why);
        if (took > 0) {
            static unsigned char copy[1 << 15];
            memcpy(copy, m.payload, m.len);
            m.payload = copy;
            memmove(s->in, s->in + took, s->in_len - (size_t) took);
            s->in_len -= (size_t) took;
            return m;
        }
        dk_frame_msg_t r = agent_next(ch, a);
        cr_assert_eq(r.id, s->stream, "a frame for another stream (%u)", r.id);
        if (r.type == DK_FRAME_RELAY_END) {
            s->ended = true;
            return (dk_frame_msg_t) {.type = -1};
        }
        cr_assert_eq(r.type, DK_FRAME_RELAY);
        memcpy(s->in + s->in_len, r.payload, r.len);
        s->in_len += r.len;
    }
}

static void agent_close(agent_t *a)
{
    close(a->fd);
    dk_frame_key_destroy(&a->key);
}

static bool warned(const char *needle)
{
    for (int i = 0; i < rec.nwarnings; i++)
        if (strstr(rec.warnings[i], needle))
            return true;
    return false;
}

Test(relay, a_rank_relayed_by_its_agent_gets_its_payload_and_answers)
{
    dk_backchan_t *ch = channel();
    agent_t a;
    agent_connect(ch, &a, 1);
    stream_t s;
    stream_open(ch, &a, &s, 7);
    cr_assert_not(s.ended);
    rank_send(&a, &s, DK_FRAME_HELLO, 3, NULL);
    dk_frame_msg_t m = rank_next(ch, &a, &s);
    cr_assert_eq(m.type, DK_FRAME_PAYLOAD);
    cr_assert_eq(m.id, 3);
    cr_assert_eq(m.len, 3);
    cr_assert_eq(memcmp(m.payload, "job", 3), 0);
    rank_send(&a, &s, DK_FRAME_RESULT, 3, "forty-two");
    for (double until = now_s() + 5; !rec.msg[3][0] && now_s() < until;)
        turn(ch, 20);
    cr_assert_str_eq(rec.msg[3], "forty-two");
    cr_assert_eq(rec.delivered[3], 1);
    cr_assert(dk_backchan_rank_open(ch, 3));
    /* The rank's connection ends there after its answer: nothing to tell. */
    agent_send(&a, DK_FRAME_RELAY_END, 7, NULL, 0);
    for (double until = now_s() + 2; dk_backchan_rank_open(ch, 3) && now_s() < until;)
        turn(ch, 20);
    cr_assert_not(dk_backchan_rank_open(ch, 3));
    cr_assert_eq(rec.closed[3], 0);
    cr_assert_eq(rec.nwarnings, 0, "%s", rec.warnings[0]);
    agent_close(&a);
    dk_backchan_destroy(&ch);
}

Test(relay, a_stream_may_not_claim_a_rank_of_another_node)
{
    dk_backchan_t *ch = channel();
    agent_t a;
    agent_connect(ch, &a, 1);   /* ranks 2 and 3 */
    stream_t s;
    stream_open(ch, &a, &s, 0);
    rank_send(&a, &s, DK_FRAME_HELLO, 0, NULL);
    dk_frame_msg_t m = rank_next(ch, &a, &s);
    cr_assert_eq(m.type, -1, "rank 0's HELLO relayed by node 1's agent was not refused");
    cr_assert(s.ended);
    cr_assert(warned("not on the node of the agent that relays it"), "%s", rec.warnings[0]);
    cr_assert_not(dk_backchan_rank_connected_once(ch, 0));
    agent_close(&a);
    dk_backchan_destroy(&ch);
}

Test(relay, an_agent_may_not_open_more_streams_than_its_ranks_and_the_slack)
{
    dk_backchan_t *ch = channel();
    agent_t a;
    agent_connect(ch, &a, 0);
    stream_t s[PER + DK_BC_RELAY_SLACK + 1];
    for (int i = 0; i < PER + DK_BC_RELAY_SLACK; i++) {
        stream_open(ch, &a, &s[i], (uint32_t) i);
        cr_assert_not(s[i].ended, "stream %d", i);
    }
    stream_open(ch, &a, &s[PER + DK_BC_RELAY_SLACK], 100);
    cr_assert(s[PER + DK_BC_RELAY_SLACK].ended, "one stream too many was opened");
    agent_close(&a);
    dk_backchan_destroy(&ch);
}

Test(relay, a_rank_whose_stream_ends_unanswered_is_told_and_the_kernel_ends_streams)
{
    dk_backchan_t *ch = channel();
    agent_t a;
    agent_connect(ch, &a, 0);
    stream_t s0, s1;
    stream_open(ch, &a, &s0, 10);
    stream_open(ch, &a, &s1, 11);
    rank_send(&a, &s0, DK_FRAME_HELLO, 0, NULL);
    rank_send(&a, &s1, DK_FRAME_HELLO, 1, NULL);
    cr_assert_eq(rank_next(ch, &a, &s0).type, DK_FRAME_PAYLOAD);
    cr_assert_eq(rank_next(ch, &a, &s1).type, DK_FRAME_PAYLOAD);
    /* Rank 0's connection ends there before it answered: told once. */
    agent_send(&a, DK_FRAME_RELAY_END, 10, NULL, 0);
    for (double until = now_s() + 2; !rec.closed[0] && now_s() < until;)
        turn(ch, 20);
    cr_assert_eq(rec.closed[0], 1);
    /* The kernel closes the ranks' connections (started ranks' cue to
     * exit): the agent is told to end rank 1's stream; the agent's own
     * connection stays. */
    dk_backchan_close_ranks(ch);
    dk_frame_msg_t m = agent_next(ch, &a);
    cr_assert_eq(m.type, DK_FRAME_RELAY_END);
    cr_assert_eq(m.id, 11);
    cr_assert_not(dk_backchan_rank_open(ch, 1));
    cr_assert_eq(rec.closed[1], 0, "a connection the kernel closed is not told as closed");
    cr_assert(dk_backchan_rank_open(ch, WORLD + 0), "the agent's connection was closed too");
    agent_close(&a);
    dk_backchan_destroy(&ch);
}

Test(relay, an_agents_close_takes_its_relayed_connections_without_a_word)
{
    dk_backchan_t *ch = channel();
    agent_t a;
    agent_connect(ch, &a, 1);
    stream_t s;
    stream_open(ch, &a, &s, 5);
    rank_send(&a, &s, DK_FRAME_HELLO, 2, NULL);
    cr_assert_eq(rank_next(ch, &a, &s).type, DK_FRAME_PAYLOAD);
    cr_assert(dk_backchan_rank_open(ch, 2));
    agent_close(&a);
    for (double until = now_s() + 2; dk_backchan_rank_open(ch, WORLD + 1) && now_s() < until;)
        turn(ch, 20);
    cr_assert_not(dk_backchan_rank_open(ch, 2));
    cr_assert_eq(rec.closed[2], 0, "the node's loss is the agent's to tell");
    cr_assert_eq(rec.closed[WORLD + 1], 1, "the agent's close is told");
    dk_backchan_destroy(&ch);
}

/* A payload larger than a RELAY frame reaches the rank whole, in pieces. */
Test(relay, a_payload_larger_than_a_relay_frame_arrives_whole)
{
    memset(&rec, 0, sizeof rec);
    size_t big = 3 * DK_FRAME_RELAY_MAX + 123;
    char *payload = malloc(big);
    for (size_t i = 0; i < big; i++)
        payload[i] = (char) ('a' + i % 26);
    dk_backchan_sink_t sink = {.on_delivered = on_delivered, .on_message = on_message,
                               .on_warning = on_warning, .on_closed = on_closed};
    dk_backchan_opts_t opts = {.tcp_addr = "127.0.0.1", .heartbeat_s = 30, .agents = 2,
                               .ranks_per_node = PER};
    char err[256];
    dk_backchan_t *ch = dk_backchan_new_opts(WORLD, false, payload, big, &sink, &opts, err,
                                             sizeof err);
    cr_assert_not_null(ch, "%s", err);
    agent_t *a = malloc(sizeof *a);
    agent_connect(ch, a, 0);
    stream_t *s = malloc(sizeof *s);
    stream_open(ch, a, s, 1);
    rank_send(a, s, DK_FRAME_HELLO, 1, NULL);
    /* Gather the relayed bytes, then open the one frame. */
    size_t cap = big + 4096, have = 0;
    unsigned char *buf = malloc(cap);
    dk_frame_msg_t m;
    long took = 0;
    const char *why = NULL;
    while ((took = dk_frame_open(&s->side, buf, have, big, &m, NULL, &why)) == 0) {
        dk_frame_msg_t r = agent_next(ch, a);
        cr_assert_eq(r.type, DK_FRAME_RELAY);
        cr_assert_leq(r.len, DK_FRAME_RELAY_MAX);
        cr_assert_leq(have + r.len, cap);
        memcpy(buf + have, r.payload, r.len);
        have += r.len;
    }
    cr_assert_gt(took, 0, "%s", why);
    cr_assert_eq(m.type, DK_FRAME_PAYLOAD);
    cr_assert_eq(m.len, big);
    cr_assert_eq(memcmp(m.payload, payload, big), 0);
    cr_assert_eq(rec.delivered[1], 1);
    agent_close(a);
    dk_backchan_destroy(&ch);
    free(buf);
    free(s);
    free(a);
    free(payload);
}
