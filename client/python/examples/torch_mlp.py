#!/usr/bin/env python3
"""Fashion-MNIST with a PyTorch model whose parameters live on the parameter servers: one
data-parallel worker.

The model is an ordinary torch.nn.Module. Each parameter is a variable on the servers (same
shape), initialized there (Glorot weights, zero biases; the module's own initial values are
replaced by the servers' at start). Every step runs forward and backward on a batch of this
worker's shard of the training set, then one Client.step: every `param.grad` is pushed, the
clock advances and the servers' new values come back straight into `param.data`, in one
request per server and with no copy of any tensor. The optimizer (Adam) runs on the servers,
so there is no torch.optim here.

The task comes from TF_CONFIG (as ps-local and Kubernetes set it) or from --task-index and
--num-workers; worker i trains on every N-th example from i. Log lines go to stderr like
ps-worker's (JSON lines without a terminal: step lines, `trained N steps ... samples/s`);
worker 0 waits for the others, evaluates the final model and prints one line on stdout:
`test_accuracy=... test_loss=... steps=... wall_s=... samples_per_s=...` (wall_s and
samples/s count training only, not evaluations). A run against variables that a previous
run trained continues from their values and says so (`resuming: ...`).

    ps-local --workers 2 --worker client/python/examples/torch_mlp.py -- --epochs 2
    PSD_LIBRARY=build/client/libpsclient.so python3 client/python/examples/torch_mlp.py \\
        --cluster '{"ps": ["127.0.0.1:2222"]}' --epochs 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fashion_mnist  # noqa: E402
import worker_support  # noqa: E402

import psd  # noqa: E402

try:
    import torch
    from torch import nn
except ImportError:
    worker_support.config_error(f"{sys.executable} has no PyTorch (Debian: apt-get install "
                                f"python3-torch; see client/python/README.md)")


def main(argv: List[str] | None = None) -> int:
    ap = fashion_mnist.example_parser(__doc__.split("\n\n")[0], epochs=2, prefix="torch_mlp")
    ap.add_argument("--step-call", action=argparse.BooleanOptionalAction, default=True,
                    help="one Client.step per training step (default); --no-step-call: one "
                    "push_pull_async per parameter, no clock")
    args = ap.parse_args(argv)
    task = worker_support.task_of(args)
    threads = worker_support.threads_for(args, task)
    if threads:
        torch.set_num_threads(threads)
    log = worker_support.Log(task, args.log_format)

    x_train, y_train, x_test, y_test = fashion_mnist.load_train_test(args.data_dir)
    x_shard, y_shard = fashion_mnist.shard(x_train, y_train, task.index, task.count)
    x_t, y_t = torch.from_numpy(x_shard), torch.from_numpy(y_shard)
    x_test_t, y_test_t = torch.from_numpy(x_test), torch.from_numpy(y_test)

    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    try:
        with psd.Client(task.cluster, worker_id=task.index, log_format=args.log_format) as client:
            return train(args, task, log, client, model, x_t, y_t, x_test_t, y_test_t,
                         threads)
    except psd.PsError as e:
        log("error", f"{type(e).__name__}: {e}")
        return 1


def train(args: argparse.Namespace, task: worker_support.Task, log: worker_support.Log,
          client: psd.Client, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
          x_test: torch.Tensor, y_test: torch.Tensor, threads: int) -> int:
    record = worker_support.RunRecord(client, args.prefix, task, log)
    record.log_start(args.prefix)
    pairs = []
    for i, (name, param) in enumerate(model.named_parameters()):
        # weights (out, in): Glorot on the servers; biases: zeros
        init = "glorot_uniform" if param.dim() == 2 else "zeros"
        var = client.create_variable(f"{args.prefix}/{name}", tuple(param.shape),
                                     initializer=init, seed=args.seed + i, optimizer="adam",
                                     learning_rate=args.lr, staleness=psd.STALENESS_ASYNC)
        var.pull(param.data)  # the module's own tensor receives the servers' values
        pairs.append((var, param))
    n = x.shape[0]
    batch, steps_per_epoch, meter = worker_support.run_plan(args, log, n)
    log.info(f"training {args.prefix} ({sum(p.numel() for p in model.parameters())} "
             f"parameters) on shard {task.index} of {task.count}: {n} examples, batch {batch}, "
             f"{torch.get_num_threads()} thread(s), "
             f"{'Client.step' if args.step_call else 'push_pull_async per parameter'}",
             shard=task.index, shards=task.count, examples=n, threads=torch.get_num_threads())
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(args.seed + task.index)
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n, generator=g)
        for start in range(0, steps_per_epoch * batch, batch):
            t0 = time.perf_counter()
            idx = order[start:start + batch]
            for _, param in pairs:
                param.grad = None
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            tc = time.perf_counter()
            if args.step_call:
                client.step([(var, param.grad, param.data) for var, param in pairs])
            else:
                futures = [var.push_pull_async(param.grad, param.data) for var, param in pairs]
                for f in futures:
                    f.result()
            t1 = time.perf_counter()
            meter.step(epoch, loss.item(), t1 - t0, t1 - tc)
        if task.index == 0 and epoch < args.epochs:  # not timed: evaluation is not training
            acc, test_loss = evaluate(model, x_test, y_test)
            worker_support.log_eval(log, meter, epoch, acc, test_loss, final=False)

    def evaluate_servers() -> Tuple[float, float]:  # what the servers hold
        for var, param in pairs:
            var.pull(param.data)
        return evaluate(model, x_test, y_test)

    return worker_support.finish_run(args, task, log, record, meter, evaluate_servers)


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Tuple[float, float]:
    with torch.no_grad():
        logits = model(x)
        loss = float(nn.functional.cross_entropy(logits, y))
        acc = float((logits.argmax(dim=1) == y).float().mean())
    return acc, loss


if __name__ == "__main__":
    sys.exit(main())
