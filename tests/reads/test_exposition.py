"""The /metrics renderer: format details, caps with drop counters, expiry, caching."""

from __future__ import annotations

import math

import numpy as np
from prometheus_client import CollectorRegistry

from monitor_agent.metrics.names import STEP_DURATION_BUCKETS
from monitor_agent.reads.exposition import Exposition, escape, fmt, fmts
from monitor_agent.records.types import (
    QUANTILE_LEVELS,
    LayerTable,
    QuantileTable,
    RunRecord,
    StepRecord,
)
from monitor_agent.runs.run_state import RunState


def _run(run_id: str, layers: int = 3, ranks: int = 1, labels: dict | None = None) -> RunState:
    run = RunState.new(run_id, now=0.0)
    run.apply_run(RunRecord(run_id=run_id, labels=labels or {"project": "p"}))
    table = LayerTable.from_mapping(
        {f"l{i}": {"grad_norm": float(i), "param_norm": 2.0, "update_norm": 0.002}
         for i in range(layers)}
    )
    for rank in range(ranks):
        run.apply_step(StepRecord(run_id=run_id, step=1, time=1.0, rank=rank, loss=math.nan,
                                  grad_norm=math.inf, step_time=0.2, layers=table),
                       arrival=1.0, buckets=STEP_DURATION_BUCKETS)
    return run


def _exp(runs: list[RunState], **kw) -> tuple[Exposition, list[tuple[str, int]]]:
    drops: list[tuple[str, int]] = []
    exp = Exposition(lambda: runs, CollectorRegistry(), on_drop=lambda r, c: drops.append((r, c)),
                     **kw)
    return exp, drops


def test_fmt_and_escape():
    assert (fmt(math.nan), fmt(math.inf), fmt(-math.inf), fmt(1.5)) == ("NaN", "+Inf", "-Inf", "1.5")
    assert escape('a"b\\c\nd') == 'a\\"b\\\\c\\nd'


def test_every_float_is_written_as_text_that_reads_back_as_the_same_float():
    """What Prometheus parses (Go's ParseFloat, like Python's float()) is the very value,
    one by one and in a block, across magnitudes, signs, subnormals and integers."""
    rnd = np.random.default_rng(2)
    values = np.concatenate([
        rnd.lognormal(sigma=20.0, size=2000) * rnd.choice([-1.0, 1.0], size=2000),
        [0.0, -0.0, 1.0, 1e-05, 1e16, 1e22, 5e-324, 2.2250738585072014e-308,
         1.7976931348623157e308, 123456789012345680.0, 0.1 + 0.2]])
    block = fmts(values)
    assert len(block) == len(values)
    for v, text in zip(values.tolist(), block, strict=True):
        assert float(text) == v and float(fmt(v)) == v and math.copysign(1, float(text)) == \
            math.copysign(1, v), (v, text)


def test_renders_non_finite_values_and_histogram():
    exp, _ = _exp([_run("r")])
    text = exp.render().decode()
    assert 'training_loss{project="p",run_id="r",rank="0"} NaN' in text
    assert 'training_grad_norm{project="p",run_id="r",rank="0"} +Inf' in text
    assert 'training_step_duration_seconds_bucket{project="p",run_id="r",rank="0",le="0.25"} 1' in text
    assert 'training_step_duration_seconds_bucket{project="p",run_id="r",rank="0",le="0.1"} 0' in text
    assert 'training_layer_update_ratio{project="p",run_id="r",rank="0",layer="l2"} 0.001' in text


def test_each_family_appears_once_and_contiguously():
    exp, _ = _exp([_run("a"), _run("b")])
    text = exp.render().decode()
    assert text.count("# TYPE training_loss gauge") == 1
    lines = [ln.split("{")[0] for ln in text.splitlines() if ln.startswith("training_loss{")]
    assert lines == ["training_loss", "training_loss"]


