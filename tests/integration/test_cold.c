/* Integration tests of tables larger than memory (ram_rows, cold-dir) over the wire, one real
 * ps-server:
 * (a) a table whose RAM share holds about a tenth of its rows, under random pushes (SGD,
 *     Adagrad, Adam) and pulls, gives every row bit for bit equal to the same table wholly in
 *     RAM; /metrics shows rows on disk;
 * (b) after a checkpoint, SIGKILL and a restart, the restored cold table is again equal to the
 *     restored table in RAM (rows and optimizer state: further pushes agree too);
 * (c) a cold-dir that does not exist: the server exits 2 naming it; a server without cold-dir
 *     refuses a table with ram_rows, naming the setting;
 * (d) a prefetch (ps_table_prefetch, TablePrefetch) of cold ids brings their rows to RAM, so
 *     that the following pull counts no cold hit (/metrics: psd_table_cold_hits_total,
 *     psd_table_promotions_total); ids not in the table make no row; an unknown table, too
 *     many ids and an id of another server are refused with named errors.
 * (e) a damaged checkpoint file holding cold tables' rows is named as unusable at the restart,
 *     and the checkpoint before it comes back exactly; so is a damaged file of the copy of a
 *     cold store a checkpoint names (ckpt-0-N.cold), the damaged file named;
 * (g) a checkpoint after a 1% change writes far less than the tables (bytes of its file and
 *     of the files of its stores' copies not shared with the previous one), its restore gives
 *     rows bit for bit those of the twins in RAM, and pruning removes the copies of the
 *     checkpoints it deletes; a checkpoint that cannot copy the stores writes the rows
 *     instead (the form of older files), which restores bit for bit too;
 * (f) a cold-dir on a small tmpfs that fills mid-run: RESOURCE_EXHAUSTED naming it, nothing
 *     acknowledged lost, the server goes on (root only, skipped saying why otherwise);
 * (h) replicas 2 on 3 servers with a real etcd: cold tables (SGD, Adagrad) and their twins in
 *     RAM under pushes and pulls of ids on disk, a server killed (-9) and restarted mid-run
 *     (it copies its groups back, rows on disk included): rows bit for bit the twins', every
 *     group's primary and backup checksums equal;
 * (i) replicas 2 with max-server-bytes small enough that the budget sends the cold rows to
 *     disk: pulls of them between pushes promote nothing on the primary alone, so every
 *     group's copies stay equal (and every row exactly what its pushes make);
 * (a), (b), (d), (e), (f), (g), (h) and (i) skip, saying why, when the build has no RocksDB;
 * (h) and (i) also without etcd. A second argument runs only the tests whose names match it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "cluster_proc.h"
#include "cold_store.h"
#include "etcd_proc.h"
#include "frame.h"
#include "ps_proc.h"
#include "psclient.h"
#include "replicated_cluster.h"

static const char *server_bin;

enum { DIM = 8, IDS = 3000, RAM_ROWS = IDS / 10, BATCH = 512, ROUNDS = 30 };

static const ps_optimizer kinds[] = {PS_OPT_SGD, PS_OPT_ADAGRAD, PS_OPT_ADAM};
#define NKINDS (sizeof(kinds) / sizeof(kinds[0]))

static uint64_t rng = 12345;

static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15u);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

static double sample(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, series, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return -1.0;
}

/* The Checkpoint RPC: 0 when a checkpoint was written. */
static int raw_checkpoint(int port)
{
    Psd__V1__CheckpointRequest req = PSD__V1__CHECKPOINT_REQUEST__INIT;
    uint8_t body[16];
    size_t blen = psd__v1__checkpoint_request__pack(&req, body);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__CHECKPOINT;
    env.request_id = 1;
    env.body.data = body;
    env.body.len = blen;
    frame f;
    nng_msg *m;
    int st = test_raw_call(port, &env, NULL, 0, &f, &m);
    if (st < -999)
        return st;
    if (st != 0)
        fprintf(stderr, "checkpoint: %s\n", f.env->message ? f.env->message : "");
    frame_fini(&f);
    nng_msg_free(m);
    return st;
}

/* The tables: for each optimizer one wholly in RAM (t[k][0]) and one with ram_rows (t[k][1]). */
typedef struct tables {
    ps_table *t[NKINDS][2];
} tables;

static void make_tables(ps_client *c, tables *ts)
{
    for (size_t k = 0; k < NKINDS; k++)
        for (int cold = 0; cold < 2; cold++) {
            char name[64];
            snprintf(name, sizeof(name), "cold/%s_%s", ps_optimizer_name(kinds[k]),
                     cold ? "cold" : "ram");
            ps_table_spec s;
            ps_table_spec_init(&s, name, DIM, kinds[k]);
            /* Constant: the same rows under both names (a random initializer's rows depend on
             * the table's name). */
            s.initializer = PS_INIT_CONSTANT;
            s.init_a = 0.25;
            s.ram_rows = cold ? RAM_ROWS : 0;
            int rc = ps_table_create(c, &s, &ts->t[k][cold]);
            if (rc != PS_OK)
                fprintf(stderr, "create %s: %s\n", name, ps_last_error());
            assert_int_equal(rc, PS_OK);
        }
}

static void free_tables(tables *ts)
{
    for (size_t k = 0; k < NKINDS; k++)
        for (int cold = 0; cold < 2; cold++)
            ps_table_free(ts->t[k][cold]);
}

/* rounds of random pushes (the same to both tables of each optimizer). */
static void push_rounds(tables *ts, int rounds)
{
    int64_t ids[BATCH];
    static float g[BATCH * DIM];
    for (int r = 0; r < rounds; r++) {
        for (size_t i = 0; i < BATCH; i++) {
            ids[i] = (int64_t)(rnd() % 2 ? rnd() % (IDS / 10) : rnd() % IDS);
            for (int d = 0; d < DIM; d++)
                g[i * DIM + d] = ((float)(rnd() % 2001) - 1000.0f) / 2000.0f;
        }
        for (size_t k = 0; k < NKINDS; k++)
            for (int cold = 0; cold < 2; cold++)
                assert_int_equal(ps_table_push(ts->t[k][cold], ids, BATCH, g), PS_OK);
    }
}

/* Pulls every id of both tables of each optimizer and asserts they agree bit for bit; keeps the
 * rows in saved (NKINDS x IDS x DIM) when not NULL, or compares them with it. */
