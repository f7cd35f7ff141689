/* Integration: sparse tables in the Step call (ps_step_ex) against 2 real ps-server
 * processes: table rows pushed and pulled with dense items in one request per server, exact
 * rows after known SGD pushes (duplicate ids, lists cut into chunks), a resent step applied
 * once, and bad table items refused before anything is applied. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster_proc.h"
#include "frame.h"
#include "placement.h"
#include "slots.h"
#include "ps_proc.h"
#include "psclient.h"
#include "status.h"

/* The placement of the two servers these tests start. */
static const slot_map cluster2 = {.nslots = SLOTS_DEFAULT, .nservers = 2, .owner = NULL};

#define DIM 4
#define LR 0.5f

static const char *server_bin;
static test_cluster tc;

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

/* Worker 0's client with heartbeat-ms (NULL: the default), chunk-bytes and wire-dtype. */
static ps_client *worker(const char *heartbeat, const char *chunk, const char *wire)
{
    const char *settings[12];
    int k = 0;
    settings[k++] = "deadline-ms";
    settings[k++] = "20000";
    if (heartbeat) {
        settings[k++] = "heartbeat-ms";
        settings[k++] = heartbeat;
    }
    if (chunk) {
        settings[k++] = "chunk-bytes";
        settings[k++] = chunk;
    }
    if (wire) {
        settings[k++] = "wire-dtype";
        settings[k++] = wire;
    }
    settings[k] = NULL;
    return test_cluster_open_worker(&tc, 0, settings);
}

/* An SGD table (learning rate LR) whose rows start at 1.0. */
static ps_table *make_table(ps_client *c, const char *name, uint32_t dim)
{
    ps_table_spec s;
    ps_table_spec_init(&s, name, dim, PS_OPT_SGD);
    s.learning_rate = LR;
    s.initializer = PS_INIT_CONSTANT;
    s.init_a = 1.0;
    ps_table *t = NULL;
    if (ps_table_create(c, &s, &t) != PS_OK)
        fprintf(stderr, "create table %s: %s\n", name, ps_last_error());
    return t;
}

/* n ids with duplicates (every 5th repeats an earlier one), spread over both servers. */
static void some_ids(int64_t *ids, size_t n, int64_t base)
{
    for (size_t i = 0; i < n; i++)
        ids[i] = i % 5 == 4 ? ids[i / 2] : base + (int64_t)i * 7919 - (int64_t)(i % 3) * 1000003;
}

/* Exactly representable gradients: row i is (i % 8 + 1) / 16 + k / 64. */
static void some_grads(float *g, size_t n, uint32_t dim)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < dim; k++)
            g[i * dim + k] = (float)(i % 8 + 1) / 16.0f + (float)k / 64.0f;
}

/* The rows after one SGD push of grads to ids from 1.0: 1 - LR x the sum of an id's rows. */
static void expected_rows(const int64_t *ids, size_t n, const float *g, uint32_t dim, float *want)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < dim; k++) {
            float sum = 0;
            for (size_t j = 0; j < n; j++)
                if (ids[j] == ids[i])
                    sum += g[j * dim + k];
            want[i * dim + k] = 1.0f - LR * sum;
        }
}

/* ---- a step with dense and table items ----------------------------------------------------- */

