/* Sparse tables: see table.h for the contracts. This file holds a table's rows: creation and
 * settings, slabs and slots, the index's use and growth, making and promoting rows, removal,
 * restore, export and counters; pushes are in table_push.c, pulls and prefetches in
 * table_pull.c. How rows
 * leave (LRU, eviction, TTL) and admission are in table_evict.c; copy-on-write checkpoint cuts
 * and their change marks in table_cut.c; the cold tier's store keys and writes in table_cold.c
 * (promotion is here, a push's batched reads in table_push.c, a pull's in table_pull.c); the layout
 * they share in table_layout.h.
 *
 * table_id_hash(id) gives the partition (its top bits) and the home bucket (its low bits); a
 * second, independent hash of it keys the admission sketch (table_push.c). */
#include "table.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "placement.h"
#include "table_cold.h"
#include "table_cut.h"
#include "table_evict.h"
#include "table_index.h"
#include "table_layout.h"
#include "util.h"

/* The largest of jemalloc's small size classes (with 4 KiB pages): small classes are packed in
 * runs with nothing between them, where every large allocation (16 KiB and up) gets a page of
 * its own for cache-oblivious placement, which at 64 KiB slabs kept 6-9% of the rows' bytes
 * resident more (bench/RESULTS.md, lean rows). A row larger than this has a slab of its own. */
#define SLAB_BYTES (14u * 1024u)
#define MAX_MIN_COUNT 65535u

void table_set_budget_arg(table *t, void *arg)
{
    t->budget.arg = arg;
}

/* Asks the budget for bytes more (true: granted; always without a budget). */
static bool budget_take(table *t, uint64_t bytes)
{
    return t->budget.take == NULL || t->budget.take(t->budget.arg, bytes);
}

/* An allocation's bytes asked of the budget, and given back: a logical budget counts rows
 * (row_slot), not allocations. */
static bool alloc_take(table *t, uint64_t bytes)
{
    return t->budget.logical || budget_take(t, bytes);
}

