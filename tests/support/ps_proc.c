#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ps_proc.h"
#include "cluster_proc.h"
#include "view_etcd.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <nng/protocol/reqrep0/req.h>

#include "cluster_proc.h"

void test_ps_init(test_ps *p, const char *server_bin, const char *prefix)
{
    memset(p, 0, sizeof(*p));
    p->server_bin = server_bin;
    p->port = test_free_port();
    snprintf(p->spec, sizeof(p->spec), "{\"ps\":[\"127.0.0.1:%d\"]}", p->port);
    snprintf(p->dir, sizeof(p->dir), "/tmp/%s-XXXXXX", prefix);
    assert_non_null(mkdtemp(p->dir));
    snprintf(p->log, sizeof(p->log), "%s/server.log", p->dir);
}

void test_ps_start(test_ps *p, const char *const *extra)
{
    p->pid = test_server_spawn(p->server_bin, p->spec, 0, extra, p->log);
    assert_true(p->pid > 0);
    if (test_wait_port(p->port, 10000) != 0) {
        fprintf(stderr, "server did not start; its log %s:\n", p->log);
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "cat %s >&2", p->log);
        assert_int_equal(system(cmd), 0);
        fail();
    }
}

void test_ps_signal_wait(test_ps *p, int sig, int expect)
{
    kill(p->pid, sig);
    int st = test_wait_exit(p->pid, 20000);
    p->pid = 0;
    assert_int_equal(st, expect);
}

