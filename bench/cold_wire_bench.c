/* Cold tier over the wire (not a test): a table larger than its RAM share on one ps-server,
 * against the same workload on the table wholly in RAM, in one run.
 *
 * For each mode (ram: ram_rows 0; cold: ram_rows = PCT% of ROWS), one ps-server started here
 * (loopback, its cold-dir and checkpoint-dir under DIR) holds a table of dim DIM with OPTIMIZER,
 * and one client:
 *   fill       makes the ROWS rows by first touch (pushes of BATCH sequential ranks): rows/s;
 *   warm-up    pushes, then pulls, K batches of BATCH ids drawn Zipf(S) over the ROWS ids;
 *   pull       pulls K fresh batches (new draws of the same distribution): ids/s (a batch's
 *              duplicates counted, as a client sends them) and the RAM hit rate, 1 - cold
 *              hits / lookups of the servers' counters over the phase (ps_table_info: the
 *              distinct ids of each request);
 *   pull+pre   K fresh batches pulled, each batch's TablePrefetch started before the pull of
 *              the batch before it (ps_table_prefetch_async): what prefetching the next step
 *              saves;
 *   push       pushes K fresh batches: ids/s, and the hit rate over the distinct ids sent;
 *              for pull and push also the server's CPU seconds over the phase (user and
 *              system, /proc/PID/stat): less sensitive than ids/s to other work on a shared
 *              machine;
 *   ckpt full  a checkpoint (Checkpoint RPC, answered once durable): seconds and bytes written,
 *              and the server's peak resident memory during it above its resident memory
 *              before (its peak reset first: /proc/PID/clear_refs);
 *   ckpt 1%    ROWS/100 rows updated (every 100th rank), then a checkpoint: seconds and bytes
 *              (a delta for the table in RAM; a table with a cold tier: its RAM rows, and a
 *              copy of its store whose files are mostly hard links to the previous copy's,
 *              not counted again).
 * Bytes: of the files a checkpoint added to the checkpoint directory, each file once (a full
 * checkpoint's copy of a cold store is hard links to the store's files: counted, though the
 * store wrote them, not the checkpoint).
 * The RAM mode is skipped with --no-ram (a table too large for this machine's memory).
 *
 * usage: ps-cold-wire-bench PS_SERVER [--rows N] [--dim D] [--pct P] [--batch B]
 *                           [--batches K] [--zipf S] [--optimizer adagrad] [--dir DIR]
 *                           [--no-ram] [--quick]
 * Defaults: 2x10^6 rows, dim 16, 10%, 8,192 ids a request, 100 batches, Zipf 1.1, adagrad,
 * DIR /tmp. --quick: 50,000 rows, 10 batches (a smoke run; exit 77 without RocksDB). */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cluster_proc.h"
#include "cold_store.h"
#include "psclient.h"
#include "zipf.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct config {
    const char *server;
    uint64_t rows;
    uint32_t dim, pct, batch, batches;
    double zipf;
    ps_optimizer opt;
    const char *dir;
    bool no_ram, quick;
} config;

#define TABLE "bench/cold"

/* What one mode measured. */
typedef struct result {
    bool ran;
    double fill, pull, pull_pre, push;  /* rows/s, ids/s */
    double pull_hit, pre_hit, push_hit; /* RAM hit rates */
    double pull_cpu, push_cpu;          /* the server's CPU seconds over the phase */
    double ck_s, ck1_s;                 /* seconds: full checkpoint, after a 1% change */
    uint64_t ck_bytes, ck1_bytes;
    uint64_t rows_disk;
    double ck_rss_mb; /* the server's peak resident memory during the full checkpoint, above its
                       * resident memory before it (MB; -1: not readable) */
} result;

