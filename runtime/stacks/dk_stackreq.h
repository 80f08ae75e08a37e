/*
 * dk_stackreq: ask a job's ranks for their Python stacks before they are ended.
 *
 * A hung run is explained by where each rank was when it was stopped (see
 * dk_stacks.h for what is made of the dumps). Each rank of this node gets a
 * file of its own in a private folder this object makes (DK_STACKS_ENV names
 * it in the rank's environment). distkernel-rank opens it at start and arms
 * faulthandler on DK_STACKS_SIGNAL with it (python/distkernel/_rankstacks.py,
 * runtime/rank/dk_rankstacks.h), then writes one line, DK_STACKS_READY and its
 * pid. On the signal, faulthandler writes every thread's stack from the
 * signal handler, without the GIL, so a rank answers while its main thread
 * sleeps in a C call (time.sleep, a collective) or holds the GIL in a C loop;
 * the handler it chains to writes DK_STACKS_END after the dump, so the
 * caller knows a dump is whole without waiting out a silence.
 *
 * An end (dk_stackreq_begin) asks a rank that has a sampler thread (below)
 * through it first, since only an answer made with the GIL can end in the
 * rank's last collective (torch's flight recorder, dk_stacks.h); a rank
 * whose sampler has written nothing by a quarter of the wait gets
 * DK_STACKS_SIGNAL then.
 *
 * A live sample (dk_stackreq_sample, while the ranks run on) must not
 * disturb them, and a signal a thread takes makes that thread's blocking
 * system call return EINTR, which some C code takes for an error (torch's
 * rendezvous does: "Interrupted system call"). So a sample is another
 * signal, DK_SAMPLE_SIGNAL, sent with tgkill to a thread of the rank's own
 * (named in its ready line), which blocks it and takes it with sigwait, then
 * dumps every thread's stack with the GIL (python/distkernel/_rankstacks.py) and
 * the end line. No other thread blocks or takes it, so nothing of the
 * rank's changes for the programs it starts (their signal mask and
 * dispositions stay the defaults).
 *
 * Why a real-time signal: SIGUSR1 and SIGUSR2 are the user's and their
 * tools' (Slurm's --signal, Lightning's requeue, faulthandler or py-spy set
 * up by hand); real-time signals carry no convention, are not merged with
 * another pending one of another number, and a process has about 30 of them.
 * glibc keeps the first two for itself, so this one is counted from the top.
 *
 * The signal goes to the pid the rank wrote (a warm rank is the template's
 * child, not the process the job started), and only while that pid is still
 * in the rank's process group: a rank that is gone and whose pid was reused
 * by another process is not signalled. A rank that has not written its
 * ready line yet (still starting) is not signalled at all: a real-time
 * signal's default action ends a process.
 *
 * A rank on another node cannot be signalled from here: its caller asks its
 * node's agent over the back channel (DK_FRAME_STACKS, dk_frame.h), which
 * asks the rank as this file does and sends the answer back, and hands it
 * in (dk_stackreq_answer); the request waits for those ranks as for the
 * others.
 *
 * A request asks every rank it is given at once and waits for all of them
 * together, bounded by the wait given (about 2 s at any world size), reading
 * each file from where it ended before the signal. A rank that does not
 * answer in time keeps what it wrote by then. Bounded memory: each dump is
 * kept up to DK_STACKREQ_KEEP bytes, its tail (where the main thread is).
 *
 * Not thread-safe: one caller (the job's runtime thread). No signal handler
 * of the caller's is involved; the caller polls (dk_stackreq_poll) as often
 * as dk_stackreq_next_at says.
 */
#ifndef DK_STACKREQ_H
#define DK_STACKREQ_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The signal a rank dumps its stacks on. */
#define DK_STACKS_SIGNAL (SIGRTMAX - 7)
/* The signal of a live sample (dk_stackreq_sample): sent to the rank's
 * sampler thread alone, which blocks it and takes it with sigwait, then dumps
 * with the GIL; so no system call of the rank's is interrupted. */
