/* A backup's side of replication: REPLICATE batches checked (token, epoch, the log's match),
 * answered once their operations are held and applied in lsn order behind the answer; the
 * group checksum that tells whether copies agree. */
#include "repl_group.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "placement.h"
#include "repl_match.h"
#include "status.h"
#include "timeutil.h"

/* Failpoint apply-slow (test-failpoint, tests only): a backup waits this long before it
 * applies each batch it answered held, as a backup far behind on a loaded machine. */
#define APPLY_SLOW_MS 150u

/* An operation of a batch, held until it is applied. */
typedef struct held_op {
    const uint8_t *bytes;
    size_t len;
    uint64_t time_ms, epoch;
} held_op;

/* By name, then offset: the parts (or ranges) of one variable held here come in one order on
 * every copy, whatever order the store lists them in. */
static int var_cmp(const void *a, const void *b)
{
    const variable *x = *(variable *const *)a, *y = *(variable *const *)b;
    int c = strcmp(x->name, y->name);
    if (c != 0)
        return c;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* FNV-1a over every variable of st by name: name, version, range, values and optimizer slots
 * (updates held off meanwhile), then every table's rows (server_tables_checksum). */
static uint64_t group_checksum(server_state *st, uint32_t *nvars)
{
    uint64_t h = FNV1A_INIT;
    store_freeze(st->vars);
    variable **vars;
    size_t n = store_list(st->vars, &vars);
    if (n)
        qsort(vars, n, sizeof(*vars), var_cmp);
    for (size_t i = 0; i < n; i++) {
        variable *v = vars[i];
        uint64_t ver = atomic_load(&v->version);
        h = fnv1a_update(h, v->name, strlen(v->name) + 1);
        h = fnv1a_update(h, &ver, sizeof(ver));
        h = fnv1a_update(h, &v->offset, sizeof(v->offset));
        h = fnv1a_update(h, &v->count, sizeof(v->count));
        h = fnv1a_update(h, v->params, v->count * sizeof(float));
        for (size_t k = 0; k < v->nslots; k++)
            h = fnv1a_update(h, v->slots[k], v->count * sizeof(float));
    }
    store_list_release(vars, n);
    h = server_tables_checksum(st, h);
    store_thaw(st->vars);
    *nvars = (uint32_t)n;
    return h;
}

/* Whether call, a REPLICATE of its log or copy, comes from a server of this cluster: it
 * carries the cluster token (view_agent_token). Refused (answered) otherwise. */
static bool replica_peer_ok(rpc_call *call)
{
    char tok[80];
    if (repl.agent == NULL || !view_agent_token(repl.agent, tok, sizeof(tok))) {
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "server %u has not read the cluster token from the coordinator yet: "
                        "retry",
                        repl.cfg.self);
        return false;
    }
    if (rpc_call_carries_token(call, tok))
        return true;
    log_warn("refused REPLICATE without the cluster token (a server-to-server method: only the "
             "cluster's servers, which read the token from the coordinator, may send it)");
    rpc_reply_error(call, STATUS_PERMISSION_DENIED,
                    "REPLICATE is a server-to-server method: the request does not carry the "
                    "cluster token that the servers read from the coordinator");
    return false;
}

/* Sends the answer set on call when it was parked (a batch that came early); otherwise the
 * handler's return sends it. */
static void answered(rpc_call *call, bool parked)
{
    if (parked)
        rpc_call_resume(call);
}

/* A REPLICATE batch of G's log, checked before (token, epoch, segment), with the order lock
 * held: checked against the copy (ready, serving, epoch, log matching), answered once its
 * operations are held and applied behind the answer. parked: the call was parked as a batch
 * that came before the one ahead of it. Returns whether the copy caught up with its primary
 * just now (to be told to the coordinator once the lock is released). */
