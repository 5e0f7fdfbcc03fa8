"""Issue 30's proof on real parts: one run, one brain.

A 4-rank gloo job launched as users launch a multi-node job: two ``torchrun`` "nodes" of two
ranks each on loopback (``--nnodes 2 --node-rank N``), every rank's real client posting to
its own node's sidecar (a real ``monitor-agent serve`` subprocess each), both sidecars with
the same config (the shipped alert rules plus a rollback rule, one Slack-protocol receiver)
except what the docs ask of a node sidecar whose leader is not on ``MASTER_ADDR`` at its
own port: ``cluster.leader_url`` (here ``MONITOR_AGENT_CLUSTER__LEADER_URL``). Node 0's
sidecar leads the run; node 1's forwards to it.

For each fault of the issue's table the receiver gets exactly one page about the run, from
the leader, naming the right rank, frame, host and cause, and the job exits 0. Then the
leader is SIGKILLed in the middle of a run: node 1's sidecar pages the fault itself, saying
its view is partial, and the leader, restarted, catches up without paging it again.

One sidecar pair serves the module (each scenario its own run id); the kill scenario comes
last and leaves the leader running again. No timing assertions: each step waits for what it
expects, with a deadline.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from receivers import Received, Receiver
from sidecar_process import REPO, SidecarProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

E2E = Path(__file__).resolve().parent
NODES, PER_NODE = 2, 2
ROLLBACK_RULE = {"name": "RollbackOnDivergence", "match": {"types": ["divergence"]},
                 "severity": "critical", "fingerprint": [], "action": "rollback",
                 "rollback_skip_margin": 20, "rollback_budget": 2}


# -- the two nodes' sidecars ---------------------------------------------------------------


@dataclass
class Pair:
    """Node 0's sidecar (the run's leader), node 1's, and the one Slack receiver both page
    (each on a webhook path of its own, so a page says which sidecar sent it)."""

    leader: SidecarProcess
    node: SidecarProcess
    slack: Receiver
    tmp: Path

    @property
    def sidecars(self) -> tuple[SidecarProcess, SidecarProcess]:
        return self.leader, self.node

    def messages(self, run_id: str) -> list[Received]:
        return [r for r in self.slack.accepted()
                if r.json and f"run {run_id}:" in str(r.json.get("text", ""))]

    def pages(self, run_id: str, alertname: str | None = None) -> list[Received]:
        """The firing messages about ``run_id`` (of ``alertname``), as received."""
        return [r for r in self.messages(run_id) if "[FIRING:" in r.json["text"]
                and (alertname is None or alertname in r.json["text"])]


def sender(page: Received) -> str:
    return page.path.rsplit("/", 1)[-1]


def text(page: Received) -> str:
    """A Slack message's words: its title and every block's text."""
    out = [page.json.get("text", "")]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("text"), str):
                out.append(node["text"])
            for v in node.values():
                if not isinstance(v, str):
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(page.json.get("blocks") or [])
    return "\n".join(out)


def _config(tmp: Path, slack: Receiver, node: int) -> Path:
    shipped = yaml.safe_load((REPO / "monitor_agent" / "default_rules.yaml").read_text())
    shipped["rules"].insert(0, ROLLBACK_RULE)
    rules = tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump(shipped, sort_keys=False))
    config = tmp / f"config-node{node}.yaml"
    config.write_text(
        "tick_interval_seconds: 0.5\n"
        "alerting:\n"
        f"  rules_file: {rules}\n"
        "  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/node{node}', "
        "min_interval_seconds: 0}\n")
    return config


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("one-brain")
    with Receiver("slack") as slack:
        leader = SidecarProcess(tmp / "leader", config=_config(tmp, slack, 0))
        node = SidecarProcess(tmp / "node1", config=_config(tmp, slack, 1),
                              env={"MONITOR_AGENT_CLUSTER__LEADER_URL": leader.url})
        try:
            leader.start()
            node.start()
            yield Pair(leader, node, slack, tmp)
        finally:
            node.stop()
            leader.stop()


# -- the job -------------------------------------------------------------------------------


@dataclass
class Job:
    run_id: str
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    def wait(self, timeout: float = 240.0) -> None:
        """Both nodes' torchrun exit 0 (no deadlock, no rank failed)."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{self.run_id}: the job did not finish (deadlock?)\n"
                                     + self.output()) from None
        assert [p.returncode for p in self.procs] == [0, 0], self.output()

    def kill(self) -> None:
        for proc in self.procs:  # each node's session: its agent and its ranks
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def output(self) -> str:
        return "\n".join(f"--- node {n} ---\n" + log.read_text(errors="replace")[-6000:]
                         for n, log in enumerate(self.logs))