def test_caps_drop_and_count():
    runs = [_run(f"r{i}", layers=10, ranks=3) for i in range(5)]
    exp, drops = _exp(runs, max_runs=2, max_layers=4, max_ranks=2)
    text = exp.render().decode()
    assert 'run_id="r2"' not in text
    assert text.count("training_layer_grad_norm{") == 2 * 2 * 4
    assert ("max_runs", 3) in drops and ("max_layers", 6) in drops and ("max_ranks", 1) in drops


def test_expired_runs_leave_the_output_and_cache():
    runs = [_run("gone"), _run("stays")]
    exp, _ = _exp(runs)
    assert 'run_id="gone"' in exp.render().decode()
    del runs[0]
    text = exp.render().decode()
    assert 'run_id="gone"' not in text and 'run_id="stays"' in text
    assert set(exp._cache) == {"stays"}


def test_cache_follows_run_changes():
    run = _run("r")
    exp, _ = _exp([run])
    exp.render()
    run.apply_step(StepRecord(run_id="r", step=2, time=2.0, loss=0.5), 2.0, STEP_DURATION_BUCKETS)
    assert 'training_loss{project="p",run_id="r",rank="0"} 0.5' in exp.render().decode()


def test_user_labels_go_on_run_info_only():
    exp, _ = _exp([_run("r", labels={"project": "p", "pod": 'we"ird'})])
    text = exp.render().decode()
    assert ('training_run_info{project="p",run_id="r",pod="we\\"ird",status="running",'
            'verdict="healthy"} 1') in text
    assert "pod=" not in [ln for ln in text.splitlines() if ln.startswith("training_loss{")][0]


def test_layer_table_keeps_nan_as_data_and_none_as_missing():
    t = LayerTable.from_mapping({"a": {"grad_norm": math.nan}, "b": {"grad_norm": None}})
    assert t.measured["grad_norm"].tolist() == [True, False]
    assert np.isnan(t.stats["grad_norm"]).all()


def test_category_losses_get_their_own_family_and_a_cap():
    from monitor_agent.records.types import EvalRecord

    run = _run("cats")
    metrics = {"accuracy": 0.5, **{f"loss/c{i}": 1.0 + i for i in range(5)}}
    run.apply_eval(EvalRecord(run_id="cats", step=2, time=2.0, val_loss=1.0, metrics=metrics),
                   arrival=2.0)
    exp, drops = _exp([run], max_eval_series=3)
    text = exp.render().decode()
    base = 'project="p",run_id="cats",rank="0"'
    assert f'training_category_loss{{{base},category="c0"}} 1' in text
    assert f'training_eval_metric{{{base},name="accuracy"}} 0.5' in text
    assert 'name="loss/' not in text and 'category="c3"' not in text
    assert sum(c for r, c in drops if r == "max_categories") == 2


def test_series_caps_keep_what_fits_and_report_the_rest_once():
    from monitor_agent.reads.exposition import SeriesCaps

    drops: list[tuple[str, int]] = []
    caps = SeriesCaps(max_layers=2, on_drop=lambda r, c: drops.append((r, c)))
    assert caps.keep("max_layers", 5, caps.max_layers) == 2
    assert caps.keep("max_layers", 2, caps.max_layers) == 2
    assert caps.keep("max_runs", 0, caps.max_runs) == 0
    assert drops == [("max_layers", 3)]
    assert SeriesCaps().keep("max_ranks", 300, 256) == 256  # no callback: cut silently


