"""The examples against real servers: they train to their accuracy target, behave as
data-parallel workers (task from TF_CONFIG or flags, a shard each, Client.step, one thread
each on a shared machine, ps-worker's log lines) and say when they resume trained variables
(marked `example`: deselect with -m 'not example')."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

import pytest

from conftest import Cluster

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
DATA_DIR = "/usr/share/datasets/fashion-mnist"
SHARD_STEPS = 30000 // 128  # one epoch of half of the 60000 training examples, batch 128


def need_data() -> None:
    if not os.path.exists(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz")) and \
            not os.path.exists(os.path.join(DATA_DIR, "train-images-idx3-ubyte")):
        pytest.skip(f"no Fashion-MNIST in {DATA_DIR} (Debian: dataset-fashion-mnist)")


def need_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip(f"PyTorch is not installed for {sys.executable} (Debian: apt-get install "
                    f"python3-torch)")


def start(script: str, args: List[str], tf_config: Optional[dict] = None,
          stderr_path: Optional[str] = None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    err = open(stderr_path, "w") if stderr_path else subprocess.PIPE
    return subprocess.Popen([sys.executable, os.path.join(EXAMPLES, script), "--data-dir",
                             DATA_DIR, "--log-format", "json", *args], env=env,
                            stdout=subprocess.PIPE, stderr=err, text=True)


def finish(p: subprocess.Popen, timeout: float = 240) -> Dict[str, object]:
    out, err = p.communicate(timeout=timeout)
    if err is None:
        err = ""
    return {"rc": p.returncode, "out": out, "err": err,
            "lines": [json.loads(line) for line in err.splitlines() if line.startswith("{")]}


def tf_config(cl: Cluster, index: int, workers: int = 2) -> dict:
    return {"cluster": {"ps": cl.spec["ps"],
                        "worker": [f"127.0.0.1:{40000 + i}" for i in range(workers)]},
            "task": {"type": "worker", "index": index}}


def line(r: Dict[str, object], prefix: str) -> dict:
    found = [o for o in r["lines"] if o["msg"].startswith(prefix)]  # type: ignore[union-attr]
    assert found, f"no log line starting {prefix!r}: {r['err']}"
    return found[-1]


def accuracy(r: Dict[str, object]) -> float:
    m = re.search(r"^test_accuracy=([0-9.]+)", str(r["out"]), re.M)
    assert m, r["out"]
    return float(m.group(1))


def run_example(script: str, args: list) -> float:
    need_data()
    cl = Cluster(1)
    try:
        r = finish(start(script, ["--cluster", json.dumps(cl.spec), *args]))
    finally:
        cl.stop()
    assert r["rc"] == 0, r["out"] + r["err"]  # type: ignore[operator]
    return accuracy(r)


@pytest.mark.example
def test_mlp_numpy_reaches_085() -> None:
    acc = run_example("mlp_numpy.py", ["--epochs", "3"])
    assert acc >= 0.85, f"test accuracy {acc}"


@pytest.mark.example
def test_torch_mlp_reaches_085() -> None:
    need_torch()
    acc = run_example("torch_mlp.py", ["--epochs", "2", "--threads", "2"])
    assert acc >= 0.85, f"test accuracy {acc}"


def two_workers(script: str, extra: List[str]):
    need_data()
    cl = Cluster(1)
    try:
        procs = [start(script, ["--epochs", "1", "--log-every", "50", *extra],
                       tf_config(cl, i)) for i in range(2)]
        runs = [finish(p) for p in procs]
        import psd
        with psd.Client(cl.spec, use_env=False) as c:
            requests = c.server_status(0).requests
    finally:
        cl.stop()
    for i, r in enumerate(runs):
        assert r["rc"] == 0, f"worker {i}: {r['out']}{r['err']}"
    return runs, requests


def check_workers(runs) -> None:
    for i, r in enumerate(runs):
        start_line = line(r, "training ")
        assert (start_line["role"], start_line["task"]) == ("worker", i)
        assert (start_line["shard"], start_line["shards"], start_line["examples"]) == (i, 2, 30000)
        assert "Client.step" in start_line["msg"]
        result = line(r, "trained ")
        assert result["steps"] == SHARD_STEPS and result["samples"] == SHARD_STEPS * 128
        assert result["samples_per_s"] > 0 and result["wall_s"] > 0
        steps = [o for o in r["lines"] if o["msg"].startswith("step ")]
        assert [o["step"] for o in steps] == list(range(50, SHARD_STEPS + 1, 50))
        assert all(o["msg"].startswith(f"step {o['step']}/{SHARD_STEPS} ") for o in steps)
        assert not any("resuming" in o["msg"] for o in r["lines"])
    # worker 0 alone evaluates and prints the result line, after both finished
    assert runs[1]["out"] == ""
    assert accuracy(runs[0]) >= 0.75
    m = re.search(r"steps=(\d+) wall_s=([0-9.]+) samples_per_s=([0-9.]+)", runs[0]["out"])
    assert m and int(m.group(1)) == SHARD_STEPS and float(m.group(3)) > 0, runs[0]["out"]


@pytest.mark.example
def test_mlp_numpy_two_workers_from_tf_config() -> None:
    runs, requests = two_workers("mlp_numpy.py", [])
    check_workers(runs)
    for r in runs:  # 2 workers on this machine: one BLAS thread each
        assert "1 BLAS thread(s)" in line(r, "training ")["msg"]
    # one Step request per step and worker; the rest: variables, records, heartbeats, status
    assert 2 * SHARD_STEPS <= requests < 2 * SHARD_STEPS + 150, requests


@pytest.mark.example
def test_torch_mlp_two_workers_from_tf_config() -> None:
    need_torch()
    runs, requests = two_workers("torch_mlp.py", [])
    check_workers(runs)
    for r in runs:
        assert line(r, "training ")["threads"] == 1
    assert 2 * SHARD_STEPS <= requests < 2 * SHARD_STEPS + 150, requests


@pytest.mark.example
def test_task_from_flags() -> None:
    need_data()
    cl = Cluster(1)
    try:
        # worker 1 of 3 (worker 1 does not wait for anyone, nor evaluate)
        r = finish(start("mlp_numpy.py", ["--cluster", json.dumps(cl.spec), "--task-index", "1",
                                          "--num-workers", "3", "--epochs", "1"]))
        bad = finish(start("mlp_numpy.py", ["--cluster", json.dumps(cl.spec), "--task-index",
                                            "3", "--num-workers", "3"]))
    finally:
        cl.stop()
    assert r["rc"] == 0, r["err"]
    assert r["out"] == ""
    assert (line(r, "training ")["shard"], line(r, "training ")["examples"]) == (1, 20000)
    assert line(r, "trained ")["steps"] == 20000 // 128
    assert bad["rc"] == 2 and "worker index 3 is not in 0..2" in bad["err"]


@pytest.mark.example
def test_second_run_says_it_resumes() -> None:
    need_data()
    cl = Cluster(1)
    try:
        args = ["--cluster", json.dumps(cl.spec), "--epochs", "1", "--prefix", "resume_test"]
        first = finish(start("mlp_numpy.py", args))
        second = finish(start("mlp_numpy.py", args))
        other = finish(start("mlp_numpy.py", args[:-1] + ["resume_other"]))
    finally:
        cl.stop()
    for r in (first, second, other):
        assert r["rc"] == 0, r["err"]
    assert not [o for o in first["lines"] if o.get("resumed")]
    assert not [o for o in other["lines"] if o.get("resumed")]
    res = line(second, "resuming: ")
    assert res["level"] == "warn" and res["resumed"] is True
    assert (res["earlier_starts"], res["earlier_finished"]) == (1, 1)
    assert "resume_test/*" in res["msg"] and "--prefix" in res["msg"]
    assert line(second, "trained ")["msg"].endswith("(resumed)")
    # it continued from the trained values: better than the first epoch of a fresh run
    assert accuracy(second) > accuracy(first) - 0.01


@pytest.mark.example
def test_restarted_worker_resumes_and_the_run_completes(tmp_path) -> None:
    need_data()
    cl = Cluster(1)
    try:
        w0 = start("mlp_numpy.py", ["--epochs", "2", "--log-every", "20"], tf_config(cl, 0))
        err1 = str(tmp_path / "w1.log")
        w1 = start("mlp_numpy.py", ["--epochs", "2", "--log-every", "20"], tf_config(cl, 1),
                   stderr_path=err1)
        deadline = time.monotonic() + 120
        while '"step":20,' not in open(err1).read():
            assert w1.poll() is None and time.monotonic() < deadline, open(err1).read()
            time.sleep(0.05)
        w1.send_signal(signal.SIGKILL)  # as a crash; ps-local --restart starts it again
        w1.wait()
        again = finish(start("mlp_numpy.py", ["--epochs", "2"], tf_config(cl, 1)))
        r0 = finish(w0)
    finally:
        cl.stop()
    assert again["rc"] == 0, again["err"]
    res = line(again, "resuming: ")
    assert (res["earlier_starts"], res["earlier_finished"]) == (1, 0)
    assert line(again, "trained ")["steps"] == 2 * SHARD_STEPS
    assert r0["rc"] == 0, r0["err"]
    assert accuracy(r0) >= 0.75
