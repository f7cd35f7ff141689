/* Integration: delta checkpoints of sparse tables with a real ps-server. A full checkpoint and
 * deltas restore exactly after SIGKILL (rows, optimizer slots, evicted rows, dense variables);
 * a damaged delta falls back to the file before it and says so; pruning keeps whole chains.
 * And `psctl dump TABLE DIR` (TableExport) over 2 servers, read back with NumPy.
 * Arguments: ps-server, psctl. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster_proc.h"
#include "frame.h"
#include "ps_proc.h"
#include "psclient.h"

static const char *server_bin;
static const char *psctl_bin; /* second argument; NULL: the dump test is skipped */

#define DIM 4
#define NI 2000

typedef struct fixture {
    test_ps p;
    char ckdir[300];
    const char *flags[12];
    ps_client *c;
    ps_table *ada, *cap;
    ps_var *dense;
    int64_t ids[NI];
    float g[NI * DIM];
} fixture;

static void fx_open(fixture *f)
{
    f->c = test_ps_open_client(&f->p, NULL, NULL);
    assert_non_null(f->c);
}

static void fx_close(fixture *f)
{
    ps_table_free(f->ada);
    ps_table_free(f->cap);
    f->ada = f->cap = NULL;
    f->dense = NULL;
    ps_client_close(f->c);
    f->c = NULL;
}

static void fx_reopen(fixture *f);

/* An Adagrad table whose rows start at 0.25 (so that two tables of it are comparable). */
static ps_table *make_ada(fixture *f, const char *name)
{
    ps_table_spec sp;
    ps_table_spec_init(&sp, name, DIM, PS_OPT_ADAGRAD);
    sp.learning_rate = 0.5;
    sp.initializer = PS_INIT_CONSTANT;
    sp.init_a = 0.25;
    ps_table *t;
    assert_int_equal(ps_table_create(f->c, &sp, &t), PS_OK);
    return t;
}

/* A server with checkpoint-full-every `every`, keep `keep`, no periodic checkpoints; a table
 * "t/ada" (Adagrad), a table "t/cap" (SGD, max_rows 40: pushes evict) and a dense variable. */
static void fx_start(fixture *f, const char *prefix, const char *every, const char *keep)
{
    memset(f, 0, sizeof(*f));
    test_ps_init(&f->p, server_bin, prefix);
    snprintf(f->ckdir, sizeof(f->ckdir), "%s/ck", f->p.dir);
    const char *fl[] = {"--checkpoint-dir",
                        f->ckdir,
                        "--checkpoint-full-every",
                        every,
                        "--checkpoint-keep",
                        keep,
                        "--checkpoint-interval-s",
                        "0",
                        NULL};
    memcpy(f->flags, fl, sizeof(fl));
    test_ps_start(&f->p, f->flags);
    fx_open(f);
    /* Each create returns once a checkpoint holds it (checkpoints 1-3); a restart makes the
     * next checkpoint, 4, the full one that starts the tables' chain. */
    f->dense = test_make_var(f->c, "d/w", 1000);
    f->ada = make_ada(f, "t/ada");
    ps_table_spec sp;
    ps_table_spec_init(&sp, "t/cap", DIM, PS_OPT_SGD);
    sp.max_rows = 40;
    assert_int_equal(ps_table_create(f->c, &sp, &f->cap), PS_OK);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&f->p, f->flags);
    assert_true(test_file_contains(f->p.log, "checkpoint 3"));
    fx_reopen(f);
    for (int i = 0; i < NI; i++) {
        f->ids[i] = (int64_t)i * 1000003 - 777777777;
        for (int j = 0; j < DIM; j++)
            f->g[i * DIM + j] = 0.125f * (float)((i + j) % 7) - 0.375f;
    }
}

static void fx_reopen(fixture *f)
{
    fx_open(f);
    assert_int_equal(ps_table_lookup(f->c, "t/ada", &f->ada), PS_OK);
    assert_int_equal(ps_table_lookup(f->c, "t/cap", &f->cap), PS_OK);
    f->dense = test_find_var(f->c, "d/w");
}

/* What a pull of everything returns now: t/ada's NI rows, t/cap's first 100 ids, d/w. */
typedef struct state {
    float ada[NI * DIM];
    float cap[100 * DIM];
    float dense[1000];
} snap;

static void fx_pull(fixture *f, snap *s)
{
    assert_int_equal(ps_table_pull(f->ada, f->ids, NI, s->ada), PS_OK);
    assert_int_equal(ps_table_pull(f->cap, f->ids, 100, s->cap), PS_OK);
    assert_int_equal(ps_pull(f->c, f->dense, s->dense), PS_OK);
}

