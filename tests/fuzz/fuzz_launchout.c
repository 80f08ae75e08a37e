/*
 * fuzz_launchout: the filter that tells srun's and slurmstepd's own lines
 * from what the node agents, srun's tasks, write on the same pipe
 * (runtime/launch/dk_launchout.h).
 *
 * Input: a small header, then the bytes srun's pipe carries:
 *
 *     K SIZE_1 ... SIZE_K PAYLOAD
 *
 *   K      K % 16 chunk sizes follow (0: the payload is fed in one call);
 *   SIZE_i the sizes, 0-255, used in turn to cut the payload into the chunks
 *          that reads from a pipe would deliver (0 is an empty feed).
 *
 * What dk_launchout.h promises, checked on every call and at the end:
 *   - every call carries at least one byte, a launcher call at most
 *     DK_LAUNCHOUT_LINE_MAX;
 *   - nothing is lost, added or reordered: the calls, concatenated, are the
 *     payload;
 *   - the split is the one a plain reference computes from the payload: cut
 *     it into lines (each with its '\n'; the last may have none), and a line
 *     is the launcher's when it starts with "srun: ", "slurmstepd: ", or
 *     "slurmstepd-" then 1 to 64 of [A-Za-z0-9._-] then ": "; so it does not
 *     depend on how the bytes were chunked;
 *   - a launcher line comes whole in one call when it fits, and a call of the
 *     launcher's that starts a line starts with its prefix;
 *   - dk_launchout_tells says yes only of a launcher line.
 */
#include "fuzz_check.h"

#include "dk_launchout.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    const char *payload;
    size_t len;
    size_t at;          /* bytes passed on so far */
    char *rank, *launcher;
    size_t rank_len, launcher_len;
} recorder_t;

static void take(void *data, dk_launchout_kind_t kind, const char *bytes, size_t len)
{
    recorder_t *rec = data;
    FUZZ_CHECK(len > 0, "an empty call");
    FUZZ_CHECK(kind == DK_LAUNCHOUT_RANK || len <= DK_LAUNCHOUT_LINE_MAX,
               "a launcher call of %zu bytes", len);
    FUZZ_CHECK(rec->at + len <= rec->len && !memcmp(bytes, rec->payload + rec->at, len),
               "the calls are not the payload in order (at %zu, %zu bytes)", rec->at, len);
    bool line_start = rec->at == 0 || rec->payload[rec->at - 1] == '\n';
    if (kind == DK_LAUNCHOUT_LAUNCHER && line_start) {
        FUZZ_CHECK(len >= 6 && (!memcmp(bytes, "srun: ", 6) || !memcmp(bytes, "slurmstepd", 10)),
                   "a launcher line starting without its prefix");
        const char *nl = memchr(rec->payload + rec->at, '\n', rec->len - rec->at);
        size_t line = nl ? (size_t)(nl - rec->payload - rec->at) + 1 : rec->len - rec->at;
        FUZZ_CHECK(line > DK_LAUNCHOUT_LINE_MAX || len == line,
                   "a launcher line of %zu bytes came in a call of %zu", line, len);
    }
    rec->at += len;
    if (kind == DK_LAUNCHOUT_RANK) {
        memcpy(rec->rank + rec->rank_len, bytes, len);
        rec->rank_len += len;
    } else {
        memcpy(rec->launcher + rec->launcher_len, bytes, len);
        rec->launcher_len += len;
    }
}

static bool host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_' || c == '.';
}

/* The reference: whether the line LINE (LEN bytes) is the launcher's. */
static bool launcher_line(const char *line, size_t len)
{
    if (len >= 6 && !memcmp(line, "srun: ", 6))
        return true;
    if (len >= 12 && !memcmp(line, "slurmstepd: ", 12))
        return true;
    if (len < 11 || memcmp(line, "slurmstepd-", 11))
        return false;
    size_t i = 11;
    while (i < len && host_char(line[i]))
        i++;
    size_t host = i - 11;
    return host >= 1 && host <= 64 && i + 2 <= len && line[i] == ':' && line[i + 1] == ' ';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t k = data[0] % 16;
    if (size < 1 + k)
        return 0;
    const uint8_t *sizes = data + 1;
    const char *payload = (const char *) data + 1 + k;
    size_t len = size - 1 - k;

    recorder_t rec = {payload, len, 0, malloc(len + 1), malloc(len + 1), 0, 0};
    dk_launchout_t *f = dk_launchout_new();
    FUZZ_CHECK(f && rec.rank && rec.launcher, "out of memory");
    for (size_t at = 0, i = 0; at < len; i++) {
        size_t n = k == 0 ? len - at : sizes[i % k];
        if (n > len - at)
            n = len - at;
        if (n == 0 && k > 0 && i > 4 * len + 64)
            n = 1;      /* only empty sizes: still get through */
        dk_launchout_feed(f, payload + at, n, take, &rec);
        at += n;
    }
    dk_launchout_finish(f, take, &rec);
    dk_launchout_destroy(&f);
    FUZZ_CHECK(f == NULL, "destroy left the pointer set");
    FUZZ_CHECK(rec.at == len, "%zu of %zu bytes passed on", rec.at, len);

    /* The reference split. */
    char *rank = malloc(len + 1), *launcher = malloc(len + 1);
    size_t rank_len = 0, launcher_len = 0;
    FUZZ_CHECK(rank && launcher, "out of memory");
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(payload + at, '\n', len - at);
        size_t n = nl ? (size_t)(nl - payload - at) + 1 : len - at;
        bool ours = launcher_line(payload + at, n);
        FUZZ_CHECK(!dk_launchout_tells(payload + at, n) || ours,
                   "tells of a line that is not the launcher's");
        memcpy(ours ? launcher + launcher_len : rank + rank_len, payload + at, n);
        *(ours ? &launcher_len : &rank_len) += n;
        at += n;
    }
    FUZZ_CHECK(rank_len == rec.rank_len && !memcmp(rank, rec.rank, rank_len),
               "the rank's bytes differ from the reference (%zu vs %zu)", rec.rank_len, rank_len);
    FUZZ_CHECK(launcher_len == rec.launcher_len && !memcmp(launcher, rec.launcher, launcher_len),
               "the launcher's bytes differ from the reference");
    free(rank);
    free(launcher);
    free(rec.rank);
    free(rec.launcher);
    return 0;
}
