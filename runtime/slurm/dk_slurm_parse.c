/*
 * dk_slurm_parse: the Slurm text formats dk_slurm reads, pure. See dk_slurm.h.
 *
 * Host lists are expanded here rather than by `scontrol show hostnames`: one
 * command fewer per run, and the node list is needed where no Slurm command
 * may answer (SLURM_JOB_NODELIST inside an allocation). A list is names
 * separated by commas outside brackets; a bracket holds ranges and numbers
 * separated by commas, whose width (leading zeros) is kept; a name may have
 * several brackets, expanded left to right ("r[1-2]n[1-2]": r1n1 r1n2 r2n1
 * r2n2). The total is bounded so that a hostile "n[0-99999999]" costs nothing.
 */
#include "dk_slurm.h"

#include "dk_err.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define NAMES_MAX 65536
#define NAME_MAX_LEN 256

typedef struct {
    char **v;
    size_t n, cap;
} names_t;

static int push(names_t *l, const char *name, char *err, size_t errlen)
{
    if (l->n >= NAMES_MAX) {
        dk_set_err(err, errlen, "the host list names more than %d hosts", NAMES_MAX);
        return -1;
    }
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        char **grown = realloc(l->v, cap * sizeof *grown);
        if (!grown)
            goto oom;
        l->v = grown;
        l->cap = cap;
    }
    if (!(l->v[l->n] = strdup(name)))
        goto oom;
    l->n++;
    return 0;
oom:
    dk_set_err(err, errlen, "out of memory expanding a host list");
    return -1;
}

