/* events_export.c - the sampling thread of events_export.h. */
#include "events_export.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "events.h"
#include "log.h"
#include "metrics.h"
#include "timeutil.h"
#include "util.h"

#define TAG_MAX 200

/* A counter's (or a histogram bucket's) value at the previous sample. */
typedef struct prev_value {
    char key[TAG_MAX + 64];
    double v;
} prev_value;

/* The buckets of one histogram series gathered while its lines are read. */
typedef struct hist_group {
    char tag[TAG_MAX]; /* NAME/labels without le */
    double le[METRICS_MAX_BUCKETS + 2];
    double cum[METRICS_MAX_BUCKETS + 2]; /* cumulative increase over the interval */
    size_t n;
} hist_group;

struct events_export {
    event_writer *w;
    uint64_t interval_ns;
    uint64_t start_ns;
    uint64_t last_ns;  /* of the previous sample, 0 before the first */
    int64_t last_step; /* -1 before the first */
    prev_value *prev;
    size_t nprev, capprev;
    /* one sample's scalars */
    event_scalar *vals;
    char (*tags)[TAG_MAX];
    size_t nvals, capvals;
    /* the types of the families read so far (from # TYPE lines) */
    char cur_family[128];
    metric_type cur_type;
    hist_group hg;
    pthread_t thread;
    bool running;
    bool stop;
    pthread_mutex_t lock;
    pthread_cond_t cond;
};

int events_export_open(events_export **out, const char *dir, int task, int interval_s, char *err,
                       size_t errlen)
{
    *out = NULL;
    char path[4096];
    if (snprintf(path, sizeof(path), "%s/ps-%d", dir, task) >= (int)sizeof(path))
        return errf(err, errlen, "events-dir %s: path too long", dir);
    events_export *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return errf(err, errlen, "out of memory");
    char werr[4400];
    if (event_writer_open(&x->w, path, NULL, werr, sizeof(werr)) != 0) {
        free(x);
        return errf(err, errlen, "events-dir: %s", werr);
    }
    x->interval_ns = (uint64_t)(interval_s > 0 ? interval_s : 5) * 1000000000u;
    x->start_ns = time_now_ns();
    x->last_step = -1;
    pthread_mutex_init(&x->lock, NULL);
    pthread_cond_init(&x->cond, NULL);
    *out = x;
    return 0;
}

/* The previous value of key (NULL the first time), and stores v as the next one. */
static bool swap_prev(events_export *x, const char *key, double v, double *old)
{
    for (size_t i = 0; i < x->nprev; i++)
        if (strcmp(x->prev[i].key, key) == 0) {
            *old = x->prev[i].v;
            x->prev[i].v = v;
            return true;
        }
    if (x->nprev == x->capprev) {
        size_t cap = x->capprev ? 2 * x->capprev : 64;
        prev_value *p = realloc(x->prev, cap * sizeof(*p));
        if (p == NULL)
            return false;
        x->prev = p;
        x->capprev = cap;
    }
    snprintf(x->prev[x->nprev].key, sizeof(x->prev[0].key), "%s", key);
    x->prev[x->nprev++].v = v;
    return false;
}

static void add_value(events_export *x, const char *tag, double v)
{
    if (!isfinite(v))
        return;
    if (x->nvals == x->capvals) {
        size_t cap = x->capvals ? 2 * x->capvals : 64;
        event_scalar *vals = realloc(x->vals, cap * sizeof(*vals));
        if (vals == NULL)
            return;
        x->vals = vals;
        char(*tags)[TAG_MAX] = realloc(x->tags, cap * sizeof(*tags));
        if (tags == NULL)
            return;
        x->tags = tags;
        x->capvals = cap;
    }
    snprintf(x->tags[x->nvals], TAG_MAX, "%s", tag);
    x->vals[x->nvals].value = v;
    x->nvals++;
}

