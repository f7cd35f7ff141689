#!/usr/bin/env python3
"""Push and pull throughput of the Python client against the C client, same run, same server.

Starts one ps-server, creates a variable per size, and times blocking push and pull calls in
a loop for --seconds, alternately from C (c_loop.c, compiled here with cc against the build
tree's libpsclient: the same ps_push / ps_pull calls) and from Python (psd, from and into a
NumPy array, no copies); the best of --trials per cell is kept. Prints a Markdown table of GB/s
(1 GB = 1e9 bytes of tensor payload) and microseconds per call, and with --results FILE appends
it as a section "## Python client".

    python3 client/python/bench/bench_push_pull.py --build build-g [--results bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


def label(n: int) -> str:
    for unit, m in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


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


def py_loop(var, arr: np.ndarray, op: str, seconds: float) -> Tuple[int, float]:
    fn = var.push if op == "push" else var.pull
    for _ in range(3):
        fn(arr)
    calls = 0
    t0 = t = time.perf_counter()
    while t - t0 < seconds:
        fn(arr)
        calls += 1
        t = time.perf_counter()
    return calls, t - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="meson build directory (its server/ps-server and client/libpsclient.so)")
    ap.add_argument("--sizes", default="4K,1M,16M")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--results", help="append the table to this Markdown file")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]

    build = os.path.abspath(args.build)
    server = os.path.join(build, "server", "ps-server")
    libdir = os.path.join(build, "client")
    os.environ.setdefault("PSD_LIBRARY", os.path.join(libdir, "libpsclient.so"))
    import psd

    tmp = tempfile.mkdtemp(prefix="psd-bench-")
    c_loop = os.path.join(tmp, "c_loop")
    subprocess.run(["cc", "-O2", "-I", os.path.join(ROOT, "client"), os.path.join(HERE, "c_loop.c"),
                    "-L", libdir, "-lpsclient", f"-Wl,-rpath,{libdir}", "-o", c_loop],
                   check=True)

    port = free_port()
    spec = {"ps": [f"127.0.0.1:{port}"]}
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": spec,
                                                 "task": {"type": "ps", "index": 0}}))
    srv = subprocess.Popen([server, "--log-level", "warn"], env=env)
    rows: List[Dict] = []
    try:
        with psd.Client(spec, use_env=False) as client:
            for size in [parse_size(s) for s in args.sizes.split(",")]:
                name = f"bench/{size}"
                var = client.create_variable(name, (size // 4,), optimizer="sgd",
                                             learning_rate=1.0, staleness=psd.STALENESS_ASYNC)
                arr = np.zeros(size // 4, np.float32)
                for op in ("push", "pull"):
                    best_c = best_py = None
                    for _ in range(args.trials):
                        out = subprocess.run([c_loop, json.dumps(spec), name, op,
                                              str(args.seconds)], capture_output=True,
                                             text=True, check=True).stdout.split()
                        c = int(out[0]), float(out[1])
                        p = py_loop(var, arr, op, args.seconds)
                        if best_c is None or c[1] / c[0] < best_c[1] / best_c[0]:
                            best_c = c
                        if best_py is None or p[1] / p[0] < best_py[1] / best_py[0]:
                            best_py = p
                    c_us = best_c[1] / best_c[0] * 1e6
                    py_us = best_py[1] / best_py[0] * 1e6
                    rows.append(dict(size=size, op=op, c_gbs=size / c_us / 1e3,
                                     py_gbs=size / py_us / 1e3, c_us=c_us, py_us=py_us))
                    r = rows[-1]
                    print(f"{label(size):>8} {op:4}: C {r['c_gbs']:.3f} GB/s {c_us:.1f} us, "
                          f"Python {r['py_gbs']:.3f} GB/s {py_us:.1f} us, "
                          f"ratio {r['py_gbs'] / r['c_gbs']:.2f}", flush=True)
    finally:
        srv.terminate()
        srv.wait()

    lines = ["| size | op | C GB/s | Python GB/s | Python / C | C µs/call | Python µs/call |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {label(r['size'])} | {r['op']} | {r['c_gbs']:.3f} | {r['py_gbs']:.3f} | "
                     f"{r['py_gbs'] / r['c_gbs']:.2f} | {r['c_us']:.1f} | {r['py_us']:.1f} |")
    small = [r for r in rows if r["size"] == min(x["size"] for x in rows)]
    overhead = "; ".join(f"{r['op']} {r['py_us'] - r['c_us']:+.1f} µs" for r in small)
    table = "\n".join(lines)
    print()
    print(table)
    print(f"\nPython overhead per call at {label(small[0]['size'])}: {overhead}")
    if args.results:
        machine = (f"{os.cpu_count()} vCPUs ({cpu_model()}), {platform.system()} "
                   f"{platform.release()}, Python {platform.python_version()}, "
                   f"NumPy {np.__version__}; load average {load_before:.1f} before the run "
                   f"and {os.getloadavg()[0]:.1f} after (other programs were running)")
        section = f"""
## Python client

`client/python/bench/bench_push_pull.py --build {os.path.relpath(build, ROOT)}` on
{datetime.date.today().isoformat()}: {machine}. One ps-server on loopback; blocking push and
pull of one float32 variable per size in a loop, from C (`c_loop.c`: `ps_push` / `ps_pull`)
and from Python (`psd`: `Variable.push` / `Variable.pull` from and into a NumPy array, no
copy), alternately, {args.seconds:g} s per trial, best of {args.trials}; GB/s of tensor payload
(1 GB = 1e9 bytes).

{table}

Python's overhead per call at {label(small[0]['size'])} (Python minus C): {overhead}.
"""
        with open(args.results, "a") as f:
            f.write(section)
        print(f"appended to {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