static ps_client *open_client(const test_cluster *tc)
{
    char tf[1200];
    test_cluster_tf_config(tc, NULL, 0, tf, sizeof(tf));
    ps_config *cfg = NULL;
    ps_client *cl = NULL;
    if (ps_config_create(&cfg) != PS_OK)
        return NULL;
    ps_config_set(cfg, "cluster", tf);
    ps_config_set(cfg, "deadline-ms", "3600000");
    ps_config_set(cfg, "max-message-bytes", "256M");
    /* No resend while a long call (a checkpoint of a large table) runs: each would start
     * another checkpoint. */
    ps_config_set(cfg, "resend-ms", "3600000");
    if (ps_client_open(&cl, cfg) != PS_OK) {
        fprintf(stderr, "ps_client_open: %s\n", ps_last_error());
        cl = NULL;
    }
    ps_config_destroy(cfg);
    return cl;
}

static int info(ps_client *cl, ps_table_info *out)
{
    memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    int rc = ps_table_info_get(cl, TABLE, out);
    if (rc != PS_OK)
        fprintf(stderr, "ps_table_info_get: %s\n", ps_last_error());
    return rc;
}

/* Calls on tb, two in flight: pushes of g, or pulls into out (two batches of room), of the
 * `batches` batches ids[k * batch ..]; with pre, batch k + 1's prefetch is started before
 * batch k's pull. Returns seconds, or -1. */
static double calls(ps_table *tb, bool push, bool pre, const int64_t *ids, size_t batch,
                    uint32_t batches, const float *g, float *out, size_t dim)
{
    enum { INFLIGHT = 2 };
    ps_op *ops[INFLIGHT] = {0}, *pf[INFLIGHT] = {0};
    double t0 = now_s();
    int rc = PS_OK;
    if (pre && batches > 0)
        rc = ps_table_prefetch_async(tb, ids, batch, NULL, NULL, &pf[0]);
    for (uint32_t k = 0; k < batches + INFLIGHT && rc == PS_OK; k++) {
        int slot = (int)(k % INFLIGHT);
        if (ops[slot] != NULL) {
            rc = ps_op_wait(ops[slot]);
            if (rc != PS_OK)
                fprintf(stderr, "%s: %s\n", push ? "push" : "pull", ps_op_message(ops[slot]));
            ps_op_destroy(ops[slot]);
            ops[slot] = NULL;
        }
        if (k >= batches || rc != PS_OK)
            continue;
        if (pre && k + 1 < batches) {
            int ps = (int)((k + 1) % INFLIGHT);
            if (pf[ps] != NULL) {
                (void)ps_op_wait(pf[ps]);
                ps_op_destroy(pf[ps]);
                pf[ps] = NULL;
            }
            rc = ps_table_prefetch_async(tb, ids + (size_t)(k + 1) * batch, batch, NULL, NULL,
                                         &pf[ps]);
        }
        const int64_t *b = ids + (size_t)k * batch;
        if (rc == PS_OK)
            rc = push ? ps_table_push_async(tb, b, batch, g, NULL, NULL, &ops[slot])
                      : ps_table_pull_async(tb, b, batch, out + (size_t)slot * batch * dim, NULL,
                                            NULL, &ops[slot]);
        if (rc != PS_OK)
            fprintf(stderr, "%s: %s\n", push ? "push" : "pull", ps_last_error());
    }
    double dt = now_s() - t0;
    for (int i = 0; i < INFLIGHT; i++) {
        ps_op_destroy(ops[i]);
        if (pf[i] != NULL)
            (void)ps_op_wait(pf[i]);
        ps_op_destroy(pf[i]);
    }
    return rc == PS_OK ? dt : -1;
}

