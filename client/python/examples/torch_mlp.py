#!/usr/bin/env python3
"""Fashion-MNIST with a PyTorch model whose parameters live on the parameter servers.

The model is an ordinary torch.nn.Module. Each parameter is a variable on the servers (same
shape); every step pulls the servers' values straight into `param.data` and, after
`loss.backward()`, pushes `param.grad` (push_pull_async: the updated values come back into
`param.data`). No tensor is copied on the way: psd reads and writes the tensors' own CPU
memory. The optimizer (Adam) runs on the servers, so there is no torch.optim here.
Prints `test_accuracy=...` at the end.

    PSD_LIBRARY=build/client/libpsclient.so python3 client/python/examples/torch_mlp.py \\
        --cluster '{"ps": ["127.0.0.1:2222"]}' --epochs 2
"""

from __future__ import annotations

import os
import sys
import time
from typing import List

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fashion_mnist  # noqa: E402
import psd  # noqa: E402


def main(argv: List[str] | None = None) -> int:
    ap = fashion_mnist.example_parser(__doc__.split("\n\n")[0], epochs=2, prefix="torch_mlp")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    x_train, y_train, x_test, y_test = fashion_mnist.load_train_test(args.data_dir)
    x_train_t, y_train_t = torch.from_numpy(x_train), torch.from_numpy(y_train)
    x_test_t = torch.from_numpy(x_test)

    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    with psd.Client(fashion_mnist.cluster_of(args)) as client:
        pairs = []
        for i, (name, param) in enumerate(model.named_parameters()):
            # weights (out, in): Glorot on the servers; biases: zeros
            init = "glorot_uniform" if param.dim() == 2 else "zeros"
            var = client.create_variable(f"{args.prefix}/{name}", tuple(param.shape),
                                         initializer=init, seed=args.seed + i, optimizer="adam",
                                         learning_rate=args.lr, staleness=psd.STALENESS_ASYNC)
            var.pull(param.data)  # the module's own tensor receives the servers' values
            pairs.append((var, param))
        loss_fn = nn.CrossEntropyLoss()
        g = torch.Generator().manual_seed(args.seed)
        n = x_train_t.shape[0]
        t0 = time.monotonic()
        steps = 0
        for epoch in range(args.epochs):
            order = torch.randperm(n, generator=g)
            for start in range(0, n - args.batch + 1, args.batch):
                idx = order[start:start + args.batch]
                for _, param in pairs:
                    param.grad = None
                loss = loss_fn(model(x_train_t[idx]), y_train_t[idx])
                loss.backward()
                futures = [var.push_pull_async(param.grad, param.data) for var, param in pairs]
                for f in futures:
                    f.result()
                steps += 1
            acc = evaluate(model, x_test_t, y_test)
            print(f"epoch {epoch + 1}: loss={loss.item():.4f} test_accuracy={acc:.4f} "
                  f"elapsed_s={time.monotonic() - t0:.1f}", flush=True)
        for var, param in pairs:
            var.pull(param.data)
        acc = evaluate(model, x_test_t, y_test)
        print(f"test_accuracy={acc:.4f} steps={steps} wall_s={time.monotonic() - t0:.2f}")
    return 0


def evaluate(model: nn.Module, x: torch.Tensor, y: np.ndarray) -> float:
    with torch.no_grad():
        pred = model(x).argmax(dim=1).numpy()
    return float((pred == y).mean())


if __name__ == "__main__":
    sys.exit(main())
