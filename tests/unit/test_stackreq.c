/*
 * Asking ranks for their stacks (runtime/stacks/dk_stackreq.h), with children that
 * answer as distkernel-rank does: a ready line with their pid, then on the
 * signal a dump and the end line. Every rank is asked at once, and the wait
 * is bounded whatever the ranks do.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dk_stackreq.h"

#define DUMP "Current thread 0x1 (most recent call first):\n  File \"c.py\", line 6 in <module>\n"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static int child_fd = -1;
static size_t child_repeat = 1;

static void answer(int sig)
{
    (void) sig;
    for (size_t i = 0; i < child_repeat; i++)
        if (write(child_fd, DUMP, strlen(DUMP)) < 0)
            _exit(3);
    if (write(child_fd, DK_STACKS_END, strlen(DK_STACKS_END)) < 0)
        _exit(3);
}

/* SAMPLER_STUCK: a sampler thread that never answers (its main thread holds
 * the GIL), the end's signal answered. */
typedef enum { ANSWERS, SILENT, STARTING, EXITS, BIG, STALE, SAMPLES, SAMPLER_STUCK } kind_t;

#define SAMPLE_DUMP "Current thread 0x2 (most recent call first):\n  File \"c.py\", line 9 in <module>\n"

/* A SAMPLES rank answers the end's signal by exiting (the sample must not
 * use it) and the sample's with a dump of its own. */
static void answer_sample(int sig)
{
    (void) sig;
    if (write(child_fd, SAMPLE_DUMP, strlen(SAMPLE_DUMP)) < 0 ||
        write(child_fd, DK_STACKS_END, strlen(DK_STACKS_END)) < 0)
        _exit(3);
}

/* A rank of KIND in a process group of its own, with PATH its file; returns
 * once it is ready (or, STARTING, once it has started). */
/* The next rank() stays in the test's group rather than leading its own. */
static bool rank_in_our_group;

static pid_t rank(const char *path, kind_t kind)
{
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);   /* a test that fails leaves no rank */
        if (!rank_in_our_group)
            setpgid(0, 0);
        child_fd = open(path, O_WRONLY | O_APPEND | O_CLOEXEC);
        child_repeat = kind == BIG ? 3000 : 1;
        if (kind == SILENT)
            signal(DK_STACKS_SIGNAL, SIG_IGN);
        else if (kind == EXITS || kind == SAMPLES)
            signal(DK_STACKS_SIGNAL, _exit);
        else
            signal(DK_STACKS_SIGNAL, answer);
        if (kind == SAMPLES)
            signal(DK_SAMPLE_SIGNAL, answer_sample);
        if (kind == SAMPLER_STUCK)
            signal(DK_SAMPLE_SIGNAL, SIG_IGN);
        if (kind == SAMPLES || kind == SAMPLER_STUCK)  /* one thread: its id is the pid */
            dprintf(child_fd, DK_STACKS_READY "%d" DK_STACKS_READY_SAMPLER "%d\n",
                    (int) getpid(), (int) getpid());
        else if (kind != STARTING)
            dprintf(child_fd, DK_STACKS_READY "%d\n", (int) getpid());
        if (kind == STALE)
            answer(0);          /* a dump asked for by hand, before the request */
        if (write(ready[1], "r", 1) != 1)
            _exit(4);
        for (;;)
            pause();
    }
    if (!rank_in_our_group)
        setpgid(pid, pid);
    char c;
    cr_assert_eq(read(ready[0], &c, 1), 1);
    close(ready[0]);
    close(ready[1]);
    return pid;
}

static void end(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Poll REQ until its request is over; the seconds it took. */
static double settle(dk_stackreq_t *req, double t0)
{
    while (!dk_stackreq_poll(req, now()))
        usleep(5000);
    return now() - t0;
}

Test(stackreq, every_ready_rank_answers_at_once)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(3, err, sizeof err);
    cr_assert_not_null(req, "%s", err);
    pid_t groups[3];
    for (int r = 0; r < 3; r++)
        groups[r] = rank(dk_stackreq_path(req, r), ANSWERS);
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 5.0), 3);
    cr_assert_lt(settle(req, t0), 1.0, "the answers are seen as they come, not at the deadline");
    for (int r = 0; r < 3; r++) {
        size_t len;
        const char *dump = dk_stackreq_dump(req, r, &len);
        cr_assert_str_eq(dump, DUMP, "rank %d: the dump, without its end line", r);
        cr_assert_eq(len, strlen(DUMP));
        end(groups[r]);
    }
    dk_stackreq_destroy(&req);
    cr_assert_null(req);
}

