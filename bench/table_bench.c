/* Sparse table benchmark (not a test): the server's table (server/table.c) driven in-process on
 * one thread, the local limit that the wire will be compared against.
 *
 * For each dim: make ROWS rows by first touch (pushes of BATCH sequential ids: rows/s, the
 * longest partition index growth, memory per row against the raw bytes of ids + rows + slots,
 * and the process's resident memory), then push and pull batches of BATCH ids drawn Zipf(S)
 * over the ROWS ids (ranks scrambled into ids), counting ids per second (a batch's duplicates
 * included, as a client sends them).
 *
 * Last, THREADS threads (default 2) push Zipf batches into the same table at once, each only
 * ids of its own partitions (partition % THREADS == thread): the total ids per second shows how
 * far pushes to different partitions apply in parallel.
 *
 * With --wire PS_SERVER, the same is then done over the wire for each dim: SERVERS ps-server
 * processes (started here on loopback, stopped after the dim) hold the table, and one client
 * makes the rows by first touch and pushes and pulls the same Zipf batches with ps_table_push_async
 * and ps_table_pull_async, INFLIGHT calls in flight; then two clients (two threads) push at
 * once. A second table compares those ids/s with the in-process ones of the same run.
 *
 * usage: ps-table-bench [--rows N] [--dims 16,64] [--batch B] [--batches K] [--zipf S]
 *                       [--optimizer adagrad] [--dtype float32] [--threads T] [--quick]
 *                       [--wire PS_SERVER [--servers N] [--inflight K]
 *                        [--replicas R --coordinator ETCD_URL]] [--fill-only]
 * --replicas R (with --coordinator, an etcd's client URL): the servers keep R copies of every
 *   group (the same run with R 1 and 2 compares replicated table pulls and pushes with plain
 *   ones: bench/table_replication_bench.sh).
 * --quick: 20,000 rows, dim 4 and 16, 20 batches of 512: a smoke run that checks itself.
 * --fill-only: only make the rows and report memory (no Zipf phases: no CDF of --rows doubles),
 * for the largest tables; with --wire, in the ps-server processes only (their resident sizes).
 * --dtype float32|bfloat16|float16: how the table stores its parameters (table_spec.dtype); the
 *   raw bytes stay those of float32 rows (the id, then 4 bytes per float of table_row_floats),
 *   so a 16-bit table's ratios show what it saves.
 * --partitions P (in process): the table's partitions (default 64). Every partition holds its
 *   own index and slabs, so --rows N/K --partitions 64/K has the per-partition state (index
 *   load, slabs, arrays left to the allocator by index growths) of N rows in 64 partitions:
 *   the same bytes per row, at 1/K of the memory (bench/RESULTS.md, lean rows). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "hash.h"
#include "psclient.h"
#include "table.h"
#include "zipf.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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

/* One of the threads of the parallel push phase: its own draws from the shared CDF, made
 * before the timed part starts (the barrier). */
typedef struct pusher {
    table *t;
    const zipf *shared;
    uint64_t seed;
    uint32_t batch, batches, dim;
    uint32_t part, parts; /* pushes only ids whose partition % parts == part */
    pthread_barrier_t *go;
    int failed;
} pusher;

static void *pusher_run(void *arg)
{
    pusher *a = arg;
    zipf z = *a->shared;
    z.state = a->seed;
    size_t n = (size_t)a->batch * a->batches;
    int64_t *ids = malloc(n * sizeof(*ids));
    float *g = malloc((size_t)a->batch * a->dim * sizeof(float));
    if (ids == NULL || g == NULL) {
        a->failed = 1;
    } else {
        for (size_t i = 0; i < (size_t)a->batch * a->dim; i++)
            g[i] = 0.001f;
        for (size_t i = 0; i < n;) {
            ids[i] = zipf_rank_id(zipf_draw(&z));
            i += table_partition_of(a->t, ids[i]) % a->parts == a->part;
        }
    }
    pthread_barrier_wait(a->go);
    char err[256];
    for (uint32_t k = 0; k < a->batches && !a->failed; k++) {
        if (table_push(a->t, ids + (size_t)k * a->batch, a->batch, g, 1000 + k, err, sizeof(err)) !=
            TABLE_OK) {
            fprintf(stderr, "table_push: %s\n", err);
            a->failed = 1;
        }
    }
    free(ids);
    free(g);
    return NULL;
}

