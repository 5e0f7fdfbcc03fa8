"""``monitor-agent export``: a stored run comes back as a trace that replays the same."""

from __future__ import annotations

import gzip
from pathlib import Path

import httpx

from monitor_agent.cli import main
from monitor_agent.pipeline.trace_judge import judge_traces
from monitor_agent.records import wire
from monitor_agent.settings import Settings, load_settings
from monitor_agent.storage import export
from tests.live_server import LiveServer

TRACE = Path(__file__).resolve().parents[1] / "traces" / "category_shift_mlp.jsonl.gz"


def _findings(path: Path) -> list[tuple]:
    run = judge_traces([path], Settings())[0]
    return sorted((f.type, f.step, f.rank, f.layer) for f in run.findings)


def test_export_round_trips_through_replay(tmp_path: Path, capsys, monkeypatch):
    original = list(wire.iter_trace(TRACE))
    run_id = original[0]["run_id"]
    with LiveServer(load_settings(data_dir=tmp_path / "data", token="tok")) as srv:
        with gzip.open(TRACE, "rb") as fh:
            lines = fh.read()
        res = httpx.post(srv.url + "/v1/records", content=lines, timeout=60,
                         headers={"content-type": "application/x-ndjson",
                                  "Authorization": "Bearer tok"})
        assert res.status_code == 200 and res.json()["accepted"] == len(original), res.text
        by_url, by_dir = tmp_path / "url.jsonl.gz", tmp_path / "dir.jsonl"
        assert main(["export", run_id, "-o", str(by_url), "--url", srv.url]) == 0
        monkeypatch.setattr(export, "PAGE", 7)  # many pages, some ending mid-step
        paged = tmp_path / "paged.jsonl"
        assert main(["export", run_id, "-o", str(paged), "--url", srv.url]) == 0
        assert main(["export", run_id, "-o", str(by_dir), "--data-dir",
                     str(tmp_path / "data")]) == 0
        assert main(["export", "no-such-run", "-o", str(tmp_path / "x.jsonl"), "--data-dir",
                     str(tmp_path / "data")]) == 1
    out = capsys.readouterr()
    assert f"{len(original)} records of run {run_id}" in out.out
    assert "no records of run 'no-such-run'" in out.err
    exported = list(wire.iter_trace(by_url))
    assert list(wire.iter_trace(by_dir)) == exported == list(wire.iter_trace(paged))
    assert len(exported) == len(original)
    assert [(r["kind"], r.get("step")) for r in exported] == [
        (r["kind"], r.get("step")) for r in original]
    assert _findings(by_url) == _findings(TRACE) != []


