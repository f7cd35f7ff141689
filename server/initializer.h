/* Deterministic, shard-independent variable initializers.
 *
 * The value of element i of a variable depends only on (params, shape, i):
 * never on which range of the variable a server fills, so a variable split over
 * any number of servers holds exactly the values an unsplit one would. Random
 * kinds use a counter-based generator (a splitmix64 mix of seed, element index
 * and stream), not a sequential RNG state.
 *
 * Private to the server: not installed, names are not part of any ABI. */
#ifndef SERVER_INITIALIZER_H
#define SERVER_INITIALIZER_H

#include <stddef.h>
#include <stdint.h>

/* Initializer kinds. The numeric values are stable (they may be stored):
 * append new kinds, never renumber. */
typedef enum {
    INITIALIZER_ZEROS = 0,
    INITIALIZER_CONSTANT = 1,
    INITIALIZER_UNIFORM = 2,
    INITIALIZER_NORMAL = 3,
    INITIALIZER_GLOROT_UNIFORM = 4,
} initializer_kind;

/* Number of initializer kinds (valid kinds are 0 .. INITIALIZER_KIND_COUNT - 1). */
#define INITIALIZER_KIND_COUNT 5

/* Parameters of an initializer. Meaning of a and b by kind:
 *   ZEROS:          a, b unused
 *   CONSTANT:       every element is (float)a
 *   UNIFORM:        uniform on [a, b), a < b
 *   NORMAL:         normal (not truncated) with mean a, standard deviation b > 0
 *   GLOROT_UNIFORM: a, b unused; uniform on [-l, l], l = sqrt(6/(fan_in+fan_out))
 * seed selects the random values of UNIFORM, NORMAL and GLOROT_UNIFORM. */
typedef struct initializer_params {
    initializer_kind kind;
    double a, b;
    uint64_t seed;
} initializer_params;

/* Checks p (and shape, which GLOROT_UNIFORM needs) so that initializer_fill
 * produces only finite float32 values obeying the kind's contract: a and b
 * finite and within float32 range where used, UNIFORM's [a, b) must contain a
 * float32 value, NORMAL needs b > 0 and |a| + 10*b <= FLT_MAX, shape may be
 * NULL only when ndims is 0. Returns 0 when valid; returns -1 otherwise (also
 * for NULL p or an unknown kind) and, when err is non-NULL and errlen > 0,
 * writes a NUL-terminated message naming the offending field and its value. */
int initializer_validate(const initializer_params *p, const uint64_t *shape, size_t ndims,
                         char *err, size_t errlen);

/* Canonical name of a kind: "zeros", "constant", "uniform", "normal",
 * "glorot_uniform". Returns "unknown" (never NULL) for a value outside the enum. */
const char *initializer_name(initializer_kind k);

/* Inverse of initializer_name, ASCII case-insensitive. Returns 0 and stores
 * the kind in *out on success; returns -1 and leaves *out untouched for an
 * unknown name or a NULL argument. */
int initializer_parse(const char *name, initializer_kind *out);

/* Fan-in and fan-out of a variable of the given shape, by Keras' rules:
 *   0-d: 1, 1;   1-d [n]: n, n;   2-d [r, c]: r, c;
 *   n-d (n > 2): rf = product of shape[0 .. n-3] (the receptive field),
 *                fan_in = shape[n-2]*rf, fan_out = shape[n-1]*rf.
 * Computed in double (no integer overflow). A NULL shape with ndims > 0 gives
 * 0, 0. Either output pointer may be NULL (that result is not written). */
void initializer_fan(const uint64_t *shape, size_t ndims, double *fan_in, double *fan_out);

/* Writes out[0..n) = elements [offset, offset + n) of the flattened (row-major)
 * variable of the given shape initialized by p. Element i's value depends only
 * on (p, shape, i): filling a range in any number of pieces gives bit-identical
 * results. p is assumed validated (initializer_validate); the range is not
 * checked against the shape. Does nothing when p or out is NULL; an unknown
 * kind writes zeros. */
void initializer_fill(const initializer_params *p, const uint64_t *shape, size_t ndims,
                      uint64_t offset, float *out, size_t n);

/* Seed of row `id` of a sparse table: a pure function of (seed, table_key, id), where
 * table_key is a hash of the table's name (server/table.c passes placement_hash(name)):
 *   h = mix64(seed + G); h = mix64(h ^ table_key); row_seed = mix64(h + (uint64_t)id * G)
 * with G = 0x9E3779B97F4A7C15 and mix64 splitmix64's finalizer, all arithmetic mod 2^64 (any
 * int64 id, negative included, is defined; no overflow). */
uint64_t initializer_row_seed(uint64_t seed, uint64_t table_key, int64_t id);

/* Writes out[0..dim) = row `id` of a sparse table initialized by p: the elements 0..dim-1 of
 * initializer_fill with p's kind, a and b and the seed initializer_row_seed(p->seed,
 * table_key, id), so every server, restart or replica makes the same row, and rows of
 * different ids, tables or seeds are independent. GLOROT_UNIFORM needs a shape and is not
 * meant for rows (the table refuses it); here it would use the shape [dim]. Does nothing when
 * p or out is NULL. */
void initializer_fill_row(const initializer_params *p, uint64_t table_key, int64_t id, float *out,
                          size_t dim);

#endif /* SERVER_INITIALIZER_H */
