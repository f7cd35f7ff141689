/* Unit tests for server/checkpoint.h (the ckpt_*.c files and checkpointer.c): a shard written and
 * restored into a fresh server state is the same shard (parameters, Adam slots, versions,
 * placement, exactly-once windows); a byte flipped anywhere in the newest file, or the file cut
 * anywhere, makes the restore fall back to the previous checkpoint; a file of another task or
 * cluster size is refused. The directory's lock refuses a second holder and names the first; the
 * record of the last server reads back as written, and the restore verdict follows from it and what
 * was restored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint.h"
#include "ckpt_dir.h"
#include "log.h"
#include "placement.h"
#include "server.h"
#include "slots.h"
#include "table.h"

#define NEL 1000

static char dir[64];

static void state_init(server_state *st, uint32_t task, uint32_t nservers)
{
    memset(st, 0, sizeof(*st));
    st->task_index = task;
    st->num_servers = nservers;
    st->vars = store_create();
    st->dedup = dedup_create(1024);
    st->sync = sync_create(0, 10000, true, 64);
    assert_non_null(st->vars);
    assert_non_null(st->dedup);
    assert_non_null(st->sync);
}

static void state_fini(server_state *st)
{
    store_destroy(st->vars);
    dedup_destroy(st->dedup);
    sync_destroy(st->sync);
}

/* A variable of NEL elements with the optimizer named, values i * scale. */
static variable *add_var(server_state *st, const char *name, Psd__V1__Optimizer opt, float scale)
{
    Psd__V1__VariableSpec spec = PSD__V1__VARIABLE_SPEC__INIT;
    uint64_t shape[1] = {NEL};
    spec.name = (char *)name;
    spec.dtype = PSD__V1__DTYPE__FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    spec.optimizer = opt;
    spec.learning_rate = 0.01;
    spec.beta1 = 0.9;
    spec.beta2 = 0.999;
    spec.epsilon = 1e-8;
    spec.weight_decay = 0.01;
    spec.staleness = -1;
    spec.num_servers = st->num_servers;
    char err[256];
    variable *v = variable_create(&spec, NEL, 0, NEL, err, sizeof(err));
    if (v == NULL)
        fail_msg("variable_create: %s", err);
    for (size_t i = 0; i < NEL; i++) {
        v->params[i] = (float)i * scale;
        for (size_t s = 0; s < v->nslots; s++)
            v->slots[s][i] = (float)(i + s) * 0.5f * scale;
    }
    atomic_store(&v->version, (uint64_t)(scale * 10));
    assert_ptr_equal(store_insert(st->vars, v), v);
    return v;
}

static checkpoint_config config(void)
{
    checkpoint_config c = {.dir = dir, .keep = 5, .cluster_hash = 42};
    return c;
}

static void write_one(server_state *st, uint64_t seq, checkpoint_info *info)
{
    checkpoint_config cfg = config();
    char err[512];
    checkpointer *ck = checkpointer_create(st, &cfg, seq, err, sizeof(err));
    if (ck == NULL)
        fail_msg("checkpointer_create: %s", err);
    if (checkpoint_write(ck, info, err, sizeof(err)) != 0)
        fail_msg("checkpoint_write: %s", err);
    checkpointer_destroy(ck);
}

/* Restores into a fresh state; returns the CKPT_* result. */
static int restore(server_state *out, uint32_t task, uint32_t nservers, checkpoint_info *info)
{
    state_init(out, task, nservers);
    checkpoint_config cfg = config();
    uint64_t max_seq = 0;
    char err[512] = "";
    return checkpoint_restore(out, &cfg, info, &max_seq, err, sizeof(err));
}

static void expect_same_var(server_state *a, server_state *b, const char *name)
{
    variable *x = store_find(a->vars, name), *y = store_find(b->vars, name);
    assert_non_null(x);
    assert_non_null(y);
    assert_int_equal(x->count, y->count);
    assert_int_equal(x->offset, y->offset);
    assert_int_equal(x->nslots, y->nslots);
    assert_int_equal(atomic_load(&x->version), atomic_load(&y->version));
    assert_null(spec_diff(x->spec, y->spec, NULL, 0));
    assert_memory_equal(x->params, y->params, NEL * sizeof(float));
    for (size_t s = 0; s < x->nslots; s++)
        assert_memory_equal(x->slots[s], y->slots[s], NEL * sizeof(float));
}

