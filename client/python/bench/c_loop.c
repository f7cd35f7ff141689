/* The C side of bench_push_pull.py: times ps_push or ps_pull of one existing variable in a
 * loop, the same calls the Python client makes, and prints "<calls> <seconds>".
 * Usage: c_loop CLUSTER_JSON VARIABLE push|pull SECONDS */
#include <psclient.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s CLUSTER_JSON VARIABLE push|pull SECONDS\n", argv[0]);
        return 2;
    }
    int push = strcmp(argv[3], "push") == 0;
    double seconds = atof(argv[4]);
    ps_config *cfg;
    ps_client *c;
    ps_var *v;
    int rc = ps_config_create(&cfg);
    if (rc == PS_OK)
        rc = ps_config_set(cfg, "cluster", argv[1]);
    if (rc == PS_OK)
        rc = ps_client_open(&c, cfg);
    if (rc == PS_OK)
        rc = ps_var_lookup(c, argv[2], &v);
    if (rc != PS_OK) {
        fprintf(stderr, "c_loop: %s: %s\n", ps_strerror(rc), ps_last_error());
        return 1;
    }
    size_t n = (size_t)ps_var_numel(v);
    float *buf = calloc(n ? n : 1, sizeof(float));
    if (buf == NULL)
        return 1;
    for (int i = 0; i < 3; i++) /* warm-up: connections up, pages touched */
        rc = push ? ps_push(c, v, buf) : ps_pull(c, v, buf);
    long calls = 0;
    double t0 = now(), t = t0;
    while (rc == PS_OK && t - t0 < seconds) {
        rc = push ? ps_push(c, v, buf) : ps_pull(c, v, buf);
        calls++;
        t = now();
    }
    if (rc != PS_OK) {
        fprintf(stderr, "c_loop: %s: %s\n", ps_strerror(rc), ps_last_error());
        return 1;
    }
    printf("%ld %.6f\n", calls, t - t0);
    free(buf);
    ps_client_close(c);
    ps_config_destroy(cfg);
    return 0;
}
