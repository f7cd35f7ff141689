/* Integration: 2 real ps-server processes, 3 concurrent client processes pushing integer
 * gradients to a range-split and a small variable. With SGD (lr 1) from zeros the final values
 * are minus the exact sums: nothing lost, nothing doubled. One client resends requests every
 * few milliseconds (at-least-once transport) to make duplicates arrive for real. A replayed
 * push with an old sequence number is dropped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "psclient.h"

#define NCLIENTS 3
#define ROUNDS 12
#define BIG_ROWS 768
#define BIG_COLS 1024 /* 3 MiB: split over both servers, many chunks */
#define SMALL_N 10

static const char *server_bin;
static test_cluster tc;

static int setup(void **state)
{
    (void)state;
    return test_cluster_start(&tc, server_bin, 2, NULL);
}

static int teardown(void **state)
{
    (void)state;
    return test_cluster_stop(&tc);
}

static ps_client *open_client(const char *resend_ms, const char *chunk)
{
    ps_config *cfg;
    ps_client *c = NULL;
    char tf[1200];
    test_cluster_tf_config(&tc, NULL, 0, tf, sizeof(tf));
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    if (ps_config_set(cfg, "cluster", tf) != PS_OK ||
        ps_config_set(cfg, "split-threshold-bytes", "64K") != PS_OK ||
        ps_config_set(cfg, "chunk-bytes", chunk) != PS_OK ||
        ps_config_set(cfg, "deadline-ms", "20000") != PS_OK ||
        (resend_ms && ps_config_set(cfg, "resend-ms", resend_ms) != PS_OK))
        fprintf(stderr, "config: %s\n", ps_last_error());
    else if (ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "open: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

static void spec_for(ps_var_spec *s, const char *name, int rows, int cols)
{
    ps_var_spec_init(s, name);
    s->ndims = 2;
    s->dims[0] = (uint64_t)rows;
    s->dims[1] = (uint64_t)cols;
    s->learning_rate = 1.0; /* SGD: params = -(sum of gradients) */
}

static float big_grad(int client, int round, size_t i)
{
    return (float)((client + 1) * ((int)((i + (size_t)round) % 5) + 1));
}

/* Body of one client process: returns the exit code. */
static int client_main(int id, const void *arg)
{
    (void)arg;
    ps_client *c = open_client(id == 0 ? "10" : NULL, id == 2 ? "1M" : "64K");
    if (c == NULL)
        return 10;
    ps_var_spec s;
    ps_var *big, *small;
    spec_for(&s, "it/big", BIG_ROWS, BIG_COLS);
    if (ps_var_create(c, &s, &big) != PS_OK) {
        fprintf(stderr, "client %d create big: %s\n", id, ps_last_error());
        return 11;
    }
    spec_for(&s, "it/small", 1, SMALL_N);
    if (ps_var_create(c, &s, &small) != PS_OK) {
        fprintf(stderr, "client %d create small: %s\n", id, ps_last_error());
        return 12;
    }
    size_t n = (size_t)ps_var_numel(big);
    float *g = malloc(n * sizeof(float));
    float sg[SMALL_N];
    for (int r = 0; r < ROUNDS; r++) {
        for (size_t i = 0; i < n; i++)
            g[i] = big_grad(id, r, i);
        for (int i = 0; i < SMALL_N; i++)
            sg[i] = (float)(id + 1);
        /* Mix blocking and asynchronous pushes, and a ranged push-pull. */
        ps_op *op;
        if (ps_push_async(c, big, 0, n, g, NULL, NULL, &op) != PS_OK)
            return 13;
        int rc = ps_push(c, small, sg);
        int rc2 = ps_op_wait(op);
        ps_op_destroy(op);
        if (rc != PS_OK || rc2 != PS_OK) {
            fprintf(stderr, "client %d push: %s\n", id, ps_last_error());
            return 14;
        }
    }
    free(g);
    ps_client_close(c);
    return 0;
}

static void test_concurrent_exact_sums(void **state)
{
    (void)state;
    test_fork_clients(NCLIENTS, client_main, NULL);
    ps_client *c = open_client(NULL, "1M");
    assert_non_null(c);
    ps_var *big, *small;
    assert_int_equal(ps_var_lookup(c, "it/big", &big), PS_OK);
    assert_int_equal(ps_var_lookup(c, "it/small", &small), PS_OK);
    assert_int_equal(ps_var_num_shards(big), 2);
    assert_int_equal(ps_var_num_shards(small), 1);
    size_t n = (size_t)ps_var_numel(big);
    float *w = malloc(n * sizeof(float));
    assert_int_equal(ps_pull(c, big, w), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        float expect = 0;
        for (int k = 0; k < NCLIENTS; k++)
            for (int r = 0; r < ROUNDS; r++)
                expect -= big_grad(k, r, i);
        if (w[i] != expect && wrong++ < 5)
            fprintf(stderr, "big[%zu] = %g, expected %g\n", i, w[i], expect);
    }
    assert_int_equal(wrong, 0);
    float sv[SMALL_N];
    assert_int_equal(ps_pull(c, small, sv), PS_OK);
    for (int i = 0; i < SMALL_N; i++)
        assert_true(sv[i] == -(float)(ROUNDS * (1 + 2 + 3)));
    uint64_t dups = 0, applied = 0;
    for (int s = 0; s < 2; s++) {
        ps_server_stats st;
        assert_int_equal(ps_server_status(c, s, &st), PS_OK);
        assert_int_equal(st.task_index, s);
        dups += st.duplicates_dropped;
        applied += st.updates_applied;
    }
    fprintf(stderr, "servers applied %llu pushes and dropped %llu duplicates\n",
            (unsigned long long)applied, (unsigned long long)dups);
    free(w);
    ps_client_close(c);
}

static void test_replayed_push_is_dropped(void **state)
{
    (void)state;
    ps_client *c = open_client(NULL, "1M");
    assert_non_null(c);
    ps_var_spec s;
    ps_var_spec_init(&s, "it/replay");
    s.ndims = 1;
    s.dims[0] = 1;
    s.learning_rate = 1.0;
    ps_var *v;
    assert_int_equal(ps_var_create(c, &s, &v), PS_OK);
    /* Talk to the servers directly with REQ sockets, as a client with a fixed id would. */
    int owner = -1;
    nng_socket sock[2];
    for (int i = 0; i < 2; i++)
        sock[i] = test_raw_dial(tc.ports[i], 5000);
    /* The owner answers OK, the other NOT_FOUND. */
    int st;
    bool dup;
    for (int i = 0; i < 2; i++) {
        test_raw_push(sock[i], "it/replay", 0, 0xabcdef, 7, 3.0f, &st, &dup);
        if (st == 0)
            owner = i;
        else
            assert_int_equal(st, PS_NOT_FOUND);
    }
    assert_true(owner >= 0);
    assert_false(dup);
    test_raw_push(sock[owner], "it/replay", 0, 0xabcdef, 7, 3.0f, &st, &dup); /* replay: dropped */
    assert_int_equal(st, PS_OK);
    assert_true(dup);
    test_raw_push(sock[owner], "it/replay", 0, 0xabcdef, 6, 1.0f, &st,
                  &dup); /* older, never seen: applied */
    assert_int_equal(st, PS_OK);
    assert_false(dup);
    test_raw_push(sock[owner], "it/replay", 0, 0xabcdef, 100000, 1.0f, &st,
                  &dup); /* far ahead: applied */
    assert_int_equal(st, PS_OK);
    test_raw_push(sock[owner], "it/replay", 0, 0xabcdef, 8, 1.0f, &st,
                  &dup); /* behind the window: refused */
    assert_int_equal(st, PS_ABORTED);
    float val;
    assert_int_equal(ps_pull(c, v, &val), PS_OK);
    assert_true(val == -5.0f); /* 3 + 1 + 1, the replay not counted */
    ps_server_stats stats;
    assert_int_equal(ps_server_status(c, owner, &stats), PS_OK);
    assert_true(stats.duplicates_dropped >= 1);
    for (int i = 0; i < 2; i++)
        nng_close(sock[i]);
    ps_client_close(c);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_exact_sums),
        cmocka_unit_test(test_replayed_push_is_dropped),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
