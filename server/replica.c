/* Replica groups (replica.h): start and stop of a server's replication, its method table
 * (REPLICATE and every method routed through repl_dispatch), and the sweeps the primary logs. */
#include "repl_group.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "methods.h"
#include "placement.h"
#include "status.h"
#include "sync.h"
#include "timeutil.h"

static void repl_metrics_collect(metrics_out *out, void *arg);
static void repl_group_free(rgroup *G);

int replica_start(const replica_config *cfg, server_state *own, char *err, size_t errlen)
{
    if (cfg->replicas < 2 || cfg->replicas > REPLICA_MAX || cfg->replicas > cfg->num_servers ||
        cfg->num_servers > VIEW_MAX_SERVERS) {
        snprintf(err, errlen,
                 "replicas %u: must be 2..%u and at most the %u servers of the cluster",
                 cfg->replicas, REPLICA_MAX, cfg->num_servers);
        return -1;
    }
    repl.cfg = *cfg;
    atomic_store(&repl.stopping, false);
    /* Every group this server is a member of: its own first (make_state copies its rpc). */
    for (uint32_t k = 0; k < cfg->replicas; k++) {
        uint32_t g = (cfg->self + cfg->num_servers - k) % cfg->num_servers;
        rgroup *G = calloc(1, sizeof(*G));
        if (G == NULL) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        G->g = g;
        repl.groups[g] = G;
        pthread_mutex_init(&G->order, NULL);
        pthread_rwlockattr_t ra;
        pthread_rwlockattr_init(&ra);
        /* A replacing copy waits for the readers in, not for every reader to come. */
        pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
        pthread_rwlock_init(&G->swap, &ra);
        pthread_rwlockattr_destroy(&ra);
        pthread_mutex_init(&G->q, NULL);
        pthread_cond_init(&G->qcond, NULL);
        pthread_mutex_init(&G->inbox_lock, NULL);
        G->next_lsn = 1;
        G->ready = true;
        if (k == 0) {
            G->st = own;
            own->replicated = true;
            if (cfg->own_restored) {
                G->restored = true;
                G->restored_epoch = cfg->own_epoch;
                G->last_epoch = cfg->own_epoch;
                G->restored_lsn = cfg->own_lsn;
                G->next_lsn = cfg->own_lsn;
                G->last_lsn = G->committed = cfg->own_lsn - 1;
            }
        } else {
            G->owned = true;
            if ((G->st = repl_state_make(g, err, errlen)) == NULL)
                goto fail;
            if (cfg->own_ck && repl_ckpt_restore(G, err, errlen) != 0)
                goto fail;
        }
        G->st->swap = &G->swap;
        rpc_server_config lc = {
            .max_message = cfg->max_message,
            .default_deadline_ms = 60000,
            .max_deadline_ms = 0,
            .methods = server_methods,
            .n_methods = server_methods_len,
            .handler_arg = G->st,
            .trusted = true,
        };
        if ((G->local = rpc_server_open_local(&lc)) == NULL) {
            snprintf(err, errlen, "out of memory");
            goto fail;
        }
        sync_set_logged(G->st, repl_log_evict, G);
        for (uint32_t j = 0; j < cfg->replicas; j++) {
            uint32_t s = (g + j) % cfg->num_servers;
            if (s == cfg->self)
                continue;
            rpeer *p = &G->peers[G->npeers++];
            p->grp = G;
            p->server = s;
            p->rank = j;
        }
    }
    /* The initial view. With a coordinator, none: nothing is served until its first view.
     * Without, a fixed one: everyone up, every group at its placement server. */
    view v;
    memset(&v, 0, sizeof(v));
    v.epoch = 1;
    v.num_servers = cfg->num_servers;
    v.replicas = cfg->replicas;
    for (uint32_t i = 0; i < cfg->num_servers; i++) {
        v.primary[i] = cfg->coordinated ? -1 : (int32_t)i;
        v.live[i] = !cfg->coordinated;
    }
    if (cfg->coordinated) {
        repl.cur = v;
        repl.cur.epoch = 0;
    }
    repl.methods = calloc(server_methods_len, sizeof(*repl.methods));
    if (repl.methods == NULL) {
        snprintf(err, errlen, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < server_methods_len; i++) {
        repl.methods[i] = server_methods[i];
        repl.methods[i].handler = server_methods[i].method == PSD__V1__METHOD__REPLICATE
                                      ? replica_handle_replicate
                                      : repl_dispatch;
    }
    repl.n_methods = server_methods_len;
    repl.on = true;
    repl.final_valid = false;
    if (cfg->own_ck)
        checkpointer_set_position(cfg->own_ck, repl_ckpt_position, repl.groups[cfg->self]);
    if (!cfg->coordinated)
        replica_set_view(&v);
    metrics_add_collector(repl_metrics_collect, NULL);
    log_info("replicas %u: serving group %u as primary, holding backup copies of %u group(s)",
             cfg->replicas, cfg->self, cfg->replicas - 1);
    return 0;
fail:
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
        repl_group_free(repl.groups[g]);
        repl.groups[g] = NULL;
    }
    free(repl.methods);
    repl.methods = NULL;
    return -1;
}

