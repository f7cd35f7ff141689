/* events.c - the TensorBoard event-file writer of events.h. */
#include "events.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"
#include "events.pb-c.h"
#include "log.h"
#include "timeutil.h"
#include "util.h"

#define EVENTS_ROTATE_DEFAULT (64u << 20)
#define EVENTS_FLUSH_MS_DEFAULT 2000u
#define EVENTS_BUFFER_MAX (256u << 10) /* written at once beyond this */

struct event_writer {
    char dir[4096];
    char path[4096 + 256];
    int fd;
    int64_t file_time; /* the seconds in the file's name */
    unsigned file_n;   /* the <n> of the name */
    uint64_t file_bytes;
    uint64_t rotate_bytes;
    uint64_t flush_ns;
    uint64_t last_flush_ns;
    unsigned char *buf; /* whole records not yet written */
    size_t len, cap;
    bool failed;
};

/* Frames the len bytes of data already at rec + 12: the length and its CRC before, the data's
 * CRC after. */
static void frame_in_place(unsigned char *rec, size_t len)
{
    uint64_t n = len;
    for (int i = 0; i < 8; i++)
        rec[i] = (unsigned char)(n >> (8 * i));
    uint32_t c = crc32c_mask(crc32c(0, rec, 8));
    for (int i = 0; i < 4; i++)
        rec[8 + i] = (unsigned char)(c >> (8 * i));
    c = crc32c_mask(crc32c(0, rec + 12, len));
    for (int i = 0; i < 4; i++)
        rec[12 + len + i] = (unsigned char)(c >> (8 * i));
}

size_t event_record_frame(unsigned char *out, const void *data, size_t len)
{
    memmove(out + 12, data, len);
    frame_in_place(out, len);
    return len + 16;
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int event_dir_make(const char *dir, char *err, size_t errlen)
{
    char p[4096];
    if (snprintf(p, sizeof(p), "%s", dir) >= (int)sizeof(p))
        return errf(err, errlen, "%s: path too long", dir);
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != '\0')
            continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0777) != 0 && errno != EEXIST)
            return errf(err, errlen, "cannot create %s: %s", p, strerror(errno));
        *s = c;
        if (c == '\0')
            break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return errf(err, errlen, "%s is not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0)
        return errf(err, errlen, "cannot write in %s: %s", dir, strerror(errno));
    return 0;
}

/* Stops the writer after a failed write, with one logged error. */
static int writer_fail(event_writer *w, const char *what, int e)
{
    if (!w->failed)
        log_error("event files in %s stop (training goes on): %s %s: %s", w->dir, what, w->path,
                  strerror(e));
    w->failed = true;
    w->len = 0;
    return -1;
}

/* Writes buf[0..len) with one write; a short or failed one is undone (the file truncated back
 * to its last whole record) and stops the writer. */
static int write_whole(event_writer *w, const unsigned char *buf, size_t len)
{
    if (len == 0)
        return 0;
    ssize_t n;
    do {
        n = write(w->fd, buf, len);
    } while (n < 0 && errno == EINTR);
    if (n == (ssize_t)len) {
        w->file_bytes += len;
        return 0;
    }
    int e = n < 0 ? errno : ENOSPC;
    if (ftruncate(w->fd, (off_t)w->file_bytes) == 0)
        lseek(w->fd, (off_t)w->file_bytes, SEEK_SET);
    return writer_fail(w, "writing", e);
}

static int append_event(event_writer *w, const Psd__Events__Event *ev);

/* Opens the next file (w->file_n) and writes its file_version record at once. */
static int open_file(event_writer *w, char *err, size_t errlen)
{
    char host[64];
    if (gethostname(host, sizeof(host)) != 0)
        snprintf(host, sizeof(host), "localhost");
    host[sizeof(host) - 1] = '\0';
    int64_t now = (int64_t)time(NULL);
    /* Names sort by their time: a later file never has an earlier or the same second. */
    w->file_time = now > w->file_time ? now : w->file_time + 1;
    snprintf(w->path, sizeof(w->path), "%s/events.out.tfevents.%010" PRId64 ".%s.%ld.%u", w->dir,
             w->file_time, host, (long)getpid(), w->file_n);
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (w->fd < 0)
        return errf(err, errlen, "cannot create %s: %s", w->path, strerror(errno));
    w->file_bytes = 0;
    Psd__Events__Event ev = PSD__EVENTS__EVENT__INIT;
    ev.wall_time = wall_now();
    ev.what_case = PSD__EVENTS__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)"brain.Event:2";
    if (append_event(w, &ev) != 0 || event_writer_flush(w) != 0)
        return errf(err, errlen, "cannot write %s", w->path);
    return 0;
}

