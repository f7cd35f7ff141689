/* Checkpoint cut benchmark (not a test): how long a checkpoint holds a sparse table's updates
 * off, in-process on the server's table (server/table.c), with a thread pushing all along.
 *
 *   copy under the freeze   what checkpoints did before table_cut_begin: every partition
 *                           copied (table_copy_partition) while updates are held off
 *   cut                     table_cut_prepare before the freeze (the copy's memory),
 *                           table_cut_start under it (the pause), then
 *                           table_cut_finish after it, while the pusher goes on; a push
 *                           that finds its partition pending copies it first
 *   delta                   after PCT% of the rows changed, a delta cut of the previous one
 *
 * The freeze is a rwlock, taken shared by every push and exclusively for the cut, as the
 * server's store_freeze is. The pusher pushes batches of BATCH ids drawn uniformly from the
 * rows; its longest push (the wait included) is what a client would see.
 * usage: ps-table-cut-bench [--rows N] [--dim D] [--batch B] [--pct P] [--quick] */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hash.h"
#include "program.h"
#include "table.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct pusher {
    table *t;
    pthread_rwlock_t *gate;
    uint64_t rows;
    uint32_t batch, dim;
    _Atomic bool stop, measuring;
    _Atomic uint64_t pushes;
    double longest; /* seconds, while measuring */
} pusher;

static void *pusher_run(void *arg)
{
    pusher *p = arg;
    int64_t *ids = malloc(p->batch * sizeof(*ids));
    float *g = malloc((size_t)p->batch * p->dim * sizeof(float));
    for (size_t i = 0; i < (size_t)p->batch * p->dim; i++)
        g[i] = 0.001f;
    uint64_t r = 12345;
    while (!atomic_load(&p->stop)) {
        for (uint32_t i = 0; i < p->batch; i++)
            ids[i] = (int64_t)(mix64(r++) % p->rows);
        double t0 = now_s();
        pthread_rwlock_rdlock(p->gate);
        char err[200];
        if (table_push(p->t, ids, p->batch, g, 1, err, sizeof(err)) != 0) {
            fprintf(stderr, "push: %s\n", err);
            exit(1);
        }
        pthread_rwlock_unlock(p->gate);
        double dt = now_s() - t0;
        if (atomic_load(&p->measuring) && dt > p->longest)
            p->longest = dt;
        atomic_fetch_add(&p->pushes, 1);
    }
    free(ids);
    free(g);
    return NULL;
}

/* Waits until the pusher has done a few pushes, then starts measuring its longest. */
static void measure_from_now(pusher *p)
{
    uint64_t at = atomic_load(&p->pushes);
    while (atomic_load(&p->pushes) < at + 3) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    p->longest = 0;
    atomic_store(&p->measuring, true);
}

static double stop_measuring(pusher *p)
{
    uint64_t at = atomic_load(&p->pushes);
    while (atomic_load(&p->pushes) < at + 2) { /* a push that began during the cut has ended */
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&p->measuring, false);
    return p->longest;
}