@contextlib.contextmanager
def torchrun(pair: Pair, run_id: str, script: str, *args: str) -> Iterator[Job]:
    """The job's two nodes, each ``torchrun --nnodes 2 --nproc-per-node 2 --node-rank N``
    on loopback, its ranks posting to their node's sidecar (``{url}`` in ``args``)."""
    port, work = free_port(), pair.tmp / run_id
    work.mkdir()
    procs, logs = [], []
    for node, sc in enumerate(pair.sidecars):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NODE_NAME": f"gpu-node-{node}",
               "MONITOR_AGENT_URL": sc.url,
               "MONITOR_AGENT_SPOOL_DIR": str(work / f"spool-node{node}"),
               "PYTHONPATH": os.pathsep.join([str(REPO / "client"), str(REPO),
                                              os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES),
               "--nproc-per-node", str(PER_NODE), "--node-rank", str(node),
               "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0",
               str(E2E / script), *(a.format(url=sc.url, work=work) for a in args)]
        logs.append(work / f"node{node}.log")
        with logs[-1].open("wb") as log:
            procs.append(subprocess.Popen(cmd, env=env, cwd=work, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True))
    job = Job(run_id, procs, logs)
    try:
        yield job
    finally:
        job.kill()


# -- waiting for the sidecars --------------------------------------------------------------


