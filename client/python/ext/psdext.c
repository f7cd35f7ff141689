/* psd._ext: the calls of the Python package's training step as one native call each (CPython's
 * C API), used by psd/_calls.py when this module is built; psd/_calls.py has the same calls
 * over ctypes for when it is not.
 *
 * The module does not link libpsclient: bind() receives the addresses of the library's
 * functions from the copy ctypes loaded (psd/_native.py), so that every handle the package
 * holds belongs to the one library in the process. A call takes the handles and buffer
 * addresses as Python ints (0 or None: NULL) and returns the library's status; the
 * asynchronous ones return (status, Op or None). An Op holds a ps_op and the Python objects
 * whose memory it reads or writes (kept alive until it is freed); its wait() blocks without
 * the GIL. No Python code runs on a library thread: completions are only ever waited for.
 *
 * The library's types are psclient.h's when it is on the include path (the meson build), else
 * the same layout declared here (a pip build of client/python alone), as psd/_native.py
 * declares them for ctypes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<psclient.h>)
#include <psclient.h>
#define PSDEXT_HAVE_HEADER 1
#endif
#endif

#ifndef PSDEXT_HAVE_HEADER
typedef struct ps_client ps_client;
typedef struct ps_var ps_var;
typedef struct ps_op ps_op;
typedef struct ps_table ps_table;
typedef void (*ps_done_fn)(ps_op *op, void *arg);
typedef struct ps_step_item {
    ps_var *var;
    uint64_t offset, count;
    const float *grad;
    float *dst;
} ps_step_item;
typedef struct ps_table_item {
    size_t struct_size;
    ps_table *table;
    const int64_t *ids;
    size_t n;
    const float *grads;
    float *rows;
} ps_table_item;
#endif

/* ---- the library's functions, bound by address ---------------------------------------- */

typedef int (*step_fn)(ps_client *, const ps_step_item *, size_t, const ps_table_item *, size_t,
                       unsigned);
typedef int (*step_async_fn)(ps_client *, const ps_step_item *, size_t, const ps_table_item *,
                             size_t, unsigned, ps_done_fn, void *, ps_op **);
typedef int (*var_async_fn)(ps_client *, ps_var *, uint64_t, uint64_t, const float *, ps_done_fn,
                            void *, ps_op **);
typedef int (*pull_async_fn)(ps_client *, ps_var *, uint64_t, uint64_t, float *, ps_done_fn, void *,
                             ps_op **);
typedef int (*push_pull_async_fn)(ps_client *, ps_var *, uint64_t, uint64_t, const float *, float *,
                                  ps_done_fn, void *, ps_op **);
typedef int (*table_pull_async_fn)(ps_table *, const int64_t *, size_t, float *, ps_done_fn, void *,
                                   ps_op **);
typedef int (*table_push_async_fn)(ps_table *, const int64_t *, size_t, const float *, ps_done_fn,
                                   void *, ps_op **);
typedef int (*op_wait_fn)(ps_op *);
typedef bool (*op_done_fn)(const ps_op *);
typedef const char *(*op_message_fn)(const ps_op *);
typedef void (*op_destroy_fn)(ps_op *);

struct lib_fns {
    step_fn step_ex;
    step_async_fn step_ex_async;
    var_async_fn push_async;
    var_async_fn assign_async;
    pull_async_fn pull_async;
    push_pull_async_fn push_pull_async;
    table_pull_async_fn table_pull_async;
    table_push_async_fn table_push_async;
    op_wait_fn op_wait;
    op_done_fn op_done;
    op_message_fn op_message;
    op_destroy_fn op_destroy;
};
static struct lib_fns lib;

/* name in the dict bind() takes -> slot in lib */
static const struct {
    const char *name;
    size_t offset;
} lib_slots[] = {
    {"ps_step_ex", offsetof(struct lib_fns, step_ex)},
    {"ps_step_ex_async", offsetof(struct lib_fns, step_ex_async)},
    {"ps_push_async", offsetof(struct lib_fns, push_async)},
    {"ps_assign_async", offsetof(struct lib_fns, assign_async)},
    {"ps_pull_async", offsetof(struct lib_fns, pull_async)},
    {"ps_push_pull_async", offsetof(struct lib_fns, push_pull_async)},
    {"ps_table_pull_async", offsetof(struct lib_fns, table_pull_async)},
    {"ps_table_push_async", offsetof(struct lib_fns, table_push_async)},
    {"ps_op_wait", offsetof(struct lib_fns, op_wait)},
    {"ps_op_done", offsetof(struct lib_fns, op_done)},
    {"ps_op_message", offsetof(struct lib_fns, op_message)},
    {"ps_op_destroy", offsetof(struct lib_fns, op_destroy)},
};
#define N_SLOTS (sizeof lib_slots / sizeof lib_slots[0])