static off_t file_size(const fixture *f, int seq)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/ckpt-0-%d.psc", f->ckdir, seq);
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

static void flip_bytes(const fixture *f, int seq, double where)
{
    char path[400];
    snprintf(path, sizeof(path), "%s/ckpt-0-%d.psc", f->ckdir, seq);
    FILE *fp = fopen(path, "r+b");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long at = (long)((double)ftell(fp) * where);
    fseek(fp, at, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, at, SEEK_SET);
    fputc(c ^ 0x5a, fp);
    fclose(fp);
}

/* Writes the chain full (4), delta (5), delta (6), each after some changes; after[k] is the
 * state right after checkpoint k+4. */
static void fx_chain(fixture *f, snap *after)
{
    assert_int_equal(ps_table_push(f->ada, f->ids, NI, f->g), PS_OK);
    assert_int_equal(ps_table_push(f->cap, f->ids, 40, f->g), PS_OK);
    test_push_const(f->c, f->dense, 1000, 1.0f);
    assert_int_equal(ps_checkpoint(f->c), PS_OK); /* 4: full (first since the start) */
    fx_pull(f, &after[0]);
    /* 1% of t/ada's rows changed; t/cap: 30 new rows evict 30 old ones. */
    assert_int_equal(ps_table_push(f->ada, f->ids + 100, NI / 100, f->g), PS_OK);
    assert_int_equal(ps_table_push(f->cap, f->ids + 40, 30, f->g), PS_OK);
    assert_int_equal(ps_checkpoint(f->c), PS_OK); /* 5: delta of 4 */
    fx_pull(f, &after[1]);
    assert_int_equal(ps_table_push(f->ada, f->ids + 1500, 10, f->g), PS_OK);
    assert_int_equal(ps_table_push(f->cap, f->ids + 70, 30, f->g), PS_OK);
    test_push_const(f->c, f->dense, 1000, 0.5f);  /* dense variables are whole in deltas */
    assert_int_equal(ps_checkpoint(f->c), PS_OK); /* 6: delta of 5 */
    fx_pull(f, &after[2]);
}

static void expect_state(fixture *f, const snap *want)
{
    snap *got = malloc(sizeof(*got));
    fx_pull(f, got);
    assert_memory_equal(got->ada, want->ada, sizeof(got->ada));
    assert_memory_equal(got->cap, want->cap, sizeof(got->cap));
    assert_memory_equal(got->dense, want->dense, sizeof(got->dense));
    free(got);
}

/* Full + 2 deltas restore exactly after SIGKILL; the optimizer slots came back too. */
static void test_delta_chain_restores_exactly(void **state)
{
    (void)state;
    fixture *f = malloc(sizeof(*f));
    snap *after = malloc(3 * sizeof(*after));
    fx_start(f, "psd-tckpt-chain", "4", "3");
    fx_chain(f, after);
    off_t full = file_size(f, 4), d1 = file_size(f, 5);
    fprintf(stderr, "full checkpoint %lld bytes, delta of 1%% of the rows %lld bytes\n",
            (long long)full, (long long)d1);
    assert_true(full > 0 && d1 > 0 && d1 * 5 < full);
    assert_true(test_file_contains(f->p.log, "ckpt-0-4.psc (full)"));
    assert_true(test_file_contains(f->p.log, "ckpt-0-5.psc (delta of 4)"));
    assert_true(test_file_contains(f->p.log, "ckpt-0-6.psc (delta of 5)"));
    assert_int_equal(ps_table_push(f->ada, f->ids, 5, f->g), PS_OK); /* after 6: lost */
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&f->p, f->flags);
    assert_true(test_file_contains(f->p.log, "checkpoint 6 (full 4 + 2 deltas)"));
    fx_reopen(f);
    expect_state(f, &after[2]);
    /* One more push equals the same pushes into a table that never restarted: Adagrad's
     * accumulators came back (rows start at a constant, so the reference's are the same). */
    assert_int_equal(ps_table_push(f->ada, f->ids, NI, f->g), PS_OK);
    float *got = malloc(sizeof(float) * NI * DIM), *want = malloc(sizeof(float) * NI * DIM);
    assert_int_equal(ps_table_pull(f->ada, f->ids, NI, got), PS_OK);
    ps_table *r = make_ada(f, "t/ada-ref");
    assert_int_equal(ps_table_push(r, f->ids, NI, f->g), PS_OK);
    assert_int_equal(ps_table_push(r, f->ids + 100, NI / 100, f->g), PS_OK);
    assert_int_equal(ps_table_push(r, f->ids + 1500, 10, f->g), PS_OK);
    assert_int_equal(ps_table_push(r, f->ids, NI, f->g), PS_OK);
    assert_int_equal(ps_table_pull(r, f->ids, NI, want), PS_OK);
    assert_memory_equal(got, want, sizeof(float) * NI * DIM);
    ps_table_free(r);
    free(got);
    free(want);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGTERM, 0);
    test_ps_cleanup(&f->p);
    free(after);
    free(f);
}