void dk_slurm_names_free(char **names, size_t count)
{
    if (!names)
        return;
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

/* A number of at most 9 digits at *P; its digit count in *WIDTH. */
static bool number(const char **p, long *out, int *width)
{
    const char *s = *p;
    long v = 0;
    int w = 0;
    while (isdigit((unsigned char) *s) && w < 9)
        v = v * 10 + (*s++ - '0'), w++;
    if (w == 0 || isdigit((unsigned char) *s))
        return false;
    *p = s;
    *out = v;
    *width = w;
    return true;
}

/* Expand PREFIX + PATTERN (one comma-free host expression, LEN bytes) into L. */
static int expand(const char *prefix, const char *pattern, size_t len, names_t *l, char *err,
                  size_t errlen)
{
    const char *open = memchr(pattern, '[', len);
    char name[NAME_MAX_LEN];
    if (!open) {
        if (strlen(prefix) + len >= sizeof name || (len == 0 && !*prefix))
            goto bad;
        snprintf(name, sizeof name, "%s%.*s", prefix, (int) len, pattern);
        return push(l, name, err, errlen);
    }
    const char *close = memchr(open, ']', len - (size_t) (open - pattern));
    if (!close || close == open + 1)
        goto bad;
    const char *rest = close + 1;
    size_t restlen = len - (size_t) (rest - pattern);
    if (strlen(prefix) + (size_t) (open - pattern) + 10 >= sizeof name)
        goto bad;
    for (const char *p = open + 1; p < close;) {
        long lo, hi;
        int w, whi;
        if (!number(&p, &lo, &w))
            goto bad;
        hi = lo;
        if (*p == '-' && (p++, !number(&p, &hi, &whi)))
            goto bad;
        if (hi < lo || (*p != ',' && p != close))
            goto bad;
        if (hi - lo >= NAMES_MAX) {
            dk_set_err(err, errlen, "the host list names more than %d hosts", NAMES_MAX);
            return -1;
        }
        for (long v = lo; v <= hi; v++) {
            snprintf(name, sizeof name, "%s%.*s%0*ld", prefix, (int) (open - pattern), pattern,
                     w, v);
            if (expand(name, rest, restlen, l, err, errlen) < 0)
                return -1;
        }
        if (*p == ',')
            p++;
    }
    return 0;
bad:
    dk_set_err(err, errlen, "'%.*s' is not a Slurm host list entry (such as node[1-3,5])",
               (int) len, pattern);
    return -1;
}

int dk_slurm_hostlist_expand(const char *list, char ***names, size_t *count, char *err,
                             size_t errlen)
{
    names_t l = {0};
    const char *p = list ? list : "";
    while (*p) {
        /* one entry: up to a comma outside brackets */
        const char *s = p;
        int depth = 0;
        while (*p && (depth || *p != ',')) {
            if (*p == '[')
                depth++;
            else if (*p == ']')
                depth--;
            if (depth < 0 || depth > 1 || isspace((unsigned char) *p))
                break;
            p++;
        }
        if ((*p && *p != ',') || depth != 0 || p == s) {
            dk_set_err(err, errlen, "'%s' is not a Slurm host list (such as node[1-3,5],login)",
                       list);
            goto fail;
        }
        if (expand("", s, (size_t) (p - s), &l, err, errlen) < 0)
            goto fail;
        if (*p == ',' && !*++p) {
            dk_set_err(err, errlen, "'%s' ends with a comma", list);
            goto fail;
        }
    }
    if (l.n == 0) {
        dk_set_err(err, errlen, "the host list is empty");
        goto fail;
    }
    *names = l.v;
    *count = l.n;
    return 0;
fail:
    dk_slurm_names_free(l.v, l.n);
    return -1;
}

int dk_slurm_split_words(const char *text, char ***words, size_t *count, char *err,
                         size_t errlen)
{
    names_t l = {0};
    size_t cap = strlen(text ? text : "") + 1;
    char *word = malloc(cap);
    if (!word) {
        dk_set_err(err, errlen, "out of memory splitting '%s'", text);
        return -1;
    }
    const char *p = text ? text : "";
    for (;;) {
        while (isspace((unsigned char) *p))
            p++;
        if (!*p)
            break;
        size_t n = 0;
        while (*p && !isspace((unsigned char) *p)) {
            if (*p == '\'' || *p == '"') {
                char q = *p++;
                while (*p && *p != q) {
                    if (q == '"' && *p == '\\' && p[1])
                        p++;
                    word[n++] = *p++;
                }
                if (!*p) {
                    dk_set_err(err, errlen, "unterminated %c quote in '%s'", q, text);
                    goto fail;
                }
                p++;
            } else {
                if (*p == '\\' && p[1])
                    p++;
                word[n++] = *p++;
            }
        }
        word[n] = '\0';
        if (push(&l, word, err, errlen) < 0)
            goto fail;
    }
    free(word);
    *words = l.v;
    *count = l.n;
    return 0;
fail:
    free(word);
    dk_slurm_names_free(l.v, l.n);
    return -1;
}

/* Copy the field ending at SEP (or the line's end) into DST; P moves past it. */
static bool field(const char **p, char sep, char *dst, size_t dstlen)
{
    const char *end = sep ? strchr(*p, sep) : NULL;
    size_t len = end ? (size_t) (end - *p) : strcspn(*p, "\r\n");
    if (sep && !end)
        return false;
    snprintf(dst, dstlen, "%.*s", (int) len, *p);
    *p += len + (end ? 1 : 0);
    return true;
}

int dk_slurm_parse_squeue(const char *line, dk_slurm_squeue_t *out)
{
    memset(out, 0, sizeof *out);
    const char *p = line;
    if (!field(&p, '|', out->job_id, sizeof out->job_id) ||
        !field(&p, '|', out->state, sizeof out->state) ||
        !field(&p, '|', out->reason, sizeof out->reason) ||
        !field(&p, 0, out->nodes, sizeof out->nodes))
        return -1;
    if (!out->job_id[0] || strspn(out->job_id, "0123456789_") != strlen(out->job_id) ||
        !out->state[0])
        return -1;
    if (strcmp(out->nodes, "(null)") == 0)
        out->nodes[0] = '\0';
    return 0;
}

bool dk_slurm_salloc_job_id(const char *text, char *id, size_t idlen)
{
    static const char *const marks[] = {"job allocation ", "salloc: job "};
    for (size_t m = 0; m < sizeof marks / sizeof marks[0]; m++) {
        for (const char *p = strstr(text, marks[m]); p; p = strstr(p + 1, marks[m])) {
            const char *d = p + strlen(marks[m]);
            size_t n = strspn(d, "0123456789");
            if (n > 0 && n < idlen && n < 20) {
                snprintf(id, idlen, "%.*s", (int) n, d);
                return true;
            }
        }
    }
    return false;
}

static void each_gpu_entry(const char *gres, void (*each)(const char *type, size_t typelen,
                                                          int count, void *data), void *data);

static void sum_gpus(const char *type, size_t len, int count, void *data)
{
    (void) type;
    (void) len;
    *(int *) data += count;
}

int dk_slurm_gres_gpus(const char *gres)
{
    /* Comma-separated NAME[:TYPE][:COUNT][(S:...)] entries; a socket list in
     * parentheses may hold commas itself ("(S:0,1)"). */
    int total = 0;
    each_gpu_entry(gres, sum_gpus, &total);
    return total;
}

/* Whether the GRES type TYPE (LEN bytes: "h100", "a100_80gb",
 * "nvidia_h100_80gb_hbm3", as sites and Slurm's NVML autodetection name
 * them) is a GPU of MODEL ("H100"): one of its words (split at '_' and
 * '-') is MODEL, case aside. "a100" is not an A10. */
static bool type_is_model(const char *type, size_t len, const char *model)
{
    size_t mlen = strlen(model);
    for (size_t i = 0; i < len;) {
        size_t w = 0;
        while (i + w < len && type[i + w] != '_' && type[i + w] != '-')
            w++;
        if (w == mlen && strncasecmp(type + i, model, mlen) == 0)
            return true;
        i += w + 1;
    }
    return false;
}

/* Each "gpu:TYPE:COUNT" entry of one node's GRES (count > 0), to EACH; an
 * entry with no type ("gpu:8") gets TYPE "" . */
static void each_gpu_entry(const char *gres, void (*each)(const char *type, size_t typelen,
                                                          int count, void *data), void *data)
{
    const char *p = gres ? gres : "";
    while (*p) {
        size_t len = 0;
        int depth = 0;
        while (p[len] && (depth || p[len] != ',')) {
            depth += p[len] == '(' ? 1 : p[len] == ')' ? -1 : 0;
            len++;
        }
        size_t word = strcspn(p, ":(,");
        if (word == 3 && strncmp(p, "gpu", 3) == 0 && word < len && p[word] == ':') {
            size_t end = strcspn(p, "(");
            if (end > len)
                end = len;
            const char *last = p + word;
            for (const char *q = p + word; q < p + end; q++)
                if (*q == ':')
                    last = q;
            char *stop;
            long n = strtol(last + 1, &stop, 10);
            if (stop != last + 1 && stop <= p + end && n > 0 && n < 100000) {
                const char *type = p + word + 1;
                each(type, last > p + word ? (size_t) (last - type) : 0, (int) n, data);
            }
        }
        p += len;
        if (*p == ',')
            p++;
    }
}

typedef struct {
    const char *model;
    int count;
    char *type;
    size_t typelen;
} typed_t;

static void count_typed(const char *type, size_t len, int count, void *data)
{
    typed_t *t = data;
    if (!len || !type_is_model(type, len, t->model))
        return;
    if (t->count == 0 && t->type)
        snprintf(t->type, t->typelen, "%.*s", (int) len, type);
    t->count += count;
}

int dk_slurm_gres_gpus_of(const char *gres, const char *model, char *type, size_t typelen)
{
    if (type && typelen)
        type[0] = '\0';
    if (!model || !model[0])
        return 0;
    typed_t t = {model, 0, type, typelen};
    each_gpu_entry(gres, count_typed, &t);
    return t.count;
}

static void list_type(const char *type, size_t len, int count, void *data)
{
    (void) count;
    typed_t *t = data;
    if (!len)
        return;
    /* once each: is it in the list ("a, b") already? */
    for (const char *p = t->type; *p;) {
        size_t w = strcspn(p, ",");
        if (w == len && strncmp(p, type, len) == 0)
            return;
        p += w;
        p += strspn(p, ", ");
    }
    size_t n = strlen(t->type);
    snprintf(t->type + n, t->typelen - n, "%s%.*s", n ? ", " : "", (int) len, type);
}

void dk_slurm_gres_gpu_types(const char *gres, char *out, size_t outlen)
{
    if (!out || !outlen)
        return;
    out[0] = '\0';
    typed_t t = {NULL, 0, out, outlen};
    each_gpu_entry(gres, list_type, &t);
}

/* For each line "PART[*]|FIELD" of sinfo's TEXT that is PARTITION's (NULL or
 * "": the default, marked '*'; a list "a,b": its first; ANY: every line),
 * call EACH with FIELD. Returns whether any line matched. */
static bool partition_lines(const char *text, const char *partition, bool any,
                            void (*each)(const char *field, void *data), void *data)
{
    char want[256] = "";
    if (partition && partition[0])
        snprintf(want, sizeof want, "%.*s", (int) strcspn(partition, ","), partition);
    bool matched = false;
    for (const char *line = text; line && *line; ) {
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t) (eol - line) : strlen(line);
        char copy[1024];
        snprintf(copy, sizeof copy, "%.*s", (int) (len < sizeof copy ? len : 0), line);
        char *bar = strchr(copy, '|');
        if (bar) {
            *bar = '\0';
            size_t n = strlen(copy);
            bool dflt = n && copy[n - 1] == '*';
            if (dflt)
                copy[--n] = '\0';
            if (any || (want[0] ? strcmp(copy, want) == 0 : dflt)) {
                matched = true;
                each(bar + 1, data);
            }
        }
        line = eol ? eol + 1 : NULL;
    }
    return matched;
}

