#!/usr/bin/env python3
"""Per-step overhead of the Python layer against the C client, same model, same server.

One ps-server on loopback holds one model's parameters (the Fashion-MNIST MLP, 784-256-128-10,
or with --model wide 784-4096-4096-10; weights and biases, SGD), put there by psd.torch.attach.
Every mode then times a training step's communication with no compute (gradients already
present) through the same psd.Client (same connections, worker id 0, clock), BSP:

  C           c_step.c's c_step_loop: one ps_step per step, push every gradient and pull
              every parameter with PS_STEP_CLOCK; the loop runs in C (one ctypes call per round).
  C (torch)   c_step.c's c_torch_pattern_loop: the requests psd.torch makes, from C:
              ps_push_async of every gradient, wait, then a pull-only ps_step with the clock.
  ctypes      ps_step called from Python through ctypes with a prebuilt item array (the floor
              of any Python caller: one foreign call per step).
  Client.step psd.Client.step([(var, grad, out), ...]) with NumPy buffers.
  psd.torch   the gradient hooks' function for every parameter (what backward runs), then
              AttachedModule.step(); gradients set once and left in place.
  psd.torch, overlap=False   AttachedModule.step() of the same module attached with
              overlap=False (no hooks: step() sends every gradient itself).
  psd.torch, bucket_bytes=0  the hooks mode with every gradient's push started from its hook
              (one request per gradient, then step()'s), as psd.torch did before buckets.

The Python modes run twice, through the extension module psd._ext ("ext") and through ctypes
("ctypes"), psd/_calls.py's two implementations, in the same process (--no-ctypes: the
extension only; without a built extension: ctypes only).

The modes take turns (--steps each per round, --rounds rounds) so that they share the
machine's load; each step is timed; medians over every step of a mode. Prints a Markdown table
with the ratios to the C mode; with --results FILE appends it as a subsection at the end
of FILE (bench/RESULTS.md keeps them under "PyTorch: psd.torch").

    PSD_LIBRARY=build/client/libpsclient.so /usr/bin/python3 \\
        client/python/bench/step_overhead_bench.py --build build [--model wide]
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

MODELS = {"mnist": (784, 256, 128, 10), "wide": (784, 4096, 4096, 10)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="meson build directory (its server/ps-server and client/libpsclient.so)")
    ap.add_argument("--model", choices=sorted(MODELS), default="mnist")
    ap.add_argument("--steps", type=int, default=200, help="steps per mode per round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--profile", action="store_true",
                    help="also print cProfile's top functions of the psd.torch mode")
    ap.add_argument("--results", help="append the table to this Markdown file")
    ap.add_argument("--no-ctypes", action="store_true",
                    help="time the Python modes through the extension only")
    args = ap.parse_args()
    load_before = os.getloadavg()

    build = os.path.abspath(args.build)
    server = os.path.join(build, "server", "ps-server")
    libdir = os.path.join(build, "client")
    os.environ.setdefault("PSD_LIBRARY", os.path.join(libdir, "libpsclient.so"))
    import torch
    import psd
    import psd.torch
    from psd import _calls, _native

    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="psd-bench-")
    so = os.path.join(tmp, "c_step.so")
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-I", os.path.join(ROOT, "client"),
                    os.path.join(HERE, "c_step.c"), "-L", libdir, "-lpsclient",
                    f"-Wl,-rpath,{libdir}", "-o", so], check=True)
    cs = ctypes.CDLL(so)
    P = ctypes.c_void_p
    for fn in (cs.c_step_loop, cs.c_torch_pattern_loop):
        fn.restype = ctypes.c_int
        fn.argtypes = [P, ctypes.POINTER(P), ctypes.POINTER(P), ctypes.POINTER(P), ctypes.c_int,
                       ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]

    dims = MODELS[args.model]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    nparams = sum(p.numel() for p in model.parameters())

    port = free_port()
    spec = {"ps": [f"127.0.0.1:{port}"]}
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": spec,
                                                 "task": {"type": "ps", "index": 0}}))
    srv = subprocess.Popen([server, "--log-level", "warn"], env=env)
    times: Dict[str, List[int]] = {}
    prof_text = ""
    try:
        with psd.Client(spec, use_env=False, worker_id=0) as client:
            am = psd.torch.attach(client, model, lr=1e-9, staleness=0, chief=True, overlap=True,
                                  prefix="ovh/")
            am_seq = psd.torch.attach(client, model, lr=1e-9, staleness=0, chief=True,
                                      overlap=False, prefix="ovh/")
            am_each = psd.torch.attach(client, model, lr=1e-9, staleness=0, chief=True,
                                       overlap=True, prefix="ovh/", bucket_bytes=0)
            hooks_each = [am_each._hook(e) for e in am_each._entries]
            entries = am._entries
            hooks = [am._hook(e) for e in entries]
            vars_ = [e.var for e in entries]
            n = len(vars_)
            grads = [np.zeros(v.shape, np.float32) for v in vars_]
            outs = [np.zeros(v.shape, np.float32) for v in vars_]
            c_vars = (P * n)(*[v._h for v in vars_])
            c_grads = (P * n)(*[g.ctypes.data for g in grads])
            c_dsts = (P * n)(*[o.ctypes.data for o in outs])
            items = (_native.StepItem * n)()
            for i, v in enumerate(vars_):
                items[i].var, items[i].offset, items[i].count = v._h, 0, v.size
                items[i].grad, items[i].dst = grads[i].ctypes.data, outs[i].ctypes.data
            step_items = [(v, g, o) for v, g, o in zip(vars_, grads, outs)]
            L = _native.lib()
            h = client._handle

            def c_mode(fn: Callable) -> Callable[[int], List[int]]:
                def run(steps: int) -> List[int]:
                    ns = (ctypes.c_int64 * steps)()
                    rc = fn(h, c_vars, c_grads, c_dsts, n, steps, ns)
                    if rc != 0:
                        raise RuntimeError(f"C loop failed: {rc}")
                    return list(ns)
                return run

            def py_mode(body: Callable[[], None]) -> Callable[[int], List[int]]:
                def run(steps: int) -> List[int]:
                    out = []
                    pc = time.perf_counter_ns
                    for _ in range(steps):
                        t0 = pc()
                        body()
                        out.append(pc() - t0)
                    return out
                return run

            def raw() -> None:
                if L.ps_step(h, items, n, _native.PS_STEP_CLOCK) != 0:
                    raise RuntimeError("ps_step failed")

            def torch_step() -> None:
                for f in hooks:
                    f()
                am.step()

            def torch_step_each() -> None:
                for f in hooks_each:
                    f()
                am_each.step()

            def through(which: str, run: Callable[[int], List[int]]) -> Callable[[int], List[int]]:
                def switched(steps: int) -> List[int]:
                    _calls.use(which)
                    return run(steps)
                return switched

            try:
                _calls.use("extension")
                impls = ["ext"] if args.no_ctypes else ["ext", "ctypes"]
            except ValueError as e:
                print(f"no extension module: {e}; the Python modes run through ctypes only")
                impls = ["ctypes"]
            modes = {
                "C": c_mode(cs.c_step_loop),
                "C (torch)": c_mode(cs.c_torch_pattern_loop),
                "ctypes": py_mode(raw),
            }
            for which in impls:
                use = "extension" if which == "ext" else "ctypes"
                modes[f"Client.step ({which})"] = through(
                    use, py_mode(lambda: client.step(step_items)))
                modes[f"psd.torch ({which})"] = through(use, py_mode(torch_step))
                modes[f"psd.torch, overlap=False ({which})"] = through(use, py_mode(am_seq.step))
                modes[f"psd.torch, bucket_bytes=0 ({which})"] = through(
                    use, py_mode(torch_step_each))
            for name, run in modes.items():  # warm-up
                run(10)
                times[name] = []
            for r in range(args.rounds):
                for name, run in modes.items():
                    times[name] += run(args.steps)
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(
                    f"{k} {statistics.median(v) / 1e3:.1f} us" for k, v in times.items()),
                    flush=True)
            if args.profile:
                import cProfile
                import io
                import pstats
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(args.steps):
                    torch_step()
                pr.disable()
                s = io.StringIO()
                pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(12)
                prof_text = s.getvalue()
                print(prof_text)
            am.detach()
            am_seq.detach()
            am_each.detach()
    finally:
        srv.terminate()
        srv.wait()
    load_after = os.getloadavg()

    med = {k: statistics.median(v) / 1e3 for k, v in times.items()}
    p90 = {k: sorted(v)[int(len(v) * 0.9)] / 1e3 for k, v in times.items()}
    base = med["C"]
    lines = ["| mode | median µs/step | p90 µs/step | / C | / C (torch) |",
             "|---|---|---|---|---|"]
    for k in times:
        lines.append(f"| {k} | {med[k]:.1f} | {p90[k]:.1f} | {med[k] / base:.2f} | "
                     f"{med[k] / med['C (torch)']:.2f} |")
    table = "\n".join(lines)
    print()
    print(table)
    shape = "-".join(map(str, dims))
    print(f"\nmodel {shape} ({n} variables, {nparams} parameters); load average "
          f"{load_before[0]:.1f} before, {load_after[0]:.1f} after")
    if args.results:
        machine = (f"{os.cpu_count()} vCPUs ({cpu_model()}), {platform.system()} "
                   f"{platform.release()}, Python {platform.python_version()}, torch "
                   f"{torch.__version__}; load average {load_before[0]:.1f} before the run "
                   f"and {load_after[0]:.1f} after (other programs were running)")
        section = f"""
#### Run: {shape}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC

`{' '.join(['client/python/bench/step_overhead_bench.py'] + sys.argv[1:])}`: {machine}.
{n} variables, {nparams} parameters, {args.rounds} rounds of {args.steps} steps per mode.

{table}
"""
        with open(args.results, "a") as f:
            f.write(section)
        print(f"appended to {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
