"""What makes an example a data-parallel worker like ps-worker: its task (TF_CONFIG or flags),
its shard of the data, its thread count, its log lines (JSON lines as ps-worker writes them,
which ps-local reads for its progress line and summary) and the run record on the servers
(who has finished, whether this is a resumed run). Imports neither NumPy nor PyTorch, so that
an example can set its thread count before they load."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, List, NoReturn, Optional, Tuple

DATA_DIR = "/usr/share/datasets/fashion-mnist"


def add_worker_flags(ap: argparse.ArgumentParser, *, epochs: int, prefix: str) -> None:
    """The flags every example has."""
    ap.add_argument("--cluster", help="cluster spec JSON, bare ({\"ps\": [...]}) or in the "
                    "TF_CONFIG form with a task (default: TF_CONFIG / PS_CLUSTER)")
    ap.add_argument("--task-index", type=int, default=None,
                    help="this worker's index among the workers, the chief (if any) being 0 "
                    "(default: from TF_CONFIG's task; 0 without one)")
    ap.add_argument("--num-workers", type=int, default=None,
                    help="number of workers sharing the data (default: the chief and worker "
                    "tasks of the cluster spec; 1 without any)")
    ap.add_argument("--data-dir", default=DATA_DIR)
    ap.add_argument("--epochs", type=int, default=epochs)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prefix", default=prefix, help="variable name prefix")
    ap.add_argument("--threads", type=int, default=0,
                    help="compute threads of this worker; 0: 1 when several worker tasks of "
                    "the cluster spec are on this machine, else the library's default")
    ap.add_argument("--log-every", type=int, default=100,
                    help="steps between step log lines (0: none)")
    ap.add_argument("--log-format", choices=("auto", "text", "json"), default="auto",
                    help="stderr log lines: JSON lines (as ps-worker writes them), text, or "
                    "auto: text on a terminal, else JSON")
    ap.add_argument("--done-wait-s", type=float, default=600.0,
                    help="how long worker 0 waits for the others to finish before it "
                    "evaluates the model as it is")


def config_error(msg: str) -> "NoReturn":
    """Exits 2, a configuration error (as ps-worker does: ps-local does not restart it)."""
    print(f"{os.path.basename(sys.argv[0])}: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


@dataclass
class Task:
    """Where this worker stands: index (0 .. count-1, the chief first), the cluster spec
    (None: the client reads TF_CONFIG / PS_CLUSTER), role and task index for log lines, and
    how many worker tasks share this machine."""

    index: int
    count: int
    cluster: Optional[Any]
    role: str
    task_index: int
    local_workers: int


def _is_local(addr: str) -> bool:
    host = addr.rsplit(":", 1)[0].strip("[]") if ":" in addr else addr
    if host in ("localhost", "::1") or host.startswith("127."):
        return True
    try:
        return host in (socket.gethostname(), socket.getfqdn())
    except OSError:
        return False


def task_of(args: argparse.Namespace) -> Task:
    """The task from --cluster or TF_CONFIG, then --task-index / --num-workers. Exits 2 (a
    configuration error: ps-local does not restart it) on a bad spec."""
    spec: Any = None
    if args.cluster:
        try:
            spec = json.loads(args.cluster)
        except ValueError as e:
            config_error(f"--cluster: not JSON: {e}")
    tf = spec if isinstance(spec, dict) and "cluster" in spec else None
    if tf is None and spec is None and os.environ.get("TF_CONFIG"):
        try:
            tf = json.loads(os.environ["TF_CONFIG"])
        except ValueError as e:
            config_error(f"TF_CONFIG: not JSON: {e}")
    cluster = (tf or {}).get("cluster") if tf is not None else spec
    cluster = cluster if isinstance(cluster, dict) else {}
    chiefs: List[str] = list(cluster.get("chief") or [])
    workers: List[str] = list(cluster.get("worker") or [])
    role, task_index = "worker", 0
    index = 0
    t = (tf or {}).get("task") or {}
    if t:
        role, task_index = str(t.get("type", "worker")), int(t.get("index", 0))
        if role not in ("worker", "chief"):
            config_error(f"the task is {role}:{task_index}, but this program runs a worker "
                         f"or chief task")
        index = task_index if role == "chief" else len(chiefs) + task_index
    count = len(chiefs) + len(workers) or 1
    if args.task_index is not None:
        index = args.task_index
        if not t:
            task_index = index
    if args.num_workers is not None:
        count = args.num_workers
    if count < 1 or not 0 <= index < count:
        config_error(f"worker index {index} is not in 0..{count - 1} (--task-index, "
                     f"--num-workers or TF_CONFIG)")
    addrs = chiefs + workers
    local = sum(_is_local(a) for a in addrs) if addrs else count
    return Task(index, count, spec, role, task_index, local)


def threads_for(args: argparse.Namespace, task: Task) -> int:
    """--threads, or for 0: 1 when other workers share this machine, else 0 (keep the
    library's default)."""
    if args.threads > 0:
        return args.threads
    return 1 if task.local_workers > 1 else 0


class Log:
    """Log lines on stderr: JSON lines with ts, level, role, task, msg and the line's fields
    (README, "Log lines"), or text (`ts LEVEL role/task: msg`)."""

    def __init__(self, task: Task, fmt: str) -> None:
        self.role, self.task = task.role, task.task_index
        self.json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())

    def __call__(self, level: str, msg: str, **fields: Any) -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        ts = now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"
        if self.json:
            # NaN and infinities are not JSON: null
            fields = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                      for k, v in fields.items()}
            line = {"ts": ts, "level": level, "role": self.role, "task": self.task,
                    "msg": msg, **fields}
            text = json.dumps(line, separators=(",", ":"))
        else:
            text = f"{ts} {level.upper()} {self.role}/{self.task}: {msg}"
        print(text, file=sys.stderr, flush=True)

    def info(self, msg: str, **fields: Any) -> None:
        self("info", msg, **fields)

    def warn(self, msg: str, **fields: Any) -> None:
        self("warn", msg, **fields)


