"""rank_outlier: one rank's local loss far outside its peers' spread, for several steps."""

from __future__ import annotations

import math

import numpy as np
from synth_records import assert_restore_equivalent, feed, only, step

from monitor_agent.records.types import RunRecord


def _ddp(n: int = 300, ranks: int = 4, bad: int = 2, from_step: int = 10**9,
         scale: float = 1.0, seed: int = 0, lag: int = 0) -> list:
    """Ranks' local losses: a shared decaying curve plus each rank's own batch noise
    (Gaussian, sd 0.05, with a hard batch 5x as noisy one step in 50); rank ``bad``'s loss
    is multiplied by ``scale`` from ``from_step``. Rank ``bad``'s records arrive ``lag``
    steps behind the others'."""
    rng = np.random.default_rng(seed)
    recs: list = [RunRecord(run_id="r", time=0.0, rank=r, labels={"hostname": f"node-{r}"})
                  for r in range(ranks)]
    per_step = []
    for i in range(1, n):
        row = []
        for r in range(ranks):
            sd = 0.25 if rng.random() < 0.02 else 0.05
            loss = 2.0 + 1.5 * math.exp(-i / 80) + rng.normal(0, sd)
            if r == bad and i >= from_step:
                loss *= scale
            row.append(step(i, rank=r, loss=loss))
        per_step.append(row)
    for k, row in enumerate(per_step):
        recs += [rec for r, rec in enumerate(row) if r != bad]
        if k >= lag:
            recs.append(per_step[k - lag][bad])
    recs += [row[bad] for row in per_step[len(per_step) - lag:]] if lag else []
    return recs


def test_a_rank_with_a_corrupt_shard_is_named_with_its_host_and_onset():
    found = feed(only("rank_outlier"), _ddp(from_step=150, scale=1.5))
    assert found and {f.rank for f in found} == {2}
    first = found[0]
    assert 150 <= first.step <= 158 and first.evidence["since_step"] >= 150
    assert first.evidence["host"] == "node-2" and first.evidence["z"] > 6
    assert first.message.startswith("rank 2 (host node-2): local loss")
    assert "peers' sigmas above them" in first.message


def test_a_rank_far_below_its_peers_is_named_too():
    found = feed(only("rank_outlier"), _ddp(from_step=150, scale=0.3, bad=0))
    assert found and found[0].rank == 0 and "below them" in found[0].message


def test_a_rank_whose_records_arrive_late_is_judged_on_the_same_steps():
    found = feed(only("rank_outlier"), _ddp(from_step=150, scale=1.5, lag=7))
    assert found and found[0].rank == 2 and 150 <= found[0].step <= 158


def test_quiet_on_healthy_runs_of_three_to_sixteen_ranks():
    for ranks in (3, 4, 8, 16):
        for seed in range(2):
            assert feed(only("rank_outlier"), _ddp(n=800, ranks=ranks, seed=seed)) == []


def test_two_ranks_have_no_peers_spread_and_say_nothing():
    assert feed(only("rank_outlier"), _ddp(ranks=2, bad=1, from_step=50, scale=3.0)) == []


def test_a_non_finite_loss_is_left_to_nan_inf():
    recs = _ddp(from_step=150, scale=math.nan)
    assert feed(only("rank_outlier"), recs) == []


def test_restore_mid_stretch_changes_nothing():
    recs = _ddp(from_step=150, scale=1.5, lag=3)
    assert_restore_equivalent(lambda: only("rank_outlier"), recs, cut=4 + 152 * 4)


def test_many_ranks_are_judged_on_the_same_numbers_as_few():
    """Past 16 peers the leave-one-out medians come off one sorted array: the same numbers
    as taking each rank's peers apart, ties included."""
    from monitor_agent.detectors.rank_outlier import _spread, peer_stats
    from monitor_agent.detectors.support.stats import median

    rng = np.random.default_rng(5)
    for n in (3, 17, 18, 19, 64, 301):
        values = np.round(rng.normal(2.0, 0.05, n), 2)  # rounded: ties
        centres, spreads = peer_stats(values)
        for i in range(n):
            peers = np.delete(values, i)
            assert centres[i] == median(peers)
            assert spreads[i] == _spread(peers, median(peers))


def test_a_rank_with_a_corrupt_shard_is_named_among_many():
    found = feed(only("rank_outlier"), _ddp(n=200, ranks=64, bad=40, from_step=150, scale=1.5))
    assert found and {f.rank for f in found} == {40} and 150 <= found[0].step <= 158


def test_a_divergence_of_the_whole_run_names_no_rank():
    """Every rank's loss runs away at once, each by its own batches: the peers spread apart
    with it, and no rank is apart from them (the pooled spread alone lags behind)."""
    rng = np.random.default_rng(3)
    recs: list = [RunRecord(run_id="r", time=0.0, rank=r, labels={"hostname": f"node-{r}"})
                  for r in range(4)]
    for i in range(1, 260):
        grow = 1.0 if i < 200 else 1.35 ** (i - 200)
        recs += [step(i, rank=r, loss=(2.0 + rng.normal(0, 0.05)) * grow
                      * (1 + (rng.normal(0, 0.3) if i >= 200 else 0.0)))
                 for r in range(4)]
    assert feed(only("rank_outlier"), recs) == []
