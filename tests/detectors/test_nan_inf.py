"""nan_inf: the first non-finite value pages, with a suggestion that fits what preceded it."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from synth_records import (
    assert_restore_equivalent,
    feed,
    grad_table,
    layers,
    names,
    only,
    run,
    step,
)

from monitor_agent.detectors import nan_inf as tips
from monitor_agent.records import wire
from monitor_agent.records.types import EndRecord, Finding, RunRecord, Severity, StepRecord

NAN, INF = math.nan, math.inf


def test_nan_after_healthy_steps_is_critical_and_points_at_the_batch():
    recs = [run()] + [step(i) for i in range(1, 50)] + [step(50, loss=NAN, grad_norm=NAN)]
    found = feed(only("nan_inf"), recs)
    assert [(f.type, f.step, f.severity) for f in found] == [("nan_inf", 50, Severity.CRITICAL)]
    assert found[0].suggestions == tips.NAN_SUDDEN
    assert "loss is nan" in found[0].message


def test_nan_at_the_start_points_at_the_data():
    found = feed(only("nan_inf"), [run(), step(1), step(2, loss=NAN)])
    assert found[0].step == 2 and found[0].suggestions == tips.NAN_AT_START


def test_nan_after_climbing_grad_norm_points_at_the_learning_rate():
    recs = [step(i) for i in range(1, 40)]
    recs += [step(40 + k, grad_norm=10.0 ** (k + 1)) for k in range(3)]
    recs.append(step(43, loss=NAN, grad_norm=INF))
    found = feed(only("nan_inf"), recs)
    assert found[0].suggestions == tips.NAN_AFTER_GROWTH


def test_amp_overflow_step_is_not_a_fault():
    recs = [step(i, loss_scale=65536.0) for i in range(1, 30)]
    recs.append(step(30, loss_scale=65536.0, grad_norm=INF, skipped=True))
    recs.append(step(31, loss_scale=32768.0, grad_norm=NAN))  # skipped flag absent, loss fine
    assert feed(only("nan_inf"), recs) == []


def test_a_non_finite_layer_statistic_names_the_layer():
    n = names(4)
    recs = [step(i, layers=layers(n, [1, 1, 1, 1])) for i in range(1, 10)]
    recs.append(step(10, layers=layers(n, [1, NAN, NAN, 1])))
    found = feed(only("nan_inf"), [run(layer_order=n)] + recs)
    # Backward order: the output side first (a backward NaN leaves it finite).
    assert [(f.step, f.layer) for f in found] == [(10, "layers.2.weight")]
    assert found[0].evidence["non_finite_layers"] == 2


def test_a_persisting_nan_is_repeated_every_n_steps_not_every_step():
    recs = [step(i) for i in range(1, 20)] + [step(i, loss=NAN) for i in range(20, 260)]
    found = feed(only("nan_inf", repeat_every_steps=100), recs)
    # 22: still NaN nan_persist_steps (3) steps in a row, what a stop rule waits for.
    assert [f.step for f in found] == [20, 22, 120, 220]
    assert [f.evidence["consecutive_steps"] for f in found] == [1, 3, 101, 201]


def test_one_bad_step_that_recovers_is_reported_once():
    recs = [step(i) for i in range(1, 20)] + [step(20, loss=NAN), step(21, loss=NAN)]
    recs += [step(i) for i in range(22, 30)] + [step(30, loss=NAN)]
    found = feed(only("nan_inf", repeat_every_steps=100), recs)
    assert [f.step for f in found] == [20]  # never 3 in a row; 30 is inside the repeat


def test_nan_val_loss_is_reported():
    from synth_records import eval_rec

    found = feed(only("nan_inf"), [step(1), eval_rec(1, NAN)])
    assert len(found) == 1 and found[0].severity == Severity.CRITICAL


def test_quiet_on_finite_values():
    assert feed(only("nan_inf"), [run()] + [step(i) for i in range(1, 300)]) == []


def test_restore_mid_stream_changes_nothing():
    recs = [step(i) for i in range(1, 60)] + [step(i, loss=NAN) for i in range(60, 250)]
    assert_restore_equivalent(lambda: only("nan_inf"), recs, cut=100)


def test_a_forward_nan_names_the_first_module_whose_output_went_non_finite():
    n = names(4)
    recs = [run(layer_order=n)] + [step(i) for i in range(1, 20)]
    recs.append(step(20, loss=NAN, grad_norm=NAN, nonfinite_modules=("blocks.1.mlp", "head"),
                     nonfinite_module_count=2,
                     grad_norms=grad_table(n, [NAN] * 4)))
    (f,) = feed(only("nan_inf"), recs)
    assert f.evidence["pass"] == "forward" and f.evidence["origin"] == "blocks.1.mlp"
    assert "forward pass: the output of blocks.1.mlp went non-finite first" in f.message
    assert f.evidence["non_finite_layers"] == 4


def test_a_nan_made_in_the_loss_says_every_module_output_was_finite():
    n = names(4)
    recs = [run(layer_order=n)] + [step(i) for i in range(1, 20)]
    # The client checked every module output (count 0): all finite, the loss is not.
    recs.append(step(20, loss=NAN, grad_norm=NAN, nonfinite_module_count=0,
                     grad_norms=grad_table(n, [NAN] * 4)))
    (f,) = feed(only("nan_inf"), recs)
    assert f.evidence["pass"] == "loss" and f.evidence["origin"] == "loss"
    assert ("every module output finite; the loss is not: the NaN is made in the loss "
            "computation") in f.message
    assert "not reported" not in f.message and f.evidence["first_layer"] is None
    # Only a step that carries no module check at all says none was reported.
    recs[-1] = step(20, loss=NAN, grad_norm=NAN, grad_norms=grad_table(n, [NAN] * 4))
    (f,) = feed(only("nan_inf"), recs)
    assert f.evidence["pass"] == "forward" and "checks were not reported" in f.message


def test_after_a_sampled_check_the_loss_is_not_said_to_be_the_only_place_left():
    n = names(4)
    recs = [run(layer_order=n)] + [step(i) for i in range(1, 20)]
    # The client's default check read each row's first features: a value confined to other
    # features of the last output is not excluded, and the finding says so.
    recs.append(step(20, loss=NAN, grad_norm=NAN, nonfinite_module_count=0,
                     nonfinite_check="sampled", grad_norms=grad_table(n, [NAN] * 4)))
    (f,) = feed(only("nan_inf"), recs)
    assert f.evidence["pass"] == "loss" and f.evidence["origin"] == "loss"
    assert "every module output finite where sampled" in f.message
    assert "unsampled features of the last module's output" in f.message
    assert "every module output finite;" not in f.message


def test_a_backward_nan_names_the_output_side_parameter_and_how_many():
    n = names(4)  # input -> output
    recs = [run(layer_order=n)] + [step(i) for i in range(1, 20)]
    recs.append(step(20, grad_norm=NAN, grad_norms=grad_table(n, [NAN, NAN, NAN, 0.5])))
    (f,) = feed(only("nan_inf"), recs)
    assert f.evidence["pass"] == "backward" and f.evidence["origin"] == n[2]
    assert f.evidence["non_finite_layers"] == 3
    assert f"backward pass (loss finite): 3 of 4 parameter(s) non-finite, first on the " \
           f"output side {n[2]}" in f.message


def test_a_skipped_amp_step_keeps_its_origin_for_the_next_finding():
    n = names(3)
    recs = [run(layer_order=n)] + [step(i, loss_scale=1024.0) for i in range(1, 20)]
    recs.append(step(20, loss_scale=1024.0, grad_norm=INF, skipped=True,
                     grad_norms=grad_table(n, [INF, INF, 1.0])))
    recs.append(step(21, loss=NAN, loss_scale=512.0))
    (f,) = feed(only("nan_inf"), recs)
    assert f.step == 21 and f.evidence["last_overflow_origin"] == n[1]


def test_preview_is_the_finding_update_would_give_and_changes_nothing():
    """The preview route's rule (a NaN step ahead of its backlog) is the detector's own."""
    from monitor_agent.records import wire

    recs = [run()] + [step(i) for i in range(1, 40)]
    recs += [step(40 + k, grad_norm=10.0 ** (k + 1)) for k in range(3)]
    suite = only("nan_inf")
    feed(suite, recs)
    before = wire.dumps(suite.snapshot())
    nan = step(43, loss=NAN, grad_norm=INF)
    [previewed] = suite.preview(nan)
    assert wire.dumps(suite.snapshot()) == before  # no state changed
    assert suite.preview(nan) == [previewed]  # and so it can be asked again
    [found] = suite.update(nan)
    assert previewed.to_dict() == found.to_dict()
    assert found.suggestions == tips.NAN_AFTER_GROWTH


def test_a_previewed_backward_nan_names_the_same_parameter_as_the_in_order_finding():
    n = names(4)
    suite = only("nan_inf")
    feed(suite, [run(layer_order=n)] + [step(i) for i in range(1, 20)])
    nan = step(20, grad_norm=NAN, grad_norms=grad_table(n, [NAN, NAN, NAN, 0.5]))
    [previewed] = suite.preview(nan)
    assert previewed.message == ("grad_norm is nan; backward pass (loss finite): 3 of 4 "
                                 "parameter(s) non-finite, first on the output side "
                                 "layers.2.weight at step 20")
    assert previewed.to_dict() == suite.update(nan)[0].to_dict()


def test_preview_skips_finite_steps_amp_overflows_and_layer_only_nans():
    suite = only("nan_inf")
    feed(suite, [run(), step(1)])
    assert suite.preview(step(2)) == []
    assert suite.preview(step(2, loss_scale=65536.0, grad_norm=INF)) == []
    assert suite.preview(step(2, loss_scale=65536.0, grad_norm=NAN, skipped=True)) == []
    table = layers(names(3), grad=[1.0, NAN, 1.0])
    assert suite.preview(step(2, layers=table)) == []
    assert [f.step for f in suite.preview(step(2, loss=INF, skipped=True))] == [2]
    disabled = only("loss_spike")
    assert disabled.preview(step(2, loss=NAN)) == []


# -- several ranks: which one broke first ------------------------------------------------


def _ddp_nan(ranks: int = 4, bad: int = 2, at: int = 50, n: int = 56, silent: int | None = None,
             late_first: bool = True) -> list:
    """A DDP run: rank ``bad``'s local loss goes NaN at ``at``; every rank's reduced
    gradient is NaN at that step, and every loss from the next one. The culprit's records
    arrive last at each step (``late_first``); ``silent`` stops sending before ``at``."""
    recs: list = [RunRecord(run_id="r", time=0.0, rank=r, hardware={"reporting_ranks": ranks},
                            labels={"hostname": f"pod-{r}", "node": f"gpu-node-{r}"})
                  for r in range(ranks)]
    order = sorted(range(ranks), key=lambda r: (r == bad) if late_first else -(r == bad))
    for i in range(1, n):
        for r in order:
            if r == silent and i >= at:
                continue
            if i < at:
                recs.append(step(i, rank=r))
            elif i == at:
                recs.append(step(i, rank=r, loss=NAN if r == bad else 2.0, grad_norm=NAN))
            else:
                recs.append(step(i, rank=r, loss=NAN, grad_norm=NAN))
    return recs


def test_the_rank_that_broke_first_is_named_once_for_the_run():
    found = feed(only("nan_inf"), _ddp_nan())
    first = found[0]
    assert (first.step, first.rank) == (50, 2)
    assert first.evidence["first_rank"] == 2 and first.evidence["first_host"] == "gpu-node-2"
    assert first.evidence["followed"] == "0, 1, 3"
    assert first.message.startswith(
        "NaN first on rank 2 (host gpu-node-2) at step 50: its local loss is nan; ranks 0, 1, "
        "3 followed at step 50 through the gradient all-reduce (their loss finite, grad_norm "
        "nan)")
    assert first.suggestions[0].startswith("Inspect rank 2's batch")
    # One episode: the onset, then the persistence milestone, both from the first rank.
    assert [(f.step, f.rank) for f in found] == [(50, 2), (52, 2)]


def test_the_order_records_arrive_in_does_not_change_the_answer():
    found = feed(only("nan_inf"), _ddp_nan(late_first=False))
    assert (found[0].step, found[0].rank, found[0].evidence["first_rank"]) == (50, 2, 2)


def test_a_rank_that_is_behind_in_delivery_is_waited_for_however_far_behind():
    recs = _ddp_nan()
    culprit = [r for r in recs if r.kind == "step" and r.rank == 2 and r.step >= 45]
    ahead = [r for r in recs if r not in culprit]  # rank 2's last batch arrives last
    suite = only("nan_inf")
    assert feed(suite, ahead) == []
    found = feed(suite, culprit)
    assert (found[0].step, found[0].rank, found[0].evidence["followed"]) == (50, 2, "0, 1, 3")


def test_the_first_ranks_milestone_that_arrived_before_the_decision_is_kept():
    # Rank 2 sends steps 50-55 (its persistence milestone at 52) before the others' 50.
    recs = _ddp_nan()
    late = [r for r in recs if r.kind == "step" and r.rank != 2 and r.step >= 50]
    suite = only("nan_inf")
    assert feed(suite, [r for r in recs if r not in late]) == []
    assert [(f.step, f.rank) for f in feed(suite, late)] == [(50, 2), (52, 2)]


def test_a_rank_not_heard_from_at_all_yet_is_waited_for_in_the_runs_first_seconds():
    # NaN at step 5, 2 s into the run: rank 2's client's first batch (run record and all)
    # is still lingering, and the other ranks' run records say four ranks report.
    recs = _ddp_nan(at=5, n=9)
    culprit = [r for r in recs if r.rank == 2]
    suite = only("nan_inf")
    assert feed(suite, [r for r in recs if r.rank != 2]) == []
    found = feed(suite, culprit)
    assert (found[0].step, found[0].rank, found[0].evidence["followed"]) == (5, 2, "0, 1, 3")


def test_ranks_never_heard_from_later_report_elsewhere_and_are_not_waited_for():
    # One sidecar per node: this one sees rank 1 only, of the two the run records count.
    recs = [rec for rec in _ddp_nan(ranks=2, bad=1) if rec.rank == 1]
    found = feed(only("nan_inf"), recs)
    assert (found[0].step, found[0].rank) == (50, 1)
    assert found[0].message.startswith("loss is nan")  # as a single rank's, at once


def test_a_rank_gone_silent_is_decided_by_its_end_record_or_the_clock():
    recs = _ddp_nan(silent=3)
    suite = only("nan_inf")
    assert feed(suite, recs) == []  # rank 3 may still send its step 50
    assert suite.tick(recs[-1].time + 1.0) == []
    [found] = suite.tick(recs[-1].time + 6.0)
    assert found.rank == 2 and "rank 3 not heard from since (step 49)" in found.message
    suite = only("nan_inf")
    feed(suite, recs)
    [found] = suite.update(EndRecord(run_id="r", step=49, time=recs[-1].time, rank=3,
                                     status="failed"))
    assert found.rank == 2 and found.evidence["followed"] == "0, 1"


def test_every_rank_broken_at_once_is_a_shared_cause():
    recs = [step(i, rank=r) for i in range(1, 50) for r in range(3)]
    recs += [step(i, rank=r, loss=NAN, grad_norm=NAN) for i in range(50, 53) for r in range(3)]
    found = feed(only("nan_inf"), recs)
    assert found[0].evidence["first_rank"] is None
    assert found[0].message.startswith("NaN at step 50 in every rank's local loss at once")


def test_restore_while_the_first_rank_is_undecided_changes_nothing():
    recs = _ddp_nan()
    cut = next(k for k, r in enumerate(recs) if r.kind == "step" and r.step == 50) + 1
    assert_restore_equivalent(lambda: only("nan_inf"), recs, cut=cut)
    # The held finding and the breaks come back: the restored suite still names rank 2.
    first = only("nan_inf")
    assert feed(first, recs[:cut]) == []
    restored = only("nan_inf")
    restored.restore(wire.loads(wire.dumps(first.snapshot())))
    assert feed(restored, recs[cut:])[0].evidence["first_rank"] == 2


# -- what the page says, case by case (issue 51: each clause a user reads) -----------------


def _one(last: StepRecord, n: int = 4) -> Finding:
    """The single finding of a healthy 19-step run whose step 20 is ``last``."""
    recs = [run(layer_order=names(n))] + [step(i) for i in range(1, 20)] + [last]
    (f,) = feed(only("nan_inf"), recs)
    return f


def test_a_forward_nan_in_one_module_says_so_without_a_count():
    f = _one(step(20, loss=NAN, nonfinite_modules=("blocks.0.attn",), nonfinite_module_count=1))
    assert f.message == ("loss is nan; forward pass: the output of blocks.0.attn went "
                         "non-finite first at step 20")
    assert f.evidence["non_finite_modules"] == 1 and f.value is not None and math.isnan(f.value)


def test_a_forward_nan_in_several_modules_counts_them():
    f = _one(step(20, loss=NAN, nonfinite_modules=("a", "b"), nonfinite_module_count=2))
    assert f.message == ("loss is nan; forward pass: the output of a went non-finite first, "
                         "2 module outputs non-finite in all at step 20")


def test_a_module_output_gone_non_finite_under_a_finite_loss_is_still_the_forward_pass():
    # A masked or clamped output can leave the loss finite while its gradients are NaN.
    f = _one(step(20, grad_norm=NAN, nonfinite_modules=("h.1.mlp",), nonfinite_module_count=1))
    assert (f.evidence["pass"], f.evidence["origin"]) == ("forward", "h.1.mlp")
    assert f.message == ("grad_norm is nan; forward pass: the output of h.1.mlp went "
                         "non-finite first at step 20")
    assert f.value is not None and math.isnan(f.value)  # the grad norm: the loss was finite


def test_a_forward_nan_with_every_gradient_non_finite_and_no_module_check_reported():
    n = names(4)
    f = _one(step(20, loss=NAN, grad_norm=NAN, grad_norms=grad_table(n, [NAN] * 4)))
    assert f.message == ("loss is nan; grad_norm is nan; 4 parameter gradient(s) non-finite "
                         "(a forward NaN reaches every gradient; per-module output checks were "
                         "not reported) at step 20")
    assert f.evidence == {"pass": "forward", "origin": None,
                          "non_finite_fields": "loss,grad_norm", "non_finite_modules": None,
                          "non_finite_layers": 4, "parameters_measured": 4,
                          "consecutive_steps": 1, "first_layer": None,
                          "grad_norm_growth": f.evidence["grad_norm_growth"]}
    assert f.layer is None  # backward order says nothing when the forward pass broke them all


def test_a_nan_loss_with_nothing_else_reported_says_only_that():
    f = _one(step(20, loss=NAN))
    assert f.message == "loss is nan at step 20"
    assert (f.evidence["pass"], f.evidence["origin"], f.evidence["parameters_measured"]) == (
        "forward", None, None)


def test_a_fully_checked_loss_nan_names_the_loss_computation_and_nothing_unsampled():
    f = _one(step(20, loss=NAN, nonfinite_module_count=0, nonfinite_check="full"))
    assert f.message == ("loss is nan; every module output finite; the loss is not: the NaN "
                         "is made in the loss computation (check log/div/softmax of the "
                         "targets) at step 20")


def test_a_sampled_check_names_the_features_it_did_not_read():
    f = _one(step(20, loss=NAN, nonfinite_module_count=0, nonfinite_check="sampled"))
    assert f.message == (
        "loss is nan; every module output finite where sampled (each row's first features); "
        "the loss is not: the NaN is made in the loss computation (check log/div/softmax of "
        "the targets) or in unsampled features of the last module's output (WatchSettings("
        "finite_flags=\"full\") reads every element) at step 20")


def test_a_non_finite_parameter_norm_names_the_parameter_but_pages_the_run():
    n = names(4)
    last = step(20, param_norm=NAN, layers=layers(n, [1, 1, 1, 1], param=[1, NAN, 1, 1]))
    f = _one(last)
    assert f.message == ("param_norm is nan; 1 of 4 parameter(s) non-finite, first on the "
                         "output side layers.1.weight at step 20")
    assert f.evidence == {"pass": "parameter", "origin": "layers.1.weight",
                          "non_finite_fields": "param_norm", "non_finite_modules": None,
                          "non_finite_layers": 1, "parameters_measured": 4,
                          "consecutive_steps": 1, "first_layer": "layers.1.weight",
                          "grad_norm_growth": f.evidence["grad_norm_growth"]}
    # A global field is non-finite: the alert is the run's, not one layer's.
    assert f.layer is None and f.value == pytest.approx(last.grad_norm, rel=1e-4)


def test_a_non_finite_global_field_with_no_per_parameter_table_says_which_field():
    f = _one(step(20, param_norm=INF))
    assert (f.message, f.evidence["pass"], f.evidence["origin"]) == (
        "param_norm is inf at step 20", "parameter", None)
    f = _one(step(20, grad_norm=INF))
    assert (f.message, f.evidence["pass"], f.value) == ("grad_norm is inf at step 20",
                                                         "backward", INF)


def test_a_backward_nan_in_layer_statistics_alone_is_the_layers_alert():
    n = names(4)
    f = _one(step(20, layers=layers(n, [1, NAN, NAN, 1])))
    assert f.message == ("backward pass (loss finite): 2 of 4 parameter(s) non-finite, first "
                         "on the output side layers.2.weight at step 20")
    assert (f.evidence["pass"], f.evidence["first_layer"], f.layer) == (
        "backward", "layers.2.weight", "layers.2.weight")


def test_a_backward_nan_names_the_first_on_the_output_side_not_the_second():
    n = names(4)
    f = _one(step(20, grad_norm=NAN, grad_norms=grad_table(n, [NAN, NAN, NAN, 0.5])))
    assert (f.evidence["first_layer"], f.evidence["non_finite_fields"]) == (n[2], "grad_norm")


def test_an_overflow_step_whose_loss_is_nan_too_still_counts_its_gradients():
    # The scaler skipped the step, but the loss itself went NaN: that is a fault, and the
    # non-finite gradients of that step are part of what the page says.
    n = names(3)
    recs = [run(layer_order=n)] + [step(i, loss_scale=1024.0) for i in range(1, 20)]
    recs.append(step(20, loss=NAN, loss_scale=1024.0, grad_norm=INF, skipped=True,
                     grad_norms=grad_table(n, [INF, INF, 1.0])))
    (f,) = feed(only("nan_inf"), recs)
    assert f.message == ("loss is nan; 2 parameter gradient(s) non-finite (a forward NaN "
                         "reaches every gradient; per-module output checks were not "
                         "reported) at step 20")
    assert f.evidence["non_finite_layers"] == 2


def test_a_nan_val_loss_pages_with_its_value_and_a_finite_one_is_quiet():
    from synth_records import eval_rec

    recs = [step(i) for i in range(1, 30)] + [eval_rec(i, 2.0) for i in (10, 20)]
    suite = only("nan_inf")
    assert feed(suite, recs) == []
    (f,) = feed(suite, [eval_rec(30, NAN)])
    assert f.message == "val_loss is nan at step 30"
    assert math.isnan(f.value) and f.suggestions == tips.NAN_SUDDEN


# -- the suggestion: did the gradient norm climb before the NaN? ----------------------------


def _nan_after(grads: Sequence[float | None]) -> tuple[str, ...]:
    """The suggestions for a NaN loss after steps with these grad norms (None: not sent),
    past min_history_steps so that the start of the run is not what is suggested."""
    recs = [run()] + [step(i, grad_norm=g) for i, g in enumerate(grads, 1)]
    recs.append(step(len(grads) + 1, loss=NAN, grad_norm=NAN))
    (f,) = feed(only("nan_inf"), recs)
    return f.suggestions


def test_a_large_but_steady_gradient_norm_is_no_climb():
    assert _nan_after([100.0] * 40) == tips.NAN_SUDDEN


def test_a_climb_from_small_gradient_norms_is_a_climb():
    assert _nan_after([0.1] * 37 + [0.5] * 3) == tips.NAN_AFTER_GROWTH


def test_a_gradient_norm_up_three_and_a_half_times_is_a_climb():
    assert _nan_after([1.0] * 37 + [3.5] * 3) == tips.NAN_AFTER_GROWTH


def test_a_spike_that_recovered_before_the_last_three_steps_is_no_climb():
    assert _nan_after([1.0] * 36 + [50.0] + [1.0] * 3) == tips.NAN_SUDDEN


def test_a_slow_drift_across_the_window_is_no_climb():
    # 1 -> 10 over 59 steps: the last steps stand under 2x the window's median.
    assert _nan_after([1.0 + 9.0 * i / 59 for i in range(1, 60)]) == tips.NAN_SUDDEN


def test_five_gradient_norms_are_enough_to_see_a_climb():
    assert _nan_after([None] * 25 + [1.0, 1.0, 5.0, 5.0, 5.0]) == tips.NAN_AFTER_GROWTH
    # and the climb is measured from the median of all the ones before the last three
    assert _nan_after([None] * 25 + [1.0, 5.0, 6.0, 6.0, 6.0]) == tips.NAN_SUDDEN


def test_zero_gradient_norms_and_amp_overflows_stay_out_of_the_climb():
    assert _nan_after([0.0] * 10 + [1.0] * 30) == tips.NAN_SUDDEN  # frozen, then training
    recs = [run()] + [step(i, loss_scale=1024.0, grad_norm=INF if i % 5 == 0 else 1.0,
                           skipped=i % 5 == 0) for i in range(1, 40)]
    recs.append(step(40, loss=NAN, loss_scale=1024.0))
    (f,) = feed(only("nan_inf"), recs)
    assert f.suggestions == tips.NAN_FP16 + tips.NAN_SUDDEN  # an overflow is no climb


def test_the_first_min_history_steps_point_at_the_data():
    def first(k: int) -> tuple[str, ...]:
        recs = [run()] + [step(i) for i in range(1, k)] + [step(k, loss=NAN)]
        return feed(only("nan_inf"), recs)[0].suggestions

    assert first(20) == tips.NAN_AT_START and first(21) == tips.NAN_SUDDEN


# -- several ranks: the episode, its end, and a restart in the middle of it -----------------


def test_the_first_ranks_own_words_come_after_the_attribution():
    (first, _) = feed(only("nan_inf"), _ddp_nan())
    assert first.message.endswith("loss is nan; grad_norm is nan at step 50")
    assert first.evidence["pass"] == "forward" and first.value != first.value  # the loss


def test_two_ranks_are_attributed_too():
    found = feed(only("nan_inf"), _ddp_nan(ranks=2, bad=1))
    assert found[0].rank == 1 and found[0].message.startswith("NaN first on rank 1")


def _two_episodes(ranks: int = 3, more: int = 2) -> list:
    """Rank 2 breaks first at step 50 (every rank NaN the ``more`` steps after), then all
    recover; rank 1 breaks first at step 80 (the same), then all recover."""
    recs: list = [RunRecord(run_id="r", time=0.0, rank=r, hardware={"reporting_ranks": ranks})
                  for r in range(ranks)]
    for i in range(1, 90):
        for r in range(ranks):
            culprit = 2 if i < 65 else 1
            onset = 50 if i < 65 else 80
            if i == onset:
                recs.append(step(i, rank=r, loss=NAN if r == culprit else 2.0, grad_norm=NAN))
            elif onset < i <= onset + more:
                recs.append(step(i, rank=r, loss=NAN, grad_norm=NAN))
            else:
                recs.append(step(i, rank=r))
    return recs


@pytest.mark.parametrize("more", [0, 2])
def test_a_second_episode_after_every_rank_recovered_names_its_own_first_rank(more):
    # repeat_every_steps 20: the second onset is not inside the first one's repeat window;
    # more=2 reaches the persistence milestone (3 steps in a row), more=0 is one step
    found = feed(only("nan_inf", repeat_every_steps=20), _two_episodes(more=more))
    milestones = more + 1 >= 3
    assert [(f.step, f.rank, f.evidence.get("first_rank")) for f in found] == [
        (50, 2, 2), *[(52, 2, None)] * milestones, (80, 1, 1), *[(82, 1, None)] * milestones]
    assert found[1 + milestones].message.startswith("NaN first on rank 1")


def test_a_restart_mid_episode_still_ends_it_and_judges_the_next():
    recs = _two_episodes()
    cut = next(k for k, r in enumerate(recs) if r.kind == "step" and r.step == 51)
    assert_restore_equivalent(lambda: only("nan_inf", repeat_every_steps=20), recs, cut=cut)


def test_a_restart_keeps_the_first_ranks_held_finding():
    recs = _ddp_nan(late_first=False)  # the culprit's step 50 arrives first and is held
    cut = next(k for k, r in enumerate(recs) if r.kind == "step" and r.step == 50) + 1
    assert_restore_equivalent(lambda: only("nan_inf"), recs, cut=cut)


def test_a_restart_keeps_the_first_ranks_milestone_that_arrived_before_the_decision():
    recs = _ddp_nan()
    late = [r for r in recs if r.kind == "step" and r.rank != 2 and r.step >= 50]
    early = [r for r in recs if r not in late]
    assert_restore_equivalent(lambda: only("nan_inf"), early + late, cut=len(early))


def test_a_restart_keeps_the_clock_of_a_rank_gone_silent():
    recs = _ddp_nan(silent=3)
    cut = next(k for k, r in enumerate(recs) if r.kind == "step" and r.step == 51)
    assert_restore_equivalent(lambda: only("nan_inf"), recs, cut=cut,
                              final_tick=recs[-1].time + 6.0)


def test_the_clock_decides_at_exactly_the_wait():
    recs = _ddp_nan(silent=3)
    suite = only("nan_inf")
    feed(suite, recs)
    opened = next(r.time for r in recs if r.kind == "step" and r.step == 50)
    [found] = suite.tick(opened + 5.0)
    assert found.rank == 2

