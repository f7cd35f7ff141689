/* Unit tests for server/cold_store.c (the on-disk store of a table's cold tier): batched writes
 * and deletes, multi-get, ordered iteration over a key range, snapshots, emptying on open,
 * checkpoints (hard links) and a store opened from one, a damaged one refused.
 * Skipped with a reason when the build has no RocksDB. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "cold_store.h"

static char dir[256];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof(dir), "/tmp/psd-cold-test-XXXXXX");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void key_of(unsigned char *k, uint8_t prefix, uint64_t v)
{
    k[0] = prefix;
    for (int i = 0; i < 8; i++)
        k[1 + i] = (unsigned char)(v >> (56 - 8 * i));
}

static cold_store *open_store(const char *sub)
{
    char path[300], err[256] = "";
    snprintf(path, sizeof(path), "%s/%s", dir, sub);
    cold_store *s = cold_store_open(path, err, sizeof(err));
    if (s == NULL)
        print_error("cold_store_open: %s\n", err);
    assert_non_null(s);
    return s;
}

static void test_put_get_delete(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    cold_store *s = open_store("a");
    cold_batch *b = cold_batch_new();
    unsigned char k[9];
    for (uint64_t i = 0; i < 1000; i++) {
        uint64_t v[2] = {i, i * 3};
        key_of(k, 'r', i);
        cold_batch_put(b, k, sizeof(k), v, sizeof(v));
    }
    assert_int_equal(cold_batch_count(b), 1000);
    char err[256];
    assert_int_equal(cold_store_write(s, b, err, sizeof(err)), 0);
    assert_int_equal(cold_batch_count(b), 0);
    for (uint64_t i = 0; i < 1000; i += 2) {
        key_of(k, 'r', i);
        cold_batch_delete(b, k, sizeof(k));
    }
    assert_int_equal(cold_store_write(s, b, err, sizeof(err)), 0);
    enum { N = 6 };
    uint64_t ask[N] = {0, 1, 999, 998, 5000, 7};
    unsigned char keys[N * 9];
    for (int i = 0; i < N; i++)
        key_of(keys + 9 * i, 'r', ask[i]);
    uint64_t vals[N][2];
    bool found[N];
    assert_int_equal(
        cold_store_multiget(s, N, keys, 9, (unsigned char *)vals, 16, found, err, sizeof(err)), 0);
    bool want[N] = {false, true, true, false, false, true};
    for (int i = 0; i < N; i++) {
        assert_int_equal(found[i], want[i]);
        if (found[i]) {
            assert_int_equal(vals[i][0], ask[i]);
            assert_int_equal(vals[i][1], ask[i] * 3);
        }
    }
    /* A value of another size is an error, not a short copy. */
    assert_int_equal(
        cold_store_multiget(s, N, keys, 9, (unsigned char *)vals, 8, found, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "bytes"));
    cold_batch_free(b);
    cold_store_close(s, true);
    char path[300];
    snprintf(path, sizeof(path), "%s/a", dir);
    assert_int_not_equal(access(path, F_OK), 0); /* removed with its files */
}

/* A batch's writes reach the store sorted by key, those of one key in the order made: a put,
 * a delete and a put again of one key leave the last put; a delete after a put leaves
 * nothing; keys of other lengths sharing a prefix stay apart. */
static void test_batch_order_per_key(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    cold_store *s = open_store("order");
    cold_batch *b = cold_batch_new();
    unsigned char k[9];
    char err[256];
    /* Many rounds over few keys, in an order unlike the keys': each key's last write wins. */
    enum { KEYS = 37, ROUNDS = 50 };
    uint64_t last[KEYS];
    bool live[KEYS] = {false};
    for (uint64_t r = 0; r < ROUNDS; r++)
        for (uint64_t j = 0; j < KEYS; j++) {
            uint64_t i = (j * 17 + r * 5) % KEYS;
            key_of(k, 'r', i);
            if ((i + r) % 3 == 0) {
                cold_batch_delete(b, k, sizeof(k));
                live[i] = false;
            } else {
                uint64_t v[2] = {i, r};
                cold_batch_put(b, k, sizeof(k), v, sizeof(v));
                live[i] = true;
                last[i] = r;
            }
        }
    /* A shorter key, a prefix of key 0's: its own key. */
    key_of(k, 'r', 0);
    uint64_t shortv[2] = {7, 7};
    cold_batch_put(b, k, 8, shortv, sizeof(shortv));
    assert_int_equal(cold_batch_count(b), KEYS * ROUNDS + 1);
    assert_int_equal(cold_store_write(s, b, err, sizeof(err)), 0);
    unsigned char keys[KEYS * 9];
    for (uint64_t i = 0; i < KEYS; i++)
        key_of(keys + 9 * i, 'r', i);
    uint64_t vals[KEYS][2];
    bool found[KEYS];
    assert_int_equal(
        cold_store_multiget(s, KEYS, keys, 9, (unsigned char *)vals, 16, found, err, sizeof(err)),
        0);
    for (uint64_t i = 0; i < KEYS; i++) {
        assert_int_equal(found[i], live[i]);
        if (live[i]) {
            assert_int_equal(vals[i][0], i);
            assert_int_equal(vals[i][1], last[i]);
        }
    }
    assert_int_equal(
        cold_store_multiget(s, 1, keys, 8, (unsigned char *)vals, 16, found, err, sizeof(err)), 0);
    assert_true(found[0]);
    assert_int_equal(vals[0][0], 7);
    cold_batch_free(b);
    cold_store_close(s, true);
}

