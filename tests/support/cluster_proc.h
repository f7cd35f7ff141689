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

/* Starts server i again on its port after it died (it is reaped first if it was killed), with
 * the flags `extra` (may be NULL), and waits until it listens (at most 10 s). Returns 0 or -1. */
int test_cluster_respawn(test_cluster *tc, const char *server_bin, int i, const char *const *extra);

/* One ps-server for restart tests: task `index` of the cluster spec `spec` ({"ps":[...]}),
 * log level info, stderr appended to log_path (NULL: inherited), extra flags (may be NULL).
 * Does not wait; returns the pid or -1. The child dies with the test process. */
pid_t test_server_spawn(const char *server_bin, const char *spec, int index,
                        const char *const *extra, const char *log_path);

/* Waits until something listens on the loopback port (at most ms). Returns 0 or -1. */
int test_wait_port(int port, int ms);

/* Waits for pid to exit (at most ms, then SIGKILLs it). Returns its exit status, 128 + the
 * signal if a signal ended it, or -1 if it had to be killed. */
int test_wait_exit(pid_t pid, int ms);

/* Worker processes of a test: this test binary (self) run again as
 * `self SERVER_BIN --child ROLE ID N SPEC`, which its main hands to the child's code. A fresh
 * process, not a plain fork, because nng can't be used in a child forked after the parent
 * used it. Returns the child's pid (-1 if fork failed). */
pid_t test_spawn_child(const char *self, const char *server_bin, const char *role, int id, int n,
                       const char *spec);

/* Whether the file at path contains text. */
bool test_file_contains(const char *path, const char *text);

#endif
