/* slots_record.c - the published slot map (slots_record.h): made, changed, as JSON, and its
 * key in etcd. */
#include "slots_record.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int slots_record_static(slots_record *r, uint32_t nslots, const char *const *addrs, uint32_t n,
                        char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    if (!slots_count_valid(nslots) || n == 0 || n > SLOTS_MAX_SERVERS)
        return errf(err, errlen, "slot map: %u slots over %u servers is out of bounds", nslots, n),
               -1;
    r->addr = calloc(n, sizeof(*r->addr));
    r->owner = calloc(nslots, sizeof(*r->owner));
    if (r->addr == NULL || r->owner == NULL) {
        slots_record_free(r);
        return errf(err, errlen, "slot map: out of memory"), -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (strlen(addrs[i]) >= SLOTS_ADDR_MAX) {
            slots_record_free(r);
            return errf(err, errlen, "slot map: server address \"%.64s...\" is too long", addrs[i]),
                   -1;
        }
        snprintf(r->addr[i], SLOTS_ADDR_MAX, "%s", addrs[i]);
    }
    for (uint32_t s = 0; s < nslots; s++)
        r->owner[s] = s % n;
    r->version = 1;
    r->nslots = nslots;
    r->base = n;
    r->nservers = n;
    return 0;
}

void slots_record_free(slots_record *r)
{
    free(r->addr);
    free(r->owner);
    memset(r, 0, sizeof(*r));
}

bool slots_record_moved(const slots_record *r)
{
    for (uint32_t s = 0; s < r->nslots; s++)
        if (r->owner[s] != s % r->base)
            return true;
    return false;
}

slot_map slots_record_map(const slots_record *r)
{
    if (!slots_record_moved(r))
        return slots_static(r->nslots, r->base);
    return (slot_map){.nslots = r->nslots, .nservers = r->nservers, .owner = r->owner};
}

uint32_t slots_record_count(const slots_record *r, uint32_t server)
{
    uint32_t n = 0;
    for (uint32_t s = 0; s < r->nslots; s++)
        n += r->owner[s] == server;
    return n;
}

int slots_record_find(const slots_record *r, const char *addr)
{
    for (uint32_t i = 0; i < r->nservers; i++)
        if (strcmp(r->addr[i], addr) == 0)
            return (int)i;
    return -1;
}

int slots_record_add_server(slots_record *r, const char *addr)
{
    if (r->nservers >= SLOTS_MAX_SERVERS || addr[0] == '\0' || strlen(addr) >= SLOTS_ADDR_MAX)
        return -1;
    char(*a)[SLOTS_ADDR_MAX] = realloc(r->addr, (r->nservers + 1) * sizeof(*a));
    if (a == NULL)
        return -1;
    r->addr = a;
    snprintf(r->addr[r->nservers], SLOTS_ADDR_MAX, "%s", addr);
    return (int)r->nservers++;
}

/* Appends s as a JSON string at *o of buf (cap). */
static void put_json_str(char *buf, size_t cap, size_t *o, const char *s)
{
    if (*o < cap)
        buf[(*o)++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p && *o + 7 < cap; p++) {
        if (*p == '"' || *p == '\\')
            *o += (size_t)snprintf(buf + *o, cap - *o, "\\%c", *p);
        else if (*p < 0x20)
            *o += (size_t)snprintf(buf + *o, cap - *o, "\\u%04x", *p);
        else
            buf[(*o)++] = (char)*p;
    }
    if (*o < cap)
        buf[(*o)++] = '"';
}

char *slots_record_to_json(const slots_record *r)
{
    size_t cap = 128 + (size_t)r->nservers * (SLOTS_ADDR_MAX * 6 + 4) + (size_t)r->nslots * 24;
    char *s = malloc(cap);
    if (s == NULL)
        return NULL;
    size_t o =
        (size_t)snprintf(s, cap, "{\"version\":%" PRIu64 ",\"slots\":%u,\"base\":%u,\"servers\":[",
                         r->version, r->nslots, r->base);
    for (uint32_t i = 0; i < r->nservers; i++) {
        if (i)
            s[o++] = ',';
        put_json_str(s, cap, &o, r->addr[i]);
    }
    o += (size_t)snprintf(s + o, cap - o, "],\"moved\":[");
    bool first = true;
    for (uint32_t k = 0; k < r->nslots; k++)
        if (r->owner[k] != k % r->base) {
            o += (size_t)snprintf(s + o, cap - o, "%s[%u,%u]", first ? "" : ",", k, r->owner[k]);
            first = false;
        }
    snprintf(s + o, cap - o, "]}");
    return s;
}

static json_object *j_obj(json_object *obj, const char *field)
{
    json_object *f;
    return obj && json_object_object_get_ex(obj, field, &f) ? f : NULL;
}

/* obj[field] as an integer in 0..max, else false. */
static bool j_uint(json_object *obj, const char *field, uint64_t max, uint64_t *out)
{
    json_object *f = j_obj(obj, field);
    if (f == NULL || !json_object_is_type(f, json_type_int))
        return false;
    int64_t x = json_object_get_int64(f);
    if (x < 0 || (uint64_t)x > max)
        return false;
    *out = (uint64_t)x;
    return true;
}

/* The element e as an integer in 0..max, else -1. */
static int64_t j_elem(json_object *e, uint64_t max)
{
    if (e == NULL || !json_object_is_type(e, json_type_int))
        return -1;
    int64_t x = json_object_get_int64(e);
    return x < 0 || (uint64_t)x > max ? -1 : x;
}

