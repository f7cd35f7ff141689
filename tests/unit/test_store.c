/* Unit tests for the range locks of server/store.c: how a shard maps onto stripes, that
 * disjoint ranges are held at once by two threads while overlapping ones, and a whole-shard
 * lock, exclude each other, that the BSP aggregate is made once however many threads ask, and
 * that variables count against the memory budget (max-server-bytes), and that a variable cut in
 * parts is held as its head and its parts, each an entry of its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "store.h"
#include "timeutil.h"

#define CHUNK 262144u /* floats in the client's default 1 MiB chunk */
#define WAIT_MS 5000  /* a thread that should have gone on but did not: the test fails */

/* An asynchronous SGD float32 vector named name with the one dimension *shape. */
static Psd__V1__VariableSpec sgd_spec(const char *name, uint64_t *shape)
{
    Psd__V1__VariableSpec spec = PSD__V1__VARIABLE_SPEC__INIT;
    spec.name = (char *)name;
    spec.dtype = PSD__V1__DTYPE__FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    spec.optimizer = PSD__V1__OPTIMIZER__OPT_SGD;
    spec.learning_rate = 0.1;
    spec.staleness = -1;
    return spec;
}

static variable *make_var(uint64_t count)
{
    uint64_t shape[1] = {count};
    Psd__V1__VariableSpec spec = sgd_spec("v", shape);
    spec.num_servers = 1;
    char err[256];
    variable *v = variable_create_unfilled(&spec, count, 0, count, err, sizeof(err));
    if (v == NULL)
        fail_msg("variable_create_unfilled: %s", err);
    return v;
}

static void test_stripe_mapping(void **state)
{
    (void)state;
    static const struct {
        uint64_t count, elems;
        uint32_t stripes;
    } cases[] = {
        {0, 65536, 1},
        {1000, 65536, 1},
        {65536, 65536, 1},
        {65537, 65536, 2},
        {3 * CHUNK, 65536, 12},
        {64 * 65536, 65536, 64},
        {64 * 65536 + 1, 131072, 33},
        {5000000, 131072, 39},
        {1ull << 26, 1ull << 20, 64},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        variable *v = make_var(cases[i].count);
        assert_int_equal(variable_stripe_elems(v), cases[i].elems);
        assert_int_equal(v->nstripes, cases[i].stripes);
        assert_true(v->nstripes <= VARIABLE_MAX_STRIPES);
        assert_int_equal(variable_stripe_of(v, 0), 0);
        if (cases[i].count)
            assert_int_equal(variable_stripe_of(v, cases[i].count - 1), cases[i].stripes - 1);
        assert_int_equal(variable_stripe_of(v, UINT64_MAX), cases[i].stripes - 1); /* clamped */
        variable_destroy(v);
    }
    /* 1 MiB chunks from the shard's start: 4 whole stripes each, disjoint between chunks. */
    variable *v = make_var(64 * 65536);
    for (uint64_t c = 0; c < 16; c++) {
        assert_int_equal(variable_stripe_of(v, c * CHUNK), 4 * c);
        assert_int_equal(variable_stripe_of(v, c * CHUNK + CHUNK - 1), 4 * c + 3);
    }
    /* Empty and single-element ranges lock one stripe: lock and unlock must pair up. */
    variable_lock_range(v, 5, 0);
    variable_unlock_range(v, 5, 0);
    variable_lock_range(v, 64 * 65536, 0); /* at the end: the last stripe */
    variable_unlock_range(v, 64 * 65536, 0);
    variable_lock_range(v, 0, 64 * 65536);
    variable_unlock_range(v, 0, 64 * 65536);
    variable_lock_all(v);
    variable_unlock_all(v);
    variable_destroy(v);
}

/* ---- two threads: one holds a lock until told, the other tries its own ---------------- */

enum { RANGE, ALL };

typedef struct probe {
    variable *v;
    int kind;
    uint64_t first, count;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool held, release, acquired;
} probe;

static void probe_lock(variable *v, int kind, uint64_t first, uint64_t count)
{
    if (kind == ALL)
        variable_lock_all(v);
    else
        variable_lock_range(v, first, count);
}

static void probe_unlock(variable *v, int kind, uint64_t first, uint64_t count)
{
    if (kind == ALL)
        variable_unlock_all(v);
    else
        variable_unlock_range(v, first, count);
}

