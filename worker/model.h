/* model.h - a sequence of layers (worker/layer.h) on a backend (worker/backend.h), trained
 * under softmax cross-entropy.
 *
 * model_create builds a multi-layer perceptron from a model_config: sizes[0] inputs, hidden
 * dense layers each followed by the configured activation, and a linear output layer of
 * sizes[num_sizes-1] classes. Dense layer l (1-based) has a kernel W_l of shape
 * sizes[l-1] x sizes[l] (row-major, y = x W + b) and a bias b_l. model_create_layers builds
 * any sequence of the layer table's types.
 *
 * The loss of a batch of m examples is
 *     mean_i xent(softmax(z_i), y_i) + l2/2 * sum_l ||W_l||^2
 * (z the last layer's output) and the gradients are those of that loss (kernels get l2 * W,
 * biases no decay). Parameters live on the backend; each has a host copy (pinned) that
 * the trainer fills from the parameter servers and uploads, and a host
 * gradient buffer the backward pass fills for pushing.
 *
 * A model is used by one thread at a time.
 */
#ifndef WORKER_MODEL_H
#define WORKER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "data.h"
#include "layer.h"

/* At most this many layers of weights. */
#define MODEL_MAX_LAYERS 16
/* Largest layer width accepted by model_parse_layers. */
#define MODEL_MAX_WIDTH (1 << 20)
/* At most this many layers in a sequence (a dense layer and an activation per layer of
 * weights), and this many parameter tensors. */
#define MODEL_MAX_SEQ (2 * MODEL_MAX_LAYERS)
#define MODEL_MAX_PARAMS (2 * MODEL_MAX_LAYERS)

typedef struct model_config {
    int num_sizes; /* 2 .. MODEL_MAX_LAYERS + 1 */
    int sizes[MODEL_MAX_LAYERS + 1];
    backend_act act; /* of the hidden layers: BACKEND_ACT_RELU or BACKEND_ACT_TANH */
    float l2;        /* weight decay on kernels, >= 0 */
} model_config;

/* Parses "784,256,128,10" (2 to MODEL_MAX_LAYERS+1 integers in
 * 1..MODEL_MAX_WIDTH) into cfg->sizes/num_sizes. Returns 0, or -1 with a
 * message in err. */
int model_parse_layers(const char *text, model_config *cfg, char *err, size_t errlen);

/* Formats cfg's sizes as "784,256,128,10" into buf. */
void model_format_layers(const model_config *cfg, char *buf, size_t cap);

/* Parses "relu" or "tanh". Returns 0 or -1. */
int model_parse_activation(const char *text, backend_act *out);
const char *model_activation_name(backend_act act);

/* One parameter tensor (a kernel or a bias). */
typedef struct model_param {
    char name[64];    /* "<prefix>/<type><k>/<param>": "mlp/dense0/kernel", "mlp/dense0/bias" */
    int layer;        /* 1-based, counting the layers that have parameters */
    int is_kernel;    /* Glorot-initialized, else zeros */
    int ndims;        /* 2 for dense kernels, 1 for biases */
    uint64_t dims[2]; /* dense kernel: in, out; bias: out */
    size_t numel;
    float *host;      /* numel values, host copy (backend_host_alloc) */
    float *grad_host; /* numel values, filled by model_train_step */
    /* host and grad_host are the device buffers themselves (a backend whose device memory is
     * host memory: backend_buf_host_ptr): uploads and downloads of them copy nothing, and a
     * write to host changes the device's parameters at once. */
    bool host_is_device;
    backend_buf *value; /* device */
    backend_buf *grad;  /* device */
    backend_event *grad_ready;
    /* The back buffers (model_double_buffer; NULL without): the next step's parameters are
     * written into host_back while a step computes with host and value (model_params_swap
     * exchanges them), and the previous step's gradients are read from grad_host_back while a
     * step writes grad_host (model_grads_swap). */
    float *host_back;
    backend_buf *value_back;
    float *grad_host_back;
    backend_buf *grad_back;
} model_param;

typedef struct model model;

/* Creates a model for batches of up to max_batch examples; parameters are
 * uninitialized (fill the host copies, then model_upload_params). prefix
 * names the parameters ("mlp" if NULL). Returns 0, or -1 with a message in
 * err (bad config, out of memory, backend error). Free with model_destroy. */
int model_create(backend *be, const model_config *cfg, int max_batch, const char *prefix,
                 model **out, char *err, size_t errlen);

/* Creates a model of num_specs layers (1 .. MODEL_MAX_SEQ) of the layer table's types
 * (layer.h), the first taking `inputs` features per example, each next one the previous
 * one's output; the last one's output are the logits of softmax cross-entropy. Otherwise as
 * model_create; such a model has no model_config (model_get_config returns NULL) and cannot
 * be saved. */
int model_create_layers(backend *be, int inputs, const layer_spec *specs, int num_specs,
                        int max_batch, const char *prefix, model **out, char *err, size_t errlen);

