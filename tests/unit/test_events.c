/* Unit tests for common/events.c and common/crc32c.c: CRC-32C against known values (both
 * ways of computing it), TFRecord framing byte for byte against TensorBoard's test vector,
 * written files read back (scalars, histograms, rotation), a file cut at every byte offset,
 * an unusable directory and a write that fails midway. */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "crc32c.h"
#include "events.h"
#include "events.pb-c.h"
#include "util.h"

/* ---- a small TFRecord reader ---- */

static uint64_t le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reads the whole records of buf[0..len), checking both CRCs of each: returns their count and
 * stores the offset where each ends in ends[] (may be NULL). A record cut short ends the
 * read; a CRC that does not match fails the test (a torn record). */
static size_t read_records(const unsigned char *buf, size_t len, size_t *ends)
{
    size_t off = 0, n = 0;
    while (len - off >= 12) {
        uint64_t dl = le64(buf + off);
        assert_int_equal(le32(buf + off + 8), crc32c_mask(crc32c(0, buf + off, 8)));
        if (len - off - 12 < dl + 4)
            break;
        assert_int_equal(le32(buf + off + 12 + dl), crc32c_mask(crc32c(0, buf + off + 12, dl)));
        off += 12 + dl + 4;
        if (ends != NULL)
            ends[n] = off;
        n++;
    }
    return n;
}

static unsigned char *slurp(const char *path, size_t *len)
{
    char err[256];
    unsigned char *b = (unsigned char *)read_file(path, 1u << 26, len, err, sizeof(err));
    if (b == NULL)
        fail_msg("%s: %s", path, err);
    return b;
}

static char tmp_dir[256];

static int setup_dir(void **state)
{
    snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/psd-events-test-XXXXXX");
    assert_non_null(mkdtemp(tmp_dir));
    return 0;
}

static int teardown_dir(void **state)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* The event files of dir, sorted by name (up to 64). Returns their count. */
static int list_files(const char *dir, char names[][768])
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 64)
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0)
            snprintf(names[n++], 768, "%s/%s", dir, e->d_name);
    closedir(d);
    qsort(names, (size_t)n, 768, (int (*)(const void *, const void *))strcmp);
    return n;
}

/* ---- CRC ---- */

static void test_crc_known(void **state)
{
    assert_int_equal(crc32c(0, "123456789", 9), 0xe3069283u);
    assert_int_equal(crc32c_table(0, "123456789", 9), 0xe3069283u);
    unsigned char z[32], f[32];
    memset(z, 0, sizeof(z));
    memset(f, 0xff, sizeof(f));
    assert_int_equal(crc32c(0, z, 32), 0x8a9136aau); /* RFC 3720 B.4 */
    assert_int_equal(crc32c(0, f, 32), 0x62a8ab43u);
    assert_int_equal(crc32c(0, "", 0), 0u);
    /* in pieces, at every alignment, both ways */
    unsigned char buf[300];
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (unsigned char)(i * 37 + 11);
    for (size_t start = 0; start < 9; start++)
        for (size_t len = 0; len + start <= sizeof(buf); len += 7) {
            uint32_t t = crc32c_table(0, buf + start, len);
            assert_int_equal(crc32c(0, buf + start, len), t);
            size_t half = len / 3;
            assert_int_equal(crc32c(crc32c(0, buf + start, half), buf + start + half, len - half),
                             t);
        }
}

/* ---- framing: TensorBoard's test vector (the first record of a TF2 event file) ---- */

static const unsigned char tb_payload[24] = {0x09, 0x00, 0x00, 0x80, 0x38, 0x99, 0xd6, 0xd7,
                                             0x41, 0x1a, 0x0d, 'b',  'r',  'a',  'i',  'n',
                                             '.',  'E',  'v',  'e',  'n',  't',  ':',  '2'};

