/* Envelope and frame encode/decode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "frame.h"
#include "status.h"

static nng_msg *build(const envelope *env, const void *seg, size_t seglen)
{
    nng_msg *m;
    assert_int_equal(frame_build(&m, env, seg, seglen, NULL), 0);
    return m;
}

static void test_roundtrip_with_segment(void **state)
{
    (void)state;
    float data[5] = {1, -2, 3.5f, 0, 1e30f};
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.offset = 100;
    t.count = 5;
    env.method = PSD__V1__METHOD__PUSH;
    env.request_id = 42;
    env.client_id = 0x1122334455667788ull;
    env.seq = 9;
    env.clock = -3;
    env.worker_id = 2;
    env.tensor = &t;
    nng_msg *m = build(&env, data, sizeof(data));
    const uint8_t *p = nng_msg_body(m);
    assert_int_equal(p[0], 'P');
    assert_int_equal(p[1], 'S');
    assert_int_equal(p[2], FRAME_VERSION_MAJOR);
    size_t env_len = (size_t)p[4] | (size_t)p[5] << 8 | (size_t)p[6] << 16 | (size_t)p[7] << 24;
    assert_int_equal(env_len, psd__v1__envelope__get_packed_size(&env));
    size_t off = frame_segment_offset(env_len);
    assert_int_equal(off % 8, 0);
    assert_int_equal(nng_msg_len(m), off + sizeof(data));
    for (size_t i = 8 + env_len; i < off; i++)
        assert_int_equal(p[i], 0); /* padding is zero */

    frame f;
    char err[256];
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_OK);
    assert_int_equal(f.env->method, PSD__V1__METHOD__PUSH);
    assert_int_equal(f.env->request_id, 42);
    assert_true(f.env->client_id == 0x1122334455667788ull);
    assert_int_equal(f.env->seq, 9);
    assert_int_equal(f.env->clock, -3);
    assert_int_equal(f.env->worker_id, 2);
    assert_true(f.has_segment);
    assert_int_equal(f.segment_len, sizeof(data));
    assert_memory_equal(f.segment, data, sizeof(data));
    assert_int_equal(f.env->tensor->offset, 100);
    frame_fini(&f);
    frame_fini(&f); /* idempotent */
    nng_msg_free(m);
}

/* nng allocates message bodies without zeroing them (deploy/nng/patches/0005): frame_build
 * must write the padding between the envelope and the segment itself. Each size is built into
 * a freed message's memory that was filled with 0xa5 first (the allocator hands it back to an
 * allocation of the same size; under ASan every new allocation is filled anyway). */
static void test_padding_written(void **state)
{
    (void)state;
    float data[3] = {1, 2, 3};
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 3;
    bool pads[8] = {false};
    for (uint64_t id = 1; id < (1ull << 56); id <<= 1) {
        envelope env = PSD__V1__ENVELOPE__INIT;
        env.method = PSD__V1__METHOD__PUSH;
        env.request_id = id;
        env.tensor = &t;
        size_t env_len = psd__v1__envelope__get_packed_size(&env);
        size_t off = frame_segment_offset(env_len);
        pads[off - 8 - env_len] = true;
        nng_msg *dirty;
        assert_int_equal(nng_msg_alloc(&dirty, off + sizeof(data)), 0);
        memset(nng_msg_body(dirty), 0xa5, nng_msg_len(dirty));
        nng_msg_free(dirty);
        nng_msg *m = build(&env, data, sizeof(data));
        const uint8_t *p = nng_msg_body(m);
        for (size_t i = 8 + env_len; i < off; i++)
            assert_int_equal(p[i], 0);
        assert_memory_equal(p + off, data, sizeof(data));
        nng_msg_free(m);
    }
    size_t sizes = 0;
    for (size_t k = 1; k < 8; k++)
        sizes += pads[k];
    assert_true(sizes >= 4); /* the loop made envelopes with several padding lengths */
}

static void test_range_without_segment(void **state)
{
    (void)state;
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 1000;
    env.method = PSD__V1__METHOD__PULL;
    env.tensor = &t;
    nng_msg *m = build(&env, NULL, 0);
    /* No padding when no segment follows. */
    assert_int_equal(nng_msg_len(m), 8 + psd__v1__envelope__get_packed_size(&env));
    frame f;
    char err[256];
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_OK);
    assert_false(f.has_segment);
    assert_null(f.segment);
    assert_int_equal(f.env->tensor->count, 1000);
    frame_fini(&f);
    nng_msg_free(m);
}

static void test_errors(void **state)
{
    (void)state;
    frame f;
    char err[256];
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__CLOCK;
    env.message = "x";
    nng_msg *m = build(&env, NULL, 0);
    uint8_t *p = nng_msg_body(m);

    p[3] = 9; /* another minor version is fine */
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_OK);
    frame_fini(&f);
    p[2] = 3; /* another major is not */
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_FAILED_PRECONDITION);
    assert_non_null(strstr(err, "3.9"));
    p[2] = 1;
    p[0] = 'X';
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "magic"));
    p[0] = 'P';
    p[4] = (uint8_t)(p[4] + 1); /* envelope longer than what follows */
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "truncated"));
    p[4] = (uint8_t)(p[4] - 1);
    assert_int_equal(nng_msg_append(m, "abc", 3), 0); /* bytes after an envelope without tensor */
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "no tensor"));
    nng_msg_chop(m, nng_msg_len(m) - 3);
    nng_msg_chop(m, nng_msg_len(m)); /* now empty */
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_INVALID_ARGUMENT);
    nng_msg_free(m);

    /* Segment length that does not match the described count. */
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = PSD__V1__DTYPE__FLOAT32;
    t.count = 3;
    env.tensor = &t;
    float d[2] = {1, 2};
    m = build(&env, d, sizeof(d));
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "mismatch"));
    nng_msg_free(m);
    t.dtype = 5;
    t.count = 2;
    m = build(&env, d, sizeof(d));
    assert_int_equal(frame_parse(m, &f, err, sizeof(err)), STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "dtype"));
    nng_msg_free(m);
}

static void test_status_names(void **state)
{
    (void)state;
    assert_string_equal(status_name(STATUS_OK), "OK");
    assert_string_equal(status_name(STATUS_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED");
    assert_string_equal(status_name(STATUS_UNAUTHENTICATED), "UNAUTHENTICATED");
    assert_string_equal(status_name(99), "UNKNOWN_STATUS");
    assert_int_equal(status_from_nng(NNG_ETIMEDOUT), STATUS_DEADLINE_EXCEEDED);
    assert_int_equal(status_from_nng(NNG_ECONNREFUSED), STATUS_UNAVAILABLE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_with_segment), cmocka_unit_test(test_padding_written),
        cmocka_unit_test(test_range_without_segment),  cmocka_unit_test(test_errors),
        cmocka_unit_test(test_status_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
