/* The RPC server's connections and their caps (rpc_conns.h). */
#include "rpc_conns.h"

#include <stdlib.h>

#include "log.h"

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