static void alloc_give(table *t, uint64_t bytes)
{
    if (!t->budget.logical)
        budget_give(t, bytes);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- rows and slabs ---------------------------------------------------------------------- */

/* A free slot: a reused one, else the next fresh one (a new slab when the last is full).
 * Returns slot + 1, or 0 when memory runs out (*fail = TABLE_NOMEM) or the budget refuses a
 * slab (*fail = TABLE_LIMIT). */
static uint32_t slot_alloc(table *t, partition *p, int *fail)
{
    if (p->free_head != 0) {
        uint32_t s1 = p->free_head;
        p->free_head = row_at(t, p, s1 - 1)->next;
        return s1;
    }
    uint32_t per_slab = t->slab_rows;
    if (p->used == UINT32_MAX - 1) {
        *fail = TABLE_LIMIT;
        return 0;
    }
    if ((uint64_t)p->used == (uint64_t)p->nslabs * per_slab) {
        if (p->nslabs == p->slabs_cap) {
            uint32_t ncap = p->slabs_cap ? p->slabs_cap * 2 : 8;
            uint64_t more = (uint64_t)(ncap - p->slabs_cap) * sizeof(unsigned char *);
            if (!alloc_take(t, more)) {
                *fail = TABLE_LIMIT;
                return 0;
            }
            unsigned char **ns = realloc(p->slabs, ncap * sizeof(*ns));
            if (ns == NULL) {
                alloc_give(t, more);
                *fail = TABLE_NOMEM;
                return 0;
            }
            p->bytes += (uint64_t)(ncap - p->slabs_cap) * sizeof(*ns);
            p->slabs = ns;
            p->slabs_cap = ncap;
        }
        size_t bytes = (size_t)per_slab * t->row_bytes + slab_bitmap_bytes(t);
        if (!alloc_take(t, bytes)) {
            *fail = TABLE_LIMIT;
            return 0;
        }
        unsigned char *slab = malloc(bytes);
        if (slab == NULL) {
            alloc_give(t, bytes);
            *fail = TABLE_NOMEM;
            return 0;
        }
        memset(slab + (size_t)per_slab * t->row_bytes, 0, slab_bitmap_bytes(t));
        p->slabs[p->nslabs++] = slab;
        p->bytes += bytes;
    }
    return ++p->used;
}

/* ---- the index --------------------------------------------------------------------------- */

/* Doubles p's index, asking the budget first. Returns 0, or TABLE_NOMEM / TABLE_LIMIT when
 * memory runs out or the budget (or the largest capacity) refuses: the old index stays. */
static int index_grow(table *t, partition *p)
{
    uint64_t t0 = now_ns();
    if (p->ix.cap >= (UINT32_C(1) << 31))
        return TABLE_LIMIT;
    uint64_t more = table_index_bytes(p->ix.cap);
    if (!alloc_take(t, more))
        return TABLE_LIMIT;
    if (table_index_grow(&p->ix) != 0) {
        alloc_give(t, more);
        return TABLE_NOMEM;
    }
    p->bytes += more;
    uint64_t dt = now_ns() - t0;
    count_add(&p->index_growths, 1);
    if (dt > count_get(&p->longest_growth_ns))
        atomic_store_explicit(&p->longest_growth_ns, dt, memory_order_relaxed);
    return 0;
}

/* ---- creation ----------------------------------------------------------------------------- */

static bool power_of_two(uint32_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

static int check_spec(const table_spec *s, char *err, size_t errlen)
{
    if (s == NULL)
        return errf(err, errlen, "table: spec = NULL");
    size_t nlen = s->name ? strlen(s->name) : 0;
    if (nlen == 0 || nlen > TABLE_MAX_NAME)
        return errf(err, errlen, "table: name length %zu: must be 1..%d bytes", nlen,
                    TABLE_MAX_NAME);
    if (s->dim == 0 || s->dim > TABLE_MAX_DIM)
        return errf(err, errlen, "table %s: dim = %u: must be in 1..%d", s->name, s->dim,
                    TABLE_MAX_DIM);
    char why[200];
    if (optimizer_validate(&s->opt, why, sizeof(why)) != 0)
        return errf(err, errlen, "table %s: %s", s->name, why);
    if (row_dtype_size(s->dtype) == 0)
        return errf(err, errlen, "table %s: dtype %d: unknown (float32, bfloat16 or float16)",
                    s->name, (int)s->dtype);
    const char *wide = optimizer_not_narrow(s->opt.kind);
    if (s->dtype != ROW_FLOAT32 && wide != NULL)
        return errf(err, errlen, "table %s: %s rows cannot have optimizer %s: %s", s->name,
                    row_dtype_name(s->dtype), optimizer_name(s->opt.kind), wide);
    if (initializer_validate(&s->init, NULL, 0, why, sizeof(why)) != 0)
        return errf(err, errlen, "table %s: %s", s->name, why);
    if (s->init.kind == INITIALIZER_GLOROT_UNIFORM)
        return errf(err, errlen,
                    "table %s: initializer glorot_uniform needs a bounded shape: use uniform or "
                    "normal for rows",
                    s->name);
    if (s->min_count > MAX_MIN_COUNT)
        return errf(err, errlen, "table %s: min_count = %u: must be at most %u", s->name,
                    s->min_count, MAX_MIN_COUNT);
    if (s->ttl_ms < 0)
        return errf(err, errlen, "table %s: ttl_ms = %lld: must be >= 0", s->name,
                    (long long)s->ttl_ms);
    if (s->never_evict && (s->max_rows != 0 || s->ttl_ms != 0))
        return errf(err, errlen, "table %s: never_evict with max_rows or ttl_ms", s->name);
    if (s->ram_rows != 0 && s->never_evict)
        return errf(err, errlen, "table %s: never_evict with ram_rows", s->name);
    if (s->ram_rows != 0 && !cold_store_available())
        return errf(err, errlen,
                    "table %s: ram_rows = %llu needs a cold tier on disk, and this server was "
                    "built without RocksDB (librocksdb-dev)",
                    s->name, (unsigned long long)s->ram_rows);
    if (s->ram_rows != 0 && (s->cold_dir == NULL || s->cold_dir[0] == '\0'))
        return errf(err, errlen,
                    "table %s: ram_rows = %llu needs a cold tier on disk: start the servers with "
                    "cold-dir",
                    s->name, (unsigned long long)s->ram_rows);
    if (s->partitions != 0 &&
        (!power_of_two(s->partitions) || s->partitions > TABLE_MAX_PARTITIONS))
        return errf(err, errlen, "table %s: partitions = %u: must be a power of two in 1..%d",
                    s->name, s->partitions, TABLE_MAX_PARTITIONS);
    uint32_t parts = s->partitions ? s->partitions : TABLE_DEFAULT_PARTITIONS;
    if (s->expected_rows / parts > (UINT64_C(1) << 30))
        return errf(err, errlen,
                    "table %s: expected_rows = %llu: more than 2^30 rows a partition (%u "
                    "partitions)",
                    s->name, (unsigned long long)s->expected_rows, parts);
    return 0;
}

/* Partition q's share of max_rows: max_rows / nparts, one more for the first max_rows % nparts
 * partitions (so the shares add up to max_rows, and none is 0: nparts <= max_rows). */
static uint64_t partition_max_rows(const table *t, uint32_t q)
{
    if (t->max_rows == 0)
        return 0;
    return t->max_rows / t->nparts + (q < t->max_rows % t->nparts ? 1 : 0);
}

/* Partition q's share of ram_rows (as partition_max_rows), at least 1 (0: no cold tier). */
static uint64_t partition_ram_rows(const table *t, uint32_t q)
{
    if (t->ram_rows == 0)
        return 0;
    uint64_t share = t->ram_rows / t->nparts + (q < t->ram_rows % t->nparts ? 1 : 0);
    return share ? share : 1;
}

/* Returns 0, or -1 when memory runs out (p then needs only partition_fini). */
static int partition_init(table *t, partition *p)
{
    memset(p, 0, sizeof(*p));
    p->max_rows = partition_max_rows(t, (uint32_t)(p - t->parts));
    p->ram_rows = partition_ram_rows(t, (uint32_t)(p - t->parts));
    /* Room for expected_rows spread over the partitions (never more than the partition
     * keeps), plus 1/8 for an uneven spread. */
    uint64_t want = t->expected_rows / t->nparts;
    if (p->max_rows != 0 && want > p->max_rows)
        want = p->max_rows;
    if (p->ram_rows != 0 && want > p->ram_rows)
        want = p->ram_rows;
    if (table_index_init(&p->ix, table_index_cap_for(want + want / 8 + 1)) != 0)
        return -1;
    p->bytes = sizeof(*p) + table_index_bytes(p->ix.cap);
    if (t->dtype != ROW_FLOAT32) {
        if ((p->wide = malloc((size_t)t->dim * sizeof(float))) == NULL)
            return -1;
        p->bytes += (size_t)t->dim * sizeof(float);
    }
    return table_sketch_init(t, p);
}

int table_create(const table_spec *spec, table **out, char *err, size_t errlen)
{
    *out = NULL;
    if (check_spec(spec, err, errlen) != 0)
        return TABLE_INVALID;
    table *t = calloc(1, sizeof(*t));
    if (t == NULL)
        goto oom;
    t->name = strdup(spec->name);
    if (t->name == NULL)
        goto oom_table;
    t->name_key = placement_hash(spec->name);
    t->dim = spec->dim;
    t->opt = spec->opt;
    t->init = spec->init;
    optimizer_row_shape shape;
    optimizer_row_shape_of(spec->opt.kind, &shape);
    t->nslots = (uint32_t)shape.slots;
    t->nscalars = (uint32_t)shape.scalars;
    t->ncounts = (uint32_t)shape.counts;
    t->row_floats = t->dim * (1 + t->nslots) + t->nscalars + t->ncounts;
    t->dtype = spec->dtype;
    t->param_bytes = (uint32_t)((t->dim * row_dtype_size(t->dtype) + 3) & ~(size_t)3);
    /* Rounded up to the header's alignment, so that every row header in a slab is aligned. */
    t->row_bytes =
        sizeof(row_header) + t->param_bytes + (size_t)(t->row_floats - t->dim) * sizeof(float);
    t->row_bytes = (t->row_bytes + _Alignof(row_header) - 1) & ~(_Alignof(row_header) - 1);
    /* As many rows as fit in SLAB_BYTES with their bitmap (table_layout.h), at least one. */
    t->slab_rows = (uint32_t)(SLAB_BYTES / t->row_bytes);
    while (t->slab_rows > 1 &&
           (size_t)t->slab_rows * t->row_bytes + ((size_t)t->slab_rows + 63) / 64 * 8 > SLAB_BYTES)
        t->slab_rows--;
    if (t->slab_rows == 0)
        t->slab_rows = 1;
    t->slab_magic = slab_magic_of(t->slab_rows);
    t->nparts = spec->partitions ? spec->partitions : TABLE_DEFAULT_PARTITIONS;
    /* Every partition keeps at least one row of max_rows: fewer partitions for a smaller one. */
    while (spec->max_rows != 0 && t->nparts > spec->max_rows)
        t->nparts /= 2;
    uint32_t bits = 0;
    while ((1u << bits) < t->nparts)
        bits++;
    t->part_shift = 64 - bits;
    t->min_count = spec->min_count;
    t->ttl_ms = spec->ttl_ms;
    t->max_rows = spec->max_rows;
    t->expected_rows = spec->expected_rows;
    t->ram_rows = spec->ram_rows;
    t->never_evict = spec->never_evict;
    t->budget = spec->budget;
    t->row_charge = t->row_bytes + 2 * table_index_bytes(1);
    atomic_init(&t->refs, 1);
    t->parts = calloc(t->nparts, sizeof(*t->parts));
    if (t->parts == NULL)
        goto oom_name;
    t->own_bytes = sizeof(*t) + strlen(t->name) + 1;
    uint32_t made = 0;
    for (; made < t->nparts; made++) {
        if (partition_init(t, &t->parts[made]) != 0 ||
            pthread_rwlock_init(&t->parts[made].lock, NULL) != 0) {
            partition_fini(&t->parts[made]);
            goto oom_parts;
        }
    }
    t->created_bytes = table_held_bytes(t);
    uint64_t total = t->own_bytes + t->created_bytes;
    if (!budget_take(t, total)) {
        errf(err, errlen, "table %s: memory limit reached: the empty table needs %llu bytes",
             spec->name, (unsigned long long)total);
        for (uint32_t j = 0; j < t->nparts; j++) {
            partition_fini(&t->parts[j]);
            pthread_rwlock_destroy(&t->parts[j].lock);
        }
        free(t->parts);
        free(t->name);
        free(t);
        return TABLE_LIMIT;
    }
    if (t->ram_rows != 0 && table_cold_open(t, spec->cold_dir, err, errlen) != 0) {
        table_unref(t);
        return TABLE_INVALID;
    }
    *out = t;
    return TABLE_OK;

oom_parts:
    for (uint32_t j = 0; j < made; j++) {
        partition_fini(&t->parts[j]);
        pthread_rwlock_destroy(&t->parts[j].lock);
    }
    free(t->parts);
oom_name:
    free(t->name);
oom_table:
    free(t);
oom:
    errf(err, errlen, "table %s: out of memory", spec->name);
    return TABLE_NOMEM;
}

void table_destroy(table *t)
{
    if (t != NULL)
        table_unref(t);
}

const char *table_name(const table *t)
{
    return t->name;
}

uint32_t table_dim(const table *t)
{
    return t->dim;
}

uint32_t table_row_floats(const table *t)
{
    return t->row_floats;
}

row_dtype table_dtype(const table *t)
{
    return t->dtype;
}

uint32_t table_legacy_row_floats(const table *t)
{
    if (t->ncounts == 0)
        return t->row_floats;
    return t->dim * (1 + (uint32_t)optimizer_slot_count(t->opt.kind));
}

void table_row_from_legacy(const table *t, const float *legacy, float *out)
{
    /* Adam's legacy row: parameters, m, v, then the step count of each element. */
    size_t keep = (size_t)t->dim * (1 + t->nslots) + t->nscalars;
    memcpy(out, legacy, keep * sizeof(float));
    if (t->ncounts == 0)
        return;
    const float *steps = legacy + keep;
    float most = 0.0f;
    for (uint32_t i = 0; i < t->dim; i++)
        most = steps[i] > most ? steps[i] : most;
    out[keep] = most;
}

uint32_t table_partitions(const table *t)
{
    return t->nparts;
}

uint32_t table_partition_of(const table *t, int64_t id)
{
    return part_of(t, table_id_hash(id));
}

/* ---- making rows --------------------------------------------------------------------------- */

/* A slot for a new row in p (write-locked): room made first under max_rows and (reserve)
 * ram_rows (table_reserve_row), then under the budget. Stores slot + 1 in *out (the row's contents,
 * the index and the LRU list are the caller's). Returns TABLE_OK, TABLE_NOMEM, or TABLE_LIMIT when
 * the budget refuses memory and p has no row to evict for room (*out then 0). */
static int row_slot(table *t, partition *p, bool reserve, uint32_t *out)
{
    *out = 0;
    table_reserve_row(t, p, reserve);
    /* A logical budget: the row's share first; over the budget, the partition's oldest rows
     * give theirs (table_row_remove gives it back). */
    while (t->budget.logical && !budget_take(t, t->row_charge))
        if (!table_evict_for_memory(t, p))
            return TABLE_LIMIT;
    int rc = TABLE_OK;
    if (table_index_full(&p->ix)) {
        rc = index_grow(t, p);
        /* Over the budget: the partition's oldest row gives its index entry instead. */
        if (rc == TABLE_LIMIT && table_evict_for_memory(t, p))
            rc = TABLE_OK;
    }
    uint32_t slot1 = 0;
    if (rc == TABLE_OK) {
        slot1 = slot_alloc(t, p, &rc);
        /* Over the budget: the partition's oldest row gives its slot (back from the free
         * list). */
        if (slot1 == 0 && rc == TABLE_LIMIT && table_evict_for_memory(t, p))
            slot1 = slot_alloc(t, p, &rc);
    }
    if (slot1 == 0) {
        if (t->budget.logical)
            budget_give(t, t->row_charge); /* not made */
        return rc;
    }
    *out = slot1;
    return TABLE_OK;
}

void table_row_init(table *t, partition *p, row_header *r, int64_t id)
{
    r->id = id;
    r->updated_ms = 0;
    if (t->dtype == ROW_FLOAT32) {
        initializer_fill_row(&t->init, t->name_key, id, (float *)(void *)row_params(r), t->dim);
    } else {
        float *wide = p->wide; /* the initializer's row before rounding */
        initializer_fill_row(&t->init, t->name_key, id, wide, t->dim);
        row_dtype_narrow(t->dtype, row_params(r), wide, t->dim);
    }
    float *state = row_state(t, r), *slots[OPTIMIZER_MAX_SLOTS] = {0};
    for (uint32_t s = 0; s < t->nslots; s++)
        slots[s] = state + (size_t)s * t->dim;
    optimizer_init_row(&t->opt, slots, state + (size_t)t->nslots * t->dim, row_counts(t, r),
                       t->dim);
}

int table_row_make(table *t, partition *p, int64_t id, uint64_t h, bool reserve, uint32_t *out)
{
    uint32_t slot1;
    int rc = row_slot(t, p, reserve, &slot1);
    *out = 0;
    if (rc != TABLE_OK)
        return rc;
    table_row_init(t, p, row_at(t, p, slot1 - 1), id);
    /* The probe runs again: an eviction above may have shifted entries. */
    table_index_put(&p->ix, table_index_probe(&p->ix, id, h), id, slot1);
    table_lru_push_front(t, p, slot1);
    table_mark_dirty(t, p, slot1);
    count_add(&p->rows_created, 1);
    *out = slot1;
    return TABLE_OK;
}

/* Promotes id's row from disk (val: its value, table_cold_value_bytes) into p (write-locked,
 * id absent from the index) and stores slot + 1 in *out: first in the LRU order (front: it is
 * about to be updated) or at its update time's place; reserve: table_layout.h. Returns as
 * table_row_make; on failure the row stays on disk. */
int table_row_promote(table *t, partition *p, int64_t id, uint64_t h, const unsigned char *val,
                      bool front, bool reserve, uint32_t *out)
{
    int64_t upd;
    memcpy(&upd, val, sizeof(upd));
    table_cold_take(t, p, id, upd);
    uint32_t slot1;
    int rc = row_slot(t, p, reserve, &slot1);
    *out = 0;
    if (rc != TABLE_OK) {
        table_cold_put(t, p, id, val);
        return rc;
    }
    row_header *r = row_at(t, p, slot1 - 1);
    r->id = id;
    r->updated_ms = upd;
    memcpy(row_params(r), val + sizeof(int64_t), t->row_bytes - sizeof(row_header));
    table_index_put(&p->ix, table_index_probe(&p->ix, id, h), id, slot1);
    if (front)
        table_lru_push_front(t, p, slot1);
    else
        table_lru_insert_by_time(
            t, p, slot1, t->ttl_ms == 0 && t->max_rows == 0 ? TABLE_LRU_WALK_LOOSE : UINT32_MAX);
    count_add(&p->promotions, 1);
    *out = slot1;
    return TABLE_OK;
}

/* Reads id's row from disk into val (p write-locked) when it is there, gathered writes
 * flushed first: the read of one id that a call's batched read could not answer (its row went
 * to disk, or disk rows were deleted, during the call). */
bool table_cold_read_one(table *t, partition *p, int64_t id, unsigned char *val)
{
    bool found = false;
    if (p->cold_rows > 0)
        (void)table_cold_get(t, p, &id, 1, val, &found);
    return found;
}

/* ---- removal ----------------------------------------------------------------------------- */

size_t table_remove(table *t, const int64_t *ids, size_t n)
{
    size_t removed = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = table_id_hash(ids[i]);
        partition *p = &t->parts[part_of(t, h)];
        table_write_lock(t, p);
        uint32_t pos = table_index_probe(&p->ix, ids[i], h);
        if (p->ix.e[pos].slot1 != 0) {
            table_row_remove(t, p, pos);
            count_add(&p->removed, 1);
            removed++;
        } else if (t->cold != NULL && table_cold_remove(t, p, ids[i])) {
            count_add(&p->removed, 1);
            removed++;
        }
        table_write_unlock(t, p);
    }
    return removed;
}

/* ---- counters, export, restore ------------------------------------------------------------ */

void table_stats_get(table *t, table_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->bytes = t->own_bytes;
    out->row_bytes = t->row_bytes;
    for (uint32_t q = 0; q < t->nparts; q++) {
        partition *p = &t->parts[q];
        pthread_rwlock_rdlock(&p->lock);
        out->rows += p->ix.count + p->cold_rows;
        out->rows_disk += p->cold_rows;
        out->bytes += p->bytes;
        pthread_rwlock_unlock(&p->lock);
        out->cold_hits += count_get(&p->cold_hits);
        out->promotions += count_get(&p->promotions);
        out->demotions += count_get(&p->demotions);
        out->lookups += count_get(&p->lookups);
        out->lookup_misses += count_get(&p->lookup_misses);
        out->rows_created += count_get(&p->rows_created);
        out->pushes_counted += count_get(&p->pushes_counted);
        out->rows_updated += count_get(&p->rows_updated);
        out->evicted_ttl += count_get(&p->evicted_ttl);
        out->evicted_max_rows += count_get(&p->evicted_max_rows);
        out->evicted_memory += count_get(&p->evicted_memory);
        out->rows_refused += count_get(&p->rows_refused);
        out->removed += count_get(&p->removed);
        out->index_growths += count_get(&p->index_growths);
        uint64_t g = count_get(&p->longest_growth_ns);
        out->longest_growth_ns = g > out->longest_growth_ns ? g : out->longest_growth_ns;
    }
    if (t->cold != NULL)
        out->bytes_disk = cold_store_disk_bytes(t->cold);
    out->cold_errors = count_get(&t->cold_errors);
}

/* An export cursor's slot from here on counts the partition's rows on disk (in id order) that
 * were exported. */
#define EXPORT_COLD UINT32_C(0x80000000)

size_t table_export(table *t, uint64_t *cursor, size_t max, int64_t *ids, float *rows)
{
    size_t n = 0;
    uint64_t q = *cursor >> 32, s = *cursor & 0xffffffffu;
    for (; q < t->nparts && n < max; q++, s = 0) {
        partition *p = &t->parts[q];
        pthread_rwlock_rdlock(&p->lock);
        if (s >= EXPORT_COLD) {
            bool more = false;
            if (p->cold_rows > 0) {
                size_t k = table_cold_export(t, (uint32_t)q, s - EXPORT_COLD, max - n, ids + n,
                                             rows + n * (size_t)t->dim, &more);
                n += k;
                s += k;
            }
            pthread_rwlock_unlock(&p->lock);
            if (more)
                break;
            continue;
        }
        for (; s < p->used && n < max; s++) {
            row_header *r = row_at(t, p, (uint32_t)s);
            /* A live slot is the one the index gives its id (a free one's id is stale). */
            if (table_index_find(&p->ix, r->id, table_id_hash(r->id)) != s + 1)
                continue;
            ids[n] = r->id;
            row_dtype_widen(t->dtype, rows + n * (size_t)t->dim, row_params(r), t->dim);
            n++;
        }
        bool more = s < p->used;
        if (!more && t->cold != NULL && p->cold_rows > 0) {
            /* Then its rows on disk (in the next call when this one is full). */
            s = EXPORT_COLD;
            if (n < max) {
                size_t k = table_cold_export(t, (uint32_t)q, 0, max - n, ids + n,
                                             rows + n * (size_t)t->dim, &more);
                n += k;
                s += k;
            } else {
                more = true;
            }
        }
        pthread_rwlock_unlock(&p->lock);
        if (more)
            break;
    }
    *cursor = q >= t->nparts ? UINT64_MAX : (q << 32) | s;
    return n;
}

size_t table_partition_clear(table *t, uint32_t part)
{
    if (part >= t->nparts)
        return 0;
    partition *p = &t->parts[part];
    size_t removed = 0;
    table_write_lock(t, p);
    while (p->lru_tail != 0) {
        row_header *r = row_at(t, p, p->lru_tail - 1);
        table_row_remove(t, p, table_index_probe(&p->ix, r->id, table_id_hash(r->id)));
        removed++;
    }
    if (t->cold != NULL)
        removed += table_cold_clear(t, p);
    table_write_unlock(t, p);
    return removed;
}

int table_insert_row(table *t, int64_t id, const float *floats, int64_t updated_ms)
{
    uint64_t h = table_id_hash(id);
    partition *p = &t->parts[part_of(t, h)];
    table_write_lock(t, p);
    uint32_t slot1 = table_index_find(&p->ix, id, h);
    int rc = TABLE_OK;
    if (slot1 == 0 && t->cold != NULL)
        (void)table_cold_remove(t, p, id); /* overwritten: made again in RAM */
    if (slot1 == 0)
        rc = table_row_make(t, p, id, h, true, &slot1);
    if (slot1 != 0) {
        row_header *r = row_at(t, p, slot1 - 1);
        row_from_floats(t, r, floats);
        r->updated_ms = updated_ms;
        table_lru_unlink(t, p, slot1);
        table_lru_push_front(t, p, slot1);
        table_mark_dirty(t, p, slot1);
    }
    table_write_unlock(t, p);
    return rc;
}
