/* Unit tests for the cold tier of sparse tables (server/table_cold.c, table.h's ram_rows): a
 * table whose RAM holds about a tenth of its rows gives, under random pushes and pulls, every
 * row bit for bit equal to the same table wholly in RAM (every optimizer, 16-bit rows too);
 * checkpoint cuts and copies carry the cold rows and a restore brings them back; max_rows, the
 * TTL sweep, table_remove, table_partition_clear and export cover the disk; rows asked for
 * often stay in RAM; a disk that fills mid-run; the spec's errors.
 * Skipped with a reason when the build has no RocksDB. */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cold_store.h"
#include "table.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/psd-table-cold-XXXXXX");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[600];
    /* test_disk_full's tmpfs, when it failed before unmounting it */
    snprintf(cmd, sizeof(cmd), "umount -l %s/small 2>/dev/null; rm -rf %s", dir, dir);
    return system(cmd) == 0 ? 0 : -1;
}

static table_spec spec_of(const char *name, uint32_t dim, optimizer_kind kind, uint64_t ram_rows)
{
    table_spec s;
    memset(&s, 0, sizeof(s));
    s.name = name;
    s.dim = dim;
    optimizer_params_default(&s.opt, kind);
    s.init.kind = INITIALIZER_UNIFORM;
    s.init.a = -0.5;
    s.init.b = 0.5;
    s.init.seed = 42;
    s.partitions = 8;
    s.ram_rows = ram_rows;
    s.cold_dir = ram_rows ? dir : NULL;
    return s;
}

