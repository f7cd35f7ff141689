/* What the replication files share (server/repl_*.c, replica.c): a group's copy and its log
 * (rgroup, rop), the members it streams to (rpeer), the process's replication state (repl) and
 * the functions one file offers the others. replica.h is the interface to the rest of the server.
 *
 * Files, bottom to top (each calls only those below it): repl_group.c (the process's state,
 * states made for copies), repl_log.c (the log and its commit), repl_progress.c (the streams to
 * the backups), repl_route.c (requests to the group's primary, logged), repl_ckpt.c
 * (checkpoints of groups taken over), repl_copy.c (rejoin copies), repl_apply.c (a backup
 * applies what is streamed), repl_view.c (view changes), replica.c (start, stop, sweeps,
 * metrics).
 *
 * Acknowledged means held: a backup answers a batch once it holds its operations in order
 * (repl_apply.c) and applies them behind the answer, still under the group's order lock; what
 * reads a copy (a view change that makes it primary, a checksum, a checkpoint, a rejoin copy)
 * takes that lock first, so it finds them applied. The primary answers a client once it
 * applied the update and every counted backup holds it.
 *
 * Locks, always taken in this order: a group's swap (its state's contents replaced), repl.vlock
 * (the view), a group's order (one update at a time), a group's q (log, peers, commit); the view
 * lock is also taken before a group's order without swap. */
#ifndef PSD_REPL_GROUP_H
#define PSD_REPL_GROUP_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "checkpoint.h"
#include "metrics.h"
#include "replica.h"
#include "view_agent.h"

#define REPLICA_MAX 16 /* members of a group at most */
/* Bytes of operations one REPLICATE batch carries at most (less when max-message-bytes is). */
#define BATCH_MAX_BYTES (8u << 20)
/* REPLICATE batches in flight to one backup at most (repl_progress.c): one being applied
 * behind its answer, one on the wire or being held, and two more so that a stream of small
 * updates never waits a round trip for the previous answer; at most 4 x BATCH_MAX_BYTES of
 * messages per backup. */
#define REPL_STREAM_WINDOW 4
/* A stream none of whose batches was answered for this long (not even refused) opens its
 * connection again (repl_progress.c), at most once per this interval. */
#define REPL_STREAM_STALE_MS 5000
/* A backup in the view that answered no batch for 2 leases and this long more (its
 * connection opened again meanwhile) is reported unreachable to the view agent, which takes it
 * out of sync: the group acknowledges without it (repl_progress.c). */
#define REPL_UNREACHABLE_EXTRA_MS REPL_STREAM_STALE_MS
/* Batches a backup parks at most per group while the one before them has not come yet. */
#define REPL_PARKED_MAX (2 * REPL_STREAM_WINDOW)

/* One logged operation: a whole request message as the primary received it. Its bytes are
 * those of the received message itself, held (the client's request at the primary, the
 * REPLICATE batch that carried it at a backup), or a copy of them (own) where it could not be. */
typedef struct rop {
    uint64_t lsn;
    uint64_t epoch; /* the view epoch its primary logged it under */
    uint64_t
        time_ms; /* when the primary logged it (wall clock): the time every copy applies it at */
    const uint8_t *bytes;
    size_t len;
    rpc_held *held;
    uint8_t *own;
    rpc_call *call; /* the client's parked call, answered once every backup holds it */
    /* Logged and streamed while the primary still applies it (run_update): stays in the log,
     * and its call is attached, once the apply is done (order held meanwhile). */
    bool busy;
    struct rop *next;
} rop;

struct rgroup;

/* A member of a group other than this server: where this server streams the group's log
 * while it serves the group as primary. */
