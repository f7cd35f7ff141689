/* Gradient check of worker/model.c on the CPU backend: analytic gradients against central
 * finite differences on a small network (relative error < 1e-3), plus local training and
 * model files (save, load, corrupt). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend.h"
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

static model *make_model(const char *layers, backend_act act, float l2, int batch)
{
    model_config cfg;
    memset(&cfg, 0, sizeof(cfg));
    char err[256];
    assert_int_equal(model_parse_layers(layers, &cfg, err, sizeof(err)), 0);
    cfg.act = act;
    cfg.l2 = l2;
    model *m = NULL;
    if (model_create(be, &cfg, batch, "t", &m, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    return m;
}

static double l2_term(model *m)
{
    double s = 0;
    for (int i = 0; i < model_num_params(m); i++) {
        model_param *p = model_get_param(m, i);
        if (p->is_kernel)
            for (size_t j = 0; j < p->numel; j++)
                s += (double)p->host[j] * p->host[j];
    }
    return 0.5 * model_get_config(m)->l2 * s;
}

/* Loss of the uploaded batch with the current host parameters, by the backend. */
static double loss_now(model *m)
{
    assert_int_equal(model_upload_params(m), 0);
    model_stats st;
    assert_int_equal(model_forward(m, &st), 0);
    return st.loss + l2_term(m);
}

/* The same loss computed on the host in double precision from `params` (the model's layout,
 * with parameter `pi` element `pj` shifted by `delta`). Central differences of a float32
 * forward pass drown gradients of 1e-3 in rounding noise; in double they are exact to ~1e-8,
 * and test_gradcheck checks that this reference and the backend's forward agree. */
static double ref_loss(model *m, const float *x, const int32_t *y, int batch, int pi, size_t pj,
                       double delta)
{
    const model_config *cfg = model_get_config(m);
    int L = cfg->num_sizes - 1;
    double act[2][64 * 64];
    double total = 0.0, sq = 0.0;
    for (int b = 0; b < batch; b++) {
        int cur = 0;
        for (int j = 0; j < cfg->sizes[0]; j++)
            act[cur][j] = x[b * cfg->sizes[0] + j];
        for (int l = 1; l <= L; l++) {
            model_param *W = model_get_param(m, 2 * (l - 1));
            model_param *B = model_get_param(m, 2 * (l - 1) + 1);
            int in = cfg->sizes[l - 1], out = cfg->sizes[l];
            for (int o = 0; o < out; o++) {
                double z = B->host[o] + (pi == 2 * (l - 1) + 1 && (size_t)o == pj ? delta : 0);
                for (int i = 0; i < in; i++) {
                    double w = W->host[i * out + o];
                    if (pi == 2 * (l - 1) && pj == (size_t)(i * out + o))
                        w += delta;
                    z += act[cur][i] * w;
                }
                if (l < L)
                    z = cfg->act == BACKEND_ACT_RELU ? (z > 0 ? z : 0) : tanh(z);
                act[1 - cur][o] = z;
            }
            cur = 1 - cur;
        }
        int C = cfg->sizes[L];
        double mx = act[cur][0];
        for (int c = 1; c < C; c++)
            mx = fmax(mx, act[cur][c]);
        double se = 0;
        for (int c = 0; c < C; c++)
            se += exp(act[cur][c] - mx);
        total += -(act[cur][y[b]] - mx - log(se));
    }
    for (int i = 0; i < model_num_params(m); i++) {
        model_param *p = model_get_param(m, i);
        if (!p->is_kernel)
            continue;
        for (size_t j = 0; j < p->numel; j++) {
            double w = p->host[j] + (i == pi && j == pj ? delta : 0);
            sq += w * w;
        }
    }
    return total / batch + 0.5 * cfg->l2 * sq;
}

