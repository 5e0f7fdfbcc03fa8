"""A digest keeps what the run's leader judges and charts, and nothing per layer."""

from __future__ import annotations

from monitor_agent.cluster.digest import HEAVY_STEP_FIELDS, digest
from monitor_agent.records import schemas, wire


def _step(**extra: object) -> dict:
    return {"kind": "step", "run_id": "r", "rank": 2, "step": 9, "time": 1.5, "attempt": "t1",
            "loss": 2.5, "lr": 3e-4, "grad_norm": 0.7, "step_time": 0.31, "data_time": 0.02,
            "compute_time": 0.2, "sync_wait_time": 0.09, "tokens": 4096.0, **extra}


def test_a_step_loses_its_per_layer_payload_and_keeps_every_scalar():
    layers = {f"h.{i}.w": {"grad_norm": 0.1, "param_norm": 3.0} for i in range(150)}
    full = _step(layers=layers, metrics={"acc": 0.9}, gpu={"utilization": 0.9},
                 grad_hist={"h.0.w": {"edges": [0.0, 1.0], "counts": [3.0]}},
                 activations={"h.0": {"mean": 0.1}})
    body = wire.dumps(full)
    small = digest("step", body)
    got = wire.loads(small)
    assert not set(HEAVY_STEP_FIELDS) & set(got)
    assert got == _step()
    throttled = wire.loads(digest("step", wire.dumps(_step(gpu={
        "utilization": 0.9, "throttle_power": 1, "ecc_uncorrected_volatile": 0}))))
    assert throttled["gpu"] == {"throttle_power": 1}  # the straggler's cause, across nodes
    assert len(small) * 20 < len(body)
    schemas.parse_record(got)  # the leader validates it as any record


def test_grad_norms_travel_only_with_a_non_finite_gradient():
    norms = {"h.0.w": 1.0, "h.1.w": "NaN"}
    nan = wire.loads(digest("step", wire.dumps(_step(grad_norm="NaN", grad_norms=norms))))
    assert nan["grad_norms"] == norms  # the NaN page names the first parameter from them
    fine = wire.loads(digest("step", wire.dumps(_step(grad_norms=norms))))
    assert "grad_norms" not in fine


def test_other_kinds_go_as_they_are():
    for record in ({"kind": "eval", "run_id": "r", "step": 3, "time": 1.0, "val_loss": 2.0},
                   {"kind": "checkpoint", "run_id": "r", "step": 3, "time": 1.0, "path": "/c"}):
        body = wire.dumps(record)
        assert digest(record["kind"], body) is body
