"""Several models and optimizers in one run (issue 45 point 2), written as a user writes a
DCGAN from docs/client.md: each model watched under a name, its parameters named after it
on the wire, its own norms and LR under ``models``, the run record describing each, every
hook detached at close; a second model without names refused loudly, never mixed in."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from monitor_client import Monitor, MonitorClientError, MonitorSettings, WatchSettings

STEPS = 6


def _monitor(receiver, tmp_path, run_id: str) -> Monitor:
    return Monitor(receiver.url, "gan", run_id=run_id, config={"loss_kind": "gan"},
                   settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False,
                                            linger=0.02,
                                            watch=WatchSettings(layer_stats_every=2)))


def _gan():
    torch.manual_seed(0)
    net_g = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 8), nn.Tanh())
    net_d = nn.Sequential(nn.Linear(8, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    opt_d = torch.optim.Adam(net_d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(net_g.parameters(), lr=1e-3, betas=(0.5, 0.999))
    return net_g, net_d, opt_g, opt_d


def _train(mon, net_g, net_d, opt_g, opt_d) -> list[tuple[float, float]]:
    """The DCGAN loop: the discriminator on real and fake, then the generator; one
    log_step per iteration. Returns each iteration's (D, G) gradient norms."""
    criterion = nn.BCEWithLogitsLoss()
    norms = []
    for step in range(1, STEPS + 1):
        real = torch.randn(32, 8) * 0.5 + 1.0
        noise = torch.randn(32, 4)
        net_d.zero_grad()
        err_real = criterion(net_d(real), torch.ones(32, 1))
        fake = net_g(noise)
        err_fake = criterion(net_d(fake.detach()), torch.zeros(32, 1))
        (err_real + err_fake).backward()
        d_norm = _norm(net_d)
        opt_d.step()
        net_g.zero_grad()
        err_g = criterion(net_d(fake), torch.ones(32, 1))
        err_g.backward()
        norms.append((d_norm, _norm(net_g)))
        opt_g.step()
        mon.log_step(step, loss=err_g, loss_d=err_real + err_fake, samples=32)
    return norms


def _norm(model: nn.Module) -> float:
    return math.sqrt(sum(p.grad.double().norm().item() ** 2 for p in model.parameters()))


def _hooks(*objects) -> int:
    count = 0
    for obj in objects:
        if isinstance(obj, nn.Module):
            count += sum(len(m._forward_hooks) + len(m._forward_pre_hooks)
                         for m in obj.modules())
        else:
            count += len(obj._optimizer_step_pre_hooks) + len(obj._optimizer_step_post_hooks)
    return count


def test_a_gan_reports_each_model_under_its_name(receiver, tmp_path):
    net_g, net_d, opt_g, opt_d = _gan()
    mon = _monitor(receiver, tmp_path, "dcgan")
    mon.watch(net_d, opt_d, name="D")
    mon.watch(net_g, opt_g, name="G")
    assert _hooks(net_g, net_d, opt_g, opt_d) > 0
    norms = _train(mon, net_g, net_d, opt_g, opt_d)
    assert mon.close(timeout=10)
    assert _hooks(net_g, net_d, opt_g, opt_d) == 0  # every model's hooks detached

    run = receiver.of_kind("run")[0]
    models = run["model"]["models"]
    assert [(m["name"], m["class"], m["prefix"], m["optimizer"]) for m in models] == [
        ("D", "Sequential", "D.", "Adam"), ("G", "Sequential", "G.", "Adam")]
    assert [m["n_params"] for m in models] == [
        sum(p.numel() for p in net.parameters()) for net in (net_d, net_g)]
    assert run["model"]["layer_order"] == (
        [f"D.{n}" for n, _ in net_d.named_parameters()]
        + [f"G.{n}" for n, _ in net_g.named_parameters()])

    steps = sorted(receiver.of_kind("step"), key=lambda r: r["step"])
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for record, (d_norm, g_norm) in zip(steps, norms, strict=True):
        by_model = record["models"]
        assert by_model["D"]["grad_norm"] == pytest.approx(d_norm, rel=1e-5)
        assert by_model["G"]["grad_norm"] == pytest.approx(g_norm, rel=1e-5)
        assert (by_model["D"]["lr"], by_model["G"]["lr"]) == (2e-4, 1e-3)
        assert record["grad_norm"] == pytest.approx(math.hypot(d_norm, g_norm), rel=1e-5)
        assert record["lr"] == 2e-4 and not record.get("skipped")
        assert record["loss_d"] > 0  # the script's own number (a tensor), sent with the step
    layered = [r for r in steps if r.get("layers")]
    assert layered
    for record in layered:
        assert set(record["layers"]) == set(run["model"]["layer_order"])
        assert record["param_norm"] == pytest.approx(math.hypot(
            record["models"]["D"]["param_norm"], record["models"]["G"]["param_norm"]))
    # the forward check spans both models, in forward order
    assert any(name.startswith("G.") for name in _finite_names(mon))