int main(int argc, char **argv)
{
    if (program_wants_version(argc, argv)) {
        program_print_version(stdout, "ps-table-cut-bench");
        return 0;
    }
    uint64_t rows = 10000000;
    uint32_t dim = 16, batch = 512;
    double pct = 1.0;
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            quick = true;
            rows = 50000;
        } else if (strcmp(a, "--rows") == 0 && v) {
            rows = strtoull(v, NULL, 10), i++;
        } else if (strcmp(a, "--dim") == 0 && v) {
            dim = (uint32_t)atoi(v), i++;
        } else if (strcmp(a, "--batch") == 0 && v) {
            batch = (uint32_t)atoi(v), i++;
        } else if (strcmp(a, "--pct") == 0 && v) {
            pct = atof(v), i++;
        } else {
            fprintf(stderr, "usage: %s [--rows N] [--dim D] [--batch B] [--pct P] [--quick]\n",
                    argv[0]);
            return 2;
        }
    }
    if (rows == 0 || dim == 0 || batch == 0 || pct <= 0 || pct > 100) {
        fprintf(stderr, "rows, dim, batch must be > 0 and pct in (0, 100]\n");
        return 2;
    }
    table_spec s;
    memset(&s, 0, sizeof(s));
    s.name = "bench/cut";
    s.dim = dim;
    optimizer_params_default(&s.opt, OPTIMIZER_ADAGRAD);
    s.init.kind = INITIALIZER_UNIFORM;
    s.init.a = -0.1;
    s.init.b = 0.1;
    s.expected_rows = rows;
    table *t;
    char err[256];
    if (table_create(&s, &t, err, sizeof(err)) != TABLE_OK) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    /* Every row made, by pushes of 8192 ids. */
    enum { FILL = 8192 };
    int64_t *ids = malloc(FILL * sizeof(*ids));
    float *g = calloc((size_t)FILL * dim, sizeof(float));
    double t0 = now_s();
    for (uint64_t first = 0; first < rows; first += FILL) {
        uint64_t n = rows - first < FILL ? rows - first : FILL;
        for (uint64_t i = 0; i < n; i++)
            ids[i] = (int64_t)(first + i);
        if (table_push(t, ids, n, g, 0, err, sizeof(err)) != TABLE_OK) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
    }
    table_stats st;
    table_stats_get(t, &st);
    printf("table: %llu rows of dim %u (Adagrad: %u floats a row), %.0f MiB, made in %.2f s\n",
           (unsigned long long)st.rows, dim, table_row_floats(t), (double)st.bytes / 1048576.0,
           now_s() - t0);

    pthread_rwlock_t gate;
    pthread_rwlock_init(&gate, NULL);
    pusher p = {.t = t, .gate = &gate, .rows = rows, .batch = batch, .dim = dim};
    pthread_t th;
    pthread_create(&th, NULL, pusher_run, &p);

    /* Before: every partition copied under the freeze. */
    measure_from_now(&p);
    t0 = now_s();
    pthread_rwlock_wrlock(&gate);
    uint32_t np = table_partitions(t);
    table_rows *copy = calloc(np, sizeof(*copy));
    uint64_t copied = 0;
    for (uint32_t q = 0; q < np; q++) {
        if (table_copy_partition(t, q, &copy[q]) != 0) {
            fprintf(stderr, "out of memory copying partition %u\n", q);
            return 1;
        }
        copied += copy[q].n;
    }
    pthread_rwlock_unlock(&gate);
    double old_pause = now_s() - t0;
    double old_longest = stop_measuring(&p);
    for (uint32_t q = 0; q < np; q++)
        table_rows_free(&copy[q]);
    printf("copy under the freeze: %llu rows, pause %.1f ms, longest push %.1f ms\n",
           (unsigned long long)copied, old_pause * 1e3, old_longest * 1e3);

    /* After: the cut. */
    double tp = now_s();
    table_cut *c = table_cut_prepare(t, 0); /* before the freeze, as the checkpointer does */
    double prep = now_s() - tp;
    if (c == NULL) {
        fprintf(stderr, "cut failed\n");
        return 1;
    }
    measure_from_now(&p);
    uint64_t pushes0 = atomic_load(&p.pushes);
    t0 = now_s();
    pthread_rwlock_wrlock(&gate);
    double tf = now_s();
    table_cut_start(c, table_cut_id_new(), true);
    pthread_rwlock_unlock(&gate);
    double pause = now_s() - tf, held = now_s() - t0;
    if (table_cut_finish(c) != 0) {
        fprintf(stderr, "cut failed\n");
        return 1;
    }
    double full_s = now_s() - t0;
    double longest = stop_measuring(&p);
    uint64_t during = atomic_load(&p.pushes) - pushes0;
    copied = 0;
    for (uint32_t q = 0; q < np; q++)
        copied += table_cut_rows(c, q)->n;
    table_cut_free(c);
    printf("cut: %llu rows; prepared (memory) in %.1f ms before the freeze; pause "
           "(table_cut_start under the freeze) %.3f ms (freeze taken and released %.3f ms); copy "
           "done %.1f ms later; longest push %.1f ms; %llu pushes during the copy\n",
           (unsigned long long)copied, prep * 1e3, pause * 1e3, held * 1e3, full_s * 1e3,
           longest * 1e3, (unsigned long long)during);

    /* Delta: pct% of the rows changed since the cut (the pusher is stopped first, so that
     * exactly those change). */
    atomic_store(&p.stop, true);
    pthread_join(th, NULL);
    /* A whole cut with nothing else running, the one the delta is measured against. */
    t0 = now_s();
    uint64_t whole_id = table_cut_id_new();
    c = table_cut_begin(t, 0, whole_id, true);
    if (c == NULL || table_cut_finish(c) != 0) {
        fprintf(stderr, "cut failed\n");
        return 1;
    }
    double quiet_s = now_s() - t0;
    table_cut_free(c);
    uint64_t nchange = (uint64_t)((double)rows * pct / 100.0);
    for (uint64_t first = 0; first < nchange; first += FILL) {
        uint64_t n = nchange - first < FILL ? nchange - first : FILL;
        for (uint64_t i = 0; i < n; i++)
            ids[i] = (int64_t)(mix64(first + i + 99) % rows);
        table_push(t, ids, n, g, 2, err, sizeof(err));
    }
    t0 = now_s();
    c = table_cut_begin(t, whole_id, table_cut_id_new(), true);
    if (c == NULL || !table_cut_is_delta(c) || table_cut_finish(c) != 0) {
        fprintf(stderr, "delta cut failed\n");
        return 1;
    }
    double delta_s = now_s() - t0;
    uint64_t drows = 0;
    for (uint32_t q = 0; q < np; q++)
        drows += table_cut_rows(c, q)->n;
    table_cut_free(c);
    uint64_t per = 16 + 4 * (uint64_t)table_row_floats(t);
    printf("delta after %.2f%% of the rows pushed: %llu rows copied in %.1f ms (%.1f MiB of "
           "record) against %llu in %.1f ms (%.1f MiB) for a whole cut (no pusher running)\n",
           pct, (unsigned long long)drows, delta_s * 1e3, (double)(drows * per) / 1048576.0,
           (unsigned long long)copied, quiet_s * 1e3, (double)(copied * per) / 1048576.0);
    int rc = 0;
    if (quick && (copied != rows || drows == 0 || drows > nchange)) {
        fprintf(stderr, "quick run: unexpected counts\n");
        rc = 1;
    }
    free(ids);
    free(g);
    free(copy);
    pthread_rwlock_destroy(&gate);
    table_destroy(t);
    return rc;
}
