/* Unit tests for server/table.c (sparse tables) and the per-row pieces it uses: the row
 * initializer (initializer_fill_row) and the FTRL row of the optimizer registry. Every
 * optimizer is checked against a naive per-id reference loop written here. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "placement.h"
#include "row_dtype.h"
#include "table.h"
#include "table_index.h"

static table_spec base_spec(const char *name, uint32_t dim, optimizer_kind kind)
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
    return s;
}

static table *make(const table_spec *s)
{
    char err[256] = "";
    table *t = (table *)1;
    int rc = table_create(s, &t, err, sizeof(err));
    if (rc != TABLE_OK)
        print_error("table_create: %s\n", err);
    assert_int_equal(rc, TABLE_OK);
    assert_non_null(t);
    return t;
}

/* table_create must refuse s with TABLE_INVALID and a message containing `what`. */
static void expect_bad_spec(const table_spec *s, const char *what)
{
    char err[256] = "";
    table *t = (table *)1;
    assert_int_equal(table_create(s, &t, err, sizeof(err)), TABLE_INVALID);
    assert_null(t);
    if (strstr(err, what) == NULL) {
        print_error("message \"%s\" does not name \"%s\"\n", err, what);
        fail();
    }
}

static void push_ok(table *t, const int64_t *ids, size_t n, const float *g, int64_t now)
{
    char err[256] = "";
    int rc = table_push(t, ids, n, g, now, err, sizeof(err));
    if (rc != 0)
        print_error("table_push: %s\n", err);
    assert_int_equal(rc, 0);
}

static void init_row(const table *t, const table_spec *s, int64_t id, float *out)
{
    (void)t;
    initializer_fill_row(&s->init, placement_hash(s->name), id, out, s->dim);
}

/* True when id has a row (looked up in a copy of its partition). */
static bool has_row(table *t, int64_t id)
{
    table_rows rows;
    assert_int_equal(table_copy_partition(t, table_partition_of(t, id), &rows), 0);
    bool found = false;
    for (size_t i = 0; i < rows.n; i++)
        found |= rows.ids[i] == id;
    table_rows_free(&rows);
    return found;
}

/* ---- the row initializer ---- */

static void test_initializer_rows_are_pure(void **state)
{
    (void)state;
    initializer_params p = {.kind = INITIALIZER_UNIFORM, .a = -1.0, .b = 1.0, .seed = 7};
    const int64_t ids[] = {0, 1, -1, INT64_MAX, INT64_MIN, 123456789012345LL};
    float a[8], b[8];
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        initializer_fill_row(&p, placement_hash("emb"), ids[i], a, 8);
        initializer_fill_row(&p, placement_hash("emb"), ids[i], b, 8);
        assert_memory_equal(a, b, sizeof(a));
        for (int j = 0; j < 8; j++)
            assert_true(a[j] >= -1.0f && a[j] < 1.0f);
    }
    /* Known answers, computed by an independent Python transcription of the documented
     * formulas: the same row in every process and build (UNIFORM is plain double arithmetic
     * on the splitmix64 bits, no libm). */
    assert_true(initializer_row_seed(7, placement_hash("emb"), 0) ==
                initializer_row_seed(7, placement_hash("emb"), 0));
    assert_true(initializer_row_seed(7, 1, 5) != initializer_row_seed(7, 1, 6));
    assert_true(initializer_row_seed(7, 1, 5) != initializer_row_seed(8, 1, 5));
    assert_true(initializer_row_seed(7, 1, 5) != initializer_row_seed(7, 2, 5));
    assert_true(initializer_row_seed(0, 0, 0) == UINT64_C(0x33fe8bd4f9c57863));
    initializer_fill_row(&p, placement_hash("emb"), 3, a, 2);
    assert_true(a[0] == 0x1.97ba64p-4f);
    assert_true(a[1] == 0x1.1295cep-1f);

    /* Different tables, ids and seeds give different rows. */
    initializer_fill_row(&p, placement_hash("emb"), 1, a, 8);
    initializer_fill_row(&p, placement_hash("emb2"), 1, b, 8);
    assert_memory_not_equal(a, b, sizeof(a));
    initializer_fill_row(&p, placement_hash("emb"), 2, b, 8);
    assert_memory_not_equal(a, b, sizeof(a));

    /* NORMAL: finite, and a mean near a over many rows. */
    initializer_params n = {.kind = INITIALIZER_NORMAL, .a = 0.25, .b = 0.1, .seed = 3};
    double sum = 0;
    for (int64_t id = -5000; id < 5000; id++) {
        initializer_fill_row(&n, 99, id * 1000003, a, 1);
        assert_true(isfinite(a[0]));
        sum += a[0];
    }
    assert_true(fabs(sum / 10000 - 0.25) < 0.01);
}

/* ---- the index alone ---- */

/* Random inserts and deletes at up to 3/4 load against a plain array, on a 64-entry index so
 * that probe runs wrap around its end and backward shifts cross it. */
static void test_index_against_reference(void **state)
{
    (void)state;
    enum { CAP = 64, IDS = 200, OPS = 200000 };
    table_index ix;
    assert_int_equal(table_index_init(&ix, CAP), 0);
    uint32_t ref[IDS] = {0}; /* slot + 1 by id; 0: absent */
    uint64_t r = 88172645463325252ull;
    for (int op = 0; op < OPS; op++) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        int64_t id = (int64_t)(r % IDS) - IDS / 2; /* negative ids too */
        uint32_t *want = &ref[id + IDS / 2];
        uint64_t h = table_id_hash(id);
        uint32_t pos = table_index_probe(&ix, id, h);
        assert_int_equal(ix.e[pos].slot1, *want);
        if (*want != 0) {
            table_index_delete_at(&ix, pos);
            *want = 0;
        } else if (!table_index_full(&ix)) {
            *want = (uint32_t)op + 1;
            table_index_put(&ix, pos, id, *want);
        }
        if (op % 1000 == 0) {
            uint32_t n = 0;
            for (int k = 0; k < IDS; k++) {
                int64_t kid = k - IDS / 2;
                assert_int_equal(table_index_find(&ix, kid, table_id_hash(kid)), ref[k]);
                n += ref[k] != 0;
            }
            assert_int_equal(ix.count, n);
        }
    }
    /* Growth keeps every entry. */
    assert_int_equal(table_index_grow(&ix), 0);
    assert_int_equal(ix.cap, 2 * CAP);
    for (int k = 0; k < IDS; k++)
        assert_int_equal(table_index_find(&ix, k - IDS / 2, table_id_hash(k - IDS / 2)), ref[k]);
    table_index_fini(&ix);
    assert_int_equal(table_index_cap_for(0), 16);
    assert_int_equal(table_index_cap_for(12), 16);
    assert_int_equal(table_index_cap_for(13), 32);
    assert_int_equal(table_index_cap_for(UINT64_MAX / 8), UINT32_C(1) << 31);
}

/* ---- basic storage ---- */

static void test_pull_synthesizes_without_making(void **state)
{
    (void)state;
    table_spec s = base_spec("t", 4, OPTIMIZER_SGD);
    table *t = make(&s);
    int64_t ids[3] = {5, -9, 5};
    float out[12], want[4];
    table_pull(t, ids, 3, out);
    init_row(t, &s, 5, want);
    assert_memory_equal(out, want, sizeof(want));
    assert_memory_equal(out + 8, want, sizeof(want));
    init_row(t, &s, -9, want);
    assert_memory_equal(out + 4, want, sizeof(want));
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.lookups, 3);
    assert_int_equal(st.lookup_misses, 3);
    table_destroy(t);
    table_destroy(NULL);
}

static void test_growth_and_values(void **state)
{
    (void)state;
    table_spec s = base_spec("grow", 3, OPTIMIZER_SGD);
    s.opt.learning_rate = 0.5f;
    table *t = make(&s);
    enum { N = 100000, B = 1000 };
    int64_t ids[B];
    float g[B * 3];
    for (int base = 0; base < N; base += B) {
        for (int i = 0; i < B; i++) {
            ids[i] = (int64_t)(base + i) * 7919 - 50000; /* negative ids too */
            for (int k = 0; k < 3; k++)
                g[i * 3 + k] = (float)k + 1.0f;
        }
        push_ok(t, ids, B, g, 1);
    }
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, N);
    assert_int_equal(st.rows_created, N);
    assert_true(st.index_growths > 0);
    assert_int_equal(st.row_bytes % 8, 0); /* 24 + 12 bytes, rounded: aligned headers */
    assert_int_equal(st.row_bytes, 40);
    for (int64_t i = 0; i < N; i += 997) {
        int64_t id = i * 7919 - 50000;
        float got[3], want[3];
        table_pull(t, &id, 1, got);
        init_row(t, &s, id, want);
        for (int k = 0; k < 3; k++)
            assert_true(got[k] == want[k] - 0.5f * ((float)k + 1.0f));
    }
    table_destroy(t);
}

/* Rows so wide that a slab holds one, two or five of them (one partition, so that its rows
 * span many slabs): every row is found where it was made, pushed twice (the second push moves
 * each row to the front of the LRU order across slabs) and pulled back. */
static void test_wide_rows_few_per_slab(void **state)
{
    (void)state;
    const uint32_t dims[] = {4000, 1500, 700}; /* 16024, 6024, 2824 bytes a row */
    enum { N = 23 };
    for (size_t d = 0; d < sizeof(dims) / sizeof(dims[0]); d++) {
        uint32_t dim = dims[d];
        table_spec s = base_spec("wide", dim, OPTIMIZER_SGD);
        s.opt.learning_rate = 0.25f;
        s.partitions = 1;
        table *t = make(&s);
        int64_t ids[N];
        float *g = malloc((size_t)N * dim * sizeof(float));
        float *got = malloc((size_t)N * dim * sizeof(float)), *want = malloc(dim * sizeof(float));
        assert_non_null(g);
        assert_non_null(got);
        assert_non_null(want);
        for (int i = 0; i < N; i++) {
            ids[i] = (int64_t)i * 1000003 - 7;
            for (uint32_t k = 0; k < dim; k++)
                g[(size_t)i * dim + k] = (float)((i + k) % 5);
        }
        push_ok(t, ids, N, g, 1);
        push_ok(t, ids, N, g, 2);
        table_pull(t, ids, N, got);
        for (int i = 0; i < N; i++) {
            init_row(t, &s, ids[i], want);
            for (uint32_t k = 0; k < dim; k++) {
                float gk = (float)((i + k) % 5);
                assert_true(got[(size_t)i * dim + k] == (want[k] - 0.25f * gk) - 0.25f * gk);
            }
        }
        table_stats st;
        table_stats_get(t, &st);
        assert_int_equal(st.rows, N);
        free(g);
        free(got);
        free(want);
        table_destroy(t);
    }
}

