"""The two implementations of the step calls (psd/_calls.py): the one PSD_EXTENSION asks for
is the one in use (the meson tests `python` and `python-ctypes` run this suite with each), a
path that does not load is an error, and both give the same results for the same calls."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from psd import _calls

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_implementation_psd_extension_names_is_used() -> None:
    env = os.environ.get("PSD_EXTENSION", "")
    name = _calls.name()
    if env == "off":
        assert name.startswith("ctypes") and _calls.impl() is _calls.CtypesCalls
    elif env:
        assert name == f"extension ({env})" and _calls.impl() is not _calls.CtypesCalls
    else:
        assert name.startswith(("extension", "ctypes"))


def test_a_path_that_does_not_load_is_an_error(tmp_path) -> None:
    bad = tmp_path / "_ext.so"
    bad.write_bytes(b"not a shared object")
    env = dict(os.environ, PSD_EXTENSION=str(bad))
    r = subprocess.run([sys.executable, "-c", "from psd import _calls; _calls.impl()"],
                       cwd=PKG_ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "ExtensionNotLoadedError" in r.stderr and str(bad) in r.stderr


def _extension_or_skip() -> None:
    try:
        _calls.use("extension")
    except ValueError as e:
        pytest.skip(f"no psd._ext to compare with: {e}")


@pytest.mark.parametrize("which", ["ctypes", "extension"])
def test_step_and_ops_alike(client, uname, which) -> None:
    saved = _calls.impl(), _calls.name()
    try:
        if which == "extension":
            _extension_or_skip()
        else:
            _calls.use("ctypes")
        v = client.create_variable(uname, (3,), optimizer="sgd", learning_rate=1.0)
        grad = np.array([1, 2, 3], np.float32)
        out = np.zeros(3, np.float32)
        client.step([(v, grad, out)], clock=False)
        np.testing.assert_array_equal(out, -grad)
        impl = _calls.impl()
        c = client._handle
        rc, op = impl.push_async(c, v._h, 0, 3, grad.ctypes.data, grad)
        assert rc == 0 and op.wait() == 0 and op.done() and op.message() == ""
        op.close()
        rc, op = impl.step_async(c, [(v._h, 1, 2, grad.ctypes.data, out.ctypes.data)], (), 0,
                                 (grad, out))
        assert rc == 0 and op.wait() == 0
        op.close()
        np.testing.assert_array_equal(out[:2], [-5, -8])  # elements 1, 2: [-4, -6] - grad[:2]
        rc, op = impl.pull_async(c, v._h, 0, 3, out.ctypes.data, out)
        assert rc == 0 and op.wait() == 0
        np.testing.assert_array_equal(out, [-2, -5, -8])
        # a range past the end: refused when started, or failed when waited for
        rc, op = impl.pull_async(c, v._h, 2, 5, out.ctypes.data, out)
        if rc == 0:
            assert op.wait() != 0 and op.message()
        # table calls
        t = client.create_table(uname + "/t", 2, optimizer="sgd", learning_rate=1.0)
        ids = np.array([7, 8], np.int64)
        g = np.ones((2, 2), np.float32)
        rows = np.zeros((2, 2), np.float32)
        rc, op = impl.table_push_async(t._h, ids.ctypes.data, 2, g.ctypes.data, (ids, g))
        assert rc == 0 and op.wait() == 0
        rc, op = impl.table_pull_async(t._h, ids.ctypes.data, 2, rows.ctypes.data, (ids, rows))
        assert rc == 0 and op.wait() == 0
        np.testing.assert_array_equal(rows, -g)
    finally:
        _calls._impl, _calls._name = saved
