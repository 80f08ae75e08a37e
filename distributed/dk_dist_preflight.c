/*
 * dk_dist_preflight: check=True before a run. See the header.
 */
#include "dk_pyabi.h"

#include "dk_dist_preflight.h"
#include "dk_check.h"
#include "dk_nccl.h"

#include <string.h>

int dk_dist_preflight(dk_stream_t *stream, bool gpu)
{
    if (!gpu) {
        static const char line[] = "check=True: CPU ranks, no GPU to check\n";
        dk_stream_write(stream, DK_STDERR, line, sizeof line - 1);
        return 0;
    }
    bool interrupted;
    char err[1024];
    json_t *report = dk_check_run(stream, NULL, &interrupted, err, sizeof err);
    if (!report) {
        if (interrupted)
            PyErr_SetString(PyExc_KeyboardInterrupt, "interrupted during the GPU check");
        else
            PyErr_Format(PyExc_RuntimeError, "the NCCL preflight check could not run: %s", err);
        return -1;
    }
    const char *verdict = json_string_value(json_object_get(report, "verdict"));
    char *text = dk_nccl_report_text(report);
    if (text) {
        dk_stream_write(stream, DK_STDOUT, text, strlen(text));
        free(text);
    }
    int rc = 0;
    if (verdict && strcmp(verdict, "failed") == 0) {
        const char *summary = json_string_value(json_object_get(report, "summary"));
        PyErr_Format(PyExc_RuntimeError,
                     "the NCCL preflight check failed (%s); no rank was started",
                     summary ? summary : "see the report above");
        rc = -1;
    }
    json_decref(report);
    return rc;
}
