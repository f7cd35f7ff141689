/* State of one ps-server process and its RPC method table. */
#ifndef PSD_SERVER_SERVER_H
#define PSD_SERVER_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dedup.h"
#include "rpc_server.h"
#include "store.h"
#include "sync.h"

#define SERVER_MAX_WORKERS 4096

typedef struct server_state {
    uint32_t task_index;
    uint32_t num_servers;
    uint64_t start_ns;
    store *vars;
    dedup *dedup;
    rpc_server *rpc;
    atomic_uint_fast64_t updates_applied;
    atomic_uint_fast64_t duplicates_dropped;
    atomic_bool shutdown_requested;
    sync_state *sync;
    int32_t default_staleness; /* for specs that ask for the server's default (-2) */
    /* Variables created by clients, counted; bumped with the store's update lock held, so a
     * checkpoint's snapshot holds exactly the variables of create_gen <= its own. */
    atomic_uint_fast64_t create_gen;
    struct server_tables *tables;     /* sparse tables (table_rpc.c); NULL: none yet */
    uint64_t max_bytes;               /* max-server-bytes in force (server_set_limits) */
    atomic_uint_fast64_t table_bytes; /* bytes the tables hold */
    struct view_agent *view_agent;    /* replicas > 1: the failover agent (view_agent.h) */
} server_state;

/* The method table served by ps-server. */
extern const rpc_method server_methods[];
extern const size_t server_methods_len;

/* Sets the limits of st's store and dedup table: max_bytes 0 means 75% of physical memory
 * (max-server-bytes). Logs them. Returns 0, or -1 when memory can't be had. */
int server_set_limits(server_state *st, uint64_t max_bytes, uint64_t max_vars,
                      uint64_t dedup_max_clients, uint64_t dedup_idle_ms);

/* Checks a variable spec sent by a client: name, dtype, shape, placement against this
 * server's cluster. Returns 0 and the element count, or a status with a message in err. */
int server_check_spec(const server_state *st, const Psd__V1__VariableSpec *spec, uint64_t *numel,
                      char *err, size_t errlen);

/* Sparse tables over the wire (table_rpc.c). Ids per TablePull/TablePush request at most. */
#define SERVER_TABLE_MAX_IDS (1ull << 22)
/* Tables one server holds at most. */
#define SERVER_MAX_TABLES 1024
bool server_table_exists(server_state *st, const char *name);
/* Frees every table (at exit, no call in flight). */
void server_tables_free(server_state *st);
void handle_table_create(rpc_call *call, void *arg);
void handle_table_lookup(rpc_call *call, void *arg);
void handle_table_pull(rpc_call *call, void *arg);
void handle_table_push(rpc_call *call, void *arg);
/* Checkpoints of tables: a copy of every table (its packed TableSpec and each partition's
 * rows, oldest first), taken while updates are held off. */
typedef struct server_table_copy {
    uint8_t *spec;
    size_t spec_len;
    uint32_t row_floats, nparts;
    uint64_t rows;
    struct table_rows *parts;
} server_table_copy;
/* Returns 0 (*out NULL when there are no tables) or -1 when memory runs out. */
int server_tables_copy(server_state *st, server_table_copy **out, size_t *n);
void server_tables_copy_free(server_table_copy *c, size_t n);
struct table;
/* Makes an unregistered table from a packed TableSpec (restore). Returns 0, or -1 with a
 * message in err. */
int server_table_make(server_state *st, const uint8_t *spec, size_t len, struct table **out,
                      char *err, size_t errlen);
/* Registers t (made by server_table_make) under its name. Returns 0, or -1 when a table of
 * that name exists or memory runs out (t stays the caller's). */
int server_table_register(server_state *st, struct table *t, const uint8_t *spec, size_t len);
struct metrics_out;
/* Emits the tables' metrics (psd_server_tables, psd_table_*{table}) in a metrics collector. */
void server_tables_metrics(struct metrics_out *out, server_state *st);
/* The ABORTED message of a push dedup could not prove new (handlers.c). */
void server_push_refusal(dedup_result d, uint64_t client, uint64_t seq, uint64_t floor, char *err,
                         size_t errlen);

#endif