/* Pushes of the ranks first, first + step, ... below rows (their ids), batch at a time. */
static double push_ranks(ps_table *tb, uint64_t rows, uint64_t step, size_t batch, const float *g)
{
    int64_t *ids = malloc(batch * sizeof(*ids));
    if (ids == NULL)
        return -1;
    double t0 = now_s();
    uint64_t r = 0;
    int rc = PS_OK;
    while (r < rows && rc == PS_OK) {
        size_t n = 0;
        for (; n < batch && r < rows; r += step)
            ids[n++] = zipf_rank_id(r);
        rc = ps_table_push(tb, ids, n, g);
        if (rc != PS_OK)
            fprintf(stderr, "push: %s\n", ps_last_error());
    }
    free(ids);
    return rc == PS_OK ? now_s() - t0 : -1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Distinct ids of each batch, summed (what the servers see: the client sends each once). */
static uint64_t distinct_ids(const int64_t *ids, size_t batch, uint32_t batches)
{
    int64_t *tmp = malloc(batch * sizeof(*tmp));
    uint64_t n = 0;
    for (uint32_t k = 0; tmp && k < batches; k++) {
        memcpy(tmp, ids + (size_t)k * batch, batch * sizeof(*tmp));
        qsort(tmp, batch, sizeof(*tmp), cmp_i64);
        for (size_t i = 0; i < batch; i++)
            n += i == 0 || tmp[i] != tmp[i - 1];
    }
    free(tmp);
    return n;
}

/* Files already counted: their inodes (a file hard-linked into a later checkpoint's copy of
 * the cold store is not written again). */
typedef struct seen_set {
    ino_t *ino;
    size_t n, cap;
} seen_set;

/* Adds the bytes of the files under path (a file, or a directory walked depth levels down)
 * whose inode is not in *seen to *n, and their inodes to *seen. */
static void walk_new(const char *path, int depth, seen_set *seen, uint64_t *n)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return;
    if (S_ISDIR(sb.st_mode)) {
        DIR *d = depth > 0 ? opendir(path) : NULL;
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char sub[1400];
            snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
            walk_new(sub, depth - 1, seen, n);
        }
        if (d)
            closedir(d);
        return;
    }
    for (size_t i = 0; i < seen->n; i++)
        if (seen->ino[i] == sb.st_ino)
            return;
    if (seen->n == seen->cap) {
        size_t nc = seen->cap ? 2 * seen->cap : 256;
        ino_t *ni = realloc(seen->ino, nc * sizeof(*ni));
        if (ni == NULL)
            return;
        seen->ino = ni;
        seen->cap = nc;
    }
    seen->ino[seen->n++] = sb.st_ino;
    *n += (uint64_t)sb.st_size;
}

/* Bytes of the files in dir's checkpoints (ckpt-*: the files and their copies of cold stores,
 * ckpt-T-N.cold/I/FILE) not counted before: what a checkpoint added to dir, a file linked
 * from an earlier checkpoint's copy not counted again. */
static uint64_t new_bytes(const char *dir, seen_set *seen)
{
    DIR *d = opendir(dir);
    uint64_t n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "ckpt-", 5) != 0)
            continue;
        char path[1200];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        walk_new(path, 2, seen, &n);
    }
    if (d)
        closedir(d);
    return n;
}

/* Resident (VmRSS) or peak resident (VmHWM) bytes of process pid; 0 when unreadable. */
static uint64_t proc_mem(pid_t pid, const char *field)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    uint64_t v = 0;
    size_t fl = strlen(field);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, field, fl) == 0 && line[fl] == ':')
            v = strtoull(line + fl + 1, NULL, 10) * 1024;
    if (f)
        fclose(f);
    return v;
}

