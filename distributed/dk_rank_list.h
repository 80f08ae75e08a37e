/*
 * dk_rank_list: a set of ranks written as a list, "0,8,16-31".
 *
 * output= takes one: at a thousand ranks, every rank's lines in one cell are
 * unreadable, and the user names the few to watch. A list is ranks and
 * inclusive ranges (FIRST-LAST) separated by commas, blanks allowed around
 * them; a rank listed twice, or ranges that overlap, mean the union (writing
 * 0,0-7 is no mistake worth refusing a run for). A range written backwards
 * (3-1), a word, an empty item or a negative number is refused with what to
 * write instead.
 *
 * The text is checked twice. When the cell's options are parsed the world
 * size is not known (it may come from the node's GPUs or from sinfo), so only
 * the syntax is, and that no rank is past the most ranks any run has. Once
 * the run is planned, before any rank starts, the list becomes the set of the
 * world's ranks, and a rank past the world's last is an error naming the
 * world. Pure: no allocation, bounded by DK_RANK_LIST_RANKS_MAX.
 */
#ifndef DK_RANK_LIST_H
#define DK_RANK_LIST_H

#include <stdbool.h>
#include <stddef.h>

/* The most ranks a run has (the options' bound on num_processes and
 * num_accelerators): a listed rank is below it. */
#define DK_RANK_LIST_RANKS_MAX 4096

/* Parse TEXT, a list of ranks, for a run of WORLD ranks into SHOWN (WORLD
 * entries: true for each rank listed, false for the others). WORLD <= 0: the
 * world is not known yet; only the syntax and DK_RANK_LIST_RANKS_MAX are
 * checked, and SHOWN may be NULL. Returns the number of distinct ranks listed
 * (0 when WORLD <= 0), or -1 with ERR saying what is wrong, quoting the item,
 * and what to write instead. */
int dk_rank_list_parse(const char *text, int world, bool *shown, char *err, size_t errlen);

#endif
