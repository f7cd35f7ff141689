"""Turning a caller's array into an address libpsclient reads or writes in place.

No tensor data is ever copied here: the address is that of the caller's own memory, taken
from NumPy's ``__array_interface__``, a PyTorch CPU tensor's ``data_ptr()``, or the buffer
protocol (through a memoryview, which also keeps the buffer exported, so that e.g. a
bytearray cannot be resized while an asynchronous operation uses it). Anything that would need
a copy (another dtype, a non-contiguous view, a read-only pull destination, a GPU tensor) is
refused with a TypeError or ValueError saying what was wrong.
"""

from __future__ import annotations

import ctypes
import sys
from ctypes import POINTER, Structure, c_char_p, c_int, c_ssize_t, c_void_p
from typing import Any, Optional, Sequence, Tuple

_F32_TYPESTR = "<f4" if sys.byteorder == "little" else ">f4"
_F32_FORMATS = {"f", "=f", "<f" if sys.byteorder == "little" else ">f"}

# A valid address for zero-element transfers (libpsclient refuses NULL buffers).
_EMPTY = ctypes.create_string_buffer(8)
_EMPTY_ADDR = ctypes.addressof(_EMPTY)


class _PyBuffer(Structure):
    """Py_buffer (part of the stable ABI since Python 3.11, unchanged since 3.3)."""

    _fields_ = [
        ("buf", c_void_p),
        ("obj", c_void_p),
        ("len", c_ssize_t),
        ("itemsize", c_ssize_t),
        ("readonly", c_int),
        ("ndim", c_int),
        ("format", c_char_p),
        ("shape", POINTER(c_ssize_t)),
        ("strides", POINTER(c_ssize_t)),
        ("suboffsets", POINTER(c_ssize_t)),
        ("internal", c_void_p),
    ]


_GetBuffer = ctypes.pythonapi.PyObject_GetBuffer
_GetBuffer.argtypes = [ctypes.py_object, POINTER(_PyBuffer), c_int]
_GetBuffer.restype = c_int
_ReleaseBuffer = ctypes.pythonapi.PyBuffer_Release
_ReleaseBuffer.argtypes = [POINTER(_PyBuffer)]
_ReleaseBuffer.restype = None
_PyBUF_SIMPLE = 0
_PyBUF_WRITABLE = 1


def _address(obj: Any, writable: bool) -> int:
    """The address of obj's memory through the buffer protocol (a momentary export: the
    caller keeps obj, which owns the memory, alive while the address is in use)."""
    view = _PyBuffer()
    _GetBuffer(obj, ctypes.byref(view), _PyBUF_WRITABLE if writable else _PyBUF_SIMPLE)
    addr = view.buf
    _ReleaseBuffer(ctypes.byref(view))
    return addr


def _describe(obj: Any) -> str:
    t = type(obj)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _c_contiguous(shape: Sequence[int], strides: Optional[Sequence[int]], itemsize: int) -> bool:
    if strides is None:
        return True
    expected = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim == 0:
            return True
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


_np_f32: Any = None

# (address, number of float32 elements, object to keep alive, shape)
_Resolved = Tuple[int, int, Any, Tuple[int, ...]]


def _from_ndarray(a: Any, np: Any, writable: bool, what: str) -> _Resolved:
    """NumPy's ndarray, checked through its flags (cheaper than building __array_interface__)."""
    global _np_f32
    if _np_f32 is None:
        _np_f32 = np.dtype(np.float32)
    if a.dtype != _np_f32:
        shown = a.dtype.str if a.dtype.kind == 'f' and a.dtype.itemsize == 4 else a.dtype
        raise TypeError(f"{what}: the array's dtype is {shown}, "
                        f"not float32 (convert it yourself, e.g. arr.astype(np.float32); no "
                        f"copy is made implicitly)")
    flags = a.flags
    if not flags.c_contiguous:
        raise ValueError(f"{what}: the array is not C-contiguous (shape {a.shape}, strides "
                         f"{a.strides}); pass a contiguous array or a contiguous slice "
                         f"(np.ascontiguousarray makes a copy you then own)")
    if writable and not flags.writeable:
        raise ValueError(f"{what}: the array is read-only (arr.flags.writeable is False); a "
                         f"pull needs a writable destination")
    count = a.size
    if count == 0:
        return _EMPTY_ADDR, 0, a, a.shape
    return _address(a, writable), count, a, a.shape


