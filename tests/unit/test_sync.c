/* Unit tests for server/sync.c's clock table in a replicated group's state (sync_set_logged):
 * the sweep hands a silent worker to the group's log instead of evicting it, so nothing changes
 * until the logged eviction is applied (sync_evict), which then applies the BSP aggregate the
 * worker held back, as an unreplicated state's sweep does at once; and the barrier hook
 * (sync_set_barrier_fn), called once each time the slowest live worker's clock moves forward. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <time.h>

#include "frame.h"
#include "server.h"
#include "sync.h"

#define NEL 8

static void state_init(server_state *st, uint32_t timeout_ms)
{
    memset(st, 0, sizeof(*st));
    st->num_servers = 1;
    st->vars = store_create();
    st->dedup = dedup_create(1024);
    st->sync = sync_create(2, timeout_ms, false, 64); /* workers 0 and 1 expected */
    assert_non_null(st->vars);
    assert_non_null(st->dedup);
    assert_non_null(st->sync);
}

static void state_fini(server_state *st)
{
    sync_cancel_all(st, "test ends");
    store_destroy(st->vars);
    dedup_destroy(st->dedup);
    sync_destroy(st->sync);
}

/* A BSP variable of NEL zeros, plain SGD with learning rate 1. */
static variable *bsp_var(server_state *st)
{
    Psd__V1__VariableSpec spec = PSD__V1__VARIABLE_SPEC__INIT;
    uint64_t shape[1] = {NEL};
    spec.name = "bsp";
    spec.dtype = PSD__V1__DTYPE__FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    spec.optimizer = PSD__V1__OPTIMIZER__OPT_SGD;
    spec.learning_rate = 1.0;
    spec.staleness = 0;
    spec.num_servers = 1;
    char err[256];
    variable *v = variable_create(&spec, NEL, 0, NEL, err, sizeof(err));
    if (v == NULL)
        fail_msg("variable_create: %s", err);
    memset(v->params, 0, NEL * sizeof(float));
    assert_ptr_equal(store_insert(st->vars, v), v);
    return v;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

typedef struct hook_rec {
    int calls;
    int32_t worker;
} hook_rec;

static void hook(void *arg, int32_t worker)
{
    hook_rec *r = arg;
    r->calls++;
    r->worker = worker;
}

/* Worker 0 pushes 3 to every element for clock 0 and clocks to 1; worker 1 stays silent past
 * the timeout. */
static void worker0_step(server_state *st, variable *v)
{
    float g[NEL];
    for (int i = 0; i < NEL; i++)
        g[i] = 3.0f;
    assert_int_equal(sync_aggregate(st, v, 0, g, PSD__V1__DTYPE__FLOAT32, 0, NEL), 0);
    int64_t min;
    assert_int_equal(sync_clock(st, 0, 7, 1, &min), 1);
    assert_int_equal(min, 0); /* worker 1 holds the barrier */
    assert_true(v->params[0] == 0.0f);
}

static void test_unlogged_sweep_evicts_and_applies(void **state)
{
    (void)state;
    server_state st;
    state_init(&st, 100);
    variable *v = bsp_var(&st);
    worker0_step(&st, v);
    sleep_ms(150);
    sync_heard(&st, 0); /* worker 0 is not silent */
    sync_sweep(&st);
    assert_int_equal(sync_min_clock(&st), 1);
    for (int i = 0; i < NEL; i++)
        assert_true(v->params[i] == -3.0f);
    state_fini(&st);
}

static void test_logged_sweep_goes_through_the_log(void **state)
{
    (void)state;
    server_state st;
    state_init(&st, 100);
    variable *v = bsp_var(&st);
    hook_rec rec = {0, -1};
    sync_set_logged(&st, hook, &rec);
    worker0_step(&st, v);
    sleep_ms(150);
    sync_heard(&st, 0);
    assert_true(sync_worker_silent(&st, 1));
    assert_false(sync_worker_silent(&st, 0));
    sync_sweep(&st);
    /* Handed to the log, not evicted: the barrier and the aggregate are as they were. */
    assert_int_equal(rec.calls, 1);
    assert_int_equal(rec.worker, 1);
    assert_int_equal(sync_min_clock(&st), 0);
    assert_true(v->params[0] == 0.0f);
    /* The logged eviction's apply (the same on every replica). */
    sync_evict(&st, 1);
    assert_int_equal(sync_min_clock(&st), 1);
    for (int i = 0; i < NEL; i++)
        assert_true(v->params[i] == -3.0f);
    assert_false(sync_worker_silent(&st, 1)); /* not live: nothing more to evict */
    sync_sweep(&st);
    assert_int_equal(rec.calls, 1);
    /* Applied again (a replayed log): nothing changes. */
    sync_evict(&st, 1);
    assert_true(v->params[0] == -3.0f);
    /* Its next logged request re-registers it at the slowest live worker's clock. */
    int64_t min;
    assert_int_equal(sync_clock(&st, 1, 9, 0, &min), 1);
    assert_int_equal(min, 1);
    state_fini(&st);
}

static struct {
    int calls;
    server_state *st;
    bool mean;
    float param0; /* the dense aggregate's effect when the hook ran */
} barrier_rec;
static variable *barrier_var;

static void barrier_hook(server_state *st, bool mean)
{
    barrier_rec.calls++;
    barrier_rec.st = st;
    barrier_rec.mean = mean;
    barrier_rec.param0 = barrier_var->params[0];
}

static void test_barrier_hook(void **state)
{
    (void)state;
    server_state st;
    state_init(&st, 10000);
    barrier_var = bsp_var(&st);
    memset(&barrier_rec, 0, sizeof(barrier_rec));
    sync_set_barrier_fn(barrier_hook);
    worker0_step(&st, barrier_var);
    assert_int_equal(barrier_rec.calls, 0); /* worker 1 holds the barrier */
    int64_t min;
    assert_int_equal(sync_clock(&st, 1, 9, 1, &min), 1);
    assert_int_equal(min, 1);
    /* Once, with this state, after the variables' aggregates were applied. */
    assert_int_equal(barrier_rec.calls, 1);
    assert_ptr_equal(barrier_rec.st, &st);
    assert_false(barrier_rec.mean);
    assert_true(barrier_rec.param0 == -3.0f);
    /* A clock that does not move the barrier does not call it. */
    assert_int_equal(sync_clock(&st, 0, 7, 2, &min), 2);
    assert_int_equal(barrier_rec.calls, 1);
    sync_set_barrier_fn(NULL);
    assert_int_equal(sync_clock(&st, 1, 9, 2, &min), 2);
    assert_int_equal(barrier_rec.calls, 1);
    state_fini(&st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unlogged_sweep_evicts_and_applies),
        cmocka_unit_test(test_logged_sweep_goes_through_the_log),
        cmocka_unit_test(test_barrier_hook),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
