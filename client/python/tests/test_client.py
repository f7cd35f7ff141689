"""The Python client against real ps-server processes: exact values, errors as exceptions,
no copies of tensor data, asynchronous operations, threads."""

from __future__ import annotations

import array
import threading

import numpy as np
import pytest

import psd
from conftest import Cluster


def sgd_var(c: psd.Client, name: str, shape, **kw) -> psd.Variable:
    """SGD with learning rate 1 from zeros: the parameters are minus the sum of gradients."""
    return c.create_variable(name, shape, optimizer="sgd", learning_rate=1.0,
                             staleness=psd.STALENESS_ASYNC, **kw)


# ---- values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(5,), (3, 4), (64, 128)])  # the last is split over 2 servers
def test_sgd_values_exact(client: psd.Client, uname: str, shape) -> None:
    v = sgd_var(client, uname, shape)
    assert v.shape == shape and v.size == int(np.prod(shape))
    assert v.num_shards == (2 if v.size * 4 >= 16 * 1024 else 1)
    assert np.array_equal(v.pull(), np.zeros(shape, np.float32))
    rng = np.random.default_rng(1)
    total = np.zeros(shape, np.float64)
    for _ in range(4):
        g = rng.integers(-8, 9, size=shape).astype(np.float32)
        v.push(g)
        total += g
    out = np.empty(shape, np.float32)
    assert v.pull(out) is out
    assert np.array_equal(out, -total.astype(np.float32))
    g = np.ones(shape, np.float32)
    after = v.push_pull(g)
    assert np.array_equal(after, (-total - 1).astype(np.float32))


def test_initializer_and_lookup(client: psd.Client, uname: str) -> None:
    v = client.create_variable(uname, (2, 3), initializer="constant", init_a=2.5)
    assert np.array_equal(v.pull(), np.full((2, 3), 2.5, np.float32))
    again = client.create_variable(uname, (2, 3), initializer="constant", init_a=2.5)
    assert again is v  # idempotent: the same handle
    found = client.variable(uname)
    assert found.name == uname and found.shape == (2, 3)
    assert uname in client.list_variables()
    assert psd.optimizer_name(psd.optimizer_parse("AdamW")) == "adamw"


def test_ranges(client: psd.Client, uname: str) -> None:
    n = 10000  # split over both servers, several chunks per server
    v = sgd_var(client, uname, (n,))
    g = np.arange(1, 3001, dtype=np.float32)
    v.push(g, offset=4000)
    part = v.pull(offset=3990, count=3020)
    want = np.zeros(3020, np.float32)
    want[10:3010] = -g
    assert np.array_equal(part, want)
    full = v.pull()
    assert full[:4000].sum() == 0 and full[7000:].sum() == 0
    assert np.array_equal(full[4000:7000], -g)
    upd = v.push_pull(np.ones(5, np.float32), offset=n - 5)
    assert np.array_equal(upd, -np.ones(5, np.float32))


