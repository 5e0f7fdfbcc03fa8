"""``action: restart`` on a real sidecar over real HTTP, fed the records a job's clients
send: a hang past its limit decides one restart for every rank, from the last
clean checkpoint; the relaunched job's first step carries it out and the page says when
training resumed; the same fault right after the resume stops the run instead of looping;
a hang in a checkpoint save, or a job whose launcher does not restart it, is paged and not
restarted. The processes themselves (torchrun, the client's exit) are in tests/e2e."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.alerting.heal_records import (
    actions,
    checkpoint,
    hang,
    post,
    run_record,
    sidecar,
    step,
    texts,
)
from tests.eventually import eventually
from tests.receivers import Receiver
from tests.ticks import settled


def _job(url: str, steps: range, attempt: int = 1, launcher: dict | None = None,
         ckpt_every: int = 8) -> None:
    for s in steps:
        records = [run_record(r, 2, attempt, launcher=launcher) for r in (0, 1)] \
            if s == steps.start else []
        records += [step(r, s, attempt) for r in (0, 1)]
        if s % ckpt_every == 0:
            records.append(checkpoint(s, attempt))
        if s == steps.start and attempt > 1:
            # A relaunch the sidecar did not ask for waits (409) until the attempt before it
            # went quiet (attempt_quiet_seconds); the client retries, as here.
            eventually(lambda r=records: post(url, r), timeout=30, what="the relaunch taken")
        else:
            post(url, records)


def _restart(url: str) -> dict:
    def decided() -> dict:
        found = [a for a in actions(url) if a["action"] in ("restart", "stop")]
        assert found, actions(url)
        return found[-1]
    return eventually(decided, timeout=30, what="a restart decision")


def test_a_hang_restarts_every_rank_from_the_last_clean_checkpoint(tmp_path: Path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv:
        _job(srv.url, range(1, 13))
        # Rank 1 is stuck in its loader; rank 0 waits in all_reduce for it. (Had rank 1 sent
        # nothing, the page would wait until it is judged gone, and say so: detectors/hang.py.)
        post(srv.url, [hang(0, 12), hang(1, 12, frame="next_batch")])
        decided = _restart(srv.url)
        assert decided["action"] == "restart", decided
        plan = decided["plan"]
        assert (plan["checkpoint_step"], plan["checkpoint_path"], plan["resume_position"],
                plan["cause"], plan["ranks"], plan["exclude"]) == (
            8, "/ckpt/step-8.pt", 8, "hang", 2, [])
        assert decided["message"].startswith(
            "restart all 2 ranks from checkpoint 8 (clean; /ckpt/step-8.pt, data position 8)")
        phase = eventually(lambda: _detail(srv.url)["phase"], timeout=10)
        assert phase.startswith("restarting: restart all 2 ranks"), phase
        page = eventually(lambda: [t for t in texts(slack) if "RestartOnHang" in t], timeout=20)
        assert "restart all 2 ranks from checkpoint 8" in page[0], page

        # The launcher relaunches the job: new processes resume from step 8.
        _job(srv.url, range(9, 14), attempt=2)
        done = eventually(lambda: [a for a in actions(srv.url)
                                   if a["id"] == decided["id"] and a["honoured_step"]],
                          timeout=20)[0]
        assert done["honoured_step"] == 9
        assert done["message"].startswith("restarted all 2 ranks from checkpoint 8")
        assert "training resumed at step 9" in done["message"]
        said = eventually(lambda: [t for t in texts(slack) if "training resumed" in t],
                          timeout=20)
        assert "restarted all 2 ranks" in said[0]
        assert _detail(srv.url)["phase"] == "running"

        # The same fault 3 steps after the resume: not cured, so the run stops and pages.
        post(srv.url, [hang(0, 13, attempt=2)])
        stopped = eventually(lambda: [a for a in actions(srv.url) if a["action"] == "stop"],
                             timeout=30)[0]
        # (hang, or gone: whether rank 1 was judged gone before the page settled)
        assert re.match(r"the restart did not cure it: (hang|gone) again at step 13, 4 steps "
                        r"after the restart resumed at step 9 \(restart_cure_steps 100\): "
                        r"stopping; a human must look", stopped["message"]), stopped
        assert len([a for a in actions(srv.url) if a["action"] == "restart"]) == 1


def test_a_hang_in_a_checkpoint_save_is_paged_not_restarted(tmp_path: Path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv:
        _job(srv.url, range(1, 13))
        post(srv.url, [hang(0, 12, phase="checkpoint", frame="save"), hang(1, 12)])
        page = eventually(lambda: [t for t in texts(slack) if "RestartOnHang" in t],
                          timeout=30)
        assert "no restart: rank 0 is in its checkpoint save (phase checkpoint)" in page[0]
        assert actions(srv.url) == []


def test_a_job_whose_launcher_does_not_restart_it_is_not_restarted(tmp_path: Path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack) as srv:
        _job(srv.url, range(1, 13), launcher={"name": "none", "restarts": False})
        post(srv.url, [hang(0, 12)])
        page = eventually(lambda: [t for t in texts(slack) if "RestartOnHang" in t],
                          timeout=30)
        assert "no restart: its launcher (none) does not run it again on exit status 75" \
            in page[0], page
        assert actions(srv.url) == []


def _detail(url: str) -> dict:
    import httpx

    body: dict = httpx.get(f"{url}/v1/runs/heal", timeout=10).json()
    return body


RELAUNCH_RULES = """
routes: {page: [slack]}
rules:
  - {name: RestartOnHang, match: {types: [hang]}, severity: critical, fingerprint: [],
     cooldown: 30m, resolve_after: 3s, action: restart}
  - {name: TrainingRelaunched, match: {types: [relaunched]}, severity: warning,
     route: page, fingerprint: [], resolve_after: 3s}
