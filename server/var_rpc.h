/* Dense variables over the wire (var_rpc.c): their handlers, the checks of a spec and of a range
 * against this server's shard, and what the listing methods share. */
#ifndef PSD_SERVER_VAR_RPC_H
#define PSD_SERVER_VAR_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "rpc_server.h"
#include "store.h"

typedef struct server_state server_state;

/* Room kept in a reply for the envelope and the fields other than a listing. */
#define REPLY_RESERVE 4096

/* Bytes a repeated message field entry of packed size n adds: tag, length, body. */
static inline size_t reply_entry_bytes(size_t n)
{
    return 1 + 10 + n;
}

/* Checks a variable spec sent by a client: name, dtype, shape, placement against this
 * server's cluster. Returns 0 and the element count, or a status with a message in err. */
int server_check_spec(const server_state *st, const Psd__V1__VariableSpec *spec, uint64_t *numel,
                      char *err, size_t errlen);
/* All variables sorted by name (bytewise), or NULL when memory can't be had; each referenced
 * (store_list_release). A variable cut in parts is listed once, by its head. */
variable **var_sorted_vars(server_state *st, size_t *n);
/* The head and the parts held of the variable `name` cut in parts, by offset (the head
 * first), each referenced (store_list_release); NULL when memory can't be had. */
variable **var_parts_of(server_state *st, const char *name, size_t *n);
/* Finds the variable (referenced: the caller releases it) and checks that the range
 * [off, off+cnt) lies in this server's shard. Returns NULL with the status and a message in
 * err otherwise. */
variable *var_find_range(server_state *st, const char *name, uint64_t off, uint64_t cnt,
                         int *status, char *err, size_t errlen);
/* var_find_range for a Pull/Push/PushPull request's range (Envelope.tensor); replies with the
 * error and returns NULL when it fails. */
variable *var_resolve_range(server_state *st, rpc_call *call, const char *name);

void handle_var_create(rpc_call *call, void *arg);
void handle_var_lookup(rpc_call *call, void *arg);
/* Pages in name order: page_size entries at most (0: no count limit) and never more than fit
 * in a reply body (rpc_call_max_reply_body: max-message-bytes and the envelope's 1 MiB bound);
 * next_page_token is the last name listed while more follow. */
void handle_var_list(rpc_call *call, void *arg);
void handle_var_pull(rpc_call *call, void *arg);
/* Admin: DeleteVariable, of a variable or a table. */
void handle_var_delete(rpc_call *call, void *arg);

#endif
