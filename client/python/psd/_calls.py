"""The calls of a training step, each crossing into libpsclient once: a step of any number of
variables and table items (ps_step_ex), its asynchronous form, and the asynchronous pushes and
pulls of one variable or table, returning an operation to wait on (no Python callback).

Two implementations with the same signatures:

- the native extension module ``psd._ext`` (client/python/ext/psdext.c; CPython's C API), when
  it is built: one C call per step, without ctypes' per-argument conversions, the GIL released
  while the library works;
- ctypes over the same library (this file), everywhere else.

Which one: the environment variable ``PSD_EXTENSION`` = ``off`` forces ctypes; = a path loads
the extension from that file (an error if it does not load: a path set on purpose is never
silently replaced); unset, the extension installed with the package (``psd/_ext*.so``) if
there is one, else the one a meson build made beside the libpsclient in use (BUILD/client/
python/_ext*.so for BUILD/client/libpsclient.so, as PSD_LIBRARY or ps-local name it), else
ctypes. ``impl()`` is the one in use, ``name()`` says which.

Arguments are handles and addresses as ints (0 or None: NULL): items are tuples
``(var, offset, count, grad, dst)``, table items ``(table, ids, n, grads, rows)``. A call
returns the library's status (``step``) or ``(status, op)``, op None on failure (the message
is ps_last_error's, of the calling thread). An op has ``wait()`` (status), ``done()``,
``message()`` and ``close()``; it keeps ``keep`` (the owners of the buffers) alive until it is
closed or collected, and freeing it waits for an operation still running.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
from ctypes import byref, c_void_p
from typing import Any, Optional, Sequence, Tuple

from . import _native

_BOUND = ("ps_step_ex", "ps_step_ex_async", "ps_push_async", "ps_assign_async", "ps_pull_async",
          "ps_push_pull_async", "ps_table_pull_async", "ps_table_push_async", "ps_op_wait",
          "ps_op_done", "ps_op_message", "ps_op_destroy")


class ExtensionNotLoadedError(ImportError):
    """PSD_EXTENSION names a file that is not a loadable psd._ext."""


# ---- ctypes ---------------------------------------------------------------------------------


class CtypesOp:
    """A started ps_op (ctypes), with the objects its buffers belong to."""

    __slots__ = ("_op", "_keep", "_status", "_waited")

    def __init__(self, op: int, keep: Any) -> None:
        self._op: Optional[int] = op
        self._keep = keep
        self._status = 0
        self._waited = False

    def wait(self) -> int:
        if not self._waited:
            if self._op is None:
                raise ValueError("psd: the operation was freed")
            self._status = _native.lib().ps_op_wait(self._op)
            self._waited = True
        return self._status

    def done(self) -> bool:
        return self._waited or self._op is None or bool(_native.lib().ps_op_done(self._op))

    def message(self) -> str:
        if self._op is None:
            return ""
        m = _native.lib().ps_op_message(self._op)
        return m.decode("utf-8", "replace") if m else ""

    def close(self) -> None:
        op, self._op = self._op, None
        if op is not None:
            _native.lib().ps_op_destroy(op)
        self._keep = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


def _step_arrays(items: Sequence[Tuple[Any, ...]],
                 tables: Sequence[Tuple[Any, ...]]) -> Tuple[Any, Any]:
    arr = (_native.StepItem * max(len(items), 1))()
    for i, (var, offset, count, grad, dst) in enumerate(items):
        it = arr[i]
        it.var, it.offset, it.count, it.grad, it.dst = var, offset, count, grad, dst
    tarr = (_native.TableItem * max(len(tables), 1))()
    size = ctypes.sizeof(_native.TableItem)
    for i, (table, ids, n, grads, rows) in enumerate(tables):
        t = tarr[i]
        t.struct_size, t.table, t.ids, t.n, t.grads, t.rows = size, table, ids, n, grads, rows
    return arr, tarr


_NO_CB = _native.DONE_FN()  # a NULL ps_done_fn: the op is waited for, never called back


def _started(rc: int, op: c_void_p, keep: Any) -> Tuple[int, Optional[CtypesOp]]:
    return (rc, None) if rc != 0 else (0, CtypesOp(op.value, keep))


class CtypesCalls:
    """The calls over ctypes (the signatures of psd._ext's)."""

    Op = CtypesOp

    @staticmethod
    def step(c: int, items: Sequence[Tuple[Any, ...]], tables: Sequence[Tuple[Any, ...]],
             flags: int) -> int:
        arr, tarr = _step_arrays(items, tables)
        return _native.lib().ps_step_ex(c, arr, len(items), tarr, len(tables), flags)

    @staticmethod
    def step_async(c: int, items: Sequence[Tuple[Any, ...]], tables: Sequence[Tuple[Any, ...]],
                   flags: int, keep: Any) -> Tuple[int, Optional[CtypesOp]]:
        arr, tarr = _step_arrays(items, tables)
        op = c_void_p()
        rc = _native.lib().ps_step_ex_async(c, arr, len(items), tarr, len(tables), flags,
                                            _NO_CB, None, byref(op))
        return _started(rc, op, keep)

    @staticmethod
    def push_async(c: int, var: int, offset: int, count: int, grad: int,
                   keep: Any) -> Tuple[int, Optional[CtypesOp]]:
        op = c_void_p()
        rc = _native.lib().ps_push_async(c, var, offset, count, grad, _NO_CB, None, byref(op))
        return _started(rc, op, keep)

    @staticmethod
    def assign_async(c: int, var: int, offset: int, count: int, values: int,
                     keep: Any) -> Tuple[int, Optional[CtypesOp]]:
        op = c_void_p()
        rc = _native.lib().ps_assign_async(c, var, offset, count, values, _NO_CB, None, byref(op))
        return _started(rc, op, keep)

    @staticmethod
    def pull_async(c: int, var: int, offset: int, count: int, dst: int,
                   keep: Any) -> Tuple[int, Optional[CtypesOp]]:
        op = c_void_p()
        rc = _native.lib().ps_pull_async(c, var, offset, count, dst, _NO_CB, None, byref(op))
        return _started(rc, op, keep)

    @staticmethod
    def push_pull_async(c: int, var: int, offset: int, count: int, grad: int, dst: int,
                        keep: Any) -> Tuple[int, Optional[CtypesOp]]:
        op = c_void_p()
        rc = _native.lib().ps_push_pull_async(c, var, offset, count, grad, dst, None, None,
                                              byref(op))
        return _started(rc, op, keep)

    @staticmethod
    def table_pull_async(table: int, ids: int, n: int, rows: int,
                         keep: Any) -> Tuple[int, Optional[CtypesOp]]:
        op = c_void_p()
        rc = _native.lib().ps_table_pull_async(table, ids, n, rows, _NO_CB, None, byref(op))
        return _started(rc, op, keep)

    @staticmethod
    def table_push_async(table: int, ids: int, n: int, grads: int,
                         keep: Any) -> Tuple[int, Optional[CtypesOp]]:
        op = c_void_p()
        rc = _native.lib().ps_table_push_async(table, ids, n, grads, _NO_CB, None, byref(op))
        return _started(rc, op, keep)

    @staticmethod
    def table_prefetch_async(table: int, ids: int, n: int,
                             keep: Any) -> Tuple[int, Optional[CtypesOp]]:
        """ps_table_prefetch_async, over ctypes whichever implementation is in use (once a
        step, off the hot path: the extension does not carry it)."""
        op = c_void_p()
        rc = _native.lib().ps_table_prefetch_async(table, ids, n, _NO_CB, None, byref(op))
        return _started(rc, op, keep)


# ---- choosing -------------------------------------------------------------------------------

_impl: Any = None
_name = ""


def _bind(mod: Any) -> Any:
    L = _native.lib()
    mod.bind({f: ctypes.cast(getattr(L, f), c_void_p).value for f in _BOUND})
    return mod


def _load_file(path: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader("psd._ext", path)
    spec = importlib.util.spec_from_file_location("psd._ext", path, loader=loader)
    if spec is None:
        raise ImportError(f"no module spec for {path}")
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _beside_library() -> Optional[str]:
    """BUILD/client/python/_ext<suffix> of this interpreter, for libpsclient loaded from
    BUILD/client/ (a meson build tree), if that file exists."""
    libdir = os.path.dirname(os.path.abspath(_native.library_path()))
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(libdir, "python", "_ext" + suffix)
        if os.path.isfile(path):
            return path
    return None


def _load_extension() -> Tuple[Any, str]:
    env = os.environ.get("PSD_EXTENSION", "")
    if env == "off":
        return None, "ctypes (PSD_EXTENSION=off)"
    if env:
        try:
            mod = _load_file(env)
        except (ImportError, OSError) as e:
            raise ExtensionNotLoadedError(f"PSD_EXTENSION={env}: cannot load psd._ext from it "
                                          f"({e}); PSD_EXTENSION=off uses ctypes") from e
        return _bind(mod), f"extension ({env})"
    try:
        from . import _ext  # type: ignore[attr-defined]
    except ImportError:
        pass
    else:
        return _bind(_ext), f"extension ({getattr(_ext, '__file__', 'psd._ext')})"
    path = _beside_library()
    if path is not None:
        try:
            return _bind(_load_file(path)), f"extension ({path})"
        except (ImportError, OSError) as e:
            return None, f"ctypes ({path} does not load: {e})"
    return None, "ctypes (no psd._ext built)"


def impl() -> Any:
    """The implementation in use (psd._ext, or CtypesCalls), chosen on first use."""
    global _impl, _name
    if _impl is None:
        mod, why = _load_extension()
        _name = why
        _impl = mod if mod is not None else CtypesCalls
    return _impl


def name() -> str:
    """Which implementation is in use: "extension (PATH)" or "ctypes (why)"."""
    impl()
    return _name


def use(which: str) -> None:
    """Switches to "ctypes" or "extension" (the benchmarks compare them in one process).
    ValueError if the extension is asked for and none is loadable."""
    global _impl, _name
    if which == "ctypes":
        _impl, _name = CtypesCalls, "ctypes (chosen)"
        return
    if which != "extension":
        raise ValueError(f"psd: no implementation {which!r} (ctypes, extension)")
    saved = os.environ.get("PSD_EXTENSION")
    if saved == "off":
        del os.environ["PSD_EXTENSION"]
    try:
        mod, why = _load_extension()
    finally:
        if saved == "off":
            os.environ["PSD_EXTENSION"] = saved
    if mod is None:
        raise ValueError(f"psd: no extension to use: {why}")
    _impl, _name = mod, why