static struct timespec deadline(int ms)
{
    return time_deadline(CLOCK_REALTIME, (uint64_t)ms);
}

/* Waits until *flag (under p->mu) or ms pass; returns the flag. */
static bool wait_flag(probe *p, bool *flag, int ms)
{
    struct timespec ts = deadline(ms);
    pthread_mutex_lock(&p->mu);
    int rc = 0;
    while (!*flag && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    bool r = *flag;
    pthread_mutex_unlock(&p->mu);
    return r;
}

static void set_flag(probe *p, bool *flag)
{
    pthread_mutex_lock(&p->mu);
    *flag = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Holder: locks, says so, and keeps the lock until released (or WAIT_MS pass, so that a test
 * whose second lock wrongly waits for this one fails instead of hanging). */
static void *holder_main(void *arg)
{
    probe *p = arg;
    probe_lock(p->v, p->kind, p->first, p->count);
    set_flag(p, &p->held);
    wait_flag(p, &p->release, WAIT_MS);
    probe_unlock(p->v, p->kind, p->first, p->count);
    return NULL;
}

/* Second thread: takes its lock and says so. */
static void *taker_main(void *arg)
{
    probe *p = arg;
    probe_lock(p->v, p->kind, p->first, p->count);
    set_flag(p, &p->acquired);
    probe_unlock(p->v, p->kind, p->first, p->count);
    return NULL;
}

/* Thread A holds (ka, fa, ca); thread B then takes (kb, fb, cb). With `excludes` B must not get
 * it within 100 ms, and gets it once A lets go; else B gets it while A still holds its own. */
static void check_pair(variable *v, int ka, uint64_t fa, uint64_t ca, int kb, uint64_t fb,
                       uint64_t cb, bool excludes)
{
    probe a = {.v = v, .kind = ka, .first = fa, .count = ca};
    probe b = {.v = v, .kind = kb, .first = fb, .count = cb};
    pthread_mutex_init(&a.mu, NULL);
    pthread_cond_init(&a.cv, NULL);
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, holder_main, &a), 0);
    assert_true(wait_flag(&a, &a.held, WAIT_MS));
    assert_int_equal(pthread_create(&tb, NULL, taker_main, &b), 0);
    bool got = wait_flag(&b, &b.acquired, excludes ? 100 : WAIT_MS);
    set_flag(&a, &a.release);
    bool got_after = wait_flag(&b, &b.acquired, WAIT_MS);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_mutex_destroy(&a.mu);
    pthread_cond_destroy(&a.cv);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cv);
    if (excludes)
        assert_false(got); /* it waited for A */
    else
        assert_true(got); /* while A held its range */
    assert_true(got_after);
}

static void test_disjoint_ranges_at_once(void **state)
{
    (void)state;
    variable *v = make_var(16 * CHUNK); /* 64 stripes of 65536 */
    for (uint64_t c = 1; c < 16; c++)
        check_pair(v, RANGE, 0, CHUNK, RANGE, c * CHUNK, CHUNK, false);
    check_pair(v, RANGE, 3 * CHUNK, CHUNK, RANGE, 2 * CHUNK, CHUNK, false);
    check_pair(v, RANGE, 0, 65536, RANGE, 65536, 0, false); /* empty range: next stripe */
    variable_destroy(v);
}

static void test_overlapping_ranges_exclude(void **state)
{
    (void)state;
    variable *v = make_var(16 * CHUNK);
    check_pair(v, RANGE, 0, CHUNK, RANGE, 0, CHUNK, true);
    check_pair(v, RANGE, CHUNK, CHUNK, RANGE, CHUNK + CHUNK - 1, 5, true); /* last element */
    check_pair(v, RANGE, 10, 1, RANGE, 20, 1, true);                       /* one stripe */
    check_pair(v, RANGE, 0, 16 * CHUNK, RANGE, 7 * CHUNK, 3, true);
    check_pair(v, RANGE, 5 * CHUNK, 1, RANGE, 5 * CHUNK, 0, true); /* empty range: its stripe */
    /* Whole-shard locks against ranges, both ways, and against each other. */
    check_pair(v, ALL, 0, 0, RANGE, 9 * CHUNK, CHUNK, true);
    check_pair(v, RANGE, 15 * CHUNK, CHUNK, ALL, 0, 0, true);
    check_pair(v, ALL, 0, 0, ALL, 0, 0, true);
    variable_destroy(v);
    /* A small variable: one stripe, so any two ranges exclude each other. */
    v = make_var(1000);
    check_pair(v, RANGE, 0, 10, RANGE, 500, 10, true);
    variable_destroy(v);
}

