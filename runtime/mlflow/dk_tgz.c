/*
 * dk_tgz: a gzip'd tar archive, made in memory. See dk_tgz.h.
 */
#include "dk_tgz.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define BLOCK 512

struct dk_tgz_t {
    z_stream z;
    unsigned char *out;
    size_t len, cap;
    bool failed;
};

/* Deflate LEN bytes at DATA (FLUSH: Z_NO_FLUSH or Z_FINISH) into OUT. */
static bool put(dk_tgz_t *t, const void *data, size_t len, int flush)
{
    t->z.next_in = (Bytef *) data;
    t->z.avail_in = (uInt) len;
    for (;;) {
        if (t->cap - t->len < 65536) {
            size_t ncap = t->cap * 2 + 65536;
            unsigned char *more = realloc(t->out, ncap);
            if (!more)
                return false;
            t->out = more;
            t->cap = ncap;
        }
        t->z.next_out = t->out + t->len;
        t->z.avail_out = (uInt) (t->cap - t->len);
        int rc = deflate(&t->z, flush);
        t->len = t->cap - t->z.avail_out;
        if (rc == Z_STREAM_ERROR)
            return false;
        if (flush == Z_FINISH ? rc == Z_STREAM_END : t->z.avail_in == 0)
            return true;
    }
}

dk_tgz_t *dk_tgz_new(void)
{
    dk_tgz_t *t = calloc(1, sizeof *t);
    /* windowBits 15 + 16: a gzip header and trailer around the deflate stream */
    if (t && deflateInit2(&t->z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
        free(t);
        return NULL;
    }
    return t;
}

/* V in octal, WIDTH - 1 digits and a NUL (V fits: callers check). */
static void octal(char *field, size_t width, unsigned long long v)
{
    for (size_t i = width - 1; i-- > 0; v >>= 3)
        field[i] = (char) ('0' + (v & 7));
    field[width - 1] = '\0';
}

bool dk_tgz_add(dk_tgz_t *t, const char *name, const void *data, size_t len, long long mtime)
{
    size_t nl = name ? strlen(name) : 0;
    if (t->failed || nl == 0 || nl > 100 || name[0] == '/' || strstr(name, "..") ||
        len > 077777777777ULL) {
        t->failed = true;
        return false;
    }
    unsigned char h[BLOCK];
    memset(h, 0, sizeof h);
    memcpy(h, name, nl);                            /* name[100] */
    octal((char *) h + 100, 8, 0644);               /* mode */
    octal((char *) h + 108, 8, 0);                  /* uid */
    octal((char *) h + 116, 8, 0);                  /* gid */
    octal((char *) h + 124, 12, len);               /* size */
    octal((char *) h + 136, 12, mtime > 0 ? (unsigned long long) mtime : 0);
    h[156] = '0';                                   /* a regular file */
    memcpy(h + 257, "ustar", 6);                    /* magic, then version "00" */
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);                        /* the checksum counts itself as spaces */
    unsigned sum = 0;
    for (size_t i = 0; i < sizeof h; i++)
        sum += h[i];
    snprintf((char *) h + 148, 8, "%06o", sum);     /* six digits, NUL, and the space kept */
    h[155] = ' ';
    static const unsigned char zeros[BLOCK];
    size_t pad = (BLOCK - len % BLOCK) % BLOCK;
    if (!put(t, h, sizeof h, Z_NO_FLUSH) || (len && !put(t, data, len, Z_NO_FLUSH)) ||
        (pad && !put(t, zeros, pad, Z_NO_FLUSH)))
        t->failed = true;
    return !t->failed;
}

unsigned char *dk_tgz_finish(dk_tgz_t *t, size_t *len)
{
    static const unsigned char end[2 * BLOCK];
    unsigned char *out = NULL;
    if (t && !t->failed && put(t, end, sizeof end, Z_FINISH)) {
        out = t->out;
        *len = t->len;
        t->out = NULL;
    }
    dk_tgz_destroy(t);
    return out;
}

void dk_tgz_destroy(dk_tgz_t *t)
{
    if (!t)
        return;
    deflateEnd(&t->z);
    free(t->out);
    free(t);
}
