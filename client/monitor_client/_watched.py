"""The models a run watches: one, or several by name, each with its optimizer and hooks.

A GAN trains a generator and a discriminator, an actor-critic an actor and a critic, a
distillation a student beside its teacher: several models and optimizers, one run. Each
``Monitor.watch(model, optimizer, name="G")`` adds one; its parameters, modules and
activations are named ``G.<name>`` on the wire, its own global norms, learning rate and
clipping threshold go to the step record's ``models`` by name, and the step's global norms
are over every watched model (docs/format.md). Watching a single model with no name keeps
its names as they are.

What is never done is mixing models silently, so ``admit`` refuses, before anything is
hooked, a second model under a name in use (no name included) and a named model beside an
unnamed one; watching the same model again under its name (a new optimizer, say) replaces
its hooks::

    >>> import torch
    >>> from types import SimpleNamespace
    >>> models = WatchedModels()
    >>> d, g = torch.nn.Linear(2, 1), torch.nn.Linear(1, 2)
    >>> models.admit(None, d) is None            # the first model: nothing to replace
    True
    >>> models.entries.append(SimpleNamespace(name=None, model=d))   # as watch() puts it
    >>> models.admit(None, d) is models.first    # the same model again: replaced
    True
    >>> models.admit(None, g)
    Traceback (most recent call last):
    monitor_client._errors.SettingsValueError: watch(): this run already watches a Linear; a
    second model (Linear) would mix the two models' statistics. To monitor several models
    give each a name: ...
    >>> models.admit("G", g)
    Traceback (most recent call last):
    monitor_client._errors.SettingsValueError: watch(): this run already watches a Linear; a
    second model (Linear named 'G') would mix ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monitor_client._errors import SettingsValueError

if TYPE_CHECKING:  # imported where used: importing monitor_client must not import torch
    from monitor_client._activations import ActivationStats
    from monitor_client._guard import StepGuard
    from monitor_client._pack import StatsPack
    from monitor_client._stats import GradStats
    from monitor_client.settings import WatchSettings

MAX_MODELS = 64  # as the sidecar's schema bounds ``models``


@dataclass
class Watched:
    """One watched model: its optimizer (None: updated by hand), its GradScaler, and the
    parts that hook them."""

    name: str | None
    model: Any
    optimizer: Any
    scaler: Any
    settings: WatchSettings
    stats: GradStats
    guard: StepGuard | None = None
    acts: ActivationStats | None = None

    def take(self) -> StatsPack:
        """This model's statistics of the step (its pack; no tensor op)."""
        pack = self.stats.take()
        if self.acts is not None:
            self.acts.add_to(pack)
        if self.guard is not None:
            self.guard.add_to(pack)
        return pack

    def detach(self) -> None:
        for part in (self.stats, self.guard, self.acts):
            if part is not None:
                part.detach()

    def hook_errors(self) -> int:
        return sum(part._hooks.errors for part in (self.stats, self.guard, self.acts)
                   if part is not None)

    def describe(self) -> dict[str, Any]:
        """This model's entry in the run record's ``model.models``."""
        from monitor_client import _model_info

        info = _model_info.describe_model(self.model, self.stats.names)
        info.pop("layer_order")  # the run's layer_order lists every model's, in order
        return {"name": self.name, "class": info.pop("name"), **info,
                "prefix": self.stats.prefix,
                "optimizer": type(self.optimizer).__name__ if self.optimizer is not None
                else None, "grad_clip": self.settings.grad_clip}


class WatchedModels:
    """The run's watched models, in the order they were watched (module docstring)."""

    def __init__(self) -> None:
        self.entries: list[Watched] = []

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def first(self) -> Watched | None:
        return self.entries[0] if self.entries else None

    @property
    def named(self) -> bool:
        """Whether the models are named (several, or one given a name)."""
        return bool(self.entries) and self.entries[0].name is not None

    def admit(self, name: str | None, model: Any) -> Watched | None:
        """May ``model`` be watched under ``name``? The entry it replaces (the same model
        watched again), None for a new one; refused with a ``ValueError`` otherwise."""
        if name is not None and (not isinstance(name, str) or not name.strip()
                                 or len(name) > 64 or any(c in name for c in ".\0\n")):
            raise SettingsValueError(f"watch(name={name!r}): a model's name is 1-64 "
                                     "characters without '.', a newline or NUL (it prefixes "
                                     "its parameters' names: 'G.conv1.weight')")
        for entry in self.entries:
            if entry.name == name:
                if entry.model is model:
                    return entry
                raise SettingsValueError(_refusal(entry, name, model))
        if self.entries and (name is None) != (self.entries[0].name is None):
            raise SettingsValueError(_refusal(self.entries[0], name, model))
        if len(self.entries) >= MAX_MODELS:
            raise SettingsValueError(f"watch(): at most {MAX_MODELS} models per run")
        return None

    def put(self, watched: Watched, replaces: Watched | None) -> None:
        if replaces is None:
            self.entries.append(watched)
            return
        replaces.detach()
        self.entries[self.entries.index(replaces)] = watched

    def take(self) -> StatsPack:
        """The step's statistics: one model's pack as it is, several merged by name."""
        if len(self.entries) == 1 and self.entries[0].name is None:
            return self.entries[0].take()
        from monitor_client._pack import StatsPack

        pack = StatsPack()
        for entry in self.entries:
            assert entry.name is not None
            pack.merge(entry.take(), entry.name)
        return pack

    def host_fields(self) -> dict[str, Any]:
        """Per model, what the step record says of it from the host (its clipping)."""
        return {entry.name: {"clip_threshold": entry.stats.grad_clip}
                for entry in self.entries if entry.name is not None}

    def pop_overhead(self) -> float:
        return sum(entry.stats.pop_overhead() for entry in self.entries)

    def hook_errors(self) -> int:
        return sum(entry.hook_errors() for entry in self.entries)

    def detach(self) -> None:
        for entry in self.entries:
            entry.detach()

    def describe(self) -> dict[str, Any]:
        """The run record's ``model`` (docs/format.md): one model as before; several as
        their sum, every parameter name in ``layer_order`` (model by model, in the order
        they were watched) and each model in ``models``."""
        from monitor_client import _model_info

        if not self.named:
            entry = self.entries[0]
            return _model_info.describe_model(entry.model, entry.stats.names)
        models = [entry.describe() for entry in self.entries]
        return {"name": "+".join(str(m["class"]) for m in models),
                "n_params": sum(int(m["n_params"]) for m in models),
                "layer_order": [n for entry in self.entries for n in entry.stats.names],
                "models": models}


def _refusal(entry: Watched, name: str | None, model: Any) -> str:
    what = f"a {type(entry.model).__name__}" + (f" named {entry.name!r}" if entry.name else "")
    return (f"watch(): this run already watches {what}; a second model "
            f"({type(model).__name__}{f' named {name!r}' if name else ''}) would mix the two "
            "models' statistics. To monitor several models give each a name: "
            "mon.watch(netD, optD, name='D'); mon.watch(netG, optG, name='G') "
            "(docs/client.md, 'Several models')")
