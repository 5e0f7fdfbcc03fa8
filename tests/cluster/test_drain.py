"""This node drained by its leader's decision (cluster/drain.py), on real parts: the state
in the data directory and in the file Node Problem Detector's plugin reads, and the
operator's command or ``scontrol`` run as real processes (a script stands in for each,
writing what it was given). The whole path through three sidecars is in
test_exclude_node.py."""

from __future__ import annotations

import json
import logging
import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from monitor_agent.cluster.drain import DRAIN_FILE, Drained, DrainSettings, NodeDrain, reason_of
from tests.eventually import eventually

WHY = "hard GPU error (xid 79) at step 200"
REASON = f"monitor-agent run job-7 action 3: {WHY}"


def _recorder(out: Path, code: int = 0, stderr: str = "", stdout: str = "") -> list[str]:
    """A command that writes its argv and the drain's environment to ``out``, then says
    ``stdout``/``stderr`` and exits ``code``."""
    script = ("import json, os, sys; json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v "
              "in os.environ.items() if k.startswith('MONITOR_AGENT_DRAIN_')}}, "
              f"open({str(out)!r}, 'w')); sys.stdout.write({stdout!r}); "
              f"sys.stderr.write({stderr!r}); sys.exit({code})")
    return [sys.executable, "-c", script]


def _of(drain: NodeDrain) -> Drained:
    state = drain.state()
    assert state is not None, "not drained"
    return state


def _threads() -> list[threading.Thread]:
    """The drains' command threads running (cluster/drain.py names them); a thread another
    test of this process left behind is not a drain's."""
    return [t for t in threading.enumerate() if t.name == "node-drain"]


def _settled(drain: NodeDrain) -> Drained:
    """The state once the command's outcome is in; at once an error if the drain's thread
    ended and left it pending (a crash there would show only as the wait's timeout)."""
    def done() -> Drained:
        running = _threads()
        state = drain.state()  # read after: a thread seen ended has written what it would
        if state is None or (state.outcome == "pending" and not running):
            raise RuntimeError(f"the drain's thread ended and left {state}")
        assert state.outcome != "pending"
        return state
    return eventually(done, what="the drain command's outcome")


def test_a_drain_is_kept_across_a_restart_of_the_sidecar_until_the_node_is_repaired(
        tmp_path: Path):
    changes: list[bool] = []
    drain = NodeDrain(DrainSettings(node_name="gpu-node-2"), tmp_path, clock=lambda: 1000.0,
                      on_change=changes.append)
    assert drain.state() is None and changes == [False]
    assert drain.drain("job-7", 3, WHY)
    kept = Drained("job-7", 3, REASON, 1000.0, "none", "recorded")
    assert drain.state() == kept and changes == [False, True]
    again = NodeDrain(DrainSettings(node_name="gpu-node-2"), tmp_path, on_change=changes.append)
    assert again.state() == kept and changes[-1] is True  # /metrics says so from the start
    assert again.clear() and again.state() is None and changes[-1] is False
    assert not (tmp_path / DRAIN_FILE).exists()
    assert not again.clear()  # not drained: nothing to clear
    assert NodeDrain(DrainSettings(), tmp_path).state() is None


def test_the_sidecars_log_says_when_its_node_is_left_out_and_back_in_service(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    drain = NodeDrain(DrainSettings(node_name="gpu-node-2",
                                    state_file=str(tmp_path / "run" / "node.json")), tmp_path)
    with caplog.at_level(logging.INFO, logger="monitor_agent.cluster.drain"):
        assert not drain.clear()  # never drained: no file to remove, nothing to say
        drain.drain("job-7", 3, WHY)
        drain.clear()
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, f"node gpu-node-2 left out of run job-7 (action 3): {WHY}; drain "
                          "mode none"),
        (logging.WARNING, "node gpu-node-2 back in service (was left out of run job-7, "
                          "action 3)")]


def test_the_same_action_drains_once_another_drains_anew(tmp_path: Path):
    drain = NodeDrain(DrainSettings(), tmp_path)
    assert drain.drain("job-7", 3, WHY) and not drain.drain("job-7", 3, WHY)
    assert drain.drain("job-7", 4, WHY) and _of(drain).action_id == 4
    assert drain.drain("job-8", 4, WHY) and _of(drain).run_id == "job-8"


def test_what_get_v1_node_answers(tmp_path: Path):
    drain = NodeDrain(DrainSettings(node_name="gpu-node-2"), tmp_path, clock=lambda: 1000.0)
    assert drain.to_dict() == {"node_name": "gpu-node-2", "drained": False, "mode": "none"}
    drain.drain("job-7", 3, WHY)
    assert drain.to_dict() == {"node_name": "gpu-node-2", "drained": True, "mode": "none",
                               "run_id": "job-7", "action_id": 3, "reason": REASON,
                               "at": 1000.0, "outcome": "recorded"}


