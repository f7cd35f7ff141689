/* Cold tier benchmark (not a test): what a table larger than memory (table.h, ram_rows) costs
 * against the same table in RAM, in-process on one thread, in one run:
 *
 *   ram pull        a table wholly in RAM: pulls of BATCH ids drawn uniformly over ROWS rows
 *   store put       the cold store alone (server/cold_store.c, RocksDB): write batches of BATCH
 *                   rows (values of the table's row size: update time, parameters, slots)
 *   store multiget  the store alone: batched reads of BATCH random rows of the ROWS written
 *   cold pull       a table with ram_rows = PCT% of ROWS: uniform pulls (most ids on disk: each
 *                   is read, promoted, and pushes another row to disk)
 *   cold push       the same with pushes
 *   cold pull again the pulls once more, after the pushes (the store's background work after
 *                   the fill, flushes and compactions, is then further along)
 *   hot pull        pulls of ids drawn from a hot set of half the RAM share (spread over the
 *                   table, on disk at first), read-only: on the table above, whose pulls
 *                   promote what RAM admits, and on a replicated one (a logical budget, as a
 *                   replica group's copy has), whose pulls promote nothing; with the share of
 *                   the phase's lookups found in RAM
 *
 * Rows per second each, and each against the in-RAM pull. The store's directory is DIR
 * (default /tmp), removed after.
 * usage: ps-cold-bench [--rows N] [--dim D] [--batch B] [--batches K] [--pct P]
 *                      [--optimizer adagrad] [--dir DIR] [--quick]
 * --quick: 20,000 rows, 20 batches: a smoke run (exit 77 without RocksDB). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cold_store.h"
#include "hash.h"
#include "table.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct cfg {
    uint64_t rows;
    uint32_t dim, batch, batches, pct;
    optimizer_kind opt;
    const char *dir;
} cfg;

static table *make_table(const cfg *c, const char *name, uint64_t ram_rows, bool replicated)
{
    table_spec s;
    memset(&s, 0, sizeof(s));
    s.budget.logical = replicated; /* rows counted, no limit: what reads may do is the point */
    s.name = name;
    s.dim = c->dim;
    optimizer_params_default(&s.opt, c->opt);
    s.init.kind = INITIALIZER_UNIFORM;
    s.init.a = -0.1;
    s.init.b = 0.1;
    s.expected_rows = ram_rows ? ram_rows : c->rows;
    s.ram_rows = ram_rows;
    s.cold_dir = c->dir;
    table *t;
    char err[512];
    if (table_create(&s, &t, err, sizeof(err)) != TABLE_OK) {
        fprintf(stderr, "table_create: %s\n", err);
        exit(1);
    }
    return t;
}

/* Makes every row (pushes of sequential ids). */
static void fill(const cfg *c, table *t, float *g)
{
    int64_t *ids = malloc(c->batch * sizeof(*ids));
    char err[512];
    for (uint64_t base = 0; base < c->rows; base += c->batch) {
        uint32_t n = (uint32_t)(c->rows - base < c->batch ? c->rows - base : c->batch);
        for (uint32_t i = 0; i < n; i++)
            ids[i] = (int64_t)(base + i);
        if (table_push(t, ids, n, g, 1, err, sizeof(err)) != TABLE_OK) {
            fprintf(stderr, "push: %s\n", err);
            exit(1);
        }
    }
    free(ids);
}

static void random_ids(const cfg *c, int64_t *ids, uint64_t *seed)
{
    for (uint32_t i = 0; i < c->batch; i++)
        ids[i] = (int64_t)(mix64((*seed)++) % c->rows);
}

/* Rows per second of BATCHES pulls (push: pushes) of random ids (from seed). */
static double run_table(const cfg *c, table *t, bool push, uint64_t seed, float *g, float *out)
{
    int64_t *ids = malloc(c->batch * sizeof(*ids));
    char err[512];
    double t0 = now_s();
    for (uint32_t b = 0; b < c->batches; b++) {
        random_ids(c, ids, &seed);
        if (!push)
            table_pull(t, ids, c->batch, out);
        else if (table_push(t, ids, c->batch, g, 2, err, sizeof(err)) != TABLE_OK) {
            fprintf(stderr, "push: %s\n", err);
            exit(1);
        }
    }
    double dt = now_s() - t0;
    free(ids);
    return (double)c->batches * c->batch / dt;
}

/* Rows per second of BATCHES pulls of ids drawn from a hot set of `hot` ids spread over the
 * table; *ram_hit: the share of the phase's lookups found in RAM (1 - cold hits / lookups). */
