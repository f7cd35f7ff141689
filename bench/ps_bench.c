/* ps-bench: wire throughput and latency of pull, push and push-pull against real ps-server
 * processes, beside a raw nng baseline (one REQ socket, one request in flight, the whole tensor
 * in one nng_msg, an 8-byte reply), and the cost of the allocator's configuration.
 *
 *   ps-bench [--server-bin PATH] [--seconds S] [--sizes 4K,64K,1M,16M,64M] [--servers 1,2] ...
 *   ps-bench --quick      smoke test: tiny sizes, every pulled value checked, exit 0 iff all ok
 *   ps-bench --sweep      client settings (connections x chunk-bytes) at 1 MiB and 16 MiB
 *   ps-bench --help
 *
 * The bench starts every process it talks to (servers on free loopback ports, the raw baseline
 * server, allocator variants) as children that die with it. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#ifdef PSD_WITH_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif
#include "jemalloc_conf.h"

#include "bench.h"
#include "options.h"
#include "program.h"

/* jemalloc 5.3's own defaults for what jemalloc_conf.h changes (read with mallctl from a
 * program without malloc_conf: opt.oversize_threshold 8388608, opt.dirty_decay_ms 10000,
 * opt.muzzy_decay_ms 0, opt.thp default). MALLOC_CONF in the environment overrides the
 * compiled-in string key by key; with the oversize arena in use again, jemalloc_conf.h leaves
 * arena 0 alone, so this variant runs jemalloc as shipped. */
#define JEMALLOC_DEFAULTS                                                                          \
    "oversize_threshold:8388608,dirty_decay_ms:10000,muzzy_decay_ms:0,thp:default"

#define MAX_LIST 16
#define MAX_OPTS 32
#define MAX_SERVERS 8

typedef struct variant {
    char label[80];
    char conf[256]; /* MALLOC_CONF for the children ("" : the compiled-in malloc_conf alone) */
    char bench_bin[PATH_MAX], server_bin[PATH_MAX];
} variant;

typedef struct bench_opts {
    char self[PATH_MAX];
    char server_bin[PATH_MAX];
    double seconds, warmup;
    size_t sizes[MAX_LIST];
    int nsizes;
    int servers[MAX_LIST];
    int nservers;
    bool kinds[OPK_COUNT]; /* operations to time */
    bool no_raw;
    const char *client_opts[MAX_OPTS]; /* name=value */
    int nclient_opts;
    const char *server_opts[MAX_OPTS];
    int nserver_opts;
    const char *split_threshold;
    size_t compare_size;
    variant variants[MAX_LIST];
    int nvariants;
    bool no_variants;
    bool quick, sweep, variant_child, check;
    int sweep_conns[MAX_LIST], nsweep_conns;
    size_t sweep_chunks[MAX_LIST];
    int nsweep_chunks;
    size_t sweep_sizes[MAX_LIST];
    int nsweep_sizes;
    unsigned timeout_s;
    options *opts;                /* the settings (scope OPT_SCOPE_TOOL); owns the strings */
    char client_flag_opts[2][96]; /* --connections and --chunk-bytes as NAME=VALUE */
} bench_opts;

static const char usage_line[] =
    "[OPTIONS]\n"
    "Measures pull, push and push-pull throughput (GB/s of tensor payload, 1 GB = 1e9 bytes)\n"
    "and latency (p50, p99) against ps-server processes it starts itself, beside a raw nng\n"
    "baseline, and compares the project's jemalloc settings with jemalloc's defaults.";

/* ---- small parsers ------------------------------------------------------------------------ */

static int parse_size(const char *s, size_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || errno)
        return -1;
    unsigned long long mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1ull << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1ull << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1ull << 30;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end != '\0' || v == 0 || v > SIZE_MAX / mul)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

static int parse_size_list(const char *s, size_t *out, int *n)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        if (*n == MAX_LIST || parse_size(tok, &out[*n]) != 0)
            return -1;
        if (out[*n] % sizeof(float) != 0)
            return -1;
        (*n)++;
    }
    return *n ? 0 : -1;
}

static int parse_int_list(const char *s, int *out, int *n, int lo, int hi)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", s);
    *n = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);
        if (*n == MAX_LIST || *end || v < lo || v > hi)
            return -1;
        out[(*n)++] = (int)v;
    }
    return *n ? 0 : -1;
}

static const char *size_label(size_t b, char *buf, size_t cap)
{
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(buf, cap, "%zu MiB", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, cap, "%zu KiB", b >> 10);
    else
        snprintf(buf, cap, "%zu B", b);
    return buf;
}

/* ---- allocator ---------------------------------------------------------------------------- */

/* Describes the allocator in effect, as read back from it, and checks that nng's messages (and
 * so every tensor on the wire) are allocated by it. */
static void malloc_describe(char *buf, size_t cap)
{
#ifdef PSD_WITH_JEMALLOC
    const char *version = "?", *thp = "?";
    size_t oversize = 0, tcache_max = 0;
    ssize_t dirty = 0, muzzy = 0;
    unsigned narenas = 0;
/* Reads a jemalloc setting or counter into var (left as it was if the name is unknown). */
#define MALLCTL_GET(name, var)                                                                     \
    do {                                                                                           \
        size_t mallctl_sz_ = sizeof(var);                                                          \
        mallctl((name), &(var), &mallctl_sz_, NULL, 0);                                            \
    } while (0)
    MALLCTL_GET("version", version);
    MALLCTL_GET("opt.oversize_threshold", oversize);
    MALLCTL_GET("opt.dirty_decay_ms", dirty);
    MALLCTL_GET("opt.muzzy_decay_ms", muzzy);
    MALLCTL_GET("opt.thp", thp);
    MALLCTL_GET("opt.narenas", narenas);
    MALLCTL_GET("opt.tcache_max", tcache_max);
    /* thread.allocated counts what this thread allocated through jemalloc. */
    uint64_t before = 0, after = 0;
    MALLCTL_GET("thread.allocated", before);
    nng_msg *m = NULL;
    size_t probe = (size_t)4 << 20;
    if (nng_msg_alloc(&m, probe) == 0) {
        MALLCTL_GET("thread.allocated", after);
        nng_msg_free(m);
    }
    size_t arena0 = 0;
    MALLCTL_GET("arena.0.oversize_threshold", arena0);
    char ver[16];
    snprintf(ver, sizeof(ver), "%.5s", version);
    snprintf(buf, cap,
             "jemalloc %s: oversize_threshold=%zu (arena 0: %zu) dirty_decay_ms=%zd "
             "muzzy_decay_ms=%zd thp=%s narenas=%u tcache_max=%zu; nng messages from jemalloc: %s",
             ver, oversize, arena0, dirty, muzzy, thp, narenas, tcache_max,
             after - before >= probe ? "yes" : "NO");
#else
    snprintf(buf, cap, "glibc malloc (built without jemalloc)");
#endif
}

