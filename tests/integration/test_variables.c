/* Integration: variable specs over the wire against a real ps-server. Every optimizer of the
 * registry is created by name and updated; AdamW's values match a naive loop; a spec in the
 * first (shorter) layout of ps_var_spec gets the defaults of the fields appended since; a
 * spec that differs in an appended field is ALREADY_EXISTS naming that field. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cluster_proc.h"
#include "psclient.h"

static const char *server_bin;
static test_cluster tc;
static ps_client *client;

static int setup(void **state)
{
    (void)state;
    if (test_cluster_start(&tc, server_bin, 1, NULL) != 0)
        return -1;
    char tf[1200];
    test_cluster_tf_config(&tc, NULL, 0, tf, sizeof(tf));
    ps_config *cfg;
    if (ps_config_create(&cfg) != PS_OK)
        return -1;
    int rc = ps_config_set(cfg, "cluster", tf);
    if (rc == PS_OK)
        rc = ps_client_open(&client, cfg);
    ps_config_destroy(cfg);
    return rc == PS_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    ps_client_close(client);
    return test_cluster_stop(&tc);
}

#define N 5

static void vec_spec(ps_var_spec *s, const char *name)
{
    ps_var_spec_init(s, name);
    s->ndims = 1;
    s->dims[0] = N;
    s->initializer = PS_INIT_CONSTANT;
    s->init_a = 1.0;
    s->staleness = PS_STALENESS_ASYNC;
}

/* One step of AdamW from w0 = 1 with gradient g, in double (the definition). */
static double adamw_one_step(double lr, double wd, double b1, double b2, double eps, double g)
{
    double w = 1.0 * (1.0 - lr * wd);
    double m = (1.0 - b1) * g, v = (1.0 - b2) * g * g;
    return w - lr * (m / (1.0 - b1)) / (sqrt(v / (1.0 - b2)) + eps);
}

/* Every optimizer name the library knows creates a variable the server updates. */
static void test_every_optimizer_by_name(void **state)
{
    (void)state;
    int seen = 0;
    for (int k = 0; k < 64; k++) {
        const char *name = ps_optimizer_name(k);
        if (strcmp(name, "unknown") == 0)
            continue;
        seen++;
        ps_optimizer opt;
        assert_int_equal(ps_optimizer_parse(name, &opt), PS_OK);
        assert_int_equal((int)opt, k);
        char vname[64];
        snprintf(vname, sizeof(vname), "opt/%s", name);
        ps_var_spec s;
        vec_spec(&s, vname);
        s.optimizer = opt;
        ps_var *v;
        if (ps_var_create(client, &s, &v) != PS_OK)
            fail_msg("create %s: %s", vname, ps_last_error());
        float g[N] = {1, -1, 2, -2, 0.5f}, w[N];
        assert_int_equal(ps_push(client, v, g), PS_OK);
        assert_int_equal(ps_pull(client, v, w), PS_OK);
        for (int i = 0; i < N; i++) {
            if (!(w[i] != 1.0f && isfinite(w[i])))
                fail_msg("%s: w[%d] = %g after one push", name, i, (double)w[i]);
            /* every rule moves a weight against its gradient's sign */
            assert_true((w[i] < 1.0f) == (g[i] > 0));
        }
    }
    assert_true(seen >= 5); /* sgd, momentum, adagrad, adam, adamw */
    ps_optimizer opt = PS_OPT_SGD;
    assert_int_equal(ps_optimizer_parse("AdamW", &opt), PS_OK);
    assert_int_equal(opt, PS_OPT_ADAMW);
    opt = PS_OPT_MOMENTUM;
    assert_int_equal(ps_optimizer_parse("lamb", &opt), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "adamw")); /* the message lists the names */
    assert_int_equal(opt, PS_OPT_MOMENTUM);
}

static void test_adamw_values(void **state)
{
    (void)state;
    ps_var_spec s;
    vec_spec(&s, "opt/adamw-values");
    s.optimizer = PS_OPT_ADAMW;
    s.learning_rate = 0.1;
    s.weight_decay = 0.5;
    s.beta1 = 0.5;
    s.beta2 = 0.75;
    s.epsilon = 1e-3;
    ps_var *v;
    assert_int_equal(ps_var_create(client, &s, &v), PS_OK);
    float g[N] = {1, -3, 0.5f, 0, 2}, w[N];
    assert_int_equal(ps_push_pull(client, v, g, w), PS_OK);
    for (int i = 0; i < N; i++) {
        double want = adamw_one_step(0.1, 0.5, 0.5, 0.75, 1e-3, g[i]);
        if (!(fabs(w[i] - want) <= 1e-6))
            fail_msg("w[%d] = %.9g, want %.9g", i, (double)w[i], want);
    }
    /* bad hyper-parameters are refused by the server, naming the field */
    vec_spec(&s, "opt/adamw-bad");
    s.optimizer = PS_OPT_ADAMW;
    s.weight_decay = -1;
    assert_int_equal(ps_var_create(client, &s, &v), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "weight_decay"));
}