/* expected_rows sizes the indexes at creation: no growth while filling up to it. */
static void test_expected_rows_presized(void **state)
{
    (void)state;
    table_spec s = base_spec("presized", 2, OPTIMIZER_SGD);
    s.expected_rows = 50000;
    table *t = make(&s);
    enum { N = 50000, B = 5000 };
    int64_t ids[B];
    float g[B * 2];
    memset(g, 0, sizeof(g));
    for (int base = 0; base < N; base += B) {
        for (int i = 0; i < B; i++)
            ids[i] = base + i;
        push_ok(t, ids, B, g, 1);
    }
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, N);
    assert_int_equal(st.index_growths, 0);
    table_destroy(t);
    s.expected_rows = 0; /* the same rows from a small index grow it */
    t = make(&s);
    for (int base = 0; base < N; base += B) {
        for (int i = 0; i < B; i++)
            ids[i] = base + i;
        push_ok(t, ids, B, g, 1);
    }
    table_stats_get(t, &st);
    assert_true(st.index_growths >= 64);
    table_destroy(t);
    s.expected_rows = (UINT64_C(1) << 36) + 64 * 1024; /* 2^30 + 1024 a partition */
    expect_bad_spec(&s, "expected_rows");
}

static void test_removal_and_slot_reuse(void **state)
{
    (void)state;
    table_spec s = base_spec("rm", 8, OPTIMIZER_ADAGRAD);
    s.partitions = 1; /* the new ids land where the removed ones were freed */
    table *t = make(&s);
    enum { N = 20000 };
    int64_t *ids = malloc(N * sizeof(*ids));
    float *g = calloc((size_t)N * 8, sizeof(float));
    for (int i = 0; i < N; i++)
        ids[i] = i;
    for (int i = 0; i < N * 8; i++)
        g[i] = 1.0f;
    push_ok(t, ids, N, g, 1);
    table_stats full;
    table_stats_get(t, &full);
    assert_int_equal(full.rows, N);

    /* Remove the even ids (and one absent id). */
    int64_t *even = malloc((N / 2 + 1) * sizeof(*even));
    for (int i = 0; i < N / 2; i++)
        even[i] = 2 * i;
    even[N / 2] = -77;
    assert_int_equal(table_remove(t, even, N / 2 + 1), N / 2);
    assert_int_equal(table_remove(t, even, 1), 0);
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, N / 2);
    assert_int_equal(st.removed, N / 2);
    float got[8], want[8];
    int64_t id = 10;
    table_pull(t, &id, 1, got);
    init_row(t, &s, 10, want);
    assert_memory_equal(got, want, sizeof(want)); /* removed: the initializer's row again */
    id = 11;
    table_pull(t, &id, 1, got);
    assert_memory_not_equal(got, (init_row(t, &s, 11, want), want), sizeof(want));

    /* As many new rows reuse the freed slots: no new slab, same bytes. */
    for (int i = 0; i < N / 2; i++)
        even[i] = N + i;
    push_ok(t, even, N / 2, g, 2);
    table_stats after;
    table_stats_get(t, &after);
    assert_int_equal(after.rows, N);
    assert_true(after.bytes == full.bytes);
    free(ids);
    free(even);
    free(g);
    table_destroy(t);
}

static void test_memory_accounting(void **state)
{
    (void)state;
    table_spec s = base_spec("mem", 16, OPTIMIZER_ADAM);
    table *t = make(&s);
    table_stats empty, st;
    table_stats_get(t, &empty);
    assert_true(empty.bytes > 0);
    /* 24-byte header + 16 parameters + 2 slots of 16 (m, v) + the row's step count, rounded
     * to 8 bytes. */
    assert_int_equal(empty.row_bytes, 24 + 3 * 16 * 4 + 8);
    assert_int_equal(table_row_floats(t), 49);
    enum { N = 50000 };
    int64_t *ids = malloc(N * sizeof(*ids));
    float *g = calloc((size_t)N * 16, sizeof(float));
    for (int i = 0; i < N; i++)
        ids[i] = (int64_t)i << 20;
    push_ok(t, ids, N, g, 1);
    table_stats_get(t, &st);
    uint64_t raw = (uint64_t)N * st.row_bytes;
    assert_true(st.bytes >= raw);
    /* Slabs are filled in order, the index at most 2/3 empty: well under 1.5x the rows. */
    assert_true(st.bytes < raw + raw / 2);
    free(ids);
    free(g);
    table_destroy(t);
}

/* ---- duplicates, optimizers against a naive loop ---- */

static void test_duplicates_summed(void **state)
{
    (void)state;
    table_spec s = base_spec("dup", 2, OPTIMIZER_ADAM);
    table *t = make(&s);
    int64_t ids[4] = {5, 7, 5, 5};
    float g[8] = {1, 2, 10, 20, 0.5f, 0.25f, -3, 4};
    push_ok(t, ids, 4, g, 1);
    /* One Adam step with the summed gradient {-1.5, 6.25}: at t = 1 the step is
     * lr * g / (|g| + eps'), i.e. lr * sign(g) to float precision. */
    float got[2], want[2];
    table_pull(t, ids, 1, got);
    init_row(t, &s, 5, want);
    assert_true(fabsf(got[0] - (want[0] + 0.001f)) < 1e-6f);
    assert_true(fabsf(got[1] - (want[1] - 0.001f)) < 1e-6f);
    table_rows rows;
    assert_int_equal(table_copy_partition(t, table_partition_of(t, 5), &rows), 0);
    for (size_t i = 0; i < rows.n; i++) {
        if (rows.ids[i] == 5) {
            assert_true(rows.floats[i * rows.row_floats + 6] == 1.0f); /* the row's t: one step */
            assert_true(rows.floats[i * rows.row_floats + 2] == (1.0f - 0.9f) * -1.5f);
        }
    }
    table_rows_free(&rows);
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 2);
    assert_int_equal(st.rows_updated, 2);
    table_destroy(t);
}

#define REF_IDS 40
#define REF_DIM 5

/* The reference: each id's parameters and slots updated one element at a time, in double
 * for the arithmetic, by the formulas of optimizer.h. */
typedef struct ref_row {
    bool made;
    double w[REF_DIM], s[3][REF_DIM];
} ref_row;

static void ref_apply(const optimizer_params *p, ref_row *r, const double *g)
{
    double lr = p->learning_rate;
    if (p->kind == OPTIMIZER_ROWWISE_ADAGRAD) {
        /* One accumulator (s[0][0]) of the row's mean squared gradient. */
        double ms = 0;
        for (int k = 0; k < REF_DIM; k++)
            ms += g[k] * g[k];
        r->s[0][0] += ms / REF_DIM;
        for (int k = 0; k < REF_DIM; k++)
            r->w[k] -= lr / (sqrt(r->s[0][0]) + p->epsilon) * g[k];
        return;
    }
    for (int k = 0; k < REF_DIM; k++) {
        double gi = g[k], *w = &r->w[k];
        switch (p->kind) {
        case OPTIMIZER_SGD:
            *w -= lr * gi;
            break;
        case OPTIMIZER_MOMENTUM:
            r->s[0][k] = p->momentum * r->s[0][k] + gi;
            *w -= lr * r->s[0][k];
            break;
        case OPTIMIZER_ADAGRAD:
            r->s[0][k] += gi * gi;
            *w -= lr * gi / (sqrt(r->s[0][k]) + p->epsilon);
            break;
        case OPTIMIZER_ADAMW:
            *w *= 1.0 - lr * p->weight_decay;
            /* fall through */
        case OPTIMIZER_ADAM: {
            double t = r->s[2][k] += 1.0;
            r->s[0][k] = p->beta1 * r->s[0][k] + (1 - p->beta1) * gi;
            r->s[1][k] = p->beta2 * r->s[1][k] + (1 - p->beta2) * gi * gi;
            double mh = r->s[0][k] / (1 - pow(p->beta1, t));
            double vh = r->s[1][k] / (1 - pow(p->beta2, t));
            *w -= lr * mh / (sqrt(vh) + p->epsilon);
            break;
        }
        case OPTIMIZER_FTRL: {
            double *z = &r->s[0][k], *n = &r->s[1][k];
            double sigma = (sqrt(*n + gi * gi) - sqrt(*n)) / lr;
            *z += gi - sigma * *w;
            *n += gi * gi;
            if (fabs(*z) <= p->l1)
                *w = 0;
            else
                *w = -(*z - (*z > 0 ? p->l1 : -p->l1)) / ((p->ftrl_beta + sqrt(*n)) / lr + p->l2);
            break;
        }
        default:
            break;
        }
    }
}

