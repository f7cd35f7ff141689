/* Unit tests of worker/data*.c: IDX and CSV readers on good and corrupt files, shards,
 * shuffles and scaling. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <cmocka.h>

#include "data.h"

static char tmpdir[256];

static void path_of(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", tmpdir, name);
}

static void write_file(const char *name, const void *data, size_t len)
{
    char p[512];
    path_of(p, sizeof(p), name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (len > 0)
        assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static void write_gz(const char *name, const void *data, size_t len)
{
    char p[512];
    path_of(p, sizeof(p), name);
    gzFile f = gzopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, data, (unsigned)len), (int)len);
    gzclose(f);
}

static size_t read_file(const char *name, uint8_t *buf, size_t cap)
{
    char p[512];
    path_of(p, sizeof(p), name);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* n images of r x c with pixel (i, j) = (i * 7 + j) mod 256, and labels i mod 3. */
static size_t make_images(uint8_t *buf, uint32_t n, uint32_t r, uint32_t c)
{
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = 8;
    buf[3] = 3;
    put_be32(buf + 4, n);
    put_be32(buf + 8, r);
    put_be32(buf + 12, c);
    for (uint32_t i = 0; i < n * r * c; i++)
        buf[16 + i] = (uint8_t)((i / (r * c)) * 7 + i % (r * c));
    return 16 + (size_t)n * r * c;
}

static size_t make_labels(uint8_t *buf, uint32_t n)
{
    buf[0] = 0;
    buf[1] = 0;
    buf[2] = 8;
    buf[3] = 1;
    put_be32(buf + 4, n);
    for (uint32_t i = 0; i < n; i++)
        buf[8 + i] = (uint8_t)(i % 3);
    return 8 + n;
}

static int setup(void **state)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ps-test-data-XXXXXX");
    if (mkdtemp(tmpdir) == NULL)
        return -1;
    uint8_t img[16 + 5 * 6], lab[8 + 5];
    size_t il = make_images(img, 5, 2, 3);
    size_t ll = make_labels(lab, 5);
    write_file("good-images", img, il);
    write_file("good-labels", lab, ll);
    write_gz("good-images.gz", img, il);
    write_gz("good-labels.gz", lab, ll);
    return 0;
}

static int teardown(void **state)
{
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void check_good(const dataset *d)
{
    assert_int_equal(d->n, 5);
    assert_int_equal(d->dim, 6);
    assert_int_equal(d->num_classes, 3);
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(d->y[i], (int)(i % 3));
        for (size_t j = 0; j < 6; j++)
            assert_float_equal(d->x[i * 6 + j], (float)((i * 7 + j) % 256) / 255.0f, 1e-7);
    }
}

static void load_pair(const char *img, const char *lab, dataset *d, int expect_rc, char *err,
                      size_t errlen)
{
    char pi[512], pl[512];
    path_of(pi, sizeof(pi), img);
    path_of(pl, sizeof(pl), lab);
    int rc = data_load_idx(pi, pl, d, err, errlen);
    if (rc != expect_rc)
        fail_msg("data_load_idx(%s, %s) = %d, expected %d (%s)", img, lab, rc, expect_rc, err);
}

static void test_idx_plain(void **state)
{
    dataset d;
    char err[512] = "";
    load_pair("good-images", "good-labels", &d, 0, err, sizeof(err));
    check_good(&d);
    dataset_free(&d);
    assert_null(d.x);
}

static void test_idx_gzip(void **state)
{
    dataset d;
    char err[512] = "";
    load_pair("good-images.gz", "good-labels", &d, 0, err, sizeof(err));
    check_good(&d);
    dataset_free(&d);
    load_pair("good-images", "good-labels.gz", &d, 0, err, sizeof(err));
    check_good(&d);
    dataset_free(&d);
}

/* Loads a corrupt images file (with good labels) and checks the message names the file and
 * contains `needle`. */
static void expect_bad_images(const char *name, const void *data, size_t len, bool gz,
                              const char *needle)
{
    if (gz)
        write_gz(name, data, len);
    else
        write_file(name, data, len);
    dataset d;
    char err[512] = "";
    load_pair(name, "good-labels", &d, -1, err, sizeof(err));
    if (strstr(err, name) == NULL || strstr(err, needle) == NULL)
        fail_msg("error for %s should name it and say '%s': got '%s'", name, needle, err);
    assert_null(d.x);
    assert_null(d.y);
}

