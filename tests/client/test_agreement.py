"""The agreement across ranks (_agreement.py) on a real two-rank gloo job: this test process
is rank 0 and a subprocess is rank 1, each calling the module's functions in the same order,
so every collective is a real one between two processes. Whatever the ranks hold, they come
out of a call with the same answer: act on the same action, or none does, and why.

Rank 0 is this process (not a second subprocess) so that the calls under test run here too:
bench/mutation.py's mutmut picks a mutant's tests by the calls it sees in the test process.
The Monitor-level proofs (plans fetched, records sent, ranks acting at one call) are in
tests/client/test_rollback_plan.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from monitor_client import _agreement
from monitor_client._agreement import Consensus, content_digest, distributed
from tests.eventually import scaled

REPO = Path(__file__).resolve().parents[2]

# Rank 1: runs the calls it reads from stdin (one JSON list a line), answers each line with
# the JSON of its results, in order.
RANK_1 = """
import dataclasses, json, sys
from datetime import timedelta
import torch.distributed as dist
from monitor_client import _agreement

dist.init_process_group("gloo", init_method=sys.argv[1], rank=1, world_size=2,
                        timeout=timedelta(seconds=float(sys.argv[2])))
for line in sys.stdin:
    out = []
    for name, *args in json.loads(line):
        if name == "distributed":
            out.append(_agreement.distributed() is dist)
            continue
        got = getattr(_agreement, name)(dist, *args)
        out.append(dataclasses.asdict(got) if dataclasses.is_dataclass(got) else got)
    print(json.dumps(out), flush=True)
