"""memory_pressure: near the device total (warning/error) or growing steadily (leak)."""

from __future__ import annotations

from synth_records import assert_restore_equivalent, feed, memory, noise, only, step

from monitor_agent.detectors import memory_pressure as tips
from monitor_agent.records.types import Severity

GiB = 1024.0**3


def test_near_total_is_a_warning_then_an_error():
    recs = [step(i, memory=memory(0.5 * GiB, 1 * GiB)) for i in range(1, 20)]
    recs.append(step(20, memory=memory(0.92 * GiB, 1 * GiB)))
    recs.append(step(200, memory=memory(0.98 * GiB, 1 * GiB)))
    found = feed(only("memory_pressure"), recs)
    assert [(f.step, f.severity) for f in found] == [(20, Severity.WARNING), (200, Severity.ERROR)]
    assert found[0].suggestions == tips.MEMORY_HIGH


def test_a_steady_leak_is_caught_long_before_the_total():
    used = [0.3 * GiB] * 100 + [0.3 * GiB + k * 0.004 * GiB for k in range(1, 200)]
    recs = [step(i + 1, memory=memory(u, 2 * GiB)) for i, u in enumerate(used)]
    found = feed(only("memory_pressure"), recs)
    assert found and 100 < found[0].step < 140 and found[0].suggestions == tips.MEMORY_LEAK
    assert found[0].evidence["steps_left"] > 100


def test_a_leak_without_a_known_total_is_judged_against_the_start():
    used = [1e9] * 50 + [1e9 * (1 + 0.01 * k) for k in range(1, 100)]
    found = feed(only("memory_pressure"), [step(i + 1, memory=memory(u, None))
                                           for i, u in enumerate(used)])
    assert found and found[0].evidence["steps_left"] is None


def test_quiet_on_fluctuating_memory():
    recs = [step(i, memory=memory((0.5 + noise(i, 0.05)) * GiB, 1 * GiB)) for i in range(1, 800)]
    assert feed(only("memory_pressure"), recs) == []


def test_restore_mid_stream_changes_nothing():
    used = [0.3 * GiB] * 100 + [0.3 * GiB + k * 0.004 * GiB for k in range(1, 300)]
    recs = [step(i + 1, memory=memory(u, 2 * GiB)) for i, u in enumerate(used)]
    assert_restore_equivalent(lambda: only("memory_pressure"), recs, cut=120)