static void check_against_reference(optimizer_kind kind)
{
    table_spec s = base_spec("ref", REF_DIM, kind);
    if (kind == OPTIMIZER_FTRL) {
        s.opt.l1 = 0.05f;
        s.opt.l2 = 0.1f;
    }
    if (kind == OPTIMIZER_MOMENTUM)
        s.opt.learning_rate = 0.05f;
    table *t = make(&s);
    ref_row ref[REF_IDS];
    memset(ref, 0, sizeof(ref));
    unsigned seed = 12345u + (unsigned)kind;
    enum { BATCH = 30, STEPS = 25 };
    for (int step = 0; step < STEPS; step++) {
        int64_t ids[BATCH];
        float g[BATCH * REF_DIM];
        double sum[REF_IDS][REF_DIM];
        bool in[REF_IDS] = {false};
        memset(sum, 0, sizeof(sum));
        for (int i = 0; i < BATCH; i++) {
            seed = seed * 1103515245u + 12345u;
            int id = (int)((seed >> 16) % REF_IDS);
            ids[i] = (int64_t)id * 1000 - 20000;
            for (int k = 0; k < REF_DIM; k++) {
                seed = seed * 1103515245u + 12345u;
                /* Multiples of 1/64 in [-1, 1): duplicate sums are exact in float. */
                g[i * REF_DIM + k] = (float)((int)((seed >> 16) % 128) - 64) / 64.0f;
                sum[id][k] += g[i * REF_DIM + k];
            }
            in[id] = true;
        }
        push_ok(t, ids, BATCH, g, step);
        for (int id = 0; id < REF_IDS; id++) {
            if (!in[id])
                continue; /* lazy: rows outside the batch do not change */
            if (!ref[id].made) {
                float w0[REF_DIM];
                init_row(t, &s, (int64_t)id * 1000 - 20000, w0);
                for (int k = 0; k < REF_DIM; k++) {
                    ref[id].w[k] = w0[k];
                    ref[id].s[0][k] = kind == OPTIMIZER_ADAGRAD || kind == OPTIMIZER_ROWWISE_ADAGRAD
                                          ? s.opt.initial_accumulator
                                          : 0;
                }
                ref[id].made = true;
            }
            ref_apply(&s.opt, &ref[id], sum[id]);
        }
    }
    for (int id = 0; id < REF_IDS; id++) {
        int64_t tid = (int64_t)id * 1000 - 20000;
        float got[REF_DIM], w0[REF_DIM];
        table_pull(t, &tid, 1, got);
        init_row(t, &s, tid, w0);
        for (int k = 0; k < REF_DIM; k++) {
            double want = ref[id].made ? ref[id].w[k] : w0[k];
            double tol = 2e-5 * (fabs(want) > 1 ? fabs(want) : 1);
            if (!(fabs(got[k] - want) <= tol)) {
                print_error("%s: id %d [%d] = %.9g, want %.9g\n", optimizer_name(kind), id, k,
                            (double)got[k], want);
                fail();
            }
        }
    }
    table_destroy(t);
}

static void test_optimizers_against_reference(void **state)
{
    (void)state;
    const optimizer_kind kinds[] = {
        OPTIMIZER_SGD,   OPTIMIZER_MOMENTUM, OPTIMIZER_ADAGRAD,        OPTIMIZER_ADAM,
        OPTIMIZER_ADAMW, OPTIMIZER_FTRL,     OPTIMIZER_ROWWISE_ADAGRAD};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
        check_against_reference(kinds[i]);
}

static void test_ftrl_registry_row(void **state)
{
    (void)state;
    optimizer_params p;
    optimizer_params_default(&p, OPTIMIZER_FTRL);
    assert_string_equal(optimizer_name(OPTIMIZER_FTRL), "ftrl");
    optimizer_kind k;
    assert_int_equal(optimizer_parse("FTRL", &k), 0);
    assert_int_equal(k, OPTIMIZER_FTRL);
    assert_int_equal(optimizer_slot_count(OPTIMIZER_FTRL), 2);
    assert_true(p.learning_rate == 0.05f && p.ftrl_beta == 1.0f && p.l1 == 0.0f);
    assert_int_equal(optimizer_validate(&p, NULL, 0), 0);
    assert_false(optimizer_on_wire(OPTIMIZER_FTRL));
    assert_true(optimizer_on_wire(OPTIMIZER_ADAMW));
    char err[128];
    p.l1 = -1.0f;
    assert_int_equal(optimizer_validate(&p, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "l1"));
    p.l1 = 0.0f;
    p.ftrl_beta = NAN;
    assert_int_equal(optimizer_validate(&p, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "ftrl_beta"));
    /* Strong L1 keeps a weight at exactly 0 (sparsity). */
    optimizer_params_default(&p, OPTIMIZER_FTRL);
    p.l1 = 10.0f;
    float w = 0.0f, z = 0.0f, n = 0.0f, g = 0.3f;
    float *slots[2] = {&z, &n};
    optimizer_apply(&p, &w, &g, slots, 1);
    assert_true(w == 0.0f && z == 0.3f && n == 0.3f * 0.3f);
}

/* ---- admission, eviction ---- */

static void test_min_count_admission(void **state)
{
    (void)state;
    table_spec s = base_spec("adm", 2, OPTIMIZER_SGD);
    s.min_count = 3;
    table *t = make(&s);
    int64_t ids[2] = {9, 9};
    float g[4] = {1, 1, 1, 1}, got[2], want[2];
    init_row(t, &s, 9, want);
    push_ok(t, ids, 2, g, 1); /* a batch counts an id once */
    push_ok(t, ids, 1, g, 2);
    table_pull(t, ids, 1, got);
    assert_memory_equal(got, want, sizeof(want));
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.pushes_counted, 2);
    push_ok(t, ids, 1, g, 3); /* the third push makes the row and applies */
    table_pull(t, ids, 1, got);
    assert_true(got[0] == want[0] - 0.01f * 1.0f);
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 1);
    assert_int_equal(st.rows_created, 1);
    assert_true(st.bytes > 0);
    table_destroy(t);
}

static void test_max_rows_evicts_least_recently_updated(void **state)
{
    (void)state;
    table_spec s = base_spec("lru", 1, OPTIMIZER_SGD);
    s.max_rows = 3;
    s.partitions = 1; /* one partition: exact LRU over the table */
    table *t = make(&s);
    float g[1] = {1};
    for (int64_t id = 1; id <= 3; id++)
        push_ok(t, &id, 1, g, id);
    int64_t one = 1, four = 4, five = 5;
    push_ok(t, &one, 1, g, 4);  /* 1 is now the most recent: 2 is the oldest */
    push_ok(t, &four, 1, g, 5); /* evicts 2 */
    assert_false(has_row(t, 2));
    assert_true(has_row(t, 1) && has_row(t, 3) && has_row(t, 4));
    push_ok(t, &five, 1, g, 6); /* evicts 3 */
    assert_false(has_row(t, 3));
    assert_true(has_row(t, 1) && has_row(t, 4) && has_row(t, 5));
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 3);
    assert_int_equal(st.evicted_max_rows, 2);
    assert_int_equal(st.rows_created, 5);
    table_destroy(t);

    /* 64 partitions: the cap holds over the table. */
    s.partitions = 0;
    s.max_rows = 1000;
    t = make(&s);
    for (int64_t id = 0; id < 5000; id++)
        push_ok(t, &id, 1, g, id);
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 1000); /* every partition full at its share */
    assert_int_equal(st.evicted_max_rows, 5000 - 1000);
    assert_int_equal(st.pushes_counted, 0);
    table_destroy(t);

    /* max_rows below the partition count: fewer partitions, each keeping a row at least, so
     * every push of a new id into the full table applies (a batch of them too). */
    s.max_rows = 10;
    s.init.kind = INITIALIZER_ZEROS;
    t = make(&s);
    assert_int_equal(table_partitions(t), 8);
    int64_t many[200];
    float gs[200];
    for (int i = 0; i < 200; i++) {
        many[i] = 1000 + i;
        gs[i] = 1.0f;
    }
    push_ok(t, many, 200, gs, 1);
    for (int64_t id = 5000; id < 5100; id++) {
        float row;
        push_ok(t, &id, 1, g, 2);
        table_pull(t, &id, 1, &row);
        assert_true(row == -s.opt.learning_rate);
    }
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 10);
    assert_int_equal(st.pushes_counted, 0);
    assert_int_equal(st.rows_created, 300);
    assert_int_equal(st.rows_updated, 300);
    table_destroy(t);
}

static void test_ttl_sweep(void **state)
{
    (void)state;
    table_spec s = base_spec("ttl", 2, OPTIMIZER_SGD);
    s.ttl_ms = 100;
    table *t = make(&s);
    float g[20] = {0};
    int64_t old[5] = {1, 2, 3, 4, 5}, young[5] = {6, 7, 8, 9, 10};
    push_ok(t, old, 5, g, 1000);
    push_ok(t, young, 5, g, 1050);
    assert_int_equal(table_sweep(t, 1100), 0); /* exactly ttl old: kept */
    assert_int_equal(table_sweep(t, 1120), 5);
    assert_false(has_row(t, 3));
    assert_true(has_row(t, 8));
    push_ok(t, young, 1, g, 1140); /* 6 touched again */
    assert_int_equal(table_sweep(t, 1200), 4);
    assert_true(has_row(t, 6));
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 1);
    assert_int_equal(st.evicted_ttl, 9);
    table_destroy(t);
    s.ttl_ms = 0;
    t = make(&s);
    push_ok(t, old, 5, g, 0);
    assert_int_equal(table_sweep(t, INT64_MAX), 0);
    table_destroy(t);
}

/* ---- bad input ---- */

static void test_bad_specs_and_gradients(void **state)
{
    (void)state;
    char err[256];
    table_spec s = base_spec("bad", 0, OPTIMIZER_SGD);
    expect_bad_spec(&s, "dim = 0");
    s.dim = TABLE_MAX_DIM + 1;
    expect_bad_spec(&s, "dim");
    s.dim = 4;
    s.name = "";
    expect_bad_spec(&s, "name");
    s.name = "bad";
    s.init.kind = INITIALIZER_GLOROT_UNIFORM;
    expect_bad_spec(&s, "glorot");
    s.init.kind = INITIALIZER_ZEROS;
    s.partitions = 3;
    expect_bad_spec(&s, "partitions");
    s.partitions = 0;
    s.ttl_ms = -1;
    expect_bad_spec(&s, "ttl");
    s.ttl_ms = 0;
    s.opt.learning_rate = -1;
    expect_bad_spec(&s, "learning_rate");
    s.opt.learning_rate = 0.1f;
    s.min_count = 70000;
    expect_bad_spec(&s, "min_count");
    s.min_count = 0;

    table *t = make(&s);
    int64_t ids[2] = {1, 2};
    float g[8] = {1, 1, 1, 1, 1, 1, INFINITY, 1};
    assert_int_equal(table_push(t, ids, 2, g, 1, err, sizeof(err)), TABLE_INVALID);
    assert_non_null(strstr(err, "id 2"));
    g[6] = NAN;
    assert_int_equal(table_push(t, ids, 2, g, 1, err, sizeof(err)), TABLE_INVALID);
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 0); /* nothing applied */
    assert_int_equal(table_push(t, ids, 0, NULL, 1, err, sizeof(err)), 0);
    table_rows rows;
    assert_int_equal(table_copy_partition(t, 64, &rows), -1);
    table_destroy(t);
}

