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
    /* A replica group's state (replicas > 1): its tables' rows expire only through sweeps its
     * primary logs (server_tables_sweep_due), never on a push by the copy's own clock. */
    bool replicated;
    /* The running checkpointer of this state (checkpointer_of), NULL: none. */
    struct checkpointer *_Atomic ck;
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
/* DeleteVariable naming a table: unlinks it (held against a checkpoint's copy like an update),
 * so that calls still holding it answer NOT_FOUND and its memory goes back to
 * max-server-bytes once the last of them is done; the name may be created again at once.
 * Returns 0, or -1 when this server holds no table of that name. */
int server_table_delete(server_state *st, const char *name);
/* Frees every table (at exit, no call in flight). */
void server_tables_free(server_state *st);
void handle_table_create(rpc_call *call, void *arg);
void handle_table_lookup(rpc_call *call, void *arg);
void handle_table_pull(rpc_call *call, void *arg);
void handle_table_push(rpc_call *call, void *arg);
/* A table as the Step handler uses it (table_rpc.c): found by name and referenced, so that it
 * stays valid for the call. */
typedef struct table_entry server_table;
/* The table `name`, referenced (server_table_put), or NULL with *status NOT_FOUND and a
 * message in err (saying so when the name is a dense variable's). */
server_table *server_table_get(server_state *st, const char *name, int *status, char *err,
                               size_t errlen);
void server_table_put(server_table *e);
const char *server_table_name(const server_table *e);
uint32_t server_table_dim(const server_table *e);
int32_t server_table_staleness(const server_table *e);
/* True once the table was deleted (its calls in flight answer NOT_FOUND). */
bool server_table_deleted(const server_table *e);
/* Copies n ids (int64 little-endian, 8 x n bytes of seg, any alignment) into *ids (malloc'd)
 * and checks that n is in 1..SERVER_TABLE_MAX_IDS and this server owns each. Returns
 * STATUS_OK, or a status with a message naming the table, the id and its owner. */
int server_table_ids(server_state *st, const server_table *e, const uint8_t *seg, uint64_t n,
                     int64_t **ids, char *err, size_t errlen);
/* Writes the rows of ids[0..n) into dst (n x dim values of dtype, any alignment). Returns 0,
 * or -1 when memory runs out. */
int server_table_read(server_table *e, const int64_t *ids, uint64_t n, uint8_t *dst, int dtype);
/* A push of n gradient rows (n x dim values of dtype, any alignment), exactly once by
 * (client, seq) like a dense push: STATUS_OK with *duplicate set, or ABORTED (dedup could not
 * prove it new), INVALID_ARGUMENT (a non-finite gradient: nothing applied, seq not marked),
 * RESOURCE_EXHAUSTED, each with a message in err. */
int server_table_push(server_state *st, server_table *e, uint64_t client, uint64_t seq,
                      int32_t worker, const int64_t *ids, uint64_t n, const uint8_t *grads,
                      int dtype, bool *duplicate, char *err, size_t errlen);
void handle_table_export(rpc_call *call, void *arg);
/* Checkpoints of tables: a cut of every table (table.h's table_cut: its packed TableSpec and
 * each partition's rows, oldest first, whole or changed since the previous cut). */
typedef struct server_table_copy {
    uint8_t *spec;
    size_t spec_len;
    uint32_t row_floats, nparts;
    uint64_t rows;                  /* rows copied (after server_tables_copy_finish) */
    uint64_t removed;               /* removed ids copied (delta cuts) */
    bool delta;                     /* changes since the cut `base`, else every row */
    const struct table_rows *parts; /* [nparts], after server_tables_copy_finish */
    struct table_cut *cut;
} server_table_copy;
/* Cuts of every table, in three steps. server_tables_copy_prepare (before holding updates
 * off: it allocates the copies' memory, table_cut_prepare) fills *out, *n. server_tables_copy
 * (with every update held off, store_freeze) takes them, starts a cut of every table
 * registered now (table_cut_start; a table created since the prepare is prepared there, one
 * deleted since is dropped) and puts the started cuts in *out, *n: O(tables). base: the id of
 * the previous chain cut for deltas (0: whole); id: this cut's (table_cut_id_new: chain cuts,
 * which consume the tables' change marks; 0: snapshot cuts, whole, which leave them to the
 * chain); track: record removals. Both return 0 (*out NULL when there are no tables) or -1
 * when memory runs out (free *out anyway). Only the checkpointer of a chain may take its chain
 * cuts (another chain cut of a table makes the chain's next cut of it whole). */
int server_tables_copy_prepare(server_state *st, uint64_t base, server_table_copy **out, size_t *n);
int server_tables_copy(server_state *st, uint64_t base, uint64_t id, bool track,
                       server_table_copy **out, size_t *n);
/* Copies what the cuts still need, after updates are let go again (each partition under its
 * own lock). Returns 0, or -1 when memory ran out. */
int server_tables_copy_finish(server_table_copy *c, size_t n);
void server_tables_copy_free(server_table_copy *c, size_t n);
struct table;
/* Makes an unregistered table from a packed TableSpec (restore). Returns 0, or -1 with a
 * message in err. */
int server_table_make(server_state *st, const uint8_t *spec, size_t len, struct table **out,
                      char *err, size_t errlen);
/* Registers t (made by server_table_make) under its name. Returns 0, or -1 when a table of
 * that name exists or memory runs out (t stays the caller's). */
int server_table_register(server_state *st, struct table *t, const uint8_t *spec, size_t len);
/* ServerStatus: this server's part of every table (only the one named `only` when it is
 * non-empty), in name order, in *out (free with server_tables_status_free). Returns 0, or -1
 * when memory runs out (*out NULL). */
int server_tables_status(server_state *st, const char *only, Psd__V1__TableStatus ***out,
                         size_t *n);
void server_tables_status_free(Psd__V1__TableStatus **ts, size_t n);
/* Tables held. */
size_t server_tables_count(server_state *st);
/* BSP tables (staleness 0): applies each one's aggregate of the clock that every live worker
 * has passed, as one push of the summed rows (divided per row by the number of pushes that
 * touched it when mean). Called by the sync module when the slowest live worker's clock moves
 * forward, before the pulls it allows are answered. */
void server_tables_bsp_apply(server_state *st, bool mean);
/* Points st's tables' memory accounting at st (after st's contents were copied in from
 * another state). */
void server_tables_rebind(server_state *st);
/* A replica group's primary: calls log_sweep for each table with a ttl_ms whose rows were last
 * swept a second ago or more (and notes the sweep as done); the sweep is logged as an internal
 * TablePush (sweep) and applied by every copy at the same point of the log. */
void server_tables_sweep_due(server_state *st, void (*log_sweep)(void *arg, const char *name),
                             void *arg);
/* h extended (FNV-1a) by every table of st in name order (BSP aggregates included): its name,
 * then each row by id: the id, its parameters and optimizer slots (not its update time). For
 * comparing replicas in tests and tools; copies each table's rows to sort them. */
uint64_t server_tables_checksum(server_state *st, uint64_t h);
struct metrics_out;
/* Emits the tables' metrics (psd_server_tables, psd_table_*{table}) in a metrics collector. */
void server_tables_metrics(struct metrics_out *out, server_state *st);
/* The ABORTED message of a push dedup could not prove new (handlers.c). */
void server_push_refusal(dedup_result d, uint64_t client, uint64_t seq, uint64_t floor, char *err,
                         size_t errlen);

#endif
