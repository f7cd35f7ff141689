/* Sparse tables, the push path (table.h: table_push, table_push_track): a request's ids
 * grouped by partition into a batch of distinct ids with their summed gradients, the batch's
 * cold rows read from the store in one call, then per partition under its write lock: admission
 * (table_evict.h), rows made or promoted (table.c), the optimizer's update, the change marks of
 * a checkpoint cut (table_cut.h). */
#include "table.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "table_cold.h"
#include "table_cut.h"
#include "table_evict.h"
#include "table_index.h"
#include "table_layout.h"
#include "util.h"

/* The admission sketch's key of an id (table_sketch_admit): independent of its placement. */
static inline uint64_t sketch_key(uint64_t h)
{
    return mix64(h ^ UINT64_C(0xD6E8FEB86659FD93));
}

typedef struct batch {
    size_t nu;              /* distinct ids */
    int64_t *uids;          /* [nu] */
    uint64_t *hashes;       /* [nu] */
    const unsigned char *g; /* [nu * dim floats] each distinct id's gradient: the request's
                               own when its ids are distinct (no copy), else sums */
    float *sums;            /* [nu * dim] summed gradients (when the request repeats an id) */
    uint32_t *order;        /* [nu] distinct ids grouped by partition */
    uint32_t *starts;       /* [nparts + 1] group bounds in order */
    uint32_t *of;           /* [n] the distinct index of each id */
    bool *udone;            /* [nu] done with that distinct id (table_push_track only) */
    unsigned char *saved;   /* [row_bytes] a row as it was before its update */
    row_header *spill;      /* [row_bytes] a cold tier's row updated outside RAM */
    float *wide;            /* [dim] a 16-bit row's parameters widened for its update */
    /* A table with a cold tier: per distinct id, where its row was when its partition's turn
     * began (COLD_IN_RAM, COLD_NONE, COLD_FOUND: its value at vp[u]). The rows not in RAM are
     * read for the whole push before any partition is locked for writing (pre*), and read
     * again per partition (the rest) when its rows on disk changed meanwhile. */
    uint8_t *where;              /* [nu] */
    const unsigned char **vp;    /* [nu] */
    uint64_t *moves;             /* [nparts] each partition's cold_moves at the read */
    size_t npre;                 /* ids read for the whole push */
    int64_t *pre_ids;            /* [nu] */
    uint32_t *pre_parts, *pre_u; /* [nu] their partitions and distinct indexes */
    bool *pre_found;             /* [nu] */
    unsigned char *pre_vals;     /* [nu * table_cold_value_bytes] */
    int64_t *mids;               /* [largest group] ids read again */
    uint32_t *mu;                /* [largest group] their distinct indexes */
    bool *found;                 /* [largest group] */
    unsigned char *vals;         /* [largest group * table_cold_value_bytes] their values */
    unsigned char *one;          /* [table_cold_value_bytes] one value read alone */
} batch;

enum { COLD_IN_RAM = 0, COLD_NONE = 1, COLD_FOUND = 2 };

static void batch_free(batch *b)
{
    free(b->uids);
    free(b->hashes);
    free(b->sums);
    free(b->order);
    free(b->starts);
    free(b->of);
    free(b->udone);
    free(b->saved);
    free(b->spill);
    free(b->wide);
    free(b->where);
    free(b->vp);
    free(b->moves);
    free(b->pre_ids);
    free(b->pre_parts);
    free(b->pre_u);
    free(b->pre_found);
    free(b->pre_vals);
    free(b->mu);
    free(b->mids);
    free(b->found);
    free(b->vals);
    free(b->one);
}

/* Sums duplicates (first occurrence order) and groups the distinct ids by partition; track:
 * also b->udone. */
