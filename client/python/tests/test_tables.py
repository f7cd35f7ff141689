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


def test_step_with_table_items(cluster2: Cluster, uname: str) -> None:
    # no heartbeats: they are requests too, and the test counts requests
    with psd.Client(cluster2.spec, use_env=False, worker_id=0, heartbeat_ms=0) as w:
        t = w.create_table(uname + "/emb", 4, optimizer="sgd", learning_rate=0.5,
                           initializer="constant", init_a=1.0)
        v = w.create_variable(uname + "/w", (3,), optimizer="sgd", learning_rate=1.0)
        ids = np.array([7, -3, 7, 2**40, 11, 12, 13, 14], dtype=np.int64)
        grads = (np.arange(32, dtype=np.float32).reshape(8, 4) / 16).astype(np.float32)
        before = [w.server_status(i).requests for i in range(2)]
        c0 = w.current_clock
        dense, rows = w.step([(v, np.ones(3, np.float32))], tables=[(t, ids, grads)])
        # (other tests' workers 0 on these servers may have clocked further: the servers'
        # clock for worker 0 wins)
        assert w.current_clock >= c0 + 1
        after = [w.server_status(i).requests for i in range(2)]
        # one step request per server, and the first status request of `after`
        assert [a - b for a, b in zip(after, before)] == [2, 2]
        np.testing.assert_array_equal(dense, -np.ones(3, np.float32))
        assert rows.shape == (8, 4) and rows.dtype == np.float32
        for k, i in enumerate(ids):
            want = np.float32(1.0) - np.float32(0.5) * grads[ids == i].sum(axis=0)
            np.testing.assert_array_equal(rows[k], want)
        np.testing.assert_array_equal(t.pull(ids), rows)
        # pull only, into a caller's buffer; push only (no result)
        out = np.zeros(8 * 4, np.float32)
        (got,) = w.step([], tables=[(t, ids, None, out)], clock=False)
        assert got is out
        np.testing.assert_array_equal(out.reshape(8, 4), rows)
        (none,) = w.step([], tables=[(t, ids[:1], np.zeros((1, 4), np.float32), False)])
        assert none is None
        with pytest.raises(ValueError, match="need 8"):
            w.step([], tables=[(t, ids[:2], np.zeros(3, np.float32))])
        with pytest.raises(TypeError, match="psd.Table"):
            w.step([], tables=[(v, ids, grads)])


def test_delete_table(client: psd.Client, uname: str) -> None:
    t = client.create_table(uname, 4, initializer="constant", init_a=1.0)
    ids = np.array([1, 2, -3], dtype=np.int64)
    t.push(ids, np.ones((3, 4), np.float32))
    client.delete_table(uname)
    with pytest.raises(psd.NotFoundError):
        t.pull(ids)
    with pytest.raises(psd.NotFoundError, match="not found on any"):
        client.delete_table(uname)
    # the name is free again, with fresh rows
    t2 = client.create_table(uname, 2, initializer="constant", init_a=5.0)
    np.testing.assert_array_equal(t2.pull(ids), np.full((3, 2), 5.0, np.float32))
