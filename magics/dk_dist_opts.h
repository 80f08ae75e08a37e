/*
 * dk_dist_opts: the options of %%distributed and of the @distributed decorator.
 *
 * Both spell options the same way, `name=value` separated by blanks:
 *
 *     %%distributed num_accelerators=8 accelerator_type=GPU_8xH100 timeout=3600
 *     %%distributed num_processes=2 output=rank0 result=losses
 *
 * (the decorator's keyword arguments are turned into this text). Values are
 * integers, numbers, None, True/False, bare words or quoted strings. The names of
 * the managed platform's older API, `gpus` and `gpu_type`, are accepted with a
 * deprecation warning, as that platform does. Everything is validated here,
 * before anything starts; an error names the option, the value, and what is
 * accepted.
 */
#ifndef DK_DIST_OPTS_H
#define DK_DIST_OPTS_H

#include <stdbool.h>
#include <stddef.h>

#define DK_DEFAULT_TIMEOUT_S 10800.0
#define DK_DEFAULT_IDLE_TIMEOUT_S 3600.0

typedef enum { DK_OUTPUT_ALL = 0, DK_OUTPUT_RANK0 } dk_output_mode_t;

typedef struct {
    int num_accelerators;       /* 0: not given (every GPU of the node) */
    char accelerator_model[32]; /* "H100", "" if not given */
    int accelerator_count;      /* n of GPU_<n>x<MODEL>, 0 if not given */
    int num_processes;          /* CPU ranks; 0: not given */
    double timeout_s;           /* 0: no timeout (timeout=None) */
    dk_output_mode_t output;
    char result_name[128];      /* "" : results not stored under a name */
    bool check;                 /* run the NCCL preflight check first */
    bool tracking;              /* record the run in MLflow (default true) */
    char experiment[256];       /* MLflow experiment name, "" : the default */
    char run_name[256];         /* MLflow run name, "" : a generated one */
    unsigned long long log_cap; /* bytes each rank's log keeps; 0: not given */
    double idle_timeout_s;      /* started ranks: end after this long idle; 0: never */
    bool idle_given;            /* idle_timeout= was given */
    char warnings[512];         /* deprecation warnings, "" if none */
} dk_dist_opts_t;

/* Parse ARGS into OUT (which it initialises with the defaults). Returns 0, or -1
 * with a message for the user in ERR. */
int dk_dist_opts_parse(const char *args, dk_dist_opts_t *out, char *err, size_t errlen);

/* Parse ARGS onto OUT as it is (options ARGS leaves out keep their values in
 * OUT): cells on started ranks take the options the ranks were started with
 * as their defaults. Returns 0, or -1 with ERR (OUT may then be changed). */
int dk_dist_opts_parse_onto(const char *args, dk_dist_opts_t *out, char *err, size_t errlen);

/* The smallest log_cap accepted (the runtime's DK_LOG_CAP_MIN). */
#define DK_LOG_CAP_MIN_BYTES 4096ULL

/* "1G", "64M", "512k", "4096" (bytes; K/M/G/T are powers of 1024, an optional
 * trailing "B" or "iB" is allowed) into *OUT. Returns false, leaving *OUT
 * alone, unless TEXT is such a size. Used for log_cap= and for the
 * DISTKERNEL_LOG_CAP and DISTKERNEL_LOG_ROOT_CAP variables. */
bool dk_dist_opts_parse_size(const char *text, unsigned long long *out);

/* The help text of %%distributed (what `%%distributed?` shows). */
extern const char dk_dist_doc[];

#endif
