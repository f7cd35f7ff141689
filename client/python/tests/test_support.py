"""The suite's own fixtures (where ps-server comes from) and what `import psd` loads."""

import os

import pytest

import conftest


def test_server_from_path_when_psd_server_is_unset(tmp_path, monkeypatch):
    exe = tmp_path / "ps-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.delenv("PSD_SERVER", raising=False)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin")
    assert conftest.server_bin() == str(exe)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="no ps-server is on PATH"):
        conftest.server_bin()
    monkeypatch.setenv("PSD_SERVER", str(exe))  # set: it wins
    assert conftest.server_bin() == str(exe)


def test_import_psd_does_not_import_torch():
    import subprocess
    import sys
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", "import sys; import psd; "
                        "sys.exit(1 if 'torch' in sys.modules else 0)"],
                       cwd=here, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr or "import psd imported torch"
