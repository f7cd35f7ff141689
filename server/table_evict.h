/* How rows leave a sparse table and how new ones are let in: the LRU order of each partition,
 * row removal, eviction (to stay within max_rows, or to make room when the budget refuses
 * memory; with a cold tier, to disk instead), the TTL sweep (table_sweep, table.h) and admission
 * (min_count's count-min sketch), and with a cold tier which rows RAM keeps: a row read from
 * disk takes the place of a row in RAM only when it was asked for at least as often lately
 * (table_ram_admit; a pull's strictly more often), so that RAM keeps the frequently used rows,
 * not merely the recent ones.
 * This is where another policy (LFU, decayed counts) plugs in: table.c asks here which row
 * gives way and whether a new id is admitted, and tells here which row was updated.
 * Private to table.c and table_evict.c. */
#ifndef SERVER_TABLE_EVICT_H
#define SERVER_TABLE_EVICT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "table_layout.h"

/* Unlinks slot1's row from p's LRU list. */
static inline void table_lru_unlink(table *t, partition *p, uint32_t slot1)
{
    row_header *h = row_at(t, p, slot1 - 1);
    if (h->prev != 0)
        row_at(t, p, h->prev - 1)->next = h->next;
    else
        p->lru_head = h->next;
    if (h->next != 0)
        row_at(t, p, h->next - 1)->prev = h->prev;
    else
        p->lru_tail = h->prev;
    h->prev = h->next = 0;
}

/* Puts slot1's row (not in the list) first: the most recently updated. */
static inline void table_lru_push_front(table *t, partition *p, uint32_t slot1)
{
    row_header *h = row_at(t, p, slot1 - 1);
    h->prev = 0;
    h->next = p->lru_head;
    if (p->lru_head != 0)
        row_at(t, p, p->lru_head - 1)->prev = slot1;
    else
        p->lru_tail = slot1;
    p->lru_head = slot1;
}

/* Rows a promotion's place in the LRU order walks past at most when no max_rows nor TTL reads
 * that order (table_lru_insert_by_time). */
#define TABLE_LRU_WALK_LOOSE 8u

/* Puts slot1's row (not in the list) at its update time's place: after the rows updated at or
 * after it, walking from the tail past at most max_steps older rows (then it goes there, as if
 * older than it is: a table whose LRU order only chooses which row gives way, no max_rows nor
 * TTL reading it, need not walk a list of cache misses for it). */
static inline void table_lru_insert_by_time(table *t, partition *p, uint32_t slot1,
                                            uint32_t max_steps)
{
    row_header *h = row_at(t, p, slot1 - 1);
    uint32_t s = p->lru_tail;
    for (uint32_t k = 0; s != 0 && k < max_steps && row_at(t, p, s - 1)->updated_ms < h->updated_ms;
         k++)
        s = row_at(t, p, s - 1)->prev;
    if (s == 0) {
        table_lru_push_front(t, p, slot1);
        return;
    }
    row_header *before = row_at(t, p, s - 1);
    h->prev = s;
    h->next = before->next;
    if (before->next != 0)
        row_at(t, p, before->next - 1)->prev = slot1;
    else
        p->lru_tail = slot1;
    before->next = slot1;
}

/* Removes the row at index position pos of p (write-locked) from the index, the LRU list and
 * its slot (back on the free list), recording the removal for the next delta cut. */
void table_row_remove(table *t, partition *p, uint32_t pos);

/* Removes p's least recently updated row, counted in *counter. False when p has none (or the
 * table never evicts). */
bool table_evict_lru(table *t, partition *p, _Atomic uint64_t *counter);

/* Makes room in RAM when the budget refuses memory: p's least recently updated row goes to
 * disk (a table with a cold tier) or is removed (counted in evicted_memory). False when p has
 * no row in RAM (or the table never evicts, or its disk has no room: table_cold_room). */
bool table_evict_for_memory(table *t, partition *p);

/* Makes room for one more row in p under its share of max_rows (both tiers), removing p's least
 * recently updated row when p is full (it then has one: every share is at least 1; of the
 * oldest row on disk and the oldest in RAM the older, the one on disk on a tie), then (ram)
 * under its share of ram_rows, moving its least recently updated row in RAM to disk. While the
 * disk has no room (table_cold_room) nothing goes to or leaves the disk: RAM's row goes, or
 * RAM holds more than its share. */
void table_reserve_row(table *t, partition *p, bool ram);

/* Sends slot1's row of p (write-locked) to disk (a table with a cold tier). */
void table_demote(table *t, partition *p, uint32_t slot1);

/* Allocates p's admission sketch when the table has min_count > 1 (its bytes counted in
 * p->bytes). Returns 0, or -1 when memory runs out. */
int table_sketch_init(const table *t, partition *p);

/* Counts one push of an id without a row (key: a hash of the id independent of the one that
 * places it, table.c); true when its count reaches min_count. */
bool table_sketch_admit(table *t, partition *p, uint64_t key);

/* Counts one request of the id of hash h (table_id_hash) in p's frequency sketch (a table
 * with a cold tier; else nothing). Safe under p's lock shared: the counts are relaxed atomics,
 * and a count lost to a race only blurs the estimate. */
void table_freq_touch(partition *p, uint64_t h);

/* Whether the row of hash h, read from disk (or new), goes to RAM in p (write-locked): yes
 * when p's RAM is below its share (*victim 0), else when its count is above (or, tie, at
 * least) that of the row that would give way, *victim (slot + 1), which the caller then sends
 * to disk (table_demote): the least asked-for of p's least recently updated row and of
 * FREQ_SAMPLE rows further on from a hand that walks p's slots (the least recently updated on
 * a tie: with equal counts, LRU). No: the row is served from disk and stays there (a push's
 * is updated and written back). */
bool table_ram_admit(table *t, partition *p, uint64_t h, bool tie, uint32_t *victim);

#endif /* SERVER_TABLE_EVICT_H */