static table *make(const table_spec *s)
{
    char err[512] = "";
    table *t = NULL;
    int rc = table_create(s, &t, err, sizeof(err));
    if (rc != TABLE_OK)
        print_error("table_create: %s\n", err);
    assert_int_equal(rc, TABLE_OK);
    return t;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15u;

static uint64_t rnd(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static float rnd_grad(void)
{
    return ((float)(rnd() % 2001) - 1000.0f) / 4000.0f;
}

/* Every row of t (both tiers), sorted by id. */
typedef struct all_rows {
    size_t n, w;
    int64_t *ids, *upd;
    float *rows;
} all_rows;

static int64_t *sort_ids;

static int idx_cmp(const void *a, const void *b)
{
    int64_t x = sort_ids[*(const size_t *)a], y = sort_ids[*(const size_t *)b];
    return x < y ? -1 : x > y;
}

static all_rows rows_of(table *t)
{
    all_rows a = {0};
    a.w = table_row_floats(t);
    uint32_t np = table_partitions(t);
    table_rows *parts = calloc(np, sizeof(*parts));
    for (uint32_t p = 0; p < np; p++) {
        assert_int_equal(table_copy_partition(t, p, &parts[p]), 0);
        a.n += parts[p].n;
    }
    int64_t *ids = malloc((a.n + 1) * sizeof(*ids)), *upd = malloc((a.n + 1) * sizeof(*upd));
    float *rows = malloc((a.n + 1) * a.w * sizeof(float));
    size_t k = 0;
    for (uint32_t p = 0; p < np; p++) {
        for (size_t i = 0; i < parts[p].n; i++, k++) {
            ids[k] = parts[p].ids[i];
            upd[k] = parts[p].updated_ms[i];
            memcpy(rows + k * a.w, parts[p].floats + i * a.w, a.w * sizeof(float));
        }
        table_rows_free(&parts[p]);
    }
    free(parts);
    size_t *ix = malloc((a.n + 1) * sizeof(*ix));
    for (size_t i = 0; i < a.n; i++)
        ix[i] = i;
    sort_ids = ids;
    qsort(ix, a.n, sizeof(*ix), idx_cmp);
    a.ids = malloc((a.n + 1) * sizeof(*a.ids));
    a.upd = malloc((a.n + 1) * sizeof(*a.upd));
    a.rows = malloc((a.n + 1) * a.w * sizeof(float));
    for (size_t i = 0; i < a.n; i++) {
        a.ids[i] = ids[ix[i]];
        a.upd[i] = upd[ix[i]];
        memcpy(a.rows + i * a.w, rows + ix[i] * a.w, a.w * sizeof(float));
        if (i > 0)
            assert_true(a.ids[i] != a.ids[i - 1]); /* a row is in one tier only */
    }
    free(ix);
    free(ids);
    free(upd);
    free(rows);
    return a;
}

static void rows_free(all_rows *a)
{
    free(a->ids);
    free(a->upd);
    free(a->rows);
}

/* a and b hold the same rows, bit for bit, with the same update times. */
static void assert_same_rows(table *a, table *b)
{
    all_rows x = rows_of(a), y = rows_of(b);
    assert_int_equal(x.n, y.n);
    assert_int_equal(x.w, y.w);
    assert_memory_equal(x.ids, y.ids, x.n * sizeof(int64_t));
    assert_memory_equal(x.upd, y.upd, x.n * sizeof(int64_t));
    assert_memory_equal(x.rows, y.rows, x.n * x.w * sizeof(float));
    rows_free(&x);
    rows_free(&y);
}

static void push_ok(table *t, const int64_t *ids, size_t n, const float *g, int64_t now)
{
    char err[512] = "";
    int rc = table_push(t, ids, n, g, now, err, sizeof(err));
    if (rc != TABLE_OK)
        print_error("table_push: %s\n", err);
    assert_int_equal(rc, TABLE_OK);
}

/* Random pushes and pulls on a table wholly in RAM and on one with ~10% of its rows in RAM. */
static void run_same(optimizer_kind kind, row_dtype dtype, uint32_t dim)
{
    enum { IDS = 2000, ROUNDS = 60, BATCH = 256 };
    table_spec s = spec_of("cold_eq", dim, kind, 0);
    s.dtype = dtype;
    table *ram = make(&s);
    s.ram_rows = IDS / 10;
    s.cold_dir = dir;
    table *cold = make(&s);
    int64_t ids[BATCH];
    float *g = malloc(BATCH * dim * sizeof(float));
    float *pa = malloc(BATCH * dim * sizeof(float)), *pb = malloc(BATCH * dim * sizeof(float));
    for (int r = 0; r < ROUNDS; r++) {
        for (size_t i = 0; i < BATCH; i++) {
            /* Skewed: half the ids from a hot tenth, duplicates included. */
            ids[i] = (int64_t)(rnd() % 2 ? rnd() % (IDS / 10) : rnd() % IDS) - IDS / 2;
            for (uint32_t k = 0; k < dim; k++)
                g[i * dim + k] = rnd_grad();
        }
        push_ok(ram, ids, BATCH, g, 1000 + r);
        push_ok(cold, ids, BATCH, g, 1000 + r);
        for (size_t i = 0; i < BATCH; i++)
            ids[i] = (int64_t)(rnd() % (IDS + 100)) - IDS / 2;
        table_pull(ram, ids, BATCH, pa);
        table_pull(cold, ids, BATCH, pb);
        assert_memory_equal(pa, pb, BATCH * dim * sizeof(float));
    }
    assert_same_rows(ram, cold);
    table_stats sa, sb;
    table_stats_get(ram, &sa);
    table_stats_get(cold, &sb);
    assert_int_equal(sa.rows, sb.rows);
    assert_int_equal(sa.rows_disk, 0);
    assert_true(sb.rows_disk > 0 && sb.rows - sb.rows_disk <= IDS / 10);
    assert_true(sb.demotions > 0 && sb.promotions > 0 && sb.cold_hits > 0);
    assert_int_equal(sb.cold_errors, 0);
    assert_true(sb.bytes < sa.bytes);
    free(g);
    free(pa);
    free(pb);
    table_destroy(ram);
    table_destroy(cold);
}

static void test_same_as_in_ram(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    const optimizer_kind kinds[] = {
        OPTIMIZER_SGD,   OPTIMIZER_MOMENTUM, OPTIMIZER_ADAGRAD,        OPTIMIZER_ADAM,
        OPTIMIZER_ADAMW, OPTIMIZER_FTRL,     OPTIMIZER_ROWWISE_ADAGRAD};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
        run_same(kinds[k], ROW_FLOAT32, 8);
    run_same(OPTIMIZER_ADAGRAD, ROW_BFLOAT16, 5);
    run_same(OPTIMIZER_SGD, ROW_FLOAT16, 3);
}

/* A cut of a cold table holds every row (both tiers) as of the cut; inserting them into a new
 * cold table (a restore) gives the same rows. */
static void test_cut_and_restore(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    table_spec s = spec_of("cold_cut", 4, OPTIMIZER_ADAM, 100);
    table *t = make(&s);
    enum { N = 1000 };
    int64_t ids[N];
    float *g = malloc(N * 4 * sizeof(float));
    for (int i = 0; i < N; i++) {
        ids[i] = i * 7919;
        for (int k = 0; k < 4; k++)
            g[i * 4 + k] = rnd_grad();
    }
    push_ok(t, ids, N, g, 10);
    push_ok(t, ids, N / 2, g, 20);
    all_rows before = rows_of(t);
    assert_int_equal(before.n, N);
    table_cut *c = table_cut_begin(t, 0, table_cut_id_new(), true);
    assert_non_null(c);
    /* Changed after the cut began: not in it. */
    push_ok(t, ids + 100, 50, g, 30);
    assert_int_equal(table_cut_finish(c), 0);
    assert_false(table_cut_is_delta(c));
    table_spec s2 = spec_of("cold_cut", 4, OPTIMIZER_ADAM, 100);
    table *r = make(&s2);
    size_t total = 0;
    for (uint32_t p = 0; p < table_partitions(t); p++) {
        const table_rows *rows = table_cut_rows(c, p);
        assert_true(rows->full);
        for (size_t i = 0; i < rows->n; i++)
            assert_int_equal(table_insert_row(r, rows->ids[i], rows->floats + i * rows->row_floats,
                                              rows->updated_ms[i]),
                             TABLE_OK);
        total += rows->n;
    }
    assert_int_equal(total, N);
    all_rows after = rows_of(r);
    assert_int_equal(after.n, before.n);
    assert_memory_equal(after.ids, before.ids, N * sizeof(int64_t));
    assert_memory_equal(after.upd, before.upd, N * sizeof(int64_t));
    assert_memory_equal(after.rows, before.rows, N * before.w * sizeof(float));
    table_stats st;
    table_stats_get(r, &st);
    assert_true(st.rows_disk >= N - 100 - 8);
    /* The next chain cut is whole too (a cold table has no deltas). */
    table_cut *c2 = table_cut_begin(t, 0, table_cut_id_new(), true);
    table_cut_free(c);
    assert_int_equal(table_cut_finish(c2), 0);
    assert_false(table_cut_is_delta(c2));
    table_cut_free(c2);
    /* Cleared (a table without time keys: no max_rows, no ttl): no row left in either tier. */
    size_t cleared = 0;
    for (uint32_t p = 0; p < table_partitions(r); p++)
        cleared += table_partition_clear(r, p);
    assert_int_equal(cleared, N);
    table_stats_get(r, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.rows_disk, 0);
    all_rows none = rows_of(r);
    assert_int_equal(none.n, 0);
    rows_free(&none);
    rows_free(&before);
    rows_free(&after);
    free(g);
    table_destroy(t);
    table_destroy(r);
}

/* A cut finished without its rows on disk (table_cut_finish_ram, as the checkpoint writer
 * takes it): each partition's cold rows read from the cut's snapshot one partition at a time
 * (table_cut_cold_rows, once), then its RAM rows, rebuild the table as it was at the cut, even
 * with pushes and promotions after it began. */
static void test_cut_streamed(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    table_spec s = spec_of("cold_stream", 4, OPTIMIZER_ADAGRAD, 100);
    table *t = make(&s);
    enum { N = 1000 };
    int64_t ids[N];
    float *g = malloc(N * 4 * sizeof(float));
    for (int i = 0; i < N; i++) {
        ids[i] = i * 7919 + 3;
        for (int k = 0; k < 4; k++)
            g[i * 4 + k] = rnd_grad();
    }
    push_ok(t, ids, N, g, 10);
    push_ok(t, ids, N / 3, g, 20);
    all_rows before = rows_of(t);
    table_cut *c = table_cut_begin(t, 0, table_cut_id_new(), true);
    assert_non_null(c);
    /* After the cut began: pushes, and a prefetch (promotions), are not in it. */
    push_ok(t, ids + 500, 100, g, 30);
    assert_true(table_prefetch(t, ids, 200) > 0);
    assert_int_equal(table_cut_finish_ram(c), 0);
    table_spec s2 = spec_of("cold_stream", 4, OPTIMIZER_ADAGRAD, 100);
    table *r = make(&s2);
    uint64_t ncold = 0, nram = 0;
    for (uint32_t p = 0; p < table_partitions(t); p++) {
        table_rows cold;
        uint64_t want = table_cut_cold_count(c, p);
        assert_int_equal(table_cut_cold_rows(c, p, &cold), 0);
        assert_int_equal(cold.n, want);
        const table_rows *ram = table_cut_rows(c, p);
        const table_rows *parts[2] = {&cold, ram};
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < parts[k]->n; i++)
                assert_int_equal(table_insert_row(r, parts[k]->ids[i],
                                                  parts[k]->floats + i * parts[k]->row_floats,
                                                  parts[k]->updated_ms[i]),
                                 TABLE_OK);
        ncold += cold.n;
        nram += ram->n;
        table_rows_free(&cold);
        /* Read once: its snapshot is released. */
        assert_int_equal(table_cut_cold_count(c, p), want);
        assert_int_equal(table_cut_cold_rows(c, p, &cold), 0);
        assert_int_equal(cold.n, 0);
    }
    fprintf(stderr, "streamed cut: %llu rows on disk, %llu in RAM\n", (unsigned long long)ncold,
            (unsigned long long)nram);
    assert_true(ncold > N / 2);
    assert_int_equal(ncold + nram, N);
    all_rows after = rows_of(r);
    assert_int_equal(after.n, before.n);
    assert_memory_equal(after.ids, before.ids, N * sizeof(int64_t));
    assert_memory_equal(after.upd, before.upd, N * sizeof(int64_t));
    assert_memory_equal(after.rows, before.rows, N * before.w * sizeof(float));
    table_cut_free(c);
    /* A cut freed before it is read releases its snapshots. */
    c = table_cut_begin(t, 0, table_cut_id_new(), true);
    assert_int_equal(table_cut_finish_ram(c), 0);
    table_cut_free(c);
    rows_free(&before);
    rows_free(&after);
    free(g);
    table_destroy(t);
    table_destroy(r);
}

/* A linked cut (table_cut_link): the store copied at the cut's moment, each partition's cold
 * count noted, its RAM rows copied; a new table that adopts the copy (table_cold_adopt) and
 * takes the RAM rows is the table as it was at the cut, even with pushes, promotions and
 * demotions after the cut began; the copy stays as it was (a second adoption gives the same). */
static void test_cut_linked(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    table_spec s = spec_of("cold_link", 4, OPTIMIZER_ADAM, 100);
    table *t = make(&s);
    enum { N = 1000 };
    int64_t ids[N];
    float *g = malloc(N * 4 * sizeof(float));
    for (int i = 0; i < N; i++) {
        ids[i] = i * 7919 + 5;
        for (int k = 0; k < 4; k++)
            g[i * 4 + k] = rnd_grad();
    }
    push_ok(t, ids, N, g, 10);
    push_ok(t, ids, N / 3, g, 20);
    all_rows before = rows_of(t);
    char copy[400];
    snprintf(copy, sizeof(copy), "%s/linked-copy", dir);
    table_cut *c = table_cut_prepare(t, 0);
    assert_non_null(c);
    table_cut_link(c, copy);
    table_cut_start(c, table_cut_id_new(), true);
    const char *why = NULL;
    assert_non_null(table_cut_linked(c, &why));
    assert_null(why);
    /* After the cut began: pushes (demotions), a prefetch (promotions) are not in it. */
    push_ok(t, ids + 500, 100, g, 30);
    assert_true(table_prefetch(t, ids, 200) > 0);
    assert_int_equal(table_cut_finish_ram(c), 0);
    uint32_t np = table_partitions(t);
    uint64_t *cold_n = calloc(np, sizeof(*cold_n));
    uint64_t ncold = 0, nram = 0;
    for (uint32_t p = 0; p < np; p++) {
        table_rows none;
        cold_n[p] = table_cut_cold_count(c, p);
        ncold += cold_n[p];
        nram += table_cut_rows(c, p)->n;
        assert_int_equal(table_cut_cold_rows(c, p, &none), 0); /* in the copy, not the cut */
        assert_int_equal(none.n, 0);
    }
    assert_true(ncold > N / 2);
    assert_int_equal(ncold + nram, N);
    for (int round = 0; round < 2; round++) {
        table_spec s2 = spec_of("cold_link", 4, OPTIMIZER_ADAM, 100);
        table *r = make(&s2);
        char err[1024];
        assert_int_equal(table_cold_adopt(r, copy, cold_n, err, sizeof(err)), 0);
        for (uint32_t p = 0; p < np; p++) {
            const table_rows *ram = table_cut_rows(c, p);
            for (size_t i = 0; i < ram->n; i++)
                assert_int_equal(table_insert_row(r, ram->ids[i], ram->floats + i * ram->row_floats,
                                                  ram->updated_ms[i]),
                                 TABLE_OK);
        }
        table_stats st;
        table_stats_get(r, &st);
        assert_int_equal(st.rows, N);
        all_rows after = rows_of(r);
        assert_int_equal(after.n, before.n);
        assert_memory_equal(after.ids, before.ids, N * sizeof(int64_t));
        assert_memory_equal(after.upd, before.upd, N * sizeof(int64_t));
        assert_memory_equal(after.rows, before.rows, N * before.w * sizeof(float));
        rows_free(&after);
        table_destroy(r);
    }
    /* A missing copy is named. */
    table_spec s3 = spec_of("cold_link", 4, OPTIMIZER_ADAM, 100);
    table *r = make(&s3);
    char err[1024], gone[450];
    snprintf(gone, sizeof(gone), "%s/no-such-copy", dir);
    assert_int_equal(table_cold_adopt(r, gone, cold_n, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "no-such-copy"));
    table_destroy(r);
    table_cut_free(c);
    assert_int_equal(cold_store_remove_dir(copy), 0);
    free(cold_n);
    rows_free(&before);
    free(g);
    table_destroy(t);
}

/* max_rows counts both tiers, the oldest cold rows go first; the TTL sweep, table_remove,
 * table_partition_clear and export reach the disk. */
static void test_limits_and_removal(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    table_spec s = spec_of("cold_lim", 2, OPTIMIZER_SGD, 16);
    s.max_rows = 200;
    s.ttl_ms = 1000;
    table *t = make(&s);
    float g[2] = {0.5f, -0.5f};
    for (int64_t id = 0; id < 400; id++)
        push_ok(t, &id, 1, g, 10 * id);
    table_stats st;
    table_stats_get(t, &st);
    assert_true(st.rows <= 200 && st.rows > 150);
    assert_true(st.rows_disk > 0);
    assert_true(st.evicted_max_rows >= 200);
    /* The oldest went: id 0 has no row, id 399 has. */
    all_rows a = rows_of(t);
    assert_true(a.n == st.rows);
    bool has0 = false, has399 = false;
    for (size_t i = 0; i < a.n; i++) {
        has0 |= a.ids[i] == 0;
        has399 |= a.ids[i] == 399;
    }
    assert_false(has0);
    assert_true(has399);
    rows_free(&a);

    /* Export: every row once. */
    uint64_t cursor = 0;
    int64_t ids[64];
    float rows[64 * 2];
    size_t exported = 0;
    while (cursor != UINT64_MAX)
        exported += table_export(t, &cursor, 64, ids, rows);
    assert_int_equal(exported, st.rows);

    /* Remove a cold row (the oldest kept one is on disk). */
    table_stats_get(t, &st);
    a = rows_of(t);
    int64_t oldest = a.ids[0];
    rows_free(&a);
    assert_int_equal(table_remove(t, &oldest, 1), 1);
    table_stats before = st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, before.rows - 1);

    /* TTL: updated at 10 * id; at 3500 rows updated before 2500 (ids < 250) expire. */
    size_t gone = table_sweep(t, 3500);
    table_stats_get(t, &st);
    assert_true(gone > 0);
    a = rows_of(t);
    for (size_t i = 0; i < a.n; i++)
        assert_true(a.ids[i] >= 250);
    assert_int_equal(a.n, st.rows);
    rows_free(&a);

    /* Clearing every partition clears the disk too. */
    for (uint32_t p = 0; p < table_partitions(t); p++)
        table_partition_clear(t, p);
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.rows_disk, 0);
    a = rows_of(t);
    assert_int_equal(a.n, 0);
    rows_free(&a);
    table_destroy(t);
}

