/*
 * dk_be32: 32-bit big-endian integers in a byte buffer, as the back
 * channel's and the node agent's frames carry their lengths and kinds.
 * Header-only, like dk_clock.h, so every layer can use it without a link
 * dependency.
 */
#ifndef DK_BE32_H
#define DK_BE32_H

#include <stdint.h>

static inline void dk_put_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char) (v >> 24);
    p[1] = (unsigned char) (v >> 16);
    p[2] = (unsigned char) (v >> 8);
    p[3] = (unsigned char) v;
}

static inline uint32_t dk_get_be32(const unsigned char *p)
{
    return (uint32_t) p[0] << 24 | (uint32_t) p[1] << 16 | (uint32_t) p[2] << 8 | p[3];
}

#endif
