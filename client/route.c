/* Calls to a placement task's server, following its replica group's primary when the cluster
 * is replicated (replicas > 1): a reply refused by a server that does not serve the group names
 * the one that does (Envelope.primary), and the call goes there again, as the same request
 * (same seq: the group's replicated exactly-once window drops it if it was applied before the
 * failover). A server that does not answer within a probe interval is passed over for the next
 * server in ring order, which either serves the group (it took over) or names its primary.
 * Until a reply says the cluster is replicated (Envelope.epoch > 0), or the client's replicas
 * setting does, calls go as they are. The same routing serves the heartbeats of a worker
 * (client_call_on with the heartbeat connections): a group's primary that took over must hear
 * from its workers, or it would evict them. */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "log.h"
#include "status.h"
#include "timeutil.h"

/* Time one attempt at a group's server may take before the next server is asked, once the
 * cluster is known to be replicated. A leased primary is replaced within a few seconds. */
#define ROUTE_PROBE_MS 2000
/* The same for a server none of whose connections is up (it died, or is not there yet). */
#define ROUTE_DOWN_PROBE_MS 300
/* Attempts of one call at most: the deadline ends it first while a failover is awaited (a
 * few hops per ROUTE_DOWN_PROBE_MS at most). */
#define ROUTE_MAX_HOPS 10000
/* UNAVAILABLE replies retried at one server within one attempt (with the call's backoff, 50
 * and 100 ms by default), before the next member is asked: a primary that is shutting down
 * (it revoked its lease, the view moves its groups within a lease poll) answers UNAVAILABLE
 * until it stops, and a group waiting for an in-sync member answers it at every member, so
 * the call goes round the group's members until its deadline. Retrying one server for a whole
 * probe interval instead held every call of a clean hand-over for 2 s. */
#define ROUTE_UNAVAILABLE_RETRIES 2

typedef struct routed {
    ps_client *c;
    /* the client's connections the call goes on, one per server */
    rpc_conn **conns;
    int group;  /* placement task the call is for */
    int target; /* server of the current attempt */
    int hops;
    bool capped;         /* the current attempt's deadline is the probe interval, not the call's */
    uint64_t sent_epoch; /* Envelope.epoch of the latest attempt */
    /* Slots moved: the client id the request goes with now (slots_stream_client of the
     * previous one and the server that refused it as moved); 0: the client's own. */
    uint64_t key;
    bool own_moves; /* the caller follows moved slots itself (a Step) */
    rpc_call_opts opts;
    uint64_t deadline_ns;
    rpc_build_fn build;
    rpc_done_fn done;
    void *arg;
} routed;

static int routed_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    routed *r = arg;
    int rv = r->build(r->arg, deadline_ms, out);
    bool replicated = r->c->replicated || atomic_load(&r->c->view_epoch) != 0;
    if (rv == 0 && r->key != 0 && !replicated) {
        /* Followed a moved slot: the same request (same seq) under the stream's key. */
        frame f;
        char err[128];
        if (frame_parse(*out, &f, err, sizeof(err)) != STATUS_OK) {
            nng_msg_free(*out);
            *out = NULL;
            return NNG_EINVAL;
        }
        f.env->client_id = r->key;
        nng_msg *m;
        rv = frame_build(&m, f.env, f.has_segment ? f.segment : NULL, f.segment_len, NULL);
        frame_fini(&f);
        nng_msg_free(*out);
        *out = rv == 0 ? m : NULL;
        return rv;
    }
    if (rv != 0 || r->target == r->group || !replicated)
        return rv;
    /* Another server than the task's own: name the group and the epoch the client knows. */
    frame f;
    char err[128];
    if (frame_parse(*out, &f, err, sizeof(err)) != STATUS_OK) {
        nng_msg_free(*out);
        *out = NULL;
        return NNG_EINVAL;
    }
    f.env->group = (uint32_t)r->group + 1;
    f.env->epoch = atomic_load(&r->c->view_epoch);
    r->sent_epoch = f.env->epoch;
    nng_msg *m;
    rv = frame_build(&m, f.env, f.has_segment ? f.segment : NULL, f.segment_len, NULL);
    frame_fini(&f);
    nng_msg_free(*out);
    *out = rv == 0 ? m : NULL;
    return rv;
}

