"""psd.events (pure Python TensorBoard event files): CRC-32C against known values, TFRecord
framing byte for byte against TensorBoard's test vector, files read back (scalars,
histograms, rotation), a file cut at every byte offset, a write that fails midway (the file
size limit stands in for a full disk) and, where the tensorboard package is installed,
TensorBoard's own reader. Needs neither servers nor NumPy."""

from __future__ import annotations

import glob
import os
import resource
import signal
import struct

import pytest

import psd.events as ev

TB_PAYLOAD = b"\x09\x00\x00\x80\x38\x99\xd6\xd7\x41\x1a\x0dbrain.Event:2"


def test_crc32c_known_values():
    assert ev.crc32c(b"123456789") == 0xE3069283
    assert ev.crc32c(bytes(32)) == 0x8A9136AA
    assert ev.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert ev.crc32c(b"") == 0
    assert ev.crc32c(b"6789", ev.crc32c(b"12345")) == 0xE3069283


def test_record_matches_tensorboard_vector():
    rec = ev.frame_record(TB_PAYLOAD)
    assert rec[:8] == b"\x18" + bytes(7)
    assert rec[8:12] == b"\xa3\x7f\x4b\x22"  # 0x224b7fa3
    assert rec[12:36] == TB_PAYLOAD
    assert rec[36:] == b"\x12\x4b\x36\xab"  # 0xab364b12
    (wall,) = struct.unpack("<d", TB_PAYLOAD[1:9])
    assert ev.encode_event(wall, file_version="brain.Event:2") == TB_PAYLOAD


def files(d):
    return sorted(glob.glob(os.path.join(d, "events.out.tfevents.*")))


def test_write_and_read_back(tmp_path):
    d = str(tmp_path / "run" / "worker-0")
    with ev.EventWriter(d) as w:
        for s in range(1, 21):
            w.add_scalars({"train/loss": 1.0 / s, "train/accuracy": 0.5}, s,
                          wall_time=1.7e9 + s)
        w.add_histogram("weights/w", [i / 100.0 - 5.0 for i in range(1000)], 20)
        name = os.path.basename(w.path)
    assert name.startswith("events.out.tfevents.") and name.endswith(f".{os.getpid()}.0")
    assert name[20:30].isdigit() and name[30] == "."
    events = list(ev.read_events(files(d)[0]))
    assert events[0]["file_version"] == "brain.Event:2"
    assert len(events) == 22
    for s in range(1, 21):
        e = events[s]
        assert e["step"] == s and e["wall_time"] == 1.7e9 + s
        assert e["scalars"]["train/loss"] == struct.unpack("<f", struct.pack("<f", 1.0 / s))[0]
        assert e["scalars"]["train/accuracy"] == 0.5
    h = events[21]["histograms"]["weights/w"]
    assert h["num"] == 1000 and h["min"] == -5.0 and sum(h["bucket"]) == 1000
    assert h["bucket_limit"] == sorted(h["bucket_limit"])


def test_cut_at_every_offset(tmp_path):
    d = str(tmp_path / "cut")
    with ev.EventWriter(d) as w:
        for s in range(1, 6):
            w.add_scalar("x", s, s)
    path = files(d)[0]
    data = open(path, "rb").read()
    ends, off = [], 0
    while off < len(data):
        (n,) = struct.unpack("<Q", data[off:off + 8])
        off += 16 + n
        ends.append(off)
    cut = str(tmp_path / "cut.bin")
    for k in range(len(data) + 1):
        with open(cut, "wb") as f:
            f.write(data[:k])
        assert len(list(ev.read_events(cut))) == sum(1 for e in ends if e <= k)


def test_rotation(tmp_path):
    d = str(tmp_path / "rot")
    with ev.EventWriter(d, max_bytes=300, flush_secs=0) as w:
        for s in range(1, 41):
            w.add_scalar("x", s, s)
    names = files(d)
    assert len(names) >= 3
    steps = []
    for p in names:
        evs = list(ev.read_events(p))
        assert evs[0]["file_version"] == "brain.Event:2"
        steps += [e["step"] for e in evs[1:]]
    assert steps == list(range(1, 41))


def test_unusable_directory(tmp_path):
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(OSError):
        ev.EventWriter(str(plain / "run"))


def test_write_fails_midway(tmp_path, caplog):
    d = str(tmp_path / "full")
    w = ev.EventWriter(d, flush_secs=0)
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, old[1]))
    try:
        for s in range(1, 200):
            w.add_scalars({"a": 1, "b": 2, "c": s}, s)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_sig)
    assert w.failed
    w.close()
    errors = [r for r in caplog.records if r.name == "psd.events" and r.levelname == "ERROR"]
    assert len(errors) == 1
    data = open(files(d)[0], "rb").read()
    assert len(data) <= 1000
    evs = list(ev.read_events(files(d)[0]))
    # whole records only: the last one ends where the file ends
    assert len(evs) >= 2 and sum(16 + len(ev.encode_event(e["wall_time"], e["step"],
                                                            scalars=e.get("scalars"),
                                                            file_version=e.get("file_version")))
                                 for e in evs) == len(data)


def test_tensorboard_reads_it(tmp_path):
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator",
        reason="the tensorboard package is not installed (deploy/setup.sh --test makes a venv "
               "with it)")
    d = str(tmp_path / "tb")
    with ev.EventWriter(d) as w:
        for s in range(1, 11):
            w.add_scalar("train/loss", 0.25 * s, s)
        w.add_histogram("w", [0.5, 1.5, -2.0], 10)
    acc = accumulator.EventAccumulator(d, size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == \
        [(s, 0.25 * s) for s in range(1, 11)]
    h = acc.Histograms("w")[0].histogram_value
    assert h.num == 3 and h.min == -2.0 and h.max == 1.5


def test_torch_attach_logdir(tmp_path, cluster2, uname):
    """psd.torch.attach(logdir=...): psd's figures every events_every steps in
    logdir/worker-0, and the user's own scalars through dist.events into the same file."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (python3-torch)")
    import psd
    import psd.torch
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    logdir = str(tmp_path / "logs")
    with psd.Client(cluster2.spec, use_env=False, deadline_ms=10000, worker_id=0) as c:
        dist = psd.torch.attach(c, model, optimizer="sgd", lr=0.1, prefix=uname + "/",
                                chief=True, staleness=psd.STALENESS_ASYNC, logdir=logdir,
                                events_every=2)
        for s in range(6):
            model.zero_grad()
            loss = model(torch.randn(4, 8)).square().mean()
            loss.backward()
            clock = dist.step()
            dist.events.add_scalar("train/loss", loss.item(), clock)
        dist.detach()
        dist.events.close()
    names = files(os.path.join(logdir, "worker-0"))
    assert len(names) == 1
    evs = list(ev.read_events(names[0]))
    psd_steps = [e["step"] for e in evs if "psd/push_ms" in e.get("scalars", {})]
    assert len(psd_steps) == 3 and all(s % 2 == 0 for s in psd_steps)
    for e in evs:
        if "psd/push_ms" in e.get("scalars", {}):
            sc = e["scalars"]
            assert sc["psd/bytes_pulled"] == 4 * sum(p.numel() for p in model.parameters())
            assert sc["psd/push_ms"] >= 0 and sc["psd/sync_ms"] >= 0
            assert "psd/staleness_max" in sc
    assert len([e for e in evs if "train/loss" in e.get("scalars", {})]) == 6
