/* Copy-on-write checkpoint cuts of a sparse table and their change marks (contracts: table.h,
 * table_cut_*; the marks: table_cut.h), and the copies of a partition's rows they and
 * table_copy_partition hand out (table_rows).
 *
 * A cut is taken in two steps. table_cut_start marks every partition pending (a new cut
 * generation); from then on each partition is copied by whichever comes first: the first
 * change (table_write_lock) or table_cut_finish. A whole copy is its slabs byte for byte
 * (copy_raw, short under the lock), turned into rows outside the lock (raw_rows); a delta copy
 * is the rows whose dirty bit is set and the ids removed since the previous chain cut.
 *
 * A table with a cold tier: every cut is whole; a partition's copy also takes a snapshot of the
 * cold store under its lock (O(1)), whose rows of that partition are read outside the lock
 * (table_cut_finish) and put before its RAM rows (they are older), or left in the snapshot
 * for the checkpoint writer to read one partition at a time (table_cut_finish_ram,
 * table_cut_cold_rows), so that a checkpoint never holds every cold row in memory.
 *
 * A linked cut (table_cut_link) of such a table instead copies the whole store at the cut's
 * moment (cold_store_checkpoint: its files hard-linked) and notes each partition's cold row
 * count; its partitions' copies then take no snapshot and the cut hands out RAM rows only. */
#include "table_cut.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table_cold.h"
#include "table_layout.h"

/* A whole partition's copy as taken under its lock: its slabs byte for byte (one memcpy
 * each, so that the wait of a push that finds its partition pending is short), turned into
 * table_rows by table_cut_finish outside the lock. */
typedef struct raw_part {
    unsigned char *bytes; /* nslabs slabs of slab_size bytes (room for cap) */
    uint32_t nslabs, cap;
    uint32_t lru_tail;
    size_t count;
    cold_snapshot *snap; /* the cold store as of the copy (a table with a cold tier) */
    uint64_t cold_n;     /* the partition's rows on disk at the copy (in snap) */
} raw_part;

struct table_cut {
    table *t;
    uint64_t base; /* the chain cut this one may be a delta of (0: whole) */
    uint64_t id;   /* this cut's id; 0: a snapshot cut */
    bool delta, started, finished;
    bool cold_later; /* finished by table_cut_finish_ram: cold rows still in the snapshots */
    char *link_dir;  /* table_cut_link: where the store's copy goes (NULL: none asked) */
    bool linked;     /* the store was copied there at the start (raw[].cold_n its counts) */
    char link_err[512];
    _Atomic bool failed;
    table_rows *parts; /* [t->nparts] */
    raw_part *raw;     /* [t->nparts] */
};

/* Records a removed id for the next delta cut (while the table tracks removals). */
void table_note_removed(table *t, partition *p, int64_t id)
{
    if (!atomic_load_explicit(&t->track, memory_order_relaxed) || p->removed_lost)
        return;
    if (p->ngone == p->gone_cap) {
        size_t cap = p->gone_cap ? 2 * p->gone_cap : 64;
        int64_t *r = realloc(p->gone, cap * sizeof(*r));
        if (r == NULL) {
            /* Not recorded: this partition's next copy is whole instead of a delta. */
            free(p->gone);
            p->gone = NULL;
            p->ngone = p->gone_cap = 0;
            p->removed_lost = true;
            return;
        }
        p->gone = r;
        p->gone_cap = cap;
    }
    p->gone[p->ngone++] = id;
}

void table_rows_free(table_rows *rows)
{
    if (rows == NULL)
        return;
    free(rows->ids);
    free(rows->updated_ms);
    free(rows->floats);
    free(rows->removed);
    memset(rows, 0, sizeof(*rows));
}

