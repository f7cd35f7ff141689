/* Integration: the Step call (ps_step) against real ps-server processes on loopback: one
 * message per server carrying a step's pushes, clock and pulls, with the same exactly-once,
 * BSP and SSP semantics as separate calls; its bad input; and the bfloat16 wire. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "psclient.h"
#include "status.h"
#include "timeutil.h"

static const char *server_bin;
static const char *self_bin;
static test_cluster tc;

/* heartbeats every 100 ms, except for the client of the request-counting test (heartbeats are
 * requests too) */
static const char *heartbeat_ms = "100";
/* split-parts of the clients opened (the test of variables cut in parts sets it) */
static const char *split_parts = "false";

static ps_client *open_client(int worker, const char *chunk, const char *wire)
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
        ps_config_set(cfg, "heartbeat-ms", heartbeat_ms) != PS_OK ||
        (chunk && ps_config_set(cfg, "chunk-bytes", chunk) != PS_OK) ||
        (wire && ps_config_set(cfg, "wire-dtype", wire) != PS_OK) ||
        ps_config_set(cfg, "split-threshold-bytes", "16K") != PS_OK ||
        ps_config_set(cfg, "split-parts", split_parts) != PS_OK || ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "client: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

static int start2(void **state)
{
    (void)state;
    return test_cluster_start(&tc, server_bin, 2, NULL);
}

static int start2w(void **state)
{
    (void)state;
    return test_cluster_start_workers(&tc, server_bin, 2, 1, NULL);
}

static int stop(void **state)
{
    (void)state;
    return test_cluster_stop(&tc);
}

/* ---- equivalence with push + clock + pull, one message or several ------------------------- */

#define NV 4
static const uint64_t sizes[NV] = {3, 700, 9000, 20000}; /* the last two split over 2 ps */

static void run_equivalence(const char *chunk, const char *prefix)
{
    ps_client *c = open_client(0, chunk, NULL);
    assert_non_null(c);
    ps_var *v[NV];
    float *g[NV], *dst[NV], *check[NV];
    for (int i = 0; i < NV; i++) {
        char name[64];
        snprintf(name, sizeof(name), "%s/v%d", prefix, i);
        v[i] = test_make_var_bound(c, name, sizes[i], PS_STALENESS_ASYNC);
        assert_non_null(v[i]);
        g[i] = malloc(sizes[i] * sizeof(float));
        dst[i] = malloc(sizes[i] * sizeof(float));
        check[i] = malloc(sizes[i] * sizeof(float));
        for (uint64_t k = 0; k < sizes[i]; k++)
            g[i][k] = (float)((k % 7) + i); /* small integers: exact sums */
    }
    assert_int_equal(ps_var_num_shards(v[3]), 2);
    for (int step = 1; step <= 3; step++) {
        ps_step_item items[NV];
        for (int i = 0; i < NV; i++)
            items[i] = (ps_step_item){v[i], 0, sizes[i], g[i], dst[i]};
        int64_t before = ps_client_clock(c);
        assert_int_equal(ps_step(c, items, NV, PS_STEP_CLOCK), PS_OK);
        assert_int_equal(ps_client_clock(c), before + 1);
        for (int i = 0; i < NV; i++) {
            assert_int_equal(ps_pull(c, v[i], check[i]), PS_OK);
            for (uint64_t k = 0; k < sizes[i]; k++) {
                float want = -(float)step * g[i][k];
                if (dst[i][k] != want || check[i][k] != want) {
                    fprintf(stderr, "%s v%d[%llu] step %d: step gave %g, pull %g, want %g\n",
                            prefix, i, (unsigned long long)k, step, dst[i][k], check[i][k], want);
                    fail();
                }
            }
        }
    }
    /* A range, push only, and pull only, in one step. */
    float part[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, got[10];
    ps_step_item items[2] = {{v[3], 9995, 10, part, NULL}, {v[2], 100, 10, NULL, got}};
    assert_int_equal(ps_step(c, items, 2, 0), PS_OK);
    for (int k = 0; k < 10; k++)
        assert_true(got[k] == -3.0f * g[2][100 + k]);
    assert_int_equal(ps_pull_range(c, v[3], 9995, 10, got), PS_OK);
    for (int k = 0; k < 10; k++)
        assert_true(got[k] == -3.0f * g[3][9995 + k] - 1.0f);
    for (int i = 0; i < NV; i++) {
        free(g[i]);
        free(dst[i]);
        free(check[i]);
    }
    ps_client_close(c);
}

static void test_step_one_message_per_server(void **state)
{
    (void)state;
    /* 1 MiB chunks: each server's share fits in one message (one request per server). */
    run_equivalence(NULL, "one");
}

static void test_step_in_chunks(void **state)
{
    (void)state;
    /* 4 KiB chunks: pushes first in several messages, then the pulls with the clock. */
    run_equivalence("4K", "chunked");
}

/* The number of requests the servers counted went up by exactly one per server per step. */
static void test_step_is_one_request_per_server(void **state)
{
    (void)state;
    heartbeat_ms = "0";
    ps_client *c = open_client(0, NULL, NULL);
    heartbeat_ms = "100";
    assert_non_null(c);
    ps_var *v[NV];
    float *g[NV];
    for (int i = 0; i < NV; i++) {
        char name[64];
        snprintf(name, sizeof(name), "count/v%d", i);
        v[i] = test_make_var_bound(c, name, sizes[i], PS_STALENESS_ASYNC);
        assert_non_null(v[i]);
        g[i] = calloc(sizes[i], sizeof(float));
    }
    ps_step_item items[NV];
    for (int i = 0; i < NV; i++)
        items[i] = (ps_step_item){v[i], 0, sizes[i], g[i], g[i]};
    ps_server_stats a[2], b[2];
    for (int s = 0; s < 2; s++)
        assert_int_equal(ps_server_status(c, s, &a[s]), PS_OK);
    for (int k = 0; k < 10; k++)
        assert_int_equal(ps_step(c, items, NV, PS_STEP_CLOCK), PS_OK);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(ps_server_status(c, s, &b[s]), PS_OK);
        /* 10 steps, plus the status request itself (counted when it arrives). */
        fprintf(stderr, "ps %d: %llu requests for 10 steps of %d variables\n", s,
                (unsigned long long)(b[s].requests - a[s].requests - 1), NV);
        assert_int_equal(b[s].requests - a[s].requests, 10 + 1);
    }
    for (int i = 0; i < NV; i++)
        free(g[i]);
    ps_client_close(c);
}

