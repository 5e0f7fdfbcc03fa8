"""Training scripts written as a stranger writes them from README.md and docs/ alone, each a
shape issue 45 found the sidecar misjudging (tests/e2e/test_stranger_scripts.py runs them
against a real sidecar):

    python stranger_train.py SCRIPT URL RUN_ID [FAULT]

SCRIPT:
* ``gan``: a GAN on a 2-D gaussian, Adam for both networks, ``loss_kind="gan"``, the
  generator watched; FAULT ``lr100`` multiplies the generator's LR by 100 at step 150
  (its loss had been rising for 30 steps before: the discriminator winning).
* ``dcgan``: a tiny DCGAN-shaped GAN with an SGD generator; FAULT ``lr100`` multiplies the
  generator's LR by 100 at step 150: its samples overshoot to where the discriminator's
  sigmoid is exactly 1, and from about step 190 its loss and gradient are exactly 0 (the
  generator died: neither network can learn from those samples again).
* ``one_class``: a classifier whose head has one column under ``cross_entropy``: the loss
  is exactly 0 from step 1 and nothing learns (the DDP tutorial's ToyModel, one output).
* ``actor_critic``: REINFORCE with a value baseline on a hand-written CartPole, one episode
  a step, ``samples=`` the episode's length (which grows as the agent learns).
* ``lbfgs``: the LSTM sine-wave predictor in float64 with LBFGS and a closure, 15 steps;
  FAULT ``lr10`` multiplies the LR by 10 at step 8: the loss, 1e-4 by then, is 1e+44 at
  step 9 and goes on rising by ~36 decades a step, never leaving float64's range.
* ``crash``: a classifier under ``BCELoss``; at step 60 a batch holds a NaN and the loss's
  range check raises: the script dies of an uncaught exception. FAULT ``interrupt``: the
  user presses Ctrl-C at step 60 instead (SIGINT).
* ``warmup``: a regression whose LR warms up linearly from 0 (a ``LambdaLR`` of step/10,
  as HF's ``get_linear_schedule_with_warmup`` does): the first step's update is exactly 0,
  and the run learns.
"""

from __future__ import annotations

import math
import os
import signal
import sys

import torch
from torch import nn

import monitor_client

script, url, run_id = sys.argv[1], sys.argv[2], sys.argv[3]
fault = sys.argv[4] if len(sys.argv) > 4 else None
torch.manual_seed(0)
torch.set_num_threads(1)


def gan() -> None:
    # a GAN on a 2-D gaussian, both networks under Adam(betas=(0.5, 0.999)) as in dcgan
    netG = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    netD = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())
    optG = torch.optim.Adam(netG.parameters(), lr=1e-3, betas=(0.5, 0.999))
    optD = torch.optim.Adam(netD.parameters(), lr=1e-3, betas=(0.5, 0.999))
    criterion = nn.BCELoss()
    mon = monitor_client.Monitor(url=url, project="gan", run_id=run_id, loss_kind="gan",
                                 config={"lr": 1e-3}, total_steps=300)
    mon.watch(netG, optG)  # the generator is the model we train and watch
    for step in range(1, 301):
        if fault == "lr100" and step == 150:
            for group in optG.param_groups:
                group["lr"] *= 100
        real = torch.randn(64, 2) * 0.5 + 2.0
        fake = netG(torch.randn(64, 8))
        optD.zero_grad()
        errD = criterion(netD(real), torch.ones(64, 1)) + \
            criterion(netD(fake.detach()), torch.zeros(64, 1))
        errD.backward()
        optD.step()
        optG.zero_grad()
        errG = criterion(netD(fake), torch.ones(64, 1))
        errG.backward()
        optG.step()
        mon.log_step(step, loss=errG, samples=64, metrics={"loss_D": errD.item()})
    mon.close()


def dcgan() -> None:
    # pytorch/examples dcgan in miniature: BatchNorm + ReLU generator, LeakyReLU + Sigmoid
    # discriminator under BCELoss; "images" are 64 values in a 4-dimensional subspace
    nz, nx = 16, 64
    netG = nn.Sequential(nn.Linear(nz, 128), nn.BatchNorm1d(128), nn.ReLU(True),
                         nn.Linear(128, nx))
    netD = nn.Sequential(nn.Linear(nx, 128), nn.LeakyReLU(0.2, True), nn.Linear(128, 1),
                         nn.Sigmoid())
    optG = torch.optim.SGD(netG.parameters(), lr=0.01, momentum=0.9)
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion, basis = nn.BCELoss(), torch.randn(4, nx)
    mon = monitor_client.Monitor(url=url, project="gan", run_id=run_id, loss_kind="gan",
                                 config={"lr_G": 0.01, "lr_D": 2e-4}, total_steps=300)
    mon.watch(netG, optG)  # the generator is the model we train and watch
    for step in range(1, 301):
        if fault == "lr100" and step == 150:
            for group in optG.param_groups:
                group["lr"] *= 100
        real = torch.tanh(torch.randn(64, 4) @ basis * 0.5)
        fake = netG(torch.randn(64, nz))
        optD.zero_grad()
        errD = criterion(netD(real), torch.ones(64, 1)) + \
            criterion(netD(fake.detach()), torch.zeros(64, 1))
        errD.backward()
        optD.step()
        optG.zero_grad()
        errG = criterion(netD(fake), torch.ones(64, 1))
        errG.backward()
        optG.step()
        mon.log_step(step, loss=errG, samples=64, metrics={"loss_D": errD.item()})
    mon.close()


