/* Integration: raw bytes over a real socket to a real ps-server. Each malformed request gets
 * a reply with the right status code and a message naming what was wrong, and the server goes
 * on serving a well-behaved client. */
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

static const char *server_bin;
static test_cluster tc;
static nng_socket sock;
static ps_client *client;
static ps_var *var;

static const char *const server_flags[] = {"--max-message-bytes", "1M", NULL};

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
    int rc = ps_client_open(&client, cfg);
    ps_config_destroy(cfg);
    if (rc != PS_OK)
        return -1;
    ps_var_spec s;
    ps_var_spec_init(&s, "bad/v");
    s.ndims = 1;
    s.dims[0] = 16;
    s.initializer = PS_INIT_CONSTANT;
    s.init_a = 2.0;
    return ps_var_create(client, &s, &var) == PS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    ps_client_close(client);
    nng_close(sock);
    return test_cluster_stop(&tc);
}

/* Sends raw bytes and returns the reply's status; copies its message into msg. */
static int send_raw(const void *data, size_t len, char *msg, size_t cap)
{
    nng_msg *m;
    assert_int_equal(nng_msg_alloc(&m, len), 0);
    if (len)
        memcpy(nng_msg_body(m), data, len);
    assert_int_equal(nng_sendmsg(sock, m, 0), 0);
    int rv = nng_recvmsg(sock, &m, 0);
    assert_int_equal(rv, 0);
    frame f;
    char err[256];
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), 0);
    assert_true(f.env->is_reply);
    int status = f.env->status;
    snprintf(msg, cap, "%s", f.env->message);
    frame_fini(&f);
    nng_msg_free(m);
    return status;
}

/* Builds a frame for method with body bytes and an optional tensor + segment. */
static size_t make_frame(uint8_t *out, size_t cap, int method, const uint8_t *body, size_t blen,
                         const Psd__V1__TensorMeta *t, const void *seg, size_t seglen)
{
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = method;
    env.request_id = 1;
    env.body.data = (uint8_t *)body;
    env.body.len = blen;
    env.tensor = (Psd__V1__TensorMeta *)t;
    nng_msg *m;
    assert_int_equal(frame_build(&m, &env, seg, seglen, NULL), 0);
    size_t n = nng_msg_len(m);
    assert_true(n <= cap);
    memcpy(out, nng_msg_body(m), n);
    nng_msg_free(m);
    return n;
}

static size_t pull_body(uint8_t *buf, const char *name)
{
    Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
    r.name = (char *)name;
    return psd__v1__pull_request__pack(&r, buf);
}

static void still_serving(void)
{
    float v[16];
    assert_int_equal(ps_pull(client, var, v), PS_OK);
    assert_true(v[0] == 2.0f);
}

static void test_garbage_and_truncation(void **state)
{
    (void)state;
    char msg[512];
    assert_int_equal(send_raw("", 0, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "truncated"));
    assert_int_equal(send_raw("hello world, not a frame", 24, msg, sizeof(msg)),
                     PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "magic"));
    uint8_t hdr[8] = {'P', 'S', 1, 0, 200, 0, 0, 0}; /* envelope of 200 bytes, none follow */
    assert_int_equal(send_raw(hdr, sizeof(hdr), msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "200"));
    uint8_t junk[24] = {'P',  'S',  1,    0,    16,   0,    0,    0,    0xff, 0xff, 0xff, 0xff,
                        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    assert_int_equal(send_raw(junk, sizeof(junk), msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "malformed envelope"));
    still_serving();
}

static void test_version_and_method(void **state)
{
    (void)state;
    char msg[512];
    uint8_t buf[256], body[64];
    size_t n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__SERVER_STATUS, NULL, 0, NULL, NULL, 0);
    buf[2] = 2; /* major version 2 */
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_FAILED_PRECONDITION);
    assert_non_null(strstr(msg, "version 2"));
    n = make_frame(buf, sizeof(buf), 77, NULL, 0, NULL, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_UNIMPLEMENTED);
    assert_non_null(strstr(msg, "77"));
    /* A body that is not the method's message: field 1 as a varint where a string is. */
    body[0] = 0x08;
    body[1] = 0x01;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 1;
    n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__PULL, body, 2, &t, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "PullRequest"));
    still_serving();
}