/* Room for n rows of t in out (ids, update times, floats). Returns 0 or -1 (memory). */
static int rows_alloc(const table *t, table_rows *out, size_t n)
{
    out->ids = malloc(n * sizeof(*out->ids));
    out->updated_ms = malloc(n * sizeof(*out->updated_ms));
    out->floats = malloc(n * (size_t)t->row_floats * sizeof(float));
    return out->ids == NULL || out->updated_ms == NULL || out->floats == NULL ? -1 : 0;
}

/* Puts partition q's cold rows (as of snap; NULL: now, q locked) before out's rows. Returns 0
 * or -1 (memory, a read error). */
static int prepend_cold(table *t, uint32_t q, cold_snapshot *snap, table_rows *out)
{
    size_t nc;
    int64_t *ids, *upd;
    float *fl;
    if (table_cold_rows(t, q, snap, &nc, &ids, &upd, &fl) != 0)
        return -1;
    if (nc == 0)
        return 0;
    size_t n = out->n, rf = t->row_floats;
    table_rows all = *out;
    if (rows_alloc(t, &all, nc + n) != 0) {
        free(all.ids);
        free(all.updated_ms);
        free(all.floats);
        free(ids);
        free(upd);
        free(fl);
        return -1;
    }
    memcpy(all.ids, ids, nc * sizeof(*ids));
    memcpy(all.updated_ms, upd, nc * sizeof(*upd));
    memcpy(all.floats, fl, nc * rf * sizeof(float));
    if (n > 0) {
        memcpy(all.ids + nc, out->ids, n * sizeof(*ids));
        memcpy(all.updated_ms + nc, out->updated_ms, n * sizeof(*upd));
        memcpy(all.floats + nc * rf, out->floats, n * rf * sizeof(float));
    }
    free(out->ids);
    free(out->updated_ms);
    free(out->floats);
    free(ids);
    free(upd);
    free(fl);
    all.n = nc + n;
    *out = all;
    return 0;
}

/* Copies every row of p in RAM (oldest update first, so that inserting them in order rebuilds
 * the LRU order) into out. Returns 0 or -1 (memory). */
static int copy_all_ram(table *t, partition *p, table_rows *out)
{
    size_t n = p->ix.count;
    out->full = true;
    if (n == 0)
        return 0;
    if (rows_alloc(t, out, n) != 0)
        return -1;
    size_t i = 0;
    for (uint32_t s1 = p->lru_tail; s1 != 0 && i < n; s1 = row_at(t, p, s1 - 1)->prev, i++) {
        row_header *r = row_at(t, p, s1 - 1);
        out->ids[i] = r->id;
        out->updated_ms[i] = r->updated_ms;
        row_to_floats(t, r, out->floats + i * t->row_floats);
    }
    out->n = i;
    return 0;
}

/* Copies p's changed rows (oldest update first) and its removed ids into out. Changed rows
 * are those updated since the last copy, so they lead the LRU list: the walk from its head
 * stops once it has seen all ndirty of them. Returns 0 or -1 (memory). */
static int copy_changed(table *t, partition *p, table_rows *out)
{
    size_t n = p->ndirty;
    out->full = false;
    if (n > 0) {
        if (rows_alloc(t, out, n) != 0)
            return -1;
        size_t i = n;
        for (uint32_t s1 = p->lru_head; s1 != 0 && i > 0; s1 = row_at(t, p, s1 - 1)->next) {
            uint64_t bit, *w = table_dirty_word(t, p, s1 - 1, &bit);
            if (!(*w & bit))
                continue;
            row_header *r = row_at(t, p, s1 - 1);
            i--;
            out->ids[i] = r->id;
            out->updated_ms[i] = r->updated_ms;
            row_to_floats(t, r, out->floats + i * t->row_floats);
        }
        if (i != 0) /* fewer marked rows than counted: an internal error, copy whole instead */
            return -1;
        out->n = n;
    }
    out->removed = p->gone;
    out->nremoved = p->ngone;
    p->gone = NULL;
    p->ngone = p->gone_cap = 0;
    return 0;
}

