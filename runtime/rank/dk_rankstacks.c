/*
 * dk_rankstacks: the end line after a rank's dump. See the header.
 *
 * The handler runs inside faulthandler's (which raises the signal again with
 * ours in place), on whatever thread the signal was delivered to, and may
 * interrupt anything: it only writes, with errno kept.
 *
 * What the signal interrupts: faulthandler registers with chain=True without
 * SA_RESTART, so a blocking system call of the thread that takes the signal
 * returns EINTR, as it does for every signal CPython handles (its handlers
 * have no SA_RESTART either). Python retries its own calls (PEP 475), gloo's
 * collectives retry, but torch's rendezvous (init_process_group) does not
 * ("RuntimeError: Interrupted system call"). So this signal is sent only when
 * the rank is about to be ended anyway. A live sample, while the ranks run on
 * (distributed/dk_dist_stall.h), is DK_SAMPLE_SIGNAL instead, sent to a
 * thread of the rank's own that blocks it and takes it with sigwait, then
 * dumps with the GIL (python/distkernel/_rankstacks.py), so nothing is
 * interrupted. Taking the dump signal on such a thread without the GIL was
 * tried: faulthandler then reads the main thread's frames while it runs, and
 * ranks sampled every 50 ms died of SIGSEGV.
 */
#include "dk_rankstacks.h"
#include "dk_io.h"
#include "dk_stackreq.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t end_fd = -1;

static void write_end(int sig)
{
    (void) sig;
    int saved = errno;
    int fd = end_fd;
    if (fd >= 0)
        (void) dk_write_all(fd, DK_STACKS_END, sizeof DK_STACKS_END - 1);
    errno = saved;
}

static PyObject *arm(PyObject *self, PyObject *arg)
{
    (void) self;
    long fd = PyLong_AsLong(arg);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0 || fd > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "arm() needs an open file descriptor");
        return NULL;
    }
    end_fd = (int) fd;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = write_end;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    if (sigaction(DK_STACKS_SIGNAL, &sa, NULL) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(DK_STACKS_SIGNAL);
}

static PyMethodDef methods[] = {
    {"arm", arm, METH_O,
     "arm(fd) -> signum: write the end line to FD after each dump on signum"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, DK_RANKSTACKS_MODULE,
                                    "The end line after a rank's stack dump (runtime/rank/dk_rankstacks.h).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyObject *dk_rankstacks_init(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "SIGNAL", DK_STACKS_SIGNAL) < 0 ||
              PyModule_AddIntConstant(m, "SAMPLE", DK_SAMPLE_SIGNAL) < 0 ||
              PyModule_AddStringConstant(m, "READY", DK_STACKS_READY) < 0 ||
              PyModule_AddStringConstant(m, "READY_SAMPLER", DK_STACKS_READY_SAMPLER) < 0 ||
              PyModule_AddStringConstant(m, "END", DK_STACKS_END) < 0))
        Py_CLEAR(m);
    return m;
}
