"""psd.torch against real servers: initial values from the module (chief writes, others pull),
the attached model's values equal a hand-written SGD loop's exactly, overlapped and
post-backward pushes give the same values, refusals of parameters it cannot attach, the CUDA
staging path (skipped without CUDA). Skipped as a whole where torch is not installed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")

import psd  # noqa: E402
import psd.torch  # noqa: E402
from conftest import Cluster  # noqa: E402


def mlp(seed: int) -> "torch.nn.Module":
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def batches(n: int, seed: int = 7):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 20, generator=g), torch.randint(0, 3, (16,), generator=g))
            for _ in range(n)]


@pytest.fixture
def cluster2():
    """Two servers of the test's own: every test starts with no worker known to them (the
    staleness waits of one test never wait for another test's workers)."""
    c = Cluster(2)
    yield c
    c.stop()


def worker(cluster, index: int, **kw) -> psd.Client:
    return psd.Client(cluster.spec, use_env=False, deadline_ms=10000, worker_id=index,
                      split_threshold_bytes="1K", chunk_bytes="4K", **kw)


def values(model) -> dict:
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()}


def hand_sgd(model, data, lr: float) -> dict:
    """The servers' SGD, written out: w -= float32(lr) * g, in float32."""
    w = values(model)
    for x, y in data:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(torch.from_numpy(w[n]))
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for n, p in model.named_parameters():
            w[n] = w[n] - np.float32(lr) * p.grad.numpy()
    return w


def train(dist, model, data) -> None:
    for x, y in data:
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        dist.step()


@pytest.mark.parametrize("staleness", [psd.STALENESS_ASYNC, psd.STALENESS_BSP])
@pytest.mark.parametrize("overlap", [True, False])
def test_attached_sgd_equals_hand_loop(cluster2, uname, staleness, overlap):
    data = batches(6)
    expected = hand_sgd(mlp(1), data, 0.1)
    model = mlp(1)
    with worker(cluster2, 0) as c:
        dist = psd.torch.attach(c, model, optimizer="sgd", lr=0.1, staleness=staleness,
                                prefix=uname + "/", chief=True, overlap=overlap)
        # every parameter is a variable named after named_parameters(), 2 of them split
        assert sorted(dist.variables) == sorted(n for n, _ in model.named_parameters())
        assert dist.variables["0.weight"].name == uname + "/0.weight"
        assert dist.variables["0.weight"].num_shards == 2
        assert all(v.staleness_bound == staleness for v in dist.variables.values())
        train(dist, model, data)
        got = values(model)
        for n in expected:
            np.testing.assert_array_equal(got[n], expected[n], err_msg=n)
            # and the servers hold the same
            np.testing.assert_array_equal(dist.variables[n].pull(), expected[n], err_msg=n)
        dist.detach()


class _Probe(torch.autograd.Function):
    """Identity whose backward calls `seen()`: placed at the input, its backward runs after
    every parameter's gradient is computed but while backward() is still going on."""

    @staticmethod
    def forward(ctx, x, seen):
        ctx.seen = seen
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.seen()
        return g, None


@pytest.mark.parametrize("overlap,bucket_bytes", [(True, 0), (True, 4 << 20), (False, 0)])
def test_pushes_start_during_backward(cluster2, uname, overlap, bucket_bytes):
    """bucket_bytes=0: every push is in flight before backward() returns; a bucket larger than
    the model: every gradient is handed over during backward and waits for step()'s request
    (the late hooks' pushes go with it); overlap=False: nothing happens during backward."""
    model = mlp(1)
    (x, y), = batches(1)
    x.requires_grad_(True)
    with worker(cluster2, 0) as c:
        dist = psd.torch.attach(c, model, lr=0.1, prefix=uname + "/", chief=True,
                                staleness=psd.STALENESS_BSP, overlap=overlap,
                                bucket_bytes=bucket_bytes)
        seen = []
        probe = lambda: seen.extend((e.sent, e.grad is not None)  # noqa: E731
                                    for e in dist._entries)
        torch.nn.functional.cross_entropy(model(_Probe.apply(x, probe)), y).backward()
        if not overlap:
            assert seen == [(False, False)] * 4
        elif bucket_bytes == 0:
            assert seen == [(True, False)] * 4 and len(dist._ops) == 4  # sent, one by one
        else:
            assert seen == [(True, True)] * 4 and dist._ops == []  # in the open bucket
        calls = []
        real = c._step_raw
        c._step_raw = lambda items, *a: (calls.append(list(items)), real(items, *a))[1]
        dist.step()
        # step()'s one request pulls every variable and carries the gradients not yet sent
        assert len(calls) == 1 and len(calls[0]) == 4
        assert all(dst for _, _, _, _, dst in calls[0])
        assert all(bool(grad) == (bucket_bytes != 0 or not overlap)
                   for _, _, _, grad, _ in calls[0])
        dist.detach()