/* After a copy: nothing of p is changed since it. */
static void clear_marks(table *t, partition *p)
{
    if (p->ndirty > 0) {
        size_t off = (size_t)t->slab_rows * t->row_bytes;
        for (uint32_t i = 0; i < p->nslabs; i++)
            memset(p->slabs[i] + off, 0, slab_bitmap_bytes(t));
        p->ndirty = 0;
    }
    free(p->gone);
    p->gone = NULL;
    p->ngone = p->gone_cap = 0;
    p->removed_lost = false;
}

/* Copies p's slabs as they are into raw. Returns 0 or -1 (memory). */
static int copy_raw(table *t, partition *p, raw_part *raw, bool linked)
{
    size_t ss = slab_size(t);
    raw->nslabs = p->nslabs;
    raw->lru_tail = p->lru_tail;
    raw->count = p->ix.count;
    if (!linked) { /* a linked cut noted cold_n at its start, and copied the store then */
        if (t->cold != NULL && p->cold_rows > 0 &&
            (raw->snap = cold_store_snapshot(t->cold)) == NULL)
            return -1;
        raw->cold_n = raw->snap != NULL ? p->cold_rows : 0;
    }
    if (p->nslabs == 0 || p->ix.count == 0)
        return 0;
    if (raw->bytes == NULL || raw->cap < p->nslabs) {
        /* Grown since table_cut_prepare (or not prepared): fresh memory, slower to fill. */
        free(raw->bytes);
        raw->bytes = malloc((size_t)p->nslabs * ss);
        raw->cap = p->nslabs;
        if (raw->bytes == NULL)
            return -1;
    }
    for (uint32_t i = 0; i < p->nslabs; i++)
        memcpy(raw->bytes + (size_t)i * ss, p->slabs[i], ss);
    return 0;
}

/* Turns a raw copy into rows, oldest update first (as copy_all_ram). Returns 0 or -1 (memory). */
static int raw_rows(const table *t, raw_part *raw, table_rows *out)
{
    size_t n = raw->count, ss = slab_size(t);
    out->full = true;
    if (n > 0) {
        if (rows_alloc(t, out, n) != 0)
            return -1;
    }
    size_t i = 0;
    for (uint32_t s1 = raw->lru_tail; s1 != 0 && i < n; i++) {
        uint32_t slot = s1 - 1;
        if (slot / t->slab_rows >= raw->nslabs)
            return -1; /* not the partition's links: an internal error */
        row_header *r = (row_header *)(void *)(raw->bytes + (size_t)(slot / t->slab_rows) * ss +
                                               (size_t)(slot % t->slab_rows) * t->row_bytes);
        out->ids[i] = r->id;
        out->updated_ms[i] = r->updated_ms;
        row_to_floats(t, r, out->floats + i * t->row_floats);
        s1 = r->prev;
    }
    out->n = i;
    free(raw->bytes);
    raw->bytes = NULL;
    return i == n ? 0 : -1;
}

/* table_cut.h */
void table_cut_copy(table *t, partition *p, uint64_t gen)
{
    table_cut *c = atomic_load_explicit(&t->cut, memory_order_acquire);
    uint32_t q = (uint32_t)(p - t->parts);
    table_rows *out = &c->parts[q];
    p->cut_gen = gen;
    atomic_fetch_sub_explicit(&t->pending, 1, memory_order_acq_rel);
    bool whole = !c->delta || p->removed_lost;
    out->full = whole;
    int rc = whole ? copy_raw(t, p, &c->raw[q], c->linked) : copy_changed(t, p, out);
    if (rc != 0) {
        table_rows_free(out);
        atomic_store(&c->failed, true);
        /* Marks kept, but the chain is broken: no later cut may be a delta of this one. */
        uint64_t id = c->id;
        if (id != 0)
            atomic_compare_exchange_strong(&t->last_cut, &id, 0);
        return;
    }
    if (c->id != 0)
        clear_marks(t, p);
}

uint64_t table_cut_id_new(void)
{
    static _Atomic uint64_t last_id;
    return atomic_fetch_add(&last_id, 1) + 1;
}

