/* Internals of libpsclient shared by its files. Not installed. */
#ifndef PSD_CLIENT_INTERNAL_H
#define PSD_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "acks.h"
#include "cluster.h"
#include "frame.h"
#include "options.h"
#include "psclient.h"
#include "rpc_client.h"
#include "slots_record.h"

struct ps_var {
    char *name;
    ps_var_spec spec; /* spec.name points at name */
    uint64_t numel;
    bool split;
    bool parts;        /* split in fixed parts placed by slot (then nservers is 0) */
    uint32_t nservers; /* cluster size the placement was computed for */
    uint32_t owner;    /* when not split */
    var_ack *ack;      /* per server of the client, made at the first push reply; ack_lock */
};

/* One server's heartbeat: at most one in flight, so a server that does not answer never
 * holds back the heartbeats to the others. */
typedef struct client_hb {
    struct ps_client *c;
    int server;
    atomic_bool busy;
    /* From the latest heartbeat reply (lock): when it came, and what this worker's calls
     * parked on the server wait for (ClockReply.parked_for, "" if none). The connection
     * watcher's hint (client_wait_hint) reads them. */
    pthread_mutex_t lock;
    uint64_t answered_ns;
    char parked_for[320];
} client_hb;

struct ps_client {
    int nservers; /* servers of the cluster spec: what placement (split ranges) is over */
    /* Servers this client has connections to: the spec's, then those that joined the cluster
     * (a slot map naming them, client_slots_refresh), up to cap_servers: the per-server arrays
     * (servers, route, next_seq) are that long from the open, and a new server's entries are
     * filled before the count is raised (release), so a reader of the count (client_reach,
     * acquire) sees them. Heartbeats go to the spec's servers only. */
    atomic_int nreach;
    int cap_servers;
    rpc_conn_config conn_cfg; /* how the spec's servers were connected (its strings below) */
    char *tls_ca, *tls_cert, *tls_key, *tls_name;
    /* Who holds each slot (client_slots_load): the static map of the cluster spec, or the
     * map published in the coordinator (slots_rec, which it points into). */
    slot_map slots;
    slots_record slots_rec;
    /* Maps read since (client_slots_refresh), kept until close: calls in flight may still
     * read the owner table of one (slots points into the newest). */
    slots_record *old_recs;
    size_t nold_recs;
    pthread_mutex_t slots_lock; /* guards the refresh (one at a time) */
    char slots_eps[512];        /* the coordinator ("": no refresh) */
    char slots_prefix[512];
    rpc_conn **servers;
    rpc_call_opts call;
    uint64_t chunk_elems;
    uint64_t split_threshold;
    bool split_parts; /* split-parts: new split variables in fixed parts */
    size_t max_message;
    int wire_dtype; /* Psd__V1__DType of tensor segments: FLOAT32, or BFLOAT16 (wire-dtype) */
    int32_t worker_id;
    uint64_t client_id;
    char admin_token[256]; /* admin-token-file's token, sent in every request; "" if none */
    atomic_uint_fast64_t next_request;
    /* Sequence numbers of updates, one stream per placement task (its replica group, or its
     * server with replicas 1): [nservers], see client_next_seq. */
    atomic_uint_fast64_t *next_seq;
    atomic_int_fast64_t clock;
    pthread_mutex_t lock; /* guards vars and the heartbeat state */
    ps_var **vars;
    size_t nvars, capvars;
    /* Heartbeats of a worker client (worker_id >= 0, heartbeat-ms > 0), on connections of
     * their own (hb_conns[i]: one socket to server i), so that data calls blocked on one
     * server, or a large tensor in a socket's queue, never delay them. */
    uint32_t heartbeat_ms;
    rpc_conn **hb_conns;
    client_hb *hb;
    pthread_t heartbeat;
    bool heartbeat_running, closing;
    bool finished; /* ps_worker_finished: heartbeats stopped (lock) */
    pthread_cond_t heartbeat_cond;
    /* Restarts seen in push replies (client_note_push). */
    pthread_mutex_t ack_lock;
    atomic_uint_fast64_t lost_updates;
    atomic_uint_fast64_t lost_pushes; /* this client's own acknowledged pushes among them */
    /* Replicated clusters (route.c): the highest view epoch a reply carried (0: unreplicated
     * so far) and, per placement task, the server its calls go to (its group's primary). */
    atomic_uint_fast64_t view_epoch;
    atomic_int *route;
    bool replicated; /* the replicas setting is above 1: follow primaries from the start */
    /* ps_client_close is closing the connections: a failed call is not sent to another
     * server's (it may be closed already). */
    atomic_bool conns_closing;
};

