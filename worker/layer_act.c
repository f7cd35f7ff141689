/* layer_act.c - elementwise activation layers of layer.h over the backend's activation ops
 * (backend_act_forward/backward): relu, tanh and identity. No parameters; they work in
 * place (the backward pass reads only the output). Another activation the backend computes
 * is a create function and an ops table here plus a row in layer.c's table. */
#include <stdlib.h>

#include "layer.h"
#include "util.h"

typedef struct act_layer {
    layer base;
    backend_act act;
} act_layer;

static int act_create(backend *be, int in, const layer_spec *spec, const layer_ops *ops,
                      backend_act act, layer **out, char *err, size_t errlen)
{
    *out = NULL;
    if (spec->units != 0 && spec->units != in)
        return errf(err, errlen, "%s: keeps its input's width %d, cannot have %d units", ops->name,
                    in, spec->units);
    if (spec->l2 != 0.0f)
        return errf(err, errlen, "%s: has no parameters for l2", ops->name);
    act_layer *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return errf(err, errlen, "%s: out of memory", ops->name);
    a->base.ops = ops;
    a->base.be = be;
    a->base.in = in;
    a->base.out = in;
    a->act = act;
    *out = &a->base;
    return 0;
}

static void act_destroy(layer *l)
{
    free(l);
}

static int act_forward(layer *l, const backend_buf *x, backend_buf *y, int batch)
{
    const act_layer *a = (const act_layer *)l;
    return backend_act_forward(l->be, a->act, x, y, (size_t)batch * (size_t)l->out);
}

/* dx = dy * act'(.), through the output y */
static int act_backward_input(layer *l, const backend_buf *x, const backend_buf *y,
                              const backend_buf *dy, backend_buf *dx, int batch)
{
    const act_layer *a = (const act_layer *)l;
    return backend_act_backward(l->be, a->act, y, dy, dx, (size_t)batch * (size_t)l->out);
}

static int relu_create(backend *be, int in, const layer_spec *spec, layer **out, char *err,
                       size_t errlen)
{
    return act_create(be, in, spec, &layer_relu_ops, BACKEND_ACT_RELU, out, err, errlen);
}

const layer_ops layer_relu_ops = {
    .name = "relu",
    .in_place = true,
    .create = relu_create,
    .destroy = act_destroy,
    .forward = act_forward,
    .backward_input = act_backward_input,
};

static int tanh_create(backend *be, int in, const layer_spec *spec, layer **out, char *err,
                       size_t errlen)
{
    return act_create(be, in, spec, &layer_tanh_ops, BACKEND_ACT_TANH, out, err, errlen);
}

const layer_ops layer_tanh_ops = {
    .name = "tanh",
    .in_place = true,
    .create = tanh_create,
    .destroy = act_destroy,
    .forward = act_forward,
    .backward_input = act_backward_input,
};

static int identity_create(backend *be, int in, const layer_spec *spec, layer **out, char *err,
                           size_t errlen)
{
    return act_create(be, in, spec, &layer_identity_ops, BACKEND_ACT_IDENTITY, out, err, errlen);
}

const layer_ops layer_identity_ops = {
    .name = "identity",
    .in_place = true,
    .create = identity_create,
    .destroy = act_destroy,
    .forward = act_forward,
    .backward_input = act_backward_input,
};
