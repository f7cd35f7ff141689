#!/usr/bin/env python3
"""Fashion-MNIST with an ordinary PyTorch training loop moved onto the parameter servers with
psd.torch: two changed lines (attach instead of a torch optimizer, dist.step() instead of
opt.step()).

The module keeps its own initial values (torch's default init, seeded): the chief (worker 0)
writes them to the servers, the other workers wait for them and pull. A hook hands each
gradient over as soon as backward has produced it (pushed during backward once a bucket of
them is full; this model's 0.9 MB fit in one bucket, so they go with the step's own request);
dist.step() pushes what is left, advances the clock and brings the new parameters into the
module, in one request per server. The optimizer (Adam) runs on the servers.
Default staleness 0 (BSP: every step applies the gradients of all workers at once).

The task comes from TF_CONFIG (as ps-local and Kubernetes set it); worker i of N trains on
every N-th example from i. Progress goes to stderr; worker 0 evaluates the final model and
prints one line on stdout: `test_accuracy=... steps=... wall_s=... samples_per_s=...`.

    ps-local --workers 2 --worker client/python/examples/torch_attach.py -- --epochs 1

With --logdir DIR, each worker writes TensorBoard event files into DIR/worker-<i>: psd's own
figures (psd.torch.attach(..., logdir=DIR)) and the training loss and, on worker 0, the test
accuracy (through the same writer, dist.events); `tensorboard --logdir DIR` shows them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fashion_mnist  # noqa: E402

import psd  # noqa: E402

try:
    import torch
    from torch import nn
except ImportError:
    print(f"{sys.executable} has no PyTorch (Debian: apt-get install python3-torch)",
          file=sys.stderr)
    sys.exit(2)
import psd.torch  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--staleness", type=int, default=0, help="0 BSP, s > 0 SSP, -1 async")
    ap.add_argument("--no-overlap", action="store_true",
                    help="push after backward instead of from the gradient hooks")
    ap.add_argument("--prefix", default="torch_attach/")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--data-dir", default=fashion_mnist.DEFAULT_DIR)
    ap.add_argument("--logdir", default=None, help="TensorBoard event files in DIR/worker-<i>")
    args = ap.parse_args()

    tf = json.loads(os.environ.get("TF_CONFIG") or "{}")
    task = tf.get("task", {"type": "worker", "index": 0})
    index = int(task.get("index", 0))
    count = len(tf.get("cluster", {}).get("worker", [])) or 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    x_train, y_train, x_test, y_test = fashion_mnist.load_train_test(args.data_dir)
    x, y = fashion_mnist.shard(x_train, y_train, index, count)
    x, y = torch.from_numpy(x), torch.from_numpy(y)

    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    with psd.Client(worker_id=index) as client:
        # instead of: opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        dist = psd.torch.attach(client, model, optimizer="adam", lr=args.lr,
                                staleness=args.staleness, prefix=args.prefix,
                                overlap=not args.no_overlap, logdir=args.logdir)
        loss_fn = nn.CrossEntropyLoss()
        g = torch.Generator().manual_seed(args.seed + index)
        steps = len(x) // args.batch
        t0 = time.perf_counter()
        for epoch in range(args.epochs):
            order = torch.randperm(len(x), generator=g)
            for s in range(steps):
                idx = order[s * args.batch:(s + 1) * args.batch]
                model.zero_grad()
                loss = loss_fn(model(x[idx]), y[idx])
                loss.backward()
                clock = dist.step()  # instead of: opt.step()
                if dist.events is not None and clock % 10 == 0:
                    dist.events.add_scalar("train/loss", loss.item(), clock)
                if s % 100 == 0:
                    print(f"worker {index} epoch {epoch + 1} step {s}/{steps} "
                          f"loss {loss.item():.4f}", file=sys.stderr, flush=True)
        wall = time.perf_counter() - t0
        n = steps * args.epochs
        print(f"worker {index} trained {n} steps in {wall:.2f} s, "
              f"{n * args.batch / wall:.1f} samples/s", file=sys.stderr, flush=True)
        dist.detach()
        if index != 0:
            return 0
        dist.pull()  # what the servers hold now
        with torch.no_grad():
            logits = model(torch.from_numpy(x_test))
            acc = float((logits.argmax(1) == torch.from_numpy(y_test)).float().mean())
        if dist.events is not None:
            dist.events.add_scalar("test/accuracy", acc, n)
            dist.events.close()
        print(f"test_accuracy={acc:.4f} steps={n} wall_s={wall:.2f} "
              f"samples_per_s={n * args.batch / wall:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
