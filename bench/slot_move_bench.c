/* ps-slot-move-bench: the client side of bench/slot_move_bench.sh (bench/RESULTS.md, "Moving
 * slots"): a table of N rows of dim 16 (Adagrad) loaded, then clients pushing to it while
 * psctl moves slots, every push's latency recorded, and a count of acknowledged pushes that
 * the end checks exactly. The cluster and coordinator come from TF_CONFIG and PS_COORDINATOR.
 *
 *   ps-slot-move-bench load N                 creates "bench" (dim 16, Adagrad) with rows
 *                                             0..N-1 and "acks" (dim 1, SGD, learning rate 1)
 *   ps-slot-move-bench push N STOPFILE OUT    2 threads until STOPFILE exists: each round
 *                                             pushes 64 random rows of "bench" (its latency
 *                                             into OUT.lat: "start_unix_s ms" a line), then
 *                                             -1 to one row of "acks"; OUT.hist: the pushes of
 *                                             each "acks" row acknowledged
 *   ps-slot-move-bench check OUT.hist...      every "acks" row equals its acknowledged pushes
 * Exit 0, or 1 naming what failed. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "psclient.h"

#define DIM 16
#define BATCH 64
#define NACKS 2000

static ps_client *cl;
static ps_table *bench, *acks;
static long nrows;
static const char *stopfile;
static atomic_long ack_count[NACKS];
static atomic_int failed;
static pthread_mutex_t lat_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *lat;

static double now_s(int clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int open_tables(void)
{
    int rc = ps_client_open(&cl, NULL);
    ps_table_spec ts;
    ps_table_spec_init(&ts, "bench", DIM, PS_OPT_ADAGRAD);
    ts.learning_rate = 0.01f;
    ts.staleness = PS_STALENESS_ASYNC;
    if (rc == PS_OK)
        rc = ps_table_create(cl, &ts, &bench);
    ps_table_spec_init(&ts, "acks", 1, PS_OPT_SGD);
    ts.learning_rate = 1;
    ts.staleness = PS_STALENESS_ASYNC;
    if (rc == PS_OK)
        rc = ps_table_create(cl, &ts, &acks);
    if (rc != PS_OK)
        fprintf(stderr, "open: %s: %s\n", ps_strerror(rc), ps_last_error());
    return rc == PS_OK ? 0 : 1;
}

static int load(void)
{
    enum { CHUNK = 8192 };
    int64_t *ids = malloc(CHUNK * sizeof(int64_t));
    float *g = malloc((size_t)CHUNK * DIM * sizeof(float));
    for (size_t k = 0; k < (size_t)CHUNK * DIM; k++)
        g[k] = 0.5f;
    for (long at = 0; at < nrows; at += CHUNK) {
        size_t n = (size_t)(nrows - at < CHUNK ? nrows - at : CHUNK);
        for (size_t k = 0; k < n; k++)
            ids[k] = at + (long)k;
        int rc = ps_table_push(bench, ids, n, g);
        if (rc != PS_OK) {
            fprintf(stderr, "load at row %ld: %s: %s\n", at, ps_strerror(rc), ps_last_error());
            return 1;
        }
    }
    free(ids);
    free(g);
    printf("loaded %ld rows of dim %d (Adagrad)\n", nrows, DIM);
    return 0;
}

static void *pusher(void *arg)
{
    long t = (long)arg;
    unsigned seed = (unsigned)(t * 7919 + 17);
    int64_t ids[BATCH];
    float g[BATCH * DIM];
    for (int k = 0; k < BATCH * DIM; k++)
        g[k] = 0.01f;
    for (long i = 0; access(stopfile, F_OK) != 0 && !atomic_load(&failed); i++) {
        for (int k = 0; k < BATCH; k++)
            ids[k] = (int64_t)(((uint64_t)rand_r(&seed) << 16 ^ (uint64_t)rand_r(&seed)) %
                               (uint64_t)nrows);
        double wall = now_s(CLOCK_REALTIME), t0 = now_s(CLOCK_MONOTONIC);
        int rc = ps_table_push(bench, ids, BATCH, g);
        double ms = (now_s(CLOCK_MONOTONIC) - t0) * 1e3;
        pthread_mutex_lock(&lat_mu);
        fprintf(lat, "%.6f %.3f\n", wall, ms);
        pthread_mutex_unlock(&lat_mu);
        int64_t a = t * (NACKS / 2) + i % (NACKS / 2);
        float m1 = -1;
        if (rc == PS_OK && (rc = ps_table_push(acks, &a, 1, &m1)) == PS_OK)
            atomic_fetch_add(&ack_count[a], 1);
        if (rc != PS_OK) {
            fprintf(stderr, "thread %ld push %ld: %s: %s\n", t, i, ps_strerror(rc),
                    ps_last_error());
            atomic_store(&failed, 1);
        }
    }
    return NULL;
}

static int check(int argc, char **argv)
{
    static long want[NACKS];
    for (int a = 0; a < argc; a++) {
        FILE *f = fopen(argv[a], "r");
        if (f == NULL) {
            perror(argv[a]);
            return 1;
        }
        int k;
        long n;
        while (fscanf(f, "%d %ld", &k, &n) == 2)
            if (k >= 0 && k < NACKS)
                want[k] += n;
        fclose(f);
    }
    static int64_t ids[NACKS];
    static float rows[NACKS];
    long total = 0;
    for (int i = 0; i < NACKS; i++)
        ids[i] = i, total += want[i];
    int rc = ps_table_pull(acks, ids, NACKS, rows);
    if (rc != PS_OK) {
        fprintf(stderr, "pull: %s: %s\n", ps_strerror(rc), ps_last_error());
        return 1;
    }
    for (int i = 0; i < NACKS; i++)
        if (rows[i] != (float)want[i]) {
            fprintf(stderr, "acks[%d] = %g, acknowledged pushes %ld: LOST OR DOUBLED\n", i, rows[i],
                    want[i]);
            return 1;
        }
    printf("all %ld acknowledged pushes found, none twice\n", total);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3 || (strcmp(argv[1], "push") == 0 && argc != 5)) {
        fprintf(stderr, "usage: %s load N | push N STOPFILE OUT | check OUT.hist...\n", argv[0]);
        return 2;
    }
    if (open_tables() != 0)
        return 1;
    int rc;
    if (strcmp(argv[1], "load") == 0) {
        nrows = atol(argv[2]);
        rc = load();
    } else if (strcmp(argv[1], "push") == 0) {
        nrows = atol(argv[2]);
        stopfile = argv[3];
        char path[4096];
        snprintf(path, sizeof(path), "%s.lat", argv[4]);
        lat = fopen(path, "w");
        pthread_t th[2];
        for (long t = 0; t < 2; t++)
            pthread_create(&th[t], NULL, pusher, (void *)t);
        for (int t = 0; t < 2; t++)
            pthread_join(th[t], NULL);
        fclose(lat);
        snprintf(path, sizeof(path), "%s.hist", argv[4]);
        FILE *f = fopen(path, "w");
        for (int i = 0; i < NACKS; i++)
            fprintf(f, "%d %ld\n", i, atomic_load(&ack_count[i]));
        fclose(f);
        rc = atomic_load(&failed) ? 1 : 0;
    } else {
        rc = check(argc - 2, argv + 2);
    }
    ps_client_close(cl);
    return rc;
}
