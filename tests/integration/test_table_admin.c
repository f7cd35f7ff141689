/* Integration: sparse tables as a cluster's operator sees them, against real ps-server
 * processes: a table's creation is acknowledged only once a checkpoint holds it (a SIGKILL
 * right after it loses nothing), deleting a table (every server, memory back, the name free
 * again, handles and steps refused), and tables in ServerStatus and `psctl vars`. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "psclient.h"

#define DIM 4

static const char *server_bin;
static const char *psctl_bin;
static test_cluster tc;

static int start(void **state)
{
    (void)state;
    return test_cluster_start(&tc, server_bin, 2, NULL);
}

static int stop(void **state)
{
    (void)state;
    return test_cluster_stop(&tc);
}

static ps_client *cluster_client(void)
{
    char tf[1400];
    test_cluster_tf_config(&tc, NULL, 0, tf, sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    assert_int_equal(ps_config_set(cfg, "tf-config", tf), PS_OK);
    assert_int_equal(ps_client_open(&c, cfg), PS_OK);
    ps_config_destroy(cfg);
    return c;
}

static ps_table *make_table(ps_client *c, const char *name, uint32_t dim, float init)
{
    ps_table_spec s;
    ps_table_spec_init(&s, name, dim, PS_OPT_ADAGRAD);
    s.initializer = PS_INIT_CONSTANT;
    s.init_a = init;
    ps_table *t = NULL;
    if (ps_table_create(c, &s, &t) != PS_OK)
        fprintf(stderr, "create table %s: %s\n", name, ps_last_error());
    return t;
}

static void push_some(ps_table *t, int64_t first, size_t n)
{
    int64_t *ids = malloc(n * sizeof(*ids));
    float *g = malloc(n * DIM * sizeof(float));
    for (size_t i = 0; i < n; i++)
        ids[i] = first + (int64_t)i;
    for (size_t i = 0; i < n * DIM; i++)
        g[i] = 0.5f;
    assert_int_equal(ps_table_push(t, ids, n, g), PS_OK);
    free(ids);
    free(g);
}

/* ---- a table's creation is durable before it is acknowledged ------------------------------ */

static void test_create_is_durable(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-table-durable");
    /* No periodic checkpoint: only the create's own can hold the table. */
    const char *const flags[] = {"--checkpoint-dir", p.dir, NULL};
    test_ps_start(&p, flags);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_checkpoint_status before;
    assert_int_equal(ps_server_checkpoint_status(c, 0, &before), PS_OK);
    ps_table *t = make_table(c, "dur/emb", DIM, 0.25f);
    assert_non_null(t);
    ps_checkpoint_status after;
    assert_int_equal(ps_server_checkpoint_status(c, 0, &after), PS_OK);
    fprintf(stderr, "checkpoint seq before the create %llu, after %llu\n",
            (unsigned long long)before.last_seq, (unsigned long long)after.last_seq);
    assert_true(after.last_seq > before.last_seq);
    /* The same create again is durable already: no new checkpoint. */
    ps_table *again = make_table(c, "dur/emb", DIM, 0.25f);
    assert_non_null(again);
    ps_checkpoint_status same;
    assert_int_equal(ps_server_checkpoint_status(c, 0, &same), PS_OK);
    assert_int_equal(same.last_seq, after.last_seq);
    ps_table_free(again);
    ps_table_free(t);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&p, flags);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    assert_int_equal(ps_table_lookup(c, "dur/emb", &t), PS_OK);
    int64_t id = 42;
    float row[DIM];
    assert_int_equal(ps_table_pull(t, &id, 1, row), PS_OK);
    for (int k = 0; k < DIM; k++)
        assert_true(row[k] == 0.25f);
    ps_table_free(t);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* A BSP table's aggregate is in checkpoints: a push acknowledged before a checkpoint and not
 * yet applied (the other worker had not clocked) is applied after a SIGKILL and restart, once
 * both workers clock. */