/* Ids per second pushed by `threads` threads at once, each `batches` batches of ids of its own
 * partitions. */
static double parallel_push(table *t, const zipf *zf, uint32_t threads, uint32_t batch,
                            uint32_t batches, uint32_t dim)
{
    pthread_t th[16];
    pusher args[16];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, threads + 1);
    for (uint32_t i = 0; i < threads; i++) {
        args[i] = (pusher){t, zf, 1000 + i, batch, batches, dim, i, threads, &go, 0};
        if (pthread_create(&th[i], NULL, pusher_run, &args[i]) != 0)
            return -1;
    }
    pthread_barrier_wait(&go);
    double a = now_s();
    int failed = 0;
    for (uint32_t i = 0; i < threads; i++) {
        pthread_join(th[i], NULL);
        failed |= args[i].failed;
    }
    double dt = now_s() - a;
    pthread_barrier_destroy(&go);
    return failed ? -1 : (double)threads * batch * batches / dt;
}

typedef struct config {
    uint64_t rows;
    uint32_t dims[8];
    int ndims;
    uint32_t batch, batches;
    double zipf_s;
    optimizer_kind opt;
    row_dtype dtype;
    uint32_t partitions; /* --partitions (in process; 0: the table's default) */
    uint32_t threads;
    int quick;
    int fill_only;
    const char *wire; /* ps-server binary, or NULL */
    int servers;
    int inflight;
    int replicas;            /* --replicas (1: none) */
    const char *coordinator; /* --coordinator, with --replicas above 1 */
} config;

/* The optimizer column: its name, and the dtype when not float32. */
static const char *opt_label(const config *c)
{
    static char buf[64];
    snprintf(buf, sizeof(buf), "%s%s%s", optimizer_name(c->opt), c->dtype ? " " : "",
             c->dtype ? row_dtype_name(c->dtype) : "");
    return buf;
}

static const config *wire_cfg; /* the run's settings, for wire_client */

/* In-process figures of one dim, for the wire's ratios. */
typedef struct inproc {
    double push, pull; /* ids/s */
} inproc;

