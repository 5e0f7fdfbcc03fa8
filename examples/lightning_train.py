"""The char-level GPT of ``train_gpt.py`` trained by Lightning, reported by
``monitor_client.lightning.MonitorCallback``.

    python examples/lightning_train.py --url http://127.0.0.1:9400 --steps 100 --inject-nan 40

``--inject-nan N`` poisons step N with one infinite activation (as ``train_gpt.py``); an
alert rule with ``action: stop`` makes the callback set ``trainer.should_stop``; the exit
status is then 3.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_gpt import (  # noqa: E402
    VOCAB,
    CharGPT,
    framework_arguments,
    framework_exit_status,
    framework_settings,
    load_text,
)

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
    def __init__(self, seq_len: int = 64, lr: float = 3e-3, inject_nan: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = CharGPT(len(VOCAB), 64, 2, 4, seq_len)

    def training_step(self, batch, batch_idx):
        # global_step counts finished optimizer steps: this one is global_step + 1.
        self.model.poison = self.global_step + 1 == self.hparams.inject_nan
        return self.model(*batch)

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.model(*batch))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.1)


def main() -> int:
    args = framework_arguments(__doc__).parse_args()
    data, _ = load_text(400_000)
    split = int(0.9 * len(data))
    train = torch.utils.data.DataLoader(Windows(data[:split], 64), batch_size=16, shuffle=True)
    val = torch.utils.data.DataLoader(Windows(data[split:], 64), batch_size=16)
    callback = MonitorCallback(url=args.url, project="lightning-gpt", run_id=args.run_id,
                               tokens_per_sample=64, settings=framework_settings(args))
    trainer = pl.Trainer(max_steps=args.steps, gradient_clip_val=1.0, val_check_interval=50,
                         limit_val_batches=4, accelerator="cpu", logger=False,
                         enable_checkpointing=False, callbacks=[callback])
    trainer.fit(LitGPT(inject_nan=args.inject_nan), train, val)
    return framework_exit_status(callback.monitor)


if __name__ == "__main__":
    sys.exit(main())
