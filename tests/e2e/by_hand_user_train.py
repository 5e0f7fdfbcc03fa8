"""A user's loop without ``torch.optim``, instrumented from docs/client.md ("A loop without
torch.optim").

Written the way the PyTorch tutorial "Learning PyTorch with Examples" writes its ``nn``
example: a ``Sequential`` fitting a third-order polynomial to ``sin(x)``, the weights
updated by hand under ``torch.no_grad()``, ``model.zero_grad()`` after. The monitoring is
the lines marked ``# monitor``.
"""

import argparse
import math

import torch

import monitor_client  # monitor

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--run_id", default=None)
opt = parser.parse_args()

x = torch.linspace(-math.pi, math.pi, 2000)
y = torch.sin(x)
p = torch.tensor([1, 2, 3])
xx = x.unsqueeze(-1).pow(p)
model = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0, 1))
loss_fn = torch.nn.MSELoss(reduction="sum")
learning_rate = 1e-6
mon = monitor_client.Monitor(project="by-hand", run_id=opt.run_id, total_steps=opt.steps)  # monitor
mon.watch(model)  # monitor: no optimizer, the update below is ours
for t in range(1, opt.steps + 1):
    y_pred = model(xx)
    loss = loss_fn(y_pred, y)
    if t % 100 == 99:
        print(t, loss.item())
    model.zero_grad()
    loss.backward()
    mon.before_optimizer_step()  # monitor: the gradients, before the update uses them
    with torch.no_grad():
        for param in model.parameters():
            param -= learning_rate * param.grad
    mon.log_step(t, loss=loss, lr=learning_rate, samples=2000)  # monitor
mon.close()  # monitor
linear_layer = model[0]
print(f"Result: y = {linear_layer.bias.item()} + {linear_layer.weight[:, 0].item()} x")
