/* events.h - TensorBoard event files: the writer of one run directory.
 *
 * A file is a sequence of TFRecords (little-endian uint64 length, masked CRC-32C of those 8
 * bytes, the data, masked CRC-32C of the data) whose data are Event messages
 * (proto/events.proto): the first says file_version "brain.Event:2", the others carry a
 * Summary of scalars (simple_value) or a histogram at a step. Files are named
 * events.out.tfevents.<10-digit seconds>.<host>.<pid>.<n>, the names TensorBoard looks for,
 * and a new one is started when one reaches the size limit.
 *
 * Records are collected in memory and written with one write(2) of whole records at most
 * every flush_ms (checked at each record), when the buffer is full, and at close: a reader of
 * the growing file never sees a torn record. A write that fails (a full disk) logs one error,
 * truncates the file back to its last whole record and stops the writer: later calls do
 * nothing and return -1, and the program goes on.
 *
 * One writer is used by one thread at a time. */
#ifndef PSD_COMMON_EVENTS_H
#define PSD_COMMON_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct event_writer event_writer;

typedef struct event_writer_options {
    uint64_t rotate_bytes; /* start a new file beyond this size; 0: 64 MiB */
    uint32_t flush_ms;     /* longest time a record waits in memory; 0: 2000 */
} event_writer_options;

/* One scalar of a Summary. */
typedef struct event_scalar {
    const char *tag;
    double value; /* written as a float (simple_value) */
} event_scalar;

/* Creates dir (and its parents) when missing and the first event file in it, and writes and
 * flushes its file_version record. opts may be NULL (the defaults). Returns 0, or -1 with a
 * message in err ("cannot create DIR: Permission denied"). */
int event_writer_open(event_writer **out, const char *dir, const event_writer_options *opts,
                      char *err, size_t errlen);

/* Writes and closes the file; NULL is a no-op. */
void event_writer_close(event_writer *w);

/* One Event at step with the n scalars v; wall_time in seconds since the epoch, or 0 for now.
 * Returns 0, or -1 once the writer has stopped (or out of memory). */
int event_writer_scalars(event_writer *w, int64_t step, double wall_time, const event_scalar *v,
                         size_t n);

/* One Event at step with the histogram of values[0..n) under tag, in TensorFlow's default
 * buckets (limits +-1e-12 * 1.1^k up to 1e20, and 0), runs of empty buckets merged. */
int event_writer_histogram(event_writer *w, int64_t step, double wall_time, const char *tag,
                           const float *values, size_t n);

/* Writes what is in memory now. Returns 0 or -1 (stopped). */
int event_writer_flush(event_writer *w);

/* True once a write failed and the writer stopped. */
bool event_writer_failed(const event_writer *w);

/* The path of the file being written (for messages and tests). */
const char *event_writer_path(const event_writer *w);

/* Creates dir and its missing parents (mkdir -p) and checks that files can be made in it.
 * Returns 0, or -1 with a message in err ("cannot create DIR: Permission denied"). */
int event_dir_make(const char *dir, char *err, size_t errlen);

/* The TFRecord framing of data[0..len) into out, which holds len + 16 bytes. Returns len + 16. */
size_t event_record_frame(unsigned char *out, const void *data, size_t len);

#endif /* PSD_COMMON_EVENTS_H */
