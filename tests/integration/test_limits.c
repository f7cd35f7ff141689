/* Integration: the server's limits (issue "Security"). One ps-server with small limits:
 * max-server-bytes, max-variables, max-message-bytes both ways (pull replies), paging of
 * ListVariables and a bounded ServerStatus with thousands of variables, and the dedup table's
 * eviction (dedup-max-clients) refusing a resent push of an evicted client with ABORTED. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "cluster_proc.h"
#include "frame.h"
#include "psclient.h"
#include "util.h"

#define NVARS 2500 /* with 64K messages: a listing of them needs several pages */

static const char *server_bin;
static test_cluster tc;
static nng_socket sock;
static ps_client *client;

static const char *const server_flags[] = {"--max-message-bytes",
                                           "64K",
                                           "--max-variables",
                                           "3000",
                                           "--max-server-bytes",
                                           "4M",
                                           "--dedup-max-clients",
                                           "2",
                                           NULL};

static int setup(void **state)
{
    (void)state;
    if (test_cluster_start(&tc, server_bin, 1, server_flags) != 0)
        return -1;
    char url[64];
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", tc.ports[0]);
    if (nng_req0_open(&sock) != 0)
        return -1;
    nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, 5000);
    nng_socket_set_size(sock, NNG_OPT_RECVMAXSZ, 0);
    if (nng_dial(sock, url, NULL, 0) != 0)
        return -1;
    ps_config *cfg;
    char tf[1200];
    test_cluster_tf_config(&tc, NULL, 0, tf, sizeof(tf));
    ps_config_create(&cfg);
    ps_config_set(cfg, "cluster", tf);
    ps_config_set(cfg, "max-message-bytes", "64K");
    ps_config_set(cfg, "chunk-bytes", "1M"); /* more than fits: the library must cut it */
    int rc = ps_client_open(&client, cfg);
    ps_config_destroy(cfg);
    return rc == PS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    ps_client_close(client);
    nng_close(sock);
    return test_cluster_stop(&tc);
}

/* Sends a frame (its segment: seglen bytes at seg) and returns the reply's status and its
 * message in msg (checked to be valid UTF-8). */
static int call_raw(const envelope *env, const void *seg, size_t seglen, char *msg, size_t cap)
{
    nng_msg *m;
    assert_int_equal(frame_build(&m, env, seg, seglen, NULL), 0);
    assert_int_equal(nng_sendmsg(sock, m, 0), 0);
    assert_int_equal(nng_recvmsg(sock, &m, 0), 0);
    frame f;
    char err[256];
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), 0);
    assert_true(f.env->is_reply);
    assert_true(utf8_text_ok(f.env->message, strlen(f.env->message), NULL));
    int status = f.env->status;
    snprintf(msg, cap, "%s", f.env->message);
    frame_fini(&f);
    nng_msg_free(m);
    return status;
}

static int create(const char *name, uint64_t n, ps_var **out)
{
    ps_var_spec s;
    ps_var_spec_init(&s, name);
    s.ndims = 1;
    s.dims[0] = n;
    return ps_var_create(client, &s, out);
}

static void test_server_bytes(void **state)
{
    (void)state;
    ps_var *v;
    /* 10^12 floats passes the spec check (at most 2^40 elements) but not max-server-bytes. */
    assert_int_equal(create("huge", 1000000000000ull, &v), PS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(ps_last_error(), "max-server-bytes"));
    /* ... and names the command that adds a server. */
    assert_non_null(strstr(ps_last_error(), "psctl add-server"));
    /* 1.2 MB of parameters with plain SGD fits in 4M; four of them do not. */
    int refused = 0;
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof(name), "big%d", i);
        int rc = create(name, 300000, &v);
        if (rc == PS_RESOURCE_EXHAUSTED) {
            assert_non_null(strstr(ps_last_error(), "max-server-bytes"));
            refused++;
        } else {
            assert_int_equal(rc, PS_OK);
        }
    }
    assert_int_equal(refused, 1);
}