/* table_prefetch brings cold rows to RAM (promotions counted, no lookup or cold hit), so that
 * the following pull finds them there; ids with no row make none; rows are unchanged. */
static void test_prefetch(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    table_spec s = spec_of("cold_pre", 4, OPTIMIZER_ADAGRAD, 160);
    table *t = make(&s);
    float g[4] = {0.5f, -0.5f, 0.25f, 1.0f};
    for (int64_t id = 0; id < 400; id++)
        push_ok(t, &id, 1, g, 10 * id);
    table_stats st, before;
    table_stats_get(t, &before);
    assert_true(before.rows_disk > 0);
    /* The oldest eight are on disk (each partition keeps its 20 most recent in RAM). */
    int64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    float want[8 * 4], got[8 * 4];
    assert_int_equal(table_prefetch(t, ids, 8), 8);
    table_stats_get(t, &st);
    assert_int_equal(st.promotions, before.promotions + 8);
    assert_int_equal(st.cold_hits, before.cold_hits);
    assert_int_equal(st.lookups, before.lookups);
    assert_int_equal(st.rows, before.rows);
    /* Again: they are in RAM now, nothing to bring. */
    assert_int_equal(table_prefetch(t, ids, 8), 0);
    /* The pull finds them in RAM: no cold hit. */
    before = st;
    table_pull(t, ids, 8, got);
    table_stats_get(t, &st);
    assert_int_equal(st.cold_hits, before.cold_hits);
    assert_int_equal(st.lookups, before.lookups + 8);
    assert_int_equal(st.lookup_misses, before.lookup_misses);
    /* The same rows as a table wholly in RAM given the same pushes. */
    table_spec rs = spec_of("cold_pre", 4, OPTIMIZER_ADAGRAD, 0);
    table *r = make(&rs);
    for (int64_t id = 0; id < 400; id++)
        push_ok(r, &id, 1, g, 10 * id);
    table_pull(r, ids, 8, want);
    assert_memory_equal(want, got, sizeof(got));
    assert_int_equal(table_prefetch(r, ids, 8), 0); /* a table all in RAM: nothing */
    table_destroy(r);

    /* Ids with no row make none. */
    int64_t absent[3] = {100000, 100001, -5};
    before = st;
    assert_int_equal(table_prefetch(t, absent, 3), 0);
    table_stats_get(t, &st);
    assert_int_equal(st.rows, before.rows);
    assert_int_equal(st.rows_created, before.rows_created);
    table_destroy(t);
}