static void gradcheck(backend_act act, float l2)
{
    enum { B = 4, IN = 6, C = 3 };
    model *m = make_model("6,5,4,3", act, l2, B);
    model_init_glorot(m, 7);
    /* Biases non-zero so that their gradients are exercised in general position. */
    uint64_t s = 99;
    for (int i = 0; i < model_num_params(m); i++) {
        model_param *p = model_get_param(m, i);
        if (!p->is_kernel)
            for (size_t j = 0; j < p->numel; j++)
                p->host[j] =
                    (float)((double)(data_rng_next(&s) >> 11) / 9007199254740992.0 - 0.5) * 0.2f;
    }
    float x[B * IN];
    int32_t y[B] = {0, 2, 1, 2};
    for (int i = 0; i < B * IN; i++)
        x[i] = (float)((double)(data_rng_next(&s) >> 11) / 9007199254740992.0);
    assert_int_equal(model_set_batch(m, x, y, B), 0);
    assert_int_equal(model_upload_params(m), 0);
    model_stats st;
    assert_int_equal(model_train_step(m, NULL, NULL, &st), 0);
    /* The training loss includes the L2 term, and the reference agrees with the backend. */
    double base = loss_now(m);
    double ref = ref_loss(m, x, y, B, -1, 0, 0.0);
    assert_true(fabs(st.loss - base) < 1e-5 * (1 + base));
    assert_true(fabs(ref - base) < 1e-5 * (1 + base));

    const double eps = 1e-4;
    double worst = 0;
    int checked = 0;
    for (int i = 0; i < model_num_params(m); i++) {
        model_param *p = model_get_param(m, i);
        for (size_t j = 0; j < p->numel; j++) {
            double num =
                (ref_loss(m, x, y, B, i, j, eps) - ref_loss(m, x, y, B, i, j, -eps)) / (2 * eps);
            double ana = p->grad_host[j];
            double denom = fmax(fabs(num), fabs(ana));
            double err = fabs(num - ana);
            /* Relative error; gradients below 1e-5 (float noise) are held to 1e-8 absolute. */
            double rel = denom > 1e-5 ? err / denom : err / 1e-5;
            if (rel > worst)
                worst = rel;
            if (rel >= 1e-3)
                fail_msg("%s[%zu]: analytic %.8g, numeric %.8g (relative error %.3g)", p->name, j,
                         ana, num, rel);
            checked++;
        }
    }
    print_message("%s l2=%g: %d gradients, worst relative error %.2e\n", model_activation_name(act),
                  l2, checked, worst);
    assert_int_equal(checked, (int)model_total_params(m));
    model_destroy(m);
}

static void test_gradcheck_tanh(void **state)
{
    gradcheck(BACKEND_ACT_TANH, 0.0f);
}

static void test_gradcheck_tanh_l2(void **state)
{
    gradcheck(BACKEND_ACT_TANH, 0.05f);
}

static void test_gradcheck_relu_l2(void **state)
{
    gradcheck(BACKEND_ACT_RELU, 0.01f);
}

/* Gradients are delivered last layer first, each exactly once. */
static int record_order(model *m, int i, void *arg)
{
    int *order = arg;
    order[order[0] + 1] = i;
    order[0]++;
    return 0;
}

static int abort_at_second(model *m, int i, void *arg)
{
    int *calls = arg;
    return ++*calls == 2 ? 42 : 0;
}

static void test_grad_callbacks(void **state)
{
    model *m = make_model("4,3,3,2", BACKEND_ACT_RELU, 0, 2);
    model_init_glorot(m, 1);
    float x[8] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f};
    int32_t y[2] = {0, 1};
    assert_int_equal(model_upload_params(m), 0);
    assert_int_equal(model_set_batch(m, x, y, 2), 0);
    int order[16] = {0};
    assert_int_equal(model_train_step(m, record_order, order, NULL), 0);
    assert_int_equal(order[0], 6);
    int want[6] = {5, 4, 3, 2, 1, 0};
    for (int i = 0; i < 6; i++)
        assert_int_equal(order[i + 1], want[i]);
    int calls = 0;
    assert_int_equal(model_train_step(m, abort_at_second, &calls, NULL), 42);
    /* Bad batches are refused. */
    assert_int_equal(model_set_batch(m, x, y, 3), -1);
    assert_int_equal(model_set_batch(m, x, y, 0), -1);
    model_destroy(m);
}

/* Plain SGD on a separable synthetic problem: the loss must fall and accuracy rise. */
static void test_local_training(void **state)
{
    enum { N = 512, IN = 8, B = 32 };
    model *m = make_model("8,16,4", BACKEND_ACT_RELU, 1e-4f, B);
    model_init_glorot(m, 3);
    dataset d = {.n = N, .dim = IN, .num_classes = 4};
    d.x = malloc(N * IN * sizeof(float));
    d.y = malloc(N * sizeof(int32_t));
    uint64_t s = 5;
    for (int i = 0; i < N; i++) {
        int cls = i % 4;
        d.y[i] = cls;
        for (int j = 0; j < IN; j++)
            d.x[i * IN + j] =
                (float)((double)(data_rng_next(&s) >> 11) / 9007199254740992.0) * 0.5f +
                (j % 4 == cls ? 0.5f : 0.0f);
    }
    assert_int_equal(model_upload_params(m), 0);
    double loss0, acc0, loss1, acc1;
    assert_int_equal(model_evaluate(m, &d, &loss0, &acc0), 0);
    for (int epoch = 0; epoch < 30; epoch++)
        for (int b = 0; b < N / B; b++) {
            assert_int_equal(model_set_batch(m, d.x + b * B * IN, d.y + b * B, B), 0);
            assert_int_equal(model_train_step(m, NULL, NULL, NULL), 0);
            for (int i = 0; i < model_num_params(m); i++) {
                model_param *p = model_get_param(m, i);
                for (size_t j = 0; j < p->numel; j++)
                    p->host[j] -= 0.5f * p->grad_host[j];
            }
            assert_int_equal(model_upload_params(m), 0);
        }
    assert_int_equal(model_evaluate(m, &d, &loss1, &acc1), 0);
    print_message("local training: loss %.3f -> %.3f, accuracy %.3f -> %.3f\n", loss0, loss1, acc0,
                  acc1);
    assert_true(loss1 < loss0 * 0.5);
    assert_true(acc1 > 0.95);
    free(d.x);
    free(d.y);
    model_destroy(m);
}

