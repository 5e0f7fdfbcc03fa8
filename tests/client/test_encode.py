import json
import math
from pathlib import Path

from monitor_client._encode import dumps_line, to_wire


def test_nonfinite_floats_become_format_strings_everywhere():
    rec = {"loss": math.nan, "layers": {"w": {"grad_norm": math.inf}}, "v": [-math.inf, 1.5]}
    assert json.loads(dumps_line(rec)) == {
        "loss": "NaN", "layers": {"w": {"grad_norm": "Infinity"}}, "v": ["-Infinity", 1.5]}


def test_unencodable_values_degrade_instead_of_raising():
    import numpy as np

    out = to_wire({"p": Path("/x"), "n": np.float32(2.5), "a": np.arange(2), "o": object()})
    assert out["p"] == "/x" and out["n"] == 2.5 and out["a"] == [0, 1]
    assert out["o"].startswith("<object")


def test_none_stays_null_and_bools_stay_bools():
    assert json.loads(dumps_line({"a": None, "b": True, "c": 3})) == {"a": None, "b": True, "c": 3}
