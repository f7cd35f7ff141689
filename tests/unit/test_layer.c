/* The layer table of worker/layer.h on the CPU backend: every type's forward and backward
 * against naive loops, models built through the table (forward against a naive loop,
 * gradients against central differences), model_create as the same layer sequence, and the
 * identity activation (a table row and an ops struct, no model change) as a no-op. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend.h"
#include "layer.h"
#include "model.h"

static backend *be;

static int setup(void **state)
{
    char err[256];
    return backend_open("cpu", NULL, &be, NULL, err, sizeof(err));
}

static int teardown(void **state)
{
    backend_close(be);
    return 0;
}

static double uniform(uint64_t *s)
{
    return (double)(data_rng_next(s) >> 11) / 9007199254740992.0;
}

static void fill(float *v, size_t n, double lo, double hi, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(lo + (hi - lo) * uniform(s));
}

static double act_ref(const char *type, double z)
{
    if (strcmp(type, "relu") == 0)
        return z > 0 ? z : 0;
    if (strcmp(type, "tanh") == 0)
        return tanh(z);
    if (strcmp(type, "identity") == 0)
        return z;
    fail_msg("no reference for '%s'", type);
    return 0;
}

/* Derivative through the output y, as backend_act_backward defines it. */
static double act_grad_ref(const char *type, double y)
{
    if (strcmp(type, "relu") == 0)
        return y > 0 ? 1 : 0;
    if (strcmp(type, "tanh") == 0)
        return 1 - y * y;
    return 1;
}

static backend_buf *buf_with(const float *v, size_t n)
{
    backend_buf *b = NULL;
    assert_int_equal(backend_buf_alloc(be, n * sizeof(float), &b), 0);
    if (v != NULL)
        assert_int_equal(backend_upload(be, b, 0, v, n * sizeof(float)), 0);
    return b;
}

static void download(const backend_buf *b, float *v, size_t n)
{
    assert_int_equal(backend_download(be, b, 0, v, n * sizeof(float)), 0);
    assert_int_equal(backend_sync(be), 0);
}

static void assert_close(const float *got, const double *want, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > 1e-5 * (1 + fabs(want[i])))
            fail_msg("%s[%zu]: %.8g, expected %.8g", what, i, got[i], want[i]);
}

static void test_table(void **state)
{
    const char *names[] = {"dense", "relu", "tanh", "identity"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        const layer_ops *ops = layer_find(names[i]);
        assert_non_null(ops);
        assert_string_equal(ops->name, names[i]);
        assert_non_null(ops->create);
        assert_non_null(ops->forward);
        assert_non_null(ops->backward_input);
    }
    assert_ptr_equal(layer_find("dense"), &layer_dense_ops);
    assert_ptr_equal(layer_find("identity"), &layer_identity_ops);
    assert_null(layer_find("sigmoid"));
    assert_null(layer_find(NULL));
    char buf[128];
    assert_string_equal(layer_names(buf, sizeof(buf)),
                        "dense, relu, tanh, identity, embbag, embbag_mean");

    /* Bad specs are refused with a message. */
    char err[256] = "";
    layer *l = (layer *)1;
    assert_int_equal(layer_create(be, 4, &(layer_spec){.type = "sigmoid"}, &l, err, sizeof(err)),
                     -1);
    assert_null(l);
    assert_non_null(strstr(err, "unknown layer type 'sigmoid'"));
    assert_non_null(strstr(err, "dense, relu"));
    assert_int_equal(layer_create(be, 4, &(layer_spec){.type = "dense"}, &l, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "units"));
    assert_int_equal(layer_create(be, 4, &(layer_spec){.type = "dense", .units = 2, .l2 = -1}, &l,
                                  err, sizeof(err)),
                     -1);
    assert_int_equal(
        layer_create(be, 4, &(layer_spec){.type = "relu", .units = 3}, &l, err, sizeof(err)), -1);
    assert_int_equal(
        layer_create(be, 4, &(layer_spec){.type = "tanh", .l2 = 0.1f}, &l, err, sizeof(err)), -1);
    assert_int_equal(layer_create(be, 0, &(layer_spec){.type = "relu"}, &l, err, sizeof(err)), -1);
    layer_destroy(NULL);
}

/* A dense layer's ops against naive loops: y = x W + b, dW = x^T dy + l2 W, db = colsum dy,
 * dx = dy W^T, penalty l2/2 ||W||^2. */
