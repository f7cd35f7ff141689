/* A checkpoint directory (ckpt_dir.h): listing, pruning (the files and the copies of cold
 * stores they name), making and fsyncing it, the lock of a task and the record of how its
 * last server stopped. */
#include "ckpt_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt_frame.h"
#include "cold_store.h"
#include "log.h"
#include "util.h"

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

int ckpt_fsync_dir(const char *dir, char *err, size_t errlen)
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

static int cmp_seq_desc(const void *a, const void *b)
{
    const ckpt_file *x = a, *y = b;
    return x->seq < y->seq ? 1 : x->seq > y->seq ? -1 : 0;
}

long ckpt_dir_list(const char *dir, uint32_t task, bool remove_tmp, ckpt_file **out, char *err,
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
            e->d_name[end] == '\0' && (t == task || task == CKPT_ALL_TASKS) &&
            strlen(e->d_name) < sizeof(f->name)) {
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
            f[n].task = t;
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

void ckpt_cold_path(char *buf, size_t cap, const char *dir, uint32_t task, uint64_t seq)
{
    snprintf(buf, cap, "%s/ckpt-%u-%" PRIu64 ".cold", dir, task, seq);
}

int ckpt_cold_remove(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return errno == ENOENT ? 0 : -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char sub[4400];
        snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
        if (cold_store_remove_dir(sub) != 0)
            log_warn("cannot delete %s: %s", sub, strerror(errno));
    }
    closedir(d);
    return rmdir(path);
}

/* Deletes task's copies of cold stores whose checkpoint file is gone (pruned, or never
 * written: a failed or interrupted write). */
static void prune_cold(const char *dir, uint32_t task)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        unsigned t;
        unsigned long long seq;
        int end = 0;
        if (sscanf(e->d_name, "ckpt-%u-%llu.cold%n", &t, &seq, &end) != 2 ||
            e->d_name[end] != '\0' || t != task)
            continue;
        char file[4200], cold[4200];
        struct stat st;
        snprintf(file, sizeof(file), "%s/ckpt-%u-%llu.psc", dir, t, seq);
        if (stat(file, &st) == 0 || errno != ENOENT)
            continue;
        ckpt_cold_path(cold, sizeof(cold), dir, t, (uint64_t)seq);
        if (ckpt_cold_remove(cold) != 0)
            log_warn("cannot delete %s, a copy of cold stores no checkpoint names: %s", cold,
                     strerror(errno));
    }
    closedir(d);
}

void ckpt_dir_prune(const char *dir, uint32_t task, int keep_n,
                    bool (*keep_file)(const char *path, void *arg), void *arg)
{
    ckpt_file *f;
    char err[512];
    long n = ckpt_dir_list(dir, task, false, &f, err, sizeof(err));
    if (n < 0) {
        log_warn("not deleting old checkpoints: %s", err);
        return;
    }
    if (keep_file) { /* the files it keeps are not this cluster's: not listed */
        long k = 0;
        for (long i = 0; i < n; i++) {
            char path[4200];
            snprintf(path, sizeof(path), "%s/%s", dir, f[i].name);
            if (!keep_file(path, arg))
                f[k++] = f[i];
        }
        n = k;
    }
    bool *keep = calloc(n ? (size_t)n : 1, sizeof(*keep));
    if (keep == NULL) {
        free(f);
        log_warn("not deleting old checkpoints: out of memory");
        return;
    }
    for (long i = 0; i < n && i < keep_n; i++) {
        for (long cur = i; cur < n && !keep[cur];) {
            keep[cur] = true;
            char path[4200];
            uint64_t prev = 0;
            snprintf(path, sizeof(path), "%s/%s", dir, f[cur].name);
            if (ckpt_peek_prev(path, &prev, err, sizeof(err)) != 0 || prev == 0)
                break;
            while (cur < n && f[cur].seq != prev)
                cur++;
        }
    }
    for (long i = 0; i < n; i++) {
        if (keep[i])
            continue;
        char path[4200];
        snprintf(path, sizeof(path), "%s/%s", dir, f[i].name);
        if (unlink(path) != 0)
            log_warn("cannot delete old checkpoint %s: %s", path, strerror(errno));
    }
    free(keep);
    free(f);
    prune_cold(dir, task);
}

