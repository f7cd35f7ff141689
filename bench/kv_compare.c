/* ps-kv-compare (a benchmark, not a test): psd's sparse tables against a ps-lite-shaped key-value
 * server on the same batches, side by side in one run (bench/RESULTS.md, "Sparse tables against
 * a ps-lite-shaped server").
 *
 * The baseline mirrors ps-lite's KVServer with its default handle, as its KV benchmark runs it:
 * one hash map (id -> row of DIM floats, a missing row made zero) under one mutex, requests
 * handled one at a time in arrival order on one thread, a push applying SGD (w -= lr * g) and a
 * pull copying the rows out, over ZeroMQ (a ROUTER socket per server, a DEALER per server on the
 * client, the keys and values as frames of their own, the reply's values sent without a copy).
 * Like ps-lite's KVWorker, the client cuts a request's sorted keys into the servers' key ranges
 * (server s holds [s * 2^64 / N, (s + 1) * 2^64 / N)), sends every part and waits for all
 * replies. ps-lite's keys must be unique and sorted, so the baseline gets each batch
 * deduplicated. The map (--map):
 *   chained (the default): what std::unordered_map<Key, std::vector<float>> does, a bucket
 *     array of singly linked nodes (one allocation per key, one more for its row), rehashed to
 *     twice the buckets when the load passes 1;
 *   open: open addressing with linear probing, the rows in one array (no node per key): a
 *     baseline faster than any unordered_map, to show how much of a gap is the map's.
 *
 * psd: SERVERS ps-server processes (this build's), a table of DIM floats with SGD at the same
 * rate, ps_table_pull / ps_table_push with one request in flight, as the baseline.
 *
 * Workload: BATCHES batches of BATCH ids drawn Zipf(S) over ROWS ids (ranks scrambled into
 * ids). Both first make all ROWS rows by first touch (pushes of the ids in rank order, BATCH at
 * a time, timed: rows/s) and get one untimed pass of pushes of the deduplicated batches, after
 * which a sample of rows pulled from both must be equal. Then ROUNDS rounds, each timing
 * (in an order that alternates between rounds) psd and the baseline pulling and pushing the
 * deduplicated batches, and psd pulling and pushing the raw batches (their duplicates included,
 * as a client sends them; psd sums a push's duplicates). Prints each round, then medians:
 * rows/s on deduplicated batches and their ratio psd/baseline, and batches/s of psd on raw
 * batches against the baseline on the same batches deduplicated, and the CPU time a batch took
 * (this process's threads and every server's, median of the rounds): on a loaded machine the
 * wall times measure the scheduler's wakeups as much as the work. The machine's load average
 * is printed beside the figures.
 *
 * usage: ps-kv-compare --server-bin PS_SERVER [--rows N] [--dim D] [--batch B] [--batches K]
 *                      [--zipf S] [--rounds R] [--servers 1,2] [--map chained|open] [--quick]
 *                      [--only psd-pull|baseline-pull|psd-push|baseline-push|psd-raw-pull|
 *                              psd-raw-push]
 * --only CELL: that cell alone each round (to profile it; the medians then mean nothing).
 * --quick: 100,000 rows, 20 batches of 1,024, 2 rounds, 1 and 2 servers (seconds). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "cluster_proc.h"
#include "jemalloc_conf.h" /* the client's allocator settings, as ps-worker's (both sides) */
#include "proc_cpu.h"
#include "psclient.h"
#include "zipf.h"

#define KV_MAX_SERVERS 8
#define LEARNING_RATE 0.01f

enum { KV_PULL = 1, KV_PUSH = 2, KV_STOP = 3 };

/* The request and reply header frame. */
typedef struct kv_hdr {
    uint32_t op, n, dim;
    float lr;
} kv_hdr;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the baseline's server ------------------------------------------------------------------ */

/* id -> row: open addressing, linear probing, grown at 1/2 load. */
typedef struct kv_map {
    uint64_t *keys; /* 0 marks an empty slot; id 0 is kept aside */
    uint32_t *row;  /* index into rows */
    uint64_t cap, used;
    float *rows;
    uint64_t nrows, rows_cap;
    uint32_t dim;
    bool has_zero;
    uint32_t zero_row;
} kv_map;