def one_class() -> None:
    model = nn.Sequential(nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001)
    mon = monitor_client.Monitor(url=url, project="toy", run_id=run_id, total_steps=200)
    mon.watch(model, optimizer)
    for step in range(1, 201):
        x, labels = torch.randn(20, 10), torch.zeros(20, dtype=torch.long)
        loss = nn.functional.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.log_step(step, loss=loss, samples=20)
    mon.close()


class CartPole:
    """CartPole-v1's physics (gym's equations), so the script needs nothing installed."""

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def reset(self) -> list[float]:
        self.s = (torch.rand(4, generator=self.gen) * 0.1 - 0.05).tolist()
        self.t = 0
        return self.s

    def step(self, action: int) -> tuple[list[float], float, bool]:
        x, x_dot, theta, theta_dot = self.s
        force = 10.0 if action == 1 else -10.0
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + 0.05 * theta_dot**2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos**2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * x_acc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc
        self.s, self.t = [x, x_dot, theta, theta_dot], self.t + 1
        done = abs(x) > 2.4 or abs(theta) > 0.2095 or self.t >= 500
        return self.s, 1.0, done


def actor_critic() -> None:
    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Linear(4, 128)
            self.actor, self.critic = nn.Linear(128, 2), nn.Linear(128, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = torch.relu(self.body(x))
            return torch.softmax(self.actor(h), dim=-1), self.critic(h)

    model = Policy()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    env, gamma, steps = CartPole(seed=543), 0.99, 300
    mon = monitor_client.Monitor(url=url, project="rl", run_id=run_id, loss_kind="actor_critic",
                                 config={"lr": 3e-3, "gamma": gamma}, total_steps=steps)
    mon.watch(model, optimizer)
    for step in range(1, steps + 1):
        state, log_probs, values, rewards, done = env.reset(), [], [], [], False
        while not done:  # one episode a step: its length is the agent's score
            probs, value = model(torch.tensor(state))
            action = torch.multinomial(probs, 1, generator=env.gen).item()
            log_probs.append(torch.log(probs[action]))
            values.append(value[0])
            state, reward, done = env.step(action)
            rewards.append(reward)
        returns, R = [], 0.0
        for r in reversed(rewards):
            R = r + gamma * R
            returns.insert(0, R)
        ret = torch.tensor(returns)
        ret = (ret - ret.mean()) / (ret.std() + 1e-8) if len(ret) > 1 else ret * 0
        value_t = torch.stack(values)
        advantage = ret - value_t.detach()
        loss = -(torch.stack(log_probs) * advantage).sum() + \
            nn.functional.smooth_l1_loss(value_t, ret, reduction="sum")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.log_step(step, loss=loss, samples=len(rewards),
                     metrics={"episode_length": len(rewards)})
    mon.close()


def lbfgs() -> None:
    # pytorch/examples time_sequence_prediction: sine waves, two LSTMCells, float64, LBFGS
    torch.set_default_dtype(torch.float64)
    t = torch.arange(40.0)  # the example's waves, shorter and fewer
    shift = torch.randint(-80, 80, (32, 1))
    data = torch.sin((t + shift) / 20.0)
    inp, target = data[:, :-1], data[:, 1:]

    class Sequence(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm1, self.lstm2 = nn.LSTMCell(1, 24), nn.LSTMCell(24, 24)
            self.linear = nn.Linear(24, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h1 = c1 = h2 = c2 = torch.zeros(x.size(0), 24)
            outputs = []
            for x_t in x.split(1, dim=1):
                h1, c1 = self.lstm1(x_t, (h1, c1))
                h2, c2 = self.lstm2(h1, (h2, c2))
                outputs.append(self.linear(h2))
            return torch.cat(outputs, dim=1)

    seq = Sequence()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)
    mon = monitor_client.Monitor(url=url, project="lbfgs", run_id=run_id, total_steps=15)
    # no mon.watch(seq, optimizer) here: a float64 model is issue 45's point 1, another change
    for step in range(1, 16):
        if fault == "lr10" and step == 8:
            for group in optimizer.param_groups:
                group["lr"] *= 10

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(seq(inp), target)
            loss.backward()
            return loss

        loss = optimizer.step(closure)
        # a float: the client packs tensors as float32, where float64's 1e+44 is inf
        mon.log_step(step, loss=loss.item(), samples=inp.size(0))
    mon.close()


def crash() -> None:
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = monitor_client.Monitor(url=url, project="crash", run_id=run_id, total_steps=200)
    mon.watch(model, optimizer)
    for step in range(1, 201):
        x = torch.randn(32, 8)
        y = (x[:, :1] > 0).float()
        if step == 60 and fault == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C
        if step == 60:
            x[3, 2] = float("nan")  # a corrupt sample
        loss = nn.functional.binary_cross_entropy(model(x), y)  # raises on the NaN
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mon.log_step(step, loss=loss, samples=32)
    mon.close()


def warmup() -> None:
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / 10))
    target = torch.randn(16, 1)
    mon = monitor_client.Monitor(url=url, project="warmup", run_id=run_id, total_steps=120)
    mon.watch(model, optimizer, grad_clip=1.0)
    for step in range(1, 121):
        x = torch.randn(32, 16)
        loss = nn.functional.mse_loss(model(x), x @ target)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        mon.log_step(step, loss=loss, samples=32)
    mon.close()


{"gan": gan, "dcgan": dcgan, "one_class": one_class, "actor_critic": actor_critic, "lbfgs": lbfgs,
 "crash": crash, "warmup": warmup}[script]()
