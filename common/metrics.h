/* Metrics: one process-wide registry of counters, gauges and histograms with labels, rendered
 * in the Prometheus text exposition format (version 0.0.4), like nng's statistics tree.
 *
 * A family (name, help, type, label names, histogram buckets) has series, one per set of label
 * values. Finding or creating a series takes the registry's lock; updating one is a few
 * relaxed atomic operations, so callers on a hot path look a series up once and keep the
 * pointer (series live until metrics_reset).
 *
 * State that already lives elsewhere (a server's store, its clock table) is exported by a
 * collector: a function called at every render that writes samples with metrics_emit_*.
 *
 * Naming (Prometheus conventions): base units in names (_seconds, _bytes), counters end in
 * _total, every name starts with "psd_". */
#ifndef PSD_COMMON_METRICS_H
#define PSD_COMMON_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM } metric_type;

typedef struct metric_family metric_family;
typedef struct metric metric;

#define METRICS_MAX_LABELS 4
#define METRICS_MAX_BUCKETS 24

/* Latency buckets in seconds, 100 us to 10 s. */
extern const double metrics_latency_buckets[];
extern const size_t metrics_latency_buckets_len;

/* The family `name` of the default registry, made on first use. labels: comma-separated label
 * names ("method,status") or NULL; buckets: a histogram's ascending upper bounds (+Inf is
 * implied). A second call with the same name returns the same family (its type must match).
 * Returns NULL when out of memory or on a mismatch. */
metric_family *metrics_family(metric_type type, const char *name, const char *help,
                              const char *labels, const double *buckets, size_t nbuckets);

/* The series of `f` with these label values (as many as the family has label names), made on
 * first use. NULL-safe: a NULL family gives NULL, and every update below ignores NULL. */
metric *metrics_series(metric_family *f, const char *const *values);
/* Shortcuts: an unlabelled family's only series, and a series with one or two label values. */
metric *metrics_counter(const char *name, const char *help);
metric *metrics_gauge(const char *name, const char *help);
metric *metrics_histogram(const char *name, const char *help, const double *buckets,
                          size_t nbuckets);
metric *metrics_series1(metric_family *f, const char *v1);
metric *metrics_series2(metric_family *f, const char *v1, const char *v2);

/* Counters (integers, monotonic). */
void metric_inc(metric *m);
void metric_add(metric *m, uint64_t n);
/* Gauges. */
void metric_set(metric *m, double v);
void metric_gauge_add(metric *m, double d);
/* Histograms: counts v in the first bucket whose bound is >= v; adds v to the sum. */
void metric_observe(metric *m, double v);

/* Reads a counter or gauge (histograms: their count). For tests and summaries. */
double metric_value(const metric *m);

/* ---- collectors ---- */
typedef struct metrics_out metrics_out;
typedef void (*metrics_collector_fn)(metrics_out *out, void *arg);

/* Calls fn(out, arg) at every render, after the registry's own families. Returns 0 or -1. */
int metrics_add_collector(metrics_collector_fn fn, void *arg);
void metrics_remove_collector(metrics_collector_fn fn, void *arg);

/* In a collector: the HELP and TYPE lines of a family, then its samples. labels: NULL or
 * alternating names and values ending with NULL ("var", "w", NULL); values are escaped. */
void metrics_emit_header(metrics_out *out, const char *name, metric_type type, const char *help);
void metrics_emit(metrics_out *out, const char *name, const char *const *labels, double value);
/* An unlabelled family of one sample: header and sample. */
void metrics_emit_one(metrics_out *out, const char *name, metric_type type, const char *help,
                      double value);

/* Renders every family and collector in the text format. Returns a malloc'd NUL-terminated
 * string (length in *len if len), or NULL when out of memory. */
char *metrics_render(size_t *len);

/* Frees every family and series and forgets the collectors (tests; no update may run). */
void metrics_reset(void);

#endif