/* ---- many threads: adds under range locks lose nothing ---------------------------------- */

#define NT 4
#define ITERS 300

typedef struct adder {
    variable *v;
    unsigned seed;
    uint64_t *hits; /* this thread's count of adds per element, to check against */
} adder;

static void *adder_main(void *arg)
{
    adder *a = arg;
    uint64_t n = a->v->count;
    for (int it = 0; it < ITERS; it++) {
        uint64_t first = (uint64_t)rand_r(&a->seed) % n;
        uint64_t count = (uint64_t)rand_r(&a->seed) % (n - first) + 1;
        if (count > 200000)
            count = 200000;
        variable_lock_range(a->v, first, count);
        for (uint64_t i = first; i < first + count; i++)
            a->v->params[i] += 1.0f;
        variable_unlock_range(a->v, first, count);
        if (it % 16 == 0) { /* now and then a whole-shard reader in between */
            variable_lock_all(a->v);
            variable_unlock_all(a->v);
        }
        for (uint64_t i = first; i < first + count; i++)
            a->hits[i]++;
    }
    return NULL;
}

static void test_concurrent_adds_lose_nothing(void **state)
{
    (void)state;
    uint64_t n = 2 * CHUNK + 12345; /* not a multiple of a stripe */
    variable *v = make_var(n);
    memset(v->params, 0, n * sizeof(float));
    adder a[NT];
    pthread_t t[NT];
    for (int i = 0; i < NT; i++) {
        a[i] = (adder){.v = v, .seed = 17u + (unsigned)i, .hits = calloc(n, sizeof(uint64_t))};
        assert_non_null(a[i].hits);
        assert_int_equal(pthread_create(&t[i], NULL, adder_main, &a[i]), 0);
    }
    for (int i = 0; i < NT; i++)
        pthread_join(t[i], NULL);
    for (uint64_t e = 0; e < n; e++) {
        uint64_t want = 0;
        for (int i = 0; i < NT; i++)
            want += a[i].hits[e];
        if ((uint64_t)v->params[e] != want)
            fail_msg("element %llu: %g adds, want %llu", (unsigned long long)e,
                     (double)v->params[e], (unsigned long long)want);
    }
    for (int i = 0; i < NT; i++)
        free(a[i].hits);
    variable_destroy(v);
}

/* ---- the BSP aggregate ------------------------------------------------------------------- */

#define NAGG 8

typedef struct agg_arg {
    variable *v;
    pthread_barrier_t *bar;
    int worker, rc;
    float *seen;
} agg_arg;

static void *agg_main(void *arg)
{
    agg_arg *a = arg;
    pthread_barrier_wait(a->bar);
    a->rc = variable_agg_ensure(a->v, 64);
    if (a->rc != 0)
        return NULL;
    a->seen = a->v->agg;
    /* Each thread adds to its own chunk and marks itself, as sync_aggregate will. */
    uint64_t first = (uint64_t)a->worker * 1000;
    variable_lock_range(a->v, first, 1000);
    for (uint64_t i = first; i < first + 1000; i++)
        a->v->agg[i] += 1.0f;
    variable_agg_mark(a->v, a->worker, 64);
    variable_agg_mark(a->v, a->worker, 64); /* twice: counted once */
    variable_unlock_range(a->v, first, 1000);
    return NULL;
}