static bool replicate_locked(rgroup *G, rpc_call *call, bool parked)
{
    const Psd__V1__ReplicateRequest *rq = (const Psd__V1__ReplicateRequest *)rpc_call_body(call);
    uint32_t self = repl.cfg.self;
    size_t seglen;
    const uint8_t *seg = rpc_call_segment(call, &seglen);
    Psd__V1__ReplicateReply rep = PSD__V1__REPLICATE_REPLY__INIT;
    if (!G->ready) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "server %u is copying group %u from its primary: not ready for its log yet",
                        self, rq->group);
        answered(call, parked);
        return false;
    }
    /* Checked again under the order lock, which a view change takes: a view installed since
     * the check above may have made this server the group's primary or moved past the epoch. */
    if (G->serving || rq->epoch < G->epoch) {
        uint64_t now = G->epoch;
        bool serving = G->serving;
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "REPLICATE of group %u under view epoch %llu refused: this server %s "
                        "(epoch %llu)",
                        rq->group, (unsigned long long)rq->epoch,
                        serving ? "is now its primary" : "moved to a newer view",
                        (unsigned long long)now);
        answered(call, parked);
        return false;
    }
    /* Log matching (repl_match.h): a copy that diverged from the primary copies the group
     * again, and answers nothing the primary could count as agreement meanwhile. */
    uint64_t mine = G->next_lsn - 1;
    repl_match match =
        repl_match_batch(mine, G->last_epoch, G->verified, rq->last_lsn, rq->committed_lsn,
                         rq->first_lsn, rq->n_op_len, rq->op_epoch, rq->n_op_epoch);
    if (match == REPL_MATCHED)
        G->verified = true;
    if (match == REPL_DIVERGED) {
        uint64_t at_primary =
            mine <= rq->last_lsn && rq->first_lsn <= mine && mine < rq->first_lsn + rq->n_op_epoch
                ? rq->op_epoch[mine - rq->first_lsn]
                : 0;
        log_warn("group %u: this copy applied up to lsn %llu (epoch %llu), which the primary's "
                 "log (end %llu, epoch %llu there) does not hold: copying the group again",
                 G->g, (unsigned long long)mine, (unsigned long long)G->last_epoch,
                 (unsigned long long)rq->last_lsn, (unsigned long long)at_primary);
        pthread_mutex_lock(&G->q);
        G->fresh = false;
        repl_rejoin_locked(G);
        pthread_mutex_unlock(&G->q);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "server %u diverged from the primary on group %u at lsn %llu: it copies "
                        "the group again",
                        self, rq->group, (unsigned long long)mine);
        answered(call, parked);
        return false;
    }
    /* The operations this batch adds to what the copy holds: lsn next_lsn on (a batch sent
     * again, or one of several in flight that arrived late, may start below it). */
    uint64_t applied_next = G->next_lsn, first = rq->first_lsn;
    size_t n = rq->n_op_len;
    uint64_t held_next = applied_next;
    if (n > 0 && first <= applied_next && first + n > applied_next)
        held_next = first + n;
    size_t nnew = (size_t)(held_next - applied_next);
    /* What the apply needs once the call is answered (its body is the call's, freed then). */
    uint64_t last_lsn = rq->last_lsn, committed_lsn = rq->committed_lsn;
    bool counted = rq->counted;
    held_op *ops = calloc(nnew ? nnew : 1, sizeof(*ops));
    if (ops == NULL) {
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "server %u: out of memory holding group %u's log: retry", self, rq->group);
        answered(call, parked);
        return false;
    }
    size_t at = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t len = (size_t)rq->op_len[i];
        if (first + i >= applied_next && k < nnew) {
            ops[k].bytes = seg + at;
            ops[k].len = len;
            /* a primary of an older version sends no times (now) and no epochs */
            ops[k].time_ms = i < rq->n_op_time_ms ? rq->op_time_ms[i] : 0;
            ops[k].epoch = i < rq->n_op_epoch ? rq->op_epoch[i] : 0;
            k++;
        }
        at += (len + 3) & ~(size_t)3;
    }
    /* The batch's message, held past the reply: the operations are applied from its bytes, and
     * those kept for the log (replicas > 2) reference it. */
    rpc_held *msg = NULL;
    if (nnew > 0) {
        const uint8_t *d;
        size_t l;
        msg = rpc_call_hold_request(call, &d, &l);
    }
    /* Held in order (the order lock is kept until they are applied, so that nothing reads
     * this copy in between): answered now, applied behind the answer. Without a reference to
     * the message, or with no room to park the call, applied first and answered after. */
    bool early = nnew > 0 && msg != NULL && (parked || rpc_call_defer(call) == 0);
    if (early) {
        rep.applied_lsn = applied_next;
        rep.held_lsn = held_next;
        rpc_reply_ok(call, &rep.base);
        rpc_call_resume(call); /* the call is no longer this thread's */
        call = NULL;
        atomic_fetch_add(&repl.acked_held, nnew);
    }
    const char *fp = repl.cfg.ckpt ? repl.cfg.ckpt->failpoint : NULL;
    if (nnew > 0 && fp && strcmp(fp, "apply-slow") == 0) {
        struct timespec ts = {APPLY_SLOW_MS / 1000, (long)(APPLY_SLOW_MS % 1000) * 1000000};
        nanosleep(&ts, NULL);
    }
    for (size_t i = 0; i < nnew; i++) {
        uint64_t lsn = applied_next + i;
        /* Applied from the received message's bytes, in place, at the time the primary logged
         * it (a primary of an older version sends none: now). */
        uint64_t t = ops[i].time_ms;
        if (t > G->last_time_ms)
            G->last_time_ms = t;
        time_op_set(t);
        if (rpc_server_handle_borrowed(G->local, ops[i].bytes, ops[i].len) != 0)
            log_error("group %u: out of memory applying lsn %llu", G->g, (unsigned long long)lsn);
        time_op_set(0);
        G->next_lsn++;
        if (ops[i].epoch)
            G->last_epoch = ops[i].epoch;
        if (repl.cfg.replicas > 2) {
            /* Kept until every replica applied it: this copy may become the primary that
             * brings a backup behind it up to date. */
            rop *o = calloc(1, sizeof(*o));
            if (o && msg) {
                o->held = rpc_held_ref(msg);
                o->bytes = ops[i].bytes;
            } else if (o && (o->own = malloc(ops[i].len)) != NULL) {
                memcpy(o->own, ops[i].bytes, ops[i].len);
                o->bytes = o->own;
            }
            if (o && o->bytes) {
                o->len = ops[i].len;
                o->lsn = lsn;
                o->epoch = ops[i].epoch;
                o->time_ms = t;
                pthread_mutex_lock(&G->q);
                if (G->tail)
                    G->tail->next = o;
                else
                    G->head = o;
                G->tail = o;
                G->last_lsn = lsn;
                pthread_mutex_unlock(&G->q);
            } else {
                free(o);
            }
        }
    }
    free(ops);
    rpc_held_release(msg);
    if (!early)
        rep.applied_lsn = rep.held_lsn = G->next_lsn;
    /* Caught up once the primary waits for it (counted): from then on every update it
     * acknowledges is one this copy has. */
    bool caught_up = G->next_lsn > last_lsn && counted;
    pthread_mutex_lock(&G->q);
    bool mark = caught_up && !G->marked;
    if (mark) {
        G->marked = true;
        log_info("group %u: caught up with its primary at lsn %llu", G->g,
                 (unsigned long long)G->next_lsn);
    }
    if (committed_lsn && !G->serving) {
        while (G->head && G->head->lsn <= committed_lsn) {
            rop *o = G->head;
            G->head = o->next;
            if (G->head == NULL)
                G->tail = NULL;
            repl_op_free(o);
        }
        if (committed_lsn > G->committed)
            G->committed = committed_lsn;
    }
    pthread_mutex_unlock(&G->q);
    if (call) {
        rpc_reply_ok(call, &rep.base);
        answered(call, parked);
    }
    return mark;
}

