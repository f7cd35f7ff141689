/* Integration: replica groups (replicas 2) on 3 real ps-server processes. Several client
 * processes push integer gradients (SGD, lr 1, from zeros: values are minus the exact sums) to a
 * split variable (cut in 4 parts, which land on every group; group 2 holds two) and a small one,
 * some with Adam (optimizer slots); afterwards every group's primary and its backup copy hold
 * bit-identical state (checksums over names, versions, values and slots, asked with REPLICATE). The
 * view comes from a real etcd the test starts (skipped, exit 77, without one). Requests naming a
 * group a server does not serve are refused naming the primary (staleness bounds with replicas:
 * test failover-sync); a REPLICATE under a view epoch older than the server's is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <pthread.h>
#include <unistd.h>

#include <nng/nng.h>

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "ps_proc.h"
#include "psclient.h"
#include "placement.h"
#include "slots.h"
#include "replicated_cluster.h"
#include "view_etcd.h"

#define NSERVERS 3
#define NCLIENTS 3
#define ROUNDS 40
/* 3 MiB: 4 parts of 2^18 floats (split-parts), on groups 1, 2, 2, 0 */
#define BIG_N (3 * 262144 + 5)
#define SMALL_N 16

static const char *server_bin;
static test_cluster tc;
static etcd_proc etcd;

static test_repl_flags flags; /* the servers' flags, for test_cluster_respawn */

static int setup(void **state)
{
    (void)state;
    return test_replicated_start(&tc, &etcd, &flags, server_bin, NSERVERS, 0, "2", "1000", NULL);
}

static int teardown(void **state)
{
    (void)state;
    return test_replicated_stop(&tc, &etcd);
}

static ps_client *open_client(void)
{
    static const char *const settings[] = {"split-threshold-bytes", "64K", "chunk-bytes", "64K",
                                           NULL};
    return test_replicated_client(&tc, -1, "2", settings);
}

static float grad(int client, int round, size_t i)
{
    return (float)((client + 1) * ((int)((i + (size_t)round) % 7) + 1));
}

static int client_main(int id, const void *arg)
{
    (void)arg;
    ps_client *c = open_client();
    if (c == NULL)
        return 10;
    ps_var_spec s;
    ps_var *big, *small, *adam;
    ps_var_spec_init(&s, "rep/big");
    s.ndims = 1;
    s.dims[0] = BIG_N;
    s.learning_rate = 1.0;
    if (ps_var_create(c, &s, &big) != PS_OK)
        return 11;
    ps_var_spec_init(&s, "rep/small");
    s.ndims = 1;
    s.dims[0] = SMALL_N;
    s.learning_rate = 1.0;
    if (ps_var_create(c, &s, &small) != PS_OK)
        return 12;
    ps_var_spec_init(&s, "rep/adam");
    s.ndims = 1;
    s.dims[0] = 4096;
    s.optimizer = PS_OPT_ADAM;
    s.learning_rate = 0.01;
    if (ps_var_create(c, &s, &adam) != PS_OK) {
        fprintf(stderr, "client %d create adam: %s\n", id, ps_last_error());
        return 13;
    }
    float *g = malloc(BIG_N * sizeof(float));
    float sg[SMALL_N], ag[4096];
    for (int r = 0; r < ROUNDS; r++) {
        for (size_t i = 0; i < BIG_N; i++)
            g[i] = grad(id, r, i);
        for (int i = 0; i < SMALL_N; i++)
            sg[i] = (float)(id + 1);
        for (int i = 0; i < 4096; i++)
            ag[i] = 0.001f * (float)((i * (id + 3) + r) % 13) - 0.006f;
        if (ps_push(c, big, g) != PS_OK || ps_push(c, small, sg) != PS_OK ||
            ps_push(c, adam, ag) != PS_OK) {
            fprintf(stderr, "client %d push: %s\n", id, ps_last_error());
            free(g);
            return 14;
        }
    }
    free(g);
    ps_client_close(c);
    return 0;
}

/* REPLICATE with checksum set, to server `server` about group `group`: returns the status and
 * the reply's fields. */
static int group_checksum(int server, uint32_t group, uint64_t epoch, uint64_t *sum, uint32_t *vars,
                          uint64_t *lsn)
{
    return test_group_checksum(tc.ports[server], group, epoch, sum, vars, lsn);
}

/* Both copies of every group (ps g and ps g+1) are at the same log position with the same
 * checksum. */
static void assert_copies_agree(void)
{
    for (uint32_t grp = 0; grp < NSERVERS; grp++) {
        uint64_t s0 = 0, s1 = 1, l0 = 0, l1 = 0;
        assert_int_equal(group_checksum((int)grp, grp, 0, &s0, NULL, &l0), 0);
        assert_int_equal(group_checksum((int)((grp + 1) % NSERVERS), grp, 0, &s1, NULL, &l1), 0);
        fprintf(stderr, "group %u: %016llx at lsn %llu on ps %u, %016llx at lsn %llu on ps %u\n",
                grp, (unsigned long long)s0, (unsigned long long)l0, grp, (unsigned long long)s1,
                (unsigned long long)l1, (grp + 1) % NSERVERS);
        assert_int_equal(l0, l1);
        assert_true(s0 == s1);
    }
}