/* ---- clusters of ps-server children ------------------------------------------------------- */

typedef struct cluster {
    int n;
    pid_t pids[MAX_SERVERS];
    int ports[MAX_SERVERS];
    char json[64 * MAX_SERVERS]; /* {"cluster":{"ps":[...]}} for the client */
} cluster;

static void cluster_stop(cluster *cl)
{
    for (int i = 0; i < cl->n; i++) {
        if (cl->pids[i] > 0)
            child_stop(cl->pids[i], 3000);
        cl->pids[i] = 0;
    }
}

static int cluster_start(const bench_opts *o, int n, cluster *cl)
{
    memset(cl, 0, sizeof(*cl));
    cl->n = n;
    char ps[48 * MAX_SERVERS] = "";
    for (int i = 0; i < n; i++) {
        if ((cl->ports[i] = free_port()) < 0) {
            fprintf(stderr, "ps-bench: no free port\n");
            return -1;
        }
        size_t len = strlen(ps);
        snprintf(ps + len, sizeof(ps) - len, "%s\"127.0.0.1:%d\"", i ? "," : "", cl->ports[i]);
    }
    snprintf(cl->json, sizeof(cl->json), "{\"cluster\":{\"ps\":[%s]}}", ps);
    for (int i = 0; i < n; i++) {
        char tf[sizeof(ps) + 128];
        snprintf(tf, sizeof(tf),
                 "TF_CONFIG={\"cluster\":{\"ps\":[%s]},\"task\":{\"type\":\"ps\",\"index\":%d}}",
                 ps, i);
        char *env[] = {tf, NULL};
        char *argv[8 + 2 * MAX_OPTS];
        char optbuf[MAX_OPTS][160];
        int k = 0;
        argv[k++] = (char *)o->server_bin;
        argv[k++] = "--log-level=warn";
        argv[k++] = "--max-message-bytes=256M";
        for (int j = 0; j < o->nserver_opts; j++) {
            snprintf(optbuf[j], sizeof(optbuf[j]), "--%s", o->server_opts[j]);
            argv[k++] = optbuf[j];
        }
        argv[k] = NULL;
        cl->pids[i] = child_start(argv, env, NULL);
        if (cl->pids[i] < 0) {
            cluster_stop(cl);
            return -1;
        }
    }
    for (int i = 0; i < n; i++) {
        if (wait_port(cl->ports[i], cl->pids[i], 10000) != 0) {
            cl->pids[i] = 0;
            cluster_stop(cl);
            return -1;
        }
    }
    return 0;
}

/* Applies the bench's client settings (and `extra`, name/value pairs) to cfg, or, with cfg
 * NULL, to an options object to print what is in effect. */
static int apply_client_opts(const bench_opts *o, const cluster *cl, ps_config *cfg, options *opts,
                             const char *const *extra, int nextra)
{
    const char *pairs[2 * (MAX_OPTS + 8)];
    char namebuf[MAX_OPTS][64];
    int n = 0;
    if (cl) {
        pairs[n++] = "cluster";
        pairs[n++] = cl->json;
    }
    pairs[n++] = "max-message-bytes";
    pairs[n++] = "256M";
    pairs[n++] = "deadline-ms";
    pairs[n++] = "60000";
    pairs[n++] = "split-threshold-bytes";
    pairs[n++] = o->split_threshold;
    for (int i = 0; i < o->nclient_opts; i++) {
        const char *eq = strchr(o->client_opts[i], '=');
        snprintf(namebuf[i], sizeof(namebuf[i]), "%.*s", (int)(eq - o->client_opts[i]),
                 o->client_opts[i]);
        pairs[n++] = namebuf[i];
        pairs[n++] = eq + 1;
    }
    for (int i = 0; i < nextra; i++) {
        pairs[n++] = extra[2 * i];
        pairs[n++] = extra[2 * i + 1];
    }
    for (int i = 0; i < n; i += 2) {
        char err[400];
        if (cfg && ps_config_set(cfg, pairs[i], pairs[i + 1]) != PS_OK) {
            fprintf(stderr, "ps-bench: client setting %s: %s\n", pairs[i], ps_last_error());
            return -1;
        }
        if (opts && options_set(opts, pairs[i], pairs[i + 1], err, sizeof(err)) != 0) {
            fprintf(stderr, "ps-bench: client setting %s: %s\n", pairs[i], err);
            return -1;
        }
    }
    return 0;
}

static ps_client *client_open(const bench_opts *o, const cluster *cl, const char *const *extra,
                              int nextra)
{
    ps_config *cfg;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    ps_client *c = NULL;
    if (apply_client_opts(o, cl, cfg, NULL, extra, nextra) == 0) {
        int rc = ps_client_open(&c, cfg);
        if (rc != PS_OK) {
            fprintf(stderr, "ps-bench: open client: %s: %s\n", ps_strerror(rc), ps_last_error());
            c = NULL;
        }
    }
    ps_config_destroy(cfg);
    return c;
}

/* ---- the measurements --------------------------------------------------------------------- */

typedef struct row {
    size_t bytes;
    cell_result raw;
    cell_result ps[OPK_COUNT];
    int nshards;
} row;

