"""The "Layers" dashboard: per-parameter gradients and updates of one rank over time.

Heatmap rows are the layers (in label order: Prometheus does not know their depth), cells are
log10 of the value, so 13 orders of magnitude fit one colour scale.

Example::

    board = build()   # the dict that dashboards/layers.json holds
"""

from __future__ import annotations

from dashboards.board import dashboard, query_variable
from dashboards.panels import Grid, Json, heatmap, table, target, timeseries

UID = "monitor-agent-layers"
RUN = 'project=~"$project", run_id="$run", rank="$rank"'
SEL = RUN + ', layer=~"$layer"'
# log10(0) is -Inf; a frozen layer's exact zero update shows as the floor instead.
FLOOR = "1e-15"
LAYER_COLUMNS = {"layer": "Layer", "Value": "Value"}
HIDE = ("Time", "__name__", "job", "instance", "project", "run_id", "rank")


def variables() -> list[Json]:
    run = 'project=~"$project", run_id="$run"'
    return [
        query_variable("project", "label_values(training_run_info, project)", all_=True),
        query_variable("run", 'label_values(training_run_info{project=~"$project"}, run_id)'),
        query_variable("rank", f"label_values(training_layer_grad_norm{{{run}}}, rank)"),
        query_variable("layer", f"label_values(training_layer_grad_norm{{{RUN}}}, layer)",
                       multi=True, all_=True),
    ]


def heatmaps(g: Grid) -> list[Json]:
    return [
        g.row("Over depth and time"),
        heatmap("Gradient norm by layer (log10)", [target(
            f"log10(clamp_min(training_layer_grad_norm{{{SEL}}}, {FLOOR}))", "{{layer}}")],
            unit="none", pos=g.place(24, 12), scheme="Spectral",
            description="log10 of each parameter's gradient L2 norm. Early layers far below "
                        "late ones: vanishing gradients; a bright row: an exploding layer."),
        heatmap("Update ratio by layer (log10)", [target(
            f"log10(clamp_min(training_layer_update_ratio{{{SEL}}}, {FLOOR}))", "{{layer}}")],
            unit="none", pos=g.place(24, 12), scheme="RdYlGn",
            description="log10 of ||update|| / ||param||: about -3 is healthy; -15 is an "
                        "exactly zero update (a frozen or dead layer)."),
        heatmap("Effective learning rate by layer (log10)", [target(
            f"log10(clamp_min(training_layer_effective_learning_rate{{{SEL}}}, {FLOOR}))",
            "{{layer}}")],
            unit="none", pos=g.place(24, 12), scheme="RdYlBu",
            description="log10 of ||update|| / ||clipped gradient|| per parameter: the step "
                        "the optimizer took per unit of gradient. One layer far from the "
                        "rest is one the optimizer amplifies or damps on its own."),
    ]


def _q(metric: str, q: str) -> str:
    return f'{metric}{{{SEL}, q="{q}"}}'


def _spread(metric: str, hi: str, lo: str) -> str:
    return f"({_q(metric, hi)} - ignoring(q) {_q(metric, lo)})"


def distributions(g: Grid) -> list[Json]:
    grad, param = "training_layer_grad_quantile", "training_layer_param_quantile"
    iqr = f"clamp_min({_spread(grad, '0.75', '0.25')}, 1e-30)"
    return [
        g.row("Gradient and weight distributions (every hist_every steps)"),
        heatmap("Gradient tail ratio by layer: log10((p99 - p1) / IQR)", [target(
            f"log10(clamp_min({_spread(grad, '0.99', '0.01')} / ignoring(q) {iqr}, "
            f"{FLOOR}))", "{{layer}}")], unit="none", pos=g.place(12, 10), scheme="Spectral",
            description="About 0.54 for a Gaussian gradient; a row turning bright is a layer "
                        "whose gradient grew heavy tails (outlier tokens or features); the "
                        "grad_distribution detector judges each layer against its own past."),
        heatmap("Gradient median by layer, in IQRs: p50 / (p75 - p25)", [target(
            f"{_q(grad, '0.5')} / ignoring(q) {iqr}", "{{layer}}")], unit="none",
            pos=g.place(12, 10), scheme="RdBu",
            description="Where the middle of each layer's gradient sits, in units of its own "
                        "spread: near 0 is healthy; a layer drifting to +/-1 and beyond is "
                        "pushed consistently one way (a shifted distribution)."),
        heatmap("Weight spread by layer: log10(p99 - p1)", [target(
            f"log10(clamp_min({_spread(param, '0.99', '0.01')}, {FLOOR}))", "{{layer}}")],
            unit="none", pos=g.place(24, 10), scheme="Spectral",
            description="log10 of the range holding 98% of each parameter's weights. Slow "
                        "growth is normal; a jump is a layer blowing up, a collapse to the "
                        "floor a layer whose weights became (nearly) constant."),
    ]


