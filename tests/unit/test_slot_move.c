/* Unit tests for server/slot_move.h: a batch of slots exported by one server state and
 * installed into another holds the same variables (parameters, optimizer slots, versions) and
 * table rows (parameters, optimizer slots, update times), and the source's exactly-once
 * windows under the stream keys; the source's drop leaves exactly the other slots; a package
 * damaged anywhere, or for other slots, is refused with nothing installed; an install
 * repeated (a resumed move) ends the same. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"
#include "slot_move.h"
#include "slots.h"
#include "status.h"
#include "table.h"
#include "table_ckpt.h"

#define NEL 300
#define NVARS 40
#define NROWS 3000
#define CLIENT 0x1234567890abcdefull

static void state_init(server_state *st, uint32_t task)
{
    memset(st, 0, sizeof(*st));
    st->task_index = task;
    st->num_servers = 2;
    st->vars = store_create();
    st->dedup = dedup_create(1024);
    st->sync = sync_create(0, 10000, true, 64);
    assert_non_null(st->vars);
    assert_non_null(st->dedup);
}

static void state_fini(server_state *st)
{
    server_tables_free(st);
    store_destroy(st->vars);
    dedup_destroy(st->dedup);
    sync_destroy(st->sync);
}

static void add_var(server_state *st, const char *name, float scale)
{
    Psd__V1__VariableSpec spec = PSD__V1__VARIABLE_SPEC__INIT;
    uint64_t shape[1] = {NEL};
    spec.name = (char *)name;
    spec.dtype = PSD__V1__DTYPE__FLOAT32;
    spec.n_shape = 1;
    spec.shape = shape;
    spec.optimizer = PSD__V1__OPTIMIZER__OPT_ADAM;
    spec.learning_rate = 0.01;
    spec.beta1 = 0.9;
    spec.beta2 = 0.999;
    spec.epsilon = 1e-8;
    spec.staleness = -1;
    spec.num_servers = st->num_servers;
    char err[256];
    variable *v = variable_create(&spec, NEL, 0, NEL, err, sizeof(err));
    if (v == NULL)
        fail_msg("variable_create: %s", err);
    for (size_t i = 0; i < NEL; i++) {
        v->params[i] = (float)i * scale;
        for (size_t s = 0; s < v->nslots; s++)
            v->slots[s][i] = (float)(i + s) * 0.5f * scale;
    }
    atomic_store(&v->version, (uint64_t)(scale * 10));
    variable *in = store_insert(st->vars, v);
    assert_ptr_equal(in, v);
    variable_release(in);
}

static table *add_table(server_state *st)
{
    Psd__V1__TableSpec ts = PSD__V1__TABLE_SPEC__INIT;
    ts.name = "emb";
    ts.dim = 4;
    ts.optimizer = PSD__V1__OPTIMIZER__OPT_ADAGRAD;
    ts.learning_rate = 0.1;
    ts.initial_accumulator = 0.1;
    ts.epsilon = 1e-8;
    ts.staleness = -1;
    ts.num_servers = st->num_servers;
    uint8_t spec[256];
    size_t len = psd__v1__table_spec__pack(&ts, spec);
    table *t = NULL;
    char err[512];
    if (server_table_make(st, spec, len, &t, err, sizeof(err)) != 0)
        fail_msg("server_table_make: %s", err);
    assert_int_equal(server_table_register(st, t, spec, len), 0);
    return t;
}

/* Fills t with the rows of ids 0..NROWS whose owner under the static map of 2 is `task`. */
static void fill_rows(table *t, uint32_t task)
{
    slot_map m = slots_static(SLOTS_DEFAULT, 2);
    uint32_t rf = table_row_floats(t);
    float row[64];
    for (int64_t id = 0; id < NROWS; id++) {
        if (slots_row_owner(&m, "emb", id) != task)
            continue;
        for (uint32_t k = 0; k < rf; k++)
            row[k] = (float)id * 0.25f + (float)k;
        assert_int_equal(table_insert_row(t, id, row, 1700000000000 + id), TABLE_OK);
    }
}

/* The batch: every fourth slot (half of task 0's under s mod 2). */
static void batch(uint64_t *bits)
{
    memset(bits, 0, SLOTS_DEFAULT / 8);
    for (uint32_t s = 0; s < SLOTS_DEFAULT; s += 4)
        bits[s / 64] |= UINT64_C(1) << (s % 64);
}

static uint64_t rows_of(server_state *st)
{
    table_entry *e = registry_find(st, "emb");
    assert_non_null(e);
    table_stats ts;
    table_stats_get(e->t, &ts);
    registry_put(e);
    return ts.rows;
}

