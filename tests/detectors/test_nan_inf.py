"""nan_inf: the first non-finite value pages, with a suggestion that fits what preceded it."""

from __future__ import annotations

import math

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
from monitor_agent.records.types import EndRecord, RunRecord, Severity

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
