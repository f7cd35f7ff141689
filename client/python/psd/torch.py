"""psd.torch: a PyTorch module's parameters on the servers, in one call.

    import psd, psd.torch
    client = psd.Client()                      # TF_CONFIG from ps-local, Kubeflow, ...
    model = MyModel()                          # its own initial values are kept
    dist = psd.torch.attach(client, model, optimizer="adam", lr=1e-3, prefix="mymodel/")
    for x, y in batches:
        loss = loss_fn(model(x), y)
        model.zero_grad()
        loss.backward()                        # each gradient is pushed as soon as it is ready
        dist.step()                            # finishes the pushes, brings fresh parameters in

There is no torch optimizer: the servers run it (psd's server-side optimizers). attach() makes
every parameter a variable named prefix + its name in named_parameters(), with the optimizer,
learning rate and staleness bound of the call or of its parameter group (param_groups, as torch
optimizers take them). The module's own values become the servers' initial values: the chief
(TF_CONFIG task "chief", else worker 0, else a process without a task) creates the variables,
writes its values into them (Variable.assign) and then creates a marker variable
prefix + "__psd_torch_ready"; every other worker waits for the marker and pulls. A chief that
finds the marker already there (servers restored from a checkpoint, a restarted job) writes
nothing and pulls like the others: training resumes where the servers are.

Overlap: a hook on each parameter's gradient accumulator (Tensor.register_post_accumulate_grad_hook
where torch has it, the AccumulateGrad node's hook otherwise, as Horovod does) hands that gradient
over as soon as backward has computed it. Gradients are gathered into buckets in the order they
come (bucket_bytes, 4 MiB by default, as DDP's buckets): once a bucket holds bucket_bytes its
pushes start, all of them in one request per server, while backward computes the rest; the
gradients of the last, partial bucket (the late hooks: nothing is left to hide them behind) go
with step()'s own request, which pushes them, advances the clock and pulls every variable at the
new clock (waiting for the staleness bound) in one round trip per server. A model smaller than
bucket_bytes thus costs one request per server per step, as the C client's ps_step does;
bucket_bytes=0 starts every gradient's push from its hook. For a variable with staleness -1
(asynchronous) a bucket's push is a push-pull, so the parameter's next values come back with
its reply. One backward per step: a second accumulation into a gradient already handed over
raises (pass overlap=False to accumulate gradients over several backward passes; step() then
sends them all, CPU ones in the same one request per server that advances the clock and pulls).
Each of these is one call into libpsclient, through the native extension psd._ext where it is
built (psd/_calls.py), else through ctypes.

Tensors: CPU parameters and gradients are read and written in place (no copy). CUDA ones go
through pinned host buffers: the gradient is copied on a side stream ordered after the compute
stream (then pushed from a background thread once the copy is done), and fresh values are
copied back on the side stream, which the compute stream then waits for. Only float32 parameters
on the CPU or a CUDA device are accepted; anything else raises naming the parameter.

Embedding and EmbeddingBag are torch.nn.Embedding and torch.nn.EmbeddingBag over a psd sparse
table: forward pulls the rows of the batch's unique ids (or takes those prefetch() started for
it), backward starts the push of their gradients from a hook without waiting for it (once per
forward; the next forward, prefetch() or flush() waits for it); they hold no parameters and need
no step().

TensorBoard: attach(..., logdir=DIR) writes psd's own figures of every events_every steps into
DIR/<task type>-<index> (TF_CONFIG's task, as ps-worker's --logdir) with psd.events: psd/push_ms
(waiting for the pushes in step()), psd/sync_ms (clock and pull), psd/bytes_pushed and
psd/bytes_pulled per step, psd/staleness_max (the first variable's, as the servers saw it). The
writer is the attached module's .events: the user's own scalars go there too
(dist.events.add_scalar("train/loss", loss, step)), or through torch.utils.tensorboard into the
same directory.

torch is imported when this module is, not by ``import psd``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Mapping, Optional, Sequence

import torch

from . import _calls, _native
from ._buffers import _EMPTY_ADDR
from .client import STALENESS_ASYNC, STALENESS_DEFAULT, Client, Variable
from .errors import DeadlineExceededError, NotFoundError, error_for
from .events import EventWriter, run_dir

READY_MARKER = "__psd_torch_ready"

_HYPER = ("momentum", "nesterov", "beta1", "beta2", "epsilon", "initial_accumulator",
          "weight_decay")


def is_chief(tf_config: Optional[str] = None) -> bool:
    """Whether this process writes the initial values: TF_CONFIG's task is "chief", or
    "worker" 0 in a cluster without a chief, or there is no task at all."""
    text = os.environ.get("TF_CONFIG", "") if tf_config is None else tf_config
    if not text.strip():
        return True
    try:
        cfg = json.loads(text)
    except ValueError:
        raise ValueError("TF_CONFIG is not valid JSON") from None
    task = cfg.get("task") or {}
    kind, index = task.get("type"), int(task.get("index", 0))
    if kind is None:
        return True
    if kind == "chief":
        return True
    return kind == "worker" and index == 0 and not (cfg.get("cluster") or {}).get("chief")


def _grad_accumulator_hook(p: "torch.nn.Parameter", fn: Any) -> Any:
    """Registers fn() to run once p's gradient is accumulated into p.grad. Returns (handle,
    object to keep alive)."""
    if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
        return p.register_post_accumulate_grad_hook(lambda _p: fn()), None
    with torch.enable_grad():
        acc = p.expand_as(p).grad_fn.next_functions[0][0]  # the AccumulateGrad node
    return acc.register_hook(lambda *_: fn()), acc


class _CudaStage:
    """Pinned host copies of one CUDA parameter and its gradient, and the side stream."""

    _streams: Dict[Any, Any] = {}

    def __init__(self, p: "torch.Tensor") -> None:
        dev = p.device
        if dev not in _CudaStage._streams:
            _CudaStage._streams[dev] = torch.cuda.Stream(device=dev)
        self.stream = _CudaStage._streams[dev]
        self.device = dev
        self.host_grad = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
        self.host_param = torch.empty(p.shape, dtype=torch.float32, pin_memory=True)
        self.copied = torch.cuda.Event()
        self.landed = torch.cuda.Event()  # host_param's last copy to the device is done
        self.landed.record(self.stream)

    def grad_to_host(self, grad: "torch.Tensor") -> None:
        """Starts the copy of grad into host_grad after what the compute stream queued."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            self.host_grad.copy_(grad, non_blocking=True)
            grad.record_stream(self.stream)  # not reused by the allocator before the copy
            self.copied.record(self.stream)

    def param_from_host(self, p: "torch.Tensor") -> None:
        """Copies host_param into p; the compute stream waits for it."""
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream):
            p.data.copy_(self.host_param, non_blocking=True)
            self.landed.record(self.stream)
        compute.wait_stream(self.stream)