/* ---- exactly once: the same Step request twice, raw ------------------------------------- */

static int raw_step(int port, uint64_t client, const char *name, uint64_t seq, float value,
                    bool advance, int worker, bool *duplicate, float *pulled)
{
    Psd__V1__StepItem it = PSD__V1__STEP_ITEM__INIT;
    it.name = (char *)name;
    it.offset = 0;
    it.count = 1;
    it.push = seq != 0;
    it.seq = seq;
    it.pull = true;
    Psd__V1__StepItem *items[1] = {&it};
    Psd__V1__StepRequest req = PSD__V1__STEP_REQUEST__INIT;
    req.n_items = 1;
    req.items = items;
    req.advance_clock = advance;
    uint8_t body[512];
    size_t blen = psd__v1__step_request__pack(&req, body);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__STEP;
    env.request_id = seq + 1;
    env.worker_id = worker;
    env.client_id = client;
    env.body.data = body;
    env.body.len = blen;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = it.push ? 1 : 0;
    env.tensor = &t;
    frame f;
    nng_msg *m;
    int st = test_raw_call(port, &env, it.push ? &value : NULL, it.push ? 4 : 0, &f, &m);
    if (st == STATUS_OK) {
        Psd__V1__StepReply *r =
            psd__v1__step_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        assert_non_null(r);
        assert_int_equal(r->n_results, 1);
        *duplicate = r->results[0]->duplicate;
        assert_int_equal(f.segment_len, 4);
        memcpy(pulled, f.segment, 4);
        psd__v1__step_reply__free_unpacked(r, NULL);
    } else {
        fprintf(stderr, "raw step: %s: %s\n", status_name(st), f.env ? f.env->message : "");
    }
    if (st > -1000) {
        frame_fini(&f);
        nng_msg_free(m);
    }
    return st;
}

