/* The on-disk store of a table's cold tier (cold_store.h) over RocksDB's C API: write-ahead log
 * off, no compression, bloom filters (10 bits a key) so that a lookup of an id that is not on
 * disk seldom reads a block, and a small block cache and memtable (the store's memory is not
 * the table's budget). Without RocksDB (PSD_HAVE_ROCKSDB undefined) every open fails. */
#include "cold_store.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <unistd.h>

void cold_store_dir_name(char *buf, size_t cap, const char *parent, const char *label)
{
    static _Atomic unsigned seq;
    snprintf(buf, cap, "%s/%s.%ld.%u", parent, label, (long)getpid(), atomic_fetch_add(&seq, 1));
}

/* The pid of a name cold_store_dir_name made (label.<pid>.<n>), or 0. */
static long name_pid(const char *name)
{
    const char *last = strrchr(name, '.');
    if (last == NULL || last == name || last[1] == '\0')
        return 0;
    const char *p = last - 1;
    while (p > name && *p != '.')
        p--;
    if (*p != '.')
        return 0;
    char *end;
    long pid = strtol(p + 1, &end, 10);
    return end == last && pid > 0 ? pid : 0;
}

/* Removes directory path and the files in it (a store's directory holds no other). Returns
 * rmdir's result. */
static int remove_flat_dir(const char *path)
{
    DIR *sub = opendir(path);
    if (sub == NULL)
        return -1;
    struct dirent *f;
    while ((f = readdir(sub)) != NULL) {
        if (strcmp(f->d_name, ".") == 0 || strcmp(f->d_name, "..") == 0)
            continue;
        char file[8192];
        snprintf(file, sizeof(file), "%s/%s", path, f->d_name);
        (void)unlink(file);
    }
    closedir(sub);
    return rmdir(path);
}

int cold_store_remove_dir(const char *dir)
{
    return remove_flat_dir(dir);
}