typedef struct rpeer {
    struct rgroup *grp;
    uint32_t server;
    uint32_t rank;  /* ring distance from the group's placement server (1 .. r-1, 0: it) */
    uint64_t acked; /* highest lsn it reported held, all below it too (q) */
    uint64_t sent;  /* highest lsn sent to it, in batches answered or in flight (q) */
    int inflight;   /* batches in flight to it (q; at most REPL_STREAM_WINDOW) */
    /* A reply that did not join what it holds to its batch (an earlier batch not there yet, or
     * a copy behind what it reported): nothing more is sent until every batch in flight is
     * answered, then the stream goes on from the highest position reported meanwhile (q). */
    bool stall;
    uint64_t stall_pos;
    uint64_t retry_ns; /* a batch failed: the next one goes no earlier (q) */
    bool in_view;      /* live in the view and not the primary (q) */
    bool catching_up;  /* rejoining: took a copy at acked + 1, streamed to, not waited for (q) */
    bool told;         /* catching up: it saw the log's end once; waited for from then (q) */
    bool confirmed;    /* catching up: it applied a batch that said it is waited for (q) */
    uint64_t failing_since_ns; /* its stream fails since then (0: it does not) (q) */
    /* No batch to it was answered at all since then, not even with an error (0: one was):
     * the connection delivers nothing (REPL_STREAM_STALE_MS, REPL_UNREACHABLE_EXTRA_MS) (q). */
    uint64_t unanswered_since_ns;
    uint64_t reopened_ns; /* its connection was last opened again then (q) */
    unsigned reopens;     /* times its connection was opened again, for the log (q) */
    /* Unanswered for two leases + REPL_UNREACHABLE_EXTRA_MS while in the view: reported with
     * view_agent_mark_unreachable (q). */
    bool unreach_marked;
    /* Primary: the copy this peer is fetching, streamed (repl_copy.c); NULL while a chunk of
     * it is being read (q). */
    struct copy_image *img;
    bool started; /* thread running */
    pthread_t thread;
    rpc_conn *conn;
    uint64_t errors_logged_ns;
} rpeer;

typedef struct rgroup {
    uint32_t g;
    server_state *st;
    bool owned;            /* st made here (a backup copy), freed at stop */
    rpc_server *local;     /* runs logged requests through the handlers on st */
    pthread_mutex_t order; /* one update at a time: apply order = log order */
    /* Held for writing (before order) while a rejoin copy replaces st's contents; for reading
     * by code that reads them without order (server_state.swap points here). */
    pthread_rwlock_t swap;
    uint64_t next_lsn;   /* next lsn to assign (primary) or to apply (backup); order */
    uint64_t last_epoch; /* the epoch of the operation at next_lsn - 1 (0: unknown); order */
    /* The op time of the newest operation logged or applied here (order): a primary's next
     * one is never earlier (repl_op_time_locked), so that a wall clock stepped back, or a new
     * primary's clock behind the old one's, never runs a group's time backwards. */
    uint64_t last_time_ms;
    /* Backup: the primary's stream confirmed this copy's log since it took the group over
     * (repl_match.h); order. */
    bool verified;
    /* Backup: REPLICATE calls parked because they came before the batch ahead of them (the
     * server runs requests on several threads), by first lsn; run once it is held (order). */
    rpc_call *parked[REPL_PARKED_MAX];
    size_t nparked;
    /* Backup: REPLICATE calls parked while another thread takes this group's batches (taking),
     * in the order they came; that thread takes them before it lets the order lock go
     * (inbox_lock, taken with or without order, nothing inside). */
    pthread_mutex_t inbox_lock;
    bool taking;
    rpc_call *inbox[REPL_PARKED_MAX];
    size_t ninbox;
    pthread_mutex_t q;
    pthread_cond_t qcond; /* new operations, acks, view changes, stop */
    rop *head, *tail;     /* operations not yet held by every backup in the view */
    uint64_t last_lsn;    /* highest lsn in the log (q) */
    uint64_t committed;   /* every backup in the view holds up to here (q) */
    bool serving;         /* this server is the group's primary in the view (q) */
    int32_t primary;      /* the group's primary in the view (q) */
    uint64_t epoch;       /* the view's epoch (q) */
    bool ready;           /* the copy is usable: REPLICATE applies (order) */
    bool copying;         /* a rejoin copy thread runs (q) */
    bool marked;          /* caught up after a copy, told the coordinator (q) */
    pthread_t copy_thread;
    bool copy_started;
    bool fresh; /* a copy was installed since this server was last live (q) */
    rpeer peers[REPLICA_MAX];
    uint32_t npeers;
    /* Parked calls resumed (a staleness wait or BSP barrier ended) before the log position
     * their reply depends on was applied by every backup in the view: each answered once
     * committed reaches its lsn (q). */
    rop *riders;
    /* Checkpoints of a group other than its own while this server serves it (taken over):
     * started when it begins serving, stopped when it no longer does (vlock). */
    checkpointer *ck;
    uint64_t ck_next_seq;  /* the sequence number its next checkpointer starts from */
    atomic_bool has_files; /* group-copies-<self> may hold checkpoints of it */
    bool restored;         /* restored at start with a log position (view_copy) */
    uint64_t restored_epoch, restored_lsn;
} rgroup;

