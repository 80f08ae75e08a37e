/*
 * dk_rankpath: which folders a rank on another node may run in and import from.
 *
 * A rank that srun started on a node goes to the kernel's folder where that
 * node has it, and imports through the kernel's sys.path. Where a path is not
 * shared (/tmp/proj, node-local scratch), another user of that node can
 * create it first, with a torch.py in it, and the rank would run their code
 * as its own. So on another node a folder or sys.path entry is used only if
 * it passes dk_logdir's check for code (DK_LOGDIR_CODE): every component
 * opened with O_NOFOLLOW and checked on its descriptor (root's or the
 * user's, writable by others only when sticky), the entry itself the
 * user's or root's and writable by nobody else. The policy (what replaces a
 * refused folder, what the log says) is distkernel._rank's.
 *
 * Part of distkernel-rank only (rank_main.c registers it before CPython
 * starts), as the built-in module _distkernel_rankpath:
 *   open(path) -> fd
 *       PATH checked as above (relative to the working directory when
 *       relative); a descriptor on it (O_CLOEXEC; the caller closes: a folder
 *       is entered with os.fchdir on it, so what was checked is where the
 *       rank runs). OSError otherwise, its errno the failed call's
 *       (FileNotFoundError: nothing there) or EACCES (PermissionError) when
 *       what is there is refused, its text saying why.
 */
#ifndef DK_RANKPATH_H
#define DK_RANKPATH_H

#include "dk_pyabi.h"

#define DK_RANKPATH_MODULE "_distkernel_rankpath"

/* For PyImport_AppendInittab, before the interpreter starts. */
PyObject *dk_rankpath_init(void);

#endif
