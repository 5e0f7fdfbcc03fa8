"""A user's LBFGS script in float64, instrumented from docs/client.md ("LBFGS, closures and
float64").

Written the way pytorch/examples' ``time_sequence_prediction/train.py`` is: sine waves, a
``Sequence`` of two ``LSTMCell``s, everything ``.double()``, ``optim.LBFGS`` stepped with a
closure that computes the loss and its gradients. Shrunk to run on a CPU in seconds. The
monitoring is the lines marked ``# monitor``.
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

import monitor_client  # monitor


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 16)
        self.lstm2 = nn.LSTMCell(16, 16)
        self.linear = nn.Linear(16, 1)

    def forward(self, input):
        outputs = []
        h_t = torch.zeros(input.size(0), 16, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 16, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 16, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 16, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--run_id", default=None)
opt = parser.parse_args()
np.random.seed(2)
torch.manual_seed(0)
T, L, N = 20, 100, 12
x = np.empty((N, L), "int64")
x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
data = np.sin(x / 1.0 / T).astype("float64")
input = torch.from_numpy(data[3:, :-1])
target = torch.from_numpy(data[3:, 1:])
test_input = torch.from_numpy(data[:3, :-1])
test_target = torch.from_numpy(data[:3, 1:])
seq = Sequence()
seq.double()
criterion = nn.MSELoss()
optimizer = optim.LBFGS(seq.parameters(), lr=0.8)
mon = monitor_client.Monitor(project="lbfgs", run_id=opt.run_id, total_steps=opt.steps)  # monitor
mon.watch(seq, optimizer)  # monitor
for i in range(1, opt.steps + 1):
    def closure():
        optimizer.zero_grad()
        out = seq(input)
        loss = criterion(out, target)
        loss.backward()
        return loss

    loss = optimizer.step(closure)
    mon.log_step(i, loss=loss, samples=input.size(0))  # monitor
    with torch.no_grad():
        pred = seq(test_input)
        test_loss = criterion(pred, test_target)
        mon.log_eval(i, val_loss=test_loss)  # monitor
        print("step", i, "loss", loss.item(), "test loss:", test_loss.item())
mon.close()  # monitor
