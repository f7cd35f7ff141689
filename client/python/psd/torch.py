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
where torch has it, the AccumulateGrad node's hook otherwise, as Horovod does) starts the push of
that gradient while backward computes the others. For a variable with staleness -1 (asynchronous)
the push is a push-pull, so the parameter's next values come back with the push's reply; for
bounded staleness (BSP 0, SSP s > 0) step() waits for the pushes, then one request per server
advances the clock and pulls every variable at the new clock (waiting for the bound). One backward
per step: a second accumulation into a gradient already pushed raises (pass overlap=False to
accumulate gradients over several backward passes; step() then pushes them all).

Tensors: CPU parameters and gradients are read and written in place (no copy). CUDA ones go
through pinned host buffers: the gradient is copied on a side stream ordered after the compute
stream (then pushed from a background thread once the copy is done), and fresh values are
copied back on the side stream, which the compute stream then waits for. Only float32 parameters
on the CPU or a CUDA device are accepted; anything else raises naming the parameter.

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

from .client import STALENESS_ASYNC, STALENESS_DEFAULT, Client, Variable
from .errors import DeadlineExceededError, NotFoundError

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
    __slots__ = ("name", "param", "var", "asynchronous", "stage", "future", "pulled", "buf")

    def __init__(self, name: str, param: "torch.nn.Parameter", var: Variable,
                 stage: Optional[_CudaStage]) -> None:
        self.name = name
        self.param = param
        self.var = var
        self.asynchronous = var.staleness_bound == STALENESS_ASYNC
        self.stage = stage
        self.future: Optional["Future[Any]"] = None  # this step's push (or push-pull)
        self.pulled: Any = None  # the push-pull's destination, when it brought values back
        self.buf: Any = None  # that destination for a CPU parameter, made once


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
                 hyper: Mapping[str, Any]) -> None:
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

    def _start_push(self, e: _Entry) -> None:
        if e.future is not None:
            raise RuntimeError(
                f"psd.torch: the gradient of {e.name!r} was accumulated again after it was "
                f"pushed in this step; call step() after each backward, or attach with "
                f"overlap=False to accumulate gradients over several backward passes")
        grad = e.param.grad
        if grad is None:
            return
        if grad.is_sparse:
            raise ValueError(f"psd.torch: the gradient of {e.name!r} is sparse")
        if e.stage is None:
            if not grad.is_contiguous():
                grad = grad.contiguous()
            if e.asynchronous:
                # not into param.data: backward may still read the parameter
                if e.buf is None or e.buf.shape != e.param.shape:
                    e.buf = torch.empty_like(e.param.data, memory_format=torch.contiguous_format)
                e.future = e.var.push_pull_async(grad, e.buf)
                e.pulled = e.buf
            else:
                e.future = e.var.push_async(grad)
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

    # -- step --

    def step(self) -> int:
        """Finishes this step: pushes what the hooks have not (all of it with overlap=False),
        waits for every push, advances the clock and brings the fresh parameters into the
        module (in place: the Parameter objects stay the same). Returns the new clock.
        Raises the first failed push's PsError (the other pushes are still waited for)."""
        if not self.overlap:
            for e in self._entries:
                self._start_push(e)
        first: Optional[BaseException] = None
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
                e.pulled = None
            e.future = None
        if first is not None:
            for e in self._entries:
                e.pulled = None
            raise first
        items = []
        landed: List[_Entry] = []
        for e in self._entries:
            if e.pulled is not None:
                if e.stage is None:
                    e.param.data.copy_(e.pulled)
                else:
                    landed.append(e)
                e.pulled = None
                continue
            items.append((e.var, None, e.stage.host_param if e.stage else e.param.data))
            if e.stage is not None:
                landed.append(e)
        for e in landed:
            e.stage.landed.synchronize()  # host_param may be written again (client.step)
        if items:
            self.client.step(items, clock=True)
        else:
            self.client.clock()
        for e in landed:
            e.stage.param_from_host(e.param)
        return self.client.current_clock

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
        """Removes the gradient hooks (the variables stay on the servers). Idempotent."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
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
           seed: int = 0, **hyper: Any) -> AttachedModule:
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
        overlap: push each gradient from its hook during backward (False: step() pushes them
            all after backward).
        init_timeout_s: how long a non-chief waits for the chief's values.
    Raises TypeError/ValueError naming a parameter that cannot be attached (not float32, not on
    the CPU or a CUDA device), DeadlineExceededError when the chief's values do not come in
    time, and the servers' errors (AlreadyExistsError for a variable of another shape).
    """
    return AttachedModule(client, module, optimizer=optimizer, lr=lr, staleness=staleness,
                          prefix=prefix, param_groups=param_groups, chief=chief,
                          overlap=overlap, init_timeout_s=init_timeout_s, seed=seed,
                          hyper=hyper)


__all__ = ["attach", "AttachedModule", "is_chief", "READY_MARKER"]