static ps_client *worker_of(const test_ps *p, int w)
{
    char tf[512];
    snprintf(tf, sizeof(tf),
             "{\"cluster\":{\"ps\":[\"127.0.0.1:%d\"],\"worker\":[\"127.0.0.1:1\","
             "\"127.0.0.1:2\"]},\"task\":{\"type\":\"worker\",\"index\":%d}}",
             p->port, w);
    ps_config *cfg;
    ps_client *c = NULL;
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    assert_int_equal(ps_config_set(cfg, "tf-config", tf), PS_OK);
    assert_int_equal(ps_config_set(cfg, "deadline-ms", "20000"), PS_OK);
    assert_int_equal(ps_client_open(&c, cfg), PS_OK);
    ps_config_destroy(cfg);
    return c;
}

static void test_bsp_aggregate_survives_restart(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-table-bsp");
    snprintf(p.spec, sizeof(p.spec),
             "{\"ps\":[\"127.0.0.1:%d\"],\"worker\":[\"127.0.0.1:1\",\"127.0.0.1:2\"]}", p.port);
    const char *const flags[] = {"--checkpoint-dir", p.dir, NULL};
    test_ps_start(&p, flags);
    ps_client *w0 = worker_of(&p, 0), *w1 = worker_of(&p, 1);
    ps_table_spec s;
    ps_table_spec_init(&s, "bspck/emb", DIM, PS_OPT_SGD);
    s.learning_rate = 0.5;
    s.initializer = PS_INIT_CONSTANT;
    s.init_a = 1.0;
    s.staleness = PS_STALENESS_BSP;
    ps_table *t;
    assert_int_equal(ps_table_create(w0, &s, &t), PS_OK);
    int64_t ids[3] = {5, -6, 5};
    float g[3 * DIM];
    for (int i = 0; i < 3 * DIM; i++)
        g[i] = 0.25f;
    assert_int_equal(ps_table_push(t, ids, 3, g), PS_OK); /* worker 0, clock 0: aggregated */
    assert_int_equal(ps_checkpoint(w0), PS_OK);
    ps_table_free(t);
    ps_client_close(w0);
    ps_client_close(w1);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&p, flags);
    w0 = worker_of(&p, 0);
    w1 = worker_of(&p, 1);
    assert_int_equal(ps_table_lookup(w0, "bspck/emb", &t), PS_OK);
    float rows[3 * DIM];
    ps_client *plain = test_ps_open_client(&p, NULL, NULL);
    ps_table *tp;
    assert_int_equal(ps_table_lookup(plain, "bspck/emb", &tp), PS_OK);
    assert_int_equal(ps_table_pull(tp, ids, 3, rows), PS_OK);
    for (int i = 0; i < 3 * DIM; i++)
        assert_true(rows[i] == 1.0f); /* not applied yet */
    assert_int_equal(ps_clock(w0, NULL), PS_OK);
    assert_int_equal(ps_clock(w1, NULL), PS_OK); /* both past clock 0: applied */
    assert_int_equal(ps_table_pull(tp, ids, 3, rows), PS_OK);
    for (int k = 0; k < DIM; k++) {
        assert_true(rows[k] == 1.0f - 0.5f * 0.5f);        /* id 5: 0.25 twice in one push */
        assert_true(rows[DIM + k] == 1.0f - 0.5f * 0.25f); /* id -6 */
        assert_true(rows[2 * DIM + k] == rows[k]);
    }
    ps_table_free(t);
    ps_table_free(tp);
    ps_client_close(w0);
    ps_client_close(w1);
    ps_client_close(plain);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* ---- delete ---------------------------------------------------------------------------------- */

static uint64_t table_bytes_held(ps_client *c, int server)
{
    ps_server_stats st;
    assert_int_equal(ps_server_status(c, server, &st), PS_OK);
    return st.bytes_held;
}