/* A damaged delta (bytes flipped inside a record) ends its chain at the file before it: the
 * state of that checkpoint comes back and the log says which file was skipped; a damaged
 * delta in the middle of a chain makes the ones after it unusable too. */
static void test_corrupt_delta_falls_back(void **state)
{
    (void)state;
    fixture *f = malloc(sizeof(*f));
    snap *after = malloc(3 * sizeof(*after));
    fx_start(f, "psd-tckpt-bad", "4", "3");
    fx_chain(f, after);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
    flip_bytes(f, 6, 0.5);
    test_ps_start(&f->p, f->flags);
    assert_true(test_file_contains(f->p.log, "ckpt-0-6.psc is unusable ("));
    assert_true(test_file_contains(f->p.log, "restoring checkpoint 5 instead"));
    assert_true(test_file_contains(f->p.log, "checkpoint 5 (full 4 + 1 deltas)"));
    /* The restart verdict names what was lost. */
    assert_true(test_file_contains(f->p.log, "checkpoint 6, the newest the previous server wrote, "
                                             "could not be restored; checkpoint 5 was"));
    fx_reopen(f);
    expect_state(f, &after[1]);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
    /* Now the first delta too (the restarted server wrote nothing: no periodic checkpoint). */
    flip_bytes(f, 5, 0.6);
    test_ps_start(&f->p, f->flags);
    assert_true(test_file_contains(f->p.log, "restoring checkpoint 4 instead"));
    assert_true(test_file_contains(f->p.log, "checkpoint 4 (full 4 + 0 deltas)"));
    fx_reopen(f);
    expect_state(f, &after[0]);
    /* The server goes on: its next checkpoint is a full one (seq 7), restorable. */
    assert_int_equal(ps_table_push(f->ada, f->ids, 10, f->g), PS_OK);
    snap *now = malloc(sizeof(*now));
    assert_int_equal(ps_checkpoint(f->c), PS_OK);
    fx_pull(f, now);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&f->p, f->flags);
    assert_true(test_file_contains(f->p.log, "checkpoint 7 (full 7 + 0 deltas)"));
    fx_reopen(f);
    expect_state(f, now);
    free(now);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGTERM, 0);
    test_ps_cleanup(&f->p);
    free(after);
    free(f);
}

/* A raw TablePush of ids with gradient g on the single server, as client `cid` with `seq`.
 * Returns the status; *duplicate says whether the server dropped it as a resend. */
static int raw_push(const fixture *f, const int64_t *ids, size_t n, uint64_t cid, uint64_t seq,
                    float g, bool *duplicate)
{
    Psd__V1__TablePushRequest req = PSD__V1__TABLE_PUSH_REQUEST__INIT;
    req.name = "t/ada";
    req.n = n;
    uint8_t body[256];
    size_t blen = psd__v1__table_push_request__pack(&req, body);
    size_t seglen = 8 * n + 4 * n * DIM;
    uint8_t *seg = malloc(seglen);
    assert_non_null(seg);
    memcpy(seg, ids, 8 * n);
    for (size_t i = 0; i < n * DIM; i++)
        memcpy(seg + 8 * n + 4 * i, &g, 4);
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__TABLE_PUSH;
    env.request_id = seq;
    env.client_id = cid;
    env.seq = seq;
    env.worker_id = -1;
    env.body.data = body;
    env.body.len = blen;
    Psd__V1__TensorMeta tm = PSD__V1__TENSOR_META__INIT;
    tm.dtype = PSD__V1__DTYPE__FLOAT32;
    tm.count = seglen / 4;
    env.tensor = &tm;
    frame fr;
    nng_msg *m;
    int st = test_raw_call(f->p.port, &env, seg, seglen, &fr, &m);
    free(seg);
    assert_true(st > -1000);
    *duplicate = false;
    if (st == 0) {
        Psd__V1__TablePushReply *r =
            psd__v1__table_push_reply__unpack(NULL, fr.env->body.len, fr.env->body.data);
        assert_non_null(r);
        *duplicate = r->duplicate;
        psd__v1__table_push_reply__free_unpacked(r, NULL);
    }
    frame_fini(&fr);
    nng_msg_free(m);
    return st;
}

