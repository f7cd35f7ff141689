/* Integration: staleness bounds, liveness and deadlines, with real ps-server and worker
 * processes on loopback. */
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "ps_proc.h"
#include "psclient.h"
#include "timeutil.h"

static const char *server_bin;
static const char *self_bin;
static test_cluster tc;

/* Workers run as fresh processes (this binary, re-executed): nng can't be used in a child
 * forked after the parent used it. */
static pid_t spawn(const char *role, int id, int n)
{
    return test_spawn_child(self_bin, server_bin, role, id, n, tc.spec);
}

static ps_client *open_worker(int worker, const char *deadline_ms)
{
    char tf[1400], id[16];
    test_cluster_tf_config(&tc, "worker", worker, tf, sizeof(tf));
    snprintf(id, sizeof(id), "%d", worker);
    ps_config *cfg;
    ps_client *c = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    if (ps_config_set(cfg, "tf-config", tf) != PS_OK ||
        ps_config_set(cfg, "deadline-ms", deadline_ms) != PS_OK ||
        ps_config_set(cfg, "heartbeat-ms", "100") != PS_OK || ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "worker %d: %s\n", worker, ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

static ps_var *make_var(ps_client *c, const char *name, int n, int staleness, double lr)
{
    ps_var_spec s;
    ps_var_spec_init(&s, name);
    s.ndims = 1;
    s.dims[0] = (uint64_t)n;
    s.staleness = staleness;
    s.learning_rate = lr;
    ps_var *v = NULL;
    if (ps_var_create(c, &s, &v) != PS_OK)
        fprintf(stderr, "create %s: %s\n", name, ps_last_error());
    return v;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* ---- SSP: a fast and a slow worker, s = 2 ---------------------------------------------- */

#define SSP_STEPS 15
#define SSP_BOUND 2
#define SLOW_MS 100

static int ssp_worker(int id)
{
    ps_client *c = open_worker(id, "20000");
    ps_var *v = c ? make_var(c, "ssp/w", 4, SSP_BOUND, 1.0) : NULL;
    if (v == NULL)
        return 10;
    /* The slow worker starts once the fast one is there: a fast worker started late (a
     * loaded machine) would otherwise never be ahead, and never wait. */
    unsigned char live[2] = {0, 0};
    while (id == 1 && !live[0]) {
        if (ps_cluster_workers_live(c, 2, live) != PS_OK) {
            fprintf(stderr, "ssp worker %d: %s\n", id, ps_last_error());
            return 12;
        }
        sleep_ms(10);
    }
    float w[4], g[4] = {1, 1, 1, 1};
    for (int t = 0; t < SSP_STEPS; t++) {
        if (ps_pull(c, v, w) != PS_OK || ps_push(c, v, g) != PS_OK || ps_clock(c, NULL) != PS_OK) {
            fprintf(stderr, "ssp worker %d step %d: %s\n", id, t, ps_last_error());
            return 11;
        }
        if (id == 1)
            sleep_ms(SLOW_MS);
    }
    ps_client_close(c);
    return 0;
}

static int start_ssp(void **state)
{
    (void)state;
    return test_cluster_start_workers(&tc, server_bin, 1, 2, NULL);
}

static int stop_cluster(void **state)
{
    (void)state;
    return test_cluster_stop(&tc);
}

static void test_ssp_bound_holds_and_fast_worker_waits(void **state)
{
    (void)state;
    pid_t kids[2];
    uint64_t t0 = time_now_ns();
    for (int k = 0; k < 2; k++)
        kids[k] = spawn("ssp", k, 2);
    int st;
    assert_int_equal(waitpid(kids[0], &st, 0), kids[0]);
    uint64_t fast_ms = (time_now_ns() - t0) / 1000000;
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(waitpid(kids[1], &st, 0), kids[1]);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    ps_client *c = open_worker(0, "5000");
    ps_var *v;
    assert_int_equal(ps_var_lookup(c, "ssp/w", &v), PS_OK);
    assert_int_equal(ps_var_staleness_bound(v), SSP_BOUND);
    ps_staleness_stats s;
    assert_int_equal(ps_var_staleness(c, v, &s), PS_OK);
    fprintf(stderr,
            "ssp: fast worker took %llu ms, max staleness %lld, %llu of %llu pulls "
            "waited %llu ms in all\n",
            (unsigned long long)fast_ms, (long long)s.max, (unsigned long long)s.waits,
            (unsigned long long)s.pulls, (unsigned long long)s.wait_ms);
    assert_true(s.max <= SSP_BOUND); /* the bound is never exceeded */
    assert_true(s.waits >= 1);       /* and the fast worker really waited */
    assert_true(s.pulls >= 2 * SSP_STEPS);
    /* Without waiting the fast worker would finish in a few ms; bounded by the slow one it
     * can't finish before the slow one reached clock SSP_STEPS - 1 - SSP_BOUND. */
    assert_true(fast_ms >= (uint64_t)(SSP_STEPS - 1 - SSP_BOUND - 1) * SLOW_MS);
    float w[4];
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    assert_true(w[0] == -2.0f * SSP_STEPS); /* every push applied once */
    ps_client_close(c);
}

/* ---- BSP: 2 workers with mean aggregation == 1 worker on the union of their batches ------ */

#define DIM 8
#define BATCH 4
#define BSP_STEPS 20

/* Deterministic data of worker k at step t: rows of X and targets y. */
static void batch(int k, int t, float x[BATCH][DIM], float y[BATCH])
{
    for (int r = 0; r < BATCH; r++) {
        y[r] = 0;
        for (int j = 0; j < DIM; j++) {
            unsigned h = (unsigned)((k * 7919 + t * 104729 + r * 131 + j * 31) % 997);
            x[r][j] = (float)h / 997.0f - 0.5f;
            y[r] += x[r][j] * (float)(j + 1) * 0.25f;
        }
    }
}

/* Least-squares gradient (1/n) X^T (X w - y) over the given rows. */
static void grad(const float *w, float x[][DIM], const float *y, int n, float *g)
{
    memset(g, 0, DIM * sizeof(float));
    for (int r = 0; r < n; r++) {
        float e = -y[r];
        for (int j = 0; j < DIM; j++)
            e += x[r][j] * w[j];
        for (int j = 0; j < DIM; j++)
            g[j] += x[r][j] * e / (float)n;
    }
}

/* Worker `id` of `nworkers`; with one worker it trains on both batches at once. */
static int bsp_worker(int id, int nworkers, const char *name)
{
    ps_client *c = open_worker(id, "20000");
    ps_var *v = c ? make_var(c, name, DIM, PS_STALENESS_BSP, 0.5) : NULL;
    if (v == NULL)
        return 10;
    float w[DIM], g[DIM], x[2 * BATCH][DIM], y[2 * BATCH];
    for (int t = 0; t < BSP_STEPS; t++) {
        if (ps_pull(c, v, w) != PS_OK)
            return 11;
        if (nworkers == 2) {
            batch(id, t, x, y);
            grad(w, x, y, BATCH, g);
        } else {
            batch(0, t, x, y);
            batch(1, t, x + BATCH, y + BATCH);
            grad(w, x, y, 2 * BATCH, g);
        }
        if (ps_push(c, v, g) != PS_OK || ps_clock(c, NULL) != PS_OK)
            return 12;
    }
    ps_client_close(c);
    return 0;
}

static void run_workers(int n, const char *name)
{
    pid_t kids[2];
    for (int k = 0; k < n; k++)
        kids[k] = spawn(name, k, n);
    for (int k = 0; k < n; k++) {
        int st;
        assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

static void pull_final(const char *name, float *w)
{
    ps_client *c = open_worker(0, "5000");
    ps_var *v;
    assert_int_equal(ps_var_lookup(c, name, &v), PS_OK);
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    ps_client_close(c);
}

static void test_bsp_equals_one_worker_on_union(void **state)
{
    (void)state;
    float two[DIM], one[DIM];
    const char *const flags[] = {"--bsp-aggregation", "mean", NULL};
    assert_int_equal(test_cluster_start_workers(&tc, server_bin, 2, 2, flags), 0);
    run_workers(2, "bsp/w");
    pull_final("bsp/w", two);
    assert_int_equal(test_cluster_stop(&tc), 0);

    assert_int_equal(test_cluster_start_workers(&tc, server_bin, 2, 1, flags), 0);
    run_workers(1, "bsp/w");
    pull_final("bsp/w", one);
    assert_int_equal(test_cluster_stop(&tc), 0);

    double moved = 0;
    for (int j = 0; j < DIM; j++) {
        fprintf(stderr, "w[%d]: 2 workers %.7f, 1 worker %.7f\n", j, two[j], one[j]);
        assert_true(fabsf(two[j] - one[j]) <= 1e-5f * (1 + fabsf(one[j])));
        moved += fabs(one[j]);
    }
    assert_true(moved > 0.1); /* training really moved the parameters */
}

/* ---- liveness: a worker killed mid-run is evicted, the other goes on -------------------- */

static int start_short_timeout(void **state)
{
    (void)state;
    const char *const flags[] = {"--worker-timeout-ms", "800", NULL};
    return test_cluster_start_workers(&tc, server_bin, 1, 2, flags);
}

static int live_worker(int id, int steps, bool die)
{
    ps_client *c = open_worker(id, "20000");
    ps_var *v = c ? make_var(c, "live/w", 2, PS_STALENESS_BSP, 1.0) : NULL;
    if (v == NULL)
        return 10;
    float w[2], g[2] = {1, 1};
    for (int t = 0; t < steps; t++) {
        if (ps_pull(c, v, w) != PS_OK || ps_push(c, v, g) != PS_OK || ps_clock(c, NULL) != PS_OK) {
            fprintf(stderr, "live worker %d step %d: %s\n", id, t, ps_last_error());
            return 11;
        }
    }
    if (die)
        raise(SIGKILL); /* no goodbye, no more heartbeats */
    ps_client_close(c);
    return 0;
}

static void test_dead_worker_is_evicted_and_may_return(void **state)
{
    (void)state;
    pid_t victim = spawn("victim", 1, 2);
    pid_t survivor = spawn("survivor", 0, 2);
    int st;
    assert_int_equal(waitpid(victim, &st, 0), victim);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    assert_int_equal(waitpid(survivor, &st, 0), survivor);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0); /* finished although its partner died */

    /* Worker 1 comes back: it re-registers and continues from the current clock. */
    ps_client *c = open_worker(1, "5000");
    ps_var *v;
    assert_int_equal(ps_var_lookup(c, "live/w", &v), PS_OK);
    int64_t clock;
    assert_int_equal(ps_clock(c, &clock), PS_OK);
    ps_server_stats ss;
    assert_int_equal(ps_server_status(c, 0, &ss), PS_OK);
    fprintf(stderr, "after return: clock %lld, evictions %llu, live workers %u\n", (long long)clock,
            (unsigned long long)ss.evictions, ss.live_workers);
    assert_true(ss.evictions >= 1);
    assert_true(clock >= 8); /* not 1: it joined at the survivor's clock */
    ps_client_close(c);
}

/* ---- deadline: a wait that can't end in time names the worker it waited for ------------- */

static int start_long_timeout(void **state)
{
    (void)state;
    const char *const flags[] = {"--worker-timeout-ms", "60000", NULL};
    return test_cluster_start_workers(&tc, server_bin, 1, 2, flags);
}

static void test_wait_deadline_names_the_worker(void **state)
{
    (void)state;
    /* 1 s: the server answers 250 ms early (server/sync.c, wait_deadline), the most margin
     * it keeps, for its reply to arrive before this client gives up on its own (a bare
     * DEADLINE_EXCEEDED that names no worker) however loaded the machine. */
    ps_client *c = open_worker(0, "1000");
    ps_var *v = make_var(c, "dl/w", 2, PS_STALENESS_BSP, 1.0);
    assert_non_null(v);
    float w[2], g[2] = {1, 1};
    assert_int_equal(ps_pull(c, v, w), PS_OK); /* clock 0: nothing to wait for */
    assert_int_equal(ps_push(c, v, g), PS_OK);
    assert_int_equal(ps_clock(c, NULL), PS_OK);
    uint64_t t0 = time_now_ns();
    int rc = ps_pull(c, v, w); /* clock 1: worker 1 never showed up */
    uint64_t ms = (time_now_ns() - t0) / 1000000;
    fprintf(stderr, "after %llu ms: %s: %s\n", (unsigned long long)ms, ps_strerror(rc),
            ps_last_error());
    assert_int_equal(rc, PS_DEADLINE_EXCEEDED);
    assert_non_null(strstr(ps_last_error(), "worker 1"));
    /* Never before 750 ms: the server's deadline runs from its receipt of the call, after t0,
     * and its sweep answers at or after it, never before. The upper limit only catches a
     * wait that ignored the deadline (a loaded machine may delay this process's return). */
    assert_in_range(ms, 750, 5000);
    ps_staleness_stats s;
    assert_int_equal(ps_var_staleness(c, v, &s), PS_OK);
    assert_true(s.timeouts >= 1);
    ps_client_close(c);
}

/* A call the server parks was sent again every resend-ms on another connection (each copy
 * parked anew there): the DEADLINE_EXCEEDED it gets says how long the call waited in all, not
 * only the last copy's wait. */
static void test_wait_figure_counts_every_attempt(void **state)
{
    (void)state;
    /* Copies at 0, 1 and 2 s: the last one's wait has 1 s left, so the server answers it 250
     * ms before the client's deadline (a copy with less left gets a smaller margin, which a
     * loaded machine may eat, and the client's own bare DEADLINE_EXCEEDED would come first). */
    const char *settings[] = {"deadline-ms", "3000", "connections", "2", "resend-ms", "1000", NULL};
    ps_client *c = test_cluster_open_worker(&tc, 0, settings);
    ps_var *v = make_var(c, "fig/w", 2, PS_STALENESS_BSP, 1.0);
    assert_non_null(v);
    float w[2];
    assert_int_equal(ps_clock(c, NULL), PS_OK);
    int rc = ps_pull(c, v, w); /* clock 1: worker 1 never showed up */
    fprintf(stderr, "%s: %s\n", ps_strerror(rc), ps_last_error());
    assert_int_equal(rc, PS_DEADLINE_EXCEEDED);
    assert_non_null(strstr(ps_last_error(), "worker 1"));
    const char *all = strstr(ps_last_error(), "the call waited ");
    assert_non_null(all);
    double secs = atof(all + strlen("the call waited "));
    /* About 2.75 s, the whole wait, not the last copy's 0.75 s (nor a wait that ignored the
     * deadline). */
    assert_true(secs >= 2.5 && secs <= 5.0);
    ps_client_close(c);
}

/* ---- a worker that finished leaves the barrier -------------------------------------------- */

static void test_finished_worker_leaves_the_barrier(void **state)
{
    (void)state;
    ps_client *w0 = open_worker(0, "3000"), *w1 = open_worker(1, "3000");
    assert_non_null(w0);
    assert_non_null(w1);
    ps_var *v0 = make_var(w0, "leave/w", 2, PS_STALENESS_BSP, 1.0);
    ps_var *v1 = make_var(w1, "leave/w", 2, PS_STALENESS_BSP, 1.0);
    assert_non_null(v0);
    assert_non_null(v1);
    float w[2], g[2] = {1, 1};
    assert_int_equal(ps_push(w1, v1, g), PS_OK);
    assert_int_equal(ps_clock(w1, NULL), PS_OK);
    assert_int_equal(ps_worker_finished(w1), PS_OK);
    unsigned char live[2];
    assert_int_equal(ps_cluster_workers_live(w0, 2, live), PS_OK);
    assert_int_equal(live[1], 0);
    /* Worker 0 goes on alone: no pull waits for the finished worker 1 (one would end in
     * DEADLINE_EXCEEDED after 3 s), counted by the server rather than timed. */
    for (int t = 0; t < 4; t++) {
        assert_int_equal(ps_push(w0, v0, g), PS_OK);
        assert_int_equal(ps_clock(w0, NULL), PS_OK);
        assert_int_equal(ps_pull(w0, v0, w), PS_OK);
    }
    ps_staleness_stats ss;
    assert_int_equal(ps_var_staleness(w0, v0, &ss), PS_OK);
    assert_int_equal(ss.waits, 0);
    assert_int_equal(ss.timeouts, 0);
    /* The finished client's later calls do not bring it back. */
    assert_int_equal(ps_pull(w1, v1, w), PS_OK);
    assert_int_equal(ps_cluster_workers_live(w0, 2, live), PS_OK);
    assert_int_equal(live[1], 0);
    ps_client_close(w1);
    /* A new client of worker 1 joins again, where worker 0 is. */
    w1 = open_worker(1, "3000");
    assert_non_null(w1);
    int64_t clock = 0;
    assert_int_equal(ps_clock(w1, &clock), PS_OK);
    assert_int_equal(ps_cluster_workers_live(w0, 2, live), PS_OK);
    assert_int_equal(live[1], 1);
    assert_true(clock >= 4);
    ps_client_close(w1);
    ps_client_close(w0);
}

/* argv: SERVER --child ROLE ID N SPEC */
static int child_main(char **argv)
{
    const char *role = argv[3];
    int id = atoi(argv[4]), n = atoi(argv[5]);
    snprintf(tc.spec, sizeof(tc.spec), "%s", argv[6]);
    if (strcmp(role, "ssp") == 0)
        return ssp_worker(id);
    if (strcmp(role, "victim") == 0)
        return live_worker(id, 2, true);
    if (strcmp(role, "survivor") == 0)
        return live_worker(id, 8, false);
    return bsp_worker(id, n, role);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    self_bin = argv[0];
    if (argc == 7 && strcmp(argv[2], "--child") == 0)
        return child_main(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ssp_bound_holds_and_fast_worker_waits, start_ssp,
                                        stop_cluster),
        cmocka_unit_test(test_bsp_equals_one_worker_on_union),
        cmocka_unit_test_setup_teardown(test_dead_worker_is_evicted_and_may_return,
                                        start_short_timeout, stop_cluster),
        cmocka_unit_test_setup_teardown(test_wait_deadline_names_the_worker, start_long_timeout,
                                        stop_cluster),
        cmocka_unit_test_setup_teardown(test_wait_figure_counts_every_attempt, start_long_timeout,
                                        stop_cluster),
        cmocka_unit_test_setup_teardown(test_finished_worker_leaves_the_barrier, start_long_timeout,
                                        stop_cluster),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
