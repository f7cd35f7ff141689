/* model.c - the models of model.h: a sequence of layers (layer.h) under softmax
 * cross-entropy; forward, backward, evaluation, model files. */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "util.h"

struct model {
    backend *be;
    model_config cfg;
    bool has_cfg; /* built by model_create: cfg describes it (model_get_config, model_save) */
    int max_batch;
    int inputs, classes; /* width of the batch and of the last layer */
    int num_layers;
    layer *layers[MODEL_MAX_SEQ];
    int first_param[MODEL_MAX_SEQ]; /* index in params of layer k's first parameter */
    int num_params;
    model_param params[MODEL_MAX_PARAMS];
    int batch; /* examples in the uploaded batch */
    /* y[k]: input of layer k and output of layer k-1 (y[0] the batch, y[num_layers] the
     * logits); dy[k] (k >= 1): the loss's gradient with respect to y[k]. An in-place layer's
     * output shares its input's buffers: owns[k] says whether y[k] and dy[k] are y[k]'s own. */
    backend_buf *y[MODEL_MAX_SEQ + 1];
    backend_buf *dy[MODEL_MAX_SEQ + 1];
    bool owns[MODEL_MAX_SEQ + 1];
    backend_buf *labels;
    backend_buf *loss_buf, *correct_buf, *sq_buf;
    float *scalars_host; /* [0] loss sum, [1] correct, [2] penalty */
    bool keep_grads;     /* model_set_grad_download(m, false): no copies to grad_host */
    char errmsg[512];
};

static int merr(model *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int merr(model *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    verrf(m->errmsg, sizeof(m->errmsg), fmt, ap);
    va_end(ap);
    return -1;
}

/* Turns a backend failure into a model error carrying the backend's message. */
static int berr(model *m, int rc, const char *what)
{
    if (rc == 0)
        return 0;
    return merr(m, "%s: backend %s: %s", what, backend_name(m->be), backend_errmsg(m->be));
}

int model_parse_layers(const char *text, model_config *cfg, char *err, size_t errlen)
{
    if (text == NULL || *text == '\0')
        return errf(err, errlen, "layers: empty (expected e.g. 784,256,128,10)");
    int n = 0;
    const char *p = text;
    while (*p != '\0') {
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno != 0 || (*end != ',' && *end != '\0'))
            return errf(err, errlen, "layers: '%s' is not a comma-separated list of integers",
                        text);
        if (v < 1 || v > MODEL_MAX_WIDTH)
            return errf(err, errlen, "layers: width %ld out of range 1..%d", v, MODEL_MAX_WIDTH);
        if (n == MODEL_MAX_LAYERS + 1)
            return errf(err, errlen, "layers: more than %d sizes", MODEL_MAX_LAYERS + 1);
        cfg->sizes[n++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end == ',' && *p == '\0')
            return errf(err, errlen, "layers: '%s' ends with a comma", text);
    }
    if (n < 2)
        return errf(err, errlen,
                    "layers: need at least an input and an output size (e.g. 784,10), got '%s'",
                    text);
    cfg->num_sizes = n;
    return 0;
}

