"""psd.torch.Embedding and EmbeddingBag against real servers: forward equals torch's modules on
the same rows (sum and mean, 1-D input with offsets and 2-D input, per_sample_weights,
duplicate and negative ids), one backward with the table's SGD gives torch.optim.SGD's rows,
the push happens once per forward, refusals of bad inputs, a small model trains, and CUDA
ids (skipped without CUDA). Skipped as a whole where torch is not installed."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (Debian: python3-torch)")

import psd  # noqa: E402
import psd.torch  # noqa: E402
from conftest import Cluster  # noqa: E402

# the table's ids, negative and large ones too; torch's module sees id IDS[k] as index k
IDS = np.array([-7, 0, 3, 11, 2**40, -2**62, 99, 5], dtype=np.int64)
LR = 0.25


def as_table_ids(idx: "torch.Tensor") -> "torch.Tensor":
    return torch.from_numpy(IDS)[idx]


def reference(cls, t: psd.Table, **kw):
    """torch's module holding the table's rows of IDS (pulled: the initializer's rows)."""
    m = cls(len(IDS), t.dim, **kw)
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(t.pull(IDS)))
    return m


# (input, offsets) in torch's indices into IDS: duplicates within a bag and across bags,
# an empty bag, and 2-D fixed-size bags
BAGS_1D = (torch.tensor([2, 2, 0, 5, 7, 2, 1, 1, 1, 4, 6], dtype=torch.int64),
           torch.tensor([0, 3, 5, 5, 9], dtype=torch.int64))
BAGS_2D = (torch.tensor([[2, 5, 2], [0, 7, 5], [3, 3, 3], [6, 2, 4]], dtype=torch.int64), None)


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("shape", ["1d", "2d"])
def test_embedding_bag_equals_torch(client, uname, mode, shape):
    bag = psd.torch.EmbeddingBag(client, uname, embedding_dim=6, mode=mode, optimizer="sgd",
                                 lr=LR, initializer="normal", init_a=0.0, init_b=1.0, seed=5)
    assert bag.embedding_dim == 6 and list(bag.parameters()) == []
    ref = reference(torch.nn.EmbeddingBag, bag.table, mode=mode)
    init = bag.table.pull(IDS)
    idx, offsets = BAGS_1D if shape == "1d" else BAGS_2D
    out = bag(as_table_ids(idx), offsets)
    want = ref(idx, offsets)
    assert out.shape == want.shape and out.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    # one backward: the table's SGD updates the rows as torch.optim.SGD does torch's weight
    g = torch.Generator().manual_seed(3)
    upstream = torch.randn(want.shape, generator=g)
    (out * upstream).sum().backward()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    opt.zero_grad()
    (want * upstream).sum().backward()
    opt.step()
    bag.flush()  # backward's push, started without waiting
    rows = bag.table.pull(IDS)
    np.testing.assert_allclose(rows, ref.weight.detach().numpy(), rtol=0, atol=1e-6)
    # the rows in the batch moved, the others did not
    used = set(idx.reshape(-1).tolist())
    for k in range(len(IDS)):
        assert np.array_equal(rows[k], init[k]) == (k not in used), k
    # the next forward pulls the updated rows
    torch.testing.assert_close(bag(as_table_ids(idx), offsets), ref(idx, offsets),
                               rtol=0, atol=1e-6)


def test_embedding_bag_per_sample_weights_and_int32(client, uname):
    bag = psd.torch.EmbeddingBag(client, uname, embedding_dim=4, mode="sum", lr=LR, seed=9)
    ref = reference(torch.nn.EmbeddingBag, bag.table, mode="sum")
    idx, offsets = BAGS_1D
    w = torch.linspace(-1.0, 2.0, idx.numel())
    out = bag(as_table_ids(idx), offsets.int(), w)  # int32 offsets are taken as int64
    want = ref(idx, offsets, w)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-6)
    out.sum().backward()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    want.sum().backward()
    opt.step()
    bag.flush()
    np.testing.assert_allclose(bag.table.pull(IDS), ref.weight.detach().numpy(), rtol=0,
                               atol=1e-6)
    # int32 ids are taken as int64
    small = torch.tensor([[1, 2], [2, 3]], dtype=torch.int32)
    torch.testing.assert_close(bag(small), bag(small.long()), rtol=0, atol=0)