static void repl_metrics_collect(metrics_out *out, void *arg)
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
                     "Logged operations held by backups of groups this server serves.",
                     (double)atomic_load(&repl.replicated_ops));
    metrics_emit_one(out, "psd_replica_ops_acked_before_applied_total", METRIC_COUNTER,
                     "Logged operations this server, as a backup, acknowledged to their primary "
                     "once it held them, before it applied them.",
                     (double)atomic_load(&repl.acked_held));
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

static void repl_group_free(rgroup *G)
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
        repl_copy_image_free(G->peers[i].img);
    pthread_mutex_destroy(&G->order);
    pthread_rwlock_destroy(&G->swap);
    pthread_mutex_destroy(&G->q);
    pthread_cond_destroy(&G->qcond);
    pthread_mutex_destroy(&G->inbox_lock);
    free(G);
}

const rpc_method *replica_methods(size_t *n)
{
    *n = repl.n_methods;
    return repl.methods;
}

void *replica_handler_arg(void)
{
    return &repl;
}

void replica_set_server(rpc_server *rpc)
{
    repl.rpc = rpc;
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++)
        if (repl.groups[g])
            repl.groups[g]->st->rpc = rpc;
    pthread_mutex_lock(&repl.vlock);
    rpc_server_set_epoch(rpc, repl.cur.epoch);
    pthread_mutex_unlock(&repl.vlock);
}

bool replica_sweeps_own(void)
{
    if (!repl.on)
        return true;
    pthread_mutex_lock(&repl.vlock);
    bool mine = repl.cur.epoch != 0 && repl.cur.primary[repl.cfg.self] == (int32_t)repl.cfg.self;
    pthread_mutex_unlock(&repl.vlock);
    return mine;
}

void replica_sweep(void)
{
    if (!repl.on)
        return;
    uint32_t N = repl.cfg.num_servers, self = repl.cfg.self;
    for (uint32_t g = 0; g < N; g++) {
        if (repl.groups[g] == NULL)
            continue;
        pthread_mutex_lock(&repl.vlock);
        bool mine = repl.cur.epoch != 0 && repl.cur.primary[g] == (int32_t)self;
        pthread_mutex_unlock(&repl.vlock);
        /* The state is read under swap: a copy may replace it once the group is no longer
         * served here. Its own group's workers are swept by the caller. */
        rgroup *G = repl.groups[g];
        pthread_rwlock_rdlock(&G->swap);
        if (mine && g != self)
            sync_sweep(G->st);
        if (mine)
            server_tables_sweep_due(G->st, repl_log_sweep, G);
        pthread_rwlock_unlock(&G->swap);
    }
}

void replica_get_view(view *out)
{
    pthread_mutex_lock(&repl.vlock);
    *out = repl.cur;
    pthread_mutex_unlock(&repl.vlock);
}

/* How long a clean stop waits for the view that moves its groups, at most (also lease-ms). */
#define HANDOVER_WAIT_MS 1000u

