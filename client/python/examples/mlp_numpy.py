#!/usr/bin/env python3
"""Fashion-MNIST with a multi-layer perceptron computed in NumPy, its parameters on the
parameter servers: one data-parallel worker.

Each step: forward and backward on a batch of this worker's shard in NumPy, then one
Client.step: every layer's gradient is pushed, the clock advances and the servers' new
parameters (after Adam) come straight back into the layer's own arrays, in one request per
server, with no copy. With --no-step-call each layer's gradient is pushed as soon as the
backward pass has computed it instead (push_pull_async per variable, no clock).

The task comes from TF_CONFIG or --task-index/--num-workers, as in torch_mlp.py; so do the
log lines on stderr, worker 0's final `test_accuracy=...` line on stdout and the `resuming:`
line of a run against variables an earlier run trained. NumPy's BLAS gets one thread when
several workers share the machine (--threads; OPENBLAS_NUM_THREADS, if set, wins).

    ps-local --workers 2 --worker client/python/examples/mlp_numpy.py -- --epochs 3
    PSD_LIBRARY=build/client/libpsclient.so python3 client/python/examples/mlp_numpy.py \\
        --cluster '{"ps": ["127.0.0.1:2222"]}' --epochs 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import worker_support  # noqa: E402

np: Any = None  # NumPy, imported once the thread count is set


def main(argv: List[str] | None = None) -> int:
    global np
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    worker_support.add_worker_flags(ap, epochs=3, prefix="mlp_numpy")
    ap.add_argument("--layers", default="784,256,128,10")
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--step-call", action=argparse.BooleanOptionalAction, default=True,
                    help="one Client.step per training step (default); --no-step-call: "
                    "push_pull_async per variable as the backward pass goes, no clock")
    args = ap.parse_args(argv)
    task = worker_support.task_of(args)
    threads = worker_support.threads_for(args, task)
    if threads:  # read by OpenBLAS and OpenMP when NumPy loads them
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
            os.environ.setdefault(var, str(threads))
    import numpy
    np = numpy
    import fashion_mnist

    import psd

    log = worker_support.Log(task, args.log_format)
    try:
        sizes = [int(s) for s in args.layers.split(",")]
    except ValueError:
        worker_support.config_error(f"--layers {args.layers}: expected comma-separated "
                                    f"sizes")
    x_train, y_train, x_test, y_test = fashion_mnist.load_train_test(args.data_dir)
    if sizes[0] != x_train.shape[1]:
        worker_support.config_error(f"--layers: the first size must be {x_train.shape[1]} "
                                    f"(pixels), not {sizes[0]}")
    x, y = fashion_mnist.shard(x_train, y_train, task.index, task.count)
    try:
        with psd.Client(task.cluster, worker_id=task.index, log_format=args.log_format) as client:
            return train(args, task, log, client, sizes, x, y, x_test, y_test, psd)
    except psd.PsError as e:
        log("error", f"{type(e).__name__}: {e}")
        return 1


def train(args: argparse.Namespace, task: worker_support.Task, log: worker_support.Log,
          client: Any, sizes: List[int], x: Any, y: Any, x_test: Any, y_test: Any,
          psd: Any) -> int:
    record = worker_support.RunRecord(client, args.prefix, task, log)
    record.log_start(args.prefix)
    weights, biases, W, b = [], [], [], []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        common = dict(optimizer=args.optimizer, learning_rate=args.lr,
                      staleness=psd.STALENESS_ASYNC)
        weights.append(client.create_variable(f"{args.prefix}/dense{i}/w", (n_in, n_out),
                                              initializer="glorot_uniform",
                                              seed=args.seed + i, **common))
        biases.append(client.create_variable(f"{args.prefix}/dense{i}/b", (n_out,), **common))
        W.append(weights[-1].pull())  # the arrays the servers' values land in
        b.append(biases[-1].pull())
    layers = len(W)
    n = x.shape[0]
    batch, steps_per_epoch, meter = worker_support.run_plan(args, log, n)
    log.info(f"training {args.prefix} (layers {args.layers}) on shard {task.index} of "
             f"{task.count}: {n} examples, batch {batch}, "
             f"{os.environ.get('OPENBLAS_NUM_THREADS', 'default')} BLAS thread(s), "
             f"{'Client.step' if args.step_call else 'push_pull_async per variable'}",
             shard=task.index, shards=task.count, examples=n)
    rng = np.random.default_rng(args.seed + task.index)
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(n)
        for start in range(0, steps_per_epoch * batch, batch):
            t0 = time.perf_counter()
            idx = order[start:start + batch]
            xb, yb = x[idx], y[idx]
            # forward
            acts = [xb]
            for i in range(layers):
                z = acts[-1] @ W[i] + b[i]
                acts.append(np.maximum(z, 0.0, out=z) if i < layers - 1 else z)
            logits = acts[-1]
            logits -= logits.max(axis=1, keepdims=True)
            p = np.exp(logits)
            p /= p.sum(axis=1, keepdims=True)
            loss = float(-np.log(p[np.arange(len(yb)), yb] + 1e-12).mean())
            # backward
            d = p
            d[np.arange(len(yb)), yb] -= 1.0
            d /= np.float32(len(yb))
            items, futures = [], []
            tc = 0.0
            for i in reversed(range(layers)):
                gw = acts[i].T @ d
                gb = d.sum(axis=0)
                if i > 0:
                    d = d @ W[i].T  # uses W[i] before its new values arrive
                    d *= acts[i] > 0
                if args.step_call:
                    items += [(weights[i], gw, W[i]), (biases[i], gb, b[i])]
                else:  # pushed as soon as it is known
                    tp = time.perf_counter()
                    futures.append(weights[i].push_pull_async(gw, W[i]))
                    futures.append(biases[i].push_pull_async(gb, b[i]))
                    tc += time.perf_counter() - tp
            tp = time.perf_counter()
            if args.step_call:
                client.step(items)
            for f in futures:
                f.result()
            t1 = time.perf_counter()
            meter.step(epoch, loss, t1 - t0, tc + t1 - tp)
        if task.index == 0 and epoch < args.epochs:  # not timed: evaluation is not training
            acc, test_loss = evaluate(W, b, x_test, y_test)
            worker_support.log_eval(log, meter, epoch, acc, test_loss, final=False)

    def evaluate_servers() -> Tuple[float, float]:  # what the servers hold
        for i in range(layers):
            weights[i].pull(W[i])
            biases[i].pull(b[i])
        return evaluate(W, b, x_test, y_test)

    return worker_support.finish_run(args, task, log, record, meter, evaluate_servers)


def evaluate(W: List[Any], b: List[Any], x: Any, y: Any) -> Tuple[float, float]:
    h = x
    for i in range(len(W)):
        h = h @ W[i] + b[i]
        if i < len(W) - 1:
            np.maximum(h, 0.0, out=h)
    h -= h.max(axis=1, keepdims=True)
    logp = h - np.log(np.exp(h).sum(axis=1, keepdims=True))
    loss = float(-logp[np.arange(len(y)), y].mean())
    return float((h.argmax(axis=1) == y).mean()), loss


if __name__ == "__main__":
    sys.exit(main())
