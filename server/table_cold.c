/* The cold tier of a sparse table (table_cold.h): its store's keys and values, demotion and
 * promotion's writes, the oldest cold row, the TTL sweep, clearing and reading a partition's
 * cold rows for checkpoints, copies and export, and a restored table's store made from a
 * checkpoint's copy (table_cold_adopt, table.h). */
#include "table_cold.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

static void put_be64(unsigned char *o, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        o[i] = (unsigned char)(v >> (56 - 8 * i));
}

static uint64_t get_be64(const unsigned char *o)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | o[i];
    return v;
}

/* Times in key order: the sign bit flipped. */
static uint64_t time_bits(int64_t ms)
{
    return (uint64_t)ms ^ (UINT64_C(1) << 63);
}

static void row_key(unsigned char *k, uint32_t q, int64_t id)
{
    k[0] = 'r';
    k[1] = (unsigned char)q;
    put_be64(k + 2, (uint64_t)id);
}

static void time_key(unsigned char *k, uint32_t q, int64_t ms, int64_t id)
{
    k[0] = 't';
    k[1] = (unsigned char)q;
    put_be64(k + 2, time_bits(ms));
    put_be64(k + 10, (uint64_t)id);
}

static uint32_t part_index(const table *t, const partition *p)
{
    return (uint32_t)(p - t->parts);
}

/* Whether t keeps time keys: only max_rows and the TTL sweep read them (half the writes of a
 * row's moves without). */
static bool time_index(const table *t)
{
    return t->ttl_ms != 0 || t->max_rows != 0;
}

int table_cold_open(table *t, const char *dir, char *err, size_t errlen)
{
    char path[4096], label[64];
    snprintf(label, sizeof(label), "table-%016llx", (unsigned long long)t->name_key);
    cold_store_dir_name(path, sizeof(path), dir, label);
    char why[1024];
    t->cold = cold_store_open(path, why, sizeof(why));
    if (t->cold == NULL)
        return errf(err, errlen, "table %s: cold tier: %s", t->name, why);
    for (uint32_t q = 0; q < t->nparts; q++)
        if ((t->parts[q].cold_wb = cold_batch_new()) == NULL ||
            (t->parts[q].cold_val = malloc(table_cold_value_bytes(t))) == NULL)
            return errf(err, errlen, "table %s: out of memory", t->name);
    return 0;
}

int table_cold_adopt(table *t, const char *from, const uint64_t *cold_n, char *err, size_t errlen)
{
    if (t->cold == NULL)
        return errf(err, errlen,
                    "table %s: its checkpoint holds rows on disk (in %s), but the "
                    "table has no cold tier here (ram_rows, cold-dir)",
                    t->name, from);
    char parent[4096], path[4096], label[64], why[1024];
    snprintf(parent, sizeof(parent), "%s", cold_store_dir(t->cold));
    char *slash = strrchr(parent, '/');
    if (slash != NULL)
        *slash = '\0';
    else
        snprintf(parent, sizeof(parent), ".");
    snprintf(label, sizeof(label), "table-%016llx", (unsigned long long)t->name_key);
    cold_store_dir_name(path, sizeof(path), parent, label);
    cold_store *s = cold_store_open_from(path, from, why, sizeof(why));
    if (s == NULL)
        return errf(err, errlen, "table %s: its rows on disk: %s", t->name, why);
    cold_store_close(t->cold, true);
    t->cold = s;
    for (uint32_t q = 0; q < t->nparts; q++)
        t->parts[q].cold_rows = cold_n[q];
    return 0;
}

/* How often table_cold_room looks at the disk: rows written in between (about 1 MB at
 * 100 k rows/s) are far below the headroom. */
#define COLD_ROOM_EVERY_MS 20

