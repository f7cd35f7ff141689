/* The RPC server's private layout (rpc_server.h): the server and call objects its files share,
 * and the helpers of rpc_call.c. Private to common/rpc_*.c.
 *
 * The files, and which way they use each other (never back):
 *   rpc_conns.c     connections, their caps and the log of refused ones (uses nothing of the
 *                   others);
 *   rpc_call.c      a call: its reply, what a handler reads of it; what every server keeps:
 *                   identity, metrics, fault injection, locks (uses rpc_conns.c);
 *   rpc_auth.c      the admin role (token, loopback peer) and the TLS connection policy
 *                   (uses rpc_call.c, rpc_conns.c);
 *   rpc_validate.c  the generic checks of every request (uses rpc_call.c, rpc_auth.c,
 *                   rpc_conns.c);
 *   rpc_local.c     the in-process server and held requests (uses rpc_call.c,
 *                   rpc_validate.c);
 *   rpc_server.c    the socket's contexts, their state machine and the pool (uses all). */
#ifndef PSD_COMMON_RPC_SERVER_INTERNAL_H
#define PSD_COMMON_RPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>

#include "rpc_conns.h"
#include "rpc_server.h"

enum call_state { CALL_RECV, CALL_WORK, CALL_SEND };

struct rpc_call {
    rpc_server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    enum call_state state;
    nng_msg *req; /* the request message (NULL: borrowed bytes, rpc_server_handle_borrowed) */
    const uint8_t *data; /* the request's bytes: req's body or the borrowed ones */
    size_t len;
    rpc_held *held; /* req shared with references taken by rpc_call_hold_request */
    frame f;
    ProtobufCMessage *body;
    const rpc_method *method;
    uint64_t recv_ns;
    uint64_t deadline_ns;
    nng_msg *reply;
    int status; /* of the reply set, for the metrics */
    bool validated;
    bool parked;    /* deferred: left the receive loop, replied to later */
    bool counted;   /* counted in its connection's requests in progress */
    uint32_t pipe;  /* id of the connection it came on */
    rpc_call *next; /* work queue link or idle list */
    /* Envelope.primary of the reply (rpc_call_set_primary); -1: none */
    int64_t primary;
    /* Envelope.moved_to - 1 and slots_version of the reply (rpc_call_set_moved); -1: none */
    int64_t moved_to;
    uint64_t slots_version;
    bool moved_applied;   /* Envelope.moved_applied of the reply (rpc_call_set_moved_applied) */
    rpc_resume_gate gate; /* rpc_call_set_gate */
    void *gate_arg;
    uint64_t gate_tag;
};

struct rpc_method_metrics;

struct rpc_server {
    rpc_server_config cfg;
    nng_socket sock;
    rpc_call **calls; /* every call object made, to free at stop */
    int ncalls, capcalls;
    int nreceiving; /* calls in the receive loop (not parked), guarded by qlock */
    rpc_call *idle; /* calls out of the loop, reusable for the next deferral */
    pthread_t *threads;
    int nthreads;
    pthread_mutex_t qlock;
    pthread_cond_t qcond;
    rpc_call *qhead, *qtail;
    atomic_bool stopping;
    atomic_uint_fast64_t epoch; /* Envelope.epoch of every reply (rpc_server_set_epoch) */
    atomic_bool draining;
    atomic_int busy; /* requests received and not yet replied to */
    rpc_stats stats;
    uint64_t instance; /* Envelope.server_instance of every reply */
    /* Fault injection (tests only): a counter hashed into random numbers, and what it did. */
    atomic_uint_fast64_t fault_rng;
    atomic_uint_fast64_t dropped, duplicated, replies_dropped;
    rpc_conns conns;               /* caps, counts and refusals (rpc_conns.c) */
    struct rpc_method_metrics *mm; /* per method, and one more for requests of no known method */
    nng_listener listener;         /* on cfg.url */
};

/* ---- rpc_call.c ---- */

/* Sets up what every server keeps, on a socket or in process, in s (zeroed memory): cfg
 * copied, its instance (random, never 0, also the seed of fault injection), the metrics of
 * its methods (none when out of memory), its locks and its connection table. */
void rpcs_server_init(rpc_server *s, const rpc_server_config *cfg);
/* Frees what rpcs_server_init made, and s. */
void rpcs_server_free(rpc_server *s);
/* The one metrics hook: c's reply (reply_len bytes; or, when none could be built, its request)
 * is done. */
void rpcs_metrics_record(rpc_call *c, size_t reply_len);
/* True with probability percent/100 (thread-safe). */
bool rpcs_fault_chance(rpc_server *s, int percent);
/* Sets c's reply (replacing one set before): status, message, body and, for an OK reply with
 * a tensor, a segment whose area *segment_out gets (NULL when it could not be allocated; an
 * error reply is then in place). */
void rpcs_set_reply(rpc_call *c, int status, const char *message, const ProtobufCMessage *body,
                    const Psd__V1__TensorMeta *tensor, uint8_t **segment_out);
/* Logs a bad request with a short hex sample of its first bytes. */
void rpcs_log_bad_request(const rpc_call *c, int status, const char *why);

#endif