static int batch_build(table *t, const int64_t *ids, size_t n, const unsigned char *grads,
                       bool track, batch *b)
{
    memset(b, 0, sizeof(*b));
    size_t cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    uint32_t *map = calloc(cap, sizeof(*map)); /* unique index + 1 */
    b->uids = malloc(n * sizeof(*b->uids));
    b->hashes = malloc(n * sizeof(*b->hashes));
    b->order = malloc(n * sizeof(*b->order));
    b->starts = calloc(t->nparts + 1, sizeof(*b->starts));
    b->saved = malloc(t->row_bytes);
    b->wide = malloc((size_t)t->dim * sizeof(float));
    b->of = malloc(n * sizeof(*b->of));
    if (track)
        b->udone = calloc(n, sizeof(*b->udone));
    if (map == NULL || b->uids == NULL || b->hashes == NULL || b->order == NULL ||
        b->starts == NULL || b->saved == NULL || b->wide == NULL || b->of == NULL ||
        (track && b->udone == NULL)) {
        free(map);
        batch_free(b);
        return -1;
    }
    const size_t dim = t->dim, row = dim * sizeof(float);
    for (size_t i = 0; i < n; i++) {
        uint64_t h = table_id_hash(ids[i]);
        size_t j = (size_t)h & (cap - 1);
        while (map[j] != 0 && b->uids[map[j] - 1] != ids[i])
            j = (j + 1) & (cap - 1);
        if (map[j] == 0) {
            map[j] = (uint32_t)++b->nu;
            b->uids[b->nu - 1] = ids[i];
            b->hashes[b->nu - 1] = h;
        }
        b->of[i] = map[j] - 1;
    }
    b->g = grads;
    if (b->nu < n) {
        /* Each distinct id's gradients summed in the request's order. */
        b->sums = malloc(b->nu * row);
        if (b->sums == NULL) {
            free(map);
            batch_free(b);
            return -1;
        }
        size_t seen = 0;
        for (size_t i = 0; i < n; i++) {
            float *acc = b->sums + (size_t)b->of[i] * dim;
            if (b->of[i] == seen) { /* its first occurrence */
                seen++;
                memcpy(acc, grads + i * row, row);
                continue;
            }
            for (size_t k = 0; k < dim; k++) {
                float g;
                memcpy(&g, grads + i * row + k * sizeof(float), sizeof(g));
                acc[k] += g;
            }
        }
        b->g = (const unsigned char *)b->sums;
    }
    free(map);
    for (size_t u = 0; u < b->nu; u++)
        b->starts[part_of(t, b->hashes[u]) + 1]++;
    for (uint32_t q = 0; q < t->nparts; q++)
        b->starts[q + 1] += b->starts[q];
    uint32_t *fill = malloc(t->nparts * sizeof(*fill));
    if (fill == NULL) {
        batch_free(b);
        return -1;
    }
    memcpy(fill, b->starts, t->nparts * sizeof(*fill));
    for (size_t u = 0; u < b->nu; u++)
        b->order[fill[part_of(t, b->hashes[u])]++] = (uint32_t)u;
    free(fill);
    if (t->cold != NULL) {
        size_t most = 1, vb = table_cold_value_bytes(t);
        for (uint32_t q = 0; q < t->nparts; q++)
            most = b->starts[q + 1] - b->starts[q] > most ? b->starts[q + 1] - b->starts[q] : most;
        size_t nu = b->nu ? b->nu : 1;
        b->where = calloc(nu, sizeof(*b->where));
        b->vp = calloc(nu, sizeof(*b->vp));
        b->moves = calloc(t->nparts, sizeof(*b->moves));
        b->pre_ids = malloc(nu * sizeof(*b->pre_ids));
        b->pre_parts = malloc(nu * sizeof(*b->pre_parts));
        b->pre_u = malloc(nu * sizeof(*b->pre_u));
        b->pre_found = malloc(nu * sizeof(*b->pre_found));
        b->pre_vals = malloc(nu * vb);
        b->mids = malloc(most * sizeof(*b->mids));
        b->mu = malloc(most * sizeof(*b->mu));
        b->found = malloc(most * sizeof(*b->found));
        b->vals = malloc(most * vb);
        b->one = malloc(vb);
        b->spill = malloc(t->row_bytes);
        if (!b->spill || !b->where || !b->vp || !b->moves || !b->pre_ids || !b->pre_parts ||
            !b->pre_u || !b->pre_found || !b->pre_vals || !b->mids || !b->mu || !b->found ||
            !b->vals || !b->one) {
            batch_free(b);
            return -1;
        }
    }
    return 0;
}