/* Exactly once across a restore from full + delta: a push applied before the delta is
 * dropped when resent to the restarted server (the dedup windows saved in the delta match
 * the rows it saved); one made after the delta (lost by the kill) applies when resent. */
static void test_resend_after_delta_restore(void **state)
{
    (void)state;
    fixture *f = malloc(sizeof(*f));
    snap *after = malloc(3 * sizeof(*after));
    fx_start(f, "psd-tckpt-once", "4", "3");
    fx_chain(f, after); /* 4 full, 5 delta, 6 delta */
    const uint64_t cid = 0x5eed5eed12345ull;
    int64_t one[2] = {f->ids[3], f->ids[1999]};
    bool dup;
    assert_int_equal(raw_push(f, one, 2, cid, 1, 0.5f, &dup), 0);
    assert_false(dup);
    assert_int_equal(ps_checkpoint(f->c), PS_OK); /* 7: delta of 6 */
    assert_int_equal(ps_checkpoint(f->c), PS_OK); /* 8: full (1 full + 3 deltas a chain) */
    assert_int_equal(raw_push(f, one, 2, cid, 2, 0.25f, &dup), 0);
    assert_int_equal(ps_checkpoint(f->c), PS_OK); /* 9: delta of 8, holds seq 2 */
    assert_true(test_file_contains(f->p.log, "ckpt-0-8.psc (full)"));
    assert_true(test_file_contains(f->p.log, "ckpt-0-9.psc (delta of 8)"));
    snap *want = malloc(sizeof(*want));
    fx_pull(f, want);
    assert_int_equal(raw_push(f, one, 2, cid, 3, 0.125f, &dup), 0); /* lost with the kill */
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&f->p, f->flags);
    assert_true(test_file_contains(f->p.log, "checkpoint 9 (full 8 + 1 deltas)"));
    fx_reopen(f);
    expect_state(f, want);
    assert_int_equal(raw_push(f, one, 2, cid, 2, 0.25f, &dup), 0);
    assert_true(dup); /* in the delta's window and rows: dropped */
    assert_int_equal(raw_push(f, one, 2, cid, 1, 0.5f, &dup), 0);
    assert_true(dup);
    expect_state(f, want);
    assert_int_equal(raw_push(f, one, 2, cid, 3, 0.125f, &dup), 0);
    assert_false(dup); /* lost by the kill: applies now */
    float row[2 * DIM];
    assert_int_equal(ps_table_pull(f->ada, one, 2, row), PS_OK);
    assert_true(memcmp(row, want->ada + 3 * DIM, DIM * sizeof(float)) != 0);
    free(want);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGTERM, 0);
    test_ps_cleanup(&f->p);
    free(after);
    free(f);
}

/* Which of ckpt-0-1 .. ckpt-0-n exist, as a string of 0/1. */
static void present(const fixture *f, int n, char *out)
{
    for (int i = 1; i <= n; i++)
        out[i - 1] = file_size(f, i) >= 0 ? '1' : '0';
    out[n] = '\0';
}

/* checkpoint-keep counts restore points; each keeps its whole chain. */
static void test_prune_keeps_chains(void **state)
{
    (void)state;
    fixture *f = malloc(sizeof(*f));
    fx_start(f, "psd-tckpt-prune", "3", "2");
    char have[16];
    /* The creates' 1 (no tables), 2 (t/ada new: full), 3 (delta of 2); after the restart
     * full-every 3: 4 F, 5 D, 6 D, 7 F, 8 D, 9 D, 10 F, 11 D; the 2 newest are kept with
     * their chains. */
    const char *want[] = {"0111",     "00011",     "000111",     "0001111",
                          "00000011", "000000111", "0000001111", "00000000011"};
    for (int k = 0; k < 8; k++) {
        assert_int_equal(ps_table_push(f->ada, f->ids + 10 * k, 10, f->g), PS_OK);
        assert_int_equal(ps_checkpoint(f->c), PS_OK);
        present(f, k + 4, have);
        if (strcmp(have, want[k]) != 0) {
            fprintf(stderr, "after checkpoint %d the files are %s, expected %s\n", k + 1, have,
                    want[k]);
            fail();
        }
    }
    assert_true(test_file_contains(f->p.log, "ckpt-0-11.psc (delta of 10)"));
    snap *now = malloc(sizeof(*now));
    fx_pull(f, now);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&f->p, f->flags);
    assert_true(test_file_contains(f->p.log, "checkpoint 11 (full 10 + 1 deltas)"));
    fx_reopen(f);
    expect_state(f, now);
    free(now);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGTERM, 0);
    test_ps_cleanup(&f->p);
    free(f);
}

