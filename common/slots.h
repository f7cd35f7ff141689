/* Slots: the fixed set of buckets that placement maps names and table rows into, and the map
 * that says which server task holds each slot (docs/design.md, "Slots"; proto/README.md,
 * "Placement" gives the functions exactly, for clients outside this code base).
 *
 * A cluster has SLOTS_DEFAULT slots for its whole life (a power of two, recorded in
 * checkpoints). A variable that is not split lives in slot placement_hash(name) & (S-1); row
 * `id` of a sparse table in slot placement_table_hash(table, id) & (S-1); part k of a variable
 * cut in parts in slot placement_part_hash(name, k) & (S-1). The slot map gives
 * each slot's server task; for a static cluster spec of N servers it is slot s -> s % N
 * (slots_static). Every owner computation of the client and the server goes through here.
 * Pure functions, no state: thread-safe. */
#ifndef PSD_COMMON_SLOTS_H
#define PSD_COMMON_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

#include "placement.h" /* placement_table_hash_of */

/* Slots of a cluster: 4096, a power of two, fixed for the life of a cluster. */
#define SLOTS_DEFAULT 4096u

/* Which server task holds each slot. A map made by slots_static (owner NULL) is the static
 * map of a cluster spec of nservers servers: slot s -> s % nservers. A map with an owner
 * table (nslots entries, each < nservers) is an explicit one: the form a map published by a
 * cluster view takes once slots move. */
typedef struct slot_map {
    uint32_t nslots;   /* a power of two */
    uint32_t nservers; /* server tasks; 0: an empty map (every slot's owner is 0) */
    const uint32_t *owner;
} slot_map;

/* The static map of a cluster of nservers servers over nslots slots (a power of two). */
slot_map slots_static(uint32_t nslots, uint32_t nservers);

/* True if n is a usable slot count: a power of two from 1 to 2^24. */
bool slots_count_valid(uint64_t n);

/* Slot of a 64-bit placement hash: h & (nslots - 1). */
static inline uint32_t slots_of_hash(uint64_t h, uint32_t nslots)
{
    return (uint32_t)(h & (uint64_t)(nslots - 1));
}

/* Slot of a variable that is not split: placement_hash(name) & (nslots - 1). */
uint32_t slots_of_name(const char *name, uint32_t nslots);

/* Slot of row `id` of the sparse table `table`: placement_table_hash(table, id) & (nslots-1). */
uint32_t slots_of_row(const char *table, int64_t id, uint32_t nslots);

/* Slot of part `part` of the variable `name` cut in parts: placement_part_hash(name, part) &
 * (nslots - 1). */
uint32_t slots_of_part(const char *name, uint64_t part, uint32_t nslots);

/* Server task holding slot `slot` under m. */
uint32_t slots_owner(const slot_map *m, uint32_t slot);

/* Server task holding the variable `name` (not split) under m. */
uint32_t slots_name_owner(const slot_map *m, const char *name);

/* Server task holding row `id` of the sparse table `table` under m. Every table spans every
 * server. */
uint32_t slots_row_owner(const slot_map *m, const char *table, int64_t id);

/* Server task holding part `part` of the variable `name` cut in parts, under m. */
uint32_t slots_part_owner(const slot_map *m, const char *name, uint64_t part);

/* The same with the table's placement_hash(table) given (table_hash), for a list of ids. */
static inline uint32_t slots_row_owner_h(const slot_map *m, uint64_t table_hash, int64_t id)
{
    return slots_owner(m, slots_of_hash(placement_table_hash_of(table_hash, id), m->nslots));
}

/* The client id under which a server keeps the exactly-once window of `client`'s stream of
 * updates to server `from`, once slots of `from` moved to it (the window came with them), and
 * under which the client resends there an update that `from` refused as moved (same seq):
 * mix64(client ^ mix64((from + 1) * 0x9E3779B97F4A7C15)), or that xor 1 where it would equal
 * client. A request that follows two moves composes it per hop. */
uint64_t slots_stream_client(uint64_t client, uint32_t from);

/* The client id of one piece of an update that server `from` refused as moved, unapplied
 * (its window proved it), cut by the slot map of `version` and sent to server `to` (not
 * `from`) with the same seq: a key of its own, stable across the piece's resends and never
 * that of another piece, so that the piece is applied once there whatever else of the same
 * seq reached `to` (another piece, or a window that came with slots). stream is
 * slots_stream_client(client, from) of the key the update went to `from` with; seq the
 * update's (a Step's: its first push's). Another piece of that update's chain on `from` is cut
 * to `to` only at a later version (what stayed on `from` is all `from`'s at `version`), so no
 * two pieces share one. mix64 of the four, or that xor 1 where it would equal stream. */
uint64_t slots_piece_client(uint64_t stream, uint64_t seq, uint64_t version, uint32_t to);

#endif
