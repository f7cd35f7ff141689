/* view_record.c - the view of a replicated cluster as JSON, and its keys in etcd
 * (view_etcd.h). */
#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "util.h"
#include "view_etcd.h"

static json_object *j_obj(json_object *obj, const char *field)
{
    json_object *f;
    return obj && json_object_object_get_ex(obj, field, &f) ? f : NULL;
}

char *view_to_json(const view_record *r)
{
    const view *v = &r->v;
    size_t n = v->num_servers <= VIEW_MAX_SERVERS ? v->num_servers : VIEW_MAX_SERVERS;
    size_t cap = 128 + n * 64;
    char *s = malloc(cap);
    if (s == NULL)
        return NULL;
    size_t o = (size_t)snprintf(s, cap,
                                "{\"epoch\":%" PRIu64 ",\"num_servers\":%u,\"replicas\":%u,"
                                "\"primary\":[",
                                v->epoch, v->num_servers, v->replicas);
    for (size_t g = 0; g < n; g++)
        o += (size_t)snprintf(s + o, cap - o, "%s%d", g ? "," : "", (int)v->primary[g]);
    o += (size_t)snprintf(s + o, cap - o, "],\"live\":[");
    bool first = true;
    for (size_t i = 0; i < n; i++)
        if (v->live[i]) {
            o += (size_t)snprintf(s + o, cap - o, "%s%zu", first ? "" : ",", i);
            first = false;
        }
    o += (size_t)snprintf(s + o, cap - o, "],\"lease\":[");
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(s + o, cap - o, "%s\"%" PRId64 "\"", i ? "," : "",
                              v->live[i] ? r->lease[i] : 0);
    o += (size_t)snprintf(s + o, cap - o, "],\"behind\":[");
    for (size_t g = 0; g < n; g++)
        o += (size_t)snprintf(s + o, cap - o, "%s%" PRIu64, g ? "," : "", v->behind[g]);
    snprintf(s + o, cap - o, "]}");
    return s;
}

static bool j_get_uint(json_object *o, const char *field, uint64_t max, uint64_t *out)
{
    json_object *f = j_obj(o, field);
    if (f == NULL || !json_object_is_type(f, json_type_int))
        return false;
    int64_t x = json_object_get_int64(f);
    if (x < 0 || (uint64_t)x > max)
        return false;
    *out = (uint64_t)x;
    return true;
}

json_object *etcd_json_parse(const char *text)
{
    json_tokener *tok = json_tokener_new();
    json_object *j = tok ? json_tokener_parse_ex(tok, text, (int)strlen(text)) : NULL;
    bool complete = tok && json_tokener_get_error(tok) == json_tokener_success &&
                    text[strspn(text + json_tokener_get_parse_end(tok), " \t\r\n") +
                         json_tokener_get_parse_end(tok)] == '\0';
    json_tokener_free(tok);
    if (!complete && j != NULL) {
        json_object_put(j);
        j = NULL;
    }
    return j;
}