@pytest.mark.parametrize("staleness", [psd.STALENESS_ASYNC, psd.STALENESS_BSP])
def test_buckets_give_the_hand_loops_values(cluster2, uname, staleness):
    """Buckets smaller than the model: the gradients' pushes start during backward, a request
    per full bucket (push-pulls for asynchronous variables); the values are the hand loop's."""
    data = batches(3)
    expected = hand_sgd(mlp(1), data, 0.1)
    model = mlp(1)
    with worker(cluster2, 0) as c:
        # backward's order: 2.bias (3), 2.weight (96), 0.bias (32), 0.weight (640) floats
        dist = psd.torch.attach(c, model, optimizer="sgd", lr=0.1, staleness=staleness,
                                prefix=uname + "/", chief=True, bucket_bytes=400)
        for x, y in data:
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            # 2.bias, 2.weight and 0.bias (524 bytes), then 0.weight (2560) alone
            assert len(dist._ops) == 2
            dist.step()
        got = values(model)
        for n in expected:
            np.testing.assert_array_equal(got[n], expected[n], err_msg=n)
        with pytest.raises(ValueError, match="bucket_bytes"):
            psd.torch.attach(c, model, prefix=uname + "/", chief=True, bucket_bytes=-1)
        dist.detach()


def test_step_without_overlap_sends_gradients_with_the_pulls(cluster2, uname):
    """overlap=False, CPU parameters: step() makes one request carrying every gradient and
    every pull (one request per server) instead of pushes before a pull-only step; the
    values are the hand loop's."""
    data = batches(2)
    expected = hand_sgd(mlp(1), data, 0.1)
    model = mlp(1)
    with worker(cluster2, 0) as c:
        dist = psd.torch.attach(c, model, optimizer="sgd", lr=0.1, staleness=psd.STALENESS_BSP,
                                prefix=uname + "/", chief=True, overlap=False, bucket_bytes=0)
        calls = []
        real_step = c._step_raw
        c._step_raw = lambda items, *a: (calls.append(list(items)), real_step(items, *a))[1]
        train(dist, model, data)
        assert len(calls) == 2
        for items in calls:
            assert len(items) == 4
            assert all(grad and dst for _, _, _, grad, dst in items)
        got = values(model)
        for n in expected:
            np.testing.assert_array_equal(got[n], expected[n], err_msg=n)
        dist.detach()


def test_initial_values_come_from_the_module(cluster2, uname):
    chief_model = mlp(3)
    want = values(chief_model)
    other = mlp(4)  # other random values: must be replaced by the chief's
    assert not np.array_equal(values(other)["0.weight"], want["0.weight"])
    got: dict = {}
    errors: list = []

    def non_chief() -> None:
        try:
            with worker(cluster2, 1) as c:
                psd.torch.attach(c, other, lr=0.1, prefix=uname + "/", chief=False,
                                 init_timeout_s=30).detach()
                got.update(values(other))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    t = threading.Thread(target=non_chief)
    t.start()  # starts first: it waits for the chief's values
    import time
    time.sleep(0.3)
    with worker(cluster2, 0) as c:
        dist = psd.torch.attach(c, chief_model, lr=0.1, prefix=uname + "/", chief=True)
        assert dist.chief
        for n, v in dist.variables.items():
            np.testing.assert_array_equal(v.pull(), want[n], err_msg=n)
        dist.detach()
    t.join(60)
    assert not errors, errors
    for n in want:
        np.testing.assert_array_equal(got[n], want[n], err_msg=n)
    # the chief of a later run (servers holding the model) writes nothing: it resumes
    fresh = mlp(5)
    with worker(cluster2, 0) as c:
        psd.torch.attach(c, fresh, lr=0.1, prefix=uname + "/", chief=True).detach()
    for n, a in values(fresh).items():
        np.testing.assert_array_equal(a, want[n], err_msg=n)