static void assert_tables_agree(tables *ts, float *saved, bool compare)
{
    static int64_t ids[IDS];
    static float a[IDS * DIM], b[IDS * DIM];
    for (int64_t i = 0; i < IDS; i++)
        ids[i] = i;
    for (size_t k = 0; k < NKINDS; k++) {
        for (size_t off = 0; off < IDS; off += 1000) {
            assert_int_equal(ps_table_pull(ts->t[k][0], ids + off, 1000, a + off * DIM), PS_OK);
            assert_int_equal(ps_table_pull(ts->t[k][1], ids + off, 1000, b + off * DIM), PS_OK);
        }
        assert_memory_equal(a, b, sizeof(a));
        if (saved && compare)
            assert_memory_equal(saved + k * IDS * DIM, a, sizeof(a));
        else if (saved)
            memcpy(saved + k * IDS * DIM, a, sizeof(a));
    }
}

/* Entries of a directory (. and .. not counted). */
static int count_entries(const char *path)
{
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* A server with cold_dir; chain: checkpoint-full-every 4 and checkpoint-keep 1 (else one
 * full file each, the default kept). */
static void start_with(test_ps *p, const char *cold_dir, bool chain)
{
    const char *extra[] = {"--checkpoint-dir",
                           p->dir,
                           "--cold-dir",
                           cold_dir,
                           "--checkpoint-interval-s",
                           "0",
                           "--http-listen",
                           NULL,
                           chain ? "--checkpoint-full-every" : NULL,
                           "4",
                           "--checkpoint-keep",
                           "1",
                           NULL};
    static char haddr[64];
    snprintf(haddr, sizeof(haddr), "127.0.0.1:%d",
             p->port + 1000 > 65000 ? p->port - 1000 : p->port + 1000);
    extra[7] = haddr;
    test_ps_start(p, extra);
}

static void start(test_ps *p, const char *cold_dir)
{
    start_with(p, cold_dir, false);
}

static void test_same_as_ram_and_restore(void **state)
{
    (void)state;
    if (!cold_store_available()) {
        fprintf(stderr, "skipped: built without RocksDB (no cold tier)\n");
        skip();
    }
    test_ps p;
    test_ps_init(&p, server_bin, "psd-cold");
    char cold_dir[300];
    snprintf(cold_dir, sizeof(cold_dir), "%s/cold", p.dir);
    assert_int_equal(mkdir(cold_dir, 0755), 0);
    start(&p, cold_dir);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    tables ts;
    make_tables(c, &ts);
    push_rounds(&ts, ROUNDS);
    float *saved = malloc(NKINDS * IDS * DIM * sizeof(float));
    assert_non_null(saved);
    assert_tables_agree(&ts, NULL, false);

    /* /metrics: most of the cold table's rows on disk, at most its RAM share in RAM. */
    char *body = NULL;
    int hport = p.port + 1000 > 65000 ? p.port - 1000 : p.port + 1000;
    assert_int_equal(test_http_get(hport, "/metrics", &body), 200);
    double disk = sample(body, "psd_table_rows{table=\"cold/adam_cold\",tier=\"disk\"}");
    double ram = sample(body, "psd_table_rows{table=\"cold/adam_cold\",tier=\"ram\"}");
    double all = sample(body, "psd_table_rows{table=\"cold/adam_ram\",tier=\"ram\"}");
    fprintf(stderr, "adam: %g rows in RAM, %g on disk (the table in RAM: %g)\n", ram, disk, all);
    assert_true(ram <= RAM_ROWS && disk > 0 && ram + disk == all);
    assert_true(sample(body, "psd_table_promotions_total{table=\"cold/adam_cold\"}") > 0);
    assert_true(sample(body, "psd_table_demotions_total{table=\"cold/adam_cold\"}") > 0);
    assert_true(sample(body, "psd_table_cold_errors_total{table=\"cold/adam_cold\"}") == 0);
    free(body);

    /* A checkpoint, then pushes lost to a SIGKILL. */
    assert_int_equal(raw_checkpoint(p.port), 0);
    assert_tables_agree(&ts, saved, false);
    push_rounds(&ts, 3);
    free_tables(&ts);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);

    start(&p, cold_dir);
    /* The killed process's stores were removed at the start: only the restored tables' are
     * left (one per cold table). */
    assert_int_equal(count_entries(cold_dir), (int)NKINDS);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    make_tables(c, &ts); /* the restored tables (same specs) */
    assert_tables_agree(&ts, saved, true);
    /* The optimizer state came back too: more pushes still agree. */
    push_rounds(&ts, 10);
    assert_tables_agree(&ts, NULL, false);
    free_tables(&ts);
    ps_client_close(c);
    free(saved);
    test_ps_signal_wait(&p, SIGTERM, 0);
    /* A server that stops removes its tables' stores. */
    assert_int_equal(count_entries(cold_dir), 0);
    test_ps_cleanup(&p);
}

/* The newest checkpoint file's sequence number in dir (ckpt-0-N.psc), -1 when none. */
static int newest_checkpoint(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int best = -1, seq;
    char tail[8];
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (sscanf(e->d_name, "ckpt-0-%d.%4s", &seq, tail) == 2 && strcmp(tail, "psc") == 0 &&
            seq > best)
            best = seq;
    closedir(d);
    return best;
}

/* Two checkpoints of the cold tables, rows pushed between them, then the server killed -9:
 * what the damaged-file tests start from (saved: the tables' values at the older one). */
typedef struct damaged {
    test_ps p;
    char cold_dir[300];
    float *saved;
    int good, bad; /* the older checkpoint's seq, the newer one's (the one to damage) */
} damaged;

static void damaged_setup(damaged *f, const char *name)
{
    test_ps_init(&f->p, server_bin, name);
    snprintf(f->cold_dir, sizeof(f->cold_dir), "%s/cold", f->p.dir);
    assert_int_equal(mkdir(f->cold_dir, 0755), 0);
    start(&f->p, f->cold_dir);
    ps_client *c = test_ps_open_client(&f->p, NULL, NULL);
    assert_non_null(c);
    tables ts;
    make_tables(c, &ts);
    push_rounds(&ts, ROUNDS / 3);
    f->saved = malloc(NKINDS * IDS * DIM * sizeof(float));
    assert_non_null(f->saved);
    assert_int_equal(raw_checkpoint(f->p.port), 0);
    f->good = newest_checkpoint(f->p.dir);
    assert_tables_agree(&ts, f->saved, false);
    push_rounds(&ts, 5);
    assert_int_equal(raw_checkpoint(f->p.port), 0);
    f->bad = newest_checkpoint(f->p.dir);
    assert_true(f->good >= 0 && f->bad > f->good);
    free_tables(&ts);
    ps_client_close(c);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
}

/* Flips n bytes of the file at path, from 1/part of its length on. */
static void flip_bytes(const char *path, long part, int n)
{
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long at = ftell(fp) / part;
    for (int i = 0; i < n; i++) {
        fseek(fp, at + i, SEEK_SET);
        int ch = fgetc(fp);
        fseek(fp, at + i, SEEK_SET);
        fputc(ch ^ 0x5a, fp);
    }
    fclose(fp);
}

