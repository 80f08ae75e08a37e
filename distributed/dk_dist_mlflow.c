/*
 * dk_dist_mlflow: a run's MLflow variables, notes and link. See the header.
 *
 * The ranks get the run's variables in their environment rather than as
 * arguments, so that `mlflow.log_metric` in the user's code, which reads them,
 * logs to the run without being told.
 */
#include "dk_pyabi.h"

#include "dk_dist_mlflow.h"
#include "dk_html.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

static void note_line(dk_kernel_t *kernel, const char *note)
{
    if (!note[0])
        return;
    char line[1200];
    int n = snprintf(line, sizeof line, "%s\n", note);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    dk_stream_write(dk_kernel_stream(kernel), DK_STDERR, line, (size_t)n);
}

/* The notebook's active MLflow run id, if its Python has one (malloc'd). */
static char *active_parent_run(void)
{
    PyObject *mod = PyImport_ImportModule("distkernel._dist");
    PyObject *res = mod ? PyObject_CallMethod(mod, "active_mlflow_run", NULL) : NULL;
    Py_XDECREF(mod);
    char *out = NULL;
    if (res && PyUnicode_Check(res))
        out = strdup(dk_py_utf8(res));
    Py_XDECREF(res);
    PyErr_Clear();
    return out;
}

static bool is_mlflow_var(const char *entry)
{
    return strncmp(entry, "MLFLOW_TRACKING_URI=", 20) == 0 ||
           strncmp(entry, "MLFLOW_RUN_ID=", 14) == 0 ||
           strncmp(entry, "MLFLOW_EXPERIMENT_ID=", 21) == 0;
}

/* environ with the MLFLOW_* variables of SELF in place of its own. */
static char **ranks_env(dk_dist_mlflow_t *self)
{
    snprintf(self->env[0], sizeof self->env[0], "MLFLOW_TRACKING_URI=%s",
             self->tracked.tracking_uri);
    snprintf(self->env[1], sizeof self->env[1], "MLFLOW_RUN_ID=%s", self->tracked.run_id);
    snprintf(self->env[2], sizeof self->env[2], "MLFLOW_EXPERIMENT_ID=%s",
             self->tracked.experiment_id);
    /* MLflow 3's client prints "View run ... at: URL" and "View experiment
     * at: URL" when a rank's run ends: two lines a rank, 2,048 at 1,024
     * ranks, for the link the cell already shows once. Off, unless the user
     * chose otherwise. */
    int ours = 3;
    if (!getenv("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"))
        snprintf(self->env[ours++], sizeof self->env[0], "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT=true");
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 5, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_mlflow_var(environ[i]))
            env[k++] = environ[i];
    for (int i = 0; i < ours; i++)
        env[k++] = self->env[i];
    env[k] = NULL;
    return env;
}

char **dk_dist_mlflow_begin(dk_dist_mlflow_t *self, dk_tracking_t *tracking, dk_kernel_t *kernel,
                            dk_tracking_request_t req)
{
    char *parent = active_parent_run();
    req.parent_run_id = parent;
    char note[1200];
    dk_tracking_begin(tracking, &req, &self->tracked, note, sizeof note);
    free(parent);
    note_line(kernel, note);
    return self->tracked.active ? ranks_env(self) : NULL;
}

char **dk_dist_mlflow_ranks_env(dk_dist_mlflow_t *self)
{
    return self->tracked.active ? ranks_env(self) : NULL;
}

void dk_dist_mlflow_attempt(dk_dist_mlflow_t *self, dk_kernel_t *kernel, int attempt,
                            int attempts, const char *ended)
{
    if (!self->tracked.active)
        return;
    char value[64], key[64];
    snprintf(value, sizeof value, "%d of %d", attempt, attempts);
    json_t *tags = json_pack("{s:s}", "distkernel.attempt", value);
    if (tags && ended && attempt > 1) {
        /* MLflow keeps a tag's value to 5,000 characters (8,000 today). */
        char line[4096];
        snprintf(line, sizeof line, "%s", ended);
        snprintf(key, sizeof key, "distkernel.attempt.%d", attempt - 1);
        json_object_set_new(tags, key, json_string(line));
    }
    char note[1200] = "";
    if (tags)
        dk_tracking_tag(&self->tracked, tags, note, sizeof note);
    json_decref(tags);
    note_line(kernel, note);
}

void dk_dist_mlflow_end(dk_dist_mlflow_t *self, dk_kernel_t *kernel, const char *status,
                        const dk_dist_artifacts_t *files)
{
    char note[1200];
    dk_tracking_end(&self->tracked, status, note, sizeof note);
    if (note[0] || !files || !self->tracked.active) {
        /* A server that did not take the status takes no logs either: one
         * line says both, and where the logs are. */
        if (note[0] && files && files->log_dir) {
            size_t used = strlen(note);
            snprintf(note + used, sizeof note - used, "; nor the ranks' logs, which are in %s",
                     files->log_dir);
        }
        note_line(kernel, note);
        return;
    }
    dk_dist_mlflow_attach(self, kernel, files);
}

void dk_dist_mlflow_attach(dk_dist_mlflow_t *self, dk_kernel_t *kernel,
                           const dk_dist_artifacts_t *files)
{
    if (!self->tracked.active)
        return;
    size_t n = 0;
    dk_tracked_file_t *list = dk_dist_artifacts_collect(files, &n);
    char why[1024], note[1200];
    size_t stored = dk_tracking_attach(&self->tracked, list, n, why, sizeof why);
    if (stored < n) {
        snprintf(note, sizeof note, "MLflow: %zu of the %zu files of the ranks' logs were not "
                 "stored with the run (%s); every log is in %s", n - stored, n, why,
                 files->log_dir);
        note_line(kernel, note);
    }
    dk_dist_artifacts_free(list, n);
}

void dk_dist_mlflow_slurm(dk_dist_mlflow_t *self, dk_kernel_t *kernel, const char *job_id,
                          const char *nodes)
{
    char note[1200];
    dk_tracking_log_slurm(&self->tracked, job_id, nodes, note, sizeof note);
    note_line(kernel, note);
}

void dk_dist_mlflow_publish_link(dk_dist_mlflow_t *self, dk_kernel_t *kernel)
{
    if (!self->tracked.active)
        return;
    /* The URL comes from the environment and the server, the name from the
     * cell: none of it is markup. */
    const char *url = self->tracked.url;
    char *url_html = dk_html_escape(url);
    char *name_html = dk_html_escape(self->tracked.run_name);
    size_t n = (url_html ? strlen(url_html) : 0) + (name_html ? strlen(name_html) : 0) + 100;
    char *html = url_html && name_html ? malloc(n) : NULL;
    if (html)
        snprintf(html, n, "MLflow run <a href=\"%s\" target=\"_blank\">%s</a>", url_html,
                 name_html);
    free(url_html);
    free(name_html);
    if (!html)
        return;
    char text[2400];
    snprintf(text, sizeof text, "MLflow run %s: %s", self->tracked.run_name, url);
    json_t *content = json_pack("{s:{s:s, s:s}, s:{}, s:{}}", "data", "text/plain", text,
                                "text/html", html, "metadata", "transient");
    dk_stream_flush(dk_kernel_stream(kernel));
    dk_iopub_publish(dk_kernel_iopub(kernel), "display_data", content, NULL);
    json_decref(content);
    free(html);
}