def wait_until(what: str, cond: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(httpx.HTTPError):
            got = cond()
            if got:
                return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def get(sc: SidecarProcess, path: str, **params: Any) -> Any:
    r = httpx.get(sc.url + path, params=params, timeout=10)
    r.raise_for_status()
    return r.json()


def findings(sc: SidecarProcess, run_id: str, ftype: str) -> list[dict[str, Any]]:
    body = get(sc, f"/v1/runs/{run_id}/findings", limit=10000)
    return [f for f in body["findings"] if f["type"] == ftype]


def _queued(sc: SidecarProcess) -> float:
    for line in httpx.get(sc.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("monitor_agent_uplink_queued "):
            return float(line.split()[1])
    return 0.0


def _delivered(sc: SidecarProcess, run_id: str) -> bool:
    alerts = get(sc, "/v1/alerts", run_id=run_id)["alerts"]
    return all(d["state"] != "pending" for a in alerts for d in a["delivery"].values())


def settled(pair: Pair, run_id: str) -> None:
    """Wait until nothing more about ``run_id`` is on its way: the leader has the run's end,
    node 1 owes it nothing, and every notification of either sidecar is out."""
    def quiet() -> bool:
        run = get(pair.leader, f"/v1/runs/{run_id}")
        return (run["status"] != "running" and _queued(pair.node) == 0
                and all(_delivered(sc, run_id) for sc in pair.sidecars))
    wait_until(f"{run_id} settled", quiet)


def alertnames(page: Received) -> list[str]:
    """``[FIRING:2] run r: A, B`` -> ``["A", "B"]``."""
    return page.json["text"].splitlines()[0].split(": ")[-1].split(", ")


def one_page(pair: Pair, run_id: str, alertname: str, besides: tuple[str, ...] = ()) -> str:
    """The text of the one message that pages ``alertname`` about the run. Every message
    about the run comes from the leader, and none pages anything but ``alertname`` and the
    ``besides`` alerts the same fault also raises."""
    settled(pair, run_id)
    pages = pair.pages(run_id)
    print(f"\n{run_id}: {len(pages)} message(s)\n" + "\n\n".join(
        f"from {sender(p)}: {text(p)}" for p in pages))
    assert {sender(p) for p in pages} == {"node0"}, [(sender(p), text(p)) for p in pages]
    found = [p for p in pages if alertname in alertnames(p)]
    assert len(found) == 1, [text(p) for p in pages]
    others = {a for p in pages for a in alertnames(p)} - {alertname, *besides}
    assert not others, [text(p) for p in pages]
    return text(found[0])


# -- the fault table -----------------------------------------------------------------------


def test_nan_on_rank_2_pages_once_naming_it_and_its_node(pair):
    run_id = "brain-nan"
    with torchrun(pair, run_id, "ddp_rank_fault_train.py", "--url", "{url}", "--run-id",
                  run_id, "--steps", "12", "--nan-rank", "2", "--nan-step", "8") as job:
        job.wait()
    page = one_page(pair, run_id, "TrainingNanInf")
    assert ("NaN first on rank 2 (host gpu-node-1) at step 8: its local loss is nan; "
            "ranks 0, 1, 3 followed at step 8 through the gradient all-reduce") in page, page
    assert "partial view" not in page
    [onset, *_] = sorted(findings(pair.leader, run_id, "nan_inf"), key=lambda f: f["step"])
    assert (onset["rank"], onset["evidence"]["first_host"]) == (2, "gpu-node-1")


def test_a_rank_blocked_before_all_reduce_is_one_hang_page(pair):
    run_id = "brain-hang"
    with torchrun(pair, run_id, "hang_user_train.py", "{url}", run_id, "block:3",
                  "{work}") as job:
        wait_until("the hang page", lambda: pair.pages(run_id, "TrainingHung"))
        (pair.tmp / run_id / "release").write_text("go")
        job.wait()
    page = one_page(pair, run_id, "TrainingHung")
    assert "rank 3 stuck" in page and "hang_user_train.py:wait_for_release" in page, page
    assert "ranks 0-2 wait in torch/distributed/distributed_c10d.py:all_reduce" in page, page


def test_a_corrupt_shard_on_rank_1_is_one_outlier_warning(pair):
    run_id = "brain-shard"
    with torchrun(pair, run_id, "ddp_rank_fault_train.py", "--url", "{url}", "--run-id",
                  run_id, "--steps", "120", "--corrupt-rank", "1", "--corrupt-from", "20",
                  "--corrupt-steps", "100", "--corrupt-shuffle", "--step-time", "0.02") as job:
        job.wait()
    page = one_page(pair, run_id, "TrainingRankOutlier")
    assert "rank 1 (host gpu-node-0): local loss" in page, page
    assert {f["rank"] for f in findings(pair.leader, run_id, "rank_outlier")} == {1}


def test_a_slow_loader_on_rank_2_is_one_straggler_page(pair):
    run_id = "brain-slow"
    with torchrun(pair, run_id, "slow_loader_ddp.py", "--url", "{url}", "--run-id", run_id,
                  "--slow-ranks", "2", "--steps", "40", "--delay", "0.3") as job:
        job.wait()
    page = one_page(pair, run_id, "TrainingStraggler")
    assert "rank 2 is the straggler: its data loading takes" in page, page


# -- one decision for every rank: the rollback -----------------------------------------------

# The script's own pace (step_delay 0.05 s): a plan decided on node 1's finding reaches the
# ranks through their clients' action poll (every 5 s) and the next agreed call (every 10
# steps); the 135 steps after the fault leave it time to.
STEPS, POISON_FROM, POISON_LEN, CKPT_EVERY = 200, 65, 12, 10
# Warnings the poisoned stretch raises besides the divergence, each from the leader: the loss
# spike that starts it and the ranks whose loss leaves the others' meanwhile.
ROLLBACK_ALSO = ("TrainingLossSpike", "TrainingRankOutlier")


def _rollback_args(run_id: str, *extra: str) -> tuple[str, ...]:
    return ("--url={url}", f"--run_id={run_id}", "--out_dir={work}/out", f"--steps={STEPS}",
            f"--ckpt_every={CKPT_EVERY}", f"--poison_from={POISON_FROM}",
            f"--poison_len={POISON_LEN}", *extra)


def _trained(out: Path, rank: int) -> tuple[list[tuple[int, int]], list[tuple[int, ...]]]:
    """(step, batch) pairs the rank trained on, in order, and the rollbacks it applied:
    (steps trained before it, plan id, checkpoint step, skip_to)."""
    trained: list[tuple[int, int]] = []
    rollbacks: list[tuple[int, ...]] = []
    for line in (out / f"batches-r{rank}.log").read_text().splitlines():
        words = line.split()
        if words[0] == "rollback":
            rollbacks.append((len(trained), *map(int, words[1:])))
        else:
            trained.append((int(words[0]), int(words[1])))
    return trained, rollbacks


def _weights(out: Path) -> set[str]:
    return {(out / f"weights-r{r}.txt").read_text() for r in range(NODES * PER_NODE)}


def _one_rollback(pair: Pair, run_id: str) -> dict[str, Any]:
    """The one plan, the same on both sidecars, applied by all four ranks at the same
    step of the abandoned branch, the resumed branch past the window to the end, one model."""
    settled(pair, run_id)
    for sc in pair.sidecars:  # what each sidecar knows of the decision, for the log
        held = [r for r in sc.records(run_id) if r["kind"] == "agreement"]
        print(f"\n{run_id} on {sc.url}: actions "
              f"{get(sc, f'/v1/runs/{run_id}/actions')['actions']}; agreement records {held}")
    actions = get(pair.leader, f"/v1/runs/{run_id}/actions")["actions"]
    assert [a["action"] for a in actions] == ["rollback"], actions
    [action] = actions
    adopted = get(pair.node, f"/v1/runs/{run_id}/actions")["actions"]
    assert [(a["id"], a["plan"]) for a in adopted] == [(action["id"], action["plan"])]
    plan, out = action["plan"], pair.tmp / run_id / "out"
    applied = {r: _trained(out, r) for r in range(NODES * PER_NODE)}
    for rank, (trained, rollbacks) in applied.items():
        assert [r[1:] for r in rollbacks] == [
            (action["id"], plan["checkpoint_step"], plan["skip_to"])], (rank, rollbacks)
        after = trained[rollbacks[0][0]:]
        c, skip_to = plan["checkpoint_step"], plan["skip_to"]
        assert [s for s, _ in after] == list(range(c + 1, STEPS + 1)), rank
        assert after[0][1] == skip_to + 1 and not [
            b for _, b in after if b <= skip_to or POISON_FROM <= b < POISON_FROM + POISON_LEN]
    # The same step of the abandoned branch on every rank: one decision, no split.
    assert len({rollbacks[0][0] for _, rollbacks in applied.values()}) == 1, applied
    assert len(_weights(out)) == 1, "the ranks' weights differ after the rollback"
    run = get(pair.leader, f"/v1/runs/{run_id}")
    assert run["status"] == "completed" and run["verdict"]["state"] == "healthy", run
    return action


def test_a_divergence_rolls_all_four_ranks_back_at_one_step_rank_0_reporting_saves(pair):
    run_id = "brain-rollback"
    with torchrun(pair, run_id, "rollback_user_train.py", *_rollback_args(run_id)) as job:
        job.wait()
    action = _one_rollback(pair, run_id)
    plan = action["plan"]
    page = one_page(pair, run_id, "RollbackOnDivergence", besides=ROLLBACK_ALSO)
    assert (f"rolled back to step {plan['checkpoint_step']} ({plan['checkpoint_path']}), "
            f"skipping batches {plan['skip_from']}-{plan['skip_to']}") in page, page


def test_only_node_1_corrupt_every_rank_reporting_saves_is_one_plan_for_the_job(pair):
    run_id = "brain-rollback-node1"
    with torchrun(pair, run_id, "rollback_user_train.py",
                  *_rollback_args(run_id, "--save_on=all", "--poison_ranks=2,3")) as job:
        job.wait()
    action = _one_rollback(pair, run_id)
    one_page(pair, run_id, "RollbackOnDivergence", besides=ROLLBACK_ALSO)
    ledger = get(pair.leader, f"/v1/runs/{run_id}/checkpoints")["checkpoints"]
    assert {c["path"] for c in ledger} >= {action["plan"]["checkpoint_path"]}


# -- the leader SIGKILLed mid-run ----------------------------------------------------------


def _at_step(sc: SidecarProcess, run_id: str, step: int) -> bool:
    """Whether ``sc`` holds step ``step`` of all four ranks."""
    return {r["rank"] for r in sc.records(run_id, since_step=step - 1)
            if r["kind"] == "step" and r["step"] == step} == set(range(NODES * PER_NODE))


def _partial(page: str, pair: Pair) -> None:
    assert f"[partial view: the run's leader {pair.leader.url} has not answered for" in page, \
        page


def test_leader_killed_before_a_nan_node_1_pages_it_partially_and_no_page_twice(pair):
    run_id, steps = "brain-nan-kill", 14
    work = pair.tmp / run_id
    with torchrun(pair, run_id, "ddp_rank_fault_train.py", "--url", "{url}", "--run-id",
                  run_id, "--steps", str(steps), "--nan-rank", "2", "--nan-step", "10",
                  "--pause-at", "6", "--pause-file", "{work}/go", "--hold-file",
                  "{work}/end") as job:
        wait_until("the leader to hear every rank", lambda: _at_step(pair.leader, run_id, 5))
        pair.leader.kill()
        (work / "go").write_text("go")
        [page] = wait_until("node 1's own NaN page",
                            lambda: pair.pages(run_id, "TrainingNanInf"))
        assert sender(page) == "node1"
        pair.leader.start()  # on its data dir and port, as a restarted Pod's sidecar
        wait_until("the leader to catch up", lambda: _at_step(pair.leader, run_id, steps))
        (work / "end").write_text("end")
        job.wait()
    page = one_page(pair, run_id, "TrainingNanInf")
    _partial(page, pair)
    assert "NaN first on rank 2 (host gpu-node-1) at step 10: its local loss is nan" in page
    # The leader kept the node's page as sent: its alert fires, and it paged nothing itself.
    alerts = get(pair.leader, "/v1/alerts", run_id=run_id)["alerts"]
    assert [a["alertname"] for a in alerts if a["state"] == "firing"] == ["TrainingNanInf"]


def test_leader_killed_before_a_divergence_no_rank_acts_and_the_job_ends(pair):
    run_id = "brain-rollback-kill"
    work = pair.tmp / run_id
    with torchrun(pair, run_id, "rollback_user_train.py", *_rollback_args(
            run_id, "--pause_at=50", "--pause_file={work}/go",
            "--hold_file={work}/end")) as job:
        wait_until("the leader to hear every rank", lambda: _at_step(pair.leader, run_id, 49))
        pair.leader.kill()
        (work / "go").write_text("go")
        wait_until("node 1's own divergence page",
                   lambda: pair.pages(run_id, "RollbackOnDivergence"))
        wait_until("the job to finish training", lambda: len(_weights_done(work / "out")) == 4)
        pair.leader.start()
        wait_until("the leader to catch up", lambda: _at_step(pair.leader, run_id, STEPS))
        (work / "end").write_text("end")
        job.wait()
    page = one_page(pair, run_id, "RollbackOnDivergence", besides=ROLLBACK_ALSO)
    _partial(page, pair)
    assert "rolled back" not in page, page
    out = work / "out"
    assert [_trained(out, r)[1] for r in range(NODES * PER_NODE)] == [[]] * 4
    assert len(_weights(out)) == 1
    for sc in pair.sidecars:
        assert get(sc, f"/v1/runs/{run_id}/actions")["actions"] == [], sc.url


def _weights_done(out: Path) -> list[Path]:
    return list(out.glob("weights-r*.txt"))
