"""throughput_drop: recent median speed far below the run's own baseline."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, noise, only, step

from monitor_agent.detectors import throughput_drop as tips


def _stream(n: int, drop_at: int, factor: float, data_time: float = 0.0) -> list:
    recs = []
    for i in range(1, n):
        slow = i >= drop_at
        st = 0.02 * (1 + noise(i, 0.2)) / (factor if slow else 1.0)
        recs.append(step(i, step_time=st, tokens=1000.0, tokens_per_second=1000.0 / st,
                         data_time=(data_time if slow else 0.0001)))
    return recs


def test_data_loader_starvation_is_named_once_it_has_lasted():
    found = feed(only("throughput_drop"), _stream(500, 300, 0.3, data_time=0.04))
    # The 20-step median turns slow ~10 steps in, then must stay slow 20 steps.
    assert found and 325 <= found[0].step <= 335
    f = found[0]
    assert f.evidence["ratio"] < 0.6 and f.suggestions == tips.THROUGHPUT_DATA
    assert f.evidence["consecutive_steps"] == 20 and "20 steps in a row" in f.message
    assert f.message.count("median") == 2 and "200 steps before" in f.message


def test_quiet_on_a_slow_stretch_that_ends_before_it_lasts():
    slow, fast = _stream(500, 300, 0.3), _stream(500, 10**9, 1.0)
    recs = [s if 300 <= s.step < 315 else f for s, f in zip(slow, fast, strict=True)]
    assert feed(only("throughput_drop"), recs) == []


def test_quiet_while_the_baseline_is_young():
    # The first steps of a run are fast (caches, prefetch), then it settles 2x slower.
    recs = [step(i, step_time=0.01 if i < 40 else 0.02, tokens_per_second=1000 / (
        0.01 if i < 40 else 0.02)) for i in range(1, 400)]
    assert feed(only("throughput_drop"), recs) == []


def test_compute_slowdown_gets_compute_advice():
    found = feed(only("throughput_drop"), _stream(500, 300, 0.4))
    assert found and found[0].suggestions == tips.THROUGHPUT_COMPUTE


def test_quiet_on_noise_and_single_slow_steps():
    recs = _stream(800, 10**9, 1.0)
    recs = [step(r.step, step_time=1.0, tokens_per_second=1000.0) if r.step % 100 == 0 else r
            for r in recs]
    assert feed(only("throughput_drop"), recs) == []


def test_steps_per_second_without_tokens():
    recs = [step(i, tokens=None, tokens_per_second=None, step_time=0.02 if i < 200 else 0.1)
            for i in range(1, 260)]
    found = feed(only("throughput_drop"), recs)
    assert found and "steps/s" in found[0].message


def test_restore_mid_stream_changes_nothing():
    recs = _stream(500, 300, 0.3, data_time=0.04)
    assert_restore_equivalent(lambda: only("throughput_drop"), recs, cut=250)


def test_quiet_when_the_baseline_itself_had_stretches_as_slow():
    # A shared machine: every 100 steps another job takes the CPU for 30 steps (0.4x).
    # The next such stretch is no slower than the ones in the baseline: not a drop.
    recs = []
    for i in range(1, 800):
        busy = i % 100 < 30
        st = 0.02 * (1 + noise(i, 0.2)) / (0.4 if busy else 1.0)
        recs.append(step(i, step_time=st, tokens=1000.0, tokens_per_second=1000.0 / st))
    assert feed(only("throughput_drop"), recs) == []


def _episodes(samples: bool) -> list:
    """One RL episode a step: its length grows 10x as the agent learns (from step 150), and
    each sample costs the same 1 ms; the step reports its samples, or only its time."""
    recs = []
    for i in range(1, 400):
        length = 20 if i < 150 else 200
        st = length * 1e-3 * (1 + noise(i, 0.2))
        recs.append(step(i, step_time=st, tokens=None, tokens_per_second=None,
                         samples=float(length) if samples else None))
    return recs


def test_a_step_that_did_more_work_is_no_slowdown():
    """Issue 45: actor-critic with one episode a step got two false throughput_drop
    warnings as its episodes grew, although each step reported its samples."""
    assert feed(only("throughput_drop"), _episodes(samples=True)) == []
    found = feed(only("throughput_drop"), _episodes(samples=False))
    assert found and found[0].message.startswith("steps/s median")  # work unknown: steps


def test_samples_per_second_is_the_speed_when_the_step_reports_samples():
    recs = [step(i, step_time=0.02 if i < 300 else 0.06, tokens=None, tokens_per_second=None,
                 samples=32.0) for i in range(1, 400)]
    (f, *_) = feed(only("throughput_drop"), recs)
    assert f.message.startswith("samples/s median 533 over the last 20 steps is 0.33x the "
                                "median 1.6e+03"), f.message


def test_a_new_unit_starts_the_baseline_again():
    """Tokens/s until step 200, then the script stops reporting tokens: speeds in one
    unit say nothing of the other (50,000 tokens/s is not 50 steps/s)."""
    recs = [step(i, step_time=0.02, tokens=1000.0, tokens_per_second=None)
            for i in range(1, 200)]
    recs += [step(i, step_time=0.02, tokens=None, tokens_per_second=None)
             for i in range(200, 400)]
    assert feed(only("throughput_drop"), recs) == []
