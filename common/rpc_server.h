/* RPC server: an nng REP socket served by many contexts, each a small state machine
 * (RECV -> WORK -> SEND), a method table with generic validation before any handler, and a
 * pool of threads that runs large requests off nng's callback threads.
 *
 * Every request gets exactly one reply. Malformed input (truncated, garbage, oversized,
 * unknown method, wrong version, bad body) is answered with an error status and a message;
 * the server keeps serving everyone else.
 *
 * The whole public interface; the implementation is spread by concept over rpc_server.c (the
 * socket's contexts and pool), rpc_call.c, rpc_validate.c, rpc_auth.c, rpc_conns.c and
 * rpc_local.c (rpc_server_internal.h says which holds what). */
#ifndef PSD_COMMON_RPC_SERVER_H
#define PSD_COMMON_RPC_SERVER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "frame.h"
#include "rpc_client.h" /* rpc_tls */

typedef struct rpc_server rpc_server;
typedef struct rpc_call rpc_call;

/* A handler runs once per valid request, on an nng callback thread (small requests) or a pool
 * thread (large ones). It must reply exactly once with rpc_reply_* before returning; it must
 * not block on the network. */
typedef void (*rpc_handler_fn)(rpc_call *call, void *arg);

enum rpc_method_flags {
    RPC_RANGE = 1u << 0,   /* Envelope.tensor (dtype, offset, count) is required */
    RPC_SEGMENT = 1u << 1, /* a raw segment is required (implies RPC_RANGE) */
    RPC_ADMIN = 1u << 2,   /* administrative method */
    RPC_POOL = 1u << 3,    /* always run on a pool thread (may do heavy work, e.g. BSP updates) */
    RPC_REPLY_RANGE = 1u << 4, /* the reply carries Envelope.tensor's range as its segment */
    RPC_MAY_SEGMENT = 1u << 5, /* a raw segment may follow (described by Envelope.tensor) */
    /* changes state: a replicated server logs it and its backups apply it in log order (the
     * RPC layer itself does not look at this flag) */
    RPC_LOGGED = 1u << 6,
};

typedef struct rpc_method {
    int method; /* Psd__V1__Method value */
    const char *name;
    const ProtobufCMessageDescriptor *request; /* type of Envelope.body */
    rpc_handler_fn handler;
    unsigned flags;
} rpc_method;

typedef struct rpc_server_config {
    const char *url; /* nng listen URL, e.g. tcp://127.0.0.1:2222 */
    int contexts;    /* requests in progress at once, parked ones not counted */
    int max_parked;  /* deferred calls waiting at once (rpc_call_defer) */
    int threads;     /* pool threads for large requests */
    size_t max_message;
    size_t inline_max; /* requests up to this size run on the callback thread */
    uint32_t default_deadline_ms;
    /* Limits (0: none). Deadlines longer than max_deadline_ms are cut to it; connections beyond
     * max_connections are closed as they arrive; a connection's requests in progress beyond
     * max_per_connection get RESOURCE_EXHAUSTED. */
    uint32_t max_deadline_ms;
    int max_connections;
    int max_per_connection;
    const rpc_method *methods;
    size_t n_methods;
    void *handler_arg;
    /* Tests only (fault injection, like ps-lite's PS_DROP_MSG): the percentage of requests
     * dropped on receipt with no reply (the client's REQ socket resends them after its
     * resend-ms), and of valid requests handled twice (the first reply is discarded, the
     * second sent: a duplicated request whose first answer was lost). 0: off. */
    int drop_percent;
    int dup_percent;
    /* Tests only: the percentage of Push and TablePush replies dropped after the handler
     * applied the update (a reply lost on the way back: the client resends the same seq after
     * its resend-ms, and the exactly-once window must answer it, even once the update's slot
     * has moved to another server). Parked calls are never dropped. 0: off. */
    int drop_reply_percent;
    /* Mutual TLS (url then tls+tcp://): connections without a certificate verified against
     * tls.ca are logged (peer address, reason) and closed before any request is read. */
    rpc_tls tls;
    /* Admin role, checked for RPC_ADMIN methods before their handler: with a token, a request
     * must carry it (Envelope.auth_token; none: UNAUTHENTICATED, another: PERMISSION_DENIED);
     * without one (NULL or ""), only loopback peers may call them (else PERMISSION_DENIED). */
    const char *admin_token;
    /* rpc_server_open_local only: requests come from a trusted source (a replica applying what
     * its primary accepted and logged), so admin methods need no token and deadlines are not
     * checked. */
    bool trusted;
} rpc_server_config;

