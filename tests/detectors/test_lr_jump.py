"""lr_jump: real schedules (torch's own schedulers) are the schedule, a x10/x30/x100 jump is
not; the findings that follow while it is in force name it as their likely cause."""

from __future__ import annotations

import math

import pytest
import torch
from synth_records import assert_restore_equivalent, feed, noise, of_type, only, run, step

from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.records import wire
from monitor_agent.records.types import Severity

STEPS = 1200
BASE = 3e-4


def _lrs(make_scheduler, steps: int = STEPS, plateau_losses=None) -> list[float]:
    """The LR each step of a real torch scheduler gives (what the client reads)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE)
    sched = make_scheduler(opt)
    out = []
    for i in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        if plateau_losses is not None:
            sched.step(plateau_losses(i))
        else:
            sched.step()
    return out


def _warmup_cosine(opt):
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1e-3, total_iters=100)
    cos = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS - 100)
    return torch.optim.lr_scheduler.SequentialLR(opt, [warm, cos], milestones=[100])


SCHEDULES = {
    "warmup+cosine": lambda: _lrs(_warmup_cosine),
    "step decay x0.1": lambda: _lrs(lambda o: torch.optim.lr_scheduler.MultiStepLR(
        o, milestones=[300, 600, 900], gamma=0.1)),
    "onecycle": lambda: _lrs(lambda o: torch.optim.lr_scheduler.OneCycleLR(
        o, max_lr=1e-2, total_steps=STEPS)),
    "constant": lambda: [BASE] * STEPS,
    "reduce on plateau": lambda: _lrs(
        lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, factor=0.1, patience=20),
        plateau_losses=lambda i: 1.0 if i > 200 else 2.0 - i / 200),
    "cosine warm restarts": lambda: _lrs(
        lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=200)),
    "linear decay to 0": lambda: _lrs(lambda o: torch.optim.lr_scheduler.LinearLR(
        o, start_factor=1.0, end_factor=0.0, total_iters=STEPS)),
}


def _lr_only() -> DetectorSuite:
    """The lr_jump detector alone (and present: a quiet schedule means it judged it)."""
    suite = only("lr_jump")
    assert [d.type for d in suite.detectors] == ["lr_jump"]
    return suite


def _records(lrs: list[float]) -> list:
    return [run()] + [step(i, lr=lr, loss=2.0 + noise(i)) for i, lr in enumerate(lrs, start=1)]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_real_schedules_are_the_schedule(name):
    lrs = SCHEDULES[name]()
    assert feed(_lr_only(), _records(lrs)) == []


@pytest.mark.parametrize("name", ["warmup+cosine", "constant", "onecycle", "step decay x0.1"])
@pytest.mark.parametrize("factor", [10, 30, 100])
def test_a_jump_of_an_order_of_magnitude_or_more_is_found_and_named(name, factor):
    lrs = SCHEDULES[name]()
    at = 250  # past warmup, above every LR used before (see the ceiling rule)
    jumped = [lr * (factor if i >= at else 1) for i, lr in enumerate(lrs, start=1)]
    (f,) = feed(_lr_only(), _records(jumped))
    assert f.step == at and f.severity == Severity.WARNING
    assert f"LR x{factor} at step {at}: " in f.message
    assert "outside the run's schedule" in f.message
    assert math.isclose(f.evidence["ratio_to_previous"], jumped[at - 1] / jumped[at - 2],
                        rel_tol=1e-5)


def test_a_jump_during_declared_warmup_is_the_schedule():
    # A constant warmup LR, then the base LR, 10x (the run declares its warmup).
    lrs = [BASE / 10 if i <= 100 else BASE for i in range(1, 400)]
    recs = [run(warmup_steps=100)] + _records(lrs)[1:]
    assert feed(_lr_only(), recs) == []


def test_an_lr_that_keeps_climbing_is_reported_once():
    lrs = [BASE * (10 ** min(max(i - 299, 0), 5)) for i in range(1, 400)]  # x10 per step
    (f,) = feed(_lr_only(), _records(lrs))
    assert f.step == 300


def test_findings_that_follow_while_it_is_in_force_name_it_as_their_likely_cause():
    suite = DetectorSuite(DetectorSettings())
    recs = [run()]
    for i in range(1, 400):
        lr = BASE * (100 if i >= 300 else 1)
        loss = 2.0 + noise(i) if i < 305 else 2.0 * 1.6 ** (i - 304)
        grad = 1.0 + noise(i, 0.1) if i < 305 else 1.5 ** (i - 304)
        recs.append(step(i, lr=lr, loss=loss, grad_norm=grad))
    found = feed(suite, recs)
    (jump,) = of_type(found, "lr_jump")
    assert jump.step == 300
    pages = [f for f in found if f.type in ("divergence", "grad_explosion", "loss_spike")]
    assert pages, [f.type for f in found]
    for f in pages:
        assert f.message.endswith("; likely cause: LR x100 at step 300: 0.0003 -> 0.03, "
                                  "outside the run's schedule"), f.message
        assert next(iter(f.evidence)) == "likely_cause"


def test_a_later_fault_is_not_blamed_on_a_jump_long_undone():
    suite = DetectorSuite(DetectorSettings())
    recs = [run()]
    for i in range(1, 800):
        lr = BASE * (100 if 300 <= i < 310 else 1)
        recs.append(step(i, lr=lr, loss=float("nan") if i == 700 else 2.0 + noise(i)))
    found = feed(suite, recs)
    assert [f.step for f in of_type(found, "lr_jump")] == [300]
    (nan,) = of_type(found, "nan_inf")
    assert "likely cause" not in nan.message and "likely_cause" not in nan.evidence


def test_restore_mid_stream_changes_nothing():
    lrs = [BASE * (100 if i >= 300 else 1) for i in range(1, 400)]
    assert_restore_equivalent(_lr_only, _records(lrs), cut=200)


def test_a_fault_that_began_before_the_jump_is_not_blamed_on_it():
    """Issue 45: an onset never precedes its cause. Loss and gradient run away from step
    298; the divergence is paged at 300, the step the LR jumps, but the jump did not
    start it."""
    suite = DetectorSuite(DetectorSettings())
    recs = [run()]
    for i in range(1, 330):
        lr = BASE * (100 if i >= 300 else 1)
        loss = 2.0 + noise(i) if i < 298 else 2.0 * 1.6 ** (i - 297)
        grad = 1.0 + noise(i, 0.1) if i < 298 else 1.5 ** (i - 297)
        recs.append(step(i, lr=lr, loss=loss, grad_norm=grad))
    found = feed(suite, recs)
    (jump,) = of_type(found, "lr_jump")
    runaway = [f for f in of_type(found, "divergence")
               if f.step >= jump.step and f.evidence.get("onset_step", f.step) < jump.step]
    assert runaway, [(f.step, f.evidence) for f in of_type(found, "divergence")]
    for f in runaway:
        assert "likely cause" not in f.message and "likely_cause" not in f.evidence, f.message


def _gan(g_lr, d_lr=lambda i: 2e-4, until: int = 400, runaway_from: int = 10**9) -> list:
    """A GAN watched as two named models, D first (docs/client.md "several models"): the
    record's ``lr`` is D's, each model's own LR is in ``models.<name>.lr``."""
    recs = [run()]
    for i in range(1, until):
        far = i >= runaway_from
        loss = 2.0 * 1.6 ** (i - runaway_from + 1) if far else 2.0 + noise(i)
        grad = 1.5 ** (i - runaway_from + 1) if far else 1.0 + noise(i, 0.1)
        models = {"D": {"lr": d_lr(i), "grad_norm": 0.5}, "G": {"lr": g_lr(i), "grad_norm": 0.5}}
        recs.append(step(i, lr=d_lr(i), loss=loss, grad_norm=grad, models=models))
    return recs


