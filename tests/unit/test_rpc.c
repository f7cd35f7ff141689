/* RPC layer over real loopback sockets: method table dispatch, retries with backoff on
 * UNAVAILABLE, deadlines against a server that never answers, many calls in flight, calls
 * going to the connections that are up while others are still being made, a call waiting
 * for a server that is not there yet, an aio's timeout after it slept. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "cluster_proc.h"
#include "rpc_client.h"
#include "rpc_server.h"
#include "status.h"
#include "timeutil.h"

static atomic_int unavailable_left;
static atomic_int status_calls;
static atomic_bool say_moving; /* the refusals are a slot move's ("slot moving: ...") */

/* SERVER_STATUS answers UNAVAILABLE while unavailable_left > 0, then OK. */
static void handle_status(rpc_call *call, void *arg)
{
    (void)arg;
    atomic_fetch_add(&status_calls, 1);
    if (atomic_fetch_sub(&unavailable_left, 1) > 0) {
        if (atomic_load(&say_moving))
            rpc_reply_error(call, STATUS_UNAVAILABLE,
                            "slot moving: slot 3 is being moved to "
                            "another server (retry)");
        else
            rpc_reply_error(call, STATUS_UNAVAILABLE, "busy, try later");
        return;
    }
    Psd__V1__ServerStatusReply rep = PSD__V1__SERVER_STATUS_REPLY__INIT;
    rep.task_index = 7;
    rpc_reply_ok(call, &rep.base);
}

/* PULL echoes the requested range filled with its offset. */
static void handle_pull(rpc_call *call, void *arg)
{
    (void)arg;
    const envelope *env = rpc_call_envelope(call);
    uint8_t *seg = rpc_reply_ok_segment(call, NULL, env->tensor->offset, env->tensor->count);
    float v = (float)env->tensor->offset;
    for (uint64_t i = 0; seg && i < env->tensor->count; i++)
        memcpy(seg + 4 * i, &v, 4);
}

static const rpc_method methods[] = {
    {PSD__V1__METHOD__SERVER_STATUS, "ServerStatus", &psd__v1__server_status_request__descriptor,
     handle_status, 0},
    {PSD__V1__METHOD__PULL, "Pull", &psd__v1__pull_request__descriptor, handle_pull, RPC_RANGE},
};

typedef struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int pending;
    int status;
    char message[256];
    uint32_t task_index;
    int method;
    uint64_t offset;
    int bad_values;
    atomic_int builds; /* requests built: one per attempt handed to nng */
} waiter;

static int build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    waiter *w = arg;
    atomic_fetch_add(&w->builds, 1);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = w->method;
    env.deadline_ms = deadline_ms;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    uint8_t body[32];
    if (w->method == PSD__V1__METHOD__PULL) {
        t.dtype = PSD__V1__DTYPE__FLOAT32;
        t.offset = w->offset;
        t.count = 256;
        env.tensor = &t;
        Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
        r.name = "x";
        env.body.len = psd__v1__pull_request__pack(&r, body);
        env.body.data = body;
    }
    return frame_build(out, &env, NULL, 0, NULL);
}

