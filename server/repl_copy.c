/* Rejoin copies: the primary streams an image of a group at a log position, made from a
 * checkpoint snapshot while updates go on (copy_serve); a backup that rejoins, or whose copy no
 * longer matches the log, fetches it into a file, installs it and catches up on the log after
 * it. */
#include "repl_group.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "ckpt_snapshot.h"
#include "log.h"
#include "methods.h"
#include "status.h"
#include "sync.h"
#include "timeutil.h"
#include "util.h"

/* Primary: a copy being streamed to a rejoining server. Its snapshot is taken while the
 * group's updates wait only as long as the store is frozen (ckpt_snapshot.h: the sparse tables
 * are copied afterwards, before anything changes them), at log position lsn; a thread then
 * writes it as a checkpoint image into a pipe, and each chunk the rejoiner asks for is read
 * from the pipe, so that the image is never whole in memory nor on disk and updates go on. */
typedef struct copy_image {
    ckpt_snapshot snap;
    int rfd, wfd; /* the pipe: the writer's end is closed by the writer when done */
    pthread_t writer;
    bool started;
    uint64_t total; /* bytes of the image (ckpt_file_size) */
    uint64_t pos;   /* bytes read from the pipe */
    uint64_t lsn, epoch;
    uint8_t *last; /* the chunk served last (at last_off), served again to a resend */
    size_t last_len, last_cap;
    uint64_t last_off;
    uint32_t num_servers, task;
    unsigned slow_ms;      /* failpoint copy-slow: the writer waits this long before the image */
    atomic_bool abandoned; /* freed before the writer began: it writes nothing */
    int wrc;               /* the writer's result (joined) */
    char werr[512];
} copy_image;

/* Failpoint copy-slow (test-failpoint, tests only): a copy's image takes this much longer to
 * make, as for a very large group. */
#define COPY_SLOW_MS 5000u

