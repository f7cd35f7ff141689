/* Sparse tables: int64 id -> a row of `dim` parameters (float32, bfloat16 or float16) and its
 * optimizer's per-row state (float32).
 *
 * A table is the server-side store of one sparse embedding table's rows held by this server
 * (which rows a server holds is common/slots.h's slots_row_owner). Rows are made
 * on first touch, by a push, from the row initializer (initializer_fill_row: a pure function
 * of (seed, table name, id)); a pull of an id that has no row returns that initializer row
 * without making it.
 *
 * Storage. The table is split into `partitions` partitions (a power of two, default 64) by
 * the top bits of a mix of the id; each has its own lock, its own open-addressing index
 * (linear probing, deletion by backward shift: no tombstones; doubled by itself past 3/4
 * full, so a growth stalls only that partition) and its own slabs of rows (a row is a
 * 24-byte header (id, update time, LRU links) then dim parameters in the table's dtype then the
 * optimizer's state: dim floats per slot, and the row's own scalars and counters
 * (optimizer_row_shape), contiguous; slabs are allocated SLAB_BYTES at a time, never per row;
 * removed rows' slots are reused first). Pushes to different partitions apply in parallel; pulls
 * take a partition's lock shared.
 *
 * ids: every int64 value is a valid id, negative ones included (they are hashed as their
 * two's complement uint64; nothing is reserved).
 *
 * Gradients: a batch is applied as one sparse step: duplicate ids are summed first (in the
 * batch's order), then each distinct row gets one optimizer update. Optimizers are lazy: only
 * the rows of the batch change; Adam's step count t is one counter per row, so a row's bias
 * correction counts that row's updates. A 16-bit table (dtype) widens a row's parameters to
 * float32 for the update and rounds them back (to nearest, ties to even); its optimizer state
 * stays float32. Pulls widen; the rows travel in float32 (or the client's wire-dtype). A batch
 * holding a NaN or infinite gradient is refused whole (nothing applied). A finite gradient whose
 * update would overflow a row (a parameter or slot to inf or NaN) is refused for that row: the row
 * keeps its values (TABLE_OVERFLOW), so a table never holds a non-finite value.
 *
 * Admission and eviction (all optional, per table):
 *   min_count  a row is made only by the push that brings its id's count to min_count (a
 *              batch counts an id once); earlier pushes are only counted, in a per-partition
 *              count-min sketch (4 x 1024 saturating 16-bit counters, every counter halved
 *              after 8192 counted pushes so old counts fade), so an id may be admitted early
 *              (the sketch over-counts), never late. Their gradients are dropped.
 *   ttl_ms     table_sweep(now) removes rows whose last update is older than ttl_ms.
 *   max_rows   each partition keeps at most its share of max_rows (max_rows / partitions, one
 *              more for the first max_rows % partitions of them): making a row in a full
 *              partition first evicts its least recently updated row, and the new row gets its
 *              gradient (exact LRU per partition, approximately LRU per table since ids spread
 *              evenly over partitions; a partition's evictions depend on its own updates
 *              only). A table with max_rows below the partition count has fewer partitions
 *              (the largest power of two not above max_rows), so that every share is at least
 *              one row and a push under max_rows always applies.
 *   budget     every byte the table allocates (slabs, indexes, sketches, its own struct) is
 *              first asked of an optional budget (the server's max-server-bytes). When it
 *              refuses, the partition's least recently updated row makes room instead
 *              (evicted_memory); only when the partition has none (or the table is
 *              never_evict) is the row refused (TABLE_LIMIT). Memory is given back to the
 *              budget only by table_destroy: slabs and indexes are kept for reuse. A logical
 *              budget (table_budget.logical, replicated groups) counts rows instead: each row
 *              in RAM its bytes and index share, given back when it leaves RAM.
 *
 * Cold tier (ram_rows > 0): each partition keeps at most its share of ram_rows rows in RAM
 * (at least one); a row that leaves RAM by LRU (past that share) or because the budget refused
 * memory goes to disk, bit for bit with its optimizer state and update time, into the table's
 * cold store (cold_store.h, a new directory under cold_dir, removed by table_destroy) instead
 * of being dropped. A pull or push of an id on disk reads it back (one read of the store per
 * partition a call touches, not one per id) and promotes it into RAM (a pushed row first in the
 * LRU order, a pulled one at its update time's place; a replicated table's (logical budget)
 * reads promote none: its tiers change by logged pushes alone). Results are the same as the table
 * kept wholly in RAM. max_rows counts both tiers and deletes the least recently updated cold
 * row first (by update time); the TTL sweep deletes expired rows on disk too; table_remove,
 * table_partition_clear, copies, export and checkpoint cuts cover both tiers (a cut of a table
 * with a cold tier is always whole). The store's memory (block cache, memtable) is not counted
 * in the budget.
 *
 * Times are milliseconds on the caller's clock (any monotonic clock), passed to each call.
 *
 * Checkpoints: table_cut_begin/finish (below) copy the table as it was at one moment, whole
 * or as a delta of the previous chain cut, without holding updates off for the copy.
 *
 * Thread safety: every function may be called from any number of threads at once, except
 * table_destroy. Private to the server. */
