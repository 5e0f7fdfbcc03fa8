"""eventually(): predicates and assertion blocks, the message on a timeout, the scale."""

from __future__ import annotations

import itertools

import pytest

from tests import eventually as waits
from tests.eventually import eventually


def test_a_predicate_is_called_until_it_holds_and_its_value_returned():
    calls = itertools.count(1)
    assert eventually(lambda: next(calls) >= 3 and "ready", interval=0) == "ready"
    assert next(calls) == 4


def test_an_assertion_block_passes_when_it_stops_raising():
    seen: list[int] = []

    def check() -> None:
        seen.append(1)
        assert len(seen) == 3, len(seen)

    assert eventually(check, interval=0) is None
    assert len(seen) == 3


def test_a_timeout_names_what_was_awaited_and_the_last_failure(monkeypatch):
    monkeypatch.setattr(waits, "TIME_SCALE", 1.0)  # whatever the run's scale: seconds as given

    def check() -> None:
        raise AssertionError("2 pages, want 3")

    with pytest.raises(AssertionError, match=r"the pages: not so after 0\.01 s; last: 2 pages"):
        eventually(check, timeout=0.01, interval=0, what="the pages")
    with pytest.raises(AssertionError, match="last: the check returned \\[\\]\nsidecar log"):
        eventually(lambda: [], timeout=0.01, interval=0, context=lambda: "sidecar log")
    with pytest.raises(AssertionError, match="last: the check returned None"):
        eventually(lambda: {}.get("page"), timeout=0.01, interval=0)


def test_other_errors_end_the_wait_at_once_unless_retried():
    calls = itertools.count(1)

    def flaky() -> bool:
        if next(calls) < 3:
            raise ConnectionError("not listening yet")
        return True

    assert eventually(flaky, interval=0, retry_on=(ConnectionError,))
    with pytest.raises(RuntimeError):
        eventually(lambda: (_ for _ in ()).throw(RuntimeError("exited")), interval=0)


def test_timeouts_are_multiplied_by_the_scale(monkeypatch):
    monkeypatch.setattr(waits, "TIME_SCALE", 3.0)
    assert waits.scaled(10) == 30
    with pytest.raises(AssertionError, match=r"not so after 0\.03 s"):
        eventually(lambda: False, timeout=0.01, interval=0)