class _Entry:
    __slots__ = ("name", "param", "var", "asynchronous", "stage", "future", "pulled", "buf",
                 "grad", "sent")

    def __init__(self, name: str, param: "torch.nn.Parameter", var: Variable,
                 stage: Optional[_CudaStage]) -> None:
        self.name = name
        self.param = param
        self.var = var
        self.asynchronous = var.staleness_bound == STALENESS_ASYNC
        self.stage = stage
        self.future: Optional["Future[Any]"] = None  # a CUDA parameter's push (or push-pull)
        self.pulled: Any = None  # the push-pull's destination, when it brought values back
        self.buf: Any = None  # that destination for a CPU parameter, made once
        self.grad: Any = None  # this step's CPU gradient, waiting in the open bucket
        self.sent = False  # this step's gradient was handed over (bucket, request or stage)


def _addr(t: "torch.Tensor") -> int:
    """The address of a contiguous CPU float32 tensor's memory (a valid one when empty)."""
    return t.data_ptr() if t.numel() else _EMPTY_ADDR


def _check(rc: int) -> None:
    """Raises the PsError of a call that failed on this thread."""
    if rc != 0:
        from .client import _raise
        _raise(rc)


def _check_param(name: str, p: "torch.nn.Parameter") -> None:
    if p.dtype != torch.float32:
        raise TypeError(f"psd.torch: parameter {name!r} is {p.dtype}; only torch.float32 "
                        f"parameters can be attached (convert the module with .float())")
    if p.device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"psd.torch: parameter {name!r} is on {p.device} but CUDA is not "
                             f"available to this process")
    elif p.device.type != "cpu":
        raise ValueError(f"psd.torch: parameter {name!r} is on {p.device}; only CPU and CUDA "
                         f"parameters can be attached")
    if p.is_sparse:
        raise ValueError(f"psd.torch: parameter {name!r} is sparse; only dense parameters can "
                         f"be attached")