/* ---- the memory budget ---- */

typedef struct test_budget {
    uint64_t cap, used, refusals;
} test_budget;

/* Called under one partition's lock; the tests below push from one thread. */
static bool budget_take_cb(void *arg, uint64_t bytes)
{
    test_budget *b = arg;
    if (b->used + bytes > b->cap) {
        b->refusals++;
        return false;
    }
    b->used += bytes;
    return true;
}

static void budget_give_cb(void *arg, uint64_t bytes)
{
    test_budget *b = arg;
    assert_true(bytes <= b->used);
    b->used -= bytes;
}

/* A logical budget (replicated groups) counts rows, not allocations: a table that removed
 * rows (their slots kept for reuse) and a compact one holding the same rows in the same order
 * hold the same bytes, refuse at the same row and evict the same rows. */
static void test_logical_budget_alike(void **state)
{
    (void)state;
    table_spec s = base_spec("logical", 4, OPTIMIZER_SGD);
    s.partitions = 4;
    s.ttl_ms = 100;
    test_budget ba = {.cap = UINT64_MAX}, bb = {.cap = UINT64_MAX};
    s.budget =
        (table_budget){.take = budget_take_cb, .give = budget_give_cb, .arg = &ba, .logical = true};
    table *a = make(&s);
    s.budget.arg = &bb;
    table *b = make(&s);
    assert_true(ba.used == bb.used);
    enum { B = 200 };
    int64_t ids[B];
    float g[B * 4];
    for (int i = 0; i < B * 4; i++)
        g[i] = 1.0f;
    /* a: 3,000 rows that expire, then 200 that stay; b: only the 200. */
    for (int base = 0; base < 3000; base += B) {
        for (int i = 0; i < B; i++)
            ids[i] = base + i;
        push_ok(a, ids, B, g, 0);
    }
    for (int i = 0; i < B; i++)
        ids[i] = 3000 + i;
    push_ok(a, ids, B, g, 1000);
    push_ok(b, ids, B, g, 1000);
    assert_int_equal(table_sweep(a, 1050), 3000);
    table_stats sa, sb;
    table_stats_get(a, &sa);
    table_stats_get(b, &sb);
    assert_int_equal(sa.rows, sb.rows);
    assert_true(sa.bytes > sb.bytes); /* a keeps its slabs and index */
    assert_true(ba.used == bb.used);  /* but counts only its rows */
    /* Room for about 600 rows more each: new rows past it evict the same old ones. */
    uint64_t used0 = ba.used;
    ba.cap = bb.cap = used0 + 600 * (16 + 4 * 4 + 24 + 8);
    for (int base = 4000; base < 8000; base += B) {
        for (int i = 0; i < B; i++)
            ids[i] = base + i;
        push_ok(a, ids, B, g, 1000 + base);
        push_ok(b, ids, B, g, 1000 + base);
        assert_true(ba.used == bb.used && ba.used <= ba.cap);
    }
    table_stats_get(a, &sa);
    table_stats_get(b, &sb);
    assert_true(sa.evicted_memory > 0);
    assert_int_equal(sa.evicted_memory, sb.evicted_memory);
    assert_int_equal(sa.rows, sb.rows);
    for (int64_t id = 3000; id < 8000; id += 7)
        assert_true(has_row(a, id) == has_row(b, id));
    table_destroy(a);
    table_destroy(b);
    assert_true(ba.used == 0 && bb.used == 0);
}

static void test_memory_budget(void **state)
{
    (void)state;
    table_spec s = base_spec("budget", 4, OPTIMIZER_SGD);
    s.partitions = 1;
    test_budget b = {.cap = UINT64_MAX};
    s.budget = (table_budget){.take = budget_take_cb, .give = budget_give_cb, .arg = &b};
    table *t = make(&s);
    table_stats st;
    table_stats_get(t, &st);
    assert_true(b.used == st.bytes); /* every byte held was asked for */
    uint64_t empty = st.bytes;
    table_destroy(t);
    assert_true(b.used == 0); /* and given back */

    /* Room for about two slabs: new rows keep coming, the oldest make room. */
    b = (test_budget){.cap = empty + 100 * 1024};
    t = make(&s);
    enum { B = 100, N = 10000 };
    int64_t ids[B];
    float g[B * 4];
    for (int i = 0; i < B * 4; i++)
        g[i] = 1.0f;
    for (int base = 0; base < N; base += B) {
        for (int i = 0; i < B; i++)
            ids[i] = base + i;
        push_ok(t, ids, B, g, base);
        table_stats_get(t, &st);
        assert_true(b.used == st.bytes && b.used <= b.cap);
    }
    assert_true(b.refusals > 0);
    assert_true(st.evicted_memory > 0);
    assert_int_equal(st.rows + st.evicted_memory, N);
    assert_int_equal(st.rows_refused, 0);
    if (!(st.rows >= 1024 && st.rows < N))
        fail_msg("rows %llu", (unsigned long long)st.rows);
    assert_true(has_row(t, N - 1));
    assert_false(has_row(t, 0)); /* the least recently updated went first */
    table_destroy(t);
    assert_true(b.used == 0);

    /* Room for three slabs (each the 357 rows of 40 bytes and their bitmap that fit in 14 KiB)
     * and an index of 1024 entries, not 2048: the index may not grow past 3/4 of 1024, so the
     * table settles at 768 rows, the oldest giving their index entries to the new ones. */
    b = (test_budget){.cap = empty + 8 * sizeof(void *) + 3 * (357 * 40 + 6 * 8) +
                             (1024 - 16) * 12 + 1000};
    t = make(&s);
    for (int base = 0; base < N; base += B) {
        for (int i = 0; i < B; i++)
            ids[i] = base + i;
        push_ok(t, ids, B, g, base);
    }
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 768);
    assert_int_equal(st.rows + st.evicted_memory, N);
    assert_true(b.used == st.bytes && b.used <= b.cap);
    assert_true(has_row(t, N - 1));
    assert_false(has_row(t, N - 769));
    assert_true(has_row(t, N - 768));
    table_destroy(t);
    assert_true(b.used == 0);

    /* No room beyond the empty table and nothing to evict: the row is refused, named. */
    s.partitions = 0;
    b = (test_budget){.cap = UINT64_MAX};
    t = make(&s);
    table_stats_get(t, &st);
    b.cap = b.used;
    char err[256] = "";
    int64_t id = 77;
    assert_int_equal(table_push(t, &id, 1, g, 1, err, sizeof(err)), TABLE_LIMIT);
    assert_non_null(strstr(err, "budget"));
    assert_non_null(strstr(err, "memory limit"));
    assert_non_null(strstr(err, "77"));
    table_stats_get(t, &st);
    assert_int_equal(st.rows, 0);
    assert_int_equal(st.rows_refused, 1);
    float row[4], want[4];
    table_pull(t, &id, 1, row);
    init_row(t, &s, id, want);
    assert_memory_equal(row, want, sizeof(want));
    table_destroy(t);
    assert_true(b.used == 0);

    /* Not even the empty table fits. */
    b = (test_budget){.cap = 100};
    table *none = (table *)1;
    assert_int_equal(table_create(&s, &none, err, sizeof(err)), TABLE_LIMIT);
    assert_null(none);
    assert_non_null(strstr(err, "memory limit"));
    assert_true(b.used == 0);
}

/* ---- copies and restore ---- */

static void test_copy_and_restore(void **state)
{
    (void)state;
    table_spec s = base_spec("copy", 3, OPTIMIZER_ADAGRAD);
    table *t = make(&s);
    enum { N = 3000 };
    int64_t ids[N];
    float g[N * 3];
    for (int i = 0; i < N; i++) {
        ids[i] = INT64_MAX - i * 99991LL;
        for (int k = 0; k < 3; k++)
            g[i * 3 + k] = (float)(i % 7) * 0.25f;
    }
    push_ok(t, ids, N, g, 5);
    table *r = make(&s);
    size_t total = 0;
    for (uint32_t q = 0; q < table_partitions(t); q++) {
        table_rows rows;
        assert_int_equal(table_copy_partition(t, q, &rows), 0);
        assert_int_equal(rows.row_floats, 6);
        for (size_t i = 0; i < rows.n; i++) {
            assert_int_equal(table_partition_of(t, rows.ids[i]), q);
            assert_int_equal(rows.updated_ms[i], 5);
            assert_int_equal(table_insert_row(r, rows.ids[i], rows.floats + i * 6, 5), 0);
        }
        total += rows.n;
        table_rows_free(&rows);
    }
    assert_int_equal(total, N);
    float *a = malloc(sizeof(float) * N * 3), *b = malloc(sizeof(float) * N * 3);
    table_pull(t, ids, N, a);
    table_pull(r, ids, N, b);
    assert_memory_equal(a, b, sizeof(float) * N * 3);
    /* The slots came along: one more identical push keeps both equal. */
    push_ok(t, ids, N, g, 6);
    push_ok(r, ids, N, g, 6);
    table_pull(t, ids, N, a);
    table_pull(r, ids, N, b);
    assert_memory_equal(a, b, sizeof(float) * N * 3);
    free(a);
    free(b);
    table_destroy(t);
    table_destroy(r);
}

static bool keep_thirds(void *arg, int64_t id)
{
    (*(size_t *)arg)++;
    return id % 3 == 0;
}

/* table_copy_partition_if: each partition's kept rows, as table_copy_partition gives them
 * (values and update times) less the others, oldest update first; every id asked about
 * once. */