static int attempt(routed *r);

static void routed_done(void *arg, int status, const char *message, const frame *reply)
{
    routed *r = arg;
    ps_client *c = r->c;
    if (reply && reply->env) {
        uint64_t e = reply->env->epoch, cur = atomic_load(&c->view_epoch);
        while (e > cur && !atomic_compare_exchange_weak(&c->view_epoch, &cur, e))
            ;
    }
    bool replicated = c->replicated || atomic_load(&c->view_epoch) != 0;
    bool time_left = time_now_ns() + 50000000ull < r->deadline_ns;
    int next = -1;
    if (!replicated && !r->own_moves && time_left && r->hops < ROUTE_MAX_HOPS &&
        status == STATUS_FAILED_PRECONDITION && reply && reply->env->moved_to != 0 &&
        (int)reply->env->moved_to - 1 != r->target && !atomic_load(&c->conns_closing) &&
        r->conns == c->servers &&
        (client_slots_refresh(c, reply->env->slots_version),
         (int)reply->env->moved_to - 1 < client_reach(c))) {
        /* The slots moved (replicas 1): the map was read again (connecting to servers that
         * joined) for later calls, and this one goes to the new owner as it is, under the key
         * of its stream to the server that refused it, whose exactly-once window came with
         * the slots. */
        uint64_t cur = r->key ? r->key : c->client_id;
        if (route_split_moved(c, r->conns, r->target, cur, &r->opts, r->build, r->arg, r->done,
                              r->arg) == 0) {
            free(r); /* the pieces answer the caller */
            return;
        }
        r->key = slots_stream_client(cur, (uint32_t)r->target);
        r->target = (int)reply->env->moved_to - 1;
        r->hops++;
        if (attempt(r) == 0)
            return;
    }
    if (replicated && time_left && r->hops < ROUTE_MAX_HOPS && !atomic_load(&c->conns_closing)) {
        if (status == STATUS_FAILED_PRECONDITION && reply && reply->env->primary != 0 &&
            (int)reply->env->primary - 1 < c->nservers &&
            ((int)reply->env->primary - 1 != r->target || reply->env->epoch > r->sent_epoch)) {
            /* The group moved, or the request named an older epoch than the server's. */
            next = (int)reply->env->primary - 1;
        } else if (reply == NULL &&
                   (status == STATUS_UNAVAILABLE || status == STATUS_DEADLINE_EXCEEDED)) {
            next = (r->target + 1) % c->nservers; /* no answer: ask the next server */
        } else if (reply != NULL && status == STATUS_UNAVAILABLE) {
            /* Still UNAVAILABLE after the attempt's retries (a server shutting down, or a
             * group waiting for a member): the next server, which serves the group, names its
             * primary, or is waiting too. */
            next = (r->target + 1) % c->nservers;
        } else if (reply != NULL && status == STATUS_DEADLINE_EXCEEDED && r->capped) {
            /* The server answered that a wait (a staleness bound) outlasted this attempt's
             * probe interval, which the server took as the request's deadline: the call's own
             * deadline has time left, so the same request (same seq: its pushes are not
             * applied twice) waits again there. */
            next = r->target;
        }
    }
    if (next >= 0) {
        /* Said once per move of the group (calls in flight together move it once). */
        if (next != r->target && atomic_exchange(&c->route[r->group], next) != next) {
            if (reply != NULL && status == STATUS_FAILED_PRECONDITION)
                log_info("group %d: ps %d says ps %d is its primary (view epoch %llu): following",
                         r->group, r->target, next, (unsigned long long)reply->env->epoch);
            else if (reply != NULL)
                log_info("group %d: ps %d answers %s (%s): asking ps %d", r->group, r->target,
                         status_name(status), message ? message : "", next);
            else
                log_info("group %d: no answer from ps %d (%s): asking ps %d", r->group, r->target,
                         message ? message : status_name(status), next);
        }
        r->target = next;
        r->hops++;
        if (attempt(r) == 0)
            return;
    }
    char msg[600];
    if (r->hops > 0 && reply == NULL && status == STATUS_DEADLINE_EXCEEDED) {
        /* The last attempt's deadline was a probe interval: say the call's. */
        snprintf(msg, sizeof(msg), "%s (%d attempts within the call's deadline of %u ms)",
                 message ? message : "no reply", r->hops + 1, r->opts.deadline_ms);
        message = msg;
    }
    r->done(r->arg, status, message, reply);
    free(r);
}

