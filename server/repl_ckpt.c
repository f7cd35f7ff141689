/* Checkpoints of replica groups: the log position a checkpoint records, the checkpointer of a
 * group this server took over, its files in group-copies-<self>, and a group's copy restored at
 * start. */
#include "repl_group.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "sync.h"

/* checkpoint_position_fn of a group: its log stays still (order) while its state is copied. */
bool repl_ckpt_position(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn)
{
    rgroup *G = arg;
    if (!hold) {
        pthread_mutex_unlock(&G->order);
        return false;
    }
    pthread_mutex_lock(&G->order);
    pthread_mutex_lock(&G->q);
    /* Before the first view: the copy is the restored one, at its position. */
    *epoch = G->epoch ? G->epoch : G->restored_epoch;
    pthread_mutex_unlock(&G->q);
    *lsn = G->next_lsn;
    return G->ready; /* a copy being replaced has no position */
}

/* The own group's position once its group is freed (its final checkpoint). */
bool repl_ckpt_final_position(void *arg, bool hold, uint64_t *epoch, uint64_t *lsn)
{
    (void)arg;
    if (!hold)
        return false;
    *epoch = repl.final_epoch;
    *lsn = repl.final_lsn;
    return repl.final_valid;
}

/* Where the groups this server took over are checkpointed: <dir>/group-copies-<self>. */
static void copies_dir(char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/group-copies-%u", repl.cfg.ckpt->dir, repl.cfg.self);
}

/* Starts checkpointing group G, which this server begins to serve and does not own (vlock
 * held). Failures are logged: the group is served all the same, as without checkpoints. */
void repl_ckpt_start(rgroup *G)
{
    if (repl.cfg.own_ck == NULL || G->ck != NULL || G->g == repl.cfg.self)
        return;
    char dir[4200], err[1024];
    copies_dir(dir, sizeof(dir));
    checkpoint_config cc = *repl.cfg.ckpt;
    cc.dir = dir;
    cc.failpoint = NULL;
    checkpointer *ck = checkpointer_create(G->st, &cc, G->ck_next_seq, err, sizeof(err));
    if (ck != NULL) {
        checkpointer_set_position(ck, repl_ckpt_position, G);
        if (checkpointer_start(ck, err, sizeof(err)) != 0) {
            checkpointer_destroy(ck);
            ck = NULL;
        }
    }
    if (ck == NULL) {
        log_error("group %u: served here from now on, but not checkpointed: %s", G->g, err);
        return;
    }
    G->ck = ck;
    atomic_store(&G->has_files, true);
    log_info("group %u: checkpointed into %s while this server serves it", G->g, dir);
}

/* Stops checkpointing G (no longer served here; vlock held, order not). */
void repl_ckpt_stop(rgroup *G)
{
    if (G->ck == NULL)
        return;
    checkpointer_stop(G->ck);
    G->ck_next_seq = checkpointer_next_seq(G->ck);
    checkpointer_destroy(G->ck);
    G->ck = NULL;
}

/* Removes the checkpoints of group G (not the own one) from <dir>/group-copies-<self>: this
 * server's copy of G no longer is the one they hold (it stopped serving G while it lives on,
 * or copied G from another primary), and a restart must not take them for what it held in
 * sync (view_agent_set_lacks). Not at shutdown: a stopping server keeps its final checkpoint. */
void repl_ckpt_copies_drop(rgroup *G)
{
    if (repl.cfg.own_ck == NULL || G->g == repl.cfg.self || atomic_load(&repl.stopping))
        return;
    atomic_store(&G->has_files, false);
    char dir[4200], path[4600], pfx[32], tmp[32], state[32];
    copies_dir(dir, sizeof(dir));
    snprintf(pfx, sizeof(pfx), "ckpt-%u-", G->g);
    snprintf(tmp, sizeof(tmp), ".ckpt-%u-", G->g);
    snprintf(state, sizeof(state), ".state-%u", G->g);
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, pfx, strlen(pfx)) != 0 &&
            strncmp(e->d_name, tmp, strlen(tmp)) != 0 && strcmp(e->d_name, state) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) == 0)
            n++;
        else
            log_warn("group %u: cannot remove %s: %s", G->g, path, strerror(errno));
    }
    closedir(d);
    if (n > 0)
        log_info("group %u: removed %d checkpoint file(s) of it from %s: this server's copy is "
                 "no longer the one they hold",
                 G->g, n, dir);
}

/* Restores group G (not the own one) from <dir>/group-copies-<self> at start, if it has a
 * checkpoint there: its copy and log position, published to the coordinator. */
int repl_ckpt_restore(rgroup *G, char *err, size_t errlen)
{
    char dir[4200], why[2048];
    copies_dir(dir, sizeof(dir));
    checkpoint_config cc = *repl.cfg.ckpt;
    cc.dir = dir;
    checkpoint_info info;
    uint64_t max_seq = 0;
    int r = CKPT_NONE;
    struct stat sb;
    if (stat(dir, &sb) == 0)
        r = checkpoint_restore(G->st, &cc, &info, &max_seq, why, sizeof(why));
    G->ck_next_seq = max_seq + 1;
    if (r == CKPT_NONE)
        return 0;
    atomic_store(&G->has_files, true);
    if (r != CKPT_RESTORED) {
        /* Only a copy: the group's other members may hold a good one. Start it empty. */
        log_warn("group %u: its checkpoints in %s do not restore (%s): this server holds no "
                 "copy of it until it copies one from the group's primary",
                 G->g, dir, why);
        server_state *fresh = repl_state_make(G->g, err, errlen);
        if (fresh == NULL)
            return -1;
        server_state *old = G->st;
        G->st = fresh;
        server_state_free(old);
        return 0;
    }
    sync_resume(G->st);
    if (info.has_position) {
        G->restored = true;
        G->restored_epoch = info.epoch;
        G->last_epoch = info.epoch;
        G->restored_lsn = info.lsn;
        G->next_lsn = info.lsn;
        G->last_lsn = G->committed = info.lsn - 1;
    }
    log_info("group %u: restored the copy checkpointed while this server served it: %s, %u "
             "variables, %llu table rows, view epoch %llu, lsn %llu",
             G->g, info.path, info.variables, (unsigned long long)info.table_rows,
             (unsigned long long)info.epoch, (unsigned long long)info.lsn);
    return 0;
}

size_t replica_restored_copies(view_copy *out, size_t cap)
{
    size_t n = 0;
    for (uint32_t g = 0; g < VIEW_MAX_SERVERS && n < cap; g++) {
        rgroup *G = repl.groups[g];
        if (G && G->restored)
            out[n++] = (view_copy){.server = repl.cfg.self,
                                   .group = g,
                                   .epoch = G->restored_epoch,
                                   .lsn = G->restored_lsn};
    }
    return n;
}
