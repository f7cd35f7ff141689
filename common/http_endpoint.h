/* The HTTP endpoint of a ps-server or ps-worker (setting http-listen), a small HTTP/1.1 server
 * on one thread of its own (http_endpoint.c says why not nng's): at most 64 connections,
 * headers within 5 s, keep-alive connections closed after 30 s idle, scrapes arriving
 * together sharing one rendering:
 *   GET /metrics  the metrics registry (metrics.h) in the Prometheus text format
 *   GET /livez    200 "ok" while the process runs
 *   GET /readyz   200 "ready" once the program says so (http_endpoint_set_ready), else 503 and
 *                 the reason it gave (e.g. "restoring checkpoint", "not connected yet"); a
 *                 second line carries a health detail when there is one
 *                 (http_endpoint_set_detail_fn), e.g. that checkpoints fail */
#ifndef PSD_COMMON_HTTP_ENDPOINT_H
#define PSD_COMMON_HTTP_ENDPOINT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct http_endpoint http_endpoint;

/* Starts serving on addr, "host:port" (port 0: any free port; host may be empty or "*" for
 * every interface, and a bare "port" means ":port"). Not ready until http_endpoint_set_ready(e,
 * true, ...). Returns 0, or -1 with a message in err (bad address, port in use). */
int http_endpoint_start(http_endpoint **out, const char *addr, char *err, size_t errlen);

/* A program's endpoint from its http-listen setting: when addr is set and not empty, starts it
 * (http_endpoint_start) and logs where its metrics are; NULL in *out when addr is not set.
 * Returns 0, or -1 with the error logged (and *out NULL). */
int http_endpoint_start_logged(http_endpoint **out, const char *addr);

/* The TCP port it listens on (the one chosen when addr's port was 0). */
int http_endpoint_port(const http_endpoint *e);

/* Sets what /readyz answers: ready, or not with a reason (copied). Any thread; NULL-safe. */
void http_endpoint_set_ready(http_endpoint *e, bool ready, const char *reason);

/* Alternatively, asks fn at every /readyz: true when ready, else false with a reason written
 * to why (cap bytes). fn runs on an nng thread; it replaces set_ready's state while set. */
typedef bool (*http_ready_fn)(void *arg, char *why, size_t cap);
void http_endpoint_set_ready_fn(http_endpoint *e, http_ready_fn fn, void *arg);

/* Has /readyz ask fn for a health detail that does not change readiness (e.g. "checkpoints
 * failing: ..."): fn writes it to buf (cap bytes; leave it "" for none). fn runs on an nng
 * thread. NULL fn removes it. NULL-safe. */
typedef void (*http_detail_fn)(void *arg, char *buf, size_t cap);
void http_endpoint_set_detail_fn(http_endpoint *e, http_detail_fn fn, void *arg);

/* Stops serving and frees it. NULL is a no-op. */
void http_endpoint_stop(http_endpoint *e);

#endif
