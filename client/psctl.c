/* psctl: operator's command line for a running cluster (status, variables, dumps, checkpoints,
 * shutdown, a live `top`), through libpsclient. Settings are the client's (OPT_SCOPE_CLIENT):
 * the cluster from TF_CONFIG or --cluster, deadline-ms, TLS, ... as every program takes them.
 * Exit status: 0 done, 1 a call to the cluster failed, 2 usage or configuration. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "options.h"
#include "program.h"
#include "psclient.h"
#include "psctl_json.h"
#include "psctl_moves.h"
#include "psctl_slots.h"
#include "psctl_view.h"

#define EXIT_RUNTIME 1

static const char usage_text[] =
    "[--json] COMMAND [ARGS]\n"
    "Commands:\n"
    "  status             counters of every server, the slowest worker, staleness\n"
    "  vars [NAME]        list the variables and sparse tables, or describe one (shape, shards,\n"
    "                     staleness bound; a table's dim, rows, bytes, admissions, evictions)\n"
    "  dump VAR FILE      pull VAR into FILE: raw little-endian float32, or NumPy .npy if FILE\n"
    "                     ends in .npy\n"
    "  dump TABLE DIR     export a sparse table's rows from every server into DIR: per server k\n"
    "                     TABLE.psK.ids.npy (int64 [n]) and TABLE.psK.rows.npy (float32 [n, dim])\n"
    "  checkpoint         checkpoint every server now\n"
    "  shutdown           shut every server down cleanly\n"
    "  top [--iterations N]  rates per server, refreshed every second (q or Ctrl-C quits)\n"
    "  view               replicated clusters: the view in etcd (coordinator): epoch, each\n"
    "                     group's primary and backups, servers live, rejoining or down\n"
    "  force-primary GROUP SERVER\n"
    "                     replicated clusters: a group waiting because none of its in-sync\n"
    "                     members is live is served by SERVER, a live member, from the copy\n"
    "                     it holds; updates only the missing members held are given up\n"
    "                     (waits up to 30 s for the view)\n"
    "  slots              clusters with a coordinator: the slot map in etcd: each server's\n"
    "                     address and slots owned (servers that joined included), moves\n"
    "                     in progress\n"
    "  add-server HOST:PORT  clusters with a coordinator, replicas 1: move slots onto a server\n"
    "                     started with ps-server --join until every server holds an even share\n"
    "  remove-server HOST:PORT  move every slot of that server onto the others (then it may\n"
    "                     be stopped)\n"
    "  rebalance          move slots until every server of the slot map holds an even share\n"
    "Flags of psctl itself: --json (one JSON object per command, one line per top refresh),\n"
    "--iterations N (top: stop after N refreshes), --batch-slots N (slot moves: slots per\n"
    "batch, 1 to 4096, default 16), --max-bytes-per-second N (slot moves: the bandwidth cap of\n"
    "each batch sent, 0 none).";

static bool json_out;
static long top_iterations; /* 0: until q / Ctrl-C */
static volatile sig_atomic_t stop_requested;
static psctl_move_opts move_opts = {.batch_slots = 16};

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static int fail(const char *what, int st)
{
    fprintf(stderr, "psctl: %s: %s: %s\n", what, ps_strerror(st), ps_last_error());
    return EXIT_RUNTIME;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- status ---------------------------------------------------------------------------- */

static int get_all_status(ps_client *c, int n, ps_server_stats *st)
{
    for (int i = 0; i < n; i++) {
        int rc = ps_server_status(c, i, &st[i]);
        if (rc != PS_OK) {
            char what[64];
            snprintf(what, sizeof(what), "status of ps %d", i);
            return fail(what, rc);
        }
    }
    return 0;
}

static int cmd_status(ps_client *c)
{
    int n = ps_client_num_servers(c);
    ps_server_stats *st = calloc((size_t)n, sizeof(*st));
    if (st == NULL)
        return fail("status", PS_RESOURCE_EXHAUSTED);
    int rc = get_all_status(c, n, st);
    ps_checkpoint_status *ck = rc == 0 ? calloc((size_t)n, sizeof(*ck)) : NULL;
    if (rc == 0 && ck == NULL)
        rc = fail("status", PS_RESOURCE_EXHAUSTED);
    for (int i = 0; rc == 0 && i < n; i++) {
        int r = ps_server_checkpoint_status(c, i, &ck[i]);
        if (r != PS_OK) {
            char what[64];
            snprintf(what, sizeof(what), "checkpoint status of ps %d", i);
            rc = fail(what, r);
        }
    }
    if (rc != 0) {
        free(ck);
        free(st);
        return rc;
    }
    /* The slowest live worker: the lowest min_clock over the servers; it trails the readers by
     * up to the largest staleness gap observed. */
    int slow = -1;
    int64_t stale_max = 0;
    for (int i = 0; i < n; i++) {
        if (st[i].min_clock >= 0 && (slow < 0 || st[i].min_clock < st[slow].min_clock))
            slow = i;
        if (st[i].staleness.max > stale_max)
            stale_max = st[i].staleness.max;
    }
    int64_t fastest_min = -1;
    for (int i = 0; i < n; i++)
        if (st[i].min_clock > fastest_min)
            fastest_min = st[i].min_clock;
    if (json_out) {
        printf("{\"servers\":[");
        for (int i = 0; i < n; i++) {
            const ps_server_stats *s = &st[i];
            printf("%s{\"task\":%" PRIu32 ",\"uptime_ms\":%" PRIu64 ",\"requests\":%" PRIu64
                   ",\"errors\":%" PRIu64 ",\"updates_applied\":%" PRIu64
                   ",\"duplicates_dropped\":%" PRIu64 ",\"bytes_in\":%" PRIu64
                   ",\"bytes_out\":%" PRIu64 ",\"variables\":%" PRIu32 ",\"bytes_held\":%" PRIu64
                   ",\"min_clock\":%" PRId64 ",\"live_workers\":%" PRIu32 ",\"evictions\":%" PRIu64
                   ",\"staleness_max\":%" PRId64,
                   i ? "," : "", s->task_index, s->uptime_ms, s->requests, s->errors,
                   s->updates_applied, s->duplicates_dropped, s->bytes_in, s->bytes_out,
                   s->num_variables, s->bytes_held, s->min_clock, s->live_workers, s->evictions,
                   s->staleness.max);
            const ps_checkpoint_status *k = &ck[i];
            if (!k->enabled) {
                printf(",\"checkpoint\":null}");
                continue;
            }
            printf(",\"checkpoint\":{\"last_seq\":%" PRIu64 ",\"age_ms\":%" PRIu64
                   ",\"failures\":%" PRIu64 ",\"failures_in_row\":%" PRIu64 ",\"last_error\":",
                   k->last_seq, k->age_ms, k->failures, k->failures_in_row);
            psctl_json_str(stdout, k->last_error);
            printf("}}");
        }
        printf("],\"slowest_worker\":");
        if (slow < 0)
            printf("null");
        else
            printf("{\"server\":%d,\"clock\":%" PRId64 ",\"behind_clocks\":%" PRId64 "}", slow,
                   st[slow].min_clock, fastest_min - st[slow].min_clock);
        printf(",\"staleness_max\":%" PRId64 "}\n", stale_max);
    } else {
        printf("%-4s %10s %10s %7s %10s %6s %12s %9s %5s %7s\n", "ps", "uptime_s", "requests",
               "errors", "updates", "vars", "bytes_held", "min_clock", "live", "evicted");
        for (int i = 0; i < n; i++) {
            const ps_server_stats *s = &st[i];
            printf("%-4" PRIu32 " %10.1f %10" PRIu64 " %7" PRIu64 " %10" PRIu64 " %6" PRIu32
                   " %12" PRIu64 " %9" PRId64 " %5" PRIu32 " %7" PRIu64 "\n",
                   s->task_index, (double)s->uptime_ms / 1000.0, s->requests, s->errors,
                   s->updates_applied, s->num_variables, s->bytes_held, s->min_clock,
                   s->live_workers, s->evictions);
        }
        if (slow < 0)
            printf("slowest worker: none live\n");
        else
            printf("slowest worker: clock %" PRId64 " (on ps %d), %" PRId64
                   " clocks behind the most advanced server's slowest\n",
                   st[slow].min_clock, slow, fastest_min - st[slow].min_clock);
        printf("staleness max: %" PRId64 " clocks\n", stale_max);
        for (int i = 0; i < n; i++) {
            const ps_checkpoint_status *k = &ck[i];
            if (!k->enabled)
                printf("ps %d checkpoints: off (no checkpoint-dir)\n", i);
            else if (k->failures_in_row > 0)
                printf("ps %d checkpoints: FAILING, %" PRIu64 " in a row (%" PRIu64
                       " since start); newest durable %" PRIu64 ", %.1f s since the last "
                       "written; last error: %s\n",
                       i, k->failures_in_row, k->failures, k->last_seq, (double)k->age_ms / 1000.0,
                       k->last_error);
            else
                printf("ps %d checkpoints: ok, newest %" PRIu64 ", %.1f s since the last written; "
                       "%" PRIu64 " failed since start\n",
                       i, k->last_seq, (double)k->age_ms / 1000.0, k->failures);
        }
    }
    free(ck);
    free(st);
    return 0;
}

/* ---- vars ------------------------------------------------------------------------------ */

/* A table's line (text) or object (JSON) in `vars`. */
/* A table's optimizer: the variables' names and the tables' own. */
static const char *table_optimizer_name(int opt)
{
    return opt == PS_OPT_FTRL              ? "ftrl"
           : opt == PS_OPT_ROWWISE_ADAGRAD ? "rowwise_adagrad"
                                           : ps_optimizer_name(opt);
}

static void print_table(const char *name, const ps_table_info *t, bool json)
{
    uint64_t evicted = t->evicted_ttl + t->evicted_max_rows + t->evicted_memory;
    if (json) {
        printf("{\"name\":");
        psctl_json_str(stdout, name);
        printf(",\"kind\":\"table\",\"dim\":%u,\"staleness_bound\":%d,\"optimizer\":\"%s\","
               "\"rows\":%" PRIu64 ",\"bytes\":%" PRIu64 ",\"admissions\":%" PRIu64
               ",\"pushes_held_back\":%" PRIu64 ",\"evictions\":{\"ttl\":%" PRIu64
               ",\"max_rows\":%" PRIu64 ",\"memory\":%" PRIu64 "}}",
               t->dim, t->staleness, table_optimizer_name(t->optimizer), t->rows, t->bytes,
               t->rows_created, t->pushes_counted, t->evicted_ttl, t->evicted_max_rows,
               t->evicted_memory);
    } else {
        printf("%s\ttable dim=%u rows=%" PRIu64 " bytes=%" PRIu64 " admissions=%" PRIu64
               " evictions=%" PRIu64 "\n",
               name, t->dim, t->rows, t->bytes, t->rows_created, evicted);
    }
}

static int cmd_vars_list(ps_client *c)
{
    char **names = NULL, **tables = NULL;
    size_t count = 0, ntables = 0;
    int rc = ps_var_list(c, &names, &count);
    if (rc != PS_OK)
        return fail("list variables", rc);
    rc = ps_table_list(c, &tables, &ntables);
    if (rc != PS_OK) {
        ps_names_free(names, count);
        return fail("list tables", rc);
    }
    ps_table_info *infos = calloc(ntables ? ntables : 1, sizeof(*infos));
    for (size_t i = 0; infos && rc == PS_OK && i < ntables; i++) {
        infos[i].struct_size = sizeof(infos[i]);
        rc = ps_table_info_get(c, tables[i], &infos[i]);
    }
    if (infos == NULL || rc != PS_OK) {
        ps_names_free(names, count);
        ps_names_free(tables, ntables);
        free(infos);
        return fail("describe tables", infos ? rc : PS_RESOURCE_EXHAUSTED);
    }
    if (json_out) {
        printf("{\"count\":%zu,\"variables\":[", count);
        for (size_t i = 0; i < count; i++) {
            if (i)
                putchar(',');
            psctl_json_str(stdout, names[i]);
        }
        printf("],\"tables\":[");
        for (size_t i = 0; i < ntables; i++) {
            if (i)
                putchar(',');
            print_table(tables[i], &infos[i], true);
        }
        printf("]}\n");
    } else {
        for (size_t i = 0; i < count; i++)
            printf("%s\n", names[i]);
        for (size_t i = 0; i < ntables; i++)
            print_table(tables[i], &infos[i], false);
    }
    free(infos);
    ps_names_free(names, count);
    ps_names_free(tables, ntables);
    return 0;
}

/* `vars NAME` for a table. */
static int cmd_table_one(ps_client *c, const char *name)
{
    ps_table_info t = {.struct_size = sizeof(t)};
    int rc = ps_table_info_get(c, name, &t);
    if (rc != PS_OK) {
        char what[300];
        snprintf(what, sizeof(what), "look up variable or table %s", name);
        return fail(what, rc);
    }
    if (json_out) {
        print_table(name, &t, true);
        putchar('\n');
        return 0;
    }
    printf("name:            %s\nkind:            table\ndim:             %u\n"
           "optimizer:       %s\nstaleness bound: %d%s\nservers:         %d\n"
           "rows:            %" PRIu64 "\nbytes:           %" PRIu64 "\n"
           "admissions:      %" PRIu64 " (pushes held back by min_count: %" PRIu64 ")\n"
           "evictions:       ttl %" PRIu64 ", max_rows %" PRIu64 ", memory %" PRIu64 "\n",
           name, t.dim, table_optimizer_name(t.optimizer), t.staleness,
           t.staleness < 0 ? " (asynchronous)" : "", t.servers, t.rows, t.bytes, t.rows_created,
           t.pushes_counted, t.evicted_ttl, t.evicted_max_rows, t.evicted_memory);
    if (t.rows_disk > 0 || t.demotions > 0)
        printf("rows per tier:   ram %" PRIu64 ", disk %" PRIu64 " (promotions %" PRIu64
               ", demotions %" PRIu64 ")\n",
               t.rows - t.rows_disk, t.rows_disk, t.promotions, t.demotions);
    return 0;
}

static void print_shape(const ps_var *v, bool json)
{
    int nd = ps_var_ndims(v);
    putchar(json ? '[' : '(');
    for (int i = 0; i < nd; i++)
        printf("%s%" PRIu64, i ? (json ? "," : ", ") : "", ps_var_dim(v, i));
    if (!json && nd == 1)
        putchar(',');
    putchar(json ? ']' : ')');
}

static int cmd_vars_one(ps_client *c, const char *name)
{
    ps_var *v = NULL;
    int rc = ps_var_lookup(c, name, &v);
    if (rc == PS_NOT_FOUND)
        return cmd_table_one(c, name);
    if (rc != PS_OK) {
        char what[300];
        snprintf(what, sizeof(what), "look up variable %s", name);
        return fail(what, rc);
    }
    if (json_out) {
        printf("{\"name\":");
        psctl_json_str(stdout, ps_var_name(v));
        printf(",\"shape\":");
        print_shape(v, true);
        printf(",\"numel\":%" PRIu64 ",\"shards\":%d,\"staleness_bound\":%d}\n", ps_var_numel(v),
               ps_var_num_shards(v), ps_var_staleness_bound(v));
    } else {
        int b = ps_var_staleness_bound(v);
        printf("name:            %s\nshape:           ", ps_var_name(v));
        print_shape(v, false);
        printf("\nnumel:           %" PRIu64 "\nshards:          %d\nstaleness bound: %d%s\n",
               ps_var_numel(v), ps_var_num_shards(v), b,
               b < 0    ? " (asynchronous)"
               : b == 0 ? " (synchronous)"
                        : "");
    }
    return 0;
}

/* ---- dump ------------------------------------------------------------------------------ */

static bool host_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The NPY format 1.0 header for a little-endian float32 array of v's shape, C order: magic,
 * version, a 2-byte little-endian header length, then the dict padded with spaces and ended by
 * '\n' so that the data starts at a multiple of 64 bytes. Returns its length (0 if too long). */
static size_t npy_header(const ps_var *v, unsigned char *buf, size_t cap)
{
    char dict[512];
    int nd = ps_var_ndims(v);
    size_t n = (size_t)snprintf(dict, sizeof(dict),
                                "{'descr': '<f4', 'fortran_order': False, "
                                "'shape': (");
    for (int i = 0; i < nd && n < sizeof(dict); i++)
        n += (size_t)snprintf(dict + n, sizeof(dict) - n, "%s%" PRIu64, i ? ", " : "",
                              ps_var_dim(v, i));
    if (n < sizeof(dict))
        n += (size_t)snprintf(dict + n, sizeof(dict) - n, "%s), }", nd == 1 ? "," : "");
    if (n >= sizeof(dict))
        return 0;
    size_t total = 10 + n + 1; /* magic 6, version 2, length 2, dict, '\n' */
    total = (total + 63) / 64 * 64;
    if (total > cap || total - 10 > 0xffff)
        return 0;
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    size_t hlen = total - 10;
    buf[8] = (unsigned char)(hlen & 0xff);
    buf[9] = (unsigned char)(hlen >> 8);
    memcpy(buf + 10, dict, n);
    memset(buf + 10 + n, ' ', total - 10 - n - 1);
    buf[total - 1] = '\n';
    return total;
}

static int cmd_dump_table(ps_client *c, ps_table *t, const char *name, const char *dir);

static int cmd_dump(ps_client *c, const char *name, const char *path)
{
    ps_var *v = NULL;
    char what[600];
    int rc = ps_var_lookup(c, name, &v);
    ps_table *table = NULL;
    if (rc == PS_NOT_FOUND && ps_table_lookup(c, name, &table) == PS_OK) {
        rc = cmd_dump_table(c, table, name, path);
        ps_table_free(table);
        return rc;
    }
    if (rc != PS_OK) {
        snprintf(what, sizeof(what), "look up variable %s", name);
        return fail(what, rc);
    }
    uint64_t numel = ps_var_numel(v);
    if (numel > SIZE_MAX / sizeof(float)) {
        fprintf(stderr, "psctl: dump %s: %" PRIu64 " elements do not fit in memory\n", name, numel);
        return EXIT_RUNTIME;
    }
    float *data = malloc(numel ? (size_t)numel * sizeof(float) : 1);
    if (data == NULL) {
        fprintf(stderr, "psctl: dump %s: out of memory for %" PRIu64 " floats\n", name, numel);
        return EXIT_RUNTIME;
    }
    rc = ps_pull(c, v, data);
    if (rc != PS_OK) {
        free(data);
        snprintf(what, sizeof(what), "pull %s", name);
        return fail(what, rc);
    }
    if (!host_little_endian()) {
        for (uint64_t i = 0; i < numel; i++) {
            unsigned char *b = (unsigned char *)&data[i], t;
            t = b[0], b[0] = b[3], b[3] = t;
            t = b[1], b[1] = b[2], b[2] = t;
        }
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, "psctl: dump %s: open %s: %s\n", name, path, strerror(errno));
        free(data);
        return EXIT_RUNTIME;
    }
    bool ok = true;
    if (ends_with(path, ".npy")) {
        unsigned char hdr[640];
        size_t h = npy_header(v, hdr, sizeof(hdr));
        ok = h > 0 && fwrite(hdr, 1, h, f) == h;
    }
    ok = ok && fwrite(data, sizeof(float), (size_t)numel, f) == (size_t)numel;
    int err = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        err = errno;
    }
    free(data);
    if (!ok) {
        fprintf(stderr, "psctl: dump %s: write %s: %s\n", name, path, strerror(err));
        return EXIT_RUNTIME;
    }
    if (json_out) {
        printf("{\"variable\":");
        psctl_json_str(stdout, name);
        printf(",\"file\":");
        psctl_json_str(stdout, path);
        printf(",\"numel\":%" PRIu64 ",\"format\":\"%s\"}\n", numel,
               ends_with(path, ".npy") ? "npy" : "raw-f32le");
    } else {
        printf("wrote %" PRIu64 " floats of %s to %s\n", numel, name, path);
    }
    return 0;
}

