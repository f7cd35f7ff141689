/* Integration: 2 real ps-server processes, 3 concurrent client processes pushing integer
 * gradients to a range-split and a small variable. With SGD (lr 1) from zeros the final values
 * are minus the exact sums: nothing lost, nothing doubled. One client resends requests every
 * few milliseconds (at-least-once transport) to make duplicates arrive for real. A replayed
 * push with an old sequence number is dropped. Resends stay refused after dedup-table
 * evictions and a restart; a restarted server reports the version it began serving with. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
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
#define BIG_COLS 1024 /* 3 MiB: cut in 3 parts of 2^18 floats placed by slot, many chunks */
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
    assert_int_equal(ps_var_num_shards(big), 3); /* parts (split-parts, the default) */
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

/* Raw pushes of 1.0 to element 0 of name, one per id ids[0..n) with sequence number seq:
 * counts replies by outcome. Any other status fails the test. */
typedef struct push_counts {
    int applied, duplicate, aborted;
} push_counts;

static push_counts raw_pushes(nng_socket s, const char *name, const uint64_t *ids, int n,
                              uint64_t seq)
{
    push_counts pc = {0, 0, 0};
    for (int i = 0; i < n; i++) {
        int st;
        bool dup;
        test_raw_push(s, name, -1, ids[i], seq, 1.0f, &st, &dup);
        if (st == PS_OK && dup)
            pc.duplicate++;
        else if (st == PS_OK)
            pc.applied++;
        else if (st == PS_ABORTED)
            pc.aborted++;
        else
            fail_msg("push of client %016llx seq %llu: status %d", (unsigned long long)ids[i],
                     (unsigned long long)seq, st);
    }
    return pc;
}

static float pull_one(const test_ps *p, const char *name)
{
    ps_client *c = test_ps_open_client(p, NULL, NULL);
    assert_non_null(c);
    ps_var *v = test_find_var(c, name);
    assert_non_null(v);
    float val = 0;
    assert_int_equal(ps_pull(c, v, &val), PS_OK);
    ps_client_close(c);
    return val;
}

/* dedup-max-clients 100: 110 fresh clients each push seq 1 and resend it; 20 clients push
 * seq 1..3, 5,000 fresh ids flood the table (far past its 400 tombstones), the 20 resend seq
 * 3. No resend is ever applied (each is a duplicate or ABORTED), the clients' next pushes
 * are; and after a clean restart from the checkpoint every resend is still refused (the
 * tombstones and floors are checkpointed). The value counts every applied push exactly. */
static void test_eviction_flood_never_applies_twice(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-dedup-flood");
    char ckdir[300];
    snprintf(ckdir, sizeof(ckdir), "%s/ck", p.dir);
    const char *const flags[] = {
        "--dedup-max-clients", "100", "--checkpoint-dir", ckdir, "--log-format", "text", NULL};
    test_ps_start(&p, flags);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    assert_non_null(test_make_var(c, "ev/x", 1));
    ps_client_close(c);
    nng_socket s = test_raw_dial(p.port, 10000);

    enum { N1 = 110, NL = 20, NF = 5000 };
    static uint64_t first[N1], legit[NL], flood[NF];
    uint64_t x = 0x9d2c5680u;
    for (int i = 0; i < N1; i++)
        first[i] = 0xe0000000000000ull + (x = x * 6364136223846793005ull + 1);
    for (int i = 0; i < NL; i++)
        legit[i] = 0x1e0000000000000ull + (uint64_t)i;
    for (int i = 0; i < NF; i++)
        flood[i] = (x = x * 6364136223846793005ull + 1442695040888963407ull);

    int applied = 0;
    push_counts a = raw_pushes(s, "ev/x", first, N1, 1);
    assert_int_equal(a.applied, N1);
    applied += a.applied;
    push_counts r = raw_pushes(s, "ev/x", first, N1, 1); /* the resends */
    assert_int_equal(r.applied, 0);
    assert_true(r.aborted >= N1 - 100);
    fprintf(stderr, "110 clients' resends: %d duplicates, %d refused, 0 applied\n", r.duplicate,
            r.aborted);
    for (uint64_t q = 1; q <= 3; q++) {
        a = raw_pushes(s, "ev/x", legit, NL, q);
        assert_int_equal(a.applied, NL);
        applied += a.applied;
    }
    a = raw_pushes(s, "ev/x", flood, NF, 1);
    applied += a.applied; /* an id whose hashed floors the flood already set is refused */
    assert_true(a.applied > NF * 9 / 10);
    r = raw_pushes(s, "ev/x", legit, NL, 3);
    assert_int_equal(r.applied, 0);
    assert_int_equal(r.aborted, NL);
    r = raw_pushes(s, "ev/x", flood, NF, 1);
    assert_int_equal(r.applied, 0);
    a = raw_pushes(s, "ev/x", legit, NL, 4); /* newer pushes still go through */
    assert_int_equal(a.applied, NL);
    applied += a.applied;
    /* Fresh libpsclient clients (seqs from the wall clock) push after the flood. */
    for (int i = 0; i < 5; i++) {
        c = test_ps_open_client(&p, NULL, NULL);
        assert_non_null(c);
        ps_var *v = test_find_var(c, "ev/x");
        assert_non_null(v);
        float one = 1.0f;
        assert_int_equal(ps_push(c, v, &one), PS_OK);
        applied++;
        ps_client_close(c);
    }
    assert_true(pull_one(&p, "ev/x") == -(float)applied);
    nng_close(s);

    /* Evictions were logged. */
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "grep -q 'dedup table: .* clients evicted for room' %s", p.log);
    assert_int_equal(system(cmd), 0);

    /* A clean restart restores the windows, tombstones and floors from the checkpoint. */
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_start(&p, flags);
    s = test_raw_dial(p.port, 10000);
    r = raw_pushes(s, "ev/x", first, N1, 1);
    assert_int_equal(r.applied, 0);
    r = raw_pushes(s, "ev/x", legit, NL, 4);
    assert_int_equal(r.applied, 0);
    r = raw_pushes(s, "ev/x", legit, NL, 3);
    assert_int_equal(r.applied, 0);
    r = raw_pushes(s, "ev/x", flood, NF / 10, 1);
    assert_int_equal(r.applied, 0);
    a = raw_pushes(s, "ev/x", legit, NL, 5);
    assert_int_equal(a.applied, NL);
    applied += a.applied;
    assert_true(pull_one(&p, "ev/x") == -(float)applied);
    nng_close(s);
    test_ps_cleanup(&p);
}