static int setup(void **state)
{
    (void)state;
    log_init("test", -1, LOG_ERROR, LOG_FORMAT_TEXT); /* the fallbacks' warnings stay quiet */
    snprintf(dir, sizeof(dir), "/tmp/psd-ckunit-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void clear_dir(void)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "rm -f %s/ckpt-* %s/.ckpt-*", dir, dir);
    assert_int_equal(system(cmd), 0);
}

/* Copies the file from to the file to. */
static void copy_file(const char *from, const char *to)
{
    size_t len = 0;
    FILE *in = fopen(from, "rb");
    assert_non_null(in);
    FILE *out = fopen(to, "wb");
    assert_non_null(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0) {
        assert_int_equal(fwrite(buf, 1, n, out), n);
        len += n;
    }
    fclose(in);
    assert_int_equal(fclose(out), 0);
    assert_true(len > 0);
}

static void test_round_trip(void **state)
{
    (void)state;
    clear_dir();
    server_state st;
    state_init(&st, 0, 1);
    add_var(&st, "a/adam", PSD__V1__OPTIMIZER__OPT_ADAM, 1.0f);
    add_var(&st, "a/sgd", PSD__V1__OPTIMIZER__OPT_SGD, 2.0f);
    add_var(&st, "a/adamw", PSD__V1__OPTIMIZER__OPT_ADAMW, 3.0f);
    /* exactly-once windows of two clients: seq 1..5 of one, 7 and 100 of the other */
    for (uint64_t s = 1; s <= 5; s++)
        assert_int_equal(dedup_begin(st.dedup, 0x1111, s), DEDUP_NEW);
    assert_int_equal(dedup_begin(st.dedup, 0x2222, 7), DEDUP_NEW);
    assert_int_equal(dedup_begin(st.dedup, 0x2222, 100), DEDUP_NEW);
    checkpoint_info info;
    write_one(&st, 1, &info);
    assert_int_equal(info.seq, 1);
    assert_int_equal(info.variables, 3);
    assert_true(info.bytes > 3 * NEL * sizeof(float));

    server_state back;
    checkpoint_info rinfo;
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    assert_int_equal(rinfo.seq, 1);
    expect_same_var(&st, &back, "a/adam");
    expect_same_var(&st, &back, "a/sgd");
    expect_same_var(&st, &back, "a/adamw");
    /* the windows came back: replays are duplicates, new numbers are new */
    assert_int_equal(dedup_begin(back.dedup, 0x1111, 3), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(back.dedup, 0x2222, 100), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(back.dedup, 0x2222, 7), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(back.dedup, 0x2222, 8), DEDUP_NEW);
    assert_int_equal(dedup_begin(back.dedup, 0x1111, 6), DEDUP_NEW);
    state_fini(&back);

    /* On a cluster of 2, each task restores the variables its slots hold from the file of
     * the cluster of 1, and every client's window. */
    const char *names[] = {"a/adam", "a/sgd", "a/adamw"};
    slot_map m2 = slots_static(SLOTS_DEFAULT, 2);
    uint32_t held = 0;
    for (uint32_t t = 0; t < 2; t++) {
        assert_int_equal(restore(&back, t, 2, &rinfo), CKPT_RESTORED);
        assert_int_equal(rinfo.from_servers, 1);
        for (size_t k = 0; k < 3; k++) {
            variable *x = store_find(st.vars, names[k]), *y = store_find(back.vars, names[k]);
            if (slots_name_owner(&m2, names[k]) != t) {
                assert_null(y);
                continue;
            }
            held++;
            assert_non_null(y);
            assert_int_equal(y->spec->num_servers, 2);
            assert_int_equal(atomic_load(&x->version), atomic_load(&y->version));
            assert_memory_equal(x->params, y->params, NEL * sizeof(float));
            for (size_t i = 0; i < x->nslots; i++)
                assert_memory_equal(x->slots[i], y->slots[i], NEL * sizeof(float));
        }
        assert_int_equal(dedup_begin(back.dedup, 0x2222, 100), DEDUP_DUPLICATE);
        assert_int_equal(dedup_begin(back.dedup, 0x1111, 6), DEDUP_NEW);
        state_fini(&back);
    }
    assert_int_equal(held, 3);
    /* With replicas > 1 that restore is refused, saying what to do. */
    state_init(&back, 1, 2);
    checkpoint_config rcfg = config();
    rcfg.replicas = 2;
    uint64_t max_seq;
    char err[1024] = "";
    assert_int_equal(checkpoint_restore(&back, &rcfg, &rinfo, &max_seq, err, sizeof(err)),
                     CKPT_REFUSED);
    assert_non_null(strstr(err, "a restore onto another number of servers needs replicas 1"));
    state_fini(&back);
    /* A file of another task under this task's name is refused. */
    char from[600], to[600];
    snprintf(from, sizeof(from), "%s/ckpt-0-1.psc", dir);
    snprintf(to, sizeof(to), "%s/ckpt-1-1.psc", dir);
    copy_file(from, to);
    assert_int_equal(restore(&back, 1, 1, &rinfo), CKPT_REFUSED);
    state_fini(&back);
    unlink(to);
    state_fini(&st);
}

static long file_size(const char *path)
{
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    return (long)sb.st_size;
}

static void flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

/* Two checkpoints (values differ); every corruption of the newest one falls back to the
 * first: bytes flipped across the header, a record header, the parameters and the end record,
 * and cuts at several lengths. */
static void test_corruption_falls_back(void **state)
{
    (void)state;
    clear_dir();
    server_state st;
    state_init(&st, 0, 1);
    variable *v = add_var(&st, "c/v", PSD__V1__OPTIMIZER__OPT_ADAM, 1.0f);
    checkpoint_info first, second;
    write_one(&st, 1, &first);
    v->params[0] = 12345.0f;
    atomic_store(&v->version, 99);
    write_one(&st, 2, &second);
    char saved[4300];
    snprintf(saved, sizeof(saved), "%s.orig", second.path);
    copy_file(second.path, saved);
    long size = file_size(second.path);
    const long offsets[] = {0, 8, 20, 59, 64, 70, 80, 200, size / 2, size - 30, size - 5, size - 1};
    for (size_t k = 0; k < sizeof(offsets) / sizeof(offsets[0]); k++) {
        copy_file(saved, second.path);
        flip_byte(second.path, offsets[k]);
        server_state back;
        checkpoint_info rinfo;
        int rc = restore(&back, 0, 1, &rinfo);
        if (rc != CKPT_RESTORED || rinfo.seq != 1)
            fail_msg("byte %ld flipped: restore gave %d, checkpoint %llu (want the first)",
                     offsets[k], rc, (unsigned long long)rinfo.seq);
        variable *r = store_find(back.vars, "c/v");
        assert_non_null(r);
        assert_true(r->params[0] == 0.0f);
        assert_int_equal(atomic_load(&r->version), 10);
        state_fini(&back);
    }
    const long cuts[] = {0, 10, 64, 100, size / 2, size - 1};
    for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
        copy_file(saved, second.path);
        assert_int_equal(truncate(second.path, cuts[k]), 0);
        server_state back;
        checkpoint_info rinfo;
        int rc = restore(&back, 0, 1, &rinfo);
        if (rc != CKPT_RESTORED || rinfo.seq != 1)
            fail_msg("cut at %ld of %ld: restore gave %d, checkpoint %llu (want the first)",
                     cuts[k], size, rc, (unsigned long long)rinfo.seq);
        state_fini(&back);
    }
    /* intact, the newest wins */
    copy_file(saved, second.path);
    assert_int_equal(unlink(saved), 0);
    server_state back;
    checkpoint_info rinfo;
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    assert_int_equal(rinfo.seq, 2);
    expect_same_var(&st, &back, "c/v");
    state_fini(&back);
    state_fini(&st);
}

