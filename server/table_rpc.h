/* Sparse tables over the wire: the handlers of TableCreate, TableLookup, TablePull, TablePush,
 * TablePrefetch and TableExport, for the server's method table (methods.c). */
#ifndef PSD_SERVER_TABLE_RPC_H
#define PSD_SERVER_TABLE_RPC_H

#include "rpc_server.h"

void handle_table_create(rpc_call *call, void *arg);
void handle_table_lookup(rpc_call *call, void *arg);
void handle_table_pull(rpc_call *call, void *arg);
void handle_table_push(rpc_call *call, void *arg);
void handle_table_prefetch(rpc_call *call, void *arg);
void handle_table_export(rpc_call *call, void *arg);

#endif