static void test_exact_sums_and_identical_replicas(void **state)
{
    (void)state;
    test_fork_clients(NCLIENTS, client_main, NULL);
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var *big, *small;
    assert_int_equal(ps_var_lookup(c, "rep/big", &big), PS_OK);
    assert_int_equal(ps_var_lookup(c, "rep/small", &small), PS_OK);
    assert_int_equal(ps_var_num_shards(big), 4); /* parts */
    float *w = malloc(BIG_N * sizeof(float));
    assert_int_equal(ps_pull(c, big, w), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < BIG_N; i++) {
        float expect = 0;
        for (int k = 0; k < NCLIENTS; k++)
            for (int r = 0; r < ROUNDS; r++)
                expect -= grad(k, r, i);
        if (w[i] != expect && wrong++ < 5)
            fprintf(stderr, "big[%zu] = %g, expected %g\n", i, w[i], expect);
    }
    assert_int_equal(wrong, 0);
    float sv[SMALL_N];
    assert_int_equal(ps_pull(c, small, sv), PS_OK);
    for (int i = 0; i < SMALL_N; i++)
        assert_true(sv[i] == -(float)(ROUNDS * (1 + 2 + 3)));
    free(w);
    ps_client_close(c);
    /* Every group: its primary (server g) and its backup (server g + 1) hold the same state.
     * Every push was acknowledged only after the backup applied it, so nothing is in flight. */
    for (uint32_t g = 0; g < NSERVERS; g++) {
        uint64_t s0 = 0, s1 = 1, l0 = 0, l1 = 0;
        uint32_t v0 = 0, v1 = 0;
        assert_int_equal(group_checksum((int)g, g, 0, &s0, &v0, &l0), 0);
        assert_int_equal(group_checksum((int)((g + 1) % NSERVERS), g, 0, &s1, &v1, &l1), 0);
        fprintf(stderr,
                "group %u: primary %016llx (%u variables, lsn %llu), backup %016llx "
                "(%u variables, lsn %llu)\n",
                g, (unsigned long long)s0, v0, (unsigned long long)l0, (unsigned long long)s1, v1,
                (unsigned long long)l1);
        assert_true(v0 >= 1);
        assert_int_equal(v0, v1);
        assert_true(l0 > (uint64_t)ROUNDS);
        assert_int_equal(l0, l1);
        assert_true(s0 == s1);
        /* Server g + 2 holds no copy of group g. */
        uint64_t s2;
        uint32_t v2;
        uint64_t l2;
        assert_int_equal(group_checksum((int)((g + 2) % NSERVERS), g, 0, &s2, &v2, &l2),
                         PS_FAILED_PRECONDITION);
    }
}

static int64_t ms_since(const struct timespec *t0)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

/* A table with ttl_ms 150: its rows expire while new ones arrive. Every copy removes the same
 * rows at the same point of the log (its primary logs the sweeps, and every copy applies an
 * operation at the time its primary logged it), also a copy made by a rejoining server, whose
 * own sweeps would start afresh: ps 1 is killed (-9) and restarted after 1 s of pushes, copies
 * groups 0 and 1 as pushes go on and rejoins; after 2 s more each group's copies are
 * identical. Rows long unpushed are gone, fresh ones are there. A client's sweep request is
 * refused. */
static void test_ttl_table_copies_identical(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "rep/ttl", 4, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    sp.ttl_ms = 150;
    ps_table *t;
    assert_int_equal(ps_table_create(c, &sp, &t), PS_OK);
    float g[8 * 4];
    for (int i = 0; i < 8 * 4; i++)
        g[i] = 1.0f;
    int64_t ids[8];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int pushes = 0;
    bool restarted = false, rejoined = false;
    while (!rejoined || ms_since(&t1) < 2000) {
        for (int k = 0; k < 8; k++)
            ids[k] = (int64_t)(pushes * 8 + k) % 400; /* every id comes back after 50 pushes */
        int rc = ps_table_push(t, ids, 8, g);
        if (rc != PS_OK)
            fprintf(stderr, "push %d: %s\n", pushes, ps_last_error());
        assert_int_equal(rc, PS_OK);
        pushes++;
        usleep(5000);
        if (!restarted && ms_since(&t0) >= 1000) {
            assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
            assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
            restarted = true;
        }
        /* Epoch 2: ps 1 left the view; 3: it is back. */
        if (restarted && !rejoined && pushes % 20 == 0 && test_server_epoch(tc.ports[0]) >= 3) {
            rejoined = true;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            fprintf(stderr, "ps 1 restarted and back in the view %lld ms after the start\n",
                    (long long)ms_since(&t0));
        }
        assert_true(ms_since(&t0) < 60000);
    }
    /* The last ids pushed are there; one not pushed for more than 1 s (ttl 150 ms, a sweep a
     * second) is gone (reads as its initializer, zeros). */
    float row[4];
    assert_int_equal(ps_table_pull(t, &ids[7], 1, row), PS_OK);
    assert_true(row[0] < 0.0f);
    ps_table_info info = {.struct_size = sizeof(info)};
    assert_int_equal(ps_table_info_get(c, "rep/ttl", &info), PS_OK);
    fprintf(stderr, "ttl table: %d pushes, %llu rows, %llu expired\n", pushes,
            (unsigned long long)info.rows, (unsigned long long)info.evicted_ttl);
    assert_true(info.evicted_ttl > 0);
    ps_table_free(t);
    ps_client_close(c);
    /* A sweep is not a client's to ask for: refused before it is logged. */
    Psd__V1__TablePushRequest rq = PSD__V1__TABLE_PUSH_REQUEST__INIT;
    rq.name = "rep/ttl";
    rq.sweep = true;
    uint8_t body[64];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__TABLE_PUSH;
    env.body.data = body;
    env.body.len = psd__v1__table_push_request__pack(&rq, body);
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    tm.dtype = PSD__V1__DTYPE__FLOAT32;
    tm.count = 1;
    env.tensor = &tm;
    float zero = 0.0f;
    frame f;
    nng_msg *m;
    assert_int_equal(test_raw_call(tc.ports[0], &env, &zero, sizeof(zero), &f, &m),
                     PS_PERMISSION_DENIED);
    frame_fini(&f);
    nng_msg_free(m);
    assert_copies_agree();
}

/* Admission (min_count > 1) decides alike on every copy, also on one that rejoined: its copy
 * carries the admission sketches. Ids pushed twice, a server restarted (it copies its groups
 * back from their primaries), each id pushed once more: the third push admits every id on the
 * primary and on the rejoined backup alike (before, the backup's sketch started empty and it
 * only counted them). */
