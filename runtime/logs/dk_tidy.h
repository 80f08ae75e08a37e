/*
 * dk_tidy: a process's temporary folders, removed when the process ends,
 * however it ends.
 *
 * The kernel and the node agent make folders under TMPDIR (or /tmp) that live
 * while something uses them: the back channel's socket, a warm-start
 * template's, the ranks' stacks sockets, the cells' source files
 * (python/distkernel/_cells.py). Each is removed by whoever made it when it
 * is done. A SIGKILLed kernel (jupyter_client's shutdown_kernel(now=True), a
 * crash, the OOM killer) runs none of that, so each would stay in a shared
 * /tmp for good: one folder a run, for every user on the login node.
 *
 * So each folder is kept with a watcher: one process per host process,
 * forked at the first dk_tidy_keep and never exec'd, named distkernel-tidy in
 * ps, in its own process group with SIGINT, SIGTERM, SIGHUP and SIGPIPE
 * ignored (a Ctrl-C or a hangup meant for the host must not take it first).
 * The host tells it on a socket which folders to keep ("+PATH") and which it
 * removed itself ("-PATH"); when the host ends (a pidfd of it, or the
 * socket's EOF: see dk_spawn.c's wait_for_host for why both), the watcher
 * removes what is still kept and exits. It removes a folder only when it is
 * still the very directory it was told about (device and inode, taken by
 * dk_tidy_keep) and the user's, never following a symlink, and at most three
 * levels deep (these folders hold sockets and files).
 *
 * The watcher runs only async-signal-safe calls (the host has threads) and
 * holds what it keeps in static memory: DK_TIDY_MAX folders of paths under
 * DK_TIDY_PATH_MAX bytes. A folder past either is not kept (dk_tidy_keep
 * returns -1): it still works, and is removed as before when its maker is
 * done; only a SIGKILL would leave it.
 *
 * A process forked from the host without exec (os.fork in a cell) that keeps
 * a folder starts a watcher of its own. dk_tidy_end ends the watcher at a
 * normal exit, after what it kept is removed, so that the host leaves no
 * child behind; it is registered with atexit when the watcher starts, so a
 * process that ends by exit() needs no call of its own, and one that ends by
 * _exit (the kernel) calls it first.
 */
#ifndef DK_TIDY_H
#define DK_TIDY_H

#include <stddef.h>
#include <sys/types.h>

#define DK_TIDY_MAX 256
#define DK_TIDY_PATH_MAX 512

/* Start the watcher now, if it is not running: a fork holds, for its life,
 * the pages the host has at the fork (the host's later writes copy them), so
 * a long-lived host starts it while it is small, before its interpreter and
 * threads (the kernel's main, the agent's). dk_tidy_keep starts it otherwise.
 * Returns 0, or -1 with a reason in ERR. */
int dk_tidy_start(char *err, size_t errlen);

/* Remove the folder PATH (absolute) when this process ends, unless
 * dk_tidy_forget is called for it first. Returns 0, or -1 with a reason in
 * ERR (ERR may be NULL) when it will not be: the path is relative, too long
 * or not a folder, or the watcher could not be started. Past DK_TIDY_MAX
 * folders kept at once, the watcher keeps no more (and says nothing). */
int dk_tidy_keep(const char *path, char *err, size_t errlen);

/* The folder PATH is removed (or to be kept for good): the watcher forgets it. */
void dk_tidy_forget(const char *path);

/* The watcher removes what it still keeps and exits; this waits for it (a
 * few milliseconds). For the end of the host's main; a dk_tidy_keep after it
 * keeps nothing. */
void dk_tidy_end(void);

/* The watcher's pid, or -1 when none was started (for tests). */
pid_t dk_tidy_pid(void);

#endif
