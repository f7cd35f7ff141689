/* Who may call the RPC server (rpc_server.h): the admin role of RPC_ADMIN methods (the admin
 * token, or a loopback peer when the server has none) and, under mutual TLS (tls.c), the
 * policy that closes connections without a verified client certificate, logging each refused
 * address at most once a second (rpc_conns_refusal_due). Private to common/rpc_*.c. */
#ifndef PSD_COMMON_RPC_AUTH_H
#define PSD_COMMON_RPC_AUTH_H

#include <stdbool.h>

#include <nng/nng.h>

#include "rpc_server.h"

/* nng's pipe notification for NNG_PIPE_EV_ADD_PRE under TLS, arg the rpc_server: closes a
 * connection whose peer certificate was not verified, before it reaches the socket, and
 * hands the others (and every other event) on to rpc_conns_pipe_cb. */
void rpc_auth_tls_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg);

/* The admin role of c, whose method is RPC_ADMIN (rpc_server_config.admin_token). False: c
 * was answered with the refusal (UNAUTHENTICATED or PERMISSION_DENIED), which is logged. */
bool rpc_auth_check_admin(rpc_call *c);

#endif
