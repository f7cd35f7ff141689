/* Integration: ps_assign (PushRequest.assign) against real ps-server processes on loopback:
 * values written as they are over shards and chunks, in float32 whatever the wire dtype, at
 * once under BSP (no aggregate, no clock needed), without an optimizer step, exactly once; then
 * pushes apply on top of them; its bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "psclient.h"

static const char *server_bin;
static test_cluster tc;

static ps_client *open_client(int worker, const char *wire)
{
    char tf[1400];
    test_cluster_tf_config(&tc, worker >= 0 ? "worker" : NULL, worker >= 0 ? worker : 0, tf,
                           sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    if (ps_config_set(cfg, "tf-config", tf) != PS_OK ||
        ps_config_set(cfg, "deadline-ms", "20000") != PS_OK ||
        ps_config_set(cfg, "chunk-bytes", "4K") != PS_OK ||
        ps_config_set(cfg, "split-threshold-bytes", "16K") != PS_OK ||
        (wire && ps_config_set(cfg, "wire-dtype", wire) != PS_OK) ||
        ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "client: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

static int start(void **state)
{
    (void)state;
    return test_cluster_start_workers(&tc, server_bin, 2, 1, NULL);
}

static int stop(void **state)
{
    (void)state;
    return test_cluster_stop(&tc);
}

enum { N = 20000 }; /* split over both servers, many 4 KiB chunks */

/* Values that bfloat16 cannot carry: a lossy wire would change them. */
static void fill(float *x, float scale)
{
    for (int k = 0; k < N; k++)
        x[k] = scale * (float)(k + 1) / 3.0f;
}

static ps_var *make(ps_client *c, const char *name, ps_optimizer opt, int staleness)
{
    ps_var_spec spec;
    ps_var_spec_init(&spec, name);
    spec.ndims = 1;
    spec.dims[0] = N;
    spec.initializer = PS_INIT_UNIFORM;
    spec.init_a = -1;
    spec.init_b = 1;
    spec.optimizer = opt;
    spec.learning_rate = 0.5;
    spec.staleness = staleness;
    ps_var *v = NULL;
    if (ps_var_create(c, &spec, &v) != PS_OK)
        fprintf(stderr, "create %s: %s\n", name, ps_last_error());
    return v;
}

static void test_assign_writes_values_as_they_are(void **state)
{
    (void)state;
    ps_client *w = open_client(0, "bfloat16"), *reader = open_client(-1, NULL);
    assert_non_null(w);
    assert_non_null(reader);
    float *x = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
    const ps_optimizer opts[] = {PS_OPT_SGD, PS_OPT_ADAM};
    const int bounds[] = {PS_STALENESS_BSP, PS_STALENESS_ASYNC};
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof(name), "assign/%d", i);
        ps_var *v = make(w, name, opts[i % 2], bounds[i / 2]);
        assert_non_null(v);
        assert_int_equal(ps_var_num_shards(v), 2);
        fill(x, (float)(i + 1));
        assert_int_equal(ps_assign(w, v, x), PS_OK);
        /* at once (under BSP too: no aggregate, no clock), exact, no optimizer step */
        ps_var *rv = test_find_var(reader, name);
        assert_non_null(rv);
        assert_int_equal(ps_pull(reader, rv, got), PS_OK);
        assert_memory_equal(got, x, N * sizeof(float));
    }
    /* a range, asynchronously */
    ps_var *v = test_find_var(w, "assign/3");
    float part[10] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 1.1f};
    ps_op *op = NULL;
    assert_int_equal(ps_assign_async(w, v, N - 15, 10, part, NULL, NULL, &op), PS_OK);
    assert_int_equal(ps_op_wait(op), PS_OK);
    ps_op_destroy(op);
    assert_int_equal(ps_pull_range(reader, test_find_var(reader, "assign/3"), N - 15, 10, got),
                     PS_OK);
    assert_memory_equal(got, part, sizeof(part));
    /* pushes apply on top of the assigned values: SGD lr 0.5, gradient 1 (exact in bf16) */
    ps_var *s = test_find_var(w, "assign/2"); /* SGD, asynchronous */
    fill(x, 3.0f);
    float *g = malloc(N * sizeof(float));
    for (int k = 0; k < N; k++)
        g[k] = 1.0f;
    assert_int_equal(ps_push(w, s, g), PS_OK);
    assert_int_equal(ps_pull(reader, test_find_var(reader, "assign/2"), got), PS_OK);
    for (int k = 0; k < N; k++)
        assert_true(got[k] == x[k] - 0.5f);
    /* two assigns and a push: the version counts each once */
    ps_server_stats before, after;
    assert_int_equal(ps_server_status(reader, 0, &before), PS_OK);
    assert_int_equal(ps_assign_range(w, s, 0, 1, x), PS_OK);
    assert_int_equal(ps_server_status(reader, 0, &after), PS_OK);
    assert_true(after.updates_applied == before.updates_applied + 1);
    free(g);
    free(x);
    free(got);
    ps_client_close(w);
    ps_client_close(reader);
}

static void test_assign_bad_arguments(void **state)
{
    (void)state;
    ps_client *c = open_client(-1, NULL);
    assert_non_null(c);
    ps_var *v = make(c, "assign/bad", PS_OPT_SGD, PS_STALENESS_ASYNC);
    assert_non_null(v);
    float x[4] = {1, 2, 3, 4};
    assert_int_equal(ps_assign(c, v, NULL), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "NULL buffer"));
    assert_int_equal(ps_assign_range(c, v, N - 2, 4, x), PS_OUT_OF_RANGE);
    assert_non_null(strstr(ps_last_error(), "outside \"assign/bad\""));
    assert_int_equal(ps_assign(NULL, v, x), PS_INVALID_ARGUMENT);
    ps_op *op = NULL;
    assert_int_equal(ps_assign_async(c, v, 0, 4, NULL, NULL, NULL, &op), PS_INVALID_ARGUMENT);
    assert_null(op);
    ps_client_close(c);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_assign_writes_values_as_they_are, start, stop),
        cmocka_unit_test_setup_teardown(test_assign_bad_arguments, start, stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
