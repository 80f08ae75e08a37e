/*
 * dk_utf8: holding back split characters and replacing invalid bytes.
 *
 * Both functions walk the same table of well-formed UTF-8 (The Unicode
 * Standard, table 3-7): the lead byte fixes the length, and the second byte's
 * range is what excludes overlongs (E0 80..9F, F0 80..8F), surrogates
 * (ED A0..BF) and code points above U+10FFFF (F4 90..BF). Leads C0, C1 and
 * F5..FF never start a character.
 *
 * Replacement follows the "maximal subpart" practice that Unicode recommends and
 * Python's decoder implements: a truncated but so-far-valid prefix becomes one
 * U+FFFD, and each byte that cannot continue or start a sequence becomes its
 * own. So the text a user sees matches what `bytes.decode(errors="replace")`
 * would show for the same output. NUL is replaced too: the string goes through C
 * APIs that would cut it there.
 *
 * Most output is ASCII, so sanitizing first scans for the first byte that is not
 * plain ASCII and copies everything before it in one memcpy.
 */
#include "dk_utf8.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef enum { SEQ_VALID, SEQ_INVALID, SEQ_TRUNCATED } seq_status_t;

static const unsigned char replacement[3] = {0xEF, 0xBF, 0xBD};    /* U+FFFD */

/* Bytes in the sequence LEAD starts; 0 if LEAD cannot start one. */
static size_t seq_len(unsigned char lead)
{
    if (lead < 0x80)
        return 1;
    if (lead >= 0xC2 && lead <= 0xDF)
        return 2;
    if (lead >= 0xE0 && lead <= 0xEF)
        return 3;
    if (lead >= 0xF0 && lead <= 0xF4)
        return 4;
    return 0;
}

static bool second_ok(unsigned char lead, unsigned char b)
{
    switch (lead) {
    case 0xE0: return b >= 0xA0 && b <= 0xBF;   /* no overlong 3-byte forms */
    case 0xED: return b >= 0x80 && b <= 0x9F;   /* no surrogates */
    case 0xF0: return b >= 0x90 && b <= 0xBF;   /* no overlong 4-byte forms */
    case 0xF4: return b >= 0x80 && b <= 0x8F;   /* nothing above U+10FFFF */
    default: return b >= 0x80 && b <= 0xBF;
    }
}

/* Classify the sequence at S (N > 0 bytes available). *USED gets its length
 * when valid, the length of the maximal invalid subpart when invalid, or N
 * when the bytes are a valid start cut off by the end of the buffer. */
static seq_status_t scan_seq(const unsigned char *s, size_t n, size_t *used)
{
    size_t need = seq_len(s[0]);
    if (need == 0) {
        *used = 1;
        return SEQ_INVALID;
    }
    for (size_t k = 1; k < need; k++) {
        if (k >= n) {
            *used = n;
            return SEQ_TRUNCATED;
        }
        bool ok = k == 1 ? second_ok(s[0], s[k]) : (s[k] & 0xC0) == 0x80;
        if (!ok) {
            *used = k;
            return SEQ_INVALID;
        }
    }
    *used = need;
    return SEQ_VALID;
}

size_t dk_utf8_complete_prefix(const char *buf, size_t len)
{
    const unsigned char *s = (const unsigned char *) buf;
    /* A sequence is at most 4 bytes, so an incomplete one starts within the last 3. */
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        size_t start = len - back;
        if ((s[start] & 0xC0) == 0x80)
            continue;   /* a continuation byte: its lead is further back */
        size_t used;
        if (scan_seq(s + start, back, &used) == SEQ_TRUNCATED)
            return start;
        return len;
    }
    return len;
}

size_t dk_utf8_valid_prefix(const char *buf, size_t len)
{
    const unsigned char *s = (const unsigned char *) buf;
    size_t i = 0;
    while (i < len) {
        if (s[i] != 0 && s[i] < 0x80) {
            i++;
            continue;
        }
        size_t used;
        if (s[i] == 0 || scan_seq(s + i, len - i, &used) != SEQ_VALID)
            return i;
        i += used;
    }
    return len;
}

char *dk_utf8_sanitize(const char *buf, size_t len, size_t *out_len)
{
    const unsigned char *s = (const unsigned char *) buf;
    size_t ascii = 0;
    while (ascii < len && s[ascii] != 0 && s[ascii] < 0x80)
        ascii++;

    /* Every input byte yields at most 3 output bytes (one U+FFFD). */
    size_t cap = ascii == len ? len + 1 : 0;
    if (ascii < len) {
        if (len > (SIZE_MAX - 1) / 3)
            return NULL;
        cap = len * 3 + 1;
    }
    unsigned char *out = malloc(cap);
    if (!out)
        return NULL;
    if (ascii > 0)
        memcpy(out, s, ascii);

    size_t o = ascii;
    for (size_t i = ascii; i < len;) {
        unsigned char b = s[i];
        if (b != 0 && b < 0x80) {
            out[o++] = b;
            i++;
            continue;
        }
        size_t used = 1;
        if (b != 0 && scan_seq(s + i, len - i, &used) == SEQ_VALID) {
            memcpy(out + o, s + i, used);
            o += used;
        } else {
            memcpy(out + o, replacement, sizeof replacement);
            o += sizeof replacement;
        }
        i += used;
    }
    out[o] = '\0';
    if (o + 1 < cap) {
        unsigned char *shrunk = realloc(out, o + 1);
        if (shrunk)
            out = shrunk;
    }
    if (out_len)
        *out_len = o;
    return (char *) out;
}
