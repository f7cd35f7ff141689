/* The memory layout of a sparse table (table.h), shared by the files that implement it:
 * table.c (rows, slabs, index use, push and pull), table_evict.c (the LRU order, row removal,
 * eviction, the TTL sweep, admission), table_cut.c (copy-on-write checkpoint cuts and their
 * change marks) and table_cold.c (the cold tier: rows on disk). Includes run one way: table.c
 * includes table_evict.h, table_cut.h and table_cold.h, table_evict.c includes table_cut.h and
 * table_cold.h, table_cut.c includes table_cold.h, and all four include this header, which
 * includes none of them (only cold_store.h, the store's interface).
 *
 * Layout of one partition:
 *   index   id -> slot + 1 (table_index.h: open addressing, linear probing, backward-shift
 *           deletion), doubled when it would pass 3/4 full.
 *   slabs   slab_rows rows of row_bytes each, then a dirty bitmap (one bit per slot,
 *           table_cut.h): as many rows as fit in SLAB_BYTES (14 KiB, one of the allocator's
 *           size classes, so that no slab is rounded up by a fraction of a row size: with
 *           152-byte rows a power-of-two count wasted 5%), at least one; slot s lives in slab
 *           s / slab_rows at s % slab_rows. Slabs are never moved or freed before the table, so
 *           a row pointer stays valid under the partition's lock.
 *   rows    a row_header (id, update time, LRU links), then the dim parameters in the table's
 *           dtype (float32, bfloat16 or float16; param_bytes, padded to 4 bytes), then the
 *           optimizer's state in float32 (optimizer_row_shape): nslots arrays of dim floats,
 *           nscalars floats of the row, ncounts uint32 counters of the row. Free slots are
 *           chained through the header's `next`. A row's "floats" (row_to_floats: copies,
 *           checkpoints, restore) are table_row_floats values: the parameters widened to
 *           float32, the slots, the scalars, then each counter as a float.
 *   lru     a doubly linked list of the rows, most recently updated first (table_evict.h).
 *   sketch  with min_count > 1: the admission count-min sketch (table_evict.c).
 *   freq    with ram_rows > 0: how often each id was asked for lately (a count-min sketch of
 *           4-bit counts, halved now and then: table_evict.c), which decides whether a row
 *           read from disk takes the place of a row in RAM, and of which.
 *   cold    with ram_rows > 0: the rows past the partition's share of ram_rows, on disk in the
 *           table's cold store (table_cold.h); a row is in RAM or on disk, never both.
 *
 * table_id_hash(id) gives the partition (its top bits) and the home bucket (its low bits).
 * Private to table.c, table_evict.c, table_cut.c and table_cold.c. */
#ifndef SERVER_TABLE_LAYOUT_H
#define SERVER_TABLE_LAYOUT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cold_store.h"
#include "row_dtype.h"
#include "table.h"
#include "table_index.h"

typedef struct row_header {
    int64_t id;
    int64_t updated_ms;
    uint32_t prev, next; /* LRU neighbours (slot + 1, 0: none); `next` chains free slots */
} row_header;

