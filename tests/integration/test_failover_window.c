/* Integration: a failover never pushes a client's resends out of the exactly-once window, on
 * real processes and a real etcd (the test starts one; skipped, exit 77, without an etcd
 * binary).
 *
 * 4 ps-servers with replicas 2 and the smallest --dedup-window (64). One client keeps
 * INFLIGHT updates in flight, in turn a push of a variable split over every group, a Step
 * pushing to it and a table push of ids on every group (each one piece per group), and server
 * 1, primary of group 1, is killed with SIGKILL in the middle. The pieces to
 * group 1 in flight then are resent to its new primary in whatever order their retries get
 * there. A group's window sees only the sequence numbers of the pieces sent to it, one stream
 * per (client, group): the pieces in flight to one group are at most INFLIGHT < 64 numbers
 * apart, so none is refused as older than the window (ABORTED), where numbers shared by every
 * group would put them 4 x INFLIGHT apart. Every update must be acknowledged, and the values
 * and rows must be minus the exact number of updates: none lost, none applied twice. */
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
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "psclient.h"
#include "replicated_cluster.h"

#define NSERVERS 4
#define VAR_N (NSERVERS * 256) /* split: 256 elements on each group */
#define INFLIGHT 48            /* pushes in flight: below the window of 64 */
#define PUSHES 3000            /* updates, a multiple of 3 */
#define KILL_AT 600            /* updates acknowledged before ps 1 is killed */
#define NIDS 64                /* ids of each table push: rows on every group */
#define DIM 4

static const char *server_bin;
static test_cluster tc;
static etcd_proc etcd;
static test_repl_flags flags;

static int setup(void **state)
{
    (void)state;
    static const char *const more[] = {"--dedup-window", "64", NULL};
    return test_replicated_start(&tc, &etcd, &flags, server_bin, NSERVERS, 0, "2", "1000", more);
}

static int teardown(void **state)
{
    (void)state;
    return test_replicated_stop(&tc, &etcd);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Starts update k: a push, a Step (pushes only) or a table push, in turn. */
static void start_update(int k, ps_client *c, ps_var *v, ps_table *t, const int64_t *ids,
                         const float *g, ps_op **op)
{
    int rc;
    if (k % 3 == 0) {
        rc = ps_push_async(c, v, 0, VAR_N, g, NULL, NULL, op);
    } else if (k % 3 == 1) {
        ps_step_item it = {.var = v, .offset = 0, .count = VAR_N, .grad = g, .dst = NULL};
        rc = ps_step_async(c, &it, 1, 0, NULL, NULL, op);
    } else {
        rc = ps_table_push_async(t, ids, NIDS, g, NULL, NULL, op);
    }
    if (rc != PS_OK)
        fprintf(stderr, "update %d: %s\n", k, ps_last_error());
    assert_int_equal(rc, PS_OK);
}

/* Waits for op, then frees it; counts a failure (and prints its message, the first few). */
static void finish(ps_op *op, int *failed, int *too_old)
{
    int rc = ps_op_wait(op);
    if (rc != PS_OK) {
        if ((*failed)++ < 5)
            fprintf(stderr, "push failed: %s\n", ps_last_error());
        if (strstr(ps_last_error(), "window") != NULL)
            (*too_old)++;
    }
    ps_op_destroy(op);
}

static void test_resends_after_failover_stay_in_window(void **state)
{
    (void)state;
    static const char *const settings[] = {"split-threshold-bytes", "1K", NULL};
    ps_client *c = test_replicated_client(&tc, -1, "2", settings);
    assert_non_null(c);
    ps_var_spec s;
    ps_var_spec_init(&s, "fw/v");
    s.ndims = 1;
    s.dims[0] = VAR_N;
    s.learning_rate = 1.0;
    ps_var *v = NULL;
    assert_int_equal(ps_var_create(c, &s, &v), PS_OK);
    ps_table_spec ts;
    ps_table_spec_init(&ts, "fw/t", DIM, PS_OPT_SGD);
    ts.learning_rate = 1.0;
    ps_table *t = NULL;
    assert_int_equal(ps_table_create(c, &ts, &t), PS_OK);
    int64_t ids[NIDS];
    for (int i = 0; i < NIDS; i++)
        ids[i] = 1000 + 7 * i;
    _Static_assert(VAR_N >= NIDS * DIM, "g serves as the table's gradients too");
    float *g = malloc(VAR_N * sizeof(float));
    assert_non_null(g);
    for (size_t i = 0; i < VAR_N; i++)
        g[i] = 1.0f;

    ps_op *ring[INFLIGHT] = {0};
    int started = 0, acked = 0, failed = 0, too_old = 0;
    double t_kill = 0;
    while (acked < PUSHES) {
        int slot = started % INFLIGHT;
        if (started < PUSHES && ring[slot] == NULL) {
            start_update(started, c, v, t, ids, g, &ring[slot]);
            started++;
            continue;
        }
        /* Full (or every push started): wait for the oldest. */
        int oldest = acked % INFLIGHT;
        finish(ring[oldest], &failed, &too_old);
        ring[oldest] = NULL;
        acked++;
        if (acked == KILL_AT) {
            assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
            waitpid(tc.pids[1], NULL, 0);
            tc.pids[1] = 0; /* not stopped again by the teardown */
            t_kill = now_s();
            fprintf(stderr, "killed ps 1 (primary of group 1) with %d updates in flight\n",
                    started - acked);
        }
    }
    fprintf(stderr, "%d updates done %.1f s after the kill: %d failed, %d older than the window\n",
            PUSHES, now_s() - t_kill, failed, too_old);
    assert_int_equal(too_old, 0);
    assert_int_equal(failed, 0);

    /* Each acknowledged once: the variable took the pushes and the Steps, the rows the table
     * pushes. */
    float want_v = -(float)(PUSHES - PUSHES / 3), want_t = -(float)(PUSHES / 3);
    float *w = malloc(VAR_N * sizeof(float));
    assert_non_null(w);
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < VAR_N; i++)
        if (w[i] != want_v && wrong++ < 5)
            fprintf(stderr, "v[%zu] = %.1f, expected %.1f\n", i, w[i], want_v);
    assert_int_equal(wrong, 0);
    assert_int_equal(ps_table_pull(t, ids, NIDS, w), PS_OK);
    for (size_t i = 0; i < NIDS * DIM; i++)
        if (w[i] != want_t && wrong++ < 5)
            fprintf(stderr, "row of id %lld [%zu] = %.1f, expected %.1f\n", (long long)ids[i / DIM],
                    i % DIM, w[i], want_t);
    assert_int_equal(wrong, 0);
    assert_int_equal(ps_client_lost_updates(c), 0);
    free(w);
    free(g);
    ps_table_free(t);
    ps_client_close(c);
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
        cmocka_unit_test_setup_teardown(test_resends_after_failover_stay_in_window, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
