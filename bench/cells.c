/* What ps-bench times: the raw nng baseline (client and server) and the parameter-server
 * operations, with latency samples and their percentiles. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "bench.h"

const char *const op_kind_names[OPK_COUNT] = {"push", "pull", "push-pull"};

/* ---- time and statistics ------------------------------------------------------------------ */

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void samples_add(samples *s, double ns)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        double *v = realloc(s->v, cap * sizeof(*v));
        if (v == NULL)
            return; /* keep what we have: percentiles of fewer samples */
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = ns;
}

void samples_free(samples *s)
{
    free(s->v);
    memset(s, 0, sizeof(*s));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double samples_pct_us(samples *s, double p)
{
    if (s->n == 0)
        return 0;
    qsort(s->v, s->n, sizeof(double), cmp_double);
    size_t rank = (size_t)ceil(p / 100.0 * (double)s->n);
    if (rank < 1)
        rank = 1;
    if (rank > s->n)
        rank = s->n;
    return s->v[rank - 1] / 1000.0;
}

/* ---- page faults: a tensor path that reuses its memory takes none ------------------------ */

#define MAX_WATCH 16
static pid_t watched[MAX_WATCH];
static int nwatched;

void faults_watch(const pid_t *pids, int n)
{
    nwatched = n < MAX_WATCH ? n : MAX_WATCH;
    for (int i = 0; i < nwatched; i++)
        watched[i] = pids[i];
}

/* Minor faults and CPU seconds (utime + stime) of a process, from /proc/PID/stat. */
static void proc_stat(pid_t pid, unsigned long long *minflt, double *cpu_s)
{
    char path[64], buf[1024];
    *minflt = 0;
    *cpu_s = 0;
    if (pid > 0)
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    else
        snprintf(path, sizeof(path), "/proc/self/stat");
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* After "pid (comm) ": state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt
     * cmajflt utime stime. */
    const char *p = strrchr(buf, ')');
    unsigned long long flt, ut, st;
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %llu %*u %*u %*u %llu %llu", &flt, &ut,
                    &st) == 3) {
        *minflt = flt;
        *cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    }
}

void machine_cpu(double *busy_s, double *total_s)
{
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                   &v[4], &v[5], &v[6], &v[7]) != 8)
            memset(v, 0, sizeof(v));
        fclose(f);
    }
    double tck = (double)sysconf(_SC_CLK_TCK);
    *busy_s = (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tck;
    *total_s = *busy_s + (double)(v[3] + v[4]) / tck;
}

typedef struct sys_mark {
    unsigned long long client_flt, server_flt;
    double client_s, server_s, ours_s, busy_s, total_s;
} sys_mark;

static sys_mark sys_now(void)
{
    sys_mark m;
    memset(&m, 0, sizeof(m));
    double cpu;
    proc_stat(0, &m.client_flt, &cpu);
    m.client_s = cpu;
    for (int i = 0; i < nwatched; i++) {
        unsigned long long flt;
        proc_stat(watched[i], &flt, &cpu);
        m.server_flt += flt;
        m.server_s += cpu;
    }
    m.ours_s = m.client_s + m.server_s;
    machine_cpu(&m.busy_s, &m.total_s);
    return m;
}

static void sys_record(cell_result *r, sys_mark a)
{
    sys_mark b = sys_now();
    double ops = r->ops ? (double)r->ops : 1;
    r->client_faults = (double)(b.client_flt - a.client_flt) / ops;
    r->server_faults = (double)(b.server_flt - a.server_flt) / ops;
    double total = b.total_s - a.total_s, busy = b.busy_s - a.busy_s, ours = b.ours_s - a.ours_s;
    r->other_cpu = total > 0 && busy > ours ? (busy - ours) / total : 0;
    r->client_cpu_us = (b.client_s - a.client_s) * 1e6 / ops;
    r->server_cpu_us = (b.server_s - a.server_s) * 1e6 / ops;
}

double idle_wait_s = 0;

/* Waits (at most idle_wait_s) until other programs leave the machine at least 90% idle over
 * 200 ms: the processes of the bench are idle between cells, so what is busy is someone else. */
static void wait_idle(void)
{
    uint64_t start = bench_now_ns();
    while ((double)(bench_now_ns() - start) / 1e9 < idle_wait_s) {
        double b0, t0, b1, t1;
        machine_cpu(&b0, &t0);
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
        machine_cpu(&b1, &t1);
        if (t1 <= t0 || (b1 - b0) / (t1 - t0) < 0.10)
            return;
    }
}

