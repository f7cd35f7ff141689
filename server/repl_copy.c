/* Rejoin copies: the primary makes an image of a group at a log position (copy_serve); a
 * backup that rejoins, or whose copy no longer matches the log, fetches it, installs it and
 * catches up on the log after it. */
#include "repl_group.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#include "log.h"
#include "methods.h"
#include "status.h"
#include "sync.h"
#include "timeutil.h"

/* Primary: the chunk of a copy image at rq->copy_offset, for the rejoining server rq->from - 1.
 * Offset 0 takes a new image: a checkpoint of the group written while its updates wait, at
 * log position copy_lsn, from which the backup is streamed as catching up. */
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
    bool serving = G->serving;
    pthread_mutex_unlock(&G->q);
    if (!serving) {
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "copy of group %u: server %u does not serve it as primary", G->g,
                        repl.cfg.self);
        return;
    }
    if (rq->copy_offset == 0) {
        char dir[] = "/tmp/psd-copy-XXXXXX", err[4400];
        if (mkdtemp(dir) == NULL) {
            rpc_reply_error(call, STATUS_INTERNAL, "copy of group %u: mkdtemp: %s", G->g,
                            strerror(errno));
            return;
        }
        checkpoint_config cc = {.dir = dir, .keep = 1, .cluster_hash = repl.cfg.cluster_hash};
        checkpointer *ck = checkpointer_create(G->st, &cc, 1, err, sizeof(err));
        checkpoint_info info;
        int rc = -1;
        uint64_t lsn = 0, img_epoch = 0;
        if (ck) {
            pthread_mutex_lock(&G->order);
            rc = checkpoint_write(ck, &info, err, sizeof(err));
            lsn = G->next_lsn;
            img_epoch = G->last_epoch;
            if (rc == 0) {
                pthread_mutex_lock(&G->q);
                p->catching_up = true;
                p->told = p->confirmed = false;
                p->failing_since_ns = 0;
                p->acked = lsn - 1;
                pthread_mutex_unlock(&G->q);
            }
            pthread_mutex_unlock(&G->order);
            checkpointer_destroy(ck);
        }
        uint8_t *img = NULL;
        size_t len = 0;
        if (rc == 0) {
            FILE *f = fopen(info.path, "rb");
            if (f && fseek(f, 0, SEEK_END) == 0) {
                long n = ftell(f);
                if (n > 0 && (img = malloc((size_t)n)) != NULL) {
                    rewind(f);
                    if (fread(img, 1, (size_t)n, f) == (size_t)n) {
                        len = (size_t)n;
                    } else {
                        free(img);
                        img = NULL;
                    }
                }
            }
            if (f)
                fclose(f);
            if (img == NULL) {
                rc = -1;
                snprintf(err, sizeof(err), "cannot read back %s", info.path);
            }
            unlink(info.path);
        }
        char path[64];
        snprintf(path, sizeof(path), "%s/.state-%u", dir, G->g);
        unlink(path);
        rmdir(dir);
        if (rc != 0) {
            pthread_mutex_lock(&G->q);
            p->catching_up = false;
            pthread_mutex_unlock(&G->q);
            rpc_reply_error(call, STATUS_INTERNAL, "copy of group %u: %s", G->g, err);
            return;
        }
        pthread_mutex_lock(&G->q);
        free(p->img);
        p->img = img;
        p->img_len = len;
        p->img_lsn = lsn;
        p->img_epoch = img_epoch;
        pthread_cond_broadcast(&G->qcond);
        pthread_mutex_unlock(&G->q);
        log_info("group %u: copy for rejoining server %u: %zu bytes at lsn %llu", G->g, p->server,
                 len, (unsigned long long)lsn);
    }
    pthread_mutex_lock(&G->q);
    if (p->img == NULL || rq->copy_offset > p->img_len) {
        pthread_mutex_unlock(&G->q);
        rpc_reply_error(call, STATUS_FAILED_PRECONDITION,
                        "copy of group %u: no image at offset %llu (ask from offset 0)", G->g,
                        (unsigned long long)rq->copy_offset);
        return;
    }
    size_t chunk =
        rpc_call_max_message(call) > (1u << 17) ? rpc_call_max_message(call) - 65536 : 65536;
    if (chunk > (4u << 20))
        chunk = 4u << 20;
    size_t n = p->img_len - (size_t)rq->copy_offset;
    if (n > chunk)
        n = chunk;
    rep.copy_total = p->img_len;
    rep.copy_len = n;
    rep.copy_lsn = p->img_lsn;
    rep.copy_epoch = p->img_epoch;
    uint64_t words = (n + 3) / 4;
    uint8_t *seg = rpc_reply_ok_segment(call, &rep.base, 0, words);
    if (seg) {
        memcpy(seg, p->img + rq->copy_offset, n);
        memset(seg + n, 0, (size_t)words * 4 - n);
    }
    if (rq->copy_offset + n == p->img_len) {
        free(p->img);
        p->img = NULL;
        p->img_len = 0;
    }
    pthread_mutex_unlock(&G->q);
}