/* A raw push of 1.0 to element 0 of name as worker `worker`: asserts OK and returns the
 * reply's version and restored_version. */
static void raw_push_versions(nng_socket s, const char *name, int worker, uint64_t client,
                              uint64_t seq, uint64_t *version, uint64_t *restored)
{
    test_push_reply r = test_raw_push_reply(s, name, worker, client, seq, 1.0f);
    assert_int_equal(r.status, PS_OK);
    *version = r.version;
    *restored = r.restored_version;
}

static void raw_clock(nng_socket s, int worker, int64_t clock)
{
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__CLOCK;
    env.request_id = 1;
    env.worker_id = worker;
    env.clock = clock;
    frame f;
    nng_msg *m;
    assert_int_equal(test_raw_request(s, &env, NULL, 0, &f, &m), PS_OK);
    frame_fini(&f);
    nng_msg_free(m);
}

/* PushReply.restored_version is the version the restarted server began serving with: a BSP
 * aggregate that a sweep applies after the restart (both restored workers silent past
 * worker-timeout-ms), before the first request, is a new update of this process and must not
 * count as restored (it would hide one lost update from the clients' count). */
static void test_restored_version_excludes_later_aggregate(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-restored");
    char ckdir[300];
    snprintf(ckdir, sizeof(ckdir), "%s/ck", p.dir);
    const char *const flags[] = {
        "--checkpoint-dir", ckdir, "--worker-timeout-ms", "300", "--log-format", "text", NULL};
    test_ps_start(&p, flags);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    assert_non_null(test_make_var_bound(c, "rv/b", 1, 0)); /* BSP */
    ps_client_close(c);
    nng_socket s = test_raw_dial(p.port, 10000);
    uint64_t version, restored;
    /* Two updates applied at once (no worker id), then workers 0 and 1 at clock 0 and a
     * gradient of worker 0 in the aggregate of clock 0, pending worker 1. */
    raw_push_versions(s, "rv/b", -1, 0x7e57, 1, &version, &restored);
    raw_push_versions(s, "rv/b", -1, 0x7e57, 2, &version, &restored);
    assert_int_equal(version, 2);
    raw_clock(s, 0, 0);
    raw_clock(s, 1, 0);
    raw_push_versions(s, "rv/b", 0, 0x7e58, 1, &version, &restored);
    assert_int_equal(version, 2); /* aggregated, not applied */
    nng_close(s);
    test_ps_signal_wait(&p, SIGTERM, 0); /* its final checkpoint: version 2, aggregate */

    test_ps_start(&p, flags);
    /* Nothing is sent until the sweep has evicted both restored workers and applied the
     * aggregate. */
    char cmd[800];
    snprintf(cmd, sizeof(cmd), "grep -q 'worker 0 evicted' %s && grep -q 'worker 1 evicted' %s",
             p.log, p.log);
    int waited = 0;
    while (system(cmd) != 0 && waited < 10000) {
        usleep(50 * 1000);
        waited += 50;
    }
    assert_true(waited < 10000);
    usleep(200 * 1000);
    s = test_raw_dial(p.port, 10000);
    raw_push_versions(s, "rv/b", -1, 0x7e59, 1, &version, &restored);
    assert_int_equal(version, 4); /* 2, the aggregate, this push */
    assert_int_equal(restored, 2);
    nng_close(s);
    assert_true(pull_one(&p, "rv/b") == -4.0f);
    test_ps_cleanup(&p);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_exact_sums),
        cmocka_unit_test(test_replayed_push_is_dropped),
        cmocka_unit_test(test_eviction_flood_never_applies_twice),
        cmocka_unit_test(test_restored_version_excludes_later_aggregate),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