#ifndef SERVER_TABLE_H
#define SERVER_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "initializer.h"
#include "optimizer.h"
#include "row_dtype.h"

/* Limits of a table's settings. */
#define TABLE_MAX_DIM 65536
#define TABLE_MAX_NAME 255
#define TABLE_MAX_PARTITIONS 256
#define TABLE_DEFAULT_PARTITIONS 64

typedef struct table table;

/* Results of the calls that can fail. */
enum {
    TABLE_OK = 0,
    TABLE_INVALID = -1,  /* a bad argument: spec field, non-finite gradient (INVALID_ARGUMENT) */
    TABLE_NOMEM = -2,    /* the allocator failed */
    TABLE_LIMIT = -3,    /* the budget refused and no row could be evicted (RESOURCE_EXHAUSTED) */
    TABLE_OVERFLOW = -4, /* an update would have left a row non-finite (inf or NaN) from finite
                            gradients: that row was left unchanged (FAILED_PRECONDITION) */
    TABLE_DISK = -5,     /* the disk of the cold tier is short of room (or failed a write): rows
                            that needed it were not written (RESOURCE_EXHAUSTED) */
};

/* Where the table's memory is accounted. take(arg, bytes) is called before an allocation, under
 * a partition's lock, from any thread: true grants the bytes, false refuses them (it must not
 * call back into the table). give(arg, bytes) returns bytes taken. Both NULL: no limit. */
typedef struct table_budget {
    bool (*take)(void *arg, uint64_t bytes);
    void (*give)(void *arg, uint64_t bytes);
    void *arg;
    /* Counts rows, not allocations: the empty table's bytes at creation, then each row in RAM
     * its row's bytes and two index entries (table_layout.h, row_charge), taken when the row
     * is made and given back when it leaves RAM; slabs and index growth ask nothing. What the
     * budget refuses and which rows it evicts then follow from the rows alone, the same on
     * every copy of a replicated group whatever its memory layout (a copy restored compact, or
     * one that reuses the slots of removed rows). */
    bool logical;
} table_budget;

/* Points t's budget at arg from now on (its owner moved: a state's contents copied into
 * another). No call may use t meanwhile. */
void table_set_budget_arg(table *t, void *arg);

/* Settings of a table, all fixed at creation. */
typedef struct table_spec {
    const char *name;        /* 1..TABLE_MAX_NAME bytes; copied */
    uint32_t dim;            /* parameters per row, 1..TABLE_MAX_DIM */
    row_dtype dtype;         /* the parameters' storage (ROW_FLOAT32 when zeroed); 16 bits
                                only with an optimizer whose row shape is narrow_ok */
    optimizer_params opt;    /* any kind of the registry, FTRL included; validated */
    initializer_params init; /* ZEROS, CONSTANT, UNIFORM or NORMAL; validated */
    uint32_t min_count;      /* pushes of an id before its row is made; 0 or 1: the first */
    int64_t ttl_ms;          /* rows not updated for this long go at table_sweep; 0: never */
    uint64_t max_rows;       /* rows kept at most (LRU eviction past it); 0: no limit */
    uint32_t partitions;     /* power of two in 1..TABLE_MAX_PARTITIONS; 0: the default;
                                lowered to max_rows when that is smaller (table.h, max_rows) */
    uint64_t expected_rows;  /* indexes sized for this many rows at creation (no growth stall
                                until past it, up to 2^30 a partition); 0: grow from small */
    table_budget budget;     /* memory accounting; zeroed: none */
    bool never_evict;        /* rows leave only by table_remove: when the budget refuses, the
                                new row is refused (TABLE_LIMIT) instead of evicting one. For
                                rows that hold acknowledged state (BSP aggregates); max_rows and
                                ttl_ms must be 0 */
    uint64_t ram_rows;       /* rows kept in RAM at most, the rest on disk (the cold tier);
                                0: every row in RAM. Needs cold_dir, a build with RocksDB, and
                                not never_evict */
    const char *cold_dir;    /* the directory under which the cold store is made (ram_rows) */
} table_spec;