/* The raw baseline's server, started once per run (a child of the bench binary). */
typedef struct raw_server {
    pid_t pid;
    char url[64];
} raw_server;

static int raw_server_start(const bench_opts *o, raw_server *rs)
{
    int port = free_port();
    snprintf(rs->url, sizeof(rs->url), "tcp://127.0.0.1:%d", port);
    char *argv[] = {(char *)o->self, "--raw-server", rs->url, NULL};
    rs->pid = port > 0 ? child_start(argv, NULL, NULL) : -1;
    if (rs->pid < 0 || wait_port(port, rs->pid, 10000) != 0) {
        rs->pid = 0;
        return -1;
    }
    return 0;
}

static void raw_server_stop(raw_server *rs)
{
    if (rs->pid > 0)
        child_stop(rs->pid, 2000);
    rs->pid = 0;
}

static int measure_raw(const bench_opts *o, const raw_server *rs, size_t bytes, cell_result *out)
{
    faults_watch(&rs->pid, 1);
    *out = raw_cell(rs->url, bytes, o->seconds, o->warmup);
    cell_print("raw", 1, bytes, out);
    faults_watch(NULL, 0);
    return out->errors ? -1 : 0;
}

/* One pass over the sizes with a cluster of nservers: for each size the raw baseline (when rs
 * is not NULL) and then the PS operations in kinds, one right after the other, so that the
 * figures compared were taken under the same conditions. */
static int run_pass(const bench_opts *o, int nservers, const raw_server *rs, const size_t *sizes,
                    int nsizes, const bool *kinds, row *rows)
{
    cluster cl;
    if (cluster_start(o, nservers, &cl) != 0)
        return -1;
    ps_client *c = client_open(o, &cl, NULL, 0);
    if (c == NULL) {
        cluster_stop(&cl);
        return -1;
    }
    int failed = 0;
    char tag[32];
    snprintf(tag, sizeof(tag), "s%d", nservers);
    for (int i = 0; i < nsizes && !failed; i++) {
        bench_var bv;
        rows[i].bytes = sizes[i];
        if (rs && measure_raw(o, rs, sizes[i], &rows[i].raw) != 0) {
            failed++;
            break;
        }
        if (bench_var_open(c, &bv, tag, sizes[i]) != 0) {
            failed++;
            break;
        }
        rows[i].nshards = ps_var_num_shards(bv.var);
        faults_watch(cl.pids, cl.n);
        for (int k = 0; k < OPK_COUNT; k++) {
            if (!kinds[k])
                continue;
            rows[i].ps[k] = ps_cell(c, &bv, (enum ps_op_kind)k, o->seconds, o->warmup, o->check);
            cell_print(op_kind_names[k], nservers, sizes[i], &rows[i].ps[k]);
            if (rows[i].ps[k].errors) {
                failed++;
                break;
            }
        }
        faults_watch(NULL, 0);
        if (!failed && bench_var_verify(c, &bv) != 0)
            failed++;
        bench_var_close(&bv);
    }
    ps_client_close(c);
    cluster_stop(&cl);
    return failed ? -1 : 0;
}

static double ratio(const cell_result *a, const cell_result *b)
{
    return a->ran && b->ran && b->gbps > 0 ? a->gbps / b->gbps : 0;
}

static void print_table(int nservers, const row *rows, int n)
{
    char sz[32];
    printf("\n| size | shards | raw GB/s | raw p50 µs | push GB/s | push p50 µs | push p99 µs | "
           "pull GB/s | pull p50 µs | pull p99 µs | push-pull GB/s | push-pull p50 µs | "
           "push-pull p99 µs | push/raw | pull/raw | others' CPU |\n");
    printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        const row *r = &rows[i];
        printf("| %s | %d | %.2f | %.0f |", size_label(r->bytes, sz, sizeof(sz)), r->nshards,
               r->raw.gbps, r->raw.p50_us);
        for (int k = 0; k < OPK_COUNT; k++) {
            const cell_result *c = &r->ps[k];
            if (c->ran)
                printf(" %.2f | %.0f | %.0f |", c->gbps, c->p50_us, c->p99_us);
            else
                printf(" - | - | - |");
        }
        double other = r->raw.other_cpu;
        for (int k = 0; k < OPK_COUNT; k++)
            if (r->ps[k].other_cpu > other)
                other = r->ps[k].other_cpu;
        printf(" %.2f | %.2f | %.0f%% |\n", ratio(&r->ps[OPK_PUSH], &r->raw),
               ratio(&r->ps[OPK_PULL], &r->raw), 100 * other);
    }
    printf("\n(%d server%s; push-pull GB/s counts both directions; ratios are GB/s against the "
           "raw baseline measured just before, same transport; others' CPU: the most CPU other "
           "programs took from the machine during any cell of the row)\n",
           nservers, nservers == 1 ? "" : "s");
}

static const row *find_row(const row *rows, int n, size_t bytes)
{
    for (int i = 0; i < n; i++)
        if (rows[i].bytes == bytes)
            return &rows[i];
    return NULL;
}

static void print_targets(const row *rows, int n)
{
    const row *k4 = find_row(rows, n, 4096), *m1 = find_row(rows, n, 1u << 20),
              *m16 = find_row(rows, n, 16u << 20);
    printf("\nTargets (1 server):\n");
    const row *big[2] = {m1, m16};
    const double min_ratio[2] = {0.9, 2.0};
    for (int j = 0; j < 2; j++) {
        const row *r = big[j];
        if (r == NULL)
            continue;
        char sz[32];
        size_label(r->bytes, sz, sizeof(sz));
        for (int k = 0; k < 2; k++) {
            const cell_result *c = &r->ps[k == 0 ? OPK_PUSH : OPK_PULL];
            double q = ratio(c, &r->raw);
            printf("  %-4s %-6s %.2f GB/s (target >= 2.0): %-4s   %.2fx raw (target >= %.1fx): "
                   "%s\n",
                   k == 0 ? "push" : "pull", sz, c->gbps, c->gbps >= 2.0 ? "met" : "MISS", q,
                   min_ratio[j], q >= min_ratio[j] ? "met" : "MISS");
        }
    }
    if (k4 && k4->raw.p50_us > 0) {
        double q = k4->ps[OPK_PUSH].p50_us / k4->raw.p50_us;
        printf("  push 4 KiB p50 %.0f us = %.2fx the raw round trip of %.0f us (target <= 1.3x): "
               "%s\n",
               k4->ps[OPK_PUSH].p50_us, q, k4->raw.p50_us, q <= 1.3 ? "met" : "MISS");
    }
}

