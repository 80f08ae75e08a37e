/*
 * dk_utf8: turning raw output bytes into text a Jupyter message can carry.
 *
 * Bytes read from a process's fd 1/2 arrive in arbitrary chunks: a multi-byte
 * character may be split across two reads, and a program may write bytes that are
 * not UTF-8 at all. JSON strings must be valid UTF-8, so the kernel holds back an
 * incomplete trailing sequence until the next chunk and replaces invalid bytes with
 * U+FFFD, as Python's "replace" error handler does.
 */
#ifndef DK_UTF8_H
#define DK_UTF8_H

#include <stddef.h>

/* Length of the longest prefix of BUF (LEN bytes) that does not end inside a
 * possibly-valid incomplete multi-byte sequence. Bytes after it (at most 3) should
 * be kept for the next chunk; an invalid tail is not held back. */
size_t dk_utf8_complete_prefix(const char *buf, size_t len);

/* Length of the longest prefix of BUF (LEN bytes) that is text as it stands:
 * valid UTF-8 without NUL bytes. LEN when BUF needs no cleaning. */
size_t dk_utf8_valid_prefix(const char *buf, size_t len);

/* Copy BUF (LEN bytes) into a new NUL-terminated string in which every invalid
 * sequence (including overlongs, surrogates, code points above U+10FFFF and NUL
 * bytes, which JSON text from C strings cannot carry) is replaced by U+FFFD.
 * *OUT_LEN gets the length. Returns NULL only on allocation failure; free() it. */
char *dk_utf8_sanitize(const char *buf, size_t len, size_t *out_len);

#endif
