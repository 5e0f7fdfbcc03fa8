"""docs/record.schema.json is what schemas.py accepts, and what the client and the public
traces send satisfies it."""

from __future__ import annotations

import itertools
import json
import re

import jsonschema
import pytest

from monitor_agent.records import wire
from monitor_agent.records.format_schema import REGENERATE, SCHEMA_PATH, record_schema, render


def test_the_checked_in_schema_matches_the_models():
    assert SCHEMA_PATH.is_file(), f"{SCHEMA_PATH} is missing: run `{REGENERATE}`"
    assert SCHEMA_PATH.read_text() == render(), (
        f"{SCHEMA_PATH.name} no longer matches monitor_agent/records/schemas.py: regenerate it with "
        f"`{REGENERATE}` (from the repository root), review the diff, update docs/format.md "
        "if a field changed, and commit both")


@pytest.fixture(scope="module")
def validator():
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_every_kind_of_public_trace_record_satisfies_it(validator, traces_dir):
    kinds = set()
    # The head of every trace, and one short trace whole (its end record included).
    heads = [itertools.islice(wire.iter_trace(p), 30) for p in sorted(traces_dir.glob("*.gz"))]
    for path, records in [*zip(sorted(traces_dir.glob("*.gz")), heads, strict=True),
                          (traces_dir / "nan_batch_cnn.jsonl.gz",
                           wire.iter_trace(traces_dir / "nan_batch_cnn.jsonl.gz"))]:
        for obj in records:
            errors = sorted(validator.iter_errors(obj), key=str)
            assert not errors, f"{path.name}: {errors[0].message}"
            kinds.add(obj["kind"])
    assert kinds == {"run", "step", "eval", "end"}


def test_nan_strings_pass_and_wrong_records_fail(validator):
    ok = {"kind": "step", "run_id": "r", "step": 3, "time": 1.0, "loss": "NaN",
          "grad_norm": "Infinity", "layers": {"h.0": {"grad_norm": "-Infinity"}}}
    assert validator.is_valid(ok)
    assert not validator.is_valid({**ok, "loss": "nan?"})
    assert not validator.is_valid({**ok, "step": -1})
    assert not validator.is_valid({"kind": "step", "run_id": "r", "time": 1.0})  # no step
    assert not validator.is_valid({**ok, "kind": "weird"})
    assert record_schema()["$defs"]["NonFinite"]["enum"] == ["NaN", "Infinity", "-Infinity"]


def test_what_the_client_sends_satisfies_it(validator, receiver_records):
    assert {r["kind"] for r in receiver_records} == {"run", "step", "eval", "end"}
    for record in receiver_records:
        errors = sorted(validator.iter_errors(record), key=str)
        assert not errors, f"{record['kind']}: {errors[0].message}"
    step = next(r for r in receiver_records if r["kind"] == "step" and r.get("grad_hist"))
    assert step["layers"] and step["activations"] and step["param_hist"]


@pytest.fixture
def receiver_records(tmp_path):
    """Every kind and optional section the client produces, captured off the wire."""
    torch = pytest.importorskip("torch")
    import gzip
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import monitor_client

    got: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
            got.extend(json.loads(line) for line in body.splitlines() if line.strip())
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        mon = monitor_client.Monitor(url=f"http://127.0.0.1:{server.server_address[1]}",
                                     run_id="schema", settings=monitor_client.MonitorSettings(
                                         spool_dir=tmp_path, install_hooks=False, linger=0.01,
                                         watch=monitor_client.WatchSettings(
                                             hist_every=2, layer_stats_every=2,
                                             activations=True, peak_flops=1e11)))
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt, grad_clip=1.0)
        cats = monitor_client.CategoryLoss()
        for step in range(1, 5):
            x = torch.randn(4, 8)
            loss = model(x).pow(2).mean() * (float("nan") if step == 4 else 1.0)
            loss.backward()
            opt.step()
            opt.zero_grad()
            mon.log_step(step, loss=loss, tokens=32, samples=4)
        cats.add(torch.ones(2, 3), ["a", "b"])
        mon.log_eval(4, val_loss=1.0, metrics=cats.metrics())
        assert mon.close(timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    return got


def test_docs_format_names_every_field_and_finding_type():
    from pathlib import Path

    from monitor_agent.detectors.catalogue import FINDING_TYPES
    from monitor_agent.records import schemas

    doc = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()
    models = (schemas.RunModel, schemas.StepModel, schemas.EvalModel, schemas.EndModel,
              schemas.MemoryModel)
    names = {n for m in models for n in m.model_fields}
    for typed in (schemas.LayerModel, schemas.ActivationModel, schemas.HistModel):
        names |= set(typed.__annotations__)
    missing = sorted(n for n in names | set(FINDING_TYPES)
                     if not re.search(rf"[`\"{{ ]{re.escape(n)}[`\",}} ]", doc))
    assert not missing, f"docs/format.md does not describe: {missing}"


def test_docs_format_describes_every_gpu_key_the_client_sends():
    from pathlib import Path

    from monitor_client._nvml import FIELDS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()
    missing = [k for k in FIELDS if f"`{k}`" not in doc]
    assert not missing, f"docs/format.md's gpu table does not describe: {missing}"
