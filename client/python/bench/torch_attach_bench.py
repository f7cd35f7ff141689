#!/usr/bin/env python3
"""Benchmarks of psd.torch (results in bench/RESULTS.md, "PyTorch: psd.torch").

overlap: a wide MLP (784-4096-4096-10, 20.1 M parameters) on one worker and one ps-server on
    loopback. Times per step (median; the modes take turns, --steps each per round, over
    --rounds, so that they share the machine's load): forward+backward alone (no psd), attached with pushes from the gradient hooks (overlap), attached with every push
    after backward (sequential). Communication = sequential - compute; hidden share =
    (sequential - overlap) / communication.

ddp: the Fashion-MNIST MLP (784-256-128-10, Adam lr 1e-3, batch 128 per worker) as 2 workers:
    psd.torch through ps-local (1 ps, BSP; through the extension module psd._ext and through
    ctypes, PSD_EXTENSION=off) against torch DistributedDataParallel (gloo, CPU), same shards,
    same epochs, in paired rounds (--repeat; each round runs every mode once, in an order that
    turns by one each round):
    samples/s per worker and test accuracy, each mode's ratio to DDP per round and the medians.

    PSD_LIBRARY=build/client/libpsclient.so /usr/bin/python3 \\
        client/python/bench/torch_attach_bench.py overlap --server build/server/ps-server
    /usr/bin/python3 client/python/bench/torch_attach_bench.py ddp \\
        --ps-local build/deploy/local/ps-local --epochs 2
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def overlap(args: argparse.Namespace) -> None:
    import torch
    import psd
    import psd.torch
    torch.set_num_threads(args.threads)
    port = free_port()
    spec = {"ps": [f"127.0.0.1:{port}"]}
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": spec,
                                                  "task": {"type": "ps", "index": 0}}))
    srv = subprocess.Popen([args.server, "--log-level", "warn"], env=env)
    try:
        time.sleep(0.5)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(784, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 10))
        x = torch.randn(args.batch, 784)
        y = torch.randint(0, 10, (args.batch,))
        loss_fn = torch.nn.CrossEntropyLoss()

        def timed(step, n: int) -> list:
            ts = []
            for i in range(1 + n):  # one warm-up step
                t0 = time.perf_counter()
                model.zero_grad()
                loss_fn(model(x), y).backward()
                step()
                ts.append(time.perf_counter() - t0)
            return ts[1:]

        # The machine is shared and noisy: the modes take turns, a few steps each per round,
        # so that they see the same load; the figure of each is the median of all its steps.
        modes = [(st, ov) for st in (psd.STALENESS_ASYNC, psd.STALENESS_BSP)
                 for ov in (False, True)]
        times: dict = {m: [] for m in modes}
        times["compute"] = []
        with psd.Client(spec, use_env=False, worker_id=0) as c:
            for r in range(args.rounds):
                times["compute"] += timed(lambda: None, args.steps)
                for st, ov in modes:
                    d = psd.torch.attach(c, model, lr=1e-4, staleness=st, chief=True,
                                         prefix=f"wide{st}/", overlap=ov)
                    times[(st, ov)] += timed(d.step, args.steps)
                    d.detach()
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        compute = med["compute"]
        print(f"wide MLP 784-4096-4096-10, batch {args.batch}, {args.threads} torch thread(s), "
              f"{args.rounds} rounds x {args.steps} steps per mode", flush=True)
        for st in (psd.STALENESS_ASYNC, psd.STALENESS_BSP):
            seq, ovl = med[(st, False)], med[(st, True)]
            comm = seq - compute
            hidden = (seq - ovl) / comm if comm > 0 else float("nan")
            print(f"staleness {st:2d}: compute {compute:.1f} ms, sequential {seq:.1f} ms, "
                  f"overlap {ovl:.1f} ms, communication {comm:.1f} ms, hidden "
                  f"{100 * hidden:.0f}%", flush=True)
    finally:
        srv.terminate()
        srv.wait()


DDP_WORKER = r'''
import os, sys, time, torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import fashion_mnist
rank, world, epochs = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(1)
model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                            torch.nn.ReLU(), torch.nn.Linear(128, 10))
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
xtr, ytr, xte, yte = fashion_mnist.load_train_test()
x, y = fashion_mnist.shard(xtr, ytr, rank, world)
x, y = torch.from_numpy(x), torch.from_numpy(y)
g = torch.Generator().manual_seed(1 + rank)
steps = len(x) // 128
loss_fn = torch.nn.CrossEntropyLoss()
t0 = time.perf_counter()
for e in range(epochs):
    order = torch.randperm(len(x), generator=g)
    for s in range(steps):
        idx = order[s * 128:(s + 1) * 128]
        opt.zero_grad()
        loss_fn(ddp(x[idx]), y[idx]).backward()
        opt.step()
wall = time.perf_counter() - t0
if rank == 0:
    with torch.no_grad():
        acc = float((model(torch.from_numpy(xte)).argmax(1) == torch.from_numpy(yte)).float().mean())
    print(f"test_accuracy={acc:.4f} steps={steps * epochs} wall_s={wall:.2f} "
          f"samples_per_s={steps * epochs * 128 / wall:.1f}", flush=True)
dist.destroy_process_group()
'''


def _samples_per_s(out: str) -> float:
    for tok in out.split():
        if tok.startswith("samples_per_s="):
            return float(tok.split("=", 1)[1])
    return float("nan")


def ddp(args: argparse.Namespace) -> None:
    """Paired rounds: each round runs DDP and every psd.torch mode, one after the other (the
    order turning each round), so that each round's ratios compare runs under about the same
    load; medians over rounds."""
    load_before = os.getloadavg()
    modes = [("psd.torch BSP overlap (ext)", [], {}),
             ("psd.torch BSP overlap (ctypes)", [], {"PSD_EXTENSION": "off"})]
    if args.all:
        modes += [("psd.torch BSP push after backward (ext)", ["--no-overlap"], {}),
                  ("psd.torch async overlap (ext)", ["--staleness", "-1"], {})]
    sps: dict = {"DDP gloo": []}
    sps.update({name: [] for name, _, _ in modes})
    ratios: dict = {name: [] for name, _, _ in modes}
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "ddp_worker.py")
        with open(script, "w") as f:
            f.write(DDP_WORKER)
        def run_ddp() -> float:
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            procs = [subprocess.Popen([sys.executable, script, EXAMPLES, str(r), "2",
                                       str(args.epochs)], env=env, stdout=subprocess.PIPE,
                                      text=True) for r in range(2)]
            out = procs[0].communicate()[0]
            procs[1].wait()
            print(f"DDP gloo run {run + 1}: {out.strip()}", flush=True)
            return _samples_per_s(out)

        def run_psd(i: int) -> float:
            name, extra, env_extra = modes[i]
            p = subprocess.run([args.ps_local, "--workers", "2", "--worker",
                                os.path.join(EXAMPLES, "torch_attach.py"), "--",
                                "--epochs", str(args.epochs), "--prefix",
                                f"bench{run}m{i}/", *extra],
                               capture_output=True, text=True, env=dict(os.environ, **env_extra))
            print(f"{name} run {run + 1}: {p.stdout.strip()} (exit {p.returncode})", flush=True)
            return _samples_per_s(p.stdout)

        # every mode once per round, DDP among them; the order turns by one each round so
        # that no mode always runs first (or right after another)
        order = [-1] + list(range(len(modes)))
        for run in range(args.repeat):
            k = run % len(order)
            got = {}
            for i in order[k:] + order[:k]:
                got[i] = run_ddp() if i < 0 else run_psd(i)
            sps["DDP gloo"].append(got[-1])
            for i, (name, _, _) in enumerate(modes):
                sps[name].append(got[i])
                ratios[name].append(got[i] / got[-1])
                print(f"round {run + 1}: {name} / DDP {got[i] / got[-1]:.2f}", flush=True)
    load_after = os.getloadavg()
    lines = ["| mode | samples/s per worker, each round | median | / DDP, each round "
             "(paired) | median / DDP |", "|---|---|---|---|---|"]
    for name, vals in sps.items():
        each = ", ".join(f"{v:.0f}" for v in vals)
        med = statistics.median(vals)
        if name in ratios:
            r = ", ".join(f"{x:.2f}" for x in ratios[name])
            lines.append(f"| {name} | {each} | {med:.0f} | {r} | "
                         f"{statistics.median(ratios[name]):.2f} |")
        else:
            lines.append(f"| {name} | {each} | {med:.0f} | | |")
    table = "\n".join(lines)
    print()
    print(table)
    print(f"\n{args.repeat} paired rounds, {args.epochs} epoch(s) each; load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    if args.results:
        with open(args.results, "a") as f:
            f.write(f"\n`torch_attach_bench.py ddp --epochs {args.epochs} --repeat "
                    f"{args.repeat}`, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, "
                    f"load average {load_before[0]:.1f} before and {load_after[0]:.1f} "
                    f"after:\n\n{table}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    o = sub.add_parser("overlap")
    o.add_argument("--server", required=True)
    o.add_argument("--batch", type=int, default=64)
    o.add_argument("--steps", type=int, default=3, help="timed steps per mode and round")
    o.add_argument("--rounds", type=int, default=5)
    o.add_argument("--threads", type=int, default=2)
    d = sub.add_parser("ddp")
    d.add_argument("--ps-local", required=True)
    d.add_argument("--epochs", type=int, default=2)
    d.add_argument("--repeat", type=int, default=1, help="paired rounds")
    d.add_argument("--all", action="store_true",
                   help="also psd.torch without overlap and asynchronous")
    d.add_argument("--results", help="append the table to this Markdown file")
    args = ap.parse_args()
    overlap(args) if args.what == "overlap" else ddp(args)


if __name__ == "__main__":
    main()
