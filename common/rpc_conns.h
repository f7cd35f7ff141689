/* The RPC server's connections (rpc_server.c): counted through nng's pipe notifications, with
 * the two caps on them, max_connections (connections beyond it are closed as they arrive) and
 * max_per_connection (a connection's requests in progress beyond it are refused), and the rate
 * limit of the lines that say a connection was refused for its certificate (rpc_auth.c).
 *
 * Thread-safe: one mutex guards the table and the refusal lines. Private to common/rpc_*.c. */
#ifndef PSD_COMMON_RPC_CONNS_H
#define PSD_COMMON_RPC_CONNS_H

#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>

#include "log.h"

#define RPC_CONN_BUCKETS 256
#define RPC_REFUSAL_SLOTS 32

typedef struct rpc_conn rpc_conn;

/* The open connections by pipe id, and their requests in progress. Caller-owned memory:
 * rpc_conns_init, then rpc_conns_fini. */
typedef struct rpc_conns {
    pthread_mutex_t lock;
    rpc_conn *buckets[RPC_CONN_BUCKETS];
    int n;                  /* connections open */
    int max_connections;    /* 0: no cap */
    int max_per_connection; /* 0: no cap */
    /* The last "refused TLS connection" line per peer address. */
    struct rpc_refusal_log {
        char addr[INET6_ADDRSTRLEN + 16];
        log_every log;       /* its lines; not logged yet: slot unused */
        uint64_t suppressed; /* refusals from addr not logged since its last line */
    } refusals[RPC_REFUSAL_SLOTS];
    atomic_uint_fast64_t tls_refused; /* connections closed for want of a verified certificate */
} rpc_conns;

void rpc_conns_init(rpc_conns *cs, int max_connections, int max_per_connection);
/* Frees the table (every connection still in it). */
void rpc_conns_fini(rpc_conns *cs);

/* nng's pipe notification for NNG_PIPE_EV_ADD_PRE and NNG_PIPE_EV_REM_POST, arg the
 * rpc_conns: counts a connection in and out, closing (and logging) one beyond
 * max_connections. */
void rpc_conns_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg);

/* Counts a request in the requests in progress of connection `pipe`; false when that is at
 * max_per_connection. *counted tells whether it was counted (then rpc_conns_release it once):
 * a connection unknown here (closed meanwhile) is not limited, its reply goes nowhere. */
bool rpc_conns_admit(rpc_conns *cs, uint32_t pipe, bool *counted);
/* Takes a counted request off connection `pipe`'s requests in progress. */
void rpc_conns_release(rpc_conns *cs, uint32_t pipe);

/* Rate limit of the refusal lines (a refused client redials many times a second): true when
 * a refusal from peer ("address:port") is to be logged now, at most once a second per
 * address; *suppressed then gets how many refusals from that address were not logged since
 * its last line, over *since_s seconds. RPC_REFUSAL_SLOTS addresses are remembered, the least
 * recently logged one giving way to a new one (its count not logged is lost). */
bool rpc_conns_refusal_due(rpc_conns *cs, const char *peer, uint64_t *suppressed, double *since_s);

#endif
