"""A classifier trained the way many scripts are written, instrumented from README.md and
docs/client.md: the step index is ``enumerate(loader)``'s (it goes back to 0 every epoch),
the LR is passed as ``scheduler.get_last_lr()`` (a list, one per param group), the loss as
a NumPy number, extra fields of several kinds, and an evaluation at each epoch's end.

``--every N`` logs only every N-th batch and clips through ``watch(grad_clip=)``; with
``--sparse`` the features come from an ``nn.Embedding(sparse=True)`` table.
"""

import argparse

import numpy as np
import torch

import monitor_client

parser = argparse.ArgumentParser()
parser.add_argument("--run_id", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--every", type=int, default=1)
parser.add_argument("--sparse", action="store_true")
args = parser.parse_args()

torch.manual_seed(0)
X = torch.randint(0, 100, (320, 4)) if args.sparse else torch.randn(320, 10)
Y = (X[:, 0] > X[:, 1]).long() + (X[:, 2] > X[:, 3]).long()
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=32,
                                     shuffle=True)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(100, 10, sparse=True) if args.sparse else None
        self.mlp = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.table(x).mean(1) if self.table is not None else x)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.0 if args.sparse else 0.9)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
mon = monitor_client.Monitor(run_id=args.run_id, project="epochs",
                             total_steps=args.epochs * len(loader))
mon.watch(model, optimizer, grad_clip=1.0 if args.every > 1 else None)
for epoch in range(args.epochs):
    for i, (x, y) in enumerate(loader):
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if i % args.every == 0:
            accuracy = (out.argmax(1) == y).float().mean()
            mon.log_step(i, loss=np.float32(loss.item()), lr=scheduler.get_last_lr(),
                         samples=len(x), epoch=epoch, accuracy=accuracy)
    with torch.no_grad():
        val = torch.nn.functional.cross_entropy(model(X[:64]), Y[:64]).item()
    mon.log_eval(i, val_loss=val)
    print(f"epoch {epoch} val {val:.3f}")
    scheduler.step()
mon.close()