static void test_iterate_range_and_snapshot(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    cold_store *s = open_store("b");
    cold_batch *b = cold_batch_new();
    unsigned char k[9];
    for (uint64_t i = 0; i < 100; i++) {
        key_of(k, i % 2 ? 'x' : 'y', i);
        cold_batch_put(b, k, sizeof(k), &i, sizeof(i));
    }
    char err[256];
    assert_int_equal(cold_store_write(s, b, err, sizeof(err)), 0);
    cold_snapshot *snap = cold_store_snapshot(s);
    assert_non_null(snap);
    /* Changed after the snapshot: the snapshot's walk does not see it. */
    key_of(k, 'x', 1);
    cold_batch_delete(b, k, sizeof(k));
    key_of(k, 'x', 1001);
    uint64_t v = 1001;
    cold_batch_put(b, k, sizeof(k), &v, sizeof(v));
    assert_int_equal(cold_store_write(s, b, err, sizeof(err)), 0);

    unsigned char lo = 'x', hi = 'y';
    for (int pass = 0; pass < 2; pass++) {
        cold_iter *it = cold_iter_new(s, pass == 0 ? snap : NULL, &lo, 1, &hi, 1);
        assert_non_null(it);
        const unsigned char *key, *val;
        size_t kl, vl, n = 0;
        uint64_t last = 0, first = UINT64_MAX;
        while (cold_iter_next(it, &key, &kl, &val, &vl)) {
            assert_int_equal(kl, 9);
            assert_int_equal(key[0], 'x');
            uint64_t got;
            assert_int_equal(vl, sizeof(got));
            memcpy(&got, val, sizeof(got));
            assert_true(n == 0 || got > last); /* in key order */
            first = n == 0 ? got : first;
            last = got;
            n++;
        }
        cold_iter_free(it);
        assert_int_equal(n, 50);
        assert_int_equal(first, pass == 0 ? 1 : 3);
        assert_int_equal(last, pass == 0 ? 99 : 1001);
    }
    cold_snapshot_release(s, snap);
    cold_batch_free(b);
    cold_store_close(s, false);
    /* Opened again: empty. */
    s = open_store("b");
    cold_iter *it = cold_iter_new(s, NULL, NULL, 0, NULL, 0);
    const unsigned char *key, *val;
    size_t kl, vl;
    assert_false(cold_iter_next(it, &key, &kl, &val, &vl));
    cold_iter_free(it);
    cold_store_close(s, true);
}

/* Directories of stores whose process is gone are removed; a live process's and other names
 * stay. */
static void test_remove_stale(void **state)
{
    (void)state;
    char parent[300], path[400], file[500];
    snprintf(parent, sizeof(parent), "%s/stale", dir);
    assert_int_equal(mkdir(parent, 0755), 0);
    snprintf(path, sizeof(path), "%s/table-ab.2147483600.3", parent); /* no such pid */
    assert_int_equal(mkdir(path, 0755), 0);
    snprintf(file, sizeof(file), "%s/000001.sst", path);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs("x", f);
    fclose(f);
    char mine[400], other[400];
    cold_store_dir_name(mine, sizeof(mine), parent, "table-cd");
    assert_int_equal(mkdir(mine, 0755), 0);
    snprintf(other, sizeof(other), "%s/notes", parent);
    assert_int_equal(mkdir(other, 0755), 0);
    assert_int_equal(cold_store_remove_stale(parent), 1);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(access(mine, F_OK), 0);
    assert_int_equal(access(other, F_OK), 0);
}

/* Writes keys 'r' 0..n-1 with values (i, i * mul) of 64 bytes (the rest zero). */
static void put_range(cold_store *s, uint64_t from, uint64_t n, uint64_t mul)
{
    cold_batch *b = cold_batch_new();
    unsigned char k[9];
    for (uint64_t i = from; i < from + n; i++) {
        uint64_t v[8] = {i, i * mul};
        key_of(k, 'r', i);
        cold_batch_put(b, k, sizeof(k), v, sizeof(v));
    }
    char err[256];
    assert_int_equal(cold_store_write(s, b, err, sizeof(err)), 0);
    cold_batch_free(b);
}

/* Asserts that keys 0..n-1 hold (i, i * mul), except [from, to) holding (i, i * mul2). */
static void expect_range(cold_store *s, uint64_t n, uint64_t mul, uint64_t from, uint64_t to,
                         uint64_t mul2)
{
    unsigned char k[9];
    uint64_t v[8];
    bool found;
    char err[256];
    for (uint64_t i = 0; i < n; i++) {
        key_of(k, 'r', i);
        assert_int_equal(cold_store_multiget(s, 1, k, 9, (unsigned char *)v, sizeof(v), &found, err,
                                             sizeof(err)),
                         0);
        assert_true(found);
        assert_int_equal(v[0], i);
        assert_int_equal(v[1], i * (i >= from && i < to ? mul2 : mul));
    }
}

