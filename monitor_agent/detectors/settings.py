"""``DetectorSettings``: every detector's knobs in one flat model, composed from the
registry (catalogue.py's ``DETECTOR_CLASSES``).

Embedded in the sidecar's Settings as ``detectors:`` (YAML) or
``MONITOR_AGENT_DETECTORS__<FIELD>`` (env). Flat on purpose: a knob's name is the same in
YAML, env and code, whichever detector owns it, and a misspelt one is rejected by name
(``extra="forbid"``). The model subclasses every registered detector's settings model, so a
detector handed a ``DetectorSettings`` reads its own knobs through its own type
(``self.settings``), and each model's cross-field checks (e.g. ``memory_critical >=
memory_high``) come along. A detector registered in the catalogue brings its knobs here
with nothing else to edit. Thresholds are ratios to the run's own robust baselines wherever
possible, so the defaults hold across models, optimizers and scales.

Knobs are set by their flat names, shared knobs and a detector's own alike; a misspelt knob
is refused by name::

    >>> from pydantic import ValidationError
    >>> s = DetectorSettings(spike_ratio=1.5, log_only={"gain_drift"}, disabled={"plateau"})
    >>> s.spike_ratio, s.baseline_window, sorted(s.disabled)
    (1.5, 100, ['plateau'])
    >>> try:
    ...     DetectorSettings(spike_ratoi=1.5)
    ... except ValidationError as exc:
    ...     print(exc.errors()[0]["type"], exc.errors()[0]["loc"])
    extra_forbidden ('spike_ratoi',)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pydantic import create_model, field_validator

from monitor_agent.detectors.catalogue import DETECTOR_CLASSES, FINDING_TYPES
from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings


def known_types(value: set[str]) -> set[str]:
    """``disabled`` and ``log_only`` name only types the catalogue has."""
    unknown = sorted(value - set(FINDING_TYPES))
    if unknown:
        raise ValueError(f"unknown finding type(s) {unknown}; known: {', '.join(FINDING_TYPES)}")
    return value


def compose_settings(classes: Iterable[type[DetectorBase[Any]]]) -> type[SharedSettings]:
    """One flat model subclassing the ``settings_model`` of each of ``classes``: the
    ``DetectorSettings`` of ``DETECTOR_CLASSES``, and a settings model for any other set."""
    # Reversed, because pydantic orders fields by the reversed MRO: shared knobs first, then
    # each detector's in catalogue order, as YAML dumps and the schema list them.
    # SharedSettings itself is every model's base.
    models = dict.fromkeys(
        cls.settings_model for cls in reversed(tuple(classes))
        if cls.settings_model is not SharedSettings
    ) or {SharedSettings: None}
    return create_model(
        "DetectorSettings",
        __base__=tuple(models),
        __module__=__name__,
        __doc__="Every knob of the detectors; see each field's description.",
        __validators__={
            "_known_types": field_validator("disabled", "log_only")(known_types),
        },
    )


if TYPE_CHECKING:
    # What a type checker sees: the shared knobs. A detector reads its own through its
    # ``self.settings``, typed as its own model, and other code through ``knobs(<model>)``;
    # the class built below from the registry has no static form.
    class DetectorSettings(SharedSettings):
        """Every knob of the detectors; see each field's description."""
else:
    DetectorSettings = compose_settings(DETECTOR_CLASSES)
