/* Integration: DeleteVariable (ps_var_delete) against real ps-server processes on loopback:
 * delete and create again, a split variable deleted on every server, deletes racing with
 * pushes and pulls, a parked BSP pull answered NOT_FOUND, and the store's bytes given back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster_proc.h"
#include "psclient.h"
#include "timeutil.h"

static const char *server_bin;
static test_cluster tc;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* A client of the whole cluster (no worker id); split-threshold-bytes small so that the
 * 1000-element variables below are split. */
static ps_client *open_admin(void)
{
    char tf[1400];
    test_cluster_tf_config(&tc, NULL, 0, tf, sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    if (ps_config_set(cfg, "cluster", tf) != PS_OK ||
        ps_config_set(cfg, "split-threshold-bytes", "1024") != PS_OK ||
        ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "admin client: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

static ps_client *open_worker(int worker, const char *deadline_ms)
{
    char tf[1400];
    test_cluster_tf_config(&tc, "worker", worker, tf, sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    if (ps_config_set(cfg, "tf-config", tf) != PS_OK ||
        ps_config_set(cfg, "deadline-ms", deadline_ms) != PS_OK ||
        ps_config_set(cfg, "heartbeat-ms", "100") != PS_OK || ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "worker %d: %s\n", worker, ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

static ps_var *make_var(ps_client *c, const char *name, uint64_t n, int staleness)
{
    ps_var_spec s;
    ps_var_spec_init(&s, name);
    s.ndims = 1;
    s.dims[0] = n;
    s.initializer = PS_INIT_CONSTANT;
    s.init_a = 1.0;
    s.optimizer = PS_OPT_SGD;
    s.learning_rate = 1.0;
    s.staleness = staleness;
    ps_var *v = NULL;
    if (ps_var_create(c, &s, &v) != PS_OK)
        fprintf(stderr, "create %s: %s\n", name, ps_last_error());
    return v;
}

static int start_two(void **state)
{
    (void)state;
    return test_cluster_start(&tc, server_bin, 2, NULL);
}

static int stop_cluster(void **state)
{
    (void)state;
    return test_cluster_stop(&tc);
}

static void server_stats(ps_client *c, int server, uint64_t *bytes, uint32_t *nvars)
{
    ps_server_stats st;
    memset(&st, 0, sizeof(st));
    assert_int_equal(ps_server_status(c, server, &st), PS_OK);
    *bytes = st.bytes_held;
    *nvars = st.num_variables;
}

/* ---- delete, then the name is gone, then created again with fresh values ---------------- */

static void test_delete_lookup_recreate(void **state)
{
    (void)state;
    ps_client *c = open_admin();
    assert_non_null(c);
    ps_var *v = make_var(c, "del/a", 5, PS_STALENESS_ASYNC);
    assert_non_null(v);
    float g[5] = {1, 1, 1, 1, 1}, w[5];
    assert_int_equal(ps_push(c, v, g), PS_OK);
    assert_int_equal(ps_push(c, v, g), PS_OK);
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    for (int i = 0; i < 5; i++)
        assert_float_equal(w[i], -1.0f, 1e-6f);

    assert_int_equal(ps_var_delete(c, "del/a"), PS_OK);
    ps_var *x = NULL;
    assert_int_equal(ps_var_lookup(c, "del/a", &x), PS_NOT_FOUND);
    /* The handle still held reaches the servers by name: NOT_FOUND, no crash. */
    assert_int_equal(ps_pull(c, v, w), PS_NOT_FOUND);
    assert_int_equal(ps_push(c, v, g), PS_NOT_FOUND);
    assert_int_equal(ps_var_delete(c, "del/a"), PS_NOT_FOUND);
    assert_non_null(strstr(ps_last_error(), "del/a"));
    assert_int_equal(ps_var_delete(c, "del/never"), PS_NOT_FOUND);

    ps_var *v2 = make_var(c, "del/a", 5, PS_STALENESS_ASYNC);
    assert_non_null(v2);
    assert_ptr_not_equal(v2, v); /* a fresh handle, not the cached one */
    assert_int_equal(ps_pull(c, v2, w), PS_OK);
    for (int i = 0; i < 5; i++)
        assert_float_equal(w[i], 1.0f, 1e-6f); /* the initializer's, not the old values */
    assert_int_equal(ps_var_lookup(c, "del/a", &x), PS_OK);
    assert_ptr_equal(x, v2);
    /* Created again with another shape: allowed, the old spec is gone. */
    assert_int_equal(ps_var_delete(c, "del/a"), PS_OK);
    ps_var *v3 = make_var(c, "del/a", 7, PS_STALENESS_ASYNC);
    assert_non_null(v3);
    assert_int_equal(ps_var_numel(v3), 7);
    assert_int_equal(ps_var_delete(c, "del/a"), PS_OK);
    ps_client_close(c);
}

/* ---- a split variable: every shard goes, and the bytes with it --------------------------- */

static void test_split_deleted_everywhere_and_bytes_return(void **state)
{
    (void)state;
    ps_client *c = open_admin();
    assert_non_null(c);
    uint64_t b0[2], b1[2], b2[2];
    uint32_t n0[2], n1[2], n2[2];
    for (int s = 0; s < 2; s++)
        server_stats(c, s, &b0[s], &n0[s]);
    ps_var *v = make_var(c, "del/split", 1000, PS_STALENESS_ASYNC);
    assert_non_null(v);
    assert_int_equal(ps_var_num_shards(v), 2);
    float *g = calloc(1000, sizeof(float)), *w = calloc(1000, sizeof(float));
    assert_non_null(g);
    assert_non_null(w);
    for (int i = 0; i < 1000; i++)
        g[i] = 0.5f;
    assert_int_equal(ps_push(c, v, g), PS_OK);
    for (int s = 0; s < 2; s++) {
        server_stats(c, s, &b1[s], &n1[s]);
        assert_int_equal(n1[s], n0[s] + 1);
        assert_true(b1[s] > b0[s]);
    }
    assert_int_equal(ps_var_delete(c, "del/split"), PS_OK);
    for (int s = 0; s < 2; s++) {
        server_stats(c, s, &b2[s], &n2[s]);
        assert_int_equal(n2[s], n0[s]);
        assert_int_equal(b2[s], b0[s]); /* the shard's bytes are given back */
    }
    ps_var *x = NULL;
    assert_int_equal(ps_var_lookup(c, "del/split", &x), PS_NOT_FOUND);
    assert_int_equal(ps_pull(c, v, w), PS_NOT_FOUND);
    char **names = NULL;
    size_t count = 0;
    assert_int_equal(ps_var_list(c, &names, &count), PS_OK);
    for (size_t i = 0; i < count; i++)
        assert_string_not_equal(names[i], "del/split");
    ps_names_free(names, count);

    /* Created again: fresh values on both shards. */
    ps_var *v2 = make_var(c, "del/split", 1000, PS_STALENESS_ASYNC);
    assert_non_null(v2);
    assert_int_equal(ps_pull(c, v2, w), PS_OK);
    for (int i = 0; i < 1000; i++)
        assert_float_equal(w[i], 1.0f, 1e-6f);
    assert_int_equal(ps_var_delete(c, "del/split"), PS_OK);
    free(g);
    free(w);
    ps_client_close(c);
}

/* ---- deletes racing with pushes and pulls ------------------------------------------------ */

typedef struct racer {
    atomic_bool stop;
    atomic_int ok, not_found, other;
    ps_var *v; /* made by the main thread on the racer's client */
    ps_client *c;
    char last_error[512];
} racer;

static void *race_loop(void *arg)
{
    racer *r = arg;
    float g[64], w[64];
    for (int i = 0; i < 64; i++)
        g[i] = 0.001f;
    while (!atomic_load(&r->stop)) {
        int rcs[3] = {ps_push(r->c, r->v, g), ps_pull(r->c, r->v, w),
                      ps_push_pull(r->c, r->v, g, w)};
        for (int k = 0; k < 3; k++) {
            if (rcs[k] == PS_OK) {
                atomic_fetch_add(&r->ok, 1);
            } else if (rcs[k] == PS_NOT_FOUND) {
                atomic_fetch_add(&r->not_found, 1);
            } else {
                atomic_fetch_add(&r->other, 1);
                snprintf(r->last_error, sizeof(r->last_error), "%s: %s", ps_strerror(rcs[k]),
                         ps_last_error());
            }
        }
    }
    return NULL;
}

static void test_delete_races_with_pushes_and_pulls(void **state)
{
    (void)state;
    ps_client *admin = open_admin();
    assert_non_null(admin);
    racer r;
    memset(&r, 0, sizeof(r));
    r.c = open_admin();
    assert_non_null(r.c);
    r.v = make_var(r.c, "del/race", 64, PS_STALENESS_ASYNC);
    assert_non_null(r.v);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, race_loop, &r), 0);
    for (int cycle = 0; cycle < 40; cycle++) {
        sleep_ms(10);
        assert_int_equal(ps_var_delete(admin, "del/race"), PS_OK);
        sleep_ms(5);
        assert_non_null(make_var(admin, "del/race", 64, PS_STALENESS_ASYNC));
    }
    atomic_store(&r.stop, true);
    pthread_join(th, NULL);
    fprintf(stderr, "racer: %d ok, %d not found, %d other%s%s\n", atomic_load(&r.ok),
            atomic_load(&r.not_found), atomic_load(&r.other), atomic_load(&r.other) ? ": " : "",
            r.last_error);
    assert_int_equal(atomic_load(&r.other), 0);
    assert_true(atomic_load(&r.ok) > 0);
    assert_true(atomic_load(&r.not_found) > 0);
    assert_int_equal(ps_var_delete(admin, "del/race"), PS_OK);
    ps_client_close(r.c);
    ps_client_close(admin);
}

/* A split variable deleted while another thread pushes and pulls all of it. */
static void *split_race_loop(void *arg)
{
    racer *r = arg;
    float *g = calloc(1000, sizeof(float)), *w = calloc(1000, sizeof(float));
    if (g == NULL || w == NULL) {
        atomic_fetch_add(&r->other, 1);
        free(g);
        free(w);
        return NULL;
    }
    while (!atomic_load(&r->stop)) {
        int rcs[2] = {ps_push(r->c, r->v, g), ps_pull(r->c, r->v, w)};
        for (int k = 0; k < 2; k++) {
            if (rcs[k] == PS_OK) {
                atomic_fetch_add(&r->ok, 1);
            } else if (rcs[k] == PS_NOT_FOUND) {
                atomic_fetch_add(&r->not_found, 1);
            } else {
                atomic_fetch_add(&r->other, 1);
                snprintf(r->last_error, sizeof(r->last_error), "%s: %s", ps_strerror(rcs[k]),
                         ps_last_error());
            }
        }
    }
    free(g);
    free(w);
    return NULL;
}

static void test_split_delete_races(void **state)
{
    (void)state;
    ps_client *admin = open_admin();
    assert_non_null(admin);
    racer r;
    memset(&r, 0, sizeof(r));
    r.c = open_admin();
    assert_non_null(r.c);
    r.v = make_var(r.c, "del/srace", 1000, PS_STALENESS_ASYNC);
    assert_non_null(r.v);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, split_race_loop, &r), 0);
    int deleted = 0;
    for (int cycle = 0; cycle < 30; cycle++) {
        sleep_ms(10);
        int rc = ps_var_delete(admin, "del/srace");
        assert_int_equal(rc, PS_OK);
        deleted++;
        sleep_ms(5);
        assert_non_null(make_var(admin, "del/srace", 1000, PS_STALENESS_ASYNC));
    }
    atomic_store(&r.stop, true);
    pthread_join(th, NULL);
    fprintf(stderr, "split racer: %d ok, %d not found, %d other%s%s (%d deletes)\n",
            atomic_load(&r.ok), atomic_load(&r.not_found), atomic_load(&r.other),
            atomic_load(&r.other) ? ": " : "", r.last_error, deleted);
    assert_int_equal(atomic_load(&r.other), 0);
    assert_true(atomic_load(&r.ok) > 0);
    assert_int_equal(ps_var_delete(admin, "del/srace"), PS_OK);
    uint64_t b;
    uint32_t n;
    for (int s = 0; s < 2; s++) {
        server_stats(admin, s, &b, &n);
        assert_int_equal(n, 0); /* nothing left over from the cycles */
        assert_int_equal(b, 0);
    }
    ps_client_close(r.c);
    ps_client_close(admin);
}

/* ---- a pull parked on the BSP bound is answered NOT_FOUND by the delete ------------------ */

static int start_workers(void **state)
{
    (void)state;
    const char *const flags[] = {"--worker-timeout-ms", "60000", NULL};
    return test_cluster_start_workers(&tc, server_bin, 1, 2, flags);
}

typedef struct parked {
    ps_client *c;
    ps_var *v;
    int rc;
    char err[512];
    uint64_t ms;
} parked;

static void *parked_pull(void *arg)
{
    parked *p = arg;
    float w[2];
    uint64_t t0 = time_now_ns();
    p->rc = ps_pull(p->c, p->v, w); /* clock 1: worker 1 never shows up, so this waits */
    p->ms = (time_now_ns() - t0) / 1000000;
    snprintf(p->err, sizeof(p->err), "%s", ps_last_error());
    return NULL;
}

static void test_parked_pull_answered_not_found(void **state)
{
    (void)state;
    ps_client *c = open_worker(0, "20000");
    assert_non_null(c);
    parked p = {.c = c};
    p.v = make_var(c, "del/bsp", 2, PS_STALENESS_BSP);
    assert_non_null(p.v);
    float w[2], g[2] = {1, 1};
    assert_int_equal(ps_pull(c, p.v, w), PS_OK); /* clock 0: nothing to wait for */
    assert_int_equal(ps_push(c, p.v, g), PS_OK);
    assert_int_equal(ps_clock(c, NULL), PS_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, parked_pull, &p), 0);
    sleep_ms(500);
    ps_client *admin = open_admin();
    assert_non_null(admin);
    ps_server_stats st;
    memset(&st, 0, sizeof(st));
    assert_int_equal(ps_server_status(admin, 0, &st), PS_OK);
    assert_true(st.staleness.pulls >= 1);
    uint64_t t0 = time_now_ns();
    assert_int_equal(ps_var_delete(admin, "del/bsp"), PS_OK);
    pthread_join(th, NULL);
    uint64_t after = (time_now_ns() - t0) / 1000000;
    fprintf(stderr, "parked pull after %llu ms (%llu ms after the delete): %s: %s\n",
            (unsigned long long)p.ms, (unsigned long long)after, ps_strerror(p.rc), p.err);
    assert_int_equal(p.rc, PS_NOT_FOUND);
    assert_non_null(strstr(p.err, "was deleted"));
    assert_true(p.ms >= 400);  /* it did wait */
    assert_true(after < 5000); /* and the delete, not the deadline, ended it */
    uint64_t b;
    uint32_t n;
    server_stats(admin, 0, &b, &n);
    assert_int_equal(n, 0);
    assert_int_equal(b, 0);
    /* Created again under BSP: a fresh variable that serves pulls. */
    ps_var *v2 = make_var(admin, "del/bsp", 2, PS_STALENESS_BSP);
    assert_non_null(v2);
    assert_int_equal(ps_pull(admin, v2, w), PS_OK);
    assert_float_equal(w[0], 1.0f, 1e-6f);
    ps_client_close(admin);
    ps_client_close(c);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_delete_lookup_recreate, start_two, stop_cluster),
        cmocka_unit_test_setup_teardown(test_split_deleted_everywhere_and_bytes_return, start_two,
                                        stop_cluster),
        cmocka_unit_test_setup_teardown(test_delete_races_with_pushes_and_pulls, start_two,
                                        stop_cluster),
        cmocka_unit_test_setup_teardown(test_split_delete_races, start_two, stop_cluster),
        cmocka_unit_test_setup_teardown(test_parked_pull_answered_not_found, start_workers,
                                        stop_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
