/* Placement: the hashes that put a variable and a table row in a slot (slots.h says which
 * server holds a slot), the ranges a split variable is cut into today, and the fixed parts it
 * is to be cut into (docs/design.md, "Placement"). Pure functions of the cluster size and the
 * variable's spec, computed identically by every client and checked by every server; there is
 * no coordinator. */
#ifndef PSD_COMMON_PLACEMENT_H
#define PSD_COMMON_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hash.h" /* FNV1A_INIT, fnv1a_update, mix64 */

/* Stable 64-bit FNV-1a hash of a NUL-terminated string (the same on every platform). */
uint64_t placement_hash(const char *name);

/* True if a variable of `bytes` bytes and `numel` elements is split in ranges over all
 * servers: there are at least 2 servers, it has at least num_servers elements, and it is at
 * least threshold_bytes large. */
bool placement_is_split(uint64_t numel, uint64_t bytes, uint64_t threshold_bytes,
                        uint32_t num_servers);

/* Range [*offset, *offset + *count) of a split variable held by `server`: contiguous, in
 * server order, sizes differing by at most one element. */
void placement_range(uint64_t numel, uint32_t num_servers, uint32_t server, uint64_t *offset,
                     uint64_t *count);

/* Hash that places row `id` of the sparse table `name` (proto/README.md, "Placement of table
 * rows", gives it exactly, for clients outside this code base):
 *   x = mix64(placement_hash(name) ^ mix64((uint64_t)id + 0x9E3779B97F4A7C15))
 * where mix64 is splitmix64's finalizer (Stafford's variant 13) and all arithmetic is modulo
 * 2^64; the id is its two's complement value as a uint64 (no byte order involved). */
uint64_t placement_table_hash(const char *name, int64_t id);

/* Fixed parts of a split variable (proto/README.md, "Parts of a split variable"): elements
 * [k * PLACEMENT_PART_ELEMS, (k + 1) * PLACEMENT_PART_ELEMS) form part k, the last part
 * shorter; the same cut for every cluster size, so that a part moves whole with its slot. */
#define PLACEMENT_PART_SHIFT 18u
#define PLACEMENT_PART_ELEMS (UINT64_C(1) << PLACEMENT_PART_SHIFT)

/* True if a variable of `numel` elements and `bytes` bytes is cut in parts: it has more than
 * one part's elements and is at least threshold_bytes large. Unlike placement_is_split, it
 * does not depend on the number of servers (a one-server cluster cuts it too, so that its
 * parts can move to servers that join). */
bool placement_is_parts(uint64_t numel, uint64_t bytes, uint64_t threshold_bytes);

/* Parts of a variable of numel elements: ceil(numel / PLACEMENT_PART_ELEMS) (0 for none). */
uint64_t placement_part_count(uint64_t numel);

/* Range [*offset, *offset + *count) of part `part` (< placement_part_count(numel)) of a
 * variable of numel elements. */
void placement_part_range(uint64_t numel, uint64_t part, uint64_t *offset, uint64_t *count);

/* Part holding element `elem` of a variable cut in parts. */
static inline uint64_t placement_part_of(uint64_t elem)
{
    return elem >> PLACEMENT_PART_SHIFT;
}

/* Hash that places part `part` of the variable `name`: the table row hash with the part index
 * as id, mix64(placement_hash(name) ^ mix64(part + 0x9E3779B97F4A7C15)). */
uint64_t placement_part_hash(const char *name, uint64_t part);

/* placement_table_hash with placement_hash(name) computed once (name_hash), for a list of ids
 * of one table. */
static inline uint64_t placement_table_hash_of(uint64_t name_hash, int64_t id)
{
    return mix64(name_hash ^ mix64((uint64_t)id + HASH_GOLDEN_GAMMA));
}

#endif
