/* The row index of one sparse table partition (server/table.c): int64 id -> slot number.
 *
 * Open addressing over `cap` (a power of two) packed 12-byte entries {id, slot + 1}, 0 marking
 * an empty entry, so every int64 id can be stored. Linear probing from the home bucket
 * hash & (cap - 1); deletion shifts the following entries of the probe run back (Knuth's
 * algorithm R), so there are no tombstones and a lookup stops at the first empty entry. The
 * caller keeps the load at most 3/4 (table_index_full, then table_index_grow), which also
 * guarantees an empty entry for every probe to stop at.
 *
 * Not thread-safe: the partition's lock protects it. Private to the server. */
#ifndef SERVER_TABLE_INDEX_H
#define SERVER_TABLE_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "hash.h"

/* Packed to 12 bytes (a quarter less index memory than 16; x86-64 and arm64 load the
 * unaligned id at no measurable cost). Fields are only read and written by value. */
typedef struct __attribute__((packed)) table_index_entry {
    int64_t id;
    uint32_t slot1; /* slot + 1; 0: empty */
} table_index_entry;

typedef struct table_index {
    table_index_entry *e;
    uint32_t cap, count;
} table_index;

/* The hash of an id that places it in a partition (top bits) and in the index (low bits):
 * splitmix64's finalizer of id * G + C. Unrelated to placement_table_hash (which picks the
 * server), so one server's rows still spread over all its partitions. */
static inline uint64_t table_id_hash(int64_t id)
{
    return mix64((uint64_t)id * HASH_GOLDEN_GAMMA + UINT64_C(0x5851F42D4C957F2D));
}

/* Bytes of an index of cap entries. */
static inline uint64_t table_index_bytes(uint64_t cap)
{
    return cap * sizeof(table_index_entry);
}

/* Smallest capacity (a power of two, at least 16, at most 2^31) that holds `rows` at a load
 * of at most 3/4. */
uint32_t table_index_cap_for(uint64_t rows);

/* Makes an empty index of cap entries (a power of two). Returns 0, or -1 when memory runs
 * out. */
int table_index_init(table_index *ix, uint32_t cap);

/* Frees the entries. */
void table_index_fini(table_index *ix);

/* Position of id (hash h = table_id_hash(id)): its entry, or the empty entry where it would
 * go. */
static inline uint32_t table_index_probe(const table_index *ix, int64_t id, uint64_t h)
{
    uint32_t mask = ix->cap - 1, i = (uint32_t)h & mask;
    while (ix->e[i].slot1 != 0 && ix->e[i].id != id)
        i = (i + 1) & mask;
    return i;
}

/* slot + 1 of id, 0 when absent. */
static inline uint32_t table_index_find(const table_index *ix, int64_t id, uint64_t h)
{
    return ix->e[table_index_probe(ix, id, h)].slot1;
}

/* True when one more entry would take the load past 3/4. */
static inline bool table_index_full(const table_index *ix)
{
    return (uint64_t)(ix->count + 1) * 4 > (uint64_t)ix->cap * 3;
}

/* Stores id -> slot1 at pos, an empty entry returned by table_index_probe for id. */
static inline void table_index_put(table_index *ix, uint32_t pos, int64_t id, uint32_t slot1)
{
    ix->e[pos].id = id;
    ix->e[pos].slot1 = slot1;
    ix->count++;
}

/* Removes the entry at pos (an occupied one), shifting back the entries of its probe run.
 * Positions returned by earlier probes are stale afterwards. */
void table_index_delete_at(table_index *ix, uint32_t pos);

/* Doubles the capacity, rehashing every entry. Returns 0, or -1 (the index unchanged) when
 * memory runs out or the capacity would pass 2^31. */
int table_index_grow(table_index *ix);

#endif /* SERVER_TABLE_INDEX_H */
