/* Prometheus metrics (metrics.h): counters, gauges and histograms, collectors, and the text
 * exposition /metrics serves. */
#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

const double metrics_latency_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                          0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                          1,      2.5,     5,      10};
const size_t metrics_latency_buckets_len =
    sizeof(metrics_latency_buckets) / sizeof(metrics_latency_buckets[0]);

struct metric {
    metric_family *fam;
    char *values[METRICS_MAX_LABELS];
    atomic_uint_fast64_t u;        /* counter value, or histogram count */
    atomic_uint_fast64_t bits;     /* gauge value, or histogram sum: a double's bits */
    atomic_uint_fast64_t *buckets; /* histogram: nbuckets + 1 (the last is +Inf) */
    metric *next;
};

struct metric_family {
    metric_type type;
    char *name;
    char *help;
    int nlabels;
    char *labels[METRICS_MAX_LABELS];
    double bounds[METRICS_MAX_BUCKETS];
    size_t nbounds;
    metric *series, *last;
    metric_family *next;
};

typedef struct collector {
    metrics_collector_fn fn;
    void *arg;
    struct collector *next;
} collector;

struct metrics_out {
    FILE *f;
};

/* lock: the families and their series lists. clock: the collectors, held while they run. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t clock_ = PTHREAD_MUTEX_INITIALIZER;
static metric_family *families, *families_last;
static collector *collectors;

static uint64_t dbits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

static double bitsd(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

static void family_free(metric_family *f)
{
    for (metric *m = f->series; m;) {
        metric *n = m->next;
        for (int i = 0; i < f->nlabels; i++)
            free(m->values[i]);
        free(m->buckets);
        free(m);
        m = n;
    }
    for (int i = 0; i < f->nlabels; i++)
        free(f->labels[i]);
    free(f->name);
    free(f->help);
    free(f);
}

static metric_family *family_new(metric_type type, const char *name, const char *help,
                                 const char *labels, const double *buckets, size_t nbuckets)
{
    metric_family *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return NULL;
    f->type = type;
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    bool ok = f->name && f->help;
    if (labels && labels[0]) {
        const char *p = labels;
        while (ok && *p) {
            size_t n = strcspn(p, ",");
            if (f->nlabels == METRICS_MAX_LABELS || n == 0) {
                ok = false;
                break;
            }
            f->labels[f->nlabels] = strndup(p, n);
            ok = f->labels[f->nlabels++] != NULL;
            p += n;
            if (*p == ',')
                p++;
        }
    }
    if (type == METRIC_HISTOGRAM) {
        if (nbuckets == 0 || nbuckets > METRICS_MAX_BUCKETS)
            ok = false;
        for (size_t i = 0; ok && i < nbuckets; i++) {
            if (i > 0 && !(buckets[i] > buckets[i - 1]))
                ok = false;
            f->bounds[i] = buckets[i];
        }
        f->nbounds = nbuckets;
    }
    if (!ok) {
        family_free(f);
        return NULL;
    }
    return f;
}

metric_family *metrics_family(metric_type type, const char *name, const char *help,
                              const char *labels, const double *buckets, size_t nbuckets)
{
    pthread_mutex_lock(&lock);
    metric_family *f = families;
    while (f && strcmp(f->name, name) != 0)
        f = f->next;
    if (f) {
        if (f->type != type)
            f = NULL;
    } else if ((f = family_new(type, name, help, labels, buckets, nbuckets)) != NULL) {
        if (families_last)
            families_last->next = f;
        else
            families = f;
        families_last = f;
    }
    pthread_mutex_unlock(&lock);
    return f;
}

metric *metrics_series(metric_family *f, const char *const *values)
{
    if (f == NULL)
        return NULL;
    pthread_mutex_lock(&lock);
    metric *m = f->series;
    for (; m; m = m->next) {
        int i = 0;
        while (i < f->nlabels && strcmp(m->values[i], values[i]) == 0)
            i++;
        if (i == f->nlabels)
            break;
    }
    if (m == NULL && (m = calloc(1, sizeof(*m))) != NULL) {
        bool ok = true;
        m->fam = f;
        for (int i = 0; i < f->nlabels; i++)
            ok = ok && (m->values[i] = strdup(values[i] ? values[i] : "")) != NULL;
        if (ok && f->type == METRIC_HISTOGRAM)
            ok = (m->buckets = calloc(f->nbounds + 1, sizeof(*m->buckets))) != NULL;
        if (!ok) {
            for (int i = 0; i < f->nlabels; i++)
                free(m->values[i]);
            free(m);
            m = NULL;
        } else {
            if (f->last)
                f->last->next = m;
            else
                f->series = m;
            f->last = m;
        }
    }
    pthread_mutex_unlock(&lock);
    return m;
}

metric *metrics_counter(const char *name, const char *help)
{
    return metrics_series(metrics_family(METRIC_COUNTER, name, help, NULL, NULL, 0), NULL);
}

metric *metrics_gauge(const char *name, const char *help)
{
    return metrics_series(metrics_family(METRIC_GAUGE, name, help, NULL, NULL, 0), NULL);
}

metric *metrics_histogram(const char *name, const char *help, const double *buckets,
                          size_t nbuckets)
{
    return metrics_series(metrics_family(METRIC_HISTOGRAM, name, help, NULL, buckets, nbuckets),
                          NULL);
}

metric *metrics_series1(metric_family *f, const char *v1)
{
    const char *v[1] = {v1};
    return metrics_series(f, v);
}

metric *metrics_series2(metric_family *f, const char *v1, const char *v2)
{
    const char *v[2] = {v1, v2};
    return metrics_series(f, v);
}

void metric_inc(metric *m)
{
    if (m)
        atomic_fetch_add_explicit(&m->u, 1, memory_order_relaxed);
}

void metric_add(metric *m, uint64_t n)
{
    if (m)
        atomic_fetch_add_explicit(&m->u, n, memory_order_relaxed);
}

void metric_set(metric *m, double v)
{
    if (m)
        atomic_store_explicit(&m->bits, dbits(v), memory_order_relaxed);
}

static void add_double(atomic_uint_fast64_t *a, double d)
{
    uint_fast64_t cur = atomic_load_explicit(a, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(a, &cur, dbits(bitsd(cur) + d),
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
}

void metric_gauge_add(metric *m, double d)
{
    if (m)
        add_double(&m->bits, d);
}

void metric_observe(metric *m, double v)
{
    if (m == NULL || m->buckets == NULL)
        return;
    const metric_family *f = m->fam;
    size_t b = 0;
    while (b < f->nbounds && v > f->bounds[b])
        b++;
    atomic_fetch_add_explicit(&m->buckets[b], 1, memory_order_relaxed);
    add_double(&m->bits, v);
    atomic_fetch_add_explicit(&m->u, 1, memory_order_relaxed);
}

double metric_value(const metric *m)
{
    if (m == NULL)
        return 0.0;
    if (m->fam->type == METRIC_GAUGE)
        return bitsd(atomic_load(&m->bits));
    return (double)atomic_load(&m->u);
}

int metrics_add_collector(metrics_collector_fn fn, void *arg)
{
    collector *c = malloc(sizeof(*c));
    if (c == NULL)
        return -1;
    c->fn = fn;
    c->arg = arg;
    pthread_mutex_lock(&clock_);
    c->next = NULL;
    collector **pp = &collectors;
    while (*pp)
        pp = &(*pp)->next;
    *pp = c;
    pthread_mutex_unlock(&clock_);
    return 0;
}

void metrics_remove_collector(metrics_collector_fn fn, void *arg)
{
    pthread_mutex_lock(&clock_);
    for (collector **pp = &collectors; *pp;) {
        collector *c = *pp;
        if (c->fn == fn && c->arg == arg) {
            *pp = c->next;
            free(c);
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&clock_);
}

/* ---- rendering ---- */