def _finite_names(mon) -> list[str]:
    return list(mon._finite.names) if mon._finite is not None else []


def test_an_actor_and_a_critic_one_of_which_does_not_step(receiver, tmp_path):
    """The critic learns every step, the actor every other one: a step record says which
    model's optimizer did not step, and is not itself a skipped step."""
    torch.manual_seed(1)
    actor, critic = nn.Linear(4, 2), nn.Linear(4, 1)
    opt_a = torch.optim.SGD(actor.parameters(), lr=0.01)
    opt_c = torch.optim.SGD(critic.parameters(), lr=0.05)
    mon = _monitor(receiver, tmp_path, "a2c")
    mon.watch(actor, opt_a, name="actor")
    mon.watch(critic, opt_c, name="critic", grad_clip=0.5)
    for step in range(1, STEPS + 1):
        obs = torch.randn(16, 4)
        value_loss = (critic(obs) - 1.0).pow(2).mean()
        value_loss.backward()
        opt_c.step()
        opt_c.zero_grad()
        if step % 2 == 0:
            policy_loss = -torch.log_softmax(actor(obs), dim=1)[:, 0].mean()
            policy_loss.backward()
            opt_a.step()
            opt_a.zero_grad()
        mon.log_step(step, loss=value_loss, samples=16)
    assert mon.close(timeout=10)
    steps = sorted(receiver.of_kind("step"), key=lambda r: r["step"])
    assert not any(r.get("skipped") for r in steps)
    assert [bool(r["models"]["actor"].get("skipped")) for r in steps] == [True, False] * 3
    assert all(r["models"]["critic"]["clip_threshold"] == 0.5 for r in steps)
    assert all("clip_threshold" not in r for r in steps)  # no one threshold for the step


def test_a_second_model_without_names_is_refused_and_nothing_is_mixed(receiver, tmp_path):
    net_g, net_d, opt_g, opt_d = _gan()
    mon = _monitor(receiver, tmp_path, "unnamed")
    mon.watch(net_d, opt_d)
    with pytest.raises(MonitorClientError, match="give each a name") as refused:
        mon.watch(net_g, opt_g)
    assert isinstance(refused.value, ValueError)
    with pytest.raises(ValueError, match="already watches"):
        mon.watch(net_g, opt_g, name="G")  # beside an unnamed model: refused too
    assert _hooks(net_g, opt_g) == 0  # nothing of the refused model is hooked
    _train(mon, net_g, net_d, opt_g, opt_d)
    assert mon.close(timeout=10)
    run = receiver.of_kind("run")[0]
    assert "models" not in run["model"]
    assert run["model"]["layer_order"] == [n for n, _ in net_d.named_parameters()]
    steps = receiver.of_kind("step")
    assert steps and all(set(r.get("layers") or {}) <= set(run["model"]["layer_order"])
                         for r in steps)
    assert not any("models" in r for r in steps)


def test_watching_the_same_model_again_rehooks_it(receiver, tmp_path):
    """A new optimizer for the same model (a schedule that rebuilds it): the model is
    watched again under its name; the old optimizer keeps no hook of ours."""
    net_g, net_d, opt_g, opt_d = _gan()
    mon = _monitor(receiver, tmp_path, "rewatch")
    mon.watch(net_d, opt_d, name="D")
    mon.watch(net_g, opt_g, name="G")
    opt_d2 = torch.optim.SGD(net_d.parameters(), lr=0.1)
    mon.watch(net_d, opt_d2, name="D")
    assert _hooks(opt_d) == 0 and _hooks(opt_d2) > 0
    with pytest.raises(ValueError, match="already watches"):
        mon.watch(net_g, opt_g, name="D")  # another model under a name in use
    _train(mon, net_g, net_d, opt_g, opt_d2)
    assert mon.close(timeout=10)
    assert [m["name"] for m in receiver.of_kind("run")[0]["model"]["models"]] == ["D", "G"]
    assert all(r["models"]["D"]["lr"] == 0.1 for r in receiver.of_kind("step"))
