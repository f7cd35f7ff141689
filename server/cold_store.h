/* The on-disk store behind a table's cold tier (table.h, ram_rows): an ordered map of byte
 * keys to byte values in one directory, read in batches (cold_store_multiget), written in
 * batches (cold_batch), walked in key order (cold_iter) from a point-in-time view
 * (cold_snapshot). Nothing is durable across a crash: the write-ahead log is off (checkpoints
 * give durability), and a store is emptied when it is opened.
 *
 * The store is RocksDB (its C API) when the server is built with it (PSD_HAVE_ROCKSDB); without
 * it cold_store_available() is false and cold_store_open fails with a message saying so. The
 * interface is small so that a store of our own could replace it.
 *
 * Thread safety: every call may be made from any number of threads at once on one store, except
 * cold_store_close; a batch, an iterator and a snapshot belong to one thread at a time. */
#ifndef SERVER_COLD_STORE_H
#define SERVER_COLD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cold_store cold_store;
typedef struct cold_batch cold_batch;
typedef struct cold_iter cold_iter;
typedef struct cold_snapshot cold_snapshot;

/* Whether this build has a store (RocksDB). */
bool cold_store_available(void);

/* Opens a store in directory dir (made when missing; its parent must exist), empty: whatever it
 * held is dropped. Returns NULL with a message in err on failure. */
cold_store *cold_store_open(const char *dir, char *err, size_t errlen);

/* Writes a copy of the store as it is now into directory dir (which must not exist, on the
 * same filesystem for the cheap form): its writes in memory flushed to a file first, then its
 * files, which never change once written, hard-linked (RocksDB's checkpoint), so that a
 * second checkpoint after a small change costs about the change, not the store. Returns 0,
 * or -1 with a message. */
int cold_store_checkpoint(cold_store *s, const char *dir, char *err, size_t errlen);

/* Opens a store in the new directory dir with the contents of the checkpoint from
 * (cold_store_checkpoint), which stays unchanged (its table files hard-linked, the rest
 * copied), then reads every block once with its checksum checked. Returns NULL with a message
 * (naming from, and the damaged file where RocksDB names it) when from is missing or
 * damaged; dir is then removed. */
cold_store *cold_store_open_from(const char *dir, const char *from, char *err, size_t errlen);

/* A fresh store directory's path under parent in buf: parent/label.<pid>.<n> (n counts the
 * process's calls), so that stores of processes sharing parent never meet. */
void cold_store_dir_name(char *buf, size_t cap, const char *parent, const char *label);

/* Removes what processes no longer running (a SIGKILL, a crash) left under parent: the
 * directories named by cold_store_dir_name whose pid is not alive on this machine (parent must
 * be local to it). Returns the number removed. */
int cold_store_remove_stale(const char *parent);

/* Removes a store's directory that no open store uses (a checkpoint's, cold_store_checkpoint)
 * with its files (a store's directory holds files only). Returns 0, or -1 (errno set). */
int cold_store_remove_dir(const char *dir);

/* Closes the store; remove: also deletes its directory and files. NULL is a no-op. */
void cold_store_close(cold_store *s, bool remove);

/* Looks up n keys (keys + i * klen, klen bytes each) at once, in one read of the store. Values
 * are of vlen bytes each: found[i] says whether key i is there, its value then in
 * vals[i * vlen .. (i + 1) * vlen). Returns 0, or -1 with a message in err on a read error or a
 * value not of vlen bytes. */
int cold_store_multiget(cold_store *s, size_t n, const unsigned char *keys, size_t klen,
                        unsigned char *vals, size_t vlen, bool *found, char *err, size_t errlen);

/* A batch of writes, applied at once and in order by cold_store_write. */
cold_batch *cold_batch_new(void);
void cold_batch_put(cold_batch *b, const void *key, size_t klen, const void *val, size_t vlen);
void cold_batch_delete(cold_batch *b, const void *key, size_t klen);
/* Writes in the batch so far. */
size_t cold_batch_count(const cold_batch *b);
void cold_batch_clear(cold_batch *b);
void cold_batch_free(cold_batch *b);
/* Applies b's writes (then clears it). Returns 0, or -1 with a message in err. */
int cold_store_write(cold_store *s, cold_batch *b, char *err, size_t errlen);

/* A view of the store as it is now, for iterators (cheap: no copy). */
cold_snapshot *cold_store_snapshot(cold_store *s);
void cold_snapshot_release(cold_store *s, cold_snapshot *snap);

/* Walks the keys in [lo, hi) (byte order; lo NULL: from the first; hi NULL: to the last) of
 * the store now, or of snap when not NULL. cold_iter_next moves to the next key and says
 * whether there is one; key and value stay valid until the next call. */
cold_iter *cold_iter_new(cold_store *s, cold_snapshot *snap, const void *lo, size_t lolen,
                         const void *hi, size_t hilen);
bool cold_iter_next(cold_iter *it, const unsigned char **key, size_t *klen,
                    const unsigned char **val, size_t *vlen);
void cold_iter_free(cold_iter *it);

/* Bytes the store's files take on disk now (an estimate: RocksDB's live data size). */
uint64_t cold_store_disk_bytes(cold_store *s);

/* The store's directory. */
const char *cold_store_dir(const cold_store *s);

/* Bytes free to an unprivileged writer on the filesystem of the store's directory (statvfs) in
 * *free_bytes. Returns 0, or -1 when it cannot be read. */
int cold_store_free_bytes(const cold_store *s, uint64_t *free_bytes);

/* Bytes a store needs free on its disk to go on writing safely: its writes wait in memory and
 * reach the disk a buffer at a time, and merging the first files of the store writes about as
 * much again before it frees the old ones. Below it, the store's user stops writing (a
 * RocksDB that runs out of space mid-write stops taking writes at all). */
uint64_t cold_store_headroom(void);

#endif /* SERVER_COLD_STORE_H */