Test(stackreq, a_rank_that_does_not_answer_is_waited_for_up_to_the_wait)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(2, err, sizeof err);
    pid_t groups[2] = {rank(dk_stackreq_path(req, 0), ANSWERS),
                       rank(dk_stackreq_path(req, 1), SILENT)};
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 0.3), 2);
    double took = settle(req, t0);
    cr_assert(took >= 0.3 && took < 2.0, "took %.2f s", took);
    size_t len;
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), DUMP);
    cr_assert_str_eq(dk_stackreq_dump(req, 1, &len), "");
    cr_assert_eq(len, 0);
    end(groups[0]);
    end(groups[1]);
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_rank_still_starting_is_not_signalled)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(1, err, sizeof err);
    /* Its default action for the signal would end it: it must not get it. */
    pid_t groups[1] = {rank(dk_stackreq_path(req, 0), STARTING)};
    signal(DK_STACKS_SIGNAL, SIG_DFL);
    cr_assert_eq(dk_stackreq_begin(req, groups, now(), 5.0), 0);
    cr_assert(dk_stackreq_poll(req, now()), "nothing to wait for");
    size_t len;
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), "", "asked, without an answer");
    cr_assert_eq(waitpid(groups[0], NULL, WNOHANG), 0, "the rank is still alive");
    end(groups[0]);
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_rank_not_given_is_not_asked)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(2, err, sizeof err);
    pid_t groups[2] = {rank(dk_stackreq_path(req, 0), ANSWERS), 0};
    cr_assert_eq(dk_stackreq_begin(req, groups, now(), 5.0), 1);
    settle(req, now());
    size_t len;
    cr_assert_null(dk_stackreq_dump(req, 1, &len));
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), DUMP);
    end(groups[0]);
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_pid_neither_in_the_ranks_group_nor_leading_one_is_not_signalled)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(1, err, sizeof err);
    rank_in_our_group = true;
    pid_t pid = rank(dk_stackreq_path(req, 0), ANSWERS);
    rank_in_our_group = false;
    /* The ready line's pid is now in another group (the test's) than the one
     * the job started the rank in, and leads none: a pid reused. */
    pid_t groups[1] = {pid};
    cr_assert_eq(dk_stackreq_begin(req, groups, now(), 5.0), 0);
    size_t len;
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), "");
    end(pid);
    dk_stackreq_destroy(&req);
}

/* A warm rank: the job knows its requester's group, and the rank the
 * template forked leads a group (and a session) of its own. */
Test(stackreq, a_rank_leading_its_own_group_is_asked_as_its_requesters)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(1, err, sizeof err);
    pid_t pid = rank(dk_stackreq_path(req, 0), ANSWERS);
    pid_t groups[1] = {getpgrp()};
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 5.0), 1);
    settle(req, t0);
    size_t len;
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), DUMP);
    end(pid);
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_rank_that_exits_is_not_waited_for)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(1, err, sizeof err);
    pid_t groups[1] = {rank(dk_stackreq_path(req, 0), EXITS)};
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 5.0), 1);
    waitpid(groups[0], NULL, 0);
    dk_stackreq_gone(req, 0);
    cr_assert(dk_stackreq_poll(req, now()));
    cr_assert_lt(now() - t0, 2.0);
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_large_dump_keeps_its_tail)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(1, err, sizeof err);
    pid_t groups[1] = {rank(dk_stackreq_path(req, 0), BIG)};
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 5.0), 1);
    cr_assert_lt(settle(req, t0), 4.0, "the end line was found past the cut");
    size_t len;
    const char *dump = dk_stackreq_dump(req, 0, &len);
    cr_assert_leq(len, DK_STACKREQ_KEEP);
    cr_assert_gt(len, DK_STACKREQ_KEEP - strlen(DUMP));
    cr_assert_eq(strlen(dump), len);
    cr_assert_str_eq(dump + len - strlen(DUMP), DUMP, "the tail is kept");
    end(groups[0]);
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_dump_from_before_the_request_is_not_its_answer)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(1, err, sizeof err);
    pid_t groups[1] = {rank(dk_stackreq_path(req, 0), STALE)};
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 5.0), 1);
    settle(req, t0);
    size_t len;
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), DUMP, "one dump: the answer");
    /* Asked again, it answers again, and only the new answer is kept. */
    cr_assert_eq(dk_stackreq_begin(req, groups, now(), 5.0), 1);
    settle(req, now());
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), DUMP);
    end(groups[0]);
    dk_stackreq_destroy(&req);
}

Test(stackreq, destroy_leaves_no_file)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(2, err, sizeof err);
    char path[512];
    snprintf(path, sizeof path, "%s", dk_stackreq_path(req, 1));
    cr_assert_eq(access(path, F_OK), 0);
    char *slash = strrchr(path, '/');
    dk_stackreq_destroy(&req);
    cr_assert_neq(access(path, F_OK), 0);
    *slash = '\0';
    cr_assert_neq(access(path, F_OK), 0, "the folder %s is gone too", path);
}