def test_embedding_equals_torch(client, uname):
    emb = psd.torch.Embedding(client, uname, embedding_dim=5, lr=LR, initializer="uniform",
                              init_a=-1.0, init_b=1.0, seed=2)
    ref = reference(torch.nn.Embedding, emb.table)
    idx = torch.tensor([[2, 5, 2, 0], [7, 7, 1, 5], [6, 2, 2, 2]], dtype=torch.int64)
    out = emb(as_table_ids(idx))
    want = ref(idx)
    assert out.shape == (3, 4, 5)
    torch.testing.assert_close(out, want, rtol=0, atol=0)  # a gather: the rows themselves
    upstream = torch.randn(want.shape, generator=torch.Generator().manual_seed(1))
    (out * upstream).sum().backward()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    (want * upstream).sum().backward()
    opt.step()
    emb.flush()
    np.testing.assert_allclose(emb.table.pull(IDS), ref.weight.detach().numpy(), rtol=0,
                               atol=1e-6)
    # 1-D input and no grad: rows pulled, nothing pushed
    before = emb.table.pull(IDS)
    with torch.no_grad():
        torch.testing.assert_close(emb(as_table_ids(torch.tensor([3, 3, 4]))),
                                   torch.from_numpy(before[[3, 3, 4]]), rtol=0, atol=0)
    np.testing.assert_array_equal(emb.table.pull(IDS), before)


def test_push_once_per_forward(client, uname):
    emb = psd.torch.Embedding(client, uname, embedding_dim=2, lr=1.0, initializer="zeros")
    ids = torch.tensor([4, 4, -1])
    out = emb(ids)
    # the output used twice in the graph: the gradients are summed, then pushed once
    (out.sum() + 2 * out.sum()).backward(retain_graph=True)
    emb.flush()
    np.testing.assert_array_equal(emb.table.pull(np.array([4, -1], np.int64)),
                                  [[-6, -6], [-3, -3]])
    with pytest.raises(RuntimeError, match="already pushed"):
        out.sum().backward()
    np.testing.assert_array_equal(emb.table.pull(np.array([4, -1], np.int64)),
                                  [[-6, -6], [-3, -3]])


def test_prefetch_and_pushes_without_waiting(client, uname):
    """backward's push returns at once (flush() or the next forward waits for it);
    prefetch(x) starts the pull of x's rows after the pushes, forward(x) takes them; a
    forward of other ids pulls its own."""
    emb = psd.torch.Embedding(client, uname, embedding_dim=3, lr=1.0, initializer="zeros")
    a, b = torch.tensor([5, 1, 5]), torch.tensor([[2, 1]])
    emb(a).sum().backward()
    assert len(emb._pushes) == 1
    emb.prefetch(a)  # waits for the push: the prefetched rows hold it
    assert emb._pushes == []
    with torch.no_grad():
        out = emb(a)
    np.testing.assert_array_equal(out.numpy(), [[-2] * 3, [-1] * 3, [-2] * 3])
    emb.prefetch(a)
    out = emb(b)  # not the prefetched ids: its own pull, the prefetch dropped
    np.testing.assert_array_equal(out.detach().numpy(), [[[0] * 3, [-1] * 3]])
    assert emb._prefetched is None
    out.sum().backward()
    emb.flush()
    np.testing.assert_array_equal(emb.table.pull(np.array([5, 1, 2], np.int64)),
                                  [[-2] * 3, [-2] * 3, [-1] * 3])
    # an empty batch prefetched: nothing to pull
    emb.prefetch(torch.zeros(0, dtype=torch.int64))
    assert emb(torch.zeros(0, dtype=torch.int64)).shape == (0, 3)


def test_table_push_and_pull_futures(client, uname):
    t = client.create_table(uname, 2, optimizer="sgd", learning_rate=1.0)
    ids = np.array([3, -4], np.int64)
    assert t.push_async(ids, np.ones((2, 2), np.float32)).result() is None
    out = np.zeros((2, 2), np.float32)
    assert t.pull_async(ids, out).result() is out
    np.testing.assert_array_equal(out, -np.ones((2, 2)))
    np.testing.assert_array_equal(t.pull_async(ids[:1]).result(), [[-1, -1]])
    with pytest.raises(ValueError, match="grads has 2 float32 elements"):
        t.push_async(ids, np.ones(2, np.float32))