/* Rewrites the checkpoint at path as format version 1: without its dedup tombstone record
 * (type 5), the end record's counts and the header's version and CRC fixed. */
static void rewrite_as_v1(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static unsigned char in[1 << 22], out[1 << 22];
    size_t n = fread(in, 1, sizeof(in), f);
    fclose(f);
    assert_true(n > 64 && n < sizeof(in));
    memcpy(out, in, 64);
    uint32_t u32 = 1;
    memcpy(out + 8, &u32, 4);
    u32 = (uint32_t)crc32(0L, out, 60);
    memcpy(out + 60, &u32, 4);
    size_t pos = 64, o = 64;
    uint64_t nrec = 0, total = 0;
    int dropped = 0;
    while (pos < n) {
        uint32_t type;
        uint64_t len;
        memcpy(&type, in + pos, 4);
        memcpy(&len, in + pos + 8, 8);
        size_t rec = 16 + (size_t)len + 4;
        assert_true(pos + rec <= n);
        if (type == CKPT_REC_DEDUP_FLOORS) {
            dropped++;
        } else if (type == CKPT_REC_END) {
            memcpy(out + o, in + pos, 16);
            memcpy(out + o + 16, &nrec, 8);
            memcpy(out + o + 24, &total, 8);
            u32 = (uint32_t)crc32(0L, out + o, 32);
            memcpy(out + o + 32, &u32, 4);
            o += rec;
        } else {
            memcpy(out + o, in + pos, rec);
            o += rec;
            nrec++;
            total += len;
        }
        pos += rec;
    }
    assert_int_equal(dropped, 1);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(out, 1, o, f), o);
    assert_int_equal(fclose(f), 0);
}

/* Evicted clients' tombstones and floors come back with the checkpoint (their resends stay
 * refused after a restart, whatever order the limits and the restore come in); a version 1
 * file (without them) is still read. */
static void test_dedup_tombstones_round_trip(void **state)
{
    (void)state;
    clear_dir();
    server_state st;
    state_init(&st, 0, 1);
    assert_int_equal(dedup_set_limits(st.dedup, 4, 0), 0);
    add_var(&st, "d/v", PSD__V1__OPTIMIZER__OPT_SGD, 1.0f);
    for (uint64_t c = 1; c <= 100; c++)
        assert_int_equal(dedup_begin(st.dedup, c * 0x10001, 7), DEDUP_NEW);
    assert_true(dedup_forgotten(st.dedup) > 0); /* 96 evicted through 16 tombstone slots */
    checkpoint_info info;
    write_one(&st, 1, &info);
    for (int order = 0; order < 2; order++) {
        server_state back;
        state_init(&back, 0, 1);
        if (order == 0)
            assert_int_equal(dedup_set_limits(back.dedup, 4, 0), 0);
        checkpoint_config cfg = config();
        uint64_t max_seq = 0;
        char err[512] = "";
        checkpoint_info rinfo;
        assert_int_equal(checkpoint_restore(&back, &cfg, &rinfo, &max_seq, err, sizeof(err)),
                         CKPT_RESTORED);
        if (order == 1) /* limits set after the restore keep what it brought */
            assert_int_equal(dedup_set_limits(back.dedup, 4, 0), 0);
        for (uint64_t c = 1; c <= 100; c++) {
            dedup_result r = dedup_begin(back.dedup, c * 0x10001, 7);
            if (r == DEDUP_NEW)
                fail_msg("order %d: client %llu's seq 7 applied again after the restore", order,
                         (unsigned long long)c);
        }
        for (uint64_t c = 1; c <= 100; c++)
            assert_int_equal(dedup_begin(back.dedup, c * 0x10001, 8), DEDUP_NEW);
        state_fini(&back);
    }
    /* Format version 1: read, with the windows it holds. */
    rewrite_as_v1(info.path);
    server_state back;
    checkpoint_info rinfo;
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    assert_int_equal(rinfo.seq, 1);
    expect_same_var(&st, &back, "d/v");
    assert_int_equal(dedup_begin(back.dedup, 100 * 0x10001, 7), DEDUP_DUPLICATE);
    state_fini(&back);
    state_fini(&st);
}