static void test_tensor_errors(void **state)
{
    (void)state;
    char msg[512];
    uint8_t buf[512], body[64];
    float seg[32] = {0};
    size_t bl = pull_body(body, "bad/v");
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;

    t.count = 4; /* push with 4 elements described, 3 sent */
    size_t n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__PUSH, body, bl, &t, seg, 12);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "mismatch"));

    t.dtype = 7; /* unknown dtype */
    n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__PUSH, body, bl, &t, seg, 16);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "dtype"));
    t.dtype = PSD__V1__DTYPE__FLOAT32;

    n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__PUSH, body, bl, NULL, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "tensor"));

    t.offset = 10; /* range past the end */
    t.count = 8;
    n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__PULL, body, bl, &t, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_OUT_OF_RANGE);
    assert_non_null(strstr(msg, "outside"));

    t.offset = 0;
    t.count = 4;
    bl = pull_body(body, "bad/nope");
    n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__PULL, body, bl, &t, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_NOT_FOUND);
    assert_non_null(strstr(msg, "bad/nope"));

    /* Through the public API: wrong range, wrong spec for an existing name. */
    float v[16];
    assert_int_equal(ps_pull_range(client, var, 12, 8, v), PS_OUT_OF_RANGE);
    ps_var_spec s;
    ps_var_spec_init(&s, "bad/v");
    s.ndims = 1;
    s.dims[0] = 17;
    ps_var *other;
    assert_int_equal(ps_var_create(client, &s, &other), PS_ALREADY_EXISTS);
    assert_non_null(strstr(ps_last_error(), "shape"));
    assert_int_equal(ps_var_lookup(client, "bad/missing", &other), PS_NOT_FOUND);
    s.name = "bad name with spaces";
    s.dims[0] = 1;
    assert_int_equal(ps_var_create(client, &s, &other), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "name"));
    still_serving();
}

/* A CreateVariable body whose spec name is the n raw bytes at name (packed by hand: protobuf-c
 * would stop at a NUL). */
static size_t create_body_raw(uint8_t *buf, const char *name, size_t n)
{
    Psd__V1__VariableSpec spec = PSD__V1__VARIABLE_SPEC__INIT;
    uint64_t dims[1] = {4};
    spec.dtype = PSD__V1__DTYPE__FLOAT32;
    spec.n_shape = 1;
    spec.shape = dims;
    spec.num_servers = 1;
    uint8_t rest[128];
    size_t rlen = psd__v1__variable_spec__pack(&spec, rest); /* name empty: not packed */
    uint8_t specbuf[256];
    size_t k = 0;
    specbuf[k++] = 0x0a; /* VariableSpec.name, length-delimited */
    specbuf[k++] = (uint8_t)n;
    memcpy(specbuf + k, name, n);
    k += n;
    memcpy(specbuf + k, rest, rlen);
    k += rlen;
    size_t o = 0;
    buf[o++] = 0x0a; /* CreateVariableRequest.spec */
    buf[o++] = (uint8_t)k;
    memcpy(buf + o, specbuf, k);
    return o + k;
}

static void test_names_as_bytes(void **state)
{
    (void)state;
    uint8_t body[512], buf[1024];
    char msg[512];
    /* "a\0x": protobuf-c would cut it to "a" (and "a\0y" would collide with it). */
    size_t bl = create_body_raw(body, "a\0x", 3);
    size_t n =
        make_frame(buf, sizeof(buf), PSD__V1__METHOD__CREATE_VARIABLE, body, bl, NULL, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "NUL byte"));
    assert_non_null(strstr(msg, "name"));
    assert_true(utf8_text_ok(msg, strlen(msg), NULL));
    /* Not UTF-8: refused, and the message says so without echoing the bytes raw. */
    bl = create_body_raw(body, "bad\xff\xfe", 5);
    n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__CREATE_VARIABLE, body, bl, NULL, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "UTF-8"));
    assert_true(utf8_text_ok(msg, strlen(msg), NULL));
    /* The same in a pull's name (the reply must decode with any protobuf: valid UTF-8). */
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 1;
    uint8_t pb[16] = {0x0a, 4, 'v', 0xc3, 0x28, 'z'};
    n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__PULL, pb, 6, &t, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_true(utf8_text_ok(msg, strlen(msg), NULL));
    /* Valid UTF-8 outside the name alphabet: refused with the name quoted, still UTF-8. */
    bl = create_body_raw(body, "caf\xc3\xa9\n", 6);
    n = make_frame(buf, sizeof(buf), PSD__V1__METHOD__CREATE_VARIABLE, body, bl, NULL, NULL, 0);
    assert_int_equal(send_raw(buf, n, msg, sizeof(msg)), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "invalid variable name"));
    assert_non_null(strstr(msg, "\\x0a"));
    assert_true(utf8_text_ok(msg, strlen(msg), NULL));
    still_serving();
}

static void test_oversized(void **state)
{
    (void)state;
    char msg[512];
    /* Over max-message-bytes (1 MiB) but under the transport's hard limit: answered. */
    size_t len = (1u << 20) + 4096;
    uint8_t *big = calloc(1, len);
    big[0] = 'P';
    big[1] = 'S';
    big[2] = 1;
    assert_int_equal(send_raw(big, len, msg, sizeof(msg)), PS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(msg, "max-message-bytes"));
    free(big);
    still_serving();
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_garbage_and_truncation), cmocka_unit_test(test_version_and_method),
        cmocka_unit_test(test_tensor_errors),          cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_names_as_bytes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
