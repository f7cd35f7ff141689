/* A replica group's log on its primary: operations appended in order, the commit point
 * (every backup counted applied up to it), the replies it holds until then, and the lease check
 * that a primary alone in its group makes before it acknowledges. */
#include "repl_group.h"

#include <stdlib.h>

#include "status.h"
#include "timeutil.h"

/* This server's lease is valid now (always, with a fixed view): it may acknowledge alone. */
bool repl_lease_valid_now(void)
{
    if (atomic_load(&repl.uncertain))
        return false;
    return repl.agent == NULL || view_agent_serving(repl.agent);
}

void repl_op_free(rop *o)
{
    if (o) {
        rpc_held_release(o->held);
        free(o->own);
        free(o);
    }
}

/* Whether the primary waits for peer p before it acknowledges (q held): a backup in the view,
 * or a rejoining one since it caught up once (so that the coordinator, which it tells once it
 * knows it is waited for, never makes it in sync while this primary acknowledges without it,
 * say before this primary installed the view that adds it). */
bool repl_peer_counted(const rpeer *p)
{
    return p->in_view || (p->catching_up && p->told);
}

/* Moves committed to the lowest lsn every peer in the view applied, takes the operations
 * every one of them applied off the log and returns their parked calls (q held). */
rop *repl_progress_locked(rgroup *G)
{
    uint64_t low = G->last_lsn, keep = G->last_lsn;
    for (uint32_t i = 0; i < G->npeers; i++) {
        if (repl_peer_counted(&G->peers[i]) && G->peers[i].acked < low)
            low = G->peers[i].acked;
        /* Kept until every backup streamed to has it, also one that joined the view behind
         * what was committed without it. */
        if ((G->peers[i].catching_up || G->peers[i].in_view) && G->peers[i].acked < keep)
            keep = G->peers[i].acked;
    }
    if (!G->serving)
        return NULL;
    bool alone = true;
    for (uint32_t i = 0; i < G->npeers; i++)
        if (repl_peer_counted(&G->peers[i]))
            alone = false;
    /* Alone, a primary acknowledges only while its lease is valid at this moment: the lease
     * events come through a queue that can lag behind, and once etcd expired the lease another
     * server may already serve the group. */
    if (alone && low > G->committed && !repl_lease_valid_now())
        low = G->committed; /* perhaps out of the view already: acknowledge nothing alone */
    if (low > G->committed)
        G->committed = low;
    if (keep > G->committed)
        keep = G->committed;
    rop *done = NULL, **tail = &done;
    while (G->head && G->head->lsn <= keep && !G->head->busy) {
        rop *o = G->head;
        G->head = o->next;
        if (G->head == NULL)
            G->tail = NULL;
        o->next = NULL;
        *tail = o;
        tail = &o->next;
    }
    for (rop **pp = &G->riders; *pp;) {
        rop *r = *pp;
        if (r->lsn <= G->committed) {
            *pp = r->next;
            r->next = NULL;
            *tail = r;
            tail = &r->next;
        } else {
            pp = &r->next;
        }
    }
    /* Calls of operations kept for a catching-up backup are answered all the same. */
    for (rop *o = G->head; o && o->lsn <= G->committed; o = o->next) {
        if (o->call == NULL)
            continue;
        rop *a = calloc(1, sizeof(*a));
        if (a == NULL)
            continue; /* answered once the catching-up backup has it */
        a->call = o->call;
        o->call = NULL;
        *tail = a;
        tail = &a->next;
    }
    return done;
}

/* Drops the whole log (q held; no call left in it). */
void repl_log_free_locked(rgroup *G)
{
    while (G->head) {
        rop *o = G->head;
        G->head = o->next;
        repl_op_free(o);
    }
    G->tail = NULL;
}

/* Answers the parked calls of done and frees it (no lock held). */
void repl_answer(rop *done)
{
    while (done) {
        rop *n = done->next;
        if (done->call)
            rpc_call_resume(done->call);
        repl_op_free(done);
        done = n;
    }
}

/* The time the operation logged next applies at (order held): the wall clock, but never
 * before the group's last operation (TTL and LRU ages need a time that only goes forward). */
uint64_t repl_op_time_locked(rgroup *G)
{
    uint64_t t = time_wall_ms();
    if (t < G->last_time_ms)
        t = G->last_time_ms;
    G->last_time_ms = t;
    return t;
}

/* Appends o, just applied, to the log for the streams (order and q held); returns the calls
 * now answered (with no backup in the view: its own at once). */
rop *repl_append_locked(rgroup *G, rop *o)
{
    if (G->tail)
        G->tail->next = o;
    else
        G->head = o;
    G->tail = o;
    G->last_lsn = o->lsn;
    rop *done = repl_progress_locked(G);
    pthread_cond_broadcast(&G->qcond);
    return done;
}

/* The resume gate of a call its handler parked (a Step or pull that waits for the staleness
 * bound or the BSP barrier): its reply, set when the wait ends, goes out only once every backup
 * in the view applied the update it made (lsn: a Step's pushes and clock; 0 for a pull) and
 * the update whose apply ended the wait (another worker's clock, a logged eviction), whose
 * effect the reply may show. Returns true when it keeps the call. */
bool repl_commit_gate(rpc_call *call, void *arg, uint64_t lsn)
{
    rgroup *G = arg;
    if (repl_applying.G == G && repl_applying.lsn > lsn)
        lsn = repl_applying.lsn;
    bool kept = false;
    pthread_mutex_lock(&G->q);
    if (G->committed >= lsn) {
        /* applied everywhere already: send now */
    } else if (!G->serving) {
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "server %u no longer serves group %u: the update was not acknowledged: "
                        "retry",
                        repl.cfg.self, G->g);
    } else {
        rop *r = calloc(1, sizeof(*r));
        if (r == NULL) {
            pthread_mutex_unlock(&G->q);
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "out of memory holding a reply until the replicas applied its "
                            "update: retry");
            return false;
        }
        r->lsn = lsn;
        r->call = call;
        r->next = G->riders;
        G->riders = r;
        kept = true;
    }
    pthread_mutex_unlock(&G->q);
    return kept;
}