static void test_step_resent_is_applied_once(void **state)
{
    (void)state;
    ps_client *c = open_client(-1, NULL, NULL);
    ps_var *v = test_make_var_bound(c, "once/x", 1, PS_STALENESS_ASYNC);
    assert_non_null(v);
    /* The variable lives on one server: find which. */
    int owner = -1;
    for (int s = 0; s < 2; s++) {
        bool dup;
        float got;
        if (raw_step(tc.ports[s], 77, "once/x", 0, 0, false, -1, &dup, &got) == STATUS_OK)
            owner = s;
    }
    assert_true(owner >= 0);
    int port = tc.ports[owner];
    bool dup = true;
    float got = 0;
    assert_int_equal(raw_step(port, 0x1234, "once/x", 5, 2.0f, false, -1, &dup, &got), STATUS_OK);
    assert_false(dup);
    assert_true(got == -2.0f);
    assert_int_equal(raw_step(port, 0x1234, "once/x", 5, 2.0f, false, -1, &dup, &got), STATUS_OK);
    assert_true(dup);
    assert_true(got == -2.0f); /* not applied again */
    assert_int_equal(raw_step(port, 0x1234, "once/x", 6, 2.0f, false, -1, &dup, &got), STATUS_OK);
    assert_false(dup);
    assert_true(got == -4.0f);
    ps_client_close(c);
}

/* ---- bad input: clear errors, nothing applied ------------------------------------------- */

static int raw_items(int port, Psd__V1__StepItem **items, size_t n, bool advance, int worker,
                     const void *seg, size_t seglen, uint64_t tensor_count, char *msg, size_t cap)
{
    Psd__V1__StepRequest req = PSD__V1__STEP_REQUEST__INIT;
    req.n_items = n;
    req.items = items;
    req.advance_clock = advance;
    uint8_t body[2048];
    size_t blen = psd__v1__step_request__pack(&req, body);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__STEP;
    env.request_id = 9;
    env.worker_id = worker;
    env.client_id = 99;
    env.body.data = body;
    env.body.len = blen;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = tensor_count;
    if (seg || tensor_count)
        env.tensor = &t;
    frame f;
    nng_msg *m;
    int st = test_raw_call(port, &env, seg, seglen, &f, &m);
    assert_true(st > -1000);
    snprintf(msg, cap, "%s", f.env->message);
    fprintf(stderr, "%s: %s\n", status_name(st), msg);
    frame_fini(&f);
    nng_msg_free(m);
    return st;
}

static void test_step_bad_input(void **state)
{
    (void)state;
    ps_client *c = open_client(-1, NULL, NULL);
    ps_var *v = test_make_var_bound(c, "bad/a", 4, PS_STALENESS_ASYNC);
    assert_non_null(v);
    int port = -1;
    for (int s = 0; s < 2 && port < 0; s++) {
        Psd__V1__StepItem it = PSD__V1__STEP_ITEM__INIT;
        it.name = "bad/a";
        it.count = 4;
        it.pull = true;
        Psd__V1__StepItem *items[] = {&it};
        char msg[512];
        if (raw_items(tc.ports[s], items, 1, false, -1, NULL, 0, 0, msg, sizeof(msg)) == STATUS_OK)
            port = tc.ports[s];
    }
    assert_true(port > 0);
    char msg[512];
    float seg[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    Psd__V1__StepItem good = PSD__V1__STEP_ITEM__INIT;
    good.name = "bad/a";
    good.count = 4;
    good.push = true;
    good.seq = 1;
    Psd__V1__StepItem missing = PSD__V1__STEP_ITEM__INIT;
    missing.name = "bad/none";
    missing.count = 1;
    missing.pull = true;
    /* A bad later item: nothing of the request is applied. */
    Psd__V1__StepItem *items1[] = {&good, &missing};
    assert_int_equal(raw_items(port, items1, 2, false, -1, seg, 16, 4, msg, sizeof(msg)),
                     STATUS_NOT_FOUND);
    assert_non_null(strstr(msg, "step item 1"));
    assert_non_null(strstr(msg, "bad/none"));
    /* Out of range. */
    Psd__V1__StepItem far = good;
    far.offset = 2;
    Psd__V1__StepItem *items2[] = {&far};
    assert_int_equal(raw_items(port, items2, 1, false, -1, seg, 16, 4, msg, sizeof(msg)),
                     STATUS_OUT_OF_RANGE);
    /* Segment that does not match the pushed items. */
    Psd__V1__StepItem *items3[] = {&good};
    assert_int_equal(raw_items(port, items3, 1, false, -1, seg, 32, 8, msg, sizeof(msg)),
                     STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "Envelope.tensor"));
    assert_int_equal(raw_items(port, items3, 1, false, -1, NULL, 0, 0, msg, sizeof(msg)),
                     STATUS_INVALID_ARGUMENT);
    /* Neither push nor pull. */
    Psd__V1__StepItem idle = PSD__V1__STEP_ITEM__INIT;
    idle.name = "bad/a";
    idle.count = 1;
    Psd__V1__StepItem *items4[] = {&idle};
    assert_int_equal(raw_items(port, items4, 1, false, -1, NULL, 0, 0, msg, sizeof(msg)),
                     STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "neither pushes nor pulls"));
    /* A clock without a worker id. */
    Psd__V1__StepItem pull = idle;
    pull.pull = true;
    Psd__V1__StepItem *items5[] = {&pull};
    assert_int_equal(raw_items(port, items5, 1, true, -1, NULL, 0, 0, msg, sizeof(msg)),
                     STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "worker id"));
    /* Nothing was applied by any of them. */
    float w[4];
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    for (int k = 0; k < 4; k++)
        assert_true(w[k] == 0.0f);
    /* The library's own checks. */
    ps_step_item none = {v, 0, 4, NULL, NULL};
    assert_int_equal(ps_step(c, &none, 1, 0), PS_INVALID_ARGUMENT);
    ps_step_item past = {v, 2, 4, w, NULL};
    assert_int_equal(ps_step(c, &past, 1, 0), PS_OUT_OF_RANGE);
    ps_step_item ok = {v, 0, 4, NULL, w};
    assert_int_equal(ps_step(c, &ok, 1, PS_STEP_CLOCK), PS_FAILED_PRECONDITION);
    ps_client_close(c);
}

