"""Sparse tables from Python against 2 real ps-server processes: exact rows after SGD pushes
(duplicate and negative ids), rows in the caller's order, the initializer's rows, errors (ram_rows
without cold-dir), prefetch of a table with a cold tier (2 servers with cold-dir)."""

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


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 and back, to nearest even (the servers' rounding)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32)


def test_table_16bit_rows(client: psd.Client, uname: str) -> None:
    ids = np.array([3, -5, 3], dtype=np.int64)
    grads = np.array([[0.1, 0.2], [0.3, -0.7], [0.05, 0.0]], dtype=np.float32)
    init = np.float32(1.0 / 3.0)
    for dtype, rnd in (("bfloat16", _round_bf16),
                       ("float16", lambda a: a.astype(np.float16).astype(np.float32))):
        t = client.create_table(f"{uname}/{dtype}", 2, optimizer="sgd", learning_rate=1.0,
                                initializer="constant", init_a=float(init), dtype=dtype)
        # the initializer's row, rounded once the row is made; each update rounded again
        np.testing.assert_array_equal(t.pull(ids[:1]), [[init, init]])
        t.push(ids, grads)
        rows = t.pull(ids)
        assert rows.dtype == np.float32
        made = rnd(np.full(2, init, dtype=np.float32))
        np.testing.assert_array_equal(rows[0], rnd(made - (grads[0] + grads[2])))
        np.testing.assert_array_equal(rows[1], rnd(made - grads[1]))
        # the same spec again is the same table; another dtype is another spec
        client.create_table(f"{uname}/{dtype}", 2, optimizer="sgd", learning_rate=1.0,
                            initializer="constant", init_a=float(init), dtype=dtype)
        with pytest.raises(psd.AlreadyExistsError):
            client.create_table(f"{uname}/{dtype}", 2, optimizer="sgd", learning_rate=1.0,
                                initializer="constant", init_a=float(init))
    # float32 said or left out: one spec
    client.create_table(f"{uname}/f32", 2)
    client.create_table(f"{uname}/f32", 2, dtype="float32")
    with pytest.raises(ValueError, match="unknown dtype"):
        client.create_table(f"{uname}/bad", 2, dtype="int8")
    with pytest.raises(psd.InvalidArgumentError, match="adamw"):
        client.create_table(f"{uname}/aw", 2, optimizer="adamw", dtype="bfloat16")


def test_table_rowwise_adagrad(client: psd.Client, uname: str) -> None:
    t = client.create_table(uname, 4, optimizer="rowwise_adagrad", learning_rate=0.5,
                            initial_accumulator=0.1, epsilon=1e-7)
    g = np.array([[1.0, -1.0, 2.0, 0.0]], dtype=np.float32)
    ids = np.array([9], dtype=np.int64)
    t.push(ids, g)
    t.push(ids, g)
    acc, w = 0.1, np.zeros(4)
    for _ in range(2):
        acc += float(np.mean(g.astype(np.float64) ** 2))
        w -= 0.5 / (np.sqrt(acc) + 1e-7) * g[0]
    np.testing.assert_allclose(t.pull(ids)[0], w, rtol=1e-5, atol=1e-6)


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


def test_table_ram_rows_needs_cold_dir(client: psd.Client, uname: str) -> None:
    # ram_rows reaches the servers (these run without cold-dir): refused, naming what is missing
    with pytest.raises(psd.InvalidArgumentError, match="cold-dir|RocksDB"):
        client.create_table(uname, 4, ram_rows=100)
    client.create_table(uname, 4, ram_rows=0)  # 0: every row in RAM, as without it


def test_table_prefetch(client: psd.Client, uname: str, tmp_path) -> None:
    # a table all in RAM: nothing to bring
    t = client.create_table(uname, 4)
    assert t.prefetch(np.arange(10, dtype=np.int64)) == 0
    with pytest.raises(TypeError, match="prefetch"):
        t.prefetch([1, 2])
    # two servers with a cold tier: the first pushed rows go to disk, a prefetch brings them
    cold = tmp_path / "cold"
    cold.mkdir()
    cl = Cluster(2, ["--cold-dir", str(cold)])
    try:
        with psd.Client(cl.spec, use_env=False, deadline_ms=10000) as c:
            try:
                ct = c.create_table("pre", 4, optimizer="adagrad", ram_rows=1000)
            except psd.InvalidArgumentError as e:
                if "RocksDB" in str(e):
                    pytest.skip("built without RocksDB (no cold tier)")
                raise
            ids = np.arange(6000, dtype=np.int64)
            for off in range(0, 6000, 500):
                ct.push(ids[off:off + 500], np.full((500, 4), 0.125, np.float32))
            first = ids[:64]
            before = ct.pull(ids[3000:3064])  # RAM or disk: rows to compare with later
            n = ct.prefetch(np.concatenate([first, first[:5]]))  # duplicates sent once
            assert 32 < n <= 64
            assert ct.prefetch(first) == 0  # in RAM now
            assert ct.prefetch(np.array([10**9, -3], dtype=np.int64)) == 0  # no row: none made
            assert ct.prefetch_async(ids[3000:3064]).result(timeout=30) is None
            np.testing.assert_array_equal(ct.pull(ids[3000:3064]), before)
            c.delete_table("pre")
            with pytest.raises(psd.NotFoundError, match="pre"):
                ct.prefetch(first)
    finally:
        cl.stop()