int table_cold_flush(table *t, partition *p)
{
    char why[512];
    if (cold_store_write(t->cold, p->cold_wb, why, sizeof(why)) != 0) {
        count_add(&t->cold_errors, 1);
        bool no = false;
        if (atomic_compare_exchange_strong(&t->cold_why_taken, &no, true)) {
            snprintf(t->cold_why, sizeof(t->cold_why), "%s", why);
            atomic_store(&t->cold_broken, true);
        }
        return -1;
    }
    return 0;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool table_cold_room(table *t)
{
    if (atomic_load(&t->cold_broken))
        return false;
    int64_t now = mono_ms(), last = atomic_load_explicit(&t->cold_checked, memory_order_relaxed);
    if ((last == 0 || now - last >= COLD_ROOM_EVERY_MS) &&
        atomic_compare_exchange_strong(&t->cold_checked, &last, now)) {
        uint64_t free_bytes;
        bool full =
            cold_store_free_bytes(t->cold, &free_bytes) == 0 && free_bytes < cold_store_headroom();
        atomic_store(&t->cold_full, full);
    }
    return !atomic_load(&t->cold_full);
}

void table_cold_why(table *t, char *buf, size_t cap)
{
    if (atomic_load(&t->cold_broken)) {
        snprintf(buf, cap, "a write to its cold tier on disk failed (%s)", t->cold_why);
        return;
    }
    uint64_t free_bytes = 0;
    (void)cold_store_free_bytes(t->cold, &free_bytes);
    snprintf(buf, cap,
             "the disk of its cold tier is short of room (%s: %llu MiB free, %llu MiB kept free "
             "for the store to go on writing)",
             cold_store_dir(t->cold), (unsigned long long)(free_bytes >> 20),
             (unsigned long long)(cold_store_headroom() >> 20));
}

int table_cold_get(table *t, partition *p, const int64_t *ids, size_t n, unsigned char *vals,
                   bool *found)
{
    if (n == 0)
        return 0;
    (void)table_cold_flush(t, p);
    unsigned char *keys = malloc(n * COLD_ROW_KEY);
    if (keys == NULL) {
        memset(found, 0, n * sizeof(*found));
        count_add(&t->cold_errors, 1);
        return -1;
    }
    uint32_t q = part_index(t, p);
    for (size_t i = 0; i < n; i++)
        row_key(keys + i * COLD_ROW_KEY, q, ids[i]);
    char why[512];
    int rc = cold_store_multiget(t->cold, n, keys, COLD_ROW_KEY, vals, table_cold_value_bytes(t),
                                 found, why, sizeof(why));
    free(keys);
    if (rc != 0) {
        memset(found, 0, n * sizeof(*found));
        count_add(&t->cold_errors, 1);
    }
    return rc;
}

int table_cold_get_many(table *t, const uint32_t *parts, const int64_t *ids, size_t n,
                        unsigned char *vals, bool *found)
{
    if (n == 0)
        return 0;
    unsigned char *keys = malloc(n * COLD_ROW_KEY);
    if (keys == NULL) {
        memset(found, 0, n * sizeof(*found));
        count_add(&t->cold_errors, 1);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        row_key(keys + i * COLD_ROW_KEY, parts[i], ids[i]);
    char why[512];
    int rc = cold_store_multiget(t->cold, n, keys, COLD_ROW_KEY, vals, table_cold_value_bytes(t),
                                 found, why, sizeof(why));
    free(keys);
    if (rc != 0) {
        memset(found, 0, n * sizeof(*found));
        count_add(&t->cold_errors, 1);
    }
    return rc;
}

void table_cold_put(table *t, partition *p, int64_t id, const unsigned char *val)
{
    unsigned char k[COLD_TIME_KEY];
    uint32_t q = part_index(t, p);
    int64_t upd;
    memcpy(&upd, val, sizeof(upd));
    row_key(k, q, id);
    cold_batch_put(p->cold_wb, k, COLD_ROW_KEY, val, table_cold_value_bytes(t));
    if (time_index(t)) {
        time_key(k, q, upd, id);
        cold_batch_put(p->cold_wb, k, COLD_TIME_KEY, "", 0);
    }
    p->cold_rows++;
    p->cold_moves++;
}

/* p->cold_val = row r's value on disk. */
static void row_value(table *t, partition *p, const row_header *r)
{
    /* The body's bytes that hold something (not the padding after the parameters and at the
     * row's end, which nothing writes): the value on disk is then fully defined. */
    unsigned char *v = p->cold_val;
    const unsigned char *body = (const unsigned char *)(r + 1);
    size_t used = (size_t)t->dim * row_dtype_size(t->dtype);
    memset(v, 0, table_cold_value_bytes(t));
    memcpy(v, &r->updated_ms, sizeof(int64_t));
    memcpy(v + sizeof(int64_t), body, used);
    memcpy(v + sizeof(int64_t) + t->param_bytes, body + t->param_bytes,
           (size_t)(t->row_floats - t->dim) * sizeof(float));
}

void table_cold_demote(table *t, partition *p, const row_header *r)
{
    row_value(t, p, r);
    table_cold_put(t, p, r->id, p->cold_val);
    count_add(&p->demotions, 1);
}

void table_cold_rewrite(table *t, partition *p, const row_header *r, int64_t old_ms)
{
    unsigned char k[COLD_TIME_KEY];
    uint32_t q = part_index(t, p);
    row_value(t, p, r);
    row_key(k, q, r->id);
    cold_batch_put(p->cold_wb, k, COLD_ROW_KEY, p->cold_val, table_cold_value_bytes(t));
    if (time_index(t) && old_ms != r->updated_ms) {
        time_key(k, q, old_ms, r->id);
        cold_batch_delete(p->cold_wb, k, COLD_TIME_KEY);
        time_key(k, q, r->updated_ms, r->id);
        cold_batch_put(p->cold_wb, k, COLD_TIME_KEY, "", 0);
    }
    p->cold_moves++;
}

void table_cold_take(table *t, partition *p, int64_t id, int64_t updated_ms)
{
    unsigned char k[COLD_TIME_KEY];
    uint32_t q = part_index(t, p);
    row_key(k, q, id);
    cold_batch_delete(p->cold_wb, k, COLD_ROW_KEY);
    if (time_index(t)) {
        time_key(k, q, updated_ms, id);
        cold_batch_delete(p->cold_wb, k, COLD_TIME_KEY);
    }
    p->cold_rows--;
    p->cold_moves++;
}

/* Deletes the cold rows of p whose time keys lie in [lo, hi) (up to max of them). */
static size_t delete_by_time(table *t, partition *p, const unsigned char *lo,
                             const unsigned char *hi, size_t hilen, size_t max)
{
    (void)table_cold_flush(t, p);
    cold_iter *it = cold_iter_new(t->cold, NULL, lo, 2, hi, hilen);
    if (it == NULL)
        return 0;
    const unsigned char *k, *v;
    size_t kl, vl, n = 0;
    uint32_t q = part_index(t, p);
    while (n < max && cold_iter_next(it, &k, &kl, &v, &vl)) {
        if (kl != COLD_TIME_KEY)
            continue;
        unsigned char rk[COLD_ROW_KEY];
        row_key(rk, q, (int64_t)get_be64(k + 10));
        cold_batch_delete(p->cold_wb, rk, COLD_ROW_KEY);
        cold_batch_delete(p->cold_wb, k, COLD_TIME_KEY);
        n++;
    }
    cold_iter_free(it);
    p->cold_rows -= n <= p->cold_rows ? n : p->cold_rows;
    p->cold_gen++;
    p->cold_moves++;
    (void)table_cold_flush(t, p);
    return n;
}

bool table_cold_evict_oldest(table *t, partition *p, _Atomic uint64_t *counter)
{
    if (p->cold_rows == 0)
        return false;
    uint32_t q = part_index(t, p);
    unsigned char lo[2] = {'t', (unsigned char)q}, hi[2] = {'t', (unsigned char)(q + 1)};
    size_t n = delete_by_time(t, p, lo, q + 1 < 256 ? hi : (unsigned char[]){'u', 0}, 2, 1);
    if (n > 0)
        count_add(counter, n);
    return n > 0;
}

bool table_cold_oldest(table *t, partition *p, int64_t *ms)
{
    if (p->cold_rows == 0 || !time_index(t))
        return false;
    (void)table_cold_flush(t, p);
    uint32_t q = part_index(t, p);
    unsigned char lo[2] = {'t', (unsigned char)q}, hi[2] = {'t', (unsigned char)(q + 1)};
    cold_iter *it =
        cold_iter_new(t->cold, NULL, lo, 2, q + 1 < 256 ? hi : (unsigned char[]){'u', 0}, 2);
    if (it == NULL)
        return false;
    const unsigned char *k, *v;
    size_t kl, vl;
    bool found = false;
    while (!found && cold_iter_next(it, &k, &kl, &v, &vl))
        if (kl == COLD_TIME_KEY) {
            *ms = (int64_t)(get_be64(k + 2) ^ (UINT64_C(1) << 63));
            found = true;
        }
    cold_iter_free(it);
    return found;
}

size_t table_cold_sweep(table *t, partition *p, int64_t cutoff_ms)
{
    if (p->cold_rows == 0)
        return 0;
    uint32_t q = part_index(t, p);
    unsigned char lo[2] = {'t', (unsigned char)q}, hi[10];
    hi[0] = 't';
    hi[1] = (unsigned char)q;
    put_be64(hi + 2, time_bits(cutoff_ms));
    return delete_by_time(t, p, lo, hi, sizeof(hi), SIZE_MAX);
}

size_t table_cold_clear(table *t, partition *p)
{
    if (p->cold_rows == 0)
        return 0;
    (void)table_cold_flush(t, p);
    uint32_t q = part_index(t, p);
    unsigned char lo[2] = {'r', (unsigned char)q}, hi[2] = {'r', (unsigned char)(q + 1)};
    cold_iter *it =
        cold_iter_new(t->cold, NULL, lo, 2, q + 1 < 256 ? hi : (unsigned char[]){'s', 0}, 2);
    if (it == NULL)
        return 0;
    const unsigned char *k, *v;
    size_t kl, vl, n = 0;
    while (cold_iter_next(it, &k, &kl, &v, &vl)) {
        if (kl != COLD_ROW_KEY || vl != table_cold_value_bytes(t))
            continue;
        cold_batch_delete(p->cold_wb, k, COLD_ROW_KEY);
        if (time_index(t)) {
            unsigned char tk[COLD_TIME_KEY];
            int64_t upd;
            memcpy(&upd, v, sizeof(upd));
            time_key(tk, q, upd, (int64_t)get_be64(k + 2));
            cold_batch_delete(p->cold_wb, tk, COLD_TIME_KEY);
        }
        n++;
    }
    cold_iter_free(it);
    p->cold_rows = 0;
    p->cold_gen++;
    p->cold_moves++;
    (void)table_cold_flush(t, p);
    return n;
}

bool table_cold_remove(table *t, partition *p, int64_t id)
{
    if (p->cold_rows == 0)
        return false;
    unsigned char *v = p->cold_val;
    bool found = false;
    if (table_cold_get(t, p, &id, 1, v, &found) != 0 || !found)
        return false;
    int64_t upd;
    memcpy(&upd, v, sizeof(upd));
    table_cold_take(t, p, id, upd);
    p->cold_gen++;
    return true;
}

/* One cold row read: its id, time and floats. */
typedef struct cold_row {
    int64_t id, updated_ms;
    size_t at; /* its floats' row in the scratch */
} cold_row;

static int cold_row_cmp(const void *a, const void *b)
{
    const cold_row *x = a, *y = b;
    if (x->updated_ms != y->updated_ms)
        return x->updated_ms < y->updated_ms ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

row_header *table_cold_value_row(const table *t, const unsigned char *v, int64_t id,
                                 row_header *hdr)
{
    memset(hdr, 0, sizeof(*hdr));
    hdr->id = id;
    memcpy(&hdr->updated_ms, v, sizeof(int64_t));
    memcpy(hdr + 1, v + sizeof(int64_t), t->row_bytes - sizeof(row_header));
    return hdr;
}

int table_cold_rows(table *t, uint32_t q, cold_snapshot *snap, size_t *n, int64_t **ids,
                    int64_t **updated_ms, float **floats)
{
    *n = 0;
    *ids = NULL;
    *updated_ms = NULL;
    *floats = NULL;
    unsigned char lo[2] = {'r', (unsigned char)q}, hi[2] = {'r', (unsigned char)(q + 1)};
    cold_iter *it =
        cold_iter_new(t->cold, snap, lo, 2, q + 1 < 256 ? hi : (unsigned char[]){'s', 0}, 2);
    row_header *hdr = malloc(t->row_bytes);
    size_t cap = 0, cnt = 0, rf = t->row_floats;
    cold_row *rows = NULL;
    float *fl = NULL;
    int rc = it != NULL && hdr != NULL ? 0 : -1;
    const unsigned char *k, *v;
    size_t kl, vl;
    while (rc == 0 && cold_iter_next(it, &k, &kl, &v, &vl)) {
        if (kl != COLD_ROW_KEY || vl != table_cold_value_bytes(t)) {
            rc = -1;
            break;
        }
        if (cnt == cap) {
            cap = cap ? 2 * cap : 256;
            cold_row *nr = realloc(rows, cap * sizeof(*nr));
            float *nf = nr ? realloc(fl, cap * rf * sizeof(float)) : NULL;
            if (nr)
                rows = nr;
            if (nf)
                fl = nf;
            if (nr == NULL || nf == NULL) {
                rc = -1;
                break;
            }
        }
        int64_t id = (int64_t)get_be64(k + 2);
        row_header *r = table_cold_value_row(t, v, id, hdr);
        rows[cnt] = (cold_row){id, r->updated_ms, cnt};
        row_to_floats(t, r, fl + cnt * rf);
        cnt++;
    }
    cold_iter_free(it);
    free(hdr);
    if (rc == 0 && cnt > 0) {
        qsort(rows, cnt, sizeof(*rows), cold_row_cmp);
        *ids = malloc(cnt * sizeof(int64_t));
        *updated_ms = malloc(cnt * sizeof(int64_t));
        *floats = malloc(cnt * rf * sizeof(float));
        if (*ids == NULL || *updated_ms == NULL || *floats == NULL) {
            rc = -1;
        } else {
            for (size_t i = 0; i < cnt; i++) {
                (*ids)[i] = rows[i].id;
                (*updated_ms)[i] = rows[i].updated_ms;
                memcpy(*floats + i * rf, fl + rows[i].at * rf, rf * sizeof(float));
            }
            *n = cnt;
        }
    }
    free(rows);
    free(fl);
    if (rc != 0) {
        free(*ids);
        free(*updated_ms);
        free(*floats);
        *ids = NULL;
        *updated_ms = NULL;
        *floats = NULL;
        *n = 0;
        count_add(&t->cold_errors, 1);
    }
    return rc;
}

size_t table_cold_export(table *t, uint32_t q, uint64_t skip, size_t max, int64_t *ids, float *rows,
                         bool *more)
{
    *more = false;
    unsigned char lo[2] = {'r', (unsigned char)q}, hi[2] = {'r', (unsigned char)(q + 1)};
    cold_iter *it =
        cold_iter_new(t->cold, NULL, lo, 2, q + 1 < 256 ? hi : (unsigned char[]){'s', 0}, 2);
    if (it == NULL)
        return 0;
    const unsigned char *k, *v;
    size_t kl, vl, n = 0;
    uint64_t seen = 0;
    while (cold_iter_next(it, &k, &kl, &v, &vl)) {
        if (kl != COLD_ROW_KEY || vl != table_cold_value_bytes(t))
            continue;
        if (seen++ < skip)
            continue;
        if (n == max) {
            *more = true;
            break;
        }
        ids[n] = (int64_t)get_be64(k + 2);
        row_dtype_widen(t->dtype, rows + n * (size_t)t->dim, v + sizeof(int64_t), t->dim);
        n++;
    }
    cold_iter_free(it);
    return n;
}