/* Counters since creation (table_stats). */
typedef struct table_stats {
    uint64_t rows;              /* rows held now */
    uint64_t bytes;             /* memory held: slabs, indexes, sketches, the table itself */
    uint64_t row_bytes;         /* bytes of one row in a slab (header, parameters, slots) */
    uint64_t lookups;           /* ids looked up by table_pull */
    uint64_t lookup_misses;     /* of which had no row (the initializer's row was returned) */
    uint64_t rows_created;      /* rows made by pushes (admissions) and table_insert_row */
    uint64_t pushes_counted;    /* pushed ids held back by min_count (gradient dropped) */
    uint64_t rows_updated;      /* row updates applied (a distinct id per batch counts one) */
    uint64_t evicted_ttl;       /* rows removed by table_sweep */
    uint64_t evicted_max_rows;  /* rows removed to stay within max_rows */
    uint64_t evicted_memory;    /* rows removed because the budget refused memory */
    uint64_t rows_refused;      /* new rows not made: budget refused, nothing to evict */
    uint64_t removed;           /* rows removed by table_remove */
    uint64_t index_growths;     /* partition index doublings */
    uint64_t longest_growth_ns; /* the longest of them */
    uint64_t rows_disk;         /* of rows, those on disk (the cold tier) */
    uint64_t bytes_disk;        /* bytes of the cold store's files (an estimate) */
    uint64_t cold_hits;         /* ids pulled or pushed that were found on disk */
    uint64_t promotions;        /* rows moved from disk into RAM */
    uint64_t demotions;         /* rows moved from RAM to disk */
    uint64_t cold_errors;       /* reads and writes of the cold store that failed */
} table_stats;

/* Makes an empty table in *out (the caller's). Returns TABLE_OK; TABLE_INVALID with a message
 * naming the bad field in err (when non-NULL, errlen > 0) for an invalid spec (name empty or
 * too long, dim 0 or over the limit, invalid optimizer or initializer, GLOROT_UNIFORM,
 * min_count over 65535, negative ttl, partitions not a power of two in range, expected_rows
 * over 2^30 a partition, ram_rows without cold_dir, without RocksDB or with never_evict, a cold
 * store that does not open); TABLE_NOMEM;
 * TABLE_LIMIT when the budget refuses the empty table's bytes. *out is NULL on failure. */
int table_create(const table_spec *spec, table **out, char *err, size_t errlen);

/* Frees the table and every row. NULL is a no-op. No other call may be in flight. */
void table_destroy(table *t);

const char *table_name(const table *t);
uint32_t table_dim(const table *t);
/* Floats of a row as copies, checkpoints and table_insert_row have it: dim parameters (widened
 * to float32), then the optimizer's row state (optimizer_row_shape: dim floats per slot, the
 * row's scalars, its counters as floats). */
uint32_t table_row_floats(const table *t);
row_dtype table_dtype(const table *t);

/* The row floats of checkpoints written before a row's Adam step count was one counter:
 * dim * (1 + optimizer_slot_count) (Adam, AdamW: 4 * dim, the step count per element); the
 * same as table_row_floats for every other table. table_row_from_legacy converts one such row
 * into out[0..table_row_floats) (the row's step count: the largest of its elements'). */
uint32_t table_legacy_row_floats(const table *t);
void table_row_from_legacy(const table *t, const float *legacy, float *out);

/* Writes the rows of ids[0..n) into out[0..n*dim), in the given order (duplicates repeated):
 * a row's current parameters, or its initializer row when it has none (no row is made). */
void table_pull(table *t, const int64_t *ids, size_t n, float *out);

