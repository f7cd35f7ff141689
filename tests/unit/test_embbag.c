/* The embedding-bag layer of worker/layer_embedding.c on the CPU backend: forward and backward
 * against a naive double-precision reference (sum and mean, padding, duplicate rows), a gradient
 * check of a model's loss with respect to the rows through model_train_step, the batch id
 * mapping, the layer's place in a model, and the sparse example reader (data_sparse.c). */
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
#include "data.h"
#include "layer.h"
#include "model.h"

static backend *be;
static uint64_t rng = 12345;

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

static float rnd(void)
{
    return (float)((double)(data_rng_next(&rng) >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static backend_buf *upload(const float *host, size_t n)
{
    backend_buf *b = NULL;
    assert_int_equal(backend_buf_alloc(be, (n ? n : 1) * sizeof(float), &b), 0);
    if (host != NULL)
        assert_int_equal(backend_upload(be, b, 0, host, n * sizeof(float)), 0);
    return b;
}

static void download(backend_buf *b, float *host, size_t n)
{
    assert_int_equal(backend_download(be, b, 0, host, n * sizeof(float)), 0);
    assert_int_equal(backend_sync(be), 0);
}

/* backend_embbag_forward/backward against loops in double. */
static void check_ops(bool mean)
{
    enum { M = 23, S = 9, R = 11, D = 5 };
    float idx[M * S], rows[R * D], dy[M * D], y[M * D], drows[R * D];
    for (int i = 0; i < M * S; i++) {
        uint64_t u = data_rng_next(&rng) % 16;
        idx[i] = u < (uint64_t)R ? (float)u : -1.0f; /* ~30% padding, rows repeated */
    }
    for (int j = 0; j < S; j++)
        idx[3 * S + j] = -1.0f;             /* an example without rows */
    idx[4 * S + 0] = idx[4 * S + 1] = 2.0f; /* one row twice in an example */
    idx[6 * S + 2] = (float)R;              /* past the rows: padding */
    for (int i = 0; i < R * D; i++)
        rows[i] = rnd();
    for (int i = 0; i < M * D; i++)
        dy[i] = rnd();
    backend_buf *bi = upload(idx, M * S), *br = upload(rows, R * D), *bdy = upload(dy, M * D);
    backend_buf *by = upload(NULL, M * D), *bdr = upload(NULL, R * D);
    assert_int_equal(backend_embbag_forward(be, bi, br, M, S, R, D, mean, by), 0);
    assert_int_equal(backend_embbag_backward(be, bi, bdy, M, S, R, D, mean, bdr), 0);
    download(by, y, M * D);
    download(bdr, drows, R * D);
    double ref_y[M * D], ref_dr[R * D];
    memset(ref_dr, 0, sizeof(ref_dr));
    for (int i = 0; i < M; i++) {
        int count = 0;
        for (int j = 0; j < S; j++)
            count += idx[i * S + j] >= 0 && idx[i * S + j] < R;
        for (int k = 0; k < D; k++) {
            double acc = 0.0;
            for (int j = 0; j < S; j++) {
                float v = idx[i * S + j];
                if (v >= 0 && v < R) {
                    acc += rows[(int)v * D + k];
                    ref_dr[(int)v * D + k] += (mean ? 1.0 / count : 1.0) * dy[i * D + k];
                }
            }
            ref_y[i * D + k] = mean && count > 0 ? acc / count : acc;
        }
    }
    for (int i = 0; i < M * D; i++)
        if (fabs(y[i] - ref_y[i]) > 1e-5)
            fail_msg("forward mean=%d: y[%d] = %g, reference %g", mean, i, y[i], ref_y[i]);
    for (int k = 0; k < D; k++)
        assert_true(y[3 * D + k] == 0.0f);
    for (int i = 0; i < R * D; i++)
        if (fabs(drows[i] - ref_dr[i]) > 1e-5)
            fail_msg("backward mean=%d: drows[%d] = %g, reference %g", mean, i, drows[i],
                     ref_dr[i]);
    /* Bad shapes are refused, and nothing is written. */
    assert_int_equal(backend_embbag_forward(be, bi, br, M + 1, S, R, D, mean, by), BACKEND_EINVAL);
    assert_int_equal(backend_embbag_backward(be, bi, bdy, M, S, R + 1, D, mean, bdr),
                     BACKEND_EINVAL);
    assert_int_equal(backend_embbag_forward(be, bi, br, M, S, R, D, mean, bi), BACKEND_EINVAL);
    backend_buf_free(be, bi);
    backend_buf_free(be, br);
    backend_buf_free(be, bdy);
    backend_buf_free(be, by);
    backend_buf_free(be, bdr);
}

static void test_ops_sum(void **state)
{
    check_ops(false);
}

static void test_ops_mean(void **state)
{
    check_ops(true);
}

/* embbag -> dense -> softmax cross-entropy: the rows' gradients from model_train_step against
 * central differences of the model's own loss. */
static void gradcheck(const char *type)
{
    enum { B = 6, S = 4, D = 3, C = 4, R = 5 };
    layer_spec specs[] = {{.type = type, .units = D}, {.type = "dense", .units = C}};
    model *m = NULL;
    char err[256];
    if (model_create_layers(be, S, specs, 2, B, "g", &m, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    layer *bag = model_get_layer(m, 0);
    assert_true(layer_is_embbag(bag));
    assert_int_equal(model_num_params(m), 2); /* the dense layer's only: rows are a table's */
    model_init_glorot(m, 7);
    for (int i = 0; i < model_num_params(m); i++) {
        model_param *p = model_get_param(m, i);
        for (size_t j = 0; j < p->numel; j++)
            p->host[j] = rnd();
    }
    assert_int_equal(model_upload_params(m), 0);
    float x[B * S] = {0, 1,  -1, -1, 1, 2, 3, -1, 4, 4,  0, -1,
                      2, -1, -1, -1, 3, 0, 1, 2,  4, -1, 1, -1};
    int32_t y[B] = {0, 1, 2, 3, 1, 0};
    float rows[R * D], grads[R * D];
    for (int i = 0; i < R * D; i++)
        rows[i] = rnd();
    assert_int_equal(layer_embbag_set_rows(bag, rows, R), 0);
    assert_int_equal(model_set_batch(m, x, y, B), 0);
    model_stats st;
    assert_int_equal(model_train_step(m, NULL, NULL, &st), 0);
    assert_int_equal(layer_embbag_get_grads(bag, grads), 0);
    assert_int_equal(backend_sync(be), 0);
    const double h = 1e-2;
    double worst = 0.0;
    for (int i = 0; i < R * D; i++) {
        double l[2];
        for (int sgn = 0; sgn < 2; sgn++) {
            float saved = rows[i];
            rows[i] = (float)(saved + (sgn ? h : -h));
            assert_int_equal(layer_embbag_set_rows(bag, rows, R), 0);
            model_stats s2;
            assert_int_equal(model_forward(m, &s2), 0);
            l[sgn] = s2.loss;
            rows[i] = saved;
        }
        double num = (l[1] - l[0]) / (2 * h);
        double e = fabs(num - grads[i]) / fmax(1e-2, fabs(num) + fabs(grads[i]));
        if (e > worst)
            worst = e;
    }
    if (worst > 2e-2)
        fail_msg("%s: rows' gradients differ from finite differences (relative %g)", type, worst);
    model_destroy(m);
}

static void test_gradcheck_sum(void **state)
{
    gradcheck("embbag");
}

static void test_gradcheck_mean(void **state)
{
    gradcheck("embbag_mean");
}

static void test_map_batch(void **state)
{
    embbag_ids b;
    assert_int_equal(embbag_ids_init(&b, 8), 0);
    int64_t ids[8] = {70000, 5, -1, 70000, INT64_MAX, 5, -3, 0};
    float x[8];
    assert_int_equal(embbag_map_batch(&b, ids, 8, x), 0);
    assert_int_equal(b.n, 4);
    int64_t want_ids[] = {70000, 5, INT64_MAX, 0};
    for (int i = 0; i < 4; i++)
        assert_true(b.ids[i] == want_ids[i]);
    float want_x[8] = {0, 1, -1, 0, 2, 1, -1, 3};
    for (int i = 0; i < 8; i++)
        assert_true(x[i] == want_x[i]);
    /* Mapped again, another batch starts from nothing; ids past float32's exact range stay
     * distinct (100000000 and 100000001 are the same float). */
    int64_t ids2[3] = {100000000, 100000001, 5};
    assert_int_equal(embbag_map_batch(&b, ids2, 3, x), 0);
    assert_int_equal(b.n, 3);
    assert_true(x[0] == 0.0f && x[1] == 1.0f && x[2] == 2.0f);
    assert_true(b.ids[1] == 100000001);
    int64_t many[9] = {0};
    assert_int_equal(embbag_map_batch(&b, many, 9, x), -1);
    embbag_ids_fini(&b);
    assert_int_equal(embbag_ids_init(&b, (size_t)LAYER_EMBBAG_MAX_ROWS + 1), -1);
}

static void test_only_first(void **state)
{
    layer_spec specs[] = {{.type = "dense", .units = 3}, {.type = "embbag", .units = 2}};
    model *m = NULL;
    char err[256];
    assert_int_equal(model_create_layers(be, 4, specs, 2, 8, "f", &m, err, sizeof(err)), -1);
    assert_null(m);
    assert_non_null(strstr(err, "must come first"));
    layer_spec zero[] = {{.type = "embbag_mean", .units = 0}};
    assert_int_equal(model_create_layers(be, 4, zero, 1, 8, "f", &m, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "row dimension"));
}

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/test_embbag_%ld.txt", (long)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void expect_load_error(const char *text, size_t max_ids, const char *needle)
{
    dataset d;
    char err[512];
    char *path = write_tmp(text);
    assert_int_equal(data_load_sparse(path, max_ids, &d, err, sizeof(err)), -1);
    unlink(path);
    if (strstr(err, needle) == NULL)
        fail_msg("error '%s' does not say '%s'", err, needle);
    assert_null(d.ids);
}

static void test_sparse_reader(void **state)
{
    dataset d;
    char err[512];
    char *path = write_tmp("# comment\n3 10 20 30\n\n0\n1 9223372036854775807\r\n");
    assert_int_equal(data_load_sparse(path, 8, &d, err, sizeof(err)), 0);
    unlink(path);
    assert_int_equal(d.n, 3);
    assert_int_equal(d.dim, 3);
    assert_int_equal(d.num_classes, 4);
    assert_null(d.x);
    int64_t want[9] = {10, 20, 30, -1, -1, -1, INT64_MAX, -1, -1};
    for (int i = 0; i < 9; i++)
        assert_true(d.ids[i] == want[i]);
    assert_int_equal(d.y[0], 3);
    assert_int_equal(d.y[1], 0);
    assert_int_equal(d.y[2], 1);
    /* A dense model cannot evaluate it: no features (an error, not a NULL read). */
    model_config cfg = {.num_sizes = 2, .sizes = {3, 4}, .act = BACKEND_ACT_RELU};
    model *m = NULL;
    assert_int_equal(model_create(be, &cfg, 4, "s", &m, err, sizeof(err)), 0);
    double loss, acc;
    assert_int_equal(model_evaluate(m, &d, &loss, &acc), -1);
    assert_non_null(strstr(model_errmsg(m), "sparse"));
    model_destroy(m);
    dataset_free(&d);
    expect_load_error("1 2 x\n", 8, ":1: 'x' is not an integer id");
    expect_load_error("1 2\n1 -4\n", 8, ":2: id -4 is negative");
    expect_load_error("1 9223372036854775808\n", 8, "'9223372036854775808' is not an integer id");
    expect_load_error("-1 2\n", 8, ":1: the label");
    expect_load_error("1 2 3 4\n", 2, "3 ids, more than the 2");
    expect_load_error("# nothing\n", 2, "no examples");
    assert_int_equal(data_load_sparse("/nonexistent/x.txt", 8, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "/nonexistent/x.txt: cannot open"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ops_sum),       cmocka_unit_test(test_ops_mean),
        cmocka_unit_test(test_gradcheck_sum), cmocka_unit_test(test_gradcheck_mean),
        cmocka_unit_test(test_map_batch),     cmocka_unit_test(test_only_first),
        cmocka_unit_test(test_sparse_reader),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
