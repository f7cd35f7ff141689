/* Integration: sparse tables over the wire with 2 real ps-server processes. Exact rows after
 * known SGD pushes (duplicate and negative ids, lists chunked under max-message-bytes), rows
 * made on first touch equal to the initializer's, a resent push applied once, and each bad
 * input answered with its error while the servers keep serving. */
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
#include <time.h>

#include "cluster_proc.h"
#include "frame.h"
#include "initializer.h"
#include "placement.h"
#include "slots.h"
#include "ps_proc.h"
#include "psclient.h"
#include "table_index.h"

/* The placement of the two servers these tests start. */
static const slot_map cluster2 = {.nslots = SLOTS_DEFAULT, .nservers = 2, .owner = NULL};

#define DIM 4
#define LR 0.5f

static const char *server_bin;
static test_cluster tc;
static ps_client *client; /* max-message-bytes 64 KiB: requests of 2,560 ids at most */
static ps_table *sgd;     /* "t/sgd": dim 4, SGD lr 0.5, rows start at 1.0 */
static const char *const server_flags[] = {"--max-message-bytes", "1M", NULL};

static ps_client *open_client(const char *max_message)
{
    ps_config *cfg;
    char tf[1200];
    test_cluster_tf_config(&tc, NULL, 0, tf, sizeof(tf));
    ps_config_create(&cfg);
    ps_config_set(cfg, "cluster", tf);
    if (max_message)
        ps_config_set(cfg, "max-message-bytes", max_message);
    ps_client *c = NULL;
    int rc = ps_client_open(&c, cfg);
    ps_config_destroy(cfg);
    return rc == PS_OK ? c : NULL;
}

static int setup(void **state)
{
    (void)state;
    if (test_cluster_start(&tc, server_bin, 2, server_flags) != 0)
        return -1;
    client = open_client("65536");
    if (client == NULL)
        return -1;
    ps_table_spec s;
    ps_table_spec_init(&s, "t/sgd", DIM, PS_OPT_SGD);
    s.learning_rate = LR;
    s.initializer = PS_INIT_CONSTANT;
    s.init_a = 1.0;
    return ps_table_create(client, &s, &sgd) == PS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    ps_table_free(sgd);
    ps_client_close(client);
    return test_cluster_stop(&tc);
}

/* A pull of one id through the C API works, on both servers. */
static void still_serving(void)
{
    int64_t ids[64];
    bool seen[2] = {false, false};
    size_t n = 0;
    for (int64_t id = 1000000; n < 64; id++) {
        ids[n++] = id;
        seen[slots_row_owner(&cluster2, "t/sgd", id)] = true;
    }
    assert_true(seen[0] && seen[1]);
    float rows[64 * DIM];
    assert_int_equal(ps_table_pull(sgd, ids, n, rows), PS_OK);
    for (size_t i = 0; i < n * DIM; i++)
        assert_true(rows[i] == 1.0f);
}

static void test_sgd_exact_rows(void **state)
{
    (void)state;
    /* Duplicates (5 three times), negative ids and the extremes; rows on both servers. */
    const int64_t ids[] = {5, -7, 5, INT64_MIN, -1, 5, INT64_MAX, 1099511627776LL};
    const size_t n = sizeof(ids) / sizeof(ids[0]);
    bool owners[2] = {false, false};
    for (size_t i = 0; i < n; i++)
        owners[slots_row_owner(&cluster2, "t/sgd", ids[i])] = true;
    assert_true(owners[0] && owners[1]);
    float g[sizeof(ids) / sizeof(ids[0]) * DIM];
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < DIM; j++)
            g[i * DIM + j] = 0.25f * (float)(i + 1) - 0.5f * (float)j;
    assert_int_equal(ps_table_push(sgd, ids, n, g), PS_OK);
    /* Pulled in another order, with duplicates and an id never pushed (the initializer's row,
     * 1.0). */
    const int64_t q[] = {-1, 5, 424242, 5, INT64_MIN, -7, INT64_MAX, 1099511627776LL};
    const size_t nq = sizeof(q) / sizeof(q[0]);
    float rows[sizeof(q) / sizeof(q[0]) * DIM];
    assert_int_equal(ps_table_pull(sgd, q, nq, rows), PS_OK);
    for (size_t k = 0; k < nq; k++)
        for (int j = 0; j < DIM; j++) {
            float sum = 0.0f;
            for (size_t i = 0; i < n; i++)
                if (ids[i] == q[k])
                    sum += g[i * DIM + j];
            float want = 1.0f - LR * sum;
            if (rows[k * DIM + j] != want)
                fail_msg("id %lld element %d: %g, want %g", (long long)q[k], j,
                         (double)rows[k * DIM + j], (double)want);
        }
}

/* 10,000 ids, each twice, over requests of at most 2,560 ids (max-message-bytes 64 KiB); the
 * client sends each id once, its gradients summed. */
