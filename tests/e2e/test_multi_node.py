"""Issue 30's proof on real parts: one run, one brain.

A 4-rank gloo job launched as users launch a multi-node job: two ``torchrun`` "nodes" of two
ranks each on loopback (``--nnodes 2 --node-rank N``), every rank's real client posting to
its own node's sidecar (a real ``monitor-agent serve`` subprocess each). Both sidecars have
the same config (the shipped alert rules, with a rollback rule for divergence in place of
``TrainingDivergence``; the same token; one Slack-protocol receiver, each sidecar on a
webhook path of its own so a page says who sent it) plus what the docs ask of a node
sidecar whose leader is not on ``MASTER_ADDR`` at its own port:
``MONITOR_AGENT_CLUSTER__LEADER_URL``. Node 0's sidecar leads; node 1's forwards to it.

For each fault of the issue's table the receiver gets exactly one page about the run, from
the leader, naming the right rank, frame, host and cause; a rollback is one plan that all
four ranks apply at the same step, ending with one model; every job exits 0. Then the leader
is SIGKILLed in the middle of two jobs (a NaN, a divergence): node 1's sidecar pages each
fault itself, saying its view is partial, no rank acts, and the leader, restarted, catches
up without paging again.

One sidecar pair serves the module (each scenario its own run id). The leader-up scenarios'
jobs run three at a time; the kill comes last and leaves the leader running again. No
timing assertions: each step waits for what it expects, with a deadline.
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

from tests.eventually import eventually, scaled
from tests.receivers import Received, Receiver
from tests.sidecar_process import REPO, SidecarProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

E2E = Path(__file__).resolve().parent
NODES, PER_NODE = 2, 2
TOKEN = "one-brain-e2e-token-0123456789"
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
    shipped["rules"] = [ROLLBACK_RULE if r["name"] == "TrainingDivergence" else r
                        for r in shipped["rules"]]
    rules = tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump(shipped, sort_keys=False))
    config = tmp / f"config-node{node}.yaml"
    config.write_text(
        "tick_interval_seconds: 0.5\n"
        f"token: {TOKEN}\n"  # the same on every node: the leader takes node 1's digests
        # The leader is lost after 3 s of silence, stretched as every wait of the suite: on
        # a shared 2-core machine a loaded leader up all along answered an exchange in over
        # 3 s, and node 1 rightly paged a partial view the "one brain" checks then counted.
        f"cluster: {{peer_timeout_seconds: {scaled(3.0)}}}\n"
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


# What a gloo job may print when a rank's process aborts while the interpreter exits.
EXIT_ABORT = "terminate called without an active exception"


@dataclass
class Job:
    run_id: str
    procs: list[subprocess.Popen[bytes]]
    logs: list[Path]

    def wait(self, timeout: float = 240.0, done: str | None = None) -> None:
        """Both nodes' torchrun exit 0 (no deadlock, no rank failed), or, given the line
        ``done`` that the script prints once it has trained and closed its Monitor and its
        process group, that line followed by gloo's abort at interpreter exit (torch's
        teardown race, pytorch#190489), which takes the other node's torchrun down too."""
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{self.run_id}: the job did not finish (deadlock?)\n"
                                     + self.output()) from None
        codes, said = [p.returncode for p in self.procs], self.output()
        aborted_at_exit = done is not None and any(
            done in text and EXIT_ABORT in text.split(done, 1)[1]
            for text in said.split("--- node ")[1:])
        assert codes == [0, 0] or aborted_at_exit, said

    def kill(self) -> None:
        for proc in self.procs:  # each node's session: its agent and its ranks
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def output(self) -> str:
        return "\n".join(f"--- node {n} ---\n" + log.read_text(errors="replace")[-6000:]
                         for n, log in enumerate(self.logs))


def launch(pair: Pair, run_id: str, script: str, *args: str) -> Job:
    """The job's two nodes, each ``torchrun --nnodes 2 --nproc-per-node 2 --node-rank N``
    on loopback, its ranks posting to their node's sidecar (``{url}`` in ``args``; ``{work}``
    is the job's own directory)."""
    port, work = free_port(), pair.tmp / run_id
    work.mkdir()
    procs, logs = [], []
    for node, sc in enumerate(pair.sidecars):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NODE_NAME": f"gpu-node-{node}",
               "MONITOR_AGENT_URL": sc.url, "MONITOR_AGENT_TOKEN": TOKEN,
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
    return Job(run_id, procs, logs)