static void run_exact(const char *chunk, const char *prefix, size_t n)
{
    ps_client *c = worker(NULL, chunk, NULL);
    char name[64];
    snprintf(name, sizeof(name), "%s/emb", prefix);
    ps_table *t = make_table(c, name, DIM);
    assert_non_null(t);
    snprintf(name, sizeof(name), "%s/dense", prefix);
    ps_var *v = test_make_var_bound(c, name, 5, PS_STALENESS_ASYNC);
    assert_non_null(v);
    int64_t *ids = malloc(n * sizeof(*ids));
    float *g = malloc(n * DIM * sizeof(float)), *rows = malloc(n * DIM * sizeof(float));
    float *want = malloc(n * DIM * sizeof(float)), *again = malloc(n * DIM * sizeof(float));
    some_ids(ids, n, -5000);
    some_grads(g, n, DIM);
    expected_rows(ids, n, g, DIM, want);
    float dg[5] = {1, 2, 3, 4, 5}, dp[5] = {0};
    ps_step_item items[1] = {{v, 0, 5, dg, dp}};
    ps_table_item ti = PS_TABLE_ITEM_INIT;
    ti.table = t;
    ti.ids = ids;
    ti.n = n;
    ti.grads = g;
    ti.rows = rows;
    size_t distinct = 0; /* some_ids repeats every fifth id: only the distinct ones travel */
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < i && ids[j] != ids[i])
            j++;
        distinct += j == i;
    }
    assert_true(distinct < n);
    snprintf(name, sizeof(name), "%s/emb", prefix);
    ps_table_info info0 = {.struct_size = sizeof(info0)}, info1 = info0;
    assert_int_equal(ps_table_info_get(c, name, &info0), PS_OK);
    int64_t before = ps_client_clock(c);
    assert_int_equal(ps_step_ex(c, items, 1, &ti, 1, PS_STEP_CLOCK), PS_OK);
    assert_int_equal(ps_client_clock(c), before + 1);
    assert_int_equal(ps_table_info_get(c, name, &info1), PS_OK);
    assert_int_equal(info1.rows_updated - info0.rows_updated, distinct);
    assert_int_equal(info1.lookups - info0.lookups, distinct);
    /* The rows pulled include the step's own push, in the caller's order. */
    assert_memory_equal(rows, want, n * DIM * sizeof(float));
    for (int i = 0; i < 5; i++)
        assert_true(dp[i] == -dg[i]);
    /* And the servers hold them. */
    assert_int_equal(ps_table_pull(t, ids, n, again), PS_OK);
    assert_memory_equal(again, want, n * DIM * sizeof(float));
    /* A pull-only table item next to a push-only dense one. */
    ti.grads = NULL;
    memset(rows, 0, n * DIM * sizeof(float));
    items[0].dst = NULL;
    assert_int_equal(ps_step_ex(c, items, 1, &ti, 1, 0), PS_OK);
    assert_memory_equal(rows, want, n * DIM * sizeof(float));
    free(ids);
    free(g);
    free(rows);
    free(want);
    free(again);
    ps_table_free(t);
    ps_client_close(c);
}

static void test_step_tables_exact(void **state)
{
    (void)state;
    run_exact(NULL, "one", 40);
}

/* 4 KiB chunks: the ids of each server go in several messages (pushes first, then pulls). */
static void test_step_tables_chunked(void **state)
{
    (void)state;
    run_exact("4K", "chunked", 3000);
}

/* The number of requests the servers counted went up by exactly one per server per step. */
static void test_step_tables_one_request_per_server(void **state)
{
    (void)state;
    ps_client *c = worker("0", NULL, NULL); /* heartbeats are requests too */
    ps_table *t1 = make_table(c, "count/t1", DIM), *t2 = make_table(c, "count/t2", 16);
    ps_var *v = test_make_var_bound(c, "count/v", 20000, PS_STALENESS_ASYNC); /* split */
    assert_non_null(t1);
    assert_non_null(t2);
    assert_non_null(v);
    enum { N = 64 };
    int64_t ids[N];
    float g1[N * DIM], r1[N * DIM], g2[N * 16], r2[N * 16];
    some_ids(ids, N, 1);
    some_grads(g1, N, DIM);
    some_grads(g2, N, 16);
    float *dg = calloc(20000, sizeof(float)), *dp = calloc(20000, sizeof(float));
    ps_step_item items[1] = {{v, 0, 20000, dg, dp}};
    ps_table_item ti[2] = {PS_TABLE_ITEM_INIT, PS_TABLE_ITEM_INIT};
    ti[0].table = t1, ti[0].ids = ids, ti[0].n = N, ti[0].grads = g1, ti[0].rows = r1;
    ti[1].table = t2, ti[1].ids = ids, ti[1].n = N, ti[1].grads = g2, ti[1].rows = r2;
    bool both[2] = {false, false};
    for (int i = 0; i < N; i++)
        both[slots_row_owner(&cluster2, "count/t1", ids[i])] = true;
    assert_true(both[0] && both[1]);
    ps_server_stats a[2], b[2];
    for (int s = 0; s < 2; s++)
        assert_int_equal(ps_server_status(c, s, &a[s]), PS_OK);
    for (int k = 0; k < 10; k++)
        assert_int_equal(ps_step_ex(c, items, 1, ti, 2, PS_STEP_CLOCK), PS_OK);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(ps_server_status(c, s, &b[s]), PS_OK);
        fprintf(stderr, "ps %d: %llu requests for 10 steps of a split variable and 2 tables\n", s,
                (unsigned long long)(b[s].requests - a[s].requests - 1));
        /* 10 steps, plus the status request itself (counted when it arrives). */
        assert_int_equal(b[s].requests - a[s].requests, 10 + 1);
    }
    /* Each step applied the dense push on each shard and two table pushes on each server. */
    assert_int_equal(b[0].updates_applied - a[0].updates_applied + b[1].updates_applied -
                         a[1].updates_applied,
                     10 * (ps_var_num_shards(v) + 2 * 2));
    free(dg);
    free(dp);
    ps_table_free(t1);
    ps_table_free(t2);
    ps_client_close(c);
}

