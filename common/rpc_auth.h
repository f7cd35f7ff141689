/* Who may call the RPC server (rpc_server.h): the admin role of RPC_ADMIN methods (the admin
 * token, or a loopback peer when the server has none) and, under mutual TLS (tls.c), the
 * policy that closes connections without a verified client certificate, logging each refused
 * address at most once a second. Private to common/rpc_*.c. */
#ifndef PSD_COMMON_RPC_AUTH_H
#define PSD_COMMON_RPC_AUTH_H

#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>

#include "log.h"
#include "rpc_server.h"

#define RPC_REFUSAL_SLOTS 32

/* The last "refused TLS connection" line per peer address. Caller-owned memory:
 * rpc_refusals_init, then rpc_refusals_fini. */
typedef struct rpc_refusals {
    pthread_mutex_t lock;
    struct rpc_refusal_log {
        char addr[INET6_ADDRSTRLEN + 16];
        log_every log;       /* its lines; not logged yet: slot unused */
        uint64_t suppressed; /* refusals from addr not logged since its last line */
    } slot[RPC_REFUSAL_SLOTS];
    atomic_uint_fast64_t refused; /* connections closed for want of a verified certificate */
} rpc_refusals;

void rpc_refusals_init(rpc_refusals *r);
void rpc_refusals_fini(rpc_refusals *r);

/* nng's pipe notification for NNG_PIPE_EV_ADD_PRE under TLS, arg the rpc_server: closes a
 * connection whose peer certificate was not verified, before it reaches the socket, and
 * hands the others (and every other event) on to rpc_conns_pipe_cb. */
void rpc_auth_tls_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg);

/* The admin role of c, whose method is RPC_ADMIN (rpc_server_config.admin_token). False: c
 * was answered with the refusal (UNAUTHENTICATED or PERMISSION_DENIED), which is logged. */
bool rpc_auth_check_admin(rpc_call *c);

#endif