/* Restarts the server of f after the damage: its log names the newer checkpoint unusable (and
 * `also`, when not NULL), it restores the older one, whose rows come back exactly. */
static void damaged_restart(damaged *f, const char *also)
{
    char text[500];
    start(&f->p, f->cold_dir);
    snprintf(text, sizeof(text), "ckpt-0-%d.psc is unusable (", f->bad);
    assert_true(test_file_contains(f->p.log, text));
    if (also != NULL)
        assert_true(test_file_contains(f->p.log, also));
    snprintf(text, sizeof(text), "checkpoint %d (full %d + 0 deltas)", f->good, f->good);
    assert_true(test_file_contains(f->p.log, text));
    ps_client *c = test_ps_open_client(&f->p, NULL, NULL);
    assert_non_null(c);
    tables ts;
    make_tables(c, &ts);
    assert_tables_agree(&ts, f->saved, true);
    free_tables(&ts);
    ps_client_close(c);
    free(f->saved);
    test_ps_signal_wait(&f->p, SIGTERM, 0);
    test_ps_cleanup(&f->p);
}

/* (e) A damaged checkpoint file holding cold tables' rows (bytes flipped inside it): the
 * restart names the file as unusable and restores the checkpoint before it, whose rows come
 * back exactly, never a crash or rows silently wrong. */
static void test_damaged_checkpoint(void **state)
{
    (void)state;
    if (!cold_store_available()) {
        fprintf(stderr, "skipped: built without RocksDB (no cold tier)\n");
        skip();
    }
    damaged f;
    damaged_setup(&f, "psd-cold-bad");
    /* Bytes flipped in the middle of the newest file (most of it is the cold tables' rows). */
    char path[400];
    snprintf(path, sizeof(path), "%s/ckpt-0-%d.psc", f.p.dir, f.bad);
    flip_bytes(path, 2, 8);
    damaged_restart(&f, NULL);
}

/* Bytes of the files in dir (one level: the stores' copies of ckpt-0-N.cold), of those whose
 * inode is not in not_in (when not NULL): what a checkpoint wrote, hard links not counted. */
static uint64_t cold_copy_bytes(const char *dir, const char *not_in)
{
    uint64_t total = 0;
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sub[700];
        snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
        DIR *s = opendir(sub);
        assert_non_null(s);
        struct dirent *f;
        while ((f = readdir(s)) != NULL) {
            if (f->d_name[0] == '.')
                continue;
            char file[1000], other[1000];
            struct stat st, ot;
            snprintf(file, sizeof(file), "%s/%s", sub, f->d_name);
            assert_int_equal(stat(file, &st), 0);
            if (not_in != NULL) {
                snprintf(other, sizeof(other), "%s/%s/%s", not_in, e->d_name, f->d_name);
                if (stat(other, &ot) == 0 && ot.st_ino == st.st_ino)
                    continue;
            }
            total += (uint64_t)st.st_size;
        }
        closedir(s);
    }
    closedir(d);
    return total;
}

static uint64_t file_bytes(const char *path)
{
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    return (uint64_t)st.st_size;
}

/* (g) A checkpoint after a change of 1% of the rows: its file holds the tables' RAM rows and
 * names copies of the cold stores (ckpt-0-N.cold) whose files are mostly hard links to the
 * previous copy's, so that it writes far less than the whole tables; its restore is bit for
 * bit the twins in RAM; pruning (checkpoint-keep 1, a full file every 4) deletes the older copies.
 */
static void test_linked_checkpoint(void **state)
{
    (void)state;
    if (!cold_store_available()) {
        fprintf(stderr, "skipped: built without RocksDB (no cold tier)\n");
        skip();
    }
    test_ps p;
    test_ps_init(&p, server_bin, "psd-cold-link");
    char cold_dir[300];
    snprintf(cold_dir, sizeof(cold_dir), "%s/cold", p.dir);
    assert_int_equal(mkdir(cold_dir, 0755), 0);
    start_with(&p, cold_dir, true);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    tables ts;
    make_tables(c, &ts);
    /* Every id made (pushes in order), then random pushes. */
    static int64_t ids[IDS];
    static float g[IDS * DIM];
    for (int64_t i = 0; i < IDS; i++)
        ids[i] = i;
    for (size_t i = 0; i < IDS * DIM; i++)
        g[i] = 0.125f;
    for (size_t k = 0; k < NKINDS; k++)
        for (int cold = 0; cold < 2; cold++)
            assert_int_equal(ps_table_push(ts.t[k][cold], ids, IDS, g), PS_OK);
    push_rounds(&ts, ROUNDS / 3);
    assert_int_equal(raw_checkpoint(p.port), 0);
    int first = newest_checkpoint(p.dir);
    char psc1[400], cold1[400], psc2[400], cold2[400];
    snprintf(psc1, sizeof(psc1), "%s/ckpt-0-%d.psc", p.dir, first);
    snprintf(cold1, sizeof(cold1), "%s/ckpt-0-%d.cold", p.dir, first);
    uint64_t whole = file_bytes(psc1) + cold_copy_bytes(cold1, NULL);

    /* 1% of the ids pushed (the same rows of every table). */
    for (size_t k = 0; k < NKINDS; k++)
        for (int cold = 0; cold < 2; cold++)
            assert_int_equal(ps_table_push(ts.t[k][cold], ids + IDS / 2, IDS / 100, g), PS_OK);
    assert_int_equal(raw_checkpoint(p.port), 0);
    int second = newest_checkpoint(p.dir);
    assert_true(second > first);
    snprintf(psc2, sizeof(psc2), "%s/ckpt-0-%d.psc", p.dir, second);
    snprintf(cold2, sizeof(cold2), "%s/ckpt-0-%d.cold", p.dir, second);
    uint64_t file2 = file_bytes(psc2), copy2 = cold_copy_bytes(cold2, cold1);
    fprintf(stderr,
            "first checkpoint: %" PRIu64 " bytes; after a 1%% change: file %" PRIu64
            ", new store files %" PRIu64 " (shared by link: %" PRIu64 ")\n",
            whole, file2, copy2, cold_copy_bytes(cold2, NULL) - copy2);
    assert_true((file2 + copy2) * 3 < whole);
    float *saved = malloc(NKINDS * IDS * DIM * sizeof(float));
    assert_non_null(saved);
    assert_tables_agree(&ts, saved, false);
    push_rounds(&ts, 3); /* lost to the kill */
    free_tables(&ts);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);

    start_with(&p, cold_dir, true);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    make_tables(c, &ts);
    assert_tables_agree(&ts, saved, true);
    push_rounds(&ts, 5);
    assert_tables_agree(&ts, NULL, false);
    /* More checkpoints than are kept: every copy left is named by a file left. */
    for (int i = 0; i < 6; i++)
        assert_int_equal(raw_checkpoint(p.port), 0);
    assert_true(access(psc1, F_OK) != 0 && access(cold1, F_OK) != 0);
    DIR *d = opendir(p.dir);
    assert_non_null(d);
    struct dirent *e;
    int copies = 0;
    while ((e = readdir(d)) != NULL) {
        int seq;
        char tail[8], file[400];
        if (sscanf(e->d_name, "ckpt-0-%d.%5s", &seq, tail) != 2 || strcmp(tail, "cold") != 0)
            continue;
        snprintf(file, sizeof(file), "%s/ckpt-0-%d.psc", p.dir, seq);
        assert_int_equal(access(file, F_OK), 0);
        copies++;
    }
    closedir(d);
    assert_true(copies > 0);
    free_tables(&ts);
    ps_client_close(c);
    free(saved);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* A checkpoint whose copy of the stores cannot be made (a file stands where its directory
 * would go) writes the cold tables' rows one by one, as files before linked copies did
 * (record 6), and that form restores bit for bit too. */