int cold_store_remove_stale(const char *parent)
{
    DIR *d = opendir(parent);
    if (d == NULL)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = name_pid(e->d_name);
        if (pid == 0 || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", parent, e->d_name);
        if (remove_flat_dir(path) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

#ifdef PSD_HAVE_ROCKSDB

#include <rocksdb/c.h>

#define COLD_WRITE_BUFFER (16u << 20)
#define COLD_BLOCK_CACHE (32u << 20)
#define COLD_BLOOM_BITS 10.0
/* The memtables' bloom filters: this share of the write buffer (about 10 bits a key). */
#define COLD_MEMTABLE_BLOOM 0.02
/* Level-0 files merged at once (RocksDB's default trigger), each about a write buffer. */
#define COLD_L0_FILES 4u

struct cold_store {
    rocksdb_t *db;
    rocksdb_column_family_handle_t *cf; /* the default family (for batched reads) */
    rocksdb_options_t *opts;
    rocksdb_block_based_table_options_t *topts;
    rocksdb_cache_t *cache;
    rocksdb_readoptions_t *ropts;
    rocksdb_writeoptions_t *wopts;
    char *dir;
};

/* One write of a batch: its key (and value) at off in the batch's bytes. */
typedef struct cold_op {
    size_t off;
    uint32_t klen, vlen;
    uint32_t seq; /* its place in the batch: writes of one key stay in order */
    bool del;
    const unsigned char *key; /* set when the batch is written */
} cold_op;

/* Writes gathered in the caller's order, applied sorted by key (cold_store_write): a memtable
 * insert then starts its skip list search where the previous key's ended instead of at the
 * top, which for a partition's random ids is most of an insert's cost. */
struct cold_batch {
    unsigned char *bytes;
    size_t len, cap;
    cold_op *ops;
    size_t n, nops_cap;
    bool failed; /* memory ran out for a write: cold_store_write refuses the batch */
    rocksdb_writebatch_t *wb;
};

struct cold_iter {
    rocksdb_iterator_t *it;
    rocksdb_readoptions_t *ro;
    unsigned char *lo, *hi;
    size_t lolen, hilen;
    bool started;
};

struct cold_snapshot {
    const rocksdb_snapshot_t *snap;
};

bool cold_store_available(void)
{
    return true;
}

static void set_err(char *err, size_t errlen, const char *what, char *rerr)
{
    if (err != NULL && errlen > 0)
        snprintf(err, errlen, "%s: %s", what, rerr ? rerr : "unknown error");
    rocksdb_free(rerr);
}

/* Opens the store in dir; empty: whatever it held dropped first. */
static cold_store *store_open(const char *dir, bool empty, char *err, size_t errlen)
{
    cold_store *s = calloc(1, sizeof(*s));
    if (s == NULL || (s->dir = strdup(dir)) == NULL) {
        free(s);
        snprintf(err, errlen, "cold store %s: out of memory", dir);
        return NULL;
    }
    s->opts = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(s->opts, 1);
    rocksdb_options_set_compression(s->opts, rocksdb_no_compression);
    rocksdb_options_set_write_buffer_size(s->opts, COLD_WRITE_BUFFER);
    /* A bloom filter over each memtable's whole keys: most reads are of rows in the files,
     * and without it each one searches the memtables' skip lists first. */
    rocksdb_options_set_memtable_whole_key_filtering(s->opts, 1);
    rocksdb_options_set_memtable_prefix_bloom_size_ratio(s->opts, COLD_MEMTABLE_BLOOM);
    rocksdb_options_set_max_open_files(s->opts, 64); /* per table: descriptors add up */
    rocksdb_options_set_info_log_level(s->opts, 4);  /* FATAL: no LOG chatter */
    rocksdb_options_set_keep_log_file_num(s->opts, 1);
    s->topts = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_filter_policy(
        s->topts, rocksdb_filterpolicy_create_bloom(COLD_BLOOM_BITS));
    s->cache = rocksdb_cache_create_lru(COLD_BLOCK_CACHE);
    rocksdb_block_based_options_set_block_cache(s->topts, s->cache);
    rocksdb_options_set_block_based_table_factory(s->opts, s->topts);
    s->ropts = rocksdb_readoptions_create();
    s->wopts = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(s->wopts, 1);
    char *rerr = NULL;
    if (empty) {
        rocksdb_destroy_db(s->opts, dir, &rerr);
        rocksdb_free(rerr);
        rerr = NULL;
    }
    const char *cf_names[] = {"default"};
    const rocksdb_options_t *cf_opts[] = {s->opts};
    s->db = rocksdb_open_column_families(s->opts, dir, 1, cf_names, cf_opts, &s->cf, &rerr);
    if (s->db == NULL) {
        char what[512];
        snprintf(what, sizeof(what), "cold store %s: cannot open", dir);
        set_err(err, errlen, what, rerr);
        cold_store_close(s, false);
        return NULL;
    }
    return s;
}

cold_store *cold_store_open(const char *dir, char *err, size_t errlen)
{
    /* Empty: a table starts with no rows, whatever an earlier process left here. */
    return store_open(dir, true, err, errlen);
}

int cold_store_checkpoint(cold_store *s, const char *dir, char *err, size_t errlen)
{
    char *rerr = NULL, what[600];
    rocksdb_checkpoint_t *cp = rocksdb_checkpoint_object_create(s->db, &rerr);
    if (cp != NULL && rerr == NULL)
        rocksdb_checkpoint_create(cp, dir, 0, &rerr); /* 0: the memtable flushed first */
    if (cp != NULL)
        rocksdb_checkpoint_object_destroy(cp);
    if (rerr != NULL || cp == NULL) {
        snprintf(what, sizeof(what), "cold store %s: checkpoint into %s", s->dir, dir);
        set_err(err, errlen, what, rerr);
        return -1;
    }
    return 0;
}

/* Copies file src to dst (made). Returns 0 or -1 (errno set). */
static int copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb");
    if (in == NULL)
        return -1;
    FILE *out = fopen(dst, "wb");
    if (out == NULL) {
        fclose(in);
        return -1;
    }
    char buf[1 << 16];
    size_t n;
    int rc = 0;
    while (rc == 0 && (n = fread(buf, 1, sizeof(buf), in)) > 0)
        rc = fwrite(buf, 1, n, out) == n ? 0 : -1;
    rc = ferror(in) ? -1 : rc;
    fclose(in);
    return fclose(out) != 0 ? -1 : rc;
}

static bool ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && strcmp(s + a - b, tail) == 0;
}

cold_store *cold_store_open_from(const char *dir, const char *from, char *err, size_t errlen)
{
    if (mkdir(dir, 0755) != 0) {
        snprintf(err, errlen, "cold store %s: cannot make it: %s", dir, strerror(errno));
        return NULL;
    }
    DIR *d = opendir(from);
    if (d == NULL) {
        snprintf(err, errlen, "cold store checkpoint %s: %s", from, strerror(errno));
        (void)rmdir(dir);
        return NULL;
    }
    int rc = 0;
    struct dirent *e;
    char src[4096], dst[4096];
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(src, sizeof(src), "%s/%s", from, e->d_name);
        snprintf(dst, sizeof(dst), "%s/%s", dir, e->d_name);
        /* The table files never change: shared. The rest (the manifest, CURRENT, options)
         * the store rewrites: copied, so that the checkpoint stays as it was. */
        if (ends_with(e->d_name, ".sst") && link(src, dst) == 0)
            continue;
        if (copy_file(src, dst) != 0) {
            snprintf(err, errlen, "cold store checkpoint %s: cannot copy %s into %s: %s", from,
                     e->d_name, dir, strerror(errno));
            rc = -1;
        }
    }
    closedir(d);
    cold_store *s = rc == 0 ? store_open(dir, false, err, errlen) : NULL;
    if (s == NULL) {
        (void)remove_flat_dir(dir);
        return NULL;
    }
    /* Every block read once with its checksum checked (not kept in the cache): a damaged
     * file is found now, not by a later read of a row. */
    rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_verify_checksums(ro, 1);
    rocksdb_readoptions_set_fill_cache(ro, 0);
    rocksdb_iterator_t *it = rocksdb_create_iterator(s->db, ro);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it))
        ;
    char *rerr = NULL;
    rocksdb_iter_get_error(it, &rerr);
    rocksdb_iter_destroy(it);
    rocksdb_readoptions_destroy(ro);
    if (rerr != NULL) {
        char what[4200];
        snprintf(what, sizeof(what), "cold store checkpoint %s is damaged", from);
        set_err(err, errlen, what, rerr);
        cold_store_close(s, true);
        return NULL;
    }
    return s;
}

