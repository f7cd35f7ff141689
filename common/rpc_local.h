/* What replication uses of the RPC server, private part (the public one is in rpc_server.h:
 * held requests, rpc_server_open_local and its handle functions). Private to common/rpc_*.c. */
#ifndef PSD_COMMON_RPC_LOCAL_H
#define PSD_COMMON_RPC_LOCAL_H

#include "rpc_server.h"

/* Lets go of c's request message: freed, or left to the references taken on it
 * (rpc_call_hold_request). Clears c's request bytes. */
void rpcs_free_request(rpc_call *c);

#endif
