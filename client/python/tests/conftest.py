"""Fixtures: real ps-server processes on free loopback ports, and clients connected to them.

PSD_SERVER names the ps-server executable (unset: the `ps-server` found on PATH) and
PSD_LIBRARY the libpsclient to load; the meson test `python` sets both (tests/meson.build)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from typing import Dict, Iterator, List

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the package from the source tree

import psd  # noqa: E402


def server_bin() -> str:
    path = os.environ.get("PSD_SERVER")
    if not path:
        path = shutil.which("ps-server")
        if path is None:
            raise RuntimeError("PSD_SERVER is not set and no ps-server is on PATH: point it at "
                               "ps-server, e.g. PSD_SERVER=build/server/ps-server (meson test "
                               "python sets it), or install psd (meson install)")
        return path
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"PSD_SERVER={path}: not an executable file")
    return path


def free_ports(n: int) -> List[int]:
    """n distinct free loopback ports. Every socket stays bound until all are picked: a port
    just closed can be handed out again at once (two servers of one spec on one port)."""
    socks: List[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Cluster:
    """n ps-server processes; .spec is the cluster spec (a dict) to connect with."""

    def __init__(self, n: int, extra: List[str] | None = None) -> None:
        self.ports = free_ports(n)
        self.spec: Dict[str, List[str]] = {"ps": [f"127.0.0.1:{p}" for p in self.ports]}
        self.procs: List[subprocess.Popen] = []
        exe = server_bin()
        for i in range(n):
            env = dict(os.environ)
            env["TF_CONFIG"] = json.dumps({"cluster": self.spec,
                                           "task": {"type": "ps", "index": i}})
            self.procs.append(subprocess.Popen([exe, "--log-level", "warn", *(extra or [])],
                                               env=env))
        try:
            for i, port in enumerate(self.ports):
                self._wait_listening(i, port)
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self, i: int, port: int) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"ps-server {i} exited with {self.procs[i].returncode} "
                                   f"before listening on {port}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError(f"ps-server {i} did not listen on port {port} within 10 s")

    def kill(self, i: int) -> None:
        self.procs[i].kill()
        self.procs[i].wait()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="session")
def cluster2() -> Iterator[Cluster]:
    """Two servers shared by the tests of the session (each test uses its own names)."""
    c = Cluster(2)
    yield c
    c.stop()


@pytest.fixture
def client(cluster2: Cluster) -> Iterator[psd.Client]:
    # small split threshold and chunks: variables over 16 KiB are split over both servers
    # and sent in several pieces, so the tests cover the multi-part paths
    with psd.Client(cluster2.spec, use_env=False, deadline_ms=10000,
                    split_threshold_bytes="16K", chunk_bytes="4K") as c:
        yield c


_names = iter(range(1 << 30))


@pytest.fixture
def uname(request: pytest.FixtureRequest) -> str:
    """A variable name unique to the test."""
    base = re.sub(r"[^A-Za-z0-9_./:-]", "_", request.node.name)
    return f"t/{base}/{next(_names)}"