typedef struct rpc_stats {
    atomic_uint_fast64_t requests;
    atomic_uint_fast64_t errors;
    atomic_uint_fast64_t bytes_in;
    atomic_uint_fast64_t bytes_out;
} rpc_stats;

/* Opens the socket, listens on cfg->url and starts serving. cfg->methods must outlive the
 * server. Returns 0, or -1 with a message in err (e.g. address in use). */
int rpc_server_start(rpc_server **out, const rpc_server_config *cfg, char *err, size_t errlen);

/* Starts refusing new requests with UNAVAILABLE (clients retry them elsewhere or later) and
 * waits until the requests in progress have been answered, at most grace_ms. Blocks. */
void rpc_server_drain(rpc_server *s, uint32_t grace_ms);

/* Stops serving: closes the socket, lets in-progress handlers finish, joins the pool and
 * frees everything. Blocks. NULL is a no-op. */
void rpc_server_stop(rpc_server *s);

/* Counters, updated atomically. Valid until rpc_server_stop. */
const rpc_stats *rpc_server_stats(const rpc_server *s);

/* A random 64-bit number drawn when the server started, sent in every reply
 * (Envelope.server_instance): a client that sees it change knows the server restarted. */
uint64_t rpc_server_instance(const rpc_server *s);

/* Replicated clusters: the view epoch every reply carries from now on (Envelope.epoch). */
void rpc_server_set_epoch(rpc_server *s, uint64_t epoch);

/* ---- inside a handler ---- */

/* The whole request message as received (frame header, envelope, segment), e.g. to forward it
 * to replicas. Valid until the reply is sent. */
const uint8_t *rpc_call_request(const rpc_call *c, size_t *len);
/* A reference to a request message that outlives its call: the message is freed once the
 * call replied and every reference taken on it is released. */
typedef struct rpc_held rpc_held;
/* Takes a reference to c's whole request message, whose bytes (rpc_call_request's) it sets in
 * *data and *len: they stay valid until the reference is released, after the reply too.
 * NULL when out of memory or when c's bytes are not its own (rpc_server_handle_borrowed):
 * copy them then. Not thread-safe on one call (its handler's thread takes them). */
rpc_held *rpc_call_hold_request(rpc_call *c, const uint8_t **data, size_t *len);
/* One more reference to what h holds. */
rpc_held *rpc_held_ref(rpc_held *h);
/* Releases a reference (any thread); NULL is a no-op. */
void rpc_held_release(rpc_held *h);
/* The status of the reply set so far, -1 when none is set. */
int rpc_call_reply_status(const rpc_call *c);
/* Names the server that serves the request's replica group (Envelope.primary of the reply). */
void rpc_call_set_primary(rpc_call *c, uint32_t primary);
/* Names the server that holds the slots the request touched now, and the slot map version
 * that gave them there (Envelope.moved_to, slots_version of the reply). */
void rpc_call_set_moved(rpc_call *c, uint32_t to, uint64_t version);
/* Says, with a moved refusal (rpc_call_set_moved), that the request was applied here before
 * its slots moved, or may have been (Envelope.moved_applied). */
void rpc_call_set_moved_applied(rpc_call *c);
/* Whether the handler that just returned on this thread parked c (rpc_call_defer): then c is
 * no longer the caller's to touch. Compares pointers only. */
bool rpc_call_deferred_here(const rpc_call *c);
/* Whether c came through a trusted local server (rpc_server_open_local: a replica applying
 * its group's log), not from the network. */
bool rpc_call_trusted(const rpc_call *c);

/* The admin role of c (what an RPC_ADMIN method needs: the admin token of admin-token-file,
 * or a loopback peer when the server has none). False: c was answered with the refusal. */
bool rpc_call_check_admin(rpc_call *c);
/* Whether c carries `token` (Envelope.auth_token, compared in constant time). */
bool rpc_call_carries_token(const rpc_call *c, const char *token);

const envelope *rpc_call_envelope(const rpc_call *c);
/* The unpacked Envelope.body, of the method's request type. */
const ProtobufCMessage *rpc_call_body(const rpc_call *c);
/* The raw segment (NULL, 0 if none). Points into the request; may be unaligned. */
const uint8_t *rpc_call_segment(const rpc_call *c, size_t *len);
/* Absolute deadline on the monotonic clock (time_now_ns). */
uint64_t rpc_call_deadline_ns(const rpc_call *c);

