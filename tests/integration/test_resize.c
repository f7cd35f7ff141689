/* Integration: a cluster restored onto another number of servers from a shared checkpoint
 * directory (2 -> 3, 3 -> 2, 1 -> 4). A cluster of n_from servers trains a dense variable split
 * over the servers (Adagrad), one cut in fixed parts (split-parts: 3 * 2^18 + 5 elements, 4
 * parts placed by slot, momentum), one as large split in ranges (made by a client without
 * split-parts: on another number of servers it comes back cut in parts), a small one held whole
 * (Adam) and a sparse table (Adagrad),
 * checkpoints between steps (a full file, then deltas: the final checkpoint of the stop is a
 * delta of the chain) and stops. A cluster of n_to servers on the same directory then pulls
 * exactly (bit for bit) what was pulled before the stop, and one more step gives exactly what
 * the same step gives on a cluster of n_from servers restored from a copy of the directory:
 * the optimizer slots came back too. The n_to servers restart from their own files, and n_from
 * servers started again restore from those, not from their own older ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "psclient.h"

#define BIG 10007              /* split over 2 or more servers (split-threshold-bytes 1K) */
#define SMALL 13               /* held whole */
#define PARTS (3 * 262144 + 5) /* cut in 4 parts (split-parts), the last of 5 elements */
#define DIM 8
#define NIDS 300

static const char *server_bin;

typedef struct cluster {
    int n;
    int ports[TEST_MAX_SERVERS];
    pid_t pids[TEST_MAX_SERVERS];
    char spec[512];
    char log[600];
} cluster;

typedef struct model {
    float big[BIG], small[SMALL], rows[NIDS * DIM], parts[PARTS], ranges[PARTS];
} model;

static int64_t ids[NIDS];

/* n servers on checkpoint directory dir (deltas: a full file every 10), started and
 * listening (each has restored what it restores before it listens). */
static void cluster_start(cluster *c, int n, const char *dir)
{
    c->n = n;
    size_t off = (size_t)snprintf(c->spec, sizeof(c->spec), "{\"ps\":[");
    for (int i = 0; i < n; i++) {
        c->ports[i] = test_free_port();
        off += (size_t)snprintf(c->spec + off, sizeof(c->spec) - off, "%s\"127.0.0.1:%d\"",
                                i ? "," : "", c->ports[i]);
    }
    snprintf(c->spec + off, sizeof(c->spec) - off, "]}");
    snprintf(c->log, sizeof(c->log), "%s.log", dir);
    const char *extra[] = {"--checkpoint-dir", dir, "--checkpoint-full-every", "10", NULL};
    for (int i = 0; i < n; i++) {
        c->pids[i] = test_server_spawn(server_bin, c->spec, i, extra, c->log);
        assert_true(c->pids[i] > 0);
    }
    for (int i = 0; i < n; i++)
        if (test_wait_port(c->ports[i], 20000) != 0) {
            char cmd[700];
            snprintf(cmd, sizeof(cmd), "tail -n 30 %s >&2", c->log);
            (void)!system(cmd);
            fail_msg("ps %d of %d does not listen", i, n);
        }
}

/* SIGTERM to every server: each writes its final checkpoint and exits 0. */
static void cluster_stop(cluster *c)
{
    for (int i = 0; i < c->n; i++)
        kill(c->pids[i], SIGTERM);
    for (int i = 0; i < c->n; i++)
        assert_int_equal(test_wait_exit(c->pids[i], 30000), 0);
}

/* A client of c; parts: split-parts (new large variables cut in parts). */
static ps_client *cluster_client_parts(const cluster *c, bool parts)
{
    ps_config *cfg;
    ps_client *cl = NULL;
    char tf[700];
    snprintf(tf, sizeof(tf), "{\"cluster\":%s}", c->spec);
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    assert_int_equal(ps_config_set(cfg, "cluster", tf), PS_OK);
    assert_int_equal(ps_config_set(cfg, "deadline-ms", "20000"), PS_OK);
    assert_int_equal(ps_config_set(cfg, "split-threshold-bytes", "1K"), PS_OK);
    assert_int_equal(ps_config_set(cfg, "split-parts", parts ? "true" : "false"), PS_OK);
    if (ps_client_open(&cl, cfg) != PS_OK)
        fail_msg("open: %s", ps_last_error());
    ps_config_destroy(cfg);
    return cl;
}

static ps_client *cluster_client(const cluster *c)
{
    return cluster_client_parts(c, true);
}