/* ---- allocator variants ------------------------------------------------------------------- */

typedef struct variant_result {
    char desc[512];
    size_t nraw;
    size_t raw_bytes[MAX_LIST];
    cell_result raw[MAX_LIST];
    cell_result push, pull;
    bool ok;
} variant_result;

static void emit(const char *tag, size_t bytes, const cell_result *c)
{
    printf("@@%s %zu %.6f %.3f %.3f %d %.2f %.2f\n", tag, bytes, c->gbps, c->p50_us, c->p99_us,
           c->ran ? c->errors : 1, c->client_faults, c->server_faults);
}

/* In the child: the raw baseline at every size and push and pull at compare_size with one
 * server, reported as "@@" lines for the parent. */
static int variant_child_main(const bench_opts *o)
{
    char desc[512];
    malloc_describe(desc, sizeof(desc));
    printf("@@malloc %s\n", desc);
    row rows[MAX_LIST];
    memset(rows, 0, sizeof(rows));
    raw_server rs;
    int rc = raw_server_start(o, &rs);
    for (int i = 0; i < o->nsizes && rc == 0; i++) {
        rows[i].bytes = o->sizes[i];
        rc = measure_raw(o, &rs, o->sizes[i], &rows[i].raw);
    }
    raw_server_stop(&rs);
    for (int i = 0; i < o->nsizes; i++)
        emit("raw", o->sizes[i], &rows[i].raw);
    row ps;
    memset(&ps, 0, sizeof(ps));
    const bool kinds[OPK_COUNT] = {true, true, false};
    if (run_pass(o, 1, NULL, &o->compare_size, 1, kinds, &ps) != 0)
        rc = -1;
    emit("push", o->compare_size, &ps.ps[OPK_PUSH]);
    emit("pull", o->compare_size, &ps.ps[OPK_PULL]);
    fflush(stdout);
    return rc == 0 ? 0 : 1;
}

static void parse_result(const char *s, cell_result *c, size_t *bytes)
{
    memset(c, 0, sizeof(*c));
    if (sscanf(s, "%zu %lf %lf %lf %d %lf %lf", bytes, &c->gbps, &c->p50_us, &c->p99_us, &c->errors,
               &c->client_faults, &c->server_faults) == 7 &&
        c->errors == 0)
        c->ran = true;
}

static int run_variant(const bench_opts *o, const variant *v, variant_result *vr)
{
    memset(vr, 0, sizeof(*vr));
    printf("\nallocator variant \"%s\" (MALLOC_CONF=%s), a fresh bench process and servers:\n",
           v->label, v->conf);
    fflush(stdout);
    char a_seconds[32], a_warmup[32], a_sizes[512] = "", a_cmp[32];
    snprintf(a_seconds, sizeof(a_seconds), "--seconds=%g", o->seconds);
    snprintf(a_warmup, sizeof(a_warmup), "--warmup=%g", o->warmup);
    snprintf(a_cmp, sizeof(a_cmp), "--compare-size=%zu", o->compare_size);
    snprintf(a_sizes, sizeof(a_sizes), "--sizes=");
    for (int i = 0; i < o->nsizes; i++) {
        size_t len = strlen(a_sizes);
        snprintf(a_sizes + len, sizeof(a_sizes) - len, "%s%zu", i ? "," : "", o->sizes[i]);
    }
    char a_server[PATH_MAX + 16], a_split[64];
    snprintf(a_server, sizeof(a_server), "--server-bin=%s", v->server_bin);
    snprintf(a_split, sizeof(a_split), "--split-threshold=%s", o->split_threshold);
    char *argv[16 + 2 * MAX_OPTS];
    int k = 0;
    argv[k++] = (char *)v->bench_bin;
    argv[k++] = "--variant-child";
    argv[k++] = a_server;
    argv[k++] = a_seconds;
    argv[k++] = a_warmup;
    argv[k++] = a_sizes;
    argv[k++] = a_cmp;
    argv[k++] = a_split;
    char a_wait[48];
    snprintf(a_wait, sizeof(a_wait), "--wait-idle=%g", idle_wait_s);
    argv[k++] = a_wait;
    char a_trials[32];
    snprintf(a_trials, sizeof(a_trials), "--trials=%d", cell_trials);
    argv[k++] = a_trials;
    for (int i = 0; i < o->nclient_opts; i++) {
        argv[k++] = "--client-opt";
        argv[k++] = (char *)o->client_opts[i];
    }
    for (int i = 0; i < o->nserver_opts; i++) {
        argv[k++] = "--server-opt";
        argv[k++] = (char *)o->server_opts[i];
    }
    argv[k] = NULL;
    char envbuf[300];
    snprintf(envbuf, sizeof(envbuf), "MALLOC_CONF=%s", v->conf);
    char *env[] = {envbuf, NULL};
    int fd;
    pid_t pid = child_start(argv, env, &fd);
    if (pid < 0)
        return -1;
    FILE *f = fdopen(fd, "r");
    char line[1024];
    while (f && fgets(line, sizeof(line), f)) {
        size_t bytes;
        if (strncmp(line, "@@malloc ", 9) == 0) {
            snprintf(vr->desc, sizeof(vr->desc), "%.500s", line + 9);
            vr->desc[strcspn(vr->desc, "\n")] = '\0';
            printf("  %s\n", vr->desc);
        } else if (strncmp(line, "@@raw ", 6) == 0 && vr->nraw < MAX_LIST) {
            parse_result(line + 6, &vr->raw[vr->nraw], &bytes);
            vr->raw_bytes[vr->nraw++] = bytes;
        } else if (strncmp(line, "@@push ", 7) == 0) {
            parse_result(line + 7, &vr->push, &bytes);
        } else if (strncmp(line, "@@pull ", 7) == 0) {
            parse_result(line + 7, &vr->pull, &bytes);
        } else {
            printf("  %s", line);
        }
        fflush(stdout);
    }
    if (f)
        fclose(f);
    int rc = child_wait(pid, (int)(60 * 1000 + o->seconds * 1000 * 4 * (o->nsizes + 4)));
    vr->ok = rc == 0;
    return vr->ok ? 0 : -1;
}