/* The first table file (.sst) of directory d into name (its path), false when none. */
static bool first_sst(const char *d, char *name, size_t cap)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "ls %s/*.sst 2>/dev/null | head -1", d);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    bool ok = fgets(name, (int)cap, p) != NULL;
    pclose(p);
    if (ok)
        name[strcspn(name, "\n")] = '\0';
    return ok;
}

/* A checkpoint (cold_store_checkpoint) holds the store as it was, shares its table files with
 * the store and with the next checkpoint (hard links: a second checkpoint after a 1% change
 * does not copy the rest), opens again into a new store (cold_store_open_from) that does not
 * change it, and a damaged file in it is found at that open, named, never read as values. */
static void test_checkpoint_and_open_from(void **state)
{
    (void)state;
    if (!cold_store_available())
        skip();
    enum { N = 20000 };
    cold_store *s = open_store("live");
    put_range(s, 0, N, 3);
    char ck1[300], ck2[300], r1[300], r2[300], err[1024] = "";
    snprintf(ck1, sizeof(ck1), "%s/ck1", dir);
    snprintf(ck2, sizeof(ck2), "%s/ck2", dir);
    snprintf(r1, sizeof(r1), "%s/r1", dir);
    snprintf(r2, sizeof(r2), "%s/r2", dir);
    assert_int_equal(cold_store_checkpoint(s, ck1, err, sizeof(err)), 0);
    put_range(s, 100, N / 100, 7); /* 1% changed */
    assert_int_equal(cold_store_checkpoint(s, ck2, err, sizeof(err)), 0);
    cold_store_close(s, true);
    /* The first checkpoint's table file is the second's too (one inode, linked from both). */
    char sst[400];
    assert_true(first_sst(ck1, sst, sizeof(sst)));
    struct stat sb;
    assert_int_equal(stat(sst, &sb), 0);
    assert_true(sb.st_nlink >= 2);

    cold_store *a = cold_store_open_from(r1, ck1, err, sizeof(err));
    if (a == NULL)
        print_error("cold_store_open_from: %s\n", err);
    assert_non_null(a);
    expect_range(a, N, 3, 0, 0, 0);
    put_range(a, 0, N, 5); /* the restored store changes; its checkpoint does not */
    cold_store_close(a, true);
    a = cold_store_open_from(r1, ck1, err, sizeof(err));
    assert_non_null(a);
    expect_range(a, N, 3, 0, 0, 0);
    cold_store_close(a, true);
    a = cold_store_open_from(r2, ck2, err, sizeof(err));
    assert_non_null(a);
    expect_range(a, N, 3, 100, 100 + N / 100, 7);
    cold_store_close(a, true);

    /* Damaged: bytes flipped in the middle of the second checkpoint's largest file. */
    char cmd[400], big[400];
    snprintf(cmd, sizeof(cmd), "ls -S %s/*.sst | head -1", ck2);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    assert_non_null(fgets(big, sizeof(big), p));
    pclose(p);
    big[strcspn(big, "\n")] = '\0';
    FILE *f = fopen(big, "r+b");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long at = ftell(f) / 2;
    for (int i = 0; i < 16; i++) {
        fseek(f, at + i, SEEK_SET);
        int c = fgetc(f);
        fseek(f, at + i, SEEK_SET);
        fputc(c ^ 0x5a, f);
    }
    fclose(f);
    err[0] = '\0';
    assert_null(cold_store_open_from(r2, ck2, err, sizeof(err)));
    print_message("damaged: %s\n", err);
    assert_non_null(strstr(err, ck2));
    assert_non_null(strstr(err, "damaged"));
    assert_int_not_equal(access(r2, F_OK), 0); /* the half-made store removed */
    /* A checkpoint that is not there. */
    snprintf(ck1, sizeof(ck1), "%s/none", dir);
    assert_null(cold_store_open_from(r1, ck1, err, sizeof(err)));
    assert_non_null(strstr(err, ck1));
}

static void test_open_fails_with_reason(void **state)
{
    (void)state;
    char err[256] = "";
    cold_store *s = cold_store_open("/nonexistent-psd-dir/x/y", err, sizeof(err));
    assert_null(s);
    assert_non_null(strstr(err, "/nonexistent-psd-dir/x/y"));
}

int main(void)
{
    if (!cold_store_available())
        fprintf(stderr, "cold_store: built without RocksDB: the store's tests are skipped\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_delete),
        cmocka_unit_test(test_batch_order_per_key),
        cmocka_unit_test(test_iterate_range_and_snapshot),
        cmocka_unit_test(test_remove_stale),
        cmocka_unit_test(test_open_fails_with_reason),
        cmocka_unit_test(test_checkpoint_and_open_from),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