static void finish(cell_result *r, samples *s, size_t bytes_per_op, uint64_t t0, uint64_t t1)
{
    r->ran = true;
    r->seconds = (double)(t1 - t0) / 1e9;
    r->gbps = r->seconds > 0 ? (double)bytes_per_op * (double)r->ops / r->seconds / 1e9 : 0;
    r->p50_us = samples_pct_us(s, 50);
    r->p99_us = samples_pct_us(s, 99);
    samples_free(s);
}

void cell_print(const char *label, int nservers, size_t bytes, const cell_result *r)
{
    if (r->errors) {
        printf("cell %-9s servers=%d size=%-9zu FAILED (%d errors)\n", label, nservers, bytes,
               r->errors);
    } else {
        printf("cell %-9s servers=%d size=%-9zu ops=%-6llu %6.3f s %6.3f GB/s  p50 %8.1f us  "
               "p99 %8.1f us  per op: faults %.1f + %.1f, CPU %.0f + %.0f us  others' CPU "
               "%.0f%%\n",
               label, nservers, bytes, (unsigned long long)r->ops, r->seconds, r->gbps, r->p50_us,
               r->p99_us, r->client_faults, r->server_faults, r->client_cpu_us, r->server_cpu_us,
               100 * r->other_cpu);
    }
    fflush(stdout);
}

/* ---- the timed loop ------------------------------------------------------------------------ */

int cell_trials = 1;

typedef int (*op_fn)(void *ctx);

/* Warm-up, then cell_trials trials of `seconds` each (at least 3 operations); the result is the
 * trial with the highest throughput, so that a burst of another program's work on the shared
 * cores spoils one trial rather than the cell. */
static cell_result timed(op_fn fn, void *ctx, size_t bytes_per_op, double seconds, double warmup_s)
{
    cell_result best;
    memset(&best, 0, sizeof(best));
    wait_idle();
    uint64_t t0 = bench_now_ns();
    for (int n = 0; n < 2 || bench_now_ns() - t0 < (uint64_t)(warmup_s * 1e9); n++) {
        if (fn(ctx) != 0) {
            best.errors = 1;
            return best;
        }
    }
    for (int trial = 0; trial < cell_trials; trial++) {
        cell_result r;
        memset(&r, 0, sizeof(r));
        samples s = {0};
        sys_mark fm = sys_now();
        t0 = bench_now_ns();
        uint64_t t = t0;
        while (r.ops < 3 || t - t0 < (uint64_t)(seconds * 1e9)) {
            uint64_t a = t;
            if (fn(ctx) != 0) {
                samples_free(&s);
                best.errors = 1;
                best.ran = false;
                return best;
            }
            t = bench_now_ns();
            samples_add(&s, (double)(t - a));
            r.ops++;
        }
        sys_record(&r, fm);
        finish(&r, &s, bytes_per_op, t0, t);
        if (!best.ran || r.gbps > best.gbps)
            best = r;
    }
    return best;
}

/* ---- raw nng baseline --------------------------------------------------------------------- */

/* Large enough for the biggest tensor; the raw server imposes no other limit. */
#define RAW_MAX_MESSAGE ((size_t)1 << 31)

int raw_server_main(const char *url)
{
    nng_socket s;
    int rv = nng_rep0_open(&s);
    if (rv == 0)
        rv = nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, RAW_MAX_MESSAGE);
    if (rv == 0)
        rv = nng_listen(s, url, NULL, 0);
    if (rv != 0) {
        fprintf(stderr, "ps-bench --raw-server %s: %s\n", url, nng_strerror(rv));
        return 1;
    }
    for (;;) {
        nng_msg *m;
        if ((rv = nng_recvmsg(s, &m, 0)) != 0) {
            if (rv == NNG_ECLOSED)
                return 0;
            continue;
        }
        uint64_t len = nng_msg_len(m);
        nng_msg_free(m);
        nng_msg *r;
        if (nng_msg_alloc(&r, 8) != 0)
            continue;
        memcpy(nng_msg_body(r), &len, 8);
        if (nng_sendmsg(s, r, 0) != 0)
            nng_msg_free(r);
    }
}

