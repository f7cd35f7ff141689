/* The RPC server's connections, their caps and the log of refused ones (rpc_conns.h). */
#include "rpc_conns.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "timeutil.h"

#define REFUSAL_LOG_INTERVAL_MS 1000

struct rpc_conn {
    uint32_t pipe;
    int inflight;
    rpc_conn *next;
};

void rpc_conns_init(rpc_conns *cs, int max_connections, int max_per_connection)
{
    pthread_mutex_init(&cs->lock, NULL);
    for (int i = 0; i < RPC_CONN_BUCKETS; i++)
        cs->buckets[i] = NULL;
    cs->n = 0;
    cs->max_connections = max_connections;
    cs->max_per_connection = max_per_connection;
    memset(cs->refusals, 0, sizeof(cs->refusals));
    atomic_init(&cs->tls_refused, 0);
}

void rpc_conns_fini(rpc_conns *cs)
{
    for (int i = 0; i < RPC_CONN_BUCKETS; i++) {
        while (cs->buckets[i]) {
            rpc_conn *e = cs->buckets[i];
            cs->buckets[i] = e->next;
            free(e);
        }
    }
    pthread_mutex_destroy(&cs->lock);
}

static rpc_conn **conn_slot(rpc_conns *cs, uint32_t pipe)
{
    rpc_conn **p = &cs->buckets[(pipe * 2654435761u) % RPC_CONN_BUCKETS];
    while (*p && (*p)->pipe != pipe)
        p = &(*p)->next;
    return p;
}

void rpc_conns_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    rpc_conns *cs = arg;
    uint32_t id = (uint32_t)nng_pipe_id(p);
    pthread_mutex_lock(&cs->lock);
    rpc_conn **slot = conn_slot(cs, id);
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        if (cs->max_connections > 0 && cs->n >= cs->max_connections) {
            int n = cs->n;
            pthread_mutex_unlock(&cs->lock);
            log_warn("connection refused: %d connections open (max-connections)", n);
            nng_pipe_close(p);
            return;
        }
        rpc_conn *e = *slot == NULL ? calloc(1, sizeof(*e)) : NULL;
        if (e) {
            e->pipe = id;
            *slot = e;
            cs->n++;
        }
    } else if (ev == NNG_PIPE_EV_REM_POST && *slot) {
        rpc_conn *e = *slot;
        *slot = e->next;
        free(e);
        cs->n--;
    }
    pthread_mutex_unlock(&cs->lock);
}

bool rpc_conns_admit(rpc_conns *cs, uint32_t pipe, bool *counted)
{
    pthread_mutex_lock(&cs->lock);
    rpc_conn *e = *conn_slot(cs, pipe);
    bool ok = e == NULL || e->inflight < cs->max_per_connection;
    if (e && ok) {
        e->inflight++;
        *counted = true;
    }
    pthread_mutex_unlock(&cs->lock);
    return ok;
}

void rpc_conns_release(rpc_conns *cs, uint32_t pipe)
{
    pthread_mutex_lock(&cs->lock);
    rpc_conn *e = *conn_slot(cs, pipe);
    if (e && e->inflight > 0)
        e->inflight--;
    pthread_mutex_unlock(&cs->lock);
}

bool rpc_conns_refusal_due(rpc_conns *cs, const char *peer, uint64_t *suppressed, double *since_s)
{
    char addr[sizeof(cs->refusals[0].addr)];
    const char *colon = strrchr(peer, ':');
    size_t n = colon != NULL && colon != peer ? (size_t)(colon - peer) : strlen(peer);
    if (n >= sizeof(addr))
        n = sizeof(addr) - 1;
    memcpy(addr, peer, n);
    addr[n] = '\0';
    uint64_t now = time_now_ns();
    bool due = true;
    *suppressed = 0;
    *since_s = 0;
    pthread_mutex_lock(&cs->lock);
    struct rpc_refusal_log *e = NULL, *oldest = &cs->refusals[0];
    for (int i = 0; i < RPC_REFUSAL_SLOTS && e == NULL; i++) {
        struct rpc_refusal_log *r = &cs->refusals[i];
        if (r->log.logged && strcmp(r->addr, addr) == 0)
            e = r;
        else if (oldest->log.logged && (!r->log.logged || r->log.last_ns < oldest->log.last_ns))
            oldest = r;
    }
    if (e == NULL) {
        e = oldest;
        memcpy(e->addr, addr, n + 1);
        log_every_reset(&e->log);
        e->suppressed = 0;
    }
    uint64_t last_ns = e->log.last_ns;
    bool again = e->log.logged;
    if (log_every_due(&e->log, REFUSAL_LOG_INTERVAL_MS, now)) {
        if (again) {
            *suppressed = e->suppressed;
            *since_s = (double)(now - last_ns) / 1e9;
        }
        e->suppressed = 0;
    } else {
        e->suppressed++;
        due = false;
    }
    pthread_mutex_unlock(&cs->lock);
    return due;
}