static void put_number(FILE *f, double v)
{
    if (isnan(v))
        fputs("NaN", f);
    else if (isinf(v))
        fputs(v > 0 ? "+Inf" : "-Inf", f);
    else if (v == floor(v) && fabs(v) < 9.007199254740992e15)
        fprintf(f, "%.0f", v);
    else
        fprintf(f, "%.15g", v);
}

static void put_escaped(FILE *f, const char *s, bool help)
{
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else if (*s == '"' && !help)
            fputs("\\\"", f);
        else
            fputc(*s, f);
    }
}

static const char *type_name(metric_type t)
{
    return t == METRIC_COUNTER ? "counter" : t == METRIC_GAUGE ? "gauge" : "histogram";
}

static void put_header(FILE *f, const char *name, metric_type type, const char *help)
{
    fprintf(f, "# HELP %s ", name);
    put_escaped(f, help ? help : "", true);
    fprintf(f, "\n# TYPE %s %s\n", name, type_name(type));
}

/* name{l1="v1",...,extra="x"} value */
static void put_sample(FILE *f, const char *name, const char *suffix, char *const *lnames,
                       char *const *lvalues, int n, const char *extra_name, const char *extra_value,
                       double v)
{
    fputs(name, f);
    fputs(suffix, f);
    if (n > 0 || extra_name) {
        fputc('{', f);
        for (int i = 0; i < n; i++) {
            fprintf(f, "%s%s=\"", i ? "," : "", lnames[i]);
            put_escaped(f, lvalues[i], false);
            fputc('"', f);
        }
        if (extra_name)
            fprintf(f, "%s%s=\"%s\"", n ? "," : "", extra_name, extra_value);
        fputc('}', f);
    }
    fputc(' ', f);
    put_number(f, v);
    fputc('\n', f);
}

