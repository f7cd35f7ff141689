/* A checkpoint directory: its checkpoint files (listed newest first, pruned by whole chains,
 * the directory made and fsynced), and what it says about the servers that used it: a lock,
 * so that one server of a task at a time writes there, and a record of the newest checkpoint
 * the last one wrote and how it stopped, so that a restart can tell exactly what its restore
 * lost.
 *
 * Files, per task:
 *   ckpt-<task>-<seq>.psc          a checkpoint (ckpt_format.h)
 *   .ckpt-<task>-<seq>.psc.tmp     one being written (removed at the next start)
 *   .lock-<task>   held with flock(LOCK_EX) for the server's life; holds its pid (text)
 *   .state-<task>  one text line, replaced atomically (write, fsync, rename):
 *                    "running pid=<pid> checkpoint=<seq> versions=<sum>" while it serves;
 *                    "clean pid=<pid> checkpoint=<seq> versions=<sum>" after the final
 *                    checkpoint of a clean shutdown.
 *                  <seq> is the newest checkpoint durable at that moment (0: none), <sum> the
 *                  sum of its variables' versions (updates applied, per shard).
 * A `.running-<task>` marker of an older release counts as "running" with nothing known. */
#ifndef PSD_SERVER_CKPT_DIR_H
#define PSD_SERVER_CKPT_DIR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Makes dir and its parents if missing and checks it is a writable directory. Returns 0, or
 * -1 with a message (a configuration error: e.g. a path below a regular file). */
int checkpoint_mkdir(const char *dir, char *err, size_t errlen);

/* fsyncs directory dir (after a rename in it). Returns 0, or -1 with a message. */
int ckpt_fsync_dir(const char *dir, char *err, size_t errlen);

/* A checkpoint file of the directory: its task, sequence number and name (no directory). */
typedef struct ckpt_file {
    uint64_t seq;
    uint32_t task;
    char name[64];
} ckpt_file;

/* Checkpoint files of task in dir, newest first (CKPT_ALL_TASKS: of every task, by sequence
 * number). With remove_tmp, deletes the task's leftover temporary files. Returns the
 * count (*out malloc'd), or -1 with a message. */
#define CKPT_ALL_TASKS UINT32_MAX
long ckpt_dir_list(const char *dir, uint32_t task, bool remove_tmp, ckpt_file **out, char *err,
                   size_t errlen);

/* A checkpoint's copies of cold stores (its tables' linked cuts, table.h table_cut_link): the
 * directory dir/ckpt-<task>-<seq>.cold, one store directory in it per table (named by the
 * table's index in the file), which the file's records name relative to dir. ckpt_cold_path:
 * its path in buf. ckpt_cold_remove: deletes it and what it holds; 0 (also when missing) or
 * -1 (errno set). */
void ckpt_cold_path(char *buf, size_t cap, const char *dir, uint32_t task, uint64_t seq);
int ckpt_cold_remove(const char *path);

/* Deletes task's old checkpoints in dir: the newest `keep` files are restore points, and each
 * keeps its whole chain (a delta needs every file back to its full checkpoint); a file for
 * which keep_file(path, arg) is true (when not NULL) is left alone and not counted. Then the
 * copies of cold stores of task whose file is gone (ckpt_cold_path). Failures are logged. */
void ckpt_dir_prune(const char *dir, uint32_t task, int keep,
                    bool (*keep_file)(const char *path, void *arg), void *arg);

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
 * updates are (or may be) lost, false when nothing was. replicated (replicas > 1): the
 * checkpoint is one copy of the server's own group among others, and its groups come back
 * from the newest copy in the view (a rejoin copies them from their primaries): what the
 * checkpoint lacks is not said to be lost (false), the sentence says where the state comes
 * from instead. */
bool ckpt_restore_verdict(const ckpt_record *last, uint32_t task, bool restored, uint64_t seq,
                          uint64_t versions, bool replicated, char *msg, size_t cap);

#endif
