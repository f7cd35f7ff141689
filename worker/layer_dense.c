/* layer_dense.c - the fully connected layer of layer.h: y = x W + b.
 *
 * Parameters: the kernel W (in x units, row-major) and the bias b (units). With l2 > 0
 * the kernel carries the weight decay l2/2 ||W||^2: its gradient gets l2 W and the loss
 * the term (penalty). */
#include <math.h>
#include <stdlib.h>

#include "layer.h"
#include "util.h"

typedef struct dense_layer {
    layer base;
    float l2;
} dense_layer;

enum { DENSE_KERNEL = 0, DENSE_BIAS = 1 };

static int dense_create(backend *be, int in, const layer_spec *spec, layer **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    if (spec->units < 1)
        return errf(err, errlen, "dense: %d units (expected >= 1)", spec->units);
    if (!(spec->l2 >= 0.0f) || !isfinite(spec->l2))
        return errf(err, errlen, "dense: l2 must be finite and >= 0");
    dense_layer *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return errf(err, errlen, "dense: out of memory");
    layer *l = &d->base;
    l->ops = &layer_dense_ops;
    l->be = be;
    l->in = in;
    l->out = spec->units;
    l->penalized = spec->l2 > 0.0f;
    l->num_params = 2;
    l->params[DENSE_KERNEL] = (layer_param){
        .name = "kernel",
        .ndims = 2,
        .dims = {(uint64_t)in, (uint64_t)spec->units},
        .is_kernel = true,
    };
    l->params[DENSE_BIAS] = (layer_param){
        .name = "bias",
        .ndims = 1,
        .dims = {(uint64_t)spec->units},
    };
    d->l2 = spec->l2;
    *out = l;
    return 0;
}

static void dense_destroy(layer *l)
{
    free(l);
}

static int dense_forward(layer *l, const backend_buf *x, backend_buf *y, int batch)
{
    int rc = backend_gemm(l->be, false, false, batch, l->out, l->in, 1.0f, x,
                          l->params[DENSE_KERNEL].value, 0.0f, y);
    if (rc == 0)
        rc = backend_bias_add(l->be, y, l->params[DENSE_BIAS].value, batch, l->out);
    return rc;
}

/* out[0] += l2/2 * sum W^2 */
static int dense_penalty(layer *l, backend_buf *out)
{
    const dense_layer *d = (const dense_layer *)l;
    const layer_param *W = &l->params[DENSE_KERNEL];
    return backend_sum_squares(l->be, W->value, (size_t)(W->dims[0] * W->dims[1]), 0.5f * d->l2,
                               1.0f, out);
}

static int dense_backward_params(layer *l, const backend_buf *x, const backend_buf *y,
                                 const backend_buf *dy, int batch)
{
    const dense_layer *d = (const dense_layer *)l;
    layer_param *W = &l->params[DENSE_KERNEL], *b = &l->params[DENSE_BIAS];
    /* dW = x^T dy (+ l2 W), db = column sums of dy */
    int rc = backend_gemm(l->be, true, false, l->in, l->out, batch, 1.0f, x, dy, 0.0f, W->grad);
    if (rc == 0 && d->l2 > 0.0f)
        rc = backend_axpy(l->be, (size_t)l->in * (size_t)l->out, d->l2, W->value, W->grad);
    if (rc == 0)
        rc = backend_col_sum(l->be, dy, batch, l->out, 1.0f, 0.0f, b->grad);
    return rc;
}

/* dx = dy W^T */
static int dense_backward_input(layer *l, const backend_buf *x, const backend_buf *y,
                                const backend_buf *dy, backend_buf *dx, int batch)
{
    return backend_gemm(l->be, false, true, batch, l->in, l->out, 1.0f, dy,
                        l->params[DENSE_KERNEL].value, 0.0f, dx);
}

const layer_ops layer_dense_ops = {
    .name = "dense",
    .in_place = false,
    .create = dense_create,
    .destroy = dense_destroy,
    .forward = dense_forward,
    .penalty = dense_penalty,
    .backward_params = dense_backward_params,
    .backward_input = dense_backward_input,
};
