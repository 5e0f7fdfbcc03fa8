"""category_divergence: one category's eval loss rising against its own best and the rest."""

from __future__ import annotations

import dataclasses

from synth_records import assert_restore_equivalent, eval_rec, feed, only

from monitor_agent.detectors import category_divergence as tips


def _evals(rows: list[dict[str, float]]) -> list:
    out = []
    for k, row in enumerate(rows):
        metrics = {f"loss/{name}": value for name, value in row.items()}
        metrics["accuracy"] = 0.5  # other scores are not categories
        out.append(dataclasses.replace(eval_rec(100 * (k + 1), 2.0), metrics=metrics))
    return out


def _improving(n: int, **start: float) -> list[dict[str, float]]:
    return [{name: v * 0.93 ** k for name, v in start.items()} for k in range(n)]


def test_a_category_that_turns_worse_while_the_rest_improve_fires():
    rows = _improving(10, code=1.5, prose=2.5, math=3.0)
    for k in range(6, 10):
        rows[k]["math"] = rows[5]["math"] * 1.15 ** (k - 5)  # learned, then lost
    found = feed(only("category_divergence"), _evals(rows))
    assert found and {f.evidence["category"] for f in found} == {"math"}
    f = found[0]
    # Relative to the rest, math loses 24% per eval from step 700: 1.5x (the minimum
    # drift) is passed at 800, and it must hold two evals in a row.
    assert f.step == 900
    assert f.evidence["rise"] >= 0.1 and f.evidence["relative_drift"] >= 0.5
    assert f.suggestions == tips.CATEGORY_DIVERGENCE and "math" in f.message


def test_every_category_rising_together_is_not_one_category_diverging():
    rows = _improving(5, code=1.5, prose=2.5, math=3.0)
    rows += [{n: v * 1.3 ** k for n, v in rows[-1].items()} for k in range(1, 5)]
    assert feed(only("category_divergence"), _evals(rows)) == []


def test_noise_around_a_healthy_run_stays_quiet():
    wiggle = [1.0, 1.06, 0.97, 1.04, 0.99, 1.05, 0.98, 1.03, 1.0, 1.02]
    rows = [{n: v * w for n, v in r.items()}
            for r, w in zip(_improving(10, code=1.5, prose=2.5, math=3.0), wiggle, strict=True)]
    assert feed(only("category_divergence"), _evals(rows)) == []


def test_a_single_category_has_no_rest_to_diverge_from():
    rows = [{"only": 1.0 * 1.3 ** k} for k in range(8)]
    assert feed(only("category_divergence"), _evals(rows)) == []


def test_scale_free_the_same_run_times_1000_fires_the_same():
    rows = _improving(6, code=1.5, prose=2.5, math=3.0)
    rows += [{"code": 1.0, "prose": 1.5, "math": 2.0 * 1.2 ** k} for k in range(1, 4)]
    big = [{n: v * 1000 for n, v in r.items()} for r in rows]
    small = feed(only("category_divergence"), _evals(rows))
    assert small and [f.step for f in small] == [f.step for f in
                                                  feed(only("category_divergence"), _evals(big))]


def test_noisy_categories_need_a_change_beyond_their_own_noise():
    # Categories that wobble +-30% from eval to eval (few samples each): a 1.6x excursion
    # for two evals is within their noise and says nothing.
    wobble = [1.0, 1.3, 0.8, 1.25, 0.75, 1.3, 0.8, 1.6, 1.6, 0.9, 1.2]
    rows = [{"a": 1.0 * w, "b": 1.0 / w, "c": 1.0} for w in wobble]
    assert feed(only("category_divergence"), _evals(rows)) == []
    # The bar scales with that noise (4 robust sigmas, here ~2.2 in log units): a category
    # going 12x clears it.
    rows[-3:] = [{"a": 12.0, "b": 1.0, "c": 1.0}, {"a": 13.0, "b": 1.0, "c": 1.0},
                 {"a": 14.0, "b": 1.0, "c": 1.0}]
    found = feed(only("category_divergence"), _evals(rows))
    assert found and found[0].evidence["category"] == "a"


def test_restore_mid_stream_changes_nothing():
    rows = _improving(6, code=1.5, prose=2.5, math=3.0)
    rows += [{"code": 1.0, "prose": 1.5, "math": 2.0 * 1.2 ** k} for k in range(1, 6)]
    assert_restore_equivalent(lambda: only("category_divergence"), _evals(rows * 3), cut=7)
