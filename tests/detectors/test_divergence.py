"""divergence: a runaway (loss and grad norm rising together) or a creeping rise, caught
before the NaN; a bad batch that recovers is not a divergence."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, noise, only, run, step

from monitor_agent.types import Severity


def _healthy(n: int) -> list:
    return [run()] + [step(i, loss=3.0 * 0.999**i * (1 + noise(i, 0.03)),
                           grad_norm=1.0 + noise(i, 0.2)) for i in range(1, n)]


def test_runaway_fires_before_the_nan():
    recs = _healthy(200)
    for k, (loss, g) in enumerate([(3.5, 4.0), (9.0, 30.0), (40.0, 900.0), (1e4, 1e8)]):
        recs.append(step(200 + k, loss=loss, grad_norm=g))
    recs.append(step(204, loss=float("nan"), grad_norm=float("nan")))
    found = feed(only("divergence"), recs)
    assert [f.step for f in found] == [202]
    assert found[0].severity == Severity.ERROR and found[0].evidence["rule"] == "runaway"


def test_a_transient_bad_batch_is_not_a_divergence():
    recs = _healthy(300)
    recs += [step(300, loss=5.5, grad_norm=2.8), step(301, loss=5.6, grad_norm=2.5),
             step(302, loss=5.4, grad_norm=2.6)]
    recs += [step(i, loss=2.2 * (1 + noise(i, 0.03))) for i in range(303, 400)]
    assert feed(only("divergence"), recs) == []


def test_creeping_rise_is_caught_by_the_trend_rule():
    recs = _healthy(300)
    last = recs[-1].loss
    recs += [step(i, loss=last * 1.01 ** (i - 300) * (1 + noise(i, 0.03)),
                  grad_norm=1.0 * 1.02 ** (i - 300)) for i in range(300, 400)]
    found = feed(only("divergence"), recs)
    assert found and 300 < found[0].step < 360
    trend_only = feed(only("divergence", divergence_steps=1000), recs)
    assert trend_only and trend_only[0].evidence["rule"] == "trend"
    assert 300 < trend_only[0].step < 370


def test_quiet_on_a_noisy_small_batch_loss():
    recs = [run()] + [step(i, loss=0.1 * (1 + noise(i, 0.9, seed=3)) + 0.05 * (i % 7 == 0),
                           grad_norm=1.5 + noise(i, 0.5)) for i in range(1, 1000)]
    assert feed(only("divergence"), recs) == []


def test_quiet_on_a_healthy_run():
    assert feed(only("divergence"), _healthy(1000)) == []


def test_restore_mid_stream_changes_nothing():
    recs = _healthy(300)
    last = recs[-1].loss
    recs += [step(i, loss=last * 1.01 ** (i - 300), grad_norm=1.02 ** (i - 300))
             for i in range(300, 400)]
    assert_restore_equivalent(lambda: only("divergence"), recs, cut=280)
