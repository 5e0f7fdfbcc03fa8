"""The pure lifecycle decisions, driven with plain numbers."""

from __future__ import annotations

from dataclasses import replace

from monitor_agent.alerting.lifecycle import (
    Reason,
    Timing,
    fingerprint,
    on_finding,
    on_flush,
    on_tick,
)

FIRING = Timing(state="firing", notified="firing", notified_at=100.0, last_seen=100.0,
                last_step=10, acked=False, cooldown=60.0, repeat_interval=3600.0,
                resolve_after=300.0)


def test_fingerprint_is_run_rule_and_identity_labels():
    a = fingerprint("r1", "Nan", {"layer": "fc1"})
    assert a == fingerprint("r1", "Nan", {"layer": "fc1"})
    assert len({a, fingerprint("r2", "Nan", {"layer": "fc1"}),
                fingerprint("r1", "Spike", {"layer": "fc1"}),
                fingerprint("r1", "Nan", {"layer": "fc2"}), fingerprint("r1", "Nan", {})}) == 5


def test_on_finding():
    assert on_finding(None, step=5) is Reason.FIRST
    assert on_finding(FIRING, step=11) is Reason.SUPPRESSED
    assert on_finding(FIRING, step=10) is Reason.SUPPRESSED  # a second finding of the same step
    assert on_finding(FIRING, step=9) is Reason.REPLAYED
    resolved = replace(FIRING, state="resolved")
    assert on_finding(resolved, step=11) is Reason.FIRST
    assert on_finding(resolved, step=10) is Reason.REPLAYED  # restart replays the tail


def test_on_flush_cooldown_and_silence():
    new = replace(FIRING, state="pending", notified="resolved")
    assert on_flush(new, silenced=False, now=159.0) is Reason.COOLDOWN
    assert on_flush(new, silenced=False, now=160.0) is Reason.FIRST
    assert on_flush(new, silenced=True, now=1000.0) is Reason.SILENCED
    assert on_flush(replace(new, notified_at=None), silenced=False, now=0.0) is Reason.FIRST


def test_on_tick_resolves_after_clear_time():
    assert on_tick(FIRING, silenced=False, now=399.0) is None
    assert on_tick(FIRING, silenced=False, now=400.0) is Reason.RESOLVED
    assert on_tick(replace(FIRING, state="resolved"), silenced=False, now=10_000.0) is None


def test_on_tick_repeats_unless_acked_or_silenced():
    live = replace(FIRING, last_seen=3700.0)
    assert on_tick(live, silenced=False, now=3699.0) is None
    assert on_tick(live, silenced=False, now=3700.0) is Reason.REPEAT_ELAPSED
    assert on_tick(replace(live, acked=True), silenced=False, now=3700.0) is None
    assert on_tick(live, silenced=True, now=3700.0) is None


def test_on_tick_sends_what_was_held_back():
    held = replace(FIRING, notified="resolved", notified_at=100.0, last_seen=150.0)
    assert on_tick(held, silenced=False, now=159.0) is None  # cooldown still running
    assert on_tick(held, silenced=False, now=160.0) is Reason.FIRST
    assert on_tick(held, silenced=True, now=160.0) is None