static void print_variants(const bench_opts *o, const variant_result *vr, int nv)
{
    char sz[32], num[32];
    printf("\n| allocator (bench client and servers) |");
    for (int i = 0; i < o->nsizes; i++)
        printf(" raw %s GB/s |", size_label(o->sizes[i], sz, sizeof(sz)));
    size_label(o->compare_size, sz, sizeof(sz));
    printf(" push %s GB/s | pull %s GB/s | faults/op raw %s | faults/op push | faults/op pull "
           "|\n",
           sz, sz, sz);
    printf("|---|");
    for (int i = 0; i < o->nsizes + 5; i++)
        printf("---:|");
    printf("\n");
    for (int v = 0; v < nv; v++) {
        printf("| %s |", o->variants[v].label);
        const cell_result *cmp = NULL;
        for (int i = 0; i < o->nsizes; i++) {
            const cell_result *c = NULL;
            for (size_t j = 0; j < vr[v].nraw; j++)
                if (vr[v].raw_bytes[j] == o->sizes[i])
                    c = &vr[v].raw[j];
            if (c && c->ran)
                snprintf(num, sizeof(num), "%.2f", c->gbps);
            else
                snprintf(num, sizeof(num), "failed");
            if (o->sizes[i] == o->compare_size)
                cmp = c;
            printf(" %s |", num);
        }
        const cell_result *cells[3] = {&vr[v].push, &vr[v].pull, cmp};
        for (int k = 0; k < 2; k++) {
            if (cells[k]->ran)
                printf(" %.2f |", cells[k]->gbps);
            else
                printf(" failed |");
        }
        const cell_result *fl[3] = {cmp, &vr[v].push, &vr[v].pull};
        for (int k = 0; k < 3; k++) {
            if (fl[k] && fl[k]->ran)
                printf(" %.0f / %.0f |", fl[k]->client_faults, fl[k]->server_faults);
            else
                printf(" - |");
        }
        printf("\n");
    }
    printf("\n(faults/op: minor page faults per operation, client / server processes; 1 server)\n");
    for (int v = 0; v < nv; v++)
        printf("- %s: MALLOC_CONF=\"%s\" -> %s\n", o->variants[v].label, o->variants[v].conf,
               vr[v].desc);
}

/* ---- sweep of client settings ------------------------------------------------------------- */

static int run_sweep(const bench_opts *o)
{
    cluster cl;
    if (cluster_start(o, 1, &cl) != 0)
        return -1;
    int failed = 0;
    ps_client *c0 = client_open(o, &cl, NULL, 0);
    bench_var vars[MAX_LIST];
    int nvars = 0;
    for (int i = 0; c0 && i < o->nsweep_sizes; i++) {
        if (bench_var_open(c0, &vars[i], "sweep", o->sweep_sizes[i]) != 0)
            failed++;
        else
            nvars++;
    }
    if (c0 == NULL || failed) {
        ps_client_close(c0);
        cluster_stop(&cl);
        return -1;
    }
    faults_watch(cl.pids, cl.n);
    /* results[chunk][conn][size][push|pull|push-pull] */
    static cell_result res[MAX_LIST][MAX_LIST][MAX_LIST][OPK_COUNT];
    for (int ch = 0; ch < o->nsweep_chunks && !failed; ch++) {
        for (int cn = 0; cn < o->nsweep_conns && !failed; cn++) {
            char chunk[32], conns[16];
            snprintf(chunk, sizeof(chunk), "%zu", o->sweep_chunks[ch]);
            snprintf(conns, sizeof(conns), "%d", o->sweep_conns[cn]);
            const char *extra[] = {"chunk-bytes", chunk, "connections", conns};
            ps_client *c = client_open(o, &cl, extra, 2);
            if (c == NULL) {
                failed++;
                break;
            }
            printf("-- chunk-bytes=%zu connections=%d\n", o->sweep_chunks[ch], o->sweep_conns[cn]);
            for (int i = 0; i < nvars && !failed; i++) {
                if (bench_var_rebind(c, &vars[i], "sweep") != 0) {
                    failed++;
                    break;
                }
                for (int k = 0; k < OPK_COUNT; k++) {
                    if (!o->kinds[k])
                        continue;
                    cell_result *r = &res[ch][cn][i][k];
                    *r = ps_cell(c, &vars[i], (enum ps_op_kind)k, o->seconds, o->warmup, o->check);
                    cell_print(op_kind_names[k], 1, vars[i].bytes, r);
                    failed += r->errors != 0;
                }
            }
            ps_client_close(c);
        }
    }
    for (int i = 0; i < nvars && !failed; i++)
        if (bench_var_rebind(c0, &vars[i], "sweep") != 0 || bench_var_verify(c0, &vars[i]) != 0)
            failed++;
    char sz[32];
    printf("\n| chunk-bytes | connections |");
    int ncols = 0;
    for (int i = 0; i < nvars; i++) {
        size_label(vars[i].bytes, sz, sizeof(sz));
        for (int k = 0; k < OPK_COUNT; k++) {
            if (o->kinds[k]) {
                printf(" %s %s GB/s |", op_kind_names[k], sz);
                ncols++;
            }
        }
    }
    printf(" others' CPU |\n|---:|---:|");
    for (int i = 0; i <= ncols; i++)
        printf("---:|");
    printf("\n");
    for (int ch = 0; ch < o->nsweep_chunks; ch++) {
        for (int cn = 0; cn < o->nsweep_conns; cn++) {
            printf("| %s | %d |", size_label(o->sweep_chunks[ch], sz, sizeof(sz)),
                   o->sweep_conns[cn]);
            double other = 0;
            for (int i = 0; i < nvars; i++) {
                for (int k = 0; k < OPK_COUNT; k++) {
                    if (!o->kinds[k])
                        continue;
                    printf(" %.2f |", res[ch][cn][i][k].gbps);
                    if (res[ch][cn][i][k].other_cpu > other)
                        other = res[ch][cn][i][k].other_cpu;
                }
            }
            printf(" %.0f%% |\n", 100 * other);
        }
    }
    for (int i = 0; i < nvars; i++)
        bench_var_close(&vars[i]);
    ps_client_close(c0);
    cluster_stop(&cl);
    return failed ? -1 : 0;
}