/* The clock table's finished workers and frontier (record 8) come back: a finished worker's
 * client stays out after the restore, and a new worker with none live starts at the frontier,
 * as before it (a replica restored from a copy decides as its primary does). */
static void test_finished_workers_round_trip(void **state)
{
    (void)state;
    clear_dir();
    server_state st;
    state_init(&st, 0, 1);
    int64_t min;
    sync_clock(&st, 0, 11, 4, &min);
    sync_clock(&st, 1, 12, 6, &min);
    sync_leave(&st, 1, 12, 6);
    sync_clock(&st, 0, 11, 9, &min);
    sync_leave(&st, 0, 11, 9); /* none live: the frontier is 9 */
    checkpoint_info info;
    write_one(&st, 1, &info);
    server_state back;
    checkpoint_info rinfo;
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    size_t na, nb;
    int64_t amin_a, amin_b, fa, fb;
    sync_worker_rec *a = sync_export(&st, &na, &amin_a, &fa);
    sync_worker_rec *b = sync_export(&back, &nb, &amin_b, &fb);
    assert_int_equal(na, 2);
    assert_int_equal(nb, na);
    assert_int_equal(fa, 9);
    assert_int_equal(fb, fa);
    for (size_t i = 0; i < na; i++) {
        assert_int_equal(b[i].id, a[i].id);
        assert_int_equal(b[i].clock, a[i].clock);
        assert_true(b[i].left && a[i].left);
        assert_false(b[i].live);
        assert_int_equal(b[i].left_client, a[i].left_client);
    }
    assert_int_equal(b[1].left_client, 12);
    free(a);
    free(b);
    /* Worker 1's old client is still out; a worker never seen starts at the frontier. */
    assert_int_equal(sync_clock(&back, 1, 12, 7, &min), 7);
    assert_int_equal(min, INT64_MAX); /* nobody live: worker 1 did not rejoin */
    assert_int_equal(sync_clock(&back, 2, 13, 0, &min), 9);
    state_fini(&back);
    state_fini(&st);
}

/* A position function as a replica group gives one: counts holds and releases. */
static int pos_holds, pos_releases;
static bool give_position(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn)
{
    const uint64_t *p = arg;
    if (!hold) {
        pos_releases++;
        return false;
    }
    pos_holds++;
    *epoch = p[0];
    *lsn = p[1];
    return p[0] != 0;
}

/* A replicated group's log position (record 9) comes back with the restore, the newest file's;
 * without a position function (or with one that has none) the file has no record 9. */
static void test_replica_position_round_trip(void **state)
{
    (void)state;
    clear_dir();
    server_state st;
    state_init(&st, 0, 1);
    add_var(&st, "pos/v", PSD__V1__OPTIMIZER__OPT_SGD, 1.0f);
    checkpoint_info info, rinfo;
    write_one(&st, 1, &info);
    assert_false(info.has_position);
    server_state back;
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    assert_false(rinfo.has_position);
    state_fini(&back);

    checkpoint_config cfg = config();
    char err[512];
    checkpointer *ck = checkpointer_create(&st, &cfg, 2, err, sizeof(err));
    assert_non_null(ck);
    uint64_t pos[2] = {7, 18446744073709551000ull};
    checkpointer_set_position(ck, give_position, pos);
    pos_holds = pos_releases = 0;
    assert_int_equal(checkpoint_write(ck, &info, err, sizeof(err)), 0);
    assert_int_equal(pos_holds, 1);
    assert_int_equal(pos_releases, 1);
    assert_true(info.has_position);
    assert_int_equal(info.epoch, 7);
    assert_true(info.lsn == 18446744073709551000ull);
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    assert_int_equal(rinfo.seq, 2);
    assert_true(rinfo.has_position);
    assert_int_equal(rinfo.epoch, 7);
    assert_true(rinfo.lsn == 18446744073709551000ull);
    expect_same_var(&st, &back, "pos/v");
    state_fini(&back);
    /* A newer file at a later position wins; one whose state has none (a copy not usable yet)
     * carries no record. */
    pos[0] = 8;
    pos[1] = 12;
    assert_int_equal(checkpoint_write(ck, &info, err, sizeof(err)), 0);
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    assert_int_equal(rinfo.epoch, 8);
    assert_int_equal(rinfo.lsn, 12);
    state_fini(&back);
    pos[0] = 0;
    assert_int_equal(checkpoint_write(ck, &info, err, sizeof(err)), 0);
    assert_false(info.has_position);
    assert_int_equal(pos_releases, 3);
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    assert_false(rinfo.has_position);
    assert_int_equal(checkpointer_next_seq(ck), 5);
    state_fini(&back);
    checkpointer_destroy(ck);
    state_fini(&st);
}

