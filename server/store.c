/* The variables of a server state (store.h): the name table, variables and their range
 * locks, the BSP aggregate, limits and the memory budget, and the checkpoint gate. */
#include "store.h"

#include <inttypes.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "initializer.h"
#include "placement.h"
#include "spec_fields.h"
#include "status.h"
#include "util.h"

#define STORE_BUCKETS 1024

/* One range lock, alone on its cache line: threads spinning on neighbouring stripes must not
 * bounce each other's lines. */
struct variable_stripe {
    alignas(64) pthread_mutex_t m;
};

struct store {
    pthread_rwlock_t lock;
    /* Held in read mode by every update (dedup mark through apply), in write mode while a
     * checkpoint copies the state; writers are preferred so that a snapshot is not starved. */
    pthread_rwlock_t snap;
    variable *buckets[STORE_BUCKETS];
    size_t n;      /* entries linked */
    size_t nnames; /* of which not parts: what max-variables counts */
    uint64_t bytes;
    /* The variables allowed at most (0: no limit) and the room reserved by creates in
     * progress, guarded by lock; bytes and pending_bytes are held in budget (NULL: none). */
    uint64_t max_vars;
    uint64_t pending_bytes, pending_vars;
    mem_budget *budget;
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
    budget_give(s->budget, s->bytes + s->pending_bytes);
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
    if (!optimizer_on_wire(s->optimizer) || !optimizer_kind_valid((int)s->optimizer))
        return -1;
    optimizer_params_default(p, (optimizer_kind)s->optimizer);
#define PS_HPARAM_FROM_WIRE_(field, pt, wt, def) p->field = (float)s->field;
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

/* Sizes and makes v's stripes for its count elements (see store.h). */
static int stripes_init(variable *v)
{
    uint32_t shift = 16;
    _Static_assert(VARIABLE_STRIPE_ELEMS == 1u << 16, "stripe_shift starts at log2 of it");
    while (v->count && shift < 63 && ((v->count - 1) >> shift) + 1 > VARIABLE_MAX_STRIPES)
        shift++;
    uint64_t n = v->count ? ((v->count - 1) >> shift) + 1 : 1;
    struct variable_stripe *st = aligned_alloc(alignof(struct variable_stripe), n * sizeof(*st));
    if (st == NULL)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        pthread_mutex_init(&st[i].m, NULL);
    v->stripes = st;
    v->nstripes = (uint32_t)n;
    v->stripe_shift = shift;
    return 0;
}

uint32_t variable_stripe_of(const variable *v, uint64_t first)
{
    uint64_t i = first >> v->stripe_shift;
    return i < v->nstripes ? (uint32_t)i : v->nstripes - 1;
}

uint64_t variable_stripe_elems(const variable *v)
{
    return 1ull << v->stripe_shift;
}

/* The stripes [*lo, *hi] covering [first, first+count); count 0: first's stripe alone. */
static void stripe_span(const variable *v, uint64_t first, uint64_t count, uint32_t *lo,
                        uint32_t *hi)
{
    uint64_t last = count ? first + (count - 1) : first;
    if (last < first) /* wrapped: through the end */
        last = UINT64_MAX;
    *lo = variable_stripe_of(v, first);
    *hi = variable_stripe_of(v, last);
}

void variable_lock_range(variable *v, uint64_t first, uint64_t count)
{
    uint32_t lo, hi;
    stripe_span(v, first, count, &lo, &hi);
    for (uint32_t i = lo; i <= hi; i++)
        pthread_mutex_lock(&v->stripes[i].m);
}

void variable_unlock_range(variable *v, uint64_t first, uint64_t count)
{
    uint32_t lo, hi;
    stripe_span(v, first, count, &lo, &hi);
    for (uint32_t i = hi + 1; i-- > lo;)
        pthread_mutex_unlock(&v->stripes[i].m);
}

void variable_lock_all(variable *v)
{
    for (uint32_t i = 0; i < v->nstripes; i++)
        pthread_mutex_lock(&v->stripes[i].m);
}

void variable_unlock_all(variable *v)
{
    for (uint32_t i = v->nstripes; i-- > 0;)
        pthread_mutex_unlock(&v->stripes[i].m);
}

int variable_agg_ensure(variable *v, int max_workers)
{
    if (atomic_load_explicit(&v->agg_ready, memory_order_acquire))
        return 0;
    /* First use: every stripe, so that no range holder or whole-shard reader (a BSP apply, a
     * checkpoint) sees the pointers change; a restored variable may come with them made. */
    int rc = 0;
    variable_lock_all(v);
    if (v->agg == NULL) {
        size_t words = max_workers > 0 ? ((size_t)max_workers + 63) / 64 : 1;
        if (words < VARIABLE_AGG_MIN_WORDS)
            words = VARIABLE_AGG_MIN_WORDS;
        float *agg = calloc(v->count ? (size_t)v->count : 1, sizeof(float));
        uint64_t *workers = calloc(words, sizeof(uint64_t));
        if (agg == NULL || workers == NULL) {
            free(agg);
            free(workers);
            rc = -1;
        } else {
            v->agg = agg;
            v->agg_workers = workers;
            v->agg_words = words;
            v->agg_count = 0;
        }
    }
    if (rc == 0)
        atomic_store_explicit(&v->agg_ready, true, memory_order_release);
    variable_unlock_all(v);
    return rc;
}

void variable_agg_mark(variable *v, int32_t worker, int max_workers)
{
    if (worker < 0 || worker >= max_workers || (uint64_t)worker / 64 >= v->agg_words)
        return;
    uint64_t bit = 1ull << (worker % 64);
    pthread_mutex_lock(&v->agg_lock);
    if (!(v->agg_workers[worker / 64] & bit)) {
        v->agg_workers[worker / 64] |= bit;
        v->agg_count++;
    }
    pthread_mutex_unlock(&v->agg_lock);
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
    v->part = spec->parts && count > 0 ? placement_part_of(offset) : VARIABLE_HEAD;
    v->opt = opt;
    v->nslots = optimizer_slot_count(opt.kind);
    v->staleness = spec->staleness;
    pthread_mutex_init(&v->agg_lock, NULL);
    atomic_init(&v->agg_ready, false);
    atomic_init(&v->refs, 1);
    atomic_init(&v->deleted, false);
    if (v->name == NULL || v->spec == NULL || stripes_init(v) != 0)
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
    pthread_mutex_destroy(&v->agg_lock);
    for (uint32_t i = 0; v->stripes && i < v->nstripes; i++)
        pthread_mutex_destroy(&v->stripes[i].m);
    free(v->stripes);
    free(v);
}

void variable_retain(variable *v)
{
    atomic_fetch_add_explicit(&v->refs, 1, memory_order_relaxed);
}

void variable_release(variable *v)
{
    if (v == NULL)
        return;
    if (atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) != 1)
        return;
    store *s = v->owner;
    if (s) {
        uint64_t b = store_shard_bytes(v->count, v->nslots);
        pthread_rwlock_wrlock(&s->lock);
        b = b < s->bytes ? b : s->bytes;
        s->bytes -= b;
        budget_give(s->budget, b);
        pthread_rwlock_unlock(&s->lock);
    }
    variable_destroy(v);
}

