/*
 * fuzz_stacks: the ranks' stacks grouped and folded (runtime/stacks/dk_stacks.h),
 * with the rank runs under the group labels (runtime/base/dk_lost.h).
 *
 * Input: a small header, then the dumps of the ranks:
 *
 *     K MAX PAYLOAD
 *
 *   K        1 + K % 8 ranks; PAYLOAD is cut into K dumps at each "\n%%\n"
 *            (the last dump takes the rest, missing ones are empty);
 *   MAX      the summary's line budget (0: the default, 45);
 *   PAYLOAD  any bytes; frames whose file is under /tmp/distkernel-cells-1-
 *            fixture/ are the cell's.
 *
 * What dk_stacks.h promises, checked on every input:
 *   - every rank is added (distinct ranks, any bytes); a rank added twice is
 *     refused; there are at most as many groups as ranks;
 *   - the same dump added again as another rank joins an existing group;
 *   - the summary is valid UTF-8, ends in '\n', has min(groups, MAX) lines,
 *     each under 512 bytes with no control character;
 *   - dk_stack_fold of a dump is deterministic (the same signature twice),
 *     gives a where text, and a call without control characters;
 *   - stacks.txt names every rank once ("--- rank R on ") and is written;
 *   - dk_stacks_call_name of the payload as a file name gives valid UTF-8
 *     when the payload is.
 */
#include "fuzz_check.h"

#include "dk_stacks.h"
#include "dk_utf8.h"

#include <stdint.h>
#include <string.h>

#define CELLS "/tmp/distkernel-cells-1-fixture/"

static const uint8_t *next_dump(const uint8_t *p, const uint8_t *end, bool last, size_t *len)
{
    if (!last) {
        for (const uint8_t *q = p; q + 4 <= end; q++) {
            if (!memcmp(q, "\n%%\n", 4)) {
                *len = (size_t) (q - p);
                return q + 4;
            }
        }
    }
    *len = (size_t) (end - p);
    return end;
}

static void check_summary(const char *text, size_t groups, size_t max_lines)
{
    FUZZ_CHECK(text, "no summary");
    size_t len = strlen(text);
    FUZZ_CHECK(fuzz_utf8_valid(text, len), "the summary is not valid UTF-8");
    FUZZ_CHECK(len == 0 || text[len - 1] == '\n', "the summary does not end in a newline");
    size_t m = max_lines ? max_lines : DK_STACKS_MAX_LINES;
    size_t want = groups < m ? groups : m, lines = 0;
    for (const char *line = text; *line; lines++) {
        const char *nl = strchr(line, '\n');
        FUZZ_CHECK(nl, "a line without its newline");
        FUZZ_CHECK(nl - line < 512, "a line of %zu bytes", (size_t) (nl - line));
        for (const char *p = line; p < nl; p++)
            FUZZ_CHECK((unsigned char) *p >= 0x20 && *p != 0x7f, "a control character %#x",
                       (unsigned) (unsigned char) *p);
        line = nl + 1;
    }
    FUZZ_CHECK(lines == want, "%zu lines for %zu groups within %zu", lines, groups, m);
}

static void check_fold(const uint8_t *dump, size_t len)
{
    size_t text_len;
    char *text = dk_utf8_sanitize((const char *) dump, len, &text_len);
    FUZZ_CHECK(text, "out of memory");
    dk_stack_t a, b;
    FUZZ_CHECK(dk_stack_fold(text, dk_stacks_is_under, (void *) CELLS, &a) == 0, "fold failed");
    FUZZ_CHECK(dk_stack_fold(text, dk_stacks_is_under, (void *) CELLS, &b) == 0, "fold failed");
    FUZZ_CHECK(a.where && a.signature, "a fold without where or signature");
    FUZZ_CHECK(!strcmp(a.signature, b.signature), "two folds of one dump differ");
    FUZZ_CHECK(fuzz_utf8_valid(a.where, strlen(a.where)), "where is not valid UTF-8");
    if (a.call) {
        FUZZ_CHECK(fuzz_utf8_valid(a.call, strlen(a.call)), "the call is not valid UTF-8");
        for (const char *p = a.call; *p; p++)
            FUZZ_CHECK((unsigned char) *p >= 0x20, "a control character in the call");
    }
    dk_stack_clear(&a);
    dk_stack_clear(&b);
    FUZZ_CHECK(!a.call && !a.where && !a.signature, "clear left strings");
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int k = 1 + data[0] % 8;
    size_t max_lines = data[1];
    const uint8_t *p = data + 2, *end = data + size;

    dk_stacks_t *stacks = dk_stacks_new(dk_stacks_is_under, (void *) CELLS);
    FUZZ_CHECK(stacks, "out of memory");
    const uint8_t *first = p;
    size_t first_len = 0;
    for (int r = 0; r < k; r++) {
        size_t len;
        const uint8_t *dump = p;
        p = next_dump(p, end, r == k - 1, &len);
        if (r == 0)
            first_len = len;
        check_fold(dump, len);
        FUZZ_CHECK(dk_stacks_add(stacks, r, r % 2 ? "node2" : NULL, (const char *) dump, len) == 0,
                   "rank %d was not added", r);
    }
    FUZZ_CHECK(dk_stacks_add(stacks, 0, NULL, "", 0) == -1, "rank 0 added twice");
    FUZZ_CHECK(dk_stacks_ranks(stacks) == (size_t) k, "%zu ranks", dk_stacks_ranks(stacks));
    size_t groups = dk_stacks_groups(stacks);
    FUZZ_CHECK(groups >= 1 && groups <= (size_t) k, "%zu groups of %d ranks", groups, k);
    FUZZ_CHECK(dk_stacks_add(stacks, k, NULL, (const char *) first, first_len) == 0, "re-add");
    FUZZ_CHECK(dk_stacks_groups(stacks) == groups, "the same dump made a new group");

    char *text = dk_stacks_summary(stacks, max_lines, NULL);
    check_summary(text, groups, max_lines);
    free(text);

    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    FUZZ_CHECK(f, "out of memory");
    FUZZ_CHECK(dk_stacks_write(stacks, f) == 0, "stacks.txt was not written");
    fclose(f);
    for (int r = 0; r <= k; r++) {
        char head[64];
        snprintf(head, sizeof head, "--- rank %d on ", r);
        const char *at = strstr(out, head);
        FUZZ_CHECK(at, "rank %d missing from stacks.txt", r);
    }
    free(out);
    dk_stacks_destroy(&stacks);
    FUZZ_CHECK(!stacks, "destroy did not clear the pointer");

    size_t file_len = size - 2 < 4096 ? size - 2 : 4096;
    char *file = malloc(file_len + 1);
    FUZZ_CHECK(file, "out of memory");
    memcpy(file, data + 2, file_len);
    file[file_len] = '\0';
    char *name = dk_stacks_call_name(file, "f");
    FUZZ_CHECK(name, "no call name");
    if (fuzz_utf8_valid(file, strlen(file)))
        FUZZ_CHECK(fuzz_utf8_valid(name, strlen(name)), "the call name is not valid UTF-8");
    free(name);
    free(file);
    return 0;
}
