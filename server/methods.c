/* The method table of ps-server: each method's request type, handler and flags. RPC_LOGGED
 * marks the methods that change state: a replicated group's primary logs them and its backups
 * apply them in log order (repl_route.c reads the flag: server_method_logged). */
#include "methods.h"

#include "admin_rpc.h"
#include "server.h"
#include "slot_gate.h"
#include "slot_move_rpc.h"
#include "status.h"
#include "step_rpc.h"
#include "table_rpc.h"
#include "update.h"
#include "var_rpc.h"

/* REPLICATE on a server that does not replicate (replicas 1). */
static void refuse_replicate(rpc_call *call, void *arg)
{
    (void)arg;
    rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                    "this server runs with replicas 1: it holds no replica group");
}

/* The handlers of requests that touch slots, inside the slot gate (slot_gate.h): refused
 * while a slot they update is moving, or once one they touch moved away. */
#define GATED(h)                                                                                   \
    static void gated_##h(rpc_call *call, void *arg)                                               \
    {                                                                                              \
        if (!slot_gate_enter(call, arg))                                                           \
            return;                                                                                \
        h(call, arg);                                                                              \
        slot_gate_leave();                                                                         \
    }
GATED(handle_var_create)
GATED(handle_var_pull)
GATED(handle_push)
GATED(handle_push_pull)
GATED(handle_assign)
GATED(handle_step)
GATED(handle_table_pull)
GATED(handle_table_push)
GATED(handle_table_prefetch)

const rpc_method server_methods[] = {
    {PSD__V1__METHOD__CREATE_VARIABLE, "CreateVariable",
     &psd__v1__create_variable_request__descriptor, gated_handle_var_create, RPC_LOGGED},
    {PSD__V1__METHOD__LOOKUP_VARIABLE, "LookupVariable",
     &psd__v1__lookup_variable_request__descriptor, handle_var_lookup, 0},
    {PSD__V1__METHOD__LIST_VARIABLES, "ListVariables", &psd__v1__list_variables_request__descriptor,
     handle_var_list, 0},
    {PSD__V1__METHOD__PULL, "Pull", &psd__v1__pull_request__descriptor, gated_handle_var_pull,
     RPC_RANGE | RPC_REPLY_RANGE},
    {PSD__V1__METHOD__PUSH, "Push", &psd__v1__push_request__descriptor, gated_handle_push,
     RPC_RANGE | RPC_SEGMENT | RPC_LOGGED},
    {PSD__V1__METHOD__PUSH_PULL, "PushPull", &psd__v1__push_request__descriptor,
     gated_handle_push_pull, RPC_RANGE | RPC_SEGMENT | RPC_REPLY_RANGE | RPC_LOGGED},
    {PSD__V1__METHOD__ASSIGN, "Assign", &psd__v1__push_request__descriptor, gated_handle_assign,
     RPC_RANGE | RPC_SEGMENT | RPC_LOGGED},
    {PSD__V1__METHOD__CLOCK, "Clock", &psd__v1__clock_request__descriptor, handle_clock,
     RPC_POOL | RPC_LOGGED},
    {PSD__V1__METHOD__SERVER_STATUS, "ServerStatus", &psd__v1__server_status_request__descriptor,
     handle_server_status, 0},
    {PSD__V1__METHOD__CHECKPOINT, "Checkpoint", &psd__v1__checkpoint_request__descriptor,
     handle_checkpoint, RPC_ADMIN},
    {PSD__V1__METHOD__SHUTDOWN, "Shutdown", &psd__v1__shutdown_request__descriptor, handle_shutdown,
     RPC_ADMIN},
    {PSD__V1__METHOD__DELETE_VARIABLE, "DeleteVariable",
     &psd__v1__delete_variable_request__descriptor, handle_var_delete, RPC_ADMIN | RPC_LOGGED},
    {PSD__V1__METHOD__STEP, "Step", &psd__v1__step_request__descriptor, gated_handle_step,
     RPC_MAY_SEGMENT | RPC_LOGGED},
    {PSD__V1__METHOD__TABLE_CREATE, "TableCreate", &psd__v1__table_create_request__descriptor,
     handle_table_create, RPC_LOGGED},
    {PSD__V1__METHOD__TABLE_LOOKUP, "TableLookup", &psd__v1__table_lookup_request__descriptor,
     handle_table_lookup, 0},
    {PSD__V1__METHOD__TABLE_PULL, "TablePull", &psd__v1__table_pull_request__descriptor,
     gated_handle_table_pull, RPC_SEGMENT},
    {PSD__V1__METHOD__TABLE_PUSH, "TablePush", &psd__v1__table_push_request__descriptor,
     gated_handle_table_push, RPC_SEGMENT | RPC_LOGGED},
    {PSD__V1__METHOD__TABLE_PREFETCH, "TablePrefetch", &psd__v1__table_prefetch_request__descriptor,
     gated_handle_table_prefetch, RPC_SEGMENT},
    {PSD__V1__METHOD__TABLE_EXPORT, "TableExport", &psd__v1__table_export_request__descriptor,
     handle_table_export, RPC_ADMIN | RPC_POOL},
    /* Moving slots between live servers: psctl's (admin), and the servers' own (the cluster
     * token). */
    {PSD__V1__METHOD__SLOT_MOVE, "SlotMove", &psd__v1__slot_move_request__descriptor,
     handle_slot_move, RPC_ADMIN | RPC_POOL},
    {PSD__V1__METHOD__SLOT_INSTALL, "SlotInstall", &psd__v1__slot_install_request__descriptor,
     handle_slot_install, RPC_POOL | RPC_MAY_SEGMENT},
    /* Replication's own (the cluster token); replica_start puts its handler in its table. */
    {PSD__V1__METHOD__REPLICATE, "Replicate", &psd__v1__replicate_request__descriptor,
     refuse_replicate, RPC_POOL | RPC_MAY_SEGMENT},
};
const size_t server_methods_len = sizeof(server_methods) / sizeof(server_methods[0]);

bool server_method_logged(int method)
{
    for (size_t i = 0; i < server_methods_len; i++)
        if (server_methods[i].method == method)
            return (server_methods[i].flags & RPC_LOGGED) != 0;
    return false;
}
