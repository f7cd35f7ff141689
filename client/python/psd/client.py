"""The client: connection, variables, pull and push (blocking and asynchronous), clock,
server status. A thin layer over libpsclient; see client/psclient.h for every contract."""

from __future__ import annotations

import ctypes
import itertools
import json
import sys
import threading
from concurrent.futures import Future
from ctypes import byref, c_char_p, c_int, c_int64, c_size_t, c_ubyte, c_uint64, c_void_p
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _calls, _native
from ._buffers import _EMPTY_ADDR, resolve
from .errors import InvalidArgumentError, PsError, error_for

STALENESS_ASYNC = _native.PS_STALENESS_ASYNC
STALENESS_BSP = _native.PS_STALENESS_BSP
STALENESS_DEFAULT = _native.PS_STALENESS_DEFAULT

ClusterSpec = Union[str, Mapping[str, Any]]


def _text(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


def _raise(rc: int) -> None:
    """Raises the exception for a failed call made by this thread."""
    raise error_for(rc, _text(_native.lib().ps_last_error()))


def version() -> str:
    """The version of the loaded libpsclient ("MAJOR.MINOR.PATCH")."""
    return _text(_native.lib().ps_version())


def optimizer_parse(name: str) -> int:
    """The number of the optimizer called `name` (case-insensitive), as ps_optimizer_parse.

    Raises InvalidArgumentError (whose message lists the known names) for an unknown name."""
    out = c_int(-1)
    rc = _native.lib().ps_optimizer_parse(name.encode(), byref(out))
    if rc != 0:
        _raise(rc)
    return out.value


def optimizer_name(optimizer: int) -> str:
    """The canonical name of optimizer number `optimizer`, or "unknown"."""
    return _text(_native.lib().ps_optimizer_name(optimizer))


# ---- asynchronous completion --------------------------------------------------------------
#
# One C callback for the whole process (a ctypes callback must outlive every call into it);
# the `arg` of each operation is a token naming its entry in _pending, which holds the Future,
# the caller's buffers and the result until the operation completes. The callback runs on a
# library thread: it only records the outcome and completes the Future. ps_op_destroy cannot
# be called from inside the callback (it waits for the callback to return), so completed op
# handles go to _finished and are freed by the next call that starts an operation, by
# Client.close, or at exit.


class _Pending:
    __slots__ = ("future", "result", "keep")

    def __init__(self, future: "Future[Any]", result: Any, keep: Tuple[Any, ...]) -> None:
        self.future = future
        self.result = result
        self.keep = keep


_pending: Dict[int, _Pending] = {}
_finished: List[int] = []
_tokens = itertools.count(1)


def _on_done(op: int, arg: int) -> None:
    try:
        entry = _pending.pop(arg, None)
        if entry is None:
            return
        L = _native.lib()
        rc = L.ps_op_status(op)
        if rc == 0:
            entry.future.set_result(entry.result)
        else:
            entry.future.set_exception(error_for(rc, _text(L.ps_op_message(op))))
        entry.keep = ()
        _finished.append(op)
    except BaseException as e:  # nothing may propagate into C
        print(f"psd: error in completion callback: {e!r}", file=sys.stderr)


_ON_DONE = _native.DONE_FN(_on_done)


def _reap() -> None:
    L = None
    while _finished:
        try:
            op = _finished.pop()
        except IndexError:
            break
        if L is None:
            L = _native.lib()
        L.ps_op_destroy(op)


def _start_future(client: "Client", fn_name: str, with_client: bool, args: Tuple[Any, ...],
                  result: Any, keep: Tuple[Any, ...]) -> "Future[Any]":
    """Starts libpsclient's fn_name(client if with_client, *args, callback, token, &op) and
    returns the Future the callback completes (with `result`); `keep` lives until then."""
    _reap()
    fut: Future[Any] = Future()
    fut.set_running_or_notify_cancel()  # the transfer cannot be called back: no cancel()
    token = next(_tokens)
    _pending[token] = _Pending(fut, result, keep)
    op = c_void_p()
    c = client._enter()
    try:
        lead = (c,) if with_client else ()
        rc = getattr(_native.lib(), fn_name)(*lead, *args, _ON_DONE, token, byref(op))
    finally:
        client._leave()
    if rc != 0:
        _pending.pop(token, None)
        _raise(rc)
    return fut


# ---- status --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StalenessStats:
    """Observed staleness of pulls by workers (ps_staleness_stats)."""

    max: int
    pulls: int
    waits: int
    wait_ms: int
    timeouts: int
    histogram: Tuple[int, ...]

    @classmethod
    def _from_c(cls, s: _native.StalenessStats) -> "StalenessStats":
        return cls(s.max, s.pulls, s.waits, s.wait_ms, s.timeouts, tuple(s.histogram))


@dataclass(frozen=True)
class ServerStatus:
    """Counters of one server (ps_server_stats)."""

    task_index: int
    uptime_ms: int
    requests: int
    errors: int
    updates_applied: int
    duplicates_dropped: int
    bytes_in: int
    bytes_out: int
    bytes_held: int
    num_variables: int
    min_clock: int
    live_workers: int
    evictions: int
    staleness: StalenessStats

    @classmethod
    def _from_c(cls, s: _native.ServerStats) -> "ServerStatus":
        kw = {f.name: getattr(s, f.name) for f in fields(cls) if f.name != "staleness"}
        return cls(staleness=StalenessStats._from_c(s.staleness), **kw)


# ---- variables -----------------------------------------------------------------------------


class Variable:
    """A variable on the servers (a handle owned by its Client, valid until it closes).

    Data methods take float32 memory used in place, never copied: a NumPy array, a PyTorch
    CPU tensor or any object with the buffer protocol (format 'f'), C-contiguous, and writable
    for the destinations of pulls.

    Without `offset` and `count` a call is about the whole variable: the buffer must hold
    exactly the variable's number of elements, and a buffer of two or more dimensions must have
    the variable's shape (a (4, 3) tensor for a (3, 4) variable is refused; a flat buffer of
    the right size, e.g. ``t.view(-1)``, is the flattened variable). Otherwise ValueError names
    both sizes (or shapes). A range of the flattened variable is only ever what the caller
    wrote: `offset` (default 0) and/or `count` (default: the buffer's number of elements;
    for a pull without a buffer, the rest of the variable); OutOfRangeError if it goes past
    the end.
    """

    __slots__ = ("_client", "_h", "name", "shape", "size", "__weakref__")

    def __init__(self, client: "Client", handle: int) -> None:
        L = _native.lib()
        self._client = client
        self._h = handle
        self.name: str = _text(L.ps_var_name(handle))
        self.shape: Tuple[int, ...] = tuple(L.ps_var_dim(handle, i)
                                            for i in range(L.ps_var_ndims(handle)))
        self.size: int = L.ps_var_numel(handle)

    def __repr__(self) -> str:
        return f"<psd.Variable {self.name!r} shape={self.shape} shards={self.num_shards}>"

    @property
    def client(self) -> "Client":
        return self._client

    @property
    def num_shards(self) -> int:
        """Number of servers the variable is split over in ranges, or of its parts when it is
        cut in parts (split-parts), 1 for one held whole."""
        return _native.lib().ps_var_num_shards(self._h)

    @property
    def staleness_bound(self) -> int:
        """The staleness bound the servers enforce: -1 (async), 0 (BSP) or s > 0."""
        return _native.lib().ps_var_staleness_bound(self._h)

    def staleness(self) -> StalenessStats:
        """Observed staleness of this variable's pulls, summed over its servers. Blocks."""
        out = _native.StalenessStats()
        c = self._client._enter()
        try:
            rc = _native.lib().ps_var_staleness(c, self._h, byref(out))
        finally:
            self._client._leave()
        if rc != 0:
            _raise(rc)
        return StalenessStats._from_c(out)

    # -- helpers --

    def _what(self, op: str, role: str) -> str:
        return f"{op} of {self.name!r}: {role}"

    def _whole(self, n: int, shape: Tuple[int, ...], op: str, role: str) -> None:
        """Refuses a buffer that is not the whole variable (size, and shape when it has 2+
        dimensions)."""
        if n != self.size:
            raise ValueError(f"{op} of {self.name!r}: the {role} has {n} float32 elements "
                             f"(shape {tuple(shape)}), the variable {self.size} (shape "
                             f"{self.shape}); pass offset=/count= to address a part of it")
        if len(shape) > 1 and tuple(shape) != self.shape:
            raise ValueError(f"{op} of {self.name!r}: the {role}'s shape is {tuple(shape)}, the "
                             f"variable's {self.shape} ({n} elements each); reshape it on "
                             f"purpose (or pass a flat view) if that layout is meant")

    @staticmethod
    def _range(op: str, name: str, offset: Optional[int],
               count: Optional[int]) -> Optional[int]:
        """The offset of an explicit range, or None when the call is about the whole
        variable."""
        if offset is None and count is None:
            return None
        offset = 0 if offset is None else int(offset)
        if offset < 0:
            raise ValueError(f"{op} of {name!r}: offset {offset} is negative")
        if count is not None and int(count) < 0:
            raise ValueError(f"{op} of {name!r}: count {count} is negative")
        return offset

    def _dest(self, out: Any, offset: Optional[int], count: Optional[int],
              op: str) -> Tuple[Any, int, int, int, Any]:
        """(out, offset, count, address, keep) of a pull's destination."""
        start = self._range(op, self.name, offset, count)
        if out is None:
            try:
                import numpy as np
            except ImportError:
                raise TypeError(f"{op} of {self.name!r}: pass out= (NumPy, which would "
                                f"allocate the result, is not installed)") from None
            if start is None:
                out = np.empty(self.shape, dtype=np.float32)
            else:
                n = max(self.size - start, 0) if count is None else int(count)
                out = np.empty((n,), dtype=np.float32)
        addr, n, keep, shape = resolve(out, writable=True, what=self._what(op, "destination"))
        if start is None:
            self._whole(n, shape, op, "destination")
            return out, 0, n, addr, keep
        if count is not None and n != count:
            raise ValueError(f"{op} of {self.name!r}: the destination has {n} float32 "
                             f"elements, count is {count}")
        return out, start, n, addr, keep

    def _src(self, grad: Any, offset: Optional[int], count: Optional[int],
             op: str) -> Tuple[int, int, int, Any]:
        """(offset, count, address, keep) of a push's gradient."""
        start = self._range(op, self.name, offset, count)
        addr, n, keep, shape = resolve(grad, writable=False, what=self._what(op, "gradient"))
        if start is None:
            self._whole(n, shape, op, "gradient")
            return 0, n, addr, keep
        if count is not None and n != count:
            raise ValueError(f"{op} of {self.name!r}: the gradient has {n} float32 elements, "
                             f"count is {count}")
        return start, n, addr, keep

    def _pair(self, grad: Any, out: Any, offset: Optional[int], count: Optional[int],
              op: str) -> Tuple[int, int, int, Any, Any, int, Any]:
        """(offset, count, grad address, grad keep, out, out address, out keep) of a
        push_pull: the destination covers what the gradient covers."""
        start, n, gaddr, gkeep = self._src(grad, offset, count, op)
        if offset is None and count is None:
            out, _, _, addr, keep = self._dest(out, None, None, op)
        else:
            out, _, _, addr, keep = self._dest(out, start, n, op)
        return start, n, gaddr, gkeep, out, addr, keep

    # -- blocking --

    def pull(self, out: Any = None, *, offset: Optional[int] = None,
             count: Optional[int] = None) -> Any:
        """Copies the variable (or elements [offset, offset + count)) into `out` and returns
        it. Without `out`, a new NumPy array of the variable's shape (or of `count`, default
        the rest of the variable from `offset`) is allocated. Blocks."""
        out, start, n, addr, keep = self._dest(out, offset, count, "pull")
        c = self._client._enter()
        try:
            rc = _native.lib().ps_pull_range(c, self._h, start, n, addr)
        finally:
            self._client._leave()
        if rc != 0:
            _raise(rc)
        del keep
        return out

    def push(self, grad: Any, *, offset: Optional[int] = None,
             count: Optional[int] = None) -> None:
        """Sends a gradient for the whole variable (or for elements [offset, offset +
        count)); the servers apply the optimizer, exactly once. Blocks."""
        start, n, addr, keep = self._src(grad, offset, count, "push")
        c = self._client._enter()
        try:
            rc = _native.lib().ps_push_range(c, self._h, start, n, addr)
        finally:
            self._client._leave()
        if rc != 0:
            _raise(rc)
        del keep

    def assign(self, values: Any, *, offset: Optional[int] = None,
               count: Optional[int] = None) -> None:
        """Writes `values` into the variable (or into elements [offset, offset + count)) as
        they are: no optimizer step, no BSP aggregate; the optimizer's state is kept. Exactly
        once like a push, sent in float32. How a program makes its own initial values the
        servers' (the chief assigns them once; see psd.torch). Blocks."""
        start, n, addr, keep = self._src(values, offset, count, "assign")
        c = self._client._enter()
        try:
            rc = _native.lib().ps_assign_range(c, self._h, start, n, addr)
        finally:
            self._client._leave()
        if rc != 0:
            _raise(rc)
        del keep

    def push_pull(self, grad: Any, out: Any = None, *, offset: Optional[int] = None,
                  count: Optional[int] = None) -> Any:
        """Pushes `grad` and returns in `out` (allocated if None) the parameters just after
        that update. `grad` and `out` cover the same elements. Blocks."""
        start, n, gaddr, gkeep, out, addr, keep = self._pair(grad, out, offset, count,
                                                             "push_pull")
        c = self._client._enter()
        try:
            rc = _native.lib().ps_push_pull_range(c, self._h, start, n, gaddr, addr)
        finally:
            self._client._leave()
        if rc != 0:
            _raise(rc)
        del keep, gkeep
        return out

    # -- asynchronous --

    def _start(self, fn_name: str, args: Tuple[Any, ...], result: Any,
               keep: Tuple[Any, ...]) -> "Future[Any]":
        return _start_future(self._client, fn_name, True, (self._h,) + args, result, keep)

    def pull_async(self, out: Any = None, *, offset: Optional[int] = None,
                   count: Optional[int] = None) -> "Future[Any]":
        """Starts a pull into `out` (allocated if None) and returns a Future whose result is
        `out`. Do not touch `out` until the Future is done; the Future keeps it alive. A
        failure of the transfer is the Future's exception (a PsError)."""
        out, start, n, addr, keep = self._dest(out, offset, count, "pull_async")
        return self._start("ps_pull_async", (start, n, addr), out, (keep,))

    def push_async(self, grad: Any, *, offset: Optional[int] = None,
                   count: Optional[int] = None) -> "Future[None]":
        """Starts a push of `grad` and returns a Future (result None). `grad` must not be
        modified until the Future is done; the Future keeps it alive."""
        start, n, addr, keep = self._src(grad, offset, count, "push_async")
        return self._start("ps_push_async", (start, n, addr), None, (keep,))

    def assign_async(self, values: Any, *, offset: Optional[int] = None,
                     count: Optional[int] = None) -> "Future[None]":
        """Starts an assign (see assign) and returns a Future (result None); `values` must not
        be modified until it is done."""
        start, n, addr, keep = self._src(values, offset, count, "assign_async")
        return self._start("ps_assign_async", (start, n, addr), None, (keep,))

    def push_pull_async(self, grad: Any, out: Any = None, *, offset: Optional[int] = None,
                        count: Optional[int] = None) -> "Future[Any]":
        """Starts a push of `grad` returning the updated parameters in `out` (allocated if
        None); the Future's result is `out`."""
        start, n, gaddr, gkeep, out, addr, keep = self._pair(grad, out, offset, count,
                                                             "push_pull_async")
        return self._start("ps_push_pull_async", (start, n, gaddr, addr), out, (keep, gkeep))


# ---- client --------------------------------------------------------------------------------


class Table:
    """A sparse embedding table on the servers: int64 ids -> rows of `dim` float32, spread by
    id over every server (Client.create_table, Client.table). Rows are made by the first push
    of their id; a pull of an unseen id returns the initializer's row.

    ids: a NumPy int64 array of one dimension, C-contiguous (any int64 value is an id).
    Rows and gradients: float32 memory of ids.size x dim elements, C-contiguous (a NumPy
    array of shape (n, dim) or flat), used in place, never copied."""

    __slots__ = ("_client", "_h", "name", "dim", "__weakref__")

    def __init__(self, client: "Client", handle: int, name: str) -> None:
        self._client = client
        self._h = handle
        self.name: str = name
        self.dim: int = _native.lib().ps_table_dim(handle)

    def __repr__(self) -> str:
        return f"<psd.Table {self.name!r} dim={self.dim}>"

    def __del__(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            _native.lib().ps_table_free(h)

    @property
    def max_ids(self) -> int:
        """Ids one request carries at most (a call with more is split)."""
        return int(_native.lib().ps_table_max_ids(self._h))

    def _ids(self, ids: Any, op: str) -> Tuple[int, int, Any]:
        import numpy as np
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
            raise TypeError(f"{op} of table {self.name!r}: ids must be a 1-D NumPy int64 "
                            f"array, not {type(ids).__name__}"
                            f"{' of ' + str(ids.dtype) if isinstance(ids, np.ndarray) else ''}")
        if not ids.flags.c_contiguous:
            raise ValueError(f"{op} of table {self.name!r}: ids must be C-contiguous")
        return ids.ctypes.data if ids.size else _EMPTY_ADDR, ids.size, ids

    def _rows(self, n: int, got: int, op: str, role: str) -> None:
        if got != n * self.dim:
            raise ValueError(f"{op} of table {self.name!r}: {role} has {got} float32 elements, "
                             f"{n} ids x dim {self.dim} need {n * self.dim}")

    def pull(self, ids: Any, out: Any = None) -> Any:
        """The rows of `ids` in their order (duplicates repeated), into `out` (float32, n x
        dim elements) or a new NumPy array of shape (n, dim). Blocks."""
        addr, n, keep_ids = self._ids(ids, "pull")
        if out is None:
            import numpy as np
            out = np.empty((n, self.dim), dtype=np.float32)
        oaddr, got, keep, _ = resolve(out, writable=True, what=f"pull of table {self.name!r}")
        self._rows(n, got, "pull", "out")
        c = self._client._enter()
        try:
            rc = _native.lib().ps_table_pull(self._h, addr, n, oaddr)
        finally:
            self._client._leave()
        if rc != 0:
            _raise(rc)
        del keep, keep_ids
        return out

    def pull_async(self, ids: Any, out: Any = None) -> "Future[Any]":
        """Starts a pull of the rows of `ids` (as pull) into `out` (allocated if None) and
        returns a Future whose result is `out`. `ids` and `out` must not be touched until it
        is done; the Future keeps them alive."""
        addr, n, keep_ids = self._ids(ids, "pull_async")
        if out is None:
            import numpy as np
            out = np.empty((n, self.dim), dtype=np.float32)
        oaddr, got, keep, _ = resolve(out, writable=True,
                                      what=f"pull_async of table {self.name!r}")
        self._rows(n, got, "pull_async", "out")
        return _start_future(self._client, "ps_table_pull_async", False,
                             (self._h, addr, n, oaddr), out, (keep, keep_ids, self))

    def push_async(self, ids: Any, grads: Any) -> "Future[None]":
        """Starts a push (as push) and returns a Future (result None); `ids` and `grads` must
        not be modified until it is done (a resent request is built from them again)."""
        addr, n, keep_ids = self._ids(ids, "push_async")
        gaddr, got, keep, _ = resolve(grads, writable=False,
                                      what=f"push_async of table {self.name!r}")
        self._rows(n, got, "push_async", "grads")
        return _start_future(self._client, "ps_table_push_async", False,
                             (self._h, addr, n, gaddr), None, (keep, keep_ids, self))

    def prefetch(self, ids: Any) -> int:
        """Asks the servers to bring the rows of `ids` that a table with a cold tier
        (ram_rows) keeps on disk back to RAM, so that a pull or push of them soon after (the
        next step's, named while this one computes) finds them there; returns how many rows
        came from disk. A hint: no row is read out or made, no parameter changes; a table all
        in RAM does nothing (returns 0). Blocks; prefetch_async does not."""
        addr, n, keep_ids = self._ids(ids, "prefetch")
        cold = c_uint64(0)
        c = self._client._enter()
        try:
            rc = _native.lib().ps_table_prefetch(self._h, addr, n, byref(cold))
        finally:
            self._client._leave()
        if rc != 0:
            _raise(rc)
        del keep_ids
        return int(cold.value)

    def prefetch_async(self, ids: Any) -> "Future[None]":
        """Starts a prefetch (as prefetch) and returns a Future (result None); `ids` must not
        be modified until it is done."""
        addr, n, keep_ids = self._ids(ids, "prefetch_async")
        return _start_future(self._client, "ps_table_prefetch_async", False,
                             (self._h, addr, n), None, (keep_ids, self))

    def push(self, ids: Any, grads: Any) -> None:
        """Pushes grads (float32, n x dim elements: row i is the gradient of ids[i]); the
        servers sum duplicate ids and apply the table's optimizer per row, exactly once.
        A NaN or Inf gradient raises InvalidArgumentError (that request applied nothing).
        Blocks."""
        addr, n, keep_ids = self._ids(ids, "push")
        gaddr, got, keep, _ = resolve(grads, writable=False,
                                      what=f"push of table {self.name!r}")
        self._rows(n, got, "push", "grads")
        c = self._client._enter()
        try:
            rc = _native.lib().ps_table_push(self._h, addr, n, gaddr)
        finally:
            self._client._leave()
        if rc != 0:
            _raise(rc)
        del keep, keep_ids


def _setting_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (dict, list)):
        return json.dumps(v)
    return str(v)


class Client:
    """A connection to a cluster of ps-server processes.

    Args:
        cluster: the cluster spec: a dict or JSON text, either a bare cluster
            (``{"ps": ["host:port", ...], "worker": [...]}``) or the TF_CONFIG form
            (``{"cluster": {...}, "task": {"type": "worker", "index": 0}}``), or ``"@path"``
            of a JSON file. None: from the environment (``TF_CONFIG`` or ``PS_CLUSTER``).
        use_env: read the client settings from the environment first (PS_* variables and
            TF_CONFIG), as every program of the project does.
        **settings: client settings by name, with ``_`` for ``-`` (``deadline_ms=5000``,
            ``connections=4``, ``chunk_bytes="1M"``, ``task="worker:0"``); they take
            precedence over the environment. An unknown name or a bad value raises
            InvalidArgumentError naming it.

    Connections are made in the background: the constructor does not wait for the servers
    (the first call does, within its deadline). Use it as a context manager, or call close().
    All methods are thread-safe.
    """

    def __init__(self, cluster: Optional[ClusterSpec] = None, *, use_env: bool = True,
                 **settings: Any) -> None:
        self._handle: Optional[int] = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._active = 0
        self._closing = False
        self._vars: Dict[int, Variable] = {}
        L = _native.lib()
        cfg = c_void_p()
        rc = L.ps_config_create(byref(cfg))
        if rc != 0:
            _raise(rc)
        try:
            if use_env:
                rc = L.ps_config_load_env(cfg)
                if rc != 0:
                    _raise(rc)
            items: List[Tuple[str, str]] = []
            if cluster is not None:
                items.append(("cluster", cluster if isinstance(cluster, str)
                              else json.dumps(cluster)))
            items += [(k.replace("_", "-"), _setting_value(v)) for k, v in settings.items()]
            for name, value in items:
                rc = L.ps_config_set(cfg, name.encode(), value.encode())
                if rc != 0:
                    _raise(rc)
            h = c_void_p()
            rc = L.ps_client_open(byref(h), cfg)
            if rc != 0:
                _raise(rc)
            self._handle = h.value
        finally:
            L.ps_config_destroy(cfg)

    # -- lifetime --

    def _enter(self) -> int:
        with self._lock:
            if self._handle is None or self._closing:
                raise ValueError("the psd.Client is closed")
            self._active += 1
            return self._handle

    def _leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0 and self._closing:
                self._idle.notify_all()

    def close(self) -> None:
        """Closes every connection. Waits for calls in progress on other threads to return;
        asynchronous operations still in flight fail with CancelledError. Variables of this
        client cannot be used afterwards. Idempotent."""
        with self._lock:
            if self._handle is None or self._closing:
                return
            self._closing = True
            while self._active:
                self._idle.wait()
            h = self._handle
        _native.lib().ps_client_close(h)
        with self._lock:
            self._handle = None
            self._vars.clear()
        _reap()

    @property
    def closed(self) -> bool:
        return self._handle is None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        if self._handle is None:
            return "<psd.Client closed>"
        return f"<psd.Client servers={self.num_servers}>"

    # -- cluster --

    @property
    def num_servers(self) -> int:
        """Number of ps tasks in the cluster spec."""
        c = self._enter()
        try:
            return _native.lib().ps_client_num_servers(c)
        finally:
            self._leave()

    def clock(self) -> int:
        """Advances this client's clock by one, reports it to every server and returns it.
        Call it after the pushes of the clock have completed. Blocks."""
        out = c_int64()
        c = self._enter()
        try:
            rc = _native.lib().ps_clock(c, byref(out))
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)
        return out.value

    def step(self, items: Sequence[Tuple[Any, ...]], *, clock: bool = True,
             tables: Sequence[Tuple[Any, ...]] = ()) -> List[Any]:
        """One training step in one request per server (ps_step_ex): pushes every gradient,
        then, with `clock`, advances this client's clock on every server, then pulls every
        variable's parameters and table rows at the new clock (waiting for each staleness
        bound). `items` are (variable, grad) or (variable, grad, out) tuples for whole
        variables: each grad and out is checked as by Variable.push and Variable.pull without
        a range (the variable's number of elements; its shape for a buffer of two or more
        dimensions), else ValueError before anything is sent. grad None: no push; out None (or
        absent): a new array of the variable's shape, False: no pull. `tables` are (table,
        ids, grads) or (table, ids, grads, out) tuples, checked as by Table.push and
        Table.pull: grads None: no push; out None (or absent): a new (n, dim) array, False: no
        pull. Returns the pulled arrays in item order, then one per table item (None where
        nothing was pulled). Blocks."""
        citems: List[Tuple[Any, ...]] = []
        ctables: List[Tuple[Any, ...]] = []
        outs: List[Any] = []
        keep: List[Any] = []
        for i, item in enumerate(items):
            if not 2 <= len(item) <= 3:
                raise ValueError(f"step item {i}: expected (variable, grad[, out])")
            var, grad = item[0], item[1]
            out = item[2] if len(item) == 3 else None
            if not isinstance(var, Variable):
                raise TypeError(f"step item {i}: {var!r} is not a psd.Variable")
            gaddr = addr = None
            if grad is not None:
                _, _, gaddr, gkeep = var._src(grad, None, None, "step")
                keep.append(gkeep)
            if out is False:
                outs.append(None)
            else:
                out, _, _, addr, okeep = var._dest(out, None, None, "step")
                keep.append(okeep)
                outs.append(out)
            citems.append((var._h, 0, var.size, gaddr, addr))
        for i, item in enumerate(tables):
            if not 3 <= len(item) <= 4:
                raise ValueError(f"step table item {i}: expected (table, ids, grads[, out])")
            tab, ids, grads = item[0], item[1], item[2]
            out = item[3] if len(item) == 4 else None
            if not isinstance(tab, Table):
                raise TypeError(f"step table item {i}: {tab!r} is not a psd.Table")
            if grads is None and out is False:
                raise ValueError(f"step table item {i}: neither grads nor out")
            iaddr, n, keep_ids = tab._ids(ids, "step")
            keep.append(keep_ids)
            gaddr = oaddr = None
            if grads is not None:
                gaddr, got, gkeep, _ = resolve(grads, writable=False,
                                               what=f"step push of table {tab.name!r}")
                tab._rows(n, got, "step push", "grads")
                keep.append(gkeep)
            if out is False:
                outs.append(None)
            else:
                if out is None:
                    import numpy as np
                    out = np.empty((n, tab.dim), dtype=np.float32)
                oaddr, got, okeep, _ = resolve(out, writable=True,
                                               what=f"step pull of table {tab.name!r}")
                tab._rows(n, got, "step pull", "out")
                keep.append(okeep)
                outs.append(out)
            ctables.append((tab._h, iaddr, n, gaddr, oaddr))
        self._step_raw(citems, ctables, _native.PS_STEP_CLOCK if clock else 0)
        del keep
        return outs

    def _step_raw(self, items: Sequence[Tuple[Any, ...]], tables: Sequence[Tuple[Any, ...]],
                  flags: int) -> None:
        """ps_step_ex of items (var, offset, count, grad, dst) and table items (table, ids, n,
        grads, rows) given as handles and addresses (psd/_calls.py), in one call into C.
        Blocks; raises the step's PsError."""
        c = self._enter()
        try:
            rc = _calls.impl().step(c, items, tables, flags)
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)

    @property
    def current_clock(self) -> int:
        """This client's current clock (no network)."""
        c = self._enter()
        try:
            return _native.lib().ps_client_clock(c)
        finally:
            self._leave()

    def server_status(self, server: int = 0) -> ServerStatus:
        """Counters of server `server` (0 .. num_servers - 1). Blocks."""
        out = _native.ServerStats()
        c = self._enter()
        try:
            rc = _native.lib().ps_server_status(c, server, byref(out))
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)
        return ServerStatus._from_c(out)

    def workers_live(self, n: int) -> List[bool]:
        """Which of workers 0 .. n-1 the servers count as live. Blocks."""
        buf = (c_ubyte * max(n, 1))()
        c = self._enter()
        try:
            rc = _native.lib().ps_cluster_workers_live(c, n, buf)
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)
        return [bool(buf[i]) for i in range(n)]

    def checkpoint(self) -> None:
        """Asks every server to checkpoint now; returns once all are durable. Raises
        FailedPreconditionError when checkpoints are off. Blocks."""
        self._simple("ps_checkpoint")

    def shutdown_cluster(self) -> None:
        """Asks every server to shut down cleanly. Blocks until each has acknowledged."""
        self._simple("ps_shutdown_cluster")

    def _simple(self, fn: str) -> None:
        c = self._enter()
        try:
            rc = getattr(_native.lib(), fn)(c)
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)

    # -- variables --

    def _wrap(self, handle: int) -> Variable:
        with self._lock:
            v = self._vars.get(handle)
            if v is None:
                v = self._vars[handle] = Variable(self, handle)
            return v

    def create_variable(self, name: str, shape: Sequence[int] = (), *,
                        dtype: Any = "float32",
                        initializer: str = "zeros",
                        init_a: float = 0.0,
                        init_b: float = 0.0,
                        seed: int = 0,
                        optimizer: Union[str, int] = "sgd",
                        learning_rate: Optional[float] = None,
                        momentum: Optional[float] = None,
                        nesterov: Optional[bool] = None,
                        beta1: Optional[float] = None,
                        beta2: Optional[float] = None,
                        epsilon: Optional[float] = None,
                        initial_accumulator: Optional[float] = None,
                        weight_decay: Optional[float] = None,
                        staleness: int = STALENESS_DEFAULT) -> Variable:
        """Creates a variable on its server(s), or finds it if one with the same name and spec
        exists (idempotent: every worker may call it). Another spec under the same name raises
        AlreadyExistsError naming the differing field.

        Args:
            shape: up to 8 dimensions (() is a scalar).
            dtype: only float32.
            initializer: "zeros", "constant" (value init_a), "uniform" ([init_a, init_b)),
                "normal" (mean init_a, stddev init_b) or "glorot_uniform"; seeded by `seed`.
            optimizer: a name ("sgd", "momentum", "adagrad", "adam", "adamw"; see
                ps_optimizer_parse) or its number.
            learning_rate, momentum, nesterov, beta1, beta2, epsilon, initial_accumulator,
                weight_decay: hyper-parameters; None keeps the library's default.
            staleness: the bound: STALENESS_ASYNC (-1), STALENESS_BSP (0), s > 0, or
                STALENESS_DEFAULT (the servers' default-staleness).
        Blocks.
        """
        dname = getattr(dtype, "name", dtype)
        if dname not in ("float32", "f4", "<f4", "f"):
            raise TypeError(f"variable {name!r}: dtype {dtype!r} is not supported; only "
                            f"float32")
        shape = tuple(int(d) for d in shape)
        if len(shape) > _native.PS_MAX_DIMS:
            raise ValueError(f"variable {name!r}: {len(shape)} dimensions, at most "
                             f"{_native.PS_MAX_DIMS}")
        if any(d < 0 for d in shape):
            raise ValueError(f"variable {name!r}: negative dimension in shape {shape}")
        init = _native.INITIALIZERS.get(initializer.lower() if isinstance(initializer, str)
                                        else initializer)
        if init is None:
            raise ValueError(f"variable {name!r}: unknown initializer {initializer!r}; one of "
                             f"{', '.join(_native.INITIALIZERS)}")
        opt = optimizer_parse(optimizer) if isinstance(optimizer, str) else int(optimizer)
        L = _native.lib()
        spec = _native.VarSpec()
        bname = name.encode()
        L.ps_var_spec_init_sized(byref(spec), ctypes.sizeof(spec), bname)
        spec.ndims = len(shape)
        for i, d in enumerate(shape):
            spec.dims[i] = d
        spec.initializer = init
        spec.init_a = init_a
        spec.init_b = init_b
        spec.seed = seed
        spec.optimizer = opt
        for field, value in (("learning_rate", learning_rate), ("momentum", momentum),
                             ("nesterov", nesterov), ("beta1", beta1), ("beta2", beta2),
                             ("epsilon", epsilon), ("initial_accumulator", initial_accumulator),
                             ("weight_decay", weight_decay)):
            if value is not None:
                setattr(spec, field, value)
        spec.staleness = staleness
        out = c_void_p()
        c = self._enter()
        try:
            rc = L.ps_var_create(c, byref(spec), byref(out))
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)
        return self._wrap(out.value)

    def variable(self, name: str) -> Variable:
        """Finds an existing variable by name; NotFoundError if no server has it. Blocks."""
        out = c_void_p()
        c = self._enter()
        try:
            rc = _native.lib().ps_var_lookup(c, name.encode(), byref(out))
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)
        return self._wrap(out.value)

    # -- sparse tables --

    def create_table(self, name: str, dim: int, *,
                     optimizer: Union[str, int] = "sgd",
                     initializer: str = "zeros",
                     init_a: float = 0.0,
                     init_b: float = 0.0,
                     seed: int = 0,
                     min_count: int = 0,
                     ttl_ms: int = 0,
                     max_rows: int = 0,
                     staleness: int = -2,
                     dtype: str = "float32",
                     ram_rows: int = 0,
                     **hparams: float) -> Table:
        """Creates a sparse table on every server (idempotent for the same spec; another
        spec raises AlreadyExistsError).

        Args:
            dim: floats per row, 1..65536.
            optimizer: "sgd", "momentum", "adagrad", "adam", "adamw", "ftrl",
                "rowwise_adagrad" (one accumulator per row) (or a number). Adam's step count
                is one per row.
            initializer: "zeros", "constant", "uniform" or "normal" (init_a, init_b, seed):
                a row is a pure function of (seed, name, id).
            min_count: pushes of an id before its row is made; ttl_ms: rows not updated for
                that long are removed; max_rows: rows per server at most (LRU eviction).
            staleness: -2 the servers' default-staleness, -1 asynchronous, 0 BSP (a clock's
                pushes applied as one update once every live worker passed it), s >= 1 SSP (a
                worker's pull at clock c waits until every live worker reached c - s).
            dtype: how the servers store the rows' parameters: "float32", or "bfloat16" /
                "float16" (half the memory, each update rounded; the optimizer's state stays
                float32; not with "adamw"). Rows are still pulled and pushed as float32.
            ram_rows: rows each server keeps in RAM, the others on disk under the servers'
                cold-dir, read back when pulled or pushed (a table larger than memory); 0:
                every row in RAM.
            hparams: learning_rate, momentum, nesterov, beta1, beta2, epsilon,
                initial_accumulator, weight_decay, ftrl_beta, l1, l2.
        Blocks.
        """
        if isinstance(optimizer, str):
            opt = _native.TABLE_OPTIMIZERS.get(optimizer.lower())
            if opt is None:
                opt = optimizer_parse(optimizer)
        else:
            opt = int(optimizer)
        row_dtype = _native.TABLE_DTYPES.get(str(dtype).lower())
        if row_dtype is None:
            raise ValueError(f"table {name!r}: unknown dtype {dtype!r} (float32, bfloat16 or "
                             f"float16)")
        init = _native.INITIALIZERS.get(initializer.lower())
        if init is None:
            raise ValueError(f"table {name!r}: unknown initializer {initializer!r}")
        L = _native.lib()
        spec = _native.TableSpec()
        bname = name.encode()
        L.ps_table_spec_init(byref(spec), bname, int(dim), opt)
        spec.initializer = init
        spec.init_a = init_a
        spec.init_b = init_b
        spec.seed = seed
        spec.min_count = min_count
        spec.ttl_ms = ttl_ms
        spec.max_rows = max_rows
        spec.staleness = staleness
        spec.dtype = row_dtype
        spec.ram_rows = ram_rows
        known = {f for f, _ in _native.TableSpec._fields_}
        for field, value in hparams.items():
            if field not in known or field in ("name", "dim", "optimizer", "initializer",
                                               "dtype"):
                raise TypeError(f"table {name!r}: unknown setting {field!r}")
            setattr(spec, field, value)
        out = c_void_p()
        c = self._enter()
        try:
            rc = L.ps_table_create(c, byref(spec), byref(out))
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)
        return Table(self, out.value, name)

    def delete_table(self, name: str) -> None:
        """Deletes a table from every server (admin: a loopback peer or the admin token); its
        rows go and the name may be created again. Table handles still held get NotFoundError.
        NotFoundError if no server has it. Blocks."""
        c = self._enter()
        try:
            rc = _native.lib().ps_table_delete(c, name.encode())
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)

    def table(self, name: str) -> Table:
        """Finds an existing table by name; NotFoundError if there is none. Blocks."""
        out = c_void_p()
        c = self._enter()
        try:
            rc = _native.lib().ps_table_lookup(c, name.encode(), byref(out))
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)
        return Table(self, out.value, name)

    def list_variables(self) -> List[str]:
        """The names of all variables in the cluster. Blocks."""
        names = ctypes.POINTER(c_char_p)()
        count = c_size_t()
        L = _native.lib()
        c = self._enter()
        try:
            rc = L.ps_var_list(c, byref(names), byref(count))
        finally:
            self._leave()
        if rc != 0:
            _raise(rc)
        try:
            return [_text(names[i]) for i in range(count.value)]
        finally:
            L.ps_names_free(names, count)


__all__ = ["Client", "Variable", "Table", "ServerStatus", "StalenessStats", "version", "optimizer_parse",
           "optimizer_name", "STALENESS_ASYNC", "STALENESS_BSP", "STALENESS_DEFAULT",
           "PsError", "InvalidArgumentError"]