/* The q-quantile of a histogram group's interval, interpolated within its bucket. */
static double group_quantile(const hist_group *g, double q)
{
    double total = g->cum[g->n - 1];
    double want = q * total;
    for (size_t i = 0; i < g->n; i++) {
        if (g->cum[i] < want)
            continue;
        double lo = i > 0 ? g->le[i - 1] : 0.0, hi = g->le[i];
        double below = i > 0 ? g->cum[i - 1] : 0.0, in = g->cum[i] - below;
        if (isinf(hi))
            return lo;
        return in > 0 ? lo + (hi - lo) * (want - below) / in : hi;
    }
    return NAN;
}

static void finish_group(events_export *x, double dt)
{
    hist_group *g = &x->hg;
    if (g->n == 0)
        return;
    char tag[TAG_MAX + 16];
    /* tag is NAME or NAME/labels: the suffix goes after NAME */
    const char *slash = strchr(g->tag, '/');
    int nl = slash ? (int)(slash - g->tag) : (int)strlen(g->tag);
    const char *labels = slash ? slash : "";
    double total = g->cum[g->n - 1];
    snprintf(tag, sizeof(tag), "%.*s_per_s%s", nl, g->tag, labels);
    add_value(x, tag, total / dt);
    if (total > 0) {
        snprintf(tag, sizeof(tag), "%.*s_p50%s", nl, g->tag, labels);
        add_value(x, tag, group_quantile(g, 0.5));
        snprintf(tag, sizeof(tag), "%.*s_p99%s", nl, g->tag, labels);
        add_value(x, tag, group_quantile(g, 0.99));
    }
    g->n = 0;
}

/* Parses `name{k="v",...} value` into the tag NAME[/k=v,...] (psd_ dropped; le="..." taken
 * out into *le when le != NULL) and the value. Returns 0 or -1 (not a sample). */
