/* Server-side optimizers applied to a contiguous range of a float32 variable.
 *
 * A variable owned by a server is updated in place, one range at a time, as
 * gradient chunks arrive. Each optimizer keeps optimizer_slot_count() state
 * arrays ("slots") of the same length as the variable; a range update touches
 * the same range of every slot. All arithmetic is float32.
 *
 * Every optimizer is one row of the registry in optimizer.c (slot count,
 * defaults, validation, initial slots, update), keyed by the kinds of
 * common/optimizers.h. The functions below look the row up.
 *
 * Private to the server: not installed, names are not part of any ABI. */
#ifndef SERVER_OPTIMIZER_H
#define SERVER_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "optimizers.h"
#include "spec_fields.h"

/* Optimizer kinds, generated from common/optimizers.h. The numeric values are
 * the wire's and are stable (they are stored in checkpoints). */
typedef enum {
#define PS_OPTIMIZER_KIND_(ID, name, value, lr) OPTIMIZER_##ID = value,
    PS_OPTIMIZERS(PS_OPTIMIZER_KIND_)
#undef PS_OPTIMIZER_KIND_
    /* Server-side kinds that the wire does not carry yet (their settings are not in
     * PS_SPEC_HPARAMS): usable by sparse tables (server/table.h), refused for a variable
     * created over the wire (optimizer_on_wire). Their values are the wire's TableSpec
     * optimizer numbers (proto/ps.proto OPT_FTRL, OPT_ROWWISE_ADAGRAD). */
    OPTIMIZER_FTRL = PS_OPTIMIZER_COUNT,
    /* Row-wise Adagrad: one accumulator per table row (rows only: see optimizer_row_shape). */
    OPTIMIZER_ROWWISE_ADAGRAD = PS_OPTIMIZER_COUNT + 1,
} optimizer_kind;

/* Number of optimizer kinds (valid kinds are 0 .. OPTIMIZER_KIND_COUNT - 1). */
#define OPTIMIZER_KIND_COUNT (PS_OPTIMIZER_COUNT + 2)

/* True for a kind that the wire (ps.proto's Optimizer) carries: those of common/optimizers.h. */
#define optimizer_on_wire(k) ((int)(k) >= 0 && (int)(k) < PS_OPTIMIZER_COUNT)

/* Largest slot count of any optimizer. */
#define OPTIMIZER_MAX_SLOTS 3

/* Hyper-parameters of one variable's optimizer: one float per row of
 * PS_SPEC_HPARAMS (learning_rate, momentum, beta1, beta2, epsilon,
 * initial_accumulator, weight_decay), plus nesterov and FTRL's beta, l1 and l2
 * (FTRL's alpha is learning_rate). Fields that the kind does
 * not use are ignored (neither validated nor read by optimizer_apply). Bounds
 * of the fields a kind uses:
 *   learning_rate        all kinds: finite, > 0
 *   momentum             MOMENTUM: finite, in [0, 1)
 *   beta1, beta2         ADAM, ADAMW: finite, in [0, 1)
 *   epsilon              ADAM, ADAMW, ADAGRAD, ROWWISE_ADAGRAD: finite, > 0
 *   initial_accumulator  ADAGRAD, ROWWISE_ADAGRAD: finite, >= 0
 *   weight_decay         ADAMW: finite, >= 0 (learning_rate * weight_decay <= 1)
 *   ftrl_beta, l1, l2    FTRL: finite, >= 0 */
typedef struct optimizer_params {
    optimizer_kind kind;
#define PS_OPTIMIZER_PARAM_(field, pt, wt, def) float field;
    PS_SPEC_HPARAMS(PS_OPTIMIZER_PARAM_)
    bool nesterov; /* MOMENTUM: Nesterov accelerated gradient */
    /* FTRL: ftrl_beta, the beta of the per-coordinate rate alpha/(beta + sqrt(n)); l1 and l2,
     * the L1 and L2 regularization strengths. */
    PS_TABLE_HPARAMS(PS_OPTIMIZER_PARAM_)
#undef PS_OPTIMIZER_PARAM_
} optimizer_params;

/* Fills *p with the defaults for `kind` (every field is written): each field's row of
 * common/spec_fields.h (PS_SPEC_HPARAMS, PS_TABLE_HPARAMS; nesterov false), then the kind's
 * own (PS_HPARAM_KIND_DEFAULTS: Adam and AdamW learning_rate 0.001, Adagrad epsilon 1e-7, FTRL
 * learning_rate (alpha) 0.05). Does nothing when p is NULL. `kind` is stored as given, even if
 * invalid. */
void optimizer_params_default(optimizer_params *p, optimizer_kind kind);

/* Checks the fields that p->kind uses against the bounds documented on
 * optimizer_params. Returns 0 when valid. Returns -1 otherwise (also for a NULL
 * p or an unknown kind) and, when err is non-NULL and errlen > 0, writes a
 * NUL-terminated message naming the offending field and its value (truncated
 * to errlen). Never crashes on any input. */
int optimizer_validate(const optimizer_params *p, char *err, size_t errlen);

/* Canonical lower-case name of a kind: "sgd", "momentum", "adagrad", "adam", "adamw", "ftrl",
 * "rowwise_adagrad".
 * Returns "unknown" (never NULL) for a value outside the enum. */
const char *optimizer_name(optimizer_kind k);

/* Inverse of optimizer_name, ASCII case-insensitive ("Adam" is accepted).
 * Returns 0 and stores the kind in *out on success; returns -1 and leaves *out
 * untouched for an unknown name or a NULL argument. */
int optimizer_parse(const char *name, optimizer_kind *out);

