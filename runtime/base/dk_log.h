/*
 * dk_log: the kernel's own messages, all through one path.
 *
 * While a cell runs, the process's fd 2 is the cell's captured stderr
 * (protocol/dk_stream): a message the kernel or its runtime wrote there with
 * fprintf(stderr) would show in the user's cell, among the rank output, as if
 * the cell had printed it. The kernel's own messages (a Slurm job it could
 * not release, why ranks started cold under DISTKERNEL_DEBUG, a folder it
 * cannot tell) go to its log instead: the descriptor dk_log_to names, which
 * the kernel sets to its original stderr (dk_stream_log_fd) before any cell
 * runs. Until then, and in programs that never set it, fd 2.
 *
 * What the user must read in the cell goes into the cell (the run's stderr
 * lines, the error), never here.
 */
#ifndef DK_LOG_H
#define DK_LOG_H

/* Log to FD from now on (the kernel's original stderr). */
void dk_log_to(int fd);

/* "[distkernel] TEXT\n" to the log, printf-style, in one write (lines from
 * two threads do not mix); past 2 KiB the text is cut. */
void dk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
