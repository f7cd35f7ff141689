/* ps-events-bench: the event-file writer alone (common/events.c): the time to add one record
 * of a worker's six training scalars, and one histogram of a 784x256 kernel, flushes
 * included, into a directory given on the command line (bench/RESULTS.md, "TensorBoard event
 * files").
 *
 *   ps-events-bench DIR [RECORDS]   (default 200000 scalar records, 50 histograms) */
#include <stdio.h>
#include <stdlib.h>

#include "events.h"
#include "timeutil.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: ps-events-bench DIR [RECORDS]\n");
        return 2;
    }
    long n = argc > 2 ? atol(argv[2]) : 200000;
    event_writer *w = NULL;
    char err[4400];
    if (event_writer_open(&w, argv[1], NULL, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    uint64_t t0 = time_now_ns();
    for (long i = 1; i <= n; i++) {
        event_scalar v[] = {{"train/loss", 1.0 / (double)i},  {"train/accuracy", 0.5},
                            {"train/samples_per_s", 16500.0}, {"train/step_ms", 7.7},
                            {"train/comm_share", 0.3},        {"train/lost_pushes", 0}};
        event_writer_scalars(w, i, 0, v, 6);
    }
    event_writer_flush(w);
    uint64_t t1 = time_now_ns();
    size_t numel = 784 * 256;
    float *k = malloc(numel * sizeof(float));
    if (k == NULL)
        return 1;
    for (size_t i = 0; i < numel; i++)
        k[i] = (float)((double)(i % 1000) / 1000.0 - 0.5) * 0.1f;
    int nh = 50;
    for (int i = 0; i < nh; i++)
        event_writer_histogram(w, i, 0, "weights/mlp/dense0/kernel", k, numel);
    event_writer_flush(w);
    uint64_t t2 = time_now_ns();
    bool failed = event_writer_failed(w);
    event_writer_close(w);
    free(k);
    printf("scalar record (6 values): %.3f us; histogram of %zu values: %.3f ms%s\n",
           (double)(t1 - t0) / 1e3 / (double)n, numel, (double)(t2 - t1) / 1e6 / nh,
           failed ? " (a write failed)" : "");
    return failed ? 1 : 0;
}