static bool has_var(server_state *st, const char *name)
{
    variable *v = store_find(st->vars, name);
    if (v)
        variable_release(v);
    return v != NULL;
}

/* a's and b's rows of the slots in bits: n each, the same ids, values and update times. */
static void assert_same_rows(server_state *a, server_state *b, const uint64_t *bits, uint64_t n)
{
    table_entry *ea = registry_find(a, "emb"), *eb = registry_find(b, "emb");
    table_rows ra, rb;
    assert_int_equal(server_table_slot_rows(ea->t, bits, SLOTS_DEFAULT, &ra), 0);
    assert_int_equal(server_table_slot_rows(eb->t, bits, SLOTS_DEFAULT, &rb), 0);
    assert_int_equal(ra.n, n);
    assert_int_equal(rb.n, n);
    for (size_t i = 0; i < ra.n; i++) {
        size_t j = 0;
        while (j < rb.n && rb.ids[j] != ra.ids[i])
            j++;
        assert_true(j < rb.n);
        assert_int_equal(ra.updated_ms[i], rb.updated_ms[j]);
        assert_memory_equal(ra.floats + i * ra.row_floats, rb.floats + j * rb.row_floats,
                            ra.row_floats * sizeof(float));
    }
    table_rows_free(&ra);
    table_rows_free(&rb);
    registry_put(ea);
    registry_put(eb);
}

/* a (task 0) with NVARS variables and its rows of the table, b (task 1) with its rows; returns
 * a's table. */
static table *two_states(server_state *a, server_state *b)
{
    state_init(a, 0);
    state_init(b, 1);
    char name[32];
    for (int i = 0; i < NVARS; i++) {
        snprintf(name, sizeof(name), "v%d", i);
        add_var(a, name, (float)(i + 1));
    }
    table *ta = add_table(a);
    fill_rows(ta, 0);
    fill_rows(add_table(b), 1);
    return ta;
}

static void test_export_install_drop(void **state)
{
    (void)state;
    server_state a, b;
    two_states(&a, &b);
    char name[32];
    for (uint64_t s = 1; s <= 10; s++)
        assert_int_equal(dedup_begin(a.dedup, CLIENT, s), DEDUP_NEW);
    uint64_t bits[SLOTS_DEFAULT / 64];
    batch(bits);
    uint64_t a_rows = rows_of(&a), b_rows = rows_of(&b);

    uint8_t *pkg = NULL;
    size_t len = 0;
    slot_move_counts ec, ic;
    char err[512];
    assert_int_equal(slot_move_export(&a, bits, &pkg, &len, &ec, err, sizeof(err)), STATUS_OK);
    assert_true(ec.rows > 0 && ec.rows < a_rows);
    assert_true(ec.variables > 0 && ec.variables < NVARS);
    assert_int_equal(ec.windows, 1);
    assert_int_equal(ec.bytes, len);

    /* Damaged anywhere (a byte of each 97), cut short, for other slots, of another source:
     * refused, nothing installed. */
    for (size_t at = 0; at < len; at += 97) {
        pkg[at] ^= 0x40;
        assert_int_not_equal(slot_move_install(&b, 0, bits, pkg, len, NULL, err, sizeof(err)),
                             STATUS_OK);
        pkg[at] ^= 0x40;
    }
    assert_int_equal(slot_move_install(&b, 0, bits, pkg, len - 8, NULL, err, sizeof(err)),
                     STATUS_INVALID_ARGUMENT);
    uint64_t other[SLOTS_DEFAULT / 64];
    batch(other);
    other[0] |= 2; /* slot 1 too */
    assert_int_equal(slot_move_install(&b, 0, other, pkg, len, NULL, err, sizeof(err)),
                     STATUS_INVALID_ARGUMENT);
    assert_int_equal(slot_move_install(&b, 1, bits, pkg, len, NULL, err, sizeof(err)),
                     STATUS_INVALID_ARGUMENT);
    assert_int_equal(rows_of(&b), b_rows);
    assert_int_equal(dedup_begin(b.dedup, slots_stream_client(CLIENT, 0), 5), DEDUP_NEW);
    dedup_unmark(b.dedup, slots_stream_client(CLIENT, 0), 5);

    /* Installed, twice (a resumed move): the same. */
    for (int round = 0; round < 2; round++) {
        assert_int_equal(slot_move_install(&b, 0, bits, pkg, len, &ic, err, sizeof(err)),
                         STATUS_OK);
        assert_int_equal(ic.rows, ec.rows);
        assert_int_equal(ic.variables, ec.variables);
        assert_int_equal(rows_of(&b), b_rows + ec.rows);
    }
    free(pkg);
    for (int i = 0; i < NVARS; i++) {
        snprintf(name, sizeof(name), "v%d", i);
        bool in = slot_set_has(bits, slots_of_name(name, SLOTS_DEFAULT));
        assert_int_equal(has_var(&b, name), in);
        if (!in)
            continue;
        variable *x = store_find(a.vars, name), *y = store_find(b.vars, name);
        assert_int_equal(x->nslots, y->nslots);
        assert_int_equal(atomic_load(&x->version), atomic_load(&y->version));
        assert_null(spec_diff(x->spec, y->spec, NULL, 0));
        assert_memory_equal(x->params, y->params, NEL * sizeof(float));
        for (size_t s = 0; s < x->nslots; s++)
            assert_memory_equal(x->slots[s], y->slots[s], NEL * sizeof(float));
        variable_release(x);
        variable_release(y);
    }
    /* Every moved row is the same on both, update time included. */
    assert_same_rows(&a, &b, bits, ec.rows);

    /* The source's window, under the stream key: its seqs are duplicates, newer ones new;
     * the client's own window on the target is untouched. */
    uint64_t k = slots_stream_client(CLIENT, 0);
    for (uint64_t s = 1; s <= 10; s++)
        assert_int_equal(dedup_begin(b.dedup, k, s), DEDUP_DUPLICATE);
    assert_int_equal(dedup_begin(b.dedup, k, 11), DEDUP_NEW);
    assert_int_equal(dedup_begin(b.dedup, CLIENT, 1), DEDUP_NEW);

    /* The source drops the batch: the other slots stay. */
    assert_int_equal(slot_move_drop(&a, bits), ec.rows + ec.variables);
    assert_int_equal(rows_of(&a), a_rows - ec.rows);
    for (int i = 0; i < NVARS; i++) {
        snprintf(name, sizeof(name), "v%d", i);
        assert_int_equal(has_var(&a, name),
                         !slot_set_has(bits, slots_of_name(name, SLOTS_DEFAULT)));
    }
    state_fini(&a);
    state_fini(&b);
}