"""


def test_a_crash_the_launcher_relaunched_on_its_own_is_one_page_saying_so(tmp_path: Path):
    with Receiver("slack") as slack, sidecar(tmp_path, slack, rules=RELAUNCH_RULES,
                                             quiet=0.5) as srv:
        _job(srv.url, range(1, 13))  # rank 1 killed after step 12: no end record
        _job(srv.url, range(9, 15), attempt=2)  # torchrun restarted the group from step 8
        page = eventually(lambda: [t for t in texts(slack) if "TrainingRelaunched" in t],
                          timeout=20)
        assert ("the job's launcher relaunched it after a crash: attempt 1 stopped at step "
                "12 with no end record") in page[0]
        assert "attempt 2 resumed at step 9" in page[0]
        # A resume after a clean end is no crash: nothing pages.
        post(srv.url, [{"kind": "end", "run_id": "heal", "rank": r, "step": 14,
                        "time": time.time(), "attempt": f"a2r{r}", "status": "completed"}
                       for r in (0, 1)])
        _job(srv.url, range(13, 16), attempt=3)
        eventually(lambda: [a for a in _detail(srv.url)["attempts"] if a["number"] == 3],
                   timeout=20)
        assert len([t for t in texts(slack) if "TrainingRelaunched" in t and
                    "RESOLVED" not in t]) == 1
        assert actions(srv.url) == []


CRASH_RULES = RELAUNCH_RULES + """  - {name: TrainingCrashed, match: {types: [crashed]}, severity: error, route: page,
     fingerprint: [], cooldown: 10m}
"""


def test_a_crash_by_exception_its_launcher_relaunched_is_one_page_its_resolve_says_so(
        tmp_path: Path):
    """Rank 1 raised (a failed end with its exception: the ``crashed`` page), torchrun ran
    the group again: one incident, so one page; its resolve says the job was relaunched."""
    with Receiver("slack") as slack, sidecar(tmp_path, slack, rules=CRASH_RULES,
                                             quiet=0.5) as srv:
        _job(srv.url, range(1, 13))
        post(srv.url, [{"kind": "end", "run_id": "heal", "rank": 1, "step": 12,
                        "time": time.time(), "attempt": "a1r1", "status": "failed",
                        "error": "RuntimeError: CUDA error: an illegal memory access"}])
        eventually(lambda: [t for t in texts(slack) if "TrainingCrashed" in t], timeout=20)
        _job(srv.url, range(9, 15), attempt=2)  # torchrun restarted the group from step 8

        def resolved() -> str:
            [said] = [t for t in texts(slack) if "RESOLVED" in t and "TrainingCrashed" in t]
            return said
        said = eventually(resolved, timeout=20, what="the crash page resolved")
        assert ("the job's launcher relaunched it after a crash: attempt 1 crashed at step "
                "12, and attempt 2 resumed at step 9") in said, said
        settled(srv.url)  # anything the relaunch would page is sent by now
        pages = [t for t in texts(slack) if "RESOLVED" not in t]
        assert len(pages) == 1 and "TrainingCrashed" in pages[0], pages