static int task_path(char *buf, size_t cap, const char *dir, const char *what, uint32_t task)
{
    return (size_t)snprintf(buf, cap, "%s/%s%u", dir, what, task) < cap ? 0 : -1;
}

int ckpt_dir_lock(const char *dir, uint32_t task, char *err, size_t errlen)
{
    if (checkpoint_mkdir(dir, err, errlen) != 0)
        return -1;
    char p[4200];
    if (task_path(p, sizeof(p), dir, ".lock-", task) != 0)
        return errf(err, errlen, "checkpoint-dir is too long (%zu bytes)", strlen(dir));
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return errf(err, errlen, "cannot open the lock file %s: %s", p, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
        close(fd);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        if (e != EWOULDBLOCK)
            return errf(err, errlen, "cannot lock %s: %s", p, strerror(e));
        return errf(err, errlen,
                    "checkpoint-dir %s is in use by another ps %u (pid %s holds %s): two servers "
                    "of one task must not share a checkpoint directory; stop that one, or give "
                    "this one its own directory",
                    dir, task, pid[0] ? pid : "unknown", p);
    }
    char pid[32];
    int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        log_warn("cannot write the pid into %s: %s", p, strerror(errno));
    return fd;
}

void ckpt_dir_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* releases the flock */
}

void ckpt_record_read(const char *dir, uint32_t task, ckpt_record *out)
{
    memset(out, 0, sizeof(*out));
    char p[4200], err[300];
    if (task_path(p, sizeof(p), dir, ".state-", task) != 0)
        return;
    size_t len;
    char *text = read_file(p, 4096, &len, err, sizeof(err));
    if (text == NULL) {
        char legacy[4200];
        out->legacy = task_path(legacy, sizeof(legacy), dir, ".running-", task) == 0 &&
                      access(legacy, F_OK) == 0;
        return;
    }
    char word[16];
    long pid;
    unsigned long long seq, versions;
    if (sscanf(text, "%15s pid=%ld checkpoint=%llu versions=%llu", word, &pid, &seq, &versions) ==
            4 &&
        (strcmp(word, "running") == 0 || strcmp(word, "clean") == 0)) {
        out->state = word[0] == 'r' ? CKPT_STOP_RUNNING : CKPT_STOP_CLEAN;
        out->pid = pid;
        out->seq = seq;
        out->versions = versions;
    } else {
        log_warn("%s does not parse (\"%.80s\"): how the previous server stopped is unknown", p,
                 text);
    }
    free(text);
}