static void test_admission_alike_after_rejoin(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "rep/adm", 4, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    sp.min_count = 3;
    ps_table *t;
    assert_int_equal(ps_table_create(c, &sp, &t), PS_OK);
    enum { N = 240 };
    int64_t ids[N];
    float g[N * 4];
    for (int i = 0; i < N; i++)
        ids[i] = 1000 + 7 * i;
    for (int i = 0; i < N * 4; i++)
        g[i] = 1.0f;
    for (int round = 0; round < 2; round++)
        assert_int_equal(ps_table_push(t, ids, N, g), PS_OK);
    uint64_t e0 = test_server_epoch(tc.ports[0]);
    assert_int_equal(kill(tc.pids[2], SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(tc.pids[2], &st, 0), tc.pids[2]);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 2, flags.v), 0);
    /* Out of the view, then back in it (two more epochs). */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (test_server_epoch(tc.ports[0]) < e0 + 2) {
        assert_true(ms_since(&t0) < 60000);
        usleep(50 * 1000);
    }
    assert_int_equal(ps_table_push(t, ids, N, g), PS_OK);
    float rows[N * 4];
    assert_int_equal(ps_table_pull(t, ids, N, rows), PS_OK);
    for (int i = 0; i < N; i++)
        assert_true(rows[i * 4] == -1.0f); /* admitted at the third push, its gradient applied */
    assert_copies_agree();
    ps_table_free(t);
    ps_client_close(c);
}

/* A table pull reads: it is not logged (no log position, nothing streamed to the backups),
 * while a table push is. (The TTL table of the test before goes on sweeping: a logged
 * operation a second.) */
static void test_table_pull_not_logged(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "rep/reads", 4, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    ps_table *t;
    assert_int_equal(ps_table_create(c, &sp, &t), PS_OK);
    int64_t ids[64];
    float g[64 * 4], rows[64 * 4];
    for (int i = 0; i < 64; i++)
        ids[i] = i * 7;
    for (int i = 0; i < 64 * 4; i++)
        g[i] = 1.0f;
    assert_int_equal(ps_table_push(t, ids, 64, g), PS_OK);
    uint64_t before[NSERVERS], after[NSERVERS], sum;
    for (uint32_t grp = 0; grp < NSERVERS; grp++)
        assert_int_equal(group_checksum((int)grp, grp, 0, &sum, NULL, &before[grp]), 0);
    for (int k = 0; k < 20; k++) {
        assert_int_equal(ps_table_pull(t, ids, 64, rows), PS_OK);
        for (int i = 0; i < 64 * 4; i++)
            assert_true(rows[i] == -1.0f);
    }
    for (uint32_t grp = 0; grp < NSERVERS; grp++) {
        assert_int_equal(group_checksum((int)grp, grp, 0, &sum, NULL, &after[grp]), 0);
        /* 20 pulls, each with a part for every group: logged, they would take 20 positions
         * here; the log moves only by the earlier TTL table's sweeps (one a second). */
        assert_true(after[grp] - before[grp] < 10);
    }
    assert_int_equal(ps_table_push(t, ids, 64, g), PS_OK);
    uint64_t moved = 0;
    for (uint32_t grp = 0; grp < NSERVERS; grp++) {
        assert_int_equal(group_checksum((int)grp, grp, 0, &sum, NULL, &after[grp]), 0);
        moved += after[grp] - before[grp];
    }
    assert_true(moved > 0); /* the push is logged */
    ps_table_free(t);
    ps_client_close(c);
}

/* A pull naming group 0 at its backup (server 1) is refused, naming server 0 as the primary;
 * one at a server that holds no copy too. */
static void test_not_primary_names_primary(void **state)
{
    (void)state;
    Psd__V1__PullRequest rq = PSD__V1__PULL_REQUEST__INIT;
    rq.name = "rep/small";
    uint8_t body[64];
    size_t blen = psd__v1__pull_request__pack(&rq, body);
    for (int server = 1; server <= 2; server++) {
        Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
        t.dtype = PSD__V1__DTYPE__FLOAT32;
        t.count = 1;
        envelope env = PSD__V1__ENVELOPE__INIT;
        env.method = PSD__V1__METHOD__PULL;
        env.body.data = body;
        env.body.len = blen;
        env.tensor = &t;
        env.group = 1 + 0;
        frame f;
        nng_msg *m;
        int st = test_raw_call(tc.ports[server], &env, NULL, 0, &f, &m);
        assert_int_equal(st, PS_FAILED_PRECONDITION);
        fprintf(stderr, "server %d: %s\n", server, f.env->message);
        assert_int_equal(f.env->primary, 1 + 0);
        assert_true(f.env->epoch >= 1);
        assert_non_null(strstr(f.env->message, "primary is server 0"));
        frame_fini(&f);
        nng_msg_free(m);
    }
    /* A group past the cluster's: a clear INVALID_ARGUMENT. */
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 1;
    env.method = PSD__V1__METHOD__PULL;
    env.body.data = body;
    env.body.len = blen;
    env.tensor = &t;
    env.group = 1 + 7;
    frame f;
    nng_msg *m;
    assert_int_equal(test_raw_call(tc.ports[0], &env, NULL, 0, &f, &m), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(f.env->message, "group 7 does not exist"));
    frame_fini(&f);
    nng_msg_free(m);
}

/* REPLICATE requests that do not add up are refused with a message naming what is wrong. */
/* The cluster token the servers read from etcd (prefix/token): into buf, or "". */
static void cluster_token(char *buf, size_t cap)
{
    char prefix[64], key[128], err[512];
    test_view_prefix(&tc, prefix, sizeof(prefix));
    snprintf(key, sizeof(key), "%s/token", prefix);
    buf[0] = '\0';
    etcd_client *e = NULL;
    char *v = NULL;
    size_t len = 0;
    if (etcd_client_create(&e, etcd.endpoint, 2000, err, sizeof(err)) == 0 &&
        etcd_get(e, key, &v, &len, NULL, err, sizeof(err)) == 0 && len < cap) {
        memcpy(buf, v, len);
        buf[len] = '\0';
    }
    free(v);
    etcd_client_destroy(e);
}

