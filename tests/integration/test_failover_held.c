/* Integration: updates acknowledged once the backups HOLD them (before they applied them) are
 * not lost when the primary dies, on real processes and a real etcd (the test starts one;
 * skipped, exit 77, without an etcd binary).
 *
 * 3 ps-servers with replicas 2, each with test-failpoint apply-slow: a backup answers a batch
 * of its group's log once it holds it, then waits 150 ms before it applies it, so that its
 * applied position lags what it acknowledged. One client keeps INFLIGHT pushes of a variable
 * split over every group in flight; once KILL_AT are acknowledged, server 2's metrics must show
 * operations acknowledged before they were applied, and server 1, primary of group 1, is
 * killed with SIGKILL. Server 2, its backup, takes group 1 over: it applies what it holds
 * first. Every push must be acknowledged, and the values must be minus the number of pushes:
 * none lost, none applied twice. */
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
#include <unistd.h>

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "ps_proc.h"
#include "psclient.h"
#include "replicated_cluster.h"

#define NSERVERS 3
#define VAR_N (NSERVERS * 256) /* split: 256 elements on each group */
#define INFLIGHT 16
#define PUSHES 240
#define KILL_AT 120

static const char *server_bin;
static test_cluster tc;
static etcd_proc etcd;
static int http_ports[NSERVERS];

/* The cluster, started here rather than by test_replicated_start: each server gets its own
 * metrics address. */
static int setup(void **state)
{
    (void)state;
    if (etcd_proc_start(&etcd) != 0)
        return -1;
    memset(&tc, 0, sizeof(tc));
    tc.n = NSERVERS;
    size_t off = (size_t)snprintf(tc.spec, sizeof(tc.spec), "{\"ps\":[");
    for (int i = 0; i < NSERVERS; i++) {
        tc.ports[i] = test_free_port();
        off += (size_t)snprintf(tc.spec + off, sizeof(tc.spec) - off, "%s\"127.0.0.1:%d\"",
                                i ? "," : "", tc.ports[i]);
    }
    snprintf(tc.spec + off, sizeof(tc.spec) - off, "]}");
    for (int i = 0; i < NSERVERS; i++) {
        char haddr[64];
        http_ports[i] = test_free_port();
        snprintf(haddr, sizeof(haddr), "127.0.0.1:%d", http_ports[i]);
        const char *const extra[] = {"--replicas",
                                     "2",
                                     "--coordinator",
                                     etcd.endpoint,
                                     "--lease-ms",
                                     "1000",
                                     "--test-failpoint",
                                     "apply-slow",
                                     "--http-listen",
                                     haddr,
                                     "--log-level",
                                     "warn",
                                     NULL};
        tc.pids[i] = test_server_spawn(server_bin, tc.spec, i, extra, NULL);
        if (tc.pids[i] < 0)
            return -1;
    }
    for (int i = 0; i < NSERVERS; i++)
        if (test_wait_port(tc.ports[i], 10000) != 0)
            return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return test_replicated_stop(&tc, &etcd);
}

/* The value of metric `name` in a /metrics text (-1: absent). */
static double metric_of(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, name, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1.0;
}

/* Waits for op, then frees it; counts a failure (and prints its message, the first few). */
static void finish(ps_op *op, int *failed)
{
    int rc = ps_op_wait(op);
    if (rc != PS_OK && (*failed)++ < 5)
        fprintf(stderr, "push failed: %s\n", ps_last_error());
    ps_op_destroy(op);
}

static void test_held_updates_survive_primary_kill(void **state)
{
    (void)state;
    static const char *const settings[] = {"split-threshold-bytes", "1K", NULL};
    ps_client *c = test_replicated_client(&tc, -1, "2", settings);
    assert_non_null(c);
    ps_var_spec s;
    ps_var_spec_init(&s, "held/v");
    s.ndims = 1;
    s.dims[0] = VAR_N;
    s.learning_rate = 1.0;
    ps_var *v = NULL;
    assert_int_equal(ps_var_create(c, &s, &v), PS_OK);
    float *g = malloc(VAR_N * sizeof(float));
    assert_non_null(g);
    for (size_t i = 0; i < VAR_N; i++)
        g[i] = 1.0f;

    ps_op *ring[INFLIGHT] = {0};
    int started = 0, acked = 0, failed = 0;
    while (acked < PUSHES) {
        int slot = started % INFLIGHT;
        if (started < PUSHES && ring[slot] == NULL) {
            int rc = ps_push_async(c, v, 0, VAR_N, g, NULL, NULL, &ring[slot]);
            if (rc != PS_OK)
                fprintf(stderr, "push %d: %s\n", started, ps_last_error());
            assert_int_equal(rc, PS_OK);
            started++;
            continue;
        }
        int oldest = acked % INFLIGHT;
        finish(ring[oldest], &failed);
        ring[oldest] = NULL;
        acked++;
        if (acked == KILL_AT) {
            /* Server 2, backup of group 1, acknowledged operations it had not applied yet. */
            char *body = NULL;
            assert_int_equal(test_http_get(http_ports[2], "/metrics", &body), 200);
            double early = metric_of(body, "psd_replica_ops_acked_before_applied_total");
            free(body);
            fprintf(stderr, "ps 2 acknowledged %.0f operations before it applied them\n", early);
            assert_true(early > 0);
            assert_int_equal(kill(tc.pids[1], SIGKILL), 0);
            waitpid(tc.pids[1], NULL, 0);
            tc.pids[1] = 0; /* not stopped again by the teardown */
            fprintf(stderr, "killed ps 1 (primary of group 1) with %d pushes in flight\n",
                    started - acked);
        }
    }
    assert_int_equal(failed, 0);

    /* Every push acknowledged, each applied once: on group 1 too, served by its new primary. */
    float want = -(float)PUSHES;
    float *w = malloc(VAR_N * sizeof(float));
    assert_non_null(w);
    assert_int_equal(ps_pull(c, v, w), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < VAR_N; i++)
        if (w[i] != want && wrong++ < 5)
            fprintf(stderr, "v[%zu] = %.1f, expected %.1f\n", i, w[i], want);
    assert_int_equal(wrong, 0);
    assert_int_equal(ps_client_lost_updates(c), 0);
    free(w);
    free(g);
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
        cmocka_unit_test_setup_teardown(test_held_updates_survive_primary_kill, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