/* Brings the rows of ids[0..n) that are on disk (a table with a cold tier) back to RAM, first
 * in the LRU order, so that a pull or push of them soon after finds them there: what a pull
 * does with them, without reading a row out (no lookup or cold hit counted; promotions are).
 * An id with no row makes none. Returns the number of rows brought; 0 for a table all in RAM
 * or replicated (a logical budget: table_pull.c), or when memory for the call runs out (a
 * prefetch is a hint). */
size_t table_prefetch(table *t, const int64_t *ids, size_t n);

/* Applies one batch: grads[i*dim .. (i+1)*dim) is the gradient of ids[i] (grads may be
 * unaligned, host-order float32). Duplicates summed, then one update per distinct row, rows
 * made (evicting under max_rows) or counted as min_count says, their update time set to now_ms.
 * Returns TABLE_OK; with a message in err: TABLE_INVALID (nothing applied) for a non-finite
 * gradient or NULL ids/grads with n > 0; TABLE_LIMIT when rows could not be made under the budget
 * (the message names the table and the first such id; every other row of the batch was
 * applied); TABLE_NOMEM when the allocator fails (rows applied before stay applied);
 * TABLE_OVERFLOW when the update of some row would leave a parameter or optimizer slot
 * non-finite (a finite gradient overflowing float32): those rows are left as they were (the
 * message names the table and the first such id), every other row of the batch was applied.
 * With a cold tier, TABLE_DISK when rows that needed its disk (a row on disk, or a new row
 * once RAM holds its share) were not written because the disk is short of room
 * (cold_store_headroom) or a write to it failed (the message names the directory; every other
 * row of the batch was applied). Several of these: TABLE_NOMEM first, then TABLE_OVERFLOW,
 * then TABLE_DISK, then TABLE_LIMIT. n = 0 is a no-op. */
int table_push(table *t, const int64_t *ids, size_t n, const void *grads, int64_t now_ms, char *err,
               size_t errlen);
/* table_push that also says, for each i, whether the push is done with ids[i] (done[i], the
 * caller's n bools): true when its row was updated, or its gradient dropped for good (counted
 * by min_count, or refused as TABLE_OVERFLOW); false when it was not applied for want of
 * memory or disk (TABLE_NOMEM, TABLE_LIMIT, TABLE_DISK) or the batch was refused (TABLE_INVALID):
 * pushing those again applies each once. Duplicates of an id share its answer. */
int table_push_track(table *t, const int64_t *ids, size_t n, const void *grads, int64_t now_ms,
                     bool *done, char *err, size_t errlen);

/* Removes the rows of ids[0..n) (ids without a row are skipped). Returns the number removed. */
size_t table_remove(table *t, const int64_t *ids, size_t n);

/* Removes every row whose last update is before now_ms - ttl_ms. Returns the number removed;
 * 0 when the table has no ttl. Holds one partition's lock at a time. */
size_t table_sweep(table *t, int64_t now_ms);

/* The admission sketches (min_count > 1) as checkpoints and copies carry them, so that a
 * restored copy admits ids exactly as the one it was taken from: table_sketch_bytes is their
 * size (0 without admission), table_sketch_save writes them to buf (per partition: u32 its
 * events since the last halving, then its counters, u16 each, little-endian) with updates held
 * off, table_sketch_load reads them back into a table of the same spec (0, or -1 when len is
 * not table_sketch_bytes). */
size_t table_sketch_bytes(const table *t);
void table_sketch_save(const table *t, uint8_t *buf);
int table_sketch_load(table *t, const uint8_t *buf, size_t len);

/* Current counters (consistent per partition). */
void table_stats_get(table *t, table_stats *out);

/* A copy of one partition's rows (for checkpoints): ids[i], updated_ms[i] and the row
 * floats[i*row_floats .. (i+1)*row_floats) (parameters then slots), oldest update first.
 * full: every row of the partition; else (a delta cut) only the rows made or updated since
 * the previous chain cut, and removed[0..nremoved) the ids removed since it (evicted, expired,
 * table_remove'd; an id may also be among the rows when it was made again after). */
typedef struct table_rows {
    size_t n;
    uint32_t row_floats;
    int64_t *ids;
    int64_t *updated_ms;
    float *floats;
    bool full;
    size_t nremoved;
    int64_t *removed;
} table_rows;

