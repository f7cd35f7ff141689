/* Variables: specs, placement, create, lookup and list. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "optimizers.h"
#include "placement.h"
#include "spec_fields.h"
#include "util.h"

/* The public enum is the wire's, row by row of common/optimizers.h. */
#define PS_OPTIMIZER_ABI_CHECK_(ID, name, value, lr)                                               \
    _Static_assert(PS_OPT_##ID == (value) && (int)PSD__V1__OPTIMIZER__OPT_##ID == (value),         \
                   "psclient.h's PS_OPT_" #ID " and ps.proto's OPT_" #ID " must be " #value);
PS_OPTIMIZERS(PS_OPTIMIZER_ABI_CHECK_)
#undef PS_OPTIMIZER_ABI_CHECK_

static const char *const optimizer_names[] = {
#define PS_OPTIMIZER_NAME_(ID, name, value, lr) [value] = name,
    PS_OPTIMIZERS(PS_OPTIMIZER_NAME_)
#undef PS_OPTIMIZER_NAME_
};

const char *ps_optimizer_name(int optimizer)
{
    return enum_name(ENUM_NAMES(optimizer_names), optimizer, "unknown");
}

int ps_optimizer_parse(const char *name, ps_optimizer *out)
{
    int k;
    if (out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_optimizer_parse: NULL argument");
    if (enum_parse(ENUM_NAMES(optimizer_names), name, &k) != 0)
        return client_fail(PS_INVALID_ARGUMENT, "unknown optimizer \"%s\" (known: %s)",
                           name ? name : "(null)", &(PS_OPTIMIZER_CHOICES)[1]);
    *out = (ps_optimizer)k;
    return PS_OK;
}

/* The size of the first published layout: every field up to staleness. */
#define SPEC_SIZE_V1 (offsetof(ps_var_spec, staleness) + sizeof(int))

/* The defaults of every field (their rows of common/spec_fields.h), whatever the caller's
 * struct_size. */
static void spec_defaults(ps_var_spec *spec, const char *name)
{
    memset(spec, 0, sizeof(*spec));
    spec->struct_size = sizeof(*spec);
    spec->name = name;
#define PS_SPEC_DEFAULT_(field, pt, wt, def) spec->field = (def);
    PS_SPEC_FIELDS(PS_SPEC_DEFAULT_)
#undef PS_SPEC_DEFAULT_
}

void ps_var_spec_init_sized(ps_var_spec *spec, size_t size, const char *name)
{
    if (spec == NULL || size < SPEC_SIZE_V1)
        return;
    ps_var_spec d;
    spec_defaults(&d, name);
    d.struct_size = size;
    memcpy(spec, &d, size < sizeof(d) ? size : sizeof(d));
}

/* Reads a caller's spec of any layout into a whole one: the fields its struct_size covers,
 * defaults for the others. Returns -1 for a struct_size smaller than the first layout (a spec
 * not made by ps_var_spec_init). */
static int spec_read(const ps_var_spec *in, ps_var_spec *out)
{
    size_t size = in->struct_size;
    if (size < SPEC_SIZE_V1)
        return -1;
    spec_defaults(out, in->name);
    memcpy(out, in, size < sizeof(*out) ? size : sizeof(*out));
    out->struct_size = sizeof(*out);
    return 0;
}

const char *ps_var_name(const ps_var *v)
{
    return v->name;
}

uint64_t ps_var_numel(const ps_var *v)
{
    return v->numel;
}

int ps_var_ndims(const ps_var *v)
{
    return v->spec.ndims;
}

uint64_t ps_var_dim(const ps_var *v, int i)
{
    return (i >= 0 && i < v->spec.ndims) ? v->spec.dims[i] : 0;
}

int ps_var_staleness_bound(const ps_var *v)
{
    return v->spec.staleness;
}

int ps_var_num_shards(const ps_var *v)
{
    if (v->parts)
        return (int)placement_part_count(v->numel);
    return v->split ? (int)v->nservers : 1;
}

static void to_wire(const ps_var_spec *s, bool split, bool parts, uint32_t nservers,
                    Psd__V1__VariableSpec *w, uint64_t *shape)
{
    psd__v1__variable_spec__init(w);
    w->name = (char *)s->name;
    for (int i = 0; i < s->ndims; i++)
        shape[i] = s->dims[i];
    w->n_shape = (size_t)s->ndims;
    w->shape = shape;
#define PS_SPEC_TO_WIRE_(field, pt, wt, def) w->field = (wt)s->field;
    PS_SPEC_FIELDS(PS_SPEC_TO_WIRE_)
#undef PS_SPEC_TO_WIRE_
    w->split = split || parts;
    w->num_servers = parts ? 0 : nservers;
    w->parts = parts;
}

/* The client's table (c->vars) holds every handle it made, freed by ps_client_close. A handle
 * whose variable this client deleted (ps_var_delete) stays in it, but out of the name cache:
 * its spec.name, which nothing else reads, is NULL from then on. */
static bool in_cache(const ps_var *v, const char *name)
{
    return v->spec.name != NULL && strcmp(v->name, name) == 0;
}

/* Adds a handle to the client's table, or returns the one already there. */
static ps_var *remember(ps_client *c, ps_var *v)
{
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nvars; i++) {
        if (in_cache(c->vars[i], v->name)) {
            ps_var *old = c->vars[i];
            pthread_mutex_unlock(&c->lock);
            free(v->name);
            free(v);
            return old;
        }
    }
    if (c->nvars == c->capvars) {
        size_t cap = c->capvars ? c->capvars * 2 : 16;
        ps_var **nv = realloc(c->vars, cap * sizeof(*nv));
        if (nv == NULL) {
            pthread_mutex_unlock(&c->lock);
            free(v->name);
            free(v);
            return NULL;
        }
        c->vars = nv;
        c->capvars = cap;
    }
    c->vars[c->nvars++] = v;
    pthread_mutex_unlock(&c->lock);
    return v;
}

static ps_var *cached(ps_client *c, const char *name)
{
    ps_var *found = NULL;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nvars && !found; i++)
        if (in_cache(c->vars[i], name))
            found = c->vars[i];
    pthread_mutex_unlock(&c->lock);
    return found;
}

