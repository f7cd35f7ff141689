#include "checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "checkpoint_state.h"
#include "log.h"
#include "metrics.h"
#include "status.h"
#include "table.h"
#include "table_ckpt.h"
#include "timeutil.h"
#include "util.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "the checkpoint format is written in host order: little-endian hosts only");

#define AGG_WORDS ((SERVER_MAX_WORKERS + 63) / 64)
_Static_assert(AGG_WORDS <= VARIABLE_AGG_MIN_WORDS, "variable_agg_ensure makes too few words");
#define META_MAX (1u << 20) /* a variable record's meta part (spec included) */
#define WBUF_SIZE (1u << 20)
#define IO_CHUNK ((size_t)64 << 20)
/* Large arrays are checksummed and written in pieces of this size (cache-sized). */
#define PUT_PIECE ((size_t)1 << 20)
/* Write-back of the file is started every this many bytes (sync_file_range). */
#define WRITE_BEHIND ((uint64_t)32 << 20)

/* ---- snapshot: a copy of the state taken while updates are held off ---- */

typedef struct snap_var {
    variable *src; /* identity only: not dereferenced after the copy */
    uint8_t *spec;
    size_t spec_len;
    uint64_t numel, offset, count, version;
    int32_t staleness;
    uint32_t nslots, has_agg;
    int32_t agg_count;
    bool initial;    /* never updated: its values are its spec's initializer's (no data) */
    float *data;     /* params, slots, then the aggregate if has_agg */
    size_t data_cap; /* floats allocated */
    uint64_t agg_workers[AGG_WORDS];
} snap_var;

typedef struct snapshot {
    snap_var *vars;
    size_t nvars, cap;
    uint64_t *dedup;
    uint64_t dedup_clients;
    uint32_t dedup_words;
    uint64_t *floors; /* dedup_export_floors */
    size_t nfloors;
    sync_worker_rec *workers;
    size_t nworkers;
    int64_t applied_min;
    int64_t frontier;
    uint64_t create_gen; /* server_state.create_gen when taken: every variable up to it is in */
    server_table_copy *tables;
    size_t ntables;
    bool has_pos; /* record 9 */
    uint64_t pos_epoch, pos_lsn;
} snapshot;

/* A CreateVariable (or TableCreate: table) call parked until what it made is durable
 * (checkpointer_await_create, checkpointer_await_table_create). */
typedef struct create_wait {
    rpc_call *call;
    uint64_t gen;
    uint32_t server;
    uint64_t offset, count;
    int32_t staleness;
    bool created;
    bool table;
} create_wait;

struct checkpointer {
    server_state *st;
    char *dir;
    int keep, full_every;
    int64_t interval_s, interval_updates;
    /* The chain of deltas (write_lock): the previous durable file of this process's chain (0:
     * none, the next is full), the id of its tables' cuts (table.h: the base of the next
     * delta) and how many deltas follow its full file. A checkpointer with full_every 1 keeps
     * no chain: its tables' cuts are snapshot cuts. */
    uint64_t chain_prev;
    uint64_t chain_cut;
    int chain_len;
    uint64_t cluster_hash;
    bool crash_mid_write;
    uint64_t next_seq;
    pthread_mutex_t write_lock; /* one checkpoint at a time */
    pthread_mutex_t lock;       /* the fields below */
    pthread_cond_t cond;
    rpc_call **queue;
    size_t nqueue, qcap;
    bool stop, running;
    pthread_t thread;
    uint64_t last_updates, last_ns;
    size_t last_nvars;
    create_wait *cwait; /* parked creates, in arrival order */
    size_t ncwait, cwcap;
    uint64_t durable_gen; /* create_gen of the newest durable checkpoint */
    /* Health (checkpointer_health), under lock. */
    uint64_t start_ns, ok_ns; /* ok_ns: newest written (0: none yet) */
    uint64_t failures, failures_row;
    uint64_t durable_seq, durable_versions; /* newest durable checkpoint (restored or written) */
    char last_error[512];
    checkpoint_position_fn position; /* write_lock */
    void *position_arg;
};

