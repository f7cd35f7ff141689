/* layer.h - the layers a model (model.h) is a sequence of, behind one ops table.
 *
 * A layer maps a batch of examples of `in` features to `out` features on a backend
 * (backend.h) and, for training, maps the gradient with respect to its output back to
 * its input and to its parameters. Every layer type is a `layer_ops` table; the layer
 * table (layer_find) maps the names models are built from ("dense", "relu", ...) to them.
 *
 * A layer declares its parameters (shapes, which are kernels) when it is created; the
 * model owns their storage (host copies, device values and gradients, events), names them
 * "<prefix>/<type><k>/<param>" and sets the device buffers in `params` before the first
 * forward pass. The tensors between layers (outputs and their gradients) belong to the model
 * too: every op below gets the buffers to read and write, each a batch x width row-major
 * matrix.
 *
 * Training order, which the model keeps for every layer: forward of each layer first to
 * last, then the loss, then penalty of each penalized layer, then from the last layer to
 * the first: backward_params (where the layer has parameters; the model then queues their
 * downloads), then backward_input (for every layer but the first). Ops only queue work on
 * the backend: none waits for it.
 *
 * To add a layer type: a file layer_<type>.c defining `const layer_ops layer_<type>_ops`
 * (listed in worker_srcs of worker/meson.build), its declaration below, and one row in the
 * table in layer.c.
 */
#ifndef WORKER_LAYER_H
#define WORKER_LAYER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* At most this many parameter tensors per layer. */
#define LAYER_MAX_PARAMS 2

/* What a layer is built from: its type and that type's settings. */
typedef struct layer_spec {
    const char *type; /* name in the layer table: "dense", "relu", "tanh", "identity" */
    int units;        /* dense: output features; 0 for layers that keep their input's width */
    float l2;         /* dense: weight decay on the kernel (>= 0); 0 for others */
} layer_spec;

/* One parameter tensor of a layer. */
typedef struct layer_param {
    const char *name;   /* "kernel", "bias": the last part of the model's parameter name */
    int ndims;          /* 1 or 2 */
    uint64_t dims[2];   /* kernels: fan in, fan out */
    bool is_kernel;     /* Glorot-initialized by the model; otherwise zeros */
    backend_buf *value; /* device, set by the model */
    backend_buf *grad;  /* device, set by the model */
} layer_param;

typedef struct layer_ops layer_ops;

/* Common head of every layer: implementations embed it first. */
typedef struct layer {
    const layer_ops *ops;
    backend *be;
    int in, out;    /* features per example */
    bool penalized; /* has a regularization term (ops->penalty) */
    int num_params; /* 0 .. LAYER_MAX_PARAMS */
    layer_param params[LAYER_MAX_PARAMS];
} layer;

struct layer_ops {
    const char *name; /* the table name, also the stem of its parameters' names */
    /* Forward may write its output over its input (y == x), and the backward ops read y,
     * not x, and may write dx over dy: the model then gives the layer one buffer for both
     * sides, unless the layer is the first or follows another in-place layer (activations). The
     * backward ops of a layer that is not in place read x, not y: an in-place layer after it writes
     * over y. */
    bool in_place;
    /* Creates a layer taking `in` features per example: sets ops, be, in, out, penalized and
     * the shapes of its parameters. Returns 0, or -1 with a message in err (a bad spec, out
     * of memory). */
    int (*create)(backend *be, int in, const layer_spec *spec, layer **out, char *err,
                  size_t errlen);
    void (*destroy)(layer *l);
    /* y (batch x out) = the layer applied to x (batch x in). Returns 0 or a backend_error. */
    int (*forward)(layer *l, const backend_buf *x, backend_buf *y, int batch);
    /* Adds the layer's regularization term to out[0] (1 float). NULL when never penalized. */
    int (*penalty)(layer *l, backend_buf *out);
    /* Writes every parameter's gradient into params[k].grad, from the input x, the output y
     * and the gradient dy (batch x out) of the loss with respect to y (see in_place for which
     * of x and y it may read). NULL for layers without parameters; a layer with num_params 0
     * that has it keeps its gradients itself (an embedding bag's rows): the model calls it in
     * the same place. */
    int (*backward_params)(layer *l, const backend_buf *x, const backend_buf *y,
                           const backend_buf *dy, int batch);
    /* dx (batch x in) = the gradient of the loss with respect to the input, from x, y and
     * dy. Never called for the first layer (the batch needs no gradient); NULL for a layer that
     * reads the batch itself and so can only come first (the model refuses it elsewhere). */
    int (*backward_input)(layer *l, const backend_buf *x, const backend_buf *y,
                          const backend_buf *dy, backend_buf *dx, int batch);
};

