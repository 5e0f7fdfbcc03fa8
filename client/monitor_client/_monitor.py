"""``Monitor``: three lines in a training script, near-zero overhead, never blocks training.

A script makes one (``Monitor(url=..., project="gpt", config={"lr": 3e-4})``), calls
``watch(model, optimizer, grad_clip=1.0)`` in place of its ``clip_grad_norm_`` call, then
``log_step`` once per optimizer step (client/README.md has the whole loop). Two steps of
a tiny model, the second with a NaN loss; a stand-in takes the place of the sidecar's HTTP
endpoint (the tests use a loopback server, tests/client/conftest.py)::

    >>> import json, torch
    >>> from types import SimpleNamespace
    >>> from monitor_client._transport import PostOutcome, PostResult
    >>> got = []
    >>> sidecar = SimpleNamespace(base="stand-in", endpoint="stand-in", close=lambda: None,
    ...     post=lambda lines: got.extend(map(json.loads, lines)) or PostResult(PostOutcome.OK))
    >>> spool = tempfile.TemporaryDirectory()
    >>> mon = Monitor(project="demo", settings=MonitorSettings(spool_dir=spool.name))
    >>> mon._sender.transport = sidecar           # where it would POST to the sidecar
    >>> model = torch.nn.Linear(4, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> mon.watch(model, opt, grad_clip=1.0)
    >>> for step, factor in ((1, 1.0), (2, float("nan"))):
    ...     loss = model(torch.ones(8, 4)).pow(2).mean() * factor
    ...     loss.backward(); opt.step(); opt.zero_grad()
    ...     mon.log_step(step, loss=loss, tokens=32)
    >>> mon.close()       # also at exit; an uncaught exception ends the run as "failed"
    True
    >>> [(r["kind"], r.get("loss")) for r in got], got[2]["grad_norm"], mon.counters().sent
    ([('run', None), ('step', ...), ('step', 'NaN'), ('end', None)], 'NaN', 4)
    >>> spool.cleanup()

``log_step`` reads nothing from the device: the statistics stay there until the sender
thread copies them to the host (see ``_pending.py``). A nonsensical setting raises at once,
before training starts (``settings.py`` names the field); after that every public method
swallows its own errors into rate-limited warnings: monitoring never raises into training.

This module reports the run: ``watch``, ``log_step`` and the other records, and the run's
start and end. What the sidecar asks back (a rule's stop or checkpoint request, rollback and
restart plans, the agreement across ranks) is ``_control.py``'s; ``Monitor``'s methods for
it (``should_stop``, ``rollback_plan``, ...) are one line each into it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from monitor_client import _launcher, _process, _run_info
from monitor_client._arguments import hyperparameters, monitor_settings, watch_settings
from monitor_client._attempt import AttemptNotice, new_token
from monitor_client._control import Control
from monitor_client._counters import Counters
from monitor_client._data import DataStream
from monitor_client._errors import SettingsValueError
from monitor_client._exit_hooks import ExitHooks, outcome_of
from monitor_client._foreign_optimizer import hookable
from monitor_client._gate import NormGate
from monitor_client._memory import CpuMemory, memory_probe
from monitor_client._pending import PendingStep, Probes
from monitor_client._phase import PhaseTracker
from monitor_client._preflight import Preflight
from monitor_client._restart import RestartOrder
from monitor_client._rollback import CHECKPOINT_PATH_MAX, CHECKPOINT_TAG_MAX, RollbackPlan
from monitor_client._sender import Sender
from monitor_client._spool import Spool, private_directory, spool_directory
from monitor_client._timings import split
from monitor_client._transport import HttpTransport
from monitor_client._warn import Warner
from monitor_client._watchdog import Watchdog
from monitor_client._watched import Watched, WatchedModels
from monitor_client.settings import DEFAULT_URL, MonitorSettings, WatchSettings

if TYPE_CHECKING:  # imported where used: importing monitor_client must not import torch
    from monitor_client._activations import ActivationStats
    from monitor_client._finite import FiniteFlags
    from monitor_client._guard import StepGuard
    from monitor_client._nvml import GpuSampler
    from monitor_client._rollback import PlanBook
    from monitor_client._stats import GradStats
    from monitor_client._timings import StepTimings

__all__ = ["Monitor"]

P = ParamSpec("P")
R = TypeVar("R")


def _never_raises(
    method: Callable[Concatenate[Monitor, P], R],
) -> Callable[Concatenate[Monitor, P], R | None]:
    """Turn any exception of a public method into a rate-limited warning (a private
    ``_name`` doing a public method's work is reported under ``name``)."""
    name = method.__name__.lstrip("_")

    @functools.wraps(method)
    def wrapper(self: Monitor, *args: P.args, **kwargs: P.kwargs) -> R | None:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - monitoring must never break training
            self._warner.warn(name, "%s failed (ignored): %r", name, exc)
            return None

    return wrapper


class Monitor:
    """One run's health reporting; see the module docstring for the usage.

    The keywords are what nearly every script sets: ``url`` (None: ``MONITOR_AGENT_URL``,
    else http://127.0.0.1:9400), ``project``, ``config`` (the run's hyperparameters, a
    JSON-able dict shown with the run), ``total_steps`` (the optimizer steps planned: the
    run page's progress and ETA come from it), ``loss_kind`` (what the loss is, when it is not
a non-negative error that falls: "signed", or "nonstationary" for RL and GAN objectives;
``MonitorSettings``), ``run_id`` (None: from the launcher, else
    generated), ``token`` (None: ``MONITOR_AGENT_TOKEN``) and ``labels``. Every other knob
    is a field of ``settings``, a ``MonitorSettings`` (``settings.py``, with units), whose
    ``watch`` is what ``watch()`` measures unless told otherwise. A value that makes no
    sense raises ``ValueError``/``TypeError`` here, before training starts; after that
    nothing raises.

    A keyword fills a field the settings leave at its default; one that contradicts them
    is refused before anything starts. As a context manager, the run ends with the block
    (``enabled=False`` here: every method a no-op, no thread, nothing sent)::

        >>> settings = MonitorSettings(project="gpt", linger=0.2, enabled=False,
        ...                            watch=WatchSettings(layer_stats_every=10, activations=True))
        >>> with Monitor(config={"lr": 3e-4}, settings=settings) as mon:
        ...     mon.log_step(1, loss=2.0)
        >>> mon.settings.project, mon.config, mon.settings.watch.layer_stats_every
        ('gpt', {'lr': 0.0003}, 10)
        >>> Monitor(project="bert", settings=settings)
        Traceback (most recent call last):
        monitor_client._errors.SettingsTypeError: Monitor(): got settings=MonitorSettings(...) and keywords that contradict it:
        project='bert' (settings has 'gpt'); ...
    """

    def __init__(self, url: str | None = None, project: str | None = None,
                 config: Mapping[str, Any] | None = None, *, total_steps: int | None = None,
                 loss_kind: str | None = None,
                 run_id: str | None = None, token: str | None = None,
                 labels: Mapping[str, Any] | None = None,
                 settings: MonitorSettings | None = None) -> None:
        self._start(monitor_settings("Monitor", settings, dict(
            url=url, project=project, total_steps=total_steps, loss_kind=loss_kind,
            run_id=run_id, token=token, labels=labels)), hyperparameters("Monitor", config))

    def _start(self, settings: MonitorSettings, config: dict[str, Any]) -> None:
        self.settings = settings
        found = _run_info.detect_rank()
        self.rank = found.rank if settings.rank is None else settings.rank
        self.world_size = found.world_size if settings.world_size is None else settings.world_size
        self.info = _run_info.RankInfo(self.rank, self.world_size, found.local_rank)
        self.project, self.config = settings.project, config
        if settings.total_steps is not None:  # the sidecar reads the plan from the run's config
            self.config["total_steps"] = int(settings.total_steps)
        if settings.loss_kind is not None:  # how the sidecar judges the loss (docs/format.md)
            self.config["loss_kind"] = settings.loss_kind
        self.run_id = _run_info.resolve_run_id(settings.run_id, settings.project, self.info)
        # This process's records are one attempt of the run id (docs/format.md).
        self.attempt = new_token()
        self._attempt_notice = AttemptNotice(self.run_id, self.attempt)
        self.layer_stats_every = settings.watch.layer_stats_every
        self.hist_every = settings.watch.hist_every
        self.active = settings.enabled and not (settings.rank0_only and self.rank != 0)
        self._warner = Warner()
        # The data (_data.py): the DataStream timed() wraps, and the last step's position.
        self._stream: DataStream | None = None
        # How the data leaves a plan's windows out ("sampler" or "reading", _stream.py),
        # said on the run record so pages say it; None until a DataStream is seen.
        self._skips_by: str | None = None
        self._last_position: tuple[int, int] | None = None
        self._labels = _run_info.build_labels(
            settings.project, dict(settings.labels) if settings.labels is not None else None)
        self._probes = Probes(memory=CpuMemory(), world_size=self.world_size)
        self._model_info: dict[str, Any] = {}
        self._hardware = _run_info.describe_hardware("cpu", self.info, None)
        self._models = WatchedModels()  # what watch() hooked (_watched.py)
        self._finite: FiniteFlags | None = None
        self._timings: StepTimings | None = None
        self._gpu_sampler: GpuSampler | None = None
        self._preflight: Preflight | None = None
        self._run_sent = self._closed = False
        self._last_step = 0
        # A run's steps count on: a loop that numbers them per epoch (enumerate(loader))
        # goes back to 0, which the sidecar would take for a resend of the first epoch's.
        self._step_offset, self._logged = 0, None  # see _run_step
        self._outcome: tuple[str, str | None] = ("completed", None)
        self._last_t, self._data_time = time.perf_counter(), 0.0
        # perf_counter of this process's latest loop record's return (log_step, log_eval,
        # checkpoint_saved): an eval's or a save's ``seconds`` is the time since (None
        # before the first; the goodput ledger, monitor_agent/runs/goodput.py, reads them).
        self._loop_t: float | None = None
        self.close_timeout = settings.close_timeout
        self._placement = _run_info.detect_placement(self.info, self._url(settings))
        self._sender: Sender | None = None
        self._restart = self._restart_order(settings)
        # The other direction: what the sidecar asks of the run (_control.py). Before the
        # sender, whose answers and polls deliver the actions to it.
        self._control = Control(
            self.run_id, self.rank, enabled=settings.enabled, warner=self._warner,
            restart=self._restart, transport=self._transport, flush=self._flush,
            submit=lambda record: self._submit(record, urgent=True),
            progress=lambda: (self.attempt, self._last_step))
        self._sender = self._make_sender(settings) if self.active else None
        # The hang watchdog (_watchdog.py): its thread starts at the first log_step.
        self._phase = PhaseTracker()
        self._watchdog = Watchdog(settings.watchdog_floor, self._send_hang, {
            "run_id": self.run_id, "rank": self.rank, "attempt": self.attempt},
            self._phase, self.rank) if self.active and settings.watchdog else None
        self._closing = False  # close() is sending what is queued (see _end_on_signal)
        self._trainer: int | None = None  # the thread that logs steps (its death fails the run)
        self._exit_hooks = ExitHooks(self.close, self._set_outcome, self._end_on_signal,
                                     lambda: self._trainer)
        if self.active and settings.install_hooks:
            self._exit_hooks.install()

    def _restart_order(self, settings: MonitorSettings) -> RestartOrder:
        """What this process does on the run's restart decisions (``_restart.py``), and what
        its run record declares of its launcher (``_launcher.py``)."""
        self._launcher = _launcher.detect()
        if settings.restart_exit is not None:
            self._launcher["restarts"] = settings.restart_exit
        return RestartOrder(
            started=time.time(), enabled=bool(self._launcher["restarts"]) and self.active,
            node_rank=self._placement["node_rank"] if self._placement else 0,
            flush=self._flush, timeout=settings.close_timeout,
            agent=self._launcher["name"] == "torchrun",
            host=self._labels.get("node") or self._labels.get("hostname"))

    def _flush(self, timeout: float) -> bool:
        """Deliver what was logged so far, up to ``timeout`` s (inactive: nothing to)."""
        return self._sender.flush(timeout) if self._sender is not None else True

    def _transport(self) -> HttpTransport:
        """The link to this rank's sidecar: the sender's, or (inactive) one of its own."""
        if self._sender is not None:
            return self._sender.transport
        token = self.settings.token or os.environ.get("MONITOR_AGENT_TOKEN")
        return HttpTransport(self._url(self.settings), token, timeout=self.settings.timeout)

    @staticmethod
    def _url(settings: MonitorSettings) -> str:
        return settings.url or os.environ.get("MONITOR_AGENT_URL") or DEFAULT_URL

    def _make_sender(self, settings: MonitorSettings) -> Sender:
        url = self._url(settings)
        token = settings.token or os.environ.get("MONITOR_AGENT_TOKEN") or None
        base = settings.spool_dir or os.environ.get("MONITOR_AGENT_SPOOL_DIR") or (
            Path(tempfile.gettempdir()) / "monitor_client-spool")
        directory = spool_directory(base, self.run_id, self.rank)
        transport = HttpTransport(url, token, timeout=settings.timeout)
        try:  # private to this user, or not used (_spool.py): a spool is replayed as ours
            private_directory(base, base=True)
            spool = Spool(directory, max_bytes=settings.spool_max_bytes, max_age=settings.spool_max_age)
        except OSError as exc:
            elsewhere = Path(tempfile.mkdtemp(prefix="monitor_client-spool-")) / directory.name
            self._warner.warn("spool_unsafe", "spool %s not used (%s); spooling to %s instead "
                              "(nothing left there is replayed)", directory, exc, elsewhere)
            spool = Spool(elsewhere, max_bytes=settings.spool_max_bytes, max_age=settings.spool_max_age)
        return Sender(transport, spool, max_queue=settings.max_queue, linger=settings.linger,
                      owner=(self.run_id, self.rank),
                      warner=self._warner, on_actions=self._control.receive,
                      on_attempts=self._attempt_notice.receive,
                      poll=lambda: self._control.poll(transport),
                      # Stuck: the restart that frees it comes only by a poll (_restart.py).
                      hurry=lambda: getattr(self, "_watchdog", None) is not None
                      and self._watchdog.stuck,  # type: ignore[union-attr]
                      name=f"run {self.run_id!r} rank {self.rank}")

    # -- hooking the model -----------------------------------------------------------------
    def watch(self, model: Any, optimizer: Any = None, *, name: str | None = None,
              grad_clip: float | None = None, scaler: Any = None, guard: Any = None,
              settings: WatchSettings | None = None) -> None:
        """Hook ``optimizer`` for gradient/update statistics of ``model``'s parameters.

        ``grad_clip`` (max global gradient L2 norm) is applied inside the optimizer pre-hook
        from the norm we measure anyway (remove your own ``clip_grad_norm_``); ``scaler``
        is the GradScaler whose loss scale is recorded each step; ``guard`` (True, or a
        ``GuardSettings``) skips a step whose gradient is non-finite or an outlier, on the
        device (``_guard.py``), each skip logged with ``skipped``/``skip_reason``. What else it measures is
        a ``WatchSettings`` (each knob, with units, in ``settings.py``): ``settings``, else the
        Monitor's (``MonitorSettings.watch``), with ``grad_clip`` applied.

        Per-layer statistics every ``layer_stats_every`` steps, distributions every
        ``hist_every``, activations when asked (``_activations.py``), forward finite flags
        (``_finite.py``), and once, after the first step, the memory pre-flight
        (``_preflight.py``). A contradictory or nonsensical setting raises at once; any other
        failure is a warning.

        Several models (a GAN, an actor and a critic): one ``watch`` each, each with a
        ``name`` (``_watched.py``); watching a second model without names is refused, the
        same model again under its name re-hooks it. ``optimizer=None``: a loop that
        updates the parameters by hand; gradients are read at ``before_optimizer_step()``
        if the loop calls it (then the update's size too), else at ``log_step``.
        """
        watching = watch_settings(self.settings.watch, settings,
                                  dict(grad_clip=grad_clip, guard=guard))
        if optimizer is not None and (why := hookable(optimizer)):
            self._warner.warn(
                "foreign_optimizer", "watch(): the optimizer %s cannot be hooked (%s): the "
                "model is watched as a loop without an optimizer (gradients read at "
                "log_step, or at before_optimizer_step() when the loop calls it)%s",
                type(optimizer).__name__, why,
                "; grad_clip= is NOT applied: clip in the loop" if watching.grad_clip else "")
            optimizer = None
        if optimizer is None and watching.guard is not None:
            raise SettingsValueError("watch(guard=...) needs the optimizer whose step it "
                                     "skips; a loop without one cannot be guarded")
        replaces = self._models.admit(name, model) if self.active else None
        self._watch(model, optimizer, scaler, watching, name, replaces)

    @_never_raises
    def _watch(self, model: Any, optimizer: Any, scaler: Any, settings: WatchSettings,
               name: str | None = None, replaces: Watched | None = None) -> None:
        if not self.active:
            return
        from monitor_client import _flops, _model_info
        from monitor_client._stats import GradStats

        param = next(model.parameters())
        every = settings.layer_stats_every
        first = not self._models or replaces is self._models.first
        group = _model_info.default_group() if settings.sharded else None
        if first and self.world_size > 1 and optimizer is not None:
            # before GradStats: its pre-hook is compute, not the wait
            self._watch_timings(model, optimizer)
        stats = GradStats(model, optimizer, grad_clip=settings.grad_clip,
                          apply_clip=settings.apply_clip, layer_stats_every=every,
                          reduce_group=group, snapshot_budget_bytes=settings.snapshot_budget_bytes,
                          hist_every=settings.hist_every, prefix=name or "").attach(settings.pre_hook)
        watched = Watched(name, model, optimizer, scaler, settings, stats)
        if settings.guard is not None:
            watched.guard = self._watch_guard(stats, optimizer, settings)
        if settings.activations:
            watched.acts = self._watch_activations(model, optimizer, settings.activations,
                                                   settings.activation_every or every,
                                                   settings.max_activation_modules, name)
        self._models.put(watched, replaces)
        self._watch_finite()
        if self._watchdog is not None:
            self._phase.attach([w.optimizer for w in self._models.entries],
                               [w.model for w in self._models.entries])
        self._model_info = self._models.describe()
        if not first:
            return  # the run's device, probes and pre-flight are the first model's
        self.config.setdefault("grad_clip", settings.grad_clip)
        self.config.setdefault("layer_stats_every", every)
        self.config.setdefault("hist_every", settings.hist_every)
        peak, dtype = _model_info.resolve_peak_flops(param, settings.peak_flops, settings.compute_dtype)
        self._probes = Probes(memory=memory_probe(param.device), gpu=self._gpu(param.device),
                              flops_per_token=settings.flops_per_token or _flops.flops_per_token(
                                  model, settings.seq_len), peak_flops=peak,
                              world_size=self.world_size, gate=NormGate(),
                              on_host=self._on_host)
        self._preflight = Preflight(model, self._probes.memory, self._warn_preflight)
        self._hardware = _run_info.describe_hardware(param.device, self.info, peak)
        if self._gpu_sampler is not None:  # which GPU: what a gpu_health page names
            self._hardware.update(self._gpu_sampler.describe())
        self._hardware.update(compute_dtype=dtype,
                              stats_scope="rank_local_shard" if settings.sharded else "global")
        if name is None:  # named: more models may follow, the run record waits for them
            self._send_run()
        self._last_t = time.perf_counter()

    @property
    def _stats(self) -> GradStats | None:
        """The first watched model's statistics (the benchmarks toggle its hooks)."""
        first = self._models.first
        return first.stats if first is not None else None

    @property
    def _step_guard(self) -> StepGuard | None:
        first = self._models.first
        return first.guard if first is not None else None

    def _watch_activations(self, model: Any, optimizer: Any, which: Any, every: int,
                           cap: int | None, name: str | None) -> ActivationStats | None:
        from monitor_client._activations import DEFAULT_MAX_MODULES, ActivationStats

        if optimizer is None:
            self._warner.warn("activations", "activations=... needs the optimizer whose "
                              "step arms its hooks; not measured for a loop without one")
            return None
        acts = ActivationStats(model, optimizer, every=every, modules=which,
                               max_modules=cap or DEFAULT_MAX_MODULES, prefix=name or "").attach()
        self.config.setdefault("activation_every", every)
        if acts.skipped:
            self._warner.warn("activations", "%d modules beyond max_activation_modules=%d "
                              "are not hooked", acts.skipped, len(acts.names))
        return acts

    def _watch_timings(self, model: Any, optimizer: Any) -> None:
        from monitor_client._timings import StepTimings

        if self._timings is not None:
            self._timings.detach()
        params = [p for p in model.parameters() if p.requires_grad]
        self._timings = StepTimings(params, optimizer).attach()

    def _watch_guard(self, stats: GradStats, optimizer: Any,
                     settings: WatchSettings) -> StepGuard:
        from monitor_client._guard import StepGuard

        assert settings.guard is not None
        guard = StepGuard(stats, optimizer, settings.guard).attach()
        self.config.setdefault("guard", dataclasses.asdict(settings.guard))
        if guard.syncs:
            self._warner.warn("guard", "the step guard reads its decision on the host for "
                              "%s (a non-fused optimizer cannot skip on the device): one "
                              "device sync per step; fused=True avoids it",
                              type(optimizer).__name__)
        return guard

    def _watch_finite(self) -> None:
        """One set of forward checks over every watched model that asks for them, so the
        first non-finite output is found in forward order across models (_finite.py); the
        first such model's ``finite_flags`` says how much of each output is read."""
        from monitor_client._finite import FiniteFlags

        if self._finite is not None:
            self._finite.detach()
        self._finite = None
        for entry in self._models.entries:
            if not entry.settings.finite_flags:
                continue
            prefix = entry.name or ""
            if self._finite is None:
                full = entry.settings.finite_flags == "full"
                self._finite = FiniteFlags(entry.model, full=full, prefix=prefix)
            else:
                self._finite.add_model(entry.model, prefix)
        if self._finite is None:
            return
        self._finite.attach()
        if self._finite.skipped:
            self._warner.warn("finite", "%d leaf modules beyond the first %d get no "
                              "finite check", self._finite.skipped, len(self._finite.names))

    def _warn_preflight(self, message: str) -> None:
        self._warner.warn("preflight", "%s", message)

    def _on_host(self, record: dict[str, Any]) -> None:
        """Checks on a step's host numbers (sender thread): a batch with no label that
        counts (HF: every label -100) makes a mean loss 0/0 = NaN."""
        if record.pop("min_label_count", None) == 0:  # a client-side check, not sent
            self._warner.warn("labels", "step %s: a batch has no label that counts (every "
                              "label is -100/masked); its mean loss is 0/0 = NaN. Check the "
                              "collator's masking and the max length", record.get("step"))

    def _gpu(self, device: Any) -> Any:
        """The GPU probe (NVML on a CUDA device, or the settings' own), read every
        ``gpu_sample_interval`` s on a thread of its own (``_nvml.py``), never per step."""
        from monitor_client._nvml import GpuSampler, nvml_probe

        if self._gpu_sampler is not None:
            self._gpu_sampler.close()
            self._gpu_sampler = None
        probe = self.settings.gpu_probe
        if isinstance(probe, str) and probe == "auto":
            probe = None
            if str(device).startswith("cuda"):
                probe = nvml_probe(device.index or 0, _cuda_uuid(device))
        if probe is None:
            return None
        sampler = self._gpu_sampler = GpuSampler(probe, self.settings.gpu_sample_interval)
        sampler.start().wait_first(1.0)  # once, at watch(): the first steps carry a reading
        return sampler

    @_never_raises
    def before_optimizer_step(self) -> None:
        """Measure gradients now: frameworks whose optimizer step runs a closure, and loops
        that update their parameters by hand (``watch(model)``, no optimizer: call it where
        the update begins, after ``backward()``; the update's size is then measured too)."""
        for entry in self._models.entries:
            entry.stats.before_step()

    # -- per step ------------------------------------------------------------------------
    @_never_raises
    def log_step(self, step: int, loss: Any = None, *, tokens: float | None = None,
                 samples: float | None = None, lr: float | None = None,
                 grad_norm: float | None = None, data_time: float | None = None,
                 data_position: int | None = None, **fields: Any) -> None:
        """Record optimizer step ``step``; returns at once (nothing waits on the device).

        ``data_position``: how far the run's data is consumed once this step trained (the
        position of its last batch, counted over the whole run: ``DataStream.position``;
        filled in from the ``DataStream`` that ``timed()`` wraps). A rollback plan names
        positions, and the sidecar checks a resumed run's against it."""
        step = self._run_step(step)
        if self._trainer is None:
            self._trainer = threading.get_ident()
        if data_position is None and self._stream is not None:
            data_position = self._stream.position
        if data_position is not None:
            self._last_position = (int(step), int(data_position))
        if not self.active:
            return
        now = time.perf_counter()
        step_time, self._last_t = now - self._last_t, now
        if self._models:  # like the shared traces: step_time excludes our hooks
            step_time = max(step_time - self._models.pop_overhead(), 0.0)
        if data_time is None and self._data_time:
            data_time = self._data_time
        self._data_time = 0.0
        wait = self._timings.take() if self._timings is not None else None
        if not self._run_sent:
            self._send_run()
        plain_loss = _plain(loss)
        if isinstance(lr, list | tuple):  # scheduler.get_last_lr(): one per param group
            lr = lr[0] if lr else None
        plain_lr = (lr if _is_tensor(lr) else _plain(lr)) if lr is not None else self._lr()
        for name, given, sent in (("loss", loss, plain_loss), ("lr", lr, plain_lr)):
            if sent is None and given is not None and not _is_tensor(given):
                self._warner.warn(f"not_a_number_{name}", "log_step(%s=%r): not a number; "
                                  "the step is sent without it", name, given)
        record = {"kind": "step", "run_id": self.run_id, "step": step,
                  "time": time.time(), "rank": self.rank, "attempt": self.attempt,
                  "loss": plain_loss, "lr": plain_lr,
                  "grad_norm": grad_norm,
                  "tokens": tokens, "samples": samples, "step_time": step_time,
                  "data_time": data_time, **fields}
        if data_position is not None:
            record["data_position"] = int(data_position)
        self._last_step = step
        if isinstance(wait, float):  # host timestamps; CUDA events are the sender's to read
            split(record, wait)
            wait = None
        urgent = not (_finite(plain_loss) and _finite(grad_norm))
        self._submit(self._pending(record, loss, wait), urgent=urgent)
        if self._watchdog is not None:
            self._phase.enter("data")
            self._watchdog.beat(step)
        # An eval or a save timed from here is the user's alone: this call's own work (a
        # loaded machine stretches it) is the step's, not the checkpoint bucket's.
        self._loop_t = time.perf_counter()

    def _run_step(self, step: Any) -> int:
        """``step`` as the run counts it. Steps of one attempt go forward: one that goes back
        without a rollback (``rolled_back`` starts a new attempt) is a loop counting per
        epoch, and sending it as it is would have the sidecar drop every later epoch's
        steps as resends of the first's. The count goes on from the last step instead
        (its eval steps shifted alike), with one warning; ``rolled_back`` restarts it."""
        step = int(step) + self._step_offset
        last = self._logged
        if last is not None and step < last:
            self._warner.warn(
                "step_back", "log_step(step=%d) came after step %d: steps count optimizer "
                "steps over the whole run (not per epoch); the run's count goes on from %d, "
                "and log_eval steps are shifted alike", step - self._step_offset, last,
                last + 1)
            self._step_offset += last + 1 - step
            step = last + 1
        self._logged = step
        return step

    def _pending(self, record: dict[str, Any], loss: Any, wait: Any = None) -> PendingStep:
        # No tensor ops on this path (see StatsPack.add): the pack is read off-thread.
        models = self._models
        scale: Any = self._loss_scale() if models else None
        if not models and not any(_is_tensor(v) for v in (loss, *record.values())):
            return PendingStep(record, probes=self._probes, wait=wait)
        finite = self._finite
        if finite is not None:  # before take(): the gradients' norms are the step's
            clean = finite.holding and _known_finite(loss) and all(
                entry.stats.grads_finite() for entry in models.entries)
        pack = models.take() if models else _empty_pack()
        if finite is not None:
            finite.add_to(pack, clean)
        first = models.first
        if pack.stepped and self._preflight is not None and not self._preflight.done:
            self._preflight.after_first_step(first.optimizer if first is not None else None)
        for name, value in list(record.items()):  # device values among the extra fields
            if value is None or type(value) in _PLAIN or name == "loss":
                continue
            if _is_tensor(value):
                pack.add(name, value)
                record[name] = None
        if first is not None:
            if models.named:  # each model's own clipping and LR, under its name
                pack.notes = models.host_fields()
                for entry in models.entries:
                    self._model_lr(pack, entry)
            else:
                record["clip_threshold"] = first.stats.grad_clip
            if not pack.stepped:
                record["skipped"] = True
                if any(e.scaler is not None for e in models.entries):
                    record["skip_reason"] = "loss_scale"  # the scaler did not call step()
        # A host loss is in the record already, as log_step read it (None: not a number).
        for name, value in (("loss", loss), ("loss_scale", scale)):
            if _is_tensor(value):
                pack.add(name, value)
            elif name != "loss" and value is not None:
                record[name] = float(value)
        return PendingStep(record, pack.seal(), self._probes, wait)

    def _lr(self) -> Any:
        entries = self._models.entries
        return _lr_of(entries[0].optimizer) if entries else None

    @staticmethod
    def _model_lr(pack: Any, entry: Watched) -> None:
        lr = _lr_of(entry.optimizer)
        if _is_tensor(lr):
            pack.add("lr", lr, model=entry.name)
        elif lr is not None:
            pack.notes.setdefault(entry.name, {})["lr"] = lr

    def _loss_scale(self) -> Any:
        scaler = next((e.scaler for e in self._models.entries if e.scaler is not None), None)
        if scaler is None or not getattr(scaler, "is_enabled", lambda: True)():
            return None
        scale = getattr(scaler, "_scale", None)  # a device tensor: no sync, unlike get_scale()
        # update() changes it in place before we read it off-thread: keep this step's value.
        return scale.clone() if scale is not None else scaler.get_scale()

    def timed(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``iterable``, adding the time spent waiting on it to ``data_time``; a
        ``DataStream``'s position then goes with each ``log_step``."""
        if isinstance(iterable, DataStream):
            self._stream = iterable
            self._counting_data(iterable.skips_by)
        iterator = iter(iterable)
        while True:
            self._phase.enter("data")
            # On CUDA, events around the wait: the device's idle part of it (_timings.py).
            timings = self._timings if self._timings is not None \
                and self._timings.on_device else None
            if timings is not None:
                timings.data_began()
            start = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            self._data_time += time.perf_counter() - start
            if timings is not None:
                timings.data_ended()
            yield item

    def _counting_data(self, skips_by: str) -> None:
        """The run counts its data by position, and leaves a plan's windows out by
        ``skips_by``: "sampler" (a map-style dataset's batch sampler) or "reading" (a
        stream, read past); sent with the run record, and said in rollback pages.
        ``timed(DataStream)`` and the framework callbacks (the package's own) call it."""
        self._skips_by = skips_by if skips_by in ("sampler", "reading") else None

    @_never_raises
    def log_eval(self, step: int, val_loss: Any = None, *, train_loss: Any = None,
                 epoch: float | None = None, metrics: dict[str, Any] | None = None,
                 seconds: float | None = None) -> None:
        """Record a validation result at optimizer step ``step``.

        ``seconds``: how long the evaluation took; by default the time since this
        process's previous ``log_step``, ``log_eval`` or ``checkpoint_saved`` returned (the
        evaluation that ran in between, when called right after it, as loops do)."""
        took = self._since_loop(seconds)
        if not self.active:
            return
        self._send_run()
        record = {"kind": "eval", "run_id": self.run_id, "attempt": self.attempt,
                  "step": int(step) + self._step_offset, "time": time.time(),
                  "rank": self.rank,
                  "val_loss": _scalar(val_loss), "train_loss": _scalar(train_loss),
                  "epoch": _scalar(epoch),
                  "metrics": {str(k): _scalar(v) for k, v in (metrics or {}).items()}}
        if took is not None:
            record["seconds"] = took
        self._submit(record)
        if self._watchdog is not None:
            self._watchdog.touch()
        self._loop_t = time.perf_counter()  # see log_step's end

    def _since_loop(self, seconds: Any) -> float | None:
        """An eval's or a save's duration: ``seconds`` when given (a finite number >= 0,
        else a warning and none), else the time since the previous loop record; the loop
        clock restarts now either way."""
        now = time.perf_counter()
        since, self._loop_t = self._loop_t, now
        if seconds is None:
            return None if since is None else max(now - since, 0.0)
        try:
            value = float(seconds)
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value) or value < 0:
            self._warner.warn("seconds", "seconds=%r is not a finite number >= 0: not sent",
                              seconds)
            return None
        return value

    # -- actions back to the trainer (alert rules' actions; _control.py) ------------------
    def should_stop(self, check_every: int = 10) -> bool:
        """True once an alert rule asked this run to stop (e.g. repeated NaN), or once
        every rank held back a rollback plan that names a checkpoint no process of the job
        saved (it is never loaded, and training on would keep the fault); sticky.

        Distributed (torch.distributed initialised): every rank stops at the same call or
        none does, like ``rollback_plan()``: call it once per step on every rank, with the
        same ``check_every``; a stop some ranks honour and others not is a hung job
        (``_agreement.py``). With ``enabled=False`` it is False without a collective.
        """
        return self._control.should_stop(check_every)

    def should_checkpoint(self) -> bool:
        """True once per checkpoint request from an alert rule: save now."""
        return self._control.should_checkpoint()

    def stop_reason(self) -> str | None:
        """Why the run was asked to stop ("stop requested at step N by rule R", or a
        rollback plan it refused), or None.

        A method, like ``should_stop()``: ``if mon.should_stop(): print(mon.stop_reason())``.
        """
        return self._control.stop_reason()

    def on_action(self, callback: Any) -> None:
        """Call ``callback(action_dict)`` for each new action (on the sender thread)."""
        self._control.on_action(callback)

    def actions(self) -> list[dict[str, Any]]:
        """Every action received so far, oldest first."""
        return self._control.actions()

    # -- closing the loop: the checkpoint ledger and rollback plans (_control.py) --------
    @_never_raises
    def checkpoint_saved(self, step: int, path: str | os.PathLike[str], *,
                         bytes: int | None = None, tag: str | None = None,
                         data_position: int | None = None,
                         seconds: float | None = None) -> None:
        """Tell the sidecar the state after optimizer step ``step`` is saved at ``path``.

        The sidecar keeps a ledger of the run's checkpoints, judges each clean or suspect,
        and a rollback rule sends the run back to the last clean one, resuming the data at
        the checkpoint's ``data_position`` (default: the one logged with step ``step``).
        Call it after the save completed (a checkpoint that is not on disk must not become
        a rollback target); it returns at once and never raises. ``seconds``: how long the
        save took; by default the time since this process's previous ``log_step``,
        ``log_eval`` or ``checkpoint_saved`` returned (the save, when called right after it).
        """
        took = self._since_loop(seconds)
        if data_position is None and self._last_position is not None \
                and self._last_position[0] == int(step):
            data_position = self._last_position[1]
        if not self.active:
            return
        where = os.fspath(path)
        if not where or len(where) > CHECKPOINT_PATH_MAX or "\0" in where:
            raise ValueError(f"checkpoint path must be 1-{CHECKPOINT_PATH_MAX} characters "
                             "without NUL")
        self._control.vouch(int(step), where)  # a plan may send this process back to it
        self._send_run()
        record = {"kind": "checkpoint", "run_id": self.run_id, "rank": self.rank,
                  "attempt": self.attempt, "time": time.time(), "step": int(step),
                  "path": where, "bytes": None if bytes is None else int(bytes),
                  "tag": None if tag is None else str(tag)[:CHECKPOINT_TAG_MAX]}
        if data_position is not None:
            record["data_position"] = int(data_position)
        if took is not None:
            record["seconds"] = took
        self._submit(record)
        self._loop_t = time.perf_counter()  # see log_step's end

    @_never_raises
    def resumed_from(self, step: int, path: str | os.PathLike[str], *,
                     earlier: Any = None) -> None:
        """Say this process loaded the checkpoint of step ``step`` at ``path`` (a relaunch
        that resumed from an earlier process's save): a rollback plan may then send it back
        there too, or to one of ``earlier``, the job's saves before it (what
        ``job_checkpoints()`` returned when that checkpoint was saved: keep it in the
        checkpoint). A plan is handed out only for a checkpoint this process (distributed:
        some rank of the job) reported with ``checkpoint_saved``, resumed from, or
        inherited so; nothing is sent to the sidecar."""
        self._control.resumed_from(step, path, earlier)

    def job_checkpoints(self) -> list[list[Any]]:
        """The job's checkpoints this process may roll back to, ``[step, path]`` oldest
        first (the newest 256): the ones it reported with ``checkpoint_saved``, resumed
        from, or inherited. Save it with a checkpoint and hand it to ``resumed_from(...,
        earlier=)`` when a later process resumes from that checkpoint (the framework
        callbacks do both), so a rollback of that process may go back past its resume."""
        return self._control.job_checkpoints()

    def resume_plan(self, checkpoint_dir: str | os.PathLike[str],
                    timeout: float = 30.0) -> RollbackPlan | None:
        """Where this job resumes when the run's leader restarted it, or None; call it once
        at start, before training, on every rank (distributed: a collective).

        The plan is the restart's resume point (docs/actions.md, "Healing"): the run's last
        clean checkpoint before the fault (``checkpoint_path``, ``checkpoint_step``; the
        next step is ``resume_step``), where its data resumes (``resume_position``) and the
        windows earlier rollbacks skip (``skip``): load it and ``DataStream.seek`` as for a
        rollback plan, then ``resumed_from(plan.checkpoint_step, plan.checkpoint_path)``.
        Every rank gets the same plan or none (a rank's sidecar that has not heard of the
        restart yet is asked again, up to ``timeout`` seconds). A plan whose checkpoint is
        not inside ``checkpoint_dir`` (links resolved) is refused with a warning: a plan
        can only send the job back to its own saves. None: no restart relaunched this job
        (a first launch, or a relaunch of the launcher's own): resume as the script would.
        """
        return self._control.resume_plan(checkpoint_dir, timeout)

    def rollback_plan(self, check_every: int = 10) -> RollbackPlan | None:
        """The rollback to apply now, or None; call it once per optimizer step on every rank.

        Single process: the newest plan received and not yet applied. Distributed
        (torch.distributed initialised): every rank gets the same plan at the same call, or
        none does. Every ``check_every``-th call the ranks agree by one all_reduce of the
        newest plan id (a rank that lacks that plan fetches it, bounded); ``_rollback.py``
        says why and what it costs. ``check_every`` must be the same on every rank. A failed
        fetch is a warning (that rank says "not yet" and all look again at the next agreed
        call); a failing collective raises like the job's own would, since swallowing it on
        one rank would leave the others waiting at the next one. With ``enabled=False`` it
        is None without a collective: set it alike on every rank.
        """
        return self._control.rollback_plan(check_every)

    @_never_raises
    def rolled_back(self, plan: RollbackPlan) -> None:
        """Mark ``plan`` applied: the process reloaded its checkpoint and its next step is
        ``plan.resume_step``.

        Draws a fresh attempt token (docs/format.md, ``attempt``), so the replayed steps
        ``resume_step``, ... are a resumed attempt of the run (the earlier ones from there on
        kept as the abandoned branch), not duplicates of what was sent before. Call it on
        every rank, as ``rollback_plan()``: first each rank delivers what it logged under the
        old token (bounded by ``FETCH_TIMEOUT``), then, distributed, the ranks meet at a
        barrier. Otherwise one rank's resumed steps can reach the sidecar before another
        rank's last steps of the abandoned branch, and those would land after the resume
        settled, as if they were current.
        """
        self._control.rolled_back(plan)
        self._new_attempt(plan.checkpoint_step)

    def _new_attempt(self, step: int) -> None:
        """After a rollback to the checkpoint of ``step``: a fresh attempt token on every
        record from now on, the clocks and the step count restarted, the run record sent
        again."""
        self.attempt = new_token()
        self._attempt_notice.token = self.attempt
        if self._watchdog is not None:  # its hang reports are the new attempt's too
            self._watchdog.header["attempt"] = self.attempt
        self._last_step = step
        self._logged = None  # the new attempt's steps go back to the checkpoint's
        self._last_t, self._data_time = time.perf_counter(), 0.0
        self._loop_t = self._last_t  # an eval right after the reload times the eval alone
        self._run_sent = False  # a new attempt opens with its run record, as a relaunch does

    @property
    def _plans(self) -> PlanBook:
        """The rollback plans and vouched checkpoints (the framework callbacks hand a
        relaunch's plan file to it)."""
        return self._control.plans

    # -- lifecycle -----------------------------------------------------------------------
    def _send_hang(self, record: dict[str, Any]) -> None:
        """The watchdog's report (its own thread): urgent, it must not wait for a batch."""
        self._submit(record, urgent=True)

    def _submit(self, item: Any, urgent: bool = False) -> None:
        if self._sender is not None:  # None only while inactive, when nothing is sent
            self._sender.submit(item, urgent=urgent)

    def _send_run(self) -> None:
        if self._run_sent:
            return
        self._run_sent = True
        self._submit({"kind": "run", "run_id": self.run_id, "attempt": self.attempt,
                      "time": time.time(),
                      "rank": self.rank, "config": self.config,
                      "model": self._model_info,
                      # How many ranks send records: the sidecar waits for each of them
                      # before it names the rank that went NaN first.
                      "hardware": {**self._hardware, "reporting_ranks":
                                   1 if self.settings.rank0_only else self.world_size},
                      "labels": self._labels,
                      "watchdog": self._watchdog.declaration() if self._watchdog else None,
                      # Where this rank's node sits in a multi-node job: node 0's sidecar
                      # leads the run (one page per fault, one decision for every rank).
                      "cluster": self._placement,
                      # What runs it again on a restart (_launcher.py, _restart.py).
                      "launcher": {**self._launcher, "restarts": self._restart.enabled},
                      # Which process it is: its node's sidecar ends it if a restart
                      # finds it stopped (SIGSTOP), which cannot leave on its own.
                      "process": _process.identity(),
                      **({"data": {"skips_by": self._skips_by}} if self._skips_by else {})})

    def counters(self) -> Counters | None:
        """sent / spooled / pending / rejected / dropped counts (None when inactive)."""
        return self._sender.counters() if self._sender else None

    @_never_raises
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait up to ``timeout`` s for everything logged so far to reach the sidecar."""
        return self._sender.flush(timeout) if self._sender else True

    @_never_raises
    def close(self, status: str | None = None, error: str | None = None,
              timeout: float | None = None) -> bool:
        """Send ``end`` (completed unless an uncaught exception said otherwise) and flush.

        Waits at most ``timeout`` s (default: the Monitor's ``close_timeout``, 2 s); what
        is not acknowledged by then stays in the spool (see ``counters().pending``).
        """
        if self._closed or not self.active:
            return True
        self._closed = self._closing = True
        try:
            return self._close(status, error, timeout)
        finally:
            self._closing = False
            # Only now: a SIGTERM that came during the drain waited for it (_end_on_signal).
            self._exit_hooks.finish_term()
            self._exit_hooks.remove()

    def _end_on_signal(self) -> bool:
        """SIGTERM's close; False when a close is already sending what is queued (the
        signal interrupted it, on this thread or another): it goes on, and ends the
        process when done, rather than dying with the end record still in memory."""
        if self._closing:
            return False
        self.close()
        return True

    def _close(self, status: str | None, error: str | None, timeout: float | None) -> bool:
        status, error = (status, error) if status else self._outcome
        # "stopped" when the trainer honoured a rule's stop (_control.py)
        status, error = self._control.end_status(status, error, self._last_step)
        self._models.detach()
        for hooked in (self._finite, self._timings):
            if hooked is not None:
                hooked.detach()
        self._report_hook_errors()
        if self._gpu_sampler is not None:
            self._gpu_sampler.close()
        if self._watchdog is not None:
            self._watchdog.stop()
            self._phase.detach()
        self._send_run()
        self._submit({"kind": "end", "run_id": self.run_id, "attempt": self.attempt,
                      "step": self._last_step,
                      "time": time.time(), "rank": self.rank, "status": status,
                      "error": error})
        if self._sender is None:
            return True
        return self._sender.close(self.close_timeout if timeout is None else timeout)

    def _report_hook_errors(self) -> None:
        """How many hook calls failed in all (each failing hook was logged once, with its
        traceback, when it first failed: _hooks.py)."""
        failed = self._models.hook_errors() + sum(
            part._hooks.errors for part in (self._finite, self._timings) if part is not None)
        if failed:
            self._warner.warn("hook_errors", "%d hook calls failed during this run and were "
                              "ignored (their measurements are missing; training was not "
                              "affected)", failed)

    def _set_outcome(self, status: str, error: str | None) -> None:
        self._outcome = (status, error)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._outcome = outcome_of(exc_type, exc)
        self.close()


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


# Types a record's value has when it is a plain host value: no tensor check needed.
_PLAIN = (int, float, str, bool)


def _empty_pack() -> Any:
    from monitor_client._pack import StatsPack  # here: importing the client imports no torch

    return StatsPack()


def _lr_of(optimizer: Any) -> Any:
    """The LR of ``optimizer``'s first parameter group (None: no optimizer)."""
    if optimizer is None:
        return None
    lr = optimizer.param_groups[0].get("lr")
    if not _is_tensor(lr):
        return lr
    if lr.is_cpu:
        return float(lr)
    # A device LR (capturable optimizers): float() would be a host sync on the training
    # thread; a copy travels with the statistics instead (the scheduler changes the
    # tensor in place before the sender reads it).
    return lr.detach().clone()


def _cuda_uuid(device: Any) -> str | None:
    """The CUDA device's UUID, which names the same GPU to NVML whatever
    ``CUDA_VISIBLE_DEVICES`` renumbered (None when torch cannot say)."""
    try:
        import torch

        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        return str(uuid) if uuid is not None else None
    except Exception:  # noqa: BLE001 - then NVML is asked by index
        return None


def _known_finite(loss: Any) -> bool:
    """Whether the host knows ``loss`` finite without a device sync: a number, or a CPU
    tensor of one element (None, a device tensor: not known)."""
    if isinstance(loss, float | int):
        return math.isfinite(loss)
    if not _is_tensor(loss) or not loss.is_cpu or loss.numel() != 1:
        return False
    return math.isfinite(loss.item())


def _finite(value: Any) -> bool:
    """None (not measured) and device tensors (unknown until the sync) count as finite."""
    return not isinstance(value, float) or math.isfinite(value)


def _plain(value: Any) -> Any:
    """Numbers pass; host tensors become floats (device tensors are packed elsewhere)."""
    if value is None or isinstance(value, int | float):
        return value
    if _is_tensor(value):
        return None  # packed with the statistics, read after the one sync
    try:
        return float(value)  # a NumPy number, a Decimal, a numeric string
    except (TypeError, ValueError):
        pass
    try:  # a one-element NumPy array (``tensor.numpy()`` of a loss of shape (1,))
        return float(value.item())
    except (AttributeError, TypeError, ValueError):
        return None  # not a number: log_step says so once and sends the step without it


def _scalar(value: Any) -> float | None:
    """Eval values may be tensors: evaluation is rare, so a host sync here is fine."""
    return None if value is None else float(value)