void cold_store_close(cold_store *s, bool remove)
{
    if (s == NULL)
        return;
    if (s->cf != NULL)
        rocksdb_column_family_handle_destroy(s->cf);
    if (s->db != NULL)
        rocksdb_close(s->db);
    if (remove && s->db != NULL) {
        char *rerr = NULL;
        rocksdb_destroy_db(s->opts, s->dir, &rerr);
        rocksdb_free(rerr);
        (void)rmdir(s->dir);
    }
    if (s->ropts)
        rocksdb_readoptions_destroy(s->ropts);
    if (s->wopts)
        rocksdb_writeoptions_destroy(s->wopts);
    if (s->opts)
        rocksdb_options_destroy(s->opts);
    if (s->topts)
        rocksdb_block_based_options_destroy(s->topts);
    if (s->cache)
        rocksdb_cache_destroy(s->cache);
    free(s->dir);
    free(s);
}

int cold_store_multiget(cold_store *s, size_t n, const unsigned char *keys, size_t klen,
                        unsigned char *vals, size_t vlen, bool *found, char *err, size_t errlen)
{
    if (n == 0)
        return 0;
    const char **kl = malloc(n * sizeof(*kl));
    size_t *ks = malloc(n * sizeof(*ks));
    rocksdb_pinnableslice_t **vl = calloc(n, sizeof(*vl));
    char **errs = calloc(n, sizeof(*errs));
    int rc = 0;
    if (kl == NULL || ks == NULL || vl == NULL || errs == NULL) {
        snprintf(err, errlen, "cold store %s: out of memory for %zu reads", s->dir, n);
        rc = -1;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        kl[i] = (const char *)keys + i * klen;
        ks[i] = klen;
    }
    /* Batched: one pass over the memtables and each file's blocks for all the keys. */
    rocksdb_batched_multi_get_cf(s->db, s->ropts, s->cf, n, kl, ks, vl, errs, false);
    for (size_t i = 0; i < n; i++) {
        size_t vs = 0;
        const char *v = vl[i] ? rocksdb_pinnableslice_value(vl[i], &vs) : NULL;
        found[i] = false;
        if (errs[i] != NULL) {
            if (rc == 0) {
                char what[512];
                snprintf(what, sizeof(what), "cold store %s: read", s->dir);
                set_err(err, errlen, what, errs[i]);
            } else {
                rocksdb_free(errs[i]);
            }
            errs[i] = NULL;
            rc = -1;
        } else if (v != NULL && vs != vlen) {
            if (rc == 0)
                snprintf(err, errlen, "cold store %s: a value of %zu bytes, not %zu", s->dir, vs,
                         vlen);
            rc = -1;
        } else if (v != NULL) {
            memcpy(vals + i * vlen, v, vlen);
            found[i] = true;
        }
        if (vl[i] != NULL)
            rocksdb_pinnableslice_destroy(vl[i]);
    }
out:
    free(kl);
    free(ks);
    free(vl);
    free(errs);
    return rc;
}