static void test_idx_corrupt(void **state)
{
    uint8_t img[16 + 5 * 6 + 1];
    size_t il = make_images(img, 5, 2, 3);

    expect_bad_images("empty", img, 0, false, "empty");
    expect_bad_images("short-magic", img, 3, false, "truncated");
    uint8_t bad[sizeof(img)];
    memcpy(bad, img, il);
    bad[0] = 0x1f;
    expect_bad_images("bad-magic", bad, il, false, "magic");
    memcpy(bad, img, il);
    bad[2] = 0x0d;
    expect_bad_images("bad-type", bad, il, false, "type");
    memcpy(bad, img, il);
    bad[3] = 1;
    expect_bad_images("bad-rank", bad, il, false, "rank");
    expect_bad_images("short-header", img, 10, false, "truncated header");
    expect_bad_images("truncated", img, il - 4, false, "truncated");
    expect_bad_images("truncated.gz", img, il - 4, true, "truncated");
    memcpy(bad, img, il);
    bad[il] = 0;
    expect_bad_images("trailing", bad, il + 1, false, "trailing");
    memcpy(bad, img, il);
    put_be32(bad + 8, 0);
    expect_bad_images("zero-dim", bad, il, false, "zero");
    memcpy(bad, img, il);
    put_be32(bad + 4, 0xffffffffu);
    put_be32(bad + 8, 0xffffffffu);
    expect_bad_images("huge", bad, il, false, "too large");
    /* A header claiming 60000 28x28 images in a small file: truncated, not a 47 MB alloc. */
    memcpy(bad, img, il);
    put_be32(bad + 4, 60000);
    put_be32(bad + 8, 28);
    put_be32(bad + 12, 28);
    expect_bad_images("lying-header", bad, il, false, "truncated");

    /* Labels: count mismatch and rank. */
    uint8_t lab[8 + 4];
    size_t ll = make_labels(lab, 4);
    write_file("labels-4", lab, ll);
    dataset d;
    char err[512] = "";
    load_pair("good-images", "labels-4", &d, -1, err, sizeof(err));
    assert_non_null(strstr(err, "5 images"));
    assert_non_null(strstr(err, "4 labels"));
    load_pair("good-images", "good-images", &d, -1, err, sizeof(err));
    assert_non_null(strstr(err, "rank 3, expected 1"));
    load_pair("no-such-file", "good-labels", &d, -1, err, sizeof(err));
    assert_non_null(strstr(err, "no-such-file"));
    assert_non_null(strstr(err, "cannot open"));
    load_pair(".", "good-labels", &d, -1, err, sizeof(err));
    assert_non_null(strstr(err, "directory"));
}

static void test_idx_corrupt_gzip(void **state)
{
    uint8_t img[16 + 5 * 6];
    size_t il = make_images(img, 5, 2, 3);
    write_gz("whole.gz", img, il);
    uint8_t gz[512];
    size_t gl = read_file("whole.gz", gz, sizeof(gz));
    assert_true(gl > 20);
    /* Cut the compressed stream in half. */
    write_file("cut.gz", gz, gl / 2);
    dataset d;
    char err[512] = "";
    load_pair("cut.gz", "good-labels", &d, -1, err, sizeof(err));
    assert_non_null(strstr(err, "cut.gz"));
    /* Garbage inside the deflate stream. */
    for (size_t i = 12; i < gl - 8; i++)
        gz[i] ^= 0xa5;
    write_file("garbage.gz", gz, gl);
    load_pair("garbage.gz", "good-labels", &d, -1, err, sizeof(err));
    assert_non_null(strstr(err, "garbage.gz"));
}

static void test_idx_dir(void **state)
{
    uint8_t img[16 + 5 * 6], lab[8 + 5];
    size_t il = make_images(img, 5, 2, 3);
    size_t ll = make_labels(lab, 5);
    write_gz("train-images-idx3-ubyte.gz", img, il);
    write_file("train-labels-idx1-ubyte", lab, ll);
    dataset d;
    char err[512] = "";
    assert_int_equal(data_load_idx_dir(tmpdir, "train", &d, err, sizeof(err)), 0);
    check_good(&d);
    dataset_free(&d);
    assert_int_equal(data_load_idx_dir(tmpdir, "t10k", &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "t10k-images-idx3-ubyte"));
    assert_non_null(strstr(err, "missing"));
    assert_int_equal(data_load_idx_dir("/nonexistent/dir", "train", &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "/nonexistent/dir"));
}