/* ---- BSP and SSP through steps: worker processes ----------------------------------------- */

#define BSP_STEPS 12
#define SSP_STEPS 15
#define SSP_BOUND 2

/* Every worker pushes 1 to each element at every step; under BSP (mean of the workers' sum),
 * after step t every worker must read exactly -(t + 1): its step waits for every worker's
 * clock and the aggregate. */
#define BSP_PARTS_N (3 * 262144 + 5) /* cut in 4 parts (split-parts) */

static int bsp_worker(int id, int n)
{
    split_parts = "true"; /* this process's clients: bsp/p is cut in parts, the others are small */
    ps_client *c = open_client(id, NULL, NULL);
    ps_var *a = c ? test_make_var_bound(c, "bsp/a", 5, PS_STALENESS_BSP) : NULL;
    ps_var *b = c ? test_make_var_bound(c, "bsp/b", 20000, PS_STALENESS_BSP) : NULL;
    ps_var *p = c ? test_make_var_bound(c, "bsp/p", BSP_PARTS_N, PS_STALENESS_BSP) : NULL;
    if (a == NULL || b == NULL || p == NULL || ps_var_num_shards(p) != 4)
        return 10;
    float *gp = malloc(BSP_PARTS_N * sizeof(float)), *wp = malloc(BSP_PARTS_N * sizeof(float));
    if (gp == NULL || wp == NULL)
        return 10;
    for (int k = 0; k < BSP_PARTS_N; k++)
        gp[k] = 1;
    float *ga = malloc(5 * sizeof(float)), *gb = malloc(20000 * sizeof(float));
    float *wa = malloc(5 * sizeof(float)), *wb = malloc(20000 * sizeof(float));
    for (int k = 0; k < 5; k++)
        ga[k] = 1;
    for (int k = 0; k < 20000; k++)
        gb[k] = 1;
    for (int t = 0; t < BSP_STEPS; t++) {
        if (id == 1)
            usleep(20000); /* a slower worker: the others must wait for it */
        ps_step_item items[3] = {
            {a, 0, 5, ga, wa}, {b, 0, 20000, gb, wb}, {p, 0, BSP_PARTS_N, gp, wp}};
        if (ps_step(c, items, 3, PS_STEP_CLOCK) != PS_OK) {
            fprintf(stderr, "bsp worker %d step %d: %s\n", id, t, ps_last_error());
            return 11;
        }
        for (int k = 0; k < 20000; k++) {
            if ((k < 5 && wa[k] != -(float)(t + 1)) || wb[k] != -(float)(t + 1)) {
                fprintf(stderr, "bsp worker %d step %d: read %g / %g, want %d\n", id, t,
                        k < 5 ? wa[k] : 0.0, wb[k], -(t + 1));
                return 12;
            }
        }
        for (int k = 0; k < BSP_PARTS_N; k++)
            if (wp[k] != -(float)(t + 1)) {
                fprintf(stderr, "bsp worker %d step %d: read bsp/p[%d] = %g, want %d\n", id, t, k,
                        wp[k], -(t + 1));
                return 12;
            }
    }
    (void)n;
    free(gp);
    free(wp);
    free(ga);
    free(gb);
    free(wa);
    free(wb);
    ps_client_close(c);
    return 0;
}