/* psctl dump TABLE DIR on a 2-server cluster: one .npy pair per server, read back with NumPy,
 * together exactly the rows a pull returns (paged: the client's max-message-bytes is 64 KiB). */
static void test_psctl_dump_table(void **state)
{
    (void)state;
    if (psctl_bin == NULL)
        skip();
    if (system("/usr/bin/python3 -c 'import numpy' 2>/dev/null") != 0) {
        fprintf(stderr, "no NumPy for /usr/bin/python3: skipped\n");
        skip();
    }
    test_cluster tc;
    assert_int_equal(test_cluster_start(&tc, server_bin, 2, NULL), 0);
    char tf[1200];
    snprintf(tf, sizeof(tf), "{\"cluster\":%s}", tc.spec);
    ps_config *cfg;
    ps_config_create(&cfg);
    ps_config_set(cfg, "cluster", tf);
    ps_config_set(cfg, "max-message-bytes", "65536");
    ps_client *c = NULL;
    assert_int_equal(ps_client_open(&c, cfg), PS_OK);
    ps_config_destroy(cfg);
    ps_table_spec sp;
    ps_table_spec_init(&sp, "t/dump", 8, PS_OPT_ADAGRAD);
    sp.initializer = PS_INIT_UNIFORM;
    sp.init_a = -1;
    sp.init_b = 1;
    ps_table *t;
    assert_int_equal(ps_table_create(c, &sp, &t), PS_OK);
    enum { N = 5000 };
    int64_t *ids = malloc(N * sizeof(*ids));
    float *g = malloc(N * 8 * sizeof(float)), *rows = malloc(N * 8 * sizeof(float));
    for (int i = 0; i < N; i++) {
        ids[i] = (int64_t)(i - N / 2) * 2654435761LL;
        for (int k = 0; k < 8; k++)
            g[i * 8 + k] = 0.01f * (float)((i * 7 + k) % 13) - 0.06f;
    }
    assert_int_equal(ps_table_push(t, ids, N, g), PS_OK);
    assert_int_equal(ps_table_pull(t, ids, N, rows), PS_OK);
    char dir[] = "/tmp/psd-tdump-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[400], cmd[3000];
    snprintf(path, sizeof(path), "%s/expect.bin", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(ids, 8, N, f), N);
    assert_int_equal(fwrite(rows, 32, N, f), N);
    fclose(f);
    snprintf(cmd, sizeof(cmd),
             "'%s' --cluster '%s' --max-message-bytes 65536 dump t/dump %s/out > %s/psctl.out",
             psctl_bin, tc.spec, dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof(path), "%s/psctl.out", dir);
    assert_true(test_file_contains(path, "wrote 5000 rows of table t/dump (dim 8) from 2 server"));
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 - '%s' <<'EOF'\n"
             "import sys, numpy as np\n"
             "d = sys.argv[1]\n"
             "raw = open(d + '/expect.bin', 'rb').read()\n"
             "n = %d\n"
             "eids = np.frombuffer(raw[:8 * n], '<i8')\n"
             "erows = np.frombuffer(raw[8 * n:], '<f4').reshape(n, 8)\n"
             "ids, rows = [], []\n"
             "for k in range(2):\n"
             "    i = np.load(d + '/out/t_dump.ps%%d.ids.npy' %% k)\n"
             "    r = np.load(d + '/out/t_dump.ps%%d.rows.npy' %% k)\n"
             "    assert i.dtype == np.int64 and r.dtype == np.float32, (i.dtype, r.dtype)\n"
             "    assert i.ndim == 1 and r.shape == (len(i), 8), (i.shape, r.shape)\n"
             "    assert 1000 < len(i) < 4000, len(i)  # both servers hold about half\n"
             "    ids.append(i); rows.append(r)\n"
             "ids = np.concatenate(ids); rows = np.concatenate(rows)\n"
             "assert len(np.unique(ids)) == len(ids) == n, len(ids)\n"
             "o, eo = np.argsort(ids), np.argsort(eids)\n"
             "assert np.array_equal(ids[o], eids[eo])\n"
             "assert np.array_equal(rows[o], erows[eo])\n"
             "print('dump matches the pulled rows')\n"
             "EOF\n",
             dir, N);
    assert_int_equal(system(cmd), 0);
    /* A name that is neither a variable nor a table: exit status 1, the reason on stderr. */
    snprintf(cmd, sizeof(cmd), "'%s' --cluster '%s' dump t/none %s/none 2> %s/err.txt", psctl_bin,
             tc.spec, dir, dir);
    int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
    snprintf(path, sizeof(path), "%s/err.txt", dir);
    assert_true(test_file_contains(path, "t/none"));
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
    free(ids);
    free(g);
    free(rows);
    ps_table_free(t);
    ps_client_close(c);
    assert_int_equal(test_cluster_stop(&tc), 0);
}

