"""Issue 45's scripts, written as a stranger writes them (tests/e2e/stranger_train.py), run
as processes of their own through the real client against a real sidecar with the shipped
rules and a real Slack-protocol receiver:

* a run that stopped learning pages and its verdict says so (a one-column cross-entropy,
  loss 0 from step 1; a DCGAN whose generator dies after LR x100), a healthy GAN does not,
  nor a run whose LR warms up from 0;
* a script that dies of an exception pages with the exception and the step, its verdict
  is unhealthy; a Ctrl-C is the user's stop, not a crash;
* an LBFGS run whose loss explodes by decades in its first 15 steps pages (a falling one
  does not: tests/detectors/test_divergence.py);
* under ``loss_kind="gan"``, the divergence an LR x100 drives starts at the jump, not
  where the generator's loss was already rising;
* an actor-critic whose episodes grow as it learns, each step reporting its samples, gets
  no ``throughput_drop``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.eventually import eventually
from tests.receivers import Receiver

# Each test trains a few hundred CPU steps (an actor-critic's episodes, LBFGS's closures):
# minutes on a busy shared box.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).resolve().parent / "stranger_train.py"
REPO = Path(__file__).resolve().parents[2]


def _config(tmp: Path, slack: Receiver) -> Path:
    config = tmp / "config.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\n"
        "alerting:\n"
        "  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/strangersecret', "
        "min_interval_seconds: 0}\n")
    return config


def _train(tmp: Path, url: str, script: str, run_id: str, fault: str | None = None) -> str:
    """Run the script to its end; its stderr (a crash's traceback)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "client")]),
           "MONITOR_AGENT_SPOOL_DIR": str(tmp / run_id)}
    cmd = [sys.executable, str(SCRIPT), script, url, run_id, *([fault] if fault else [])]
    done = subprocess.run(cmd, env=env, cwd=SCRIPT.parent, capture_output=True, text=True,
                          timeout=600)
    return done.stderr


def _ended(url: str, run_id: str) -> dict:
    """The run once its end record is in: status and verdict."""
    return eventually(lambda: (r := httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json())
                      ["status"] != "running" and r, timeout=30, what=f"{run_id} ended")


def _findings(url: str, run_id: str, ftype: str) -> list[dict]:
    got = httpx.get(f"{url}/v1/runs/{run_id}/findings", timeout=10).json()["findings"]
    return sorted((f for f in got if f["type"] == ftype), key=lambda f: f["step"])


def _paging(url: str, run_id: str) -> list[dict]:
    got = httpx.get(f"{url}/v1/runs/{run_id}/findings", timeout=10).json()["findings"]
    return [f for f in got if f["severity"] in ("error", "critical")]


def _page(slack: Receiver, rule: str, run_id: str) -> str:
    return eventually(lambda: next((t for r in slack.accepted()
                                    if rule in (t := json.loads(r.body)["text"])
                                    and run_id in t and "FIRING" in t), None),
                      timeout=30, what=f"the {rule} page of {run_id}")


def test_a_run_that_stopped_learning_pages_and_its_verdict_says_so(tmp_path, sidecar_factory):
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack))
        sc.start()
        _train(tmp_path, sc.url, "one_class", "one-class")
        page = _page(slack, "TrainingNotLearning", "one-class")
        assert "the gradient norm is exactly 0 on every step since step 1" in page, page
        verdict = _ended(sc.url, "one-class")["verdict"]
        assert verdict["text"].startswith("completed, unhealthy: stopped learning at step 1")
        assert verdict["cause"] == "not_learning"

        _train(tmp_path, sc.url, "dcgan", "dcgan-lr100", "lr100")
        (dead, *_) = _findings(sc.url, "dcgan-lr100", "not_learning")
        assert dead["evidence"]["since_step"] > 150 and dead["severity"] == "error", dead
        assert "the gradient norm is exactly 0 on every step since step" in dead["message"], \
            dead["message"]
        assert "stopped learning at step" in _ended(sc.url, "dcgan-lr100")["verdict"]["text"]

        _train(tmp_path, sc.url, "dcgan", "dcgan")
        run = _ended(sc.url, "dcgan")
        assert run["verdict"]["text"].startswith("completed, healthy"), run["verdict"]
        assert _paging(sc.url, "dcgan") == []

        # An LR warming up from 0: step 1's update is exactly 0, the next measured one (25
        # steps on) is not. One measured zero is not a stretch of them.
        _train(tmp_path, sc.url, "warmup", "warmup")
        run = _ended(sc.url, "warmup")
        assert run["verdict"]["text"].startswith("completed, healthy"), run["verdict"]
        assert _paging(sc.url, "warmup") == []
        steps = httpx.get(f"{sc.url}/v1/runs/warmup/records",
                          params={"kind": "step", "limit": 1000}, timeout=10).json()["records"]
        assert steps[0]["update_norm"] == 0.0, steps[0]  # the case itself, as it was sent