static int ssp_worker(int id)
{
    ps_client *c = open_client(id, NULL, NULL);
    ps_var *v = c ? test_make_var_bound(c, "ssp/w", 4, SSP_BOUND) : NULL;
    if (v == NULL)
        return 10;
    float w[4], g[4] = {1, 1, 1, 1};
    for (int t = 0; t < SSP_STEPS; t++) {
        ps_step_item it = {v, 0, 4, g, w};
        if (ps_step(c, &it, 1, PS_STEP_CLOCK) != PS_OK) {
            fprintf(stderr, "ssp worker %d step %d: %s\n", id, t, ps_last_error());
            return 11;
        }
        if (id == 1)
            usleep(40000);
    }
    ps_client_close(c);
    return 0;
}

static pid_t spawn(const char *role, int id, int n)
{
    return test_spawn_child(self_bin, server_bin, role, id, n, tc.spec);
}

static void run_workers(const char *role, int n)
{
    pid_t kids[4];
    for (int k = 0; k < n; k++)
        kids[k] = spawn(role, k, n);
    for (int k = 0; k < n; k++) {
        int st;
        assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fprintf(stderr, "%s worker %d: status %d\n", role, k, st);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
}

static int start_workers3(void **state)
{
    (void)state;
    return test_cluster_start_workers(&tc, server_bin, 2, 3, NULL);
}

static void test_step_bsp_reads_every_aggregate(void **state)
{
    (void)state;
    run_workers("bsp", 3);
}

static int start_workers2(void **state)
{
    (void)state;
    return test_cluster_start_workers(&tc, server_bin, 1, 2, NULL);
}

static void test_step_ssp_bound_holds(void **state)
{
    (void)state;
    run_workers("ssp", 2);
    ps_client *c = open_client(-1, NULL, NULL);
    ps_var *v;
    assert_int_equal(ps_var_lookup(c, "ssp/w", &v), PS_OK);
    ps_staleness_stats s;
    assert_int_equal(ps_var_staleness(c, v, &s), PS_OK);
    fprintf(stderr, "ssp via steps: max staleness %lld, %llu of %llu pulls waited %llu ms\n",
            (long long)s.max, (unsigned long long)s.waits, (unsigned long long)s.pulls,
            (unsigned long long)s.wait_ms);
    assert_true(s.max <= SSP_BOUND);
    assert_true(s.waits > 0); /* the fast worker was held back */
    assert_true(s.pulls >= 2 * SSP_STEPS);
    float w[4];
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    assert_true(w[0] == -2.0f * SSP_STEPS);
    ps_client_close(c);
}

/* A step whose pull waits for a worker that never comes ends at the deadline, naming it. */
static void test_step_wait_deadline_names_the_worker(void **state)
{
    (void)state;
    const char *settings[] = {"deadline-ms", "1500", NULL};
    ps_client *c = test_cluster_open_worker(&tc, 0, settings);
    ps_var *v = test_make_var_bound(c, "late/w", 2, PS_STALENESS_BSP);
    assert_non_null(v);
    float g[2] = {1, 1}, w[2];
    ps_step_item it = {v, 0, 2, g, w};
    uint64_t t0 = time_now_ns();
    int rc = ps_step(c, &it, 1, PS_STEP_CLOCK); /* worker 1 never clocks */
    uint64_t ms = (time_now_ns() - t0) / 1000000;
    fprintf(stderr, "after %llu ms: %s: %s\n", (unsigned long long)ms, ps_strerror(rc),
            ps_last_error());
    assert_int_equal(rc, PS_DEADLINE_EXCEEDED);
    assert_non_null(strstr(ps_last_error(), "worker 1"));
    assert_non_null(strstr(ps_last_error(), "late/w"));
    assert_in_range(ms, 1000, 5000);
    assert_int_equal(ps_client_clock(c), 0); /* the step failed: the clock did not move here */
    ps_client_close(c);
}

/* ---- prefetch: ps_pull_at_async reads at the clock it names ------------------------------ */

static void test_pull_at_waits_for_its_clock(void **state)
{
    (void)state;
    ps_client *c0 = test_cluster_open_worker(&tc, 0, NULL);
    ps_client *c1 = test_cluster_open_worker(&tc, 1, NULL);
    assert_non_null(c0);
    assert_non_null(c1);
    ps_var *v = test_make_var_bound(c0, "ahead/w", 2, 1); /* SSP, s = 1 */
    assert_non_null(v);
    float g[2] = {1, 1}, w[2] = {7, 7};
    assert_int_equal(ps_clock(c0, NULL), PS_OK);
    assert_int_equal(ps_clock(c1, NULL), PS_OK); /* both at clock 1 */

    /* Bad input: an item that pushes, no dst, a client without a worker id. */
    ps_step_item bad = {v, 0, 2, g, w};
    ps_op *op = NULL;
    assert_int_equal(ps_pull_at_async(c0, &bad, 1, 2, NULL, NULL, &op), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "only pulls"));
    bad.grad = NULL;
    bad.dst = NULL;
    assert_int_equal(ps_pull_at_async(c0, &bad, 1, 2, NULL, NULL, &op), PS_INVALID_ARGUMENT);
    ps_client *plain = open_client(-1, NULL, NULL);
    assert_non_null(plain);
    ps_step_item it = {v, 0, 2, NULL, w};
    assert_int_equal(ps_pull_at_async(plain, &it, 1, 2, NULL, NULL, &op), PS_FAILED_PRECONDITION);
    assert_null(op);
    ps_client_close(plain);

    /* At clock 2 (the next one of c0): the bound needs every worker at 1: answered at once,
     * with the push made before it, and the client's clock does not move. */
    assert_int_equal(ps_push(c0, v, g), PS_OK);
    assert_int_equal(ps_pull_at_async(c0, &it, 1, 2, NULL, NULL, &op), PS_OK);
    assert_int_equal(ps_op_wait(op), PS_OK);
    ps_op_destroy(op);
    assert_true(w[0] == -1.0f && w[1] == -1.0f);
    assert_int_equal(ps_client_clock(c0), 1);

    /* c0 at clock 2 reads at 3: the bound needs every worker at 2, and worker 1 is at 1: the
     * read waits until it clocks. */
    assert_int_equal(ps_clock(c0, NULL), PS_OK);
    assert_int_equal(ps_pull_at_async(c0, &it, 1, 3, NULL, NULL, &op), PS_OK);
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
    assert_false(ps_op_done(op));
    assert_int_equal(ps_push(c1, v, g), PS_OK);
    assert_int_equal(ps_clock(c1, NULL), PS_OK);
    assert_int_equal(ps_op_wait(op), PS_OK);
    ps_op_destroy(op);
    assert_true(w[0] == -2.0f); /* worker 1's push of its clock 1 is in */
    ps_staleness_stats ss;
    assert_int_equal(ps_var_staleness(c0, v, &ss), PS_OK);
    assert_true(ss.waits >= 1);
    assert_true(ss.max <= 1);
    ps_client_close(c1);
    ps_client_close(c0);
}