@contextlib.contextmanager
def torchrun(pair: Pair, run_id: str, script: str, *args: str) -> Iterator[Job]:
    """``launch``, killed on the way out whatever happened."""
    job = launch(pair, run_id, script, *args)
    try:
        yield job
    finally:
        job.kill()


# -- waiting for the sidecars --------------------------------------------------------------


# A sidecar of the pair may be restarting: its refused connections are retried.
SIDECAR_DOWN = (httpx.HTTPError,)


def get(sc: SidecarProcess, path: str, **params: Any) -> Any:
    r = httpx.get(sc.url + path, params=params, timeout=10)
    r.raise_for_status()
    return r.json()


def findings(sc: SidecarProcess, run_id: str, ftype: str) -> list[dict[str, Any]]:
    body = get(sc, f"/v1/runs/{run_id}/findings", limit=10000)
    return [f for f in body["findings"] if f["type"] == ftype]


def _delivered(sc: SidecarProcess, run_id: str) -> bool:
    alerts = get(sc, "/v1/alerts", run_id=run_id)["alerts"]
    return all(d["state"] != "pending" for a in alerts for d in a["delivery"].values())


def ended_ranks(sc: SidecarProcess, run_id: str) -> set[int]:
    return {r["rank"] for r in sc.records(run_id) if r["kind"] == "end"}


def settled(pair: Pair, run_id: str, ended: bool = True) -> None:
    """Wait until nothing more about ``run_id`` is on its way: the leader holds node 1's
    ranks' end records (node 1 forwards in order, so it owes nothing before them) and, when
    ``ended``, the run's end, and every notification of either sidecar is out."""
    def quiet() -> bool:
        run = get(pair.leader, f"/v1/runs/{run_id}")
        return ((run["status"] != "running" or not ended)
                and ended_ranks(pair.leader, run_id) >= {2, 3}
                and all(_delivered(sc, run_id) for sc in pair.sidecars))
    eventually(quiet, timeout=120, what=f"{run_id} settled", retry_on=SIDECAR_DOWN)


def alertnames(page: Received) -> list[str]:
    """``[FIRING:2] run r: A, B`` -> ``["A", "B"]``."""
    return page.json["text"].splitlines()[0].split(": ")[-1].split(", ")


def one_page(pair: Pair, run_id: str, alertname: str, besides: tuple[str, ...] = (),
             by: str = "node0", ended: bool = True) -> str:
    """The text of the one message that pages ``alertname`` about the run. Every message
    about the run comes from ``by`` (the leader's webhook path, unless it was away), and none
    pages anything but ``alertname`` and the ``besides`` alerts the same fault also raises."""
    settled(pair, run_id, ended)
    pages = pair.pages(run_id)
    print(f"\n{run_id}: {len(pages)} message(s)\n" + "\n\n".join(
        f"from {sender(p)}: {text(p)}" for p in pages))
    for sc in pair.sidecars:  # what each sidecar made of it, for a failure's log
        made = get(sc, f"/v1/runs/{run_id}/findings", limit=10000)["findings"]
        print(f"findings on {sc.url}: " + ", ".join(
            f"{f['type']}@{f['step']}/r{f['rank']}{'/partial' if 'view' in f['evidence'] else ''}"
            for f in made))
    # With the leader up, nothing about the run comes from node 1, resolves included.
    told = pair.messages(run_id) if by == "node0" else pages
    assert {sender(m) for m in told} == {by}, [(sender(m), text(m)) for m in told]
    found = [p for p in pages if alertname in alertnames(p)]
    assert len(found) == 1, [text(p) for p in pages]
    others = {a for p in pages for a in alertnames(p)} - {alertname, *besides}
    assert not others, [text(p) for p in pages]
    return text(found[0])


# -- the fault table -----------------------------------------------------------------------