static void test_delete(void **state)
{
    (void)state;
    ps_client *c = cluster_client();
    ps_table *t = make_table(c, "del/emb", DIM, 1.0f);
    assert_non_null(t);
    uint64_t held0 = table_bytes_held(c, 0) + table_bytes_held(c, 1);
    push_some(t, -500, 5000);
    uint64_t held1 = table_bytes_held(c, 0) + table_bytes_held(c, 1);
    fprintf(stderr, "bytes held: %llu empty, %llu with 5000 rows\n", (unsigned long long)held0,
            (unsigned long long)held1);
    assert_true(held1 > held0);
    assert_int_equal(ps_table_delete(c, "del/emb"), PS_OK);
    uint64_t held2 = table_bytes_held(c, 0) + table_bytes_held(c, 1);
    fprintf(stderr, "bytes held after the delete: %llu\n", (unsigned long long)held2);
    assert_true(held2 < held0);
    /* The handle still held: every call is NOT_FOUND, a step's table item too. */
    int64_t ids[2] = {-500, 7};
    float rows[2 * DIM], g[2 * DIM] = {0};
    assert_int_equal(ps_table_pull(t, ids, 2, rows), PS_NOT_FOUND);
    assert_int_equal(ps_table_push(t, ids, 2, g), PS_NOT_FOUND);
    ps_table_item ti = PS_TABLE_ITEM_INIT;
    ti.table = t, ti.ids = ids, ti.n = 2, ti.rows = rows;
    assert_int_equal(ps_step_ex(c, NULL, 0, &ti, 1, 0), PS_NOT_FOUND);
    assert_non_null(strstr(ps_last_error(), "del/emb"));
    ps_table *gone;
    assert_int_equal(ps_table_lookup(c, "del/emb", &gone), PS_NOT_FOUND);
    assert_int_equal(ps_table_delete(c, "del/emb"), PS_NOT_FOUND);
    assert_non_null(strstr(ps_last_error(), "not found on any"));
    /* The name is free again: another spec, fresh rows from its initializer. */
    ps_table *t2 = make_table(c, "del/emb", 2 * DIM, 3.0f);
    assert_non_null(t2);
    float fresh[2 * 2 * DIM];
    assert_int_equal(ps_table_pull(t2, ids, 2, fresh), PS_OK);
    for (int k = 0; k < 2 * 2 * DIM; k++)
        assert_true(fresh[k] == 3.0f);
    /* A dense variable's delete is unchanged next to it. */
    ps_var *v = test_make_var(c, "del/dense", 3);
    assert_non_null(v);
    assert_int_equal(ps_var_delete(c, "del/dense"), PS_OK);
    assert_int_equal(ps_table_pull(t2, ids, 2, fresh), PS_OK);
    ps_table_free(t);
    ps_table_free(t2);
    ps_client_close(c);
}

/* ---- tables in ServerStatus and psctl ------------------------------------------------------ */