/* A table with a cold tier: reads the push's rows that are not in RAM from disk, in one batch
 * for the whole push, each partition looked at under its lock shared (its cold_moves noted). */
static void batch_cold_prefetch(table *t, batch *b)
{
    b->npre = 0;
    for (uint32_t q = 0; q < t->nparts; q++) {
        if (b->starts[q] == b->starts[q + 1])
            continue;
        partition *p = &t->parts[q];
        pthread_rwlock_rdlock(&p->lock);
        b->moves[q] = p->cold_moves;
        for (uint32_t e = b->starts[q]; e < b->starts[q + 1]; e++) {
            uint32_t u = b->order[e];
            b->where[u] = COLD_NONE;
            if (p->cold_rows == 0)
                continue;
            if (table_index_find(&p->ix, b->uids[u], b->hashes[u]) != 0) {
                b->where[u] = COLD_IN_RAM;
                continue;
            }
            b->pre_ids[b->npre] = b->uids[u];
            b->pre_parts[b->npre] = q;
            b->pre_u[b->npre++] = u;
        }
        pthread_rwlock_unlock(&p->lock);
    }
    if (b->npre == 0)
        return;
    (void)table_cold_get_many(t, b->pre_parts, b->pre_ids, b->npre, b->pre_vals, b->pre_found);
    size_t vb = table_cold_value_bytes(t);
    for (size_t k = 0; k < b->npre; k++) {
        uint32_t u = b->pre_u[k];
        if (b->pre_found[k]) {
            b->where[u] = COLD_FOUND;
            b->vp[u] = b->pre_vals + k * vb;
        }
    }
}

/* At partition q's turn (p write-locked): where each of its ids' rows is now. The prefetch
 * holds when p's rows on disk did not change since (a row noted absent may have been made in
 * RAM since: the index says so); otherwise the ids not in RAM are read again, in one batch. */
static void batch_cold_read(table *t, partition *p, uint32_t q, batch *b)
{
    bool same = p->cold_moves == b->moves[q];
    size_t nm = 0;
    for (uint32_t e = b->starts[q]; e < b->starts[q + 1]; e++) {
        uint32_t u = b->order[e];
        if (table_index_find(&p->ix, b->uids[u], b->hashes[u]) != 0) {
            b->where[u] = COLD_IN_RAM;
            continue;
        }
        if (same && b->where[u] != COLD_IN_RAM)
            continue; /* as prefetched */
        b->where[u] = COLD_NONE;
        if (p->cold_rows > 0) {
            b->mids[nm] = b->uids[u];
            b->mu[nm++] = u;
        }
    }
    if (nm == 0)
        return;
    (void)table_cold_get(t, p, b->mids, nm, b->vals, b->found);
    size_t vb = table_cold_value_bytes(t);
    for (size_t k = 0; k < nm; k++)
        if (b->found[k]) {
            b->where[b->mu[k]] = COLD_FOUND;
            b->vp[b->mu[k]] = b->vals + k * vb;
        }
}

/* The value of distinct id u's row on disk for its push (p write-locked, u absent from RAM):
 * the batched read's, or read again when it may be stale (disk rows deleted since gen0, or the
 * row was in RAM then and went to disk since). NULL: not on disk. */
static const unsigned char *batch_cold_value(table *t, partition *p, batch *b, uint32_t u,
                                             uint64_t gen0)
{
    uint32_t w = b->where[u];
    if (w == COLD_FOUND && p->cold_gen == gen0)
        return b->vp[u];
    if (w == COLD_NONE && p->cold_gen == gen0)
        return NULL; /* not on disk then, and no row of this push went there since unless
                        it was in RAM */
    return table_cold_read_one(t, p, b->uids[u], b->one) ? b->one : NULL;
}

/* Whether the count floats at g are all finite; if not, the first that is not in *bad. The
 * common case (all finite) is one pass without a branch per float, which the compiler
 * vectorizes: a float is inf or NaN when its exponent bits are all set. */