/* Pre-copy: a snapshot installed while the source still changes the batch, then the package of
 * changes since it: it carries only the rows changed after the snapshot's time (plus every id),
 * and over the snapshot leaves the target with the source's final rows (a row updated after the
 * snapshot has its new value, one removed is gone, one made is there) and variables. */
static void test_changes_over_snapshot(void **state)
{
    (void)state;
    server_state a, b;
    table *ta = two_states(&a, &b);
    char name[32];
    for (uint64_t s = 1; s <= 3; s++)
        assert_int_equal(dedup_begin(a.dedup, CLIENT, s), DEDUP_NEW);
    uint64_t bits[SLOTS_DEFAULT / 64];
    batch(bits);
    uint64_t b_rows = rows_of(&b);
    uint8_t *snap = NULL, *chg = NULL;
    size_t snap_len = 0, chg_len = 0;
    slot_move_counts sc, cc, ic;
    char err[512];
    assert_int_equal(slot_move_export_snapshot(&a, bits, &snap, &snap_len, &sc, err, sizeof(err)),
                     STATUS_OK);
    assert_int_equal(slot_move_stage(&b, 0, bits, snap, snap_len, &ic, err, sizeof(err)),
                     STATUS_OK);
    assert_false(slot_move_is_changes(snap, snap_len));
    assert_int_equal(sc.windows, 0); /* the windows go with the changes */

    /* After the snapshot (its time: since): two rows of the batch updated, one removed, one
     * made; a variable of the batch updated. */
    const int64_t since = 1800000000000;
    int64_t in[4], nin = 0;
    for (int64_t id = 0; id < NROWS && nin < 4; id++)
        if (slot_set_has(bits, slots_of_row("emb", id, SLOTS_DEFAULT)))
            in[nin++] = id;
    assert_int_equal(nin, 4);
    float row[64];
    for (uint32_t k = 0; k < table_row_floats(ta); k++)
        row[k] = -1.5f - (float)k;
    assert_int_equal(table_insert_row(ta, in[0], row, since), TABLE_OK);
    assert_int_equal(table_insert_row(ta, in[1], row, since + 9), TABLE_OK);
    assert_int_equal(table_remove(ta, &in[2], 1), 1);
    int64_t fresh = NROWS + 1;
    while (!slot_set_has(bits, slots_of_row("emb", fresh, SLOTS_DEFAULT)))
        fresh++;
    assert_int_equal(table_insert_row(ta, fresh, row, since + 3), TABLE_OK);
    variable *v = NULL;
    for (int i = 0; v == NULL && i < NVARS; i++) {
        snprintf(name, sizeof(name), "v%d", i);
        if (slot_set_has(bits, slots_of_name(name, SLOTS_DEFAULT)))
            v = store_find(a.vars, name);
    }
    assert_non_null(v);
    v->params[7] = 42.0f;
    atomic_fetch_add(&v->version, 1);
    variable_release(v);

    assert_int_equal(
        slot_move_export_changes(&a, bits, since, &chg, &chg_len, &cc, err, sizeof(err)),
        STATUS_OK);
    assert_true(slot_move_is_changes(chg, chg_len));
    assert_int_equal(cc.rows, 3); /* the two updated and the one made */
    assert_int_equal(cc.ids, sc.rows);
    assert_int_equal(cc.variables, sc.variables);
    /* Less the unchanged rows (id, update time, 8 floats: 48 bytes each), plus every id, the
     * count of them and the window (client, highest, bitmap): the variables go whole in both. */
    uint64_t nw = 0;
    uint32_t words = 0;
    free(dedup_export(a.dedup, &nw, &words));
    assert_int_equal(cc.windows, 1);
    assert_int_equal(nw, 1);
    assert_int_equal(snap_len + sc.rows * 8 + 8 + (2 + words) * 8, chg_len + (sc.rows - 3) * 48);
    assert_int_equal(slot_move_install(&b, 0, bits, chg, chg_len, &ic, err, sizeof(err)),
                     STATUS_OK);
    assert_int_equal(ic.rows, 3);
    assert_same_rows(&a, &b, bits, sc.rows);
    assert_int_equal(rows_of(&b), b_rows + sc.rows);
    assert_int_equal(dedup_begin(b.dedup, slots_stream_client(CLIENT, 0), 3), DEDUP_DUPLICATE);
    for (int i = 0; i < NVARS; i++) {
        snprintf(name, sizeof(name), "v%d", i);
        if (!slot_set_has(bits, slots_of_name(name, SLOTS_DEFAULT)))
            continue;
        variable *x = store_find(a.vars, name), *y = store_find(b.vars, name);
        assert_non_null(y);
        assert_int_equal(atomic_load(&x->version), atomic_load(&y->version));
        assert_memory_equal(x->params, y->params, NEL * sizeof(float));
        variable_release(x);
        variable_release(y);
    }
    /* The same over a snapshot installed without its ids staged (the rows removed since are
     * found by reading the table). */
    server_state c;
    state_init(&c, 1);
    fill_rows(add_table(&c), 1);
    assert_int_equal(slot_move_install(&c, 0, bits, snap, snap_len, NULL, err, sizeof(err)),
                     STATUS_OK);
    assert_int_equal(slot_move_install(&c, 0, bits, chg, chg_len, NULL, err, sizeof(err)),
                     STATUS_OK);
    assert_same_rows(&a, &c, bits, sc.rows);
    state_fini(&c);
    /* Damaged, the package of changes is refused too. */
    chg[chg_len / 2] ^= 1;
    assert_int_equal(slot_move_install(&b, 0, bits, chg, chg_len, NULL, err, sizeof(err)),
                     STATUS_INVALID_ARGUMENT);
    free(snap);
    free(chg);
    state_fini(&a);
    state_fini(&b);
}