static uint64_t kv_hash(uint64_t k)
{
    k ^= k >> 33;
    k *= UINT64_C(0xff51afd7ed558ccd);
    k ^= k >> 33;
    return k;
}

static float *kv_new_row(kv_map *m, uint32_t *idx)
{
    if (m->nrows == m->rows_cap) {
        uint64_t cap = m->rows_cap ? m->rows_cap * 2 : 1024;
        float *r = realloc(m->rows, cap * m->dim * sizeof(float));
        if (r == NULL)
            return NULL;
        m->rows = r;
        m->rows_cap = cap;
    }
    *idx = (uint32_t)m->nrows++;
    float *row = m->rows + (uint64_t)*idx * m->dim;
    memset(row, 0, m->dim * sizeof(float));
    return row;
}

static int kv_grow(kv_map *m)
{
    uint64_t cap = m->cap ? m->cap * 2 : 1 << 16;
    uint64_t *keys = calloc(cap, sizeof(*keys));
    uint32_t *row = malloc(cap * sizeof(*row));
    if (keys == NULL || row == NULL) {
        free(keys);
        free(row);
        return -1;
    }
    for (uint64_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == 0)
            continue;
        uint64_t j = kv_hash(m->keys[i]) & (cap - 1);
        while (keys[j] != 0)
            j = (j + 1) & (cap - 1);
        keys[j] = m->keys[i];
        row[j] = m->row[i];
    }
    free(m->keys);
    free(m->row);
    m->keys = keys;
    m->row = row;
    m->cap = cap;
    return 0;
}

/* The row of id k, made zero when missing; NULL when out of memory. */
static float *kv_row(kv_map *m, uint64_t k)
{
    uint32_t idx;
    if (k == 0) {
        if (!m->has_zero) {
            if (kv_new_row(m, &m->zero_row) == NULL)
                return NULL;
            m->has_zero = true;
        }
        return m->rows + (uint64_t)m->zero_row * m->dim;
    }
    if ((m->used + 1) * 2 > m->cap && kv_grow(m) != 0)
        return NULL;
    uint64_t j = kv_hash(k) & (m->cap - 1);
    while (m->keys[j] != 0 && m->keys[j] != k)
        j = (j + 1) & (m->cap - 1);
    if (m->keys[j] == k)
        return m->rows + (uint64_t)m->row[j] * m->dim;
    float *row = kv_new_row(m, &idx);
    if (row == NULL)
        return NULL;
    m->keys[j] = k;
    m->row[j] = idx;
    m->used++;
    return row;
}

/* id -> row as std::unordered_map<uint64_t, std::vector<float>> keeps it. */
typedef struct kv_node {
    struct kv_node *next;
    uint64_t key;
    float *row;
} kv_node;

typedef struct kv_chained {
    kv_node **buckets;
    uint64_t nbuckets, size;
    uint32_t dim;
} kv_chained;