typedef struct partition {
    pthread_rwlock_t lock;
    table_index ix;
    unsigned char **slabs;
    uint32_t nslabs, slabs_cap;
    uint64_t max_rows;  /* rows kept at most: the partition's share of max_rows (0: none) */
    uint32_t used;      /* slots ever handed out (the rest of the last slab is fresh) */
    uint32_t free_head; /* slot + 1 of the first free slot; 0: none */
    uint32_t lru_head, lru_tail;
    uint16_t *sketch;
    uint32_t sketch_events;
    float *wide; /* 16-bit tables: one row's parameters in float32 (row_make) */
    uint64_t bytes;
    /* Checkpoint cuts (table_cut_begin). A slot's dirty bit (in its slab's bitmap) says its
     * row was made or updated since the partition's last copy; ndirty counts them. */
    uint32_t ndirty;
    uint64_t cut_gen; /* the table's cut_gen this partition was copied for */
    int64_t *gone;    /* ids removed since the last copy (recorded while t->track) */
    size_t ngone, gone_cap;
    bool removed_lost; /* a removal could not be recorded: the next copy is whole */
    /* The cold tier (table_cold.h; t->cold not NULL): rows past ram_rows live on disk. */
    uint64_t ram_rows;       /* rows kept in RAM at most: the partition's share of ram_rows */
    uint64_t cold_rows;      /* rows on disk */
    uint64_t cold_gen;       /* bumped when disk rows go other than by promotion */
    uint64_t cold_moves;     /* bumped by every change to the partition's rows on disk */
    cold_batch *cold_wb;     /* writes gathered under the lock (table_write_unlock writes them) */
    unsigned char *cold_val; /* [table_cold_value_bytes] one row's value (demotion) */
    _Atomic uint8_t *freq;   /* [4 * (freq_mask + 1)] the ids' recent counts (ram_rows > 0) */
    uint32_t freq_mask;      /* a row of the sketch's width - 1 */
    uint32_t freq_sample;    /* counts between two halvings */
    uint32_t freq_hand;      /* the next slot table_ram_admit looks at */
    _Atomic uint32_t freq_events; /* counts since the last halving */
    /* Written under the lock (shared for the lookups): atomics, read by table_stats_get. */
    _Atomic uint64_t lookups, lookup_misses, rows_created, pushes_counted, rows_updated,
        evicted_ttl, evicted_max_rows, evicted_memory, rows_refused, removed, index_growths,
        longest_growth_ns, cold_hits, promotions, demotions;
} partition;

struct table {
    char *name;
    uint64_t name_key; /* placement_hash(name): the initializer's table key */
    uint32_t dim, nslots, row_floats;
    uint32_t nscalars, ncounts; /* the optimizer's per-row floats and counters */
    row_dtype dtype;            /* the parameters' storage type */
    uint32_t param_bytes;       /* bytes of the parameters in a row, padded to 4 */
    size_t row_bytes;
    uint32_t slab_rows;  /* rows per slab */
    uint64_t slab_magic; /* slot / slab_rows by a multiply (slab_split); 0 when slab_rows is 1 */
    uint32_t part_shift; /* partition = hash >> part_shift (64 for one partition) */
    uint32_t nparts;
    optimizer_params opt;
    initializer_params init;
    uint32_t min_count;
    int64_t ttl_ms;
    uint64_t max_rows;
    uint64_t expected_rows;
    uint64_t ram_rows;            /* rows each server keeps in RAM (0: no cold tier) */
    cold_store *cold;             /* the rows that left RAM (ram_rows > 0), else NULL */
    _Atomic uint64_t cold_errors; /* reads and writes of the cold store that failed */
    _Atomic bool cold_full;       /* its disk is short of room (table_cold_room) */
    _Atomic int64_t cold_checked; /* when cold_full was decided (ms, monotonic) */
    _Atomic bool cold_broken;     /* a write failed: no more writes (cold_why says why) */
    _Atomic bool cold_why_taken;  /* the first failed write's thread writes cold_why */
    char cold_why[512];           /* written once, before cold_broken is set */
    bool never_evict;
    table_budget budget;
    uint64_t own_bytes; /* the table struct, name, partition array: taken at creation */
    /* A logical budget (table_budget.logical): the bytes taken at creation beyond own_bytes,
     * and what each row in RAM counts (its bytes and two index entries: the index's load is
     * between 3/8 and 3/4). */
    uint64_t created_bytes;
    uint64_t row_charge;
    partition *parts;
    /* Checkpoint cuts: a partition whose cut_gen differs from the table's is copied into
     * `cut` before anything changes it. */
    _Atomic uint64_t cut_gen;
    struct table_cut *_Atomic cut;
    _Atomic uint32_t pending;  /* partitions not yet copied into `cut` */
    _Atomic bool track;        /* record removed ids (the next chain cut may be a delta) */
    _Atomic uint64_t last_cut; /* the id of the newest chain cut (0: none usable as a base) */
    _Atomic int refs;          /* 1 for the table's owner, 1 per cut not yet freed */
};