def test_non_chief_without_chief_times_out(cluster2, uname):
    with worker(cluster2, 1) as c:
        with pytest.raises(psd.DeadlineExceededError, match="did not write the initial values"):
            psd.torch.attach(c, mlp(1), prefix=uname + "/", chief=False, init_timeout_s=0.3)


def test_is_chief_from_tf_config():
    assert psd.torch.is_chief("")
    assert psd.torch.is_chief('{"cluster":{"worker":["a:1","b:1"]},'
                              '"task":{"type":"worker","index":0}}')
    assert not psd.torch.is_chief('{"cluster":{"worker":["a:1","b:1"]},'
                                  '"task":{"type":"worker","index":1}}')
    assert not psd.torch.is_chief('{"cluster":{"chief":["c:1"],"worker":["a:1"]},'
                                  '"task":{"type":"worker","index":0}}')
    assert psd.torch.is_chief('{"cluster":{"chief":["c:1"]},"task":{"type":"chief","index":0}}')


def test_param_groups_and_hyper_parameters(cluster2, uname):
    model = mlp(1)
    with worker(cluster2, 0) as c:
        dist = psd.torch.attach(
            c, model, optimizer="sgd", lr=0.1, prefix=uname + "/", chief=True,
            param_groups=[{"params": [model[2].weight, model[2].bias], "optimizer": "adam",
                           "lr": 1e-3, "staleness": psd.STALENESS_ASYNC}])
        assert dist.variables["2.weight"].staleness_bound == psd.STALENESS_ASYNC
        dist.detach()
        # the same names with another optimizer are another spec: refused by the servers
        with pytest.raises(psd.AlreadyExistsError):
            psd.torch.attach(c, mlp(1), optimizer="adagrad", lr=0.1, prefix=uname + "/",
                             chief=True)
        with pytest.raises(ValueError, match="not a parameter of the module"):
            psd.torch.attach(c, mlp(1), prefix=uname + "/x/",
                             param_groups=[{"params": [torch.zeros(2, requires_grad=True)]}])
        with pytest.raises(TypeError, match="unknown argument 'lrate'"):
            psd.torch.attach(c, mlp(1), prefix=uname + "/y/", lrate=0.1)


def test_two_backwards_in_one_step_are_refused(cluster2, uname):
    model = mlp(1)
    (x, y), = batches(1)
    with worker(cluster2, 0) as c:
        dist = psd.torch.attach(c, model, lr=0.1, prefix=uname + "/", chief=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        with pytest.raises(RuntimeError, match="accumulated again"):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        dist.step()
        dist.detach()


def test_refuses_parameters_it_cannot_attach(cluster2, uname):
    with worker(cluster2, 0) as c:
        with pytest.raises(TypeError, match=r"parameter '0.weight' is torch.float64"):
            psd.torch.attach(c, mlp(1).double(), prefix=uname + "/")
        meta = torch.nn.Linear(3, 2, device="meta")
        with pytest.raises(ValueError, match=r"parameter 'weight' is on meta"):
            psd.torch.attach(c, meta, prefix=uname + "/")
        with pytest.raises(ValueError, match="no parameters"):
            psd.torch.attach(c, torch.nn.ReLU(), prefix=uname + "/")


def test_cuda_tensor_refused_by_plain_variables(client, uname):
    """Variable.push/pull take CPU tensors only; a GPU tensor is refused by name of its
    device (psd.torch stages CUDA tensors itself)."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available: no CUDA tensor can be made to be refused")
    v = client.create_variable(uname, (4,))
    with pytest.raises(ValueError, match="cuda"):
        v.push(torch.ones(4, device="cuda"))


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="CUDA is not available (torch.cuda.is_available() is False): the "
                           "pinned-buffer staging of CUDA parameters is not exercised")
def test_cuda_parameters_staged_through_pinned_buffers(cluster2, uname):
    data = batches(4)
    expected = hand_sgd(mlp(1), data, 0.1)
    model = mlp(1).cuda()
    with worker(cluster2, 0) as c:
        dist = psd.torch.attach(c, model, lr=0.1, prefix=uname + "/", chief=True)
        for x, y in data:
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
            dist.step()
        torch.cuda.synchronize()
        for n, p in model.named_parameters():
            # the GPU's GEMMs round differently from the CPU's: close, not equal
            np.testing.assert_allclose(p.detach().cpu().numpy(), expected[n], rtol=1e-4,
                                       atol=1e-5)
        dist.detach()