static void test_parse_layers(void **state)
{
    model_config c;
    char err[256];
    assert_int_equal(model_parse_layers("784,256,128,10", &c, err, sizeof(err)), 0);
    assert_int_equal(c.num_sizes, 4);
    assert_int_equal(c.sizes[1], 256);
    char buf[64];
    model_format_layers(&c, buf, sizeof(buf));
    assert_string_equal(buf, "784,256,128,10");
    const char *bad[] = {"",         "10",         "784,,10",
                         "784,0,10", "a,b",        "784,10,",
                         "-3,4",     "1,99999999", "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        if (model_parse_layers(bad[i], &c, err, sizeof(err)) != -1)
            fail_msg("'%s' accepted", bad[i]);
        assert_non_null(strstr(err, "layers"));
    }
    backend_act a;
    assert_int_equal(model_parse_activation("tanh", &a), 0);
    assert_int_equal(a, BACKEND_ACT_TANH);
    assert_int_equal(model_parse_activation("sigmoid", &a), -1);
}

static void test_model_file(void **state)
{
    char dir[] = "/tmp/ps-test-model-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256], bad[256];
    snprintf(path, sizeof(path), "%s/m.bin", dir);
    model *m = make_model("5,4,3", BACKEND_ACT_TANH, 0.01f, 4);
    model_init_glorot(m, 11);
    char err[512] = "";
    assert_int_equal(model_save(m, path, err, sizeof(err)), 0);
    model *r = NULL;
    if (model_load(be, path, 8, &r, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(model_get_config(r)->num_sizes, 3);
    assert_int_equal(model_get_config(r)->act, BACKEND_ACT_TANH);
    assert_int_equal(model_max_batch(r), 8);
    for (int i = 0; i < model_num_params(m); i++)
        assert_memory_equal(model_get_param(m, i)->host, model_get_param(r, i)->host,
                            model_get_param(m, i)->numel * sizeof(float));
    model_destroy(r);

    /* Corrupt copies: flipped byte, truncated, bad magic, missing. */
    FILE *f = fopen(path, "rb");
    uint8_t buf[4096];
    size_t len = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    struct {
        const char *name;
        size_t len;
        int flip;
        const char *needle;
    } cases[] = {
        {"flip", len, 40, "checksum"},
        {"cut", len - 9, -1, "checksum"},
        {"magic", len, 0, "not a ps-worker model"},
        {"tiny", 5, -1, "not a ps-worker model"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(bad, sizeof(bad), "%s/%s.bin", dir, cases[i].name);
        uint8_t copy[4096];
        memcpy(copy, buf, len);
        if (cases[i].flip >= 0)
            copy[cases[i].flip] ^= 0x40;
        f = fopen(bad, "wb");
        fwrite(copy, 1, cases[i].len, f);
        fclose(f);
        err[0] = '\0';
        assert_int_equal(model_load(be, bad, 8, &r, err, sizeof(err)), -1);
        assert_null(r);
        if (strstr(err, bad) == NULL || strstr(err, cases[i].needle) == NULL)
            fail_msg("%s: expected '%s' naming the file, got '%s'", cases[i].name, cases[i].needle,
                     err);
        unlink(bad);
    }
    snprintf(bad, sizeof(bad), "%s/none.bin", dir);
    assert_int_equal(model_load(be, bad, 8, &r, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "none.bin"));
    snprintf(bad, sizeof(bad), "%s/nodir/m.bin", dir);
    assert_int_equal(model_save(m, bad, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "nodir"));
    model_destroy(m);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradcheck_tanh),    cmocka_unit_test(test_gradcheck_tanh_l2),
        cmocka_unit_test(test_gradcheck_relu_l2), cmocka_unit_test(test_grad_callbacks),
        cmocka_unit_test(test_local_training),    cmocka_unit_test(test_parse_layers),
        cmocka_unit_test(test_model_file),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