table_cut *table_cut_prepare(table *t, uint64_t base)
{
    table_cut *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->parts = calloc(t->nparts, sizeof(*c->parts));
    c->raw = calloc(t->nparts, sizeof(*c->raw));
    if (c->parts == NULL || c->raw == NULL) {
        free(c->parts);
        free(c->raw);
        free(c);
        return NULL;
    }
    for (uint32_t q = 0; q < t->nparts; q++)
        c->parts[q].row_floats = t->row_floats;
    c->t = t;
    c->base = base;
    atomic_fetch_add(&t->refs, 1);
    /* table_cut_start decides; a cut that is a delta now most likely still is one then (and
     * a whole copy not prepared for allocates its memory when it copies). */
    if (base != 0 && atomic_load(&t->last_cut) == base)
        return c;
    /* Whole copies: room for each partition's slabs (and 1/8 more for growth until the
     * cut), faulted in now, so that the copy under a partition's lock is a memcpy. */
    size_t ss = slab_size(t);
    for (uint32_t q = 0; q < t->nparts; q++) {
        partition *p = &t->parts[q];
        pthread_rwlock_rdlock(&p->lock);
        uint32_t nslabs = p->nslabs;
        pthread_rwlock_unlock(&p->lock);
        if (nslabs == 0)
            continue;
        uint32_t cap = nslabs + nslabs / 8 + 1;
        c->raw[q].bytes = malloc((size_t)cap * ss);
        if (c->raw[q].bytes == NULL)
            break; /* copy_raw allocates then */
        /* Not 0: a compiler may turn malloc + memset 0 into calloc, which touches nothing. */
        memset(c->raw[q].bytes, 0xa5, (size_t)cap * ss);
        c->raw[q].cap = cap;
    }
    return c;
}

void table_cut_start(table_cut *c, uint64_t id, bool track)
{
    table *t = c->t;
    /* The previous cut (another taker's, its finish not done yet) gets its pending partitions
     * first: each partition is pending for one cut at a time. */
    for (uint32_t q = 0; q < t->nparts && atomic_load(&t->pending) > 0; q++) {
        table_write_lock(t, &t->parts[q]);
        pthread_rwlock_unlock(&t->parts[q].lock);
    }
    /* A linked cut: every partition held (no demotion, promotion or other change of either
     * tier) from the store's copy until the cut is marked, so that the copy and the
     * partitions' copies are of one moment. Gathered writes are flushed at each unlock, so
     * none wait now; some do only after a failed write: then the rows path. */
    bool link = c->link_dir != NULL && t->cold != NULL;
    if (link) {
        for (uint32_t q = 0; q < t->nparts; q++)
            pthread_rwlock_wrlock(&t->parts[q].lock);
        bool pending = false;
        for (uint32_t q = 0; q < t->nparts; q++)
            pending = pending ||
                      (t->parts[q].cold_wb != NULL && cold_batch_count(t->parts[q].cold_wb) > 0);
        if (pending)
            snprintf(c->link_err, sizeof(c->link_err), "writes to the cold store failed");
        else
            c->linked =
                cold_store_checkpoint(t->cold, c->link_dir, c->link_err, sizeof(c->link_err)) == 0;
        for (uint32_t q = 0; c->linked && q < t->nparts; q++)
            c->raw[q].cold_n = t->parts[q].cold_rows;
    }
    c->started = true;
    c->id = id;
    c->delta = id != 0 && c->base != 0 && atomic_load(&t->last_cut) == c->base && t->cold == NULL;
    if (id != 0) {
        atomic_store(&t->last_cut, id);
        atomic_store(&t->track, track);
    }
    atomic_store(&t->pending, t->nparts);
    atomic_store_explicit(&t->cut, c, memory_order_release);
    atomic_fetch_add_explicit(&t->cut_gen, 1, memory_order_acq_rel);
    if (link)
        for (uint32_t q = 0; q < t->nparts; q++)
            pthread_rwlock_unlock(&t->parts[q].lock);
}