/* Stream keys: never the client's own id, one per source. */
static void test_stream_keys(void **state)
{
    (void)state;
    for (uint64_t c = 1; c < 1000; c++) {
        assert_true(slots_stream_client(c, 0) != c);
        assert_true(slots_stream_client(c, 0) != slots_stream_client(c, 1));
        assert_int_equal(slots_stream_client(c, 7), slots_stream_client(c, 7));
    }
}

/* Piece keys: stable, never the stream key, one per seq, map version and target. */
static void test_piece_keys(void **state)
{
    (void)state;
    for (uint64_t c = 1; c < 1000; c++) {
        uint64_t s = slots_stream_client(c, 0);
        uint64_t k = slots_piece_client(s, 5, 3, 1);
        assert_int_equal(k, slots_piece_client(s, 5, 3, 1));
        assert_true(k != s && k != c);
        assert_true(k != slots_piece_client(s, 5, 4, 1));
        assert_true(k != slots_piece_client(s, 5, 3, 2));
        assert_true(k != slots_piece_client(s, 6, 3, 1));
        assert_true(k != slots_piece_client(slots_stream_client(c, 1), 5, 3, 1));
        assert_true(k != slots_stream_client(s, 1));
    }
}

int main(void)
{
    log_init("test", -1, LOG_ERROR, LOG_FORMAT_TEXT);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_install_drop),
        cmocka_unit_test(test_changes_over_snapshot),
        cmocka_unit_test(test_stream_keys),
        cmocka_unit_test(test_piece_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