class RunRecord:
    """Two counters per worker on the servers, each a slot of a variable updated by SGD with
    rate 1 (a push of -1 adds 1; only worker i writes slot i, exactly once per push):
    `<prefix>/workers_started_of_<N>` counts the starts of each worker and
    `<prefix>/workers_done_of_<N>` its finished runs. A start that finds earlier starts of
    its own slot is a resume (a new run against trained variables, or this worker restarted)
    and is logged as one. Worker 0 waits, before it evaluates, until every live worker has
    finished as many runs as itself."""

    def __init__(self, client: Any, prefix: str, task: Task, log: Log) -> None:
        import array

        import psd

        self.task, self.log, self.client = task, log, client
        n = task.count
        common = dict(optimizer="sgd", learning_rate=1.0, staleness=psd.STALENESS_ASYNC)
        self.started = client.create_variable(f"{prefix}/workers_started_of_{n}", (n,),
                                              **common)
        self.done = client.create_variable(f"{prefix}/workers_done_of_{n}", (n,), **common)
        self._one = array.array("f", [-1.0])
        got = array.array("f", [0.0])
        self.started.push_pull(self._one, got, offset=task.index)
        self.starts = int(round(got[0]))
        self.done.pull(got, offset=task.index)
        self.finished_before = int(round(got[0]))

    @property
    def resumed(self) -> bool:
        return self.starts > 1

    def log_start(self, prefix: str) -> None:
        if not self.resumed:
            return
        earlier = self.starts - 1
        unfinished = max(earlier - self.finished_before, 0)
        self.log.warn(f"resuming: the servers already hold {prefix}/* (worker "
                      f"{self.task.index} started {earlier} time(s) before: "
                      f"{self.finished_before} finished run(s), {unfinished} unfinished or "
                      f"restarted); training continues from the servers' values, not from a "
                      f"new initialization (use another --prefix, or delete the variables "
                      f"with psctl, to start afresh)", resumed=True, earlier_starts=earlier,
                      earlier_finished=self.finished_before)

    def finish(self) -> int:
        """Counts this worker's run as finished; returns how many it has finished."""
        import array

        got = array.array("f", [0.0])
        self.done.push_pull(self._one, got, offset=self.task.index)
        return int(round(got[0]))

    def wait_for_others(self, mine: int, timeout_s: float) -> None:
        """Worker 0: waits until every live worker's done counter reaches `mine`."""
        import array

        n = self.task.count
        if n == 1:
            return
        done = array.array("f", [0.0] * n)
        deadline = time.monotonic() + timeout_s
        told = set()
        logged = False
        while True:
            self.done.pull(done)
            live = self.client.workers_live(n)
            waiting = 0
            finished = sum(1 for i in range(n) if round(done[i]) >= mine)
            for i in range(n):
                if round(done[i]) >= mine:
                    continue
                if live[i]:
                    waiting += 1
                elif i not in told:
                    told.add(i)
                    self.log.warn(f"worker {i} died or was evicted before finishing: not "
                                  f"waiting for it")
            if waiting == 0:
                if finished < n:
                    self.log.warn(f"{finished} of {n} workers finished; evaluating without "
                                  f"the {n - finished} that died")
                return
            if time.monotonic() >= deadline:
                self.log.warn(f"{finished} of {n} workers finished after {timeout_s:.0f} s "
                              f"(--done-wait-s): evaluating the model as it is")
                return
            if not logged:
                self.log.info(f"waiting for the other workers to finish ({finished} of {n} "
                              f"done)")
                logged = True
            time.sleep(0.05)


