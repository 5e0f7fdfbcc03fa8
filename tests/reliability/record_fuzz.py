"""A fuzzer of our own for POST /v1/records: real records, every field mutated.

Seeds are real records from ``tests/traces/public`` (a run record, steps with per-layer
stats, a step given per-layer histograms with quantiles, an eval, an end). For every path in
a seed (top-level fields, nested maps, list items, map keys) it substitutes values from a
hostile catalogue (wrong types, huge and tiny numbers, NaN/Inf as tokens and strings, lone
surrogates, NUL, RTL overrides, long strings, big lists and maps, deep nesting), and adds
record-level attacks (unknown fields, duplicate keys, a run id of another run, far-ahead
steps). Cases are deterministic for a seed.

``Checker`` asserts the invariants issue 12 asks for after each case: no 5xx, /healthz
200, /metrics parses with prometheus_client (and, every ``promtool_every`` cases, ``promtool
check metrics`` exits 0), the victim run's stored history unchanged, RSS under budget.

Example::

    cases = list(fuzz_cases(seed_records(), limit=500))
    with SidecarProcess(tmp) as sc:
        checker = Checker(sc.url, sc.proc.pid)
        for case in cases:
            checker.send(case); checker.check()
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from monitor_agent.records import wire

TRACES = Path(__file__).resolve().parents[1] / "traces" / "public"
VICTIM = "victim-run"
FUZZ_RUN = "fuzz-run"
QUANTILES = [-3.0, -1.0, -0.1, 0.0, 0.1, 1.0, 2.0, 3.0]

# Values that replace a field (json.dumps writes NaN/Infinity as bare tokens and escapes a
# lone surrogate as "\ud800": exactly what a hostile client can send).
HOSTILE: list[Any] = [
    None, True, False, 0, -1, 2**53, 2**63, -(2**63) - 1, 10**30, 1e308, -0.0, 5e-324,
    float("nan"), float("inf"), float("-inf"), "NaN", "Infinity", "-Infinity", "12", "",
    "a\ud800b", "\udfff", "nul\u0000byte", "\u202eevil-rtl", "line\nbreak", "\u0007bell",
    "x" * 300, "y" * 70_000, "emoji \U0001f525", "a/b", "../../etc", '"quoted" \\back',
    [], {}, [1, 2, 3], {"a": 1}, [0.5] * 5000, {f"k{i}": i for i in range(2000)},
]


def _deep(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value


HOSTILE += [_deep(40), _deep(200)]


def seed_records(per_file: int = 3) -> list[dict[str, Any]]:
    """A few real records of each kind from the public traces, run ids set to FUZZ_RUN."""
    seeds: dict[str, list[dict[str, Any]]] = {"run": [], "step": [], "eval": [], "end": []}
    for path in sorted(TRACES.glob("*.jsonl.gz"))[:4]:
        taken: dict[str, int] = {}
        for obj in wire.iter_trace(path):
            kind = obj.get("kind")
            if kind in seeds and taken.get(kind, 0) < per_file:
                taken[kind] = taken.get(kind, 0) + 1
                seeds[kind].append({**obj, "run_id": FUZZ_RUN})
    step = next((s for s in seeds["step"] if s.get("layers")), seeds["step"][0])
    hist = {name: {"edges": [float(i) for i in range(17)], "counts": [1.0] * 16,
                   "quantiles": QUANTILES} for name in list(step.get("layers") or {"w": 0})[:20]}
    seeds["step"].append({**step, "grad_hist": hist, "param_hist": hist})
    return [rec for kind in ("run", "step", "eval", "end") for rec in seeds[kind]]


def _paths(obj: Any, prefix: tuple = (), depth: int = 0) -> Iterator[tuple]:
    """Every path into obj, capped so a 150-layer record does not yield thousands."""
    if isinstance(obj, dict):
        for i, (k, v) in enumerate(obj.items()):
            if depth > 0 and i >= 3:
                break
            yield (*prefix, k)
            yield from _paths(v, (*prefix, k), depth + 1)
    elif isinstance(obj, list) and obj:
        yield (*prefix, 0)
        yield from _paths(obj[0], (*prefix, 0), depth + 1)


def _replace(obj: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {**obj, head: _replace(obj[head], rest, value)}
    return [*obj[:head], _replace(obj[head], rest, value), *obj[head + 1:]]


def _rename(obj: Any, path: tuple, new_key: str) -> Any:
    if len(path) == 1:
        return {(new_key if k == path[0] else k): v for k, v in obj.items()}
    head = path[0]
    if isinstance(obj, dict):
        return {**obj, head: _rename(obj[head], path[1:], new_key)}
    return [*obj[:head], _rename(obj[head], path[1:], new_key), *obj[head + 1:]]


@dataclass(frozen=True)
class Case:
    """One request: its body, how it is sent, and what it is (for failure messages)."""

    name: str
    body: bytes
    ndjson: bool = True
    gzip: bool = False


def _encode(rec: Any) -> bytes:
    return json.dumps(rec).encode()


def fuzz_cases(seeds: list[dict[str, Any]], limit: int, seed: int = 12) -> Iterator[Case]:
    """Mutated records, a deterministic sample of every (seed, path, hostile value)."""
    rng = random.Random(seed)
    pool: list[tuple[str, Any]] = []
    for si, rec in enumerate(seeds):
        for path in _paths(rec):
            label = f"seed{si}:{rec['kind']}:{'.'.join(map(str, path))}"
            pool.extend((f"{label}={i}", ("value", rec, path, v)) for i, v in enumerate(HOSTILE))
            if isinstance(path[-1], str):  # a map key, not a list index
                pool.append((f"{label}:key", ("key", rec, path, None)))
        pool.extend(_record_attacks(si, rec))
    rng.shuffle(pool)
    for n, (name, (how, rec, path, value)) in enumerate(pool[:limit]):
        body = _mutate(how, rec, path, value, rng)
        yield Case(name, body, ndjson=n % 4 != 0, gzip=n % 3 == 0)


def _record_attacks(si: int, rec: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for attack in ("unknown_big", "duplicate_key", "victim_far_step", "victim_dup_run",
                   "drop_kind", "bare_nan_time", "nested_unknown"):
        out.append((f"seed{si}:{attack}", (attack, rec, (), None)))
    return out


def _mutate(how: str, rec: dict[str, Any], path: tuple, value: Any, rng: random.Random) -> bytes:
    if how == "value":
        return _encode(_replace(rec, path, value))
    if how == "key":
        bad = rng.choice(["k\ud800", "k\u0000", "", "x" * 5000, "\u202e", "a.b", "0"])
        return _encode(_rename(rec, path, bad))
    if how == "unknown_big":
        return _encode({**rec, "unknown": "u" * 200_000, "more": list(range(5000))})
    if how == "nested_unknown":
        layers = rec.get("layers") or {"w": {}}
        first = next(iter(layers))
        return _encode({**rec, "layers": {first: {**layers[first], "junk": "j" * 50_000}},
                        "memory": {"allocated_bytes": 1.0, "junk": ["x"] * 5000}})
    if how == "duplicate_key":
        text = _encode(rec)
        return text[:-1] + b', "kind": "step", "step": "dup", "run_id": "' + VICTIM.encode() + b'"}'
    if how == "victim_far_step":
        return _encode({**rec, "run_id": VICTIM, "step": 2**53 - rng.randrange(1000)})
    if how == "victim_dup_run":
        return _encode({**rec, "kind": "run", "run_id": VICTIM, "config": {"project": "a\ud800"}})
    if how == "drop_kind":
        return _encode({k: v for k, v in rec.items() if k != "kind"})
    if how == "bare_nan_time":
        return _encode({**rec, "time": float("nan"), "step": 10**12})
    raise ValueError(how)


@dataclass
class Checker:
    """Sends cases and checks the sidecar's invariants; counts what it saw."""

    url: str
    pid: int
    rss_budget_mib: float
    promtool_every: int = 50
    statuses: dict[int, int] = field(default_factory=dict)
    sent_bytes: int = 0
    cases: int = 0
    max_rss_mib: float = 0.0
    victim: list[dict[str, Any]] = field(default_factory=list)
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=60))

    def plant_victim(self, steps: int = 50) -> None:
        recs = [{"kind": "run", "run_id": VICTIM, "labels": {"project": "victim"}}]
        recs += [{"kind": "step", "run_id": VICTIM, "step": s, "time": 1000.0 + s,
                  "loss": 2.0 - s / 100} for s in range(1, steps + 1)]
        r = self.client.post(self.url + "/v1/records", json={"records": recs})
        assert r.status_code == 200 and r.json()["accepted"] == len(recs), r.text
        self.victim = self._victim_history()

    def _victim_history(self) -> list[dict[str, Any]]:
        r = self.client.get(f"{self.url}/v1/runs/{VICTIM}/records",
                            params={"since_step": -1, "limit": 10_000})
        assert r.status_code == 200, r.text
        return r.json()["records"]

    def send(self, case: Case) -> httpx.Response:
        body = case.body if case.ndjson else b'{"records": [' + case.body + b"]}"
        headers = {"content-type": "application/x-ndjson" if case.ndjson else "application/json"}
        if case.gzip:
            body, headers["content-encoding"] = gzip.compress(body, 1), "gzip"
        self.sent_bytes += len(body)
        r = self.client.post(self.url + "/v1/records", content=body, headers=headers)
        self.statuses[r.status_code] = self.statuses.get(r.status_code, 0) + 1
        self.cases += 1
        assert r.status_code < 500, f"{case.name}: {r.status_code} {r.text[:300]}"
        return r

    def check(self, case: Case, full: bool = False) -> None:
        assert self.client.get(self.url + "/healthz").status_code == 200, case.name
        rss = rss_mib(self.pid)
        self.max_rss_mib = max(self.max_rss_mib, rss)
        assert rss <= self.rss_budget_mib, f"{case.name}: RSS {rss:.0f} MiB"
        if not full:
            return
        text = self.client.get(self.url + "/metrics").text
        list(text_string_to_metric_families(text))
        if self.cases % self.promtool_every == 0:
            assert promtool_ok(text), f"{case.name}: promtool check metrics failed"
        assert self._victim_history()[: len(self.victim)] == self.victim, case.name
        for path in (f"/v1/runs/{FUZZ_RUN}", f"/v1/runs/{VICTIM}", "/v1/runs", "/v1/alerts"):
            r = self.client.get(self.url + path)
            assert r.status_code in (200, 404), f"{case.name}: GET {path} {r.status_code}"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def promtool_ok(text: str) -> bool:
    """``promtool check metrics`` exit status (True when promtool is not installed)."""
    if shutil.which("promtool") is None:
        return True
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        print(proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.returncode == 0
