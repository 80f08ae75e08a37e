/*
 * Turning output bytes into JSON-safe text (runtime/base/dk_utf8.h). Expected
 * replacements are what Python's bytes.decode("utf-8", "replace") gives.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "dk_utf8.h"

#define FFFD "\xef\xbf\xbd"

static size_t prefix(const char *s)
{
    return dk_utf8_complete_prefix(s, strlen(s));
}

/* Sanitize LEN bytes of IN and compare with the NUL-terminated EXPECTED. */
static void expect_sanitized(const char *in, size_t len, const char *expected)
{
    size_t out_len = 12345;
    char *out = dk_utf8_sanitize(in, len, &out_len);
    cr_assert_not_null(out);
    cr_assert_str_eq(out, expected);
    cr_assert_eq(out_len, strlen(expected));
    free(out);
}

/* ---- holding back split characters ---- */

Test(complete_prefix, ascii_is_always_complete)
{
    cr_assert_eq(prefix("hello\n"), 6);
    cr_assert_eq(prefix(""), 0);
}

Test(complete_prefix, holds_back_a_split_two_byte_sequence)
{
    cr_assert_eq(prefix("caf\xc3"), 3);          /* é = C3 A9 */
    cr_assert_eq(prefix("caf\xc3\xa9"), 5);
}

Test(complete_prefix, holds_back_a_split_three_byte_sequence)
{
    cr_assert_eq(prefix("x\xe2"), 1);            /* € = E2 82 AC */
    cr_assert_eq(prefix("x\xe2\x82"), 1);
    cr_assert_eq(prefix("x\xe2\x82\xac"), 4);
}

Test(complete_prefix, holds_back_a_split_four_byte_sequence)
{
    cr_assert_eq(prefix("\xf0"), 0);             /* 😀 = F0 9F 98 80 */
    cr_assert_eq(prefix("\xf0\x9f"), 0);
    cr_assert_eq(prefix("\xf0\x9f\x98"), 0);
    cr_assert_eq(prefix("\xf0\x9f\x98\x80"), 4);
}

Test(complete_prefix, does_not_hold_back_an_invalid_tail)
{
    cr_assert_eq(prefix("a\xff"), 2);            /* never a lead byte */
    cr_assert_eq(prefix("a\xc0"), 2);            /* overlong lead */
    cr_assert_eq(prefix("a\x80"), 2);            /* stray continuation */
    cr_assert_eq(prefix("a\xe0\x80"), 3);        /* overlong 3-byte start */
    cr_assert_eq(prefix("a\xed\xa0"), 3);        /* surrogate start */
    cr_assert_eq(prefix("a\xf4\x90"), 3);        /* above U+10FFFF */
    cr_assert_eq(prefix("a\xe2\x41"), 3);        /* lead cut by ASCII */
    cr_assert_eq(prefix("\x80\x80\x80\x80"), 4); /* no lead within reach */
}

Test(complete_prefix, chunks_joined_at_the_prefix_reassemble_the_text)
{
    const char *text = "h\xc3\xa9llo \xe2\x82\xac 1 \xf0\x9f\x98\x80!";
    size_t len = strlen(text);
    for (size_t chunk = 1; chunk <= 5; chunk++) {
        char out[64] = "";
        char carry[8];
        size_t carried = 0, o = 0;
        for (size_t i = 0; i < len; i += chunk) {
            char buf[16];
            size_t n = len - i < chunk ? len - i : chunk;
            memcpy(buf, carry, carried);
            memcpy(buf + carried, text + i, n);
            n += carried;
            size_t keep = dk_utf8_complete_prefix(buf, n);
            cr_assert_leq(n - keep, 3);
            char *clean = dk_utf8_sanitize(buf, keep, NULL);
            memcpy(out + o, clean, strlen(clean));
            o += strlen(clean);
            free(clean);
            carried = n - keep;
            memcpy(carry, buf + keep, carried);
        }
        cr_assert_eq(carried, 0);
        cr_assert_str_eq(out, text, "chunk size %zu", chunk);
    }
}

/* ---- replacing what is not UTF-8 ---- */

Test(sanitize, copies_ascii_unchanged)
{
    expect_sanitized("plain text\n", 11, "plain text\n");
    expect_sanitized("", 0, "");
}

Test(sanitize, keeps_valid_multibyte_characters)
{
    const char *s = "\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf";  /* up to U+10FFFF */
    expect_sanitized(s, strlen(s), s);
}

Test(sanitize, replaces_invalid_bytes)
{
    expect_sanitized("a\xff" "b", 3, "a" FFFD "b");
    expect_sanitized("\x80\x80", 2, FFFD FFFD);
}

Test(sanitize, replaces_overlong_forms)
{
    expect_sanitized("\xc0\xaf", 2, FFFD FFFD);
    expect_sanitized("\xe0\x80\x80", 3, FFFD FFFD FFFD);
    expect_sanitized("\xf0\x80\x80\x80", 4, FFFD FFFD FFFD FFFD);
}

Test(sanitize, replaces_surrogates)
{
    expect_sanitized("\xed\xa0\x80", 3, FFFD FFFD FFFD);
}

Test(sanitize, replaces_code_points_above_u10ffff)
{
    expect_sanitized("\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD);
}

Test(sanitize, replaces_a_truncated_sequence_with_one_replacement)
{
    expect_sanitized("\xe2\x82" "A", 3, FFFD "A");
    expect_sanitized("\xf0\x9f\x98", 3, FFFD);
}

Test(sanitize, replaces_nul_bytes)
{
    expect_sanitized("a\0b", 3, "a" FFFD "b");
    expect_sanitized("\0", 1, FFFD);
}

Test(sanitize, fast_path_output_is_exactly_the_input)
{
    char big[4096];
    memset(big, 'x', sizeof big);
    size_t n = 0;
    char *out = dk_utf8_sanitize(big, sizeof big, &n);
    cr_assert_eq(n, sizeof big);
    cr_assert_eq(memcmp(out, big, sizeof big), 0);
    cr_assert_eq(out[n], '\0');
    free(out);
}

Test(sanitize, output_length_is_optional)
{
    char *out = dk_utf8_sanitize("ok\xff", 3, NULL);
    cr_assert_str_eq(out, "ok" FFFD);
    free(out);
}

/* ---- what needs no cleaning ---- */

Test(valid_prefix, text_is_valid_whole)
{
    const char *s = "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80\n";
    cr_assert_eq(dk_utf8_valid_prefix(s, strlen(s)), strlen(s));
    cr_assert_eq(dk_utf8_valid_prefix("", 0), 0);
}

Test(valid_prefix, stops_at_the_first_byte_that_needs_cleaning)
{
    cr_assert_eq(dk_utf8_valid_prefix("ab\xff" "cd", 5), 2);
    cr_assert_eq(dk_utf8_valid_prefix("ab\0cd", 5), 2);           /* NUL */
    cr_assert_eq(dk_utf8_valid_prefix("a\xc0\xaf", 3), 1);        /* overlong */
    cr_assert_eq(dk_utf8_valid_prefix("a\xed\xa0\x80", 4), 1);    /* surrogate */
    cr_assert_eq(dk_utf8_valid_prefix("caf\xc3", 4), 3);          /* split */
}