/* RAM keeps the rows asked for often: rows pulled again and again come to RAM and stay there
 * while a scan of rows asked for once goes by (LRU alone would let the scan push them out);
 * the rows are those of the table wholly in RAM throughout. */
static void test_frequent_stay(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    enum { IDS = 800, HOT = 40, DIM = 4 };
    table_spec s = spec_of("cold_freq", DIM, OPTIMIZER_ADAGRAD, 80);
    table *t = make(&s);
    table_spec rs = spec_of("cold_freq", DIM, OPTIMIZER_ADAGRAD, 0);
    table *r = make(&rs);
    float g[DIM] = {0.5f, -0.5f, 0.25f, 1.0f};
    for (int64_t id = 0; id < IDS; id++) {
        push_ok(t, &id, 1, g, 10 * id);
        push_ok(r, &id, 1, g, 10 * id);
    }
    int64_t hot[HOT];
    for (int i = 0; i < HOT; i++)
        hot[i] = i; /* the oldest: on disk */
    static float got[IDS * DIM], want[IDS * DIM];
    table_stats st, before;
    table_stats_get(t, &before);
    table_pull(t, hot, HOT, got);
    table_stats_get(t, &st);
    assert_int_equal(st.cold_hits - before.cold_hits, HOT); /* all read from disk */
    for (int k = 0; k < 5; k++)
        table_pull(t, hot, HOT, got);
    /* A scan: every other row once. */
    int64_t scan[IDS - HOT];
    for (int i = 0; i < IDS - HOT; i++)
        scan[i] = HOT + i;
    table_pull(t, scan, IDS - HOT, got);
    table_stats_get(t, &before);
    table_pull(t, hot, HOT, got);
    table_stats_get(t, &st);
    assert_true(st.cold_hits - before.cold_hits <= HOT / 10);
    table_pull(r, hot, HOT, want);
    assert_memory_equal(want, got, HOT * DIM * sizeof(float));
    /* Every row as in RAM. */
    int64_t all[IDS];
    for (int64_t id = 0; id < IDS; id++)
        all[id] = id;
    table_pull(t, all, IDS, got);
    table_pull(r, all, IDS, want);
    assert_memory_equal(want, got, sizeof(got));
    table_destroy(r);
    table_destroy(t);
}