/* A sparse table's handle (tables.c); step.c reads it too. */
struct ps_table {
    ps_client *c;
    char *name;
    uint64_t name_hash; /* placement_hash(name), for slots_row_owner_h */
    uint32_t dim;
};
/* Starts a call for placement task `server` (route.c): rpc_conn_call on its connection, or on
 * its replica group's primary's once the cluster is known to be replicated, following the
 * primary across failovers until o->deadline_ms. Same contract as rpc_conn_call. */
int client_call(ps_client *c, int server, const rpc_call_opts *o, rpc_build_fn build,
                rpc_done_fn done, void *arg);
/* The same on conns (one per server, as c->servers: the heartbeat connections). */
int client_call_on(ps_client *c, rpc_conn **conns, int server, const rpc_call_opts *o,
                   rpc_build_fn build, rpc_done_fn done, void *arg);

/* Sets c->slots (client_slots.c): the map the servers published in the coordinator when one
 * is set (replicas 1), else the static map of cl. Returns PS_OK, or a status with
 * ps_last_error set (another cluster's map, a malformed one, a map that gives slots to a
 * server outside cl); a coordinator that does not answer leaves the static map (logged). */
int client_slots_load(ps_client *c, const options *o, const cluster_spec *cl);
static inline int client_reach(ps_client *c)
{
    return atomic_load_explicit(&c->nreach, memory_order_acquire);
}

/* Server of part `part` of the variable `name` (cut in parts) under map, among the servers
 * the client reaches; a slot given to a server not reached (yet) falls back to the static
 * owner of the spec, which answers where the slot went. */
static inline int client_part_owner(ps_client *c, const slot_map *map, const char *name,
                                    uint64_t part)
{
    uint32_t slot = slots_of_part(name, part, map->nslots);
    int owner = (int)slots_owner(map, slot);
    return owner < client_reach(c) ? owner : (int)(slot % (uint32_t)c->nservers);
}

/* After the spec's servers are connected at open: connects to the servers of the map read at
 * open that joined the cluster. Returns 0, or FAILED_PRECONDITION when a slot's owner cannot
 * be reached. */
int client_slots_connect(ps_client *c);
/* A server answered that slots moved (Envelope.moved_to) at map version `version`: re-reads
 * the map from the coordinator when it holds an older one, so that later calls go to the new
 * owners. Any thread. */
void client_slots_refresh(ps_client *c, uint64_t version);
/* route_split.c: a table request that server refused_by answered as moved, whose ids the
 * re-read map places on several servers, sent as one piece per server (same seq; key: the
 * client id it went with) and answered to done(arg) as one call. Returns 0 when it took the
 * call over, -1 when the ids are on one server now (or it cannot: memory, not a table call):
 * the caller goes on with the call as it is. */
/* client_call_on with the request sent under client id `key` (0: the client's own): a piece
 * of a table request cut after a move (route_split.c), which follows later moves as well. */
int client_call_keyed(ps_client *c, rpc_conn **conns, int server, const rpc_call_opts *o,
                      uint64_t key, rpc_build_fn build, rpc_done_fn done, void *arg);
/* client_call_keyed on the client's servers, except that a reply saying slots moved
 * (Envelope.moved_to) goes to done as it is: the caller (a Step, whose items may now be on
 * several servers) re-reads the map and resends the pieces itself. */
int client_call_own_moves(ps_client *c, int server, const rpc_call_opts *o, uint64_t key,
                          rpc_build_fn build, rpc_done_fn done, void *arg);
int route_split_moved(ps_client *c, rpc_conn **conns, int refused_by, uint64_t key,
                      const rpc_call_opts *opts, rpc_build_fn build, void *build_arg,
                      rpc_done_fn done, void *arg);
/* Frees the maps client_slots_load and client_slots_refresh read. */
void client_slots_free(ps_client *c);