int view_from_json(const char *text, view_record *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    json_object *j = etcd_json_parse(text);
    int rc = ETCD_EFAILED;
    uint64_t epoch, ns, rep;
    json_object *prim, *live, *lease, *behind;
    if (j == NULL || !json_object_is_type(j, json_type_object)) {
        errf(err, errlen, "view: not a JSON object");
        goto out;
    }
    if (!j_get_uint(j, "epoch", INT64_MAX, &epoch) || epoch == 0) {
        errf(err, errlen, "view: \"epoch\" is missing or not a positive integer");
        goto out;
    }
    if (!j_get_uint(j, "num_servers", VIEW_MAX_SERVERS, &ns) || ns == 0) {
        errf(err, errlen, "view: \"num_servers\" is missing or not in 1..%d", VIEW_MAX_SERVERS);
        goto out;
    }
    if (!j_get_uint(j, "replicas", ns, &rep) || rep == 0) {
        errf(err, errlen, "view: \"replicas\" is missing or not in 1..num_servers");
        goto out;
    }
    r->v.epoch = epoch;
    r->v.num_servers = (uint32_t)ns;
    r->v.replicas = (uint32_t)rep;
    prim = j_obj(j, "primary");
    live = j_obj(j, "live");
    lease = j_obj(j, "lease");
    if (prim == NULL || !json_object_is_type(prim, json_type_array) ||
        json_object_array_length(prim) != ns) {
        errf(err, errlen, "view: \"primary\" must be an array of num_servers (%u) entries",
             (unsigned)ns);
        goto out;
    }
    if (live == NULL || !json_object_is_type(live, json_type_array)) {
        errf(err, errlen, "view: \"live\" must be an array of server indices");
        goto out;
    }
    for (size_t i = 0; i < json_object_array_length(live); i++) {
        json_object *e = json_object_array_get_idx(live, i);
        int64_t x = json_object_get_int64(e);
        if (!json_object_is_type(e, json_type_int) || x < 0 || (uint64_t)x >= ns) {
            errf(err, errlen, "view: \"live\"[%zu] is not a server index below %u", i,
                 (unsigned)ns);
            goto out;
        }
        r->v.live[x] = 1;
    }
    for (size_t g = 0; g < ns; g++) {
        json_object *e = json_object_array_get_idx(prim, g);
        int64_t x = json_object_get_int64(e);
        if (!json_object_is_type(e, json_type_int) || x < -1 || x >= (int64_t)ns ||
            (x >= 0 && !view_is_member(&r->v, (uint32_t)g, (uint32_t)x))) {
            errf(err, errlen, "view: \"primary\"[%zu] is not -1 or a member of group %zu", g, g);
            goto out;
        }
        r->v.primary[g] = (int32_t)x;
    }
    if (lease != NULL) {
        if (!json_object_is_type(lease, json_type_array) || json_object_array_length(lease) != ns) {
            errf(err, errlen, "view: \"lease\" must be an array of num_servers (%u) entries",
                 (unsigned)ns);
            goto out;
        }
        for (size_t i = 0; i < ns; i++)
            r->lease[i] = json_object_get_int64(json_object_array_get_idx(lease, i));
    }
    /* Absent in views written before in-sync sets were kept: every member in sync. */
    behind = j_obj(j, "behind");
    if (behind != NULL) {
        if (!json_object_is_type(behind, json_type_array) ||
            json_object_array_length(behind) != ns) {
            errf(err, errlen, "view: \"behind\" must be an array of num_servers (%u) entries",
                 (unsigned)ns);
            goto out;
        }
        uint64_t all = rep >= 64 ? UINT64_MAX : ((uint64_t)1 << rep) - 1;
        for (size_t g = 0; g < ns; g++) {
            json_object *e = json_object_array_get_idx(behind, g);
            int64_t x = json_object_is_type(e, json_type_int) ? json_object_get_int64(e) : -1;
            if (x < 0 || ((uint64_t)x & ~all) != 0) {
                errf(err, errlen,
                     "view: \"behind\"[%zu] is not a bit set of the group's %u members", g,
                     (unsigned)rep);
                goto out;
            }
            r->v.behind[g] = (uint64_t)x;
        }
    }
    rc = 0;
out:
    json_object_put(j);
    return rc;
}

int view_etcd_read(etcd_client *c, const char *prefix, view_record *r, int64_t *mod_rev, char *err,
                   size_t errlen)
{
    char key[600], *text = NULL;
    snprintf(key, sizeof(key), "%s/view", prefix);
    int rc = etcd_get(c, key, &text, NULL, mod_rev, err, errlen);
    if (rc != 0)
        return rc;
    char e1[300];
    rc = view_from_json(text, r, e1, sizeof(e1));
    if (rc != 0)
        errf(err, errlen, "etcd %s: %s holds no valid view: %s", etcd_client_endpoint(c), key, e1);
    free(text);
    return rc;
}

int view_etcd_cas(etcd_client *c, const char *prefix, const view_record *r, int64_t expect_mod_rev,
                  int64_t *new_rev, char *err, size_t errlen)
{
    char key[600];
    snprintf(key, sizeof(key), "%s/view", prefix);
    char *text = view_to_json(r);
    if (text == NULL)
        return errf(err, errlen, "out of memory"), ETCD_EFAILED;
    int rc = etcd_cas(c, key, expect_mod_rev, text, strlen(text), new_rev, err, errlen);
    free(text);
    return rc;
}

