/* What a checkpoint directory says about the servers that used it: a lock, so that one server
 * of a task at a time writes there, and a record of the newest checkpoint the last one wrote
 * and how it stopped, so that a restart can tell exactly what its restore lost.
 *
 * Files, per task, beside the checkpoints:
 *   .lock-<task>   held with flock(LOCK_EX) for the server's life; holds its pid (text)
 *   .state-<task>  one text line, replaced atomically (write, fsync, rename):
 *                    "running pid=<pid> checkpoint=<seq> versions=<sum>" while it serves;
 *                    "clean pid=<pid> checkpoint=<seq> versions=<sum>" after the final
 *                    checkpoint of a clean shutdown.
 *                  <seq> is the newest checkpoint durable at that moment (0: none), <sum> the
 *                  sum of its variables' versions (updates applied, per shard).
 * A `.running-<task>` marker of an older release counts as "running" with nothing known. */
#ifndef PSD_SERVER_CHECKPOINT_STATE_H
#define PSD_SERVER_CHECKPOINT_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Creates dir (and its parents) if missing and takes task's lock in it. Returns the lock's
 * file descriptor (>= 0, close-on-exec; keep it open while serving), or -1 with a message in
 * err: a directory that cannot be made or written (e.g. below a regular file), or a lock
 * held by another process (the message names its pid). Both are configuration errors. */
int ckpt_dir_lock(const char *dir, uint32_t task, char *err, size_t errlen);

/* Releases a lock taken by ckpt_dir_lock (closes fd). A negative fd is a no-op. */
void ckpt_dir_unlock(int fd);

typedef enum ckpt_stop { CKPT_STOP_UNKNOWN = 0, CKPT_STOP_RUNNING, CKPT_STOP_CLEAN } ckpt_stop;

typedef struct ckpt_record {
    ckpt_stop state; /* UNKNOWN: no record (first start, or a directory of an older release) */
    bool legacy;     /* no record, but an older release's .running marker: it crashed */
    long pid;
    uint64_t seq;      /* newest checkpoint durable when written (0: none) */
    uint64_t versions; /* sum of its variables' versions */
} ckpt_record;

/* Reads task's record in dir into *out (state UNKNOWN when there is none or it does not
 * parse; a line that does not parse is logged). */
void ckpt_record_read(const char *dir, uint32_t task, ckpt_record *out);

/* Replaces task's record. Returns 0, or -1 with a message in err. */
int ckpt_record_write(const char *dir, uint32_t task, const ckpt_record *r, char *err,
                      size_t errlen);

/* What a restart lost, from the previous server's record `last` and what was restored:
 * restored says whether a checkpoint was (seq, versions: its number and version sum), else
 * the server starts empty. Writes the sentence for the log into msg and returns true when
 * updates are (or may be) lost, false when nothing was. */
bool ckpt_restore_verdict(const ckpt_record *last, uint32_t task, bool restored, uint64_t seq,
                          uint64_t versions, char *msg, size_t cap);

#endif