static int run_dim(const config *c, uint32_t dim, zipf *zf, inproc *res)
{
    table_spec s;
    memset(&s, 0, sizeof(s));
    s.name = "bench/emb";
    s.dim = dim;
    s.dtype = c->dtype;
    s.partitions = c->partitions;
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
            ids[i] = zipf_rank_id(r + i);
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
    if (c->fill_only) {
        printf("| %u | %s | %llu | %.2f | %.0f | | | | | | %.3f | %.1f | %.1f | %.2f | %.2f |\n",
               dim, opt_label(c), (unsigned long long)c->rows, fill_s, (double)c->rows / fill_s,
               (double)st.longest_growth_ns / 1e6, (double)st.bytes / (double)st.rows,
               raw / (double)st.rows, (double)st.bytes / raw, (double)rss / raw);
        fflush(stdout);
        free(ids);
        free(g);
        free(out);
        table_destroy(t);
        return 0;
    }

    /* Zipf pushes, then pulls. */
    double push_s = 0, pull_s = 0;
    uint64_t distinct_before = st.rows;
    for (uint32_t k = 0; k < c->batches; k++) {
        for (size_t i = 0; i < b; i++)
            ids[i] = zipf_rank_id(zipf_draw(zf));
        double a = now_s();
        if (table_push(t, ids, b, g, 2 + k, err, sizeof(err)) != 0) {
            fprintf(stderr, "table_push: %s\n", err);
            return -1;
        }
        push_s += now_s() - a;
    }
    for (uint32_t k = 0; k < c->batches; k++) {
        for (size_t i = 0; i < b; i++)
            ids[i] = zipf_rank_id(zipf_draw(zf));
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
    double par1 = parallel_push(t, zf, 1, c->batch, c->batches, dim);
    double par = parallel_push(t, zf, c->threads, c->batch, c->batches, dim);
    if (par < 0 || par1 < 0)
        return -1;
    double ids_total = (double)b * c->batches;
    res->push = ids_total / push_s;
    res->pull = ids_total / pull_s;
    printf("| %u | %s | %llu | %.2f | %.0f | %.0f | %.0f | %.0f | %.0f | %.3f | %.1f | %.1f | "
           "%.2f | %.2f |\n",
           dim, opt_label(c), (unsigned long long)c->rows, fill_s, (double)c->rows / fill_s,
           ids_total / push_s, ids_total / pull_s, par1, par, (double)st.longest_growth_ns / 1e6,
           (double)st.bytes / (double)st.rows, raw / (double)st.rows, (double)st.bytes / raw,
           (double)rss / raw);
    fflush(stdout);
    free(ids);
    free(g);
    free(out);
    table_destroy(t);
    return 0;
}

/* ---- over the wire ---- */

static ps_client *wire_client(const test_cluster *tc)
{
    char tf[1200];
    test_cluster_tf_config(tc, NULL, 0, tf, sizeof(tf));
    ps_config *cfg = NULL;
    ps_client *cl = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    ps_config_set(cfg, "cluster", tf);
    ps_config_set(cfg, "deadline-ms", "600000");
    if (wire_cfg && wire_cfg->replicas > 1) {
        char r[16];
        snprintf(r, sizeof(r), "%d", wire_cfg->replicas);
        ps_config_set(cfg, "replicas", r);
        ps_config_set(cfg, "coordinator", wire_cfg->coordinator);
    }
    if (ps_client_open(&cl, cfg) != PS_OK) {
        fprintf(stderr, "ps_client_open: %s\n", ps_last_error());
        cl = NULL;
    }
    ps_config_destroy(cfg);
    return cl;
}

/* `batches` calls on tb, `inflight` at a time: pushes of g (or pulls into out, a buffer per
 * slot) of the batches ids[k * batch ..]; when ids is NULL, batch k is the sequential ids
 * k * batch .. (first touch, the last one shorter to end at `rows`). Returns seconds, or -1. */
static double wire_calls(ps_table *tb, bool push, const int64_t *ids, uint64_t rows, size_t batch,
                         uint32_t batches, int inflight, const float *g, float *out, size_t dim)
{
    ps_op *ops[64] = {0};
    int64_t *seq = NULL;
    if (ids == NULL && (seq = malloc((size_t)inflight * batch * sizeof(int64_t))) == NULL)
        return -1;
    double t0 = now_s();
    int rc = PS_OK;
    for (uint32_t k = 0; k < batches + (uint32_t)inflight && rc == PS_OK; k++) {
        int slot = (int)(k % (uint32_t)inflight);
        if (ops[slot] != NULL) {
            rc = ps_op_wait(ops[slot]);
            if (rc != PS_OK)
                fprintf(stderr, "%s: %s\n", push ? "push" : "pull", ps_op_message(ops[slot]));
            ps_op_destroy(ops[slot]);
            ops[slot] = NULL;
        }
        if (k >= batches || rc != PS_OK)
            continue;
        const int64_t *b = ids ? ids + (size_t)k * batch : seq + (size_t)slot * batch;
        size_t n = batch;
        if (ids == NULL) {
            uint64_t first = (uint64_t)k * batch;
            n = rows - first < batch ? (size_t)(rows - first) : batch;
            for (size_t i = 0; i < n; i++)
                seq[(size_t)slot * batch + i] = zipf_rank_id(first + i);
        }
        rc = push ? ps_table_push_async(tb, b, n, g, NULL, NULL, &ops[slot])
                  : ps_table_pull_async(tb, b, n, out + (size_t)slot * batch * dim, NULL, NULL,
                                        &ops[slot]);
        if (rc != PS_OK)
            fprintf(stderr, "%s: %s\n", push ? "push" : "pull", ps_last_error());
    }
    double dt = now_s() - t0;
    for (int i = 0; i < inflight; i++)
        ps_op_destroy(ops[i]);
    free(seq);
    return rc == PS_OK ? dt : -1;
}

typedef struct wire_pusher {
    const test_cluster *tc;
    const char *name;
    const int64_t *ids;
    size_t batch;
    uint32_t batches;
    int inflight;
    const float *g;
    size_t dim;
    pthread_barrier_t *ready;
    double secs;
} wire_pusher;

static void *wire_pusher_run(void *arg)
{
    wire_pusher *a = arg;
    ps_client *cl = wire_client(a->tc);
    ps_table *tb = NULL;
    if (cl != NULL && ps_table_lookup(cl, a->name, &tb) != PS_OK) {
        fprintf(stderr, "ps_table_lookup: %s\n", ps_last_error());
        tb = NULL;
    }
    a->secs = -1;
    pthread_barrier_wait(a->ready);
    if (tb != NULL)
        a->secs =
            wire_calls(tb, true, a->ids, 0, a->batch, a->batches, a->inflight, a->g, NULL, a->dim);
    ps_table_free(tb);
    ps_client_close(cl);
    return NULL;
}

/* The bench's table made over the wire and its c->rows rows made by first touch (g: room for
 * a batch of gradient rows, filled here); the seconds that took, or -1 (*tb may be set). */
static double wire_make_rows(ps_client *cl, const config *c, uint32_t dim, float *g, ps_table **tb)
{
    const size_t b = c->batch;
    for (size_t i = 0; i < b * dim; i++)
        g[i] = 0.001f * (float)((i % 7) + 1);
    ps_table_spec ts;
    ps_table_spec_init(&ts, "bench/emb", dim, (ps_optimizer)c->opt);
    ts.initializer = PS_INIT_UNIFORM;
    ts.init_a = -0.05;
    ts.init_b = 0.05;
    ts.seed = 1;
    ts.dtype = c->dtype == ROW_BFLOAT16  ? PS_BFLOAT16
               : c->dtype == ROW_FLOAT16 ? PS_FLOAT16
                                         : PS_FLOAT32;
    if (ps_table_create(cl, &ts, tb) != PS_OK) {
        fprintf(stderr, "ps_table_create: %s\n", ps_last_error());
        return -1;
    }
    uint32_t fill_batches = (uint32_t)((c->rows + b - 1) / b);
    return wire_calls(*tb, true, NULL, c->rows, b, fill_batches, c->inflight, g, NULL, dim);
}

/* Resident and peak resident bytes of a process (/proc/PID/status VmRSS, VmHWM). */
static void proc_rss(pid_t pid, uint64_t *rss, uint64_t *hwm)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    *rss = *hwm = 0;
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    unsigned long long kb;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
            *rss = (uint64_t)kb * 1024;
        else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            *hwm = (uint64_t)kb * 1024;
    }
    fclose(f);
}