static void test_rows_form(void **state)
{
    (void)state;
    if (!cold_store_available()) {
        fprintf(stderr, "skipped: built without RocksDB (no cold tier)\n");
        skip();
    }
    test_ps p;
    test_ps_init(&p, server_bin, "psd-cold-rows");
    char cold_dir[300], block[400];
    snprintf(cold_dir, sizeof(cold_dir), "%s/cold", p.dir);
    assert_int_equal(mkdir(cold_dir, 0755), 0);
    start(&p, cold_dir);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    tables ts;
    make_tables(c, &ts);
    push_rounds(&ts, ROUNDS / 3);
    int next = newest_checkpoint(p.dir) + 1;
    if (next < 1)
        next = 1;
    snprintf(block, sizeof(block), "%s/ckpt-0-%d.cold", p.dir, next);
    FILE *fp = fopen(block, "w");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(raw_checkpoint(p.port), 0);
    assert_int_equal(newest_checkpoint(p.dir), next);
    assert_true(test_file_contains(p.log, "tables with a cold tier are written row by row"));
    float *saved = malloc(NKINDS * IDS * DIM * sizeof(float));
    assert_non_null(saved);
    assert_tables_agree(&ts, saved, false);
    free_tables(&ts);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGKILL, 128 + SIGKILL);

    start(&p, cold_dir);
    c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    make_tables(c, &ts);
    assert_tables_agree(&ts, saved, true);
    free_tables(&ts);
    ps_client_close(c);
    free(saved);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* The first store file (.sst) in the copies of dir not in those of older (a file of the
 * newer checkpoint only) into out. False when there is none. */
static bool sst_only_in(const char *dir, const char *older, char *out, size_t cap)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    bool found = false;
    while (!found && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sub[700];
        snprintf(sub, sizeof(sub), "%s/%s", dir, e->d_name);
        DIR *s = opendir(sub);
        assert_non_null(s);
        struct dirent *f;
        while (!found && (f = readdir(s)) != NULL) {
            size_t n = strlen(f->d_name);
            char other[1000];
            struct stat st;
            snprintf(other, sizeof(other), "%s/%s/%s", older, e->d_name, f->d_name);
            if (n > 4 && strcmp(f->d_name + n - 4, ".sst") == 0 && stat(other, &st) != 0) {
                snprintf(out, cap, "%s/%s", sub, f->d_name);
                found = true;
            }
        }
        closedir(s);
    }
    closedir(d);
    return found;
}

/* (e) A damaged file in the copy of a cold store that the newest checkpoint names: the restart
 * names the checkpoint unusable, with the damaged copy, and restores the one before it
 * exactly. */
static void test_damaged_cold_copy(void **state)
{
    (void)state;
    if (!cold_store_available()) {
        fprintf(stderr, "skipped: built without RocksDB (no cold tier)\n");
        skip();
    }
    damaged f;
    damaged_setup(&f, "psd-cold-badcopy");
    /* Bytes flipped in the middle of a store file only the newest copy has. */
    char bad_dir[400], good_dir[400], sst[1000], text[500];
    snprintf(bad_dir, sizeof(bad_dir), "%s/ckpt-0-%d.cold", f.p.dir, f.bad);
    snprintf(good_dir, sizeof(good_dir), "%s/ckpt-0-%d.cold", f.p.dir, f.good);
    assert_true(sst_only_in(bad_dir, good_dir, sst, sizeof(sst)));
    flip_bytes(sst, 3, 16);
    snprintf(text, sizeof(text), "ckpt-0-%d.cold/", f.bad);
    damaged_restart(&f, text);
}

/* (f) A cold-dir on a small tmpfs that fills mid-run (root only, else skipped saying why):
 * pushes that need the disk are refused with RESOURCE_EXHAUSTED naming the cold-dir, every
 * acknowledged push is kept (rows equal to a table in RAM given the same acknowledged
 * pushes), and the server goes on serving and stops cleanly. */
static void test_disk_full(void **state)
{
    (void)state;
    if (!cold_store_available()) {
        fprintf(stderr, "skipped: built without RocksDB (no cold tier)\n");
        skip();
    }
    if (geteuid() != 0) {
        fprintf(stderr, "skipped: mounting a small tmpfs as cold-dir needs root\n");
        skip();
    }
    test_ps p;
    test_ps_init(&p, server_bin, "psd-cold-full");
    char cold_dir[300], cmd[700];
    snprintf(cold_dir, sizeof(cold_dir), "%s/cold", p.dir);
    assert_int_equal(mkdir(cold_dir, 0755), 0);
    snprintf(cmd, sizeof(cmd), "mount -t tmpfs -o size=%llum psd-cold-it %s",
             (unsigned long long)(cold_store_headroom() >> 20) + 48, cold_dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "skipped: %s failed (no tmpfs mount here)\n", cmd);
        test_ps_cleanup(&p);
        skip();
    }
    start(&p, cold_dir);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    enum { FDIM = 64, FBATCH = 2000, FMAX = 400 };
    ps_table *t[2];
    for (int cold = 0; cold < 2; cold++) {
        ps_table_spec s;
        ps_table_spec_init(&s, cold ? "full/cold" : "full/ram", FDIM, PS_OPT_ADAGRAD);
        s.initializer = PS_INIT_CONSTANT;
        s.init_a = 0.25;
        s.ram_rows = cold ? 5000 : 0;
        assert_int_equal(ps_table_create(c, &s, &t[cold]), PS_OK);
    }
    static int64_t ids[FBATCH];
    static float g[FBATCH * FDIM], a[FBATCH * FDIM], b[FBATCH * FDIM];
    for (size_t i = 0; i < FBATCH * FDIM; i++)
        g[i] = ((float)(rnd() % 2001) - 1000.0f) / 2000.0f;
    int acked = 0, rc = PS_OK;
    char why[1024] = "";
    while (acked < FMAX) {
        for (int i = 0; i < FBATCH; i++)
            ids[i] = (int64_t)acked * FBATCH + i;
        rc = ps_table_push(t[1], ids, FBATCH, g);
        if (rc != PS_OK) {
            snprintf(why, sizeof(why), "%s", ps_last_error());
            break;
        }
        assert_int_equal(ps_table_push(t[0], ids, FBATCH, g), PS_OK);
        acked++;
    }
    fprintf(stderr, "after %d batches of %d rows: %s\n", acked, FBATCH, why);
    assert_int_equal(rc, PS_RESOURCE_EXHAUSTED);
    assert_non_null(strstr(why, cold_dir));
    assert_non_null(strstr(why, "short of room"));
    assert_true(acked > 0);
    /* Every acknowledged row, from both tiers, as in RAM. */
    for (int k = 0; k < acked; k++) {
        for (int i = 0; i < FBATCH; i++)
            ids[i] = (int64_t)k * FBATCH + i;
        assert_int_equal(ps_table_pull(t[0], ids, FBATCH, a), PS_OK);
        assert_int_equal(ps_table_pull(t[1], ids, FBATCH, b), PS_OK);
        assert_memory_equal(a, b, sizeof(a));
    }
    /* The server goes on: a table in RAM still takes pushes. */
    assert_int_equal(ps_table_push(t[0], ids, FBATCH, g), PS_OK);
    ps_table_free(t[0]);
    ps_table_free(t[1]);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    snprintf(cmd, sizeof(cmd), "umount %s", cold_dir);
    assert_int_equal(system(cmd), 0);
    test_ps_cleanup(&p);
}