# One rollback rule decides on divergence. The script's own pace (step_delay 0.05 s): a plan
# decided on node 1's finding reaches the ranks through their clients' action poll (every
# 5 s) and the next agreed call (every 10 steps); the 135 steps after the fault leave it time.
STEPS, POISON_FROM, POISON_LEN, CKPT_EVERY = 200, 65, 12, 10
# What the poisoned stretch raises besides the divergence, each from the leader: the loss
# spike that starts it, the gradient blow-up with it (grouped under the divergence's page, or
# in the same message when it comes first) and the ranks whose loss leaves the others'.
ROLLBACK_ALSO = ("TrainingLossSpike", "TrainingGradExplosion", "TrainingRankOutlier")


def _rollback_args(run_id: str, *extra: str, steps: int = STEPS) -> tuple[str, ...]:
    return ("--url={url}", f"--run_id={run_id}", "--out_dir={work}/out", f"--steps={steps}",
            f"--ckpt_every={CKPT_EVERY}", f"--poison_from={POISON_FROM}",
            f"--poison_len={POISON_LEN}", *extra)


# The jobs of the scenarios that keep the leader up: (wave, script, args). A wave's jobs run
# at once (their steps' sleeps overlap; three jobs' 18 processes fit a CI machine), started
# by the first test that needs one of them; the next wave starts once its tests run.
JOBS: dict[str, tuple[int, str, tuple[str, ...]]] = {
    "brain-nan": (1, "ddp_rank_fault_train.py", (
        "--url", "{url}", "--run-id", "brain-nan", "--steps", "12", "--nan-rank", "2",
        "--nan-step", "8")),
    "brain-hang": (1, "hang_user_train.py", ("{url}", "brain-hang", "block:3", "{work}")),
    "brain-shard": (1, "ddp_rank_fault_train.py", (
        "--url", "{url}", "--run-id", "brain-shard", "--steps", "120", "--corrupt-rank", "1",
        "--corrupt-from", "20", "--corrupt-steps", "100", "--corrupt-shuffle",
        "--step-time", "0.02")),
    "brain-slow": (2, "slow_loader_ddp.py", (
        "--url", "{url}", "--run-id", "brain-slow", "--slow-ranks", "2", "--steps", "24",
        "--delay", "0.15", "--step-time", "0.02")),
    "brain-rollback": (2, "rollback_user_train.py", _rollback_args("brain-rollback")),
    "brain-rollback-node1": (2, "rollback_user_train.py", _rollback_args(
        "brain-rollback-node1", "--save_on=all", "--poison_ranks=2,3")),
}


@pytest.fixture(scope="module")
def jobs(pair: Pair) -> Iterator[Callable[[str], Job]]:
    """``jobs(run_id)``: that scenario's job, its wave launched if it was not yet."""
    launched: dict[str, Job] = {}

    def job(run_id: str) -> Job:
        wave = JOBS[run_id][0]
        for other, (w, script, args) in JOBS.items():
            if w == wave and other not in launched:
                launched[other] = launch(pair, other, script, *args)
        return launched[run_id]

    try:
        yield job
    finally:
        for started in launched.values():
            started.kill()


def test_nan_on_rank_2_pages_once_naming_it_and_its_node(pair, jobs):
    run_id = "brain-nan"
    jobs(run_id).wait()
    page = one_page(pair, run_id, "TrainingNanInf")
    assert ("NaN first on rank 2 (host gpu-node-1) at step 8: its local loss is nan; "
            "ranks 0, 1, 3 followed at step 8 through the gradient all-reduce") in page, page
    assert "partial view" not in page
    [onset, *_] = sorted(findings(pair.leader, run_id, "nan_inf"), key=lambda f: f["step"])
    assert (onset["rank"], onset["evidence"]["first_host"]) == (2, "gpu-node-1")


def test_a_rank_blocked_before_all_reduce_is_one_hang_page(pair, jobs):
    run_id = "brain-hang"
    job = jobs(run_id)
    eventually(lambda: pair.pages(run_id, "TrainingHung"), timeout=120, what="the hang page",
               retry_on=SIDECAR_DOWN)
    (pair.tmp / run_id / "release").write_text("go")
    job.wait()
    page = one_page(pair, run_id, "TrainingHung")
    assert "rank 3 stuck" in page and "hang_user_train.py:wait_for_release" in page, page
    assert "ranks 0-2 wait in torch/distributed/distributed_c10d.py:all_reduce" in page, page