/* One request; returns 0 or -1. */
static int raw_once(nng_socket s, const void *src, size_t bytes, bool copy)
{
    nng_msg *m;
    if (nng_msg_alloc(&m, bytes) != 0)
        return -1;
    if (copy)
        memcpy(nng_msg_body(m), src, bytes);
    if (nng_sendmsg(s, m, 0) != 0) {
        nng_msg_free(m);
        return -1;
    }
    nng_msg *r;
    if (nng_recvmsg(s, &r, 0) != 0)
        return -1;
    uint64_t echoed = 0;
    if (nng_msg_len(r) == 8)
        memcpy(&echoed, nng_msg_body(r), 8);
    nng_msg_free(r);
    return echoed == bytes ? 0 : -1;
}

bool raw_copy = true;

typedef struct raw_ctx {
    nng_socket sock;
    const void *src;
    size_t bytes;
} raw_ctx;

static int raw_op(void *arg)
{
    raw_ctx *rc = arg;
    return raw_once(rc->sock, rc->src, rc->bytes, raw_copy);
}

cell_result raw_cell(const char *url, size_t bytes, double seconds, double warmup_s)
{
    cell_result r;
    memset(&r, 0, sizeof(r));
    nng_socket sock;
    float *src = malloc(bytes);
    if (src == NULL || nng_req0_open(&sock) != 0) {
        free(src);
        r.errors = 1;
        return r;
    }
    for (size_t i = 0; i < bytes / sizeof(float); i++)
        src[i] = BENCH_GRAD;
    nng_socket_set_size(sock, NNG_OPT_RECVMAXSZ, RAW_MAX_MESSAGE);
    nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, 30000);
    nng_socket_set_ms(sock, NNG_OPT_SENDTIMEO, 30000);
    nng_socket_set_ms(sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    int rv = nng_dial(sock, url, NULL, 0);
    if (rv != 0) {
        fprintf(stderr, "ps-bench: raw dial %s: %s\n", url, nng_strerror(rv));
        r.errors = 1;
    } else {
        raw_ctx rc = {sock, src, bytes};
        r = timed(raw_op, &rc, bytes, seconds, warmup_s);
    }
    nng_close(sock);
    free(src);
    return r;
}

/* ---- parameter-server cells --------------------------------------------------------------- */

static int var_create(ps_client *c, bench_var *bv, const char *tag, size_t bytes)
{
    char name[128];
    snprintf(name, sizeof(name), "bench/%s/%zu", tag, bytes);
    size_t n = bytes / sizeof(float);
    ps_var_spec spec;
    ps_var_spec_init(&spec, name);
    spec.ndims = 1;
    spec.dims[0] = n;
    spec.initializer = PS_INIT_ZEROS;
    spec.optimizer = PS_OPT_SGD;
    spec.learning_rate = 1.0;
    int rc = ps_var_create(c, &spec, &bv->var);
    if (rc != PS_OK) {
        fprintf(stderr, "ps-bench: create %s: %s: %s\n", name, ps_strerror(rc), ps_last_error());
        return -1;
    }
    return 0;
}

int bench_var_rebind(ps_client *c, bench_var *bv, const char *tag)
{
    return var_create(c, bv, tag, bv->bytes);
}

int bench_var_open(ps_client *c, bench_var *bv, const char *tag, size_t bytes)
{
    memset(bv, 0, sizeof(*bv));
    size_t n = bytes / sizeof(float);
    if (var_create(c, bv, tag, bytes) != 0)
        return -1;
    bv->bytes = bytes;
    bv->grad = malloc(bytes);
    bv->dst = malloc(bytes);
    if (bv->grad == NULL || bv->dst == NULL) {
        fprintf(stderr, "ps-bench: out of memory\n");
        bench_var_close(bv);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        bv->grad[i] = BENCH_GRAD;
        bv->dst[i] = 0;
    }
    return 0;
}

void bench_var_close(bench_var *bv)
{
    free(bv->grad);
    free(bv->dst);
    bv->grad = bv->dst = NULL;
}

static int check_values(const bench_var *bv, uint64_t pushes, const char *what)
{
    float want = -(float)pushes * BENCH_GRAD;
    size_t n = bv->bytes / sizeof(float);
    for (size_t i = 0; i < n; i++) {
        if (bv->dst[i] != want) {
            fprintf(stderr,
                    "ps-bench: %s of %s: element %zu is %.9g, expected %.9g after %llu pushes\n",
                    what, ps_var_name(bv->var), i, (double)bv->dst[i], (double)want,
                    (unsigned long long)pushes);
            return -1;
        }
    }
    return 0;
}

