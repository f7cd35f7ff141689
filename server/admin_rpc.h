/* The server's own methods (admin_rpc.c): Clock, ServerStatus, Checkpoint and Shutdown. */
#ifndef PSD_SERVER_ADMIN_RPC_H
#define PSD_SERVER_ADMIN_RPC_H

#include "rpc_server.h"

void handle_clock(rpc_call *call, void *arg);
/* Counters, the workers and per-variable entries: only the variable asked for by name, or at
 * most max_variables in name order and never more than fit in a reply body
 * (rpc_call_max_reply_body); num_variables always counts them all; then the tables. */
void handle_server_status(rpc_call *call, void *arg);
void handle_checkpoint(rpc_call *call, void *arg);
void handle_shutdown(rpc_call *call, void *arg);

#endif