int slots_record_from_json(const char *text, slots_record *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof(*r));
    json_object *j = etcd_json_parse(text);
    int rc = ETCD_EFAILED;
    uint64_t version, ns, base;
    json_object *servers, *moved;
    size_t n;
    int64_t prev = -1;
    if (j == NULL || !json_object_is_type(j, json_type_object)) {
        errf(err, errlen, "slot map: not a JSON object");
        goto out;
    }
    if (!j_uint(j, "version", INT64_MAX, &version) || version == 0) {
        errf(err, errlen, "slot map: \"version\" is missing or not a positive integer");
        goto out;
    }
    if (!j_uint(j, "slots", UINT32_MAX, &ns) || !slots_count_valid(ns)) {
        errf(err, errlen, "slot map: \"slots\" is missing or not a power of two up to 2^24");
        goto out;
    }
    servers = j_obj(j, "servers");
    n = servers && json_object_is_type(servers, json_type_array) ? json_object_array_length(servers)
                                                                 : 0;
    if (n == 0 || n > SLOTS_MAX_SERVERS) {
        errf(err, errlen, "slot map: \"servers\" must be an array of 1 to %d addresses",
             SLOTS_MAX_SERVERS);
        goto out;
    }
    if (!j_uint(j, "base", n, &base) || base == 0) {
        errf(err, errlen, "slot map: \"base\" is missing or not in 1..%zu (the servers listed)", n);
        goto out;
    }
    r->addr = calloc(n, sizeof(*r->addr));
    r->owner = calloc(ns, sizeof(*r->owner));
    if (r->addr == NULL || r->owner == NULL) {
        errf(err, errlen, "slot map: out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(servers, i);
        const char *a = json_object_is_type(e, json_type_string) ? json_object_get_string(e) : "";
        if (a[0] == '\0' || strlen(a) >= SLOTS_ADDR_MAX) {
            errf(err, errlen, "slot map: \"servers\"[%zu] is not an address (1 to %d bytes)", i,
                 SLOTS_ADDR_MAX - 1);
            goto out;
        }
        for (size_t k = 0; k < i; k++)
            if (strcmp(r->addr[k], a) == 0) {
                errf(err, errlen, "slot map: \"servers\"[%zu] and [%zu] are both %s", k, i, a);
                goto out;
            }
        snprintf(r->addr[i], SLOTS_ADDR_MAX, "%s", a);
    }
    for (uint64_t s = 0; s < ns; s++)
        r->owner[s] = (uint32_t)(s % base);
    moved = j_obj(j, "moved");
    if (moved != NULL && !json_object_is_type(moved, json_type_array)) {
        errf(err, errlen, "slot map: \"moved\" must be an array of [slot, server] pairs");
        goto out;
    }
    for (size_t i = 0; moved && i < json_object_array_length(moved); i++) {
        json_object *e = json_object_array_get_idx(moved, i);
        int64_t s = -1, to = -1;
        if (json_object_is_type(e, json_type_array) && json_object_array_length(e) == 2) {
            s = j_elem(json_object_array_get_idx(e, 0), ns - 1);
            to = j_elem(json_object_array_get_idx(e, 1), n - 1);
        }
        if (s < 0 || to < 0 || s <= prev) {
            errf(err, errlen,
                 "slot map: \"moved\"[%zu] is not a [slot, server] pair with a slot below %u "
                 "(ascending) and a server below %zu",
                 i, (unsigned)ns, n);
            goto out;
        }
        r->owner[s] = (uint32_t)to;
        prev = s;
    }
    r->version = version;
    r->nslots = (uint32_t)ns;
    r->base = (uint32_t)base;
    r->nservers = (uint32_t)n;
    rc = 0;
out:
    json_object_put(j);
    if (rc != 0)
        slots_record_free(r);
    return rc;
}

/* PREFIX/slots into key (cap). */
static void slots_key(const char *prefix, char *key, size_t cap)
{
    snprintf(key, cap, "%s/slots", prefix);
}

int slots_etcd_read(etcd_client *c, const char *prefix, slots_record *r, int64_t *mod_rev,
                    char *err, size_t errlen)
{
    char key[600];
    slots_key(prefix, key, sizeof(key));
    char *text = NULL;
    memset(r, 0, sizeof(*r));
    int rc = etcd_get(c, key, &text, NULL, mod_rev, err, errlen);
    if (rc != 0)
        return rc;
    char perr[512];
    if (slots_record_from_json(text, r, perr, sizeof(perr)) != 0) {
        errf(err, errlen, "%s in etcd %s: %s", key, etcd_client_endpoint(c), perr);
        rc = SLOTS_EMALFORMED;
    }
    free(text);
    return rc;
}

int slots_etcd_cas(etcd_client *c, const char *prefix, const slots_record *r,
                   int64_t expect_mod_rev, int64_t *new_rev, char *err, size_t errlen)
{
    char key[600];
    slots_key(prefix, key, sizeof(key));
    char *text = slots_record_to_json(r);
    if (text == NULL)
        return errf(err, errlen, "slot map: out of memory"), ETCD_EFAILED;
    int rc = etcd_cas(c, key, expect_mod_rev, text, strlen(text), new_rev, err, errlen);
    free(text);
    return rc;
}