int bench_var_verify(ps_client *c, bench_var *bv)
{
    memset(bv->dst, 0x7f, bv->bytes);
    int rc = ps_pull(c, bv->var, bv->dst);
    if (rc != PS_OK) {
        fprintf(stderr, "ps-bench: verify pull %s: %s: %s\n", ps_var_name(bv->var), ps_strerror(rc),
                ps_last_error());
        return -1;
    }
    return check_values(bv, bv->pushes, "final pull");
}

size_t window_ops = 0, window_bytes = 0;

/* The whole tensor as successive asynchronous range operations of window_bytes, at most
 * window_ops in flight: what a bounded pipeline inside the library would do (an experiment on
 * the public API; the library itself starts every chunk of an operation at once). */
static int windowed(ps_client *c, bench_var *bv, enum ps_op_kind k)
{
    enum { MAXW = 64 };
    ps_op *ring[MAXW];
    size_t w = window_ops < MAXW ? window_ops : MAXW;
    uint64_t n = bv->bytes / sizeof(float), step = window_bytes / sizeof(float);
    if (step == 0)
        step = 1;
    size_t head = 0, inflight = 0;
    int rc = PS_OK;
    for (uint64_t off = 0; off < n || inflight > 0;) {
        if (off < n && inflight < w && rc == PS_OK) {
            uint64_t cnt = n - off < step ? n - off : step;
            ps_op *op = NULL;
            int st;
            if (k == OPK_PUSH)
                st = ps_push_async(c, bv->var, off, cnt, bv->grad + off, NULL, NULL, &op);
            else if (k == OPK_PULL)
                st = ps_pull_async(c, bv->var, off, cnt, bv->dst + off, NULL, NULL, &op);
            else
                st = ps_push_pull_async(c, bv->var, off, cnt, bv->grad + off, bv->dst + off, NULL,
                                        NULL, &op);
            if (st != PS_OK) {
                rc = st;
                off = n;
                continue;
            }
            ring[(head + inflight) % w] = op;
            inflight++;
            off += cnt;
            continue;
        }
        if (inflight == 0)
            break;
        int st = ps_op_wait(ring[head]);
        ps_op_destroy(ring[head]);
        if (st != PS_OK && rc == PS_OK)
            rc = st;
        head = (head + 1) % w;
        inflight--;
        if (rc != PS_OK)
            off = n;
    }
    return rc;
}

static int ps_once(ps_client *c, bench_var *bv, enum ps_op_kind k, bool check)
{
    int rc;
    if (window_ops > 0 && window_bytes < bv->bytes) {
        rc = windowed(c, bv, k);
    } else {
        switch (k) {
        case OPK_PUSH:
            rc = ps_push(c, bv->var, bv->grad);
            break;
        case OPK_PULL:
            rc = ps_pull(c, bv->var, bv->dst);
            break;
        default:
            rc = ps_push_pull(c, bv->var, bv->grad, bv->dst);
            break;
        }
    }
    if (rc != PS_OK) {
        fprintf(stderr, "ps-bench: %s %s: %s: %s\n", op_kind_names[k], ps_var_name(bv->var),
                ps_strerror(rc), ps_last_error());
        return -1;
    }
    if (k != OPK_PULL)
        bv->pushes++;
    if (check && k != OPK_PUSH)
        return check_values(bv, bv->pushes, op_kind_names[k]);
    return 0;
}

typedef struct ps_ctx {
    ps_client *c;
    bench_var *bv;
    enum ps_op_kind k;
    bool check;
} ps_ctx;

static int ps_cell_op(void *arg)
{
    ps_ctx *pc = arg;
    return ps_once(pc->c, pc->bv, pc->k, pc->check);
}

cell_result ps_cell(ps_client *c, bench_var *bv, enum ps_op_kind k, double seconds, double warmup_s,
                    bool check)
{
    ps_ctx pc = {c, bv, k, check};
    return timed(ps_cell_op, &pc, k == OPK_PUSH_PULL ? 2 * bv->bytes : bv->bytes, seconds,
                 warmup_s);
}