/* ---- main --------------------------------------------------------------------------------- */

static void cpu_model(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *p = strchr(line, ':');
            if (p) {
                snprintf(buf, cap, "%s", p + 2);
                buf[strcspn(buf, "\n")] = '\0';
            }
            break;
        }
    }
    if (f)
        fclose(f);
}

/* CPU time of the whole machine and of this process tree, to tell how much of the run other
 * programs took: the bench shares the machine's cores with whatever else runs. */
typedef struct cpu_mark {
    double busy_s, total_s, ours_s;
} cpu_mark;

static void cpu_mark_take(cpu_mark *m)
{
    memset(m, 0, sizeof(*m));
    machine_cpu(&m->busy_s, &m->total_s);
    struct rusage self, kids;
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_CHILDREN, &kids);
    m->ours_s = (double)(self.ru_utime.tv_sec + self.ru_stime.tv_sec + kids.ru_utime.tv_sec +
                         kids.ru_stime.tv_sec) +
                (double)(self.ru_utime.tv_usec + self.ru_stime.tv_usec + kids.ru_utime.tv_usec +
                         kids.ru_stime.tv_usec) /
                    1e6;
}

static void cpu_mark_report(const cpu_mark *a, const cpu_mark *b)
{
    double total = b->total_s - a->total_s, busy = b->busy_s - a->busy_s;
    double ours = b->ours_s - a->ours_s;
    if (total <= 0)
        return;
    double other = busy > ours ? busy - ours : 0;
    printf("\nCPU during the run: machine %.0f%% busy; this benchmark (all its processes) %.0f%%, "
           "other programs %.0f%%%s\n",
           100 * busy / total, 100 * ours / total, 100 * other / total,
           other / total > 0.05 ? " (figures disturbed: other programs shared the cores)" : "");
}

static void print_header(const bench_opts *o, const char *malloc_desc)
{
    char cpu[256], date[64];
    cpu_model(cpu, sizeof(cpu));
    struct utsname u;
    uname(&u);
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M:%S", localtime(&now));
    printf("ps-bench %s (libpsclient %s), %s\n", PSD_VERSION, ps_version(), date);
    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    printf("machine: %ld online CPUs (nproc), %s, Linux %s, loopback TCP; load average %.2f\n",
           sysconf(_SC_NPROCESSORS_ONLN), cpu, u.release, load[0]);
    printf("allocator: %s\n", malloc_desc);
    options *opts;
    if (options_create(&opts, OPT_SCOPE_CLIENT) == 0) {
        if (apply_client_opts(o, NULL, NULL, opts, NULL, 0) == 0)
            printf("client: connections=%s chunk-bytes=%s split-threshold-bytes=%s\n",
                   opt_text(opts, OPT_CONNECTIONS), opt_text(opts, OPT_CHUNK_BYTES),
                   opt_text(opts, OPT_SPLIT_THRESHOLD_BYTES));
        options_destroy(opts);
    }
    if (window_ops)
        printf("experiment: tensors over %zu bytes moved as range operations of that size, %zu in "
               "flight (--window)\n",
               window_bytes, window_ops);
    printf("server: %s", o->server_bin);
    for (int i = 0; i < o->nserver_opts; i++)
        printf(" --%s", o->server_opts[i]);
    printf(" (other settings at their defaults)\n");
    printf("cells: best of %d trials of %.2f s after %.2f s of warm-up, each cell after waiting "
           "up to %g s for the machine to be idle; 1 GB = 1e9 bytes\n\n",
           cell_trials, o->seconds, o->warmup, idle_wait_s);
    fflush(stdout);
}

static int add_variant(bench_opts *o, const char *label, const char *conf, const char *bench_bin,
                       const char *server_bin)
{
    if (o->nvariants == MAX_LIST)
        return -1;
    variant *v = &o->variants[o->nvariants++];
    snprintf(v->label, sizeof(v->label), "%s", label);
    snprintf(v->conf, sizeof(v->conf), "%s", conf);
    snprintf(v->bench_bin, sizeof(v->bench_bin), "%s", bench_bin);
    snprintf(v->server_bin, sizeof(v->server_bin), "%s", server_bin);
    return 0;
}

/* Adds every item of a NAME=VALUE list to names[], checking the form; returns 0 or -1. */
static int add_assignments(const options *opts, opt_list_id id, const char **names, int *n)
{
    const char *const *items;
    size_t count = opt_list(opts, id, &items);
    for (size_t i = 0; i < count; i++) {
        const char *eq = strchr(items[i], '=');
        if (eq == NULL || eq == items[i] || *n == MAX_OPTS) {
            fprintf(stderr, "ps-bench: bad value \"%s\" for --%s (NAME=VALUE)\n", items[i],
                    opt_def(id)->name);
            return -1;
        }
        names[(*n)++] = items[i];
    }
    return 0;
}

