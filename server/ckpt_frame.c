/* The framing of a checkpoint file (ckpt_frame.h): the buffered, checksummed writer and
 * reader of records, and a header's CRC. */
#include "ckpt_frame.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "log.h"
#include "util.h"

/* Large arrays are checksummed and written in pieces of this size (cache-sized). */
#define PUT_PIECE ((size_t)1 << 20)
/* Write-back of the file is started every this many bytes (sync_file_range). */
#define WRITE_BEHIND ((uint64_t)32 << 20)

static int w_raw(ckpt_writer *w, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        size_t k = n < CKPT_IO_CHUNK ? n : CKPT_IO_CHUNK;
        if (w->crash_at && w->crash_at - w->written < k)
            k = (size_t)(w->crash_at - w->written); /* stop at the failpoint's byte */
        ssize_t r = write(w->fd, b, k);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            w->failed = 1;
            return errf(w->err, w->errlen, "writing %s: %s", w->path, strerror(errno));
        }
        b += r;
        n -= (size_t)r;
        w->written += (uint64_t)r;
        if (w->written - w->started >= WRITE_BEHIND) {
            /* Start the disk on what is written so far, so that it works while the rest is
             * checksummed and copied and the final fsync has little left to wait for. */
            (void)sync_file_range(w->fd, (off_t)w->started, (off_t)(w->written - w->started),
                                  SYNC_FILE_RANGE_WRITE);
            w->started = w->written;
        }
        if (w->crash_at && w->written >= w->crash_at) {
            /* Failpoint checkpoint-crash-mid-write (tests only, see test-failpoint): die as a
             * crash would, with the temporary file half written. */
            log_error("failpoint checkpoint-crash-mid-write: exiting after %" PRIu64 " bytes of %s",
                      w->written, w->path);
            _exit(1);
        }
    }
    return 0;
}

int ckw_flush(ckpt_writer *w)
{
    if (w->failed)
        return -1;
    int rc = w->used ? w_raw(w, w->buf, w->used) : 0;
    w->used = 0;
    return rc;
}

/* Appends bytes (CRC'd) to the file. */
int ckw_put(ckpt_writer *w, const void *p, size_t n)
{
    if (w->failed)
        return -1;
    const uint8_t *b = p;
    if (n >= CKPT_WBUF_SIZE / 2) {
        /* Large arrays: checksum and write piece by piece, so each piece is still in the cache
         * when it is written. */
        if (ckw_flush(w) != 0)
            return -1;
        for (size_t left = n; left > 0;) {
            size_t k = left < PUT_PIECE ? left : PUT_PIECE;
            w->crc = crc32(w->crc, b, (uInt)k);
            if (w_raw(w, b, k) != 0)
                return -1;
            b += k;
            left -= k;
        }
        return 0;
    }
    w->crc = crc32(w->crc, b, (uInt)n);
    if (w->used + n > CKPT_WBUF_SIZE && ckw_flush(w) != 0)
        return -1;
    memcpy(w->buf + w->used, p, n);
    w->used += n;
    return 0;
}

int ckw_u32(ckpt_writer *w, uint32_t x)
{
    return ckw_put(w, &x, 4);
}
int ckw_u64(ckpt_writer *w, uint64_t x)
{
    return ckw_put(w, &x, 8);
}

int ckw_rec_begin_flags(ckpt_writer *w, uint32_t type, uint32_t flags, uint64_t len)
{
    w->crc = crc32(0L, Z_NULL, 0);
    if (ckw_u32(w, type) || ckw_u32(w, flags) || ckw_u64(w, len))
        return -1;
    return 0;
}

int ckw_rec_begin(ckpt_writer *w, uint32_t type, uint64_t len)
{
    w->crc = crc32(0L, Z_NULL, 0);
    if (ckw_u32(w, type) || ckw_u32(w, 0) || ckw_u64(w, len))
        return -1;
    return 0;
}

int ckw_rec_end(ckpt_writer *w)
{
    uint32_t c = (uint32_t)w->crc;
    return ckw_put(w, &c, 4);
}

int ckr_get(ckpt_reader *r, void *p, size_t n, const char *what)
{
    uint8_t *b = p;
    size_t left = n;
    while (left > 0) {
        size_t k = left < CKPT_IO_CHUNK ? left : CKPT_IO_CHUNK;
        size_t got = fread(b, 1, k, r->f);
        r->crc = crc32(r->crc, b, (uInt)got);
        r->pos += got;
        if (got < k) {
            if (ferror(r->f))
                return errf(r->err, r->errlen, "read error at byte %" PRIu64 " (%s): %s", r->pos,
                            what, strerror(errno));
            return errf(r->err, r->errlen, "truncated: file ends at byte %" PRIu64 " inside %s",
                        r->pos, what);
        }
        b += got;
        left -= got;
    }
    return 0;
}

int ckr_u32(ckpt_reader *r, uint32_t *x, const char *what)
{
    return ckr_get(r, x, 4, what);
}
int ckr_u64(ckpt_reader *r, uint64_t *x, const char *what)
{
    return ckr_get(r, x, 8, what);
}

int ckr_rec_end(ckpt_reader *r, uint32_t type)
{
    uint32_t want = (uint32_t)r->crc, got;
    if (ckr_get(r, &got, 4, "a record's CRC"))
        return -1;
    if (got != want)
        return errf(r->err, r->errlen,
                    "bad CRC of record type %u ending at byte %" PRIu64
                    " (stored %08x, computed %08x)",
                    type, r->pos, got, want);
    return 0;
}

void ckr_rec_begin(ckpt_reader *r)
{
    r->crc = crc32(0L, Z_NULL, 0);
}

uint32_t ckpt_header_crc(const uint8_t *hdr)
{
    return (uint32_t)crc32(0L, hdr, 60);
}

int ckpt_peek_prev(const char *path, uint64_t *prev, char *err, size_t errlen)
{
    uint8_t hdr[CKPT_HEADER_SIZE];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return errf(err, errlen, "cannot open: %s", strerror(errno));
    size_t got = fread(hdr, 1, sizeof(hdr), f);
    fclose(f);
    uint32_t hcrc;
    memcpy(&hcrc, hdr + 60, 4);
    if (got != sizeof(hdr) || memcmp(hdr, CKPT_MAGIC, 8) != 0 || hcrc != ckpt_header_crc(hdr))
        return errf(err, errlen, "bad or truncated header");
    memcpy(prev, hdr + 48, 8);
    return 0;
}
