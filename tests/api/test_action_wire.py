"""The actions an ingest answer carries, byte for byte: a rollback's plan and a stop (whose
plan is null) as the client has always read them. The plan is a typed value inside the
sidecar (records/rollback_plan.py); its JSON must not move a byte, key order included."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from tests.rollback_sidecar import rollback_sidecar
from tests.rollback_sidecar import save as _save
from tests.rollback_sidecar import step as _step


def _actions(srv: Any, records: list[dict[str, Any]]) -> bytes:
    """The raw bytes of the answer's ``actions``, each ``created_at`` (the sidecar's clock)
    written as 0."""
    r = httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=30)
    assert r.status_code == 200, r.text
    found = re.search(rb'"actions":(\[.*\]),"attempts"', r.content)
    assert found is not None, r.content
    return re.sub(rb'"created_at":[0-9.e+-]+', b'"created_at":0', found.group(1))


ROLLBACK = (
    b'[{"id":1,"run_id":"r","action":"rollback","rule":"RollbackOnNaN","type":"nan_inf",'
    b'"step":21,"message":"rolled back to step 10 (/ckpt/10.pt, data position 10), skipping '
    b'batches 11-24","created_at":0,"honoured_step":null,"plan":{"checkpoint_step":10,'
    b'"checkpoint_path":"/ckpt/10.pt","resume_position":10,"skip":[[11,24]],'
    b'"positions":"positions","skip_from":11,"skip_to":24,"lr_factor":null,"lr_steps":null,'
    b'"number":1,"budget":1},"withdrawn_by":null}]')
STOP = (
    b'[{"id":2,"run_id":"r","action":"stop","rule":"RollbackOnNaN","type":"nan_inf",'
    b'"step":30,"message":"rollback budget 1 spent: stopping; a human must look (rule '
    b'RollbackOnNaN, nan_inf at step 30)","created_at":0,"honoured_step":null,"plan":null,'
    b'"withdrawn_by":null}]')


def test_a_rollback_and_a_stop_reach_the_client_as_they_always_have(tmp_path: Path):
    run = {"kind": "run", "run_id": "r", "time": 1000.0}
    with rollback_sidecar(tmp_path, rollback_skip_margin=3, rollback_budget=1) as srv:
        _actions(srv, [{**run, "attempt": "a"}, *(_step(s, s, "a") for s in range(1, 21)),
                       _save(10, 10, "a")])
        assert _actions(srv, [_step(21, 21, "a", "NaN")]) == ROLLBACK
        # The relaunch resumes at step 11 past the window, and diverges again: the budget
        # of one rollback is spent, so the run is stopped.
        _actions(srv, [{**run, "attempt": "b"}, *(_step(s, s + 14, "b") for s in range(11, 30))])
        assert _actions(srv, [_step(30, 44, "b", "NaN")]) == STOP


def test_the_openapi_document_describes_each_plan_as_a_nested_model(tmp_path: Path):
    from monitor_agent.serving.app import create_app
    from monitor_agent.settings import load_settings

    doc = create_app(load_settings(data_dir=tmp_path)).openapi()
    schemas = doc["components"]["schemas"]
    for model in ("IngestResponse", "ActionsOut"):
        item = schemas[model]["properties"]["actions"]["items"]
        refs = [s.get("$ref") for s in item["properties"]["plan"]["anyOf"]]
        assert refs == ["#/components/schemas/RollbackSpec",
                        "#/components/schemas/RestartPlan", None], (model, refs)
    # A rollback plan's keys that the wire leaves out when they say nothing are optional.
    assert set(schemas["RollbackSpec"]["required"]) == {
        "checkpoint_step", "checkpoint_path", "skip_from", "skip_to"}
