/* data_idx.c - IDX (MNIST format) reader, plain or gzip through zlib.
 *
 * IDX: two zero bytes, a type byte (0x08 = unsigned byte), a rank byte, then
 * `rank` big-endian uint32 dimensions, then the data. zlib's gzread reads
 * plain files transparently, so one path handles both encodings. The data is
 * read in growing chunks rather than allocated from the header's claim, so a
 * small file with a lying header is reported as truncated, not as an
 * allocation of the size it claims. */
#include "data.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "util.h"

/* Reads up to len bytes; returns the count read (short only at end of file),
 * or -1 with a message on a read or decompression error. */
static long long gz_read_full(gzFile f, const char *path, void *buf, size_t len, char *err,
                              size_t errlen)
{
    size_t done = 0;
    while (done < len) {
        size_t want = len - done;
        if (want > (1u << 30))
            want = 1u << 30;
        int r = gzread(f, (char *)buf + done, (unsigned)want);
        if (r < 0) {
            int zerr = 0;
            const char *msg = gzerror(f, &zerr);
            return errf(err, errlen, "%s: corrupt or unreadable gzip data: %s", path,
                        zerr == Z_ERRNO ? strerror(errno) : msg);
        }
        if (r == 0) {
            /* zlib reports a gzip stream cut short as end of file plus an error. */
            int zerr = 0;
            const char *msg = gzerror(f, &zerr);
            if (zerr != Z_OK && zerr != Z_STREAM_END)
                return errf(err, errlen, "%s: corrupt gzip data: %s", path, msg);
            break;
        }
        done += (size_t)r;
    }
    return (long long)done;
}

typedef struct idx_file {
    int rank;
    uint32_t dims[4];
    uint64_t count; /* product of dims */
    uint8_t *data;
} idx_file;

static int idx_read(const char *path, int min_rank, int max_rank, idx_file *out, char *err,
                    size_t errlen)
{
    memset(out, 0, sizeof(*out));
    struct stat st;
    if (stat(path, &st) != 0)
        return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode))
        return errf(err, errlen, "%s: is a directory, expected an IDX file", path);
    gzFile f = gzopen(path, "rb");
    if (f == NULL)
        return errf(err, errlen, "%s: cannot open: %s", path,
                    errno != 0 ? strerror(errno) : "out of memory");
    gzbuffer(f, 1 << 17);
    int rc = -1;
    uint8_t hdr[4];
    long long got = gz_read_full(f, path, hdr, sizeof(hdr), err, errlen);
    if (got < 0)
        goto out;
    if (got == 0) {
        errf(err, errlen, "%s: empty file, expected an IDX header", path);
        goto out;
    }
    if (got < 4) {
        errf(err, errlen, "%s: truncated: %lld bytes, shorter than the 4-byte IDX magic", path,
             got);
        goto out;
    }
    if (hdr[0] != 0 || hdr[1] != 0) {
        errf(err, errlen,
             "%s: not an IDX file: bad magic %02x %02x %02x %02x (expected 00 00 08 <rank>)", path,
             hdr[0], hdr[1], hdr[2], hdr[3]);
        goto out;
    }
    if (hdr[2] != 0x08) {
        errf(err, errlen,
             "%s: IDX element type 0x%02x is not supported (expected 0x08, unsigned byte)", path,
             hdr[2]);
        goto out;
    }
    out->rank = hdr[3];
    if (out->rank < min_rank || out->rank > max_rank) {
        if (min_rank == max_rank)
            errf(err, errlen, "%s: IDX rank %d, expected %d", path, out->rank, min_rank);
        else
            errf(err, errlen, "%s: IDX rank %d, expected %d to %d", path, out->rank, min_rank,
                 max_rank);
        goto out;
    }
    uint8_t dimbuf[16];
    size_t dimlen = (size_t)out->rank * 4;
    got = gz_read_full(f, path, dimbuf, dimlen, err, errlen);
    if (got < 0)
        goto out;
    if ((size_t)got < dimlen) {
        errf(err, errlen, "%s: truncated header: %d dimensions need %zu bytes, got %lld", path,
             out->rank, dimlen, got);
        goto out;
    }
    out->count = 1;
    for (int i = 0; i < out->rank; i++) {
        const uint8_t *p = dimbuf + 4 * i;
        out->dims[i] = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
        if (out->dims[i] == 0) {
            errf(err, errlen, "%s: dimension %d is zero", path, i);
            goto out;
        }
        out->count *= out->dims[i]; /* at most 3 factors below 2^32 each: checked below */
        if (out->count > DATA_MAX_BYTES) {
            errf(err, errlen,
                 "%s: header claims more than %llu bytes of data: corrupt or too large", path,
                 (unsigned long long)DATA_MAX_BYTES);
            goto out;
        }
    }
    /* Grow the buffer as data arrives (see the file comment). */
    size_t cap = 0, have = 0;
    size_t want = (size_t)out->count;
    while (have < want) {
        size_t next = cap == 0 ? ((size_t)1 << 20) : cap * 2;
        if (next > want)
            next = want;
        uint8_t *nb = realloc(out->data, next);
        if (nb == NULL) {
            errf(err, errlen, "%s: out of memory reading %zu bytes", path, want);
            goto out;
        }
        out->data = nb;
        cap = next;
        got = gz_read_full(f, path, out->data + have, cap - have, err, errlen);
        if (got < 0)
            goto out;
        have += (size_t)got;
        if (have < cap)
            break;
    }
    if (have < want) {
        errf(err, errlen, "%s: truncated: header promises %zu data bytes, file has %zu", path, want,
             have);
        goto out;
    }
    uint8_t extra;
    got = gz_read_full(f, path, &extra, 1, err, errlen);
    if (got < 0)
        goto out;
    if (got > 0) {
        errf(err, errlen, "%s: trailing bytes after the %zu data bytes the header promises", path,
             want);
        goto out;
    }
    rc = 0;
