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
from typing import Any

import torch

from monitor_client import _distributions, _finite
from monitor_client._hooks import Hooks
from monitor_client._model_info import user_parameters
from monitor_client._norm_worker import NormOffload
from monitor_client._pack import StatsPack
from monitor_client._warn import LOGGER

__all__ = ["GradStats", "StatsPack"]


# What a layer-statistics or distributions step measured, kept in the pack until the record
# goes out when more optimizer steps follow before it (a loop that logs every few steps);
# everything else in a pack describes one step, and the next step's replaces it.
_PERIODIC = frozenset({"layer_grad", "param_norm", "update_norm", "grad_hist", "param_hist"})


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
        >>> pack.stepped, pack.decode(pack.host())["grad_norm"]
        (False, inf)
        >>> stats.detach()

    Which parameters: the model's that train (``requires_grad``), looked at again when the
    optimizer gains a parameter group (``add_param_group``) and on each layer-statistics
    step (a layer unfrozen later), plus any parameter the optimizer holds that the model
    does not (named ``param_groups.<group>.<index>``). ``optimizer=None``: a loop that
    updates its parameters by hand; the gradients are measured by ``before_step()`` when
    the loop calls it (``Monitor.before_optimizer_step``), else by ``take()``, and every
    ``take()`` ends a step. A step whose closure computes the gradients (LBFGS's
    ``step(closure)``) has none yet when it begins: they are measured after it.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, *,
                 grad_clip: float | None = None, apply_clip: bool = True,
                 layer_stats_every: int = 10, snapshot_budget_bytes: int | None = None,
                 reduce_group: object | None = None, hist_every: int | None = None,
                 hist_sample: int = _distributions.DEFAULT_SAMPLE,
                 hist_bins: int = _distributions.DEFAULT_BINS, prefix: str = "",
                 offload: bool = True) -> None:
        self._model = model
        # On the CPU, the every-step gradient norms are read beside the optimizer's step
        # (_norm_worker.py); False: always on the training thread.
        self._offload = NormOffload()
        self._offload.off = not offload
        # The model's name when a run watches several (Monitor.watch(name=)): "D.conv1.weight".
        self.prefix = f"{prefix}." if prefix else ""
        # Gradient/weight distributions every hist_every steps (None or 0: never).
        self.hist_every = max(0, int(hist_every or 0))
        self._dist = _distributions.Distributions(hist_sample, hist_bins)
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
        self._closure_told = False
        self._sparse: bool | None = None  # whether a gradient is sparse (_present)
        self._sparse_grads: list[torch.Tensor] = []
        self.names: list[str] = []
        self.params: list[torch.Tensor] = []
        self._refresh()
        self._reset()

    def _reset(self) -> None:
        self._pack = StatsPack()
        self._measured = False
        self._snapshot: list[torch.Tensor] | None = None
        self._snap_idx: list[int] = []
        self._grad_norms: list[torch.Tensor] | None = None  # this step's, per parameter
        self._grad_vector: torch.Tensor | None = None  # the same, stacked (when it was)
        self._total: torch.Tensor | None = None
        self._unread = False  # read beside the step, and the step wrote to them: no norm
        self._offload_names: list[str] = []

    @property
    def last_grad_norm(self) -> torch.Tensor | None:
        """This step's global pre-clip norm, on the device, for the step guard (_guard.py):
        made when first asked for (a step that needs it neither to clip nor to guard gets
        it on the host, from the per-parameter norms the sender copies anyway)."""
        if self._offload.pending:  # wanted before the step: read them here from now on
            self._offload.off = True
            self._settle()
        if self._total is None and self._grad_vector is not None:
            self._total = self._global_from(self._grad_vector)
        elif self._total is None and self._grad_norms:
            self._total = self._global_from(torch.stack(self._grad_norms))
        return self._total

    def grads_finite(self) -> bool:
        """Whether this step's gradients are known finite on the host (True when none was
        measured: no gradient, nothing non-finite). On the CPU their norms are read (one
        stack, one sum: a host read costs nothing there); on a device that would be a sync
        on the training thread, so it is not known there (False). Called before ``take()``."""
        self._settle()
        vector = self._grad_vector
        if vector is None or not _finite.on_host(vector):
            return not self._grad_norms and not self._unread
        # (a sum of float norms on the host is finite exactly when each of them is)
        return math.isfinite(sum(vector.tolist()))

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
        opt = self._optimizer
        if opt is None:
            return self  # nothing to hook: before_step() / take() are called by the Monitor
        if pre_hook:
            self._hooks.add(opt.register_step_pre_hook(self._hooks.guard(self._pre_hook)))
        self._hooks.around_step(opt, after=self.after_step)
        return self

    def detach(self) -> None:
        self._hooks.remove()
        self._settle()
        self._offload.close()

    def _pre_hook(self, _optimizer: Any, args: tuple, kwargs: dict) -> None:
        # torch passes step()'s arguments, the optimizer first: step(closure) or
        # step(closure=...) is a step whose closure computes the gradients.
        if (len(args) > 1 and args[1] is not None) or kwargs.get("closure") is not None:
            self._closure_step()
        else:
            self.before_step(beside=True)

    def before_step(self, beside: bool = False) -> None:
        """Measure (and clip) the gradients, snapshot parameters on monitored steps.
        ``beside``: called as the optimizer's step begins (its pre-hook), so on the CPU the
        norms may be read while it steps (``_norm_worker.py``)."""
        if self._measured:
            return  # already called explicitly for this step (Lightning)
        start = time.perf_counter()
        self._next_step()
        monitored = self.monitored
        self._look_again(monitored)
        grad_mode = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)  # cheaper than torch.no_grad() on every step
        try:
            self._measure_grads(monitored, beside)
            if monitored:
                self._take_snapshot()
        finally:
            torch._C._set_grad_enabled(grad_mode)
        self.overhead_s += time.perf_counter() - start

    def _closure_step(self) -> None:
        """The step computes its own gradients (its closure runs inside it): they are
        measured once it returned; only the parameters are copied now, for the update."""
        if self.apply_clip and not self._closure_told:
            self._closure_told = True
            LOGGER.warning("monitor_client: grad_clip=%s is not applied to %s.step(closure): "
                           "its closure computes the gradients inside the step; clip inside "
                           "the closure (the norms reported are the unclipped ones)",
                           self.grad_clip, type(self._optimizer).__name__)
        self._next_step()
        if self.monitored:
            self._look_again(True)
            with torch.no_grad():
                self._take_snapshot()

    def after_step(self) -> None:
        """The optimizer stepped: on monitored steps, parameter and update norms."""
        start = time.perf_counter()
        self._settle()
        monitored, hist = self.monitored, self.hist_step
        if not self._measured:  # no pre-hook measured this step: it begins here
            self._next_step()
        # The step happened whatever the measurements below do (a failure is contained by
        # the hook: _hooks.py), so it is counted first.
        self._pack.stepped = True
        self._steps += 1
        if not self._measured or monitored or hist:
            with torch.no_grad():
                if not self._measured:
                    self._look_again(monitored and self._snapshot is None)
                    self._measure_grads(monitored)
                if monitored:
                    self._measure_params()
                if hist and self.params:  # weights after the step
                    params = [_local(p) for p in self.params]
                    self._pack.add("param_hist", self._dist.measure(params), layers=self.names)
        self._measured = False  # the next optimizer step is measured (and clipped) anew
        end = time.perf_counter()
        self._offload.done(end)
        self.overhead_s += end - start

    def _next_step(self) -> None:
        """A new optimizer step begins while the pack still holds an earlier one's (the
        loop logs every few steps, so one record spans them): the record describes the
        last step, so this step's gradient norms replace the earlier one's, and only what
        a layer-statistics or distributions step measured is carried to the record, unless
        this step measures it again."""
        pack = self._pack
        if not pack.stepped:
            return
        keep = _PERIODIC
        if self.monitored:
            keep = keep - {"layer_grad", "param_norm", "update_norm"}
        if self.hist_step:
            keep = keep - {"grad_hist", "param_hist"}
        self._pack = pack.keeping(keep)
        self._pack.stepped = True
        self._grad_norms = self._grad_vector = self._total = None
        self._unread = False

    def pop_overhead(self) -> float:
        """Host seconds the hooks took since the last call (on GPU: launch time only)."""
        spent, self.overhead_s = self.overhead_s, 0.0
        return spent

    def take(self) -> StatsPack:
        """This step's statistics (measuring the gradients now if no step happened)."""
        self._settle()
        if self._optimizer is None:
            self.after_step()  # no optimizer to hook: the step ends when it is logged
        elif not self._pack.stepped and not self._measured:
            with torch.no_grad():  # e.g. a GradScaler skipped the step: grads are inf
                self._measure_grads(False)
        pack = self._pack
        self._reset()
        return pack

    def _look_again(self, monitored: bool) -> None:
        """Take in parameters added since (a parameter group; on a layer-statistics step, a
        layer unfrozen): one ``len()`` on the other steps."""
        opt = self._optimizer
        if monitored:
            self._sparse = None
        if monitored or (opt is not None and len(opt.param_groups) != self._groups):
            self._refresh()

    def _refresh(self) -> None:
        model_params = user_parameters(self._model)
        named = [(n, p) for n, p in model_params if p.requires_grad]
        opt = self._optimizer
        self._groups = len(opt.param_groups) if opt is not None else 0
        if opt is not None:
            known = {id(p) for _, p in model_params}
            named += [(f"param_groups.{g}.{i}", p)
                      for g, group in enumerate(opt.param_groups)
                      for i, p in enumerate(group["params"])
                      if id(p) not in known and p.requires_grad]
        params: list[torch.Tensor] = [p for _, p in named]
        if [id(p) for p in params] == [id(p) for p in self.params]:
            return
        self.names = [self.prefix + n for n, _ in named]
        self.params = params
        # DTensor parameters (FSDP2, tensor parallel): their statistics are of the local
        # shard. Asked once: a per-step hasattr on every gradient is host time on each step.
        self._sharded = any(hasattr(p, "to_local") for p in params)
        # The dtype the norms are computed in: asked once, not per step (_norm_dtype).
        self._norm_dtype = _norm_dtype(params)

    def _present(self) -> tuple[list[str], list[torch.Tensor]]:
        names, grads = [], []
        for name, p in zip(self.names, self.params, strict=True):
            grad = p.grad
            if grad is not None:
                names.append(name)
                grads.append(_local(grad) if self._sharded else grad)
        if self._sparse is None:  # asked on the first step and each layer-statistics step
            self._sparse = any(g.is_sparse for g in grads)
        if self._sparse:
            # A sparse gradient (an Embedding(sparse=True)): its norms, sums, nonzero
            # count and extremes are its stored values' once duplicates are summed, and its
            # statistics divide by the parameter's own size; clipping scales it in place.
            self._sparse_grads = grads
            grads = [g.coalesce().values() if g.is_sparse else g for g in grads]
        return names, grads

    def _measure_grads(self, per_layer: bool, beside: bool = False) -> None:
        self._measured = True
        names, grads = self._present()
        if not grads:
            return
        clip = self.grad_clip if self.apply_clip else None  # apply_clip implies a clip
        # On the CPU, a step's norms may be read beside it (_norm_worker.py), only the
        # every-step ones: a clip, an all-reduce, per-layer statistics and distributions
        # use them now; any other step is checked for writes to the gradients.
        beside = beside and not self._sparse and not self._sharded and _finite.on_host(grads[0])
        eligible = (beside and self._offload.ready and not per_layer and clip is None
                    and self.reduce_group is None and not self.hist_step)
        if (eligible and self._offload.way(time.perf_counter())
                and self._offload.submit(grads, self._norm_dtype)):
            self._offload_names = names
            return
        norms = _norm_list(grads, 2, self._norm_dtype)
        self._grad_norms = norms
        if beside:  # an eligible step read here is checked as one read beside it is
            self._offload.watch(grads, norms, self._norm_dtype, recheck=not eligible)
        if per_layer or clip is not None or self.reduce_group is not None:
            vector = self._grad_vector = torch.stack(norms)
            total = self._total = self._global_from(vector)
            self._pack.add("grad_norm", total)
            # The per-parameter norms the global one is made of: free, and read with the
            # same host copy; the sender decides whether they go out (_gate.py).
            self._pack.add("param_grad_norm", vector, layers=names)
        elif _finite.on_host(grads[0]):  # the usual CPU step: one stack, read at once by the host
            vector = self._grad_vector = torch.stack(norms)  # (grads_finite, the sender)
            self._pack.add("param_grad_norm", vector, layers=names)
        else:  # the usual device step: one kernel here, the global norm made on the host
            self._pack.add_each("param_grad_norm", norms, names)
        if per_layer:  # before clipping: every statistic describes the raw gradient
            self._pack.layers = list(self.names)
            self._pack.add("layer_grad", _grad_moments(grads, vector, self._numels(names, grads),
                                                       self._norm_dtype), layers=names)
        if self.hist_step:  # also before clipping
            self._pack.add("grad_hist", self._dist.measure(grads), layers=names)
        if clip is not None:
            # The same arithmetic as clip_grad_norm_(foreach=True), reusing our norm.
            coef = torch.clamp(clip / (total + 1e-6), max=1.0)
            if self._sparse:
                for grad in self._sparse_grads:
                    grad.mul_(coef.to(grad.device))
            else:
                torch._foreach_mul_(grads, coef.to(grads[0].device))

    def _settle(self) -> None:
        """The norms read beside the step, once it returned (else: learn whether the step
        wrote to the gradients, ``NormOffload``)."""
        offload = self._offload
        if not offload.pending:
            offload.learn()
            return
        vector = offload.take()
        if vector is None:
            self._unread = True
            return
        self._grad_vector = vector
        self._pack.add("param_grad_norm", vector, layers=self._offload_names)

    def _numels(self, names: list[str], grads: list[torch.Tensor]) -> torch.Tensor:
        """Each gradient's element count as a float32 device vector, made once per set of
        parameters: building it from a Python list is a host-to-device copy, which on CUDA
        waits for the device (a host sync on the training thread every monitored step)."""
        key = (tuple(names), str(grads[0].device))
        numel = self._numel_cache.get(key)
        if numel is None:
            size = {name: _local(p).numel() for name, p in zip(self.names, self.params,
                                                                 strict=True)}
            numel = torch.tensor([size[name] for name in names], dtype=torch.float32).to(
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
        pnorms = _norms(params, self._norm_dtype)
        self._pack.layers = list(self.names)
        self._pack.add("param_norm", pnorms, layers=self.names)
        self._pack.add("param_norm", self._global_from(pnorms))
        snapshot, idx = self._snapshot, self._snap_idx
        self._snapshot = None
        if not snapshot:
            return
        torch._foreach_sub_(snapshot, [params[i] for i in idx])  # before - after, in place
        unorms = _norms(snapshot, self._norm_dtype)
        self._pack.add("update_norm", unorms, layers=[self.names[i] for i in idx])
        if len(idx) == len(self.names):
            self._pack.add("update_norm", self._global_from(unorms))

    def _global_from(self, norms: torch.Tensor) -> torch.Tensor:
        if self.reduce_group is None:
            return torch.linalg.vector_norm(norms)
        return self._all_reduce_sq(norms.square().sum()).sqrt()


def _grad_moments(grads: list[torch.Tensor], norms: torch.Tensor, numel: torch.Tensor,
                  dtype: torch.dtype | None = None) -> torch.Tensor:
    """(P, 5) table: L2 norm, mean, std, max-abs, zero fraction; 3 more passes over grads.

    ``numel`` holds each gradient's element count (float32, on their device). The std
    comes from the sum of squares we already have (norm^2), not another pass.
    """
    wide = dtype or torch.float32
    sums = torch.stack([g.sum(dtype=wide) for g in grads])
    nonzero = torch.stack([torch.count_nonzero(g) for g in grads]).to(wide)
    mean = sums / numel
    var = (norms.square() - numel * mean.square()) / (numel - 1).clamp(min=1)
    std = var.clamp(min=0).sqrt()
    zero_frac = 1.0 - nonzero / numel
    return torch.stack([norms, mean, std, _max_abs(grads, dtype), zero_frac], dim=1)


def _max_abs(grads: list[torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor:
    if grads[0].device.type == "cuda":  # one fused kernel on GPU
        return torch.stack(_norm_list(grads, math.inf, dtype or torch.float32))
    # On CPU the inf-norm is ~40x slower than one aminmax pass per tensor (measured).
    pairs = [torch.aminmax(g) for g in grads]
    return torch.stack([torch.maximum(-lo, hi) for lo, hi in pairs]).to(dtype or torch.float32)


def _norm_dtype(tensors: list[torch.Tensor]) -> torch.dtype | None:
    """The dtype per-tensor norms are computed in, for tensors of these dtypes: None (their
    own) when every one is float32; float64 when one is (a float64 model's norms must not
    narrow: torch refuses it, and float32 would turn its values past 3.4e38 into a false
    infinity, below 1e-38 into a false zero); else float32 (a half-precision norm of a
    large tensor overflows at 65504)."""
    dtypes = {t.dtype for t in tensors}
    if dtypes <= {torch.float32}:
        return None
    return torch.float64 if dtypes & {torch.float64, torch.complex128} else torch.float32


def _norm_list(tensors: list[torch.Tensor], ord: float,
               dtype: torch.dtype | None) -> list[torch.Tensor]:
    """Each tensor's norm as a 0-d tensor, computed in ``dtype`` (``_norm_dtype``): one fused
    kernel (on CPU one call) for the lot."""
    if dtype is None:
        return list(torch._foreach_norm(tensors, ord))
    return list(torch._foreach_norm(tensors, ord, dtype=dtype))


def _norms(tensors: list[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per-tensor L2 norms as one vector (``_norm_list``)."""
    return torch.stack(_norm_list(tensors, 2, dtype))