/* REPLICATE is the servers' alone: refused without the cluster token, also from loopback (a
 * local process that could otherwise make a backup skip its primary's next update); from a
 * view epoch the server has not installed, refused; with the token, bad input is named. */
static void test_replicate_bad_input(void **state)
{
    (void)state;
    uint64_t lens[1] = {10};
    Psd__V1__ReplicateRequest rq = PSD__V1__REPLICATE_REQUEST__INIT;
    rq.group = 0;
    rq.epoch = test_server_epoch(tc.ports[1]); /* the server's own */
    rq.first_lsn = 1;
    rq.n_op_len = 1;
    rq.op_len = lens;
    uint8_t body[64], seg[8] = {0};
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 2;
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__REPLICATE;
    env.body.data = body;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    env.tensor = &t;
    frame f;
    nng_msg *m;
    assert_int_equal(test_raw_call(tc.ports[1], &env, seg, sizeof(seg), &f, &m),
                     PS_PERMISSION_DENIED);
    fprintf(stderr, "%s\n", f.env->message);
    assert_non_null(strstr(f.env->message, "cluster token"));
    frame_fini(&f);
    nng_msg_free(m);
    env.auth_token.data = (uint8_t *)"0123456789abcdef0123456789abcdef";
    env.auth_token.len = 32;
    assert_int_equal(test_raw_call(tc.ports[1], &env, seg, sizeof(seg), &f, &m),
                     PS_PERMISSION_DENIED);
    frame_fini(&f);
    nng_msg_free(m);
    char tok[80];
    cluster_token(tok, sizeof(tok));
    assert_true(strlen(tok) >= 16);
    env.auth_token.data = (uint8_t *)tok;
    env.auth_token.len = strlen(tok);
    /* A view epoch the server has not installed. */
    rq.epoch += 1000;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    assert_int_equal(test_raw_call(tc.ports[1], &env, seg, sizeof(seg), &f, &m), PS_UNAVAILABLE);
    assert_non_null(strstr(f.env->message, "has not installed that view"));
    frame_fini(&f);
    nng_msg_free(m);
    rq.epoch -= 1000;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    /* Server 1 holds the backup of group 0: an operation longer than the segment. */
    assert_int_equal(test_raw_call(tc.ports[1], &env, seg, sizeof(seg), &f, &m),
                     PS_INVALID_ARGUMENT);
    fprintf(stderr, "%s\n", f.env->message);
    assert_non_null(strstr(f.env->message, "operation 0 has length 10"));
    frame_fini(&f);
    nng_msg_free(m);
    /* Lengths that do not fill the segment. */
    lens[0] = 4;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    assert_int_equal(test_raw_call(tc.ports[1], &env, seg, sizeof(seg), &f, &m),
                     PS_INVALID_ARGUMENT);
    assert_non_null(strstr(f.env->message, "in a segment of 8 bytes"));
    frame_fini(&f);
    nng_msg_free(m);
    /* An epoch older than the server's view. */
    rq.epoch = 0;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    assert_int_equal(test_raw_call(tc.ports[1], &env, seg, sizeof(seg), &f, &m),
                     PS_FAILED_PRECONDITION);
    fprintf(stderr, "%s\n", f.env->message);
    assert_non_null(strstr(f.env->message, "under view epoch 0 refused"));
    assert_int_equal(f.env->primary, 1 + 0);
    frame_fini(&f);
    nng_msg_free(m);
    /* The primary itself refuses a stream of its own group. */
    rq.epoch = test_server_epoch(tc.ports[0]);
    lens[0] = 8;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    int st = test_raw_call(tc.ports[0], &env, seg, sizeof(seg), &f, &m);
    fprintf(stderr, "%s\n", f.env->message);
    assert_int_equal(st, PS_FAILED_PRECONDITION);
    assert_non_null(strstr(f.env->message, "this server is its primary"));
    frame_fini(&f);
    nng_msg_free(m);
}

/* A clean hand-over: SIGTERM to the primary of group 1 (ps 1), a client pushing to a variable
 * of that group. The server gives up its lease and, before it stops serving, waits for the
 * view that moves the group to ps 2 (a lease poll): its installation answers the pushes parked
 * there naming ps 2, and the client follows at once (it logs "group 1: ps 1 says ps 2 is its
 * primary"), instead of a push in flight waiting out a whole probe interval (2 s) for a server
 * that had closed its sockets ("no answer from ps 1"). The times are printed, not asserted. */
#define HANDOVER_MAX_ACKS 200000
typedef struct handover_push {
    ps_var *v;
    ps_client *c;
    int stop; /* atomic */
    int rc;
    uint64_t acks; /* atomic */
    int64_t *at;   /* [HANDOVER_MAX_ACKS] ms since t0 of each ack */
    struct timespec t0;
} handover_push;

