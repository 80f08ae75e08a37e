/*
 * dk_agent_state: one node agent's state, shared by the files that run it.
 *
 * Private to runtime/agent/ (dk_agent.h is the API): dk_agent.c is the poll
 * loop, the ranks and the kernel's connection; dk_agent_stacks.c answers the
 * kernel's requests for the ranks' stacks.
 */
#ifndef DK_AGENT_STATE_H
#define DK_AGENT_STATE_H

#include "dk_agent.h"
#include "dk_frame.h"
#include "dk_relay.h"
#include "dk_stackreq.h"
#include "dk_stop.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct {
    int rank;               /* its rank in the run */
    pid_t pid;              /* -1: not started */
    int pidfd;
    int pipes[2];           /* stdout, stderr read ends; -1 at EOF */
    bool exited;            /* reaped and its EXIT sent (or the kernel is gone) */
    bool stacks_wanted;     /* a STACKS request waits for the running one to end */
    bool sample_wanted;     /* ... a live sample's (DK_FRAME_STACKS_SAMPLE) */
    bool stacks_asked;      /* asked in the running request */
    uint64_t pending_sigs;  /* SIGNALs that came before it started (bit = signal) */
} lrank_t;

typedef struct {
    const dk_agent_spec_t *spec;
    dk_frame_key_t *key;    /* the run's key, its HMAC set up once */
    dk_frame_side_t side;   /* the kernel's connection: nonce, directions, counts */
    int fd;
    lrank_t *ranks;
    int n, live;
    unsigned char *in;
    size_t in_len, in_cap;
    double heartbeat_s;
    double heard_at, pinged_at;
    bool gone;              /* the kernel closed, went silent, or took nothing */
    bool shut;              /* every rank told: our side is shut, awaiting the close */
    double shut_at;
    dk_stop_t stop;
    dk_stackreq_t *stacks;
    int sentinel_pid, sentinel_fd;
    dk_relay_t *relay;      /* the ranks' connections (NULL: each its own to the kernel) */
    unsigned char *out;     /* sealed frames not yet written */
    size_t out_len, out_cap;
} agent_t;

/* Queue a frame for the kernel (written at the end of the loop's turn). */
void agent_send_frame(agent_t *a, int type, uint32_t id, const void *payload, size_t len);

/* dk_agent_stacks.c */
void agent_stacks_begin(agent_t *a);
void agent_stacks_send(agent_t *a);
void agent_want_stacks(agent_t *a, uint32_t id, bool sample);

#endif
