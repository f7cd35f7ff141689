/* Replies of the RPC layer, in memory (rpc_server_open_local): a handler whose reply body
 * outgrows the envelope's 1 MiB bound gets INTERNAL naming the cause (not "produced no
 * reply"), the INTERNAL is logged with that cause, and rpc_call_max_reply_body is below the
 * bound whatever max-message-bytes says. Requests run from borrowed bytes are read in place,
 * and a reference to a request taken in its handler outlives the call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "log.h"
#include "rpc_server.h"
#include "status.h"

static size_t body_bytes; /* what the handler puts in next_page_token */
static size_t max_body;   /* rpc_call_max_reply_body seen by the handler */

static void handle_list(rpc_call *call, void *arg)
{
    (void)arg;
    max_body = rpc_call_max_reply_body(call);
    char *token = malloc(body_bytes + 1);
    assert_non_null(token);
    memset(token, 'a', body_bytes);
    token[body_bytes] = '\0';
    Psd__V1__ListVariablesReply rep = PSD__V1__LIST_VARIABLES_REPLY__INIT;
    rep.next_page_token = token;
    rpc_reply_ok(call, &rep.base);
    free(token);
}

/* What the Push handler saw: the request's bytes, its segment, and a reference taken. */
static const uint8_t *seen_req, *seen_seg;
static size_t seen_len, seen_seg_len;
static rpc_held *held;
static const uint8_t *held_data;
static size_t held_len;
static int pushes;

static void handle_push(rpc_call *call, void *arg)
{
    (void)arg;
    pushes++;
    seen_req = rpc_call_request(call, &seen_len);
    seen_seg = rpc_call_segment(call, &seen_seg_len);
    held = rpc_call_hold_request(call, &held_data, &held_len);
    Psd__V1__PushReply rep = PSD__V1__PUSH_REPLY__INIT;
    rpc_reply_ok(call, &rep.base);
}

static const rpc_method methods[] = {
    {PSD__V1__METHOD__LIST_VARIABLES, "ListVariables", &psd__v1__list_variables_request__descriptor,
     handle_list, 0},
    {PSD__V1__METHOD__PUSH, "Push", &psd__v1__push_request__descriptor, handle_push, RPC_SEGMENT},
};

static char logged[4096];

static void sink(int level, const char *line, void *arg)
{
    (void)arg;
    if (level >= LOG_ERROR && strstr(line, "INTERNAL"))
        snprintf(logged, sizeof(logged), "%s", line);
}

/* One ListVariables request through s; returns the reply's status, its message in msg. */
static int list_call(rpc_server *s, char *msg, size_t cap)
{
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__LIST_VARIABLES;
    env.request_id = 1;
    nng_msg *m;
    assert_int_equal(frame_build(&m, &env, NULL, 0, NULL), 0);
    void *reply;
    size_t reply_len;
    assert_int_equal(
        rpc_server_handle_bytes(s, nng_msg_body(m), nng_msg_len(m), &reply, &reply_len), 0);
    nng_msg_free(m);
    assert_int_equal(nng_msg_alloc(&m, reply_len), 0);
    memcpy(nng_msg_body(m), reply, reply_len);
    free(reply);
    frame f;
    char err[256];
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), 0);
    int status = f.env->status;
    snprintf(msg, cap, "%s", f.env->message);
    frame_fini(&f);
    nng_msg_free(m);
    return status;
}

static void test_oversized_body_is_internal_and_logged(void **state)
{
    (void)state;
    rpc_server_config cfg = {
        .max_message = 64u << 20, .default_deadline_ms = 1000, .methods = methods, .n_methods = 1};
    rpc_server *s = rpc_server_open_local(&cfg);
    assert_non_null(s);
    log_set_sink(sink, NULL);
    char msg[1200];

    /* A body that fits: OK, nothing logged. */
    logged[0] = '\0';
    body_bytes = 1000;
    assert_int_equal(list_call(s, msg, sizeof(msg)), STATUS_OK);
    assert_string_equal(logged, "");
    /* The bound for bodies stays under the envelope's, although max-message-bytes is 64 MiB. */
    assert_true(max_body < FRAME_MAX_ENVELOPE);
    assert_true(max_body >= FRAME_MAX_ENVELOPE - RPC_ENVELOPE_RESERVE);
    /* Exactly the bound still fits. */
    body_bytes = max_body - 8;
    assert_int_equal(list_call(s, msg, sizeof(msg)), STATUS_OK);

    /* 1.5 MiB: INTERNAL naming the cause, and the same cause in the log. */
    body_bytes = 3u << 19;
    assert_int_equal(list_call(s, msg, sizeof(msg)), STATUS_INTERNAL);
    assert_non_null(strstr(msg, "ListVariables built a reply envelope of"));
    assert_non_null(strstr(msg, "1048576"));
    assert_null(strstr(msg, "produced no reply"));
    assert_non_null(strstr(logged, "ListVariables answered INTERNAL"));
    assert_non_null(strstr(logged, "1048576"));

    log_set_sink(NULL, NULL);
    rpc_server_close_local(s);
}