/* A cold tier whose disk fills mid-run (a small tmpfs; needs root to mount, else skipped with
 * the reason): pushes that need the disk get TABLE_DISK naming the directory, nothing
 * acknowledged is lost (every row equals the table in RAM given the acknowledged pushes), and
 * the table goes on serving: pulls of rows on disk, pushes of rows in RAM. */
static void test_disk_full(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    if (geteuid() != 0) {
        print_message("skipped: mounting a small tmpfs for the cold tier needs root\n");
        skip();
    }
    char mnt[300], cmd[400];
    snprintf(mnt, sizeof(mnt), "%s/small", dir);
    assert_int_equal(mkdir(mnt, 0700), 0);
    /* The store keeps cold_store_headroom (96 MiB) free: about 64 MiB of rows fit. */
    snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=%llum psd-cold-test %s",
             (unsigned long long)(cold_store_headroom() >> 20) + 64, mnt);
    if (system(cmd) != 0) {
        print_message("skipped: %s failed (no tmpfs mount in this container)\n", cmd);
        skip();
    }
    enum { DIM = 64, BATCH = 1000, MAX_BATCHES = 1000 };
    table_spec s = spec_of("cold_full", DIM, OPTIMIZER_ADAGRAD, 10000);
    s.cold_dir = mnt;
    table *t = make(&s);
    table_spec rs = spec_of("cold_full", DIM, OPTIMIZER_ADAGRAD, 0);
    table *r = make(&rs);
    static float g[BATCH * DIM];
    for (size_t i = 0; i < BATCH * DIM; i++)
        g[i] = rnd_grad();
    static int64_t ids[BATCH], ok_ids[BATCH], last_ids[BATCH];
    static float ok_g[BATCH * DIM];
    bool done[BATCH];
    char err[1024] = "";
    int64_t next = 0, made = 0;
    size_t last = 0; /* rows of the last batch that made any (last_ids) */
    int rc = TABLE_OK;
    for (int b = 0; b < MAX_BATCHES && rc == TABLE_OK; b++) {
        for (int i = 0; i < BATCH; i++)
            ids[i] = next++;
        rc = table_push_track(t, ids, BATCH, g, 1000 + b, done, err, sizeof(err));
        size_t k = 0;
        for (int i = 0; i < BATCH; i++)
            if (done[i]) {
                ok_ids[k] = ids[i];
                memcpy(ok_g + k * DIM, g + (size_t)i * DIM, DIM * sizeof(float));
                k++;
            }
        if (k > 0)
            push_ok(r, ok_ids, k, ok_g, 1000 + b);
        made += (int64_t)k;
        if (k > 0) {
            memcpy(last_ids, ok_ids, k * sizeof(int64_t));
            last = k;
        }
    }
    assert_int_equal(rc, TABLE_DISK);
    assert_non_null(strstr(err, mnt));
    assert_non_null(strstr(err, "short of room"));
    print_message("disk full after %lld rows: %s\n", (long long)made, err);
    table_stats st;
    table_stats_get(t, &st);
    assert_true(st.rows_disk > 0);
    assert_int_equal(st.rows, (uint64_t)made);
    /* Every row as in RAM (the rows not acknowledged have none in either table): pulled from
     * both tiers (rows on disk stay there). */
    float *got = malloc((size_t)BATCH * DIM * sizeof(float));
    float *want = malloc((size_t)BATCH * DIM * sizeof(float));
    for (int64_t from = 0; from < next; from += BATCH) {
        size_t n = (size_t)(next - from < BATCH ? next - from : BATCH);
        for (size_t i = 0; i < n; i++)
            ids[i] = from + (int64_t)i;
        table_pull(t, ids, n, got);
        table_pull(r, ids, n, want);
        assert_memory_equal(want, got, n * DIM * sizeof(float));
    }
    /* Rows in RAM still take pushes: the last batch's rows made are there. */
    assert_true(last > 0);
    push_ok(t, last_ids, last, g, 5000);
    push_ok(r, last_ids, last, g, 5000);
    table_pull(t, last_ids, last, got);
    table_pull(r, last_ids, last, want);
    assert_memory_equal(want, got, last * DIM * sizeof(float));
    /* A row on disk cannot be updated: refused, and unchanged. */
    ids[0] = 0;
    rc = table_push(t, ids, 1, g, 5001, err, sizeof(err));
    assert_int_equal(rc, TABLE_DISK);
    table_pull(t, ids, 1, got);
    table_pull(r, ids, 1, want);
    assert_memory_equal(want, got, DIM * sizeof(float));
    free(got);
    free(want);
    table_destroy(t);
    table_destroy(r);
    snprintf(cmd, sizeof(cmd), "umount %s", mnt);
    assert_int_equal(system(cmd), 0);
}