/* Starts c->servers ps-server processes from c->wire (warnings only in their logs) and a client
 * of them in *cl (NULL when it cannot open; the cluster then runs, for the caller to stop).
 * Returns -1 when the servers do not start. */
static int wire_start(const config *c, test_cluster *tc, ps_client **cl)
{
    static int clusters; /* a coordinator prefix per cluster started */
    char r[16], prefix[64];
    snprintf(r, sizeof(r), "%d", c->replicas);
    snprintf(prefix, sizeof(prefix), "/tablebench/%d/%d", (int)getpid(), ++clusters);
    const char *plain[] = {"--log-level", "warn", NULL};
    const char *repl[] = {
        "--log-level",          "warn", "--replicas", r, "--coordinator", c->coordinator,
        "--coordinator-prefix", prefix, NULL};
    wire_cfg = c;
    if (test_cluster_start(tc, c->wire, c->servers, c->replicas > 1 ? repl : plain) != 0) {
        fprintf(stderr, "cannot start %d ps-server(s) from %s\n", c->servers, c->wire);
        return -1;
    }
    *cl = wire_client(tc);
    return 0;
}

/* --wire --fill-only: the rows made by first touch in ps-server processes, and their memory:
 * the servers' resident size (before the table, after it and at its peak) against the raw
 * bytes (id, row and optimizer slots) the servers report holding. */