/* A .npy header of exactly 128 bytes (so that it can be written again once n is known). */
static void npy_header128(unsigned char *buf, const char *descr, uint64_t n, uint32_t dim)
{
    char dict[118];
    if (dim)
        snprintf(dict, sizeof(dict),
                 "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRIu64 ", %u), }", descr, n,
                 dim);
    else
        snprintf(dict, sizeof(dict),
                 "{'descr': '%s', 'fortran_order': False, 'shape': (%" PRIu64 ",), }", descr, n);
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = 128 - 10;
    buf[9] = 0;
    size_t len = strlen(dict);
    memcpy(buf + 10, dict, len);
    memset(buf + 10 + len, ' ', 128 - 10 - len - 1);
    buf[127] = '\n';
}

static void swap_bytes(void *p, size_t n, size_t size)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++, b += size)
        for (size_t k = 0; k < size / 2; k++) {
            unsigned char t = b[k];
            b[k] = b[size - 1 - k];
            b[size - 1 - k] = t;
        }
}

/* dump TABLE DIR: every server's rows of the table, one .npy pair per server. */
static int cmd_dump_table(ps_client *c, ps_table *t, const char *name, const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "psctl: dump %s: cannot create directory %s: %s\n", name, dir,
                strerror(errno));
        return EXIT_RUNTIME;
    }
    char safe[300];
    size_t k = 0;
    for (const char *p = name; *p && k + 1 < sizeof(safe); p++)
        safe[k++] = (isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.') ? *p : '_';
    safe[k] = '\0';
    uint32_t dim = ps_table_dim(t);
    size_t max = ps_table_max_ids(t);
    int64_t *ids = malloc(max * sizeof(*ids));
    float *rows = malloc(max * (size_t)dim * sizeof(float));
    if (ids == NULL || rows == NULL) {
        free(ids);
        free(rows);
        fprintf(stderr, "psctl: dump %s: out of memory\n", name);
        return EXIT_RUNTIME;
    }
    int nservers = ps_client_num_servers(c), rc = 0;
    uint64_t total = 0;
    if (json_out) {
        printf("{\"table\":");
        psctl_json_str(stdout, name);
        printf(",\"dim\":%u,\"servers\":[", dim);
    }
    for (int s = 0; s < nservers && rc == 0; s++) {
        char pi[700], pr[700];
        snprintf(pi, sizeof(pi), "%s/%s.ps%d.ids.npy", dir, safe, s);
        snprintf(pr, sizeof(pr), "%s/%s.ps%d.rows.npy", dir, safe, s);
        FILE *fi = fopen(pi, "wb"), *fr = fopen(pr, "wb");
        unsigned char hdr[128] = {0};
        bool ok = fi && fr && fwrite(hdr, 1, 128, fi) == 128 && fwrite(hdr, 1, 128, fr) == 128;
        uint64_t cursor = 0, n = 0;
        bool done = false;
        int st = PS_OK;
        while (ok && !done) {
            size_t got = 0;
            st = ps_table_export(t, s, &cursor, max, ids, rows, &got, &done);
            if (st != PS_OK)
                break;
            if (!host_little_endian()) {
                swap_bytes(ids, got, 8);
                swap_bytes(rows, got * dim, 4);
            }
            ok = fwrite(ids, 8, got, fi) == got && fwrite(rows, 4 * (size_t)dim, got, fr) == got;
            n += got;
        }
        if (ok && st == PS_OK) {
            npy_header128(hdr, "<i8", n, 0);
            ok = fseek(fi, 0, SEEK_SET) == 0 && fwrite(hdr, 1, 128, fi) == 128;
            npy_header128(hdr, "<f4", n, dim);
            ok = ok && fseek(fr, 0, SEEK_SET) == 0 && fwrite(hdr, 1, 128, fr) == 128;
        }
        int err = errno;
        if (fi && fclose(fi) != 0 && ok)
            ok = false, err = errno;
        if (fr && fclose(fr) != 0 && ok)
            ok = false, err = errno;
        if (st != PS_OK) {
            char what[400];
            snprintf(what, sizeof(what), "export table %s from ps %d", name, s);
            rc = fail(what, st);
        } else if (!ok) {
            fprintf(stderr, "psctl: dump %s: write %s or %s: %s\n", name, pi, pr, strerror(err));
            rc = EXIT_RUNTIME;
        } else if (json_out) {
            printf("%s{\"ps\":%d,\"rows\":%" PRIu64 ",\"ids\":", s ? "," : "", s, n);
            psctl_json_str(stdout, pi);
            printf(",\"rows_file\":");
            psctl_json_str(stdout, pr);
            printf("}");
        } else {
            printf("ps %d: %" PRIu64 " rows of %s to %s and %s\n", s, n, name, pi, pr);
        }
        total += n;
    }
    if (json_out)
        printf("],\"rows\":%" PRIu64 ",\"ok\":%s}\n", total, rc == 0 ? "true" : "false");
    else if (rc == 0)
        printf("wrote %" PRIu64 " rows of table %s (dim %u) from %d server(s)\n", total, name, dim,
               nservers);
    free(ids);
    free(rows);
    return rc;
}