static void *handover_pusher(void *arg)
{
    handover_push *H = arg;
    float g[SMALL_N];
    for (int i = 0; i < SMALL_N; i++)
        g[i] = 1.0f;
    while (!__atomic_load_n(&H->stop, __ATOMIC_SEQ_CST)) {
        if (ps_push(H->c, H->v, g) != PS_OK) {
            fprintf(stderr, "handover pusher: %s\n", ps_last_error());
            H->rc = 1;
            break;
        }
        uint64_t n = __atomic_load_n(&H->acks, __ATOMIC_SEQ_CST);
        if (n < HANDOVER_MAX_ACKS)
            H->at[n] = ms_since(&H->t0);
        __atomic_store_n(&H->acks, n + 1, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static int handover_followed, handover_timed_out; /* atomic */

static void handover_log(int level, const char *message, const char *fields, void *arg)
{
    (void)level, (void)fields, (void)arg;
    if (strstr(message, "group 1: ps 1 says ps 2 is its primary") != NULL)
        __atomic_store_n(&handover_followed, 1, __ATOMIC_SEQ_CST);
    if (strstr(message, "group 1: no answer from ps 1") != NULL)
        __atomic_store_n(&handover_timed_out, 1, __ATOMIC_SEQ_CST);
}

static void test_clean_handover_reroutes_at_once(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    /* A variable of group 1 (placed on ps 1): one of a few names is. */
    ps_var *v = NULL;
    char name[32];
    for (int k = 0; k < 64 && v == NULL; k++) {
        ps_var_spec s;
        snprintf(name, sizeof(name), "handover/%d", k);
        ps_var_spec_init(&s, name);
        s.ndims = 1;
        s.dims[0] = SMALL_N;
        ps_var *x;
        assert_int_equal(ps_var_create(c, &s, &x), PS_OK);
        slot_map map = slots_static(SLOTS_DEFAULT, NSERVERS);
        if (ps_var_num_shards(x) == 1 && slots_name_owner(&map, name) == 1)
            v = x;
    }
    assert_non_null(v);
    ps_set_log_message_handler(PS_LOG_INFO, handover_log, NULL);
    handover_push H = {.v = v, .c = c, .at = calloc(HANDOVER_MAX_ACKS, sizeof(int64_t))};
    assert_non_null(H.at);
    clock_gettime(CLOCK_MONOTONIC, &H.t0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, handover_pusher, &H), 0);
    while (__atomic_load_n(&H.acks, __ATOMIC_SEQ_CST) < 20)
        usleep(5000);
    uint64_t e0 = test_server_epoch(tc.ports[0]);
    int64_t t_kill = ms_since(&H.t0);
    assert_int_equal(kill(tc.pids[1], SIGTERM), 0);
    int64_t t_view = -1;
    while (t_view < 0 || ms_since(&H.t0) - t_kill < 4000) {
        if (t_view < 0 && test_server_epoch(tc.ports[0]) > e0)
            t_view = ms_since(&H.t0) - t_kill;
        assert_true(ms_since(&H.t0) - t_kill < 60000);
        usleep(2000);
    }
    __atomic_store_n(&H.stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(th, NULL);
    /* The longest time without an acknowledgement from the SIGTERM on. */
    uint64_t n = H.acks < HANDOVER_MAX_ACKS ? H.acks : HANDOVER_MAX_ACKS;
    int64_t gap = 0, prev = t_kill;
    for (uint64_t i = 0; i < n; i++) {
        if (H.at[i] <= t_kill)
            continue;
        if (H.at[i] - prev > gap)
            gap = H.at[i] - prev;
        prev = H.at[i];
    }
    free(H.at);
    ps_set_log_message_handler(PS_LOG_INFO, NULL, NULL);
    fprintf(stderr,
            "SIGTERM of ps 1 (primary of group 1): new view after %lld ms; the longest time "
            "without an acknowledged push from the SIGTERM on: %lld ms (%llu pushes)\n",
            (long long)t_view, (long long)gap, (unsigned long long)n);
    assert_int_equal(H.rc, 0);
    /* Sent on by the old primary's answer, which names the new one, not by a probe interval
     * of silence from a server that closed its sockets. */
    assert_true(__atomic_load_n(&handover_followed, __ATOMIC_SEQ_CST));
    assert_false(__atomic_load_n(&handover_timed_out, __ATOMIC_SEQ_CST));
    ps_client_close(c);
    int st;
    assert_int_equal(waitpid(tc.pids[1], &st, 0), tc.pids[1]);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* Back, and in the view again (its groups copied), for what follows. */
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    while (test_server_epoch(tc.ports[0]) < e0 + 2) {
        assert_true(ms_since(&t1) < 60000);
        usleep(50 * 1000);
    }
}

/* A rejoin copy does not stop its group's updates: with test-failpoint copy-slow each copy
 * image a primary serves starts 5 s late (as for a very large group). ps 1 is killed; this
 * test then asks ps 0, as ps 1 would, for a copy of group 0, while a client process pushes to
 * every group: pushes (ten) are acknowledged before the copy's first chunk arrives (before, the
 * primary held the group's order lock while it wrote the image, so no push to the group was
 * acknowledged until the image was made). Then ps 1 is restarted and rejoins by (slow) copies
 * while the pushes go on; afterwards every group's copies agree. */
#define COPY_N (256 * 1024) /* 1 MiB: split over the 3 servers */

typedef struct copy_ask {
    int status;
    uint64_t total, lsn, len;
    volatile bool done;
} copy_ask;

static void *copy_ask_main(void *arg)
{
    copy_ask *a = arg;
    char tok[80];
    cluster_token(tok, sizeof(tok));
    Psd__V1__ReplicateRequest rq = PSD__V1__REPLICATE_REQUEST__INIT;
    rq.group = 0;
    rq.epoch = test_server_epoch(tc.ports[0]);
    rq.copy = true;
    rq.copy_offset = 0;
    rq.from = 1 + 1; /* ps 1, a member of group 0 */
    uint8_t body[64];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__REPLICATE;
    env.body.data = body;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    env.auth_token.data = (uint8_t *)tok;
    env.auth_token.len = strlen(tok);
    frame f;
    nng_msg *m;
    a->status = test_raw_call(tc.ports[0], &env, NULL, 0, &f, &m);
    if (a->status == 0) {
        Psd__V1__ReplicateReply *r =
            psd__v1__replicate_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        if (r) {
            a->total = r->copy_total;
            a->lsn = r->copy_lsn;
            a->len = r->copy_len;
            psd__v1__replicate_reply__free_unpacked(r, NULL);
        }
        frame_fini(&f);
        nng_msg_free(m);
    }
    a->done = true;
    return NULL;
}

/* The pusher thread: pushes to copy/big (every group) until stop, counting acknowledged
 * pushes; its result in rc. */
typedef struct copy_push {
    uint64_t acks; /* atomic */
    int stop;      /* atomic */
    int rc;
} copy_push;

static void *copy_pusher(void *arg)
{
    copy_push *P = arg;
    ps_client *c = open_client();
    ps_var *v;
    if (c == NULL || ps_var_lookup(c, "copy/big", &v) != PS_OK) {
        P->rc = 10;
        return NULL;
    }
    float *g = malloc(COPY_N * sizeof(float));
    for (size_t i = 0; i < COPY_N; i++)
        g[i] = (float)(i % 5);
    while (!__atomic_load_n(&P->stop, __ATOMIC_SEQ_CST)) {
        if (ps_push(c, v, g) != PS_OK) {
            fprintf(stderr, "pusher: %s\n", ps_last_error());
            P->rc = 12;
            break;
        }
        __atomic_add_fetch(&P->acks, 1, __ATOMIC_SEQ_CST);
    }
    free(g);
    ps_client_close(c);
    return NULL;
}

static void wait_epoch(uint64_t at_least)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (test_server_epoch(tc.ports[0]) < at_least) {
        assert_true(ms_since(&t0) < 60000);
        usleep(50 * 1000);
    }
}

static void test_copy_does_not_stop_updates(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    ps_var_spec s;
    ps_var_spec_init(&s, "copy/big");
    s.ndims = 1;
    s.dims[0] = COPY_N;
    s.learning_rate = 0.5;
    ps_var *v;
    assert_int_equal(ps_var_create(c, &s, &v), PS_OK);
    ps_client_close(c);
    copy_push P = {0};
    uint64_t e0 = test_server_epoch(tc.ports[0]);
    assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(tc.pids[1], &st, 0), tc.pids[1]);
    wait_epoch(e0 + 1); /* ps 1 out of the view */
    pthread_t pusher;
    assert_int_equal(pthread_create(&pusher, NULL, copy_pusher, &P), 0);
    while (__atomic_load_n(&P.acks, __ATOMIC_SEQ_CST) < 3) /* the pushes go through */
        usleep(10 * 1000);
    copy_ask a = {0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, copy_ask_main, &a), 0);
    usleep(200 * 1000); /* the request reached ps 0 */
    uint64_t a0 = __atomic_load_n(&P.acks, __ATOMIC_SEQ_CST);
    bool moved = false;
    while (!a.done && !moved) {
        moved = __atomic_load_n(&P.acks, __ATOMIC_SEQ_CST) >= a0 + 10;
        usleep(10 * 1000);
    }
    uint64_t during = __atomic_load_n(&P.acks, __ATOMIC_SEQ_CST) - a0;
    pthread_join(th, NULL);
    fprintf(stderr,
            "copy of group 0: status %d, %llu bytes at lsn %llu (first chunk %llu); "
            "%llu pushes acknowledged before its first chunk came\n",
            a.status, (unsigned long long)a.total, (unsigned long long)a.lsn,
            (unsigned long long)a.len, (unsigned long long)during);
    assert_int_equal(a.status, 0);
    assert_true(a.total > (uint64_t)COPY_N / 3 * 4);
    assert_true(moved);
    /* ps 1 rejoins by copies while the pushes go on; then its copies agree. */
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
    wait_epoch(e0 + 2); /* ps 1 back in the view */
    __atomic_store_n(&P.stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(pusher, NULL);
    assert_int_equal(P.rc, 0);
    fprintf(stderr, "%llu pushes acknowledged in all\n",
            (unsigned long long)__atomic_load_n(&P.acks, __ATOMIC_SEQ_CST));
    assert_copies_agree();
}

/* Budget evictions (max-server-bytes) are the same on every copy of a group, also on one a
 * rejoin made compact. Table rep/expiring (ttl 1 s) fills the groups, then its rows expire: the
 * primary and the backup keep their slabs for reuse. ps 1 is killed and restarted: its copies
 * of groups 0 and 1 come restored, without those empty slabs. Then table rep/kept (no ttl) is
 * pushed past each copy's share of the budget; every copy of a group must evict the same rows.
 * (Counted in slabs, the primary had reached the limit with far fewer rows than the rejoined
 * copy, and the copies differed.) */
#define BUDGET_IDS_A 90000  /* rep/expiring: 30,000 rows a group */
#define BUDGET_IDS_C 180000 /* rep/kept: 60,000 rows a group, past a copy's share */

/* assert_copies_agree, asked again while a TTL sweep (logged once a second) falls between the
 * two checksums of a group. */
static void assert_copies_agree_settled(void)
{
    for (uint32_t grp = 0; grp < NSERVERS; grp++) {
        uint64_t s0 = 0, s1 = 1, l0 = 0, l1 = 1;
        for (int tries = 0; tries < 50 && l0 != l1; tries++) {
            assert_int_equal(group_checksum((int)grp, grp, 0, &s0, NULL, &l0), 0);
            assert_int_equal(group_checksum((int)((grp + 1) % NSERVERS), grp, 0, &s1, NULL, &l1),
                             0);
            if (l0 != l1)
                usleep(20 * 1000);
        }
        fprintf(stderr, "group %u: %016llx at lsn %llu on ps %u, %016llx at lsn %llu on ps %u\n",
                grp, (unsigned long long)s0, (unsigned long long)l0, grp, (unsigned long long)s1,
                (unsigned long long)l1, (grp + 1) % NSERVERS);
        assert_int_equal(l0, l1);
        assert_true(s0 == s1);
    }
}

static void test_budget_evictions_alike(void **state)
{
    (void)state;
    ps_client *c = open_client();
    assert_non_null(c);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "rep/expiring", 16, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    sp.ttl_ms = 1000;
    ps_table *ta, *tc_;
    assert_int_equal(ps_table_create(c, &sp, &ta), PS_OK);
    ps_table_spec_init(&sp, "rep/kept", 16, PS_OPT_SGD);
    sp.learning_rate = 1.0;
    assert_int_equal(ps_table_create(c, &sp, &tc_), PS_OK);
    test_table_push_range(ta, 16, 0, BUDGET_IDS_A, 0.5f);
    /* Every row of rep/expiring expires and is swept (a sweep a second). */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ps_table_info info = {.struct_size = sizeof(info)};
    do {
        usleep(200 * 1000);
        assert_int_equal(ps_table_info_get(c, "rep/expiring", &info), PS_OK);
        assert_true(ms_since(&t0) < 60000);
    } while (info.rows > 0);
    fprintf(stderr, "rep/expiring: %llu rows expired; %llu bytes still held\n",
            (unsigned long long)info.evicted_ttl, (unsigned long long)info.bytes);
    /* ps 1 restarts and copies groups 0 and 1 back. */
    uint64_t e0 = test_server_epoch(tc.ports[0]);
    assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(tc.pids[1], &st, 0), tc.pids[1]);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
    wait_epoch(e0 + 2);
    /* Past the budget, twice (the second pass updates what the first kept). */
    test_table_push_range(tc_, 16, 1000000, BUDGET_IDS_C, 0.5f);
    test_table_push_range(tc_, 16, 1000000 + BUDGET_IDS_C / 2, BUDGET_IDS_C / 2, 0.5f);
    assert_int_equal(ps_table_info_get(c, "rep/kept", &info), PS_OK);
    fprintf(stderr, "rep/kept: %llu rows, %llu evicted under the budget\n",
            (unsigned long long)info.rows, (unsigned long long)info.evicted_memory);
    assert_true(info.evicted_memory > 0);
    ps_table_free(ta);
    ps_table_free(tc_);
    ps_client_close(c);
    assert_copies_agree_settled();
}

