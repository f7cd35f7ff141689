/* train_events.c - ps-worker's TensorBoard event files (train_events.h). */
#include "train_events.h"

#include <stdio.h>
#include <stdlib.h>

#include "events.h"
#include "util.h"

struct train_events {
    event_writer *w;
    int64_t every;
    int64_t histogram_every;
    ps_client *client;
    model *m;
    /* the window since the last record */
    uint64_t win_start_ns;
    uint64_t win_comm_ns;
    int64_t win_steps;
    uint64_t win_samples;
    double win_loss, win_correct;
};

int train_events_open(train_events **out, const char *logdir, const char *role, int index,
                      int64_t every, int64_t histogram_every, char *err, size_t errlen)
{
    *out = NULL;
    char dir[4096];
    if (snprintf(dir, sizeof(dir), "%s/%s-%d", logdir, role, index) >= (int)sizeof(dir))
        return errf(err, errlen, "--logdir %s: path too long", logdir);
    train_events *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return errf(err, errlen, "out of memory");
    char werr[4400];
    if (event_writer_open(&e->w, dir, NULL, werr, sizeof(werr)) != 0) {
        free(e);
        return errf(err, errlen, "--logdir: %s", werr);
    }
    e->every = every > 0 ? every : 1;
    e->histogram_every = histogram_every;
    *out = e;
    return 0;
}

void train_events_close(train_events *e)
{
    if (e == NULL)
        return;
    event_writer_close(e->w);
    free(e);
}

void train_events_begin(train_events *e, ps_client *c, model *m, uint64_t t_start_ns)
{
    if (e == NULL)
        return;
    e->client = c;
    e->m = m;
    e->win_start_ns = t_start_ns;
}

static void write_histograms(train_events *e, int64_t step)
{
    int n = model_num_params(e->m);
    for (int i = 0; i < n; i++) {
        const model_param *p = model_get_param(e->m, i);
        char tag[96];
        if (p->host != NULL) {
            snprintf(tag, sizeof(tag), "weights/%s", p->name);
            event_writer_histogram(e->w, step, 0, tag, p->host, p->numel);
        }
        if (p->grad_host != NULL) {
            snprintf(tag, sizeof(tag), "gradients/%s", p->name);
            event_writer_histogram(e->w, step, 0, tag, p->grad_host, p->numel);
        }
    }
}

void train_events_step(train_events *e, int64_t done_steps, const model_stats *st, int batch,
                       uint64_t comm_ns, uint64_t now_ns)
{
    if (e == NULL)
        return;
    e->win_steps++;
    e->win_samples += (uint64_t)batch;
    e->win_loss += st->loss;
    e->win_correct += st->correct;
    e->win_comm_ns += comm_ns;
    if (e->histogram_every > 0 && e->m != NULL && done_steps % e->histogram_every == 0)
        write_histograms(e, done_steps);
    if (done_steps % e->every != 0)
        return;
    double dt = (double)(now_ns - e->win_start_ns) * 1e-9;
    double steps = (double)e->win_steps;
    event_scalar v[] = {
        {"train/loss", e->win_loss / steps},
        {"train/accuracy", e->win_samples ? e->win_correct / (double)e->win_samples : 0.0},
        {"train/samples_per_s", dt > 0 ? (double)e->win_samples / dt : 0.0},
        {"train/step_ms", dt * 1e3 / steps},
        {"train/comm_share", dt > 0 ? (double)e->win_comm_ns * 1e-9 / dt : 0.0},
        {"train/lost_pushes", e->client != NULL ? (double)ps_client_lost_pushes(e->client) : 0.0},
    };
    event_writer_scalars(e->w, done_steps, 0, v, sizeof(v) / sizeof(v[0]));
    e->win_start_ns = now_ns;
    e->win_comm_ns = 0;
    e->win_steps = 0;
    e->win_samples = 0;
    e->win_loss = e->win_correct = 0.0;
}

void train_events_staleness(train_events *e, int64_t step, const ps_staleness_stats *ss)
{
    if (e == NULL)
        return;
    event_scalar v[] = {
        {"staleness/max", (double)ss->max},
        {"staleness/waits", (double)ss->waits},
        {"staleness/wait_ms", (double)ss->wait_ms},
    };
    event_writer_scalars(e->w, step, 0, v, sizeof(v) / sizeof(v[0]));
}

void train_events_eval(train_events *e, int64_t step, double loss, double accuracy)
{
    if (e == NULL)
        return;
    event_scalar v[] = {{"test/loss", loss}, {"test/accuracy", accuracy}};
    event_writer_scalars(e->w, step, 0, v, 2);
    event_writer_flush(e->w);
}