static inline uint32_t part_of(const table *t, uint64_t h)
{
    return t->part_shift >= 64 ? 0 : (uint32_t)(h >> t->part_shift);
}

static inline void count_add(_Atomic uint64_t *c, uint64_t v)
{
    atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

static inline uint64_t count_get(_Atomic uint64_t *c)
{
    return atomic_load_explicit(c, memory_order_relaxed);
}

static inline void budget_give(table *t, uint64_t bytes)
{
    if (t->budget.give != NULL && bytes > 0)
        t->budget.give(t->budget.arg, bytes);
}

/* ---- rows and slabs ---------------------------------------------------------------------- */

/* slab_magic for slab_rows d: ceil(2^64 / d), 0 for d = 1 (it would be 2^64). */
static inline uint64_t slab_magic_of(uint32_t d)
{
    return d > 1 ? UINT64_MAX / d + 1 : 0;
}

/* Slot `slot`'s slab (returned) and its place in it (*at): slot / slab_rows and slot % slab_rows
 * without a divide instruction, which row lookups did several times a row (Lemire, Kaser and
 * Kurz, "Faster remainder by direct computation": exact for every 32-bit slot and divisor). */
static inline uint32_t slab_split(const table *t, uint32_t slot, uint32_t *at)
{
    if (t->slab_magic == 0) {
        *at = 0;
        return slot;
    }
    uint64_t low = t->slab_magic * slot;
    *at = (uint32_t)(((unsigned __int128)low * t->slab_rows) >> 64);
    return (uint32_t)(((unsigned __int128)t->slab_magic * slot) >> 64);
}

static inline row_header *row_at(const table *t, const partition *p, uint32_t slot)
{
    uint32_t at, slab = slab_split(t, slot, &at);
    return (row_header *)(p->slabs[slab] + (size_t)at * t->row_bytes);
}

/* The parameters of a row, in the table's dtype (float32: row_state's floats follow them). */
static inline unsigned char *row_params(row_header *h)
{
    return (unsigned char *)(h + 1);
}

/* The optimizer's state of a row: nslots * dim + nscalars floats, then ncounts counters. */
static inline float *row_state(const table *t, row_header *h)
{
    return (float *)(void *)(row_params(h) + t->param_bytes);
}

static inline uint32_t *row_counts(const table *t, row_header *h)
{
    return (uint32_t *)(void *)(row_state(t, h) + (size_t)t->nslots * t->dim + t->nscalars);
}

/* Floats of a row's state that are floats (the counters excluded). */
static inline size_t state_floats(const table *t)
{
    return (size_t)t->nslots * t->dim + t->nscalars;
}

/* out[0..row_floats) = the row's floats (see the layout above). */
static inline void row_to_floats(const table *t, row_header *h, float *out)
{
    row_dtype_widen(t->dtype, out, row_params(h), t->dim);
    size_t nf = state_floats(t);
    memcpy(out + t->dim, row_state(t, h), nf * sizeof(float));
    const uint32_t *c = row_counts(t, h);
    for (uint32_t i = 0; i < t->ncounts; i++)
        out[t->dim + nf + i] = (float)c[i];
}

/* The row's contents from in[0..row_floats) (row_to_floats' form): parameters rounded to the
 * dtype, counters from their floats (clamped to 0 .. 2^32 - 1; NaN as 0). */
static inline void row_from_floats(const table *t, row_header *h, const float *in)
{
    row_dtype_narrow(t->dtype, row_params(h), in, t->dim);
    size_t nf = state_floats(t);
    memcpy(row_state(t, h), in + t->dim, nf * sizeof(float));
    uint32_t *c = row_counts(t, h);
    for (uint32_t i = 0; i < t->ncounts; i++) {
        float v = in[t->dim + nf + i];
        c[i] = v >= 4294967295.0f ? UINT32_MAX : v >= 1.0f ? (uint32_t)v : 0;
    }
}

/* Bytes of a slab's dirty bitmap (after its rows: one bit per slot). */
static inline size_t slab_bitmap_bytes(const table *t)
{
    return ((size_t)t->slab_rows + 63) / 64 * sizeof(uint64_t);
}

/* Bytes of one slab: its rows, then its dirty bitmap. */
static inline size_t slab_size(const table *t)
{
    return (size_t)t->slab_rows * t->row_bytes + slab_bitmap_bytes(t);
}

/* ---- shared by table.c, table_push.c and table_pull.c ----------------------------------- */

/* Row r of id as the initializer and the optimizer make it (update time 0; links untouched). */
void table_row_init(table *t, partition *p, row_header *r, int64_t id);
/* Makes row id in p (write-locked, absent from the index) from the initializer and stores
 * slot + 1 in *out (reserve: as table_row_promote's). Returns TABLE_OK, TABLE_NOMEM, or
 * TABLE_LIMIT when the budget refuses memory and p has no row to evict for room (*out then
 * 0). */
int table_row_make(table *t, partition *p, int64_t id, uint64_t h, bool reserve, uint32_t *out);
/* Promotes id's row from disk (val: its value, table_cold_value_bytes) into p (write-locked,
 * id absent from the index) and stores slot + 1 in *out: first in the LRU order (front) or at
 * its update time's place. reserve: room made first under ram_rows (the least recently
 * updated row to disk); false: room is the caller's (table_ram_admit's victim sent to disk
 * first, or p's RAM holds one row past its share, which the caller sends back to disk:
 * table_demote). TABLE_OK, TABLE_NOMEM or TABLE_LIMIT; on failure the row
 * stays on disk. */
int table_row_promote(table *t, partition *p, int64_t id, uint64_t h, const unsigned char *val,
                      bool front, bool reserve, uint32_t *out);
/* Reads id's row from disk into val (p write-locked) when it is there: true if it was. */
bool table_cold_read_one(table *t, partition *p, int64_t id, unsigned char *val);

/* ---- teardown ---------------------------------------------------------------------------- */

/* Bytes the table holds beyond its struct, name and partition array (taken from the budget). */
static inline uint64_t table_held_bytes(const table *t)
{
    uint64_t b = 0;
    for (uint32_t i = 0; i < t->nparts; i++)
        b += t->parts[i].bytes;
    return b;
}

/* Frees what a partition holds (one that partition_init left half made included). */
static inline void partition_fini(partition *p)
{
    for (uint32_t i = 0; i < p->nslabs; i++)
        free(p->slabs[i]);
    free(p->slabs);
    free(p->gone);
    table_index_fini(&p->ix);
    free(p->sketch);
    free(p->wide);
    cold_batch_free(p->cold_wb);
    free(p->cold_val);
    free((void *)p->freq);
}

/* Frees t once its owner (table_destroy) and every cut (table_cut_free) have let go of it. */
static inline void table_unref(table *t)
{
    if (atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    uint64_t held = table_held_bytes(t);
    if (t->budget.logical) {
        held = t->created_bytes;
        for (uint32_t i = 0; i < t->nparts; i++)
            held += (uint64_t)t->parts[i].ix.count * t->row_charge;
    }
    budget_give(t, t->own_bytes + held);
    for (uint32_t i = 0; i < t->nparts; i++) {
        partition_fini(&t->parts[i]);
        pthread_rwlock_destroy(&t->parts[i].lock);
    }
    free(t->parts);
    cold_store_close(t->cold, true);
    free(t->name);
    free(t);
}

#endif /* SERVER_TABLE_LAYOUT_H */