void table_cut_link(table_cut *c, const char *dir)
{
    if (c->started || c->t->cold == NULL)
        return;
    free(c->link_dir);
    c->link_dir = strdup(dir); /* NULL (memory): the rows path */
}

const char *table_cut_linked(const table_cut *c, const char **why)
{
    if (why != NULL)
        *why = c->link_err[0] != '\0' ? c->link_err : NULL;
    return c->linked ? c->link_dir : NULL;
}

table_cut *table_cut_begin(table *t, uint64_t base, uint64_t id, bool track)
{
    table_cut *c = table_cut_prepare(t, base);
    if (c != NULL)
        table_cut_start(c, id, track);
    return c;
}

table *table_cut_table(const table_cut *c)
{
    return c->t;
}

/* table_cut_finish and table_cut_finish_ram: cold_later leaves the cold rows in the
 * partitions' snapshots. */
static int cut_finish(table_cut *c, bool cold_later)
{
    table *t = c->t;
    if (!c->started)
        return -1;
    c->cold_later = cold_later;
    for (uint32_t q = 0; q < t->nparts; q++) {
        partition *p = &t->parts[q];
        table_write_lock(t, p); /* copies p if no change did first */
        pthread_rwlock_unlock(&p->lock);
    }
    c->finished = true;
    for (uint32_t q = 0; q < t->nparts; q++) {
        if (c->raw[q].nslabs > 0 && raw_rows(t, &c->raw[q], &c->parts[q]) != 0) {
            table_rows_free(&c->parts[q]);
            atomic_store(&c->failed, true);
        }
        if (c->raw[q].snap != NULL && !cold_later) {
            if (!atomic_load(&c->failed) && prepend_cold(t, q, c->raw[q].snap, &c->parts[q]) != 0) {
                table_rows_free(&c->parts[q]);
                atomic_store(&c->failed, true);
            }
            cold_snapshot_release(t->cold, c->raw[q].snap);
            c->raw[q].snap = NULL;
        }
        free(c->raw[q].bytes);
        c->raw[q].bytes = NULL;
        c->raw[q].nslabs = 0;
        c->parts[q].row_floats = t->row_floats;
    }
    return atomic_load(&c->failed) ? -1 : 0;
}

int table_cut_finish(table_cut *c)
{
    return cut_finish(c, false);
}

int table_cut_finish_ram(table_cut *c)
{
    return cut_finish(c, true);
}

uint64_t table_cut_cold_count(const table_cut *c, uint32_t part)
{
    if ((!c->cold_later && !c->linked) || part >= c->t->nparts)
        return 0;
    return c->raw[part].cold_n; /* 0 when the copy took no snapshot */
}

int table_cut_cold_rows(table_cut *c, uint32_t part, table_rows *out)
{
    table *t = c->t;
    memset(out, 0, sizeof(*out));
    out->row_floats = t->row_floats;
    out->full = true;
    if (!c->cold_later || part >= t->nparts || c->raw[part].snap == NULL)
        return 0;
    raw_part *raw = &c->raw[part];
    int rc =
        table_cold_rows(t, part, raw->snap, &out->n, &out->ids, &out->updated_ms, &out->floats);
    cold_snapshot_release(t->cold, raw->snap);
    raw->snap = NULL;
    if (rc == 0 && out->n != raw->cold_n) /* the count the record's length was made from */
        rc = -1;
    if (rc != 0) {
        table_rows_free(out);
        out->row_floats = t->row_floats;
    }
    return rc;
}

bool table_cut_is_delta(const table_cut *c)
{
    return c->delta;
}

const table_rows *table_cut_rows(const table_cut *c, uint32_t part)
{
    return part < c->t->nparts ? &c->parts[part] : NULL;
}