static void done(void *arg, int status, const char *message, const frame *reply)
{
    waiter *w = arg;
    pthread_mutex_lock(&w->lock);
    w->status = status;
    snprintf(w->message, sizeof(w->message), "%s", message);
    if (status == 0 && w->method == PSD__V1__METHOD__SERVER_STATUS) {
        Psd__V1__ServerStatusReply *r =
            psd__v1__server_status_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
        w->task_index = r ? r->task_index : 0;
        psd__v1__server_status_reply__free_unpacked(r, NULL);
    }
    if (status == 0 && w->method == PSD__V1__METHOD__PULL) {
        for (size_t i = 0; i < reply->segment_len / 4; i++) {
            float v;
            memcpy(&v, reply->segment + 4 * i, 4);
            if (v != (float)w->offset)
                w->bad_values++;
        }
    }
    w->pending--;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* A waiter for one ServerStatus call. */
static void status_waiter(waiter *w)
{
    *w = (waiter){.pending = 1, .method = PSD__V1__METHOD__SERVER_STATUS};
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
}

static void wait_all(waiter *w)
{
    pthread_mutex_lock(&w->lock);
    while (w->pending > 0)
        pthread_cond_wait(&w->cond, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

/* A server on url (chosen by the caller). */
static rpc_server *start_server_at(const char *url)
{
    rpc_server_config cfg = {.url = url,
                             .contexts = 8,
                             .max_parked = 8,
                             .threads = 2,
                             .max_message = 1 << 20,
                             .inline_max = 1024,
                             .default_deadline_ms = 1000,
                             .methods = methods,
                             .n_methods = 2};
    rpc_server *s;
    char err[256];
    assert_int_equal(rpc_server_start(&s, &cfg, err, sizeof(err)), 0);
    return s;
}

static rpc_server *start_server(char *url, size_t cap)
{
    snprintf(url, cap, "tcp://127.0.0.1:%d", test_free_port());
    return start_server_at(url);
}

static rpc_conn *open_conn(const char *url)
{
    rpc_conn_config cc = {.url = url, .connections = 2, .resend_ms = 60000, .max_message = 1 << 20};
    rpc_conn *c;
    char err[256];
    assert_int_equal(rpc_conn_open(&c, &cc, err, sizeof(err)), 0);
    return c;
}

static void test_retry_on_unavailable(void **state)
{
    (void)state;
    char url[64];
    rpc_server *s = start_server(url, sizeof(url));
    rpc_conn *c = open_conn(url);
    waiter w;
    status_waiter(&w);

    atomic_store(&unavailable_left, 2);
    atomic_store(&status_calls, 0);
    rpc_call_opts o = {.deadline_ms = 5000, .retries = 3, .backoff_ms = 20};
    uint64_t t0 = time_now_ns();
    assert_int_equal(rpc_conn_call(c, &o, build, done, &w), 0);
    wait_all(&w);
    uint64_t ms = (time_now_ns() - t0) / 1000000;
    assert_int_equal(w.status, STATUS_OK);
    assert_int_equal(w.task_index, 7);
    assert_int_equal(atomic_load(&status_calls), 3); /* two refusals, then success */
    assert_true(ms >= 20 + 40);                      /* backoff doubled */

    /* More refusals than retries: the caller sees UNAVAILABLE with the server's message. */
    atomic_store(&unavailable_left, 10);
    w.pending = 1;
    o.retries = 1;
    assert_int_equal(rpc_conn_call(c, &o, build, done, &w), 0);
    wait_all(&w);
    assert_int_equal(w.status, STATUS_UNAVAILABLE);
    assert_non_null(strstr(w.message, "busy"));
    rpc_conn_close(c);
    rpc_server_stop(s);
}

/* "slot moving" refusals are retried until the call's deadline whatever its retries and
 * backoff say (a freeze lasts milliseconds): 20 of them with retries 1 and a 1 s backoff
 * still end in the reply. */
static void test_slot_moving_retried_past_retries(void **state)
{
    (void)state;
    char url[64];
    rpc_server *s = start_server(url, sizeof(url));
    rpc_conn *c = open_conn(url);
    waiter w;
    status_waiter(&w);
    atomic_store(&say_moving, true);
    atomic_store(&unavailable_left, 20);
    atomic_store(&status_calls, 0);
    rpc_call_opts o = {.deadline_ms = 20000, .retries = 1, .backoff_ms = 1000};
    assert_int_equal(rpc_conn_call(c, &o, build, done, &w), 0);
    wait_all(&w);
    assert_int_equal(w.status, STATUS_OK);
    assert_int_equal(w.task_index, 7);
    assert_int_equal(atomic_load(&status_calls), 21);
    /* Retries off: refused at once, as any UNAVAILABLE. */
    atomic_store(&unavailable_left, 1);
    atomic_store(&status_calls, 0);
    w.pending = 1;
    o.retries = 0;
    assert_int_equal(rpc_conn_call(c, &o, build, done, &w), 0);
    wait_all(&w);
    assert_int_equal(w.status, STATUS_UNAVAILABLE);
    assert_non_null(strstr(w.message, "slot moving"));
    assert_int_equal(atomic_load(&status_calls), 1);
    atomic_store(&say_moving, false);
    rpc_conn_close(c);
    rpc_server_stop(s);
}

static void test_deadline_without_server(void **state)
{
    (void)state;
    /* A REP socket that accepts connections and never answers. */
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", test_free_port());
    nng_socket mute;
    assert_int_equal(nng_rep0_open(&mute), 0);
    assert_int_equal(nng_listen(mute, url, NULL, 0), 0);
    rpc_conn *c = open_conn(url);
    waiter w;
    status_waiter(&w);
    rpc_call_opts o = {.deadline_ms = 300, .retries = 3, .backoff_ms = 10};
    uint64_t t0 = time_now_ns();
    assert_int_equal(rpc_conn_call(c, &o, build, done, &w), 0);
    wait_all(&w);
    uint64_t ms = (time_now_ns() - t0) / 1000000;
    assert_int_equal(w.status, STATUS_DEADLINE_EXCEEDED);
    assert_non_null(strstr(w.message, "no reply"));
    assert_in_range(ms, 250, 2000);
    rpc_conn_close(c);
    nng_close(mute);
}

static void test_many_in_flight(void **state)
{
    (void)state;
    char url[64];
    rpc_server *s = start_server(url, sizeof(url));
    rpc_conn *c = open_conn(url);
    enum { N = 200 };
    static waiter w[N];
    rpc_call_opts o = {.deadline_ms = 10000, .retries = 0, .backoff_ms = 10};
    for (int i = 0; i < N; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        pthread_mutex_init(&w[i].lock, NULL);
        pthread_cond_init(&w[i].cond, NULL);
        w[i].pending = 1;
        w[i].method = PSD__V1__METHOD__PULL;
        w[i].offset = (uint64_t)i * 1000;
        assert_int_equal(rpc_conn_call(c, &o, build, done, &w[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        wait_all(&w[i]);
        assert_int_equal(w[i].status, STATUS_OK);
        assert_int_equal(w[i].bad_values, 0); /* each reply went to its own caller */
    }
    const rpc_stats *st = rpc_server_stats(s);
    assert_true(atomic_load(&st->requests) >= N);
    rpc_conn_close(c);
    rpc_server_stop(s);
}

/* A TCP gate in front of a server: the first connection it accepts is relayed to the
 * server; every later one is accepted and then held without a byte, as a connection whose
 * handshake never completes (a slow TLS handshake, a peer stalled mid-connect). */
typedef struct gate {
    int listen_fd, server_port, held[16], nheld;
    int relay_nth; /* which accepted connection is relayed (1: the first) */
    int accepted;
    atomic_bool stop;
    atomic_int relayed;
    pthread_t thread;
} gate;

static int tcp_connect_loopback(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

static void *gate_main(void *arg)
{
    gate *g = arg;
    int in = -1, out = -1;
    char buf[65536];
    while (!atomic_load(&g->stop)) {
        struct pollfd p[3] = {{.fd = g->listen_fd, .events = POLLIN},
                              {.fd = in, .events = POLLIN},
                              {.fd = out, .events = POLLIN}};
        if (poll(p, 3, 50) <= 0)
            continue;
        if (p[0].revents & POLLIN) {
            int fd = accept(g->listen_fd, NULL, NULL);
            if (fd >= 0 && in < 0 && ++g->accepted >= g->relay_nth) {
                in = fd;
                out = tcp_connect_loopback(g->server_port);
                atomic_store(&g->relayed, out >= 0);
            } else if (fd >= 0 && g->nheld < 16) {
                g->held[g->nheld++] = fd;
            } else if (fd >= 0) {
                close(fd);
            }
        }
        for (int k = 1; k <= 2; k++) {
            if (!(p[k].revents & (POLLIN | POLLHUP)))
                continue;
            ssize_t n = read(p[k].fd, buf, sizeof(buf));
            int to = k == 1 ? out : in;
            for (ssize_t off = 0; n > 0 && off < n;) {
                ssize_t w = write(to, buf + off, (size_t)(n - off));
                if (w <= 0)
                    break;
                off += w;
            }
        }
    }
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return NULL;
}

/* Starts a server behind a gate relaying its relay_nth connection; *c dials the gate with 4
 * connections. */
static rpc_server *start_gated(gate *g, int relay_nth, rpc_conn **c)
{
    char url[64];
    rpc_server *s = start_server(url, sizeof(url));
    *g = (gate){.server_port = atoi(strrchr(url, ':') + 1), .relay_nth = relay_nth};
    int gate_port = test_free_port();
    g->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(g->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)gate_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(g->listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(g->listen_fd, 16), 0);
    assert_int_equal(pthread_create(&g->thread, NULL, gate_main, g), 0);

    char gate_url[64];
    snprintf(gate_url, sizeof(gate_url), "tcp://127.0.0.1:%d", gate_port);
    rpc_conn_config cc = {
        .url = gate_url, .connections = 4, .resend_ms = 60000, .max_message = 1 << 20};
    char err[256];
    assert_int_equal(rpc_conn_open(c, &cc, err, sizeof(err)), 0);
    return s;
}

static void stop_gated(gate *g, rpc_conn *c, rpc_server *s)
{
    rpc_conn_close(c);
    atomic_store(&g->stop, true);
    pthread_join(g->thread, NULL);
    for (int i = 0; i < g->nheld; i++)
        close(g->held[i]);
    close(g->listen_fd);
    rpc_server_stop(s);
}

static void status_call_ok(rpc_conn *c)
{
    waiter w;
    status_waiter(&w);
    atomic_store(&unavailable_left, 0);
    rpc_call_opts o = {.deadline_ms = 2000, .retries = 0, .backoff_ms = 10};
    assert_int_equal(rpc_conn_call(c, &o, build, done, &w), 0);
    wait_all(&w);
    assert_int_equal(w.status, STATUS_OK);
    assert_int_equal(w.task_index, 7);
}

static void test_calls_go_to_connections_up(void **state)
{
    (void)state;
    gate g;
    rpc_conn *c;
    rpc_server *s = start_gated(&g, 1, &c);
    for (int i = 0; i < 500 && rpc_conn_sockets_up(c) == 0; i++)
        usleep(10000);
    assert_int_equal(atomic_load(&g.relayed), 1);
    assert_int_equal(rpc_conn_sockets_up(c), 1); /* one relayed, three held mid-handshake */
    /* Every call is answered through the one connection up: none waits for a held one. */
    for (int i = 0; i < 12; i++)
        status_call_ok(c);
    assert_int_equal(rpc_conn_sockets_up(c), 1);
    stop_gated(&g, c, s);
}

/* A call made at once, before any connection is up, on a socket whose connection then hangs
 * mid-handshake: it moves to the socket that connects and is answered within its deadline. */
static void test_first_call_moves_to_a_connection_up(void **state)
{
    (void)state;
    gate g;
    rpc_conn *c;
    rpc_server *s = start_gated(&g, 4, &c); /* the first three connections are held */
    status_call_ok(c);
    assert_int_equal(atomic_load(&g.relayed), 1);
    assert_int_equal(rpc_conn_sockets_up(c), 1);
    for (int i = 0; i < 4; i++)
        status_call_ok(c);
    stop_gated(&g, c, s);
}

/* A call made while the server is not there yet waits for a connection without handing nng
 * a request (nng 1.5.2 may send a queued request into a connection that closes as it starts,
 * and leak it), then is sent once and answered when the server comes, within its deadline. */
static void test_call_waits_for_a_connection(void **state)
{
    (void)state;
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", test_free_port());
    rpc_conn *c = open_conn(url);
    waiter w;
    status_waiter(&w);
    rpc_call_opts o = {.deadline_ms = 5000, .retries = 3, .backoff_ms = 10};
    uint64_t t0 = time_now_ns();
    assert_int_equal(rpc_conn_call(c, &o, build, done, &w), 0);
    usleep(600 * 1000);
    assert_int_equal(atomic_load(&w.builds), 0); /* nothing built while no connection is up */
    atomic_store(&unavailable_left, 0);
    rpc_server *s = start_server_at(url);
    wait_all(&w);
    uint64_t ms = (time_now_ns() - t0) / 1000000;
    assert_int_equal(w.status, STATUS_OK);
    assert_int_equal(w.task_index, 7);
    assert_int_equal(atomic_load(&w.builds), 1);
    assert_in_range(ms, 600, 4000);
    rpc_conn_close(c);
    rpc_server_stop(s);
}

/* An aio that slept (nng_sleep_aio) then times out on a receive and on a send: both complete
 * with NNG_ETIMEDOUT, the send leaving its message with the caller. nng 1.5.2 completed them
 * with success (the sleep's "expiry is fine" mark stayed on the aio; deploy/nng/patches). */
static void test_aio_times_out_after_a_sleep(void **state)
{
    (void)state;
    nng_aio *aio;
    assert_int_equal(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_sleep_aio(10, aio);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), 0);

    nng_socket rep, req;
    assert_int_equal(nng_rep0_open(&rep), 0); /* no peer: a receive waits for its timeout */
    nng_aio_set_timeout(aio, 50);
    nng_recv_aio(rep, aio);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), NNG_ETIMEDOUT);
    assert_null(nng_aio_get_msg(aio));

    nng_sleep_aio(10, aio);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), 0);
    assert_int_equal(nng_req0_open(&req), 0); /* no peer: a send waits for its timeout */
    nng_msg *m;
    assert_int_equal(nng_msg_alloc(&m, 16), 0);
    nng_aio_set_msg(aio, m);
    nng_aio_set_timeout(aio, 50);
    nng_send_aio(req, aio);
    nng_aio_wait(aio);
    assert_int_equal(nng_aio_result(aio), NNG_ETIMEDOUT);
    assert_ptr_equal(nng_aio_get_msg(aio), m); /* still the caller's */
    nng_msg_free(m);
    nng_aio_free(aio);
    nng_close(req);
    nng_close(rep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_on_unavailable),
        cmocka_unit_test(test_slot_moving_retried_past_retries),
        cmocka_unit_test(test_deadline_without_server),
        cmocka_unit_test(test_many_in_flight),
        cmocka_unit_test(test_calls_go_to_connections_up),
        cmocka_unit_test(test_first_call_moves_to_a_connection_up),
        cmocka_unit_test(test_call_waits_for_a_connection),
        cmocka_unit_test(test_aio_times_out_after_a_sleep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
