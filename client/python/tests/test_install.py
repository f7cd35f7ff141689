"""How psd finds libpsclient: PSD_LIBRARY, a copy bundled into the package, and a pip
install of client/python that bundles it (each in a fresh interpreter)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def lib_path() -> str:
    path = os.environ.get("PSD_LIBRARY")
    if not path:
        raise RuntimeError("PSD_LIBRARY is not set (meson test python sets it)")
    return path


def run_py(code: str, cwd: str, env_changes: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PSD_LIBRARY", "PYTHONPATH", "PSD_EXTENSION")}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_psd_library_that_does_not_exist_is_an_error(tmp_path) -> None:
    r = run_py("import psd; psd.library_path()", PKG_ROOT,
               {"PSD_LIBRARY": str(tmp_path / "nope.so")})
    assert r.returncode != 0
    assert "LibraryNotFoundError" in r.stderr and "nope.so: no such file" in r.stderr


def test_bundled_copy_is_found(tmp_path) -> None:
    shutil.copytree(os.path.join(PKG_ROOT, "psd"), tmp_path / "psd",
                    ignore=shutil.ignore_patterns("__pycache__", "libpsclient.so*"))
    shutil.copyfile(lib_path(), tmp_path / "psd" / "libpsclient.so.0")
    r = run_py("import psd; print(psd.library_path()); print(psd.version())", str(tmp_path), {})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == str(tmp_path / "psd" / "libpsclient.so.0")


def test_pip_install_bundles_the_library(tmp_path) -> None:
    for mod in ("pip", "setuptools", "wheel"):
        if subprocess.run([sys.executable, "-c", f"import {mod}"],
                          capture_output=True).returncode != 0:
            pytest.skip(f"{mod} is not installed for {sys.executable}")
    src = tmp_path / "src"
    shutil.copytree(PKG_ROOT, src, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info", "libpsclient.so*", ".pytest_cache"))
    site = tmp_path / "site"
    env = dict(os.environ, PSD_BUNDLE_LIBRARY=lib_path(), PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                        "--no-deps", "--no-index", "--target", str(site), str(src)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "psd" / "libpsclient.so.0").is_file()
    assert (site / "psd" / "py.typed").is_file()
    r = run_py("import psd; print(psd.library_path())", str(tmp_path),
               {"PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(site / "psd" / "libpsclient.so.0")
    # the extension module psd._ext is built with the package where Python's headers are
    # (Debian: python3-dev) and then used; without them the package uses ctypes
    built = list((site / "psd").glob("_ext*.so"))
    r = run_py("from psd import _calls; print(_calls.name())", str(tmp_path),
               {"PYTHONPATH": str(site)})
    assert r.returncode == 0, r.stderr
    if os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")):
        assert len(built) == 1
        assert r.stdout.strip() == f"extension ({built[0]})"
    else:
        assert r.stdout.strip().startswith("ctypes")


def test_debian_venv_with_system_site_packages(tmp_path) -> None:
    """The README's way on Debian: a venv that sees the system's NumPy (and PyTorch), psd
    installed into it with the system's setuptools, nothing downloaded."""
    for mod in ("venv", "ensurepip", "setuptools", "numpy"):
        if subprocess.run([sys.executable, "-c", f"import {mod}"],
                          capture_output=True).returncode != 0:
            pytest.skip(f"{mod} is not installed for {sys.executable} (Debian: python3-venv, "
                        f"python3-setuptools, python3-numpy)")
    src = tmp_path / "src"
    shutil.copytree(PKG_ROOT, src, ignore=shutil.ignore_patterns(
        "__pycache__", "build", "*.egg-info", "libpsclient.so*", ".pytest_cache"))
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PSD_LIBRARY", None)
    pip = [str(venv / "bin" / "pip"), "install", "--no-build-isolation", str(src)]
    # a relative PSD_BUNDLE_LIBRARY is refused, saying why (pip builds in another directory)
    r = subprocess.run(pip, env=dict(env, PSD_BUNDLE_LIBRARY="build/client/libpsclient.so"),
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode != 0 and "give an absolute path" in r.stdout + r.stderr
    r = subprocess.run(pip, env=dict(env, PSD_BUNDLE_LIBRARY=os.path.abspath(lib_path())),
                       capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([str(venv / "bin" / "python"), "-c",
                        "import numpy, psd; print(psd.library_path()); print(psd.version())"],
                       env=env, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].startswith(str(venv)), r.stdout