/* A budget of cap bytes. */
typedef struct cap_budget {
    uint64_t used, cap;
} cap_budget;

static bool cap_take(void *arg, uint64_t bytes)
{
    cap_budget *b = arg;
    if (b->used + bytes > b->cap)
        return false;
    b->used += bytes;
    return true;
}

static void cap_give(void *arg, uint64_t bytes)
{
    cap_budget *b = arg;
    b->used -= bytes;
}

/* Rows the budget refuses memory for go to disk instead of away: a cold table under a small
 * budget (and a ram_rows that never binds) ends equal to a table in RAM without one. */
static void test_budget_demotes(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    enum { IDS = 2000, BATCH = 200 };
    table_spec s = spec_of("cold_budget", 8, OPTIMIZER_ADAM, 0);
    table *ram = make(&s);
    cap_budget b = {0, UINT64_MAX};
    s.ram_rows = 1000000;
    s.cold_dir = dir;
    s.budget = (table_budget){.take = cap_take, .give = cap_give, .arg = &b};
    table *cold = make(&s);
    b.cap = b.used + 16 * 14 * 1024 + 8 * 1024; /* two slabs a partition, and a little */
    int64_t ids[BATCH];
    float g[BATCH * 8];
    for (int r = 0; r < 50; r++) {
        for (int i = 0; i < BATCH; i++) {
            ids[i] = (int64_t)(rnd() % IDS);
            for (int k = 0; k < 8; k++)
                g[i * 8 + k] = rnd_grad();
        }
        push_ok(ram, ids, BATCH, g, r);
        push_ok(cold, ids, BATCH, g, r);
    }
    assert_same_rows(ram, cold);
    table_stats st;
    table_stats_get(cold, &st);
    assert_true(st.rows_disk > 0 && st.demotions > 0);
    assert_int_equal(st.evicted_memory, 0);
    assert_int_equal(st.rows_refused, 0);
    assert_true(b.used <= b.cap);
    table_destroy(ram);
    table_destroy(cold);
    assert_int_equal(b.used, 0);
}