static int setup_budget(void **state)
{
    (void)state;
    static const char *const more[] = {"--max-server-bytes", "12000000", NULL};
    return test_replicated_start(&tc, &etcd, &flags, server_bin, NSERVERS, 0, "2", "1000", more);
}

static int setup_copy_slow(void **state)
{
    (void)state;
    static const char *const more[] = {"--test-failpoint", "copy-slow", NULL};
    return test_replicated_start(&tc, &etcd, &flags, server_bin, NSERVERS, 0, "2", "1000", more);
}

/* A rejoin copy asked of a primary that stops (SIGTERM) mid-copy ends at once, and the
 * rejoiner asks the group's new primary as soon as its view names it (before, it waited out
 * the copy's 60 s deadline on a server that had closed its sockets). Replicas 3, copy-slow,
 * messages of 1 MiB (a group's copy takes two chunks): ps 1 is killed and restarted; while its
 * copy of group 0 is being made on ps 0 (copy-slow holds the image 5 s), ps 0 gets SIGTERM;
 * ps 1 copies group 0 from ps 2, its new primary, and is in sync in every group long before
 * the old deadline; ps 1's and ps 2's copies agree. */
static view read_view(void)
{
    view_record r;
    memset(&r, 0, sizeof(r));
    char prefix[64], err[512];
    test_view_prefix(&tc, prefix, sizeof(prefix));
    etcd_client *e = NULL;
    if (etcd_client_create(&e, etcd.endpoint, 2000, err, sizeof(err)) != 0 ||
        view_etcd_read(e, prefix, &r, NULL, err, sizeof(err)) != 0)
        memset(&r, 0, sizeof(r));
    etcd_client_destroy(e);
    return r.v;
}