static void test_cold_dir_errors(void **state)
{
    (void)state;
    test_ps p;
    test_ps_init(&p, server_bin, "psd-cold-dir");
    char missing[300];
    snprintf(missing, sizeof(missing), "%s/no-such-dir", p.dir);
    const char *extra[] = {"--cold-dir", missing, NULL};
    pid_t pid = test_server_spawn(server_bin, p.spec, 0, extra, p.log);
    assert_true(pid > 0);
    assert_int_equal(test_wait_exit(pid, 10000), 2);
    assert_true(test_file_contains(p.log, "cold-dir"));
    assert_true(test_file_contains(p.log, "no-such-dir"));

    /* Without cold-dir: a table with ram_rows is refused, naming the setting (or the missing
     * RocksDB). */
    test_ps_start(&p, NULL);
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_table_spec s;
    ps_table_spec_init(&s, "cold/refused", 4, PS_OPT_SGD);
    s.ram_rows = 10;
    ps_table *t = NULL;
    assert_int_equal(ps_table_create(c, &s, &t), PS_INVALID_ARGUMENT);
    fprintf(stderr, "refused: %s\n", ps_last_error());
    assert_non_null(strstr(ps_last_error(), cold_store_available() ? "cold-dir" : "RocksDB"));
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* A raw TablePrefetch of n ids (seg: seglen bytes) of table name: the reply's status, its
 * message in msg. */
static int raw_prefetch(int port, const char *name, uint64_t n, const void *seg, size_t seglen,
                        char *msg, size_t cap)
{
    Psd__V1__TablePrefetchRequest req = PSD__V1__TABLE_PREFETCH_REQUEST__INIT;
    req.name = (char *)name;
    req.n = n;
    uint8_t body[512];
    size_t blen = psd__v1__table_prefetch_request__pack(&req, body);
    envelope env = PSD__V1__ENVELOPE__INIT;
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    tm.dtype = PSD__V1__DTYPE__FLOAT32;
    tm.count = seglen / 4;
    env.tensor = &tm;
    env.method = PSD__V1__METHOD__TABLE_PREFETCH;
    env.request_id = 1;
    env.worker_id = -1;
    env.body.data = body;
    env.body.len = blen;
    frame f;
    nng_msg *m;
    int st = test_raw_call(port, &env, seg, seglen, &f, &m);
    if (st < -999)
        return st;
    snprintf(msg, cap, "%s", f.env->message ? f.env->message : "");
    frame_fini(&f);
    nng_msg_free(m);
    return st;
}

/* The table's counter from /metrics. */
static double table_counter(int hport, const char *counter, const char *table)
{
    char *body = NULL, series[256];
    assert_int_equal(test_http_get(hport, "/metrics", &body), 200);
    snprintf(series, sizeof(series), "%s{table=\"%s\"}", counter, table);
    double v = sample(body, series);
    free(body);
    return v;
}

static void test_prefetch(void **state)
{
    (void)state;
    if (!cold_store_available()) {
        fprintf(stderr, "skipped: built without RocksDB (no cold tier)\n");
        skip();
    }
    enum { ROWS = 6000, RAM = 3200, PB = 500, PRE = 64 };
    test_ps p;
    test_ps_init(&p, server_bin, "psd-cold-pre");
    char cold_dir[300];
    snprintf(cold_dir, sizeof(cold_dir), "%s/cold", p.dir);
    assert_int_equal(mkdir(cold_dir, 0755), 0);
    start(&p, cold_dir);
    int hport = p.port + 1000 > 65000 ? p.port - 1000 : p.port + 1000;
    ps_client *c = test_ps_open_client(&p, NULL, NULL);
    assert_non_null(c);
    ps_table_spec s;
    ps_table_spec_init(&s, "cold/pre", DIM, PS_OPT_ADAGRAD);
    s.ram_rows = RAM;
    ps_table *t = NULL;
    assert_int_equal(ps_table_create(c, &s, &t), PS_OK);
    static int64_t ids[ROWS];
    static float g[PB * DIM], rows[PRE * DIM];
    for (int64_t i = 0; i < ROWS; i++)
        ids[i] = i;
    for (size_t i = 0; i < PB * DIM; i++)
        g[i] = 0.125f;
    for (size_t off = 0; off < ROWS; off += PB)
        assert_int_equal(ps_table_push(t, ids + off, PB, g), PS_OK);

    /* The first pushed are on disk (each partition keeps its ~50 latest in RAM). */
    double hits0 = table_counter(hport, "psd_table_cold_hits_total", "cold/pre");
    double prom0 = table_counter(hport, "psd_table_promotions_total", "cold/pre");
    uint64_t cold = 0;
    assert_int_equal(ps_table_prefetch(t, ids, PRE, &cold), PS_OK);
    double prom1 = table_counter(hport, "psd_table_promotions_total", "cold/pre");
    fprintf(stderr, "prefetch: %llu of %d ids were on disk; promotions %g -> %g\n",
            (unsigned long long)cold, PRE, prom0, prom1);
    assert_true(cold > PRE / 2);
    assert_true(prom1 - prom0 == (double)cold);
    assert_true(table_counter(hport, "psd_table_cold_hits_total", "cold/pre") == hits0);
    /* The asynchronous form, of the same ids (now in RAM: nothing to bring), with
     * duplicates. */
    ps_op *op = NULL;
    int64_t dup[4] = {0, 0, 1, 0};
    assert_int_equal(ps_table_prefetch_async(t, dup, 4, NULL, NULL, &op), PS_OK);
    assert_int_equal(ps_op_wait(op), PS_OK);
    ps_op_destroy(op);
    /* The following pull finds every row in RAM. */
    assert_int_equal(ps_table_pull(t, ids, PRE, rows), PS_OK);
    assert_true(table_counter(hport, "psd_table_cold_hits_total", "cold/pre") == hits0);
    assert_true(table_counter(hport, "psd_table_promotions_total", "cold/pre") == prom1);

    /* Ids not in the table make no row. */
    ps_table_info info = {.struct_size = sizeof(info)};
    assert_int_equal(ps_table_info_get(c, "cold/pre", &info), PS_OK);
    uint64_t before = info.rows;
    int64_t absent[3] = {1000000, 1000001, -7};
    assert_int_equal(ps_table_prefetch(t, absent, 3, &cold), PS_OK);
    assert_int_equal(cold, 0);
    assert_int_equal(ps_table_info_get(c, "cold/pre", &info), PS_OK);
    assert_int_equal(info.rows, before);

    /* Bad input, named. */
    char msg[512];
    int64_t one = 5;
    assert_int_equal(raw_prefetch(p.port, "cold/nope", 1, &one, 8, msg, sizeof(msg)), PS_NOT_FOUND);
    fprintf(stderr, "unknown table: %s\n", msg);
    assert_non_null(strstr(msg, "cold/nope"));
    assert_int_equal(raw_prefetch(p.port, "cold/pre", (1ull << 22) + 1, &one, 8, msg, sizeof(msg)),
                     PS_INVALID_ARGUMENT);
    fprintf(stderr, "too many ids: %s\n", msg);
    assert_non_null(strstr(msg, "ids (must be 1.."));
    assert_int_equal(raw_prefetch(p.port, "cold/pre", 2, &one, 8, msg, sizeof(msg)),
                     PS_INVALID_ARGUMENT);
    fprintf(stderr, "short segment: %s\n", msg);
    assert_non_null(strstr(msg, "segment"));
    ps_table_free(t);
    ps_client_close(c);
    test_ps_signal_wait(&p, SIGTERM, 0);
    test_ps_cleanup(&p);
}

/* ---- replicated tables with a cold tier ------------------------------------------------- */

enum {
    R_SERVERS = 3,
    R_DIM = 8,
    R_IDS = 3000, /* about 1,000 rows a group */
    R_RAM = 128,  /* each copy's RAM share: 2 rows a partition, about a tenth of its rows */
    R_BATCH = 256,
    R_ROUNDS = 16,
    R_KILL_AT = 6,   /* the round after which ps 1 is killed (-9) and restarted */
    R_REJOINED = 10, /* the round before which the test waits for ps 1 to be back in the view */
};

static const ps_optimizer r_kinds[] = {PS_OPT_SGD, PS_OPT_ADAGRAD};
#define R_NKINDS (sizeof(r_kinds) / sizeof(r_kinds[0]))

/* The reason a replicated cold test cannot run (no RocksDB, no etcd), or NULL. */
static const char *replicated_skip_reason(void)
{
    if (!cold_store_available())
        return "built without RocksDB (no cold tier)";
    if (etcd_proc_binary() == NULL)
        return "no etcd binary (/usr/bin/etcd, $PSD_ETCD or etcd on PATH): replicated clusters "
               "need one as their coordinator";
    return NULL;
}

static int64_t r_ms_since(const struct timespec *t0)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (now.tv_sec - t0->tv_sec) * 1000 + (now.tv_nsec - t0->tv_nsec) / 1000000;
}