def test_the_node_is_named_by_its_short_hostname_unless_configured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import socket

    monkeypatch.setattr(socket, "gethostname", lambda: "gpu-node-2.cluster.example.com")
    assert NodeDrain(DrainSettings(), tmp_path).node_name == "gpu-node-2"
    assert NodeDrain(DrainSettings(node_name="n2"), tmp_path).node_name == "n2"


def test_the_state_file_says_it_where_node_problem_detector_reads_it_and_goes_when_cleared(
        tmp_path: Path):
    state = tmp_path / "var" / "run" / "monitor-agent" / "node.json"  # made as needed
    drain = NodeDrain(DrainSettings(node_name="gpu-node-2", state_file=str(state)),
                      tmp_path / "data", clock=lambda: 1000.0)
    drain.drain("job-7", 3, WHY)
    said = {"node_name": "gpu-node-2", "drained": True, "run_id": "job-7", "action_id": 3,
            "reason": REASON, "at": 1000.0, "mode": "none", "outcome": "recorded"}
    assert json.loads(state.read_text()) == said
    assert json.loads((tmp_path / "data" / DRAIN_FILE).read_text()) == said
    assert not list(state.parent.glob("*.tmp"))  # written whole, then moved in place
    drain.clear()
    assert not state.exists()


def test_a_state_file_that_cannot_be_written_does_not_stop_the_drain_the_data_dir_does(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the state file's folder should be")
    drain = NodeDrain(DrainSettings(state_file=str(blocked / "node.json")), tmp_path / "data")
    with caplog.at_level(logging.ERROR, logger="monitor_agent.cluster.drain"):
        assert drain.drain("job-7", 3, WHY)
    assert drain.state() is not None and (tmp_path / "data" / DRAIN_FILE).exists()
    [said] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert said.startswith(f"cannot write the drain state file {blocked / 'node.json'}: "
                           "FileExistsError(17, ")
    unwritable = NodeDrain(DrainSettings(), blocked / "data")
    with pytest.raises(OSError):
        unwritable.drain("job-7", 3, WHY)


@pytest.mark.parametrize("text", ["{not json", '{"run_id": "job-7"}',
                                  '{"run_id": "job-7", "action_id": "three", "reason": "r", '
                                  '"at": 1, "mode": "none"}', "[]"])
def test_a_damaged_drain_file_reads_as_not_drained(tmp_path: Path, text: str):
    (tmp_path / DRAIN_FILE).write_text(text)
    assert NodeDrain(DrainSettings(), tmp_path).state() is None


def test_a_drain_file_of_an_older_sidecar_reads_with_what_it_says(tmp_path: Path):
    long = "x" * 300
    (tmp_path / DRAIN_FILE).write_text(json.dumps(
        {"run_id": 7, "action_id": "3", "reason": long, "at": "1000", "mode": "slurm"}))
    assert NodeDrain(DrainSettings(), tmp_path).state() == Drained(
        "7", 3, "x" * 200, 1000.0, "slurm", "")


def test_mode_none_runs_nothing_even_with_a_command_configured(tmp_path: Path):
    out = tmp_path / "ran.json"
    drain = NodeDrain(DrainSettings(mode="none", command=_recorder(out)), tmp_path)
    drain.drain("job-7", 3, WHY)
    eventually(lambda: not _threads(), what="no command running")
    assert not out.exists() and _of(drain).outcome == "recorded"


def test_the_operators_command_runs_with_the_decision_in_its_environment(tmp_path: Path):
    out = tmp_path / "ran.json"
    drain = NodeDrain(DrainSettings(mode="command", command=[*_recorder(out), "--now"],
                                    node_name="gpu-node-2"), tmp_path)
    assert drain.drain("job-7", 3, WHY)
    assert _of(drain).outcome in ("pending", "done")
    assert _settled(drain).outcome == "done"
    assert json.loads(out.read_text()) == {"argv": ["--now"], "env": {
        "MONITOR_AGENT_DRAIN_NODE": "gpu-node-2", "MONITOR_AGENT_DRAIN_REASON": REASON,
        "MONITOR_AGENT_DRAIN_RUN": "job-7"}}
    # The outcome is kept with the drain.
    assert _of(NodeDrain(DrainSettings(), tmp_path)).outcome == "done"


@pytest.mark.parametrize("said,outcome", [
    ({"code": 3, "stderr": "  no such node\n", "stdout": "ignored"},
     "failed: exit 3: no such node"),
    ({"code": 1, "stdout": "permission denied"}, "failed: exit 1: permission denied"),
    ({"code": 2, "stderr": "e" * 400}, "failed: exit 2: " + "e" * 300)])
def test_a_failing_command_is_said_with_its_exit_status_and_what_it_printed(
        tmp_path: Path, said: dict, outcome: str, caplog: pytest.LogCaptureFixture):
    drain = NodeDrain(DrainSettings(mode="command", command=_recorder(tmp_path / "o", **said),
                                    node_name="gpu-node-2"), tmp_path)
    with caplog.at_level(logging.INFO, logger="monitor_agent.cluster.drain"):
        drain.drain("job-7", 3, WHY)
        assert _settled(drain).outcome == outcome
    # Logged before the outcome is kept: there already.
    assert [(r.levelno, r.getMessage()) for r in caplog.records][-1] == (
        logging.ERROR, f"drain of node gpu-node-2 ({sys.executable} -c): {outcome}")


def test_a_command_that_cannot_run_or_runs_too_long_fails_saying_why(tmp_path: Path):
    missing = NodeDrain(DrainSettings(mode="command", command=[str(tmp_path / "no-such")]),
                        tmp_path / "a")
    missing.drain("job-7", 3, WHY)
    assert _settled(missing).outcome.startswith("failed: FileNotFoundError: ")
    long = "import time; time.sleep(20)  # " + "x" * 400  # its error names the argv
    slow = NodeDrain(DrainSettings(mode="command", timeout_seconds=0.2,
                                   command=[sys.executable, "-c", long]), tmp_path / "b")
    slow.drain("job-7", 3, WHY)
    said = _settled(slow).outcome
    assert said.startswith("failed: TimeoutExpired: Command ")
    assert len(said) == len("failed: TimeoutExpired: ") + 300  # the error, cut short


def test_slurm_mode_asks_scontrol_to_drain_this_node_with_the_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture):
    out = tmp_path / "scontrol.json"
    scontrol = tmp_path / "bin" / "scontrol"
    scontrol.parent.mkdir()
    scontrol.write_text(f"#!{sys.executable}\n" + _recorder(out)[2].replace("; ", "\n"))
    scontrol.chmod(scontrol.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{scontrol.parent}{os.pathsep}{os.environ['PATH']}")
    drain = NodeDrain(DrainSettings(mode="slurm", node_name="gpu-node-2"), tmp_path)
    with caplog.at_level(logging.INFO, logger="monitor_agent.cluster.drain"):
        drain.drain("job-7", 3, f"{WHY}; $(reboot)")
        assert _settled(drain).outcome == "done"
    assert json.loads(out.read_text())["argv"] == [
        "update", "NodeName=gpu-node-2", "State=DRAIN", f"Reason={REASON} (reboot)"]
    assert [(r.levelno, r.getMessage()) for r in caplog.records][-1] == (
        logging.INFO, "drain of node gpu-node-2 (scontrol update): done")


def test_a_drain_cleared_or_replaced_while_its_command_runs_keeps_the_newer_state(
        tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """Run job-7's command waits until told to end; job-8's, the drain that replaced it
    (an action of the same id), ends at once. Job-7's outcome, last in, is not job-8's."""
    go = tmp_path / "go"
    wait = [sys.executable, "-c", "import os, time\n"
            "if os.environ['MONITOR_AGENT_DRAIN_RUN'] == 'job-7':\n"
            f"    for _ in range(3000):\n        if os.path.exists({str(go)!r}): break\n"
            "        time.sleep(0.01)\n"
            "    raise SystemExit(5)"]
    drain = NodeDrain(DrainSettings(mode="command", command=wait), tmp_path)
    with caplog.at_level(logging.INFO, logger="monitor_agent.cluster.drain"):
        drain.drain("job-7", 3, WHY)
        drain.clear()
        drain.drain("job-8", 3, WHY)
        assert _settled(drain).outcome == "done"
        go.write_text("")
        eventually(lambda: not _threads(), what="job-7's command ended")
    assert [r.getMessage() for r in caplog.records][-1].endswith("-c): failed: exit 5: ")
    assert (_of(drain).run_id, _of(drain).outcome) == ("job-8", "done")
    assert _of(NodeDrain(DrainSettings(), tmp_path)) == _of(drain)


def test_the_reason_is_short_plain_text_whatever_the_decision_said():
    assert reason_of("job-7", 3, WHY) == REASON
    assert reason_of("job-7", 3, "a  `rm -rf /`;\n  b | c & d > e") == (
        "monitor-agent run job-7 action 3: a rm -rf / b c d e")
    assert reason_of("job-7", 3, "x" * 500) == (REASON[:REASON.index(":") + 2] + "x" * 500)[:200]
    assert reason_of("job-7", 3, "a=b+c, (d/e) f.g_h-i").endswith(": a=b+c, (d/e) f.g_h-i")