static void *copy_writer_main(void *arg)
{
    copy_image *ci = arg;
    sigset_t pipe_sig;
    sigemptyset(&pipe_sig);
    sigaddset(&pipe_sig, SIGPIPE); /* a rejoiner gone: EPIPE, not the signal */
    pthread_sigmask(SIG_BLOCK, &pipe_sig, NULL);
    for (unsigned waited = 0; waited < ci->slow_ms && !atomic_load(&ci->abandoned); waited += 50) {
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    ckpt_writer w = {
        .fd = ci->wfd, .path = "the copy stream", .err = ci->werr, .errlen = sizeof(ci->werr)};
    w.buf = malloc(CKPT_WBUF_SIZE);
    ckpt_file_id id = {.num_servers = ci->num_servers,
                       .task = ci->task,
                       .cluster_hash = repl.cfg.cluster_hash,
                       .seq = 1};
    if (w.buf == NULL)
        ci->wrc = errf(ci->werr, sizeof(ci->werr), "out of memory for the write buffer");
    else
        ci->wrc = ckpt_file_write(&w, &ci->snap, &id);
    free(w.buf);
    close(ci->wfd); /* the reader sees the end */
    ci->wfd = -1;
    ckpt_snapshot_free(&ci->snap); /* written: its memory goes back */
    return NULL;
}

void repl_copy_image_free(copy_image *ci)
{
    if (ci == NULL)
        return;
    atomic_store(&ci->abandoned, true);
    if (ci->rfd >= 0)
        close(ci->rfd); /* a writer still writing fails (EPIPE) and ends */
    if (ci->started)
        pthread_join(ci->writer, NULL);
    else
        ckpt_snapshot_free(&ci->snap);
    if (ci->wfd >= 0)
        close(ci->wfd);
    free(ci->last);
    free(ci);
}

/* What the position function of a copy's snapshot marks: the peer streamed to from the
 * snapshot's log position on. */
typedef struct copy_mark {
    rgroup *G;
    rpeer *p;
    uint64_t lsn, epoch;
} copy_mark;

/* checkpoint_position_fn of a copy: while the store is frozen the group's log stays still
 * (order); its position is noted and the peer is streamed to as catching up from there. The
 * image itself carries no position (record 9): the rejoiner is told it with the chunks. */
static bool copy_position(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn)
{
    copy_mark *m = arg;
    (void)epoch, (void)lsn;
    if (!hold) {
        pthread_mutex_unlock(&m->G->order);
        return false;
    }
    pthread_mutex_lock(&m->G->order);
    m->lsn = m->G->next_lsn;
    m->epoch = m->G->last_epoch;
    pthread_mutex_lock(&m->G->q);
    m->p->catching_up = true;
    m->p->told = m->p->confirmed = false;
    repl_peer_reached_locked(m->p);
    m->p->acked = m->p->sent = m->lsn - 1; /* streamed from there, below what it held before */
    m->p->stall = false;
    pthread_cond_broadcast(&m->G->qcond); /* its stream starts */
    pthread_mutex_unlock(&m->G->q);
    return false;
}

/* Starts a new copy of G for peer p: its snapshot, then its writer. NULL, with err, if not. */
static copy_image *copy_image_start(rgroup *G, rpeer *p, char *err, size_t errlen)
{
    copy_image *ci = calloc(1, sizeof(*ci));
    if (ci == NULL) {
        errf(err, errlen, "out of memory");
        return NULL;
    }
    ci->rfd = ci->wfd = -1;
    copy_mark m = {.G = G, .p = p};
    uint64_t pause_ns = 0;
    if (ckpt_snapshot_take(G->st, &ci->snap, 0, 0, false, copy_position, &m, &pause_ns, err,
                           errlen) != 0) {
        free(ci);
        return NULL;
    }
    ci->lsn = m.lsn;
    ci->epoch = m.epoch;
    ci->total = ckpt_file_size(&ci->snap);
    ci->num_servers = G->st->num_servers;
    ci->task = G->st->task_index;
    const char *fp = repl.cfg.ckpt ? repl.cfg.ckpt->failpoint : NULL;
    ci->slow_ms = fp && strcmp(fp, "copy-slow") == 0 ? COPY_SLOW_MS : 0;
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        errf(err, errlen, "pipe: %s", strerror(errno));
        repl_copy_image_free(ci);
        return NULL;
    }
    ci->rfd = fds[0];
    ci->wfd = fds[1];
    (void)fcntl(ci->wfd, F_SETPIPE_SZ, 1 << 20); /* fewer wake-ups; the default works too */
    if (pthread_create(&ci->writer, NULL, copy_writer_main, ci) != 0) {
        errf(err, errlen, "cannot start the copy's writer thread");
        repl_copy_image_free(ci);
        return NULL;
    }
    ci->started = true;
    return ci;
}

/* Why group G's primary serves no copy now: it is shutting down (UNAVAILABLE: the next view
 * names another primary), or G is served by another server (FAILED_PRECONDITION, naming it in
 * the reply when known). 0 when it serves copies: not stopping, still G's primary. */
static int copy_refusal(rgroup *G, int32_t *primary)
{
    pthread_mutex_lock(&G->q);
    bool serving = G->serving;
    *primary = G->epoch != 0 ? G->primary : -1; /* no view yet: not known */
    pthread_mutex_unlock(&G->q);
    if (atomic_load(&repl.stopping) || (repl.agent && view_agent_leaving(repl.agent)))
        return STATUS_UNAVAILABLE;
    return serving ? 0 : STATUS_FAILED_PRECONDITION;
}

/* Answers call with the refusal copy_refusal gave (status), at once: a rejoiner asks the
 * primary of its current view again instead of waiting for a copy that will not come. */
static void copy_refuse(rpc_call *call, rgroup *G, int status, int32_t primary)
{
    if (status == STATUS_UNAVAILABLE) {
        rpc_reply_error(call, STATUS_UNAVAILABLE,
                        "copy of group %u: server %u is shutting down and serves no copy; the "
                        "group's next primary does once the view names it",
                        G->g, repl.cfg.self);
        return;
    }
    if (primary < 0 || primary == (int32_t)repl.cfg.self) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "copy of group %u: server %u does not serve it as primary and knows no "
                        "primary of it yet",
                        G->g, repl.cfg.self);
        return;
    }
    rpc_call_set_primary(call, (uint32_t)primary);
    rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                    "copy of group %u: server %u does not serve it as primary; its primary is "
                    "server %d",
                    G->g, repl.cfg.self, primary);
}