/* Every group's primary (ps g) and backup (ps g + 1) at the same log position with the same
 * checksum (asked again while a log position moves between the two answers); false, with
 * each group's line on stderr, when one differs. */
static bool copies_agree(const test_cluster *tc)
{
    bool same = true;
    for (uint32_t grp = 0; grp < R_SERVERS; grp++) {
        int b = (int)((grp + 1) % R_SERVERS);
        uint64_t s0 = 0, s1 = 1, l0 = 0, l1 = 1;
        for (int tries = 0; tries < 100 && l0 != l1; tries++) {
            assert_int_equal(test_group_checksum(tc->ports[grp], grp, 0, &s0, NULL, &l0), 0);
            assert_int_equal(test_group_checksum(tc->ports[b], grp, 0, &s1, NULL, &l1), 0);
            if (l0 != l1)
                usleep(20 * 1000);
        }
        fprintf(stderr, "group %u: %016llx at lsn %llu on ps %u, %016llx at lsn %llu on ps %d\n",
                grp, (unsigned long long)s0, (unsigned long long)l0, grp, (unsigned long long)s1,
                (unsigned long long)l1, b);
        same = same && l0 == l1 && s0 == s1;
    }
    return same;
}

/* Waits (60 s at most) until ps 0's view epoch is at least `at_least`. */
static void r_wait_epoch(const test_cluster *tc, uint64_t at_least)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (test_server_epoch(tc->ports[0]) < at_least) {
        assert_true(r_ms_since(&t0) < 60000);
        usleep(50 * 1000);
    }
}

/* A table of the replicated tests: dim, optimizer, learning rate 1 for SGD, every row 0.25 at
 * first (the same rows under every name), ram_rows as given (0: wholly in RAM). */
static ps_table *r_table(ps_client *c, const char *name, uint32_t dim, ps_optimizer kind,
                         uint64_t ram_rows)
{
    ps_table_spec s;
    ps_table_spec_init(&s, name, dim, kind);
    s.initializer = PS_INIT_CONSTANT;
    s.init_a = 0.25;
    if (kind == PS_OPT_SGD)
        s.learning_rate = 1.0;
    s.ram_rows = ram_rows;
    ps_table *t = NULL;
    int rc = ps_table_create(c, &s, &t);
    if (rc != PS_OK)
        fprintf(stderr, "create %s: %s\n", name, ps_last_error());
    assert_int_equal(rc, PS_OK);
    return t;
}

/* Pulls ids[0..n) of both tables and asserts the rows are equal bit for bit. */
static void r_pull_agree(ps_table *cold, ps_table *ram, const int64_t *ids, size_t n)
{
    static float a[R_IDS * R_DIM], b[R_IDS * R_DIM];
    assert_true(n <= R_IDS);
    assert_int_equal(ps_table_pull(ram, ids, n, a), PS_OK);
    assert_int_equal(ps_table_pull(cold, ids, n, b), PS_OK);
    assert_memory_equal(a, b, n * R_DIM * sizeof(float));
}