static double run_hot(const cfg *c, table *t, uint64_t hot, float *out, double *ram_hit)
{
    int64_t *ids = malloc(c->batch * sizeof(*ids));
    table_stats a, b;
    table_stats_get(t, &a);
    uint64_t seed = 4242;
    double t0 = now_s();
    for (uint32_t k = 0; k < c->batches; k++) {
        for (uint32_t i = 0; i < c->batch; i++)
            ids[i] = (int64_t)(mix64(mix64(seed++) % hot + 77) % c->rows);
        table_pull(t, ids, c->batch, out);
    }
    double dt = now_s() - t0;
    table_stats_get(t, &b);
    *ram_hit = 1.0 - (double)(b.cold_hits - a.cold_hits) / (double)(b.lookups - a.lookups);
    free(ids);
    return (double)c->batches * c->batch / dt;
}

static void key_of(unsigned char *k, uint64_t id)
{
    k[0] = 'r';
    k[1] = (unsigned char)(id & 63);
    for (int i = 0; i < 8; i++)
        k[2 + i] = (unsigned char)(id >> (56 - 8 * i));
}

/* The store alone: rows/s of puts (all ROWS rows) and of multigets (BATCHES random batches). */
static void run_store(const cfg *c, size_t vlen, double *put, double *get)
{
    char path[4096], err[1024];
    cold_store_dir_name(path, sizeof(path), c->dir, "cold-bench");
    cold_store *s = cold_store_open(path, err, sizeof(err));
    if (s == NULL) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    unsigned char *val = calloc(1, vlen), *keys = malloc((size_t)c->batch * 10);
    unsigned char *vals = malloc((size_t)c->batch * vlen);
    bool *found = malloc(c->batch * sizeof(*found));
    cold_batch *b = cold_batch_new();
    double t0 = now_s();
    for (uint64_t id = 0; id < c->rows; id++) {
        unsigned char k[10];
        key_of(k, id);
        memcpy(val, &id, sizeof(id));
        cold_batch_put(b, k, sizeof(k), val, vlen);
        if (cold_batch_count(b) == c->batch || id + 1 == c->rows)
            if (cold_store_write(s, b, err, sizeof(err)) != 0) {
                fprintf(stderr, "%s\n", err);
                exit(1);
            }
    }
    *put = (double)c->rows / (now_s() - t0);
    uint64_t seed = 4242, hits = 0;
    t0 = now_s();
    for (uint32_t r = 0; r < c->batches; r++) {
        for (uint32_t i = 0; i < c->batch; i++)
            key_of(keys + (size_t)i * 10, mix64(seed++) % c->rows);
        if (cold_store_multiget(s, c->batch, keys, 10, vals, vlen, found, err, sizeof(err)) != 0) {
            fprintf(stderr, "%s\n", err);
            exit(1);
        }
        for (uint32_t i = 0; i < c->batch; i++)
            hits += found[i];
    }
    *get = (double)c->batches * c->batch / (now_s() - t0);
    if (hits != (uint64_t)c->batches * c->batch) {
        fprintf(stderr, "store: %llu of %llu rows found\n", (unsigned long long)hits,
                (unsigned long long)c->batches * c->batch);
        exit(1);
    }
    cold_batch_free(b);
    cold_store_close(s, true);
    free(val);
    free(keys);
    free(vals);
    free(found);
}

