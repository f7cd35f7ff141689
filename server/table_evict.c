/* How rows leave a sparse table and how new ones are let in (table_evict.h): row removal, LRU
 * eviction under max_rows and under the budget (to disk with a cold tier, and past ram_rows),
 * the TTL sweep (of the disk too), and the admission sketch.
 *
 * Admission: with min_count > 1 each partition counts the pushes of ids without a row in a
 * count-min sketch of SKETCH_DEPTH x SKETCH_WIDTH saturating 16-bit counters, every counter
 * halved after SKETCH_AGE_EVERY counted pushes so that old counts fade (table.h, min_count).
 *
 * The RAM tier's frequencies (a table with a cold tier): each partition counts the requests
 * of every id (pulls and pushes) in a count-min sketch of FREQ_DEPTH rows of 8-bit counters
 * capped at FREQ_MAX (a row of width at least four times the partition's share of ram_rows,
 * so that the ids RAM can hold seldom share counters), every counter halved after ten times
 * the share of counts (so that what was popular long ago fades). A row read from disk displaces a
 * row in RAM only when its count is higher (a push's: at least as high, so that among rows
 * used as often the recent stay, as with LRU alone): TinyLFU's admission (Einziger, Friedman,
 * Manes, 2017). The row that gives way is the least asked-for of the LRU tail and a few rows
 * a hand walking the slots passes (sampled LFU, as Redis's), so that rows asked for often but
 * seldom updated stay even when the LRU order, which is by update time, puts them last. */
#include "table_evict.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "hash.h"
#include "table_cold.h"
#include "table_cut.h"
#include "table_layout.h"

#define SKETCH_DEPTH 4
#define SKETCH_WIDTH 1024u
#define SKETCH_AGE_EVERY 8192u
#define FREQ_DEPTH 4
#define FREQ_MAX 15u
#define FREQ_WIDTH_MIN 64u
#define FREQ_WIDTH_MAX (1u << 20)
#define FREQ_WIDTH_PER_ROW 4u /* a sketch row's width, at least, per row of the RAM share */
#define FREQ_AGE_PER_ROW 10u  /* counts between two halvings per row of the RAM share */
#define FREQ_SAMPLE 8u        /* rows table_ram_admit looks at beside the LRU tail */

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

void table_demote(table *t, partition *p, uint32_t slot1)
{
    row_header *r = row_at(t, p, slot1 - 1);
    table_cold_demote(t, p, r);
    table_row_remove(t, p, table_index_probe(&p->ix, r->id, table_id_hash(r->id)));
}

/* Moves p's least recently updated row in RAM to disk. */
static bool demote_lru(table *t, partition *p)
{
    if (p->lru_tail == 0)
        return false;
    table_demote(t, p, p->lru_tail);
    return true;
}

bool table_evict_for_memory(table *t, partition *p)
{
    if (t->cold != NULL)
        return table_cold_room(t) && demote_lru(t, p);
    return table_evict_lru(t, p, &p->evicted_memory);
}

void table_reserve_row(table *t, partition *p, bool ram)
{
    if (p->max_rows != 0 && p->ix.count + p->cold_rows >= p->max_rows) {
        /* RAM keeps frequent rows however old: the least recently updated row of the
         * partition is the older of the oldest on disk and the oldest in RAM. */
        int64_t cold_ms;
        bool cold_first =
            t->cold != NULL && table_cold_room(t) && table_cold_oldest(t, p, &cold_ms) &&
            (p->lru_tail == 0 || cold_ms <= row_at(t, p, p->lru_tail - 1)->updated_ms);
        if (!(cold_first && table_cold_evict_oldest(t, p, &p->evicted_max_rows)))
            table_evict_lru(t, p, &p->evicted_max_rows);
    }
    if (ram && t->cold != NULL && p->ix.count >= p->ram_rows && table_cold_room(t))
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
        if (t->cold != NULL && table_cold_room(t)) {
            size_t k = table_cold_sweep(t, p, now_ms - t->ttl_ms);
            count_add(&p->evicted_ttl, k);
            removed += k;
        }
        table_write_unlock(t, p);
    }
    return removed;
}

/* ---- admission ---------------------------------------------------------------------------- */