static int run_wire_fill(const config *c, uint32_t dim)
{
    test_cluster tc;
    ps_client *cl;
    if (wire_start(c, &tc, &cl) != 0)
        return -1;
    int rc = -1;
    ps_table *tb = NULL;
    const size_t b = c->batch;
    float *g = malloc(b * dim * sizeof(float));
    uint64_t rss0 = 0;
    for (int i = 0; i < tc.n; i++) {
        uint64_t r, h;
        proc_rss(tc.pids[i], &r, &h);
        rss0 += r;
    }
    if (cl == NULL || g == NULL)
        goto out;
    double fill = wire_make_rows(cl, c, dim, g, &tb);
    if (fill < 0)
        goto out;
    ps_table_info ti = {.struct_size = sizeof(ti)};
    if (ps_table_info_get(cl, "bench/emb", &ti) != PS_OK) {
        fprintf(stderr, "ps_table_info_get: %s\n", ps_last_error());
        goto out;
    }
    if (ti.rows != c->rows) {
        fprintf(stderr, "rows: %llu, want %llu\n", (unsigned long long)ti.rows,
                (unsigned long long)c->rows);
        goto out;
    }
    uint64_t rss = 0, hwm = 0;
    for (int i = 0; i < tc.n; i++) {
        uint64_t r, h;
        proc_rss(tc.pids[i], &r, &h);
        rss += r;
        hwm += h;
    }
    /* Raw: the id and the row's floats with its optimizer slots, as the in-process figures
     * count them (an empty table of the same spec says how many floats a row holds). */
    table_spec s;
    memset(&s, 0, sizeof(s));
    s.name = "bench/emb";
    s.dim = dim;
    optimizer_params_default(&s.opt, c->opt);
    s.init.kind = INITIALIZER_ZEROS;
    char err[256];
    table *probe;
    if (table_create(&s, &probe, err, sizeof(err)) != TABLE_OK) {
        fprintf(stderr, "table_create: %s\n", err);
        goto out;
    }
    double raw = (double)ti.rows * (8.0 + 4.0 * table_row_floats(probe));
    table_destroy(probe);
    printf("| %u | %s | %d | %llu | %.1f | %.0f | %.1f | %.1f | %.3f | %.3f | %.3f | %.3f |\n", dim,
           opt_label(c), c->servers, (unsigned long long)ti.rows, fill, (double)ti.rows / fill,
           (double)ti.bytes / (double)ti.rows, raw / (double)ti.rows, (double)ti.bytes / raw,
           (double)(rss - rss0) / raw, (double)rss / raw, (double)hwm / raw);
    fflush(stdout);
    rc = 0;
out:
    ps_table_free(tb);
    ps_client_close(cl);
    test_cluster_stop(&tc);
    free(g);
    return rc;
}

