"""A tiny GPT-2 (built from a config, no download) trained by the HuggingFace ``Trainer``
on the Python standard library's source, reported by ``monitor_client.hf.MonitorCallback``.

    python examples/hf_trainer.py --url http://127.0.0.1:9400 --steps 100 --inject-nan 40

``--inject-nan N`` puts one infinite activation in step N (like ``train_gpt.py --inject
nan``): the weights then go NaN. An alert rule with ``action: stop`` makes the callback set
``control.should_training_stop``; the exit status is then 3.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_gpt import (  # noqa: E402
    VOCAB,
    framework_arguments,
    framework_exit_status,
    framework_settings,
    load_text,
)

from monitor_client.hf import MonitorCallback  # noqa: E402


class Chunks(torch.utils.data.Dataset):
    """Consecutive windows of the character stream, as causal-LM examples."""

    def __init__(self, data: torch.Tensor, seq: int) -> None:
        self.data, self.seq = data, seq

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.data[i * self.seq:(i + 1) * self.seq]
        return {"input_ids": ids, "labels": ids}


class InjectNaN(transformers.TrainerCallback):
    """Makes the token embedding's output infinite at one element during step ``step``."""

    def __init__(self, model: transformers.GPT2LMHeadModel, step: int) -> None:
        self.step, self.active = step, False
        model.transformer.wte.register_forward_hook(self._poison)

    def _poison(self, module, args, output):
        if self.active and module.training:
            output = output.clone()
            output[0, 0, 0] = float("inf")
        return output

    def on_step_begin(self, args, state, control, **kwargs):
        self.active = state.global_step + 1 == self.step


def main() -> int:
    p = framework_arguments(__doc__)
    p.add_argument("--seq-len", type=int, default=64)
    args = p.parse_args()
    data, _ = load_text(400_000)
    split = int(0.9 * len(data))
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=len(VOCAB),
                                     n_positions=args.seq_len, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        training = transformers.TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=16,
            learning_rate=3e-3, warmup_steps=10, max_grad_norm=1.0, logging_steps=10,
            eval_strategy="steps", eval_steps=50, per_device_eval_batch_size=16,
            save_strategy="no", report_to=[], use_cpu=True)
        callback = MonitorCallback(url=args.url, project="hf-gpt", run_id=args.run_id,
                                   settings=framework_settings(args))
        extra = [InjectNaN(model, args.inject_nan)] if args.inject_nan else []
        trainer = transformers.Trainer(
            model=model, args=training, callbacks=[callback, *extra],
            train_dataset=Chunks(data[:split], args.seq_len),
            eval_dataset=torch.utils.data.Subset(Chunks(data[split:], args.seq_len), range(64)))
        trainer.train()
    return framework_exit_status(callback.monitor)


if __name__ == "__main__":
    sys.exit(main())