uint64_t checkpoint_cluster_hash(char *const *ps, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        if (i) {
            h ^= (uint8_t)',';
            h *= 0x100000001b3ull;
        }
        for (const char *p = ps[i]; *p; p++) {
            h ^= (uint8_t)*p;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

static void snapshot_free(snapshot *s)
{
    server_tables_copy_free(s->tables, s->ntables);
    for (size_t i = 0; i < s->nvars; i++) {
        free(s->vars[i].spec);
        free(s->vars[i].data);
    }
    free(s->vars);
    free(s->dedup);
    free(s->floors);
    free(s->workers);
    memset(s, 0, sizeof(*s));
}

static size_t var_floats(const variable *v, bool agg)
{
    return (size_t)v->count * (1 + v->nslots + (agg ? 1 : 0));
}

/* Allocates (and touches, so that the copy under the lock does not fault) room for v. */
static int snap_reserve(snap_var *sv, const variable *v)
{
    /* Outside the variable's locks: agg_ready, not agg, may be read (a hint: snap_copy grows
     * the buffer if the aggregate was made meanwhile). */
    bool agg = v->staleness == 0 || atomic_load(&v->agg_ready);
    if (atomic_load(&v->version) == 0 && !atomic_load(&v->agg_ready))
        return 0; /* likely still initial (snap_copy allocates if not) */
    size_t need = var_floats(v, agg);
    if (need == 0)
        need = 1;
    if (sv->data_cap >= need)
        return 0;
    free(sv->data);
    sv->data = malloc(need * sizeof(float));
    if (sv->data == NULL) {
        sv->data_cap = 0;
        return -1;
    }
    memset(sv->data, 0, need * sizeof(float));
    sv->data_cap = need;
    return 0;
}

/* Copies v into sv; called with the store frozen. Returns -1 if memory can't be had. */
static int snap_copy(snap_var *sv, variable *v)
{
    variable_lock_all(v);
    uint32_t has_agg = v->agg != NULL;
    /* Never updated (no push, no BSP contribution): its values are the initializer's, which
     * the restore makes again from the spec. A checkpoint made for a create is then small. */
    sv->initial = atomic_load(&v->version) == 0 && !has_agg;
    size_t need = sv->initial ? 0 : var_floats(v, has_agg);
    if (sv->data_cap < need || sv->data == NULL) {
        free(sv->data);
        sv->data = malloc((need ? need : 1) * sizeof(float));
        sv->data_cap = sv->data ? need : 0;
    }
    if (sv->data == NULL) {
        variable_unlock_all(v);
        return -1;
    }
    size_t n = sv->initial ? 0 : (size_t)v->count;
    memcpy(sv->data, v->params, n * sizeof(float));
    for (size_t i = 0; i < v->nslots; i++)
        memcpy(sv->data + (1 + i) * n, v->slots[i], n * sizeof(float));
    if (has_agg) {
        memcpy(sv->data + (1 + v->nslots) * n, v->agg, n * sizeof(float));
        /* agg_words 0: made by code that does not record it, with SERVER_MAX_WORKERS bits. */
        size_t words = v->agg_words && v->agg_words < AGG_WORDS ? v->agg_words : AGG_WORDS;
        memset(sv->agg_workers, 0, sizeof(sv->agg_workers));
        memcpy(sv->agg_workers, v->agg_workers, words * sizeof(uint64_t));
    }
    sv->src = v;
    sv->numel = v->numel;
    sv->offset = v->offset;
    sv->count = v->count;
    sv->version = atomic_load(&v->version);
    sv->staleness = v->staleness;
    sv->nslots = (uint32_t)v->nslots;
    sv->has_agg = has_agg;
    sv->agg_count = v->agg_count;
    variable_unlock_all(v);
    return 0;
}

/* Takes the snapshot: buffers are made beforehand, the copy runs with updates held off.
 * base, cut, track: the tables' cuts (server_tables_copy). *pause_ns: how long they were. */
static int snapshot_take(server_state *st, snapshot *s, uint64_t base, uint64_t cut, bool track,
                         checkpoint_position_fn position, void *position_arg, uint64_t *pause_ns,
                         char *err, size_t errlen)
{
    memset(s, 0, sizeof(*s));
    variable **pre;
    size_t npre = store_list(st->vars, &pre);
    if (pre == NULL)
        return errf(err, errlen, "out of memory listing variables");
    s->cap = npre + 16;
    s->vars = calloc(s->cap, sizeof(*s->vars));
    if (s->vars == NULL) {
        store_list_release(pre, npre);
        return errf(err, errlen, "out of memory for the snapshot's table");
    }
    for (size_t i = 0; i < npre; i++) {
        snap_var *sv = &s->vars[i];
        sv->src = pre[i];
        size_t n = psd__v1__variable_spec__get_packed_size(pre[i]->spec);
        sv->spec = malloc(n ? n : 1);
        if (sv->spec == NULL || snap_reserve(sv, pre[i]) != 0) {
            errf(err, errlen, "out of memory copying variable \"%s\" (%" PRIu64 " elements)",
                 pre[i]->name, pre[i]->count);
            s->nvars = i + 1;
            store_list_release(pre, npre);
            snapshot_free(s);
            return -1;
        }
        sv->spec_len = psd__v1__variable_spec__pack(pre[i]->spec, sv->spec);
    }
    s->nvars = npre;
    /* pre's references are kept until the copy below is matched against them: a variable
     * deleted meanwhile stays allocated, so no new one can take its address (sv->src). */

    /* The tables' copies are prepared (memory allocated and faulted in) before the pause. */
    if (server_tables_copy_prepare(st, base, &s->tables, &s->ntables) != 0) {
        store_list_release(pre, npre);
        snapshot_free(s);
        return errf(err, errlen, "out of memory preparing the copy of the sparse tables");
    }

    uint64_t t0 = time_now_ns();
    if (position)
        s->has_pos = position(position_arg, true, &s->pos_epoch, &s->pos_lsn);
    store_freeze(st->vars);
    variable **now;
    size_t nnow = store_list(st->vars, &now);
    int rc = now ? 0 : errf(err, errlen, "out of memory listing variables");
    for (size_t i = 0; rc == 0 && i < nnow; i++) {
        snap_var *sv = NULL;
        for (size_t j = 0; j < s->nvars; j++) {
            size_t k = (i + j) % s->nvars;
            if (s->vars[k].src == now[i]) {
                sv = &s->vars[k];
                break;
            }
        }
        if (sv == NULL) { /* created since the list above */
            if (s->nvars == s->cap) {
                snap_var *nv = realloc(s->vars, 2 * s->cap * sizeof(*nv));
                if (nv == NULL) {
                    rc = errf(err, errlen, "out of memory for the snapshot's table");
                    break;
                }
                memset(nv + s->cap, 0, s->cap * sizeof(*nv));
                s->vars = nv;
                s->cap *= 2;
            }
            sv = &s->vars[s->nvars++];
            size_t n = psd__v1__variable_spec__get_packed_size(now[i]->spec);
            sv->spec = malloc(n ? n : 1);
            if (sv->spec == NULL) {
                rc = errf(err, errlen, "out of memory copying a spec");
                break;
            }
            sv->spec_len = psd__v1__variable_spec__pack(now[i]->spec, sv->spec);
        }
        if (snap_copy(sv, now[i]) != 0)
            rc = errf(err, errlen, "out of memory copying variable \"%s\"", now[i]->name);
    }
    if (rc == 0) {
        s->dedup = dedup_export(st->dedup, &s->dedup_clients, &s->dedup_words);
        if (s->dedup == NULL)
            rc = errf(err, errlen, "out of memory copying the dedup table");
    }
    if (rc == 0) {
        s->floors = dedup_export_floors(st->dedup, &s->nfloors);
        if (s->floors == NULL)
            rc = errf(err, errlen, "out of memory copying the dedup tombstones");
    }
    if (rc == 0) {
        s->workers = sync_export(st, &s->nworkers, &s->applied_min, &s->frontier);
    }
    /* Tables are only marked here: each partition is copied after the thaw, before anything
     * changes it (table.h, table_cut_begin), so the pause does not grow with the rows. */
    if (rc == 0 && server_tables_copy(st, base, cut, track, &s->tables, &s->ntables) != 0)
        rc = errf(err, errlen, "out of memory starting the copy of the sparse tables");
    s->create_gen = atomic_load(&st->create_gen);
    store_thaw(st->vars);
    if (position)
        position(position_arg, false, NULL, NULL);
    *pause_ns = time_now_ns() - t0;
    if (rc == 0 && server_tables_copy_finish(s->tables, s->ntables) != 0)
        rc = errf(err, errlen, "out of memory copying the sparse tables");
    store_list_release(now, nnow);
    store_list_release(pre, npre);
    /* Variables deleted between the two lists were never copied (numel stays 0): drop them. */
    size_t kept = 0;
    for (size_t i = 0; i < s->nvars; i++) {
        if (s->vars[i].numel == 0) {
            free(s->vars[i].spec);
            free(s->vars[i].data);
        } else {
            s->vars[kept++] = s->vars[i];
        }
    }
    s->nvars = kept;
    if (rc != 0) {
        snapshot_free(s);
        return -1;
    }
    return 0;
}

/* ---- writing ---- */

typedef struct writer {
    int fd;
    const char *path;
    uint8_t *buf;
    size_t used;
    uint64_t written;  /* bytes handed to write() */
    uint64_t started;  /* bytes whose write-back has been started (sync_file_range) */
    uint64_t crash_at; /* failpoint: _exit(1) once this many are written (0: never) */
    uLong crc;
    char *err;
    size_t errlen;
    int failed;
} writer;

static int w_raw(writer *w, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        size_t k = n < IO_CHUNK ? n : IO_CHUNK;
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

static int w_flush(writer *w)
{
    if (w->failed)
        return -1;
    int rc = w->used ? w_raw(w, w->buf, w->used) : 0;
    w->used = 0;
    return rc;
}

/* Appends bytes (CRC'd) to the file. */
static int w_put(writer *w, const void *p, size_t n)
{
    if (w->failed)
        return -1;
    const uint8_t *b = p;
    if (n >= WBUF_SIZE / 2) {
        /* Large arrays: checksum and write piece by piece, so each piece is still in the cache
         * when it is written. */
        if (w_flush(w) != 0)
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
    if (w->used + n > WBUF_SIZE && w_flush(w) != 0)
        return -1;
    memcpy(w->buf + w->used, p, n);
    w->used += n;
    return 0;
}

static int w_u32(writer *w, uint32_t x)
{
    return w_put(w, &x, 4);
}
static int w_u64(writer *w, uint64_t x)
{
    return w_put(w, &x, 8);
}

static int w_rec_begin_flags(writer *w, uint32_t type, uint32_t flags, uint64_t len)
{
    w->crc = crc32(0L, Z_NULL, 0);
    if (w_u32(w, type) || w_u32(w, flags) || w_u64(w, len))
        return -1;
    return 0;
}

static int w_rec_begin(writer *w, uint32_t type, uint64_t len)
{
    w->crc = crc32(0L, Z_NULL, 0);
    if (w_u32(w, type) || w_u32(w, 0) || w_u64(w, len))
        return -1;
    return 0;
}

static int w_rec_end(writer *w)
{
    uint32_t c = (uint32_t)w->crc;
    return w_put(w, &c, 4);
}

static uint64_t var_meta_len(const snap_var *sv)
{
    return 8 * 4 + 4 * 6 + sv->spec_len;
}

static uint64_t var_payload_len(const snap_var *sv)
{
    uint64_t n = 4 + var_meta_len(sv);
    if (sv->initial)
        return n;
    n += sv->count * 4 * (1 + sv->nslots + sv->has_agg);
    if (sv->has_agg)
        n += AGG_WORDS * 8;
    return n;
}

static int write_var(writer *w, const snap_var *sv)
{
    uint64_t len = var_payload_len(sv);
    if (w_rec_begin_flags(w, CKPT_REC_VARIABLE, sv->initial ? CKPT_VAR_INITIAL : 0, len))
        return -1;
    uint32_t meta = (uint32_t)var_meta_len(sv);
    int rc = w_u32(w, meta) || w_u64(w, sv->numel) || w_u64(w, sv->offset) || w_u64(w, sv->count) ||
             w_u64(w, sv->version) || w_u32(w, (uint32_t)sv->staleness) || w_u32(w, sv->nslots) ||
             w_u32(w, sv->has_agg) || w_u32(w, (uint32_t)sv->agg_count) ||
             w_u32(w, sv->has_agg ? AGG_WORDS : 0) || w_u32(w, (uint32_t)sv->spec_len) ||
             w_put(w, sv->spec, sv->spec_len);
    if (rc == 0 && !sv->initial)
        rc = w_put(w, sv->data, (size_t)sv->count * 4 * (1 + sv->nslots + sv->has_agg));
    if (rc == 0 && sv->has_agg)
        rc = w_put(w, sv->agg_workers, AGG_WORDS * 8);
    if (rc == 0)
        rc = w_rec_end(w);
    return rc ? -1 : 0;
}

/* A table record: u32 spec length, the packed TableSpec, u32 floats per row, u32 0, u64 rows,
 * then per row (oldest update first): i64 id, i64 update time (ms), the row's floats. */
static uint64_t table_payload_len(const server_table_copy *t)
{
    return 4 + t->spec_len + 16 + t->rows * (16 + 4 * (uint64_t)t->row_floats);
}

/* A partition's rows: id, update time, then the row's floats, each. */
static int write_rows(writer *w, const table_rows *r)
{
    for (size_t i = 0; i < r->n; i++)
        if (w_u64(w, (uint64_t)r->ids[i]) || w_u64(w, (uint64_t)r->updated_ms[i]) ||
            w_put(w, r->floats + i * r->row_floats, (size_t)r->row_floats * 4))
            return -1;
    return 0;
}

static int write_table(writer *w, const server_table_copy *t)
{
    if (w_rec_begin(w, CKPT_REC_TABLE, table_payload_len(t)) || w_u32(w, (uint32_t)t->spec_len) ||
        w_put(w, t->spec, t->spec_len) || w_u32(w, t->row_floats) || w_u32(w, 0) ||
        w_u64(w, t->rows))
        return -1;
    for (uint32_t p = 0; p < t->nparts; p++)
        if (write_rows(w, &t->parts[p]))
            return -1;
    return w_rec_end(w);
}

/* A table delta record (CKPT_REC_TABLE_DELTA, checkpoint.h). */
static uint64_t table_delta_len(const server_table_copy *t)
{
    uint64_t n = 4 + t->spec_len + 8;
    for (uint32_t p = 0; p < t->nparts; p++)
        n += 24 + 8 * (uint64_t)t->parts[p].nremoved +
             t->parts[p].n * (16 + 4 * (uint64_t)t->row_floats);
    return n;
}

static int write_table_delta(writer *w, const server_table_copy *t)
{
    if (w_rec_begin(w, CKPT_REC_TABLE_DELTA, table_delta_len(t)) ||
        w_u32(w, (uint32_t)t->spec_len) || w_put(w, t->spec, t->spec_len) ||
        w_u32(w, t->row_floats) || w_u32(w, t->nparts))
        return -1;
    for (uint32_t p = 0; p < t->nparts; p++) {
        const table_rows *r = &t->parts[p];
        if (w_u32(w, r->full ? CKPT_PART_WHOLE : 0) || w_u32(w, 0) || w_u64(w, r->nremoved) ||
            w_u64(w, r->n) || (r->nremoved && w_put(w, r->removed, r->nremoved * 8)) ||
            write_rows(w, r))
            return -1;
    }
    return w_rec_end(w);
}

static uint64_t table_rec_len(const server_table_copy *t)
{
    return t->delta ? table_delta_len(t) : table_payload_len(t);
}

/* Record 8 is written only when a known worker is not live (finished or evicted): then its
 * finish and the frontier matter to who rejoins where. */
static bool sync_out_needed(const snapshot *s)
{
    for (size_t i = 0; i < s->nworkers; i++)
        if (!s->workers[i].live)
            return true;
    return false;
}

static uint64_t sync_left_count(const snapshot *s)
{
    uint64_t n = 0;
    for (size_t i = 0; i < s->nworkers; i++)
        n += s->workers[i].left;
    return n;
}

static uint64_t snapshot_file_size(const snapshot *s)
{
    uint64_t n = CKPT_HEADER_SIZE;
    for (size_t i = 0; i < s->ntables; i++)
        n += 20 + table_rec_len(&s->tables[i]);
    for (size_t i = 0; i < s->nvars; i++)
        n += 20 + var_payload_len(&s->vars[i]);
    n += 20 + 8 + s->dedup_clients * (2 + s->dedup_words) * 8;
    n += 20 + s->nfloors * 8;
    n += 20 + 16 + s->nworkers * 16;
    if (sync_out_needed(s))
        n += 20 + 16 + sync_left_count(s) * 16;
    if (s->has_pos)
        n += 20 + 16;
    n += 20 + 16;
    return n;
}

/* prev: the previous file of the chain for a delta (0: a full checkpoint). */
static int write_file(checkpointer *ck, const snapshot *s, writer *w, uint64_t seq, uint64_t prev)
{
    uint8_t hdr[CKPT_HEADER_SIZE] = {0};
    memcpy(hdr, CKPT_MAGIC, 8);
    uint32_t u32;
    uint64_t u64;
    u32 = prev ? CKPT_FORMAT_DELTA : CKPT_FORMAT_VERSION;
    memcpy(hdr + 48, &prev, 8);
    memcpy(hdr + 8, &u32, 4);
    u32 = CKPT_HEADER_SIZE;
    memcpy(hdr + 12, &u32, 4);
    memcpy(hdr + 16, &ck->st->num_servers, 4);
    memcpy(hdr + 20, &ck->st->task_index, 4);
    memcpy(hdr + 24, &ck->cluster_hash, 8);
    memcpy(hdr + 32, &seq, 8);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    u64 = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    memcpy(hdr + 40, &u64, 8);
    u32 = (uint32_t)crc32(0L, hdr, 60);
    memcpy(hdr + 60, &u32, 4);
    if (w_put(w, hdr, sizeof(hdr)))
        return -1;
    uint64_t nrec = 0, total = 0;
    for (size_t i = 0; i < s->nvars; i++) {
        if (write_var(w, &s->vars[i]))
            return -1;
        nrec++;
        total += var_payload_len(&s->vars[i]);
    }
    for (size_t i = 0; i < s->ntables; i++) {
        const server_table_copy *t = &s->tables[i];
        if (t->delta ? write_table_delta(w, t) : write_table(w, t))
            return -1;
        nrec++;
        total += table_rec_len(t);
    }
    uint64_t dlen = 8 + s->dedup_clients * (2 + s->dedup_words) * 8;
    if (w_rec_begin(w, CKPT_REC_DEDUP, dlen) || w_u32(w, s->dedup_words) || w_u32(w, 0) ||
        w_put(w, s->dedup, (size_t)(s->dedup_clients * (2 + s->dedup_words) * 8)) || w_rec_end(w))
        return -1;
    nrec++;
    total += dlen;
    uint64_t flen = s->nfloors * 8;
    if (w_rec_begin(w, CKPT_REC_DEDUP_FLOORS, flen) || w_put(w, s->floors, (size_t)flen) ||
        w_rec_end(w))
        return -1;
    nrec++;
    total += flen;
    uint64_t slen = 16 + s->nworkers * 16;
    if (w_rec_begin(w, CKPT_REC_SYNC, slen) || w_u64(w, (uint64_t)s->applied_min) ||
        w_u64(w, s->nworkers))
        return -1;
    for (size_t i = 0; i < s->nworkers; i++) {
        const sync_worker_rec *r = &s->workers[i];
        if (w_u32(w, (uint32_t)r->id) ||
            w_u32(w, (uint32_t)(r->known ? 1 : 0) | (uint32_t)(r->live ? 2 : 0)) ||
            w_u64(w, (uint64_t)r->clock))
            return -1;
    }
    if (w_rec_end(w))
        return -1;
    nrec++;
    total += slen;
    if (sync_out_needed(s)) {
        uint64_t olen = 16 + sync_left_count(s) * 16;
        if (w_rec_begin(w, CKPT_REC_SYNC_OUT, olen) || w_u64(w, (uint64_t)s->frontier) ||
            w_u64(w, sync_left_count(s)))
            return -1;
        for (size_t i = 0; i < s->nworkers; i++) {
            const sync_worker_rec *r = &s->workers[i];
            if (r->left && (w_u32(w, (uint32_t)r->id) || w_u32(w, 0) || w_u64(w, r->left_client)))
                return -1;
        }
        if (w_rec_end(w))
            return -1;
        nrec++;
        total += olen;
    }
    if (s->has_pos) {
        if (w_rec_begin(w, CKPT_REC_REPLICA, 16) || w_u64(w, s->pos_epoch) ||
            w_u64(w, s->pos_lsn) || w_rec_end(w))
            return -1;
        nrec++;
        total += 16;
    }
    if (w_rec_begin(w, CKPT_REC_END, 16) || w_u64(w, nrec) || w_u64(w, total) || w_rec_end(w))
        return -1;
    return w_flush(w);
}

static int fsync_dir(const char *dir, char *err, size_t errlen)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return errf(err, errlen, "opening directory %s: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0)
        return errf(err, errlen, "fsync of directory %s: %s", dir, strerror(e));
    return 0;
}

/* ---- the directory ---- */

typedef struct ckpt_file {
    uint64_t seq;
    char name[64];
} ckpt_file;

static int cmp_seq_desc(const void *a, const void *b)
{
    const ckpt_file *x = a, *y = b;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

/* Checkpoint files of task in dir, newest first. With remove_tmp, deletes the task's leftover
 * temporary files. Returns the count (*out malloc'd), or -1 with a message. */
static long list_files(const char *dir, uint32_t task, bool remove_tmp, ckpt_file **out, char *err,
                       size_t errlen)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return errf(err, errlen, "cannot read checkpoint directory %s: %s", dir, strerror(errno));
    size_t n = 0, cap = 16;
    ckpt_file *f = malloc(cap * sizeof(*f));
    struct dirent *e;
    while (f && (e = readdir(d)) != NULL) {
        unsigned t;
        unsigned long long seq;
        int end = 0;
        char tmpname[300];
        if (sscanf(e->d_name, "ckpt-%u-%llu.psc%n", &t, &seq, &end) == 2 &&
            e->d_name[end] == '\0' && t == task && strlen(e->d_name) < sizeof(f->name)) {
            if (n == cap) {
                ckpt_file *nf = realloc(f, 2 * cap * sizeof(*nf));
                if (nf == NULL) {
                    free(f);
                    f = NULL;
                    break;
                }
                f = nf;
                cap *= 2;
            }
            f[n].seq = seq;
            snprintf(f[n].name, sizeof(f[n].name), "%s", e->d_name);
            n++;
        } else if (remove_tmp &&
                   sscanf(e->d_name, ".ckpt-%u-%llu.psc.tmp%n", &t, &seq, &end) == 2 &&
                   e->d_name[end] == '\0' && t == task &&
                   (size_t)snprintf(tmpname, sizeof(tmpname), "%s/%s", dir, e->d_name) <
                       sizeof(tmpname)) {
            if (unlink(tmpname) == 0)
                log_warn("removed %s, an unfinished checkpoint (the server stopped while writing "
                         "it)",
                         tmpname);
        }
    }
    closedir(d);
    if (f == NULL)
        return errf(err, errlen, "out of memory listing %s", dir);
    qsort(f, n, sizeof(*f), cmp_seq_desc);
    *out = f;
    return (long)n;
}

static int peek_prev(const char *path, uint64_t *prev, char *err, size_t errlen);

/* Deletes old checkpoints: the newest `keep` files are restore points, and each keeps its
 * whole chain (a delta needs every file back to its full checkpoint). */
static void prune(checkpointer *ck)
{
    ckpt_file *f;
    char err[512];
    long n = list_files(ck->dir, ck->st->task_index, false, &f, err, sizeof(err));
    if (n < 0) {
        log_warn("not deleting old checkpoints: %s", err);
        return;
    }
    bool *keep = calloc(n ? (size_t)n : 1, sizeof(*keep));
    if (keep == NULL) {
        free(f);
        log_warn("not deleting old checkpoints: out of memory");
        return;
    }
    for (long i = 0; i < n && i < ck->keep; i++) {
        for (long cur = i; cur < n && !keep[cur];) {
            keep[cur] = true;
            char path[4200];
            uint64_t prev = 0;
            snprintf(path, sizeof(path), "%s/%s", ck->dir, f[cur].name);
            if (peek_prev(path, &prev, err, sizeof(err)) != 0 || prev == 0)
                break;
            while (cur < n && f[cur].seq != prev)
                cur++;
        }
    }
    for (long i = 0; i < n; i++) {
        if (keep[i])
            continue;
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", ck->dir, f[i].name);
        if (unlink(path) != 0)
            log_warn("cannot delete old checkpoint %s: %s", path, strerror(errno));
    }
    free(keep);
    free(f);
}

int checkpoint_mkdir(const char *dir, char *err, size_t errlen)
{
    char buf[4096];
    if (snprintf(buf, sizeof(buf), "%s", dir) >= (int)sizeof(buf))
        return errf(err, errlen, "checkpoint-dir is too long (%zu bytes)", strlen(dir));
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return errf(err, errlen, "cannot create checkpoint directory %s: %s", buf,
                            strerror(errno));
            *p = c;
            if (c == '\0')
                break;
        }
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return errf(err, errlen, "checkpoint-dir %s is not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return errf(err, errlen, "checkpoint-dir %s is not writable: %s", dir, strerror(errno));
    return 0;
}

/* ---- checkpointer ---- */

checkpointer *checkpointer_create(server_state *st, const checkpoint_config *cfg, uint64_t next_seq,
                                  char *err, size_t errlen)
{
    if (cfg->dir == NULL || cfg->dir[0] == '\0') {
        errf(err, errlen, "checkpoints are off: set checkpoint-dir");
        return NULL;
    }
    if (checkpoint_mkdir(cfg->dir, err, errlen) != 0)
        return NULL;
    checkpointer *ck = calloc(1, sizeof(*ck));
    if (ck == NULL || (ck->dir = strdup(cfg->dir)) == NULL) {
        free(ck);
        errf(err, errlen, "out of memory");
        return NULL;
    }
    ck->st = st;
    ck->keep = cfg->keep < 1 ? 1 : cfg->keep;
    ck->full_every = cfg->full_every < 1 ? 1 : cfg->full_every;
    ck->interval_s = cfg->interval_s;
    ck->interval_updates = cfg->interval_updates;
    ck->cluster_hash = cfg->cluster_hash;
    ck->crash_mid_write =
        cfg->failpoint && strcmp(cfg->failpoint, "checkpoint-crash-mid-write") == 0;
    ck->next_seq = next_seq ? next_seq : 1;
    ck->last_ns = time_now_ns();
    ck->start_ns = ck->last_ns;
    ck->last_updates = atomic_load(&st->updates_applied);
    /* Exported from the start, so that an alert on failures or age fires on a server that
     * never wrote a checkpoint. */
    metric_add(metrics_counter("psd_checkpoint_failures_total", "Checkpoints that failed."), 0);
    pthread_mutex_init(&ck->write_lock, NULL);
    pthread_mutex_init(&ck->lock, NULL);
    pthread_cond_init(&ck->cond, NULL);
    return ck;
}

/* Metrics of a checkpoint written (metrics.h); the age is the server's collector's. */
static void checkpoint_metrics(const checkpoint_info *info, double seconds)
{
    static const double buckets[] = {0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
    metric_inc(metrics_counter("psd_checkpoints_total", "Checkpoints written."));
    metric_observe(metrics_histogram("psd_checkpoint_duration_seconds",
                                     "Time to write a checkpoint, snapshot to durable file.",
                                     buckets, sizeof(buckets) / sizeof(buckets[0])),
                   seconds);
    metric_set(metrics_gauge("psd_checkpoint_bytes", "Size of the newest checkpoint."),
               (double)info->bytes);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    metric_set(metrics_gauge("psd_checkpoint_last_success_timestamp_seconds",
                             "Wall-clock time the newest checkpoint became durable."),
               (double)now.tv_sec + (double)now.tv_nsec * 1e-9);
}

/* Counts a failed checkpoint and keeps its message for checkpointer_health. */
static void note_failure(checkpointer *ck, const char *err)
{
    metric_inc(metrics_counter("psd_checkpoint_failures_total", "Checkpoints that failed."));
    pthread_mutex_lock(&ck->lock);
    ck->failures++;
    ck->failures_row++;
    snprintf(ck->last_error, sizeof(ck->last_error), "%s", err);
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_health(checkpointer *ck, checkpoint_health *out)
{
    memset(out, 0, sizeof(*out));
    if (ck == NULL)
        return;
    pthread_mutex_lock(&ck->lock);
    out->failures = ck->failures;
    out->failures_row = ck->failures_row;
    out->last_seq = ck->durable_seq;
    out->age_s = (double)(time_now_ns() - (ck->ok_ns ? ck->ok_ns : ck->start_ns)) * 1e-9;
    snprintf(out->last_error, sizeof(out->last_error), "%s", ck->last_error);
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_set_position(checkpointer *ck, checkpoint_position_fn fn, void *arg)
{
    pthread_mutex_lock(&ck->write_lock);
    ck->position = fn;
    ck->position_arg = arg;
    pthread_mutex_unlock(&ck->write_lock);
}

uint64_t checkpointer_next_seq(checkpointer *ck)
{
    pthread_mutex_lock(&ck->write_lock);
    uint64_t n = ck->next_seq;
    pthread_mutex_unlock(&ck->write_lock);
    return n;
}

void checkpointer_set_restored(checkpointer *ck, uint64_t seq, uint64_t versions)
{
    pthread_mutex_lock(&ck->lock);
    ck->durable_seq = seq;
    ck->durable_versions = versions;
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_record(checkpointer *ck, bool clean)
{
    pthread_mutex_lock(&ck->lock);
    ckpt_record r = {.state = clean ? CKPT_STOP_CLEAN : CKPT_STOP_RUNNING,
                     .pid = (long)getpid(),
                     .seq = ck->durable_seq,
                     .versions = ck->durable_versions};
    pthread_mutex_unlock(&ck->lock);
    char err[600];
    if (ckpt_record_write(ck->dir, ck->st->task_index, &r, err, sizeof(err)) != 0)
        log_warn("%s: a restart may misreport what was lost", err);
}

int checkpoint_write(checkpointer *ck, checkpoint_info *info, char *err, size_t errlen)
{
    uint64_t t0 = time_now_ns();
    pthread_mutex_lock(&ck->write_lock);
    memset(info, 0, sizeof(*info));
    uint64_t seq = ck->next_seq;
    uint64_t updates = atomic_load(&ck->st->updates_applied);
    snapshot s;
    uint64_t pause_ns = 0;
    /* A delta of the previous file of the chain, unless the chain is due for a full one (or
     * broken: none yet in this process, or the last write failed). Without a chain the
     * tables' cuts are snapshot cuts: another checkpointer's chain of the state (a copy image
     * is written while the state's own checkpointer goes on) keeps its deltas. */
    bool chain = ck->full_every > 1;
    uint64_t base =
        chain && ck->chain_prev != 0 && ck->chain_len + 1 < ck->full_every ? ck->chain_prev : 0;
    uint64_t cut = chain ? table_cut_id_new() : 0;
    if (snapshot_take(ck->st, &s, base ? ck->chain_cut : 0, cut, chain, ck->position,
                      ck->position_arg, &pause_ns, err, errlen) != 0) {
        ck->chain_prev = 0;
        note_failure(ck, err);
        pthread_mutex_unlock(&ck->write_lock);
        return -1;
    }
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s/.ckpt-%u-%" PRIu64 ".psc.tmp", ck->dir, ck->st->task_index, seq);
    int n = snprintf(info->path, sizeof(info->path), "%s/ckpt-%u-%" PRIu64 ".psc", ck->dir,
                     ck->st->task_index, seq);
    int rc = -1;
    writer w = {.fd = -1, .path = tmp, .err = err, .errlen = errlen};
    if (n >= (int)sizeof(info->path)) {
        errf(err, errlen, "checkpoint path in %s is too long", ck->dir);
        goto out;
    }
    /* A delta only when some table is one: otherwise the file holds everything anyway. */
    bool delta = false;
    for (size_t i = 0; i < s.ntables; i++) {
        delta = delta || s.tables[i].delta;
        info->table_rows += s.tables[i].rows;
    }
    uint64_t prev = delta ? base : 0;
    uint64_t size = snapshot_file_size(&s);
    if (ck->crash_mid_write)
        w.crash_at = size / 2 ? size / 2 : 1;
    w.buf = malloc(WBUF_SIZE);
    if (w.buf == NULL) {
        errf(err, errlen, "out of memory for the write buffer");
        goto out;
    }
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        errf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (write_file(ck, &s, &w, seq, prev) != 0)
        goto out;
    if (w.written != size) {
        errf(err, errlen, "internal error: wrote %" PRIu64 " bytes to %s, expected %" PRIu64,
             w.written, tmp, size);
        goto out;
    }
    if (fsync(w.fd) != 0) {
        errf(err, errlen, "fsync of %s: %s", tmp, strerror(errno));
        goto out;
    }
    if (close(w.fd) != 0) {
        w.fd = -1;
        errf(err, errlen, "closing %s: %s", tmp, strerror(errno));
        goto out;
    }
    w.fd = -1;
    if (rename(tmp, info->path) != 0) {
        errf(err, errlen, "renaming %s to %s: %s", tmp, info->path, strerror(errno));
        goto out;
    }
    if (fsync_dir(ck->dir, err, errlen) != 0)
        goto out;
    rc = 0;
    ck->next_seq = seq + 1;
    ck->chain_prev = seq;
    ck->chain_cut = cut;
    ck->chain_len = delta ? ck->chain_len + 1 : 0;
    info->base = prev;
    info->seq = seq;
    info->bytes = size;
    info->variables = (uint32_t)s.nvars;
    info->pause_us = pause_ns / 1000u;
    info->ms = (time_now_ns() - t0) / 1000000u;
    info->has_position = s.has_pos;
    info->epoch = s.pos_epoch;
    info->lsn = s.pos_lsn;
    for (size_t i = 0; i < s.nvars; i++)
        info->versions += s.vars[i].version;
    pthread_mutex_lock(&ck->lock);
    ck->last_updates = updates;
    ck->last_ns = time_now_ns();
    ck->last_nvars = s.nvars;
    ck->durable_gen = s.create_gen;
    ck->ok_ns = ck->last_ns;
    ck->failures_row = 0;
    ck->durable_seq = seq;
    ck->durable_versions = info->versions;
    pthread_mutex_unlock(&ck->lock);
    checkpointer_record(ck, false);
    checkpoint_metrics(info, (double)(time_now_ns() - t0) * 1e-9);
    char kind[64] = "full";
    if (prev)
        snprintf(kind, sizeof(kind), "delta of %" PRIu64, prev);
    log_info("checkpoint %s (%s): %u variables, %zu tables (%" PRIu64 " rows), %" PRIu64
             " bytes in %" PRIu64 " ms; updates paused %.3f ms",
             info->path, kind, info->variables, s.ntables, info->table_rows, info->bytes, info->ms,
             (double)pause_ns / 1e6);
    prune(ck);
out:
    if (w.fd >= 0)
        close(w.fd);
    if (rc != 0) {
        unlink(tmp);
        ck->chain_prev = 0; /* the tables' marks were taken by this cut: the next is full */
        note_failure(ck, err);
    }
    free(w.buf);
    snapshot_free(&s);
    pthread_mutex_unlock(&ck->write_lock);
    return rc;
}

static void reply_batch(rpc_call **calls, size_t n, int rc, const checkpoint_info *info,
                        const char *err)
{
    for (size_t i = 0; i < n; i++) {
        if (rc == 0) {
            Psd__V1__CheckpointReply rep = PSD__V1__CHECKPOINT_REPLY__INIT;
            rep.path = (char *)info->path;
            rep.version = info->seq;
            rep.bytes = info->bytes;
            rep.variables = info->variables;
            rep.pause_us = info->pause_us;
            rep.write_ms = info->ms;
            rpc_reply_ok(calls[i], &rep.base);
        } else {
            rpc_reply_error(calls[i], STATUS_INTERNAL, "checkpoint failed: %s", err);
        }
        rpc_call_resume(calls[i]);
    }
}

/* Answers parked creates after a checkpoint: OK for those it holds (rc 0), else UNAVAILABLE
 * naming the failure (the client's retry parks the create again and so tries once more). */
static void reply_creates(checkpointer *ck, create_wait *w, size_t n, int rc, const char *err)
{
    for (size_t i = 0; i < n; i++) {
        if (w[i].table) {
            const Psd__V1__TableCreateRequest *req = (const void *)rpc_call_body(w[i].call);
            const char *name = req && req->spec && req->spec->name ? req->spec->name : "?";
            if (rc == 0) {
                Psd__V1__TableCreateReply rep = PSD__V1__TABLE_CREATE_REPLY__INIT;
                rep.created = w[i].created;
                rpc_reply_ok(w[i].call, &rep.base);
            } else {
                rpc_reply_error(w[i].call, STATUS_UNAVAILABLE,
                                "table \"%.200s\" exists on ps %u but is not durable: the "
                                "checkpoint that would hold it failed (%s)",
                                name, ck->st->task_index, err);
            }
            rpc_call_resume(w[i].call);
            continue;
        }
        const Psd__V1__CreateVariableRequest *req = (const void *)rpc_call_body(w[i].call);
        const char *name = req && req->spec && req->spec->name ? req->spec->name : "?";
        if (rc == 0) {
            Psd__V1__CreateVariableReply rep = PSD__V1__CREATE_VARIABLE_REPLY__INIT;
            Psd__V1__Shard shard = PSD__V1__SHARD__INIT;
            shard.server = w[i].server;
            shard.offset = w[i].offset;
            shard.count = w[i].count;
            rep.shard = &shard;
            rep.staleness = w[i].staleness;
            rep.created = w[i].created;
            rpc_reply_ok(w[i].call, &rep.base);
        } else {
            rpc_reply_error(
                w[i].call, STATUS_UNAVAILABLE,
                "variable \"%.200s\" exists on ps %u but is not durable: the checkpoint "
                "that would hold it failed (%s)",
                name, ck->st->task_index, err);
        }
        rpc_call_resume(w[i].call);
    }
}

/* Parks `call` as *wait (gen: what must be durable; kind, name: for the messages). */
static bool await_gen(checkpointer *ck, rpc_call *call, const create_wait *wait, const char *kind,
                      const char *name);

bool checkpointer_await_create(checkpointer *ck, rpc_call *call, const variable *v,
                               const Psd__V1__CreateVariableReply *rep)
{
    create_wait w = {
        .call = call,
        .gen = v->create_gen,
        .server = rep->shard ? rep->shard->server : ck->st->task_index,
        .offset = rep->shard ? rep->shard->offset : 0,
        .count = rep->shard ? rep->shard->count : 0,
        .staleness = rep->staleness,
        .created = rep->created,
    };
    return await_gen(ck, call, &w, "variable", v->name);
}

bool checkpointer_await_table_create(checkpointer *ck, rpc_call *call, uint64_t gen,
                                     const char *name, bool created)
{
    create_wait w = {.call = call, .gen = gen, .created = created, .table = true};
    return await_gen(ck, call, &w, "table", name);
}

static bool await_gen(checkpointer *ck, rpc_call *call, const create_wait *wait, const char *kind,
                      const char *name)
{
    pthread_mutex_lock(&ck->lock);
    if (wait->gen <= ck->durable_gen) {
        pthread_mutex_unlock(&ck->lock);
        return false;
    }
    if (ck->stop || !ck->running) {
        pthread_mutex_unlock(&ck->lock);
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "server is shutting down before %s \"%.200s\" was durable", kind, name);
        return true;
    }
    if (ck->ncwait == ck->cwcap) {
        size_t nc = ck->cwcap ? 2 * ck->cwcap : 8;
        create_wait *nw = realloc(ck->cwait, nc * sizeof(*nw));
        if (nw == NULL) {
            pthread_mutex_unlock(&ck->lock);
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                            "out of memory waiting for a checkpoint of %s \"%.200s\"", kind, name);
            return true;
        }
        ck->cwait = nw;
        ck->cwcap = nc;
    }
    if (rpc_call_defer(call) != 0) {
        pthread_mutex_unlock(&ck->lock);
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "%s \"%.200s\" is not durable yet and too many calls wait on this "
                        "server to wait for its checkpoint: retry",
                        kind, name);
        return true;
    }
    ck->cwait[ck->ncwait++] = *wait;
    pthread_cond_signal(&ck->cond);
    pthread_mutex_unlock(&ck->lock);
    return true;
}

static void *ck_thread(void *arg)
{
    checkpointer *ck = arg;
    pthread_mutex_lock(&ck->lock);
    for (;;) {
        bool due = false;
        uint64_t now = time_now_ns();
        uint64_t updates = atomic_load(&ck->st->updates_applied);
        if (ck->interval_s > 0 && now - ck->last_ns >= (uint64_t)ck->interval_s * 1000000000ull) {
            variable **vars;
            size_t nv = store_list(ck->st->vars, &vars);
            store_list_release(vars, nv);
            if (updates != ck->last_updates || nv != ck->last_nvars)
                due = true;
            else
                ck->last_ns = now; /* nothing changed: wait another interval */
        }
        if (ck->interval_updates > 0 &&
            updates - ck->last_updates >= (uint64_t)ck->interval_updates)
            due = true;
        if (ck->ncwait > 0)
            due = true;
        if (ck->nqueue == 0 && !due) {
            if (ck->stop)
                break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 100 * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&ck->cond, &ck->lock, &ts);
            continue;
        }
        rpc_call **batch = ck->queue;
        size_t nb = ck->nqueue;
        ck->queue = NULL;
        ck->nqueue = ck->qcap = 0;
        create_wait *cw = ck->cwait;
        size_t ncw = ck->ncwait;
        ck->cwait = NULL;
        ck->ncwait = ck->cwcap = 0;
        pthread_mutex_unlock(&ck->lock);
        checkpoint_info info;
        char err[1024];
        int rc = checkpoint_write(ck, &info, err, sizeof(err));
        if (rc != 0) {
            log_error("checkpoint failed: %s", err);
            pthread_mutex_lock(&ck->lock);
            ck->last_ns = time_now_ns(); /* retry at the next interval, not at once */
            ck->last_updates = atomic_load(&ck->st->updates_applied);
            pthread_mutex_unlock(&ck->lock);
        }
        reply_batch(batch, nb, rc, &info, err);
        free(batch);
        reply_creates(ck, cw, ncw, rc, err); /* all made before the snapshot: in it */
        free(cw);
        /* Creates parked during the write whose variable the snapshot held anyway. */
        pthread_mutex_lock(&ck->lock);
        size_t kept = 0, ndone = 0;
        create_wait done[16];
        for (size_t i = 0; i < ck->ncwait; i++) {
            if (rc == 0 && ck->cwait[i].gen <= ck->durable_gen && ndone < 16)
                done[ndone++] = ck->cwait[i];
            else
                ck->cwait[kept++] = ck->cwait[i];
        }
        ck->ncwait = kept;
        pthread_mutex_unlock(&ck->lock);
        reply_creates(ck, done, ndone, 0, "");
        pthread_mutex_lock(&ck->lock);
    }
    pthread_mutex_unlock(&ck->lock);
    return NULL;
}

int checkpointer_start(checkpointer *ck, char *err, size_t errlen)
{
    int e = pthread_create(&ck->thread, NULL, ck_thread, ck);
    if (e != 0)
        return errf(err, errlen, "cannot start the checkpoint thread: %s", strerror(e));
    ck->running = true;
    atomic_store(&ck->st->ck, ck);
    return 0;
}

checkpointer *checkpointer_of(const server_state *st)
{
    return atomic_load(&((server_state *)st)->ck);
}

void checkpointer_request(checkpointer *ck, rpc_call *call)
{
    pthread_mutex_lock(&ck->lock);
    if (ck->stop || !ck->running) {
        pthread_mutex_unlock(&ck->lock);
        rpc_reply_error(call, STATUS_UNAVAILABLE, "server is shutting down");
        return;
    }
    if (ck->nqueue == ck->qcap) {
        size_t nc = ck->qcap ? 2 * ck->qcap : 8;
        rpc_call **nq = realloc(ck->queue, nc * sizeof(*nq));
        if (nq == NULL) {
            pthread_mutex_unlock(&ck->lock);
            rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED, "out of memory queueing a checkpoint");
            return;
        }
        ck->queue = nq;
        ck->qcap = nc;
    }
    if (rpc_call_defer(call) != 0) {
        pthread_mutex_unlock(&ck->lock);
        rpc_reply_error(call, STATUS_RESOURCE_EXHAUSTED,
                        "too many calls waiting on this server to queue a checkpoint");
        return;
    }
    ck->queue[ck->nqueue++] = call;
    pthread_cond_signal(&ck->cond);
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_stop(checkpointer *ck)
{
    if (ck == NULL || !ck->running)
        return;
    pthread_mutex_lock(&ck->lock);
    ck->stop = true;
    pthread_cond_signal(&ck->cond);
    pthread_mutex_unlock(&ck->lock);
    pthread_join(ck->thread, NULL); /* answers what is queued first */
    checkpointer *expect = ck;
    atomic_compare_exchange_strong(&ck->st->ck, &expect, NULL);
    pthread_mutex_lock(&ck->lock);
    ck->running = false;
    pthread_mutex_unlock(&ck->lock);
}

void checkpointer_destroy(checkpointer *ck)
{
    if (ck == NULL)
        return;
    checkpointer_stop(ck);
    free(ck->queue);
    free(ck->cwait);
    free(ck->dir);
    pthread_mutex_destroy(&ck->write_lock);
    pthread_mutex_destroy(&ck->lock);
    pthread_cond_destroy(&ck->cond);
    free(ck);
}

/* ---- reading ---- */

typedef struct reader {
    FILE *f;
    const char *path;
    uLong crc;
    uint64_t pos;
    char *err;
    size_t errlen;
} reader;

static int r_get(reader *r, void *p, size_t n, const char *what)
{
    uint8_t *b = p;
    size_t left = n;
    while (left > 0) {
        size_t k = left < IO_CHUNK ? left : IO_CHUNK;
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

static int r_u32(reader *r, uint32_t *x, const char *what)
{
    return r_get(r, x, 4, what);
}
static int r_u64(reader *r, uint64_t *x, const char *what)
{
    return r_get(r, x, 8, what);
}

static int r_rec_end(reader *r, uint32_t type)
{
    uint32_t want = (uint32_t)r->crc, got;
    if (r_get(r, &got, 4, "a record's CRC"))
        return -1;
    if (got != want)
        return errf(r->err, r->errlen,
                    "bad CRC of record type %u ending at byte %" PRIu64
                    " (stored %08x, computed %08x)",
                    type, r->pos, got, want);
    return 0;
}

/* A table delta record, checked but not applied (its rows apply over the previous file's). */
typedef struct table_delta {
    char *name;
    uint8_t *spec;
    size_t spec_len;
    uint32_t row_floats, nparts;
    uint8_t *body; /* the partitions, as in the record */
    uint64_t body_len;
} table_delta;

/* What a file restores, before it is applied. */
typedef struct loaded {
    variable **vars;
    size_t nvars, cap;
    uint64_t *dedup;
    uint64_t dedup_clients;
    uint32_t dedup_words;
    uint64_t *floors; /* a dedup_export_floors array; NULL in a version 1 file */
    size_t nfloors;
    sync_worker_rec *workers;
    size_t nworkers;
    int64_t applied_min;
    int64_t frontier; /* SYNC_NO_FRONTIER without record 8 */
    bool have_sync;
    uint64_t bytes;
    table **tables; /* restored tables, not yet registered */
    uint8_t **table_specs;
    size_t *table_spec_lens;
    size_t ntables;
    table_delta *tdeltas; /* a delta file's table records 7 */
    size_t ntdeltas;
    uint64_t prev; /* a delta file: the previous file of its chain (0: a full file) */
    bool has_pos;  /* record 9 */
    uint64_t pos_epoch, pos_lsn;
} loaded;

static void loaded_free(loaded *l)
{
    for (size_t i = 0; i < l->nvars; i++)
        variable_destroy(l->vars[i]);
    free(l->vars);
    free(l->dedup);
    free(l->floors);
    free(l->workers);
    for (size_t i = 0; i < l->ntables; i++) {
        table_destroy(l->tables[i]);
        free(l->table_specs[i]);
    }
    free(l->tables);
    free(l->table_specs);
    free(l->table_spec_lens);
    for (size_t i = 0; i < l->ntdeltas; i++) {
        free(l->tdeltas[i].name);
        free(l->tdeltas[i].spec);
        free(l->tdeltas[i].body);
    }
    free(l->tdeltas);
    memset(l, 0, sizeof(*l));
}

static int read_var(reader *r, const server_state *st, uint32_t flags, uint64_t len, loaded *l)
{
    bool initial = (flags & CKPT_VAR_INITIAL) != 0;
    if ((flags & ~(uint32_t)CKPT_VAR_INITIAL) != 0)
        return errf(r->err, r->errlen, "variable record at byte %" PRIu64 ": unknown flags %08x",
                    r->pos, flags);
    uint32_t meta;
    if (r_u32(r, &meta, "a variable record") != 0)
        return -1;
    if (meta < 56 || meta > META_MAX || meta > len - 4)
        return errf(r->err, r->errlen, "variable record at byte %" PRIu64 ": bad meta size %u",
                    r->pos, meta);
    uint8_t *m = malloc(meta);
    if (m == NULL)
        return errf(r->err, r->errlen, "out of memory");
    if (r_get(r, m, meta, "a variable record") != 0) {
        free(m);
        return -1;
    }
    uint64_t numel, offset, count, version;
    uint32_t stal, nslots, has_agg, agg_count, agg_words, spec_len;
    memcpy(&numel, m, 8);
    memcpy(&offset, m + 8, 8);
    memcpy(&count, m + 16, 8);
    memcpy(&version, m + 24, 8);
    memcpy(&stal, m + 32, 4);
    memcpy(&nslots, m + 36, 4);
    memcpy(&has_agg, m + 40, 4);
    memcpy(&agg_count, m + 44, 4);
    memcpy(&agg_words, m + 48, 4);
    memcpy(&spec_len, m + 52, 4);
    if (spec_len != meta - 56 || nslots > OPTIMIZER_MAX_SLOTS || has_agg > 1 ||
        (has_agg && agg_words != AGG_WORDS) || offset > numel || count > numel - offset ||
        (initial && (has_agg || version != 0 || len != 4 + (uint64_t)meta)) ||
        (!initial && len != 4 + (uint64_t)meta + count * 4 * (1 + nslots + has_agg) +
                                (has_agg ? (uint64_t)agg_words * 8 : 0))) {
        free(m);
        return errf(r->err, r->errlen,
                    "variable record ending at byte %" PRIu64 ": inconsistent sizes", r->pos);
    }
    Psd__V1__VariableSpec *spec = psd__v1__variable_spec__unpack(NULL, spec_len, m + 56);
    free(m);
    if (spec == NULL)
        return errf(r->err, r->errlen, "variable record at byte %" PRIu64 ": bad spec", r->pos);
    char verr[512];
    /* An initial one is made again by its initializer (a pure function of the spec). */
    variable *v = initial
                      ? variable_create(spec, numel, offset, count, verr, sizeof(verr))
                      : variable_create_unfilled(spec, numel, offset, count, verr, sizeof(verr));
    int rc = 0;
    if (v == NULL)
        rc = errf(r->err, r->errlen, "variable \"%s\": %s", spec->name, verr);
    else if (v->nslots != nslots)
        rc = errf(r->err, r->errlen, "variable \"%s\": %u optimizer slots stored, %zu expected",
                  spec->name, nslots, v->nslots);
    else if (spec->num_servers != st->num_servers)
        rc = errf(r->err, r->errlen, "variable \"%s\": placed for %u servers, this cluster has %u",
                  spec->name, spec->num_servers, st->num_servers);
    psd__v1__variable_spec__free_unpacked(spec, NULL);
    if (rc != 0) {
        variable_destroy(v);
        return -1;
    }
    if (l->nvars == l->cap) {
        size_t nc = l->cap ? 2 * l->cap : 16;
        variable **nv = realloc(l->vars, nc * sizeof(*nv));
        if (nv == NULL) {
            variable_destroy(v);
            return errf(r->err, r->errlen, "out of memory");
        }
        l->vars = nv;
        l->cap = nc;
    }
    l->vars[l->nvars++] = v; /* freed with l from here on */
    atomic_store(&v->version, version);
    v->staleness = (int32_t)stal;
    if (initial)
        return 0;
    if (r_get(r, v->params, (size_t)count * 4, "parameters"))
        return -1;
    for (size_t i = 0; i < nslots; i++)
        if (r_get(r, v->slots[i], (size_t)count * 4, "optimizer slots"))
            return -1;
    if (has_agg) {
        v->agg = malloc((count ? (size_t)count : 1) * sizeof(float));
        v->agg_workers = calloc(AGG_WORDS, sizeof(uint64_t));
        if (v->agg == NULL || v->agg_workers == NULL)
            return errf(r->err, r->errlen, "out of memory for a BSP aggregate");
        v->agg_words = AGG_WORDS;
        v->agg_count = (int)agg_count;
        if (r_get(r, v->agg, (size_t)count * 4, "a BSP aggregate") ||
            r_get(r, v->agg_workers, AGG_WORDS * 8, "a BSP aggregate"))
            return -1;
        atomic_store(&v->agg_ready, true); /* not yet shared: variable_agg_ensure has no work */
    }
    return 0;
}

/* Rows' update times are wall-clock ms (ttl_ms counts from them); files of older servers hold
 * monotonic ones, far below any wall-clock time of this century: such a row's age starts again
 * at the restore. */
static int64_t row_time(int64_t updated_ms)
{
    return updated_ms < 1000000000000 ? (int64_t)time_wall_ms() : updated_ms;
}

static int read_table(reader *r, server_state *st, uint64_t len, loaded *l)
{
    uint32_t spec_len, row_floats, pad;
    uint64_t rows;
    if (len < 20 || r_u32(r, &spec_len, "a table record"))
        return -1;
    if (spec_len > META_MAX || spec_len > len - 20)
        return errf(r->err, r->errlen, "table record at byte %" PRIu64 ": bad spec size %u", r->pos,
                    spec_len);
    uint8_t *spec = malloc(spec_len ? spec_len : 1);
    table **nt = realloc(l->tables, (l->ntables + 1) * sizeof(*nt));
    if (nt)
        l->tables = nt;
    uint8_t **ns = realloc(l->table_specs, (l->ntables + 1) * sizeof(*ns));
    if (ns)
        l->table_specs = ns;
    size_t *nl = realloc(l->table_spec_lens, (l->ntables + 1) * sizeof(*nl));
    if (nl)
        l->table_spec_lens = nl;
    if (spec == NULL || nt == NULL || ns == NULL || nl == NULL) {
        free(spec);
        return errf(r->err, r->errlen, "out of memory");
    }
    if (r_get(r, spec, spec_len, "a table record")) {
        free(spec);
        return -1;
    }
    table *t = NULL;
    char terr[512];
    if (server_table_make(st, spec, spec_len, &t, terr, sizeof(terr)) != 0) {
        free(spec);
        return errf(r->err, r->errlen, "table record at byte %" PRIu64 ": %s", r->pos, terr);
    }
    l->tables[l->ntables] = t; /* freed with l from here on */
    l->table_specs[l->ntables] = spec;
    l->table_spec_lens[l->ntables] = spec_len;
    l->ntables++;
    if (r_u32(r, &row_floats, "a table record") || r_u32(r, &pad, "a table record") ||
        r_u64(r, &rows, "a table record"))
        return -1;
    uint64_t per = 16 + 4 * (uint64_t)row_floats;
    if (row_floats != table_row_floats(t) || pad != 0 || rows > (len - 20 - spec_len) / per ||
        len != 20 + spec_len + rows * per)
        return errf(r->err, r->errlen,
                    "table \"%s\" ending at byte %" PRIu64 ": inconsistent sizes", table_name(t),
                    r->pos);
    float *row = malloc((size_t)row_floats * 4);
    if (row == NULL)
        return errf(r->err, r->errlen, "out of memory");
    for (uint64_t i = 0; i < rows; i++) {
        uint64_t id, upd;
        if (r_u64(r, &id, "a table row") || r_u64(r, &upd, "a table row") ||
            r_get(r, row, (size_t)row_floats * 4, "a table row")) {
            free(row);
            return -1;
        }
        int rc = table_insert_row(t, (int64_t)id, row, row_time((int64_t)upd));
        if (rc != TABLE_OK) {
            free(row);
            return errf(r->err, r->errlen, "table \"%s\": row %" PRId64 " could not be restored%s",
                        table_name(t), (int64_t)id,
                        rc == TABLE_LIMIT ? " within max-server-bytes or max_rows"
                                          : " (out of memory)");
        }
    }
    free(row);
    return 0;
}

/* Reads a table delta record (checked, kept for apply_delta). */
static int read_table_delta(reader *r, uint64_t len, loaded *l)
{
    uint32_t spec_len;
    if (len < 12 || r_u32(r, &spec_len, "a table delta record"))
        return -1;
    if (spec_len > META_MAX || spec_len > len - 12)
        return errf(r->err, r->errlen, "table delta record at byte %" PRIu64 ": bad spec size %u",
                    r->pos, spec_len);
    table_delta *nd = realloc(l->tdeltas, (l->ntdeltas + 1) * sizeof(*nd));
    if (nd == NULL)
        return errf(r->err, r->errlen, "out of memory");
    l->tdeltas = nd;
    table_delta *d = &l->tdeltas[l->ntdeltas];
    memset(d, 0, sizeof(*d));
    l->ntdeltas++; /* freed with l from here on */
    d->spec_len = spec_len;
    d->body_len = len - 12 - spec_len;
    d->spec = malloc(spec_len ? spec_len : 1);
    d->body = malloc(d->body_len ? (size_t)d->body_len : 1);
    if (d->spec == NULL || d->body == NULL)
        return errf(r->err, r->errlen, "out of memory for a table delta of %" PRIu64 " bytes", len);
    if (r_get(r, d->spec, spec_len, "a table delta record") ||
        r_u32(r, &d->row_floats, "a table delta record") ||
        r_u32(r, &d->nparts, "a table delta record") ||
        r_get(r, d->body, (size_t)d->body_len, "a table delta record"))
        return -1;
    Psd__V1__TableSpec *ts = psd__v1__table_spec__unpack(NULL, spec_len, d->spec);
    if (ts == NULL || ts->name == NULL || (d->name = strdup(ts->name)) == NULL) {
        if (ts)
            psd__v1__table_spec__free_unpacked(ts, NULL);
        return errf(r->err, r->errlen,
                    "table delta record ending at byte %" PRIu64 ": its spec does not decode",
                    r->pos);
    }
    psd__v1__table_spec__free_unpacked(ts, NULL);
    /* The partitions must fill the record exactly. */
    uint64_t per = 16 + 4 * (uint64_t)d->row_floats, off = 0;
    for (uint32_t p = 0; p < d->nparts; p++) {
        uint32_t flags, pad;
        uint64_t nrem, nrows;
        if (d->row_floats == 0 || d->row_floats > (1u << 24) || d->body_len - off < 24)
            goto bad;
        memcpy(&flags, d->body + off, 4);
        memcpy(&pad, d->body + off + 4, 4);
        memcpy(&nrem, d->body + off + 8, 8);
        memcpy(&nrows, d->body + off + 16, 8);
        off += 24;
        if ((flags & ~(uint32_t)CKPT_PART_WHOLE) != 0 || pad != 0 || nrem > (d->body_len - off) / 8)
            goto bad;
        off += nrem * 8;
        if (nrows > (d->body_len - off) / per)
            goto bad;
        off += nrows * per;
    }
    if (d->nparts == 0 || d->nparts > TABLE_MAX_PARTITIONS || off != d->body_len)
        goto bad;
    return 0;
bad:
    return errf(r->err, r->errlen,
                "table delta of \"%s\" ending at byte %" PRIu64 ": inconsistent sizes", d->name,
                r->pos);
}

/* Reads a whole file into l. Returns 0, -1 (damaged: err says why) or CKPT_REFUSED. */
static int read_file_ckpt(const char *path, const server_state *st, uint64_t cluster_hash,
                          uint64_t name_seq, loaded *l, uint64_t *seq_out, char *err, size_t errlen)
{
    memset(l, 0, sizeof(*l));
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return errf(err, errlen, "cannot open: %s", strerror(errno));
    setvbuf(f, NULL, _IOFBF, 1 << 20);
    reader r = {.f = f, .path = path, .err = err, .errlen = errlen};
    uint8_t hdr[CKPT_HEADER_SIZE];
    int rc = -1;
    if (r_get(&r, hdr, sizeof(hdr), "the header"))
        goto out;
    if (memcmp(hdr, CKPT_MAGIC, 8) != 0) {
        errf(err, errlen, "bad magic (not a psd checkpoint)");
        goto out;
    }
    uint32_t ver, hsize, nserv, task, hcrc;
    uint64_t hash, seq;
    memcpy(&ver, hdr + 8, 4);
    memcpy(&hsize, hdr + 12, 4);
    memcpy(&nserv, hdr + 16, 4);
    memcpy(&task, hdr + 20, 4);
    memcpy(&hash, hdr + 24, 8);
    memcpy(&seq, hdr + 32, 8);
    memcpy(&hcrc, hdr + 60, 4);
    if (hcrc != (uint32_t)crc32(0L, hdr, 60)) {
        errf(err, errlen, "bad header CRC");
        goto out;
    }
    if (ver < CKPT_FORMAT_VERSION_MIN || ver > CKPT_FORMAT_DELTA || hsize != CKPT_HEADER_SIZE) {
        errf(err, errlen,
             "format version %u (header %u bytes); this server reads versions %u to %u", ver, hsize,
             CKPT_FORMAT_VERSION_MIN, CKPT_FORMAT_DELTA);
        goto out;
    }
    memcpy(&l->prev, hdr + 48, 8);
    if ((ver == CKPT_FORMAT_DELTA) != (l->prev != 0) || l->prev >= name_seq) {
        errf(err, errlen, "header of a %s names previous file %" PRIu64,
             ver == CKPT_FORMAT_DELTA ? "delta" : "full checkpoint", l->prev);
        goto out;
    }
    if (nserv != st->num_servers || task != st->task_index) {
        errf(err, errlen,
             "made for ps %u of a cluster of %u ps tasks, but this server is ps %u of %u: "
             "refusing to restore it (move it away or fix the cluster spec)",
             task, nserv, st->task_index, st->num_servers);
        rc = CKPT_REFUSED;
        goto out;
    }
    if (seq != name_seq) {
        errf(err, errlen, "header says sequence %" PRIu64 ", the file name %" PRIu64, seq,
             name_seq);
        goto out;
    }
    if (hash != cluster_hash)
        log_warn("%s was made with other ps addresses (same number of tasks): restoring it", path);
    uint64_t nrec = 0, total = 0;
    for (;;) {
        uint32_t type, flags;
        uint64_t len;
        r.crc = crc32(0L, Z_NULL, 0);
        if (r_u32(&r, &type, "a record header") || r_u32(&r, &flags, "a record header") ||
            r_u64(&r, &len, "a record header"))
            goto out;
        if (type == CKPT_REC_VARIABLE) {
            if (read_var(&r, st, flags, len, l))
                goto out;
        } else if (type == CKPT_REC_TABLE && flags == 0) {
            if (read_table(&r, (server_state *)st, len, l))
                goto out;
        } else if (type == CKPT_REC_TABLE_DELTA && flags == 0 && ver == CKPT_FORMAT_DELTA) {
            if (read_table_delta(&r, len, l))
                goto out;
        } else if (type == CKPT_REC_DEDUP) {
            uint32_t words, pad;
            if (len < 8 || r_u32(&r, &words, "the dedup table") ||
                r_u32(&r, &pad, "the dedup table"))
                goto out;
            uint64_t per = (2 + (uint64_t)words) * 8;
            if (words == 0 || words > (1u << 20) || (len - 8) % per != 0) {
                errf(err, errlen, "dedup record at byte %" PRIu64 ": bad sizes", r.pos);
                goto out;
            }
            l->dedup_clients = (len - 8) / per;
            l->dedup_words = words;
            free(l->dedup);
            l->dedup = malloc(len - 8 ? (size_t)(len - 8) : 1);
            if (l->dedup == NULL) {
                errf(err, errlen, "out of memory for the dedup table");
                goto out;
            }
            if (r_get(&r, l->dedup, (size_t)(len - 8), "the dedup table"))
                goto out;
        } else if (type == CKPT_REC_DEDUP_FLOORS && ver >= 2) {
            if (len % 8 != 0 || len > ((uint64_t)1 << 34)) {
                errf(err, errlen, "dedup tombstone record at byte %" PRIu64 ": bad size", r.pos);
                goto out;
            }
            free(l->floors);
            l->floors = malloc(len ? (size_t)len : 1);
            if (l->floors == NULL) {
                errf(err, errlen, "out of memory for the dedup tombstones");
                goto out;
            }
            l->nfloors = (size_t)(len / 8);
            if (r_get(&r, l->floors, (size_t)len, "the dedup tombstones"))
                goto out;
        } else if (type == CKPT_REC_SYNC) {
            uint64_t amin, nw;
            if (len < 16 || r_u64(&r, &amin, "the clock table") ||
                r_u64(&r, &nw, "the clock table"))
                goto out;
            if (nw > SERVER_MAX_WORKERS || len != 16 + nw * 16) {
                errf(err, errlen, "clock record at byte %" PRIu64 ": bad sizes", r.pos);
                goto out;
            }
            free(l->workers);
            l->workers = calloc(nw ? nw : 1, sizeof(*l->workers));
            if (l->workers == NULL) {
                errf(err, errlen, "out of memory");
                goto out;
            }
            for (uint64_t i = 0; i < nw; i++) {
                uint32_t id, fl;
                uint64_t clock;
                if (r_u32(&r, &id, "the clock table") || r_u32(&r, &fl, "the clock table") ||
                    r_u64(&r, &clock, "the clock table"))
                    goto out;
                l->workers[i] = (sync_worker_rec){.id = (int32_t)id,
                                                  .clock = (int64_t)clock,
                                                  .known = fl & 1,
                                                  .live = (fl & 2) != 0};
            }
            l->nworkers = (size_t)nw;
            l->applied_min = (int64_t)amin;
            l->frontier = SYNC_NO_FRONTIER; /* unless record 8 follows */
            l->have_sync = true;
        } else if (type == CKPT_REC_SYNC_OUT) {
            uint64_t fr, nl;
            if (!l->have_sync || len < 16 || r_u64(&r, &fr, "the clock table") ||
                r_u64(&r, &nl, "the clock table"))
                goto out;
            if (nl > l->nworkers || len != 16 + nl * 16) {
                errf(err, errlen, "clock record at byte %" PRIu64 ": bad sizes", r.pos);
                goto out;
            }
            for (uint64_t i = 0; i < nl; i++) {
                uint32_t id, zero;
                uint64_t client;
                if (r_u32(&r, &id, "the clock table") || r_u32(&r, &zero, "the clock table") ||
                    r_u64(&r, &client, "the clock table"))
                    goto out;
                for (size_t k = 0; k < l->nworkers; k++)
                    if (l->workers[k].id == (int32_t)id) {
                        l->workers[k].left = true;
                        l->workers[k].left_client = client;
                    }
            }
            l->frontier = (int64_t)fr;
        } else if (type == CKPT_REC_REPLICA) {
            if (len != 16 || r_u64(&r, &l->pos_epoch, "the replica position") ||
                r_u64(&r, &l->pos_lsn, "the replica position"))
                goto out;
            l->has_pos = true;
        } else if (type == CKPT_REC_END) {
            uint64_t en, et;
            if (len != 16 || r_u64(&r, &en, "the end record") || r_u64(&r, &et, "the end record"))
                goto out;
            if (r_rec_end(&r, type))
                goto out;
            if (en != nrec || et != total) {
                errf(err, errlen,
                     "end record counts %" PRIu64 " records of %" PRIu64 " bytes, file has %" PRIu64
                     " of %" PRIu64,
                     en, et, nrec, total);
                goto out;
            }
            break;
        } else {
            errf(err, errlen, "unknown record type %u at byte %" PRIu64, type, r.pos);
            goto out;
        }
        if (r_rec_end(&r, type))
            goto out;
        nrec++;
        total += len;
    }
    int extra = fgetc(f);
    if (extra != EOF) {
        errf(err, errlen, "data after the end record at byte %" PRIu64, r.pos);
        goto out;
    }
    l->bytes = r.pos;
    *seq_out = seq;
    rc = 0;
out:
    fclose(f);
    if (rc != 0)
        loaded_free(l);
    return rc;
}

static int apply_loaded(server_state *st, loaded *l, char *err, size_t errlen)
{
    for (size_t i = 0; i < l->ntables; i++) {
        if (server_table_register(st, l->tables[i], l->table_specs[i], l->table_spec_lens[i]))
            return errf(err, errlen, "table \"%s\" appears twice (or out of memory)",
                        table_name(l->tables[i]));
        l->tables[i] = NULL; /* the server owns it */
    }
    for (size_t i = 0; i < l->nvars; i++) {
        variable *v = l->vars[i];
        variable *in = store_insert(st->vars, v);
        variable_release(in); /* the store keeps its own reference */
        if (in != v)
            return errf(err, errlen, "variable \"%s\" appears twice", v->name);
        l->vars[i] = NULL; /* the store owns it */
    }
    size_t per = 2 + (size_t)l->dedup_words;
    for (uint64_t i = 0; i < l->dedup_clients; i++) {
        const uint64_t *e = l->dedup + i * per;
        if (dedup_import(st->dedup, e[0], e[1], e + 2, l->dedup_words) != 0)
            return errf(err, errlen, "out of memory restoring the dedup table");
    }
    if (l->floors) {
        int rc = dedup_import_floors(st->dedup, l->floors, l->nfloors);
        if (rc != 0)
            return errf(err, errlen, "%s",
                        rc == -2 ? "out of memory restoring the dedup tombstones"
                                 : "malformed dedup tombstone record");
    }
    if (l->have_sync)
        sync_import(st, l->workers, l->nworkers, l->applied_min, l->frontier);
    return 0;
}

static long loaded_find_table(const loaded *l, const char *name)
{
    for (size_t i = 0; i < l->ntables; i++)
        if (l->tables[i] && strcmp(table_name(l->tables[i]), name) == 0)
            return (long)i;
    return -1;
}

static void loaded_drop_table(loaded *l, size_t i)
{
    table_destroy(l->tables[i]);
    free(l->table_specs[i]);
    l->tables[i] = l->tables[l->ntables - 1];
    l->table_specs[i] = l->table_specs[l->ntables - 1];
    l->table_spec_lens[i] = l->table_spec_lens[l->ntables - 1];
    l->ntables--;
}

/* Applies one partition segment list of a table delta to t. Returns 0 or -1 (err). */
static int apply_table_delta(table *t, const table_delta *d, char *err, size_t errlen)
{
    uint64_t per = 16 + 4 * (uint64_t)d->row_floats, off = 0;
    float *row = malloc((size_t)d->row_floats * 4);
    if (row == NULL)
        return errf(err, errlen, "out of memory");
    for (uint32_t p = 0; p < d->nparts; p++) {
        uint32_t flags;
        uint64_t nrem, nrows;
        memcpy(&flags, d->body + off, 4);
        memcpy(&nrem, d->body + off + 8, 8);
        memcpy(&nrows, d->body + off + 16, 8);
        off += 24;
        if (flags & CKPT_PART_WHOLE)
            table_partition_clear(t, p);
        for (uint64_t i = 0; i < nrem; i++, off += 8) {
            int64_t id;
            memcpy(&id, d->body + off, 8);
            table_remove(t, &id, 1);
        }
        for (uint64_t i = 0; i < nrows; i++, off += per) {
            int64_t id, upd;
            memcpy(&id, d->body + off, 8);
            memcpy(&upd, d->body + off + 8, 8);
            memcpy(row, d->body + off + 16, (size_t)d->row_floats * 4);
            int rc = table_insert_row(t, id, row, row_time(upd));
            if (rc != TABLE_OK) {
                free(row);
                return errf(err, errlen, "table \"%s\": row %" PRId64 " could not be restored%s",
                            d->name, id,
                            rc == TABLE_LIMIT ? " within max-server-bytes or max_rows"
                                              : " (out of memory)");
            }
        }
    }
    free(row);
    return 0;
}

/* Applies delta file d over l (the state of the previous file of the chain): tables as d
 * says (changed rows, removed ids, new and deleted tables), everything else replaced by d's.
 * Returns 0, or -1 with a message: a table delta without its base (nothing applied), or a
 * row that does not fit (l then half applied: the restore fails). d is emptied. */
static int apply_delta(loaded *l, loaded *d, char *err, size_t errlen)
{
    for (size_t i = 0; i < d->ntdeltas; i++) {
        const table_delta *td = &d->tdeltas[i];
        long b = loaded_find_table(l, td->name);
        if (b < 0)
            return errf(err, errlen, "table \"%s\" changed in the delta but absent before it",
                        td->name);
        if (l->table_spec_lens[b] != td->spec_len ||
            memcmp(l->table_specs[b], td->spec, td->spec_len) != 0 ||
            table_row_floats(l->tables[b]) != td->row_floats ||
            table_partitions(l->tables[b]) != td->nparts)
            return errf(err, errlen,
                        "table \"%s\": the delta's spec differs from the one before it", td->name);
    }
    /* Deleted tables (in neither list of d) and tables d holds whole go. */
    for (size_t i = 0; i < l->ntables;) {
        const char *name = table_name(l->tables[i]);
        bool changed = false;
        for (size_t k = 0; k < d->ntdeltas && !changed; k++)
            changed = strcmp(d->tdeltas[k].name, name) == 0;
        if (changed)
            i++;
        else
            loaded_drop_table(l, i);
    }
    for (size_t i = 0; i < d->ntables; i++) {
        table **nt = realloc(l->tables, (l->ntables + 1) * sizeof(*nt));
        if (nt)
            l->tables = nt;
        uint8_t **ns = realloc(l->table_specs, (l->ntables + 1) * sizeof(*ns));
        if (ns)
            l->table_specs = ns;
        size_t *nl = realloc(l->table_spec_lens, (l->ntables + 1) * sizeof(*nl));
        if (nl)
            l->table_spec_lens = nl;
        if (nt == NULL || ns == NULL || nl == NULL)
            return errf(err, errlen, "out of memory");
        l->tables[l->ntables] = d->tables[i];
        l->table_specs[l->ntables] = d->table_specs[i];
        l->table_spec_lens[l->ntables] = d->table_spec_lens[i];
        l->ntables++;
        d->tables[i] = NULL;
        d->table_specs[i] = NULL;
    }
    d->ntables = 0;
    for (size_t i = 0; i < d->ntdeltas; i++) {
        long b = loaded_find_table(l, d->tdeltas[i].name);
        if (b < 0 || apply_table_delta(l->tables[b], &d->tdeltas[i], err, errlen) != 0)
            return b < 0
                       ? errf(err, errlen, "internal error: table \"%s\" lost", d->tdeltas[i].name)
                       : -1;
    }
    /* The rest of the state is d's. */
    for (size_t i = 0; i < l->nvars; i++)
        variable_destroy(l->vars[i]);
    free(l->vars);
    free(l->dedup);
    free(l->floors);
    free(l->workers);
    l->vars = d->vars;
    l->nvars = d->nvars;
    l->cap = d->cap;
    l->dedup = d->dedup;
    l->dedup_clients = d->dedup_clients;
    l->dedup_words = d->dedup_words;
    l->floors = d->floors;
    l->nfloors = d->nfloors;
    l->workers = d->workers;
    l->nworkers = d->nworkers;
    l->applied_min = d->applied_min;
    l->frontier = d->frontier;
    l->have_sync = d->have_sync;
    l->has_pos = d->has_pos; /* the delta's position: the newest */
    l->pos_epoch = d->pos_epoch;
    l->pos_lsn = d->pos_lsn;
    l->bytes += d->bytes;
    l->prev = d->prev;
    d->vars = NULL;
    d->nvars = d->cap = 0;
    d->dedup = NULL;
    d->floors = NULL;
    d->workers = NULL;
    return 0;
}

/* The previous file a checkpoint's header names (0: a full checkpoint). Returns 0, or -1 with
 * a message when the header can't be read or is damaged. */
static int peek_prev(const char *path, uint64_t *prev, char *err, size_t errlen)
{
    uint8_t hdr[CKPT_HEADER_SIZE];
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return errf(err, errlen, "cannot open: %s", strerror(errno));
    size_t got = fread(hdr, 1, sizeof(hdr), f);
    fclose(f);
    uint32_t hcrc;
    memcpy(&hcrc, hdr + 60, 4);
    if (got != sizeof(hdr) || memcmp(hdr, CKPT_MAGIC, 8) != 0 ||
        hcrc != (uint32_t)crc32(0L, hdr, 60))
        return errf(err, errlen, "bad or truncated header");
    memcpy(prev, hdr + 48, 8);
    return 0;
}

int checkpoint_restore(server_state *st, const checkpoint_config *cfg, checkpoint_info *info,
                       uint64_t *max_seq, char *err, size_t errlen)
{
    memset(info, 0, sizeof(*info));
    *max_seq = 0;
    struct stat sb;
    if (stat(cfg->dir, &sb) != 0 && errno == ENOENT)
        return CKPT_NONE;
    ckpt_file *files;
    long n = list_files(cfg->dir, st->task_index, true, &files, err, errlen);
    if (n < 0)
        return CKPT_FAILED;
    if (n == 0) {
        free(files);
        return CKPT_NONE;
    }
    *max_seq = files[0].seq;
    int rc = CKPT_FAILED;
    size_t off = 0;
    off += (size_t)snprintf(err, errlen, "no valid checkpoint of ps %u in %s:", st->task_index,
                            cfg->dir);
    /* bad[i]: files[i] can't be restored, nor any delta built on it. */
    bool *bad = calloc((size_t)n, sizeof(*bad));
    long *chain = calloc((size_t)n, sizeof(*chain));
    if (bad == NULL || chain == NULL) {
        free(bad);
        free(chain);
        free(files);
        errf(err, errlen, "out of memory listing checkpoints");
        return CKPT_FAILED;
    }
    for (long i = 0; i < n && rc == CKPT_FAILED; i++) {
        if (bad[i])
            continue;
        char path[4200], why[1024];
        /* The chain of files[i]: chain[0] = i, back to its full checkpoint chain[len-1]. */
        long len = 0, cur = i;
        bool broken = false;
        while (!broken) {
            chain[len++] = cur;
            uint64_t prev = 0;
            snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[cur].name);
            if (peek_prev(path, &prev, why, sizeof(why)) != 0) {
                broken = true;
                bad[cur] = true;
                break;
            }
            if (prev == 0)
                break;
            long j = cur + 1;
            while (j < n && files[j].seq != prev)
                j++;
            if (j == n || bad[j] || len == n) {
                snprintf(why, sizeof(why), "it is a delta of checkpoint %" PRIu64 ", which is %s",
                         prev, j == n ? "missing" : "unusable");
                broken = true;
                break;
            }
            cur = j;
        }
        snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[i].name);
        if (broken) {
            bad[i] = true;
            if (info->skipped == 0)
                info->skipped = files[i].seq;
            log_warn("checkpoint %s is unusable (%s)%s", path, why,
                     i + 1 < n ? ": trying the previous one" : "");
            if (off < errlen)
                off += (size_t)snprintf(err + off, errlen - off, " %s: %s;", files[i].name, why);
            continue;
        }
        uint64_t t0 = time_now_ns();
        long full = chain[len - 1];
        snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[full].name);
        loaded l;
        uint64_t seq = 0;
        int r = read_file_ckpt(path, st, cfg->cluster_hash, files[full].seq, &l, &seq, why,
                               sizeof(why));
        if (r == CKPT_REFUSED) {
            errf(err, errlen, "checkpoint %s: %s", path, why);
            rc = CKPT_REFUSED;
            break;
        }
        if (r == 0 && l.prev != 0) {
            loaded_free(&l);
            snprintf(why, sizeof(why), "its header changed while reading");
            r = -1;
        }
        if (r != 0) {
            bad[full] = true;
            bad[i] = true;
            if (info->skipped == 0)
                info->skipped = files[i].seq;
            log_warn("checkpoint %s is unusable (%s)%s", path, why,
                     i + 1 < n ? ": trying the previous one" : "");
            if (off < errlen)
                off += (size_t)snprintf(err + off, errlen - off, " %s: %s;", files[full].name, why);
            continue;
        }
        /* The deltas, oldest first; a damaged one ends the chain at the file before it. */
        long good = full;
        uint32_t deltas = 0;
        for (long k = len - 2; k >= 0 && rc == CKPT_FAILED; k--) {
            char dpath[4200];
            snprintf(dpath, sizeof(dpath), "%s/%s", cfg->dir, files[chain[k]].name);
            loaded d;
            uint64_t dseq = 0;
            int dr = read_file_ckpt(dpath, st, cfg->cluster_hash, files[chain[k]].seq, &d, &dseq,
                                    why, sizeof(why));
            if (dr == 0 && d.prev != files[good].seq) {
                loaded_free(&d);
                snprintf(why, sizeof(why), "its header names another previous file");
                dr = -1;
            }
            if (dr != 0) {
                log_warn("checkpoint delta %s is unusable (%s): restoring checkpoint %" PRIu64
                         " instead, the last consistent point of its chain; updates applied after "
                         "it are lost",
                         dpath, why, files[good].seq);
                info->skipped = files[chain[k]].seq;
                break;
            }
            int ar = apply_delta(&l, &d, why, sizeof(why));
            loaded_free(&d);
            if (ar != 0) {
                errf(err, errlen, "restoring %s over checkpoint %" PRIu64 ": %s", dpath,
                     files[good].seq, why);
                rc = CKPT_FAILED;
                loaded_free(&l);
                goto done;
            }
            good = chain[k];
            deltas++;
        }
        uint64_t versions = 0;
        for (size_t k = 0; k < l.nvars; k++)
            versions += atomic_load(&l.vars[k]->version);
        for (size_t k = 0; k < l.ntables; k++) {
            table_stats ts;
            table_stats_get(l.tables[k], &ts);
            info->table_rows += ts.rows;
        }
        snprintf(path, sizeof(path), "%s/%s", cfg->dir, files[good].name);
        if (apply_loaded(st, &l, why, sizeof(why)) != 0) {
            loaded_free(&l);
            errf(err, errlen, "restoring %s: %s", path, why);
            rc = CKPT_FAILED;
            break;
        }
        snprintf(info->path, sizeof(info->path), "%s", path);
        info->seq = files[good].seq;
        info->base = files[full].seq;
        info->deltas = deltas;
        info->versions = versions;
        info->bytes = l.bytes;
        info->variables = (uint32_t)l.nvars;
        info->ms = (time_now_ns() - t0) / 1000000u;
        info->has_position = l.has_pos;
        info->epoch = l.pos_epoch;
        info->lsn = l.pos_lsn;
        loaded_free(&l);
        rc = CKPT_RESTORED;
    }
done:
    free(bad);
    free(chain);
    free(files);
    return rc;
}