class Meter:
    """Training time and samples of this worker (evaluations excluded), and the step lines."""

    def __init__(self, log: Log, total_steps: int, batch: int, every: int) -> None:
        self.log, self.total, self.batch, self.every = log, total_steps, batch, every
        self.steps = 0
        self.train_s = 0.0
        self.comm_s = 0.0
        self._window_steps = 0
        self._window_s = 0.0
        self.loss = float("nan")

    def step(self, epoch: int, loss: float, step_s: float, comm_s: float) -> None:
        self.steps += 1
        self.train_s += step_s
        self.comm_s += comm_s
        self._window_steps += 1
        self._window_s += step_s
        self.loss = loss
        if self.every > 0 and self.steps % self.every == 0:
            sps = self._window_steps * self.batch / self._window_s if self._window_s else 0.0
            self.log.info(f"step {self.steps}/{self.total} epoch {epoch} loss {loss:.4f} "
                          f"{sps:.0f} samples/s", step=self.steps, epoch=epoch,
                          loss=round(loss, 5), samples_per_s=round(sps, 1),
                          step_ms=round(1000 * self._window_s / self._window_steps, 3))
            self._window_steps = 0
            self._window_s = 0.0

    @property
    def samples_per_s(self) -> float:
        return self.steps * self.batch / self.train_s if self.train_s > 0 else 0.0

    def log_result(self, resumed: bool) -> None:
        comm = 1000 * self.comm_s / max(self.steps, 1)
        compute = 1000 * self.train_s / max(self.steps, 1) - comm
        self.log.info(f"trained {self.steps} steps in {self.train_s:.2f} s: "
                      f"{self.samples_per_s:.0f} samples/s, {comm:.3f} ms/step in "
                      f"communication, {compute:.3f} ms/step computing"
                      f"{' (resumed)' if resumed else ''}",
                      steps=self.steps, samples=self.steps * self.batch,
                      wall_s=round(self.train_s, 3), samples_per_s=round(self.samples_per_s, 1),
                      comm_ms_per_step=round(comm, 3), compute_ms_per_step=round(compute, 3),
                      loss=round(self.loss, 5))


def run_plan(args: argparse.Namespace, log: Log, n: int) -> Tuple[int, int, Meter]:
    """A run over n examples: the batch size (--batch, at most n), the steps of an epoch (the
    last partial batch left out) and the Meter of --epochs such epochs."""
    batch = min(args.batch, n)
    steps_per_epoch = n // batch
    return batch, steps_per_epoch, Meter(log, steps_per_epoch * args.epochs, batch,
                                         args.log_every)

def log_eval(log: Log, meter: Meter, epoch: int, acc: float, test_loss: float,
             final: bool) -> None:
    """The `eval` (after an epoch) or `final` line of worker 0's evaluation."""
    log.info(f"{'final' if final else 'eval'} test_accuracy={acc:.4f} "
             f"test_loss={test_loss:.4f}", step=meter.steps, epoch=epoch,
             test_loss=round(test_loss, 5), test_accuracy=round(acc, 4), final=final)


def finish_run(args: argparse.Namespace, task: Task, log: Log, record: RunRecord, meter: Meter,
               evaluate_servers: Callable[[], Tuple[float, float]]) -> int:
    """The end of a worker's training: its result line, its run counted as finished; worker 0
    then waits for the others, evaluates what the servers hold (evaluate_servers: pulls the
    model and returns the test accuracy and loss), logs it and prints the `test_accuracy=...`
    line on stdout. Returns the exit code."""
    meter.log_result(record.resumed)
    mine = record.finish()
    if task.index != 0:
        return 0
    record.wait_for_others(mine, args.done_wait_s)
    acc, test_loss = evaluate_servers()
    log_eval(log, meter, args.epochs, acc, test_loss, final=True)
    print(f"test_accuracy={acc:.4f} test_loss={test_loss:.4f} steps={meter.steps} "
          f"wall_s={meter.train_s:.2f} samples_per_s={meter.samples_per_s:.1f} "
          f"comm_ms_per_step={1000 * meter.comm_s / max(meter.steps, 1):.3f}", flush=True)
    return 0