/* ---- raw Step requests with table items ---------------------------------------------------- */

typedef struct raw_titem {
    const char *name;
    const int64_t *ids;
    size_t n;
    uint32_t dim;
    const float *grads; /* NULL: no push */
    uint64_t seq;
    bool pull;
} raw_titem;

/* One Step request with one table item (FLOAT32 or BFLOAT16 segment, cut short by `short_by`
 * bytes); returns the status, the duplicate flag and the pulled rows (widened to float). */
static int raw_table_step(int port, uint64_t client, const raw_titem *it, int dtype,
                          size_t short_by, bool *duplicate, float *rows, char *msg, size_t cap)
{
    Psd__V1__StepTableItem ti = PSD__V1__STEP_TABLE_ITEM__INIT;
    ti.name = (char *)it->name;
    ti.n = it->n;
    ti.push = it->grads != NULL;
    ti.seq = it->seq;
    ti.pull = it->pull;
    Psd__V1__StepTableItem *tis[1] = {&ti};
    Psd__V1__StepRequest req = PSD__V1__STEP_REQUEST__INIT;
    req.n_table_items = 1;
    req.table_items = tis;
    uint8_t body[512];
    size_t blen = psd__v1__step_request__pack(&req, body);
    size_t esize = frame_dtype_size(dtype);
    size_t seglen = 8 * it->n + (it->grads ? esize * it->n * it->dim : 0);
    uint8_t *seg = calloc(seglen + 8, 1);
    memcpy(seg, it->ids, 8 * it->n);
    if (it->grads)
        frame_put_floats(seg + 8 * it->n, it->grads, it->n * it->dim, dtype);
    seglen -= short_by;
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__STEP;
    env.request_id = it->seq + 1;
    env.worker_id = -1;
    env.client_id = client;
    env.body.data = body;
    env.body.len = blen;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = (Psd__V1__DType)dtype;
    t.count = seglen / esize;
    env.tensor = &t;
    frame f;
    nng_msg *m;
    int st = test_raw_call(port, &env, seg, seglen, &f, &m);
    free(seg);
    assert_true(st > -1000);
    snprintf(msg, cap, "%s", f.env->message);
    if (st == STATUS_OK) {
        Psd__V1__StepReply *r =
            psd__v1__step_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        assert_non_null(r);
        assert_int_equal(r->n_results, 0);
        assert_int_equal(r->n_table_results, 1);
        *duplicate = r->table_results[0]->duplicate;
        size_t want = it->pull ? it->n * it->dim : 0;
        assert_int_equal(f.segment_len, want * esize);
        if (want)
            frame_get_floats(rows, f.segment, want, dtype);
        psd__v1__step_reply__free_unpacked(r, NULL);
    } else {
        fprintf(stderr, "raw step: %s: %s\n", status_name(st), msg);
    }
    frame_fini(&f);
    nng_msg_free(m);
    return st;
}

/* An id of `table` owned by server `server`, from `from` up. */
static int64_t id_on(const char *table, uint32_t server, int64_t from)
{
    while (slots_row_owner(&cluster2, table, from) != server)
        from++;
    return from;
}

static void test_step_table_resent_applied_once(void **state)
{
    (void)state;
    ps_client *c = worker(NULL, NULL, NULL);
    ps_table *t = make_table(c, "once/emb", DIM);
    assert_non_null(t);
    int64_t ids[2];
    ids[0] = id_on("once/emb", 1, 10);
    ids[1] = ids[0];
    float g[2 * DIM] = {1, 1, 1, 1, 1, 1, 1, 1}, rows[2 * DIM];
    raw_titem it = {"once/emb", ids, 2, DIM, g, 5, true};
    bool dup = true;
    char msg[512];
    assert_int_equal(raw_table_step(tc.ports[1], 0x77, &it, PSD__V1__DTYPE__FLOAT32, 0, &dup, rows,
                                    msg, sizeof(msg)),
                     STATUS_OK);
    assert_false(dup);
    for (int k = 0; k < 2 * DIM; k++)
        assert_true(rows[k] == 1.0f - LR * 2.0f); /* duplicates summed */
    /* The same request again (a resend): dropped, the rows unchanged. */
    assert_int_equal(raw_table_step(tc.ports[1], 0x77, &it, PSD__V1__DTYPE__FLOAT32, 0, &dup, rows,
                                    msg, sizeof(msg)),
                     STATUS_OK);
    assert_true(dup);
    for (int k = 0; k < 2 * DIM; k++)
        assert_true(rows[k] == 0.0f);
    it.seq = 6;
    assert_int_equal(raw_table_step(tc.ports[1], 0x77, &it, PSD__V1__DTYPE__FLOAT32, 0, &dup, rows,
                                    msg, sizeof(msg)),
                     STATUS_OK);
    assert_false(dup);
    assert_true(rows[0] == -1.0f);
    ps_table_free(t);
    ps_client_close(c);
}

