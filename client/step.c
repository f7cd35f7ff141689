/* ps_step: a training step's pushes, clock and pulls in one request per server (the Step
 * method of proto/ps.proto).
 *
 * Planning. Every item's range is cut by owning server (split variables; by part and its
 * slot's owner for a variable cut in parts, no piece crossing a part) and into pieces of at
 * most chunk-bytes, each push piece with its own sequence number (from the stream of the
 * server's group: every message goes to one server, client_next_seq). A server whose pushes and
 * pulls each fit in chunk-bytes gets one message carrying all of them and the clock: one
 * round trip per server per step. A server with more gets its pushes first, packed into
 * messages of up to chunk-bytes sent at once; once every one is acknowledged, its pulls
 * follow, packed the same way, each carrying the clock (recording a clock twice is harmless:
 * it never goes back). So a clock never reaches a server before the pushes it closes, and a
 * pull always reads after them, as with ps_push + ps_clock + ps_pull.
 *
 * Table items (ps_step_ex) go the same way: each item's ids are grouped by owning server
 * (slots_row_owner) and cut into pieces that fit the same chunk (an id counts as two
 * elements, a row as dim), riding in the same messages as the dense pieces. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "id_dups.h"
#include "placement.h"
#include "status.h"

/* Ids of one table item in one Step message at most (the server's SERVER_TABLE_MAX_IDS). */
#define STEP_TABLE_MAX_IDS ((uint64_t)1 << 22)

typedef struct step_piece {
    size_t item;            /* index into items, or into titems for a table piece */
    uint64_t offset, count; /* in the variable's index space; a table piece's ids are
                               order[offset .. offset + count) of its item */
    uint64_t seq;           /* push pieces */
    const size_t *ord;      /* a table piece: its ids' indexes into its item's ids */
    bool push, pull, table;
} step_piece;

/* A table item, as the caller gave it, with its ids grouped by owning server. */
typedef struct step_titem {
    ps_table *t;
    const int64_t *ids;
    size_t n;
    const float *grads;
    float *rows;   /* the caller's rows */
    size_t *order; /* indexes into ids: server s's are order[start[s] .. start[s + 1]) */
    size_t *start; /* [nsrv + 1] */
    id_dups *dups; /* the caller's ids had duplicates: ids, n and grads are the distinct ones */
} step_titem;

typedef struct step_state step_state;

typedef struct step_msg step_msg;
struct step_msg {
    step_state *s;
    int server;
    uint64_t key; /* the client id it goes with (0: the client's own), after a move */
    bool phase1;  /* pushes of a server that needs more than one message */
    bool advance_clock;
    size_t first, npieces;           /* s->pieces[first .. first + npieces) */
    uint64_t push_elems, pull_elems; /* dense elements pushed and pulled */
    uint64_t req_words, rep_words;   /* for the chunk: dense elements, ids x 2, rows x dim */
    size_t ntable;                   /* table pieces among npieces */
    uint64_t table_pull_elems;       /* row elements of the table pieces that pull */
    /* A message resent after a move (resend): its own pieces (own, with table pieces' ids in
     * ordbuf) and the message it is part of, which completes once its `pending` parts have,
     * with the first failure among them (child_status, child_msg). */
    step_piece *own;
    size_t *ordbuf;
    step_msg *parent;
    int pending;
    int child_status;
    char child_msg[512];
};

static step_piece *piece_of(const step_msg *m, size_t k);

typedef struct step_server {
    int phase1_left;       /* phase-1 messages not yet answered; atomic via s->lock */
    bool failed;           /* a phase-1 message failed: phase 2 is not sent */
    size_t first2, nmsgs2; /* its phase-2 messages in s->msgs */
} step_server;

struct step_state {
    ps_client *c;
    ps_op *op;
    ps_step_item *items;
    size_t nitems;
    step_titem *titems;
    size_t ntitems;
    int64_t push_clock;
    bool clock;
    int dtype;
    step_piece *pieces;
    size_t npieces, cappieces;
    step_msg *msgs;
    size_t nmsgs, capmsgs;
    step_server *srv;
    int nsrv;     /* servers reached when it started (client_reach): those of the spec, then those
                     that joined; srv and each table item's start are that long */
    slot_map map; /* the client's map when it started: every piece is planned by it */
    pthread_mutex_t lock; /* srv, given_clock */
    int64_t given_clock;  /* highest clock a server replied (an evicted worker's new clock) */
};

