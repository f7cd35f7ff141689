"""The suite's own fixtures: where ps-server comes from."""

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