static void test_real_fashion_mnist(void **state)
{
    const char *dir = getenv("PS_TEST_FASHION_DIR");
    if (dir == NULL)
        dir = DATA_DEFAULT_DIR;
    char p[512];
    snprintf(p, sizeof(p), "%s/t10k-labels-idx1-ubyte.gz", dir);
    if (access(p, R_OK) != 0) {
        print_message("skipping: %s not installed\n", p);
        skip();
    }
    dataset d;
    char err[512] = "";
    if (data_load_idx_dir(dir, "t10k", &d, err, sizeof(err)) != 0)
        fail_msg("%s", err);
    assert_int_equal(d.n, 10000);
    assert_int_equal(d.dim, 784);
    assert_int_equal(d.num_classes, 10);
    int counts[10] = {0};
    for (size_t i = 0; i < d.n; i++)
        counts[d.y[i]]++;
    for (int k = 0; k < 10; k++)
        assert_int_equal(counts[k], 1000);
    float lo, hi;
    dataset_minmax(&d, &lo, &hi);
    assert_float_equal(lo, 0.0f, 0.0);
    assert_float_equal(hi, 1.0f, 0.0);
    dataset_free(&d);
}

static void load_csv_text(const char *name, const char *text, dataset *d, int expect_rc, char *err,
                          size_t errlen)
{
    write_file(name, text, strlen(text));
    char p[512];
    path_of(p, sizeof(p), name);
    int rc = data_load_csv(p, d, err, errlen);
    if (rc != expect_rc)
        fail_msg("data_load_csv(%s) = %d, expected %d (%s)", name, rc, expect_rc, err);
}

static void test_csv_good(void **state)
{
    dataset d;
    char err[512] = "";
    load_csv_text("good.csv", "label,a,b,c\r\n2, 0.5,1,2\r\n\r\n0,-1,3e1,4\n1,0,0,0", &d, 0, err,
                  sizeof(err));
    assert_int_equal(d.n, 3);
    assert_int_equal(d.dim, 3);
    assert_int_equal(d.num_classes, 3);
    assert_int_equal(d.y[0], 2);
    assert_int_equal(d.y[1], 0);
    assert_int_equal(d.y[2], 1);
    assert_float_equal(d.x[0], 0.5f, 0);
    assert_float_equal(d.x[4], 30.0f, 0);
    float lo, hi;
    dataset_minmax(&d, &lo, &hi);
    assert_float_equal(lo, -1.0f, 0);
    assert_float_equal(hi, 30.0f, 0);
    dataset_scale(&d, lo, hi);
    assert_float_equal(d.x[3], 0.0f, 1e-7); /* -1 */
    assert_float_equal(d.x[4], 1.0f, 1e-7); /* 30 */
    assert_float_equal(d.x[0], 1.5f / 31.0f, 1e-6);
    dataset_free(&d);
    /* No header. */
    load_csv_text("nohdr.csv", "3,1\n4,2\n", &d, 0, err, sizeof(err));
    assert_int_equal(d.n, 2);
    assert_int_equal(d.num_classes, 5);
    dataset_free(&d);
}

static void expect_bad_csv(const char *name, const char *text, const char *needle)
{
    dataset d;
    char err[512] = "";
    load_csv_text(name, text, &d, -1, err, sizeof(err));
    if (strstr(err, name) == NULL || strstr(err, needle) == NULL)
        fail_msg("error for %s should name it and say '%s': got '%s'", name, needle, err);
    assert_null(d.x);
}

