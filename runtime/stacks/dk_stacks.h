/*
 * dk_stacks: where every rank is, from the stacks its Python threads show.
 *
 * A hung run is explained by the rank that is somewhere else: three ranks wait
 * in all_reduce, one sleeps. Each rank's stacks arrive as the text
 * faulthandler.dump_traceback(all_threads=True) writes (CPython's
 * Python/traceback.c):
 *
 *     Thread 0x00007f083fa2d6c0 (most recent call first):
 *       File "/usr/lib/python3.11/threading.py", line 975 in run
 *
 *     Current thread 0x00007f083fce8040 (most recent call first):
 *       File "/tmp/distkernel-cells-12-ab/1234.py", line 8 in <module>
 *
 * innermost frame first, at most 100 frames per thread ("  ..." after them)
 * and 100 threads ("..."), each string cut at 500 characters, ASCII. This
 * concept turns those texts into a few lines a user reads at any world size:
 *
 *       rank 2:            cell line 6
 *       ranks 0, 1, 3 (3): torch.distributed.all_reduce  (cell line 8)
 *
 * - The rank's stack is its main thread's. CPython lists the newest thread
 *   first, so the main thread is listed last: the stack used is the last
 *   listed thread that runs cell code, or the last listed thread when none
 *   does. "Current thread" only names the thread that asked for the dump, so
 *   it decides nothing. Other threads (data loader workers, threads of
 *   libraries; NCCL's watchdog is C++ and shows no Python frame) count for
 *   nothing in grouping; they are in the full dumps.
 * - Frames of the cell (a file the caller's predicate accepts: the cell files
 *   python/distkernel/_cells.py names by a murmur2 hash of the source) are
 *   shown as "cell line N" ("in f" for a function, "×K" for K equal frames in
 *   a row: a deep recursion is one line).
 * - Library frames are folded to the call the user made: the outermost
 *   library frame called from the innermost cell frame, as module.function
 *   (dk_stacks_call_name). A call into C (time.sleep) shows no frame; the
 *   stack is then the cell line alone.
 * - Ranks with the same signature (the folded call and the chain of cell
 *   frames, file, line and function) form one group; groups are shown
 *   smallest first, ties by lowest rank, since the odd one out is usually
 *   the cause; ranks as runs (dk_ranks_format).
 *
 * - The last collective (GPU runs with torch's NCCL flight recorder on): a
 *   rank's answer may end in one line of DK_STACKS_FLIGHT
 *   ("distkernel flight: op=all_reduce seq=12 state=started bytes=4194304
 *   pg=0", python/distkernel/_flight.py). It does not split groups; each
 *   group line ends in its ranks' last collective ("last all_reduce #12,
 *   4 MiB, started"), the range of sequence numbers when they differ
 *   ("#11–12") and the ranks at the lowest one when only some are there
 *   ("#11: rank 3"), so a rank one collective behind stands out. Ranks
 *   without the line (no recorder, an old torch, a malformed line) are
 *   counted, not guessed.
 *
 * Bounded: a rank's dump is kept up to DK_STACKS_MAX_DUMP bytes (its tail,
 * where the main thread is); groups are found by hashing signatures, so
 * adding N ranks costs O(N) and the summary O(N log N). Not thread-safe: one
 * caller at a time. dk_stacks_fold.c reads and folds one dump; dk_stacks.c
 * groups the ranks and writes what the user reads.
 */
#ifndef DK_STACKS_H
#define DK_STACKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* A rank's dump is kept up to this many bytes, the tail; the rest is counted. */
#define DK_STACKS_MAX_DUMP (64 * 1024)
/* The highest rank accepted (an index by rank is kept). */
#define DK_STACKS_MAX_RANK (1 << 20)
/* The summary's line budget when the caller gives 0 (the 45 lines). */
#define DK_STACKS_MAX_LINES 45

/* Whether FILENAME (as the dump shows it) is a cell's file. */
typedef bool (*dk_stacks_is_cell_fn)(void *data, const char *filename);

typedef struct dk_stacks_t dk_stacks_t;

/* A ready predicate: DATA is a folder's path ending in '/' (the cell files'
 * private folder); a file directly or deeper under it is a cell's. */
bool dk_stacks_is_under(void *data, const char *filename);

/* An empty collection whose cell frames are those IS_CELL(DATA, filename)
 * accepts (IS_CELL NULL: no frame is a cell's). NULL on allocation failure. */
dk_stacks_t *dk_stacks_new(dk_stacks_is_cell_fn is_cell, void *data);
void dk_stacks_destroy(dk_stacks_t **self_p);