void model_format_layers(const model_config *cfg, char *buf, size_t cap)
{
    size_t used = 0;
    if (cap == 0)
        return;
    buf[0] = '\0';
    for (int i = 0; i < cfg->num_sizes && used < cap; i++) {
        int w = snprintf(buf + used, cap - used, "%s%d", i ? "," : "", cfg->sizes[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
}

int model_parse_activation(const char *text, backend_act *out)
{
    if (text != NULL && strcmp(text, "relu") == 0) {
        *out = BACKEND_ACT_RELU;
        return 0;
    }
    if (text != NULL && strcmp(text, "tanh") == 0) {
        *out = BACKEND_ACT_TANH;
        return 0;
    }
    return -1;
}

const char *model_activation_name(backend_act act)
{
    switch (act) {
    case BACKEND_ACT_RELU:
        return "relu";
    case BACKEND_ACT_TANH:
        return "tanh";
    case BACKEND_ACT_IDENTITY:
        return "identity";
    }
    return "?";
}

static int check_config(const model_config *cfg, char *err, size_t errlen)
{
    if (cfg->num_sizes < 2 || cfg->num_sizes > MODEL_MAX_LAYERS + 1)
        return errf(err, errlen, "model: %d layer sizes (expected 2..%d)", cfg->num_sizes,
                    MODEL_MAX_LAYERS + 1);
    for (int i = 0; i < cfg->num_sizes; i++)
        if (cfg->sizes[i] < 1 || cfg->sizes[i] > MODEL_MAX_WIDTH)
            return errf(err, errlen, "model: layer size %d out of range", cfg->sizes[i]);
    if (cfg->act != BACKEND_ACT_RELU && cfg->act != BACKEND_ACT_TANH)
        return errf(err, errlen, "model: activation must be relu or tanh");
    if (!(cfg->l2 >= 0.0f) || !isfinite(cfg->l2))
        return errf(err, errlen, "model: l2 must be finite and >= 0");
    return 0;
}

void model_destroy(model *m)
{
    if (m == NULL)
        return;
    backend *be = m->be;
    for (int i = 0; i < m->num_params; i++) {
        model_param *p = &m->params[i];
        if (!p->host_is_device) {
            backend_host_free(be, p->host);
            backend_host_free(be, p->grad_host);
        }
        if (!p->host_is_device) {
            backend_host_free(be, p->host_back);
            backend_host_free(be, p->grad_host_back);
        }
        backend_buf_free(be, p->value_back);
        backend_buf_free(be, p->grad_back);
        backend_buf_free(be, p->value);
        backend_buf_free(be, p->grad);
        backend_event_destroy(be, p->grad_ready);
    }
    for (int k = 0; k <= m->num_layers; k++) {
        if (!m->owns[k])
            continue;
        backend_buf_free(be, m->y[k]);
        backend_buf_free(be, m->dy[k]);
    }
    for (int k = 0; k < m->num_layers; k++)
        layer_destroy(m->layers[k]);
    backend_buf_free(be, m->labels);
    backend_buf_free(be, m->loss_buf);
    backend_buf_free(be, m->correct_buf);
    backend_buf_free(be, m->sq_buf);
    backend_host_free(be, m->scalars_host);
    free(m);
}

/* Creates the layers of specs, each on the previous one's width, and declares their
 * parameters in m->params. Returns 0 or -1 with a message in err. */
static int create_layers(model *m, const layer_spec *specs, int num_specs, const char *prefix,
                         char *err, size_t errlen)
{
    int in = m->inputs, param_layers = 0;
    for (int k = 0; k < num_specs; k++) {
        char lerr[256];
        if (layer_create(m->be, in, &specs[k], &m->layers[k], lerr, sizeof(lerr)) != 0)
            return errf(err, errlen, "model: layer %d: %s", k + 1, lerr);
        m->num_layers = k + 1;
        layer *l = m->layers[k];
        if (l->out < 1 || l->out > MODEL_MAX_WIDTH)
            return errf(err, errlen, "model: layer %d (%s): width %d out of range 1..%d", k + 1,
                        l->ops->name, l->out, MODEL_MAX_WIDTH);
        if (k > 0 && l->ops->backward_input == NULL)
            return errf(err, errlen, "model: layer %d (%s) reads the batch: it must come first",
                        k + 1, l->ops->name);
        in = l->out;
        m->first_param[k] = m->num_params;
        if (l->num_params == 0)
            continue;
        if (m->num_params + l->num_params > MODEL_MAX_PARAMS)
            return errf(err, errlen, "model: more than %d parameter tensors", MODEL_MAX_PARAMS);
        /* Parameters are named by layer type and that type's count: "<prefix>/dense0/kernel". */
        int same_type = 0;
        for (int j = 0; j < k; j++)
            same_type += m->layers[j]->ops == l->ops;
        param_layers++;
        for (int j = 0; j < l->num_params; j++) {
            const layer_param *lp = &l->params[j];
            model_param *p = &m->params[m->num_params++];
            int w = snprintf(p->name, sizeof(p->name), "%s/%s%d/%s", prefix, l->ops->name,
                             same_type, lp->name);
            if (w < 0 || (size_t)w >= sizeof(p->name))
                return errf(err, errlen, "model: parameter name '%s/%s%d/%s' too long", prefix,
                            l->ops->name, same_type, lp->name);
            p->layer = param_layers;
            p->is_kernel = lp->is_kernel;
            p->ndims = lp->ndims;
            p->numel = 1;
            for (int d = 0; d < lp->ndims; d++) {
                p->dims[d] = lp->dims[d];
                p->numel *= (size_t)lp->dims[d];
            }
        }
    }
    m->classes = in;
    return 0;
}

/* Allocates the parameters' storage and the per-batch buffers. Returns 0, or non-zero
 * (out of memory: host allocation, or the backend's error). */
static int alloc_buffers(model *m)
{
    backend *be = m->be;
    int rc = 0;
    for (int i = 0; i < m->num_params && rc == 0; i++) {
        model_param *p = &m->params[i];
        size_t bytes = p->numel * sizeof(float);
        rc = backend_buf_alloc(be, bytes, &p->value);
        if (rc == 0)
            rc = backend_buf_alloc(be, bytes, &p->grad);
        if (rc != 0)
            break;
        /* Where the device is the host, the host copies are the device buffers themselves:
         * pulls land in the parameters the next step uses and pushes read the gradients where
         * the backward pass wrote them, with no upload or download copy in between. */
        p->host = backend_buf_host_ptr(be, p->value);
        p->grad_host = backend_buf_host_ptr(be, p->grad);
        p->host_is_device = p->host != NULL && p->grad_host != NULL;
        if (!p->host_is_device) {
            p->host = backend_host_alloc(be, bytes);
            p->grad_host = backend_host_alloc(be, bytes);
            if (p->host == NULL || p->grad_host == NULL)
                rc = -1;
        }
        if (rc == 0)
            rc = backend_event_create(be, &p->grad_ready);
    }
    for (int k = 0; k < m->num_layers && rc == 0; k++) {
        layer *l = m->layers[k];
        for (int j = 0; j < l->num_params; j++) {
            l->params[j].value = m->params[m->first_param[k] + j].value;
            l->params[j].grad = m->params[m->first_param[k] + j].grad;
        }
    }
    for (int k = 0; k <= m->num_layers && rc == 0; k++) {
        /* An in-place layer writes over its input unless that is the batch (read again by
         * the next pass) or the output of another in-place layer (which its backward reads). */
        if (k >= 2 && m->layers[k - 1]->ops->in_place && !m->layers[k - 2]->ops->in_place) {
            m->y[k] = m->y[k - 1];
            m->dy[k] = m->dy[k - 1];
            continue;
        }
        m->owns[k] = true;
        int width = k == 0 ? m->inputs : m->layers[k - 1]->out;
        size_t bytes = (size_t)m->max_batch * (size_t)width * sizeof(float);
        rc = backend_buf_alloc(be, bytes, &m->y[k]);
        if (rc == 0 && k > 0)
            rc = backend_buf_alloc(be, bytes, &m->dy[k]);
    }
    if (rc == 0)
        rc = backend_buf_alloc(be, (size_t)m->max_batch * sizeof(int32_t), &m->labels);
    if (rc == 0)
        rc = backend_buf_alloc(be, sizeof(float), &m->loss_buf);
    if (rc == 0)
        rc = backend_buf_alloc(be, sizeof(float), &m->correct_buf);
    if (rc == 0)
        rc = backend_buf_alloc(be, sizeof(float), &m->sq_buf);
    if (rc == 0) {
        m->scalars_host = backend_host_alloc(be, 4 * sizeof(float));
        if (m->scalars_host == NULL)
            rc = -1;
    }
    return rc;
}

static int create_model(backend *be, const model_config *cfg, int inputs, const layer_spec *specs,
                        int num_specs, int max_batch, const char *prefix, model **out, char *err,
                        size_t errlen)
{
    *out = NULL;
    if (num_specs < 1 || num_specs > MODEL_MAX_SEQ)
        return errf(err, errlen, "model: %d layers (expected 1..%d)", num_specs, MODEL_MAX_SEQ);
    if (inputs < 1 || inputs > MODEL_MAX_WIDTH)
        return errf(err, errlen, "model: %d inputs out of range 1..%d", inputs, MODEL_MAX_WIDTH);
    if (max_batch < 1)
        return errf(err, errlen, "model: batch size %d must be >= 1", max_batch);
    if (prefix == NULL)
        prefix = "mlp";
    if (strlen(prefix) > 40)
        return errf(err, errlen, "model: name prefix '%s' longer than 40 bytes", prefix);
    model *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return errf(err, errlen, "model: out of memory");
    m->be = be;
    if (cfg != NULL) {
        m->cfg = *cfg;
        m->has_cfg = true;
    }
    m->max_batch = max_batch;
    m->inputs = inputs;
    if (create_layers(m, specs, num_specs, prefix, err, errlen) != 0) {
        model_destroy(m);
        return -1;
    }
    if (alloc_buffers(m) != 0) {
        errf(err, errlen, "model: cannot allocate buffers for %d examples on backend %s: %s",
             max_batch, backend_name(be),
             backend_errmsg(be)[0] ? backend_errmsg(be) : "out of memory");
        model_destroy(m);
        return -1;
    }
    *out = m;
    return 0;
}

int model_create(backend *be, const model_config *cfg, int max_batch, const char *prefix,
                 model **out, char *err, size_t errlen)
{
    *out = NULL;
    if (check_config(cfg, err, errlen) != 0)
        return -1;
    /* dense, act, dense, act, ..., dense */
    layer_spec specs[MODEL_MAX_SEQ];
    int n = 0;
    for (int l = 1; l < cfg->num_sizes; l++) {
        specs[n++] = (layer_spec){.type = "dense", .units = cfg->sizes[l], .l2 = cfg->l2};
        if (l < cfg->num_sizes - 1)
            specs[n++] = (layer_spec){.type = model_activation_name(cfg->act)};
    }
    return create_model(be, cfg, cfg->sizes[0], specs, n, max_batch, prefix, out, err, errlen);
}

int model_create_layers(backend *be, int inputs, const layer_spec *specs, int num_specs,
                        int max_batch, const char *prefix, model **out, char *err, size_t errlen)
{
    return create_model(be, NULL, inputs, specs, num_specs, max_batch, prefix, out, err, errlen);
}

const model_config *model_get_config(const model *m)
{
    return m->has_cfg ? &m->cfg : NULL;
}

int model_max_batch(const model *m)
{
    return m->max_batch;
}

int model_num_params(const model *m)
{
    return m->num_params;
}

model_param *model_get_param(model *m, int i)
{
    if (i < 0 || i >= m->num_params)
        return NULL;
    return &m->params[i];
}

size_t model_total_params(const model *m)
{
    size_t t = 0;
    for (int i = 0; i < m->num_params; i++)
        t += m->params[i].numel;
    return t;
}

layer *model_get_layer(model *m, int k)
{
    return k >= 0 && k < m->num_layers ? m->layers[k] : NULL;
}

const char *model_errmsg(const model *m)
{
    return m->errmsg;
}

void model_init_glorot(model *m, uint64_t seed)
{
    uint64_t st = seed ^ 0x676c6f726f74ull; /* "glorot" */
    for (int i = 0; i < m->num_params; i++) {
        model_param *p = &m->params[i];
        if (!p->is_kernel) {
            memset(p->host, 0, p->numel * sizeof(float));
            continue;
        }
        double limit = sqrt(6.0 / (double)(p->dims[0] + p->dims[1]));
        for (size_t j = 0; j < p->numel; j++) {
            double u = (double)(data_rng_next(&st) >> 11) * (1.0 / 9007199254740992.0);
            p->host[j] = (float)((2.0 * u - 1.0) * limit);
        }
    }
}

/* A back buffer for a parameter's device buffer: the device one and its host copy. */
static int alloc_back(model *m, const model_param *p, backend_buf **buf, float **host)
{
    size_t bytes = p->numel * sizeof(float);
    if (*buf != NULL)
        return 0;
    if (berr(m, backend_buf_alloc(m->be, bytes, buf), p->name) != 0)
        return -1;
    *host =
        p->host_is_device ? backend_buf_host_ptr(m->be, *buf) : backend_host_alloc(m->be, bytes);
    if (*host == NULL) {
        backend_buf_free(m->be, *buf);
        *buf = NULL;
        return merr(m, "%s: out of memory for its back buffers", p->name);
    }
    return 0;
}

int model_double_buffer(model *m)
{
    for (int i = 0; i < m->num_params; i++) {
        model_param *p = &m->params[i];
        if (alloc_back(m, p, &p->value_back, &p->host_back) != 0 ||
            alloc_back(m, p, &p->grad_back, &p->grad_host_back) != 0)
            return -1;
    }
    return 0;
}

/* Points the layers at the model's current buffers. */
static void relink_layers(model *m)
{
    for (int k = 0; k < m->num_layers; k++) {
        layer *l = m->layers[k];
        for (int j = 0; j < l->num_params; j++) {
            l->params[j].value = m->params[m->first_param[k] + j].value;
            l->params[j].grad = m->params[m->first_param[k] + j].grad;
        }
    }
}

void model_grads_swap(model *m)
{
    for (int i = 0; i < m->num_params; i++) {
        model_param *p = &m->params[i];
        if (p->grad_back == NULL)
            continue;
        float *h = p->grad_host;
        p->grad_host = p->grad_host_back;
        p->grad_host_back = h;
        backend_buf *g = p->grad;
        p->grad = p->grad_back;
        p->grad_back = g;
    }
    relink_layers(m);
}

void model_params_swap(model *m)
{
    for (int i = 0; i < m->num_params; i++) {
        model_param *p = &m->params[i];
        if (p->value_back == NULL)
            continue;
        float *h = p->host;
        p->host = p->host_back;
        p->host_back = h;
        backend_buf *v = p->value;
        p->value = p->value_back;
        p->value_back = v;
    }
    relink_layers(m);
}

int model_upload_param(model *m, int i)
{
    model_param *p = &m->params[i];
    return berr(m, backend_upload(m->be, p->value, 0, p->host, p->numel * sizeof(float)), p->name);
}

int model_upload_params(model *m)
{
    for (int i = 0; i < m->num_params; i++)
        if (model_upload_param(m, i) != 0)
            return -1;
    return 0;
}

int model_set_batch(model *m, const float *x, const int32_t *y, int count)
{
    if (count < 1 || count > m->max_batch)
        return merr(m, "batch of %d examples (expected 1..%d)", count, m->max_batch);
    size_t xbytes = (size_t)count * (size_t)m->inputs * sizeof(float);
    if (berr(m, backend_upload(m->be, m->y[0], 0, x, xbytes), "upload batch") != 0)
        return -1;
    if (berr(m, backend_upload(m->be, m->labels, 0, y, (size_t)count * sizeof(int32_t)),
             "upload labels") != 0)
        return -1;
    m->batch = count;
    return 0;
}

/* y[num_layers] = logits of the uploaded batch. */
static int forward_layers(model *m)
{
    for (int k = 0; k < m->num_layers; k++) {
        layer *l = m->layers[k];
        int rc = l->ops->forward(l, m->y[k], m->y[k + 1], m->batch);
        if (rc != 0)
            return berr(m, rc, "forward");
    }
    return 0;
}

/* Whether some layer adds a regularization term to the training loss. */
static bool has_penalty(const model *m)
{
    for (int k = 0; k < m->num_layers; k++)
        if (m->layers[k]->penalized)
            return true;
    return false;
}

/* Queues the sum of the layers' regularization terms into sq_buf. */
static int queue_penalty(model *m)
{
    int rc = backend_memset_zero(m->be, m->sq_buf, 0, sizeof(float));
    for (int k = 0; k < m->num_layers && rc == 0; k++) {
        layer *l = m->layers[k];
        if (l->penalized)
            rc = l->ops->penalty(l, m->sq_buf);
    }
    return berr(m, rc, "l2");
}

/* Downloads loss, correct and (if with_penalty) the penalty, waits, fills st. */
static int collect_stats(model *m, bool with_penalty, model_stats *st)
{
    backend *be = m->be;
    int rc = backend_download(be, m->loss_buf, 0, &m->scalars_host[0], sizeof(float));
    if (rc == 0)
        rc = backend_download(be, m->correct_buf, 0, &m->scalars_host[1], sizeof(float));
    if (rc == 0 && with_penalty)
        rc = backend_download(be, m->sq_buf, 0, &m->scalars_host[2], sizeof(float));
    if (rc == 0)
        rc = backend_sync(be);
    if (rc != 0)
        return berr(m, rc, "stats");
    if (st != NULL) {
        st->loss = (double)m->scalars_host[0] / (double)m->batch;
        if (with_penalty)
            st->loss += (double)m->scalars_host[2];
        st->correct = (double)m->scalars_host[1];
    }
    return 0;
}

int model_forward(model *m, model_stats *st)
{
    if (m->batch < 1)
        return merr(m, "forward: no batch uploaded");
    if (forward_layers(m) != 0)
        return -1;
    int L = m->num_layers;
    int rc = backend_softmax_xent(m->be, m->y[L], m->labels, m->batch, m->classes, 0.0f, NULL,
                                  m->loss_buf, m->correct_buf);
    if (rc != 0)
        return berr(m, rc, "softmax_xent");
    return collect_stats(m, false, st);
}

/* Queues layer k's parameter gradients (from dy[k+1]) and their downloads, then records
 * the event of its first parameter. */
static int queue_layer_grads(model *m, int k)
{
    backend *be = m->be;
    layer *l = m->layers[k];
    model_param *first = &m->params[m->first_param[k]];
    int rc = l->ops->backward_params(l, m->y[k], m->y[k + 1], m->dy[k + 1], m->batch);
    for (int j = 0; j < l->num_params && rc == 0 && !m->keep_grads; j++) {
        model_param *p = &first[j];
        rc = backend_download(be, p->grad, 0, p->grad_host, p->numel * sizeof(float));
    }
    if (rc == 0)
        rc = backend_event_record(be, first->grad_ready);
    return berr(m, rc, "backward");
}

/* Waits for layer k's gradients and hands them to on_grad, last parameter first (a dense
 * layer's bias before its kernel: the small one is on the wire while the kernel is
 * prepared). */
static int deliver_layer(model *m, int k, model_grad_fn on_grad, void *arg)
{
    int first = m->first_param[k];
    if (berr(m, backend_event_wait(m->be, m->params[first].grad_ready), "backward") != 0)
        return -1;
    if (on_grad == NULL)
        return 0;
    for (int i = first + m->layers[k]->num_params - 1; i >= first; i--) {
        int rc = on_grad(m, i, arg);
        if (rc != 0)
            return rc;
    }
    return 0;
}

void model_set_grad_download(model *m, bool on)
{
    m->keep_grads = !on;
}

int model_train_step(model *m, model_grad_fn on_grad, void *arg, model_stats *st)
{
    if (m->batch < 1)
        return merr(m, "train: no batch uploaded");
    if (forward_layers(m) != 0)
        return -1;
    int L = m->num_layers;
    int rc = backend_softmax_xent(m->be, m->y[L], m->labels, m->batch, m->classes,
                                  1.0f / (float)m->batch, m->dy[L], m->loss_buf, m->correct_buf);
    if (rc != 0)
        return berr(m, rc, "softmax_xent");
    bool with_penalty = has_penalty(m);
    if (with_penalty && queue_penalty(m) != 0)
        return -1;
    /* Layers with parameters whose gradients are queued but not yet handed out: `newer` is
     * the lowest so far, `older` the one above it. A layer's gradients are handed out when
     * the pass reaches the second layer with parameters below it (or ends), so the host
     * pushes them while the backend computes the layers in between. */
    int older = -1, newer = -1;
    /* A backend computing in host memory has a layer's gradients when queue_layer_grads
     * returns: hand them out then, so that their pushes overlap the layers below. */
    bool at_once = m->num_params > 0 && m->params[0].host_is_device;
    for (int k = L - 1; k >= 0; k--) {
        layer *l = m->layers[k];
        if (l->num_params > 0) {
            if (older >= 0 && (rc = deliver_layer(m, older, on_grad, arg)) != 0)
                return rc;
            older = newer;
            newer = k;
            if (queue_layer_grads(m, k) != 0)
                return -1;
            if (at_once) {
                if ((rc = deliver_layer(m, k, on_grad, arg)) != 0)
                    return rc;
                newer = -1;
            }
        } else if (l->ops->backward_params != NULL) {
            /* Gradients the layer keeps itself (an embedding bag's rows). */
            rc = l->ops->backward_params(l, m->y[k], m->y[k + 1], m->dy[k + 1], m->batch);
            if (rc != 0)
                return berr(m, rc, "backward");
        }
        /* The batch needs no gradient. */
        if (k > 0) {
            rc = l->ops->backward_input(l, m->y[k], m->y[k + 1], m->dy[k + 1], m->dy[k], m->batch);
            if (rc != 0)
                return berr(m, rc, "backward");
        }
    }
    if (older >= 0 && (rc = deliver_layer(m, older, on_grad, arg)) != 0)
        return rc;
    if (newer >= 0 && (rc = deliver_layer(m, newer, on_grad, arg)) != 0)
        return rc;
    return collect_stats(m, with_penalty, st);
}

int model_evaluate(model *m, const dataset *d, double *loss, double *accuracy)
{
    if (d->x == NULL)
        return merr(m, "evaluate: the data set is sparse (ids, no features)");
    if ((int)d->dim != m->inputs)
        return merr(m, "evaluate: data has %zu features, model expects %d", d->dim, m->inputs);
    double loss_sum = 0.0, correct = 0.0;
    for (size_t first = 0; first < d->n; first += (size_t)m->max_batch) {
        size_t count = d->n - first;
        if (count > (size_t)m->max_batch)
            count = (size_t)m->max_batch;
        if (model_set_batch(m, d->x + first * d->dim, d->y + first, (int)count) != 0)
            return -1;
        model_stats st;
        if (model_forward(m, &st) != 0)
            return -1;
        loss_sum += st.loss * (double)count;
        correct += st.correct;
    }
    *loss = d->n ? loss_sum / (double)d->n : 0.0;
    *accuracy = d->n ? correct / (double)d->n : 0.0;
    return 0;
}

/* ---- model files ---- */

#define MODEL_MAGIC "PSWMODEL"
#define MODEL_VERSION 1u

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static size_t header_bytes(int num_sizes)
{
    return 8 + 4 + 4 + 4 + 4 * (size_t)num_sizes + 4;
}

int model_save(model *m, const char *path, char *err, size_t errlen)
{
    if (!m->has_cfg)
        return errf(err, errlen, "%s: only models made by model_create can be saved", path);
    size_t hlen = header_bytes(m->cfg.num_sizes);
    size_t total = hlen + model_total_params(m) * 4 + 4;
    uint8_t *buf = malloc(total);
    if (buf == NULL)
        return errf(err, errlen, "%s: out of memory for %zu bytes", path, total);
    uint8_t *p = buf;
    memcpy(p, MODEL_MAGIC, 8);
    p += 8;
    put_u32(p, MODEL_VERSION);
    put_u32(p + 4, (uint32_t)m->cfg.act);
    put_u32(p + 8, (uint32_t)m->cfg.num_sizes);
    p += 12;
    for (int i = 0; i < m->cfg.num_sizes; i++, p += 4)
        put_u32(p, (uint32_t)m->cfg.sizes[i]);
    put_u32(p, f2u(m->cfg.l2));
    p += 4;
    for (int i = 0; i < m->num_params; i++)
        for (size_t j = 0; j < m->params[i].numel; j++, p += 4)
            put_u32(p, f2u(m->params[i].host[j]));
    put_u32(p, (uint32_t)crc32_z(0L, buf, total - 4));

    char tmp[4096];
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        free(buf);
        return errf(err, errlen, "%s: path too long", path);
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        free(buf);
        return errf(err, errlen, "%s: cannot create: %s", tmp, strerror(e));
    }
    size_t done = 0;
    int rc = 0;
    while (done < total) {
        ssize_t w = write(fd, buf + done, total - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = errf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
            break;
        }
        done += (size_t)w;
    }
    if (rc == 0 && fsync(fd) != 0)
        rc = errf(err, errlen, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = errf(err, errlen, "%s: close failed: %s", tmp, strerror(errno));
    if (rc == 0 && rename(tmp, path) != 0)
        rc = errf(err, errlen, "%s: cannot rename %s into place: %s", path, tmp, strerror(errno));
    if (rc != 0)
        unlink(tmp);
    free(buf);
    return rc;
}

int model_load(backend *be, const char *path, int max_batch, model **out, char *err, size_t errlen)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = -1;
    for (;;) {
        if (len == cap) {
            size_t ncap = cap ? cap * 2 : 1 << 20;
            if (ncap > ((size_t)1 << 34)) {
                errf(err, errlen, "%s: larger than 16 GiB: not a model file", path);
                goto out;
            }
            uint8_t *nb = realloc(buf, ncap);
            if (nb == NULL) {
                errf(err, errlen, "%s: out of memory", path);
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + len, 1, cap - len, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) {
                errf(err, errlen, "%s: read error: %s", path, strerror(errno));
                goto out;
            }
            break;
        }
    }
    if (len < header_bytes(2) + 4 || memcmp(buf, MODEL_MAGIC, 8) != 0) {
        errf(err, errlen, "%s: not a ps-worker model file (bad magic or too short)", path);
        goto out;
    }
    uint32_t version = get_u32(buf + 8);
    if (version != MODEL_VERSION) {
        errf(err, errlen, "%s: model file version %u, this program reads version %u", path, version,
             MODEL_VERSION);
        goto out;
    }
    uint32_t crc_stored = get_u32(buf + len - 4);
    uint32_t crc = (uint32_t)crc32_z(0L, buf, len - 4);
    if (crc != crc_stored) {
        errf(err, errlen, "%s: checksum mismatch: the file is corrupt or truncated", path);
        goto out;
    }
    model_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    uint32_t act = get_u32(buf + 12);
    uint32_t num_sizes = get_u32(buf + 16);
    if (num_sizes < 2 || num_sizes > MODEL_MAX_LAYERS + 1 ||
        len < header_bytes((int)num_sizes) + 4) {
        errf(err, errlen, "%s: bad layer count %u", path, num_sizes);
        goto out;
    }
    cfg.num_sizes = (int)num_sizes;
    cfg.act = (backend_act)act;
    size_t expect = header_bytes(cfg.num_sizes) + 4;
    for (int i = 0; i < cfg.num_sizes; i++) {
        uint32_t s = get_u32(buf + 20 + 4 * (size_t)i);
        if (s < 1 || s > MODEL_MAX_WIDTH) {
            errf(err, errlen, "%s: bad layer size %u", path, s);
            goto out;
        }
        cfg.sizes[i] = (int)s;
        if (i > 0)
            expect += 4 * ((size_t)cfg.sizes[i - 1] * (size_t)s + s);
    }
    cfg.l2 = u2f(get_u32(buf + 20 + 4 * (size_t)cfg.num_sizes));
    if (len != expect) {
        errf(err, errlen, "%s: %zu bytes, but its layers need %zu", path, len, expect);
        goto out;
    }
    char cerr[256];
    if (check_config(&cfg, cerr, sizeof(cerr)) != 0) {
        errf(err, errlen, "%s: %s", path, cerr);
        goto out;
    }
    model *m = NULL;
    if (model_create(be, &cfg, max_batch, NULL, &m, err, errlen) != 0)
        goto out;
    const uint8_t *p = buf + header_bytes(cfg.num_sizes);
    for (int i = 0; i < m->num_params; i++)
        for (size_t j = 0; j < m->params[i].numel; j++, p += 4)
            m->params[i].host[j] = u2f(get_u32(p));
    if (model_upload_params(m) != 0) {
        errf(err, errlen, "%s: %s", path, m->errmsg);
        model_destroy(m);
        goto out;
    }
    *out = m;
    rc = 0;
out:
    fclose(f);
    free(buf);
    return rc;
}