static void test_dense_ops(void **state)
{
    enum { B = 3, IN = 5, OUT = 4 };
    const float l2 = 0.25f;
    char err[256];
    layer *l = NULL;
    if (layer_create(be, IN, &(layer_spec){.type = "dense", .units = OUT, .l2 = l2}, &l, err,
                     sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(l->in, IN);
    assert_int_equal(l->out, OUT);
    assert_int_equal(l->num_params, 2);
    assert_true(l->penalized);
    assert_string_equal(l->params[0].name, "kernel");
    assert_true(l->params[0].is_kernel);
    assert_int_equal(l->params[0].dims[0], IN);
    assert_int_equal(l->params[0].dims[1], OUT);
    assert_string_equal(l->params[1].name, "bias");
    assert_false(l->params[1].is_kernel);
    assert_int_equal(l->params[1].dims[0], OUT);

    uint64_t s = 17;
    float x[B * IN], w[IN * OUT], b[OUT], dy[B * OUT], got[IN * OUT];
    fill(x, B * IN, -1, 1, &s);
    fill(w, IN * OUT, -1, 1, &s);
    fill(b, OUT, -1, 1, &s);
    fill(dy, B * OUT, -1, 1, &s);
    backend_buf *bx = buf_with(x, B * IN), *by = buf_with(NULL, B * OUT);
    backend_buf *bdy = buf_with(dy, B * OUT), *bdx = buf_with(NULL, B * IN);
    l->params[0].value = buf_with(w, IN * OUT);
    l->params[0].grad = buf_with(NULL, IN * OUT);
    l->params[1].value = buf_with(b, OUT);
    l->params[1].grad = buf_with(NULL, OUT);
    backend_buf *pen = buf_with(&(float){1.5f}, 1);

    assert_int_equal(l->ops->forward(l, bx, by, B), 0);
    assert_int_equal(l->ops->penalty(l, pen), 0);
    assert_int_equal(l->ops->backward_params(l, bx, by, bdy, B), 0);
    assert_int_equal(l->ops->backward_input(l, bx, by, bdy, bdx, B), 0);

    double want[IN * OUT], sq = 0;
    for (int i = 0; i < B; i++)
        for (int o = 0; o < OUT; o++) {
            double z = b[o];
            for (int k = 0; k < IN; k++)
                z += (double)x[i * IN + k] * w[k * OUT + o];
            want[i * OUT + o] = z;
        }
    download(by, got, B * OUT);
    assert_close(got, want, B * OUT, "y");
    for (int k = 0; k < IN; k++)
        for (int o = 0; o < OUT; o++) {
            double g = l2 * (double)w[k * OUT + o];
            for (int i = 0; i < B; i++)
                g += (double)x[i * IN + k] * dy[i * OUT + o];
            want[k * OUT + o] = g;
            sq += (double)w[k * OUT + o] * w[k * OUT + o];
        }
    download(l->params[0].grad, got, IN * OUT);
    assert_close(got, want, IN * OUT, "dW");
    for (int o = 0; o < OUT; o++) {
        want[o] = 0;
        for (int i = 0; i < B; i++)
            want[o] += dy[i * OUT + o];
    }
    download(l->params[1].grad, got, OUT);
    assert_close(got, want, OUT, "db");
    for (int i = 0; i < B; i++)
        for (int k = 0; k < IN; k++) {
            double g = 0;
            for (int o = 0; o < OUT; o++)
                g += (double)dy[i * OUT + o] * w[k * OUT + o];
            want[i * IN + k] = g;
        }
    download(bdx, got, B * IN);
    assert_close(got, want, B * IN, "dx");
    want[0] = 1.5 + 0.5 * l2 * sq;
    download(pen, got, 1);
    assert_close(got, want, 1, "penalty");

    for (int j = 0; j < 2; j++) {
        backend_buf_free(be, l->params[j].value);
        backend_buf_free(be, l->params[j].grad);
    }
    backend_buf_free(be, bx);
    backend_buf_free(be, by);
    backend_buf_free(be, bdy);
    backend_buf_free(be, bdx);
    backend_buf_free(be, pen);
    layer_destroy(l);
}

/* Every activation in the table, in place as the model runs it: y = act(x) over x's buffer,
 * dx = dy * act'(y) over dy's buffer. */
static void test_activation_ops(void **state)
{
    enum { B = 4, N = 6 };
    const char *types[] = {"relu", "tanh", "identity"};
    for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
        char err[256];
        layer *l = NULL;
        if (layer_create(be, N, &(layer_spec){.type = types[t]}, &l, err, sizeof(err)) != 0)
            fail_msg("%s", err);
        assert_true(l->ops->in_place);
        assert_int_equal(l->in, N);
        assert_int_equal(l->out, N);
        assert_int_equal(l->num_params, 0);
        assert_false(l->penalized);
        assert_null(l->ops->backward_params);
        uint64_t s = 23 + t;
        float x[B * N], dy[B * N], got[B * N];
        fill(x, B * N, -2, 2, &s);
        fill(dy, B * N, -1, 1, &s);
        backend_buf *bx = buf_with(x, B * N), *bdy = buf_with(dy, B * N);
        assert_int_equal(l->ops->forward(l, bx, bx, B), 0);
        assert_int_equal(l->ops->backward_input(l, bx, bx, bdy, bdy, B), 0);
        double want_y[B * N], want_dx[B * N];
        for (int i = 0; i < B * N; i++) {
            want_y[i] = act_ref(types[t], x[i]);
            want_dx[i] = dy[i] * act_grad_ref(types[t], (float)want_y[i]);
        }
        download(bx, got, B * N);
        assert_close(got, want_y, B * N, types[t]);
        download(bdy, got, B * N);
        assert_close(got, want_dx, B * N, types[t]);
        backend_buf_free(be, bx);
        backend_buf_free(be, bdy);
        layer_destroy(l);
    }
}

/* The loss of specs on the batch, in double precision from the model's host parameters,
 * with parameter pi's element pj shifted by delta (pi < 0: none). */
static double ref_loss(model *m, const layer_spec *specs, int n, int inputs, const float *x,
                       const int32_t *y, int batch, int pi, size_t pj, double delta)
{
    double total = 0.0, penalty = 0.0;
    for (int b = 0; b < batch; b++) {
        double a[2][64];
        int cur = 0, width = inputs, param = 0;
        for (int j = 0; j < inputs; j++)
            a[cur][j] = x[b * inputs + j];
        for (int k = 0; k < n; k++) {
            if (strcmp(specs[k].type, "dense") != 0) {
                for (int j = 0; j < width; j++)
                    a[cur][j] = act_ref(specs[k].type, a[cur][j]);
                continue;
            }
            model_param *W = model_get_param(m, param), *B = model_get_param(m, param + 1);
            int out = specs[k].units;
            for (int o = 0; o < out; o++) {
                double z = B->host[o] + (pi == param + 1 && pj == (size_t)o ? delta : 0);
                for (int i = 0; i < width; i++)
                    z += a[cur][i] * (W->host[i * out + o] +
                                      (pi == param && pj == (size_t)(i * out + o) ? delta : 0));
                a[1 - cur][o] = z;
            }
            if (b == 0)
                for (size_t j = 0; j < W->numel; j++) {
                    double w = W->host[j] + (pi == param && pj == j ? delta : 0);
                    penalty += 0.5 * specs[k].l2 * w * w;
                }
            cur = 1 - cur;
            width = out;
            param += 2;
        }
        double mx = a[cur][0], se = 0;
        for (int c = 1; c < width; c++)
            mx = fmax(mx, a[cur][c]);
        for (int c = 0; c < width; c++)
            se += exp(a[cur][c] - mx);
        total += -(a[cur][y[b]] - mx - log(se));
    }
    return total / batch + penalty;
}

static int record_order(model *m, int i, void *arg)
{
    int *order = arg;
    order[++order[0]] = i;
    return 0;
}

/* A model built through the table (activations in a row, an activation last): forward
 * loss and accuracy against the naive loop, gradients against central differences of it,
 * gradients handed out last parameter first. */
static void test_model_through_table(void **state)
{
    enum { B = 4, IN = 6, C = 3 };
    const layer_spec specs[] = {
        {.type = "dense", .units = 5, .l2 = 0.02f},
        {.type = "tanh"},
        {.type = "tanh"},
        {.type = "dense", .units = 4},
        {.type = "relu"},
        {.type = "identity"},
        {.type = "dense", .units = C, .l2 = 0.01f},
        {.type = "identity"},
    };
    const int n = (int)(sizeof(specs) / sizeof(specs[0]));
    model *m = NULL;
    char err[256];
    if (model_create_layers(be, IN, specs, n, B, "seq", &m, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_null(model_get_config(m));
    assert_int_equal(model_num_params(m), 6);
    const char *names[] = {"seq/dense0/kernel", "seq/dense0/bias",   "seq/dense1/kernel",
                           "seq/dense1/bias",   "seq/dense2/kernel", "seq/dense2/bias"};
    for (int i = 0; i < 6; i++) {
        assert_string_equal(model_get_param(m, i)->name, names[i]);
        assert_int_equal(model_get_param(m, i)->layer, i / 2 + 1);
    }
    assert_int_equal(model_total_params(m), 6 * 5 + 5 + 5 * 4 + 4 + 4 * C + C);
    model_init_glorot(m, 5);
    uint64_t s = 77;
    for (int i = 0; i < model_num_params(m); i++) {
        model_param *p = model_get_param(m, i);
        if (!p->is_kernel)
            fill(p->host, p->numel, -0.3, 0.3, &s);
    }
    float x[B * IN];
    int32_t y[B] = {2, 0, 1, 2};
    fill(x, B * IN, -1, 1, &s);
    assert_int_equal(model_upload_params(m), 0);
    assert_int_equal(model_set_batch(m, x, y, B), 0);

    /* Forward: the loss without the penalty, and the arg max count. */
    model_stats st;
    assert_int_equal(model_forward(m, &st), 0);
    layer_spec nol2[sizeof(specs) / sizeof(specs[0])];
    for (int k = 0; k < n; k++)
        nol2[k] = (layer_spec){.type = specs[k].type, .units = specs[k].units};
    double want = ref_loss(m, nol2, n, IN, x, y, B, -1, 0, 0.0);
    if (fabs(st.loss - want) > 1e-5 * (1 + want))
        fail_msg("forward loss %.8g, naive %.8g", st.loss, want);
    assert_true(st.correct >= 0 && st.correct <= B);

    int order[16] = {0};
    assert_int_equal(model_train_step(m, record_order, order, &st), 0);
    want = ref_loss(m, specs, n, IN, x, y, B, -1, 0, 0.0);
    if (fabs(st.loss - want) > 1e-5 * (1 + want))
        fail_msg("training loss %.8g, naive %.8g", st.loss, want);
    assert_int_equal(order[0], 6);
    for (int i = 0; i < 6; i++)
        assert_int_equal(order[i + 1], 5 - i);

    const double eps = 1e-4;
    for (int i = 0; i < model_num_params(m); i++) {
        model_param *p = model_get_param(m, i);
        for (size_t j = 0; j < p->numel; j++) {
            double num = (ref_loss(m, specs, n, IN, x, y, B, i, j, eps) -
                          ref_loss(m, specs, n, IN, x, y, B, i, j, -eps)) /
                         (2 * eps);
            double ana = p->grad_host[j];
            double denom = fmax(fabs(num), fabs(ana));
            double rel = fabs(num - ana) / (denom > 1e-5 ? denom : 1e-5);
            if (rel >= 1e-3)
                fail_msg("%s[%zu]: analytic %.8g, numeric %.8g", p->name, j, ana, num);
        }
    }
    /* Not a model_config: not savable. */
    assert_int_equal(model_save(m, "/nonexistent/m.bin", err, sizeof(err)), -1);
    assert_non_null(strstr(err, "model_create"));
    model_destroy(m);
}

/* Loss and gradients of one training step of a and b (same parameter layout, same host
 * values) are bit-identical. */
static void assert_same_step(model *a, model *b, const float *x, const int32_t *y, int batch)
{
    assert_int_equal(model_num_params(a), model_num_params(b));
    for (int i = 0; i < model_num_params(a); i++) {
        model_param *pa = model_get_param(a, i), *pb = model_get_param(b, i);
        assert_string_equal(pa->name, pb->name);
        assert_int_equal(pa->numel, pb->numel);
        assert_int_equal(pa->is_kernel, pb->is_kernel);
        memcpy(pb->host, pa->host, pa->numel * sizeof(float));
    }
    model_stats sa, sb;
    for (int k = 0; k < 2; k++) {
        model *m = k ? b : a;
        assert_int_equal(model_upload_params(m), 0);
        assert_int_equal(model_set_batch(m, x, y, batch), 0);
        assert_int_equal(model_train_step(m, NULL, NULL, k ? &sb : &sa), 0);
    }
    assert_memory_equal(&sa.loss, &sb.loss, sizeof(double));
    assert_memory_equal(&sa.correct, &sb.correct, sizeof(double));
    for (int i = 0; i < model_num_params(a); i++)
        assert_memory_equal(model_get_param(a, i)->grad_host, model_get_param(b, i)->grad_host,
                            model_get_param(a, i)->numel * sizeof(float));
}

/* model_create is the dense/activation sequence of its config; the identity activation
 * changes nothing. */
static void test_config_is_sequence(void **state)
{
    enum { B = 8, IN = 7 };
    uint64_t s = 3;
    float x[B * IN];
    int32_t y[B];
    fill(x, B * IN, 0, 1, &s);
    for (int i = 0; i < B; i++)
        y[i] = (int32_t)(data_rng_next(&s) % 3);
    char err[256];
    const backend_act acts[] = {BACKEND_ACT_RELU, BACKEND_ACT_TANH};
    for (size_t t = 0; t < 2; t++) {
        model_config cfg;
        memset(&cfg, 0, sizeof(cfg));
        assert_int_equal(model_parse_layers("7,6,5,3", &cfg, err, sizeof(err)), 0);
        cfg.act = acts[t];
        cfg.l2 = 0.03f;
        const char *act = model_activation_name(acts[t]);
        const layer_spec specs[] = {
            {.type = "dense", .units = 6, .l2 = 0.03f}, {.type = act},
            {.type = "dense", .units = 5, .l2 = 0.03f}, {.type = act},
            {.type = "dense", .units = 3, .l2 = 0.03f},
        };
        model *a = NULL, *b = NULL;
        assert_int_equal(model_create(be, &cfg, B, "mlp", &a, err, sizeof(err)), 0);
        assert_int_equal(model_create_layers(be, IN, specs, 5, B, NULL, &b, err, sizeof(err)), 0);
        model_init_glorot(a, 9);
        assert_same_step(a, b, x, y, B);
        model_destroy(a);
        model_destroy(b);
    }
    const layer_spec plain[] = {{.type = "dense", .units = 5}, {.type = "dense", .units = 3}};
    const layer_spec with_id[] = {{.type = "identity"},
                                  {.type = "dense", .units = 5},
                                  {.type = "identity"},
                                  {.type = "identity"},
                                  {.type = "dense", .units = 3}};
    model *a = NULL, *b = NULL;
    assert_int_equal(model_create_layers(be, IN, plain, 2, B, "id", &a, err, sizeof(err)), 0);
    assert_int_equal(model_create_layers(be, IN, with_id, 5, B, "id", &b, err, sizeof(err)), 0);
    model_init_glorot(a, 4);
    assert_same_step(a, b, x, y, B);
    model_destroy(a);
    model_destroy(b);
}

/* on_grad for test_double_buffer: records the order in which gradients are handed out. */
static int record_grad(model *m, int i, void *arg)
{
    (void)m;
    int *order = arg;
    order[order[0]++ + 1] = i;
    return 0;
}

/* The back buffers of a prefetch (model_double_buffer): parameters written into host_back and
 * swapped in compute as parameters written into host; gradients written after model_grads_swap
 * leave the previous ones (a push in flight reads them) untouched. */
static void test_double_buffer(void **state)
{
    enum { B = 8, IN = 7 };
    uint64_t s = 5;
    float x[B * IN];
    int32_t y[B];
    fill(x, B * IN, 0, 1, &s);
    for (int i = 0; i < B; i++)
        y[i] = (int32_t)(data_rng_next(&s) % 3);
    char err[256];
    model_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    assert_int_equal(model_parse_layers("7,6,5,3", &cfg, err, sizeof(err)), 0);
    cfg.act = BACKEND_ACT_RELU;
    model *a = NULL, *b = NULL;
    assert_int_equal(model_create(be, &cfg, B, "mlp", &a, err, sizeof(err)), 0);
    assert_int_equal(model_create(be, &cfg, B, "mlp", &b, err, sizeof(err)), 0);
    model_init_glorot(a, 11);
    assert_int_equal(model_double_buffer(b), 0);
    assert_int_equal(model_double_buffer(b), 0); /* idempotent */
    int n = model_num_params(b);
    for (int i = 0; i < n; i++) {
        model_param *pa = model_get_param(a, i), *pb = model_get_param(b, i);
        assert_non_null(pb->host_back);
        assert_non_null(pb->grad_host_back);
        assert_ptr_not_equal(pb->host_back, pb->host);
        memcpy(pb->host_back, pa->host, pa->numel * sizeof(float));
        for (size_t j = 0; j < pb->numel; j++)
            pb->host[j] = 7.0f; /* not the parameters: must not be used after the swap */
    }
    model_params_swap(b);
    model_stats sa, sb;
    int order[1 + 2 * MODEL_MAX_LAYERS] = {0};
    assert_int_equal(model_upload_params(a), 0);
    assert_int_equal(model_set_batch(a, x, y, B), 0);
    assert_int_equal(model_train_step(a, NULL, NULL, &sa), 0);
    assert_int_equal(model_upload_params(b), 0);
    assert_int_equal(model_set_batch(b, x, y, B), 0);
    assert_int_equal(model_train_step(b, record_grad, order, &sb), 0);
    assert_memory_equal(&sa.loss, &sb.loss, sizeof(double));
    /* every gradient handed out once, last layer first */
    assert_int_equal(order[0], n);
    for (int k = 0; k < n; k++)
        assert_int_equal(order[k + 1], n - 1 - k);
    float *before[2 * MODEL_MAX_LAYERS], *copy[2 * MODEL_MAX_LAYERS];
    for (int i = 0; i < n; i++) {
        model_param *pa = model_get_param(a, i), *pb = model_get_param(b, i);
        assert_memory_equal(pa->grad_host, pb->grad_host, pa->numel * sizeof(float));
        before[i] = pb->grad_host;
        copy[i] = malloc(pb->numel * sizeof(float));
        assert_non_null(copy[i]);
        memcpy(copy[i], pb->grad_host, pb->numel * sizeof(float));
    }
    /* Another batch into the other gradient buffers: the first ones keep their values. */
    model_grads_swap(b);
    fill(x, B * IN, 0, 1, &s);
    assert_int_equal(model_set_batch(b, x, y, B), 0);
    assert_int_equal(model_train_step(b, NULL, NULL, &sb), 0);
    for (int i = 0; i < n; i++) {
        model_param *pb = model_get_param(b, i);
        assert_ptr_equal(pb->grad_host_back, before[i]);
        assert_ptr_not_equal(pb->grad_host, before[i]);
        assert_memory_equal(before[i], copy[i], pb->numel * sizeof(float));
        free(copy[i]);
    }
    assert_memory_not_equal(model_get_param(b, 0)->grad_host, before[0],
                            model_get_param(b, 0)->numel * sizeof(float));
    model_destroy(a);
    model_destroy(b);
}

static void test_bad_sequences(void **state)
{
    char err[256] = "";
    model *m = (model *)1;
    const layer_spec unknown[] = {{.type = "dense", .units = 4}, {.type = "softsign"}};
    assert_int_equal(model_create_layers(be, 3, unknown, 2, 4, NULL, &m, err, sizeof(err)), -1);
    assert_null(m);
    assert_non_null(strstr(err, "layer 2"));
    assert_non_null(strstr(err, "softsign"));
    const layer_spec wide[] = {{.type = "dense", .units = MODEL_MAX_WIDTH + 1}};
    assert_int_equal(model_create_layers(be, 3, wide, 1, 4, NULL, &m, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "width"));
    assert_int_equal(model_create_layers(be, 3, unknown, 0, 4, NULL, &m, err, sizeof(err)), -1);
    assert_int_equal(model_create_layers(be, 0, unknown, 1, 4, NULL, &m, err, sizeof(err)), -1);
    assert_int_equal(model_create_layers(be, 3, unknown, 1, 0, NULL, &m, err, sizeof(err)), -1);
    layer_spec many[MODEL_MAX_SEQ + 1];
    for (int k = 0; k <= MODEL_MAX_SEQ; k++)
        many[k] = (layer_spec){.type = "dense", .units = 2};
    assert_int_equal(
        model_create_layers(be, 3, many, MODEL_MAX_SEQ + 1, 4, NULL, &m, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "layers"));
    /* MODEL_MAX_SEQ dense layers have more parameter tensors than a model holds. */
    assert_int_equal(model_create_layers(be, 3, many, MODEL_MAX_SEQ, 4, NULL, &m, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "parameter tensors"));
    assert_null(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_dense_ops),
        cmocka_unit_test(test_activation_ops),
        cmocka_unit_test(test_model_through_table),
        cmocka_unit_test(test_config_is_sequence),
        cmocka_unit_test(test_bad_sequences),
        cmocka_unit_test(test_double_buffer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