void table_cut_free(table_cut *c)
{
    if (c == NULL)
        return;
    table *t = c->t;
    if (c->started && !c->finished)
        (void)cut_finish(c, true); /* no partition may still point at c */
    for (uint32_t q = 0; q < t->nparts; q++) {
        table_rows_free(&c->parts[q]);
        free(c->raw[q].bytes);
        cold_snapshot_release(t->cold, c->raw[q].snap);
    }
    free(c->parts);
    free(c->raw);
    free(c->link_dir);
    free(c);
    table_unref(t);
}

typedef struct kept_row {
    int64_t updated_ms;
    uint32_t slot;
} kept_row;

static int kept_cmp(const void *a, const void *b)
{
    const kept_row *x = a, *y = b;
    if (x->updated_ms != y->updated_ms)
        return x->updated_ms < y->updated_ms ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

/* The rows of p in RAM whose id keep accepts, oldest update first (ties by slot). The ids
 * come from the index, read in order (a few bytes an entry), so only the kept rows are
 * touched: walking the LRU list instead visits every row in an order unrelated to memory,
 * about 9x slower at 500,000 rows. Returns 0 or -1 (memory). */
static int copy_kept_ram(table *t, partition *p, table_keep_fn keep, void *arg, table_rows *out)
{
    size_t n = p->ix.count;
    out->full = true;
    if (n == 0)
        return 0;
    kept_row *at = malloc(n * sizeof(*at));
    if (at == NULL)
        return -1;
    size_t k = 0;
    for (uint32_t i = 0; i < p->ix.cap && k < n; i++) {
        table_index_entry e = p->ix.e[i];
        if (e.slot1 != 0 && keep(arg, e.id))
            at[k++] = (kept_row){.updated_ms = row_at(t, p, e.slot1 - 1)->updated_ms,
                                 .slot = e.slot1 - 1};
    }
    qsort(at, k, sizeof(*at), kept_cmp);
    int rc = k > 0 ? rows_alloc(t, out, k) : 0;
    for (size_t j = 0; rc == 0 && j < k; j++) {
        row_header *r = row_at(t, p, at[j].slot);
        out->ids[j] = r->id;
        out->updated_ms[j] = r->updated_ms;
        row_to_floats(t, r, out->floats + j * t->row_floats);
    }
    out->n = rc == 0 ? k : 0;
    free(at);
    return rc;
}

/* Keeps out's rows whose id keep accepts, in place, in their order. */
static void rows_keep(table_rows *out, table_keep_fn keep, void *arg)
{
    size_t k = 0, rf = out->row_floats;
    for (size_t i = 0; i < out->n; i++) {
        if (!keep(arg, out->ids[i]))
            continue;
        if (k != i) {
            out->ids[k] = out->ids[i];
            out->updated_ms[k] = out->updated_ms[i];
            memcpy(out->floats + k * rf, out->floats + i * rf, rf * sizeof(float));
        }
        k++;
    }
    out->n = k;
}

int table_copy_partition_if(table *t, uint32_t part, table_keep_fn keep, void *arg, table_rows *out)
{
    memset(out, 0, sizeof(*out));
    out->row_floats = t->row_floats;
    if (part >= t->nparts)
        return -1;
    partition *p = &t->parts[part];
    pthread_rwlock_rdlock(&p->lock);
    int rc = keep ? copy_kept_ram(t, p, keep, arg, out) : copy_all_ram(t, p, out);
    if (rc == 0 && t->cold != NULL && p->cold_rows > 0) {
        /* p's cold rows before the RAM ones (they are older); they come from the store as a
         * whole, so kept ones are picked after (the RAM ones pass again). */
        rc = prepend_cold(t, part, NULL, out);
        if (rc == 0 && keep)
            rows_keep(out, keep, arg);
    }
    pthread_rwlock_unlock(&p->lock);
    if (rc != 0) {
        table_rows_free(out);
        out->row_floats = t->row_floats;
    }
    return rc;
}

int table_copy_partition(table *t, uint32_t part, table_rows *out)
{
    return table_copy_partition_if(t, part, NULL, NULL, out);
}