void test_ps_cleanup(test_ps *p)
{
    if (p->pid > 0)
        test_ps_signal_wait(p, SIGKILL, 128 + SIGKILL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", p->dir);
    assert_int_equal(system(cmd), 0);
}

ps_client *test_ps_open_client(const test_ps *p, const char *resend_ms, const char *chunk)
{
    ps_config *cfg;
    ps_client *c = NULL;
    char tf[300];
    snprintf(tf, sizeof(tf), "{\"cluster\":%s}", p->spec);
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    if (ps_config_set(cfg, "cluster", tf) != PS_OK ||
        ps_config_set(cfg, "deadline-ms", "20000") != PS_OK ||
        (resend_ms && ps_config_set(cfg, "resend-ms", resend_ms) != PS_OK) ||
        (chunk && ps_config_set(cfg, "chunk-bytes", chunk) != PS_OK))
        fprintf(stderr, "config: %s\n", ps_last_error());
    else if (ps_client_open(&c, cfg) != PS_OK)
        fprintf(stderr, "open: %s\n", ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

ps_var *test_make_var(ps_client *c, const char *name, uint64_t n)
{
    return test_make_var_bound(c, name, n, PS_STALENESS_DEFAULT);
}

ps_client *test_cluster_open_worker(const test_cluster *tc, int worker, const char *const *settings)
{
    char tf[1400];
    test_cluster_tf_config(tc, "worker", worker, tf, sizeof(tf));
    ps_config *cfg;
    ps_client *c = NULL;
    assert_int_equal(ps_config_create(&cfg), PS_OK);
    if (ps_config_set(cfg, "tf-config", tf) != PS_OK)
        fail_msg("tf-config %s: %s", tf, ps_last_error());
    for (int i = 0; settings && settings[i]; i += 2)
        if (settings[i + 1] == NULL || ps_config_set(cfg, settings[i], settings[i + 1]) != PS_OK)
            fail_msg("setting %s: %s", settings[i], settings[i + 1] ? ps_last_error() : "no value");
    if (ps_client_open(&c, cfg) != PS_OK)
        fail_msg("worker %d: ps_client_open: %s", worker, ps_last_error());
    ps_config_destroy(cfg);
    return c;
}

ps_var *test_make_var_bound(ps_client *c, const char *name, uint64_t n, int staleness)
{
    ps_var_spec s;
    ps_var_spec_init(&s, name);
    s.ndims = 1;
    s.dims[0] = n;
    s.learning_rate = 1.0; /* SGD from zeros: params = -(sum of gradients) */
    s.staleness = staleness;
    ps_var *v;
    if (ps_var_create(c, &s, &v) != PS_OK) {
        fprintf(stderr, "create %s: %s\n", name, ps_last_error());
        return NULL;
    }
    return v;
}

ps_var *test_find_var(ps_client *c, const char *name)
{
    ps_var *v;
    if (ps_var_lookup(c, name, &v) != PS_OK) {
        fprintf(stderr, "lookup %s: %s\n", name, ps_last_error());
        return NULL;
    }
    return v;
}

void test_push_const(ps_client *c, ps_var *v, size_t n, float g)
{
    float *buf = malloc(n * sizeof(float));
    assert_non_null(buf);
    for (size_t i = 0; i < n; i++)
        buf[i] = g;
    assert_int_equal(ps_push(c, v, buf), PS_OK);
    free(buf);
}

void test_table_push_range(ps_table *t, uint32_t dim, int64_t first, int64_t n, float g)
{
    enum { CHUNK = 6000 };
    float *grads = malloc((size_t)CHUNK * dim * sizeof(float));
    int64_t *ids = malloc(CHUNK * sizeof(int64_t));
    assert_non_null(grads);
    assert_non_null(ids);
    for (size_t i = 0; i < (size_t)CHUNK * dim; i++)
        grads[i] = g;
    for (int64_t at = 0; at < n; at += CHUNK) {
        size_t k = (size_t)(n - at < CHUNK ? n - at : CHUNK);
        for (size_t i = 0; i < k; i++)
            ids[i] = first + at + (int64_t)i;
        int rc = ps_table_push(t, ids, k, grads);
        if (rc != PS_OK)
            fprintf(stderr, "push of ids %lld..: %s\n", (long long)(first + at), ps_last_error());
        assert_int_equal(rc, PS_OK);
    }
    free(grads);
    free(ids);
}

void test_expect_all(ps_client *c, const char *name, size_t n, float want)
{
    ps_var *v = test_find_var(c, name);
    assert_non_null(v);
    float *buf = malloc(n * sizeof(float));
    assert_non_null(buf);
    assert_int_equal(ps_pull(c, v, buf), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++)
        if (buf[i] != want && wrong++ < 3)
            fprintf(stderr, "%s[%zu] = %g, expected %g\n", name, i, buf[i], want);
    free(buf);
    assert_int_equal(wrong, 0);
}

void test_fork_clients(int n, int (*body)(int id, const void *arg), const void *arg)
{
    pid_t kids[64];
    assert_true(n > 0 && n <= 64);
    for (int k = 0; k < n; k++) {
        kids[k] = fork();
        assert_true(kids[k] >= 0);
        if (kids[k] == 0)
            _exit(body(k, arg));
    }
    for (int k = 0; k < n; k++) {
        int st;
        assert_int_equal(waitpid(kids[k], &st, 0), kids[k]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

nng_socket test_raw_dial(int port, int recv_timeout_ms)
{
    nng_socket s;
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
    assert_int_equal(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, recv_timeout_ms);
    assert_int_equal(nng_dial(s, url, NULL, 0), 0);
    return s;
}

int test_raw_request(nng_socket s, envelope *env, const void *seg, size_t seglen, frame *f,
                     nng_msg **m)
{
    nng_msg *req;
    assert_int_equal(frame_build(&req, env, seg, seglen, NULL), 0);
    assert_int_equal(nng_sendmsg(s, req, 0), 0);
    int rc = nng_recvmsg(s, m, 0);
    if (rc != 0)
        return -1000 - rc; /* no reply (e.g. the server died) */
    char err[256];
    assert_int_equal(frame_parse(*m, f, err, sizeof(err)), 0);
    return (int)f->env->status;
}

int test_raw_call(int port, envelope *env, const void *seg, size_t seglen, frame *f, nng_msg **m)
{
    nng_socket s = test_raw_dial(port, 15000);
    int st = test_raw_request(s, env, seg, seglen, f, m);
    nng_close(s);
    return st;
}

void test_view_prefix(const test_cluster *tc, char *buf, size_t cap)
{
    char addrs[TEST_MAX_SERVERS][32];
    const char *ps[TEST_MAX_SERVERS];
    for (int i = 0; i < tc->n && i < TEST_MAX_SERVERS; i++) {
        snprintf(addrs[i], sizeof(addrs[i]), "127.0.0.1:%d", tc->ports[i]);
        ps[i] = addrs[i];
    }
    view_default_prefix(ps, (size_t)tc->n, buf, cap);
}

uint64_t test_server_epoch(int port)
{
    Psd__V1__ServerStatusRequest sr = PSD__V1__SERVER_STATUS_REQUEST__INIT;
    uint8_t body[16];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__SERVER_STATUS;
    env.body.data = body;
    env.body.len = psd__v1__server_status_request__pack(&sr, body);
    frame f;
    nng_msg *m;
    if (test_raw_call(port, &env, NULL, 0, &f, &m) != 0)
        return 0;
    uint64_t e = f.env->epoch;
    frame_fini(&f);
    nng_msg_free(m);
    return e;
}

int test_group_checksum(int port, uint32_t group, uint64_t epoch, uint64_t *sum, uint32_t *vars,
                        uint64_t *lsn)
{
    Psd__V1__ReplicateRequest rq = PSD__V1__REPLICATE_REQUEST__INIT;
    rq.group = group;
    rq.epoch = epoch;
    rq.checksum = true;
    uint8_t body[64];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__REPLICATE;
    env.body.data = body;
    env.body.len = psd__v1__replicate_request__pack(&rq, body);
    frame f;
    nng_msg *m;
    int st = test_raw_call(port, &env, NULL, 0, &f, &m);
    if (st == 0) {
        Psd__V1__ReplicateReply *r =
            psd__v1__replicate_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        if (r == NULL) {
            st = -2000;
        } else {
            if (sum)
                *sum = r->checksum;
            if (vars)
                *vars = r->variables;
            if (lsn)
                *lsn = r->applied_lsn;
            psd__v1__replicate_reply__free_unpacked(r, NULL);
        }
    }
    if (st > -1000) {
        frame_fini(&f);
        nng_msg_free(m);
    }
    return st;
}

test_push_reply test_raw_push_reply(nng_socket s, const char *name, int worker_id, uint64_t client,
                                    uint64_t seq, float value)
{
    Psd__V1__PushRequest req = PSD__V1__PUSH_REQUEST__INIT;
    req.name = (char *)name;
    uint8_t body[128];
    assert_true(psd__v1__push_request__get_packed_size(&req) <= sizeof(body));
    size_t blen = psd__v1__push_request__pack(&req, body);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__PUSH;
    env.request_id = seq;
    env.client_id = client;
    env.seq = seq;
    env.worker_id = worker_id;
    env.body.data = body;
    env.body.len = blen;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 1;
    env.tensor = &t;
    frame f;
    nng_msg *m;
    test_push_reply out = {0};
    out.status = test_raw_request(s, &env, &value, sizeof(value), &f, &m);
    if (out.status < -999)
        return out;
    if (out.status == 0) {
        Psd__V1__PushReply *r =
            psd__v1__push_reply__unpack(NULL, f.env->body.len, f.env->body.data);
        assert_non_null(r);
        out.duplicate = r->duplicate;
        out.version = r->version;
        out.restored_version = r->restored_version;
        psd__v1__push_reply__free_unpacked(r, NULL);
    }
    frame_fini(&f);
    nng_msg_free(m);
    return out;
}

void test_raw_push(nng_socket s, const char *name, int worker_id, uint64_t client, uint64_t seq,
                   float value, int *status, bool *duplicate)
{
    test_push_reply r = test_raw_push_reply(s, name, worker_id, client, seq, value);
    *status = r.status;
    *duplicate = r.duplicate;
}

int test_http_get(int port, const char *path, char **body)
{
    if (body)
        *body = NULL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char req[256];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    for (;;) {
        if (len + 4096 > cap) {
            buf = realloc(buf, cap *= 2);
            assert_non_null(buf);
        }
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
        status = -1;
    const char *b = strstr(buf, "\r\n\r\n");
    if (body && status >= 0)
        *body = strdup(b ? b + 4 : "");
    free(buf);
    return status;
}