def test_size_mismatch_is_an_error(client: psd.Client, uname: str) -> None:
    # (3, 4) from constant 1 with SGD rate 1: a partial push would show as zeros
    v = client.create_variable(uname, (3, 4), initializer="constant", init_a=1.0,
                               optimizer="sgd", learning_rate=1.0,
                               staleness=psd.STALENESS_ASYNC)
    ones = np.ones((3, 4), np.float32)
    for call in (lambda: v.pull(np.zeros(5, np.float32)),
                 lambda: v.push(np.ones(5, np.float32)),
                 lambda: v.push_pull(np.ones(5, np.float32)),
                 lambda: v.pull_async(np.zeros(5, np.float32)),
                 lambda: v.push_async(np.ones(5, np.float32)),
                 lambda: v.push_pull_async(np.ones(5, np.float32)),
                 lambda: v.push(np.ones(13, np.float32))):
        with pytest.raises(ValueError, match=r"has (5|13) float32 elements.*the variable 12"):
            call()
    # the same 12 elements in another shape: refused unless reshaped on purpose
    with pytest.raises(ValueError, match=r"shape is \(4, 3\), the variable's \(3, 4\)"):
        v.push(np.ones((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"shape is \(12, 1\)"):
        v.pull(np.zeros((12, 1), np.float32))
    with pytest.raises(ValueError, match=r"shape is \(2, 6\)"):
        v.push_pull(ones, np.zeros((2, 6), np.float32))
    assert np.array_equal(v.pull(), ones)  # nothing above reached the servers
    v.push(np.ones((4, 3), np.float32).reshape(3, 4))  # reshaped on purpose
    v.push(np.ones(12, np.float32))  # a flat buffer is the flattened variable
    assert np.array_equal(v.pull(), -ones)
    # a range is what the caller writes, and only that
    v.push(np.ones(5, np.float32), offset=0)
    assert np.array_equal(v.pull().reshape(-1),
                          np.array([-2] * 5 + [-1] * 7, np.float32))
    assert np.array_equal(v.pull(np.zeros(5, np.float32), count=5), np.full(5, -2, np.float32))
    assert np.array_equal(v.pull(count=3, offset=9), np.full(3, -1, np.float32))
    with pytest.raises(ValueError, match="the gradient has 5 float32 elements, count is 4"):
        v.push(np.ones(5, np.float32), count=4)
    with pytest.raises(ValueError, match="count -1 is negative"):
        v.pull(count=-1)


def test_step_size_mismatch_is_an_error(cluster2: Cluster, uname: str) -> None:
    with psd.Client(cluster2.spec, use_env=False, worker_id=0, heartbeat_ms=0) as w:
        a = sgd_var(w, uname + "/a", (3, 4))
        b = sgd_var(w, uname + "/b", (5,))
        c0 = w.current_clock
        with pytest.raises(ValueError, match=r"step of .*/b': the gradient has 4 float32 "
                                             r"elements \(shape \(4,\)\), the variable 5"):
            w.step([(a, np.ones((3, 4), np.float32)), (b, np.ones(4, np.float32))])
        with pytest.raises(ValueError, match=r"step of .*/a': the gradient's shape is \(4, 3\)"):
            w.step([(a, np.ones((4, 3), np.float32))])
        with pytest.raises(ValueError, match=r"step of .*/a': the destination has 11"):
            w.step([(a, None, np.zeros(11, np.float32))])
        assert w.current_clock == c0  # nothing was sent
        assert np.array_equal(a.pull(), np.zeros((3, 4), np.float32))
        out = np.empty(12, np.float32)  # flat: the flattened variable
        (got,) = w.step([(a, np.ones((3, 4), np.float32), out)])
        assert got is out and np.array_equal(out, -np.ones(12, np.float32))


def test_clock_and_status(client: psd.Client, uname: str, cluster2: Cluster) -> None:
    v = sgd_var(client, uname, (4,))
    before = sum(client.server_status(i).updates_applied for i in range(client.num_servers))
    v.push(np.ones(4, np.float32))
    after = sum(client.server_status(i).updates_applied for i in range(client.num_servers))
    assert after == before + 1
    stats = [client.server_status(i) for i in range(client.num_servers)]
    assert [s.task_index for s in stats] == [0, 1]
    assert sum(s.num_variables for s in stats) >= 1 and all(s.uptime_ms >= 0 for s in stats)
    with pytest.raises(psd.PsError) as e:
        client.server_status(2)
    assert "2" in e.value.message
    with pytest.raises(psd.FailedPreconditionError, match="worker"):
        client.clock()  # not a worker
    with psd.Client(cluster2.spec, use_env=False, worker_id=0) as w:
        c0 = w.current_clock
        assert w.clock() == c0 + 1
        assert w.current_clock == c0 + 1


def test_step_one_request_per_server(cluster2: Cluster, uname: str) -> None:
    # no heartbeats: they are requests too, and the test counts requests
    with psd.Client(cluster2.spec, use_env=False, worker_id=0, heartbeat_ms=0,
                    split_threshold_bytes="16K") as w:
        small = sgd_var(w, uname + "/s", (3, 4))
        big = sgd_var(w, uname + "/b", (64, 128))  # split over both servers
        assert big.num_shards == 2
        gs = np.arange(12, dtype=np.float32).reshape(3, 4)
        gb = np.ones((64, 128), np.float32)
        before = [w.server_status(i).requests for i in range(2)]
        c0 = w.current_clock
        for t in range(1, 4):
            s_out, b_out = w.step([(small, gs), (big, gb)])
            assert np.array_equal(s_out, -t * gs) and np.array_equal(b_out, -t * gb)
        assert w.current_clock == c0 + 3
        after = [w.server_status(i).requests for i in range(2)]
        # 3 steps, one request per server each, and the first status request of `after`
        assert [a - b for a, b in zip(after, before)] == [4, 4]
        # push only, then pull only
        assert w.step([(small, gs, False)], clock=False) == [None]
        (got,) = w.step([(small, None)], clock=False)
        assert np.array_equal(got, -4 * gs)
        with pytest.raises(psd.InvalidArgumentError, match="neither grad nor dst"):
            w.step([(small, None, False)])


# ---- errors ---------------------------------------------------------------------------------


def test_not_found(client: psd.Client) -> None:
    with pytest.raises(psd.NotFoundError) as e:
        client.variable("no/such/variable")
    assert e.value.status == "NOT_FOUND" and e.value.code == 5
    assert "no/such/variable" in e.value.message
    assert isinstance(e.value, psd.PsError)


def test_invalid_argument_from_server(client: psd.Client, uname: str) -> None:
    with pytest.raises(psd.InvalidArgumentError) as e:
        client.create_variable(uname, (4,), optimizer="adamw", weight_decay=-1.0)
    assert e.value.status == "INVALID_ARGUMENT"
    assert "weight_decay" in e.value.message  # the server's message names the field


def test_other_errors(client: psd.Client, uname: str, cluster2: Cluster) -> None:
    with pytest.raises(psd.InvalidArgumentError) as e:
        client.create_variable(uname, (4,), optimizer="lamb")
    assert "adamw" in e.value.message  # lists the known names
    v = sgd_var(client, uname, (4,))
    with pytest.raises(psd.AlreadyExistsError) as e:
        client.create_variable(uname, (4,), optimizer="sgd", learning_rate=0.5,
                               staleness=psd.STALENESS_ASYNC)
    assert "learning_rate" in e.value.message
    with pytest.raises(psd.OutOfRangeError) as e:
        v.push(np.ones(3, np.float32), offset=2)
    assert uname in e.value.message
    with pytest.raises(psd.InvalidArgumentError) as e:
        psd.Client(cluster2.spec, use_env=False, no_such_setting=1)
    assert "no-such-setting" in e.value.message
    with pytest.raises(psd.InvalidArgumentError) as e:
        psd.Client({"ps": ["not-an-address"]}, use_env=False)
    assert "not-an-address" in e.value.message
    with pytest.raises(ValueError, match="unknown initializer"):
        client.create_variable(uname + "x", (4,), initializer="ones")
    with pytest.raises(TypeError, match="float32"):
        client.create_variable(uname + "x", (4,), dtype="float64")


def test_async_failure_is_the_futures_exception() -> None:
    cl = Cluster(1)
    try:
        with psd.Client(cl.spec, use_env=False, deadline_ms=300, retries=0) as c:
            v = sgd_var(c, "lost", (8,))
            cl.kill(0)
            fut = v.push_async(np.ones(8, np.float32))
            err = fut.exception(timeout=10)
            assert isinstance(err, (psd.DeadlineExceededError, psd.UnavailableError)), err
            assert err.message  # says what went wrong (which server, the deadline)
            with pytest.raises(psd.PsError):
                fut.result()
            with pytest.raises((psd.DeadlineExceededError, psd.UnavailableError)):
                v.pull()
    finally:
        cl.stop()


# ---- no copies --------------------------------------------------------------------------------


def test_pull_into_a_view_writes_the_arrays_own_memory(client: psd.Client, uname: str) -> None:
    v = client.create_variable(uname, (20,), initializer="constant", init_a=3.0)
    big = np.full(100, 7.0, np.float32)
    view = big[40:60]
    assert view.base is big
    assert v.pull(view) is view
    assert np.array_equal(big[40:60], np.full(20, 3.0, np.float32))  # filled through the view
    assert np.all(big[:40] == 7.0) and np.all(big[60:] == 7.0)  # nothing else touched
    # 2-D: a block of whole rows is contiguous; its (2, 10) shape is not the variable's (20,),
    # so it is flattened on purpose (a view: still the grid's memory)
    grid = np.full((6, 10), -1.0, np.float32)
    with pytest.raises(ValueError, match=r"shape is \(2, 10\), the variable's \(20,\)"):
        v.pull(grid[2:4])
    v.pull(grid[2:4].reshape(-1))
    assert np.all(grid[2:4] == 3.0) and np.all(grid[:2] == -1) and np.all(grid[4:] == -1)
    # async: the Future's result is the caller's own array
    fut = v.pull_async(big[0:20])
    assert fut.result(timeout=10).base is big and np.all(big[0:20] == 3.0)


def test_buffer_protocol_objects(client: psd.Client, uname: str) -> None:
    v = sgd_var(client, uname, (6,))
    g = array.array("f", [1, 2, 3, 4, 5, 6])
    v.push(g)  # read from the array.array's own memory
    raw = bytearray(6 * 4)
    v.pull(memoryview(raw).cast("f"))  # written into the bytearray itself
    assert np.array_equal(np.frombuffer(raw, np.float32), -np.arange(1, 7, dtype=np.float32))
    dst = array.array("f", [0.0] * 6)
    v.pull(dst)
    assert list(dst) == [-1, -2, -3, -4, -5, -6]
    # a read-only source is fine for a push (read in place: bytes cannot be copied into)
    v.push(np.frombuffer(bytes(24), np.float32))
    v.push(memoryview(bytes(24)).cast("f"))


class ArrayInterface:
    """A non-NumPy object exposing NumPy's __array_interface__ (as some libraries do)."""

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.__array_interface__ = a.__array_interface__


def test_array_interface_objects(client: psd.Client, uname: str) -> None:
    v = client.create_variable(uname, (8,), initializer="constant", init_a=4.0)
    big = np.zeros(16, np.float32)
    v.pull(ArrayInterface(big[4:12]))
    assert np.all(big[4:12] == 4.0) and np.all(big[:4] == 0) and np.all(big[12:] == 0)
    with pytest.raises(ValueError, match="not C-contiguous"):
        v.pull(ArrayInterface(big[::2]))
    with pytest.raises(TypeError, match="not float32"):
        v.pull(ArrayInterface(np.zeros(8, np.int32)))
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        v.pull(ArrayInterface(ro))


def test_refuses_what_would_need_a_copy(client: psd.Client, uname: str) -> None:
    v = client.create_variable(uname, (10,), initializer="constant", init_a=1.0)
    big = np.full(20, 7.0, np.float32)
    with pytest.raises(ValueError, match="not C-contiguous"):
        v.pull(big[::2])  # 10 elements, strided
    assert np.all(big == 7.0)  # and nothing was written anywhere
    with pytest.raises(ValueError, match="not C-contiguous"):
        v.push(np.ones((10, 2), np.float32)[:, 0])
    with pytest.raises(ValueError, match="not C-contiguous"):
        v.pull(np.empty((2, 5), np.float32, order="F"))
    with pytest.raises(TypeError, match="float64.*not float32"):
        v.pull(np.zeros(10, np.float64))
    with pytest.raises(TypeError, match="not float32"):
        v.push(np.zeros(10, np.float16))
    with pytest.raises(TypeError, match="format is 'd'"):
        v.push(array.array("d", [0.0] * 10))
    ro = np.zeros(10, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        v.pull(ro)
    with pytest.raises(ValueError, match="read-only"):
        v.pull(memoryview(bytes(40)).cast("f"))
    with pytest.raises(ValueError, match="9 float32 elements, count is 10"):
        v.pull(np.zeros(9, np.float32), count=10)
    with pytest.raises(ValueError, match="11 float32 elements.*the variable 10"):
        v.pull(np.zeros(11, np.float32))  # more than the variable holds
    with pytest.raises(psd.OutOfRangeError):
        v.pull(np.zeros(11, np.float32), offset=0)  # a range past the end
    with pytest.raises(TypeError, match="got list"):
        v.push([1.0] * 10)
    with pytest.raises(ValueError, match="push_pull.*destination has 9 float32.*variable 10"):
        v.push_pull(np.zeros(10, np.float32), np.zeros(9, np.float32))
    with pytest.raises(ValueError, match="push_pull.*destination has 9 float32.*count is 4"):
        v.push_pull(np.zeros(4, np.float32), np.zeros(9, np.float32), offset=2)


def test_torch_tensors_in_place(client: psd.Client, uname: str) -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    v = sgd_var(client, uname, (4, 3))
    g = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    v.push(g)
    big = torch.full((6, 3), 9.0)
    v.pull(big[1:5])  # rows 1..4, a contiguous view of big's storage
    assert torch.equal(big[1:5], -g) and torch.all(big[0] == 9) and torch.all(big[5] == 9)
    with pytest.raises(ValueError, match="not contiguous"):
        v.pull(torch.zeros(3, 4).t())
    with pytest.raises(TypeError, match="torch.float64"):
        v.pull(torch.zeros(4, 3, dtype=torch.float64))
    p = torch.nn.Parameter(torch.zeros(4, 3))
    with pytest.raises(ValueError, match="requires grad"):
        v.pull(p)
    v.pull(p.data)
    assert torch.equal(p.detach(), -g)


# ---- asynchronous operations and threads ----------------------------------------------------


def test_async_operations(client: psd.Client, uname: str) -> None:
    v = sgd_var(client, uname, (50, 100))  # split, several chunks
    grads = [np.full((50, 100), float(i + 1), np.float32) for i in range(8)]
    futs = [v.push_async(g) for g in grads]
    done = []
    futs[-1].add_done_callback(lambda f: done.append(f))
    assert all(f.result(timeout=10) is None for f in futs)
    assert not futs[0].cancel()  # a running transfer cannot be cancelled
    out = np.empty((50, 100), np.float32)
    assert v.pull_async(out).result(timeout=10) is out
    assert np.all(out == -36.0)  # -(1 + ... + 8)
    assert done == [futs[-1]]
    res = v.push_pull_async(np.ones((50, 100), np.float32)).result(timeout=10)
    assert res.shape == (50, 100) and np.all(res == -37.0)


def test_concurrent_pushes_from_threads(client: psd.Client, uname: str) -> None:
    n_threads, per_thread, shape = 8, 40, (96, 64)  # 24 KiB: split over both servers
    v = sgd_var(client, uname, shape)
    barrier = threading.Barrier(n_threads)
    errors = []

    def work(t: int) -> None:
        try:
            g = np.full(shape, float(t + 1), np.float32)
            barrier.wait()
            futs = []
            for i in range(per_thread):
                if i % 2:
                    v.push(g)
                else:
                    futs.append(v.push_async(g))
                v.pull()  # reads interleaved with the writes of the others
            for f in futs:
                f.result(timeout=30)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    want = -float(per_thread * sum(range(1, n_threads + 1)))  # -1440: exact in float32
    assert np.all(v.pull() == want)


def test_closed_client(cluster2: Cluster) -> None:
    c = psd.Client(cluster2.spec, use_env=False)
    v = sgd_var(c, "t/closed", (3,))
    c.close()
    c.close()  # idempotent
    assert c.closed
    with pytest.raises(ValueError, match="closed"):
        v.pull()
    with pytest.raises(ValueError, match="closed"):
        c.variable("t/closed")


def test_close_with_operations_in_flight(cluster2: Cluster) -> None:
    c = psd.Client(cluster2.spec, use_env=False, chunk_bytes="4K")
    v = sgd_var(c, "t/close-in-flight", (256, 256))
    bufs = [np.empty((256, 256), np.float32) for _ in range(16)]
    futs = [v.pull_async(b) for b in bufs]
    c.close()  # in-flight operations complete (CANCELLED) before close returns
    for f in futs:
        assert f.done()
        err = f.exception(timeout=0)
        assert err is None or isinstance(err, psd.CancelledError), err


# ---- the library's log lines ----------------------------------------------------------------

_STALLED_PULL = r"""
import json, os, signal, sys
import psd
spec, pid, fmt = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with psd.Client(spec, use_env=False, worker_id=3, log_format=fmt, deadline_ms=3500,
                retries=0) as c:
    v = c.create_variable("t/log_identity/" + fmt, (4,), optimizer="sgd")
    os.kill(pid, signal.SIGSTOP)
    try:
        v.pull()
    except psd.PsError as e:
        print(type(e).__name__)
    finally:
        os.kill(pid, signal.SIGCONT)
"""


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_library_lines_follow_the_log_format_and_name_the_worker(fmt: str) -> None:
    """A Python program sets up no logging of the library: the client's log_format setting and
    its worker id (role worker, task 3) decide how the library's lines look."""
    import json
    import subprocess
    import sys

    cluster = Cluster(1)
    try:
        r = subprocess.run([sys.executable, "-c", _STALLED_PULL, json.dumps(cluster.spec),
                            str(cluster.procs[0].pid), fmt],
                           cwd=__file__.rsplit("/tests/", 1)[0], capture_output=True, text=True,
                           timeout=60)
    finally:
        cluster.stop()
    lines = [ln for ln in r.stderr.splitlines() if "waiting for" in ln]
    assert lines, f"no 'waiting for' line from the library; stderr: {r.stderr!r}"
    if fmt == "text":
        assert " WARN worker/3: waiting for " in lines[0], lines[0]
    else:
        line = json.loads(lines[0])
        assert (line["level"], line["role"], line["task"]) == ("warn", "worker", 3), line