def test_existing_table_and_errors(client, uname):
    with pytest.raises(psd.NotFoundError):
        psd.torch.Embedding(client, uname)  # no embedding_dim: the table must exist
    client.create_table(uname, 3, optimizer="adagrad", learning_rate=0.1)
    emb = psd.torch.EmbeddingBag(client, uname, mode="sum")
    assert emb.embedding_dim == 3
    with pytest.raises(TypeError, match="without embedding_dim"):
        psd.torch.Embedding(client, uname, lr=0.5)
    with pytest.raises(psd.AlreadyExistsError):
        psd.torch.Embedding(client, uname, embedding_dim=4)
    with pytest.raises(ValueError, match="mode must be one of 'sum', 'mean', not 'max'"):
        psd.torch.EmbeddingBag(client, uname + "/m", embedding_dim=2, mode="max")
    with pytest.raises(ValueError, match="embedding_dim"):
        psd.torch.Embedding(client, uname + "/d", embedding_dim=0)
    with pytest.raises(TypeError, match="padding_idx .* is not supported"):
        psd.torch.Embedding(client, uname + "/p", embedding_dim=2, padding_idx=0)
    with pytest.raises(ValueError, match="num_embeddings"):
        psd.torch.Embedding(client, uname + "/n", -3, 2)
    with pytest.raises(TypeError, match="int64"):
        emb(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(TypeError, match="torch.Tensor"):
        emb([[1, 2]])
    with pytest.raises(ValueError, match="needs offsets"):
        emb(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="offsets must be None"):
        emb(torch.tensor([[1, 2]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="1-D .* or 2-D"):
        emb(torch.zeros((1, 2, 2), dtype=torch.int64))
    with pytest.raises(ValueError, match=r"offsets\[0\] must be 0"):
        emb(torch.tensor([1, 2]), torch.tensor([1]))
    with pytest.raises(ValueError, match="must not decrease"):
        emb(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1]))
    with pytest.raises(ValueError, match="past the input"):
        emb(torch.tensor([1, 2]), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="per_sample_weights has shape"):
        emb(torch.tensor([[1, 2]]), None, torch.ones(3))
    mean = psd.torch.EmbeddingBag(client, uname, mode="mean")
    with pytest.raises(ValueError, match="need mode 'sum'"):
        mean(torch.tensor([[1, 2]]), None, torch.ones(1, 2))
    bounded = psd.torch.Embedding(client, uname, 10)
    with pytest.raises(IndexError, match=r"id 10 is out of range \[0, 10\)"):
        bounded(torch.tensor([0, 10]))
    with pytest.raises(IndexError, match="id -1"):
        bounded(torch.tensor([-1]))
    assert bounded(torch.tensor([9, 0])).shape == (2, 3)
    # an empty batch: empty bags pool to zeros, nothing pushed
    out = emb(torch.zeros(0, dtype=torch.int64), torch.tensor([0, 0]))
    assert out.shape == (2, 3) and not out.any()
    out.sum().backward()


def test_small_model_trains(uname):
    """EmbeddingBag (table on the servers) + Linear (attached) learn a logistic ground truth:
    y ~ Bernoulli(sigmoid(sum of the bag's ids' true weights))."""
    cluster = Cluster(2)
    try:
        with psd.Client(cluster.spec, use_env=False, deadline_ms=10000, worker_id=0) as c:
            g = torch.Generator().manual_seed(11)
            n_ids = 40
            true_w = torch.randn(n_ids, generator=g) * 2.0
            id_map = torch.arange(n_ids) * 1000 - 20000  # table ids, negative ones too

            class Model(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.bag = psd.torch.EmbeddingBag(c, uname + "/emb", embedding_dim=4,
                                                      mode="sum", lr=0.2, init_b=0.1, seed=1)
                    torch.manual_seed(0)
                    self.out = torch.nn.Linear(4, 1)

                def forward(self, x):
                    return self.out(self.bag(id_map[x])).squeeze(1)

            model = Model()
            dist = psd.torch.attach(c, model, optimizer="sgd", lr=0.2, staleness=-1,
                                    prefix=uname + "/dense/", chief=True)
            assert sorted(dist.variables) == ["out.bias", "out.weight"]
            losses = []
            for _ in range(150):
                x = torch.randint(0, n_ids, (32, 3), generator=g)
                y = (torch.rand(32, generator=g) < torch.sigmoid(true_w[x].sum(1))).float()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
                model.zero_grad()
                loss.backward()
                dist.step()
                losses.append(loss.item())
            first, last = np.mean(losses[:20]), np.mean(losses[-20:])
            assert last < first - 0.1, (first, last)
            dist.detach()
    finally:
        cluster.stop()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="CUDA is not available (torch.cuda.is_available() is False): the "
                           "embedding modules' CUDA path is not exercised")
def test_cuda_ids(client, uname):
    bag = psd.torch.EmbeddingBag(client, uname, embedding_dim=4, mode="mean", lr=LR, seed=4)
    ref = reference(torch.nn.EmbeddingBag, bag.table, mode="mean")
    idx, offsets = BAGS_1D
    out = bag(as_table_ids(idx).cuda(), offsets.cuda())
    assert out.device.type == "cuda"
    want = ref(idx, offsets)
    torch.testing.assert_close(out.cpu(), want, rtol=0, atol=1e-6)
    out.sum().backward()
    opt = torch.optim.SGD(ref.parameters(), lr=LR)
    want.sum().backward()
    opt.step()
    bag.flush()
    np.testing.assert_allclose(bag.table.pull(IDS), ref.weight.detach().numpy(), rtol=0,
                               atol=1e-6)


def test_embedding_warm(client, uname):
    # warm(): a TablePrefetch of the coming batch's ids, not waited for; a table all in RAM
    # does nothing, and forward gives the same rows as without it
    emb = psd.torch.Embedding(client, uname, embedding_dim=4, initializer="constant",
                              init_a=0.5)
    x = torch.tensor([[1, 2], [2, 9]], dtype=torch.int64)
    emb.warm(x)
    emb.warm(x)  # waits for the previous one first
    out = emb(x)
    assert out.shape == (2, 2, 4)
    torch.testing.assert_close(out, torch.full((2, 2, 4), 0.5), rtol=0, atol=0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        emb.warm([1, 2])