static int parse_sample(const char *line, char *name, size_t namecap, char *labels, size_t labcap,
                        double *le, double *value)
{
    size_t n = strcspn(line, "{ ");
    if (n == 0 || n >= namecap)
        return -1;
    memcpy(name, line, n);
    name[n] = '\0';
    const char *p = line + n;
    labels[0] = '\0';
    size_t ll = 0;
    if (*p == '{') {
        p++;
        while (*p && *p != '}') {
            size_t kn = strcspn(p, "=");
            if (p[kn] != '=' || p[kn + 1] != '"')
                return -1;
            const char *k = p;
            p += kn + 2;
            char v[128];
            size_t vn = 0;
            while (*p && *p != '"') {
                if (*p == '\\' && p[1])
                    p++;
                if (vn + 1 < sizeof(v))
                    v[vn++] = *p;
                p++;
            }
            v[vn] = '\0';
            if (*p != '"')
                return -1;
            p++;
            if (*p == ',')
                p++;
            if (le != NULL && kn == 2 && strncmp(k, "le", 2) == 0) {
                *le = strcmp(v, "+Inf") == 0 ? INFINITY : strtod(v, NULL);
                continue;
            }
            int w = snprintf(labels + ll, labcap - ll, "%s%.*s=%s", ll ? "," : "/", (int)kn, k, v);
            if (w > 0 && (size_t)w < labcap - ll)
                ll += (size_t)w;
        }
        if (*p != '}')
            return -1;
        p++;
    }
    char *end;
    *value = strtod(p, &end);
    return end == p ? -1 : 0;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* One sample of every metric, written as one Event. */
static void sample(events_export *x)
{
    uint64_t now = time_now_ns();
    double dt = x->last_ns ? (double)(now - x->last_ns) * 1e-9 : 0.0;
    x->last_ns = now;
    size_t len;
    char *text = metrics_render(&len);
    if (text == NULL)
        return;
    x->nvals = 0;
    x->hg.n = 0;
    x->cur_family[0] = '\0';
    x->cur_type = METRIC_GAUGE;
    for (char *line = text, *next; line != NULL && *line; line = next) {
        next = strchr(line, '\n');
        if (next != NULL)
            *next++ = '\0';
        if (line[0] == '#') {
            char fam[128], type[32];
            if (sscanf(line, "# TYPE %127s %31s", fam, type) == 2) {
                if (dt > 0)
                    finish_group(x, dt);
                snprintf(x->cur_family, sizeof(x->cur_family), "%s", fam);
                x->cur_type = strcmp(type, "counter") == 0     ? METRIC_COUNTER
                              : strcmp(type, "histogram") == 0 ? METRIC_HISTOGRAM
                                                               : METRIC_GAUGE;
            }
            continue;
        }
        char name[128], labels[TAG_MAX], tag[TAG_MAX + 160];
        double value, le = NAN;
        bool hist = x->cur_type == METRIC_HISTOGRAM;
        if (parse_sample(line, name, sizeof(name), labels, sizeof(labels), hist ? &le : NULL,
                         &value) != 0)
            continue;
        const char *base = strncmp(name, "psd_", 4) == 0 ? name + 4 : name;
        snprintf(tag, sizeof(tag), "%s%s", base, labels);
        if (hist) {
            if (!ends_with(name, "_bucket"))
                continue; /* _sum and _count: the buckets say it all */
            char key[TAG_MAX + 200];
            snprintf(key, sizeof(key), "%s le=%g", tag, le);
            double old;
            bool had = swap_prev(x, key, value, &old);
            if (!had || dt <= 0)
                continue;
            /* tag without "_bucket" */
            char gtag[TAG_MAX];
            size_t bl = strlen(base) - strlen("_bucket");
            snprintf(gtag, sizeof(gtag), "%.*s%s", (int)bl, base, labels);
            if (x->hg.n > 0 && strcmp(gtag, x->hg.tag) != 0)
                finish_group(x, dt);
            if (x->hg.n == 0)
                snprintf(x->hg.tag, sizeof(x->hg.tag), "%s", gtag);
            if (x->hg.n < sizeof(x->hg.le) / sizeof(x->hg.le[0])) {
                x->hg.le[x->hg.n] = le;
                x->hg.cum[x->hg.n++] = value - old;
            }
            continue;
        }
        if (dt > 0)
            finish_group(x, dt);
        if (x->cur_type == METRIC_COUNTER) {
            double old;
            bool had = swap_prev(x, tag, value, &old);
            if (!had || dt <= 0)
                continue;
            char rtag[TAG_MAX + 16];
            size_t bl = strlen(base);
            if (ends_with(base, "_total"))
                bl -= strlen("_total");
            snprintf(rtag, sizeof(rtag), "%.*s_per_s%s", (int)bl, base, labels);
            add_value(x, rtag, (value - old) / dt);
        } else {
            add_value(x, tag, value);
        }
    }
    if (dt > 0)
        finish_group(x, dt);
    free(text);
    for (size_t i = 0; i < x->nvals; i++)
        x->vals[i].tag = x->tags[i];
    if (x->nvals > 0) {
        /* the second since the start; one more than the previous when in the same second */
        int64_t step = (int64_t)((now - x->start_ns) / 1000000000u);
        if (step <= x->last_step)
            step = x->last_step + 1;
        x->last_step = step;
        event_writer_scalars(x->w, step, 0, x->vals, x->nvals);
        event_writer_flush(x->w);
    }
}

static void *export_main(void *arg)
{
    events_export *x = arg;
    pthread_mutex_lock(&x->lock);
    while (!x->stop) {
        pthread_mutex_unlock(&x->lock);
        sample(x);
        pthread_mutex_lock(&x->lock);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + x->interval_ns;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        while (!x->stop && pthread_cond_timedwait(&x->cond, &x->lock, &ts) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&x->lock);
    return NULL;
}

int events_export_start(events_export *x)
{
    if (pthread_create(&x->thread, NULL, export_main, x) != 0) {
        log_error("events-dir: cannot start the sampling thread");
        return -1;
    }
    x->running = true;
    return 0;
}

void events_export_close(events_export *x)
{
    if (x == NULL)
        return;
    if (x->running) {
        pthread_mutex_lock(&x->lock);
        x->stop = true;
        pthread_cond_signal(&x->cond);
        pthread_mutex_unlock(&x->lock);
        pthread_join(x->thread, NULL);
        sample(x);
    }
    event_writer_close(x->w);
    pthread_mutex_destroy(&x->lock);
    pthread_cond_destroy(&x->cond);
    free(x->prev);
    free(x->vals);
    free(x->tags);
    free(x);
}
