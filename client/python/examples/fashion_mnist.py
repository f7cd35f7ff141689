"""Reading Fashion-MNIST's IDX files (plain or gzip), as Debian's dataset-fashion-mnist
installs them in /usr/share/datasets/fashion-mnist; and what the examples that train on it
share (their common command-line flags, the shard of a worker)."""

from __future__ import annotations

import argparse
import gzip
import os
import struct
from typing import Tuple

import numpy as np

import worker_support

DEFAULT_DIR = worker_support.DATA_DIR


def _open_idx(data_dir: str, stem: str) -> bytes:
    for name in (stem, stem + ".gz"):
        path = os.path.join(data_dir, name)
        if os.path.exists(path):
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                return f.read()
    raise FileNotFoundError(f"{os.path.join(data_dir, stem)}[.gz]: no such file "
                            f"(Debian: apt-get install dataset-fashion-mnist)")


def _parse(raw: bytes, stem: str) -> np.ndarray:
    if len(raw) < 8:
        raise ValueError(f"{stem}: truncated IDX header")
    zero, dtype_code, ndims = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{stem}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{ndims}I", raw[4:4 + 4 * ndims])
    data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndims)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{stem}: {data.size} bytes of data, the header says {dims}")
    return data.reshape(dims)


def load(data_dir: str = DEFAULT_DIR, split: str = "train") -> Tuple[np.ndarray, np.ndarray]:
    """(images as float32 [n, 784] in [0, 1], labels as int64 [n]) of 'train' or 't10k'."""
    images = _parse(_open_idx(data_dir, f"{split}-images-idx3-ubyte"), split + " images")
    labels = _parse(_open_idx(data_dir, f"{split}-labels-idx1-ubyte"), split + " labels")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{split}: {images.shape[0]} images but {labels.shape[0]} labels")
    x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
    return x, labels.astype(np.int64)


def load_train_test(data_dir: str = DEFAULT_DIR
                    ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test), as load() gives them."""
    x_train, y_train = load(data_dir, "train")
    x_test, y_test = load(data_dir, "t10k")
    return x_train, y_train, x_test, y_test


def example_parser(description: str, *, epochs: int, prefix: str) -> argparse.ArgumentParser:
    """The flags every example has (worker_support.add_worker_flags); the example adds its
    own."""
    ap = argparse.ArgumentParser(description=description)
    worker_support.add_worker_flags(ap, epochs=epochs, prefix=prefix)
    return ap


def shard(x: np.ndarray, y: np.ndarray, index: int, count: int) -> Tuple[np.ndarray, np.ndarray]:
    """Worker `index` of `count`'s part of the training set: every count-th example from
    `index` (the shards are disjoint and together the whole set)."""
    return np.ascontiguousarray(x[index::count]), np.ascontiguousarray(y[index::count])