/* Frees every buffer; NULL is a no-op. */
void model_destroy(model *m);

/* The config of a model from model_create or model_load; NULL for model_create_layers. */
const model_config *model_get_config(const model *m);
int model_max_batch(const model *m);
int model_num_params(const model *m);
/* Parameter i (0 .. num_params-1), in layer order and each layer's order: kernel of layer 1,
 * bias of layer 1, kernel of layer 2, ... */
model_param *model_get_param(model *m, int i);
/* Layer k (0-based, in model order), or NULL past the last. */
layer *model_get_layer(model *m, int k);
/* Total number of floats over all parameters. */
size_t model_total_params(const model *m);

/* Fills the host copies with Glorot-uniform kernels (limit sqrt(6/(in+out)))
 * and zero biases, deterministic in seed. The servers do the same for the
 * cluster; this is for tests and for models trained without a server. */
void model_init_glorot(model *m, uint64_t seed);

/* Gives every parameter a second set of buffers (host_back, value_back, grad_host_back,
 * grad_back), so that the next step's parameters can be written (a prefetch) and the previous
 * step's gradients read (a push in flight) while a step computes. Idempotent. Returns 0, or -1
 * (out of memory; message via model_errmsg). */
int model_double_buffer(model *m);
/* Exchanges every parameter's buffers with its back buffers (model_double_buffer): the
 * values written into host_back become the parameters (after model_upload_params where the
 * host copies are not the device buffers), and the old ones the back buffers. Nothing is
 * copied; no backend work may be queued on the parameters. No-op without back buffers. */
void model_params_swap(model *m);
/* Exchanges every parameter's gradient buffers with their back buffers: the next
 * model_train_step writes the others. No-op without back buffers. */
void model_grads_swap(model *m);

/* Queues the upload of every host copy to the device. Returns 0 or -1 (message
 * via model_errmsg). */
int model_upload_params(model *m);
/* Uploads parameter i only. */
int model_upload_param(model *m, int i);

/* Uploads a batch of count (1 .. max_batch) examples: x is count * inputs (sizes[0])
 * floats, y count labels. */
int model_set_batch(model *m, const float *x, const int32_t *y, int count);

/* Result of a forward pass over one batch. */
typedef struct model_stats {
    double loss;    /* mean cross-entropy over the batch, plus the L2 term when training */
    double correct; /* examples whose arg max is the label */
} model_stats;

/* Forward pass over the uploaded batch; computes loss and accuracy. Blocks
 * until the results are on the host. */
int model_forward(model *m, model_stats *st);

/* Called by model_train_step once parameter i's gradient is in
 * model_get_param(m, i)->grad_host; typically starts a push. Returns 0 to go
 * on, non-zero to abort (then model_train_step returns that value). */
typedef int (*model_grad_fn)(model *m, int param_index, void *arg);

/* Forward and backward over the uploaded batch. Gradients come out last
 * layer first (parameter indices descending); on_grad is called for each parameter once its host
 * gradient is ready, while the backend computes the layers below (so pushes of layer k overlap
 * compute of layer k-1; on a backend whose device memory is host memory, as soon as the layer's
 * gradients are computed, before the pass goes on to the layer below). st (may be NULL) receives
 * loss and accuracy. Returns 0, -1 (backend error, message via model_errmsg) or on_grad's non-zero
 * value. */
int model_train_step(model *m, model_grad_fn on_grad, void *arg, model_stats *st);

/* Whether model_train_step copies the gradients to grad_host (on, the default).
 * Off, they stay in device memory and grad_host is not written: for measuring
 * the device's compute alone (bench/). */
void model_set_grad_download(model *m, bool on);

/* Evaluates the model (host copies must be uploaded) on every example of d in
 * batches of max_batch. *loss is the mean cross-entropy (no L2), *accuracy
 * the fraction of correct arg maxes. Returns 0 or -1. */
int model_evaluate(model *m, const dataset *d, double *loss, double *accuracy);

/* Message of the last failure. */
const char *model_errmsg(const model *m);

/* ---- model files ----
 * Format (little-endian): "PSWMODEL", u32 version (1), u32 activation,
 * u32 num_sizes, u32 sizes[num_sizes], f32 l2, the parameters in model order
 * as f32 arrays, then u32 CRC-32 (zlib) of every byte before it. Written to a
 * temporary file, fsynced, and renamed into place. */

/* Writes the host copies of every parameter to path (a model from model_create or
 * model_load). Returns 0, or -1 with a message naming the file. */
int model_save(model *m, const char *path, char *err, size_t errlen);

/* Reads path, creates the model it describes on be (as model_create) and
 * uploads its parameters. Errors (missing, truncated, bad magic or version,
 * bad sizes, checksum mismatch) name the file. Returns 0 or -1. */
int model_load(backend *be, const char *path, int max_batch, model **out, char *err, size_t errlen);

#endif /* WORKER_MODEL_H */