Test(stackreq, a_rank_asked_over_the_channel_is_waited_for_until_it_answers)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(2, err, sizeof err);
    pid_t groups[2] = {rank(dk_stackreq_path(req, 0), ANSWERS), DK_STACKREQ_BY_CHANNEL};
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 5.0), 2);
    for (int i = 0; i < 20; i++) {
        cr_assert_not(dk_stackreq_poll(req, now()), "rank 1 has not answered yet");
        usleep(5000);
    }
    dk_stackreq_answer(req, 1, DUMP, strlen(DUMP));
    cr_assert(dk_stackreq_poll(req, now()));
    size_t len;
    cr_assert_str_eq(dk_stackreq_dump(req, 1, &len), DUMP);
    cr_assert_eq(len, strlen(DUMP));
    /* A late answer, or one nobody asked for, changes nothing. */
    dk_stackreq_answer(req, 1, "late", 4);
    dk_stackreq_answer(req, 0, "stranger", 8);
    cr_assert_str_eq(dk_stackreq_dump(req, 1, &len), DUMP);
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), DUMP);
    end(groups[0]);
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_long_answer_over_the_channel_keeps_its_tail)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(1, err, sizeof err);
    pid_t groups[1] = {DK_STACKREQ_BY_CHANNEL};
    cr_assert_eq(dk_stackreq_begin(req, groups, now(), 5.0), 1);
    size_t big = DK_STACKREQ_KEEP + 100;
    char *dump = malloc(big);
    memset(dump, 'a', big);
    memcpy(dump + big - 3, "end", 3);
    dk_stackreq_answer(req, 0, dump, big);
    free(dump);
    size_t len;
    const char *kept = dk_stackreq_dump(req, 0, &len);
    cr_assert_eq(len, DK_STACKREQ_KEEP);
    cr_assert_str_eq(kept + len - 3, "end");
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_live_sample_uses_its_own_signal_and_not_the_ends)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(2, err, sizeof err);
    cr_assert_not_null(req, "%s", err);
    pid_t groups[2];
    for (int r = 0; r < 2; r++)
        groups[r] = rank(dk_stackreq_path(req, r), SAMPLES);
    double t0 = now();
    cr_assert_eq(dk_stackreq_sample(req, groups, t0, 5.0), 2);
    cr_assert_lt(settle(req, t0), 1.0);
    for (int r = 0; r < 2; r++) {
        size_t len;
        cr_assert_str_eq(dk_stackreq_dump(req, r, &len), SAMPLE_DUMP, "rank %d", r);
        int status;
        cr_assert_eq(waitpid(groups[r], &status, WNOHANG), 0, "rank %d got the end's signal", r);
        end(groups[r]);
    }
    dk_stackreq_destroy(&req);
}

Test(stackreq, a_rank_without_a_sampler_thread_is_not_sampled)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(1, err, sizeof err);
    cr_assert_not_null(req, "%s", err);
    pid_t groups[1] = {rank(dk_stackreq_path(req, 0), ANSWERS)};
    cr_assert_eq(dk_stackreq_sample(req, groups, now(), 5.0), 0);
    cr_assert_not(dk_stackreq_running(req));
    int status;
    cr_assert_eq(waitpid(groups[0], &status, WNOHANG), 0, "the rank is still there");
    end(groups[0]);
    dk_stackreq_destroy(&req);
}

Test(stackreq, an_end_asks_a_ranks_sampler_first)
{
    /* The sampler answers with the GIL, so its answer can hold the rank's
     * last collective; the end's signal (which these ranks die of) is not
     * sent when it answers. */
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(2, err, sizeof err);
    cr_assert_not_null(req, "%s", err);
    pid_t groups[2];
    for (int r = 0; r < 2; r++)
        groups[r] = rank(dk_stackreq_path(req, r), SAMPLES);
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 5.0), 2);
    cr_assert_lt(settle(req, t0), 1.0);
    for (int r = 0; r < 2; r++) {
        size_t len;
        cr_assert_str_eq(dk_stackreq_dump(req, r, &len), SAMPLE_DUMP, "rank %d", r);
        int status;
        cr_assert_eq(waitpid(groups[r], &status, WNOHANG), 0, "rank %d got the end's signal", r);
        end(groups[r]);
    }
    dk_stackreq_destroy(&req);
}

Test(stackreq, an_end_whose_sampler_is_silent_signals_the_rank_within_the_wait)
{
    char err[256];
    dk_stackreq_t *req = dk_stackreq_new(2, err, sizeof err);
    cr_assert_not_null(req, "%s", err);
    pid_t groups[2] = {rank(dk_stackreq_path(req, 0), SAMPLER_STUCK),
                       rank(dk_stackreq_path(req, 1), SAMPLES)};
    double t0 = now();
    cr_assert_eq(dk_stackreq_begin(req, groups, t0, 2.0), 2);
    double took = settle(req, t0);
    cr_assert_geq(took, 0.5, "the sampler had a quarter of the wait (%.3f s)", took);
    cr_assert_lt(took, 2.0, "the signal's answer ended the wait (%.3f s)", took);
    size_t len;
    cr_assert_str_eq(dk_stackreq_dump(req, 0, &len), DUMP);
    cr_assert_str_eq(dk_stackreq_dump(req, 1, &len), SAMPLE_DUMP);
    for (int r = 0; r < 2; r++)
        end(groups[r]);
    dk_stackreq_destroy(&req);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, stackreq_takes_null)
{
    dk_stackreq_destroy(NULL);
    dk_stackreq_t *none = NULL;
    dk_stackreq_destroy(&none);
    cr_assert_null(none);
}