def test_hung_ranks_count_the_latest_hang_finding_until_each_rank_steps_again():
    from monitor_agent.reads.exposition import RunRenderer, SeriesCaps
    from monitor_agent.records.types import Finding, Severity

    run = RunState.new("hung", now=0.0)
    for rank in (0, 1, 2):
        run.apply_step(StepRecord(run_id="hung", step=5, time=5.0, rank=rank), 5.0,
                       STEP_DURATION_BUCKETS)
    def hung() -> float:
        line = RunRenderer(run, SeriesCaps()).render()["training_hung_ranks"]
        assert line.startswith('training_hung_ranks{project="",run_id="hung"} ')
        return float(line.split()[-1])

    assert hung() == 0
    run.count_findings([Finding("hang", Severity.CRITICAL, "hung", 5, "rank 2 stuck",
                                evidence={"hung_ranks": [0, 1], "gone_ranks": [2]})])
    assert hung() == 3
    run.apply_step(StepRecord(run_id="hung", step=6, time=6.0, rank=0), 6.0,
                   STEP_DURATION_BUCKETS)
    assert hung() == 2


def test_layer_gauges_say_nan_and_infinity_leave_out_what_was_not_measured_and_escape_names():
    """The per-layer lines, made for the whole table at once: a non-finite statistic is a
    sample (NaN, +Inf), an unmeasured one is none, a zero parameter norm has no update
    ratio, and a name is escaped as a label value (kept escaped across scrapes)."""
    run = RunState.new("r", now=0.0)
    table = LayerTable.from_mapping({
        'h.0"q"': {"grad_norm": float("nan"), "param_norm": 2.0, "update_norm": 1.0,
                   "grad_zero_frac": 0.5},
        "h.1\nx": {"grad_norm": float("inf"), "param_norm": 0.0, "update_norm": 1.0},
        "h.2": {"param_norm": float("inf"), "update_norm": float("inf")}})
    run.apply_step(StepRecord(run_id="r", step=1, time=1.0, layers=table), arrival=1.0,
                   buckets=STEP_DURATION_BUCKETS)
    exp = Exposition(lambda: [run], CollectorRegistry())
    for _ in range(2):  # the second scrape renders the changed run with its names kept
        run.version += 1
        text = exp.render().decode()
        lines = [ln for ln in text.splitlines() if ln.startswith("training_layer_")]
        head = 'project="",run_id="r",rank="0",layer='
        assert f'training_layer_grad_norm{{{head}"h.0\\"q\\""}} NaN' in lines
        assert f'training_layer_grad_norm{{{head}"h.1\\nx"}} +Inf' in lines
        assert not [ln for ln in lines if ln.startswith(f'training_layer_grad_norm{{{head}"h.2"')]
        assert f'training_layer_update_ratio{{{head}"h.0\\"q\\""}} 0.5' in lines
        assert f'training_layer_update_ratio{{{head}"h.2"}} NaN' in lines  # inf / inf
        assert not [ln for ln in lines if "update_ratio" in ln and "h.1" in ln]  # 0 norm
        assert f'training_layer_grad_zero_ratio{{{head}"h.0\\"q\\""}} 0.5' in lines
        assert [ln for ln in lines if ln.startswith("training_layer_effective")] == []


def _layer_lines_one_by_one(run: RunState) -> dict[str, list[str]]:
    """The per-layer families the plain way, a line at a time with ``fmt`` and ``escape``:
    what the renderer's cached prefixes and joined values must reproduce byte for byte."""
    out: dict[str, list[str]] = {}
    for rank, state in sorted(run.ranks.items()):
        table, clip = state.last_layers, state.last_layers_clip
        assert table is not None
        labels = f'project="p",run_id="{run.run_id}",rank="{rank}"'
        st, me = table.stats, table.measured
        grad, upd, par = st["grad_norm"], st["update_norm"], st["param_norm"]
        with np.errstate(all="ignore"):
            families = (
                ("training_layer_grad_norm", me["grad_norm"], grad),
                ("training_layer_update_ratio",
                 me["update_norm"] & me["param_norm"] & (par != 0), upd / par),
                ("training_layer_grad_zero_ratio", me["grad_zero_frac"], st["grad_zero_frac"]),
                ("training_layer_effective_learning_rate",
                 me["update_norm"] & me["grad_norm"] & np.isfinite(grad) & (grad > 0),
                 upd / (grad * clip)))
        for fam, ok, values in families:
            out.setdefault(fam, []).extend(
                f'{fam}{{{labels},layer="{escape(name)}"}} {fmt(float(values[i]))}'
                for i, name in enumerate(table.names) if ok[i])
    return out


