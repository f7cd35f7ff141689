/* RPC client: a pool of REQ sockets (TCP connections) to one server, with many requests in
 * flight at once, a deadline on every call and retries with exponential backoff and jitter:
 * up to opts.retries after UNAVAILABLE replies (a server shutting down), and until the
 * deadline when the server cannot be reached (refused, reset or closed connection, nng's
 * "Incorrect state"): a server that restarts within a call's deadline is not seen by the
 * caller. nng redials a lost connection on its own
 * (NNG_OPT_RECONNMINT/MAXT) and resends a request whose connection was lost.
 *
 * A call without a reply for about 2 s is logged (common/log.h) with the server's label,
 * address and the time left of its deadline, and again every 5 s while it waits.
 *
 * Every reply carries the server process's instance id (Envelope.server_instance): a reply
 * from another process than the one that sent the connection's first reply means the server
 * restarted. The change is logged once (connections with `watch`), and an error reply from
 * the new process has that said in its message (e.g. a NOT_FOUND for a variable the process
 * before held).
 *
 * A request is described by a build function rather than a message, so that a retry rebuilds
 * it from the caller's buffers instead of keeping a copy of a possibly large tensor. */
#ifndef PSD_COMMON_RPC_CLIENT_H
#define PSD_COMMON_RPC_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "frame.h"

typedef struct rpc_conn rpc_conn;

/* Mutual TLS settings of one end (docs/operations.md, Security). TLS is on when ca is set. */
typedef struct rpc_tls {
    const char *ca;          /* PEM CA file: peers' certificates must be signed by it */
    const char *cert, *key;  /* PEM files of this end's certificate and unencrypted key */
    const char *server_name; /* clients: name the server's certificate must carry; NULL or
                                "": the host of the URL */
    const char *engine;      /* "openssl" or "mbed"; NULL or "": openssl (tls.h) */
} rpc_tls;

static inline bool rpc_tls_on(const rpc_tls *t)
{
    return t && t->ca && t->ca[0];
}

/* Makes the nng TLS configuration of a server (authentication OPTIONAL: rpc_server refuses
 * unverified peers itself, to log them) or a client (REQUIRED). Returns 0, or -1 with a
 * message naming the file or setting at fault in err. */
int rpc_tls_config(nng_tls_config **out, const rpc_tls *t, bool server, char *err, size_t errlen);

/* Copies url to buf with the scheme tcp:// turned into tls+tcp:// when tls is set. Returns 0,
 * or -1 if it does not fit. */
int rpc_tls_url(const char *url, bool tls, char *buf, size_t cap);

/* Reads the admin token: the first line of path, without its line end. Returns 0, or -1
 * with a message in err (unreadable file, empty token, longer than cap - 1). */
int rpc_read_token(const char *path, char *buf, size_t cap, char *err, size_t errlen);

typedef struct rpc_conn_config {
    const char *url;    /* nng dial URL */
    int connections;    /* REQ sockets to open (each one TCP connection) */
    uint32_t resend_ms; /* nng REQ resend interval: the transport is at-least-once */
    size_t max_message; /* largest reply accepted */
    const char *label;  /* names the server in messages, e.g. "ps 0"; NULL: the URL alone */
    int watch;          /* non-zero: log calls waiting long for a reply (see above) */
    /* Optional, with watch: what the caller knows of why calls wait (e.g. the server said in
     * a heartbeat reply, since since_ns (time_now_ns) when the oldest waiting call started,
     * that it holds them for a worker). Called from the watcher thread, without locks of the
     * connection; writes a phrase into buf and returns true, or returns false to keep the
     * generic guess (server down, stopped, restarting or overloaded?). */
    bool (*hint)(void *hint_arg, uint64_t since_ns, char *buf, size_t cap);
    void *hint_arg;
    rpc_tls tls; /* mutual TLS (url must then be tls+tcp://); zero: plain */
    /* A connection opened for a call made at once (rpc_oneshot): while none of its sockets is
     * up, the call looks again every 1 ms for its first 100 ms rather than every 20 ms. */
    bool fast_connect;
} rpc_conn_config;

