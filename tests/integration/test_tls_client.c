/* Helper of test_tls.sh: one libpsclient client with the given settings does one action and
 * prints "STATUS_NAME: message" (OK on success); the exit code is the ps_status.
 *
 *   test_tls_client ACTION NAME=VALUE...
 *   ACTION: pushpull (create or look up a variable of 1000 elements, pull, push 1.0 twice,
 *           pull: every element moved, and all alike),
 *           checkpoint, shutdown. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psclient.h"

static int report(int st)
{
    printf("%s: %s\n", ps_strerror(st), st == PS_OK ? "" : ps_last_error());
    fflush(stdout); /* before ps_client_close, which the test bounds */
    return st;
}

static int pushpull(ps_client *c)
{
    enum { N = 1000 };
    ps_var_spec spec;
    ps_var_spec_init(&spec, "tls_var");
    spec.ndims = 1;
    spec.dims[0] = N;
    ps_var *v;
    int st = ps_var_create(c, &spec, &v);
    if (st == PS_ALREADY_EXISTS)
        st = ps_var_lookup(c, "tls_var", &v);
    if (st != PS_OK)
        return st;
    static float g[N], before[N], after[N];
    for (int i = 0; i < N; i++)
        g[i] = 1.0f;
    if ((st = ps_pull(c, v, before)) != PS_OK)
        return st;
    for (int k = 0; k < 2; k++)
        if ((st = ps_push(c, v, g)) != PS_OK)
            return st;
    if ((st = ps_pull(c, v, after)) != PS_OK)
        return st;
    for (int i = 0; i < N; i++) {
        if (after[i] == before[i] || after[i] != after[0] || before[i] != before[0]) {
            fprintf(stderr, "element %d: %g before two pushes, %g after (element 0: %g, %g)\n", i,
                    before[i], after[i], before[0], after[0]);
            return PS_DATA_LOSS;
        }
    }
    return PS_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s pushpull|checkpoint|shutdown NAME=VALUE...\n", argv[0]);
        return 2;
    }
    ps_config *cfg;
    if (ps_config_create(&cfg) != PS_OK)
        return report(PS_RESOURCE_EXHAUSTED);
    /* The TLS engine under test (tests/meson.build runs the test once per engine). */
    const char *engine = getenv("PS_TLS_ENGINE");
    if (engine != NULL && engine[0] != '\0' && ps_config_set(cfg, "tls-engine", engine) != PS_OK)
        return report(PS_INVALID_ARGUMENT);
    for (int i = 2; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq == NULL) {
            fprintf(stderr, "%s: not NAME=VALUE\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        int st = ps_config_set(cfg, argv[i], eq + 1);
        if (st != PS_OK)
            return report(st);
    }
    ps_client *c;
    int st = ps_client_open(&c, cfg);
    ps_config_destroy(cfg);
    if (st != PS_OK)
        return report(st);
    if (strcmp(argv[1], "pushpull") == 0)
        st = pushpull(c);
    else if (strcmp(argv[1], "checkpoint") == 0)
        st = ps_checkpoint(c);
    else if (strcmp(argv[1], "shutdown") == 0)
        st = ps_shutdown_cluster(c);
    else {
        fprintf(stderr, "unknown action %s\n", argv[1]);
        st = PS_INVALID_ARGUMENT;
    }
    report(st);
    ps_client_close(c);
    return st;
}
