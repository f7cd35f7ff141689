/* Integration: staleness bounds (SSP, staleness >= 1, and BSP, staleness 0) in a replicated
 * cluster across a failover, on real processes and a real etcd (the test starts one; skipped,
 * exit 77, without an etcd binary).
 *
 * 3 ps-servers with replicas 2 and 2 workers. Each worker process runs training steps
 * (ps_step: push an integer gradient, advance its clock, pull at the new clock) on a variable
 * split over every group: worker 0 as fast as it can, worker 1 slowly, so that worker 0's steps
 * wait for worker 1 on every primary. Server 1, primary of group 1, is killed with SIGKILL
 * mid-run. The clock table and the BSP aggregates are replicated with the steps, so the new
 * primary keeps bounding staleness: under SSP every pull of a worker at clock c must already
 * hold the other worker's pushes of its first c - 1 steps, under BSP exactly both workers'
 * first c pushes (checked on every element of every step, before and after the kill). Both
 * workers finish without error or lost update, and the final values are minus the exact sum of
 * every push. A worker evicted for silence is evicted through the group's log: every replica
 * applies the BSP aggregates it held back at the same point (replicas' checksums equal). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "ps_proc.h"
#include "psclient.h"
#include "replicated_cluster.h"
#include "status.h"

#define NSERVERS 3
#define NWORKERS 2
#define STEPS 300
#define SLOW_MS 15
#define VAR_N (3 * 1024) /* split: 1024 elements on each server */
/* The eviction test: worker 1 stops after BSP_QUIT_AT steps, worker 0 runs BSP_LONG. */
#define BSP_QUIT_AT 20
#define BSP_LONG (STEPS + 40)
#define TABLE_IDS 96
#define TABLE_DIM 4

static const char *server_bin, *self_bin;
static test_cluster tc;
static etcd_proc etcd;
static test_repl_flags flags;
static const char *more[] = {"--bsp-aggregation", "sum", "--worker-timeout-ms", "10000", NULL};

static int setup(void **state)
{
    (void)state;
    return test_replicated_start(&tc, &etcd, &flags, server_bin, NSERVERS, NWORKERS, "2", "1000",
                                 more);
}

static int teardown(void **state)
{
    (void)state;
    return test_replicated_stop(&tc, &etcd); /* every server exits cleanly (0) */
}

/* worker < 0: a client that is no worker. */
static ps_client *open_client(int worker)
{
    static const char *const settings[] = {"split-threshold-bytes", "4K", "heartbeat-ms", "100",
                                           NULL};
    return test_replicated_client(&tc, worker, "2", settings);
}

/* The eviction test's servers evict a worker silent for 1.5 s. */
static int setup_short_timeout(void **state)
{
    more[3] = "1500";
    int rc = setup(state);
    more[3] = "10000";
    return rc;
}