/* The wire phase of one dim; appends its row to `rows`. */
static int run_wire(const config *c, uint32_t dim, zipf *zf, const inproc *in, char *rows,
                    size_t cap)
{
    test_cluster tc;
    ps_client *cl;
    if (wire_start(c, &tc, &cl) != 0)
        return -1;
    int rc = -1;
    ps_table *tb = NULL;
    const size_t b = c->batch;
    size_t nids = b * c->batches;
    int64_t *ids = malloc(nids * sizeof(int64_t));
    float *g = malloc(b * dim * sizeof(float));
    float *out = malloc((size_t)c->inflight * b * dim * sizeof(float));
    if (cl == NULL || ids == NULL || g == NULL || out == NULL)
        goto out;
    double fill = wire_make_rows(cl, c, dim, g, &tb);
    for (size_t i = 0; i < nids; i++)
        ids[i] = zipf_rank_id(zipf_draw(zf));
    double push = wire_calls(tb, true, ids, 0, b, c->batches, c->inflight, g, NULL, dim);
    for (size_t i = 0; i < nids; i++)
        ids[i] = zipf_rank_id(zipf_draw(zf));
    double pull = wire_calls(tb, false, ids, 0, b, c->batches, c->inflight, NULL, out, dim);
    if (fill < 0 || push < 0 || pull < 0)
        goto out;
    for (size_t i = 0; i < (size_t)c->inflight * b * dim; i++)
        if (!isfinite(out[i]) || fabsf(out[i]) > 10.0f) {
            fprintf(stderr, "wire pull: value %g out of range\n", (double)out[i]);
            goto out;
        }
    /* Two clients at once, each half of the batches (the same ids as the single client). */
    pthread_t th[2];
    wire_pusher wp[2];
    pthread_barrier_t ready;
    pthread_barrier_init(&ready, NULL, 3);
    uint32_t half = c->batches / 2;
    for (int i = 0; i < 2; i++) {
        wp[i] = (wire_pusher){
            &tc, "bench/emb", ids + (size_t)i * half * b, b, half, c->inflight, g, dim, &ready, -1};
        pthread_create(&th[i], NULL, wire_pusher_run, &wp[i]);
    }
    pthread_barrier_wait(&ready);
    double t0 = now_s();
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double two = now_s() - t0;
    pthread_barrier_destroy(&ready);
    if (wp[0].secs < 0 || wp[1].secs < 0)
        goto out;
    double total = (double)b * c->batches;
    size_t used = strlen(rows);
    snprintf(rows + used, cap - used,
             "| %u | %d | %d | %d | %.0f | %.0f | %.0f | %.0f | %.2f | %.2f |\n", dim, c->servers,
             c->replicas, c->inflight, (double)c->rows / fill, total / push, total / pull,
             (double)b * half * 2 / two, total / push / in->push, total / pull / in->pull);
    rc = 0;
out:
    ps_table_free(tb);
    ps_client_close(cl);
    test_cluster_stop(&tc);
    free(ids);
    free(g);
    free(out);
    return rc;
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
                .threads = 2,
                .servers = 1,
                .inflight = 4,
                .replicas = 1};
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
        } else if (strcmp(a, "--fill-only") == 0) {
            c.fill_only = 1;
        } else if (strcmp(a, "--wire") == 0 && v) {
            c.wire = v;
            i++;
        } else if (strcmp(a, "--servers") == 0 && v) {
            c.servers = atoi(v);
            i++;
        } else if (strcmp(a, "--replicas") == 0 && v) {
            c.replicas = atoi(v);
            i++;
        } else if (strcmp(a, "--coordinator") == 0 && v) {
            c.coordinator = v;
            i++;
        } else if (strcmp(a, "--inflight") == 0 && v) {
            c.inflight = atoi(v);
            i++;
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
        } else if (strcmp(a, "--partitions") == 0 && v) {
            c.partitions = (uint32_t)strtoul(v, NULL, 10);
            i++;
        } else if (strcmp(a, "--dtype") == 0 && v) {
            c.dtype = strcmp(v, "bfloat16") == 0  ? ROW_BFLOAT16
                      : strcmp(v, "float16") == 0 ? ROW_FLOAT16
                                                  : ROW_FLOAT32;
            if (c.dtype == ROW_FLOAT32 && strcmp(v, "float32") != 0) {
                fprintf(stderr, "--dtype %s: float32, bfloat16 or float16\n", v);
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
                    "[--optimizer NAME] [--dtype T] [--partitions P] [--threads T] [--quick] "
                    "[--fill-only] "
                    "[--wire PS_SERVER [--servers N] [--inflight K] [--replicas R "
                    "--coordinator URL]]\n",
                    argv[0]);
            return 2;
        }
    }
    if (c.rows == 0 || c.batch == 0 || c.batches == 0 || c.ndims == 0 || !(c.zipf_s > 0) ||
        c.threads == 0 || c.threads > 16 || c.servers < 1 || c.servers > TEST_MAX_SERVERS ||
        c.inflight < 1 || c.inflight > 64) {
        fprintf(stderr,
                "%s: rows, batch, batches, dims and zipf must be > 0, threads 1..16, servers "
                "1..%d, inflight 1..64\n",
                argv[0], TEST_MAX_SERVERS);
        return 2;
    }
    if (c.replicas < 1 || c.replicas > c.servers || (c.replicas > 1 && c.coordinator == NULL)) {
        fprintf(stderr, "%s: --replicas must be 1..servers (%d), and above 1 needs --coordinator\n",
                argv[0], c.servers);
        return 2;
    }
    if (c.wire != NULL && c.fill_only) {
        printf("# ps-table-bench --wire --fill-only: %llu rows made by first touch in %d "
               "ps-server(s), %u ids per push, %d calls in flight\n",
               (unsigned long long)c.rows, c.servers, c.batch, c.inflight);
        printf("| dim | optimizer | servers | rows | fill s | rows made/s | bytes/row (servers' "
               "count) | raw bytes/row | table/raw | RSS growth/raw | RSS/raw | peak RSS/raw |\n");
        printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for (int d = 0; d < c.ndims; d++) {
            if (c.dims[d] == 0 || c.dims[d] > TABLE_MAX_DIM) {
                fprintf(stderr, "dim %u: must be in 1..%d\n", c.dims[d], TABLE_MAX_DIM);
                return 2;
            }
            if (run_wire_fill(&c, c.dims[d]) != 0)
                return 1;
        }
        return 0;
    }
    zipf zf = {0};
    if (!c.fill_only && zipf_init(&zf, c.rows, c.zipf_s, 7) != 0) {
        fprintf(stderr, "out of memory for the Zipf table\n");
        return 1;
    }
    printf("# ps-table-bench: %llu rows, %u ids per batch, %u batches, Zipf(%g), one thread, then "
           "%u threads pushing at once\n",
           (unsigned long long)c.rows, c.batch, c.batches, c.zipf_s, c.threads);
    printf(
        "| dim | optimizer | rows | fill s | rows made/s | push ids/s | pull ids/s | push ids/s, "
        "1 thread, own draws | push ids/s, %u threads, own partitions | longest growth ms | "
        "bytes/row | raw bytes/row | table/raw | RSS/raw |\n",
        c.threads);
    printf("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    int rc = 0;
    static char wire_rows[4096];
    for (int d = 0; d < c.ndims && rc == 0; d++) {
        if (c.dims[d] == 0 || c.dims[d] > TABLE_MAX_DIM) {
            fprintf(stderr, "dim %u: must be in 1..%d\n", c.dims[d], TABLE_MAX_DIM);
            rc = 2;
            break;
        }
        inproc in = {0};
        rc = run_dim(&c, c.dims[d], &zf, &in) == 0 ? 0 : 1;
        if (rc == 0 && c.wire != NULL)
            rc = run_wire(&c, c.dims[d], &zf, &in, wire_rows, sizeof(wire_rows)) == 0 ? 0 : 1;
    }
    if (c.wire != NULL) {
        printf("\n# over the wire: %d ps-server(s) on loopback, the same batches\n", c.servers);
        printf("| dim | servers | replicas | calls in flight | rows made/s | push ids/s | pull "
               "ids/s | push ids/s, 2 clients | push / in-process | pull / in-process |\n");
        printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n%s", wire_rows);
    }
    zipf_free(&zf);
    return rc;
}
