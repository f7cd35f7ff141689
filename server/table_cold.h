/* The cold tier of a sparse table (table.h, ram_rows): the rows that left RAM, kept in the
 * table's cold_store (cold_store.h), and the moves between the tiers. Private to table.c,
 * table_evict.c and table_cut.c, which include it; it includes table_layout.h only.
 *
 * A row is in exactly one tier: in RAM (the partition's index), on disk, or nowhere. On disk a
 * row is two keys:
 *   row key   'r', partition, id (8 bytes big-endian)             -> its value
 *   time key  't', partition, update time (8 bytes big-endian, sign bit flipped so that the
 *             order is the times' order), id                       -> empty
 * A value is the row's update time (int64, host order) then its body as in a slab (parameters
 * in the table's dtype, the optimizer's state): bit for bit what RAM held. The time keys give
 * the oldest cold row (max_rows eviction) and the expired ones (the TTL sweep) without a scan;
 * a table with neither max_rows nor ttl_ms has none (half the writes of a row's moves).
 *
 * Writes of one locked partition (demotions, promotions' deletes) gather in the partition's
 * batch and reach the store at table_write_unlock, or before a read that must see them
 * (table_cold_flush). */
#ifndef SERVER_TABLE_COLD_H
#define SERVER_TABLE_COLD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cold_store.h"
#include "table_layout.h"

#define COLD_ROW_KEY 10
#define COLD_TIME_KEY 18

/* Bytes of a row's value on disk: its update time, then its body. */
static inline size_t table_cold_value_bytes(const table *t)
{
    return sizeof(int64_t) + t->row_bytes - sizeof(row_header);
}

/* Opens t's store in a new directory under dir (t->cold). Returns 0, or -1 with a message. */
int table_cold_open(table *t, const char *dir, char *err, size_t errlen);

/* Writes p's gathered writes to the store. Returns 0, or -1 (counted in t->cold_errors; the
 * store then takes no more writes: table_cold_room is false from then on). */
int table_cold_flush(table *t, partition *p);

/* Whether t's store may be written: its disk has cold_store_headroom free (looked at most
 * every COLD_ROOM_EVERY_MS) and no write has failed. Every move to or from disk asks first;
 * without room rows stay where they are (RAM past its share, or disk), and what needs the
 * disk is refused (TABLE_DISK). Safe from any thread. */
bool table_cold_room(table *t);

/* Why t's store may not be written (table_cold_room false), for a message: into buf. */
void table_cold_why(table *t, char *buf, size_t cap);

/* Releases p's lock taken by table_write_lock, its gathered writes written first. */
static inline void table_write_unlock(table *t, partition *p)
{
    if (p->cold_wb != NULL && cold_batch_count(p->cold_wb) > 0)
        (void)table_cold_flush(t, p);
    pthread_rwlock_unlock(&p->lock);
}

/* Reads the rows of ids[0..n) of p (locked) from disk, gathered writes flushed first:
 * found[i], and its value in vals[i * table_cold_value_bytes ..]. Returns 0 or -1 (a read
 * error: found all false). */
int table_cold_get(table *t, partition *p, const int64_t *ids, size_t n, unsigned char *vals,
                   bool *found);

/* Reads the rows of ids[0..n) (ids[i] of partition parts[i]) from disk in one batch, with no
 * partition locked: what a partition held when its lock was last released (its writes are
 * flushed then). Its caller checks, under the partition's lock, that its cold_moves did not
 * change since it noted them, else reads again (table_cold_get). Returns as table_cold_get. */
int table_cold_get_many(table *t, const uint32_t *parts, const int64_t *ids, size_t n,
                        unsigned char *vals, bool *found);

/* Demotion: queues row r of p (write-locked; the caller then removes it from RAM) to disk. */
void table_cold_demote(table *t, partition *p, const row_header *r);

/* Queues row r of p (write-locked), which is on disk with update time old_ms and was updated
 * outside RAM (a row RAM did not take: table_ram_admit), to disk again in its place. */
void table_cold_rewrite(table *t, partition *p, const row_header *r, int64_t old_ms);

/* A value (table_cold_value_bytes) as a row: id, update time and body into hdr (row_bytes,
 * aligned; its LRU links zero). Returns hdr. */
row_header *table_cold_value_row(const table *t, const unsigned char *v, int64_t id,
                                 row_header *hdr);

/* Queues id's row with value val (table_cold_value_bytes: update time, body) to disk. */
void table_cold_put(table *t, partition *p, int64_t id, const unsigned char *val);

/* Promotion: queues the deletion of id's keys (its row, at update time updated_ms, is on disk
 * and goes back to RAM). */
void table_cold_take(table *t, partition *p, int64_t id, int64_t updated_ms);

/* Deletes p's least recently updated cold row (the oldest time key), counted in *counter.
 * False when p has none. */
bool table_cold_evict_oldest(table *t, partition *p, _Atomic uint64_t *counter);

/* The update time of p's least recently updated cold row (its oldest time key) in *ms. False
 * when p has none (or the table keeps no time keys). */
bool table_cold_oldest(table *t, partition *p, int64_t *ms);

/* Deletes p's cold rows updated before cutoff_ms. Returns the number deleted. */
size_t table_cold_sweep(table *t, partition *p, int64_t cutoff_ms);

/* Deletes every cold row of p. Returns the number deleted. */
size_t table_cold_clear(table *t, partition *p);

/* Deletes id's row from disk when it is there (p write-locked). Returns whether it was. */
bool table_cold_remove(table *t, partition *p, int64_t id);

/* The cold rows of partition q as of snap (NULL: now; the partition then locked), oldest update
 * first: *n rows, their ids, update times and row floats (table_row_floats each), malloc'd.
 * Returns 0 or -1 (memory, a read error). */
int table_cold_rows(table *t, uint32_t q, cold_snapshot *snap, size_t *n, int64_t **ids,
                    int64_t **updated_ms, float **floats);

/* Walks partition q's cold rows in id order from the skip-th (p locked shared), copying up to
 * max of them into ids[] and rows[] (parameters widened to float32). Returns the number
 * copied; *more says whether rows are left after them. */
size_t table_cold_export(table *t, uint32_t q, uint64_t skip, size_t max, int64_t *ids, float *rows,
                         bool *more);

#endif /* SERVER_TABLE_COLD_H */