/* Number of partitions (0 .. table_partitions()-1 for table_copy_partition). */
uint32_t table_partitions(const table *t);

/* Copies partition `part`'s rows into *out under the partition's lock (shared): a consistent
 * copy of that partition; other partitions keep taking updates. Returns 0, or -1 when part
 * is out of range or memory runs out (*out then empty). Free with table_rows_free. */
int table_copy_partition(table *t, uint32_t part, table_rows *out);

/* Whether a row's id is wanted (table_copy_partition_if). Called under a partition's lock: it
 * must not call into the table. */
typedef bool (*table_keep_fn)(void *arg, int64_t id);
/* table_copy_partition of the rows whose id keep(arg, id) accepts, oldest update first (rows
 * updated in the same millisecond in an order of their own; the rows on disk first, as
 * table_copy_partition has them): the ids are read from the partition's index and only the
 * kept rows are read and copied (a slot move's rows of a few slots out of a large table).
 * keep NULL: every row, as table_copy_partition. */
int table_copy_partition_if(table *t, uint32_t part, table_keep_fn keep, void *arg,
                            table_rows *out);

/* Frees what table_copy_partition allocated (rows may be NULL or empty). */
void table_rows_free(table_rows *rows);

/* Checkpoint cuts: a copy of the whole table as it was at one moment, taken without holding
 * updates off for the copy. table_cut_begin only marks every partition pending (O(1) work);
 * from then on each partition is copied into the cut, under its own lock, by whichever comes
 * first: the first call that changes it (push, remove, sweep, insert: it copies, then
 * changes; only callers of that partition wait) or table_cut_finish. So every partition's
 * copy is its state at table_cut_begin. Called while the server holds every update off (its
 * checkpoint freeze), the cut is one point of the update order: exactly the pushes applied
 * before it are in it, as the dedup windows copied in the same freeze say.
 *
 * Chain and snapshot cuts. A chain cut is one of a checkpointer's chain of full and delta
 * files: it consumes the table's change marks. Each slot has a dirty bit (made or updated since
 * its partition's copy by the last chain cut) and, while tracking, each partition records the
 * ids it removes; a delta cut copies only those (table_rows.full false); a partition whose
 * removal record was lost (memory) is copied whole (full true). A snapshot cut (id 0: a copy
 * image, anything that is not the chain's) is always whole and read-only: it leaves the marks,
 * the tracking and the chain's last cut alone, so the chain's next delta is as without it.
 *
 * Cut ids: every chain cut has an id unique in the process (table_cut_id_new, a global
 * counter, never 0), so a delta's base names exactly one earlier cut, whoever took it; a
 * table's cuts by different chains (checkpointers) never pass for each other.
 *
 * table_cut_begin: base is the id of the chain cut this one would be a delta of (0: a whole
 * cut); id names this cut (table_cut_id_new; 0: a snapshot cut, base ignored). The cut is a
 * delta only when it is a chain cut and base is the table's last chain cut at the start
 * (table_cut_is_delta), since marks are relative to it. track (chain cuts): record removed ids
 * from now on (the next chain cut may be a delta). Cuts may overlap (a snapshot cut taken while
 * a chain cut is being finished): starting one first copies what the previous cut of the table
 * still has pending. Starts of one table must not run at once (the server's freeze serialises
 * them). Returns NULL when memory runs out (nothing started). The cut holds a reference on t:
 * table_destroy while a cut exists frees t at table_cut_free.
 * table_cut_finish: copies what is still pending, one partition at a time. Returns 0, or -1
 * when memory ran out for some copy: the cut is unusable, and no later cut is a delta of it
 * (a failed copy keeps its marks, but the chain is broken). */
typedef struct table_cut table_cut;
uint64_t table_cut_id_new(void);
table_cut *table_cut_begin(table *t, uint64_t base, uint64_t id, bool track);
/* table_cut_begin in two steps: table_cut_prepare allocates the cut and, for a cut likely to be
 * whole, the copy's memory (faulted in, so that each partition's copy under its lock is a
 * memcpy): call it before holding updates off; it may take long. table_cut_start is the
 * short part, to call with updates held off: it decides whether the cut is a delta (O(1),
 * unless a previous cut still has partitions pending: they are copied first). A prepared cut
 * not started is freed by table_cut_free. */
