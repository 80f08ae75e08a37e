/*
 * dk_dist_opts_table: the table of %%distributed's options, shared by the
 * files that parse them.
 *
 * Private to the options (dk_dist_opts.h is the API). The options are four
 * files, one idea each:
 *   dk_dist_opts.c        the grammar: the text into name=value tokens, each
 *                         handed to the table, then the checks across options
 *                         (num_processes against GPUs, nodes, launcher and
 *                         the world size);
 *   dk_dist_opts_table.c  the table: one row per option, naming its value's
 *                         parser and its old name; the defaults; the values'
 *                         parsers but the Slurm options'; sizes;
 *   dk_dist_opts_slurm.c  the values of the options of a Slurm cluster, and
 *                         their defaults from the environment;
 *   dk_dist_opts_doc.c    the text of `%%distributed?` and the managed
 *                         platform's names.
 */
#ifndef DK_DIST_OPTS_TABLE_H
#define DK_DIST_OPTS_TABLE_H

#include "dk_dist_opts.h"

#include <stdbool.h>
#include <stddef.h>

/* The parser of an option's value: it gets the option's NAME as written (the
 * old name, for an alias), its VALUE and whether it was QUOTED, and fills its
 * field of O; -1 with ERR. */
typedef int (*dist_opt_parser_t)(const char *name, const char *value, bool quoted,
                                 dk_dist_opts_t *o, char *err, size_t errlen);

/* The table's rows (dk_dist_opts_table.c checks that it has as many). */
#define DIST_OPTS_ROWS 25

/* ---- dk_dist_opts_table.c ---- */

/* Every option's name, for a message about one that is not. */
extern const char dist_opts_accepted[];

/* O with every default: those of the options, and stall_after='s from
 * DK_STALL_AFTER_ENV. -1 with ERR when that variable is wrong. */
int dist_opts_defaults(dk_dist_opts_t *o, char *err, size_t errlen);

/* ---- dk_dist_opts_slurm.c ---- */

/* The Slurm options' defaults, which a site sets once in the environment
 * (the kernelspec's env), onto O: each variable is parsed as its option is.
 * -1 with ERR naming the variable when one is wrong. */
int dist_opts_env_defaults(dk_dist_opts_t *o, char *err, size_t errlen);

/* The parsers of the Slurm options' values, the table's rows. */
int dist_opt_nodes(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                   char *err, size_t errlen);
int dist_opt_launcher(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                      char *err, size_t errlen);
/* partition, account, qos, constraint */
int dist_opt_slurm_name(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                        char *err, size_t errlen);
int dist_opt_slurm_args(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                        char *err, size_t errlen);
int dist_opt_export_secrets(const char *name, const char *value, bool quoted,
                            dk_dist_opts_t *o, char *err, size_t errlen);
int dist_opt_advertise_addr(const char *name, const char *value, bool quoted,
                            dk_dist_opts_t *o, char *err, size_t errlen);

/* One NAME=VALUE (QUOTED: the value was written in quotes) into O; SEEN
 * marks the rows given so far. -1 with ERR for an unknown name, an option
 * given under both its names, or a value its parser refuses. */
int dist_opts_set(const char *name, const char *value, bool quoted, dk_dist_opts_t *o,
                  bool seen[DIST_OPTS_ROWS], char *err, size_t errlen);

/* Whether SEEN marks the option NAME as given. */
bool dist_opts_given(const bool seen[DIST_OPTS_ROWS], const char *name);

#endif