static void test_record_vector(void **state)
{
    unsigned char rec[40];
    assert_int_equal(event_record_frame(rec, tb_payload, sizeof(tb_payload)), 40);
    static const unsigned char head[12] = {0x18, 0, 0, 0, 0, 0, 0, 0, 0xa3, 0x7f, 0x4b, 0x22};
    assert_memory_equal(rec, head, 12);
    assert_memory_equal(rec + 12, tb_payload, 24);
    static const unsigned char tail[4] = {0x12, 0x4b, 0x36, 0xab};
    assert_memory_equal(rec + 36, tail, 4);
    /* our Event encodes to the same payload */
    Psd__Events__Event ev = PSD__EVENTS__EVENT__INIT;
    memcpy(&ev.wall_time, tb_payload + 1, 8);
    ev.what_case = PSD__EVENTS__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)"brain.Event:2";
    unsigned char out[64];
    assert_int_equal(psd__events__event__get_packed_size(&ev), 24);
    psd__events__event__pack(&ev, out);
    assert_memory_equal(out, tb_payload, 24);
}

/* ---- files ---- */

static Psd__Events__Event *decode(const unsigned char *buf, size_t start, size_t end)
{
    Psd__Events__Event *ev = psd__events__event__unpack(NULL, end - start - 16, buf + start + 12);
    assert_non_null(ev);
    return ev;
}

static void test_write_read_back(void **state)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/a/worker-0", tmp_dir);
    event_writer *w = NULL;
    char err[512];
    assert_int_equal(event_writer_open(&w, dir, NULL, err, sizeof(err)), 0);
    const char *path = event_writer_path(w);
    const char *base = strrchr(path, '/') + 1;
    /* events.out.tfevents.<10 digits>.<host>.<pid>.0 */
    assert_int_equal(strncmp(base, "events.out.tfevents.", 20), 0);
    for (int i = 0; i < 10; i++)
        assert_true(base[20 + i] >= '0' && base[20 + i] <= '9');
    assert_int_equal(base[30], '.');
    assert_int_equal(strcmp(base + strlen(base) - 2, ".0"), 0);
    for (int64_t s = 1; s <= 20; s++) {
        event_scalar v[2] = {{"train/loss", 1.0 / (double)s}, {"train/accuracy", 0.5}};
        assert_int_equal(event_writer_scalars(w, s, 1700000000.0 + (double)s, v, 2), 0);
    }
    float vals[1000];
    for (int i = 0; i < 1000; i++)
        vals[i] = (float)(i - 500) / 100.0f;
    assert_int_equal(event_writer_histogram(w, 20, 0, "weights/dense0", vals, 1000), 0);
    char saved[4200];
    snprintf(saved, sizeof(saved), "%s", path);
    event_writer_close(w);

    size_t len;
    unsigned char *buf = slurp(saved, &len);
    size_t ends[64];
    size_t n = read_records(buf, len, ends);
    assert_int_equal(n, 22);
    assert_int_equal(ends[n - 1], len);
    Psd__Events__Event *ev = decode(buf, 0, ends[0]);
    assert_string_equal(ev->file_version, "brain.Event:2");
    psd__events__event__free_unpacked(ev, NULL);
    for (size_t i = 1; i <= 20; i++) {
        ev = decode(buf, ends[i - 1], ends[i]);
        assert_int_equal(ev->step, (int64_t)i);
        assert_true(ev->wall_time == 1700000000.0 + (double)i);
        assert_int_equal(ev->what_case, PSD__EVENTS__EVENT__WHAT_SUMMARY);
        assert_int_equal(ev->summary->n_value, 2);
        assert_string_equal(ev->summary->value[0]->tag, "train/loss");
        assert_true(ev->summary->value[0]->simple_value == (float)(1.0 / (double)i));
        assert_true(ev->summary->value[1]->simple_value == 0.5f);
        psd__events__event__free_unpacked(ev, NULL);
    }
    ev = decode(buf, ends[20], ends[21]);
    Psd__Events__HistogramProto *h = ev->summary->value[0]->histo;
    assert_non_null(h);
    assert_true(h->num == 1000.0);
    assert_true(h->min == -5.0 && h->max == (double)(499.0f / 100.0f));
    assert_int_equal(h->n_bucket, h->n_bucket_limit);
    double total = 0;
    for (size_t i = 0; i < h->n_bucket; i++) {
        total += h->bucket[i];
        if (i > 0)
            assert_true(h->bucket_limit[i] > h->bucket_limit[i - 1]);
    }
    assert_true(total == 1000.0);
    psd__events__event__free_unpacked(ev, NULL);

    /* a file cut at every byte offset: every whole record, never a torn one */
    for (size_t cut = 0; cut <= len; cut++) {
        size_t want = 0;
        while (want < n && ends[want] <= cut)
            want++;
        assert_int_equal(read_records(buf, cut, NULL), want);
    }
    free(buf);
}

