/* The wire frame (frame.h): an Envelope and its optional tensor segment, built and parsed. */
#include "frame.h"

#include <stdio.h>
#include <string.h>

#include "status.h"
#include "util.h"

size_t frame_segment_offset(size_t env_len)
{
    return (FRAME_HEADER_SIZE + env_len + 7u) & ~(size_t)7u;
}

size_t frame_dtype_size(int dtype)
{
    switch (dtype) {
    case PSD__V1__DTYPE__FLOAT32:
        return 4;
    case PSD__V1__DTYPE__BFLOAT16:
        return 2;
    default:
        return 0;
    }
}

/* The conversion loops are branch-free so that the compiler vectorises them, and compiled
 * for AVX2 and the x86-64 baseline (picked at start-up, as server/optimizer.c's loops). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define CONVERT_LOOP __attribute__((target_clones("avx2", "default"), optimize("tree-vectorize")))
#else
#define CONVERT_LOOP
#endif

/* float32 to bfloat16: round to nearest, ties to even; a NaN stays a (quiet) NaN. */
CONVERT_LOOP static void put_bf16(uint16_t *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof(u));
        uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        uint32_t nan = (u >> 16) | 0x40u;
        dst[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
    }
}

CONVERT_LOOP static void get_bf16(float *restrict dst, const uint16_t *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, sizeof(u));
    }
}

/* The wire side has no alignment guarantee: whole blocks go through aligned stack buffers
 * when it is not aligned for uint16_t. */
void frame_put_floats(uint8_t *dst, const float *src, size_t n, int dtype)
{
    if (dtype != PSD__V1__DTYPE__BFLOAT16) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    if (((uintptr_t)dst & 1u) == 0) {
        put_bf16((uint16_t *)(void *)dst, src, n);
        return;
    }
    uint16_t block[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t k = n - i < 1024 ? n - i : 1024;
        put_bf16(block, src + i, k);
        memcpy(dst + 2 * i, block, 2 * k);
    }
}

void frame_get_floats(float *dst, const uint8_t *src, size_t n, int dtype)
{
    if (dtype != PSD__V1__DTYPE__BFLOAT16) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    if (((uintptr_t)src & 1u) == 0) {
        get_bf16(dst, (const uint16_t *)(const void *)src, n);
        return;
    }
    uint16_t block[1024];
    for (size_t i = 0; i < n; i += 1024) {
        size_t k = n - i < 1024 ? n - i : 1024;
        memcpy(block, src + 2 * i, 2 * k);
        get_bf16(dst + i, block, k);
    }
}

int frame_build(nng_msg **out, const envelope *env, const void *segment, size_t segment_len,
                uint8_t **segment_out)
{
    size_t env_len = psd__v1__envelope__get_packed_size(env);
    if (env_len > FRAME_MAX_ENVELOPE)
        return NNG_EMSGSIZE;
    /* Padding only precedes a segment: a frame without one ends with the envelope. */
    size_t seg_off = segment_len ? frame_segment_offset(env_len) : FRAME_HEADER_SIZE + env_len;
    nng_msg *m;
    int rv = nng_msg_alloc(&m, seg_off + segment_len);
    if (rv != 0)
        return rv;
    uint8_t *p = nng_msg_body(m);
    p[0] = FRAME_MAGIC0;
    p[1] = FRAME_MAGIC1;
    p[2] = FRAME_VERSION_MAJOR;
    p[3] = FRAME_VERSION_MINOR;
    p[4] = (uint8_t)(env_len & 0xff);
    p[5] = (uint8_t)((env_len >> 8) & 0xff);
    p[6] = (uint8_t)((env_len >> 16) & 0xff);
    p[7] = (uint8_t)((env_len >> 24) & 0xff);
    psd__v1__envelope__pack(env, p + FRAME_HEADER_SIZE);
    memset(p + FRAME_HEADER_SIZE + env_len, 0, seg_off - FRAME_HEADER_SIZE - env_len);
    if (segment && segment_len)
        memcpy(p + seg_off, segment, segment_len);
    if (segment_out)
        *segment_out = segment_len ? p + seg_off : NULL;
    *out = m;
    return 0;
}

int frame_parse(nng_msg *msg, frame *f, char *err, size_t errlen)
{
    return frame_parse_bytes(nng_msg_body(msg), nng_msg_len(msg), f, err, errlen);
}