/* A variable never updated is stored as its spec; the restore makes the same values again. */
static void test_initial_variable_is_its_spec(void **state)
{
    (void)state;
    clear_dir();
    server_state st;
    state_init(&st, 0, 1);
    Psd__V1__VariableSpec spec = PSD__V1__VARIABLE_SPEC__INIT;
    uint64_t shape[1] = {NEL};
    spec.name = "init/normal";
    spec.dtype = PSD__V1__DTYPE__FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    spec.optimizer = PSD__V1__OPTIMIZER__OPT_ADAM;
    spec.learning_rate = 0.01;
    spec.beta1 = 0.9;
    spec.beta2 = 0.999;
    spec.epsilon = 1e-8;
    spec.initializer = PSD__V1__INITIALIZER__INIT_NORMAL;
    spec.init_a = 0.0;
    spec.init_b = 1.0;
    spec.seed = 9;
    spec.staleness = -1;
    spec.num_servers = 1;
    char err[256];
    variable *v = variable_create(&spec, NEL, 0, NEL, err, sizeof(err));
    if (v == NULL)
        fail_msg("variable_create: %s", err);
    assert_ptr_equal(store_insert(st.vars, v), v);
    checkpoint_info info;
    write_one(&st, 1, &info);
    assert_true(info.bytes < 1024); /* not the 3 * 4000 bytes of values and slots */
    server_state back;
    checkpoint_info rinfo;
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    expect_same_var(&st, &back, "init/normal");
    state_fini(&back);
    /* Once updated, its values are written. */
    v->params[7] += 1.0f;
    atomic_store(&v->version, 1);
    clear_dir();
    write_one(&st, 2, &info);
    assert_true(info.bytes > 3 * NEL * sizeof(float));
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    expect_same_var(&st, &back, "init/normal");
    state_fini(&back);
    state_fini(&st);
}