static void test_agg_ensure_once(void **state)
{
    (void)state;
    variable *v = make_var(NAGG * 1000 + 7);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, NAGG);
    agg_arg a[NAGG];
    pthread_t t[NAGG];
    for (int i = 0; i < NAGG; i++) {
        a[i] = (agg_arg){.v = v, .bar = &bar, .worker = i};
        assert_int_equal(pthread_create(&t[i], NULL, agg_main, &a[i]), 0);
    }
    for (int i = 0; i < NAGG; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&bar);
    for (int i = 0; i < NAGG; i++) {
        assert_int_equal(a[i].rc, 0);
        assert_ptr_equal(a[i].seen, v->agg); /* one allocation, seen by all */
    }
    assert_true(v->agg_words >= VARIABLE_AGG_MIN_WORDS);
    assert_int_equal(v->agg_count, NAGG);
    assert_int_equal(v->agg_workers[0], (1ull << NAGG) - 1);
    for (uint64_t i = 0; i < NAGG * 1000; i++)
        assert_true(v->agg[i] == 1.0f);
    assert_true(v->agg[NAGG * 1000] == 0.0f); /* zeroed */
    /* Out-of-range workers are ignored; a second ensure keeps what was summed. */
    variable_lock_range(v, 0, 1);
    variable_agg_mark(v, -1, 64);
    variable_agg_mark(v, 64, 64);
    variable_unlock_range(v, 0, 1);
    assert_int_equal(v->agg_count, NAGG);
    assert_int_equal(variable_agg_ensure(v, 64), 0);
    assert_true(v->agg[0] == 1.0f);
    variable_destroy(v);
}

/* ---- how long two threads take to apply 1 MiB chunks (printed, not asserted) ------------ */

typedef struct timer_arg {
    variable *v;
    uint64_t first;
} timer_arg;

static void *chunk_main(void *arg)
{
    timer_arg *a = arg;
    for (int it = 0; it < 100; it++) {
        variable_lock_range(a->v, a->first, CHUNK);
        float *p = a->v->params + a->first;
        for (uint64_t i = 0; i < CHUNK; i++)
            p[i] = p[i] * 0.999f + 0.001f;
        variable_unlock_range(a->v, a->first, CHUNK);
    }
    return NULL;
}

