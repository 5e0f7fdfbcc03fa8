"""The line a process prints when its run id already existed on the sidecar: once, for its
own token only, and only once the sidecar settled what the attempt is."""

from __future__ import annotations

import logging

import pytest

from monitor_client._attempt import AttemptNotice, new_token


def _attempt(token: str, number: int, kind: str, **extra: object) -> dict:
    return {"run_id": "gpt-exp-1", "token": token, "number": number, "kind": kind,
            "start_step": extra.get("start_step"), "superseded_from": None,
            "superseded_to": None}


def test_the_line_is_said_once_for_this_process_only(caplog: pytest.LogCaptureFixture):
    token = new_token()
    assert len(token) == 16 and token != new_token()
    notice = AttemptNotice("gpt-exp-1", token)
    with caplog.at_level(logging.WARNING, logger="monitor_client"):
        notice.receive([_attempt(token, 2, "pending")])  # no step yet: nothing to say
        notice.receive([_attempt("someone-else", 3, "restarted")])
        for _ in range(3):
            notice.receive([_attempt(token, 2, "resumed", start_step=1600)])
    assert [r.getMessage() for r in caplog.records] == [
        "monitor_client: run gpt-exp-1 already exists on the sidecar; this is attempt 2 "
        "(resumed from step 1600; no step of attempt 1 replaced)"]
    assert notice.attempt is not None and notice.attempt["kind"] == "resumed"


def test_a_first_attempt_says_nothing(caplog: pytest.LogCaptureFixture):
    token = new_token()
    with caplog.at_level(logging.WARNING, logger="monitor_client"):
        AttemptNotice("gpt-exp-1", token).receive([_attempt(token, 1, "first")])
    assert caplog.records == []