static void test_lock_and_record(void **state)
{
    (void)state;
    char sub[300], err[700];
    snprintf(sub, sizeof(sub), "%s/state/deeper", dir);
    int fd = ckpt_dir_lock(sub, 3, err, sizeof(err)); /* made with its parents */
    assert_true(fd >= 0);
    /* Another open file description of the same file: refused, naming this process. */
    assert_int_equal(ckpt_dir_lock(sub, 3, err, sizeof(err)), -1);
    char want[64];
    snprintf(want, sizeof(want), "in use by another ps 3 (pid %ld holds", (long)getpid());
    assert_non_null(strstr(err, want));
    int other = ckpt_dir_lock(sub, 4, err, sizeof(err)); /* another task: its own lock */
    assert_true(other >= 0);
    ckpt_dir_unlock(other);
    ckpt_record r;
    ckpt_record_read(sub, 3, &r);
    assert_int_equal(r.state, CKPT_STOP_UNKNOWN);
    assert_false(r.legacy);
    ckpt_record w = {.state = CKPT_STOP_CLEAN, .pid = 42, .seq = 7, .versions = 1234567890123ull};
    assert_int_equal(ckpt_record_write(sub, 3, &w, err, sizeof(err)), 0);
    ckpt_record_read(sub, 3, &r);
    assert_int_equal(r.state, CKPT_STOP_CLEAN);
    assert_int_equal(r.pid, 42);
    assert_int_equal(r.seq, 7);
    assert_int_equal(r.versions, 1234567890123ull);
    ckpt_dir_unlock(fd);
    fd = ckpt_dir_lock(sub, 3, err, sizeof(err)); /* free again */
    assert_true(fd >= 0);
    ckpt_dir_unlock(fd);
    /* A path below a regular file is refused. */
    char file[320], below[340];
    snprintf(file, sizeof(file), "%s/plain", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(below, sizeof(below), "%s/ck", file);
    assert_int_equal(ckpt_dir_lock(below, 0, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "Not a directory"));
}

static void test_restore_verdict(void **state)
{
    (void)state;
    char m[1024];
    ckpt_record clean = {.state = CKPT_STOP_CLEAN, .seq = 3, .versions = 8};
    assert_false(ckpt_restore_verdict(&clean, 0, true, 3, 8, false, m, sizeof(m)));
    assert_non_null(strstr(m, "shut down cleanly after writing checkpoint 3: nothing was lost"));
    /* The clean stop's final checkpoint did not restore: 5 updates lost, not "nothing". */
    assert_true(ckpt_restore_verdict(&clean, 0, true, 2, 3, false, m, sizeof(m)));
    assert_non_null(strstr(m, "checkpoint 3, the newest the previous server wrote, could not be "
                              "restored; checkpoint 2 was: 5 updates"));
    assert_null(strstr(m, "nothing was lost"));
    ckpt_record running = {.state = CKPT_STOP_RUNNING, .seq = 3, .versions = 8};
    assert_true(ckpt_restore_verdict(&running, 0, true, 3, 8, false, m, sizeof(m)));
    assert_non_null(strstr(m, "did not shut down cleanly: the updates it applied after "
                              "checkpoint 3 are lost"));
    assert_true(ckpt_restore_verdict(&running, 0, false, 0, 0, false, m, sizeof(m)));
    assert_non_null(strstr(m, "wrote checkpoint 3 (8 updates"));
    ckpt_record none = {0};
    assert_false(ckpt_restore_verdict(&none, 0, false, 0, 0, false, m, sizeof(m)));
    assert_true(ckpt_restore_verdict(&none, 0, true, 5, 9, false, m, sizeof(m)));
    assert_non_null(strstr(m, "no record of how the previous ps 0 stopped"));
    ckpt_record legacy = {.legacy = true};
    assert_true(ckpt_restore_verdict(&legacy, 0, true, 5, 9, false, m, sizeof(m)));
    assert_non_null(strstr(m, "did not shut down cleanly"));
    ckpt_record clean_empty = {.state = CKPT_STOP_CLEAN};
    assert_false(ckpt_restore_verdict(&clean_empty, 0, false, 0, 0, false, m, sizeof(m)));
    /* Replicated: a crash's checkpoint is one copy among the group's; its groups come back
     * from the newest copy in the view, so nothing is said to be lost. */
    assert_false(ckpt_restore_verdict(&running, 1, true, 3, 8, true, m, sizeof(m)));
    assert_null(strstr(m, "are lost"));
    assert_non_null(strstr(m, "ps 1: the previous server did not shut down cleanly "
                              "(checkpoint 3 restored); with replicas"));
    assert_non_null(strstr(m, "copies its groups back from their primaries"));
    assert_false(ckpt_restore_verdict(&running, 1, false, 0, 0, true, m, sizeof(m)));
    assert_non_null(strstr(m, "(no checkpoint restored)"));
    /* A clean stop restored whole says so, replicated or not. */
    assert_false(ckpt_restore_verdict(&clean, 0, true, 3, 8, true, m, sizeof(m)));
    assert_non_null(strstr(m, "nothing was lost"));
}

/* A sparse table through a chain (full-every 3): full, delta, delta, full, delta, delta, each
 * after rows were changed, added and removed. The restore reads the newest full file and its
 * two deltas, and the tables are those of the last checkpoint, row for row. */
static void test_table_delta_chain(void **state)
{
    (void)state;
    clear_dir();
    server_state st;
    state_init(&st, 0, 1);
    add_var(&st, "w", PSD__V1__OPTIMIZER__OPT_ADAM, 1.0f);
    Psd__V1__TableSpec ts = PSD__V1__TABLE_SPEC__INIT;
    ts.name = "emb";
    ts.dim = 4;
    ts.optimizer = PSD__V1__OPTIMIZER__OPT_ADAGRAD;
    ts.learning_rate = 0.1;
    ts.initial_accumulator = 0.1;
    ts.epsilon = 1e-8;
    ts.staleness = -1;
    ts.num_servers = 1;
    uint8_t spec[256];
    size_t len = psd__v1__table_spec__pack(&ts, spec);
    table *t = NULL;
    char err[512];
    if (server_table_make(&st, spec, len, &t, err, sizeof(err)) != 0)
        fail_msg("server_table_make: %s", err);
    assert_int_equal(server_table_register(&st, t, spec, len), 0);
    uint32_t rf = table_row_floats(t);
    float row[64];
    assert_true(rf <= 64);
    for (int64_t id = -50; id < 200; id++) {
        for (uint32_t k = 0; k < rf; k++)
            row[k] = (float)id * 0.25f + (float)k;
        assert_int_equal(table_insert_row(t, id * 7919, row, 1700000000000 + id), TABLE_OK);
    }
    checkpoint_config cfg = config();
    cfg.full_every = 3;
    checkpointer *ck = checkpointer_create(&st, &cfg, 1, err, sizeof(err));
    assert_non_null(ck);
    checkpoint_info info;
    for (int round = 0; round < 6; round++) {
        for (int64_t id = round * 10; id < round * 10 + 20; id++) {
            for (uint32_t k = 0; k < rf; k++)
                row[k] = (float)(id + round) * 0.5f;
            assert_int_equal(table_insert_row(t, id * 7919 + round, row, 1700000001000 + id),
                             TABLE_OK);
        }
        int64_t gone[2] = {(round - 50) * 7919, (round - 40) * 7919};
        table_remove(t, gone, 2);
        if (checkpoint_write(ck, &info, err, sizeof(err)) != 0)
            fail_msg("checkpoint_write: %s", err);
        assert_int_equal(info.seq, (uint64_t)round + 1);
        assert_int_equal(info.base, round % 3 == 0 ? 0 : (uint64_t)round);
    }
    checkpointer_destroy(ck);
    table_stats want;
    table_stats_get(t, &want);

    server_state back;
    state_init(&back, 0, 1);
    uint64_t max_seq = 0;
    checkpoint_info ri;
    assert_int_equal(checkpoint_restore(&back, &cfg, &ri, &max_seq, err, sizeof(err)),
                     CKPT_RESTORED);
    assert_int_equal(ri.seq, 6);
    assert_int_equal(ri.base, 4);
    assert_int_equal(ri.deltas, 2);
    assert_int_equal(ri.table_rows, want.rows);
    assert_int_equal(server_tables_checksum(&back, 1), server_tables_checksum(&st, 1));
    expect_same_var(&st, &back, "w");
    server_tables_free(&back);
    state_fini(&back);
    server_tables_free(&st);
    state_fini(&st);
}

/* Rewrites the Adam table records (type 6) of the checkpoint at path as they were written
 * before a row's step count was one counter: 4 * dim floats a row, the step count repeated for
 * every element. Fixes the records' CRCs and the end record's total. */
static void rewrite_adam_rows_as_legacy(const char *path, uint32_t dim)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static unsigned char in[1 << 22], out[1 << 22];
    size_t n = fread(in, 1, sizeof(in), f);
    fclose(f);
    assert_true(n > 64 && n < sizeof(in));
    memcpy(out, in, 64);
    size_t pos = 64, o = 64;
    uint64_t total = 0;
    int rewritten = 0;
    while (pos < n) {
        uint32_t type;
        uint64_t len;
        memcpy(&type, in + pos, 4);
        memcpy(&len, in + pos + 8, 8);
        size_t rec = 16 + (size_t)len + 4;
        assert_true(pos + rec <= n);
        const unsigned char *pl = in + pos + 16;
        uint32_t spec_len = 0, rf = 0, legacy_rf = 4 * dim;
        if (type == CKPT_REC_TABLE) {
            memcpy(&spec_len, pl, 4);
            memcpy(&rf, pl + 4 + spec_len, 4);
        }
        if (type == CKPT_REC_TABLE && rf == 3 * dim + 1) { /* the Adam table's */
            uint64_t rows;
            memcpy(&rows, pl + 4 + spec_len + 8, 8);
            uint64_t nlen = 4 + spec_len + 16 + rows * (16 + 4 * (uint64_t)legacy_rf);
            unsigned char *q = out + o;
            memcpy(q, in + pos, 8);
            memcpy(q + 8, &nlen, 8);
            memcpy(q + 16, pl, 4 + spec_len);
            memcpy(q + 16 + 4 + spec_len, &legacy_rf, 4);
            memcpy(q + 16 + 4 + spec_len + 4, pl + 4 + spec_len + 4, 12);
            const unsigned char *src = pl + 4 + spec_len + 16;
            unsigned char *dst = q + 16 + 4 + spec_len + 16;
            for (uint64_t i = 0; i < rows; i++) {
                memcpy(dst, src, 16 + 12 * (size_t)dim); /* id, time, parameters, m, v */
                float t;
                memcpy(&t, src + 16 + 12 * (size_t)dim, 4);
                for (uint32_t k = 0; k < dim; k++)
                    memcpy(dst + 16 + 12 * (size_t)dim + 4 * k, &t, 4);
                src += 16 + 4 * (size_t)rf;
                dst += 16 + 4 * (size_t)legacy_rf;
            }
            uint32_t crc = (uint32_t)crc32(0L, q, (uInt)(16 + nlen));
            memcpy(q + 16 + nlen, &crc, 4);
            o += 16 + nlen + 4;
            total += nlen;
            rewritten++;
        } else if (type == CKPT_REC_END) {
            memcpy(out + o, in + pos, 24);
            memcpy(out + o + 24, &total, 8);
            uint32_t crc = (uint32_t)crc32(0L, out + o, 32);
            memcpy(out + o + 32, &crc, 4);
            o += rec;
        } else {
            memcpy(out + o, in + pos, rec);
            o += rec;
            total += len;
        }
        pos += rec;
    }
    assert_int_equal(rewritten, 1);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(out, 1, o, f), o);
    assert_int_equal(fclose(f), 0);
}