int ckpt_record_write(const char *dir, uint32_t task, const ckpt_record *r, char *err,
                      size_t errlen)
{
    char p[4200], tmp[4220], line[160];
    if (task_path(p, sizeof(p), dir, ".state-", task) != 0 ||
        (size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", p) >= sizeof(tmp))
        return errf(err, errlen, "checkpoint-dir is too long (%zu bytes)", strlen(dir));
    int n =
        snprintf(line, sizeof(line), "%s pid=%ld checkpoint=%" PRIu64 " versions=%" PRIu64 "\n",
                 r->state == CKPT_STOP_CLEAN ? "clean" : "running", r->pid, r->seq, r->versions);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    if (write(fd, line, (size_t)n) != n || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return errf(err, errlen, "cannot write %s: %s", tmp, strerror(e));
    }
    close(fd);
    if (rename(tmp, p) != 0) {
        int e = errno;
        unlink(tmp);
        return errf(err, errlen, "cannot rename %s to %s: %s", tmp, p, strerror(e));
    }
    char legacy[4200]; /* an older release's marker: this record supersedes it */
    if (task_path(legacy, sizeof(legacy), dir, ".running-", task) == 0)
        unlink(legacy);
    return 0;
}

static bool verdict_alone(const ckpt_record *last, uint32_t task, bool restored, uint64_t seq,
                          uint64_t versions, char *msg, size_t cap)
{
    if (last->state == CKPT_STOP_UNKNOWN) {
        if (last->legacy) {
            if (restored)
                snprintf(msg, cap,
                         "ps %u did not shut down cleanly: the updates it applied after "
                         "checkpoint %" PRIu64 " are lost",
                         task, seq);
            else
                snprintf(msg, cap,
                         "ps %u did not shut down cleanly and left no checkpoint: every update "
                         "it applied is lost",
                         task);
            return true;
        }
        if (!restored) {
            snprintf(msg, cap, "no record of an earlier ps %u in this directory: starting empty",
                     task);
            return false;
        }
        snprintf(msg, cap,
                 "no record of how the previous ps %u stopped (no .state-%u): updates it "
                 "applied after checkpoint %" PRIu64 ", if any, are lost",
                 task, task, seq);
        return true;
    }
    bool crashed = last->state == CKPT_STOP_RUNNING;
    const char *after = crashed ? "; it did not shut down cleanly, so the updates it applied "
                                  "after that checkpoint are lost too"
                                : "; it had shut down cleanly after writing it";
    if (!restored) {
        if (last->seq == 0 && !crashed) {
            snprintf(msg, cap,
                     "ps %u starts empty, as the previous one left it (it wrote no "
                     "checkpoint and shut down cleanly)",
                     task);
            return false;
        }
        if (last->seq == 0) {
            snprintf(msg, cap,
                     "ps %u starts empty: the previous one wrote no checkpoint and did not "
                     "shut down cleanly, so every update it applied is lost",
                     task);
            return true;
        }
        snprintf(msg, cap,
                 "ps %u starts empty, but the previous one wrote checkpoint %" PRIu64 " (%" PRIu64
                 " updates, as shard versions) and it is gone: all of them are "
                 "lost%s",
                 task, last->seq, last->versions, after);
        return true;
    }
    if (last->seq > seq) {
        uint64_t lost = last->versions > versions ? last->versions - versions : 0;
        snprintf(msg, cap,
                 "ps %u: checkpoint %" PRIu64 ", the newest the previous server wrote, could "
                 "not be restored; checkpoint %" PRIu64 " was: %" PRIu64
                 " updates (as shard versions, %" PRIu64 " against %" PRIu64
                 ") that checkpoint %" PRIu64 " held are lost%s",
                 task, last->seq, seq, lost, last->versions, versions, last->seq, after);
        return true;
    }
    if (crashed) {
        snprintf(msg, cap,
                 "ps %u did not shut down cleanly: the updates it applied after checkpoint "
                 "%" PRIu64 " are lost (clients that had them acknowledged log how many)",
                 task, seq);
        return true;
    }
    if (last->seq == seq && last->versions == versions) {
        snprintf(msg, cap,
                 "ps %u shut down cleanly after writing checkpoint %" PRIu64
                 ": nothing was lost (it was restored whole)",
                 task, seq);
        return false;
    }
    snprintf(msg, cap,
             "ps %u: the previous server shut down cleanly after writing checkpoint %" PRIu64
             " (%" PRIu64 " updates), but checkpoint %" PRIu64 " (%" PRIu64
             ") was restored: what differs is not accounted for",
             task, last->seq, last->versions, seq, versions);
    return true;
}

bool ckpt_restore_verdict(const ckpt_record *last, uint32_t task, bool restored, uint64_t seq,
                          uint64_t versions, bool replicated, char *msg, size_t cap)
{
    bool lost = verdict_alone(last, task, restored, seq, versions, msg, cap);
    if (!lost || !replicated)
        return lost;
    /* Replicated: the checkpoint is this server's copy of its own group only; what it lacks is
     * lost only where no other member held it. */
    char had[64];
    if (restored)
        snprintf(had, sizeof(had), "checkpoint %" PRIu64 " restored", seq);
    else
        snprintf(had, sizeof(had), "no checkpoint restored");
    snprintf(msg, cap,
             "ps %u: the previous server %s (%s); with replicas its groups' state does not "
             "come from this checkpoint alone: each group is served from the newest copy in "
             "the view, and this server copies its groups back from their primaries as it "
             "rejoins, so what its predecessor applied is lost only where no other member held "
             "it (clients that had such updates acknowledged log how many)",
             task,
             last->state == CKPT_STOP_CLEAN ? "left a checkpoint that did not restore whole"
                                            : "did not shut down cleanly",
             had);
    return false;
}