static double run_pair(variable *v, uint64_t fa, uint64_t fb)
{
    timer_arg a = {v, fa}, b = {v, fb};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_t ta, tb;
    assert_int_equal(pthread_create(&ta, NULL, chunk_main, &a), 0);
    assert_int_equal(pthread_create(&tb, NULL, chunk_main, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
}

static void test_timing(void **state)
{
    (void)state;
    variable *v = make_var(2 * CHUNK);
    memset(v->params, 0, 2 * CHUNK * sizeof(float));
    run_pair(v, 0, CHUNK); /* warm up */
    double same = run_pair(v, 0, 0), disjoint = run_pair(v, 0, CHUNK);
    fprintf(stderr,
            "2 threads x 100 applies of a 1 MiB chunk: same chunk %.1f ms, disjoint chunks "
            "%.1f ms (%.2fx)\n",
            same, disjoint, disjoint > 0 ? same / disjoint : 0.0);
    variable_destroy(v);
}

/* Server-only optimizer kinds (FTRL, for sparse tables) are refused for a variable created
 * from the wire: its settings are not on the wire yet. The wire's kinds are still accepted. */
static void test_server_only_optimizer_refused(void **state)
{
    (void)state;
    Psd__V1__VariableSpec spec = PSD__V1__VARIABLE_SPEC__INIT;
    uint64_t shape[1] = {4};
    spec.name = "v";
    spec.dtype = PSD__V1__DTYPE__FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    spec.optimizer = (Psd__V1__Optimizer)OPTIMIZER_FTRL;
    spec.learning_rate = 0.1;
    spec.staleness = -1;
    spec.num_servers = 1;
    char err[256] = "";
    assert_null(variable_create_unfilled(&spec, 4, 0, 4, err, sizeof(err)));
    assert_true(err[0] != '\0');
    spec.optimizer = PSD__V1__OPTIMIZER__OPT_SGD;
    variable *v = variable_create_unfilled(&spec, 4, 0, 4, err, sizeof(err));
    if (v == NULL)
        fail_msg("variable_create_unfilled: %s", err);
    variable_destroy(v);
}

/* max-server-bytes: a store's reserves, its inserted variables and whatever else takes from the
 * same budget (a table's rows) count against one limit; what is given back (unreserve, delete,
 * destroy) is free again; a restore inserts past the limit and counts all the same. */
static void test_budget_counts_variables_and_tables(void **state)
{
    (void)state;
    mem_budget b = {0};
    budget_set_max(&b, 1000);
    store *s = store_create();
    assert_non_null(s);
    store_set_limits(s, &b, 0);
    char err[256];
    assert_int_equal(store_reserve(s, 600, err, sizeof(err)), 0);
    assert_true(budget_take(&b, 300)); /* a table's slab */
    assert_int_equal(budget_held(&b), 900);
    assert_int_not_equal(store_reserve(s, 200, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "max-server-bytes 1000 (900 held"));
    assert_false(budget_take(&b, 101));
    store_unreserve(s, 600);
    assert_int_equal(budget_held(&b), 300);
    variable *v = make_var(100); /* 400 bytes (SGD: no slots) */
    variable *in = store_insert(s, v);
    assert_int_equal(budget_held(&b), 700);
    variable *w = make_var(100);
    w->name[0] = 'w';
    variable *in2 = store_insert(s, w); /* a restore: past the limit, counted */
    assert_int_equal(budget_held(&b), 1100);
    assert_false(budget_take(&b, 1));
    variable_release(in2);
    variable *gone = store_remove(s, "w");
    assert_non_null(gone);
    variable_release(gone); /* the store's reference: the last one */
    assert_int_equal(budget_held(&b), 700);
    variable_release(in);
    store_destroy(s);
    assert_int_equal(budget_held(&b), 300);
    budget_give(&b, 300);
    assert_int_equal(budget_held(&b), 0);
}

/* A variable cut in parts: the head (no elements) and parts keyed by (name, part), found,
 * listed and removed each on its own; max-variables counts the name once. */
static void test_parts_keys(void **state)
{
    (void)state;
    const uint64_t n = 3 * 262144 + 5;
    uint64_t shape[1] = {n};
    Psd__V1__VariableSpec spec = sgd_spec("p", shape);
    spec.split = true;
    spec.parts = true;
    char err[256];
    store *s = store_create();
    assert_non_null(s);
    store_set_limits(s, NULL, 2); /* two names at most */
    variable *head = variable_create(&spec, n, 0, 0, err, sizeof(err));
    variable *p1 = variable_create(&spec, n, 262144, 262144, err, sizeof(err));
    variable *p3 = variable_create(&spec, n, 3 * 262144, 5, err, sizeof(err));
    assert_true(head && p1 && p3);
    assert_true(variable_is_head(head) && head->part == VARIABLE_HEAD);
    assert_true(p1->part == 1 && p3->part == 3 && !variable_is_head(p3));
    variable_release(store_insert(s, p1));
    variable_release(store_insert(s, p3));
    variable_release(store_insert(s, head));
    variable *f = store_find(s, "p");
    assert_ptr_equal(f, head);
    variable_release(f);
    f = store_find_part(s, "p", 3);
    assert_ptr_equal(f, p3);
    variable_release(f);
    assert_null(store_find_part(s, "p", 0)); /* not held here */
    variable **all;
    size_t nall = store_list(s, &all);
    assert_int_equal(nall, 3);
    store_list_release(all, nall);
    /* One name held: room for one more, though three entries are linked. */
    assert_int_equal(store_reserve(s, 0, err, sizeof(err)), 0);
    store_unreserve(s, 0);
    assert_int_equal(store_bytes(s), (262144 + 5) * sizeof(float));
    variable *gone = store_remove_part(s, "p", 1);
    assert_ptr_equal(gone, p1);
    variable_release(gone);
    assert_null(store_find_part(s, "p", 1));
    assert_int_equal(store_bytes(s), 5 * sizeof(float));
    gone = store_remove(s, "p"); /* the head only */
    assert_ptr_equal(gone, head);
    variable_release(gone);
    f = store_find_part(s, "p", 3);
    assert_ptr_equal(f, p3);
    variable_release(f);
    store_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stripe_mapping),
        cmocka_unit_test(test_disjoint_ranges_at_once),
        cmocka_unit_test(test_overlapping_ranges_exclude),
        cmocka_unit_test(test_concurrent_adds_lose_nothing),
        cmocka_unit_test(test_agg_ensure_once),
        cmocka_unit_test(test_timing),
        cmocka_unit_test(test_server_only_optimizer_refused),
        cmocka_unit_test(test_budget_counts_variables_and_tables),
        cmocka_unit_test(test_parts_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