/* The parts of one variable spread over the buckets (a variable of thousands of parts would
 * otherwise make one long chain). */
static size_t bucket_of(const char *name, uint64_t part)
{
    uint64_t h = placement_hash(name);
    return (size_t)((part == VARIABLE_HEAD ? h : mix64(h ^ part)) % STORE_BUCKETS);
}

static variable *find_locked(store *s, const char *name, uint64_t part)
{
    for (variable *v = s->buckets[bucket_of(name, part)]; v; v = v->next)
        if (v->part == part && strcmp(v->name, name) == 0)
            return v;
    return NULL;
}

void store_set_limits(store *s, mem_budget *b, uint64_t max_vars)
{
    pthread_rwlock_wrlock(&s->lock);
    if (b != s->budget) {
        budget_give(s->budget, s->bytes + s->pending_bytes);
        budget_force(b, s->bytes + s->pending_bytes);
        s->budget = b;
    }
    s->max_vars = max_vars;
    pthread_rwlock_unlock(&s->lock);
}

uint64_t store_shard_bytes(uint64_t count, size_t nslots)
{
    uint64_t per = (uint64_t)sizeof(float) * (1 + nslots);
    return count > UINT64_MAX / per ? UINT64_MAX : count * per;
}

int store_reserve(store *s, uint64_t bytes, char *err, size_t errlen)
{
    int rc = STATUS_OK;
    pthread_rwlock_wrlock(&s->lock);
    if (s->max_vars && s->nnames + s->pending_vars >= s->max_vars) {
        errf(err, errlen, "server holds %zu variables, the most allowed (max-variables %llu)",
             s->nnames, (unsigned long long)s->max_vars);
        rc = STATUS_RESOURCE_EXHAUSTED;
    } else if (!budget_take(s->budget, bytes)) {
        errf(err, errlen,
             "shard of %llu bytes (parameters and optimizer state) would exceed "
             "max-server-bytes %llu (%llu held by this server's variables and "
             "tables): " BUDGET_FULL_HINT,
             (unsigned long long)bytes, (unsigned long long)budget_max(s->budget),
             (unsigned long long)budget_held(s->budget));
        rc = STATUS_RESOURCE_EXHAUSTED;
    } else {
        s->pending_bytes += bytes;
        s->pending_vars++;
    }
    pthread_rwlock_unlock(&s->lock);
    return rc;
}

