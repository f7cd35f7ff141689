/* Copy-on-write checkpoint cuts of a sparse table and their change marks: the private side of
 * table.h's table_cut_* (whose contracts are there), for table.c and table_evict.c.
 *
 * Every change to a partition goes through table_write_lock, which first copies the partition
 * into a pending cut (so that the cut holds it as it was when the cut began), and records what
 * it changes for the next delta cut: table_mark_dirty for a row made or updated,
 * table_clear_dirty and table_note_removed for a row removed. Private to table.c,
 * table_evict.c and table_cut.c. */
#ifndef SERVER_TABLE_CUT_H
#define SERVER_TABLE_CUT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "table_layout.h"

/* Copies p (write-locked, pending for cut generation gen) into the table's cut. A chain cut
 * then clears p's marks (what changes from now on is the next delta); a snapshot cut leaves
 * them to the chain. */
void table_cut_copy(table *t, partition *p, uint64_t gen);

/* Takes p's lock to change it. When a cut is pending for p, p is copied into it first, so that
 * the cut holds p as it was when the cut began (only this partition's callers wait). */
static inline void table_write_lock(table *t, partition *p)
{
    pthread_rwlock_wrlock(&p->lock);
    uint64_t gen = atomic_load_explicit(&t->cut_gen, memory_order_acquire);
    if (p->cut_gen != gen)
        table_cut_copy(t, p, gen);
}

static inline uint64_t *table_dirty_word(const table *t, const partition *p, uint32_t slot,
                                         uint64_t *bit)
{
    uint32_t i;
    unsigned char *slab = p->slabs[slab_split(t, slot, &i)];
    uint64_t *bm = (uint64_t *)(void *)(slab + (size_t)t->slab_rows * t->row_bytes);
    *bit = UINT64_C(1) << (i & 63);
    return bm + (i >> 6);
}

/* Marks slot1's row changed since the partition's last copy. */
static inline void table_mark_dirty(const table *t, partition *p, uint32_t slot1)
{
    uint64_t bit, *w = table_dirty_word(t, p, slot1 - 1, &bit);
    if (!(*w & bit)) {
        *w |= bit;
        p->ndirty++;
    }
}

/* Unmarks slot1's row (it is being removed). Returns whether it was marked. */
static inline bool table_clear_dirty(const table *t, partition *p, uint32_t slot1)
{
    uint64_t bit, *w = table_dirty_word(t, p, slot1 - 1, &bit);
    if (!(*w & bit))
        return false;
    *w &= ~bit;
    p->ndirty--;
    return true;
}

/* Records a removed id for the next delta cut (while the table tracks removals). */
void table_note_removed(table *t, partition *p, int64_t id);

#endif /* SERVER_TABLE_CUT_H */
