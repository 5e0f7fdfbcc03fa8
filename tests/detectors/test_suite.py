"""DetectorSuite: the engine's interface: every type present, log-only, disabled types,
restore through the wire format on a real trace, robustness without a run record."""

from __future__ import annotations

import pytest
from detector_harness import TRACES, load_records
from synth_records import assert_restore_equivalent, feed, step

from monitor_agent.detectors import FINDING_TYPES, DetectorSettings, DetectorSuite
from monitor_agent.detectors.catalogue import DETECTOR_CLASSES, FORMAT_TYPES
from monitor_agent.records.types import RunRecord


def test_one_detector_class_per_finding_type():
    assert tuple(cls.type for cls in DETECTOR_CLASSES) == FINDING_TYPES
    assert FINDING_TYPES[:17] == FORMAT_TYPES and len(FORMAT_TYPES) == 17


def test_log_only_types_are_recorded_but_flagged():
    recs = [step(i) for i in range(1, 30)] + [step(30, loss=float("nan"))]
    plain = feed(DetectorSuite(), recs)
    marked = feed(DetectorSuite(DetectorSettings(log_only={"nan_inf"})), recs)
    assert [f.type for f in plain] == [f.type for f in marked] == ["nan_inf"]
    assert not plain[0].log_only and marked[0].log_only


def test_disabled_types_never_fire():
    recs = [step(i) for i in range(1, 30)] + [step(30, loss=float("nan"))]
    assert feed(DetectorSuite(DetectorSettings(disabled={"nan_inf"})), recs) == []


def test_works_without_a_run_record_and_with_missing_fields():
    recs = [step(i, loss=None, grad_norm=None, update_norm=None, step_time=None,
                 tokens_per_second=None) for i in range(1, 50)]
    assert feed(DetectorSuite(), recs) == []


def test_ema_loss_per_rank():
    suite = DetectorSuite()
    feed(suite, [step(1, loss=2.0), step(1, rank=1, loss=4.0)])
    assert (suite.ema_loss(0), suite.ema_loss(1), suite.ema_loss(7)) == (2.0, 4.0, None)


def test_restore_rejects_an_unknown_snapshot_version():
    with pytest.raises(ValueError, match="version"):
        DetectorSuite().restore({"version": 99})


@pytest.mark.skipif(not TRACES.exists(), reason="public traces not present")
@pytest.mark.parametrize("name", ["lr_too_high_gpt_sgd", "straggler_ddp_gpt", "frozen_layer_gpt"])
def test_restart_mid_trace_changes_no_finding(name: str):
    recs = load_records(TRACES / f"{name}.jsonl.gz")
    cut = {"lr_too_high_gpt_sgd": 390, "straggler_ddp_gpt": 500, "frozen_layer_gpt": 380}[name]
    assert_restore_equivalent(DetectorSuite, recs, cut=cut)


def test_layer_order_change_mid_run_keeps_slots_stable():
    from synth_records import layers

    suite = DetectorSuite()
    suite.update(RunRecord(run_id="r", model={"layer_order": ["a", "b"]}))
    suite.update(step(1, layers=layers(["b", "a"], [1.0, 2.0])))
    view = suite.ctx.align(layers(["a", "c", "b"], [1.0, 1.0, 1.0]))
    assert [suite.ctx.layer_name(int(s)) for s in view.slots] == ["a", "c", "b"]
    assert list(view.order) == [0, 2]  # c is not in layer_order: left out of depth checks