typedef struct {
    int most;
    char *gres;
    size_t greslen;
} most_t;

static void most_gpus(const char *field, void *data)
{
    most_t *m = data;
    int gpus = dk_slurm_gres_gpus(field);
    if (gpus > m->most) {
        m->most = gpus;
        if (m->gres)
            snprintf(m->gres, m->greslen, "%s", field);
    }
}

int dk_slurm_partition_gpus(const char *text, const char *partition, bool any_partition,
                            char *gres, size_t greslen)
{
    most_t m = {-1, gres, greslen};
    partition_lines(text, partition, any_partition, most_gpus, &m);
    return m.most;
}

typedef struct {
    const char *model;
    int most;
    char *gres;
    size_t greslen;
    char *type;
    size_t typelen;
} most_typed_t;

static void most_typed(const char *field, void *data)
{
    most_typed_t *m = data;
    char type[64];
    int gpus = dk_slurm_gres_gpus_of(field, m->model, type, sizeof type);
    if (gpus > m->most) {
        m->most = gpus;
        snprintf(m->gres, m->greslen, "%s", field);
        snprintf(m->type, m->typelen, "%s", type);
    }
}

int dk_slurm_partition_gpus_of(const char *text, const char *partition, bool any_partition,
                               const char *model, char *gres, size_t greslen, char *type,
                               size_t typelen)
{
    if (type && typelen)
        type[0] = '\0';
    if (gres && greslen)
        gres[0] = '\0';
    if (!model || !model[0] || !gres || !type)
        return 0;
    most_typed_t m = {model, 0, gres, greslen, type, typelen};
    partition_lines(text, partition, any_partition, most_typed, &m);
    return m.most;
}