static void step_state_free(void *arg)
{
    step_state *s = arg;
    if (s == NULL)
        return;
    free(s->items);
    for (size_t j = 0; s->titems && j < s->ntitems; j++) {
        free(s->titems[j].order);
        free(s->titems[j].start);
        id_dups_free(s->titems[j].dups);
    }
    free(s->titems);
    free(s->pieces);
    free(s->msgs);
    free(s->srv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static int add_piece(step_state *s, int server, size_t item, uint64_t offset, uint64_t count,
                     bool push, bool pull, bool table)
{
    if (s->npieces == s->cappieces) {
        size_t cap = s->cappieces ? 2 * s->cappieces : 16;
        step_piece *p = realloc(s->pieces, cap * sizeof(*p));
        if (p == NULL)
            return -1;
        s->pieces = p;
        s->cappieces = cap;
    }
    step_piece *p = &s->pieces[s->npieces++];
    p->item = item;
    p->offset = offset;
    p->count = count;
    p->push = push;
    p->pull = pull;
    p->table = table;
    p->ord = table ? s->titems[item].order + offset : NULL;
    p->seq = push ? client_next_seq(s->c, server) : 0;
    return 0;
}

static step_msg *add_msg(step_state *s, int server, bool phase1, bool advance_clock)
{
    if (s->nmsgs == s->capmsgs) {
        size_t cap = s->capmsgs ? 2 * s->capmsgs : 8;
        step_msg *m = realloc(s->msgs, cap * sizeof(*m));
        if (m == NULL)
            return NULL;
        s->msgs = m;
        s->capmsgs = cap;
    }
    step_msg *m = &s->msgs[s->nmsgs++];
    memset(m, 0, sizeof(*m));
    m->s = s;
    m->server = server;
    m->phase1 = phase1;
    m->advance_clock = advance_clock;
    m->first = s->npieces;
    return m;
}

/* The part of item i on `server`: [*lo, *hi), empty when *lo >= *hi. A variable held whole
 * is on its owner in the client's map now (the servers it reaches), else on its owner at
 * open, which answers where it went. */
static void item_range_on(const step_state *s, const ps_step_item *it, int server, uint64_t *lo,
                          uint64_t *hi)
{
    const ps_var *v = it->var;
    uint64_t a = 0, n = v->numel;
    if (v->split && (uint32_t)server < v->nservers)
        placement_range(v->numel, v->nservers, (uint32_t)server, &a, &n);
    else if (v->split)
        n = 0;
    else {
        int owner = (int)slots_name_owner(&s->map, v->name);
        if (owner >= s->nsrv)
            owner = (int)v->owner < s->nsrv ? (int)v->owner : 0;
        if (owner != server)
            n = 0;
    }
    uint64_t b = a + n;
    *lo = it->offset > a ? it->offset : a;
    *hi = it->offset + it->count < b ? it->offset + it->count : b;
}

/* Owner of part `part` of v (cut in parts) in the client's map now, among the servers the
 * step reaches (else the spec's static owner: it answers where the slot went). */
static int part_owner(const step_state *s, const slot_map *map, const ps_var *v, uint64_t part)
{
    int owner = client_part_owner(s->c, map, v->name, part);
    return owner < s->nsrv
               ? owner
               : (int)(slots_of_part(v->name, part, map->nslots) % (uint32_t)s->c->nservers);
}

/* The next piece of item `it` on `server` at or after element *x, of at most `chunk`
 * elements and inside one part of a variable cut in parts: [*x, *x + *n), or false when none
 * is left. Advances nothing: the caller sets *x past the piece. */
static bool item_next_on(const step_state *s, const ps_step_item *it, int server, uint64_t chunk,
                         const slot_map *map, uint64_t *x, uint64_t *n)
{
    const ps_var *v = it->var;
    uint64_t end = it->offset + it->count;
    if (!v->parts) {
        uint64_t lo, hi;
        item_range_on(s, it, server, &lo, &hi);
        if (*x < lo)
            *x = lo;
        if (*x >= hi)
            return false;
        *n = hi - *x < chunk ? hi - *x : chunk;
        return true;
    }
    if (*x < it->offset)
        *x = it->offset;
    while (*x < end) {
        uint64_t part = placement_part_of(*x), plo, pn;
        placement_part_range(v->numel, part, &plo, &pn);
        uint64_t hi = plo + pn < end ? plo + pn : end;
        if (part_owner(s, map, v, part) == server) {
            *n = hi - *x < chunk ? hi - *x : chunk;
            return true;
        }
        *x = hi;
    }
    return false;
}

/* Adds the pieces of every item on `server` (push and/or pull per `push`, `pull`, masked by
 * what each item asks for) to messages of at most `chunk` elements each way. Returns -1 when
 * out of memory. */
static int plan_pieces(step_state *s, int server, bool push, bool pull, bool phase1,
                       bool advance_clock, uint64_t chunk)
{
    step_msg *m = NULL;
    for (size_t i = 0; i < s->nitems; i++) {
        const ps_step_item *it = &s->items[i];
        bool ps = push && it->grad != NULL, pl = pull && it->dst != NULL;
        if (!ps && !pl)
            continue;
        uint64_t n;
        for (uint64_t x = 0; item_next_on(s, it, server, chunk, &s->map, &x, &n); x += n) {
            if (m == NULL || (ps && m->push_elems + n > chunk) ||
                (pl && m->pull_elems + n > chunk)) {
                if ((m = add_msg(s, server, phase1, advance_clock)) == NULL)
                    return -1;
            }
            if (add_piece(s, server, i, x, n, ps, pl, false) != 0)
                return -1;
            m->npieces++;
            m->push_elems += ps ? n : 0;
            m->pull_elems += pl ? n : 0;
            m->req_words += ps ? n : 0;
            m->rep_words += pl ? n : 0;
        }
    }
    for (size_t j = 0; j < s->ntitems; j++) {
        const step_titem *ti = &s->titems[j];
        bool ps = push && ti->grads != NULL, pl = pull && ti->rows != NULL;
        if (!ps && !pl)
            continue;
        uint64_t dim = ti->t->dim, per_req = 2 + (ps ? dim : 0), per_rep = pl ? dim : 0;
        uint64_t lo = ti->start[server], hi = ti->start[server + 1], n;
        for (uint64_t x = lo; x < hi; x += n) {
            /* As many ids as fit in one message's chunk (at least one), and the server's limit. */
            n = hi - x;
            if (chunk != UINT64_MAX) {
                uint64_t room = chunk / per_req;
                if (per_rep > 0 && chunk / per_rep < room)
                    room = chunk / per_rep;
                if (n > room)
                    n = room > 0 ? room : 1;
            }
            if (n > STEP_TABLE_MAX_IDS)
                n = STEP_TABLE_MAX_IDS;
            if (m == NULL || (chunk != UINT64_MAX && (m->req_words + n * per_req > chunk ||
                                                      m->rep_words + n * per_rep > chunk))) {
                if ((m = add_msg(s, server, phase1, advance_clock)) == NULL)
                    return -1;
            }
            if (add_piece(s, server, j, x, n, ps, pl, true) != 0)
                return -1;
            m->npieces++;
            m->ntable++;
            m->req_words += n * per_req;
            m->rep_words += n * per_rep;
            m->table_pull_elems += pl ? n * dim : 0;
        }
    }
    if (m == NULL && advance_clock && !phase1) /* nothing to move: the clock alone */
        if (add_msg(s, server, false, true) == NULL)
            return -1;
    return 0;
}

/* Plans every server's messages: one per server when its pushes and its pulls each fit in a
 * chunk, else phase 1 (pushes) and phase 2 (pulls, with the clock). */
static int plan(step_state *s)
{
    ps_client *c = s->c;
    uint64_t chunk = c->chunk_elems;
    for (int sv = 0; sv < s->nsrv; sv++) {
        uint64_t push = 0, pull = 0;
        for (size_t i = 0; i < s->nitems; i++) {
            uint64_t n = 0, x = 0, k;
            while (item_next_on(s, &s->items[i], sv, UINT64_MAX, &s->map, &x, &k)) {
                n += k;
                x += k;
            }
            push += s->items[i].grad ? n : 0;
            pull += s->items[i].dst ? n : 0;
        }
        for (size_t j = 0; j < s->ntitems; j++) {
            const step_titem *ti = &s->titems[j];
            uint64_t ids = ti->start[sv + 1] - ti->start[sv];
            if (ids > STEP_TABLE_MAX_IDS)
                push = UINT64_MAX; /* more than one message can carry */
            push = push == UINT64_MAX ? push : push + ids * (2 + (ti->grads ? ti->t->dim : 0));
            pull += ti->rows ? ids * ti->t->dim : 0;
        }
        if (push == 0 && pull == 0 && !s->clock)
            continue;
        if (push <= chunk && pull <= chunk) {
            size_t before = s->nmsgs;
            if (plan_pieces(s, sv, true, true, false, s->clock, UINT64_MAX) != 0)
                return -1;
            s->srv[sv].first2 = before;
            s->srv[sv].nmsgs2 = s->nmsgs - before;
            continue;
        }
        size_t before = s->nmsgs;
        if (plan_pieces(s, sv, true, false, true, false, chunk) != 0)
            return -1;
        s->srv[sv].phase1_left = (int)(s->nmsgs - before);
        before = s->nmsgs;
        if (plan_pieces(s, sv, false, true, false, s->clock, chunk) != 0)
            return -1;
        s->srv[sv].first2 = before;
        s->srv[sv].nmsgs2 = s->nmsgs - before;
    }
    return 0;
}

/* Bytes of the table pieces' part of a message's request segment (ids, then gradients). */
static uint64_t msg_table_bytes(const step_msg *m, size_t esize)
{
    const step_state *s = m->s;
    uint64_t b = 0;
    for (size_t k = 0; k < m->npieces; k++) {
        const step_piece *p = piece_of(m, k);
        if (p->table)
            b += 8 * p->count + (p->push ? esize * p->count * s->titems[p->item].t->dim : 0);
    }
    return b;
}

static int msg_build(void *arg, uint32_t deadline_ms, nng_msg **out)
{
    step_msg *m = arg;
    step_state *s = m->s;
    envelope env;
    client_envelope(s->c, &env, PSD__V1__METHOD__STEP, deadline_ms);
    env.clock = s->push_clock; /* fixed for resends: the clock these pushes belong to */
    size_t nd = m->npieces - m->ntable, nt = m->ntable;
    Psd__V1__StepItem stack_items[16], *items = stack_items;
    Psd__V1__StepItem *stack_ptrs[16], **ptrs = stack_ptrs;
    Psd__V1__StepTableItem *titems = NULL, **tptrs = NULL;
    if (nd > 16) {
        items = malloc(nd * sizeof(*items));
        ptrs = malloc(nd * sizeof(*ptrs));
    }
    if (nt > 0) {
        titems = malloc(nt * sizeof(*titems));
        tptrs = malloc(nt * sizeof(*tptrs));
    }
    if (items == NULL || ptrs == NULL || (nt > 0 && (titems == NULL || tptrs == NULL))) {
        if (items != stack_items) {
            free(items);
            free(ptrs);
        }
        free(titems);
        free(tptrs);
        return NNG_ENOMEM;
    }
    size_t kd = 0, kt = 0;
    for (size_t k = 0; k < m->npieces; k++) {
        const step_piece *p = piece_of(m, k);
        if (p->table) {
            psd__v1__step_table_item__init(&titems[kt]);
            titems[kt].name = s->titems[p->item].t->name;
            titems[kt].n = p->count;
            titems[kt].push = p->push;
            titems[kt].seq = p->seq;
            titems[kt].pull = p->pull;
            tptrs[kt] = &titems[kt];
            kt++;
            continue;
        }
        psd__v1__step_item__init(&items[kd]);
        items[kd].name = s->items[p->item].var->name;
        items[kd].offset = p->offset;
        items[kd].count = p->count;
        items[kd].push = p->push;
        items[kd].seq = p->seq;
        items[kd].pull = p->pull;
        ptrs[kd] = &items[kd];
        kd++;
    }
    Psd__V1__StepRequest req = PSD__V1__STEP_REQUEST__INIT;
    req.n_items = nd;
    req.items = ptrs;
    req.n_table_items = nt;
    req.table_items = tptrs;
    req.advance_clock = m->advance_clock;
    /* The tensor describes the segment (dense gradients, then the table items' ids and
     * gradients) and names the dtype the pulls come back in. */
    size_t esize = frame_dtype_size(s->dtype);
    uint64_t seg_bytes = m->push_elems * esize + msg_table_bytes(m, esize);
    Psd__V1__TensorMeta t = PSD__V1__TENSOR_META__INIT;
    t.dtype = (Psd__V1__DType)s->dtype;
    t.count = seg_bytes / esize;
    if (seg_bytes > 0 || s->dtype != PSD__V1__DTYPE__FLOAT32)
        env.tensor = &t;
    uint8_t *seg;
    int rv = client_build_segment(&env, &req.base, (size_t)seg_bytes, &seg, out);
    for (size_t k = 0; rv == 0 && k < m->npieces; k++) {
        const step_piece *p = piece_of(m, k);
        if (!p->push || p->table)
            continue;
        const ps_step_item *it = &s->items[p->item];
        frame_put_floats(seg, it->grad + (p->offset - it->offset), (size_t)p->count, s->dtype);
        seg += esize * p->count;
    }
    for (size_t k = 0; rv == 0 && k < m->npieces; k++) {
        const step_piece *p = piece_of(m, k);
        if (!p->table)
            continue;
        const step_titem *ti = &s->titems[p->item];
        const size_t *ord = p->ord;
        size_t dim = ti->t->dim;
        for (uint64_t x = 0; x < p->count; x++, seg += 8)
            memcpy(seg, &ti->ids[ord[x]], 8);
        for (uint64_t x = 0; p->push && x < p->count; x++, seg += esize * dim)
            frame_put_floats(seg, ti->grads + ord[x] * dim, dim, s->dtype);
    }
    if (items != stack_items) {
        free(items);
        free(ptrs);
    }
    free(titems);
    free(tptrs);
    return rv;
}

static step_piece *piece_of(const step_msg *m, size_t k)
{
    return m->own ? &m->own[k] : &m->s->pieces[m->first + k];
}

static void msg_done(void *arg, int status, const char *message, const frame *reply);

static void msg_start(step_msg *m)
{
    ps_client *c = m->s->c;
    int rc = client_call_own_moves(c, m->server, &c->call, m->key, msg_build, msg_done, m);
    if (rc != 0)
        msg_done(m, rc, "cannot start the request", NULL);
}

/* Reads a reply's results: acknowledged pushes (restart detection), pulled parameters. */
static int msg_read(step_msg *m, const frame *reply, const char **message)
{
    step_state *s = m->s;
    Psd__V1__StepReply *r =
        psd__v1__step_reply__unpack(NULL, reply->env->body.len, reply->env->body.data);
    if (r == NULL) {
        *message = "reply body does not decode as psd.v1.StepReply";
        return STATUS_INTERNAL;
    }
    int status = STATUS_OK;
    size_t esize = frame_dtype_size(s->dtype);
    const Psd__V1__TensorMeta *t = reply->env->tensor;
    uint64_t got = t && reply->has_segment ? t->count : 0;
    uint64_t want = m->pull_elems + m->table_pull_elems;
    if (m->ntable > 0 && r->n_table_results == 0) {
        *message = "the server answered a step with table items without their results (a server "
                   "that predates table items in Step)";
        status = STATUS_FAILED_PRECONDITION;
    } else if (r->n_results != m->npieces - m->ntable || r->n_table_results != m->ntable ||
               got != want || (want > 0 && (int)t->dtype != s->dtype)) {
        *message = "step reply does not match the request (results or pulled elements)";
        status = STATUS_INTERNAL;
    }
    const uint8_t *seg = reply->segment;
    for (size_t k = 0, kd = 0; status == STATUS_OK && k < m->npieces; k++) {
        const step_piece *p = piece_of(m, k);
        if (p->table)
            continue;
        const ps_step_item *it = &s->items[p->item];
        const Psd__V1__StepResult *res = r->results[kd++];
        if (p->push)
            client_note_push(s->c, it->var, m->server, reply->env->server_instance, res->version,
                             res->restored_version);
        if (p->pull) {
            frame_get_floats(it->dst + (p->offset - it->offset), seg, (size_t)p->count, s->dtype);
            seg += esize * p->count;
        }
    }
    for (size_t k = 0; status == STATUS_OK && k < m->npieces; k++) {
        const step_piece *p = piece_of(m, k);
        if (!p->table || !p->pull)
            continue;
        const step_titem *ti = &s->titems[p->item];
        const size_t *ord = p->ord;
        size_t dim = ti->t->dim;
        for (uint64_t x = 0; x < p->count; x++, seg += esize * dim) {
            frame_get_floats(ti->rows + id_dups_place(ti->dups, ord[x]) * dim, seg, dim, s->dtype);
            id_dups_copy_row(ti->dups, ord[x], ti->rows, dim);
        }
    }
    if (status == STATUS_OK && m->advance_clock) {
        pthread_mutex_lock(&s->lock);
        if (r->clock > s->given_clock)
            s->given_clock = r->clock;
        pthread_mutex_unlock(&s->lock);
    }
    psd__v1__step_reply__free_unpacked(r, NULL);
    return status;
}

/* The owner now of a dense piece's variable: a split one stays where its range is. */
static int piece_owner(const step_state *s, const step_piece *p, const slot_map *map, int at)
{
    const ps_var *v = s->items[p->item].var;
    if (v->parts) /* among every server reached now: resend's arrays are that long */
        return client_part_owner(s->c, map, v->name, placement_part_of(p->offset));
    return v->split ? at : (int)slots_name_owner(map, v->name);
}

/* m, refused by m->server because slots of it moved: the map is read again and m's pieces go
 * to their owners now as messages of their own (same seqs: a piece that stays under the key m
 * went with; the others, when m->server says it applied m (Envelope.moved_applied), under the
 * stream key of that and m->server, whose windows came with the slots, else each under a key
 * of its own, slots_piece_client; a table piece cut by owner; m's clock still to m->server). m
 * completes once they all have. Returns 0 when they took over, -1 when not (the map read moves none
 * of m's pieces, gives one to a server this client does not reach, or memory ran out). */
static int resend(step_msg *m, const frame *reply)
{
    step_state *s = m->s;
    ps_client *c = s->c;
    client_slots_refresh(c, reply->env->slots_version);
    slot_map map = c->slots;
    uint64_t version = c->slots_rec.version;
    int reach = client_reach(c), from = m->server;
    /* m's first push seq names it among the messages of its key to `from`. */
    uint64_t seq = 0;
    for (size_t k = 0; seq == 0 && k < m->npieces; k++)
        seq = piece_of(m, k)->push ? piece_of(m, k)->seq : 0;
    uint64_t stream = slots_stream_client(m->key ? m->key : c->client_id, (uint32_t)from);
    size_t nown = 0;
    for (size_t k = 0; k < m->npieces; k++)
        nown += piece_of(m, k)->table ? piece_of(m, k)->count : 1;
    int *own = malloc((nown ? nown : 1) * sizeof(int));
    size_t *np = calloc((size_t)reach, sizeof(size_t)), *ni = calloc((size_t)reach, sizeof(size_t));
    step_msg **kids = calloc((size_t)reach, sizeof(*kids));
    int rc = own && np && ni && kids ? 0 : -1;
    bool moved = false;
    for (size_t k = 0, x = 0; rc == 0 && k < m->npieces; k++) {
        const step_piece *p = piece_of(m, k);
        if (!p->table) {
            own[x] = piece_owner(s, p, &map, from);
            moved = moved || own[x] != from;
            rc = own[x] >= 0 && own[x] < reach ? 0 : -1;
            if (rc == 0)
                np[own[x]]++;
            x++;
            continue;
        }
        const step_titem *ti = &s->titems[p->item];
        bool seen[SLOTS_MAX_SERVERS] = {false};
        for (uint64_t i = 0; rc == 0 && i < p->count; i++, x++) {
            own[x] = (int)slots_row_owner_h(&map, ti->t->name_hash, ti->ids[p->ord[i]]);
            moved = moved || own[x] != from;
            rc = own[x] < reach && own[x] < SLOTS_MAX_SERVERS ? 0 : -1;
            if (rc == 0) {
                np[own[x]] += !seen[own[x]];
                seen[own[x]] = true;
                ni[own[x]]++;
            }
        }
    }
    int nkids = 0;
    for (int o = 0; rc == 0 && moved && o < reach; o++) {
        if (np[o] == 0 && !(o == from && m->advance_clock))
            continue;
        step_msg *ch = calloc(1, sizeof(*ch));
        if (ch == NULL || (ch->own = calloc(np[o] ? np[o] : 1, sizeof(step_piece))) == NULL ||
            (ch->ordbuf = malloc((ni[o] ? ni[o] : 1) * sizeof(size_t))) == NULL) {
            if (ch)
                free(ch->own);
            free(ch);
            rc = -1;
            break;
        }
        ch->s = s;
        ch->server = o;
        ch->parent = m;
        ch->advance_clock = m->advance_clock && o == from;
        /* Applied on `from` before its slots moved: the parts go where its window went, and
         * are duplicates there. Else each part that leaves it under a key of its own. */
        ch->key = o == from ? m->key
                  : reply->env->moved_applied
                      ? stream
                      : slots_piece_client(stream, seq, version, (uint32_t)o);
        kids[nkids++] = ch;
        size_t used = 0;
        for (size_t k = 0, x = 0; k < m->npieces; k++) {
            const step_piece *p = piece_of(m, k);
            if (!p->table) {
                if (own[x++] == o) {
                    ch->own[ch->npieces++] = *p;
                    ch->push_elems += p->push ? p->count : 0;
                    ch->pull_elems += p->pull ? p->count : 0;
                }
                continue;
            }
            size_t first = used;
            for (uint64_t i = 0; i < p->count; i++, x++)
                if (own[x] == o)
                    ch->ordbuf[used++] = p->ord[i];
            if (used == first)
                continue;
            step_piece *q = &ch->own[ch->npieces++];
            *q = *p;
            q->ord = ch->ordbuf + first;
            q->count = used - first;
            ch->ntable++;
            ch->table_pull_elems += p->pull ? q->count * s->titems[p->item].t->dim : 0;
        }
    }
    if (rc == 0 && moved && nkids > 0) {
        m->pending = nkids;
        m->child_status = STATUS_OK;
        /* Nothing of m or s is touched once the last one is started: it may complete m. */
        for (int i = 0; i < nkids; i++)
            msg_start(kids[i]);
    } else {
        for (int i = 0; i < nkids; i++) {
            free(kids[i]->own);
            free(kids[i]->ordbuf);
            free(kids[i]);
        }
        rc = -1;
    }
    free(own);
    free(np);
    free(ni);
    free(kids);
    return rc;
}

/* m is answered (status, message): a part of a resent message tells the message it is part
 * of; a message of the plan releases its server's part of the op (and, the last push message
 * of a server, its pulls and clock). */
static void msg_finish(step_msg *m, int status, const char *message)
{
    step_state *s = m->s;
    step_msg *up = m->parent;
    if (up != NULL) {
        pthread_mutex_lock(&s->lock);
        if (status != STATUS_OK && up->child_status == STATUS_OK) {
            up->child_status = status;
            snprintf(up->child_msg, sizeof(up->child_msg), "ps %d: %.480s", m->server,
                     message ? message : status_name(status));
        }
        bool last = --up->pending == 0;
        pthread_mutex_unlock(&s->lock);
        free(m->own);
        free(m->ordbuf);
        free(m);
        if (last)
            msg_finish(up, up->child_status, up->child_status == STATUS_OK ? NULL : up->child_msg);
        return;
    }
    if (m->phase1) {
        /* The last push message of a server releases its pulls and clock. */
        step_server *sv = &s->srv[m->server];
        pthread_mutex_lock(&s->lock);
        if (status != STATUS_OK)
            sv->failed = true;
        bool go = --sv->phase1_left == 0;
        bool failed = sv->failed;
        pthread_mutex_unlock(&s->lock);
        if (go) {
            for (size_t k = 0; k < sv->nmsgs2; k++) {
                if (failed)
                    client_op_release(s->op, m->server, STATUS_ABORTED,
                                      "not sent: a push of this step to the server failed");
                else
                    msg_start(&s->msgs[sv->first2 + k]);
            }
        }
    }
    client_op_release(s->op, m->server, status, message);
}

static void msg_done(void *arg, int status, const char *message, const frame *reply)
{
    step_msg *m = arg;
    if (status == STATUS_OK && reply != NULL)
        status = msg_read(m, reply, &message);
    else if (status == STATUS_OK)
        status = STATUS_INTERNAL, message = "no reply";
    else if (status == STATUS_FAILED_PRECONDITION && reply != NULL && reply->env->moved_to != 0 &&
             !m->s->c->replicated && atomic_load(&m->s->c->view_epoch) == 0 &&
             !atomic_load(&m->s->c->conns_closing) && resend(m, reply) == 0)
        return; /* its parts answer it */
    msg_finish(m, status, message);
}

/* Starts a step's op (client_op_fanout): phase-1 messages and single messages now; a
 * server's phase 2 once its phase 1 is done (or now, when it has none). */
static void step_send_all(void *arg, ps_op *op)
{
    step_state *s = arg;
    s->op = op;
    for (int sv = 0; sv < s->nsrv; sv++) {
        bool has1 = s->srv[sv].phase1_left > 0;
        for (size_t k = 0; k < s->nmsgs; k++) {
            step_msg *m = &s->msgs[k];
            if (m->server == sv && (m->phase1 || !has1))
                msg_start(m);
        }
    }
}

/* After a step that clocked: the client's clock moves to push_clock + 1, or to the clock a
 * server gave (an evicted worker continues from the servers' clock). */
static void step_complete(void *arg, int status)
{
    step_state *s = arg;
    if (status != STATUS_OK || !s->clock)
        return;
    int64_t now = s->push_clock + 1;
    if (s->given_clock > now)
        now = s->given_clock;
    int64_t cur = atomic_load(&s->c->clock);
    while (now > cur && !atomic_compare_exchange_weak(&s->c->clock, &cur, now)) {
    }
}

/* Copies the caller's table items (stride struct_size) into s->titems and groups each item's
 * ids by owning server. Returns PS_OK or an error (ps_last_error set). */
static int copy_table_items(step_state *s, const ps_table_item *tables, size_t nt)
{
    ps_client *c = s->c;
    if (nt == 0)
        return PS_OK;
    size_t stride = tables[0].struct_size;
    size_t v1 = offsetof(ps_table_item, rows) + sizeof(float *);
    if (stride < v1)
        return client_fail(PS_INVALID_ARGUMENT,
                           "ps_step_ex: table item 0 has struct_size %zu: set it to "
                           "sizeof(ps_table_item) (PS_TABLE_ITEM_INIT)",
                           stride);
    s->titems = calloc(nt, sizeof(*s->titems));
    if (s->titems == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    s->ntitems = nt;
    uint32_t ns = (uint32_t)s->nsrv;
    for (size_t j = 0; j < nt; j++) {
        ps_table_item it = {0};
        const ps_table_item *src = (const void *)((const char *)tables + j * stride);
        if (src->struct_size != stride)
            return client_fail(PS_INVALID_ARGUMENT,
                               "ps_step_ex: table item %zu has struct_size %zu, item 0 %zu (every "
                               "item of the array must have the same)",
                               j, src->struct_size, stride);
        memcpy(&it, src, stride < sizeof(it) ? stride : sizeof(it));
        if (it.table == NULL)
            return client_fail(PS_INVALID_ARGUMENT, "ps_step_ex: table item %zu has no table", j);
        if (it.table->c != c)
            return client_fail(PS_INVALID_ARGUMENT,
                               "ps_step_ex: table item %zu (\"%s\") belongs to another client", j,
                               it.table->name);
        if (it.grads == NULL && it.rows == NULL)
            return client_fail(PS_INVALID_ARGUMENT,
                               "ps_step_ex: table item %zu (\"%s\") has neither grads nor rows", j,
                               it.table->name);
        if (it.n > 0 && it.ids == NULL)
            return client_fail(PS_INVALID_ARGUMENT,
                               "ps_step_ex: table item %zu (\"%s\") has %zu ids but ids = NULL", j,
                               it.table->name, it.n);
        step_titem *ti = &s->titems[j];
        ti->t = it.table;
        ti->ids = it.ids;
        ti->n = it.n;
        ti->grads = it.grads;
        ti->rows = it.rows;
        /* Only distinct ids travel (id_dups.h); pushes in a 16-bit wire dtype as they are. */
        if ((it.grads == NULL || s->dtype == PSD__V1__DTYPE__FLOAT32) &&
            id_dups_find(it.ids, it.n, it.grads, ti->t->dim, &ti->dups) == 0 && ti->dups) {
            ti->ids = ti->dups->ids;
            ti->n = ti->dups->n;
            ti->grads = it.grads ? ti->dups->sums : NULL;
            it.ids = ti->ids;
            it.n = ti->n;
        }
        ti->order = malloc((it.n ? it.n : 1) * sizeof(*ti->order));
        ti->start = calloc((size_t)ns + 1, sizeof(*ti->start));
        uint32_t *owner = malloc((it.n ? it.n : 1) * sizeof(*owner));
        size_t *fill = malloc((size_t)ns * sizeof(*fill));
        if (ti->order == NULL || ti->start == NULL || owner == NULL || fill == NULL) {
            free(owner);
            free(fill);
            return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
        }
        for (size_t i = 0; i < it.n; i++) {
            owner[i] = slots_row_owner_h(&c->slots, ti->t->name_hash, it.ids[i]);
            if (owner[i] >= ns) /* joined since the step started: ps 0 answers where */
                owner[i] = 0;
            ti->start[owner[i] + 1]++;
        }
        for (uint32_t sv = 0; sv < ns; sv++)
            ti->start[sv + 1] += ti->start[sv];
        memcpy(fill, ti->start, (size_t)ns * sizeof(*fill));
        for (size_t i = 0; i < it.n; i++)
            ti->order[fill[owner[i]]++] = i;
        free(owner);
        free(fill);
    }
    return PS_OK;
}

/* ps_step_ex_async, at the client's clock or at_clock if that is higher (ps_pull_at_async). */
static int step_start(ps_client *c, const ps_step_item *items, size_t n,
                      const ps_table_item *tables, size_t ntables, unsigned flags, int64_t at_clock,
                      ps_done_fn cb, void *arg, ps_op **out_op)
{
    if (c == NULL || out_op == NULL || (items == NULL && n > 0) || (tables == NULL && ntables > 0))
        return client_fail(PS_INVALID_ARGUMENT, "ps_step: NULL client, items, table items or op");
    if (flags & ~(unsigned)PS_STEP_CLOCK)
        return client_fail(PS_INVALID_ARGUMENT, "ps_step: unknown flags 0x%x", flags);
    if ((flags & PS_STEP_CLOCK) && c->worker_id < 0)
        return client_fail(PS_FAILED_PRECONDITION,
                           "ps_step with PS_STEP_CLOCK needs a worker id: run as a worker task "
                           "or set worker-id");
    for (size_t i = 0; i < n; i++) {
        const ps_step_item *it = &items[i];
        if (it->var == NULL)
            return client_fail(PS_INVALID_ARGUMENT, "ps_step: item %zu has no variable", i);
        if (it->grad == NULL && it->dst == NULL)
            return client_fail(PS_INVALID_ARGUMENT,
                               "ps_step: item %zu (\"%s\") has neither grad nor dst", i,
                               it->var->name);
        if (it->offset > it->var->numel || it->count > it->var->numel - it->offset)
            return client_fail(PS_OUT_OF_RANGE,
                               "ps_step: item %zu: range [%llu, %llu+%llu) is outside \"%s\" of "
                               "%llu elements",
                               i, (unsigned long long)it->offset, (unsigned long long)it->offset,
                               (unsigned long long)it->count, it->var->name,
                               (unsigned long long)it->var->numel);
    }
    step_state *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    pthread_mutex_init(&s->lock, NULL);
    s->c = c;
    s->nitems = n;
    s->clock = (flags & PS_STEP_CLOCK) != 0;
    s->dtype = c->wire_dtype;
    s->push_clock = atomic_load(&c->clock);
    if (at_clock > s->push_clock)
        s->push_clock = at_clock;
    s->given_clock = INT64_MIN;
    s->nsrv = client_reach(c);
    s->map = c->slots; /* maps read stay allocated until close */
    int rc = copy_table_items(s, tables, ntables);
    if (rc != PS_OK) {
        step_state_free(s);
        return rc;
    }
    s->items = malloc((n ? n : 1) * sizeof(*s->items));
    s->srv = calloc((size_t)s->nsrv, sizeof(*s->srv));
    if (s->items != NULL && n > 0)
        memcpy(s->items, items, n * sizeof(*items));
    if (s->items == NULL || s->srv == NULL || plan(s) != 0) {
        step_state_free(s);
        return client_fail(PS_RESOURCE_EXHAUSTED, "out of memory");
    }
    return client_op_fanout(c, cb, arg, s, step_state_free, step_complete, s->nmsgs, step_send_all,
                            out_op);
}

int ps_step_ex_async(ps_client *c, const ps_step_item *items, size_t n, const ps_table_item *tables,
                     size_t ntables, unsigned flags, ps_done_fn cb, void *arg, ps_op **out_op)
{
    return step_start(c, items, n, tables, ntables, flags, INT64_MIN, cb, arg, out_op);
}

int ps_pull_at_async(ps_client *c, const ps_step_item *items, size_t n, int64_t clock,
                     ps_done_fn cb, void *arg, ps_op **out_op)
{
    if (c == NULL || out_op == NULL || (items == NULL && n > 0))
        return client_fail(PS_INVALID_ARGUMENT, "ps_pull_at_async: NULL client, items or op");
    if (c->worker_id < 0)
        return client_fail(PS_FAILED_PRECONDITION,
                           "ps_pull_at_async needs a worker id: run as a worker task or set "
                           "worker-id");
    for (size_t i = 0; i < n; i++)
        if (items[i].grad != NULL || items[i].dst == NULL)
            return client_fail(PS_INVALID_ARGUMENT,
                               "ps_pull_at_async: item %zu pushes or has no dst: it only pulls", i);
    return step_start(c, items, n, NULL, 0, 0, clock, cb, arg, out_op);
}

int ps_step_ex(ps_client *c, const ps_step_item *items, size_t n, const ps_table_item *tables,
               size_t ntables, unsigned flags)
{
    ps_op *op;
    int rc = ps_step_ex_async(c, items, n, tables, ntables, flags, NULL, NULL, &op);
    if (rc != PS_OK)
        return rc;
    rc = ps_op_wait(op);
    ps_op_destroy(op);
    return rc;
}

int ps_step_async(ps_client *c, const ps_step_item *items, size_t n, unsigned flags, ps_done_fn cb,
                  void *arg, ps_op **out_op)
{
    return ps_step_ex_async(c, items, n, NULL, 0, flags, cb, arg, out_op);
}

int ps_step(ps_client *c, const ps_step_item *items, size_t n, unsigned flags)
{
    return ps_step_ex(c, items, n, NULL, 0, flags);
}