/* Whether a batch must wait for the one before it (order held): it starts past what the copy
 * holds, from the primary of the copy's epoch. */
static bool comes_early(const rgroup *G, const Psd__V1__ReplicateRequest *rq)
{
    return rq->n_op_len > 0 && rq->first_lsn > G->next_lsn && G->ready && !G->serving &&
           rq->epoch == G->epoch;
}

static uint64_t parked_first(rpc_call *c)
{
    return ((const Psd__V1__ReplicateRequest *)rpc_call_body(c))->first_lsn;
}

/* Runs the parked batches that are now next (order held); returns whether one caught up. */
static bool run_parked_locked(rgroup *G)
{
    bool mark = false;
    while (G->nparked > 0) {
        rpc_call *c = G->parked[0];
        if (comes_early(G, (const Psd__V1__ReplicateRequest *)rpc_call_body(c)))
            break;
        G->nparked--;
        memmove(&G->parked[0], &G->parked[1], G->nparked * sizeof(G->parked[0]));
        mark |= replicate_locked(G, c, true);
    }
    return mark;
}

void repl_parked_drop_locked(rgroup *G)
{
    while (G->nparked > 0) {
        rpc_call *c = G->parked[--G->nparked];
        rpc_reply_error(c, STATUS_UNAVAILABLE,
                        "server %u dropped a REPLICATE batch of group %u that came before the one "
                        "ahead of it (view change, copy or stop): send it again",
                        repl.cfg.self, G->g);
        rpc_call_resume(c);
    }
}

