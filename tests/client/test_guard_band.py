"""The band the step guard judges a gradient norm against (_guard.py's ``judge``), on
norms chosen so that the documented numbers give the edge by hand: a norm is skipped when
its log is more than ``k`` noise sigmas above the level (the median log-norm of the last
``level`` taken steps), the noise 1.4826 x the MAD of the step-to-step changes / sqrt 2, at
least ``floor``; a norm just under the edge is taken. Skipped norms never enter the window.

tests/client/test_guard.py proves the skips themselves (exact, per optimizer) on a
training loop.
"""

from __future__ import annotations

import math

import pytest
import torch

from monitor_client._guard import SKIP_REASONS, judge, level_of, new_window, skip_reason
from monitor_client.settings import GuardSettings

TAKEN, NONFINITE, OUTLIER, LOSS_SCALE = 0, 1, 2, 3

# Log-norms rising by 0.5 a step (a trend) with changes of 0.5 + (+-0.1, +-0.2, +-0.3, 0):
# the changes' median is 0.5 and their absolute deviations from it 0.1, 0.1, 0.2, 0.2, 0.3,
# 0.3, 0: MAD 0.2. Noise sigma = 1.4826 x 0.2 / sqrt 2 = 0.20967; the level, the median of
# the last 3 log-norms (2.8, 3.0, 3.5), is 3.0: at k = 10 the edge is log-norm 5.0967.
TREND = [0.0, 0.6, 1.0, 1.7, 2.0, 2.8, 3.0, 3.5]
TREND_EDGE = 3.0 + 10 * 1.4826 * 0.2 / math.sqrt(2.0)
# Four wild log-norms first, judged before the history is long enough to judge any: the
# ring has wrapped past them (window 8) by the time the trend is in.
WILD = [-5.0, 5.0, -5.0, 5.0]
CONFIG = GuardSettings(k=10.0, window=8, level=3, min_history=8, floor=0.01)


def _window(config: GuardSettings, log_norms: list[float]):
    """A fresh window that has taken these norms (each asserted taken)."""
    window, pos = new_window(config)
    for value in log_norms:
        skip, code = judge(window, pos, torch.tensor(math.exp(value)), config)
        assert (bool(skip), int(code)) == (False, TAKEN), value
    return window, pos


def _code(config: GuardSettings, log_norms: list[float], norm: float, **kw) -> int:
    window, pos = _window(config, log_norms)
    return int(judge(window, pos, torch.tensor(norm), config, **kw)[1])


@pytest.mark.parametrize("history", [TREND, WILD + TREND], ids=["fresh", "wrapped"])
def test_a_norm_more_than_k_noise_sigmas_above_the_level_is_skipped(history):
    assert _code(CONFIG, history, math.exp(TREND_EDGE * 0.98)) == TAKEN
    assert _code(CONFIG, history, math.exp(TREND_EDGE * 1.02)) == OUTLIER


def test_the_band_scales_with_k():
    wider = GuardSettings(k=20.0, window=8, level=3, min_history=8, floor=0.01)
    edge = 3.0 + 20 * 1.4826 * 0.2 / math.sqrt(2.0)
    assert _code(wider, TREND, math.exp(TREND_EDGE * 1.1)) == TAKEN
    assert _code(wider, TREND, math.exp(edge * 0.98)) == TAKEN
    assert _code(wider, TREND, math.exp(edge * 1.02)) == OUTLIER


def test_a_steady_norm_is_judged_with_the_floor_for_its_noise():
    # No step-to-step change at all: sigma is the floor, 0.1, so the edge is 2 x e^(10 x 0.1)
    floored = GuardSettings(k=10.0, window=8, level=3, min_history=8, floor=0.1)
    steady = [math.log(2.0)] * 8
    assert _code(floored, steady, 2.0 * math.e * 0.98) == TAKEN
    assert _code(floored, steady, 2.0 * math.e * 1.02) == OUTLIER


def test_without_a_floor_the_runs_own_norm_is_taken_and_a_hair_above_it_is_not():
    # Skipped is "more than" k sigmas above the level: at sigma 0, exactly the level is in.
    bare = GuardSettings(k=10.0, window=8, level=3, min_history=8, floor=0.0)
    steady = [0.0] * 8
    assert _code(bare, steady, 1.0) == TAKEN
    assert _code(bare, steady, 1.01) == OUTLIER


def test_a_small_norm_is_never_a_reason_to_skip():
    assert _code(CONFIG, TREND, 1e-6) == TAKEN
    assert _code(CONFIG, TREND, 0.0) == TAKEN  # an all-zero gradient is a real step