/* Sets this thread's ps_last_error and returns status. */
int client_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The sequence number of a new update (a push piece) to placement task `server` (0 <= server <
 * nservers), from that task's own stream: its replica group's exactly-once window (one per group,
 * server/dedup.h) sees every number in turn, so the pieces a failover has the client resend are
 * as far apart there as the pieces in flight to that group, not as all those to every group. */
uint64_t client_next_seq(ps_client *c, int server);

/* Fills the common envelope fields for a request from this client. */
void client_envelope(ps_client *c, envelope *env, int method, uint32_t deadline_ms);

/* Packs body into env and builds the frame with the segment copied in. */
int client_build(envelope *env, const ProtobufCMessage *body, const void *segment,
                 size_t segment_len, nng_msg **out);

/* Like client_build, with room for segment_len bytes of segment left for the caller to fill
 * (*segment points at it). */
int client_build_segment(envelope *env, const ProtobufCMessage *body, size_t segment_len,
                         uint8_t **segment, nng_msg **out);

/* Operations (ops.c), shared by pulls, pushes and steps (step.c). An op completes when its
 * pending count reaches 0: client_op_new starts it at 1 (the starter's hold, dropped with a
 * client_op_release once every part is started); each part adds one with client_op_hold and
 * drops it with client_op_release, which records the first error (prefixed "ps N: " when
 * server >= 0) and, on the last release, runs the completion (waiters, callback). extra bytes
 * follow the op struct, zeroed. */
ps_op *client_op_new(ps_client *c, size_t extra, ps_done_fn cb, void *arg);
/* ext: state freed by ext_free when the op is destroyed; ext_complete(ext, status) runs once
 * when the op completes, before its waiters wake and its callback runs. */
void client_op_set_ext(ps_op *op, void *ext, void (*ext_free)(void *ext),
                       void (*ext_complete)(void *ext, int status));
void client_op_hold(ps_op *op, int n);
void client_op_release(ps_op *op, int server, int status, const char *message);
/* The first error recorded so far (STATUS_OK if none). */
int client_op_status(ps_op *op);
/* Starts an op whose state (ext) is the caller's, of nparts parts: makes the op (cb, arg),
 * attaches ext (client_op_set_ext), sets *out_op, holds the op for the nparts parts, calls
 * start(ext, op), which starts every part (each part, or start for a part that could not
 * start, releases its hold once), then drops the starter's hold. Returns PS_OK, or
 * PS_RESOURCE_EXHAUSTED (the op not made, ext freed with ext_free, start not called). */
int client_op_fanout(ps_client *c, ps_done_fn cb, void *arg, void *ext, void (*ext_free)(void *ext),
                     void (*ext_complete)(void *ext, int status), size_t nparts,
                     void (*start)(void *ext, ps_op *op), ps_op **out_op);

/* Sends `request` to each of servers[0..n) at once and waits for all. replies[i] receives the
 * unpacked reply of servers[i] (NULL on error); free with client_free_replies. Returns PS_OK or
 * the first error (with ps_last_error naming the server). Blocks. */
int client_unary(ps_client *c, const int *servers, int n, int method,
                 const ProtobufCMessage *request, const ProtobufCMessageDescriptor *reply_desc,
                 ProtobufCMessage **replies);
/* Same with explicit call options (deadline, retries). */
int client_unary_opts(ps_client *c, const rpc_call_opts *opts, const int *servers, int n,
                      int method, const ProtobufCMessage *request,
                      const ProtobufCMessageDescriptor *reply_desc, ProtobufCMessage **replies);
void client_free_replies(ProtobufCMessage **replies, int n);
int client_all_servers(ps_client *c, int **out);

/* Records a push reply of `server` for v (its Envelope.server_instance and PushReply version
 * and restored_version). When the server's instance changed since the last reply, logs once
 * how many updates acknowledged by the previous instance were lost and adds them to the
 * client's lost_updates. Thread-safe, does not block on the network. */
void client_note_push(ps_client *c, ps_var *v, int server, uint64_t instance, uint64_t version,
                      uint64_t restored_version);

/* The connection watcher's hint (rpc_conn_config.hint) for data calls to server
 * hb->server: what the latest heartbeat reply says about this worker's parked calls. */
bool client_wait_hint(void *hb, uint64_t since_ns, char *buf, size_t cap);

/* Adds a server's staleness statistics into out (max of maxima, sums of the rest). */
void client_add_staleness(ps_staleness_stats *out, const Psd__V1__StalenessStats *s);

#endif