/* Add RANK (0 to DK_STACKS_MAX_RANK) on NODE (NULL: "localhost") with its dump DUMP (LEN bytes,
 * any bytes: empty, cut short or garbage give "no Python stack"). The bytes
 * are copied (their tail up to DK_STACKS_MAX_DUMP, as valid UTF-8). Returns 0,
 * or -1 when RANK is negative or already added, or memory ran out (nothing is
 * added then). */
int dk_stacks_add(dk_stacks_t *self, int rank, const char *node, const char *dump, size_t len);

/* How many ranks and how many groups there are. */
size_t dk_stacks_ranks(const dk_stacks_t *self);
size_t dk_stacks_groups(const dk_stacks_t *self);

/* The groups, one line each ("  rank 2:            cell line 6"), smallest
 * first, columns aligned, within MAX_LINES lines (0: DK_STACKS_MAX_LINES);
 * when there are more groups the last line says how many were left out and
 * that FULL_NAME (NULL: "stacks.txt"; "": no file is named) has them. Every line ends in '\n'; text
 * is valid UTF-8, each line under 512 bytes. Empty when no rank was added.
 * The caller frees it; NULL on allocation failure. */
char *dk_stacks_summary(dk_stacks_t *self, size_t max_lines, const char *full_name);

/* Write every rank's dump to OUT, grouped as the summary orders them, each
 * group under a line naming its ranks and where they are, each dump under a
 * line naming its rank and node (the content of stacks.txt). Streams from
 * what dk_stacks_add kept: no more memory than the summary. Returns 0, or -1
 * when writing failed or memory ran out. */
int dk_stacks_write(dk_stacks_t *self, FILE *out);

/* The start of the line a rank's answer ends in when it knows its last
 * collective (python/distkernel/_flight.py): space-separated KEY=VALUE
 * fields, "op" and "seq" required, "state", "bytes", "shape", "pg" optional,
 * others passed over. */
#define DK_STACKS_FLIGHT "distkernel flight: "

/* One rank's last collective, from its flight line. */
typedef struct {
    long long seq;      /* the group's collective sequence number, >= 0 */
    long long bytes;    /* the input's size in bytes; -1: not known */
    char op[32];        /* "all_reduce", no control characters or spaces */
    char state[16];     /* "scheduled", "started", "completed"; "" not known */
    char shape[40];     /* "[1024, 1024]" when BYTES is not known; "" none */
    char pg[24];        /* the process group's id or name; "" not known */
} dk_flight_t;

/* The last line of DUMP (NUL-terminated) that starts with DK_STACKS_FLIGHT,
 * read into OUT. True when there is one with an op and a sequence number;
 * false for none or a malformed one (OUT then zeroed, its seq -1). */
bool dk_flight_parse(const char *dump, dk_flight_t *out);

/* "4 MiB", "512 B", "1.5 GiB" for BYTES (>= 0) into BUF. */
void dk_flight_size(long long bytes, char *buf, size_t len);

/* One rank's stack, as the summary shows it and groups it. */
typedef struct {
    char *call;         /* the folded call ("torch.distributed.all_reduce"), cut to
                         * a line's share, no control characters; NULL when the
                         * stack ends in the cell (a C call such as time.sleep) */
    char *where;        /* "cell line 8", "cell line 4 in f ×100+", "cell line 3
                         * in step ← line 10", "not in the cell", "below the 100
                         * frames shown", "no Python stack" */
    char *signature;    /* equal signatures: the same place (the call and the chain
                         * of cell frames: file, function, line, repeats) */
} dk_stack_t;

/* Read DUMP (NUL-terminated text, valid UTF-8: what dk_stacks_add keeps) and
 * fold its main thread's stack into OUT, cell frames being those IS_CELL(DATA,
 * filename) accepts (IS_CELL NULL: none). Any text gives a result ("no Python
 * stack" when no frame is found). Returns 0, or -1 when memory ran out (OUT
 * is then empty). The caller frees OUT's strings with dk_stack_clear. */
int dk_stack_fold(const char *dump, dk_stacks_is_cell_fn is_cell, void *data, dk_stack_t *out);
void dk_stack_clear(dk_stack_t *stack);

/* The dotted name of FUNC in FILE as the user would call it:
 * ".../dist-packages/torch/distributed/distributed_c10d.py" and "all_reduce"
 * give "torch.distributed.all_reduce". The module is the path under the last
 * site-packages/ or dist-packages/ folder, else under the standard library's
 * lib/pythonX.Y/, else the file's own name; without ".py" and "/__init__";
 * folders and modules whose name starts with '_' (after the first) are
 * dropped, as are the implementation modules torch re-exports from its
 * packages (distributed_c10d, c10d_logger). FUNC "<module>" gives the
 * module. The caller frees it; NULL on allocation failure. */
char *dk_stacks_call_name(const char *file, const char *func);

#endif
