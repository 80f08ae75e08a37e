/*
 * dk_agent_stacks: a node agent's answers to the kernel's requests for its
 * ranks' stacks (dk_stackreq.h does the asking on this node). See dk_agent.h.
 */
#include "dk_agent_state.h"

#include "dk_clock.h"
#include "dk_frame.h"

#include <stdlib.h>

/* Ask the ranks marked stacks_wanted at once (dk_stackreq.h), or, when none
 * is, those marked sample_wanted for a live sample: DK_SAMPLE_SIGNAL to each
 * one's sampler thread (tgkill), which interrupts no system call of the
 * rank's, where the ending dump's DK_STACKS_SIGNAL goes to the process. */
void agent_stacks_begin(agent_t *a)
{
    if (!a->stacks || dk_stackreq_running(a->stacks))
        return;
    pid_t *groups = calloc(a->n > 0 ? (size_t) a->n : 1, sizeof *groups);
    if (!groups)
        return;
    bool ending = false;
    for (int i = 0; i < a->n; i++)
        ending |= a->ranks[i].stacks_wanted && !a->ranks[i].exited && a->ranks[i].pid > 0;
    int asked = 0;
    for (int i = 0; i < a->n; i++) {
        lrank_t *rk = &a->ranks[i];
        bool *wanted = ending ? &rk->stacks_wanted : &rk->sample_wanted;
        rk->stacks_asked = *wanted && !rk->exited && rk->pid > 0;
        *wanted = false;
        if (ending && rk->stacks_asked)
            rk->sample_wanted = false;  /* the ending dump answers the sample too */
        if (rk->stacks_asked) {
            groups[i] = rk->pid;
            asked++;
        }
    }
    if (asked && ending)
        dk_stackreq_begin(a->stacks, groups, dk_now_s(), a->spec->stacks_wait_s);
    else if (asked)
        dk_stackreq_sample(a->stacks, groups, dk_now_s(), a->spec->stacks_wait_s);
    free(groups);
}

/* The running request is over: every asked rank's dump, "" when it gave none. */
void agent_stacks_send(agent_t *a)
{
    for (int i = 0; i < a->n; i++) {
        lrank_t *rk = &a->ranks[i];
        if (!rk->stacks_asked)
            continue;
        rk->stacks_asked = false;
        size_t len = 0;
        const char *dump = dk_stackreq_dump(a->stacks, i, &len);
        if (!dump)      /* not signalled (no ready line, no sampler): "" */
            dump = "", len = 0;
        if (len > DK_FRAME_STACKS_MAX) {
            dump += len - DK_FRAME_STACKS_MAX;
            len = DK_FRAME_STACKS_MAX;
        }
        agent_send_frame(a, DK_FRAME_STACKS, (uint32_t) rk->rank, dump, len);
    }
    bool more = false;
    for (int i = 0; i < a->n; i++)
        more |= a->ranks[i].stacks_wanted || a->ranks[i].sample_wanted;
    if (more)
        agent_stacks_begin(a);
}

void agent_want_stacks(agent_t *a, uint32_t id, bool sample)
{
    for (int i = 0; i < a->n; i++) {
        lrank_t *rk = &a->ranks[i];
        if ((id == DK_FRAME_ALL_RANKS || id == (uint32_t) rk->rank) && !rk->exited) {
            if (!a->stacks || rk->pid <= 0)     /* none, or not started yet: "" */
                agent_send_frame(a, DK_FRAME_STACKS, (uint32_t) rk->rank, NULL, 0);
            else if (sample)
                rk->sample_wanted = true;
            else
                rk->stacks_wanted = true;
        }
    }
    agent_stacks_begin(a);
}