/* ---- checkpoint, shutdown -------------------------------------------------------------- */

static int cmd_simple(ps_client *c, const char *cmd)
{
    bool ck = strcmp(cmd, "checkpoint") == 0;
    int rc = ck ? ps_checkpoint(c) : ps_shutdown_cluster(c);
    if (rc != PS_OK)
        return fail(cmd, rc);
    if (json_out)
        printf("{\"command\":\"%s\",\"ok\":true,\"servers\":%d}\n", cmd, ps_client_num_servers(c));
    else
        printf("%s: done on %d server(s)\n", ck ? "checkpoint" : "shutdown",
               ps_client_num_servers(c));
    return 0;
}

/* ---- top ------------------------------------------------------------------------------- */

/* Waits up to ms for q on a terminal stdin (or a signal). True when the user asked to stop. */
static bool wait_or_quit(int ms, bool tty)
{
    double end = now_s() + ms / 1000.0;
    for (;;) {
        if (stop_requested)
            return true;
        double left = end - now_s();
        if (left <= 0)
            return false;
        struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
        int r = poll(tty ? &pfd : NULL, tty ? 1 : 0, (int)(left * 1000) + 1);
        if (r > 0 && (pfd.revents & POLLIN)) {
            char ch;
            ssize_t got = read(STDIN_FILENO, &ch, 1);
            if (got <= 0 || ch == 'q' || ch == 'Q')
                return true;
        }
    }
}