/* Reads the next n bytes of ci's image into its last chunk, for group G. Returns 0, -1 with
 * err, or the status of copy_refusal when G's copy stops being served while it waits for the
 * writer (this server stops, or is no longer the primary). */
static int copy_image_read(rgroup *G, copy_image *ci, size_t n, char *err, size_t errlen)
{
    if (ci->last_cap < n) {
        uint8_t *b = realloc(ci->last, n);
        if (b == NULL)
            return errf(err, errlen, "out of memory for a chunk of %zu bytes", n);
        ci->last = b;
        ci->last_cap = n;
    }
    size_t got = 0;
    while (got < n) {
        struct pollfd pf = {.fd = ci->rfd, .events = POLLIN};
        int ready = poll(&pf, 1, 100);
        if (ready == 0 || (ready < 0 && errno == EINTR)) {
            int32_t primary;
            int why = copy_refusal(G, &primary);
            if (why != 0)
                return why;
            continue;
        }
        ssize_t r = read(ci->rfd, ci->last + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            /* The writer ended early: it failed (its message) or the pipe did. */
            pthread_join(ci->writer, NULL);
            ci->started = false;
            ci->last_len = 0;
            if (ci->wrc != 0)
                return errf(err, errlen, "%s", ci->werr);
            return errf(err, errlen, "the image ended at byte %llu of %llu",
                        (unsigned long long)(ci->pos + got), (unsigned long long)ci->total);
        }
        got += (size_t)r;
    }
    ci->last_off = ci->pos;
    ci->last_len = n;
    ci->pos += n;
    return 0;
}

/* Primary: the chunk of a copy image at rq->copy_offset, for the rejoining server rq->from - 1.
 * Offset 0 takes a new image (copy_image), at log position copy_lsn, from which the backup is
 * streamed as catching up; the chunks follow in order, the last one sent again if asked. */
void repl_copy_serve(rpc_call *call, rgroup *G, const Psd__V1__ReplicateRequest *rq)
{
    Psd__V1__ReplicateReply rep = PSD__V1__REPLICATE_REPLY__INIT;
    rpeer *p = NULL;
    for (uint32_t i = 0; i < G->npeers; i++)
        if (rq->from != 0 && G->peers[i].server == rq->from - 1)
            p = &G->peers[i];
    if (p == NULL) {
        rpc_reply_error(call, STATUS_INVALID_ARGUMENT,
                        "copy of group %u asked for by server %d, which is no member of it", G->g,
                        (int)rq->from - 1);
        return;
    }
    pthread_mutex_lock(&G->q);
    /* The copy is this call's until it is put back: a concurrent call finds none. */
    copy_image *ci = p->img;
    p->img = NULL;
    pthread_mutex_unlock(&G->q);
    int32_t primary;
    int why = copy_refusal(G, &primary);
    if (why != 0) {
        repl_copy_image_free(ci);
        copy_refuse(call, G, why, primary);
        return;
    }
    char err[600];
    if (rq->copy_offset == 0) {
        repl_copy_image_free(ci); /* an earlier copy the peer gave up on */
        ci = copy_image_start(G, p, err, sizeof(err));
        if (ci == NULL) {
            pthread_mutex_lock(&G->q);
            p->catching_up = false;
            pthread_mutex_unlock(&G->q);
            rpc_reply_error(call, STATUS_INTERNAL, "copy of group %u: %s", G->g, err);
            return;
        }
        log_info("group %u: copy for rejoining server %u: %llu bytes at lsn %llu", G->g, p->server,
                 (unsigned long long)ci->total, (unsigned long long)ci->lsn);
    }
    bool again = ci && ci->last_len && rq->copy_offset == ci->last_off;
    if (ci == NULL || (!again && (rq->copy_offset != ci->pos || ci->pos == ci->total))) {
        repl_copy_image_free(ci);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "copy of group %u: no image at offset %llu (ask from offset 0)", G->g,
                        (unsigned long long)rq->copy_offset);
        return;
    }
    if (!again) {
        size_t chunk =
            rpc_call_max_message(call) > (1u << 17) ? rpc_call_max_message(call) - 65536 : 65536;
        if (chunk > (4u << 20))
            chunk = 4u << 20;
        uint64_t n = ci->total - ci->pos;
        if (n > chunk)
            n = chunk;
        int rc = copy_image_read(G, ci, (size_t)n, err, sizeof(err));
        if (rc != 0) {
            repl_copy_image_free(ci);
            int32_t now;
            (void)copy_refusal(G, &now);
            if (rc > 0)
                copy_refuse(call, G, rc, now);
            else
                rpc_reply_error(call, STATUS_INTERNAL, "copy of group %u: %s", G->g, err);
            return;
        }
    }
    size_t n = ci->last_len;
    rep.copy_total = ci->total;
    rep.copy_len = n;
    rep.copy_lsn = ci->lsn;
    rep.copy_epoch = ci->epoch;
    uint64_t words = (n + 3) / 4;
    uint8_t *seg = rpc_reply_ok_segment(call, &rep.base, 0, words);
    if (seg) {
        memcpy(seg, ci->last, n);
        memset(seg + n, 0, (size_t)words * 4 - n);
    }
    /* The last chunk sent: the copy is done, but for a resend of that chunk, which the next
     * request (offset 0 or none) ends. */
    pthread_mutex_lock(&G->q);
    copy_image *put = p->img == NULL ? ci : NULL; /* a newer copy started meanwhile: it stays */
    if (put)
        p->img = put;
    pthread_mutex_unlock(&G->q);
    if (put == NULL)
        repl_copy_image_free(ci);
}