void replica_await_handover(void)
{
    if (!repl.on || repl.agent == NULL)
        return;
    /* The others decide within a poll of the view (at most 500 ms): a second at most, so that
     * a whole cluster stopped at once (no member left to take over) is not held long. */
    uint32_t wait_ms = repl.cfg.lease_ms < HANDOVER_WAIT_MS ? repl.cfg.lease_ms : HANDOVER_WAIT_MS;
    uint64_t t0 = time_now_ns(), until = t0 + (uint64_t)wait_ms * 1000000u;
    for (;;) {
        uint32_t serving = 0, successors = 0;
        for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
            rgroup *G = repl.groups[g];
            if (G == NULL)
                continue;
            pthread_mutex_lock(&G->q);
            serving += G->serving;
            for (uint32_t i = 0; G->serving && i < G->npeers; i++)
                successors += G->peers[i].in_view;
            pthread_mutex_unlock(&G->q);
        }
        if (serving > 0 && successors == 0)
            return; /* no backup in the view to take a group over: nothing to wait for */
        if (serving == 0) {
            log_info("handed over: primary of no group %.3f s after giving up the lease",
                     (double)(time_now_ns() - t0) * 1e-9);
            return;
        }
        if (time_now_ns() >= until) {
            log_info("still primary of %u group(s) %u ms after giving up the lease: stopping "
                     "without waiting for the view that moves them",
                     serving, wait_ms);
            return;
        }
        struct timespec ts = {0, 5 * 1000000};
        nanosleep(&ts, NULL);
    }
}

void replica_stop(void)
{
    if (!repl.on)
        return;
    atomic_store(&repl.stopping, true);
    metrics_remove_collector(repl_metrics_collect, NULL);
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
        rgroup *G = repl.groups[g];
        if (G == NULL)
            continue;
        pthread_mutex_lock(&repl.vlock);
        if (G->ck)
            checkpointer_stop(G->ck); /* answers its queued Checkpoint calls; final one below */
        pthread_mutex_unlock(&repl.vlock);
        pthread_mutex_lock(&G->q);
        pthread_cond_broadcast(&G->qcond);
        pthread_mutex_unlock(&G->q);
        for (uint32_t i = 0; i < G->npeers; i++) {
            rpeer *p = &G->peers[i];
            if (p->started)
                pthread_join(p->thread, NULL); /* a batch in flight ends by its deadline */
            p->started = false;
            rpc_conn_close(p->conn);
            p->conn = NULL;
        }
        if (G->copy_started)
            pthread_join(G->copy_thread, NULL);
        G->copy_started = false;
        /* The waits of groups it took over (its own group's were ended already): their
         * replies, held until their updates are applied everywhere, are answered below. */
        sync_cancel_all(G->st, "server is shutting down");
        pthread_mutex_lock(&G->order); /* no update being applied holds an entry of the log */
        repl_parked_drop_locked(G);
        pthread_mutex_lock(&G->q);
        rop *o = G->head;
        G->head = G->tail = NULL;
        if (G->riders) {
            rop *r = G->riders;
            while (r->next)
                r = r->next;
            r->next = o;
            o = G->riders;
            G->riders = NULL;
        }
        pthread_mutex_unlock(&G->q);
        pthread_mutex_unlock(&G->order);
        while (o) {
            rop *n = o->next;
            if (o->call) {
                rpc_reply_error(o->call, STATUS_UNAVAILABLE,
                                "server is shutting down before every replica applied the "
                                "update: retry it");
                rpc_call_resume(o->call);
            }
            repl_op_free(o);
            o = n;
        }
    }
}

void replica_free(void)
{
    if (!repl.on)
        return;
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
        rgroup *G = repl.groups[g];
        if (G && G->ck) {
            /* Everything it applied, as the own group's final checkpoint does. */
            checkpoint_info fi;
            char err[1536];
            if (checkpoint_write(G->ck, &fi, err, sizeof(err)) != 0)
                log_error("group %u: final checkpoint failed: %s", g, err);
            checkpointer_destroy(G->ck);
            G->ck = NULL;
        }
    }
    rgroup *own = repl.groups[repl.cfg.self];
    if (repl.cfg.own_ck && own) {
        uint64_t e, l;
        repl.final_valid = repl_ckpt_position(own, true, &e, &l);
        repl_ckpt_position(own, false, NULL, NULL);
        repl.final_epoch = e;
        repl.final_lsn = l;
        checkpointer_set_position(repl.cfg.own_ck, repl_ckpt_final_position, NULL);
    }
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS; g++) {
        repl_group_free(repl.groups[g]);
        repl.groups[g] = NULL;
    }
    free(repl.methods);
    repl.methods = NULL;
    repl.on = false;
}
