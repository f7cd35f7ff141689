#include "store.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "initializer.h"
#include "placement.h"
#include "spec_fields.h"
#include "util.h"

#define STORE_BUCKETS 1024

struct store {
    pthread_rwlock_t lock;
    /* Held in read mode by every update (dedup mark through apply), in write mode while a
     * checkpoint copies the state; writers are preferred so that a snapshot is not starved. */
    pthread_rwlock_t snap;
    variable *buckets[STORE_BUCKETS];
    size_t n;
    uint64_t bytes;
};

store *store_create(void)
{
    store *s = calloc(1, sizeof(*s));
    if (s) {
        pthread_rwlock_init(&s->lock, NULL);
        pthread_rwlockattr_t attr;
        pthread_rwlockattr_init(&attr);
        pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
        pthread_rwlock_init(&s->snap, &attr);
        pthread_rwlockattr_destroy(&attr);
    }
    return s;
}

void store_destroy(store *s)
{
    if (s == NULL)
        return;
    for (size_t i = 0; i < STORE_BUCKETS; i++) {
        variable *v = s->buckets[i];
        while (v) {
            variable *n = v->next;
            variable_destroy(v);
            v = n;
        }
    }
    pthread_rwlock_destroy(&s->lock);
    pthread_rwlock_destroy(&s->snap);
    free(s);
}

void store_update_begin(store *s)
{
    pthread_rwlock_rdlock(&s->snap);
}

void store_update_end(store *s)
{
    pthread_rwlock_unlock(&s->snap);
}

void store_freeze(store *s)
{
    pthread_rwlock_wrlock(&s->snap);
}

void store_thaw(store *s)
{
    pthread_rwlock_unlock(&s->snap);
}

static Psd__V1__VariableSpec *spec_copy(const Psd__V1__VariableSpec *spec)
{
    size_t n = psd__v1__variable_spec__get_packed_size(spec);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL)
        return NULL;
    psd__v1__variable_spec__pack(spec, buf);
    Psd__V1__VariableSpec *copy = psd__v1__variable_spec__unpack(NULL, n, buf);
    free(buf);
    return copy;
}