static void make_model(const cluster *cl, ps_client *c)
{
    ps_var_spec s;
    ps_var *v;
    ps_var_spec_init(&s, "resize/big");
    s.ndims = 1;
    s.dims[0] = BIG;
    s.optimizer = PS_OPT_ADAGRAD;
    s.learning_rate = 0.1;
    s.staleness = PS_STALENESS_ASYNC;
    assert_int_equal(ps_var_create(c, &s, &v), PS_OK);
    ps_var_spec_init(&s, "resize/parts");
    s.ndims = 1;
    s.dims[0] = PARTS;
    s.initializer = PS_INIT_UNIFORM;
    s.init_a = -0.5;
    s.init_b = 0.5;
    s.seed = 7;
    s.optimizer = PS_OPT_MOMENTUM;
    s.learning_rate = 0.05;
    s.momentum = 0.9;
    s.staleness = PS_STALENESS_ASYNC;
    assert_int_equal(ps_var_create(c, &s, &v), PS_OK);
    assert_int_equal(ps_var_num_shards(v), 4);
    /* The same in ranges, by a client without split-parts. */
    ps_client *rc = cluster_client_parts(cl, false);
    ps_var_spec_init(&s, "resize/ranges");
    s.ndims = 1;
    s.dims[0] = PARTS;
    s.initializer = PS_INIT_NORMAL;
    s.init_b = 0.1;
    s.seed = 11;
    s.optimizer = PS_OPT_ADAGRAD;
    s.learning_rate = 0.1;
    s.staleness = PS_STALENESS_ASYNC;
    assert_int_equal(ps_var_create(rc, &s, &v), PS_OK);
    assert_int_equal(ps_var_num_shards(v), cl->n > 1 ? cl->n : 1);
    ps_client_close(rc);
    /* A client with split-parts creating it again follows what was made (ranges, or held
     * whole on one server); another spec under that name is still refused. */
    ps_var *same;
    assert_int_equal(ps_var_create(c, &s, &same), PS_OK);
    assert_int_equal(ps_var_num_shards(same), cl->n > 1 ? cl->n : 1);
    s.learning_rate = 0.2;
    assert_int_equal(ps_var_create(c, &s, &same), PS_ALREADY_EXISTS);
    assert_non_null(strstr(ps_last_error(), "learning_rate"));
    ps_var_spec_init(&s, "resize/small");
    s.ndims = 1;
    s.dims[0] = SMALL;
    s.optimizer = PS_OPT_ADAM;
    s.learning_rate = 0.01;
    s.staleness = PS_STALENESS_ASYNC;
    assert_int_equal(ps_var_create(c, &s, &v), PS_OK);
    ps_table_spec ts;
    ps_table_spec_init(&ts, "resize/emb", DIM, PS_OPT_ADAGRAD);
    ts.learning_rate = 0.1;
    ts.staleness = PS_STALENESS_ASYNC;
    ps_table *t;
    assert_int_equal(ps_table_create(c, &ts, &t), PS_OK);
    ps_table_free(t);
}

/* One step: a gradient on every element and on every row, a function of the step. */
static void train(ps_client *c, int step)
{
    static float g[BIG], tg[NIDS * DIM], pg[PARTS];
    for (int i = 0; i < BIG; i++)
        g[i] = sinf(0.37f * (float)i + (float)step);
    for (int i = 0; i < PARTS; i++)
        pg[i] = cosf(0.013f * (float)i - (float)step);
    for (int i = 0; i < NIDS * DIM; i++)
        tg[i] = cosf(0.11f * (float)i + (float)step);
    ps_var *v;
    assert_int_equal(ps_var_lookup(c, "resize/big", &v), PS_OK);
    assert_int_equal(ps_push(c, v, g), PS_OK);
    assert_int_equal(ps_var_lookup(c, "resize/parts", &v), PS_OK);
    assert_int_equal(ps_push(c, v, pg), PS_OK);
    assert_int_equal(ps_var_lookup(c, "resize/ranges", &v), PS_OK);
    assert_int_equal(ps_push(c, v, pg), PS_OK);
    assert_int_equal(ps_var_lookup(c, "resize/small", &v), PS_OK);
    assert_int_equal(ps_push(c, v, g + 100), PS_OK);
    ps_table *t;
    assert_int_equal(ps_table_lookup(c, "resize/emb", &t), PS_OK);
    /* Every other step half the rows only: the deltas carry some rows and not others. */
    size_t n = step % 2 ? NIDS / 2 : NIDS;
    assert_int_equal(ps_table_push(t, ids, n, tg), PS_OK);
    ps_table_free(t);
}

