"""``StatsPack``: one step's statistics, still on the device, and how to name them on the host.

The training thread only appends tensors and their layout (``add``: no tensor op, since any
torch call may hand the GIL to another thread for milliseconds); the sender thread reads
them all at once (``host()``: THE copy of a step) and names the numbers (``decode``).

On a monitored step (``layers`` set), a global value and one value per layer::

    >>> pack = StatsPack(layers=["w", "b"])
    >>> pack.add("grad_norm", torch.tensor(5.0))
    >>> pack.add("grad_norm", torch.tensor([3.0, 4.0]), layers=["w", "b"])
    >>> host = pack.host()                # THE copy to the host (sender thread)
    >>> host
    [5.0, 3.0, 4.0]
    >>> pack.decode(host)
    {'grad_norm': 5.0, 'layers': {'w': {'grad_norm': 3.0}, 'b': {'grad_norm': 4.0}}}

Several models (``Monitor.watch(..., name=)``): each model's pack is merged under its name.
Their global norms go to ``models`` by name, and the step's own are the norms over every
model's parameters (the norm of the models' norms); parameter names are already prefixed
with the model's name. A global gradient norm that was not made on the device (nothing
needed it there: no clipping, no guard) is made here, from the parameters' norms::

    >>> d, g = StatsPack(), StatsPack()
    >>> d.add_each("param_grad_norm", [torch.tensor(3.0)], ["D.w"])
    >>> g.add_each("param_grad_norm", [torch.tensor(4.0)], ["G.w"])
    >>> g.stepped = True                  # only G's optimizer stepped
    >>> step = StatsPack()
    >>> step.merge(d, "D"); step.merge(g, "G")
    >>> step.decode(step.host())
    {'grad_norms': {'D.w': 3.0, 'G.w': 4.0}, 'grad_norm': 5.0,
     'models': {'D': {'grad_norm': 3.0, 'skipped': True}, 'G': {'grad_norm': 4.0}}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from monitor_client import _activations, _distributions, _finite, _guard

_LAYER_FIELDS = ("grad_norm", "grad_mean", "grad_std", "grad_max_abs", "grad_zero_frac")
_HIST_FIELDS = ("grad_hist", "param_hist")
# The global values of several models that the step's own value is made of: an L2 norm over
# every model's parameters is the L2 norm of the models' norms.
_NORMS = ("grad_norm", "param_norm", "update_norm")


class Entry(NamedTuple):
    """What ``width`` numbers of the host copy are: a global value (``names`` None) or one
    per name; ``model`` the watched model's name in a merged pack (else None)."""

    name: str
    names: tuple[str, ...] | None
    width: int
    model: str | None = None
    tensors: int = 1  # how many of the pack's values make it (add_each: one per name)