static void test_copy_partition_if(void **state)
{
    (void)state;
    table_spec s = base_spec("copy-if", 4, OPTIMIZER_ADAGRAD);
    table *t = make(&s);
    enum { N = 5000 };
    int64_t ids[N];
    float g[N * 4];
    for (int i = 0; i < N; i++) {
        ids[i] = (int64_t)i * 7919 - 20000;
        for (int k = 0; k < 4; k++)
            g[i * 4 + k] = (float)(i % 5) * 0.5f;
    }
    push_ok(t, ids, N / 2, g, 5);
    push_ok(t, ids + N / 2, N - N / 2, g, 6);
    push_ok(t, ids, N / 4, g, 7); /* some rows move up the LRU order */
    size_t total = 0, asked = 0;
    for (uint32_t q = 0; q < table_partitions(t); q++) {
        table_rows all, kept;
        assert_int_equal(table_copy_partition(t, q, &all), 0);
        assert_int_equal(table_copy_partition_if(t, q, keep_thirds, &asked, &kept), 0);
        assert_int_equal(kept.row_floats, all.row_floats);
        size_t k = 0, rf = all.row_floats;
        for (size_t i = 0; i < all.n; i++) {
            if (all.ids[i] % 3 != 0)
                continue;
            size_t j = 0;
            while (j < kept.n && kept.ids[j] != all.ids[i])
                j++;
            assert_true(j < kept.n);
            assert_int_equal(kept.updated_ms[j], all.updated_ms[i]);
            assert_memory_equal(kept.floats + j * rf, all.floats + i * rf, rf * sizeof(float));
            k++;
        }
        for (size_t j = 1; j < kept.n; j++)
            assert_true(kept.updated_ms[j - 1] <= kept.updated_ms[j]);
        assert_int_equal(k, kept.n);
        total += kept.n;
        table_rows_free(&all);
        table_rows_free(&kept);
    }
    size_t want = 0;
    for (int i = 0; i < N; i++)
        want += ids[i] % 3 == 0;
    assert_int_equal(total, want);
    assert_int_equal(asked, N);
    table_rows none;
    assert_int_equal(table_copy_partition_if(t, table_partitions(t), keep_thirds, &asked, &none),
                     -1);
    assert_int_equal(none.n, 0);
    table_destroy(t);
}

/* ---- concurrency ---- */

#define CONC_THREADS 4
#define CONC_IDS 5000
#define CONC_ROUNDS 20

typedef struct conc_arg {
    table *t;
    int tid;
} conc_arg;

/* Thread tid pushes CONC_ROUNDS batches of every id (in a thread-specific order, each id
 * twice) with gradient 1/8 + tid/16: exact float sums, so any order gives the same rows. */
static void *conc_pusher(void *arg)
{
    conc_arg *a = arg;
    enum { B = 2 * CONC_IDS };
    int64_t *ids = malloc(B * sizeof(*ids));
    float *g = malloc(B * 2 * sizeof(float));
    for (int r = 0; r < CONC_ROUNDS; r++) {
        for (int i = 0; i < B; i++) {
            ids[i] = ((int64_t)(i % CONC_IDS) * 31 + a->tid * 17 + r) % CONC_IDS;
            g[2 * i] = g[2 * i + 1] = 0.125f + (float)a->tid / 16.0f;
        }
        char err[128];
        if (table_push(a->t, ids, B, g, r, err, sizeof(err)) != 0)
            abort();
    }
    free(ids);
    free(g);
    return NULL;
}

static void test_concurrent_pushes_equal_serial(void **state)
{
    (void)state;
    table_spec s = base_spec("conc", 2, OPTIMIZER_SGD);
    s.opt.learning_rate = 1.0f;
    s.init.kind = INITIALIZER_CONSTANT;
    s.init.a = 0.0;
    table *t = make(&s);
    pthread_t th[CONC_THREADS];
    conc_arg args[CONC_THREADS];
    for (int i = 0; i < CONC_THREADS; i++) {
        args[i] = (conc_arg){t, i};
        assert_int_equal(pthread_create(&th[i], NULL, conc_pusher, &args[i]), 0);
    }
    /* Pulls and stats alongside. */
    int64_t probe[4] = {0, 1, 2, 3};
    float out[8];
    for (int i = 0; i < 200; i++) {
        table_pull(t, probe, 4, out);
        table_stats st;
        table_stats_get(t, &st);
    }
    for (int i = 0; i < CONC_THREADS; i++)
        pthread_join(th[i], NULL);
    /* Each id gets 2 * CONC_ROUNDS * sum_t (1/8 + t/16) = 40 * (0.5 + 6/16) = 35. */
    double want = 0;
    for (int i = 0; i < CONC_THREADS; i++)
        want += 2.0 * CONC_ROUNDS * (0.125 + i / 16.0);
    int64_t *ids = malloc(CONC_IDS * sizeof(*ids));
    float *rows = malloc(CONC_IDS * 2 * sizeof(float));
    for (int i = 0; i < CONC_IDS; i++)
        ids[i] = i;
    table_pull(t, ids, CONC_IDS, rows);
    for (int i = 0; i < CONC_IDS * 2; i++)
        assert_true(rows[i] == (float)-want);
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows, CONC_IDS);
    assert_int_equal(st.rows_created, CONC_IDS);
    assert_int_equal(st.rows_updated, (uint64_t)CONC_THREADS * CONC_ROUNDS * CONC_IDS);
    free(ids);
    free(rows);
    table_destroy(t);
}

/* A never_evict table under a full budget refuses new rows (TABLE_LIMIT) and keeps every row
 * it has; table_push_track says which ids a push is done with: the refused ones are not,
 * and pushing them again (once memory is back) applies them once. */
static void test_never_evict_and_tracked_push(void **state)
{
    (void)state;
    table_spec s = base_spec("keep", 1, OPTIMIZER_SGD);
    s.partitions = 1;
    s.opt.learning_rate = 1.0f;
    s.init.kind = INITIALIZER_ZEROS;
    s.never_evict = true;
    test_budget b = {.cap = UINT64_MAX};
    s.budget = (table_budget){.take = budget_take_cb, .give = budget_give_cb, .arg = &b};
    table *t = make(&s);
    enum { N = 4000 };
    static int64_t ids[N];
    static float g[N];
    static bool done[N];
    for (int i = 0; i < N; i++) {
        ids[i] = i;
        g[i] = -1.0f;
    }
    push_ok(t, ids, 100, g, 1);
    b.cap = b.used + 2000; /* no room for the next slab nor a bigger index */
    char err[256] = "";
    assert_int_equal(table_push_track(t, ids, N, g, 2, done, err, sizeof(err)), TABLE_LIMIT);
    assert_non_null(strstr(err, "evicts no row"));
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.evicted_memory, 0);
    assert_true(st.rows >= 100 && st.rows < N);
    assert_int_equal(st.rows_refused, N - st.rows);
    size_t ndone = 0;
    for (int i = 0; i < N; i++) {
        float v;
        table_pull(t, &ids[i], 1, &v);
        /* ids 0..99 twice, the others made by this push once, or refused (not done). */
        assert_true(v == (i < 100 ? 2.0f : done[i] ? 1.0f : 0.0f));
        assert_true(i >= 100 || done[i]);
        ndone += done[i];
    }
    assert_int_equal(ndone, st.rows);
    /* Memory back: the ids not done, pushed again, are applied once. */
    b.cap = UINT64_MAX;
    int64_t again[N];
    size_t na = 0;
    for (int i = 0; i < N; i++)
        if (!done[i])
            again[na++] = ids[i];
    assert_int_equal(table_push_track(t, again, na, g, 3, done, err, sizeof(err)), TABLE_OK);
    for (size_t i = 0; i < na; i++)
        assert_true(done[i]);
    for (int i = 100; i < N; i++) {
        float v;
        table_pull(t, &ids[i], 1, &v);
        assert_true(v == 1.0f);
    }
    /* A refused batch (a non-finite gradient) is done with nothing. */
    g[5] = NAN;
    assert_int_equal(table_push_track(t, ids, 10, g, 4, done, err, sizeof(err)), TABLE_INVALID);
    for (int i = 0; i < 10; i++)
        assert_false(done[i]);
    table_destroy(t);
    /* never_evict excludes max_rows and ttl_ms. */
    s.budget = (table_budget){0};
    s.max_rows = 10;
    expect_bad_spec(&s, "never_evict");
    s.max_rows = 0;
    s.ttl_ms = 10;
    expect_bad_spec(&s, "never_evict");
}

/* ---- checkpoint cuts ---- */

/* Applies a cut's copies to r (as a restore does: whole partitions replace, deltas remove then
 * upsert). */
static void apply_cut(table *r, const table_cut *c, uint32_t nparts)
{
    for (uint32_t q = 0; q < nparts; q++) {
        const table_rows *rows = table_cut_rows(c, q);
        assert_non_null(rows);
        if (rows->full)
            table_partition_clear(r, q);
        table_remove(r, rows->removed, rows->nremoved);
        for (size_t i = 0; i < rows->n; i++) {
            assert_int_equal(table_partition_of(r, rows->ids[i]), q);
            assert_int_equal(table_insert_row(r, rows->ids[i], rows->floats + i * rows->row_floats,
                                              rows->updated_ms[i]),
                             0);
        }
    }
    assert_null(table_cut_rows(c, nparts));
}

/* The rows of ids[0..n) in t and r are equal (slots compared through one more push). */
static void expect_same_rows(table *t, table *r, const int64_t *ids, size_t n, uint32_t dim)
{
    float *a = malloc(sizeof(float) * n * dim), *b = malloc(sizeof(float) * n * dim);
    table_pull(t, ids, n, a);
    table_pull(r, ids, n, b);
    assert_memory_equal(a, b, sizeof(float) * n * dim);
    free(a);
    free(b);
}

/* A cut is the table as it was at table_cut_begin: changes made after it (to any partition,
 * before or after table_cut_finish reaches it) are not in it; a delta of it holds exactly the
 * rows changed and the ids removed since, and restoring full + delta gives the table. */