static int cmd_top(ps_client *c)
{
    int n = ps_client_num_servers(c);
    ps_server_stats *prev = calloc((size_t)n, sizeof(*prev));
    ps_server_stats *cur = calloc((size_t)n, sizeof(*cur));
    if (prev == NULL || cur == NULL) {
        free(prev);
        free(cur);
        return fail("top", PS_RESOURCE_EXHAUSTED);
    }
    bool tty = isatty(STDIN_FILENO) != 0;
    struct termios saved;
    bool raw = false;
    if (tty && tcgetattr(STDIN_FILENO, &saved) == 0) {
        struct termios t = saved;
        t.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
        t.c_cc[VMIN] = 1;
        t.c_cc[VTIME] = 0;
        raw = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    bool clear = !json_out && isatty(STDOUT_FILENO);

    int rc = get_all_status(c, n, prev);
    double t_prev = now_s();
    for (long it = 0; rc == 0 && (top_iterations == 0 || it < top_iterations); it++) {
        if (wait_or_quit(1000, tty))
            break;
        rc = get_all_status(c, n, cur);
        if (rc != 0)
            break;
        double t = now_s(), dt = t - t_prev;
        if (dt <= 0)
            dt = 1e-9;
        if (json_out) {
            printf("{\"interval_s\":%.3f,\"servers\":[", dt);
        } else {
            if (clear)
                printf("\033[H\033[2J");
            printf("psctl top: %d server(s), every 1 s (q or Ctrl-C quits)\n", n);
            printf("%-4s %12s %14s %12s %5s %9s\n", "ps", "requests/s", "bytes_io/s", "updates/s",
                   "live", "min_clock");
        }
        for (int i = 0; i < n; i++) {
            const ps_server_stats *a = &prev[i], *b = &cur[i];
            /* A restarted server's counters start again: count from zero then. */
#define RATE(f) ((b->f >= a->f ? (double)(b->f - a->f) : (double)b->f) / dt)
            double rq = RATE(requests), io = RATE(bytes_in) + RATE(bytes_out),
                   up = RATE(updates_applied);
#undef RATE
            if (json_out)
                printf("%s{\"task\":%" PRIu32 ",\"requests_per_s\":%.2f,\"bytes_per_s\":%.1f,"
                       "\"updates_per_s\":%.2f,\"live_workers\":%" PRIu32 ",\"min_clock\":%" PRId64
                       "}",
                       i ? "," : "", b->task_index, rq, io, up, b->live_workers, b->min_clock);
            else
                printf("%-4" PRIu32 " %12.1f %14.0f %12.1f %5" PRIu32 " %9" PRId64 "\n",
                       b->task_index, rq, io, up, b->live_workers, b->min_clock);
        }
        if (json_out)
            printf("]}\n");
        fflush(stdout);
        ps_server_stats *tmp = prev;
        prev = cur;
        cur = tmp;
        t_prev = t;
    }
    if (raw)
        tcsetattr(STDIN_FILENO, TCSANOW, &saved);
    free(prev);
    free(cur);
    return rc;
}

/* ---- main ------------------------------------------------------------------------------ */

/* Passes every client setting given to psctl (file, environment, flags) to the library. */
static int client_open(const options *o, ps_client **out)
{
    ps_config *pc = NULL;
    if (ps_config_create(&pc) != PS_OK) {
        fprintf(stderr, "psctl: client configuration: %s\n", ps_last_error());
        return EXIT_RUNTIME;
    }
    for (unsigned row = 0; row < OPTION_ROW_COUNT; row++) {
        const option_def *d = &options_table[row];
        if (!(d->scope & OPT_SCOPE_CLIENT) || row == OPT_ROW(OPT_CONFIG) ||
            !options_is_set_row(o, row))
            continue;
        if (ps_config_set(pc, d->name, options_text_row(o, row)) != PS_OK) {
            fprintf(stderr, "psctl: --%s: %s\n", d->name, ps_last_error());
            ps_config_destroy(pc);
            return PROGRAM_EXIT_CONFIG;
        }
    }
    int st = ps_client_open(out, pc);
    ps_config_destroy(pc);
    if (st != PS_OK) {
        fprintf(stderr, "psctl: connect: %s: %s\n", ps_strerror(st), ps_last_error());
        return st == PS_INVALID_ARGUMENT ? PROGRAM_EXIT_CONFIG : EXIT_RUNTIME;
    }
    return 0;
}

static int usage_error(const char *msg)
{
    fprintf(stderr, "psctl: %s (see --help)\n", msg);
    return PROGRAM_EXIT_CONFIG;
}

static void log_library_message(int level, const char *message, const char *fields, void *arg)
{
    (void)arg;
    log_fields((log_level)level, fields, "%s", message);
}

int main(int argc, char **argv)
{
    /* psctl's own flags (--json, --iterations) are taken out before the option table sees the
     * rest; "--" ends them as it ends the table's. */
    char **args = calloc((size_t)argc + 1, sizeof(char *));
    if (args == NULL)
        return EXIT_RUNTIME;
    int nargs = 0;
    bool rest = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i > 0 && !rest && strcmp(a, "--") == 0)
            rest = true;
        if (i == 0 || rest) {
            args[nargs++] = argv[i];
        } else if (strcmp(a, "--json") == 0) {
            json_out = true;
        } else if (strcmp(a, "--iterations") == 0 || strncmp(a, "--iterations=", 13) == 0) {
            const char *val = a[12] == '=' ? a + 13 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            errno = 0;
            long nv = val ? strtol(val, &end, 10) : 0;
            if (val == NULL || *val == '\0' || *end != '\0' || errno != 0 || nv < 1) {
                free(args);
                return usage_error("--iterations needs a whole number >= 1");
            }
            top_iterations = nv;
        } else if (strcmp(a, "--batch-slots") == 0 || strncmp(a, "--batch-slots=", 14) == 0 ||
                   strcmp(a, "--max-bytes-per-second") == 0 ||
                   strncmp(a, "--max-bytes-per-second=", 23) == 0) {
            bool batch = strncmp(a, "--batch-slots", 13) == 0;
            size_t nl = batch ? 13 : 22;
            const char *val = a[nl] == '=' ? a + nl + 1 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            errno = 0;
            unsigned long long nv = val ? strtoull(val, &end, 10) : 0;
            bool bad = val == NULL || *val == '\0' || *val == '-' || *end != '\0' || errno != 0;
            if (batch && (bad || nv < 1 || nv > 4096)) {
                free(args);
                return usage_error("--batch-slots needs a whole number from 1 to 4096");
            }
            if (!batch && bad) {
                free(args);
                return usage_error("--max-bytes-per-second needs a whole number >= 0 (0: no cap)");
            }
            if (batch)
                move_opts.batch_slots = (uint32_t)nv;
            else
                move_opts.max_bytes_per_second = nv;
        } else {
            args[nargs++] = argv[i];
        }
    }
    args[nargs] = NULL;

    program p;
    bool exit_now = false;
    int rc = program_start(&p, nargs, args, OPT_SCOPE_CLIENT, "psctl", usage_text, true, &exit_now);
    if (exit_now) {
        free(args);
        return rc;
    }
    /* The library's messages become psctl's own lines (one logger in the process). */
    log_level lvl = LOG_INFO;
    log_level_parse(opt_enum(p.opts, OPT_LOG_LEVEL), &lvl);
    ps_set_log_message_handler((int)lvl, log_library_message, NULL);
    rc = 0;
    const char *cmd = p.npositional > 0 ? p.positional[0] : NULL;
    int nargs_cmd = p.npositional - 1;
    if (cmd == NULL)
        rc = usage_error("no command given (status, vars, dump, checkpoint, shutdown, top, view, "
                         "force-primary, slots, add-server, remove-server, rebalance)");
    else if (strcmp(cmd, "status") == 0 || strcmp(cmd, "checkpoint") == 0 ||
             strcmp(cmd, "shutdown") == 0 || strcmp(cmd, "top") == 0 || strcmp(cmd, "view") == 0 ||
             strcmp(cmd, "slots") == 0) {
        if (nargs_cmd != 0)
            rc = usage_error("this command takes no arguments");
    } else if (strcmp(cmd, "vars") == 0) {
        if (nargs_cmd > 1)
            rc = usage_error("vars takes at most one variable name");
    } else if (strcmp(cmd, "dump") == 0) {
        if (nargs_cmd != 2)
            rc = usage_error("dump needs VAR FILE or TABLE DIR");
    } else if (strcmp(cmd, "force-primary") == 0) {
        if (nargs_cmd != 2)
            rc = usage_error("force-primary needs GROUP SERVER (task indices)");
    } else if (strcmp(cmd, "add-server") == 0 || strcmp(cmd, "remove-server") == 0) {
        if (nargs_cmd != 1 || strchr(p.positional[1], ':') == NULL)
            rc = usage_error(strcmp(cmd, "add-server") == 0
                                 ? "add-server needs the HOST:PORT of a server started with "
                                   "--join"
                                 : "remove-server needs the HOST:PORT of a server of the slot "
                                   "map");
    } else if (strcmp(cmd, "rebalance") == 0) {
        if (nargs_cmd != 0)
            rc = usage_error("rebalance takes no arguments");
    } else {
        char msg[300];
        snprintf(msg, sizeof(msg), "unknown command \"%s\"", cmd);
        rc = usage_error(msg);
    }
    if (rc == 0 && top_iterations > 0 && strcmp(cmd, "top") != 0)
        rc = usage_error("--iterations applies to top only");

    bool moves = cmd && (strcmp(cmd, "add-server") == 0 || strcmp(cmd, "remove-server") == 0 ||
                         strcmp(cmd, "rebalance") == 0);
    if (rc == 0 && !moves && (move_opts.batch_slots != 16 || move_opts.max_bytes_per_second))
        rc = usage_error("--batch-slots and --max-bytes-per-second apply to add-server, "
                         "remove-server and rebalance only");
    if (rc == 0 && moves) {
        move_opts.json = json_out;
        rc = psctl_moves(p.opts, &p.cluster, cmd, nargs_cmd == 1 ? p.positional[1] : NULL,
                         &move_opts);
        program_end(&p);
        free(args);
        return rc;
    }
    ps_client *c = NULL;
    if (rc == 0 && (strcmp(cmd, "view") == 0 || strcmp(cmd, "force-primary") == 0 ||
                    strcmp(cmd, "slots") == 0)) {
        /* From etcd, not from the servers. */
        rc = strcmp(cmd, "view") == 0    ? psctl_view(p.opts, &p.cluster, json_out)
             : strcmp(cmd, "slots") == 0 ? psctl_slots(p.opts, &p.cluster, json_out)
                                         : psctl_force_primary(p.opts, &p.cluster, p.positional[1],
                                                               p.positional[2], 30000, json_out);
        program_end(&p);
        free(args);
        return rc;
    }
    if (rc == 0)
        rc = client_open(p.opts, &c);
    if (rc == 0) {
        if (strcmp(cmd, "status") == 0)
            rc = cmd_status(c);
        else if (strcmp(cmd, "vars") == 0)
            rc = nargs_cmd == 1 ? cmd_vars_one(c, p.positional[1]) : cmd_vars_list(c);
        else if (strcmp(cmd, "dump") == 0)
            rc = cmd_dump(c, p.positional[1], p.positional[2]);
        else if (strcmp(cmd, "top") == 0)
            rc = cmd_top(c);
        else
            rc = cmd_simple(c, cmd);
        fflush(stdout);
    }
    if (c != NULL)
        ps_client_close(c);
    program_end(&p);
    free(args);
    return rc;
}