static void most_cpus(const char *field, void *data)
{
    most_t *m = data;
    char *end;
    long cpus = strtol(field, &end, 10);
    /* "%c" is a number, or "N+" where the partition's nodes differ */
    if (end != field && (*end == '\0' || *end == '+') && cpus > m->most && cpus < 1 << 20)
        m->most = (int) cpus;
}

int dk_slurm_partition_cpus(const char *text, const char *partition)
{
    most_t m = {-1, NULL, 0};
    partition_lines(text, partition, false, most_cpus, &m);
    return m.most;
}

bool dk_slurm_time_limit_reason(const char *reason)
{
    size_t n = strlen(reason), tail = strlen("TimeLimit");
    return (n >= tail && strcmp(reason + n - tail, "TimeLimit") == 0) ||
           strstr(reason, "MaxWall") != NULL;
}

long dk_slurm_time_s(const char *text)
{
    /* [days-]hours[:minutes[:seconds]] with a day, else
     * minutes[:seconds] or hours:minutes:seconds */
    long v[4];
    int n = 0;
    long days = -1;
    const char *p = text;
    if (!isdigit((unsigned char) *p))
        return -1;
    while (n < 4) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 1000000)
            return -1;
        if (*end == '-' && days < 0 && n == 0) {
            days = x;
            p = end + 1;
            continue;
        }
        v[n++] = x;
        if (*end == '\0')
            break;
        if (*end != ':')
            return -1;
        p = end + 1;
    }
    if (n == 0 || n > 3 || *p == '\0')
        return -1;
    long s;
    if (days >= 0)
        s = days * 86400 + v[0] * 3600 + (n > 1 ? v[1] * 60 : 0) + (n > 2 ? v[2] : 0);
    else if (n == 3)
        s = v[0] * 3600 + v[1] * 60 + v[2];
    else
        s = v[0] * 60 + (n > 1 ? v[1] : 0);
    return s;
}

/* ---- slurm_args ------------------------------------------------------------ */

/* The options slurm_args may not give, and why. */
static const struct {
    const char *name;       /* long, without "--" */
    char letter;            /* short, or 0 */
    const char *why;
} refused[] = {
    {"job-name", 'J', "distkernel names each request itself, to find and cancel it whatever "
     "happens (a kernel killed outright included); for accounting, use --comment=... instead"},
    {"nodes", 'N', "the run's node count comes from nodes=; give nodes=N instead"},
    {"ntasks", 'n', "the run's ranks come from num_processes= or num_accelerators= (the total, "
     "split over nodes=); give those instead"},
    {"ntasks-per-node", 0, "the ranks on each node come from num_processes= or "
     "num_accelerators= divided by nodes=; give those instead"},
};
#define REFUSED (sizeof refused / sizeof refused[0])

/* salloc's short options that take an argument (22.05; I, k and K take an
 * optional one): the rest of a word after one of them is its value, not more
 * options. */
static const char with_value[] = "ABcCdDFGIJkKLmMnNpqStwx";