/* ---- bfloat16 on the wire ---------------------------------------------------------------- */

static void test_bf16_wire(void **state)
{
    (void)state;
    ps_client *c32 = open_client(-1, NULL, NULL), *c16 = open_client(-1, NULL, "bfloat16");
    assert_non_null(c32);
    assert_non_null(c16);
    enum { N = 100000 };
    ps_var *v = test_make_var_bound(c32, "bf16/x", N, PS_STALENESS_ASYNC);
    assert_non_null(v);
    ps_var *v16 = test_find_var(c16, "bf16/x");
    assert_non_null(v16);
    float *g = malloc(N * sizeof(float)), *w = malloc(N * sizeof(float));
    for (int k = 0; k < N; k++)
        g[k] = (float)(k % 5) * 0.5f; /* exact in bfloat16 */
    int shards = ps_var_num_shards(v);
    uint64_t in0 = 0, in1 = 0;
    ps_server_stats st;
    for (int s = 0; s < 2; s++) {
        assert_int_equal(ps_server_status(c32, s, &st), PS_OK);
        in0 += st.bytes_in;
    }
    assert_int_equal(ps_push(c16, v16, g), PS_OK);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(ps_server_status(c32, s, &st), PS_OK);
        in1 += st.bytes_in;
    }
    uint64_t bf16_bytes = in1 - in0;
    assert_int_equal(ps_push(c32, v, g), PS_OK);
    uint64_t in2 = 0;
    for (int s = 0; s < 2; s++) {
        assert_int_equal(ps_server_status(c32, s, &st), PS_OK);
        in2 += st.bytes_in;
    }
    uint64_t f32_bytes = in2 - in1;
    fprintf(stderr, "push of %d elements (%d shards): %llu bytes in bfloat16, %llu in float32\n", N,
            shards, (unsigned long long)bf16_bytes, (unsigned long long)f32_bytes);
    assert_true(bf16_bytes < f32_bytes * 52 / 100); /* half, plus envelopes and status calls */
    /* Both pushes applied in float32 on the server: exact. */
    assert_int_equal(ps_pull(c32, v, w), PS_OK);
    for (int k = 0; k < N; k++)
        assert_true(w[k] == -2.0f * g[k]);
    /* A bfloat16 pull returns the values rounded to 8 significant bits. */
    float one = 1.0f / 3.0f, got;
    assert_int_equal(ps_push_range(c32, v, 7, 1, &one), PS_OK);
    assert_int_equal(ps_pull_range(c16, v16, 7, 1, &got), PS_OK);
    float exact;
    assert_int_equal(ps_pull_range(c32, v, 7, 1, &exact), PS_OK);
    fprintf(stderr, "value %.9g read as %.9g over bfloat16\n", exact, got);
    assert_true(got != exact && fabsf(got - exact) <= fabsf(exact) / 256.0f);
    /* Steps and push-pull over bfloat16. */
    ps_step_item it = {v16, 0, N, g, w};
    assert_int_equal(ps_step(c16, &it, 1, 0), PS_OK);
    assert_true(w[1] == -3.0f * g[1] && w[4] == -3.0f * g[4]);
    assert_int_equal(ps_push_pull(c16, v16, g, w), PS_OK);
    assert_true(w[2] == -4.0f * g[2]);
    free(g);
    free(w);
    ps_client_close(c16);
    ps_client_close(c32);
}