/* A program built against the first layout of ps_var_spec (no weight_decay) gets the default
 * weight decay; a spec not made by ps_var_spec_init is refused. */
static void test_versioned_spec(void **state)
{
    (void)state;
    size_t v1 = offsetof(ps_var_spec, staleness) + sizeof(int);
    ps_var_spec s;
    memset(&s, 0x5a, sizeof(s)); /* what lies beyond an old struct: garbage */
    ps_var_spec_init_sized(&s, v1, "opt/old-layout");
    assert_int_equal(s.struct_size, v1);
    const unsigned char *tail = (const unsigned char *)&s + v1;
    for (size_t i = 0; i < sizeof(s) - v1; i++)
        assert_int_equal(tail[i], 0x5a); /* init wrote only the caller's bytes */
    s.ndims = 1;
    s.dims[0] = N;
    s.initializer = PS_INIT_CONSTANT;
    s.init_a = 1.0;
    s.optimizer = PS_OPT_ADAMW;
    s.learning_rate = 0.1;
    s.staleness = PS_STALENESS_ASYNC;
    ps_var *v;
    assert_int_equal(ps_var_create(client, &s, &v), PS_OK);
    float g[N] = {1, 1, 1, 1, 1}, w[N];
    assert_int_equal(ps_push_pull(client, v, g, w), PS_OK);
    double want = adamw_one_step(0.1, 0.01 /* default */, 0.9, 0.999, 1e-8, 1.0);
    assert_true(fabs(w[0] - want) <= 1e-6);

    /* the same variable in the current layout with the default decay is the same spec */
    ps_var_spec cur;
    vec_spec(&cur, "opt/old-layout");
    cur.optimizer = PS_OPT_ADAMW;
    cur.learning_rate = 0.1;
    ps_var *v2;
    assert_int_equal(ps_var_create(client, &cur, &v2), PS_OK);
    assert_ptr_equal(v, v2);
    /* another decay is another spec: the message names the appended field */
    cur.weight_decay = 0.02;
    assert_int_equal(ps_var_create(client, &cur, &v2), PS_ALREADY_EXISTS);
    assert_non_null(strstr(ps_last_error(), "weight_decay"));

    ps_var_spec bad;
    vec_spec(&bad, "opt/uninitialised");
    bad.struct_size = 0;
    assert_int_equal(ps_var_create(client, &bad, &v), PS_INVALID_ARGUMENT);
    assert_non_null(strstr(ps_last_error(), "ps_var_spec_init"));
    ps_var_spec_init_sized(&bad, 8, "x"); /* too small to be a spec: ignored */
    assert_int_equal(bad.struct_size, 0);
}

/* A finite gradient that would overflow an element is refused, FAILED_PRECONDITION naming the
 * variable and the element: it keeps its value, the push's other elements are applied (a
 * push-pull answers the same error). */
static void test_overflow_refused(void **state)
{
    (void)state;
    ps_var_spec s;
    vec_spec(&s, "v/over");
    s.learning_rate = 1.0;
    ps_var *v;
    assert_int_equal(ps_var_create(client, &s, &v), PS_OK);
    float g[N] = {0, 0, -3e38f, 1, 1}, got[N];
    assert_int_equal(ps_push(client, v, g), PS_OK); /* element 2 at 3e38 */
    assert_int_equal(ps_push(client, v, g), PS_FAILED_PRECONDITION);
    const char *msg = ps_last_error();
    if (strstr(msg, "v/over") == NULL || strstr(msg, "element 2") == NULL)
        fail_msg("message: %s", msg);
    assert_int_equal(ps_pull(client, v, got), PS_OK);
    const float want[N] = {1, 1, 3e38f, -1, -1};
    assert_memory_equal(got, want, sizeof(want));
    assert_int_equal(ps_push_pull(client, v, g, got), PS_FAILED_PRECONDITION);
    assert_int_equal(ps_pull(client, v, got), PS_OK);
    const float want2[N] = {1, 1, 3e38f, -2, -2};
    assert_memory_equal(got, want2, sizeof(want2));
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_optimizer_by_name),
        cmocka_unit_test(test_adamw_values),
        cmocka_unit_test(test_versioned_spec),
        cmocka_unit_test(test_overflow_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
