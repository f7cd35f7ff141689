"""psd.events: TensorBoard event files in pure Python (no TensorFlow, no tensorboard package).

    import psd.events
    with psd.events.EventWriter("runs/exp1/worker-0") as w:
        for step in range(100):
            w.add_scalar("train/loss", loss, step)
            w.add_scalars({"train/accuracy": acc, "train/lr": lr}, step)
        w.add_histogram("weights/dense0", weights, step)  # any iterable of numbers

`tensorboard --logdir runs/exp1` then shows one run per directory. The files are the ones
ps-worker and ps-server write (common/events.c): TFRecords (little-endian uint64 length,
masked CRC-32C of it, the data, masked CRC-32C of the data) holding Event messages with the
field numbers of TensorFlow's event.proto and summary.proto, the first one file_version
"brain.Event:2", in files named events.out.tfevents.<10-digit seconds>.<host>.<pid>.<n>.
Records are written whole, at most flush_secs after they were added (and at flush() and
close()), and a new file starts beyond max_bytes. torch.utils.tensorboard's SummaryWriter may
write into the same directory: TensorBoard reads every event file of a run.

A write that fails (a full disk) is logged once (logging, logger "psd.events"), the file is
cut back to its last whole record and the writer stops: later calls do nothing, and training
goes on.

read_events(path) decodes such a file (the scalars and histograms psd writes) for tests and
small scripts; it stops at a record cut short and raises ValueError on a wrong checksum.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import struct
import time
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

__all__ = ["EventWriter", "read_events", "crc32c", "masked_crc32c", "frame_record",
           "encode_event", "run_dir"]

_log = logging.getLogger("psd.events")

# ---- CRC-32C (Castagnoli), table-driven ----

_POLY = 0x82F63B78


def _make_table() -> List[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C of data, continuing from crc: crc32c(b"123456789") == 0xE3069283."""
    c = crc ^ 0xFFFFFFFF
    t = _TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits plus 0xa282ead8."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """The TFRecord of data: length, its masked CRC, data, the data's masked CRC."""
    head = struct.pack("<Q", len(data))
    return (head + struct.pack("<I", masked_crc32c(head)) + data +
            struct.pack("<I", masked_crc32c(data)))


# ---- protobuf encoding of Event, Summary, Summary.Value, HistogramProto ----

def _varint(n: int) -> bytes:
    n &= 0xFFFFFFFFFFFFFFFF  # int64: negative numbers take ten bytes
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint((field << 3) | wire)


def _bytes_field(field: int, data: bytes) -> bytes:
    return _key(field, 2) + _varint(len(data)) + data


def _double_field(field: int, v: float) -> bytes:
    return _key(field, 1) + struct.pack("<d", v) if v != 0.0 else b""


def _histogram(values: Iterable[float]) -> bytes:
    xs = [float(v) for v in values]
    xs = [x for x in xs if not math.isnan(x)]
    counts = [0.0] * len(_LIMITS)
    lo, hi, s, ss = (min(xs), max(xs), 0.0, 0.0) if xs else (0.0, 0.0, 0.0, 0.0)
    import bisect
    for x in xs:
        counts[bisect.bisect_right(_LIMITS, x)] += 1.0
        s += x
        ss += x * x
    limits: List[float] = []
    buckets: List[float] = []
    i = 0
    while i < len(_LIMITS):
        end, c = _LIMITS[i], counts[i]
        i += 1
        if c <= 0.0:
            while i < len(_LIMITS) and counts[i] <= 0.0:
                end = _LIMITS[i]
                i += 1
        limits.append(end)
        buckets.append(c)
    out = (_double_field(1, lo) + _double_field(2, hi) + _double_field(3, float(len(xs))) +
           _double_field(4, s) + _double_field(5, ss))
    out += _bytes_field(6, struct.pack(f"<{len(limits)}d", *limits))
    out += _bytes_field(7, struct.pack(f"<{len(buckets)}d", *buckets))
    return out


def _default_limits() -> List[float]:
    pos = []
    v = 1e-12
    while v < 1e20:
        pos.append(v)
        v *= 1.1
    pos.append(1.7976931348623157e308)
    return [-x for x in reversed(pos)] + [0.0] + pos


_LIMITS = _default_limits()


