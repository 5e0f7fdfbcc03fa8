"""grad_vanishing: early layers < 1% of late ones along layer_order, or one dominating
parameter (relative gradient) starving the rest."""

from __future__ import annotations

import dataclasses

from synth_records import assert_restore_equivalent, feed, geometric, layers, names, only, run, step


def _stream(grads, n_steps: int = 30, param=None, order=True) -> list:
    n = names(len(grads))
    head = [run(layer_order=list(reversed(n)) if order == "reversed" else n)] if order else []
    return head + [step(i, layers=layers(n, grads, param)) for i in range(1, n_steps)]


def test_early_layers_far_below_late_layers_fire_early():
    found = feed(only("grad_vanishing"), _stream(geometric(16, 1e-12, 0.5)))
    assert found and found[0].step == 10  # the first full window of medians
    assert found[0].value < 1e-8 and "early layers" in found[0].message


def test_depth_comes_from_layer_order_not_parameter_order():
    # Same numbers, but layer_order says the small ones are the late layers: no depth finding.
    found = feed(only("grad_vanishing"), _stream(geometric(16, 1e-12, 0.5), order="reversed"))
    assert [f for f in found if f.layer is None] == []


def test_dominating_parameter_is_named():
    grads = [1.0] * 8
    grads[0] = 5000.0  # relative to param norm 1 like the others: 5000x
    found = feed(only("grad_vanishing"), _stream(grads))
    dom = [f for f in found if f.layer is not None]
    assert dom and dom[0].layer == "layers.0.weight" and dom[0].value > 1000


def test_a_big_gradient_on_a_big_parameter_is_not_dominance():
    grads, params = [1.0] * 8, [1.0] * 8
    grads[0], params[0] = 500.0, 500.0  # an embedding: big, but the same relative gradient
    assert feed(only("grad_vanishing"), _stream(grads, param=params)) == []


def test_the_output_head_taking_most_of_the_gradient_is_normal():
    grads = [1.0] * 8
    grads[-1] = 5000.0
    found = feed(only("grad_vanishing"), _stream(grads))
    assert [f for f in found if f.layer is not None] == []


def test_a_near_zero_bias_is_not_dominant():
    grads, params = [1.0] * 8, [1.0] * 8
    grads[2], params[2] = 0.5, 1e-6  # a fresh bias: huge grad/param, ordinary gradient
    assert feed(only("grad_vanishing"), _stream(grads, param=params)) == []


def test_quiet_on_balanced_gradients():
    assert feed(only("grad_vanishing"), _stream(geometric(16, 0.3, 1.0), n_steps=200)) == []


def test_restore_mid_stream_changes_nothing():
    recs = _stream(geometric(16, 1e-12, 0.5), n_steps=250)
    assert_restore_equivalent(lambda: only("grad_vanishing"), recs, cut=6)


def _two_models(d_grads, g_grads, n_steps: int = 30) -> list:
    """A run watching two models, D and G (Monitor.watch(name=)): their parameters are
    "D.<name>" and "G.<name>", and the run record says so (model.models[*].prefix)."""
    d = [f"D.{n}" for n in names(len(d_grads))]
    g = [f"G.{n}" for n in names(len(g_grads))]
    head = dataclasses.replace(run(), model={"layer_order": d + g, "models": [
        {"name": "D", "prefix": "D."}, {"name": "G", "prefix": "G."}]})
    return [head] + [step(i, layers=layers(d + g, [*d_grads, *g_grads]))
                     for i in range(1, n_steps)]


def test_two_models_are_judged_each_on_its_own_depth():
    """A critic whose gradients are 1000x an actor's is two scales, not one network whose
    early layers vanish; each model balanced in itself: quiet."""
    assert feed(only("grad_vanishing"), _two_models([1e-3] * 8, [1.0] * 8)) == []


def test_a_vanishing_model_is_found_beside_a_healthy_one():
    found = feed(only("grad_vanishing"), _two_models([1.0] * 8, geometric(16, 1e-12, 0.5)))
    depth = [f for f in found if f.layer is None]
    assert depth and depth[0].value < 1e-8


def test_dominance_is_judged_within_each_model():
    # Every G parameter has 1000x D's relative gradient: two models, no dominant parameter.
    assert [f for f in feed(only("grad_vanishing"), _two_models([1.0] * 8, [1000.0] * 8))
            if f.layer is not None] == []