def _cli(*args: str, limit_file_bytes: int | None = None):
    """The real console command; optionally with a file-size limit, so writing fails the
    way a full disk makes it fail (an OSError mid-write)."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_bytes, limit_file_bytes))

    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{repo / 'client'}"}
    return subprocess.run([sys.executable, "-m", "monitor_agent", "export", *args],
                          capture_output=True, text=True, env=env, cwd=repo, timeout=120,
                          preexec_fn=limit if limit_file_bytes else None)


def test_export_never_destroys_a_file_and_fails_in_one_line(tmp_path: Path):
    data = tmp_path / "data"
    run_id = next(iter(wire.iter_trace(TRACE)))["run_id"]
    with LiveServer(load_settings(data_dir=data)) as srv:
        with gzip.open(TRACE, "rb") as fh:
            res = httpx.post(srv.url + "/v1/records", content=fh.read(), timeout=60,
                             headers={"content-type": "application/x-ndjson"})
        assert res.status_code == 200
        accepted = res.json()["accepted"]
        stored = len(httpx.get(f"{srv.url}/v1/runs/{run_id}/records",
                               params={"limit": 10000}).json()["records"])
        keep = tmp_path / "keep.jsonl"
        keep.write_text("a trace someone needs\n")
        db_before = (data / "monitor.sqlite").read_bytes()[:100]
        cases = [
            # (arguments, what stderr must say)
            ((f"gtp-{run_id}", "-o", str(keep), "--data-dir", str(data)), "no records"),
            ((f"gtp-{run_id}", "-o", str(keep), "--url", srv.url), "404"),
            ((run_id, "-o", str(data / "monitor.sqlite"), "--data-dir", str(data)),
             "inside the data directory"),
            ((run_id, "-o", str(data / "monitor.sqlite"), "--url", srv.url),
             "SQLite database"),
            ((run_id, "-o", str(tmp_path), "--data-dir", str(data)), "is a directory"),
            ((run_id, "-o", str(tmp_path / "no" / "x.jsonl"), "--data-dir", str(data)),
             "does not exist"),
        ]
        for args, why in cases:
            proc = _cli(*args)
            assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
            assert why in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert keep.read_text() == "a trace someone needs\n", args
        # Writing fails halfway (a full disk): the old file stays, no partial file is left.
        proc = _cli(run_id, "-o", str(keep), "--data-dir", str(data), limit_file_bytes=4096)
        assert proc.returncode == 1 and "cannot write" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr
        assert keep.read_text() == "a trace someone needs\n"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "keep.jsonl"]
        # The database is whole, and the sidecar still serves every record from it.
        assert (data / "monitor.sqlite").read_bytes()[:100] == db_before
        assert len(httpx.get(f"{srv.url}/v1/runs/{run_id}/records",
                             params={"limit": 10000}).json()["records"]) == stored
        proc = _cli(run_id, "-o", str(keep), "--data-dir", str(data))
        assert proc.returncode == 0, proc.stderr
        assert len(list(wire.iter_trace(keep))) == accepted


def test_a_resumed_run_exports_its_current_history_by_either_route(tmp_path: Path):
    def steps(token: str, first: int, last: int, loss: float) -> list[dict]:
        return [{"kind": "step", "run_id": "re", "step": s, "time": 1.0 + s, "loss": loss,
                 "attempt": token} for s in range(first, last + 1)]

    ended = {"kind": "end", "run_id": "re", "step": 20, "time": 22.0, "status": "failed",
             "attempt": "a"}  # the first process ends; the second resumes from step 11
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        for batch in (steps("a", 1, 20, 3.0) + [ended], steps("b", 11, 30, 2.0)):
            assert httpx.post(srv.url + "/v1/records", json={"records": batch},
                              timeout=10).json()["accepted"] == len(batch)
        by_url, by_dir = tmp_path / "url.jsonl", tmp_path / "dir.jsonl"
        assert main(["export", "re", "-o", str(by_url), "--url", srv.url]) == 0
        assert main(["export", "re", "-o", str(by_dir), "--data-dir",
                     str(tmp_path / "data")]) == 0
    exported = list(wire.iter_trace(by_dir))
    assert exported == list(wire.iter_trace(by_url))
    assert [(r["step"], r["loss"]) for r in exported] == [
        (s, 3.0 if s <= 10 else 2.0) for s in range(1, 31)]


def test_export_replaces_only_a_regular_file(tmp_path: Path):
    """A device node (as root, a system device), a symbolic link or a FIFO at the target is
    refused and left as it was: the rename that ends an export would put a regular file in
    its place, and a FIFO would hang the look at what is there."""
    import os
    import stat

    from monitor_agent.storage.store import RecordRow, Store

    data = tmp_path / "data"
    data.mkdir()
    store = Store(data / "monitor.sqlite")
    store.insert_records([RecordRow("r", 0, "step", 1, None, wire.dumps(
        {"kind": "step", "run_id": "r", "step": 1, "loss": 1.0}))])
    store.close()
    victim = tmp_path / "victim.jsonl"
    victim.write_text("someone's file\n")
    targets = {"link.jsonl": lambda p: p.symlink_to(victim),
               "dangling.jsonl": lambda p: p.symlink_to(tmp_path / "nowhere"),
               "fifo.jsonl": os.mkfifo}
    try:  # /dev/null's twin; only where this process may make device nodes (root)
        os.mknod(tmp_path / "probe", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        os.unlink(tmp_path / "probe")
        targets["device.jsonl"] = lambda p: os.mknod(p, stat.S_IFCHR | 0o600,
                                                      os.makedev(1, 3))
    except PermissionError:
        pass
    for name, make in targets.items():
        make(tmp_path / name)
        before = os.lstat(tmp_path / name)
        proc = _cli("r", "-o", str(tmp_path / name), "--data-dir", str(data))
        assert proc.returncode == 1, (name, proc.stdout, proc.stderr)
        assert "only a regular file" in proc.stderr and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        after = os.lstat(tmp_path / name)
        assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino), name
    assert victim.read_text() == "someone's file\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    proc = _cli("r", "-o", str(victim), "--data-dir", str(data))  # a regular file: replaced
    assert proc.returncode == 0 and victim.read_text().startswith('{"kind":"step"')