/* Starts the next file once this one is full; a failure stops the writer. */
static int maybe_rotate(event_writer *w, size_t more)
{
    if (w->file_bytes == 0 || w->file_bytes + w->len + more <= w->rotate_bytes)
        return 0;
    if (event_writer_flush(w) != 0)
        return -1;
    close(w->fd);
    w->fd = -1;
    w->file_n++;
    char err[512];
    if (open_file(w, err, sizeof(err)) != 0) {
        if (!w->failed)
            log_error("event files in %s stop (training goes on): %s", w->dir, err);
        w->failed = true;
        return -1;
    }
    return 0;
}

/* Frames ev into the buffer; writes the buffer when it is due. */
static int append_event(event_writer *w, const Psd__Events__Event *ev)
{
    if (w->failed)
        return -1;
    size_t n = psd__events__event__get_packed_size(ev);
    if (w->fd >= 0 && ev->what_case != PSD__EVENTS__EVENT__WHAT_FILE_VERSION &&
        maybe_rotate(w, n + 16) != 0)
        return -1;
    if (w->len + n + 16 > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n + 16)
            cap *= 2;
        unsigned char *b = realloc(w->buf, cap);
        if (b == NULL)
            return -1;
        w->buf = b;
        w->cap = cap;
    }
    unsigned char *rec = w->buf + w->len;
    psd__events__event__pack(ev, rec + 12);
    frame_in_place(rec, n);
    w->len += n + 16;
    if (w->len >= EVENTS_BUFFER_MAX || time_now_ns() - w->last_flush_ns >= w->flush_ns)
        return event_writer_flush(w);
    return 0;
}

int event_writer_open(event_writer **out, const char *dir, const event_writer_options *opts,
                      char *err, size_t errlen)
{
    *out = NULL;
    if (dir == NULL || dir[0] == '\0')
        return errf(err, errlen, "empty directory name");
    event_writer *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return errf(err, errlen, "out of memory");
    w->fd = -1;
    if (snprintf(w->dir, sizeof(w->dir), "%s", dir) >= (int)sizeof(w->dir)) {
        free(w);
        return errf(err, errlen, "%s: path too long", dir);
    }
    w->rotate_bytes = opts && opts->rotate_bytes ? opts->rotate_bytes : EVENTS_ROTATE_DEFAULT;
    w->flush_ns =
        (uint64_t)(opts && opts->flush_ms ? opts->flush_ms : EVENTS_FLUSH_MS_DEFAULT) * 1000000u;
    w->last_flush_ns = time_now_ns();
    if (event_dir_make(dir, err, errlen) != 0 || open_file(w, err, errlen) != 0) {
        event_writer_close(w);
        return -1;
    }
    *out = w;
    return 0;
}

void event_writer_close(event_writer *w)
{
    if (w == NULL)
        return;
    if (w->fd >= 0) {
        event_writer_flush(w);
        close(w->fd);
    }
    free(w->buf);
    free(w);
}

int event_writer_flush(event_writer *w)
{
    if (w->failed)
        return -1;
    w->last_flush_ns = time_now_ns();
    int rc = write_whole(w, w->buf, w->len);
    w->len = 0;
    return rc;
}

bool event_writer_failed(const event_writer *w)
{
    return w->failed;
}

const char *event_writer_path(const event_writer *w)
{
    return w->path;
}

int event_writer_scalars(event_writer *w, int64_t step, double wall_time, const event_scalar *v,
                         size_t n)
{
    if (w->failed)
        return -1;
    Psd__Events__Summary__Value *pv = calloc(n > 0 ? n : 1, sizeof(*pv));
    Psd__Events__Summary__Value **pp = calloc(n > 0 ? n : 1, sizeof(*pp));
    if (pv == NULL || pp == NULL) {
        free(pv);
        free(pp);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        psd__events__summary__value__init(&pv[i]);
        pv[i].tag = (char *)v[i].tag;
        pv[i].value_case = PSD__EVENTS__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
        pv[i].simple_value = (float)v[i].value;
        pp[i] = &pv[i];
    }
    Psd__Events__Summary sum = PSD__EVENTS__SUMMARY__INIT;
    sum.n_value = n;
    sum.value = pp;
    Psd__Events__Event ev = PSD__EVENTS__EVENT__INIT;
    ev.wall_time = wall_time > 0 ? wall_time : wall_now();
    ev.step = step;
    ev.what_case = PSD__EVENTS__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    int rc = append_event(w, &ev);
    free(pv);
    free(pp);
    return rc;
}

