"""Shared statistics: bias-corrected EMA, rolling window median/MAD, snapshot round trip."""

from __future__ import annotations

import math

import numpy as np

from monitor_agent.detectors.support.state import dump, load_into
from monitor_agent.detectors.support.stats import Ema, Window, robust_z, slope
from monitor_agent.records import wire


def test_ema_first_value_is_the_start_and_converges():
    ema = Ema(alpha=0.99)
    assert ema.value is None
    ema.add(5.0)
    assert ema.value == 5.0
    for _ in range(2000):
        ema.add(1.0)
    assert abs(ema.value - 1.0) < 1e-6


def test_window_keeps_the_last_values_in_order():
    w = Window.of(3)
    for x in (1.0, 2.0, 3.0, 4.0):
        w.add(x)
    assert list(w.values()) == [2.0, 3.0, 4.0] and w.full and w.last() == 4.0
    assert w.median() == 3.0


def test_mad_ignores_the_outlier_it_is_meant_to_detect():
    w = Window.of(100)
    for i in range(99):
        w.add(1.0 + 0.01 * math.sin(i))
    w.add(1000.0)
    assert w.mad() < 0.02 and robust_z(2.0, w) > 50


def test_slope():
    assert abs(slope(np.array([1.0, 3.0, 5.0, 7.0])) - 2.0) < 1e-12


def test_state_round_trip_through_the_wire_keeps_nan():
    w = Window.of(4)
    w.add(math.nan)
    w.add(2.0)
    back = load_into(Window(), wire.loads(wire.dumps(dump(w))))
    assert math.isnan(back.buf[0]) and back.buf[1] == 2.0 and (back.n, back.i) == (2, 2)
    assert back.buf.dtype == np.float64