/* A checkpoint written before Adam's step count was one per row (4 * dim floats a row) still
 * restores: the rows come back with their step counts; a table of another dtype carries it in
 * its spec record. */
static void test_table_legacy_adam_rows(void **state)
{
    (void)state;
    clear_dir();
    server_state st;
    state_init(&st, 0, 1);
    enum { DIM = 3 };
    const Psd__V1__Optimizer opts[] = {PSD__V1__OPTIMIZER__OPT_ADAM,
                                       PSD__V1__OPTIMIZER__OPT_ROWWISE_ADAGRAD};
    const char *names[] = {"adam_rows", "rw_half"};
    table *tabs[2];
    for (int i = 0; i < 2; i++) {
        Psd__V1__TableSpec ts = PSD__V1__TABLE_SPEC__INIT;
        ts.name = (char *)names[i];
        ts.dim = DIM;
        ts.optimizer = opts[i];
        ts.learning_rate = 0.01;
        ts.beta1 = 0.9;
        ts.beta2 = 0.999;
        ts.epsilon = 1e-8;
        ts.initial_accumulator = 0.1;
        ts.staleness = -1;
        ts.num_servers = 1;
        if (i == 1)
            ts.dtype = PSD__V1__DTYPE__FLOAT16;
        uint8_t spec[256];
        size_t len = psd__v1__table_spec__pack(&ts, spec);
        char err[512];
        if (server_table_make(&st, spec, len, &tabs[i], err, sizeof(err)) != 0)
            fail_msg("server_table_make: %s", err);
        assert_int_equal(server_table_register(&st, tabs[i], spec, len), 0);
    }
    assert_int_equal(table_row_floats(tabs[0]), 3 * DIM + 1);
    assert_int_equal(table_dtype(tabs[1]), ROW_FLOAT16);
    char err[512];
    for (int64_t id = 0; id < 40; id++) {
        float g[DIM] = {0.5f, -0.25f, (float)id / 8};
        for (int step = 0; step <= id % 5; step++)
            for (int i = 0; i < 2; i++)
                assert_int_equal(
                    table_push(tabs[i], &id, 1, g, 1700000000000 + id, err, sizeof(err)), TABLE_OK);
    }
    checkpoint_info info;
    write_one(&st, 1, &info);
    rewrite_adam_rows_as_legacy(info.path, DIM);
    server_state back;
    checkpoint_info rinfo;
    assert_int_equal(restore(&back, 0, 1, &rinfo), CKPT_RESTORED);
    assert_int_equal(rinfo.table_rows, 80);
    assert_int_equal(server_tables_checksum(&back, 1), server_tables_checksum(&st, 1));
    server_tables_free(&back);
    state_fini(&back);
    server_tables_free(&st);
    state_fini(&st);
}