/* TensorFlow's default bucket limits: -DBL_MAX, -1e20.., -1e-12, 0, 1e-12, .., 1e20, DBL_MAX
 * (the positive ones 1e-12 * 1.1^k below 1e20). */
static double *hist_limits;
static size_t hist_nlimits;
static pthread_once_t hist_once = PTHREAD_ONCE_INIT;

static void hist_init(void)
{
    size_t npos = 0;
    for (double v = 1e-12; v < 1e20; v *= 1.1)
        npos++;
    npos++; /* DBL_MAX */
    hist_limits = malloc((2 * npos + 1) * sizeof(double));
    if (hist_limits == NULL)
        return;
    size_t k = npos + 1;
    for (double v = 1e-12; v < 1e20; v *= 1.1)
        hist_limits[k++] = v;
    hist_limits[2 * npos] = DBL_MAX;
    for (size_t i = 0; i < npos; i++)
        hist_limits[i] = -hist_limits[2 * npos - i];
    hist_limits[npos] = 0.0;
    hist_nlimits = 2 * npos + 1;
}

/* The bucket of x: the first limit above it. */
static size_t hist_bucket(double x)
{
    size_t lo = 0, hi = hist_nlimits - 1;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (hist_limits[mid] > x)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

int event_writer_histogram(event_writer *w, int64_t step, double wall_time, const char *tag,
                           const float *values, size_t n)
{
    if (w->failed)
        return -1;
    pthread_once(&hist_once, hist_init);
    if (hist_limits == NULL)
        return -1;
    double *counts = calloc(hist_nlimits, sizeof(double));
    double *lim = malloc(hist_nlimits * sizeof(double));
    double *cnt = malloc(hist_nlimits * sizeof(double));
    int rc = -1;
    if (counts == NULL || lim == NULL || cnt == NULL)
        goto out;
    Psd__Events__HistogramProto h = PSD__EVENTS__HISTOGRAM_PROTO__INIT;
    h.min = n ? DBL_MAX : 0.0;
    h.max = n ? -DBL_MAX : 0.0;
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        double x = values[i];
        if (x != x) /* NaN: no bucket */
            continue;
        used++;
        counts[hist_bucket(x)] += 1.0;
        h.min = x < h.min ? x : h.min;
        h.max = x > h.max ? x : h.max;
        h.sum += x;
        h.sum_squares += x * x;
    }
    if (used == 0)
        h.min = h.max = 0.0;
    h.num = (double)used;
    /* Runs of empty buckets become one, ending where the run ends (as TensorFlow writes). */
    size_t k = 0;
    for (size_t i = 0; i < hist_nlimits;) {
        double end = hist_limits[i], c = counts[i];
        i++;
        if (c <= 0.0)
            while (i < hist_nlimits && counts[i] <= 0.0)
                end = hist_limits[i++];
        lim[k] = end;
        cnt[k++] = c;
    }
    h.n_bucket_limit = h.n_bucket = k;
    h.bucket_limit = lim;
    h.bucket = cnt;
    Psd__Events__Summary__Value val = PSD__EVENTS__SUMMARY__VALUE__INIT;
    val.tag = (char *)tag;
    val.value_case = PSD__EVENTS__SUMMARY__VALUE__VALUE_HISTO;
    val.histo = &h;
    Psd__Events__Summary__Value *pval = &val;
    Psd__Events__Summary sum = PSD__EVENTS__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = &pval;
    Psd__Events__Event ev = PSD__EVENTS__EVENT__INIT;
    ev.wall_time = wall_time > 0 ? wall_time : wall_now();
    ev.step = step;
    ev.what_case = PSD__EVENTS__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    rc = append_event(w, &ev);
out:
    free(counts);
    free(lim);
    free(cnt);
    return rc;
}