/* The built-in layer types (layer_dense.c, layer_act.c). */
extern const layer_ops layer_dense_ops;    /* y = x W + b; spec: units, l2 */
extern const layer_ops layer_relu_ops;     /* y = max(x, 0) */
extern const layer_ops layer_tanh_ops;     /* y = tanh(x) */
extern const layer_ops layer_identity_ops; /* y = x */

/* Embedding bags (layer_embedding.c): y = the sum ("embbag") or the mean ("embbag_mean") of the
 * rows the example's `in` entries name; spec: units = the row dimension. The input is the batch
 * of row numbers (as floats, negative for padding) into the rows set by layer_embbag_set_rows, so
 * the layer can only come first in a model. Its gradients are per row, read with
 * layer_embbag_get_grads after the backward pass. */
extern const layer_ops layer_embbag_ops;
extern const layer_ops layer_embbag_mean_ops;

/* Rows one batch may hold: the batch's row numbers travel as float32, exact below 2^24. */
#define LAYER_EMBBAG_MAX_ROWS (1 << 24)

/* Whether l is an embedding bag. */
bool layer_is_embbag(const layer *l);
/* Queues the upload of the current batch's rows: n x l->out floats (host, untouched until the
 * upload completes, as backend_upload). Returns 0 or a backend_error (bad n, out of memory). */
int layer_embbag_set_rows(layer *l, const float *rows, int n);
/* Queues the download of the gradient of each of those n rows into grads (n x l->out floats):
 * valid after backend_sync. Call after the model's backward pass. Returns 0 or a backend_error. */
int layer_embbag_get_grads(layer *l, float *grads);

/* The distinct ids of a batch, numbered in order of first appearance. */
typedef struct embbag_ids {
    size_t n;           /* distinct ids of the last batch mapped */
    int64_t *ids;       /* n of them: row k of the batch's rows is ids[k]'s */
    size_t max_entries; /* entries a batch may have (batch x ids per example) */
    size_t hcap;        /* hash table */
    int64_t *keys;
    int32_t *slots;
} embbag_ids;

/* For batches of at most max_entries (<= LAYER_EMBBAG_MAX_ROWS) entries. Returns 0 or -1 (out
 * of memory, or too many entries). */
int embbag_ids_init(embbag_ids *b, size_t max_entries);
void embbag_ids_fini(embbag_ids *b);
/* Writes into x (entries floats, the layer's input) the row number 0..n-1 of each of ids[0 ..
 * entries) among the batch's distinct ids (-1 for a negative id: padding) and fills b->ids/b->n
 * with those distinct ids in order of first appearance. Returns 0, or -1 for more than
 * max_entries entries. */
int embbag_map_batch(embbag_ids *b, const int64_t *ids, size_t entries, float *x);

/* The ops of the layer type named `name`, or NULL when the table has none. */
const layer_ops *layer_find(const char *name);

/* The table's names joined by ", " into buf (for messages); returns buf. */
const char *layer_names(char *buf, size_t cap);

/* Creates a layer of type spec->type through the table. Returns 0, or -1 with a message in
 * err (unknown type, or the type's own create failing). Free with layer_destroy. */
int layer_create(backend *be, int in, const layer_spec *spec, layer **out, char *err,
                 size_t errlen);

/* Frees l; NULL is a no-op. */
void layer_destroy(layer *l);

#endif /* WORKER_LAYER_H */