/* ---- a variable cut in parts ------------------------------------------------------------- */

#define PARTS_N (3 * 262144 + 5) /* 4 parts of 2^18 elements, the last of 5 */

/* Steps, pulls and pushes of a variable cut in parts (split-parts) on 2 servers: whole, and in
 * ranges that cross part boundaries (each cut per part by the client); its pulls' staleness
 * summed over the parts; deleted with every part. */
static void test_step_parts(void **state)
{
    (void)state;
    split_parts = "true";
    ps_client *c = open_client(0, NULL, NULL);
    split_parts = "false";
    assert_non_null(c);
    ps_var *v = test_make_var_bound(c, "parts/w", PARTS_N, PS_STALENESS_ASYNC);
    assert_non_null(v);
    assert_int_equal(ps_var_num_shards(v), 4);
    float *g = malloc(PARTS_N * sizeof(float)), *dst = malloc(PARTS_N * sizeof(float));
    float *check = malloc(PARTS_N * sizeof(float));
    assert_true(g && dst && check);
    for (uint64_t k = 0; k < PARTS_N; k++)
        g[k] = (float)(k % 5 + 1);
    for (int step = 1; step <= 2; step++) {
        ps_step_item it = {v, 0, PARTS_N, g, dst};
        assert_int_equal(ps_step(c, &it, 1, PS_STEP_CLOCK), PS_OK);
        assert_int_equal(ps_pull(c, v, check), PS_OK);
        for (uint64_t k = 0; k < PARTS_N; k++)
            if (dst[k] != -(float)step * g[k] || check[k] != dst[k]) {
                fprintf(stderr, "parts/w[%llu] step %d: step gave %g, pull %g, want %g\n",
                        (unsigned long long)k, step, dst[k], check[k], -(float)step * g[k]);
                fail();
            }
    }
    /* Ranges across the boundaries of parts 0/1 and 2/3 (the last part holds 5 elements). */
    float one[20], got[20];
    for (int k = 0; k < 20; k++)
        one[k] = 1;
    ps_step_item items[2] = {{v, 262144 - 10, 20, one, got}, {v, 3 * 262144 - 15, 20, one, NULL}};
    assert_int_equal(ps_step(c, items, 2, 0), PS_OK);
    for (int k = 0; k < 20; k++)
        if (got[k] != -2.0f * g[262144 - 10 + k] - 1.0f) {
            fprintf(stderr, "parts/w[%d]: step pulled %g, want %g\n", 262144 - 10 + k, got[k],
                    -2.0f * g[262144 - 10 + k] - 1.0f);
            fail();
        }
    assert_int_equal(ps_push_range(c, v, 3 * 262144 - 15, 20, one), PS_OK);
    assert_int_equal(ps_pull_range(c, v, 3 * 262144 - 15, 20, got), PS_OK);
    for (int k = 0; k < 20; k++)
        assert_true(got[k] == -2.0f * g[3 * 262144 - 15 + k] - 2.0f);
    ps_staleness_stats ss;
    assert_int_equal(ps_var_staleness(c, v, &ss), PS_OK);
    /* Another client finds it by name and sees the same values. */
    ps_client *c2 = open_client(-1, NULL, NULL);
    assert_non_null(c2);
    ps_var *v2;
    assert_int_equal(ps_var_lookup(c2, "parts/w", &v2), PS_OK);
    assert_int_equal(ps_var_num_shards(v2), 4);
    assert_int_equal(ps_pull(c2, v2, dst), PS_OK);
    assert_int_equal(ps_pull(c, v, check), PS_OK);
    assert_memory_equal(dst, check, PARTS_N * sizeof(float));
    assert_int_equal(ps_var_delete(c2, "parts/w"), PS_OK);
    assert_int_equal(ps_var_lookup(c2, "parts/w", &v2), PS_NOT_FOUND);
    /* Made again: fresh values (every part was dropped). */
    split_parts = "true";
    ps_client *c3 = open_client(-1, NULL, NULL);
    split_parts = "false";
    assert_non_null(c3);
    ps_var *v3 = test_make_var_bound(c3, "parts/w", PARTS_N, PS_STALENESS_ASYNC);
    assert_non_null(v3);
    assert_int_equal(ps_pull(c3, v3, dst), PS_OK);
    for (uint64_t k = 0; k < PARTS_N; k++)
        assert_true(dst[k] == 0.0f);
    ps_client_close(c3);
    ps_client_close(c2);
    ps_client_close(c);
    free(g);
    free(dst);
    free(check);
}