typedef struct copy_call {
    pthread_mutex_t m;
    pthread_cond_t c;
    bool done; /* copy_done ran (m) */
    int status;
    char message[512];
    uint8_t body[64];
    size_t body_len;
    FILE *f; /* the image being written, chunk by chunk, as it arrives */
    size_t total, len;
    uint64_t lsn;
    uint64_t epoch; /* of the image's last operation */
} copy_call;

static int copy_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    copy_call *k = arg;
    envelope env = PSD__V1__ENVELOPE__INIT;
    env.method = PSD__V1__METHOD__REPLICATE;
    env.deadline_ms = deadline_ms;
    env.worker_id = -1;
    env.body.data = k->body;
    env.body.len = k->body_len;
    char tok[80];
    if (repl.agent && view_agent_token(repl.agent, tok, sizeof(tok))) {
        env.auth_token.data = (uint8_t *)tok;
        env.auth_token.len = strlen(tok);
    }
    return frame_build(out, &env, NULL, 0, NULL);
}

static void copy_done(void *arg, int status, const char *message, const frame *reply)
{
    copy_call *k = arg;
    k->status = status; /* read once done is seen (copy_call_wait) */
    snprintf(k->message, sizeof(k->message), "%s", message);
    if (status == STATUS_OK && reply) {
        Psd__V1__ReplicateReply *r =
            psd__v1__replicate_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
        size_t at = k->len;
        if (r == NULL || r->copy_total == 0 || (k->total && r->copy_total != k->total) ||
            r->copy_len > reply->segment_len || at + r->copy_len > r->copy_total) {
            k->status = STATUS_INTERNAL;
            snprintf(k->message, sizeof(k->message), "copy reply does not fit the image");
        } else {
            if (k->total == 0) {
                k->total = (size_t)r->copy_total;
                k->lsn = r->copy_lsn;
                k->epoch = r->copy_epoch;
            }
            if (fwrite(reply->segment, 1, (size_t)r->copy_len, k->f) != (size_t)r->copy_len) {
                k->status = STATUS_INTERNAL;
                snprintf(k->message, sizeof(k->message), "writing the copy: %s", strerror(errno));
            } else {
                k->len += (size_t)r->copy_len;
            }
        }
        if (r)
            psd__v1__replicate_reply__free_unpacked(r, NULL);
    }
    pthread_mutex_lock(&k->m);
    k->done = true;
    pthread_cond_signal(&k->c);
    pthread_mutex_unlock(&k->m);
}