static void test_cut_whole_then_delta(void **state)
{
    (void)state;
    table_spec s = base_spec("cut", 4, OPTIMIZER_ADAGRAD);
    table *t = make(&s);
    enum { N = 4000 };
    int64_t *ids = malloc(sizeof(int64_t) * N);
    float *g = malloc(sizeof(float) * N * 4), *before = malloc(sizeof(float) * N * 4);
    for (int i = 0; i < N; i++) {
        ids[i] = (int64_t)i * 7919 - 100000;
        for (int k = 0; k < 4; k++)
            g[i * 4 + k] = 0.25f * (float)((i + k) % 5) - 0.5f;
    }
    push_ok(t, ids, N, g, 10);
    table_pull(t, ids, N, before);
    table_cut *c1 = table_cut_begin(t, 0, 1, true);
    assert_non_null(c1);
    assert_false(table_cut_is_delta(c1));
    /* Changes after the cut: half the ids pushed again (their partitions copy first). */
    push_ok(t, ids, N / 2, g, 11);
    assert_int_equal(table_cut_finish(c1), 0);
    table *r = make(&s);
    apply_cut(r, c1, table_partitions(t));
    table_cut_free(c1);
    float *got = malloc(sizeof(float) * N * 4);
    table_pull(r, ids, N, got);
    assert_memory_equal(got, before, sizeof(float) * N * 4); /* the state at the cut */

    /* The delta against cut 1: the N/2 pushed after it, new ids, removed ids. */
    int64_t fresh[3] = {INT64_MIN, -1, INT64_MAX};
    float fg[3 * 4];
    for (int k = 0; k < 12; k++)
        fg[k] = 0.125f * (float)k;
    push_ok(t, fresh, 3, fg, 12);
    int64_t gone[5] = {ids[N - 1], ids[N - 2], ids[N - 3], ids[0], fresh[1]};
    assert_int_equal(table_remove(t, gone, 5), 5);
    table_cut *c2 = table_cut_begin(t, 1, 2, true);
    assert_non_null(c2);
    assert_true(table_cut_is_delta(c2));
    assert_int_equal(table_cut_finish(c2), 0);
    size_t nrows = 0, nremoved = 0;
    for (uint32_t q = 0; q < table_partitions(t); q++) {
        const table_rows *rows = table_cut_rows(c2, q);
        assert_false(rows->full);
        nrows += rows->n;
        nremoved += rows->nremoved;
    }
    /* ids[1..N/2) changed (ids[0] removed since), fresh[0] and fresh[2] new. */
    assert_int_equal(nrows, N / 2 - 1 + 2);
    assert_int_equal(nremoved, 5);
    apply_cut(r, c2, table_partitions(t));
    table_cut_free(c2);
    expect_same_rows(t, r, ids, N, 4);
    expect_same_rows(t, r, fresh, 3, 4);
    table_stats a, b;
    table_stats_get(t, &a);
    table_stats_get(r, &b);
    assert_int_equal(a.rows, b.rows);
    assert_int_equal(a.rows, N - 4 + 2);
    /* Optimizer slots came along: one more equal push keeps them equal. */
    push_ok(t, ids, N, g, 13);
    push_ok(r, ids, N, g, 13);
    expect_same_rows(t, r, ids, N, 4);

    /* Nothing changed since cut 2: an empty delta. A cut against another base is whole. */
    table_cut *c3 = table_cut_begin(t, 2, 3, true);
    assert_true(table_cut_is_delta(c3));
    assert_int_equal(table_cut_finish(c3), 0);
    table_cut_free(c3);
    table_cut *c4 = table_cut_begin(t, 3, 4, true);
    assert_int_equal(table_cut_finish(c4), 0);
    for (uint32_t q = 0; q < table_partitions(t); q++)
        assert_int_equal(table_cut_rows(c4, q)->n + table_cut_rows(c4, q)->nremoved, 0);
    table_cut_free(c4);
    table_cut *c5 = table_cut_begin(t, 2, 5, true); /* 2 is not the previous cut (4) */
    assert_false(table_cut_is_delta(c5));
    /* table_destroy during a cut: the table lives until the cut is freed. */
    table_destroy(t);
    assert_int_equal(table_cut_finish(c5), 0);
    size_t whole = 0;
    for (uint32_t q = 0; q < table_partitions(r); q++)
        whole += table_cut_rows(c5, q)->n;
    assert_int_equal(whole, N + 2); /* the push at 13 made the 4 removed ids again */
    table_cut_free(c5);
    table_destroy(r);
    free(ids);
    free(g);
    free(before);
    free(got);
}

/* A snapshot cut (a copy image: not the chain's) between two cuts of a chain leaves the chain's
 * marks alone: the chain's next cut, applied over its previous one, gives the table (rows
 * changed before and after the snapshot, ids removed after it), or is whole. */
static void test_cut_snapshot_between_chain_cuts(void **state)
{
    (void)state;
    table_spec s = base_spec("cutsnap", 2, OPTIMIZER_SGD);
    table *t = make(&s);
    float g[2] = {0.5f, -0.25f};
    int64_t one = 1, two = 2, three = 3;
    push_ok(t, &one, 1, g, 1);
    uint64_t id1 = table_cut_id_new();
    table_cut *c1 = table_cut_begin(t, 0, id1, true);
    assert_int_equal(table_cut_finish(c1), 0);
    table *r = make(&s);
    apply_cut(r, c1, table_partitions(t));
    table_cut_free(c1);
    push_ok(t, &two, 1, g, 2);
    table_cut *snap = table_cut_begin(t, 0, 0, false);
    assert_false(table_cut_is_delta(snap));
    assert_int_equal(table_cut_finish(snap), 0);
    size_t copied = 0;
    for (uint32_t q = 0; q < table_partitions(t); q++)
        copied += table_cut_rows(snap, q)->n;
    assert_int_equal(copied, 2);
    table_cut_free(snap);
    assert_int_equal(table_remove(t, &one, 1), 1);
    push_ok(t, &three, 1, g, 3);
    table_cut *c2 = table_cut_begin(t, id1, table_cut_id_new(), true);
    assert_true(table_cut_is_delta(c2)); /* the snapshot left the chain its marks */
    assert_int_equal(table_cut_finish(c2), 0);
    apply_cut(r, c2, table_partitions(t));
    table_cut_free(c2);
    /* The same operations on a fresh table. */
    table *want = make(&s);
    push_ok(want, &one, 1, g, 1);
    push_ok(want, &two, 1, g, 2);
    assert_int_equal(table_remove(want, &one, 1), 1);
    push_ok(want, &three, 1, g, 3);
    int64_t ids[3] = {1, 2, 3};
    expect_same_rows(want, r, ids, 3, 2);
    assert_false(has_row(r, 1));
    assert_true(has_row(r, 2) && has_row(r, 3));
    table_stats a, b;
    table_stats_get(want, &a);
    table_stats_get(r, &b);
    assert_int_equal(b.rows, a.rows);
    table_destroy(want);
    table_destroy(r);
    table_destroy(t);
}

/* Overlapping cuts: a snapshot cut started while a chain cut is not finished yet (its finish
 * runs after the freeze) takes nothing from it: each holds the table as at its own start. */
static void test_cut_overlapping(void **state)
{
    (void)state;
    table_spec s = base_spec("cutover", 1, OPTIMIZER_SGD);
    s.opt.learning_rate = 1.0f;
    s.init.kind = INITIALIZER_ZEROS;
    table *t = make(&s);
    enum { N = 300 };
    int64_t ids[N];
    float g[N];
    for (int i = 0; i < N; i++) {
        ids[i] = i;
        g[i] = -1.0f;
    }
    push_ok(t, ids, N, g, 1); /* every row 1 */
    table_cut *chain = table_cut_begin(t, 0, 1, true);
    push_ok(t, ids, N / 2, g, 2); /* rows 0..N/2 at 2: their partitions copied for chain */
    table_cut *snap = table_cut_begin(t, 0, 0, false);
    push_ok(t, ids, N, g, 3); /* 3 and 2 */
    assert_int_equal(table_cut_finish(chain), 0);
    assert_int_equal(table_cut_finish(snap), 0);
    size_t nchain = 0, nsnap = 0;
    for (uint32_t q = 0; q < table_partitions(t); q++) {
        const table_rows *a = table_cut_rows(chain, q), *b = table_cut_rows(snap, q);
        for (size_t i = 0; i < a->n; i++, nchain++)
            assert_true(a->floats[i * a->row_floats] == 1.0f);
        for (size_t i = 0; i < b->n; i++, nsnap++)
            assert_true(b->floats[i * b->row_floats] == (b->ids[i] < N / 2 ? 2.0f : 1.0f));
    }
    assert_int_equal(nchain, N);
    assert_int_equal(nsnap, N);
    table_cut_free(snap);
    table_cut_free(chain);
    table_destroy(t);
}

/* Finite gradients whose update would overflow a row (SGD past FLT_MAX, Adagrad's accumulator)
 * are refused for that row (TABLE_OVERFLOW, naming the table and the id): the row keeps its
 * values, the batch's other rows are applied. */
static void test_overflow_refused_row_unchanged(void **state)
{
    (void)state;
    table_spec s = base_spec("over", 2, OPTIMIZER_SGD);
    s.opt.learning_rate = 1.0f;
    s.init.kind = INITIALIZER_ZEROS;
    table *t = make(&s);
    int64_t ids[2] = {11, 12};
    float g[4] = {-3e38f, 0, 1, 1};
    push_ok(t, ids, 2, g, 1); /* 11 at 3e38, 12 at -1 */
    char err[256] = "";
    assert_int_equal(table_push(t, ids, 2, g, 2, err, sizeof(err)), TABLE_OVERFLOW);
    assert_non_null(strstr(err, "over"));
    assert_non_null(strstr(err, "id 11"));
    float rows[4];
    table_pull(t, ids, 2, rows);
    assert_true(rows[0] == 3e38f && rows[1] == 0.0f);  /* unchanged */
    assert_true(rows[2] == -2.0f && rows[3] == -2.0f); /* applied */
    table_stats st;
    table_stats_get(t, &st);
    assert_int_equal(st.rows_updated, 3);
    table_destroy(t);

    s = base_spec("overada", 2, OPTIMIZER_ADAGRAD);
    t = make(&s);
    int64_t id = 5;
    float before[2], after[2], big[2] = {1e20f, 0.5f};
    table_pull(t, &id, 1, before);
    assert_int_equal(table_push(t, &id, 1, big, 1, err, sizeof(err)), TABLE_OVERFLOW);
    table_pull(t, &id, 1, after);
    assert_memory_equal(after, before, sizeof(before));
    /* Its slots too: a finite push afterwards equals one into a fresh table. */
    float small[2] = {0.5f, 0.25f};
    push_ok(t, &id, 1, small, 2);
    table *r = make(&s);
    push_ok(r, &id, 1, small, 2);
    expect_same_rows(t, r, &id, 1, 2);
    table_destroy(r);
    table_destroy(t);
}