static void test_csv_corrupt(void **state)
{
    expect_bad_csv("empty.csv", "", "no data rows");
    expect_bad_csv("header-only.csv", "label,x\n", "no data rows");
    expect_bad_csv("notnum.csv", "1,2\n1,abc\n", ":2: field 2 is not a number");
    expect_bad_csv("fields.csv", "1,2,3\n1,2\n", ":2: 2 fields");
    expect_bad_csv("neglabel.csv", "1,2\n-1,2\n", "not a class index");
    expect_bad_csv("fraclabel.csv", "1.5,2\n", "not a class index");
    expect_bad_csv("onefield.csv", "1\n2\n", "expected a label and at least one feature");
    expect_bad_csv("emptyfield.csv", "1,,2\n", "field 2 is not a number");
    expect_bad_csv("nan.csv", "1,nan\n", "not a number");
    dataset d;
    char err[512] = "";
    write_file("binary.csv", "1,2\n\0\0\0\n", 8);
    char p[512];
    path_of(p, sizeof(p), "binary.csv");
    assert_int_equal(data_load_csv(p, &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "binary.csv:2: NUL"));
    assert_int_equal(data_load_csv("/nonexistent.csv", &d, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "/nonexistent.csv"));
}

static void test_shards(void **state)
{
    const size_t total = 1000;
    int seen[1000] = {0};
    for (int task = 0; task < 3; task++) {
        data_shard s;
        assert_int_equal(data_shard_init(&s, total, task, 3, 42), 0);
        assert_true(s.n == 333 || s.n == 334);
        for (size_t i = 0; i < s.n; i++)
            seen[s.index[i]]++;
        /* A shuffle is a permutation of the same shard, deterministic in the seed. */
        data_shard s2;
        assert_int_equal(data_shard_init(&s2, total, task, 3, 42), 0);
        data_shard_shuffle(&s, 1);
        data_shard_shuffle(&s2, 1);
        assert_memory_equal(s.index, s2.index, s.n * sizeof(uint32_t));
        int count[1000] = {0};
        for (size_t i = 0; i < s.n; i++)
            count[s.index[i]]++;
        for (size_t i = 0; i < total; i++)
            assert_true(count[i] <= 1 && (count[i] == 0 || seen[i] == 1));
        data_shard_free(&s);
        data_shard_free(&s2);
    }
    for (size_t i = 0; i < total; i++)
        assert_int_equal(seen[i], 1); /* disjoint and covering */
    data_shard s;
    assert_int_equal(data_shard_init(&s, 2, 0, 3, 1), -1); /* empty shard */
    assert_int_equal(data_shard_init(&s, 10, 3, 3, 1), -1);
    assert_int_equal(data_shard_init(&s, 10, -1, 3, 1), -1);
    assert_int_equal(data_shard_init(&s, 10, 0, 0, 1), -1);
    /* Another seed gives another split. */
    data_shard a, b;
    assert_int_equal(data_shard_init(&a, total, 0, 2, 1), 0);
    assert_int_equal(data_shard_init(&b, total, 0, 2, 2), 0);
    assert_true(memcmp(a.index, b.index, a.n * sizeof(uint32_t)) != 0);
    data_shard_free(&a);
    data_shard_free(&b);
}

static void test_gather(void **state)
{
    float x[6] = {1, 2, 3, 4, 5, 6};
    int32_t y[3] = {7, 8, 9};
    dataset d = {.n = 3, .dim = 2, .num_classes = 10, .x = x, .y = y};
    uint32_t order[2] = {2, 0};
    float bx[4];
    int32_t by[2];
    data_gather(&d, order, 2, bx, by);
    assert_float_equal(bx[0], 5, 0);
    assert_float_equal(bx[1], 6, 0);
    assert_float_equal(bx[2], 1, 0);
    assert_int_equal(by[0], 9);
    assert_int_equal(by[1], 7);
}

/* The data order (shuffles, shards) follows data_rng_next: splitmix64, pinned. */
static void test_rng_pinned(void **state)
{
    (void)state;
    uint64_t s = 0;
    assert_true(data_rng_next(&s) == 0xe220a8397b1dcdafull);
    assert_true(data_rng_next(&s) == 0x6e789e6aa1b965f4ull);
    assert_true(data_rng_next(&s) == 0x06c45d188009454full);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_idx_plain),   cmocka_unit_test(test_idx_gzip),
        cmocka_unit_test(test_idx_corrupt), cmocka_unit_test(test_idx_corrupt_gzip),
        cmocka_unit_test(test_idx_dir),     cmocka_unit_test(test_real_fashion_mnist),
        cmocka_unit_test(test_csv_good),    cmocka_unit_test(test_csv_corrupt),
        cmocka_unit_test(test_shards),      cmocka_unit_test(test_gather),
        cmocka_unit_test(test_rng_pinned),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