cold_batch *cold_batch_new(void)
{
    cold_batch *b = calloc(1, sizeof(*b));
    if (b != NULL && (b->wb = rocksdb_writebatch_create()) == NULL) {
        free(b);
        b = NULL;
    }
    return b;
}

static void batch_add(cold_batch *b, const void *key, size_t klen, const void *val, size_t vlen,
                      bool del)
{
    if (b->failed)
        return;
    if (b->n == b->nops_cap) {
        size_t cap = b->nops_cap ? 2 * b->nops_cap : 64;
        cold_op *ops = realloc(b->ops, cap * sizeof(*ops));
        if (ops == NULL) {
            b->failed = true;
            return;
        }
        b->ops = ops;
        b->nops_cap = cap;
    }
    if (b->len + klen + vlen > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->len + klen + vlen)
            cap *= 2;
        unsigned char *bytes = realloc(b->bytes, cap);
        if (bytes == NULL) {
            b->failed = true;
            return;
        }
        b->bytes = bytes;
        b->cap = cap;
    }
    memcpy(b->bytes + b->len, key, klen);
    if (vlen > 0)
        memcpy(b->bytes + b->len + klen, val, vlen);
    b->ops[b->n] = (cold_op){.off = b->len,
                             .klen = (uint32_t)klen,
                             .vlen = (uint32_t)vlen,
                             .seq = (uint32_t)b->n,
                             .del = del};
    b->n++;
    b->len += klen + vlen;
}

void cold_batch_put(cold_batch *b, const void *key, size_t klen, const void *val, size_t vlen)
{
    batch_add(b, key, klen, val, vlen, false);
}

void cold_batch_delete(cold_batch *b, const void *key, size_t klen)
{
    batch_add(b, key, klen, NULL, 0, true);
}

size_t cold_batch_count(const cold_batch *b)
{
    return b->n + (b->failed ? 1 : 0);
}

void cold_batch_clear(cold_batch *b)
{
    b->n = 0;
    b->len = 0;
    b->failed = false;
}

void cold_batch_free(cold_batch *b)
{
    if (b == NULL)
        return;
    rocksdb_writebatch_destroy(b->wb);
    free(b->bytes);
    free(b->ops);
    free(b);
}