class AttachedModule:
    """A module whose parameters live on the servers (made by attach()).

    Attributes: module, client, variables (name -> psd.Variable, by named_parameters() name),
    chief (whether this process wrote the initial values), overlap."""

    def __init__(self, client: Client, module: "torch.nn.Module", *, optimizer: str,
                 lr: Optional[float], staleness: int, prefix: str,
                 param_groups: Optional[Sequence[Mapping[str, Any]]], chief: Optional[bool],
                 overlap: bool, init_timeout_s: float, seed: int,
                 hyper: Mapping[str, Any], logdir: Optional[str] = None,
                 events_every: int = 10, bucket_bytes: int = 4 << 20) -> None:
        for k in hyper:
            if k not in _HYPER:
                raise TypeError(f"psd.torch.attach: unknown argument {k!r} (hyper-parameters: "
                                f"{', '.join(_HYPER)})")
        self.module = module
        self.client = client
        self.overlap = overlap
        self.chief = is_chief() if chief is None else bool(chief)
        self.prefix = prefix
        self._lock = threading.Lock()
        self._error: Optional[BaseException] = None
        self._handles: List[Any] = []
        self._keep: List[Any] = []
        self._executor: Optional[ThreadPoolExecutor] = None
        self.events: Optional[EventWriter] = None
        if logdir is not None:
            self.events = EventWriter(run_dir(logdir))  # OSError: unusable directory
        self._events_every = max(1, int(events_every))
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or \
                bucket_bytes < 0:
            raise ValueError(f"psd.torch.attach: bucket_bytes must be an int >= 0, not "
                             f"{bucket_bytes!r}")
        self.bucket_bytes = bucket_bytes
        self._bucket: List[_Entry] = []  # CPU gradients handed over, not sent yet
        self._bucket_bytes = 0
        self._ops: List[Any] = []  # this step's bucket requests in flight (psd/_calls.py ops)
        self._win = [0, 0.0, 0.0, 0, 0]  # steps, push s, sync s, bytes pushed, bytes pulled

        named = list(module.named_parameters())
        if not named:
            raise ValueError("psd.torch.attach: the module has no parameters")
        by_id = {id(p): n for n, p in named}
        settings: Dict[str, Dict[str, Any]] = {}
        base = dict(optimizer=optimizer, learning_rate=lr, staleness=staleness, **hyper)
        for gi, group in enumerate(param_groups or ()):
            g = dict(group)
            params = g.pop("params", None)
            if params is None:
                raise ValueError(f"psd.torch.attach: param_groups[{gi}] has no 'params'")
            if "lr" in g:
                g["learning_rate"] = g.pop("lr")
            for k in g:
                if k not in ("optimizer", "learning_rate", "staleness") + _HYPER:
                    raise ValueError(f"psd.torch.attach: param_groups[{gi}] has unknown key "
                                     f"{k!r}")
            for p in (params if isinstance(params, (list, tuple)) else list(params)):
                n = by_id.get(id(p))
                if n is None:
                    raise ValueError(f"psd.torch.attach: param_groups[{gi}] holds a tensor "
                                     f"that is not a parameter of the module")
                if n in settings:
                    raise ValueError(f"psd.torch.attach: parameter {n!r} is in two "
                                     f"param_groups")
                settings[n] = {**base, **g}
        for n, p in named:
            _check_param(n, p)

        self.variables: Dict[str, Variable] = {}
        self._entries: List[_Entry] = []
        marker = prefix + READY_MARKER
        resumed = False
        if self.chief:
            try:
                client.variable(marker)
                resumed = True
            except NotFoundError:
                pass
        else:
            self._wait_for(marker, init_timeout_s)
        for n, p in named:
            s = settings.get(n, base)
            kw = {k: v for k, v in s.items() if v is not None}
            var = client.create_variable(prefix + n, tuple(p.shape), seed=seed, **kw)
            stage = _CudaStage(p) if p.device.type == "cuda" else None
            self.variables[n] = var
            self._entries.append(_Entry(n, p, var, stage))
        if self.chief and not resumed:
            futs = []
            for e in self._entries:
                src = e.param.detach()
                if e.stage is not None:
                    e.stage.host_param.copy_(src)
                    src = e.stage.host_param
                futs.append(e.var.assign_async(src.contiguous()))
            for f in futs:
                f.result()
            client.create_variable(marker, (), staleness=STALENESS_ASYNC)
        else:
            self.pull()
        if any(e.stage is not None for e in self._entries):
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="psd-torch-cuda")
        if overlap:
            for e in self._entries:
                if e.param.requires_grad:
                    h, keep = _grad_accumulator_hook(e.param, self._hook(e))
                    self._handles.append(h)
                    if keep is not None:
                        self._keep.append(keep)

    # -- set-up --

    def _wait_for(self, marker: str, timeout_s: float) -> None:
        """Waits until the chief has created the marker (its values are written)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.02
        while True:
            try:
                self.client.variable(marker)
                return
            except NotFoundError:
                pass
            if time.monotonic() >= deadline:
                raise DeadlineExceededError(
                    f"psd.torch: the chief did not write the initial values within "
                    f"{timeout_s:g} s (no variable {marker!r} on the servers); is a chief "
                    f"(TF_CONFIG task chief, or worker 0) running attach() with the same prefix?")
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _hook(self, e: _Entry) -> Any:
        def on_grad() -> None:
            self._start_push(e)
        return on_grad

    # -- pushes --

    def _start_push(self, e: _Entry, send_full: bool = True) -> None:
        """Hands e's gradient over: into the open bucket (sent once it holds bucket_bytes, if
        send_full) for a CPU parameter, to the stage thread for a CUDA one."""
        if e.sent:
            raise RuntimeError(
                f"psd.torch: the gradient of {e.name!r} was accumulated again after it was "
                f"pushed in this step; call step() after each backward, or attach with "
                f"overlap=False to accumulate gradients over several backward passes")
        grad = e.param.grad
        if grad is None:
            return
        if grad.is_sparse:
            raise ValueError(f"psd.torch: the gradient of {e.name!r} is sparse")
        e.sent = True
        if e.stage is None:
            e.grad = grad if grad.is_contiguous() else grad.contiguous()
            self._bucket.append(e)
            self._bucket_bytes += e.grad.numel() * 4
            if send_full and self._bucket_bytes >= self.bucket_bytes:
                self._send_bucket()
            return
        st = e.stage
        st.grad_to_host(grad)
        var, asynchronous = e.var, e.asynchronous

        def send() -> "Future[Any]":
            # Runs on the stage thread, so that backward does not wait for the copy: the
            # gradient is on the host once `copied` is done; host_param may be written again
            # once its previous copy to the device is done. Returns the push's Future.
            st.copied.synchronize()
            if asynchronous:
                st.landed.synchronize()
                return var.push_pull_async(st.host_grad, st.host_param)
            return var.push_async(st.host_grad)

        assert self._executor is not None
        e.future = self._executor.submit(send)
        e.pulled = st.host_param if asynchronous else None

    def _send_bucket(self) -> None:
        """Starts the pushes of the open bucket's gradients in one request per server (a
        push-pull into e.buf for an asynchronous variable)."""
        items = []
        keep = []
        for e in self._bucket:
            dst = None
            if e.asynchronous:
                # not into param.data: backward may still read the parameter
                if e.buf is None or e.buf.shape != e.param.shape:
                    e.buf = torch.empty_like(e.param.data, memory_format=torch.contiguous_format)
                dst = _addr(e.buf)
                e.pulled = e.buf
                keep.append(e.buf)
            items.append((e.var._h, 0, e.var.size, _addr(e.grad), dst))
            keep.append(e.grad)
            e.grad = None
        self._bucket = []
        self._bucket_bytes = 0
        c = self.client._enter()
        try:
            rc, op = _calls.impl().step_async(c, items, (), 0, keep)
        finally:
            self.client._leave()
        _check(rc)
        self._ops.append(op)

    # -- step --

    def step(self) -> int:
        """Finishes this step: pushes what the hooks have not sent (all of it with
        overlap=False), waits for the pushes already in flight, and in one request per server
        pushes the rest, advances the clock and brings the fresh parameters into the module (in
        place: the Parameter objects stay the same). Returns the new clock. Raises the first
        failed push's PsError (the other pushes are still waited for)."""
        t0 = time.perf_counter()
        if not self.overlap:
            for e in self._entries:
                self._start_push(e, send_full=False)  # every CPU gradient in the one request
        first: Optional[BaseException] = None
        for op in self._ops:
            rc = op.wait()
            if rc != 0 and first is None:
                first = error_for(rc, op.message())
            op.close()
        self._ops = []
        for e in self._entries:
            if e.future is None:
                continue
            try:
                r = e.future.result()
                if isinstance(r, Future):  # a CUDA parameter's: the push the stage started
                    r.result()
            except BaseException as x:  # noqa: BLE001 (re-raised below)
                if first is None:
                    first = x
            e.future = None
        if first is not None:
            for e in self._entries:
                e.pulled = e.grad = None
                e.sent = False
            self._bucket = []
            self._bucket_bytes = 0
            raise first
        t1 = time.perf_counter()
        items = []
        keep = []
        landed: List[_Entry] = []
        for e in self._entries:
            e.sent = False
            if e.pulled is not None:
                if e.stage is None:
                    e.param.data.copy_(e.pulled)
                else:
                    landed.append(e)
                e.pulled = None
                continue
            grad = None
            if e.grad is not None:
                grad = _addr(e.grad)
                keep.append(e.grad)
                e.grad = None
            if e.stage is not None:
                dst = e.stage.host_param
                landed.append(e)
            else:
                dst = e.param.data
                if not dst.is_contiguous():
                    raise ValueError(f"psd.torch: parameter {e.name!r} is no longer "
                                     f"contiguous; its values cannot be pulled in place")
            items.append((e.var._h, 0, e.var.size, grad, _addr(dst)))
        self._bucket = []
        self._bucket_bytes = 0
        for e in landed:
            e.stage.landed.synchronize()  # host_param may be written again (the step)
        if items:
            self.client._step_raw(items, (), _native.PS_STEP_CLOCK)
        else:
            self.client.clock()
        del keep
        for e in landed:
            e.stage.param_from_host(e.param)
        if self.events is not None:
            self._record(t0, t1, time.perf_counter())
        return self.client.current_clock

    def _record(self, t0: float, t1: float, t2: float) -> None:
        w = self._win
        w[0] += 1
        w[1] += t1 - t0
        w[2] += t2 - t1
        for e in self._entries:
            n = e.param.numel() * 4
            w[4] += n
            if e.param.grad is not None:
                w[3] += n
        clock = self.client.current_clock
        if clock % self._events_every != 0:
            return
        k = float(w[0])
        values = {"psd/push_ms": w[1] * 1e3 / k, "psd/sync_ms": w[2] * 1e3 / k,
                  "psd/bytes_pushed": w[3] / k, "psd/bytes_pulled": w[4] / k}
        try:
            values["psd/staleness_max"] = float(self._entries[0].var.staleness().max)
        except Exception:  # noqa: BLE001 (a figure, never a reason to stop training)
            pass
        assert self.events is not None
        self.events.add_scalars(values, clock)
        self._win = [0, 0.0, 0.0, 0, 0]

    def pull(self) -> None:
        """Copies every parameter's current values from the servers into the module."""
        for e in self._entries:
            if e.stage is not None:
                e.stage.landed.synchronize()
        futs = [e.var.pull_async(e.stage.host_param if e.stage else e.param.data)
                for e in self._entries]
        for f in futs:
            f.result()
        for e in self._entries:
            if e.stage is not None:
                e.stage.param_from_host(e.param)

    def detach(self) -> None:
        """Removes the gradient hooks (the variables stay on the servers) and flushes the event
        file (.events stays open for the user's last figures; close() it, or it closes when
        collected). Idempotent."""
        if self.events is not None:
            self.events.flush()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        for op in self._ops:  # a step's pushes never finished by step(): waited for, dropped
            op.close()
        self._ops = []
        self._bucket = []
        self._bucket_bytes = 0
        self._keep.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> "AttachedModule":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()