/* Evictions (max_rows, ttl) between two cuts are removals of the delta. */
static void test_cut_delta_carries_evictions(void **state)
{
    (void)state;
    table_spec s = base_spec("cutev", 2, OPTIMIZER_SGD);
    s.max_rows = 100;
    s.partitions = 1;
    s.ttl_ms = 1000;
    table *t = make(&s);
    int64_t ids[150];
    float g[300] = {0};
    for (int i = 0; i < 150; i++)
        ids[i] = i;
    push_ok(t, ids, 100, g, 0);
    table_cut *c1 = table_cut_begin(t, 0, 7, true);
    assert_int_equal(table_cut_finish(c1), 0);
    table *r = make(&s);
    apply_cut(r, c1, 1);
    table_cut_free(c1);
    push_ok(t, ids + 100, 50, g, 500);          /* evicts ids 0..49 (least recently updated) */
    assert_int_equal(table_sweep(t, 1200), 50); /* expires 50..99 (updated at 0) */
    table_cut *c2 = table_cut_begin(t, 7, 8, true);
    assert_int_equal(table_cut_finish(c2), 0);
    assert_int_equal(table_cut_rows(c2, 0)->nremoved, 100);
    assert_int_equal(table_cut_rows(c2, 0)->n, 50);
    apply_cut(r, c2, 1);
    table_cut_free(c2);
    table_stats st;
    table_stats_get(r, &st);
    assert_int_equal(st.rows, 50);
    expect_same_rows(t, r, ids, 150, 2);
    table_destroy(t);
    table_destroy(r);
}

/* Pushes running while cuts are taken: a cut begun with pushes held off (as the server's
 * checkpoint freeze does) holds exactly the pushes done before it, though its partitions are
 * copied while pushes go on. Each push adds 1 to every element of one row (SGD, lr 1,
 * gradient -1), so a row's value counts the pushes applied to it. */
typedef struct cut_arg {
    table *t;
    pthread_rwlock_t *gate;
    _Atomic long pushes;
    _Atomic bool stop;
} cut_arg;

static void *cut_pusher(void *arg)
{
    cut_arg *a = arg;
    int64_t ids[64];
    float g[64];
    for (int i = 0; i < 64; i++) {
        ids[i] = i;
        g[i] = -1.0f;
    }
    while (!atomic_load(&a->stop)) {
        pthread_rwlock_rdlock(a->gate);
        char err[128];
        assert_int_equal(table_push(a->t, ids, 64, g, 1, err, sizeof(err)), 0);
        atomic_fetch_add(&a->pushes, 1);
        pthread_rwlock_unlock(a->gate);
    }
    return NULL;
}

static void test_cut_under_concurrent_pushes(void **state)
{
    (void)state;
    table_spec s = base_spec("cutconc", 1, OPTIMIZER_SGD);
    s.opt.learning_rate = 1.0f;
    s.init.kind = INITIALIZER_ZEROS;
    table *t = make(&s);
    pthread_rwlock_t gate;
    pthread_rwlock_init(&gate, NULL);
    cut_arg a = {.t = t, .gate = &gate};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, cut_pusher, &a), 0);
    uint64_t prev = 0;
    long last = 0;
    for (uint64_t seq = 1; seq <= 30; seq++) {
        while (atomic_load(&a.pushes) < last + 3) /* some pushes since the previous cut */
            sched_yield();
        pthread_rwlock_wrlock(&gate);
        long at = atomic_load(&a.pushes);
        last = at;
        table_cut *c = table_cut_begin(t, prev, seq, true);
        pthread_rwlock_unlock(&gate);
        assert_non_null(c);
        assert_int_equal(table_cut_finish(c), 0);
        size_t seen = 0;
        for (uint32_t q = 0; q < table_partitions(t); q++) {
            const table_rows *rows = table_cut_rows(c, q);
            for (size_t i = 0; i < rows->n; i++, seen++)
                assert_true(rows->floats[i * rows->row_floats] == (float)at);
        }
        /* Whole: all 64 rows; a delta: the rows pushed since the previous cut (all 64 too). */
        assert_int_equal(seen, 64);
        table_cut_free(c);
        prev = seq % 5 == 0 ? 0 : seq; /* a whole cut now and then */
    }
    atomic_store(&a.stop, true);
    pthread_join(th, NULL);
    pthread_rwlock_destroy(&gate);
    table_destroy(t);
}

/* ---- lean rows: the row's Adam step, row-wise Adagrad's shape, 16-bit parameters ---- */

/* The row floats of id in t (from a copy of its partition); false when it has no row. */
static bool row_floats_of(table *t, int64_t id, float *out)
{
    table_rows rows;
    assert_int_equal(table_copy_partition(t, table_partition_of(t, id), &rows), 0);
    bool found = false;
    for (size_t i = 0; i < rows.n; i++)
        if (rows.ids[i] == id) {
            memcpy(out, rows.floats + i * rows.row_floats, rows.row_floats * sizeof(float));
            found = true;
        }
    table_rows_free(&rows);
    return found;
}

static void test_adam_step_per_row(void **state)
{
    (void)state;
    enum { D = 8 };
    table_spec s = base_spec("adam_t", D, OPTIMIZER_ADAM);
    table *t = make(&s);
    /* m, v, then one step count: 3 * dim + 1 floats, the per-element t gone. */
    assert_int_equal(table_row_floats(t), 3 * D + 1);
    assert_int_equal(table_legacy_row_floats(t), 4 * D);
    int64_t a = 11, b = 12;
    float g[D];
    for (int k = 0; k < D; k++)
        g[k] = 0.25f * (float)(k + 1);
    for (int step = 0; step < 5; step++)
        push_ok(t, &a, 1, g, step);
    push_ok(t, &b, 1, g, 9);
    float row[3 * D + 1];
    assert_true(row_floats_of(t, a, row));
    assert_true(row[3 * D] == 5.0f);
    assert_true(row_floats_of(t, b, row));
    assert_true(row[3 * D] == 1.0f);
    /* The same values as a dense variable's Adam on the whole row, five steps. */
    float w[D], sl[3][D], *slots[3] = {sl[0], sl[1], sl[2]};
    init_row(t, &s, a, w);
    optimizer_init_slots(&s.opt, slots, D);
    for (int step = 0; step < 5; step++)
        optimizer_apply(&s.opt, w, g, slots, D);
    float got[D];
    table_pull(t, &a, 1, got);
    assert_memory_equal(got, w, sizeof(w));
    /* A checkpoint's row from before: parameters, m, v, a step count per element. */
    float legacy[4 * D], now[3 * D + 1];
    for (int k = 0; k < 4 * D; k++)
        legacy[k] = k < 3 * D ? (float)k : 7.0f;
    table_row_from_legacy(t, legacy, now);
    for (int k = 0; k < 3 * D; k++)
        assert_true(now[k] == (float)k);
    assert_true(now[3 * D] == 7.0f);
    assert_int_equal(table_insert_row(t, 99, now, 5), TABLE_OK);
    assert_true(row_floats_of(t, 99, row));
    assert_memory_equal(row, now, sizeof(now));
    /* The counter saturates rather than wrapping. */
    now[3 * D] = 1e12f;
    assert_int_equal(table_insert_row(t, 99, now, 5), TABLE_OK);
    assert_true(row_floats_of(t, 99, row));
    assert_true(row[3 * D] == 4294967296.0f);
    table_destroy(t);
}

static void test_rowwise_adagrad_shape(void **state)
{
    (void)state;
    optimizer_row_shape sh;
    optimizer_row_shape_of(OPTIMIZER_ROWWISE_ADAGRAD, &sh);
    assert_true(sh.slots == 0 && sh.scalars == 1 && sh.counts == 0 && sh.narrow_ok);
    assert_int_equal(optimizer_slot_count(OPTIMIZER_ROWWISE_ADAGRAD), 0);
    assert_false(optimizer_on_wire(OPTIMIZER_ROWWISE_ADAGRAD)); /* no variable has it */
    optimizer_kind k;
    assert_int_equal(optimizer_parse("rowwise_adagrad", &k), 0);
    assert_int_equal(k, OPTIMIZER_ROWWISE_ADAGRAD);
    table_spec s = base_spec("rw", 16, OPTIMIZER_ROWWISE_ADAGRAD);
    table *t = make(&s);
    table_stats st;
    table_stats_get(t, &st);
    /* 24-byte header, 16 parameters, one accumulator: 92 bytes, rounded to 96 (Adagrad's
     * element-wise accumulator makes it 152). */
    assert_int_equal(st.row_bytes, 96);
    assert_int_equal(table_row_floats(t), 17);
    int64_t id = 3;
    float g[16];
    for (int i = 0; i < 16; i++)
        g[i] = i < 8 ? 1.0f : -1.0f;
    push_ok(t, &id, 1, g, 1);
    float row[17], w0[16];
    assert_true(row_floats_of(t, id, row));
    init_row(t, &s, id, w0);
    /* acc = 0.1 + mean(g^2) = 1.1; each element moves by lr / (sqrt(1.1) + eps). */
    assert_true(fabsf(row[16] - 1.1f) < 1e-6f);
    float step = s.opt.learning_rate / (sqrtf(1.1f) + s.opt.epsilon);
    for (int i = 0; i < 16; i++)
        assert_true(fabsf(row[i] - (w0[i] - step * g[i])) < 1e-6f);
    table_destroy(t);
}