int view_etcd_register(etcd_client *c, const char *prefix, uint32_t index, const char *url,
                       int64_t lease_id, char *err, size_t errlen)
{
    char key[600];
    snprintf(key, sizeof(key), "%s/servers/%u", prefix, index);
    return etcd_put(c, key, url, strlen(url), lease_id, err, errlen);
}

/* The index that ends a key read under a prefix of kl bytes ("<prefix>/servers/3"): true with
 * it in *out when it is a decimal number below n (and VIEW_MAX_SERVERS). */
static bool key_index(const char *key, int kl, uint32_t n, unsigned long *out)
{
    const char *idx = key + kl;
    char *end;
    unsigned long i = strtoul(idx, &end, 10);
    if (idx[0] < '0' || idx[0] > '9' || *end != '\0' || i >= n || i >= VIEW_MAX_SERVERS)
        return false;
    *out = i;
    return true;
}

int view_etcd_servers(etcd_client *c, const char *prefix, uint32_t num_servers,
                      int64_t lease[VIEW_MAX_SERVERS], char (*urls)[VIEW_URL_MAX], char *err,
                      size_t errlen)
{
    char key[600];
    int kl = snprintf(key, sizeof(key), "%s/servers/", prefix);
    memset(lease, 0, sizeof(int64_t) * VIEW_MAX_SERVERS);
    if (urls)
        memset(urls, 0, (size_t)VIEW_URL_MAX * VIEW_MAX_SERVERS);
    etcd_kv *kvs;
    size_t n;
    int rc = etcd_get_prefix(c, key, &kvs, &n, err, errlen);
    if (rc != 0)
        return rc;
    for (size_t k = 0; k < n; k++) {
        unsigned long i;
        if (!key_index(kvs[k].key, kl, num_servers, &i))
            continue;
        lease[i] = kvs[k].lease ? kvs[k].lease : -1; /* a key without a lease still counts */
        if (urls)
            snprintf(urls[i], VIEW_URL_MAX, "%s", kvs[k].value);
    }
    etcd_kvs_free(kvs, n);
    return 0;
}

int view_etcd_force(etcd_client *c, const char *prefix, uint32_t group, uint32_t server,
                    uint64_t epoch, char *err, size_t errlen)
{
    char key[600], val[64];
    snprintf(key, sizeof(key), "%s/force/%u", prefix, group);
    snprintf(val, sizeof(val), "%u@%" PRIu64, server, epoch);
    return etcd_put(c, key, val, strlen(val), 0, err, errlen);
}

int view_etcd_unforce(etcd_client *c, const char *prefix, uint32_t group, char *err, size_t errlen)
{
    char key[600];
    snprintf(key, sizeof(key), "%s/force/%u", prefix, group);
    return etcd_delete(c, key, err, errlen);
}

int view_etcd_forced(etcd_client *c, const char *prefix, uint32_t num_servers, uint64_t epoch,
                     bool forced[VIEW_MAX_SERVERS], uint32_t to[VIEW_MAX_SERVERS], char *err,
                     size_t errlen)
{
    char key[600];
    int kl = snprintf(key, sizeof(key), "%s/force/", prefix);
    memset(forced, 0, sizeof(bool) * VIEW_MAX_SERVERS);
    memset(to, 0, sizeof(uint32_t) * VIEW_MAX_SERVERS);
    etcd_kv *kvs;
    size_t n;
    int rc = etcd_get_prefix(c, key, &kvs, &n, err, errlen);
    if (rc != 0)
        return rc;
    for (size_t k = 0; k < n; k++) {
        unsigned long g;
        if (!key_index(kvs[k].key, kl, num_servers, &g))
            continue;
        unsigned long s;
        unsigned long long e;
        char tail;
        if (sscanf(kvs[k].value, "%lu@%llu%c", &s, &e, &tail) != 2 || s >= num_servers ||
            (uint64_t)e != epoch)
            continue;
        forced[g] = true;
        to[g] = (uint32_t)s;
    }
    etcd_kvs_free(kvs, n);
    return 0;
}