/* A replicated cluster of the tests below, its directory (cold-dirs) under /tmp. */
typedef struct r_cluster {
    test_cluster tc;
    etcd_proc etcd;
    test_repl_flags flags;
    char base[64];
    char cold[128];
} r_cluster;

/* Skips the test, saying why, without RocksDB or etcd. Otherwise starts 3 servers (replicas 2,
 * a real etcd, leases of 1 s) with cold-dir base/cold and the flags `more` (NULL-terminated,
 * may be NULL), and returns a client of them. */
static ps_client *r_start(r_cluster *rc, const char *const *more)
{
    const char *why = replicated_skip_reason();
    if (why) {
        fprintf(stderr, "skipped: %s\n", why);
        skip();
    }
    snprintf(rc->base, sizeof(rc->base), "/tmp/psd-coldrep-XXXXXX");
    assert_non_null(mkdtemp(rc->base));
    snprintf(rc->cold, sizeof(rc->cold), "%s/cold", rc->base);
    assert_int_equal(mkdir(rc->cold, 0755), 0);
    const char *all[12] = {"--cold-dir", rc->cold};
    size_t k = 2;
    for (size_t i = 0; more != NULL && more[i] != NULL && k + 1 < 12; i++)
        all[k++] = more[i];
    all[k] = NULL;
    assert_int_equal(test_replicated_start(&rc->tc, &rc->etcd, &rc->flags, server_bin, R_SERVERS, 0,
                                           "2", "1000", all),
                     0);
    ps_client *c = test_replicated_client(&rc->tc, -1, "2", NULL);
    assert_non_null(c);
    return c;
}

/* Closes c, stops the servers (each must exit 0) and etcd, and removes the directory. */
static void r_stop(r_cluster *rc, ps_client *c)
{
    ps_client_close(c);
    assert_int_equal(test_replicated_stop(&rc->tc, &rc->etcd), 0);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rc->base);
    assert_int_equal(system(cmd), 0);
}

/* Replicas 2 on 3 servers: for SGD and Adagrad a table whose RAM share holds about a tenth of
 * its rows (each server's cold-dir holds the rest) and its twin wholly in RAM get the same
 * random pushes, with pulls of random ids (most of them on disk) between them compared bit for
 * bit; ps 1 is killed (-9) mid-run and restarted with a cold-dir of its own, copies groups 0 and
 * 1 back (their rows on disk included: its cold-dir holds their stores) while pushes go on.
 * At the end every row of each cold table equals its twin's bit for bit, and every group's
 * primary and backup hold the same rows (checksums over both tiers). */
static void test_replicated_cold_same_as_ram(void **state)
{
    (void)state;
    r_cluster rc;
    ps_client *c = r_start(&rc, NULL);
    ps_table *t[R_NKINDS][2];
    for (size_t k = 0; k < R_NKINDS; k++)
        for (int cold = 0; cold < 2; cold++) {
            char name[64];
            snprintf(name, sizeof(name), "rcold/%s_%s", ps_optimizer_name(r_kinds[k]),
                     cold ? "cold" : "ram");
            t[k][cold] = r_table(c, name, R_DIM, r_kinds[k], cold ? R_RAM : 0);
        }
    static int64_t ids[R_IDS];
    static float g[R_BATCH * R_DIM];
    char rejoin_dir[300];
    snprintf(rejoin_dir, sizeof(rejoin_dir), "%s/cold-rejoined", rc.base);
    assert_int_equal(mkdir(rejoin_dir, 0755), 0);
    uint64_t e0 = 0;
    for (int r = 0; r < R_ROUNDS; r++) {
        for (size_t i = 0; i < R_BATCH; i++) {
            ids[i] = (int64_t)(rnd() % 2 ? rnd() % (R_IDS / 10) : rnd() % R_IDS);
            for (int d = 0; d < R_DIM; d++)
                g[i * R_DIM + d] = ((float)(rnd() % 2001) - 1000.0f) / 2000.0f;
        }
        for (size_t k = 0; k < R_NKINDS; k++)
            for (int cold = 0; cold < 2; cold++) {
                int st = ps_table_push(t[k][cold], ids, R_BATCH, g);
                if (st != PS_OK)
                    fprintf(stderr, "round %d push: %s\n", r, ps_last_error());
                assert_int_equal(st, PS_OK);
            }
        /* Pulls of random ids between pushes: most of them on disk. */
        for (size_t i = 0; i < R_BATCH; i++)
            ids[i] = (int64_t)(rnd() % R_IDS);
        for (size_t k = 0; k < R_NKINDS; k++)
            r_pull_agree(t[k][1], t[k][0], ids, R_BATCH);
        if (r == R_KILL_AT) {
            e0 = test_server_epoch(rc.tc.ports[0]);
            assert_int_equal(kill(rc.tc.pids[1], SIGKILL), 0);
            int st;
            assert_int_equal(waitpid(rc.tc.pids[1], &st, 0), rc.tc.pids[1]);
            /* Its own cold-dir this time (the flags with --cold-dir's value replaced). */
            const char *v[TEST_REPL_MAX_FLAGS];
            for (size_t i = 0; i < TEST_REPL_MAX_FLAGS; i++) {
                v[i] = rc.flags.v[i];
                if (i > 0 && rc.flags.v[i - 1] && strcmp(rc.flags.v[i - 1], "--cold-dir") == 0)
                    v[i] = rejoin_dir;
                if (rc.flags.v[i] == NULL)
                    break;
            }
            assert_int_equal(test_cluster_respawn(&rc.tc, server_bin, 1, v), 0);
        }
        if (r + 1 == R_REJOINED)
            r_wait_epoch(&rc.tc, e0 + 2); /* out of the view, then back in it */
    }
    for (int64_t i = 0; i < R_IDS; i++)
        ids[i] = i;
    for (size_t k = 0; k < R_NKINDS; k++)
        r_pull_agree(t[k][1], t[k][0], ids, R_IDS);
    ps_table_info info = {.struct_size = sizeof(info)};
    assert_int_equal(ps_table_info_get(c, "rcold/sgd_cold", &info), PS_OK);
    fprintf(stderr, "rcold/sgd_cold: %llu rows, %llu on disk, %llu promotions, %llu demotions\n",
            (unsigned long long)info.rows, (unsigned long long)info.rows_disk,
            (unsigned long long)info.promotions, (unsigned long long)info.demotions);
    assert_true(info.rows_disk > info.rows / 2);
    /* The restarted server's copies hold rows on disk: its cold-dir has their stores. */
    assert_true(count_entries(rejoin_dir) >= (int)R_NKINDS);
    assert_true(copies_agree(&rc.tc));
    for (size_t k = 0; k < R_NKINDS; k++)
        for (int cold = 0; cold < 2; cold++)
            ps_table_free(t[k][cold]);
    r_stop(&rc, c);
}

