/* Test support: a replicated cluster on real processes (integration tests failover, replicas,
 * failover-sync): a throwaway etcd as the coordinator, ps-servers with replica groups using it,
 * and clients of them. */
#ifndef PSD_TESTS_REPLICATED_CLUSTER_H
#define PSD_TESTS_REPLICATED_CLUSTER_H

#include "cluster_proc.h"
#include "etcd_proc.h"
#include "psclient.h"

#define TEST_REPL_MAX_FLAGS 24

/* The servers' flags: --replicas R --coordinator ENDPOINT --lease-ms L, then the test's own;
 * NULL-terminated (v is what test_cluster_respawn takes to start a server again). */
typedef struct test_repl_flags {
    const char *v[TEST_REPL_MAX_FLAGS];
} test_repl_flags;

/* Starts etcd in *etcd, then n ps-servers in *tc (test_cluster_start_workers: n_workers worker
 * entries in the spec, 0 for none) with replicas copies of every group, etcd as their
 * coordinator, leases of lease_ms and the flags `more` (NULL-terminated, may be NULL), all
 * written to *flags. Returns 0 or -1. */
int test_replicated_start(test_cluster *tc, etcd_proc *etcd, test_repl_flags *flags,
                          const char *server_bin, int n, int n_workers, const char *replicas,
                          const char *lease_ms, const char *const *more);

/* Stops the servers (test_cluster_stop), then etcd. Returns 0 if every server exited with 0. */
int test_replicated_stop(test_cluster *tc, etcd_proc *etcd);

/* A client of tc with `replicas` and a deadline of 60 s: worker `worker` (its TF_CONFIG as
 * tf-config), or, for worker < 0, a client that is no worker (the cluster alone as cluster);
 * then the settings (name, value, ..., NULL; may be NULL). NULL, with a line on stderr, when it
 * cannot be made (usable in a child process: it fails no test by itself). */
ps_client *test_replicated_client(const test_cluster *tc, int worker, const char *replicas,
                                  const char *const *settings);

#endif
