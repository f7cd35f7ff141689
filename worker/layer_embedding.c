/* layer_embedding.c - the embedding-bag layer of layer.h and the batch's id mapping.
 *
 * An embedding bag maps each example's list of ids (rows of a sparse table on the parameter
 * servers) to the sum or the mean of their rows. The table is too large to hold: the trainer
 * gives the layer, per batch, only the rows of the batch's distinct ids (embbag_map_batch
 * numbers them 0..n-1 and writes the batch as those numbers; layer_embbag_set_rows
 * uploads the rows pulled for them), and after the backward pass reads the gradient of each of
 * those rows (layer_embbag_get_grads): one row per distinct id, the contributions of every
 * example that holds it summed, ready for one push.
 *
 * The layer's input is the batch itself (batch x `in` floats: the row numbers, negative for
 * padding), so it must be a model's first layer; it has no dense parameters (num_params 0) and
 * computes its row gradients in backward_params. */
#include <stdlib.h>
#include <string.h>

#include "layer.h"
#include "util.h"

typedef struct embbag_layer {
    layer base;
    bool mean;
    int rows;           /* rows set for the current batch */
    int cap;            /* rows the buffers hold */
    backend_buf *value; /* cap x out */
    backend_buf *grad;  /* cap x out */
} embbag_layer;

static int embbag_create_as(backend *be, int in, const layer_spec *spec, bool mean,
                            const layer_ops *ops, layer **out, char *err, size_t errlen)
{
    *out = NULL;
    if (spec->units < 1)
        return errf(err, errlen, "%s: %d units (the row dimension; expected >= 1)", ops->name,
                    spec->units);
    embbag_layer *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return errf(err, errlen, "%s: out of memory", ops->name);
    e->base.ops = ops;
    e->base.be = be;
    e->base.in = in;
    e->base.out = spec->units;
    e->mean = mean;
    *out = &e->base;
    return 0;
}

static int embbag_sum_create(backend *be, int in, const layer_spec *spec, layer **out, char *err,
                             size_t errlen)
{
    return embbag_create_as(be, in, spec, false, &layer_embbag_ops, out, err, errlen);
}

static int embbag_mean_create(backend *be, int in, const layer_spec *spec, layer **out, char *err,
                              size_t errlen)
{
    return embbag_create_as(be, in, spec, true, &layer_embbag_mean_ops, out, err, errlen);
}

static void embbag_destroy(layer *l)
{
    embbag_layer *e = (embbag_layer *)l;
    backend_buf_free(l->be, e->value);
    backend_buf_free(l->be, e->grad);
    free(e);
}

static int embbag_forward(layer *l, const backend_buf *x, backend_buf *y, int batch)
{
    embbag_layer *e = (embbag_layer *)l;
    return backend_embbag_forward(l->be, x, e->value, batch, l->in, e->rows, l->out, e->mean, y);
}

static int embbag_backward_params(layer *l, const backend_buf *x, const backend_buf *y,
                                  const backend_buf *dy, int batch)
{
    embbag_layer *e = (embbag_layer *)l;
    return backend_embbag_backward(l->be, x, dy, batch, l->in, e->rows, l->out, e->mean, e->grad);
}

const layer_ops layer_embbag_ops = {
    .name = "embbag",
    .in_place = false,
    .create = embbag_sum_create,
    .destroy = embbag_destroy,
    .forward = embbag_forward,
    .backward_params = embbag_backward_params,
};

const layer_ops layer_embbag_mean_ops = {
    .name = "embbag_mean",
    .in_place = false,
    .create = embbag_mean_create,
    .destroy = embbag_destroy,
    .forward = embbag_forward,
    .backward_params = embbag_backward_params,
};

bool layer_is_embbag(const layer *l)
{
    return l != NULL && (l->ops == &layer_embbag_ops || l->ops == &layer_embbag_mean_ops);
}

int layer_embbag_set_rows(layer *l, const float *rows, int n)
{
    embbag_layer *e = (embbag_layer *)l;
    if (!layer_is_embbag(l) || n < 0 || n > LAYER_EMBBAG_MAX_ROWS)
        return backend_fail(l->be, BACKEND_EINVAL, "embbag: %d rows (expected 0..%d)", n,
                            LAYER_EMBBAG_MAX_ROWS);
    if (n > e->cap) {
        int cap = e->cap ? e->cap : 256;
        while (cap < n)
            cap = cap > LAYER_EMBBAG_MAX_ROWS / 2 ? LAYER_EMBBAG_MAX_ROWS : cap * 2;
        size_t bytes = (size_t)cap * (size_t)l->out * sizeof(float);
        backend_buf_free(l->be, e->value);
        backend_buf_free(l->be, e->grad);
        e->value = e->grad = NULL;
        e->cap = 0;
        int rc = backend_buf_alloc(l->be, bytes, &e->value);
        if (rc == 0)
            rc = backend_buf_alloc(l->be, bytes, &e->grad);
        if (rc != 0)
            return rc;
        e->cap = cap;
    }
    e->rows = n;
    if (n == 0)
        return 0;
    return backend_upload(l->be, e->value, 0, rows, (size_t)n * (size_t)l->out * sizeof(float));
}

int layer_embbag_get_grads(layer *l, float *grads)
{
    embbag_layer *e = (embbag_layer *)l;
    if (!layer_is_embbag(l))
        return backend_fail(l->be, BACKEND_EINVAL, "not an embedding bag");
    if (e->rows == 0)
        return 0;
    return backend_download(l->be, e->grad, 0, grads,
                            (size_t)e->rows * (size_t)l->out * sizeof(float));
}

/* ---- the batch's distinct ids ---- */

int embbag_ids_init(embbag_ids *b, size_t max_entries)
{
    memset(b, 0, sizeof(*b));
    if (max_entries > LAYER_EMBBAG_MAX_ROWS)
        return -1;
    size_t hcap = 16;
    while (hcap < 2 * max_entries)
        hcap *= 2;
    b->ids = malloc((max_entries ? max_entries : 1) * sizeof(*b->ids));
    b->keys = malloc(hcap * sizeof(*b->keys));
    b->slots = malloc(hcap * sizeof(*b->slots));
    if (b->ids == NULL || b->keys == NULL || b->slots == NULL) {
        embbag_ids_fini(b);
        return -1;
    }
    b->max_entries = max_entries;
    b->hcap = hcap;
    return 0;
}

void embbag_ids_fini(embbag_ids *b)
{
    free(b->ids);
    free(b->keys);
    free(b->slots);
    memset(b, 0, sizeof(*b));
}

int embbag_map_batch(embbag_ids *b, const int64_t *ids, size_t entries, float *x)
{
    if (entries > b->max_entries)
        return -1;
    for (size_t i = 0; i < b->hcap; i++)
        b->slots[i] = -1;
    b->n = 0;
    for (size_t i = 0; i < entries; i++) {
        int64_t id = ids[i];
        if (id < 0) {
            x[i] = -1.0f;
            continue;
        }
        /* Fibonacci hashing into the power-of-two table; linear probing. */
        size_t h = (size_t)(((uint64_t)id * 0x9e3779b97f4a7c15ull) >> 32) & (b->hcap - 1);
        while (b->slots[h] >= 0 && b->keys[h] != id)
            h = (h + 1) & (b->hcap - 1);
        if (b->slots[h] < 0) {
            b->keys[h] = id;
            b->slots[h] = (int32_t)b->n;
            b->ids[b->n++] = id;
        }
        x[i] = (float)b->slots[h];
    }
    return 0;
}