/* Whether a copy of G asked of server prim is still worth waiting for: this server is not
 * stopping and its view still names prim G's primary. */
static bool copy_still_wanted(rgroup *G, int32_t prim)
{
    pthread_mutex_lock(&repl.vlock);
    bool same = repl.cur.primary[G->g] == prim;
    pthread_mutex_unlock(&repl.vlock);
    return same && !atomic_load(&repl.stopping);
}

/* Waits for the call k on conn to end. When the view moves G's primary away from prim (or
 * this server stops) first, the call is given up: conn is closed (the call ends CANCELLED)
 * and false returned, so that the copy is asked of the new primary at once instead of
 * waiting out the deadline of a server that stopped or no longer serves the group. */
static bool copy_call_wait(rgroup *G, int32_t prim, rpc_conn *conn, copy_call *k)
{
    pthread_mutex_lock(&k->m);
    while (!k->done) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000000;
        if (until.tv_nsec >= 1000000000) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&k->c, &k->m, &until);
        if (k->done)
            break;
        pthread_mutex_unlock(&k->m);
        bool wanted = copy_still_wanted(G, prim);
        if (!wanted)
            rpc_conn_close(conn); /* returns once copy_done ran */
        pthread_mutex_lock(&k->m);
        if (!wanted) {
            pthread_mutex_unlock(&k->m);
            return false;
        }
    }
    pthread_mutex_unlock(&k->m);
    return true;
}

/* Fetches a whole image of group G from server prim into k->f (empty). Returns 0 with it
 * there, -2 when the view moved G's primary away from prim meanwhile (ask the new one at
 * once), -1 on another failure. */
static int copy_fetch(rgroup *G, int32_t prim, copy_call *k, uint64_t epoch)
{
    char label[64], err[512];
    snprintf(label, sizeof(label), "ps %d (primary of group %u)", prim, G->g);
    rpc_conn_config cc = {
        .url = repl.cfg.urls[prim],
        .connections = 1,
        .max_message = repl.cfg.max_message + 65536,
        .label = label,
        .tls = repl.cfg.tls,
    };
    rpc_conn *conn;
    if (rpc_conn_open(&conn, &cc, err, sizeof(err)) != 0) {
        log_warn("group %u: cannot reach its primary %d for a copy: %s", G->g, prim, err);
        return -1;
    }
    int rc = 0;
    k->total = k->len = 0;
    do {
        Psd__V1__ReplicateRequest rq = PSD__V1__REPLICATE_REQUEST__INIT;
        rq.group = G->g;
        rq.epoch = epoch;
        rq.copy = true;
        rq.copy_offset = k->len;
        rq.from = repl.cfg.self + 1;
        k->body_len = psd__v1__replicate_request__pack(&rq, k->body);
        rpc_call_opts o = {.deadline_ms = 60000, .retries = 3, .backoff_ms = 100};
        k->done = false;
        int st = rpc_conn_call(conn, &o, copy_build, copy_done, k);
        if (st != 0) {
            log_warn("group %u: cannot start a copy call to primary %d: %s", G->g, prim,
                     status_name(st));
            rc = -1;
            break;
        }
        if (!copy_call_wait(G, prim, conn, k)) {
            if (atomic_load(&repl.stopping))
                return -2; /* conn closed; the copy thread ends */
            log_warn("group %u: server %d no longer serves it in this server's view: its copy, "
                     "%zu of %zu bytes fetched, is asked of the new primary",
                     G->g, prim, k->len, k->total);
            return -2; /* conn closed */
        }
        if (k->status != STATUS_OK) {
            log_warn("group %u: copy from primary %d failed: %s: %s", G->g, prim,
                     status_name(k->status), k->message);
            rc = -1;
            break;
        }
    } while (k->len < k->total && !atomic_load(&repl.stopping));
    rpc_conn_close(conn);
    return rc == 0 && k->len == k->total ? 0 : -1;
}

