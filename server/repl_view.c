/* View changes on a replicating server: the groups it serves, backs up or stops serving,
 * peers joined and left, takeovers and their checkpointers, rejoin copies started, and the
 * coordinator's events (lease lost, view applied). */
#include "repl_group.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "placement.h"
#include "status.h"
#include "sync.h"
#include "timeutil.h"

void replica_set_view(const view *v)
{
    if (!repl.on)
        return;
    pthread_mutex_lock(&repl.vlock);
    if (v->epoch <= repl.cur.epoch || v->num_servers != repl.cfg.num_servers) {
        pthread_mutex_unlock(&repl.vlock);
        return;
    }
    view old = repl.cur;
    repl.cur = *v;
    if (repl.rpc)
        rpc_server_set_epoch(repl.rpc, v->epoch);
    uint32_t self = repl.cfg.self;
    for (uint32_t g = 0; g < repl.cfg.num_servers; g++) {
        rgroup *G = repl.groups[g];
        if (G == NULL)
            continue;
        pthread_mutex_lock(&G->order); /* order before q, as updates take them */
        repl_parked_drop_locked(G);    /* the primary sends them again, or no longer */
        pthread_mutex_lock(&G->q);
        rop *moved = NULL; /* calls answered: no longer the primary */
        bool was = G->serving;
        int32_t was_primary = G->primary;
        G->serving = v->primary[g] == (int32_t)self;
        bool lost = was && !G->serving;
        G->primary = v->primary[g];
        G->epoch = v->epoch;
        if (G->serving && !was && !atomic_load(&repl.stopping))
            repl_ckpt_start(G); /* a group of another server: checkpointed while served here */
        if (G->serving && !was && old.epoch != 0) {
            atomic_fetch_add(&repl.failovers, 1);
            /* Taking over: the log it kept as a backup is still to reach the others. */
            G->last_lsn = G->next_lsn - 1;
            for (uint32_t i = 0; i < G->npeers; i++) {
                rpeer *p = &G->peers[i];
                p->acked = p->sent = G->committed; /* every member held that much */
                p->stall = false;
            }
            /* Its workers' silence counts from now. */
            sync_heard_all(G->st);
            log_warn("view epoch %llu: serving group %u as its primary from lsn %llu",
                     (unsigned long long)v->epoch, g, (unsigned long long)G->last_lsn);
        } else if (!G->serving && was) {
            log_warn("view epoch %llu: group %u is now served by server %d",
                     (unsigned long long)v->epoch, g, v->primary[g]);
            /* Calls still waiting for backups are not acknowledged here: the client sends
             * them again (same seq) to the new primary, whose window drops what it has. When
             * the new primary is not known yet (this server lost its lease before it read the
             * view without it), UNAVAILABLE: the client retries here, and is sent on once this
             * server knows the view (FAILED_PRECONDITION without a primary would end the
             * client's call with an error). */
            for (rop *o = G->head; o; o = o->next) {
                if (o->call == NULL)
                    continue;
                rop *a = calloc(1, sizeof(*a));
                if (a == NULL)
                    continue;
                if (v->primary[g] >= 0) {
                    rpc_call_set_primary(o->call, (uint32_t)v->primary[g]);
                    rpc_reply_error(o->call, STATUS_FAILED_PRECONDITION,
                                    "server %u no longer serves group %u (view epoch %llu): its "
                                    "primary is server %d; the update was not acknowledged",
                                    self, g, (unsigned long long)v->epoch, v->primary[g]);
                } else {
                    rpc_reply_error(o->call, STATUS_UNAVAILABLE,
                                    "server %u no longer serves group %u and does not know its "
                                    "new primary yet (it lost its lease); the update was not "
                                    "acknowledged: retry",
                                    self, g);
                }
                a->call = o->call;
                o->call = NULL;
                a->next = moved;
                moved = a;
            }
            repl_log_free_locked(G);
            /* Replies held for updates not applied everywhere: not sent; retried elsewhere. */
            while (G->riders) {
                rop *r = G->riders;
                G->riders = r->next;
                if (v->primary[g] >= 0)
                    rpc_call_set_primary(r->call, (uint32_t)v->primary[g]);
                rpc_reply_error(r->call, STATUS_UNAVAILABLE,
                                "server %u no longer serves group %u (view epoch %llu): the "
                                "update this reply depends on was not acknowledged: retry",
                                self, g, (unsigned long long)v->epoch);
                r->next = moved;
                moved = r;
            }
        }
        bool degraded = false;
        for (uint32_t i = 0; i < G->npeers; i++) {
            rpeer *p = &G->peers[i];
            bool in = v->live[p->server] && view_in_sync(v, g, p->server) &&
                      v->primary[g] != (int32_t)p->server;
            if (in && p->catching_up) {
                p->catching_up = false; /* caught up, added back: waited for from now on */
                log_info("view epoch %llu: server %u is a backup of group %u again",
                         (unsigned long long)v->epoch, p->server, g);
            }
            /* Left the view: no longer waited for until it has caught up again (a new
             * incarnation that already asked for a copy is still streamed to). */
            if (p->in_view && !in)
                p->told = p->confirmed = false;
            p->in_view = in;
            if (!in)
                degraded = true;
        }
        bool in_sync = v->live[self] && view_in_sync(v, g, self);
        if (in_sync && old.epoch != 0)
            G->fresh = false; /* live: the next time out of the view needs a new copy */
        if (in_sync && repl.agent)
            view_agent_set_lacks(repl.agent, g, false); /* kept in sync from now on */
        if (v->live[self] && !G->serving && atomic_load(&G->has_files))
            repl_ckpt_copies_drop(G); /* a live backup's copy moves on past its checkpoints */
        /* Out of the view or out of sync, or the first view: copy from the primary. A copy
         * taken from a primary that is no longer one may hold operations the new primary
         * never logged: copied again from the new one. */
        if (was_primary != v->primary[g])
            G->verified = false; /* a new primary's stream confirms this copy's log first */
        if (!in_sync && !G->serving && was_primary != v->primary[g] && old.epoch != 0)
            G->fresh = false;
        /* Taken out of sync while live (its primary could not reach it): the primary
         * acknowledges without it from this view on, so its copy, however fresh, is copied
         * again. */
        if (!in_sync && !G->serving && old.epoch != 0 && old.live[self] &&
            view_in_sync(&old, g, self) && v->live[self]) {
            G->fresh = false;
            log_warn("view epoch %llu: this server is out of sync in group %u (its primary %d "
                     "could not reach it): copying the group again",
                     (unsigned long long)v->epoch, g, v->primary[g]);
        }
        if ((!in_sync || old.epoch == 0) && !G->serving && v->primary[g] >= 0)
            repl_rejoin_locked(G);
        if (G->serving) {
            if (degraded)
                log_warn("view epoch %llu: group %u runs degraded (a backup is out of the "
                         "view): updates are acknowledged by fewer replicas",
                         (unsigned long long)v->epoch, g);
            repl_start_peers_locked(G);
        }
        rop *done = repl_progress_locked(G);
        pthread_cond_broadcast(&G->qcond);
        pthread_mutex_unlock(&G->q);
        pthread_mutex_unlock(&G->order);
        repl_answer(done);
        repl_answer(moved);
        if (lost) {
            repl_ckpt_stop(G); /* its checkpoints go on at its new primary */
            repl_ckpt_copies_drop(G);
        }
        if (lost) {
            /* Its pulls waiting for a staleness bound (no longer swept here) go to the new
             * primary: the client retries, and is told which server that is. */
            char why[160];
            snprintf(why, sizeof(why),
                     "server %u no longer serves group %u (view epoch %llu): retry", self, g,
                     (unsigned long long)v->epoch);
            sync_cancel_all(G->st, why);
        }
    }
    pthread_mutex_unlock(&repl.vlock);
}