/* argv: SERVER --child ROLE ID N SPEC */
static int child_main(char **argv)
{
    const char *role = argv[3];
    int id = atoi(argv[4]), n = atoi(argv[5]);
    snprintf(tc.spec, sizeof(tc.spec), "%s", argv[6]);
    if (strcmp(role, "ssp") == 0)
        return ssp_worker(id);
    return bsp_worker(id, n);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    self_bin = argv[0];
    if (argc == 7 && strcmp(argv[2], "--child") == 0)
        return child_main(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_step_one_message_per_server, start2w, stop),
        cmocka_unit_test_setup_teardown(test_step_in_chunks, start2w, stop),
        cmocka_unit_test_setup_teardown(test_step_is_one_request_per_server, start2w, stop),
        cmocka_unit_test_setup_teardown(test_step_resent_is_applied_once, start2, stop),
        cmocka_unit_test_setup_teardown(test_step_bad_input, start2, stop),
        cmocka_unit_test_setup_teardown(test_step_bsp_reads_every_aggregate, start_workers3, stop),
        cmocka_unit_test_setup_teardown(test_step_ssp_bound_holds, start_workers2, stop),
        cmocka_unit_test_setup_teardown(test_step_wait_deadline_names_the_worker, start_workers2,
                                        stop),
        cmocka_unit_test_setup_teardown(test_pull_at_waits_for_its_clock, start_workers2, stop),
        cmocka_unit_test_setup_teardown(test_bf16_wire, start2, stop),
        cmocka_unit_test_setup_teardown(test_step_parts, start2w, stop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