def gains(g: Grid) -> list[Json]:
    median = ("quantile by (project, run_id, rank) (0.5, training_layer_grad_norm"
              f"{{{RUN}}})")
    return [
        g.row("Gain between layers"),
        timeseries("Gradient norm relative to the median layer", [target(
            f"training_layer_grad_norm{{{SEL}}} / on (project, run_id, rank) group_left {median}",
            "{{layer}}")], unit="none", log=10, pos=g.place(12, 10),
            description="Each layer's gradient norm divided by the median layer's. Ratios "
                        "drifting apart over time is gain drift; 1e-3 and below for early "
                        "layers is vanishing."),
        timeseries("Fraction of exactly-zero gradient entries", [target(
            f"training_layer_grad_zero_ratio{{{SEL}}}", "{{layer}}")],
            unit="percentunit", min_=0, max_=1, pos=g.place(12, 10),
            description="Dead ReLUs and unused embedding rows show here; 100% is a layer "
                        "that gets no gradient at all."),
    ]


def activation_panels(g: Grid) -> list[Json]:
    # Module outputs (Monitor.watch(activations=True)), one sample per monitored step.
    return [
        g.row("Activations"),
        heatmap("Dead ReLU units by module", [target(
            f"training_activation_dead_ratio{{{RUN}}}", "{{module}}")],
            unit="percentunit", pos=g.place(12, 10), scheme="Reds",
            description="Fraction of each ReLU module's units that output zero for the whole "
                        "batch. A row turning dark and staying there is dying units "
                        "(dead_units finding)."),
        timeseries("Activation max-abs by module", [target(
            f"training_activation_max_abs{{{RUN}}}", "{{module}}")],
            unit="none", log=10, pos=g.place(12, 10),
            description="Largest absolute output of each module. Steady geometric growth "
                        "precedes attention-logit and loss divergence (activation_blowup)."),
        timeseries("Activation std by module", [target(
            f"training_activation_std{{{RUN}}}", "{{module}}")],
            unit="none", log=10, pos=g.place(12, 8),
            description="Spread of each module's output; should stay within an order of "
                        "magnitude of its early level."),
        timeseries("Non-finite activations", [target(
            f"training_activation_nonfinite{{{RUN}}}", "{{module}}")],
            unit="short", min_=0, pos=g.place(12, 8),
            description="NaN/Inf entries in each module's output: any is an error."),
    ]


def flagged(g: Grid) -> list[Json]:
    return [
        g.row("Layers to look at"),
        table("Layers flagged by alerts", [target(
            'training_alert_active{project=~"$project", run_id="$run", layer!=""}')],
            columns={"severity": "Severity", "alertname": "Alert", "layer": "Layer",
                     "summary": "Summary", "suggestion": "Suggestion"},
            hide=(*HIDE, "Value"), pos=g.place(24, 7)),
        table("Smallest update ratios", [target(
            f"bottomk(10, training_layer_update_ratio{{{SEL}}})")],
            columns=LAYER_COLUMNS, hide=HIDE, unit="sci", pos=g.place(8, 9),
            description="0 means the layer did not move: frozen, lr 0, or detached."),
        table("Largest gradient norms", [target(
            f"topk(10, training_layer_grad_norm{{{SEL}}})")],
            columns=LAYER_COLUMNS, hide=HIDE, unit="sci", pos=g.place(8, 9)),
        table("Smallest gradient norms", [target(
            f"bottomk(10, training_layer_grad_norm{{{SEL}}})")],
            columns=LAYER_COLUMNS, hide=HIDE, unit="sci", pos=g.place(8, 9)),
    ]


def build() -> Json:
    g = Grid()
    panels = [*heatmaps(g), *distributions(g), *gains(g), *activation_panels(g), *flagged(g)]
    return dashboard(UID, "Layers", panels, variables(), annotations=[],
                     description="Per-parameter gradient and update statistics of one rank.")
