"""Loading libpsclient and declaring its C API for ctypes (ABI mode: no compiler needed).

The library is searched, in this order:

1. the path in the environment variable ``PSD_LIBRARY`` (an error if it does not load: a path
   set on purpose is never silently replaced by another library);
2. a copy bundled into the package (``psd/libpsclient.so*``, put there when the package is
   built from the source tree; see client/python/README.md);
3. ``pkg-config --variable=libdir psclient`` (an installed ``meson install``);
4. the system loader (``ctypes.util.find_library("psclient")``).

Every function is declared with its argument and result types. Pointers to tensor data are
passed as plain addresses (``c_void_p``), so no ctypes array object is built per call.
CDLL releases the GIL around every call, so blocking calls let other Python threads run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import shutil
import subprocess
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_double, c_int, c_int64,
                    c_size_t, c_ubyte, c_uint, c_uint32, c_uint64, c_void_p)
from typing import List, Optional, Tuple

PS_MAX_DIMS = 8
PS_MAX_NAME = 255
PS_STALENESS_BUCKETS = 13
PS_STALENESS_ASYNC = -1
PS_STALENESS_BSP = 0
PS_STALENESS_DEFAULT = -2
PS_FLOAT32 = 1

INITIALIZERS = {
    "zeros": 0,
    "constant": 1,
    "uniform": 2,
    "normal": 3,
    "glorot_uniform": 4,
}


class VarSpec(Structure):
    """ps_var_spec, as laid out in client/psclient.h (fields are only ever appended there;
    the library reads only the fields that fit in struct_size, which we set to our size)."""

    _fields_ = [
        ("struct_size", c_size_t),
        ("name", c_char_p),
        ("dtype", c_int),
        ("ndims", c_int),
        ("dims", c_uint64 * PS_MAX_DIMS),
        ("initializer", c_int),
        ("init_a", c_double),
        ("init_b", c_double),
        ("seed", c_uint64),
        ("optimizer", c_int),
        ("learning_rate", c_double),
        ("momentum", c_double),
        ("nesterov", c_bool),
        ("beta1", c_double),
        ("beta2", c_double),
        ("epsilon", c_double),
        ("initial_accumulator", c_double),
        ("staleness", c_int),
        # ---- appended fields ----
        ("weight_decay", c_double),
    ]


class TableSpec(Structure):
    """ps_table_spec, as laid out in client/psclient.h."""

    _fields_ = [
        ("name", c_char_p),
        ("dim", c_uint32),
        ("initializer", c_int),
        ("init_a", c_double),
        ("init_b", c_double),
        ("seed", c_uint64),
        ("optimizer", c_int),
        ("learning_rate", c_double),
        ("momentum", c_double),
        ("nesterov", c_bool),
        ("beta1", c_double),
        ("beta2", c_double),
        ("epsilon", c_double),
        ("initial_accumulator", c_double),
        ("weight_decay", c_double),
        ("ftrl_beta", c_double),
        ("l1", c_double),
        ("l2", c_double),
        ("min_count", c_uint32),
        ("ttl_ms", c_int64),
        ("max_rows", c_uint64),
        ("staleness", c_int),
        ("dtype", c_int),
        ("ram_rows", c_uint64),
    ]


PS_OPT_FTRL = 5
PS_OPT_ROWWISE_ADAGRAD = 6
# The tables' own optimizers (ps_optimizer_parse knows the variables').
TABLE_OPTIMIZERS = {"ftrl": PS_OPT_FTRL, "rowwise_adagrad": PS_OPT_ROWWISE_ADAGRAD}
# ps_table_spec.dtype: how the servers store a table's rows.
TABLE_DTYPES = {"float32": 1, "bfloat16": 2, "float16": 3}


class StepItem(Structure):
    """ps_step_item."""
    _fields_ = [("var", c_void_p), ("offset", c_uint64), ("count", c_uint64),
                ("grad", c_void_p), ("dst", c_void_p)]


PS_STEP_CLOCK = 1


class TableItem(Structure):
    """ps_table_item (struct_size: its size, set by the caller)."""
    _fields_ = [("struct_size", c_size_t), ("table", c_void_p), ("ids", c_void_p),
                ("n", c_size_t), ("grads", c_void_p), ("rows", c_void_p)]


class StalenessStats(Structure):
    _fields_ = [
        ("max", c_int64),
        ("pulls", c_uint64),
        ("waits", c_uint64),
        ("wait_ms", c_uint64),
        ("timeouts", c_uint64),
        ("histogram", c_uint64 * PS_STALENESS_BUCKETS),
    ]


class ServerStats(Structure):
    _fields_ = [
        ("task_index", c_uint32),
        ("uptime_ms", c_uint64),
        ("requests", c_uint64),
        ("errors", c_uint64),
        ("updates_applied", c_uint64),
        ("duplicates_dropped", c_uint64),
        ("bytes_in", c_uint64),
        ("bytes_out", c_uint64),
        ("bytes_held", c_uint64),
        ("num_variables", c_uint32),
        ("min_clock", c_int64),
        ("live_workers", c_uint32),
        ("evictions", c_uint64),
        ("staleness", StalenessStats),
    ]


# void (*ps_done_fn)(ps_op *op, void *arg)
DONE_FN = CFUNCTYPE(None, c_void_p, c_void_p)

_P = c_void_p  # opaque handles and tensor addresses

_PROTOTYPES = {
    "ps_strerror": (c_char_p, [c_int]),
    "ps_last_error": (c_char_p, []),
    "ps_version": (c_char_p, []),
    "ps_config_create": (c_int, [POINTER(c_void_p)]),
    "ps_config_destroy": (None, [_P]),
    "ps_config_set": (c_int, [_P, c_char_p, c_char_p]),
    "ps_config_load_env": (c_int, [_P]),
    "ps_client_open": (c_int, [POINTER(c_void_p), _P]),
    "ps_client_close": (None, [_P]),
    "ps_client_num_servers": (c_int, [_P]),
    "ps_optimizer_name": (c_char_p, [c_int]),
    "ps_optimizer_parse": (c_int, [c_char_p, POINTER(c_int)]),
    "ps_var_spec_init_sized": (None, [POINTER(VarSpec), c_size_t, c_char_p]),
    "ps_var_create": (c_int, [_P, POINTER(VarSpec), POINTER(c_void_p)]),
    "ps_var_lookup": (c_int, [_P, c_char_p, POINTER(c_void_p)]),
    "ps_var_list": (c_int, [_P, POINTER(POINTER(c_char_p)), POINTER(c_size_t)]),
    "ps_names_free": (None, [POINTER(c_char_p), c_size_t]),
    "ps_var_name": (c_char_p, [_P]),
    "ps_var_numel": (c_uint64, [_P]),
    "ps_var_ndims": (c_int, [_P]),
    "ps_var_dim": (c_uint64, [_P, c_int]),
    "ps_var_num_shards": (c_int, [_P]),
    "ps_var_staleness_bound": (c_int, [_P]),
    "ps_var_staleness": (c_int, [_P, _P, POINTER(StalenessStats)]),
    "ps_pull": (c_int, [_P, _P, _P]),
    "ps_pull_range": (c_int, [_P, _P, c_uint64, c_uint64, _P]),
    "ps_push": (c_int, [_P, _P, _P]),
    "ps_push_range": (c_int, [_P, _P, c_uint64, c_uint64, _P]),
    "ps_push_pull": (c_int, [_P, _P, _P, _P]),
    "ps_push_pull_range": (c_int, [_P, _P, c_uint64, c_uint64, _P, _P]),
    "ps_pull_async": (c_int, [_P, _P, c_uint64, c_uint64, _P, DONE_FN, _P, POINTER(c_void_p)]),
    "ps_push_async": (c_int, [_P, _P, c_uint64, c_uint64, _P, DONE_FN, _P, POINTER(c_void_p)]),
    "ps_push_pull_async": (c_int, [_P, _P, c_uint64, c_uint64, _P, _P, DONE_FN, _P,
                                   POINTER(c_void_p)]),
    "ps_assign_range": (c_int, [_P, _P, c_uint64, c_uint64, _P]),
    "ps_assign_async": (c_int, [_P, _P, c_uint64, c_uint64, _P, DONE_FN, _P, POINTER(c_void_p)]),
    "ps_op_wait": (c_int, [_P]),
    "ps_op_done": (c_bool, [_P]),
    "ps_op_status": (c_int, [_P]),
    "ps_op_message": (c_char_p, [_P]),
    "ps_op_destroy": (None, [_P]),
    "ps_clock": (c_int, [_P, POINTER(c_int64)]),
    "ps_step": (c_int, [_P, POINTER(StepItem), c_size_t, c_uint]),
    "ps_step_ex": (c_int, [_P, POINTER(StepItem), c_size_t, POINTER(TableItem), c_size_t, c_uint]),
    "ps_step_ex_async": (c_int, [_P, POINTER(StepItem), c_size_t, POINTER(TableItem), c_size_t,
                                 c_uint, DONE_FN, _P, POINTER(c_void_p)]),
    "ps_client_clock": (c_int64, [_P]),
    "ps_server_status": (c_int, [_P, c_int, POINTER(ServerStats)]),
    "ps_cluster_workers_live": (c_int, [_P, c_int, POINTER(c_ubyte)]),
    "ps_checkpoint": (c_int, [_P]),
    "ps_shutdown_cluster": (c_int, [_P]),
    "ps_table_spec_init": (None, [POINTER(TableSpec), c_char_p, c_uint32, c_int]),
    "ps_table_create": (c_int, [_P, POINTER(TableSpec), POINTER(c_void_p)]),
    "ps_table_lookup": (c_int, [_P, c_char_p, POINTER(c_void_p)]),
    "ps_table_delete": (c_int, [_P, c_char_p]),
    "ps_table_free": (None, [_P]),
    "ps_table_dim": (c_uint32, [_P]),
    "ps_table_max_ids": (c_size_t, [_P]),
    "ps_table_pull": (c_int, [_P, _P, c_size_t, _P]),
    "ps_table_push": (c_int, [_P, _P, c_size_t, _P]),
    "ps_table_pull_async": (c_int, [_P, _P, c_size_t, _P, DONE_FN, _P, POINTER(c_void_p)]),
    "ps_table_push_async": (c_int, [_P, _P, c_size_t, _P, DONE_FN, _P, POINTER(c_void_p)]),
    "ps_table_prefetch": (c_int, [_P, _P, c_size_t, POINTER(c_uint64)]),
    "ps_table_prefetch_async": (c_int, [_P, _P, c_size_t, DONE_FN, _P, POINTER(c_void_p)]),
}


class LibraryNotFoundError(OSError):
    """libpsclient could not be found or loaded; the message lists every place tried."""


def _bundled_candidates() -> List[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    # libpsclient.so.0 (the soname) first, then the other names a copy may have
    found = sorted(glob.glob(os.path.join(here, "libpsclient.so*")), key=len)
    return found


def _pkg_config_candidates() -> Tuple[List[str], str]:
    exe = shutil.which("pkg-config")
    if exe is None:
        return [], "pkg-config: not installed"
    try:
        out = subprocess.run([exe, "--variable=libdir", "psclient"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return [], f"pkg-config: {e}"
    libdir = out.stdout.strip()
    if out.returncode != 0 or not libdir:
        return [], "pkg-config: no psclient.pc (" + (out.stderr.strip() or "no libdir") + ")"
    names = [os.path.join(libdir, n) for n in ("libpsclient.so.0", "libpsclient.so")]
    names = [n for n in names if os.path.exists(n)]
    if not names:
        return [], f"pkg-config: libdir {libdir} has no libpsclient.so"
    return names, ""


def find_library() -> Tuple[str, List[str]]:
    """Returns (path or name to load, notes on the places that did not have it).

    Raises LibraryNotFoundError when PSD_LIBRARY names a file that does not exist."""
    notes: List[str] = []
    env = os.environ.get("PSD_LIBRARY")
    if env:
        if not os.path.exists(env):
            raise LibraryNotFoundError(f"PSD_LIBRARY={env}: no such file")
        return env, notes
    notes.append("PSD_LIBRARY: not set")
    bundled = _bundled_candidates()
    if bundled:
        return bundled[0], notes
    notes.append(f"bundled copy: none in {os.path.dirname(os.path.abspath(__file__))}")
    pc, why = _pkg_config_candidates()
    if pc:
        return pc[0], notes
    notes.append(why)
    name = ctypes.util.find_library("psclient")
    if name:
        return name, notes
    notes.append("system loader: ctypes.util.find_library('psclient') found nothing")
    raise LibraryNotFoundError("libpsclient not found; tried " + "; ".join(notes) +
                               ". Set PSD_LIBRARY=/path/to/libpsclient.so")


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None
_lib_lock = threading.Lock()


def lib() -> ctypes.CDLL:
    """The loaded libpsclient, loading it on first use."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            path, _ = find_library()
            try:
                handle = ctypes.CDLL(path)
            except OSError as e:
                raise LibraryNotFoundError(f"cannot load libpsclient from {path}: {e}") from e
            missing = []
            for fname, (restype, argtypes) in _PROTOTYPES.items():
                try:
                    f = getattr(handle, fname)
                except AttributeError:
                    missing.append(fname)
                    continue
                f.restype = restype
                f.argtypes = argtypes
            if missing:
                raise LibraryNotFoundError(
                    f"{path} is not a compatible libpsclient: missing {', '.join(missing)}")
            _lib_path = path
            _lib = handle
    return _lib


def library_path() -> str:
    """The file (or loader name) libpsclient was loaded from."""
    lib()
    assert _lib_path is not None
    return _lib_path