/* A lean table: 16-bit rows with Adam (one step count a row) and row-wise Adagrad in float16.
 * A checkpoint and a SIGKILL bring back rows, moments and step counts exactly: one more push
 * equals the same pushes into tables that never restarted. */
static ps_table *make_lean(fixture *f, const char *name, ps_optimizer opt, ps_dtype dtype)
{
    ps_table_spec sp;
    ps_table_spec_init(&sp, name, DIM, opt);
    sp.learning_rate = 0.05;
    sp.initializer = PS_INIT_CONSTANT;
    sp.init_a = 0.25;
    sp.dtype = dtype;
    ps_table *t;
    assert_int_equal(ps_table_create(f->c, &sp, &t), PS_OK);
    return t;
}

static void test_lean_rows_restore(void **state)
{
    (void)state;
    fixture *f = malloc(sizeof(*f));
    fx_start(f, "psd-tckpt-lean", "4", "3");
    const char *names[2] = {"t/adam16", "t/rw16"};
    const ps_optimizer opts[2] = {PS_OPT_ADAM, PS_OPT_ROWWISE_ADAGRAD};
    const ps_dtype dts[2] = {PS_BFLOAT16, PS_FLOAT16};
    ps_table *t[2], *ref[2];
    float *got = malloc(sizeof(float) * NI * DIM), *want = malloc(sizeof(float) * NI * DIM);
    for (int k = 0; k < 2; k++) {
        t[k] = make_lean(f, names[k], opts[k], dts[k]);
        for (int step = 0; step < 3; step++)
            assert_int_equal(ps_table_push(t[k], f->ids, NI / (step + 1), f->g), PS_OK);
    }
    assert_int_equal(ps_checkpoint(f->c), PS_OK);
    for (int k = 0; k < 2; k++)
        ps_table_free(t[k]);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGKILL, 128 + SIGKILL);
    test_ps_start(&f->p, f->flags);
    fx_reopen(f);
    for (int k = 0; k < 2; k++) {
        char rname[32];
        snprintf(rname, sizeof(rname), "%s-ref", names[k]);
        assert_int_equal(ps_table_lookup(f->c, names[k], &t[k]), PS_OK);
        ref[k] = make_lean(f, rname, opts[k], dts[k]);
        for (int step = 0; step < 4; step++)
            assert_int_equal(ps_table_push(ref[k], f->ids, NI / (step < 3 ? step + 1 : 1), f->g),
                             PS_OK);
        assert_int_equal(ps_table_push(t[k], f->ids, NI, f->g), PS_OK);
        assert_int_equal(ps_table_pull(t[k], f->ids, NI, got), PS_OK);
        assert_int_equal(ps_table_pull(ref[k], f->ids, NI, want), PS_OK);
        assert_memory_equal(got, want, sizeof(float) * NI * DIM);
        ps_table_free(t[k]);
        ps_table_free(ref[k]);
    }
    free(got);
    free(want);
    fx_close(f);
    test_ps_signal_wait(&f->p, SIGTERM, 0);
    test_ps_cleanup(&f->p);
    free(f);
}

int main(int argc, char **argv)
{
    server_bin = test_server_bin(argc, argv);
    psctl_bin = argc > 2 ? argv[2] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_delta_chain_restores_exactly),
        cmocka_unit_test(test_corrupt_delta_falls_back),
        cmocka_unit_test(test_resend_after_delta_restore),
        cmocka_unit_test(test_prune_keeps_chains),
        cmocka_unit_test(test_psctl_dump_table),
        cmocka_unit_test(test_lean_rows_restore),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