typedef struct rpc_call_opts {
    uint32_t deadline_ms; /* whole call, retries included */
    int retries; /* retries after UNAVAILABLE replies; 0: no retry at all, not even of a lost
                    connection (which is otherwise retried until the deadline) */
    uint32_t backoff_ms;     /* first backoff; doubles each retry, jittered */
    uint32_t max_backoff_ms; /* cap of one backoff; 0 means 1000 */
} rpc_call_opts;

/* Builds the request for one attempt. deadline_ms is the time left, to be put in the
 * envelope. Returns 0 and a new message in *out, or an nng error. Runs on any thread. */
typedef int (*rpc_build_fn)(void *arg, uint32_t deadline_ms, nng_msg **out);

/* Called exactly once per started call, on an nng thread, with the final status: the
 * server's status if it replied (reply then points at the parsed frame, valid only during
 * the callback), or a transport status (DEADLINE_EXCEEDED, CANCELLED, ...) with reply NULL.
 * message is never NULL. Must not block. */
typedef void (*rpc_done_fn)(void *arg, int status, const char *message, const frame *reply);

/* Opens cfg->connections sockets and dials cfg->url in the background (no wait for the
 * server). Returns 0, or -1 with a message in err. */
int rpc_conn_open(rpc_conn **out, const rpc_conn_config *cfg, char *err, size_t errlen);

/* Closes the sockets; calls in flight complete with CANCELLED. Blocks until every done
 * callback has returned. NULL is a no-op. */
void rpc_conn_close(rpc_conn *c);

/* Starts a call. Returns 0 if started (done will run exactly once), or a status code if it
 * could not be started (done will not run). Does not block. */
int rpc_conn_call(rpc_conn *c, const rpc_call_opts *o, rpc_build_fn build, rpc_done_fn done,
                  void *arg);

/* A call waited for, on any function that starts calls with an rpc_build_fn and an
 * rpc_done_fn on one argument (rpc_conn_call, the client's routed calls):
 * rpc_waiter_init(&w, build, done, arg), start the call with rpc_waiter_build,
 * rpc_waiter_done and &w, then rpc_waiter_wait(&w). build and done get arg; done (may be NULL)
 * runs first, on the nng thread, while the reply is valid; the wait returns the call's final
 * status. */
typedef struct rpc_waiter {
    pthread_mutex_t m;
    pthread_cond_t c;
    bool done;
    int status;
    rpc_build_fn build;
    rpc_done_fn fn;
    void *arg;
} rpc_waiter;
void rpc_waiter_init(rpc_waiter *w, rpc_build_fn build, rpc_done_fn done, void *arg);
int rpc_waiter_build(void *w, uint32_t deadline_ms, nng_msg **out);
void rpc_waiter_done(void *w, int status, const char *message, const frame *reply);
/* Waits for the call, frees w's lock and returns its status. */
int rpc_waiter_wait(rpc_waiter *w);
/* rpc_waiter_wait after a call whose start failed: frees w's lock, returns start_status. */
int rpc_waiter_abandon(rpc_waiter *w, int start_status);
/* rpc_conn_call, waited for: done (may be NULL) runs with the reply, then the call's final
 * status is returned (or rpc_conn_call's, when it could not start). */
int rpc_conn_call_wait(rpc_conn *c, const rpc_call_opts *o, rpc_build_fn build, rpc_done_fn done,
                       void *arg);

/* The URL this connection dials. */
const char *rpc_conn_url(const rpc_conn *c);

/* Closes n sockets (nng_close) from a thread of its own and waits at most wait_ms for it:
 * nng 1.5.2's nng_close can wait forever on its reaper when a connection is made or lost
 * meanwhile. True when every socket closed in time; false when the wait ran out: the closing
 * thread is left to finish (or not), and whatever nng may still call back into must then be
 * left allocated. Stop every aio and close every context of the sockets before. */
bool rpc_close_sockets_bounded(const nng_socket *socks, int n, uint32_t wait_ms);

/* How many of the connection's sockets have a connection up now (calls go to those first). */
int rpc_conn_sockets_up(const rpc_conn *c);

/* Backoff before retry number `attempt` (0-based): backoff_ms doubled per attempt, capped at
 * max_ms, plus a random jitter of up to half of it (random state *rng), so that clients
 * waiting for one server do not retry in step. */
uint32_t rpc_backoff_ms(uint32_t backoff_ms, uint32_t max_ms, int attempt, uint64_t *rng);

#endif