out:
    gzclose_r(f);
    if (rc != 0) {
        free(out->data);
        out->data = NULL;
    }
    return rc;
}

int data_load_idx(const char *images_path, const char *labels_path, dataset *out, char *err,
                  size_t errlen)
{
    memset(out, 0, sizeof(*out));
    idx_file img, lab;
    if (idx_read(images_path, 2, 3, &img, err, errlen) != 0)
        return -1;
    if (idx_read(labels_path, 1, 1, &lab, err, errlen) != 0) {
        free(img.data);
        return -1;
    }
    int rc = -1;
    if (img.dims[0] != lab.dims[0]) {
        errf(err, errlen, "%s has %u images but %s has %u labels", images_path, img.dims[0],
             labels_path, lab.dims[0]);
        goto out;
    }
    size_t n = img.dims[0];
    size_t dim = (size_t)(img.count / n);
    out->x = malloc(n * dim * sizeof(float));
    out->y = malloc(n * sizeof(int32_t));
    if (out->x == NULL || out->y == NULL) {
        errf(err, errlen, "%s: out of memory for %zu x %zu floats", images_path, n, dim);
        goto out;
    }
    int maxlab = 0;
    for (size_t i = 0; i < n; i++) {
        out->y[i] = lab.data[i];
        if (lab.data[i] > maxlab)
            maxlab = lab.data[i];
    }
    const float inv = 1.0f / 255.0f;
    for (size_t i = 0; i < n * dim; i++)
        out->x[i] = (float)img.data[i] * inv;
    out->n = n;
    out->dim = dim;
    out->num_classes = maxlab + 1;
    rc = 0;
out:
    free(img.data);
    free(lab.data);
    if (rc != 0)
        dataset_free(out);
    return rc;
}

static bool file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Picks "<dir>/<split>-<kind>" or the same with ".gz"; the plain name if neither exists, so
 * that the error names it. Returns -1 if the path does not fit in cap. */
static int pick(char *dst, size_t cap, const char *dir, const char *split, const char *kind)
{
    int n = snprintf(dst, cap, "%s/%s-%s", dir, split, kind);
    if (n < 0 || (size_t)n + 4 > cap)
        return -1;
    if (file_exists(dst))
        return 0;
    memcpy(dst + n, ".gz", 4);
    if (!file_exists(dst))
        dst[n] = '\0';
    return 0;
}

int data_load_idx_dir(const char *dir, const char *split, dataset *out, char *err, size_t errlen)
{
    char img[4096], lab[4096];
    struct stat st;
    if (stat(dir, &st) != 0)
        return errf(err, errlen, "data directory %s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return errf(err, errlen, "data directory %s: not a directory", dir);
    if (pick(img, sizeof(img), dir, split, "images-idx3-ubyte") != 0 ||
        pick(lab, sizeof(lab), dir, split, "labels-idx1-ubyte") != 0)
        return errf(err, errlen, "data directory %s: path too long", dir);
    if (!file_exists(img))
        return errf(err, errlen, "%s (or .gz): missing: no %s images in data directory %s", img,
                    split, dir);
    if (!file_exists(lab))
        return errf(err, errlen, "%s (or .gz): missing: no %s labels in data directory %s", lab,
                    split, dir);
    return data_load_idx(img, lab, out, err, errlen);
}
