/* Framing of one RPC message: 8-byte header, packed Envelope, padding, raw tensor segment.
 *
 *   offset 0  'P' 'S'                 magic
 *   offset 2  u8 major, u8 minor      protocol version (FRAME_VERSION_*)
 *   offset 4  u32 little-endian N     length of the packed Envelope
 *   offset 8  N bytes                 psd.v1.Envelope (protobuf)
 *   ...       0-7 zero bytes          pad to a multiple of 8 from the frame start
 *   offset P  segment                 Envelope.tensor.count elements, little-endian
 *
 * A frame without a segment ends right after the envelope (no padding); one with a segment
 * ends exactly at the end of the segment. proto/README.md is the reference. */
#ifndef PSD_COMMON_FRAME_H
#define PSD_COMMON_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "ps.pb-c.h"

#define FRAME_MAGIC0 0x50 /* 'P' */
#define FRAME_MAGIC1 0x53 /* 'S' */
#define FRAME_VERSION_MAJOR 1
#define FRAME_VERSION_MINOR 0
#define FRAME_HEADER_SIZE 8
/* Bound on the envelope itself: bulk data travels in the segment, never here. */
#define FRAME_MAX_ENVELOPE (1u << 20)

typedef Psd__V1__Envelope envelope;

/* A parsed frame. env is owned (frame_fini frees it); segment points into the nng_msg it was
 * parsed from and is valid while that message lives. */
typedef struct frame {
    envelope *env;
    const uint8_t *segment; /* NULL when no segment follows (e.g. a pull request) */
    size_t segment_len;
    bool has_segment;
} frame;

/* Size of the header + envelope + padding, i.e. the segment's offset, for an envelope whose
 * packed size is env_len. */
size_t frame_segment_offset(size_t env_len);

/* Builds a message holding env and room for segment_len bytes of segment. On success *out is a
 * new message (caller owns it) and, when segment_len > 0, *segment_out points at the segment
 * area inside it for the caller to fill (it is not initialised). If segment is not NULL the
 * segment_len bytes are copied from it. Returns 0, or an nng error (NNG_ENOMEM, NNG_EMSGSIZE when
 * the envelope exceeds FRAME_MAX_ENVELOPE). Does not block. */
int frame_build(nng_msg **out, const envelope *env, const void *segment, size_t segment_len,
                uint8_t **segment_out);

/* Parses msg (the message keeps ownership of its bytes). On success fills *f and returns
 * STATUS_OK. On malformed input returns a status (INVALID_ARGUMENT for truncated/garbage/length
 * mismatch, FAILED_PRECONDITION for another major version) and writes a message naming what was
 * wrong into err. Never reads outside the message. */
int frame_parse(nng_msg *msg, frame *f, char *err, size_t errlen);
/* The same on len bytes at p, which must stay valid (and unchanged) while f is used. */
int frame_parse_bytes(const uint8_t *p, size_t len, frame *f, char *err, size_t errlen);

/* Input rules for text: checks, on the wire bytes of a packed message of type desc (before
 * protobuf-c unpacks it, which would cut a string at an embedded NUL without a trace), that
 * every string field, in nested messages too, is valid UTF-8 without NUL bytes. Returns
 * STATUS_OK, or INVALID_ARGUMENT with a message naming the field and the offending byte's
 * offset (never the bytes themselves). Malformed wire data is left to the unpacker: it is not
 * an error here. */
int frame_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len,
                        char *err, size_t errlen);

/* Frees what frame_parse allocated; safe on a zeroed or already-finished frame. */
void frame_fini(frame *f);

/* Bytes of one element of a wire dtype, 0 for an unknown dtype. */
size_t frame_dtype_size(int dtype);

/* Wire dtypes of float data: FLOAT32 as is, BFLOAT16 as the upper half of each float32 rounded
 * to nearest even (NaN stays NaN), little-endian, no alignment needed on the wire side.
 * frame_put_floats writes n values of src in dtype to dst (n * frame_dtype_size bytes);
 * frame_get_floats reads n values in dtype from src into dst. dtype must be one of the two. */
void frame_put_floats(uint8_t *dst, const float *src, size_t n, int dtype);
void frame_get_floats(float *dst, const uint8_t *src, size_t n, int dtype);

#endif
