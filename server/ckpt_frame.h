/* The framing of a checkpoint file: its 64-byte header's fixed part, and records written and
 * read as u32 type, u32 flags, u64 payload length, payload, u32 CRC-32 of all four. The
 * writer buffers, checksums and starts write-back as it goes; the reader checksums what it
 * reads and names what it was reading when the file ends or fails. What the header's fields
 * and the records mean is ckpt_format.h's. */
#ifndef PSD_SERVER_CKPT_FRAME_H
#define PSD_SERVER_CKPT_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CKPT_MAGIC "PSDCKPT"
#define CKPT_FORMAT_VERSION 2u     /* written for full checkpoints */
#define CKPT_FORMAT_DELTA 3u       /* written for deltas (header names the previous file) */
#define CKPT_FORMAT_VERSION_MIN 1u /* oldest read: no dedup tombstone record, no INITIAL flag */
#define CKPT_HEADER_SIZE 64u

/* Reads and writes move at most this many bytes per system call. */
#define CKPT_IO_CHUNK ((size_t)64 << 20)
/* The writer's buffer. */
#define CKPT_WBUF_SIZE (1u << 20)

/* A file being written. Set fd, path, buf (CKPT_WBUF_SIZE bytes), err and errlen (and
 * crash_at for the failpoint); the rest starts zeroed. A failure is sticky: every call after
 * it returns -1, err holding the first. */
typedef struct ckpt_writer {
    int fd;
    const char *path;
    uint8_t *buf;
    size_t used;
    uint64_t written;  /* bytes handed to write() */
    uint64_t started;  /* bytes whose write-back has been started (sync_file_range) */
    uint64_t crash_at; /* failpoint: _exit(1) once this many are written (0: never) */
    unsigned long crc; /* of the record being written */
    char *err;
    size_t errlen;
    int failed;
} ckpt_writer;

/* Appends n bytes (checksummed into the record's CRC). Returns 0 or -1. */
int ckw_put(ckpt_writer *w, const void *p, size_t n);
int ckw_u32(ckpt_writer *w, uint32_t x);
int ckw_u64(ckpt_writer *w, uint64_t x);
/* Starts a record (its CRC starts here) of type with flags and a payload of len bytes. */
int ckw_rec_begin_flags(ckpt_writer *w, uint32_t type, uint32_t flags, uint64_t len);
int ckw_rec_begin(ckpt_writer *w, uint32_t type, uint64_t len);
/* Ends a record: its CRC. */
int ckw_rec_end(ckpt_writer *w);
/* Writes what is buffered. Returns 0 or -1. */
int ckw_flush(ckpt_writer *w);

/* A file being read. Set f, path, err and errlen; the rest starts zeroed. */
typedef struct ckpt_reader {
    FILE *f;
    const char *path;
    unsigned long crc; /* of the record being read (the caller starts it) */
    uint64_t pos;      /* bytes read */
    char *err;
    size_t errlen;
} ckpt_reader;

/* Reads n bytes (checksummed); what names the part being read, for the message of a short
 * read. Returns 0 or -1 with a message. */
int ckr_get(ckpt_reader *r, void *p, size_t n, const char *what);
int ckr_u32(ckpt_reader *r, uint32_t *x, const char *what);
int ckr_u64(ckpt_reader *r, uint64_t *x, const char *what);
/* Reads a record's CRC and compares it with what was read since it began. Returns 0 or -1. */
int ckr_rec_end(ckpt_reader *r, uint32_t type);
/* Starts the CRC of a record about to be read. */
void ckr_rec_begin(ckpt_reader *r);

/* The CRC-32 of a header's first 60 bytes, stored in its last 4. */
uint32_t ckpt_header_crc(const uint8_t *hdr);

/* The previous file a checkpoint's header names (0: a full checkpoint). Returns 0, or -1 with
 * a message when the header can't be read or is damaged. */
int ckpt_peek_prev(const char *path, uint64_t *prev, char *err, size_t errlen);

#endif