static int refuse(const char *word, size_t i, char *err, size_t errlen)
{
    if (refused[i].letter)
        dk_set_err(err, errlen, "slurm_args may not set --%s (-%c), as '%s' does: %s",
                   refused[i].name, refused[i].letter, word, refused[i].why);
    else
        dk_set_err(err, errlen, "slurm_args may not set --%s, as '%s' does: %s",
                   refused[i].name, word, refused[i].why);
    return -1;
}

/* salloc's long options that take a required argument (22.05, `salloc
 * --help` and its man page): written without '=', the next word is that
 * argument ("--comment -N" comments "-N"), not an option. */
static const char *const long_with_value[] = {
    "account", "acctg-freq", "bb", "bbf", "begin", "chdir", "cluster-constraint", "clusters",
    "comment", "constraint", "container", "core-spec", "cores-per-socket", "cpu-freq",
    "cpus-per-gpu", "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution",
    "exclude", "extra-node-info", "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node",
    "gpus-per-socket", "gpus-per-task", "gres", "gres-flags", "hint", "job-name", "licenses",
    "mail-type", "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu",
    "mincpus", "network", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core",
    "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "partition", "power", "prefer",
    "priority", "profile", "qos", "reservation", "signal", "sockets-per-node", "switches",
    "thread-spec", "threads-per-core", "time", "time-min", "tmp", "uid", "wckey",
};
#define LONG_WITH_VALUE (sizeof long_with_value / sizeof long_with_value[0])

/* Whether the long option NAME (LEN bytes, no '=' in the word) takes the next
 * word as its argument: it names one of long_with_value exactly, or is a
 * prefix of only such options (salloc takes an unambiguous prefix). */
static bool long_takes_next(const char *name, size_t len)
{
    bool any = false;
    for (size_t i = 0; i < LONG_WITH_VALUE; i++) {
        const char *o = long_with_value[i];
        if (strlen(o) == len && strncmp(o, name, len) == 0)
            return true;
        if (strncmp(o, name, len) == 0)
            any = true;
    }
    /* A prefix also shared by a flag ("--mem" is exact above; "--ex" is
     * --exclude or --exclusive) is ambiguous, and salloc refuses it. */
    static const char *const flags[] = {"bell", "contiguous", "exclusive", "get-user-env",
                                        "hold", "immediate", "kill-command", "nice",
                                        "no-bell", "no-kill", "overcommit", "oversubscribe",
                                        "quiet", "reboot", "spread-job", "use-min-nodes",
                                        "verbose", "x11"};
    for (size_t i = 0; any && i < sizeof flags / sizeof flags[0]; i++)
        if (strncmp(flags[i], name, len) == 0)
            return false;
    return any;
}

/* 0 when word W is fine, -1 with ERR when it is refused. *TAKES_NEXT: the
 * next word is W's option's argument. */
static int check_word(const char *w, bool *takes_next, char *err, size_t errlen)
{
    *takes_next = false;
    if (w[0] != '-' || !w[1])
        return 0;
    if (w[1] == '-') {
        /* salloc takes any unambiguous prefix of a long option: "--job-n=x"
         * is --job-name. A prefix of ours that is ambiguous is refused too,
         * which costs nothing: salloc would refuse it. */
        const char *name = w + 2;
        size_t len = strcspn(name, "=");
        for (size_t i = 0; len && i < REFUSED; i++)
            if (len <= strlen(refused[i].name) && strncmp(name, refused[i].name, len) == 0 &&
                /* "--ntasks" is ours, "--ntasks-per-core" is not */
                (len >= 2 || name[0] != 'n'))
                return refuse(w, i, err, errlen);
        *takes_next = len > 0 && name[len] == '\0' && long_takes_next(name, len);
        return 0;
    }
    for (const char *c = w + 1; *c; c++) {
        for (size_t i = 0; i < REFUSED; i++)
            if (refused[i].letter && *c == refused[i].letter)
                return refuse(w, i, err, errlen);
        if (strchr(with_value, *c)) {
            /* "-p debug": the value is the next word; I, k and K take
             * theirs only attached. */
            *takes_next = c[1] == '\0' && !strchr("IkK", *c);
            break;
        }
    }
    return 0;
}

int dk_slurm_check_args(const char *text, char *err, size_t errlen)
{
    char **words = NULL;
    size_t n = 0;
    if (dk_slurm_split_words(text ? text : "", &words, &n, err, errlen) < 0)
        return -1;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        bool takes_next;
        rc = check_word(words[i], &takes_next, err, errlen);
        if (takes_next)
            i++;             /* an argument, whatever it looks like */
    }
    dk_slurm_names_free(words, n);
    return rc;
}