/* Key order (bytes, then the shorter first), then the batch's order. */
static int op_cmp(const void *x, const void *y)
{
    const cold_op *a = x, *b = y;
    uint32_t m = a->klen < b->klen ? a->klen : b->klen;
    int c = memcmp(a->key, b->key, m);
    if (c != 0)
        return c;
    if (a->klen != b->klen)
        return a->klen < b->klen ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

int cold_store_write(cold_store *s, cold_batch *b, char *err, size_t errlen)
{
    if (b->failed) {
        snprintf(err, errlen, "cold store %s: out of memory for a batch of writes", s->dir);
        cold_batch_clear(b);
        return -1;
    }
    if (b->n == 0)
        return 0;
    for (size_t i = 0; i < b->n; i++)
        b->ops[i].key = b->bytes + b->ops[i].off;
    qsort(b->ops, b->n, sizeof(*b->ops), op_cmp);
    for (size_t i = 0; i < b->n; i++) {
        const cold_op *o = &b->ops[i];
        if (o->del)
            rocksdb_writebatch_delete(b->wb, (const char *)o->key, o->klen);
        else
            rocksdb_writebatch_put(b->wb, (const char *)o->key, o->klen,
                                   (const char *)o->key + o->klen, o->vlen);
    }
    char *rerr = NULL;
    rocksdb_write(s->db, s->wopts, b->wb, &rerr);
    rocksdb_writebatch_clear(b->wb);
    cold_batch_clear(b);
    if (rerr != NULL) {
        char what[512];
        snprintf(what, sizeof(what), "cold store %s: write", s->dir);
        set_err(err, errlen, what, rerr);
        return -1;
    }
    return 0;
}

cold_snapshot *cold_store_snapshot(cold_store *s)
{
    cold_snapshot *c = malloc(sizeof(*c));
    if (c != NULL)
        c->snap = rocksdb_create_snapshot(s->db);
    return c;
}

void cold_snapshot_release(cold_store *s, cold_snapshot *snap)
{
    if (snap == NULL)
        return;
    rocksdb_release_snapshot(s->db, snap->snap);
    free(snap);
}

static unsigned char *dup_bytes(const void *p, size_t n)
{
    unsigned char *d = malloc(n ? n : 1);
    if (d != NULL && n > 0)
        memcpy(d, p, n);
    return d;
}

cold_iter *cold_iter_new(cold_store *s, cold_snapshot *snap, const void *lo, size_t lolen,
                         const void *hi, size_t hilen)
{
    cold_iter *it = calloc(1, sizeof(*it));
    if (it == NULL)
        return NULL;
    it->ro = rocksdb_readoptions_create();
    if (snap != NULL)
        rocksdb_readoptions_set_snapshot(it->ro, snap->snap);
    if (lo != NULL) {
        it->lo = dup_bytes(lo, lolen);
        it->lolen = lolen;
    }
    if (hi != NULL) {
        /* Kept while the iterator lives: RocksDB holds the pointer. */
        it->hi = dup_bytes(hi, hilen);
        it->hilen = hilen;
        rocksdb_readoptions_set_iterate_upper_bound(it->ro, (const char *)it->hi, hilen);
    }
    it->it = rocksdb_create_iterator(s->db, it->ro);
    return it;
}

bool cold_iter_next(cold_iter *it, const unsigned char **key, size_t *klen,
                    const unsigned char **val, size_t *vlen)
{
    if (!it->started) {
        it->started = true;
        if (it->lo != NULL)
            rocksdb_iter_seek(it->it, (const char *)it->lo, it->lolen);
        else
            rocksdb_iter_seek_to_first(it->it);
    } else {
        rocksdb_iter_next(it->it);
    }
    if (!rocksdb_iter_valid(it->it))
        return false;
    *key = (const unsigned char *)rocksdb_iter_key(it->it, klen);
    *val = (const unsigned char *)rocksdb_iter_value(it->it, vlen);
    return true;
}

void cold_iter_free(cold_iter *it)
{
    if (it == NULL)
        return;
    rocksdb_iter_destroy(it->it);
    rocksdb_readoptions_destroy(it->ro);
    free(it->lo);
    free(it->hi);
    free(it);
}

uint64_t cold_store_disk_bytes(cold_store *s)
{
    uint64_t v = 0;
    if (rocksdb_property_int(s->db, "rocksdb.live-sst-files-size", &v) != 0)
        v = 0;
    uint64_t mem = 0;
    if (rocksdb_property_int(s->db, "rocksdb.cur-size-all-mem-tables", &mem) == 0)
        v += mem;
    return v;
}

const char *cold_store_dir(const cold_store *s)
{
    return s->dir;
}

uint64_t cold_store_headroom(void)
{
    /* The memtable being written and the one being flushed, then a merge of the level-0
     * files. */
    return (uint64_t)(2 + COLD_L0_FILES) * COLD_WRITE_BUFFER;
}

#else /* no RocksDB */

bool cold_store_available(void)
{
    return false;
}

cold_store *cold_store_open(const char *dir, char *err, size_t errlen)
{
    snprintf(err, errlen, "cold store %s: this server was built without RocksDB", dir);
    return NULL;
}

void cold_store_close(cold_store *s, bool remove)
{
    (void)s;
    (void)remove;
}

int cold_store_multiget(cold_store *s, size_t n, const unsigned char *keys, size_t klen,
                        unsigned char *vals, size_t vlen, bool *found, char *err, size_t errlen)
{
    (void)s, (void)keys, (void)klen, (void)vals, (void)vlen;
    for (size_t i = 0; i < n; i++)
        found[i] = false;
    snprintf(err, errlen, "built without RocksDB");
    return -1;
}

cold_batch *cold_batch_new(void)
{
    return NULL;
}

void cold_batch_put(cold_batch *b, const void *key, size_t klen, const void *val, size_t vlen)
{
    (void)b, (void)key, (void)klen, (void)val, (void)vlen;
}

void cold_batch_delete(cold_batch *b, const void *key, size_t klen)
{
    (void)b, (void)key, (void)klen;
}

size_t cold_batch_count(const cold_batch *b)
{
    (void)b;
    return 0;
}

void cold_batch_clear(cold_batch *b)
{
    (void)b;
}

void cold_batch_free(cold_batch *b)
{
    (void)b;
}

int cold_store_write(cold_store *s, cold_batch *b, char *err, size_t errlen)
{
    (void)s, (void)b;
    snprintf(err, errlen, "built without RocksDB");
    return -1;
}

cold_snapshot *cold_store_snapshot(cold_store *s)
{
    (void)s;
    return NULL;
}

void cold_snapshot_release(cold_store *s, cold_snapshot *snap)
{
    (void)s, (void)snap;
}

cold_iter *cold_iter_new(cold_store *s, cold_snapshot *snap, const void *lo, size_t lolen,
                         const void *hi, size_t hilen)
{
    (void)s, (void)snap, (void)lo, (void)lolen, (void)hi, (void)hilen;
    return NULL;
}

bool cold_iter_next(cold_iter *it, const unsigned char **key, size_t *klen,
                    const unsigned char **val, size_t *vlen)
{
    (void)it, (void)key, (void)klen, (void)val, (void)vlen;
    return false;
}

void cold_iter_free(cold_iter *it)
{
    (void)it;
}

uint64_t cold_store_disk_bytes(cold_store *s)
{
    (void)s;
    return 0;
}

const char *cold_store_dir(const cold_store *s)
{
    (void)s;
    return "";
}

int cold_store_checkpoint(cold_store *s, const char *dir, char *err, size_t errlen)
{
    (void)s;
    snprintf(err, errlen, "cold store checkpoint %s: this server was built without RocksDB", dir);
    return -1;
}

cold_store *cold_store_open_from(const char *dir, const char *from, char *err, size_t errlen)
{
    (void)from;
    snprintf(err, errlen, "cold store %s: this server was built without RocksDB", dir);
    return NULL;
}

uint64_t cold_store_headroom(void)
{
    return 0;
}

#endif

/* ---- the store's disk (either build) ---------------------------------------------------- */

int cold_store_free_bytes(const cold_store *s, uint64_t *free_bytes)
{
    struct statvfs v;
    if (s == NULL || statvfs(cold_store_dir(s), &v) != 0)
        return -1;
    *free_bytes = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    return 0;
}
