/* Test support: real ps-server processes on loopback. */
#ifndef PSD_TESTS_CLUSTER_PROC_H
#define PSD_TESTS_CLUSTER_PROC_H

#include <stdbool.h>
#include <sys/types.h>

#define TEST_MAX_SERVERS 8

typedef struct test_cluster {
    int n;
    int ports[TEST_MAX_SERVERS];
    pid_t pids[TEST_MAX_SERVERS];
    char spec[1024]; /* {"ps":[...]} */
} test_cluster;

/* The ps-server path integration tests take as their argument; exits 2 with a usage line if
 * it is missing. */
const char *test_server_bin(int argc, char **argv);

/* A loopback TCP port that was free a moment ago. */
int test_free_port(void);

/* Starts n ps-server processes (binary at server_bin) with extra flags (may be NULL), and waits
 * until each answers a status request (at most 10 s). Returns 0 or -1. The children die with
 * the test process (PR_SET_PDEATHSIG). */
int test_cluster_start(test_cluster *tc, const char *server_bin, int n, const char *const *extra);

/* Same with n_workers worker entries in the spec (addresses nobody listens on: workers are
 * clients), so that the servers expect that many workers. */
int test_cluster_start_workers(test_cluster *tc, const char *server_bin, int n, int n_workers,
                               const char *const *extra);

/* Sends SIGTERM to every server and waits; returns 0 if all exited with status 0. */
int test_cluster_stop(test_cluster *tc);

/* TF_CONFIG text for a task of this cluster ("worker", 0) or only the cluster (type NULL). */
void test_cluster_tf_config(const test_cluster *tc, const char *type, int index, char *buf,
                            size_t cap);

#endif
