"""The examples train to their accuracy target against a real server (marked `example`:
deselect with -m 'not example')."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import Cluster

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
DATA_DIR = "/usr/share/datasets/fashion-mnist"


def run_example(script: str, args: list) -> float:
    if not os.path.exists(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz")) and \
            not os.path.exists(os.path.join(DATA_DIR, "train-images-idx3-ubyte")):
        pytest.skip(f"no Fashion-MNIST in {DATA_DIR} (Debian: dataset-fashion-mnist)")
    cl = Cluster(1)
    try:
        r = subprocess.run([sys.executable, os.path.join(EXAMPLES, script), "--cluster",
                            __import__("json").dumps(cl.spec), "--data-dir", DATA_DIR, *args],
                           capture_output=True, text=True, timeout=240)
    finally:
        cl.stop()
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"^test_accuracy=([0-9.]+)", r.stdout, re.M)
    assert m, r.stdout
    return float(m.group(1))


@pytest.mark.example
def test_mlp_numpy_reaches_085() -> None:
    acc = run_example("mlp_numpy.py", ["--epochs", "3"])
    assert acc >= 0.85, f"test accuracy {acc}"


@pytest.mark.example
def test_torch_mlp_reaches_085() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("PyTorch is not installed for this python3 (the example needs it; the "
                    "test suite does not install it)")
    acc = run_example("torch_mlp.py", ["--epochs", "2", "--threads", "2"])
    assert acc >= 0.85, f"test accuracy {acc}"
