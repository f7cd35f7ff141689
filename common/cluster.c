/* cluster.c - TF_CONFIG-compatible cluster spec; see cluster.h. */
#include "cluster.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <json-c/json.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

#define CLUSTER_ADDR_MAX 320 /* [IPv6%zone] or a 253-byte name, plus :port; ipc:// fits */
#define CLUSTER_FILE_MAX (1024 * 1024)
#define CLUSTER_QUOTE_MAX 80

/* Jobs that hold addresses, in the order of cluster_spec's fields. */
enum { CLUSTER_JOB_PS, CLUSTER_JOB_WORKER, CLUSTER_JOB_CHIEF, CLUSTER_JOB_COUNT };
static const char *const cluster_jobs[CLUSTER_JOB_COUNT] = {"ps", "worker", "chief"};
#define CLUSTER_TYPES "ps, worker, chief, evaluator"

/* Prefixes the message already in err with "prefix: ". */
static void cluster_err_prefix(char *err, size_t errlen, const char *prefix)
{
    char *copy;

    if (err == NULL || errlen == 0)
        return;
    copy = strdup(err);
    if (copy == NULL)
        return;
    snprintf(err, errlen, "%s: %s", prefix, copy);
    free(copy);
}

/* Writes s double-quoted, printable and length-limited, for messages. */
static const char *cluster_quote(char *buf, size_t cap, const char *s)
{
    return quote_text(buf, cap, s, CLUSTER_QUOTE_MAX);
}

/* The list and count fields of one job. */
static char ***cluster_job_slot(cluster_spec *c, int job, size_t **n)
{
    switch (job) {
    case CLUSTER_JOB_PS:
        *n = &c->n_ps;
        return &c->ps;
    case CLUSTER_JOB_WORKER:
        *n = &c->n_worker;
        return &c->worker;
    default:
        *n = &c->n_chief;
        return &c->chief;
    }
}

static size_t cluster_job_count(const cluster_spec *c, int job)
{
    return job == CLUSTER_JOB_PS ? c->n_ps : job == CLUSTER_JOB_WORKER ? c->n_worker : c->n_chief;
}

static int cluster_job_index(const char *type)
{
    for (int j = 0; j < CLUSTER_JOB_COUNT; j++)
        if (strcmp(type, cluster_jobs[j]) == 0)
            return j;
    return -1;
}

void cluster_fini(cluster_spec *c)
{
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_ps; i++)
        free(c->ps[i]);
    for (size_t i = 0; i < c->n_worker; i++)
        free(c->worker[i]);
    for (size_t i = 0; i < c->n_chief; i++)
        free(c->chief[i]);
    free(c->ps);
    free(c->worker);
    free(c->chief);
    memset(c, 0, sizeof *c);
}

/* ---- addresses ---- */

/* A DNS name: dot-separated labels of 1..63 [A-Za-z0-9_-], not starting or
 * ending with '-', 253 bytes at most. (Underscores appear in some container
 * host names, so they are tolerated.) */
static int cluster_check_dns_name(const char *h, size_t len)
{
    size_t label = 0;

    if (len == 0 || len > 253)
        return -1;
    for (size_t i = 0; i <= len; i++) {
        char c = i < len ? h[i] : '.';
        if (c == '.') {
            if (label == 0 || label > 63 || h[i - 1] == '-')
                return -1;
            label = 0;
        } else if (isalnum((unsigned char)c) || c == '_' || (c == '-' && label > 0)) {
            label++;
        } else {
            return -1;
        }
    }
    return 0;
}

bool cluster_is_ipc(const char *addr)
{
    return addr != NULL && strncmp(addr, CLUSTER_IPC_PREFIX, strlen(CLUSTER_IPC_PREFIX)) == 0;
}

/* Checks "ipc://PATH": a non-empty path that fits a Unix socket address (sun_path). */
static int cluster_check_ipc(const char *a, char *why, size_t whylen)
{
    const char *path = a + strlen(CLUSTER_IPC_PREFIX);
    size_t len = strlen(path);

    if (len == 0) {
        errf(why, whylen, "empty ipc:// path");
        return -1;
    }
    if (len > CLUSTER_IPC_PATH_MAX) {
        errf(why, whylen, "ipc:// path longer than %d bytes (a Unix socket path's limit)",
             CLUSTER_IPC_PATH_MAX);
        return -1;
    }
    return 0;
}

/* Checks "host:port" or "ipc://PATH"; on error writes why into buf and returns -1, with
 * *scheme set when the address has a URL scheme other than ipc://. */