static void test_chunked_lists(void **state)
{
    (void)state;
    ps_table_spec s;
    ps_table_spec_init(&s, "t/chunked", DIM, PS_OPT_SGD);
    s.learning_rate = LR;
    ps_table *t;
    assert_int_equal(ps_table_create(client, &s, &t), PS_OK);
    assert_int_equal(ps_table_max_ids(t), (65536 - 4096) / (8 + 4 * DIM));
    const size_t n = 10000, distinct = 5000;
    int64_t *ids = malloc(n * sizeof(*ids));
    float *g = malloc(n * DIM * sizeof(float));
    float *rows = malloc(n * DIM * sizeof(float));
    assert_non_null(ids);
    assert_non_null(g);
    assert_non_null(rows);
    for (size_t i = 0; i < n; i++) {
        ids[i] = (int64_t)(i % distinct) * 7919 - 20000000;
        for (int j = 0; j < DIM; j++)
            g[i * DIM + j] = (float)((i % distinct) % 16) * 0.125f + (float)j;
    }
    /* Only the distinct ids travel: the servers update and look up each once. */
    ps_table_info before = {.struct_size = sizeof(before)}, after = before;
    assert_int_equal(ps_table_info_get(client, "t/chunked", &before), PS_OK);
    assert_int_equal(ps_table_push(t, ids, n, g), PS_OK);
    assert_int_equal(ps_table_pull(t, ids, n, rows), PS_OK);
    assert_int_equal(ps_table_info_get(client, "t/chunked", &after), PS_OK);
    assert_int_equal(after.rows_updated - before.rows_updated, distinct);
    assert_int_equal(after.lookups - before.lookups, distinct);
    for (size_t i = 0; i < n; i++)
        for (int j = 0; j < DIM; j++) {
            float want = 0.0f - LR * (2.0f * g[i * DIM + j]);
            if (rows[i * DIM + j] != want)
                fail_msg("id %lld element %d: %g, want %g", (long long)ids[i], j,
                         (double)rows[i * DIM + j], (double)want);
        }
    free(ids);
    free(g);
    free(rows);
    ps_table_free(t);
}

/* Rows come from the initializer, a pure function of (seed, name, id): equal before and after
 * the first push made them (less the update), and the same through a lookup's handle. */
static void test_initializer_rows(void **state)
{
    (void)state;
    ps_table_spec s;
    ps_table_spec_init(&s, "t/uniform", 8, PS_OPT_SGD);
    s.learning_rate = LR;
    s.initializer = PS_INIT_UNIFORM;
    s.init_a = -1.0;
    s.init_b = 1.0;
    s.seed = 42;
    ps_table *t, *looked;
    assert_int_equal(ps_table_create(client, &s, &t), PS_OK);
    assert_int_equal(ps_table_create(client, &s, &looked), PS_OK); /* again: idempotent */
    ps_table_free(looked);
    assert_int_equal(ps_table_lookup(client, "t/uniform", &looked), PS_OK);
    assert_int_equal(ps_table_dim(looked), 8);
    initializer_params p = {.kind = INITIALIZER_UNIFORM, .a = -1.0, .b = 1.0, .seed = 42};
    const int64_t ids[] = {0, 17, -3, 99};
    float rows[4 * 8], want[8];
    assert_int_equal(ps_table_pull(looked, ids, 4, rows), PS_OK);
    for (int k = 0; k < 4; k++) {
        initializer_fill_row(&p, placement_hash("t/uniform"), ids[k], want, 8);
        assert_memory_equal(rows + k * 8, want, sizeof(want));
    }
    assert_true(memcmp(rows, rows + 8, 8 * sizeof(float)) != 0);
    float g[8];
    for (int j = 0; j < 8; j++)
        g[j] = 0.25f;
    assert_int_equal(ps_table_push(t, &ids[1], 1, g), PS_OK);
    assert_int_equal(ps_table_pull(t, ids, 4, rows), PS_OK);
    for (int k = 0; k < 4; k++) {
        initializer_fill_row(&p, placement_hash("t/uniform"), ids[k], want, 8);
        for (int j = 0; j < 8; j++)
            assert_true(rows[k * 8 + j] == (k == 1 ? want[j] - LR * 0.25f : want[j]));
    }
    ps_table_free(t);
    ps_table_free(looked);
}

/* A TablePush frame for `ids` on server `server` of table name (dim DIM, gradient value g). */
static int raw_table_push(nng_socket s, const char *name, const int64_t *ids, size_t n,
                          size_t seg_rows, uint64_t client_id, uint64_t seq, float g,
                          bool *duplicate, char *msg, size_t cap)
{
    Psd__V1__TablePushRequest req = PSD__V1__TABLE_PUSH_REQUEST__INIT;
    req.name = (char *)name;
    req.n = n;
    uint8_t body[512];
    size_t blen = psd__v1__table_push_request__pack(&req, body);
    size_t seglen = 8 * n + 4 * seg_rows * DIM;
    uint8_t *seg = malloc(seglen);
    assert_non_null(seg);
    memcpy(seg, ids, 8 * n);
    for (size_t i = 0; i < seg_rows * DIM; i++)
        memcpy(seg + 8 * n + 4 * i, &g, 4);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__TABLE_PUSH;
    env.request_id = seq;
    env.client_id = client_id;
    env.seq = seq;
    env.worker_id = -1;
    env.body.data = body;
    env.body.len = blen;
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    tm.dtype = PSD__V1__DTYPE__FLOAT32;
    tm.count = seglen / 4;
    env.tensor = &tm;
    frame f;
    nng_msg *m;
    int st = test_raw_request(s, &env, seg, seglen, &f, &m);
    free(seg);
    assert_true(st > -1000);
    snprintf(msg, cap, "%s", f.env->message);
    if (duplicate) {
        *duplicate = false;
        if (st == 0) {
            Psd__V1__TablePushReply *r =
                psd__v1__table_push_reply__unpack(NULL, f.env->body.len, f.env->body.data);
            assert_non_null(r);
            *duplicate = r->duplicate;
            psd__v1__table_push_reply__free_unpacked(r, NULL);
        }
    }
    frame_fini(&f);
    nng_msg_free(m);
    return st;
}

