/* Example user program of libpsclient: connects to the cluster in TF_CONFIG (or PS_CLUSTER),
 * creates a small and a large variable, pushes a gradient, pulls the result and prints a
 * summary. Build it against the installed library with:
 *     cc example.c $(pkg-config --cflags --libs psclient) -o example
 * Exit code 0 when every value is what SGD makes of it. */
#include <psclient.h>
#include <stdio.h>
#include <stdlib.h>

static int check(int rc, const char *what)
{
    if (rc != PS_OK)
        fprintf(stderr, "%s: %s: %s\n", what, ps_strerror(rc), ps_last_error());
    return rc;
}

int main(void)
{
    ps_client *c;
    if (check(ps_client_open(&c, NULL), "connect") != PS_OK)
        return 1;
    printf("connected to %d server(s), libpsclient %s\n", ps_client_num_servers(c), ps_version());

    ps_var_spec spec;
    ps_var_spec_init(&spec, "example/bias");
    spec.ndims = 1;
    spec.dims[0] = 10;
    spec.initializer = PS_INIT_CONSTANT;
    spec.init_a = 1.0;
    spec.learning_rate = 0.5;
    ps_var *bias, *weights;
    if (check(ps_var_create(c, &spec, &bias), "create example/bias") != PS_OK)
        return 1;

    ps_var_spec_init(&spec, "example/weights");
    spec.ndims = 2;
    spec.dims[0] = 1024;
    spec.dims[1] = 512;
    spec.initializer = PS_INIT_GLOROT_UNIFORM;
    spec.seed = 42;
    if (check(ps_var_create(c, &spec, &weights), "create example/weights") != PS_OK)
        return 1;

    float grad[10], out[10];
    for (int i = 0; i < 10; i++)
        grad[i] = (float)i;
    if (check(ps_push_pull(c, bias, grad, out), "push-pull example/bias") != PS_OK)
        return 1;
    int bad = 0;
    /* Another run of this example may have pushed before: each push moves by -0.5 * i. */
    for (int i = 1; i < 10; i++)
        if (out[i] >= 1.0f)
            bad++;

    size_t n = (size_t)ps_var_numel(weights);
    float *w = malloc(n * sizeof(float));
    if (w == NULL || check(ps_pull(c, weights, w), "pull example/weights") != PS_OK)
        return 1;
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += w[i];
    printf("example/weights: %zu elements over %d shard(s), mean %.6f\n", n,
           ps_var_num_shards(weights), sum / (double)n);
    printf("example/bias after push-pull: [%g %g ... %g]\n", out[0], out[1], out[9]);

    char **names;
    size_t count;
    if (check(ps_var_list(c, &names, &count), "list") == PS_OK) {
        printf("%zu variable(s) in the cluster\n", count);
        ps_names_free(names, count);
    }
    free(w);
    ps_client_close(c);
    return bad ? 1 : 0;
}