/* Whether server s is registered with a lease. */
static bool registered(uint32_t s)
{
    char prefix[64], err[512];
    test_view_prefix(&tc, prefix, sizeof(prefix));
    etcd_client *e = NULL;
    int64_t leases[VIEW_MAX_SERVERS] = {0};
    bool ok = etcd_client_create(&e, etcd.endpoint, 2000, err, sizeof(err)) == 0 &&
              view_etcd_servers(e, prefix, NSERVERS, leases, NULL, err, sizeof(err)) == 0;
    etcd_client_destroy(e);
    return ok && leases[s] != 0;
}

/* Whether a rejoin copy of group g is being fetched into a directory under /tmp that was not
 * among the `n` names of `before` (the rejoining server writes it there as it arrives). */
static bool rejoin_file_new(char (*before)[256], size_t n, uint32_t g)
{
    DIR *d = opendir("/tmp");
    if (d == NULL)
        return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "psd-rejoin-", 11) != 0)
            continue;
        bool old = false;
        for (size_t i = 0; i < n && !old; i++)
            old = strcmp(before[i], e->d_name) == 0;
        char path[300];
        snprintf(path, sizeof(path), "/tmp/%s/ckpt-%u-1.psc", e->d_name, g);
        found = !old && access(path, F_OK) == 0;
    }
    closedir(d);
    return found;
}

/* The names of /tmp/psd-rejoin-* now, at most cap of them. */
static size_t rejoin_dirs(char (*out)[256], size_t cap)
{
    DIR *d = opendir("/tmp");
    size_t n = 0;
    struct dirent *e;
    while (d && n < cap && (e = readdir(d)) != NULL)
        if (strncmp(e->d_name, "psd-rejoin-", 11) == 0)
            snprintf(out[n++], 256, "%s", e->d_name);
    if (d)
        closedir(d);
    return n;
}

