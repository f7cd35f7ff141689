/* Test support: a replicated cluster on real processes (replicated_cluster.h). */
#include "replicated_cluster.h"

#include <stdio.h>

int test_replicated_start(test_cluster *tc, etcd_proc *etcd, test_repl_flags *flags,
                          const char *server_bin, int n, int n_workers, const char *replicas,
                          const char *lease_ms, const char *const *more)
{
    if (etcd_proc_start(etcd) != 0)
        return -1;
    size_t k = 0;
    flags->v[k++] = "--replicas";
    flags->v[k++] = replicas;
    flags->v[k++] = "--coordinator";
    flags->v[k++] = etcd->endpoint;
    flags->v[k++] = "--lease-ms";
    flags->v[k++] = lease_ms;
    for (size_t i = 0; more != NULL && more[i] != NULL; i++) {
        if (k + 1 >= TEST_REPL_MAX_FLAGS) {
            fprintf(stderr, "test_replicated_start: more than %d flags\n", TEST_REPL_MAX_FLAGS - 1);
            return -1;
        }
        flags->v[k++] = more[i];
    }
    flags->v[k] = NULL;
    return test_cluster_start_workers(tc, server_bin, n, n_workers, flags->v);
}

int test_replicated_stop(test_cluster *tc, etcd_proc *etcd)
{
    int rc = test_cluster_stop(tc);
    etcd_proc_stop(etcd);
    return rc;
}

ps_client *test_replicated_client(const test_cluster *tc, int worker, const char *replicas,
                                  const char *const *settings)
{
    char tf[1400];
    test_cluster_tf_config(tc, worker >= 0 ? "worker" : NULL, worker >= 0 ? worker : 0, tf,
                           sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    int rc = ps_config_set(cfg, worker >= 0 ? "tf-config" : "cluster", tf);
    if (rc == PS_OK)
        rc = ps_config_set(cfg, "deadline-ms", "60000");
    if (rc == PS_OK)
        rc = ps_config_set(cfg, "replicas", replicas);
    for (size_t i = 0; rc == PS_OK && settings != NULL && settings[i] != NULL; i += 2)
        rc = ps_config_set(cfg, settings[i], settings[i + 1]);
    if (rc != PS_OK)
        fprintf(stderr, "config: %s\n", ps_last_error());
    else if (ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "open: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}