static bool bound;

static int check_bound(void)
{
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "psd._ext: bind() was not called");
        return -1;
    }
    return 0;
}

/* ---- arguments ------------------------------------------------------------------------ */

/* An address or handle: an int, or None for NULL. */
static int arg_ptr(PyObject *o, void **out)
{
    if (o == Py_None) {
        *out = NULL;
        return 0;
    }
    void *p = PyLong_AsVoidPtr(o);
    if (p == NULL && PyErr_Occurred())
        return -1;
    *out = p;
    return 0;
}

static int arg_u64(PyObject *o, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int check_nargs(const char *fn, Py_ssize_t got, Py_ssize_t want)
{
    if (got != want) {
        PyErr_Format(PyExc_TypeError, "psd._ext.%s takes %zd arguments (%zd given)", fn, want, got);
        return -1;
    }
    return 0;
}

/* ---- Op ------------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD ps_op *op;
    PyObject *keep; /* what the operation's buffers belong to, until it is freed */
    int status;     /* ps_op_wait's result, once waited for */
    bool waited;
} OpObject;

static void op_free(OpObject *self)
{
    ps_op *op = self->op;
    self->op = NULL;
    if (op != NULL) {
        /* waits for an operation still running: without the GIL, as wait() */
        PyThreadState *ts = PyEval_SaveThread();
        lib.op_destroy(op);
        PyEval_RestoreThread(ts);
    }
}

static void op_dealloc(OpObject *self)
{
    op_free(self);
    Py_CLEAR(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *op_wait(OpObject *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->waited) {
        if (self->op == NULL) {
            PyErr_SetString(PyExc_ValueError, "psd._ext.Op: freed");
            return NULL;
        }
        int rc;
        PyThreadState *ts = PyEval_SaveThread();
        rc = lib.op_wait(self->op);
        PyEval_RestoreThread(ts);
        self->status = rc;
        self->waited = true;
    }
    return PyLong_FromLong(self->status);
}

static PyObject *op_done(OpObject *self, PyObject *Py_UNUSED(ignored))
{
    if (self->waited || self->op == NULL)
        Py_RETURN_TRUE;
    return PyBool_FromLong(lib.op_done(self->op));
}

static PyObject *op_message(OpObject *self, PyObject *Py_UNUSED(ignored))
{
    const char *m = self->op != NULL ? lib.op_message(self->op) : NULL;
    return PyUnicode_DecodeUTF8(m ? m : "", m ? (Py_ssize_t)strlen(m) : 0, "replace");
}

static PyObject *op_close(OpObject *self, PyObject *Py_UNUSED(ignored))
{
    op_free(self);
    Py_CLEAR(self->keep);
    Py_RETURN_NONE;
}

static PyMethodDef op_methods[] = {
    {"wait", (PyCFunction)op_wait, METH_NOARGS,
     "Waits for the operation (without the GIL) and returns its status (0: done)."},
    {"done", (PyCFunction)op_done, METH_NOARGS, "Whether the operation has completed."},
    {"message", (PyCFunction)op_message, METH_NOARGS, "The library's message of a failure."},
    {"close", (PyCFunction)op_close, METH_NOARGS,
     "Frees the operation (waiting for it if still running) and what it kept alive."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject OpType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "psd._ext.Op",
    .tp_basicsize = sizeof(OpObject),
    .tp_dealloc = (destructor)op_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A started operation of libpsclient (ps_op) and the buffers it uses.",
    .tp_methods = op_methods,
};

/* (status, Op or None) of a call that started op (status 0) or failed (rc). */
static PyObject *started(int rc, ps_op *op, PyObject *keep)
{
    if (rc != 0)
        return Py_BuildValue("(iO)", rc, Py_None);
    OpObject *o = PyObject_New(OpObject, &OpType);
    if (o == NULL) {
        lib.op_destroy(op);
        return NULL;
    }
    o->op = op;
    o->status = 0;
    o->waited = false;
    Py_INCREF(keep);
    o->keep = keep;
    PyObject *r = Py_BuildValue("(iN)", 0, (PyObject *)o);
    return r;
}

/* ---- steps ---------------------------------------------------------------------------- */

/* The items of a step, from sequences of (var, offset, count, grad, dst) and (table, ids, n,
 * grads, rows) tuples. */
typedef struct {
    ps_step_item *items;
    size_t n;
    ps_table_item *tables;
    size_t ntables;
    ps_step_item items_small[16];
    ps_table_item tables_small[4];
} step_args;

static void step_args_fini(step_args *a)
{
    if (a->items != a->items_small)
        PyMem_Free(a->items);
    if (a->tables != a->tables_small)
        PyMem_Free(a->tables);
}

static int step_item(PyObject *t, ps_step_item *it)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "psd._ext: a step item is a tuple (var, offset, count, grad, dst)");
        return -1;
    }
    void *var, *grad, *dst;
    if (arg_ptr(PyTuple_GET_ITEM(t, 0), &var) || arg_u64(PyTuple_GET_ITEM(t, 1), &it->offset) ||
        arg_u64(PyTuple_GET_ITEM(t, 2), &it->count) || arg_ptr(PyTuple_GET_ITEM(t, 3), &grad) ||
        arg_ptr(PyTuple_GET_ITEM(t, 4), &dst))
        return -1;
    it->var = var;
    it->grad = grad;
    it->dst = dst;
    return 0;
}