static void render_family(FILE *f, const metric_family *fam)
{
    if (fam->series == NULL)
        return;
    put_header(f, fam->name, fam->type, fam->help);
    for (const metric *m = fam->series; m; m = m->next) {
        if (fam->type == METRIC_COUNTER) {
            put_sample(f, fam->name, "", fam->labels, m->values, fam->nlabels, NULL, NULL,
                       (double)atomic_load_explicit(&m->u, memory_order_relaxed));
        } else if (fam->type == METRIC_GAUGE) {
            put_sample(f, fam->name, "", fam->labels, m->values, fam->nlabels, NULL, NULL,
                       bitsd(atomic_load_explicit(&m->bits, memory_order_relaxed)));
        } else {
            /* Read the buckets first and report their total as the count, so that the
             * exposition is consistent even while observations land. */
            uint64_t cum = 0;
            char le[48];
            for (size_t b = 0; b <= fam->nbounds; b++) {
                cum += atomic_load_explicit(&m->buckets[b], memory_order_relaxed);
                if (b < fam->nbounds)
                    snprintf(le, sizeof(le), "%.15g", fam->bounds[b]);
                else
                    snprintf(le, sizeof(le), "+Inf");
                put_sample(f, fam->name, "_bucket", fam->labels, m->values, fam->nlabels, "le", le,
                           (double)cum);
            }
            put_sample(f, fam->name, "_sum", fam->labels, m->values, fam->nlabels, NULL, NULL,
                       bitsd(atomic_load_explicit(&m->bits, memory_order_relaxed)));
            put_sample(f, fam->name, "_count", fam->labels, m->values, fam->nlabels, NULL, NULL,
                       (double)cum);
        }
    }
}

void metrics_emit_header(metrics_out *out, const char *name, metric_type type, const char *help)
{
    put_header(out->f, name, type, help);
}

void metrics_emit(metrics_out *out, const char *name, const char *const *labels, double value)
{
    FILE *f = out->f;
    fputs(name, f);
    if (labels && labels[0]) {
        fputc('{', f);
        for (int i = 0; labels[i] && labels[i + 1]; i += 2) {
            fprintf(f, "%s%s=\"", i ? "," : "", labels[i]);
            put_escaped(f, labels[i + 1], false);
            fputc('"', f);
        }
        fputc('}', f);
    }
    fputc(' ', f);
    put_number(f, value);
    fputc('\n', f);
}

void metrics_emit_one(metrics_out *out, const char *name, metric_type type, const char *help,
                      double value)
{
    metrics_emit_header(out, name, type, help);
    metrics_emit(out, name, NULL, value);
}

char *metrics_render(size_t *len)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (f == NULL)
        return NULL;
    pthread_mutex_lock(&lock);
    for (const metric_family *fam = families; fam; fam = fam->next)
        render_family(f, fam);
    pthread_mutex_unlock(&lock);
    metrics_out out = {f};
    pthread_mutex_lock(&clock_);
    for (collector *c = collectors; c; c = c->next)
        c->fn(&out, c->arg);
    pthread_mutex_unlock(&clock_);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    if (len)
        *len = n;
    return buf;
}

void metrics_reset(void)
{
    pthread_mutex_lock(&lock);
    for (metric_family *f = families; f;) {
        metric_family *n = f->next;
        family_free(f);
        f = n;
    }
    families = families_last = NULL;
    pthread_mutex_unlock(&lock);
    pthread_mutex_lock(&clock_);
    while (collectors) {
        collector *c = collectors;
        collectors = c->next;
        free(c);
    }
    pthread_mutex_unlock(&clock_);
}