/* The frequency sketch of p (ram_rows > 0): FREQ_DEPTH rows of width w. */
static int freq_init(partition *p)
{
    uint64_t w = FREQ_WIDTH_MIN;
    while (w < FREQ_WIDTH_PER_ROW * p->ram_rows && w < FREQ_WIDTH_MAX)
        w *= 2;
    p->freq = calloc(FREQ_DEPTH * w, 1);
    if (p->freq == NULL)
        return -1;
    p->freq_mask = (uint32_t)(w - 1);
    uint64_t sample = FREQ_AGE_PER_ROW * p->ram_rows;
    p->freq_sample = (uint32_t)(sample < 1024             ? 1024
                                : sample > UINT32_MAX / 2 ? UINT32_MAX / 2
                                                          : sample);
    p->bytes += FREQ_DEPTH * w;
    return 0;
}

int table_sketch_init(const table *t, partition *p)
{
    if (p->ram_rows != 0 && freq_init(p) != 0)
        return -1;
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

/* ---- the RAM tier's frequencies ----------------------------------------------------------- */

/* Counter d of the id whose frequency keys are k[0..1] (32 bits of them a row). */
static _Atomic uint8_t *freq_at(const partition *p, const uint64_t *k, int d)
{
    return &p->freq[(size_t)d * (p->freq_mask + 1) +
                    ((k[d >> 1] >> (32 * (d & 1))) & p->freq_mask)];
}

static void freq_key(uint64_t h, uint64_t *k)
{
    k[0] = mix64(h ^ UINT64_C(0x8CB92BA72F3D8DD7));
    k[1] = mix64(h ^ UINT64_C(0x5851F42D4C957F2D));
}

static uint32_t freq_of(const partition *p, uint64_t h)
{
    uint64_t k[2];
    freq_key(h, k);
    uint32_t est = UINT32_MAX;
    for (int d = 0; d < FREQ_DEPTH; d++) {
        uint32_t c = atomic_load_explicit(freq_at(p, k, d), memory_order_relaxed);
        est = c < est ? c : est;
    }
    return est;
}

void table_freq_touch(partition *p, uint64_t h)
{
    if (p->freq == NULL)
        return;
    uint64_t k[2];
    freq_key(h, k);
    _Atomic uint8_t *c[FREQ_DEPTH];
    uint32_t v[FREQ_DEPTH], least = UINT32_MAX;
    for (int d = 0; d < FREQ_DEPTH; d++) {
        c[d] = freq_at(p, k, d);
        v[d] = atomic_load_explicit(c[d], memory_order_relaxed);
        least = v[d] < least ? v[d] : least;
    }
    /* Conservative update: only the counters at the estimate grow (the others already count
     * other ids' requests too). */
    if (least < FREQ_MAX)
        for (int d = 0; d < FREQ_DEPTH; d++)
            if (v[d] == least)
                atomic_store_explicit(c[d], (uint8_t)(least + 1), memory_order_relaxed);
    if (atomic_fetch_add_explicit(&p->freq_events, 1, memory_order_relaxed) + 1 != p->freq_sample)
        return;
    size_t all = (size_t)FREQ_DEPTH * (p->freq_mask + 1);
    for (size_t i = 0; i < all; i++)
        atomic_store_explicit(
            &p->freq[i], (uint8_t)(atomic_load_explicit(&p->freq[i], memory_order_relaxed) >> 1),
            memory_order_relaxed);
    atomic_store_explicit(&p->freq_events, 0, memory_order_relaxed);
}

bool table_ram_admit(table *t, partition *p, uint64_t h, bool tie, uint32_t *victim)
{
    *victim = 0;
    if (p->freq == NULL || p->ix.count < p->ram_rows || p->lru_tail == 0)
        return true;
    uint32_t best = p->lru_tail;
    uint32_t least = freq_of(p, table_id_hash(row_at(t, p, best - 1)->id));
    for (uint32_t k = 0; k < FREQ_SAMPLE && least > 0; k++) {
        if (p->freq_hand >= p->used)
            p->freq_hand = 0;
        uint32_t slot1 = ++p->freq_hand;
        const row_header *r = row_at(t, p, slot1 - 1);
        uint64_t rh = table_id_hash(r->id);
        if (table_index_find(&p->ix, r->id, rh) != slot1)
            continue; /* a free slot */
        uint32_t c = freq_of(p, rh);
        if (c < least) {
            least = c;
            best = slot1;
        }
    }
    uint32_t mine = freq_of(p, h);
    if (tie ? mine < least : mine <= least)
        return false;
    *victim = best;
    return true;
}