static ps_var *make_var(const ps_client *c, const ps_var_spec *s, bool split, bool parts)
{
    uint32_t nservers = (uint32_t)c->nservers;
    ps_var *v = calloc(1, sizeof(*v));
    if (v == NULL)
        return NULL;
    v->name = strdup(s->name);
    if (v->name == NULL) {
        free(v);
        return NULL;
    }
    v->spec = *s;
    v->spec.name = v->name;
    v->numel = 1;
    for (int i = 0; i < s->ndims; i++)
        v->numel *= s->dims[i];
    v->split = split || parts;
    v->parts = parts;
    v->nservers = parts ? 0 : nservers;
    v->owner = slots_name_owner(&c->slots, v->name);
    return v;
}

static int from_wire(const Psd__V1__VariableSpec *w, ps_var_spec *s);

/* True if a and b differ at most in the placement this client would choose (split, ranges
 * or parts): shape and every field of the spec; b's staleness PS_STALENESS_DEFAULT matches
 * any. */
static bool same_but_placement(const ps_var_spec *a, const ps_var_spec *b)
{
    if (a->ndims != b->ndims)
        return false;
    for (int i = 0; i < a->ndims; i++)
        if (a->dims[i] != b->dims[i])
            return false;
#define PS_SPEC_SAME_(field, pt, wt, def)                                                          \
    if (a->field != b->field &&                                                                    \
        !(strcmp(#field, "staleness") == 0 && b->staleness == PS_STALENESS_DEFAULT))               \
        return false;
    PS_SPEC_FIELDS(PS_SPEC_SAME_)
#undef PS_SPEC_SAME_
    return true;
}

/* A create refused with ALREADY_EXISTS: the variable exists. When it differs from spec only in
 * its placement (created by a client with another split-threshold-bytes or split-parts, or
 * by an older release, in ranges), this client follows what was created: the existing handle.
 * Otherwise the refusal stands, with its message (the differing field). */
static int adopt_existing(ps_client *c, const ps_var_spec *spec, ps_var **out)
{
    char why[512];
    snprintf(why, sizeof(why), "%s", ps_last_error());
    ps_var *v;
    if (ps_var_lookup(c, spec->name, &v) == PS_OK && same_but_placement(&v->spec, spec)) {
        *out = v;
        return PS_OK;
    }
    return client_fail(PS_ALREADY_EXISTS, "%s", why);
}

/* The first n servers the client reaches: the spec's, then those that joined. */
static int reached_servers(ps_client *c, int n, int **out)
{
    int *s = malloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    if (s == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    for (int i = 0; i < n; i++)
        s[i] = i;
    *out = s;
    return PS_OK;
}

int ps_var_create(ps_client *c, const ps_var_spec *user_spec, ps_var **out)
{
    if (c == NULL || user_spec == NULL || out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_var_create: NULL argument");
    ps_var_spec whole;
    if (spec_read(user_spec, &whole) != 0)
        return client_fail(PS_INVALID_ARGUMENT,
                           "ps_var_create: spec->struct_size is %zu: initialise the spec with "
                           "ps_var_spec_init",
                           user_spec->struct_size);
    const ps_var_spec *spec = &whole;
    if (spec->name == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_var_create: NULL argument");
    if (strlen(spec->name) == 0 || strlen(spec->name) > PS_MAX_NAME)
        return client_fail(PS_INVALID_ARGUMENT, "variable name must be 1 to %d bytes", PS_MAX_NAME);
    if (spec->ndims < 0 || spec->ndims > PS_MAX_DIMS)
        return client_fail(PS_INVALID_ARGUMENT, "variable \"%s\": ndims %d not in [0, %d]",
                           spec->name, spec->ndims, PS_MAX_DIMS);
    uint64_t numel = 1;
    for (int i = 0; i < spec->ndims; i++) {
        if (spec->dims[i] == 0 || numel > UINT64_MAX / 4 / spec->dims[i])
            return client_fail(PS_INVALID_ARGUMENT, "variable \"%s\": dimension %d is %llu",
                               spec->name, i, (unsigned long long)spec->dims[i]);
        numel *= spec->dims[i];
    }
    uint32_t ns = (uint32_t)c->nservers;
    bool parts =
        c->split_parts && placement_is_parts(numel, numel * sizeof(float), c->split_threshold);
    bool split = parts || placement_is_split(numel, numel * sizeof(float), c->split_threshold, ns);
    Psd__V1__VariableSpec w;
    uint64_t shape[PS_MAX_DIMS];
    to_wire(spec, split, parts, ns, &w, shape);
    Psd__V1__CreateVariableRequest req = PSD__V1__CREATE_VARIABLE_REQUEST__INIT;
    req.spec = &w;
    int *servers;
    /* A variable cut in parts is made on every server reached (each makes the parts its slots
     * give it, and the head), those that joined included; an existing variable of that name
     * made otherwise is adopted when only its placement differs (adopt_existing). */
    int n = parts ? client_reach(c) : split ? c->nservers : 1;
    int rc = parts ? reached_servers(c, n, &servers) : client_all_servers(c, &servers);
    if (rc != PS_OK)
        return rc;
    if (!split)
        servers[0] = (int)slots_name_owner(&c->slots, spec->name);
    ProtobufCMessage **replies = calloc((size_t)n, sizeof(*replies));
    if (replies == NULL) {
        free(servers);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    int first = n;
    if (parts && n > 1) {
        /* The name's owner first: a variable of that name made otherwise (whole, or in
         * ranges) is refused there before the other servers make parts of it. */
        int owner = (int)slots_name_owner(&c->slots, spec->name);
        owner = owner < n ? owner : 0;
        servers[owner] = 0;
        servers[0] = owner;
        first = 1;
    }
    rc = client_unary(c, servers, first, PSD__V1__METHOD__CREATE_VARIABLE, &req.base,
                      &psd__v1__create_variable_reply__descriptor, replies);
    if (rc == PS_OK && first < n)
        rc = client_unary(c, servers + first, n - first, PSD__V1__METHOD__CREATE_VARIABLE,
                          &req.base, &psd__v1__create_variable_reply__descriptor, replies + first);
    int staleness = spec->staleness;
    if (rc == PS_OK)
        staleness = ((const Psd__V1__CreateVariableReply *)replies[0])->staleness;
    client_free_replies(replies, n);
    free(replies);
    free(servers);
    if (rc == PS_ALREADY_EXISTS)
        return adopt_existing(c, spec, out);
    if (rc != PS_OK)
        return rc;
    ps_var *v = make_var(c, spec, split, parts);
    if (v)
        v->spec.staleness = staleness;
    if (v == NULL || (v = remember(c, v)) == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    *out = v;
    return PS_OK;
}

static int from_wire(const Psd__V1__VariableSpec *w, ps_var_spec *s)
{
    if (w->n_shape > PS_MAX_DIMS)
        return -1;
    spec_defaults(s, w->name);
    s->ndims = (int)w->n_shape;
    for (size_t i = 0; i < w->n_shape; i++)
        s->dims[i] = w->shape[i];
#define PS_SPEC_FROM_WIRE_(field, pt, wt, def) s->field = (pt)w->field;
    PS_SPEC_FIELDS(PS_SPEC_FROM_WIRE_)
#undef PS_SPEC_FROM_WIRE_
    return 0;
}

int ps_var_lookup(ps_client *c, const char *name, ps_var **out)
{
    if (c == NULL || name == NULL || out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_var_lookup: NULL argument");
    ps_var *v = cached(c, name);
    if (v) {
        *out = v;
        return PS_OK;
    }
    /* A variable held whole lives on its hash owner; a split one has a shard (and its spec)
     * on every server, the hash owner included. */
    int server = (int)slots_name_owner(&c->slots, name);
    Psd__V1__LookupVariableRequest req = PSD__V1__LOOKUP_VARIABLE_REQUEST__INIT;
    req.name = (char *)name;
    ProtobufCMessage *reply = NULL;
    int rc = client_unary(c, &server, 1, PSD__V1__METHOD__LOOKUP_VARIABLE, &req.base,
                          &psd__v1__lookup_variable_reply__descriptor, &reply);
    if (rc != PS_OK)
        return rc;
    const Psd__V1__LookupVariableReply *r = (const void *)reply;
    ps_var_spec s;
    if (r->spec == NULL || from_wire(r->spec, &s) != 0) {
        client_free_replies(&reply, 1);
        return client_fail(PS_INTERNAL, "ps %d sent an invalid spec for \"%s\"", server, name);
    }
    if (!r->spec->parts && r->spec->num_servers != (uint32_t)c->nservers) {
        uint32_t ns = r->spec->num_servers;
        client_free_replies(&reply, 1);
        return client_fail(PS_FAILED_PRECONDITION,
                           "\"%s\" was placed for %u servers, this client's cluster has %d", name,
                           ns, c->nservers);
    }
    v = make_var(c, &s, r->spec->split, r->spec->parts);
    client_free_replies(&reply, 1);
    if (v == NULL || (v = remember(c, v)) == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    *out = v;
    return PS_OK;
}

/* Drops the cached handle of name, if any, from the name cache (it stays allocated). */
static void forget(ps_client *c, const char *name)
{
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nvars; i++)
        if (in_cache(c->vars[i], name))
            c->vars[i]->spec.name = NULL;
    pthread_mutex_unlock(&c->lock);
}

int ps_var_delete(ps_client *c, const char *name)
{
    if (c == NULL || name == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_var_delete: NULL argument");
    if (strlen(name) == 0 || strlen(name) > PS_MAX_NAME)
        return client_fail(PS_INVALID_ARGUMENT, "variable name must be 1 to %d bytes", PS_MAX_NAME);
    /* Every server reached: a variable held whole is on its hash owner (or where its slot
     * moved), a split one has a shard on each, one cut in parts its head on each, and this
     * client need not know which (no handle, or a stale one). One server at a time, so that
     * each one's answer is known: NOT_FOUND from a server that holds no shard is expected. */
    Psd__V1__DeleteVariableRequest req = PSD__V1__DELETE_VARIABLE_REQUEST__INIT;
    req.name = (char *)name;
    int deleted = 0, rc = PS_OK, reach = client_reach(c);
    for (int i = 0; i < reach; i++) {
        ProtobufCMessage *reply = NULL;
        int r = client_unary(c, &i, 1, PSD__V1__METHOD__DELETE_VARIABLE, &req.base,
                             &psd__v1__delete_variable_reply__descriptor, &reply);
        if (r == PS_OK && ((const Psd__V1__DeleteVariableReply *)reply)->deleted)
            deleted++;
        client_free_replies(&reply, 1);
        if (r != PS_OK && r != PS_NOT_FOUND && rc == PS_OK)
            rc = r; /* ps_last_error names this server; the others are still asked */
    }
    if (deleted > 0)
        forget(c, name);
    if (rc != PS_OK) {
        if (rc == PS_PERMISSION_DENIED || deleted == 0)
            return rc;
        return client_fail(rc, "variable \"%s\" deleted on %d server(s), but not on all: %s", name,
                           deleted, ps_last_error());
    }
    if (deleted == 0)
        return client_fail(PS_NOT_FOUND, "variable \"%s\" not found on any of %d server(s)", name,
                           c->nservers);
    return PS_OK;
}

/* Appends name to out (n entries, capacity *cap) unless present; split variables are listed by
 * every shard. Returns -1 when memory can't be had. */
static int add_name(char ***out, size_t *n, size_t *cap, const char *name)
{
    for (size_t k = 0; k < *n; k++)
        if (strcmp((*out)[k], name) == 0)
            return 0;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        char **grown = realloc(*out, nc * sizeof(char *));
        if (grown == NULL)
            return -1;
        *out = grown;
        *cap = nc;
    }
    if (((*out)[*n] = strdup(name)) == NULL)
        return -1;
    (*n)++;
    return 0;
}

int ps_var_list(ps_client *c, char ***names, size_t *count)
{
    if (c == NULL || names == NULL || count == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_var_list: NULL argument");
    char **out = NULL;
    size_t n = 0, cap = 0;
    int rc = PS_OK;
    /* Server by server, page by page (ListVariablesReply.next_page_token). */
    for (int s = 0; rc == PS_OK && s < c->nservers; s++) {
        char *token = NULL;
        do {
            Psd__V1__ListVariablesRequest req = PSD__V1__LIST_VARIABLES_REQUEST__INIT;
            req.page_token = token ? token : (char *)"";
            ProtobufCMessage *reply = NULL;
            rc = client_unary(c, &s, 1, PSD__V1__METHOD__LIST_VARIABLES, &req.base,
                              &psd__v1__list_variables_reply__descriptor, &reply);
            free(token);
            token = NULL;
            if (rc != PS_OK)
                break;
            const Psd__V1__ListVariablesReply *r = (const void *)reply;
            for (size_t j = 0; rc == PS_OK && j < r->n_variables; j++)
                if (add_name(&out, &n, &cap, r->variables[j]->name) != 0)
                    rc = client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
            if (rc == PS_OK && r->next_page_token && r->next_page_token[0] && r->n_variables > 0 &&
                (token = strdup(r->next_page_token)) == NULL)
                rc = client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
            client_free_replies(&reply, 1);
        } while (rc == PS_OK && token != NULL);
        free(token);
    }
    if (rc != PS_OK) {
        ps_names_free(out, n);
        return rc;
    }
    if (out == NULL && (out = calloc(1, sizeof(char *))) == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    *names = out;
    *count = n;
    return PS_OK;
}

void ps_names_free(char **names, size_t count)
{
    if (names == NULL)
        return;
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
}

int ps_var_staleness(ps_client *c, ps_var *v, ps_staleness_stats *out)
{
    if (c == NULL || v == NULL || out == NULL)
        return client_fail(PS_INVALID_ARGUMENT, "ps_var_staleness: NULL argument");
    int *servers;
    int rc = client_all_servers(c, &servers);
    if (rc != PS_OK)
        return rc;
    /* Of a variable cut in parts, every server reached (each holds some parts, or none). */
    int n = v->parts ? client_reach(c) : v->split ? c->nservers : 1;
    if (v->parts && n > c->nservers) {
        free(servers);
        if ((rc = reached_servers(c, n, &servers)) != PS_OK)
            return rc;
    }
    if (!v->split)
        servers[0] = (int)v->owner;
    ProtobufCMessage **replies = calloc((size_t)n, sizeof(*replies));
    if (replies == NULL) {
        free(servers);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    Psd__V1__ServerStatusRequest req = PSD__V1__SERVER_STATUS_REQUEST__INIT;
    req.variable = v->name; /* only its entry, however many variables the servers hold */
    rc = client_unary(c, servers, n, PSD__V1__METHOD__SERVER_STATUS, &req.base,
                      &psd__v1__server_status_reply__descriptor, replies);
    memset(out, 0, sizeof(*out));
    bool found = false;
    for (int i = 0; rc == PS_OK && i < n; i++) {
        const Psd__V1__ServerStatusReply *r = (const void *)replies[i];
        for (size_t j = 0; j < r->n_variables; j++) {
            const Psd__V1__VariableStatus *vs = r->variables[j];
            if (strcmp(vs->name, v->name) != 0 || vs->observed == NULL)
                continue;
            found = true;
            client_add_staleness(out, vs->observed);
        }
    }
    client_free_replies(replies, n);
    free(replies);
    free(servers);
    if (rc == PS_OK && !found)
        rc = client_fail(PS_NOT_FOUND, "no server reports variable \"%s\"", v->name);
    return rc;
}