/* The process's replication state: one per server. */
struct repl_node {
    bool on;
    replica_config cfg;
    rgroup *groups[VIEW_MAX_SERVERS]; /* NULL where this server is no member */
    pthread_mutex_t vlock;
    view cur;
    rpc_server *rpc;
    atomic_bool stopping;
    rpc_method *methods;
    size_t n_methods;
    atomic_uint_fast64_t replicated_ops, failovers;
    /* Backup: operations answered as held before they were applied (repl_apply.c). */
    atomic_uint_fast64_t acked_held;
    view_agent *agent;     /* the coordinator's agent (NULL: a fixed view) */
    atomic_bool uncertain; /* the lease could not be renewed: acknowledge nothing alone */
    /* The own group's log position after replica_free, for its final checkpoint. */
    bool final_valid;
    uint64_t final_epoch, final_lsn;
};
extern struct repl_node repl;

/* The group and log position of the update this thread applies now (run_update, log_evict):
 * calls it resumes (waits it ended: their replies show its effect) go out only once it is
 * applied everywhere. */
typedef struct repl_applying {
    const struct rgroup *G;
    uint64_t lsn;
} repl_applying_t;
extern _Thread_local repl_applying_t repl_applying;

/* repl_group.c: a state for the copy of group g (server_state_free frees it). */
server_state *repl_state_make(uint32_t g, char *err, size_t errlen);

/* repl_log.c: the log, its commit and the replies it holds. */
bool repl_lease_valid_now(void);
void repl_op_free(rop *o);
bool repl_peer_counted(const rpeer *p);
/* p was reached (an answer, a copy's chunk): no longer failing, and no longer reported
 * unreachable (q held). */
void repl_peer_reached_locked(rpeer *p);
rop *repl_progress_locked(rgroup *G);
void repl_log_free_locked(rgroup *G);
void repl_answer(rop *done);
uint64_t repl_op_time_locked(rgroup *G);
rop *repl_append_locked(rgroup *G, rop *o);
bool repl_commit_gate(rpc_call *call, void *arg, uint64_t lsn);

/* repl_progress.c: the streams to the backups. */
void repl_start_peers_locked(rgroup *G);

/* repl_route.c: internal operations logged by the primary. */
void repl_log_evict(void *arg, int32_t worker);
void repl_log_sweep(void *arg, const char *name);
void repl_dispatch(rpc_call *call, void *arg);

/* repl_ckpt.c: checkpoints of groups this server took over, and log positions. */
bool repl_ckpt_position(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn);
bool repl_ckpt_final_position(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn);
void repl_ckpt_start(rgroup *G);
void repl_ckpt_stop(rgroup *G);
void repl_ckpt_copies_drop(rgroup *G);
int repl_ckpt_restore(rgroup *G, char *err, size_t errlen);

/* repl_apply.c: answers the parked batches of G UNAVAILABLE (order held): the primary sends
 * them again (a view change, a copy installed, the stop). */
void repl_parked_drop_locked(rgroup *G);

/* repl_copy.c: rejoin copies, both sides. */
void repl_copy_serve(rpc_call *call, rgroup *G, const Psd__V1__ReplicateRequest *rq);
void repl_copy_image_free(struct copy_image *ci);
void repl_rejoin_locked(rgroup *G);

#endif