def encode_event(wall_time: float, step: int = 0, *, file_version: Optional[str] = None,
                 scalars: Optional[Mapping[str, float]] = None,
                 histograms: Optional[Mapping[str, Iterable[float]]] = None) -> bytes:
    """The Event message: wall_time (1), step (2), file_version (3) or summary (5)."""
    out = _double_field(1, wall_time)
    if step:
        out += _key(2, 0) + _varint(step)
    if file_version is not None:
        return out + _bytes_field(3, file_version.encode())
    summary = b""
    for tag, v in (scalars or {}).items():
        value = _bytes_field(1, tag.encode()) + _key(2, 5) + struct.pack("<f", float(v))
        summary += _bytes_field(1, value)
    for tag, vals in (histograms or {}).items():
        value = _bytes_field(1, tag.encode()) + _bytes_field(5, _histogram(vals))
        summary += _bytes_field(1, value)
    return out + _bytes_field(5, summary)


def run_dir(logdir: str, tf_config: Optional[str] = None) -> str:
    """logdir/<type>-<index> of this process's TF_CONFIG task (as ps-worker's --logdir:
    worker-0, chief-0), or logdir/worker-0 without one."""
    import json
    text = tf_config if tf_config is not None else os.environ.get("TF_CONFIG", "")
    kind, index = "worker", 0
    try:
        task = json.loads(text).get("task", {}) if text else {}
        kind = str(task.get("type", "worker")) or "worker"
        index = int(task.get("index", 0))
    except (ValueError, AttributeError, TypeError):
        pass
    return os.path.join(logdir, f"{kind}-{index}")


class EventWriter:
    """Writes TensorBoard event files into directory `logdir` (made when missing).

    Raises OSError at construction when the directory cannot be made or written."""

    def __init__(self, logdir: str, *, flush_secs: float = 2.0,
                 max_bytes: int = 64 << 20) -> None:
        self.logdir = logdir
        self.flush_secs = flush_secs
        self.max_bytes = max_bytes
        self.failed = False
        self._buf: List[bytes] = []
        self._buf_len = 0
        self._n = 0
        self._time = 0
        self._fd = -1
        self._size = 0
        self._last_flush = time.monotonic()
        os.makedirs(logdir, exist_ok=True)
        self.path = ""
        self._open_file()

    # -- files --

    def _open_file(self) -> None:
        now = int(time.time())
        self._time = now if now > self._time else self._time + 1
        host = socket.gethostname() or "localhost"
        self.path = os.path.join(
            self.logdir, f"events.out.tfevents.{self._time:010d}.{host}.{os.getpid()}.{self._n}")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        self._size = 0
        self._append(encode_event(time.time(), file_version="brain.Event:2"), rotate=False)
        self.flush()
        if self.failed:
            raise OSError(f"cannot write {self.path}")

    def _fail(self, err: OSError) -> None:
        if not self.failed:
            _log.error("event files in %s stop (training goes on): writing %s: %s", self.logdir,
                       self.path, err.strerror or err)
        self.failed = True
        self._buf.clear()
        self._buf_len = 0

    def _append(self, event: bytes, rotate: bool = True) -> None:
        if self.failed or self._fd < 0:  # stopped, or closed
            return
        rec = frame_record(event)
        if rotate and self._size and self._size + self._buf_len + len(rec) > self.max_bytes:
            self.flush()
            if self.failed:
                return
            os.close(self._fd)
            self._fd = -1
            self._n += 1
            try:
                self._open_file()
            except OSError as err:
                self._fail(err)
                return
        self._buf.append(rec)
        self._buf_len += len(rec)
        if self._buf_len >= (256 << 10) or time.monotonic() - self._last_flush >= self.flush_secs:
            self.flush()

    # -- records --

    def add_scalar(self, tag: str, value: float, step: int,
                   wall_time: Optional[float] = None) -> None:
        """One scalar at step (wall_time: seconds since the epoch, default now)."""
        self.add_scalars({tag: value}, step, wall_time)

    def add_scalars(self, values: Mapping[str, float], step: int,
                    wall_time: Optional[float] = None) -> None:
        """Several scalars at one step, in one record."""
        self._append(encode_event(time.time() if wall_time is None else wall_time, int(step),
                                  scalars=values))

    def add_histogram(self, tag: str, values: Iterable[float], step: int,
                      wall_time: Optional[float] = None) -> None:
        """The histogram of values (TensorFlow's default buckets) at step."""
        if hasattr(values, "detach"):  # a torch tensor
            values = values.detach().cpu().reshape(-1).tolist()  # type: ignore[union-attr]
        elif hasattr(values, "ravel"):  # a NumPy array
            values = values.ravel().tolist()  # type: ignore[union-attr]
        self._append(encode_event(time.time() if wall_time is None else wall_time, int(step),
                                  histograms={tag: values}))

    def flush(self) -> None:
        """Writes the records added so far, whole, with one write."""
        self._last_flush = time.monotonic()
        if self.failed or not self._buf:
            return
        data = b"".join(self._buf)
        self._buf.clear()
        self._buf_len = 0
        try:
            n = os.write(self._fd, data)
            if n != len(data):
                raise OSError(28, os.strerror(28))  # ENOSPC: a short write
            self._size += n
        except OSError as err:
            try:
                os.ftruncate(self._fd, self._size)
                os.lseek(self._fd, self._size, os.SEEK_SET)
            except OSError:
                pass
            self._fail(err)

    def close(self) -> None:
        """Flushes and closes the file. Idempotent."""
        if self._fd >= 0:
            self.flush()
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass


