/*
 * dk_random: names that must not collide (a run's id, a Slurm job's name),
 * made one way. Header-only, like dk_clock.h.
 *
 * The bytes come from getrandom(2), which needs no descriptor: a kernel at
 * its descriptor limit (where opening /dev/urandom fails) still gets a fresh
 * name. Should getrandom fail (ENOSYS before Linux 3.17), the name is made
 * from the monotonic clock, the pid and a counter, so it is still unique on
 * this host, never a constant. Secrets (keys, nonces) are not names: they
 * come from OpenSSL's RAND_bytes, which fails rather than falls back.
 */
#ifndef DK_RANDOM_H
#define DK_RANDOM_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* N bytes from getrandom into BUF; false when it cannot give them. */
static inline bool dk_random_bytes(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = getrandom(p, n, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return false;
        p += got;
        n -= (size_t) got;
    }
    return true;
}

/* What dk_unique_hex uses where getrandom fails: NBYTES bytes of a
 * splitmix64 stream seeded by the monotonic clock's nanoseconds, the pid and
 * a counter of this process, so that two calls (in one process, or in two
 * at once) differ with overwhelming likelihood, and never by chance alone. */
static inline void dk_clock_bytes(unsigned char *b, size_t nbytes)
{
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = ((uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec) ^
                 ((uint64_t) getpid() << 40) ^
                 (atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15u);
    for (size_t i = 0; i < nbytes; i += 8) {
        uint64_t z = (x += 0x9e3779b97f4a7c15u);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
        z ^= z >> 31;
        for (size_t k = 0; k < 8 && i + k < nbytes; k++)
            b[i + k] = (unsigned char) (z >> (8 * k));
    }
}

/* 2 * NBYTES lowercase hex digits and a NUL into OUT (NBYTES at most 32):
 * random, or dk_clock_bytes where no random bytes can be had. */
static inline void dk_unique_hex(char *out, size_t nbytes)
{
    unsigned char b[32];
    nbytes = nbytes > sizeof b ? sizeof b : nbytes;
    if (!dk_random_bytes(b, nbytes))
        dk_clock_bytes(b, nbytes);
    for (size_t i = 0; i < nbytes; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
    out[2 * nbytes] = '\0';
}

#endif
