/* How rows leave a sparse table and how new ones are let in (table_evict.h): row removal, LRU
 * eviction under max_rows and under the budget (to disk with a cold tier, and past ram_rows),
 * the TTL sweep (of the disk too), and the admission sketch.
 *
 * Admission: with min_count > 1 each partition counts the pushes of ids without a row in a
 * count-min sketch of SKETCH_DEPTH x SKETCH_WIDTH saturating 16-bit counters, every counter
 * halved after SKETCH_AGE_EVERY counted pushes so that old counts fade (table.h, min_count). */
#include "table_evict.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "table_cold.h"
#include "table_cut.h"
#include "table_layout.h"

#define SKETCH_DEPTH 4
#define SKETCH_WIDTH 1024u
#define SKETCH_AGE_EVERY 8192u

/* ---- removal and eviction ---------------------------------------------------------------- */

/* A removed row's slot goes back on p's free list. */
static void slot_free(table *t, partition *p, uint32_t slot1)
{
    row_header *h = row_at(t, p, slot1 - 1);
    h->next = p->free_head;
    p->free_head = slot1;
}

/* table_evict.h */
void table_row_remove(table *t, partition *p, uint32_t pos)
{
    uint32_t slot1 = p->ix.e[pos].slot1;
    table_note_removed(t, p, p->ix.e[pos].id);
    table_clear_dirty(t, p, slot1);
    table_index_delete_at(&p->ix, pos);
    table_lru_unlink(t, p, slot1);
    slot_free(t, p, slot1);
    if (t->budget.logical)
        budget_give(t, t->row_charge); /* its share of a logical budget (table.h) */
}

bool table_evict_lru(table *t, partition *p, _Atomic uint64_t *counter)
{
    if (p->lru_tail == 0 || t->never_evict)
        return false;
    row_header *victim = row_at(t, p, p->lru_tail - 1);
    table_row_remove(t, p, table_index_probe(&p->ix, victim->id, table_id_hash(victim->id)));
    count_add(counter, 1);
    return true;
}

/* Moves p's least recently updated row in RAM to disk. */
static bool demote_lru(table *t, partition *p)
{
    if (p->lru_tail == 0)
        return false;
    row_header *victim = row_at(t, p, p->lru_tail - 1);
    table_cold_demote(t, p, victim);
    table_row_remove(t, p, table_index_probe(&p->ix, victim->id, table_id_hash(victim->id)));
    return true;
}

bool table_evict_for_memory(table *t, partition *p)
{
    if (t->cold != NULL)
        return demote_lru(t, p);
    return table_evict_lru(t, p, &p->evicted_memory);
}

void table_reserve_row(table *t, partition *p)
{
    if (p->max_rows != 0 && p->ix.count + p->cold_rows >= p->max_rows &&
        !(t->cold != NULL && table_cold_evict_oldest(t, p, &p->evicted_max_rows)))
        table_evict_lru(t, p, &p->evicted_max_rows);
    if (t->cold != NULL && p->ix.count >= p->ram_rows)
        demote_lru(t, p);
}

/* ---- the TTL sweep ----------------------------------------------------------------------- */

size_t table_sweep(table *t, int64_t now_ms)
{
    if (t->ttl_ms == 0)
        return 0;
    size_t removed = 0;
    for (uint32_t q = 0; q < t->nparts; q++) {
        partition *p = &t->parts[q];
        table_write_lock(t, p);
        /* The LRU tail is the oldest update; a row updated at u expires once now - u > ttl. */
        while (p->lru_tail != 0) {
            row_header *r = row_at(t, p, p->lru_tail - 1);
            if (!(now_ms - r->updated_ms > t->ttl_ms))
                break;
            table_row_remove(t, p, table_index_probe(&p->ix, r->id, table_id_hash(r->id)));
            count_add(&p->evicted_ttl, 1);
            removed++;
        }
        if (t->cold != NULL) {
            size_t k = table_cold_sweep(t, p, now_ms - t->ttl_ms);
            count_add(&p->evicted_ttl, k);
            removed += k;
        }
        table_write_unlock(t, p);
    }
    return removed;
}

/* ---- admission ---------------------------------------------------------------------------- */

int table_sketch_init(const table *t, partition *p)
{
    if (t->min_count <= 1)
        return 0;
    p->sketch = calloc(SKETCH_DEPTH * SKETCH_WIDTH, sizeof(*p->sketch));
    if (p->sketch == NULL)
        return -1;
    p->bytes += SKETCH_DEPTH * SKETCH_WIDTH * sizeof(*p->sketch);
    return 0;
}

#define SKETCH_PART_BYTES (4 + SKETCH_DEPTH * SKETCH_WIDTH * 2)

size_t table_sketch_bytes(const table *t)
{
    return t->min_count > 1 ? (size_t)t->nparts * SKETCH_PART_BYTES : 0;
}

void table_sketch_save(const table *t, uint8_t *buf)
{
    if (t->min_count <= 1)
        return;
    for (uint32_t q = 0; q < t->nparts; q++) {
        const partition *p = &t->parts[q];
        uint8_t *o = buf + (size_t)q * SKETCH_PART_BYTES;
        uint32_t ev = p->sketch_events;
        for (int b = 0; b < 4; b++)
            o[b] = (uint8_t)(ev >> (8 * b));
        for (uint32_t i = 0; i < SKETCH_DEPTH * SKETCH_WIDTH; i++) {
            uint16_t c = p->sketch ? p->sketch[i] : 0;
            o[4 + 2 * i] = (uint8_t)c;
            o[5 + 2 * i] = (uint8_t)(c >> 8);
        }
    }
}

int table_sketch_load(table *t, const uint8_t *buf, size_t len)
{
    if (len != table_sketch_bytes(t))
        return -1;
    for (uint32_t q = 0; q < t->nparts; q++) {
        partition *p = &t->parts[q];
        if (p->sketch == NULL)
            return -1;
        const uint8_t *o = buf + (size_t)q * SKETCH_PART_BYTES;
        p->sketch_events =
            (uint32_t)o[0] | (uint32_t)o[1] << 8 | (uint32_t)o[2] << 16 | (uint32_t)o[3] << 24;
        for (uint32_t i = 0; i < SKETCH_DEPTH * SKETCH_WIDTH; i++)
            p->sketch[i] = (uint16_t)(o[4 + 2 * i] | o[5 + 2 * i] << 8);
    }
    return 0;
}

bool table_sketch_admit(table *t, partition *p, uint64_t key)
{
    uint32_t est = UINT32_MAX;
    for (int d = 0; d < SKETCH_DEPTH; d++) {
        uint16_t *c = &p->sketch[d * SKETCH_WIDTH + ((key >> (d * 16)) & (SKETCH_WIDTH - 1))];
        if (*c < UINT16_MAX)
            (*c)++;
        est = *c < est ? *c : est;
    }
    if (++p->sketch_events >= SKETCH_AGE_EVERY) {
        for (uint32_t i = 0; i < SKETCH_DEPTH * SKETCH_WIDTH; i++)
            p->sketch[i] >>= 1;
        p->sketch_events = 0;
    }
    return est >= t->min_count;
}