def test_per_layer_lines_are_byte_identical_to_rendering_them_one_by_one():
    """The per-layer lines are made from prefixes kept across scrapes and values formatted
    as one list: checked against the plain line-by-line rendering, scrape after scrape as
    the values change, with non-finite and unmeasured statistics, and after the run renames
    its layers (a prefix kept for the old names must not be served)."""
    rnd = np.random.default_rng(0)

    def table(names: list[str]) -> LayerTable:
        rows = {}
        for i, name in enumerate(names):
            row = {"grad_norm": float(rnd.lognormal()), "param_norm": float(rnd.lognormal()),
                   "update_norm": float(rnd.lognormal()) * 1e-3,
                   "grad_zero_frac": float(rnd.random())}
            if i % 7 == 3:
                row["grad_norm"] = math.nan if i % 2 else math.inf
            if i % 11 == 5:
                del row["update_norm"]
            if i % 13 == 6:
                row["param_norm"] = 0.0
            rows[name] = row
        return LayerTable.from_mapping(rows)

    run = RunState.new("r", now=0.0)
    run.apply_run(RunRecord(run_id="r", labels={"project": "p"}))
    exp = Exposition(lambda: [run], CollectorRegistry())
    names = [f'blocks.{i}.w"{i % 3}"' for i in range(60)]
    renamed = [n + ".renamed%d" for n in names]
    for step, layer_names in enumerate([names, names, renamed], 1):
        for rank in (0, 1):
            run.apply_step(StepRecord(run_id="r", step=step, time=float(step), rank=rank,
                                      grad_norm=4.0, clip_threshold=1.0,  # clipped: x0.25
                                      layers=table(layer_names)),
                           arrival=float(step), buckets=STEP_DURATION_BUCKETS)
        text = exp.render().decode()
        for fam, want in _layer_lines_one_by_one(run).items():
            got = [ln for ln in text.splitlines() if ln.startswith(fam + "{")]
            assert got == want, (step, fam)


def test_quantile_lines_are_byte_identical_to_rendering_them_one_by_one():
    """The per-layer quantile families, their values spelled in one call per block: checked
    line for line against the plain rendering, finite and non-finite quantiles alike."""
    rnd = np.random.default_rng(1)
    run = RunState.new("r", now=0.0)
    run.apply_run(RunRecord(run_id="r", labels={"project": "p"}))
    exp = Exposition(lambda: [run], CollectorRegistry())
    for step, suffix in ((1, ""), (2, "%s")):
        hists = {}
        for i in range(40):
            q = sorted(rnd.normal(size=len(QUANTILE_LEVELS)).tolist())
            if i % 9 == 4:
                q[-1] = math.inf if i % 2 else math.nan
            hists[f'blocks.{i}.w"{suffix}'] = {"edges": [0.0, 1.0], "counts": [1.0],
                                               "quantiles": q}
        table = QuantileTable.from_hists(hists)
        assert table is not None
        run.apply_step(StepRecord(run_id="r", step=step, time=float(step), grad_quantiles=table),
                       arrival=float(step), buckets=STEP_DURATION_BUCKETS)
        want = [f'training_layer_grad_quantile{{project="p",run_id="r",rank="0",'
                f'layer="{escape(name)}",q="{q:g}"}} {fmt(v)}'
                for name, row in zip(table.names, table.values.tolist(), strict=True)
                for q, v in zip(QUANTILE_LEVELS, row, strict=True)]
        text = exp.render().decode()
        got = [ln for ln in text.splitlines() if ln.startswith("training_layer_grad_quantile{")]
        assert want and got == want, step