/* Makes the checkpoint at path a file of a release before slots: no slot record (11), no slot
 * count in the header, the end record's counts and both CRCs fixed. */
static void strip_slot_record(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    uint32_t type;
    uint64_t len;
    memcpy(&type, buf + 64, 4);
    memcpy(&len, buf + 72, 8);
    assert_int_equal(type, 11);
    size_t rec = 16 + (size_t)len + 4;
    memmove(buf + 64, buf + 64 + rec, n - 64 - rec);
    n -= rec;
    memset(buf + 56, 0, 4);
    uint32_t crc = (uint32_t)crc32(0L, buf, 60);
    memcpy(buf + 60, &crc, 4);
    /* The end record: 16 bytes of head, u64 records before it, u64 their payload bytes, CRC. */
    uint8_t *end = buf + n - 36;
    uint64_t nrec, total;
    memcpy(&nrec, end + 16, 8);
    memcpy(&total, end + 24, 8);
    nrec--;
    total -= len;
    memcpy(end + 16, &nrec, 8);
    memcpy(end + 24, &total, 8);
    crc = (uint32_t)crc32(0L, end, 32);
    memcpy(end + 32, &crc, 4);
    f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Files of a cluster of 3 written before slots (variables placed by hash mod 3) restore onto
 * the same 3 servers converted: each holds the variables its slots hold now, and every old
 * task's windows and the clocks' union (each worker's highest clock). */
static void test_before_slots_converted(void **state)
{
    (void)state;
    clear_dir();
    enum { NV = 12 };
    char names[NV][32];
    server_state st[3];
    for (uint32_t t = 0; t < 3; t++)
        state_init(&st[t], t, 3);
    for (int i = 0; i < NV; i++) {
        snprintf(names[i], sizeof(names[i]), "old/v%d", i);
        add_var(&st[placement_hash(names[i]) % 3], names[i], PSD__V1__OPTIMIZER__OPT_ADAM,
                (float)(i + 1));
    }
    checkpoint_info info;
    for (uint32_t t = 0; t < 3; t++) {
        assert_int_equal(dedup_begin(st[t].dedup, 0x100 + t, 5), DEDUP_NEW);
        sync_worker_rec w[2] = {{.id = 0, .clock = 5 + t, .known = true, .live = true},
                                {.id = 1, .clock = 9 - t, .known = true, .live = true}};
        sync_import(&st[t], w, 2, 0, SYNC_NO_FRONTIER);
        write_one(&st[t], 1, &info);
        strip_slot_record(info.path);
    }
    slot_map m3 = slots_static(SLOTS_DEFAULT, 3);
    int held = 0, moved = 0;
    for (uint32_t t = 0; t < 3; t++) {
        server_state back;
        checkpoint_info rinfo;
        assert_int_equal(restore(&back, t, 3, &rinfo), CKPT_RESTORED);
        assert_int_equal(rinfo.from_servers, 3);
        for (int i = 0; i < NV; i++) {
            variable *y = store_find(back.vars, names[i]);
            if (slots_name_owner(&m3, names[i]) != t) {
                assert_null(y);
                continue;
            }
            held++;
            moved += placement_hash(names[i]) % 3 != t;
            variable *x = store_find(st[placement_hash(names[i]) % 3].vars, names[i]);
            assert_non_null(y);
            assert_memory_equal(x->params, y->params, NEL * sizeof(float));
            for (size_t k = 0; k < x->nslots; k++)
                assert_memory_equal(x->slots[k], y->slots[k], NEL * sizeof(float));
        }
        for (uint32_t c = 0; c < 3; c++)
            assert_int_equal(dedup_begin(back.dedup, 0x100 + c, 5), DEDUP_DUPLICATE);
        size_t nw = 0;
        int64_t amin, frontier;
        sync_worker_rec *w = sync_export(&back, &nw, &amin, &frontier);
        assert_int_equal(nw, 2);
        for (size_t k = 0; k < nw; k++)
            assert_int_equal(w[k].clock, w[k].id == 0 ? 7 : 9);
        free(w);
        state_fini(&back);
    }
    assert_int_equal(held, NV);
    assert_true(moved > 0); /* the test means something: some variables changed server */
    for (uint32_t t = 0; t < 3; t++)
        state_fini(&st[t]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_corruption_falls_back),
        cmocka_unit_test(test_dedup_tombstones_round_trip),
        cmocka_unit_test(test_finished_workers_round_trip),
        cmocka_unit_test(test_replica_position_round_trip),
        cmocka_unit_test(test_initial_variable_is_its_spec),
        cmocka_unit_test(test_table_delta_chain),
        cmocka_unit_test(test_table_legacy_adam_rows),
        cmocka_unit_test(test_lock_and_record),
        cmocka_unit_test(test_restore_verdict),
        cmocka_unit_test(test_before_slots_converted),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