# ---- reading ----

def _fields(data: bytes) -> Iterator[Tuple[int, int, Any]]:
    i = 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _read_varint(data, i)
        elif wire == 1:
            v = data[i:i + 8]
            i += 8
        elif wire == 2:
            n, i = _read_varint(data, i)
            v = data[i:i + n]
            i += n
        elif wire == 5:
            v = data[i:i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wire} not supported")
        yield field, wire, v


def _read_varint(data: bytes, i: int) -> Tuple[int, int]:
    n = shift = 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def _decode_histogram(data: bytes) -> Dict[str, Any]:
    h: Dict[str, Any] = {"min": 0.0, "max": 0.0, "num": 0.0, "sum": 0.0, "sum_squares": 0.0,
                         "bucket_limit": [], "bucket": []}
    names = {1: "min", 2: "max", 3: "num", 4: "sum", 5: "sum_squares"}
    for f, _, v in _fields(data):
        if f in names:
            h[names[f]] = struct.unpack("<d", v)[0]
        elif f in (6, 7):
            h["bucket_limit" if f == 6 else "bucket"] += list(
                struct.unpack(f"<{len(v) // 8}d", v))
    return h


def read_events(path: str) -> Iterator[Dict[str, Any]]:
    """The events of one file: dicts with wall_time, step and file_version, scalars (tag ->
    value) or histograms (tag -> dict of min, max, num, sum, sum_squares, bucket_limit,
    bucket)."""
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while len(data) - off >= 12:
        head = data[off:off + 8]
        (n,) = struct.unpack("<Q", head)
        (hc,) = struct.unpack("<I", data[off + 8:off + 12])
        if hc != masked_crc32c(head):
            raise ValueError(f"{path}: bad length checksum at offset {off}")
        if len(data) - off - 12 < n + 4:
            return  # cut short: a record still being written
        body = data[off + 12:off + 12 + n]
        (dc,) = struct.unpack("<I", data[off + 12 + n:off + 16 + n])
        if dc != masked_crc32c(body):
            raise ValueError(f"{path}: bad data checksum at offset {off}")
        off += 16 + n
        ev: Dict[str, Any] = {"wall_time": 0.0, "step": 0}
        for f, _, v in _fields(body):
            if f == 1:
                ev["wall_time"] = struct.unpack("<d", v)[0]
            elif f == 2:
                ev["step"] = v - (1 << 64) if v >= 1 << 63 else v
            elif f == 3:
                ev["file_version"] = v.decode()
            elif f == 5:
                scalars, hists = {}, {}
                for vf, _, val in _fields(v):
                    if vf != 1:
                        continue
                    tag, simple, histo = "", None, None
                    for ff, _, x in _fields(val):
                        if ff == 1:
                            tag = x.decode()
                        elif ff == 2:
                            simple = struct.unpack("<f", x)[0]
                        elif ff == 5:
                            histo = _decode_histogram(x)
                    if simple is not None:
                        scalars[tag] = simple
                    if histo is not None:
                        hists[tag] = histo
                ev["scalars"] = scalars
                if hists:
                    ev["histograms"] = hists
        yield ev
