#include "http_endpoint.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "metrics.h"

struct http_endpoint {
    nng_http_server *srv;
    int port;
    pthread_mutex_t lock; /* ready, reason */
    bool ready;
    char reason[256];
    http_ready_fn ready_fn;
    void *ready_arg;
    http_detail_fn detail_fn;
    void *detail_arg;
};

/* Answers aio with status and body (copied). */
static void reply(nng_aio *aio, uint16_t status, const char *type, const char *body, size_t len)
{
    nng_http_res *res;
    int rv = nng_http_res_alloc(&res);
    if (rv != 0) {
        nng_aio_finish(aio, rv);
        return;
    }
    if ((rv = nng_http_res_set_status(res, status)) != 0 ||
        (rv = nng_http_res_set_header(res, "Content-Type", type)) != 0 ||
        (rv = nng_http_res_copy_data(res, body, len)) != 0) {
        nng_http_res_free(res);
        nng_aio_finish(aio, rv);
        return;
    }
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

static void on_metrics(nng_aio *aio)
{
    size_t len = 0;
    char *text = metrics_render(&len);
    if (text == NULL) {
        static const char oom[] = "out of memory rendering metrics\n";
        reply(aio, NNG_HTTP_STATUS_INTERNAL_SERVER_ERROR, "text/plain", oom, sizeof(oom) - 1);
        return;
    }
    reply(aio, NNG_HTTP_STATUS_OK, "text/plain; version=0.0.4; charset=utf-8", text, len);
    free(text);
}

static void on_livez(nng_aio *aio)
{
    reply(aio, NNG_HTTP_STATUS_OK, "text/plain", "ok\n", 3);
}

static void on_readyz(nng_aio *aio)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    http_endpoint *e = nng_http_handler_get_data(h);
    char body[1100];
    char why[256] = "", detail[768] = "";
    pthread_mutex_lock(&e->lock);
    bool ready = e->ready;
    if (e->ready_fn)
        ready = e->ready_fn(e->ready_arg, why, sizeof(why));
    else
        snprintf(why, sizeof(why), "%s", e->reason);
    if (e->detail_fn)
        e->detail_fn(e->detail_arg, detail, sizeof(detail));
    pthread_mutex_unlock(&e->lock);
    int n = snprintf(body, sizeof(body), "%s\n%s%s", ready ? "ready" : why, detail,
                     detail[0] ? "\n" : "");
    reply(aio, ready ? NNG_HTTP_STATUS_OK : NNG_HTTP_STATUS_SERVICE_UNAVAILABLE, "text/plain", body,
          (size_t)n < sizeof(body) ? (size_t)n : sizeof(body) - 1);
}

static int add_handler(http_endpoint *e, const char *path, void (*cb)(nng_aio *))
{
    nng_http_handler *h;
    int rv = nng_http_handler_alloc(&h, path, cb);
    if (rv != 0)
        return rv;
    if ((rv = nng_http_handler_set_method(h, "GET")) != 0 ||
        (rv = nng_http_handler_set_data(h, e, NULL)) != 0 ||
        (rv = nng_http_server_add_handler(e->srv, h)) != 0) {
        nng_http_handler_free(h);
        return rv;
    }
    return 0;
}

int http_endpoint_start(http_endpoint **out, const char *addr, char *err, size_t errlen)
{
    *out = NULL;
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || colon[1] == '\0' || strspn(colon + 1, "0123456789") != strlen(colon + 1)) {
        snprintf(err, errlen, "http-listen \"%s\" is not host:port", addr);
        return -1;
    }
    int host_len = (int)(colon - addr);
    const char *host = addr;
    if (host_len == 0 || (host_len == 1 && addr[0] == '*')) {
        host = "0.0.0.0";
        host_len = 7;
    }
    char urlbuf[320];
    if ((size_t)snprintf(urlbuf, sizeof(urlbuf), "http://%.*s:%s", host_len, host, colon + 1) >=
        sizeof(urlbuf)) {
        snprintf(err, errlen, "http-listen \"%s\" is too long", addr);
        return -1;
    }
    http_endpoint *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    pthread_mutex_init(&e->lock, NULL);
    snprintf(e->reason, sizeof(e->reason), "starting");
    nng_url *url = NULL;
    int rv = nng_url_parse(&url, urlbuf);
    if (rv == 0)
        rv = nng_http_server_hold(&e->srv, url);
    nng_url_free(url);
    if (rv != 0) {
        snprintf(err, errlen, "http-listen %s: %s", addr, nng_strerror(rv));
        pthread_mutex_destroy(&e->lock);
        free(e);
        return -1;
    }
    if ((rv = add_handler(e, "/metrics", on_metrics)) != 0 ||
        (rv = add_handler(e, "/livez", on_livez)) != 0 ||
        (rv = add_handler(e, "/readyz", on_readyz)) != 0 ||
        (rv = nng_http_server_start(e->srv)) != 0) {
        snprintf(err, errlen, "cannot serve HTTP on %s: %s", addr, nng_strerror(rv));
        nng_http_server_release(e->srv);
        pthread_mutex_destroy(&e->lock);
        free(e);
        return -1;
    }
    nng_sockaddr sa;
    if (nng_http_server_get_addr(e->srv, &sa) == 0) {
        if (sa.s_family == NNG_AF_INET)
            e->port = ntohs(sa.s_in.sa_port);
        else if (sa.s_family == NNG_AF_INET6)
            e->port = ntohs(sa.s_in6.sa_port);
    }
    if (e->port == 0)
        e->port = atoi(colon + 1);
    *out = e;
    return 0;
}

int http_endpoint_port(const http_endpoint *e)
{
    return e ? e->port : 0;
}

void http_endpoint_set_ready(http_endpoint *e, bool ready, const char *reason)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->lock);
    e->ready = ready;
    snprintf(e->reason, sizeof(e->reason), "%s", reason ? reason : "");
    pthread_mutex_unlock(&e->lock);
}

void http_endpoint_set_ready_fn(http_endpoint *e, http_ready_fn fn, void *arg)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->lock);
    e->ready_fn = fn;
    e->ready_arg = arg;
    pthread_mutex_unlock(&e->lock);
}

void http_endpoint_set_detail_fn(http_endpoint *e, http_detail_fn fn, void *arg)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->lock);
    e->detail_fn = fn;
    e->detail_arg = arg;
    pthread_mutex_unlock(&e->lock);
}

void http_endpoint_stop(http_endpoint *e)
{
    if (e == NULL)
        return;
    nng_http_server_stop(e->srv);
    nng_http_server_release(e->srv);
    pthread_mutex_destroy(&e->lock);
    free(e);
}