def attach(client: Client, module: "torch.nn.Module", *, optimizer: str = "sgd",
           lr: Optional[float] = None, staleness: int = STALENESS_DEFAULT, prefix: str = "",
           param_groups: Optional[Sequence[Mapping[str, Any]]] = None,
           chief: Optional[bool] = None, overlap: bool = True, init_timeout_s: float = 300.0,
           seed: int = 0, logdir: Optional[str] = None, events_every: int = 10,
           bucket_bytes: int = 4 << 20, **hyper: Any) -> AttachedModule:
    """Puts every parameter of `module` on the servers and hooks its gradients (see the
    module's documentation). Blocks until the variables exist and hold the chief's values.

    Args:
        client: a worker's psd.Client (a worker id: TF_CONFIG's task or task="worker:N"),
            since step() advances the clock.
        optimizer, lr, staleness, and momentum, nesterov, beta1, beta2, epsilon,
            initial_accumulator, weight_decay: the servers' optimizer for every parameter not
            in a group (None: the library's default).
        prefix: prepended to every variable name (e.g. "mlp/"), so that several models share
            the servers.
        param_groups: [{"params": [...], "optimizer": ..., "lr": ..., "staleness": ...}, ...]
            for parameters with their own settings.
        chief: whether this process writes the initial values (default: is_chief()).
        overlap: hand each gradient over from its hook during backward (False: step() pushes
            them all after backward).
        bucket_bytes: with overlap, the gradients' pushes start during backward once this many
            bytes of them are ready (one request per server for all of them); the rest go with
            step()'s request. 0: every gradient's push starts from its hook.
        init_timeout_s: how long a non-chief waits for the chief's values.
        logdir, events_every: TensorBoard event files of psd's figures every events_every
            steps in logdir/<task type>-<index> (the module's documentation); None: none.
    Raises TypeError/ValueError naming a parameter that cannot be attached (not float32, not on
    the CPU or a CUDA device), DeadlineExceededError when the chief's values do not come in
    time, and the servers' errors (AlreadyExistsError for a variable of another shape).
    """
    return AttachedModule(client, module, optimizer=optimizer, lr=lr, staleness=staleness,
                          prefix=prefix, param_groups=param_groups, chief=chief,
                          overlap=overlap, init_timeout_s=init_timeout_s, seed=seed,
                          hyper=hyper, logdir=logdir, events_every=events_every,
                          bucket_bytes=bucket_bytes)