static void test_rotation(void **state)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/rot", tmp_dir);
    event_writer *w = NULL;
    char err[512];
    event_writer_options o = {.rotate_bytes = 300, .flush_ms = 1};
    assert_int_equal(event_writer_open(&w, dir, &o, err, sizeof(err)), 0);
    for (int64_t s = 1; s <= 40; s++) {
        event_scalar v = {"x", (double)s};
        assert_int_equal(event_writer_scalars(w, s, 0, &v, 1), 0);
    }
    event_writer_close(w);
    static char names[64][768];
    int nf = list_files(dir, names);
    assert_true(nf >= 3);
    int64_t next = 1;
    for (int f = 0; f < nf; f++) {
        size_t len;
        unsigned char *buf = slurp(names[f], &len);
        assert_true(len <= 300 + 64);
        size_t ends[64];
        size_t n = read_records(buf, len, ends);
        assert_int_equal(ends[n - 1], len);
        Psd__Events__Event *ev = decode(buf, 0, ends[0]);
        assert_string_equal(ev->file_version, "brain.Event:2");
        psd__events__event__free_unpacked(ev, NULL);
        for (size_t i = 1; i < n; i++) {
            ev = decode(buf, ends[i - 1], ends[i]);
            assert_int_equal(ev->step, next++);
            psd__events__event__free_unpacked(ev, NULL);
        }
        free(buf);
    }
    assert_int_equal(next, 41);
}

static void test_unusable_dir(void **state)
{
    char file[512], dir[600];
    snprintf(file, sizeof(file), "%s/plain", tmp_dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(dir, sizeof(dir), "%s/run", file);
    event_writer *w = (event_writer *)1;
    char err[1024];
    assert_int_equal(event_writer_open(&w, dir, NULL, err, sizeof(err)), -1);
    assert_null(w);
    assert_non_null(strstr(err, "cannot create"));
    assert_non_null(strstr(err, "Not a directory"));
    assert_int_equal(event_writer_open(&w, "", NULL, err, sizeof(err)), -1);
}

/* A write that fails midway (the file size limit stands in for a full disk): the writer
 * stops, the file keeps only whole records, later calls return -1 and do nothing. */
static void test_write_fails(void **state)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/full", tmp_dir);
    event_writer *w = NULL;
    char err[512];
    event_writer_options o = {.flush_ms = 1};
    assert_int_equal(event_writer_open(&w, dir, &o, err, sizeof(err)), 0);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 1000;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int failed_at = -1;
    for (int s = 1; s <= 200; s++) {
        event_scalar v[3] = {{"a", 1}, {"b", 2}, {"c", (double)s}};
        int rc = event_writer_scalars(w, s, 0, v, 3);
        if (rc == 0)
            rc = event_writer_flush(w);
        if (rc != 0 && failed_at < 0)
            failed_at = s;
        if (failed_at >= 0)
            assert_int_equal(rc, -1);
    }
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    if (failed_at <= 1)
        fail_msg("the writer failed at record %d", failed_at);
    assert_true(event_writer_failed(w));
    assert_int_equal(event_writer_flush(w), -1);
    char saved[4200];
    snprintf(saved, sizeof(saved), "%s", event_writer_path(w));
    event_writer_close(w);
    size_t len;
    unsigned char *buf = slurp(saved, &len);
    size_t ends[200];
    size_t n = read_records(buf, len, ends);
    assert_true(n >= 2);
    assert_int_equal(ends[n - 1], len); /* nothing torn at the end */
    assert_true(len <= 1000);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc_known),
        cmocka_unit_test(test_record_vector),
        cmocka_unit_test_setup_teardown(test_write_read_back, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_rotation, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_unusable_dir, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_write_fails, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
