/* Test helper of test_psctl.sh: creates VAR (2x3, zeros, SGD with learning rate 0.5,
 * asynchronous) on the cluster of TF_CONFIG and pushes the gradient 1..6 twice, leaving
 * VAR = -(1..6). Exit 0 on success. */
#include <stdio.h>

#include "psclient.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s VAR\n", argv[0]);
        return 2;
    }
    ps_client *c = NULL;
    int rc = ps_client_open(&c, NULL);
    if (rc != PS_OK) {
        fprintf(stderr, "open: %s: %s\n", ps_strerror(rc), ps_last_error());
        return 1;
    }
    ps_var_spec s;
    ps_var_spec_init(&s, argv[1]);
    s.ndims = 2;
    s.dims[0] = 2;
    s.dims[1] = 3;
    s.learning_rate = 0.5;
    s.staleness = PS_STALENESS_ASYNC;
    ps_var *v = NULL;
    const float g[6] = {1, 2, 3, 4, 5, 6};
    rc = ps_var_create(c, &s, &v);
    for (int i = 0; i < 2 && rc == PS_OK; i++)
        rc = ps_push(c, v, g);
    if (rc != PS_OK)
        fprintf(stderr, "create/push %s: %s: %s\n", argv[1], ps_strerror(rc), ps_last_error());
    ps_client_close(c);
    return rc == PS_OK ? 0 : 1;
}