/* Restores the image of len bytes in directory dir into a fresh state of group G and makes it
 * G's copy at log position lsn, taken from primary `from` in view view_epoch, its last
 * operation logged under `epoch`. */
static int copy_install(rgroup *G, const char *dir, size_t len, uint64_t lsn, uint64_t epoch,
                        int32_t from, uint64_t view_epoch)
{
    char err[4400];
    server_state *st = repl_state_make(G->g, err, sizeof(err));
    int rc = -1;
    if (st) {
        checkpoint_config cc = {.dir = dir, .keep = 1, .cluster_hash = repl.cfg.cluster_hash};
        checkpoint_info info;
        uint64_t max_seq;
        int r = checkpoint_restore(st, &cc, &info, &max_seq, err, sizeof(err));
        if (r == CKPT_RESTORED) {
            rc = 0;
        } else {
            log_error("group %u: the copy does not restore: %s", G->g,
                      r == CKPT_NONE ? "no image" : err);
        }
    }
    if (rc != 0) {
        server_state_free(st); /* with the tables a failed restore registered */
        return -1;
    }
    rpc_server_config lc = {
        .max_message = repl.cfg.max_message,
        .default_deadline_ms = 60000,
        .methods = server_methods,
        .n_methods = server_methods_len,
        .handler_arg = G->owned ? st : G->st, /* the own group keeps its address */
        .trusted = true,
    };
    rpc_server *local = rpc_server_open_local(&lc);
    if (local == NULL)
        return -1; /* st leaks: out of memory anyway */
    server_state *old = NULL;
    if (!G->owned && (old = calloc(1, sizeof(*old))) == NULL) {
        rpc_server_close_local(local);
        server_state_free(st);
        return -1;
    }
    /* No reader is in the old contents (swap) and no update (order) while they are replaced. */
    pthread_rwlock_wrlock(&G->swap);
    pthread_mutex_lock(&G->order);
    st->swap = &G->swap;
    if (!G->owned) {
        /* The server's own group keeps its state: what belongs to the process stays (its
         * checkpointer, failover agent, RPC server, a shutdown asked for, start time, counters
         * and create count: its checkpointer's durable mark is in that count); the contents
         * (variables, dedup and sync state, tables and their budget) move in, the previous
         * ones out into old. */
        server_state *cur = G->st;
        old->task_index = cur->task_index;
        old->num_servers = cur->num_servers;
        old->vars = cur->vars;
        old->dedup = cur->dedup;
        old->sync = cur->sync;
        old->tables = cur->tables;
        old->budget = cur->budget;
        atomic_store(&old->table_bytes, atomic_load(&cur->table_bytes));
        cur->vars = st->vars;
        cur->dedup = st->dedup;
        cur->sync = st->sync;
        cur->tables = st->tables;
        cur->budget = st->budget;
        atomic_store(&cur->table_bytes, atomic_load(&st->table_bytes));
        free(st); /* its contents are cur's now */
        st = cur;
        /* The tables count their memory against the state they were made in. */
        server_tables_rebind(st);
        server_tables_rebind(old);
    } else {
        old = G->st;
    }
    rpc_server_close_local(G->local);
    G->local = local;
    G->st = st;
    sync_set_logged(st, repl_log_evict, G);
    G->next_lsn = lsn;
    G->last_epoch = epoch;
    G->ready = true;
    repl_ckpt_copies_drop(G);
    pthread_mutex_lock(&G->q);
    G->fresh = true;
    /* The primary's own log up to lsn, unless the view moved since it was asked for. */
    G->verified = G->primary == from && G->epoch == view_epoch;
    if (!G->serving) {
        repl_log_free_locked(G); /* operations of the copy it replaced */
        G->last_lsn = G->committed = lsn - 1;
    }
    pthread_mutex_unlock(&G->q);
    pthread_mutex_unlock(&G->order);
    pthread_rwlock_unlock(&G->swap);
    /* The replaced contents are freed once nothing can use them: a checkpoint of the own
     * group's state that began before (its snapshot holds their tables) ends first; calls
     * parked on them (none once the group stopped being served here) are answered. */
    checkpointer *ck = atomic_load(G->owned ? &old->ck : &G->st->ck);
    if (ck)
        checkpointer_barrier(ck);
    sync_cancel_all(old, "the server replaced its copy of the group: retry");
    atomic_store(&old->ck, NULL);
    server_state_free(old);

    log_info("group %u: installed a copy of %zu bytes at lsn %llu; catching up on its log", G->g,
             len, (unsigned long long)lsn);
    return 0;
}