dist.destroy_process_group()
"""

PLAN = {"id": 5, "action": "rollback", "plan": {"checkpoint_step": 20, "skip_to": 40}}


def test_a_job_that_never_imported_torch_is_not_made_to(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch")
    assert distributed() is None
    assert "torch" not in sys.modules


def test_a_process_without_a_group_is_not_distributed():
    assert not dist.is_initialized()  # no job is up outside a test that asks for one
    assert distributed() is None


class Job:
    """Two gloo ranks: ``call`` runs ``mine`` here and ``theirs`` on rank 1 and returns both
    ranks' results. Rank 1 starts with the test's first call, not with the fixture: mutmut
    gives a mutant as much time as its tests' calls took, their fixtures not counted."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.rank1: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        script = self.tmp / "rank1.py"
        script.write_text(RANK_1)
        url, limit = f"tcp://127.0.0.1:{port}", scaled(30)
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1"}
        self.rank1 = subprocess.Popen([sys.executable, str(script), url, str(limit)], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        dist.init_process_group("gloo", init_method=url, rank=0, world_size=2,
                                timeout=timedelta(seconds=limit))
        return self.rank1

    def call(self, mine: list[tuple], theirs: list[tuple]) -> tuple[list, list]:
        rank1 = self.rank1 or self._start()
        assert rank1.stdin is not None and rank1.stdout is not None
        rank1.stdin.write(json.dumps(theirs) + "\n")
        rank1.stdin.flush()
        ours = []
        for name, *args in mine:
            if name == "distributed":
                ours.append(distributed() is dist)
                continue
            got = getattr(_agreement, name)(dist, *args)
            ours.append(dataclasses.asdict(got) if isinstance(got, Consensus) else got)
        line = rank1.stdout.readline()
        assert line, f"rank 1 exited ({rank1.poll()})"
        return ours, json.loads(line)

    def close(self) -> None:
        if self.rank1 is None:
            return
        assert self.rank1.stdin is not None
        self.rank1.stdin.close()
        self.rank1.wait(timeout=scaled(60))
        dist.destroy_process_group()


@pytest.fixture
def job(tmp_path):
    two = Job(tmp_path)
    yield two
    two.close()


def _consensus(act: bool, why: str = "", action_id: int = 5) -> dict:
    return {"act": act, "action_id": action_id, "why": why}


def test_a_two_rank_job_is_distributed_for_every_rank(job):
    assert job.call([("distributed",)], [("distributed",)]) == ([True], [True])


def test_every_rank_learns_the_newest_action_any_rank_holds(job):
    assert job.call([("newest", 3)], [("newest", 7)]) == ([7], [7])
    assert job.call([("newest", 9)], [("newest", 0)]) == ([9], [9])
    assert job.call([("newest", 0)], [("newest", 0)]) == ([0], [0])  # none: no action


def test_a_flag_any_rank_raises_is_raised_for_every_rank(job):
    ours, theirs = job.call([("any_rank", True, False, False)],
                            [("any_rank", False, False, True)])
    assert ours == theirs == [[True, False, True]]


def test_a_plan_every_rank_holds_alike_and_one_rank_saved_is_acted_on_by_all(job):
    digest = content_digest(PLAN)
    ours, theirs = job.call([("unanimous", 5, digest, True)], [("unanimous", 5, digest, False)])
    assert ours == theirs == [_consensus(True)]


def test_a_plan_one_rank_lacks_is_acted_on_by_none(job):
    digest = content_digest(PLAN)
    ours, theirs = job.call([("unanimous", 5, digest, True)], [("unanimous", 5, None, True)])
    assert ours == theirs == [_consensus(False, "missing")]


def test_two_contents_under_one_id_are_acted_on_by_none_whichever_is_larger(job):
    low, high = sorted([content_digest(PLAN),
                        content_digest({**PLAN, "plan": {**PLAN["plan"], "skip_to": 60}})])
    for mine, theirs in ((low, high), (high, low)):
        ours, their = job.call([("unanimous", 5, mine, True)], [("unanimous", 5, theirs, True)])
        assert ours == their == [_consensus(False, "mismatch")]


def test_a_plan_whose_checkpoint_no_rank_saved_is_acted_on_by_none(job):
    digest = content_digest(PLAN)
    ours, theirs = job.call([("unanimous", 5, digest, False)],
                            [("unanimous", 5, digest, False)])
    assert ours == theirs == [_consensus(False, "unreported")]


def test_a_stop_needs_no_rank_to_have_saved_a_checkpoint(job):
    # A stop names no checkpoint: held back only when a rank lacks it (_control.py).
    ours, theirs = job.call([("unanimous", 9, 1)], [("unanimous", 9, 1)])
    assert ours == theirs == [_consensus(True, action_id=9)]
    ours, theirs = job.call([("unanimous", 9, 1)], [("unanimous", 9, None)])
    assert ours == theirs == [_consensus(False, "missing", action_id=9)]


def test_a_lacking_rank_is_named_before_a_mismatch_or_an_unsaved_checkpoint(job):
    # Rank 1 lacks it, and no rank saved it: the reason a rank tells its sidecar is that
    # one rank lacks the action (what it fetches next), not the checkpoint.
    ours, theirs = job.call([("unanimous", 5, content_digest(PLAN), False)],
                            [("unanimous", 5, None, False)])
    assert ours == theirs == [_consensus(False, "missing")]


def test_a_mismatch_is_named_before_an_unsaved_checkpoint(job):
    other = content_digest({**PLAN, "id": 6})
    ours, theirs = job.call([("unanimous", 5, content_digest(PLAN), False)],
                            [("unanimous", 5, other, False)])
    assert ours == theirs == [_consensus(False, "mismatch")]


def test_the_digest_is_what_the_action_asks_not_its_wording():
    digest = content_digest(PLAN)
    assert 0 < digest < 2 ** 62  # fits the int64 all_reduce, and its negation too
    assert digest == content_digest({**PLAN, "message": "reworded", "honoured_step": 21})
    assert digest == content_digest(json.loads(json.dumps(PLAN)))  # wherever it is computed
    # a sidecar's JSON may list the plan's keys in any order
    assert digest == content_digest({"id": 5, "action": "rollback",
                                     "plan": {"skip_to": 40, "checkpoint_step": 20}})
    for other in ({**PLAN, "id": 6}, {**PLAN, "action": "stop"},
                  {**PLAN, "plan": {"skip_to": 40, "checkpoint_step": 21}}):
        assert content_digest(other) != digest, other