static void test_step_table_bad_input(void **state)
{
    (void)state;
    ps_client *c = worker(NULL, NULL, NULL);
    ps_table *t = make_table(c, "bad/emb", DIM);
    ps_var *v = test_make_var_bound(c, "bad/dense", 3, PS_STALENESS_ASYNC);
    assert_non_null(t);
    assert_non_null(v);
    int64_t own0 = id_on("bad/emb", 0, 1), own1 = id_on("bad/emb", 1, 1);
    int64_t ids[1] = {own1};
    float g[DIM] = {1, 2, 3, 4}, rows[DIM];
    bool dup;
    char msg[512];
    raw_titem it = {"bad/none", ids, 1, DIM, g, 3, true};
    assert_int_equal(raw_table_step(tc.ports[0], 5, &it, 1, 0, &dup, rows, msg, sizeof(msg)),
                     STATUS_NOT_FOUND);
    assert_non_null(strstr(msg, "bad/none"));
    it.name = "bad/dense";
    assert_int_equal(raw_table_step(tc.ports[0], 5, &it, 1, 0, &dup, rows, msg, sizeof(msg)),
                     STATUS_NOT_FOUND);
    assert_non_null(strstr(msg, "dense variable"));
    it.name = "bad/emb";
    assert_int_equal(raw_table_step(tc.ports[0], 5, &it, 1, 0, &dup, rows, msg, sizeof(msg)),
                     STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "belongs on ps 1"));
    assert_int_equal(raw_table_step(tc.ports[1], 5, &it, 1, 4, &dup, rows, msg, sizeof(msg)),
                     STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "segment"));
    it.grads = NULL;
    it.pull = false;
    assert_int_equal(raw_table_step(tc.ports[1], 5, &it, 1, 0, &dup, rows, msg, sizeof(msg)),
                     STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "neither pushes nor pulls"));
    float nan_g[DIM] = {1, NAN, 3, 4};
    it.grads = nan_g;
    it.pull = true;
    assert_int_equal(raw_table_step(tc.ports[1], 5, &it, 1, 0, &dup, rows, msg, sizeof(msg)),
                     STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "not finite"));
    assert_non_null(strstr(msg, "nothing applied"));
    /* A dense push in the same step is not applied either: found before anything. */
    {
        Psd__V1__StepItem di = PSD__V1__STEP_ITEM__INIT;
        di.name = "bad/dense";
        di.offset = 0;
        di.count = 3;
        di.push = true;
        di.seq = 40;
        Psd__V1__StepItem *dis[1] = {&di};
        Psd__V1__StepTableItem ti2 = PSD__V1__STEP_TABLE_ITEM__INIT;
        ti2.name = "bad/emb";
        ti2.n = 1;
        ti2.push = true;
        ti2.seq = 41;
        Psd__V1__StepTableItem *tis[1] = {&ti2};
        Psd__V1__StepRequest req = PSD__V1__STEP_REQUEST__INIT;
        req.n_items = 1;
        req.items = dis;
        req.n_table_items = 1;
        req.table_items = tis;
        uint8_t body[256];
        envelope env = PSD__V1__ENVELOPE__INIT;
        env.method = PSD__V1__METHOD__STEP;
        env.request_id = 77;
        env.worker_id = -1;
        env.client_id = 5;
        env.body.data = body;
        env.body.len = psd__v1__step_request__pack(&req, body);
        uint32_t owner = slots_name_owner(&cluster2, "bad/dense");
        struct {
            float dense[3];
            int64_t id;
            float g[DIM];
        } __attribute__((packed)) sg = {{1, 1, 1}, id_on("bad/emb", owner, 1), {1, NAN, 1, 1}};
        Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
        tm.dtype = PSD__V1__DTYPE__FLOAT32;
        tm.count = sizeof(sg) / 4;
        env.tensor = &tm;
        frame f;
        nng_msg *m;
        int st = test_raw_call(tc.ports[owner], &env, &sg, sizeof(sg), &f, &m);
        assert_true(st > -1000);
        fprintf(stderr, "ps %u: %s: %s\n", owner, status_name(st), f.env->message);
        assert_int_equal(st, STATUS_INVALID_ARGUMENT);
        assert_non_null(strstr(f.env->message, "not finite: nothing applied"));
        frame_fini(&f);
        nng_msg_free(m);
        float dv[3];
        assert_int_equal(ps_pull(c, v, dv), PS_OK);
        for (int k = 0; k < 3; k++)
            assert_true(dv[k] == 0.0f);
    }
    /* Nothing was applied by any of them: the row is still the initializer's. */
    float now[DIM];
    assert_int_equal(ps_table_pull(t, ids, 1, now), PS_OK);
    for (int k = 0; k < DIM; k++)
        assert_true(now[k] == 1.0f);
    /* The C API's own checks. */
    ps_table_item ti = PS_TABLE_ITEM_INIT;
    ti.table = t;
    ti.ids = &own0;
    ti.n = 1;
    assert_int_equal(ps_step_ex(c, NULL, 0, &ti, 1, 0), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "neither grads nor rows"));
    ti.rows = rows;
    ti.struct_size = 8;
    assert_int_equal(ps_step_ex(c, NULL, 0, &ti, 1, 0), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "struct_size"));
    ti.struct_size = sizeof(ti);
    ti.ids = NULL;
    assert_int_equal(ps_step_ex(c, NULL, 0, &ti, 1, 0), PS_INVALID_ARGUMENT);
    ti.ids = &own0;
    assert_int_equal(ps_step_ex(c, NULL, 0, &ti, 1, 0), PS_OK);
    ps_table_free(t);
    ps_client_close(c);
}

