/*
 * dk_hostlist: node names written as Slurm writes them, "node[1-16]".
 *
 * The reverse of dk_slurm_hostlist_expand: a set of names in, one host list
 * out, so that a display can say "node[1-14,16]" where it would otherwise
 * name sixteen nodes. What it writes, dk_slurm_hostlist_expand reads back to
 * the same names (sorted, without repeats); the unit tests hold it to that.
 */
#ifndef DK_HOSTLIST_H
#define DK_HOSTLIST_H

#include <stddef.h>

/* NAMES[0..N) (host names: no commas, brackets or blanks; repeats allowed) as
 * one Slurm host list: names that differ only in their last number share a
 * bracket ("node[1-3,5]", "gpu-a[01-03],login5", "rack[1-2]-b"), each range
 * keeping its numbers' width; a name without a number, or alone in its
 * bracket, is written as it is. Sorted by the text around the number, then by
 * the number. Returns a malloc'd string ("" for N 0), or NULL when out of
 * memory. O(N log N). */
char *dk_hostlist_compress(const char *const *names, size_t n);

#endif