/* Threads pushing disjoint ids, pulling and cutting at once: every row ends as the same pushes
 * applied to a table in RAM, and every cut holds each row once. */
typedef struct conc_arg {
    table *t;
    int id, rounds;
    _Atomic int *stop;
} conc_arg;

enum { CONC_THREADS = 3, CONC_IDS = 3000, CONC_BATCH = 100, CONC_DIM = 4 };

/* Thread k's batch of round r: ids = k mod CONC_THREADS, gradients from (k, r, i). */
static void conc_batch(int k, int r, int64_t *ids, float *g)
{
    for (int i = 0; i < CONC_BATCH; i++) {
        uint64_t h = (uint64_t)(k * 1000003 + r * 7919 + i) * 0x9E3779B97F4A7C15u;
        h ^= h >> 29;
        ids[i] = (int64_t)((h % (CONC_IDS / CONC_THREADS)) * CONC_THREADS + (uint64_t)k);
        for (int d = 0; d < CONC_DIM; d++)
            g[i * CONC_DIM + d] = (float)((h >> (8 * d)) % 200) / 400.0f - 0.25f;
    }
}

static void *conc_pusher(void *p)
{
    conc_arg *a = p;
    int64_t ids[CONC_BATCH];
    float g[CONC_BATCH * CONC_DIM];
    char err[256];
    for (int r = 0; r < a->rounds; r++) {
        conc_batch(a->id, r, ids, g);
        if (table_push(a->t, ids, CONC_BATCH, g, r, err, sizeof(err)) != TABLE_OK)
            return (void *)1;
    }
    return NULL;
}

static void *conc_puller(void *p)
{
    conc_arg *a = p;
    int64_t ids[64];
    float out[64 * CONC_DIM];
    uint64_t x = 99;
    while (!atomic_load(a->stop)) {
        for (int i = 0; i < 64; i++) {
            x = x * 6364136223846793005u + 1442695040888963407u;
            ids[i] = (int64_t)((x >> 33) % CONC_IDS);
        }
        table_pull(a->t, ids, 64, out);
    }
    return NULL;
}