/* Resets the peak resident size of pid to its resident size now (clear_refs 5). */
static bool reset_peak(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return false;
    bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

/* CPU seconds (user and system) process pid has used; -1 when unreadable. */
static double proc_cpu(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    /* After the command's closing parenthesis: state is field 3, utime and stime 14 and 15. */
    const char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    if (p == NULL ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    long hz = sysconf(_SC_CLK_TCK);
    return hz > 0 ? (double)(ut + st) / (double)hz : -1;
}

static double checkpoint(ps_client *cl)
{
    double t0 = now_s();
    int rc = ps_checkpoint(cl);
    if (rc != PS_OK) {
        fprintf(stderr, "checkpoint: %s\n", ps_last_error());
        return -1;
    }
    return now_s() - t0;
}

/* ids: 4 sets of K batches (warm-up, pull, pull+pre, push), drawn independently. */
static int run_mode(const config *c, bool cold, const int64_t *ids, result *res)
{
    const size_t set = (size_t)c->batch * c->batches;
    memset(res, 0, sizeof(*res));
    char cold_dir[600], ck_dir[600], cmd[1300];
    snprintf(cold_dir, sizeof(cold_dir), "%s/ps-cold-wire-%d-cold", c->dir, (int)getpid());
    snprintf(ck_dir, sizeof(ck_dir), "%s/ps-cold-wire-%d-ckpt-%s", c->dir, (int)getpid(),
             cold ? "cold" : "ram");
    if (mkdir(cold_dir, 0755) != 0 && access(cold_dir, W_OK) != 0) {
        perror(cold_dir);
        return -1;
    }
    const char *extra[] = {"--log-level",
                           "warn",
                           "--cold-dir",
                           cold_dir,
                           "--checkpoint-dir",
                           ck_dir,
                           "--checkpoint-interval-s",
                           "0",
                           "--checkpoint-full-every",
                           "10",
                           "--max-message-bytes",
                           "256M",
                           NULL};
    test_cluster tc;
    if (test_cluster_start(&tc, c->server, 1, extra) != 0) {
        fprintf(stderr, "cannot start ps-server from %s\n", c->server);
        return -1;
    }
    ps_client *cl = open_client(&tc);
    int rc = -1;
    ps_table *tb = NULL;
    const size_t b = c->batch, dim = c->dim;
    float *g = malloc(b * dim * sizeof(float)), *out = malloc(2 * b * dim * sizeof(float));
    seen_set seen = {0};
    if (cl == NULL || g == NULL || out == NULL)
        goto done;
    for (size_t i = 0; i < b * dim; i++)
        g[i] = 0.001f * (float)((i % 7) + 1);
    ps_table_spec ts;
    ps_table_spec_init(&ts, TABLE, c->dim, c->opt);
    ts.initializer = PS_INIT_UNIFORM;
    ts.init_a = -0.05;
    ts.init_b = 0.05;
    ts.seed = 1;
    ts.ram_rows = cold ? c->rows * c->pct / 100 : 0;
    if (ts.ram_rows == 0 && cold)
        ts.ram_rows = 1;
    if (ps_table_create(cl, &ts, &tb) != PS_OK) {
        fprintf(stderr, "ps_table_create: %s\n", ps_last_error());
        rc = strstr(ps_last_error(), "RocksDB") ? 77 : -1;
        goto done;
    }
    const char *mode = cold ? "cold" : "ram";
    double t = push_ranks(tb, c->rows, 1, b, g);
    if (t < 0)
        goto done;
    res->fill = (double)c->rows / t;
    fprintf(stderr, "%s: fill %.0f rows/s (%.1f s)\n", mode, res->fill, t);
    /* Warm-up: the Zipf batches pushed, then pulled. */
    if (calls(tb, true, false, ids, b, c->batches, g, out, dim) < 0 ||
        calls(tb, false, false, ids, b, c->batches, g, out, dim) < 0)
        goto done;
    ps_table_info i0, i1;
    const double nids = (double)b * c->batches;
    const pid_t spid = tc.pids[0];
    double cpu0 = proc_cpu(spid);
    if (info(cl, &i0) != PS_OK ||
        (t = calls(tb, false, false, ids + set, b, c->batches, g, out, dim)) < 0 ||
        info(cl, &i1) != PS_OK)
        goto done;
    res->pull = nids / t;
    res->pull_cpu = proc_cpu(spid) - cpu0;
    res->pull_hit = i1.lookups > i0.lookups ? 1.0 - (double)(i1.cold_hits - i0.cold_hits) /
                                                        (double)(i1.lookups - i0.lookups)
                                            : 1.0;
    fprintf(stderr, "%s: pull %.0f ids/s, RAM hit %.4f, server CPU %.2f s\n", mode, res->pull,
            res->pull_hit, res->pull_cpu);
    i0 = i1;
    if ((t = calls(tb, false, true, ids + 2 * set, b, c->batches, g, out, dim)) < 0 ||
        info(cl, &i1) != PS_OK)
        goto done;
    res->pull_pre = nids / t;
    res->pre_hit = i1.lookups > i0.lookups ? 1.0 - (double)(i1.cold_hits - i0.cold_hits) /
                                                       (double)(i1.lookups - i0.lookups)
                                           : 1.0;
    fprintf(stderr, "%s: pull with prefetch %.0f ids/s\n", mode, res->pull_pre);
    i0 = i1;
    cpu0 = proc_cpu(spid);
    if ((t = calls(tb, true, false, ids + 3 * set, b, c->batches, g, out, dim)) < 0 ||
        info(cl, &i1) != PS_OK)
        goto done;
    res->push = nids / t;
    res->push_cpu = proc_cpu(spid) - cpu0;
    uint64_t dist = distinct_ids(ids + 3 * set, b, c->batches);
    res->push_hit = dist ? 1.0 - (double)(i1.cold_hits - i0.cold_hits) / (double)dist : 1.0;
    res->rows_disk = i1.rows_disk;
    fprintf(stderr, "%s: push %.0f ids/s, RAM hit %.4f, server CPU %.2f s\n", mode, res->push,
            res->push_hit, res->push_cpu);
    (void)new_bytes(ck_dir, &seen);
    bool peak = reset_peak(spid);
    uint64_t rss0 = proc_mem(spid, "VmRSS");
    if ((res->ck_s = checkpoint(cl)) < 0)
        goto done;
    uint64_t hwm = proc_mem(spid, "VmHWM");
    res->ck_rss_mb = peak && rss0 && hwm >= rss0 ? (double)(hwm - rss0) / 1e6 : -1;
    res->ck_bytes = new_bytes(ck_dir, &seen);
    if (push_ranks(tb, c->rows, 100, b, g) < 0 || (res->ck1_s = checkpoint(cl)) < 0)
        goto done;
    res->ck1_bytes = new_bytes(ck_dir, &seen);
    fprintf(stderr,
            "%s: checkpoint %.2f s %.1f MB (server peak memory +%.1f MB during it); after 1%%: "
            "%.2f s %.1f MB\n",
            mode, res->ck_s, (double)res->ck_bytes / 1e6, res->ck_rss_mb, res->ck1_s,
            (double)res->ck1_bytes / 1e6);
    res->ran = true;
    rc = 0;
done:
    free(seen.ino);
    free(g);
    free(out);
    ps_table_free(tb);
    ps_client_close(cl);
    test_cluster_stop(&tc);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' '%s'", cold_dir, ck_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s, %s\n", cold_dir, ck_dir);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: ps-cold-wire-bench PS_SERVER [--rows N] [--dim D] [--pct P] "
                    "[--batch B] [--batches K] [--zipf S] [--optimizer adagrad] [--dir DIR] "
                    "[--no-ram] [--quick]\n");
    exit(2);
}

static void ratio(char *buf, size_t cap, double v, double base)
{
    if (base > 0)
        snprintf(buf, cap, " (%.2f)", v / base);
    else
        buf[0] = '\0';
}

int main(int argc, char **argv)
{
    if (argc < 2 || argv[1][0] == '-')
        usage();
    config c = {.server = argv[1],
                .rows = 2000000,
                .dim = 16,
                .pct = 10,
                .batch = 8192,
                .batches = 100,
                .zipf = 1.1,
                .opt = PS_OPT_ADAGRAD,
                .dir = "/tmp"};
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0)
            c.quick = true;
        else if (strcmp(a, "--no-ram") == 0)
            c.no_ram = true;
        else if (v == NULL)
            usage();
        else if (strcmp(a, "--rows") == 0 && ++i)
            c.rows = (uint64_t)strtod(v, NULL);
        else if (strcmp(a, "--dim") == 0 && ++i)
            c.dim = (uint32_t)atoi(v);
        else if (strcmp(a, "--pct") == 0 && ++i)
            c.pct = (uint32_t)atoi(v);
        else if (strcmp(a, "--batch") == 0 && ++i)
            c.batch = (uint32_t)atoi(v);
        else if (strcmp(a, "--batches") == 0 && ++i)
            c.batches = (uint32_t)atoi(v);
        else if (strcmp(a, "--zipf") == 0 && ++i)
            c.zipf = atof(v);
        else if (strcmp(a, "--dir") == 0 && ++i)
            c.dir = v;
        else if (strcmp(a, "--optimizer") == 0 && ++i) {
            if (ps_optimizer_parse(v, &c.opt) != PS_OK)
                usage();
        } else
            usage();
    }
    if (c.quick) {
        c.rows = 50000;
        c.batches = 10;
    }
    if (c.rows < 100 || c.dim == 0 || c.pct == 0 || c.pct > 100 || c.batch == 0 || c.batches == 0)
        usage();
    if (!cold_store_available()) {
        fprintf(stderr, "skipped: built without RocksDB (no cold tier)\n");
        return 77;
    }
    zipf z;
    if (zipf_init(&z, c.rows, c.zipf, 7) != 0) {
        fprintf(stderr, "out of memory for the Zipf CDF of %llu rows\n",
                (unsigned long long)c.rows);
        return 1;
    }
    size_t nids = 4 * (size_t)c.batch * c.batches; /* warm-up, pull, pull+pre, push */
    int64_t *ids = malloc(nids * sizeof(*ids));
    if (ids == NULL)
        return 1;
    for (size_t i = 0; i < nids; i++)
        ids[i] = zipf_rank_id(zipf_draw(&z));
    zipf_free(&z);
    printf("ps-cold-wire-bench: %llu rows, dim %u, %s, ram_rows %u%%, Zipf(%.2f), %u ids a "
           "request, %u batches, one ps-server\n",
           (unsigned long long)c.rows, c.dim, ps_optimizer_name(c.opt), c.pct, c.zipf, c.batch,
           c.batches);
    result r[2];
    memset(r, 0, sizeof(r));
    for (int cold = c.no_ram ? 1 : 0; cold < 2; cold++) {
        int rc = run_mode(&c, cold == 1, ids, &r[cold]);
        if (rc == 77) {
            free(ids);
            fprintf(stderr, "skipped: the server was built without RocksDB\n");
            return 77;
        }
        if (rc != 0) {
            free(ids);
            return 1;
        }
    }
    free(ids);
    printf("| table | fill rows/s | pull ids/s | RAM hit | pull+prefetch ids/s | RAM hit | push "
           "ids/s | RAM hit | pull / push server CPU s | ckpt s | ckpt MB | ckpt peak mem +MB | "
           "ckpt after 1%% s | MB |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int m = 0; m < 2; m++) {
        if (!r[m].ran)
            continue;
        char f[32], pl[32], pp[32], ps[32];
        const result *base = r[0].ran && m == 1 ? &r[0] : NULL;
        ratio(f, sizeof(f), r[m].fill, base ? base->fill : 0);
        ratio(pl, sizeof(pl), r[m].pull, base ? base->pull : 0);
        ratio(pp, sizeof(pp), r[m].pull_pre, base ? base->pull : 0);
        ratio(ps, sizeof(ps), r[m].push, base ? base->push : 0);
        char label[32];
        snprintf(label, sizeof(label), "ram_rows %u%%", c.pct);
        printf("| %s | %.0f%s | %.0f%s | %.4f | %.0f%s | %.4f | %.0f%s | %.4f | %.2f / %.2f | "
               "%.2f | %.1f | %.1f | %.2f | %.1f |\n",
               m ? label : "in RAM", r[m].fill, f, r[m].pull, pl, r[m].pull_hit, r[m].pull_pre, pp,
               r[m].pre_hit, r[m].push, ps, r[m].push_hit, r[m].pull_cpu, r[m].push_cpu, r[m].ck_s,
               (double)r[m].ck_bytes / 1e6, r[m].ck_rss_mb, r[m].ck1_s,
               (double)r[m].ck1_bytes / 1e6);
    }
    if (r[1].ran)
        printf("rows on disk at the end (cold): %llu of %llu\n", (unsigned long long)r[1].rows_disk,
               (unsigned long long)c.rows);
    return 0;
}
