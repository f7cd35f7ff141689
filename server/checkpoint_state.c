#include "checkpoint_state.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "checkpoint.h"
#include "log.h"
#include "util.h"

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

bool ckpt_restore_verdict(const ckpt_record *last, uint32_t task, bool restored, uint64_t seq,
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