static int attempt(routed *r)
{
    ps_client *c = r->c;
    uint64_t now = time_now_ns();
    uint64_t left_ms = r->deadline_ns > now ? (r->deadline_ns - now) / 1000000u : 0;
    if (left_ms == 0)
        return STATUS_DEADLINE_EXCEEDED;
    rpc_call_opts o = r->opts;
    o.deadline_ms = (uint32_t)left_ms;
    bool down = rpc_conn_sockets_up(c->servers[r->target]) == 0;
    r->capped = false;
    if (c->replicated || atomic_load(&c->view_epoch) != 0) {
        /* A group waiting for one of its in-sync members answers UNAVAILABLE for as long as
         * that takes: retried (with backoff) through the attempt, then the next attempt, until
         * the call's own deadline, not given up after a few tries. */
        o.retries = ROUTE_UNAVAILABLE_RETRIES;
        uint32_t cap = down ? ROUTE_DOWN_PROBE_MS : ROUTE_PROBE_MS;
        r->capped = o.deadline_ms > cap;
        if (r->capped)
            o.deadline_ms = cap;
    }
    return rpc_conn_call(r->conns[r->target], &o, routed_build, routed_done, r);
}

int client_call_on(ps_client *c, rpc_conn **conns, int server, const rpc_call_opts *o,
                   rpc_build_fn build, rpc_done_fn done, void *arg)
{
    return client_call_keyed(c, conns, server, o, 0, build, done, arg);
}

static int call_keyed(ps_client *c, rpc_conn **conns, int server, const rpc_call_opts *o,
                      uint64_t key, bool own_moves, rpc_build_fn build, rpc_done_fn done,
                      void *arg);

int client_call_keyed(ps_client *c, rpc_conn **conns, int server, const rpc_call_opts *o,
                      uint64_t key, rpc_build_fn build, rpc_done_fn done, void *arg)
{
    return call_keyed(c, conns, server, o, key, false, build, done, arg);
}

int client_call_own_moves(ps_client *c, int server, const rpc_call_opts *o, uint64_t key,
                          rpc_build_fn build, rpc_done_fn done, void *arg)
{
    return call_keyed(c, c->servers, server, o, key, true, build, done, arg);
}

static int call_keyed(ps_client *c, rpc_conn **conns, int server, const rpc_call_opts *o,
                      uint64_t key, bool own_moves, rpc_build_fn build, rpc_done_fn done, void *arg)
{
    if (c->route == NULL || server < 0 || server >= client_reach(c))
        return rpc_conn_call(conns[server], o, build, done, arg);
    routed *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return STATUS_RESOURCE_EXHAUSTED;
    r->c = c;
    r->conns = conns;
    r->group = server;
    r->target = atomic_load(&c->route[server]);
    r->opts = *o;
    r->deadline_ns = time_now_ns() + (uint64_t)o->deadline_ms * 1000000u;
    r->build = build;
    r->done = done;
    r->arg = arg;
    r->key = key;
    r->own_moves = own_moves;
    int rv = attempt(r);
    if (rv != 0)
        free(r);
    return rv;
}

int client_call(ps_client *c, int server, const rpc_call_opts *o, rpc_build_fn build,
                rpc_done_fn done, void *arg)
{
    return client_call_on(c, c->servers, server, o, build, done, arg);
}