static void test_row_dtype_conversions(void **state)
{
    (void)state;
    /* float16: exact values, rounding to nearest even, the range's ends, subnormals. */
    const float in[] = {
        1.0f,     -2.5f, 65504.0f,      65519.0f,
        65520.0f, 1e-7f, 5.9604645e-8f, 1.00048828125f /* 1 + 2^-11: a tie, to even (1) */,
        0.0f};
    const uint16_t want[] = {0x3c00, 0xc100, 0x7bff, 0x7bff, 0x7c00, 0x0002, 0x0001, 0x3c00, 0};
    uint16_t h[9];
    row_dtype_narrow(ROW_FLOAT16, h, in, 9);
    for (int i = 0; i < 9; i++) {
        if (h[i] != want[i]) {
            print_error("float16 of %g = 0x%04x, want 0x%04x\n", (double)in[i], h[i], want[i]);
            fail();
        }
    }
    float back[9];
    row_dtype_widen(ROW_FLOAT16, back, h, 9);
    assert_true(back[0] == 1.0f && back[1] == -2.5f && back[2] == 65504.0f);
    assert_true(isinf(back[4]) && back[6] == 5.9604645e-8f && back[8] == 0.0f);
    /* Every float16 value widens and narrows back to itself. */
    for (uint32_t v = 0; v < 0x10000u; v++) {
        uint16_t x = (uint16_t)v, y;
        float f;
        row_dtype_widen(ROW_FLOAT16, &f, &x, 1);
        if (isnan(f))
            continue;
        row_dtype_narrow(ROW_FLOAT16, &y, &f, 1);
        assert_int_equal(x, y);
    }
    /* Whole arrays (the CPU's conversion where it has one) give what one value at a time (the
     * portable conversion) gives: every float16 value, and float32 values around its range. */
    enum { NH = 65536, NF = 200000 };
    uint16_t *all = malloc(NH * sizeof(*all)), *bulk = malloc(NF * sizeof(*bulk));
    float *wide = malloc(NF * sizeof(*wide)), one;
    for (uint32_t v = 0; v < NH; v++)
        all[v] = (uint16_t)v;
    row_dtype_widen(ROW_FLOAT16, wide, all, NH);
    for (uint32_t v = 0; v < NH; v++) {
        row_dtype_widen(ROW_FLOAT16, &one, &all[v], 1);
        if (!isnan(one))
            assert_memory_equal(&one, &wide[v], sizeof(one));
    }
    uint32_t seed = 1;
    for (int i = 0; i < NF; i++) {
        seed = seed * 1664525u + 1013904223u;
        /* exponents from 2^-30 to 2^17, any mantissa, either sign */
        uint32_t bits = (seed & 0x807fffffu) | ((97u + (seed >> 8) % 48u) << 23);
        memcpy(&wide[i], &bits, sizeof(bits));
    }
    row_dtype_narrow(ROW_FLOAT16, bulk, wide, NF);
    for (int i = 0; i < NF; i++) {
        uint16_t h1;
        row_dtype_narrow(ROW_FLOAT16, &h1, &wide[i], 1);
        if (h1 != bulk[i]) {
            print_error("float16 of %a: 0x%04x one at a time, 0x%04x in bulk\n", (double)wide[i],
                        h1, bulk[i]);
            fail();
        }
    }
    free(all);
    free(bulk);
    free(wide);
    /* bfloat16: 8 bits of mantissa, ties to even. */
    const float bin[] = {1.0f, 1.00390625f /* 1 + 2^-8: a tie, to 1 */, 1.01171875f, 3e38f};
    uint16_t bh[4];
    row_dtype_narrow(ROW_BFLOAT16, bh, bin, 4);
    assert_int_equal(bh[0], 0x3f80);
    assert_int_equal(bh[1], 0x3f80);
    assert_int_equal(bh[2], 0x3f82); /* 1 + 3*2^-8 ties up to even 1 + 4*2^-8 */
    assert_string_equal(row_dtype_name(ROW_BFLOAT16), "bfloat16");
    assert_int_equal(row_dtype_size(ROW_FLOAT16), 2);
    assert_int_equal(row_dtype_size((row_dtype)7), 0);
}

/* A 16-bit table against a float32 one: rows rounded, updates close, copies round trip. */
static void check_narrow_table(row_dtype d, optimizer_kind kind)
{
    enum { D = 16, N = 64, STEPS = 20 };
    table_spec s32 = base_spec("wide", D, kind), s16 = base_spec("wide", D, kind);
    s16.dtype = d;
    table *t32 = make(&s32), *t16 = make(&s16);
    table_stats a, b;
    table_stats_get(t32, &a);
    table_stats_get(t16, &b);
    assert_true(b.row_bytes == a.row_bytes - 32); /* 2 bytes a parameter less */
    assert_int_equal(table_row_floats(t16), table_row_floats(t32));
    assert_int_equal(table_dtype(t16), d);
    int64_t ids[N];
    float g[N * D];
    unsigned seed = 7;
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < N; i++) {
            ids[i] = i * 31;
            for (int k = 0; k < D; k++) {
                seed = seed * 1103515245u + 12345u;
                g[i * D + k] = (float)((int)((seed >> 16) % 128) - 64) / 256.0f;
            }
        }
        push_ok(t32, ids, N, g, step);
        push_ok(t16, ids, N, g, step);
    }
    float r32[N * D], r16[N * D];
    table_pull(t32, ids, N, r32);
    table_pull(t16, ids, N, r16);
    /* Each step rounds once, by at most half a unit in the last place (bfloat16 keeps 8 bits,
     * float16 11): an update smaller than that may be lost whole (Adam's lr-sized steps). */
    double u = d == ROW_BFLOAT16 ? 1.0 / 256 : 1.0 / 2048;
    for (int i = 0; i < N * D; i++) {
        double tol = STEPS * u * (fabs(r32[i]) > 0.5 ? fabs(r32[i]) : 0.5);
        if (!(fabs((double)r16[i] - r32[i]) <= tol)) {
            print_error("%s %s [%d]: %g against float32's %g\n", row_dtype_name(d),
                        optimizer_name(kind), i, (double)r16[i], (double)r32[i]);
            fail();
        }
        /* A pulled value is exactly a 16-bit one. */
        uint16_t h;
        float back;
        row_dtype_narrow(d, &h, &r16[i], 1);
        row_dtype_widen(d, &back, &h, 1);
        assert_true(back == r16[i]);
    }
    /* Copies (checkpoints) round trip: the floats of a 16-bit table are its values exactly. */
    table *c = make(&s16);
    uint32_t rf = table_row_floats(t16);
    for (uint32_t q = 0; q < table_partitions(t16); q++) {
        table_rows rows;
        assert_int_equal(table_copy_partition(t16, q, &rows), 0);
        for (size_t i = 0; i < rows.n; i++)
            assert_int_equal(table_insert_row(c, rows.ids[i], rows.floats + i * rf, 5), 0);
        table_rows_free(&rows);
    }
    float rc[N * D];
    table_pull(c, ids, N, rc);
    assert_memory_equal(rc, r16, sizeof(rc));
    float x[64], y[64];
    assert_true(rf <= 64);
    assert_true(row_floats_of(t16, ids[3], x));
    assert_true(row_floats_of(c, ids[3], y));
    assert_memory_equal(x, y, rf * sizeof(float));
    table_destroy(c);
    table_destroy(t32);
    table_destroy(t16);
}

static void test_narrow_rows(void **state)
{
    (void)state;
    const optimizer_kind kinds[] = {OPTIMIZER_SGD, OPTIMIZER_ADAGRAD, OPTIMIZER_ROWWISE_ADAGRAD,
                                    OPTIMIZER_ADAM, OPTIMIZER_FTRL};
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        check_narrow_table(ROW_BFLOAT16, kinds[i]);
        check_narrow_table(ROW_FLOAT16, kinds[i]);
    }
}

static void test_narrow_rows_refused(void **state)
{
    (void)state;
    char err[256] = "";
    table *t = NULL;
    table_spec s = base_spec("n", 4, OPTIMIZER_ADAMW);
    s.dtype = ROW_BFLOAT16;
    assert_int_equal(table_create(&s, &t, err, sizeof(err)), TABLE_INVALID);
    assert_null(t);
    assert_non_null(strstr(err, "bfloat16 rows cannot have optimizer adamw"));
    s = base_spec("n", 4, OPTIMIZER_SGD);
    s.dtype = (row_dtype)9;
    assert_int_equal(table_create(&s, &t, err, sizeof(err)), TABLE_INVALID);
    assert_non_null(strstr(err, "dtype 9: unknown"));
    /* float16 overflows past 65504: that row is refused, the table keeps it finite. */
    s = base_spec("n", 4, OPTIMIZER_SGD);
    s.dtype = ROW_FLOAT16;
    s.opt.learning_rate = 1.0f;
    t = make(&s);
    int64_t id = 1;
    float g[4] = {-70000.0f, 0, 0, 0}, before[4], after[4];
    table_pull(t, &id, 1, before);
    uint16_t h[4];
    row_dtype_narrow(ROW_FLOAT16, h, before, 4); /* the row is made from it, rounded */
    row_dtype_widen(ROW_FLOAT16, before, h, 4);
    assert_int_equal(table_push(t, &id, 1, g, 1, err, sizeof(err)), TABLE_OVERFLOW);
    table_pull(t, &id, 1, after);
    assert_memory_equal(before, after, sizeof(before));
    table_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_initializer_rows_are_pure),
        cmocka_unit_test(test_index_against_reference),
        cmocka_unit_test(test_pull_synthesizes_without_making),
        cmocka_unit_test(test_growth_and_values),
        cmocka_unit_test(test_wide_rows_few_per_slab),
        cmocka_unit_test(test_expected_rows_presized),
        cmocka_unit_test(test_removal_and_slot_reuse),
        cmocka_unit_test(test_memory_accounting),
        cmocka_unit_test(test_duplicates_summed),
        cmocka_unit_test(test_optimizers_against_reference),
        cmocka_unit_test(test_ftrl_registry_row),
        cmocka_unit_test(test_adam_step_per_row),
        cmocka_unit_test(test_rowwise_adagrad_shape),
        cmocka_unit_test(test_row_dtype_conversions),
        cmocka_unit_test(test_narrow_rows),
        cmocka_unit_test(test_narrow_rows_refused),
        cmocka_unit_test(test_min_count_admission),
        cmocka_unit_test(test_max_rows_evicts_least_recently_updated),
        cmocka_unit_test(test_ttl_sweep),
        cmocka_unit_test(test_bad_specs_and_gradients),
        cmocka_unit_test(test_memory_budget),
        cmocka_unit_test(test_logical_budget_alike),
        cmocka_unit_test(test_never_evict_and_tracked_push),
        cmocka_unit_test(test_overflow_refused_row_unchanged),
        cmocka_unit_test(test_copy_and_restore),
        cmocka_unit_test(test_copy_partition_if),
        cmocka_unit_test(test_concurrent_pushes_equal_serial),
        cmocka_unit_test(test_cut_whole_then_delta),
        cmocka_unit_test(test_cut_snapshot_between_chain_cuts),
        cmocka_unit_test(test_cut_overlapping),
        cmocka_unit_test(test_cut_delta_carries_evictions),
        cmocka_unit_test(test_cut_under_concurrent_pushes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