table_cut *table_cut_prepare(table *t, uint64_t base);
void table_cut_start(table_cut *c, uint64_t id, bool track);
/* The table of a cut. */
table *table_cut_table(const table_cut *c);
int table_cut_finish(table_cut *c);
bool table_cut_is_delta(const table_cut *c);
/* The copy of partition part (after table_cut_finish), or NULL when out of range. */
const table_rows *table_cut_rows(const table_cut *c, uint32_t part);
/* table_cut_finish without the rows on disk of a table with a cold tier: table_cut_rows then
 * gives each partition's RAM rows only, and its rows on disk (as of the cut: older than its
 * RAM rows, so written before them) are read from the cut's snapshot one partition at a time
 * by table_cut_cold_rows, so that a checkpoint never holds every cold row in memory.
 * table_cut_cold_count: how many a partition has (0 for a table all in RAM).
 * table_cut_cold_rows: reads them into *out (free with table_rows_free), once per partition
 * (its snapshot is released); returns 0, or -1 when they could not be read, memory ran out or
 * their number is not table_cut_cold_count's (*out empty). */
int table_cut_finish_ram(table_cut *c);
uint64_t table_cut_cold_count(const table_cut *c, uint32_t part);
int table_cut_cold_rows(table_cut *c, uint32_t part, table_rows *out);
/* The restore of a linked cut (table_cut_link, below): makes the store's copy `from`
 * (unchanged: cold_store_open_from) t's cold tier, in a new directory beside its store's,
 * which it replaces, with cold_n[q] rows in partition q. t: a table just made (no rows, not
 * shared). Returns 0, or -1 with a message naming from (and the damaged file) when it is
 * missing or damaged, or when t has no cold tier. */
int table_cold_adopt(table *t, const char *from, const uint64_t *cold_n, char *err, size_t errlen);

/* Linked cuts of a table with a cold tier: table_cut_link (after table_cut_prepare, before
 * table_cut_start; a no-op for a table all in RAM) asks the start to copy the cold store into
 * directory dir (cold_store_checkpoint: dir must not exist, its parent must) at the cut's
 * moment, every partition held meanwhile, and to note each partition's rows on disk then
 * (table_cut_cold_count). The partitions' copies then hold their RAM rows only, and
 * table_cut_cold_rows gives nothing. table_cut_linked (after the start): dir when the copy
 * was made, else NULL (the cut is then an ordinary one: cold rows in its snapshots) with, in
 * *why when not NULL, the reason (NULL when no copy was asked). Lock order: the start holds
 * every partition's lock of the table at once, taken in index order, so code that holds one
 * partition's lock may take another's of the same table only in increasing index order. */
void table_cut_link(table_cut *c, const char *dir);
const char *table_cut_linked(const table_cut *c, const char **why);
/* Frees the cut and its copies. NULL is a no-op. */
void table_cut_free(table_cut *c);

/* Removes every row of partition part (restoring a partition copied whole over an older
 * copy). Returns the number removed. */
size_t table_partition_clear(table *t, uint32_t part);

/* Inserts (or overwrites) row `id` with floats[0..row_floats) (parameters then slots, as
 * table_copy_partition wrote them) and the given update time: the restore of a checkpoint.
 * Obeys max_rows (evicting as a push does) and the budget. Returns TABLE_OK, TABLE_NOMEM, or
 * TABLE_LIMIT when the budget refuses the row and its partition has nothing to evict. */
int table_insert_row(table *t, int64_t id, const float *floats, int64_t updated_ms);

/* Export (psctl dump): copies rows from *cursor on (0: the start) into ids[0..max) and
 * rows[0..max*dim) (parameters only), at most max, one partition's lock (shared) at a time;
 * sets *cursor to where the next call goes on, UINT64_MAX after the last row. Returns the
 * number copied. Not a snapshot: a row present throughout the calls is copied exactly once
 * (rows do not move between slots), rows made or removed meanwhile may or may not be. */
size_t table_export(table *t, uint64_t *cursor, size_t max, int64_t *ids, float *rows);

/* The partition that holds id (for tests and benchmarks). */
uint32_t table_partition_of(const table *t, int64_t id);

#endif /* SERVER_TABLE_H */