def test_a_corrupt_shard_on_rank_1_is_one_outlier_warning(pair, jobs):
    run_id = "brain-shard"
    jobs(run_id).wait()
    page = one_page(pair, run_id, "TrainingRankOutlier")
    assert "rank 1 (host gpu-node-0): local loss" in page, page
    assert {f["rank"] for f in findings(pair.leader, run_id, "rank_outlier")} == {1}


def test_a_slow_loader_on_rank_2_is_one_straggler_page(pair, jobs):
    run_id = "brain-slow"
    jobs(run_id).wait(done="done: ")
    page = one_page(pair, run_id, "TrainingStraggler")
    assert "rank 2 is the straggler: its data loading takes" in page, page
    # One ledger for the job, the leader's: its four ranks, the others' wait for rank 2 as
    # the straggler tax of its data loading; only the leader exposes it, so a fleet sum
    # counts the run once.
    ledger = get(pair.leader, f"/v1/runs/{run_id}/goodput")
    assert ledger["gpus"] == 4 and ledger["badput_seconds"]["straggler_data"] > 0, ledger

    def exposed(sc: SidecarProcess) -> bool:
        return any(ln.startswith("training_goodput_ratio{") and f'run_id="{run_id}"' in ln
                   for ln in httpx.get(sc.url + "/metrics", timeout=10).text.splitlines())

    eventually(lambda: exposed(pair.leader), timeout=30, interval=0.5,
               what="the leader exposed the run's goodput")
    assert not exposed(pair.node)


# -- one decision for every rank: the rollback -----------------------------------------------


def _trained(out: Path, rank: int) -> tuple[list[tuple[int, int]], list[tuple[int, ...]]]:
    """(step, batch) pairs the rank trained on, in order, and the rollbacks it applied:
    (steps trained before it, plan id, checkpoint step, skip_to)."""
    trained: list[tuple[int, int]] = []
    rollbacks: list[tuple[int, ...]] = []
    for line in (out / f"batches-r{rank}.log").read_text().splitlines():
        words = line.split()
        if words[0] == "rollback":  # rollback <id> <checkpoint> <skip_to> <windows>
            rollbacks.append((len(trained), *map(int, words[1:4])))
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


def test_a_divergence_rolls_all_four_ranks_back_at_one_step_rank_0_reporting_saves(
        pair, jobs):
    run_id = "brain-rollback"
    jobs(run_id).wait()
    action = _one_rollback(pair, run_id)
    plan = action["plan"]
    page = one_page(pair, run_id, "RollbackOnDivergence", besides=ROLLBACK_ALSO)
    [(first, last)] = plan["skip"]  # data positions: one batch a step, no earlier window
    assert (first, last) == (plan["skip_from"], plan["skip_to"]), plan
    assert (f"rolled back to step {plan['checkpoint_step']} ({plan['checkpoint_path']}, data "
            f"position {plan['resume_position']}), skipping batches {first}-{last}") in page, page


def test_only_node_1_corrupt_every_rank_reporting_saves_is_one_plan_for_the_job(
        pair, jobs):
    run_id = "brain-rollback-node1"
    jobs(run_id).wait()
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


NAN_KILL, NAN_KILL_STEPS = "brain-nan-kill", 14
ROLLBACK_KILL, ROLLBACK_KILL_STEPS = "brain-rollback-kill", 120  # no plan to wait for