static bool all_finite(const unsigned char *g, size_t count, size_t *bad)
{
    uint32_t any = 0;
    for (size_t i = 0; i < count; i++) {
        uint32_t v;
        memcpy(&v, g + i * sizeof(v), sizeof(v));
        any |= (v & UINT32_C(0x7f800000)) == UINT32_C(0x7f800000);
    }
    if (any == 0)
        return true;
    *bad = 0;
    for (size_t i = 0; i < count; i++) {
        float v;
        memcpy(&v, g + i * sizeof(float), sizeof(v));
        if (!isfinite(v)) {
            *bad = i;
            break;
        }
    }
    return false;
}

/* How far ahead of the row a push updates its loop prefetches what the row's update reads:
 * the index entry, then the row, then its LRU neighbours and its dirty word, so that the cache
 * misses of several rows overlap (a hint only: the loop probes again for what it uses). */
#define PUSH_AHEAD_INDEX 12
#define PUSH_AHEAD_ROW 6
#define PUSH_AHEAD_LINKS 2

static void push_prefetch(const table *t, const partition *p, const batch *b, uint32_t e,
                          uint32_t end)
{
    uint32_t mask = p->ix.cap - 1;
    if (e + PUSH_AHEAD_INDEX < end)
        __builtin_prefetch(&p->ix.e[(uint32_t)b->hashes[b->order[e + PUSH_AHEAD_INDEX]] & mask]);
    if (e + PUSH_AHEAD_ROW < end) {
        uint32_t u = b->order[e + PUSH_AHEAD_ROW];
        uint32_t slot1 = table_index_find(&p->ix, b->uids[u], b->hashes[u]);
        if (slot1 != 0) {
            row_header *r = row_at(t, p, slot1 - 1);
            __builtin_prefetch(r, 1);
            __builtin_prefetch((const char *)r + 64, 1);
        }
    }
    if (e + PUSH_AHEAD_LINKS < end) {
        uint32_t u = b->order[e + PUSH_AHEAD_LINKS];
        uint32_t slot1 = table_index_find(&p->ix, b->uids[u], b->hashes[u]);
        if (slot1 != 0) {
            const row_header *r = row_at(t, p, slot1 - 1);
            uint64_t bit;
            if (r->prev != 0)
                __builtin_prefetch(row_at(t, p, r->prev - 1), 1);
            if (r->next != 0)
                __builtin_prefetch(row_at(t, p, r->next - 1), 1);
            __builtin_prefetch(table_dirty_word(t, p, slot1 - 1, &bit), 1);
        }
    }
}

