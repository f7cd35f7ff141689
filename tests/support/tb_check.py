"""Checks TensorBoard event files with TensorBoard's own reader (its event_accumulator), for
tests/integration/test_events.sh; run with the interpreter of the venv that
`deploy/setup.sh --test` makes (the tensorboard package from PyPI).

    tb_check.py cluster LOGDIR LOG        the run directories of a ps-local --logdir run against
                                          the JSON log lines of its stderr (LOG)
    tb_check.py python LOGDIR PSD_PYDIR   psd.events (client/python) writes, TensorBoard reads
    tb_check.py whole LOGDIR              every event file under LOGDIR loads (no torn record)

Exit 0 when everything matches, 1 with the differences on stderr."""

from __future__ import annotations

import glob
import json
import math
import os
import sys

from tensorboard.backend.event_processing import event_accumulator as ea

errors = []


def check(cond: bool, msg: str) -> None:
    if not cond:
        errors.append(msg)


def load(run: str) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    return acc


def close(a: float, b: float, rel: float, abs_: float) -> bool:
    return abs(a - b) <= max(abs_, rel * max(abs(a), abs(b)))


def log_lines(path: str):
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                pass


def cluster(logdir: str, log: str) -> None:
    lines = list(log_lines(log))
    runs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(logdir, "*")))
    check(runs == ["ps-0", "worker-0", "worker-1"], f"run directories {runs}")
    for w in (0, 1):
        acc = load(os.path.join(logdir, f"worker-{w}"))
        tags = set(acc.Tags()["scalars"])
        want = {"train/loss", "train/accuracy", "train/samples_per_s", "train/step_ms",
                "train/comm_share", "train/lost_pushes", "staleness/max", "staleness/waits",
                "staleness/wait_ms"}
        check(want <= tags, f"worker-{w}: tags {sorted(tags)} lack {sorted(want - tags)}")
        progress = {d["step"]: d for d in lines
                    if d.get("role") == "worker" and d.get("task") == w and "loss" in d
                    and "train_accuracy" in d}
        check(len(progress) >= 2, f"worker {w}: {len(progress)} progress log lines")
        for name, field, rel, abs_ in (("train/loss", "loss", 1e-5, 2e-5),
                                       ("train/accuracy", "train_accuracy", 1e-5, 1e-4),
                                       ("train/samples_per_s", "samples_per_s", 1e-5, 0.1),
                                       ("train/step_ms", "step_ms", 1e-5, 1e-3),
                                       ("staleness/max", "staleness_max", 0, 0)):
            if name not in tags:
                continue
            got = {e.step: e.value for e in acc.Scalars(name)}
            for step, d in progress.items():
                check(step in got, f"worker-{w} {name}: no value at step {step}")
                if step in got:
                    check(close(got[step], float(d[field]), rel, abs_),
                          f"worker-{w} {name} at step {step}: {got[step]} in the event file, "
                          f"{d[field]} in the log")
        if w == 0:
            evals = {d["step"]: d for d in lines
                     if d.get("role") == "worker" and d.get("task") == 0 and "test_accuracy" in d}
            check(len(evals) >= 2, f"worker 0: {len(evals)} evaluation log lines")
            check({"test/loss", "test/accuracy"} <= tags, "worker-0: no test/ tags")
            if "test/accuracy" in tags:
                got = {e.step: e.value for e in acc.Scalars("test/accuracy")}
                for step, d in evals.items():
                    check(step in got and close(got[step], d["test_accuracy"], 0, 1e-4),
                          f"worker-0 test/accuracy at {step}: {got.get(step)} against "
                          f"{d['test_accuracy']}")
            hists = set(acc.Tags()["histograms"])
            check(any(h.startswith("weights/") for h in hists) and
                  any(h.startswith("gradients/") for h in hists),
                  f"worker-0: histograms {sorted(hists)}")
            for h in hists:
                for e in acc.Histograms(h):
                    check(e.histogram_value.num > 0, f"{h} at {e.step}: empty")
    acc = load(os.path.join(logdir, "ps-0"))
    tags = set(acc.Tags()["scalars"])
    for t in ("server_uptime_seconds", "server_memory_bytes", "server_variables",
              "rpc_request_duration_seconds_per_s/method=Step",
              "rpc_received_bytes_per_s/method=Step"):
        check(t in tags, f"ps-0: no tag {t} (of {len(tags)})")
    check(any(t.startswith("rpc_request_duration_seconds_p99") for t in tags),
          "ps-0: no p99 of the request times")
    steps = [e.step for e in acc.Scalars("server_uptime_seconds")]
    check(len(steps) >= 2 and steps == sorted(set(steps)), f"ps-0 steps {steps}")
    rates = [e.value for e in acc.Scalars("rpc_request_duration_seconds_per_s/method=Step")]
    check(any(r > 0 for r in rates), f"ps-0: Step requests per second {rates}")


def python_writer(logdir: str, pydir: str) -> None:
    sys.path.insert(0, pydir)
    import psd.events as pe
    run = os.path.join(logdir, "py-0")
    with pe.EventWriter(run) as w:
        for s in range(1, 21):
            w.add_scalars({"train/loss": 1.0 / s, "train/accuracy": s / 20.0}, s)
        w.add_histogram("weights/w", [x / 10.0 for x in range(-50, 50)], 20)
    acc = load(run)
    got = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    want = [(s, float(__import__("numpy").float32(1.0 / s))) for s in range(1, 21)]
    check(got == want, f"python writer: train/loss {got[:3]}... against {want[:3]}...")
    h = acc.Histograms("weights/w")[0].histogram_value
    check(h.num == 100 and math.isclose(h.min, -5.0) and math.isclose(h.max, 4.9),
          f"python writer: histogram {h.num} {h.min} {h.max}")


def whole(logdir: str) -> None:
    import psd.events as pe  # noqa: F401 (PYTHONPATH: client/python)
    n = 0
    for path in glob.glob(os.path.join(logdir, "**", "events.out.tfevents.*"), recursive=True):
        try:
            n += len(list(pe.read_events(path)))
        except ValueError as e:
            check(False, f"{path}: {e}")
    for run in glob.glob(os.path.join(logdir, "*")):
        load(run)  # raises on a corrupt record
    check(n > 0, f"no events under {logdir}")


def main() -> int:
    mode = sys.argv[1]
    if mode == "cluster":
        cluster(sys.argv[2], sys.argv[3])
    elif mode == "python":
        python_writer(sys.argv[2], sys.argv[3])
    elif mode == "whole":
        whole(sys.argv[2])
    else:
        print(f"unknown mode {mode}", file=sys.stderr)
        return 2
    for e in errors:
        print("MISMATCH: " + e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