enum {
    B_IDS = 6000,        /* rows of the cold table: about 2,000 a group */
    B_FILL_MAX = 400000, /* filler ids pushed at most while waiting for the budget to fill */
};

/* Pushes 0.25 (SGD, learning rate 1) to ids[0..n) of the cold table, counting them in pushed. */
static void b_push(ps_table *t, const int64_t *ids, size_t n, uint32_t *pushed)
{
    static float g[B_IDS * R_DIM];
    assert_true(n <= B_IDS);
    for (size_t i = 0; i < n * R_DIM; i++)
        g[i] = 0.25f;
    int rc = ps_table_push(t, ids, n, g);
    if (rc != PS_OK)
        fprintf(stderr, "cold push: %s\n", ps_last_error());
    assert_int_equal(rc, PS_OK);
    for (size_t i = 0; i < n; i++)
        pushed[ids[i]]++;
}

/* Pulls ids[0..n) of the cold table: each row is exactly 0.25 - 0.25 x its pushes. */
static void b_pull_exact(ps_table *t, const int64_t *ids, size_t n, const uint32_t *pushed)
{
    static float rows[B_IDS * R_DIM];
    assert_true(n <= B_IDS);
    assert_int_equal(ps_table_pull(t, ids, n, rows), PS_OK);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        float want = 0.25f - 0.25f * (float)pushed[ids[i]];
        for (int d = 0; d < R_DIM; d++)
            if (rows[i * R_DIM + d] != want && wrong++ < 5)
                fprintf(stderr, "row %lld: %g, expected %g\n", (long long)ids[i],
                        (double)rows[i * R_DIM + d], (double)want);
    }
    assert_int_equal(wrong, 0);
}

/* Replicas 2, max-server-bytes small enough that the budget, not ram_rows, sends a replicated
 * cold table's rows to disk: a filler table fills the budget, the cold table's new rows then
 * demote its older ones; the filler is deleted (room on every copy alike), the cold table's
 * rows (most on disk) are pulled, and a second filler as large as the first fills the budget
 * again (evicting its own rows where it is full); pushes and pulls of cold ids go on. Every
 * cold row is exactly what its pushes make, and every group's primary and backup hold the same
 * rows: a pull must not bring rows into the primary's RAM that its backup, which sees no pulls,
 * does not count (its budget would then fill earlier and evict other rows). */
static void test_replicated_cold_budget(void **state)
{
    (void)state;
    r_cluster rc;
    static const char *const more[] = {"--max-server-bytes", "8000000", NULL};
    ps_client *c = r_start(&rc, more);
    /* ram_rows: 128 rows a partition, far more than the budget lets a partition keep. */
    ps_table *cold = r_table(c, "rbudget/cold", R_DIM, PS_OPT_SGD, 128 * 64);
    ps_table *fill = r_table(c, "rbudget/filler", 16, PS_OPT_SGD, 0);
    static uint32_t pushed[B_IDS];
    static int64_t ids[B_IDS];
    for (int64_t i = 0; i < B_IDS; i++)
        ids[i] = i;
    b_push(cold, ids, B_IDS / 2, pushed);
    ps_table_info info = {.struct_size = sizeof(info)};
    int64_t filled = 0;
    do {
        test_table_push_range(fill, 16, filled, 30000, 0.5f);
        filled += 30000;
        assert_int_equal(ps_table_info_get(c, "rbudget/filler", &info), PS_OK);
    } while (info.evicted_memory == 0 && filled < B_FILL_MAX);
    fprintf(stderr, "rbudget/filler: full after %lld ids (%llu rows)\n", (long long)filled,
            (unsigned long long)info.rows);
    assert_true(info.evicted_memory > 0);
    /* The budget is full: the cold table's new rows send its older ones to disk. */
    b_push(cold, ids + B_IDS / 2, B_IDS / 2, pushed);
    assert_int_equal(ps_table_info_get(c, "rbudget/cold", &info), PS_OK);
    fprintf(stderr, "rbudget/cold: %llu rows, %llu on disk, %llu demotions\n",
            (unsigned long long)info.rows, (unsigned long long)info.rows_disk,
            (unsigned long long)info.demotions);
    assert_true(info.demotions > 0 && info.rows_disk > 0);
    assert_int_equal(ps_table_delete(c, "rbudget/filler"), PS_OK);
    ps_table_free(fill);
    /* Pulls of every row, most on disk, with room in RAM again. */
    b_pull_exact(cold, ids, B_IDS, pushed);
    fill = r_table(c, "rbudget/filler2", 16, PS_OPT_SGD, 0);
    test_table_push_range(fill, 16, 0, filled, 0.5f);
    for (int r = 0; r < 6; r++) {
        int64_t some[R_BATCH];
        for (size_t i = 0; i < R_BATCH; i++)
            some[i] = (int64_t)(rnd() % B_IDS);
        b_push(cold, some, R_BATCH, pushed);
        for (size_t i = 0; i < R_BATCH; i++)
            some[i] = (int64_t)(rnd() % B_IDS);
        b_pull_exact(cold, some, R_BATCH, pushed);
        test_table_push_range(fill, 16, filled + r * 1000, 1000, 0.5f);
    }
    b_pull_exact(cold, ids, B_IDS, pushed);
    assert_int_equal(ps_table_info_get(c, "rbudget/filler2", &info), PS_OK);
    fprintf(stderr, "rbudget/filler2: %llu rows, %llu evicted under the budget\n",
            (unsigned long long)info.rows, (unsigned long long)info.evicted_memory);
    assert_int_equal(ps_table_info_get(c, "rbudget/cold", &info), PS_OK);
    fprintf(stderr, "rbudget/cold: %llu rows, %llu on disk, %llu promotions, %llu demotions\n",
            (unsigned long long)info.rows, (unsigned long long)info.rows_disk,
            (unsigned long long)info.promotions, (unsigned long long)info.demotions);
    assert_true(copies_agree(&rc.tc));
    ps_table_free(cold);
    ps_table_free(fill);
    r_stop(&rc, c);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PS_SERVER_BINARY\n", argv[0]);
        return 2;
    }
    server_bin = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cold_dir_errors),
        cmocka_unit_test(test_same_as_ram_and_restore),
        cmocka_unit_test(test_prefetch),
        cmocka_unit_test(test_damaged_checkpoint),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_linked_checkpoint),
        cmocka_unit_test(test_damaged_cold_copy),
        cmocka_unit_test(test_rows_form),
        cmocka_unit_test(test_replicated_cold_same_as_ram),
        cmocka_unit_test(test_replicated_cold_budget),
    };
    /* A second argument: only the tests whose names match it (cmocka's filter, * a wildcard). */
    if (argc > 2)
        cmocka_set_test_filter(argv[2]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
