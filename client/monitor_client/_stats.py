"""Gradient, parameter and update statistics, computed the cheap way and kept on device.

``GradStats`` hooks an optimizer (``register_step_pre_hook`` / ``register_step_post_hook``,
so the training loop is unchanged). Every optimizer step it measures the global gradient
norm before clipping with one fused ``torch._foreach_norm`` (and clips, when asked, with
the same numbers: clipping here costs nothing extra, and replaces the user's
``clip_grad_norm_`` call). Every ``layer_stats_every`` steps it also measures, per
parameter: grad L2 norm, mean, std, max-abs, zero fraction, parameter norm and update norm.
Every ``hist_every`` steps (when set) it adds gradient (pre-clip) and weight (post-step)
quantiles and histograms from a bounded per-parameter sample (``_distributions.py``).

Nothing leaves the device here: every result is a 0-d tensor, stacked into ONE float32
vector by ``take()``; the monitor copies that vector to the host once per step, in its
background thread (the only sync point). There is no ``.item()`` per parameter.

Update norm needs the parameters from before the step: on monitored steps only, the
pre-hook copies them on their own device (same dtype, because a bfloat16 copy of weights
near 1.0 rounds by ~4e-3, more than a typical update). If that copy does not fit in
``snapshot_budget_bytes``, consecutive monitored steps snapshot consecutive chunks of the
parameters in turn; layers outside this step's chunk then report no ``update_norm`` and the
global ``update_norm`` is left out (never NaN, which would read as a fault).

Step 0 (monitored) of a model whose gradients are all ones: global norm 2, clipped to 1
before the optimizer steps::

    >>> model = torch.nn.Linear(3, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> stats = GradStats(model, opt, grad_clip=1.0, layer_stats_every=10).attach()
    >>> model(torch.ones(1, 3)).sum().backward()
    >>> opt.step()               # pre-hook: norms, clip, copy; post-hook: param/update norms
    >>> pack = stats.take()      # a StatsPack: device tensors + how to read them
    >>> record = pack.decode(pack.vector().tolist())   # after the one host copy
    >>> record["grad_norm"], record["layers"]["weight"]["grad_norm"]   # pre-clip
    (2.0, 1.732...)
    >>> round(record["update_norm"], 6)                # lr x the clipped norm
    0.1
    >>> stats.detach()
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from monitor_client import _activations, _distributions, _finite, _guard
from monitor_client._hooks import Hooks

_LAYER_FIELDS = ("grad_norm", "grad_mean", "grad_std", "grad_max_abs", "grad_zero_frac")
_HIST_FIELDS = ("grad_hist", "param_hist")


@dataclass
class StatsPack:
    """Device tensors of one step, plus the layout needed to name them after the sync.

    On a monitored step (``layers`` set), a global value and one value per layer::

        >>> pack = StatsPack(layers=["w", "b"])
        >>> pack.add("grad_norm", torch.tensor(5.0))
        >>> pack.add("grad_norm", torch.tensor([3.0, 4.0]), layers=["w", "b"])
        >>> host = pack.vector().tolist()     # THE copy to the host (sender thread)
        >>> host
        [5.0, 3.0, 4.0]
        >>> pack.decode(host)
        {'grad_norm': 5.0, 'layers': {'w': {'grad_norm': 3.0}, 'b': {'grad_norm': 4.0}}}
    """

    values: list[torch.Tensor] = field(default_factory=list)
    layout: list[tuple[str, tuple[str, ...] | None, int]] = field(default_factory=list)
    layers: list[str] | None = None   # set on monitored steps: every watched parameter
    stepped: bool = False
    event: Any = None                 # a torch.cuda.Event recorded once the pack is whole
    finite_check: str = "full"        # what the "output_sum" values read (_finite.py)

    def add(self, name: str, value: torch.Tensor, layers: list[str] | None = None) -> None:
        # No tensor op here: log_step calls this, and any torch op may hand the GIL to
        # another thread for milliseconds. Flattening happens in vector(), off-thread.
        self.values.append(value)
        self.layout.append((name, tuple(layers) if layers is not None else None,
                            value.numel()))

    def add_each(self, name: str, values: list[torch.Tensor], layers: list[str]) -> None:
        """One 0-d tensor per name (e.g. a forward hook's flag), stacked off-thread."""
        self.values.extend(values)
        self.layout.append((name, tuple(layers), len(values)))

    def seal(self) -> StatsPack:
        """Mark, on the training thread's stream, the point where every value is made (the
        loss, the forward's sums, the statistics, a loss scale or LR copied after the
        optimizer step): ``vector()`` waits for it, whatever stream the training used.
        Recording an event queues a marker; nothing waits here."""
        if self.values and self.values[0].device.type == "cuda":
            self.event = torch.cuda.Event()
            self.event.record()
        return self

    def vector(self) -> torch.Tensor | None:
        """Everything as one float32 vector on the host: THE device sync of a step.

        Called from the sender thread; on CUDA it waits for the event ``seal()`` recorded.
        """
        if not self.values:
            return None
        device = self.values[0].device
        if self.event is not None:  # sealed on CUDA
            return self._vector_off_stream(device)
        return self._flat(device).cpu()

    def _flat(self, device: torch.device) -> torch.Tensor:
        # Runs of 0-d float32 values (a forward's module sums, the loss, the global norms:
        # most of a step's values) are stacked in one call, not reshaped one by one: each
        # tensor call here holds the GIL for microseconds that a host-bound training thread
        # waits for (about 1 ms a step on a GPT-2 before, 0.3 ms after, on CPU).
        parts: list[torch.Tensor] = []
        run: list[torch.Tensor] = []
        with torch.no_grad():
            for v in self.values:
                if v.dim() == 0 and v.dtype == torch.float32 and v.device == device:
                    run.append(v)
                    continue
                if run:
                    parts.append(torch.stack(run))
                    run = []
                parts.append(v.detach().reshape(-1).to(device, torch.float32))
            if run:
                parts.append(torch.stack(run))
            return torch.cat(parts) if len(parts) > 1 else parts[0]

    def _vector_off_stream(self, device: torch.device) -> torch.Tensor:
        """The CUDA copy, on a stream of its own that waits for the statistics' event.

        On the training stream, the sender's stacking kernels and its copy would queue
        behind whatever the training thread launched since (a step or more), and a copy to
        pageable memory holds the host in the driver until the device gets there: a bubble
        in the training stream on every step (2.5 ms of a 43 ms GPT-2 step on an H100,
        measured by bench/gpu_check.py). Here nothing is added to the training stream,
        the copy lands in pinned memory as soon as the statistics are done, and the sender
        sleeps on a blocking event instead of spinning a core.
        """
        side = torch.cuda.Stream(device)
        side.wait_event(self.event)
        with torch.cuda.stream(side):
            flat = self._flat(device)
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            done = torch.cuda.Event(blocking=True)
            done.record(side)
        done.synchronize()  # the statistics' tensors stay referenced until here
        return host

    def decode(self, flat: list[float]) -> dict:
        """Name the host copy of ``vector()``: global fields, and ``layers`` when present."""
        out: dict = {}
        layers: dict[str, dict[str, Any]] | None = (
            {name: {} for name in self.layers} if self.layers is not None else None)
        pos = 0
        for name, names, width in self.layout:
            chunk = flat[pos:pos + width]
            pos += width
            if name == "skip_code":  # the step guard's decision (_guard.py)
                reason = _guard.skip_reason(chunk[0])
                if reason is not None:
                    out.update(skipped=True, skip_reason=reason)
            elif names is None:
                out[name] = chunk[0]
            elif name in _HIST_FIELDS:  # (P, 8 + bins) rows (_distributions.py)
                bins = width // len(names) - len(_distributions.QUANTILES)
                out[name] = _distributions.decode_rows(names, chunk, bins)
            elif name == "activation":  # one module's output (_activations.py)
                out.setdefault("activations", {})[names[0]] = _activations.decode(names, chunk)
            elif name == "param_grad_norm":  # every step; _gate.py decides if it is sent
                out["grad_norms"] = dict(zip(names, chunk, strict=True))
            elif name == "output_sum":  # _finite.py: forward order, one sum per module
                out.update(_finite.decode(names, chunk, self.finite_check))
            elif layers is not None:
                _fill_layers(layers, name, names, chunk)
        if layers is not None:
            for entry in layers.values():
                if "grad_norm" not in entry:
                    entry["grad_none"] = True
            out["layers"] = layers
        return out


def _fill_layers(layers: dict, name: str, names: tuple[str, ...], chunk: list[float]) -> None:
    if name == "layer_grad":
        for i, layer in enumerate(names):
            layers[layer].update(zip(_LAYER_FIELDS, chunk[5 * i:5 * i + 5], strict=True))
        return
    for layer, value in zip(names, chunk, strict=True):
        layers[layer][name] = value


def _local(t: torch.Tensor) -> torch.Tensor:
    # FSDP2 / tensor-parallel parameters are DTensors: statistics are of this rank's shard.
    return t.to_local() if hasattr(t, "to_local") else t


class GradStats:
    """Optimizer-hooked statistics; see the module docstring.

    A step the optimizer did not take (a GradScaler skips one with inf gradients):
    ``take()`` measures the gradients anyway, and says it did not step::

        >>> model = torch.nn.Linear(2, 1)
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> stats = GradStats(model, opt).attach()
        >>> model(torch.tensor([[float("inf"), 1.0]])).sum().backward()   # no opt.step()
        >>> pack = stats.take()
        >>> pack.stepped, pack.decode(pack.vector().tolist())["grad_norm"]
        (False, inf)
        >>> stats.detach()
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 grad_clip: float | None = None, apply_clip: bool = True,
                 layer_stats_every: int = 10, snapshot_budget_bytes: int | None = None,
                 reduce_group: object | None = None, hist_every: int | None = None,
                 hist_sample: int = _distributions.DEFAULT_SAMPLE,
                 hist_bins: int = _distributions.DEFAULT_BINS) -> None:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        # Gradient/weight distributions every hist_every steps (None or 0: never).
        self.hist_every = max(0, int(hist_every or 0))
        self._dist = _distributions.Distributions(hist_sample, hist_bins)
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        # DTensor parameters (FSDP2, tensor parallel): their statistics are of the local
        # shard. Asked once: a per-step hasattr on every gradient is host time on each step.
        self._sharded = any(hasattr(p, "to_local") for p in self.params)
        self.grad_clip = grad_clip
        self.apply_clip = apply_clip and grad_clip is not None and grad_clip > 0
        self.layer_stats_every = max(1, int(layer_stats_every))
        self.snapshot_budget_bytes = snapshot_budget_bytes
        self.reduce_group = reduce_group  # sharded params: all-reduce the global squares
        self._optimizer = optimizer
        self._hooks = Hooks()
        self._steps = 0
        self._chunk_start = 0
        self.overhead_s = 0.0  # time spent in the hooks, left out of step_time
        self._buffers: dict[int, torch.Tensor] = {}
        self._numel_cache: dict[tuple[tuple[str, ...], str], torch.Tensor] = {}
        self._reset()

    def _reset(self) -> None:
        self._pack = StatsPack()
        self._measured = False
        self._snapshot: list[torch.Tensor] | None = None
        self._snap_idx: list[int] = []
        # This step's global pre-clip norm, on device, for the step guard (_guard.py).
        self.last_grad_norm: torch.Tensor | None = None

    @property
    def monitored(self) -> bool:
        """Whether the current optimizer step gets per-layer statistics."""
        return self._steps % self.layer_stats_every == 0

    @property
    def hist_step(self) -> bool:
        """Whether the current optimizer step gets gradient and weight distributions."""
        return self.hist_every > 0 and self._steps % self.hist_every == 0

    def attach(self, pre_hook: bool = True) -> GradStats:
        """Register the optimizer hooks (the pre-hook is optional for closure-based loops)."""
        self._hooks.around_step(self._optimizer, self.before_step if pre_hook else None,
                                self.after_step)
        return self

    def detach(self) -> None:
        self._hooks.remove()

    @torch.no_grad()
    def before_step(self) -> None:
        """Measure (and clip) the gradients, snapshot parameters on monitored steps."""
        if self._measured:
            return  # already called explicitly for this step (Lightning)
        start = time.perf_counter()
        self._measure_grads(self.monitored)
        if self.monitored:
            self._take_snapshot()
        self.overhead_s += time.perf_counter() - start

    @torch.no_grad()
    def after_step(self) -> None:
        """The optimizer stepped: on monitored steps, parameter and update norms."""
        start = time.perf_counter()
        if not self._measured:
            self._measure_grads(False)
        if self.monitored:
            self._measure_params()
        if self.hist_step and self.params:  # weights after the step
            params = [_local(p) for p in self.params]
            self._pack.add("param_hist", self._dist.measure(params), layers=self.names)
        self._pack.stepped = True
        self._steps += 1
        self.overhead_s += time.perf_counter() - start

    def pop_overhead(self) -> float:
        """Host seconds the hooks took since the last call (on GPU: launch time only)."""
        spent, self.overhead_s = self.overhead_s, 0.0
        return spent

    def take(self) -> StatsPack:
        """This step's statistics (measuring the gradients now if no step happened)."""
        if not self._pack.stepped and not self._measured:
            self._measure_grads(False)  # e.g. a GradScaler skipped the step: grads are inf
        pack = self._pack
        self._reset()
        return pack

    def _present(self) -> tuple[list[str], list[torch.Tensor]]:
        names, grads = [], []
        for name, p in zip(self.names, self.params, strict=True):
            grad = p.grad
            if grad is not None:
                names.append(name)
                grads.append(_local(grad) if self._sharded else grad)
        return names, grads

    def _measure_grads(self, per_layer: bool) -> None:
        self._measured = True
        names, grads = self._present()
        if not grads:
            return
        norms = _norms(grads)
        total = self._global_from(norms)
        self.last_grad_norm = total
        self._pack.add("grad_norm", total)
        # The per-parameter norms the global one is made of: free, and read with the same
        # host copy; the sender decides whether they go out (_gate.py).
        self._pack.add("param_grad_norm", norms, layers=names)
        if per_layer:  # before clipping: every statistic describes the raw gradient
            self._pack.layers = list(self.names)
            self._pack.add("layer_grad", _grad_moments(grads, norms, self._numels(names, grads)),
                           layers=names)
        if self.hist_step:  # also before clipping
            self._pack.add("grad_hist", self._dist.measure(grads), layers=names)
        if self.apply_clip and self.grad_clip is not None:  # apply_clip implies a clip
            # The same arithmetic as clip_grad_norm_(foreach=True), reusing our norm.
            coef = torch.clamp(self.grad_clip / (total + 1e-6), max=1.0)
            torch._foreach_mul_(grads, coef.to(grads[0].device))

    def _numels(self, names: list[str], grads: list[torch.Tensor]) -> torch.Tensor:
        """Each gradient's element count as a float32 device vector, made once per set of
        parameters: building it from a Python list is a host-to-device copy, which on CUDA
        waits for the device (a host sync on the training thread every monitored step)."""
        key = (tuple(names), str(grads[0].device))
        numel = self._numel_cache.get(key)
        if numel is None:
            numel = torch.tensor([g.numel() for g in grads], dtype=torch.float32).to(
                grads[0].device)
            self._numel_cache = {key: numel}  # one set at a time: bounded
        return numel

    def _all_reduce_sq(self, sq: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        sq = sq.clone()
        dist.all_reduce(sq, group=self.reduce_group)
        return sq

    def _take_snapshot(self) -> None:
        idx = self._snapshot_indices()
        params = [_local(self.params[i]) for i in idx]
        snap = [self._buffer(i, p) for i, p in zip(idx, params, strict=True)]
        if snap:
            torch._foreach_copy_(snap, params)
        self._snapshot, self._snap_idx = snap, idx

    def _buffer(self, i: int, param: torch.Tensor) -> torch.Tensor:
        # Kept between monitored steps: re-allocating the copy each time costs ~4x the copy
        # itself on CPU (fresh pages fault in). Memory: one copy of the snapshot set.
        buf = self._buffers.get(i)
        if buf is None or buf.shape != param.shape or buf.device != param.device:
            buf = self._buffers[i] = torch.empty_like(param)
        return buf

    def _snapshot_indices(self) -> list[int]:
        n = len(self.params)
        budget = self.snapshot_budget_bytes
        sizes = [_local(p).numel() * _local(p).element_size() for p in self.params]
        if budget is None or sum(sizes) <= budget:
            return list(range(n))
        idx: list[int] = []
        used, i = 0, self._chunk_start % max(n, 1)
        while len(idx) < n and (not idx or used + sizes[i] <= budget):
            idx.append(i)
            used += sizes[i]
            i = (i + 1) % n
        self._chunk_start = i
        return idx

    def _measure_params(self) -> None:
        params = [_local(p) for p in self.params]
        pnorms = _norms(params)
        self._pack.layers = list(self.names)
        self._pack.add("param_norm", pnorms, layers=self.names)
        self._pack.add("param_norm", self._global_from(pnorms))
        snapshot, idx = self._snapshot, self._snap_idx
        self._snapshot = None
        if not snapshot:
            return
        torch._foreach_sub_(snapshot, [params[i] for i in idx])  # before - after, in place
        unorms = _norms(snapshot)
        self._pack.add("update_norm", unorms, layers=[self.names[i] for i in idx])
        if len(idx) == len(self.names):
            self._pack.add("update_norm", self._global_from(unorms))

    def _global_from(self, norms: torch.Tensor) -> torch.Tensor:
        if self.reduce_group is None:
            return torch.linalg.vector_norm(norms)
        return self._all_reduce_sq(norms.square().sum()).sqrt()


def _grad_moments(grads: list[torch.Tensor], norms: torch.Tensor,
                  numel: torch.Tensor) -> torch.Tensor:
    """(P, 5) table: L2 norm, mean, std, max-abs, zero fraction; 3 more passes over grads.

    ``numel`` holds each gradient's element count (float32, on their device). The std
    comes from the sum of squares we already have (norm^2), not another pass.
    """
    sums = torch.stack([g.sum(dtype=torch.float32) for g in grads])
    nonzero = torch.stack([torch.count_nonzero(g) for g in grads]).float()
    mean = sums / numel
    var = (norms.square() - numel * mean.square()) / (numel - 1).clamp(min=1)
    std = var.clamp(min=0).sqrt()
    zero_frac = 1.0 - nonzero / numel
    return torch.stack([norms, mean, std, _max_abs(grads), zero_frac], dim=1)


def _max_abs(grads: list[torch.Tensor]) -> torch.Tensor:
    if grads[0].device.type == "cuda":  # one fused kernel on GPU
        return torch.stack(torch._foreach_norm(grads, math.inf, dtype=torch.float32))
    # On CPU the inf-norm is ~40x slower than one aminmax pass per tensor (measured).
    pairs = [torch.aminmax(g) for g in grads]
    return torch.stack([torch.maximum(-lo, hi) for lo, hi in pairs]).float()


def _norms(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Per-tensor L2 norms in float32 (the dtype argument only when needed: it costs)."""
    if all(t.dtype == torch.float32 for t in tensors):
        return torch.stack(torch._foreach_norm(tensors, 2))
    return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32))