/* A TablePull frame with an ids segment of seg_bytes bytes claiming n ids. */
static int raw_table_pull(nng_socket s, const char *name, const int64_t *ids, uint64_t n,
                          size_t seg_bytes, char *msg, size_t cap)
{
    Psd__V1__TablePullRequest req = PSD__V1__TABLE_PULL_REQUEST__INIT;
    req.name = (char *)name;
    req.n = n;
    uint8_t body[512];
    size_t blen = psd__v1__table_pull_request__pack(&req, body);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__TABLE_PULL;
    env.request_id = 1;
    env.worker_id = -1;
    env.body.data = body;
    env.body.len = blen;
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    tm.dtype = PSD__V1__DTYPE__FLOAT32;
    tm.count = seg_bytes / 4;
    env.tensor = &tm;
    frame f;
    nng_msg *m;
    int st = test_raw_request(s, &env, ids, seg_bytes, &f, &m);
    assert_true(st > -1000);
    snprintf(msg, cap, "%s", f.env->message);
    frame_fini(&f);
    nng_msg_free(m);
    return st;
}

/* The first id at or above `from` that server `server` owns in table name. */
static int64_t id_on(const char *name, int server, int64_t from)
{
    while (slots_row_owner(&cluster2, name, from) != (uint32_t)server)
        from++;
    return from;
}

static void test_resent_push_applied_once(void **state)
{
    (void)state;
    int64_t id = id_on("t/sgd", 1, 777000);
    nng_socket s = test_raw_dial(tc.ports[1], 10000);
    char msg[512];
    bool dup;
    uint64_t cid = 0x5eed5eed5eed5eedull, seq = 1ull << 60;
    assert_int_equal(raw_table_push(s, "t/sgd", &id, 1, 1, cid, seq, 0.5f, &dup, msg, sizeof(msg)),
                     PS_OK);
    assert_false(dup);
    assert_int_equal(raw_table_push(s, "t/sgd", &id, 1, 1, cid, seq, 0.5f, &dup, msg, sizeof(msg)),
                     PS_OK);
    assert_true(dup);
    nng_close(s);
    float row[DIM];
    assert_int_equal(ps_table_pull(sgd, &id, 1, row), PS_OK);
    for (int j = 0; j < DIM; j++)
        assert_true(row[j] == 1.0f - LR * 0.5f);
}