int main(int argc, char **argv)
{
    cfg c = {.rows = 2000000,
             .dim = 16,
             .batch = 512,
             .batches = 400,
             .pct = 10,
             .opt = OPTIMIZER_ADAGRAD,
             .dir = "/tmp"};
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            quick = true;
            c.rows = 20000;
            c.batches = 20;
        } else if (v && strcmp(a, "--rows") == 0) {
            c.rows = strtoull(v, NULL, 10), i++;
        } else if (v && strcmp(a, "--dim") == 0) {
            c.dim = (uint32_t)atoi(v), i++;
        } else if (v && strcmp(a, "--batch") == 0) {
            c.batch = (uint32_t)atoi(v), i++;
        } else if (v && strcmp(a, "--batches") == 0) {
            c.batches = (uint32_t)atoi(v), i++;
        } else if (v && strcmp(a, "--pct") == 0) {
            c.pct = (uint32_t)atoi(v), i++;
        } else if (v && strcmp(a, "--dir") == 0) {
            c.dir = v, i++;
        } else if (v && strcmp(a, "--optimizer") == 0) {
            c.opt = strcmp(v, "sgd") == 0    ? OPTIMIZER_SGD
                    : strcmp(v, "adam") == 0 ? OPTIMIZER_ADAM
                                             : OPTIMIZER_ADAGRAD;
            i++;
        } else {
            fprintf(stderr,
                    "usage: ps-cold-bench [--rows N] [--dim D] [--batch B] [--batches K] [--pct P] "
                    "[--optimizer sgd|adagrad|adam] [--dir DIR] [--quick]\n");
            return 2;
        }
    }
    if (!cold_store_available()) {
        fprintf(stderr, "ps-cold-bench: built without RocksDB: nothing to measure\n");
        return 77;
    }
    float *g = malloc((size_t)c.batch * c.dim * sizeof(float));
    float *out = malloc((size_t)c.batch * c.dim * sizeof(float));
    for (size_t i = 0; i < (size_t)c.batch * c.dim; i++)
        g[i] = 0.001f * (float)(i % 7);

    table *ram = make_table(&c, "bench/ram", 0, false);
    fill(&c, ram, g);
    table_stats st;
    table_stats_get(ram, &st);
    size_t vlen = 8 + st.row_bytes - 24; /* the cold tier's value: update time, row body */
    double ram_pull = run_table(&c, ram, false, 12345, g, out);
    table_destroy(ram);

    double put, get;
    run_store(&c, vlen, &put, &get);

    const uint64_t ram_rows = c.rows * c.pct / 100, hot = ram_rows / 2 ? ram_rows / 2 : 1;
    table *cold = make_table(&c, "bench/cold", ram_rows, false);
    double t0 = now_s();
    fill(&c, cold, g);
    double fill_s = now_s() - t0;
    double cold_pull = run_table(&c, cold, false, 12345, g, out);
    double cold_push = run_table(&c, cold, true, 777, g, out);
    double cold_pull2 = run_table(&c, cold, false, 999331, g, out); /* other ids */
    table_stats_get(cold, &st);
    double hit, hit_rep;
    double hot_pull = run_hot(&c, cold, hot, out, &hit);
    table_destroy(cold);
    table *rep = make_table(&c, "bench/cold-replicated", ram_rows, true);
    fill(&c, rep, g);
    double hot_rep = run_hot(&c, rep, hot, out, &hit_rep);
    table_destroy(rep);

    printf("ps-cold-bench: %llu rows, dim %u, %s, batch %u x %u, ram_rows %u%%, value %zu "
           "bytes\n",
           (unsigned long long)c.rows, c.dim, optimizer_name(c.opt), c.batch, c.batches, c.pct,
           vlen);
    printf("| what | rows/s | against RAM pull |\n|---|---:|---:|\n");
    printf("| ram pull | %.0f | 1 |\n", ram_pull);
    printf("| store put (batches of %u) | %.0f | %.3f |\n", c.batch, put, put / ram_pull);
    printf("| store multiget (batches of %u) | %.0f | %.3f |\n", c.batch, get, get / ram_pull);
    printf("| cold table fill (first touch) | %.0f | %.3f |\n", (double)c.rows / fill_s,
           (double)c.rows / fill_s / ram_pull);
    printf("| cold pull (uniform) | %.0f | %.3f |\n", cold_pull, cold_pull / ram_pull);
    printf("| cold push (uniform) | %.0f | %.3f |\n", cold_push, cold_push / ram_pull);
    printf("| cold pull again, after the pushes | %.0f | %.3f |\n", cold_pull2,
           cold_pull2 / ram_pull);
    printf("| hot pull (hot set %llu ids), pulls promote; RAM hit %.3f | %.0f | %.3f |\n",
           (unsigned long long)hot, hit, hot_pull, hot_pull / ram_pull);
    printf("| hot pull, replicated (pulls promote nothing); RAM hit %.3f | %.0f | %.3f |\n",
           hit_rep, hot_rep, hot_rep / ram_pull);
    printf("cold table: %llu rows, %llu on disk, %llu cold hits, %llu promotions, %llu "
           "demotions, %llu bytes in RAM, ~%llu on disk\n",
           (unsigned long long)st.rows, (unsigned long long)st.rows_disk,
           (unsigned long long)st.cold_hits, (unsigned long long)st.promotions,
           (unsigned long long)st.demotions, (unsigned long long)st.bytes,
           (unsigned long long)st.bytes_disk);
    free(g);
    free(out);
    if (quick && (st.rows != c.rows || st.rows_disk == 0 || st.cold_errors != 0)) {
        fprintf(stderr, "ps-cold-bench: unexpected counts\n");
        return 1;
    }
    return 0;
}