static int make_var(ps_client *c, int staleness, ps_var **v)
{
    ps_var_spec s;
    ps_var_spec_init(&s, staleness == 0 ? "ssp/bsp" : "ssp/v");
    s.ndims = 1;
    s.dims[0] = VAR_N;
    s.learning_rate = 1.0;
    s.staleness = staleness;
    *v = NULL;
    return ps_var_create(c, &s, v);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* A worker process: `steps` steps pushing (id + 1) to every element of a variable with the
 * staleness given (1 or 0); exits 0 when every step succeeded, every pull held the other
 * worker's pushes the bound promises, and no update was lost. quit: after its steps it exits
 * at once, as if it died (no finish, no close: its heartbeats stop). */
static int worker_main(int id, int staleness, int steps, bool quit)
{
    ps_client *c = open_client(id);
    if (c == NULL)
        return 10;
    ps_var *v;
    if (make_var(c, staleness, &v) != PS_OK) {
        fprintf(stderr, "worker %d: create: %s\n", id, ps_last_error());
        return 11;
    }
    float *g = malloc(VAR_N * sizeof(float)), *w = malloc(VAR_N * sizeof(float));
    for (size_t i = 0; i < VAR_N; i++)
        g[i] = (float)(id + 1);
    int rc = 0;
    int other = 1 - id;
    long waited = 0;
    for (int step = 1; step <= steps && rc == 0; step++) {
        ps_step_item it = {.var = v, .offset = 0, .count = VAR_N, .grad = g, .dst = w};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (ps_step(c, &it, 1, PS_STEP_CLOCK) != PS_OK) {
            fprintf(stderr, "worker %d step %d: %s\n", id, step, ps_last_error());
            rc = 12;
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 >= SLOW_MS / 2)
            waited++;
        /* At clock `step`, bound 1: the other worker reached clock step - 1, so its first
         * step - 1 pushes are in, with this worker's own `step`. BSP: the aggregates of both
         * workers' first `step` clocks, exactly (summed, bsp-aggregation sum); after the
         * other worker's eviction (it stopped after BSP_QUIT_AT steps), only this one's. */
        float least = (float)step * (float)(id + 1) + (float)(step - 1) * (float)(other + 1);
        float most = (float)step * (float)(id + 1) + (float)STEPS * (float)(other + 1);
        if (staleness == 0) {
            int theirs = step;
            if (steps > STEPS && step > BSP_QUIT_AT)
                theirs = BSP_QUIT_AT;
            least = most = (float)step * (float)(id + 1) + (float)theirs * (float)(other + 1);
        }
        size_t bad = 0;
        for (size_t i = 0; i < VAR_N; i++) {
            if (-w[i] < least || -w[i] > most) {
                if (bad++ < 3)
                    fprintf(stderr,
                            "worker %d step %d: v[%zu] = %.0f, the bound needs -v in "
                            "[%.0f, %.0f]\n",
                            id, step, i, w[i], least, most);
            }
        }
        if (bad)
            rc = 13;
        if (id == 1)
            sleep_ms(SLOW_MS);
    }
    if (quit) {
        fprintf(stderr, "worker %d: %d steps, exits without a word (exit %d)\n", id, steps, rc);
        _exit(rc);
    }
    if (rc == 0 && ps_worker_finished(c) != PS_OK) {
        fprintf(stderr, "worker %d finished: %s\n", id, ps_last_error());
        rc = 14;
    }
    uint64_t lost = ps_client_lost_updates(c);
    if (lost) {
        fprintf(stderr, "worker %d reports %llu lost updates\n", id, (unsigned long long)lost);
        rc = 15;
    }
    fprintf(stderr, "worker %d: %d steps, %ld of them slow (waited), exit %d\n", id, steps, waited,
            rc);
    free(g);
    free(w);
    ps_client_close(c);
    return rc;
}

/* A table worker process: `steps` steps of pushing (id + 1) to every row of TABLE_IDS ids (rows
 * spread over every group), a clock, and a pull of them all, on a table with the staleness
 * given; the pulls checked as in worker_main. */
static int table_worker_main(int id, int staleness, int steps)
{
    ps_client *c = open_client(id);
    if (c == NULL)
        return 10;
    ps_table_spec s;
    ps_table_spec_init(&s, staleness ? "sync/t-ssp" : "sync/t-bsp", TABLE_DIM, PS_OPT_SGD);
    s.learning_rate = 1.0;
    s.staleness = staleness;
    ps_table *t;
    if (ps_table_create(c, &s, &t) != PS_OK) {
        fprintf(stderr, "table worker %d: create: %s\n", id, ps_last_error());
        return 11;
    }
    int64_t ids[TABLE_IDS];
    float *g = malloc(TABLE_IDS * TABLE_DIM * sizeof(float));
    float *r = malloc(TABLE_IDS * TABLE_DIM * sizeof(float));
    for (int i = 0; i < TABLE_IDS; i++)
        ids[i] = (int64_t)i * 7919 - 100000; /* negative ids too */
    for (size_t i = 0; i < TABLE_IDS * TABLE_DIM; i++)
        g[i] = (float)(id + 1);
    int rc = 0, other = 1 - id;
    for (int step = 1; step <= steps && rc == 0; step++) {
        if (ps_table_push(t, ids, TABLE_IDS, g) != PS_OK || ps_clock(c, NULL) != PS_OK ||
            ps_table_pull(t, ids, TABLE_IDS, r) != PS_OK) {
            fprintf(stderr, "table worker %d step %d: %s\n", id, step, ps_last_error());
            rc = 12;
            break;
        }
        float least =
            (float)step * (float)(id + 1) + (float)(step - staleness) * (float)(other + 1);
        float most = (float)step * (float)(id + 1) + (float)steps * (float)(other + 1);
        if (staleness == 0)
            most = least;
        size_t bad = 0;
        for (size_t i = 0; i < TABLE_IDS * TABLE_DIM; i++) {
            if (-r[i] < least || -r[i] > most) {
                if (bad++ < 3)
                    fprintf(stderr,
                            "table worker %d step %d: row %zu = %.0f, the bound needs -row in "
                            "[%.0f, %.0f]\n",
                            id, step, i / TABLE_DIM, r[i], least, most);
            }
        }
        if (bad)
            rc = 13;
        if (id == 1)
            sleep_ms(SLOW_MS);
    }
    if (rc == 0 && ps_worker_finished(c) != PS_OK)
        rc = 14;
    if (ps_client_lost_updates(c))
        rc = 15;
    fprintf(stderr, "table worker %d: %d steps, exit %d\n", id, steps, rc);
    free(g);
    free(r);
    ps_table_free(t);
    ps_client_close(c);
    return rc;
}

/* The checksum and applied lsn of server `server`'s copy of group `group`. */
static int group_checksum(int server, uint32_t group, uint64_t *sum, uint64_t *lsn)
{
    return test_group_checksum(tc.ports[server], group, 0, sum, NULL, lsn);
}

/* A Clock request with evict set, from the network, to server `server` for group g: refused. */
static void evict_refused(int server, uint32_t group)
{
    Psd__V1__ClockRequest rq = PSD__V1__CLOCK_REQUEST__INIT;
    rq.evict = true;
    uint8_t body[16];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__CLOCK;
    env.worker_id = 1;
    env.group = group + 1;
    env.body.data = body;
    env.body.len = psd__v1__clock_request__pack(&rq, body);
    frame f;
    nng_msg *m;
    int st;
    for (int tries = 0;; tries++) { /* UNAVAILABLE until the first view is installed */
        st = test_raw_call(tc.ports[server], &env, NULL, 0, &f, &m);
        assert_true(st > -1000);
        if (st != STATUS_UNAVAILABLE || tries == 300)
            break;
        frame_fini(&f);
        nng_msg_free(m);
        sleep_ms(100);
    }
    fprintf(stderr, "evict from a client: %s: %s\n", status_name(st),
            f.env->message ? f.env->message : "");
    assert_int_equal(st, STATUS_PERMISSION_DENIED);
    assert_non_null(strstr(f.env->message, "evict is internal to replication"));
    frame_fini(&f);
    nng_msg_free(m);
}

/* Starts both worker processes in `role`, SIGKILLs ps 1 (primary of group 1) 1.5 s later and
 * waits for both workers to exit 0. */
static void run_workers_killing_ps1(const char *role)
{
    pid_t kids[NWORKERS];
    for (int k = 0; k < NWORKERS; k++) {
        kids[k] = test_spawn_child(self_bin, server_bin, role, k, STEPS, tc.spec);
        assert_true(kids[k] > 0);
    }
    sleep_ms(1500);
    assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
    int kst;
    assert_int_equal(waitpid(tc.pids[1], &kst, 0), tc.pids[1]);
    tc.pids[1] = 0; /* not stopped again by the teardown */
    fprintf(stderr, "killed ps 1 (primary of group 1) while 2 workers run as %s\n", role);
    for (int k = 0; k < NWORKERS; k++) {
        int st;
        assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

/* Both worker processes in `role` (worker: SSP, bsp: BSP) step while ps 1 is killed; every
 * pull checked against the bound, the final values are the exact sums. */
static void steps_across_failover(const char *role, int staleness)
{
    ps_client *c = open_client(-1);
    assert_non_null(c);
    run_workers_killing_ps1(role);
    /* Every step applied once: v = -STEPS * (1 + 2) everywhere. */
    ps_var *v;
    assert_int_equal(make_var(c, staleness, &v), PS_OK);
    float *w = malloc(VAR_N * sizeof(float));
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    size_t wrong = 0;
    float want = -(float)STEPS * 3.0f;
    for (size_t i = 0; i < VAR_N; i++)
        if (w[i] != want && wrong++ < 5)
            fprintf(stderr, "v[%zu] = %.1f, expected %.1f\n", i, w[i], want);
    free(w);
    assert_int_equal(wrong, 0);
    /* Group 2 (servers 2 and 0) never lost a member: identical copies. */
    uint64_t s0, s1, l0, l1;
    assert_int_equal(group_checksum(2, 2, &s0, &l0), 0);
    assert_int_equal(group_checksum(0, 2, &s1, &l1), 0);
    assert_true(s0 == s1 && l0 == l1);
    assert_int_equal(ps_client_lost_updates(c), 0);
    ps_client_close(c);
}

static void test_ssp_bounds_hold_across_failover(void **state)
{
    (void)state;
    steps_across_failover("worker", 1);
}

static void test_bsp_exact_across_failover(void **state)
{
    (void)state;
    evict_refused(0, 0);
    steps_across_failover("bsp", 0);
}

/* Two table worker processes in `role` (table-bsp, table-ssp) step while ps 1 is killed (each
 * in a fresh cluster: workers that finished leave the barrier, so new ones would not start
 * together): every pull checked against the bound, BSP exactly; the final rows are the exact
 * sums, and group 2, which kept both members, has identical copies of them. */
static void table_steps_across_failover(const char *role)
{
    run_workers_killing_ps1(role);
    /* Every push applied once: -STEPS * (1 + 2) in every row. */
    ps_client *c = open_client(-1);
    assert_non_null(c);
    int64_t ids[TABLE_IDS];
    for (int i = 0; i < TABLE_IDS; i++)
        ids[i] = (int64_t)i * 7919 - 100000;
    float *r = malloc(TABLE_IDS * TABLE_DIM * sizeof(float));
    ps_table *t;
    assert_int_equal(
        ps_table_lookup(c, strcmp(role, "table-ssp") == 0 ? "sync/t-ssp" : "sync/t-bsp", &t),
        PS_OK);
    assert_int_equal(ps_table_pull(t, ids, TABLE_IDS, r), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < TABLE_IDS * TABLE_DIM; i++)
        if (r[i] != -(float)STEPS * 3.0f && wrong++ < 5)
            fprintf(stderr, "%s row %zu = %.1f\n", role, i / TABLE_DIM, r[i]);
    free(r);
    ps_table_free(t);
    assert_int_equal(wrong, 0);
    uint64_t s0, s1, l0, l1;
    assert_int_equal(group_checksum(2, 2, &s0, &l0), 0);
    assert_int_equal(group_checksum(0, 2, &s1, &l1), 0);
    fprintf(stderr, "group 2: checksums %016llx %016llx at lsn %llu %llu\n", (unsigned long long)s0,
            (unsigned long long)s1, (unsigned long long)l0, (unsigned long long)l1);
    assert_true(s0 == s1 && l0 == l1);
    ps_client_close(c);
}

static void test_table_bsp_across_failover(void **state)
{
    (void)state;
    table_steps_across_failover("table-bsp");
}

static void test_table_ssp_across_failover(void **state)
{
    (void)state;
    table_steps_across_failover("table-ssp");
}

/* Worker 1 stops answering after BSP_QUIT_AT steps (its process exits with no finish); every
 * primary evicts it after worker-timeout-ms (1.5 s here) through the group's log, applying
 * worker 0's partial aggregate; worker 0 goes on alone. Every pull of worker 0 is checked
 * exactly (worker_main), and each group's two copies come out identical: the backups evicted
 * worker 1 and applied the same aggregates at the same point of the log. */
static void test_bsp_eviction_replicated(void **state)
{
    (void)state;
    pid_t quitter = test_spawn_child(self_bin, server_bin, "bsp-quit", 1, BSP_QUIT_AT, tc.spec);
    pid_t stayer = test_spawn_child(self_bin, server_bin, "bsp", 0, BSP_LONG, tc.spec);
    assert_true(quitter > 0 && stayer > 0);
    int st;
    assert_int_equal(waitpid(quitter, &st, 0), quitter);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(waitpid(stayer, &st, 0), stayer);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    ps_client *c = open_client(-1);
    assert_non_null(c);
    ps_var *v;
    assert_int_equal(make_var(c, 0, &v), PS_OK);
    float *w = malloc(VAR_N * sizeof(float));
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    float want = -((float)BSP_LONG * 1.0f + (float)BSP_QUIT_AT * 2.0f);
    size_t wrong = 0;
    for (size_t i = 0; i < VAR_N; i++)
        if (w[i] != want && wrong++ < 5)
            fprintf(stderr, "v[%zu] = %.1f, expected %.1f\n", i, w[i], want);
    free(w);
    assert_int_equal(wrong, 0);
    for (uint32_t g = 0; g < NSERVERS; g++) {
        uint64_t s0, s1, l0, l1;
        assert_int_equal(group_checksum((int)g, g, &s0, &l0), 0);
        assert_int_equal(group_checksum((int)(g + 1) % NSERVERS, g, &s1, &l1), 0);
        fprintf(stderr, "group %u: checksums %016llx %016llx at lsn %llu %llu\n", g,
                (unsigned long long)s0, (unsigned long long)s1, (unsigned long long)l0,
                (unsigned long long)l1);
        assert_true(s0 == s1 && l0 == l1);
    }
    ps_client_close(c);
}

/* The worker whose pull waits for the other in test_ssp_wait_outlasts_probe: its clock 1 comes
 * LATE_MS after the start. */
#define LATE_MS 4500

typedef struct late_worker {
    ps_client *c;
    int rc;
} late_worker;

static void *late_worker_run(void *arg)
{
    late_worker *lw = arg;
    sleep_ms(LATE_MS);
    ps_var *v;
    float *g = calloc(VAR_N, sizeof(float)), *w = malloc(VAR_N * sizeof(float));
    lw->rc = -1;
    if (g && w && ps_var_lookup(lw->c, "ssp/v", &v) == PS_OK) {
        for (size_t i = 0; i < VAR_N; i++)
            g[i] = 2.0f;
        ps_step_item it = {.var = v, .offset = 0, .count = VAR_N, .grad = g, .dst = w};
        lw->rc = ps_step(lw->c, &it, 1, PS_STEP_CLOCK);
        if (lw->rc != PS_OK)
            fprintf(stderr, "worker 1 step 1: %s\n", ps_last_error());
    }
    free(g);
    free(w);
    return NULL;
}

/* A replicated client gives each attempt at a server a probe interval (2 s) as its deadline,
 * so that a primary cut off from its backups is passed over; a staleness wait that outlasts it
 * must not end the call: worker 0's pull at clock 2 waits LATE_MS for worker 1's first clock
 * and succeeds, holding worker 1's push. */
static void test_ssp_wait_outlasts_probe(void **state)
{
    (void)state;
    ps_client *c0 = open_client(0), *c1 = open_client(1);
    assert_non_null(c0);
    assert_non_null(c1);
    ps_var *v;
    assert_int_equal(make_var(c0, 1, &v), PS_OK);
    float *g = malloc(VAR_N * sizeof(float)), *w = malloc(VAR_N * sizeof(float));
    for (size_t i = 0; i < VAR_N; i++)
        g[i] = 1.0f;
    late_worker lw = {c1, -1};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, late_worker_run, &lw), 0);
    ps_step_item it = {.var = v, .offset = 0, .count = VAR_N, .grad = g, .dst = w};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc1 = ps_step(c0, &it, 1, PS_STEP_CLOCK); /* clock 1: no wait */
    int rc2 = ps_step(c0, &it, 1, PS_STEP_CLOCK); /* clock 2: waits for worker 1's clock 1 */
    if (rc2 != PS_OK)
        fprintf(stderr, "worker 0 step 2: %s\n", ps_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_join(th, NULL);
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr, "worker 0's two steps took %.2f s\n", waited);
    assert_int_equal(rc1, PS_OK);
    assert_int_equal(rc2, PS_OK);
    assert_int_equal(lw.rc, PS_OK);
    assert_true(waited >= (LATE_MS - 500) / 1000.0);
    /* The pull at clock 2 holds both of worker 0's pushes and worker 1's. */
    for (size_t i = 0; i < VAR_N; i++)
        assert_true(w[i] == -4.0f);
    free(g);
    free(w);
    ps_client_close(c1);
    ps_client_close(c0);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    self_bin = argv[0];
    if (argc >= 7 && strcmp(argv[2], "--child") == 0) {
        /* self SERVER_BIN --child worker ID STEPS SPEC: one worker process */
        snprintf(tc.spec, sizeof(tc.spec), "%s", argv[6]);
        /* ROLE: worker (SSP), bsp, bsp-quit (stops as if it died after its steps), table-ssp,
         * table-bsp */
        if (strncmp(argv[3], "table-", 6) == 0)
            return table_worker_main(atoi(argv[4]), strcmp(argv[3], "table-ssp") == 0 ? 1 : 0,
                                     atoi(argv[5]));
        int staleness = strcmp(argv[3], "worker") == 0 ? 1 : 0;
        return worker_main(atoi(argv[4]), staleness, atoi(argv[5]),
                           strcmp(argv[3], "bsp-quit") == 0);
    }
    if (etcd_proc_binary() == NULL) {
        fprintf(stderr, "SKIP: no etcd binary (/usr/bin/etcd, $PSD_ETCD or etcd on PATH): "
                        "replicated clusters need one as their coordinator\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ssp_bounds_hold_across_failover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bsp_exact_across_failover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bsp_eviction_replicated, setup_short_timeout,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_table_bsp_across_failover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_table_ssp_across_failover, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ssp_wait_outlasts_probe, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