static int table_item(PyObject *t, ps_table_item *it)
{
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "psd._ext: a table item is a tuple (table, ids, n, grads, rows)");
        return -1;
    }
    void *table, *ids, *grads, *rows;
    uint64_t n;
    if (arg_ptr(PyTuple_GET_ITEM(t, 0), &table) || arg_ptr(PyTuple_GET_ITEM(t, 1), &ids) ||
        arg_u64(PyTuple_GET_ITEM(t, 2), &n) || arg_ptr(PyTuple_GET_ITEM(t, 3), &grads) ||
        arg_ptr(PyTuple_GET_ITEM(t, 4), &rows))
        return -1;
    it->struct_size = sizeof *it;
    it->table = table;
    it->ids = ids;
    it->n = (size_t)n;
    it->grads = grads;
    it->rows = rows;
    return 0;
}

static int step_args_init(step_args *a, PyObject *items, PyObject *tables)
{
    a->items = a->items_small;
    a->tables = a->tables_small;
    a->n = a->ntables = 0;
    PyObject *fi = PySequence_Fast(items, "psd._ext: step items must be a sequence");
    if (fi == NULL)
        return -1;
    PyObject *ft = PySequence_Fast(tables, "psd._ext: table items must be a sequence");
    if (ft == NULL) {
        Py_DECREF(fi);
        return -1;
    }
    int rc = -1;
    size_t n = (size_t)PySequence_Fast_GET_SIZE(fi);
    size_t nt = (size_t)PySequence_Fast_GET_SIZE(ft);
    if (n > sizeof a->items_small / sizeof a->items_small[0]) {
        a->items = PyMem_Calloc(n, sizeof *a->items);
        if (a->items == NULL) {
            PyErr_NoMemory();
            goto out;
        }
    }
    if (nt > sizeof a->tables_small / sizeof a->tables_small[0]) {
        a->tables = PyMem_Calloc(nt, sizeof *a->tables);
        if (a->tables == NULL) {
            PyErr_NoMemory();
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (step_item(PySequence_Fast_GET_ITEM(fi, (Py_ssize_t)i), &a->items[i]))
            goto out;
    for (size_t i = 0; i < nt; i++)
        if (table_item(PySequence_Fast_GET_ITEM(ft, (Py_ssize_t)i), &a->tables[i]))
            goto out;
    a->n = n;
    a->ntables = nt;
    rc = 0;
out:
    Py_DECREF(ft);
    Py_DECREF(fi);
    if (rc != 0)
        step_args_fini(a);
    return rc;
}

/* step(client, items, tables, flags) -> status: ps_step_ex, blocking, without the GIL. */
static PyObject *ext_step(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    void *c;
    unsigned long flags;
    step_args a;
    if (check_bound() || check_nargs("step", nargs, 4) || arg_ptr(args[0], &c))
        return NULL;
    flags = PyLong_AsUnsignedLong(args[3]);
    if (flags == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (step_args_init(&a, args[1], args[2]))
        return NULL;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = lib.step_ex(c, a.items, a.n, a.tables, a.ntables, (unsigned)flags);
    PyEval_RestoreThread(ts);
    step_args_fini(&a);
    return PyLong_FromLong(rc);
}

/* step_async(client, items, tables, flags, keep) -> (status, Op): ps_step_ex_async. */
static PyObject *ext_step_async(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    void *c;
    unsigned long flags;
    step_args a;
    if (check_bound() || check_nargs("step_async", nargs, 5) || arg_ptr(args[0], &c))
        return NULL;
    flags = PyLong_AsUnsignedLong(args[3]);
    if (flags == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (step_args_init(&a, args[1], args[2]))
        return NULL;
    ps_op *op = NULL;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = lib.step_ex_async(c, a.items, a.n, a.tables, a.ntables, (unsigned)flags, NULL, NULL, &op);
    PyEval_RestoreThread(ts);
    step_args_fini(&a);
    return started(rc, op, args[4]);
}

/* ---- one variable or table ------------------------------------------------------------ */

enum var_call { CALL_PUSH, CALL_ASSIGN, CALL_PULL };

/* (client, var, offset, count, buf, keep) -> (status, Op) */
static PyObject *var_call(const char *fn, enum var_call which, PyObject *const *args,
                          Py_ssize_t nargs)
{
    void *c, *v, *buf;
    uint64_t offset, count;
    if (check_bound() || check_nargs(fn, nargs, 6) || arg_ptr(args[0], &c) ||
        arg_ptr(args[1], &v) || arg_u64(args[2], &offset) || arg_u64(args[3], &count) ||
        arg_ptr(args[4], &buf))
        return NULL;
    ps_op *op = NULL;
    int rc;
    PyThreadState *ts = PyEval_SaveThread(); /* the gradient is copied into messages */
    switch (which) {
    case CALL_PUSH:
        rc = lib.push_async(c, v, offset, count, buf, NULL, NULL, &op);
        break;
    case CALL_ASSIGN:
        rc = lib.assign_async(c, v, offset, count, buf, NULL, NULL, &op);
        break;
    default:
        rc = lib.pull_async(c, v, offset, count, buf, NULL, NULL, &op);
        break;
    }
    PyEval_RestoreThread(ts);
    return started(rc, op, args[5]);
}

static PyObject *ext_push_async(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    return var_call("push_async", CALL_PUSH, args, nargs);
}

static PyObject *ext_assign_async(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    return var_call("assign_async", CALL_ASSIGN, args, nargs);
}

static PyObject *ext_pull_async(PyObject *Py_UNUSED(m), PyObject *const *args, Py_ssize_t nargs)
{
    return var_call("pull_async", CALL_PULL, args, nargs);
}

/* push_pull_async(client, var, offset, count, grad, dst, keep) -> (status, Op) */
static PyObject *ext_push_pull_async(PyObject *Py_UNUSED(m), PyObject *const *args,
                                     Py_ssize_t nargs)
{
    void *c, *v, *grad, *dst;
    uint64_t offset, count;
    if (check_bound() || check_nargs("push_pull_async", nargs, 7) || arg_ptr(args[0], &c) ||
        arg_ptr(args[1], &v) || arg_u64(args[2], &offset) || arg_u64(args[3], &count) ||
        arg_ptr(args[4], &grad) || arg_ptr(args[5], &dst))
        return NULL;
    ps_op *op = NULL;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = lib.push_pull_async(c, v, offset, count, grad, dst, NULL, NULL, &op);
    PyEval_RestoreThread(ts);
    return started(rc, op, args[6]);
}

/* (table, ids, n, buf, keep) -> (status, Op) */
static PyObject *table_call(const char *fn, bool push, PyObject *const *args, Py_ssize_t nargs)
{
    void *t, *ids, *buf;
    uint64_t n;
    if (check_bound() || check_nargs(fn, nargs, 5) || arg_ptr(args[0], &t) ||
        arg_ptr(args[1], &ids) || arg_u64(args[2], &n) || arg_ptr(args[3], &buf))
        return NULL;
    ps_op *op = NULL;
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    if (push)
        rc = lib.table_push_async(t, ids, (size_t)n, buf, NULL, NULL, &op);
    else
        rc = lib.table_pull_async(t, ids, (size_t)n, buf, NULL, NULL, &op);
    PyEval_RestoreThread(ts);
    return started(rc, op, args[4]);
}

static PyObject *ext_table_pull_async(PyObject *Py_UNUSED(m), PyObject *const *args,
                                      Py_ssize_t nargs)
{
    return table_call("table_pull_async", false, args, nargs);
}

static PyObject *ext_table_push_async(PyObject *Py_UNUSED(m), PyObject *const *args,
                                      Py_ssize_t nargs)
{
    return table_call("table_push_async", true, args, nargs);
}

/* ---- binding -------------------------------------------------------------------------- */

/* bind({name: address}) with every function of lib_slots. */
static PyObject *ext_bind(PyObject *Py_UNUSED(m), PyObject *addrs)
{
    if (!PyDict_Check(addrs)) {
        PyErr_SetString(PyExc_TypeError, "psd._ext.bind takes a dict {name: address}");
        return NULL;
    }
    void *got[N_SLOTS];
    for (size_t i = 0; i < N_SLOTS; i++) {
        PyObject *a = PyDict_GetItemString(addrs, lib_slots[i].name);
        if (a == NULL) {
            PyErr_Format(PyExc_KeyError, "psd._ext.bind: no address for %s", lib_slots[i].name);
            return NULL;
        }
        if (arg_ptr(a, &got[i]))
            return NULL;
        if (got[i] == NULL) {
            PyErr_Format(PyExc_ValueError, "psd._ext.bind: %s is NULL", lib_slots[i].name);
            return NULL;
        }
    }
    for (size_t i = 0; i < N_SLOTS; i++)
        memcpy((char *)&lib + lib_slots[i].offset, &got[i], sizeof got[i]);
    bound = true;
    Py_RETURN_NONE;
}

static PyMethodDef ext_methods[] = {
    {"bind", ext_bind, METH_O, "bind({name: address}): the library's functions."},
    {"step", (PyCFunction)(void (*)(void))ext_step, METH_FASTCALL,
     "step(client, items, tables, flags) -> status (ps_step_ex)."},
    {"step_async", (PyCFunction)(void (*)(void))ext_step_async, METH_FASTCALL,
     "step_async(client, items, tables, flags, keep) -> (status, Op)."},
    {"push_async", (PyCFunction)(void (*)(void))ext_push_async, METH_FASTCALL,
     "push_async(client, var, offset, count, grad, keep) -> (status, Op)."},
    {"assign_async", (PyCFunction)(void (*)(void))ext_assign_async, METH_FASTCALL,
     "assign_async(client, var, offset, count, values, keep) -> (status, Op)."},
    {"pull_async", (PyCFunction)(void (*)(void))ext_pull_async, METH_FASTCALL,
     "pull_async(client, var, offset, count, dst, keep) -> (status, Op)."},
    {"push_pull_async", (PyCFunction)(void (*)(void))ext_push_pull_async, METH_FASTCALL,
     "push_pull_async(client, var, offset, count, grad, dst, keep) -> (status, Op)."},
    {"table_pull_async", (PyCFunction)(void (*)(void))ext_table_pull_async, METH_FASTCALL,
     "table_pull_async(table, ids, n, rows, keep) -> (status, Op)."},
    {"table_push_async", (PyCFunction)(void (*)(void))ext_table_push_async, METH_FASTCALL,
     "table_push_async(table, ids, n, grads, keep) -> (status, Op)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ext_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_ext",
    .m_doc = "The psd package's step calls in C (see psd/_calls.py); bound to libpsclient by "
             "bind().",
    .m_size = -1,
    .m_methods = ext_methods,
};

PyMODINIT_FUNC PyInit__ext(void); /* the module's entry point, looked up by the interpreter */

PyMODINIT_FUNC PyInit__ext(void)
{
    if (PyType_Ready(&OpType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&ext_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&OpType);
    if (PyModule_AddObject(m, "Op", (PyObject *)&OpType) < 0) {
        Py_DECREF(&OpType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