def test_a_jump_of_the_second_models_lr_is_found_and_names_it():
    """Stranger report 2, problem 5: G's LR x100 at step 200 was invisible (only ``lr``,
    D's, was read)."""
    (f,) = feed(_lr_only(), _gan(lambda i: 2e-4 * (100 if i >= 200 else 1)))
    assert f.step == 200 and f.evidence["model"] == "G"
    assert f.message.startswith("LR of G x100 at step 200: 0.0002 -> 0.02, outside G's "
                                "schedule"), f.message


def test_the_first_models_jump_is_reported_once_under_its_name():
    # D's LR is both the record's lr and models.D.lr: one series, judged once
    (f,) = feed(_lr_only(), _gan(lambda i: 2e-4, d_lr=lambda i: 2e-4 * (100 if i >= 200 else 1)))
    assert f.step == 200 and f.message.startswith("LR of D x100 at step 200")


def test_each_model_has_its_own_schedule():
    # G decays tenfold at 200 while D stays constant: each model's drop is its own schedule,
    # and D's LR 10x G's is no jump of either
    assert feed(_lr_only(), _gan(lambda i: 2e-5 if i >= 200 else 2e-4,
                                 d_lr=lambda i: 2e-3)) == []


def test_pages_after_the_second_models_jump_name_it_as_their_likely_cause():
    found = feed(DetectorSuite(DetectorSettings()),
                 _gan(lambda i: 2e-4 * (100 if i >= 200 else 1), runaway_from=205))
    (jump,) = of_type(found, "lr_jump")
    assert jump.step == 200
    pages = [f for f in found if f.type in ("divergence", "grad_explosion")]
    assert pages, [f.type for f in found]
    for f in pages:
        assert f.message.endswith("; likely cause: LR of G x100 at step 200: 0.0002 -> 0.02, "
                                  "outside G's schedule"), f.message
        assert next(iter(f.evidence)) == "likely_cause"


def test_restore_mid_stream_changes_nothing_for_several_models():
    assert_restore_equivalent(_lr_only, _gan(lambda i: 2e-4 * (100 if i >= 300 else 1)),
                              cut=200)


def test_a_snapshot_from_before_models_were_judged_apart_restores_the_runs_series():
    """A sidecar upgraded mid-run holds each rank's one LR series flat in its snapshot: it
    comes back as the run's series, so a jump 5 steps after the restart is still judged
    against the history from before it (a fresh series would need MIN_READINGS first)."""
    lrs = [BASE * (100 if i >= 300 else 1) for i in range(1, 400)]
    recs = _records(lrs)
    first = _lr_only()
    feed(first, recs[:295])
    state = wire.loads(wire.dumps(first.snapshot()))
    det = state["detectors"]["lr_jump"]
    det["ranks"] = {r: s["series"][""] for r, s in det["ranks"].items()}  # the old shape
    restored = _lr_only()
    restored.restore(state)
    (f,) = feed(restored, recs[295:])
    assert f.step == 300 and f.message.startswith("LR x100 at step 300")