static void test_pull_reply_limit(void **state)
{
    (void)state;
    /* big0 (300000 floats, 1.2 MB) is larger than a message: the library pulls it in chunks
     * that fit, although chunk-bytes asks for more. */
    ps_var *v;
    assert_int_equal(ps_var_lookup(client, "big0", &v), PS_OK);
    float *buf = malloc(300000 * sizeof(float));
    assert_int_equal(ps_pull(client, v, buf), PS_OK);
    free(buf);
    /* One raw pull of the whole range is refused, pointing at ranges. */
    uint8_t body[64];
    Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
    r.name = "big0";
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 300000;
    env.method = PSD__V1__METHOD__PULL;
    env.request_id = 7;
    env.tensor = &t;
    env.body.data = body;
    env.body.len = psd__v1__pull_request__pack(&r, body);
    char msg[512];
    assert_int_equal(call_raw(&env, NULL, 0, msg, sizeof(msg)), PS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(msg, "max-message-bytes"));
    assert_non_null(strstr(msg, "ranges"));
}

static void test_many_variables(void **state)
{
    (void)state;
    ps_var *v = NULL;
    for (int i = 0; i < NVARS; i++) {
        char name[32];
        snprintf(name, sizeof(name), "small/%05d", i);
        assert_int_equal(create(name, 1, &v), PS_OK);
    }
    /* The listing (about 100 KB) does not fit in one 64K reply: paged. */
    char **names;
    size_t n;
    assert_int_equal(ps_var_list(client, &names, &n), PS_OK);
    size_t small = 0;
    for (size_t i = 0; i < n; i++)
        small += strncmp(names[i], "small/", 6) == 0;
    assert_int_equal(small, NVARS);
    ps_names_free(names, n);
    /* Status stays small and counts them all. */
    ps_server_stats st;
    assert_int_equal(ps_server_status(client, 0, &st), PS_OK);
    assert_true(st.num_variables >= NVARS);
    ps_staleness_stats ss;
    assert_int_equal(ps_var_staleness(client, v, &ss), PS_OK);
}

static void test_max_variables(void **state)
{
    (void)state;
    ps_var *v;
    int rc = PS_OK;
    int i;
    for (i = 0; i < 1000 && rc == PS_OK; i++) {
        char name[32];
        snprintf(name, sizeof(name), "more/%05d", i);
        rc = create(name, 1, &v);
    }
    assert_int_equal(rc, PS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(ps_last_error(), "max-variables"));
    ps_server_stats st;
    assert_int_equal(ps_server_status(client, 0, &st), PS_OK);
    assert_int_equal(st.num_variables, 3000);
}

/* A raw push of one float by (client, seq); returns the status. */
static int push(uint64_t client_id, uint64_t seq, char *msg, size_t cap)
{
    uint8_t body[64];
    Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
    r.name = "small/00000";
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 1;
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__PUSH;
    env.request_id = seq;
    env.client_id = client_id;
    env.seq = seq;
    env.worker_id = -1;
    env.tensor = &t;
    env.body.data = body;
    env.body.len = psd__v1__push_request__pack(&r, body);
    float g = 1.0f;
    return call_raw(&env, &g, sizeof(g), msg, cap);
}

static void test_dedup_eviction(void **state)
{
    (void)state;
    char msg[512];
    assert_int_equal(push(0xA1, 1, msg, sizeof(msg)), PS_OK);
    assert_int_equal(push(0xA1, 1, msg, sizeof(msg)), PS_OK); /* a duplicate, dropped */
    /* Two more clients: with dedup-max-clients 2, 0xA1 (least recently heard) is evicted. */
    assert_int_equal(push(0xB2, 1, msg, sizeof(msg)), PS_OK);
    assert_int_equal(push(0xC3, 1, msg, sizeof(msg)), PS_OK);
    /* Its resent push can't be told from a new one: refused, never applied twice. */
    assert_int_equal(push(0xA1, 1, msg, sizeof(msg)), PS_ABORTED);
    assert_non_null(strstr(msg, "dedup-max-clients"));
    /* Its next push is new. */
    assert_int_equal(push(0xA1, 2, msg, sizeof(msg)), PS_OK);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_bytes),   cmocka_unit_test(test_pull_reply_limit),
        cmocka_unit_test(test_many_variables), cmocka_unit_test(test_max_variables),
        cmocka_unit_test(test_dedup_eviction),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