/* ---- bfloat16 on the wire -------------------------------------------------------------- */

static ps_client *plain_client(const char *wire)
{
    char tf[1400];
    test_cluster_tf_config(&tc, NULL, 0, tf, sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    assert_int_equal(ps_config_set(cfg, "tf-config", tf), PS_OK);
    assert_int_equal(ps_config_set(cfg, "wire-dtype", wire), PS_OK);
    assert_int_equal(ps_client_open(&c, cfg), PS_OK);
    ps_config_destroy(cfg);
    return c;
}

static float bf16(float x)
{
    uint8_t b[2];
    float y;
    frame_put_floats(b, &x, 1, PSD__V1__DTYPE__BFLOAT16);
    frame_get_floats(&y, b, 1, PSD__V1__DTYPE__BFLOAT16);
    return y;
}

/* What the servers hold after one SGD push of g (rounded to bfloat16 when `round`) from 1.0,
 * duplicates summed in order as the server does. */
static void sgd_rows(const int64_t *ids, size_t n, const float *g, uint32_t dim, bool round,
                     float *want)
{
    for (size_t i = 0; i < n; i++)
        for (uint32_t k = 0; k < dim; k++) {
            float sum = 0;
            bool first = true;
            for (size_t j = 0; j < n; j++) {
                if (ids[j] != ids[i])
                    continue;
                float x = round ? bf16(g[j * dim + k]) : g[j * dim + k];
                sum = first ? x : sum + x;
                first = false;
            }
            volatile float step = LR * sum;
            want[i * dim + k] = 1.0f - step;
        }
}

/* TablePull, TablePush and table items in Step with wire-dtype bfloat16: the rows the servers
 * hold are exactly float32 SGD on the bfloat16-rounded gradients, the rows pulled are those
 * rounded to bfloat16, and both are within bfloat16 rounding of the float32 wire's rows. */
static void test_bf16_wire(void **state)
{
    (void)state;
    ps_client *c32 = plain_client("float32"), *c16 = plain_client("bfloat16");
    ps_client *w16 = worker(NULL, NULL, "bfloat16");
    ps_table *a = make_table(c32, "bf/a", DIM), *b = make_table(c16, "bf/b", DIM);
    ps_table *b32 = NULL, *s16 = make_table(w16, "bf/s", DIM), *s32 = NULL;
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(s16);
    assert_int_equal(ps_table_lookup(c32, "bf/b", &b32), PS_OK);
    assert_int_equal(ps_table_lookup(c32, "bf/s", &s32), PS_OK);
    enum { N = 50 };
    int64_t ids[N];
    float g[N * DIM], ra[N * DIM], rb[N * DIM], rb_held[N * DIM], want[N * DIM];
    some_ids(ids, N, 77);
    for (size_t i = 0; i < N * DIM; i++)
        g[i] = 0.1f * (float)(i % 13 + 1) + 0.0137f * (float)(i % 5); /* not bfloat16 values */
    assert_int_equal(ps_table_push(a, ids, N, g), PS_OK);
    assert_int_equal(ps_table_push(b, ids, N, g), PS_OK);
    assert_int_equal(ps_table_pull(a, ids, N, ra), PS_OK);
    assert_int_equal(ps_table_pull(b, ids, N, rb), PS_OK);
    assert_int_equal(ps_table_pull(b32, ids, N, rb_held), PS_OK);
    sgd_rows(ids, N, g, DIM, false, want);
    assert_memory_equal(ra, want, sizeof(ra)); /* float32: exact */
    sgd_rows(ids, N, g, DIM, true, want);
    assert_memory_equal(rb_held, want, sizeof(rb_held)); /* applied in float32 */
    double worst = 0;
    for (size_t i = 0; i < N * DIM; i++) {
        assert_true(rb[i] == bf16(rb_held[i])); /* sent back rounded */
        /* Each gradient within 2^-9 relative, the row within 2^-9 of its value. */
        double bound = fabs(ra[i]) / 256.0 + LR * 2 * fabs(g[i]) * 3 / 256.0 + 1e-6;
        double d = fabs((double)rb[i] - (double)ra[i]);
        worst = d > worst ? d : worst;
        assert_true(d <= bound);
    }
    fprintf(stderr, "bfloat16 wire: largest |row - float32 wire's row| = %g\n", worst);
    /* A step's table item on a bfloat16 wire: the same rounding both ways. */
    float rs[N * DIM];
    ps_table_item ti = PS_TABLE_ITEM_INIT;
    ti.table = s16, ti.ids = ids, ti.n = N, ti.grads = g, ti.rows = rs;
    assert_int_equal(ps_step_ex(w16, NULL, 0, &ti, 1, PS_STEP_CLOCK), PS_OK);
    assert_int_equal(ps_table_pull(s32, ids, N, rb_held), PS_OK);
    assert_memory_equal(rb_held, want, sizeof(rb_held));
    for (size_t i = 0; i < N * DIM; i++)
        assert_true(rs[i] == bf16(want[i]));
    ps_table_free(a);
    ps_table_free(b);
    ps_table_free(b32);
    ps_table_free(s16);
    ps_table_free(s32);
    ps_client_close(c32);
    ps_client_close(c16);
    ps_client_close(w16);
}

/* ---- staleness bounds ------------------------------------------------------------------- */

static int start_workers2(void **state)
{
    (void)state;
    return test_cluster_start_workers(&tc, server_bin, 2, 2, NULL);
}

static int start_bsp_default(void **state)
{
    (void)state;
    static const char *const flags[] = {"--default-staleness", "0", NULL};
    return test_cluster_start(&tc, server_bin, 2, flags);
}

static ps_table *make_table_bound(ps_client *c, const char *name, int staleness)
{
    ps_table_spec s;
    ps_table_spec_init(&s, name, DIM, PS_OPT_SGD);
    s.staleness = staleness;
    ps_table *t = NULL;
    int rc = ps_table_create(c, &s, &t);
    if (rc != PS_OK)
        fprintf(stderr, "create table %s (staleness %d): %s\n", name, staleness, ps_last_error());
    return t;
}

/* The servers' default-staleness 0 makes a table BSP too; its name must leave room for its
 * aggregate's; bounds out of range are refused. */
static void test_table_bsp_create(void **state)
{
    (void)state;
    ps_client *c = plain_client("float32");
    char longname[260];
    memset(longname, 'x', 253);
    longname[253] = '\0';
    assert_null(make_table_bound(c, longname, PS_STALENESS_DEFAULT));
    assert_non_null(strstr(ps_last_error(), "at most 251 characters"));
    assert_null(make_table_bound(c, "bsp/huge", 2000000));
    ps_table *a = make_table_bound(c, "bsp/default", PS_STALENESS_DEFAULT);
    assert_non_null(a);
    ps_table_info info = {.struct_size = sizeof(info)};
    assert_int_equal(ps_table_info_get(c, "bsp/default", &info), PS_OK);
    assert_int_equal(info.staleness, 0);
    ps_table_free(a);
    ps_client_close(c);
}

/* BSP rows: a worker's push is not applied until every live worker has clocked past it; then
 * the rows get one update per clock, the mean of the workers' gradients (per row, over the
 * pushes that touched it), so an Adagrad row equals one push of that mean, not two pushes. */
static void test_table_bsp_one_update_per_clock(void **state)
{
    (void)state;
    const char *const s[] = {"deadline-ms", "20000", NULL};
    ps_client *w0 = test_cluster_open_worker(&tc, 0, s), *w1 = test_cluster_open_worker(&tc, 1, s);
    ps_client *plain = plain_client("float32");
    ps_table_spec sp;
    ps_table_spec_init(&sp, "bsp/emb", DIM, PS_OPT_ADAGRAD);
    sp.learning_rate = 0.5;
    sp.initializer = PS_INIT_CONSTANT;
    sp.init_a = 1.0;
    sp.staleness = PS_STALENESS_BSP;
    ps_table *t0, *t1, *tp, *ref;
    assert_int_equal(ps_table_create(w0, &sp, &t0), PS_OK);
    assert_int_equal(ps_table_lookup(w1, "bsp/emb", &t1), PS_OK);
    assert_int_equal(ps_table_lookup(plain, "bsp/emb", &tp), PS_OK);
    sp.name = "bsp/ref";
    sp.staleness = PS_STALENESS_ASYNC;
    assert_int_equal(ps_table_create(plain, &sp, &ref), PS_OK);
    /* Worker 0 pushes ids 0..7, worker 1 ids 4..11 (4..7 by both; 5 twice by worker 1). */
    enum { N = 8 };
    int64_t ids0[N], ids1[N + 1];
    float g0[N * DIM], g1[(N + 1) * DIM];
    for (int i = 0; i < N; i++) {
        ids0[i] = 1000 + i;
        ids1[i] = 1004 + i;
    }
    ids1[N] = 1005;
    for (int i = 0; i < N * DIM; i++)
        g0[i] = 0.25f + (float)(i % 5) * 0.125f;
    for (int i = 0; i < (N + 1) * DIM; i++)
        g1[i] = -0.5f + (float)(i % 3) * 0.375f;
    float r0[N * DIM], r1[(N + 1) * DIM];
    ps_table_item a = PS_TABLE_ITEM_INIT, b = PS_TABLE_ITEM_INIT;
    a.table = t0, a.ids = ids0, a.n = N, a.grads = g0, a.rows = r0;
    b.table = t1, b.ids = ids1, b.n = N + 1, b.grads = g1, b.rows = r1;
    ps_op *op0;
    assert_int_equal(ps_step_ex_async(w0, NULL, 0, &a, 1, PS_STEP_CLOCK, NULL, NULL, &op0), PS_OK);
    struct timespec ts = {0, 300 * 1000000};
    nanosleep(&ts, NULL);
    assert_false(ps_op_done(op0)); /* its pull waits for worker 1 */
    /* Worker 0's push is acknowledged but not applied: the rows are still the initial ones. */
    float now[N * DIM];
    assert_int_equal(ps_table_pull(tp, ids0, N, now), PS_OK);
    for (int i = 0; i < N * DIM; i++)
        assert_true(now[i] == 1.0f);
    assert_int_equal(ps_step_ex(w1, NULL, 0, &b, 1, PS_STEP_CLOCK), PS_OK);
    assert_int_equal(ps_op_wait(op0), PS_OK);
    ps_op_destroy(op0);
    /* The reference: one push of the mean gradient of each row. */
    int64_t all[12];
    float mean[12 * DIM];
    for (int i = 0; i < 12; i++) {
        all[i] = 1000 + i;
        for (int k = 0; k < DIM; k++) {
            float sum = 0;
            int pushes = 0;
            bool by0 = false, by1 = false;
            for (int j = 0; j < N; j++)
                if (ids0[j] == all[i]) {
                    sum = by0 ? sum + g0[j * DIM + k] : sum + g0[j * DIM + k];
                    by0 = true;
                }
            float s1 = 0;
            for (int j = 0; j < N + 1; j++)
                if (ids1[j] == all[i]) {
                    s1 = by1 ? s1 + g1[j * DIM + k] : g1[j * DIM + k];
                    by1 = true;
                }
            pushes = by0 + by1;
            float total = by0 && by1 ? sum + s1 : (by0 ? sum : s1);
            mean[i * DIM + k] = pushes > 1 ? total * (1.0f / (float)pushes) : total;
        }
    }
    assert_int_equal(ps_table_push(ref, all, 12, mean), PS_OK);
    float want[12 * DIM], got[12 * DIM];
    assert_int_equal(ps_table_pull(ref, all, 12, want), PS_OK);
    assert_int_equal(ps_table_pull(tp, all, 12, got), PS_OK);
    assert_memory_equal(got, want, sizeof(want));
    /* What each worker's step pulled: the rows after the clock's one update. */
    for (int i = 0; i < N; i++)
        assert_memory_equal(r0 + i * DIM, want + (ids0[i] - 1000) * DIM, DIM * sizeof(float));
    for (int i = 0; i < N + 1; i++)
        assert_memory_equal(r1 + i * DIM, want + (ids1[i] - 1000) * DIM, DIM * sizeof(float));
    /* The aggregate is no table of its own in listings. */
    char **names;
    size_t n;
    assert_int_equal(ps_table_list(plain, &names, &n), PS_OK);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "bsp/emb");
    assert_string_equal(names[1], "bsp/ref");
    ps_names_free(names, n);
    ps_table *agg;
    assert_int_equal(ps_table_lookup(plain, "bsp/emb#bsp", &agg), PS_NOT_FOUND);
    ps_table_free(t0);
    ps_table_free(t1);
    ps_table_free(tp);
    ps_table_free(ref);
    ps_client_close(w0);
    ps_client_close(w1);
    ps_client_close(plain);
}

