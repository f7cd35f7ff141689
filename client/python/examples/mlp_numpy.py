#!/usr/bin/env python3
"""Fashion-MNIST with a multi-layer perceptron computed in NumPy, its parameters on the
parameter servers.

Each step: forward and backward on a batch in NumPy; each layer's gradient is pushed as soon
as the backward pass has computed it (push_pull_async: the servers apply Adam and send the
new parameters straight back into the layer's own arrays, no copy); the next step starts when
every transfer is done. Prints `test_accuracy=...` at the end.

    PSD_LIBRARY=build/client/libpsclient.so python3 client/python/examples/mlp_numpy.py \\
        --cluster '{"ps": ["127.0.0.1:2222"]}' --epochs 3
"""

from __future__ import annotations

import os
import sys
import time
from typing import List

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fashion_mnist  # noqa: E402
import psd  # noqa: E402


def main(argv: List[str] | None = None) -> int:
    ap = fashion_mnist.example_parser(__doc__.split("\n\n")[0], epochs=3, prefix="mlp_numpy")
    ap.add_argument("--layers", default="784,256,128,10")
    ap.add_argument("--optimizer", default="adam")
    args = ap.parse_args(argv)

    x_train, y_train, x_test, y_test = fashion_mnist.load_train_test(args.data_dir)
    sizes = [int(s) for s in args.layers.split(",")]
    if sizes[0] != x_train.shape[1]:
        sys.exit(f"--layers: the first size must be {x_train.shape[1]} (pixels), not {sizes[0]}")

    with psd.Client(fashion_mnist.cluster_of(args)) as client:
        weights, biases, W, b = [], [], [], []
        for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            common = dict(optimizer=args.optimizer, learning_rate=args.lr,
                          staleness=psd.STALENESS_ASYNC)
            weights.append(client.create_variable(f"{args.prefix}/dense{i}/w", (n_in, n_out),
                                                  initializer="glorot_uniform",
                                                  seed=args.seed + i, **common))
            biases.append(client.create_variable(f"{args.prefix}/dense{i}/b", (n_out,),
                                                 **common))
            W.append(weights[-1].pull())  # the arrays the servers' values land in
            b.append(biases[-1].pull())
        layers = len(W)
        rng = np.random.default_rng(args.seed)
        n = x_train.shape[0]
        t0 = time.monotonic()
        comm = 0.0
        steps = 0
        for epoch in range(args.epochs):
            order = rng.permutation(n)
            loss_sum = 0.0
            for start in range(0, n - args.batch + 1, args.batch):
                idx = order[start:start + args.batch]
                xb, yb = x_train[idx], y_train[idx]
                # forward
                acts = [xb]
                for i in range(layers):
                    z = acts[-1] @ W[i] + b[i]
                    acts.append(np.maximum(z, 0.0, out=z) if i < layers - 1 else z)
                logits = acts[-1]
                logits -= logits.max(axis=1, keepdims=True)
                p = np.exp(logits)
                p /= p.sum(axis=1, keepdims=True)
                loss_sum += float(-np.log(p[np.arange(len(yb)), yb] + 1e-12).mean())
                # backward, pushing each layer's gradient as soon as it is known
                d = p
                d[np.arange(len(yb)), yb] -= 1.0
                d /= np.float32(len(yb))
                futures = []
                for i in reversed(range(layers)):
                    gw = acts[i].T @ d
                    gb = d.sum(axis=0)
                    if i > 0:
                        d = d @ W[i].T  # uses W[i] before its new values arrive
                        d *= acts[i] > 0
                    futures.append(weights[i].push_pull_async(gw, W[i]))
                    futures.append(biases[i].push_pull_async(gb, b[i]))
                tc = time.monotonic()
                for f in futures:
                    f.result()
                comm += time.monotonic() - tc
                steps += 1
            batches = max(1, n // args.batch)
            acc = evaluate(W, b, x_test, y_test)
            print(f"epoch {epoch + 1}: train_loss={loss_sum / batches:.4f} "
                  f"test_accuracy={acc:.4f} elapsed_s={time.monotonic() - t0:.1f}", flush=True)
        wall = time.monotonic() - t0
        for i in range(layers):  # evaluate what the servers hold
            weights[i].pull(W[i])
            biases[i].pull(b[i])
        acc = evaluate(W, b, x_test, y_test)
        print(f"test_accuracy={acc:.4f} steps={steps} wall_s={wall:.2f} "
              f"comm_ms_per_step={1000 * comm / max(steps, 1):.2f}")
    return 0


def evaluate(W, b, x: np.ndarray, y: np.ndarray) -> float:
    h = x
    for i in range(len(W)):
        h = h @ W[i] + b[i]
        if i < len(W) - 1:
            np.maximum(h, 0.0, out=h)
    return float((h.argmax(axis=1) == y).mean())


if __name__ == "__main__":
    sys.exit(main())