/* Parks the call: the handler returns without replying, and the reply is set and sent later
 * from any thread with rpc_reply_* and rpc_call_resume. The server keeps receiving on another
 * context meanwhile. Must be called on the handler's thread, before the call is made visible
 * to the thread that will resume it; after that the handler must not touch the call.
 * Returns 0, or -1 when max_parked calls are parked already (then reply at once). */
int rpc_call_defer(rpc_call *c);
/* Sends the reply of a parked call (INTERNAL if none was set). Any thread, once. */
void rpc_call_resume(rpc_call *c);
/* A gate on c's resume: the next rpc_call_resume(c) first runs gate(c, arg, tag) (once: the
 * gate is cleared before it runs); when it returns true the gate keeps the call and resumes it
 * again later itself. NULL clears it. Set by the handler's thread before c can be parked. */
typedef bool (*rpc_resume_gate)(rpc_call *c, void *arg, uint64_t tag);
void rpc_call_set_gate(rpc_call *c, rpc_resume_gate gate, void *arg, uint64_t tag);
/* The server's max-message-bytes: replies larger than this are refused (handlers that build
 * replies of variable size, e.g. listings, fill them up to a budget below it). */
size_t rpc_call_max_message(const rpc_call *c);
/* Bytes a reply body (the protobuf message of rpc_reply_ok) may take: max-message-bytes and
 * the envelope's own bound (FRAME_MAX_ENVELOPE, 1 MiB) less RPC_ENVELOPE_RESERVE for the
 * envelope's other fields. Handlers that fill a listing fill it up to this, cut it there and
 * say where the next page starts; a body past the envelope's bound is answered INTERNAL. */
#define RPC_ENVELOPE_RESERVE 2048
size_t rpc_call_max_reply_body(const rpc_call *c);
/* Method of a call (its table entry), e.g. for messages. */
const rpc_method *rpc_call_method(const rpc_call *c);

/* Replies with an error status and a formatted message. */
void rpc_reply_error(rpc_call *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Replies OK with body (packed at once, may be NULL for an empty body). */
void rpc_reply_ok(rpc_call *c, const ProtobufCMessage *body);
/* Replies OK with body and a float32 segment for elements [offset, offset+count); returns the
 * segment area (count * 4 bytes) for the handler to fill before returning. Returns NULL if
 * the reply can't be allocated; an error reply is then in place. */
uint8_t *rpc_reply_ok_segment(rpc_call *c, const ProtobufCMessage *body, uint64_t offset,
                              uint64_t count);
/* The same with the segment's element type (a wire dtype: FLOAT32 or BFLOAT16); the area is
 * count * frame_dtype_size(dtype) bytes. */
uint8_t *rpc_reply_ok_tensor(rpc_call *c, const ProtobufCMessage *body, int dtype, uint64_t offset,
                             uint64_t count);

/* ---- requests in memory, no socket (tests, fuzzing, a replica group's own copy) ----
 * A server object with no socket, listener, contexts or threads, so it exposes nothing on the
 * network: tests and fuzz harnesses (tests/fuzz/fuzz_dispatch.c) feed it request bytes with
 * rpc_server_handle_bytes. Of cfg, only max_message, default/max_deadline_ms, methods,
 * n_methods, handler_arg and admin_token are used (dup_percent too); rpc_call_defer is always
 * refused, so handlers reply at once (as when max_parked calls are parked). Returns NULL when
 * out of memory. rpc_server_stats and rpc_server_instance work on it. */
rpc_server *rpc_server_open_local(const rpc_server_config *cfg);

/* Runs one request message (len bytes at req) through the same generic checks as a request
 * received on the socket (size, frame, method table flags, admin role, body) and, if they
 * pass, its method's handler, on the calling thread. The admin role has no loopback peer here:
 * admin methods need cfg->admin_token. Returns 0 with the reply message's bytes in *reply
 * (malloc'd, the caller frees it) and *reply_len, or -1 when out of memory. */
int rpc_server_handle_bytes(rpc_server *s, const void *req, size_t len, void **reply,
                            size_t *reply_len);
/* The same on bytes the caller keeps valid and unchanged until it returns (they are read in
 * place, not copied), discarding the reply: a server's own copy of a replica group applies the
 * operations of a received REPLICATE batch this way. Returns 0, or -1 when out of memory. */
int rpc_server_handle_borrowed(rpc_server *s, const void *req, size_t len);

/* Frees a server made by rpc_server_open_local. NULL is a no-op. */
void rpc_server_close_local(rpc_server *s);

#endif