@dataclass
class StatsPack:
    """Device tensors of one step, plus the layout needed to name them after the copy."""

    values: list[torch.Tensor] = field(default_factory=list)
    layout: list[Entry] = field(default_factory=list)
    layers: list[str] | None = None   # set on monitored steps: every watched parameter
    stepped: bool = False
    event: Any = None                 # a torch.cuda.Event recorded once the pack is whole
    finite_check: str = "full"        # what the "output_sum" values read (_finite.py)
    models: dict[str, bool] | None = None  # merged: each model's name -> it stepped
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)  # per model, host values

    def add(self, name: str, value: torch.Tensor, layers: list[str] | None = None,
            model: str | None = None) -> None:
        # No tensor op here: log_step calls this, and any torch op may hand the GIL to
        # another thread for milliseconds. Flattening happens off-thread.
        self.values.append(value)
        self.layout.append(Entry(name, tuple(layers) if layers is not None else None,
                                 value.numel(), model))

    def keeping(self, names: frozenset[str]) -> StatsPack:
        """A new pack with only the entries named in ``names`` (and the layer list, when
        one of them is kept): what a step's statistics carry over into the next step's
        pack when both end up in one record (``GradStats``: a loop that logs every few
        optimizer steps)."""
        kept = StatsPack()
        at = 0
        for entry in self.layout:
            if entry.name in names:
                kept.values.extend(self.values[at:at + entry.tensors])
                kept.layout.append(entry)
            at += entry.tensors
        if kept.layout and self.layers is not None:
            kept.layers = self.layers
        return kept

    def add_each(self, name: str, values: list[torch.Tensor], layers: list[str]) -> None:
        """One 0-d tensor per name (e.g. a forward hook's flag), stacked off-thread."""
        self.values.extend(values)
        self.layout.append(Entry(name, tuple(layers), len(values), tensors=len(values)))

    def merge(self, other: StatsPack, model: str) -> None:
        """Take ``other``, the pack of the watched model named ``model``."""
        self.values.extend(other.values)
        self.layout.extend(entry._replace(model=model) for entry in other.layout)
        if other.layers is not None:
            self.layers = (self.layers or []) + other.layers
        self.stepped = self.stepped or other.stepped
        if self.models is None:
            self.models = {}
        self.models[model] = other.stepped

    def seal(self) -> StatsPack:
        """Mark, on the training thread's stream, the point where every value is made (the
        loss, the forward's sums, the statistics, a loss scale or LR copied after the
        optimizer step): the copy waits for it, whatever stream the training used.
        Recording an event queues a marker; nothing waits here."""
        if self.values and self.values[0].is_cuda:  # (an attribute: no device object made)
            self.event = torch.cuda.Event()
            self.event.record()
        return self

    def host(self) -> list[float] | None:
        """Every number of the pack on the host, in layout order: THE copy of a step, made
        by the sender thread. On the CPU nothing needs copying or stacking: each value is
        read as it is, in its own precision (a float64 model's numbers past float32's
        range stay finite), with no tensor made on the way (each one is host time the
        training thread may wait for, the GIL being shared)."""
        if not self.values:
            return None
        if self.event is None and all(v.is_cpu for v in self.values):
            out: list[float] = []
            for v in self.values:
                if v.ndim == 0:
                    out.append(v.item())
                else:
                    out.extend(v.detach().reshape(-1).tolist())
            return out
        vector = self.vector()
        return vector.tolist() if vector is not None else None

    def vector(self) -> torch.Tensor | None:
        """Everything as one vector on the host (float32; float64 when a value is): the
        device copy. On CUDA it waits for the event ``seal()`` recorded."""
        if not self.values:
            return None
        device = self.values[0].device
        if self.event is not None:  # sealed on CUDA
            return self._vector_off_stream(device)
        return self._flat(device).cpu()

    def _flat(self, device: torch.device) -> torch.Tensor:
        # Runs of 0-d values (a forward's module sums, the loss, the global norms: most of
        # a step's values) are stacked in one call, not reshaped one by one: each tensor
        # call here holds the GIL for microseconds that a host-bound training thread waits
        # for (about 1 ms a step on a GPT-2 before, 0.3 ms after, on CPU).
        dtype = torch.float64 if any(v.dtype == torch.float64 for v in self.values) \
            else torch.float32
        parts: list[torch.Tensor] = []
        run: list[torch.Tensor] = []
        with torch.no_grad():
            for v in self.values:
                if v.dim() == 0 and v.dtype == dtype and v.device == device:
                    run.append(v)
                    continue
                if run:
                    parts.append(torch.stack(run))
                    run = []
                parts.append(v.detach().reshape(-1).to(device, dtype))
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
        """Name the host numbers: global fields, and ``layers`` when present."""
        out: dict = {}
        models: dict[str, dict[str, Any]] = {}
        norms: dict[str | None, list[float]] = {}  # each model's parameters' grad norms
        layers: dict[str, dict[str, Any]] | None = (
            {name: {} for name in self.layers} if self.layers is not None else None)
        pos = 0
        for name, names, width, model, _ in self.layout:
            chunk = flat[pos:pos + width]
            pos += width
            into = out if model is None else models.setdefault(model, {})
            if name == "skip_code":  # the step guard's decision (_guard.py)
                reason = _guard.skip_reason(chunk[0])
                if reason is not None:
                    into.update(skipped=True, skip_reason=reason)
            elif names is None:
                into[name] = chunk[0]
            elif name in _HIST_FIELDS:  # (P, 8 + bins) rows (_distributions.py)
                bins = width // len(names) - len(_distributions.QUANTILES)
                out.setdefault(name, {}).update(_distributions.decode_rows(names, chunk, bins))
            elif name == "activation":  # one module's output (_activations.py)
                out.setdefault("activations", {})[names[0]] = _activations.decode(names, chunk)
            elif name == "param_grad_norm":  # every step; _gate.py decides if it is sent
                out.setdefault("grad_norms", {}).update(zip(names, chunk, strict=True))
                norms.setdefault(model, []).extend(chunk)
            elif name == "output_sum":  # _finite.py: forward order, one sum per module
                out.update(_finite.decode(names, chunk, self.finite_check))
            elif layers is not None:
                _fill_layers(layers, name, names, chunk)
        for model, values in norms.items():  # made here when the device did not need it
            (out if model is None else models[model]).setdefault("grad_norm", _l2(values))
        if layers is not None:
            for entry in layers.values():
                if "grad_norm" not in entry:
                    entry["grad_none"] = True
            out["layers"] = layers
        if self.models is not None:
            _combine(out, models, self.models, self.notes)
        return out


def _combine(out: dict, models: dict[str, dict[str, Any]], stepped: dict[str, bool],
             notes: dict[str, dict[str, Any]]) -> None:
    """Each model's own values under ``models`` (``notes``: those known on the host); the
    step's global norms over all of them. The step is skipped only when every model's step
    was (the guard skipped each)."""
    for model, took in stepped.items():
        entry = models.setdefault(model, {})
        for key, value in notes.get(model, {}).items():
            entry.setdefault(key, value)
        if not took:
            entry["skipped"] = True  # its optimizer did not step this time
    for key in _NORMS:
        values = [m[key] for m in models.values() if m.get(key) is not None]
        if values and out.get(key) is None:
            out[key] = _l2(values)
    reasons = [m.get("skip_reason") for m in models.values()]
    if models and all(reasons):
        out.update(skipped=True, skip_reason=reasons[0])
    out["models"] = models


def _l2(values: list[float]) -> float:
    """The L2 norm of ``values`` without overflowing their squares (float64 norms past 1e154
    stay finite); NaN when one is NaN and none is infinite, as IEEE ``hypot`` has it."""
    return math.hypot(*values)


def _fill_layers(layers: dict, name: str, names: tuple[str, ...], chunk: list[float]) -> None:
    if name == "layer_grad":
        for i, layer in enumerate(names):
            layers[layer].update(zip(_LAYER_FIELDS, chunk[5 * i:5 * i + 5], strict=True))
        return
    for layer, value in zip(names, chunk, strict=True):
        layers[layer][name] = value
