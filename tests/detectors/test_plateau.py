"""plateau: a loss that never improved (warning), or a val loss without a new best (info)."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, eval_rec, feed, noise, of_type, only, run, step

from monitor_agent.records.types import Severity


def test_a_run_that_never_learns_is_a_warning():
    recs = [run()] + [step(i, loss=4.59 * (1 + noise(i, 0.003))) for i in range(1, 300)]
    found = feed(only("plateau"), recs)
    assert found[0].step == 200 and found[0].severity == Severity.WARNING
    assert "not learning" in found[0].message


def test_a_flat_tail_after_progress_is_not_flagged_on_the_train_loss():
    recs = [run()] + [step(i, loss=max(4.0 * 0.99**i, 1.5) * (1 + noise(i, 0.01)))
                      for i in range(1, 800)]
    assert feed(only("plateau"), recs) == []


def test_val_without_a_new_best_for_k_evals_is_info():
    vals = [3.0, 2.5, 2.2, 2.21, 2.25, 2.22, 2.23, 2.24, 2.3]
    recs = [eval_rec(50 * (k + 1), v) for k, v in enumerate(vals)]
    found = feed(only("plateau", plateau_evals=5), recs)
    assert [(f.step, f.severity) for f in found] == [(400, Severity.INFO)]


def test_quiet_while_learning():
    recs = [run()] + [step(i, loss=4.0 * 0.998**i) for i in range(1, 1000)]
    recs += [eval_rec(100 * k, 3.0 * 0.95**k) for k in range(1, 10)]
    assert feed(only("plateau"), recs) == []


def test_restore_mid_stream_changes_nothing():
    recs = [run()] + [step(i, loss=4.59 * (1 + noise(i, 0.003))) for i in range(1, 400)]
    assert_restore_equivalent(lambda: only("plateau"), recs, cut=150)


def test_a_rising_loss_is_not_called_flat():
    # 1.69 -> 2.3 over the window used to read "flat ... (-36.1%)"; a rise is not a plateau.
    recs = [run()] + [step(i, loss=1.69 + 0.61 * i / 300) for i in range(1, 300)]
    assert feed(only("plateau"), recs) == []


def test_the_message_gives_the_change_with_its_sign_and_the_limit():
    recs = [run()] + [step(i, loss=4.59 * (1 - 0.00002 * i)) for i in range(1, 300)]
    f = feed(only("plateau"), recs)[0]
    assert "median 4.59 -> 4.57 (-0.3%, limit 1%)" in f.message


def test_after_the_lr_was_raised_it_does_not_advise_raising_it():
    from monitor_agent.detectors import plateau as tips

    recs = [run()] + [step(i, loss=4.59 * (1 + noise(i, 0.003)), lr=1e-7 if i < 150 else 1e-4)
                      for i in range(1, 300)]
    found = feed(only("plateau"), recs)
    assert found and found[0].suggestions == tips.PLATEAU_LR_RAISED
    assert found[0].evidence["lr"] == 1e-4 and found[0].evidence["lr_window_start"] == 1e-7
    plain = [run()] + [step(i, loss=4.59 * (1 + noise(i, 0.003)), lr=1e-7) for i in range(1, 300)]
    assert feed(only("plateau"), plain)[0].suggestions == tips.PLATEAU


def test_a_signed_or_nonstationary_loss_is_not_judged_flat_as_a_fraction_of_its_level():
    flat = [step(i, loss=4.6 - 0.0001 * i) for i in range(1, 260)]
    assert of_type(feed(only("plateau"), [run()] + flat), "plateau")  # the control
    assert not of_type(feed(only("plateau"), [run(loss_kind="rl")] + flat), "plateau")
    signed = [step(i, loss=-4.6 - 0.0001 * i) for i in range(1, 260)]
    assert not of_type(feed(only("plateau"), [run()] + signed), "plateau")
