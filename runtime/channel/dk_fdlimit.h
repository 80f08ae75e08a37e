/*
 * dk_fdlimit: file descriptors, the one resource a kernel runs out of first.
 *
 * A kernel holds a descriptor per frontend connection and, during a
 * distributed run, five per rank (see dk_fdlimit_job_need). Distributions
 * start processes with a soft limit of 1024 and a much higher hard limit, so
 * the kernel raises its soft limit to the hard one at start (what the hard
 * limit is for), and a run is refused before anything starts when it could not
 * have the descriptors it needs, rather than failing at some rank part-way.
 */
#ifndef DK_FDLIMIT_H
#define DK_FDLIMIT_H

#include <stdbool.h>
#include <stddef.h>

/* Raise the soft RLIMIT_NOFILE to the hard limit. Returns the soft limit now in
 * force (unchanged if it could not be raised), 0 if it cannot be read. */
unsigned long dk_fdlimit_raise(void);

/* Descriptors this process has open now (counted in /proc/self/fd; 0 if that
 * cannot be read). */
size_t dk_fdlimit_open_count(void);

/* Descriptors the runtime holds for a job of WORLD_SIZE ranks at its busiest:
 * per rank its log, the read ends of its stdout and stderr pipes, its pidfd
 * and its back-channel connection; once per job the back channel's listener
 * and pending slots, the wake pipe, and what one rank's spawn holds briefly. */
size_t dk_fdlimit_job_need(int world_size);

/* Whether a job of WORLD_SIZE ranks fits in the soft limit minus what is open.
 * If not, writes what it needs, what is free and what to do into ERR. */
bool dk_fdlimit_job_check(int world_size, char *err, size_t errlen);

#endif
