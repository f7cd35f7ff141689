/* Sparse table benchmark (not a test): the server's table (server/table.c) driven in-process on
 * one thread, the local limit that the wire will be compared against.
 *
 * For each dim: make ROWS rows by first touch (pushes of BATCH sequential ids: rows/s, the
 * longest partition index growth, memory per row against the raw bytes of ids + rows + slots,
 * and the process's resident memory), then push and pull batches of BATCH ids drawn Zipf(S)
 * over the ROWS ids (ranks scrambled into ids), counting ids per second (a batch's duplicates
 * included, as a client sends them).
 *
 * Last, THREADS threads (default 2) push Zipf batches into the same table at once: the total
 * ids per second shows how far pushes to different partitions apply in parallel.
 *
 * usage: ps-table-bench [--rows N] [--dims 16,64] [--batch B] [--batches K] [--zipf S]
 *                       [--optimizer adagrad] [--threads T] [--quick]
 * --quick: 20,000 rows, dim 4 and 16, 20 batches of 512: a smoke run that checks itself. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "table.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Resident set size of this process, bytes (0 when /proc is not there). */
static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (f == NULL)
        return 0;
    if (fscanf(f, "%llu %llu", &size, &res) != 2)
        res = 0;
    fclose(f);
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* The id of rank r (0 = most frequent): ranks scrambled so that hot ids are spread. */
static int64_t rank_id(uint64_t r)
{
    return (int64_t)mix64(r + 1);
}

/* Zipf(s) over ranks 0..n-1 by inversion of its CDF (n doubles). */
typedef struct zipf {
    double *cdf;
    uint64_t n;
    uint64_t state;
} zipf;

static int zipf_init(zipf *z, uint64_t n, double s, uint64_t seed)
{
    z->cdf = malloc(n * sizeof(double));
    if (z->cdf == NULL)
        return -1;
    double acc = 0;
    for (uint64_t r = 0; r < n; r++) {
        acc += pow((double)(r + 1), -s);
        z->cdf[r] = acc;
    }
    for (uint64_t r = 0; r < n; r++)
        z->cdf[r] /= acc;
    z->n = n;
    z->state = seed;
    return 0;
}

