/* Pulls and prefetches of a table's rows (table.h: table_pull, table_prefetch): a request's
 * ids grouped by partition and looked up with their index entries and rows prefetched; with a
 * cold tier, the ids not in RAM read from disk in one batch for the whole call and promoted. */
#include "table.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "initializer.h"
#include "table_cold.h"
#include "table_cut.h"
#include "table_evict.h"
#include "table_index.h"
#include "table_layout.h"

/* table_pull of a table with a cold tier: per partition, the ids found in RAM under its lock
 * shared; then the others, of every partition that has rows on disk, read from disk in one
 * batch for the whole call (no lock held); then per such partition, under its lock, those rows
 * promoted (read again first when its rows on disk changed meanwhile). Returns false when
 * memory runs out (no row written).
 * out NULL: a prefetch (table_prefetch): no row written, no lookup or cold hit counted, the
 * promoted rows first in the LRU order (the next step uses them), their number in *promoted.
 * A replicated table (a logical budget, table.h) only reads: its primary alone serves reads,
 * unlogged, so a read that promoted a row or counted in the frequency sketch would make the
 * primary's RAM, its budget count and its admissions differ from its backups'; its rows move
 * between the tiers by logged pushes alone. */
static bool pull_cold(table *t, const int64_t *ids, size_t n, float *out, size_t *promoted)
{
    const bool prefetch = out == NULL, moves_rows = !t->budget.logical;
    size_t nprom = 0;
    const size_t vb = table_cold_value_bytes(t);
    uint64_t *hashes = malloc(n * sizeof(*hashes));
    uint32_t *order = malloc(n * sizeof(*order)), *miss = malloc(n * sizeof(*miss));
    uint32_t *starts = calloc(t->nparts + 1, sizeof(*starts));
    uint32_t *mstart = calloc(t->nparts + 1, sizeof(*mstart));
    uint32_t *fill = malloc(t->nparts * sizeof(*fill)), *mparts = malloc(n * sizeof(*mparts));
    uint64_t *moves = malloc(t->nparts * sizeof(*moves));
    int64_t *mids = malloc(n * sizeof(*mids));
    bool *found = malloc(n * sizeof(*found)), *init = calloc(n, sizeof(*init));
    unsigned char *vals = malloc(n * vb), *one = malloc(vb);
    bool ok = hashes && order && miss && starts && mstart && fill && mparts && moves && mids &&
              found && init && vals && one;
    if (ok) {
        for (size_t i = 0; i < n; i++) {
            hashes[i] = table_id_hash(ids[i]);
            starts[part_of(t, hashes[i]) + 1]++;
        }
        for (uint32_t q = 0; q < t->nparts; q++)
            starts[q + 1] += starts[q];
        memcpy(fill, starts, t->nparts * sizeof(*fill));
        for (size_t i = 0; i < n; i++)
            order[fill[part_of(t, hashes[i])]++] = (uint32_t)i;
    }
    /* RAM first; the misses of partitions with rows on disk noted, with their cold_moves. */
    size_t nm = 0;
    for (uint32_t q = 0; ok && q < t->nparts; q++) {
        mstart[q] = (uint32_t)nm;
        if (starts[q] == starts[q + 1])
            continue;
        partition *p = &t->parts[q];
        pthread_rwlock_rdlock(&p->lock);
        bool cold = p->cold_rows > 0;
        moves[q] = p->cold_moves;
        for (uint32_t e = starts[q]; e < starts[q + 1]; e++) {
            uint32_t i = order[e];
            if (!prefetch)
                count_add(&p->lookups, 1);
            if (!prefetch && moves_rows)
                table_freq_touch(p, hashes[i]);
            uint32_t slot1 = table_index_find(&p->ix, ids[i], hashes[i]);
            if (slot1 != 0) {
                if (!prefetch)
                    row_dtype_widen(t->dtype, out + i * (size_t)t->dim,
                                    row_params(row_at(t, p, slot1 - 1)), t->dim);
            } else if (!cold) {
                init[i] = !prefetch;
            } else {
                miss[nm] = i;
                mids[nm] = ids[i];
                mparts[nm++] = q;
            }
        }
        pthread_rwlock_unlock(&p->lock);
    }
    if (ok)
        mstart[t->nparts] = (uint32_t)nm;
    /* One read of the disk for the whole call. */
    if (ok && nm > 0)
        (void)table_cold_get_many(t, mparts, mids, nm, vals, found);
    for (uint32_t q = 0; ok && q < t->nparts; q++) {
        if (mstart[q] == mstart[q + 1])
            continue;
        partition *p = &t->parts[q];
        table_write_lock(t, p);
        uint32_t m0 = mstart[q], cnt = mstart[q + 1] - m0;
        if (p->cold_moves != moves[q]) /* changed since: read again */
            (void)table_cold_get(t, p, mids + m0, cnt, vals + (size_t)m0 * vb, found + m0);
        uint64_t gen = p->cold_gen;
        bool demoted = false; /* rows of p this loop sent to disk */
        for (uint32_t k = m0; k < m0 + cnt; k++) {
            uint32_t i = miss[k];
            float *dst = prefetch ? NULL : out + i * (size_t)t->dim;
            uint32_t slot1 = table_index_find(&p->ix, ids[i], hashes[i]);
            if (slot1 != 0) { /* promoted since (a duplicate), or made */
                if (!prefetch)
                    row_dtype_widen(t->dtype, dst, row_params(row_at(t, p, slot1 - 1)), t->dim);
                continue;
            }
            const unsigned char *val = vals + (size_t)k * vb;
            /* Read again when disk rows were deleted meanwhile (a duplicate whose promoted row
             * went back to disk has the value read: a pull changes no row). */
            bool have = found[k];
            if ((have && p->cold_gen != gen) || (!have && demoted)) {
                /* (not found: it may be a row this loop sent to disk) */
                have = table_cold_read_one(t, p, ids[i], one);
                val = one;
            }
            if (!have) {
                init[i] = !prefetch;
                continue;
            }
            if (prefetch) {
                if (table_cold_room(t) &&
                    table_row_promote(t, p, ids[i], hashes[i], val, true, true, &slot1) == TABLE_OK)
                    nprom++;
                continue;
            }
            count_add(&p->cold_hits, 1);
            row_dtype_widen(t->dtype, dst, val + sizeof(int64_t), t->dim);
            /* RAM takes it only when it was asked for more often lately than the row that
             * would give way (else it is read from disk again next time). */
            uint32_t victim;
            if (moves_rows && table_cold_room(t) &&
                table_ram_admit(t, p, hashes[i], false, &victim)) {
                if (victim != 0) {
                    table_demote(t, p, victim);
                    demoted = true;
                }
                (void)table_row_promote(t, p, ids[i], hashes[i], val, false, false, &slot1);
            }
        }
        table_write_unlock(t, p);
    }
    for (size_t i = 0; ok && i < n; i++) {
        if (!init[i])
            continue;
        count_add(&t->parts[part_of(t, hashes[i])].lookup_misses, 1);
        initializer_fill_row(&t->init, t->name_key, ids[i], out + i * (size_t)t->dim, t->dim);
    }
    free(hashes);
    free(order);
    free(miss);
    free(starts);
    free(mstart);
    free(fill);
    free(mparts);
    free(moves);
    free(mids);
    free(found);
    free(init);
    free(vals);
    free(one);
    if (promoted != NULL)
        *promoted = nprom;
    return ok;
}