int table_push_track(table *t, const int64_t *ids, size_t n, const void *grads, int64_t now_ms,
                     bool *done, char *err, size_t errlen)
{
    if (done != NULL)
        memset(done, 0, n * sizeof(*done));
    if (n == 0)
        return TABLE_OK;
    if (ids == NULL || grads == NULL) {
        errf(err, errlen, "table %s: ids or gradients = NULL", t->name);
        return TABLE_INVALID;
    }
    if (n > UINT32_MAX / 2) {
        errf(err, errlen, "table %s: %zu ids in one push: too many", t->name, n);
        return TABLE_INVALID;
    }
    size_t bad;
    if (!all_finite(grads, n * t->dim, &bad)) {
        errf(err, errlen,
             "table %s: gradient of id %lld (index %zu, element %zu) is not finite: push refused",
             t->name, (long long)ids[bad / t->dim], bad / t->dim, bad % t->dim);
        return TABLE_INVALID;
    }
    batch b;
    if (batch_build(t, ids, n, grads, done != NULL, &b) != 0) {
        errf(err, errlen, "table %s: out of memory for a push of %zu ids", t->name, n);
        return TABLE_NOMEM;
    }
    int rc = TABLE_OK;
    uint64_t refused = 0, overflowed = 0, no_disk = 0;
    int64_t first_refused = 0, first_overflowed = 0, first_no_disk = 0;
    const size_t body_bytes = t->row_bytes - sizeof(row_header);
    /* The partition to start at, from the batch alone (concurrent pushes of different ids
     * start apart): every copy of a replicated table goes through a push's partitions in the
     * same order, so that what the budget lets each one make is the same. */
    uint32_t first = n ? (uint32_t)mix64((uint64_t)ids[0] ^ ((uint64_t)n << 32)) : 0;
    if (t->cold != NULL)
        batch_cold_prefetch(t, &b);
    for (uint32_t k = 0; k < t->nparts && rc == 0; k++) {
        uint32_t q = (first + k) & (t->nparts - 1);
        if (b.starts[q] == b.starts[q + 1])
            continue;
        partition *p = &t->parts[q];
        table_write_lock(t, p);
        uint64_t gen0 = p->cold_gen;
        uint64_t updated = 0; /* p's rows_updated, added once for the partition */
        if (t->cold != NULL)
            batch_cold_read(t, p, q, &b);
        for (uint32_t e = b.starts[q]; e < b.starts[q + 1]; e++) {
            push_prefetch(t, p, &b, e, b.starts[q + 1]);
            uint32_t u = b.order[e];
            int64_t id = b.uids[u];
            uint64_t h = b.hashes[u];
            uint32_t slot1 = table_index_find(&p->ix, id, h);
            if (p->freq != NULL) /* ram_rows: the counts that decide what RAM keeps */
                table_freq_touch(p, h);
            const unsigned char *val =
                slot1 == 0 && t->cold != NULL ? batch_cold_value(t, p, &b, u, gen0) : NULL;
            /* A row that RAM takes (table_ram_admit) takes its victim's place; one it does
             * not is updated outside RAM (b.spill) and written back to disk. */
            bool spill = false, fresh = false;
            int64_t old_ms = 0;
            uint32_t victim = 0;
            row_header *r = NULL;
            /* Without room on disk, a row there cannot come back (its key's deletion is a
             * write), nor a new one be made once RAM holds its share (one would go to disk). */
            if (t->cold != NULL && (val != NULL || (slot1 == 0 && p->ix.count >= p->ram_rows)) &&
                !table_cold_room(t)) {
                if (no_disk++ == 0)
                    first_no_disk = id;
                count_add(&p->rows_refused, 1);
                continue;
            }
            if (val != NULL && !table_ram_admit(t, p, h, true, &victim)) {
                count_add(&p->cold_hits, 1);
                spill = true;
                r = table_cold_value_row(t, val, id, b.spill);
                old_ms = r->updated_ms;
            } else if (val != NULL) {
                count_add(&p->cold_hits, 1);
                if (victim != 0)
                    table_demote(t, p, victim);
                int mk = table_row_promote(t, p, id, h, val, true, false, &slot1);
                if (mk == TABLE_NOMEM) {
                    errf(err, errlen, "table %s: out of memory reading row %lld from disk", t->name,
                         (long long)id);
                    rc = TABLE_NOMEM;
                    break;
                }
                if (mk == TABLE_LIMIT) {
                    if (refused++ == 0)
                        first_refused = id;
                    count_add(&p->rows_refused, 1);
                    continue;
                }
            }
            if (!spill && slot1 == 0) {
                if (t->min_count > 1 && !table_sketch_admit(t, p, sketch_key(h))) {
                    count_add(&p->pushes_counted, 1);
                    if (b.udone)
                        b.udone[u] = true;
                    continue;
                }
                if (t->cold != NULL && !table_ram_admit(t, p, h, true, &victim)) {
                    spill = fresh = true;
                    table_reserve_row(t, p, false); /* max_rows */
                    r = b.spill;
                    table_row_init(t, p, r, id);
                    count_add(&p->rows_created, 1);
                }
            }
            if (!spill && slot1 == 0) {
                if (victim != 0)
                    table_demote(t, p, victim);
                int mk = table_row_make(t, p, id, h, t->cold == NULL, &slot1);
                if (mk == TABLE_NOMEM) {
                    errf(err, errlen, "table %s: out of memory making row %lld", t->name,
                         (long long)id);
                    rc = TABLE_NOMEM;
                    break;
                }
                if (mk == TABLE_LIMIT) {
                    if (refused++ == 0)
                        first_refused = id;
                    count_add(&p->rows_refused, 1);
                    continue;
                }
            }
            if (!spill)
                r = row_at(t, p, slot1 - 1);
            unsigned char *body = row_params(r);
            float *state = row_state(t, r), *slots[OPTIMIZER_MAX_SLOTS] = {0};
            for (uint32_t s = 0; s < t->nslots; s++)
                slots[s] = state + (size_t)s * t->dim;
            memcpy(b.saved, body, body_bytes);
            bool narrow = t->dtype != ROW_FLOAT32;
            float *w = narrow ? b.wide : (float *)(void *)body;
            if (narrow)
                row_dtype_widen(t->dtype, w, body, t->dim);
            optimizer_apply_row(&t->opt, w, b.g + (size_t)u * t->dim * sizeof(float), slots,
                                state + (size_t)t->nslots * t->dim, row_counts(t, r), t->dim);
            if (b.udone)
                b.udone[u] = true;
            bool finite;
            if (narrow) {
                /* Rounded to the dtype, then read back: past its range is infinite. */
                row_dtype_narrow(t->dtype, body, w, t->dim);
                row_dtype_widen(t->dtype, w, body, t->dim);
                finite = all_finite((const unsigned char *)w, t->dim, &bad) &&
                         all_finite((const unsigned char *)state, state_floats(t), &bad);
            } else {
                /* float32: the parameters and the state's floats are contiguous. */
                finite = all_finite(body, t->dim + state_floats(t), &bad);
            }
            if (!finite) {
                /* Finite gradients that overflow the row: it keeps its values. */
                memcpy(body, b.saved, body_bytes);
                if (overflowed++ == 0)
                    first_overflowed = id;
                if (fresh) /* made all the same, as in RAM */
                    table_cold_demote(t, p, r);
                continue;
            }
            r->updated_ms = now_ms;
            if (fresh) {
                table_cold_demote(t, p, r);
            } else if (spill) {
                table_cold_rewrite(t, p, r, old_ms);
            } else {
                table_mark_dirty(t, p, slot1);
                if (p->lru_head != slot1) {
                    table_lru_unlink(t, p, slot1);
                    table_lru_push_front(t, p, slot1);
                }
            }
            updated++;
        }
        count_add(&p->rows_updated, updated);
        table_write_unlock(t, p);
    }
    if (done != NULL)
        for (size_t i = 0; i < n; i++)
            done[i] = b.udone[b.of[i]];
    batch_free(&b);
    if (rc == TABLE_OK && overflowed > 0) {
        errf(err, errlen,
             "table %s: the update of id %lld would leave its row non-finite (inf or NaN): %llu "
             "rows left unchanged%s; the batch's other rows were applied",
             t->name, (long long)first_overflowed, (unsigned long long)overflowed,
             refused > 0 ? " (and new rows not made: memory limit reached)" : "");
        rc = TABLE_OVERFLOW;
    } else if (rc == TABLE_OK && no_disk > 0) {
        char why[768];
        table_cold_why(t, why, sizeof(why));
        errf(err, errlen,
             "table %s: %s: %llu rows (the first id %lld) not written, nothing of them applied; "
             "the batch's other rows were applied",
             t->name, why, (unsigned long long)no_disk, (long long)first_no_disk);
        rc = TABLE_DISK;
    } else if (rc == TABLE_OK && refused > 0) {
        errf(err, errlen,
             "table %s: memory limit reached: %llu new rows (the first id %lld) not made, %s; "
             "the batch's other rows were applied",
             t->name, (unsigned long long)refused, (long long)first_refused,
             t->never_evict ? "the table evicts no row" : "their partitions have no row to evict");
        rc = TABLE_LIMIT;
    }
    return rc;
}

int table_push(table *t, const int64_t *ids, size_t n, const void *grads, int64_t now_ms, char *err,
               size_t errlen)
{
    return table_push_track(t, ids, n, grads, now_ms, NULL, err, errlen);
}
