"""AlertStore: the one home of alert, silence and action state, on a real SQLite file."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from monitor_agent.alerting.alert_store import AlertStore
from monitor_agent.alerting.alerts import StoredAlert
from monitor_agent.alerting.db import open_alert_db
from monitor_agent.alerting.silences import Silence
from monitor_agent.records.actions import Action
from monitor_agent.storage.database import StorageError

T0 = 1_700_000_000.0


def pending(fp: str = "fp1", run_id: str = "r1", **kw) -> StoredAlert:
    values = dict(
        fingerprint=fp, run_id=run_id, rule="TrainingNaN", type="nan_inf", severity="critical",
        layer="h.0", rank=0, identity={"layer": "h.0"}, project="p", labels={"team": "nlp"},
        channels=("slack", "pagerduty"), cooldown=60.0, repeat_interval=3600.0,
        resolve_after=300.0, state="pending", started_at=T0, pending_since=T0, last_seen=T0,
        last_step=10, count=1, finding=b'{"message": "loss is NaN", "step": 10}',
    )
    return StoredAlert(**{**values, **kw})


@pytest.fixture
def store(tmp_path: Path) -> AlertStore:
    return AlertStore(open_alert_db(tmp_path / "alerts.sqlite"))


def test_an_episode_round_trips_as_a_typed_alert(store: AlertStore):
    alert = pending()
    with store.tx() as tx:
        tx.begin_episode(alert)
        assert tx.alert("fp1") == alert
    [stored] = store.alerts()
    assert stored == alert and stored.channels == ("slack", "pagerduty")
    assert stored.timing().state == "pending" and stored.finding_data()["step"] == 10


def test_a_new_episode_keeps_when_people_were_last_told(store: AlertStore):
    with store.tx() as tx:
        tx.begin_episode(pending())
        tx.mark_sent("fp1", T0 + 1)
        tx.resolve("fp1", T0 + 400, told=True)
        tx.begin_episode(pending(started_at=T0 + 500, count=1))
    [again] = store.alerts()
    # The cooldown counts from the last page, so that survives the new episode.
    assert (again.state, again.notified, again.notified_at) == ("pending", "resolved", T0 + 1)
    assert again.resolved_at is None and again.started_at == T0 + 500


def test_a_rewind_moves_an_open_episode_back_to_the_new_attempts_start(store: AlertStore):
    # A rollback replaced the history after step 99: the open page (begun at 150) spans
    # the new attempt from there, so what the new attempt finds can follow from it.
    with store.tx() as tx:
        tx.begin_episode(pending(first_step=150, last_step=160))
        tx.begin_episode(pending("fp2", first_step=None, last_step=160))  # stored before
        tx.begin_episode(pending("fp3", first_step=40, last_step=60))     # before the fork
        tx.rewind("r1", 99)
    steps = {a.fingerprint: (a.first_step, a.last_step) for a in store.alerts()}
    assert steps == {"fp1": (99, 99), "fp2": (None, 99), "fp3": (40, 60)}


def test_merge_fire_and_resolve_change_only_their_fields(store: AlertStore):
    with store.tx() as tx:
        tx.begin_episode(pending())
        tx.merge_finding("fp1", T0 + 5, step=12, finding=b"{}", layer="h.1", severity="error")
        tx.fire_quietly("fp1")
    [a] = store.alerts(state="firing")
    assert (a.count, a.last_step, a.layer, a.severity, a.notified) == (2, 12, "h.1", "error", None)
    with store.tx() as tx:
        tx.resolve("fp1", T0 + 900, told=False)  # nobody heard it fire: no resolve sent
    assert store.alerts(state="resolved")[0].notified is None
    assert store.active() == [] and store.alerts(unresolved=True) == []


def test_a_failed_transaction_leaves_no_trace(store: AlertStore):
    with pytest.raises(RuntimeError), store.tx() as tx:
        tx.begin_episode(pending())
        raise RuntimeError("crash between statements")
    assert store.alerts() == []


def test_silences_add_list_expire(store: AlertStore):
    s = Silence.new(run_id="r1", duration=60, now=T0, created_by="ana")
    store.add_silence(s)
    assert store.silences() == [s]
    with store.tx() as tx:
        assert tx.active_silences(T0 + 1) == [s]
        assert tx.active_silences(T0 + 61) == []
    assert store.expire_silence(s.id, T0 + 2)
    assert not store.expire_silence(s.id, T0 + 3)  # already over
    assert store.silences()[0].ends_at == T0 + 2


def test_actions_are_numbered_counted_and_honoured(store: AlertStore):
    ask = Action(id=0, run_id="r1", action="stop", rule="TrainingNaN", type="nan_inf", step=10,
                 message="stop requested at step 10 by rule TrainingNaN", created_at=T0)
    with store.tx() as tx:
        tx.begin_episode(pending())
        first = tx.add_action(ask, "fp1")
        second = tx.add_action(ask, "fp1")
        assert tx.alert("fp1").action == ask.message
    assert second.id > first.id > 0
    assert store.actions_for_run("r1") == [first, second]
    assert store.actions_for_run("r1", after=first.id) == [second]
    assert store.stop_requested("r1") and not store.stop_requested("r2")
    assert store.action_counts() == {("r1", "stop", "TrainingNaN"): 2}
    with store.tx() as tx:
        [(old, fp), _] = tx.open_stops("r1", through_step=20)
        assert tx.open_stops("r1", through_step=9) == []
        new = dataclasses.replace(old, honoured_step=15, message="run stopped at step 15")
        tx.honour(old, new, fp)
        assert tx.alert("fp1").action == "run stopped at step 15"
    assert store.actions_for_run("r1")[0].honoured_step == 15


def test_a_statement_that_cannot_commit_is_an_alert_storage_error(store: AlertStore):
    """No sqlite3.Error leaves the store: an AlertTx statement failing inside ``tx()`` (the
    database refuses writes here, as a full disk would) comes out as StorageError, naming
    the alert database, with SQLite's error chained."""
    store.db.execute("PRAGMA query_only = ON")
    with pytest.raises(StorageError) as caught, store.tx() as tx:
        tx.begin_episode(pending())
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    assert caught.value.source == "alert storage"
    with pytest.raises(StorageError):
        store.add_silence(Silence.new(run_id="r1", duration=60, now=T0, created_by="ana"))
    store.db.execute("PRAGMA query_only = OFF")
    assert store.alerts() == [] and store.silences() == []
