"""The outbox's schedule and words for a failed send: the backoff a retry waits, the cap a
receiver's Retry-After is held to, the settings it is read from, which rows wait for an
earlier one about the same alert, and the bounded metric label of a permanent failure."""

from __future__ import annotations

import pytest

from monitor_agent.notify.base import Outcome, OutcomeKind
from monitor_agent.notify.channel_settings import OutboxSettings
from monitor_agent.notify.fairness import Queued
from monitor_agent.notify.outbox import RetryPolicy, _reason, sendable

POLICY = RetryPolicy(base=0.5, cap=10.0, max_attempts=8, max_age=3600.0, max_retry_after=30.0)


def test_backoff_doubles_from_the_base_until_the_cap():
    lowest = [POLICY.delay(n, None, rand=0.0) for n in range(1, 8)]
    assert lowest == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]  # half the backoff, cap 10


def test_jitter_spreads_a_retry_over_the_upper_half_of_its_backoff():
    assert POLICY.delay(3, None, rand=0.0) == 1.0  # backoff 2 s: from 1 s
    assert POLICY.delay(3, None, rand=0.5) == 1.5
    assert POLICY.delay(3, None, rand=0.999) == pytest.approx(1.999)  # up to 2 s


def test_a_receivers_retry_after_wins_within_its_cap():
    assert POLICY.delay(1, 7.0, rand=0.9) == 7.0  # neither jitter nor backoff applies
    assert POLICY.delay(5, 0.0, rand=0.9) == 0.0  # "now" is an answer too
    assert POLICY.delay(1, 600.0, rand=0.0) == 30.0  # a receiver cannot park a page


def test_the_policy_is_read_from_its_settings_field_by_field():
    s = OutboxSettings(backoff_base_seconds=0.7, backoff_cap_seconds=11.0, max_attempts=9,
                       max_age_seconds=123.0, max_retry_after_seconds=45.0)
    assert RetryPolicy.from_settings(s) == RetryPolicy(base=0.7, cap=11.0, max_attempts=9,
                                                      max_age=123.0, max_retry_after=45.0)


def _row(i: int, fingerprints: str) -> Queued:
    return Queued(i, 0.0, 0, 0.0, fingerprints)


def test_a_row_waits_only_for_earlier_rows_about_one_of_its_alerts():
    rows = [_row(1, "a"), _row(2, "b"), _row(3, "a c"), _row(4, "c"), _row(5, "d e")]
    assert [r.id for r in sendable(rows)] == [1, 2, 5]


def test_rows_without_fingerprints_keep_their_order_among_themselves_only():
    rows = [_row(1, ""), _row(2, "a"), _row(3, ""), _row(4, "a")]
    assert [r.id for r in sendable(rows)] == [1, 2]
    assert sendable([]) == []


@pytest.mark.parametrize(("detail", "label"), [
    ("HTTP 400 Bad Request", "http_400"), ("HTTP 401", "http_401"), ("HTTP 403", "http_403"),
    ("HTTP 404 Not Found", "http_404"), ("HTTP 410 Gone", "http_410"),
    ("HTTP 413 Payload Too Large", "http_413"),
    ("HTTP 422 Unprocessable", "http_other"),  # a code outside the set: bounded
    ("HTTP 4041", "http_404"), ("xHTTP 404", "http_other"), ("http 404", "http_other"),
    ("internal error: KeyError", "internal_error"), ("an internal error", "http_other"),
    ("", "http_other"), ("connection refused", "http_other"),
])
def test_a_permanent_failure_is_labelled_by_a_bounded_reason(detail, label):
    assert _reason(Outcome(OutcomeKind.PERMANENT, detail)) == label