static uint64_t zipf_draw(zipf *z)
{
    z->state += UINT64_C(0x9E3779B97F4A7C15);
    double u = (double)(mix64(z->state) >> 11) * 0x1.0p-53;
    uint64_t lo = 0, hi = z->n - 1;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (z->cdf[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* One of the threads of the parallel push phase: its own draws from the shared CDF. */
typedef struct pusher {
    table *t;
    const zipf *shared;
    uint64_t seed;
    uint32_t batch, batches, dim;
    int failed;
} pusher;

static void *pusher_run(void *arg)
{
    pusher *a = arg;
    zipf z = *a->shared;
    z.state = a->seed;
    int64_t *ids = malloc(a->batch * sizeof(*ids));
    float *g = malloc((size_t)a->batch * a->dim * sizeof(float));
    if (ids == NULL || g == NULL) {
        a->failed = 1;
    } else {
        for (size_t i = 0; i < (size_t)a->batch * a->dim; i++)
            g[i] = 0.001f;
        char err[256];
        for (uint32_t k = 0; k < a->batches && !a->failed; k++) {
            for (uint32_t i = 0; i < a->batch; i++)
                ids[i] = rank_id(zipf_draw(&z));
            if (table_push(a->t, ids, a->batch, g, 1000 + k, err, sizeof(err)) != TABLE_OK) {
                fprintf(stderr, "table_push: %s\n", err);
                a->failed = 1;
            }
        }
    }
    free(ids);
    free(g);
    return NULL;
}

/* Ids per second pushed by `threads` threads at once, each `batches` batches. */
static double parallel_push(table *t, const zipf *zf, uint32_t threads, uint32_t batch,
                            uint32_t batches, uint32_t dim)
{
    pthread_t th[16];
    pusher args[16];
    double a = now_s();
    for (uint32_t i = 0; i < threads; i++) {
        args[i] = (pusher){t, zf, 1000 + i, batch, batches, dim, 0};
        if (pthread_create(&th[i], NULL, pusher_run, &args[i]) != 0)
            return -1;
    }
    int failed = 0;
    for (uint32_t i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        failed |= args[i].failed;
    }
    double dt = now_s() - a;
    return failed ? -1 : (double)threads * batch * batches / dt;
}

typedef struct config {
    uint64_t rows;
    uint32_t dims[8];
    int ndims;
    uint32_t batch, batches;
    double zipf_s;
    optimizer_kind opt;
    uint32_t threads;
    int quick;
} config;

static int run_dim(const config *c, uint32_t dim, zipf *zf)
{
    table_spec s;
    memset(&s, 0, sizeof(s));
    s.name = "bench/emb";
    s.dim = dim;
    optimizer_params_default(&s.opt, c->opt);
    s.init.kind = INITIALIZER_UNIFORM;
    s.init.a = -0.05;
    s.init.b = 0.05;
    s.init.seed = 1;
    char err[256];
    uint64_t rss0 = rss_bytes();
    table *t;
    if (table_create(&s, &t, err, sizeof(err)) != TABLE_OK) {
        fprintf(stderr, "table_create: %s\n", err);
        return -1;
    }
    const size_t b = c->batch;
    int64_t *ids = malloc(b * sizeof(*ids));
    float *g = malloc(b * dim * sizeof(float));
    float *out = malloc(b * dim * sizeof(float));
    if (ids == NULL || g == NULL || out == NULL)
        return -1;
    for (size_t i = 0; i < b * dim; i++)
        g[i] = 0.001f * (float)((i % 7) + 1);

    /* First touch of every row. */
    double t0 = now_s();
    for (uint64_t r = 0; r < c->rows; r += b) {
        size_t n = c->rows - r < b ? (size_t)(c->rows - r) : b;
        for (size_t i = 0; i < n; i++)
            ids[i] = rank_id(r + i);
        if (table_push(t, ids, n, g, 1, err, sizeof(err)) != 0) {
            fprintf(stderr, "table_push: %s\n", err);
            return -1;
        }
    }
    double fill_s = now_s() - t0;
    table_stats st;
    table_stats_get(t, &st);
    uint64_t rss = rss_bytes() - rss0;
    double raw = (double)st.rows * (8.0 + 4.0 * table_row_floats(t));
    if (st.rows != c->rows) {
        fprintf(stderr, "rows: %llu, want %llu\n", (unsigned long long)st.rows,
                (unsigned long long)c->rows);
        return -1;
    }

    /* Zipf pushes, then pulls. */
    double push_s = 0, pull_s = 0;
    uint64_t distinct_before = st.rows;
    for (uint32_t k = 0; k < c->batches; k++) {
        for (size_t i = 0; i < b; i++)
            ids[i] = rank_id(zipf_draw(zf));
        double a = now_s();
        if (table_push(t, ids, b, g, 2 + k, err, sizeof(err)) != 0) {
            fprintf(stderr, "table_push: %s\n", err);
            return -1;
        }
        push_s += now_s() - a;
    }
    for (uint32_t k = 0; k < c->batches; k++) {
        for (size_t i = 0; i < b; i++)
            ids[i] = rank_id(zipf_draw(zf));
        double a = now_s();
        table_pull(t, ids, b, out);
        pull_s += now_s() - a;
        for (size_t i = 0; i < b * dim; i++) {
            if (!isfinite(out[i]) || fabsf(out[i]) > 10.0f) {
                fprintf(stderr, "pull: value %g out of range\n", (double)out[i]);
                return -1;
            }
        }
    }
    table_stats_get(t, &st);
    if (st.rows != distinct_before || st.lookup_misses != 0) {
        fprintf(stderr, "rows changed or pulls missed\n");
        return -1;
    }
    double par = parallel_push(t, zf, c->threads, c->batch, c->batches, dim);
    if (par < 0)
        return -1;
    double ids_total = (double)b * c->batches;
    printf("| %u | %s | %llu | %.2f | %.0f | %.0f | %.0f | %.0f | %.3f | %.1f | %.1f | %.2f | "
           "%.2f |\n",
           dim, optimizer_name(c->opt), (unsigned long long)c->rows, fill_s,
           (double)c->rows / fill_s, ids_total / push_s, ids_total / pull_s, par,
           (double)st.longest_growth_ns / 1e6, (double)st.bytes / (double)st.rows,
           raw / (double)st.rows, (double)st.bytes / raw, (double)rss / raw);
    fflush(stdout);
    free(ids);
    free(g);
    free(out);
    table_destroy(t);
    return 0;
}

int main(int argc, char **argv)
{
    config c = {.rows = 10000000,
                .dims = {16, 64},
                .ndims = 2,
                .batch = 8192,
                .batches = 200,
                .zipf_s = 1.1,
                .opt = OPTIMIZER_ADAGRAD,
                .threads = 2};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            c.rows = 20000;
            c.dims[0] = 4;
            c.dims[1] = 16;
            c.ndims = 2;
            c.batch = 512;
            c.batches = 20;
            c.quick = 1;
        } else if (strcmp(a, "--threads") == 0 && v) {
            c.threads = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--rows") == 0 && v) {
            c.rows = strtoull(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--batch") == 0 && v) {
            c.batch = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--batches") == 0 && v) {
            c.batches = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--zipf") == 0 && v) {
            c.zipf_s = strtod(v, NULL);
            i++;
        } else if (strcmp(a, "--optimizer") == 0 && v) {
            if (optimizer_parse(v, &c.opt) != 0) {
                fprintf(stderr, "--optimizer %s: unknown optimizer\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--dims") == 0 && v) {
            c.ndims = 0;
            for (char *p = (char *)v; *p && c.ndims < 8;) {
                char *end;
                c.dims[c.ndims++] = (uint32_t)strtoul(p, &end, 10);
                p = *end == ',' ? end + 1 : end;
                if (end == p && *p)
                    break;
            }
            i++;
        } else {
            fprintf(stderr,
                    "usage: %s [--rows N] [--dims 16,64] [--batch B] [--batches K] [--zipf S] "
                    "[--optimizer NAME] [--threads T] [--quick]\n",
                    argv[0]);
            return 2;
        }
    }
    if (c.rows == 0 || c.batch == 0 || c.batches == 0 || c.ndims == 0 || !(c.zipf_s > 0) ||
        c.threads == 0 || c.threads > 16) {
        fprintf(stderr, "%s: rows, batch, batches, dims and zipf must be > 0, threads 1..16\n",
                argv[0]);
        return 2;
    }
    zipf zf;
    if (zipf_init(&zf, c.rows, c.zipf_s, 7) != 0) {
        fprintf(stderr, "out of memory for the Zipf table\n");
        return 1;
    }
    printf("# ps-table-bench: %llu rows, %u ids per batch, %u batches, Zipf(%g), one thread, then "
           "%u threads pushing at once\n",
           (unsigned long long)c.rows, c.batch, c.batches, c.zipf_s, c.threads);
    printf(
        "| dim | optimizer | rows | fill s | rows made/s | push ids/s | pull ids/s | push ids/s, "
        "%u threads | longest growth ms | bytes/row | raw bytes/row | table/raw | RSS/raw |\n",
        c.threads);
    printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0;
    for (int d = 0; d < c.ndims && rc == 0; d++) {
        if (c.dims[d] == 0 || c.dims[d] > TABLE_MAX_DIM) {
            fprintf(stderr, "dim %u: must be in 1..%d\n", c.dims[d], TABLE_MAX_DIM);
            rc = 2;
            break;
        }
        rc = run_dim(&c, c.dims[d], &zf) == 0 ? 0 : 1;
    }
    free(zf.cdf);
    return rc;
}
