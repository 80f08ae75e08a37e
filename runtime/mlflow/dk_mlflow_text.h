/*
 * dk_mlflow_text: what dk_mlflow.c and dk_mlflow_text.c share of MLflow's text.
 *
 * Private to runtime/mlflow/ (dk_mlflow.h is the API).
 */
#ifndef DK_MLFLOW_TEXT_H
#define DK_MLFLOW_TEXT_H

#include <stddef.h>

/* S (NULL: "") into OUT, cut to fit; nothing when OUT is NULL or OUTLEN 0. */
void mlflow_copy_str(char *out, size_t outlen, const char *s);

/* Where the userinfo of URI ends: the '@' inside its authority, or NULL. */
const char *mlflow_userinfo_at(const char *uri, const char **authority);

/* URI without user:password@ and without trailing '/' (malloc'd). */
char *mlflow_strip_uri(const char *uri);

#endif