# -- embedding modules over sparse tables --

_MODES = ("sum", "mean")


def _table_for(client: Client, name: str, embedding_dim: Optional[int],
               table_kw: Dict[str, Any], who: str) -> Any:
    """Creates (idempotent for the same spec) or, with embedding_dim None, finds the table."""
    if embedding_dim is None:
        given = [k for k, v in table_kw.items() if v is not None]
        if given:
            raise TypeError(f"psd.torch.{who}: {', '.join(given)} given without "
                            f"embedding_dim (a table is found by name only when "
                            f"embedding_dim is None)")
        return client.table(name)
    if isinstance(embedding_dim, bool) or not isinstance(embedding_dim, int) \
            or embedding_dim < 1:
        raise ValueError(f"psd.torch.{who}: embedding_dim must be a positive int, not "
                         f"{embedding_dim!r}")
    kw = {k: v for k, v in table_kw.items() if v is not None}
    if "lr" in kw:
        kw["learning_rate"] = kw.pop("lr")
    return client.create_table(name, embedding_dim, **kw)


class _TableModule(torch.nn.Module):
    """What Embedding and EmbeddingBag share: the table, the ids' checks, the pull of the
    unique ids' rows as a leaf tensor and the hook that pushes their gradient."""

    def __init__(self, who: str, client: Client, name: str, num_embeddings: Optional[int],
                 embedding_dim: Optional[int], optimizer: str, lr: Optional[float],
                 initializer: str, init_a: float, init_b: float, seed: int,
                 table_kw: Dict[str, Any]) -> None:
        super().__init__()
        self._who = who
        for k in ("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse",
                  "_weight"):
            if k in table_kw:
                raise TypeError(f"psd.torch.{who}: {k} (an argument of torch's module) is not "
                                f"supported over a table")
        if num_embeddings is not None and (isinstance(num_embeddings, bool) or
                                           not isinstance(num_embeddings, int) or
                                           num_embeddings < 1):
            raise ValueError(f"psd.torch.{who}: num_embeddings must be None (any int64 id) "
                             f"or a positive int, not {num_embeddings!r}")
        kw = dict(optimizer=optimizer, lr=lr, initializer=initializer, init_a=init_a,
                  init_b=init_b, seed=seed, **table_kw)
        if embedding_dim is None:
            # the defaults do not count as given: only what the caller set does
            defaults = dict(optimizer="sgd", lr=None, initializer="normal", init_a=0.0,
                            init_b=1.0, seed=0)
            kw = {k: (None if k in defaults and v == defaults[k] else v)
                  for k, v in kw.items()}
        self.table = _table_for(client, name, embedding_dim, kw, who)
        self._pushes: List[Any] = []  # backward's pushes in flight (psd/_calls.py ops)
        self._prefetched: Any = None  # (ids, unique, inverse, their array, rows, op)
        self._warming: Any = None  # warm()'s TablePrefetch in flight (a psd/_calls.py op)
        self.client = client
        self.name = name
        self.num_embeddings = num_embeddings
        self.embedding_dim = self.table.dim

    def extra_repr(self) -> str:
        return (f"table={self.name!r}, num_embeddings={self.num_embeddings}, "
                f"embedding_dim={self.embedding_dim}")

    def _ids(self, x: Any, role: str = "input") -> "torch.Tensor":
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"psd.torch.{self._who}: {role} must be a torch.Tensor of int64 "
                            f"ids, not {type(x).__name__}")
        if x.dtype == torch.int32:
            x = x.long()
        elif x.dtype != torch.int64:
            raise TypeError(f"psd.torch.{self._who}: {role} must hold torch.int64 (or int32) "
                            f"ids, not {x.dtype}")
        return x

    def _check_range(self, flat: "torch.Tensor") -> None:
        if self.num_embeddings is None or flat.numel() == 0:
            return
        lo, hi = int(flat.min()), int(flat.max())
        if lo < 0 or hi >= self.num_embeddings:
            bad = lo if lo < 0 else hi
            raise IndexError(f"psd.torch.{self._who}: id {bad} is out of range "
                             f"[0, {self.num_embeddings}) (num_embeddings=None allows any "
                             f"int64 id)")

    def flush(self) -> None:
        """Waits for the pushes backward started (they run while the rest of the step does)
        and raises the first one's PsError. The next forward and prefetch() do it too."""
        ops, self._pushes = self._pushes, []
        first: Optional[BaseException] = None
        for op in ops:
            rc = op.wait()
            if rc != 0 and first is None:
                first = error_for(rc, op.message())
            op.close()
        if first is not None:
            raise first

    def prefetch(self, input: "torch.Tensor") -> None:  # noqa: A002 (torch's name)
        """Starts the pull of the rows of `input`'s unique ids (the next batch's: the ids
        forward will be given) and returns at once; forward(input) with the same ids takes
        them (waiting only for what is still in flight), other ids are pulled as usual. The
        rows hold what the servers applied when they answered: the pushes of this module's
        earlier steps (waited for here), not necessarily those still to come (call it after
        backward to include that step's, e.g. while the optimizer steps and the next batch
        loads). Without prefetch() forward pulls when it runs."""
        x = self._ids(input)
        flat = x.reshape(-1)
        self._check_range(flat)
        self._drop_prefetch()
        self.flush()
        uniq, inverse = torch.unique(flat.cpu(), sorted=True, return_inverse=True)
        uniq = uniq.contiguous()
        ids = uniq.numpy()
        rows = torch.empty((ids.size, self.embedding_dim), dtype=torch.float32)
        op = None
        if ids.size:
            t = self.table
            self.client._enter()  # the client stays open while the call starts
            try:
                rc, op = _calls.impl().table_pull_async(t._h, ids.ctypes.data, ids.size,
                                                        _addr(rows), (uniq, rows, t))
            finally:
                self.client._leave()
            _check(rc)
        self._prefetched = (flat.cpu().clone(), uniq, inverse, ids, rows, op)

    def warm(self, input: "torch.Tensor") -> None:  # noqa: A002 (torch's name)
        """Tells the servers the ids of a coming batch (the next one, as soon as it is
        drawn) so that those of their rows a table with a cold tier (ram_rows) keeps on disk
        are back in RAM when that batch's pull and push come: one TablePrefetch of the
        unique ids, started and not waited for, so the disk reads overlap this step's
        compute. Unlike prefetch() it reads no row and waits for no push, so it may run
        before this step's backward. A table all in RAM does nothing. The previous warm()'s
        call is waited for here (its error, if any, raised)."""
        x = self._ids(input)
        flat = x.reshape(-1)
        self._check_range(flat)
        self._end_warm()
        uniq = torch.unique(flat.cpu()).contiguous()
        ids = uniq.numpy()
        if not ids.size:
            return
        t = self.table
        self.client._enter()
        try:
            rc, op = _calls.CtypesCalls.table_prefetch_async(t._h, ids.ctypes.data, ids.size,
                                                             (uniq, t))
        finally:
            self.client._leave()
        _check(rc)
        self._warming = op

    def _end_warm(self) -> None:
        op, self._warming = self._warming, None
        if op is None:
            return
        rc = op.wait()
        msg = op.message() if rc != 0 else ""
        op.close()
        if rc != 0:
            raise error_for(rc, msg)

    def _drop_prefetch(self) -> None:
        pf, self._prefetched = self._prefetched, None
        if pf is not None and pf[5] is not None:
            pf[5].close()  # waits for it: its rows buffer is not reused before

    def _take_prefetch(self, flat: "torch.Tensor") -> Any:
        """(uniq, inverse, ids, rows) of the prefetch for `flat`'s ids, or None."""
        pf = self._prefetched
        if pf is None:
            return None
        cpu = flat.cpu()
        if pf[0].shape != cpu.shape or not torch.equal(pf[0], cpu):
            self._drop_prefetch()
            return None
        self._prefetched = None
        op = pf[5]
        if op is not None:
            rc = op.wait()
            msg = op.message() if rc != 0 else ""
            op.close()
            if rc != 0:
                raise error_for(rc, msg)
        return pf[1:5]

    def _pull_unique(self, flat: "torch.Tensor") -> Any:
        """(rows, inverse): rows holds the unique ids' rows (a leaf that requires grad when
        autograd records, with the hook that pushes its gradient), inverse maps every id of
        flat to its row."""
        self._check_range(flat)
        device = flat.device
        pf = self._take_prefetch(flat)
        self.flush()  # this module's earlier pushes: applied before the rows are read
        if pf is not None:
            uniq, inverse, ids, rows = pf
        else:
            uniq, inverse = torch.unique(flat.cpu(), sorted=True, return_inverse=True)
            uniq = uniq.contiguous()
            ids = uniq.numpy()
            rows = torch.empty((ids.size, self.embedding_dim), dtype=torch.float32)
            if ids.size:
                self.table.pull(ids, rows)
        if device.type != "cpu":
            rows = rows.to(device)
            inverse = inverse.to(device)
        if torch.is_grad_enabled():
            rows.requires_grad_(True)
            rows.register_hook(self._pusher(uniq, ids))
        return rows, inverse

    def _pusher(self, uniq: "torch.Tensor", ids: Any) -> Any:
        table, who, client = self.table, self._who, self.client
        pushed = [False]

        def push(grad: "torch.Tensor") -> None:
            if pushed[0]:
                raise RuntimeError(f"psd.torch.{who}: backward ran a second time through the "
                                   f"same forward; its rows' gradient was already pushed "
                                   f"(run forward again for each backward)")
            pushed[0] = True
            if ids.size:
                g = grad.detach()
                if g.device.type != "cpu":
                    g = g.cpu()
                g = g.contiguous()
                client._enter()
                try:
                    rc, op = _calls.impl().table_push_async(table._h, ids.ctypes.data,
                                                            ids.size, _addr(g),
                                                            (uniq, g, table))
                finally:
                    client._leave()
                _check(rc)
                self._pushes.append(op)
            return None
        return push