/* A table with staleness 1: worker 0 at clock 2 waits to pull (TablePull and a Step's table
 * item) until worker 1 reaches clock 1; a pull of an asynchronous table and a non-worker's
 * pull never wait; a wait past the deadline names the worker it waited for. */
static void test_table_ssp_bound(void **state)
{
    (void)state;
    const char *const s0[] = {"deadline-ms", "20000", NULL};
    const char *const s1[] = {"deadline-ms", "20000", NULL};
    ps_client *w0 = test_cluster_open_worker(&tc, 0, s0),
              *w1 = test_cluster_open_worker(&tc, 1, s1);
    ps_client *plain = plain_client("float32");
    ps_table *t = make_table_bound(w0, "ssp/emb", 1), *fast = make_table_bound(w0, "ssp/a", -1);
    assert_non_null(t);
    assert_non_null(fast);
    int64_t ids[8];
    float rows[8 * DIM], g[8 * DIM];
    some_ids(ids, 8, 3);
    some_grads(g, 8, DIM);
    assert_int_equal(ps_clock(w0, NULL), PS_OK);
    assert_int_equal(ps_clock(w0, NULL), PS_OK); /* worker 0 at 2, worker 1 at 0 */
    ps_op *op;
    assert_int_equal(ps_table_pull_async(t, ids, 8, rows, NULL, NULL, &op), PS_OK);
    ps_table_item ti = PS_TABLE_ITEM_INIT;
    ti.table = t, ti.ids = ids, ti.n = 8, ti.grads = g, ti.rows = rows;
    float rows2[8 * DIM];
    ps_table_item ti2 = ti;
    ti2.rows = rows2;
    ps_op *sop;
    assert_int_equal(ps_step_ex_async(w0, NULL, 0, &ti2, 1, 0, NULL, NULL, &sop), PS_OK);
    /* The asynchronous table and a client that is no worker read at once. */
    assert_int_equal(ps_table_pull(fast, ids, 8, rows2), PS_OK);
    ps_table *tp;
    assert_int_equal(ps_table_lookup(plain, "ssp/emb", &tp), PS_OK);
    assert_int_equal(ps_table_pull(tp, ids, 8, rows2), PS_OK);
    struct timespec ts = {0, 400 * 1000000};
    nanosleep(&ts, NULL);
    assert_false(ps_op_done(op));
    assert_false(ps_op_done(sop));
    assert_int_equal(ps_clock(w1, NULL), PS_OK); /* worker 1 at 1 = 2 - 1: both may read */
    assert_int_equal(ps_op_wait(op), PS_OK);
    assert_int_equal(ps_op_wait(sop), PS_OK);
    ps_op_destroy(op);
    ps_op_destroy(sop);
    /* The step's push was applied before its pull read the rows. */
    float after[8 * DIM];
    assert_int_equal(ps_table_pull(tp, ids, 8, after), PS_OK);
    assert_memory_equal(rows2, after, sizeof(after));
    /* A wait that outlasts its deadline names the worker it waits for. */
    assert_int_equal(ps_clock(w0, NULL), PS_OK); /* worker 0 at 3: needs 2 */
    ps_client_close(w0);
    const char *const s0b[] = {"deadline-ms", "700", NULL};
    w0 = test_cluster_open_worker(&tc, 0, s0b);
    ps_table *t0;
    assert_int_equal(ps_table_lookup(w0, "ssp/emb", &t0), PS_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ps_clock(w0, NULL), PS_OK);
    int rc = ps_table_pull(t0, ids, 8, rows);
    fprintf(stderr, "pull past the deadline: %s: %s\n", ps_strerror(rc), ps_last_error());
    assert_int_equal(rc, PS_DEADLINE_EXCEEDED);
    assert_non_null(strstr(ps_last_error(), "worker 1"));
    ps_table_free(t0);
    ps_table_free(t);
    ps_table_free(tp);
    ps_table_free(fast);
    ps_client_close(w0);
    ps_client_close(w1);
    ps_client_close(plain);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_step_tables_exact, start, stop),
        cmocka_unit_test_setup_teardown(test_step_tables_chunked, start, stop),
        cmocka_unit_test_setup_teardown(test_step_tables_one_request_per_server, start, stop),
        cmocka_unit_test_setup_teardown(test_step_table_resent_applied_once, start, stop),
        cmocka_unit_test_setup_teardown(test_step_table_bad_input, start, stop),
        cmocka_unit_test_setup_teardown(test_bf16_wire, start, stop),
        cmocka_unit_test_setup_teardown(test_table_bsp_create, start_bsp_default, stop),
        cmocka_unit_test_setup_teardown(test_table_bsp_one_update_per_clock, start_workers2, stop),
        cmocka_unit_test_setup_teardown(test_table_ssp_bound, start_workers2, stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