static void pull_model(ps_client *c, model *m)
{
    ps_var *v;
    assert_int_equal(ps_var_lookup(c, "resize/big", &v), PS_OK);
    assert_int_equal(ps_pull(c, v, m->big), PS_OK);
    assert_int_equal(ps_var_lookup(c, "resize/parts", &v), PS_OK);
    assert_int_equal(ps_pull(c, v, m->parts), PS_OK);
    assert_int_equal(ps_var_lookup(c, "resize/ranges", &v), PS_OK);
    assert_int_equal(ps_pull(c, v, m->ranges), PS_OK);
    assert_int_equal(ps_var_lookup(c, "resize/small", &v), PS_OK);
    assert_int_equal(ps_pull(c, v, m->small), PS_OK);
    ps_table *t;
    assert_int_equal(ps_table_lookup(c, "resize/emb", &t), PS_OK);
    assert_int_equal(ps_table_pull(t, ids, NIDS, m->rows), PS_OK);
    ps_table_free(t);
}

static void expect_same(const model *a, const model *b, const char *what)
{
    if (memcmp(a->big, b->big, sizeof(a->big)) != 0)
        fail_msg("%s: the split variable differs", what);
    if (memcmp(a->parts, b->parts, sizeof(a->parts)) != 0)
        fail_msg("%s: the variable cut in parts differs", what);
    if (memcmp(a->ranges, b->ranges, sizeof(a->ranges)) != 0)
        fail_msg("%s: the variable made in ranges differs", what);
    if (memcmp(a->small, b->small, sizeof(a->small)) != 0)
        fail_msg("%s: the small variable differs", what);
    if (memcmp(a->rows, b->rows, sizeof(a->rows)) != 0)
        fail_msg("%s: the table's rows differ", what);
}

static void resize(int n_from, int n_to)
{
    for (int i = 0; i < NIDS; i++)
        ids[i] = (int64_t)i * 7919 - 1000; /* negative ones too */
    char dir[64] = "/tmp/psd-resize-XXXXXX", ref[80], cmd[300];
    assert_non_null(mkdtemp(dir));
    snprintf(ref, sizeof(ref), "%s-ref", dir);
    static model before, after, cont, want;

    cluster a;
    cluster_start(&a, n_from, dir);
    ps_client *c = cluster_client(&a);
    make_model(&a, c);
    train(c, 0);
    assert_int_equal(ps_checkpoint(c), PS_OK);
    train(c, 1);
    assert_int_equal(ps_checkpoint(c), PS_OK);
    train(c, 2);
    pull_model(c, &before);
    ps_client_close(c);
    cluster_stop(&a); /* its final checkpoints: deltas */
    snprintf(cmd, sizeof(cmd), "cp -a %s %s", dir, ref);
    assert_int_equal(system(cmd), 0);

    cluster b;
    cluster_start(&b, n_to, dir);
    char line[128];
    snprintf(line, sizeof(line), "from the checkpoints of a cluster of %d ps tasks", n_from);
    assert_true(test_file_contains(b.log, line));
    c = cluster_client(&b);
    pull_model(c, &after);
    expect_same(&before, &after, "restored");
    /* The variable split in ranges over n_from servers came back cut in parts (one held whole
     * on a single server stays whole). */
    ps_var *rv;
    assert_int_equal(ps_var_lookup(c, "resize/ranges", &rv), PS_OK);
    assert_int_equal(ps_var_num_shards(rv), n_from > 1 ? 4 : 1);
    train(c, 3);
    pull_model(c, &cont);
    ps_client_close(c);
    cluster_stop(&b);

    /* The same step on the old number of servers, from the copy. */
    cluster r;
    cluster_start(&r, n_from, ref);
    c = cluster_client(&r);
    pull_model(c, &after);
    expect_same(&before, &after, "restored on the old size");
    train(c, 3);
    pull_model(c, &want);
    ps_client_close(c);
    cluster_stop(&r);
    expect_same(&want, &cont, "one step after the restore");

    /* The new cluster restarts from its own files. */
    cluster_start(&b, n_to, dir);
    c = cluster_client(&b);
    pull_model(c, &after);
    expect_same(&cont, &after, "restarted");
    ps_client_close(c);
    cluster_stop(&b);

    /* Back to n_from servers: their own files of that size are older than the n_to servers'
     * files, which they restore from. */
    cluster_start(&a, n_from, dir);
    c = cluster_client(&a);
    pull_model(c, &after);
    expect_same(&cont, &after, "resized back");
    ps_client_close(c);
    cluster_stop(&a);

    snprintf(cmd, sizeof(cmd), "rm -rf %s %s %s.log %s.log", dir, ref, dir, ref);
    assert_int_equal(system(cmd), 0);
}

static void test_2_to_3(void **state)
{
    (void)state;
    resize(2, 3);
}

static void test_3_to_2(void **state)
{
    (void)state;
    resize(3, 2);
}

static void test_1_to_4(void **state)
{
    (void)state;
    resize(1, 4);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_2_to_3),
        cmocka_unit_test(test_3_to_2),
        cmocka_unit_test(test_1_to_4),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