static void test_bad_input(void **state)
{
    (void)state;
    char msg[512];
    int64_t mine = id_on("t/sgd", 0, 555000), theirs = id_on("t/sgd", 1, 555000);
    nng_socket s = test_raw_dial(tc.ports[0], 10000);
    int64_t ids[3] = {mine, mine, mine};

    assert_int_equal(raw_table_pull(s, "t/none", ids, 1, 8, msg, sizeof(msg)), PS_NOT_FOUND);
    assert_non_null(strstr(msg, "table \"t/none\" not found"));
    assert_int_equal(raw_table_pull(s, "t/sgd", ids, 3, 16, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "ids segment is 16 bytes"));
    assert_int_equal(raw_table_pull(s, "t/sgd", ids, (1ull << 22) + 1, 8, msg, sizeof(msg)),
                     PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "1..4194304"));
    assert_int_equal(raw_table_pull(s, "t/sgd", ids, 0, 8, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "n = 0 ids"));
    assert_int_equal(raw_table_pull(s, "t/sgd", &theirs, 1, 8, msg, sizeof(msg)),
                     PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "belongs on ps 1, not ps 0"));
    /* Rows not n x dim: 2 ids, 1 row. */
    assert_int_equal(
        raw_table_push(s, "t/sgd", ids, 2, 1, 9, 1ull << 61, 1.0f, NULL, msg, sizeof(msg)),
        PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "need 48"));
    /* A NaN gradient: the whole batch is refused, nothing applied. */
    float g[2 * DIM];
    int64_t two[2] = {mine, id_on("t/sgd", 0, mine + 1)};
    for (int i = 0; i < 2 * DIM; i++)
        g[i] = 1.0f;
    g[DIM + 2] = NAN;
    assert_int_equal(ps_table_push(sgd, two, 2, g), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "nothing applied"));
    g[DIM + 2] = INFINITY;
    assert_int_equal(ps_table_push(sgd, two, 2, g), PS_INVALID_ARGUMENT);
    float rows[2 * DIM];
    assert_int_equal(ps_table_pull(sgd, two, 2, rows), PS_OK);
    for (int i = 0; i < 2 * DIM; i++)
        assert_true(rows[i] == 1.0f);
    /* dim 0 and huge; another spec under an existing name. */
    ps_table_spec sp;
    ps_table *t = NULL;
    ps_table_spec_init(&sp, "t/dim0", 0, PS_OPT_SGD);
    assert_int_equal(ps_table_create(client, &sp, &t), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "dim"));
    ps_table_spec_init(&sp, "t/huge", 1u << 20, PS_OPT_SGD);
    assert_int_equal(ps_table_create(client, &sp, &t), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "dim"));
    ps_table_spec_init(&sp, "t/sgd", 8, PS_OPT_SGD);
    assert_int_equal(ps_table_create(client, &sp, &t), PS_ALREADY_EXISTS);
    assert_non_null(strstr(ps_last_error(), "another spec"));
    assert_int_equal(ps_table_lookup(client, "t/none", &t), PS_NOT_FOUND);
    /* A dense call on a table and the reverse. */
    ps_var_spec vs;
    ps_var_spec_init(&vs, "t/sgd");
    vs.ndims = 1;
    vs.dims[0] = 4;
    ps_var *v;
    assert_int_equal(ps_var_create(client, &vs, &v), PS_ALREADY_EXISTS);
    assert_non_null(strstr(ps_last_error(), "sparse table"));
    Psd__V1__PullRequest pr = PSD__V1__PULL_REQUEST__INIT;
    pr.name = "t/sgd";
    uint8_t body[64];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__PULL;
    env.request_id = 2;
    env.body.data = body;
    env.body.len = psd__v1__pull_request__pack(&pr, body);
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    tm.dtype = PSD__V1__DTYPE__FLOAT32;
    tm.count = 4;
    env.tensor = &tm;
    frame f;
    nng_msg *m;
    assert_int_equal(test_raw_request(s, &env, NULL, 0, &f, &m), PS_NOT_FOUND);
    assert_non_null(strstr(f.env->message, "is a sparse table"));
    frame_fini(&f);
    nng_msg_free(m);
    ps_var_spec_init(&vs, "dense/v");
    assert_int_equal(ps_var_create(client, &vs, &v), PS_OK);
    uint32_t owner = slots_name_owner(&cluster2, "dense/v");
    nng_socket so = test_raw_dial(tc.ports[owner], 10000);
    int64_t did = 3;
    assert_int_equal(raw_table_pull(so, "dense/v", &did, 1, 8, msg, sizeof(msg)), PS_NOT_FOUND);
    assert_non_null(strstr(msg, "dense variable, not a table"));
    nng_close(so);
    ps_table_spec_init(&sp, "dense/v", 4, PS_OPT_SGD);
    assert_int_equal(ps_table_create(client, &sp, &t), PS_ALREADY_EXISTS);
    assert_non_null(strstr(ps_last_error(), "dense variable"));
    /* A pull whose reply would pass max-message-bytes (1 MiB): 100,000 ids of dim 4 are an
     * 800 KB request and a 1.6 MB reply. */
    enum { BIG = 100000 };
    int64_t *big = malloc(BIG * sizeof(*big));
    assert_non_null(big);
    big[0] = id_on("t/sgd", 0, 0);
    for (int i = 1; i < BIG; i++)
        big[i] = id_on("t/sgd", 0, big[i - 1] + 1);
    assert_int_equal(raw_table_pull(s, "t/sgd", big, BIG, BIG * 8, msg, sizeof(msg)),
                     PS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(msg, "max-message-bytes"));
    free(big);
    nng_close(s);
    still_serving();
}

/* The value of a series in a /metrics text (-1 when absent). */
static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1.0;
}

/* Admission (min_count) and max_rows over the wire, seen in /metrics: an id pushed once under
 * min_count 2 makes no row (counted only), its second push makes it; 300 distinct ids under
 * max_rows 100 leave at most 100 rows, the rest evicted. */