def test_a_crash_pages_and_a_ctrl_c_is_the_users_stop(tmp_path, sidecar_factory):
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack))
        sc.start()
        err = _train(tmp_path, sc.url, "crash", "crash")
        assert "RuntimeError: all elements of input should be between 0 and 1" in err, err
        page = _page(slack, "TrainingCrashed", "crash")
        assert ("the run crashed after step 59 (rank 0): RuntimeError: all elements of input "
                "should be between 0 and 1") in page, page
        run = _ended(sc.url, "crash")
        assert run["status"] == "failed"
        assert run["verdict"]["text"].startswith(
            "failed, unhealthy: crashed after step 59 (RuntimeError)"), run["verdict"]

        err = _train(tmp_path, sc.url, "crash", "ctrl-c", "interrupt")
        assert "KeyboardInterrupt" in err, err
        run = _ended(sc.url, "ctrl-c")
        assert run["status"] == "stopped"
        assert run["verdict"]["text"].startswith("stopped, healthy"), run["verdict"]
        assert _findings(sc.url, "ctrl-c", "crashed") == []
        assert not [r for r in slack.accepted() if "ctrl-c" in r.body.decode()]


def test_a_loss_that_explodes_by_decades_in_15_steps_pages(tmp_path, sidecar_factory):
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack))
        sc.start()
        _train(tmp_path, sc.url, "lbfgs", "lbfgs-lr10", "lr10")
        page = _page(slack, "TrainingDivergence", "lbfgs-lr10")
        assert "decades above the highest the run had reported" in page, page
        (found,) = _findings(sc.url, "lbfgs-lr10", "divergence")
        assert (found["step"], found["evidence"]["rule"]) == (9, "early"), found
        assert found["evidence"]["decades"] > 30
        assert _paging(sc.url, "lbfgs-lr10") == [found]  # and nothing else: it never NaNs


def test_a_divergence_an_lr_jump_drives_starts_at_the_jump(tmp_path, sidecar_factory):
    """loss_kind="gan": the generator's loss rises from about step 110 (the discriminator
    winning); LR x100 at step 150 is paged, dated from 150, not from 113."""
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack))
        sc.start()
        _train(tmp_path, sc.url, "gan", "gan-lr100", "lr100")
        _page(slack, "TrainingDivergence", "gan-lr100")
        (jump,) = _findings(sc.url, "gan-lr100", "lr_jump")
        assert jump["step"] == 150
        found = _findings(sc.url, "gan-lr100", "divergence")
        pages = [f for f in found if f["severity"] == "error"]
        assert pages and all(f["evidence"]["onset_step"] >= 150 for f in pages), pages
        assert "likely cause: LR x100 at step 150" in pages[0]["message"]


def test_episodes_that_grow_as_the_agent_learns_are_no_slowdown(tmp_path, sidecar_factory):
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack))
        sc.start()
        _train(tmp_path, sc.url, "actor_critic", "actor-critic")
        _ended(sc.url, "actor-critic")
        steps = httpx.get(f"{sc.url}/v1/runs/actor-critic/records",
                          params={"kind": "step", "limit": 1000}, timeout=10).json()["records"]
        lengths = [r["samples"] for r in steps]
        assert max(lengths[150:]) >= 5 * min(lengths[:50]), lengths  # the agent learnt
        # Per step the run got several times slower: a steps/s reading would page it. The
        # only slowdown the detector may name is one of samples/s the records themselves
        # show (a shared box can slow the whole script down): per unit of work, held to
        # the records it came from.
        by_step = {r["step"]: r["samples"] / r["step_time"] for r in steps
                   if r.get("step_time") and r.get("samples")}
        for f in _findings(sc.url, "actor-critic", "throughput_drop"):
            assert f["message"].startswith("samples/s"), f["message"]
            before = [v for s, v in by_step.items() if s <= f["step"]]
            recent, base = np.median(before[-20:]), np.median(before[-220:-20])
            assert recent < 0.75 * base, (f["message"], recent, base)  # window edges differ