int frame_parse_bytes(const uint8_t *p, size_t len, frame *f, char *err, size_t errlen)
{
    memset(f, 0, sizeof(*f));
    if (len < FRAME_HEADER_SIZE) {
        snprintf(err, errlen, "truncated message: %zu bytes, the frame header alone is %d", len,
                 FRAME_HEADER_SIZE);
        return STATUS_INVALID_ARGUMENT;
    }
    if (p[0] != FRAME_MAGIC0 || p[1] != FRAME_MAGIC1) {
        snprintf(err, errlen, "not a psd frame: bad magic 0x%02x%02x (expected 0x5053 \"PS\")",
                 p[0], p[1]);
        return STATUS_INVALID_ARGUMENT;
    }
    if (p[2] != FRAME_VERSION_MAJOR) {
        snprintf(err, errlen, "protocol version %u.%u not supported: this peer speaks %d.x", p[2],
                 p[3], FRAME_VERSION_MAJOR);
        return STATUS_FAILED_PRECONDITION;
    }
    size_t env_len = (size_t)p[4] | (size_t)p[5] << 8 | (size_t)p[6] << 16 | (size_t)p[7] << 24;
    if (env_len > FRAME_MAX_ENVELOPE) {
        snprintf(err, errlen, "envelope length %zu exceeds the limit of %u bytes", env_len,
                 FRAME_MAX_ENVELOPE);
        return STATUS_INVALID_ARGUMENT;
    }
    if (env_len > len - FRAME_HEADER_SIZE) {
        snprintf(err, errlen,
                 "truncated message: header says the envelope is %zu bytes but only %zu follow",
                 env_len, len - FRAME_HEADER_SIZE);
        return STATUS_INVALID_ARGUMENT;
    }
    envelope *env = psd__v1__envelope__unpack(NULL, env_len, p + FRAME_HEADER_SIZE);
    if (env == NULL) {
        snprintf(err, errlen, "malformed envelope: %zu bytes do not decode as psd.v1.Envelope",
                 env_len);
        return STATUS_INVALID_ARGUMENT;
    }
    /* The segment is present iff any byte follows the envelope. A pull request names a range
     * in env->tensor but carries no segment; the method table decides what each method needs. */
    size_t seg_off = frame_segment_offset(env_len);
    bool present = len > FRAME_HEADER_SIZE + env_len;
    if (present && env->tensor == NULL) {
        snprintf(err, errlen, "%zu bytes follow the envelope but it describes no tensor",
                 len - FRAME_HEADER_SIZE - env_len);
        goto fail;
    }
    if (env->tensor != NULL) {
        size_t esize = frame_dtype_size(env->tensor->dtype);
        if (esize == 0) {
            snprintf(err, errlen, "unsupported dtype %d (supported: 1 = FLOAT32, 2 = BFLOAT16)",
                     (int)env->tensor->dtype);
            goto fail;
        }
        uint64_t count = env->tensor->count;
        if (present) {
            size_t seg_len = len >= seg_off ? len - seg_off : 0;
            if (len < seg_off || count > SIZE_MAX / esize || count * esize != seg_len) {
                snprintf(err, errlen,
                         "segment length mismatch: tensor describes %llu elements (%llu bytes) "
                         "but %zu bytes follow the envelope and its padding",
                         (unsigned long long)count, (unsigned long long)(count * esize),
                         len >= seg_off ? len - seg_off : 0);
                goto fail;
            }
            f->segment = p + seg_off;
            f->segment_len = seg_len;
            f->has_segment = true;
        }
    }
    f->env = env;
    return STATUS_OK;
fail:
    psd__v1__envelope__free_unpacked(env, NULL);
    return STATUS_INVALID_ARGUMENT;
}

void frame_fini(frame *f)
{
    if (f->env)
        psd__v1__envelope__free_unpacked(f->env, NULL);
    memset(f, 0, sizeof(*f));
}

/* Reads a base-128 varint at *pos; false when truncated or longer than 10 bytes. */
static bool read_varint(const uint8_t *d, size_t len, size_t *pos, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        if (*pos >= len)
            return false;
        uint8_t b = d[(*pos)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

static int check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *d, size_t len,
                         int depth, char *err, size_t errlen)
{
    if (depth > 32)
        return STATUS_OK; /* the unpacker judges such nesting */
    size_t pos = 0;
    while (pos < len) {
        uint64_t key, n;
        if (!read_varint(d, len, &pos, &key))
            return STATUS_OK;
        unsigned wt = (unsigned)(key & 7);
        uint64_t num = key >> 3;
        switch (wt) {
        case 0:
            if (!read_varint(d, len, &pos, &n))
                return STATUS_OK;
            continue;
        case 1:
            if (len - pos < 8)
                return STATUS_OK;
            pos += 8;
            continue;
        case 5:
            if (len - pos < 4)
                return STATUS_OK;
            pos += 4;
            continue;
        case 2:
            break;
        default:
            return STATUS_OK; /* groups or garbage: the unpacker refuses them */
        }
        if (!read_varint(d, len, &pos, &n) || n > len - pos)
            return STATUS_OK;
        const uint8_t *val = d + pos;
        pos += (size_t)n;
        const ProtobufCFieldDescriptor *f =
            num <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(desc, (unsigned)num) : NULL;
        if (f == NULL)
            continue;
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            size_t bad;
            if (!utf8_text_ok(val, (size_t)n, &bad)) {
                if (val[bad] == 0)
                    snprintf(err, errlen, "field %s.%s holds a NUL byte at offset %zu of %llu",
                             desc->short_name, f->name, bad, (unsigned long long)n);
                else
                    snprintf(err, errlen,
                             "field %s.%s is not valid UTF-8: byte \\x%02x at offset %zu of %llu",
                             desc->short_name, f->name, val[bad], bad, (unsigned long long)n);
                return STATUS_INVALID_ARGUMENT;
            }
        } else if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
            int st = check_strings(f->descriptor, val, (size_t)n, depth + 1, err, errlen);
            if (st != STATUS_OK)
                return st;
        }
    }
    return STATUS_OK;
}

int frame_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                        char *err, size_t errlen)
{
    if (desc == NULL || (data == NULL && len > 0))
        return STATUS_OK;
    return check_strings(desc, data, len, 0, err, errlen);
}
