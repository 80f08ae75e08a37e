/*
 * dk_proc: run one helper program to its end and collect what it says.
 *
 * For short-lived helpers whose answer is their stdout (distkernel-check's
 * JSON report): the program is started through dk_spawn (its own process
 * group, signals blocked around fork, descriptors swept, killed with the
 * caller's thread), its stdout is kept in memory up to a bound, its stderr is
 * handed to a callback as it comes, and between polls a cancel callback is
 * asked whether to stop; a stop runs the stop ladder (dk_stop.h) on the
 * program's process group until it is gone. The calling thread blocks until
 * the program has exited and been reaped; nothing is left running.
 */
#ifndef DK_PROC_H
#define DK_PROC_H

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    const char *path;           /* the program, as execve takes it */
    char *const *argv;          /* NULL-terminated; argv[0] included */
    char *const *envp;          /* NULL-terminated */
    size_t max_out;             /* stdout bytes kept; past it the rest is dropped */
    double grace_s;             /* between the rungs of the stop ladder; <= 0: 2 s */
    /* Called with each chunk of stderr (not NUL-terminated); may be NULL. */
    void (*on_stderr)(void *data, const char *bytes, size_t len);
    /* Asked about every 100 ms until the program is reaped; the first true starts
     * the stop, later answers change nothing. May be NULL. */
    bool (*cancelled)(void *data);
    void *data;
} dk_proc_spec_t;

typedef struct {
    char *out;                  /* stdout, NUL-terminated (owned: dk_proc_result_free) */
    size_t out_len;
    bool out_overflow;          /* stdout passed max_out: OUT holds its first part */
    bool cancelled;             /* the cancel callback stopped it */
    int exit_code;              /* its exit status, or -1 when a signal ended it */
    int term_signal;            /* the signal that ended it, or 0 */
} dk_proc_result_t;

/* Run SPEC->path to its end and fill RES. Returns 0 once the program has run
 * and been reaped, however it ended (RES says how), or -1 with a reason in ERR
 * when it could not be started (RES then holds nothing to free). */
int dk_proc_run(const dk_proc_spec_t *spec, dk_proc_result_t *res, char *err, size_t errlen);

/* Free what RES holds (safe on a zeroed or already freed result). */
void dk_proc_result_free(dk_proc_result_t *res);

#endif