/* Runs psctl with args against the cluster; its stdout in buf. Returns its exit status. */
static int psctl(const char *args, char *buf, size_t cap)
{
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "'%s' --cluster '%s' %s 2>&1", psctl_bin, tc.spec, args);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    int st = pclose(f);
    fprintf(stderr, "psctl %s:\n%s", args, buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_status_and_psctl(void **state)
{
    (void)state;
    if (psctl_bin == NULL)
        skip();
    ps_client *c = cluster_client();
    ps_table_spec s;
    ps_table_spec_init(&s, "st/emb", 8, PS_OPT_ADAM);
    s.min_count = 2;
    s.max_rows = 10; /* per server */
    ps_table *t = NULL;
    assert_int_equal(ps_table_create(c, &s, &t), PS_OK);
    ps_table *u = make_table(c, "st/other", DIM, 0.0f);
    assert_non_null(u);
    ps_var *v = test_make_var(c, "st/dense", 3);
    assert_non_null(v);
    enum { N = 50 };
    int64_t ids[N];
    float g[N * 8];
    for (int i = 0; i < N; i++)
        ids[i] = 1000 + i;
    for (int i = 0; i < N * 8; i++)
        g[i] = 0.25f;
    assert_int_equal(ps_table_push(t, ids, N, g), PS_OK); /* counted only */
    assert_int_equal(ps_table_push(t, ids, N, g), PS_OK); /* admitted, past max_rows */
    float rows[N * 8];
    assert_int_equal(ps_table_pull(t, ids, N, rows), PS_OK);
    ps_table_info info = {.struct_size = sizeof(info)};
    assert_int_equal(ps_table_info_get(c, "st/emb", &info), PS_OK);
    fprintf(stderr,
            "st/emb: rows %llu bytes %llu created %llu counted %llu evicted max_rows %llu "
            "lookups %llu updated %llu\n",
            (unsigned long long)info.rows, (unsigned long long)info.bytes,
            (unsigned long long)info.rows_created, (unsigned long long)info.pushes_counted,
            (unsigned long long)info.evicted_max_rows, (unsigned long long)info.lookups,
            (unsigned long long)info.rows_updated);
    assert_int_equal(info.dim, 8);
    assert_int_equal(info.servers, 2);
    assert_int_equal(info.optimizer, PS_OPT_ADAM);
    assert_int_equal(info.staleness, -1); /* the servers' default-staleness */
    assert_true(info.rows > 0 && info.rows <= 2 * 10);
    assert_int_equal(info.rows, info.rows_created - info.evicted_max_rows);
    /* Past max_rows a new row evicts its partition's oldest, or is only counted when its
     * partition has none (table.h): either way every second push beyond the 20 is accounted. */
    assert_true(info.pushes_counted >= N);
    assert_int_equal(info.rows_created + info.pushes_counted, 2 * N);
    assert_int_equal(info.lookups, N);
    assert_true(info.bytes > 0);
    assert_int_equal(info.evicted_ttl + info.evicted_memory, 0);
    ps_table_info missing = {.struct_size = sizeof(missing)};
    assert_int_equal(ps_table_info_get(c, "st/none", &missing), PS_NOT_FOUND);
    assert_int_equal(ps_table_info_get(c, "st/dense", &missing), PS_NOT_FOUND);
    missing.struct_size = 4;
    assert_int_equal(ps_table_info_get(c, "st/emb", &missing), PS_INVALID_ARGUMENT);
    char **names;
    size_t n;
    assert_int_equal(ps_table_list(c, &names, &n), PS_OK);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "st/emb");
    assert_string_equal(names[1], "st/other");
    ps_names_free(names, n);
    /* psctl vars: the variables' names, then a line per table. */
    char out[8192], want[256];
    assert_int_equal(psctl("vars", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "st/dense\n"));
    snprintf(want, sizeof(want),
             "st/emb\ttable dim=8 rows=%llu bytes=%llu admissions=%llu evictions=%llu\n",
             (unsigned long long)info.rows, (unsigned long long)info.bytes,
             (unsigned long long)info.rows_created, (unsigned long long)info.evicted_max_rows);
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "st/other\ttable dim=4 rows=0 "));
    assert_int_equal(psctl("--json vars", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "\"variables\":[\"st/dense\"],\"tables\":[{\"name\":\"st/emb\","
                                "\"kind\":\"table\",\"dim\":8,\"staleness_bound\":-1,"
                                "\"optimizer\":\"adam\""));
    snprintf(want, sizeof(want), "\"evictions\":{\"ttl\":0,\"max_rows\":%llu,\"memory\":0}",
             (unsigned long long)info.evicted_max_rows);
    assert_non_null(strstr(out, want));
    assert_int_equal(psctl("vars st/emb", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "kind:            table\n"));
    assert_non_null(strstr(out, "dim:             8\n"));
    assert_non_null(strstr(out, "servers:         2\n"));
    assert_int_equal(psctl("vars st/none", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "NOT_FOUND"));
    assert_non_null(strstr(out, "st/none"));
    ps_table_free(t);
    ps_table_free(u);
    ps_client_close(c);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    psctl_bin = argc > 2 ? argv[2] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_is_durable),
        cmocka_unit_test(test_bsp_aggregate_survives_restart),
        cmocka_unit_test_setup_teardown(test_delete, start, stop),
        cmocka_unit_test_setup_teardown(test_status_and_psctl, start, stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
