"""A broken run does not end green (issue 24): real CPU training loops through the real
client, a real sidecar process with the shipped rules and a real Slack-protocol receiver.

* LR x100 injected mid-run: the ``lr_jump`` finding names it, and the pages that follow
  (divergence, gradient explosion, NaN) carry it as their likely cause in their summary;
* NaN made in the loss arithmetic from step 300 to the last step 600: the page says every
  module output was finite and the loss was not; the run's verdict is unhealthy in
  ``GET /v1/runs``, in ``/metrics`` and in the message that resolves its alerts at the end,
  and it survives a sidecar restart.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import torch
from torch import nn

from monitor_client import Monitor, MonitorSettings
from tests.eventually import eventually
from tests.receivers import Receiver


def _config(tmp: Path, slack: Receiver) -> Path:
    config = tmp / "config.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\n"
        "alerting:\n"
        "  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/verdictsecret', "
        "min_interval_seconds: 0}\n"
    )
    return config


def _train(url: str, tmp: Path, run_id: str, steps: int, *, lr: float,
           lr_times_at: tuple[int, float] | None = None, nan_loss_from: int | None = None) -> None:
    """A small MLP regression on CPU, SGD; optionally the LR multiplied from a step on, or
    the loss made NaN by its own arithmetic (log of a negative number) from a step on."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    mon = Monitor(url=url, project="verdict", run_id=run_id, config={"warmup_steps": 0},
                  settings=MonitorSettings(spool_dir=tmp / run_id, install_hooks=False,
                                           linger=0.02, timeout=(0.5, 5.0)))
    mon.watch(model, opt)
    gen = torch.Generator().manual_seed(1)
    for step in range(1, steps + 1):
        if lr_times_at is not None and step == lr_times_at[0]:
            for group in opt.param_groups:
                group["lr"] *= lr_times_at[1]
        x = torch.randn(32, 16, generator=gen)
        loss = (model(x) - x[:, :1]).pow(2).mean()
        if nan_loss_from is not None and step >= nan_loss_from:
            loss = loss + torch.log(-loss.detach() - 1.0)  # NaN made after every module
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss.detach(), samples=32)
    mon.close(timeout=10)


def _texts(slack: Receiver, run_id: str) -> list[str]:
    return [r.body.decode() for r in slack.accepted() if run_id in r.body.decode()]


def _listed(url: str, run_id: str) -> dict:
    runs = httpx.get(f"{url}/v1/runs", timeout=10).json()["runs"]
    return next(r for r in runs if r["run_id"] == run_id)


def test_an_lr_jump_is_named_and_the_pages_that_follow_cite_it(tmp_path, sidecar_factory):
    with Receiver("slack") as slack:
        sc = sidecar_factory(config=_config(tmp_path, slack))
        sc.start()
        _train(sc.url, tmp_path, "lr-x100", 260, lr=0.02, lr_times_at=(200, 100.0))

        def findings() -> list[dict]:
            got = httpx.get(f"{sc.url}/v1/runs/lr-x100/findings", timeout=10).json()["findings"]
            return got if any(f["type"] == "lr_jump" for f in got) else []

        found = eventually(findings, timeout=20, what="the lr_jump finding")
        (jump,) = [f for f in found if f["type"] == "lr_jump"]
        assert jump["step"] == 200
        assert jump["message"].startswith("LR x100 at step 200: 0.02 -> 2, outside the run's "
                                          "schedule"), jump["message"]
        cause = "likely cause: LR x100 at step 200: 0.02 -> 2, outside the run's schedule"
        pages = [f for f in found if f["type"] in ("divergence", "grad_explosion", "nan_inf")]
        assert pages, [f["type"] for f in found]
        assert all(cause in f["message"] for f in pages), [f["message"] for f in pages]
        # The page itself says it, in the summary every channel shows.
        page = eventually(lambda: [json.loads(r.body)["text"] for r in slack.accepted()
                                   if "TrainingDivergence" in r.body.decode()],
                          timeout=20, what="the divergence page")
        assert page and cause.replace("->", "-&gt;") in page[0], page  # Slack escapes >
        # The run ends unhealthy, and says after what.
        verdict = eventually(lambda: (v := _listed(sc.url, "lr-x100")["verdict"])["text"]
                             .startswith("completed") and v, timeout=20, what="the verdict")
        assert verdict["state"] == "unhealthy" and verdict["step"] > 200, verdict
        assert "after LR x100 at step 200" in verdict["text"], verdict


def test_a_run_nan_to_its_end_ends_unhealthy_everywhere(tmp_path, sidecar_factory):
    with Receiver("slack") as slack:
        config = _config(tmp_path, slack)
        sc = sidecar_factory(config=config)
        sc.start()
        _train(sc.url, tmp_path, "nan-300", 600, lr=0.02, nan_loss_from=300)

        listed = eventually(lambda: (r := _listed(sc.url, "nan-300"))["status"] == "completed"
                            and r, timeout=20, what="nan-300 completed")
        # An ended run's verdict says what it cost too (runs/goodput.py).
        verdict = listed["verdict"]
        assert (verdict["state"], verdict["cause"], verdict["step"]) == (
            "unhealthy", "nan_inf", 300)
        assert verdict["text"].startswith("completed, unhealthy: NaN since step 300; "
                                          "goodput "), verdict
        assert verdict["words"].startswith("unhealthy: NaN since step 300; goodput ")
        detail = httpx.get(f"{sc.url}/v1/runs/nan-300", timeout=10).json()
        assert detail["verdict"]["text"] == verdict["text"]

        metrics = httpx.get(f"{sc.url}/metrics", timeout=10).text
        info = [ln for ln in metrics.splitlines()
                if ln.startswith("training_run_info{") and 'run_id="nan-300"' in ln]
        assert len(info) == 1 and 'verdict="unhealthy_nan_inf"' in info[0], info

        # The NaN page says what was measured: every module output finite, the loss not.
        texts = eventually(lambda: [t for t in _texts(slack, "nan-300") if "RESOLVED" in t],
                           timeout=20, what="nan-300's resolve")
        firing = [t for t in _texts(slack, "nan-300") if "FIRING" in t and "TrainingNanInf" in t]
        assert firing and "every module output finite where sampled" in firing[0], firing
        assert "the NaN is made in the loss computation" in firing[0], firing
        assert "not reported" not in firing[0]
        # The end resolves the page, saying the run ended in that state.
        assert texts and "run ended unhealthy: NaN since step 300" in texts[0], texts

        # A restart changes nothing: the verdict is stored with the run.
        sc.kill()
        sc.start()
        again = _listed(sc.url, "nan-300")["verdict"]
        assert again["text"] == verdict["text"], json.dumps(again)