static int kv_chained_rehash(kv_chained *m)
{
    uint64_t nb = m->nbuckets ? m->nbuckets * 2 : 1 << 16;
    kv_node **b = calloc(nb, sizeof(*b));
    if (b == NULL)
        return -1;
    for (uint64_t i = 0; i < m->nbuckets; i++) {
        for (kv_node *n = m->buckets[i], *next; n; n = next) {
            next = n->next;
            uint64_t j = kv_hash(n->key) % nb;
            n->next = b[j];
            b[j] = n;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
    return 0;
}

static float *kv_chained_row(kv_chained *m, uint64_t k)
{
    if (m->nbuckets) {
        for (kv_node *n = m->buckets[kv_hash(k) % m->nbuckets]; n; n = n->next)
            if (n->key == k)
                return n->row;
    }
    if ((m->size + 1 > m->nbuckets) && kv_chained_rehash(m) != 0)
        return NULL;
    kv_node *n = malloc(sizeof(*n));
    float *row = calloc(m->dim, sizeof(float));
    if (n == NULL || row == NULL) {
        free(n);
        free(row);
        return NULL;
    }
    uint64_t j = kv_hash(k) % m->nbuckets;
    *n = (kv_node){.next = m->buckets[j], .key = k, .row = row};
    m->buckets[j] = n;
    m->size++;
    return row;
}

static void kv_chained_free(kv_chained *m)
{
    for (uint64_t i = 0; i < m->nbuckets; i++) {
        for (kv_node *n = m->buckets[i], *next; n; n = next) {
            next = n->next;
            free(n->row);
            free(n);
        }
    }
    free(m->buckets);
}

static void kv_free_buf(void *data, void *hint)
{
    (void)hint;
    free(data);
}

/* Receives one frame into msg; -1 on error. more tells whether frames follow. */
static int kv_recv(void *sock, zmq_msg_t *msg, int *more)
{
    if (zmq_msg_recv(msg, sock, 0) < 0)
        return -1;
    *more = zmq_msg_more(msg);
    return 0;
}

static int kv_serve(int port, uint32_t dim, bool chained)
{
    void *ctx = zmq_ctx_new();
    void *sock = zmq_socket(ctx, ZMQ_ROUTER);
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    if (zmq_bind(sock, url) != 0) {
        fprintf(stderr, "kv server: bind %s: %s\n", url, zmq_strerror(errno));
        return 1;
    }
    kv_map m = {.dim = dim};
    kv_chained cm = {.dim = dim};
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    for (;;) {
        zmq_msg_t id, hdr, keys, vals;
        int more = 0;
        zmq_msg_init(&id);
        zmq_msg_init(&hdr);
        zmq_msg_init(&keys);
        zmq_msg_init(&vals);
        if (kv_recv(sock, &id, &more) != 0 || !more || kv_recv(sock, &hdr, &more) != 0)
            return 1;
        kv_hdr h;
        if (zmq_msg_size(&hdr) != sizeof(h))
            return 1;
        memcpy(&h, zmq_msg_data(&hdr), sizeof(h));
        if (h.op == KV_STOP) {
            zmq_msg_close(&id);
            zmq_msg_close(&hdr);
            zmq_msg_close(&keys);
            zmq_msg_close(&vals);
            break;
        }
        if (!more || kv_recv(sock, &keys, &more) != 0)
            return 1;
        if (h.op == KV_PUSH && (!more || kv_recv(sock, &vals, &more) != 0))
            return 1;
        /* ZeroMQ's frames are not aligned: keys and values are read with memcpy. */
        const unsigned char *k = zmq_msg_data(&keys);
        size_t n = zmq_msg_size(&keys) / sizeof(uint64_t);
        float *out = NULL;
        pthread_mutex_lock(&lock);
        if (h.op == KV_PUSH) {
            const unsigned char *g = zmq_msg_data(&vals);
            for (size_t i = 0; i < n; i++) {
                uint64_t key;
                memcpy(&key, k + i * sizeof(key), sizeof(key));
                float *w = chained ? kv_chained_row(&cm, key) : kv_row(&m, key);
                for (uint32_t j = 0; w && j < dim; j++) {
                    float gj;
                    memcpy(&gj, g + (i * dim + j) * sizeof(float), sizeof(gj));
                    w[j] -= h.lr * gj;
                }
            }
        } else {
            out = malloc(n * dim * sizeof(float) + 1);
            for (size_t i = 0; out && i < n; i++) {
                uint64_t key;
                memcpy(&key, k + i * sizeof(key), sizeof(key));
                const float *w = chained ? kv_chained_row(&cm, key) : kv_row(&m, key);
                if (w)
                    memcpy(out + i * dim, w, dim * sizeof(float));
            }
        }
        pthread_mutex_unlock(&lock);
        zmq_msg_send(&id, sock, ZMQ_SNDMORE);
        zmq_send(sock, &h, sizeof(h), h.op == KV_PULL ? ZMQ_SNDMORE : 0);
        if (h.op == KV_PULL) {
            zmq_msg_t o;
            zmq_msg_init_data(&o, out, out ? n * dim * sizeof(float) : 0, kv_free_buf, NULL);
            zmq_msg_send(&o, sock, 0);
        }
        zmq_msg_close(&id);
        zmq_msg_close(&hdr);
        zmq_msg_close(&keys);
        zmq_msg_close(&vals);
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    free(m.keys);
    free(m.row);
    free(m.rows);
    kv_chained_free(&cm);
    return 0;
}

/* ---- the baseline's client ------------------------------------------------------------------ */

typedef struct kv_client {
    void *ctx;
    void *sock[KV_MAX_SERVERS];
    int n;
    uint32_t dim;
} kv_client;

static void kv_no_free(void *data, void *hint)
{
    (void)data;
    (void)hint;
}

/* One request over every server: ids sorted ascending (unique), grads (push) or out (pull). */
static int kv_call(kv_client *c, int op, const uint64_t *ids, size_t n, const float *grads,
                   float *out)
{
    size_t lo[KV_MAX_SERVERS + 1];
    lo[0] = 0;
    for (int s = 1; s <= c->n; s++) {
        /* First id at or above server s's range start. */
        uint64_t start = s == c->n ? 0 : (uint64_t)(((unsigned __int128)s << 64) / c->n);
        size_t a = lo[s - 1], b = n;
        if (s == c->n) {
            lo[s] = n;
            continue;
        }
        while (a < b) {
            size_t mid = a + (b - a) / 2;
            if (ids[mid] < start)
                a = mid + 1;
            else
                b = mid;
        }
        lo[s] = a;
    }
    for (int s = 0; s < c->n; s++) {
        size_t cnt = lo[s + 1] - lo[s];
        kv_hdr h = {.op = (uint32_t)op, .n = (uint32_t)cnt, .dim = c->dim, .lr = LEARNING_RATE};
        zmq_msg_t k, v;
        zmq_send(c->sock[s], &h, sizeof(h), ZMQ_SNDMORE);
        zmq_msg_init_data(&k, (void *)(ids + lo[s]), cnt * sizeof(uint64_t), kv_no_free, NULL);
        zmq_msg_send(&k, c->sock[s], op == KV_PUSH ? ZMQ_SNDMORE : 0);
        if (op == KV_PUSH) {
            zmq_msg_init_data(&v, (void *)(grads + lo[s] * c->dim), cnt * c->dim * sizeof(float),
                              kv_no_free, NULL);
            zmq_msg_send(&v, c->sock[s], 0);
        }
    }
    for (int s = 0; s < c->n; s++) {
        kv_hdr h;
        if (zmq_recv(c->sock[s], &h, sizeof(h), 0) != (int)sizeof(h))
            return -1;
        if (op == KV_PULL) {
            zmq_msg_t v;
            zmq_msg_init(&v);
            if (zmq_msg_recv(&v, c->sock[s], 0) < 0)
                return -1;
            size_t want = (lo[s + 1] - lo[s]) * c->dim * sizeof(float);
            if (zmq_msg_size(&v) != want) {
                zmq_msg_close(&v);
                return -1;
            }
            memcpy(out + lo[s] * c->dim, zmq_msg_data(&v), want);
            zmq_msg_close(&v);
        }
    }
    return 0;
}

/* ---- workload -------------------------------------------------------------------------------- */

typedef struct config {
    const char *server_bin;
    uint64_t rows;
    uint32_t dim, batch, batches, rounds;
    double zipf_s;
    int servers[KV_MAX_SERVERS];
    int nserver_counts;
    bool chained; /* --map chained (default) or open */
    int only;     /* --only CELL: that cell alone (for a profiler), -1: all */
} config;

typedef struct batches {
    int64_t *raw;   /* batches * batch ids as drawn */
    uint64_t *ded;  /* each batch deduplicated and sorted (as uint64) */
    size_t *ded_at; /* batches + 1 offsets into ded */
    size_t max_ded;
} batches;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int make_batches(const config *c, batches *b)
{
    zipf z;
    size_t total = (size_t)c->batch * c->batches;
    if (zipf_init(&z, c->rows, c->zipf_s, 7) != 0)
        return -1;
    b->raw = malloc(total * sizeof(*b->raw));
    b->ded = malloc(total * sizeof(*b->ded));
    b->ded_at = malloc((c->batches + 1) * sizeof(*b->ded_at));
    if (b->raw == NULL || b->ded == NULL || b->ded_at == NULL) {
        zipf_free(&z);
        return -1;
    }
    size_t at = 0;
    b->max_ded = 0;
    for (uint32_t k = 0; k < c->batches; k++) {
        uint64_t *d = b->ded + at;
        for (uint32_t i = 0; i < c->batch; i++) {
            b->raw[(size_t)k * c->batch + i] = zipf_rank_id(zipf_draw(&z));
            d[i] = (uint64_t)b->raw[(size_t)k * c->batch + i];
        }
        qsort(d, c->batch, sizeof(*d), cmp_u64);
        size_t u = 0;
        for (uint32_t i = 0; i < c->batch; i++)
            if (u == 0 || d[i] != d[u - 1])
                d[u++] = d[i];
        b->ded_at[k] = at;
        at += u;
        if (u > b->max_ded)
            b->max_ded = u;
    }
    b->ded_at[c->batches] = at;
    zipf_free(&z);
    return 0;
}

/* The timed cells of a round. */
enum { C_PSD_PULL, C_KV_PULL, C_PSD_PUSH, C_KV_PUSH, C_RAW_PULL, C_RAW_PUSH, NCELLS };
/* --only's names of the cells. */
static const char *const cell_flag[NCELLS] = {"psd-pull",      "baseline-pull", "psd-push",
                                              "baseline-push", "psd-raw-pull",  "psd-raw-push"};
static const char *const cell_name[NCELLS] = {"psd pull",      "baseline pull", "psd push",
                                              "baseline push", "psd raw pull",  "psd raw push"};

typedef struct run {
    const config *c;
    const batches *b;
    ps_table *t;
    kv_client kv;
    float *grads, *out;
    pid_t pids[2 * KV_MAX_SERVERS]; /* every server process, psd's and the baseline's */
    int npids;
} run;

/* CPU seconds used so far by this process (both clients) and every server: a cell's CPU is
 * what the machine spent on it whatever else ran meanwhile (an idle server adds next to
 * nothing), so it compares the two sides' work where wall times are blurred by the load. */
static double cpu_now(const run *r)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    double s = (double)u.ru_utime.tv_sec + (double)u.ru_utime.tv_usec / 1e6 +
               (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec / 1e6;
    for (int i = 0; i < r->npids; i++)
        s += proc_cpu_s(r->pids[i]);
    return s;
}

/* Runs every batch through one cell; returns seconds or -1, and the CPU seconds it took
 * (cpu_now) in *cpu when not NULL. */
static double run_cell(run *r, int cell, double *cpu)
{
    const config *c = r->c;
    const batches *b = r->b;
    double c0 = cpu ? cpu_now(r) : 0;
    double t0 = now_s();
    for (uint32_t k = 0; k < c->batches; k++) {
        size_t n = b->ded_at[k + 1] - b->ded_at[k];
        const uint64_t *d = b->ded + b->ded_at[k];
        const int64_t *raw = b->raw + (size_t)k * c->batch;
        int rc = 0;
        switch (cell) {
        case C_PSD_PULL:
            rc = ps_table_pull(r->t, (const int64_t *)d, n, r->out);
            break;
        case C_PSD_PUSH:
            rc = ps_table_push(r->t, (const int64_t *)d, n, r->grads);
            break;
        case C_RAW_PULL:
            rc = ps_table_pull(r->t, raw, c->batch, r->out);
            break;
        case C_RAW_PUSH:
            rc = ps_table_push(r->t, raw, c->batch, r->grads);
            break;
        case C_KV_PULL:
            rc = kv_call(&r->kv, KV_PULL, d, n, NULL, r->out);
            break;
        case C_KV_PUSH:
            rc = kv_call(&r->kv, KV_PUSH, d, n, r->grads, NULL);
            break;
        }
        if (rc != 0) {
            bool kv = cell == C_KV_PULL || cell == C_KV_PUSH;
            fprintf(stderr, "%s: batch %u failed: %s\n", cell_name[cell], k,
                    kv ? "no valid reply from the baseline server" : ps_last_error());
            return -1;
        }
    }
    double t = now_s() - t0;
    if (cpu)
        *cpu = cpu_now(r) - c0;
    return t;
}

/* Pushes every id of ranks 0..rows-1 once with a zero gradient, batch at a time, to psd or to
 * the baseline (the baseline's keys sorted, as it needs them). Returns seconds, or -1. */
static double fill(run *r, bool kv)
{
    const config *c = r->c;
    size_t cap = c->batch;
    uint64_t *ids = malloc(cap * sizeof(*ids));
    float *zeros = calloc(cap * c->dim, sizeof(float));
    if (ids == NULL || zeros == NULL) {
        free(ids);
        free(zeros);
        return -1;
    }
    double t0 = now_s();
    for (uint64_t first = 0; first < c->rows; first += cap) {
        size_t n = c->rows - first < cap ? (size_t)(c->rows - first) : cap;
        for (size_t i = 0; i < n; i++)
            ids[i] = (uint64_t)zipf_rank_id(first + i);
        int rc;
        if (kv) {
            qsort(ids, n, sizeof(*ids), cmp_u64);
            rc = kv_call(&r->kv, KV_PUSH, ids, n, zeros, NULL);
        } else {
            rc = ps_table_push(r->t, (const int64_t *)ids, n, zeros);
        }
        if (rc != 0) {
            fprintf(stderr, "making the rows on %s failed: %s\n", kv ? "the baseline" : "psd",
                    kv ? "no valid reply" : ps_last_error());
            free(ids);
            free(zeros);
            return -1;
        }
    }
    free(ids);
    free(zeros);
    return now_s() - t0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, uint32_t n)
{
    qsort(v, n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static pid_t spawn_kv(int port, uint32_t dim, bool chained)
{
    pid_t pid = fork();
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char p[16], d[16];
        snprintf(p, sizeof(p), "%d", port);
        snprintf(d, sizeof(d), "%u", dim);
        execl("/proc/self/exe", "ps-kv-compare", "--kv-serve", p, d, chained ? "chained" : "open",
              (char *)NULL);
        _exit(127);
    }
    return pid;
}

static ps_client *open_client(const test_cluster *tc)
{
    char tf[1200];
    test_cluster_tf_config(tc, NULL, 0, tf, sizeof(tf));
    ps_config *cfg = NULL;
    ps_client *cl = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    ps_config_set(cfg, "cluster", tf);
    ps_config_set(cfg, "deadline-ms", "600000");
    if (ps_client_open(&cl, cfg) != PS_OK)
        fprintf(stderr, "ps_client_open: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return cl;
}

/* Pulls the first ids of batch 0 from both and compares them bit for bit. */
static int check_alike(run *r)
{
    const batches *b = r->b;
    size_t n = b->ded_at[1] - b->ded_at[0];
    size_t floats = n * r->c->dim;
    float *other = malloc(floats * sizeof(float));
    if (other == NULL || ps_table_pull(r->t, (const int64_t *)b->ded, n, r->out) != 0 ||
        kv_call(&r->kv, KV_PULL, b->ded, n, NULL, other) != 0) {
        free(other);
        fprintf(stderr, "check: a pull failed\n");
        return -1;
    }
    size_t differ = 0;
    for (size_t i = 0; i < floats; i++)
        differ += memcmp(&r->out[i], &other[i], sizeof(float)) != 0;
    free(other);
    printf("check: %zu rows pulled from both after the same pushes, %zu of %zu floats differ\n", n,
           differ, floats);
    return differ ? -1 : 0;
}

static int run_servers(const config *c, const batches *b, int nservers)
{
    test_cluster tc;
    const char *flags[] = {"--log-level", "warn", NULL};
    if (test_cluster_start(&tc, c->server_bin, nservers, flags) != 0) {
        fprintf(stderr, "cannot start %d ps-server(s) from %s\n", nservers, c->server_bin);
        return -1;
    }
    run r = {.c = c, .b = b, .kv = {.n = nservers, .dim = c->dim}};
    for (int s = 0; s < nservers; s++)
        r.pids[r.npids++] = tc.pids[s];
    pid_t kv_pids[KV_MAX_SERVERS];
    int rc = -1;
    ps_client *cl = open_client(&tc);
    r.kv.ctx = zmq_ctx_new();
    for (int s = 0; s < nservers; s++) {
        int port = test_free_port();
        kv_pids[s] = spawn_kv(port, c->dim, c->chained);
        r.pids[r.npids++] = kv_pids[s];
        test_wait_port(port, 10000);
        char url[64];
        snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
        r.kv.sock[s] = zmq_socket(r.kv.ctx, ZMQ_DEALER);
        int wait_ms = 60000; /* a baseline server that died fails the run, not hangs it */
        zmq_setsockopt(r.kv.sock[s], ZMQ_RCVTIMEO, &wait_ms, sizeof(wait_ms));
        zmq_connect(r.kv.sock[s], url);
    }
    size_t floats = (size_t)c->batch * c->dim;
    r.grads = malloc(floats * sizeof(float));
    r.out = malloc(floats * sizeof(float));
    double secs[NCELLS][64], cpus[NCELLS][64];
    ps_table_spec spec;
    char name[64];
    snprintf(name, sizeof(name), "kvcompare/%d", nservers);
    ps_table_spec_init(&spec, name, c->dim, PS_OPT_SGD);
    spec.learning_rate = LEARNING_RATE;
    if (cl == NULL || r.grads == NULL || r.out == NULL || ps_table_create(cl, &spec, &r.t) != 0) {
        fprintf(stderr, "setup failed: %s\n", ps_last_error());
        goto out;
    }
    for (size_t i = 0; i < floats; i++)
        r.grads[i] = (float)((i * 7) % 13) * 0.125f - 0.75f;
    /* Every row made by first touch on both, one pass of deduplicated pushes, then the check. */
    double fill_psd = fill(&r, false), fill_kv = fill(&r, true);
    if (fill_psd < 0 || fill_kv < 0)
        goto out;
    printf("%d server(s): %llu rows made by first touch: psd %.2f M rows/s, baseline %.2f M "
           "rows/s\n",
           nservers, (unsigned long long)c->rows, (double)c->rows / fill_psd / 1e6,
           (double)c->rows / fill_kv / 1e6);
    if (run_cell(&r, C_PSD_PUSH, NULL) < 0 || run_cell(&r, C_KV_PUSH, NULL) < 0 ||
        check_alike(&r) != 0)
        goto out;
    printf("%d server(s), load %.2f\n", nservers, loadavg());
    for (uint32_t round = 0; round < c->rounds; round++) {
        printf("  round %u:", round + 1);
        for (int i = 0; i < NCELLS; i++) {
            int cell = round % 2 ? NCELLS - 1 - i : i; /* alternate the order */
            if (c->only >= 0 && cell != c->only) {
                secs[cell][round] = cpus[cell][round] = 1;
                continue;
            }
            double s = run_cell(&r, cell, &cpus[cell][round]);
            if (s < 0)
                goto out;
            secs[cell][round] = s;
        }
        for (int cell = 0; cell < NCELLS; cell++)
            printf(" %s %.3fs", cell_name[cell], secs[cell][round]);
        printf("\n");
    }
    double rows = (double)b->ded_at[c->batches], med[NCELLS], cpu[NCELLS];
    for (int cell = 0; cell < NCELLS; cell++) {
        med[cell] = median(secs[cell], c->rounds);
        cpu[cell] = median(cpus[cell], c->rounds) / c->batches * 1e3;
    }
    printf("  medians of %u rounds (%u batches of %u ids, %.0f unique ids per batch on average; "
           "load %.2f):\n",
           c->rounds, c->batches, c->batch, rows / c->batches, loadavg());
    printf("    deduplicated pull: psd %.2f M rows/s, baseline %.2f M rows/s, psd/baseline %.2fx\n",
           rows / med[C_PSD_PULL] / 1e6, rows / med[C_KV_PULL] / 1e6,
           med[C_KV_PULL] / med[C_PSD_PULL]);
    printf("    deduplicated push: psd %.2f M rows/s, baseline %.2f M rows/s, psd/baseline %.2fx\n",
           rows / med[C_PSD_PUSH] / 1e6, rows / med[C_KV_PUSH] / 1e6,
           med[C_KV_PUSH] / med[C_PSD_PUSH]);
    printf(
        "    raw batches: psd pull %.0f batches/s (baseline deduplicated %.0f, %.2fx), push %.0f "
        "(%.0f, %.2fx)\n",
        c->batches / med[C_RAW_PULL], c->batches / med[C_KV_PULL], med[C_KV_PULL] / med[C_RAW_PULL],
        c->batches / med[C_RAW_PUSH], c->batches / med[C_KV_PUSH],
        med[C_KV_PUSH] / med[C_RAW_PUSH]);
    printf(
        "    CPU ms per batch, client and servers (median): deduplicated pull psd %.3f, baseline "
        "%.3f, baseline/psd %.2fx; push psd %.3f, baseline %.3f, %.2fx; raw batches pull %.3f "
        "(%.2fx), push %.3f (%.2fx)\n",
        cpu[C_PSD_PULL], cpu[C_KV_PULL], cpu[C_KV_PULL] / cpu[C_PSD_PULL], cpu[C_PSD_PUSH],
        cpu[C_KV_PUSH], cpu[C_KV_PUSH] / cpu[C_PSD_PUSH], cpu[C_RAW_PULL],
        cpu[C_KV_PULL] / cpu[C_RAW_PULL], cpu[C_RAW_PUSH], cpu[C_KV_PUSH] / cpu[C_RAW_PUSH]);
    rc = 0;
out:
    for (int s = 0; s < nservers; s++) {
        kv_hdr h = {.op = KV_STOP};
        if (r.kv.sock[s]) {
            zmq_send(r.kv.sock[s], &h, sizeof(h), 0);
            int linger = 0;
            zmq_setsockopt(r.kv.sock[s], ZMQ_LINGER, &linger, sizeof(linger));
            zmq_close(r.kv.sock[s]);
        }
        if (test_wait_exit(kv_pids[s], 5000) != 0)
            rc = -1;
    }
    zmq_ctx_term(r.kv.ctx);
    if (r.t)
        ps_table_free(r.t);
    if (cl)
        ps_client_close(cl);
    test_cluster_stop(&tc);
    free(r.grads);
    free(r.out);
    return rc;
}

static int parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > KV_MAX_SERVERS)
            return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return n;
}

static int usage(void)
{
    fprintf(stderr,
            "usage: ps-kv-compare --server-bin PS_SERVER [--rows N] [--dim D] [--batch B] "
            "[--batches K] [--zipf S] [--rounds R (1-64)] [--servers 1,2] [--map chained|open] "
            "[--quick]\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--kv-serve") == 0)
        return kv_serve(atoi(argv[2]), (uint32_t)atoi(argv[3]), strcmp(argv[4], "chained") == 0);
    config c = {.rows = 10000000,
                .dim = 16,
                .batch = 8192,
                .batches = 200,
                .rounds = 6,
                .zipf_s = 1.1,
                .servers = {1, 2},
                .nserver_counts = 2,
                .chained = true,
                .only = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            c.rows = 100000;
            c.batch = 1024;
            c.batches = 20;
            c.rounds = 2;
            continue;
        }
        if (v == NULL)
            return usage();
        i++;
        if (strcmp(a, "--server-bin") == 0)
            c.server_bin = v;
        else if (strcmp(a, "--rows") == 0)
            c.rows = strtoull(v, NULL, 10);
        else if (strcmp(a, "--dim") == 0)
            c.dim = (uint32_t)atoi(v);
        else if (strcmp(a, "--batch") == 0)
            c.batch = (uint32_t)atoi(v);
        else if (strcmp(a, "--batches") == 0)
            c.batches = (uint32_t)atoi(v);
        else if (strcmp(a, "--zipf") == 0)
            c.zipf_s = atof(v);
        else if (strcmp(a, "--rounds") == 0)
            c.rounds = (uint32_t)atoi(v);
        else if (strcmp(a, "--map") == 0 && (strcmp(v, "chained") == 0 || strcmp(v, "open") == 0))
            c.chained = strcmp(v, "chained") == 0;
        else if (strcmp(a, "--only") == 0) {
            for (int k = 0; k < NCELLS; k++)
                if (strcmp(v, cell_flag[k]) == 0)
                    c.only = k;
            if (c.only < 0)
                return usage();
        } else if (strcmp(a, "--servers") == 0) {
            c.nserver_counts = parse_list(v, c.servers, KV_MAX_SERVERS);
            if (c.nserver_counts < 1)
                return usage();
        } else
            return usage();
    }
    if (c.server_bin == NULL || c.rows < 1 || c.dim < 1 || c.batch < 1 || c.batches < 1 ||
        c.rounds < 1 || c.rounds > 64)
        return usage();
    batches b;
    if (make_batches(&c, &b) != 0) {
        fprintf(stderr, "out of memory making the batches\n");
        return 1;
    }
    printf("ps-kv-compare: %llu rows of dim %u, SGD, %u batches of %u ids Zipf(%.2f), one request "
           "in flight, baseline map %s\n",
           (unsigned long long)c.rows, c.dim, c.batches, c.batch, c.zipf_s,
           c.chained ? "chained (as unordered_map)" : "open addressing");
    int rc = 0;
    for (int i = 0; i < c.nserver_counts && rc == 0; i++)
        rc = run_servers(&c, &b, c.servers[i]);
    free(b.raw);
    free(b.ded);
    free(b.ded_at);
    return rc ? 1 : 0;
}
