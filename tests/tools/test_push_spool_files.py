"""``monitor-agent push-spool`` on a spool it cannot trust: it deletes only what the
sidecar settled (accepted, or refused for good) and only the client's own segments, follows
no link, reads no FIFO, and holds one batch in memory whatever a file's size. A real
sidecar (uvicorn, SQLite) and the real command in a process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

REPO = Path(__file__).resolve().parents[2]
SEGMENT = "000000000001.ndjson"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "client")])}
    env.pop("MONITOR_AGENT_TOKEN", None)
    # The timeout only turns a hang (a FIFO read, waiting for a writer forever) into a
    # failure; no test waits for it.
    return subprocess.run([sys.executable, "-m", "monitor_agent", "push-spool", *args],
                          capture_output=True, text=True, timeout=60, env=env, cwd=REPO)


def _steps(run_id: str, steps: range) -> str:
    return "".join(json.dumps({"kind": "step", "run_id": run_id, "rank": 0, "step": s,
                               "time": 1.0 + s, "loss": 2.0}) + "\n" for s in steps)


def _stored(url: str, run_id: str) -> list[int]:
    res = httpx.get(f"{url}/v1/runs/{run_id}/records", params={"limit": 1000}, timeout=10)
    return [r["step"] for r in res.json()["records"]] if res.status_code == 200 else []


def test_records_refused_for_now_are_sent_again_and_kept_until_settled(tmp_path: Path):
    spool = tmp_path / "spool" / "mixed-r0"
    spool.mkdir(parents=True)
    (spool / SEGMENT).write_text(_steps("a", range(1, 3)) + _steps("b", range(1, 3))
                                 + _steps("c", range(1, 3)))
    # One new run per request: b's and c's records are refused "send its records again in
    # another request", which is what push-spool now does, instead of deleting them.
    with LiveServer(load_settings(data_dir=tmp_path / "d1", max_new_runs_per_request=1)) as srv:
        proc = _cli(str(spool.parent), "--url", srv.url)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "6 accepted" in proc.stdout and "spool removed" in proc.stdout, proc.stdout
        assert [_stored(srv.url, r) for r in "abc"] == [[1, 2]] * 3
    assert not spool.exists()

    # Room for one active run, none displaced: b is refused "retry later" and stays so.
    spool.mkdir()
    (spool / SEGMENT).write_text(_steps("a", range(1, 3)) + _steps("b", range(1, 3)))
    with LiveServer(load_settings(data_dir=tmp_path / "d2", max_active_runs=1,
                                  run_displace_after_seconds=10**6)) as srv:
        proc = _cli(str(spool.parent), "--url", srv.url)
        assert proc.returncode == 1 and "push again later" in proc.stderr, proc.stderr
        assert "2 refused for now" in proc.stdout and "1 file kept" in proc.stdout, proc.stdout
        assert _stored(srv.url, "a") == [1, 2] and _stored(srv.url, "b") == []
    assert (spool / SEGMENT).read_text().count("\n") == 4  # kept whole, to push again

    # Every record of a request refused: the 422 names only the first reason (x's, for
    # good), while y's record was refused for now; halves are sent until each says its own.
    (spool / SEGMENT).write_text(json.dumps(
        {"kind": "checkpoint", "run_id": "x", "rank": 0, "step": 1000, "time": 1.0,
         "path": "/ckpt/x-1000.pt"}) + "\n" + _steps("y", range(1, 2)))
    with LiveServer(load_settings(data_dir=tmp_path / "d3", max_new_runs_per_request=1)) as srv:
        proc = _cli(str(spool), "--url", srv.url)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 accepted" in proc.stdout and "1 refused" in proc.stdout, proc.stdout
        assert "in the future" in proc.stdout and _stored(srv.url, "y") == [1]
    assert not spool.exists()


def test_only_the_clients_segments_are_deleted(tmp_path: Path):
    mine = tmp_path / "mine"
    mine.mkdir()
    # The user's own NDJSON, none of it a record the sidecar takes.
    own = {"notes.ndjson": '{"kind": "nope"}\n', "run.ndjson": '{"step": 1}\n'}
    for name, text in own.items():
        (mine / name).write_text(text)
    spool = tmp_path / "spool" / "bad-r0"
    spool.mkdir(parents=True)
    (spool / SEGMENT).write_text('{"kind": "step", "run_id": "bad", "step": -5}\n')
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        proc = _cli(str(mine), "--url", srv.url)
        assert proc.returncode == 1 and "not a spool's" in proc.stderr, proc.stderr
        named = _cli(str(mine / "notes.ndjson"), "--url", srv.url)  # named by hand: sent
        assert named.returncode == 0 and "1 refused" in named.stdout, named.stdout
        assert "kept: " in named.stdout and "never deleted" in named.stdout
        # A segment of the client's whose record is refused for good goes, as before.
        segment = _cli(str(spool), "--url", srv.url)
        assert segment.returncode == 0 and "1 refused" in segment.stdout, segment.stdout
    assert {p.name: p.read_text() for p in mine.iterdir()} == own
    assert not spool.exists()


def test_no_link_is_followed(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / SEGMENT).write_text(_steps("victim", range(1, 3)))
    (outside / "important.ndjson").write_text(_steps("victim", range(5, 6)))
    base = tmp_path / "spool"
    run = base / "good-r0"
    run.mkdir(parents=True)
    (run / SEGMENT).write_text(_steps("good", range(1, 4)))
    (run / "000000000002.ndjson").symlink_to(outside / "important.ndjson")
    (base / "evil-r0").symlink_to(outside)  # a run directory that is a link elsewhere
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        proc = _cli(str(base), "--url", srv.url)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _stored(srv.url, "good") == [1, 2, 3] and _stored(srv.url, "victim") == []
        assert "2 skipped" in proc.stdout and "spool removed" not in proc.stdout, proc.stdout
        linked = _cli(str(base / "evil-r0"), "--url", srv.url)
        assert linked.returncode == 1 and "symbolic link" in linked.stderr, linked.stderr
    assert sorted(p.name for p in outside.iterdir()) == [SEGMENT, "important.ndjson"]
    assert (outside / SEGMENT).read_text() == _steps("victim", range(1, 3))
    assert [p.name for p in run.iterdir()] == ["000000000002.ndjson"]  # the link, left


def test_a_fifo_is_skipped_not_waited_on(tmp_path: Path):
    run = tmp_path / "spool" / "good-r0"
    run.mkdir(parents=True)
    (run / SEGMENT).write_text(_steps("good", range(1, 3)))
    os.mkfifo(run / "000000000002.ndjson")  # opened for reading, it waits for a writer
    with LiveServer(load_settings(data_dir=tmp_path / "data")) as srv:
        proc = _cli(str(run), "--url", srv.url)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "1 skipped" in proc.stdout and "FIFO" in proc.stdout, proc.stdout
        assert _stored(srv.url, "good") == [1, 2]
        named = _cli(str(run / "000000000002.ndjson"), "--url", srv.url)
        assert named.returncode == 1 and "is a FIFO" in named.stderr, named.stderr
    assert [p.name for p in run.iterdir()] == ["000000000002.ndjson"]


def test_a_large_segment_is_streamed_not_read_whole(tmp_path: Path):
    """64 MiB of records: the command's peak memory grows by about a batch (2 MiB), not by
    the file (reading it whole, then splitting it, took twice its size)."""
    line = (json.dumps({"kind": "step", "run_id": "big", "step": 0, "time": 1.0,
                        "note": "x" * 8000}) + "\n").encode()
    small, big = tmp_path / "small-r0", tmp_path / "big-r0"
    for directory, size in ((small, len(line)), (big, 64 << 20)):
        directory.mkdir()
        with (directory / SEGMENT).open("wb") as fh:
            for _ in range(size // len(line)):
                fh.write(line)
    with _Counting() as url:
        peaks = {d.name: _peak_rss_mib(str(d), "--url", url) for d in (small, big)}
    assert not big.exists() and not small.exists()
    print(f"peak RSS pushing one record {peaks['small-r0']} MiB, 64 MiB {peaks['big-r0']} MiB")
    assert peaks["big-r0"] - peaks["small-r0"] < 24, peaks


class _Counting:
    """A stand-in sidecar (plain HTTP) that accepts every line it is sent: what is measured
    here is the command's memory, not the sidecar's."""

    def __enter__(self) -> str:
        import gzip
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
                answer = json.dumps({"accepted": body.count(b"\n"), "duplicates": 0,
                                     "rejected": []}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _peak_rss_mib(*args: str) -> int:
    """The command's peak RSS, from a parent that runs nothing else."""
    code = textwrap.dedent(f"""
        import resource, subprocess, sys
        proc = subprocess.run([sys.executable, "-m", "monitor_agent", "push-spool",
                               *{list(args)!r}], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "client")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)