/* True for a kind of the registry. */
bool optimizer_kind_valid(int k);

/* Number of float state arrays one variable needs for kind k: sgd 0,
 * momentum 1 (accumulator a), adagrad 1 (accumulator acc), adam and adamw 3
 * (m, v and the per-element step count t stored as float), ftrl 2 (z and n),
 * rowwise_adagrad 0 (a variable cannot have it: its ranges arrive as chunks that are not
 * rows). Returns 0 for an unknown kind. */
size_t optimizer_slot_count(optimizer_kind k);

/* The optimizer state of one sparse table row of `dim` parameters, which is always updated
 * whole (optimizer_apply_row): `slots` float arrays of dim elements, then `scalars` floats
 * and `counts` uint32 counters of the row itself. sgd 0/0/0, momentum 1/0/0, adagrad 1/0/0,
 * ftrl 2/0/0 (as for variables); adam and adamw 2 (m, v) / 0 / 1 (the row's step count t:
 * every element of a row takes the same steps); rowwise_adagrad 0 / 1 (the accumulator of the
 * row's mean squared gradient, TorchRec's and FBGEMM's row-wise Adagrad) / 0. `narrow_ok`:
 * the kind can keep the parameters in 16 bits (bfloat16, float16), with its state in float32;
 * false for adamw, whose decay multiplies the weights by 1 - learning_rate * weight_decay
 * (0.99999 by default), a change 16-bit rounding loses. All zero for an unknown kind. */
typedef struct optimizer_row_shape {
    size_t slots, scalars, counts;
    bool narrow_ok;
} optimizer_row_shape;
void optimizer_row_shape_of(optimizer_kind k, optimizer_row_shape *out);
/* Why kind k cannot keep 16-bit parameters (narrow_ok false), for an error message; NULL when
 * it can or is unknown. */
const char *optimizer_not_narrow(optimizer_kind k);

/* Writes a new row's initial state (shape as optimizer_row_shape_of(p->kind)): slots[i] point
 * at dim floats each, scalars at its floats, counts at its counters. Adagrad's accumulators
 * (element or row) start at initial_accumulator, the rest at 0. Does nothing for an unknown
 * kind or a NULL p. */
void optimizer_init_row(const optimizer_params *p, float *const *slots, float *scalars,
                        uint32_t *counts, size_t dim);

/* Applies one update to a whole row w[0..dim) with the gradient grad (unaligned, host order
 * float32 as for optimizer_apply) and the row's state (as optimizer_init_row). The same
 * update as optimizer_apply for every kind a variable has, except:
 *   adam, adamw      the row's step count t (one counter, saturating at 2^32 - 1) replaces
 *                    the per-element one: the same values as optimizer_apply on a whole range
 *                    whose elements all had that t
 *   rowwise_adagrad  acc += sum(g*g)/dim; p -= (lr/(sqrt(acc) + eps))*g
 * p is assumed validated; nothing is written for an unknown kind. */
void optimizer_apply_row(const optimizer_params *p, float *w, const void *grad, float *const *slots,
                         float *scalars, uint32_t *counts, size_t dim);

/* Writes the initial values of the n elements of every slot of p->kind:
 * slots[i] must point at n writable floats for i < optimizer_slot_count().
 * Adagrad's accumulator starts at p->initial_accumulator; every other slot
 * (momentum accumulator, Adam m, v, t) at 0. Does nothing when p or slots is
 * NULL, n is 0, or the kind is unknown. */
void optimizer_init_slots(const optimizer_params *p, float *const *slots, size_t n);

/* Applies one update, in place, to params[0..n) using grad[0..n) (lr is
 * learning_rate):
 *   sgd:      p -= lr*g
 *   momentum: a = mu*a + g; p -= lr*a   (nesterov: p -= lr*(g + mu*a), a updated first)
 *   adagrad:  acc += g*g; p -= lr*g/(sqrt(acc) + eps)
 *   adam:     t += 1; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
 *             p -= lr*(m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
 *   adamw:    p *= 1 - lr*wd, then the adam step (decoupled weight decay,
 *             Loshchilov & Hutter; PyTorch's AdamW)
 *   ftrl:     FTRL-Proximal (McMahan et al. 2013, algorithm 1), alpha = lr:
 *             s = (sqrt(n + g*g) - sqrt(n))/alpha; z += g - s*p; n += g*g;
 *             p = |z| <= l1 ? 0 : -(z - sign(z)*l1) / ((beta + sqrt(n))/alpha + l2)
 * grad points at n little-endian (host order) float32 values with no alignment
 * requirement (it may point into a network buffer). slots[i] points at the
 * i-th state array for the same n elements (see optimizer_slot_count). params,
 * grad and the slot arrays must not overlap. p is assumed validated
 * (optimizer_validate); with an unknown kind, or a NULL pointer where one is
 * needed, nothing is written. Non-finite gradients propagate into the
 * parameters (the caller rejects them beforehand if it wants to). */
void optimizer_apply(const optimizer_params *p, float *params, const void *grad,
                     float *const *slots, size_t n);

/* optimizer_apply that keeps every value finite: an element whose update would leave its
 * parameter or one of its slots non-finite (a finite gradient overflowing float32, or a
 * non-finite gradient) keeps its values, the other elements are updated (every optimizer of
 * the registry updates each element from that element's own state alone). Returns the number
 * of elements left unchanged and, when there are any, the index of the first in *first_bad. */
size_t optimizer_apply_finite(const optimizer_params *p, float *params, const void *grad,
                              float *const *slots, size_t n, size_t *first_bad);

#endif /* SERVER_OPTIMIZER_H */
