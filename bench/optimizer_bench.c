/* ps-optimizer-bench: the server's optimizer loop alone (optimizer_apply, as a push applies it),
 * one core, on a variable of N elements: the rate a server's CPU could apply gradients at if it
 * did nothing else (bench/RESULTS.md, "The server's share").
 *
 *   ps-optimizer-bench [--optimizer adam] [--elements 235146] [--seconds 2]
 *
 * Prints one line: optimizer, elements, microseconds per apply, nanoseconds per element and
 * gradient bytes applied per second (GB/s, 4 bytes per element), the best of 3 trials. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optimizer.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *name = "adam";
    long n = 235146; /* the main job's model: 784-256-128-10 */
    double seconds = 2.0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--optimizer") == 0 && i + 1 < argc)
            name = argv[++i];
        else if (strcmp(argv[i], "--elements") == 0 && i + 1 < argc)
            n = strtol(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc)
            seconds = strtod(argv[++i], NULL);
        else {
            fprintf(stderr, "usage: ps-optimizer-bench [--optimizer NAME] [--elements N] "
                            "[--seconds S]\n");
            return 2;
        }
    }
    optimizer_kind kind;
    if (optimizer_parse(name, &kind) != 0 || n < 1 || n > (1L << 30) || !(seconds > 0)) {
        fprintf(stderr, "ps-optimizer-bench: bad --optimizer, --elements or --seconds\n");
        return 2;
    }
    optimizer_params p;
    optimizer_params_default(&p, kind);
    size_t count = (size_t)n;
    float *params = calloc(count, sizeof(float)), *grad = malloc(count * sizeof(float));
    float *slots[OPTIMIZER_MAX_SLOTS] = {0};
    size_t nslots = optimizer_slot_count(kind);
    int ok = params != NULL && grad != NULL;
    for (size_t s = 0; s < nslots; s++)
        ok = ok && (slots[s] = calloc(count, sizeof(float))) != NULL;
    if (!ok) {
        fprintf(stderr, "ps-optimizer-bench: out of memory\n");
        return 1;
    }
    optimizer_init_slots(&p, slots, count);
    for (size_t i = 0; i < count; i++)
        grad[i] = (float)sin((double)i) * 1e-3f;
    double best = INFINITY;
    for (int trial = 0; trial < 3; trial++) {
        long applies = 0;
        double t0 = now_s(), t;
        do {
            optimizer_apply(&p, params, grad, slots, count);
            applies++;
            t = now_s();
        } while (t - t0 < seconds / 3.0);
        double per = (t - t0) / (double)applies;
        if (per < best)
            best = per;
    }
    printf("%s elements=%zu us_per_apply=%.1f ns_per_element=%.3f gradient_GB_per_s=%.2f\n", name,
           count, best * 1e6, best * 1e9 / (double)count, 4.0 * (double)count / best / 1e9);
    for (size_t s = 0; s < nslots; s++)
        free(slots[s]);
    free(params);
    free(grad);
    return 0;
}