/* Takes a batch (order held): parked when it came before the one ahead of it (the server runs
 * requests on several threads; a gap answered would make the primary send both again), else
 * held, answered and applied, then the parked batches that are now next. parked: call is
 * parked already. Returns whether the copy caught up. */
static bool take_locked(rgroup *G, rpc_call *call, bool parked)
{
    const Psd__V1__ReplicateRequest *rq = (const Psd__V1__ReplicateRequest *)rpc_call_body(call);
    if (comes_early(G, rq) && G->nparked < REPL_PARKED_MAX &&
        (parked || rpc_call_defer(call) == 0)) {
        size_t at = G->nparked;
        while (at > 0 && parked_first(G->parked[at - 1]) > rq->first_lsn)
            at--;
        memmove(&G->parked[at + 1], &G->parked[at], (G->nparked - at) * sizeof(G->parked[0]));
        G->parked[at] = call;
        G->nparked++;
        return false;
    }
    bool mark = replicate_locked(G, call, parked);
    return run_parked_locked(G) || mark;
}

static void tell_caught_up(rgroup *G)
{
    if (repl.agent)
        view_agent_mark_caught_up(repl.agent, G->g);
}

void replica_handle_replicate(rpc_call *call, void *arg)
{
    (void)arg;
    if (!repl.on) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "this server runs with replicas 1: it holds no replica group");
        return;
    }
    const Psd__V1__ReplicateRequest *rq = (const Psd__V1__ReplicateRequest *)rpc_call_body(call);
    uint32_t N = repl.cfg.num_servers, self = repl.cfg.self;
    if (rq->group >= N || repl.groups[rq->group] == NULL) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "server %u holds no copy of group %u (replicas %u of %u servers)", self,
                        rq->group, repl.cfg.replicas, N);
        return;
    }
    rgroup *G = repl.groups[rq->group];
    Psd__V1__ReplicateReply rep = PSD__V1__REPLICATE_REPLY__INIT;
    /* A group's checksum is a read for operators (the admin role); its log and copies are
     * the cluster's servers' alone: the cluster token, never a loopback peer as such. */
    if (rq->checksum ? !rpc_call_check_admin(call) : !replica_peer_ok(call))
        return;
    if (rq->checksum) {
        pthread_mutex_lock(&G->order);
        rep.applied_lsn = G->next_lsn;
        rep.checksum = group_checksum(G->st, &rep.variables);
        pthread_mutex_unlock(&G->order);
        rpc_reply_ok(call, &rep.base);
        return;
    }
    if (rq->copy) {
        repl_copy_serve(call, G, rq);
        return;
    }
    pthread_mutex_lock(&repl.vlock);
    uint64_t epoch = repl.cur.epoch;
    int32_t prim = repl.cur.primary[rq->group];
    pthread_mutex_unlock(&repl.vlock);
    if (rq->epoch > epoch) {
        /* From a view this server has not installed yet (or no view at all): it does not know
         * whether the sender is the group's primary there. The sender retries. */
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "REPLICATE of group %u under view epoch %llu: this server is at epoch "
                        "%llu and has not installed that view yet: retry",
                        rq->group, (unsigned long long)rq->epoch, (unsigned long long)epoch);
        return;
    }
    if (rq->epoch < epoch) {
        if (prim >= 0)
            rpc_call_set_primary(call, (uint32_t)prim);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "REPLICATE of group %u under view epoch %llu refused: this server is at "
                        "epoch %llu, where the group's primary is server %d",
                        rq->group, (unsigned long long)rq->epoch, (unsigned long long)epoch, prim);
        return;
    }
    if (prim == (int32_t)self) {
        /* Even from a newer epoch: until this server installed that view it numbers the
         * group's log itself; the sender retries. */
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "REPLICATE of group %u refused: this server is its primary in epoch %llu",
                        rq->group, (unsigned long long)epoch);
        return;
    }
    size_t seglen;
    (void)rpc_call_segment(call, &seglen);
    size_t total = 0;
    for (size_t i = 0; i < rq->n_op_len; i++) {
        if (rq->op_len[i] == 0 || rq->op_len[i] > seglen) {
            rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                            "REPLICATE operation %zu has length %llu (segment of %zu bytes)", i,
                            (unsigned long long)rq->op_len[i], seglen);
            return;
        }
        total += ((size_t)rq->op_len[i] + 3) & ~(size_t)3;
    }
    if (total != seglen || (rq->n_op_len > 0 && rq->first_lsn == 0)) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "REPLICATE: %zu operations of %zu padded bytes in a segment of %zu bytes "
                        "(first lsn %llu)",
                        rq->n_op_len, total, seglen, (unsigned long long)rq->first_lsn);
        return;
    }
    /* Batches that come while another thread holds and applies batches of this group are
     * parked in its inbox and taken by that thread: no thread of the server waits for the
     * order lock behind a backup's apply (the pool's threads also serve the server's own
     * group). Without room to park, it waits for the lock. */
    pthread_mutex_lock(&G->inbox_lock);
    if (G->taking && G->ninbox < REPL_PARKED_MAX && rpc_call_defer(call) == 0) {
        G->inbox[G->ninbox++] = call;
        pthread_mutex_unlock(&G->inbox_lock);
        return;
    }
    bool taker = !G->taking;
    G->taking = true;
    pthread_mutex_unlock(&G->inbox_lock);
    pthread_mutex_lock(&G->order);
    bool mark = take_locked(G, call, false);
    while (taker) {
        rpc_call *got[REPL_PARKED_MAX];
        pthread_mutex_lock(&G->inbox_lock);
        size_t n = G->ninbox;
        memcpy(got, G->inbox, n * sizeof(got[0]));
        G->ninbox = 0;
        if (n == 0)
            G->taking = false;
        pthread_mutex_unlock(&G->inbox_lock);
        if (n == 0)
            break;
        for (size_t i = 0; i < n; i++)
            mark |= take_locked(G, got[i], true);
    }
    pthread_mutex_unlock(&G->order);
    if (mark)
        tell_caught_up(G);
}