static void test_admission_eviction_metrics(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-tables-metrics");
    int hport = test_free_port();
    char haddr[64];
    snprintf(haddr, sizeof(haddr), "127.0.0.1:%d", hport);
    const char *const flags[] = {"--http-listen", haddr, NULL};
    test_ps_start(&p, flags);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "m/admit", DIM, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    sp.min_count = 2;
    ps_table *a, *cap;
    assert_int_equal(ps_table_create(c, &sp, &a), PS_OK);
    ps_table_spec_init(&sp, "m/cap", DIM, PS_OPT_SGD);
    sp.max_rows = 100;
    assert_int_equal(ps_table_create(c, &sp, &cap), PS_OK);
    int64_t id = 77;
    float g[DIM] = {1, 1, 1, 1}, row[DIM];
    assert_int_equal(ps_table_push(a, &id, 1, g), PS_OK);
    assert_int_equal(ps_table_pull(a, &id, 1, row), PS_OK);
    assert_true(row[0] == 0.0f); /* counted only: the gradient was dropped */
    char *body = NULL;
    assert_int_equal(test_http_get(hport, "/metrics", &body), 200);
    assert_true(sample(body, "psd_table_rows{table=\"m/admit\",tier=\"ram\"}") == 0.0);
    assert_true(sample(body, "psd_table_pushes_counted_total{table=\"m/admit\"}") == 1.0);
    assert_true(sample(body, "psd_table_lookup_misses_total{table=\"m/admit\"}") == 1.0);
    assert_true(sample(body, "psd_server_tables") == 2.0);
    free(body);
    assert_int_equal(ps_table_push(a, &id, 1, g), PS_OK);
    assert_int_equal(ps_table_pull(a, &id, 1, row), PS_OK);
    assert_true(row[0] == -1.0f); /* admitted by its second push, which applied */
    static int64_t ids[300];
    static float gs[300 * DIM];
    for (int i = 0; i < 300; i++)
        ids[i] = i * 31 - 4000;
    for (int i = 0; i < 300 * DIM; i++)
        gs[i] = 0.5f;
    assert_int_equal(ps_table_push(cap, ids, 300, gs), PS_OK);
    assert_int_equal(test_http_get(hport, "/metrics", &body), 200);
    assert_true(sample(body, "psd_table_rows{table=\"m/admit\",tier=\"ram\"}") == 1.0);
    double rows = sample(body, "psd_table_rows{table=\"m/cap\",tier=\"ram\"}");
    double made = sample(body, "psd_table_rows_created_total{table=\"m/cap\"}");
    double gone = sample(body, "psd_table_evictions_total{table=\"m/cap\",reason=\"max_rows\"}");
    if (!(rows > 0 && rows <= 100 && gone > 0 && made - gone == rows))
        fail_msg("m/cap: %g rows, %g made, %g evicted", rows, made, gone);
    free(body);
    /* ttl_ms 200: a row not updated for 1.2 s is swept by a later push (at most one sweep a
     * second); its pull is the initializer's row again. */
    ps_table *ttl;
    ps_table_spec_init(&sp, "m/ttl", DIM, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    sp.ttl_ms = 200;
    assert_int_equal(ps_table_create(c, &sp, &ttl), PS_OK);
    int64_t old_id = 5, new_id = 6;
    assert_int_equal(ps_table_push(ttl, &old_id, 1, g), PS_OK);
    assert_int_equal(ps_table_pull(ttl, &old_id, 1, row), PS_OK);
    assert_true(row[0] == -1.0f);
    struct timespec ts = {1, 200000000};
    nanosleep(&ts, NULL);
    assert_int_equal(ps_table_push(ttl, &new_id, 1, g), PS_OK);
    assert_int_equal(ps_table_pull(ttl, &old_id, 1, row), PS_OK);
    assert_true(row[0] == 0.0f);
    assert_int_equal(test_http_get(hport, "/metrics", &body), 200);
    assert_true(sample(body, "psd_table_evictions_total{table=\"m/ttl\",reason=\"ttl\"}") == 1.0);
    assert_true(sample(body, "psd_table_rows{table=\"m/ttl\",tier=\"ram\"}") == 1.0);
    free(body);
    ps_table_free(ttl);
    ps_table_free(a);
    ps_table_free(cap);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* A full max_rows table applies every push it acknowledges: a new id evicts its partition's
 * least recently updated row and gets its gradient, whichever partition it falls in, one id at
 * a time or many new ids in one batch; nothing is only counted (that is min_count's). */
static void test_max_rows_full_applies(void **state)
{
    (void)state;
    ps_table_spec sp;
    ps_table_spec_init(&sp, "t/full", DIM, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    sp.initializer = PS_INIT_CONSTANT;
    sp.init_a = 1.0;
    sp.max_rows = 100; /* per server */
    ps_table *t;
    assert_int_equal(ps_table_create(client, &sp, &t), PS_OK);
    enum { FILL = 2000, NEW = 50 };
    static int64_t ids[FILL];
    static float g[FILL * DIM];
    for (int i = 0; i < FILL; i++)
        ids[i] = (int64_t)i * 7 + 3;
    for (int i = 0; i < FILL * DIM; i++)
        g[i] = 0.5f;
    assert_int_equal(ps_table_push(t, ids, FILL, g), PS_OK);
    ps_table_info info = {.struct_size = sizeof(info)};
    assert_int_equal(ps_table_info_get(client, "t/full", &info), PS_OK);
    if (info.pushes_counted != 0 || info.rows != 200 || info.rows_created != FILL)
        fail_msg("after a batch of %d new ids: %llu rows, %llu made, %llu counted only", FILL,
                 (unsigned long long)info.rows, (unsigned long long)info.rows_created,
                 (unsigned long long)info.pushes_counted);
    int missed = 0;
    for (int k = 0; k < NEW; k++) {
        int64_t id = 1000000 + (int64_t)k * 13;
        float row[DIM];
        assert_int_equal(ps_table_push(t, &id, 1, g), PS_OK);
        assert_int_equal(ps_table_pull(t, &id, 1, row), PS_OK);
        if (row[0] != 0.5f) {
            fprintf(stderr, "id %lld acknowledged, row %g (1 is the initial value)\n",
                    (long long)id, (double)row[0]);
            missed++;
        }
    }
    assert_int_equal(ps_table_info_get(client, "t/full", &info), PS_OK);
    if (missed != 0 || info.pushes_counted != 0 || info.rows != 200)
        fail_msg("%d of %d new ids not applied; %llu rows, %llu counted only", missed, NEW,
                 (unsigned long long)info.rows, (unsigned long long)info.pushes_counted);
    assert_int_equal(info.rows_created - info.evicted_max_rows, info.rows);
    ps_table_free(t);
}

/* n ids from `from` up that fall in partition 0 of a table of the default 64 partitions. */
static int64_t partition0_ids(int64_t *out, size_t n, int64_t from)
{
    for (size_t k = 0; k < n; from++)
        if ((table_id_hash(from) >> 58) == 0)
            out[k++] = from;
    return from;
}

/* Polls until the rows of ids[0..n) (the first element of each) all equal want (at most 5 s). */
static bool rows_become(ps_table *t, const int64_t *ids, size_t n, float want)
{
    float *rows = malloc(n * DIM * sizeof(float));
    bool all = false;
    for (int tries = 0; tries < 100 && !all; tries++) {
        if (tries > 0)
            nanosleep(&(struct timespec){0, 50 * 1000000}, NULL);
        assert_int_equal(ps_table_pull(t, ids, n, rows), PS_OK);
        all = true;
        for (size_t i = 0; i < n; i++)
            all = all && rows[i * DIM] == want;
    }
    free(rows);
    return all;
}

/* A BSP table's aggregate under max-server-bytes: worker 0's acknowledged push waits in the
 * aggregate while worker 1 pushes batches of new ids into one aggregate partition until the
 * memory runs out. The aggregate refuses what does not fit (RESOURCE_EXHAUSTED) and never
 * evicts an acknowledged partial sum: once memory is back (another table deleted) and both
 * workers clocked, every acknowledged row has its update, once. */
static void test_bsp_aggregate_under_memory_limit(void **state)
{
    (void)state;
    test_cluster small;
    const char *const flags[] = {"--max-server-bytes", "1200000", NULL};
    assert_int_equal(test_cluster_start_workers(&small, server_bin, 1, 2, flags), 0);
    const char *const ws[] = {"deadline-ms", "20000", NULL};
    ps_client *w0 = test_cluster_open_worker(&small, 0, ws);
    ps_client *w1 = test_cluster_open_worker(&small, 1, ws);
    ps_config *cfg;
    char tf[1200];
    test_cluster_tf_config(&small, NULL, 0, tf, sizeof(tf));
    ps_config_create(&cfg);
    ps_config_set(cfg, "cluster", tf);
    ps_client *plain;
    assert_int_equal(ps_client_open(&plain, cfg), PS_OK);
    ps_config_destroy(cfg);
    assert_non_null(w0);
    assert_non_null(w1);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "b/emb", DIM, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    sp.staleness = PS_STALENESS_BSP;
    ps_table *t0, *t1, *tp, *filler;
    assert_int_equal(ps_table_create(plain, &sp, &tp), PS_OK);
    assert_int_equal(ps_table_lookup(w0, "b/emb", &t0), PS_OK);
    assert_int_equal(ps_table_lookup(w1, "b/emb", &t1), PS_OK);
    enum { NX = 8, BATCH = 1000, MAXB = 30, NFILL = 8000 };
    static int64_t fill[NFILL], x[NX], y[MAXB][BATCH];
    static float g[BATCH * DIM], zero[BATCH * DIM];
    for (int i = 0; i < BATCH * DIM; i++)
        g[i] = 1.0f;
    /* Memory to give back before the clock: a table of NFILL rows in one partition. */
    ps_table_spec_init(&sp, "b/filler", DIM, PS_OPT_SGD);
    assert_int_equal(ps_table_create(plain, &sp, &filler), PS_OK);
    int64_t next = partition0_ids(fill, NFILL, -100000000);
    for (int i = 0; i < NFILL; i += BATCH)
        assert_int_equal(ps_table_push(filler, fill + i, BATCH, zero), PS_OK);
    for (int i = 0; i < NX; i++)
        x[i] = 1 + i * 977;                               /* over several partitions */
    assert_int_equal(ps_table_push(t0, x, NX, g), PS_OK); /* into the aggregate */
    int full = -1;
    for (int b = 0; b < MAXB && full < 0; b++) {
        next = partition0_ids(y[b], BATCH, next);
        int rc = ps_table_push(t1, y[b], BATCH, g);
        if (rc == PS_RESOURCE_EXHAUSTED) {
            fprintf(stderr, "batch %d of worker 1: %s\n", b, ps_last_error());
            full = b;
        } else {
            assert_int_equal(rc, PS_OK);
        }
    }
    if (full < 1)
        fail_msg("the aggregate took %d batches of %d new ids under max-server-bytes",
                 full < 0 ? MAXB : full, BATCH);
    ps_table_free(filler);
    assert_int_equal(ps_table_delete(plain, "b/filler"), PS_OK);
    assert_int_equal(ps_clock(w0, NULL), PS_OK);
    assert_int_equal(ps_clock(w1, NULL), PS_OK);
    if (!rows_become(tp, x, NX, -1.0f))
        fail_msg("worker 0's acknowledged BSP push is not applied once");
    for (int b = 0; b < full; b++)
        if (!rows_become(tp, y[b], BATCH, -1.0f))
            fail_msg("worker 1's acknowledged batch %d is not applied once", b);
    /* Another clock applies nothing again. */
    assert_int_equal(ps_clock(w0, NULL), PS_OK);
    assert_int_equal(ps_clock(w1, NULL), PS_OK);
    assert_true(rows_become(tp, x, NX, -1.0f));
    assert_true(rows_become(tp, y[0], BATCH, -1.0f));
    ps_table_free(t0);
    ps_table_free(t1);
    ps_table_free(tp);
    ps_client_close(w0);
    ps_client_close(w1);
    ps_client_close(plain);
    assert_int_equal(test_cluster_stop(&small), 0);
}

/* A BSP sum that overflows float32 (two workers' finite gradients) holds no other row back:
 * at the clock the aggregate's other rows are applied, the overflowing row's table row stays
 * finite, and later clocks go on applying. */
static void test_bsp_sum_overflow_does_not_wedge(void **state)
{
    (void)state;
    test_cluster one;
    assert_int_equal(test_cluster_start_workers(&one, server_bin, 1, 2, NULL), 0);
    const char *const ws[] = {"deadline-ms", "20000", NULL};
    ps_client *w0 = test_cluster_open_worker(&one, 0, ws);
    ps_client *w1 = test_cluster_open_worker(&one, 1, ws);
    assert_non_null(w0);
    assert_non_null(w1);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "b/over", DIM, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    sp.staleness = PS_STALENESS_BSP;
    ps_table *t0, *t1;
    assert_int_equal(ps_table_create(w0, &sp, &t0), PS_OK);
    assert_int_equal(ps_table_lookup(w1, "b/over", &t1), PS_OK);
    int64_t a[2] = {7, 8}, b[2] = {7, 9};
    float big[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++)
        big[i] = i < DIM ? 3e38f : 1.0f;
    assert_int_equal(ps_table_push(t0, a, 2, big), PS_OK);
    int rc = ps_table_push(t1, b, 2, big); /* 7's sum overflows */
    if (rc != PS_OK)
        fprintf(stderr, "the overflowing push: %s\n", ps_last_error());
    assert_int_equal(ps_clock(w0, NULL), PS_OK);
    assert_int_equal(ps_clock(w1, NULL), PS_OK);
    int64_t others[2] = {8, 9};
    if (!rows_become(t0, others, 2, -1.0f))
        fail_msg("the rows summed with an overflowing one were not applied");
    float row[DIM];
    assert_int_equal(ps_table_pull(t0, &a[0], 1, row), PS_OK);
    for (int j = 0; j < DIM; j++)
        assert_true(isfinite(row[j]));
    float one_g[DIM] = {1, 1, 1, 1};
    assert_int_equal(ps_table_push(t0, &a[1], 1, one_g), PS_OK);
    assert_int_equal(ps_clock(w0, NULL), PS_OK);
    assert_int_equal(ps_clock(w1, NULL), PS_OK);
    if (!rows_become(t0, &a[1], 1, -2.0f))
        fail_msg("the BSP apply stopped after a sum overflowed");
    ps_table_free(t0);
    ps_table_free(t1);
    ps_client_close(w0);
    ps_client_close(w1);
    assert_int_equal(test_cluster_stop(&one), 0);
}

/* A finite gradient that would overflow a row is refused, FAILED_PRECONDITION naming the table
 * and the id: the row keeps its value, the push's other rows are applied, once. */
static void test_overflow_refused(void **state)
{
    (void)state;
    int64_t ids[2] = {31, 32};
    float g[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++)
        g[i] = i < DIM ? -3e38f : 1.0f;
    assert_int_equal(ps_table_push(sgd, ids, 2, g), PS_OK); /* 31: 1 + 0.5 * 3e38 */
    assert_int_equal(ps_table_push(sgd, ids, 2, g), PS_OK); /* 31: 3e38, finite still */
    float before[2 * DIM], after[2 * DIM];
    assert_int_equal(ps_table_pull(sgd, ids, 2, before), PS_OK);
    assert_int_equal(ps_table_push(sgd, ids, 2, g), PS_FAILED_PRECONDITION);
    const char *msg = ps_last_error();
    if (strstr(msg, "t/sgd") == NULL || strstr(msg, "id 31") == NULL ||
        strstr(msg, "non-finite") == NULL)
        fail_msg("message: %s", msg);
    assert_int_equal(ps_table_pull(sgd, ids, 2, after), PS_OK);
    for (int j = 0; j < DIM; j++) {
        assert_true(after[j] == before[j]);
        assert_true(after[DIM + j] == before[DIM + j] - LR);
    }
    still_serving();
}

static void count_done(ps_op *op, void *arg)
{
    (void)op;
    __atomic_add_fetch((int *)arg, 1, __ATOMIC_SEQ_CST);
}

/* The asynchronous forms: several calls in flight at once, each completing with its callback;
 * an empty call completes at once. */
static void test_async(void **state)
{
    (void)state;
    enum { K = 3, NI = 500 };
    static int64_t ids[K][NI];
    static float g[K][NI * DIM], rows[K][NI * DIM];
    ps_op *ops[K];
    int done = 0;
    for (int k = 0; k < K; k++) {
        for (int i = 0; i < NI; i++) {
            ids[k][i] = 900000000 + (int64_t)k * NI + i;
            for (int j = 0; j < DIM; j++)
                g[k][i * DIM + j] = 0.25f * (float)(k + 1);
        }
        assert_int_equal(ps_table_push_async(sgd, ids[k], NI, g[k], count_done, &done, &ops[k]),
                         PS_OK);
    }
    for (int k = 0; k < K; k++) {
        assert_int_equal(ps_op_wait(ops[k]), PS_OK);
        ps_op_destroy(ops[k]);
    }
    assert_int_equal(__atomic_load_n(&done, __ATOMIC_SEQ_CST), K);
    for (int k = 0; k < K; k++)
        assert_int_equal(ps_table_pull_async(sgd, ids[k], NI, rows[k], NULL, NULL, &ops[k]), PS_OK);
    for (int k = 0; k < K; k++) {
        assert_int_equal(ps_op_wait(ops[k]), PS_OK);
        ps_op_destroy(ops[k]);
        for (int i = 0; i < NI * DIM; i++)
            assert_true(rows[k][i] == 1.0f - LR * 0.25f * (float)(k + 1));
    }
    ps_op *op;
    assert_int_equal(ps_table_pull_async(sgd, NULL, 0, NULL, NULL, NULL, &op), PS_OK);
    assert_int_equal(ps_op_wait(op), PS_OK);
    ps_op_destroy(op);
}

/* max-server-bytes bounds the tables: with 40,000 bytes, the table is made but a row of dim
 * 4096 with Adam's slots (49,176 bytes) is refused (its partition has no row to evict), and
 * the server keeps serving. */
static void test_memory_limit(void **state)
{
    (void)state;
    test_cluster small;
    const char *const flags[] = {"--max-server-bytes", "40000", NULL};
    assert_int_equal(test_cluster_start(&small, server_bin, 1, flags), 0);
    ps_config *cfg;
    char tf[1200];
    test_cluster_tf_config(&small, NULL, 0, tf, sizeof(tf));
    ps_config_create(&cfg);
    ps_config_set(cfg, "cluster", tf);
    ps_client *c;
    assert_int_equal(ps_client_open(&c, cfg), PS_OK);
    ps_config_destroy(cfg);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "t/big", 4096, PS_OPT_ADAM);
    ps_table *t = NULL;
    assert_int_equal(ps_table_create(c, &sp, &t), PS_OK);
    int64_t id = -12;
    static float g[4096], row[4096];
    g[3] = 1.0f;
    assert_int_equal(ps_table_push(t, &id, 1, g), PS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(ps_last_error(), "max-server-bytes"));
    assert_non_null(strstr(ps_last_error(), "t/big"));
    assert_int_equal(ps_table_pull(t, &id, 1, row), PS_OK);
    for (int j = 0; j < 4096; j++)
        assert_true(row[j] == 0.0f);
    ps_table_free(t);
    ps_client_close(c);
    assert_int_equal(test_cluster_stop(&small), 0);
}

/* Tables are in checkpoints: rows, optimizer slots (Adagrad's accumulators) and update times
 * come back after a SIGKILL and restart; pushes after the checkpoint are lost, as for
 * variables; the restored table goes on exactly as one that never restarted. */
static void test_checkpoint_restore(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-tables-ckpt");
    const char *const flags[] = {"--checkpoint-dir", p.dir, NULL};
    test_ps_start(&p, flags);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "t/ada", DIM, PS_OPT_ADAGRAD);
    sp.learning_rate = 0.5;
    sp.initializer = PS_INIT_CONSTANT;
    sp.init_a = 0.25;
    ps_table *t;
    assert_int_equal(ps_table_create(c, &sp, &t), PS_OK);
    enum { NI = 300 };
    int64_t ids[NI];
    float g[NI * DIM], before[NI * DIM], after[NI * DIM], ref[NI * DIM];
    for (int i = 0; i < NI; i++) {
        ids[i] = (int64_t)i * 104729 - 15000000;
        for (int j = 0; j < DIM; j++)
            g[i * DIM + j] = 0.125f * (float)((i + j) % 7) - 0.375f;
    }
    assert_int_equal(ps_table_push(t, ids, NI, g), PS_OK);
    assert_int_equal(ps_table_pull(t, ids, NI, before), PS_OK);
    assert_int_equal(ps_checkpoint(c), PS_OK);
    assert_int_equal(ps_table_push(t, ids, NI, g), PS_OK); /* after it: lost */
    ps_table_free(t);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&p, flags);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    assert_int_equal(ps_table_lookup(c, "t/ada", &t), PS_OK);
    assert_int_equal(ps_table_pull(t, ids, NI, after), PS_OK);
    assert_memory_equal(after, before, sizeof(before));
    /* One more push equals two pushes into a table that never restarted (the accumulators
     * were restored). */
    assert_int_equal(ps_table_push(t, ids, NI, g), PS_OK);
    assert_int_equal(ps_table_pull(t, ids, NI, after), PS_OK);
    ps_table *r;
    sp.name = "t/ada-ref";
    assert_int_equal(ps_table_create(c, &sp, &r), PS_OK);
    assert_int_equal(ps_table_push(r, ids, NI, g), PS_OK);
    assert_int_equal(ps_table_push(r, ids, NI, g), PS_OK);
    assert_int_equal(ps_table_pull(r, ids, NI, ref), PS_OK);
    assert_memory_equal(after, ref, sizeof(ref));
    assert_true(memcmp(after, before, sizeof(before)) != 0);
    ps_table_free(t);
    ps_table_free(r);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd_exact_rows),
        cmocka_unit_test(test_chunked_lists),
        cmocka_unit_test(test_initializer_rows),
        cmocka_unit_test(test_resent_push_applied_once),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_memory_limit),
        cmocka_unit_test(test_checkpoint_restore),
        cmocka_unit_test(test_async),
        cmocka_unit_test(test_admission_eviction_metrics),
        cmocka_unit_test(test_max_rows_full_applies),
        cmocka_unit_test(test_bsp_aggregate_under_memory_limit),
        cmocka_unit_test(test_bsp_sum_overflow_does_not_wedge),
        cmocka_unit_test(test_overflow_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