class Embedding(_TableModule):
    """torch.nn.Embedding over a psd sparse table: forward(input) -> input.shape + (dim,).

    Forward pulls the rows of the batch's unique ids in one call (or takes the rows
    prefetch() started for these ids); backward starts the push of their gradient (one row per
    unique id) to the table from a hook, once per forward, without waiting for it; the
    table's optimizer (on the servers) updates the rows. The next forward (or prefetch(), or
    flush()) waits for that push, so that it pulls the updated rows. There is no parameter
    and nothing to do in a torch optimizer's step() or zero_grad().

    Pipelining the next batch:

        for x, x_next in batches:      # x_next: the batch after x
            loss = loss_fn(model(x))   # emb(x) takes the rows prefetched for x
            loss.backward()            # the rows' push starts
            emb.prefetch(x_next)       # waits for the push, starts the pull of x_next's rows
            dist.step()                # dense step while the pull is in flight

    With a table larger than memory (ram_rows), warm(x_next) at the top of the loop has the
    servers bring x_next's rows from disk while x's step computes.

    Args:
        client: a psd.Client. name: the table's name.
        num_embeddings: None (any int64 id, negative ones too) or N (ids must be in [0, N)).
        embedding_dim: the rows' width; the table is created with it (idempotent: every
            worker may create it; another spec raises AlreadyExistsError). None: the table
            must exist (Client.table) and gives the width.
        optimizer, lr, initializer, init_a, init_b, seed, and min_count, ttl_ms, max_rows,
            momentum, beta1, ...: the table's (Client.create_table). The default initializer
            is torch's: normal(0, 1).
    """

    def __init__(self, client: Client, name: str, num_embeddings: Optional[int] = None,
                 embedding_dim: Optional[int] = None, *, optimizer: str = "sgd",
                 lr: Optional[float] = None, initializer: str = "normal", init_a: float = 0.0,
                 init_b: float = 1.0, seed: int = 0, **table_kw: Any) -> None:
        super().__init__("Embedding", client, name, num_embeddings, embedding_dim, optimizer,
                         lr, initializer, init_a, init_b, seed, table_kw)

    def forward(self, input: "torch.Tensor") -> "torch.Tensor":  # noqa: A002 (torch's name)
        x = self._ids(input)
        rows, inverse = self._pull_unique(x.reshape(-1))
        return torch.nn.functional.embedding(inverse.reshape(x.shape), rows)


