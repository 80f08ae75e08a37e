/*
 * fuzz_check: what every fuzz target shares.
 *
 * A target proves more than "no crash": it states the promises of the header it
 * drives as checks, and a broken promise aborts, which libFuzzer records as a
 * crash with the input that caused it. FUZZ_CHECK prints which promise broke
 * and where, so a crash report reads as a failed specification, not as a bare
 * SIGABRT.
 *
 * The UTF-8 validator is written here from the Unicode Standard's table 3-7,
 * not borrowed from runtime/base/dk_utf8.c: the targets check that code's output,
 * so they must not judge it by its own rules.
 */
#ifndef FUZZ_CHECK_H
#define FUZZ_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond, ...)                                                          \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "\nFUZZ_CHECK failed at %s:%d: %s\n  ", __FILE__, __LINE__, \
                    #cond);                                                            \
            fprintf(stderr, __VA_ARGS__);                                              \
            fprintf(stderr, "\n");                                                     \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* True when BUF (LEN bytes) is well-formed UTF-8: no overlong forms, no
 * surrogates, nothing above U+10FFFF, no truncated sequence. */
static inline bool fuzz_utf8_valid(const char *buf, size_t len)
{
    const unsigned char *s = (const unsigned char *) buf;
    size_t i = 0;
    while (i < len) {
        unsigned char b = s[i];
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;     /* allowed range of the second byte */
        if (b < 0x80) {
            i++;
            continue;
        } else if (b >= 0xC2 && b <= 0xDF) {
            need = 2;
        } else if (b >= 0xE0 && b <= 0xEF) {
            need = 3;
            if (b == 0xE0)
                lo = 0xA0;
            else if (b == 0xED)
                hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 4;
            if (b == 0xF0)
                lo = 0x90;
            else if (b == 0xF4)
                hi = 0x8F;
        } else {
            return false;
        }
        if (len - i < need)
            return false;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return false;
        for (size_t k = 2; k < need; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
        }
        i += need;
    }
    return true;
}

/* True when the NUL-terminated text in BUF ends within SIZE bytes. */
static inline bool fuzz_terminated(const char *buf, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        if (buf[i] == '\0')
            return true;
    }
    return false;
}

#endif