static void *copy_main(void *arg)
{
    rgroup *G = arg;
    copy_call k;
    memset(&k, 0, sizeof(k));
    pthread_mutex_init(&k.m, NULL);
    pthread_cond_init(&k.c, NULL);
    while (!atomic_load(&repl.stopping)) {
        pthread_mutex_lock(&repl.vlock);
        int32_t prim = repl.cur.primary[G->g];
        uint64_t epoch = repl.cur.epoch;
        pthread_mutex_unlock(&repl.vlock);
        /* The image goes to a file as it arrives, restored from there. */
        char dir[] = "/tmp/psd-rejoin-XXXXXX", path[128];
        bool have_dir = mkdtemp(dir) != NULL;
        if (!have_dir)
            log_error("group %u: mkdtemp: %s", G->g, strerror(errno));
        snprintf(path, sizeof(path), "%s/ckpt-%u-1.psc", dir, G->g);
        k.f = have_dir ? fopen(path, "wb") : NULL;
        if (have_dir && k.f == NULL)
            log_error("group %u: cannot create %s: %s", G->g, path, strerror(errno));
        int got = k.f != NULL && prim >= 0 && prim != (int32_t)repl.cfg.self
                      ? copy_fetch(G, prim, &k, epoch)
                      : -1;
        bool fetched = got == 0;
        if (k.f != NULL && fclose(k.f) != 0 && fetched) {
            log_error("group %u: writing %s: %s", G->g, path, strerror(errno));
            fetched = false;
        }
        k.f = NULL;
        bool installed = fetched && copy_install(G, dir, k.len, k.lsn, k.epoch, prim, epoch) == 0;
        if (have_dir) {
            unlink(path);
            rmdir(dir);
        }
        if (installed) {
            /* A copy from a server that is no longer the primary (asked under a view that
             * changed meanwhile, the old primary not yet aware): the new one never streams to
             * this copy, which would never catch up. Copied again from the primary. */
            pthread_mutex_lock(&G->q);
            int32_t now = G->primary;
            bool serving = G->serving;
            pthread_mutex_unlock(&G->q);
            if (now == prim || serving || now < 0)
                break;
            log_info("group %u: the copy came from server %d, no longer its primary: copying it "
                     "again from server %d",
                     G->g, prim, now);
        }
        if (got == -2)
            continue; /* the view names a new primary: asked at once */
        struct timespec ts = {0, 300 * 1000000};
        nanosleep(&ts, NULL);
    }
    pthread_mutex_destroy(&k.m);
    pthread_cond_destroy(&k.c);
    pthread_mutex_lock(&G->q);
    G->copying = false;
    pthread_mutex_unlock(&G->q);
    return NULL;
}

/* Out of the view: every copy this server holds is stale from now on; copy each group again
 * from its primary (order and q held). */
void repl_rejoin_locked(rgroup *G)
{
    if (G->copying || G->fresh)
        return; /* one copy per time out of the view: the stream keeps it up to date */
    G->ready = false;
    G->marked = false;
    if (repl.agent)
        view_agent_unmark_caught_up(repl.agent, G->g); /* a mark of an earlier copy */
    if (G->copy_started) {
        pthread_join(G->copy_thread, NULL); /* finished: copying is false */
        G->copy_started = false;
    }
    if (pthread_create(&G->copy_thread, NULL, copy_main, G) == 0) {
        G->copying = true;
        G->copy_started = true;
    } else {
        log_error("group %u: cannot start the copy thread", G->g);
    }
}