static void test_copy_from_stopping_primary(void **state)
{
    (void)state;
    static const char *const settings[] = {"split-threshold-bytes", "64K", "chunk-bytes", "64K",
                                           NULL};
    ps_client *c = test_replicated_client(&tc, -1, "3", settings);
    assert_non_null(c);
    ps_var_spec s;
    ps_var_spec_init(&s, "stopcopy/big");
    s.ndims = 1;
    s.dims[0] = COPY_N;
    s.learning_rate = 0.5;
    ps_var *v;
    assert_int_equal(ps_var_create(c, &s, &v), PS_OK);
    float *g = malloc(COPY_N * sizeof(float));
    assert_non_null(g);
    for (size_t i = 0; i < COPY_N; i++)
        g[i] = (float)(i % 3);
    for (int r = 0; r < 5; r++)
        assert_int_equal(ps_push(c, v, g), PS_OK);
    free(g);
    ps_client_close(c);
    uint64_t e0 = test_server_epoch(tc.ports[2]);
    assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
    int st;
    assert_int_equal(waitpid(tc.pids[1], &st, 0), tc.pids[1]);
    wait_epoch(e0 + 1); /* ps 1 out of the view */
    static char before[256][256];
    size_t nbefore = rejoin_dirs(before, 256);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 1, flags.v), 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!registered(1)) {
        assert_true(ms_since(&t0) < 30000);
        usleep(50 * 1000);
    }
    /* It reads the view and asks its primaries for copies, each 5 s in the making: ps 0 is
     * stopped once ps 1 fetches group 0's (or after 20 s without seeing that). */
    while (!rejoin_file_new(before, nbefore, 0) && ms_since(&t0) < 20000)
        usleep(20 * 1000);
    fprintf(stderr, "ps 1 fetches group 0's copy %lld ms after its restart\n",
            (long long)ms_since(&t0));
    usleep(500 * 1000);
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_int_equal(kill(tc.pids[0], SIGTERM), 0);
    view w;
    for (;;) {
        w = read_view();
        bool synced = w.epoch > 0 && w.live[1];
        for (uint32_t grp = 0; grp < NSERVERS && synced; grp++)
            synced = view_in_sync(&w, grp, 1);
        if (synced)
            break;
        /* Generous on a loaded machine; the old wait alone was 60 s. */
        assert_true(ms_since(&t1) < 45000);
        usleep(100 * 1000);
    }
    fprintf(stderr,
            "ps 1 in sync in every group %lld ms after ps 0 was told to stop (view epoch %llu)\n",
            (long long)ms_since(&t1), (unsigned long long)w.epoch);
    assert_int_equal(waitpid(tc.pids[0], &st, 0), tc.pids[0]);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (uint32_t grp = 0; grp < NSERVERS; grp++) {
        uint64_t s1 = 0, s2 = 1, l1 = 0, l2 = 1;
        for (int tries = 0; tries < 50 && l1 != l2; tries++) {
            assert_int_equal(group_checksum(1, grp, 0, &s1, NULL, &l1), 0);
            assert_int_equal(group_checksum(2, grp, 0, &s2, NULL, &l2), 0);
            if (l1 != l2)
                usleep(50 * 1000);
        }
        fprintf(stderr, "group %u: %016llx at lsn %llu on ps 1, %016llx at lsn %llu on ps 2\n", grp,
                (unsigned long long)s1, (unsigned long long)l1, (unsigned long long)s2,
                (unsigned long long)l2);
        assert_int_equal(l1, l2);
        assert_true(s1 == s2);
    }
    /* A stop that hits a rejoin in progress: ps 0 restarts and fetches its copies from ps 2;
     * ps 2, then ps 0 are told to stop. ps 0 stops without waiting for the copies (before, its
     * stop waited out their 60 s deadline on ps 2, which had closed its sockets). */
    nbefore = rejoin_dirs(before, 256);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 0, flags.v), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (!rejoin_file_new(before, nbefore, 0) && ms_since(&t0) < 20000)
        usleep(20 * 1000);
    usleep(500 * 1000);
    struct timespec t2;
    clock_gettime(CLOCK_MONOTONIC, &t2);
    assert_int_equal(kill(tc.pids[2], SIGTERM), 0);
    usleep(200 * 1000);
    assert_int_equal(kill(tc.pids[0], SIGTERM), 0);
    assert_int_equal(waitpid(tc.pids[0], &st, 0), tc.pids[0]);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int64_t stop_ms = ms_since(&t2);
    assert_int_equal(waitpid(tc.pids[2], &st, 0), tc.pids[2]);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    fprintf(stderr, "ps 0, rejoining from ps 2, stopped %lld ms after ps 2 was told to\n",
            (long long)stop_ms);
    assert_true(stop_ms < 40000); /* generous on a loaded machine; the old wait was 60 s */
    /* Back for the teardown. */
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 2, flags.v), 0);
    assert_int_equal(test_cluster_respawn(&tc, server_bin, 0, flags.v), 0);
}

static int setup_copy_slow_r3(void **state)
{
    (void)state;
    static const char *const more[] = {"--test-failpoint", "copy-slow", "--max-message-bytes",
                                       "1048576", NULL};
    return test_replicated_start(&tc, &etcd, &flags, server_bin, NSERVERS, 0, "3", "1000", more);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    if (etcd_proc_binary() == NULL) {
        fprintf(stderr, "SKIP: no etcd binary (/usr/bin/etcd, $PSD_ETCD or etcd on PATH): "
                        "replicated clusters need one as their coordinator\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact_sums_and_identical_replicas),
        cmocka_unit_test(test_not_primary_names_primary),
        cmocka_unit_test(test_ttl_table_copies_identical),
        cmocka_unit_test(test_table_pull_not_logged),
        cmocka_unit_test(test_replicate_bad_input),
        cmocka_unit_test(test_admission_alike_after_rejoin),
        cmocka_unit_test(test_clean_handover_reroutes_at_once),
    };
    const struct CMUnitTest slow_copies[] = {
        cmocka_unit_test(test_copy_does_not_stop_updates),
    };
    const struct CMUnitTest budget[] = {
        cmocka_unit_test(test_budget_evictions_alike),
    };
    const struct CMUnitTest slow_copies_r3[] = {
        cmocka_unit_test(test_copy_from_stopping_primary),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    failed += cmocka_run_group_tests(budget, setup_budget, teardown);
    failed += cmocka_run_group_tests(slow_copies, setup_copy_slow, teardown);
    return failed + cmocka_run_group_tests(slow_copies_r3, setup_copy_slow_r3, teardown);
}