typedef struct copy_call {
    int status;
    char message[512];
    uint8_t body[64];
    size_t body_len;
    uint8_t *dst; /* the image being filled */
    size_t cap, total, len;
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
    k->status = status; /* read once the call is waited for (rpc_conn_call_wait) */
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
            if (k->dst == NULL) {
                k->dst = malloc((size_t)r->copy_total);
                k->cap = (size_t)r->copy_total;
                k->total = (size_t)r->copy_total;
                k->lsn = r->copy_lsn;
                k->epoch = r->copy_epoch;
            }
            if (k->dst == NULL) {
                k->status = STATUS_RESOURCE_EXHAUSTED;
                snprintf(k->message, sizeof(k->message), "out of memory for the copy");
            } else {
                memcpy(k->dst + at, reply->segment, (size_t)r->copy_len);
                k->len += (size_t)r->copy_len;
            }
        }
        if (r)
            psd__v1__replicate_reply__free_unpacked(r, NULL);
    }
}

/* Fetches a whole image of group G from server prim. Returns 0 with it in k. */
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
    free(k->dst);
    k->dst = NULL;
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
        k->status = INT32_MIN; /* copy_done not run: the call did not start */
        int st = rpc_conn_call_wait(conn, &o, copy_build, copy_done, k);
        if (k->status == INT32_MIN) {
            log_warn("group %u: cannot start a copy call to primary %d: %s", G->g, prim,
                     status_name(st));
            rc = -1;
            break;
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

/* Restores an image into a fresh state of group G and makes it G's copy at log position lsn,
 * taken from primary `from` in view view_epoch, its last operation logged under `epoch`. */
static int copy_install(rgroup *G, const uint8_t *img, size_t len, uint64_t lsn, uint64_t epoch,
                        int32_t from, uint64_t view_epoch)
{
    char dir[] = "/tmp/psd-rejoin-XXXXXX", path[128], err[4400];
    if (mkdtemp(dir) == NULL) {
        log_error("group %u: mkdtemp: %s", G->g, strerror(errno));
        return -1;
    }
    snprintf(path, sizeof(path), "%s/ckpt-%u-1.psc", dir, G->g);
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(img, 1, len, f) == len;
    if (f && fclose(f) != 0)
        ok = false;
    server_state *st = ok ? repl_state_make(G->g, err, sizeof(err)) : NULL;
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
    unlink(path);
    rmdir(dir);
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
    while (!atomic_load(&repl.stopping)) {
        pthread_mutex_lock(&repl.vlock);
        int32_t prim = repl.cur.primary[G->g];
        uint64_t epoch = repl.cur.epoch;
        pthread_mutex_unlock(&repl.vlock);
        if (prim >= 0 && prim != (int32_t)repl.cfg.self && copy_fetch(G, prim, &k, epoch) == 0 &&
            copy_install(G, k.dst, k.len, k.lsn, k.epoch, prim, epoch) == 0) {
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
        struct timespec ts = {0, 300 * 1000000};
        nanosleep(&ts, NULL);
    }
    free(k.dst);
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