/* The server's kinds are the wire's numbers (both from common/optimizers.h). */
#define PS_OPTIMIZER_WIRE_CHECK_(ID, name, value, lr)                                              \
    _Static_assert(OPTIMIZER_##ID == (int)PSD__V1__OPTIMIZER__OPT_##ID,                            \
                   "ps.proto's OPT_" #ID " must be " #value);
PS_OPTIMIZERS(PS_OPTIMIZER_WIRE_CHECK_)
#undef PS_OPTIMIZER_WIRE_CHECK_

static int to_optimizer(const Psd__V1__VariableSpec *s, optimizer_params *p)
{
    if (!optimizer_kind_valid((int)s->optimizer))
        return -1;
    optimizer_params_default(p, (optimizer_kind)s->optimizer);
#define PS_HPARAM_FROM_WIRE_(field, pt, wt) p->field = (float)s->field;
    PS_SPEC_HPARAMS(PS_HPARAM_FROM_WIRE_)
#undef PS_HPARAM_FROM_WIRE_
    p->nesterov = s->nesterov;
    return 0;
}

static int to_initializer(const Psd__V1__VariableSpec *s, initializer_params *p)
{
    switch (s->initializer) {
    case PSD__V1__INITIALIZER__INIT_ZEROS:
        p->kind = INITIALIZER_ZEROS;
        break;
    case PSD__V1__INITIALIZER__INIT_CONSTANT:
        p->kind = INITIALIZER_CONSTANT;
        break;
    case PSD__V1__INITIALIZER__INIT_UNIFORM:
        p->kind = INITIALIZER_UNIFORM;
        break;
    case PSD__V1__INITIALIZER__INIT_NORMAL:
        p->kind = INITIALIZER_NORMAL;
        break;
    case PSD__V1__INITIALIZER__INIT_GLOROT_UNIFORM:
        p->kind = INITIALIZER_GLOROT_UNIFORM;
        break;
    default:
        return -1;
    }
    p->a = s->init_a;
    p->b = s->init_b;
    p->seed = s->seed;
    return 0;
}

static variable *make_variable(const Psd__V1__VariableSpec *spec, uint64_t numel, uint64_t offset,
                               uint64_t count, bool fill, char *err, size_t errlen)
{
    optimizer_params opt;
    initializer_params init;
    if (to_optimizer(spec, &opt) != 0) {
        errf(err, errlen, "unknown optimizer %d", (int)spec->optimizer);
        return NULL;
    }
    if (optimizer_validate(&opt, err, errlen) != 0)
        return NULL;
    if (to_initializer(spec, &init) != 0) {
        errf(err, errlen, "unknown initializer %d", (int)spec->initializer);
        return NULL;
    }
    if (initializer_validate(&init, spec->shape, spec->n_shape, err, errlen) != 0)
        return NULL;
    variable *v = calloc(1, sizeof(*v));
    if (v == NULL)
        goto oom;
    v->name = strdup(spec->name);
    v->spec = spec_copy(spec);
    v->numel = numel;
    v->offset = offset;
    v->count = count;
    v->opt = opt;
    v->nslots = optimizer_slot_count(opt.kind);
    v->staleness = spec->staleness;
    pthread_mutex_init(&v->lock, NULL);
    if (v->name == NULL || v->spec == NULL)
        goto oom;
    size_t n = count ? (size_t)count : 1;
    v->params = malloc(n * sizeof(float));
    if (v->params == NULL)
        goto oom;
    for (size_t i = 0; i < v->nslots; i++) {
        v->slots[i] = malloc(n * sizeof(float));
        if (v->slots[i] == NULL)
            goto oom;
    }
    if (fill) {
        initializer_fill(&init, spec->shape, spec->n_shape, offset, v->params, (size_t)count);
        optimizer_init_slots(&opt, v->slots, (size_t)count);
    }
    return v;
oom:
    errf(err, errlen, "out of memory for %llu elements of variable \"%s\"",
         (unsigned long long)count, spec->name);
    variable_destroy(v);
    return NULL;
}

variable *variable_create(const Psd__V1__VariableSpec *spec, uint64_t numel, uint64_t offset,
                          uint64_t count, char *err, size_t errlen)
{
    return make_variable(spec, numel, offset, count, true, err, errlen);
}

variable *variable_create_unfilled(const Psd__V1__VariableSpec *spec, uint64_t numel,
                                   uint64_t offset, uint64_t count, char *err, size_t errlen)
{
    return make_variable(spec, numel, offset, count, false, err, errlen);
}

void variable_destroy(variable *v)
{
    if (v == NULL)
        return;
    free(v->name);
    if (v->spec)
        psd__v1__variable_spec__free_unpacked(v->spec, NULL);
    free(v->params);
    free(v->agg);
    free(v->agg_workers);
    for (size_t i = 0; i < OPTIMIZER_MAX_SLOTS; i++)
        free(v->slots[i]);
    pthread_mutex_destroy(&v->lock);
    free(v);
}

static size_t bucket_of(const char *name)
{
    return (size_t)(placement_hash(name) % STORE_BUCKETS);
}

static variable *find_locked(store *s, const char *name)
{
    for (variable *v = s->buckets[bucket_of(name)]; v; v = v->next)
        if (strcmp(v->name, name) == 0)
            return v;
    return NULL;
}

variable *store_insert(store *s, variable *v)
{
    pthread_rwlock_wrlock(&s->lock);
    variable *old = find_locked(s, v->name);
    if (old == NULL) {
        size_t b = bucket_of(v->name);
        v->next = s->buckets[b];
        s->buckets[b] = v;
        s->n++;
        s->bytes += v->count * sizeof(float) * (1 + v->nslots);
    }
    pthread_rwlock_unlock(&s->lock);
    return old ? old : v;
}

variable *store_find(store *s, const char *name)
{
    pthread_rwlock_rdlock(&s->lock);
    variable *v = find_locked(s, name);
    pthread_rwlock_unlock(&s->lock);
    return v;
}

size_t store_list(store *s, variable ***out)
{
    pthread_rwlock_rdlock(&s->lock);
    variable **arr = malloc((s->n ? s->n : 1) * sizeof(*arr));
    size_t k = 0;
    if (arr) {
        for (size_t i = 0; i < STORE_BUCKETS; i++)
            for (variable *v = s->buckets[i]; v; v = v->next)
                arr[k++] = v;
    }
    pthread_rwlock_unlock(&s->lock);
    *out = arr;
    return k;
}

uint64_t store_bytes(store *s)
{
    pthread_rwlock_rdlock(&s->lock);
    uint64_t b = s->bytes;
    pthread_rwlock_unlock(&s->lock);
    return b;
}

/* Value printers for spec_diff's message, picked by the field's type. */
static void spec_fmt_double(char *buf, size_t cap, double x)
{
    snprintf(buf, cap, "%.15g", x);
    if (strtod(buf, NULL) != x)
        snprintf(buf, cap, "%.17g", x); /* the shortest form that reads back exactly */
}

static void spec_fmt_u64(char *buf, size_t cap, uint64_t x)
{
    snprintf(buf, cap, "%" PRIu64, x);
}

static void spec_fmt_int(char *buf, size_t cap, long long x)
{
    snprintf(buf, cap, "%lld", x);
}

/* clang-format off */
#define SPEC_FMT_(buf, cap, x)                                                                     \
    _Generic((x), double: spec_fmt_double, uint64_t: spec_fmt_u64, default: spec_fmt_int)(        \
        buf, cap, x)
/* clang-format on */

const char *spec_diff(const Psd__V1__VariableSpec *a, const Psd__V1__VariableSpec *b, char *detail,
                      size_t cap)
{
    char va[48], vb[48];
    if (a->n_shape != b->n_shape) {
        errf(detail, cap, "%zu vs %zu dimensions", a->n_shape, b->n_shape);
        return "shape";
    }
    for (size_t i = 0; i < a->n_shape; i++) {
        if (a->shape[i] != b->shape[i]) {
            errf(detail, cap, "dimension %zu: %" PRIu64 " vs %" PRIu64, i, a->shape[i],
                 b->shape[i]);
            return "shape";
        }
    }
#define PS_SPEC_DIFF_(field, pt, wt)                                                               \
    if (a->field != b->field) {                                                                    \
        SPEC_FMT_(va, sizeof(va), a->field);                                                       \
        SPEC_FMT_(vb, sizeof(vb), b->field);                                                       \
        errf(detail, cap, "%s vs %s", va, vb);                                                     \
        return #field;                                                                             \
    }
    PS_SPEC_FIELDS(PS_SPEC_DIFF_)
    PS_SPEC_DIFF_(split, bool, protobuf_c_boolean)
    PS_SPEC_DIFF_(num_servers, uint32_t, uint32_t)
#undef PS_SPEC_DIFF_
    errf(detail, cap, "%s", "");
    return NULL;
}
