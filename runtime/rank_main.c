/*
 * distkernel-rank: one rank of a distributed job.
 *
 * Started by the runtime (runtime/dk_job.c) with the rank's environment; it
 * embeds the same CPython as the kernel and runs distkernel._rank.main(), which
 * talks to the kernel over the back channel (and decides how the rank's
 * output is buffered).
 */
#include "dk_pyinit.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    /* A rank stopped while Python is still starting (another rank failed at
     * once, the cell was interrupted) would print a "Fatal Python error" in the
     * cell. SIGINT stays blocked until distkernel._rank is about to run the
     * user's code; one that came meanwhile is delivered then, and ends the
     * rank quietly. SIGTERM and SIGKILL, which follow, are not blocked. */
    sigset_t sigint;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    sigprocmask(SIG_BLOCK, &sigint, NULL);
    char err[512];
    if (dk_pyinit_start("distkernel-rank", err, sizeof err) < 0) {
        fprintf(stderr, "distkernel-rank: %s\n", err);
        return 1;
    }

    int rc = 1;
    PyObject *mod = PyImport_ImportModule("distkernel._rank");
    PyObject *res = mod ? PyObject_CallMethod(mod, "main", NULL) : NULL;
    if (res) {
        rc = (int)PyLong_AsLong(res);
        Py_DECREF(res);
    } else if (PyErr_ExceptionMatches(PyExc_SystemExit)) {
        PyErr_Print();   /* exits with the SystemExit's code */
    } else {
        PyErr_Print();
    }
    Py_XDECREF(mod);
    if (Py_FinalizeEx() < 0 && rc == 0)
        rc = 120;
    return rc;
}
