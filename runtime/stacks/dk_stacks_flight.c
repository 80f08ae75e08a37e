/*
 * dk_stacks_flight: a rank's last collective, from the line its answer ends
 * in. See dk_stacks.h.
 *
 * The line comes from the rank (python/distkernel/_flight.py), which read
 * torch's NCCL flight recorder; the kernel trusts none of it: every field is
 * bounded, cut at a field's size, control characters and anything outside
 * printable ASCII become '?', and a line without an op or a sequence number
 * counts as no line at all. Only the last such line counts: a dump asked
 * twice (a late sample after the end's signal) holds the newer last.
 */
#include "dk_stacks.h"

#include <stdlib.h>
#include <string.h>

/* VALUE (LEN bytes) into FIELD (of SIZE), cut, printable ASCII only. */
static void field(char *out, size_t size, const char *value, size_t len)
{
    size_t n = len < size - 1 ? len : size - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char) value[i];
        out[i] = c > 0x20 && c < 0x7f ? (char) c : '?';
    }
    out[n] = '\0';
}

/* A decimal in VALUE (LEN bytes), 0 to 10^18; -1 when it is not one. */
static long long number(const char *value, size_t len)
{
    if (len == 0 || len > 18)
        return -1;
    long long n = 0;
    for (size_t i = 0; i < len; i++) {
        if (value[i] < '0' || value[i] > '9')
            return -1;
        n = n * 10 + (value[i] - '0');
    }
    return n;
}

/* Read LINE (LEN bytes, after DK_STACKS_FLIGHT) into OUT. */
static bool parse_line(const char *line, size_t len, dk_flight_t *out)
{
    *out = (dk_flight_t){.seq = -1, .bytes = -1};
    const char *end = line + len;
    for (const char *p = line; p < end;) {
        while (p < end && *p == ' ')
            p++;
        const char *tok = p;
        while (p < end && *p != ' ')
            p++;
        const char *eq = memchr(tok, '=', (size_t) (p - tok));
        if (!eq)
            continue;
        size_t klen = (size_t) (eq - tok), vlen = (size_t) (p - eq - 1);
        const char *v = eq + 1;
#define KEY(name) (klen == sizeof name - 1 && !memcmp(tok, name, klen))
        if (KEY("op"))
            field(out->op, sizeof out->op, v, vlen);
        else if (KEY("seq"))
            out->seq = number(v, vlen);
        else if (KEY("state"))
            field(out->state, sizeof out->state, v, vlen);
        else if (KEY("bytes"))
            out->bytes = number(v, vlen);
        else if (KEY("shape"))
            field(out->shape, sizeof out->shape, v, vlen);
        else if (KEY("pg"))
            field(out->pg, sizeof out->pg, v, vlen);
#undef KEY
    }
    if (!out->op[0] || out->seq < 0) {
        *out = (dk_flight_t){.seq = -1, .bytes = -1};
        return false;
    }
    return true;
}

bool dk_flight_parse(const char *dump, dk_flight_t *out)
{
    const char *last = NULL;
    size_t last_len = 0, head = strlen(DK_STACKS_FLIGHT);
    for (const char *line = dump ? dump : ""; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t) (nl - line) : strlen(line);
        if (len >= head && !memcmp(line, DK_STACKS_FLIGHT, head)) {
            last = line + head;
            last_len = len - head;
        }
        line += len + (nl != NULL);
    }
    if (!last) {
        *out = (dk_flight_t){.seq = -1, .bytes = -1};
        return false;
    }
    return parse_line(last, last_len, out);
}

void dk_flight_size(long long bytes, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double) bytes;
    size_t u = 0;
    while (v >= 1024 && u + 1 < sizeof units / sizeof *units) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%lld B", bytes);
    else if (v < 10 && v != (double) (long long) v)
        snprintf(buf, len, "%.1f %s", v, units[u]);
    else
        snprintf(buf, len, "%.0f %s", v, units[u]);
}