/* Reads a list setting with parse(); on error names the flag. */
#define PARSE_LIST_OPT(id, call)                                                                   \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            fprintf(stderr, "ps-bench: bad value \"%s\" for --%s\n", opt_text(o->opts, id),        \
                    opt_def(id)->name);                                                            \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static int parse_args(bench_opts *o, int argc, char **argv)
{
    char err[512];
    if (program_wants_version(argc, argv)) {
        program_print_version(stdout, "ps-bench");
        exit(0);
    }
    ssize_t n = readlink("/proc/self/exe", o->self, sizeof(o->self) - 1);
    if (n <= 0) {
        fprintf(stderr, "ps-bench: cannot read /proc/self/exe\n");
        return -1;
    }
    o->self[n] = '\0';
    if (options_create(&o->opts, OPT_SCOPE_TOOL) != 0) {
        fprintf(stderr, "ps-bench: out of memory\n");
        return -1;
    }
    int rc = options_load(o->opts, argc, argv, NULL, NULL, err, sizeof(err));
    if (rc == OPTIONS_HELP) {
        options_print_help(stdout, "ps-bench", usage_line, OPT_SCOPE_TOOL);
        exit(0);
    }
    if (rc != 0) {
        fprintf(stderr, "ps-bench: %s (see --help)\n", err);
        return -1;
    }
    const options *opts = o->opts;
    if (opt_str(opts, OPT_BENCH_RAW_SERVER)[0] != '\0')
        exit(raw_server_main(opt_str(opts, OPT_BENCH_RAW_SERVER)));
    if (opt_str(opts, OPT_BENCH_SERVER_BIN)[0] != '\0') {
        snprintf(o->server_bin, sizeof(o->server_bin), "%s", opt_str(opts, OPT_BENCH_SERVER_BIN));
    } else {
        snprintf(o->server_bin, sizeof(o->server_bin), "%s", o->self);
        char *slash = strrchr(o->server_bin, '/');
        snprintf(slash + 1, sizeof(o->server_bin) - (size_t)(slash + 1 - o->server_bin),
                 "../server/ps-server");
    }
    o->quick = opt_bool(opts, OPT_BENCH_QUICK);
    o->sweep = opt_bool(opts, OPT_BENCH_SWEEP);
    o->check = opt_bool(opts, OPT_BENCH_CHECK);
    o->no_variants = opt_bool(opts, OPT_BENCH_NO_VARIANTS);
    o->variant_child = opt_bool(opts, OPT_BENCH_VARIANT_CHILD);
    o->no_raw = opt_bool(opts, OPT_BENCH_NO_RAW);
    raw_copy = !opt_bool(opts, OPT_BENCH_RAW_NOCOPY);
    o->seconds = opt_double(opts, OPT_BENCH_SECONDS);
    o->warmup = opt_double(opts, OPT_BENCH_WARMUP);
    PARSE_LIST_OPT(OPT_BENCH_SIZES,
                   parse_size_list(opt_str(opts, OPT_BENCH_SIZES), o->sizes, &o->nsizes));
    PARSE_LIST_OPT(OPT_BENCH_SERVERS, parse_int_list(opt_str(opts, OPT_BENCH_SERVERS), o->servers,
                                                     &o->nservers, 1, MAX_SERVERS));
    PARSE_LIST_OPT(OPT_BENCH_SWEEP_CONNECTIONS,
                   parse_int_list(opt_str(opts, OPT_BENCH_SWEEP_CONNECTIONS), o->sweep_conns,
                                  &o->nsweep_conns, 1, 64));
    PARSE_LIST_OPT(OPT_BENCH_SWEEP_CHUNKS, parse_size_list(opt_str(opts, OPT_BENCH_SWEEP_CHUNKS),
                                                           o->sweep_chunks, &o->nsweep_chunks));
    PARSE_LIST_OPT(OPT_BENCH_SWEEP_SIZES, parse_size_list(opt_str(opts, OPT_BENCH_SWEEP_SIZES),
                                                          o->sweep_sizes, &o->nsweep_sizes));
    {
        char buf[128];
        bool bad = false;
        snprintf(buf, sizeof(buf), "%s", opt_str(opts, OPT_BENCH_OPS));
        memset(o->kinds, 0, sizeof(o->kinds));
        for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && !bad;
             tok = strtok_r(NULL, ",", &save)) {
            int k = 0;
            while (k < OPK_COUNT && strcmp(tok, op_kind_names[k]) != 0)
                k++;
            bad = k == OPK_COUNT;
            if (!bad)
                o->kinds[k] = true;
        }
        PARSE_LIST_OPT(OPT_BENCH_OPS, bad ? -1 : 0);
    }
    if (opt_str(opts, OPT_BENCH_WINDOW)[0] != '\0') {
        const char *val = opt_str(opts, OPT_BENCH_WINDOW);
        char *end;
        window_ops = strtoul(val, &end, 10);
        window_bytes = (size_t)1 << 20;
        PARSE_LIST_OPT(
            OPT_BENCH_WINDOW,
            window_ops == 0 || (*end && (*end != ':' || parse_size(end + 1, &window_bytes))) ? -1
                                                                                             : 0);
    }
    o->split_threshold = opt_text(opts, OPT_BENCH_SPLIT_THRESHOLD);
    o->compare_size = (size_t)opt_int(opts, OPT_BENCH_COMPARE_SIZE);
    o->timeout_s = (unsigned)opt_int(opts, OPT_BENCH_TIMEOUT);
    cell_trials = (int)opt_int(opts, OPT_BENCH_TRIALS);
    idle_wait_s = opt_double(opts, OPT_BENCH_WAIT_IDLE);
    /* Client settings: --connections and --chunk-bytes (rows of the client table), then
     * every --client-opt. */
    const opt_int_id client_flags[2] = {OPT_CONNECTIONS, OPT_CHUNK_BYTES};
    for (int j = 0; j < 2; j++) {
        if (!opt_is_set(opts, client_flags[j]))
            continue;
        snprintf(o->client_flag_opts[j], sizeof(o->client_flag_opts[j]), "%s=%s",
                 opt_def(client_flags[j])->name, opt_text(opts, client_flags[j]));
        o->client_opts[o->nclient_opts++] = o->client_flag_opts[j];
    }
    if (add_assignments(opts, OPT_BENCH_CLIENT_OPT, o->client_opts, &o->nclient_opts) != 0 ||
        add_assignments(opts, OPT_BENCH_SERVER_OPT, o->server_opts, &o->nserver_opts) != 0)
        return -1;
    const char *const *variants;
    size_t nvariants = opt_list(opts, OPT_BENCH_MALLOC_VARIANT, &variants);
    for (size_t i = 0; i < nvariants; i++) {
        const char *val = variants[i], *e = strchr(val, '=');
        char label[80];
        if (e != NULL && e != val)
            snprintf(label, sizeof(label), "%.*s", (int)(e - val), val);
        if (e == NULL || e == val || add_variant(o, label, e + 1, "", "") != 0) {
            fprintf(stderr, "ps-bench: bad value \"%s\" for --malloc-variant (LABEL=MALLOC_CONF)\n",
                    val);
            return -1;
        }
    }
    const char *glibc_build = opt_str(opts, OPT_BENCH_GLIBC_BUILD)[0] != '\0'
                                  ? opt_str(opts, OPT_BENCH_GLIBC_BUILD)
                                  : NULL;
    bool explicit_seconds = opt_is_set(opts, OPT_BENCH_SECONDS);
    bool explicit_wait = opt_is_set(opts, OPT_BENCH_WAIT_IDLE);
    bool explicit_trials = opt_is_set(opts, OPT_BENCH_TRIALS);
    if (!explicit_wait && o->quick)
        idle_wait_s = 0;
    if (!explicit_trials && o->quick)
        cell_trials = 1;
    if (o->quick) {
        /* Small enough for a test suite; the 64 KiB and 256 KiB tensors are still split over
         * two servers and cut in several chunks, so every path of the client is taken. */
        if (!explicit_seconds)
            o->seconds = 0.05;
        o->warmup = 0.01;
        o->check = true;
        parse_size_list("4K,64K,256K", o->sizes, &o->nsizes);
        o->compare_size = 256u << 10;
        o->split_threshold = "64K";
        static const char *quick_opts[] = {"chunk-bytes=32K", "connections=2"};
        for (int j = 0; j < 2 && o->nclient_opts < MAX_OPTS; j++)
            o->client_opts[o->nclient_opts++] = quick_opts[j];
        if (!opt_is_set(opts, OPT_BENCH_TIMEOUT))
            o->timeout_s = 50;
    }
    if (o->nvariants == 0 && !o->variant_child) {
        /* The same cells in fresh processes, one after the other, so that the rows compare
         * like with like. */
        if (!o->quick) {
            add_variant(o, "project settings (jemalloc_conf.h)", "", "", "");
            /* calloc then zeroes recycled extents by purging them (jemalloc_conf.h) */
            add_variant(o, "project settings but thp:default", "thp:default", "", "");
        }
        add_variant(o, "jemalloc defaults", JEMALLOC_DEFAULTS, "", "");
    }
    if (glibc_build) {
        char b[PATH_MAX], s[PATH_MAX];
        snprintf(b, sizeof(b), "%s/bench/ps-bench", glibc_build);
        snprintf(s, sizeof(s), "%s/server/ps-server", glibc_build);
        add_variant(o, "glibc malloc", "", b, s);
    }
    for (int v = 0; v < o->nvariants; v++) {
        if (o->variants[v].bench_bin[0] == '\0')
            snprintf(o->variants[v].bench_bin, sizeof(o->variants[v].bench_bin), "%s", o->self);
        if (o->variants[v].server_bin[0] == '\0')
            snprintf(o->variants[v].server_bin, sizeof(o->variants[v].server_bin), "%s",
                     o->server_bin);
    }
    if (access(o->server_bin, X_OK) != 0) {
        fprintf(stderr, "ps-bench: server binary %s: %s (use --server-bin)\n", o->server_bin,
                strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static bench_opts o;
    if (parse_args(&o, argc, argv) != 0)
        return 2;
    children_install_guard(o.timeout_s);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (o.variant_child)
        return variant_child_main(&o);

    char desc[512];
    cpu_mark mark0, mark1;
    cpu_mark_take(&mark0);
    malloc_describe(desc, sizeof(desc));
    print_header(&o, desc);
    int failed = 0;
    if (o.sweep) {
        failed = run_sweep(&o) != 0;
        printf("\n%s\n", failed ? "FAILED" : "ok");
        children_kill_all();
        return failed ? 1 : 0;
    }

    static row rows[MAX_LIST][MAX_LIST];
    raw_server rs = {0};
    if (!o.no_raw && raw_server_start(&o, &rs) != 0)
        failed++;
    for (int s = 0; s < o.nservers && !failed; s++)
        if (run_pass(&o, o.servers[s], o.no_raw ? NULL : &rs, o.sizes, o.nsizes, o.kinds,
                     rows[s]) != 0)
            failed++;
    raw_server_stop(&rs);

    variant_result vr[MAX_LIST];
    int nv = o.no_variants ? 0 : o.nvariants;
    for (int v = 0; v < nv; v++)
        if (run_variant(&o, &o.variants[v], &vr[v]) != 0)
            failed++;

    for (int s = 0; s < o.nservers; s++) {
        printf("\n### %d server%s\n", o.servers[s], o.servers[s] == 1 ? "" : "s");
        print_table(o.servers[s], rows[s], o.nsizes);
        if (o.servers[s] == 1)
            print_targets(rows[s], o.nsizes);
    }
    if (nv > 0) {
        printf("\n### Allocator\n");
        print_variants(&o, vr, nv);
    }
    children_kill_all();
    cpu_mark_take(&mark1);
    cpu_mark_report(&mark0, &mark1);
    printf("\n%s\n", failed ? "FAILED: some operation failed or returned wrong values"
                            : "ok: every operation succeeded and every value checked is right");
    children_kill_all();
    return failed ? 1 : 0;
}