/* Installs v with this server out of it: its incarnation is not the one v names live. */
static void set_view_without_self(const view *v, bool force)
{
    view w = *v;
    uint32_t self = repl.cfg.self;
    w.live[self] = 0;
    for (uint32_t g = 0; g < w.num_servers; g++)
        if (w.primary[g] == (int32_t)self)
            w.primary[g] = -1;
    if (force) {
        pthread_mutex_lock(&repl.vlock);
        if (w.epoch == repl.cur.epoch && w.epoch > 0)
            repl.cur.epoch--; /* the same epoch again, this time without this server */
        pthread_mutex_unlock(&repl.vlock);
    }
    replica_set_view(&w);
}

void replica_attach_agent(view_agent *a)
{
    repl.agent = a;
}

void replica_on_view_event(void *arg, view_event ev, const view *v)
{
    (void)arg;
    if (!repl.on)
        return;
    switch (ev) {
    case VIEW_EVENT_VIEW:
        if (v->live[repl.cfg.self] && repl.agent && !view_agent_in_view(repl.agent))
            set_view_without_self(v, false); /* the view names a previous incarnation */
        else
            replica_set_view(v);
        break;
    case VIEW_EVENT_LEASE_LOST: {
        /* Before the first view nothing was served or acknowledged: nothing to rejoin. */
        pthread_mutex_lock(&repl.vlock);
        bool first = repl.cur.epoch == 0;
        pthread_mutex_unlock(&repl.vlock);
        if (first) {
            log_warn("lease lost before the first view: nothing was served; registering again");
            break;
        }
        log_warn("lease lost: serving no group until this server has rejoined");
        for (uint32_t g = 0; g < repl.cfg.num_servers; g++) {
            if (repl.groups[g] == NULL)
                continue;
            pthread_mutex_lock(&repl.groups[g]->q);
            repl.groups[g]->fresh = false;
            pthread_mutex_unlock(&repl.groups[g]->q);
        }
        set_view_without_self(v, true);
        break;
    }
    case VIEW_EVENT_LEASE_UNCERTAIN:
        log_warn("lease not renewed in time: groups without a live backup acknowledge nothing "
                 "until it is");
        atomic_store(&repl.uncertain, true);
        break;
    case VIEW_EVENT_LEASE_OK:
        atomic_store(&repl.uncertain, false);
        for (uint32_t g = 0; g < repl.cfg.num_servers; g++) {
            rgroup *G = repl.groups[g];
            if (G == NULL)
                continue;
            pthread_mutex_lock(&G->q);
            rop *done = repl_progress_locked(G);
            pthread_mutex_unlock(&G->q);
            repl_answer(done);
        }
        break;
    default:
        break;
    }
}

uint32_t replica_degraded_groups(void)
{
    uint32_t n = 0;
    if (!repl.on)
        return 0;
    for (uint32_t g = 0; g < repl.cfg.num_servers; g++) {
        rgroup *G = repl.groups[g];
        if (G == NULL)
            continue;
        pthread_mutex_lock(&G->q);
        bool d = false;
        for (uint32_t i = 0; i < G->npeers; i++)
            if (!G->peers[i].in_view)
                d = true;
        if (G->serving && d)
            n++;
        pthread_mutex_unlock(&G->q);
    }
    return n;
}
