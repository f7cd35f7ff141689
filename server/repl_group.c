/* Replica groups' states: made for a copy of a group, freed (one teardown for every
 * server_state), the process's replication state, and the replication metrics. */
#include "repl_group.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "var_rpc.h"
#include "sync.h"
#include "timeutil.h"

struct repl_node repl = {.vlock = PTHREAD_MUTEX_INITIALIZER};
_Thread_local repl_applying_t repl_applying;

void repl_metrics_collect(metrics_out *out, void *arg)
{
    (void)arg;
    metrics_emit_one(out, "psd_replica_degraded_groups", METRIC_GAUGE,
                     "Groups this server serves as primary with a backup out of the view.",
                     (double)replica_degraded_groups());
    metrics_emit_one(out, "psd_replica_state_copies", METRIC_GAUGE,
                     "Copies of group state this server holds (its own group's and the groups it "
                     "backs up): replicas, once every copy a rejoin replaced was freed.",
                     (double)server_states_held());
    metrics_emit_one(out, "psd_replica_ops_streamed_total", METRIC_COUNTER,
                     "Logged operations applied by backups of groups this server serves.",
                     (double)atomic_load(&repl.replicated_ops));
    uint64_t lag = 0;
    for (uint32_t g = 0; g < repl.cfg.num_servers; g++) {
        rgroup *G = repl.groups[g];
        if (G == NULL)
            continue;
        pthread_mutex_lock(&G->q);
        if (G->serving)
            lag += G->last_lsn - G->committed;
        pthread_mutex_unlock(&G->q);
    }
    metrics_emit_one(out, "psd_replica_lag_ops", METRIC_GAUGE,
                     "Logged operations not yet applied by every backup in the view.", (double)lag);
}

server_state *repl_state_make(uint32_t g, char *err, size_t errlen)
{
    const replica_config *c = &repl.cfg;
    server_state *st = calloc(1, sizeof(*st));
    if (st == NULL)
        goto oom;
    st->task_index = g;
    st->num_servers = c->num_servers;
    st->replicated = true;
    st->start_ns = time_now_ns();
    st->vars = store_create();
    st->dedup = dedup_create(c->dedup_window);
    st->default_staleness = c->default_staleness;
    st->sync = sync_create(c->n_workers, c->worker_timeout_ms, c->bsp_mean, SERVER_MAX_WORKERS);
    st->rpc = repl.groups[c->self]->st->rpc;
    if (st->vars && st->dedup && st->sync &&
        server_set_limits(st, c->max_bytes, c->replicas, c->max_vars, c->dedup_max_clients,
                          c->dedup_idle_ms) == 0)
        return st;
    server_state_free(st);
oom:
    snprintf(err, errlen, "out of memory making the copy of group %u", g);
    return NULL;
}

void repl_group_free(rgroup *G)
{
    if (G == NULL)
        return;
    rpc_server_close_local(G->local);
    if (G->owned)
        server_state_free(G->st);
    while (G->head) {
        rop *o = G->head;
        G->head = o->next;
        repl_op_free(o);
    }
    for (uint32_t i = 0; i < G->npeers; i++)
        free(G->peers[i].img);
    pthread_mutex_destroy(&G->order);
    pthread_rwlock_destroy(&G->swap);
    pthread_mutex_destroy(&G->q);
    pthread_cond_destroy(&G->qcond);
    free(G);
}