static int cluster_check_address(const char *a, char *why, size_t whylen, bool *scheme)
{
    char host[CLUSTER_ADDR_MAX];
    const char *port, *colon, *sep;
    size_t hlen;
    long p = 0;

    *scheme = false;
    if (a[0] == '\0') {
        errf(why, whylen, "empty address");
        return -1;
    }
    if (cluster_is_ipc(a))
        return cluster_check_ipc(a, why, whylen);
    sep = strstr(a, "://");
    if (sep != NULL) {
        *scheme = true;
        errf(why, whylen, "unsupported scheme \"%.*s://\": use host:port (TCP) or ipc:///path",
             (int)(sep - a < 16 ? sep - a : 16), a);
        return -1;
    }
    if (strlen(a) >= CLUSTER_ADDR_MAX) {
        errf(why, whylen, "longer than %d bytes", CLUSTER_ADDR_MAX - 1);
        return -1;
    }
    if (a[0] == '[') {
        const char *close = strchr(a, ']');
        char *zone;
        struct in6_addr in6;
        if (close == NULL) {
            errf(why, whylen, "IPv6 address lacks its closing ']'");
            return -1;
        }
        if (close[1] != ':') {
            errf(why, whylen, "missing :port after ']'");
            return -1;
        }
        hlen = (size_t)(close - a - 1);
        memcpy(host, a + 1, hlen);
        host[hlen] = '\0';
        zone = strchr(host, '%');
        if (zone != NULL) {
            if (zone[1] == '\0' ||
                strspn(zone + 1, "abcdefghijklmnopqrstuvwxyz"
                                 "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != strlen(zone + 1)) {
                errf(why, whylen, "bad IPv6 zone");
                return -1;
            }
            *zone = '\0';
        }
        if (inet_pton(AF_INET6, host, &in6) != 1) {
            errf(why, whylen, "bad IPv6 address");
            return -1;
        }
        port = close + 2;
    } else {
        colon = strrchr(a, ':');
        if (colon == NULL) {
            errf(why, whylen, "missing :port");
            return -1;
        }
        if (strchr(a, ':') != colon) {
            errf(why, whylen, "an IPv6 host must be in brackets, e.g. [::1]:2222");
            return -1;
        }
        hlen = (size_t)(colon - a);
        if (hlen == 0) {
            errf(why, whylen, "empty host");
            return -1;
        }
        memcpy(host, a, hlen);
        host[hlen] = '\0';
        if (strspn(host, "0123456789.") == hlen) {
            struct in_addr in4;
            if (inet_pton(AF_INET, host, &in4) != 1) {
                errf(why, whylen, "bad IPv4 address");
                return -1;
            }
        } else if (cluster_check_dns_name(host, hlen) != 0) {
            errf(why, whylen, "bad host name");
            return -1;
        }
        port = colon + 1;
    }
    if (port[0] == '\0') {
        errf(why, whylen, "empty port");
        return -1;
    }
    if (strspn(port, "0123456789") != strlen(port) || strlen(port) > 5) {
        errf(why, whylen, "port is not a number in 1..65535");
        return -1;
    }
    p = strtol(port, NULL, 10);
    if (p < 1 || p > 65535) {
        errf(why, whylen, "port %ld out of range 1..65535", p);
        return -1;
    }
    return 0;
}

/* Parses cl[job] (absent = empty) into a freshly allocated list. */
static int cluster_parse_job(struct json_object *cl, int job, cluster_spec *c, char *err,
                             size_t errlen)
{
    const char *name = cluster_jobs[job];
    struct json_object *arr;
    char why[128], q[CLUSTER_QUOTE_MAX + 16];
    char **list;
    size_t n, *np;
    bool scheme;

    if (!json_object_object_get_ex(cl, name, &arr))
        return 0;
    if (!json_object_is_type(arr, json_type_array)) {
        errf(err, errlen, "cluster.%s: expected an array of \"host:port\" strings, got %s", name,
             json_type_to_name(json_object_get_type(arr)));
        return -1;
    }
    n = json_object_array_length(arr);
    list = calloc(n > 0 ? n : 1, sizeof *list);
    if (list == NULL) {
        errf(err, errlen, "cluster.%s: out of memory", name);
        return -1;
    }
    /* Hand the list to c at once so that cluster_fini frees a partial one. */
    *cluster_job_slot(c, job, &np) = list;
    for (size_t i = 0; i < n; i++) {
        struct json_object *e = json_object_array_get_idx(arr, i);
        const char *s;
        if (!json_object_is_type(e, json_type_string)) {
            errf(err, errlen, "cluster.%s[%zu]: expected a \"host:port\" string, got %s", name, i,
                 json_type_to_name(json_object_get_type(e)));
            return -1;
        }
        s = json_object_get_string(e);
        if (strlen(s) != (size_t)json_object_get_string_len(e)) {
            errf(err, errlen, "cluster.%s[%zu]: address contains a NUL character", name, i);
            return -1;
        }
        if (cluster_check_address(s, why, sizeof why, &scheme) != 0) {
            if (scheme || cluster_is_ipc(s))
                errf(err, errlen, "cluster.%s[%zu]: %s: %s", name, i, cluster_quote(q, sizeof q, s),
                     why);
            else
                errf(err, errlen, "cluster.%s[%zu]: %s is not host:port (%s)", name, i,
                     cluster_quote(q, sizeof q, s), why);
            return -1;
        }
        list[i] = strdup(s);
        if (list[i] == NULL) {
            errf(err, errlen, "cluster.%s[%zu]: out of memory", name, i);
            return -1;
        }
        (*np)++;
    }
    return 0;
}

typedef struct cluster_addr_ref {
    const char *addr;
    int job;
    size_t index;
} cluster_addr_ref;

static int cluster_addr_ref_cmp(const void *a, const void *b)
{
    const cluster_addr_ref *x = a, *y = b;
    int c = strcasecmp(x->addr, y->addr);

    if (c != 0)
        return c;
    if (x->job != y->job)
        return x->job < y->job ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* Fails if any address appears twice (host names compare case-insensitively). */
static int cluster_check_duplicates(cluster_spec *c, char *err, size_t errlen)
{
    size_t total = c->n_ps + c->n_worker + c->n_chief, k = 0;
    cluster_addr_ref *refs;
    char q[CLUSTER_QUOTE_MAX + 16];

    if (total < 2)
        return 0;
    refs = calloc(total, sizeof *refs);
    if (refs == NULL) {
        errf(err, errlen, "cluster: out of memory");
        return -1;
    }
    for (int j = 0; j < CLUSTER_JOB_COUNT; j++) {
        size_t *n;
        char **list = *cluster_job_slot(c, j, &n);
        for (size_t i = 0; i < *n; i++)
            refs[k++] = (cluster_addr_ref){list[i], j, i};
    }
    qsort(refs, total, sizeof *refs, cluster_addr_ref_cmp);
    for (size_t i = 1; i < total; i++) {
        if (strcasecmp(refs[i - 1].addr, refs[i].addr) == 0) {
            errf(err, errlen, "cluster.%s[%zu]: address %s duplicates cluster.%s[%zu]",
                 cluster_jobs[refs[i].job], refs[i].index, cluster_quote(q, sizeof q, refs[i].addr),
                 cluster_jobs[refs[i - 1].job], refs[i - 1].index);
            free(refs);
            return -1;
        }
    }
    free(refs);
    return 0;
}

/* ---- task ---- */

/* Validates (type, index) against c; type_path/index_path start messages. */
static int cluster_check_task(const cluster_spec *c, const char *type, long long index,
                              const char *type_path, const char *index_path, char *err,
                              size_t errlen)
{
    char q[CLUSTER_QUOTE_MAX + 16];
    int job = cluster_job_index(type);
    size_t n;

    if (job < 0 && strcmp(type, "evaluator") != 0) {
        errf(err, errlen, "%s %s is not one of " CLUSTER_TYPES, type_path,
             cluster_quote(q, sizeof q, type));
        return -1;
    }
    if (index < 0 || index > INT_MAX) {
        errf(err, errlen, "%s %lld out of range: must be 0 or more", index_path, index);
        return -1;
    }
    if (job < 0)
        return 0; /* evaluators run beside the cluster, without an address */
    n = cluster_job_count(c, job);
    if (n == 0) {
        errf(err, errlen, "%s %s: cluster has no %s tasks", type_path,
             cluster_quote(q, sizeof q, type), type);
        return -1;
    }
    if ((unsigned long long)index >= n) {
        errf(err, errlen, "%s %lld out of range: cluster has %zu %s task%s", index_path, index, n,
             type, n == 1 ? "" : "s");
        return -1;
    }
    return 0;
}

static int cluster_parse_task(struct json_object *task, cluster_spec *c, char *err, size_t errlen)
{
    struct json_object *type, *index;
    bool has_type, has_index;
    const char *t;
    int64_t i;

    if (task == NULL || json_object_is_type(task, json_type_null))
        return 0;
    if (!json_object_is_type(task, json_type_object)) {
        errf(err, errlen, "task: expected an object {\"type\": ..., \"index\": ...}, got %s",
             json_type_to_name(json_object_get_type(task)));
        return -1;
    }
    has_type = json_object_object_get_ex(task, "type", &type);
    has_index = json_object_object_get_ex(task, "index", &index);
    if (!has_type && !has_index)
        return 0; /* TF_CONFIG may carry an empty task */
    if (!has_type) {
        errf(err, errlen, "task.type: missing (task has an index but no type)");
        return -1;
    }
    if (!has_index) {
        errf(err, errlen, "task.index: missing (task has a type but no index)");
        return -1;
    }
    if (!json_object_is_type(type, json_type_string)) {
        errf(err, errlen, "task.type: expected a string, got %s",
             json_type_to_name(json_object_get_type(type)));
        return -1;
    }
    if (!json_object_is_type(index, json_type_int)) {
        errf(err, errlen, "task.index: expected an integer, got %s",
             json_type_to_name(json_object_get_type(index)));
        return -1;
    }
    t = json_object_get_string(type);
    i = json_object_get_int64(index);
    if (cluster_check_task(c, t, i, "task.type", "task.index", err, errlen) != 0)
        return -1;
    snprintf(c->task_type, sizeof c->task_type, "%s", t);
    c->task_index = (int)i;
    return 0;
}

int cluster_set_task(cluster_spec *c, const char *task, char *err, size_t errlen)
{
    char q[CLUSTER_QUOTE_MAX + 16], type[16], type_path[CLUSTER_QUOTE_MAX + 32],
        index_path[CLUSTER_QUOTE_MAX + 32];
    const char *colon;
    size_t tlen;
    long long index;

    if (c == NULL || task == NULL) {
        errf(err, errlen, "task: NULL %s", c == NULL ? "cluster" : "task");
        return -1;
    }
    cluster_quote(q, sizeof q, task);
    colon = strrchr(task, ':');
    tlen = colon != NULL ? (size_t)(colon - task) : 0;
    if (colon == NULL || tlen == 0 || tlen >= sizeof type || colon[1] == '\0' ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) || strlen(colon + 1) > 9) {
        errf(err, errlen, "task %s: expected type:index, e.g. worker:0", q);
        return -1;
    }
    memcpy(type, task, tlen);
    type[tlen] = '\0';
    index = strtoll(colon + 1, NULL, 10);
    snprintf(type_path, sizeof type_path, "task %s: type", q);
    snprintf(index_path, sizeof index_path, "task %s: index", q);
    if (cluster_check_task(c, type, index, type_path, index_path, err, errlen) != 0)
        return -1;
    snprintf(c->task_type, sizeof c->task_type, "%s", type);
    c->task_index = (int)index;
    return 0;
}

/* ---- whole spec ---- */

int cluster_parse(const char *json, cluster_spec *out, char *err, size_t errlen)
{
    struct json_tokener *tok = NULL;
    struct json_object *root = NULL, *cl, *task = NULL;
    size_t len;
    int rc = -1;

    if (out == NULL) {
        errf(err, errlen, "cluster: NULL output");
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->task_index = -1;
    if (json == NULL || json[strspn(json, " \t\r\n")] == '\0') {
        errf(err, errlen, "cluster spec is empty");
        goto fail;
    }
    len = strlen(json);
    if (len > INT_MAX) {
        errf(err, errlen, "cluster spec is too large");
        goto fail;
    }
    tok = json_tokener_new();
    if (tok == NULL) {
        errf(err, errlen, "cluster: out of memory");
        goto fail;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT);
    root = json_tokener_parse_ex(tok, json, (int)len);
    {
        enum json_tokener_error jerr = json_tokener_get_error(tok);
        size_t end = json_tokener_get_parse_end(tok);
        if (root == NULL || jerr != json_tokener_success ||
            json[end + strspn(json + end, " \t\r\n")] != '\0') {
            size_t line = 1, col = 1;
            for (size_t i = 0; i < end && i < len; i++) {
                col = json[i] == '\n' ? 1 : col + 1;
                line += json[i] == '\n';
            }
            if (root != NULL)
                errf(err, errlen, "invalid JSON at line %zu, column %zu: trailing data", line, col);
            else if (jerr == json_tokener_continue)
                errf(err, errlen, "invalid JSON: unexpected end of text");
            else
                errf(err, errlen, "invalid JSON at line %zu, column %zu: %s", line, col,
                     json_tokener_error_desc(jerr));
            goto fail;
        }
    }
    if (!json_object_is_type(root, json_type_object)) {
        errf(err, errlen, "cluster spec: expected a JSON object, got %s",
             json_type_to_name(json_object_get_type(root)));
        goto fail;
    }
    if (json_object_object_get_ex(root, "cluster", &cl)) {
        json_object_object_get_ex(root, "task", &task);
        if (!json_object_is_type(cl, json_type_object)) {
            errf(err, errlen, "cluster: expected an object of job lists, got %s",
                 json_type_to_name(json_object_get_type(cl)));
            goto fail;
        }
    } else {
        cl = root; /* a bare cluster object */
        if (json_object_object_get_ex(root, "task", NULL)) {
            errf(err, errlen, "task: a task needs the {\"cluster\": {...}, \"task\": {...}} form");
            goto fail;
        }
    }
    for (int j = 0; j < CLUSTER_JOB_COUNT; j++)
        if (cluster_parse_job(cl, j, out, err, errlen) != 0)
            goto fail;
    if (out->n_ps == 0) {
        errf(err, errlen, "cluster.ps: %s; at least one ps task is required",
             json_object_object_get_ex(cl, "ps", NULL) ? "empty" : "missing");
        goto fail;
    }
    if (cluster_check_duplicates(out, err, errlen) != 0 ||
        cluster_parse_task(task, out, err, errlen) != 0)
        goto fail;
    rc = 0;
    goto out;
fail:
    cluster_fini(out);
out:
    json_object_put(root);
    if (tok != NULL)
        json_tokener_free(tok);
    return rc;
}

int cluster_from_options(const options *o, cluster_spec *out, char *err, size_t errlen)
{
    const char *spec, *task;
    char source[256];
    char *file = NULL;
    size_t len = 0;
    int rc;

    if (out == NULL) {
        errf(err, errlen, "cluster: NULL output");
        return -1;
    }
    memset(out, 0, sizeof *out);
    if (o == NULL) {
        errf(err, errlen, "cluster: NULL options");
        return -1;
    }
    spec = opt_str(o, OPT_CLUSTER);
    if (spec[0] == '@') {
        snprintf(source, sizeof source, "cluster file %s", spec + 1);
        file = read_file(spec + 1, CLUSTER_FILE_MAX, &len, err, errlen);
        if (file != NULL && strlen(file) != len) {
            errf(err, errlen, "contains a NUL byte");
            free(file);
            file = NULL;
        }
        if (file == NULL) {
            cluster_err_prefix(err, errlen, source);
            return -1;
        }
        spec = file;
    } else if (spec[0] != '\0') {
        snprintf(source, sizeof source, "--cluster");
    } else {
        spec = opt_str(o, OPT_TF_CONFIG);
        if (spec[0] == '\0') {
            errf(err, errlen, "no cluster spec: set TF_CONFIG or --cluster");
            return -1;
        }
        snprintf(source, sizeof source, "TF_CONFIG");
    }
    rc = cluster_parse(spec, out, err, errlen);
    free(file);
    if (rc != 0) {
        cluster_err_prefix(err, errlen, source);
        return -1;
    }
    task = opt_str(o, OPT_TASK);
    if (task[0] != '\0' && cluster_set_task(out, task, err, errlen) != 0) {
        cluster_err_prefix(err, errlen, "--task");
        cluster_fini(out);
        return -1;
    }
    return 0;
}

int cluster_url(const char *hostport, char *buf, size_t cap)
{
    int n;

    if (buf == NULL || cap == 0)
        return -1;
    buf[0] = '\0';
    if (hostport == NULL || hostport[0] == '\0')
        return -1;
    n = cluster_is_ipc(hostport) ? snprintf(buf, cap, "%s", hostport)
                                 : snprintf(buf, cap, "tcp://%s", hostport);
    if (n < 0 || (size_t)n >= cap) {
        buf[0] = '\0';
        return -1;
    }
    return 0;
}

const char *cluster_task_address(const cluster_spec *c)
{
    int job;
    size_t *n;

    if (c == NULL || c->task_type[0] == '\0' || c->task_index < 0)
        return NULL;
    job = cluster_job_index(c->task_type);
    if (job < 0 || (size_t)c->task_index >= cluster_job_count(c, job))
        return NULL;
    return (*cluster_job_slot((cluster_spec *)c, job, &n))[c->task_index];
}