size_t table_prefetch(table *t, const int64_t *ids, size_t n)
{
    size_t promoted = 0;
    /* A replicated table's reads move no row (pull_cold). */
    if (t->cold == NULL || t->budget.logical || n == 0 || n > UINT32_MAX)
        return 0;
    /* Out of memory for the call's arrays: nothing brought (a prefetch is a hint). */
    (void)pull_cold(t, ids, n, NULL, &promoted);
    return promoted;
}

/* Ids looked up together within a partition: their index entries, then their rows, are
 * prefetched a group at a time, so that the cache misses of a group overlap. */
#define PULL_GROUP 16
/* Pulls of fewer ids go id by id (no arrays to make). */
#define PULL_GROUPED_MIN 64

/* Rows of the ids order[0..k) (indexes into ids, their hashes in h) of partition p, under one
 * read lock; a row not there is the initializer's. */
static void pull_partition(table *t, partition *p, const int64_t *ids, const uint64_t *h,
                           const uint32_t *order, size_t k, float *out)
{
    const size_t dim = t->dim;
    uint64_t misses = 0;
    pthread_rwlock_rdlock(&p->lock);
    const uint32_t mask = p->ix.cap - 1;
    for (size_t g = 0; g < k; g += PULL_GROUP) {
        size_t m = k - g < PULL_GROUP ? k - g : PULL_GROUP;
        uint32_t slot1[PULL_GROUP];
        for (size_t j = 0; j < m; j++)
            __builtin_prefetch(&p->ix.e[(uint32_t)h[order[g + j]] & mask]);
        for (size_t j = 0; j < m; j++) {
            uint32_t i = order[g + j];
            slot1[j] = table_index_find(&p->ix, ids[i], h[i]);
            if (slot1[j] != 0)
                __builtin_prefetch(row_params(row_at(t, p, slot1[j] - 1)));
        }
        for (size_t j = 0; j < m; j++) {
            uint32_t i = order[g + j];
            float *dst = out + i * dim;
            if (slot1[j] != 0 && t->dtype == ROW_FLOAT32)
                memcpy(dst, row_params(row_at(t, p, slot1[j] - 1)), dim * sizeof(float));
            else if (slot1[j] != 0)
                row_dtype_widen(t->dtype, dst, row_params(row_at(t, p, slot1[j] - 1)), t->dim);
            else {
                misses++;
                initializer_fill_row(&t->init, t->name_key, ids[i], dst, t->dim);
            }
        }
    }
    pthread_rwlock_unlock(&p->lock);
    count_add(&p->lookups, k);
    if (misses)
        count_add(&p->lookup_misses, misses);
}