/* A small max-message-bytes bounds the body below it. */
static void test_body_bound_follows_max_message(void **state)
{
    (void)state;
    rpc_server_config cfg = {
        .max_message = 64u << 10, .default_deadline_ms = 1000, .methods = methods, .n_methods = 1};
    rpc_server *s = rpc_server_open_local(&cfg);
    assert_non_null(s);
    char msg[1200];
    body_bytes = 10;
    assert_int_equal(list_call(s, msg, sizeof(msg)), STATUS_OK);
    assert_true(max_body <= (64u << 10) - RPC_ENVELOPE_RESERVE);
    body_bytes = max_body - 8;
    assert_int_equal(list_call(s, msg, sizeof(msg)), STATUS_OK);
    rpc_server_close_local(s);
}

/* A Push of 64 floats as a frame; the caller frees it. */
static nng_msg *push_frame(void)
{
    Psd__V1__PushRequest rq = PSD__V1__PUSH_REQUEST__INIT;
    rq.name = "v";
    uint8_t body[64];
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    env.method = PSD__V1__METHOD__PUSH;
    env.request_id = 7;
    env.body.data = body;
    env.body.len = psd__v1__push_request__pack(&rq, body);
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 64;
    env.tensor = &t;
    nng_msg *m;
    uint8_t *seg;
    assert_int_equal(frame_build(&m, &env, NULL, 64 * 4, &seg), 0);
    for (int i = 0; i < 64 * 4; i++)
        seg[i] = (uint8_t)i;
    return m;
}

/* rpc_server_handle_borrowed reads the caller's bytes in place (no copy), gives the handler no
 * reference to them (they are not the call's own), and refuses a malformed request without
 * running a handler. */
static void test_borrowed_bytes_are_read_in_place(void **state)
{
    (void)state;
    rpc_server_config cfg = {
        .max_message = 1u << 20, .default_deadline_ms = 1000, .methods = methods, .n_methods = 2};
    rpc_server *s = rpc_server_open_local(&cfg);
    assert_non_null(s);
    nng_msg *m = push_frame();
    const uint8_t *b = nng_msg_body(m);
    size_t n = nng_msg_len(m);
    pushes = 0;
    assert_int_equal(rpc_server_handle_borrowed(s, b, n), 0);
    assert_int_equal(pushes, 1);
    assert_ptr_equal(seen_req, b);
    assert_int_equal(seen_len, n);
    assert_ptr_equal(seen_seg, b + n - 64 * 4);
    assert_int_equal(seen_seg_len, 64 * 4);
    assert_null(held);

    /* Garbage: refused before any handler (and logged from the borrowed bytes). */
    uint8_t junk[16] = {'X', 'Y', 1, 0, 4, 0, 0, 0};
    assert_int_equal(rpc_server_handle_borrowed(s, junk, sizeof(junk)), 0);
    assert_int_equal(pushes, 1);
    nng_msg_free(m);
    rpc_server_close_local(s);
}

/* A request message the call owns can be held past its reply: the reference keeps the bytes,
 * equal to the request, until it is released (twice taken, twice released). */
static void test_held_request_outlives_the_call(void **state)
{
    (void)state;
    rpc_server_config cfg = {
        .max_message = 1u << 20, .default_deadline_ms = 1000, .methods = methods, .n_methods = 2};
    rpc_server *s = rpc_server_open_local(&cfg);
    assert_non_null(s);
    nng_msg *m = push_frame();
    void *reply;
    size_t reply_len;
    pushes = 0;
    assert_int_equal(
        rpc_server_handle_bytes(s, nng_msg_body(m), nng_msg_len(m), &reply, &reply_len), 0);
    free(reply);
    assert_int_equal(pushes, 1);
    assert_non_null(held);
    assert_int_equal(held_len, nng_msg_len(m));
    assert_true(held_data != (const uint8_t *)nng_msg_body(m)); /* the call's own copy */
    rpc_held *second = rpc_held_ref(held);
    rpc_held_release(held);
    assert_memory_equal(held_data, nng_msg_body(m), held_len);
    rpc_held_release(second);
    rpc_held_release(NULL);
    nng_msg_free(m);
    rpc_server_close_local(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_oversized_body_is_internal_and_logged),
        cmocka_unit_test(test_body_bound_follows_max_message),
        cmocka_unit_test(test_borrowed_bytes_are_read_in_place),
        cmocka_unit_test(test_held_request_outlives_the_call),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