int view_etcd_put_copies(etcd_client *c, const char *prefix, uint32_t index,
                         const view_copy *copies, size_t n, int64_t lease_id, char *err,
                         size_t errlen)
{
    char key[600];
    snprintf(key, sizeof(key), "%s/copies/%u", prefix, index);
    size_t cap = 64 + n * 96, o;
    char *s = malloc(cap);
    if (s == NULL)
        return errf(err, errlen, "out of memory"), ETCD_EFAILED;
    o = (size_t)snprintf(s, cap, "{\"lease\":\"%" PRId64 "\",\"copies\":[", lease_id);
    for (size_t i = 0; i < n; i++)
        o += (size_t)snprintf(s + o, cap - o,
                              "%s{\"group\":%u,\"epoch\":\"%" PRIu64 "\",\"lsn\":\"%" PRIu64 "\"}",
                              i ? "," : "", copies[i].group, copies[i].epoch, copies[i].lsn);
    snprintf(s + o, cap - o, "]}");
    int rc = etcd_put(c, key, s, strlen(s), lease_id, err, errlen);
    free(s);
    return rc;
}

/* A decimal uint64 held as a JSON string (as the leases are). */
static bool j_get_u64_str(json_object *o, const char *field, uint64_t *out)
{
    json_object *f = j_obj(o, field);
    const char *t =
        f && json_object_is_type(f, json_type_string) ? json_object_get_string(f) : NULL;
    if (t == NULL || t[0] < '0' || t[0] > '9')
        return false;
    char *end;
    unsigned long long x = strtoull(t, &end, 10);
    if (*end != '\0')
        return false;
    *out = (uint64_t)x;
    return true;
}

int view_etcd_copies(etcd_client *c, const char *prefix, uint32_t num_servers,
                     const int64_t reg[VIEW_MAX_SERVERS], view_copy **out, size_t *n, char *err,
                     size_t errlen)
{
    char key[600];
    int kl = snprintf(key, sizeof(key), "%s/copies/", prefix);
    *out = NULL;
    *n = 0;
    etcd_kv *kvs;
    size_t nk;
    int rc = etcd_get_prefix(c, key, &kvs, &nk, err, errlen);
    if (rc != 0)
        return rc;
    size_t cap = 0;
    for (size_t k = 0; k < nk && rc == 0; k++) {
        unsigned long i;
        if (!key_index(kvs[k].key, kl, num_servers, &i) || reg[i] == 0 || kvs[k].lease != reg[i])
            continue; /* not a current registration's */
        json_object *j = json_tokener_parse(kvs[k].value);
        json_object *arr = j_obj(j, "copies");
        size_t m =
            arr && json_object_is_type(arr, json_type_array) ? json_object_array_length(arr) : 0;
        for (size_t e = 0; e < m; e++) {
            json_object *it = json_object_array_get_idx(arr, e);
            uint64_t g;
            view_copy vc = {.server = (uint32_t)i};
            if (!j_get_uint(it, "group", num_servers - 1, &g) ||
                !j_get_u64_str(it, "epoch", &vc.epoch) || !j_get_u64_str(it, "lsn", &vc.lsn))
                continue;
            vc.group = (uint32_t)g;
            if (*n == cap) {
                size_t nc = cap ? 2 * cap : 16;
                view_copy *nv = realloc(*out, nc * sizeof(*nv));
                if (nv == NULL) {
                    errf(err, errlen, "out of memory");
                    rc = ETCD_EFAILED;
                    break;
                }
                *out = nv;
                cap = nc;
            }
            (*out)[(*n)++] = vc;
        }
        json_object_put(j);
    }
    etcd_kvs_free(kvs, nk);
    if (rc != 0) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

void view_default_prefix(const char *const *ps, size_t n_ps, char *buf, size_t cap)
{
    /* FNV-1a over the addresses, NUL-separated, from a start value that is not FNV's offset
     * basis (a digit short): kept, since it names the keys of existing clusters. */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n_ps; i++)
        h = fnv1a_update(h, ps[i], strlen(ps[i]) + 1);
    snprintf(buf, cap, "/psd/%016" PRIx64, h);
}