/* table_pull id by id: small pulls, and when memory for the grouped one runs out. */
static void pull_each(table *t, const int64_t *ids, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t h = table_id_hash(ids[i]);
        uint32_t one = 0;
        pull_partition(t, &t->parts[part_of(t, h)], ids + i, &h, &one, 1, out + i * (size_t)t->dim);
    }
}

void table_pull(table *t, const int64_t *ids, size_t n, float *out)
{
    if (t->cold != NULL && n > 0) {
        if (pull_cold(t, ids, n, out, NULL))
            return;
        /* Out of memory for the call's arrays: one id at a time (small ones), so that a row on
         * disk is still read; only when even that fails, from RAM alone below. */
        size_t i = 0;
        while (i < n && pull_cold(t, ids + i, 1, out + i * (size_t)t->dim, NULL))
            i++;
        if (i == n)
            return;
    }
    if (n < PULL_GROUPED_MIN || n > UINT32_MAX) {
        pull_each(t, ids, n, out);
        return;
    }
    /* The ids grouped by partition (counting sort), each partition locked once. */
    uint64_t *h = malloc(n * sizeof(*h));
    uint32_t *order = malloc(n * sizeof(*order));
    uint32_t *start = calloc((size_t)t->nparts + 1, sizeof(*start));
    if (h == NULL || order == NULL || start == NULL) {
        free(h);
        free(order);
        free(start);
        pull_each(t, ids, n, out);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        h[i] = table_id_hash(ids[i]);
        start[part_of(t, h[i]) + 1]++;
    }
    for (uint32_t q = 0; q < t->nparts; q++)
        start[q + 1] += start[q];
    for (size_t i = 0; i < n; i++)
        order[start[part_of(t, h[i])]++] = (uint32_t)i;
    /* start[q] is now where partition q + 1's ids begin: q's are [start[q-1], start[q]). */
    for (uint32_t q = 0, from = 0; q < t->nparts; from = start[q++])
        if (start[q] > from)
            pull_partition(t, &t->parts[q], ids, h, order + from, start[q] - from, out);
    free(h);
    free(order);
    free(start);
}
