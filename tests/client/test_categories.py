"""CategoryLoss: per-sample normalised per-category eval loss, through to the real sidecar."""

from __future__ import annotations

import httpx
import pytest
import torch

from monitor_client import CategoryLoss, Monitor, MonitorSettings


def test_each_sample_counts_once_whatever_its_length():
    # "short" has one 1-token sample of loss 0.1; "long" a 9-token sample of loss 3.0 and a
    # 1-token one of 1.0. Token-weighting would give long 2.8; per sample it is 2.0.
    tok = torch.tensor([[0.1] + [0.0] * 8, [3.0] * 9, [1.0] + [0.0] * 8])
    mask = torch.zeros_like(tok, dtype=torch.bool)
    mask[0, 0] = mask[2, 0] = True
    mask[1, :] = True
    cats = CategoryLoss()
    cats.add(tok, ["short", "long", "long"], mask=mask)
    assert cats.metrics() == pytest.approx({"loss/short": 0.1, "loss/long": 2.0})
    assert cats.overall() == pytest.approx((0.1 + 3.0 + 1.0) / 3)


def test_batches_accumulate_and_new_categories_appear_later():
    cats = CategoryLoss()
    cats.add(torch.tensor([1.0, 2.0]), ["a", "a"])
    cats.add(torch.tensor([[4.0, 4.0], [6.0, 6.0]]), ["a", "b"])
    assert cats.metrics() == pytest.approx({"loss/a": 7.0 / 3, "loss/b": 6.0})
    cats.reset()
    assert cats.metrics() == {} and cats.overall() is None


def test_categories_past_the_cap_are_counted_not_kept():
    cats = CategoryLoss(max_categories=2)
    cats.add(torch.tensor([1.0, 2.0, 3.0, 4.0]), ["a", "b", "c", "a"])
    assert set(cats.metrics()) == {"loss/a", "loss/b"} and cats.dropped == 1


def test_category_losses_reach_the_sidecar_metrics(sidecar, tmp_path):
    mon = Monitor(url=sidecar.url, project="cats", run_id="cats-1",
                  settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False, linger=0.02))
    cats = CategoryLoss()
    cats.add(torch.tensor([[1.0, 1.0], [2.0, 4.0]]), ["code", "prose"])
    mon.log_step(1, loss=1.0)
    mon.log_eval(1, val_loss=cats.overall(), metrics={**cats.metrics(), "accuracy": 0.5})
    assert mon.close(timeout=20)
    text = httpx.get(sidecar.url + "/metrics").text
    base = 'project="cats",run_id="cats-1",rank="0"'
    assert f'training_category_loss{{{base},category="code"}} 1.0' in text
    assert f'training_category_loss{{{base},category="prose"}} 3.0' in text
    assert f'training_eval_metric{{{base},name="accuracy"}} 0.5' in text
