/* Replica groups (replicas r > 1): server s holds its own group s and backup copies of groups
 * s-1 .. s-r+1, each a whole server_state (store, tables, dedup window, clocks). Requests name
 * their group (Envelope.group; absent: the server's own task) and the view epoch they were sent
 * under (Envelope.epoch; older than the server's is refused, naming the current primary).
 *
 * Update path: the primary of a group runs each updating request under the group's order lock,
 * numbers it with the group's log sequence number (lsn), applies it, and streams the request
 * as received to every backup of the current view in lsn order (REPLICATE, batched: one batch in
 * flight per backup while the next one fills). Backups apply the same requests with the same
 * handlers in the same order, so that dedup verdicts, clocks and values come out identical. The
 * client's reply leaves only once every backup of the view applied the request (the call is
 * parked meanwhile, the order lock already released). A backup that leaves the view stops being
 * waited for (the group runs degraded, logged and counted in psd_replica_degraded_groups).
 *
 * With replicas = 1 nothing of this runs: the method table is server_methods as it is. */
#ifndef PSD_SERVER_REPLICA_H
#define PSD_SERVER_REPLICA_H

#include <stdbool.h>
#include <stdint.h>

#include "rpc_client.h"
#include "rpc_server.h"
#include "server.h"
#include "view.h"
#include "view_agent.h"

typedef struct replica_config {
    uint32_t self;        /* this server's task index */
    uint32_t num_servers; /* of the cluster spec */
    uint32_t replicas;    /* 2 .. num_servers */
    /* Dial URLs of every server (tls+tcp:// when tls is on), num_servers of them. */
    const char *const *urls;
    rpc_tls tls;
    size_t max_message; /* max-message-bytes: bounds a REPLICATE batch */
    /* For the backup groups' states, as the server's own was made. */
    uint32_t dedup_window;
    int32_t default_staleness;
    int n_workers;
    uint32_t worker_timeout_ms;
    bool bsp_mean;
    uint64_t max_bytes, max_vars, dedup_max_clients, dedup_idle_ms;
    uint64_t cluster_hash; /* checkpoint_cluster_hash: copies travel as checkpoint images */
    /* A coordinator keeps the view (replica_attach_agent, replica_on_view_event): nothing is
     * served until its first view. false: a fixed view, every server up (tests). */
    bool coordinated;
    uint32_t lease_ms; /* lease-ms: a rejoining backup out of reach for two is not waited for */
    /* Checkpoints (checkpoint-dir set; NULL own_ck: off). own_ck, the own group's running
     * checkpointer, records the group's log position (record 9). A group this server takes
     * over is checkpointed while it serves it, with ckpt's settings, into
     * <dir>/group-copies-<self>/ (ckpt-<group>-<seq>.psc), from where the next start restores
     * it, as the own group's position (own_restored) comes from the file main restored. */
    struct checkpointer *own_ck;
    const struct checkpoint_config *ckpt;
    bool own_restored;
    uint64_t own_epoch, own_lsn;
} replica_config;

/* Makes the backup groups and the replication streams of this server around its own group's
 * state own (own->task_index == cfg->self). The initial view: epoch 1, every server live, every
 * group served by its placement server, until replica_set_view installs another. Returns 0, or
 * -1 with a message in err. One node per process. */
int replica_start(const replica_config *cfg, server_state *own, char *err, size_t errlen);

/* The copies of groups this server restored with a log position (the own group's and those
 * of <dir>/group-copies-<self>/), for the view agent to publish (view_agent_config.copies): at
 * most cap into out; returns how many. */
size_t replica_restored_copies(view_copy *out, size_t cap);

/* The method table to serve instead of server_methods (same methods, each one routed to the
 * request's group, plus REPLICATE), and the handler argument to serve it with. */
const rpc_method *replica_methods(size_t *n);
void *replica_handler_arg(void);

/* REPLICATE (in server_methods): a backup applies a batch of its primary's log; with checksum
 * set, any member answers a checksum of its copy of the group. */
void replica_handle_replicate(rpc_call *call, void *arg);

/* Tells the node which rpc_server serves it (replies carry its epoch) once it is started. */
void replica_set_server(rpc_server *rpc);

/* Installs a new view (the coordinator's callback): groups this server now serves as primary
 * start serving and streaming; backups that left the view are no longer waited for; requests
 * sent under older epochs are refused from now on. Views not newer than the current one are
 * ignored. Any thread. */
void replica_set_view(const view *v);

/* The coordinator's agent (view_agent.h): rejoining groups that caught up are marked on it,
 * and whether its lease is this incarnation's decides whether a view's self is this one. */
void replica_attach_agent(view_agent *a);
/* The agent's callback (view_agent_fn, arg unused): new views, lease lost (out of every view
 * from now on: rejoin), lease uncertain (groups without a backup in the view acknowledge nothing
 * until it is renewed). */
void replica_on_view_event(void *arg, view_event ev, const view *v);

/* The view in force (a copy). */
void replica_get_view(view *out);

/* Liveness and wait deadlines (sync_sweep) of the groups other than its own this server is
 * primary of (it took them over): their workers are evicted when silent, as in its own group.
 * A no-op when replica_start was not called. */
void replica_sweep(void);
/* Whether this server sweeps its own group (evicts its silent workers, ends expired waits):
 * only while it serves it. A backup's clock table changes only through the log, so that a
 * worker its primary still waits for is never evicted on the copy that takes over. */
bool replica_sweeps_own(void);

/* Groups this server is primary of whose backups are not all in the view (the metric). */
uint32_t replica_degraded_groups(void);

/* A clean stop, after the lease is given up (view_agent_leave): waits, at most a second (and
 * lease-ms), for the view that moves this server's groups to other members, while requests are
 * still served.
 * Its installation answers the calls parked here with the new primary's name, so that their
 * clients go there at once instead of waiting out a probe interval for a server that closed
 * its sockets. Returns at once with a fixed view, when this server is primary of no group, or when
 * no backup of a group it serves is in the view. A no-op when replica_start was not called. */
void replica_await_handover(void);

/* Stops the streams and answers the calls still waiting for backups with UNAVAILABLE (before
 * rpc_server_stop). A no-op when replica_start was not called. */
void replica_stop(void);
/* Writes the final checkpoint of each group this server took over and still serves, frees the
 * backup groups (after rpc_server_stop), and leaves the own group's checkpointer with the
 * group's last log position for its final checkpoint. */
void replica_free(void);

#endif