#define DK_SAMPLE_SIGNAL (SIGRTMAX - 6)
/* The environment variable naming a rank's stacks file. */
#define DK_STACKS_ENV "DISTKERNEL_STACKS"
/* The line a rank writes once armed, followed by its pid, then
 * DK_STACKS_READY_SAMPLER and its sampler thread's id when it has one, and
 * "\n". */
#define DK_STACKS_READY "distkernel stacks: ready, pid "
#define DK_STACKS_READY_SAMPLER ", sampler "
/* The line written after each dump. */
#define DK_STACKS_END "distkernel stacks: end\n"
/* How long a request waits for the ranks (s), when the caller gives 0. */
#define DK_STACKREQ_WAIT_S 2.0
/* The bytes of one rank's dump kept (its tail). */
#define DK_STACKREQ_KEEP ((size_t) 128 << 10)
/* How often files are looked at while a request waits (s). */
#define DK_STACKREQ_TICK_S 0.01

typedef struct dk_stackreq_t dk_stackreq_t;

/* A fresh private folder with an empty file for each of WORLD ranks. NULL
 * with a reason in ERR when it cannot be made. */
dk_stackreq_t *dk_stackreq_new(int world, char *err, size_t errlen);

/* Remove the files and the folder; free. Sets *SELF_P to NULL. */
void dk_stackreq_destroy(dk_stackreq_t **self_p);

/* The path of RANK's file (borrowed), for DK_STACKS_ENV. */
const char *dk_stackreq_path(const dk_stackreq_t *self, int rank);

/* GROUPS[R] for a rank the caller asked itself (over the back channel). */
#define DK_STACKREQ_BY_CHANNEL ((pid_t) -1)

/* Ask every rank R with GROUPS[R] > 0 (its process group: the pid the job
 * started) for its stacks now (NOW, seconds of any monotonic clock; its
 * sampler thread first, DK_STACKS_SIGNAL when it has none or it is silent
 * past a quarter of the wait, see the top), and
 * wait for those with DK_STACKREQ_BY_CHANNEL as well (dk_stackreq_answer);
 * wait at most WAIT_S (<= 0: DK_STACKREQ_WAIT_S). The previous request's
 * dumps are forgotten. Returns how many ranks are waited for (0: the
 * request is over at once). */
int dk_stackreq_begin(dk_stackreq_t *self, const pid_t *groups, double now, double wait_s);

/* The same for a live sample, while the ranks run on: the sampler thread of
 * each rank of this node gets DK_SAMPLE_SIGNAL, which no system call of the
 * rank's sees (a rank without a sampler is not asked) (the dump waits
 * for the GIL, so a rank holding it in a C loop does not answer; the end's
 * request, dk_stackreq_begin, still reaches it). */
int dk_stackreq_sample(dk_stackreq_t *self, const pid_t *groups, double now, double wait_s);

/* Read what the asked ranks wrote. True when the request is over: every
 * asked rank has answered or is gone, or the wait has passed (or none is
 * running). */
bool dk_stackreq_poll(dk_stackreq_t *self, double now);

/* Whether a request is running (begun, not yet over). */
bool dk_stackreq_running(const dk_stackreq_t *self);

/* When to poll next: within DK_STACKREQ_TICK_S of NOW, and at the end of
 * the wait; a negative value when no request runs. */
double dk_stackreq_next_at(const dk_stackreq_t *self, double now);

/* RANK's answer over the back channel (LEN bytes of dump, its tail kept),
 * for a rank the running request waits for by channel; ignored otherwise
 * (a late answer, one nobody asked for). */
void dk_stackreq_answer(dk_stackreq_t *self, int rank, const void *dump, size_t len);

/* RANK has exited: the request does not wait for it. */
void dk_stackreq_gone(dk_stackreq_t *self, int rank);

/* End the running request now, with what has been read. */
void dk_stackreq_end(dk_stackreq_t *self);

/* The last request's dump of RANK (borrowed, NUL-terminated, *LEN bytes;
 * the end line left out), "" when it was asked and wrote nothing; NULL when
 * it was not asked. Valid until the next dk_stackreq_begin. */
const char *dk_stackreq_dump(const dk_stackreq_t *self, int rank, size_t *len);

/* Forget the last request's dumps (no rank was asked). */
void dk_stackreq_clear(dk_stackreq_t *self);

#endif
