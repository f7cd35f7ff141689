"""Sparse tables from Python against 2 real ps-server processes: exact rows after SGD pushes
(duplicate and negative ids), rows in the caller's order, the initializer's rows, errors."""

from __future__ import annotations

import numpy as np
import pytest

import psd
from conftest import Cluster


def test_table_sgd_exact_rows(client: psd.Client, uname: str) -> None:
    t = client.create_table(uname, 3, optimizer="sgd", learning_rate=0.5,
                            initializer="constant", init_a=1.0)
    assert t.dim == 3
    ids = np.array([4, -9, 4, 2**62, -1, 4], dtype=np.int64)
    grads = (np.arange(18, dtype=np.float32).reshape(6, 3) * 0.25).astype(np.float32)
    t.push(ids, grads)
    q = np.array([4, 123456, -9, 4, -1, 2**62], dtype=np.int64)
    rows = t.pull(q)
    assert rows.shape == (6, 3) and rows.dtype == np.float32
    for k, i in enumerate(q):
        want = np.float32(1.0) - np.float32(0.5) * grads[ids == i].sum(axis=0, dtype=np.float32)
        np.testing.assert_array_equal(rows[k], want)
    # into a caller's flat buffer, in place
    out = np.zeros(6 * 3, dtype=np.float32)
    assert t.pull(q, out=out) is out
    np.testing.assert_array_equal(out.reshape(6, 3), rows)
    # a second handle by name sees the same rows
    np.testing.assert_array_equal(client.table(uname).pull(q), rows)


def test_table_initializer_rows_are_deterministic(client: psd.Client, uname: str) -> None:
    t = client.create_table(uname, 8, initializer="normal", init_a=0.0, init_b=1.0, seed=7)
    ids = np.array([10, 11, -10], dtype=np.int64)
    a = t.pull(ids)
    assert np.all(np.isfinite(a)) and not np.array_equal(a[0], a[1])
    np.testing.assert_array_equal(t.pull(ids[::-1].copy()), a[::-1])
    t.push(ids[:1], np.zeros((1, 8), dtype=np.float32))  # makes row 10 from the initializer
    np.testing.assert_array_equal(t.pull(ids), a)


def test_table_errors(client: psd.Client, uname: str) -> None:
    t = client.create_table(uname, 2, optimizer="ftrl")
    with pytest.raises(TypeError, match="int64"):
        t.pull(np.array([1, 2], dtype=np.int32))
    with pytest.raises(ValueError, match="need 4"):
        t.push(np.array([1, 2], dtype=np.int64), np.zeros(3, dtype=np.float32))
    with pytest.raises(psd.InvalidArgumentError, match="nothing applied"):
        t.push(np.array([1], dtype=np.int64), np.array([np.nan, 0], dtype=np.float32))
    with pytest.raises(psd.NotFoundError):
        client.table(uname + "/none")
    with pytest.raises(psd.AlreadyExistsError):
        client.create_table(uname, 3)
    with pytest.raises(psd.InvalidArgumentError, match="dim"):
        client.create_table(uname + "/zero", 0)
    np.testing.assert_array_equal(t.pull(np.array([1], dtype=np.int64)), [[0, 0]])
