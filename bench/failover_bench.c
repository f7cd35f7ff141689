/* ps-failover-bench: failover time of a replicated cluster over repeated kills (bench/RESULTS.md,
 * "Replicated shards").
 *
 * Each round starts 3 ps-server processes with replicas 2 on loopback (a real etcd, started
 * once, holds the view; each round under its own coordinator-prefix), creates a variable split
 * over every group, and keeps a pusher thread pushing to it. After a second of pushes it
 * SIGKILLs one server (round k kills server k % 3) and measures, from the kill, the time to the
 * first push acknowledged by every group (the dead server's group by its new primary, as the
 * client follows it). Every push must succeed; the round's servers are then stopped. Prints
 * each round's time and the median, minimum and maximum.
 *
 * usage: ps-failover-bench PS_SERVER [--kills N] [--lease-ms MS]
 * Needs an etcd binary (as the replication tests: $PSD_ETCD, /usr/bin/etcd or on PATH); exits
 * 77 without one. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "psclient.h"

#define NSERVERS 3
#define VAR_N (3 * 1024) /* split: 1024 elements on each server */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static ps_client *open_client(const test_cluster *tc)
{
    char tf[1200];
    test_cluster_tf_config(tc, NULL, 0, tf, sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    if (ps_config_set(cfg, "tf-config", tf) != PS_OK ||
        ps_config_set(cfg, "split-threshold-bytes", "4K") != PS_OK ||
        ps_config_set(cfg, "deadline-ms", "30000") != PS_OK ||
        ps_config_set(cfg, "replicas", "2") != PS_OK)
        fprintf(stderr, "config: %s\n", ps_last_error());
    else if (ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "open: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

typedef struct pusher {
    ps_client *c;
    ps_var *v;
    atomic_bool stop;
    int failed;
    long pushes;
} pusher;

static void *pusher_run(void *arg)
{
    pusher *p = arg;
    float *g = malloc(VAR_N * sizeof(float));
    for (size_t i = 0; g && i < VAR_N; i++)
        g[i] = 1.0f;
    while (g && !atomic_load(&p->stop)) {
        if (ps_push(p->c, p->v, g) != PS_OK) {
            fprintf(stderr, "pusher: %s\n", ps_last_error());
            p->failed = 1;
            break;
        }
        p->pushes++;
    }
    free(g);
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One round: returns the failover time in seconds, or -1. */
static double round_once(const char *server_bin, const etcd_proc *etcd, int k, const char *lease)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "/psd-failover-bench/%d-%d", (int)getpid(), k);
    const char *extra[] = {
        "--replicas",           "2",    "--coordinator", etcd->endpoint, "--lease-ms", lease,
        "--coordinator-prefix", prefix, "--log-level",   "warn",         NULL};
    test_cluster tc;
    if (test_cluster_start(&tc, server_bin, NSERVERS, extra) != 0) {
        fprintf(stderr, "round %d: cannot start the servers\n", k);
        return -1;
    }
    double t = -1;
    ps_client *c = open_client(&tc), *c2 = open_client(&tc);
    ps_var *v = NULL, *v2 = NULL;
    ps_var_spec s;
    ps_var_spec_init(&s, "fb/v");
    s.ndims = 1;
    s.dims[0] = VAR_N;
    s.learning_rate = 1.0;
    s.staleness = PS_STALENESS_ASYNC;
    if (c == NULL || c2 == NULL || ps_var_create(c, &s, &v) != PS_OK ||
        ps_var_lookup(c2, "fb/v", &v2) != PS_OK) {
        fprintf(stderr, "round %d: %s\n", k, ps_last_error());
        goto out;
    }
    /* The view's first epoch is installed once every server registered: wait for a push. */
    float *g = malloc(VAR_N * sizeof(float));
    for (size_t i = 0; g && i < VAR_N; i++)
        g[i] = 1.0f;
    if (g == NULL || ps_push(c, v, g) != PS_OK) {
        fprintf(stderr, "round %d: first push: %s\n", k, ps_last_error());
        free(g);
        goto out;
    }
    pusher p = {.c = c2, .v = v2};
    atomic_init(&p.stop, false);
    pthread_t th;
    pthread_create(&th, NULL, pusher_run, &p);
    usleep(1000 * 1000);
    int victim = k % NSERVERS;
    double t_kill = now_s();
    kill(tc.pids[victim], SIGKILL);
    int ok = ps_push(c, v, g);
    double took = now_s() - t_kill;
    if (ok != PS_OK)
        fprintf(stderr, "round %d: push after the kill: %s\n", k, ps_last_error());
    waitpid(tc.pids[victim], NULL, 0);
    tc.pids[victim] = 0;
    usleep(300 * 1000); /* the pusher goes on through the new view */
    atomic_store(&p.stop, true);
    pthread_join(th, NULL);
    free(g);
    if (ok == PS_OK && !p.failed) {
        t = took;
        printf("| %d | %d | %.3f | %ld |\n", k + 1, victim, took, p.pushes);
        fflush(stdout);
    }
out:
    ps_client_close(c2);
    ps_client_close(c);
    for (int i = 0; i < NSERVERS; i++)
        if (tc.pids[i] > 0)
            kill(tc.pids[i], SIGKILL);
    for (int i = 0; i < NSERVERS; i++)
        if (tc.pids[i] > 0)
            waitpid(tc.pids[i], NULL, 0);
    return t;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: %s PS_SERVER [--kills N] [--lease-ms MS]\n", argv[0]);
        return 2;
    }
    const char *server_bin = argv[1], *lease = "2000";
    int kills = 10;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--kills") == 0 && i + 1 < argc)
            kills = atoi(argv[++i]);
        else if (strcmp(argv[i], "--lease-ms") == 0 && i + 1 < argc)
            lease = argv[++i];
        else {
            fprintf(stderr, "%s: unknown argument %s\n", argv[0], argv[i]);
            return 2;
        }
    }
    if (kills < 1 || kills > 1000) {
        fprintf(stderr, "--kills: 1..1000\n");
        return 2;
    }
    if (etcd_proc_binary() == NULL) {
        fprintf(stderr, "SKIP: no etcd binary ($PSD_ETCD, /usr/bin/etcd or etcd on PATH): a "
                        "replicated cluster needs one as its coordinator\n");
        return 77;
    }
    etcd_proc etcd;
    if (etcd_proc_start(&etcd) != 0)
        return 1;
    printf("# ps-failover-bench: 3 ps-servers, replicas 2, lease-ms %s, %d kills; from SIGKILL "
           "to the first push acknowledged by every group\n",
           lease, kills);
    printf("| kill | server killed | failover s | pushes by the other client |\n");
    printf("|---:|---:|---:|---:|\n");
    double *t = calloc((size_t)kills, sizeof(double));
    int n = 0, rc = 0;
    for (int k = 0; k < kills && t; k++) {
        double x = round_once(server_bin, &etcd, k, lease);
        if (x < 0) {
            rc = 1;
            break;
        }
        t[n++] = x;
    }
    etcd_proc_stop(&etcd);
    if (n > 0) {
        qsort(t, (size_t)n, sizeof(double), cmp_double);
        double med = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
        printf("\n%d kills: median %.3f s, min %.3f s, max %.3f s\n", n, med, t[0], t[n - 1]);
    }
    free(t);
    return rc;
}