static void *conc_cutter(void *p)
{
    conc_arg *a = p;
    for (unsigned n = 0; !atomic_load(a->stop); n++) {
        /* Every other cut linked: every partition held while the store is copied. */
        char copy[400];
        snprintf(copy, sizeof(copy), "%s/conc-link-%u", dir, n);
        table_cut *c = table_cut_prepare(a->t, 0);
        if (c == NULL)
            return (void *)1;
        if (n % 2)
            table_cut_link(c, copy);
        table_cut_start(c, 0, false);
        bool linked = table_cut_linked(c, NULL) != NULL;
        if ((n % 2 != 0) != linked || (linked ? table_cut_finish_ram(c) : table_cut_finish(c)) != 0)
            return (void *)1;
        size_t total = 0;
        for (uint32_t q = 0; q < table_partitions(a->t); q++)
            total += table_cut_rows(c, q)->n + table_cut_cold_count(c, q);
        table_cut_free(c);
        if (linked && cold_store_remove_dir(copy) != 0)
            return (void *)1;
        if (total > CONC_IDS)
            return (void *)1;
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    enum { ROUNDS = 60 };
    table_spec s = spec_of("cold_conc", CONC_DIM, OPTIMIZER_ADAGRAD, 0);
    table *ram = make(&s);
    s.ram_rows = CONC_IDS / 10;
    s.cold_dir = dir;
    table *cold = make(&s);
    _Atomic int stop = 0;
    pthread_t th[CONC_THREADS + 2];
    conc_arg args[CONC_THREADS + 2];
    for (int k = 0; k < CONC_THREADS + 2; k++) {
        args[k] = (conc_arg){cold, k, ROUNDS, &stop};
        void *(*fn)(void *) = k < CONC_THREADS    ? conc_pusher
                              : k == CONC_THREADS ? conc_puller
                                                  : conc_cutter;
        assert_int_equal(pthread_create(&th[k], NULL, fn, &args[k]), 0);
    }
    void *ret;
    for (int k = 0; k < CONC_THREADS; k++) {
        assert_int_equal(pthread_join(th[k], &ret), 0);
        assert_null(ret);
    }
    atomic_store(&stop, 1);
    for (int k = CONC_THREADS; k < CONC_THREADS + 2; k++) {
        assert_int_equal(pthread_join(th[k], &ret), 0);
        assert_null(ret);
    }
    /* The same pushes, one thread after the other (each row sees its own thread's only). */
    int64_t ids[CONC_BATCH];
    float g[CONC_BATCH * CONC_DIM];
    for (int k = 0; k < CONC_THREADS; k++)
        for (int r = 0; r < ROUNDS; r++) {
            conc_batch(k, r, ids, g);
            push_ok(ram, ids, CONC_BATCH, g, r);
        }
    /* Update times differ (the rounds interleave differently): compare the floats only. */
    all_rows x = rows_of(ram), y = rows_of(cold);
    assert_int_equal(x.n, y.n);
    assert_memory_equal(x.ids, y.ids, x.n * sizeof(int64_t));
    assert_memory_equal(x.rows, y.rows, x.n * x.w * sizeof(float));
    rows_free(&x);
    rows_free(&y);
    table_destroy(ram);
    table_destroy(cold);
}

static void expect_refused(const table_spec *s, const char *what)
{
    char err[512] = "";
    table *t = NULL;
    assert_int_equal(table_create(s, &t, err, sizeof(err)), TABLE_INVALID);
    assert_null(t);
    if (strstr(err, what) == NULL) {
        print_error("message \"%s\" does not name \"%s\"\n", err, what);
        fail();
    }
}

static void test_spec_errors(void **state)
{
    (void)state;
    table_spec s = spec_of("cold_bad", 2, OPTIMIZER_SGD, 10);
    if (!cold_store_available()) {
        expect_refused(&s, "without RocksDB");
        return;
    }
    s.cold_dir = NULL;
    expect_refused(&s, "cold-dir");
    s.cold_dir = "/nonexistent-psd-cold/a";
    expect_refused(&s, "cold tier");
    s = spec_of("cold_bad", 2, OPTIMIZER_SGD, 10);
    s.never_evict = true;
    expect_refused(&s, "never_evict with ram_rows");
}

int main(void)
{
    if (!cold_store_available())
        fprintf(stderr, "table-cold: built without RocksDB: the cold tier's tests are skipped\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_as_in_ram),     cmocka_unit_test(test_cut_and_restore),
        cmocka_unit_test(test_limits_and_removal), cmocka_unit_test(test_budget_demotes),
        cmocka_unit_test(test_concurrent),         cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_prefetch),           cmocka_unit_test(test_cut_streamed),
        cmocka_unit_test(test_cut_linked),         cmocka_unit_test(test_frequent_stay),
        cmocka_unit_test(test_disk_full),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