void store_unreserve(store *s, uint64_t bytes)
{
    pthread_rwlock_wrlock(&s->lock);
    bytes = bytes < s->pending_bytes ? bytes : s->pending_bytes;
    s->pending_bytes -= bytes;
    budget_give(s->budget, bytes);
    if (s->pending_vars)
        s->pending_vars--;
    pthread_rwlock_unlock(&s->lock);
}

variable *store_insert(store *s, variable *v)
{
    pthread_rwlock_wrlock(&s->lock);
    variable *old = find_locked(s, v->name, v->part);
    if (old == NULL) {
        size_t b = bucket_of(v->name, v->part);
        v->next = s->buckets[b];
        s->buckets[b] = v;
        s->n++;
        s->nnames += v->part == VARIABLE_HEAD;
        uint64_t bytes = store_shard_bytes(v->count, v->nslots);
        s->bytes += bytes;
        budget_force(s->budget, bytes); /* its room was reserved, or it was restored */
        v->owner = s;
        old = v; /* the creator's reference is the store's now; one more for the caller */
    }
    variable_retain(old);
    pthread_rwlock_unlock(&s->lock);
    return old;
}

variable *store_find(store *s, const char *name)
{
    return store_find_part(s, name, VARIABLE_HEAD);
}

variable *store_find_part(store *s, const char *name, uint64_t part)
{
    pthread_rwlock_rdlock(&s->lock);
    variable *v = find_locked(s, name, part);
    /* Under the lock: a linked variable holds the store's reference, so refs > 0 here. */
    if (v)
        variable_retain(v);
    pthread_rwlock_unlock(&s->lock);
    return v;
}

variable *store_remove(store *s, const char *name)
{
    return store_remove_part(s, name, VARIABLE_HEAD);
}

variable *store_remove_part(store *s, const char *name, uint64_t part)
{
    pthread_rwlock_wrlock(&s->lock);
    variable **pp = &s->buckets[bucket_of(name, part)];
    while (*pp && ((*pp)->part != part || strcmp((*pp)->name, name) != 0))
        pp = &(*pp)->next;
    variable *v = *pp;
    if (v) {
        *pp = v->next;
        v->next = NULL;
        s->n--;
        s->nnames -= part == VARIABLE_HEAD;
        atomic_store(&v->deleted, true);
    }
    pthread_rwlock_unlock(&s->lock);
    return v;
}

void store_list_release(variable **vars, size_t n)
{
    for (size_t i = 0; vars && i < n; i++)
        variable_release(vars[i]);
    free(vars);
}

size_t store_list(store *s, variable ***out)
{
    pthread_rwlock_rdlock(&s->lock);
    variable **arr = malloc((s->n ? s->n : 1) * sizeof(*arr));
    size_t k = 0;
    if (arr) {
        for (size_t i = 0; i < STORE_BUCKETS; i++)
            for (variable *v = s->buckets[i]; v; v = v->next) {
                variable_retain(v);
                arr[k++] = v;
            }
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
#define PS_SPEC_DIFF_(field, pt, wt, def)                                                          \
    if (a->field != b->field) {                                                                    \
        SPEC_FMT_(va, sizeof(va), a->field);                                                       \
        SPEC_FMT_(vb, sizeof(vb), b->field);                                                       \
        errf(detail, cap, "%s vs %s", va, vb);                                                     \
        return #field;                                                                             \
    }
    PS_SPEC_FIELDS(PS_SPEC_DIFF_)
    PS_SPEC_DIFF_(split, bool, protobuf_c_boolean, false)
    PS_SPEC_DIFF_(num_servers, uint32_t, uint32_t, 0)
    PS_SPEC_DIFF_(parts, bool, protobuf_c_boolean, false)
#undef PS_SPEC_DIFF_
    errf(detail, cap, "%s", "");
    return NULL;
}