def _from_array_interface(obj: Any, ai: dict, writable: bool, what: str) -> _Resolved:
    typestr = ai.get("typestr")
    if typestr != _F32_TYPESTR or ai.get("descr", [("", typestr)])[0][1] != typestr:
        dtype = getattr(obj, "dtype", typestr)
        raise TypeError(f"{what}: the array's dtype is {dtype}, not float32 (convert it "
                        f"yourself, e.g. arr.astype(np.float32); no copy is made implicitly)")
    shape = tuple(ai["shape"])
    if not _c_contiguous(shape, ai.get("strides"), 4):
        raise ValueError(f"{what}: the array is not C-contiguous (shape {shape}, strides "
                         f"{tuple(ai['strides'])}); pass a contiguous array or a contiguous "
                         f"slice (np.ascontiguousarray makes a copy you then own)")
    addr, readonly = ai["data"]
    if writable and readonly:
        raise ValueError(f"{what}: the array is read-only (arr.flags.writeable is False); a "
                         f"pull needs a writable destination")
    count = 1
    for d in shape:
        count *= d
    return (addr if count else _EMPTY_ADDR), count, obj, shape


def _from_torch(t: Any, writable: bool, what: str) -> _Resolved:
    if t.device.type != "cpu":
        raise ValueError(f"{what}: the tensor is on {t.device}; only CPU tensors are read or "
                         f"written in place (move it with .cpu() yourself)")
    if str(t.dtype) != "torch.float32":
        raise TypeError(f"{what}: the tensor's dtype is {t.dtype}, not torch.float32")
    if not t.is_contiguous():
        raise ValueError(f"{what}: the tensor is not contiguous (shape {tuple(t.shape)}, "
                         f"strides {t.stride()}); pass a contiguous tensor")
    if writable and t.requires_grad:
        raise ValueError(f"{what}: the tensor requires grad; pull into its .data (e.g. "
                         f"param.data) so that autograd is not bypassed silently")
    count = t.numel()
    return (t.data_ptr() if count else _EMPTY_ADDR), count, t, tuple(t.shape)


def _from_buffer_protocol(obj: Any, writable: bool, what: str) -> _Resolved:
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(f"{what}: expected a float32 NumPy array, a PyTorch CPU tensor or an "
                        f"object with the buffer protocol, got {_describe(obj)}") from None
    if mv.format not in _F32_FORMATS or mv.itemsize != 4:
        raise TypeError(f"{what}: the buffer's format is {mv.format!r} (itemsize "
                        f"{mv.itemsize}), not float32 ('f'); e.g. use array.array('f') or "
                        f"memoryview(b).cast('f')")
    if not mv.c_contiguous:
        raise ValueError(f"{what}: the buffer is not C-contiguous (shape {mv.shape}, strides "
                         f"{mv.strides})")
    if writable and mv.readonly:
        raise ValueError(f"{what}: the buffer ({_describe(obj)}) is read-only; a pull needs a "
                         f"writable destination")
    count = mv.nbytes // 4
    if count == 0:
        return _EMPTY_ADDR, 0, mv, mv.shape
    # The memoryview holds the export of obj (so its memory stays put) as long as we hold mv;
    # this second, momentary export only reads its address.
    return _address(mv, False), count, mv, mv.shape


def resolve(obj: Any, *, writable: bool,
            what: str) -> Tuple[int, int, Any, Tuple[int, ...]]:
    """Returns (address, number of float32 elements, object to keep alive while in use, the
    object's shape: (n,) for a flat buffer such as an array.array or a bytearray's view).

    Raises TypeError for anything that is not float32 memory, ValueError for memory that
    cannot be used in place (non-contiguous, read-only destination, GPU tensor)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.ndarray):
        return _from_ndarray(obj, np, writable, what)
    ai = getattr(obj, "__array_interface__", None)
    if isinstance(ai, dict) and isinstance(ai.get("data"), tuple):
        return _from_array_interface(obj, ai, writable, what)
    mod = type(obj).__module__
    if mod.startswith("torch") and hasattr(obj, "data_ptr"):
        return _from_torch(obj, writable, what)
    return _from_buffer_protocol(obj, writable, what)
