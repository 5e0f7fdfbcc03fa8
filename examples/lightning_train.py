"""The char-level GPT of ``train_gpt.py`` trained by Lightning, reported by
``monitor_client.lightning.MonitorCallback``.

    python examples/lightning_train.py --url http://127.0.0.1:9400 --steps 100
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_gpt import VOCAB, CharGPT, load_text  # noqa: E402

from monitor_client.lightning import MonitorCallback  # noqa: E402


class Windows(torch.utils.data.Dataset):
    def __init__(self, data: torch.Tensor, seq: int) -> None:
        self.data, self.seq = data, seq

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq

    def __getitem__(self, i: int):
        start = i * self.seq
        return self.data[start:start + self.seq], self.data[start + 1:start + self.seq + 1]


class LitGPT(pl.LightningModule):
    def __init__(self, seq_len: int = 64, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = CharGPT(len(VOCAB), 64, 2, 4, seq_len)

    def training_step(self, batch, batch_idx):
        return self.model(*batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.model(*batch))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:9400")
    p.add_argument("--run-id", default=None)
    p.add_argument("--steps", type=int, default=100)
    args = p.parse_args()
    data = load_text(400_000)
    split = int(0.9 * len(data))
    train = torch.utils.data.DataLoader(Windows(data[:split], 64), batch_size=16, shuffle=True)
    val = torch.utils.data.DataLoader(Windows(data[split:], 64), batch_size=16)
    callback = MonitorCallback(url=args.url, project="lightning-gpt", run_id=args.run_id,
                               tokens_per_sample=64)
    trainer = pl.Trainer(max_steps=args.steps, gradient_clip_val=1.0, val_check_interval=50,
                         limit_val_batches=4, accelerator="cpu", logger=False,
                         enable_checkpointing=False, callbacks=[callback])
    trainer.fit(LitGPT(), train, val)
    print(f"run {callback.monitor.run_id}: {callback.monitor.counters()}")


if __name__ == "__main__":
    main()