@pytest.fixture(scope="module")
def leader_killed(pair: Pair) -> None:
    """Two jobs through one SIGKILL of the leader. Each holds before its fault until the
    leader has heard every rank; the leader is killed and both go on: a NaN on rank 2 at
    step 10 (that job then holds before closing), a divergence of every rank's data from
    step 65 (that job trains to its end). Node 1's sidecar pages both, partially; then the
    leader is restarted on its data directory and port, as a Pod's restarted sidecar, its
    own ranks replay their spools (the NaN job's; the other job's ranks are gone) and node 1
    catches it up; the NaN job then ends."""
    nan_work, rb_work = pair.tmp / NAN_KILL, pair.tmp / ROLLBACK_KILL
    with torchrun(pair, NAN_KILL, "ddp_rank_fault_train.py", "--url", "{url}", "--run-id",
                  NAN_KILL, "--steps", str(NAN_KILL_STEPS), "--nan-rank", "2",
                  "--nan-step", "10", "--pause-at", "6", "--pause-file", "{work}/go",
                  "--hold-file", "{work}/end") as nan_job, \
            torchrun(pair, ROLLBACK_KILL, "rollback_user_train.py", *_rollback_args(
                ROLLBACK_KILL, "--pause_at=50", "--pause_file={work}/go",
                steps=ROLLBACK_KILL_STEPS)) as rollback_job:
        eventually(lambda: _at_step(
            pair.leader, NAN_KILL, 5) and _at_step(pair.leader, ROLLBACK_KILL, 49),
            timeout=120, what="the leader to hear every rank", retry_on=SIDECAR_DOWN)
        pair.leader.kill()
        for work in (nan_work, rb_work):
            (work / "go").write_text("go")
        eventually(lambda: pair.pages(NAN_KILL, "TrainingNanInf")
                   and pair.pages(ROLLBACK_KILL, "RollbackOnDivergence"),
                   timeout=120, what="node 1's own pages", retry_on=SIDECAR_DOWN)
        rollback_job.wait()  # trained to its end on a partial view: nobody decided anything
        pair.leader.start()
        eventually(lambda: _at_step(
            pair.leader, NAN_KILL, NAN_KILL_STEPS)
            and ended_ranks(pair.leader, ROLLBACK_KILL) == {2, 3},
            timeout=120, what="the leader to catch up", retry_on=SIDECAR_DOWN)
        (nan_work / "end").write_text("end")
        nan_job.wait()


def test_leader_killed_before_a_nan_node_1_pages_it_partially_and_no_page_twice(
        pair, leader_killed):
    page = one_page(pair, NAN_KILL, "TrainingNanInf", by="node1")
    _partial(page, pair)
    assert "NaN first on rank 2 (host gpu-node-1) at step 10: its local loss is nan" in page
    # The leader keeps the node's page as its own alert (told: not paged again) and judged
    # the NaN from every rank once caught up.
    alerts = get(pair.leader, "/v1/alerts", run_id=NAN_KILL)["alerts"]
    assert [a["alertname"] for a in alerts] == ["TrainingNanInf"], alerts
    [onset, *_] = sorted(findings(pair.leader, NAN_KILL, "nan_inf"), key=lambda f: f["step"])
    assert (onset["step"], onset["rank"]) == (10, 2), onset


def test_leader_killed_before_a_divergence_no_rank_acts_and_the_job_ends(
        pair, leader_killed):
    out = pair.tmp / ROLLBACK_KILL / "out"
    assert [_trained(out, r)[1] for r in range(NODES * PER_NODE)] == [[]] * 4
    assert len(_weights(out)) == 1
    # Node 1 paged the divergence saying its view is partial, and took no action; the leader
    # back (its own ranks' records of this job stay in their spools) pages nothing node 1
    # paged, nor decides anything.
    page = one_page(pair, ROLLBACK_KILL, "RollbackOnDivergence", besides=ROLLBACK_ALSO,
                    by="node1", ended=False)
    _partial(page, pair)
    assert "rolled back" not in page, page
    for sc in pair.sidecars:
        assert get(sc, f"/v1/runs/{ROLLBACK_KILL}/actions")["actions"] == [], sc.url


def resolves(pair: Pair, run_id: str) -> list[tuple[str, str]]:
    """(sender, title) of every resolve message about the run."""
    return [(sender(m), m.json["text"].splitlines()[0]) for m in pair.messages(run_id)
            if "[RESOLVED:" in m.json["text"]]


def test_leader_killed_the_nan_page_resolves_once_from_the_leader(pair, leader_killed):
    # Node 1 handed its page over to the leader when it caught it up (closed quietly there);
    # the run's end resolves it once, on the leader.
    settled(pair, NAN_KILL)
    assert [s for s, _ in resolves(pair, NAN_KILL)] == ["node0"], resolves(pair, NAN_KILL)


def test_leader_killed_the_divergence_page_resolves_once(pair, leader_killed):
    # The run ended on node 1 while the leader was away: node 1 resolved its page then, and
    # marked it closed for the leader, which keeps its told copy without a second resolve.
    settled(pair, ROLLBACK_KILL, ended=False)
    titles = [title for _, title in resolves(pair, ROLLBACK_KILL)]
    assert len(titles) == len(set(titles)), resolves(pair, ROLLBACK_KILL)