def test_steps_of_all_zero_gradients_are_taken_and_leave_the_band_as_it_was():
    # A masked stretch of data: eight steps whose gradient is all zero, at the defaults,
    # then the run's own norm again. Before, the zeros entered the window as log(1e-30),
    # the level fell there, and every later step was skipped as an outlier for good.
    config = GuardSettings()
    window, pos = _window(config, [0.0] * 100)
    level = float(level_of(window, pos, config))
    zeros = [int(judge(window, pos, torch.tensor(0.0), config)[1]) for _ in range(8)]
    assert zeros == [TAKEN] * 8
    assert float(level_of(window, pos, config)) == level
    after = [int(judge(window, pos, torch.tensor(1.0), config)[1]) for _ in range(20)]
    assert after == [TAKEN] * 20
    assert _code(CONFIG, [], 0.0) == TAKEN  # and no history: nothing counts as one


def test_nothing_is_an_outlier_until_min_history_norms_are_in():
    assert _code(CONFIG, TREND[:7], 1e6) == TAKEN
    assert _code(CONFIG, TREND, 1e6) == OUTLIER


@pytest.mark.parametrize("norm", [float("nan"), float("inf"), float("-inf")])
def test_a_non_finite_norm_is_skipped_from_the_first_step(norm):
    assert _code(CONFIG, [], norm) == NONFINITE
    assert _code(CONFIG, TREND, norm) == NONFINITE


def test_skipped_norms_never_enter_the_window_nor_count_as_history():
    window, pos = _window(CONFIG, TREND)
    before = float(level_of(window, pos, CONFIG))
    for norm in (float("nan"), 1e6, 1e7, float("inf")):
        skip, code = judge(window, pos, torch.tensor(norm), CONFIG)
        assert bool(skip) and int(code) in (NONFINITE, OUTLIER)
    assert float(level_of(window, pos, CONFIG)) == before  # a burst cannot move the band
    assert int(judge(window, pos, torch.tensor(math.exp(TREND_EDGE * 1.02)), CONFIG)[1]) \
        == OUTLIER
    empty, epos = new_window(CONFIG)
    for _ in range(20):
        judge(empty, epos, torch.tensor(float("nan")), CONFIG)
    assert int(judge(empty, epos, torch.tensor(1e6), CONFIG)[1]) == TAKEN  # no history yet


def test_the_level_follows_the_last_taken_steps_around_the_ring():
    # window 8, level 3: after 12 taken norms the level is the median of the 10th to 12th
    config = GuardSettings(k=10.0, window=8, level=3, min_history=8, floor=1.0)
    window, pos = _window(config, [0.0] * 9 + [1.0, 2.0, 3.0])
    assert float(level_of(window, pos, config)) == pytest.approx(math.e ** 2, rel=1e-5)
    window, pos = _window(config, [4.0, 4.0, 4.0, 0.0, 1.0, 2.0])  # not yet wrapped
    assert float(level_of(window, pos, config)) == pytest.approx(math.e, rel=1e-5)
    assert math.isnan(float(level_of(*new_window(config), config)))  # nothing taken yet


def test_a_grad_scaler_overflow_is_its_reason_whatever_the_norm():
    overflow, clean = torch.tensor(1.0), torch.tensor(0.0)
    assert _code(CONFIG, TREND, math.exp(3.0), scaler_inf=overflow) == LOSS_SCALE
    assert _code(CONFIG, TREND, float("nan"), scaler_inf=overflow) == LOSS_SCALE
    assert _code(CONFIG, TREND, math.exp(3.0), scaler_inf=clean) == TAKEN
    assert _code(CONFIG, TREND, float("nan"), scaler_inf=clean) == NONFINITE
    assert _code(CONFIG, TREND, 1e6, scaler_inf=clean) == OUTLIER


def test_a_grad_scaler_overflow_skips_and_leaves_the_window_alone():
    window, pos = _window(CONFIG, TREND)
    before = float(level_of(window, pos, CONFIG))
    for _ in range(3):  # an overflowed step's norm is the scaler's problem, not history
        skip, _ = judge(window, pos, torch.tensor(math.exp(9.0)), CONFIG,
                        scaler_inf=torch.tensor(1.0))
        assert bool(skip)
    assert float(level_of(window, pos, CONFIG)) == before


def test_each_code_decodes_to_its_reason_and_anything_else_to_none():
    assert [skip_reason(c) for c in (0.0, 1.0, 2.0, 3.0)] == [
        None, "nonfinite_grad", "grad_norm_outlier", "loss_scale"]
    assert SKIP_REASONS[1:] == ("nonfinite_grad", "grad_norm_outlier", "loss_scale")
    assert [skip_reason(c) for c in (None, float("nan"), -1.0, 4.0, 9.0)] == [None] * 5


def test_an_empty_window_is_the_configured_size_and_starts_at_its_first_slot():
    config = GuardSettings(window=8, min_history=8, level=3)
    window, pos = new_window(config)
    assert window.shape == (8,) and torch.isnan(window).all() and window.dtype == torch.float32
    assert int(pos) == 0 and pos.dtype == torch.long
    judge(window, pos, torch.tensor(math.e), config)
    assert float(level_of(window, pos, config)) == pytest.approx(math.e, rel=1e-5)