class EmbeddingBag(_TableModule):
    """torch.nn.EmbeddingBag over a psd sparse table: forward(input, offsets=None,
    per_sample_weights=None) -> (bags, dim), pooled by mode "sum" or "mean".

    input: 1-D ids with offsets (1-D, the start of each bag; offsets[0] must be 0; with
    include_last_offset=True the last offset is input's length), or 2-D (B, N): B bags of N
    ids each, offsets None. per_sample_weights (input's shape, float32): mode "sum" only, as
    torch has it. Ids: int64 (int32 converted).

    The same constructor arguments as Embedding, and mode, include_last_offset. Forward pulls
    the unique ids' rows in one call (or takes those prefetch() started), pooling is torch's
    own embedding_bag over them, and backward starts the push of their gradient (from a hook,
    once per forward, waited for by the next forward, prefetch() or flush()); nothing to do in
    step() or zero_grad().
    """

    def __init__(self, client: Client, name: str, num_embeddings: Optional[int] = None,
                 embedding_dim: Optional[int] = None, mode: str = "mean", *,
                 include_last_offset: bool = False, optimizer: str = "sgd",
                 lr: Optional[float] = None, initializer: str = "normal", init_a: float = 0.0,
                 init_b: float = 1.0, seed: int = 0, **table_kw: Any) -> None:
        if mode not in _MODES:
            raise ValueError(f"psd.torch.EmbeddingBag: mode must be one of "
                             f"{', '.join(repr(m) for m in _MODES)}, not {mode!r}")
        super().__init__("EmbeddingBag", client, name, num_embeddings, embedding_dim,
                         optimizer, lr, initializer, init_a, init_b, seed, table_kw)
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mode={self.mode!r}"

    def forward(self, input: "torch.Tensor", offsets: Optional["torch.Tensor"] = None,  # noqa: A002
                per_sample_weights: Optional["torch.Tensor"] = None) -> "torch.Tensor":
        who = "psd.torch.EmbeddingBag"
        x = self._ids(input)
        if x.dim() == 2:
            if offsets is not None:
                raise ValueError(f"{who}: offsets must be None with a 2-D input (each row "
                                 f"of input is a bag)")
        elif x.dim() == 1:
            if offsets is None:
                raise ValueError(f"{who}: a 1-D input needs offsets (the start of each bag)")
            offsets = self._ids(offsets, "offsets")
            if offsets.dim() != 1:
                raise ValueError(f"{who}: offsets must be 1-D, not of shape "
                                 f"{tuple(offsets.shape)}")
            if offsets.numel() == 0:
                raise ValueError(f"{who}: offsets is empty (one offset per bag)")
            o = offsets.cpu()
            if int(o[0]) != 0:
                raise ValueError(f"{who}: offsets[0] must be 0, not {int(o[0])}")
            if o.numel() > 1 and bool((o[1:] < o[:-1]).any()):
                raise ValueError(f"{who}: offsets must not decrease")
            if int(o[-1]) > x.numel():
                raise ValueError(f"{who}: offset {int(o[-1])} is past the input's "
                                 f"{x.numel()} ids")
            if self.include_last_offset and int(o[-1]) != x.numel():
                raise ValueError(f"{who}: with include_last_offset the last offset must be "
                                 f"the input's length {x.numel()}, not {int(o[-1])}")
        else:
            raise ValueError(f"{who}: input must be 1-D (with offsets) or 2-D (bags of equal "
                             f"size), not of shape {tuple(x.shape)}")
        if per_sample_weights is not None:
            if self.mode != "sum":
                raise ValueError(f"{who}: per_sample_weights need mode 'sum', not "
                                 f"{self.mode!r}")
            if not isinstance(per_sample_weights, torch.Tensor) or \
                    per_sample_weights.dtype != torch.float32:
                raise TypeError(f"{who}: per_sample_weights must be a torch.float32 tensor")
            if per_sample_weights.shape != x.shape:
                raise ValueError(f"{who}: per_sample_weights has shape "
                                 f"{tuple(per_sample_weights.shape)}, input "
                                 f"{tuple(x.shape)}")
        rows, inverse = self._pull_unique(x.reshape(-1))
        return torch.nn.functional.embedding_bag(
            inverse.reshape(x.shape), rows, offsets, mode=self.mode,
            per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset)


__all__ = ["attach", "AttachedModule", "is_chief", "READY_MARKER", "Embedding",
           "EmbeddingBag"]
